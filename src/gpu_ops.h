/* The GPU instruction layer of the bare kernels: the PTX of each instruction the kernels use
 * (f16x2 arithmetic, mma.sync, ldmatrix, cp.async, shuffles, votes), the test library's
 * emulated twins (tests/simt, KIVI_SIMT_EMU) and host stubs, and the device helpers the decode
 * kernels share (block addressing, V scaling, the arrival and the combine).  Included by the
 * files that hold bare kernels, inside their KIVI_HAVE_OFFLOAD && __clang__ part.  The host
 * pass must see the same region bodies as the device pass, hence the stubs of the same
 * signatures: a bare region never runs on the host. */
#ifndef KIVI_GPU_OPS_H
#define KIVI_GPU_OPS_H

#include <math.h>
#include <omp.h>
#include <ompx.h>
#include <string.h>

#include "internal.h"
#include "kernels_attn.h"

#define FNT 128 /* threads per block */
#define FNW 4   /* warps per block */

#pragma omp declare target
static inline float fk_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fk_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fk_p2(int n) { return fk_f((uint32_t)(n + 127) << 23); }
static inline int fk_ceil_exp(float x) { return (int)((fk_u(x) >> 23) & 255) - 126; } /* 2^e > x > 0 */
typedef unsigned fk_v4u __attribute__((ext_vector_type(4)));
typedef float fk_v4f __attribute__((ext_vector_type(4)));
typedef unsigned fk_v2u __attribute__((ext_vector_type(2)));
typedef unsigned fk_v2u_a __attribute__((ext_vector_type(2), may_alias));
#if defined(__NVPTX__)
static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  __asm__("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
static inline uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static inline uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
/* a b - c rounded once (exact where c = a b rounded: the product's error) */
static inline uint32_t hfms2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  __asm__("{.reg .b32 n; neg.f16x2 n, %3; fma.rn.f16x2 %0, %1, %2, n;}" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  __asm__("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}
static inline void h2f(uint32_t a, float *lo, float *hi) {
  float x, y;
  __asm__("{.reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}" : "=f"(x), "=f"(y) : "r"(a));
  *lo = x;
  *hi = y;
}
static inline uint32_t f2h2(float lo, float hi) {
  uint32_t d;
  __asm__("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
/* d += A B on the tensor cores (m16n8k16, f16 operands, fp32 accumulators).  With g = lane / 4
 * and t = lane % 4, the PTX ISA's fragments are: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
 * a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
 * d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]} (lower index in the low half).  The whole
 * warp must execute it (warp-uniform control flow only). */
static inline void mma16816(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  __asm__ volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                   "{%0, %1, %2, %3};"
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* An asynchronous 16-byte copy from global to shared memory (sm_80 cp.async, L2 only), and its
 * groups: commit closes the thread's copies issued since the last commit into a group; wait
 * returns when at most n of the thread's groups are still in flight (n a constant).  The data
 * are visible to the copying thread after the wait, to the other lanes after a warp barrier. */
/* the 32-bit shared-memory address of a generic pointer p into shared memory */
static inline __attribute__((unused)) uint32_t fk_saddr(const void *p) {
  uint32_t a;
  __asm__("{.reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t;}" : "=r"(a) : "l"(p));
  return a;
}
/* the copy to the shared-memory address a (fk_saddr), and to the generic pointer dst */
static inline __attribute__((unused)) void fk_cp16s(uint32_t a, const void *src) {
  __asm__ volatile("cp.async.cg.shared.global [%0], [%1], 16;" : : "r"(a), "l"(src) : "memory");
}
static inline __attribute__((unused)) void fk_cp16(void *dst, const void *src) { fk_cp16s(fk_saddr(dst), src); }
static inline __attribute__((unused)) void fk_cp_commit(void) { __asm__ volatile("cp.async.commit_group;" : : : "memory"); }
#define fk_cp_wait(n) __asm__ volatile("cp.async.wait_group %0;" : : "n"(n) : "memory")
/* Four 8 x 8 matrices of 16-bit elements from shared memory (ldmatrix, sm_75+): lane l gives the
 * address p of row l % 8 of matrix l / 8 (16 bytes), and r[i] receives matrix i's fragment, lane
 * (g, t) its row g, elements 2 t and 2 t + 1 (fk_ldsm4t: of the transposed matrix, that is rows
 * 2 t and 2 t + 1 of column g).  Whole warp; after the copies' wait and a warp barrier. */
static inline __attribute__((unused)) void fk_ldsm4(uint32_t *r, const void *p) {
  __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fk_saddr(p)) : "memory");
}
/* the same from the 32-bit shared-memory address a (fk_saddr) */
static inline __attribute__((unused)) void fk_ldsm4s(uint32_t *r, uint32_t a) {
  __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
static inline __attribute__((unused)) void fk_ldsm4t(uint32_t *r, const void *p) {
  __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fk_saddr(p)) : "memory");
}
static inline __attribute__((unused)) void fk_ldsm4ts(uint32_t *r, uint32_t a) {
  __asm__ volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
/* a hint: the 128-byte line holding p into L1 (no register waits for it) */
static inline __attribute__((unused)) void fk_pf1(const void *p) { __asm__ volatile("prefetch.L1 [%0];" : : "l"(p)); }
static inline fk_v4u ld16(const uint32_t *p) { return __nvvm_ldg_ui4((const fk_v4u *)p); }
static inline fk_v2u ld8(const uint32_t *p) { return __nvvm_ldg_ui2((const fk_v2u *)p); }
static inline uint32_t ld4(const uint32_t *p) { return __nvvm_ldg_ui(p); }
static inline float shfx(float v, int o) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f); }
static inline float shfi(float v, int l) { return __nvvm_shfl_sync_idx_f32(0xffffffffu, v, l, 0x1f); }
static inline __attribute__((unused)) int shfi_i(int v, int l) { return __nvvm_shfl_sync_idx_i32(0xffffffffu, v, l, 0x1f); }
/* the warp's maximum of u, one instruction (sm_80+); of floats >= 0 (their bits), it is fmaxf's */
static inline uint32_t wmaxu(uint32_t u) {
  uint32_t d;
  __asm__ volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(d) : "r"(u));
  return d;
}
/* 2^x for the softmax (x <= 0): a result below 2^-126, 2^-126 of the largest term, counts as 0 */
static inline float fk_ex2(float x) { return __nvvm_ex2_approx_ftz_f(x); }
static inline uint32_t fk_ballot(int pred) { return __nvvm_vote_ballot_sync(0xffffffffu, pred); }
static inline void fk_sync(void) { __syncthreads(); }
static inline void fk_wsync(void) { __nvvm_bar_warp_sync(0xffffffffu); }
/* one thread's arrival for its block, after a barrier that follows the block's writes: the
 * acq_rel fences release those writes (cumulative through the barrier) and acquire the earlier
 * arrivals' (passed on to the block by the barrier after it), as a grid barrier does */
static inline unsigned fk_arrive_acq_rel(unsigned *p) {
  unsigned old;
  __asm__ volatile("fence.acq_rel.gpu;\n\tatom.relaxed.gpu.add.u32 %0, [%1], 1;\n\tfence.acq_rel.gpu;"
                   : "=r"(old) : "l"(p) : "memory");
  return old;
}
#elif defined(KIVI_SIMT_EMU) /* the test library's emulated GPU (tests/simt) */
#include "simt_fk.h"
#else
/* Host stubs: the host pass must see the same region body (same captures) as the device pass;
 * a bare region never runs on the host (the launcher only calls it for a GPU context). */
static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) { return a ^ b ^ c; }
static inline uint32_t hmul2(uint32_t a, uint32_t b) { return a ^ b; }
static inline uint32_t hadd2(uint32_t a, uint32_t b) { return a ^ b; }
static inline uint32_t hfms2(uint32_t a, uint32_t b, uint32_t c) { return a ^ b ^ c; }
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) { return a ^ b ^ s; }
static inline void h2f(uint32_t a, float *lo, float *hi) { *lo = (float)(a & 0xffff); *hi = (float)(a >> 16); }
static inline uint32_t f2h2(float lo, float hi) { return (uint32_t)lo ^ (uint32_t)hi; }
static inline void mma16816(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  d[0] += (float)(a0 ^ b0); d[1] += (float)(a1 ^ b1); d[2] += (float)(a2 ^ b0); d[3] += (float)(a3 ^ b1);
}
static inline __attribute__((unused)) void fk_cp16(void *dst, const void *src) { memcpy(dst, src, 16); }
static inline __attribute__((unused)) uint32_t fk_saddr(const void *p) { return (uint32_t)(uintptr_t)p; }
static inline __attribute__((unused)) void fk_cp16s(uint32_t a, const void *src) { (void)a; (void)src; }
static inline __attribute__((unused)) void fk_cp_commit(void) {}
#define fk_cp_wait(n) ((void)(n))
static inline __attribute__((unused)) void fk_ldsm4(uint32_t *r, const void *p) {
  memcpy(r, p, 16);
}
static inline __attribute__((unused)) void fk_ldsm4s(uint32_t *r, uint32_t a) {
  (void)r;
  (void)a;
}
static inline __attribute__((unused)) void fk_ldsm4t(uint32_t *r, const void *p) {
  memcpy(r, p, 16);
}
static inline __attribute__((unused)) void fk_ldsm4ts(uint32_t *r, uint32_t a) {
  (void)r;
  (void)a;
}
static inline __attribute__((unused)) void fk_pf1(const void *p) { (void)p; }
static inline fk_v4u ld16(const uint32_t *p) { fk_v4u r = {p[0], p[1], p[2], p[3]}; return r; }
static inline fk_v2u ld8(const uint32_t *p) { fk_v2u r = {p[0], p[1]}; return r; }
static inline uint32_t ld4(const uint32_t *p) { return *p; }
static inline float shfx(float v, int o) { (void)o; return v; }
static inline float shfi(float v, int l) { (void)l; return v; }
static inline __attribute__((unused)) int shfi_i(int v, int l) { (void)l; return v; }
static inline uint32_t wmaxu(uint32_t u) { return u; }
static inline float fk_ex2(float x) { return exp2f(x); }
static inline uint32_t fk_ballot(int pred) { return pred != 0; }
static inline void fk_sync(void) {}
static inline void fk_wsync(void) {}
static inline unsigned fk_arrive_acq_rel(unsigned *p) { return (*p)++; }
#endif
/* the value-code words of a lane's channel group: 2 (2-bit, 8 bytes) or 4 (4-bit, 16 bytes) */
static inline void fk_vcodes2(uint32_t *cw, const uint32_t *p) {
  const fk_v2u x = ld8(p);
  cw[0] = x.x;
  cw[1] = x.y;
}
static inline void fk_vcodes4(uint32_t *cw, const uint32_t *p) {
  const fk_v4u x = ld16(p);
  cw[0] = x.x;
  cw[1] = x.y;
  cw[2] = x.z;
  cw[3] = x.w;
}
/* n = 1, 2 or 4 (a constant) consecutive code words with one aligned load */
static inline __attribute__((unused)) void fk_words(uint32_t *w, const uint32_t *p, int n) {
  if (n == 4) {
    const fk_v4u x = ld16(p);
    w[0] = x.x;
    w[1] = x.y;
    w[2] = x.z;
    w[3] = x.w;
  } else if (n == 2) {
    const fk_v2u x = ld8(p);
    w[0] = x.x;
    w[1] = x.y;
  } else {
    w[0] = ld4(p);
  }
}
/* The (block, kv-head) sub-block that holds token t of a row: hb is the kv-head's sub-block of
 * block 0, btrow the row's block table, blocks of 2^lr tokens and bsz bytes (kivi_gpu_fast_eligible:
 * bsz < 2^32, so offsets within a sub-block are 32-bit too) */
