/* Llama forward pass over a libkivi-omp cache: see model.h. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- dequantization (ggml block formats) ------------------------------------------------ */
static float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
  float v;
  if (exp == 0) v = ldexpf((float)man, -24);                  /* zero and subnormals */
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = ldexpf((float)(man | 1024), (int)exp - 25);
  uint32_t u;
  memcpy(&u, &v, 4);
  u |= sign;
  memcpy(&v, &u, 4);
  return v;
}

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* Q4_K: a super-block of 256 elements in 8 sub-blocks of 32: fp16 d and dmin, 12 bytes of 6-bit
 * sub-block scales sc and mins mn (sub-blocks 0-3: the low 6 bits of bytes j and j + 4; 4-7: a
 * nibble of byte j + 4 and the top 2 bits of bytes j - 4 and j), then 128 bytes of nibbles, each
 * 32 bytes holding sub-block 2i in the low and 2i + 1 in the high nibbles; x = d sc q - dmin mn. */
static void dequant_q4_k(const uint8_t *b, float *y) {
  const float d = f16_to_f32(le16(b)), dmin = f16_to_f32(le16(b + 2));
  const uint8_t *s = b + 4, *q = b + 16;
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    const int mn = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    const uint8_t *qj = q + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = d * sc * ((j & 1 ? qj[l] >> 4 : qj[l] & 15)) - dmin * mn;
  }
}

/* Q6_K: 256 elements in two halves of 128: 128 bytes ql (low nibbles), 64 bytes qh (2 high bits),
 * 16 int8 scales (one per 16 elements), fp16 d.  Element 32 k + l of half h (k = 0..3, l = 0..31):
 * low nibble of ql[64 h + l + 32 (k & 1)] (k < 2) or its high nibble (k >= 2), high bits
 * (qh[32 h + l] >> 2 k) & 3; x = d scale[8 h + 2 k + l / 16] (q - 32). */
static void dequant_q6_k(const uint8_t *b, float *y) {
  const uint8_t *ql = b, *qh = b + 128;
  const int8_t *sc = (const int8_t *)(b + 192);
  const float d = f16_to_f32(le16(b + 208));
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = ql[64 * h + l + 32 * (k & 1)], hi = (qh[32 * h + l] >> (2 * k)) & 3;
        const int q = ((k < 2 ? lo & 15 : lo >> 4) | hi << 4) - 32;
        y[128 * h + 32 * k + l] = d * sc[8 * h + 2 * k + l / 16] * q;
      }
}

int llm_dequantize(uint32_t type, const void *src, size_t n, float *dst) {
  const uint8_t *p = src;
  switch (type) {
  case GGML_F32: memcpy(dst, src, n * 4); return 0;
  case GGML_F16:
    for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(le16(p + 2 * i));
    return 0;
  case GGML_BF16:
    for (size_t i = 0; i < n; ++i) {
      const uint32_t u = (uint32_t)le16(p + 2 * i) << 16;
      memcpy(&dst[i], &u, 4);
    }
    return 0;
  case GGML_Q4_K: case GGML_Q6_K:
    if (n % 256) return -1;
    for (size_t b = 0; b < n / 256; ++b) {
      if (type == GGML_Q4_K) dequant_q4_k(p + 144 * b, dst + 256 * b);
      else dequant_q6_k(p + 210 * b, dst + 256 * b);
    }
    return 0;
  default: break;
  }
  if (n % 32) return -1;
  for (size_t b = 0; b < n / 32; ++b) {
    float *y = dst + 32 * b;
    switch (type) {
    case GGML_Q4_0: { /* fp16 d, 16 bytes: low nibbles are elements 0..15, high 16..31; (q - 8) d */
      const uint8_t *q = p + 18 * b;
      const float d = f16_to_f32(le16(q));
      for (int j = 0; j < 16; ++j) {
        y[j] = ((q[2 + j] & 15) - 8) * d;
        y[j + 16] = ((q[2 + j] >> 4) - 8) * d;
      }
      break;
    }
    case GGML_Q4_1: { /* fp16 d, fp16 m, 16 bytes; q d + m */
      const uint8_t *q = p + 20 * b;
      const float d = f16_to_f32(le16(q)), m = f16_to_f32(le16(q + 2));
      for (int j = 0; j < 16; ++j) {
        y[j] = (q[4 + j] & 15) * d + m;
        y[j + 16] = (q[4 + j] >> 4) * d + m;
      }
      break;
    }
    case GGML_Q5_0:   /* fp16 d, u32 high bits, 16 bytes; (q - 16) d */
    case GGML_Q5_1: { /* fp16 d, fp16 m, u32 high bits, 16 bytes; q d + m */
      const int has_m = type == GGML_Q5_1;
      const uint8_t *q = p + (has_m ? 24 : 22) * b;
      const float d = f16_to_f32(le16(q)), m = has_m ? f16_to_f32(le16(q + 2)) : 0.0f;
      const uint8_t *hb = q + (has_m ? 4 : 2), *qs = hb + 4;
      const uint32_t qh = (uint32_t)hb[0] | (uint32_t)hb[1] << 8 | (uint32_t)hb[2] << 16 | (uint32_t)hb[3] << 24;
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 15) | (int)((qh >> j) & 1) << 4;
        const int x1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = has_m ? x0 * d + m : (x0 - 16) * d;
        y[j + 16] = has_m ? x1 * d + m : (x1 - 16) * d;
      }
      break;
    }
    case GGML_Q8_0: { /* fp16 d, 32 int8; q d */
      const uint8_t *q = p + 34 * b;
      const float d = f16_to_f32(le16(q));
      for (int j = 0; j < 32; ++j) y[j] = (int8_t)q[2 + j] * d;
      break;
    }
    default: return -1;
    }
  }
  return 0;
}

