/* Rotated caches (kivi_cache_config.rotate, kivi.h), against the plain scalar reference:
 *  - the config rules (unknown rotation: KIVI_ERR_ARG; head_dim not a power of two:
 *    KIVI_ERR_UNSUPPORTED);
 *  - the cache holds exactly what the reference quantizes from the rotated tokens (the rotation
 *    of tests/ref in kivi.h's fp32 order, the export from tests/ref), whatever the input type,
 *    memory and append split;
 *  - decode and extend equal double-precision attention over the dequantized rotated cache with
 *    W q, rotated back (values), within ROT_TOL of the largest output (the fp32 kernel; on a GPU
 *    also the f16x2 kernel, within its FAST bound);
 *  - enqueued calls give the synchronous results bit for bit;
 *  - checkpoints record the rotation (version 2) and load only into a cache with the same one;
 *  - a rotated vector beyond fp16 fails the append with KIVI_ERR_NONFINITE and changes nothing. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

/* fp32 portable kernel: the only differences from the double reference are fp32 rounding of
 * the logits, softmax and sums and of the library's rotations (about 1e-7 relative) */
#define ROT_TOL 1e-5
/* the f16x2 GPU kernel's bound (kivi.h: about 1e-3 of max |output|; the suites use 2e-3) */
#define ROT_FAST_TOL 2e-3

static kivi_context *ctx;
static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

static float *rotated_copy(const float *x, size_t nvec, int D, int on) {
  float *y = malloc(nvec * D * sizeof *y);
  memcpy(y, x, nvec * D * sizeof *y);
  if (on)
    for (size_t i = 0; i < nvec; ++i) ref_rotate_f32(y + i * D, D);
  return y;
}

static kivi_cache *make(int H, int D, int kb, int vb, int rot, int mode, int seqs, int maxlen) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 2, H, D, seqs, maxlen);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.rotate = rot;
  cfg.attention = mode;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  return c;
}

/* The export of (seq, layer) equals the reference's of the tokens k, v ([L][H][D]) rotated as
 * `rot` says. */
static void check_export(const kivi_cache *c, int seq, int layer, int L, const float *k, const float *v, int H,
                         int D, int kb, int vb, int rot) {
  float *rk = rotated_copy(k, (size_t)L * H, D, rot & KIVI_ROTATE_K);
  float *rv = rotated_copy(v, (size_t)L * H, D, rot & KIVI_ROTATE_V);
  const ref_geom g = {D, H, 32, 128, kb, vb, 0, 0};
  size_t ne = 0, nr = 0;
  unsigned char *e = tu_export(c, seq, layer, &ne), *r = ref_export(&g, L, rk, rv, &nr);
  ck_assert_uint_eq(ne, nr);
  ck_assert_msg(memcmp(e, r, ne) == 0, "export of a rotated cache (rot %d, %d/%d bits, D %d, L %d) differs", rot, kb,
                vb, D, L);
  free(e);
  free(r);
  free(rk);
  free(rv);
}

START_TEST(config_rules) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 2, 2, 96, 1, 64);
  ck_assert_int_eq(cfg.rotate, KIVI_ROTATE_NONE);
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_OK);
  cfg.rotate = KIVI_ROTATE_K;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_ERR_UNSUPPORTED);
  ck_assert_str_eq(kivi_cache_config_reason(&cfg), "rotate needs a power-of-two head_dim (32, 64, 128 or 256)");
  kivi_cache *c = (kivi_cache *)&cfg; /* must be overwritten with NULL */
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_ERR_UNSUPPORTED);
  ck_assert_ptr_null(c);
  cfg.head_dim = 64;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_OK);
  cfg.rotate = 4;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_ERR_ARG);
  ck_assert_str_eq(kivi_cache_config_reason(&cfg), "rotate must be KIVI_ROTATE_NONE, _K, _V or _KV");
  cfg.rotate = -1;
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_ERR_ARG);
  cfg.rotate = KIVI_ROTATE_KV;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  kivi_cache_config got;
  ck_assert_int_eq(kivi_cache_get_config(c, &got), KIVI_OK);
  ck_assert_int_eq(got.rotate, KIVI_ROTATE_KV);
  kivi_cache_destroy(c);
}
END_TEST

