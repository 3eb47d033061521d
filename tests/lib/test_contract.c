/* The documented edge cases of the API contract, one test each, so the status each case
 * returns is pinned down as kivi.h and docs/CHECKPOINT.md state it:
 *  - a call over zero sequences does nothing and succeeds (arrays may be NULL); a negative
 *    count is KIVI_ERR_ARG;
 *  - KIVI_ERR_BUFFER from export and save reports the size needed in *bytes;
 *  - kivi_cache_config_reason names the rule a config breaks; reserved members must be zero;
 *  - a softmax scale must be finite and > 0;
 *  - the stats count blocks over all layers' pools (free_blocks and total_blocks alike);
 *  - a checkpoint whose sequence id is beyond the target's slots is KIVI_ERR_CAPACITY;
 *  - the public structs have the sizes the ABI baseline records, and the library clears the
 *    reserved members of what it writes. */
#include "../check_util.h"

static kivi_context *ctx;
static void setup(void) { ctx = tu_context(); }
static void teardown(void) { kivi_context_destroy(ctx); }

enum { NL = 2, H = 2, D = 64 };

static kivi_cache *make(int seqs, int64_t pool) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, NL, H, D, seqs, 512);
  cfg.residual = 64;
  cfg.pool_tokens = pool;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  return c;
}

static void fill(kivi_cache *c, int seq, int n) {
  float *k = tu_random((size_t)n * H * D, 5 + seq, 1.0f), *v = tu_random((size_t)n * H * D, 9 + seq, 1.0f);
  for (int l = 0; l < NL; ++l) ck_assert_int_eq(kivi_cache_append(c, l, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  free(k);
  free(v);
}

START_TEST(zero_sequences_do_nothing) {
  kivi_cache *c = make(3, 0);
  fill(c, 1, 100);
  const snapshot before = snap(c);
  float q[4 * D] = {0}, out[4 * D];
  /* NULL arrays are fine with n_seqs = 0 */
  ck_assert_int_eq(kivi_cache_append(c, 0, 0, NULL, NULL, NULL, NULL, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_cache_append_async(c, 1, 0, NULL, NULL, NULL, NULL, KIVI_F16, KIVI_MEM_DEVICE), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 0, NULL, 4, NULL, 0.125f, NULL, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_decode_async(c, 0, 0, NULL, 4, NULL, 0.125f, NULL, KIVI_F16, KIVI_MEM_HOST), KIVI_OK);
  ck_assert_int_eq(kivi_attention_extend(c, 1, 0, NULL, NULL, 4, NULL, NULL, NULL, 0.125f, NULL, NULL, KIVI_MEM_HOST),
                   KIVI_OK);
  ck_assert_int_eq(kivi_cache_wait(c), KIVI_OK);
  /* ... but the scalar arguments are still checked */
  ck_assert_int_eq(kivi_cache_append(c, NL, 0, NULL, NULL, NULL, NULL, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_append(c, 0, 0, NULL, NULL, NULL, NULL, (kivi_dtype)9, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 0, NULL, 3, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, 0, NULL, 4, q, 0.125f, out, KIVI_BF16, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_extend(c, 0, 0, NULL, NULL, 4, q, q, q, -1.0f, out, NULL, KIVI_MEM_HOST), KIVI_ERR_ARG);
  /* negative counts are errors */
  const int id = 1, one = 1;
  ck_assert_int_eq(kivi_cache_append(c, 0, -1, &id, &one, q, q, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_attention_decode(c, 0, -1, &id, 4, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST), KIVI_ERR_ARG);
  const snapshot after = snap(c);
  same(&before, &after);
  free(before.bytes);
  free(after.bytes);
  kivi_cache_destroy(c);
}
END_TEST

START_TEST(buffer_too_small_reports_size) {
  kivi_cache *c = make(3, 0);
  fill(c, 0, 150);
  fill(c, 2, 70);
  size_t need = 0;
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, NULL, &need), KIVI_OK);
  ck_assert_uint_gt(need, 0);
  unsigned char *buf = malloc(need);
  memset(buf, 0xa5, need);
  size_t n = need - 1;
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, buf, &n), KIVI_ERR_BUFFER);
  ck_assert_uint_eq(n, need);
  for (size_t i = 0; i < need; ++i) ck_assert_uint_eq(buf[i], 0xa5); /* not written */
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 1, buf, &n), KIVI_OK);
  free(buf);
  size_t ck_need = 0;
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, NULL, &ck_need), KIVI_OK);
  unsigned char *ck = malloc(ck_need);
  memset(ck, 0x5a, ck_need);
  n = 10;
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, ck, &n), KIVI_ERR_BUFFER);
  ck_assert_uint_eq(n, ck_need);
  for (size_t i = 0; i < ck_need; ++i) ck_assert_uint_eq(ck[i], 0x5a);
  ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, ck, &n), KIVI_OK);
  ck_assert_uint_eq(n, ck_need);
  free(ck);
  kivi_cache_destroy(c);
}
END_TEST

