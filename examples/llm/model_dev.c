/* The forward pass on the cache's device (model_dev.h).  Every region names its device and takes
 * device pointers (is_device_ptr), so the same source runs on a GPU or, with the host as the
 * device, on host threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_blas.h"
#include "model_dev.h"

typedef _Float16 f16;

/* element i of an array of the products' element type: fp16, or fp32 (f32) */
#pragma omp declare target
static inline float el_ld(const void *p, size_t i, int f32) { return f32 ? ((const float *)p)[i] : (float)((const f16 *)p)[i]; }
static inline void el_st(void *p, size_t i, float v, int f32) {
  if (f32)
    ((float *)p)[i] = v;
  else
    ((f16 *)p)[i] = (f16)v;
}
#pragma omp end declare target
static size_t el_size(const llm_dev_model *dm) { return dm->f32 ? sizeof(float) : sizeof(f16); }

static void *dev_alloc(const llm_dev_model *dm, size_t bytes) { return omp_target_alloc(bytes ? bytes : 1, dm->device); }
static void dev_free(const llm_dev_model *dm, void *p) {
  if (p) omp_target_free(p, dm->device);
}
static int upload(const llm_dev_model *dm, void *dst, const void *src, size_t bytes) {
  return omp_target_memcpy(dst, src, bytes, 0, 0, dm->device, omp_get_initial_device());
}
static int download(const llm_dev_model *dm, void *dst, const void *src, size_t bytes) {
  return omp_target_memcpy(dst, src, bytes, 0, 0, omp_get_initial_device(), dm->device);
}

static void init_device(llm_dev_model *dm, int device, llm_dev_precision precision) {
  dm->f32 = precision == LLM_DEV_F32;
  dm->device = device;
  dm->on_gpu = device != omp_get_initial_device();
  dm->blas = dm->on_gpu ? llm_blas_create(device, NULL) : NULL; /* NULL: the products as target loops */
}

static size_t layer_elems(const llm_dev_shape *s) {
  const size_t D = (size_t)s->dim, F = (size_t)s->ffn_dim, KV = (size_t)s->n_kv_heads * s->head_dim;
  return (D + 2 * KV) * D + D * D + 2 * F * D + D * F;
}

static int alloc_weights(llm_dev_model *dm, int tied, char *err, size_t errlen) {
  const llm_dev_shape *s = &dm->s;
  const size_t D = (size_t)s->dim, F = (size_t)s->ffn_dim, KV = (size_t)s->n_kv_heads * s->head_dim,
               V = (size_t)s->n_vocab;
  dm->layers = calloc((size_t)s->n_layers, sizeof *dm->layers);
  if (!dm->layers) goto nomem;
  const size_t es = el_size(dm);
  dm->weight_bytes = (V * D * (tied ? 1 : 2) + (size_t)s->n_layers * layer_elems(s)) * es +
                     ((size_t)s->n_layers * 2 + 1) * D * sizeof(float) +
                     (s->qkv_bias ? (size_t)s->n_layers * (D + 2 * KV) * sizeof(float) : 0);
  if (!(dm->tok_embd = dev_alloc(dm, V * D * es)) || !(dm->out_norm = dev_alloc(dm, D * sizeof(float))))
    goto nomem;
  dm->output = tied ? dm->tok_embd : dev_alloc(dm, V * D * es);
  if (!dm->output) goto nomem;
  for (int l = 0; l < s->n_layers; ++l) {
    llm_dev_layer *L = &dm->layers[l];
    if (!(L->attn_norm = dev_alloc(dm, D * sizeof(float))) || !(L->ffn_norm = dev_alloc(dm, D * sizeof(float))) ||
        !(L->wqkv = dev_alloc(dm, (D + 2 * KV) * D * es)) || !(L->wo = dev_alloc(dm, D * D * es)) ||
        !(L->wgu = dev_alloc(dm, 2 * F * D * es)) || !(L->wdown = dev_alloc(dm, D * F * es)) ||
        (s->qkv_bias && !(L->bqkv = dev_alloc(dm, (D + 2 * KV) * sizeof(float)))))
      goto nomem;
  }
  return 0;
nomem:
  snprintf(err, errlen, "out of device memory for %.2f GB of weights", (double)dm->weight_bytes / 1e9);
  return -1;
}

static int check_shape(const llm_dev_shape *s, char *err, size_t errlen) {
  if (s->n_layers < 1 || s->n_heads < 1 || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads || s->head_dim < 2 ||
      s->head_dim % 2 || s->dim != s->n_heads * s->head_dim || s->ffn_dim < 1 || s->n_vocab < 1 ||
      !(s->rms_eps > 0) || !(s->rope_base > 0)) {
    snprintf(err, errlen, "inconsistent model shape");
    return -1;
  }
  return 0;
}

/* ---- weights from a host model (fp32, any GGUF type) ------------------------------------ */
/* n weights to dst[at..] in the model's element type (fp16 through tmp, fp32 directly); -1 also
 * for a weight beyond fp16's range */
static int put_w(llm_dev_model *dm, void *dst, size_t at, const float *src, size_t n, f16 *tmp) {
  if (dm->f32) return upload(dm, (float *)dst + at, src, n * sizeof(float));
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    tmp[i] = (f16)src[i];
    bad |= !isfinite((float)tmp[i]);
  }
  return bad || upload(dm, (f16 *)dst + at, tmp, n * sizeof(f16));
}

