#!/usr/bin/env python3
"""Would 8-bit integer tensor-core operands hold the decode kernel's accuracy class?  A host-side
model of the arithmetic, no GPU (PERFORMANCE.md, round 49).

The 2- and 4-bit decode kernel (src/decode_gqa.c) feeds the tensor cores f16 operands: the codes
as f16 subnormals (two codes per instruction) against q * scale carried as two f16 parts (22
bits), and p * scale of the value group as one f16.  An `mma` on 8-bit integers (m16n8k32.s8)
would take four codes per instruction, but then q * scale and p * scale must travel as 8-bit
integers too.  This script measures what that costs in accuracy, on the inputs the issue names
(keys as the KIVI paper describes them: per head 2-3 outlier channels x10, per-channel offsets
N(0, 0.5^2), unit normals elsewhere; values unit normals with one x10 channel).

The cache is quantized (2-bit keys per channel, 2-bit values per token, G = 32, fp16 scale and
zero, asymmetric min/max) and then held fixed: the reference is the attention over the
dequantized cache in double precision, as in the library's tests ("rel err vs dequantized"),
so what is measured is the kernel's arithmetic alone.  Error: max |out - ref| / max |ref| over
the heads, the class the kernel must hold (2e-3).

Operand variants.  An integer operand needs a scale known before the products, without a
reduction in the loop: for q * scale the kernel's own bound, max |q| of the head times the largest
key scale of the split (SPLIT tokens); for p * scale, p <= 1 times the largest value scale of the
cache (the kernel keeps such a bound per layer and kv-head).  Variants marked "group" use the
exact maximum of each operand tile instead (a reduction per group: the most an integer operand
could do).
  f16x2    q * scale as two f16 parts (hi, lo), p * scale one f16: today's kernel
  s8       q * scale one int8, p * scale one int8 (bounds)
  s8x2     both as two int8 parts (the high part, then the remainder times 127; bounds)
  s8k      keys as s8x2, p * scale one f16 (8-bit fields for the keys only)
  s8-group s8 with the exact maximum of each tile
  s8k-group  s8k with the exact maximum of each head's q * scale in each group
  s8k3     keys as three int8 parts (bounds), p * scale one f16

Usage: python3 docs/experiments/int8-operands.py [TRIALS]   (needs NumPy)
"""
import sys

import numpy as np

D, G, S, HQ, SPLIT = 128, 32, 4096, 4, 1024  # head_dim, group, tokens, query heads of one kv-head, split


def f16(x):
    return np.asarray(x, dtype=np.float64).astype(np.float16).astype(np.float64)


def quant_groups(x, axis_len, bits):
    """x: [n, axis_len] rows of groups (a group = one row); fp16 scale/zero, codes 0..2^bits-1."""
    mn, mx = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    scale = f16((mx - mn) / (2**bits - 1))
    scale = np.where(scale > 0, scale, f16(np.full_like(scale, 1e-4)))
    zero = f16(mn)
    codes = np.clip(np.rint((x - zero) / scale), 0, 2**bits - 1)
    return codes, scale, zero