/* Inputs of one dtype in host or device memory, appended as a prefill of 200 tokens and then
 * 100 one-token steps (seq 0), or as one append of 300 (seq 1): both equal the reference. */
static void append_case(int D, int kb, int vb, int rot, kivi_dtype dt, kivi_mem mem) {
  enum { H = 2, L = 300, P = 200 };
  const size_t n = (size_t)L * H * D, esz = dt == KIVI_F32 ? 4 : 2;
  float *k = tu_random(n, 100 + D + rot, 3.0f), *v = tu_random(n, 200 + D + rot, 1.0f);
  for (size_t i = 0; i < n; i += 7) k[i] *= 8.0f; /* outlier channels, what rotation spreads */
  /* the input in dtype, and the fp32 values it holds (what the cache rotates) */
  unsigned char *kin = tu_input(dt, k, n), *vin = tu_input(dt, v, n);
  void *kd = kin, *vd = vin;
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &kd), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &vd), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, kd, kin, n * esz), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, vd, vin, n * esz), KIVI_OK);
  }
  kivi_cache *c = make(H, D, kb, vb, rot, KIVI_ATTENTION_FP32, 2, 512);
  const int s0 = 0, s1 = 1, p = P, one = 1, all = L;
  const size_t row = (size_t)H * D * esz;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &p, kd, vd, dt, mem), KIVI_OK);
  for (int t = P; t < L; ++t)
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &one, (unsigned char *)kd + t * row,
                                       (unsigned char *)vd + t * row, dt, mem), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &all, kd, vd, dt, mem), KIVI_OK);
  check_export(c, 0, 1, L, k, v, H, D, kb, vb, rot);
  check_export(c, 1, 1, L, k, v, H, D, kb, vb, rot);
  kivi_cache_destroy(c);
  if (mem == KIVI_MEM_DEVICE) {
    kivi_context_free(ctx, kd);
    kivi_context_free(ctx, vd);
  }
  free(kin);
  free(vin);
  free(k);
  free(v);
}

START_TEST(append_matches_reference) {
  const int rots[3] = {KIVI_ROTATE_K, KIVI_ROTATE_V, KIVI_ROTATE_KV};
  const int bits[3][2] = {{2, 2}, {4, 2}, {16, 16}};
  for (int r = 0; r < 3; ++r)
    for (int b = 0; b < 3; ++b) append_case(64, bits[b][0], bits[b][1], rots[r], KIVI_F32, KIVI_MEM_HOST);
  append_case(128, 2, 2, KIVI_ROTATE_KV, KIVI_F32, KIVI_MEM_DEVICE);
  append_case(128, 4, 4, KIVI_ROTATE_KV, KIVI_F16, KIVI_MEM_DEVICE);
  append_case(64, 2, 2, KIVI_ROTATE_K, KIVI_BF16, KIVI_MEM_DEVICE);
  append_case(64, 2, 4, KIVI_ROTATE_V, KIVI_F16, KIVI_MEM_HOST);
  append_case(32, 2, 2, KIVI_ROTATE_KV, KIVI_BF16, KIVI_MEM_HOST);
}
END_TEST

/* Decode of a cache holding L tokens against the reference: W q over the dequantized rotated
 * cache, the output rotated back where the values are rotated. */