int llm_dev_model_from_host(llm_dev_model *dm, const llm_model *m, int device, llm_dev_precision precision, char *err,
                            size_t errlen) {
  memset(dm, 0, sizeof *dm);
  dm->s = (llm_dev_shape){m->n_layers, m->n_heads, m->n_kv_heads, m->head_dim, m->dim,
                          m->ffn_dim, m->n_vocab, m->rope_base, m->rms_eps, m->layers[0].bq != NULL};
  if (check_shape(&dm->s, err, errlen)) return -1;
  init_device(dm, device, precision);
  const int tied = m->output == m->tok_embd;
  if (alloc_weights(dm, tied, err, errlen)) {
    llm_dev_model_free(dm);
    return -1;
  }
  const size_t D = (size_t)m->dim, F = (size_t)m->ffn_dim, KV = (size_t)m->n_kv_heads * m->head_dim,
               V = (size_t)m->n_vocab, big = V * D > F * D ? V * D : F * D;
  f16 *tmp = dm->f32 ? NULL : malloc((big > D * D ? big : D * D) * sizeof(f16)); /* put_w's fp16 staging */
  int bad = !dm->f32 && !tmp;
  bad = bad || put_w(dm, dm->tok_embd, 0, m->tok_embd, V * D, tmp);
  bad = bad || (!tied && put_w(dm, dm->output, 0, m->output, V * D, tmp));
  bad = bad || upload(dm, dm->out_norm, m->out_norm, D * sizeof(float));
  for (int l = 0; l < m->n_layers && !bad; ++l) {
    const llm_layer *H = &m->layers[l];
    const llm_dev_layer *L = &dm->layers[l];
    bad = upload(dm, L->attn_norm, H->attn_norm, D * sizeof(float)) ||
          upload(dm, L->ffn_norm, H->ffn_norm, D * sizeof(float)) || put_w(dm, L->wqkv, 0, H->wq, D * D, tmp) ||
          put_w(dm, L->wqkv, D * D, H->wk, KV * D, tmp) || put_w(dm, L->wqkv, (D + KV) * D, H->wv, KV * D, tmp) ||
          put_w(dm, L->wo, 0, H->wo, D * D, tmp) || put_w(dm, L->wgu, 0, H->w_gate, F * D, tmp) ||
          put_w(dm, L->wgu, F * D, H->w_up, F * D, tmp) || put_w(dm, L->wdown, 0, H->w_down, D * F, tmp) ||
          (L->bqkv && (!H->bq || upload(dm, L->bqkv, H->bq, D * sizeof(float)) ||
                       upload(dm, L->bqkv + D, H->bk, KV * sizeof(float)) ||
                       upload(dm, L->bqkv + D + KV, H->bv, KV * sizeof(float))));
  }
  free(tmp);
  if (bad) {
    snprintf(err, errlen, "cannot copy the weights to device %d as %s", device,
             dm->f32 ? "fp32" : "fp16 (out of fp16's range?)");
    llm_dev_model_free(dm);
    return -1;
  }
  return 0;
}

/* ---- synthetic weights, made where they live -------------------------------------------- */
#pragma omp declare target
static inline float synth_uniform(uint64_t seed, uint64_t i) { /* [-1, 1): splitmix64 of (seed, i) */
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}
#pragma omp end declare target

static void fill_w(const llm_dev_model *dm, void *w, size_t n, uint64_t seed, float amp) {
  const int dev = dm->device, f32 = dm->f32;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(w)
  for (size_t i = 0; i < n; ++i) el_st(w, i, amp * synth_uniform(seed, i), f32);
}
static void fill_f32(const llm_dev_model *dm, float *w, size_t n, uint64_t seed, float amp) {
  const int dev = dm->device;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(w)
  for (size_t i = 0; i < n; ++i) w[i] = amp * synth_uniform(seed, i);
}
static void fill_ones(const llm_dev_model *dm, float *w, size_t n) {
  const int dev = dm->device;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(w)
  for (size_t i = 0; i < n; ++i) w[i] = 1.0f;
}

int llm_dev_model_synthetic(llm_dev_model *dm, const llm_dev_shape *s, uint64_t seed, int device,
                            llm_dev_precision precision, char *err, size_t errlen) {
  memset(dm, 0, sizeof *dm);
  dm->s = *s;
  if (check_shape(s, err, errlen)) return -1;
  init_device(dm, device, precision);
  if (alloc_weights(dm, 0, err, errlen)) {
    llm_dev_model_free(dm);
    return -1;
  }
  const size_t D = (size_t)s->dim, F = (size_t)s->ffn_dim, KV = (size_t)s->n_kv_heads * s->head_dim,
               V = (size_t)s->n_vocab;
  /* amplitude sqrt(3 / fan-in): unit variance out of every product */
  const float aD = sqrtf(3.0f / (float)D), aF = sqrtf(3.0f / (float)F);
  fill_w(dm, dm->tok_embd, V * D, seed ^ 1, 1.0f);
  fill_w(dm, dm->output, V * D, seed ^ 2, aD);
  fill_ones(dm, dm->out_norm, D);
  for (int l = 0; l < s->n_layers; ++l) {
    const llm_dev_layer *L = &dm->layers[l];
    const uint64_t ls = seed + 0x1000ull * (uint64_t)(l + 1);
    fill_ones(dm, L->attn_norm, D);
    fill_ones(dm, L->ffn_norm, D);
    fill_w(dm, L->wqkv, (D + 2 * KV) * D, ls + 1, aD);
    if (L->bqkv) fill_f32(dm, L->bqkv, D + 2 * KV, ls + 5, 0.1f);
    fill_w(dm, L->wo, D * D, ls + 2, aD);
    fill_w(dm, L->wgu, 2 * F * D, ls + 3, aD);
    fill_w(dm, L->wdown, D * F, ls + 4, aF);
  }
  return 0;
}

