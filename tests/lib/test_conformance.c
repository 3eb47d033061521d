/* Device conformance runner: the cache the library builds on the default device (the GPU when
 * offloading) equals, byte for byte, the independent scalar reference (tests/ref), for every
 * bit width, group, residual length and head_dim, however the tokens are split into appends;
 * on a GPU it also equals the cache built by host threads.  Re-run with
 * OMP_TARGET_OFFLOAD=DISABLED by tests/pkg/host_fallback.sh. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

static kivi_context *ctx, *host_ctx;
static int on_gpu;

static void setup(void) {
  ctx = tu_context();
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  on_gpu = info.on_gpu;
  ck_assert_int_eq(kivi_context_create(&host_ctx, KIVI_DEVICE_HOST), KIVI_OK);
}
static void teardown(void) {
  kivi_context_destroy(ctx);
  kivi_context_destroy(host_ctx);
}

typedef struct geom_case {
  int D, H, G, R, kb, vb;
} geom_case;

static const geom_case cases[] = {
    {128, 2, 32, 128, 2, 2},  {128, 2, 32, 128, 4, 4},  {64, 3, 32, 128, 2, 2},  {64, 3, 64, 64, 4, 2},
    {128, 1, 128, 128, 2, 4}, {128, 2, 32, 32, 8, 8},   {64, 1, 32, 64, 16, 16}, {64, 2, 32, 96, 16, 2},
    {96, 1, 32, 64, 2, 16},   {256, 1, 64, 128, 4, 8},  {32, 4, 32, 32, 2, 2},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* Token data of one sequence: [L][H][D]; channel 5 of K carries a x100 outlier (real keys do). */
static void make_tokens(const geom_case *g, int L, uint64_t seed, float **k, float **v) {
  const size_t n = (size_t)L * g->H * g->D;
  *k = tu_random(n > 0 ? n : 1, seed, 2.0f);
  *v = tu_random(n > 0 ? n : 1, seed ^ 0xabcdef, 1.5f);
  for (size_t i = 5; i < n; i += (size_t)g->D) (*k)[i] *= 100.0f;
}

static kivi_cache *make_cache(kivi_context *c, const geom_case *g, int seqs, int maxlen) {
  return tu_cache(c, 2, g->H, g->D, seqs, maxlen, g->kb, g->vb, g->G, g->R);
}

static void expect_bytes(const unsigned char *got, size_t got_n, const unsigned char *want, size_t want_n,
                         const char *what) {
  ck_assert_msg(got_n == want_n, "%s: export size %zu, reference %zu", what, got_n, want_n);
  for (size_t i = 0; i < got_n; ++i)
    if (got[i] != want[i]) ck_abort_msg("%s: first difference at byte %zu of %zu (%#x vs %#x)", what, i, got_n, got[i], want[i]);
}

/* Sequence s on layer 1 of c exports the reference bytes want. */
static void expect_seq(const kivi_cache *c, int s, const unsigned char *want, size_t want_n, const char *what) {
  size_t n;
  unsigned char *got = tu_export(c, s, 1, &n);
  expect_bytes(got, n, want, want_n, what);
  free(got);
}

static void free_seqs(int nseq, unsigned char **want, float **k, float **v) {
  for (int s = 0; s < nseq; ++s) {
    free(want[s]);
    free(k[s]);
    free(v[s]);
  }
}

/* Appends the sequences' tokens to layer 1 in rounds; each round every unfinished sequence gets
 * a chunk whose size follows `mode`: 0 all at once, 1 one token per call, 2 random sizes (some
 * sequences left out of a call, some named in it with 0 tokens). */