static inline const unsigned char *fk_sub_at(const unsigned char *hb, const int32_t *btrow, int t, int lr, uint32_t bsz) {
  return hb + (uint64_t)(uint32_t)kivi_block_index(btrow[t >> lr]) * bsz;
}
static inline float wsum(float v) { for (int o = 16; o; o >>= 1) v += shfx(v, o); return v; }
static inline float wmax(float v) { for (int o = 16; o; o >>= 1) v = fmaxf(v, shfx(v, o)); return v; }
/* One butterfly step over a lane's values lo and hi: the lanes with bit o set keep hi, the
 * others lo, and each adds the value its partner (lane ^ o) gave away: the sum over both lanes
 * of the kept one.  Scalar arguments, not an array: a select between two array elements
 * becomes a load from a selected address and puts the array in local memory. */
static inline float fk_bfly_keep(float lo, float hi, int lane, int o) {
  const int up = (lane & o) != 0;
  const float keep = up ? hi : lo, send = up ? lo : hi;
  return keep + shfx(send, o);
}
/* The warp sums of n = 1, 2 or 4 values per lane (a constant), every lane getting all n in v,
 * as n calls of wsum would give them up to the order of the additions: the first log2 n
 * butterfly steps halve a lane's values (fk_bfly_keep), so that lane l ends with the sum of
 * value l >> (5 - log2 n), and n shuffles hand the sums out.  4 values take 10 shuffles and 6
 * additions, where wsum takes 20 and 20. */