void llm_dev_model_free(llm_dev_model *dm) {
  if (dm->layers)
    for (int l = 0; l < dm->s.n_layers; ++l) {
      llm_dev_layer *L = &dm->layers[l];
      void *p[] = {L->attn_norm, L->ffn_norm, L->wqkv, L->bqkv, L->wo, L->wgu, L->wdown};
      for (int i = 0; i < 7; ++i) dev_free(dm, p[i]);
    }
  if (dm->output != dm->tok_embd) dev_free(dm, dm->output);
  dev_free(dm, dm->tok_embd);
  dev_free(dm, dm->out_norm);
  free(dm->layers);
  llm_blas_destroy(dm->blas);
  memset(dm, 0, sizeof *dm);
}

size_t llm_dev_memory(const llm_dev_model *dm, size_t *total) {
  if (!dm->on_gpu) {
    if (total) *total = 0;
    return 0;
  }
  return llm_blas_memory(total);
}

int llm_dev_batch_set_stream(llm_dev_batch *b, kivi_cache *cache, int on) {
  const llm_dev_model *dm = b->m;
  if (!on) {
    if (dm->blas) (void)llm_blas_set_stream(dm->blas, NULL);
    b->stream = NULL;
    return kivi_cache_set_stream(cache, NULL) == KIVI_OK ? 0 : -1;
  }
  if (!dm->on_gpu || !dm->blas) return -1;
  void *h = NULL;
  if (kivi_cache_get_stream(cache, &h) != KIVI_OK) return -1;
  const int made = !h; /* the library's own stream, set here: unset again on a failure */
  if (made && (kivi_cache_set_stream(cache, KIVI_STREAM_LIBRARY) != KIVI_OK || kivi_cache_get_stream(cache, &h) != KIVI_OK))
    return -1;
  if (llm_blas_set_stream(dm->blas, h)) {
    if (made && kivi_cache_set_stream(cache, NULL) != KIVI_OK) return -1; /* -1 whether or not the undo works */
    return -1;
  }
  b->stream = h;
  return 0;
}

const char *llm_dev_matmul_name(const llm_dev_model *dm) {
  if (dm->f32) return dm->blas ? "cuBLAS (fp32)" : dm->on_gpu ? "OpenMP target loop (fp32)" : "host OpenMP loop (fp32)";
  return dm->blas ? "cuBLAS" : dm->on_gpu ? "OpenMP target loop" : "host OpenMP loop";
}

/* ---- batch scratch ---------------------------------------------------------------------- */
/* the scratch of a batch: element counts of the fp32 buffers, of the products' inputs (el_size)
 * and of the int buffers, in struct order */
static void batch_sizes(const llm_dev_model *m, int max_rows, int max_seqs, int logit_rows, size_t f32s[9], size_t els[3],
                        size_t *ints) {
  const size_t R = (size_t)max_rows, S = (size_t)max_seqs, LR = (size_t)(logit_rows > max_seqs ? logit_rows : max_seqs), D = (size_t)m->s.dim, F = (size_t)m->s.ffn_dim,
               KV = (size_t)m->s.n_kv_heads * m->s.head_dim, V = (size_t)m->s.n_vocab;
  const size_t a[9] = {R * D, R * (D + 2 * KV), R * D, R * KV, R * KV, R * D, R * 2 * F, LR * V, R * (size_t)m->s.head_dim};
  const size_t b[3] = {R * D, R * D, R * F};
  memcpy(f32s, a, sizeof a);
  memcpy(els, b, sizeof b);
  *ints = 2 * R + 2 * S;
}

size_t llm_dev_batch_bytes(const llm_dev_model *m, int max_rows, int max_seqs, int logit_rows) {
  size_t f32s[9], els[3], ints, bytes = 0;
  batch_sizes(m, max_rows, max_seqs, logit_rows, f32s, els, &ints);
  for (int i = 0; i < 9; ++i) bytes += f32s[i] * sizeof(float);
  for (int i = 0; i < 3; ++i) bytes += els[i] * el_size(m);
  return bytes + ints * sizeof(int);
}

int llm_dev_batch_init(llm_dev_batch *b, const llm_dev_model *m, int max_rows, int max_seqs, int logit_rows) {
  memset(b, 0, sizeof *b);
  if (max_rows < 1 || max_seqs < 1) return -1;
  b->m = m;
  b->max_rows = max_rows;
  b->max_seqs = max_seqs;
  b->logit_rows = logit_rows > max_seqs ? logit_rows : max_seqs;
  size_t f32s[9], els[3], ints;
  batch_sizes(m, max_rows, max_seqs, logit_rows, f32s, els, &ints);
  float **f32p[] = {&b->x, &b->qkv, &b->q, &b->k, &b->v, &b->att32, &b->gu, &b->logits, &b->rope};
  void **elp[] = {&b->xn, &b->att, &b->h};
  int bad = 0;
  for (int i = 0; i < 9; ++i) bad |= !(*f32p[i] = dev_alloc(m, f32s[i] * sizeof(float)));
  for (int i = 0; i < 3; ++i) bad |= !(*elp[i] = dev_alloc(m, els[i] * el_size(m)));
  bad |= !(b->rows = dev_alloc(m, (ints - (size_t)max_seqs) * sizeof(int))) ||
         !(b->best = dev_alloc(m, (size_t)max_seqs * sizeof(int)));
  if (bad) {
    llm_dev_batch_free(b);
    return -1;
  }
  return 0;
}

