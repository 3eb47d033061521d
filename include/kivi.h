/**
 * @file kivi.h
 * @brief libkivi-omp — KIVI KV-cache quantization with a fused attention that reads the packed cache.
 *
 * KIVI (Liu et al., ICML 2024): keys are quantized per channel, values per token, to 2, 4 or 8
 * bits with asymmetric min/max groups (fp16 scale and zero); the most recent tokens stay in an
 * fp16 residual window.  Everything here runs as OpenMP target regions, on an NVIDIA GPU when
 * the library was built with offload and a device is chosen, otherwise on host threads.
 *
 * @par Conventions
 *  - Every call that can fail returns a ::kivi_status; ::KIVI_OK is 0.  On any error the cache
 *    is unchanged and no output has been written, except where a function says otherwise
 *    (the size-query outputs of kivi_cache_export_seq() and kivi_cache_save() on
 *    ::KIVI_ERR_BUFFER).  The library never aborts, exits or prints.
 *  - Sizes are in elements unless a name says bytes.  fp16 means IEEE binary16 bits in uint16_t.
 *  - Tensor layouts are row-major, the last dimension named is contiguous.
 *  - Pointers marked "host or device" are host memory when `mem` is ::KIVI_MEM_HOST, and memory
 *    of the cache's device (from kivi_context_alloc() or omp_target_alloc on that device) when
 *    `mem` is ::KIVI_MEM_DEVICE.
 *  - A call over zero sequences (`n_seqs` = 0) validates its other scalar arguments and then
 *    does nothing: its array arguments may be NULL.
 *
 * @par Threading
 * A ::kivi_context may be shared by any number of threads and caches (it is immutable after
 * creation).  A ::kivi_cache must be used by one thread at a time; distinct caches may be used
 * concurrently from different threads.
 *
 * @par Devices
 * A context is bound at creation to one device (or the host), and every cache created from it
 * lives there: its memory, its kernels and the work it enqueues; ::KIVI_MEM_DEVICE pointers given
 * to it must be memory of that device.  For several GPUs in one process create one context per
 * device (kivi_context_create(&ctx, n), 0 <= n < num_devices) and caches on each; caches on
 * different devices share nothing and may be used concurrently, typically one host thread per
 * device.  Results of caches on different devices (e.g. kv-heads split across GPUs or MPI ranks)
 * are combined by the caller: examples/kivi_multi_device.c, examples/mpi/kivi_mpi_heads.c.
 *
 * @par Binary compatibility
 * The public structs have fixed sizes with reserved members at their end, so later versions
 * add fields without moving any (docs/ABI.md).  Start a ::kivi_cache_config from
 * kivi_cache_config_init(), which zeroes the reserved members; the library refuses a
 * configuration whose reserved members are not zero.
 */
#ifndef KIVI_H
#define KIVI_H

#include <stddef.h>
#include <stdint.h>

#include "kivi_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KIVI_API __attribute__((visibility("default")))
#define KIVI_NODISCARD __attribute__((warn_unused_result))
#else
#define KIVI_API
#define KIVI_NODISCARD
#endif
/* exported as the API is, but a linker hook, not part of the API (no Fortran binding) */
#define KIVI_HOOK KIVI_API

/* ---- status ------------------------------------------------------------------------------ */

/** What a call did: ::KIVI_OK or the reason it refused or failed. */
typedef enum kivi_status {
  KIVI_OK = 0,              /**< success */
  KIVI_ERR_ARG = 1,         /**< NULL pointer, size or index out of range, inconsistent arguments */
  KIVI_ERR_UNSUPPORTED = 2, /**< valid request this build does not support (bits, group, head_dim...) */
  KIVI_ERR_NO_DEVICE = 3,   /**< the requested device does not exist or cannot be used */
  KIVI_ERR_NOMEM = 4,       /**< host or device allocation failed */
  KIVI_ERR_CAPACITY = 5,    /**< the cache's block pool, its sequence slots or a sequence's maximum length is exhausted */
  KIVI_ERR_NONFINITE = 6,   /**< NaN or Inf in the input, or a value beyond the fp16 range */
  KIVI_ERR_DEVICE = 7,      /**< the offload runtime failed (copy, kernel) */
  KIVI_ERR_BUFFER = 8,      /**< the caller's output buffer is too small */
  KIVI_ERR_FORMAT = 9,      /**< a checkpoint is truncated, corrupted or of another format version */
  KIVI_ERR_MISMATCH = 10,   /**< a checkpoint's geometry (layers, heads, head_dim, bits, G, R) differs */
  KIVI_ERR_IO = 11          /**< a file could not be read or written */
} kivi_status;

/** A static English description of a status ("invalid argument", ...); never NULL. */
KIVI_API const char *kivi_status_string(kivi_status status);

/* ---- version and build ----------------------------------------------------------------- */

/** The version of the loaded library, "MAJOR.MINOR.PATCH" (KIVI_VERSION_STRING is the header's). */
KIVI_API const char *kivi_version_string(void);
KIVI_API int kivi_version_major(void); /**< major version of the loaded library */
KIVI_API int kivi_version_minor(void); /**< minor version of the loaded library */
KIVI_API int kivi_version_patch(void); /**< patch version of the loaded library */
/** 1 when built with GPU offload (nvptx), 0 for a host-only build. */
KIVI_API int kivi_built_with_offload(void);
/** One line describing the build: compiler, OpenMP, offload target and arch. */
KIVI_API const char *kivi_build_config(void);

/* ---- context: where the work runs ------------------------------------------------------ */

/** Where work runs: one device (or the host), chosen at creation.  Opaque. */
typedef struct kivi_context kivi_context;

