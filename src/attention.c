/* Fused dequant-attention over the packed cache (flash-decoding), decode and extend.
 *
 * Both calls become "rows": one query token of one sequence that sees Lc cached tokens plus e
 * new fp32 tokens (decode: e = 0; extend: new token j sees e = j + 1).  A work item is
 * (row, kv-head, chunk of that kv-head's query heads, split of the tokens); it reads each K/V
 * token of its split once for all query heads of the chunk (GQA), keeps the split's logits in
 * team-shared memory, takes one softmax over them, and writes a partial (o, m, l) per query
 * head.  The last item of each (row, kv-head, head chunk) to finish (an atomic counter per
 * group, reset by that item) combines the group's splits in the same launch: one launch per
 * step.  With the GPU fast path (attention_gpu.c) a decode call is that kernel alone (it also
 * combines); an extend call runs it first for the first partial slots, then the portable one.
 *
 * Manifest (device memory):
 *   pool, bt, kres, vres   the cache (cache.c)
 *   q      [rows][HQ][D] f32 queries          kn, vn [new tokens][H][D] f32 (extend only)
 *   part_o [rows][HQ][nslots][D] f32          part_ml [rows][HQ][nslots][2] f32 (m, l; base 2)
 *   out    [rows][HQ][D] f32 or f16           lse [rows][HQ] f32 (optional)
 *   dd     [6][rows] int64: seq, Lc (tokens of the quantized stream), e, first new token of the
 *          row's sequence, first token of the portable kernel (after the fast path's share),
 *          sink tokens; uploaded only when the portable kernel runs (the fast and sink kernels
 *          map the host copy with their launches)
 *   ksink, vsink  the sink tokens (cache.c); with sinks, slot nslots - 1 of every (row, head)
 *          is theirs (attention_sink.inc, before the other kernels), the combines take it in
 *   cnt    [rows][H][head chunks] u32 arrival counters, zero between calls ([rows][HQ] for
 *          the fused fast kernel) */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "kernels_attn.h"

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

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