void llm_dev_batch_free(llm_dev_batch *b) {
  if (!b->m) return;
  if (b->stream && b->m->blas) (void)llm_blas_set_stream(b->m->blas, NULL); /* the stream may go with its cache */
  void *p[] = {b->x, b->qkv, b->q, b->k, b->v, b->att32, b->gu, b->logits, b->rope, b->xn, b->att, b->h, b->rows, b->best};
  for (size_t i = 0; i < sizeof p / sizeof *p; ++i) dev_free(b->m, p[i]);
  memset(b, 0, sizeof *b);
}

/* ---- the kernels -------------------------------------------------------------------------- */
/* y[T][N] = x[T][K] w[N][K]^T (+ y when acc): fp16 (fp32) inputs, fp32 sums and output.  0 or -1. */
static int matmul(const llm_dev_model *dm, float *y, const void *x, const void *w, int T, int K, int N, int acc) {
  if (dm->blas) return llm_blas_gemm(dm->blas, y, x, w, T, K, N, acc, dm->f32);
  const int dev = dm->device, f32 = dm->f32;
#pragma omp target teams distribute parallel for collapse(2) device(dev) is_device_ptr(y, x, w)
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      const size_t xr = (size_t)t * K, wr = (size_t)n * K;
      float s = 0.0f;
      for (int k = 0; k < K; ++k) s += el_ld(x, xr + k, f32) * el_ld(w, wr + k, f32);
      float *yp = y + (size_t)t * N + n;
      *yp = acc ? *yp + s : s;
    }
  return 0;
}

/* matmul() one row at a time where `one_by_one`: each row's sums then run in the order a call
 * of that row alone takes (cuBLAS may choose another algorithm for other row counts) */
static int matmul_rows(const llm_dev_model *dm, int one_by_one, float *y, const void *x, const void *w, int T, int K,
                       int N, int acc) {
  if (!one_by_one || T == 1) return matmul(dm, y, x, w, T, K, N, acc);
  for (int t = 0; t < T; ++t)
    if (matmul(dm, y + (size_t)t * N, (const char *)x + (size_t)t * K * el_size(dm), w, 1, K, N, acc)) return -1;
  return 0;
}

