/* Cache manager: configuration checks, rejected calls leave the cache untouched, capacity,
 * reset, accounting, input dtypes and device-pointer inputs. */
#include "../check_util.h"
#include "../ref/kivi_ref.h"

static kivi_context *ctx;

static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

static kivi_cache *make(int layers, int H, int D, int seqs, int maxlen, int kb, int vb, int G, int R) {
  return tu_cache(ctx, layers, H, D, seqs, maxlen, kb, vb, G, R);
}

START_TEST(config_validation) {
  kivi_cache_config cfg, bad;
  kivi_cache_config_init(&cfg, 2, 4, 128, 2, 1024);
  ck_assert_int_eq(kivi_cache_config_check(&cfg), KIVI_OK);
  ck_assert_int_eq(cfg.k_bits, 2);
  ck_assert_int_eq(cfg.group, 32);
  ck_assert_int_eq(cfg.residual, 128);
  ck_assert_int_eq(kivi_cache_config_check(NULL), KIVI_ERR_ARG);
#define EXPECT(field, value, status)                       \
  bad = cfg;                                               \
  bad.field = value;                                       \
  ck_assert_int_eq(kivi_cache_config_check(&bad), status); \
  {                                                        \
    kivi_cache *c_ = (kivi_cache *)0x1;                    \
    ck_assert_int_eq(kivi_cache_create(ctx, &bad, &c_), status); \
    ck_assert_ptr_null(c_);                                \
  }
  EXPECT(n_layers, 0, KIVI_ERR_ARG);
  EXPECT(n_kv_heads, -1, KIVI_ERR_ARG);
  EXPECT(max_seqs, 0, KIVI_ERR_ARG);
  EXPECT(max_seq_len, 0, KIVI_ERR_ARG);
  EXPECT(pool_tokens, -5, KIVI_ERR_ARG);
  EXPECT(k_bits, 3, KIVI_ERR_UNSUPPORTED);
  EXPECT(v_bits, 1, KIVI_ERR_UNSUPPORTED);
  EXPECT(k_bits, 0, KIVI_ERR_UNSUPPORTED);
  EXPECT(group, 16, KIVI_ERR_UNSUPPORTED);
  EXPECT(group, 48, KIVI_ERR_UNSUPPORTED);
  EXPECT(residual, 100, KIVI_ERR_UNSUPPORTED);
  EXPECT(residual, 2048, KIVI_ERR_UNSUPPORTED);
  EXPECT(head_dim, 48, KIVI_ERR_UNSUPPORTED);
  EXPECT(head_dim, 512, KIVI_ERR_UNSUPPORTED);
  EXPECT(head_dim, 0, KIVI_ERR_ARG);
  EXPECT(async_lanes, -1, KIVI_ERR_ARG);
  EXPECT(async_lanes, KIVI_MAX_ASYNC_LANES + 1, KIVI_ERR_ARG);
#undef EXPECT
  ck_assert_int_eq(cfg.async_lanes, 1);
  bad = cfg;
  bad.async_lanes = 0; /* the same as 1 */
  ck_assert_int_eq(kivi_cache_config_check(&bad), KIVI_OK);
  bad.async_lanes = KIVI_MAX_ASYNC_LANES;
  ck_assert_int_eq(kivi_cache_config_check(&bad), KIVI_OK);
  bad = cfg;
  bad.head_dim = 64;
  bad.group = 128; /* V groups must divide head_dim */
  ck_assert_int_eq(kivi_cache_config_check(&bad), KIVI_ERR_UNSUPPORTED);
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(NULL, &cfg, &c), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_create(ctx, NULL, &c), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, NULL), KIVI_ERR_ARG);
  kivi_cache_destroy(NULL);
}
END_TEST

