/* Sink tokens (kivi_cache_config.sinks, kivi.h "Sink tokens"), against the plain scalar
 * reference:
 *  - the export is, per kv-head, the first min(L, S) tokens in fp16 (rotated where the cache
 *    rotates) and then exactly the reference's export of the tokens from S on, whatever the
 *    input type, memory and append split, a call that mixes sequences inside and past their
 *    sinks included; a 16-bit cache ignores sinks;
 *  - decode and extend equal double-precision attention over the sinks and the dequantized
 *    rest within SINK_TOL (the fp32 kernel; on a GPU also the fast kernels, within their FAST
 *    bound), for lengths inside the sinks, at S, and past them, in one call;
 *  - enqueued calls give the synchronous results bit for bit;
 *  - a non-finite sink token fails the append with KIVI_ERR_NONFINITE and changes nothing;
 *  - checkpoints record S (version 3) and load only into a cache with the same S;
 *  - the statistics count the sink tokens as fp16. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

/* fp32 portable kernel against the double reference: fp32 rounding of logits and sums */
#define SINK_TOL 1e-5
/* the fast GPU kernels' bound (kivi.h: about 1e-3 of max |output|; the suites use 2e-3) */
#define SINK_FAST_TOL 2e-3

static kivi_context *ctx;
static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

static kivi_cache *make(int H, int D, int kb, int vb, int rot, int S, int mode, int seqs, int maxlen) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 2, H, D, seqs, maxlen);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.rotate = rot;
  cfg.sinks = S;
  cfg.attention = mode;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  return c;
}

static void check_export(const kivi_cache *c, int seq, int L, const float *k, const float *v, int H, int D, int kb,
                         int vb, int rot, int S, const char *what) {
  const ref_geom g = {D, H, 32, 128, kb, vb, S, 0};
  size_t ne = 0, nr = 0;
  unsigned char *e = tu_export(c, seq, 1, &ne), *r = tu_ref_export(&g, rot, L, k, v, &nr);
  ck_assert_msg(ne == nr, "%s: export of %zu bytes, expected %zu (S %d, %d/%d bits, L %d)", what, ne, nr, S, kb, vb, L);
  ck_assert_msg(memcmp(e, r, ne) == 0, "%s: export differs (S %d, %d/%d bits, rot %d, D %d, L %d)", what, S, kb, vb,
                rot, D, L);
  free(e);
  free(r);
}

/* Inputs [L][H][D]: keys of amplitude ka, the first two tokens' `big` times larger (the sinks
 * of real models), values with a per-channel offset. */
static void tokens_of(int L, int H, int D, uint64_t seed, float ka, float big, float **k, float **v) {
  *k = tu_random((size_t)L * H * D, seed, ka);
  *v = tu_random((size_t)L * H * D, seed + 1, 1.0f);
  for (size_t i = 0; i < (size_t)L * H * D; ++i) {
    if (i < (size_t)2 * H * D) (*k)[i] *= big;
    (*v)[i] += 0.5f * (float)((int)(i % (size_t)D) * 37 % 11 - 5) / 5.0f;
  }
}
static void make_tokens(int L, int H, int D, uint64_t seed, float **k, float **v) {
  tokens_of(L, H, D, seed, 3.0f, 20.0f, k, v);
}

/* One input case: the tokens in dtype dt and memory mem, appended to four sequences of one
 * cache: all at once (seq 0); in pieces 1, 2, S-3 (at most 50), 5, 100, then one at a time (seq 1); seqs 2
 * and 3 together in the same calls, seq 3 two calls behind (calls that mix a sequence inside its
 * sinks with one past them). */
