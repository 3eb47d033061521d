#!/usr/bin/env python3
"""Independent check of kivi-run against a NumPy reference of the same GGUF model.

  python3 scripts/check_model_ref.py KIVI_RUN MODEL.gguf TEXT [N_TOKENS]

1. Tokenizer: the HF `tokenizers` package (if importable) built from the file's vocabulary and
   merges with SmolLM2's pre-tokenizer (digits split, GPT-2 byte level) must give exactly the ids
   of `kivi-run tokenize` on a set of strings and on TEXT.
2. Forward pass: a float64 NumPy implementation written from the Llama and Qwen2 definitions
   (its own GGUF parser and Q4_1/Q5_0/Q8_0/Q4_K/Q6_K dequantization, written from ggml's block
   layouts; RoPE on adjacent pairs for llama files, on the halves of each head (NEOX) for qwen2
   files, whose q/k/v biases it adds; GQA, SwiGLU) computes the perplexity of the first N_TOKENS
   tokens of TEXT; `kivi-run ppl --kv fp16` on the same window must agree within PPL_REL_TOL (its
   cache keeps keys and values in fp16, its sums are fp32).
Exit status 0 when both hold.
"""
import json, os, struct, subprocess, sys, tempfile

import numpy as np

PPL_REL_TOL = 5e-3


def read_gguf(path):
    buf = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, buf, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def rstr():
        nonlocal off
        n = take("Q")
        s = buf[off:off + n]
        off += n
        return s

    scal = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def rval(t):
        if t == 8:
            return rstr()
        if t == 9:
            at, n = take("I"), take("Q")
            return [rval(at) for _ in range(n)]
        return take(scal[t])

    assert take("I") == 0x46554747, "not GGUF"
    take("I")
    nt, nkv = take("Q"), take("Q")
    meta = {}
    for _ in range(nkv):
        k = rstr().decode()
        meta[k] = rval(take("I"))
    tensors = {}
    for _ in range(nt):
        name = rstr().decode()
        nd = take("I")
        dims = [take("Q") for _ in range(nd)]
        typ, toff = take("I"), take("Q")
        tensors[name] = (dims, typ, toff)
    align = meta.get("general.alignment", 32)
    base = (off + align - 1) // align * align
    return buf, meta, tensors, base


