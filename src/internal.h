/* Internal declarations shared by the library's translation units (never installed). */
#ifndef KIVI_INTERNAL_H
#define KIVI_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "kivi.h"
#include "layout.h"

/* Prefix for the project's own hidden helpers; only kivi_* with KIVI_API are exported. */
#define KIVI_PRAGMA(x) _Pragma(#x)
/* A pragma whose text is macro-expanded first (clauses a region macro passes on, KIVI_LAUNCH_TWICE below). */
#define KIVI_PRAGMA_S(...) _Pragma(#__VA_ARGS__)
#define KIVI_PRAGMA_X(...) KIVI_PRAGMA_S(__VA_ARGS__)
/* A CUDA-like kernel: KIVI_BARE(teams, threads, clauses) { body } KIVI_REGION_END is the region
 * `omp target teams ompx_bare num_teams(teams) thread_limit(threads) clauses`.  In the test
 * library that emulates the GPU on the host (tests/simt, KIVI_SIMT_EMU) the body becomes a
 * block (clang -fblocks) that the emulator runs once per thread of each team, at once, after
 * the regions enqueued before it (taskwait): an order that the enqueued dependences allow. */
#ifdef KIVI_SIMT_EMU
#include "simt_emu.h"
#define KIVI_BARE(nt, nth, ...) KIVI_PRAGMA(omp taskwait) kivi_simt_run((nt), (nth), ^
#define KIVI_REGION_END );
#else
#define KIVI_BARE(nt, nth, ...) KIVI_PRAGMA_X(omp target teams ompx_bare num_teams(nt) thread_limit(nth) __VA_ARGS__)
#define KIVI_REGION_END
#endif

/* Geometry of the loops that run with the runtime's default launch (append, copies).  Without
 * a thread_limit clause clang compiles such a loop for teams of 128 threads (a chunk of 128
 * iterations per team), but LLVM 19's offload runtime launches a small loop with 32 threads per
 * team: 3 of 4 teams then idle and each thread runs 4 iterations in turn (ncu, H200: a decode
 * step's value quantization took 50 us instead of 16).  A thread_limit whose value is known
 * only at run time (kivi_loop_threads, 128) makes the device code take its chunk from the team
 * size actually launched, whatever the runtime picks.  Host-only builds keep the default. */
#if KIVI_HAVE_OFFLOAD
extern int kivi_loop_threads;
#define KIVI_LOOP_TEAMS thread_limit(kivi_loop_threads)
#else
#define KIVI_LOOP_TEAMS
#endif

/* The dependence type that leaves tasks of the same type unordered among themselves (OpenMP
 * 5.1 inoutset).  Only builds with offload enqueue regions; gcc 12 rejects inoutset on target
 * constructs, and host-only builds never run the enqueued variant, so they name inout. */
#if KIVI_HAVE_OFFLOAD
#define KIVI_DEP_SET inoutset
#else
#define KIVI_DEP_SET inout
#endif

/* Team-shared arrays: the allocate directive only in the device pass (gcc rejects it, and on
 * the host fallback an automatic array of the teams region already is one copy per team). */
#if defined(__NVPTX__) || defined(__AMDGCN__)
#define KIVI_TEAM_SHARED(...) KIVI_PRAGMA(omp allocate(__VA_ARGS__) allocator(omp_pteam_mem_alloc))
#else
#define KIVI_TEAM_SHARED(...)
#endif

struct kivi_context {
  int device;      /* OpenMP device number (initial device for the host) */
  int on_gpu;      /* probe kernel ran on a GPU */
  int num_devices;
};

/* Device memory of a context: omp_target_* on a GPU, malloc/memcpy on the host (also in
 * builds without offload, where libomptarget may not even be loaded). Return 0 on success. */
void *kivi_dev_alloc(const kivi_context *ctx, size_t bytes);
void kivi_dev_free(const kivi_context *ctx, void *p);
int kivi_dev_put(const kivi_context *ctx, void *dst_dev, const void *src_host, size_t bytes);
int kivi_dev_get(const kivi_context *ctx, void *dst_host, const void *src_dev, size_t bytes);

