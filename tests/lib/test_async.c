/* Asynchronous execution (kivi.h): the _async calls, and the calls on a cache with a CUDA stream,
 * give bit-identical caches and outputs to the synchronous ones, work enqueued on several caches interleaved equals each cache run alone,
 * a run-time error comes back from the wait with the cache as it was before the failed call,
 * invalid arguments fail at the call, and the dependence object orders the caller's own tasks.
 * On a host context the _async calls are synchronous, and the same checks hold. */
#include <time.h>

#include "../check_util.h"

enum { NL = 2, HQ = 8, STEPS = 6, SEQS = 2 };

typedef struct geom {
  int H, D, kb, vb, G, R;
} geom;

/* KIVI-2 and KIVI-4 with D=128 take the GPU f16x2 path at these lengths; the others the
 * portable kernel */
static const geom GEOMS[] = {
    {2, 128, 2, 2, 32, 128}, {4, 64, 4, 2, 32, 64}, {2, 64, 16, 16, 32, 32}, {2, 128, 4, 4, 32, 64}};

typedef struct script {
  geom g;
  int len0[SEQS];
  float *k, *v, *q; /* tokens and queries, enough for the whole script */
  size_t tok_stride;
} script;

static script make_script(geom g, uint64_t seed) {
  script s = {g, {300 + (int)(seed % 50), 517}, NULL, NULL, NULL, (size_t)g.H * g.D};
  const size_t ntok = (size_t)(s.len0[0] + s.len0[1] + 16 + 2 * STEPS) * NL;
  s.k = tu_random(ntok * s.tok_stride, seed + 1, 1.0f);
  s.v = tu_random(ntok * s.tok_stride, seed + 2, 1.0f);
  s.q = tu_random((size_t)(STEPS + 8) * SEQS * HQ * g.D * NL, seed + 3, 1.0f);
  return s;
}

static void free_script(script *s) {
  free(s->k);
  free(s->v);
  free(s->q);
}

/* Runs the script on c: ragged prefill of both sequences on every layer, a 5-token extend of
 * sequence 0 (then its append), then STEPS decode steps of both sequences.  Outputs go to out
 * ([NL][STEPS + 5][SEQS][HQ][D] floats).  async: the _async calls and one wait at the end. */
static kivi_status run_script(kivi_cache *c, const script *s, float *out, int async) {
  const int D = s->g.D, ids[SEQS] = {0, 1}, five = 5;
  const size_t row = (size_t)SEQS * HQ * D;
  size_t tok = 0;
  kivi_status st = KIVI_OK;
#define CALL(sync_call, async_call) (st = async ? (async_call) : (sync_call))
  for (int l = 0; l < NL && !st; ++l) {
    const float *k = s->k + tok * s->tok_stride, *v = s->v + tok * s->tok_stride;
    tok += (size_t)s->len0[0] + s->len0[1];
    CALL(kivi_cache_append(c, l, SEQS, ids, s->len0, k, v, KIVI_F32, KIVI_MEM_HOST),
         kivi_cache_append_async(c, l, SEQS, ids, s->len0, k, v, KIVI_F32, KIVI_MEM_HOST));
  }
  for (int l = 0; l < NL && !st; ++l) {
    const float *k = s->k + tok * s->tok_stride, *v = s->v + tok * s->tok_stride;
    const float *q = s->q + (size_t)l * (STEPS + 8) * row;
    float *o = out + (size_t)l * (STEPS + 5) * row;
    tok += 5;
    CALL(kivi_attention_extend(c, l, 1, ids, &five, HQ, q, k, v, 0.125f, o, NULL, KIVI_MEM_HOST),
         kivi_attention_extend_async(c, l, 1, ids, &five, HQ, q, k, v, 0.125f, o, NULL, KIVI_MEM_HOST));
    if (!st)
      CALL(kivi_cache_append(c, l, 1, ids, &five, k, v, KIVI_F32, KIVI_MEM_HOST),
           kivi_cache_append_async(c, l, 1, ids, &five, k, v, KIVI_F32, KIVI_MEM_HOST));
  }
  const int ones[SEQS] = {1, 1};
  for (int step = 0; step < STEPS && !st; ++step)
    for (int l = 0; l < NL && !st; ++l) {
      const float *k = s->k + tok * s->tok_stride, *v = s->v + tok * s->tok_stride;
      tok += SEQS;
      const float *q = s->q + ((size_t)l * (STEPS + 8) + 5 + step) * row;
      float *o = out + ((size_t)l * (STEPS + 5) + 5 + step) * row;
      CALL(kivi_cache_append(c, l, SEQS, ids, ones, k, v, KIVI_F32, KIVI_MEM_HOST),
           kivi_cache_append_async(c, l, SEQS, ids, ones, k, v, KIVI_F32, KIVI_MEM_HOST));
      if (!st)
        CALL(kivi_attention_decode(c, l, SEQS, ids, HQ, q, 0.125f, o, KIVI_F32, KIVI_MEM_HOST),
             kivi_attention_decode_async(c, l, SEQS, ids, HQ, q, 0.125f, o, KIVI_F32, KIVI_MEM_HOST));
    }
#undef CALL
  if (async && !st) st = kivi_cache_wait(c);
  return st;
}

