/* Attention bodies shared by the GPU and host launchers (attention.c).
 *
 * Token position t of a row with Lc cached tokens: keys t < Lk are quantized, t < Lc fp16
 * residual, later ones the (t - Lc)-th new fp32 token (extend); values split at Lv instead.
 * `bits` is a compile-time constant in every call (attention.c switches on it), so the loops
 * over the codes of a word unroll.  Up to KIVI_ATT_HC query heads of one kv-head are handled
 * together: each code word is loaded and unpacked once for all of them (GQA). */
#ifndef KIVI_KERNELS_ATTN_H
#define KIVI_KERNELS_ATTN_H

#include <math.h>
#include <stdint.h>

#include "half.h"

#define KIVI_ATT_HC 8 /* query heads per work item (registers per thread grow with it) */

#pragma omp declare target
/* A code (< 2^23) as float without an int->float convert: its bits OR'ed into the mantissa of
 * 2^23, minus 2^23 (exact). */
static inline float kivi_code_f(uint32_t c) { return kivi_bits_f32(c | 0x4b000000u) - 8388608.0f; }

/* Logits of one quantized key row (bits < 16) for nh heads:
 *   out[hh * ostride] = sum_d code_d * qs[hh * qstride + d] + bias[hh * bstride]
 * where qs = q * scale of the token's group (staged) and bias = sum_d q * zero. */
#if defined(__NVPTX__)
static inline void kivi_kdot_codes(const uint32_t *row, int D, const int bits, const float *qs, int qstride,
                                   const float *bias, int bstride, int nh, float *out, int ostride) {
  const int cpw = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  float acc[KIVI_ATT_HC];
  for (int hh = 0; hh < KIVI_ATT_HC; ++hh) acc[hh] = 0.0f;
  for (int w = 0; w < D / cpw; ++w) {
    const uint32_t u = row[w];
    float c[16];
    for (int j = 0; j < cpw; ++j) c[j] = kivi_code_f((u >> (bits * j)) & mask);
    for (int hh = 0; hh < KIVI_ATT_HC; ++hh)
      if (hh < nh) {
        const float *qh = qs + hh * qstride + w * cpw;
        float a = 0.0f; /* a partial sum per word keeps the fp32 error of long rows small */
        for (int j = 0; j < cpw; ++j) a += c[j] * qh[j];
        acc[hh] += a;
      }
  }
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = acc[hh] + bias[hh * bstride];
}

/* Logits of one fp16 key row (unquantized storage or the residual window). */
static inline void kivi_kdot_f16(const uint16_t *x, int D, const float *q, int nh, float *out, int ostride) {
  float acc[KIVI_ATT_HC];
  for (int hh = 0; hh < KIVI_ATT_HC; ++hh) acc[hh] = 0.0f;
  for (int d = 0; d < D; ++d) {
    const float xf = kivi_f16_to_f32(x[d]);
    for (int hh = 0; hh < KIVI_ATT_HC; ++hh)
      if (hh < nh) acc[hh] += q[hh * D + d] * xf;
  }
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = acc[hh];
}

/* Logits of one new fp32 key row (extend). */
static inline void kivi_kdot_f32(const float *x, int D, const float *q, int nh, float *out, int ostride) {
  float acc[KIVI_ATT_HC];
  for (int hh = 0; hh < KIVI_ATT_HC; ++hh) acc[hh] = 0.0f;
  for (int d = 0; d < D; ++d)
    for (int hh = 0; hh < KIVI_ATT_HC; ++hh)
      if (hh < nh) acc[hh] += q[hh * D + d] * x[d];
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = acc[hh];
}

#else
/* Host launcher (one thread per work item): each row is unpacked or converted once into fp32,
 * then dotted with every head's query with 8 partial sums, a loop the compiler vectorizes. */
static inline float kivi_dot8(const float *a, const float *b, int D) { /* D: multiple of 8 */
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int d = 0; d < D; ++d) s += a[d] * b[d];
  return s;
}

