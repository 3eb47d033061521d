/* The forward pass on the cache's device (examples/llm/model_dev.c: the GPU when there is one,
 * cuBLAS when the build found it) against the host model (examples/llm/model.c: fp32 activations,
 * its own matrix products and kernels), on a random small model whose weights are exactly
 * representable in fp16, so the two runs hold the same model:
 *  - a batch of three sequences (prompts of 5, 17 and 40 tokens in one chunked call, then 16
 *    decode steps) gives each sequence's logits within LOGIT_REL_TOL of max |logit| of the host
 *    model's (run one sequence at a time), with the same greedy tokens wherever the host's top
 *    two logits are further apart than twice that; with LLM_DEV_F32 (fp32 weights and products,
 *    the host model's arithmetic) within F32_LOGIT_REL_TOL;
 *  - every token's logits of a prompt run in chunks within the same bounds;
 *  - a batch of four generates, for each sequence, the greedy tokens that sequence generates
 *    alone, with logits within BATCH_REL_TOL, and with batch-invariant steps
 *    (llm_dev_batch.invariant) the same tokens and logits bit for bit;
 *  - on a GPU, the same calls on one CUDA stream give the same tokens and logits bit for bit;
 *  - bad arguments are refused with KIVI_ERR_ARG. */
#include <omp.h>

#include "../../examples/llm/model.h"
#include "../../examples/llm/model_dev.h"
#include "../check_util.h"

/* fp16 activations (the products' inputs) against fp32 ones: measured 2e-3 .. 5e-3 of max |logit| */
#define LOGIT_REL_TOL 2e-2
/* LLM_DEV_F32 against the host model: the same fp32 operations summed in another order, which
 * alone moves a logit by about 3e-6 of the largest (two tokens); over 40 tokens the fp16 caches
 * round a few K and V values a rounding apart to neighbouring fp16 values, and this model's
 * attention is sharp: measured 1.7e-4 on host threads (fp16 products: 3e-3) */
#define F32_LOGIT_REL_TOL 1e-3
/* the same code at another batch size: only the products' summation order may differ (cuBLAS) */
#define BATCH_REL_TOL 1e-3

enum { NL = 2, NH = 4, NKV = 2, HD = 128, DIM = NH * HD, FFN = 512, VOCAB = 256 };

static float *weights(size_t n, uint64_t seed, float amp) { /* fp16-exact values */
  float *w = tu_random(n, seed, amp);
  for (size_t i = 0; i < n; ++i) w[i] = (float)(_Float16)w[i];
  return w;
}

static void host_model(llm_model *m) {
  memset(m, 0, sizeof *m);
  *m = (llm_model){.n_layers = NL, .n_heads = NH, .n_kv_heads = NKV, .head_dim = HD, .dim = DIM, .ffn_dim = FFN,
                   .n_vocab = VOCAB, .ctx_train = 4096, .rope_base = 10000.0f, .rms_eps = 1e-5f};
  const float aD = sqrtf(3.0f / DIM), aF = sqrtf(3.0f / FFN);
  m->tok_embd = weights((size_t)VOCAB * DIM, 1, 1.0f);
  m->output = weights((size_t)VOCAB * DIM, 2, 4 * aD);
  m->out_norm = weights(DIM, 3, 0.25f);
  for (int i = 0; i < DIM; ++i) m->out_norm[i] += 1.0f;
  m->layers = calloc(NL, sizeof *m->layers);
  for (int l = 0; l < NL; ++l) {
    llm_layer *L = &m->layers[l];
    const uint64_t s = 100 * (uint64_t)(l + 1);
    L->attn_norm = weights(DIM, s + 1, 0.25f);
    L->ffn_norm = weights(DIM, s + 2, 0.25f);
    for (int i = 0; i < DIM; ++i) L->attn_norm[i] += 1.0f, L->ffn_norm[i] += 1.0f;
    L->wq = weights((size_t)DIM * DIM, s + 3, 2 * aD);
    L->wk = weights((size_t)NKV * HD * DIM, s + 4, 2 * aD);
    L->wv = weights((size_t)NKV * HD * DIM, s + 5, aD);
    L->wo = weights((size_t)DIM * DIM, s + 6, aD);
    L->w_gate = weights((size_t)FFN * DIM, s + 7, aD);
    L->w_up = weights((size_t)FFN * DIM, s + 8, aD);
    L->w_down = weights((size_t)DIM * FFN, s + 9, aF);
  }
}

