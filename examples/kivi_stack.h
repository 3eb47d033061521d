/* A decode step of a whole layer stack, synchronous or asynchronous (examples/kivi_layers.c and
 * bench/kivi-bench --stack).  Synthetic data; the step's inputs and outputs in device memory, as
 * in a code that keeps its model on the GPU.  Each step, on every layer: append the new token's
 * K/V of every sequence, then decode attention for it. */
#ifndef KIVI_EXAMPLES_STACK_H
#define KIVI_EXAMPLES_STACK_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kivi.h"

typedef struct stack_shape {
  int layers, HQ, H, D, batch, context, steps, bits;
  int lanes; /* the cache's async_lanes */
  int chain; /* 1: each layer's q is derived from the previous layer's output by a target region
                of the caller (stack_chain_q); 2: each layer's q is the previous layer's output */
  int stream; /* 1: the cache on a CUDA stream of its own (kivi_cache_set_stream) */
} stack_shape;

/* The step inputs on the device (the same for every run, so runs can be compared bit for bit). */
typedef struct stack_inputs {
  kivi_context *ctx;
  float *kp, *vp;       /* host: the prompt's K/V [batch][context][H][D], the same on every layer */
  void *dk, *dv, *dq;   /* device: [steps][batch][H][D] K and V, [steps][layers][batch][HQ][D] q */
  void *dqc;            /* device: [batch][HQ][D], the derived q of the current layer (chain) */
  int *ids, *ones, *lens;
  int dev, on_gpu;      /* the context's OpenMP device, and whether it is a GPU */
} stack_inputs;

static inline double stack_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline float *stack_random(size_t n, unsigned seed) {
  float *x = malloc(n * sizeof *x);
  unsigned s = seed;
  for (size_t i = 0; x && i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
  }
  return x;
}

static inline kivi_status stack_inputs_init(stack_inputs *in, kivi_context *ctx, const stack_shape *s) {
  memset(in, 0, sizeof *in);
  in->ctx = ctx;
  const size_t tok = (size_t)s->H * s->D, qrow = (size_t)s->batch * s->HQ * s->D;
  const size_t nk = (size_t)s->steps * s->batch * tok, nq = (size_t)s->steps * s->layers * qrow;
  in->kp = stack_random((size_t)s->batch * s->context * tok, 1);
  in->vp = stack_random((size_t)s->batch * s->context * tok, 2);
  float *ks = stack_random(nk, 3), *vs = stack_random(nk, 4), *qs = stack_random(nq, 5);
  in->ids = malloc((size_t)s->batch * sizeof(int));
  in->ones = malloc((size_t)s->batch * sizeof(int));
  in->lens = malloc((size_t)s->batch * sizeof(int));
  kivi_status st = in->kp && in->vp && ks && vs && qs && in->ids && in->ones && in->lens ? KIVI_OK : KIVI_ERR_NOMEM;
  for (int b = 0; !st && b < s->batch; ++b) {
    in->ids[b] = b;
    in->ones[b] = 1;
    in->lens[b] = s->context;
  }
  if (!st) st = kivi_context_alloc(ctx, nk * 4, &in->dk);
  if (!st) st = kivi_context_alloc(ctx, nk * 4, &in->dv);
  if (!st) st = kivi_context_alloc(ctx, nq * 4, &in->dq);
  if (!st) st = kivi_context_alloc(ctx, qrow * 4, &in->dqc);
  kivi_context_info info;
  if (!st) st = kivi_context_get_info(ctx, &info);
  if (!st) {
    in->dev = info.device;
    in->on_gpu = info.on_gpu;
  }
  if (!st) st = kivi_context_upload(ctx, in->dk, ks, nk * 4);
  if (!st) st = kivi_context_upload(ctx, in->dv, vs, nk * 4);
  if (!st) st = kivi_context_upload(ctx, in->dq, qs, nq * 4);
  free(ks);
  free(vs);
  free(qs);
  return st;
}

static inline void stack_inputs_free(stack_inputs *in) {
  kivi_context_free(in->ctx, in->dk);
  kivi_context_free(in->ctx, in->dv);
  kivi_context_free(in->ctx, in->dq);
  kivi_context_free(in->ctx, in->dqc);
  free(in->kp);
  free(in->vp);
  free(in->ids);
  free(in->ones);
  free(in->lens);
  memset(in, 0, sizeof *in);
}

/* A cache with the prompt on every layer (s->stream: on a stream of its own, set before the
 * prompt; where there is none, KIVI_ERR_UNSUPPORTED before any prompt work). */