/* Scratch memory of a cache that grows to the largest request (device memory). */
typedef struct kivi_scratch {
  void *p;
  size_t bytes;
} kivi_scratch;
int kivi_scratch_reserve(const kivi_context *ctx, kivi_scratch *s, size_t bytes);
void kivi_scratch_free(const kivi_context *ctx, kivi_scratch *s);

/* Lanes of a cache (kivi_cache_config.async_lanes, n).  A decode call and a one-kernel append
 * (a decode step's) run on the lane of their layer, layer % n; other calls (prefill appends,
 * extend) run off the lanes, ordered with all of them, on lane 0's scratch.  Each lane has its
 * own scratch, so the enqueued calls of different lanes can run at the same time: the layers of
 * a decode step then overlap (under LLVM 19 each dependent enqueued region costs ~30 us on the
 * host before the next one starts).  With n = 1 every call is ordered after the previous one. */
typedef struct kivi_lane {
  char dep[8];        /* the lane's dependence address */
  kivi_scratch stage; /* append: the descriptor copy kernel 1 writes, fp16 K and V tokens,
                         V bounds or the one-kernel append's commit marks and ring backup */
  kivi_scratch work;  /* attention: q, partials, outputs */
  kivi_scratch cnt;   /* attention: arrival counters of the split groups (kept zero) */
  kivi_scratch rot;   /* rotated caches: the append's rotated fp16 K and V (device inputs) */
} kivi_lane;

/* The one-kernel append serves calls of at most this many sequences (cache.c) */
#define KIVI_APPEND_FUSED_SEQS 64
/* The exponent bounds of (seq, layer): [H][KIVI_XB] at this offset of kivi_cache.vexp, per kv-head
 * {V scales, V zeros, K scales, unused} */
#define KIVI_XB 4
#define KIVI_VEXP_AT(seq, layer, NL, H) ((((size_t)(seq) * (size_t)(NL) + (size_t)(layer)) * (size_t)(H)) * KIVI_XB)

struct kivi_cache {
  kivi_context *ctx;
  kivi_cache_config cfg;
  kivi_layout lay;
  int max_blocks;       /* block-table entries per (seq, layer): max_seq_len / R */
  int64_t n_blocks;     /* pool size in blocks */
  unsigned char *pool;  /* device: n_blocks * lay.block_bytes */
  uint16_t *kres;       /* device: [seq][layer][H][R][D] fp16 */
  uint16_t *vres;
  int32_t *bt;          /* device: [seq][layer][max_blocks] block ids */
  int32_t *bt_host;     /* host mirror of bt */
  int32_t *len;         /* host: [seq][layer] lengths */
  int ns;               /* sink tokens per sequence (cfg.sinks; 0 for 16-bit keys and values) */
  uint16_t *ksink;      /* device: [seq][layer][H][ns][D] fp16, tokens 0 .. ns-1 (NULL when ns = 0) */
  uint16_t *vsink;
  int32_t *vexp;        /* device: [seq][layer][H][KIVI_XB] e with 2^e > every |V scale|, every
                           |V zero|, every K scale of the sequence's quantized values and keys
                           (-14 when it has none; KIVI_VEXP_AT) */
  unsigned last_kernels; /* KIVI_KERNEL_* bits of the last attention call */
  int32_t *free_list;   /* host: stack of free block ids */
  int64_t n_free;
  int n_lanes;          /* cfg.async_lanes, 1 for 0 */
  kivi_lane lanes[KIVI_MAX_ASYNC_LANES]; /* scratch and dependence of each lane (kivi_lane_of) */

