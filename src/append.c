/* The append kernels: a call's device work, as append_impl (cache.c) prepared it in a
 * kivi_append_job.  A call runs
 *   0. (sink tokens in the call) the sink tokens converted to fp16, checked and stored in the
 *      sink area;
 *   1. the inputs converted to fp16 in the stage and checked, the new block-table entries, the
 *      descriptor's copy and the V bounds reset;
 *   2a. the K blocks the call completes quantized (append_gpu.c's kernel where it is eligible);
 *   2b. the values leaving the windows quantized (append_gpu.c's kernel where it is eligible);
 *   3. the bounds raised and the new tokens that stay fp16 written into the rings (after 2a
 *      and 2b read the old ring slots);
 * or, on a GPU for a small call (at most R new tokens per sequence and KIVI_APPEND_FUSED_SEQS
 * sequences: a decode step; plan.h), 0 and then the one-kernel append (ap_fused_block).
 * Each kernel is an item (or block) function of one argument struct, ap_args, built inside a
 * thin region macro from the launcher's locals (a struct named in a region would be mapped
 * tofrom, which an enqueued region would copy back into a stack frame that is gone). */
#include "config.h"

#include <omp.h>
#include <stdint.h>

#include "internal.h"
#include "kernels_quant.h"
#include "plan.h"

#if KIVI_APPEND_FUSED
#include <ompx.h>
#endif

/* The inputs of one kernel (each kernel reads its part). */
typedef struct ap_args {
  const unsigned char *img, *simg; /* the call's host image and sink image, copied in */
  const void *kdev, *vdev;         /* device inputs */
  unsigned char *pool;
  int32_t *bt, *vexp, *vsc, *vmax, *cm;
  uint16_t *kres, *vres, *kst, *vst, *ksink, *vsink, *bk, *bv;
  const uint16_t *ksrc, *vsrc; /* kernels 2a and 2b: fp16 rows of the new tokens */
  int64_t *flag, *dd, *arrive;
  size_t kraw, vraw, sub, ring_lh;
  int64_t call_id, nsink, nsi, hstride, stab64, nconv, nbt64, ndesc64;
  int n, H, D, R, G, NL, MB, layer, kbits, vbits, vclip, dt, host_in, direct, bf, svec, vec, nch8, ngrp, vgrp, k4chunks,
      jmax;
} ap_args;

#pragma omp declare target
/* A memory fence (an orphaned flush: the one-kernel append's blocks publish their writes to the
 * last block, as in a CUDA threadfence reduction). */
static inline void kivi_fence(void) {
#pragma omp flush
}

/* 0: item = (token, head, 8 channels) of K, then of V: converted to fp16 and checked
 * (non-finite: the flag, and kernels 1 to 3 change nothing), then stored in the sink area.  The
 * positions are beyond every length, so what a failed call leaves there is never read. */
static inline __attribute__((always_inline)) void ap_sink_item(const ap_args *a, int64_t it) {
  const int64_t nsi = a->nsi, nsink = a->nsink, stab64 = a->stab64, hstride = a->hstride;
  const int nch8 = a->nch8, H = a->H, D = a->D, host_in = a->host_in, dt = a->dt, svec = a->svec;
  const unsigned char *simg = a->simg;
  int64_t *flag = a->flag;
  if (flag[0]) return;
  const int is_v = it >= nsi;
  const int64_t k = is_v ? it - nsi : it, th = k / nch8, t = th / H;
  const int ch = (int)(k % nch8), h = (int)(th % H);
  const int64_t *tab = (const int64_t *)simg;
  const void *src = host_in ? (const void *)(simg + stab64) : is_v ? a->vdev : a->kdev;
  const int64_t j = host_in ? (((is_v ? nsink : 0) + t) * H + h) * D + ch * 8 : (tab[2 * t + 1] * H + h) * D + ch * 8;
  uint16_t x[8] __attribute__((aligned(16)));
  if (kivi_in_f16x8(src, j, host_in ? KIVI_F16 : dt, svec, x)) {
#pragma omp atomic write
    flag[0] = a->call_id;
  }
  uint16_t *dst = (is_v ? a->vsink : a->ksink) + tab[2 * t] + h * hstride + ch * 8;
  for (int e = 0; e < 8; ++e) dst[e] = x[e];
}

/* 1: item i < 2 nconv: 8 values of K, then of V, converted to fp16 into the stage, flagging any
 * non-finite result (NaN, Inf, |x| >= 65520): all of them, or with a direct input only the
 * tokens that stay in the windows (kernel 3 copies them; per sequence the last R, item =
 * (sequence, window slot, head, 8 channels)); then the new block-table entries (beyond every
 * length: harmless if the input is bad), the descriptor's copy and vsc set to "no bound".  (nel
 * is a multiple of head_dim, so of 8; the host image's K and V start 16-byte aligned, device
 * inputs are read 16 bytes at a time when they are.) */
