/* GPU fast path of a larger append's quantization: kernels 2a (keys) and 2b (values) of
 * cache_append.inc as CUDA-like `ompx_bare` kernels, for 2- or 4-bit tensors with head_dim 128
 * and G = 32 read from fp16 rows (a direct fp16 input in device memory, or the stage).  They
 * compute exactly what the portable items of kernels_quant.h compute (the same group
 * statistics, scales, zeros, codes, non-finite marks and V exponent bounds; the GPU suite
 * compares the bytes with a host-made cache), with the work laid out for the GPU:
 *
 *  - keys (append_keys.inc): a warp per (completed block, kv-head, token group), lane = 4
 *    channels: one 8-byte load per token (a warp reads the token's 256-byte row), the group's
 *    32 tokens held in registers between the statistics and the codes;
 *  - values (append_values.inc): a thread per (token, kv-head, 32-channel group): four 16-byte
 *    loads; a warp is 8 consecutive tokens of one kv-head, the next warps the same tokens of the
 *    next kv-heads (so the warps in flight read a contiguous range of the input);
 *  - the statistics as packed fp16 pairs (`min.NaN` / `max.NaN.f16x2`: one instruction per two
 *    values; a NaN or an infinity in the input reaches the minimum or the maximum, which is the
 *    non-finite check);
 *  - the V exponent bounds raised once per warp (a reduction over its lanes), not per item.
 * The generic kernels keep every other case (bf16 input, G > 32, other widths and head_dims). */
#include "config.h"

#include "internal.h"
#include "kernels_quant.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include <omp.h>
#include <ompx.h>

#define QNT 128 /* threads per block */
#define QD 128  /* head_dim */
/* value kernel: channel groups per thread (1, 2 or 4), tokens per warp */
#define QVG 2
#define QVT (8 * QVG)
#define QVTB (QVG == 1 ? 3 : QVG == 2 ? 4 : 5) /* log2 QVT */