/* ---- loading ---------------------------------------------------------------------------- */
static float *load_tensor(const gguf_file *f, const char *name, uint64_t d0, uint64_t d1, size_t *bytes, char *err,
                          size_t errlen) {
  const gguf_tensor *t = gguf_find_tensor(f, name);
  if (!t) {
    snprintf(err, errlen, "tensor %s is missing", name);
    return NULL;
  }
  if (t->dims[0] != d0 || t->dims[1] != d1 || t->dims[2] != 1 || t->dims[3] != 1) {
    snprintf(err, errlen, "tensor %s is %llux%llu, expected %llux%llu", name, (unsigned long long)t->dims[0],
             (unsigned long long)t->dims[1], (unsigned long long)d0, (unsigned long long)d1);
    return NULL;
  }
  float *out = malloc((size_t)(d0 * d1) * sizeof *out);
  if (!out) {
    snprintf(err, errlen, "out of memory for %s", name);
    return NULL;
  }
  if (llm_dequantize(t->type, t->data, (size_t)(d0 * d1), out)) {
    snprintf(err, errlen, "tensor %s: element type %u is not supported", name, t->type);
    free(out);
    return NULL;
  }
  *bytes += (size_t)(d0 * d1) * sizeof *out;
  return out;
}

void llm_model_free(llm_model *m) {
  if (!m) return;
  if (m->layers)
    for (int l = 0; l < m->n_layers; ++l) {
      llm_layer *L = &m->layers[l];
      float *w[] = {L->attn_norm, L->wq, L->wk, L->wv, L->wo, L->bq, L->bk, L->bv, L->ffn_norm, L->w_gate, L->w_up, L->w_down};
      for (int i = 0; i < 12; ++i) free(w[i]);
    }
  free(m->layers);
  if (m->output != m->tok_embd) free(m->output);
  free(m->tok_embd);
  free(m->out_norm);
  memset(m, 0, sizeof *m);
}

/* Rows [h hd, (h + 1) hd) of each of the n_heads heads of w ([n_heads hd][cols]) from NEOX order
 * to the llama order (model.h): row 2i <- i, 2i + 1 <- i + hd/2.  0, or -1 when out of memory. */
