/* The GPU kernels' device helpers (attention_gpu.c, append_gpu.c) on the emulator of the test
 * library (simt_emu.h): the f16x2 instructions rounded as the PTX ISA says (round to nearest
 * even, subnormals kept), byte permutes, and the warp's collectives through kivi_simt_warp.
 * Included in place of the PTX versions where KIVI_SIMT_EMU is defined. */
#ifndef KIVI_SIMT_FK_H
#define KIVI_SIMT_FK_H

#include <math.h>
#include <string.h>

#include "simt_emu.h"

static inline float simt_fk_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t simt_fk_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline uint32_t simt_pack(double lo, double hi) { return kivi_simt_d2h(lo) | kivi_simt_d2h(hi) << 16; }
#define SIMT_LO(w) kivi_simt_h2d((w) & 0xffffu)
#define SIMT_HI(w) kivi_simt_h2d((w) >> 16)

static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  return simt_pack(fma(SIMT_LO(a), SIMT_LO(b), SIMT_LO(c)), fma(SIMT_HI(a), SIMT_HI(b), SIMT_HI(c)));
}
static inline uint32_t hmul2(uint32_t a, uint32_t b) { return simt_pack(SIMT_LO(a) * SIMT_LO(b), SIMT_HI(a) * SIMT_HI(b)); }
static inline uint32_t hadd2(uint32_t a, uint32_t b) { return simt_pack(SIMT_LO(a) + SIMT_LO(b), SIMT_HI(a) + SIMT_HI(b)); }
static inline uint32_t hfms2(uint32_t a, uint32_t b, uint32_t c) {
  return simt_pack(fma(SIMT_LO(a), SIMT_LO(b), -SIMT_LO(c)), fma(SIMT_HI(a), SIMT_HI(b), -SIMT_HI(c)));
}
/* max.f16x2: the larger half of each pair (the other one where a half is NaN) */
/* prmt.b32 (default mode): byte i of d is byte s_i & 7 of {b, a}, or its sign bit spread where s_i & 8 */
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  const uint64_t x = (uint64_t)b << 32 | a;
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned sel = s >> 4 * i & 15u;
    uint32_t byte = (uint32_t)(x >> 8 * (sel & 7u)) & 0xffu;
    if (sel & 8u) byte = byte & 0x80u ? 0xffu : 0u;
    d |= byte << 8 * i;
  }
  return d;
}
static inline void h2f(uint32_t a, float *lo, float *hi) {
  *lo = (float)SIMT_LO(a);
  *hi = (float)SIMT_HI(a);
}
static inline uint32_t f2h2(float lo, float hi) { return simt_pack(lo, hi); }
static inline void simt_mma(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                            const char *file, int line) {
  const uint32_t in[10] = {a0, a1, a2, a3, b0, b1, simt_fk_u(d[0]), simt_fk_u(d[1]), simt_fk_u(d[2]), simt_fk_u(d[3])};
  const uint32_t *o = kivi_simt_warp(KIVI_SIMT_MMA, in, 10, file, line);
  for (int i = 0; i < 4; ++i) d[i] = simt_fk_f(o[i]);
}
#define mma16816(d, a0, a1, a2, a3, b0, b1) simt_mma(d, a0, a1, a2, a3, b0, b1, __FILE__, __LINE__)
static inline __attribute__((unused)) uint32_t fk_saddr(const void *p) {
  return (uint32_t)((uintptr_t)p - (uintptr_t)kivi_simt_shared_base);
}
static inline __attribute__((unused)) void fk_cp16s(uint32_t a, const void *src) {
  memcpy(kivi_simt_shared_base + (int32_t)a, src, 16);
}
static inline __attribute__((unused)) void fk_cp16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline __attribute__((unused)) void fk_cp_commit(void) {}
#define fk_cp_wait(n) ((void)(n))
static inline void simt_ldsm(uint32_t *r, const void *p, int op, const char *file, int line) {
  uint32_t in[2];
  const uintptr_t a = (uintptr_t)p;
  memcpy(in, &a, sizeof a);
  const uint32_t *o = kivi_simt_warp(op, in, 2, file, line);
  for (int i = 0; i < 4; ++i) r[i] = o[i];
}
#define fk_ldsm4(r, p) simt_ldsm(r, p, KIVI_SIMT_LDSM, __FILE__, __LINE__)
#define fk_ldsm4s(r, a) simt_ldsm(r, kivi_simt_shared_base + (int32_t)(a), KIVI_SIMT_LDSM, __FILE__, __LINE__)
#define fk_ldsm4t(r, p) simt_ldsm(r, p, KIVI_SIMT_LDSMT, __FILE__, __LINE__)
#define fk_ldsm4ts(r, a) simt_ldsm(r, kivi_simt_shared_base + (int32_t)(a), KIVI_SIMT_LDSMT, __FILE__, __LINE__)
static inline __attribute__((unused)) void fk_pf1(const void *p) { (void)p; }
static inline fk_v4u ld16(const uint32_t *p) { fk_v4u r = {p[0], p[1], p[2], p[3]}; return r; }
static inline fk_v2u ld8(const uint32_t *p) { fk_v2u r = {p[0], p[1]}; return r; }
static inline uint32_t ld4(const uint32_t *p) { return *p; }
static inline uint32_t simt_shfl(uint32_t v, int src) {
  const uint32_t in[2] = {v, (uint32_t)src & 31u};
  return kivi_simt_warp(KIVI_SIMT_SHFL, in, 2, NULL, 0)[0];
}
static inline float shfx(float v, int o) { return simt_fk_f(simt_shfl(simt_fk_u(v), (kivi_simt_tid() & 31) ^ o)); }
static inline float shfi(float v, int l) { return simt_fk_f(simt_shfl(simt_fk_u(v), l)); }
static inline __attribute__((unused)) int shfi_i(int v, int l) { return (int)simt_shfl((uint32_t)v, l); }
static inline uint32_t wmaxu(uint32_t u) { return kivi_simt_warp(KIVI_SIMT_MAXU, &u, 1, NULL, 0)[0]; }
static inline float fk_ex2(float x) { return exp2f(x); }
static inline uint32_t fk_ballot(int pred) {
  const uint32_t p = pred != 0;
  return kivi_simt_warp(KIVI_SIMT_BALLOT, &p, 1, NULL, 0)[0];
}
#define fk_sync() kivi_simt_sync(__FILE__, __LINE__)
static inline void fk_wsync(void) {
  const uint32_t z = 0;
  kivi_simt_warp(KIVI_SIMT_BAR, &z, 1, NULL, 0);
}
static inline unsigned fk_arrive_acq_rel(unsigned *p) { return (*p)++; } /* teams run one at a time */
#endif