static inline void wsum_all(float *v, int n, int lane) {
  float x = v[0];
  int o = 16, sh = 5;
  if (n == 4) {
    x = fk_bfly_keep(fk_bfly_keep(v[0], v[2], lane, 16), fk_bfly_keep(v[1], v[3], lane, 16), lane, 8);
    o = 4;
    sh = 3;
  } else if (n == 2) {
    x = fk_bfly_keep(v[0], v[1], lane, 16);
    o = 8;
    sh = 4;
  }
  for (; o; o >>= 1) x += shfx(x, o);
  #pragma unroll
  for (int i = 0; i < n; ++i) v[i] = shfi(x, i << sh);
}
/* Block blk of a grid of np (row, head) pairs times nf splits, and a tail block per pair in
 * fused calls: the split blocks of every pair first, then the tail blocks.  Where the grid is a
 * little over a whole number of waves, the blocks left for the last wave are then the short
 * tail blocks (H200: (8, 4k) 66.9 -> 51.0 us, docs/PERFORMANCE.md, round 10). */
static inline void fk_block_of(int blk, int np, int nf, int *sf, int *pair) {
  const int nbig = np * nf;
  *sf = blk < nbig ? blk % nf : nf;
  *pair = blk < nbig ? blk / nf : blk - nbig;
}
/* The tokens [t0, t0 + n) of split sf of a row whose fast part is [0, Lf): keys quantized in the
 * first ngq groups, values in the first nvq tokens.  The tail block (sf == nf, fused calls only)
 * takes [Lf, Lc) (*lc, read only there), whose later keys and values are in the fp16 windows;
 * where kivi_plan_call folds the last split into it, Lf = nf fs and its first tokens are that split's.
 * n <= 0 (block-uniform): the row has fewer fast splits. */
