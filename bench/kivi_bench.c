/* kivi-bench: decode-step time of the fused KIVI attention against our own fp16 path in the
 * same run, append/quantize throughput, and the memory table.
 *
 *   kivi-bench [--quick] [--json FILE] [--reps N] [--device default|host] [--skip-append]
 *              [--skip-decode] [--sweep] [--shape B,H,S] [--kv-heads N] [--head-dim D] [--layouts]
 *              [--stack LAYERS] [--stream] [--prompt P [--context C]]
 *
 * Decode: for each (batch B, heads H, context S), D = 128, G = 32, R = 128, MHA, the cache is
 * filled with B sequences of S tokens, then kivi_attention_decode runs with q/out in device
 * memory (no transfers): 3 warm-up calls, `reps` timed calls, median wall time per call (each
 * call is synchronous, so this is the GPU time as a caller sees it, launch overhead included).
 * bytes_read is what the step must read: the packed cache of the batch (codes, scales/zeros,
 * fp16 residuals).  rel_err_vs_ref compares sequence 0 with a double-precision reference on
 * the dequantized cache.  --kv-heads N: N kv-heads under the shape's H query heads (GQA);
 * --head-dim D: another head_dim.  --layouts: the decode table over the q/kv layouts of common
 * models (32/32, 32/8, 28/4, 64/8 with D = 128; 9/3 with D = 64) at the --shape's B and S
 * (default 8, 32768).  --stack LAYERS: also the wall time per step of a whole layer stack
 * (append + decode on every layer, 32 heads x 128, context 4096, batch 1 and 8), with the
 * synchronous calls and with the asynchronous ones (one wait per step).  --quick: small shapes
 * for CI on the host.  --stream: the decode calls on a cache with a CUDA stream of its own
 * (kivi_cache_set_stream; each synchronous call enqueues and waits).  --rotate: every cache with
 * kivi_cache_config.rotate (the cost of the rotation option; the reference rotates too).
 * --sinks N: every cache with N sink tokens (kivi_cache_config.sinks; the reference keeps them).
 * --v-clip: every cache with searched value ranges (kivi_cache_config.v_clip = KIVI_CLIP_MSE; the
 * appends' cost of the option).  --v-bits B: the 2- and 4-bit rows' values at B bits (mixed widths: K4 V2 with 2).  --fp32:
 * every cache with KIVI_ATTENTION_FP32 (the portable kernel).  --sweep adds step time vs
 * context length (B = 1, 32 heads, S = 1k .. 64k; 1k .. 4k with --quick) for fp16, 2-bit and
 * 4-bit, the data of scripts/plot_bench.py.  --prompt P: the prompt's attention instead, one
 * kivi_attention_extend of P new tokens on an empty cache (q, k_new, v_new fp32 in device
 * memory), for the layouts 32/32 and 32/8 (head_dim 128) and 9/3 (head_dim 64), with
 * KIVI_ATTENTION_FAST (on a GPU: the new tokens' tensor-core kernel) and KIVI_ATTENTION_FP32 (the
 * portable kernel), checked on three rows against the double reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/ref/kivi_ref.h"
#include "kivi.h"
#include "../examples/kivi_stack.h"
#include "../examples/kivi_cli.h"

static const char bench_usage[] =
    "usage: kivi-bench [--quick] [--json FILE] [--reps N] [--device default|host] [--skip-append] [--skip-decode]\n"
    "                  [--sweep] [--shape B,H,S] [--kv-heads N] [--head-dim D] [--layouts] [--stack LAYERS]\n"
    "                  [--stream] [--rotate k|v|kv] [--sinks N] [--v-clip] [--v-bits 2|4] [--fp32] [--prompt P]\n"
    "                  [--context C] [--help]\n"
    "                  [--version]\n"
    "Times the decode step and the prefill of the KIVI cache against its fp16 path, checks the\n"
    "results against a double-precision reference, and prints one table line per shape (stdout,\n"
    "flushed as it goes; progress on stderr).  On host threads the default shapes are reduced.\n";

#define TRY(call)                                                                          \
  do {                                                                                     \
    kivi_status st_ = (call);                                                              \
    if (st_ != KIVI_OK) {                                                                  \
      fprintf(stderr, "kivi-bench: %s: %s (line %d)\n", #call, kivi_status_string(st_), __LINE__); \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define KIVI_BENCH_MAXD 256 /* the largest head_dim */
static uint64_t rng = 12345;
static float urand(void) { /* [-1, 1) */
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  return (float)((double)(rng >> 11) / 4503599627370496.0 - 1.0);
}

typedef struct shape { int B, H, S; } shape;

static kivi_context *ctx;
static int on_gpu, reps = 20, use_stream, rotate_opt; /* rotate_opt: kivi_cache_config.rotate of every cache */
static int v_bits_opt; /* --v-bits: the quantized caches' value width (0: the keys')  */
static int sinks_opt;  /* --sinks: kivi_cache_config.sinks of every cache */
static int vclip_opt;  /* --v-clip: kivi_cache_config.v_clip of every cache */
static int attention_opt = KIVI_ATTENTION_FAST; /* --fp32: KIVI_ATTENTION_FP32 */