#define KIVI_DEVICE_DEFAULT (-1) /**< the OpenMP default device if it is a GPU, else the host */
#define KIVI_DEVICE_HOST (-2)    /**< host threads, even when a GPU is present */

/** Where the memory behind a pointer argument lives. */
typedef enum kivi_mem {
  KIVI_MEM_HOST = 0,  /**< host memory */
  KIVI_MEM_DEVICE = 1 /**< memory of the cache's (or context's) device */
} kivi_mem;

/** What kivi_context_get_info() reports.  64 bytes; the library writes every member. */
typedef struct kivi_context_info {
  int device;        /**< OpenMP device number the work runs on (the initial device for the host) */
  int on_gpu;        /**< 1 when a probe kernel ran on a GPU at creation, 0 when on host threads */
  int num_devices;   /**< OpenMP devices visible to this process (0 in host-only builds) */
  int reserved[13];  /**< written as 0; later versions may report more here */
} kivi_context_info;

/** Creates a context bound to a device.
 * @param ctx     receives the context (NULL on error)
 * @param device  ::KIVI_DEVICE_DEFAULT, ::KIVI_DEVICE_HOST, or a device number
 *                0 <= n < number of devices
 * @return ::KIVI_ERR_NO_DEVICE for a device number that does not exist (never a quiet run on
 *         the host), ::KIVI_ERR_ARG for a NULL ctx, ::KIVI_ERR_NOMEM.
 * Creation runs a probe kernel, so kivi_context_info::on_gpu reports where work really runs. */
KIVI_API KIVI_NODISCARD kivi_status kivi_context_create(kivi_context **ctx, int device);
/** Destroys a context (after every cache made from it).  NULL is allowed. */
KIVI_API void kivi_context_destroy(kivi_context *ctx);
/** Where the context runs; ::KIVI_ERR_ARG for NULL arguments. */
KIVI_API kivi_status kivi_context_get_info(const kivi_context *ctx, kivi_context_info *info);

/** Runs a small reduction kernel on the context's device and checks it against the host.
 * @param ran_on_gpu  may be NULL; receives 1 when the kernel ran on a GPU
 * @return ::KIVI_ERR_DEVICE if the result is wrong or the kernel could not run. */
KIVI_API KIVI_NODISCARD kivi_status kivi_context_selftest(kivi_context *ctx, int *ran_on_gpu);

/** Allocates memory on the context's device (host memory for a host context), for
 * ::KIVI_MEM_DEVICE arguments.  ::KIVI_ERR_NOMEM when it fails. */
KIVI_API KIVI_NODISCARD kivi_status kivi_context_alloc(kivi_context *ctx, size_t bytes, void **ptr);
/** Frees memory from kivi_context_alloc(); kivi_context_free(ctx, NULL) is allowed. */
KIVI_API void kivi_context_free(kivi_context *ctx, void *ptr);
/** Copies host memory to the context's device. */
KIVI_API KIVI_NODISCARD kivi_status kivi_context_upload(kivi_context *ctx, void *dst_device,
                                                         const void *src_host, size_t bytes);
/** Copies memory of the context's device to the host. */
KIVI_API KIVI_NODISCARD kivi_status kivi_context_download(kivi_context *ctx, void *dst_host,
                                                           const void *src_device, size_t bytes);

/* ---- the KV cache ---------------------------------------------------------------------- */

/** @name The KV cache
 * Semantics (KIVI, exactly):
 *  - Group quantization with b bits: scale = (max - min) / (2^b - 1) and zero = min, both stored
 *    as fp16 (round to nearest even); code = clamp(floor((x - zero) / scale + 1/2), 0, 2^b - 1)
 *    computed in fp32 with the *stored* fp16 scale and zero; dequant = code * scale + zero.
 *    A group whose stored scale is 0 (constant group) gets code 0 and dequantizes to its zero,
 *    i.e. exactly to the constant.
 *  - Keys per channel: a group is G consecutive tokens of one channel of one kv-head.
 *    Values per token: a group is G consecutive channels of one token of one kv-head.
 *  - Streaming, for a sequence of length L: the first L - (L mod R) keys are quantized (whole
 *    R-token blocks), the last L mod R keys stay fp16; the last min(L, R) values stay fp16 and
 *    each older value is quantized when it leaves that window.
 *  - Inputs are rounded to fp16 first; all quantization reads the fp16 values.  The cache
 *    contents therefore depend only on the tokens, never on how appends split them.
 *  - bits = 16 stores the tokens unquantized in fp16 (the baseline path, same kernels).
 * @{ */

/** A KV cache of several layers and sequences on one device.  Opaque. */
typedef struct kivi_cache kivi_cache;

/** Element type of K/V inputs and of attention outputs. */
typedef enum kivi_dtype {
  KIVI_F32 = 0, /**< IEEE binary32 */
  KIVI_F16 = 1, /**< IEEE binary16 bits in uint16_t */
  KIVI_BF16 = 2 /**< bfloat16 bits in uint16_t */
} kivi_dtype;

/** Which attention kernel a cache may use. */
typedef enum kivi_attention_mode {
  KIVI_ATTENTION_FAST = 0, /**< fastest kernel available: on a GPU, for 2-bit or 4-bit keys and values
                              (each: K4 V2 too), head_dim 64 or 128, G = 32 and R a power of two >= 32,
                              a tensor-core kernel of fp16-attention accuracy (within 2e-3 of
                              max |output|, sharp attention and keys with outlier channels
                              included: q * scale carried in 22 bits, p * scale in one f16, fp32
                              accumulation); for 16-bit K/V (the fp16 cache), head_dim 64 or 128 and
                              R a power of two >= 32, a tensor-core decode kernel of fp32-class
                              accuracy; for an extend call's new tokens (head_dim 64 or 128, any
                              cache), a tensor-core kernel of fp16-attention accuracy
                              (::KIVI_KERNEL_GPU_NEW) */
  KIVI_ATTENTION_FP32 = 1  /**< always the portable kernel: fp32 accumulation (about 1e-6 relative) */
} kivi_attention_mode;

