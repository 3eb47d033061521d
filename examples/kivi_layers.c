/* kivi_layers: the decode step of a whole layer stack (Llama-shaped, synthetic data), run with the
 * synchronous calls, with the asynchronous ones, and with the asynchronous ones on a CUDA stream
 * (kivi_cache_set_stream), side by side.
 *
 * Each step, on every layer: append the new token's K/V, then decode attention for it — inputs
 * and outputs in device memory, as in a code that keeps its model on the GPU.  The synchronous
 * run waits in every call; the asynchronous runs enqueue all layers' calls and wait once per
 * step.  Each run gets its own cache with the same data, so the outputs must be bit-identical.
 *
 *   kivi_layers [--layers 30] [--heads 32] [--kv-heads 32] [--head-dim 128] [--context 4096]
 *               [--batch 1] [--steps 20] [--bits 2] [--lanes 8] [--chain 0] [--device default|host|N]
 *               [--json FILE]
 *
 * --lanes N: the caches' async_lanes (kivi.h).  With 8, the enqueued calls of 8 layers run side
 * by side (the layers of this example are independent: synthetic q).  With 1, every enqueued
 * call waits for the one before it: the order a model imposes, where each layer's q comes from
 * the layer before.
 *
 * --chain 1: before each layer, a target region of the example's own derives the layer's q from
 * the previous layer's output (enqueued with depend(in: d[0]) on the cache's dependence), so
 * the layers depend on each other as in a model, whatever the lanes.  The stream run is skipped
 * (the example's own region is not on the stream).
 * --chain 2: each layer's q is the previous layer's output itself: the same dependence with no
 * work of the example's, so all three runs take part (the asynchronous run then uses one lane).
 *
 * Prints the wall time per step (per token) of each run.  The stream run needs a GPU and the
 * CUDA driver; elsewhere it is reported as unavailable. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kivi.h"
#include "kivi_cli.h"
#include "kivi_stack.h"

#define CHECK(call)                                                                      \
  do {                                                                                   \
    kivi_status st_ = (call);                                                            \
    if (st_ != KIVI_OK) {                                                                \
      fprintf(stderr, "kivi_layers: %s failed: %s\n", #call, kivi_status_string(st_));   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

int main(int argc, char **argv) {
  stack_shape s = {30, 32, 32, 128, 1, 4096, 20, 2, KIVI_MAX_ASYNC_LANES, 0, 0};
  int device = KIVI_DEVICE_DEFAULT;
  const char *json = NULL;
  static const char usage[] =
      "usage: kivi_layers [--layers N] [--heads N] [--kv-heads N] [--head-dim N] [--context N]\n"
      "                   [--batch N] [--steps N] [--bits 2|4|8|16] [--lanes 1..8] [--chain 0|1|2]\n"
      "                   [--device default|host|N] [--json F] [--help] [--version]\n"
      "A decode step over many layers with the synchronous and the asynchronous calls, and the\n"
      "asynchronous ones on a CUDA stream, side by side.\n";
  const int info_rc = kivi_cli_info(argc, argv, "kivi_layers", kivi_version_string(), usage);
  if (info_rc >= 0) return info_rc;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    int *iv = !strcmp(a, "--layers") ? &s.layers : !strcmp(a, "--heads") ? &s.HQ : !strcmp(a, "--kv-heads") ? &s.H
            : !strcmp(a, "--head-dim") ? &s.D : !strcmp(a, "--context") ? &s.context : !strcmp(a, "--batch") ? &s.batch
            : !strcmp(a, "--steps") ? &s.steps : !strcmp(a, "--bits") ? &s.bits : !strcmp(a, "--lanes") ? &s.lanes
            : !strcmp(a, "--chain") ? &s.chain : NULL;
    if (!iv && strcmp(a, "--device") && strcmp(a, "--json")) return kivi_cli_bad("kivi_layers", "unknown option", a);
    if (!v) return kivi_cli_bad("kivi_layers", "missing value after", a);
    ++i;
    if (iv) *iv = atoi(v);
    else if (!strcmp(a, "--json")) json = v;
    else device = !strcmp(v, "host") ? KIVI_DEVICE_HOST : !strcmp(v, "default") ? KIVI_DEVICE_DEFAULT : atoi(v);
  }
  if (s.layers < 1 || s.HQ < 1 || s.H < 1 || s.HQ % s.H || s.context < 1 || s.batch < 1 || s.steps < 1 ||
      s.chain < 0 || s.chain > 2) {
    fprintf(stderr, "kivi_layers: bad sizes: layers, heads, kv-heads (dividing heads), context, batch and steps must be >= 1, chain 0, 1 or 2\n");
    return 2;
  }
  kivi_context *ctx = NULL;
  CHECK(kivi_context_create(&ctx, device));
  kivi_context_info info;
  CHECK(kivi_context_get_info(ctx, &info));
  stack_inputs in;
  CHECK(stack_inputs_init(&in, ctx, &s));
  /* a cache per run with the same prompt: 0 synchronous, 1 asynchronous, 2 asynchronous on a stream */
  enum { RUNS = 3 };
  static const char *names[RUNS] = {"synchronous (append + decode, wait in each)",
                                    "asynchronous (all layers enqueued, one wait)",
                                    "asynchronous on a CUDA stream (one wait)"};
  const size_t nout = (size_t)s.layers * s.batch * s.HQ * s.D;
  kivi_cache *cache[RUNS] = {NULL, NULL, NULL};
  void *dout[RUNS] = {NULL, NULL, NULL};
  double *step_s[RUNS] = {NULL, NULL, NULL}, med[RUNS] = {0, 0, 0}, mean[RUNS] = {0, 0, 0};
  int ran[RUNS] = {0, 0, 0};
  kivi_status stream_st = KIVI_ERR_UNSUPPORTED;
  for (int r = 0; r < RUNS; ++r) {
    stack_shape sr = s;
    if (r == 1 && s.chain == 2) sr.lanes = 1; /* the layers' decodes must run in order */
    sr.stream = r == 2;
    if (r == 2 && s.chain == 1) continue; /* not run (see above) */
    const kivi_status cst = stack_cache(&in, &sr, &cache[r]);
    if (r == 2) {
      stream_st = cst;
      if (cst == KIVI_ERR_UNSUPPORTED) continue; /* no stream here: told below */
    }
    CHECK(cst);
    ran[r] = 1;
    CHECK(kivi_context_alloc(ctx, nout * 4, &dout[r]));
    step_s[r] = malloc((size_t)s.steps * sizeof(double));
    CHECK(stack_steps(&in, &sr, cache[r], r > 0, dout[r], step_s[r]));
    stack_median_mean(step_s[r], s.steps, &med[r], &mean[r]);
  }
  /* the last step's outputs of every layer: identical bits? */
  float *o0 = malloc(nout * 4), *o1 = malloc(nout * 4);
  int identical = 1;
  CHECK(kivi_context_download(ctx, o0, dout[0], nout * 4));
  for (int r = 1; r < RUNS; ++r) {
    if (!ran[r]) continue;
    CHECK(kivi_context_download(ctx, o1, dout[r], nout * 4));
    identical &= !memcmp(o0, o1, nout * 4);
  }
  kivi_cache_stats st, sst = {0};
  CHECK(kivi_cache_get_stats(cache[0], &st));
  if (ran[2]) CHECK(kivi_cache_get_stats(cache[2], &sst));
  printf("decode step of %d layers: %d q-heads / %d kv-heads x %d, %d-bit cache, batch %d, context %d, on %s, "
         "%d async lane%s%s\n", s.layers, s.HQ, s.H, s.D, s.bits, s.batch, s.context,
         info.on_gpu ? "the GPU" : "host threads", s.lanes, s.lanes == 1 ? "" : "s",
         s.chain == 1 ? ", layers chained (q from the previous output, by the example's kernel)"
         : s.chain == 2 ? ", layers chained (q = the previous output)" : "");
  printf("%-44s %12s %12s %10s\n", "", "median µs", "mean µs", "per layer");
  for (int r = 0; r < RUNS; ++r) {
    if (ran[r])
      printf("%-44s %12.1f %12.1f %10.1f\n", names[r], 1e6 * med[r], 1e6 * mean[r], 1e6 * med[r] / s.layers);
    else
      printf("%-44s %s\n", names[r], s.chain == 1 ? "(skipped: --chain 1 orders with an OpenMP task)"
                                                  : kivi_status_string(stream_st));
  }
  if (!info.on_gpu) printf("(host threads: the asynchronous calls run synchronously, so the runs do the same)\n");
  if (ran[2])
    printf("stream: %lld kernels launched on it, %lld regions after a wait\n", (long long)sst.stream_kernels,
           (long long)sst.stream_waits);
  printf("speedup %.2fx (asynchronous); outputs of the runs %s; cache %.1f MB for %lld tokens (fp16: %.1f MB)\n",
         med[0] / med[1], identical ? "bit-identical" : "DIFFERENT", st.total_bytes / 1e6,
         (long long)st.tokens, st.fp16_bytes / 1e6);
  if (ran[2]) printf("speedup %.2fx (stream)\n", med[0] / med[2]);
  if (json) {
    FILE *f = fopen(json, "w");
    if (f) {
      fprintf(f, "{\"layers\": %d, \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"bits\": %d, \"batch\": %d, "
                 "\"context\": %d, \"steps\": %d, \"lanes\": %d, \"chain\": %d, \"on_gpu\": %s,\n \"sync_median_us\": %.2f, \"sync_mean_us\": %.2f, "
                 "\"async_median_us\": %.2f, \"async_mean_us\": %.2f, ",
              s.layers, s.HQ, s.H, s.D, s.bits, s.batch, s.context, s.steps, s.lanes, s.chain, info.on_gpu ? "true" : "false", 1e6 * med[0],
              1e6 * mean[0], 1e6 * med[1], 1e6 * mean[1]);
      if (ran[2])
        fprintf(f, "\"stream_median_us\": %.2f, \"stream_mean_us\": %.2f, \"stream_kernels\": %lld, \"stream_waits\": %lld, ",
                1e6 * med[2], 1e6 * mean[2], (long long)sst.stream_kernels, (long long)sst.stream_waits);
      fprintf(f, "\"identical\": %s}\n", identical ? "true" : "false");
      fclose(f);
    }
  }
  for (int r = 0; r < RUNS; ++r) {
    kivi_cache_destroy(cache[r]);
    kivi_context_free(ctx, dout[r]);
    free(step_s[r]);
  }
  stack_inputs_free(&in);
  kivi_context_destroy(ctx);
  free(o0);
  free(o1);
  return identical ? 0 : 1;
}
