/* The streaming cache manager: block pool, residual windows, append with exact KIVI semantics.
 *
 * An append of n tokens to a sequence of length L (new length L' = L + n), per layer:
 *   1. validate everything and reserve nothing until the input is known to be finite;
 *   2. convert the input to fp16 in scratch memory, flagging NaN/Inf (nothing changed yet; a
 *      host input was already checked on the host as it was copied);
 *   3. take floor(L'/R) - floor(L/R) blocks from the pool;
 *   4. quantize the K blocks completed by this append (tokens from the old ring or the new input);
 *   5. quantize the values that leave the window, positions [max(0, L-R), max(0, L'-R));
 *   6. write the new tokens that stay fp16 into the rings (after 4 and 5 read the old slots).
 * Every quantized group reads fp16 values of the same tokens whatever the split, so the packed
 * bytes do not depend on how the tokens arrive.  On a GPU a small call (at most R tokens per
 * sequence, at most 64 sequences: a decode step) does 2-6 in one kernel; otherwise kernel 1
 * does 2, kernel 2a does 4, kernel 2b does 5, kernel 3 does 6 (append.c). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "kernels_quant.h"
#include "plan.h" /* kivi_gpu_append_eligible */

/* ---- configuration ---- */

void kivi_cache_config_init(kivi_cache_config *cfg, int n_layers, int n_kv_heads, int head_dim,
                            int max_seqs, int max_seq_len) {
  if (!cfg) return;
  memset(cfg, 0, sizeof *cfg);
  cfg->n_layers = n_layers;
  cfg->n_kv_heads = n_kv_heads;
  cfg->head_dim = head_dim;
  cfg->max_seqs = max_seqs;
  cfg->max_seq_len = max_seq_len;
  cfg->pool_tokens = 0;
  cfg->k_bits = 2;
  cfg->v_bits = 2;
  cfg->group = 32;
  cfg->residual = 128;
  cfg->attention = KIVI_ATTENTION_FAST;
  cfg->async_lanes = 1;
}

static int bits_ok(int b) { return b == 2 || b == 4 || b == 8 || b == 16; }

/* The first rule a configuration breaks: its status, and a static sentence naming the field. */
static kivi_status config_verdict(const kivi_cache_config *c, const char **why) {
#define KIVI_RULE(bad, status, text) \
  if (bad) {                         \
    *why = text;                     \
    return status;                   \
  }
  KIVI_RULE(!c, KIVI_ERR_ARG, "the configuration is NULL");
  KIVI_RULE(c->n_layers < 1 || c->n_layers > 4096, KIVI_ERR_ARG, "n_layers must be 1..4096");
  KIVI_RULE(c->n_kv_heads < 1 || c->n_kv_heads > KIVI_MAX_KV_HEADS, KIVI_ERR_ARG, "n_kv_heads must be 1..4096");
  KIVI_RULE(c->head_dim < 1, KIVI_ERR_ARG, "head_dim must be positive");
  KIVI_RULE(c->max_seqs < 1 || c->max_seqs > (1 << 20), KIVI_ERR_ARG, "max_seqs must be 1..2^20");
  KIVI_RULE(c->max_seq_len < 1, KIVI_ERR_ARG, "max_seq_len must be positive");
  KIVI_RULE(c->pool_tokens < 0, KIVI_ERR_ARG, "pool_tokens must be 0 (automatic) or positive");
  KIVI_RULE(c->group < 1, KIVI_ERR_ARG, "group must be positive");
  KIVI_RULE(c->residual < 1, KIVI_ERR_ARG, "residual must be positive");
  KIVI_RULE(c->attention != KIVI_ATTENTION_FAST && c->attention != KIVI_ATTENTION_FP32, KIVI_ERR_ARG,
            "attention must be KIVI_ATTENTION_FAST or KIVI_ATTENTION_FP32");
  KIVI_RULE(c->async_lanes < 0 || c->async_lanes > KIVI_MAX_ASYNC_LANES, KIVI_ERR_ARG, "async_lanes must be 0..8");
  KIVI_RULE(c->rotate < KIVI_ROTATE_NONE || c->rotate > KIVI_ROTATE_KV, KIVI_ERR_ARG,
            "rotate must be KIVI_ROTATE_NONE, _K, _V or _KV");
  KIVI_RULE(c->sinks < 0 || c->sinks > KIVI_MAX_SINKS, KIVI_ERR_ARG, "sinks must be 0..256");
  KIVI_RULE(c->v_clip != KIVI_CLIP_NONE && c->v_clip != KIVI_CLIP_MSE, KIVI_ERR_ARG,
            "v_clip must be KIVI_CLIP_NONE or KIVI_CLIP_MSE");
  int reserved_set = 0;
  for (size_t i = 0; i < sizeof c->reserved / sizeof c->reserved[0]; ++i) reserved_set |= c->reserved[i] != 0;
  KIVI_RULE(reserved_set, KIVI_ERR_ARG, "reserved members must be zero (start from kivi_cache_config_init)");
  KIVI_RULE(!bits_ok(c->k_bits), KIVI_ERR_UNSUPPORTED, "k_bits must be 2, 4, 8 or 16");
  KIVI_RULE(!bits_ok(c->v_bits), KIVI_ERR_UNSUPPORTED, "v_bits must be 2, 4, 8 or 16");
  KIVI_RULE(c->head_dim % 32 || c->head_dim < KIVI_MIN_HEAD_DIM || c->head_dim > KIVI_MAX_HEAD_DIM,
            KIVI_ERR_UNSUPPORTED, "head_dim must be a multiple of 32 from 32 to 256");
  KIVI_RULE(c->group != 32 && c->group != 64 && c->group != 128, KIVI_ERR_UNSUPPORTED, "group must be 32, 64 or 128");
  KIVI_RULE(c->head_dim % c->group, KIVI_ERR_UNSUPPORTED, "group must divide head_dim");
  KIVI_RULE(c->residual % c->group || c->residual > KIVI_MAX_RESIDUAL, KIVI_ERR_UNSUPPORTED,
            "residual must be a multiple of group, at most 1024");
  KIVI_RULE(c->rotate && (c->head_dim & (c->head_dim - 1)), KIVI_ERR_UNSUPPORTED,
            "rotate needs a power-of-two head_dim (32, 64, 128 or 256)");
#undef KIVI_RULE
  *why = "";
  return KIVI_OK;
}