/** The geometry and KIVI parameters of a cache.  128 bytes.  Fill it with
 * kivi_cache_config_init() and change what differs; kivi_cache_config_check() and
 * kivi_cache_config_reason() say what is wrong with one. */
typedef struct kivi_cache_config {
  int n_layers;    /**< 1..4096 */
  int n_kv_heads;  /**< 1..4096 */
  int head_dim;    /**< multiple of 32, 32..256 (64 and 128 are the tested model sizes) */
  int max_seqs;    /**< sequence slots, ids 0..max_seqs-1 (at most 2^20) */
  int max_seq_len; /**< tokens per sequence, >= 1 */
  int64_t pool_tokens; /**< quantized-token capacity of each layer's block pool, shared by all
                            sequences, rounded up to whole R-token blocks; 0 = max_seqs * max_seq_len */
  int k_bits;      /**< 2, 4, 8, or 16 (no quantization) */
  int v_bits;      /**< 2, 4, 8, or 16 */
  int group;       /**< G: 32, 64 or 128; must divide head_dim */
  int residual;    /**< R: multiple of G, G..1024 (paper default G=32, R=128) */
  int attention;   /**< ::kivi_attention_mode (default ::KIVI_ATTENTION_FAST) */
  int async_lanes; /**< 0 or 1 (default): enqueued work runs in call order.  2..::KIVI_MAX_ASYNC_LANES:
                        the decode calls and decode-step appends of layer l run in call order
                        with those of the layers l' = l (mod async_lanes), and side by side with
                        the others (see "asynchronous execution" below).  Each lane holds its own
                        scratch memory. */
  int rotate;      /**< ::kivi_rotation (default ::KIVI_ROTATE_NONE): store keys and/or values
                        Hadamard-rotated (head_dim must then be a power of two) */
  int sinks;       /**< S, 0 (default) to ::KIVI_MAX_SINKS: the first S tokens of every sequence (the
                        "attention sinks") are kept in fp16 and never quantized; see "Sink tokens"
                        below */
  int v_clip;      /**< ::kivi_clip (default ::KIVI_CLIP_NONE): how the range of a quantized value
                        group is chosen; see "Searched value ranges" below */
  int32_t reserved[15]; /**< must be 0 (kivi_cache_config_init() zeroes them); later versions
                             give them meanings whose 0 keeps today's behaviour */
} kivi_cache_config;

/** Which tensors a cache stores rotated (kivi_cache_config::rotate, a bit mask).
 *
 * With ::KIVI_ROTATE_K the cache quantizes and stores y = W k for every key head vector k,
 * where W is the orthonormal Walsh-Hadamard matrix of order head_dim (Sylvester's order,
 * scaled by 1/sqrt(head_dim); W is symmetric and its own inverse), and the attention calls
 * use W q for every query head vector q: the logits are the same in exact arithmetic.  With
 * ::KIVI_ROTATE_V it stores W v for every value head vector and the attention calls return
 * W times what they computed, so the outputs are the same in exact arithmetic.  A rotation
 * spreads each vector's outlier channels over all channels, so that 2-bit groups lose less
 * (QuaRot, SpinQuant; no calibration data).  Exactly, in fp32, for a vector x of head_dim
 * elements (the conversion of an fp16 or bf16 input to fp32 is exact):
 *
 *     for (h = 1; h < head_dim; h *= 2)
 *       for (i = 0; i < head_dim; i += 2 h)  for (j = i; j < i + h; ++j)
 *         (x[j], x[j + h]) = (x[j] + x[j + h], x[j] - x[j + h]);
 *     x[i] *= 1.0f / sqrtf((float)head_dim)   (each i)
 *
 * and the cache then rounds the rotated keys and values to fp16, as it rounds any input.  A
 * rotated vector can exceed the fp16 range where its input did not (up to sqrt(head_dim)
 * times its largest element): the append then fails with ::KIVI_ERR_NONFINITE, as for any
 * input beyond fp16.  kivi_cache_export_seq() and checkpoints hold the rotated tensors; a
 * checkpoint records the rotation and loads only into a cache with the same one.  On a GPU the
 * rotations of q and of the outputs are one small kernel each around the decode kernels; the
 * decode kernels keep their accuracy class on rotated caches. */
typedef enum kivi_rotation {
  KIVI_ROTATE_NONE = 0, /**< keys and values stored as given */
  KIVI_ROTATE_K = 1,    /**< keys (and queries) rotated */
  KIVI_ROTATE_V = 2,    /**< values rotated, outputs rotated back */
  KIVI_ROTATE_KV = 3    /**< both */
} kivi_rotation;

#define KIVI_MAX_ASYNC_LANES 8 /**< the largest kivi_cache_config::async_lanes */
#define KIVI_MAX_SINKS 256      /**< the largest kivi_cache_config::sinks */