static double max_err_decode(kivi_cache *c, int H, int HQ, int D, int L, int rot, kivi_dtype odt, kivi_mem mem,
                             double *maxref) {
  const int seq = 0;
  float *q = tu_random((size_t)HQ * D, 77, 1.0f);
  const size_t nq = (size_t)HQ * D, osz = odt == KIVI_F16 ? 2 : 4;
  unsigned char *out = malloc(nq * osz);
  void *dq = q, *dout = out;
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dq), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, nq * osz, &dout), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, dq, q, nq * 4), KIVI_OK);
  }
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_decode(c, 1, 1, &seq, HQ, dq, scale, dout, odt, mem), KIVI_OK);
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_download(ctx, out, dout, nq * osz), KIVI_OK);
    kivi_context_free(ctx, dq);
    kivi_context_free(ctx, dout);
  }
  kivi_cache_config cfg;
  ck_assert_int_eq(kivi_cache_get_config(c, &cfg), KIVI_OK);
  const ref_geom g = {D, H, cfg.group, cfg.residual, cfg.k_bits, cfg.v_bits, 0, 0};
  size_t ne = 0;
  unsigned char *e = tu_export(c, seq, 1, &ne);
  double *kd = malloc((size_t)L * H * D * sizeof *kd), *vd = malloc((size_t)L * H * D * sizeof *vd);
  ref_dequant_export(&g, L, e, kd, vd);
  double *ref = malloc(nq * sizeof *ref);
  tu_ref_attention_rot(L, H, HQ, D, kd, vd, q, rot, scale, ref);
  double err = 0.0, mx = 0.0;
  for (size_t i = 0; i < nq; ++i) {
    const double o = odt == KIVI_F16 ? ref_f16_val(((uint16_t *)out)[i]) : ((float *)out)[i];
    err = fmax(err, fabs(o - ref[i]));
    mx = fmax(mx, fabs(ref[i]));
  }
  *maxref = mx;
  free(e); free(kd); free(vd); free(ref); free(q); free(out);
  return err;
}

/* L tokens of random keys (amplitude ka, every 5th element `outlier` times that) and values
 * with a per-channel offset (as test_attention's: outputs of order 1, not averaged to 0) */
static void fill_keys(kivi_cache *c, int H, int D, int L, uint64_t seed, float ka, float outlier) {
  float *k = tu_random((size_t)L * H * D, seed, ka), *v = tu_random((size_t)L * H * D, seed + 1, 1.0f);
  for (size_t i = 0; i < (size_t)L * H * D; i += 5) k[i] *= outlier;
  for (size_t i = 0; i < (size_t)L * H * D; ++i) v[i] += 0.5f * (float)((int)(i % (size_t)D) * 37 % 11 - 5) / 5.0f;
  const int seq = 0;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &seq, &L, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  free(k);
  free(v);
}
static void fill(kivi_cache *c, int H, int D, int L, uint64_t seed) { fill_keys(c, H, D, L, seed, 3.0f, 6.0f); }

START_TEST(decode_matches_reference) {
  const int rots[3] = {KIVI_ROTATE_K, KIVI_ROTATE_V, KIVI_ROTATE_KV};
  for (int r = 0; r < 3; ++r)
    for (int m = 0; m < 2; ++m) {
      const int L = 333;
      kivi_cache *c = make(2, 64, 2, 2, rots[r], KIVI_ATTENTION_FP32, 1, 512);
      fill(c, 2, 64, L, 31);
      double mx, err = max_err_decode(c, 2, 8, 64, L, rots[r], KIVI_F32, m ? KIVI_MEM_DEVICE : KIVI_MEM_HOST, &mx);
      ck_assert_msg(err <= ROT_TOL * mx, "rot %d mem %d: decode error %.3g of max %.3g", rots[r], m, err, mx);
      /* fp16 outputs: the fp32 result rotated back, rounded once (half an fp16 ulp) */
      err = max_err_decode(c, 2, 8, 64, L, rots[r], KIVI_F16, m ? KIVI_MEM_DEVICE : KIVI_MEM_HOST, &mx);
      ck_assert_msg(err <= ROT_TOL * mx + mx * 0x1p-11, "rot %d mem %d: fp16 decode error %.3g", rots[r], m, err);
      kivi_cache_destroy(c);
    }
  /* The paper configuration in FAST mode: on a GPU the GQA kernel, here the portable one.
   * Keys of amplitude 1 (flat attention), then keys of amplitude 3 with outliers (logits of a
   * few units), rotated and plain: all within the kernel's bound (H100: 5.1e-4 rotated, 8.4e-5
   * plain; the per-head f16x2 kernel before it reached 4.5e-3 and 1.9e-3 on the H200). */
  for (int hard = 0; hard < 2; ++hard)
    for (int rot = KIVI_ROTATE_KV; rot >= (hard ? KIVI_ROTATE_NONE : KIVI_ROTATE_KV); rot -= KIVI_ROTATE_KV) {
      kivi_cache *c = make(4, 128, 2, 2, rot, KIVI_ATTENTION_FAST, 1, 2048);
      fill_keys(c, 4, 128, 1100, 41, hard ? 3.0f : 1.0f, hard ? 6.0f : 1.0f);
      double mx, err = max_err_decode(c, 4, 16, 128, 1100, rot, KIVI_F32, KIVI_MEM_HOST, &mx);
      unsigned kern = 0;
      ck_assert_int_eq(kivi_cache_last_kernels(c, &kern), KIVI_OK);
      if (hard)
        printf("FAST decode, keys with outliers, %s: error %.2e of max |ref| (kernels 0x%x)\n",
               rot ? "rotated K and V" : "no rotation", err / mx, kern);
      ck_assert_msg(err <= ROT_FAST_TOL * mx, "fast kernel: decode error %.3g of max %.3g", err, mx);
      kivi_cache_destroy(c);
    }
}
END_TEST