static size_t out_floats(const geom *g) { return (size_t)NL * (STEPS + 5) * SEQS * HQ * g->D; }

static kivi_cache *geom_cache_lanes(kivi_context *ctx, const geom *g, int lanes) {
  return tu_cache_lanes(ctx, NL, g->H, g->D, SEQS, 2048, g->kb, g->vb, g->G, g->R, lanes);
}

static kivi_cache *geom_cache(kivi_context *ctx, const geom *g) { return geom_cache_lanes(ctx, g, 1); }

/* Sets a stream of the library's own on c: 1, or 0 where the build or the context has none
 * (then the call must say so with KIVI_ERR_UNSUPPORTED and leave the route as it was). */
static int stream_available(kivi_cache *c) {
  const kivi_status st = kivi_cache_set_stream(c, KIVI_STREAM_LIBRARY);
  void *h = (void *)1;
  ck_assert_int_eq(kivi_cache_get_stream(c, &h), KIVI_OK);
  if (st == KIVI_OK) {
    ck_assert_ptr_nonnull(h);
    return 1;
  }
  ck_assert_int_eq(st, KIVI_ERR_UNSUPPORTED);
  ck_assert_ptr_null(h);
  return 0;
}

START_TEST(async_equals_sync) {
  kivi_context *ctx = tu_context();
  const geom *g = &GEOMS[_i];
  script s = make_script(*g, 10 + (uint64_t)_i);
  /* the enqueued run on a cache with a lane per layer (the default, one lane, is in
   * interleaved_caches) */
  kivi_cache *a = geom_cache(ctx, g), *b = geom_cache_lanes(ctx, g, NL);
  const size_t no = out_floats(g);
  float *oa = calloc(no, sizeof *oa), *ob = calloc(no, sizeof *ob);
  ck_assert_int_eq(run_script(a, &s, oa, 0), KIVI_OK);
  ck_assert_int_eq(run_script(b, &s, ob, 1), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, no * sizeof *oa), 0); /* bit for bit */
  unsigned ka = 0, kb = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(a, &ka), KIVI_OK);
  ck_assert_int_eq(kivi_cache_last_kernels(b, &kb), KIVI_OK);
  ck_assert_uint_eq(ka, kb);
  snapshot sa = snap(a), sb = snap(b);
  same(&sa, &sb);
  printf("async = sync, K%d V%d D%d: %zu outputs bit-identical, caches identical, kernels %#x\n", g->kb, g->vb,
         g->D, no, ka);
  free(sa.bytes);
  free(sb.bytes);
  free(oa);
  free(ob);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
  kivi_context_destroy(ctx);
  free_script(&s);
}
END_TEST

/* The stream route: the script's calls on a cache with a stream, enqueued (one wait) and
 * synchronous, give the synchronous run's outputs and cache bit for bit; on the fast path's
 * geometries its kernels launch on the stream.  A decode step with device-memory inputs and
 * outputs (what a model on the GPU does) launches every kernel on the stream and waits for none.
 * Where there is no stream (host context, host build, no CUDA driver) kivi_cache_set_stream says
 * KIVI_ERR_UNSUPPORTED and the cache keeps working on its route. */