/** @par Sink tokens (kivi_cache_config::sinks = S > 0)
 * Tokens 0 .. S-1 of a sequence are stored in fp16 (as given, rounded to fp16, and rotated
 * where the cache rotates) in a sink area of S tokens per (sequence, layer, kv-head), and never
 * quantized.  The tokens from position S on form the quantized stream: every rule of the
 * streaming semantics above applies to them with their position minus S (for a sequence of
 * length L > S: the first (L-S) - ((L-S) mod R) of them have quantized keys, the last
 * min(L-S, R) fp16 values).  Attention sees all L tokens, in one softmax.  Small models put
 * large, outlying keys and values on their first tokens, which the 2-bit groups of the tokens
 * around them would otherwise have to span (StreamingLLM; KVQuant's "attention sink" tokens).
 * A sequence of length L holds min(L, S) sink tokens: S x 2 x head_dim x 2 bytes per layer
 * and kv-head once L >= S (2 KiB at S = 4, head_dim 64).  A cache of 16-bit keys and values
 * keeps every token in fp16 already; there `sinks` changes nothing but the checkpoint header.
 * kivi_cache_export_seq() starts each kv-head's state with the sink tokens; checkpoints record
 * S and load only into a cache with the same S. */

/** How the range of a quantized value group is chosen (kivi_cache_config::v_clip). */
typedef enum kivi_clip {
  KIVI_CLIP_NONE = 0, /**< KIVI's rule: the group's minimum and maximum */
  KIVI_CLIP_MSE = 1   /**< the best of nine ranges narrowed about the centre (below) */
} kivi_clip;

/** @par Searched value ranges (kivi_cache_config::v_clip = ::KIVI_CLIP_MSE)
 * Each quantized value group (G channels of one token) takes the range that reconstructs it
 * with the smallest squared error among nine, narrowed symmetrically from its min/max range,
 * instead of the min/max range itself; keys keep the min/max rule (narrowing their ranges lost
 * accuracy in a simulation of SmolLM2-135M: the large keys are the ones attention needs).  A
 * cache of 16-bit values ignores the option.  The packed
 * format, the dequantization and the attention kernels are unchanged, and so are checkpoints:
 * a checkpoint loads whatever the option, which only decides how later values are quantized.
 * No calibration data: the choice depends on the group's own values.  Exactly, with mn and mx
 * the group's minimum and maximum (fp16 values, as floats), maxq = 2^b - 1, every operation
 * below rounding once in fp32 (round to nearest even; its products are exact):
 *
 *     h = fp16(0.5 (mx - mn))                      (rounded to fp16, read back as a float)
 *     candidate 0: the min/max rule's scale and zero
 *     candidate i = 1..8: a = i / 16, lo = mn + a h, hi = mx - a h,
 *                         scale = fp16((hi - lo) / maxq), zero = fp16(lo)
 *     err(candidate) = sum over the group's values x, in order, of e * e, where
 *         d = (code(x) * scale + zero) - x,  code(x) the rule above (clamped to 0..maxq),
 *         e = d with the low 12 bits of its fp32 encoding cleared (12 significant bits)
 *
 * The group stores the first candidate of the smallest err (candidate 0 if h is 0, above
 * 65504 or not finite).  The values outside a narrowed range take code 0 or maxq.  On
 * SmolLM2-135M with 2-bit keys and values, 4 sink tokens and K and V rotated it lowered the
 * perplexity loss from +4.7..+6.5 % to +3.3..+5.3 % of fp16's; with 4-bit keys it changed
 * nothing beyond the runs' spread (docs/BENCHMARKS.md).  Appends quantize values more slowly with it (on a GPU
 * the larger appends take the portable kernels: a 32,768-token, 32 x 128 prefill 2.9 ms
 * against 0.45 ms on an H200; a decode step's append of 8 sequences +12 to +17 us). */

/** Fills a config with the paper defaults: 2-bit K and V, G = 32, R = 128, fast attention,
 * pool_tokens 0, async_lanes 1, no rotation, no sink tokens, min/max value ranges, reserved members 0.  Does nothing for NULL. */
KIVI_API void kivi_cache_config_init(kivi_cache_config *cfg, int n_layers, int n_kv_heads,
                                     int head_dim, int max_seqs, int max_seq_len);

/** Checks a config without allocating.
 * @return ::KIVI_OK; ::KIVI_ERR_ARG for a NULL config, a count or size out of range, an unknown
 *         attention mode, rotation or value clip, sinks outside 0..::KIVI_MAX_SINKS, or a non-zero reserved
 *         member; ::KIVI_ERR_UNSUPPORTED for
 *         bits, group, residual or head_dim values this library does not implement, and for a
 *         rotation with a head_dim that is not a power of two.
 * kivi_cache_config_reason() names the rule that failed. */
KIVI_API kivi_status kivi_cache_config_check(const kivi_cache_config *cfg);

/** Why kivi_cache_config_check() refuses a config: a static English sentence naming the first
 * member that breaks a rule ("group must divide head_dim"), or "" when the config is valid.
 * Never NULL. */
KIVI_API const char *kivi_cache_config_reason(const kivi_cache_config *cfg);

/** Creates a cache.  All storage is allocated on the context's device here (block pool,
 * residual windows, block tables); nothing is allocated per call except scratch that grows to
 * the largest call.
 * @param cache  receives the cache, NULL on error
 * @return the status of kivi_cache_config_check(), ::KIVI_ERR_NOMEM, ::KIVI_ERR_DEVICE. */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_create(kivi_context *ctx, const kivi_cache_config *cfg,
                                                      kivi_cache **cache);
/** Destroys a cache, waiting for its enqueued work first.  NULL is allowed. */
KIVI_API void kivi_cache_destroy(kivi_cache *cache);
/** The config the cache was created with. */
KIVI_API kivi_status kivi_cache_get_config(const kivi_cache *cache, kivi_cache_config *cfg);

