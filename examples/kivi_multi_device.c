/* kivi_multi_device: the decode step of a Llama-2-7B-shaped layer stack with its kv-heads split
 * across every visible GPU of one process — one context and one cache per part, one host thread
 * per part — checked against the same model on a single device.
 *
 *   kivi_multi_device [--parts N] [--layers 32] [--heads 32] [--kv-heads 32] [--head-dim 128]
 *                     [--context 4096] [--batch 1] [--steps 10] [--bits 2] [--host] [--scaling]
 *                     [--max-parts 8] [--stream] [--json FILE]
 *
 * Part p runs on device p mod (visible devices), or on host threads (--host, or no GPU), driven
 * by a POSIX thread of its own (steps start together at a barrier).  With
 * one GPU every part shares it: the multi-device code path runs, the scaling does not.
 * --scaling: time per step with 1, 2, 4, ... --max-parts parts at a fixed total batch x context
 * (strong) and with the context growing with the parts (weak).
 * --stream: each part's cache gets a CUDA stream of its own (kivi_cache_set_stream) and its
 * thread enqueues the step's calls there, waiting once per step (where there is no stream —
 * host threads, no CUDA driver — the parts run the synchronous calls). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kivi_cli.h"
#include "kivi_split.h"

#define SPLIT_REL_TOL_FP32 1e-5 /* portable kernel: fp32 accumulation, only the split order differs */
#define SPLIT_REL_TOL_F16X2 4e-3 /* GPU f16x2 kernel (fp16-attention accuracy) on either side */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct result {
  int parts, devices_used;
  double step_ms, rel_err;
  size_t max_dev_bytes;
  int ok;
} result;

typedef struct part_worker {
  split_part *p;
  const split_shape *s;
  kivi_context *ctx;
  int h0, h1;
  float *out; /* [layers][batch][its q-heads][D], the last step's */
  pthread_barrier_t *bar;
  kivi_status st;
} part_worker;

static void *part_main(void *arg) {
  part_worker *w = arg;
  const split_shape *s = w->s;
  w->st = split_part_init(w->p, s, w->ctx, w->h0, w->h1);
  w->out = malloc((size_t)s->layers * s->batch * (w->p->hq1 - w->p->hq0) * s->D * sizeof(float));
  if (!w->st && !w->out) w->st = KIVI_ERR_NOMEM;
  pthread_barrier_wait(w->bar);
  for (int step = 0; step < s->steps; ++step) {
    pthread_barrier_wait(w->bar);
    if (!w->st) w->st = split_part_step(w->p, step, w->out);
    pthread_barrier_wait(w->bar);
  }
  return NULL;
}

/* Runs the shape split in `parts` parts over `ndev` devices (0: host) and, when check, against one
 * part holding every head on the first device.  Returns 0 on success. */
