#!/usr/bin/env python3
"""Perplexity of a Llama GGUF model with a simulated KIVI cache: options the library does not
have yet (keys quantized before RoPE, attention-sink tokens), with the cache's own window rules.

  python3 scripts/kv-sim.py KIVI_RUN MODEL.gguf TEXT [--ctx 1024] [--tokens 4096] [--chunk 32]
          [--k-bits 2] [--v-bits 2] [--group 32] [--residual 128] [--pre-rope] [--sink S]
          [--rotate none|k|v|kv] [--fp16] [--clip N [--clip-v-only|--clip-k-only] [--clip-l1]]
          [--v-mean none|sink|all]

The model is scripts/check_model_ref.py's NumPy forward pass (float32 here), scored as
`kivi-run ppl --score second-half` scores (non-overlapping windows of --ctx tokens from position
0, the predictions of tokens ctx/2+1 .. ctx-1 of each).  Each window runs in chunks of --chunk
tokens as kivi-run does (kivi_attention_extend, then the append): a query of the chunk that starts
at position c sees the cache as it stands at length c, plus its own chunk's tokens unquantized:
  - keys of positions below (c / R) R are quantized (whole blocks of R tokens, per channel in
    groups of G tokens), the rest are fp16;
  - values of positions below c - R are quantized (per token, groups of G channels), the rest
    fp16 (the window: the newest R values);
  - asymmetric min/max quantization, scale and minimum stored in fp16;
  - --pre-rope: keys quantized as the projection gives them, RoPE applied to the dequantized
    keys; --sink S: positions below S are never quantized; --rotate: keys (after RoPE) and/or
    values through the orthonormal Walsh-Hadamard transform before quantization (the cache's
    kivi_cache_config.rotate), rotated back after; --fp16: no quantization at all; --clip N: each
    group's range the best of N + 1 narrowed about its centre (ratios 1, 1 - 1/2N .. 1/2; the
    smallest squared error, or absolute error with --clip-l1), for values only or keys only
    with --clip-v-only / --clip-k-only (kivi_cache_config.v_clip is the values' rule with N = 8);
    --v-mean: each channel's mean over the sinks (or all tokens) taken from the values before
    their quantization and added back after.
Checked against the real cache with the same settings (docs/BENCHMARKS.md).  Prints one JSON line.
"""
import argparse, json, os, sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_model_ref import forward_nll, kivi_tokenize, read_gguf  # noqa: E402


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def f16(x):
    return x.astype(np.float16).astype(np.float32)


CLIP = [1.0]
L1 = [False]


