/* Device choice and device memory.  All omp_* calls of the library live here and in the kernel
 * files; the public header has none. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The OpenMP device API: offload builds; not the test library whose GPU is emulated on the host
 * (tests/simt: its "GPU" context has host memory). */
#if KIVI_HAVE_OFFLOAD && !defined(KIVI_SIMT_EMU)
#define KIVI_DEVICE_API 1
#else
#define KIVI_DEVICE_API 0
#endif

#if KIVI_HAVE_OFFLOAD
int kivi_loop_threads = 128; /* internal.h: KIVI_LOOP_TEAMS */
#endif

/* Where a trivial target region really runs (1 = GPU).  -1 if the region could not run. */
static int probe_on_gpu(int device) {
  int on_host = -1;
#pragma omp target device(device) map(from: on_host)
  on_host = omp_is_initial_device();
  return on_host < 0 ? -1 : !on_host;
}

kivi_status kivi_context_create(kivi_context **out, int device) {
  if (!out) return KIVI_ERR_ARG;
  *out = NULL;
  if (device < KIVI_DEVICE_HOST) return KIVI_ERR_ARG;
#if KIVI_DEVICE_API
  const int ndev = omp_get_num_devices(), host = omp_get_initial_device();
  const int def = omp_get_default_device();
#else /* host-only build: never touch the device API (libomptarget may be absent) */
  const int ndev = 0, host = 0, def = 0;
#endif
  int dev;
  if (device == KIVI_DEVICE_HOST) dev = host;
  else if (device == KIVI_DEVICE_DEFAULT) {
    dev = (ndev > 0 && def >= 0 && def < ndev) ? def : host;
  } else if (device < ndev) dev = device;
  else return KIVI_ERR_NO_DEVICE;

  kivi_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return KIVI_ERR_NOMEM;
  ctx->device = dev;
  ctx->num_devices = ndev;
  ctx->on_gpu = 0;
  if (dev != host) {
    const int g = probe_on_gpu(dev);
    if (g != 1) { /* an explicit device that silently ran on the host is an error */
      free(ctx);
      return KIVI_ERR_NO_DEVICE;
    }
    ctx->on_gpu = 1;
  }
#ifdef KIVI_SIMT_EMU
  ctx->on_gpu = device != KIVI_DEVICE_HOST; /* the emulated GPU's kernels, on host memory */
#endif
  *out = ctx;
  return KIVI_OK;
}

void kivi_context_destroy(kivi_context *ctx) { free(ctx); }

kivi_status kivi_context_get_info(const kivi_context *ctx, kivi_context_info *info) {
  if (!ctx || !info) return KIVI_ERR_ARG;
  memset(info, 0, sizeof *info); /* reserved members read 0 */
  info->device = ctx->device;
  info->on_gpu = ctx->on_gpu;
  info->num_devices = ctx->num_devices;
  return KIVI_OK;
}

kivi_status kivi_context_selftest(kivi_context *ctx, int *ran_on_gpu) {
  if (!ctx) return KIVI_ERR_ARG;
  enum { N = 1 << 16 };
  const int dev = ctx->device;
  double *x = kivi_dev_alloc(ctx, N * sizeof(double));
  double *sum = kivi_dev_alloc(ctx, 2 * sizeof(double));
  if (!x || !sum) { kivi_dev_free(ctx, x); kivi_dev_free(ctx, sum); return KIVI_ERR_NOMEM; }
  int on_host = -1;
  /* fill x[i] = i, then one team sums it: small, deterministic, exact in double */
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(x)
  for (int i = 0; i < N; ++i) x[i] = (double)i;
#pragma omp target device(dev) is_device_ptr(x, sum) map(from: on_host)
  {
    double s = 0;
    for (int i = 0; i < N; ++i) s += x[i];
    sum[0] = s;
    on_host = omp_is_initial_device();
  }
  double got[2] = {0, 0};
  const int err = kivi_dev_get(ctx, got, sum, sizeof(double));
  kivi_dev_free(ctx, x);
  kivi_dev_free(ctx, sum);
  if (err) return KIVI_ERR_DEVICE;
  if (ran_on_gpu) *ran_on_gpu = on_host == 0;
  if (got[0] != (double)N * (N - 1) / 2) return KIVI_ERR_DEVICE;
#ifndef KIVI_SIMT_EMU
  if ((on_host == 0) != ctx->on_gpu) return KIVI_ERR_DEVICE; /* ran somewhere else than promised */
#endif
  return KIVI_OK;
}