static int run(const split_shape *s, int parts, int ndev, int check, result *res) {
  memset(res, 0, sizeof *res);
  res->parts = parts;
  kivi_context **ctx = calloc((size_t)(ndev > 0 ? ndev : 1), sizeof *ctx);
  split_part *p = calloc((size_t)parts, sizeof *p);
  const size_t whole_n = (size_t)s->layers * s->batch * s->HQ * s->D;
  float *whole = malloc(whole_n * sizeof(float)), *ref = malloc(whole_n * sizeof(float));
  float **outs = calloc((size_t)parts, sizeof *outs);
  kivi_status st = KIVI_OK;
  const int nctx = ndev > 0 ? (ndev < parts ? ndev : parts) : 1;
  for (int d = 0; d < nctx && !st; ++d) st = kivi_context_create(&ctx[d], ndev > 0 ? d : KIVI_DEVICE_HOST);
  res->devices_used = nctx;
  if (st) {
    fprintf(stderr, "kivi_multi_device: context: %s\n", kivi_status_string(st));
    return 1;
  }
  if (parts > 64) return 1;
  /* one host thread per part: create and prefill, then each step between two barriers */
  part_worker w[64];
  pthread_t tid[64];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)parts + 1);
  for (int i = 0; i < parts; ++i) {
    w[i] = (part_worker){&p[i], s, ctx[i % nctx], (int)((long)s->H * i / parts), (int)((long)s->H * (i + 1) / parts),
                         NULL, &bar, KIVI_OK};
    pthread_create(&tid[i], NULL, part_main, &w[i]);
  }
  pthread_barrier_wait(&bar); /* every part prefilled */
  double total = 0;
  for (int step = 0; step < s->steps; ++step) {
    const double t0 = now_s();
    pthread_barrier_wait(&bar); /* go */
    pthread_barrier_wait(&bar); /* every part done */
    const double dt = now_s() - t0;
    if (step > 0 || s->steps == 1) total += dt; /* step 0 warms up */
  }
  for (int i = 0; i < parts; ++i) {
    pthread_join(tid[i], NULL);
    outs[i] = w[i].out;
    if (w[i].st) st = w[i].st;
  }
  pthread_barrier_destroy(&bar);
  res->step_ms = 1e3 * total / (s->steps > 1 ? s->steps - 1 : 1);
  unsigned kernels = 0;
  for (int i = 0; i < parts && !st; ++i) {
    split_place(s, p[i].hq0, p[i].hq1, outs[i], whole);
    kivi_cache_stats cs;
    unsigned kk = 0;
    if (!kivi_cache_get_stats(p[i].cache, &cs) && cs.allocated_bytes > res->max_dev_bytes) res->max_dev_bytes = cs.allocated_bytes;
    if (!kivi_cache_last_kernels(p[i].cache, &kk)) kernels |= kk;
  }
  /* per device: the sum over its parts */
  if (!st && nctx < parts) {
    res->max_dev_bytes = 0;
    for (int d = 0; d < nctx; ++d) {
      size_t sum = 0;
      for (int i = d; i < parts; i += nctx) {
        kivi_cache_stats cs;
        if (!kivi_cache_get_stats(p[i].cache, &cs)) sum += cs.allocated_bytes;
      }
      if (sum > res->max_dev_bytes) res->max_dev_bytes = sum;
    }
  }
  for (int i = 0; i < parts; ++i) {
    split_part_free(&p[i]);
    free(outs[i]);
  }
  res->ok = !st;
  if (st) fprintf(stderr, "kivi_multi_device: %s\n", kivi_status_string(st));
  if (!st && check) { /* the whole model in one part on the first device, the same steps */
    split_part one;
    st = split_part_init(&one, s, ctx[0], 0, s->H);
    for (int step = 0; step < s->steps && !st; ++step) st = split_part_step(&one, step, ref);
    unsigned kk = 0;
    if (!st && !kivi_cache_last_kernels(one.cache, &kk)) kernels |= kk;
    split_part_free(&one);
    res->rel_err = st ? 1.0 : split_rel_err(whole, ref, whole_n);
    const double tol = (kernels & KIVI_KERNEL_GPU_F16X2) ? SPLIT_REL_TOL_F16X2 : SPLIT_REL_TOL_FP32;
    res->ok = !st && res->rel_err <= tol;
    printf("check against one device: last step of every layer, rel err %.2e (tolerance %.0e): %s\n", res->rel_err,
           tol, res->ok ? "ok" : "FAILED");
  }
  for (int d = 0; d < nctx; ++d) kivi_context_destroy(ctx[d]);
  free(ctx);
  free(p);
  free(outs);
  free(whole);
  free(ref);
  return res->ok ? 0 : 1;
}