static inline void fk_block_tokens(int sf, int nf, int fs, int Lf, const int64_t *lc, int Rm, int *t0, int *n, int *ngq,
                                   int *nvq) {
  if (sf == nf) {
    const int Lc = (int)*lc, Lk = Lc - (Lc & Rm), Lv = Lc > Rm + 1 ? Lc - Rm - 1 : 0;
    *t0 = Lf;
    *n = Lc - Lf;
    *ngq = (Lk - Lf) / 32;
    *nvq = Lv - Lf;
  } else {
    *t0 = sf * fs;
    *n = Lf - *t0 < fs ? Lf - *t0 : fs; /* a multiple of 32, at most KIVI_FAST_SPLIT */
    *ngq = *n / 32;
    *nvq = *n;
  }
}
/* The exponent bounds {V scale, V zero, K scale, unused} of sequence s's (layer, kv-head) (vexp:
 * a sequence's own, so that its output does not depend on the other sequences of the cache),
 * read at a decode block's start: read after the K phase, as they are used, their load would add
 * one memory latency to every block's path (it waits for the barrier there).  Set by append and
 * import, -14 while the sequence's (layer, kv-head) holds no quantized value or key. */
static inline fk_v4u fk_v_bounds(const int32_t *vexp, int64_t s, int layer, int NL, int H, int kvh) {
  return ld16((const uint32_t *)(vexp + KIVI_VEXP_AT(s, layer, NL, H) + (size_t)kvh * KIVI_XB));
}
/* The arrival of a fused call's block on its counter *p (all threads; the block's partials are
 * written): 1 in every thread of the block that arrives last (last = the count before it), which
 * then sees all the other blocks' partials. */