/* ---- device memory ---- */

void *kivi_dev_alloc(const kivi_context *ctx, size_t bytes) {
  if (bytes == 0) bytes = 16;
#if KIVI_DEVICE_API
  if (ctx->on_gpu) return omp_target_alloc(bytes, ctx->device);
#endif
  (void)ctx;
#ifdef KIVI_SIMT_EMU
  /* the emulated GPU's memory starts as 0xff bytes (f16 NaN, float NaN), as a GPU's may hold
   * anything: a kernel that reads a byte no call wrote, and uses it, fails the tests */
  void *p = malloc(bytes);
  if (p) memset(p, 0xff, bytes);
  return p;
#else
  return malloc(bytes);
#endif
}

void kivi_dev_free(const kivi_context *ctx, void *p) {
  if (!p) return;
#if KIVI_DEVICE_API
  if (ctx->on_gpu) { omp_target_free(p, ctx->device); return; }
#endif
  (void)ctx;
  free(p);
}

int kivi_dev_put(const kivi_context *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return 0;
#if KIVI_DEVICE_API
  if (ctx->on_gpu)
    return omp_target_memcpy(dst, src, bytes, 0, 0, ctx->device, omp_get_initial_device()) ? -1 : 0;
#endif
  (void)ctx;
  memcpy(dst, src, bytes);
  return 0;
}

int kivi_dev_get(const kivi_context *ctx, void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return 0;
#if KIVI_DEVICE_API
  if (ctx->on_gpu)
    return omp_target_memcpy(dst, src, bytes, 0, 0, omp_get_initial_device(), ctx->device) ? -1 : 0;
#endif
  (void)ctx;
  memcpy(dst, src, bytes);
  return 0;
}

int kivi_scratch_reserve(const kivi_context *ctx, kivi_scratch *s, size_t bytes) {
  if (s->bytes >= bytes) return 0;
  void *p = kivi_dev_alloc(ctx, bytes);
  if (!p) return -1;
  kivi_dev_free(ctx, s->p);
  s->p = p;
  s->bytes = bytes;
  return 0;
}

void kivi_scratch_free(const kivi_context *ctx, kivi_scratch *s) {
  kivi_dev_free(ctx, s->p);
  s->p = NULL;
  s->bytes = 0;
}

/* ---- public wrappers ---- */

kivi_status kivi_context_alloc(kivi_context *ctx, size_t bytes, void **ptr) {
  if (!ctx || !ptr || bytes == 0) return KIVI_ERR_ARG;
  *ptr = kivi_dev_alloc(ctx, bytes);
  return *ptr ? KIVI_OK : KIVI_ERR_NOMEM;
}

void kivi_context_free(kivi_context *ctx, void *ptr) {
  if (ctx) kivi_dev_free(ctx, ptr);
}

kivi_status kivi_context_upload(kivi_context *ctx, void *dst, const void *src, size_t bytes) {
  if (!ctx || ((!dst || !src) && bytes)) return KIVI_ERR_ARG;
  return kivi_dev_put(ctx, dst, src, bytes) ? KIVI_ERR_DEVICE : KIVI_OK;
}

kivi_status kivi_context_download(kivi_context *ctx, void *dst, const void *src, size_t bytes) {
  if (!ctx || ((!dst || !src) && bytes)) return KIVI_ERR_ARG;
  return kivi_dev_get(ctx, dst, src, bytes) ? KIVI_ERR_DEVICE : KIVI_OK;
}
