/* The plan of an attention call: which kernels run, in how many splits, and every tuning
 * constant and eligibility rule they depend on.  kivi_plan_call is the one function that picks
 * the kernels of a call (attention.c runs what it returns); the kivi_gpu_*_eligible functions
 * answer whether a cache's geometry has a GPU kernel at all.  Figures in the comments are the
 * measurements that chose each constant (docs/PERFORMANCE.md). */
#ifndef KIVI_PLAN_H
#define KIVI_PLAN_H

#include "internal.h"

/* ---- the portable kernel (attention.c, portable_team) */
/* Team-shared capacities (floats).  Static shared memory is limited to 48 KiB per team. */
#define KIVI_ATT_QCAP 1024  /* query heads x head_dim of one item */
#define KIVI_ATT_TILE 128   /* tokens per K staging tile (a multiple of every G) */
#define KIVI_ATT_QSCAP 4096 /* q * scale of a tile's key groups, per head */
#define KIVI_ATT_PCAP 4096  /* logits / probabilities of a split, per head */
#define KIVI_ATT_OCAP 2048  /* V partial sums: token lanes x head_dim (= threads x 32/bits) */
#define KIVI_ATT_NT 128     /* threads per team on the GPU */
#define KIVI_ATT_GPU_ITEMS 2048 /* enough teams to fill an H200 (132 SMs) several times */
_Static_assert(KIVI_ATT_QCAP >= KIVI_MAX_HEAD_DIM, "an item holds at least one head");
_Static_assert(KIVI_ATT_QSCAP >= (KIVI_ATT_TILE / KIVI_MIN_GROUP) * KIVI_MAX_HEAD_DIM, "a tile's groups fit");
_Static_assert(KIVI_ATT_OCAP >= KIVI_ATT_NT * 16, "V partials of all lanes fit");
_Static_assert(KIVI_ATT_PCAP % KIVI_ATT_TILE == 0, "splits are whole tiles");

/* R_BEG: first token of the portable kernel; R_LC: the row's tokens in the quantized stream,
 * R_NS: its sink tokens (kivi_cache_config.sinks), whose partial the sink kernel writes */
enum { R_SEQ, R_LC, R_E, R_NEW, R_BEG, R_NS, R_NCOLS };

/* Heads per item and tokens per split: the split's logits of all the item's heads must fit in
 * KIVI_ATT_PCAP, and there must be enough items to fill the device. */
typedef struct att_plan {
  int hc, nqc;
  int64_t nsplit, split_len, nitems; /* the portable kernel's splits of [R_BEG, T) */
  int nf, fs;                        /* GPU fast-path splits before them (0: none), their length */
  int fused;                         /* decode on the fast path: one launch does all (nsplit = 0) */
  int gqa;                           /* the fast path's kernel is the GQA kernel (decode_gqa.c) */
  int ntail;                         /* its tail blocks per (row, kv-head, chunk) in a decode call */
  int f16;                           /* the fp16 cache's kernel (decode_f16.c; fused, nf splits) */
  int newk;                          /* extend: the new tokens on the GPU (extend_gpu.c), slot nslots - 1 - sink */
  int sink;                          /* the sink tokens' partials (attention.c, attention_gpu.c), slot nslots - 1 */
  int new_seqs, new_tiles;           /* its sequences and tiles of query rows */
  int64_t new_pad;                   /* its staging rows (each sequence's new tokens padded to 32) */
  int64_t nslots;                    /* partials per (row, head): nf + nsplit (+ 1 newk), or nf + 1 fused; + 1 sink */
} att_plan;

/* ---- the GPU kernels' eligibility: a GPU context, KIVI_ATTENTION_FAST, R a power of two >= 32,
 * blocks of < 4 GiB; 0 in builds without offload */
/* 2- or 4-bit keys and values (any mix), G = 32, head_dim 64 or 128: the GQA kernel */
int kivi_gpu_fast_eligible(const kivi_cache *c);
/* the same, HQ a multiple of the kv-heads */
int kivi_gpu_gqa_eligible(const kivi_cache *c, int HQ);
/* 16-bit keys and values, head_dim 64 or 128: the fp16 cache's decode kernel */
int kivi_gpu_f16_eligible(const kivi_cache *c);
/* head_dim 64 or 128: an extend call's new tokens on the tensor cores (extend_gpu.c) */
int kivi_gpu_extend_eligible(const kivi_cache *c);
/* The GPU fast path of kernels 2a and 2b of a larger append (append_gpu.c), not bound by the
 * decode kernels' rule above (no KIVI_ATTENTION_FAST, no R >= 32): a GPU context, 2- or 4-bit,
 * head_dim 128, G = 32, R a power of two, fp16 rows (bf: the input is bf16, not eligible) */
int kivi_gpu_append_eligible(const kivi_cache *c, int bits, int bf);

/* ---- the GQA kernel (decode_gqa.c) */
/* The GPU fast path of 2- and 4-bit caches (the GQA kernel, decode_gqa.c): tokens [0, Lf) of a
 * row, Lf = floor(max(0, Lc - R) / KIVI_FAST_GRAIN) * KIVI_FAST_GRAIN, in splits; in a decode
 * call also the rest of the row (tail blocks) and the combine. */