/* Extend over a cache of L tokens with 5 new tokens: reference keys and values are the
 * dequantized rotated cache followed by W k_new, W v_new in double; W q; the output back. */
START_TEST(extend_matches_reference) {
  enum { H = 2, HQ = 4, D = 64, L = 160, NNEW = 5 };
  const int rots[3] = {KIVI_ROTATE_K, KIVI_ROTATE_V, KIVI_ROTATE_KV};
  for (int r = 0; r < 3; ++r) {
    const int rot = rots[r];
    kivi_cache *c = make(H, D, 2, 2, rot, KIVI_ATTENTION_FP32, 1, 512);
    fill(c, H, D, L, 51);
    float *q = tu_random((size_t)NNEW * HQ * D, 52, 1.0f), *kn = tu_random((size_t)NNEW * H * D, 53, 3.0f),
          *vn = tu_random((size_t)NNEW * H * D, 54, 1.0f), *out = malloc((size_t)NNEW * HQ * D * 4),
          *lse = malloc((size_t)NNEW * HQ * 4);
    const int seq = 0, ql = NNEW;
    const float scale = 0.125f;
    ck_assert_int_eq(kivi_attention_extend(c, 1, 1, &seq, &ql, HQ, q, kn, vn, scale, out, lse, KIVI_MEM_HOST),
                     KIVI_OK);
    const ref_geom g = {D, H, 32, 128, 2, 2, 0, 0};
    size_t ne = 0;
    unsigned char *e = tu_export(c, seq, 1, &ne);
    const int T = L + NNEW;
    double *kd = malloc((size_t)T * H * D * sizeof *kd), *vd = malloc((size_t)T * H * D * sizeof *vd);
    ref_dequant_export(&g, L, e, kd, vd);
    for (int t = 0; t < NNEW; ++t)
      for (int h = 0; h < H; ++h) {
        double *kk = kd + ((size_t)(L + t) * H + h) * D, *vv = vd + ((size_t)(L + t) * H + h) * D;
        for (int i = 0; i < D; ++i) {
          kk[i] = kn[((size_t)t * H + h) * D + i];
          vv[i] = vn[((size_t)t * H + h) * D + i];
        }
        if (rot & KIVI_ROTATE_K) ref_rotate(kk, D);
        if (rot & KIVI_ROTATE_V) ref_rotate(vv, D);
      }
    double err = 0.0, mx = 0.0, lerr = 0.0;
    for (int t = 0; t < NNEW; ++t) {
      double qd[HQ * D], ref[HQ * D], rl[HQ];
      float qr[HQ * D];
      for (int i = 0; i < HQ * D; ++i) qd[i] = q[(size_t)t * HQ * D + i];
      if (rot & KIVI_ROTATE_K)
        for (int h = 0; h < HQ; ++h) ref_rotate(qd + h * D, D);
      for (int i = 0; i < HQ * D; ++i) qr[i] = (float)qd[i];
      ref_attention(L + t + 1, H, HQ, D, kd, vd, qr, scale, ref, rl);
      if (rot & KIVI_ROTATE_V)
        for (int h = 0; h < HQ; ++h) ref_rotate(ref + h * D, D);
      for (int i = 0; i < HQ * D; ++i) {
        err = fmax(err, fabs(out[(size_t)t * HQ * D + i] - ref[i]));
        mx = fmax(mx, fabs(ref[i]));
      }
      for (int h = 0; h < HQ; ++h) lerr = fmax(lerr, fabs(lse[t * HQ + h] - rl[h]) / fmax(1.0, fabs(rl[h])));
    }
    ck_assert_msg(err <= ROT_TOL * mx, "rot %d: extend error %.3g of max %.3g", rot, err, mx);
    ck_assert_msg(lerr <= ROT_TOL, "rot %d: lse error %.3g", rot, lerr);
    free(e); free(kd); free(vd); free(q); free(kn); free(vn); free(out); free(lse);
    kivi_cache_destroy(c);
  }
}
END_TEST