static inline __attribute__((always_inline)) void ap_convert_item(const ap_args *a, int64_t i) {
  const int64_t nconv = a->nconv, nbt64 = a->nbt64, ndesc64 = a->ndesc64;
  const int n = a->n, H = a->H, D = a->D, R = a->R, nch8 = a->nch8, host_in = a->host_in;
  int64_t *flag = a->flag;
  if (flag[0]) return; /* a failed earlier append (enqueued) or this one */
  const int64_t *idd = (const int64_t *)a->img;
  if (i >= 2 * nconv + nbt64 + ndesc64) {
    a->vsc[i - 2 * nconv - nbt64 - ndesc64] = -14;
    return;
  }
  if (i >= 2 * nconv + nbt64) {
    a->dd[i - 2 * nconv - nbt64] = idd[i - 2 * nconv - nbt64];
    return;
  }
  if (i >= 2 * nconv) {
    const int64_t *ibtu = idd + ndesc64;
    a->bt[ibtu[2 * (i - 2 * nconv)]] = (int32_t)ibtu[2 * (i - 2 * nconv) + 1];
    return;
  }
  const int is_v = i >= nconv;
  const int64_t k = is_v ? i - nconv : i;
  int64_t j = k * 8;
  if (a->direct) { /* the window's slot x holds position L' - R + x */
    const int64_t ih = k / nch8, si = ih / ((int64_t)H * R);
    const int64_t L = idd[(size_t)D_L * n + si], p = L + idd[(size_t)D_N * n + si] - R + ih / H % R;
    if (p < L) return; /* not a new token */
    j = ((idd[(size_t)D_STAGE * n + si] + (p - L)) * H + ih % H) * D + k % nch8 * 8;
  }
  const void *src = host_in ? (const void *)(a->img + (is_v ? a->vraw : a->kraw)) : is_v ? a->vdev : a->kdev;
  if (kivi_in_f16x8(src, j, a->dt, a->vec, (is_v ? a->vst : a->kst) + j)) {
#pragma omp atomic write
    flag[0] = a->call_id;
  }
}

/* 2a: item = (completed block, head, token group, 4 channels); nothing if flagged.  The layout
 * is rebuilt from scalars. */
static inline __attribute__((always_inline)) void ap_keys_item(const ap_args *a, int64_t it) {
  const int D = a->D, H = a->H, G = a->G, R = a->R, n = a->n, k4chunks = a->k4chunks, ngrp = a->ngrp;
  const int64_t *dd = a->dd;
  int64_t *flag = a->flag;
  if (flag[0]) return;
  kivi_layout ly;
  kivi_layout_init(&ly, D, H, G, R, a->kbits, a->vbits);
  const int w = (int)(it % k4chunks);
  const int g = (int)(it / k4chunks % ngrp);
  const int h = (int)(it / ((int64_t)k4chunks * ngrp) % H);
  const int64_t kbi = it / ((int64_t)k4chunks * ngrp * H);
  const int i = kivi_find_seq(dd + (size_t)D_KBPRE * n, n, kbi);
  const int64_t s = dd[(size_t)D_SEQ * n + i], L = dd[(size_t)D_L * n + i];
  const int64_t blk_no = L / R + (kbi - dd[(size_t)D_KBPRE * n + i]);
  const int32_t blk = a->bt[((size_t)s * a->NL + a->layer) * a->MB + blk_no];
  const uint16_t *ring = a->kres + (((size_t)s * a->NL + a->layer) * H + h) * a->ring_lh;
  unsigned char *sb = a->pool + ((size_t)blk * H + h) * a->sub;
  if (kivi_append_k4(sb, &ly, g, w, blk_no * R + (int64_t)g * G, L, ring, a->ksrc, a->bf, dd[(size_t)D_STAGE * n + i], h)) {
#pragma omp atomic write
    flag[0] = a->call_id;
  }
  int ke[3] = {-14, -14, -14}; /* the bound of its 4 K scales */
  kivi_kexp_fold(&ke[2], a->kbits < 16 ? kivi_kscales_at(sb, &ly, g, 4 * w) : NULL, 4);
  kivi_vexp_raise(a->vsc + ((size_t)i * H + h) * KIVI_XB, ke);
}

/* 2b: item = (KIVI_APPEND_VCHUNK tokens, head, channel group) of the n_vq values leaving the
 * windows; each item raises the V bounds vsc of its tokens' sequences once each; nothing if
 * flagged */
