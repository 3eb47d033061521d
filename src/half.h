/* fp16 / bf16 <-> fp32 conversions on raw bits, identical on the host and in device code.
 * Written with integer operations only, so the rounding (IEEE round to nearest even, subnormals
 * kept) never depends on the compiler, the target or F16C.  The tests check them against the
 * compiler's own _Float16 conversion. */
#ifndef KIVI_HALF_H
#define KIVI_HALF_H

#include <stdint.h>
#include <string.h>

#pragma omp declare target
static inline uint32_t kivi_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float kivi_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#if defined(__NVPTX__)
/* Device pass: the hardware conversions (cvt.f32.f16, cvt.rn.f16.f32) give the same bits as the
 * integer versions below for every finite value (tests compare GPU and host caches byte for
 * byte); only NaN payloads may differ, and NaN input is rejected anyway. */
static inline float kivi_f16_to_f32(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t kivi_f32_to_f16(float f) { const _Float16 x = (_Float16)f; uint16_t h; memcpy(&h, &x, 2); return h; }
#else
static inline float kivi_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
    const float f = (float)man * 5.9604644775390625e-8f;
    return kivi_bits_f32(kivi_f32_bits(f) | sign);
  }
  if (exp == 31) return kivi_bits_f32(sign | 0x7f800000u | (man << 13));
  return kivi_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t kivi_f32_to_f16(float f) {
  const uint32_t x = kivi_f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to Inf */
  if (ax < 0x38800000u) {                                   /* result subnormal or zero */
    if (ax < 0x33000000u) return (uint16_t)sign;            /* < 2^-25: rounds to 0 */
    const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; /* 14..24 */
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  const uint32_t r = ax - 0x38000000u; /* rebias 127 -> 15 */
  uint32_t res = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (res & 1u))) ++res;
  return (uint16_t)(sign | res);
}
#endif

static inline float kivi_bf16_to_f32(uint16_t b) { return kivi_bits_f32((uint32_t)b << 16); }
/* A bf16 value rounded to fp16 (out of range: Inf). */
static inline uint16_t kivi_bf16_to_f16(uint16_t b) { return kivi_f32_to_f16(kivi_bf16_to_f32(b)); }

/* The smallest e with 2^e > |h| for a finite fp16 value h (subnormals: -14). */
static inline int kivi_f16_exp_bound(uint16_t h) {
  const int E = (h >> 10) & 0x1f;
  return E == 0 ? -14 : E - 14;
}

/* Whether an fp32 value (given by its bits) rounds to a finite fp16: |x| < 65520, not NaN
 * (kivi_f16_finite(kivi_f32_to_f16(x)) without the conversion). */
static inline int kivi_f32_bits_fit_f16(uint32_t x) { return (x & 0x7fffffffu) < 0x477ff000u; }

/* Finite fp16 (not Inf or NaN). */
static inline int kivi_f16_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }
#pragma omp end declare target

#endif