/* Fills B sequences of S tokens (fp16 input from device memory, 4096-token chunks of random
 * data reused along the sequence) and returns the cache.  k0/v0 receive sequence 0's tokens. */
static kivi_cache *fill(int B, int H, int D, int S, int kb, int vb, float **k0, float **v0) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, H, D, B, S);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.rotate = rotate_opt;
  cfg.sinks = sinks_opt;
  cfg.v_clip = vclip_opt;
  cfg.attention = attention_opt;
  kivi_cache *c = NULL;
  TRY(kivi_cache_create(ctx, &cfg, &c));
  const int chunk = S < 4096 ? S : 4096;
  const size_t n = (size_t)chunk * H * D;
  float *kf = malloc(n * 4), *vf = malloc(n * 4);
  uint16_t *kh = malloc(n * 2), *vh = malloc(n * 2);
  for (size_t i = 0; i < n; ++i) {
    kf[i] = ref_round_f16(urand() * ((i % D) == 3 ? 8.0f : 1.0f));
    vf[i] = ref_round_f16(urand() + 0.25f * (float)((i % D) % 5));
    kh[i] = ref_f16(kf[i]);
    vh[i] = ref_f16(vf[i]);
  }
  void *dk, *dv;
  TRY(kivi_context_alloc(ctx, n * 2, &dk));
  TRY(kivi_context_alloc(ctx, n * 2, &dv));
  TRY(kivi_context_upload(ctx, dk, kh, n * 2));
  TRY(kivi_context_upload(ctx, dv, vh, n * 2));
  if (k0) {
    *k0 = malloc((size_t)S * H * D * 4);
    *v0 = malloc((size_t)S * H * D * 4);
  }
  for (int s = 0; s < B; ++s)
    for (int p = 0; p < S; p += chunk) {
      const int m = S - p < chunk ? S - p : chunk;
      TRY(kivi_cache_append(c, 0, 1, &s, &m, dk, dv, KIVI_F16, KIVI_MEM_DEVICE));
      if (k0 && s == 0) {
        memcpy(*k0 + (size_t)p * H * D, kf, (size_t)m * H * D * 4);
        memcpy(*v0 + (size_t)p * H * D, vf, (size_t)m * H * D * 4);
      }
    }
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  free(kf); free(vf); free(kh); free(vh);
  return c;
}

/* Median seconds per decode call; out (host) gets the result of the last call. */
static double time_decode(kivi_cache *c, int B, int HQ, int D, const float *q, float *out) {
  int *ids = malloc(sizeof(int) * B);
  for (int i = 0; i < B; ++i) ids[i] = i;
  const size_t qn = (size_t)B * HQ * D;
  void *dq, *dout;
  TRY(kivi_context_alloc(ctx, qn * 4, &dq));
  TRY(kivi_context_alloc(ctx, qn * 4, &dout));
  TRY(kivi_context_upload(ctx, dq, q, qn * 4));
  if (use_stream) TRY(kivi_cache_set_stream(c, KIVI_STREAM_LIBRARY)); /* each call: enqueue + wait */
  const float scale = 1.0f / sqrtf((float)D);
  for (int i = 0; i < 3; ++i)
    TRY(kivi_attention_decode(c, 0, B, ids, HQ, (const float *)dq, scale, dout, KIVI_F32, KIVI_MEM_DEVICE));
  double *t = malloc(sizeof(double) * reps);
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    TRY(kivi_attention_decode(c, 0, B, ids, HQ, (const float *)dq, scale, dout, KIVI_F32, KIVI_MEM_DEVICE));
    t[i] = now_s() - t0;
  }
  qsort(t, (size_t)reps, sizeof(double), cmp_double);
  const double med = t[reps / 2];
  TRY(kivi_context_download(ctx, out, dout, qn * 4));
  if (use_stream) TRY(kivi_cache_set_stream(c, NULL));
  kivi_context_free(ctx, dq);
  kivi_context_free(ctx, dout);
  free(t);
  free(ids);
  return med;
}

/* Bytes the decode step must read: the live packed state of every sequence. */
static size_t cache_bytes(const kivi_cache *c, int B) {
  size_t total = 0;
  for (int s = 0; s < B; ++s) {
    size_t n;
    TRY(kivi_cache_export_seq(c, s, 0, NULL, &n));
    total += n;
  }
  return total;
}