kivi_status kivi_cache_config_check(const kivi_cache_config *c) {
  const char *why;
  return config_verdict(c, &why);
}

const char *kivi_cache_config_reason(const kivi_cache_config *c) {
  const char *why;
  (void)config_verdict(c, &why);
  return why;
}

/* ---- create / destroy ---- */

void kivi_cache_destroy(kivi_cache *c) {
  if (!c) return;
  (void)kivi_async_drain(c); /* enqueued work must finish before its memory goes */
  kivi_stream_close(c->stream);
  free(c->log);
  free(c->keep);
  const kivi_context *ctx = c->ctx;
  kivi_dev_free(ctx, c->aflag);
  kivi_dev_free(ctx, c->pool);
  kivi_dev_free(ctx, c->kres);
  kivi_dev_free(ctx, c->vres);
  kivi_dev_free(ctx, c->bt);
  kivi_dev_free(ctx, c->vexp);
  kivi_dev_free(ctx, c->ksink);
  kivi_dev_free(ctx, c->vsink);
  for (int i = 0; i < KIVI_MAX_ASYNC_LANES; ++i) {
    kivi_scratch_free(ctx, &c->lanes[i].stage);
    kivi_scratch_free(ctx, &c->lanes[i].work);
    kivi_scratch_free(ctx, &c->lanes[i].cnt);
    kivi_scratch_free(ctx, &c->lanes[i].rot);
  }
  free(c->bt_host);
  free(c->len);
  free(c->free_list);
  free(c);
}

/* Sets the exponent bounds of n sequences from seq0 on (all their layers) to -14, "none"
 * (2^-14 bounds fp16 subnormals).  KIVI_OK, KIVI_ERR_NOMEM or KIVI_ERR_DEVICE. */
static kivi_status vexp_put_none(kivi_cache *c, int seq0, int n) {
  const int NL = c->cfg.n_layers, H = c->cfg.n_kv_heads;
  const size_t nve = (size_t)n * NL * H * KIVI_XB;
  int32_t *none = malloc(nve * sizeof *none);
  if (!none) return KIVI_ERR_NOMEM;
  for (size_t i = 0; i < nve; ++i) none[i] = -14;
  const int err = kivi_dev_put(c->ctx, c->vexp + KIVI_VEXP_AT(seq0, 0, NL, H), none, nve * sizeof *none);
  free(none);
  return err ? KIVI_ERR_DEVICE : KIVI_OK;
}

kivi_status kivi_cache_create(kivi_context *ctx, const kivi_cache_config *cfg, kivi_cache **out) {
  if (!out) return KIVI_ERR_ARG;
  *out = NULL;
  if (!ctx) return KIVI_ERR_ARG;
  kivi_status st = kivi_cache_config_check(cfg);
  if (st) return st;
  kivi_cache *c = calloc(1, sizeof *c);
  if (!c) return KIVI_ERR_NOMEM;
  c->ctx = ctx;
  c->cfg = *cfg;
  c->n_lanes = cfg->async_lanes > 1 ? cfg->async_lanes : 1;
  const int R = cfg->residual, S = cfg->max_seqs, NL = cfg->n_layers;
  if (kivi_layout_init(&c->lay, cfg->head_dim, cfg->n_kv_heads, cfg->group, R, cfg->k_bits, cfg->v_bits)) {
    free(c);
    return KIVI_ERR_UNSUPPORTED;
  }
  c->max_blocks = cfg->max_seq_len / R;
  const int64_t pool_tokens = cfg->pool_tokens ? cfg->pool_tokens : (int64_t)S * cfg->max_seq_len;
  c->n_blocks = (int64_t)NL * ((pool_tokens + R - 1) / R);
  if (c->n_blocks > INT32_MAX) { free(c); return KIVI_ERR_ARG; }
  const size_t ring = (size_t)S * NL * cfg->n_kv_heads * R * cfg->head_dim;
  const size_t bt_n = (size_t)S * NL * (c->max_blocks > 0 ? c->max_blocks : 1);
  c->pool = kivi_dev_alloc(ctx, (size_t)c->n_blocks * c->lay.block_bytes);
  c->kres = kivi_dev_alloc(ctx, ring * 2);
  c->vres = kivi_dev_alloc(ctx, ring * 2);
  c->bt = kivi_dev_alloc(ctx, bt_n * 4);
  c->vexp = kivi_dev_alloc(ctx, (size_t)S * NL * cfg->n_kv_heads * KIVI_XB * 4);
  c->ns = cfg->k_bits == 16 && cfg->v_bits == 16 ? 0 : cfg->sinks;
  if (c->ns) {
    const size_t sink = (size_t)S * NL * cfg->n_kv_heads * c->ns * cfg->head_dim * 2;
    c->ksink = kivi_dev_alloc(ctx, sink);
    c->vsink = kivi_dev_alloc(ctx, sink);
  }
  /* flags: [layer], then each lane's arrival counter, then each lane's exponent bounds of the
   * one-kernel append ([seq of the call][H][KIVI_XB] int32 in KIVI_APPEND_FUSED_SEQS H KIVI_XB / 2
   * values) */
  const size_t nflag =
      (size_t)NL + KIVI_MAX_ASYNC_LANES * (1 + (size_t)KIVI_APPEND_FUSED_SEQS * cfg->n_kv_heads * (KIVI_XB / 2));
  c->aflag = kivi_dev_alloc(ctx, nflag * sizeof *c->aflag);
  c->bt_host = malloc(bt_n * 4);
  c->len = calloc((size_t)S * NL, 4);
  c->free_list = malloc((size_t)(c->n_blocks > 0 ? c->n_blocks : 1) * 4);
  if (!c->pool || !c->kres || !c->vres || !c->bt || !c->vexp || !c->aflag || !c->bt_host || !c->len ||
      !c->free_list || (c->ns && (!c->ksink || !c->vsink))) {
    kivi_cache_destroy(c);
    return KIVI_ERR_NOMEM;
  }
  for (size_t i = 0; i < bt_n; ++i) c->bt_host[i] = -1;
  /* pop from the end: block 0 is handed out first */
  for (int64_t i = 0; i < c->n_blocks; ++i) c->free_list[i] = (int32_t)(c->n_blocks - 1 - i);
  c->n_free = c->n_blocks;
  int64_t *zero = calloc(nflag, sizeof *zero);
  const kivi_status vst = zero ? vexp_put_none(c, 0, S) : KIVI_ERR_NOMEM;
  if (vst) {
    free(zero);
    kivi_cache_destroy(c);
    return vst;
  }
  const int put_err = kivi_dev_put(ctx, c->bt, c->bt_host, bt_n * 4) || kivi_dev_put(ctx, c->aflag, zero, nflag * sizeof *zero);
  free(zero);
  if (put_err) {
    kivi_cache_destroy(c);
    return KIVI_ERR_DEVICE;
  }
  *out = c;
  return KIVI_OK;
}