  /* Asynchronous execution (async.c; GPU contexts only).  An _async call enqueues its regions
   * with `nowait depend(inout: a[0]) depend(inoutset: b[0])`: a call on a lane has a = its
   * lane's dep, b = c->dep, so the calls of one lane run in call order and the lanes run side by
   * side; a call off the lanes has a = c->dep, b = lanes[0].dep, so it runs after everything
   * enqueued before it and before everything enqueued after it.  The caller's tasks that name
   * c->dep in/out/inout are ordered with all of them.  kivi_cache_wait waits for them.  The host
   * side (lengths, block tables) is updated at enqueue time. */
  char dep[8];             /* the dependence address (kivi_cache_dependence) */
  int64_t pending;         /* calls enqueued since the last wait */
  int64_t *aflag;          /* device, n_layers + KIVI_MAX_ASYNC_LANES (1 + n_kv_heads) values.
                              [layer]: 0, or the id of the layer's first append whose input was
                              not finite (later enqueued appends on that layer then do nothing); a
                              synchronous append that fails clears it before it returns.
                              [n_layers + lane]: the arrival counter of the lane's one-kernel
                              appends (kept 0); then per lane KIVI_APPEND_FUSED_SEQS n_kv_heads
                              values that hold their call's V exponent bounds, [sequence of the
                              call][kv-head][2] int32 (kept 0) */
  int64_t next_id;         /* ids of appends since the last wait: 1, 2, ... */
  struct kivi_async_append *log; /* the enqueued appends since the last wait, for rollback */
  size_t n_log, cap_log;
  void **keep;             /* host buffers the enqueued regions read, freed by the wait */
  size_t n_keep, cap_keep;
  struct kivi_stream *stream; /* kivi_cache_set_stream (stream.c), or NULL */
};

typedef struct kivi_async_append {
  int64_t id;
  int layer, n_seqs;
  int *seq_ids, *n_new; /* one allocation: seq_ids then n_new */
} kivi_async_append;

/* How a call runs its device work (the `async` argument of the implementations): synchronous
 * regions; regions enqueued with `nowait` on the lanes (the _async calls on a GPU); or, on a
 * cache with a stream, regions launched on the stream (stream.c) with the bookkeeping of the
 * enqueued calls (kept inputs, logged appends, the wait's error check). */
enum { KIVI_RUN_SYNC = 0, KIVI_RUN_ENQUEUE = 1, KIVI_RUN_STREAM = 2 };

/* stream.c.  kivi_stream_open makes a stream object for the cache's device (*out), or returns
 * KIVI_ERR_UNSUPPORTED / _DEVICE / _NOMEM; kivi_stream_close waits for it and frees it.  Between
 * kivi_stream_enter(c) and kivi_stream_leave(c), the library's target regions run on this
 * thread go to c's stream.  kivi_stream_sync waits for the stream, delivers host outputs, and
 * returns -1 if anything failed on it since the last sync.  put/get: copies in stream order
 * (a host output arrives at the sync). */
typedef struct kivi_stream kivi_stream;
kivi_status kivi_stream_open(const kivi_cache *c, void *stream, kivi_stream **out);
void kivi_stream_close(kivi_stream *s);
void kivi_stream_enter(kivi_cache *c);
void kivi_stream_leave(kivi_cache *c);
/* kivi_cache_stream_begin / _end: the calling thread's scope on c's stream (on 1) or its end (on
 * 0); -1 without a stream, or, ending, when the thread's scope is not c's.  The scope routes
 * only the program's regions (the hooks); the library's follow kivi_stream_enter / _leave. */
int kivi_stream_scope(kivi_cache *c, int on);
int kivi_stream_sync(kivi_cache *c);
void *kivi_stream_handle(const kivi_cache *c);
void kivi_stream_counts(const kivi_cache *c, int64_t *launched, int64_t *passed);
int kivi_stream_put(kivi_cache *c, void *dst_dev, const void *src_host, size_t bytes);
int kivi_stream_get(kivi_cache *c, void *dst_host, const void *src_dev, size_t bytes);

/* async.c.  A public call begins with kivi_call_begin (enqueue: an _async call; a synchronous
 * one first waits for the enqueued work, and a failed wait is its status) which picks how it
 * runs (*run, KIVI_RUN_*) and enters the cache's stream if it has one, and ends with
 * kivi_call_end, which leaves it and, for a synchronous call on a stream, waits. */
