/* Searched value ranges (kivi_cache_config.v_clip = KIVI_CLIP_MSE, kivi.h "Searched value
 * ranges"):
 *  - a group worked by hand stores the range the rule picks (dequantized through the
 *    reference's reading of the export);
 *  - the export equals the plain scalar reference's (which searches on its own) byte for byte,
 *    for 2, 4 and 8 bits, G 32, 64 and 128, with and without rotation and sink tokens, fp32,
 *    fp16 and bf16 inputs in host and device memory, appended at once, in pieces and one token
 *    at a time (on a GPU: the larger appends' kernels and the one-kernel append);
 *  - every group's error, in double, is at most its min/max range's (CLIP_NOT_WORSE), and on
 *    Gaussian-like values the total squared error falls by at least CLIP_GAIN;
 *  - decode over such a cache equals double attention over the dequantized export;
 *  - a checkpoint does not record the option and loads into a cache with either setting;
 *  - v_clip outside the enum is KIVI_ERR_ARG. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

/* the chosen range's error in double may exceed min/max's by the 12-bit cut of each squared
 * error (2^-11 relative each): 1e-3 relative covers it */
#define CLIP_NOT_WORSE 1e-3
/* 2-bit groups of 32 uniform-sum (near Gaussian) values: min/max wastes range on the extremes;
 * the best of the nine ranges lowers the total squared error by about a fifth */
#define CLIP_GAIN 0.10
/* the fp32 portable kernel and the fast kernels against double attention (as test_sinks) */
#define CLIP_TOL 1e-5
#define CLIP_FAST_TOL 2e-3

static kivi_context *ctx;
static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

static kivi_cache *make(int H, int D, int G, int kb, int vb, int rot, int S, int mode, int seqs, int maxlen) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 2, H, D, seqs, maxlen);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.group = G;
  cfg.rotate = rot;
  cfg.sinks = S;
  cfg.attention = mode;
  cfg.v_clip = KIVI_CLIP_MSE;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  return c;
}

/* Values: each channel a sum of three uniforms (near Gaussian) plus a per-channel offset;
 * keys as test_sinks makes them (the first two tokens large). */
static void tokens_of(int L, int H, int D, uint64_t seed, float **k, float **v) {
  const size_t n = (size_t)L * H * D;
  *k = tu_random(n, seed, 2.0f);
  *v = malloc(n * 4);
  uint64_t s = seed + 7;
  for (size_t i = 0; i < n; ++i) {
    if (i < (size_t)2 * H * D) (*k)[i] *= 8.0f;
    (*v)[i] = tu_uniform(&s) + tu_uniform(&s) + tu_uniform(&s) + 0.25f * (float)((int)(i % (size_t)D) % 5 - 2);
  }
}

/* The reference's export of L tokens, as the cache c stores them but with the given v_clip. */
static unsigned char *expect(const kivi_cache *c, int L, const float *k, const float *v, int vclip, size_t *bytes) {
  kivi_cache_config f;
  ck_assert_int_eq(kivi_cache_get_config(c, &f), KIVI_OK);
  const ref_geom g = {f.head_dim, f.n_kv_heads, f.group, f.residual, f.k_bits, f.v_bits, f.sinks, vclip};
  return tu_ref_export(&g, f.rotate, L, k, v, bytes);
}

/* Sequence seq (L tokens, layer 1) of the cache: its export dequantized by the reference, keys
 * *kd and values *vd [L][H][D] (malloc'd). */
static void dequant(const kivi_cache *c, int seq, int L, double **kd, double **vd) {
  kivi_cache_config f;
  ck_assert_int_eq(kivi_cache_get_config(c, &f), KIVI_OK);
  const ref_geom g = {f.head_dim, f.n_kv_heads, f.group, f.residual, f.k_bits, f.v_bits, f.sinks, f.v_clip};
  size_t ne = 0;
  unsigned char *e = tu_export(c, seq, 1, &ne);
  *kd = malloc((size_t)L * g.H * g.D * 8);
  *vd = malloc((size_t)L * g.H * g.D * 8);
  ref_dequant_export(&g, L, e, *kd, *vd);
  free(e);
}

