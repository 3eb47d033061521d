/* Quantize-and-pack bodies: one work item each, shared by the GPU and the host launchers
 * (the launchers are the target regions in cache.c).  Semantics: kivi.h, layout: layout.h. */
#ifndef KIVI_KERNELS_QUANT_H
#define KIVI_KERNELS_QUANT_H

#include <math.h>
#include <stdint.h>

#include "half.h"
#include "kivi.h" /* kivi_dtype */
#include "layout.h"

/* Partial unrolling of the loops over a group's G values: 16-byte steps, 4 loads in flight per
 * thread (a whole 32-value group); 2-byte steps, 8 loads in flight. */
#define KIVI_UNROLL4 _Pragma("GCC unroll 4")
#define KIVI_UNROLL8 _Pragma("GCC unroll 8")

#pragma omp declare target
/* code = clamp(floor((x - zero) / scale + 1/2), 0, 2^b - 1) with the stored fp16 scale/zero;
 * a zero scale (constant group) gives code 0, which dequantizes to the zero point exactly.
 * kivi_code_of: the floor and the clamp of y = (x - zero) / scale + 1/2, maxq = 2^b - 1. */
static inline uint32_t kivi_code_of(float y, float maxq) { return (uint32_t)fminf(fmaxf(floorf(y), 0.0f), maxq); }
static inline uint32_t kivi_quant_code(float x, float scale, float zero, float maxq) {
  if (!(scale > 0.0f)) return 0u;
  return kivi_code_of((x - zero) / scale + 0.5f, maxq);
}

/* The larger appends compute codes by a multiplication with 1 / scale (kivi_quant_code_mul
 * below) and take the division only within KIVI_QUANT_EPS of a rounding boundary. */
#define KIVI_QUANT_EPS (1.0f / 2048.0f)
#define KIVI_QUANT_NEAR (0.5f - KIVI_QUANT_EPS) /* kivi_quant_code_mul, below */
#define KIVI_QUANT_RN 12582912.0f             /* 1.5 2^23 */

/* Group statistics -> stored fp16 scale and zero. */
static inline void kivi_group_params(float mn, float mx, int bits, uint16_t *hs, uint16_t *hz) {
  *hs = kivi_f32_to_f16((mx - mn) / (float)((1u << bits) - 1u));
  *hz = kivi_f32_to_f16(mn); /* mn is an fp16 value: exact */
}

/* The code by a multiplication, for x >= zero (the group's minimum) and rs = 1 / scale (0 for a
 * zero scale: code 0, as the division's): r = (x - zero) rs clamped to maxq and rounded to the
 * nearest integer (ties to even: t = r + 1.5 2^23 has an ulp of 1, so t - 1.5 2^23 is rint(r),
 * and the code is t's low mantissa bits; no float-to-int conversion).  Three fp32 roundings
 * (x - zero, rs, the product) put r within 3 2^-24 |quotient| <= 2^-13.4 of the quotient
 * (|quotient| <= 1.5 maxq < 2^9, the 1.5 for subnormal scales), and the division's own "+ 1/2"
 * rounds by at most 2^-15, so where r is more than KIVI_QUANT_EPS from a half-integer the code
 * is the division's (at r >= maxq both are maxq).  *dev rises to |r - rint(r)|: where it ends
 * above KIVI_QUANT_NEAR the caller takes kivi_quant_code (rare: the items redo those values
 * after their loop, where a test per value would make the compiler compute every division). */
static inline uint32_t kivi_quant_code_mul(float x, float rs, float zero, float maxq, float *dev) {
  const float r = fminf((x - zero) * rs, maxq), t = r + KIVI_QUANT_RN;
  *dev = fmaxf(*dev, fabsf(r - (t - KIVI_QUANT_RN)));
  return kivi_f32_bits(t) - 0x4b400000u; /* the bits of 1.5 2^23 */
}

/* ---- Searched value ranges (kivi_cache_config.v_clip = KIVI_CLIP_MSE; the rule: kivi.h) ----
 * Every operation is one IEEE fp32 rounding whose products are exact (so a compiler that fuses
 * a multiply and an add gets the same bits): the same choice on every compiler and device.
 * x: the group's G values (bf: bf16, rounded to fp16 as read), mn / mx their min and max. */
static inline float kivi_v_in(uint16_t h, int bf) { return kivi_f16_to_f32(bf ? kivi_bf16_to_f16(h) : h); }
/* The stored scale and zero of the group: of the ranges [mn + a h, mx - a h], a = i / 16 for
 * i = 0 .. KIVI_CLIP_STEPS, h = (mx - mn) / 2 rounded to fp16, the first whose reconstruction
 * has the smallest sum of squared errors, each error cut to 12 significant bits (its square
 * then exact in fp32); i = 0 is the min/max rule's own scale and zero.  One pass over the
 * values for all candidates; each code by kivi_quant_code_mul of max(x, zero) (a value below
 * a narrowed range's zero gets code 0, as by the division), by the division within
 * KIVI_QUANT_EPS of a rounding boundary. */