static int neox_to_pairs(float *w, int n_heads, int hd, size_t cols) {
  float *t = malloc((size_t)hd * cols * sizeof *t);
  if (!t) return -1;
  for (int h = 0; h < n_heads; ++h) {
    float *base = w + (size_t)h * hd * cols;
    memcpy(t, base, (size_t)hd * cols * sizeof *t);
    for (int i = 0; i < hd / 2; ++i) {
      memcpy(base + (size_t)(2 * i) * cols, t + (size_t)i * cols, cols * sizeof *t);
      memcpy(base + (size_t)(2 * i + 1) * cols, t + (size_t)(i + hd / 2) * cols, cols * sizeof *t);
    }
  }
  free(t);
  return 0;
}

int llm_model_load(const gguf_file *f, llm_model *m, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  const gguf_kv *arch = gguf_find_kv(f, "general.architecture");
  uint64_t an = 0;
  if (arch && arch->type == GGUF_STRING)
    for (int i = 7; i >= 0; --i) an = an << 8 | arch->val[i];
  if (!arch || arch->type != GGUF_STRING || an >= sizeof m->arch) {
    snprintf(err, errlen, "general.architecture is missing or too long");
    return -1;
  }
  memcpy(m->arch, arch->val + 8, an);
  m->arch[an] = 0;
  const int qwen2 = !strcmp(m->arch, "qwen2");
  if (!qwen2 && strcmp(m->arch, "llama")) {
    snprintf(err, errlen, "architecture \"%s\" is not supported (llama and qwen2 are)", m->arch);
    return -1;
  }
  const char *names[] = {"block_count", "attention.head_count", "attention.head_count_kv", "embedding_length",
                         "feed_forward_length", "context_length"};
  int64_t v[6];
  char key[64];
  for (int i = 0; i < 6; ++i) {
    snprintf(key, sizeof key, "%s.%s", m->arch, names[i]);
    if (!gguf_get_int(f, key, &v[i]) || v[i] < 1 || v[i] > (1 << 20)) {
      snprintf(err, errlen, "metadata %s is missing or out of range", key);
      return -1;
    }
  }
  m->n_layers = (int)v[0];
  m->n_heads = (int)v[1];
  m->n_kv_heads = (int)v[2];
  m->dim = (int)v[3];
  m->ffn_dim = (int)v[4];
  m->ctx_train = (int)v[5];
  double theta = 10000.0, eps = 1e-5;
  snprintf(key, sizeof key, "%s.rope.freq_base", m->arch);
  gguf_get_float(f, key, &theta);
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", m->arch);
  gguf_get_float(f, key, &eps);
  m->rope_base = (float)theta;
  m->rms_eps = (float)eps;
  if (m->dim % m->n_heads || m->n_heads % m->n_kv_heads) {
    snprintf(err, errlen, "embedding %d, heads %d, kv-heads %d are inconsistent", m->dim, m->n_heads, m->n_kv_heads);
    return -1;
  }
  m->head_dim = m->dim / m->n_heads;
  int64_t rot;
  snprintf(key, sizeof key, "%s.rope.dimension_count", m->arch);
  if (gguf_get_int(f, key, &rot) && rot != m->head_dim) {
    snprintf(err, errlen, "partial rotary embedding (%lld of %d channels) is not supported", (long long)rot, m->head_dim);
    return -1;
  }
  if (m->dim % 8 || m->ffn_dim % 8 || m->head_dim % 2) {
    snprintf(err, errlen, "embedding %d / ffn %d must be multiples of 8", m->dim, m->ffn_dim);
    return -1;
  }
  const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
  if (!emb || emb->dims[0] != (uint64_t)m->dim || emb->dims[1] < 1 || emb->dims[1] > (1u << 24)) {
    snprintf(err, errlen, "token_embd.weight is missing or not [%d][vocab]", m->dim);
    return -1;
  }
  m->n_vocab = (int)emb->dims[1];
  const uint64_t D = (uint64_t)m->dim, F = (uint64_t)m->ffn_dim, KV = (uint64_t)(m->n_kv_heads * m->head_dim);
  size_t bytes = 0;
  m->layers = calloc((size_t)m->n_layers, sizeof *m->layers);
  if (!m->layers) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  if (!(m->tok_embd = load_tensor(f, "token_embd.weight", D, (uint64_t)m->n_vocab, &bytes, err, errlen)) ||
      !(m->out_norm = load_tensor(f, "output_norm.weight", D, 1, &bytes, err, errlen)))
    goto fail;
  if (gguf_find_tensor(f, "output.weight")) {
    if (!(m->output = load_tensor(f, "output.weight", D, (uint64_t)m->n_vocab, &bytes, err, errlen))) goto fail;
  } else {
    m->output = m->tok_embd; /* tied embeddings */
  }
  for (int l = 0; l < m->n_layers; ++l) {
    llm_layer *L = &m->layers[l];
    char name[96];
#define LOAD(field, suffix, d0, d1)                                                                  \
  do {                                                                                               \
    snprintf(name, sizeof name, "blk.%d.%s.weight", l, suffix);                                      \
    if (!(L->field = load_tensor(f, name, d0, d1, &bytes, err, errlen))) goto fail;                  \
  } while (0)
    LOAD(attn_norm, "attn_norm", D, 1);
    LOAD(wq, "attn_q", D, D);
    LOAD(wk, "attn_k", D, KV);
    LOAD(wv, "attn_v", D, KV);
    LOAD(wo, "attn_output", D, D);
    LOAD(ffn_norm, "ffn_norm", D, 1);
    LOAD(w_gate, "ffn_gate", D, F);
    LOAD(w_up, "ffn_up", D, F);
    LOAD(w_down, "ffn_down", F, D);
#undef LOAD
    /* q, k, v biases: all three (qwen2 files have them) or none */
    const char *bn[3] = {"attn_q", "attn_k", "attn_v"};
    float **bp[3] = {&L->bq, &L->bk, &L->bv};
    int nb = 0;
    for (int i = 0; i < 3; ++i) {
      snprintf(name, sizeof name, "blk.%d.%s.bias", l, bn[i]);
      if (!gguf_find_tensor(f, name)) continue;
      if (!(*bp[i] = load_tensor(f, name, i ? KV : D, 1, &bytes, err, errlen))) goto fail;
      ++nb;
    }
    if (nb != 0 && nb != 3) {
      snprintf(err, errlen, "layer %d has %d of the 3 q/k/v biases", l, nb);
      goto fail;
    }
    if (qwen2 && (neox_to_pairs(L->wq, m->n_heads, m->head_dim, D) || neox_to_pairs(L->wk, m->n_kv_heads, m->head_dim, D) ||
                  (L->bq && (neox_to_pairs(L->bq, m->n_heads, m->head_dim, 1) ||
                             neox_to_pairs(L->bk, m->n_kv_heads, m->head_dim, 1))))) {
      snprintf(err, errlen, "out of memory");
      goto fail;
    }
  }
  m->weight_bytes = bytes;
  return 0;
fail:
  llm_model_free(m);
  return -1;
}