/* xn[i] = x[row(i)] / rms * w (fp16, or fp32) for rows i < T; row(i) = sel ? sel[i] : i. */
static void rmsnorm(const llm_dev_model *dm, void *xn, const float *x, const float *w, const int *sel, int T) {
  const int dev = dm->device, D = dm->s.dim, f32 = dm->f32;
  const float eps = dm->s.rms_eps;
#pragma omp target teams distribute device(dev) is_device_ptr(xn, x, w, sel)
  for (int i = 0; i < T; ++i) {
    const float *xr = x + (size_t)(sel ? sel[i] : i) * D;
    float ss = 0.0f;
#pragma omp parallel for reduction(+ : ss)
    for (int c = 0; c < D; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / sqrtf(ss / (float)D + eps);
#pragma omp parallel for
    for (int c = 0; c < D; ++c) el_st(xn, (size_t)i * D + c, xr[c] * r * w[c], f32);
  }
}

/* x[r] = embedding of rows[2r] */
static void embed(const llm_dev_model *dm, float *x, const int *rows, int T) {
  const int dev = dm->device, D = dm->s.dim, f32 = dm->f32;
  const void *emb = dm->tok_embd;
#pragma omp target teams distribute parallel for collapse(2) device(dev) is_device_ptr(x, rows, emb)
  for (int r = 0; r < T; ++r)
    for (int c = 0; c < D; ++c) x[(size_t)r * D + c] = el_ld(emb, (size_t)rows[2 * r] * D + c, f32);
}

/* rope[r][i] = cos, sin of the angle pos(r) * base^(-2i/hd), i < hd/2, in double like the host
 * model; once per call, for every layer. */
static void rope_table(const llm_dev_model *dm, float *rope, const int *rows, int T) {
  const int dev = dm->device, hd = dm->s.head_dim;
  const double base = dm->s.rope_base;
#pragma omp target teams distribute parallel for collapse(2) device(dev) is_device_ptr(rope, rows)
  for (int r = 0; r < T; ++r)
    for (int i = 0; i < hd / 2; ++i) {
      const double ang = (double)rows[2 * r + 1] * pow(base, -2.0 * i / hd);
      rope[(size_t)r * hd + 2 * i] = (float)cos(ang);
      rope[(size_t)r * hd + 2 * i + 1] = (float)sin(ang);
    }
}

/* qkv[T][D + 2 KV] (+ bias[D + 2 KV] where not NULL) -> q[T][D], k, v[T][KV]; q and k rotated
 * by adjacent pairs (rope_table). */
static void rope_split(const llm_dev_model *dm, const float *qkv, const float *bias, float *q, float *k, float *v,
                       const float *rope, int T) {
  const int dev = dm->device, D = dm->s.dim, hd = dm->s.head_dim, KV = dm->s.n_kv_heads * hd, W = D + 2 * KV;
  const int hb = bias != NULL;
#pragma omp target teams distribute parallel for collapse(2) device(dev) is_device_ptr(qkv, bias, q, k, v, rope)
  for (int r = 0; r < T; ++r)
    for (int p = 0; p < W / 2; ++p) {
      const int c = 2 * p;
      const float a = qkv[(size_t)r * W + c] + (hb ? bias[c] : 0.0f), b = qkv[(size_t)r * W + c + 1] + (hb ? bias[c + 1] : 0.0f);
      if (c >= D + KV) {
        v[(size_t)r * KV + c - D - KV] = a;
        v[(size_t)r * KV + c - D - KV + 1] = b;
        continue;
      }
      const float cs = rope[(size_t)r * hd + c % hd], sn = rope[(size_t)r * hd + c % hd + 1];
      float *o = c < D ? q + (size_t)r * D + c : k + (size_t)r * KV + c - D;
      o[0] = a * cs - b * sn;
      o[1] = a * sn + b * cs;
    }
}

/* each of the nvec head vectors of x (hd floats) through the Walsh-Hadamard transform, in place
 * (model.h: the host model's rotation) */
static void hadamard_rows(const llm_dev_model *dm, float *x, size_t nvec, int hd) {
  const int dev = dm->device;
  const float norm = 1.0f / sqrtf((float)hd);
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(x)
  for (size_t v = 0; v < nvec; ++v) llm_hadamard_vec(x + v * hd, hd, norm);
}

static void silu_mul(const llm_dev_model *dm, void *h, const float *gu, int T) {
  const int dev = dm->device, F = dm->s.ffn_dim, f32 = dm->f32;
#pragma omp target teams distribute parallel for collapse(2) device(dev) is_device_ptr(h, gu)
  for (int r = 0; r < T; ++r)
    for (int c = 0; c < F; ++c) {
      const float g = gu[(size_t)r * 2 * F + c], u = gu[(size_t)r * 2 * F + F + c];
      el_st(h, (size_t)r * F + c, g / (1.0f + expf(-g)) * u, f32);
    }
}

/* y = x in the products' element type */
static void to_el(const llm_dev_model *dm, void *y, const float *x, size_t n) {
  const int dev = dm->device, f32 = dm->f32;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(y, x)
  for (size_t i = 0; i < n; ++i) el_st(y, i, x[i], f32);
}

/* best[i] = the first index of the largest of logits[i][0..V) */
static void argmax(const llm_dev_model *dm, int *best, const float *logits, int n) {
  const int dev = dm->device, V = dm->s.n_vocab;
#pragma omp target teams distribute device(dev) is_device_ptr(best, logits)
  for (int i = 0; i < n; ++i) {
    const float *l = logits + (size_t)i * V;
    float m = l[0];
#pragma omp parallel for reduction(max : m)
    for (int c = 0; c < V; ++c) m = l[c] > m ? l[c] : m;
    int at = V;
#pragma omp parallel for reduction(min : at)
    for (int c = 0; c < V; ++c)
      if (l[c] == m && c < at) at = c;
    best[i] = at;
  }
}

/* ---- the same kernels on a GPU, as CUDA-like `ompx_bare` regions ------------------------------
 * Without the OpenMP device runtime a kernel is a plain CUDA launch, which a cache's stream can
 * take (kivi_cache_stream_begin: the whole step enqueued, nothing waited for).  Element-wise
 * kernels take a thread per element; the row reductions (RMSNorm: a warp per row; the argmax: a
 * block of 1,024 threads per row) add in another order than the host loops, within fp32
 * rounding of them. */
#if KIVI_BUILT_WITH_OFFLOAD && defined(__clang__)
#include <ompx.h>
#define GPU_KERNELS 1
enum { GNT = 256, GMAX_NT = 1024 };
#pragma omp declare target
#if defined(__NVPTX__)
static inline float warp_bfly(float v, int o) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f); }
static inline int warp_bfly_i(int v, int o) { return __nvvm_shfl_sync_bfly_i32(0xffffffffu, v, o, 0x1f); }
#else /* the host pass of a device-only kernel: never runs */
static inline float warp_bfly(float v, int o) { (void)o; return v; }
static inline int warp_bfly_i(int v, int o) { (void)o; return v; }
#endif
/* the larger of two (value, index) candidates, the first index of equal values */
static inline void argmax_pair(float *m, int *at, float m2, int a2) {
  if (m2 > *m || (m2 == *m && a2 < *at)) *m = m2, *at = a2;
}
/* a warp's (value, index) candidates reduced to the largest, in every lane */
static inline void warp_argmax(float *m, int *at) {
  for (int o = 16; o; o >>= 1) argmax_pair(m, at, warp_bfly(*m, o), warp_bfly_i(*at, o));
}
#pragma omp end declare target
static int gblocks(size_t n, int nt) { return (int)((n + (size_t)nt - 1) / (size_t)nt); }
/* the element index of a thread of an element-wise kernel */
#define GIDX ((size_t)ompx_block_id_x() * GNT + (size_t)ompx_thread_id_x())

static void gpu_rmsnorm(const llm_dev_model *dm, void *xn, const float *x, const float *w, const int *sel, int T) {
  const int dev = dm->device, D = dm->s.dim, nb = gblocks((size_t)T, GNT / 32), f32 = dm->f32;
  const float eps = dm->s.rms_eps;
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(xn, x, w, sel) \
    firstprivate(D, T, eps, f32)
  {
    const int lane = ompx_thread_id_x() & 31, i = ompx_block_id_x() * (GNT / 32) + (ompx_thread_id_x() >> 5);
    if (i < T) {
      const float *xr = x + (size_t)(sel ? sel[i] : i) * D;
      float ss = 0.0f;
      for (int c = lane; c < D; c += 32) ss += xr[c] * xr[c];
      for (int o = 16; o; o >>= 1) ss += warp_bfly(ss, o);
      const float r = 1.0f / sqrtf(ss / (float)D + eps);
      for (int c = lane; c < D; c += 32) el_st(xn, (size_t)i * D + c, xr[c] * r * w[c], f32);
    }
  }
}