static void append_case(int D, int kb, int vb, int rot, int S, kivi_dtype dt, kivi_mem mem) {
  enum { H = 2, L = 300 };
  const size_t n = (size_t)L * H * D, esz = dt == KIVI_F32 ? 4 : 2;
  float *k, *v;
  make_tokens(L, H, D, 300 + D + S + rot, &k, &v);
  unsigned char *kin = tu_input(dt, k, n), *vin = tu_input(dt, v, n); /* and k, v the values they hold */
  /* the mixed call's input: seq 2's tokens [a, a + na) then seq 3's [b, b + nb), per call */
  unsigned char *mk = malloc(2 * n * esz), *mv = malloc(2 * n * esz);
  void *kd = kin, *vd = vin, *mkd = mk, *mvd = mv;
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &kd), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, n * esz, &vd), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, 2 * n * esz, &mkd), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, 2 * n * esz, &mvd), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, kd, kin, n * esz), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, vd, vin, n * esz), KIVI_OK);
  }
  kivi_cache *c = make(H, D, kb, vb, rot, S, KIVI_ATTENTION_FP32, 4, 512);
  const size_t row = (size_t)H * D * esz;
  const int s0 = 0, s1 = 1, all = L;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &all, kd, vd, dt, mem), KIVI_OK);
  const int pieces[5] = {1, 2, S < 4 ? 1 : S < 53 ? S - 3 : 50, 5, 100};
  int t = 0;
  for (int i = 0; i < 5; ++i) {
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &pieces[i], (unsigned char *)kd + t * row,
                                       (unsigned char *)vd + t * row, dt, mem), KIVI_OK);
    t += pieces[i];
  }
  for (const int one = 1; t < L; ++t)
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &one, (unsigned char *)kd + t * row,
                                       (unsigned char *)vd + t * row, dt, mem), KIVI_OK);
  /* seqs 2 and 3 in the same calls: seq 3 starts 150 tokens behind, so the calls mix a
   * sequence in its sinks with one past them (and a call where only seq 2 has tokens) */
  const int steps[6] = {3, 1, 40, 7, 129, 120};
  int a = 0, b = 0;
  const int ids[2] = {2, 3};
  for (int i = 0; i < 6; ++i) {
    const int nn[2] = {steps[i], i < 2 ? 0 : steps[i]};
    memcpy(mk, kin + a * row, nn[0] * row);
    memcpy(mk + nn[0] * row, kin + b * row, nn[1] * row);
    memcpy(mv, vin + a * row, nn[0] * row);
    memcpy(mv + nn[0] * row, vin + b * row, nn[1] * row);
    if (mem == KIVI_MEM_DEVICE) {
      ck_assert_int_eq(kivi_context_upload(ctx, mkd, mk, (nn[0] + nn[1]) * row), KIVI_OK);
      ck_assert_int_eq(kivi_context_upload(ctx, mvd, mv, (nn[0] + nn[1]) * row), KIVI_OK);
    }
    ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, nn, mkd, mvd, dt, mem), KIVI_OK);
    a += nn[0];
    b += nn[1];
  }
  check_export(c, 0, L, k, v, H, D, kb, vb, rot, S, "one append");
  check_export(c, 1, L, k, v, H, D, kb, vb, rot, S, "pieces");
  check_export(c, 2, a, k, v, H, D, kb, vb, rot, S, "mixed call, first");
  check_export(c, 3, b, k, v, H, D, kb, vb, rot, S, "mixed call, second");
  int len = 0;
  ck_assert_int_eq(kivi_cache_seq_length(c, 3, 1, &len), KIVI_OK);
  ck_assert_int_eq(len, b);
  /* reset and append again: as fresh */
  ck_assert_int_eq(kivi_cache_reset_seq(c, 1), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &all, kd, vd, dt, mem), KIVI_OK);
  check_export(c, 1, L, k, v, H, D, kb, vb, rot, S, "after a reset");
  kivi_cache_destroy(c);
  if (mem == KIVI_MEM_DEVICE) {
    kivi_context_free(ctx, kd);
    kivi_context_free(ctx, vd);
    kivi_context_free(ctx, mkd);
    kivi_context_free(ctx, mvd);
  }
  free(kin); free(vin); free(mk); free(mv); free(k); free(v);
}

START_TEST(append_matches_reference) {
  const int bits[4][2] = {{2, 2}, {4, 2}, {2, 16}, {16, 16}};
  for (int b = 0; b < 4; ++b) append_case(64, bits[b][0], bits[b][1], KIVI_ROTATE_NONE, 4, KIVI_F32, KIVI_MEM_HOST);
  append_case(64, 2, 2, KIVI_ROTATE_KV, 4, KIVI_F32, KIVI_MEM_HOST);
  append_case(64, 2, 2, KIVI_ROTATE_NONE, 1, KIVI_BF16, KIVI_MEM_HOST);
  append_case(128, 2, 2, KIVI_ROTATE_NONE, 37, KIVI_F16, KIVI_MEM_DEVICE); /* 16-byte aligned fp16: direct */
  append_case(128, 4, 4, KIVI_ROTATE_KV, 4, KIVI_F32, KIVI_MEM_DEVICE);
  append_case(64, 2, 2, KIVI_ROTATE_NONE, 256, KIVI_F16, KIVI_MEM_HOST);
}
END_TEST

