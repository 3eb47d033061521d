/* The plan of an attention call (plan.h): the GPU kernels' eligibility (also the append's) and kivi_plan_call. */
#include "config.h"

#include <omp.h>
#include <string.h>

#include "plan.h"
#include "kernels_attn.h" /* KIVI_ATT_HC */

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
/* What every GPU decode kernel needs: a GPU context, KIVI_ATTENTION_FAST, R a power of two >= 32
 * (block and ring slots by masks and shifts), blocks of < 4 GiB (32-bit offsets). */
static int gpu_kernel_geometry(const kivi_cache *c) {
  const int R = c->cfg.residual;
  return c->ctx->on_gpu && c->cfg.attention == KIVI_ATTENTION_FAST && R >= 32 && (R & (R - 1)) == 0 &&
         c->lay.block_bytes <= UINT32_MAX;
}
int kivi_gpu_fast_eligible(const kivi_cache *c) {
  const kivi_cache_config *f = &c->cfg;
  return gpu_kernel_geometry(c) && (f->k_bits == 2 || f->k_bits == 4) && (f->v_bits == 2 || f->v_bits == 4) &&
         f->group == 32 && (f->head_dim == 128 || f->head_dim == 64);
}
int kivi_gpu_gqa_eligible(const kivi_cache *c, int HQ) {
  return kivi_gpu_fast_eligible(c) && HQ % c->cfg.n_kv_heads == 0;
}
int kivi_gpu_f16_eligible(const kivi_cache *c) {
  const kivi_cache_config *f = &c->cfg;
  return gpu_kernel_geometry(c) && f->k_bits == 16 && f->v_bits == 16 && (f->head_dim == 128 || f->head_dim == 64);
}
int kivi_gpu_extend_eligible(const kivi_cache *c) {
  return c->ctx->on_gpu && c->cfg.attention == KIVI_ATTENTION_FAST && (c->cfg.head_dim == 64 || c->cfg.head_dim == 128);
}
int kivi_gpu_append_eligible(const kivi_cache *c, int bits, int bf) {
  const kivi_cache_config *f = &c->cfg;
  const int R = f->residual;
  return c->ctx->on_gpu && !bf && (bits == 2 || bits == 4) && f->head_dim == 128 && f->group == 32 && (R & (R - 1)) == 0;
}
#else /* no offload: no GPU kernel */
int kivi_gpu_fast_eligible(const kivi_cache *c) {
  (void)c;
  return 0;
}
int kivi_gpu_gqa_eligible(const kivi_cache *c, int HQ) {
  (void)c;
  (void)HQ;
  return 0;
}
int kivi_gpu_f16_eligible(const kivi_cache *c) {
  (void)c;
  return 0;
}
int kivi_gpu_extend_eligible(const kivi_cache *c) {
  (void)c;
  return 0;
}
int kivi_gpu_append_eligible(const kivi_cache *c, int bits, int bf) {
  (void)c;
  (void)bits;
  (void)bf;
  return 0;
}
#endif

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
  return p; /* nf, fs and nslots: kivi_plan_call */
}

/* Fills R_BEG (tokens the GPU fast path takes) and plans the portable kernel for the rest.
 * The fast path covers floor(max(0, Lc - R) / KIVI_FAST_GRAIN) grains of a row, where its keys
 * and values are both quantized; in a decode call (no new tokens) it also takes the rest of
 * every row and the combine, and the portable kernel does not run. */
att_plan kivi_plan_call(const kivi_cache *c, int rows, int64_t *hd, int HQ, int decode, int newk) {
  if (decode && kivi_gpu_f16_eligible(c)) { /* the fp16 cache: one launch, nf splits of fs tokens */
    int64_t maxLc = 0;
    for (int r = 0; r < rows; ++r) {
      hd[R_BEG * (int64_t)rows + r] = 0;
      if (hd[R_LC * (int64_t)rows + r] > maxLc) maxLc = hd[R_LC * (int64_t)rows + r];
    }
    const int H = c->cfg.n_kv_heads, nqc = kivi_head_chunks(HQ / H, KIVI_F16_NH);
    const int64_t split = KIVI_F16_SPLIT;
    const int64_t nb = (int64_t)rows * H * nqc;
    /* splits of a power of two from KIVI_F16S_MINSPLIT to KIVI_F16S_MAXSPLIT tokens, the shortest
     * that cut the longest row into at most KIVI_F16S_SPLITS (fewer where the (row, chunk) pairs
     * alone make a good part of KIVI_F16S_BLOCKS blocks: one split at a large batch), halved while
     * fewer than KIVI_FAST_SMS / 2 blocks would run.  Measured on an H200 against the plan before
     * (about 24 blocks per SM, splits down to 128 tokens): 4-29 % less time at 11 of the 12
     * decode-table shapes where they differ, 4.6 % more at MHA (1, 32768); fewer, longer splits pay
     * each block's start and the combine less often (docs/PERFORMANCE.md, round 34). Splits longer than
     * `split` tokens (rows of more than KIVI_F16S_SPLITS x `split`) only where all the call's
     * blocks are resident at once (KIVI_F16S_WAVE) and make at least KIVI_F16S_FEW of them, halved
     * down to `split` while they make fewer: on the H200 that took 28/4 and 32/8 at (8, 32768) and
     * MHA at (1, 32768) from 1024- to 4096-token splits, 12-18 % less time; 32/8 at (1, 32768)
     * keeps 1024 (4096 tokens: 64 blocks, 2.4x the time), MHA at (8, 32768) too (4096 tokens would
     * make 2048 blocks; docs/PERFORMANCE.md, round 38). Where the (row, chunk) pairs alone make
     * KIVI_F16S_FEW blocks and the rows are longer than KIVI_F16S_ONE tokens, the plan aims at one
     * split per row (kept where its blocks are all resident at once, as above): with the split
     * forced, 32/8 (32, 4096) took 12 % less time on an H200 and 8 % less on an H100 with 4096
     * tokens (256 blocks) than with 512 (2048 blocks), MHA (8, 4096) 4.5 % less on an H100; with
     * fewer pairs one split lost (H100: 32/8 (16, 4096), 128 blocks, +5 %; 9/3 (32, 4096), 96
     * blocks, +53 %; round 39). */
    const int64_t fill = (KIVI_F16S_BLOCKS + nb - 1) / nb;
    const int64_t want = nb >= KIVI_F16S_FEW && maxLc > KIVI_F16S_ONE ? 1
                         : fill < KIVI_F16S_SPLITS                    ? fill
                                                                      : KIVI_F16S_SPLITS;
    const int64_t len = (maxLc + want - 1) / want;
#define F16S_BLOCKS(fs) (nb * ((maxLc + (fs) - 1) / (fs))) /* the call's blocks with splits of fs */
    int64_t fs = KIVI_F16S_MINSPLIT;
    while (fs < len && fs < KIVI_F16S_MAXSPLIT) fs *= 2;
    if (fs > split && F16S_BLOCKS(fs) > KIVI_F16S_WAVE) fs = split;
    while (fs > split && F16S_BLOCKS(fs) < KIVI_F16S_FEW) fs /= 2;
    while (fs > KIVI_F16S_MINSPLIT && F16S_BLOCKS(fs) < KIVI_FAST_SMS / 2) fs /= 2;
#undef F16S_BLOCKS
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