static inline __attribute__((always_inline)) void ap_values_item(const ap_args *a, int64_t iv, int64_t n_vq) {
  const int D = a->D, H = a->H, R = a->R, n = a->n, vgrp = a->vgrp, NL = a->NL, layer = a->layer;
  const int64_t *dd = a->dd;
  int64_t *flag = a->flag;
  if (flag[0]) return;
  kivi_layout ly;
  kivi_layout_init(&ly, D, H, a->G, R, a->kbits, a->vbits);
  const int cg = (int)(iv % vgrp);
  const int h = (int)(iv / vgrp % H);
  const int64_t v0 = iv / ((int64_t)vgrp * H) * KIVI_APPEND_VCHUNK;
  const int nt = n_vq - v0 < KIVI_APPEND_VCHUNK ? (int)(n_vq - v0) : KIVI_APPEND_VCHUNK;
  /* first every token's source row and sub-block (the block-table loads in flight together),
   * then the quantization; fromsrc: bit t set where token t is a new one (not in the ring) */
  const uint16_t *xs[KIVI_APPEND_VCHUNK];
  unsigned char *sbs[KIVI_APPEND_VCHUNK];
  int slot[KIVI_APPEND_VCHUNK], seq_i[KIVI_APPEND_VCHUNK];
  unsigned fromsrc = 0;
  _Pragma("GCC unroll 8")
  for (int t = 0; t < KIVI_APPEND_VCHUNK; ++t) {
    const int64_t vqi = v0 + (t < nt ? t : 0);
    const int i = kivi_find_seq(dd + (size_t)D_VQPRE * n, n, vqi);
    const int64_t s = dd[(size_t)D_SEQ * n + i], L = dd[(size_t)D_L * n + i];
    const int64_t p = dd[(size_t)D_VQBEG * n + i] + (vqi - dd[(size_t)D_VQPRE * n + i]);
    const uint16_t *ring = a->vres + (((size_t)s * NL + layer) * H + h) * a->ring_lh;
    xs[t] = kivi_src_row(p, L, ring, R, D, a->vsrc, dd[(size_t)D_STAGE * n + i], H, h);
    sbs[t] = a->pool + ((size_t)a->bt[((size_t)s * NL + layer) * a->MB + p / R] * H + h) * a->sub;
    slot[t] = (int)(p % R);
    seq_i[t] = i;
    fromsrc |= (unsigned)(p >= L) << t;
  }
  int ve[3] = {-14, -14, -14}, cur = seq_i[0]; /* the bounds of sequence cur's tokens so far */
  uint32_t bad = 0;
  for (int t = 0; t < nt; ++t) {
    if (seq_i[t] != cur) {
      kivi_vexp_raise(a->vsc + ((size_t)cur * H + h) * KIVI_XB, ve);
      ve[0] = ve[1] = -14;
      cur = seq_i[t];
    }
    bad |= kivi_append_v32(sbs[t], &ly, cg, slot[t], xs[t], a->bf & (int)(fromsrc >> t), a->vclip, ve);
  }
  if (bad) {
#pragma omp atomic write
    flag[0] = a->call_id;
  }
  kivi_vexp_raise(a->vsc + ((size_t)cur * H + h) * KIVI_XB, ve);
}

/* 3: with every new value checked, the exponent bounds vsc (items < n H: each sequence's own),
 * and the new tokens that stay fp16 (after 2 has read the old ring slots).  Item = (sequence,
 * j, head, 8-channel chunk) for j < jmax = min(largest n_new, R): position p = L' - 1 - j, the
 * j-th newest, which goes to ring slot p mod R if it is a new token (a decode step: one item row
 * per sequence, not R).  Each item loads its 8 channels before storing them, so the loads of a
 * thread are in flight together (one chunk per thread keeps a decode step's copy parallel).
 * (The region's item 0 first reads the flag into flag_out, which a synchronous call maps back.) */
static inline __attribute__((always_inline)) void ap_commit_item(const ap_args *a, int64_t it) {
  const int n = a->n, H = a->H, D = a->D, R = a->R, NL = a->NL, layer = a->layer, nch8 = a->nch8, jmax = a->jmax;
  const int64_t *dd = a->dd;
  const size_t ring_lh = a->ring_lh;
  int64_t *flag = a->flag;
  if (flag[0]) return;
  if (it < (int64_t)n * H)
    kivi_vexp_raise(a->vexp + KIVI_VEXP_AT(dd[(size_t)D_SEQ * n + it / H], layer, NL, H) + (size_t)(it % H) * KIVI_XB,
                    a->vsc + it * KIVI_XB);
  const int ch = (int)(it % nch8);
  const int64_t ih = it / nch8; /* (sequence, j, head) */
  const int h = (int)(ih % H);
  const int j = (int)(ih / H % jmax);
  const int i = (int)(ih / ((int64_t)H * jmax));
  const int64_t s = dd[(size_t)D_SEQ * n + i], L = dd[(size_t)D_L * n + i], L2 = L + dd[(size_t)D_N * n + i];
  const int64_t p = L2 - 1 - j;
  if (p < L) return; /* not a new token (p >= 0: L >= 0) */
  const int slot = (int)(p % R);
  const size_t src = ((size_t)(dd[(size_t)D_STAGE * n + i] + (p - L)) * H + h) * D + (size_t)ch * 8;
  const size_t dst = (((size_t)s * NL + layer) * H + h) * ring_lh + (size_t)slot * D + (size_t)ch * 8;
  uint16_t x[8];
  if (p >= L2 - L2 % R) {
    for (int e = 0; e < 8; ++e) x[e] = a->kst[src + e];
    for (int e = 0; e < 8; ++e) a->kres[dst + e] = x[e];
  }
  if (p >= L2 - R) {
    for (int e = 0; e < 8; ++e) x[e] = a->vst[src + e];
    for (int e = 0; e < 8; ++e) a->vres[dst + e] = x[e];
  }
}