def make_inputs(rng):
    k = rng.standard_normal((S, D))
    k += rng.normal(0.0, 0.5, size=(1, D))  # per-channel offsets
    out = rng.choice(D, size=rng.integers(2, 4), replace=False)
    k[:, out] *= 10.0
    k[:, 5] = 0.37  # a constant channel
    v = rng.standard_normal((S, D))
    v[:, rng.integers(D)] *= 10.0
    v[::17, :] = 1.25  # every 17th token constant
    q = rng.standard_normal((HQ, D)) / np.sqrt(D) * 4.0  # logits of a few units: a peaked softmax
    # keys per channel over 32-token groups; values per token over 32-channel groups
    kg = k.reshape(S // G, G, D).transpose(0, 2, 1).reshape(-1, G)
    kc, ks, kz = quant_groups(kg, G, 2)
    kc = kc.reshape(S // G, D, G).transpose(0, 2, 1).reshape(S, D)
    ks, kz = ks.reshape(S // G, D), kz.reshape(S // G, D)
    vc, vs, vz = quant_groups(v.reshape(-1, G), G, 2)
    vc, vs, vz = vc.reshape(S, D), vs.reshape(S, D // G), vz.reshape(S, D // G)
    return q, (kc, ks, kz), (vc, vs, vz)


def to_int8(x, parts, bound=None):
    """x [..., n] per row: as `parts` int8 terms of one scale (bound, default max |x| of the row,
    -> 127), their sum back."""
    amax = np.abs(x).max(axis=-1, keepdims=True) if bound is None else bound
    a = np.where(amax > 0, amax / 127.0, 1.0)
    y, acc, unit = x / a, np.zeros_like(x), 1.0
    for _ in range(parts):
        t = np.clip(np.rint(y / unit), -127, 127) * unit
        acc += t
        y = y - t
        unit /= 127.0
    return acc * a


def f16_parts(x, parts):
    hi = f16(x)
    return hi if parts == 1 else hi + f16(x - hi)


def attend(q, kq, vq, key_op, p_op):
    kc, ks, kz = kq
    vc, vs, vz = vq
    ng = S // G
    logits = np.zeros((HQ, S))
    for gi in range(ng):  # per group: q * scale as the kernel's operand, codes exact, the zero term in fp32
        sl = slice(gi * G, (gi + 1) * G)
        sp = slice(gi * G // SPLIT * SPLIT // G, (gi * G // SPLIT + 1) * SPLIT // G)
        kbound = np.abs(q).max(axis=1, keepdims=True) * ks[sp].max()  # the kernel's bound for its split
        qs = key_op(q * ks[gi][None, :], kbound)  # [HQ, D]
        logits[:, sl] = qs @ kc[sl].T + (q @ kz[gi])[:, None]
    m = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - m)
    l = p.sum(axis=1, keepdims=True)
    out, vbound = np.zeros((HQ, D)), vs.max()
    for gi in range(ng):  # per 32 tokens and value group: p * scale as the operand, codes exact
        sl = slice(gi * G, (gi + 1) * G)
        for vg in range(D // G):
            cs = slice(vg * G, (vg + 1) * G)
            ps = p_op(p[:, sl] * vs[sl, vg][None, :], vbound)  # [HQ, 32 tokens]
            out[:, cs] += ps @ vc[sl, cs] + (p[:, sl] @ vz[sl, vg])[:, None]
    return out / l


def reference(q, kq, vq):
    return attend(q, kq, vq, lambda x, b: x, lambda x, b: x)


VARIANTS = {
    "f16x2": (lambda x, b: f16_parts(x, 2), lambda x, b: f16_parts(x, 1)),
    "s8": (lambda x, b: to_int8(x, 1, b), lambda x, b: to_int8(x, 1, b)),
    "s8x2": (lambda x, b: to_int8(x, 2, b), lambda x, b: to_int8(x, 2, b)),
    "s8k": (lambda x, b: to_int8(x, 2, b), lambda x, b: f16_parts(x, 1)),
    "s8-group": (lambda x, b: to_int8(x, 1), lambda x, b: to_int8(x, 1)),
    "s8k-group": (lambda x, b: to_int8(x, 2), lambda x, b: f16_parts(x, 1)),
    "s8k3": (lambda x, b: to_int8(x, 3, b), lambda x, b: f16_parts(x, 1)),
}


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    rng = np.random.default_rng(2026)
    worst = {k: 0.0 for k in VARIANTS}
    for _ in range(trials):
        q, kq, vq = make_inputs(rng)
        ref = reference(q, kq, vq)
        for name, (kop, pop) in VARIANTS.items():
            out = attend(q, kq, vq, kop, pop)
            worst[name] = max(worst[name], np.abs(out - ref).max() / np.abs(ref).max())
    print("max |out - ref| / max |ref| over %d trials (D %d, S %d, %d heads, KIVI-2, G %d, splits of %d):"
          % (trials, D, S, HQ, G, SPLIT))
    for name, e in worst.items():
        print("  %-9s %.2e%s" % (name, e, "" if e <= 2e-3 else "   above the 2e-3 class"))


if __name__ == "__main__":
    main()