kivi_status kivi_cache_get_config(const kivi_cache *c, kivi_cache_config *cfg) {
  if (!c || !cfg) return KIVI_ERR_ARG;
  *cfg = c->cfg;
  return KIVI_OK;
}

kivi_status kivi_check_seq_ids(const kivi_cache *c, int n_seqs, const int *ids) {
  if (n_seqs < 0 || (n_seqs > 0 && !ids)) return KIVI_ERR_ARG;
  for (int i = 0; i < n_seqs; ++i) {
    if (ids[i] < 0 || ids[i] >= c->cfg.max_seqs) return KIVI_ERR_ARG;
    for (int j = 0; j < i; ++j)
      if (ids[j] == ids[i]) return KIVI_ERR_ARG;
  }
  return KIVI_OK;
}

kivi_status kivi_cache_seq_length(const kivi_cache *c, int seq, int layer, int *length) {
  if (!c || !length || seq < 0 || seq >= c->cfg.max_seqs || layer < 0 || layer >= c->cfg.n_layers)
    return KIVI_ERR_ARG;
  *length = kivi_len(c, seq, layer);
  return KIVI_OK;
}

kivi_status kivi_cache_reset_seq(kivi_cache *c, int seq) {
  if (!c || seq < 0 || seq >= c->cfg.max_seqs) return KIVI_ERR_ARG;
  const kivi_status wst = kivi_async_drain(c); /* enqueued work first */
  if (wst) return wst;
  /* the sequence's V exponent bounds back to "none": its next values start them afresh */
  const kivi_status vst = vexp_put_none(c, seq, 1);
  if (vst) return vst;
  const int R = c->cfg.residual, NL = c->cfg.n_layers;
  for (int l = 0; l < NL; ++l) {
    int32_t *row = kivi_bt_row(c, seq, l);
    const int nb = (int)(kivi_qlen(c, kivi_len(c, seq, l)) / R);
    for (int b = 0; b < nb; ++b) {
      c->free_list[c->n_free++] = row[b];
      row[b] = -1;
    }
    c->len[(size_t)seq * c->cfg.n_layers + l] = 0;
  }
  /* the device table keeps stale ids beyond each length; lengths make them unreachable */
  return KIVI_OK;
}

/* ---- append ---- */

/* Copies n input values of type dt to dst; returns 1 if any of them does not round to a finite
 * fp16 (the check kernel 1 makes on device inputs).  One pass: the check rides on the copy. */
static int copy_finite(void *dst, const void *src, size_t n, kivi_dtype dt) {
  uint32_t bad = 0;
  if (dt == KIVI_F32) {
    const float *s = src;
    float *d = dst;
    for (size_t j = 0; j < n; ++j) {
      const float x = s[j];
      d[j] = x;
      bad |= (uint32_t)!kivi_f32_bits_fit_f16(kivi_f32_bits(x));
    }
  } else {
    const uint16_t *s = src;
    uint16_t *d = dst;
    const uint32_t shift = dt == KIVI_BF16 ? 16u : 0u;
    for (size_t j = 0; j < n; ++j) {
      const uint16_t x = s[j];
      d[j] = x;
      bad |= shift ? (uint32_t)!kivi_f32_bits_fit_f16((uint32_t)x << shift) : (uint32_t)!kivi_f16_finite(x);
    }
  }
  return bad != 0;
}

static size_t dtype_size(kivi_dtype t) { return t == KIVI_F32 ? 4 : 2; }

/* Per-call descriptor, one int64 array uploaded at once: 7 columns of n entries. */

/* Gives back the blocks an append took (before its lengths were updated), newest first. */
static void append_undo_blocks(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new) {
  const int R = c->cfg.residual;
  for (int i = n_seqs - 1; i >= 0; --i) {
    const int64_t L0 = kivi_len(c, seq_ids[i], layer), L = kivi_qlen(c, L0), L2 = kivi_qlen(c, L0 + n_new[i]);
    int32_t *row = kivi_bt_row(c, seq_ids[i], layer);
    for (int64_t b = L2 / R - 1; b >= L / R; --b) {
      c->free_list[c->n_free++] = row[b];
      row[b] = -1;
    }
  }
}

