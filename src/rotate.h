/* The rotation of a rotated cache (kivi_cache_config.rotate, kivi.h): the orthonormal
 * Walsh-Hadamard transform of one head vector, in fp32, in the exact order kivi.h defines
 * (butterflies of span 1, 2, 4, ..., then the scale), the same on the host and on the device. */
#ifndef KIVI_ROTATE_H
#define KIVI_ROTATE_H

#include <math.h>
#include <stdint.h>

#include "half.h"
#include "kivi.h"
#include "layout.h"

#pragma omp declare target
/* element i of an input of dtype t (KIVI_F32, KIVI_F16, KIVI_BF16), exactly, as fp32 */
static inline float kivi_rotate_load(const void *p, int t, int64_t i) {
  if (t == KIVI_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return t == KIVI_F16 ? kivi_f16_to_f32(h) : kivi_bf16_to_f32(h);
}
/* x[0 .. D) in place, D a power of two; norm = kivi_rotate_norm(D) */
static inline void kivi_rotate_vec(float *x, int D, float norm) {
  for (int h = 1; h < D; h *= 2)
    for (int i = 0; i < D; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  for (int i = 0; i < D; ++i) x[i] *= norm;
}
/* head vector v of src (dtype st) to dst (KIVI_F32 or KIVI_F16, dt): W x (rotate) or x; read
 * whole before it is written, so src == dst (same type) is allowed */
static inline void kivi_rotate_one(const void *src, int st, void *dst, int dt, int64_t v, int D, float norm,
                                   int rotate) {
  float x[KIVI_MAX_HEAD_DIM];
  for (int i = 0; i < D; ++i) x[i] = kivi_rotate_load(src, st, v * D + i);
  if (rotate) kivi_rotate_vec(x, D, norm);
  if (dt == KIVI_F32)
    for (int i = 0; i < D; ++i) ((float *)dst)[v * D + i] = x[i];
  else
    for (int i = 0; i < D; ++i) ((uint16_t *)dst)[v * D + i] = kivi_f32_to_f16(x[i]);
}
#pragma omp end declare target

/* The scale 1 / sqrt(D) as kivi.h defines it, computed on the host (IEEE sqrtf and division). */
static inline float kivi_rotate_norm(int D) { return 1.0f / sqrtf((float)D); }

#endif