START_TEST(stream_equals_sync) {
  kivi_context *ctx = tu_context();
  const geom *g = &GEOMS[_i];
  script s = make_script(*g, 30 + (uint64_t)_i);
  kivi_cache *a = geom_cache(ctx, g), *b = geom_cache(ctx, g), *c = geom_cache(ctx, g);
  const int on_stream = stream_available(b);
  if (on_stream) ck_assert_int_eq(stream_available(c), 1);
  const size_t no = out_floats(g);
  float *oa = calloc(no, sizeof *oa), *ob = calloc(no, sizeof *ob), *oc = calloc(no, sizeof *oc);
  ck_assert_int_eq(run_script(a, &s, oa, 0), KIVI_OK);
  ck_assert_int_eq(run_script(b, &s, ob, 1), KIVI_OK);
  ck_assert_int_eq(run_script(c, &s, oc, 0), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, no * sizeof *oa), 0);
  ck_assert_int_eq(memcmp(oa, oc, no * sizeof *oa), 0);
  snapshot sa = snap(a), sb = snap(b), sc = snap(c);
  same(&sa, &sb);
  same(&sa, &sc);
  kivi_cache_stats sts;
  ck_assert_int_eq(kivi_cache_get_stats(b, &sts), KIVI_OK);
  const int fast = g->D == 128 && g->kb == g->vb && g->kb <= 4;
  if (on_stream && fast) ck_assert_int_gt(sts.stream_kernels, 0);
  if (!on_stream) ck_assert_int_eq(sts.stream_kernels + sts.stream_waits, 0);
  printf("stream %s, K%d V%d D%d: outputs and caches bit-identical to the synchronous run, %lld kernels on the "
         "stream, %lld regions after a wait\n", on_stream ? "set" : "unsupported here", g->kb, g->vb, g->D,
         (long long)sts.stream_kernels, (long long)sts.stream_waits);

  /* a decode step on device memory: every kernel on the stream, none waited for */
  if (on_stream && fast) {
    const int ids[SEQS] = {0, 1}, ones[SEQS] = {1, 1};
    const size_t tok = (size_t)SEQS * g->H * g->D, nq = (size_t)SEQS * HQ * g->D;
    void *dk, *dv, *dq, *dout;
    ck_assert_int_eq(kivi_context_alloc(ctx, tok * 4, &dk), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, tok * 4, &dv), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dq), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, 2 * nq * 4, &dout), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, dk, s.k, tok * 4), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, dv, s.v, tok * 4), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, dq, s.q, nq * 4), KIVI_OK);
    kivi_cache_stats s0, s1;
    ck_assert_int_eq(kivi_cache_get_stats(b, &s0), KIVI_OK);
    kivi_cache *both[2] = {a, b};
    for (int r = 0; r < 2; ++r)
      for (int l = 0; l < NL; ++l) {
        ck_assert_int_eq(kivi_cache_append_async(both[r], l, SEQS, ids, ones, dk, dv, KIVI_F32, KIVI_MEM_DEVICE),
                         KIVI_OK);
        ck_assert_int_eq(kivi_attention_decode_async(both[r], l, SEQS, ids, HQ, dq, 0.125f,
                                                     (float *)dout + (size_t)r * nq, KIVI_F32, KIVI_MEM_DEVICE),
                         KIVI_OK);
      }
    ck_assert_int_eq(kivi_cache_get_stats(b, &s1), KIVI_OK); /* before the wait */
    ck_assert_int_eq(kivi_cache_wait(a), KIVI_OK);
    ck_assert_int_eq(kivi_cache_wait(b), KIVI_OK);
    ck_assert_int_eq(s1.stream_kernels - s0.stream_kernels, 2 * NL);
    ck_assert_int_eq(s1.stream_waits, s0.stream_waits);
    float *o2 = malloc(2 * nq * 4);
    ck_assert_int_eq(kivi_context_download(ctx, o2, dout, 2 * nq * 4), KIVI_OK);
    ck_assert_int_eq(memcmp(o2, o2 + nq, nq * 4), 0);
    snapshot ta = snap(a), tb = snap(b);
    same(&ta, &tb);
    printf("  decode step on device memory: %d kernels on the stream, no wait, outputs bit-identical\n", 2 * NL);
    free(ta.bytes);
    free(tb.bytes);
    free(o2);
    kivi_context_free(ctx, dk);
    kivi_context_free(ctx, dv);
    kivi_context_free(ctx, dq);
    kivi_context_free(ctx, dout);
  }
  /* back to the OpenMP runtime */
  ck_assert_int_eq(kivi_cache_set_stream(b, NULL), KIVI_OK);
  void *h = (void *)1;
  ck_assert_int_eq(kivi_cache_get_stream(b, &h), KIVI_OK);
  ck_assert_ptr_null(h);
  ck_assert_int_eq(kivi_cache_set_stream(NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_get_stream(b, NULL), KIVI_ERR_ARG);
  free(sa.bytes);
  free(sb.bytes);
  free(sc.bytes);
  free(oa);
  free(ob);
  free(oc);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
  kivi_cache_destroy(c);
  kivi_context_destroy(ctx);
  free_script(&s);
}
END_TEST

/* The caller's scope on a cache's stream (kivi_cache_stream_begin / _end): refused without a
 * stream and for a scope the thread is not in; with a stream, the library's calls inside the
 * scope work and leave the scope as it was (it still ends once, then no more); a scope still
 * open when the stream is unset ends with it. */