START_TEST(rejected_calls_change_nothing) {
  enum { H = 2, D = 64, N = 100 };
  kivi_cache *c = make(2, H, D, 3, 512, 2, 4, 32, 64);
  float *k = tu_random((size_t)N * H * D, 1, 1.0f), *v = tu_random((size_t)N * H * D, 2, 1.0f);
  int ids[2] = {0, 2}, n[2] = {70, 30};
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  const snapshot before = snap(c);
  int dup[2] = {1, 1}, oob[2] = {0, 3}, neg[2] = {-1, 0}, nn[2] = {5, -1}, big[2] = {5, 500};
  ck_assert_int_eq(kivi_cache_append(NULL, 0, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 2, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, -1, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, -1, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, NULL, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, NULL, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, NULL, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, k, NULL, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, dup, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, oob, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, neg, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, nn, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, k, v, (kivi_dtype)7, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, k, v, KIVI_F32, (kivi_mem)5), KIVI_ERR_ARG);
  /* seq 2 on layer 1 has 30 tokens: 30 + 500 > max_seq_len 512 */
  ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, big, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_CAPACITY);
  /* non-finite input anywhere, in K or V, in any dtype */
  const float bad_values[] = {NAN, INFINITY, -INFINITY, 65520.0f, -1e6f};
  for (size_t b = 0; b < sizeof bad_values / sizeof bad_values[0]; ++b) {
    const size_t at = (size_t)(b * 977) % ((size_t)N * H * D);
    float keep = k[at];
    k[at] = bad_values[b];
    ck_assert_int_eq(kivi_cache_append(c, 1, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
    k[at] = keep;
    keep = v[at + 1];
    v[at + 1] = bad_values[b];
    ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
    v[at + 1] = keep;
  }
  uint16_t h16[H * D] = {0};
  h16[7] = 0x7e00; /* fp16 NaN */
  const int one = 1;
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, ids, &one, h16, h16, KIVI_F16, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
  h16[7] = 0x7f80; /* bf16 Inf */
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, ids, &one, h16, h16, KIVI_BF16, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
  /* other calls with bad arguments */
  int len;
  ck_assert_int_eq(kivi_cache_seq_length(c, 3, 0, &len), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 2, &len), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 0, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_reset_seq(c, 3), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_reset_seq(NULL, 0), KIVI_ERR_ARG);
  size_t sz = 0;
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, NULL, &sz), KIVI_OK);
  unsigned char *buf = malloc(sz);
  size_t small = sz - 1;
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, buf, &small), KIVI_ERR_BUFFER);
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, buf, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_get_stats(c, NULL), KIVI_ERR_ARG);
  unsigned kern;
  ck_assert_int_eq(kivi_cache_last_kernels(NULL, &kern), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_last_kernels(c, NULL), KIVI_ERR_ARG);
  size_t ck_n;
  ck_assert_int_eq(kivi_cache_save(NULL, KIVI_ALL_SEQS, NULL, &ck_n), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, NULL, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_save(c, 3, NULL, &ck_n), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_save(c, -2, NULL, &ck_n), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, NULL, &ck_n), KIVI_OK);
  unsigned char *ckb = malloc(ck_n);
  size_t ck_small = ck_n - 1;
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, ckb, &ck_small), KIVI_ERR_BUFFER);
  free(ckb);
  ck_assert_int_eq(kivi_cache_save_file(c, KIVI_ALL_SEQS, NULL), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_save_file(NULL, KIVI_ALL_SEQS, "/tmp/x"), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_load_file(NULL, KIVI_ALL_SEQS, "/tmp/x"), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_get_config(NULL, NULL), KIVI_ERR_ARG);
  free(buf);
  const snapshot after = snap(c);
  same(&before, &after);
  free(before.bytes);
  free(after.bytes);
  /* the failed appends left nothing behind (no flag either): the next valid append gives the
   * cache of a twin that never saw them */
  kivi_cache *twin = make(2, H, D, 3, 512, 2, 4, 32, 64);
  ck_assert_int_eq(kivi_cache_append(twin, 1, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(twin, 0, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c, 0, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  const snapshot s_c = snap(c), s_twin = snap(twin);
  same(&s_c, &s_twin);
  free(s_c.bytes);
  free(s_twin.bytes);
  kivi_cache_destroy(twin);
  free(k);
  free(v);
  kivi_cache_destroy(c);
}
END_TEST

START_TEST(pool_capacity_and_reset) {
  enum { H = 1, D = 32, R = 32 };
  /* pool of 4 blocks per layer (128 tokens) shared by 3 sequences of up to 1000 tokens */
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, H, D, 3, 1000);
  cfg.group = 32;
  cfg.residual = R;
  cfg.pool_tokens = 128;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  float *k = tu_random(1000 * D, 3, 2.0f), *v = tu_random(1000 * D, 4, 2.0f);
  kivi_cache_stats st;
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  ck_assert_int_eq(st.free_blocks, 4);
  int id = 0, n = 3 * R + 5; /* 3 blocks */
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  ck_assert_int_eq(st.free_blocks, 1);
  const snapshot before = snap(c);
  id = 1;
  n = 2 * R; /* needs 2, 1 free: rejected whole */
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_CAPACITY);
  const snapshot after = snap(c);
  same(&before, &after);
  n = R - 1; /* fits in the residual window: no block needed */
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_reset_seq(c, 0), KIVI_OK);
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  ck_assert_int_eq(st.free_blocks, 4);
  ck_assert_int_eq(st.tokens, R - 1);
  int len = -1;
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 0, &len), KIVI_OK);
  ck_assert_int_eq(len, 0);
  /* the freed blocks serve another sequence, whose export matches the reference */
  id = 2;
  n = 4 * R;
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  const ref_geom g = {D, H, 32, R, 2, 2, 0, 0};
  size_t want_n, got_n;
  unsigned char *want = ref_export(&g, n, k, v, &want_n);
  ck_assert_int_eq(kivi_cache_export_seq(c, 2, 0, NULL, &got_n), KIVI_OK);
  ck_assert_uint_eq(got_n, want_n);
  unsigned char *got = malloc(got_n);
  ck_assert_int_eq(kivi_cache_export_seq(c, 2, 0, got, &got_n), KIVI_OK);
  ck_assert_int_eq(memcmp(got, want, got_n), 0);
  free(got);
  free(want);
  free(before.bytes);
  free(after.bytes);
  free(k);
  free(v);
  kivi_cache_destroy(c);
}
END_TEST