kivi_status kivi_call_begin(kivi_cache *c, int enqueue, int *run);
kivi_status kivi_call_end(kivi_cache *c, int enqueue, kivi_status st);
kivi_status kivi_async_drain(kivi_cache *c);     /* = kivi_cache_wait; KIVI_OK when nothing is pending */
int kivi_async_keep(kivi_cache *c, void *host);  /* frees host at the next wait; -1 (and frees it) on OOM */
void *kivi_async_keep_copy(kivi_cache *c, const void *src, size_t bytes); /* a kept copy, or NULL */
int kivi_async_log_append(kivi_cache *c, int64_t id, int layer, int n_seqs, const int *seq_ids, const int *n_new);
/* Enqueued copies between host and the cache's device (ordered with the cache's other work). */
void kivi_async_put(kivi_cache *c, int lane, void *dst_dev, const void *src_host, size_t bytes);
void kivi_async_get(kivi_cache *c, int lane, void *dst_host, const void *src_dev, size_t bytes);
/* kivi_scratch_reserve for a cache with enqueued work: waits first when the scratch must grow
 * (enqueued regions may still use the old allocation). */
int kivi_async_reserve(kivi_cache *c, kivi_scratch *s, size_t bytes);
/* Undoes the host side of an append (lengths already advanced), cache.c. */
void kivi_append_rollback(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new);

/* The lane of a call on `layer`: its layer's if `laned`, else -1 (off the lanes: lane 0's
 * scratch, ordered with every lane). */
static inline int kivi_lane_of(const kivi_cache *c, int layer, int laned) { return laned ? layer % c->n_lanes : -1; }
static inline kivi_lane *kivi_lane_at(kivi_cache *c, int lane) { return &c->lanes[lane < 0 ? 0 : lane]; }
/* The addresses an enqueued region of the lane names: depend(inout: a[0]) depend(inoutset: b[0]). */
static inline void kivi_lane_deps(kivi_cache *c, int lane, char **a, char **b) {
  *a = lane >= 0 ? c->lanes[lane].dep : c->dep;
  *b = lane >= 0 ? c->dep : c->lanes[0].dep;
}
/* A region written out twice, chosen at run time by `async` (KIVI_RUN_*): as a region enqueued
 * with nowait and the dependences of the call's lane (kivi_lane_deps), or as a synchronous one
 * (a region's clauses are fixed at compile time).  REGION(args..., clauses...) is a macro
 * whose variadic parameters are the run mode's clauses; its arguments are given with a comma
 * after the last (KIVI_LAUNCH_TWICE(GQ_REGION, 64, 2, 2,)), none where it has none
 * (KIVI_LAUNCH_TWICE(SINK_REGION)).  Needs the locals `c`, `async` and `lane`. */
#define KIVI_LAUNCH_TWICE(REGION, ...)                                                                                \
  do {                                                                                                                \
    char *dep_a, *dep_b; /* named only in depend clauses */                                                           \
    kivi_lane_deps(c, lane, &dep_a, &dep_b);                                                                          \
    if (async == KIVI_RUN_ENQUEUE) {                                                                                  \
      REGION(__VA_ARGS__ nowait depend(inout : dep_a[0]) depend(KIVI_DEP_SET : dep_b[0]))                             \
    } else {                                                                                                          \
      REGION(__VA_ARGS__)                                                                                             \
    }                                                                                                                 \
  } while (0)
/* The same for a region whose synchronous copy also reads a result back (SYNC: the clauses of
 * that copy only, such as map(from : x)): the stream route takes KIVI_LAUNCH_TWICE's copy
 * without them (a map from would make its kernel wait). */
#define KIVI_LAUNCH_READBACK(REGION, ...)                                                                             \
  do {                                                                                                                \
    if (async == KIVI_RUN_SYNC) {                                                                                     \
      REGION(__VA_ARGS__)                                                                                             \
    } else                                                                                                            \
      KIVI_LAUNCH_TWICE(REGION);                                                                                      \
  } while (0)

static inline int32_t *kivi_bt_row(const kivi_cache *c, int seq, int layer) {
  return c->bt_host + ((size_t)seq * c->cfg.n_layers + layer) * c->max_blocks;
}
/* The smallest b with 2^b >= x (x >= 1): log2 of the power-of-two R the GPU kernels require. */
static inline int kivi_log2up(int x) {
  int b = 0;
  while ((1 << b) < x) ++b;
  return b;
}
static inline int32_t kivi_len(const kivi_cache *c, int seq, int layer) {
  return c->len[(size_t)seq * c->cfg.n_layers + layer];
}
/* Of a sequence of length L: the tokens of its quantized stream (after the ns sink tokens),
 * whose positions minus ns the pool, the rings and every kernel of the stream see. */