/* ---- matrix multiply -------------------------------------------------------------------- */
typedef float v8sf __attribute__((vector_size(32)));

/* macros, not functions: a vector argument or result would change the ABI between the generic
 * and the AVX2 build of the tile */
#define load8(p) __extension__({ v8sf v_; memcpy(&v_, (p), sizeof v_); v_; })
#define hsum8(v) (((v)[0] + (v)[4]) + ((v)[1] + (v)[5])) + (((v)[2] + (v)[6]) + ((v)[3] + (v)[7]))

/* y[t][n] for 4 rows of w (n0..n0+3, fewer at the edge) and 4 tokens (t0..t0+3, fewer). */
#define MATMUL_TILE_BODY                                                                             \
  const float *wr[4], *xr[4];                                                                        \
  for (int i = 0; i < 4; ++i) {                                                                      \
    wr[i] = w + (size_t)(n0 + (i < nn ? i : 0)) * K;                                                 \
    xr[i] = x + (size_t)(t0 + (i < nt ? i : 0)) * K;                                                 \
  }                                                                                                  \
  v8sf acc[4][4];                                                                                    \
  memset(acc, 0, sizeof acc);                                                                        \
  for (int k = 0; k < K; k += 8) {                                                                   \
    const v8sf w0 = load8(wr[0] + k), w1 = load8(wr[1] + k), w2 = load8(wr[2] + k), w3 = load8(wr[3] + k); \
    for (int t = 0; t < 4; ++t) {                                                                    \
      const v8sf xv = load8(xr[t] + k);                                                              \
      acc[t][0] += w0 * xv;                                                                          \
      acc[t][1] += w1 * xv;                                                                          \
      acc[t][2] += w2 * xv;                                                                          \
      acc[t][3] += w3 * xv;                                                                          \
    }                                                                                                \
  }                                                                                                  \
  for (int t = 0; t < nt; ++t)                                                                       \
    for (int i = 0; i < nn; ++i) {                                                                   \
      float *yp = y + (size_t)(t0 + t) * N + n0 + i;                                                 \
      *yp = (accumulate ? *yp : 0.0f) + hsum8(acc[t][i]);                                            \
    }