/* Sequence 0 of the cache against the double reference on its dequantized state. */
static double check_seq0(const kivi_cache *c, int H, int HQ, int D, int S, int kb, int vb, const float *q,
                         const float *out) {
  size_t n;
  TRY(kivi_cache_export_seq(c, 0, 0, NULL, &n));
  unsigned char *e = malloc(n);
  TRY(kivi_cache_export_seq(c, 0, 0, e, &n));
  const ref_geom g = {D, H, 32, 128, kb, vb, sinks_opt, vclip_opt};
  double *kd = malloc(sizeof(double) * S * H * D), *vd = malloc(sizeof(double) * S * H * D);
  double *ref = malloc(sizeof(double) * HQ * D);
  ref_dequant_export(&g, S, e, kd, vd);
  float *qr = malloc(sizeof(float) * HQ * D); /* a rotated cache: W q, the output rotated back */
  for (int h = 0; h < HQ; ++h) {
    double x[KIVI_BENCH_MAXD];
    for (int i = 0; i < D; ++i) x[i] = q[h * D + i];
    if (rotate_opt & KIVI_ROTATE_K) ref_rotate(x, D);
    for (int i = 0; i < D; ++i) qr[h * D + i] = (float)x[i];
  }
  ref_attention(S, H, HQ, D, kd, vd, qr, 1.0 / sqrt((double)D), ref, NULL);
  if (rotate_opt & KIVI_ROTATE_V)
    for (int h = 0; h < HQ; ++h) ref_rotate(ref + h * D, D);
  free(qr);
  double num = 0, den = 0;
  for (int i = 0; i < HQ * D; ++i) {
    num = fmax(num, fabs(out[i] - ref[i]));
    den = fmax(den, fabs(ref[i]));
  }
  free(e); free(kd); free(vd); free(ref);
  return num / den;
}

/* One decode shape: B sequences of S tokens, HQ query heads over HK kv-heads of head_dim D; the
 * fp16 path, then 2-bit and 4-bit; one table line (and JSON entry) per width. */
static void decode_shape(int B, int HQ, int HK, int D, int S, FILE *js, int *first) {
  static const int bits[2] = {2, 4};
  const size_t qn = (size_t)B * HQ * D;
  if (HK != HQ || D != 128) printf("(%d query heads over %d kv-heads, head_dim %d)\n", HQ, HK, D);
  float *q = malloc(qn * 4), *out = malloc(qn * 4);
  for (size_t i = 0; i < qn; ++i) q[i] = urand();
  kivi_cache *c16 = fill(B, HK, D, S, 16, 16, NULL, NULL);
  const double t16 = time_decode(c16, B, HQ, D, q, out);
  const size_t b16 = cache_bytes(c16, B);
  kivi_cache_destroy(c16);
  for (int bi = 0; bi < 2; ++bi) {
    float *k0, *v0;
    const int vb = v_bits_opt ? v_bits_opt : bits[bi];
    kivi_cache *c = fill(B, HK, D, S, bits[bi], vb, &k0, &v0);
    const double t = time_decode(c, B, HQ, D, q, out);
    const size_t b = cache_bytes(c, B);
    const double err = check_seq0(c, HK, HQ, D, S, bits[bi], vb, q, out);
    printf("%5d %4d %7d %5d | %10.1f %9.1f %8.1f | %10.1f %8.1f | %6.2fx %9.2e\n", B, HQ, S, bits[bi], t * 1e6,
           b / 1e6, b / t / 1e9, t16 * 1e6, b16 / t16 / 1e9, t16 / t, err);
    if (js)
      fprintf(js,
              "%s    {\"bits\": %d, \"v_bits\": %d, \"group\": 32, \"residual\": 128, \"batch\": %d, \"n_q_heads\": %d, "
              "\"n_kv_heads\": %d, \"seq_len\": %d, \"head_dim\": %d, \"device\": \"%s\", \"time_us\": %.3f, "
              "\"bytes_read\": %zu, \"gbps\": %.3f, \"rel_err_vs_ref\": %.3e, \"fp16_time_us\": %.3f, "
              "\"fp16_bytes_read\": %zu}",
              *first ? "" : ",\n", bits[bi], vb, B, HQ, HK, S, D, on_gpu ? "gpu" : "host", t * 1e6, b, b / t / 1e9, err,
              t16 * 1e6, b16);
    *first = 0;
    kivi_cache_destroy(c);
    free(k0);
    free(v0);
  }
  free(q);
  free(out);
}

/* P new tokens of sequence 0 through one extend call on cache c, which holds C tokens of it, HQ
 * query heads over HK kv-heads of head_dim D, inputs in device memory: median seconds of n calls;
 * *err: the largest error of rows 0, P / 2 and P - 1 against the double reference over kd, vd
 * ([C + P][HK][D]: the cache's C tokens dequantized, in double; the new tokens are written here). */