/* Hand-worked group (2 bits, G = 32): 15 values -1, 15 values +1, one -8, one +8.  h = 8; the
 * candidates a = i/16 give ranges [-8 + i/2, 8 - i/2] and squared errors 83.3 (i = 0, min/max:
 * +-1 -> +-2.67), 33.3 (i = 5), 31.3 (i = 6: levels -5, -1.67, 1.67, 5; +-1 -> +-1.67, +-8 ->
 * +-5), 32.0 (i = 7), 35.3 (i = 8): the group stores scale fp16(10/3) and zero -5. */
START_TEST(hand_worked_group) {
  enum { D = 32, L = 130 };
  kivi_cache *c = make(1, D, 32, 2, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FP32, 1, 256);
  float *k = tu_random((size_t)L * D, 5, 1.0f), *v = tu_random((size_t)L * D, 6, 1.0f);
  for (int ch = 0; ch < D; ++ch) v[ch] = ch < 15 ? -1.0f : ch < 30 ? 1.0f : ch == 30 ? -8.0f : 8.0f;
  const int s0 = 0, n = L;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  double *kd, *vd;
  dequant(c, 0, L, &kd, &vd);
  const double s = ref_f16_val(ref_f16(10.0f / 3.0f)); /* 3.333984375 */
  for (int ch = 0; ch < D; ++ch) {
    const double want = ch < 15 ? -5.0 + s : ch < 30 ? -5.0 + 2 * s : ch == 30 ? -5.0 : -5.0 + 3 * s;
    ck_assert_msg(vd[ch] == want, "channel %d: %.9g, expected %.9g", ch, vd[ch], want);
  }
  free(kd); free(vd); free(k); free(v);
  kivi_cache_destroy(c);
}
END_TEST

/* One case: tokens in dtype dt, memory mem, to three sequences: all at once (0), in pieces
 * (1), one token at a time (2); each export against the reference, which must differ from the
 * min/max export (the search changed some groups) at 2 and 4 bits. */
static void append_case(int D, int G, int kb, int vb, int rot, int S, kivi_dtype dt, kivi_mem mem) {
  enum { H = 2, L = 300 };
  const size_t n = (size_t)L * H * D, esz = dt == KIVI_F32 ? 4 : 2, row = (size_t)H * D * esz;
  float *k, *v;
  tokens_of(L, H, D, 900 + D + G + vb + S, &k, &v);
  unsigned char *kin = tu_input(dt, k, n), *vin = tu_input(dt, v, n);
  void *kd = kin, *vd = vin;
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &kd), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &vd), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, kd, kin, n * esz), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, vd, vin, n * esz), KIVI_OK);
  }
  kivi_cache *c = make(H, D, G, kb, vb, rot, S, KIVI_ATTENTION_FP32, 3, 512);
  const int s0 = 0, s1 = 1, s2 = 2, all = L, pieces[6] = {1, 40, 129, 7, 100, 23};
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &all, kd, vd, dt, mem), KIVI_OK);
  for (int i = 0, t = 0; i < 6; t += pieces[i++])
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &pieces[i], (unsigned char *)kd + t * row,
                                       (unsigned char *)vd + t * row, dt, mem), KIVI_OK);
  for (int t = 0, one = 1; t < L; ++t)
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s2, &one, (unsigned char *)kd + t * row,
                                       (unsigned char *)vd + t * row, dt, mem), KIVI_OK);
  size_t nr = 0, nm = 0;
  unsigned char *r = expect(c, L, k, v, 1, &nr), *mm = expect(c, L, k, v, 0, &nm);
  if (vb < 8) /* at 8 bits min/max is nearly always best */
    ck_assert_msg(nr == nm && memcmp(r, mm, nr) != 0, "the search changed no group (D %d G %d %d bits)", D, G, vb);
  for (int q = 0; q < 3; ++q) {
    size_t ne = 0;
    unsigned char *e = tu_export(c, q, 1, &ne);
    ck_assert_msg(ne == nr && memcmp(e, r, ne) == 0, "seq %d: export differs (D %d G %d K%d V%d rot %d S %d dt %d mem %d)",
                  q, D, G, kb, vb, rot, S, (int)dt, (int)mem);
    free(e);
  }
  free(r);
  free(mm);
  if (mem == KIVI_MEM_DEVICE) {
    kivi_context_free(ctx, kd);
    kivi_context_free(ctx, vd);
  }
  free(kin); free(vin); free(k); free(v);
  kivi_cache_destroy(c);
}