#if KIVI_APPEND_FUSED
/* The one-kernel append on a GPU: every sequence gains at most R tokens, so at most one block
 * per sequence completes.  One KIVI_APPEND_NT-thread block per (sequence i, kv-head h):
 *   0. converts and checks the pair's new tokens into the stage;
 *   1. quantizes the K block the append completes and the values leaving the window, reading
 *      old positions from the rings and new ones from the stage (writes beyond the lengths:
 *      nothing changes yet), and raises the lane's bounds vmax [i][h][KIVI_XB] (e + 15; 0: none;
 *      kept 0 between calls) to the exponents of the V scales and zeros and the K scales it
 *      stored;
 *   2. unless a block has found a non-finite value by then, writes the pair's new window tokens
 *      into its rings (over slots that 1 read), each slot's old contents first to the backup bk,
 *      bv (laid out as the stage), and marks the pair committed (cm[pair]).
 * The last block to arrive (an atomic counter) raises each sequence's exponent bounds of the
 * layer from vmax if no block found a non-finite value; if one did, it puts the backed-up slots
 * of every committed pair back (the rare path, one block), so a rejected call changes nothing.
 * It clears vmax either way; its thread 0 returns the flag (every other thread -1).  So a call is one launch, with no
 * grid-wide wait: a block only ever waits for its own threads.  Nothing but the arrival happens
 * if the layer's flag is already set (a failed earlier enqueued append on the layer).  The
 * arrival counter and vmax are the lane's: the calls of a lane run one after the other.
 * s_last, s_ve, s_f: the block's shared memory. */
