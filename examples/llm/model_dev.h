/* A Llama- or Qwen2-architecture model (model.h) run on the KV cache's device: on a GPU, the whole forward pass there
 * (weights resident in fp16, the matrix products through cuBLAS on the tensor cores, everything
 * else as OpenMP target regions); on the host (a host context, or a build without offload) the
 * same regions on host threads and the matrix products as a plain OpenMP loop.  With
 * LLM_DEV_F32 the weights and the products' inputs stay fp32 (cuBLAS in plain fp32, no TF32):
 * the host model's arithmetic, for checking a device against it.
 *
 * A batch of sequences per call: one token each (decode: kivi_cache_append + kivi_attention_decode
 * for all of them at once) or chunks of prompts (kivi_attention_extend, then the append).  The
 * activations between the products: the residual stream in fp32, the inputs of the products in
 * fp16 (what a fp16 inference engine does; fp32 with LLM_DEV_F32), products accumulated in fp32.
 *
 * It computes what llm_forward() (model.c) computes, with the weights rounded to fp16 (LLM_DEV_F16)
 * or as they are (LLM_DEV_F32); the tests compare the two. */
#ifndef KIVI_EXAMPLES_MODEL_DEV_H
#define KIVI_EXAMPLES_MODEL_DEV_H

#include <stddef.h>
#include <stdint.h>

#include <kivi.h>

#include "model.h"

typedef struct llm_dev_shape {
  int n_layers, n_heads, n_kv_heads, head_dim, dim, ffn_dim, n_vocab;
  float rope_base, rms_eps;
  int qkv_bias; /* 1: q, k and v biases (qwen2) */
} llm_dev_shape;

/* The element type of the weights and of the products' inputs. */
typedef enum llm_dev_precision { LLM_DEV_F16 = 0, LLM_DEV_F32 = 1 } llm_dev_precision;

/* The weight matrices hold _Float16 (LLM_DEV_F16) or float (LLM_DEV_F32) elements. */
typedef struct llm_dev_layer {
  float *attn_norm, *ffn_norm; /* [dim] */
  void *wqkv;                  /* [dim + 2 kv_dim][dim]: q, k, v rows */
  float *bqkv;                 /* [dim + 2 kv_dim]: their biases (shape.qkv_bias), else NULL */
  void *wo;                    /* [dim][dim] */
  void *wgu;                   /* [2 ffn_dim][dim]: gate rows, then up rows */
  void *wdown;                 /* [dim][ffn_dim] */
} llm_dev_layer;

typedef struct llm_dev_model {
  llm_dev_shape s;
  int device;  /* OpenMP device number of the weights (omp_get_initial_device(): the host) */
  int on_gpu;  /* 1 when `device` is not the host */
  struct llm_blas *blas; /* model_blas.h: the products through cuBLAS; NULL: a target loop */
  int f32;            /* 1: LLM_DEV_F32 (weights, tok_embd, output and the batch's xn, att, h in fp32) */
  void *tok_embd;     /* [n_vocab][dim] */
  void *output;       /* [n_vocab][dim]; == tok_embd when tied */
  float *out_norm;    /* [dim] */
  llm_dev_layer *layers;
  size_t weight_bytes;
  int rotate; /* 0 after creation; LLM_ROTATE_K and/or LLM_ROTATE_V (model.h): each K (and q) and/or
                 V head vector through the orthonormal Walsh-Hadamard transform before it reaches
                 the cache, the attention output back, as model.c's llm_fake_quant.rotate does
                 (head_dim a power of two) */
} llm_dev_model;

/* Where the step's time went (host wall seconds; each part waits for its device work). */
typedef struct llm_dev_times {
  double matmul, attention, append, other;
} llm_dev_times;

/* One batch's scratch on the device: up to max_rows tokens per call, max_seqs sequences, the
 * logits of up to logit_rows tokens (at least max_seqs). */
