/* Fused attention against a double-precision reference computed on the dequantized cache
 * (the export, dequantized by tests/ref).  Decode and extend, GQA ratios 1/3/4/8, ragged
 * batches, boundary lengths, chunked prefill, fp16 output, device pointers, D = 64/96/128; on a
 * GPU each layout on the kernel that should take it. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

/* ATTN_REL_TOL: max |out - ref| / max |ref| with fp32 accumulation against double. */
#define ATTN_REL_TOL 1e-5
/* FAST_REL_TOL: the GPU kernel of 2- and 4-bit caches (KIVI_ATTENTION_FAST): q * scale in two f16
 * parts, p * scale in one, fp32 accumulation on the tensor cores: fp16-attention accuracy class. */
#define FAST_REL_TOL 2e-3
/* F16_MMA_REL_TOL: the GPU kernel of 16-bit caches (KIVI_KERNEL_GPU_F16): exact fp16 K/V times q
 * and p carried as two f16 parts (22 bits), fp32 accumulation on the tensor cores: the portable
 * kernel's class (H200: at most 4.1e-7 on the degenerate patterns). */
#define F16_MMA_REL_TOL 1e-5
/* GQA_SHARP_REL_TOL: the GQA kernel (KIVI_KERNEL_GPU_GQA) on sharp attention.  Its K operands
 * q * scale are two f16 parts (22 bits), so it holds FAST_REL_TOL like the other cases. */
#define GQA_SHARP_REL_TOL FAST_REL_TOL
/* NEW_REL_TOL: the GPU kernel of an extend call's new tokens (KIVI_KERNEL_GPU_NEW): q, k, p and v
 * rounded to f16 operands (each scaled by a power of two into f16's range), fp32 accumulation on
 * the tensor cores: fp16-attention accuracy class. */
#define NEW_REL_TOL FAST_REL_TOL
/* NEW_SHARP_REL_TOL: the same kernel on sharp attention (q 1.5 x a key: logits near 60).  An f16
 * q and k carry a logit to about 2^-11 of itself (3e-2 at 60), and the output moves by up to
 * p0 p1 |x0 - x1 error| |v0 - v1| (0.25 x 3e-2 x 2 of max |output|): what fp16 attention gives
 * (the emulated GPU and an H100: 8.5e-3). */
#define NEW_SHARP_REL_TOL 2e-2
/* SHARP_REL_TOL: the fp32-class kernels (portable, fp16 cache's) on sharp attention, where a few
 * logits reach about 70 (base 2): an fp32 logit that large is only good to about 2^-24 x 70 x
 * sqrt(D) absolute, about 5e-5 (host, portable: up to 1.3e-5; H200, the fp16 cache's kernel,
 * whose tensor-core fp32 sums do not round each addition: up to 1.1e-5). */
#define SHARP_REL_TOL 5e-5
/* LSE_ABS_TOL: log-sum-exp in natural-log units (values of order 1..10). */
#define LSE_ABS_TOL 2e-5

static kivi_context *ctx;
static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

typedef struct acase {
  int D, H, HQ, kb, vb, G, R;
  float mag; /* V magnitude (0: 1) */
} acase;

static kivi_cache *make_cache(const acase *a, int seqs, int maxlen) {
  return tu_cache(ctx, 1, a->H, a->D, seqs, maxlen, a->kb, a->vb, a->G, a->R);
}

/* Keys with an outlier channel, values of magnitude mag with a per-channel offset. */
static void make_kv(const acase *a, int L, uint64_t seed, float **k, float **v) {
  const size_t n = (size_t)(L > 0 ? L : 1) * a->H * a->D;
  const float m = a->mag > 0.0f ? a->mag : 1.0f;
  *k = tu_random(n, seed, 1.0f);
  *v = tu_random(n, seed + 1, m);
  for (size_t i = 0; i < n; ++i) {
    const int ch = (int)(i % (size_t)a->D);
    if (ch == 3) (*k)[i] *= 20.0f;
    (*v)[i] += m * 0.5f * (float)((ch * 37) % 11 - 5) / 5.0f;
  }
}

/* The reference's view of one sequence: dequantized K/V of the cache [L][H][D]. */
static void dequant_seq(const kivi_cache *c, const acase *a, int seq, int L, double **kd, double **vd) {
  size_t n;
  ck_assert_int_eq(kivi_cache_export_seq(c, seq, 0, NULL, &n), KIVI_OK);
  unsigned char *e = malloc(n ? n : 1);
  ck_assert_int_eq(kivi_cache_export_seq(c, seq, 0, e, &n), KIVI_OK);
  const ref_geom g = {a->D, a->H, a->G, a->R, a->kb, a->vb, 0, 0};
  const size_t ne = (size_t)(L > 0 ? L : 1) * a->H * a->D;
  *kd = malloc(ne * sizeof(double));
  *vd = malloc(ne * sizeof(double));
  ref_dequant_export(&g, L, e, *kd, *vd);
  free(e);
}

static double rel_err(const float *got, const double *want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!isfinite(got[i])) return INFINITY; /* (fmax would skip a NaN) */
    num = fmax(num, fabs((double)got[i] - want[i]));
    den = fmax(den, fabs(want[i]));
  }
  return num / (den > 0 ? den : 1);
}

/* The tolerance of the kernel that ran (kivi_cache_last_kernels), sharp: the sharp-attention case. */
static double kernel_tol(unsigned kernels, int sharp) {
  if (kernels & KIVI_KERNEL_GPU_NEW) return sharp ? NEW_SHARP_REL_TOL : NEW_REL_TOL; /* (the widest class) */
  if (kernels & KIVI_KERNEL_GPU_F16X2) return sharp && (kernels & KIVI_KERNEL_GPU_GQA) ? GQA_SHARP_REL_TOL : FAST_REL_TOL;
  if (sharp) return SHARP_REL_TOL;
  return (kernels & KIVI_KERNEL_GPU_F16) ? F16_MMA_REL_TOL : ATTN_REL_TOL;
}
static const char *kernel_name(unsigned kernels) {
  return (kernels & KIVI_KERNEL_GPU_GQA)     ? "gpu-gqa"
         : (kernels & KIVI_KERNEL_GPU_F16)   ? "gpu-f16"
                                             : "portable";
}

static void append_all(kivi_cache *c, int seq, int L, const float *k, const float *v) {
  if (L == 0) return;
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &seq, &L, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
}

/* Decode over a ragged batch; every row against the reference on the dequantized cache.  Also
 * reports (loosely bounded) the error against attention on the original fp32 K/V. */