static void host_model_free(llm_model *m) {
  for (int l = 0; l < NL; ++l) {
    llm_layer *L = &m->layers[l];
    float *p[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
    for (int i = 0; i < 9; ++i) free(p[i]);
  }
  free(m->layers);
  free(m->tok_embd);
  free(m->output);
  free(m->out_norm);
}

static kivi_cache *fp16_cache(kivi_context *ctx, int seqs) { return tu_cache(ctx, NL, NKV, HD, seqs, 256, 16, 16, 32, 32); }

static double max_abs(const float *x, int n) {
  double m = 0;
  for (int i = 0; i < n; ++i) m = fmax(m, fabs(x[i]));
  return m;
}
static int top(const float *x, int n, double *margin) {
  int a = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[a]) a = i;
  double second = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (i != a && x[i] > second) second = x[i];
  *margin = x[a] - second;
  return a;
}

typedef struct fixture {
  kivi_context *ctx;
  kivi_context_info info;
  llm_model hm;
  llm_dev_model dm;
} fixture;

static void setup(fixture *f, llm_dev_precision precision) {
  f->ctx = tu_context();
  ck_assert_int_eq(kivi_context_get_info(f->ctx, &f->info), KIVI_OK);
  host_model(&f->hm);
  char err[256];
  ck_assert_msg(llm_dev_model_from_host(&f->dm, &f->hm, f->info.device, precision, err, sizeof err) == 0, "%s", err);
  printf("model_dev: on %s, products: %s\n", f->info.on_gpu ? "the GPU" : "the host", llm_dev_matmul_name(&f->dm));
  ck_assert_int_eq(f->dm.f32, precision == LLM_DEV_F32);
}
static void teardown(fixture *f) {
  llm_dev_model_free(&f->dm);
  host_model_free(&f->hm);
  kivi_context_destroy(f->ctx);
}

static int prompt_token(int seq, int j) { return (int)((7919u * (unsigned)(seq + 1) + 104729u * (unsigned)j) % VOCAB); }

/* _i & 1: both models Hadamard-rotate K, q and V (the output back): the same model, so the
 * same bounds; and what reaches the caches must be the rotated vectors on both sides, which
 * unrotated ones (as large as the rotated) would miss by far more than ROTATED_KV_TOL.
 * _i & 2: the device model in fp32 (LLM_DEV_F32), against the tighter bounds. */
#define ROTATED_KV_TOL 5e-2 /* of max |K or V| of the host cache: fp16 activations, measured below 1e-2 */
/* fp32: the caches' fp16 K and V may differ where fp32 values a rounding apart fall on either side
 * of an fp16 rounding boundary: by one fp16 step, at most 2^-10 of max |K or V| */