typedef struct llm_dev_batch {
  const llm_dev_model *m;
  int max_rows, max_seqs, logit_rows;
  float *x, *qkv, *q, *k, *v, *att32, *gu, *logits, *rope;
  void *xn, *att, *h; /* the products' inputs: fp16, or fp32 with LLM_DEV_F32 */
  int *rows; /* [2 max_rows]: token, position */
  int *best; /* [max_seqs] argmax of each row's logits */
  void *stream; /* llm_dev_batch_set_stream: the CUDA stream every forward call enqueues on */
  int invariant; /* 0 after init; 1: a decode step of several sequences runs each one's matrix
                    products (one row each) and attention (one sequence each) as a step of that
                    sequence alone does, so its logits are those of batch 1 bit for bit (more
                    calls: slower) */
} llm_dev_batch;

/* `device`: an OpenMP device number (omp_get_initial_device() for the host).  0, or -1 with a
 * message in err. */
int llm_dev_model_from_host(llm_dev_model *dm, const llm_model *m, int device, llm_dev_precision precision, char *err,
                            size_t errlen);
/* Random weights of a shape, made on the device (uniform, scaled by 1/sqrt(fan-in); norms 1):
 * what a throughput benchmark needs without a 13 GB file. */
int llm_dev_model_synthetic(llm_dev_model *dm, const llm_dev_shape *s, uint64_t seed, int device,
                            llm_dev_precision precision, char *err, size_t errlen);
void llm_dev_model_free(llm_dev_model *dm);

/* 0, or -1 when out of (device) memory. */
int llm_dev_batch_init(llm_dev_batch *b, const llm_dev_model *m, int max_rows, int max_seqs, int logit_rows);
/* The device bytes llm_dev_batch_init() allocates. */
size_t llm_dev_batch_bytes(const llm_dev_model *m, int max_rows, int max_seqs, int logit_rows);
void llm_dev_batch_free(llm_dev_batch *b);

/* Runs n_new[i] tokens of sequence seq_ids[i] (positions start_pos[i]..), all sequences at once;
 * tokens: [sum n_new] host array, sequences in order.  Every n_new[i] = 1: a decode step
 * (append, then decode); otherwise a chunk (extend, then append).  Sum n_new <= max_rows,
 * n_seqs <= max_seqs.
 * Outputs (host; each may be NULL): logits [n_seqs][n_vocab] of each sequence's last token, or
 * with all_logits [sum n_new][n_vocab] of every token (then best must be NULL and sum n_new <=
 * logit_rows); best [n_seqs] the index of each sequence's largest logit.  times: added to.
 * KIVI_ERR_ARG for bad arguments (nothing run); another status from the cache, or
 * KIVI_ERR_DEVICE, stops the call part way: the sequences' cache contents are then undefined
 * (reset them). */
kivi_status llm_dev_forward(llm_dev_batch *b, kivi_cache *cache, int n_seqs, const int *seq_ids,
                            const int *n_new, const int *start_pos, const int *tokens, float *logits, int all_logits,
                            int *best, llm_dev_times *times);

/* The whole forward pass on one CUDA stream (on 1): the cache's stream (a stream of the
 * library's own is set on it if it has none), the products there through cuBLAS, the model's
 * kernels there too (kivi_cache_stream_begin; the program must be linked with the library's
 * stream_regions_ldflags), one wait per forward call.  on 0: back to synchronous calls, the
 * cache's stream unset.  Later forward calls must pass this cache.  0, or -1 where there is no
 * stream to use (a host model, no cuBLAS, a cache without the CUDA driver); nothing changes then.
 * The model's cuBLAS handle follows the last call: one streamed batch at a time per model. */
int llm_dev_batch_set_stream(llm_dev_batch *b, kivi_cache *cache, int on);

/* Bytes of device memory in use (cudaMemGetInfo: total - free), and in *total (may be NULL) the
 * device's size; both 0 where not known (the host, a build without the CUDA runtime). */
size_t llm_dev_memory(const llm_dev_model *dm, size_t *total);
/* "cuBLAS", "OpenMP target loop" or "host OpenMP loop": what runs the products (fp16 inputs),
 * the same followed by " (fp32)" with LLM_DEV_F32. */
const char *llm_dev_matmul_name(const llm_dev_model *dm);

#endif
