/* Quantize-and-pack bodies: one work item each, shared by the GPU and the host launchers
 * (the launchers are the target regions in cache.c).  Semantics: kivi.h, layout: layout.h. */
#ifndef KIVI_KERNELS_QUANT_H
#define KIVI_KERNELS_QUANT_H

#include <math.h>
#include <stdint.h>

#include "half.h"
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

/* The same code with rs = 1 / scale, computed once per group: the product (x - zero) * rs is
 * within 2^-12 of the quotient for x in the group (|quotient| <= 1.5 maxq < 2^9, the 1.5 for
 * subnormal scales), so where y = product + 1/2 is more than KIVI_QUANT_EPS from an integer
 * both give the same code; nearer (rare), the quotient decides.  The codes are those of the
 * division, bit for bit (tests/test_half.c), for a multiplication: an IEEE division is a dozen
 * instructions on the GPU.  The prefill's key kernel uses it (930 -> 700 us for 32k tokens on
 * the H200, PERF.md v16); in the value kernel and the one-kernel append it raised the registers
 * and the time (value kernel 617 -> 770 us, one-kernel append 38 -> 48 us), so they divide. */
#define KIVI_QUANT_EPS (1.0f / 1024.0f)
static inline uint32_t kivi_quant_code_rcp(float x, float scale, float rs, float zero, float maxq) {
  if (!(scale > 0.0f)) return 0u;
  const float d = x - zero;
  float y = d * rs + 0.5f;
  const float fr = y - floorf(y);
  if (fr < KIVI_QUANT_EPS || fr > 1.0f - KIVI_QUANT_EPS) y = d / scale + 0.5f;
  return kivi_code_of(y, maxq);
}

/* Group statistics -> stored fp16 scale and zero. */
static inline void kivi_group_params(float mn, float mx, int bits, uint16_t *hs, uint16_t *hz) {
  *hs = kivi_f32_to_f16((mx - mn) / (float)((1u << bits) - 1u));
  *hz = kivi_f32_to_f16(mn); /* mn is an fp16 value: exact */
}

/* 8 consecutive fp16 values from a 16-byte aligned address, in one load on the GPU. */
typedef struct kivi_f16x8 {
  uint16_t v[8];
} __attribute__((aligned(16))) kivi_f16x8;
static inline kivi_f16x8 kivi_ld8(const uint16_t *p) { return *(const kivi_f16x8 *)p; }

/* The fp16 row (head_dim values) of token position p for one kv-head: positions before L come
 * from the residual ring (slot p mod R), later ones from the staged new tokens. */
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
                                                                    int h, int rcp) {
  if (bits == 16) {
    for (int t = 0; t < G; ++t)
      *(kivi_f16x8 *)(codes + (size_t)t * rb) = kivi_ld8(kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0);
    return;
  }
  const float maxq = (float)((1u << bits) - 1u);
  float mn[8], mx[8], rs[8];
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
    rs[j] = rcp ? 1.0f / mx[j] : 0.0f;
  }
  for (int t = 0; t < G; ++t) {
    const kivi_f16x8 v = kivi_ld8(kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0);
    uint64_t w = 0;
    for (int j = 0; j < 8; ++j) {
      const float f = kivi_f16_to_f32(v.v[j]);
      w |= (uint64_t)(rcp ? kivi_quant_code_rcp(f, mx[j], rs[j], mn[j], maxq) : kivi_quant_code(f, mx[j], mn[j], maxq))
           << (bits * j);
    }
    unsigned char *dst = codes + (size_t)t * rb;
    if (bits == 2) *(uint16_t *)dst = (uint16_t)w;
    else if (bits == 4) *(uint32_t *)dst = (uint32_t)w;
    else *(uint64_t *)dst = w;
  }
}

/* V item: channel group cg (G channels) of one token row x (16-byte aligned).  codes points at
 * the token's code row, sz at the token's {scale, zero} array.  wide: read the group 16 bytes at
 * a time (G is a multiple of 8), else 2 bytes at a time with 8 loads in flight.  On the H200
 * the wide loads made the prefill's value kernel faster (937 -> 616 us for 32k tokens) and the
 * one-kernel append of a decode step slower (17.8 -> 24.8 us), so each takes its own. */
static inline void kivi_quant_v_item(uint32_t *codes, uint16_t *sz, int bits, int G, int cg, const uint16_t *x,
                                     int wide) {
  x += (size_t)cg * G;
  if (bits == 16) {
    uint32_t *w = codes + (size_t)cg * G / 2;
    for (int i = 0; i < G / 2; ++i) w[i] = (uint32_t)x[2 * i] | (uint32_t)x[2 * i + 1] << 16;
    return;
  }
  const int cpw = 32 / bits;
  float mn = INFINITY, mx = -INFINITY;
  if (wide) {
    KIVI_UNROLL4
    for (int c8 = 0; c8 < G; c8 += 8) {
      const kivi_f16x8 v = kivi_ld8(x + c8);
      for (int j = 0; j < 8; ++j) {
        const float f = kivi_f16_to_f32(v.v[j]);
        mn = fminf(mn, f);
        mx = fmaxf(mx, f);
      }
    }
  } else {
    KIVI_UNROLL8
    for (int c = 0; c < G; ++c) {
      const float f = kivi_f16_to_f32(x[c]);
      mn = fminf(mn, f);
      mx = fmaxf(mx, f);
    }
  }
  uint16_t hs, hz;
  kivi_group_params(mn, mx, bits, &hs, &hz);
  sz[2 * cg] = hs;
  sz[2 * cg + 1] = hz;
  const float s = kivi_f16_to_f32(hs), z = kivi_f16_to_f32(hz), maxq = (float)((1u << bits) - 1u);
  uint32_t *w = codes + (size_t)cg * G / cpw, word = 0;
  if (wide) {
    KIVI_UNROLL4
    for (int c8 = 0; c8 < G; c8 += 8) {
      const kivi_f16x8 v = kivi_ld8(x + c8);
      for (int j = 0; j < 8; ++j) {
        const int c = c8 + j;
        word |= kivi_quant_code(kivi_f16_to_f32(v.v[j]), s, z, maxq) << (bits * (c % cpw));
        if (c % cpw == cpw - 1) {
          w[c / cpw] = word;
          word = 0;
        }
      }
    }
  } else {
    for (int i = 0; i < G / cpw; ++i) {
      word = 0;
      for (int j = 0; j < cpw; ++j) word |= kivi_quant_code(kivi_f16_to_f32(x[i * cpw + j]), s, z, maxq) << (bits * j);
      w[i] = word;
    }
  }
}

