/* kivi_layers: the decode step of a whole layer stack (Llama-shaped, synthetic data), run with the
 * synchronous calls and with the asynchronous ones, side by side.
 *
 * Each step, on every layer: append the new token's K/V, then decode attention for it — inputs
 * and outputs in device memory, as in a code that keeps its model on the GPU.  The synchronous
 * run waits in every call; the asynchronous run enqueues all layers' calls and waits once per
 * step.  Two caches get the same data, so the outputs of the two runs must be bit-identical.
 *
 *   kivi_layers [--layers 30] [--heads 32] [--kv-heads 32] [--head-dim 128] [--context 4096]
 *               [--batch 1] [--steps 20] [--bits 2] [--device default|host|N] [--json FILE]
 *
 * Prints the wall time per step (per token) of each run. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kivi.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kivi_status st_ = (call);                                                            \
    if (st_ != KIVI_OK) {                                                                \
      fprintf(stderr, "kivi_layers: %s failed: %s\n", #call, kivi_status_string(st_));   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *random_floats(size_t n, unsigned seed) {
  float *x = malloc(n * sizeof *x);
  if (!x) {
    fprintf(stderr, "kivi_layers: out of memory\n");
    exit(1);
  }
  unsigned s = seed;
  for (size_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return x;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct run {
  kivi_cache *cache;
  double *step_s;
} run;

int main(int argc, char **argv) {
  int layers = 30, HQ = 32, H = 32, D = 128, S = 4096, B = 1, steps = 20, bits = 2, device = KIVI_DEVICE_DEFAULT;
  const char *json = NULL;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int *iv = !strcmp(a, "--layers") ? &layers : !strcmp(a, "--heads") ? &HQ : !strcmp(a, "--kv-heads") ? &H
            : !strcmp(a, "--head-dim") ? &D : !strcmp(a, "--context") ? &S : !strcmp(a, "--batch") ? &B
            : !strcmp(a, "--steps") ? &steps : !strcmp(a, "--bits") ? &bits : NULL;
    if (!v || (!iv && strcmp(a, "--device") && strcmp(a, "--json"))) {
      fprintf(stderr, "usage: kivi_layers [--layers N] [--heads N] [--kv-heads N] [--head-dim N] [--context N]\n"
                      "                   [--batch N] [--steps N] [--bits 2|4|8|16] [--device default|host|N] [--json F]\n");
      return 2;
    }
    ++i;
    if (iv) *iv = atoi(v);
    else if (!strcmp(a, "--json")) json = v;
    else device = !strcmp(v, "host") ? KIVI_DEVICE_HOST : !strcmp(v, "default") ? KIVI_DEVICE_DEFAULT : atoi(v);
  }
  if (layers < 1 || HQ < 1 || H < 1 || HQ % H || S < 1 || B < 1 || steps < 1) {
    fprintf(stderr, "kivi_layers: bad sizes\n");
    return 2;
  }
  kivi_context *ctx = NULL;
  CHECK(kivi_context_create(&ctx, device));
  kivi_context_info info;
  CHECK(kivi_context_get_info(ctx, &info));
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, layers, H, D, B, S + steps);
  cfg.k_bits = cfg.v_bits = bits;

  /* inputs: the prompt's K/V (host, the same for every layer), the steps' K/V and queries and
   * the outputs (device) */
  const size_t tok = (size_t)H * D, qrow = (size_t)B * HQ * D;
  float *kp = random_floats((size_t)B * S * tok, 1), *vp = random_floats((size_t)B * S * tok, 2);
  float *ks = random_floats((size_t)steps * B * tok, 3), *vs = random_floats((size_t)steps * B * tok, 4);
  float *qs = random_floats((size_t)steps * layers * qrow, 5);
  void *dk, *dv, *dq, *dout[2];
  CHECK(kivi_context_alloc(ctx, (size_t)steps * B * tok * 4, &dk));
  CHECK(kivi_context_alloc(ctx, (size_t)steps * B * tok * 4, &dv));
  CHECK(kivi_context_alloc(ctx, (size_t)steps * layers * qrow * 4, &dq));
  CHECK(kivi_context_alloc(ctx, (size_t)layers * qrow * 4, &dout[0]));
  CHECK(kivi_context_alloc(ctx, (size_t)layers * qrow * 4, &dout[1]));
  CHECK(kivi_context_upload(ctx, dk, ks, (size_t)steps * B * tok * 4));
  CHECK(kivi_context_upload(ctx, dv, vs, (size_t)steps * B * tok * 4));
  CHECK(kivi_context_upload(ctx, dq, qs, (size_t)steps * layers * qrow * 4));
  int *ids = malloc((size_t)B * sizeof *ids), *ones = malloc((size_t)B * sizeof *ones), *lens = malloc((size_t)B * sizeof *lens);
  for (int b = 0; b < B; ++b) {
    ids[b] = b;
    ones[b] = 1;
    lens[b] = S;
  }

  run runs[2];
  for (int r = 0; r < 2; ++r) {
    CHECK(kivi_cache_create(ctx, &cfg, &runs[r].cache));
    for (int l = 0; l < layers; ++l) CHECK(kivi_cache_append(runs[r].cache, l, B, ids, lens, kp, vp, KIVI_F32, KIVI_MEM_HOST));
    runs[r].step_s = malloc((size_t)steps * sizeof(double));
  }
  const float scale = 1.0f / 11.313708f; /* 1/sqrt(128) */
  for (int r = 0; r < 2; ++r) { /* r = 0: synchronous calls; r = 1: asynchronous, one wait per step */
    kivi_cache *c = runs[r].cache;
    for (int s = 0; s < steps; ++s) {
      const float *k = (const float *)dk + (size_t)s * B * tok, *v = (const float *)dv + (size_t)s * B * tok;
      const double t0 = now_s();
      for (int l = 0; l < layers; ++l) {
        const float *q = (const float *)dq + ((size_t)s * layers + l) * qrow;
        float *o = (float *)dout[r] + (size_t)l * qrow;
        if (r == 0) {
          CHECK(kivi_cache_append(c, l, B, ids, ones, k, v, KIVI_F32, KIVI_MEM_DEVICE));
          CHECK(kivi_attention_decode(c, l, B, ids, HQ, q, scale, o, KIVI_F32, KIVI_MEM_DEVICE));
        } else {
          CHECK(kivi_cache_append_async(c, l, B, ids, ones, k, v, KIVI_F32, KIVI_MEM_DEVICE));
          CHECK(kivi_attention_decode_async(c, l, B, ids, HQ, q, scale, o, KIVI_F32, KIVI_MEM_DEVICE));
        }
      }
      if (r == 1) CHECK(kivi_cache_wait(c));
      runs[r].step_s[s] = now_s() - t0;
    }
  }
  /* the last step's outputs of every layer: identical bits? */
  float *o0 = malloc((size_t)layers * qrow * 4), *o1 = malloc((size_t)layers * qrow * 4);
  CHECK(kivi_context_download(ctx, o0, dout[0], (size_t)layers * qrow * 4));
  CHECK(kivi_context_download(ctx, o1, dout[1], (size_t)layers * qrow * 4));
  const int identical = !memcmp(o0, o1, (size_t)layers * qrow * 4);

  double med[2], mean[2];
  for (int r = 0; r < 2; ++r) {
    mean[r] = 0;
    for (int s = 0; s < steps; ++s) mean[r] += runs[r].step_s[s] / steps;
    qsort(runs[r].step_s, (size_t)steps, sizeof(double), cmp_double);
    med[r] = runs[r].step_s[steps / 2];
  }
  kivi_cache_stats st;
  CHECK(kivi_cache_get_stats(runs[0].cache, &st));
  printf("decode step of %d layers: %d q-heads / %d kv-heads x %d, %d-bit cache, batch %d, context %d, on %s\n",
         layers, HQ, H, D, bits, B, S, info.on_gpu ? "the GPU" : "host threads");
  printf("%-44s %12s %12s %10s\n", "", "median µs", "mean µs", "per layer");
  printf("%-44s %12.1f %12.1f %10.1f\n", "synchronous (append + decode, wait in each)", 1e6 * med[0], 1e6 * mean[0],
         1e6 * med[0] / layers);
  printf("%-44s %12.1f %12.1f %10.1f\n", "asynchronous (all layers enqueued, one wait)", 1e6 * med[1], 1e6 * mean[1],
         1e6 * med[1] / layers);
  if (!info.on_gpu) printf("(host threads: the asynchronous calls run synchronously, so the two runs do the same)\n");
  printf("speedup %.2fx; outputs of the two runs %s; cache %.1f MB for %lld tokens (fp16: %.1f MB)\n", med[0] / med[1],
         identical ? "bit-identical" : "DIFFERENT", st.total_bytes / 1e6, (long long)st.tokens, st.fp16_bytes / 1e6);
  if (json) {
    FILE *f = fopen(json, "w");
    if (f) {
      fprintf(f, "{\"layers\": %d, \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"bits\": %d, \"batch\": %d, "
                 "\"context\": %d, \"steps\": %d, \"on_gpu\": %s,\n \"sync_median_us\": %.2f, \"sync_mean_us\": %.2f, "
                 "\"async_median_us\": %.2f, \"async_mean_us\": %.2f, \"identical\": %s}\n",
              layers, HQ, H, D, bits, B, S, steps, info.on_gpu ? "true" : "false", 1e6 * med[0], 1e6 * mean[0],
              1e6 * med[1], 1e6 * mean[1], identical ? "true" : "false");
      fclose(f);
    }
  }
  for (int r = 0; r < 2; ++r) {
    kivi_cache_destroy(runs[r].cache);
    free(runs[r].step_s);
    kivi_context_free(ctx, dout[r]);
  }
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  kivi_context_free(ctx, dq);
  kivi_context_destroy(ctx);
  free(kp); free(vp); free(ks); free(vs); free(qs); free(o0); free(o1); free(ids); free(ones); free(lens);
  return identical ? 0 : 1;
}