static void gpu_embed(const llm_dev_model *dm, float *x, const int *rows, int T) {
  const int dev = dm->device, D = dm->s.dim, f32 = dm->f32;
  const size_t n = (size_t)T * D;
  const int nb = gblocks(n, GNT);
  const void *emb = dm->tok_embd;
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(x, rows, emb) \
    firstprivate(D, n, f32)
  {
    const size_t e = GIDX;
    if (e < n) x[e] = el_ld(emb, (size_t)rows[2 * (e / D)] * D + e % D, f32);
  }
}

static void gpu_rope_table(const llm_dev_model *dm, float *rope, const int *rows, int T) {
  const int dev = dm->device, hd = dm->s.head_dim;
  const double base = dm->s.rope_base;
  const size_t n = (size_t)T * (hd / 2);
  const int nb = gblocks(n, GNT);
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(rope, rows) \
    firstprivate(hd, base, n)
  {
    const size_t e = GIDX;
    if (e < n) {
      const size_t r = e / (size_t)(hd / 2);
      const int i = (int)(e % (size_t)(hd / 2));
      const double ang = (double)rows[2 * r + 1] * pow(base, -2.0 * i / hd);
      rope[r * hd + 2 * i] = (float)cos(ang);
      rope[r * hd + 2 * i + 1] = (float)sin(ang);
    }
  }
}

static void gpu_rope_split(const llm_dev_model *dm, const float *qkv, const float *bias, float *q, float *k, float *v,
                           const float *rope, int T) {
  const int dev = dm->device, D = dm->s.dim, hd = dm->s.head_dim, KV = dm->s.n_kv_heads * hd, W = D + 2 * KV;
  const int hb = bias != NULL;
  const size_t n = (size_t)T * (W / 2);
  const int nb = gblocks(n, GNT);
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) \
    is_device_ptr(qkv, bias, q, k, v, rope) firstprivate(D, hd, KV, W, n, hb)
  {
    const size_t e = GIDX;
    if (e < n) {
      const size_t r = e / (size_t)(W / 2);
      const int c = 2 * (int)(e % (size_t)(W / 2));
      const float a = qkv[r * W + c] + (hb ? bias[c] : 0.0f), b = qkv[r * W + c + 1] + (hb ? bias[c + 1] : 0.0f);
      if (c >= D + KV) {
        v[r * KV + c - D - KV] = a;
        v[r * KV + c - D - KV + 1] = b;
      } else {
        const float cs = rope[r * hd + c % hd], sn = rope[r * hd + c % hd + 1];
        float *o = c < D ? q + r * D + c : k + r * KV + c - D;
        o[0] = a * cs - b * sn;
        o[1] = a * sn + b * cs;
      }
    }
  }
}

static void gpu_hadamard_rows(const llm_dev_model *dm, float *x, size_t nvec, int hd) {
  const int dev = dm->device, nb = gblocks(nvec, GNT);
  const float norm = 1.0f / sqrtf((float)hd);
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(x) \
    firstprivate(nvec, hd, norm)
  {
    const size_t v = GIDX;
    if (v < nvec) llm_hadamard_vec(x + v * hd, hd, norm);
  }
}

static void gpu_silu_mul(const llm_dev_model *dm, void *h, const float *gu, int T) {
  const int dev = dm->device, F = dm->s.ffn_dim, f32 = dm->f32;
  const size_t n = (size_t)T * F;
  const int nb = gblocks(n, GNT);
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(h, gu) \
    firstprivate(F, n, f32)
  {
    const size_t e = GIDX;
    if (e < n) {
      const size_t r = e / F, c = e % F;
      const float g = gu[r * 2 * F + c], u = gu[r * 2 * F + F + c];
      el_st(h, e, g / (1.0f + expf(-g)) * u, f32);
    }
  }
}

static void gpu_to_el(const llm_dev_model *dm, void *y, const float *x, size_t n) {
  const int dev = dm->device, nb = gblocks(n, GNT), f32 = dm->f32;
#pragma omp target teams ompx_bare num_teams(nb) thread_limit(GNT) device(dev) is_device_ptr(y, x) firstprivate(n, f32)
  {
    const size_t e = GIDX;
    if (e < n) el_st(y, e, x[e], f32);
  }
}

/* a block per row: each thread its strided share, then the warps, then the block (the largest
 * value, the first index of it) */