#define KIVI_CLIP_STEPS 8
#define KIVI_CLIP_N (KIVI_CLIP_STEPS + 1)
static inline void kivi_v_clip_params(const uint16_t *x, int G, int bits, int bf, float mn, float mx, uint16_t *hs,
                                      uint16_t *hz) {
  kivi_group_params(mn, mx, bits, hs, hz);
  const float maxq = (float)((1u << bits) - 1u), h = kivi_f16_to_f32(kivi_f32_to_f16(0.5f * (mx - mn)));
  if (!(h > 0.0f && h <= 65504.0f)) return; /* a constant group, or a range beyond fp16's */
  uint16_t s16[KIVI_CLIP_N], z16[KIVI_CLIP_N];
  float sc[KIVI_CLIP_N], zr[KIVI_CLIP_N], rs[KIVI_CLIP_N], err[KIVI_CLIP_N];
  _Pragma("GCC unroll 9")
  for (int i = 0; i < KIVI_CLIP_N; ++i) {
    const float a = (float)i * 0.0625f, lo = mn + a * h, hi = mx - a * h;
    s16[i] = i ? kivi_f32_to_f16((hi - lo) / maxq) : *hs;
    z16[i] = i ? kivi_f32_to_f16(lo) : *hz;
    sc[i] = kivi_f16_to_f32(s16[i]);
    zr[i] = kivi_f16_to_f32(z16[i]);
    rs[i] = sc[i] > 0.0f ? 1.0f / sc[i] : 0.0f;
    err[i] = 0.0f;
  }
  for (int c = 0; c < G; ++c) {
    const float f = kivi_v_in(x[c], bf);
    _Pragma("GCC unroll 9")
    for (int i = 0; i < KIVI_CLIP_N; ++i) {
      float dev = 0.0f; /* below the zero: code 0, as the division's */
      uint32_t code = kivi_quant_code_mul(fmaxf(f, zr[i]), rs[i], zr[i], maxq, &dev);
      if (dev > KIVI_QUANT_NEAR) code = kivi_quant_code(f, sc[i], zr[i], maxq);
      const float d = ((float)code * sc[i] + zr[i]) - f;
      const float dc = kivi_bits_f32(kivi_f32_bits(d) & 0xfffff000u);
      err[i] += dc * dc;
    }
  }
  float best = err[0];
  for (int i = 1; i < KIVI_CLIP_N; ++i)
    if (err[i] < best) {
      best = err[i];
      *hs = s16[i];
      *hz = z16[i];
    }
}
/* The code words of a value group of G values x (bf: bf16, rounded to fp16 as read) with stored
 * scale s and zero z, each code by the division (kivi_quant_code: values may lie outside a
 * searched range). */
static inline void kivi_v_codes(uint32_t *w, const uint16_t *x, int G, int bits, int bf, float s, float z) {
  const int cpw = 32 / bits;
  const float maxq = (float)((1u << bits) - 1u);
  for (int i = 0; i < G / cpw; ++i) {
    uint32_t word = 0;
    for (int j = 0; j < cpw; ++j) word |= kivi_quant_code(kivi_v_in(x[i * cpw + j], bf), s, z, maxq) << (bits * j);
    w[i] = word;
  }
}

/* 8 consecutive fp16 values from a 16-byte aligned address, in one load on the GPU. */
typedef struct kivi_f16x8 {
  uint16_t v[8];
} __attribute__((aligned(16))) kivi_f16x8;
static inline kivi_f16x8 kivi_ld8(const uint16_t *p) { return *(const kivi_f16x8 *)p; }

/* The row (head_dim values) of token position p for one kv-head: positions before L come from
 * the residual ring (slot p mod R), later ones from the new tokens ([token][H][D] from stage_tok:
 * the stage, or a 16-bit input the larger appends read directly). */
static inline const uint16_t *kivi_src_row(int64_t p, int64_t L, const uint16_t *ring, int R, int D,
                                           const uint16_t *stage, int64_t stage_tok, int H, int h) {
  return p < L ? ring + (size_t)((int)p % R) * D /* positions fit in int: 32-bit remainder */
               : stage + ((size_t)(stage_tok + (p - L)) * H + h) * D;
}

/* K item: channels c0..c0+7 (c0 a multiple of 8) of the G tokens starting at position p0, 8
 * codes per token: bits bytes at byte c0 * bits / 8 of the token's code row (the little-endian
 * words of layout.h hold channel c at bit c * bits of the row), stride rb bytes per token.
 * scale/zero at the group's entries for channel c0.  Unquantized (bits 16): the 16 bytes of
 * fp16 values.  Each token row is read 16 bytes at a time (rows are 16-byte aligned) and looked
 * up once per pass (positions fit in int: the ring index is a 32-bit remainder). */