static void tile_generic(float *y, const float *x, const float *w, int K, int N, int n0, int nn, int t0, int nt,
                         int accumulate) {
  MATMUL_TILE_BODY
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) static void tile_avx2(float *y, const float *x, const float *w, int K, int N,
                                                          int n0, int nn, int t0, int nt, int accumulate) {
  MATMUL_TILE_BODY
}
#endif

void llm_matmul(float *y, const float *x, const float *w, int T, int K, int N, int accumulate) {
  void (*tile)(float *, const float *, const float *, int, int, int, int, int, int, int) = tile_generic;
#if defined(__x86_64__) && defined(__GNUC__)
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) tile = tile_avx2;
#endif
  const int nblk = (N + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int b = 0; b < nblk; ++b) {
    const int n0 = 4 * b, nn = N - n0 < 4 ? N - n0 : 4;
    for (int t0 = 0; t0 < T; t0 += 4) tile(y, x, w, K, N, n0, nn, t0, T - t0 < 4 ? T - t0 : 4, accumulate);
  }
}

/* ---- session ---------------------------------------------------------------------------- */
int llm_session_init(llm_session *s, const llm_model *m, kivi_cache *cache, int seq_id, int max_chunk,
                     const llm_fake_quant *fq) {
  memset(s, 0, sizeof *s);
  s->m = m;
  s->cache = cache;
  s->seq_id = seq_id;
  s->max_chunk = max_chunk;
  if (fq) s->fq = *fq;
  const size_t T = (size_t)max_chunk, D = (size_t)m->dim, F = (size_t)m->ffn_dim,
               KV = (size_t)(m->n_kv_heads * m->head_dim);
  s->x = malloc(T * D * sizeof(float));
  s->xn = malloc(T * D * sizeof(float));
  s->q = malloc(T * D * sizeof(float));
  s->att = malloc(T * D * sizeof(float));
  s->k = malloc(T * KV * sizeof(float));
  s->v = malloc(T * KV * sizeof(float));
  s->gate = malloc(T * F * sizeof(float));
  s->up = malloc(T * F * sizeof(float));
  s->rope_cos = malloc(T * (size_t)m->head_dim / 2 * sizeof(float));
  s->rope_sin = malloc(T * (size_t)m->head_dim / 2 * sizeof(float));
  if (!s->x || !s->xn || !s->q || !s->att || !s->k || !s->v || !s->gate || !s->up || !s->rope_cos || !s->rope_sin) {
    llm_session_free(s);
    return -1;
  }
  return 0;
}

void llm_session_free(llm_session *s) {
  float *p[] = {s->x, s->xn, s->q, s->att, s->k, s->v, s->gate, s->up, s->rope_cos, s->rope_sin};
  for (int i = 0; i < 10; ++i) free(p[i]);
  memset(s, 0, sizeof *s);
}

kivi_status llm_session_reset(llm_session *s) {
  s->pos = 0;
  const kivi_status st = kivi_cache_reset_seq(s->cache, s->seq_id);
  return st || !s->edge ? st : kivi_cache_reset_seq(s->edge, s->seq_id);
}

kivi_cache *llm_layer_cache(const llm_session *s, int l, int *cache_layer) {
  const int NL = s->m->n_layers, E = s->edge ? s->n_edge : 0;
  if (l < E) {
    *cache_layer = l;
    return s->edge;
  }
  if (l >= NL - E) {
    *cache_layer = l - (NL - E) + E;
    return s->edge;
  }
  *cache_layer = l;
  return s->cache;
}

