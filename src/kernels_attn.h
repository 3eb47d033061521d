/* Attention bodies shared by the GPU and host launchers (attention.c): the logit of one cached
 * or new token against one query head, and one dequantized value element.  Token position t
 * of a sequence with Lc cached tokens: t < Lk quantized key, t < Lc fp16 residual key, else the
 * (t - Lc)-th new token given in fp32 (extend).  Values split at Lv = max(0, Lc - R) instead. */
#ifndef KIVI_KERNELS_ATTN_H
#define KIVI_KERNELS_ATTN_H

#include <stdint.h>

#include "half.h"

#pragma omp declare target
/* q . k_t over D channels; q is already multiplied by softmax_scale * log2(e). */
static inline float kivi_attn_k_dot(const unsigned char *pool, const int32_t *btrow,
                                    const uint16_t *kring, const float *knew, int64_t t,
                                    int64_t Lk, int64_t Lc, int R, int G, int D, int H, int kvh,
                                    size_t sub, size_t ksz_off, int kb, int kw, const float *q) {
  float acc = 0.0f;
  if (t < Lk) {
    const unsigned char *sb = pool + ((size_t)btrow[t / R] * H + kvh) * sub;
    const int tr = (int)(t % R);
    const uint32_t *row = (const uint32_t *)sb + (size_t)tr * kw;
    if (kb == 16) {
      for (int w = 0; w < kw; ++w) {
        const uint32_t u = row[w];
        acc += q[2 * w] * kivi_f16_to_f32((uint16_t)(u & 0xffffu)) + q[2 * w + 1] * kivi_f16_to_f32((uint16_t)(u >> 16));
      }
      return acc;
    }
    const uint16_t *sc = (const uint16_t *)(sb + ksz_off) + (size_t)(tr / G) * 2 * D, *zr = sc + D;
    const int cpw = 32 / kb;
    const uint32_t mask = (1u << kb) - 1u;
    for (int w = 0; w < kw; ++w) {
      const uint32_t u = row[w];
      for (int j = 0; j < cpw; ++j) {
        const int d = w * cpw + j;
        const float code = (float)((u >> (kb * j)) & mask);
        acc += q[d] * (code * kivi_f16_to_f32(sc[d]) + kivi_f16_to_f32(zr[d]));
      }
    }
    return acc;
  }
  if (t < Lc) {
    const uint16_t *x = kring + (size_t)(t % R) * D;
    for (int d = 0; d < D; ++d) acc += q[d] * kivi_f16_to_f32(x[d]);
    return acc;
  }
  const float *x = knew + (size_t)(t - Lc) * H * D;
  for (int d = 0; d < D; ++d) acc += q[d] * x[d];
  return acc;
}

/* Dequantized value of channel d of token t. */
static inline float kivi_attn_v_val(const unsigned char *pool, const int32_t *btrow,
                                    const uint16_t *vring, const float *vnew, int64_t t,
                                    int64_t Lv, int64_t Lc, int R, int G, int D, int H, int kvh,
                                    size_t sub, size_t vcode_off, size_t vsz_off, int vb, int vw, int d) {
  if (t < Lv) {
    const unsigned char *sb = pool + ((size_t)btrow[t / R] * H + kvh) * sub;
    const int tr = (int)(t % R);
    const uint32_t *row = (const uint32_t *)(sb + vcode_off) + (size_t)tr * vw;
    if (vb == 16) {
      const uint32_t u = row[d / 2];
      return kivi_f16_to_f32((uint16_t)((d & 1) ? u >> 16 : u & 0xffffu));
    }
    const int cpw = 32 / vb;
    const float code = (float)((row[d / cpw] >> (vb * (d % cpw))) & ((1u << vb) - 1u));
    const uint16_t *sz = (const uint16_t *)(sb + vsz_off) + (size_t)tr * 2 * (D / G) + 2 * (d / G);
    return code * kivi_f16_to_f32(sz[0]) + kivi_f16_to_f32(sz[1]);
  }
  if (t < Lc) return kivi_f16_to_f32(vring[(size_t)(t % R) * D + d]);
  return vnew[(size_t)(t - Lc) * H * D + d];
}
#pragma omp end declare target

#endif