/* Accounting against hand formulas for a Llama-shaped layer: 2-bit K and V, G=32, R=128. */
START_TEST(accounting) {
  enum { H = 4, D = 128, L = 1000 };
  kivi_cache *c = make(1, H, D, 1, 4096, 2, 2, 32, 128);
  float *k = tu_random((size_t)L * H * D, 5, 1.0f), *v = tu_random((size_t)L * H * D, 6, 1.0f);
  const int id = 0, n = L;
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  kivi_cache_stats st;
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  /* keys: 896 quantized (7 blocks), 104 fp16; values: 872 quantized, 128 fp16 */
  ck_assert_int_eq(st.tokens, L);
  ck_assert_uint_eq(st.code_bytes, (size_t)H * (896 + 872) * D * 2 / 8);
  ck_assert_uint_eq(st.scale_zero_bytes, (size_t)H * ((896 / 32) * D * 4 + 872 * (D / 32) * 4));
  ck_assert_uint_eq(st.residual_bytes, (size_t)H * (104 + 128) * D * 2);
  ck_assert_uint_eq(st.bookkeeping_bytes, 7 * 4 + 4);
  ck_assert_uint_eq(st.total_bytes, st.code_bytes + st.scale_zero_bytes + st.residual_bytes + st.bookkeeping_bytes);
  ck_assert_uint_eq(st.fp16_bytes, (size_t)L * H * D * 4);
  ck_assert_double_eq_tol(st.bits_per_element, st.total_bytes * 8.0 / (2.0 * L * H * D), 1e-12);
  ck_assert(st.allocated_bytes > st.total_bytes);
  size_t exp_n;
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 0, NULL, &exp_n), KIVI_OK);
  ck_assert_uint_eq(exp_n, st.total_bytes - st.bookkeeping_bytes);
  free(k);
  free(v);
  kivi_cache_destroy(c);
}
END_TEST

/* fp16, bf16 and fp32 inputs that hold the same values give the same cache; device-pointer
 * inputs give the same cache as host-pointer inputs. */