/* Enqueued appends and decodes (host and device memory) give the synchronous results. */
START_TEST(async_equals_sync) {
  enum { H = 2, HQ = 8, D = 128, L = 300 };
  kivi_cache *a = make(H, D, 2, 2, KIVI_ROTATE_KV, KIVI_ATTENTION_FAST, 1, 512),
             *b = make(H, D, 2, 2, KIVI_ROTATE_KV, KIVI_ATTENTION_FAST, 1, 512);
  float *k = tu_random((size_t)L * H * D, 61, 3.0f), *v = tu_random((size_t)L * H * D, 62, 1.0f),
        *q = tu_random((size_t)HQ * D, 63, 1.0f);
  const int seq = 0, n = L;
  void *kd, *vd, *dout;
  const size_t bytes = (size_t)L * H * D * 4, nq = (size_t)HQ * D;
  ck_assert_int_eq(kivi_context_alloc(ctx, bytes, &kd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, bytes, &vd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dout), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, kd, k, bytes), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, vd, v, bytes), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(a, 1, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append_async(b, 1, 1, &seq, &n, kd, vd, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  float oa[HQ * D], ob[HQ * D], oc[HQ * D];
  ck_assert_int_eq(kivi_attention_decode(a, 1, 1, &seq, HQ, q, 0.1f, oa, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode_async(b, 1, 1, &seq, HQ, q, 0.1f, ob, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  void *dq;
  ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dq), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dq, q, nq * 4), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode_async(b, 1, 1, &seq, HQ, dq, 0.1f, dout, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  ck_assert_int_eq(kivi_cache_wait(b), KIVI_OK);
  ck_assert_int_eq(kivi_context_download(ctx, oc, dout, nq * 4), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, sizeof oa), 0);
  ck_assert_int_eq(memcmp(oa, oc, sizeof oa), 0);
  size_t na, nb;
  unsigned char *ea = tu_export(a, seq, 1, &na), *eb = tu_export(b, seq, 1, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_int_eq(memcmp(ea, eb, na), 0);
  kivi_context_free(ctx, kd); kivi_context_free(ctx, vd); kivi_context_free(ctx, dq); kivi_context_free(ctx, dout);
  free(ea); free(eb); free(k); free(v); free(q);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
}
END_TEST

START_TEST(checkpoint_records_rotation) {
  kivi_cache *a = make(2, 64, 2, 2, KIVI_ROTATE_V, KIVI_ATTENTION_FP32, 1, 512),
             *b = make(2, 64, 2, 2, KIVI_ROTATE_V, KIVI_ATTENTION_FP32, 1, 512),
             *plain = make(2, 64, 2, 2, KIVI_ROTATE_NONE, KIVI_ATTENTION_FP32, 1, 512),
             *other = make(2, 64, 2, 2, KIVI_ROTATE_KV, KIVI_ATTENTION_FP32, 1, 512);
  fill(a, 2, 64, 200, 71);
  fill(plain, 2, 64, 50, 72);
  fill(other, 2, 64, 50, 73);
  size_t n = 0;
  ck_assert_int_eq(kivi_cache_save(a, KIVI_ALL_SEQS, NULL, &n), KIVI_OK);
  unsigned char *ck = malloc(n);
  ck_assert_int_eq(kivi_cache_save(a, KIVI_ALL_SEQS, ck, &n), KIVI_OK);
  ck_assert_uint_eq(tu_get32(ck + 8), 2);
  ck_assert_uint_eq(tu_get32(ck + 56), KIVI_ROTATE_V);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, n), KIVI_OK);
  size_t na, nb;
  unsigned char *ea = tu_export(a, 0, 1, &na), *eb = tu_export(b, 0, 1, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_int_eq(memcmp(ea, eb, na), 0);
  /* another rotation, or none: a mismatch, the caches untouched */
  snapshot sp = snap(plain), so = snap(other);
  ck_assert_int_eq(kivi_cache_load(plain, KIVI_ALL_SEQS, ck, n), KIVI_ERR_MISMATCH);
  ck_assert_int_eq(kivi_cache_load(other, KIVI_ALL_SEQS, ck, n), KIVI_ERR_MISMATCH);
  size_t np = 0;
  ck_assert_int_eq(kivi_cache_save(plain, KIVI_ALL_SEQS, NULL, &np), KIVI_OK);
  unsigned char *cp = malloc(np);
  ck_assert_int_eq(kivi_cache_save(plain, KIVI_ALL_SEQS, cp, &np), KIVI_OK);
  ck_assert_uint_eq(tu_get32(cp + 8), 1);
  ck_assert_int_eq(kivi_cache_load(other, KIVI_ALL_SEQS, cp, np), KIVI_ERR_MISMATCH);
  snapshot sp2 = snap(plain), so2 = snap(other);
  same(&sp, &sp2);
  same(&so, &so2);
  /* a version field that disagrees with the rotation field: a bad checkpoint */
  tu_put32(ck + 56, 0);
  tu_recrc(ck, n);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, n), KIVI_ERR_FORMAT);
  tu_put32(cp + 56, KIVI_ROTATE_V);
  tu_recrc(cp, np);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, cp, np), KIVI_ERR_FORMAT);
  free(sp.bytes); free(so.bytes); free(sp2.bytes); free(so2.bytes);
  free(ck); free(cp); free(ea); free(eb);
  kivi_cache_destroy(a); kivi_cache_destroy(b); kivi_cache_destroy(plain); kivi_cache_destroy(other);
}
END_TEST