/** Appends new tokens to layer `layer` of n_seqs distinct sequences.
 * @param seq_ids  [n_seqs] host array of distinct ids
 * @param n_new    [n_seqs] host array, n_new[i] >= 0
 * @param k,v      [sum n_new][n_kv_heads][head_dim] of dtype, sequences in the order of
 *                 seq_ids; host or device memory (`mem`)
 * Prefill (many tokens) and decode (one token) are the same call; n_seqs = 0 or all n_new
 * zero does nothing.  Errors (nothing changed): ::KIVI_ERR_ARG (bad ids, duplicates, NULL),
 * ::KIVI_ERR_CAPACITY (max_seq_len or the pool would be exceeded), ::KIVI_ERR_NONFINITE
 * (NaN/Inf, or |x| > 65504 after rounding to fp16). */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_append(kivi_cache *cache, int layer, int n_seqs,
                                                      const int *seq_ids, const int *n_new,
                                                      const void *k, const void *v,
                                                      kivi_dtype dtype, kivi_mem mem);

/** Empties a sequence on every layer and returns its blocks to the pool.  ::KIVI_ERR_ARG for a
 * bad cache or seq_id; ::KIVI_ERR_NOMEM or ::KIVI_ERR_DEVICE where the sequence's bounds on the
 * device cannot be cleared (the sequence is then unchanged), or an error of enqueued work it
 * waits for first (as kivi_cache_wait). */
KIVI_API kivi_status kivi_cache_reset_seq(kivi_cache *cache, int seq_id);

/** Current length of a sequence on a layer. */
KIVI_API kivi_status kivi_cache_seq_length(const kivi_cache *cache, int seq_id, int layer, int *length);

/** What the live tokens of a cache cost, from kivi_cache_get_stats().  128 bytes; the library
 * writes every member. */
typedef struct kivi_cache_stats {
  int64_t tokens;           /**< sum of all sequence lengths over all layers */
  size_t code_bytes;        /**< packed codes of quantized tokens (K and V) */
  size_t scale_zero_bytes;  /**< fp16 scales and zeros */
  size_t residual_bytes;    /**< fp16 tokens in the residual windows and sink areas */
  size_t bookkeeping_bytes; /**< block tables and lengths of the sequences in use */
  size_t total_bytes;       /**< the sum of the four above: what the live tokens cost */
  size_t fp16_bytes;        /**< the same tokens stored as plain fp16 K and V */
  double bits_per_element;  /**< total_bytes * 8 / (2 * tokens * n_kv_heads * head_dim) */
  size_t allocated_bytes;   /**< device memory held by the cache (pool, windows, tables) */
  int64_t free_blocks;      /**< R-token blocks still free, summed over the layers' pools */
  int64_t total_blocks;     /**< R-token blocks of the layers' pools, summed over the layers
                                 (each layer's pool holds ceil(pool_tokens / R) of them) */
  int64_t stream_kernels;   /**< kernels launched on the cache's CUDA stream (kivi_cache_set_stream()),
                                 counted since the stream was set; 0 without a stream */
  int64_t stream_waits;     /**< regions that could not be launched on the stream and ran through
                                 the OpenMP runtime after waiting for it (same count) */
  int64_t reserved[3];      /**< written as 0; later versions may report more here */
} kivi_cache_stats;

/** Fills `stats`; ::KIVI_ERR_ARG for NULL arguments. */
KIVI_API kivi_status kivi_cache_get_stats(const kivi_cache *cache, kivi_cache_stats *stats);

/** The live state of one sequence on one layer in the packed format (docs/FORMAT.md):
 *   for each kv-head h, with Ls = min(L, S) sink tokens (kivi_cache_config::sinks = S; 0 for a
 *   cache of 16-bit keys and values) and Q = L - Ls tokens in the quantized stream:
 *   - K sinks   [Ls][head_dim] fp16, then V sinks [Ls][head_dim] fp16 (absent when Ls = 0)
 *   - K codes   [Lk][kw] u32   Lk = Q - Q mod R quantized keys, kw = head_dim * k_bits / 32
 *   - K scale/zero [Lk/G][2][head_dim] fp16 (absent when k_bits = 16)
 *   - V codes   [Lv][vw] u32   Lv = max(0, Q - R) quantized values
 *   - V scale/zero [Lv][head_dim/G][2] fp16 (absent when v_bits = 16)
 *   - K residual [Q - Lk][head_dim] fp16, oldest first
 *   - V residual [Q - Lv][head_dim] fp16, oldest first
 *
 * @param buf    NULL to ask for the size, or a buffer of *bytes bytes
 * @param bytes  in: the buffer's size; out: the size of the state.  On ::KIVI_ERR_BUFFER (the
 *               buffer is smaller than the state) *bytes receives the size needed and the
 *               buffer is not written.
 * Equal exports mean equal caches: the conformance tests compare them across append splits and
 * devices. */
KIVI_API kivi_status kivi_cache_export_seq(const kivi_cache *cache, int seq_id, int layer,
                                           void *buf, size_t *bytes);
/** @} */

/* ---- checkpoint / restore (docs/CHECKPOINT.md) ------------------------------------------ */

/** @name Checkpoint and restore (docs/CHECKPOINT.md)
 * A checkpoint holds the packed state of one sequence or of every non-empty sequence, with the
 * cache geometry and a CRC-32; it can be restored into any cache of the same geometry on any
 * device (GPU or host), giving bit-identical state.  Loading validates everything first: a
 * truncated, corrupted or wrong-version checkpoint is ::KIVI_ERR_FORMAT, a wrong geometry
 * ::KIVI_ERR_MISMATCH, one that does not fit (a record's length beyond max_seq_len, a sequence
 * id beyond max_seqs, more blocks than the pool has) ::KIVI_ERR_CAPACITY; the target cache is
 * then untouched.
 * @{ */

#define KIVI_ALL_SEQS (-1) /**< every non-empty sequence of a cache (save, load) */