/* Host side of an append undone after its lengths were advanced (async rollback). */
void kivi_append_rollback(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new) {
  for (int i = 0; i < n_seqs; ++i) c->len[(size_t)seq_ids[i] * c->cfg.n_layers + layer] -= n_new[i];
  append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
}

/* async: enqueue the kernels (GPU contexts), update the host side at once, no read-back. */
static kivi_status append_impl(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new,
                               const void *k, const void *v, kivi_dtype dtype, kivi_mem mem, int async) {
  if (!c || layer < 0 || layer >= c->cfg.n_layers) return KIVI_ERR_ARG;
  if (dtype != KIVI_F32 && dtype != KIVI_F16 && dtype != KIVI_BF16) return KIVI_ERR_ARG;
  if (mem != KIVI_MEM_HOST && mem != KIVI_MEM_DEVICE) return KIVI_ERR_ARG;
  kivi_status st = kivi_check_seq_ids(c, n_seqs, seq_ids);
  if (st) return st;
  if (n_seqs == 0) return KIVI_OK; /* nothing to append: seq_ids, n_new, k and v may be NULL */
  if (!n_new) return KIVI_ERR_ARG;
  const int R = c->cfg.residual, H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
  const int NL = c->cfg.n_layers;
  /* Per sequence: its new tokens go first to the sink area (positions < ns), the rest to the
   * quantized stream, whose length L (positions minus ns) the descriptor and kernels see. */
  int64_t total = 0, need_blocks = 0, nsink = 0;
  int max_new = 0; /* new tokens of the quantized stream, the most of one sequence */
  for (int i = 0; i < n_seqs; ++i) {
    if (n_new[i] < 0) return KIVI_ERR_ARG;
    const int64_t L0 = kivi_len(c, seq_ids[i], layer), L = kivi_qlen(c, L0);
    if (L0 + n_new[i] > c->cfg.max_seq_len) return KIVI_ERR_CAPACITY;
    const int64_t L2 = kivi_qlen(c, L0 + n_new[i]);
    if (L2 - L > max_new) max_new = (int)(L2 - L);
    need_blocks += L2 / R - L / R;
    nsink += n_new[i] - (L2 - L);
    total += n_new[i];
  }
  if (total == 0) return KIVI_OK;
  if (!k || !v) return KIVI_ERR_ARG;
  if (need_blocks > c->n_free) return KIVI_ERR_CAPACITY;
  /* A rotated cache appends rotated fp16 copies of host inputs (made here, copied into the
   * call's image below) and of device inputs (made on the device, below). */
  const size_t nvec = (size_t)total * c->cfg.n_kv_heads;
  const int rot = c->cfg.rotate;
  uint16_t *rot_host = NULL;
  if (rot && mem == KIVI_MEM_HOST) {
    if (!(rot_host = malloc(nvec * c->cfg.head_dim * 2 * 2))) return KIVI_ERR_NOMEM;
    kivi_rotate_host(k, dtype, rot_host, (int64_t)nvec, D, rot & KIVI_ROTATE_K);
    kivi_rotate_host(v, dtype, rot_host + nvec * D, (int64_t)nvec, D, rot & KIVI_ROTATE_V);
    k = rot_host;
    v = rot_host + nvec * D;
    dtype = KIVI_F16;
  }

  /* Host state first: the new blocks (handed back below if anything fails). */
  const kivi_context *ctx = c->ctx;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L0 = kivi_len(c, seq_ids[i], layer), L = kivi_qlen(c, L0), L2 = kivi_qlen(c, L0 + n_new[i]);
    int32_t *row = kivi_bt_row(c, seq_ids[i], layer);
    for (int64_t b = L / R; b < L2 / R; ++b) row[b] = c->free_list[--c->n_free];
  }

  /* One host image per call, [descriptor | block-table updates | raw K | raw V], copied in with
   * the first kernel's launch (host inputs are copied into it: one transfer instead of
   * several).  Device stage: [descriptor copy | fp16 K | fp16 V | V bounds or commit marks | (the
   * one-kernel append) backup of K and V ring slots]: kernel 1 fills the fp16 K and V of all new
   * tokens, or with a direct input (append.c) of the window's. */
  const size_t nel = (size_t)total * H * D, esz = dtype_size(dtype);
  const size_t n_desc = (size_t)D_NCOLS * n_seqs, n_bt = (size_t)need_blocks;
  const size_t head = ((n_desc + 2 * n_bt) * 8 + 15) & ~(size_t)15;
  const size_t raw = mem == KIVI_MEM_HOST ? (2 * nel * esz + 15) & ~(size_t)15 : 0;
  const size_t f16 = (nel * 2 + 15) & ~(size_t)15, sdesc = (n_desc * 8 + 15) & ~(size_t)15;
  unsigned char *img = malloc(head + raw);
  /* the V bounds of the four kernels ([H][2] int32) or the one-kernel append's commit marks
   * (one int32 per pair) */
  const size_t nvx = ((size_t)n_seqs * H * KIVI_XB * 4 + 15) & ~(size_t)15;
  /* the one-kernel append (at most R tokens per sequence, a small call): it runs on its layer's
   * lane and needs a backup of the ring slots it writes (as large as the fp16 stage); a larger
   * append (a prefill, four kernels) runs off the lanes, ordered with all. */
  const int fused = KIVI_APPEND_FUSED && ctx->on_gpu && max_new <= R && nel <= KIVI_APPEND_FUSED_MAX &&
                    n_seqs <= KIVI_APPEND_FUSED_SEQS;
  const int lane = kivi_lane_of(c, layer, fused);
  kivi_scratch *stage = &kivi_lane_at(c, lane)->stage, *rst = &kivi_lane_at(c, lane)->rot;
  if (!img || kivi_async_reserve(c, stage, sdesc + 2 * f16 + nvx + (fused ? 2 * f16 : 0)) ||
      (rot && mem == KIVI_MEM_DEVICE && kivi_async_reserve(c, rst, 2 * f16))) {
    free(img);
    free(rot_host);
    append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
    return KIVI_ERR_NOMEM;
  }
  if (rot && mem == KIVI_MEM_DEVICE) { /* before this call's kernels, on its lane */
    uint16_t *rk = rst->p, *rv = rk + f16 / 2;
    kivi_rotate_rows(c, k, dtype, rk, KIVI_F16, (int64_t)nvec, rot & KIVI_ROTATE_K, async, lane);
    kivi_rotate_rows(c, v, dtype, rv, KIVI_F16, (int64_t)nvec, rot & KIVI_ROTATE_V, async, lane);
    k = rk;
    v = rv;
    dtype = KIVI_F16;
  }
  int64_t *col[D_NCOLS];
  for (int j = 0; j < D_NCOLS; ++j) col[j] = (int64_t *)img + (size_t)j * n_seqs;
  int64_t *btu = (int64_t *)img + n_desc; /* pairs (index into bt, block id) */
  int64_t stage_tok = 0, kb = 0, vq = 0;
  size_t u = 0;
  /* the sink image: [(sink offset of head 0, input row) per sink token | with a host input its
   * fp16 K rows, then V rows ([nsink][H][D] each)] */
  const size_t stab = ((size_t)nsink * 16 + 15) & ~(size_t)15, n_simg = nsink ? stab + (mem == KIVI_MEM_HOST ? 2 * (size_t)nsink * H * D * 2 : 0) : 0;
  unsigned char *simg = nsink ? malloc(n_simg) : NULL;
  if (nsink && !simg) {
    free(img);
    free(rot_host);
    append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
    return KIVI_ERR_NOMEM;
  }
  int64_t sk = 0;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L0 = kivi_len(c, seq_ids[i], layer), L = kivi_qlen(c, L0), L2 = kivi_qlen(c, L0 + n_new[i]);
    const int64_t vb0 = L > R ? L - R : 0, vb1 = L2 > R ? L2 - R : 0, nsk = n_new[i] - (L2 - L);
    for (int64_t t = 0; t < nsk; ++t, ++sk) {
      ((int64_t *)simg)[2 * sk] = (int64_t)kivi_sink_at(c, seq_ids[i], layer, 0) + (L0 + t) * D;
      ((int64_t *)simg)[2 * sk + 1] = stage_tok + t;
      if (mem == KIVI_MEM_HOST) { /* checked below with the whole input */
        uint16_t *sh = (uint16_t *)(simg + stab);
        for (int64_t e = 0; e < (int64_t)H * D; ++e) {
          const int64_t j = (stage_tok + t) * H * D + e;
          sh[sk * H * D + e] = kivi_in_f16(k, j, (int)dtype);
          sh[(nsink + sk) * H * D + e] = kivi_in_f16(v, j, (int)dtype);
        }
      }
    }
    col[D_SEQ][i] = seq_ids[i];
    col[D_L][i] = L;
    col[D_N][i] = L2 - L;
    col[D_STAGE][i] = stage_tok + nsk;
    col[D_KBPRE][i] = kb;
    col[D_VQPRE][i] = vq;
    col[D_VQBEG][i] = vb0;
    stage_tok += n_new[i];
    kb += L2 / R - L / R;
    vq += vb1 - vb0;
    const int32_t *row = kivi_bt_row(c, seq_ids[i], layer);
    for (int64_t b = L / R; b < L2 / R; ++b, ++u) {
      btu[2 * u] = ((int64_t)seq_ids[i] * NL + layer) * c->max_blocks + b;
      btu[2 * u + 1] = row[b];
    }
  }
  /* a host input is checked here, as it is copied: a non-finite one fails the call itself */
  if (mem == KIVI_MEM_HOST &&
      (copy_finite(img + head, k, nel, dtype) | copy_finite(img + head + nel * esz, v, nel, dtype))) {
    free(img);
    free(simg);
    free(rot_host);
    append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
    return KIVI_ERR_NONFINITE;
  }
  free(rot_host); /* copied into the image */
  const int64_t call_id = ++c->next_id;
  if (async && simg && kivi_async_keep(c, simg)) { /* (which frees it) */
    free(img);
    append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
    return KIVI_ERR_NOMEM;
  }
  if (async && (kivi_async_keep(c, img) || kivi_async_log_append(c, call_id, layer, n_seqs, seq_ids, n_new))) {
    append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
    return KIVI_ERR_NOMEM;
  }
  const int host_in = mem == KIVI_MEM_HOST;
  /* the layer's flag: 0 between calls, or the id of its first failed enqueued append; and the
   * lane's arrival counter of the one-kernel append */
  const kivi_append_job job = {.layer = layer, .n_seqs = n_seqs, .dtype = dtype, .host_in = host_in, .fused = fused,
                               .max_new = max_new, .call_id = call_id, .kdev = host_in ? NULL : k,
                               .vdev = host_in ? NULL : v, .img = img, .simg = simg, .n_img = head + raw, .head = head,
                               .nel = nel, .esz = esz, .n_desc = n_desc, .n_bt = n_bt, .n_simg = n_simg, .stab = stab,
                               .nsink = nsink, .stage = stage->p, .sdesc = sdesc, .f16 = f16, .nvx = nvx,
                               .flag = c->aflag + layer, .arrive = c->aflag + NL + (lane < 0 ? 0 : lane),
                               .n_kb = kb, .n_vq = vq};
  /* the flag after the kernels (synchronous calls) */
  const int64_t flag_out = kivi_append_run(c, &job, async, lane);

  /* Was the input finite?  If not, the kernels changed nothing but block-table entries past
   * the lengths: give the blocks back and clear the flag.  (Enqueued: the wait checks the flag
   * and undoes this append if it failed.) */
  if (!async) {
    free(img);
    free(simg);
    if (flag_out) {
      const int64_t zero = 0;
      append_undo_blocks(c, layer, n_seqs, seq_ids, n_new);
      return kivi_dev_put(ctx, job.flag, &zero, sizeof zero) ? KIVI_ERR_DEVICE : KIVI_ERR_NONFINITE;
    }
  }
  for (int i = 0; i < n_seqs; ++i) c->len[(size_t)seq_ids[i] * NL + layer] += n_new[i];
  if (async) ++c->pending;
  return KIVI_OK;
}