START_TEST(config_reasons_and_reserved) {
  kivi_cache_config cfg, bad;
  kivi_cache_config_init(&cfg, 2, 4, 128, 2, 1024);
  for (size_t i = 0; i < sizeof cfg.reserved / sizeof cfg.reserved[0]; ++i) ck_assert_int_eq(cfg.reserved[i], 0);
  ck_assert_str_eq(kivi_cache_config_reason(&cfg), "");
  ck_assert_str_eq(kivi_cache_config_reason(NULL), "the configuration is NULL");
#define REASON(field, value, status, text)                 \
  bad = cfg;                                               \
  bad.field = value;                                       \
  ck_assert_int_eq(kivi_cache_config_check(&bad), status); \
  ck_assert_str_eq(kivi_cache_config_reason(&bad), text);
  REASON(n_layers, 0, KIVI_ERR_ARG, "n_layers must be 1..4096");
  REASON(group, 48, KIVI_ERR_UNSUPPORTED, "group must be 32, 64 or 128");
  REASON(residual, 100, KIVI_ERR_UNSUPPORTED, "residual must be a multiple of group, at most 1024");
  REASON(k_bits, 3, KIVI_ERR_UNSUPPORTED, "k_bits must be 2, 4, 8 or 16");
  REASON(head_dim, 48, KIVI_ERR_UNSUPPORTED, "head_dim must be a multiple of 32 from 32 to 256");
  REASON(attention, 7, KIVI_ERR_ARG, "attention must be KIVI_ATTENTION_FAST or KIVI_ATTENTION_FP32");
  REASON(reserved[14], 1, KIVI_ERR_ARG, "reserved members must be zero (start from kivi_cache_config_init)");
  REASON(reserved[0], -1, KIVI_ERR_ARG, "reserved members must be zero (start from kivi_cache_config_init)");
  REASON(rotate, 5, KIVI_ERR_ARG, "rotate must be KIVI_ROTATE_NONE, _K, _V or _KV");
  REASON(sinks, -1, KIVI_ERR_ARG, "sinks must be 0..256");
  REASON(sinks, KIVI_MAX_SINKS + 1, KIVI_ERR_ARG, "sinks must be 0..256");
  REASON(sinks, KIVI_MAX_SINKS, KIVI_OK, "");
  REASON(v_clip, 2, KIVI_ERR_ARG, "v_clip must be KIVI_CLIP_NONE or KIVI_CLIP_MSE");
  REASON(v_clip, -1, KIVI_ERR_ARG, "v_clip must be KIVI_CLIP_NONE or KIVI_CLIP_MSE");
  REASON(v_clip, KIVI_CLIP_MSE, KIVI_OK, "");
#undef REASON
  kivi_cache *c = (kivi_cache *)0x1;
  bad = cfg;
  bad.reserved[3] = 2;
  ck_assert_int_eq(kivi_cache_create(ctx, &bad, &c), KIVI_ERR_ARG);
  ck_assert_ptr_null(c);
}
END_TEST