static double time_extend(kivi_cache *c, int HQ, int HK, int D, int P, int C, double *kd, double *vd, int n,
                          const float *q, const float *k, const float *v, double *err, unsigned *kernels) {
  const size_t nq = (size_t)P * HQ * D, nk = (size_t)P * HK * D, nc = (size_t)C * HK * D;
  void *dq, *dk, *dv, *dout;
  TRY(kivi_context_alloc(ctx, nq * 4, &dq));
  TRY(kivi_context_alloc(ctx, nk * 4, &dk));
  TRY(kivi_context_alloc(ctx, nk * 4, &dv));
  TRY(kivi_context_alloc(ctx, nq * 4, &dout));
  TRY(kivi_context_upload(ctx, dq, q, nq * 4));
  TRY(kivi_context_upload(ctx, dk, k, nk * 4));
  TRY(kivi_context_upload(ctx, dv, v, nk * 4));
  const int id = 0;
  const float scale = 1.0f / sqrtf((float)D);
  double *t = malloc(sizeof(double) * (size_t)(n + 1));
  for (int i = 0; i <= n; ++i) { /* the first call grows the scratch buffers */
    const double t0 = now_s();
    TRY(kivi_attention_extend(c, 0, 1, &id, &P, HQ, dq, dk, dv, scale, dout, NULL, KIVI_MEM_DEVICE));
    t[i] = now_s() - t0;
  }
  TRY(kivi_cache_last_kernels(c, kernels));
  qsort(t + 1, (size_t)n, sizeof(double), cmp_double);
  const double med = t[1 + n / 2];
  float *out = malloc(nq * 4);
  TRY(kivi_context_download(ctx, out, dout, nq * 4));
  double *ref = malloc(sizeof(double) * HQ * D);
  for (size_t i = 0; i < nk; ++i) {
    kd[nc + i] = k[i];
    vd[nc + i] = v[i];
  }
  const int rows[3] = {0, P / 2, P - 1};
  double num = 0, den = 0;
  for (int ri = 0; ri < 3; ++ri) {
    const size_t r = (size_t)rows[ri];
    ref_attention(C + rows[ri] + 1, HK, HQ, D, kd, vd, q + r * HQ * D, scale, ref, NULL);
    for (int i = 0; i < HQ * D; ++i) {
      num = fmax(num, fabs(out[r * HQ * D + i] - ref[i]));
      den = fmax(den, fabs(ref[i]));
    }
  }
  *err = num / den;
  free(ref); free(out); free(t);
  kivi_context_free(ctx, dq);
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  kivi_context_free(ctx, dout);
  return med;
}

/* One extend call of P new tokens (a prompt) on an empty 2-bit cache of attention mode `mode`:
 * time_extend with C = 0. */
static double time_prompt(int mode, int HQ, int HK, int D, int P, int n, const float *q, const float *k,
                          const float *v, double *err, unsigned *kernels) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, HK, D, 1, P);
  cfg.attention = mode;
  kivi_cache *c;
  TRY(kivi_cache_create(ctx, &cfg, &c));
  double *kd = malloc(sizeof(double) * P * HK * D), *vd = malloc(sizeof(double) * P * HK * D);
  const double med = time_extend(c, HQ, HK, D, P, 0, kd, vd, n, q, k, v, err, kernels);
  free(kd); free(vd);
  kivi_cache_destroy(c);
  return med;
}

/* Random new tokens for the prompt and chunk tables: q [P][HQ][D], k and v [P][HK][D]. */
static void new_tokens(int P, int HQ, int HK, int D, float **q, float **k, float **v) {
  const size_t nq = (size_t)P * HQ * D, nk = (size_t)P * HK * D;
  *q = malloc(nq * 4);
  *k = malloc(nk * 4);
  *v = malloc(nk * 4);
  for (size_t i = 0; i < nq; ++i) (*q)[i] = urand();
  for (size_t i = 0; i < nk; ++i) {
    (*k)[i] = urand() * ((i % D) == 3 ? 8.0f : 1.0f);
    (*v)[i] = urand() + 0.25f * (float)((i % D) % 5);
  }
}

/* The prompt table (--prompt P): the layouts' extend calls, fast and fp32 mode side by side. */
static void prompt_table(int P, FILE *js) {
  const int lay[3][3] = {{32, 32, 128}, {32, 8, 128}, {9, 3, 64}};
  printf("\nprompt attention: one extend call of %d new tokens on an empty cache, inputs fp32 in device memory, "
         "median (fast: %d calls, fp32 mode: %d)\n", P, reps, reps < 3 ? reps : 3);
  printf("%5s %5s %4s | %10s %8s %9s %6s | %10s %9s | %7s\n", "HQ", "HK", "D", "fast_ms", "TFLOP/s", "rel_err", "kern",
         "fp32_ms", "rel_err", "speedup");
  if (js) fprintf(js, "\n  ],\n  \"prompt\": [\n");
  for (int li = 0; li < 3; ++li) {
    const int HQ = lay[li][0], HK = lay[li][1], D = lay[li][2];
    float *q, *k, *v;
    new_tokens(P, HQ, HK, D, &q, &k, &v);
    double ef, ep;
    unsigned kf, kp;
    const double tf = time_prompt(KIVI_ATTENTION_FAST, HQ, HK, D, P, reps, q, k, v, &ef, &kf);
    const double tp = time_prompt(KIVI_ATTENTION_FP32, HQ, HK, D, P, reps < 3 ? reps : 3, q, k, v, &ep, &kp);
    const double flop = 4.0 * HQ * D * ((double)P * (P + 1) / 2); /* the causal products */
    printf("%5d %5d %4d | %10.3f %8.1f %9.2e %#6x | %10.3f %9.2e | %6.1fx\n", HQ, HK, D, tf * 1e3, flop / tf / 1e12, ef,
           kf, tp * 1e3, ep, tp / tf);
    if (js)
      fprintf(js, "%s    {\"tokens\": %d, \"n_q_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
                  "\"device\": \"%s\", \"fast_ms\": %.4f, \"fast_kernels\": %u, \"fast_rel_err\": %.3e, "
                  "\"fp32_ms\": %.4f, \"fp32_rel_err\": %.3e}",
              li ? ",\n" : "", P, HQ, HK, D, on_gpu ? "gpu" : "host", tf * 1e3, kf, ef, tp * 1e3, ep);
    free(q); free(k); free(v);
  }
}