/** Writes a checkpoint of one sequence (seq_id) or of every non-empty one (::KIVI_ALL_SEQS).
 * @param buf    NULL to ask for the size, or a buffer of *bytes bytes
 * @param bytes  in: the buffer's size; out: the checkpoint's size.  On ::KIVI_ERR_BUFFER
 *               *bytes receives the size needed and the buffer is not written. */
KIVI_API kivi_status kivi_cache_save(const kivi_cache *cache, int seq_id, void *buf, size_t *bytes);
/** Restores a checkpoint.  seq_id ::KIVI_ALL_SEQS replaces the whole cache (sequences absent
 * from the checkpoint become empty, ids as saved); a sequence id loads a one-sequence
 * checkpoint into that slot (a checkpoint with another number of records is ::KIVI_ERR_ARG). */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_load(kivi_cache *cache, int seq_id, const void *buf, size_t bytes);
/** kivi_cache_save() to a file (written to PATH.tmp, then renamed); ::KIVI_ERR_IO. */
KIVI_API kivi_status kivi_cache_save_file(const kivi_cache *cache, int seq_id, const char *path);
/** kivi_cache_load() from a file; ::KIVI_ERR_IO when it cannot be read. */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_load_file(kivi_cache *cache, int seq_id, const char *path);
/** @} */

/* ---- attention ------------------------------------------------------------------------- */

/** @name Attention
 * n_q_heads must be a multiple of n_kv_heads (MHA, GQA, MQA); q head h reads kv-head
 * h / (n_q_heads / n_kv_heads).  softmax_scale must be finite and > 0 (usually
 * 1/sqrt(head_dim); ::KIVI_ERR_ARG otherwise).  Accumulation is fp32 with one softmax over the
 * quantized and the residual tokens together.
 * @{ */

/* Kernels that computed the last successful attention call of a cache (a bit mask), so a caller
 * can tell which code path and accuracy class produced a result. */
#define KIVI_KERNEL_PORTABLE 1u  /**< the portable OpenMP kernel (GPU or host threads), fp32 */
#define KIVI_KERNEL_GPU_F16X2 2u /**< the GPU kernel of 2- and 4-bit caches (::KIVI_ATTENTION_FAST, head_dim 64
                                  * or 128, G 32), fp16-attention accuracy class: a whole decode call, or the
                                  * quantized part of an extend call; always reported with ::KIVI_KERNEL_GPU_GQA */
#define KIVI_KERNEL_GPU_GQA 4u   /**< with ::KIVI_KERNEL_GPU_F16X2: that kernel is the tensor-core GQA kernel, one
                                  * block per (row, kv-head, chunk of up to 8 query heads, split), for every
                                  * layout (MHA, GQA, MQA) */
#define KIVI_KERNEL_GPU_F16 8u   /**< the GPU kernel of 16-bit (fp16) caches in decode calls (::KIVI_ATTENTION_FAST,
                                  * head_dim 64 or 128, R a power of two >= 32): tensor cores, fp32
                                  * accumulation, q and p carried as two f16 parts (fp32-class accuracy) */
#define KIVI_KERNEL_GPU_NEW 16u  /**< the GPU kernel of an extend call's new tokens (::KIVI_ATTENTION_FAST, head_dim
                                  * 64 or 128): their causal attention among themselves from the fp32 inputs on the
                                  * tensor cores, q, k, p and v as f16 operands (each scaled by a power of two into
                                  * f16's range), fp32 accumulation: fp16-attention accuracy (within 2e-3 of
                                  * max |output|; sharp attention, logits near 60, within 2e-2; lse within 2e-3 of
                                  * max(1, |lse|)); the cached tokens of the call go through the other kernels */
/** The kernels (KIVI_KERNEL_* bits) that computed the cache's last successful attention call. */
KIVI_API kivi_status kivi_cache_last_kernels(const kivi_cache *cache, unsigned *kernels);

/** Decode: one query token per sequence over everything in the cache for that sequence
 * (append the token's own K/V first).  A sequence's output depends on its own tokens and on
 * which other sequences the same call takes (the kernels' split plan), never on the other
 * sequences' contents or on what a reset sequence held before: one sequence a call gives the
 * same bits whatever else the cache holds.
 * @param q    [n_seqs][n_q_heads][head_dim] fp32, host or device (`mem`)
 * @param out  [n_seqs][n_q_heads][head_dim] of out_dtype (::KIVI_F32 or ::KIVI_F16), host or device
 * A sequence of length 0 is ::KIVI_ERR_ARG. */
KIVI_API KIVI_NODISCARD kivi_status kivi_attention_decode(kivi_cache *cache, int layer, int n_seqs,
                                                          const int *seq_ids, int n_q_heads,
                                                          const float *q, float softmax_scale,
                                                          void *out, kivi_dtype out_dtype,
                                                          kivi_mem mem);

/** Extend (chunked prefill): q_lens[i] >= 1 new tokens of sequence seq_ids[i] attend to the L
 * tokens already in the cache and, causally, to the new tokens given here in full precision
 * (new token j sees new tokens 0..j).  Call kivi_cache_append() with the same K/V afterwards.
 * On a GPU with ::KIVI_ATTENTION_FAST and head_dim 64 or 128, the new tokens' part runs on the
 * tensor cores with f16 operands at fp16-attention accuracy (::KIVI_KERNEL_GPU_NEW; with
 * ::KIVI_ATTENTION_FP32 the portable kernel, fp32-class); device-memory q, k_new and v_new must
 * then be 16-byte aligned for it, or the call takes the portable kernel.
 * @param q             [sum q_lens][n_q_heads][head_dim] fp32
 * @param k_new,v_new   [sum q_lens][n_kv_heads][head_dim] fp32
 * @param out           [sum q_lens][n_q_heads][head_dim] fp32
 * @param lse           NULL or [sum q_lens][n_q_heads] fp32, the natural-log log-sum-exp of the
 *                      scaled logits of each row
 * All host or all device (`mem`). */