static inline int fk_block_arrive(unsigned *p, unsigned last, int tid, int *s_last) {
  fk_sync();
  if (tid == 0) *s_last = fk_arrive_acq_rel(p) == last;
  fk_sync();
  return *s_last;
}

/* The power-of-two exponent that brings a largest magnitude m below 2^15 (0 for m = 0, within
 * fp32's exponents: the new tokens of an extend call, extend_gpu.c), and the two f16 parts
 * of a pair of floats (hi = f16(x), lo = f16(x - hi), packed low = x0: 22 bits of each). */
static inline int new_shift(float m) {
  if (!(m > 0.0f)) return 0;
  const int sh = 15 - fk_ceil_exp(m);
  return sh > 120 ? 120 : sh < -120 ? -120 : sh;
}
static inline void fk_hilo(float x0, float x1, uint32_t *hi, uint32_t *lo) {
  float h0, h1;
  *hi = f2h2(x0, x1);
  h2f(*hi, &h0, &h1);
  *lo = f2h2(x0 - h0, x1 - h1);
}
/* The combine of the nslots partials of (row, head) rh (head_dim D <= FNT) by the block that
 * arrived last; thread tid < D writes channel tid.  kivi_combine_item reads the slots one after the other, its part_o
 * load behind a branch on the slot's sum; here all threads compute the slots' weights
 * w = 2^(m - M) (0 where l = 0) at once, FNT slots per round staged in s_w, and the part_o
 * loads carry no branch, so that several are in flight (a slot with l = 0 may hold no o: its
 * value is loaded and dropped).  s_w: FNT floats, s_r: FNW floats of shared memory, free
 * once the block's own partials are written. */
__attribute__((noinline, unused)) static void fk_combine(size_t rh, int tid, int D, int nslots, const float *part_o,
                                                const float *part_ml, void *out, int out_f16, float *s_w, float *s_r) {
  const float *ml = part_ml + rh * nslots * 2, *po = part_o + rh * nslots * D + (tid < D ? tid : 0);
  const int lane = tid & 31, wid = tid >> 5;
  float M = -INFINITY;
  for (int s = tid; s < nslots; s += FNT) M = fmaxf(M, ml[2 * s]);
  fk_sync(); /* the caller's (or the previous call's) reads of s_w and s_r are done */
  M = wmax(M);
  if (lane == 0) s_r[wid] = M;
  fk_sync();
  M = fmaxf(fmaxf(s_r[0], s_r[1]), fmaxf(s_r[2], s_r[3]));
  float num = 0.0f, den = 0.0f;
  for (int c = 0; c < nslots; c += FNT) {
    const int s = c + tid, n = nslots - c < FNT ? nslots - c : FNT;
    float w = 0.0f;
    if (s < nslots) {
      const float l = ml[2 * s + 1];
      w = l > 0.0f ? fk_ex2(ml[2 * s] - M) : 0.0f;
      den = fmaf(w, l, den);
    }
    fk_sync(); /* the previous round's s_w (and the s_r of M) are read */
    s_w[tid] = w;
    fk_sync();
    #pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float o = po[(size_t)(c + j) * D], wj = s_w[j];
      num += wj > 0.0f ? wj * o : 0.0f;
    }
  }
  den = wsum(den);
  fk_sync(); /* s_r of M is read */
  if (lane == 0) s_r[wid] = den;
  fk_sync();
  const float o = num / ((s_r[0] + s_r[1]) + (s_r[2] + s_r[3]));
  if (tid < D) kivi_store_out(out, out_f16, (int64_t)rh * D + tid, o);
}
#pragma omp end declare target

#endif