kivi_status kivi_cache_append(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new,
                              const void *k, const void *v, kivi_dtype dtype, kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 0, &run);
  return st ? st : kivi_call_end(c, 0, append_impl(c, layer, n_seqs, seq_ids, n_new, k, v, dtype, mem, run));
}

kivi_status kivi_cache_append_async(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *n_new,
                                    const void *k, const void *v, kivi_dtype dtype, kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 1, &run);
  return st ? st : kivi_call_end(c, 1, append_impl(c, layer, n_seqs, seq_ids, n_new, k, v, dtype, mem, run));
}

kivi_status kivi_cache_last_kernels(const kivi_cache *c, unsigned *kernels) {
  if (!c || !kernels) return KIVI_ERR_ARG;
  *kernels = c->last_kernels;
  return KIVI_OK;
}

/* ---- the stream route (stream.c) ---- */

kivi_status kivi_cache_set_stream(kivi_cache *c, void *stream) {
  if (!c) return KIVI_ERR_ARG;
  kivi_status st = kivi_async_drain(c);
  if (st) return st;
  kivi_stream *s = NULL;
  if (stream && (st = kivi_stream_open(c, stream, &s))) return st;
  kivi_stream_close(c->stream);
  c->stream = s;
  return KIVI_OK;
}

kivi_status kivi_cache_stream_begin(kivi_cache *c) {
  if (!c || !c->stream) return KIVI_ERR_ARG;
  return kivi_stream_scope(c, 1) ? KIVI_ERR_DEVICE : KIVI_OK;
}