START_TEST(stream_scope) {
  kivi_context *ctx = tu_context();
  const geom *g = &GEOMS[0];
  kivi_cache *c = geom_cache(ctx, g), *d = geom_cache(ctx, g);
  ck_assert_int_eq(kivi_cache_stream_begin(NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_stream_end(NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_stream_begin(c), KIVI_ERR_ARG); /* no stream */
  ck_assert_int_eq(kivi_cache_stream_end(c), KIVI_ERR_ARG);   /* no scope */
  if (stream_available(c)) {
    const int ids[SEQS] = {0, 1}, ones[SEQS] = {1, 1};
    float *k = tu_random((size_t)SEQS * g->H * g->D, 5, 1.0f), *v = tu_random((size_t)SEQS * g->H * g->D, 6, 1.0f);
    ck_assert_int_eq(kivi_cache_stream_begin(c), KIVI_OK);
    ck_assert_int_eq(kivi_cache_stream_end(d), KIVI_ERR_ARG); /* not d's scope */
    ck_assert_int_eq(kivi_cache_append(c, 0, SEQS, ids, ones, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_append(d, 0, SEQS, ids, ones, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_stream_end(c), KIVI_OK); /* still in the scope after the calls */
    ck_assert_int_eq(kivi_cache_stream_end(c), KIVI_ERR_ARG);
    snapshot sc = snap(c), sd = snap(d);
    same(&sc, &sd);
    /* a scope still open when its stream goes ends with it */
    ck_assert_int_eq(kivi_cache_stream_begin(c), KIVI_OK);
    ck_assert_int_eq(kivi_cache_set_stream(c, NULL), KIVI_OK);
    ck_assert_int_eq(kivi_cache_stream_end(c), KIVI_ERR_ARG);
    free(sc.bytes);
    free(sd.bytes);
    free(k);
    free(v);
    printf("stream scope: refused without a stream or scope; calls inside it leave it as it was\n");
  } else {
    printf("stream scope: refused without a stream or scope (no stream here)\n");
  }
  kivi_cache_destroy(c);
  kivi_cache_destroy(d);
  kivi_context_destroy(ctx);
}
END_TEST

/* The GQA decode enqueued: 32 query heads over 8 kv-heads, 4 rows of 4400 tokens (KIVI-2,
 * D = 128).  Those are 32 (row, kv-head) pairs with 9 splits of 512 tokens each, enough blocks
 * for the GPU's GQA kernel (plan_call), whose nowait variant then runs.  decode_async gives what
 * decode gives, bit for bit, with the same kernels. */
START_TEST(gqa_async_equals_sync) {
  enum { H = 8, HG = 32, D = 128, NS = 4, LEN = 4400, CH = 550 };
  kivi_context *ctx = tu_context();
  kivi_cache *c = tu_cache(ctx, 1, H, D, NS, LEN, 2, 2, 32, 128);
  const int ids[NS] = {0, 1, 2, 3}, n[NS] = {CH, CH, CH, CH};
  for (int i = 0; i < LEN / CH; ++i) { /* the rows in chunks: less host memory at a time */
    float *k = tu_random((size_t)NS * CH * H * D, 100 + (uint64_t)i, 1.0f);
    float *v = tu_random((size_t)NS * CH * H * D, 200 + (uint64_t)i, 1.0f);
    ck_assert_int_eq(kivi_cache_append(c, 0, NS, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    free(k);
    free(v);
  }
  float *q = tu_random((size_t)NS * HG * D, 7, 1.0f);
  float *oa = calloc((size_t)NS * HG * D, sizeof *oa), *ob = calloc((size_t)NS * HG * D, sizeof *ob);
  unsigned ka = 0, kb = 0;
  ck_assert_int_eq(kivi_attention_decode(c, 0, NS, ids, HG, q, 0.125f, oa, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_last_kernels(c, &ka), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode_async(c, 0, NS, ids, HG, q, 0.125f, ob, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_wait(c), KIVI_OK);
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kb), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, (size_t)NS * HG * D * sizeof *oa), 0);
  ck_assert_uint_eq(ka, kb);
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  if (info.on_gpu && stream_available(c)) { /* the same call on a stream: one kernel, launched there */
    kivi_cache_stats s0, s1;
    ck_assert_int_eq(kivi_cache_get_stats(c, &s0), KIVI_OK);
    memset(ob, 0, (size_t)NS * HG * D * sizeof *ob);
    ck_assert_int_eq(kivi_attention_decode(c, 0, NS, ids, HG, q, 0.125f, ob, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_get_stats(c, &s1), KIVI_OK);
    ck_assert_int_eq(memcmp(oa, ob, (size_t)NS * HG * D * sizeof *oa), 0);
    ck_assert_int_eq(s1.stream_kernels - s0.stream_kernels, 1);
    ck_assert_int_eq(s1.stream_waits, s0.stream_waits);
    ck_assert_int_eq(kivi_cache_set_stream(c, NULL), KIVI_OK);
    printf("stream = sync, GQA: outputs bit-identical, the kernel launched on the stream\n");
  }
  ck_assert_uint_eq(ka, info.on_gpu && KIVI_BUILT_WITH_OFFLOAD ? KIVI_KERNEL_GPU_F16X2 | KIVI_KERNEL_GPU_GQA
                                                               : KIVI_KERNEL_PORTABLE);
  printf("async = sync, GQA %d over %d heads, %d rows of %d tokens: outputs bit-identical, kernels %#x\n", HG, H, NS,
         LEN, ka);
  free(q);
  free(oa);
  free(ob);
  kivi_cache_destroy(c);
  kivi_context_destroy(ctx);
}
END_TEST

/* Three caches driven round-robin, one _async call at a time, one wait each at the end. */
START_TEST(interleaved_caches) {
  kivi_context *ctx = tu_context();
  enum { NC = 3 };
  script s[NC];
  kivi_cache *c[NC], *ref[NC];
  float *o[NC], *oref[NC];
  for (int i = 0; i < NC; ++i) {
    s[i] = make_script(GEOMS[i], 40 + (uint64_t)i);
    c[i] = geom_cache(ctx, &GEOMS[i]);
    ref[i] = geom_cache(ctx, &GEOMS[i]);
    o[i] = calloc(out_floats(&GEOMS[i]), sizeof(float));
    oref[i] = calloc(out_floats(&GEOMS[i]), sizeof(float));
    ck_assert_int_eq(run_script(ref[i], &s[i], oref[i], 0), KIVI_OK);
  }
  /* the same calls as run_script, interleaved: decode steps round-robin over the caches */
  const int ids[SEQS] = {0, 1}, ones[SEQS] = {1, 1};
  size_t tok[NC] = {0};
  for (int l = 0; l < NL; ++l)
    for (int i = 0; i < NC; ++i) {
      const size_t at = tok[i] * s[i].tok_stride;
      tok[i] += (size_t)s[i].len0[0] + s[i].len0[1];
      ck_assert_int_eq(kivi_cache_append_async(c[i], l, SEQS, ids, s[i].len0, s[i].k + at, s[i].v + at, KIVI_F32,
                                               KIVI_MEM_HOST), KIVI_OK);
    }
  for (int l = 0; l < NL; ++l)
    for (int i = 0; i < NC; ++i) {
      const int D = GEOMS[i].D, five = 5;
      const size_t row = (size_t)SEQS * HQ * D, at = tok[i] * s[i].tok_stride;
      tok[i] += 5;
      ck_assert_int_eq(kivi_attention_extend_async(c[i], l, 1, ids, &five, HQ, s[i].q + (size_t)l * (STEPS + 8) * row,
                                                   s[i].k + at, s[i].v + at, 0.125f,
                                                   o[i] + (size_t)l * (STEPS + 5) * row, NULL, KIVI_MEM_HOST), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append_async(c[i], l, 1, ids, &five, s[i].k + at, s[i].v + at, KIVI_F32,
                                               KIVI_MEM_HOST), KIVI_OK);
    }
  for (int step = 0; step < STEPS; ++step)
    for (int l = 0; l < NL; ++l)
      for (int i = 0; i < NC; ++i) {
        const int D = GEOMS[i].D;
        const size_t row = (size_t)SEQS * HQ * D, at = tok[i] * s[i].tok_stride;
        tok[i] += SEQS;
        ck_assert_int_eq(kivi_cache_append_async(c[i], l, SEQS, ids, ones, s[i].k + at, s[i].v + at, KIVI_F32,
                                                 KIVI_MEM_HOST), KIVI_OK);
        ck_assert_int_eq(kivi_attention_decode_async(c[i], l, SEQS, ids, HQ,
                                                     s[i].q + ((size_t)l * (STEPS + 8) + 5 + step) * row, 0.125f,
                                                     o[i] + ((size_t)l * (STEPS + 5) + 5 + step) * row, KIVI_F32,
                                                     KIVI_MEM_HOST), KIVI_OK);
      }
  for (int i = NC - 1; i >= 0; --i) ck_assert_int_eq(kivi_cache_wait(c[i]), KIVI_OK);
  for (int i = 0; i < NC; ++i) {
    ck_assert_int_eq(memcmp(o[i], oref[i], out_floats(&GEOMS[i]) * sizeof(float)), 0);
    snapshot a = snap(c[i]), b = snap(ref[i]);
    same(&a, &b);
    free(a.bytes);
    free(b.bytes);
    free(o[i]);
    free(oref[i]);
    kivi_cache_destroy(c[i]);
    kivi_cache_destroy(ref[i]);
    free_script(&s[i]);
  }
  printf("interleaved: %d caches round-robin = each alone, bit for bit\n", NC);
  kivi_context_destroy(ctx);
}
END_TEST

/* More layers than lanes (async_lanes = 8: a decode step's calls run on the lane layer % 8,
 * prefill appends off the lanes, ordered with all of them): 11 layers, so layers 0 and 8 share
 * a lane.
 * Prefill of sequence 0 on every layer, decode steps with a prefill of sequence 1 arriving
 * between two steps, device-memory q and outputs.  The enqueued run equals the synchronous one
 * bit for bit, outputs and cache. */
START_TEST(lanes_wrap) {
  kivi_context *ctx = tu_context();
  enum { L11 = 11, NSTEP = 4 };
  const geom *g = &GEOMS[0];
  const int D = g->D, n0 = 261, n1 = 190, ids[2] = {0, 1}, ones[2] = {1, 1};
  const size_t st = (size_t)g->H * D, row = (size_t)2 * HQ * D;
  const size_t ntok = (size_t)L11 * (n0 + n1 + 2 * NSTEP);
  float *k = tu_random(ntok * st, 60, 1.0f), *v = tu_random(ntok * st, 61, 1.0f);
  float *q = tu_random((size_t)L11 * NSTEP * row, 62, 1.0f);
  void *dq = NULL, *dout[2] = {NULL, NULL};
  const size_t nout = (size_t)L11 * NSTEP * row;
  ck_assert_int_eq(kivi_context_alloc(ctx, nout * 4, &dq), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dq, q, nout * 4), KIVI_OK);
  kivi_cache *c[2];
  for (int r = 0; r < 2; ++r) { /* r = 0 synchronous, 1 enqueued */
    c[r] = tu_cache_lanes(ctx, L11, g->H, D, 2, 2048, g->kb, g->vb, g->G, g->R, KIVI_MAX_ASYNC_LANES);
    ck_assert_int_eq(kivi_context_alloc(ctx, nout * 4, &dout[r]), KIVI_OK);
    size_t tok = 0;
#define CALL(sync_call, async_call) ck_assert_int_eq(r ? (async_call) : (sync_call), KIVI_OK)
    for (int l = 0; l < L11; ++l, tok += n0)
      CALL(kivi_cache_append(c[r], l, 1, ids, &n0, k + tok * st, v + tok * st, KIVI_F32, KIVI_MEM_HOST),
           kivi_cache_append_async(c[r], l, 1, ids, &n0, k + tok * st, v + tok * st, KIVI_F32, KIVI_MEM_HOST));
    for (int step = 0; step < NSTEP; ++step) {
      const int ns = step < 2 ? 1 : 2; /* sequence 1 joins after step 1 */
      if (step == 2)
        for (int l = L11 - 1; l >= 0; --l, tok += n1)
          CALL(kivi_cache_append(c[r], l, 1, ids + 1, &n1, k + tok * st, v + tok * st, KIVI_F32, KIVI_MEM_HOST),
               kivi_cache_append_async(c[r], l, 1, ids + 1, &n1, k + tok * st, v + tok * st, KIVI_F32,
                                       KIVI_MEM_HOST));
      for (int l = 0; l < L11; ++l, tok += (size_t)ns) {
        const size_t at = ((size_t)l * NSTEP + step) * row;
        CALL(kivi_cache_append(c[r], l, ns, ids, ones, k + tok * st, v + tok * st, KIVI_F32, KIVI_MEM_HOST),
             kivi_cache_append_async(c[r], l, ns, ids, ones, k + tok * st, v + tok * st, KIVI_F32, KIVI_MEM_HOST));
        CALL(kivi_attention_decode(c[r], l, ns, ids, HQ, (const float *)dq + at, 0.125f, (float *)dout[r] + at,
                                   KIVI_F32, KIVI_MEM_DEVICE),
             kivi_attention_decode_async(c[r], l, ns, ids, HQ, (const float *)dq + at, 0.125f,
                                         (float *)dout[r] + at, KIVI_F32, KIVI_MEM_DEVICE));
      }
    }
#undef CALL
    ck_assert_int_eq(kivi_cache_wait(c[r]), KIVI_OK);
  }
  float *o0 = malloc(nout * 4), *o1 = malloc(nout * 4);
  ck_assert_int_eq(kivi_context_download(ctx, o0, dout[0], nout * 4), KIVI_OK);
  ck_assert_int_eq(kivi_context_download(ctx, o1, dout[1], nout * 4), KIVI_OK);
  /* steps 0-1 write only sequence 0's half of each row block: compare those halves */
  for (int l = 0; l < L11; ++l)
    for (int step = 0; step < NSTEP; ++step) {
      const size_t at = ((size_t)l * NSTEP + step) * row, n = step < 2 ? row / 2 : row;
      ck_assert_int_eq(memcmp(o0 + at, o1 + at, n * 4), 0);
    }
  snapshot a = snap(c[0]), b = snap(c[1]);
  same(&a, &b);
  printf("lanes: %d layers (lanes wrap), a prefill between steps: enqueued = synchronous, bit for bit\n", L11);
  free(a.bytes);
  free(b.bytes);
  free(o0);
  free(o1);
  for (int r = 0; r < 2; ++r) {
    kivi_context_free(ctx, dout[r]);
    kivi_cache_destroy(c[r]);
  }
  kivi_context_free(ctx, dq);
  free(k);
  free(v);
  free(q);
  kivi_context_destroy(ctx);
}
END_TEST

/* A NaN in an enqueued append.  In host memory it fails the call itself on every context (the
 * host checks host inputs as it copies them).  In device memory, on a GPU the call returns OK
 * and the wait NONFINITE, the failed append and the later ones on its layer undone (an append
 * to another layer stays); on the host the call fails (synchronous).  Either way the cache ends
 * as the calls that succeeded left it, and nothing is lost.  n2 = 7 takes the GPU's one-kernel
 * append, n2 = 150 (> R) the four kernels of a larger append. */
START_TEST(error_reported_by_wait) {
  kivi_context *ctx = tu_context();
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  const geom *g = &GEOMS[0];
  const int seq = 0, n1 = 200, n3 = 40, n2max = 150;
  const size_t st = (size_t)g->H * g->D;
  float *k = tu_random((size_t)(n1 + n2max + n3) * st, 5, 1.0f), *v = tu_random((size_t)(n1 + n2max + n3) * st, 6, 1.0f);
  float *bad = malloc((size_t)n2max * st * sizeof *bad);
  void *dbad = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, (size_t)n2max * st * sizeof *bad, &dbad), KIVI_OK);
  float q[HQ * 128], out[HQ * 128];
  for (int i = 0; i < HQ * 128; ++i) q[i] = 0.01f * (float)(i % 17);

  /* bit 0: a sync call reports (else the wait); bit 1: n2 = 150; bit 2: a lane per layer;
   * bit 3: on a stream (where there is one) */
  int streams = 0;
  for (int variant = 0; variant < 16; ++variant) {
    const int n2 = variant & 2 ? n2max : 7;
    memcpy(bad, k + (size_t)n1 * st, (size_t)n2 * st * sizeof *bad);
    bad[3 * st + 5] = NAN;
    ck_assert_int_eq(kivi_context_upload(ctx, dbad, bad, (size_t)n2 * st * sizeof *bad), KIVI_OK);
    const float *k3 = k + (size_t)(n1 + n2) * st, *v3 = v + (size_t)(n1 + n2) * st;
    kivi_cache *c = geom_cache_lanes(ctx, g, variant & 4 ? NL : 1), *ref = geom_cache(ctx, g);
    if (variant & 8) {
      if (!stream_available(c)) {
        kivi_cache_destroy(c);
        kivi_cache_destroy(ref);
        continue;
      }
      ++streams;
    }
    ck_assert_int_eq(kivi_cache_append(ref, 0, 1, &seq, &n1, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    if (!info.on_gpu) /* synchronous: the append after the failed one does take place */
      ck_assert_int_eq(kivi_cache_append(ref, 0, 1, &seq, &n3, k3, v3, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    /* an append on another layer, enqueued after the failed one, takes place on every context */
    ck_assert_int_eq(kivi_cache_append(ref, 1, 1, &seq, &n3, k3, v3, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    /* invalid arguments fail at the call and enqueue nothing */
    ck_assert_int_eq(kivi_cache_append_async(c, NL, 1, &seq, &n1, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
    ck_assert_int_eq(kivi_attention_decode_async(c, 0, 1, &seq, HQ, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST),
                     KIVI_ERR_ARG); /* empty sequence */
    ck_assert_int_eq(kivi_cache_wait(c), KIVI_OK);
    ck_assert_int_eq(kivi_cache_append_async(c, 0, 1, &seq, &n1, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    /* the NaN in host memory: the call fails and enqueues nothing */
    ck_assert_int_eq(kivi_cache_append_async(c, 0, 1, &seq, &n2, bad, v + (size_t)n1 * st, KIVI_F32, KIVI_MEM_HOST),
                     KIVI_ERR_NONFINITE);
    /* the NaN in device memory */
    const kivi_status s_bad = kivi_cache_append_async(c, 0, 1, &seq, &n2, dbad, dbad, KIVI_F32, KIVI_MEM_DEVICE);
    ck_assert_int_eq(s_bad, info.on_gpu ? KIVI_OK : KIVI_ERR_NONFINITE);
    ck_assert_int_eq(kivi_cache_append_async(c, 1, 1, &seq, &n3, k3, v3, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_append_async(c, 0, 1, &seq, &n3, k3, v3, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_attention_decode_async(c, 0, 1, &seq, HQ, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    const kivi_status reported = !(variant & 1) ? kivi_cache_wait(c)
                                                : kivi_cache_append(c, 0, 1, &seq, &n3, k, v, KIVI_F32, KIVI_MEM_HOST);
    ck_assert_int_eq(reported, info.on_gpu ? KIVI_ERR_NONFINITE : KIVI_OK);
    if (!info.on_gpu && (variant & 1)) /* that sync append did take place on the host: undo it by reference */
      ck_assert_int_eq(kivi_cache_append(ref, 0, 1, &seq, &n3, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_wait(c), KIVI_OK); /* reported once */
    snapshot a = snap(c), b = snap(ref);
    same(&a, &b);
    free(a.bytes);
    free(b.bytes);
    kivi_cache_destroy(c);
    kivi_cache_destroy(ref);
  }
  printf("run-time error: %s; its layer as before the failed append, the other layer's append kept (%d variants "
         "on a stream)\n",
         info.on_gpu ? "reported by the wait (and by a synchronous call)" : "reported by the call (host: synchronous)",
         streams);
  kivi_context_free(ctx, dbad);
  free(k);
  free(v);
  free(bad);
  kivi_context_destroy(ctx);
}
END_TEST

/* The caller's own tasks ordered through kivi_cache_dependence: a task that fills q on the
 * device (late), the enqueued decode reading it, a task that copies the output back. */
START_TEST(caller_dependence) {
  kivi_context *ctx = tu_context();
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  if (!info.on_gpu) {
    printf("caller dependence: host context (the _async calls are synchronous): skipped\n");
    kivi_context_destroy(ctx);
    return;
  }
  const geom *g = &GEOMS[0];
  kivi_cache *c = geom_cache(ctx, g);
  const int seq = 0, n = 2000, D = g->D;
  float *k = tu_random((size_t)n * g->H * D, 7, 1.0f), *v = tu_random((size_t)n * g->H * D, 8, 1.0f);
  float *q = tu_random((size_t)HQ * D, 9, 1.0f);
  float want[HQ * 128], got[HQ * 128];
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &seq, HQ, q, 0.125f, want, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  void *qd = NULL, *od = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, (size_t)HQ * D * 4, &qd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, (size_t)HQ * D * 4, &od), KIVI_OK);
  for (int i = 0; i < HQ * D; ++i) got[i] = -1.0f;
  ck_assert_int_eq(kivi_context_upload(ctx, qd, got, (size_t)HQ * D * 4), KIVI_OK); /* q = garbage for now */
  char *d = kivi_cache_dependence(c);
  ck_assert_ptr_nonnull(d);
  kivi_status copy_in = KIVI_ERR_ARG, copy_out = KIVI_ERR_ARG;
  kivi_status st = KIVI_OK;
#pragma omp task depend(out : d[0]) shared(copy_in)
  {
    const struct timespec ts = {0, 50 * 1000 * 1000}; /* late: the decode must wait for it */
    nanosleep(&ts, NULL);
    copy_in = kivi_context_upload(ctx, qd, q, (size_t)HQ * D * 4);
  }
  st = kivi_attention_decode_async(c, 0, 1, &seq, HQ, qd, 0.125f, od, KIVI_F32, KIVI_MEM_DEVICE);
#pragma omp task depend(in : d[0]) shared(copy_out, got)
  copy_out = kivi_context_download(ctx, got, od, (size_t)HQ * D * 4);
#pragma omp taskwait
  ck_assert_int_eq(st, KIVI_OK);
  ck_assert_int_eq(kivi_cache_wait(c), KIVI_OK);
  ck_assert_int_eq(copy_in, KIVI_OK);
  ck_assert_int_eq(copy_out, KIVI_OK);
  ck_assert_int_eq(memcmp(got, want, (size_t)HQ * D * 4), 0);
  printf("caller dependence: its q task ran before the enqueued decode, its copy task after\n");
  kivi_context_free(ctx, qd);
  kivi_context_free(ctx, od);
  free(k);
  free(v);
  free(q);
  kivi_cache_destroy(c);
  kivi_context_destroy(ctx);
}
END_TEST

int main(void) {
  Suite *s = suite_create("async");
  TCase *t = tcase_create("async");
  tcase_set_timeout(t, 1200);
  tcase_add_loop_test(t, async_equals_sync, 0, (int)(sizeof GEOMS / sizeof GEOMS[0]));
  tcase_add_loop_test(t, stream_equals_sync, 0, (int)(sizeof GEOMS / sizeof GEOMS[0]));
  tcase_add_test(t, stream_scope);
  tcase_add_test(t, gqa_async_equals_sync);
  tcase_add_test(t, interleaved_caches);
  tcase_add_test(t, lanes_wrap);
  tcase_add_test(t, error_reported_by_wait);
  tcase_add_test(t, caller_dependence);
  suite_add_tcase(s, t);
  return tu_run(s);
}