START_TEST(append_matches_reference) {
  append_case(64, 32, 2, 2, KIVI_ROTATE_NONE, 0, KIVI_F32, KIVI_MEM_HOST);
  append_case(64, 64, 4, 2, KIVI_ROTATE_KV, 4, KIVI_F16, KIVI_MEM_HOST);
  append_case(128, 32, 4, 4, KIVI_ROTATE_NONE, 0, KIVI_BF16, KIVI_MEM_HOST);
  append_case(128, 128, 2, 8, KIVI_ROTATE_NONE, 0, KIVI_F32, KIVI_MEM_HOST);
  append_case(128, 32, 2, 2, KIVI_ROTATE_KV, 4, KIVI_F32, KIVI_MEM_DEVICE);
  append_case(128, 32, 4, 2, KIVI_ROTATE_NONE, 0, KIVI_F16, KIVI_MEM_DEVICE); /* aligned fp16: direct */
  append_case(64, 32, 2, 2, KIVI_ROTATE_NONE, 1, KIVI_BF16, KIVI_MEM_DEVICE);
}
END_TEST

/* Each quantized value group of a 2-bit, G = 32 cache (no sinks, no rotation: the export's
 * values after the keys are the tokens' own) against the min/max rule, errors in double. */
START_TEST(search_lowers_error) {
  enum { H = 1, D = 64, L = 1000, G = 32 };
  float *k, *v;
  tokens_of(L, H, D, 31, &k, &v);
  kivi_cache *c = make(H, D, G, 2, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FP32, 1, 1024);
  const int s0 = 0, n = L;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  double *kd, *vd;
  dequant(c, 0, L, &kd, &vd);
  double tot_clip = 0.0, tot_mm = 0.0;
  int narrowed = 0;
  for (int t = 0; t < L - 128; ++t)
    for (int cg = 0; cg < D / G; ++cg) {
      const float *x = v + (size_t)t * D + cg * G;
      double mn = INFINITY, mx = -INFINITY, e_clip = 0.0, e_mm = 0.0;
      for (int i = 0; i < G; ++i) {
        mn = fmin(mn, ref_round_f16(x[i]));
        mx = fmax(mx, ref_round_f16(x[i]));
      }
      const double s = ref_f16_val(ref_f16((float)((mx - mn) / 3))), z = mn;
      for (int i = 0; i < G; ++i) {
        const double f = ref_round_f16(x[i]);
        const double dm = fmin(fmax(floor((f - z) / s + 0.5), 0.0), 3.0) * s + z - f, dc = vd[(size_t)t * D + cg * G + i] - f;
        e_mm += dm * dm;
        e_clip += dc * dc;
      }
      ck_assert_msg(e_clip <= e_mm * (1.0 + CLIP_NOT_WORSE), "token %d group %d: %.6g > min/max %.6g", t, cg, e_clip,
                    e_mm);
      narrowed += e_clip < e_mm * (1.0 - CLIP_NOT_WORSE);
      tot_clip += e_clip;
      tot_mm += e_mm;
    }
  ck_assert_msg(tot_clip <= (1.0 - CLIP_GAIN) * tot_mm, "squared error %.6g against min/max %.6g", tot_clip, tot_mm);
  ck_assert_int_gt(narrowed, (L - 128) * (D / G) / 2);
  free(kd); free(vd); free(k); free(v);
  kivi_cache_destroy(c);
}
END_TEST