/* The chunk table (--prompt P --context C): one extend call of P new tokens over a KIVI-2 cache
 * (G 32, R 128) that holds C tokens of the sequence, for the layouts 32/8 (head_dim 128) and 9/3
 * (head_dim 64), checked on three rows against the double reference over the cache's exported
 * (dequantized) state and the new tokens. */
static void chunk_table(int P, int C, FILE *js) {
  const int lay[2][3] = {{32, 8, 128}, {9, 3, 64}};
  printf("\nchunk attention: one extend call of %d new tokens over %d cached tokens (KIVI-2, G 32, R 128), "
         "inputs fp32 in device memory, median of %d calls\n", P, C, reps);
  printf("%5s %5s %4s | %10s %9s %6s\n", "HQ", "HK", "D", "ms", "rel_err", "kern");
  if (js) fprintf(js, "\n  ],\n  \"chunk\": [\n");
  for (int li = 0; li < 2; ++li) {
    const int HQ = lay[li][0], HK = lay[li][1], D = lay[li][2];
    kivi_cache *c = fill(1, HK, D, C, 2, 2, NULL, NULL);
    size_t n;
    TRY(kivi_cache_export_seq(c, 0, 0, NULL, &n));
    unsigned char *e = malloc(n);
    TRY(kivi_cache_export_seq(c, 0, 0, e, &n));
    const ref_geom g = {D, HK, 32, 128, 2, 2, sinks_opt, vclip_opt};
    const size_t nt = ((size_t)C + P) * HK * D; /* the cache's tokens, then the new ones */
    double *kd = malloc(sizeof(double) * nt), *vd = malloc(sizeof(double) * nt);
    ref_dequant_export(&g, C, e, kd, vd);
    float *q, *k, *v;
    new_tokens(P, HQ, HK, D, &q, &k, &v);
    double err;
    unsigned kern;
    const double med = time_extend(c, HQ, HK, D, P, C, kd, vd, reps, q, k, v, &err, &kern);
    printf("%5d %5d %4d | %10.3f %9.2e %#6x\n", HQ, HK, D, med * 1e3, err, kern);
    if (js)
      fprintf(js, "%s    {\"tokens\": %d, \"context\": %d, \"n_q_heads\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
                  "\"device\": \"%s\", \"ms\": %.4f, \"kernels\": %u, \"rel_err\": %.3e}",
              li ? ",\n" : "", P, C, HQ, HK, D, on_gpu ? "gpu" : "host", med * 1e3, kern, err);
    free(e); free(kd); free(vd);
    free(q); free(k); free(v);
    kivi_cache_destroy(c);
  }
}

