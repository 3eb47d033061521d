/* GPU kernels of the attention calls besides the decode kernels (decode_gqa.c, decode_f16.c) and
 * the new tokens' kernel (extend_gpu.c): the sink tokens' partials (sink_block) and the rotation
 * of head vectors (rotate_block), each launched from a function below.  Which of them a call
 * runs is plan.c's choice. */
#include "config.h"

#include "internal.h"
#include "kernels_attn.h"
#include "plan.h"
#include "rotate.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include <math.h>
#include <omp.h>
#include <ompx.h>
#include <string.h>

#include "gpu_ops.h"

#define KIVI_SINK_CHUNK 4 /* sink tokens whose rows the sink kernel loads together */

/* What a block of the sink kernel needs: the cache's sink rows, the call, the launch's geometry. */
typedef struct sink_args {
  const int64_t *sd;
  const float *q;
  const uint16_t *ksink, *vsink;
  float *part_o, *part_ml;
  int64_t nit, nslots, sslot;
  int rows, HQ, gsz, D, H, NL, ns, layer, col_seq, col_ns;
  float qmul;
} sink_args;
/* What a block of the rotation kernel needs. */
typedef struct rot_args {
  const void *src;
  void *dst;
  int64_t nvec;
  int D, st, dt, rotate;
  float norm;
} rot_args;

#pragma omp declare target
/* The kernel of kivi_gpu_sink_partials: a warp per (row, query head), FNW per block.  Lane l holds channels l E .. l E + E - 1 (E = D / 32)
 * of q and of the output; per sink token the lanes' partial dot products are summed by a
 * butterfly, then the online softmax (base 2, scaled by qmul) as sink_partials_portable
 * (attention.c) computes it on the host, in another order of the dot product's sums.  The key and value rows of
 * KIVI_SINK_CHUNK tokens are loaded before any of them is used, so that their loads are in
 * flight together (one after another they made a chain of dependent round trips: 7-8 us for 4
 * sinks on an H200, 4.6-5.9 us loaded together). */
static inline __attribute__((always_inline)) void sink_block(const sink_args *a) {
  const int tid = ompx_thread_id_x(), lane = tid & 31;
  const int64_t it = (int64_t)ompx_block_id_x() * FNW + (tid >> 5); /* (row, query head) */
  if (it < a->nit) { /* warp-uniform */
    const int64_t r = it / a->HQ;
    const int kvh = (int)(it % a->HQ) / a->gsz, E = a->D >> 5;
    const int64_t s = a->sd[(int64_t)a->col_seq * a->rows + r];
    const int n = (int)a->sd[(int64_t)a->col_ns * a->rows + r];
    const size_t at = (((size_t)s * a->NL + a->layer) * a->H + kvh) * (size_t)a->ns * a->D + (size_t)lane * E;
    float qv[KIVI_MAX_HEAD_DIM / 32], o[KIVI_MAX_HEAD_DIM / 32];
    #pragma unroll
    for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) {
      qv[e] = e < E ? a->q[it * a->D + (int64_t)lane * E + e] : 0.0f;
      o[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int t0 = 0; t0 < n; t0 += KIVI_SINK_CHUNK) {
      uint16_t kk[KIVI_SINK_CHUNK][KIVI_MAX_HEAD_DIM / 32], vv[KIVI_SINK_CHUNK][KIVI_MAX_HEAD_DIM / 32];
      #pragma unroll
      for (int j = 0; j < KIVI_SINK_CHUNK; ++j) {
        const int t = t0 + j < n ? t0 + j : t0; /* past the last token: token t0 again, unused */
        const uint16_t *kr = a->ksink + at + (size_t)t * a->D, *vr = a->vsink + at + (size_t)t * a->D;
        #pragma unroll
        for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) {
          kk[j][e] = e < E ? kr[e] : 0;
          vv[j][e] = e < E ? vr[e] : 0;
        }
      }
      #pragma unroll
      for (int j = 0; j < KIVI_SINK_CHUNK; ++j) {
        if (t0 + j >= n) break; /* warp-uniform */
        float x = 0.0f;
        #pragma unroll
        for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e)
          if (e < E) x += qv[e] * kivi_f16_to_f32(kk[j][e]);
        x = wsum(x) * a->qmul;
        if (x > m) {
          const float w = exp2f(m - x);
          l *= w;
          #pragma unroll
          for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) o[e] *= w;
          m = x;
        }
        const float p = exp2f(x - m);
        l += p;
        #pragma unroll
        for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e)
          if (e < E) o[e] += p * kivi_f16_to_f32(vv[j][e]);
      }
    }
    const size_t sl = (size_t)it * a->nslots + a->sslot;
    #pragma unroll
    for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e)
      if (e < E) a->part_o[sl * a->D + (size_t)lane * E + e] = o[e];
    if (lane == 0) {
      a->part_ml[2 * sl] = m;
      a->part_ml[2 * sl + 1] = l;
    }
  }
}

/* The kernel of kivi_gpu_rotate_rows: dst = W src (rotate) or src converted, a warp per head vector, FNW vectors per block.  Lane l holds the
 * E = D / 32 elements l E .. l E + E - 1: the butterflies of span h < E are within a lane, those of
 * span h = m E (m = 1 .. 16) between lanes l and l ^ m (the lower lane keeps x[j] + x[j + h], the
 * upper x[j] - x[j + h]): kivi.h's operations in kivi.h's order, so the bits of the host's. */