START_TEST(dtypes_and_device_pointers) {
  enum { H = 2, D = 64, N = 300 };
  const size_t ne = (size_t)N * H * D;
  float *k = tu_random(ne, 7, 3.0f), *v = tu_random(ne, 8, 3.0f);
  uint16_t *kb = malloc(ne * 2), *vb = malloc(ne * 2), *kh = malloc(ne * 2), *vh = malloc(ne * 2);
  for (size_t i = 0; i < ne; ++i) { /* values exact in bf16 and in fp16 */
    uint32_t u;
    memcpy(&u, &k[i], 4);
    u &= 0xfffe0000u; /* 7-bit mantissa, exponents well inside fp16's range */
    memcpy(&k[i], &u, 4);
    memcpy(&u, &v[i], 4);
    u &= 0xfffe0000u;
    memcpy(&v[i], &u, 4);
    memcpy(&u, &k[i], 4);
    kb[i] = (uint16_t)(u >> 16);
    memcpy(&u, &v[i], 4);
    vb[i] = (uint16_t)(u >> 16);
    kh[i] = ref_f16(k[i]);
    vh[i] = ref_f16(v[i]);
  }
  kivi_cache *c32 = make(1, H, D, 1, 1024, 4, 2, 32, 64);
  kivi_cache *c16 = make(1, H, D, 1, 1024, 4, 2, 32, 64);
  kivi_cache *cbf = make(1, H, D, 1, 1024, 4, 2, 32, 64);
  kivi_cache *cdev = make(1, H, D, 1, 1024, 4, 2, 32, 64);
  const int id = 0, n = N;
  ck_assert_int_eq(kivi_cache_append(c32, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(c16, 0, 1, &id, &n, kh, vh, KIVI_F16, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(cbf, 0, 1, &id, &n, kb, vb, KIVI_BF16, KIVI_MEM_HOST), KIVI_OK);
  void *dk = NULL, *dv = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dk), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dv), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dk, k, ne * 4), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dv, v, ne * 4), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(cdev, 0, 1, &id, &n, dk, dv, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  const snapshot a = snap(c32), b = snap(c16), d = snap(cbf), e = snap(cdev);
  same(&a, &b);
  same(&a, &d);
  same(&a, &e);
  free(a.bytes); free(b.bytes); free(d.bytes); free(e.bytes);
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  kivi_cache_destroy(c32); kivi_cache_destroy(c16); kivi_cache_destroy(cbf); kivi_cache_destroy(cdev);
  free(k); free(v); free(kb); free(vb); free(kh); free(vh);
}
END_TEST

/* Device-memory inputs in calls of at most R tokens (on a GPU: the device-side check, then the
 * one-kernel append) give the bytes of the same calls from host memory; a non-finite device
 * input fails the call and changes nothing, and the next valid call works. */