static inline __attribute__((always_inline)) int64_t ap_fused_block(const ap_args *a, int *s_last, int32_t *s_ve, int64_t *s_f) {
  const int n = a->n, H = a->H, D = a->D, R = a->R, G = a->G, NL = a->NL, MB = a->MB, layer = a->layer;
  const int host_in = a->host_in, dt = a->dt, nch8 = a->nch8, ngrp = a->ngrp, vgrp = a->vgrp, vclip = a->vclip;
  const size_t ring_lh = a->ring_lh, sub = a->sub;
  const unsigned char *img = a->img;
  unsigned char *pool = a->pool;
  uint16_t *kres = a->kres, *vres = a->vres, *kst = a->kst, *vst = a->vst, *bk = a->bk, *bv = a->bv;
  int32_t *bt = a->bt, *vexp = a->vexp, *vmax = a->vmax, *cm = a->cm;
  int64_t *flag = a->flag, *arrive = a->arrive;
  const int64_t call_id = a->call_id;
  kivi_layout ly; /* rebuilt from scalars */
  kivi_layout_init(&ly, D, H, G, R, a->kbits, a->vbits);
  const int tid = ompx_thread_id_x(), nb = n * H, b = ompx_block_id_x(), i = b / H, h = b % H;
  const int64_t *idd = (const int64_t *)img;
  int committed = 0;
  int64_t flag_now = -1; /* the flag after the call: the last block's thread 0 only */
  if (tid == 0) { /* one read for the block: another block may set the flag meanwhile */
#pragma omp atomic read
    s_f[0] = flag[0];
  }
  ompx_sync_block_acq_rel();
  if (!s_f[0]) {
    const int64_t s = idd[(size_t)D_SEQ * n + i], L = idd[(size_t)D_L * n + i], nn = idd[(size_t)D_N * n + i];
    const int64_t st0 = idd[(size_t)D_STAGE * n + i], kb0 = idd[(size_t)D_KBPRE * n + i];
    const int64_t vb0 = idd[(size_t)D_VQBEG * n + i], L2 = L + nn, vb1 = L2 > R ? L2 - R : 0;
    const int64_t *btu = idd + a->ndesc64 + 2 * kb0; /* (table index, block id) of the new block */
    const int nkb = (int)(L2 / R - L / R);            /* 0 or 1 */
    const int32_t newblk = nkb ? (int32_t)btu[1] : -1;
    const int32_t *btrow = bt + ((size_t)s * NL + layer) * MB;
    if (nkb && h == 0 && tid == 0) bt[btu[0]] = newblk; /* beyond the length: harmless if not committed */
    if (tid == 0) s_ve[0] = s_ve[1] = s_ve[2] = -14;
    /* 0: the pair's new tokens as fp16, checked */
    const void *ksrc = host_in ? (const void *)(img + a->kraw) : a->kdev, *vsrc = host_in ? (const void *)(img + a->vraw) : a->vdev;
    int bad = 0;
    for (int e = tid; e < (int)nn * D; e += KIVI_APPEND_NT) { /* (32-bit index math: nn <= R) */
      const size_t j = ((size_t)(st0 + e / D) * H + h) * D + (size_t)(e % D);
      const uint16_t kh = kivi_in_f16(ksrc, (int64_t)j, dt), vh = kivi_in_f16(vsrc, (int64_t)j, dt);
      kst[j] = kh;
      vst[j] = vh;
      bad |= !kivi_f16_finite(kh) || !kivi_f16_finite(vh);
    }
    if (bad) {
#pragma omp atomic write
      flag[0] = call_id;
    }
    ompx_sync_block_acq_rel();
    /* 1: items (token group, word) of the new K block, then (token, channel group) */
    uint16_t *kring = kres + (((size_t)s * NL + layer) * H + h) * ring_lh;
    uint16_t *vring = vres + (((size_t)s * NL + layer) * H + h) * ring_lh;
    const int nki = nkb * ngrp * nch8, nvi = (int)(vb1 - vb0) * vgrp;
    int ve[3] = {-14, -14, -14};
    for (int it = tid; it < nki + nvi; it += KIVI_APPEND_NT) {
      if (it < nki) {
        const int g = it / nch8, w = it % nch8; /* w: 8-channel chunk */
        kivi_kexp_fold(&ve[2], kivi_append_k_item(pool + ((size_t)newblk * H + h) * sub, &ly, g, w,
                                                  L / R * R + (int64_t)g * G, L, kring, kst, st0, h), 8);
      } else {
        const int cg = (it - nki) % vgrp;
        const int p = (int)vb0 + (it - nki) / vgrp, bn = p / R; /* positions fit in int */
        const int32_t blk = nkb && bn == L / R ? newblk : btrow[bn];
        const uint16_t *x = kivi_src_row(p, L, vring, R, D, vst, st0, H, h);
        kivi_vexp_fold(ve, kivi_append_v_item(pool + ((size_t)blk * H + h) * sub, &ly, cg, p % R, x, vclip));
      }
    }
    kivi_vexp_raise(s_ve, ve);
    ompx_sync_block_acq_rel(); /* also: every read of the rings above is done */
    if (tid < 3 && s_ve[tid] > -14) {
      const int32_t x = s_ve[tid] + 15;
      int32_t *dv = vmax + KIVI_XB * ((size_t)i * H + h) + tid;
#pragma omp atomic compare
      if (*dv < x) { *dv = x; }
    }
    if (tid == 0) {
#pragma omp atomic read
      s_f[0] = flag[0];
    }
    ompx_sync_block_acq_rel();
    /* 2: the new tokens that stay fp16 (positions from p0 on; keys only in the last, partial
     * block), each ring slot saved to the backup before it is written */
    if (!s_f[0]) {
      committed = 1;
      const int64_t p0 = L2 - R > L ? L2 - R : L, pk = L2 - L2 % R;
      const int nw = (int)(L2 - p0) * nch8;
      for (int e = tid; e < nw; e += KIVI_APPEND_NT) {
        const int64_t p = p0 + e / nch8;
        const size_t sj = ((size_t)(st0 + (p - L)) * H + h) * D + (size_t)(e % nch8) * 8;
        const size_t rj = (size_t)((int)p % R) * D + (size_t)(e % nch8) * 8;
        const kivi_f16x8 ov = kivi_ld8(vring + rj), nv = kivi_ld8(vst + sj);
        *(kivi_f16x8 *)(bv + sj) = ov;
        *(kivi_f16x8 *)(vring + rj) = nv;
        if (p >= pk) {
          const kivi_f16x8 ok = kivi_ld8(kring + rj), nk = kivi_ld8(kst + sj);
          *(kivi_f16x8 *)(bk + sj) = ok;
          *(kivi_f16x8 *)(kring + rj) = nk;
        }
      }
    }
  }
  if (tid == 0) cm[b] = committed;
  /* arrival: the last block sees every block's writes */
  kivi_fence();
  ompx_sync_block_acq_rel();
  if (tid == 0) {
    int64_t before;
#pragma omp atomic capture
    before = arrive[0]++;
    s_last[0] = before == nb - 1;
  }
  ompx_sync_block_acq_rel();
  if (s_last[0]) {
    kivi_fence();
    if (tid == 0) {
#pragma omp atomic read
      s_f[0] = flag[0];
      arrive[0] = 0;
      flag_now = s_f[0];
    }
    ompx_sync_block_acq_rel();
    if (!s_f[0]) { /* the call stands: each sequence's exponent bounds rise to the call's */
      for (int e = tid; e < KIVI_XB * n * H; e += KIVI_APPEND_NT) {
        const int ex = vmax[e] - 15;
        int32_t *dv = vexp + KIVI_VEXP_AT(idd[(size_t)D_SEQ * n + e / (KIVI_XB * H)], layer, NL, H) + (size_t)(e % (KIVI_XB * H));
        if (vmax[e] > 0) {
#pragma omp atomic compare
          if (*dv < ex) { *dv = ex; }
        }
      }
    } else { /* a non-finite value: every committed pair's ring slots back from the backup */
      for (int bb = 0; bb < nb; ++bb) {
        if (!cm[bb]) continue;
        const int ii = bb / H, hh = bb % H;
        const int64_t s = idd[(size_t)D_SEQ * n + ii], L = idd[(size_t)D_L * n + ii];
        const int64_t L2 = L + idd[(size_t)D_N * n + ii], st0 = idd[(size_t)D_STAGE * n + ii];
        const int64_t p0 = L2 - R > L ? L2 - R : L, pk = L2 - L2 % R;
        const size_t rb = (((size_t)s * NL + layer) * H + hh) * ring_lh;
        for (int e = tid; e < (int)(L2 - p0) * nch8; e += KIVI_APPEND_NT) {
          const int64_t p = p0 + e / nch8;
          const size_t sj = ((size_t)(st0 + (p - L)) * H + hh) * D + (size_t)(e % nch8) * 8;
          const size_t rj = rb + (size_t)((int)p % R) * D + (size_t)(e % nch8) * 8;
          *(kivi_f16x8 *)(vres + rj) = kivi_ld8(bv + sj);
          if (p >= pk) *(kivi_f16x8 *)(kres + rj) = kivi_ld8(bk + sj);
        }
      }
    }
    ompx_sync_block_acq_rel();
    for (int e = tid; e < KIVI_XB * n * H; e += KIVI_APPEND_NT) vmax[e] = 0;
  }
  return flag_now;
}
#endif
#pragma omp end declare target