static inline __attribute__((always_inline)) void rotate_block(const rot_args *a) {
  const int tid = ompx_thread_id_x(), lane = tid & 31;
  const int64_t v = (int64_t)ompx_block_id_x() * FNW + (tid >> 5);
  if (v < a->nvec) { /* warp-uniform */
    const int E = a->D >> 5;
    const int64_t i0 = v * a->D + (int64_t)lane * E;
    float x[KIVI_MAX_HEAD_DIM / 32];
    #pragma unroll
    for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) x[e] = e < E ? kivi_rotate_load(a->src, a->st, i0 + e) : 0.0f;
    if (a->rotate) {
      #pragma unroll
      for (int h = 1; h < KIVI_MAX_HEAD_DIM / 32; h *= 2)
        #pragma unroll
        for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e)
          if (h < E && !(e & h)) {
            const float u = x[e], w = x[e + h];
            x[e] = u + w;
            x[e + h] = u - w;
          }
      #pragma unroll
      for (int m = 1; m < 32; m *= 2)
        #pragma unroll
        for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) {
          const float p = shfx(x[e], m);
          x[e] = (lane & m) ? p - x[e] : x[e] + p;
        }
      #pragma unroll
      for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e) x[e] *= a->norm;
    }
    #pragma unroll
    for (int e = 0; e < KIVI_MAX_HEAD_DIM / 32; ++e)
      if (e < E) {
        if (a->dt == KIVI_F32) ((float *)a->dst)[i0 + e] = x[e];
        else ((uint16_t *)a->dst)[i0 + e] = kivi_f32_to_f16(x[e]);
      }
  }
}
#pragma omp end declare target

#define SINK_REGION(...)                                                                                              \
  KIVI_BARE(nblk, FNT, device(dev) map(to : sd[0:ndd]) is_device_ptr(q, ksink, vsink, part_o, part_ml)                \
                firstprivate(nit, rows, HQ, gsz, D, H, NL, ns, layer, qmul, nslots, sslot, col_seq, col_ns) __VA_ARGS__) { \
    const sink_args a_ = {sd, q, ksink, vsink, part_o, part_ml, nit, nslots, sslot, rows, HQ, gsz, D, H, NL, ns,        \
                          layer, col_seq, col_ns, qmul};                                                              \
    sink_block(&a_);                                                                                                  \
  }                                                                                                                   \
  KIVI_REGION_END
#define ROT_REGION(...)                                                                                               \
  KIVI_BARE(nblk, FNT, device(dev) is_device_ptr(src, dst) firstprivate(nvec, D, st, dt, norm, rotate) __VA_ARGS__) {    \
    const rot_args a_ = {src, dst, nvec, D, st, dt, rotate, norm};                                                    \
    rotate_block(&a_);                                                                                                \
  }                                                                                                                   \
  KIVI_REGION_END

int kivi_gpu_sink_partials(kivi_cache *c, int layer, int rows, int HQ, const int64_t *sd, int64_t ndd, int col_seq,
                           int col_ns, const float *q, float qmul, float *part_o, float *part_ml, int64_t nslots,
                           int async, int lane) {
  const uint16_t *ksink = c->ksink, *vsink = c->vsink;
  const int D = c->cfg.head_dim, H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, ns = c->ns, gsz = HQ / H;
  const int dev = c->ctx->device;
  const int64_t nit = (int64_t)rows * HQ, nb = (nit + FNW - 1) / FNW, sslot = nslots - 1;
  if (nb > INT32_MAX) return -1;
  const int nblk = (int)nb;
  KIVI_LAUNCH_TWICE(SINK_REGION);
  return 0;
}

int kivi_gpu_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                         int rotate, int async, int lane) {
  const int D = c->cfg.head_dim, dev = c->ctx->device, st = (int)src_t, dt = (int)dst_t;
  const float norm = kivi_rotate_norm(D);
  const int64_t nb = (nvec + FNW - 1) / FNW;
  if (nb > INT32_MAX) return -1;
  const int nblk = (int)nb;
  KIVI_LAUNCH_TWICE(ROT_REGION);
  return 0;
}

#else /* no offload: never called (plan.c: never eligible) */
int kivi_gpu_sink_partials(kivi_cache *c, int layer, int rows, int HQ, const int64_t *sd, int64_t ndd, int col_seq,
                           int col_ns, const float *q, float qmul, float *part_o, float *part_ml, int64_t nslots,
                           int async, int lane) {
  (void)c; (void)layer; (void)rows; (void)HQ; (void)sd; (void)ndd; (void)col_seq; (void)col_ns; (void)q; (void)qmul;
  (void)part_o; (void)part_ml; (void)nslots; (void)async; (void)lane;
  return -1;
}
int kivi_gpu_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                         int rotate, int async, int lane) {
  (void)c; (void)src; (void)src_t; (void)dst; (void)dst_t; (void)nvec; (void)rotate; (void)async; (void)lane;
  return -1;
}
#endif