static inline void kivi_kdot_codes(const uint32_t *row, int D, const int bits, const float *qs, int qstride,
                                   const float *bias, int bstride, int nh, float *out, int ostride) {
  const int cpw = 32 / bits;
  const uint32_t mask = (1u << bits) - 1u;
  float c[256];
  for (int w = 0; w < D / cpw; ++w)
    for (int j = 0; j < cpw; ++j) c[w * cpw + j] = kivi_code_f((row[w] >> (bits * j)) & mask);
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = kivi_dot8(c, qs + hh * qstride, D) + bias[hh * bstride];
}

static inline void kivi_kdot_f16(const uint16_t *x, int D, const float *q, int nh, float *out, int ostride) {
  float c[256];
  for (int d = 0; d < D; ++d) c[d] = kivi_f16_to_f32(x[d]);
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = kivi_dot8(c, q + hh * D, D);
}

static inline void kivi_kdot_f32(const float *x, int D, const float *q, int nh, float *out, int ostride) {
  for (int hh = 0; hh < nh; ++hh) out[hh * ostride] = kivi_dot8(x, q + hh * D, D);
}

/* Host V phase of one item: o[hh][d] = sum_j p[hh][j] v_j[d] over the split's n tokens, each
 * value row dequantized (j < jq), converted from the fp16 window (j < jr) or new (fp32) once for
 * all heads; partial sums per chunk of 16 tokens keep the fp32 error of long splits small. */
static inline void kivi_vsum_host(const unsigned char *pool, const int32_t *btrow, int H, int kvh, size_t sub,
                                  size_t vcode_off, size_t vsz_off, int R, int D, int G, int vw, int vb,
                                  const uint16_t *vres, size_t ring, const float *vnew, int64_t Lc, int64_t t0,
                                  int n, int jq, int jr, const float *p, int spl, int nh, float *o) {
  float v[256], part[KIVI_ATT_HC * 256];
  const int cpw = vb == 16 ? 2 : 32 / vb;
  const uint32_t mask = vb == 16 ? 0xffffu : (1u << vb) - 1u;
  for (int i = 0; i < nh * D; ++i) o[i] = 0.0f;
  int bi = 0, tr = 0;
  if (n > 0) {
    bi = (int)(t0 / R);
    tr = (int)(t0 % R);
  }
  for (int jc = 0; jc < n; jc += 16) {
    const int je = jc + 16 < n ? jc + 16 : n;
    for (int i = 0; i < nh * D; ++i) part[i] = 0.0f;
    for (int j = jc; j < je; ++j) {
      if (j < jq) {
        const unsigned char *sb = kivi_sub_of(pool, btrow[bi], H, kvh, sub);
        const uint32_t *row = (const uint32_t *)(sb + vcode_off) + (size_t)tr * vw;
        if (vb == 16) {
          for (int d = 0; d < D; ++d) v[d] = kivi_f16_to_f32((uint16_t)(row[d / 2] >> (16 * (d & 1))));
        } else {
          const uint16_t *sz = (const uint16_t *)(sb + vsz_off) + (size_t)tr * 2 * (D / G);
          for (int w = 0; w < vw; ++w)
            for (int k = 0; k < cpw; ++k) v[w * cpw + k] = kivi_code_f((row[w] >> (vb * k)) & mask);
          for (int g = 0; g < D / G; ++g) {
            const float sc = kivi_f16_to_f32(sz[2 * g]), ze = kivi_f16_to_f32(sz[2 * g + 1]);
            for (int d = g * G; d < (g + 1) * G; ++d) v[d] = v[d] * sc + ze;
          }
        }
      } else if (j < jr) {
        const uint16_t *x = vres + ring + (size_t)((t0 + j) % R) * D;
        for (int d = 0; d < D; ++d) v[d] = kivi_f16_to_f32(x[d]);
      } else {
        const float *x = vnew + (size_t)(t0 + j - Lc) * H * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) v[d] = x[d];
      }
      for (int hh = 0; hh < nh; ++hh) {
        const float pj = p[hh * spl + j];
        float *pt = part + hh * D;
#pragma omp simd
        for (int d = 0; d < D; ++d) pt[d] += pj * v[d];
      }
      if (++tr == R) {
        tr = 0;
        ++bi;
      }
    }
    for (int i = 0; i < nh * D; ++i) o[i] += part[i];
  }
}
#endif