/* 64 channels of 30000 (each within fp16): the rotated first channel is 64 * 30000 / 8 =
 * 240000, beyond fp16.  The unrotated cache takes it; the rotated one refuses it and keeps its
 * state, for host and device inputs, synchronous and enqueued. */
START_TEST(rotated_overflow_is_nonfinite) {
  enum { H = 1, D = 64 };
  kivi_cache *c = make(H, D, 2, 2, KIVI_ROTATE_K, KIVI_ATTENTION_FP32, 1, 512),
             *p = make(H, D, 2, 2, KIVI_ROTATE_NONE, KIVI_ATTENTION_FP32, 1, 512);
  fill(c, H, D, 40, 81);
  float k[D], v[D];
  for (int i = 0; i < D; ++i) {
    k[i] = 30000.0f;
    v[i] = 0.5f;
  }
  const int seq = 0, one = 1;
  ck_assert_int_eq(kivi_cache_append(p, 1, 1, &seq, &one, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  snapshot s0 = snap(c);
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &seq, &one, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
  void *kd, *vd;
  ck_assert_int_eq(kivi_context_alloc(ctx, sizeof k, &kd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, sizeof v, &vd), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, kd, k, sizeof k), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, vd, v, sizeof v), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &seq, &one, kd, vd, KIVI_F32, KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
  const kivi_status st = kivi_cache_append_async(c, 1, 1, &seq, &one, kd, vd, KIVI_F32, KIVI_MEM_DEVICE);
  ck_assert_int_eq(st == KIVI_OK ? kivi_cache_wait(c) : st, KIVI_ERR_NONFINITE);
  snapshot s1 = snap(c);
  same(&s0, &s1);
  kivi_context_free(ctx, kd);
  kivi_context_free(ctx, vd);
  free(s0.bytes);
  free(s1.bytes);
  kivi_cache_destroy(c);
  kivi_cache_destroy(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rotate");
  TCase *tc = tcase_create("rotate");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, config_rules);
  tcase_add_test(tc, append_matches_reference);
  tcase_add_test(tc, decode_matches_reference);
  tcase_add_test(tc, extend_matches_reference);
  tcase_add_test(tc, async_equals_sync);
  tcase_add_test(tc, checkpoint_records_rotation);
  tcase_add_test(tc, rotated_overflow_is_nonfinite);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