#define KIVI_FAST_GRAIN 32
#define KIVI_FAST_SMS 132 /* the GPU the plans are tuned for: an H100's or H200's SMs */
/* The GQA kernel (decode_gqa.c): one block per (row, kv-head, chunk of up to KIVI_GQA_NH query
 * heads, split); the plan's splits are the longest power of two from KIVI_GQA_MIN_SPLIT to
 * KIVI_GQA_MAX_SPLIT tokens whose blocks make at least KIVI_GQA_FILL (kivi_plan_call). */
#define KIVI_GQA_NH 8
#define KIVI_GQA_MIN_SPLIT 256
#define KIVI_GQA_MAX_SPLIT 4096
#define KIVI_GQA_FILL (3 * KIVI_FAST_SMS)
/* A decode call's tokens past a row's splits (its last R + 31 at most, whose values are in the fp16
 * window) are taken by tail blocks of KIVI_GQA_TAIL tokens each, in fp32: kivi_gpu_gqa_tails(R) of
 * them per (row, kv-head, chunk), each with a partial slot after the splits' */
#define KIVI_GQA_TAIL 64
static inline int kivi_gpu_gqa_tails(int R) { return (R + 31 + KIVI_GQA_TAIL - 1) / KIVI_GQA_TAIL; }
/* The chunks of at most nh query heads that a kv-head's gsz query heads make (the GQA and fp16
 * kernels take a block per chunk; the last one may hold fewer heads). */
static inline int kivi_head_chunks(int gsz, int nh) { return (gsz + nh - 1) / nh; }

/* ---- the fp16 cache's kernel (decode_f16.c) */
/* A decode call on a cache of 16-bit keys and values, head_dim 64 or 128, R a power of two >= 32,
 * in one launch: a block per (row, kv-head, chunk of up to KIVI_F16_NH query heads, split of fs
 * tokens), nf splits per row, partials in slots 0 .. nf-1 and the combine by the last block of
 * each (row, chunk) (counters cnt [rows][HQ], at the chunk's first head); each warp streams its
 * own 16-token units through a cp.async ring with an online softmax, no block barrier.  (Its
 * two-phase predecessor, a build option for comparison since round 27, is gone: the streamed
 * kernel took 5-34 % less time at every GQA shape measured and 4-7 % less at four of the five
 * MHA shapes, 3 % more at (1, 4096); docs/PERFORMANCE.md, rounds 27 and 33.) */
#define KIVI_F16_NH 8
/* the longest split the plan makes unless its blocks are all resident at once (KIVI_F16S_WAVE) */
#define KIVI_F16_SPLIT 1024
/* the streamed kernel's warps per block (decode_f16.c): 2.  Blocks of 3 (4 of 48 KB of rings per SM)
 * took 3 % less time at GQA batch 1 and 3 % more at MHA batch 1 on an H100 (docs/PERFORMANCE.md,
 * round 50): no clear gain, so no build option either */
#define KIVI_F16S_NW 2
/* the streamed kernel's plan (kivi_plan_call) */
#define KIVI_F16S_BLOCKS (24 * KIVI_FAST_SMS)
#define KIVI_F16S_SPLITS 8 /* splits of the longest row the plan aims at, at most */
#define KIVI_F16S_MAXSPLIT 4096                 /* the longest split it makes */
#define KIVI_F16S_WAVE (12 / KIVI_F16S_NW * KIVI_FAST_SMS) /* its blocks resident at once (head_dim 128) */
#define KIVI_F16S_FEW (3 * KIVI_FAST_SMS / 2)   /* fewer blocks than this: splits above 1024 halved */
#define KIVI_F16S_ONE 2048 /* rows longer than this take one split where the pairs make KIVI_F16S_FEW blocks */
#define KIVI_F16S_MINSPLIT 128

/* ---- the append (append.c) */
/* The one-kernel append (a bare GPU kernel: clang offload builds only) of a small call: at most
 * R new tokens per sequence, KIVI_APPEND_FUSED_SEQS (internal.h: 64) sequences, and
 * KIVI_APPEND_FUSED_MAX new values (new tokens x kv-heads x head_dim); at 390 and 1,024
 * sequences (H200, Llama-2-7B shape) it was slower than the four kernels of a larger call. */
#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#define KIVI_APPEND_FUSED 1
#else
#define KIVI_APPEND_FUSED 0
#endif
#define KIVI_APPEND_NT 128 /* threads per block of the one-kernel append */
#define KIVI_APPEND_FUSED_MAX ((size_t)1 << 18)
#define KIVI_APPEND_VCHUNK 8 /* tokens per item of a larger append's value quantization (kernel 2b) */

/* The plan of a call of `rows` rows (descriptor hd, columns R_*: R_BEG is filled here) with HQ
 * query heads: decode (no new tokens) or extend (newk: the new tokens' GPU kernel takes them). */
att_plan kivi_plan_call(const kivi_cache *c, int rows, int64_t *hd, int HQ, int decode, int newk);

#endif