#define F32_ROTATED_KV_TOL 1e-3
START_TEST(dev_matches_host) {
  fixture f;
  const int f32 = (_i & 2) != 0;
  setup(&f, f32 ? LLM_DEV_F32 : LLM_DEV_F16);
  enum { S = 3, STEPS = 16 };
  const int plen[S] = {5, 17, 40};
  const int rot = _i & 1 ? LLM_ROTATE_K | LLM_ROTATE_V : 0;
  const double tol = f32 ? F32_LOGIT_REL_TOL : LOGIT_REL_TOL, kv_tol = f32 ? F32_ROTATED_KV_TOL : ROTATED_KV_TOL;
  llm_fake_quant fq;
  memset(&fq, 0, sizeof fq);
  fq.rotate = rot;
  f.dm.rotate = rot;
  kivi_cache *dc = fp16_cache(f.ctx, S), *hc = fp16_cache(f.ctx, S);
  llm_dev_batch b;
  ck_assert_int_eq(llm_dev_batch_init(&b, &f.dm, 64, S, S), 0);
  llm_session hs[S];
  for (int i = 0; i < S; ++i) ck_assert_int_eq(llm_session_init(&hs[i], &f.hm, hc, i, 64, rot ? &fq : NULL), 0);
  int ids[S], nn[S], pos[S], tok[64], best[S];
  float *dl = malloc((size_t)S * VOCAB * sizeof *dl), *hl = malloc(VOCAB * sizeof *hl);
  int T = 0;
  for (int i = 0; i < S; ++i) {
    ids[i] = i;
    nn[i] = plen[i];
    pos[i] = 0;
    for (int j = 0; j < plen[i]; ++j) tok[T++] = prompt_token(i, j);
  }
  double worst = 0;
  int agree = 0, compared = 0;
  llm_dev_times t = {0};
  for (int step = 0; step <= STEPS; ++step) {
    ck_assert_int_eq(llm_dev_forward(&b, dc, S, ids, nn, pos, tok, dl, 0, best, &t), KIVI_OK);
    for (int i = 0, r = 0; i < S; r += nn[i], ++i) {
      ck_assert_int_eq(llm_forward(&hs[i], tok + r, nn[i], hl, 0), KIVI_OK);
      const double scale = max_abs(hl, VOCAB);
      double err = 0, margin;
      for (int c = 0; c < VOCAB; ++c) err = fmax(err, fabs((double)dl[(size_t)i * VOCAB + c] - hl[c]));
      worst = fmax(worst, err / scale);
      ck_assert_msg(err <= tol * scale, "seq %d step %d: logit error %.3g of max %.3g", i, step, err, scale);
      const int h = top(hl, VOCAB, &margin);
      if (margin > 2 * tol * scale) {
        ck_assert_int_eq(best[i], h);
        ++agree;
      }
      ++compared;
    }
    for (int i = 0; i < S; ++i) { /* every sequence continues with the device's greedy token */
      pos[i] += nn[i];
      nn[i] = 1;
      tok[i] = best[i];
    }
  }
  printf("model_dev%s vs host model%s: logits within %.2e of max |logit| (bound %.0e); %d of %d greedy tokens "
         "compared and equal; decode-step parts (s): matmul %.3f attention %.3f append %.3f other %.3f\n",
         f32 ? " fp32" : "", rot ? ", K and V rotated" : "", worst, tol, agree, compared, t.matmul, t.attention,
         t.append, t.other);
  ck_assert_int_gt(agree, compared / 2);
  if (rot) { /* the fp16 caches' K and V (both exports: K rows, then V rows) side by side */
    size_t nd = 0, nh = 0;
    ck_assert_int_eq(kivi_cache_export_seq(dc, 2, NL - 1, NULL, &nd), KIVI_OK);
    ck_assert_int_eq(kivi_cache_export_seq(hc, 2, NL - 1, NULL, &nh), KIVI_OK);
    ck_assert_uint_eq(nd, nh);
    _Float16 *ed = malloc(nd), *eh = malloc(nh);
    ck_assert_int_eq(kivi_cache_export_seq(dc, 2, NL - 1, ed, &nd), KIVI_OK);
    ck_assert_int_eq(kivi_cache_export_seq(hc, 2, NL - 1, eh, &nh), KIVI_OK);
    double m = 0, e = 0;
    for (size_t i = 0; i < nh / 2; ++i) {
      m = fmax(m, fabs((double)eh[i]));
      e = fmax(e, fabs((double)ed[i] - (double)eh[i]));
    }
    printf("rotated K and V in the caches%s: device against host within %.2e of max %.3g (bound %.0e)\n",
           f32 ? " (fp32 model)" : "", e / m, m, kv_tol);
    ck_assert_msg(e <= kv_tol * m, "cached K/V differ by %.3g of max %.3g", e, m);
    free(ed);
    free(eh);
  }
  free(dl);
  free(hl);
  for (int i = 0; i < S; ++i) llm_session_free(&hs[i]);
  llm_dev_batch_free(&b);
  kivi_cache_destroy(dc);
  kivi_cache_destroy(hc);
  teardown(&f);
}
END_TEST

/* every token's logits of a chunked prompt (what kivi-run ppl scores) against the host model's;
 * _i = 1: the device model in fp32 */