static void gpu_argmax(const llm_dev_model *dm, int *best, const float *logits, int n) {
  const int dev = dm->device, V = dm->s.n_vocab;
#pragma omp target teams ompx_bare num_teams(n) thread_limit(GMAX_NT) device(dev) is_device_ptr(best, logits) \
    firstprivate(V)
  {
    static float s_m[GMAX_NT / 32];
    static int s_i[GMAX_NT / 32];
#pragma omp allocate(s_m, s_i) allocator(omp_pteam_mem_alloc)
    const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5;
    const float *l = logits + (size_t)ompx_block_id_x() * V;
    float m = -INFINITY;
    int at = V;
    for (int c = tid; c < V; c += GMAX_NT)
      if (l[c] > m) m = l[c], at = c; /* strictly larger: the first of equals */
    warp_argmax(&m, &at);
    if (!lane) s_m[wid] = m, s_i[wid] = at;
    ompx_sync_block_acq_rel();
    if (!wid) {
      m = s_m[lane];
      at = s_i[lane];
      warp_argmax(&m, &at);
      if (!lane) best[ompx_block_id_x()] = at < V ? at : 0;
    }
  }
}
#else
#define GPU_KERNELS 0
#define GPU_STUB(...) (void)0
#define gpu_rmsnorm(...) GPU_STUB()
#define gpu_embed(...) GPU_STUB()
#define gpu_rope_table(...) GPU_STUB()
#define gpu_rope_split(...) GPU_STUB()
#define gpu_hadamard_rows(...) GPU_STUB()
#define gpu_silu_mul(...) GPU_STUB()
#define gpu_to_el(...) GPU_STUB()
#define gpu_argmax(...) GPU_STUB()
#endif
/* on a GPU the bare kernels, elsewhere the loops above */
#define ON_DEVICE(dm, name, ...) ((GPU_KERNELS && (dm)->on_gpu) ? gpu_##name(dm, __VA_ARGS__) : name(dm, __VA_ARGS__))

/* ---- the forward pass ----------------------------------------------------------------------- */
#define TIMED(slot, call)                                                                          \
  do {                                                                                             \
    const double t0_ = omp_get_wtime();                                                            \
    call;                                                                                          \
    tm.slot += omp_get_wtime() - t0_;                                                              \
  } while (0)
#define TRY(status_expr)                                                                           \
  do {                                                                                             \
    if ((st = (status_expr)) != KIVI_OK) goto done;                                                \
  } while (0)

/* the decode attention of a step into att (att32 with rotated values; fp32 for LLM_DEV_F32): all
 * sequences in one call, or, one_by_one, a call for each */
static kivi_status decode_seqs(llm_dev_batch *b, kivi_cache *cache, int l, int n_seqs, const int *seq_ids, int one_by_one,
                               float scale) {
  const llm_dev_model *dm = b->m;
  const int rot_v = (dm->rotate & LLM_ROTATE_V) != 0, D = dm->s.dim;
  kivi_status (*dec)(kivi_cache *, int, int, const int *, int, const float *, float, void *, kivi_dtype, kivi_mem) =
      b->stream ? kivi_attention_decode_async : kivi_attention_decode;
  char *out = rot_v ? (char *)b->att32 : (char *)b->att;
  const kivi_dtype ot = rot_v || dm->f32 ? KIVI_F32 : KIVI_F16;
  const size_t orow = (size_t)D * (ot == KIVI_F32 ? sizeof(float) : sizeof(f16));
  if (!one_by_one) return dec(cache, l, n_seqs, seq_ids, dm->s.n_heads, b->q, scale, out, ot, KIVI_MEM_DEVICE);
  kivi_status st = KIVI_OK;
  for (int i = 0; i < n_seqs && st == KIVI_OK; ++i)
    st = dec(cache, l, 1, seq_ids + i, dm->s.n_heads, b->q + (size_t)i * D, scale, out + i * orow, ot, KIVI_MEM_DEVICE);
  return st;
}