/* The regions, with the clauses of their run mode after the others (KIVI_LAUNCH_TWICE). */
#define AP_SINK_REGION(...)                                                                                           \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS map(to : simg[0:n_simg])          \
                is_device_ptr(kdev, vdev, flag, ksink, vsink) __VA_ARGS__)                                              \
  for (int64_t it = 0; it < 2 * nsi; ++it) {                                                                          \
    const ap_args a_ = {.simg = simg, .kdev = kdev, .vdev = vdev, .ksink = ksink, .vsink = vsink, .flag = flag,        \
                        .call_id = call_id, .nsink = nsink, .nsi = nsi, .hstride = hstride, .stab64 = stab64,          \
                        .H = H, .D = D, .dt = dt, .host_in = host_in, .svec = svec, .nch8 = nch8};                     \
    ap_sink_item(&a_, it);                                                                                            \
  }
#define AP_CONVERT_REGION(...)                                                                                        \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS map(to : img[0:n_img])            \
                is_device_ptr(kdev, vdev, kst, vst, flag, dd, bt, vsc) __VA_ARGS__)                                      \
  for (int64_t i = 0; i < 2 * nconv + nbt64 + ndesc64 + KIVI_XB * (int64_t)n * H; ++i) {                              \
    const ap_args a_ = {.img = img, .kdev = kdev, .vdev = vdev, .bt = bt, .vsc = vsc, .kst = kst, .vst = vst,          \
                        .flag = flag, .dd = dd, .kraw = kraw, .vraw = vraw, .call_id = call_id, .nconv = nconv,        \
                        .nbt64 = nbt64, .ndesc64 = ndesc64, .n = n, .H = H, .D = D, .R = R, .dt = dt,                  \
                        .host_in = host_in, .direct = direct, .vec = vec, .nch8 = nch8};                               \
    ap_convert_item(&a_, i);                                                                                          \
  }
/* what kernels 2a and 2b both read */
#define AP_QUANT_ARGS                                                                                                 \
  .pool = pool, .bt = bt, .vsc = vsc, .flag = flag, .dd = dd, .sub = sub, .ring_lh = ring_lh, .call_id = call_id,     \
  .n = n, .H = H, .D = D, .R = R, .G = G, .NL = NL, .MB = MB, .layer = layer, .kbits = kbits, .vbits = vbits, .bf = bf