/* Decode of two sequences (300 and 1,100 tokens) against double attention over the export. */
static void decode_case(int D, int HQ, int rot, int S, int mode, double tol) {
  enum { H = 2 };
  const int lens[2] = {300, 1100};
  kivi_cache *c = make(H, D, 32, 2, 2, rot, S, mode, 2, 2048);
  float *k[2], *v[2];
  for (int i = 0; i < 2; ++i) {
    tokens_of(lens[i], H, D, 70 + i, &k[i], &v[i]);
    for (size_t j = 0; j < (size_t)2 * H * D; ++j) k[i][j] *= mode == KIVI_ATTENTION_FAST ? 0.125f : 1.0f;
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &i, &lens[i], k[i], v[i], KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  }
  const size_t nq = (size_t)2 * HQ * D;
  float *q = tu_random(nq, 8, 1.0f), *out = malloc(nq * 4);
  const int ids[2] = {0, 1};
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_decode(c, 1, 2, ids, HQ, q, scale, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  double err = 0.0, mxr = 0.0;
  for (int i = 0; i < 2; ++i) {
    const int L = lens[i];
    double *kd, *vd, *ref = malloc((size_t)HQ * D * 8);
    dequant(c, i, L, &kd, &vd);
    tu_ref_attention_rot(L, H, HQ, D, kd, vd, q + (size_t)i * HQ * D, rot, scale, ref);
    for (int j = 0; j < HQ * D; ++j) {
      err = fmax(err, fabs(out[(size_t)i * HQ * D + j] - ref[j]));
      mxr = fmax(mxr, fabs(ref[j]));
    }
    free(kd); free(vd); free(ref);
  }
  ck_assert_msg(err <= tol * mxr, "decode error %.3g of max |ref| (D %d HQ %d rot %d S %d mode %d)", err / mxr, D, HQ,
                rot, S, mode);
  for (int i = 0; i < 2; ++i) {
    free(k[i]);
    free(v[i]);
  }
  free(q);
  free(out);
  kivi_cache_destroy(c);
}

START_TEST(decode_matches_reference) {
  decode_case(64, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FP32, CLIP_TOL);
  decode_case(128, 4, KIVI_ROTATE_KV, 4, KIVI_ATTENTION_FP32, CLIP_TOL);
  decode_case(128, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FAST, CLIP_FAST_TOL);
  decode_case(128, 8, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FAST, CLIP_FAST_TOL);
  decode_case(64, 6, KIVI_ROTATE_KV, 4, KIVI_ATTENTION_FAST, CLIP_FAST_TOL);
}
END_TEST

/* A checkpoint does not record the option: saved from a cache with it, it loads into one
 * without (and back), with the same export; both then quantize later values by their own rule. */
START_TEST(checkpoint_loads_either_way) {
  enum { H = 2, D = 64, L = 400 };
  float *k, *v;
  tokens_of(L, H, D, 41, &k, &v);
  kivi_cache *a = make(H, D, 32, 2, 2, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FP32, 1, 512);
  kivi_cache_config cfg;
  ck_assert_int_eq(kivi_cache_get_config(a, &cfg), KIVI_OK);
  cfg.v_clip = KIVI_CLIP_NONE;
  kivi_cache *b = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &b), KIVI_OK);
  const int s0 = 0, n = L;
  ck_assert_int_eq(kivi_cache_append(a, 1, 1, &s0, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  size_t nb = 0;
  ck_assert_int_eq(kivi_cache_save(a, 0, NULL, &nb), KIVI_OK);
  unsigned char *buf = malloc(nb);
  ck_assert_int_eq(kivi_cache_save(a, 0, buf, &nb), KIVI_OK);
  ck_assert_int_eq(kivi_cache_load(b, 0, buf, nb), KIVI_OK);
  size_t na = 0, nbx = 0;
  unsigned char *ea = tu_export(a, 0, 1, &na), *eb = tu_export(b, 0, 1, &nbx);
  ck_assert(na == nbx && memcmp(ea, eb, na) == 0);
  free(ea); free(eb); free(buf); free(k); free(v);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
}
END_TEST

START_TEST(config_checked) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, 1, 64, 1, 64);
  ck_assert_int_eq(cfg.v_clip, KIVI_CLIP_NONE);
  cfg.v_clip = KIVI_CLIP_MSE;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_OK);
  cfg.v_clip = 2;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_ERR_ARG);
  cfg.v_clip = -1;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_ERR_ARG);
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_ERR_ARG);
  ck_assert_ptr_null(c);
}
END_TEST

int main(void) {
  Suite *s = suite_create("vclip");
  TCase *tc = tcase_create("vclip");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, hand_worked_group);
  tcase_add_test(tc, append_matches_reference);
  tcase_add_test(tc, search_lowers_error);
  tcase_add_test(tc, decode_matches_reference);
  tcase_add_test(tc, checkpoint_loads_either_way);
  tcase_add_test(tc, config_checked);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