#pragma omp declare target
/* All-reduce (max or sum) over the threads of a team; every thread must call it. */
static inline float kivi_team_reduce(float v, int is_max, float *red, int tid, int nth) {
#if defined(__NVPTX__)
  if ((nth & 31) == 0) {
    for (int o = 16; o > 0; o >>= 1) {
      const float w = __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f);
      v = is_max ? fmaxf(v, w) : v + w;
    }
    if ((tid & 31) == 0) red[tid >> 5] = v;
#pragma omp barrier
    float r = red[0];
    for (int i = 1; i < (nth >> 5); ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
#pragma omp barrier
    return r;
  }
#endif
  red[tid] = v;
#pragma omp barrier
  float r = red[0];
  for (int i = 1; i < nth; ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
#pragma omp barrier
  return r;
}
#pragma omp end declare target

/* Heads per item and tokens per split: the split's logits of all the item's heads must fit in
 * KIVI_ATT_PCAP, and there must be enough items to fill the device. */
typedef struct att_plan {
  int hc, nqc;
  int64_t nsplit, split_len, nitems; /* the portable kernel's splits of [R_BEG, T) */
  int nf, fs;                        /* GPU fast-path splits before them (0: none), their length */
  int fused;                         /* decode on the fast path: one launch does all (nsplit = 0) */
  int gqa;                           /* the fast path's kernel is the GQA kernel (decode_gqa.c) */
  int ntail;                         /* its tail blocks per (row, kv-head, chunk) in a decode call */
  int f16;                           /* the fp16 cache's kernel (attention_f16.inc; fused, nf splits) */
  int newk;                          /* extend: the new tokens on the GPU (attention_new.inc), slot nslots - 1 - sink */
  int sink;                          /* the sink tokens' partials (attention_sink.inc), slot nslots - 1 */
  int new_seqs, new_tiles;           /* its sequences and tiles of query rows */
  int64_t new_pad;                   /* its staging rows (each sequence's new tokens padded to 32) */
  int64_t nslots;                    /* partials per (row, head): nf + nsplit (+ 1 newk), or nf + 1 fused; + 1 sink */
} att_plan;

static att_plan plan_rows(const kivi_cache *c, int rows, int64_t maxT, int HQ, int on_gpu) {
  const int D = c->cfg.head_dim, H = c->cfg.n_kv_heads, G = c->cfg.group, gsz = HQ / H;
  att_plan p;
  p.hc = gsz;
  if (p.hc > KIVI_ATT_HC) p.hc = KIVI_ATT_HC;
  if (p.hc > KIVI_ATT_QCAP / D) p.hc = KIVI_ATT_QCAP / D;
  if (p.hc > KIVI_ATT_QSCAP / ((KIVI_ATT_TILE / G) * D)) p.hc = KIVI_ATT_QSCAP / ((KIVI_ATT_TILE / G) * D);
  p.nqc = (gsz + p.hc - 1) / p.hc;
  const int64_t base = (int64_t)rows * H * p.nqc;
  const int64_t cap = (KIVI_ATT_PCAP / p.hc) / KIVI_ATT_TILE * KIVI_ATT_TILE; /* >= 512 */
  const int64_t want_items = on_gpu ? KIVI_ATT_GPU_ITEMS : 4 * (int64_t)omp_get_max_threads();
  int64_t want = (want_items + base - 1) / base; /* splits per row for enough items */
  int64_t len = (maxT + want - 1) / want;
  len = (len + KIVI_ATT_TILE - 1) / KIVI_ATT_TILE * KIVI_ATT_TILE;
  if (len < 512) len = 512; /* shorter splits cost more in combining than they give */
  if (len > cap) len = cap;
  p.split_len = len;
  p.nsplit = (maxT + len - 1) / len;
  p.nitems = base * p.nsplit;
  return p; /* nf, fs and nslots: plan_call */
}

/* Host input to device memory: a synchronous copy, or (async) a copy the cache keeps until the
 * wait, uploaded in order.  KIVI_ERR_NOMEM / KIVI_ERR_DEVICE on failure. */
static kivi_status put_input(kivi_cache *c, int async, int lane, void *dst, const void *src, size_t bytes) {
  if (async == KIVI_RUN_SYNC) return kivi_dev_put(c->ctx, dst, src, bytes) ? KIVI_ERR_DEVICE : KIVI_OK;
  if (async == KIVI_RUN_STREAM) return kivi_stream_put(c, dst, src, bytes) ? KIVI_ERR_DEVICE : KIVI_OK;
  const void *k = kivi_async_keep_copy(c, src, bytes);
  if (!k) return KIVI_ERR_NOMEM;
  kivi_async_put(c, lane, dst, k, bytes);
  return KIVI_OK;
}

static int get_output(kivi_cache *c, int async, int lane, void *dst, const void *src, size_t bytes) {
  if (async == KIVI_RUN_SYNC) return kivi_dev_get(c->ctx, dst, src, bytes);
  if (async == KIVI_RUN_STREAM) return kivi_stream_get(c, dst, src, bytes);
  kivi_async_get(c, lane, dst, src, bytes);
  return 0;
}

/* The new tokens of an extend call on the GPU (att_plan.newk): the table of sequences and tiles
 * (internal.h, kivi_gpu_extend_new), the tiles with the most keys first, and the launch; the
 * staging buffers start at st (16-byte aligned), after the partials. */
typedef struct new_tile {
  int32_t row, n, seq, keys;
} new_tile;
static int new_tile_cmp(const void *a, const void *b) {
  const new_tile *x = a, *y = b;
  return (x->keys < y->keys) - (x->keys > y->keys);
}
/* staging: keys | values (each two f16 parts of H x new_pad x head_dim) | exponents */
static size_t new_part_bytes(const kivi_cache *c, const att_plan *p) {
  return pad16(2 * (size_t)c->cfg.n_kv_heads * p->new_pad * c->cfg.head_dim * 2);
}
static size_t new_stage_bytes(const kivi_cache *c, const att_plan *p) {
  return 2 * new_part_bytes(c, p) + pad16((size_t)c->cfg.n_kv_heads * (p->new_pad / 32) * 8);
}
static kivi_status run_new(kivi_cache *c, int rows, const int64_t *hd, const att_plan *pl, int HQ, const float *q,
                           const float *kn, const float *vn, float qmul, unsigned char *st, float *part_o, float *part_ml,
                           float *out, float *lse, int async, int lane) {
  const int ns = pl->new_seqs, nt = pl->new_tiles;
  const size_t ntab = 3 * (size_t)(ns + nt) + 2 * (size_t)(pl->new_pad / 32);
  int32_t *tab = malloc(ntab * 4);
  new_tile *tl = malloc(sizeof(new_tile) * (size_t)nt);
  if (!tab || !tl) {
    free(tab);
    free(tl);
    return KIVI_ERR_NOMEM;
  }
  int si = 0, ti = 0;
  int64_t pofs = 0;
  for (int r = 0; r < rows; ++si) { /* rows are grouped by sequence, new tokens in order */
    int n = 1;
    while (r + n < rows && hd[R_E * (int64_t)rows + r + n] == n + 1) ++n;
    tab[3 * si] = r;
    tab[3 * si + 1] = n;
    tab[3 * si + 2] = (int32_t)pofs;
    for (int j = 0; j < n; j += KIVI_NEW_TILE, ++ti) {
      const int m = n - j < KIVI_NEW_TILE ? n - j : KIVI_NEW_TILE;
      tl[ti] = (new_tile){r + j, m, si, j + m};
    }
    for (int j = 0; j < n; j += 32) { /* staging tiles */
      int32_t *e = tab + 3 * (size_t)(ns + nt) + 2 * (size_t)((pofs + j) / 32);
      e[0] = r + j;
      e[1] = n - j < 32 ? n - j : 32;
    }
    pofs += (n + 31) / 32 * 32;
    r += n;
  }
  qsort(tl, (size_t)nt, sizeof *tl, new_tile_cmp);
  for (int i = 0; i < nt; ++i) {
    tab[3 * (ns + i)] = tl[i].row;
    tab[3 * (ns + i) + 1] = tl[i].n;
    tab[3 * (ns + i) + 2] = tl[i].seq;
  }
  free(tl);
  const int32_t *tk = async == KIVI_RUN_ENQUEUE ? kivi_async_keep_copy(c, tab, ntab * 4) : tab;
  if (!tk) {
    free(tab);
    return KIVI_ERR_NOMEM;
  }
  const size_t part = new_part_bytes(c, pl);
  kivi_gpu_extend_new(c, tk, ns, nt, pl->new_pad, HQ, q, kn, vn, qmul, (uint16_t *)st, (uint16_t *)(st + part),
                      (int32_t *)(st + 2 * part), part_o, part_ml, pl->nslots, pl->nslots - 1 - pl->sink, out, lse, async,
                      lane);
  free(tab);
  return KIVI_OK;
}

/* Shared by decode and extend once the rows are described; q/k_new/v_new/out/lse are device
 * pointers or NULL. */
static kivi_status run_rows(kivi_cache *c, int layer, int rows, const int64_t *hd, const att_plan *pl, int HQ,
                            const float *q, const float *kn, const float *vn, float scale, void *out, int out_f16,
                            float *lse, unsigned char *scratch, int async, int lane) {
  const kivi_context *ctx = c->ctx;
  const kivi_layout lay = c->lay;
  const int H = lay.H, D = lay.D, R = lay.R, G = lay.G, NL = c->cfg.n_layers, MB = c->max_blocks;
  const int gsz = HQ / H, hc = pl->hc, nqc = pl->nqc, TG = KIVI_ATT_TILE / G;
  const int64_t nsplit = pl->nsplit, split_len = pl->split_len, nitems = pl->nitems;
  const int64_t nslots = pl->nslots, slot0 = pl->nf;

  /* per-group arrival counters, zero between calls (the last item resets its own); the fused
   * fast kernel counts per (row, query head) */
  int64_t ngroups = (int64_t)rows * H * nqc;
  if (pl->fused && (int64_t)rows * HQ > ngroups) ngroups = (int64_t)rows * HQ;
  kivi_scratch *cs = &kivi_lane_at(c, lane)->cnt;
  if ((size_t)ngroups * 4 > cs->bytes) {
    if (kivi_async_reserve(c, cs, (size_t)ngroups * 4)) return KIVI_ERR_NOMEM;
    unsigned *zeros = calloc((size_t)ngroups, 4);
    const int err = !zeros || kivi_dev_put(ctx, cs->p, zeros, (size_t)ngroups * 4);
    free(zeros);
    if (err) {
      kivi_scratch_free(ctx, cs);
      return KIVI_ERR_DEVICE;
    }
  }
  unsigned *cnt = cs->p;

  /* scratch: dd | part_o | part_ml */
  int64_t *dd = (int64_t *)scratch;
  float *part_o = (float *)(scratch + pad16((size_t)R_NCOLS * rows * 8));
  float *part_ml = part_o + (size_t)rows * HQ * nslots * D;
  /* the descriptor: uploaded for the portable kernel, copied in with the fast kernel's launch */
  const size_t ddn = (size_t)R_NCOLS * rows;
  if (nitems > 0) {
    const kivi_status pst = put_input(c, async, lane, dd, hd, ddn * 8);
    if (pst) return pst;
  }
  const float qmul = scale * 1.4426950408889634f; /* base-2 softmax */
  if (pl->sink) { /* the sink tokens' partials, before the kernels whose combines read them */
    const int64_t *sd = async == KIVI_RUN_ENQUEUE ? kivi_async_keep_copy(c, hd, ddn * 8) : hd;
    if (!sd) return KIVI_ERR_NOMEM;
    const uint16_t *ksink = c->ksink, *vsink = c->vsink;
    const int64_t nsi = (int64_t)rows * HQ * D, sslot = nslots - 1, ndd = (int64_t)ddn;
    const int ns = c->ns, dev = ctx->device;
    if (!ctx->on_gpu || kivi_gpu_sink_partials(c, layer, rows, HQ, sd, ndd, R_SEQ, R_NS, q, qmul, part_o, part_ml,
                                               nslots, async, lane)) {
#define KIVI_REGION_FILE "attention_sink.inc"
#include "region_twice.inc"
#undef KIVI_REGION_FILE
    }
  }
  const int fastk = pl->nf > 0 || pl->fused; /* the fast path's kernel runs */
  if (fastk) {
    /* enqueued: a copy kept until the wait (the stream route copies it at the launch) */
    const int64_t *hdk = async == KIVI_RUN_ENQUEUE ? kivi_async_keep_copy(c, hd, ddn * 8) : hd;
    if (!hdk) return KIVI_ERR_NOMEM;
    if (pl->f16)
      kivi_gpu_f16_decode(c, layer, rows, HQ, hdk, (int64_t)ddn, R_SEQ, R_LC, pl->fs, pl->nf, q, qmul, part_o, part_ml,
                          cnt, out, out_f16, async, lane);
    else
      kivi_gpu_gqa_decode(c, layer, rows, HQ, hdk, (int64_t)ddn, R_SEQ, R_BEG, R_LC, pl->fs, pl->nf, pl->ntail,
                          (int)nslots, q, qmul, part_o, part_ml, cnt, pl->fused ? out : NULL, out_f16, async, lane);

  }
  c->last_kernels = pl->f16 ? KIVI_KERNEL_GPU_F16
                            : (nitems > 0 ? KIVI_KERNEL_PORTABLE : 0u) | (fastk ? KIVI_KERNEL_GPU_F16X2 : 0u) |
                                  (fastk && pl->gqa ? KIVI_KERNEL_GPU_GQA : 0u) | (pl->newk ? KIVI_KERNEL_GPU_NEW : 0u);
  if (pl->newk) { /* the new tokens' partials (or, alone, the output) before the portable kernel combines */
    unsigned char *stage = scratch + pad16((size_t)R_NCOLS * rows * 8) + pad16((size_t)rows * HQ * nslots * (D + 2) * 4);
    const kivi_status nst = run_new(c, rows, hd, pl, HQ, q, kn, vn, qmul, stage, part_o, part_ml, (float *)out, lse, async, lane);
    if (nst) return nst;
  }
  if (nitems == 0) return KIVI_OK;

  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const size_t sub = lay.sub_bytes, ksz_off = lay.ksz_off, vcode_off = lay.vcode_off, vsz_off = lay.vsz_off;
  const int kb = lay.kb, vb = lay.vb, kw = lay.kw, vw = lay.vw;
  const int pe = !pl->newk; /* the portable kernel takes the new tokens too */
  const int dev = ctx->device, on_gpu = ctx->on_gpu;
  const int nteams = on_gpu ? (int)(nitems < 65536 ? nitems : 65536) : omp_get_max_threads();
  const int nthreads = on_gpu ? KIVI_ATT_NT : 1;

#define KIVI_REGION_FILE "attention_portable.inc"
#include "region_twice.inc"
#undef KIVI_REGION_FILE
  return KIVI_OK;
}

/* Fills R_BEG (tokens the GPU fast path takes) and plans the portable kernel for the rest.
 * The fast path covers floor(max(0, Lc - R) / KIVI_FAST_GRAIN) grains of a row, where its keys
 * and values are both quantized; in a decode call (no new tokens) it also takes the rest of
 * every row and the combine, and the portable kernel does not run. */
static att_plan plan_call(const kivi_cache *c, int rows, int64_t *hd, int HQ, int decode, int newk) {
  if (decode && kivi_gpu_f16_eligible(c)) { /* the fp16 cache: one launch, nf splits of fs tokens */
    int64_t maxLc = 0;
    for (int r = 0; r < rows; ++r) {
      hd[R_BEG * (int64_t)rows + r] = 0;
      if (hd[R_LC * (int64_t)rows + r] > maxLc) maxLc = hd[R_LC * (int64_t)rows + r];
    }
    const int H = c->cfg.n_kv_heads, nh = kivi_f16_heads(HQ / H), nqc = kivi_head_chunks(HQ / H, nh);
    const int64_t split = KIVI_F16_SPLIT(nh);
    const int64_t nb = (int64_t)rows * H * nqc;
    int64_t fs;
    if (kivi_f16_streamed(HQ / H)) {
      /* the streamed kernel: splits of a power of two from KIVI_F16S_MINSPLIT to
       * KIVI_F16S_MAXSPLIT tokens, the shortest that cut the longest row into at most
       * KIVI_F16S_SPLITS (fewer where the (row, chunk) pairs alone make a good part of
       * KIVI_F16S_BLOCKS blocks: one split at a large batch), halved while fewer than
       * KIVI_FAST_SMS / 2 blocks would run.  Measured on an H200 against the plan before (about
       * 24 blocks per SM, splits down to 128 tokens): 4-29 % less time at 11 of the 12
       * decode-table shapes where they differ, 4.6 % more at MHA (1, 32768); fewer, longer
       * splits pay each block's start and the combine less often (docs/PERF.md, round 34).
       * Splits longer than `split` tokens (rows of more than KIVI_F16S_SPLITS x `split`) only
       * where all the call's blocks are resident at once (KIVI_F16S_WAVE) and make at least
       * KIVI_F16S_FEW of them, halved down to `split` while they make fewer: on the H200 that
       * took 28/4 and 32/8 at (8, 32768) and MHA at (1, 32768) from 1024- to 4096-token splits,
       * 12-18 % less time; 32/8 at (1, 32768) keeps 1024 (4096 tokens: 64 blocks, 2.4x the
       * time), MHA at (8, 32768) too (4096 tokens would make 2048 blocks; docs/PERF.md, round 38).
       * Where the (row, chunk) pairs alone make KIVI_F16S_FEW blocks and the rows are longer than
       * KIVI_F16S_ONE tokens, the plan aims at one split per row (kept where its blocks are all
       * resident at once, as above): with the split forced, 32/8 (32, 4096) took 12 % less time
       * on an H200 and 8 % less on an H100 with 4096 tokens (256 blocks) than with 512 (2048
       * blocks), MHA (8, 4096) 4.5 % less on an H100; with fewer pairs one split lost (H100:
       * 32/8 (16, 4096), 128 blocks, +5 %; 9/3 (32, 4096), 96 blocks, +53 %; round 39). */
      const int64_t fill = (KIVI_F16S_BLOCKS + nb - 1) / nb;
      const int64_t want = nb >= KIVI_F16S_FEW && maxLc > KIVI_F16S_ONE ? 1
                           : fill < KIVI_F16S_SPLITS                    ? fill
                                                                        : KIVI_F16S_SPLITS;
      const int64_t len = (maxLc + want - 1) / want;
#define F16S_BLOCKS(fs) (nb * ((maxLc + (fs) - 1) / (fs))) /* the call's blocks with splits of fs */
      fs = KIVI_F16S_MINSPLIT;
      while (fs < len && fs < KIVI_F16S_MAXSPLIT) fs *= 2;
      if (fs > split && F16S_BLOCKS(fs) > KIVI_F16S_WAVE) fs = split;
      while (fs > split && F16S_BLOCKS(fs) < KIVI_F16S_FEW) fs /= 2;
      while (fs > KIVI_F16S_MINSPLIT && F16S_BLOCKS(fs) < KIVI_FAST_SMS / 2) fs /= 2;
#undef F16S_BLOCKS
    } else {
      /* the two-phase kernel: about KIVI_F16_BLOCKS blocks (4 waves of an H200 at 3 per SM),
       * splits of 256 to `split` tokens in multiples of 64, at most KIVI_F16_MAXSPLITS of them
       * where the split length allows (the last block of a (row, chunk) combines its splits
       * alone: docs/PERF.md, round 18) */
      int64_t nf = (KIVI_F16_BLOCKS + nb - 1) / nb;
      if (nf > maxLc / KIVI_F16_MINSPLIT) nf = maxLc / KIVI_F16_MINSPLIT;
      if (nf > KIVI_F16_MAXSPLITS) nf = KIVI_F16_MAXSPLITS;
      if (nf < (maxLc + split - 1) / split) nf = (maxLc + split - 1) / split;
      if (nf < 1) nf = 1;
      fs = ((maxLc + nf - 1) / nf + 63) / 64 * 64;
      if (fs > split) fs = split;
    }
    att_plan p;
    memset(&p, 0, sizeof p);
    p.fs = (int)fs;
    p.nf = (int)((maxLc + fs - 1) / fs);
    p.fused = p.f16 = 1;
    p.nslots = p.nf;
    return p;
  }
  const int fast = kivi_gpu_fast_eligible(c), R = c->cfg.residual;
  int64_t maxbeg = 0, maxT = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t Lc = hd[R_LC * (int64_t)rows + r], T = Lc + (newk ? 0 : hd[R_E * (int64_t)rows + r]);
    const int64_t beg = fast && Lc > R ? (Lc - R) / KIVI_FAST_GRAIN * KIVI_FAST_GRAIN : 0;
    hd[R_BEG * (int64_t)rows + r] = beg;
    if (beg > maxbeg) maxbeg = beg;
    if (T - beg > maxT) maxT = T - beg;
  }
  /* The GQA kernel (decode_gqa.c) takes every fast call: a block per (row, kv-head, chunk of up
   * to KIVI_GQA_NH query heads, split), splits of the longest power of two from
   * KIVI_GQA_MIN_SPLIT to KIVI_GQA_MAX_SPLIT tokens whose blocks make at least KIVI_GQA_FILL
   * (about one wave of resident blocks: fewer, longer splits pay each block's set-up, merge and
   * partials less often; H100, 32/8 (8, 32768): 1024-token splits, 2048 blocks, took 23 % more
   * time than 4096, 512 blocks) */
  const int gqa = fast && kivi_gpu_gqa_eligible(c, HQ);
  const int64_t units = (int64_t)rows * c->cfg.n_kv_heads * kivi_head_chunks(HQ / c->cfg.n_kv_heads, KIVI_GQA_NH);
  int fs = KIVI_GQA_MAX_SPLIT;
  while (fs > KIVI_GQA_MIN_SPLIT && units * ((maxbeg + fs - 1) / fs) < KIVI_GQA_FILL) fs /= 2;
  const int nf = (int)((maxbeg + fs - 1) / fs);
  int sink = 0; /* some row has sink tokens */
  for (int r = 0; r < rows; ++r) sink |= hd[R_NS * (int64_t)rows + r] > 0;
  /* a call whose rows have no quantized-stream tokens (and, decoding, no new ones) still runs
   * one portable split, whose combine takes the sink tokens' (and the new tokens') partials */
  if (sink && maxT == 0) maxT = 1;
  att_plan p = plan_rows(c, rows, maxT, HQ, c->ctx->on_gpu);
  p.fs = fs;
  p.sink = sink;
  p.gqa = gqa;
  p.f16 = 0;
  p.nf = nf;
  p.fused = fast && decode;
  if (p.fused) p.nsplit = p.nitems = 0;
  p.newk = newk;
  p.new_seqs = p.new_tiles = 0;
  p.new_pad = 0;
  if (newk)
    for (int r = 0; r < rows; ++r) {
      const int64_t e = hd[R_E * (int64_t)rows + r] - 1; /* the row's index among its sequence's new tokens */
      p.new_seqs += e == 0;
      p.new_tiles += e % KIVI_NEW_TILE == 0;
      p.new_pad += e % 32 == 0 ? 32 : 0;
    }
  p.ntail = p.gqa && p.fused ? kivi_gpu_gqa_tails(R) : 0;
  p.nslots = p.nf + (p.fused ? (p.gqa ? p.ntail : 1) : p.nsplit + newk) + sink;
  return p;
}