static inline __attribute__((always_inline)) void kivi_quant_k_item(unsigned char *codes, size_t rb, uint16_t *scale,
                                                                    uint16_t *zero, int bits, int G, int c0, int64_t p0,
                                                                    int64_t L, const uint16_t *ring, int R, int D,
                                                                    const uint16_t *stage, int64_t stage_tok, int H,
                                                                    int h) {
  if (bits == 16) {
    for (int t = 0; t < G; ++t)
      *(kivi_f16x8 *)(codes + (size_t)t * rb) = kivi_ld8(kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0);
    return;
  }
  const float maxq = (float)((1u << bits) - 1u);
  float mn[8], mx[8];
  for (int j = 0; j < 8; ++j) { mn[j] = INFINITY; mx[j] = -INFINITY; }
  for (int t = 0; t < G; ++t) {
    const kivi_f16x8 v = kivi_ld8(kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0);
    for (int j = 0; j < 8; ++j) {
      const float f = kivi_f16_to_f32(v.v[j]);
      mn[j] = fminf(mn[j], f);
      mx[j] = fmaxf(mx[j], f);
    }
  }
  for (int j = 0; j < 8; ++j) { /* mn, mx become the stored zero and scale */
    uint16_t hs, hz;
    kivi_group_params(mn[j], mx[j], bits, &hs, &hz);
    scale[j] = hs;
    zero[j] = hz;
    mx[j] = kivi_f16_to_f32(hs);
    mn[j] = kivi_f16_to_f32(hz);
  }
  for (int t = 0; t < G; ++t) {
    const kivi_f16x8 v = kivi_ld8(kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0);
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) {
      const float f = kivi_f16_to_f32(v.v[j]);
      w |= (uint64_t)kivi_quant_code(f, mx[j], mn[j], maxq) << (bits * j);
    }
    unsigned char *dst = codes + (size_t)t * rb;
    if (bits == 2) *(uint16_t *)dst = (uint16_t)w;
    else if (bits == 4) *(uint32_t *)dst = (uint32_t)w;
    else *(uint64_t *)dst = w;
  }
}

/* The one-kernel append's V item: channel group cg (G channels) of one token row x, read 2
 * bytes at a time with 8 loads in flight (on the H200 16-byte loads made this append slower:
 * 17.8 -> 24.8 us).  codes points at the token's code row, sz at its {scale, zero} array. */
static inline void kivi_quant_v_item(uint32_t *codes, uint16_t *sz, int bits, int G, int cg, const uint16_t *x,
                                     int clip) {
  x += (size_t)cg * G;
  if (bits == 16) {
    uint32_t *w = codes + (size_t)cg * G / 2;
    for (int i = 0; i < G / 2; ++i) w[i] = (uint32_t)x[2 * i] | (uint32_t)x[2 * i + 1] << 16;
    return;
  }
  float mn = INFINITY, mx = -INFINITY;
  KIVI_UNROLL8
  for (int c = 0; c < G; ++c) {
    const float f = kivi_f16_to_f32(x[c]);
    mn = fminf(mn, f);
    mx = fmaxf(mx, f);
  }
  uint16_t hs, hz;
  if (clip) kivi_v_clip_params(x, G, bits, 0, mn, mx, &hs, &hz);
  else kivi_group_params(mn, mx, bits, &hs, &hz);
  sz[2 * cg] = hs;
  sz[2 * cg + 1] = hz;
  kivi_v_codes(codes + (size_t)cg * G * bits / 32, x, G, bits, 0, kivi_f16_to_f32(hs), kivi_f16_to_f32(hz));
}

/* The one-kernel append's K item (append.c, ap_fused_block): token group g, channels 8 c8 .. 8 c8 + 7 of
 * the kv-head's sub-block sb (the group's first position p0), tokens from the ring (before L)
 * or the stage.  Returns its 8 stored scales (the caller raises the K exponent bound with them;
 * unquantized keys have none: NULL). */
