/* Shared test helpers: a deterministic RNG, the suite runner (no fork: device state does not
 * survive fork()), and the context every conformance test runs on. */
#ifndef KIVI_CHECK_UTIL_H
#define KIVI_CHECK_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "kivi.h"
#include "ref/kivi_ref.h"

static inline uint64_t tu_next(uint64_t *s) { /* splitmix64 */
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static inline float tu_uniform(uint64_t *s) { return (float)((double)(tu_next(s) >> 11) / 4503599627370496.0 - 1.0); }

static inline float *tu_random(size_t n, uint64_t seed, float amp) {
  float *x = malloc(n * sizeof *x);
  for (size_t i = 0; i < n; ++i) x[i] = amp * tu_uniform(&seed);
  return x;
}

/* The context of the conformance tests: the default device (the GPU when there is one, host
 * threads otherwise).  KIVI_TEST_EXPECT_GPU=1 makes a host context a failure. */
static inline kivi_context *tu_context(void) {
  kivi_context *ctx = NULL;
  ck_assert_int_eq(kivi_context_create(&ctx, KIVI_DEVICE_DEFAULT), KIVI_OK);
  const char *e = getenv("KIVI_TEST_EXPECT_GPU");
  if (e && atoi(e) == 1) {
    kivi_context_info info;
    ck_assert_int_eq(kivi_context_get_info(ctx, &info), KIVI_OK);
    ck_assert_msg(info.on_gpu == 1, "KIVI_TEST_EXPECT_GPU=1 but the context runs on the host");
  }
  return ctx;
}

/* A cache of the given geometry on ctx, with `lanes` asynchronous lanes (paper defaults for
 * everything else). */
static inline kivi_cache *tu_cache_lanes(kivi_context *ctx, int layers, int H, int D, int seqs, int maxlen, int kb,
                                         int vb, int G, int R, int lanes) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, layers, H, D, seqs, maxlen);
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.group = G;
  cfg.residual = R;
  cfg.async_lanes = lanes;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  return c;
}

static inline kivi_cache *tu_cache(kivi_context *ctx, int layers, int H, int D, int seqs, int maxlen, int kb, int vb,
                                   int G, int R) {
  return tu_cache_lanes(ctx, layers, H, D, seqs, maxlen, kb, vb, G, R, 1);
}

/* The export of (seq, layer) in a malloc'd buffer; *n receives its size. */
static inline unsigned char *tu_export(const kivi_cache *c, int seq, int layer, size_t *n) {
  ck_assert_int_eq(kivi_cache_export_seq(c, seq, layer, NULL, n), KIVI_OK);
  unsigned char *b = malloc(*n ? *n : 1);
  ck_assert_int_eq(kivi_cache_export_seq(c, seq, layer, b, n), KIVI_OK);
  return b;
}

/* Little-endian u32 fields of a checkpoint, and its CRC-32 trailer written again after an edit
 * of its n bytes (docs/CHECKPOINT.md). */
static inline uint32_t tu_get32(const unsigned char *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }
static inline void tu_put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static inline void tu_recrc(unsigned char *b, size_t n) {
  tu_put32(b + n - 4, (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), b, n - 4));
}

/* n fp32 values x as an input of dtype dt (malloc'd): fp32 as they are, fp16 rounded to nearest
 * even, bf16 truncated (any bf16 value will do); x receives the values the input holds. */
static inline unsigned char *tu_input(kivi_dtype dt, float *x, size_t n) {
  unsigned char *in = malloc(n * (dt == KIVI_F32 ? 4 : 2) + 1);
  for (size_t i = 0; i < n; ++i) {
    if (dt == KIVI_F32) {
      ((float *)in)[i] = x[i];
      continue;
    }
    uint16_t h;
    if (dt == KIVI_F16) {
      h = ref_f16(x[i]);
      x[i] = ref_f16_val(h);
    } else {
      uint32_t u;
      memcpy(&u, &x[i], 4);
      h = (uint16_t)(u >> 16);
      u = (uint32_t)h << 16;
      memcpy(&x[i], &u, 4);
    }
    ((uint16_t *)in)[i] = h;
  }
  return in;
}

