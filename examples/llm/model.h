/* A Llama- or Qwen2-architecture model (SmolLM2, Qwen2.5 and friends) read from GGUF, run on the
 * host with OpenMP threads, its KV cache and attention in libkivi-omp (on the GPU when the
 * library offloads).
 *
 * Weights of any type the reader knows are dequantized to fp32 at load (llm_dequantize).  The
 * forward pass per layer: RMSNorm, Q/K/V projections (plus their biases where the file has them:
 * qwen2), RoPE, attention through the cache (kivi_attention_extend for a chunk of tokens,
 * kivi_cache_append + kivi_attention_decode for one), output projection, RMSNorm, SwiGLU MLP;
 * final RMSNorm and the output matrix (the token embedding when the file has no output.weight).
 * Metadata is read under the architecture's name (`llama.*`, `qwen2.*`).
 *
 * RoPE: llama GGUF files store q and k rows permuted for GGML's "normal" rotation of adjacent
 * channel pairs (2i, 2i+1); qwen2 files keep the original order, rotated in "NEOX" pairs (i, i +
 * head_dim/2).  The loader puts a qwen2 file's q and k rows (and biases) of every head in the
 * llama order (row 2i <- i, 2i+1 <- i + head_dim/2), after which one rotation serves both: the
 * scores q.k are unchanged (the same permutation of both), and the cache holds the keys' channels
 * in that order (per-channel key groups are indifferent to it; llm_fake_quant's per-token key
 * groups of 32 channels then mix the two halves). */
#ifndef KIVI_EXAMPLES_MODEL_H
#define KIVI_EXAMPLES_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include <kivi.h>

#include "gguf.h"

/* fp32 values of n elements of a tensor of ggml type `type` (f32, f16, bf16, q4_0, q4_1, q5_0,
 * q5_1, q8_0, q4_K, q6_K); n must be a multiple of the type's block size.  0, or -1 for another
 * type. */
int llm_dequantize(uint32_t type, const void *src, size_t n, float *dst);

typedef struct llm_layer {
  float *attn_norm, *wq, *wk, *wv, *wo;
  float *bq, *bk, *bv; /* q, k, v biases; NULL where the file has none (llama) */
  float *ffn_norm, *w_gate, *w_up, *w_down;
} llm_layer;

typedef struct llm_model {
  char arch[16]; /* general.architecture: "llama" or "qwen2" */
  int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn_dim, n_vocab, ctx_train;
  float rope_base, rms_eps;
  float *tok_embd; /* [n_vocab][dim] */
  float *out_norm; /* [dim] */
  float *output;   /* [n_vocab][dim]; == tok_embd when tied */
  llm_layer *layers;
  size_t weight_bytes; /* fp32 bytes held */
} llm_model;

/* 0 on success; otherwise -1 and a message in err. */
int llm_model_load(const gguf_file *f, llm_model *m, char *err, size_t errlen);
void llm_model_free(llm_model *m);

/* Simulated ("fake") quantization of every K/V vector before it is used, the paper's baseline
 * and its Table-1 axis study: no fp16 window, each axis chosen freely.  Groups of `group`
 * elements: per channel = `group` consecutive tokens of one channel (aligned to positions that
 * are multiples of `group`; a chunk that ends inside a group quantizes that part alone), per
 * token = `group` consecutive channels of one token.  min/max asymmetric, fp32 arithmetic. */
typedef struct llm_fake_quant {
  int enabled;
  int k_bits, v_bits, group;
  int k_per_token;   /* 0: keys per channel (KIVI) */
  int v_per_channel; /* 0: values per token (KIVI) */
  int sink;          /* the first `sink` positions of a sequence stay unquantized (attention sinks) */
  int pre_rope;      /* 1: keys quantized before the rotary embedding, which then rotates the
                        dequantized keys (KVQuant's pre-RoPE keys) */
  int rotate;        /* also without `enabled` (the real cache): LLM_ROTATE_V and/or _K, an
                        orthonormal Walsh-Hadamard transform of each head vector before it is
                        cached (QuaRot-style, tuning-free; head_dim a power of two).  Rotated
                        keys: q is rotated alike (scores unchanged); rotated values: the
                        attention output is rotated back (the transform is its own inverse). */
} llm_fake_quant;
enum { LLM_ROTATE_V = 1, LLM_ROTATE_K = 2 };

/* One head vector y of hd floats (a power of two) through the orthonormal Walsh-Hadamard
 * transform, in place (norm = 1 / sqrt(hd)): the rotation of llm_fake_quant.rotate, the same
 * butterfly order in the host model and in the device model's target region. */
static inline void llm_hadamard_vec(float *y, int hd, float norm) {
  for (int h = 1; h < hd; h *= 2)
    for (int i = 0; i < hd; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = y[j], b = y[j + h];
        y[j] = a + b;
        y[j + h] = a - b;
      }
  for (int i = 0; i < hd; ++i) y[i] *= norm;
}

/* One sequence being run: the model, its cache (one sequence slot is used) and scratch. */
typedef struct llm_session {
  const llm_model *m;
  kivi_cache *cache;
  /* per-layer widths: the first and the last n_edge layers live in `edge` (2 n_edge layers, its
   * own bits), the others in `cache`; n_edge = 0: every layer in `cache` */
  kivi_cache *edge;
  int n_edge;
  int seq_id;
  int pos; /* tokens already in the cache */
  int max_chunk;
  llm_fake_quant fq;
  float *x, *xn, *q, *k, *v, *att, *gate, *up, *rope_cos, *rope_sin;
} llm_session;

/* 0, or -1 when out of memory. */
int llm_session_init(llm_session *s, const llm_model *m, kivi_cache *cache, int seq_id, int max_chunk,
                     const llm_fake_quant *fq);
void llm_session_free(llm_session *s);
/* The cache and the cache's layer of model layer l. */
kivi_cache *llm_layer_cache(const llm_session *s, int l, int *cache_layer);
/* Empties the sequence (kivi_cache_reset_seq) and restarts at position 0. */
kivi_status llm_session_reset(llm_session *s);

/* Runs tokens[0..n) (1 <= n <= max_chunk) at positions pos..pos+n-1 and appends their K/V.
 * logits: NULL; or [n][n_vocab] when all_logits; or [n_vocab] for the last token. */
kivi_status llm_forward(llm_session *s, const int *tokens, int n, float *logits, int all_logits);

/* y[T][N] = x[T][K] * w[N][K]^T (+ y when accumulate), OpenMP threads; K a multiple of 8. */
void llm_matmul(float *y, const float *x, const float *w, int T, int K, int N, int accumulate);

#endif