static void decode_case_max(const acase *a, int nseq, const int *len, uint64_t seed, int maxlen) {
  kivi_cache *c = make_cache(a, nseq, maxlen);
  float **k = malloc(sizeof(float *) * nseq), **v = malloc(sizeof(float *) * nseq);
  for (int s = 0; s < nseq; ++s) {
    make_kv(a, len[s], seed + 10 * (uint64_t)s, &k[s], &v[s]);
    append_all(c, s, len[s], k[s], v[s]);
  }
  const size_t qn = (size_t)a->HQ * a->D;
  float *q = tu_random(qn * nseq, seed + 99, 1.0f), *out = malloc(sizeof(float) * qn * nseq);
  int *ids = malloc(sizeof(int) * nseq);
  for (int s = 0; s < nseq; ++s) ids[s] = nseq - 1 - s; /* batch order != slot order */
  const float scale = 1.0f / sqrtf((float)a->D);
  ck_assert_int_eq(kivi_attention_decode(c, 0, nseq, ids, a->HQ, q, scale, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
  const double tol = kernel_tol(kernels, 0);
  double *ref = malloc(sizeof(double) * qn), worst = 0, worst_fp = 0;
  for (int i = 0; i < nseq; ++i) {
    const int s = ids[i];
    double *kd, *vd;
    dequant_seq(c, a, s, len[s], &kd, &vd);
    ref_attention(len[s], a->H, a->HQ, a->D, kd, vd, q + qn * i, scale, ref, NULL);
    const double e = rel_err(out + qn * i, ref, qn);
    ck_assert_msg(e <= tol, "D%d H%d HQ%d k%d v%d L=%d: rel err %.3g > %.1g", a->D, a->H, a->HQ, a->kb, a->vb,
                  len[s], e, tol);
    worst = fmax(worst, e);
    /* against the original full-precision K/V */
    const size_t ne = (size_t)len[s] * a->H * a->D;
    for (size_t j = 0; j < ne; ++j) { kd[j] = k[s][j]; vd[j] = v[s][j]; }
    ref_attention(len[s], a->H, a->HQ, a->D, kd, vd, q + qn * i, scale, ref, NULL);
    worst_fp = fmax(worst_fp, rel_err(out + qn * i, ref, qn));
    free(kd);
    free(vd);
  }
  /* FP_REL_BOUND: quantization error, loose: 2-bit 0.35, 4-bit 0.05, 8-bit/fp16 0.005 */
  const int b = a->kb < a->vb ? a->kb : a->vb;
  const double bound = b == 2 ? 0.35 : b == 4 ? 0.05 : 0.005;
  ck_assert_msg(worst_fp <= bound, "error vs fp32 K/V %.3g > %.3g", worst_fp, bound);
  printf("decode D%-3d H%d HQ%-2d k%-2d v%-2d G%-3d R%-3d batch %d (%s): rel err vs dequantized %.2e, vs fp32 K/V %.2e\n",
         a->D, a->H, a->HQ, a->kb, a->vb, a->G, a->R, nseq, kernel_name(kernels), worst, worst_fp);
  for (int s = 0; s < nseq; ++s) { free(k[s]); free(v[s]); }
  free(k); free(v); free(q); free(out); free(ids); free(ref);
  kivi_cache_destroy(c);
}
static void decode_case(const acase *a, int nseq, const int *len, uint64_t seed) { decode_case_max(a, nseq, len, seed, 4096); }

START_TEST(decode_boundary_lengths) {
  /* K and V 2-bit (_i = 0), 4-bit (1), K4 V2 (2), K2 V4 (3): on a GPU all take the fast path
   * (the GQA kernel takes mixed widths), whose tail blocks see every case: no quantized
   * token (1 .. 128), values quantized for fewer than 32 tokens (129), none left over after
   * whole grains (160), no fp16 key (256 = 2R) */
  const int kb = _i == 0 || _i == 3 ? 2 : 4, vb = _i == 0 || _i == 2 ? 2 : 4;
  const acase a = {128, 2, 2, kb, vb, 32, 128, 0};
  const int len[] = {1, 5, 127, 128, 129, 32, 2 * 128 + 32 + 3, 1500, 160, 256};
  decode_case(&a, 10, len, 1 + (uint64_t)_i);
}
END_TEST

/* Small and large values (the GPU fast path keeps its f16 operands in range from the cache's
 * exponent bounds of the V scales and zeros, whatever they are), 2- and 4-bit, and K4 V2. */
START_TEST(decode_magnitudes) {
  const float mags[] = {1e-3f, 100.0f};
  const int len[] = {700, 300, 129};
  const int widths[3][2] = {{2, 2}, {4, 4}, {4, 2}}; /* K, V bits */
  for (int w = 0; w < 3; ++w)
    for (int i = 0; i < 2; ++i) {
      const acase a = {128, 2, 4, widths[w][0], widths[w][1], 32, 128, mags[i]};
      decode_case(&a, 3, len, 500 + (uint64_t)(widths[w][0] + widths[w][1] + i));
    }
}
END_TEST

START_TEST(decode_gqa_ratios) {
  const acase cases[] = {
      {64, 3, 9, 2, 2, 32, 128, 0},     /* SmolLM2: ratio 3 */
      {128, 2, 8, 4, 4, 32, 128, 0},    /* ratio 4 */
      {128, 1, 8, 2, 4, 32, 64, 0},     /* MQA, ratio 8 */
      {64, 4, 4, 4, 2, 64, 128, 0},     /* MHA, G=64 */
      {128, 1, 32, 2, 2, 128, 128, 0},  /* 32 query heads over one kv-head: several head chunks */
      {96, 2, 4, 8, 8, 32, 64, 0},      /* head_dim 96 works too */
      {128, 2, 4, 16, 16, 32, 128, 0},  /* the fp16 path */
      {128, 2, 6, 2, 2, 32, 32, 0},     /* the GPU fast path with the smallest window */
      {128, 1, 4, 2, 2, 32, 512, 0},    /* ... and a long one (a tail block of up to 543 tokens) */
      {64, 3, 9, 2, 2, 32, 32, 1e-3f},  /* head_dim 64 (on a GPU the GQA kernel): smallest window, */
      {64, 3, 9, 4, 4, 32, 32, 100.0f}, /* small and large values, */
      {64, 3, 9, 4, 2, 32, 128, 0},     /* mixed widths */
      {64, 3, 9, 2, 4, 32, 32, 0},
  };
  const int len[] = {700, 129, 1, 300};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) decode_case(&cases[i], 4, len, 100 + i);
}
END_TEST

/* Extend: rows see the cache plus the new tokens causally; checked against the reference on
 * the dequantized cache extended by the new fp32 tokens, within the tolerance of the kernels
 * that ran (kernels: kivi_cache_last_kernels; sharp: the sharp-attention case).  lse too: within
 * LSE_ABS_TOL, or within tol itself where that is a looser class (sharp attention: lse near 55,
 * whose logits fp32 holds to about SHARP_REL_TOL absolute; the GQA kernel's FAST_REL_TOL), or,
 * where the new tokens' kernel ran (kernels: kivi_cache_last_kernels), within NEW_REL_TOL relative
 * (f16 operands: a logit is good to about 2^-11 of itself).  Returns the largest error. */
static double extend_check_tol(kivi_cache *c, const acase *a, int seq, int L, int qlen, const float *q,
                               const float *kn, const float *vn, const float *out, const float *lse, float scale,
                               unsigned kernels, int sharp) {
  const double tol = kernel_tol(kernels, sharp);
  double *kd, *vd;
  dequant_seq(c, a, seq, L, &kd, &vd);
  const size_t row = (size_t)a->H * a->D, qn = (size_t)a->HQ * a->D;
  kd = realloc(kd, sizeof(double) * (L + qlen) * row);
  vd = realloc(vd, sizeof(double) * (L + qlen) * row);
  for (size_t i = 0; i < (size_t)qlen * row; ++i) {
    kd[(size_t)L * row + i] = kn[i];
    vd[(size_t)L * row + i] = vn[i];
  }
  double *ref = malloc(sizeof(double) * qn), *rl = malloc(sizeof(double) * a->HQ), worst = 0;
  for (int j = 0; j < qlen; ++j) {
    ref_attention(L + j + 1, a->H, a->HQ, a->D, kd, vd, q + qn * j, scale, ref, rl);
    const double e = rel_err(out + qn * j, ref, qn);
    ck_assert_msg(e <= tol, "extend L=%d row %d: rel err %.3g", L, j, e);
    worst = fmax(worst, e);
    if (lse)
      for (int h = 0; h < a->HQ; ++h)
        ck_assert_msg(fabs(lse[(size_t)j * a->HQ + h] - rl[h]) <=
                          ((kernels & KIVI_KERNEL_GPU_NEW) ? NEW_REL_TOL * fmax(1.0, fabs(rl[h]))
                                                           : tol >= SHARP_REL_TOL ? tol : LSE_ABS_TOL),
                      "lse row %d head %d: %.7g vs %.7g", j, h,
                      lse[(size_t)j * a->HQ + h], rl[h]);
  }
  free(kd); free(vd); free(ref); free(rl);
  return worst;
}
/* Extend calls whose new tokens take the GPU's tensor-core kernel (KIVI_KERNEL_GPU_NEW, on a GPU
 * context; the portable kernel elsewhere, against the same reference and tolerance): nseq
 * sequences of ql[s] new tokens over pre[s] cached ones, K and V scaled by fk and fv and q by fq
 * (fp32 inputs far outside fp16's range), or (sharp) each row's q 1.5 x the key of the token
 * halfway back. */
static void extend_new_case(int D, int H, int HQ, int nseq, const int *pre, const int *ql, float fq, float fk, float fv,
                            int sharp, uint64_t seed) {
  const acase a = {D, H, HQ, 2, 2, 32, 128, 0};
  kivi_cache *c = make_cache(&a, nseq, 2048);
  const size_t row = (size_t)H * D, qn = (size_t)HQ * D;
  int rows = 0, *ids = malloc(sizeof(int) * nseq);
  for (int s = 0; s < nseq; ++s) {
    ids[s] = s;
    rows += ql[s];
    if (pre[s] > 0) {
      float *k, *v;
      make_kv(&a, pre[s], seed + 10 * (uint64_t)s, &k, &v);
      append_all(c, s, pre[s], k, v);
      free(k);
      free(v);
    }
  }
  float *kn, *vn, *q = tu_random(qn * rows, seed + 1, fq);
  make_kv(&a, rows, seed + 2, &kn, &vn);
  for (int r = 0, s = 0, j = 0; r < rows; ++r, ++j) {
    if (j == ql[s]) { ++s; j = 0; }
    for (int h = 0; h < HQ && sharp; ++h)
      for (int d = 0; d < D; ++d)
        q[qn * r + (size_t)h * D + d] = 1.5f * kn[(size_t)(r - j + j / 2) * row + (size_t)(h / (HQ / H)) * D + d];
  }
  for (size_t i = 0; i < row * rows; ++i) {
    kn[i] *= fk;
    vn[i] *= fv;
  }
  float *out = malloc(sizeof(float) * qn * rows), *lse = malloc(sizeof(float) * HQ * rows);
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_extend(c, 0, nseq, ids, ql, HQ, q, kn, vn, scale, out, lse, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  ck_assert_int_eq((kernels & KIVI_KERNEL_GPU_NEW) != 0, info.on_gpu && KIVI_BUILT_WITH_OFFLOAD);
  double worst = 0;
  for (int s = 0, r0 = 0; s < nseq; r0 += ql[s++])
    worst = fmax(worst, extend_check_tol(c, &a, s, pre[s], ql[s], q + qn * r0, kn + row * r0, vn + row * r0,
                                         out + qn * r0, lse + (size_t)HQ * r0, scale, kernels, sharp));
  printf("extend, D %d, %d over %d heads, %d sequences, x(%g, %g, %g)%s: kernels %#x, rel err %.2e\n", D, HQ, H, nseq,
         (double)fq, (double)fk, (double)fv, sharp ? ", sharp" : "", kernels, worst);
  free(kn); free(vn); free(q); free(out); free(lse); free(ids);
  kivi_cache_destroy(c);
}

/* Tiles of 64 rows cut anywhere, prompts that are not multiples of 32, GQA 32/8 and 9/3; cached
 * prefixes (the new tokens' partials combined with those of the cached tokens: fp16 windows,
 * and past R = 128 quantized tokens, which on a GPU take the GQA kernel and its tolerance) and
 * empty caches (the output written by the new tokens' kernel alone). */
START_TEST(extend_new_tokens) {
  const int pre1[] = {0, 120, 41}, ql1[] = {150, 97, 33};
  extend_new_case(128, 8, 32, 3, pre1, ql1, 1.0f, 1.0f, 1.0f, 0, 500);
  const int pre0[] = {300}, ql0[] = {70};
  extend_new_case(128, 2, 8, 1, pre0, ql0, 1.0f, 1.0f, 1.0f, 0, 505);
  const int pre2[] = {0, 0}, ql2[] = {200, 65};
  extend_new_case(64, 3, 9, 2, pre2, ql2, 1.0f, 1.0f, 1.0f, 0, 510);
  const int pre3[] = {0}, ql3[] = {130};
  extend_new_case(128, 2, 8, 1, pre3, ql3, 1e-5f, 1e5f, 1e-6f, 0, 520); /* beyond fp16 both ways */
  extend_new_case(64, 3, 9, 1, pre3, ql3, 1e4f, 1e-4f, 3e5f, 0, 530);
  const int pre4[] = {0, 64}, ql4[] = {129, 70};
  extend_new_case(128, 2, 8, 2, pre4, ql4, 1.0f, 1.0f, 1.0f, 1, 540); /* sharp: logits of about 60 */
}
END_TEST

START_TEST(extend_chunked_prefill) {
  const acase a = {64, 3, 9, 2, 2, 32, 128, 0};
  const int P = 700, chunk = 200;
  float *k, *v;
  make_kv(&a, P, 5, &k, &v);
  const size_t row = (size_t)a.H * a.D, qn = (size_t)a.HQ * a.D;
  float *q = tu_random(qn * P, 6, 1.0f), *out = malloc(sizeof(float) * qn * P), *lse = malloc(sizeof(float) * a.HQ * P);
  const float scale = 0.125f;
  kivi_cache *chunked = make_cache(&a, 1, 1024), *oneshot = make_cache(&a, 1, 1024);
  const int id = 0;
  for (int p0 = 0; p0 < P; p0 += chunk) {
    const int n = P - p0 < chunk ? P - p0 : chunk;
    ck_assert_int_eq(kivi_attention_extend(chunked, 0, 1, &id, &n, a.HQ, q + qn * p0, k + row * p0, v + row * p0, scale,
                                           out + qn * p0, lse + (size_t)a.HQ * p0, KIVI_MEM_HOST), KIVI_OK);
    unsigned kernels = 0; /* on a GPU the cached tokens past the window take the GQA kernel */
    ck_assert_int_eq(kivi_cache_last_kernels(chunked, &kernels), KIVI_OK);
    (void)extend_check_tol(chunked, &a, 0, p0, n, q + qn * p0, k + row * p0, v + row * p0, out + qn * p0,
                           lse + (size_t)a.HQ * p0, scale, kernels, 0);
    ck_assert_int_eq(kivi_cache_append(chunked, 0, 1, &id, &n, k + row * p0, v + row * p0, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  }
  /* one shot over the empty cache: the reference is plain fp32 attention, causal */
  ck_assert_int_eq(kivi_attention_extend(oneshot, 0, 1, &id, &P, a.HQ, q, k, v, scale, out, NULL, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(oneshot, &kernels), KIVI_OK);
  (void)extend_check_tol(oneshot, &a, 0, 0, P, q, k, v, out, NULL, scale, kernels, 0);
  ck_assert_int_eq(kivi_cache_append(oneshot, 0, 1, &id, &P, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  /* both prefills leave the same cache */
  size_t n1, n2;
  ck_assert_int_eq(kivi_cache_export_seq(chunked, 0, 0, NULL, &n1), KIVI_OK);
  ck_assert_int_eq(kivi_cache_export_seq(oneshot, 0, 0, NULL, &n2), KIVI_OK);
  ck_assert_uint_eq(n1, n2);
  unsigned char *b1 = malloc(n1), *b2 = malloc(n2);
  ck_assert_int_eq(kivi_cache_export_seq(chunked, 0, 0, b1, &n1), KIVI_OK);
  ck_assert_int_eq(kivi_cache_export_seq(oneshot, 0, 0, b2, &n2), KIVI_OK);
  ck_assert_int_eq(memcmp(b1, b2, n1), 0);
  free(b1); free(b2); free(k); free(v); free(q); free(out); free(lse);
  kivi_cache_destroy(chunked);
  kivi_cache_destroy(oneshot);
}
END_TEST

/* While the prompt fits in the fp16 window (P <= R) and the inputs are fp16 values, chunked and
 * one-shot prefill see the same numbers: their outputs agree to fp32 accuracy (on a GPU, whose
 * new tokens' kernel takes f16 operands, to twice NEW_REL_TOL: each is within it of the truth). */
START_TEST(extend_chunked_equals_oneshot_in_window) {
  const acase a = {128, 2, 8, 2, 2, 32, 128, 0};
  const int P = 120, chunk = 37;
  float *k, *v;
  make_kv(&a, P, 8, &k, &v);
  const size_t row = (size_t)a.H * a.D, qn = (size_t)a.HQ * a.D;
  for (size_t i = 0; i < (size_t)P * row; ++i) { k[i] = ref_round_f16(k[i]); v[i] = ref_round_f16(v[i]); }
  float *q = tu_random(qn * P, 9, 1.0f), *o1 = malloc(sizeof(float) * qn * P), *o2 = malloc(sizeof(float) * qn * P);
  kivi_cache *c1 = make_cache(&a, 1, 512), *c2 = make_cache(&a, 1, 512);
  const int id = 0;
  for (int p0 = 0; p0 < P; p0 += chunk) {
    const int n = P - p0 < chunk ? P - p0 : chunk;
    ck_assert_int_eq(kivi_attention_extend(c1, 0, 1, &id, &n, a.HQ, q + qn * p0, k + row * p0, v + row * p0, 0.09f,
                                           o1 + qn * p0, NULL, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_append(c1, 0, 1, &id, &n, k + row * p0, v + row * p0, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  }
  ck_assert_int_eq(kivi_attention_extend(c2, 0, 1, &id, &P, a.HQ, q, k, v, 0.09f, o2, NULL, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0; /* on a GPU the new tokens' kernel (f16 operands): each within its class of the truth */
  ck_assert_int_eq(kivi_cache_last_kernels(c2, &kernels), KIVI_OK);
  const double tol = (kernels & KIVI_KERNEL_GPU_NEW) ? 2 * NEW_REL_TOL : ATTN_REL_TOL;
  double num = 0, den = 0;
  for (size_t i = 0; i < qn * P; ++i) { num = fmax(num, fabs(o1[i] - o2[i])); den = fmax(den, fabs(o2[i])); }
  ck_assert_msg(num / den <= tol, "chunked vs one-shot: %.3g", num / den);
  free(k); free(v); free(q); free(o1); free(o2);
  kivi_cache_destroy(c1);
  kivi_cache_destroy(c2);
}
END_TEST

/* Decode after appending a token equals extend with q_len = 1 before appending it, when the
 * token is an fp16 value and the append quantizes nothing (the token stays in both windows);
 * past the window both are checked against the reference of their own cache state. */
START_TEST(decode_equals_extend_qlen1) {
  const acase a = {64, 3, 9, 4, 2, 32, 64, 0};
  const int lens[] = {0, 10, 62};
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; ++li) {
    const int L = lens[li];
    float *k, *v;
    make_kv(&a, L + 1, 20 + li, &k, &v);
    const size_t row = (size_t)a.H * a.D, qn = (size_t)a.HQ * a.D;
    for (size_t i = 0; i < (size_t)(L + 1) * row; ++i) { k[i] = ref_round_f16(k[i]); v[i] = ref_round_f16(v[i]); }
    float *q = tu_random(qn, 30 + li, 1.0f), o1[9 * 64], o2[9 * 64];
    kivi_cache *c = make_cache(&a, 1, 256);
    const int id = 0, one = 1;
    append_all(c, 0, L, k, v);
    ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, &one, a.HQ, q, k + row * L, v + row * L, 0.125f, o1, NULL,
                                           KIVI_MEM_HOST), KIVI_OK);
    unsigned kernels = 0; /* on a GPU the token's own logit comes from f16 operands */
    ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
    const double tol = (kernels & KIVI_KERNEL_GPU_NEW) ? NEW_REL_TOL : ATTN_REL_TOL;
    ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &one, k + row * L, v + row * L, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, a.HQ, q, 0.125f, o2, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    double num = 0, den = 0;
    for (size_t i = 0; i < qn; ++i) { num = fmax(num, fabs(o1[i] - o2[i])); den = fmax(den, fabs(o2[i])); }
    ck_assert_msg(num / den <= tol, "L=%d: decode vs extend(1) %.3g", L, num / den);
    free(k); free(v); free(q);
    kivi_cache_destroy(c);
  }
}
END_TEST

/* fp16 output = fp16 rounding of the fp32 output; device pointers give the host-pointer result. */
START_TEST(decode_f16_out_and_device_pointers) {
  const acase a = {128, 2, 8, 2, 2, 32, 128, 0};
  const int L = 900, id = 0;
  float *k, *v;
  make_kv(&a, L, 40, &k, &v);
  kivi_cache *c = make_cache(&a, 1, 1024);
  append_all(c, 0, L, k, v);
  const size_t qn = (size_t)a.HQ * a.D;
  float *q = tu_random(qn, 41, 1.0f), out[8 * 128], out_dev[8 * 128];
  uint16_t out16[8 * 128];
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, a.HQ, q, 0.1f, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, a.HQ, q, 0.1f, out16, KIVI_F16, KIVI_MEM_HOST), KIVI_OK);
  for (size_t i = 0; i < qn; ++i) ck_assert_uint_eq(out16[i], ref_f16(out[i]));
  void *dq = NULL, *dout = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, qn * 4, &dq), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, qn * 4, &dout), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dq, q, qn * 4), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, a.HQ, (const float *)dq, 0.1f, dout, KIVI_F32, KIVI_MEM_DEVICE),
                   KIVI_OK);
  ck_assert_int_eq(kivi_context_download(ctx, out_dev, dout, qn * 4), KIVI_OK);
  ck_assert_int_eq(memcmp(out, out_dev, qn * 4), 0);
  kivi_context_free(ctx, dq);
  kivi_context_free(ctx, dout);
  free(k); free(v); free(q);
  kivi_cache_destroy(c);
}
END_TEST

/* The degenerate patterns of decode_degenerate_groups (below) applied to L tokens of keys k and
 * values v: 0 a constant key channel, 1 a key channel of tiny values, 2 every 17th token's values
 * constant, 3 all three, 5 an outlier key every 300 tokens in channel 9 (degrade_q zeroes the
 * queries there); 4 (sharp attention) is the caller's q. */
static void degrade_kv(const acase *a, int L, float *k, float *v, int pattern) {
  for (int t = 0; t < L; ++t)
    for (int h = 0; h < a->H; ++h) {
      float *kr = k + ((size_t)t * a->H + h) * a->D, *vr = v + ((size_t)t * a->H + h) * a->D;
      if (pattern == 0 || pattern == 3) kr[5] = 0.37f;
      if (pattern == 1 || pattern == 3) kr[7] = (t & 1) ? 0x1p-24f : 0.0f;
      if ((pattern == 2 || pattern == 3) && t % 17 == 0)
        for (int d = 0; d < a->D; ++d) vr[d] = 1.25f;
      if (pattern == 5 && t % 300 == 150) kr[9] = 3e4f;
    }
}

/* Pattern 5's queries (nvec vectors of D): channel 9, the outliers' channel, weighed 0. */
static void degrade_q(float *q, size_t nvec, int D, int pattern) {
  if (pattern == 5)
    for (size_t i = 0; i < nvec; ++i) q[i * D + 9] = 0.0f;
}

/* Rows of the paper configurations (kb-bit keys, vb-bit values, head_dim D, G=32, R=128), H
 * kv-heads and HQ query heads, decoded in mode (0: fast, 1: FP32) against the reference with the mode's
 * tolerance.  On a GPU the fast mode runs the GQA kernel alone; the FP32 mode always runs the
 * portable kernel.  kind: 0 plain, 1 sharp attention,
 * RC_DEGEN + p the degenerate pattern p (degrade_kv, degrade_q). */
#define RC_DEGEN 2
static void rows_case_d(int D, int kb, int vb, int mode, int H, int HQ, int nrows, const int *len, int kind) {
  const acase a = {D, H, HQ, kb, vb, 32, 128, 0};
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, a.H, a.D, nrows, 9216);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.attention = mode ? KIVI_ATTENTION_FP32 : KIVI_ATTENTION_FAST;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  float **k = malloc(sizeof(float *) * nrows), **v = malloc(sizeof(float *) * nrows);
  int *ids = malloc(sizeof(int) * nrows);
  for (int s = 0; s < nrows; ++s) {
    make_kv(&a, len[s], 300 + (uint64_t)s, &k[s], &v[s]);
    if (kind >= RC_DEGEN) degrade_kv(&a, len[s], k[s], v[s], kind - RC_DEGEN);
    append_all(c, s, len[s], k[s], v[s]);
    ids[s] = s;
  }
  const size_t qn = (size_t)a.HQ * a.D;
  float *q = tu_random(qn * nrows, 77, 1.0f), *out = malloc(sizeof(float) * qn * nrows);
  if (kind >= RC_DEGEN) degrade_q(q, (size_t)a.HQ * nrows, a.D, kind - RC_DEGEN);
  if (kind == 1) /* sharp attention: q = 1.5 x the key of token len / 3 (as degenerate_case's pattern 4) */
    for (int s = 0; s < nrows; ++s)
      for (int hq = 0; hq < a.HQ; ++hq)
        for (int d = 0; d < a.D; ++d)
          q[qn * s + (size_t)hq * a.D + d] = 1.5f * k[s][((size_t)(len[s] / 3) * a.H + hq / (a.HQ / a.H)) * a.D + d];
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_decode(c, 0, nrows, ids, a.HQ, q, scale, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  const int fast = (kernels & KIVI_KERNEL_GPU_F16X2) != 0;
  ck_assert_int_eq(fast, info.on_gpu && mode == 0 && KIVI_BUILT_WITH_OFFLOAD);
  /* a fast decode is the GQA kernel alone (one launch, fp16 windows and combine included) */
  ck_assert_uint_eq(kernels, fast ? KIVI_KERNEL_GPU_F16X2 | KIVI_KERNEL_GPU_GQA : KIVI_KERNEL_PORTABLE);
  double *ref = malloc(sizeof(double) * qn), worst = 0;
  for (int s = 0; s < nrows; ++s) {
    double *kd, *vd;
    dequant_seq(c, &a, s, len[s], &kd, &vd);
    ref_attention(len[s], a.H, a.HQ, a.D, kd, vd, q + qn * s, scale, ref, NULL);
    worst = fmax(worst, rel_err(out + qn * s, ref, qn));
    free(kd);
    free(vd);
  }
  const double tol = kernel_tol(kernels, kind == 1);
  printf("%d rows, D%d, K%d V%d, %s mode%s, HQ %d over %d: kernels %s, rel err %.2e (tolerance %.0e)\n", nrows, D,
         kb, vb, mode ? "fp32" : "fast", kind == 1 ? ", sharp" : kind ? ", degenerate" : "", a.HQ, a.H,
         kernel_name(kernels), worst, tol);
  ck_assert_msg(worst <= tol, "rel err %.3g > %.1g", worst, tol);
  for (int s = 0; s < nrows; ++s) { free(k[s]); free(v[s]); }
  free(k); free(v); free(ids); free(q); free(out); free(ref);
  kivi_cache_destroy(c);
}
static void rows_case(int b, int mode, int H, int HQ, int nrows, const int *len, int sharp) {
  rows_case_d(128, b, b, mode, H, HQ, nrows, len, sharp);
}

/* Long rows: MHA-like 2 over 2 heads, 8 over 2 and 32 over 8 (rows of 4 and 9 splits, and 3
 * tail blocks each: up to 12 partials per (row, chunk), so the last block combines with
 * fk_combine). */
START_TEST(decode_long_rows_both_modes) {
  const int len[] = {5000, 2048 + 128 + 5, 300, 9000};
  const int b = _i ? 4 : 2; /* KIVI-2, KIVI-4 */
  for (int mode = 0; mode < 2; ++mode)
    for (int gqa = 0; gqa < 3; ++gqa)
      rows_case(b, mode, gqa == 2 ? 8 : 2, gqa == 0 ? 2 : gqa == 1 ? 8 : 32, 4, len, 0);
}
END_TEST

/* 16 rows of about 2k tokens, 32 over 8 heads: 128 (row, kv-head) pairs, splits of 512 tokens
 * (kivi_plan_call), 5 split and 3 tail slots per pair; row 5 is shorter than a split, so most of its slots are empty. */
START_TEST(decode_gqa_many_rows) {
  int len[16];
  for (int s = 0; s < 16; ++s) len[s] = s == 5 ? 200 : 2300 - 29 * s;
  rows_case(_i ? 4 : 2, 0, 8, 32, 16, len, 0);
  rows_case(_i ? 4 : 2, 0, 8, 32, 16, len, 1); /* sharp attention */
}
END_TEST

/* The GQA kernel's chunks of query heads (up to 8), head_dim 64 and mixed widths, for K and V
 * 2-bit (_i = 0), 4-bit (1), K4 V2 (2) and K2 V4 (3).  Head_dim 128: 28 over 4 (7 per kv-head;
 * sharp attention and degenerate groups too), 64 over 8, 48 over 4 (12: chunks of 8 and 4), 24
 * over 8 (3 per kv-head) and 40 over 8 (5 per kv-head).  Head_dim 64:
 * SmolLM2's 9 over 3 (sharp attention too), MHA 4 over 4 (chunks of one head), 8 over 1 (one
 * chunk), and one row. */
START_TEST(decode_gqa_layouts) {
  const int len[] = {5000, 2048 + 128 + 5, 300, 9000};
  const int kb = _i == 0 || _i == 3 ? 2 : 4, vb = _i == 0 || _i == 2 ? 2 : 4;
  rows_case_d(128, kb, vb, 0, 4, 28, 4, len, 0);
  rows_case_d(128, kb, vb, 0, 4, 28, 4, len, 1);
  rows_case_d(128, kb, vb, 0, 8, 64, 4, len, 0);
  rows_case_d(128, kb, vb, 0, 4, 48, 4, len, 0);
  rows_case_d(128, kb, vb, 0, 4, 28, 4, len, RC_DEGEN + 3 + 2 * (_i & 1)); /* degenerate groups: patterns 3, 5 */
  rows_case_d(128, kb, vb, 0, 8, 24, 4, len, 0);
  rows_case_d(128, kb, vb, 0, 8, 40, 4, len, 0);
  rows_case_d(64, kb, vb, 0, 3, 9, 4, len, 0);
  rows_case_d(64, kb, vb, 0, 3, 9, 4, len, 1);
  rows_case_d(64, kb, vb, 0, 4, 4, 4, len, 0);
  rows_case_d(64, kb, vb, 0, 1, 8, 4, len, 0);
  const int one[] = {700};
  rows_case_d(64, kb, vb, 0, 3, 9, 1, one, 0); /* one row: 3 blocks per split */
}
END_TEST

/* 2 rows, 32 over 32 heads, of 4100 and 3000 tokens: rows of different split counts (the per-head
 * kernel before 2026-12-06 folded each row's last split into its tail block here). */
START_TEST(decode_folded_tail) {
  const int len[] = {4100, 3000};
  rows_case(_i ? 4 : 2, 0, 32, 32, 2, len, 0);
}
END_TEST

/* 9 rows x 32 query heads (MHA) of at most 4200 tokens (before 2026-12-06, on the per-head kernel): 288 (row, head) pairs, one 4096-token split each, and the fold gives each pair a single block that
 * takes its whole row and writes the output itself (no partials, no combine).  Rows shorter than
 * the fp16 window and than one key group are among them. */
START_TEST(decode_single_block_rows) {
  const int len[] = {4200, 700, 1500, 3000, 150, 2500, 4000, 900, 3500};
  rows_case(_i ? 4 : 2, 0, 32, 32, 9, len, 0);
}
END_TEST

/* Degenerate groups that real models have, and sharp attention, on the decode kernels (2-, 4-
 * and 16-bit, D 128, G 32, R 128, MHA and 4 query heads per kv-head): a constant key channel
 * (0.37 in every token: scale 0), a key channel of tiny values (0 or 2^-24: the scale rounds to
 * 0), every 17th token's values constant (1.25 in every channel), all three at once, one key
 * whose score dominates (q = 1.5 x that key; with the outlier channel of make_kv a few keys'
 * logits reach about 50), and an outlier token every 300 (its key's channel 9 = 3e4, so that its
 * group's scale there is about 10^4 times the others', in a channel that every query weighs 0:
 * kernels that scale their operands by the largest scale they meet must keep the other
 * groups' precision).  The error is measured against the reference on the dequantized cache
 * and held to the class of the kernel that ran (kernel_tol): sharp attention included, the GQA
 * kernel holds FAST_REL_TOL, its q * scale being two f16 parts. */
static double degenerate_case(int D, int kb, int HQ, int L, int pattern) {
  const acase a = {D, 2, HQ, kb, kb, 32, 128, 0};
  kivi_cache *c = make_cache(&a, 1, 4096);
  float *k, *v;
  make_kv(&a, L, 1000 + (uint64_t)pattern, &k, &v);
  const int hot = L / 3; /* the sharp pattern's key */
  degrade_kv(&a, L, k, v, pattern);
  append_all(c, 0, L, k, v);
  const size_t qn = (size_t)HQ * a.D;
  float *q = tu_random(qn, 77 + (uint64_t)pattern, 1.0f), *out = malloc(sizeof(float) * qn);
  degrade_q(q, (size_t)HQ, a.D, pattern);
  if (pattern == 4)
    for (int hq = 0; hq < HQ; ++hq)
      for (int d = 0; d < a.D; ++d) q[(size_t)hq * a.D + d] = 1.5f * k[((size_t)hot * a.H + hq / (HQ / a.H)) * a.D + d];
  const float scale = 1.0f / sqrtf((float)a.D);
  const int id = 0;
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, HQ, q, scale, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
  double *kd, *vd, *ref = malloc(sizeof(double) * qn);
  dequant_seq(c, &a, 0, L, &kd, &vd);
  ref_attention(L, a.H, HQ, a.D, kd, vd, q, scale, ref, NULL);
  const double e = rel_err(out, ref, qn);
  const double tol = kernel_tol(kernels, pattern == 4);
  printf("degenerate pattern %d, D%d, %d-bit, HQ %d, L %d (%s): rel err %.2e (tolerance %.0e)\n", pattern, D, kb,
         HQ, L, kernel_name(kernels), e, tol);
  free(kd); free(vd); free(ref); free(k); free(v); free(q); free(out);
  kivi_cache_destroy(c);
  return e / tol;
}

START_TEST(decode_degenerate_groups) {
  const int lens[] = {129, 257, 647, 2100};
  double worst = 0;
  for (int pattern = 0; pattern < 6; ++pattern)
    for (int kb = 2; kb <= 16; kb = kb == 2 ? 4 : kb + 12) /* 2, 4 and 16 (the fp16 cache) */
      for (int hq = 2; hq <= 8; hq *= 4)
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; ++li) {
          worst = fmax(worst, degenerate_case(128, kb, hq, lens[li], pattern));
          if (kb == 2 || kb == 4) /* head_dim 64 (the GQA kernel on a GPU): 6 and 24 query heads over 2 */
            worst = fmax(worst, degenerate_case(64, kb, 3 * hq, lens[li], pattern));
        }
  ck_assert_msg(worst <= 1.0, "a degenerate case's error is %.2f x its tolerance", worst);
}
END_TEST

/* Keys and values shaped as the KIVI paper describes a model's (its figure 2), as a new user's
 * first cache would hold them: per kv-head 2 or 3 outlier key channels (x10), a per-channel key
 * offset drawn from N(0, 0.5^2), unit normals elsewhere; values unit normals with one x10
 * channel per kv-head.  On top, the degenerate groups real models have: a constant key channel
 * (0.37), a key channel of 0 (odd kv-heads: 2^-24) and every 17th value token constant (1.25).
 * Queries unit normals.  Every fast kernel holds FAST_REL_TOL on them (2e-3 of max |ref|, against
 * the double reference on the dequantized cache); the per-head f16x2 kernel reached 6.4e-3 on an
 * H100 with MHA 2 x 128, 2-bit, 647 tokens, before MHA took the GQA kernel. */
static float tu_normal(uint64_t *st) { /* Box-Muller */
  const double u = 0.5 * (1.0 + (double)tu_uniform(st)) + 1e-12, w = 0.5 * (1.0 + (double)tu_uniform(st));
  return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * w));
}
static void paper_kv(const acase *a, int L, uint64_t seed, float **k, float **v) {
  const size_t n = (size_t)L * a->H * a->D;
  *k = malloc(n * sizeof(float));
  *v = malloc(n * sizeof(float));
  uint64_t st = seed;
  float *off = malloc(sizeof(float) * a->H * a->D), *gain = malloc(sizeof(float) * a->H * a->D);
  int *vout = malloc(sizeof(int) * a->H);
  for (int h = 0; h < a->H; ++h) {
    for (int d = 0; d < a->D; ++d) {
      off[h * a->D + d] = 0.5f * tu_normal(&st);
      gain[h * a->D + d] = 1.0f;
    }
    const int nout = 2 + (int)(tu_next(&st) % 2);
    for (int i = 0; i < nout; ++i) gain[h * a->D + (int)(tu_next(&st) % (uint64_t)(a->D - 4)) + 4] = 10.0f;
    vout[h] = (int)(tu_next(&st) % (uint64_t)a->D);
  }
  for (int t = 0; t < L; ++t)
    for (int h = 0; h < a->H; ++h) {
      float *kr = *k + ((size_t)t * a->H + h) * a->D, *vr = *v + ((size_t)t * a->H + h) * a->D;
      for (int d = 0; d < a->D; ++d) {
        kr[d] = gain[h * a->D + d] * tu_normal(&st) + off[h * a->D + d];
        vr[d] = (d == vout[h] ? 10.0f : 1.0f) * tu_normal(&st);
      }
      kr[0] = 0.37f;                                /* a constant channel: scale 0 */
      kr[1] = h & 1 ? 5.9604645e-08f : 0.0f;        /* 2^-24 or 0: the scale rounds to 0 */
      if (t % 17 == 0)
        for (int d = 0; d < a->D; ++d) vr[d] = 1.25f; /* a constant value token */
    }
  free(off);
  free(gain);
  free(vout);
}
static double paper_case(int D, int kb, int vb, int H, int HQ, int nrows, const int *len) {
  const acase a = {D, H, HQ, kb, vb, 32, 128, 0};
  kivi_cache *c = make_cache(&a, nrows, 4096);
  float **k = malloc(sizeof(float *) * nrows), **v = malloc(sizeof(float *) * nrows);
  int *ids = malloc(sizeof(int) * nrows);
  for (int s = 0; s < nrows; ++s) {
    paper_kv(&a, len[s], 5000 + 31 * (uint64_t)s + (uint64_t)(D + H + HQ + 8 * kb + vb), &k[s], &v[s]);
    append_all(c, s, len[s], k[s], v[s]);
    ids[s] = s;
  }
  const size_t qn = (size_t)HQ * D;
  float *q = malloc(sizeof(float) * qn * nrows), *out = malloc(sizeof(float) * qn * nrows);
  uint64_t st = 91 + (uint64_t)HQ;
  for (size_t i = 0; i < qn * nrows; ++i) q[i] = tu_normal(&st);
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_decode(c, 0, nrows, ids, HQ, q, scale, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  unsigned kernels = 0;
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kernels), KIVI_OK);
  double *ref = malloc(sizeof(double) * qn), worst = 0;
  for (int s = 0; s < nrows; ++s) {
    double *kd, *vd;
    dequant_seq(c, &a, s, len[s], &kd, &vd);
    ref_attention(len[s], H, HQ, D, kd, vd, q + qn * s, scale, ref, NULL);
    worst = fmax(worst, rel_err(out + qn * s, ref, qn));
    free(kd);
    free(vd);
  }
  const double tol = kernel_tol(kernels, 0);
  printf("paper keys, D%d, K%d V%d, HQ %d over %d, %d rows (%s): rel err %.2e (tolerance %.0e)\n", D, kb, vb, HQ, H,
         nrows, kernel_name(kernels), worst, tol);
  for (int s = 0; s < nrows; ++s) { free(k[s]); free(v[s]); }
  free(k); free(v); free(ids); free(q); free(out); free(ref);
  kivi_cache_destroy(c);
  return worst / tol;
}
START_TEST(decode_paper_keys) {
  const int one[] = {647}, two[] = {647, 2100};
  double worst = 0;
  for (int b = 2; b <= 4; b += 2) {
    worst = fmax(worst, paper_case(128, b, b, 2, 2, 1, one)); /* MHA, the case */
    worst = fmax(worst, paper_case(128, b, b, 2, 8, 2, two));
    worst = fmax(worst, paper_case(64, b, b, 3, 9, 2, two));
  }
  worst = fmax(worst, paper_case(128, 4, 2, 8, 32, 1, one)); /* K4 V2 */
  ck_assert_msg(worst <= 1.0, "a paper-keys case's error is %.2f x its tolerance", worst);
}
END_TEST

