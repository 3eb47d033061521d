/* Quantize-and-pack bodies: one work item each, shared by the GPU and the host launchers
 * (the launchers are the target regions in cache.c).  Semantics: kivi.h, layout: layout.h. */
#ifndef KIVI_KERNELS_QUANT_H
#define KIVI_KERNELS_QUANT_H

#include <math.h>
#include <stdint.h>

#include "half.h"
#include "layout.h"

/* Full unrolling of the per-channel loops of an item (bits is a constant at every call), so
 * the item's per-channel arrays live in registers on the GPU. */
#define KIVI_UNROLL16 _Pragma("GCC unroll 16")
/* Partial unrolling of the loops over a group's G values: 8 loads in flight per thread. */
#define KIVI_UNROLL8 _Pragma("GCC unroll 8")

#pragma omp declare target
/* code = clamp(floor((x - zero) / scale + 1/2), 0, 2^b - 1) with the stored fp16 scale/zero;
 * a zero scale (constant group) gives code 0, which dequantizes to the zero point exactly. */
static inline uint32_t kivi_quant_code(float x, float scale, float zero, float maxq) {
  if (!(scale > 0.0f)) return 0u;
  const float r = floorf((x - zero) / scale + 0.5f);
  return (uint32_t)fminf(fmaxf(r, 0.0f), maxq);
}

/* Group statistics -> stored fp16 scale and zero. */
static inline void kivi_group_params(float mn, float mx, int bits, uint16_t *hs, uint16_t *hz) {
  *hs = kivi_f32_to_f16((mx - mn) / (float)((1u << bits) - 1u));
  *hz = kivi_f32_to_f16(mn); /* mn is an fp16 value: exact */
}

/* The fp16 row (head_dim values) of token position p for one kv-head: positions before L come
 * from the residual ring (slot p mod R), later ones from the staged new tokens. */
static inline const uint16_t *kivi_src_row(int64_t p, int64_t L, const uint16_t *ring, int R, int D,
                                           const uint16_t *stage, int64_t stage_tok, int H, int h) {
  return p < L ? ring + (size_t)((int)p % R) * D /* positions fit in int: 32-bit remainder */
               : stage + ((size_t)(stage_tok + (p - L)) * H + h) * D;
}

/* K item: channels c0..c0+cpw-1 (one code word) of the G tokens starting at position p0.
 * codes points at word c0/cpw of the first token's row (row stride kw words); scale/zero at
 * the group's entries for channel c0.  Token rows are looked up once per token and pass
 * (positions fit in int, so the ring index is a 32-bit remainder). */
static inline __attribute__((always_inline)) void kivi_quant_k_item(uint32_t *codes, int kw, uint16_t *scale, uint16_t *zero,
                                     int bits, int G, int c0, int64_t p0, int64_t L,
                                     const uint16_t *ring, int R, int D,
                                     const uint16_t *stage, int64_t stage_tok, int H, int h) {
  if (bits == 16) { /* unquantized: two fp16 channels per word */
    for (int t = 0; t < G; ++t) {
      const uint16_t *x = kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0;
      codes[(size_t)t * kw] = (uint32_t)x[0] | (uint32_t)x[1] << 16;
    }
    return;
  }
  const int cpw = 32 / bits;
  const float maxq = (float)((1u << bits) - 1u);
  float mn[16], mx[16];
  KIVI_UNROLL16
  for (int j = 0; j < cpw; ++j) { mn[j] = INFINITY; mx[j] = -INFINITY; }
  for (int t = 0; t < G; ++t) {
    const uint16_t *x = kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0;
    KIVI_UNROLL16
    for (int j = 0; j < cpw; ++j) {
      const float f = kivi_f16_to_f32(x[j]);
      mn[j] = fminf(mn[j], f);
      mx[j] = fmaxf(mx[j], f);
    }
  }
  float s[16], z[16];
  KIVI_UNROLL16
  for (int j = 0; j < cpw; ++j) {
    uint16_t hs, hz;
    kivi_group_params(mn[j], mx[j], bits, &hs, &hz);
    scale[j] = hs;
    zero[j] = hz;
    s[j] = kivi_f16_to_f32(hs);
    z[j] = kivi_f16_to_f32(hz);
  }
  for (int t = 0; t < G; ++t) {
    const uint16_t *x = kivi_src_row(p0 + t, L, ring, R, D, stage, stage_tok, H, h) + c0;
    uint32_t w = 0;
    KIVI_UNROLL16
    for (int j = 0; j < cpw; ++j) w |= kivi_quant_code(kivi_f16_to_f32(x[j]), s[j], z[j], maxq) << (bits * j);
    codes[(size_t)t * kw] = w;
  }
}