def dequant(buf, base, dims, typ, toff):
    n = int(np.prod(dims))
    start = base + toff
    if typ == 0:
        x = np.frombuffer(buf, np.float32, n, start).astype(np.float64)
    elif typ == 3:  # Q4_1: fp16 d, fp16 m, 16 bytes of nibbles
        b = np.frombuffer(buf, np.uint8, n // 32 * 20, start).reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float64)
        qs = b[:, 4:20]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float64)
        x = (q * d + m).reshape(-1)
    elif typ == 6:  # Q5_0: fp16 d, u32 of fifth bits, 16 bytes of nibbles; (q - 16) d
        b = np.frombuffer(buf, np.uint8, n // 32 * 22, start).reshape(-1, 22)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        qh = b[:, 2:6].copy().view("<u4")
        qs = b[:, 6:22]
        bit = (qh >> np.arange(32, dtype=np.uint32)[None, :]) & 1
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64) | (bit.astype(np.int64) << 4)
        x = ((q - 16) * d).reshape(-1)
    elif typ == 12:  # Q4_K: 256 = 8 sub-blocks of 32; fp16 d, dmin; 12 bytes of 6-bit scales/mins
        b = np.frombuffer(buf, np.uint8, n // 256 * 144, start).reshape(-1, 144)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        dmin = b[:, 2:4].copy().view(np.float16).astype(np.float64)
        s = b[:, 4:16].astype(np.int64)
        sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
        mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
        qs = b[:, 16:144].reshape(-1, 4, 32)  # chunk c: sub-block 2c low nibbles, 2c + 1 high
        q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)
        x = (d[:, :, None] * sc[:, :, None] * q - dmin[:, :, None] * mn[:, :, None]).reshape(-1)
    elif typ == 14:  # Q6_K: ql[128] low nibbles, qh[64] high 2 bits, 16 int8 scales, fp16 d
        b = np.frombuffer(buf, np.uint8, n // 256 * 210, start).reshape(-1, 210)
        d = b[:, 208:210].copy().view(np.float16).astype(np.float64)
        sc = b[:, 192:208].copy().view(np.int8).astype(np.float64).reshape(-1, 2, 4, 2)
        halves = []
        for h in range(2):
            ql, qh = b[:, 64 * h:64 * h + 64].astype(np.int64), b[:, 128 + 32 * h:160 + 32 * h].astype(np.int64)
            parts = [(ql[:, :32] & 15) | (((qh >> 0) & 3) << 4), (ql[:, 32:] & 15) | (((qh >> 2) & 3) << 4),
                     (ql[:, :32] >> 4) | (((qh >> 4) & 3) << 4), (ql[:, 32:] >> 4) | (((qh >> 6) & 3) << 4)]
            halves.append(np.stack(parts, axis=1))  # [blocks][4][32]
        q = np.stack(halves, axis=1).astype(np.float64) - 32  # [blocks][2][4][32]
        x = (d[:, :, None, None] * np.repeat(sc, 16, axis=3) * q).reshape(-1)
    elif typ == 8:  # Q8_0: fp16 d, 32 int8
        b = np.frombuffer(buf, np.uint8, n // 32 * 34, start).reshape(-1, 34)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
        q = b[:, 2:34].copy().view(np.int8).astype(np.float64)
        x = (q * d).reshape(-1)
    else:
        raise SystemExit("reference: tensor type %d not handled" % typ)
    return x.reshape(list(reversed(dims)))  # [rows][row length]


def hf_tokenizer(meta):
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    except ImportError:
        return None
    toks = [t.decode("utf-8") for t in meta["tokenizer.ggml.tokens"]]
    vocab = {t: i for i, t in enumerate(toks)}
    merges = [tuple(m.decode("utf-8").split(" ")) for m in meta["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab, merges))
    if meta.get("tokenizer.ggml.pre") == b"qwen2":  # Qwen2's tokenizer.json: a Split, then the byte level
        from tokenizers import Regex
        pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pat), "isolated"),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tk.decoder = decoders.ByteLevel()
    return tk


def kivi_tokenize(kivi_run, model, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
    try:
        out = subprocess.run([kivi_run, "tokenize", "--model", model, "--prompt-file", f.name],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return [int(x) for x in out.split()]


def forward_nll(buf, meta, tensors, base, ids, attend=None, dtype=np.float64):
    """The negative log-likelihood of each next token and the logits.  attend(q, k, v, kpre,
    rope) -> o [T][H][hd], when given, replaces the exact causal attention (q and k after RoPE,
    kpre before it; rope(x [T][n][hd], n) rotates); dtype: the arithmetic (kv-sim.py: float32)."""
    arch = meta["general.architecture"].decode()
    L = meta[arch + ".block_count"]
    H, KVH = meta[arch + ".attention.head_count"], meta[arch + ".attention.head_count_kv"]
    dim = meta[arch + ".embedding_length"]
    hd = dim // H
    eps = meta[arch + ".attention.layer_norm_rms_epsilon"]
    theta = meta.get(arch + ".rope.freq_base", 10000.0)
    neox = arch == "qwen2"  # llama.cpp: LLM_ARCH_QWEN2 -> LLAMA_ROPE_TYPE_NEOX
    cache = {}

    def W(name):
        if name not in cache:
            cache[name] = dequant(buf, base, *tensors[name]).astype(dtype)
        return cache[name]

    emb = W("token_embd.weight")
    out_w = W("output.weight") if "output.weight" in tensors else emb
    T = len(ids)
    x = emb[ids]
    pos = np.arange(T)[:, None]
    freq = theta ** (-2.0 * np.arange(hd // 2) / hd)
    ang = pos * freq[None, :]
    cos, sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    def rope(v, nh):
        c, s = cos[:, None, :], sin[:, None, :]
        if neox:  # pairs (i, i + hd/2)
            v = v.reshape(T, nh, hd)
            a, b = v[..., :hd // 2], v[..., hd // 2:]
            return np.concatenate([a * c - b * s, a * s + b * c], -1)
        v = v.reshape(T, nh, hd // 2, 2)  # pairs (2i, 2i + 1)
        a, b = v[..., 0], v[..., 1]
        return np.stack([a * c - b * s, a * s + b * c], -1).reshape(T, nh, hd)

    def proj(h, p, what):  # h W^T (+ bias where the file has one)
        y = h @ W(p + what + ".weight").T
        return y + W(p + what + ".bias") if p + what + ".bias" in tensors else y

    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(L):
        p = "blk.%d." % l
        h = rms(x, W(p + "attn_norm.weight"))
        q = rope(proj(h, p, "attn_q"), H)
        kpre = proj(h, p, "attn_k")
        k = rope(kpre, KVH)
        v = proj(h, p, "attn_v").reshape(T, KVH, hd)
        if attend is not None:
            o = attend(q, k, v, kpre.reshape(T, KVH, hd), rope)
        else:
            o = np.empty((T, H, hd), dtype)
            for hh in range(H):
                kv = hh // (H // KVH)
                s = q[:, hh, :] @ k[:, kv, :].T / np.sqrt(hd) + mask
                s = np.exp(s - s.max(-1, keepdims=True))
                o[:, hh, :] = (s / s.sum(-1, keepdims=True)) @ v[:, kv, :]
        x = x + o.reshape(T, dim) @ W(p + "attn_output.weight").T
        h = rms(x, W(p + "ffn_norm.weight"))
        g = h @ W(p + "ffn_gate.weight").T
        u = h @ W(p + "ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ W(p + "ffn_down.weight").T
    logits = rms(x, W("output_norm.weight")) @ out_w.T
    mx = logits.max(-1, keepdims=True)
    lse = np.log(np.exp((logits - mx).astype(np.float64)).sum(-1)) + mx[:, 0]
    nll = lse[:-1] - logits[np.arange(T - 1), ids[1:]]
    return nll, logits


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    kivi_run, model, text_file = sys.argv[1:4]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 256
    buf, meta, tensors, base = read_gguf(model)
    text = open(text_file, encoding="utf-8").read()
    ok = True

    tk = hf_tokenizer(meta)
    samples = ["Hello world! It's 2024, isn't it?  Yes.\nNew line\ttab", "  leading spaces and trailing   ",
               "I'll we've they're o'clock 3.14159 x=y+1; café naïve — “quotes” …", "\n\n\ndouble\n\n", text]
    if tk is None:
        print("tokenizer: the `tokenizers` package is not installed; comparison skipped")
    else:
        for s in samples:
            ref = tk.encode(s).ids
            ours = kivi_tokenize(kivi_run, model, s)
            same = ref == ours
            ok &= same
            print("tokenizer: %-40r %5d tokens, %s" % (s[:40], len(ref), "identical" if same else "DIFFERENT"))
            if not same:
                i = next((i for i, (a, b) in enumerate(zip(ref, ours)) if a != b), min(len(ref), len(ours)))
                print("  first difference at %d: reference %s, kivi-run %s" % (i, ref[i:i + 5], ours[i:i + 5]))

    ids = kivi_tokenize(kivi_run, model, text)[:n]
    nll, _ = forward_nll(buf, meta, tensors, base, np.array(ids))
    ref_ppl = float(np.exp(nll.mean()))
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        jpath = f.name
    subprocess.run([kivi_run, "ppl", text_file, "--model", model, "--kv", "fp16", "--ctx", str(n), "--max-tokens",
                    str(n), "--device", "host", "--quiet", "--json", jpath], check=True, capture_output=True)
    ours = json.load(open(jpath))["ppl"]
    os.unlink(jpath)
    rel = abs(ours - ref_ppl) / ref_ppl
    print("forward: ppl of the first %d tokens: NumPy float64 %.5f, kivi-run fp16 cache %.5f, rel diff %.2e "
          "(tolerance %.0e)" % (n, ref_ppl, ours, rel, PPL_REL_TOL))
    ok &= rel <= PPL_REL_TOL
    print("reference check: %s" % ("PASS" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