#pragma omp declare target
#if defined(__NVPTX__)
/* packed fp16 minimum / maximum; a NaN in either operand gives NaN */
static inline uint32_t qa_min2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("min.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static inline uint32_t qa_max2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
typedef unsigned qa_v2u __attribute__((ext_vector_type(2)));
typedef unsigned qa_v4u __attribute__((ext_vector_type(4)));
static inline kivi_u32x2 qa_ld8(const uint16_t *p) {
  const qa_v2u v = __nvvm_ldg_ui2((const qa_v2u *)p);
  kivi_u32x2 r = {{v.x, v.y}};
  return r;
}
static inline kivi_u32x4 qa_ld16(const uint16_t *p) {
  const qa_v4u v = __nvvm_ldg_ui4((const qa_v4u *)p);
  kivi_u32x4 r = {{v.x, v.y, v.z, v.w}};
  return r;
}
static inline int qa_all(int p) { return __nvvm_vote_all_sync(0xffffffffu, p); }
#elif defined(KIVI_SIMT_EMU) /* the test library's emulated GPU (tests/simt) */
static inline uint32_t qa_h1(uint32_t a, uint32_t b, int mx) { /* min/max.NaN of one f16 */
  const double x = kivi_simt_h2d(a), y = kivi_simt_h2d(b);
  return isnan(x) || isnan(y) ? 0x7fffu : (mx ? x >= y : x <= y) ? a : b;
}
static inline uint32_t qa_min2(uint32_t a, uint32_t b) { return qa_h1(a & 0xffffu, b & 0xffffu, 0) | qa_h1(a >> 16, b >> 16, 0) << 16; }
static inline uint32_t qa_max2(uint32_t a, uint32_t b) { return qa_h1(a & 0xffffu, b & 0xffffu, 1) | qa_h1(a >> 16, b >> 16, 1) << 16; }
static inline kivi_u32x2 qa_ld8(const uint16_t *p) { return *(const kivi_u32x2 *)p; }
static inline kivi_u32x4 qa_ld16(const uint16_t *p) { return *(const kivi_u32x4 *)p; }
static inline int qa_all(int p) {
  const uint32_t v = p != 0;
  return kivi_simt_warp(KIVI_SIMT_BALLOT, &v, 1, NULL, 0)[0] == 0xffffffffu;
}
#else
/* Host stubs: the host pass must see the same region body as the device pass; a bare region
 * never runs on the host (the launcher only calls it for a GPU context). */
static inline uint32_t qa_min2(uint32_t a, uint32_t b) { return a < b ? a : b; }
static inline uint32_t qa_max2(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline kivi_u32x2 qa_ld8(const uint16_t *p) { return *(const kivi_u32x2 *)p; }
static inline kivi_u32x4 qa_ld16(const uint16_t *p) { return *(const kivi_u32x4 *)p; }
static inline int qa_all(int p) { return p; }
#endif
/* Raises the V exponent bounds vb[0..1] (global memory) to e0, e1: nothing is read for two
 * bounds of -14 (none), and an atomic only where a bound read first is lower (bounds only rise;
 * a stale read costs an atomic, never a missed raise).  Each lane its own token's sequence. */
static inline void qa_vexp_lane(int32_t *vb, int e0, int e1) {
  if (e0 <= -14 && e1 <= -14) return;
  const volatile int32_t *cur = vb;
  int e[2] = {e0 > cur[0] ? e0 : -14, e1 > cur[1] ? e1 : -14};
  kivi_vexp_raise(vb, e);
}
#pragma omp end declare target

int kivi_gpu_append_eligible(const kivi_cache *c, int bits, int bf) {
  const kivi_cache_config *f = &c->cfg;
  const int R = f->residual;
  return c->ctx->on_gpu && !bf && (bits == 2 || bits == 4) && f->head_dim == QD && f->group == 32 && (R & (R - 1)) == 0;
}

/* Kernel 2a: the nkb blocks the append completes (descriptor dd of n sequences, device copy),
 * keys from src ([token][H][128] fp16 from each sequence's stage row); a non-finite key sets
 * *flag to call_id.  Skipped if *flag is set.  async: enqueued on the lane's dependences.
 * Returns 0, or -1 (nothing launched) for a call too large for its 32-bit indices. */
int kivi_gpu_append_keys(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nkb, const uint16_t *src,
                          int64_t *flag, int64_t call_id, int async, int lane) {
  unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int lr = kivi_log2up(R), lg = lr - 5, hb = kivi_log2up(H);
  const size_t sub = c->lay.sub_bytes, ksz_off = c->lay.ksz_off;
  const int64_t nw64 = nkb << (lg + hb); /* warps */
  if (nw64 <= 0) return 0;
  if (nw64 >= (int64_t)1 << 29) return -1; /* 32-bit thread indices */
  const unsigned nw = (unsigned)nw64;
  const int nblk = (int)((nw64 + QNT / 32 - 1) / (QNT / 32)), dev = c->ctx->device;
#define KIVI_REGION_FILE "append_keys.inc"
#include "region_bits.inc"
#undef KIVI_REGION_FILE
  return 0;
}

/* Kernel 2b: the nvq values that leave the windows, from src as kivi_gpu_append_keys; raises
 * the bounds vsc [sequence of the call][H][2] to the exponent bounds of the stored {scale,
 * zero} pairs. */
int kivi_gpu_append_values(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nvq, const uint16_t *src,
                            int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *vres = c->vres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int lr = kivi_log2up(R), hb = kivi_log2up(H);
  const size_t sub = c->lay.sub_bytes, vcode_off = c->lay.vcode_off, vsz_off = c->lay.vsz_off;
  const int64_t nt64 = (nvq + QVT - 1) / QVT << (5 + hb); /* threads: tiles x 2^hb kv-heads x a warp */
  if (nt64 <= 0) return 0;
  if (nt64 >= (int64_t)1 << 31) return -1; /* 32-bit thread indices */
  const unsigned nt = (unsigned)nt64, nq = (unsigned)nvq;
  const int nblk = (int)((nt64 + QNT - 1) / QNT), dev = c->ctx->device;
#define KIVI_REGION_FILE "append_values.inc"
#define KIVI_REGION_BITS c->cfg.v_bits
#include "region_bits.inc"
#undef KIVI_REGION_BITS
#undef KIVI_REGION_FILE
  return 0;
}

#else /* no offload: never eligible */
int kivi_gpu_append_eligible(const kivi_cache *c, int bits, int bf) {
  (void)c; (void)bits; (void)bf;
  return 0;
}
int kivi_gpu_append_keys(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nkb, const uint16_t *src,
                          int64_t *flag, int64_t call_id, int async, int lane) {
  (void)c; (void)layer; (void)dd; (void)n; (void)nkb; (void)src; (void)flag; (void)call_id; (void)async; (void)lane;
  return -1;
}
int kivi_gpu_append_values(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nvq, const uint16_t *src,
                            int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  (void)c; (void)layer; (void)dd; (void)n; (void)nvq; (void)src; (void)vsc; (void)flag; (void)call_id; (void)async;
  (void)lane;
  return -1;
}
#endif