static void rmsnorm(float *y, const float *x, const float *w, int T, int D, float eps) {
  for (int t = 0; t < T; ++t) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += (double)x[(size_t)t * D + i] * x[(size_t)t * D + i];
    const float r = (float)(1.0 / sqrt(ss / D + eps));
    for (int i = 0; i < D; ++i) y[(size_t)t * D + i] = x[(size_t)t * D + i] * r * w[i];
  }
}

/* Rotates adjacent pairs (2i, 2i+1) of every head by pos * base^(-2i/head_dim). */
static void rope(float *x, int T, int n_heads, int hd, const float *cs, const float *sn) {
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      float *p = x + ((size_t)t * n_heads + h) * hd;
      for (int i = 0; i < hd / 2; ++i) {
        const float c = cs[t * hd / 2 + i], s = sn[t * hd / 2 + i], a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c - b * s;
        p[2 * i + 1] = a * s + b * c;
      }
    }
}

static void quant_group(float *const *el, int n, int bits) { /* min/max asymmetric, in place */
  float lo = *el[0], hi = *el[0];
  for (int i = 1; i < n; ++i) {
    lo = fminf(lo, *el[i]);
    hi = fmaxf(hi, *el[i]);
  }
  const float qmax = (float)((1 << bits) - 1), scale = (hi - lo) / qmax;
  for (int i = 0; i < n; ++i) {
    const float c = scale > 0 ? fminf(fmaxf(floorf((*el[i] - lo) / scale + 0.5f), 0.0f), qmax) : 0.0f;
    *el[i] = c * scale + lo;
  }
}

/* x: [T][n_kv_heads * hd] at positions pos..pos+T-1. */
/* The orthonormal Walsh-Hadamard transform of each of the `nvec` vectors of length hd (a power
 * of two) in x: its own inverse. */
static void hadamard(float *x, size_t nvec, int hd) {
  const float norm = 1.0f / sqrtf((float)hd);
  for (size_t v = 0; v < nvec; ++v) llm_hadamard_vec(x + v * hd, hd, norm);
}

/* Tokens at positions below `sink` are left as they are (and out of their groups' statistics). */
static void fake_quant(float *x, int T, int pos, int KVD, int G, int bits, int per_token, int sink) {
  float *el[128];
  const int skip = sink - pos > 0 ? (sink - pos < T ? sink - pos : T) : 0; /* leading sink tokens */
  if (per_token) {
    for (int t = skip; t < T; ++t)
      for (int c0 = 0; c0 < KVD; c0 += G) {
        for (int i = 0; i < G; ++i) el[i] = &x[(size_t)t * KVD + c0 + i];
        quant_group(el, G, bits);
      }
    return;
  }
  for (int t0 = skip; t0 < T;) { /* token groups aligned to absolute positions */
    const int end = (pos + t0) / G * G + G - pos, t1 = end < T ? end : T;
    for (int c = 0; c < KVD; ++c) {
      for (int t = t0; t < t1; ++t) el[t - t0] = &x[(size_t)t * KVD + c];
      quant_group(el, t1 - t0, bits);
    }
    t0 = t1;
  }
}

