/* Helpers of the scale-out examples (kivi_multi_device.c, mpi/kivi_mpi_heads.c): a Llama-shaped
 * layer stack whose kv-heads are split into parts, each part a cache of its own on one device.
 *
 * The synthetic K, V and Q are a pure function of (tensor, layer, token, head, channel), so a
 * part generates exactly its slice of the tensors the whole model would have, and attention of
 * q-head h reads kv-head h / (HQ / H) only: the parts' outputs put side by side are the whole
 * model's output. */
#ifndef KIVI_EXAMPLES_SPLIT_H
#define KIVI_EXAMPLES_SPLIT_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kivi.h"

typedef struct split_shape {
  int layers, HQ, H, D, batch, context, steps, bits;
  int stream; /* 1: each part's cache on a CUDA stream of its own (kivi_cache_set_stream), its
                 step's calls enqueued there and one wait per step */
} split_shape;

enum { SPLIT_K = 1, SPLIT_V = 2, SPLIT_Q = 3 };

static inline float split_value(unsigned tensor, int layer, long token, int head, int d) {
  uint64_t z = ((uint64_t)tensor << 60) ^ ((uint64_t)layer << 48) ^ ((uint64_t)token << 20) ^ ((uint64_t)head << 10) ^
               (uint64_t)d;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull; /* splitmix64 finalizer */
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) / 8388608.0f - 1.0f; /* [-1, 1) */
}

/* dst[b][t][h - h0][d] for tokens t0 .. t0 + n - 1 of every sequence b (sequence b's tokens are
 * numbered b * 1000000 + t), heads h0 .. h1 - 1. */
static inline void split_fill(float *dst, unsigned tensor, int layer, int batch, long t0, long n, int h0, int h1,
                              int D) {
  const int nh = h1 - h0;
#ifdef _OPENMP /* a prefill of long contexts: host threads (the values do not depend on them) */
#pragma omp parallel for collapse(2) schedule(static) if ((long)batch * n > 1024)
#endif
  for (int b = 0; b < batch; ++b)
    for (long t = 0; t < n; ++t)
      for (int h = h0; h < h1; ++h)
        for (int d = 0; d < D; ++d)
          dst[(((size_t)b * n + t) * nh + (h - h0)) * D + d] = split_value(tensor, layer, b * 1000000L + t0 + t, h, d);
}

/* One part: kv-heads [h0, h1) of every layer, in a cache on ctx. */
typedef struct split_part {
  split_shape s;
  int h0, h1, hq0, hq1; /* kv-heads and the q-heads that read them */
  kivi_context *ctx;
  kivi_cache *cache;
  int on_stream;    /* the cache has a stream (s.stream, where the build and device allow it) */
  float *k, *v, *q; /* host staging for one step */
} split_part;

/* Creates the part's cache and prefills `context` tokens of every sequence on every layer. */
static inline kivi_status split_part_init(split_part *p, const split_shape *s, kivi_context *ctx, int h0, int h1) {
  memset(p, 0, sizeof *p);
  p->s = *s;
  p->h0 = h0;
  p->h1 = h1;
  p->hq0 = h0 * (s->HQ / s->H);
  p->hq1 = h1 * (s->HQ / s->H);
  p->ctx = ctx;
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, s->layers, h1 - h0, s->D, s->batch, s->context + s->steps);
  cfg.k_bits = cfg.v_bits = s->bits;
  kivi_status st = kivi_cache_create(ctx, &cfg, &p->cache);
  if (st) return st;
  if (s->stream) { /* without a stream (host, no driver) the part runs the synchronous calls */
    st = kivi_cache_set_stream(p->cache, KIVI_STREAM_LIBRARY);
    p->on_stream = st == KIVI_OK;
    if (st == KIVI_ERR_UNSUPPORTED) st = KIVI_OK;
    if (st) return st;
  }
  const size_t nh = (size_t)(h1 - h0), per_step = (size_t)s->batch * nh * s->D;
  p->k = malloc(per_step * sizeof(float));
  p->v = malloc(per_step * sizeof(float));
  p->q = malloc((size_t)s->batch * (p->hq1 - p->hq0) * s->D * sizeof(float));
  float *kp = malloc((size_t)s->context * per_step * sizeof(float)), *vp = malloc((size_t)s->context * per_step * sizeof(float));
  int *ids = malloc((size_t)s->batch * sizeof *ids), *lens = malloc((size_t)s->batch * sizeof *lens);
  if (!p->k || !p->v || !p->q || !kp || !vp || !ids || !lens) st = KIVI_ERR_NOMEM;
  for (int b = 0; b < s->batch && !st; ++b) {
    ids[b] = b;
    lens[b] = s->context;
  }
  for (int l = 0; l < s->layers && !st; ++l) {
    split_fill(kp, SPLIT_K, l, s->batch, 0, s->context, h0, h1, s->D);
    split_fill(vp, SPLIT_V, l, s->batch, 0, s->context, h0, h1, s->D);
    st = kivi_cache_append(p->cache, l, s->batch, ids, lens, kp, vp, KIVI_F32, KIVI_MEM_HOST);
  }
  free(kp);
  free(vp);
  free(ids);
  free(lens);
  return st;
}