/* Common argument checks of decode and extend.  A call with n_seqs = 0 passes them with any
 * pointers (NULL too) and then does nothing. */
static kivi_status check_common(const kivi_cache *c, int layer, int n_seqs, const int *seq_ids,
                                int n_q_heads, const void *q, const void *out, float scale, kivi_mem mem) {
  if (!c || layer < 0 || layer >= c->cfg.n_layers) return KIVI_ERR_ARG;
  if (mem != KIVI_MEM_HOST && mem != KIVI_MEM_DEVICE) return KIVI_ERR_ARG;
  if (n_q_heads < 1 || n_q_heads % c->cfg.n_kv_heads) return KIVI_ERR_ARG;
  if (!isfinite(scale) || !(scale > 0.0f)) return KIVI_ERR_ARG;
  if (n_seqs > 0 && (!q || !out)) return KIVI_ERR_ARG;
  return kivi_check_seq_ids(c, n_seqs, seq_ids);
}

/* Device scratch for one call: descriptors, partials, and (host memory) staged inputs/outputs. */
static size_t rows_scratch(const kivi_cache *c, int rows, int HQ, const att_plan *p) {
  return pad16((size_t)R_NCOLS * rows * 8) + pad16((size_t)rows * HQ * p->nslots * (c->cfg.head_dim + 2) * 4) + 16 +
         (p->newk ? new_stage_bytes(c, p) : 0);
}