kivi_status kivi_cache_stream_end(kivi_cache *c) {
  if (!c || !c->stream || kivi_stream_scope(c, 0)) return KIVI_ERR_ARG;
  return KIVI_OK;
}

kivi_status kivi_cache_get_stream(const kivi_cache *c, void **stream) {
  if (!c || !stream) return KIVI_ERR_ARG;
  *stream = kivi_stream_handle(c);
  return KIVI_OK;
}

/* ---- accounting ---- */

kivi_status kivi_cache_get_stats(const kivi_cache *c, kivi_cache_stats *s) {
  if (!c || !s) return KIVI_ERR_ARG;
  memset(s, 0, sizeof *s);
  const kivi_layout *l = &c->lay;
  const int R = l->R, G = l->G, H = l->H, D = l->D;
  const size_t ksz_tok = l->kb < 16 ? (size_t)2 * D * 2 : 0; /* per group of G tokens */
  const size_t vsz_tok = l->vb < 16 ? (size_t)(D / G) * 2 * 2 : 0;
  int64_t blocks_used = 0, seqs_used = 0;
  for (int q = 0; q < c->cfg.max_seqs; ++q) {
    int used = 0;
    for (int y = 0; y < c->cfg.n_layers; ++y) {
      const int64_t L0 = kivi_len(c, q, y), L = kivi_qlen(c, L0); /* L: the quantized stream */
      if (!L0) continue;
      used = 1;
      const int64_t Lk = L - L % R, Lv = L > R ? L - R : 0;
      s->tokens += L0;
      s->code_bytes += (size_t)H * ((size_t)Lk * l->kw * 4 + (size_t)Lv * l->vw * 4);
      s->scale_zero_bytes += (size_t)H * ((size_t)(Lk / G) * ksz_tok + (size_t)Lv * vsz_tok);
      s->residual_bytes += (size_t)H * (size_t)((L - Lk) + (L - Lv) + 2 * (L0 - L)) * D * 2;
      blocks_used += L / R;
    }
    seqs_used += used;
  }
  s->bookkeeping_bytes = (size_t)blocks_used * 4 + (size_t)seqs_used * c->cfg.n_layers * 4;
  s->total_bytes = s->code_bytes + s->scale_zero_bytes + s->residual_bytes + s->bookkeeping_bytes;
  s->fp16_bytes = (size_t)s->tokens * H * D * 2 * 2;
  s->bits_per_element = s->tokens ? (double)s->total_bytes * 8.0 / (2.0 * (double)s->tokens * H * D) : 0.0;
  const size_t ring = (size_t)c->cfg.max_seqs * c->cfg.n_layers * H * R * D * 2;
  const size_t sink = (size_t)c->cfg.max_seqs * c->cfg.n_layers * H * c->ns * D * 2;
  s->allocated_bytes = (size_t)c->n_blocks * l->block_bytes + 2 * ring + 2 * sink +
                       (size_t)c->cfg.max_seqs * c->cfg.n_layers * (c->max_blocks ? c->max_blocks : 1) * 4;
  s->free_blocks = c->n_free;
  s->total_blocks = c->n_blocks;
  kivi_stream_counts(c, &s->stream_kernels, &s->stream_waits);
  return KIVI_OK;
}

/* ---- export / import: the packed state of one (sequence, layer), docs/FORMAT.md ---- */