/* The fp16 cache's decode (on a GPU its own kernel, KIVI_KERNEL_GPU_F16): head_dim 64 and 128,
 * query heads per kv-head 1, 3, 4, 7, 8 and 12 (one chunk of up to 4 heads; beyond 4, chunks of
 * 8: 7 in one, 12 = 8 + 4), R 32 and 128, a ragged batch whose rows end in the window only
 * (1, 64), at and around a flushed block (127 .. 129) and past one or more splits (2049 .. 4090). */
START_TEST(decode_f16_cache) {
  const int lens[] = {1, 64, 127, 128, 129, 300, 2049, 4090, 700};
  const int ratios[] = {1, 3, 4, 7, 8, 12};
  for (int ri = 0; ri < 6; ++ri)
    for (int D = 64; D <= 128; D += 64) {
      const acase a = {D, D == 64 ? 3 : 2, (D == 64 ? 3 : 2) * ratios[ri], 16, 16, 32, _i ? 32 : 128, 0};
      decode_case(&a, 9, lens, 500 + 7 * (uint64_t)ri + (uint64_t)D);
    }
}
END_TEST

/* The fp16 cache's decode on a GPU with splits longer than 1024 tokens.  _i 0, 1: rows of more
 * than 8192 tokens, whose blocks the plan keeps resident at once (10 rows of 4 kv-heads, 32 query
 * heads, the longest 20000 tokens: 5 splits of 4096, 200 blocks; 9 rows: fewer than 198 blocks,
 * so 10 splits of 2048).  _i 2: 25 rows of 8 kv-heads (MHA, head_dim 64), 200 (row, head) pairs,
 * the longest 4096 tokens: one split of 4096 per row.  The rows are ragged, so blocks past a
 * row's end write empty partials.  It runs where the context is on a GPU, the emulated one
 * (tests/simt) included; on the host it would be the portable kernel of the cases above with
 * 400 MB of cache, and is not run. */