static inline kivi_status stack_cache(const stack_inputs *in, const stack_shape *s, kivi_cache **c) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, s->layers, s->H, s->D, s->batch, s->context + s->steps);
  cfg.k_bits = cfg.v_bits = s->bits;
  cfg.async_lanes = s->lanes;
  kivi_status st = kivi_cache_create(in->ctx, &cfg, c);
  if (!st && s->stream) st = kivi_cache_set_stream(*c, KIVI_STREAM_LIBRARY);
  for (int l = 0; l < s->layers && !st; ++l)
    st = kivi_cache_append(*c, l, s->batch, in->ids, in->lens, in->kp, in->vp, KIVI_F32, KIVI_MEM_HOST);
  return st;
}

/* The caller's own work between two layers (chain): the q of layer l is its input q plus 2^-10
 * times the output of layer l - 1, computed on the cache's device by a target region of the
 * caller, as a model's projections would be.  Enqueued (async) with depend(in: d[0]), where
 * d = kivi_cache_dependence(c): it runs after the calls enqueued before it (the decode of layer
 * l - 1) and before those enqueued after it (the append and the decode of layer l).  Needs a
 * build with OpenMP (examples/kivi_layers); elsewhere KIVI_ERR_UNSUPPORTED. */
static inline kivi_status stack_chain_q(const stack_inputs *in, kivi_cache *c, int async, const float *q,
                                        const float *o_prev, size_t n) {
#ifdef _OPENMP
  float *qc = in->dqc;
  const int dev = in->dev;
  const float *op = o_prev ? o_prev : q;
  const float w = o_prev ? 0x1p-10f : 0.0f;
  const long long nn = (long long)n;
  char *d = kivi_cache_dependence(c);
  (void)d; /* named only in depend clauses */
  if (async && in->on_gpu) {
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(qc, q, op) nowait depend(in : d[0])
    for (long long i = 0; i < nn; ++i) qc[i] = q[i] + w * op[i];
  } else {
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(qc, q, op)
    for (long long i = 0; i < nn; ++i) qc[i] = q[i] + w * op[i];
  }
  return KIVI_OK;
#else
  (void)in; (void)c; (void)async; (void)q; (void)o_prev; (void)n;
  return KIVI_ERR_UNSUPPORTED;
#endif
}

/* Runs the steps on c; step_s[steps]: wall time of each step; dout (device,
 * [layers][batch][HQ][D]) holds the last step's outputs.  async: all layers' calls enqueued and
 * one kivi_cache_wait per step; otherwise the synchronous calls.  chain: each layer's q from the
 * previous layer's output (1: through stack_chain_q; 2: the output itself, which needs no work of
 * the caller and so also serves a cache on a CUDA stream), so the layers depend on each other as
 * in a model; without it the layers' calls are independent (synthetic data).  chain 2 on an
 * enqueued run needs a cache with one lane (the decode of layer l reads what layer l - 1's wrote). */
static inline kivi_status stack_steps(const stack_inputs *in, const stack_shape *s, kivi_cache *c, int async,
                                      void *dout, double *step_s) {
  const size_t tok = (size_t)s->H * s->D, qrow = (size_t)s->batch * s->HQ * s->D;
  const float scale = 1.0f / sqrtf((float)s->D);
  kivi_status st = KIVI_OK;
  for (int step = 0; step < s->steps && !st; ++step) {
    const float *k = (const float *)in->dk + (size_t)step * s->batch * tok;
    const float *v = (const float *)in->dv + (size_t)step * s->batch * tok;
    const double t0 = stack_now();
    for (int l = 0; l < s->layers && !st; ++l) {
      const float *q = (const float *)in->dq + ((size_t)step * s->layers + l) * qrow;
      float *o = (float *)dout + (size_t)l * qrow;
      if (s->chain == 1) {
        st = stack_chain_q(in, c, async, q, l ? o - qrow : NULL, qrow);
        q = in->dqc;
      } else if (s->chain == 2 && l) {
        q = o - qrow;
      }
      if (!st)
        st = async ? kivi_cache_append_async(c, l, s->batch, in->ids, in->ones, k, v, KIVI_F32, KIVI_MEM_DEVICE)
                   : kivi_cache_append(c, l, s->batch, in->ids, in->ones, k, v, KIVI_F32, KIVI_MEM_DEVICE);
      if (!st)
        st = async ? kivi_attention_decode_async(c, l, s->batch, in->ids, s->HQ, q, scale, o, KIVI_F32, KIVI_MEM_DEVICE)
                   : kivi_attention_decode(c, l, s->batch, in->ids, s->HQ, q, scale, o, KIVI_F32, KIVI_MEM_DEVICE);
    }
    if (async) {
      const kivi_status w = kivi_cache_wait(c);
      if (!st) st = w;
    }
    step_s[step] = stack_now() - t0;
  }
  return st;
}

static inline int stack_cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median and mean of n values (sorts them). */
static inline void stack_median_mean(double *v, int n, double *median, double *mean) {
  double m = 0;
  for (int i = 0; i < n; ++i) m += v[i] / n;
  qsort(v, (size_t)n, sizeof *v, stack_cmp_double);
  *median = v[n / 2];
  *mean = m;
}

#endif
