/* stream-call: where the wall time of one synchronous decode call on a cache with a CUDA stream
 * goes (kivi_cache_set_stream).  One layer, 32 heads x 128, KIVI-2, context 4096, batch 1, q and
 * out in device memory (kivi-bench --shape 1,32,4096 --stream).  Times, median of REPS:
 *   sync      kivi_attention_decode (enqueue + wait)
 *   enqueue   kivi_attention_decode_async alone: the host time of one enqueued call, measured
 *             over 32 calls in a row and divided (the GPU runs behind)
 *   wait      kivi_cache_wait after one enqueued call whose kernel has had time to finish
 *   wait0     kivi_cache_wait with nothing enqueued
 *   nostream  kivi_attention_decode through the OpenMP runtime, for reference
 * Build (offload tree): clang-19 -O2 -I include -I BUILD/include stream-call.c -L BUILD/.libs -lkivi-omp
 * Run on the GPU: OMP_TARGET_OFFLOAD=MANDATORY ./stream-call */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kivi.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}
#define TRY(x)                                                              \
  do {                                                                      \
    kivi_status s_ = (x);                                                   \
    if (s_) {                                                               \
      fprintf(stderr, "%s: %s\n", #x, kivi_status_string(s_));              \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

enum { H = 32, D = 128, S = 4096, REPS = 200, BURST = 32 };

int main(void) {
  kivi_context *ctx;
  TRY(kivi_context_create(&ctx, KIVI_DEVICE_DEFAULT));
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, H, D, 1, S + 16);
  kivi_cache *c;
  TRY(kivi_cache_create(ctx, &cfg, &c));
  float *k = malloc((size_t)S * H * D * 4), *v = malloc((size_t)S * H * D * 4);
  unsigned r = 1;
  for (size_t i = 0; i < (size_t)S * H * D; ++i) {
    r = r * 1664525u + 1013904223u;
    k[i] = (float)(r >> 8) / 16777216.0f - 0.5f;
    v[i] = -k[i];
  }
  const int id = 0, n = S;
  TRY(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST));
  void *dq, *dout;
  TRY(kivi_context_alloc(ctx, H * D * 4, &dq));
  TRY(kivi_context_alloc(ctx, H * D * 4, &dout));
  TRY(kivi_context_upload(ctx, dq, k, H * D * 4));
  double t[REPS];
  const char *names[5] = {"nostream", "sync", "enqueue", "wait", "wait0"};
  for (int m = 0; m < 5; ++m) {
    if (m == 1) TRY(kivi_cache_set_stream(c, KIVI_STREAM_LIBRARY));
    for (int i = 0; i < REPS + 5; ++i) {
      double dt = 0;
      if (m <= 1) {
        const double t0 = now();
        TRY(kivi_attention_decode(c, 0, 1, &id, H, dq, 0.088f, dout, KIVI_F32, KIVI_MEM_DEVICE));
        dt = now() - t0;
      } else if (m == 2) {
        const double t0 = now();
        for (int j = 0; j < BURST; ++j)
          TRY(kivi_attention_decode_async(c, 0, 1, &id, H, dq, 0.088f, dout, KIVI_F32, KIVI_MEM_DEVICE));
        dt = (now() - t0) / BURST;
        TRY(kivi_cache_wait(c));
      } else if (m == 3) {
        TRY(kivi_attention_decode_async(c, 0, 1, &id, H, dq, 0.088f, dout, KIVI_F32, KIVI_MEM_DEVICE));
        const double t1 = now();
        while (now() - t1 < 200e-6) {
        }
        const double t0 = now();
        TRY(kivi_cache_wait(c));
        dt = now() - t0;
      } else {
        const double t0 = now();
        TRY(kivi_cache_wait(c));
        dt = now() - t0;
      }
      if (i >= 5) t[i - 5] = dt;
    }
    qsort(t, REPS, sizeof t[0], cmpd);
    printf("%-9s median %7.2f us   p10 %7.2f us   p90 %7.2f us\n", names[m], 1e6 * t[REPS / 2], 1e6 * t[REPS / 10],
           1e6 * t[REPS * 9 / 10]);
  }
  kivi_cache_destroy(c);
  kivi_context_free(ctx, dq);
  kivi_context_free(ctx, dout);
  kivi_context_destroy(ctx);
  free(k);
  free(v);
  return 0;
}