START_TEST(all_logits_match_host) {
  fixture f;
  setup(&f, _i ? LLM_DEV_F32 : LLM_DEV_F16);
  const double tol = _i ? F32_LOGIT_REL_TOL : LOGIT_REL_TOL;
  enum { N = 40, CHUNK = 16 };
  kivi_cache *dc = fp16_cache(f.ctx, 1), *hc = fp16_cache(f.ctx, 1);
  llm_dev_batch b;
  ck_assert_int_eq(llm_dev_batch_init(&b, &f.dm, CHUNK, 1, CHUNK), 0);
  llm_session hs;
  ck_assert_int_eq(llm_session_init(&hs, &f.hm, hc, 0, CHUNK, NULL), 0);
  float *dl = malloc((size_t)CHUNK * VOCAB * sizeof *dl), *hl = malloc((size_t)CHUNK * VOCAB * sizeof *hl);
  int tok[N], id = 0, best = -1;
  for (int j = 0; j < N; ++j) tok[j] = prompt_token(5, j);
  double worst = 0;
  for (int i = 0; i < N; i += CHUNK) {
    int n = N - i < CHUNK ? N - i : CHUNK, pos = i;
    /* all_logits with best, or with more rows than logit_rows, is refused */
    ck_assert_int_eq(llm_dev_forward(&b, dc, 1, &id, &n, &pos, tok + i, dl, 1, &best, NULL), KIVI_ERR_ARG);
    ck_assert_int_eq(llm_dev_forward(&b, dc, 1, &id, &n, &pos, tok + i, dl, 1, NULL, NULL), KIVI_OK);
    ck_assert_int_eq(llm_forward(&hs, tok + i, n, hl, 1), KIVI_OK);
    for (int r = 0; r < n; ++r) {
      const float *a = dl + (size_t)r * VOCAB, *h = hl + (size_t)r * VOCAB;
      double err = 0;
      for (int c = 0; c < VOCAB; ++c) err = fmax(err, fabs((double)a[c] - h[c]));
      worst = fmax(worst, err / max_abs(h, VOCAB));
    }
  }
  printf("model_dev%s all-token logits vs host model: within %.2e of max |logit| (bound %.0e)\n", _i ? " fp32" : "",
         worst, tol);
  ck_assert(worst <= tol);
  free(dl);
  free(hl);
  llm_session_free(&hs);
  llm_dev_batch_free(&b);
  kivi_cache_destroy(dc);
  kivi_cache_destroy(hc);
  teardown(&f);
}
END_TEST

/* batch B, each sequence alone: greedy tokens and logits; stream: on the cache's CUDA stream
 * (llm_dev_batch_set_stream), then *kern and *waits (if not NULL) the kernels the decode steps
 * launched on it and the regions that waited for it (kivi_cache_stats); invariant: the batch's
 * decode steps one sequence at a time (llm_dev_batch.invariant) */
static void generate_on(fixture *f, int kbits, int first, int B, int steps, int *out_tok, float *out_logits, int stream,
                        int invariant, int64_t *kern, int64_t *waits) {
  kivi_cache *c = tu_cache(f->ctx, NL, NKV, HD, 4, 256, kbits, kbits, 32, 32);
  llm_dev_batch b;
  ck_assert_int_eq(llm_dev_batch_init(&b, &f->dm, 64, B, B), 0);
  b.invariant = invariant;
  if (stream) ck_assert_int_eq(llm_dev_batch_set_stream(&b, c, 1), 0);
  kivi_cache_stats s0 = {0}, s1;
  int ids[4], nn[4], pos[4], tok[64], best[4];
  float *lg = malloc((size_t)B * VOCAB * sizeof *lg);
  for (int i = 0; i < B; ++i) {
    ids[i] = first + i;
    nn[i] = 9 + 4 * (first + i);
    pos[i] = 0;
  }
  for (int i = 0, T = 0; i < B; ++i)
    for (int j = 0; j < nn[i]; ++j) tok[T++] = prompt_token(first + i, j);
  for (int step = 0; step < steps; ++step) {
    if (step == 1) ck_assert_int_eq(kivi_cache_get_stats(c, &s0), KIVI_OK); /* after the prompts */
    ck_assert_int_eq(llm_dev_forward(&b, c, B, ids, nn, pos, tok, lg, 0, best, NULL), KIVI_OK);
    for (int i = 0; i < B; ++i) {
      out_tok[(size_t)(first + i) * steps + step] = best[i];
      memcpy(out_logits + ((size_t)(first + i) * steps + step) * VOCAB, lg + (size_t)i * VOCAB, VOCAB * sizeof *lg);
      pos[i] += nn[i];
      nn[i] = 1;
      tok[i] = best[i];
    }
  }
  ck_assert_int_eq(kivi_cache_get_stats(c, &s1), KIVI_OK);
  if (kern) *kern = s1.stream_kernels - s0.stream_kernels;
  if (waits) *waits = s1.stream_waits - s0.stream_waits;
  if (stream) ck_assert_int_eq(llm_dev_batch_set_stream(&b, c, 0), 0);
  free(lg);
  llm_dev_batch_free(&b);
  kivi_cache_destroy(c);
}
static void generate(fixture *f, int kbits, int first, int B, int steps, int *out_tok, float *out_logits) {
  generate_on(f, kbits, first, B, steps, out_tok, out_logits, 0, 0, NULL, NULL);
}

