/* GPU kernels of the attention calls besides the GQA decode kernel (decode_gqa.c): the fp16
 * cache's decode kernels (attention_f16.inc, attention_f16s.inc), the sink tokens' partials (attention_sink_gpu.inc) and the rotation
 * of head vectors (rotate_gpu.inc), each launched from a function below.  Which of them a call
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

void kivi_gpu_f16_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_lc, int fs, int nf, const float *q, float qmul, float *part_o, float *part_ml,
                         unsigned *cnt, void *out, int out_f16, int async, int lane) {
  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int gsz = HQ / H, chunk = kivi_f16_heads(gsz), nqc = kivi_head_chunks(gsz, chunk);
  const int Rm = R - 1, lr = kivi_log2up(R);
  const uint32_t bsz = (uint32_t)c->lay.block_bytes; /* kivi_gpu_f16_eligible */
  const size_t sub = c->lay.sub_bytes;
  const unsigned vcode_off = (unsigned)c->lay.vcode_off;
  const int dev = c->ctx->device;
  const int nblk = rows * H * nqc * nf;
  if (nblk <= 0) return;
#if KIVI_F16_STREAM /* the streamed kernel, from KIVI_F16_STREAM_GSZ query heads per kv-head (plan.h) */
  if (kivi_f16_streamed(gsz)) {
#define KIVI_REGION_FILE "attention_f16s.inc"
#include "region_d.inc"
#undef KIVI_REGION_FILE
    return;
  }
#endif
#if !KIVI_F16_STREAM || KIVI_F16_STREAM_GSZ > 1 /* the two-phase kernel, only where it can run */
#define KIVI_REGION_FILE "attention_f16.inc"
  if (chunk == 8) {
#define F16_NH 8
#define F16_SPLIT KIVI_F16_SPLIT(8)
#include "region_d.inc"
#undef F16_SPLIT
#undef F16_NH
  } else {
#define F16_NH 4
#define F16_SPLIT KIVI_F16_SPLIT(4)
#include "region_d.inc"
#undef F16_SPLIT
#undef F16_NH
  }
#undef KIVI_REGION_FILE
#endif
}

int kivi_gpu_sink_partials(kivi_cache *c, int layer, int rows, int HQ, const int64_t *sd, int64_t ndd, int col_seq,
                           int col_ns, const float *q, float qmul, float *part_o, float *part_ml, int64_t nslots,
                           int async, int lane) {
  const uint16_t *ksink = c->ksink, *vsink = c->vsink;
  const int D = c->cfg.head_dim, H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, ns = c->ns, gsz = HQ / H;
  const int dev = c->ctx->device;
  const int64_t nit = (int64_t)rows * HQ, nb = (nit + FNW - 1) / FNW, sslot = nslots - 1;
  if (nb > INT32_MAX) return -1;
  const int nblk = (int)nb;
#define KIVI_REGION_FILE "attention_sink_gpu.inc"
#include "region_twice.inc"
#undef KIVI_REGION_FILE
  return 0;
}

int kivi_gpu_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                         int rotate, int async, int lane) {
  const int D = c->cfg.head_dim, dev = c->ctx->device, st = (int)src_t, dt = (int)dst_t;
  const float norm = kivi_rotate_norm(D);
  const int64_t nb = (nvec + FNW - 1) / FNW;
  if (nb > INT32_MAX) return -1;
  const int nblk = (int)nb;
#define KIVI_REGION_FILE "rotate_gpu.inc"
#include "region_twice.inc"
#undef KIVI_REGION_FILE
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
void kivi_gpu_f16_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_lc, int fs, int nf, const float *q, float qmul, float *part_o, float *part_ml,
                         unsigned *cnt, void *out, int out_f16, int async, int lane) {
  (void)c; (void)layer; (void)rows; (void)HQ; (void)dd; (void)ndd; (void)col_seq; (void)col_lc; (void)fs; (void)nf;
  (void)q; (void)qmul; (void)part_o; (void)part_ml; (void)cnt; (void)out; (void)out_f16; (void)async; (void)lane;
}
#endif