/* Weighted sum over quantized value rows of one code word (channels wi*cpw ..): for the lane's
 * tokens j = j0, j0 + step, ... < j1 (position t0 + j):
 *   acc[k] += p_j * code_k * scale,  zacc += p_j * zero   (bits < 16)
 *   acc[k] += p_j * v_k                                    (bits = 16, fp16 pairs) */
static inline void kivi_vacc_codes(const unsigned char *pool, const int32_t *btrow, int H, int kvh, size_t sub,
                                   size_t vcode_off, size_t vsz_off, int R, int D, int G, int vw, const int bits,
                                   int wi, int64_t t0, int j0, int j1, int step, const float *p, float *acc,
                                   float *zacc) {
  const int cpw = bits == 16 ? 2 : 32 / bits;
  const uint32_t mask = bits == 16 ? 0xffffu : (1u << bits) - 1u;
  const int grp = wi * cpw / G;
  /* two-level sums (chunks of 16 of the lane's tokens) keep the fp32 error of long splits small */
  for (int jc = j0; jc < j1; jc += 16 * step) {
    const int je = jc + 16 * step < j1 ? jc + 16 * step : j1;
    float a[16], z = 0.0f;
    for (int k = 0; k < cpw; ++k) a[k] = 0.0f;
    for (int j = jc; j < je; j += step) {
      const int t = (int)t0 + j; /* positions fit in int: 32-bit division */
      const unsigned char *sb = kivi_sub_of(pool, btrow[t / R], H, kvh, sub);
      const int tr = t % R;
      const uint32_t u = ((const uint32_t *)(sb + vcode_off))[(size_t)tr * vw + wi];
      const float pj = p[j];
      if (bits == 16) {
        a[0] += pj * kivi_f16_to_f32((uint16_t)(u & 0xffffu));
        a[1] += pj * kivi_f16_to_f32((uint16_t)(u >> 16));
      } else {
        const uint16_t *sz = (const uint16_t *)(sb + vsz_off) + (size_t)tr * 2 * (D / G) + 2 * grp;
        const float ps = pj * kivi_f16_to_f32(sz[0]);
        z += pj * kivi_f16_to_f32(sz[1]);
        for (int k = 0; k < cpw; ++k) a[k] += ps * kivi_code_f((u >> (bits * k)) & mask);
      }
    }
    for (int k = 0; k < cpw; ++k) acc[k] += a[k];
    *zacc += z;
  }
}

/* Element i of an attention output, fp32 or fp16. */
static inline void kivi_store_out(void *out, int out_f16, int64_t i, float o) {
  if (out_f16) ((uint16_t *)out)[i] = kivi_f32_to_f16(o);
  else ((float *)out)[i] = o;
}
/* The split combine of both attention kernels.  Element i of the output ([rows][HQ][D]):
 *   out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s
 * over the nslots partials of its (row, head); empty splits (l = 0) count for nothing. */
static inline void kivi_combine_item(int64_t i, int D, int64_t nslots, const float *part_o, const float *part_ml,
                                     void *out, int out_f16, float *lse) {
  const int64_t rh = i / D;
  const int d = (int)(i % D);
  const float *ml = part_ml + (size_t)rh * nslots * 2;
  float M = -INFINITY;
  for (int64_t s = 0; s < nslots; ++s) M = fmaxf(M, ml[2 * s]);
  float num = 0.0f, den = 0.0f;
  for (int64_t s = 0; s < nslots; ++s)
    if (ml[2 * s + 1] > 0.0f) {
      const float w = exp2f(ml[2 * s] - M);
      num += w * part_o[((size_t)rh * nslots + s) * D + d];
      den += w * ml[2 * s + 1];
    }
  kivi_store_out(out, out_f16, i, num / den);
  if (lse && d == 0) lse[rh] = (M + log2f(den)) * 0.6931471805599453f;
}
#pragma omp end declare target

#endif