kivi_status llm_forward(llm_session *s, const int *tokens, int n, float *logits, int all_logits) {
  const llm_model *m = s->m;
  if (n < 1 || n > s->max_chunk) return KIVI_ERR_ARG;
  const int D = m->dim, H = m->n_heads, KVH = m->n_kv_heads, hd = m->head_dim, KVD = KVH * hd, F = m->ffn_dim;
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= m->n_vocab) return KIVI_ERR_ARG;
    memcpy(s->x + (size_t)t * D, m->tok_embd + (size_t)tokens[t] * D, (size_t)D * sizeof(float));
    for (int i = 0; i < hd / 2; ++i) {
      const double a = (double)(s->pos + t) * pow((double)m->rope_base, -2.0 * i / hd);
      s->rope_cos[t * hd / 2 + i] = (float)cos(a);
      s->rope_sin[t * hd / 2 + i] = (float)sin(a);
    }
  }
  const float scale = 1.0f / sqrtf((float)hd);
  const int seq = s->seq_id;
  kivi_status st = KIVI_OK;
  for (int l = 0; l < m->n_layers; ++l) {
    const llm_layer *L = &m->layers[l];
    rmsnorm(s->xn, s->x, L->attn_norm, n, D, m->rms_eps);
    llm_matmul(s->q, s->xn, L->wq, n, D, D, 0);
    llm_matmul(s->k, s->xn, L->wk, n, D, KVD, 0);
    llm_matmul(s->v, s->xn, L->wv, n, D, KVD, 0);
    if (L->bq)
      for (int t = 0; t < n; ++t) {
        for (int i = 0; i < D; ++i) s->q[(size_t)t * D + i] += L->bq[i];
        for (int i = 0; i < KVD; ++i) {
          s->k[(size_t)t * KVD + i] += L->bk[i];
          s->v[(size_t)t * KVD + i] += L->bv[i];
        }
      }
    rope(s->q, n, H, hd, s->rope_cos, s->rope_sin);
    if (s->fq.enabled && s->fq.pre_rope) /* quantized as the projection gives them, rotated after */
      fake_quant(s->k, n, s->pos, KVD, s->fq.group, s->fq.k_bits, s->fq.k_per_token, s->fq.sink);
    rope(s->k, n, KVH, hd, s->rope_cos, s->rope_sin);
    /* rotated before any quantization (the cache's, or the simulated one) */
    if (s->fq.rotate & LLM_ROTATE_K) {
      hadamard(s->k, (size_t)n * KVH, hd);
      hadamard(s->q, (size_t)n * H, hd);
    }
    if (s->fq.rotate & LLM_ROTATE_V) hadamard(s->v, (size_t)n * KVH, hd);
    if (s->fq.enabled) {
      if (!s->fq.pre_rope) fake_quant(s->k, n, s->pos, KVD, s->fq.group, s->fq.k_bits, s->fq.k_per_token, s->fq.sink);
      fake_quant(s->v, n, s->pos, KVD, s->fq.group, s->fq.v_bits, !s->fq.v_per_channel, s->fq.sink);
    }
    int cl;
    kivi_cache *c = llm_layer_cache(s, l, &cl);
    if (n == 1) { /* decode: the token's own K/V go into the cache first */
      if ((st = kivi_cache_append(c, cl, 1, &seq, &n, s->k, s->v, KIVI_F32, KIVI_MEM_HOST))) return st;
      if ((st = kivi_attention_decode(c, cl, 1, &seq, H, s->q, scale, s->att, KIVI_F32, KIVI_MEM_HOST))) return st;
    } else { /* chunk: attend to the cache and causally to the chunk, then append it */
      if ((st = kivi_attention_extend(c, cl, 1, &seq, &n, H, s->q, s->k, s->v, scale, s->att, NULL, KIVI_MEM_HOST)))
        return st;
      if ((st = kivi_cache_append(c, cl, 1, &seq, &n, s->k, s->v, KIVI_F32, KIVI_MEM_HOST))) return st;
    }
    if (s->fq.rotate & LLM_ROTATE_V) hadamard(s->att, (size_t)n * H, hd); /* back */
    llm_matmul(s->x, s->att, L->wo, n, D, D, 1);
    rmsnorm(s->xn, s->x, L->ffn_norm, n, D, m->rms_eps);
    llm_matmul(s->gate, s->xn, L->w_gate, n, D, F, 0);
    llm_matmul(s->up, s->xn, L->w_up, n, D, F, 0);
    for (size_t i = 0; i < (size_t)n * F; ++i) {
      const float g = s->gate[i];
      s->gate[i] = g / (1.0f + expf(-g)) * s->up[i];
    }
    llm_matmul(s->x, s->gate, L->w_down, n, F, D, 1);
  }
  s->pos += n;
  if (!logits) return KIVI_OK;
  const int first = all_logits ? 0 : n - 1;
  rmsnorm(s->xn, s->x + (size_t)first * D, m->out_norm, n - first, D, m->rms_eps);
  llm_matmul(logits, s->xn, m->output, n - first, D, m->n_vocab, 0);
  return KIVI_OK;
}