START_TEST(decode_f16_long_splits) {
  kivi_context_info info;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  if (!info.on_gpu) return;
  if (_i == 2) {
    int lens[25];
    for (int s = 0; s < 25; ++s) lens[s] = s == 3 ? 4096 : s % 5 == 1 ? 1 + s : 2049 + 61 * s;
    const acase a = {64, 8, 8, 16, 16, 32, 128, 0};
    decode_case(&a, 25, lens, 950);
    return;
  }
  const int lens[] = {20000, 1, 16385, 12288, 129, 8193, 4097, 2049, 700, 19999};
  const acase a = {128, 4, 32, 16, 16, 32, 128, 0};
  decode_case_max(&a, _i ? 9 : 10, lens, 900 + (uint64_t)_i, 20000);
}
END_TEST

/* A sequence's decode depends only on its own tokens: seq 0 of a cache where seq 1 holds keys and
 * values 3,000 times larger (appended first), of a cache where seq 0 held such values before
 * kivi_cache_reset_seq, and of one where it held them before a kivi_cache_load of seq 0's save,
 * give the output of seq 0 in a cache of its own, bit for bit (the GPU kernel scales its K and V
 * operands by exponent bounds that are each sequence's own, kept by append, reset and load).
 * _i: 2- or 4-bit, MHA or GQA. */