static inline int64_t kivi_qlen(const kivi_cache *c, int64_t L) { return L > c->ns ? L - c->ns : 0; }
/* The sink area of (seq, layer, kv-head h): ns rows of head_dim fp16 */
static inline size_t kivi_sink_at(const kivi_cache *c, int seq, int layer, int h) {
  return (((size_t)seq * c->cfg.n_layers + layer) * c->cfg.n_kv_heads + h) * (size_t)c->ns * c->cfg.head_dim;
}

/* The GQA kernel's launch.  Partials of the splits (fs tokens each, the last one of a row shorter):
 * slots 0 .. nf-1 of part_o [rows][HQ][nslots][D] and part_ml [rows][HQ][nslots][2] (unnormalized
 * o, max m and sum l in base 2).  dd: the row descriptor in host memory, ndd int64 values (columns
 * col_seq, col_beg and col_lc), copied in with the launch (kept until the wait when async).
 * Slots at or beyond a row's own Lf / fs get l = 0.  A decode call (out != NULL): the ntail
 * tail blocks of each (row, kv-head, chunk) take the rest of the row into slots nf .. nf +
 * ntail - 1, and the last block to arrive combines into out (f32 or f16) with the arrival
 * counters cnt [rows][HQ] (zero between calls).  async: enqueued on the lane's dependences. */
void kivi_gpu_gqa_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_beg, int col_lc, int fs, int nf, int ntail, int nslots, const float *q, float qmul,
                         float *part_o, float *part_ml, unsigned *cnt, void *out, int out_f16, int async, int lane);

/* GPU fp16-cache path (decode_f16.c): a decode call on a
 * cache of 16-bit keys and values in one launch, its plan in plan.c */
void kivi_gpu_f16_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_lc, int fs, int nf, const float *q, float qmul, float *part_o, float *part_ml,
                         unsigned *cnt, void *out, int out_f16, int async, int lane);

/* GPU path of an extend call's new tokens (extend_gpu.c): their causal attention among
 * themselves from the fp32 inputs, on the tensor cores with f16 operands and fp32 accumulators
 * (fp16-attention class), head_dim 64 or 128, ::KIVI_ATTENTION_FAST.  tab (host, int32): nseq
 * sequences {first row, new tokens, offset in the staging buffers (a multiple of 32)}, ntiles
 * tiles of up to KIVI_NEW_TILE rows {first row, rows, sequence}, then the P / 32 staging tiles of
 * 32 tokens {first row, tokens}; the staging buffers kx and vx hold H P head_dim halves each,
 * ex 2 H P / 32 int32.  Writes slot `slot` of the nslots partials of every (row, query head), or,
 * with nslots = 1, out and lse.  q, kn, vn 16-byte aligned. */
#define KIVI_NEW_TILE 64
void kivi_gpu_extend_new(kivi_cache *c, const int32_t *tab, int nseq, int ntiles, int64_t P, int HQ, const float *q,
                         const float *kn, const float *vn, float qmul, uint16_t *kx, uint16_t *vx, int32_t *ex,
                         float *part_o, float *part_ml, int64_t nslots, int64_t slot, float *out, float *lse, int async,
                         int lane);

/* GPU kernel of the sink tokens' partials (attention_gpu.c, sink_block): a warp per
 * (row, query head) over the row's sink tokens (sd: the call's host descriptor, columns col_seq
 * and col_ns, rows int64 each), into slot nslots - 1 of part_o / part_ml.  0, or -1 where it
 * launched nothing (builds without offload): attention.c's portable region runs instead. */
int kivi_gpu_sink_partials(kivi_cache *c, int layer, int rows, int HQ, const int64_t *sd, int64_t ndd, int col_seq,
                           int col_ns, const float *q, float qmul, float *part_o, float *part_ml, int64_t nslots,
                           int async, int lane);

/* Columns of a larger append's descriptor (cache.c; n_seqs int64 values each): sequence id,
 * stored length L, new tokens, first stage row, completed blocks before it (prefix), values
 * leaving the window before it (prefix), first position of its values leaving the window. */
