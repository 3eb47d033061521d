#!/usr/bin/env python3
"""Writes a tiny synthetic qwen2 GGUF model for the tests (tests/model/test_model_qwen2.sh).

  python3 tests/model/tiny_qwen2.py OUT.gguf

2 layers, 256 wide, 2 query heads of 128 over 1 kv-head, FFN 512, RoPE base 1e6, q/k/v biases
(the keys' large, as Qwen2.5's are), a byte-level vocabulary (256 bytes, a few merges, the ChatML
control tokens) with tokenizer.ggml.pre = "qwen2".  The weight tensors are random blocks of the
types a Qwen2.5 Q4_K_M file mixes (Q4_K, Q6_K, Q5_0, Q8_0, F32): every byte of every block is
random, only the block scales are chosen so that each product keeps about unit variance.
Deterministic (a fixed seed)."""
import struct
import sys

import numpy as np

DIM, HEADS, KV_HEADS, HD, FFN, LAYERS = 256, 2, 1, 128, 512, 2
rng = np.random.default_rng(20261206)


def f16(x):
    return np.float16(x).tobytes()


def q4_k(rows, cols, amp):  # x = d sc q - dmin mn, sc, mn 6-bit, q 4-bit: centred by dmin = 7.5 d
    out = bytearray()
    d = amp / (31.5 * 7.5)
    for _ in range(rows * cols // 256):
        out += f16(d) + f16(7.5 * d) + rng.integers(0, 256, 140, dtype=np.uint8).tobytes()
    return bytes(out)


def q6_k(rows, cols, amp):  # x = d sc (q - 32), sc int8, q 6-bit
    out = bytearray()
    for _ in range(rows * cols // 256):
        out += rng.integers(0, 256, 192, dtype=np.uint8).tobytes()
        out += rng.integers(-64, 64, 16, dtype=np.int8).tobytes() + f16(amp / 512)
    return bytes(out)


def q5_0(rows, cols, amp):  # x = d (q - 16), q 5-bit
    out = bytearray()
    for _ in range(rows * cols // 32):
        out += f16(amp / 16) + rng.integers(0, 256, 20, dtype=np.uint8).tobytes()
    return bytes(out)


def q8_0(rows, cols, amp):  # x = d q, q int8
    out = bytearray()
    for _ in range(rows * cols // 32):
        out += f16(amp / 64) + rng.integers(-128, 128, 32, dtype=np.int8).tobytes()
    return bytes(out)


def f32(values):
    return np.asarray(values, np.float32).tobytes()


# the GPT-2 byte alphabet
def byte_token(b):
    printable = [x for x in range(256) if 33 <= x <= 126 or 161 <= x <= 172 or x >= 174]
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


merges = ["Ġ t", "h e", "Ġt he", "i n", "e r"]
tokens = [byte_token(b) for b in range(256)] + [m.replace(" ", "") for m in merges]
controls = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tokens += controls
V = len(tokens)
types = [1] * (V - len(controls)) + [3] * len(controls)

KV = KV_HEADS * HD
a_d, a_f = (3.0 / DIM) ** 0.5, (3.0 / FFN) ** 0.5
tensors = [("token_embd.weight", [DIM, V], 12, q4_k(V, DIM, 1.0)),
           ("output.weight", [DIM, V], 14, q6_k(V, DIM, 0.1)),
           ("output_norm.weight", [DIM], 0, f32(1 + 0.1 * rng.standard_normal(DIM)))]
for l in range(LAYERS):
    p = "blk.%d." % l
    tensors += [(p + "attn_norm.weight", [DIM], 0, f32(1 + 0.1 * rng.standard_normal(DIM))),
                (p + "attn_q.weight", [DIM, DIM], 12, q4_k(DIM, DIM, a_d)),
                (p + "attn_q.bias", [DIM], 0, f32(0.5 * rng.standard_normal(DIM))),
                (p + "attn_k.weight", [DIM, KV], 12, q4_k(KV, DIM, a_d)),
                (p + "attn_k.bias", [KV], 0, f32(3.0 * rng.standard_normal(KV))),
                (p + "attn_v.weight", [DIM, KV], 14, q6_k(KV, DIM, a_d)),
                (p + "attn_v.bias", [KV], 0, f32(0.2 * rng.standard_normal(KV))),
                (p + "attn_output.weight", [DIM, DIM], 6, q5_0(DIM, DIM, a_d)),
                (p + "ffn_norm.weight", [DIM], 0, f32(1 + 0.1 * rng.standard_normal(DIM))),
                (p + "ffn_gate.weight", [DIM, FFN], 12, q4_k(FFN, DIM, a_d)),
                (p + "ffn_up.weight", [DIM, FFN], 8, q8_0(FFN, DIM, a_d)),
                (p + "ffn_down.weight", [FFN, DIM], 14, q6_k(DIM, FFN, a_f))]

U32, F32, STR, ARR = 4, 6, 8, 9


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


meta = [("general.architecture", STR, "qwen2"), ("qwen2.block_count", U32, LAYERS),
        ("qwen2.context_length", U32, 4096), ("qwen2.embedding_length", U32, DIM),
        ("qwen2.feed_forward_length", U32, FFN), ("qwen2.attention.head_count", U32, HEADS),
        ("qwen2.attention.head_count_kv", U32, KV_HEADS), ("qwen2.rope.freq_base", F32, 1e6),
        ("qwen2.attention.layer_norm_rms_epsilon", F32, 1e-6), ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.pre", STR, "qwen2"), ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
        ("tokenizer.ggml.token_type", ARR, (5, types)), ("tokenizer.ggml.merges", ARR, (STR, merges)),
        ("tokenizer.ggml.eos_token_id", U32, V - 1)]
out = bytearray(struct.pack("<IIQQ", 0x46554747, 3, len(tensors), len(meta)))
for k, t, v in meta:
    out += gstr(k) + struct.pack("<I", t)
    if t == STR:
        out += gstr(v)
    elif t == U32:
        out += struct.pack("<I", v)
    elif t == F32:
        out += struct.pack("<f", v)
    else:
        et, items = v
        out += struct.pack("<IQ", et, len(items))
        for it in items:
            out += gstr(it) if et == STR else struct.pack("<i", it)
off = 0
for name, dims, typ, data in tensors:
    out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
    out += struct.pack("<IQ", typ, off)
    off += (len(data) + 31) // 32 * 32
out += b"\0" * (-len(out) % 32)
for _, _, _, data in tensors:
    out += data + b"\0" * (-len(data) % 32)
open(sys.argv[1], "wb").write(out)