/* The reference's export (tests/ref/kivi_ref.h) of L tokens k, v ([L][H][D] fp32) stored as a
 * cache with kivi_cache_config.rotate = rot stores them: each head vector rotated first, in fp32
 * (malloc'd; *bytes its size). */
static inline unsigned char *tu_ref_export(const ref_geom *g, int rot, int L, const float *k, const float *v,
                                           size_t *bytes) {
  const size_t n = (size_t)L * g->H * g->D;
  float *rk = malloc(n * 4 + 4), *rv = malloc(n * 4 + 4);
  memcpy(rk, k, n * 4);
  memcpy(rv, v, n * 4);
  for (size_t i = 0; i < (size_t)L * g->H; ++i) {
    if (rot & KIVI_ROTATE_K) ref_rotate_f32(rk + i * g->D, g->D);
    if (rot & KIVI_ROTATE_V) ref_rotate_f32(rv + i * g->D, g->D);
  }
  unsigned char *e = ref_export(g, L, rk, rv, bytes);
  free(rk);
  free(rv);
  return e;
}

/* Double attention of one query row q [HQ][D] (fp32) over L tokens kd, vd ([L][H][D] double, as
 * a cache with kivi_cache_config.rotate = rot stores them): q rotated in double for rotated
 * keys (then given to ref_attention in fp32), the output rotated back for rotated values;
 * ref [HQ][D]. */
static inline void tu_ref_attention_rot(int L, int H, int HQ, int D, const double *kd, const double *vd,
                                        const float *q, int rot, double scale, double *ref) {
  double *qd = malloc((size_t)HQ * D * sizeof *qd);
  float *qr = malloc((size_t)HQ * D * sizeof *qr);
  for (size_t j = 0; j < (size_t)HQ * D; ++j) qd[j] = q[j];
  if (rot & KIVI_ROTATE_K)
    for (int h = 0; h < HQ; ++h) ref_rotate(qd + (size_t)h * D, D);
  for (size_t j = 0; j < (size_t)HQ * D; ++j) qr[j] = (float)qd[j];
  ref_attention(L, H, HQ, D, kd, vd, qr, scale, ref, NULL);
  if (rot & KIVI_ROTATE_V)
    for (int h = 0; h < HQ; ++h) ref_rotate(ref + (size_t)h * D, D);
  free(qd);
  free(qr);
}

/* Snapshot of everything observable: every (seq, layer) export and length, and the stats (but
 * the counts of the stream route). */
typedef struct snapshot {
  unsigned char *bytes;
  size_t n;
  kivi_cache_stats st;
} snapshot;

static inline snapshot snap(const kivi_cache *c) {
  kivi_cache_config cfg;
  ck_assert_int_eq(kivi_cache_get_config(c, &cfg), KIVI_OK);
  snapshot s = {NULL, 0, {0}};
  for (int q = 0; q < cfg.max_seqs; ++q)
    for (int l = 0; l < cfg.n_layers; ++l) {
      size_t n = 0;
      int len = -1;
      ck_assert_int_eq(kivi_cache_seq_length(c, q, l, &len), KIVI_OK);
      ck_assert_int_eq(kivi_cache_export_seq(c, q, l, NULL, &n), KIVI_OK);
      s.bytes = realloc(s.bytes, s.n + n + sizeof len);
      memcpy(s.bytes + s.n, &len, sizeof len);
      ck_assert_int_eq(kivi_cache_export_seq(c, q, l, s.bytes + s.n + sizeof len, &n), KIVI_OK);
      s.n += n + sizeof len;
    }
  ck_assert_int_eq(kivi_cache_get_stats(c, &s.st), KIVI_OK);
  s.st.stream_kernels = s.st.stream_waits = 0; /* how the work ran, not what the cache holds */
  return s;
}

static inline void same(const snapshot *a, const snapshot *b) {
  ck_assert_uint_eq(a->n, b->n);
  ck_assert_int_eq(memcmp(a->bytes, b->bytes, a->n), 0);
  ck_assert_int_eq(memcmp(&a->st, &b->st, sizeof a->st), 0);
}

static inline int tu_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