KIVI_API KIVI_NODISCARD kivi_status kivi_attention_extend(kivi_cache *cache, int layer, int n_seqs,
                                                          const int *seq_ids, const int *q_lens,
                                                          int n_q_heads, const float *q,
                                                          const float *k_new, const float *v_new,
                                                          float softmax_scale, float *out,
                                                          float *lse, kivi_mem mem);
/** @} */

/* ---- asynchronous execution ------------------------------------------------------------ */

/** @name Asynchronous execution
 * The _async variants take the same arguments as the synchronous calls and validate them the
 * same way: an invalid call returns its status at once and enqueues nothing.  A valid call on a
 * GPU context enqueues its device work (OpenMP target tasks on the cache's device) and returns
 * without waiting for it.
 *   - Order.  With async_lanes = 1 (the default), work enqueued on one cache runs in call order.
 *     With async_lanes = n > 1, the decode calls and the small appends (a decode step's: at
 *     most residual tokens per sequence, at most 64 sequences and 2^18 new values) of layer l
 *     run on lane l mod n: in call order with the other calls of that lane, side by side with
 *     the calls of other lanes.  Every other call (a larger append, extend) runs after all work
 *     enqueued before it and before all work enqueued after it.  So calls on one layer always
 *     run in call order; a device buffer that one call writes and a call on another layer reads
 *     (or writes) must be ordered by the caller: a task of its own with depend(inout: d[0])
 *     enqueued between the two calls does it (the dependence object below).  Lanes let the
 *     layers of a decode step overlap on the GPU when the caller enqueues several layers' work
 *     at once.
 *   - Inputs in host memory are copied at the call: the caller may reuse them at once.  Inputs
 *     in device memory must stay unchanged, and outputs must not be read, until the work is done.
 *   - Outputs (to host or device memory) are written when kivi_cache_wait() returns.
 *   - A host-memory input of an append is checked at the call (as it is copied): NaN/Inf there
 *     fails the call itself with ::KIVI_ERR_NONFINITE, and nothing is enqueued.  A device-memory
 *     input is checked on the device.
 *   - kivi_cache_wait(cache) waits for everything enqueued on the cache and reports what went
 *     wrong at run time: ::KIVI_ERR_NONFINITE if an enqueued append held NaN/Inf (or |x| > 65504)
 *     in device memory.
 *     That append and every append enqueued after it on the same layer then had no effect: the
 *     layer is as it was before the failed append, and the outputs of the attention calls
 *     enqueued after it on that layer are undefined.  Calls on other layers are not affected
 *     (they take place, as they would in the synchronous calls).  Errors are never lost: the
 *     synchronous calls on a cache with enqueued work, and kivi_cache_save/load/export_seq/
 *     reset_seq, wait first, and if that wait reports an error they return it and do nothing
 *     else.
 *   - Ordering with the caller's own target tasks: every region the library enqueues on a cache
 *     names d = kivi_cache_dependence(cache) (a char *), as depend(inoutset: d[0]) on a lane
 *     (OpenMP 5.1: such tasks are not ordered among themselves) or depend(inout: d[0]).  A task
 *     the caller creates with depend(out: d[0]) or depend(inout: d[0]) (say, a kernel writing
 *     q) runs after all the library's earlier enqueued work and before all its later work; one
 *     with depend(in: d[0]) (reading an output) after all the earlier work.
 *     OpenMP orders only sibling tasks: enqueue, name the dependence and wait from one thread,
 *     and use the OpenMP runtime the library uses (LLVM's libomp for an offloading build).
 *   - Lengths and statistics (kivi_cache_seq_length(), kivi_cache_get_stats()) count an
 *     enqueued append at once; a failed one is taken back by the wait that reports it.
 *   - On a host context (and in builds without offload) the _async calls run synchronously and
 *     return the call's status; kivi_cache_wait() then has nothing to wait for.
 *
 * Enqueued work holds scratch memory (each lane its own); a call that needs more than its lane
 * has waits for the enqueued work before growing it (the first call of a larger shape).
 * @{ */

/** kivi_cache_append(), enqueued. */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_append_async(kivi_cache *cache, int layer, int n_seqs,
                                                            const int *seq_ids, const int *n_new,
                                                            const void *k, const void *v,
                                                            kivi_dtype dtype, kivi_mem mem);
/** kivi_attention_decode(), enqueued. */
KIVI_API KIVI_NODISCARD kivi_status kivi_attention_decode_async(kivi_cache *cache, int layer, int n_seqs,
                                                                const int *seq_ids, int n_q_heads,
                                                                const float *q, float softmax_scale,
                                                                void *out, kivi_dtype out_dtype,
                                                                kivi_mem mem);
/** kivi_attention_extend(), enqueued. */
KIVI_API KIVI_NODISCARD kivi_status kivi_attention_extend_async(kivi_cache *cache, int layer, int n_seqs,
                                                                const int *seq_ids, const int *q_lens,
                                                                int n_q_heads, const float *q,
                                                                const float *k_new, const float *v_new,
                                                                float softmax_scale, float *out,
                                                                float *lse, kivi_mem mem);
/** Waits for all work enqueued on the cache (on a cache with a CUDA stream: everything on the
 * stream, the caller's work there included); ::KIVI_OK, or the first run-time error (see above). */
KIVI_API kivi_status kivi_cache_wait(kivi_cache *cache);
/** The address the cache's enqueued regions name in their depend clauses; NULL for NULL. */
KIVI_API void *kivi_cache_dependence(kivi_cache *cache);
/** @} */