kivi_status llm_dev_forward(llm_dev_batch *b, kivi_cache *cache, int n_seqs, const int *seq_ids,
                            const int *n_new, const int *start_pos, const int *tokens, float *logits, int all_logits,
                            int *best, llm_dev_times *times) {
  if (!b || !b->m || !cache || n_seqs < 1 || n_seqs > b->max_seqs || !seq_ids || !n_new || !start_pos || !tokens)
    return KIVI_ERR_ARG;
  const llm_dev_model *dm = b->m;
  const llm_dev_shape *s = &dm->s;
  int T = 0, decode = 1;
  for (int i = 0; i < n_seqs; ++i) {
    if (n_new[i] < 1 || start_pos[i] < 0 || n_new[i] > b->max_rows - T) return KIVI_ERR_ARG;
    T += n_new[i];
    decode &= n_new[i] == 1;
  }
  if (all_logits && (logits == NULL || best != NULL || T > b->logit_rows)) return KIVI_ERR_ARG;
  int *rows = malloc((2 * (size_t)T + (size_t)n_seqs) * sizeof *rows);
  if (!rows) return KIVI_ERR_NOMEM;
  for (int i = 0, r = 0; i < n_seqs; ++i)
    for (int j = 0; j < n_new[i]; ++j, ++r) {
      if (tokens[r] < 0 || tokens[r] >= s->n_vocab) {
        free(rows);
        return KIVI_ERR_ARG;
      }
      rows[2 * r] = tokens[r];
      rows[2 * r + 1] = start_pos[i] + j;
      if (j == n_new[i] - 1) rows[2 * T + i] = r; /* each sequence's last row */
    }
  llm_dev_times tm = {0};
  kivi_status st = KIVI_OK;
  const int D = s->dim, F = s->ffn_dim, KV = s->n_kv_heads * s->head_dim, H = s->n_heads;
  const float scale = 1.0f / sqrtf((float)s->head_dim);
  const int rot = dm->rotate, rot_v = (rot & LLM_ROTATE_V) != 0, hd = s->head_dim;
  int rc = 0, scoped = 0;
  /* a batch-invariant decode step: products and attention one sequence at a time (model_dev.h) */
  const int inv = decode && b->invariant && n_seqs > 1;
  /* on a stream: every kernel of the call enqueued there (the cache's calls _async, the products
   * through cuBLAS on it, the regions above in the stream's scope), one wait at the end */
  const int on_stream = b->stream != NULL;
  if (on_stream) {
    void *cs = NULL;
    if (kivi_cache_get_stream(cache, &cs) != KIVI_OK || cs != b->stream) {
      free(rows);
      return KIVI_ERR_ARG;
    }
  }
  TIMED(other, rc = upload(dm, b->rows, rows, (2 * (size_t)T + (size_t)n_seqs) * sizeof *rows));
  if (rc) TRY(KIVI_ERR_DEVICE);
  if (on_stream) {
    TRY(kivi_cache_stream_begin(cache));
    scoped = 1;
  }
  TIMED(other, ON_DEVICE(dm, embed, b->x, b->rows, T); ON_DEVICE(dm, rope_table, b->rope, b->rows, T));
  for (int l = 0; l < s->n_layers; ++l) {
    const llm_dev_layer *L = &dm->layers[l];
    TIMED(other, ON_DEVICE(dm, rmsnorm, b->xn, b->x, L->attn_norm, NULL, T));
    TIMED(matmul, rc = matmul_rows(dm, inv, b->qkv, b->xn, L->wqkv, T, D, D + 2 * KV, 0));
    if (rc) TRY(KIVI_ERR_DEVICE);
    TIMED(other, ON_DEVICE(dm, rope_split, b->qkv, L->bqkv, b->q, b->k, b->v, b->rope, T));
    if (rot & LLM_ROTATE_K) TIMED(other, ON_DEVICE(dm, hadamard_rows, b->k, (size_t)T * s->n_kv_heads, hd);
                                  ON_DEVICE(dm, hadamard_rows, b->q, (size_t)T * H, hd));
    if (rot & LLM_ROTATE_V) TIMED(other, ON_DEVICE(dm, hadamard_rows, b->v, (size_t)T * s->n_kv_heads, hd));
    if (decode) {
      TIMED(append, st = (on_stream ? kivi_cache_append_async : kivi_cache_append)(cache, l, n_seqs, seq_ids, n_new, b->k,
                                                                                 b->v, KIVI_F32, KIVI_MEM_DEVICE));
      TRY(st);
      /* rotated values: the output in fp32, rotated back below, then to the products' type */
      TIMED(attention, st = decode_seqs(b, cache, l, n_seqs, seq_ids, inv, scale));
      TRY(st);
    } else {
      TIMED(attention, st = kivi_attention_extend(cache, l, n_seqs, seq_ids, n_new, H, b->q, b->k, b->v, scale,
                                                  b->att32, NULL, KIVI_MEM_DEVICE));
      TRY(st);
      TIMED(append, st = kivi_cache_append(cache, l, n_seqs, seq_ids, n_new, b->k, b->v, KIVI_F32, KIVI_MEM_DEVICE));
      TRY(st);
    }
    if (!decode || rot_v) {
      if (rot_v) TIMED(other, ON_DEVICE(dm, hadamard_rows, b->att32, (size_t)T * H, hd));
      TIMED(other, ON_DEVICE(dm, to_el, b->att, b->att32, (size_t)T * D));
    }
    TIMED(matmul, rc = matmul_rows(dm, inv, b->x, b->att, L->wo, T, D, D, 1));
    if (rc) TRY(KIVI_ERR_DEVICE);
    TIMED(other, ON_DEVICE(dm, rmsnorm, b->xn, b->x, L->ffn_norm, NULL, T));
    TIMED(matmul, rc = matmul_rows(dm, inv, b->gu, b->xn, L->wgu, T, D, 2 * F, 0));
    if (rc) TRY(KIVI_ERR_DEVICE);
    TIMED(other, ON_DEVICE(dm, silu_mul, b->h, b->gu, T));
    TIMED(matmul, rc = matmul_rows(dm, inv, b->x, b->h, L->wdown, T, F, D, 1));
    if (rc) TRY(KIVI_ERR_DEVICE);
  }
  const int nl = all_logits ? T : n_seqs; /* logit rows: every token, or each sequence's last */
  if (logits || best) {
    TIMED(other, ON_DEVICE(dm, rmsnorm, b->xn, b->x, dm->out_norm, all_logits ? NULL : b->rows + 2 * T, nl));
    TIMED(matmul, rc = matmul_rows(dm, inv, b->logits, b->xn, dm->output, nl, D, s->n_vocab, 0));
    if (rc) TRY(KIVI_ERR_DEVICE);
    if (best) TIMED(other, ON_DEVICE(dm, argmax, b->best, b->logits, n_seqs));
  }
  if (scoped) { /* the step's work, and the errors of its _async calls */
    scoped = 0;
    TIMED(other, st = kivi_cache_wait(cache); (void)kivi_cache_stream_end(cache));
    TRY(st);
  }
  if (logits || best) {
    if (best) {
      TIMED(other, rc = download(dm, best, b->best, (size_t)n_seqs * sizeof *best));
      if (rc) TRY(KIVI_ERR_DEVICE);
    }
    if (logits) {
      TIMED(other, rc = download(dm, logits, b->logits, (size_t)nl * s->n_vocab * sizeof *logits));
      if (rc) TRY(KIVI_ERR_DEVICE);
    }
  }
done:
  if (scoped) { /* an error part way: the work enqueued so far, then out of the scope */
    (void)kivi_cache_wait(cache);
    (void)kivi_cache_stream_end(cache);
  }
  free(rows);
  if (times) {
    times->matmul += tm.matmul;
    times->attention += tm.attention;
    times->append += tm.append;
    times->other += tm.other;
  }
  return st;
}