static kivi_status decode_impl(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, int n_q_heads,
                               const float *q, float scale, void *out, kivi_dtype out_dtype, kivi_mem mem,
                               int async) {
  kivi_status st = check_common(c, layer, n_seqs, seq_ids, n_q_heads, q, out, scale, mem);
  if (st) return st;
  if (out_dtype != KIVI_F32 && out_dtype != KIVI_F16) return KIVI_ERR_ARG;
  if (n_seqs == 0) return KIVI_OK;
  int64_t *hd = malloc((size_t)R_NCOLS * n_seqs * 8);
  if (!hd) return KIVI_ERR_NOMEM;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L = kivi_len(c, seq_ids[i], layer);
    if (L < 1) { free(hd); return KIVI_ERR_ARG; }
    hd[R_SEQ * n_seqs + i] = seq_ids[i];
    hd[R_LC * n_seqs + i] = kivi_qlen(c, L);
    hd[R_NS * n_seqs + i] = L - kivi_qlen(c, L);
    hd[R_E * n_seqs + i] = 0;
    hd[R_NEW * n_seqs + i] = 0;
  }
  const size_t D = (size_t)c->cfg.head_dim, nq = (size_t)n_seqs * n_q_heads * D;
  const size_t osz = out_dtype == KIVI_F16 ? 2 : 4;
  const size_t host_io = mem == KIVI_MEM_HOST ? pad16(nq * 4) + pad16(nq * osz) : 0;
  const int rk = c->cfg.rotate & KIVI_ROTATE_K, rv = c->cfg.rotate & KIVI_ROTATE_V;
  const size_t rot_io = (rk ? pad16(nq * 4) : 0) + (rv ? pad16(nq * 4) : 0); /* rotated q, fp32 output */
  const att_plan pl = plan_call(c, n_seqs, hd, n_q_heads, 1, 0);
  const int lane = kivi_lane_of(c, layer, 1); /* decode calls run on their layer's lane */
  kivi_scratch *work = &kivi_lane_at(c, lane)->work;
  if (kivi_async_reserve(c, work, host_io + rot_io + rows_scratch(c, n_seqs, n_q_heads, &pl))) {
    free(hd);
    return KIVI_ERR_NOMEM;
  }
  unsigned char *w = work->p;
  const float *dq = q;
  void *dout = out;
  if (mem == KIVI_MEM_HOST) {
    if ((st = put_input(c, async, lane, w, q, nq * 4))) { free(hd); return st; }
    dq = (const float *)w;
    dout = w + pad16(nq * 4);
  }
  const int64_t nvq = (int64_t)n_seqs * n_q_heads;
  float *rq = (float *)(w + host_io), *ro = (float *)(w + host_io + (rk ? pad16(nq * 4) : 0));
  if (rk) { /* a rotated cache: W q */
    kivi_rotate_rows(c, dq, KIVI_F32, rq, KIVI_F32, nvq, 1, async, lane);
    dq = rq;
  }
  st = run_rows(c, layer, n_seqs, hd, &pl, n_q_heads, dq, NULL, NULL, scale, rv ? ro : dout,
                !rv && out_dtype == KIVI_F16, NULL, w + host_io + rot_io, async, lane);
  free(hd);
  if (!st && rv) kivi_rotate_rows(c, ro, KIVI_F32, dout, out_dtype, nvq, 1, async, lane); /* rotated back */
  if (!st && mem == KIVI_MEM_HOST && get_output(c, async, lane, out, dout, nq * osz)) st = KIVI_ERR_DEVICE;
  if (async) ++c->pending;
  return st;
}