/* K item of a completed block: token group g, channels 8 c8 .. 8 c8 + 7 of the kv-head's
 * sub-block sb (the group's first position p0), tokens from the ring (before L) or the stage;
 * rcp: kivi_quant_code_rcp instead of the division (constant at each call). */
static inline __attribute__((always_inline)) void kivi_k_item_bits(unsigned char *sb, const kivi_layout *lay, int g,
                                                                   int c8, int64_t p0, int64_t L, const uint16_t *ring,
                                                                   const uint16_t *stage, int64_t st0, int h, int rcp) {
  const int G = lay->G, D = lay->D, R = lay->R, H = lay->H, c0 = 8 * c8;
  const size_t rb = (size_t)lay->kw * 4; /* bytes per token row of codes */
  unsigned char *codes = sb + (size_t)g * G * rb + (size_t)c0 * lay->kb / 8;
  uint16_t *sc = (uint16_t *)(sb + lay->ksz_off) + (size_t)g * 2 * D + c0;
  switch (lay->kb) { /* constant bits: the per-channel arrays of the item stay in registers */
  case 2: kivi_quant_k_item(codes, rb, sc, sc + D, 2, G, c0, p0, L, ring, R, D, stage, st0, H, h, rcp); break;
  case 4: kivi_quant_k_item(codes, rb, sc, sc + D, 4, G, c0, p0, L, ring, R, D, stage, st0, H, h, rcp); break;
  case 8: kivi_quant_k_item(codes, rb, sc, sc + D, 8, G, c0, p0, L, ring, R, D, stage, st0, H, h, rcp); break;
  default: kivi_quant_k_item(codes, rb, sc, sc + D, 16, G, c0, p0, L, ring, R, D, stage, st0, H, h, rcp); break;
  }
}
/* the one-kernel append's (division) and the prefill key kernel's (reciprocal) */
static inline void kivi_append_k_item(unsigned char *sb, const kivi_layout *lay, int g, int c8, int64_t p0, int64_t L,
                                      const uint16_t *ring, const uint16_t *stage, int64_t st0, int h) {
  kivi_k_item_bits(sb, lay, g, c8, p0, L, ring, stage, st0, h, 0);
}
static inline void kivi_append_k_item_rcp(unsigned char *sb, const kivi_layout *lay, int g, int c8, int64_t p0,
                                          int64_t L, const uint16_t *ring, const uint16_t *stage, int64_t st0, int h) {
  kivi_k_item_bits(sb, lay, g, c8, p0, L, ring, stage, st0, h, 1);
}

/* Exponent bounds of V scales and zeros (the GPU f16x2 kernel's ranges): -14 is no bound (fp16
 * subnormals); e2[0..1] rise to cover the stored {scale, zero} pair sz (none if NULL). */
static inline void kivi_vexp_fold(int e2[2], const uint16_t *sz) {
  if (!sz) return;
  for (int e = 0; e < 2; ++e) {
    const int x = kivi_f16_exp_bound(sz[e]);
    e2[e] = x > e2[e] ? x : e2[e];
  }
}

/* Raises the bounds vexp2[0..1] (global or team memory, shared by other threads) to e2[0..1]
 * atomically; a bound of -14 raises nothing, so it costs no atomic. */
static inline void kivi_vexp_raise(int32_t *vexp2, const int e2[2]) {
  for (int e = 0; e < 2; ++e) {
    const int x = e2[e];
    if (x > -14) {
#pragma omp atomic compare
      if (vexp2[e] < x) { vexp2[e] = x; }
    }
  }
}

/* V item: channel group cg of the token row x that leaves the window, stored at slot t of the
 * kv-head's sub-block sb (wide: see kivi_quant_v_item).  Returns the stored {scale, zero} pair
 * (the caller raises the V exponent bounds with it; unquantized values have none: NULL). */
static inline const uint16_t *kivi_append_v_item(unsigned char *sb, const kivi_layout *lay, int cg, int t,
                                                 const uint16_t *x, int wide) {
  const int G = lay->G, vgrp = lay->D / lay->G;
  uint16_t *sz = (uint16_t *)(sb + lay->vsz_off) + (size_t)t * 2 * vgrp;
  uint32_t *vc = (uint32_t *)(sb + lay->vcode_off) + (size_t)t * lay->vw;
  switch (lay->vb) {
  case 2: kivi_quant_v_item(vc, sz, 2, G, cg, x, wide); break;
  case 4: kivi_quant_v_item(vc, sz, 4, G, cg, x, wide); break;
  case 8: kivi_quant_v_item(vc, sz, 8, G, cg, x, wide); break;
  default: kivi_quant_v_item(vc, sz, 16, G, cg, x, wide); return NULL;
  }
  return sz + 2 * cg;
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