START_TEST(decode_seq_isolated) {
  const acase a = {128, _i & 1 ? 2 : 4, _i & 1 ? 8 : 4, _i & 2 ? 4 : 2, _i & 2 ? 4 : 2, 32, 128, 0.0f};
  const acase big = {a.D, a.H, a.HQ, a.kb, a.vb, a.G, a.R, 3000.0f};
  enum { L = 700 };
  float *k, *v, *kb, *vb; /* kb unused: the large values serve as keys too */
  make_kv(&a, L, 501, &k, &v);
  make_kv(&big, L, 777, &kb, &vb);
  float *q = tu_random((size_t)a.HQ * a.D, 502, 1.0f);
  const size_t no = (size_t)a.HQ * a.D;
  float *out[4];
  kivi_cache *c[4];
  unsigned kern = 0;
  for (int w = 0; w < 4; ++w) {
    c[w] = make_cache(&a, 2, 1024);
    if (w == 1) append_all(c[w], 1, L, vb, vb); /* a neighbour of large keys and values */
    if (w == 2) {                               /* large keys and values before a reset */
      append_all(c[w], 0, L, vb, vb);
      ck_assert_int_eq(kivi_cache_reset_seq(c[w], 0), KIVI_OK);
    }
    if (w == 3) { /* large keys and values, then the sequence loaded over them from the first cache's
                   * save (the bounds the GPU kernel keeps per sequence come from what was loaded) */
      append_all(c[w], 0, L, vb, vb);
      size_t n = 0;
      ck_assert_int_eq(kivi_cache_save(c[0], 0, NULL, &n), KIVI_OK);
      void *b = malloc(n);
      ck_assert_int_eq(kivi_cache_save(c[0], 0, b, &n), KIVI_OK);
      ck_assert_int_eq(kivi_cache_load(c[w], 0, b, n), KIVI_OK);
      free(b);
    } else
      append_all(c[w], 0, L, k, v);
    out[w] = malloc(no * sizeof(float));
    const int seq = 0;
    ck_assert_int_eq(kivi_attention_decode(c[w], 0, 1, &seq, a.HQ, q, 0.088f, out[w], KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    ck_assert_int_eq(kivi_cache_last_kernels(c[w], &kern), KIVI_OK);
  }
  ck_assert_int_eq(memcmp(out[0], out[1], no * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(out[0], out[2], no * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(out[0], out[3], no * sizeof(float)), 0);
  printf("seq isolated, D%d K%d V%d HQ %d over %d (%s): the same output beside large values, after a reset and "
         "loaded over large values\n", a.D, a.kb, a.vb, a.HQ, a.H, kernel_name(kern));
  for (int w = 0; w < 4; ++w) {
    kivi_cache_destroy(c[w]);
    free(out[w]);
  }
  free(k), free(v), free(kb), free(vb), free(q);
}
END_TEST

START_TEST(bad_arguments) {
  const acase a = {64, 2, 4, 2, 2, 32, 128, 0};
  kivi_cache *c = make_cache(&a, 2, 256);
  float *k, *v;
  make_kv(&a, 10, 50, &k, &v);
  append_all(c, 0, 10, k, v);
  float q[4 * 64] = {0}, out[4 * 64];
  const int id = 0, empty = 1, two[2] = {0, 0}, ql = 1, ql0 = 0;
  ck_assert_int_eq(kivi_attention_decode(NULL, 0, 1, &id, 4, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 1, 1, &id, 4, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 3, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 0, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, NULL, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, q, 1, NULL, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, q, NAN, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, q, 1, out, KIVI_BF16, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &empty, 4, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 2, two, 4, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, -1, &id, 4, q, 1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, q, -1, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 1, &id, 4, q, 0, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, &ql, 4, q, k, v, -0.5f, out, NULL, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, &ql0, 4, q, k, v, 1, out, NULL, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, &ql, 4, q, NULL, v, 1, out, NULL, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, NULL, 4, q, k, v, 1, out, NULL, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 1, &id, &ql, 4, q, k, v, 1, out, NULL, (kivi_mem)3), KIVI_ERR_ARG);
  free(k);
  free(v);
  kivi_cache_destroy(c);
}
END_TEST

int main(void) {
  /* test_attention_simt (the GPU emulated on the host, tests/simt) takes the cases that reach
   * each kernel, one width pair of the layout sweep; KIVI_SIMT_FULL=1 runs them all. */
#ifdef KIVI_TEST_SIMT
  const int all = getenv("KIVI_SIMT_FULL") != NULL;
#else
  const int all = 1;
#endif
  Suite *s = suite_create("attention");
  TCase *tc = tcase_create("attention");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, decode_boundary_lengths, 0, 4);
  tcase_add_test(tc, decode_gqa_ratios);
  tcase_add_test(tc, decode_magnitudes);
  if (all) tcase_add_test(tc, extend_chunked_prefill);
  tcase_add_test(tc, extend_new_tokens);
  tcase_add_test(tc, extend_chunked_equals_oneshot_in_window);
  tcase_add_test(tc, decode_equals_extend_qlen1);
  tcase_add_test(tc, decode_f16_out_and_device_pointers);
  if (all) tcase_add_loop_test(tc, decode_long_rows_both_modes, 0, 2);
  if (all) tcase_add_loop_test(tc, decode_gqa_many_rows, 0, 2);
  tcase_add_loop_test(tc, decode_gqa_layouts, 0, all ? 4 : 1);
  tcase_add_loop_test(tc, decode_folded_tail, 0, all ? 2 : 1);
  if (all) tcase_add_loop_test(tc, decode_single_block_rows, 0, 2);
  tcase_add_test(tc, decode_degenerate_groups);
  tcase_add_test(tc, decode_paper_keys);
  tcase_add_loop_test(tc, decode_f16_cache, 0, all ? 2 : 1);
  tcase_add_loop_test(tc, decode_f16_long_splits, 0, 3);
  tcase_add_loop_test(tc, decode_seq_isolated, 0, 4);
  tcase_add_test(tc, bad_arguments);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