int main(int argc, char **argv) {
  const char *json_path = NULL;
  int quick = 0, device = KIVI_DEVICE_DEFAULT, skip_append = 0, skip_decode = 0, sweep = 0, stack_layers = 0;
  shape one = {0, 0, 0};
  int kv_heads = 0; /* --kv-heads: GQA, query heads = H of the shape */
  int head_dim = 128, layouts = 0, prompt = 0, context = 0;
  const int info_rc = kivi_cli_info(argc, argv, "kivi-bench", kivi_version_string(), bench_usage);
  if (info_rc >= 0) return info_rc;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      ++i;
      device = !strcmp(argv[i], "host") ? KIVI_DEVICE_HOST : KIVI_DEVICE_DEFAULT;
    } else if (!strcmp(argv[i], "--skip-append")) skip_append = 1;
    else if (!strcmp(argv[i], "--sweep")) sweep = 1;
    else if (!strcmp(argv[i], "--skip-decode")) skip_decode = 1;
    else if (!strcmp(argv[i], "--stream")) use_stream = 1;
    else if (!strcmp(argv[i], "--kv-heads") && i + 1 < argc) kv_heads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) head_dim = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layouts")) layouts = 1;
    else if (!strcmp(argv[i], "--prompt") && i + 1 < argc && atoi(argv[i + 1]) > 0) prompt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--context") && i + 1 < argc && atoi(argv[i + 1]) >= 160) context = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--fp32")) attention_opt = KIVI_ATTENTION_FP32;
    else if (!strcmp(argv[i], "--v-clip")) vclip_opt = KIVI_CLIP_MSE;
    else if (!strcmp(argv[i], "--sinks") && i + 1 < argc && atoi(argv[i + 1]) > 0) sinks_opt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--v-bits") && i + 1 < argc && (atoi(argv[i + 1]) == 2 || atoi(argv[i + 1]) == 4))
      v_bits_opt = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--rotate") && i + 1 < argc &&
             (!strcmp(argv[i + 1], "k") || !strcmp(argv[i + 1], "v") || !strcmp(argv[i + 1], "kv"))) {
      ++i;
      rotate_opt = (strchr(argv[i], 'k') ? KIVI_ROTATE_K : 0) | (strchr(argv[i], 'v') ? KIVI_ROTATE_V : 0);
    }
    else if (!strcmp(argv[i], "--stack") && i + 1 < argc) stack_layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shape") && i + 1 < argc && sscanf(argv[++i], "%d,%d,%d", &one.B, &one.H, &one.S) == 3 &&
             one.B > 0 && one.H > 0 && one.S > 0) {
    }
    else
      return kivi_cli_bad("kivi-bench", "unknown option, or a missing or bad value, at", argv[i]);
  }
  if (context && (!prompt || rotate_opt))
    return kivi_cli_bad("kivi-bench", "--context goes with --prompt and without --rotate, at", "--context");
  if (reps < 1) reps = 1;
  TRY(kivi_context_create(&ctx, device));
  kivi_context_info info;
  TRY(kivi_context_get_info(ctx, &info));
  on_gpu = info.on_gpu;
  const char *dev = on_gpu ? "gpu" : "host";
  printf("kivi-bench: libkivi-omp %s, %s, running on %s\n", kivi_version_string(), kivi_build_config(), dev);
  if (!on_gpu && !quick && !one.B && !stack_layers) { /* the GPU shapes take hours on host threads */
    quick = 1;
    fprintf(stderr, "kivi-bench: on host threads: the --quick shapes (--shape B,H,S for another)\n");
  }
  if (quick && reps > 5) reps = 5;
  FILE *js = NULL;
  if (json_path && !(js = fopen(json_path, "w"))) {
    fprintf(stderr, "kivi-bench: cannot write %s\n", json_path);
    return 1;
  }
  if (js) fprintf(js, "{\n  \"library\": \"libkivi-omp %s\",\n  \"device\": \"%s\",\n  \"decode\": [\n", kivi_version_string(), dev);
  if (prompt) { /* the prompt table alone */
    if (context) chunk_table(prompt, context, js);
    else prompt_table(prompt, js);
    if (js) {
      fprintf(js, "\n  ]\n}\n");
      fclose(js);
    }
    kivi_context_destroy(ctx);
    return 0;
  }

  const shape full[] = {{1, 32, 4096}, {1, 32, 32768}, {8, 32, 4096}, {8, 32, 32768}, {32, 32, 4096}};
  const shape small[] = {{1, 4, 512}, {2, 4, 2048}, {4, 8, 1024}};
  const shape *shapes = one.B ? &one : quick ? small : full; /* --shape: that decode shape only */
  const int nshapes = skip_decode || layouts ? 0 : one.B ? 1 : quick ? 3 : 5, D = head_dim, bits[2] = {2, 4};
  printf("\ndecode step, D=%d, G=32, R=128, %s, median of %d calls (wall, synchronous%s)\n", D,
         kv_heads || layouts ? "q/kv heads as noted" : "MHA", reps,
         use_stream ? ", on a CUDA stream" : "");
  printf("%5s %4s %7s %5s | %10s %9s %8s | %10s %8s | %7s %9s\n", "B", "H", "S", "bits", "time_us", "MB_read",
         "GB/s", "fp16_us", "fp16GB/s", "speedup", "rel_err");
  int first = 1;
  if (layouts) { /* q-heads / kv-heads / head_dim of common models at one (B, S) */
    const int lay[5][3] = {{32, 32, 128}, {32, 8, 128}, {28, 4, 128}, {64, 8, 128}, {9, 3, 64}};
    const int B = one.B ? one.B : 8, S = one.B ? one.S : 32768;
    for (int li = 0; li < 5; ++li) decode_shape(B, lay[li][0], lay[li][1], lay[li][2], S, js, &first);
  }
  for (int si = 0; si < nshapes; ++si) {
    const shape sh = shapes[si];
    const int HK = kv_heads > 0 && sh.H % kv_heads == 0 ? kv_heads : sh.H; /* kv-heads (GQA when < H) */
    fprintf(stderr, "kivi-bench: decode shape %d/%d (B %d, H %d, S %d)\n", si + 1, nshapes, sh.B, sh.H, sh.S);
    decode_shape(sh.B, sh.H, HK, D, sh.S, js, &first);
  }
  if (js) fprintf(js, "\n  ],\n  \"sweep\": [\n");
  if (sweep) { /* step time vs context length, B = 1, 32 heads */
    printf("\nsweep: decode step vs context, B=1, H=32, D=%d, median of %d\n%7s | %10s %10s %10s\n", D, reps, "S",
           "fp16_us", "2bit_us", "4bit_us");
    first = 1;
    for (int S = 1024; S <= (quick ? 4096 : 65536); S *= 2) {
      const int sb[3] = {16, 2, 4};
      double t[3];
      const size_t qn = (size_t)32 * D;
      float *q = malloc(qn * 4), *out = malloc(qn * 4);
      for (size_t i = 0; i < qn; ++i) q[i] = urand();
      for (int bi = 0; bi < 3; ++bi) {
        kivi_cache *c = fill(1, 32, D, S, sb[bi], sb[bi], NULL, NULL);
        t[bi] = time_decode(c, 1, 32, D, q, out);
        if (js)
          fprintf(js, "%s    {\"bits\": %d, \"batch\": 1, \"n_q_heads\": 32, \"seq_len\": %d, \"head_dim\": %d, "
                      "\"device\": \"%s\", \"time_us\": %.3f}",
                  first ? "" : ",\n", sb[bi], S, D, dev, t[bi] * 1e6);
        first = 0;
        kivi_cache_destroy(c);
      }
      printf("%7d | %10.1f %10.1f %10.1f\n", S, t[0] * 1e6, t[1] * 1e6, t[2] * 1e6);
      free(q);
      free(out);
    }
  }
  if (js) fprintf(js, "\n  ],\n  \"append\": [\n");

  /* append/quantize throughput: one prefill of S tokens, 32 kv-heads x 128, fp16 input already
   * in device memory; GB/s of input read (K and V) */
  const int AS = quick ? 2048 : 32768, AH = quick ? 8 : 32;
  printf("\nappend (prefill of %d tokens, %d kv-heads x %d, fp16 input in device memory), median of %d\n", AS, AH, D,
         quick ? 3 : 5);
  printf("%5s | %10s %10s\n", "bits", "time_ms", "GB/s_in");
  first = 1;
  for (int bi = 0; bi < 3 && !skip_append; ++bi) {
    const int b = bi < 2 ? bits[bi] : 16;
    const size_t n = (size_t)AS * AH * D;
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; ++i) h[i] = ref_f16(urand());
    void *dk, *dv;
    TRY(kivi_context_alloc(ctx, n * 2, &dk));
    TRY(kivi_context_alloc(ctx, n * 2, &dv));
    TRY(kivi_context_upload(ctx, dk, h, n * 2));
    TRY(kivi_context_upload(ctx, dv, h, n * 2));
    kivi_cache_config cfg;
    kivi_cache_config_init(&cfg, 1, AH, D, 1, AS);
    cfg.k_bits = cfg.v_bits = b;
    cfg.v_clip = vclip_opt;
    kivi_cache *c;
    TRY(kivi_cache_create(ctx, &cfg, &c));
    const int nrep = quick ? 3 : 5, id = 0;
    double t[5];
    for (int r = 0; r < nrep + 1; ++r) {
      TRY(kivi_cache_reset_seq(c, 0));
      const double t0 = now_s();
      TRY(kivi_cache_append(c, 0, 1, &id, &AS, dk, dv, KIVI_F16, KIVI_MEM_DEVICE));
      if (r > 0) t[r - 1] = now_s() - t0; /* the first call grows the scratch buffers */
    }
    qsort(t, (size_t)nrep, sizeof(double), cmp_double);
    const double med = t[nrep / 2], gb = 2.0 * n * 2 / med / 1e9;
    printf("%5d | %10.3f %10.1f\n", b, med * 1e3, gb);
    if (js)
      fprintf(js, "%s    {\"bits\": %d, \"tokens\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, \"device\": \"%s\", "
                  "\"time_ms\": %.4f, \"gbps_input\": %.3f}",
              first ? "" : ",\n", b, AS, AH, D, dev, med * 1e3, gb);
    first = 0;
    kivi_cache_destroy(c);
    kivi_context_free(ctx, dk);
    kivi_context_free(ctx, dv);
    free(h);
  }
  /* the decode step's append: one token for each of 8 sequences of 4096 tokens (device input),
   * the per-layer cost of a generation step before the attention */
  if (!skip_append) {
    const int B = 8, AS1 = quick ? 512 : 4096;
    kivi_cache_config cfg;
    kivi_cache_config_init(&cfg, 1, AH, D, B, AS1);
    cfg.v_clip = vclip_opt;
    kivi_cache *c;
    TRY(kivi_cache_create(ctx, &cfg, &c));
    const size_t n1 = (size_t)B * AH * D;
    uint16_t *h = malloc(n1 * 2);
    for (size_t i = 0; i < n1; ++i) h[i] = ref_f16(urand());
    void *dk;
    TRY(kivi_context_alloc(ctx, n1 * 2, &dk));
    TRY(kivi_context_upload(ctx, dk, h, n1 * 2));
    int ids[8], ones[8];
    for (int i = 0; i < B; ++i) { ids[i] = i; ones[i] = 1; }
    const int pre = AS1 - 64; /* one prefill, then 64 timed one-token appends */
    int pres[8];
    for (int i = 0; i < B; ++i) pres[i] = pre;
    uint16_t *hp = malloc((size_t)B * pre * AH * D * 2);
    for (size_t i = 0; i < (size_t)B * pre * AH * D; ++i) hp[i] = h[i % n1];
    TRY(kivi_cache_append(c, 0, B, ids, pres, hp, hp, KIVI_F16, KIVI_MEM_HOST));
    free(hp);
    double tt[64];
    for (int r = 0; r < 64; ++r) {
      const double t0 = now_s();
      TRY(kivi_cache_append(c, 0, B, ids, ones, dk, dk, KIVI_F16, KIVI_MEM_DEVICE));
      tt[r] = now_s() - t0;
    }
    qsort(tt, 64, sizeof(double), cmp_double);
    printf("decode-step append (1 token x %d sequences at ~%d tokens, %d kv-heads, 2-bit): %.1f us median\n", B, AS1,
           AH, tt[32] * 1e6);
    if (js)
      fprintf(js, "%s    {\"bits\": 2, \"tokens\": 1, \"batch\": %d, \"n_kv_heads\": %d, \"head_dim\": %d, "
                  "\"device\": \"%s\", \"time_us_per_call\": %.3f}",
              first ? "" : ",\n", B, AH, D, dev, tt[32] * 1e6);
    kivi_context_free(ctx, dk);
    free(h);
    kivi_cache_destroy(c);
  }
  if (stack_layers > 0) { /* a whole decode step: every layer appends and attends */
    if (js) fprintf(js, "\n  ],\n  \"stack\": [\n");
    printf("\ndecode step of a %d-layer stack (append + decode per layer, 2-bit, device buffers), median of %d steps\n",
           stack_layers, reps);
    printf("%5s %4s %7s | %12s %12s | %7s\n", "B", "H", "S", "sync_us", "async_us", "speedup");
    first = 1;
    for (int bi = 0; bi < 2; ++bi) {
      const stack_shape ss = {stack_layers, quick ? 8 : 32, quick ? 8 : 32, quick ? 64 : 128, bi ? 8 : 1,
                              quick ? 512 : 4096, reps, 2, KIVI_MAX_ASYNC_LANES, 0, 0};
      stack_inputs in;
      TRY(stack_inputs_init(&in, ctx, &ss));
      double med[2], mean[2], *ts = malloc((size_t)reps * sizeof *ts);
      void *dout;
      TRY(kivi_context_alloc(ctx, (size_t)ss.layers * ss.batch * ss.HQ * ss.D * 4, &dout));
      for (int r = 0; r < 2; ++r) {
        kivi_cache *c = NULL;
        TRY(stack_cache(&in, &ss, &c));
        TRY(stack_steps(&in, &ss, c, r, dout, ts));
        stack_median_mean(ts, reps, &med[r], &mean[r]);
        kivi_cache_destroy(c);
      }
      printf("%5d %4d %7d | %12.1f %12.1f | %6.2fx\n", ss.batch, ss.HQ, ss.context, 1e6 * med[0], 1e6 * med[1],
             med[0] / med[1]);
      if (js)
        fprintf(js, "%s    {\"layers\": %d, \"batch\": %d, \"n_heads\": %d, \"head_dim\": %d, \"context\": %d, "
                    "\"bits\": 2, \"device\": \"%s\", \"sync_us_per_step\": %.3f, \"async_us_per_step\": %.3f}",
                first ? "" : ",\n", ss.layers, ss.batch, ss.HQ, ss.D, ss.context, dev, 1e6 * med[0], 1e6 * med[1]);
      first = 0;
      kivi_context_free(ctx, dout);
      free(ts);
      stack_inputs_free(&in);
    }
  }
  if (js) fprintf(js, "\n  ],\n  \"memory\": [\n");

  /* memory table: one Llama-2-7B layer (32 kv-heads x 128) at 4096 tokens, x 32 layers */
  const int ML = quick ? 1024 : 4096;
  printf("\nmemory, Llama-2-7B shape (32 layers x 32 kv-heads x 128) at %d tokens: one layer measured, x32\n", ML);
  printf("%9s | %12s %12s %12s %12s | %10s %7s\n", "k/v bits", "codes_MB", "scales_MB", "resid_MB", "total_MB",
         "bits/elem", "vs fp16");
  const int mb[4][2] = {{16, 16}, {4, 4}, {2, 2}, {2, 4}};
  first = 1;
  for (int i = 0; i < 4; ++i) {
    kivi_cache *c = fill(1, 32, 128, ML, mb[i][0], mb[i][1], NULL, NULL);
    kivi_cache_stats st;
    TRY(kivi_cache_get_stats(c, &st));
    printf("%4d/%-4d | %12.2f %12.2f %12.2f %12.2f | %10.3f %6.2fx\n", mb[i][0], mb[i][1], 32 * st.code_bytes / 1e6,
           32 * st.scale_zero_bytes / 1e6, 32 * st.residual_bytes / 1e6, 32 * st.total_bytes / 1e6, st.bits_per_element,
           (double)st.fp16_bytes / (double)st.total_bytes);
    if (js)
      fprintf(js, "%s    {\"k_bits\": %d, \"v_bits\": %d, \"tokens\": %d, \"layers\": 32, \"total_bytes\": %zu, "
                  "\"code_bytes\": %zu, \"scale_zero_bytes\": %zu, \"residual_bytes\": %zu, \"fp16_bytes\": %zu, "
                  "\"bits_per_element\": %.4f}",
              first ? "" : ",\n", mb[i][0], mb[i][1], ML, 32 * st.total_bytes, 32 * st.code_bytes,
              32 * st.scale_zero_bytes, 32 * st.residual_bytes, 32 * st.fp16_bytes, st.bits_per_element);
    first = 0;
    kivi_cache_destroy(c);
  }
  if (js) {
    fprintf(js, "\n  ]\n}\n");
    fclose(js);
    printf("\nwrote %s\n", json_path);
  }
  kivi_context_destroy(ctx);
  return 0;
}