#define AP_KEYS_REGION(...)                                                                                           \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS                                  \
                is_device_ptr(dd, pool, kres, ksrc, bt, vsc, flag) __VA_ARGS__)                                         \
  for (int64_t it = 0; it < n_kitems; ++it) {                                                                         \
    const ap_args a_ = {AP_QUANT_ARGS, .kres = kres, .ksrc = ksrc, .ngrp = ngrp, .k4chunks = k4chunks};                \
    ap_keys_item(&a_, it);                                                                                            \
  }
#define AP_VALUES_REGION(...)                                                                                         \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS                                  \
                is_device_ptr(dd, pool, vres, vsrc, bt, vsc, flag) __VA_ARGS__)                                         \
  for (int64_t iv = 0; iv < n_vitems; ++iv) {                                                                         \
    const ap_args a_ = {AP_QUANT_ARGS, .vres = vres, .vsrc = vsrc, .vclip = vclip, .vgrp = vgrp};                      \
    ap_values_item(&a_, iv, n_vq);                                                                                    \
  }
#define AP_COMMIT_REGION(...)                                                                                         \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS                                  \
                is_device_ptr(dd, kres, vres, kst, vst, flag, vexp, vsc) __VA_ARGS__)                                   \
  for (int64_t it = 0; it < n_ritems; ++it) {                                                                         \
    if (it == 0) flag_out = flag[0];                                                                                  \
    const ap_args a_ = {.vexp = vexp, .vsc = vsc, .kres = kres, .vres = vres, .kst = kst, .vst = vst, .flag = flag,   \
                        .dd = dd, .ring_lh = ring_lh, .n = n, .H = H, .D = D, .R = R, .NL = NL, .layer = layer,       \
                        .nch8 = nch8, .jmax = jmax};                                                                  \
    ap_commit_item(&a_, it);                                                                                          \
  }
#ifdef KIVI_SIMT_EMU /* the emulated kernel (a block) writes the caller's flag_out through a pointer */
#define AP_FLAG_OUT (*flag_out_p)
#else
#define AP_FLAG_OUT flag_out
#endif
#define AP_FUSED_REGION(...)                                                                                          \
  KIVI_BARE(n * H, KIVI_APPEND_NT, device(dev) map(to : img[0:n_img])                                                 \
                is_device_ptr(kdev, vdev, pool, kres, vres, kst, vst, bt, vexp, flag, arrive, vmax, cm, bk, bv) __VA_ARGS__) { \
    static int s_last[1];                                                                                             \
    static int32_t s_ve[3];                                                                                           \
    static int64_t s_f[1];                                                                                            \
    KIVI_PRAGMA(omp allocate(s_last, s_ve, s_f) allocator(omp_pteam_mem_alloc))                                      \
    const ap_args a_ = {.D = D, .H = H, .G = G, .R = R, .kbits = kbits, .vbits = vbits, .n = n, .img = img,           \
                        .flag = flag, .ndesc64 = ndesc64, .NL = NL, .layer = layer, .MB = MB, .bt = bt,               \
                        .host_in = host_in, .kraw = kraw, .kdev = kdev, .vraw = vraw, .vdev = vdev, .dt = dt,         \
                        .kst = kst, .vst = vst, .call_id = call_id, .kres = kres, .ring_lh = ring_lh, .vres = vres,   \
                        .ngrp = ngrp, .nch8 = nch8, .vgrp = vgrp, .pool = pool, .sub = sub, .vclip = vclip,           \
                        .vmax = vmax, .bk = bk, .bv = bv, .cm = cm, .arrive = arrive, .vexp = vexp};                  \
    const int64_t f_ = ap_fused_block(&a_, s_last, s_ve, s_f);                                                        \
    if (f_ >= 0) AP_FLAG_OUT = f_;                                                                                    \
  }                                                                                                                   \
  KIVI_REGION_END