def quant(x, bits, axis_len, along_tokens):
    """x [T, C]: groups of axis_len consecutive tokens per channel (along_tokens) or of axis_len
    consecutive channels per token; min/max asymmetric, scale and minimum in fp16.  With --clip,
    each group's range is narrowed about its centre by the first of the CLIP ratios whose
    reconstruction has the smallest squared error."""
    T, C = x.shape
    if along_tokens:
        Tp = (T + axis_len - 1) // axis_len * axis_len
        xp = np.concatenate([x, np.repeat(x[-1:], Tp - T, 0)]) if Tp > T else x
        g = xp.reshape(Tp // axis_len, axis_len, C)
        lo, hi = g.min(1, keepdims=True), g.max(1, keepdims=True)
    else:
        g = x.reshape(T, C // axis_len, axis_len)
        lo, hi = g.min(2, keepdims=True), g.max(2, keepdims=True)
    qmax = float((1 << bits) - 1)
    best, berr = None, None
    for r in CLIP:
        c, h = (hi + lo) / 2, (hi - lo) / 2
        l2, h2 = (lo, hi) if r == 1.0 else (c - r * h, c + r * h)
        scale = (h2 - l2) / qmax
        safe = np.where(scale > 0, scale, 1.0)
        code = np.where(scale > 0, np.clip(np.floor((g - l2) / safe + 0.5), 0, qmax), 0.0)
        d = code * f16(scale) + f16(l2)
        err = (np.abs(d - g) if L1[0] else (d - g) ** 2).sum(1 if along_tokens else 2, keepdims=True)
        if best is None:
            best, berr = d, err
        else:
            take = err < berr
            best, berr = np.where(take, d, best), np.where(take, err, berr)
    d = best
    return d.reshape(-1, C)[:T] if along_tokens else d.reshape(T, C)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kivi_run")
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--k-bits", type=int, default=2)
    ap.add_argument("--v-bits", type=int, default=2)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--residual", type=int, default=128)
    ap.add_argument("--pre-rope", action="store_true")
    ap.add_argument("--sink", type=int, default=0)
    ap.add_argument("--rotate", default="none", choices=["none", "k", "v", "kv"])
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--clip", type=int, default=0, help="ratios 1, 1 - 1/N ... 1/2 searched per group")
    ap.add_argument("--clip-v-only", action="store_true")
    ap.add_argument("--clip-k-only", action="store_true")
    ap.add_argument("--clip-l1", action="store_true")
    ap.add_argument("--v-mean", default="none", choices=["none", "sink", "all"])
    a = ap.parse_args()
    L1[0] = a.clip_l1
    if a.clip:
        CLIP[:] = [1.0 - i / (2.0 * a.clip) for i in range(a.clip + 1)]
    if a.pre_rope and "k" in a.rotate:
        raise SystemExit("kv-sim: --pre-rope and a rotation of the keys exclude each other")
    buf, meta, tensors, base = read_gguf(a.model)
    ids = np.array(kivi_tokenize(a.kivi_run, a.model, open(a.text, encoding="utf-8").read())[:a.tokens])
    T, R, G, CH, S = a.ctx, a.residual, a.group, a.chunk, a.sink
    # which keys and values a query sees quantized: the cache at its chunk's start c
    t = np.arange(T)
    c = t // CH * CH
    j = np.arange(T)
    kq = (j[None, :] < (c // R * R)[:, None]) & (j[None, :] >= S)
    vq = (j[None, :] < (c - R)[:, None]) & (j[None, :] >= S)
    causal = j[None, :] <= t[:, None]

    def attend(q, k, v, kpre, rope):
        H, KVH, hd = q.shape[1], k.shape[1], k.shape[2]
        Hd = hadamard(hd)
        ke, ve = f16(k), f16(v)  # the window's fp16
        if a.fp16:
            kd, vd = ke, ve
        else:
            if a.pre_rope:
                kd = rope(quant(kpre.reshape(T, -1), a.k_bits, G, True), KVH)
            elif "k" in a.rotate:
                saved = CLIP[:]
                if a.clip_v_only: CLIP[:] = [1.0]
                kd = quant((k @ Hd).reshape(T, -1), a.k_bits, G, True).reshape(T, KVH, hd) @ Hd.T
                CLIP[:] = saved
            else:
                kd = quant(k.reshape(T, -1), a.k_bits, G, True).reshape(T, KVH, hd)
            vr = v @ Hd if "v" in a.rotate else v
            mu = vr[:max(S, 1)].mean(0, keepdims=True) if a.v_mean == "sink" else (vr.mean(0, keepdims=True) if a.v_mean == "all" else 0.0)
            saved = CLIP[:]
            if a.clip_k_only: CLIP[:] = [1.0]
            vd = quant((vr - mu).reshape(T * KVH, hd), a.v_bits, G, False).reshape(T, KVH, hd) + mu
            CLIP[:] = saved
            if "v" in a.rotate:
                vd = vd @ Hd.T
        o = np.empty((T, H, hd), np.float32)
        for hh in range(H):
            kv = hh // (H // KVH)
            qs = q[:, hh, :] / np.sqrt(hd)
            s = np.where(kq, qs @ kd[:, kv, :].T, qs @ ke[:, kv, :].T)
            s = np.where(causal, s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            pr = e / e.sum(-1, keepdims=True)
            o[:, hh, :] = np.where(vq, pr, 0) @ vd[:, kv, :] + np.where(vq, 0, pr) @ ve[:, kv, :]
        return o

    nll, scored = 0.0, 0
    for w0 in range(0, len(ids) - T + 1, T):
        n, _ = forward_nll(buf, meta, tensors, base, ids[w0:w0 + T], attend, np.float32)
        nll += float(n[T // 2:].sum())  # the predictions of tokens ctx/2+1 .. ctx-1
        scored += len(n) - T // 2
    print(json.dumps({"ppl": float(np.exp(nll / scored)), "scored": scored, "ctx": T, "chunk": CH,
                      "k_bits": a.k_bits, "v_bits": a.v_bits, "group": G, "residual": R, "pre_rope": a.pre_rope,
                      "sink": S, "rotate": a.rotate, "fp16": a.fp16, "clip": a.clip,
                      "clip_v_only": a.clip_v_only, "clip_k_only": a.clip_k_only, "clip_l1": a.clip_l1,
                      "v_mean": a.v_mean}))


if __name__ == "__main__":
    main()