size_t kivi_export_size(const kivi_cache *c, int64_t L0) {
  const kivi_layout *l = &c->lay;
  const int64_t L = kivi_qlen(c, L0), Lk = L - L % l->R, Lv = L > l->R ? L - l->R : 0;
  const size_t per_head = (size_t)Lk * l->kw * 4 + (l->kb < 16 ? (size_t)(Lk / l->G) * 2 * l->D * 2 : 0) +
                          (size_t)Lv * l->vw * 4 + (l->vb < 16 ? (size_t)Lv * (l->D / l->G) * 4 : 0) +
                          (size_t)((L - Lk) + (L - Lv) + 2 * (L0 - L)) * l->D * 2;
  return per_head * l->H;
}

/* Walks the export layout of (seq, layer) with length L: for every piece, `copy(export offset,
 * device address, bytes)` on host staging images of the blocks and rings.  Blocks and rings
 * cross the bus whole (one copy each), not piece by piece. */
typedef struct seq_images {
  unsigned char *blocks; /* floor(L/R) blocks, block_bytes each (L: the quantized stream) */
  uint16_t *kring, *vring; /* H rings of R x D */
  uint16_t *ksink, *vsink; /* H sink areas of ns x D (NULL without sinks) */
} seq_images;

static void walk_export(const kivi_cache *c, int64_t L0, seq_images *im, unsigned char *e, int to_export) {
  const kivi_layout *l = &c->lay;
  const int R = l->R, G = l->G, D = l->D, H = l->H;
  const int64_t L = kivi_qlen(c, L0), Ls = L0 - L;
  const int64_t Lk = L - L % R, Lv = L > R ? L - R : 0;
  const size_t kcode_blk = (size_t)R * l->kw * 4, ksz_blk = l->vcode_off - l->ksz_off;
  const size_t vcode_tok = (size_t)l->vw * 4, vsz_tok = l->vb < 16 ? (size_t)(D / G) * 4 : 0;
#define MOVE(img_, n_)                          \
  do {                                          \
    if (to_export) memcpy(e, (img_), (n_));     \
    else memcpy((img_), e, (n_));               \
    e += (n_);                                  \
  } while (0)
  for (int h = 0; h < H; ++h) {
    unsigned char *sub = im->blocks + (size_t)h * l->sub_bytes;
    if (Ls) {
      MOVE(im->ksink + (size_t)h * c->ns * D, (size_t)Ls * D * 2);
      MOVE(im->vsink + (size_t)h * c->ns * D, (size_t)Ls * D * 2);
    }
    for (int64_t b = 0; b < Lk / R; ++b) MOVE(sub + (size_t)b * l->block_bytes + l->kcode_off, kcode_blk);
    for (int64_t b = 0; b < Lk / R; ++b) MOVE(sub + (size_t)b * l->block_bytes + l->ksz_off, ksz_blk);
    for (int64_t p = 0; p < Lv; p += R) {
      const size_t nt = (size_t)(Lv - p < R ? Lv - p : R);
      MOVE(sub + (size_t)(p / R) * l->block_bytes + l->vcode_off, nt * vcode_tok);
    }
    for (int64_t p = 0; p < Lv && vsz_tok; p += R) {
      const size_t nt = (size_t)(Lv - p < R ? Lv - p : R);
      MOVE(sub + (size_t)(p / R) * l->block_bytes + l->vsz_off, nt * vsz_tok);
    }
    for (int64_t p = Lk; p < L; ++p) MOVE(im->kring + ((size_t)h * R + (size_t)(p % R)) * D, (size_t)D * 2);
    for (int64_t p = Lv; p < L; ++p) MOVE(im->vring + ((size_t)h * R + (size_t)(p % R)) * D, (size_t)D * 2);
  }
#undef MOVE
}

static int images_alloc(const kivi_cache *c, int64_t L0, seq_images *im) {
  const size_t ring = (size_t)c->lay.H * c->lay.R * c->lay.D, sink = (size_t)c->lay.H * c->ns * c->lay.D;
  im->blocks = malloc((size_t)(kivi_qlen(c, L0) / c->lay.R + 1) * c->lay.block_bytes);
  im->kring = calloc(ring, 2);
  im->vring = calloc(ring, 2);
  im->ksink = sink ? calloc(sink, 2) : NULL;
  im->vsink = sink ? calloc(sink, 2) : NULL;
  return im->blocks && im->kring && im->vring && (!sink || (im->ksink && im->vsink)) ? 0 : -1;
}

static void images_free(seq_images *im) {
  free(im->blocks);
  free(im->kring);
  free(im->vring);
  free(im->ksink);
  free(im->vsink);
}

kivi_status kivi_cache_export_seq(const kivi_cache *c, int seq, int layer, void *buf, size_t *bytes) {
  if (!c || !bytes || seq < 0 || seq >= c->cfg.max_seqs || layer < 0 || layer >= c->cfg.n_layers)
    return KIVI_ERR_ARG;
  const kivi_status wst = kivi_async_drain((kivi_cache *)c); /* enqueued work first */
  if (wst) return wst;
  const int64_t L = kivi_len(c, seq, layer);
  const size_t need = kivi_export_size(c, L);
  if (!buf) {
    *bytes = need;
    return KIVI_OK;
  }
  if (*bytes < need) {
    *bytes = need; /* the size needed, as for buf == NULL */
    return KIVI_ERR_BUFFER;
  }
  const kivi_layout *l = &c->lay;
  seq_images im;
  if (images_alloc(c, L, &im)) {
    images_free(&im);
    return KIVI_ERR_NOMEM;
  }
  const int32_t *row = kivi_bt_row(c, seq, layer);
  const size_t ring = (((size_t)seq * c->cfg.n_layers + layer) * l->H) * (size_t)l->R * l->D;
  const size_t sink = (size_t)l->H * c->ns * l->D * 2;
  int err = 0;
  if (sink) err = kivi_dev_get(c->ctx, im.ksink, c->ksink + kivi_sink_at(c, seq, layer, 0), sink) ||
                  kivi_dev_get(c->ctx, im.vsink, c->vsink + kivi_sink_at(c, seq, layer, 0), sink);
  for (int64_t b = 0; b < kivi_qlen(c, L) / l->R && !err; ++b)
    err = kivi_dev_get(c->ctx, im.blocks + (size_t)b * l->block_bytes, c->pool + (size_t)row[b] * l->block_bytes,
                       l->block_bytes);
  if (!err) err = kivi_dev_get(c->ctx, im.kring, c->kres + ring, (size_t)l->H * l->R * l->D * 2);
  if (!err) err = kivi_dev_get(c->ctx, im.vring, c->vres + ring, (size_t)l->H * l->R * l->D * 2);
  if (!err) walk_export(c, L, &im, buf, 1);
  images_free(&im);
  if (err) return KIVI_ERR_DEVICE;
  *bytes = need;
  return KIVI_OK;
}