static void fill(kivi_cache *c, const geom_case *g, int nseq, const int *len, float **k, float **v, int mode,
                 uint64_t seed) {
  int *done = calloc((size_t)nseq, sizeof(int)), *ids = malloc(sizeof(int) * nseq), *cnt = malloc(sizeof(int) * nseq);
  const size_t row = (size_t)g->H * g->D;
  for (;;) {
    int n = 0;
    size_t total = 0;
    for (int s = 0; s < nseq; ++s) {
      if (done[s] == len[s]) continue;
      int chunk = len[s] - done[s];
      if (mode == 1) chunk = 1;
      if (mode == 2) {
        const uint64_t pick = tu_next(&seed) % 8;
        if (pick == 0) continue; /* not every sequence in every call */
        const int r = (int)(tu_next(&seed) % (unsigned)(2 * g->R + 3));
        chunk = pick == 1 ? 0 : r + 1 < chunk ? r + 1 : chunk; /* or in it with no token */
      }
      ids[n] = s;
      cnt[n++] = chunk;
      total += (size_t)chunk;
    }
    if (n == 0) {
      if (mode != 2) break;
      int left = 0;
      for (int s = 0; s < nseq; ++s) left |= done[s] != len[s];
      if (!left) break;
      continue;
    }
    float *kb = malloc(sizeof(float) * total * row), *vb = malloc(sizeof(float) * total * row);
    size_t o = 0;
    for (int i = 0; i < n; ++i) {
      memcpy(kb + o * row, k[ids[i]] + (size_t)done[ids[i]] * row, sizeof(float) * cnt[i] * row);
      memcpy(vb + o * row, v[ids[i]] + (size_t)done[ids[i]] * row, sizeof(float) * cnt[i] * row);
      o += (size_t)cnt[i];
    }
    ck_assert_int_eq(kivi_cache_append(c, 1, n, ids, cnt, kb, vb, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    for (int i = 0; i < n; ++i) done[ids[i]] += cnt[i];
    free(kb);
    free(vb);
  }
  free(done);
  free(ids);
  free(cnt);
}

/* Every geometry, a ragged batch with the boundary lengths, three ways of splitting the tokens:
 * the exported bytes equal the reference each time. */
START_TEST(matches_reference_any_split) {
  const geom_case *g = &cases[_i];
  const int R = g->R, G = g->G;
  const int len[] = {1, R - 1, R, R + 1, 3 * R + G + 5, G, 2 * R, 7};
  enum { NSEQ = 8 };
  float *k[NSEQ], *v[NSEQ];
  for (int s = 0; s < NSEQ; ++s) make_tokens(g, len[s], 100 + 17 * (uint64_t)s + (uint64_t)_i, &k[s], &v[s]);
  const ref_geom rg = {g->D, g->H, g->G, g->R, g->kb, g->vb, 0, 0};
  unsigned char *want[NSEQ];
  size_t want_n[NSEQ];
  for (int s = 0; s < NSEQ; ++s) want[s] = ref_export(&rg, len[s], k[s], v[s], &want_n[s]);
  const int modes = 3;
  for (int mode = 0; mode < modes; ++mode) {
    kivi_cache *c = make_cache(ctx, g, NSEQ, 4 * R + 2 * G);
    fill(c, g, NSEQ, len, k, v, mode, 7 + (uint64_t)_i);
    for (int s = 0; s < NSEQ; ++s) {
      char what[160];
      snprintf(what, sizeof what, "D%d H%d G%d R%d k%d v%d, L=%d, split mode %d", g->D, g->H, g->G, g->R, g->kb,
               g->vb, len[s], mode);
      expect_seq(c, s, want[s], want_n[s], what);
      size_t n0;
      ck_assert_int_eq(kivi_cache_export_seq(c, s, 0, NULL, &n0), KIVI_OK);
      ck_assert_uint_eq(n0, 0); /* layer 0 untouched */
    }
    kivi_cache_destroy(c);
  }
  free_seqs(NSEQ, want, k, v);
}
END_TEST

/* Many sequences in every call (more than one block's worth on a GPU, where calls of at most R
 * tokens per sequence run the one-kernel append): one token per call, and random sizes; the
 * bytes equal the reference. */
START_TEST(many_sequences_match_reference) {
  const geom_case g = {64, 2, 32, 32, 2, 4};
  enum { NSEQ = 72 };
  int len[NSEQ];
  float *k[NSEQ], *v[NSEQ];
  unsigned char *want[NSEQ];
  size_t want_n[NSEQ];
  const ref_geom rg = {g.D, g.H, g.G, g.R, g.kb, g.vb, 0, 0};
  for (int s = 0; s < NSEQ; ++s) {
    len[s] = 1 + (s * 37) % 110;
    make_tokens(&g, len[s], 500 + (uint64_t)s, &k[s], &v[s]);
    want[s] = ref_export(&rg, len[s], k[s], v[s], &want_n[s]);
  }
  for (int mode = 1; mode <= 2; ++mode) {
    kivi_cache *c = make_cache(ctx, &g, NSEQ, 128);
    fill(c, &g, NSEQ, len, k, v, mode, 77);
    for (int s = 0; s < NSEQ; ++s) {
      char what[96];
      snprintf(what, sizeof what, "%d sequences, L=%d, split mode %d", NSEQ, len[s], mode);
      expect_seq(c, s, want[s], want_n[s], what);
    }
    kivi_cache_destroy(c);
  }
  free_seqs(NSEQ, want, k, v);
}
END_TEST

/* Random splits with a random seed per round, on a longer sequence: identical bytes. */
START_TEST(chunk_invariance_random_splits) {
  const geom_case g = {128, 2, 32, 128, 2, 2};
  const int L = 1500;
  float *k, *v;
  make_tokens(&g, L, 4242, &k, &v);
  size_t first_n = 0;
  unsigned char *first = NULL;
  for (int round = 0; round < 4; ++round) {
    kivi_cache *c = make_cache(ctx, &g, 1, 2048);
    fill(c, &g, 1, &L, &k, &v, 2, 1000 + (uint64_t)round);
    size_t n;
    unsigned char *got = tu_export(c, 0, 1, &n);
    if (!first) {
      first = got;
      first_n = n;
    } else {
      expect_bytes(got, n, first, first_n, "random split vs first split");
      free(got);
    }
    kivi_cache_destroy(c);
  }
  free(first);
  free(k);
  free(v);
}
END_TEST

/* On a GPU, the device-built cache equals the host-built one (both also equal the reference). */
START_TEST(gpu_equals_host) {
  if (!on_gpu) {
    printf("gpu_equals_host: default context is the host; covered by the reference tests\n");
    return;
  }
  const geom_case g = {128, 4, 32, 128, 2, 4};
  const int L = 2000;
  float *k, *v;
  make_tokens(&g, L, 99, &k, &v);
  kivi_cache *cg = make_cache(ctx, &g, 1, 2048), *ch = make_cache(host_ctx, &g, 1, 2048);
  fill(cg, &g, 1, &L, &k, &v, 2, 5);
  fill(ch, &g, 1, &L, &k, &v, 0, 5);
  size_t ng, nh;
  unsigned char *bg = tu_export(cg, 0, 1, &ng), *bh = tu_export(ch, 0, 1, &nh);
  expect_bytes(bg, ng, bh, nh, "GPU vs host");
  free(bg);
  free(bh);
  kivi_cache_destroy(cg);
  kivi_cache_destroy(ch);
  free(k);
  free(v);
}
END_TEST

/* Round trip: every dequantized element is within half a quantization step of the fp16 input,
 * plus what fp16 rounding of the stored scale can add at the top of the range (the code is
 * clamped to 2^b - 1 when the rounded scale is slightly small). */
static void check_roundtrip(const geom_case *g, int L, const float *k, const float *v, const char *what) {
  kivi_cache *c = make_cache(ctx, g, 1, L);
  const int id = 0;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &id, &L, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  size_t n;
  unsigned char *e = tu_export(c, 0, 1, &n);
  const ref_geom rg = {g->D, g->H, g->G, g->R, g->kb, g->vb, 0, 0};
  const size_t ne = (size_t)L * g->H * g->D;
  double *kd = malloc(ne * sizeof(double)), *vd = malloc(ne * sizeof(double));
  ref_dequant_export(&rg, L, e, kd, vd);
  const int D = g->D, H = g->H, G = g->G, R = g->R;
  const int Lk = L - L % R, Lv = L > R ? L - R : 0;
  for (int pass = 0; pass < 2; ++pass) {
    const float *x = pass ? v : k;
    const double *xd = pass ? vd : kd;
    const int bits = pass ? g->vb : g->kb, Lq = pass ? Lv : Lk;
    const double maxq = (double)((1 << bits) - 1);
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < L; ++t)
        for (int ch = 0; ch < D; ++ch) {
          const size_t i = ((size_t)t * H + h) * D + ch;
          const double x16 = ref_round_f16(x[i]);
          double tol = 0.0; /* fp16 residual and 16-bit codes: exact */
          if (t < Lq && bits < 16) {
            double mn = INFINITY, mx = -INFINITY; /* the element's group */
            for (int j = 0; j < G; ++j) {
              const size_t e2 = pass ? ((size_t)t * H + h) * D + (size_t)(ch / G) * G + j
                                     : ((size_t)((t / G) * G + j) * H + h) * D + ch;
              const double y = ref_round_f16(x[e2]);
              mn = y < mn ? y : mn;
              mx = y > mx ? y : mx;
            }
            const double step = (mx - mn) / maxq;
            /* ROUNDTRIP_TOL: half a step of the stored scale, whose fp16 rounding error ds is
             * 2^-11 relative or half a subnormal spacing (2^-25), the same error times maxq at
             * the clamped top code, and fp32 evaluation */
            const double ds = fmax(step * 0x1p-11, 0x1p-25);
            tol = 0.5 * (step + ds) + maxq * ds + 1e-6 * (fabs(mn) + fabs(mx));
          }
          ck_assert_msg(fabs(xd[i] - x16) <= tol, "%s: %s t=%d h=%d c=%d: %.9g vs %.9g (tol %.3g)", what,
                        pass ? "V" : "K", t, h, ch, xd[i], x16, tol);
        }
  }
  free(kd);
  free(vd);
  free(e);
  kivi_cache_destroy(c);
}

START_TEST(roundtrip_structured_inputs) {
  static const int bits[] = {2, 4, 8};
  for (int b = 0; b < 3; ++b) {
    const geom_case g = {64, 2, 32, 64, bits[b], bits[b]};
    const int L = 200;
    const size_t ne = (size_t)L * g.H * g.D;
    float *k, *v;
    make_tokens(&g, L, 31 + (uint64_t)b, &k, &v); /* random with a x100 outlier channel */
    check_roundtrip(&g, L, k, v, "random+outlier");
    for (size_t i = 0; i < ne; ++i) { k[i] = 0.75f; v[i] = -3.5f; } /* constant groups: exact */
    check_roundtrip(&g, L, k, v, "constant");
    {
      kivi_cache *c = make_cache(ctx, &g, 1, L);
      const int id = 0;
      ck_assert_int_eq(kivi_cache_append(c, 1, 1, &id, &L, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      size_t n;
      unsigned char *e = tu_export(c, 0, 1, &n);
      double *kd = malloc(ne * sizeof(double)), *vd = malloc(ne * sizeof(double));
      const ref_geom rg = {g.D, g.H, g.G, g.R, g.kb, g.vb, 0, 0};
      ref_dequant_export(&rg, L, e, kd, vd);
      for (size_t i = 0; i < ne; ++i) {
        ck_assert(kd[i] == 0.75);
        ck_assert(vd[i] == -3.5);
      }
      free(kd); free(vd); free(e);
      kivi_cache_destroy(c);
    }
    for (size_t i = 0; i < ne; ++i) { /* the ends of the fp16 range */
      k[i] = (i / 7) % 2 ? 65504.0f : -65504.0f;
      v[i] = (i / 3) % 2 ? -65504.0f : 65504.0f;
    }
    check_roundtrip(&g, L, k, v, "+-65504");
    uint64_t s = 77;
    for (size_t i = 0; i < ne; ++i) { /* fp16 subnormals (< 6.1e-5) */
      k[i] = 6e-5f * tu_uniform(&s);
      v[i] = 3e-7f * (float)(i % 50);
    }
    check_roundtrip(&g, L, k, v, "subnormal");
    free(k);
    free(v);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("conformance");
  TCase *tc = tcase_create("cache bytes");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, matches_reference_any_split, 0, N_CASES);
  tcase_add_test(tc, many_sequences_match_reference);
  tcase_add_test(tc, chunk_invariance_random_splits);
  tcase_add_test(tc, gpu_equals_host);
  tcase_add_test(tc, roundtrip_structured_inputs);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