kivi_status kivi_attention_decode(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, int n_q_heads,
                                  const float *q, float scale, void *out, kivi_dtype out_dtype, kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 0, &run);
  return st ? st
            : kivi_call_end(c, 0, decode_impl(c, layer, n_seqs, seq_ids, n_q_heads, q, scale, out, out_dtype, mem, run));
}

kivi_status kivi_attention_decode_async(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, int n_q_heads,
                                        const float *q, float scale, void *out, kivi_dtype out_dtype,
                                        kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 1, &run);
  return st ? st
            : kivi_call_end(c, 1, decode_impl(c, layer, n_seqs, seq_ids, n_q_heads, q, scale, out, out_dtype, mem, run));
}

static kivi_status extend_impl(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *q_lens,
                               int n_q_heads, const float *q, const float *k_new, const float *v_new, float scale,
                               float *out, float *lse, kivi_mem mem, int async) {
  kivi_status st = check_common(c, layer, n_seqs, seq_ids, n_q_heads, q, out, scale, mem);
  if (st) return st;
  if (n_seqs == 0) return KIVI_OK;
  if (!q_lens || !k_new || !v_new) return KIVI_ERR_ARG;
  int64_t rows = 0;
  for (int i = 0; i < n_seqs; ++i) {
    if (q_lens[i] < 1 || q_lens[i] > c->cfg.max_seq_len) return KIVI_ERR_ARG;
    rows += q_lens[i];
  }
  if (rows > INT32_MAX / 4) return KIVI_ERR_ARG;
  int64_t *hd = malloc((size_t)R_NCOLS * rows * 8);
  if (!hd) return KIVI_ERR_NOMEM;
  int64_t r = 0;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L = kivi_len(c, seq_ids[i], layer), first = r;
    for (int j = 0; j < q_lens[i]; ++j, ++r) {
      hd[R_SEQ * rows + r] = seq_ids[i];
      hd[R_LC * rows + r] = kivi_qlen(c, L);
      hd[R_NS * rows + r] = L - kivi_qlen(c, L);
      hd[R_E * rows + r] = j + 1;
      hd[R_NEW * rows + r] = first;
    }
  }
  const size_t D = (size_t)c->cfg.head_dim, H = (size_t)c->cfg.n_kv_heads;
  const size_t nq = (size_t)rows * n_q_heads * D, nkv = (size_t)rows * H * D, nl = (size_t)rows * n_q_heads;
  const size_t host_io = mem == KIVI_MEM_HOST ? 2 * pad16(nq * 4) + 2 * pad16(nkv * 4) + pad16(nl * 4) : 0;
  const int rk = c->cfg.rotate & KIVI_ROTATE_K, rv = c->cfg.rotate & KIVI_ROTATE_V;
  /* a rotated cache: W q and W k_new (keys), W v_new and the fp32 output (values) */
  const size_t rot_io = (rk ? pad16(nq * 4) + pad16(nkv * 4) : 0) + (rv ? pad16(nkv * 4) + pad16(nq * 4) : 0);
  /* the new tokens on the GPU: inputs 16-byte aligned (host inputs are staged, aligned), and
   * its grids (at most rows / 64 + n_seqs tiles per query head, rows / 32 + n_seqs staging
   * tiles per kv-head) within int */
  const int newk = kivi_gpu_extend_eligible(c) &&
                   (mem == KIVI_MEM_HOST || (((uintptr_t)q | (uintptr_t)k_new | (uintptr_t)v_new) & 15) == 0) &&
                   (rows / 64 + n_seqs) * n_q_heads <= INT32_MAX && (rows / 32 + n_seqs) * (int64_t)H <= INT32_MAX;
  const att_plan pl = plan_call(c, (int)rows, hd, n_q_heads, 0, newk);
  const int lane = kivi_lane_of(c, layer, 0); /* extend calls run off the lanes */
  kivi_scratch *work = &kivi_lane_at(c, lane)->work;
  if (kivi_async_reserve(c, work, host_io + rot_io + rows_scratch(c, (int)rows, n_q_heads, &pl))) {
    free(hd);
    return KIVI_ERR_NOMEM;
  }
  unsigned char *w = work->p;
  const float *dq = q, *dk = k_new, *dv = v_new;
  float *dout = out, *dlse = lse;
  if (mem == KIVI_MEM_HOST) {
    unsigned char *p = w;
    dq = (const float *)p;  p += pad16(nq * 4);
    dk = (const float *)p;  p += pad16(nkv * 4);
    dv = (const float *)p;  p += pad16(nkv * 4);
    dout = (float *)p;      p += pad16(nq * 4);
    dlse = lse ? (float *)p : NULL;
    if ((st = put_input(c, async, lane, (void *)dq, q, nq * 4)) ||
        (st = put_input(c, async, lane, (void *)dk, k_new, nkv * 4)) ||
        (st = put_input(c, async, lane, (void *)dv, v_new, nkv * 4))) {
      free(hd);
      return st;
    }
  }
  unsigned char *rp = w + host_io;
  float *ro = NULL;
  if (rk) {
    float *rq = (float *)rp, *rkn = (float *)(rp + pad16(nq * 4));
    rp += pad16(nq * 4) + pad16(nkv * 4);
    kivi_rotate_rows(c, dq, KIVI_F32, rq, KIVI_F32, (int64_t)rows * n_q_heads, 1, async, lane);
    kivi_rotate_rows(c, dk, KIVI_F32, rkn, KIVI_F32, (int64_t)rows * H, 1, async, lane);
    dq = rq;
    dk = rkn;
  }
  if (rv) {
    float *rvn = (float *)rp;
    ro = (float *)(rp + pad16(nkv * 4));
    kivi_rotate_rows(c, dv, KIVI_F32, rvn, KIVI_F32, (int64_t)rows * H, 1, async, lane);
    dv = rvn;
  }
  st = run_rows(c, layer, (int)rows, hd, &pl, n_q_heads, dq, dk, dv, scale, rv ? ro : dout, 0, dlse,
                w + host_io + rot_io, async, lane);
  free(hd);
  if (!st && rv) kivi_rotate_rows(c, ro, KIVI_F32, dout, KIVI_F32, (int64_t)rows * n_q_heads, 1, async, lane);
  if (!st && mem == KIVI_MEM_HOST &&
      (get_output(c, async, lane, out, dout, nq * 4) || (lse && get_output(c, async, lane, lse, dlse, nl * 4))))
    st = KIVI_ERR_DEVICE;
  if (async) ++c->pending;
  return st;
}

kivi_status kivi_attention_extend(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *q_lens,
                                  int n_q_heads, const float *q, const float *k_new, const float *v_new,
                                  float scale, float *out, float *lse, kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 0, &run);
  return st ? st
            : kivi_call_end(c, 0, extend_impl(c, layer, n_seqs, seq_ids, q_lens, n_q_heads, q, k_new, v_new, scale,
                                              out, lse, mem, run));
}

kivi_status kivi_attention_extend_async(kivi_cache *c, int layer, int n_seqs, const int *seq_ids,
                                        const int *q_lens, int n_q_heads, const float *q, const float *k_new,
                                        const float *v_new, float scale, float *out, float *lse, kivi_mem mem) {
  int run;
  const kivi_status st = kivi_call_begin(c, 1, &run);
  return st ? st
            : kivi_call_end(c, 1, extend_impl(c, layer, n_seqs, seq_ids, q_lens, n_q_heads, q, k_new, v_new, scale,
                                              out, lse, mem, run));
}