static inline const uint16_t *kivi_append_k_item(unsigned char *sb, const kivi_layout *lay, int g, int c8, int64_t p0, int64_t L,
                                      const uint16_t *ring, const uint16_t *stage, int64_t st0, int h) {
  const int G = lay->G, D = lay->D, R = lay->R, H = lay->H, c0 = 8 * c8;
  const size_t rb = (size_t)lay->kw * 4; /* bytes per token row of codes */
  unsigned char *codes = kivi_kcodes_at(sb, lay, g, c0);
  uint16_t *sc = kivi_kscales_at(sb, lay, g, c0);
  switch (lay->kb) { /* constant bits: the per-channel arrays of the item stay in registers */
  case 2: kivi_quant_k_item(codes, rb, sc, sc + D, 2, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  case 4: kivi_quant_k_item(codes, rb, sc, sc + D, 4, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  case 8: kivi_quant_k_item(codes, rb, sc, sc + D, 8, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  default: kivi_quant_k_item(codes, rb, sc, sc + D, 16, G, c0, p0, L, ring, R, D, stage, st0, H, h); return NULL;
  }
  return sc;
}

/* ---- The items of the larger appends (append.c, kernels 2a and 2b) ----
 * They read fp16 (or bf16, bf: rounded to fp16 as they are read) in pairs packed in 32-bit
 * words, hold a block of 32 tokens (keys) or 32 channels (values) in registers between the
 * statistics and the codes, and return the non-finite marks of what they read (nonzero: the
 * input had a NaN, an Inf or a value fp16 cannot hold), so they read the caller's input
 * directly: the check rides on the quantization. */
#define KIVI_UNROLL32 _Pragma("GCC unroll 32")
#define KIVI_QBLK 32 /* tokens (keys) or channels (values) per block held in registers */
/* Hides a value's origin from the optimizer, so that the codes' pass converts the fp16 pairs
 * again instead of keeping every fp32 value of the statistics' pass alive (on the GPU: 241
 * registers for the key item without it).  An empty asm: no instruction. */
#define KIVI_OPAQUE(x) __asm__("" : "+r"(x))

typedef struct kivi_u32x2 {
  uint32_t w[2];
} __attribute__((aligned(8), may_alias)) kivi_u32x2; /* may_alias: they read fp16 arrays */
typedef struct kivi_u32x4 {
  uint32_t w[4];
} __attribute__((aligned(16), may_alias)) kivi_u32x4;

/* A bf16 pair rounded to an fp16 pair. */
static inline uint32_t kivi_bf16x2_to_f16x2(uint32_t w) {
  return (uint32_t)kivi_bf16_to_f16((uint16_t)w) | (uint32_t)kivi_bf16_to_f16((uint16_t)(w >> 16)) << 16;
}
/* Nonzero if a half of the fp16 pair w is not finite: an all-ones exponent carries into the
 * half's sign bit when 1 is added to it (the low half cannot carry into the high one). */
static inline uint32_t kivi_f16x2_nonfinite(uint32_t w) { return ((w & 0x7c007c00u) + 0x04000400u) & 0x80008000u; }
static inline float kivi_f16x2_lo(uint32_t w) { return kivi_f16_to_f32((uint16_t)w); }
static inline float kivi_f16x2_hi(uint32_t w) { return kivi_f16_to_f32((uint16_t)(w >> 16)); }

/* kivi_quant_code_mul with r = fma(x, rs, nzr), nzr = -(zero rs) rounded to fp32 (one
 * instruction for (x - zero) rs) and without the clamp, where kivi_quant_fma_ok:
 *  - |zero rs| < 2^12: the rounding of nzr adds at most 2^-12 to r's error (2^-12 + 2^-13.4 +
 *    2^-15 < KIVI_QUANT_EPS in all);
 *  - the scale is 0 (rs = 0: r = 0) or a normal fp16 value, so it is (max - min) / maxq within
 *    a relative 2^-11 and r <= maxq (1 + 2^-10) < maxq + 1/2 needs no clamp.
 * The GPU append kernels (append_gpu.c) take it per group. */
static inline int kivi_quant_fma_ok(float zero, float scale, float rs) {
  return fabsf(zero * rs) < 4096.0f && (scale == 0.0f || scale >= 6.103515625e-5f); /* 2^-14 */
}
static inline uint32_t kivi_quant_code_fma(float x, float rs, float nzr, float *dev) {
  const float r = fmaf(x, rs, nzr), t = r + KIVI_QUANT_RN;
  *dev = fmaxf(*dev, fabsf(r - (t - KIVI_QUANT_RN)));
  return kivi_f32_bits(t) - 0x4b400000u;
}
static inline float kivi_quant_rs(float scale) { return scale > 0.0f ? 1.0f / scale : 0.0f; }

/* The 4 values of token t of a key item: one load from an address chosen without a branch (a
 * branch per token would keep the loads of a group from being in flight together), bf16
 * rounded to fp16 for the source's tokens where bf (constant at each call). */
static inline __attribute__((always_inline)) kivi_u32x2 kivi_k4_load(const uint16_t *rrow, const uint16_t *srow,
                                                                     int t, int nring, int D, size_t sstep, int bf) {
  const int from_src = t >= nring;
  const uint16_t *p = from_src ? srow + (size_t)(t - nring) * sstep : rrow + (size_t)t * D;
  kivi_u32x2 v = *(const kivi_u32x2 *)p;
  if (bf) {
    const uint32_t a = kivi_bf16x2_to_f16x2(v.w[0]), b = kivi_bf16x2_to_f16x2(v.w[1]);
    v.w[0] = from_src ? a : v.w[0];
    v.w[1] = from_src ? b : v.w[1];
  }
  return v;
}

/* The 4 codes w of a token (bits each) at dst. */
static inline void kivi_k4_store(unsigned char *dst, uint32_t w, int bits) {
  if (bits == 2) *dst = (unsigned char)w;
  else if (bits == 4) *(uint16_t *)dst = (uint16_t)w;
  else *(uint32_t *)dst = w;
}

/* K item of the larger appends: channels c0..c0+3 (c0 a multiple of 4) of the G tokens from
 * position p0 (a group: p0 mod R + G <= R), bits constant at each call.  Tokens before L come
 * from the residual ring, the others from src ([token][H][D] from token src_tok at L, 8-byte
 * aligned rows; bf: bf16).  codes: the group's first code row at channel c0, rb bytes per row;
 * sc / zr: the group's scales / zeros at channel c0 (absent for bits 16).  The 4 codes of a
 * token are one store of bits / 2 bytes (2-bit: a byte; neighbouring items fill a row). */
static inline __attribute__((always_inline)) uint32_t kivi_k4_item(unsigned char *codes, size_t rb, uint16_t *sc,
                                                                 uint16_t *zr, int bits, int G, int c0, int64_t p0,
                                                                 int64_t L, const uint16_t *ring, int R, int D,
                                                                 const uint16_t *src, int bf, int64_t src_tok, int H,
                                                                 int h, int keep) {
  /* token p0 + t: ring row (p0 mod R) + t for t < nring, else source row src_tok + (p0 - L) + t */
  const int nring = keep || L <= p0 ? 0 : (int)(L - p0 < G ? L - p0 : G); /* keep: callers ensure none */
  const uint16_t *rrow = ring + (size_t)((int)(p0 % R)) * D + c0;
  const uint16_t *srow = /* token nring */
      nring < G ? src + ((size_t)(src_tok + (p0 + nring - L)) * H + h) * D + c0 : src;
  const size_t sstep = (size_t)H * D;
  uint32_t bad = 0;
  float mn[4], mx[4];
  for (int j = 0; j < 4; ++j) { mn[j] = INFINITY; mx[j] = -INFINITY; }
  kivi_u32x2 x[KIVI_QBLK];
  const int blk = keep ? KIVI_QBLK : 8; /* tokens per block: the group, or 8 read twice */
#define KIVI_K4_LOAD(t) kivi_k4_load(rrow, srow, t, nring, D, sstep, bf)
  if (bits == 16) { /* unquantized: the fp16 values themselves, in one pass */
    for (int b0 = 0; b0 < G; b0 += blk) {
      KIVI_UNROLL32
      for (int t = 0; t < blk; ++t) { /* the loads first: a store may alias a later load */
        x[t] = KIVI_K4_LOAD(b0 + t);
        bad |= kivi_f16x2_nonfinite(x[t].w[0]) | kivi_f16x2_nonfinite(x[t].w[1]);
      }
      KIVI_UNROLL32
      for (int t = 0; t < blk; ++t) *(kivi_u32x2 *)(codes + (size_t)(b0 + t) * rb) = x[t];
    }
    return bad;
  }
  for (int b0 = 0; b0 < G; b0 += blk) {
    KIVI_UNROLL32
    for (int t = 0; t < blk; ++t) {
      x[t] = KIVI_K4_LOAD(b0 + t);
      bad |= kivi_f16x2_nonfinite(x[t].w[0]) | kivi_f16x2_nonfinite(x[t].w[1]);
      for (int j = 0; j < 4; ++j) {
        const uint32_t w = x[t].w[j >> 1];
        const float f = j & 1 ? kivi_f16x2_hi(w) : kivi_f16x2_lo(w);
        mn[j] = fminf(mn[j], f);
        mx[j] = fmaxf(mx[j], f);
      }
    }
  }
  const float maxq = (float)((1u << bits) - 1u);
  float s[4], z[4], rs[4];
  uint16_t hs[4], hz[4];
  for (int j = 0; j < 4; ++j) {
    kivi_group_params(mn[j], mx[j], bits, &hs[j], &hz[j]);
    s[j] = kivi_f16_to_f32(hs[j]);
    z[j] = kivi_f16_to_f32(hz[j]);
    rs[j] = kivi_quant_rs(s[j]);
  }
  kivi_u32x2 ps, pz;
  ps.w[0] = (uint32_t)hs[0] | (uint32_t)hs[1] << 16;
  ps.w[1] = (uint32_t)hs[2] | (uint32_t)hs[3] << 16;
  pz.w[0] = (uint32_t)hz[0] | (uint32_t)hz[1] << 16;
  pz.w[1] = (uint32_t)hz[2] | (uint32_t)hz[3] << 16;
  *(kivi_u32x2 *)sc = ps;
  *(kivi_u32x2 *)zr = pz;
  for (int b0 = 0; b0 < G; b0 += blk) {
    uint32_t fix = 0; /* tokens of the block with a code the division decides */
    KIVI_UNROLL32
    for (int t = 0; t < blk; ++t) {
      if (!keep) x[t] = KIVI_K4_LOAD(b0 + t);
      KIVI_OPAQUE(x[t].w[0]);
      KIVI_OPAQUE(x[t].w[1]);
      uint32_t w = 0;
      float dev = 0.0f;
      for (int j = 0; j < 4; ++j) {
        const uint32_t hw = x[t].w[j >> 1];
        const float f = j & 1 ? kivi_f16x2_hi(hw) : kivi_f16x2_lo(hw);
        w |= kivi_quant_code_mul(f, rs[j], z[j], maxq, &dev) << (bits * j);
      }
      fix |= (uint32_t)(dev > KIVI_QUANT_NEAR) << t;
      kivi_k4_store(codes + (size_t)(b0 + t) * rb, w, bits);
    }
    while (fix) { /* their 4 codes again, by the division */
      const int t = __builtin_ctz(fix);
      fix &= fix - 1u;
      const kivi_u32x2 v = KIVI_K4_LOAD(b0 + t);
      uint32_t w = 0;
      for (int j = 0; j < 4; ++j) {
        const float f = j & 1 ? kivi_f16x2_hi(v.w[j >> 1]) : kivi_f16x2_lo(v.w[j >> 1]);
        w |= kivi_quant_code(f, s[j], z[j], maxq) << (bits * j);
      }
      kivi_k4_store(codes + (size_t)(b0 + t) * rb, w, bits);
    }
  }
#undef KIVI_K4_LOAD
  return bad;
}

/* V item of the larger appends: channel group cg (G channels) of the token row x (16-byte
 * aligned; bf: bf16), stored in the token's code row codes and {scale, zero} array sz, bits
 * constant at each call. */
static inline __attribute__((always_inline)) uint32_t kivi_v32_item(uint32_t *codes, uint16_t *sz, int bits, int G,
                                                                  int keep, int cg, const uint16_t *x, int bf,
                                                                  int clip) {
  x += (size_t)cg * G;
  uint32_t bad = 0;
  float mn = INFINITY, mx = -INFINITY;
  uint32_t w[KIVI_QBLK / 2];
#define KIVI_V32_LOAD(b0)                                                                                        \
  for (int q = 0; q < KIVI_QBLK / 8; ++q) {                                                                      \
    const kivi_u32x4 v = *(const kivi_u32x4 *)(x + (b0) + 8 * q);                                                \
    for (int e = 0; e < 4; ++e) w[4 * q + e] = bf ? kivi_bf16x2_to_f16x2(v.w[e]) : v.w[e];                      \
  }
  if (bits == 16) { /* unquantized: the fp16 values themselves, in one pass */
    for (int b0 = 0; b0 < G; b0 += KIVI_QBLK) {
      KIVI_V32_LOAD(b0)
      for (int i = 0; i < KIVI_QBLK / 2; ++i) bad |= kivi_f16x2_nonfinite(w[i]);
      for (int q = 0; q < KIVI_QBLK / 8; ++q)
        *(kivi_u32x4 *)(codes + ((size_t)cg * G + b0) / 2 + 4 * q) = *(const kivi_u32x4 *)(w + 4 * q);
    }
    return bad;
  }
  for (int b0 = 0; b0 < G; b0 += KIVI_QBLK) {
    KIVI_V32_LOAD(b0)
    for (int i = 0; i < KIVI_QBLK / 2; ++i) {
      bad |= kivi_f16x2_nonfinite(w[i]);
      const float a = kivi_f16x2_lo(w[i]), b = kivi_f16x2_hi(w[i]);
      mn = fminf(mn, fminf(a, b));
      mx = fmaxf(mx, fmaxf(a, b));
    }
  }
  uint16_t hs, hz;
  if (clip) { /* a searched range (rare: its own loops, reading x again) */
    kivi_v_clip_params(x, G, bits, bf, mn, mx, &hs, &hz);
    *(uint32_t *)(sz + 2 * cg) = (uint32_t)hs | (uint32_t)hz << 16;
    kivi_v_codes(codes + (size_t)cg * G * bits / 32, x, G, bits, bf, kivi_f16_to_f32(hs), kivi_f16_to_f32(hz));
    return bad;
  }
  kivi_group_params(mn, mx, bits, &hs, &hz);
  *(uint32_t *)(sz + 2 * cg) = (uint32_t)hs | (uint32_t)hz << 16;
  const float s = kivi_f16_to_f32(hs), z = kivi_f16_to_f32(hz), rs = kivi_quant_rs(s);
  const float maxq = (float)((1u << bits) - 1u);
  const int cpw = 32 / bits; /* codes per word */
  for (int b0 = 0; b0 < G; b0 += KIVI_QBLK) {
    if (!keep) { KIVI_V32_LOAD(b0) }
    uint32_t cw[KIVI_QBLK / 2]; /* the block's code words: 2-bit 2, 4-bit 4, 8-bit 8 */
    for (int i = 0; i < KIVI_QBLK * bits / 32; ++i) cw[i] = 0;
    uint32_t fix = 0; /* channels of the block with a code the division decides */
    KIVI_UNROLL32
    for (int c = 0; c < KIVI_QBLK; ++c) {
      const float f = c & 1 ? kivi_f16x2_hi(w[c / 2]) : kivi_f16x2_lo(w[c / 2]);
      float dev = 0.0f;
      cw[c / cpw] |= kivi_quant_code_mul(f, rs, z, maxq, &dev) << (bits * (c % cpw));
      fix |= (uint32_t)(dev > KIVI_QUANT_NEAR) << c;
    }
    uint32_t *dst = codes + ((size_t)cg * G + b0) / cpw;
    if (bits == 2) *(kivi_u32x2 *)dst = *(const kivi_u32x2 *)cw;
    else
      for (int q = 0; q < bits / 4; ++q) *(kivi_u32x4 *)(dst + 4 * q) = *(const kivi_u32x4 *)(cw + 4 * q);
    while (fix) { /* their codes again, by the division, patched into the stored words */
      const int c = __builtin_ctz(fix);
      fix &= fix - 1u;
      const float f = kivi_v_in(x[b0 + c], bf);
      const int sh = bits * (c % cpw);
      dst[c / cpw] = (dst[c / cpw] & ~((uint32_t)maxq << sh)) | kivi_quant_code(f, s, z, maxq) << sh;
    }
  }
#undef KIVI_V32_LOAD
  return bad;
}

/* Exponent bounds of V scales and zeros (the GPU decode kernel's ranges): -14 is no bound (fp16
 * subnormals); e2[0..1] rise to cover the stored {scale, zero} pair sz (none if NULL). */
static inline void kivi_vexp_fold(int e2[2], const uint16_t *sz) {
  if (!sz) return;
  for (int e = 0; e < 2; ++e) {
    const int x = kivi_f16_exp_bound(sz[e]);
    e2[e] = x > e2[e] ? x : e2[e];
  }
}

/* The exponent bound of K scales: *e rises to cover the n stored scales sc (none if NULL). */
static inline void kivi_kexp_fold(int *e, const uint16_t *sc, int n) {
  if (!sc) return;
  for (int j = 0; j < n; ++j) {
    const int x = kivi_f16_exp_bound(sc[j]);
    *e = x > *e ? x : *e;
  }
}

/* Raises the bounds b[0..2] ({V scale, V zero, K scale}: global or team memory, shared by other
 * threads) to e[0..2] atomically; a bound of -14 raises nothing, and one that a plain read finds
 * already covered costs no atomic (bounds only rise: a stale read costs an atomic, never a
 * missed raise). */
static inline void kivi_vexp_raise(int32_t *b, const int e[3]) {
  const volatile int32_t *cur = b;
  for (int j = 0; j < 3; ++j) {
    const int x = e[j];
    if (x > -14 && x > cur[j]) {
#pragma omp atomic compare
      if (b[j] < x) { b[j] = x; }
    }
  }
}

/* The one-kernel append's V item: channel group cg of the token row x that leaves the window,
 * stored at slot t of the kv-head's sub-block sb.  Returns the stored {scale, zero} pair
 * (the caller raises the V exponent bounds with it; unquantized values have none: NULL). */
static inline const uint16_t *kivi_append_v_item(unsigned char *sb, const kivi_layout *lay, int cg, int t,
                                                 const uint16_t *x, int clip) {
  const int G = lay->G;
  uint16_t *sz = kivi_vscales_at(sb, lay, t);
  uint32_t *vc = kivi_vcodes_at(sb, lay, t);
  switch (lay->vb) {
  case 2: kivi_quant_v_item(vc, sz, 2, G, cg, x, clip); break;
  case 4: kivi_quant_v_item(vc, sz, 4, G, cg, x, clip); break;
  case 8: kivi_quant_v_item(vc, sz, 8, G, cg, x, clip); break;
  default: kivi_quant_v_item(vc, sz, 16, G, cg, x, 0); return NULL;
  }
  return sz + 2 * cg;
}

/* Kernel 2a's item: token group g, channels 4 c4 .. 4 c4 + 3 of the kv-head's sub-block sb (the
 * group's first position p0), tokens from the ring (before L) or src (kivi_k4_item); returns
 * the non-finite marks of the values read.  G = 32 is its own instance (the group in
 * registers). */
static inline __attribute__((always_inline)) uint32_t kivi_append_k4(unsigned char *sb, const kivi_layout *lay, int g,
                                                                     int c4, int64_t p0, int64_t L,
                                                                     const uint16_t *ring, const uint16_t *src, int bf,
                                                                     int64_t st0, int h) {
  const int G = lay->G, D = lay->D, R = lay->R, H = lay->H, c0 = 4 * c4;
  const size_t rb = (size_t)lay->kw * 4;
  unsigned char *codes = kivi_kcodes_at(sb, lay, g, c0);
  uint16_t *sc = kivi_kscales_at(sb, lay, g, c0);
#define KIVI_K4(b, gg, keep, bf)                                                                                 \
  kivi_k4_item(codes, rb, sc, sc + D, b, gg, c0, p0, L, ring, R, D, src, bf, st0, H, h, keep)
  /* a group of 32 new tokens (none in the ring: the common case of a prefill) is held in
   * registers, in instances per bits and per source type; any other group is read twice */
  const int keep = G == KIVI_QBLK && p0 >= L;
  switch (lay->kb) {
  case 2: return keep ? (bf ? KIVI_K4(2, KIVI_QBLK, 1, 1) : KIVI_K4(2, KIVI_QBLK, 1, 0)) : KIVI_K4(2, G, 0, bf);
  case 4: return keep ? (bf ? KIVI_K4(4, KIVI_QBLK, 1, 1) : KIVI_K4(4, KIVI_QBLK, 1, 0)) : KIVI_K4(4, G, 0, bf);
  case 8: return keep ? KIVI_K4(8, KIVI_QBLK, 1, bf) : KIVI_K4(8, G, 0, bf);
  default: return keep ? KIVI_K4(16, KIVI_QBLK, 1, bf) : KIVI_K4(16, G, 0, bf);
  }
#undef KIVI_K4
}

/* Kernel 2b's item: channel group cg of the token row x (bf: bf16) stored at slot t of the
 * kv-head's sub-block sb; raises e2 to the stored {scale, zero} pair's exponent bounds and
 * returns the non-finite marks of the values read. */
static inline __attribute__((always_inline)) uint32_t kivi_append_v32(unsigned char *sb, const kivi_layout *lay,
                                                                      int cg, int t, const uint16_t *x, int bf,
                                                                      int clip, int e2[2]) {
  const int G = lay->G;
  uint16_t *sz = kivi_vscales_at(sb, lay, t);
  uint32_t *vc = kivi_vcodes_at(sb, lay, t);
  uint32_t bad;
#define KIVI_V32(b, gg, keep) kivi_v32_item(vc, sz, b, gg, keep, cg, x, bf, clip)
  switch (lay->vb) {
  case 2: bad = G == KIVI_QBLK ? KIVI_V32(2, KIVI_QBLK, 1) : KIVI_V32(2, G, 0); break;
  case 4: bad = G == KIVI_QBLK ? KIVI_V32(4, KIVI_QBLK, 1) : KIVI_V32(4, G, 0); break;
  case 8: bad = G == KIVI_QBLK ? KIVI_V32(8, KIVI_QBLK, 1) : KIVI_V32(8, G, 0); break;
  default: return KIVI_V32(16, G, 0);
  }
#undef KIVI_V32
  kivi_vexp_fold(e2, sz + 2 * cg);
  return bad;
}

/* Element j of an input array of type dt, as fp16 (NaN/Inf/out of range become Inf or NaN). */
static inline uint16_t kivi_in_f16(const void *src, int64_t j, int dt) {
  if (dt == KIVI_F32) return kivi_f32_to_f16(((const float *)src)[j]);
  if (dt == KIVI_BF16) return kivi_bf16_to_f16(((const uint16_t *)src)[j]);
  return ((const uint16_t *)src)[j];
}

typedef struct kivi_f32x4 {
  float v[4];
} __attribute__((aligned(16))) kivi_f32x4;

/* Elements j..j+7 (j a multiple of 8) of an input array of type dt as fp16, stored at out
 * (16-byte aligned); nonzero if one is not finite.  vec: src is 16-byte aligned, so the
 * values are read 16 bytes at a time. */
static inline int kivi_in_f16x8(const void *src, int64_t j, int dt, int vec, uint16_t *out) {
  kivi_f16x8 h;
  if (vec && dt == KIVI_F32) {
    const kivi_f32x4 a = ((const kivi_f32x4 *)src)[j / 4], b = ((const kivi_f32x4 *)src)[j / 4 + 1];
    for (int e = 0; e < 4; ++e) {
      h.v[e] = kivi_f32_to_f16(a.v[e]);
      h.v[4 + e] = kivi_f32_to_f16(b.v[e]);
    }
  } else if (vec) {
    h = kivi_ld8((const uint16_t *)src + j);
    if (dt == KIVI_BF16)
      for (int e = 0; e < 8; ++e) h.v[e] = kivi_bf16_to_f16(h.v[e]);
  } else {
    for (int e = 0; e < 8; ++e) h.v[e] = kivi_in_f16(src, j + e, dt);
  }
  int bad = 0;
  for (int e = 0; e < 8; ++e) bad |= !kivi_f16_finite(h.v[e]);
  *(kivi_f16x8 *)out = h;
  return bad;
}

/* Index i of the sequence whose prefix range [pre[i], pre[i+1]) holds item x (n sequences). */
static inline int kivi_find_seq(const int64_t *pre, int n, int64_t x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pre[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}
#pragma omp end declare target

#endif
