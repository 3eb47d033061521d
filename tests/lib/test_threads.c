/* Threading contract (kivi.h): one context shared by several host threads, each with its own
 * cache, appending and attending concurrently.  Every thread's exports and outputs must equal
 * the same work done sequentially. */
#include <pthread.h>

#include "../check_util.h"

enum { THREADS = 4, H = 2, D = 64, STEPS = 12 };

typedef struct job {
  kivi_context *ctx;
  int id;
  unsigned char *export_bytes;
  size_t export_n;
  float out[STEPS][4 * D];
  kivi_status st;
} job;

/* A prefill then STEPS decode steps (append one token, attend). */
static void *work(void *arg) {
  job *j = arg;
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, H, D, 1, 2048);
  cfg.k_bits = 2 + 2 * (j->id % 2);
  kivi_cache *c = NULL;
  j->st = kivi_cache_create(j->ctx, &cfg, &c);
  if (j->st) return NULL;
  const int n = 300 + 37 * j->id, seq = 0, one = 1;
  float *k = tu_random((size_t)(n + STEPS) * H * D, 100 + (uint64_t)j->id, 1.0f);
  float *v = tu_random((size_t)(n + STEPS) * H * D, 200 + (uint64_t)j->id, 1.0f);
  float *q = tu_random((size_t)STEPS * 4 * D, 300 + (uint64_t)j->id, 1.0f);
  j->st = kivi_cache_append(c, 0, 1, &seq, &n, k, v, KIVI_F32, KIVI_MEM_HOST);
  for (int s = 0; s < STEPS && !j->st; ++s) {
    const size_t at = (size_t)(n + s) * H * D;
    j->st = kivi_cache_append(c, 0, 1, &seq, &one, k + at, v + at, KIVI_F32, KIVI_MEM_HOST);
    if (!j->st)
      j->st = kivi_attention_decode(c, 0, 1, &seq, 4, q + (size_t)s * 4 * D, 0.125f, j->out[s], KIVI_F32, KIVI_MEM_HOST);
  }
  if (!j->st) j->st = kivi_cache_export_seq(c, 0, 0, NULL, &j->export_n);
  if (!j->st && (j->export_bytes = malloc(j->export_n)) != NULL)
    j->st = kivi_cache_export_seq(c, 0, 0, j->export_bytes, &j->export_n);
  free(k);
  free(v);
  free(q);
  kivi_cache_destroy(c);
  return NULL;
}

START_TEST(distinct_caches_concurrently) {
  kivi_context *ctx = tu_context();
  static job seq_jobs[THREADS], par_jobs[THREADS];
  for (int i = 0; i < THREADS; ++i) {
    seq_jobs[i] = (job){.ctx = ctx, .id = i};
    work(&seq_jobs[i]);
    ck_assert_int_eq(seq_jobs[i].st, KIVI_OK);
  }
  for (int round = 0; round < 3; ++round) {
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; ++i) {
      par_jobs[i] = (job){.ctx = ctx, .id = i};
      ck_assert_int_eq(pthread_create(&t[i], NULL, work, &par_jobs[i]), 0);
    }
    for (int i = 0; i < THREADS; ++i) ck_assert_int_eq(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < THREADS; ++i) {
      ck_assert_int_eq(par_jobs[i].st, KIVI_OK);
      ck_assert_uint_eq(par_jobs[i].export_n, seq_jobs[i].export_n);
      ck_assert_int_eq(memcmp(par_jobs[i].export_bytes, seq_jobs[i].export_bytes, seq_jobs[i].export_n), 0);
      ck_assert_int_eq(memcmp(par_jobs[i].out, seq_jobs[i].out, sizeof par_jobs[i].out), 0);
      free(par_jobs[i].export_bytes);
    }
  }
  for (int i = 0; i < THREADS; ++i) free(seq_jobs[i].export_bytes);
  kivi_context_destroy(ctx);
}
END_TEST

int main(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("threads");
  tcase_add_test(tc, distinct_caches_concurrently);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