START_TEST(batch_equals_single) {
  fixture f;
  setup(&f, LLM_DEV_F16);
  enum { B = 4, STEPS = 20 };
  static const int bits[] = {2, 4, 16};
  int *bt = malloc(B * STEPS * sizeof *bt), *st = malloc(B * STEPS * sizeof *st);
  float *bl = malloc((size_t)B * STEPS * VOCAB * sizeof *bl), *sl = malloc((size_t)B * STEPS * VOCAB * sizeof *sl);
  for (int k = 0; k < 3; ++k) {
    generate(&f, bits[k], 0, B, STEPS, bt, bl);
    for (int i = 0; i < B; ++i) generate(&f, bits[k], i, 1, STEPS, st, sl);
    double worst = 0;
    for (int i = 0; i < B * STEPS; ++i) {
      const float *a = bl + (size_t)i * VOCAB, *s = sl + (size_t)i * VOCAB;
      double err = 0;
      for (int c = 0; c < VOCAB; ++c) err = fmax(err, fabs((double)a[c] - s[c]));
      worst = fmax(worst, err / max_abs(s, VOCAB));
      ck_assert_int_eq(bt[i], st[i]);
    }
    printf("model_dev %d-bit cache: batch %d equals one sequence at a time over %d greedy tokens each, logits "
           "within %.2e (bound %.0e)\n", bits[k], B, STEPS, worst, BATCH_REL_TOL);
    ck_assert(worst <= BATCH_REL_TOL);
    /* batch-invariant steps (on the stream where there is one, as kivi-run runs them): the
     * tokens and logits of each sequence alone, bit for bit */
    const int stream = f.info.on_gpu && f.dm.blas;
    generate_on(&f, bits[k], 0, B, STEPS, bt, bl, stream, 1, NULL, NULL);
    ck_assert_int_eq(memcmp(bt, st, B * STEPS * sizeof *bt), 0);
    ck_assert_int_eq(memcmp(bl, sl, (size_t)B * STEPS * VOCAB * sizeof *bl), 0);
    printf("model_dev %d-bit cache, batch-invariant steps%s: tokens and logits bit-identical to each sequence "
           "alone\n", bits[k], stream ? " on a stream" : "");
  }
  free(bt);
  free(st);
  free(bl);
  free(sl);
  teardown(&f);
}
END_TEST

/* Every forward call on one CUDA stream (the model's own kernels too, through
 * kivi_cache_stream_begin) gives the same greedy tokens and logits, bit for bit, as the calls
 * waited for one by one; each decode step launches at least the model's 12 kernels (embedding,
 * RoPE table, 4 a layer, the last norm, the argmax) on the stream, and on the 2-bit cache no
 * region waits for it.  Where there is no stream (host, no cuBLAS) the batch refuses it. */