START_TEST(stats_count_blocks_over_layers) {
  /* R = 64; 200 tokens per layer pool = 4 blocks per layer (rounded up), 2 layers */
  kivi_cache *c = make(2, 200);
  kivi_cache_stats st;
  memset(&st, 0x7f, sizeof st);
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  ck_assert_int_eq(st.total_blocks, NL * 4);
  ck_assert_int_eq(st.free_blocks, NL * 4);
  for (int i = 0; i < 3; ++i) ck_assert_int_eq(st.reserved[i], 0);
  ck_assert_int_eq(st.stream_kernels, 0); /* no stream set */
  ck_assert_int_eq(st.stream_waits, 0);
  fill(c, 0, 130); /* 2 blocks on each layer */
  ck_assert_int_eq(kivi_cache_get_stats(c, &st), KIVI_OK);
  ck_assert_int_eq(st.total_blocks, NL * 4);
  ck_assert_int_eq(st.free_blocks, NL * 4 - NL * 2);
  kivi_context_info info;
  memset(&info, 0x7f, sizeof info);
  ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
  for (int i = 0; i < 13; ++i) ck_assert_int_eq(info.reserved[i], 0);
  kivi_cache_destroy(c);
}
END_TEST

START_TEST(checkpoint_id_beyond_slots_is_capacity) {
  kivi_cache *big = make(4, 0), *small = make(2, 0);
  fill(big, 3, 90); /* id 3 does not exist in a 2-slot cache of the same geometry */
  size_t n = 0;
  ck_assert_int_eq(kivi_cache_save(big, KIVI_ALL_SEQS, NULL, &n), KIVI_OK);
  unsigned char *ck = malloc(n);
  ck_assert_int_eq(kivi_cache_save(big, KIVI_ALL_SEQS, ck, &n), KIVI_OK);
  fill(small, 1, 20);
  const snapshot before = snap(small);
  ck_assert_int_eq(kivi_cache_load(small, KIVI_ALL_SEQS, ck, n), KIVI_ERR_CAPACITY);
  const snapshot after = snap(small);
  same(&before, &after);
  /* the same sequence loads into a slot that exists */
  size_t n1 = 0;
  ck_assert_int_eq(kivi_cache_save(big, 3, NULL, &n1), KIVI_OK);
  unsigned char *ck1 = malloc(n1);
  ck_assert_int_eq(kivi_cache_save(big, 3, ck1, &n1), KIVI_OK);
  ck_assert_int_eq(kivi_cache_load(small, 0, ck1, n1), KIVI_OK);
  int len = 0;
  ck_assert_int_eq(kivi_cache_seq_length(small, 0, 1, &len), KIVI_OK);
  ck_assert_int_eq(len, 90);
  free(before.bytes);
  free(after.bytes);
  free(ck);
  free(ck1);
  kivi_cache_destroy(big);
  kivi_cache_destroy(small);
}
END_TEST

START_TEST(struct_sizes) {
  /* the sizes docs/ABI.md and tests/pkg/abi-baseline.txt record (LP64) */
  if (sizeof(size_t) == 8) {
    ck_assert_uint_eq(sizeof(kivi_context_info), 64);
    ck_assert_uint_eq(sizeof(kivi_cache_config), 128);
    ck_assert_uint_eq(sizeof(kivi_cache_stats), 128);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("contract");
  TCase *tc = tcase_create("contract");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, zero_sequences_do_nothing);
  tcase_add_test(tc, buffer_too_small_reports_size);
  tcase_add_test(tc, config_reasons_and_reserved);
  tcase_add_test(tc, stats_count_blocks_over_layers);
  tcase_add_test(tc, checkpoint_id_beyond_slots_is_capacity);
  tcase_add_test(tc, struct_sizes);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