int main(int argc, char **argv) {
  split_shape s = {32, 32, 32, 128, 1, 4096, 10, 2, 0};
  int parts = 0, host = 0, scaling = 0, max_parts = 8;
  const char *json = NULL;
  static const char usage[] =
      "usage: kivi_multi_device [--parts N] [--layers N] [--heads N] [--kv-heads N] [--head-dim N]\n"
      "  [--context N] [--batch N] [--steps N] [--bits B] [--host] [--scaling] [--max-parts N] [--stream]\n"
      "  [--json FILE] [--help] [--version]\n"
      "A model-shaped stack with its kv-heads split over every visible GPU, checked against one device;\n"
      "--scaling times strong and weak scaling over 1, 2, 4, ... parts.\n";
  const int info_rc = kivi_cli_info(argc, argv, "kivi_multi_device", kivi_version_string(), usage);
  if (info_rc >= 0) return info_rc;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--host")) { host = 1; continue; }
    if (!strcmp(a, "--scaling")) { scaling = 1; continue; }
    if (!strcmp(a, "--stream")) { s.stream = 1; continue; }
    int *iv = !strcmp(a, "--parts") ? &parts : !strcmp(a, "--layers") ? &s.layers : !strcmp(a, "--heads") ? &s.HQ
            : !strcmp(a, "--kv-heads") ? &s.H : !strcmp(a, "--head-dim") ? &s.D : !strcmp(a, "--context") ? &s.context
            : !strcmp(a, "--batch") ? &s.batch : !strcmp(a, "--steps") ? &s.steps : !strcmp(a, "--bits") ? &s.bits
            : !strcmp(a, "--max-parts") ? &max_parts : NULL;
    if (!iv && strcmp(a, "--json")) return kivi_cli_bad("kivi_multi_device", "unknown option", a);
    if (!v) return kivi_cli_bad("kivi_multi_device", "missing value after", a);
    ++i;
    if (iv) *iv = atoi(v);
    else json = v;
  }
  if (s.layers < 1 || s.H < 1 || s.HQ % s.H || s.batch < 1 || s.batch > 256 || s.steps < 1 || s.context < 1 ||
      max_parts < 1 || max_parts > 64) {
    fprintf(stderr, "kivi_multi_device: bad sizes: layers, steps and context >= 1, kv-heads dividing heads, batch 1..256, "
                    "max-parts 1..64\n");
    return 2;
  }
  kivi_context *probe = NULL;
  kivi_context_info info;
  memset(&info, 0, sizeof info);
  if (!host && kivi_context_create(&probe, KIVI_DEVICE_DEFAULT) == KIVI_OK) (void)kivi_context_get_info(probe, &info);
  kivi_context_destroy(probe);
  const int ndev = host || !info.on_gpu ? 0 : info.num_devices;
  if (parts <= 0) parts = ndev > 0 ? ndev : 2;
  if (parts > s.H || parts > 64) parts = s.H < 64 ? s.H : 64;
  printf("layer stack: %d layers, %d q-heads / %d kv-heads x %d, %d-bit, batch %d, context %d; %d visible GPU(s)%s%s\n",
         s.layers, s.HQ, s.H, s.D, s.bits, s.batch, s.context, ndev, ndev ? "" : " (host threads)",
         s.stream ? "; each part's calls enqueued on a CUDA stream of its own where there is one" : "");
  FILE *jf = json ? fopen(json, "w") : NULL;
  if (jf) fprintf(jf, "{\"layers\": %d, \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"bits\": %d, "
                      "\"batch\": %d, \"context\": %d, \"gpus\": %d, \"stream\": %d, \"runs\": [",
                  s.layers, s.HQ, s.H, s.D, s.bits, s.batch, s.context, ndev, s.stream);
  int rc = 0;
  if (!scaling) {
    result r;
    rc = run(&s, parts, ndev, 1, &r);
    printf("%d parts on %d device(s): %.3f ms per decode step (all layers), largest device share %.1f MB\n", r.parts,
           r.devices_used, r.step_ms, r.max_dev_bytes / 1e6);
    if (jf) fprintf(jf, "{\"mode\": \"check\", \"parts\": %d, \"devices\": %d, \"step_ms\": %.4f, \"device_mb\": %.2f, "
                        "\"rel_err\": %.3e}", r.parts, r.devices_used, r.step_ms, r.max_dev_bytes / 1e6, r.rel_err);
  } else {
    printf("%-7s %6s %8s %9s %12s %14s\n", "mode", "parts", "devices", "context", "ms/step", "device MB");
    int first = 1;
    for (int mode = 0; mode < 2; ++mode)
      for (int n = 1; n <= max_parts && n <= s.H; n *= 2) {
        split_shape t = s;
        if (mode == 1) t.context = s.context * n; /* weak: the context grows with the parts */
        result r;
        rc |= run(&t, n, ndev, 0, &r);
        printf("%-7s %6d %8d %9d %12.3f %14.1f\n", mode ? "weak" : "strong", n, r.devices_used, t.context, r.step_ms,
               r.max_dev_bytes / 1e6);
        if (jf) fprintf(jf, "%s{\"mode\": \"%s\", \"parts\": %d, \"devices\": %d, \"context\": %d, \"step_ms\": %.4f, "
                            "\"device_mb\": %.2f}", first ? "" : ", ", mode ? "weak" : "strong", n, r.devices_used,
                        t.context, r.step_ms, r.max_dev_bytes / 1e6);
        first = 0;
      }
    if (ndev < 2) printf("(%s: the parts share it, so these rows show the cost of splitting, not scaling)\n",
                         ndev ? "one GPU" : "host threads");
  }
  if (jf) {
    fprintf(jf, "]}\n");
    fclose(jf);
  }
  return rc;
}
