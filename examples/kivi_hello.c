/* kivi_hello: the first program to run on a new machine.  Prints the library version and build,
 * where the work runs (GPU or host threads), runs a self-test kernel, then stores 1000 tokens of
 * a small 2-bit KIVI cache and attends over it once.  Exit status 0 means all of it worked.
 * (This file is also compiled as C++ by kivi_hello_cxx.cc to keep kivi.h clean for C++.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kivi.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kivi_status st_ = (call);                                                            \
    if (st_ != KIVI_OK) {                                                                \
      fprintf(stderr, "kivi_hello: %s failed: %s\n", #call, kivi_status_string(st_));    \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

int main(void) {
  printf("libkivi-omp %s (header %s)\n", kivi_version_string(), KIVI_VERSION_STRING);
  printf("build: %s\n", kivi_build_config());

  kivi_context *ctx = NULL;
  CHECK(kivi_context_create(&ctx, KIVI_DEVICE_DEFAULT));
  kivi_context_info info;
  CHECK(kivi_context_get_info(ctx, &info));
  int on_gpu = 0;
  CHECK(kivi_context_selftest(ctx, &on_gpu));
  printf("devices: %d visible; running on %s (OpenMP device %d); self-test kernel ran on the %s\n",
         info.num_devices, info.on_gpu ? "a GPU" : "host threads", info.device, on_gpu ? "GPU" : "host");

  /* one layer, 2 kv-heads of 64 dims, one sequence of 1000 tokens, paper defaults G=32 R=128 */
  enum { H = 2, D = 64, L = 1000, HQ = 6 };
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, H, D, 1, 4096);
  kivi_cache *cache = NULL;
  CHECK(kivi_cache_create(ctx, &cfg, &cache));
  float *k = (float *)malloc(sizeof(float) * L * H * D), *v = (float *)malloc(sizeof(float) * L * H * D);
  float q[HQ * D], out[HQ * D];
  for (int i = 0; i < L * H * D; ++i) {
    k[i] = sinf(0.001f * (float)i);
    v[i] = cosf(0.002f * (float)i);
  }
  for (int i = 0; i < HQ * D; ++i) q[i] = 0.1f * (float)(i % 7);
  const int seq = 0, n = L;
  CHECK(kivi_cache_append(cache, 0, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST));
  CHECK(kivi_attention_decode(cache, 0, 1, &seq, HQ, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST));
  kivi_cache_stats st;
  CHECK(kivi_cache_get_stats(cache, &st));
  double sum = 0;
  for (int i = 0; i < HQ * D; ++i) sum += out[i];
  printf("cache: %lld tokens in %zu bytes vs %zu as fp16 (%.2f bits/element, %.1fx smaller)\n",
         (long long)st.tokens, st.total_bytes, st.fp16_bytes, st.bits_per_element,
         (double)st.fp16_bytes / (double)st.total_bytes);
  printf("attention output checksum: %.6f\n", sum);
  free(k);
  free(v);
  kivi_cache_destroy(cache);
  kivi_context_destroy(ctx);
  printf("kivi_hello: OK\n");
  return 0;
}