enum { D_SEQ, D_L, D_N, D_STAGE, D_KBPRE, D_VQPRE, D_VQBEG, D_NCOLS };
/* One append's device work as append_impl (cache.c) prepared it: the inputs of the append
 * kernels (append.c).  The host image img [descriptor | block-table updates | raw K | raw V]
 * (n_img bytes; the raw inputs, from `head` on, only with host inputs) goes in with the first
 * kernel; the sink image simg (n_simg bytes) with the sinks' kernel.  The device stage of the
 * call's lane: [descriptor copy dd (sdesc bytes) | fp16 K kst | fp16 V vst (f16 bytes each) |
 * V bounds or commit marks (nvx bytes) | (the one-kernel append) backup of the ring slots]. */
typedef struct kivi_append_job {
  int layer, n_seqs;
  kivi_dtype dtype;         /* of the inputs (fp16 after a rotation) */
  int host_in;              /* the inputs came from host memory (in the image) */
  int fused;                /* the one-kernel append */
  int max_new;              /* the most new tokens of one sequence's quantized stream */
  int64_t call_id;          /* what a non-finite input writes into the layer's flag */
  const void *kdev, *vdev;  /* device inputs (NULL with host inputs) */
  unsigned char *img, *simg;
  size_t n_img, head, nel, esz, n_desc, n_bt; /* nel: new values per tensor, esz bytes each */
  size_t n_simg, stab;      /* stab: the sink image's table bytes, before its host rows */
  int64_t nsink;            /* sink tokens of the call */
  void *stage;              /* the lane's stage, sdesc, f16 and nvx bytes as above */
  size_t sdesc, f16, nvx;
  int64_t *flag, *arrive;   /* the layer's flag; the lane's arrival counter (one-kernel append) */
  int64_t n_kb, n_vq;       /* K blocks the call completes, values leaving the windows */
} kivi_append_job;
/* Runs an append's kernels on the cache's device in run mode `async` (KIVI_RUN_*) on `lane`.
 * Returns the layer's flag after them (a synchronous call; 0 otherwise): nonzero if an input
 * was not finite, in which case they changed nothing but block-table entries past the lengths. */
int64_t kivi_append_run(kivi_cache *c, const kivi_append_job *j, int async, int lane);
/* GPU fast path of kernels 2a and 2b of a larger append (append_gpu.c; eligibility: plan.h,
 * kivi_gpu_append_eligible).  The launches return 0, or -1 where they launched nothing (the
 * portable kernels run instead). */
int kivi_gpu_append_keys(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nkb, const uint16_t *src,
                          int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane);
int kivi_gpu_append_values(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nvq, const uint16_t *src,
                            int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane);

/* Rotated caches (rotate.c, kivi_cache_config.rotate).  kivi_rotate_rows: dst = W src for nvec
 * head vectors (rotate != 0), or src converted (rotate = 0), on the cache's device, as a region
 * of the call's run mode and lane (KIVI_LAUNCH_TWICE); src of dtype src_t (f32, f16, bf16), dst
 * f32 or f16; in place where src == dst with the same type.  kivi_rotate_host: the same on the
 * host, to fp16. */
void kivi_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                      int rotate, int async, int lane);
void kivi_rotate_host(const void *src, kivi_dtype src_t, uint16_t *dst, int64_t nvec, int D, int rotate);
/* attention_gpu.c: kivi_rotate_rows on a GPU context as one ompx_bare kernel (a warp per
 * vector); 0, or -1 where it launched nothing (builds without offload). */
int kivi_gpu_rotate_rows(kivi_cache *c, const void *src, kivi_dtype src_t, void *dst, kivi_dtype dst_t, int64_t nvec,
                         int rotate, int async, int lane);

/* Export blob size of a (sequence, layer) of length L; import of such a blob (cache.c). */
size_t kivi_export_size(const kivi_cache *c, int64_t L);
kivi_status kivi_import_seq(kivi_cache *c, int seq, int layer, int64_t L, const void *blob);

/* Checks a list of sequence ids: non-NULL, in range, no duplicates. */
kivi_status kivi_check_seq_ids(const kivi_cache *c, int n_seqs, const int *seq_ids);

#endif