/* ---- a CUDA stream ------------------------------------------------------------------------ */

/** @name A CUDA stream
 * The OpenMP offload runtime makes the host wait for each region (LLVM 19: 20-30 us a region
 * on an H200) or, for enqueued regions that depend on one another, starts each only after the
 * one before it has finished (about as long).  A model's decode step is a chain of such calls,
 * so its host time, not its kernels, sets the pace.  With a stream set, a cache's device work
 * goes instead onto a CUDA stream, in call order, launched with the CUDA driver (about 3 us of
 * host time a kernel, no wait): the GPU orders the work, and the caller's own kernels and
 * vendor libraries (cuBLAS...) on the same stream are ordered with it.  The kernels are the
 * same OpenMP target regions; the results are bit-identical to the other routes.
 *   - Every call on the cache, synchronous or _async, enqueues its device work on the stream.
 *     The _async calls return at once; kivi_cache_wait() waits for the stream and reports
 *     run-time errors exactly as described above (::KIVI_ERR_NONFINITE, with the same rollback).
 *     The synchronous calls enqueue and then wait, so they keep their meaning.
 *   - Device-memory inputs are read, and device-memory outputs written, in stream order: a
 *     kernel the caller enqueues on the stream after a call sees its outputs; one enqueued before
 *     it may write its inputs.  Host-memory outputs arrive at the wait.
 *   - The decode calls and a decode step's appends launch on the stream directly with the
 *     GPU fast path's kernels (2- or 4-bit, head_dim 128, G = 32); other work (a prefill's
 *     append, the portable kernels) first waits for the stream and then runs through the OpenMP
 *     runtime, in order but without the gain.  kivi_cache_stats counts both.
 *   - kivi_cache_dependence() does not order anything with the stream's work.
 * Needs a build with offload, a GPU context, and the CUDA driver (libcuda.so.1, opened at run
 * time; the library does not link CUDA).  The stream must belong to the device's primary
 * context, the one the CUDA runtime uses (any cudaStream_t created on that device does); the
 * calls on a cache with a stream make that context current on the calling thread.
 * @{ */

/** kivi_cache_set_stream(): a stream the cache creates, owns and destroys. */
#define KIVI_STREAM_LIBRARY ((void *)(intptr_t)-1)

/** Routes the cache's device work onto a CUDA stream (a CUstream / cudaStream_t of the cache's
 * device, which the caller keeps alive until the stream is unset or the cache destroyed), onto
 * a stream of its own (::KIVI_STREAM_LIBRARY), or back to the OpenMP runtime (NULL).  It waits
 * first for the work enqueued so far (kivi_cache_wait()): if that wait reports an error, the
 * route is not changed and that status is returned.
 * @return ::KIVI_OK; ::KIVI_ERR_ARG for a NULL cache; ::KIVI_ERR_UNSUPPORTED on a host context, in
 *         a build without offload, or where the CUDA driver cannot be opened; ::KIVI_ERR_DEVICE
 *         if the driver refuses the device image or the stream; ::KIVI_ERR_NOMEM.  On an error
 *         the cache keeps the route it had. */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_set_stream(kivi_cache *cache, void *stream);
/** The cache's stream (the library's own for ::KIVI_STREAM_LIBRARY), NULL without one. */
KIVI_API kivi_status kivi_cache_get_stream(const kivi_cache *cache, void **stream);

/** Puts the calling program's own target regions on the cache's stream too: from this call to
 * kivi_cache_stream_end() on the same thread, each region the thread runs on the cache's device
 * is enqueued on the stream, in order with the library's work, when it is an `ompx_bare`
 * kernel whose arguments are device pointers (is_device_ptr), scalars (firstprivate) and
 * `map(to:)` sections; any other region first waits for the stream and then runs through the
 * OpenMP runtime, as the library's own do (kivi_cache_stats counts both).  A region's outputs
 * are there once kivi_cache_wait() returns (or a later synchronous call on the cache).
 * It needs the program linked with
 * `-Wl,--wrap=__tgt_register_lib -Wl,--wrap=__tgt_target_kernel` (pkg-config's
 * `stream_regions_ldflags`), which hands the program's device image and regions to the library
 * first (the hooks below); without those flags, the scope changes nothing.  Calls on caches
 * inside the scope work as usual.  End the scope before the cache's stream is changed or the
 * cache destroyed (a scope still open on the calling thread then ends with the stream; one
 * open on another thread is left pointing at a freed stream).
 * @return ::KIVI_OK; ::KIVI_ERR_ARG for a NULL cache or one without a stream;
 *         ::KIVI_ERR_DEVICE if the device's context cannot be made current. */
KIVI_API KIVI_NODISCARD kivi_status kivi_cache_stream_begin(kivi_cache *cache);
/** Ends the calling thread's scope on the cache's stream (it does not wait for the stream).
 * @return ::KIVI_OK; ::KIVI_ERR_ARG for a NULL cache, or when the thread's scope is not on this
 *         cache's stream. */
KIVI_API kivi_status kivi_cache_stream_end(kivi_cache *cache);

/** The hooks `--wrap` links a program's offload runtime calls to (kivi_cache_stream_begin());
 * they pass everything outside a scope on to the OpenMP offload runtime unchanged.  Not for
 * calling. */
KIVI_HOOK int __wrap___tgt_register_lib(void *desc);
KIVI_HOOK int __wrap___tgt_target_kernel(void *loc, int64_t device, int32_t teams, int32_t threads, void *region,
                                         void *args);
/** @} */

#ifdef __cplusplus
}
#endif

#endif /* KIVI_H */