START_TEST(device_inputs_small_calls) {
  enum { H = 2, D = 64, N = 150 };
  const size_t st = (size_t)H * D, ne = (size_t)N * st;
  float *k = tu_random(ne, 17, 2.0f), *v = tu_random(ne, 18, 2.0f);
  kivi_cache *ch = make(1, H, D, 1, 1024, 2, 4, 32, 64), *cd = make(1, H, D, 1, 1024, 2, 4, 32, 64);
  void *dk = NULL, *dv = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dk), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dv), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dk, k, ne * 4), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dv, v, ne * 4), KIVI_OK);
  const int id = 0, sizes[] = {1, 5, 64, 1, 30, 45}; /* 146 tokens: blocks complete inside calls */
  size_t done = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
    ck_assert_int_eq(kivi_cache_append(ch, 0, 1, &id, &sizes[i], k + done * st, v + done * st, KIVI_F32, KIVI_MEM_HOST),
                     KIVI_OK);
    ck_assert_int_eq(kivi_cache_append(cd, 0, 1, &id, &sizes[i], (float *)dk + done * st, (float *)dv + done * st,
                                       KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
    done += (size_t)sizes[i];
  }
  const snapshot a = snap(ch), b = snap(cd);
  same(&a, &b);
  const float nanv = NAN;
  const int four = 4;
  ck_assert_int_eq(kivi_context_upload(ctx, (float *)dv + done * st + 2 * st + 9, &nanv, 4), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(cd, 0, 1, &id, &four, (float *)dk + done * st, (float *)dv + done * st, KIVI_F32,
                                     KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
  const snapshot c2 = snap(cd);
  same(&b, &c2);
  ck_assert_int_eq(kivi_context_upload(ctx, (float *)dv + done * st + 2 * st + 9, v + done * st + 2 * st + 9, 4), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(cd, 0, 1, &id, &four, (float *)dk + done * st, (float *)dv + done * st, KIVI_F32,
                                     KIVI_MEM_DEVICE), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(ch, 0, 1, &id, &four, k + done * st, v + done * st, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  const snapshot d2 = snap(ch), e2 = snap(cd);
  same(&d2, &e2);
  free(a.bytes); free(b.bytes); free(c2.bytes); free(d2.bytes); free(e2.bytes);
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  kivi_cache_destroy(ch); kivi_cache_destroy(cd);
  free(k); free(v);
}
END_TEST

/* 16-bit inputs in device memory: on a GPU the larger appends read them directly and check
 * them as they quantize (kernels 2a and 2b), only the tokens left in the windows go through the
 * stage.  For both dtypes, groups held in registers (32) or read twice (64, 128), 8-bit and
 * unquantized tensors, and a call whose key groups start in the window of earlier tokens (on a
 * GPU, fp16 2- and 4-bit tensors with G = 32 take append_gpu.c's kernels, bf16 the portable ones):
 * - the bytes equal those of the same values from host memory;
 * - a non-finite value where only one kernel sees it (a key of a completed block, a value that
 *   leaves the window, a token that stays in the windows, the second sequence) fails the call
 *   and changes nothing: not the bytes, not the next decode's result (which would move if the
 *   failed call had raised the V exponent bounds: its values are 1000x larger);
 * - the same call with the value mended then works. */
static uint16_t to16(float x, kivi_dtype dt) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return dt == KIVI_BF16 ? (uint16_t)(u >> 16) : ref_f16(x);
}

START_TEST(device_inputs_16bit) {
  static const int cfgs[][4] = {{2, 4, 32, 64}, {4, 2, 32, 128}, {4, 2, 64, 128}, {8, 16, 32, 32}, {16, 8, 128, 128}}; /* kb vb G R */
  enum { H = 2, D = 128, S = 2, N0 = 333, N1 = 200, M0 = 300, M1 = 10 };
  const size_t st = (size_t)H * D, ne = (size_t)(N0 + N1) * st, me = (size_t)(M0 + M1) * st;
  const int ids[S] = {0, 1}, pre[S] = {45, 100}, big[S] = {N0, N1}, more[S] = {M0, M1};
  float *k = tu_random(ne, 31, 2.0f), *v = tu_random(ne, 32, 2.0f);
  float *k2 = tu_random(me, 33, 2.0f), *v2 = tu_random(me, 34, 2000.0f), *q = tu_random((size_t)S * H * D, 35, 1.0f);
  for (size_t i = 0; i < ne; ++i) { /* values exact in fp16 and bf16 */
    uint32_t u;
    memcpy(&u, &k[i], 4); u &= 0xfffe0000u; memcpy(&k[i], &u, 4);
    memcpy(&u, &v[i], 4); u &= 0xfffe0000u; memcpy(&v[i], &u, 4);
  }
  for (size_t i = 0; i < me; ++i) {
    uint32_t u;
    memcpy(&u, &k2[i], 4); u &= 0xfffe0000u; memcpy(&k2[i], &u, 4);
    memcpy(&u, &v2[i], 4); u &= 0xfffe0000u; memcpy(&v2[i], &u, 4);
  }
  uint16_t *h16 = malloc(2 * (ne + me) * 2);
  void *dbuf = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, 2 * (ne + me) * 2, &dbuf), KIVI_OK);
  uint16_t *dk = dbuf, *dv = dk + ne, *dk2 = dv + ne, *dv2 = dk2 + me;
  /* bad places, as (tensor: 0 K / 1 V, element of the second call's input) */
  const size_t last0 = (size_t)(M0 - 1) * st, seq1 = (size_t)M0 * st;
  const size_t places[][2] = {{0, 5}, {1, 5 * st + 7}, {0, last0 + st - 1}, {1, last0 + 130}, {0, seq1 + 3 * st + 64}};
  const uint16_t bad16[][3] = {{0x7c00u, 0xfe00u, 0x7c00u}, {0x7f80u, 0xffc0u, 0x4974u}}; /* Inf, NaN, 1e6 (bf16) */
  for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ++ci)
    for (int di = 0; di < 2; ++di) {
      const kivi_dtype dt = di ? KIVI_BF16 : KIVI_F16;
      const int *cf = cfgs[ci];
      kivi_cache *ch = make(1, H, D, S, 1024, cf[0], cf[1], cf[2], cf[3]);
      kivi_cache *cd = make(1, H, D, S, 1024, cf[0], cf[1], cf[2], cf[3]);
      ck_assert_int_eq(kivi_cache_append(ch, 0, S, ids, pre, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(cd, 0, S, ids, pre, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      for (size_t i = 0; i < ne; ++i) { h16[i] = to16(k[i], dt); h16[ne + i] = to16(v[i], dt); }
      for (size_t i = 0; i < me; ++i) { h16[2 * ne + i] = to16(k2[i], dt); h16[2 * ne + me + i] = to16(v2[i], dt); }
      ck_assert_int_eq(kivi_context_upload(ctx, dbuf, h16, 2 * (ne + me) * 2), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(ch, 0, S, ids, big, h16, h16 + ne, dt, KIVI_MEM_HOST), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(cd, 0, S, ids, big, dk, dv, dt, KIVI_MEM_DEVICE), KIVI_OK);
      const snapshot a = snap(ch), b = snap(cd);
      same(&a, &b);
      float o0[S * H * D], o1[S * H * D];
      ck_assert_int_eq(kivi_attention_decode(cd, 0, S, ids, H, q, 0.125f, o0, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      for (size_t pi = 0; pi < sizeof places / sizeof places[0]; ++pi) {
        const uint16_t bv = bad16[di][pi % 3];
        uint16_t *dst = (places[pi][0] ? dv2 : dk2) + places[pi][1];
        ck_assert_int_eq(kivi_context_upload(ctx, dst, &bv, 2), KIVI_OK);
        ck_assert_int_eq(kivi_cache_append(cd, 0, S, ids, more, dk2, dv2, dt, KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
        const snapshot c2 = snap(cd);
        same(&b, &c2);
        free(c2.bytes);
        ck_assert_int_eq(kivi_attention_decode(cd, 0, S, ids, H, q, 0.125f, o1, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
        ck_assert_int_eq(memcmp(o0, o1, sizeof o0), 0);
        const uint16_t *good = h16 + 2 * ne + (places[pi][0] ? me : 0) + places[pi][1];
        ck_assert_int_eq(kivi_context_upload(ctx, dst, good, 2), KIVI_OK);
      }
      ck_assert_int_eq(kivi_cache_append(ch, 0, S, ids, more, h16 + 2 * ne, h16 + 2 * ne + me, dt, KIVI_MEM_HOST),
                       KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(cd, 0, S, ids, more, dk2, dv2, dt, KIVI_MEM_DEVICE), KIVI_OK);
      const snapshot d2 = snap(ch), e2 = snap(cd);
      same(&d2, &e2);
      free(a.bytes); free(b.bytes); free(d2.bytes); free(e2.bytes);
      kivi_cache_destroy(ch); kivi_cache_destroy(cd);
    }
  kivi_context_free(ctx, dbuf);
  free(h16); free(k); free(v); free(k2); free(v2); free(q);
}
END_TEST

/* Layers are independent: appending to layer 1 leaves layer 0 empty and vice versa. */
START_TEST(layers_independent) {
  enum { H = 1, D = 32, N = 70 };
  kivi_cache *c = make(3, H, D, 1, 256, 2, 2, 32, 32);
  float *k = tu_random(N * D, 9, 1.0f), *v = tu_random(N * D, 10, 1.0f);
  const int id = 0, n = N;
  ck_assert_int_eq(kivi_cache_append(c, 1, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  int l0, l1, l2;
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 0, &l0), KIVI_OK);
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 1, &l1), KIVI_OK);
  ck_assert_int_eq(kivi_cache_seq_length(c, 0, 2, &l2), KIVI_OK);
  ck_assert_int_eq(l0, 0);
  ck_assert_int_eq(l1, N);
  ck_assert_int_eq(l2, 0);
  free(k);
  free(v);
  kivi_cache_destroy(c);
}
END_TEST

/* A call of many sequences, each gaining at most R tokens (on a GPU the one-kernel append, whose
 * blocks write their own sequence's window tokens before they know that every other input is
 * finite): a non-finite key or value in any one sequence fails the call and changes nothing,
 * fp16 windows included (each sequence's new tokens wrap its key window, so the call overwrites
 * slots that hold stored tokens); the next valid call gives the cache, and the attention
 * output, of a twin that never saw the failed calls. */
START_TEST(many_sequences_rejected_call) {
  enum { H = 2, D = 64, S = 80, R = 32, HQ = 4 };
  kivi_cache *c = make(1, H, D, S, 256, 2, 2, 32, R), *twin = make(1, H, D, S, 256, 2, 2, 32, R);
  int ids[S], n0[S], nn[S], off[S + 1];
  size_t t0 = 0;
  off[0] = 0;
  for (int s = 0; s < S; ++s) {
    ids[s] = s;
    n0[s] = 33 + s % 15;                 /* 33..47 stored: 1..15 keys in the key window */
    nn[s] = s % 4 == 0 ? 1 : 17 + s % 16; /* 1, or 17..32 new: past the next block boundary */
    t0 += (size_t)n0[s];
    off[s + 1] = off[s] + nn[s];
  }
  const size_t row = (size_t)H * D, ne = (size_t)off[S] * row;
  float *k0 = tu_random(t0 * row, 31, 1.0f), *v0 = tu_random(t0 * row, 32, 1.0f);
  float *k = tu_random(ne, 33, 1.0f), *v = tu_random(ne, 34, 1.0f);
  ck_assert_int_eq(kivi_cache_append(c, 0, S, ids, n0, k0, v0, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(twin, 0, S, ids, n0, k0, v0, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  void *dk = NULL, *dv = NULL;
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dk), KIVI_OK);
  ck_assert_int_eq(kivi_context_alloc(ctx, ne * 4, &dv), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dk, k, ne * 4), KIVI_OK);
  ck_assert_int_eq(kivi_context_upload(ctx, dv, v, ne * 4), KIVI_OK);
  const snapshot before = snap(c);
  /* the bad value in the last, a middle and the first sequence; in K and in V; from device
   * and from host memory */
  const int where[] = {S - 1, 41, 0};
  for (int w = 0; w < 3; ++w)
    for (int kv = 0; kv < 2; ++kv) {
      const size_t at = (size_t)off[where[w]] * row + (size_t)(w * 7 + kv * 3) % row + (size_t)(nn[where[w]] - 1) * row;
      float *host = kv ? v : k, keep = host[at];
      const float bad = w == 1 ? INFINITY : NAN;
      ck_assert_int_eq(kivi_context_upload(ctx, (float *)(kv ? dv : dk) + at, &bad, 4), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(c, 0, S, ids, nn, dk, dv, KIVI_F32, KIVI_MEM_DEVICE), KIVI_ERR_NONFINITE);
      ck_assert_int_eq(kivi_context_upload(ctx, (float *)(kv ? dv : dk) + at, &keep, 4), KIVI_OK);
      host[at] = bad;
      ck_assert_int_eq(kivi_cache_append(c, 0, S, ids, nn, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_NONFINITE);
      host[at] = keep;
      const snapshot after = snap(c);
      same(&before, &after);
      free(after.bytes);
    }
  ck_assert_int_eq(kivi_cache_append(c, 0, S, ids, nn, dk, dv, KIVI_F32, KIVI_MEM_DEVICE), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append(twin, 0, S, ids, nn, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  const snapshot a = snap(c), b = snap(twin);
  same(&a, &b);
  float *q = tu_random((size_t)S * HQ * D, 35, 1.0f), *oc = malloc((size_t)S * HQ * D * 4),
        *ot = malloc((size_t)S * HQ * D * 4);
  ck_assert_int_eq(kivi_attention_decode(c, 0, S, ids, HQ, q, 0.125f, oc, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(twin, 0, S, ids, HQ, q, 0.125f, ot, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(memcmp(oc, ot, (size_t)S * HQ * D * 4), 0);
  free(before.bytes);
  free(a.bytes);
  free(b.bytes);
  free(q);
  free(oc);
  free(ot);
  kivi_context_free(ctx, dk);
  kivi_context_free(ctx, dv);
  free(k0);
  free(v0);
  free(k);
  free(v);
  kivi_cache_destroy(c);
  kivi_cache_destroy(twin);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cache");
  TCase *tc = tcase_create("cache");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, config_validation);
  tcase_add_test(tc, rejected_calls_change_nothing);
  tcase_add_test(tc, pool_capacity_and_reset);
  tcase_add_test(tc, accounting);
  tcase_add_test(tc, dtypes_and_device_pointers);
  tcase_add_test(tc, device_inputs_small_calls);
  tcase_add_test(tc, device_inputs_16bit);
  tcase_add_test(tc, layers_independent);
  tcase_add_test(tc, many_sequences_rejected_call);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
