/* Checkpoint and restore: bit-identical state and attention after a round trip (same device and
 * across GPU and host), one-sequence restore into another slot, files, the size against fp16,
 * and bad checkpoints (truncated, corrupted, wrong version, wrong geometry, too big) that must
 * return a status and leave the target cache untouched. */
#include <unistd.h>

#include "../check_util.h"

static kivi_context *ctx, *host_ctx;
static void setup(void) {
  ctx = tu_context();
  ck_assert_int_eq(kivi_context_create(&host_ctx, KIVI_DEVICE_HOST), KIVI_OK);
}
static void teardown(void) {
  kivi_context_destroy(ctx);
  kivi_context_destroy(host_ctx);
}

enum { NL = 2, H = 2, D = 64, SEQS = 4 };

static kivi_cache *make(kivi_context *c, int kb, int vb, int64_t pool) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, NL, H, D, SEQS, 1024);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.pool_tokens = pool;
  kivi_cache *cache = NULL;
  ck_assert_int_eq(kivi_cache_create(c, &cfg, &cache), KIVI_OK);
  return cache;
}

/* seq 0: 300 tokens on both layers, seq 2: 129 on layer 0 and 5 on layer 1, seq 3: 700 on layer 1 */
static void fill(kivi_cache *c) {
  const int plan[3][3] = {{0, 300, 300}, {2, 129, 5}, {3, 0, 700}};
  float *k = tu_random(700 * H * D, 11, 2.0f), *v = tu_random(700 * H * D, 12, 1.0f);
  for (int i = 0; i < 3; ++i)
    for (int l = 0; l < NL; ++l) {
      const int n = plan[i][1 + l];
      if (n) ck_assert_int_eq(kivi_cache_append(c, l, 1, &plan[i][0], &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    }
  free(k);
  free(v);
}

static unsigned char *save(const kivi_cache *c, int seq, size_t *n) {
  ck_assert_int_eq(kivi_cache_save(c, seq, NULL, n), KIVI_OK);
  unsigned char *b = malloc(*n);
  ck_assert_int_eq(kivi_cache_save(c, seq, b, n), KIVI_OK);
  return b;
}

static void decode(kivi_cache *c, int seq, float *out) {
  float q[4 * D];
  uint64_t s = 5;
  for (int i = 0; i < 4 * D; ++i) q[i] = tu_uniform(&s);
  ck_assert_int_eq(kivi_attention_decode(c, 1, 1, &seq, 4, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
}

/* Round trip through memory, from each context into each context: identical state, and on the
 * same kind of device identical attention output. */
START_TEST(round_trip_across_devices) {
  kivi_context *ctxs[2] = {ctx, host_ctx};
  for (int from = 0; from < 2; ++from)
    for (int to = 0; to < 2; ++to) {
      kivi_cache *a = make(ctxs[from], 2, 4, 0), *b = make(ctxs[to], 2, 4, 0);
      fill(a);
      size_t n;
      unsigned char *ck = save(a, KIVI_ALL_SEQS, &n);
      ck_assert_int_eq(kivi_cache_load(b, KIVI_ALL_SEQS, ck, n), KIVI_OK);
      const snapshot sa = snap(a), sb = snap(b);
      same(&sa, &sb);
      /* appending after the restore behaves as appending to the original */
      float *k = tu_random(40 * H * D, 13, 1.0f), *v = tu_random(40 * H * D, 14, 1.0f);
      const int id = 2, m = 40;
      ck_assert_int_eq(kivi_cache_append(a, 1, 1, &id, &m, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      ck_assert_int_eq(kivi_cache_append(b, 1, 1, &id, &m, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
      const snapshot sa2 = snap(a), sb2 = snap(b);
      same(&sa2, &sb2);
      if (from == to) {
        float oa[4 * D], ob[4 * D];
        decode(a, 3, oa);
        decode(b, 3, ob);
        ck_assert_int_eq(memcmp(oa, ob, sizeof oa), 0);
      }
      free(sa.bytes); free(sb.bytes); free(sa2.bytes); free(sb2.bytes);
      free(k); free(v); free(ck);
      kivi_cache_destroy(a);
      kivi_cache_destroy(b);
    }
}
END_TEST

START_TEST(one_sequence_into_another_slot) {
  kivi_cache *a = make(ctx, 4, 2, 0), *b = make(ctx, 4, 2, 0);
  fill(a);
  fill(b);
  size_t n;
  unsigned char *ck = save(a, 0, &n);
  ck_assert_int_eq(kivi_cache_load(b, 3, ck, n), KIVI_OK); /* seq 0 of a -> slot 3 of b */
  for (int l = 0; l < NL; ++l) {
    size_t na, nb;
    ck_assert_int_eq(kivi_cache_export_seq(a, 0, l, NULL, &na), KIVI_OK);
    ck_assert_int_eq(kivi_cache_export_seq(b, 3, l, NULL, &nb), KIVI_OK);
    ck_assert_uint_eq(na, nb);
    unsigned char *ea = malloc(na), *eb = malloc(nb);
    ck_assert_int_eq(kivi_cache_export_seq(a, 0, l, ea, &na), KIVI_OK);
    ck_assert_int_eq(kivi_cache_export_seq(b, 3, l, eb, &nb), KIVI_OK);
    ck_assert_int_eq(memcmp(ea, eb, na), 0);
    free(ea);
    free(eb);
  }
  int len;
  ck_assert_int_eq(kivi_cache_seq_length(b, 2, 0, &len), KIVI_OK); /* other slots untouched */
  ck_assert_int_eq(len, 129);
  /* a whole-cache checkpoint cannot go into one slot */
  unsigned char *all = save(a, KIVI_ALL_SEQS, &n);
  ck_assert_int_eq(kivi_cache_load(b, 1, all, n), KIVI_ERR_ARG);
  free(all);
  free(ck);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
}
END_TEST

/* Rewrites the CRC after a deliberate edit, so the check behind the CRC is what gets tested. */
static void fix_crc(unsigned char *b, size_t n);

START_TEST(bad_checkpoints_change_nothing) {
  kivi_cache *a = make(ctx, 2, 2, 0), *t = make(ctx, 2, 2, 0);
  fill(a);
  fill(t);
  float *k = tu_random(64 * H * D, 21, 1.0f);
  const int id = 1, m = 64;
  ck_assert_int_eq(kivi_cache_append(t, 0, 1, &id, &m, k, k, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  free(k);
  const snapshot before = snap(t);
  size_t n;
  unsigned char *ck = save(a, KIVI_ALL_SEQS, &n), *bad = malloc(n + 8);
  /* truncated at every length up to the header and at a sample of longer ones */
  for (size_t cut = 0; cut < n; cut += cut < 80 ? 1 : 97)
    ck_assert_int_eq(kivi_cache_load(t, KIVI_ALL_SEQS, ck, cut), KIVI_ERR_FORMAT);
  /* one flipped bit anywhere: the CRC */
  for (size_t at = 0; at < n; at += 61) {
    memcpy(bad, ck, n);
    bad[at] ^= 0x10;
    const kivi_status st = kivi_cache_load(t, KIVI_ALL_SEQS, bad, n);
    ck_assert_msg(st == KIVI_ERR_FORMAT || st == KIVI_ERR_MISMATCH, "flip at %zu: %d", at, st);
  }
  /* trailing bytes */
  memcpy(bad, ck, n);
  ck_assert_int_eq(kivi_cache_load(t, KIVI_ALL_SEQS, bad, n + 8), KIVI_ERR_FORMAT);
  /* wrong version, valid CRC */
  memcpy(bad, ck, n);
  bad[8] = 2;
  fix_crc(bad, n);
  ck_assert_int_eq(kivi_cache_load(t, KIVI_ALL_SEQS, bad, n), KIVI_ERR_FORMAT);
  /* inconsistent record (a length that does not match its blob size), valid CRC */
  memcpy(bad, ck, n);
  bad[64 + 8] ^= 1;
  fix_crc(bad, n);
  ck_assert_int_eq(kivi_cache_load(t, KIVI_ALL_SEQS, bad, n), KIVI_ERR_FORMAT);
  /* NULL, bad ids */
  ck_assert_int_eq(kivi_cache_load(t, KIVI_ALL_SEQS, NULL, n), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_load(t, SEQS, ck, n), KIVI_ERR_ARG);
  ck_assert_int_eq(kivi_cache_load(NULL, KIVI_ALL_SEQS, ck, n), KIVI_ERR_ARG);
  const snapshot after = snap(t);
  same(&before, &after);
  /* another geometry */
  kivi_cache *g4 = make(ctx, 4, 2, 0);
  const snapshot b4 = snap(g4);
  ck_assert_int_eq(kivi_cache_load(g4, KIVI_ALL_SEQS, ck, n), KIVI_ERR_MISMATCH);
  const snapshot a4 = snap(g4);
  same(&b4, &a4);
  /* a pool too small for the checkpoint */
  kivi_cache *small = make(ctx, 2, 2, 256);
  const snapshot bs = snap(small);
  ck_assert_int_eq(kivi_cache_load(small, KIVI_ALL_SEQS, ck, n), KIVI_ERR_CAPACITY);
  const snapshot as = snap(small);
  same(&bs, &as);
  free(before.bytes); free(after.bytes); free(b4.bytes); free(a4.bytes); free(bs.bytes); free(as.bytes);
  free(ck);
  free(bad);
  kivi_cache_destroy(a);
  kivi_cache_destroy(t);
  kivi_cache_destroy(g4);
  kivi_cache_destroy(small);
}
END_TEST

START_TEST(files) {
  kivi_cache *a = make(ctx, 2, 2, 0), *b = make(host_ctx, 2, 2, 0);
  fill(a);
  char dir[] = "/tmp/kivi-ckpt-XXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(dir));
  char path[256], missing[300];
  snprintf(path, sizeof path, "%s/cache.kivi", dir);
  snprintf(missing, sizeof missing, "%s/no/such/dir/cache.kivi", dir);
  ck_assert_int_eq(kivi_cache_save_file(a, KIVI_ALL_SEQS, path), KIVI_OK);
  ck_assert_int_eq(kivi_cache_load_file(b, KIVI_ALL_SEQS, path), KIVI_OK);
  const snapshot sa = snap(a), sb = snap(b);
  same(&sa, &sb);
  ck_assert_int_eq(kivi_cache_save_file(a, KIVI_ALL_SEQS, missing), KIVI_ERR_IO);
  ck_assert_int_eq(kivi_cache_load_file(b, KIVI_ALL_SEQS, missing), KIVI_ERR_IO);
  ck_assert_int_eq(kivi_cache_load_file(b, KIVI_ALL_SEQS, NULL), KIVI_ERR_ARG);
  remove(path);
  rmdir(dir);
  free(sa.bytes);
  free(sb.bytes);
  kivi_cache_destroy(a);
  kivi_cache_destroy(b);
}
END_TEST

/* A 2-bit checkpoint against an fp16 one of the same tokens (one Llama-2-7B-shaped layer:
 * 32 kv-heads x 128 at 4096 tokens): about 5x smaller (CKPT_RATIO_MIN). */
#define CKPT_RATIO_MIN 4.5
START_TEST(size_against_fp16) {
  size_t n[2];
  const int bits[2] = {2, 16};
  for (int i = 0; i < 2; ++i) {
    kivi_cache_config cfg;
    kivi_cache_config_init(&cfg, 1, 32, 128, 1, 4096);
    cfg.k_bits = cfg.v_bits = bits[i];
    kivi_cache *c = NULL;
    ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
    float *k = tu_random((size_t)4096 * 32 * 128, 31, 1.0f);
    const int id = 0, m = 4096;
    ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &m, k, k, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
    free(k);
    ck_assert_int_eq(kivi_cache_save(c, KIVI_ALL_SEQS, NULL, &n[i]), KIVI_OK);
    kivi_cache_destroy(c);
  }
  printf("checkpoint, 32 kv-heads x 128, 4096 tokens: 2-bit %zu bytes, fp16 %zu bytes (%.2fx smaller)\n", n[0],
         n[1], (double)n[1] / (double)n[0]);
  ck_assert((double)n[1] / (double)n[0] >= CKPT_RATIO_MIN);
}
END_TEST

#include <zlib.h>
static void fix_crc(unsigned char *b, size_t n) {
  const uint32_t crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), b, n - 4);
  for (int i = 0; i < 4; ++i) b[n - 4 + i] = (unsigned char)(crc >> (8 * i));
}

int main(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, round_trip_across_devices);
  tcase_add_test(tc, one_sequence_into_another_slot);
  tcase_add_test(tc, bad_checkpoints_change_nothing);
  tcase_add_test(tc, files);
  tcase_add_test(tc, size_against_fp16);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