/* V item: channel group cg (G channels) of one token row x.  codes points at the token's code
 * row, sz at the token's {scale, zero} array. */
static inline void kivi_quant_v_item(uint32_t *codes, uint16_t *sz, int bits, int G, int cg,
                                     const uint16_t *x) {
  x += (size_t)cg * G;
  if (bits == 16) {
    uint32_t *w = codes + (size_t)cg * G / 2;
    for (int i = 0; i < G / 2; ++i) w[i] = (uint32_t)x[2 * i] | (uint32_t)x[2 * i + 1] << 16;
    return;
  }
  const int cpw = 32 / bits;
  float mn = INFINITY, mx = -INFINITY;
  KIVI_UNROLL8
  for (int c = 0; c < G; ++c) {
    const float f = kivi_f16_to_f32(x[c]);
    mn = fminf(mn, f);
    mx = fmaxf(mx, f);
  }
  uint16_t hs, hz;
  kivi_group_params(mn, mx, bits, &hs, &hz);
  sz[2 * cg] = hs;
  sz[2 * cg + 1] = hz;
  const float s = kivi_f16_to_f32(hs), z = kivi_f16_to_f32(hz), maxq = (float)((1u << bits) - 1u);
  uint32_t *w = codes + (size_t)cg * G / cpw;
  for (int i = 0; i < G / cpw; ++i) {
    uint32_t word = 0;
    for (int j = 0; j < cpw; ++j)
      word |= kivi_quant_code(kivi_f16_to_f32(x[i * cpw + j]), s, z, maxq) << (bits * j);
    w[i] = word;
  }
}

/* K item of a completed block: token group g, code word w of the kv-head's sub-block sb (the
 * group's first position p0), tokens from the ring (before L) or the stage. */
static inline void kivi_append_k_item(unsigned char *sb, const kivi_layout *lay, int g, int w, int64_t p0, int64_t L,
                                      const uint16_t *ring, const uint16_t *stage, int64_t st0, int h) {
  const int G = lay->G, D = lay->D, kw = lay->kw, kcpw = lay->kb == 16 ? 2 : 32 / lay->kb;
  uint32_t *codes = (uint32_t *)sb + (size_t)g * G * kw + w;
  uint16_t *sc = (uint16_t *)(sb + lay->ksz_off) + (size_t)g * 2 * D + w * kcpw;
  const int R = lay->R, H = lay->H, c0 = w * kcpw;
  switch (lay->kb) { /* constant bits: the per-channel arrays of the item stay in registers */
  case 2: kivi_quant_k_item(codes, kw, sc, sc + D, 2, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  case 4: kivi_quant_k_item(codes, kw, sc, sc + D, 4, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  case 8: kivi_quant_k_item(codes, kw, sc, sc + D, 8, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  default: kivi_quant_k_item(codes, kw, sc, sc + D, 16, G, c0, p0, L, ring, R, D, stage, st0, H, h); break;
  }
}

/* Raises the exponent bounds vexp2[0..1] of V scales and zeros (the GPU f16x2 kernel's
 * ranges) to cover one stored {scale, zero} pair sz. */
static inline void kivi_vexp_raise(int32_t *vexp2, const uint16_t *sz) {
  for (int e = 0; e < 2; ++e) {
    const int ex = kivi_f16_exp_bound(sz[e]);
    int32_t *dst = vexp2 + e;
#pragma omp atomic compare
    if (*dst < ex) { *dst = ex; }
  }
}

/* V item: channel group cg of the token row x that leaves the window, stored at slot t of the
 * kv-head's sub-block sb; then raises vexp2 (if not NULL) for its {scale, zero}. */
static inline void kivi_append_v_item(unsigned char *sb, const kivi_layout *lay, int cg, int t, const uint16_t *x,
                                      int32_t *vexp2) {
  const int G = lay->G, vgrp = lay->D / lay->G;
  uint16_t *sz = (uint16_t *)(sb + lay->vsz_off) + (size_t)t * 2 * vgrp;
  uint32_t *vc = (uint32_t *)(sb + lay->vcode_off) + (size_t)t * lay->vw;
  switch (lay->vb) {
  case 2: kivi_quant_v_item(vc, sz, 2, G, cg, x); break;
  case 4: kivi_quant_v_item(vc, sz, 4, G, cg, x); break;
  case 8: kivi_quant_v_item(vc, sz, 8, G, cg, x); break;
  default: kivi_quant_v_item(vc, sz, 16, G, cg, x); break;
  }
  if (lay->vb < 16 && vexp2) kivi_vexp_raise(vexp2, sz + 2 * cg);
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
