/* Rotated caches (kivi_cache_config.rotate): the rotation of head vectors on the cache's device,
 * for the appends (rotated fp16 copies of the keys and values), the attention calls (rotated
 * queries) and their outputs (rotated back): on a GPU the warp-per-vector kernel of
 * attention_gpu.c (one launch, which the stream route puts on its stream), elsewhere the
 * portable region below (ROTATE_REGION: dst = W src, or src converted where rotate = 0, one head
 * vector an iteration; src == dst of one type is allowed, since an iteration reads its vector
 * whole before it writes it); either enqueued on the call's lane like the call's other regions
 * (KIVI_LAUNCH_TWICE). */
#include "config.h"

#include <stdint.h>

#include "half.h"
#include "internal.h"
#include "rotate.h"

#define ROTATE_REGION(...)                                                                                            \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS is_device_ptr(src, dst)            \
                    firstprivate(D, st, dt, norm, rotate, nvec) __VA_ARGS__)                                          \
  for (int64_t v = 0; v < nvec; ++v) kivi_rotate_one(src, st, dst, dt, v, D, norm, rotate);

void kivi_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                      int rotate, int async, int lane) {
  if (nvec <= 0) return;
  if (c->ctx->on_gpu && !kivi_gpu_rotate_rows(c, src, src_t, dst, dst_t, nvec, rotate, async, lane)) return;
  const int D = c->cfg.head_dim, dev = c->ctx->device, st = (int)src_t, dt = (int)dst_t;
  const float norm = kivi_rotate_norm(D);
  KIVI_LAUNCH_TWICE(ROTATE_REGION);
}

void kivi_rotate_host(const void *src, kivi_dtype src_t, uint16_t *dst, int64_t nvec, int D, int rotate) {
  const float norm = kivi_rotate_norm(D);
  for (int64_t v = 0; v < nvec; ++v) kivi_rotate_one(src, (int)src_t, dst, KIVI_F16, v, D, norm, rotate);
}
