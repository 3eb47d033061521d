/* Rotated caches (kivi_cache_config.rotate): the rotation of head vectors on the cache's device,
 * for the appends (rotated fp16 copies of the keys and values), the attention calls (rotated
 * queries) and their outputs (rotated back): on a GPU the warp-per-vector kernel of
 * attention_gpu.c (one launch, which the stream route puts on its stream), elsewhere the
 * portable region below; either enqueued on the call's lane like the call's other regions
 * (region_twice.inc). */
#include "config.h"

#include <stdint.h>

#include "half.h"
#include "internal.h"
#include "rotate.h"

void kivi_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                      int rotate, int async, int lane) {
  if (nvec <= 0) return;
  if (c->ctx->on_gpu && !kivi_gpu_rotate_rows(c, src, src_t, dst, dst_t, nvec, rotate, async, lane)) return;
  const int D = c->cfg.head_dim, dev = c->ctx->device, st = (int)src_t, dt = (int)dst_t;
  const float norm = kivi_rotate_norm(D);
#define KIVI_REGION_FILE "rotate.inc"
#include "region_twice.inc"
#undef KIVI_REGION_FILE
}

void kivi_rotate_host(const void *src, kivi_dtype src_t, uint16_t *dst, int64_t nvec, int D, int rotate) {
  const float norm = kivi_rotate_norm(D);
  for (int64_t v = 0; v < nvec; ++v) kivi_rotate_one(src, (int)src_t, dst, KIVI_F16, v, D, norm, rotate);
}