/* Decode step `step` on every layer: append the new token of every sequence, attend.
 * out: [layers][batch][hq1 - hq0][D]. */
static inline kivi_status split_part_step(split_part *p, int step, float *out) {
  const split_shape *s = &p->s;
  const int nhq = p->hq1 - p->hq0;
  int ids[256], ones[256];
  if (s->batch > 256) return KIVI_ERR_ARG;
  for (int b = 0; b < s->batch; ++b) {
    ids[b] = b;
    ones[b] = 1;
  }
  /* on a stream the _async calls (the same arguments): host inputs are copied at the call, the
   * outputs arrive at the one wait below */
  kivi_status (*append)(kivi_cache *, int, int, const int *, const int *, const void *, const void *, kivi_dtype,
                        kivi_mem) = p->on_stream ? kivi_cache_append_async : kivi_cache_append;
  kivi_status (*decode)(kivi_cache *, int, int, const int *, int, const float *, float, void *, kivi_dtype,
                        kivi_mem) = p->on_stream ? kivi_attention_decode_async : kivi_attention_decode;
  kivi_status st = KIVI_OK;
  for (int l = 0; l < s->layers && !st; ++l) {
    split_fill(p->k, SPLIT_K, l, s->batch, s->context + step, 1, p->h0, p->h1, s->D);
    split_fill(p->v, SPLIT_V, l, s->batch, s->context + step, 1, p->h0, p->h1, s->D);
    split_fill(p->q, SPLIT_Q, l, s->batch, step, 1, p->hq0, p->hq1, s->D);
    st = append(p->cache, l, s->batch, ids, ones, p->k, p->v, KIVI_F32, KIVI_MEM_HOST);
    if (!st)
      st = decode(p->cache, l, s->batch, ids, nhq, p->q, 1.0f / sqrtf((float)s->D),
                  out + (size_t)l * s->batch * nhq * s->D, KIVI_F32, KIVI_MEM_HOST);
  }
  if (p->on_stream) {
    const kivi_status w = kivi_cache_wait(p->cache);
    if (!st) st = w;
  }
  return st;
}

static inline void split_part_free(split_part *p) {
  kivi_cache_destroy(p->cache);
  free(p->k);
  free(p->v);
  free(p->q);
  memset(p, 0, sizeof *p);
}

/* Places a part's output [layers][batch][hq1-hq0][D] into the whole [layers][batch][HQ][D]. */
static inline void split_place(const split_shape *s, int hq0, int hq1, const float *part, float *whole) {
  const int nhq = hq1 - hq0;
  for (int l = 0; l < s->layers; ++l)
    for (int b = 0; b < s->batch; ++b)
      memcpy(whole + (((size_t)l * s->batch + b) * s->HQ + hq0) * s->D,
             part + (((size_t)l * s->batch + b) * nhq) * s->D, (size_t)nhq * s->D * sizeof(float));
}

/* max |a - b| / max |b| over n values. */
static inline double split_rel_err(const float *a, const float *b, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num = fmax(num, fabs((double)a[i] - b[i]));
    den = fmax(den, fabs((double)b[i]));
  }
  return den > 0 ? num / den : num;
}

#endif