int64_t kivi_append_run(kivi_cache *c, const kivi_append_job *j, int async, int lane) {
  const int dev = c->ctx->device, dt = (int)j->dtype, host_in = j->host_in, layer = j->layer;
  const int H = c->cfg.n_kv_heads, D = c->cfg.head_dim, R = c->cfg.residual, G = c->cfg.group, NL = c->cfg.n_layers;
  const int64_t nel64 = (int64_t)j->nel, nbt64 = (int64_t)j->n_bt, ndesc64 = (int64_t)j->n_desc, call_id = j->call_id;
  const size_t kraw = j->head, vraw = j->head + j->nel * j->esz, n_img = j->n_img;
  const unsigned char *img = j->img;
  const void *kdev = j->kdev, *vdev = j->vdev;
  int32_t *bt = c->bt, *vexp = c->vexp;
  unsigned char *pool = c->pool;
  uint16_t *kres = c->kres, *vres = c->vres;
  uint16_t *kst = (uint16_t *)((unsigned char *)j->stage + j->sdesc), *vst = kst + j->f16 / 2;
  int64_t *flag = j->flag, *dd = (int64_t *)j->stage;
  const int MB = c->max_blocks, n = j->n_seqs, kbits = c->lay.kb, vbits = c->lay.vb, vclip = c->cfg.v_clip;
  const size_t sub = c->lay.sub_bytes;
  const int ngrp = R / G;
  const int vgrp = D / G;
  const int nch8 = D / 8; /* 8-channel chunks of a row: items of kernels 1 and 3, K items of the one-kernel append */
  const size_t ring_lh = (size_t)R * D; /* one (seq, layer, head) ring */
  int64_t flag_out = 0;

  /* Where kernels 2a and 2b read the new tokens: a 16-byte aligned fp16 or bf16 input in device
   * memory directly (`direct`; they check it as they quantize it), any other input from the
   * stage of kernel 1.  vsc: the exponent bounds this call would raise, [sequence of the call]
   * [kv-head][KIVI_XB], raised into each sequence's own bounds by kernel 3 once every value has
   * been checked. */
  const int dev16 = !host_in && !(((uintptr_t)kdev | (uintptr_t)vdev) & 15); /* device inputs, 16-byte aligned */
  const int direct = dev16 && (dt == KIVI_F16 || dt == KIVI_BF16);
  const int bf = direct && dt == KIVI_BF16;
  const uint16_t *ksrc = direct ? (const uint16_t *)kdev : kst, *vsrc = direct ? (const uint16_t *)vdev : vst;
  int32_t *vsc = (int32_t *)((unsigned char *)j->stage + j->sdesc + 2 * j->f16);

  if (j->nsink > 0) { /* 0 */
    uint16_t *ksink = c->ksink, *vsink = c->vsink;
    const unsigned char *simg = j->simg;
    const size_t n_simg = j->n_simg;
    const int64_t nsink = j->nsink, nsi = nsink * H * nch8, hstride = (int64_t)c->ns * D, stab64 = (int64_t)j->stab;
    const int svec = host_in || dev16;
    KIVI_LAUNCH_TWICE(AP_SINK_REGION);
  }
  if (!j->fused) { /* 1 */
    const int64_t nconv = direct ? (int64_t)n * R * H * nch8 : nel64 / 8; /* items per tensor */
    const int vec = host_in || dev16;
    KIVI_LAUNCH_TWICE(AP_CONVERT_REGION);
  }
#if KIVI_APPEND_FUSED
  if (j->fused) {
    int64_t *arrive = j->arrive;
    int32_t *cm = vsc; /* which pairs committed */
    int32_t *vmax = (int32_t *)(c->aflag + NL + KIVI_MAX_ASYNC_LANES) +
                    (size_t)(lane < 0 ? 0 : lane) * KIVI_APPEND_FUSED_SEQS * H * KIVI_XB;
    uint16_t *bk = (uint16_t *)((unsigned char *)vsc + j->nvx), *bv = bk + j->f16 / 2; /* the rings' backup */
#ifdef KIVI_SIMT_EMU
    int64_t *const flag_out_p = &flag_out;
#endif
    KIVI_LAUNCH_READBACK(AP_FUSED_REGION, map(from : flag_out));
    return flag_out;
  }
#endif
  /* 2a */
  const int k4chunks = D / 4; /* 4 channels per item */
  const int64_t n_kitems = j->n_kb * H * ngrp * k4chunks;
  const int fast_k = n_kitems > 0 && kivi_gpu_append_eligible(c, kbits, bf) && /* append_gpu.c's kernel */
                     kivi_gpu_append_keys(c, layer, dd, n, j->n_kb, ksrc, vsc, flag, call_id, async, lane) == 0;
  if (n_kitems > 0 && !fast_k) KIVI_LAUNCH_TWICE(AP_KEYS_REGION);
  /* 2b */
  const int64_t n_vq = j->n_vq;
  const int64_t n_vchunks = (n_vq + KIVI_APPEND_VCHUNK - 1) / KIVI_APPEND_VCHUNK, n_vitems = n_vchunks * H * vgrp;
  const int fast_v = n_vitems > 0 && !vclip && kivi_gpu_append_eligible(c, vbits, bf) &&
                     kivi_gpu_append_values(c, layer, dd, n, n_vq, vsrc, vsc, flag, call_id, async, lane) == 0;
  if (n_vitems > 0 && !fast_v) KIVI_LAUNCH_TWICE(AP_VALUES_REGION);
  /* 3 */
  const int jmax = j->max_new < 1 ? 1 : j->max_new < R ? j->max_new : R; /* >= 1: the flag comes back */
  const int64_t n_ritems = (int64_t)n * jmax * H * nch8;
  KIVI_LAUNCH_READBACK(AP_COMMIT_REGION, map(from : flag_out));
  return flag_out;
}