/* Replaces (seq, layer) with an exported state of length L (validated by the caller: the blob
 * has kivi_export_size(L) bytes, L <= max_seq_len, and floor(L/R) blocks are free once the
 * sequence's own blocks are returned).  Builds the blocks and rings on the host, uploads them
 * whole, then updates the tables and the exponent bounds. */
kivi_status kivi_import_seq(kivi_cache *c, int seq, int layer, int64_t L, const void *blob) {
  const kivi_layout *l = &c->lay;
  const int R = l->R, G = l->G, D = l->D, H = l->H, NL = c->cfg.n_layers;
  seq_images im;
  if (images_alloc(c, L, &im)) {
    images_free(&im);
    return KIVI_ERR_NOMEM;
  }
  const int64_t Lq = kivi_qlen(c, L); /* the quantized stream */
  memset(im.blocks, 0, (size_t)(Lq / R + 1) * l->block_bytes);
  walk_export(c, L, &im, (unsigned char *)blob, 0);
  /* exponent bounds of the sequence's V scales and zeros and K scales: [H][KIVI_XB], replacing
   * its old ones */
  int32_t *vexp_new = malloc((size_t)H * KIVI_XB * sizeof(int32_t));
  if (!vexp_new) {
    images_free(&im);
    return KIVI_ERR_NOMEM;
  }
  const int64_t Lv = Lq > R ? Lq - R : 0;
  for (int h = 0; h < H; ++h) {
    int32_t *xb = vexp_new + (size_t)h * KIVI_XB;
    xb[0] = xb[1] = xb[2] = xb[3] = -14;
    for (int64_t p = 0; p < Lv && l->vb < 16; ++p) {
      const uint16_t *sz = kivi_vscales_at(im.blocks + (size_t)(p / R) * l->block_bytes + (size_t)h * l->sub_bytes, l,
                                           (int)(p % R));
      for (int g = 0; g < D / G; ++g) kivi_vexp_fold(xb, sz + 2 * g);
    }
    for (int64_t p = 0; p + G <= Lq - Lq % R && l->kb < 16; p += G) { /* the K scales of each group */
      const uint16_t *sc = kivi_kscales_at(im.blocks + (size_t)(p / R) * l->block_bytes + (size_t)h * l->sub_bytes, l,
                                           (int)(p % R / G), 0);
      kivi_kexp_fold(&xb[2], sc, D);
    }
  }
  const kivi_context *ctx = c->ctx;
  /* return the sequence's blocks, take new ones */
  int32_t *row = kivi_bt_row(c, seq, layer);
  const int64_t nb_old = kivi_qlen(c, kivi_len(c, seq, layer)) / R, nb = Lq / R;
  for (int64_t b = 0; b < nb_old; ++b) {
    c->free_list[c->n_free++] = row[b];
    row[b] = -1;
  }
  for (int64_t b = 0; b < nb; ++b) row[b] = c->free_list[--c->n_free];
  c->len[(size_t)seq * NL + layer] = (int32_t)L;
  const size_t ring = (((size_t)seq * NL + layer) * H) * (size_t)R * D;
  int err = 0;
  for (int64_t b = 0; b < nb && !err; ++b)
    err = kivi_dev_put(ctx, c->pool + (size_t)row[b] * l->block_bytes, im.blocks + (size_t)b * l->block_bytes,
                       l->block_bytes);
  if (!err && nb) err = kivi_dev_put(ctx, c->bt + ((size_t)seq * NL + layer) * c->max_blocks, row, (size_t)nb * 4);
  if (!err) err = kivi_dev_put(ctx, c->kres + ring, im.kring, (size_t)H * R * D * 2);
  if (!err) err = kivi_dev_put(ctx, c->vres + ring, im.vring, (size_t)H * R * D * 2);
  if (!err) err = kivi_dev_put(ctx, c->vexp + KIVI_VEXP_AT(seq, layer, NL, H), vexp_new, (size_t)H * KIVI_XB * 4);
  const size_t sink = (size_t)H * c->ns * D * 2;
  if (!err && sink) err = kivi_dev_put(ctx, c->ksink + kivi_sink_at(c, seq, layer, 0), im.ksink, sink) ||
                          kivi_dev_put(ctx, c->vsink + kivi_sink_at(c, seq, layer, 0), im.vsink, sink);
  images_free(&im);
  free(vexp_new);
  if (err) {
    /* a failed copy leaves this sequence empty rather than half-written */
    for (int64_t b = 0; b < nb; ++b) {
      c->free_list[c->n_free++] = row[b];
      row[b] = -1;
    }
    c->len[(size_t)seq * NL + layer] = 0;
    return KIVI_ERR_DEVICE;
  }
  return KIVI_OK;
}