START_TEST(stream_equals_sync) {
  fixture f;
  setup(&f, LLM_DEV_F16);
  enum { B = 2, STEPS = 12, MODEL_KERNELS = 4 + 4 * NL };
  llm_dev_batch b;
  kivi_cache *c = fp16_cache(f.ctx, B);
  ck_assert_int_eq(llm_dev_batch_init(&b, &f.dm, 8, B, B), 0);
  const int have = llm_dev_batch_set_stream(&b, c, 1) == 0;
  if (have) ck_assert_int_eq(llm_dev_batch_set_stream(&b, c, 0), 0);
  llm_dev_batch_free(&b);
  kivi_cache_destroy(c);
  if (!have) {
    ck_assert(!f.info.on_gpu || !f.dm.blas); /* a GPU with cuBLAS has a stream */
    printf("model_dev stream: none here (%s), refused\n", f.info.on_gpu ? "no cuBLAS" : "host");
    teardown(&f);
    return;
  }
  /* a prompt's every logit (nothing of the cache's own is pending at the wait: it must still
   * wait for the model's kernels on the stream before the logits are read) */
  enum { NP = 40 };
  int tokp[NP], id0 = 0, np = NP, pos0 = 0;
  for (int j = 0; j < NP; ++j) tokp[j] = prompt_token(5, j);
  float *pa = malloc((size_t)NP * VOCAB * sizeof *pa), *pb = malloc((size_t)NP * VOCAB * sizeof *pb);
  for (int r = 0; r < 2; ++r) {
    c = fp16_cache(f.ctx, 1);
    ck_assert_int_eq(llm_dev_batch_init(&b, &f.dm, NP, 1, NP), 0);
    if (r) ck_assert_int_eq(llm_dev_batch_set_stream(&b, c, 1), 0);
    ck_assert_int_eq(llm_dev_forward(&b, c, 1, &id0, &np, &pos0, tokp, r ? pb : pa, 1, NULL, NULL), KIVI_OK);
    if (r) ck_assert_int_eq(llm_dev_batch_set_stream(&b, c, 0), 0);
    llm_dev_batch_free(&b);
    kivi_cache_destroy(c);
  }
  ck_assert_int_eq(memcmp(pa, pb, (size_t)NP * VOCAB * sizeof *pa), 0);
  printf("model_dev stream: a %d-token prompt's every logit bit-identical to the calls waited for\n", NP);
  free(pa);
  free(pb);
  int *ta = malloc(B * STEPS * sizeof *ta), *tb = malloc(B * STEPS * sizeof *tb);
  float *la = malloc((size_t)B * STEPS * VOCAB * sizeof *la), *lb = malloc((size_t)B * STEPS * VOCAB * sizeof *lb);
  static const int bits[] = {2, 16};
  for (int k = 0; k < 2; ++k) {
    int64_t kern = 0, waits = 0;
    generate_on(&f, bits[k], 0, B, STEPS, ta, la, 0, 0, NULL, NULL);
    generate_on(&f, bits[k], 0, B, STEPS, tb, lb, 1, 0, &kern, &waits);
    ck_assert_int_eq(memcmp(ta, tb, B * STEPS * sizeof *ta), 0);
    ck_assert_int_eq(memcmp(la, lb, (size_t)B * STEPS * VOCAB * sizeof *la), 0);
    ck_assert_int_ge(kern, (int64_t)MODEL_KERNELS * (STEPS - 1));
    if (bits[k] == 2) ck_assert_int_eq(waits, 0);
    printf("model_dev %d-bit cache on a stream: %d greedy tokens and logits bit-identical to the calls waited for; "
           "%.1f kernels a decode step on the stream, %lld regions waited\n", bits[k], B * STEPS,
           (double)kern / (STEPS - 1), (long long)waits);
  }
  free(ta);
  free(tb);
  free(la);
  free(lb);
  teardown(&f);
}
END_TEST

START_TEST(bad_arguments) {
  fixture f;
  setup(&f, LLM_DEV_F16);
  kivi_cache *c = fp16_cache(f.ctx, 2);
  llm_dev_batch b;
  ck_assert_int_eq(llm_dev_batch_init(&b, &f.dm, 8, 2, 2), 0);
  int ids[2] = {0, 1}, nn[2] = {1, 1}, pos[2] = {0, 0}, tok[8] = {1, 2};
  int bad_tok[2] = {1, VOCAB}, zero[2] = {1, 0}, big[2] = {8, 1}, neg[2] = {-1, 0};
  ck_assert_int_eq(llm_dev_forward(&b, c, 2, ids, nn, pos, bad_tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(llm_dev_forward(&b, c, 2, ids, zero, pos, tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(llm_dev_forward(&b, c, 2, ids, big, pos, tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(llm_dev_forward(&b, c, 2, ids, nn, neg, tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(llm_dev_forward(&b, c, 3, ids, nn, pos, tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(llm_dev_forward(&b, NULL, 2, ids, nn, pos, tok, NULL, 0, NULL, NULL), KIVI_ERR_ARG);
  int len = -1;
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 0, &len), KIVI_OK);
  ck_assert_int_eq(len, 0); /* nothing reached the cache */
  llm_dev_batch_free(&b);
  kivi_cache_destroy(c);
  teardown(&f);
}
END_TEST

int main(void) {
  Suite *s = suite_create("model_dev");
  TCase *tc = tcase_create("model_dev");
  tcase_add_test(tc, bad_arguments);
  tcase_add_loop_test(tc, dev_matches_host, 0, 4);
  tcase_add_loop_test(tc, all_logits_match_host, 0, 2);
  tcase_add_test(tc, batch_equals_single);
  tcase_add_test(tc, stream_equals_sync);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