/* Attention reference of the cache's sequence `seq` of length L: its export (checked above
 * against the reference) dequantized, sink tokens first, [L][H][D] double. */
static void ref_tokens(const kivi_cache *c, int seq, int L, double *kd, double *vd) {
  kivi_cache_config cfg;
  ck_assert_int_eq(kivi_cache_get_config(c, &cfg), KIVI_OK);
  const ref_geom g = {cfg.head_dim, cfg.n_kv_heads, cfg.group, cfg.residual, cfg.k_bits, cfg.v_bits, cfg.sinks, cfg.v_clip};
  size_t ne = 0;
  unsigned char *e = tu_export(c, seq, 1, &ne);
  ref_dequant_export(&g, L, e, kd, vd);
  free(e);
}

/* Decode of sequences 0 .. ns-1 (lengths lens) in one call against the reference; returns the
 * largest error over the largest |ref|. */
static double decode_err(kivi_cache *c, int ns, const int *lens, int HQ, int rot, kivi_mem mem) {
  kivi_cache_config cfg;
  ck_assert_int_eq(kivi_cache_get_config(c, &cfg), KIVI_OK);
  const int H = cfg.n_kv_heads, D = cfg.head_dim;
  const size_t nq = (size_t)ns * HQ * D;
  float *q = tu_random(nq, 77, 1.0f), *out = malloc(nq * 4);
  int ids[8];
  for (int i = 0; i < ns; ++i) ids[i] = i;
  void *dq = q, *dout = out;
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dq), KIVI_OK);
    ck_assert_int_eq(kivi_context_alloc(ctx, nq * 4, &dout), KIVI_OK);
    ck_assert_int_eq(kivi_context_upload(ctx, dq, q, nq * 4), KIVI_OK);
  }
  const float scale = 1.0f / sqrtf((float)D);
  ck_assert_int_eq(kivi_attention_decode(c, 1, ns, ids, HQ, dq, scale, dout, KIVI_F32, mem), KIVI_OK);
  if (mem == KIVI_MEM_DEVICE) {
    ck_assert_int_eq(kivi_context_download(ctx, out, dout, nq * 4), KIVI_OK);
    kivi_context_free(ctx, dq);
    kivi_context_free(ctx, dout);
  }
  double err = 0.0, mx = 0.0;
  for (int i = 0; i < ns; ++i) {
    const int L = lens[i];
    double *kd = malloc((size_t)L * H * D * 8), *vd = malloc((size_t)L * H * D * 8);
    double *ref = malloc((size_t)HQ * D * 8);
    ref_tokens(c, i, L, kd, vd);
    tu_ref_attention_rot(L, H, HQ, D, kd, vd, q + (size_t)i * HQ * D, rot, scale, ref);
    for (int j = 0; j < HQ * D; ++j) {
      err = fmax(err, fabs(out[(size_t)i * HQ * D + j] - ref[j]));
      mx = fmax(mx, fabs(ref[j]));
    }
    free(kd); free(vd); free(ref);
  }
  free(q);
  free(out);
  return err / mx;
}

/* Sequences of lengths inside the sinks, at S, just past, past a block and long, in one call */
static void decode_case(int H, int HQ, int D, int kb, int vb, int rot, int S, int mode, double tol) {
  const float ka = mode == KIVI_ATTENTION_FAST ? 1.0f : 3.0f, big = mode == KIVI_ATTENTION_FAST ? 4.0f : 20.0f;
  const int lens[6] = {1, S > 1 ? S - 1 : 1, S, S + 1, S + 128 + 40, 1100};
  kivi_cache *c = make(H, D, kb, vb, rot, S, mode, 6, 2048);
  for (int i = 0; i < 6; ++i) {
    float *k, *v;
    tokens_of(lens[i], H, D, 500 + i, ka, big, &k, &v);
    ck_assert_int_eq(kivi_cache_append(c, 1, 1, &i, &lens[i], k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    free(k);
    free(v);
  }
  for (int m = 0; m < 2; ++m) {
    const double e6 = decode_err(c, 6, lens, HQ, rot, m ? KIVI_MEM_DEVICE : KIVI_MEM_HOST);
    ck_assert_msg(e6 <= tol, "decode (H %d HQ %d D %d, %d/%d bits, rot %d, S %d, mode %d): error %.3g of max |ref|", H,
                  HQ, D, kb, vb, rot, S, mode, e6);
  }
  /* on a GPU the fast path's kernels with the sink kernel: the f16x2 kernels for 2- and 4-bit
   * caches, the fp16 cache's kernel for 16-bit ones (kivi_cache_last_kernels) */
  kivi_context_info info;
  unsigned kern = 0;
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  ck_assert_int_eq(kivi_cache_last_kernels(c, &kern), KIVI_OK);
  if (info.on_gpu && mode == KIVI_ATTENTION_FAST)
    ck_assert_msg(kern & (kb == 16 ? KIVI_KERNEL_GPU_F16 : KIVI_KERNEL_GPU_F16X2), "GPU decode kernels 0x%x", kern);
  const double e1 = decode_err(c, 1, lens, HQ, rot, KIVI_MEM_HOST); /* a row with only sink tokens, alone */
  ck_assert_msg(e1 <= tol, "decode of one sink token: error %.3g", e1);
  kivi_cache_destroy(c);
}

START_TEST(decode_matches_reference) {
  decode_case(2, 8, 64, 2, 2, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FP32, SINK_TOL);
  decode_case(2, 2, 64, 4, 2, KIVI_ROTATE_KV, 4, KIVI_ATTENTION_FP32, SINK_TOL);
  decode_case(1, 3, 32, 2, 16, KIVI_ROTATE_NONE, 37, KIVI_ATTENTION_FP32, SINK_TOL);
  /* the fast kernels on a GPU (here the portable one): the per-head kernel (MHA, D 128), the
   * GQA kernel (4 query heads a kv-head, D 128; D 64), 2 and 4 bits; keys of amplitude 1 (the
   * first two 4 times larger) keep the f16x2 kernels within their bound */
  decode_case(4, 4, 128, 2, 2, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FAST, SINK_FAST_TOL);
  decode_case(2, 8, 128, 4, 4, KIVI_ROTATE_KV, 4, KIVI_ATTENTION_FAST, SINK_FAST_TOL);
  decode_case(3, 9, 64, 2, 2, KIVI_ROTATE_KV, 4, KIVI_ATTENTION_FAST, SINK_FAST_TOL);
  decode_case(2, 4, 64, 16, 16, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FAST, SINK_TOL); /* sinks ignored */
}
END_TEST

/* Extend over a cache of L tokens with 5 new tokens, L inside the sinks (no quantized-stream
 * tokens: only the sinks' and the new tokens' partials) and past them. */
START_TEST(extend_matches_reference) {
  enum { H = 2, HQ = 4, NNEW = 5 };
  const int Ls[2] = {2, 300}, Ds[2] = {64, 128};
  for (int di = 0; di < 2; ++di)
    for (int li = 0; li < 2; ++li)
      for (int mode = 0; mode < 2; ++mode) {
        const int D = Ds[di], L = Ls[li];
        kivi_cache *c = make(H, D, 2, 2, KIVI_ROTATE_NONE, 4, mode ? KIVI_ATTENTION_FAST : KIVI_ATTENTION_FP32, 1, 512);
        float *k, *v;
        make_tokens(L, H, D, 600 + L, &k, &v);
        const int seq = 0, ql = NNEW;
        ck_assert_int_eq(kivi_cache_append(c, 1, 1, &seq, &L, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
        float *q = tu_random((size_t)NNEW * HQ * D, 52, 1.0f), *kn = tu_random((size_t)NNEW * H * D, 53, 3.0f),
              *vn = tu_random((size_t)NNEW * H * D, 54, 1.0f), *out = malloc((size_t)NNEW * HQ * D * 4),
              *lse = malloc((size_t)NNEW * HQ * 4);
        const float scale = 0.125f;
        ck_assert_int_eq(kivi_attention_extend(c, 1, 1, &seq, &ql, HQ, q, kn, vn, scale, out, lse, KIVI_MEM_HOST),
                         KIVI_OK);
        const int T = L + NNEW;
        double *kd = malloc((size_t)T * H * D * 8), *vd = malloc((size_t)T * H * D * 8);
        ref_tokens(c, seq, L, kd, vd);
        for (size_t i = 0; i < (size_t)NNEW * H * D; ++i) {
          kd[(size_t)L * H * D + i] = kn[i];
          vd[(size_t)L * H * D + i] = vn[i];
        }
        double err = 0.0, mx = 0.0, lerr = 0.0;
        for (int t = 0; t < NNEW; ++t) {
          double ref[HQ * 128], rl[HQ];
          ref_attention(L + t + 1, H, HQ, D, kd, vd, q + (size_t)t * HQ * D, scale, ref, rl);
          for (int i = 0; i < HQ * D; ++i) {
            err = fmax(err, fabs(out[(size_t)t * HQ * D + i] - ref[i]));
            mx = fmax(mx, fabs(ref[i]));
          }
          for (int h = 0; h < HQ; ++h) lerr = fmax(lerr, fabs(lse[t * HQ + h] - rl[h]) / fmax(1.0, fabs(rl[h])));
        }
        const double tol = mode ? SINK_FAST_TOL : SINK_TOL;
        ck_assert_msg(err <= tol * mx, "extend D %d L %d mode %d: error %.3g of max %.3g", D, L, mode, err, mx);
        ck_assert_msg(lerr <= tol, "extend D %d L %d mode %d: lse error %.3g", D, L, mode, lerr);
        free(k); free(v); free(kd); free(vd); free(q); free(kn); free(vn); free(out); free(lse);
        kivi_cache_destroy(c);
      }
}
END_TEST

/* Enqueued appends (device inputs, in pieces across S) and decodes give the synchronous results */
START_TEST(async_equals_sync) {
  enum { H = 2, HQ = 8, D = 128, L = 300, S = 4 };
  kivi_cache *a = make(H, D, 2, 2, KIVI_ROTATE_NONE, S, KIVI_ATTENTION_FAST, 1, 512),
             *b = make(H, D, 2, 2, KIVI_ROTATE_NONE, S, KIVI_ATTENTION_FAST, 1, 512);
  float *k, *v, *q = tu_random((size_t)HQ * D, 63, 1.0f);
  make_tokens(L, H, D, 61, &k, &v);
  const int seq = 0, n = L, p1 = 3, p2 = L - 3;
  void *kd, *vd;
  const size_t bytes = (size_t)L * H * D * 4, row = (size_t)H * D * 4;
  ck_assert_int_eq(kivi_context_alloc(ctx, bytes, &kd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, bytes, &vd), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, kd, k, bytes), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, vd, v, bytes), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(a, 1, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append_async(b, 1, 1, &seq, &p1, kd, vd, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append_async(b, 1, 1, &seq, &p2, (unsigned char *)kd + 3 * row,
                                           (unsigned char *)vd + 3 * row, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  float oa[HQ * D], ob[HQ * D];
  ck_assert_int_eq(kivi_attention_decode(a, 1, 1, &seq, HQ, q, 0.1f, oa, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode_async(b, 1, 1, &seq, HQ, q, 0.1f, ob, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_wait(b), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, sizeof oa), 0);
  size_t na, nb;
  unsigned char *ea = tu_export(a, seq, 1, &na), *eb = tu_export(b, seq, 1, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_int_eq(memcmp(ea, eb, na), 0);
  kivi_context_free(ctx, kd);
  kivi_context_free(ctx, vd);
  free(ea); free(eb); free(k); free(v); free(q);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
}
END_TEST

/* A NaN among a call's sink tokens: KIVI_ERR_NONFINITE, nothing changed, for host and device
 * inputs (fp32, and 16-byte aligned fp16, which the append reads directly), synchronous and
 * enqueued; the sequence then takes the clean tokens as if the bad call had not happened. */
START_TEST(nonfinite_sink_changes_nothing) {
  enum { H = 2, D = 128, S = 8, N = 6 };
  kivi_cache *c = make(H, D, 2, 2, KIVI_ROTATE_NONE, S, KIVI_ATTENTION_FP32, 2, 512);
  float *k, *v;
  make_tokens(40, H, D, 71, &k, &v);
  const int s0 = 0, s1 = 1, two = 2, n = N, ids[2] = {0, 1}, nn[2] = {N, N};
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s0, &two, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &s1, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  snapshot s_before = snap(c);
  /* bad: token 3 of seq 0's call (position 5 < S), in a call with seq 1 (positions 6..11) */
  float *bk = malloc((size_t)2 * N * H * D * 4);
  memcpy(bk, k + (size_t)2 * H * D, (size_t)N * H * D * 4);
  memcpy(bk + (size_t)N * H * D, k + (size_t)N * H * D, (size_t)N * H * D * 4);
  bk[(size_t)3 * H * D + 17] = NAN;
  float *bv = malloc((size_t)2 * N * H * D * 4);
  memcpy(bv, v + (size_t)2 * H * D, (size_t)N * H * D * 4);
  memcpy(bv + (size_t)N * H * D, v + (size_t)N * H * D, (size_t)N * H * D * 4);
  uint16_t *hk = malloc((size_t)2 * N * H * D * 2), *hv = malloc((size_t)2 * N * H * D * 2);
  for (size_t i = 0; i < (size_t)2 * N * H * D; ++i) {
    hk[i] = ref_f16(bk[i]);
    hv[i] = ref_f16(bv[i]);
  }
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, nn, bk, bv, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
  void *kd, *vd, *hkd, *hvd;
  const size_t b32 = (size_t)2 * N * H * D * 4, b16 = b32 / 2;
  ck_assert_int_eq(kivi_context_alloc(ctx, b32, &kd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, b32, &vd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, b16, &hkd), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, b16, &hvd), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, kd, bk, b32), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, vd, bv, b32), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, hkd, hk, b16), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, hvd, hv, b16), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, nn, kd, vd, KIVI_F32, KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, nn, hkd, hvd, KIVI_F16, KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
  const kivi_status st = kivi_cache_append_async(c, 1, 2, ids, nn, hkd, hvd, KIVI_F16, KIVI_MEM_DEVICE);
  ck_assert_int_eq(st == KIVI_OK ? kivi_cache_wait(c) : st, KIVI_ERR_NONFINITE);
  snapshot s_after = snap(c);
  same(&s_before, &s_after);
  /* the clean call now: seq 0 gets tokens 2..7 (its sinks filled), seq 1 tokens 6..11 */
  memcpy(bk, k + (size_t)2 * H * D, (size_t)N * H * D * 4);
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, nn, bk, bv, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  check_export(c, 0, 2 + N, k, v, H, D, 2, 2, KIVI_ROTATE_NONE, S, "after rejected calls, seq 0");
  check_export(c, 1, 2 * N, k, v, H, D, 2, 2, KIVI_ROTATE_NONE, S, "after rejected calls, seq 1");
  kivi_context_free(ctx, kd); kivi_context_free(ctx, vd); kivi_context_free(ctx, hkd); kivi_context_free(ctx, hvd);
  free(s_before.bytes); free(s_after.bytes); free(bk); free(bv); free(hk); free(hv); free(k); free(v);
  kivi_cache_destroy(c);
}
END_TEST

START_TEST(checkpoint_records_sinks) {
  enum { H = 2, D = 64 };
  kivi_cache *a = make(H, D, 2, 2, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FP32, 1, 512),
             *b = make(H, D, 2, 2, KIVI_ROTATE_NONE, 4, KIVI_ATTENTION_FP32, 1, 512),
             *plain = make(H, D, 2, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FP32, 1, 512),
             *other = make(H, D, 2, 2, KIVI_ROTATE_NONE, 8, KIVI_ATTENTION_FP32, 1, 512);
  float *k, *v;
  make_tokens(200, H, D, 81, &k, &v);
  const int seq = 0, n = 200;
  ck_assert_int_eq(kivi_cache_append(a, 1, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  size_t nc = 0;
  ck_assert_int_eq(kivi_cache_save(a, KIVI_ALL_SEQS, NULL, &nc), KIVI_OK);
  unsigned char *ck = malloc(nc);
  ck_assert_int_eq(kivi_cache_save(a, KIVI_ALL_SEQS, ck, &nc), KIVI_OK);
  ck_assert_uint_eq(tu_get32(ck + 8), 3);
  ck_assert_uint_eq(tu_get32(ck + 60), 4);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, nc), KIVI_OK);
  size_t na, nb;
  unsigned char *ea = tu_export(a, 0, 1, &na), *eb = tu_export(b, 0, 1, &nb);
  ck_assert_uint_eq(na, nb);
  ck_assert_int_eq(memcmp(ea, eb, na), 0);
  float q[8 * D], oa[8 * D], ob[8 * D];
  for (int i = 0; i < 8 * D; ++i) q[i] = (float)((i * 13) % 7 - 3) * 0.25f;
  ck_assert_int_eq(kivi_attention_decode(a, 1, 1, &seq, 8, q, 0.125f, oa, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(b, 1, 1, &seq, 8, q, 0.125f, ob, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(memcmp(oa, ob, sizeof oa), 0);
  /* another S, or none: a mismatch, the caches untouched */
  snapshot sp = snap(plain), so = snap(other);
  ck_assert_int_eq(kivi_cache_load(plain, KIVI_ALL_SEQS, ck, nc), KIVI_ERR_MISMATCH);
  ck_assert_int_eq(kivi_cache_load(other, KIVI_ALL_SEQS, ck, nc), KIVI_ERR_MISMATCH);
  snapshot sp2 = snap(plain), so2 = snap(other);
  same(&sp, &sp2);
  same(&so, &so2);
  /* version 3 with no sinks, or version 1 with sinks: bad checkpoints */
  tu_put32(ck + 60, 0);
  tu_recrc(ck, nc);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, nc), KIVI_ERR_FORMAT);
  tu_put32(ck + 60, 4);
  tu_put32(ck + 8, 1);
  tu_recrc(ck, nc);
  ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, nc), KIVI_ERR_FORMAT);
  free(sp.bytes); free(so.bytes); free(sp2.bytes); free(so2.bytes);
  free(ck); free(ea); free(eb); free(k); free(v);
  kivi_cache_destroy(a); kivi_cache_destroy(b); kivi_cache_destroy(plain); kivi_cache_destroy(other);
}
END_TEST

/* The statistics: the sink tokens count as fp16 (residual_bytes), the rest as without sinks */
START_TEST(stats_count_sinks) {
  enum { H = 3, D = 64, L = 1000, S = 4 };
  kivi_cache *a = make(H, D, 2, 2, KIVI_ROTATE_NONE, S, KIVI_ATTENTION_FP32, 1, 2048),
             *p = make(H, D, 2, 2, KIVI_ROTATE_NONE, 0, KIVI_ATTENTION_FP32, 1, 2048);
  float *k, *v;
  make_tokens(L, H, D, 91, &k, &v);
  const int seq = 0, n = L, nq = L - S;
  ck_assert_int_eq(kivi_cache_append(a, 1, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(p, 1, 1, &seq, &nq, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  kivi_cache_stats sa, sp;
  ck_assert_int_eq(kivi_cache_get_stats(a, &sa), KIVI_OK);
  ck_assert_int_eq(kivi_cache_get_stats(p, &sp), KIVI_OK);
  ck_assert_int_eq(sa.tokens, L);
  ck_assert_uint_eq(sa.code_bytes, sp.code_bytes); /* L - S quantized-stream tokens: as a plain cache of L - S */
  ck_assert_uint_eq(sa.scale_zero_bytes, sp.scale_zero_bytes);
  ck_assert_uint_eq(sa.residual_bytes, sp.residual_bytes + (size_t)2 * S * H * D * 2);
  ck_assert_uint_eq(sa.allocated_bytes, sp.allocated_bytes + (size_t)2 * S * 2 * H * D * 2); /* 2 layers */
  free(k);
  free(v);
  kivi_cache_destroy(a);
  kivi_cache_destroy(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sinks");
  TCase *tc = tcase_create("sinks");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 900);
  tcase_add_test(tc, append_matches_reference);
  tcase_add_test(tc, decode_matches_reference);
  tcase_add_test(tc, extend_matches_reference);
  tcase_add_test(tc, async_equals_sync);
  tcase_add_test(tc, nonfinite_sink_changes_nothing);
  tcase_add_test(tc, checkpoint_records_sinks);
  tcase_add_test(tc, stats_count_sinks);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
