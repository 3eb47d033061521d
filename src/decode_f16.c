/* The fp16 cache's streamed decode kernel (kivi_gpu_f16_decode), for every layout: keys and values
 * unquantized (16 bits), head_dim D (128 or 64).  One block per (row, kv-head, chunk of up to 8
 * query heads, split of fs tokens: plan.c), the split's K and V rows read once for the chunk's
 * heads.  Inside the block, each of its F16S_NW warps streams its own 16-token units (unit u of
 * the split: warp u % F16S_NW) through a ring of 2 stages in shared memory, filled with cp.async
 * one unit ahead of the one computed, and keeps an online softmax, so that no block-wide barrier
 * stands between the loads (round 24 of docs/PERFORMANCE.md: the two-phase kernel idles its loads
 * at its barriers).  Inputs: f16_args.
 *
 * The heads are the rows of the MMAs (m16n8k16, fp32 accumulators): row g < 8 is head g's hi
 * part, row g + 8 its lo part (q 2^-e and p as two f16 parts, 22 bits), so that one MMA takes
 * every head of the chunk and both parts, and lane (g, t) holds head g:
 *
 *  - K: logits^T = Q K^T, A = q (head rows x 16 channels, in registers for the whole split), B =
 *    16 channels x 8 tokens of K from shared memory with ldmatrix (rows = tokens, 16-byte chunks
 *    XOR-swizzled by the row, so that 8 rows' chunks fall in distinct banks).  Lane (g, t) gets
 *    head g's logits of tokens 2 t, 2 t + 1 (n-tile 0) and 2 t + 8, 2 t + 9 (n-tile 1): the hi
 *    row's plus the lo row's.
 *  - Online softmax per head (base 2): the unit's maximum over the 4 lanes of g, the running
 *    maximum, sum and accumulators rescaled when it moves.
 *  - V: out^T += P V, A = p: the K phase's C fragments are the A fragment of the 16 tokens as
 *    they stand (row g the hi part, row g + 8 the lo part); B = 16 tokens x 8 channels of V from
 *    shared memory with ldmatrix.trans.  acc[j]: channels 8 j + 2 t, + 1 of head g, hi (0, 1) and
 *    lo (2, 3) rows.
 * The warps' partials are merged in shared memory at the end; the split's partial or, with one
 * split, the output (f32 or f16). */
#include "config.h"

#include "internal.h"
#include "kernels_attn.h"
#include "plan.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include "gpu_ops.h"

#define F16S_NW KIVI_F16S_NW       /* warps per block (plan.h) */
#define F16S_NT (32 * F16S_NW)     /* threads per block */
#define F16S_CSLOTS 256            /* slots the parallel combine takes (its weights over the rings) */
#define F16S_UW(D) (16 * (D) / 2)  /* 32-bit words of a unit's keys (or values) */
/* The warps' m and l for the merge and the arrival's flag have arrays of their own, or, where
 * those and the rings would exceed the 48 KB of static shared memory a kernel may have (3 warps
 * at head_dim 128), words of the rings that the merge and the combine leave unused: m and l after
 * the warp's 8 x D outputs, the flag in the rings' last word. */
#define F16S_ALIAS(D) (16 * F16S_NW * F16S_UW(D) + 64 * F16S_NW + 4 > 48 * 1024)
_Static_assert(F16S_NW >= 2 && 16 * F16S_NW * F16S_UW(128) <= 48 * 1024, "the rings fit the static shared memory");
_Static_assert(8 * 128 + 16 <= 4 * F16S_UW(128) && 8 * 64 + 16 <= 4 * F16S_UW(64),
               "a warp's outputs, m and l fit its ring");
_Static_assert(F16S_NT >= 64, "the combine's weights: 8 lanes for each of 8 heads");
_Static_assert(8 * F16S_CSLOTS + 8 < F16S_NW * 2 * 2 * F16S_UW(64),
               "the combine's weights fit over the rings, before the flag");

/* What a block needs: the cache, the call, the launch's geometry. */
typedef struct f16_args {
  const unsigned char *pool;
  const int32_t *bt;
  const float *q;
  float *part_o, *part_ml;
  const uint16_t *kres, *vres;
  unsigned *cnt;
  void *out;
  const int64_t *dd;
  int layer, rows, HQ, col_seq, col_lc, fs, nf, nqc, gsz, out_f16;
  float qmul;
  int H, NL, MB, Rm, lr;
  size_t sub;
  uint32_t bsz;
  unsigned vcode_off;
} f16_args;

#pragma omp declare target
/* One block (see the top of the file).  D: a constant of the launch; s_ring: the warps' rings;
 * s_ml and s_last: the merge's m and l and the arrival's flag (unused where F16S_ALIAS(D)). */
static inline __attribute__((always_inline)) void f16_block(const f16_args *a, const int D,
                                                            uint32_t (*s_ring)[2][2 * F16S_UW(D)],
                                                            float (*s_ml)[8][2], int *s_last) {
  const unsigned char *const pool = a->pool;
  const int32_t *const bt = a->bt;
  const float *const q = a->q, qmul = a->qmul;
  float *const part_o = a->part_o, *const part_ml = a->part_ml;
  const uint16_t *const kres = a->kres, *const vres = a->vres;
  unsigned *const cnt = a->cnt;
  void *const out = a->out;
  const int64_t *const dd = a->dd;
  const int layer = a->layer, rows = a->rows, HQ = a->HQ, col_seq = a->col_seq, col_lc = a->col_lc, fs = a->fs,
            nf = a->nf, nqc = a->nqc, gsz = a->gsz, out_f16 = a->out_f16, H = a->H, NL = a->NL, MB = a->MB,
            Rm = a->Rm, lr = a->lr;
  const size_t sub = a->sub;
  const uint32_t bsz = a->bsz;
  const unsigned vcode_off = a->vcode_off;
  const int KS = D / 16, /* k-steps of K, n-tiles of V (of 8 channels each: 2 per k-step) */
      CH = D / 8,        /* 16-byte chunks per row */
      RW = D / 2,        /* 32-bit words per row */
      UW = F16S_UW(D),   /* words of a unit's keys (or values) */
      DIRECT = D == 64;  /* the constant-offset copy of units wholly in the pool */
#define F16S_RING(w, st) (&s_ring[w][st][0])
#define F16S_ML(w) (F16S_ALIAS(D) ? (float(*)[2])((float *)&s_ring[w][0][0] + 8 * D) : s_ml[w])
#define F16S_LAST (F16S_ALIAS(D) ? (int *)&s_ring[F16S_NW - 1][1][2 * UW - 1] : s_last)
  const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int blk = ompx_block_id_x();
  const int sf = blk % nf, grp = blk / nf, qc = grp % nqc, pr = grp / nqc, kvh = pr % H, r = pr / H;
  const int hq0 = kvh * gsz + qc * 8, nh = gsz - qc * 8 < 8 ? gsz - qc * 8 : 8;
  const int64_t s = dd[(int64_t)col_seq * rows + r];
  const int Lc = (int)dd[(int64_t)col_lc * rows + r], t0 = sf * fs;
  const int n = Lc - t0 < fs ? Lc - t0 : fs;
  const int Lk = Lc - (Lc & Rm), Lv = Lc > Rm + 1 ? Lc - Rm - 1 : 0;
  const size_t base = ((size_t)r * HQ + hq0) * nf + sf; /* slot of head hq0; + h nf for head hq0 + h */
  if (n <= 0) { /* block-uniform: this row has fewer splits */
    if (tid < nh) {
      part_ml[2 * (base + (size_t)tid * nf)] = -INFINITY;
      part_ml[2 * (base + (size_t)tid * nf) + 1] = 0.0f;
    }
  } else {
    const int32_t *btrow = bt + ((size_t)s * NL + layer) * MB;
    const unsigned char *hb = pool + (size_t)kvh * sub;
    const size_t ring = (((size_t)s * NL + layer) * H + kvh) * (size_t)(Rm + 1) * D;
    const uint16_t *kr = kres + ring, *vr = vres + ring;
    /* ---- A of K: row g head g's q 2^-e (hi), row g + 8 its remainder (lo); 0 past the chunk */
    const int hv = g < nh;
    const float *qh = q + ((size_t)r * HQ + hq0 + (hv ? g : 0)) * D;
    float qv[32], qmax = 0.0f; /* 4 KS used */
    #pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      #pragma unroll
      for (int i = 0; i < 4; ++i) { /* channels 16 ks + 2 t + {0, 1} (i < 2) and + 8 (i >= 2) */
        qv[4 * ks + i] = qh[16 * ks + 2 * t4 + (i & 1) + 8 * (i >> 1)] * qmul;
        qmax = fmaxf(qmax, fabsf(qv[4 * ks + i]));
      }
    qmax = fmaxf(qmax, shfx(qmax, 1)); /* the 4 lanes of g hold the head's channels */
    qmax = fmaxf(qmax, shfx(qmax, 2));
    int e = fk_ceil_exp(qmax > 0.0f ? qmax : 1.0f) - 14; /* |q 2^-e| < 2^14 */
    e = e < -100 ? -100 : e;
    const float qs = fk_p2(-e), esc = fk_p2(e);
    uint32_t qa[8][4]; /* KS used */
    #pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      fk_hilo(qv[4 * ks] * qs, qv[4 * ks + 1] * qs, &qa[ks][0], &qa[ks][1]);
      fk_hilo(qv[4 * ks + 2] * qs, qv[4 * ks + 3] * qs, &qa[ks][2], &qa[ks][3]);
      #pragma unroll
      for (int i = 0; i < 4; ++i) qa[ks][i] = hv ? qa[ks][i] : 0u;
    }
    /* ---- the warp's units: u = wid + F16S_NW k, tokens t0 + 16 u .. + 15 (within one block
     * of the pool: t0 is a multiple of 64, blocks hold a power of two >= 32 tokens) */
    const int nu = (n + 15) >> 4, nk = nu > wid ? (nu - wid + F16S_NW - 1) / F16S_NW : 0;
    uint32_t *rg = F16S_RING(wid, 0);
    const uint32_t sring = fk_saddr(rg);
    /* unit k into stage st: lane copies chunk lane % CH of rows lane / CH + (32 / CH) i; rows
     * past n copy the unit's first token (a valid row of the same block: its weight is 0);
     * bte the unit's block-table entry.  At head_dim 64 (DIRECT) a unit whose keys and
     * values all lie in the pool (most of them) takes one base address and constant offsets;
     * at 128 that path costs more registers than it saves (docs/PERFORMANCE.md, round 27; a copy of
     * such units in one statement, tried in round 41, was 0-7 % slower: round 45). */
#define F16S_COPY(k, st, bte)                                                                     \
  do {                                                                                            \
    const int j0_ = 16 * (wid + F16S_NW * (k));                                                   \
    const unsigned char *sb_ = hb + (uint64_t)(uint32_t)kivi_block_index(bte) * bsz;              \
    const uint32_t dk_ = sring + 4u * (st) * 2 * UW; /* shared address of the stage's keys */     \
    if (DIRECT && j0_ + 16 <= n && t0 + j0_ + 16 <= Lv) { /* warp-uniform: 16 rows in the pool */ \
      const unsigned char *kb_ = sb_ + 2u * D * (unsigned)((t0 + j0_) & Rm) + 16 * (lane % CH);   \
      _Pragma("unroll") for (int i_ = 0; i_ < 16 * CH / 32; ++i_) {                               \
        const int row_ = (lane + 32 * i_) / CH;                                                   \
        const unsigned at_ = (unsigned)row_ * RW + 4u * (unsigned)((lane % CH) ^ (row_ & 7));     \
        fk_cp16s(dk_ + 4u * at_, kb_ + 2u * D * (unsigned)row_);                                  \
        fk_cp16s(dk_ + 4u * (UW + at_), kb_ + vcode_off + 2u * D * (unsigned)row_);               \
      }                                                                                           \
    } else                                                                                        \
    _Pragma("unroll") for (int i_ = 0; i_ < 16 * CH / 32; ++i_) {                                 \
      const int q_ = lane + 32 * i_, row_ = q_ / CH, ch_ = q_ % CH;                               \
      const int tt_ = t0 + j0_ + (j0_ + row_ < n ? row_ : 0), tr_ = tt_ & Rm;                     \
      const unsigned at_ = (unsigned)row_ * RW + 4u * (unsigned)(ch_ ^ (row_ & 7));               \
      const unsigned char *ks_ = tt_ < Lk ? sb_ + 2u * D * (unsigned)tr_                          \
                                          : (const unsigned char *)(kr + (size_t)tr_ * D);        \
      const unsigned char *vs_ = tt_ < Lv ? sb_ + vcode_off + 2u * D * (unsigned)tr_              \
                                          : (const unsigned char *)(vr + (size_t)tr_ * D);        \
      fk_cp16s(dk_ + 4u * at_, ks_ + 16 * ch_);                                                   \
      fk_cp16s(dk_ + 4u * (UW + at_), vs_ + 16 * ch_);                                            \
    }                                                                                             \
  } while (0)
    /* the block-table entry of unit k's tokens (any entry past the row's blocks: unused) */
#define F16S_BTE(k) btrow[(t0 + 16 * (wid + F16S_NW * (k))) >> lr]
    if (nk > 0) F16S_COPY(0, 0, F16S_BTE(0));
    fk_cp_commit();
    int bte = nk > 1 ? F16S_BTE(1) : 0;
    float mrun = -INFINITY, lrun = 0.0f, acc[16][4]; /* 2 KS used */
    #pragma unroll
    for (int j = 0; j < 2 * KS; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    /* lane l's ldmatrix rows: K (tokens l % 8 of n-tile nt, chunk 4 c2 + l / 8) and V (token
     * l % 8 + 8 (l / 8 % 2), chunk 2 c2 + l / 16) */
    const int krow = lane & 7, kch = lane >> 3, vrow = (lane & 7) + 8 * ((lane >> 3) & 1), vch = lane >> 4;
    for (int k = 0; k < nk; ++k) {
      if (k + 1 < nk) F16S_COPY(k + 1, (k + 1) & 1, bte);
      fk_cp_commit();
      if (k + 2 < nk) bte = F16S_BTE(k + 2);
      fk_cp_wait(1); /* unit k's copies (this thread's) are done */
      fk_wsync();    /* and the other lanes' */
      const uint32_t *sk = rg + (k & 1) * 2 * UW, *sv = sk + UW;
      /* ---- K: d[nt] = logits^T of tokens 8 nt .. 8 nt + 7 */
      float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      #pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        #pragma unroll
        for (int c2 = 0; c2 < KS / 2; ++c2) {
          const int row = 8 * nt + krow, ch = 4 * c2 + kch;
          uint32_t b[4];
          fk_ldsm4(b, sk + row * RW + 4 * (ch ^ (row & 7)));
          mma16816(d[nt], qa[2 * c2][0], qa[2 * c2][1], qa[2 * c2][2], qa[2 * c2][3], b[0], b[1]);
          mma16816(d[nt], qa[2 * c2 + 1][0], qa[2 * c2 + 1][1], qa[2 * c2 + 1][2], qa[2 * c2 + 1][3], b[2], b[3]);
        }
      /* ---- online softmax of head g over the unit's tokens 2 t + {0, 1} (+ 8) */
      const int jb = 16 * (wid + F16S_NW * k) + 2 * t4;
      float x[4];
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int nt = i >> 1, c = i & 1;
        x[i] = jb + 8 * nt + c < n ? (d[nt][c] + d[nt][2 + c]) * esc : -INFINITY;
      }
      float mu = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
      mu = fmaxf(mu, shfx(mu, 1));
      mu = fmaxf(mu, shfx(mu, 2));
      const float mnew = fmaxf(mrun, mu);
      float p[4];
      #pragma unroll
      for (int i = 0; i < 4; ++i) p[i] = fk_ex2(x[i] - mnew);
      if (fk_ballot(mnew > mrun)) { /* warp-uniform: some head's maximum moved */
        const float alpha = fk_ex2(mrun - mnew);
        lrun *= alpha;
        #pragma unroll
        for (int j = 0; j < 2 * KS; ++j) {
          acc[j][0] *= alpha;
          acc[j][1] *= alpha;
          acc[j][2] *= alpha;
          acc[j][3] *= alpha;
        }
      }
      lrun += (p[0] + p[1]) + (p[2] + p[3]);
      mrun = mnew;
      uint32_t pa[4]; /* A of V: row g hi, row g + 8 lo; tokens 2 t, + 1 (pa 0, 1), + 8 (pa 2, 3) */
      fk_hilo(p[0], p[1], &pa[0], &pa[1]);
      fk_hilo(p[2], p[3], &pa[2], &pa[3]);
      /* ---- V: acc[j] += P V[:, 8 j .. 8 j + 7] */
      #pragma unroll
      for (int c2 = 0; c2 < KS; ++c2) {
        const int ch = 2 * c2 + vch;
        uint32_t b[4];
        fk_ldsm4t(b, sv + vrow * RW + 4 * (ch ^ (vrow & 7)));
        mma16816(acc[2 * c2], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
        mma16816(acc[2 * c2 + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
      }
      fk_wsync(); /* the stage is read before unit k + 2's copy overwrites it */
    }
#undef F16S_BTE
#undef F16S_COPY
    lrun += shfx(lrun, 1);
    lrun += shfx(lrun, 2);
    /* ---- merge the warps: warps 1.. leave m, l and o (hi + lo rows) in shared memory over the
     * rings (2 UW words a warp >= 8 D), warp 0 merges and writes */
    fk_sync(); /* every warp's ring is read */
    float *so = (float *)F16S_RING(wid, 0); /* [8][D] */
    if (wid > 0) {
      #pragma unroll
      for (int j = 0; j < 2 * KS; ++j) {
        so[g * D + 8 * j + 2 * t4] = acc[j][0] + acc[j][2];
        so[g * D + 8 * j + 2 * t4 + 1] = acc[j][1] + acc[j][3];
      }
      if (t4 == 0) {
        F16S_ML(wid)[g][0] = mrun;
        F16S_ML(wid)[g][1] = lrun;
      }
    }
    fk_sync();
    if (wid == 0) {
      float m = mrun;
      #pragma unroll
      for (int w = 1; w < F16S_NW; ++w) m = fmaxf(m, F16S_ML(w)[g][0]);
      float wt[F16S_NW], l = 0.0f;
      #pragma unroll
      for (int w = 0; w < F16S_NW; ++w) { /* a warp without units: m = -inf, weight 0, o = 0 */
        const float mw = w ? F16S_ML(w)[g][0] : mrun, lw = w ? F16S_ML(w)[g][1] : lrun;
        wt[w] = lw > 0.0f ? fk_ex2(mw - m) : 0.0f;
        l = fmaf(wt[w], lw, l);
      }
      if (hv)
        #pragma unroll
        for (int j = 0; j < 2 * KS; ++j)
          #pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int ch = 8 * j + 2 * t4 + c;
            float o = wt[0] * (acc[j][c] + acc[j][2 + c]);
            #pragma unroll
            for (int w = 1; w < F16S_NW; ++w) o = fmaf(wt[w], ((float *)F16S_RING(w, 0))[g * D + ch], o);
            if (nf == 1) {
              kivi_store_out(out, out_f16, ((int64_t)r * HQ + hq0 + g) * D + ch, o / l);
            } else {
              const size_t sl = base + (size_t)g * nf;
              part_o[sl * D + ch] = o;
              if (ch == 0) {
                part_ml[2 * sl] = m;
                part_ml[2 * sl + 1] = l;
              }
            }
          }
    }
  }
  if (nf > 1) { /* ---- arrival: the last block of the (row, head chunk) combines its nf partials */
    if (fk_block_arrive(cnt + (size_t)r * HQ + hq0, (unsigned)(nf - 1), tid, F16S_LAST)) {
      const size_t rh0 = (size_t)r * HQ + hq0;
      if (nf <= F16S_CSLOTS) {
        /* the weights 2^(m_s - M) of every (head, slot) at once (the first 64 threads, 8 lanes
         * a head, 0 where l = 0) into shared memory over the rings, then each thread's channels
         * with every slot's load issued without a branch (an empty slot's o may be unset:
         * loaded and dropped) */
        float *s_wt = (float *)F16S_RING(0, 0), *s_den = s_wt + 8 * F16S_CSLOTS;
        if (F16S_NT == 64 || tid < 64) { /* warp-uniform: the first 64 threads */
          const int h = tid >> 3, i8 = tid & 7;
          const float *ml = part_ml + (rh0 + (size_t)(h < nh ? h : 0)) * nf * 2;
          float M = -INFINITY, den = 0.0f;
          for (int sl = i8; sl < nf; sl += 8) M = fmaxf(M, ml[2 * sl + 1] > 0.0f ? ml[2 * sl] : -INFINITY);
          M = fmaxf(M, shfx(M, 1));
          M = fmaxf(M, shfx(M, 2));
          M = fmaxf(M, shfx(M, 4));
          for (int sl = i8; sl < nf; sl += 8) {
            const float l = ml[2 * sl + 1], w = l > 0.0f ? fk_ex2(ml[2 * sl] - M) : 0.0f;
            s_wt[h * F16S_CSLOTS + sl] = w;
            den = fmaf(w, l, den);
          }
          den += shfx(den, 1);
          den += shfx(den, 2);
          den += shfx(den, 4);
          if (i8 == 0) s_den[h] = den;
        }
        fk_sync();
        /* 4 channels an item: a slot's 4 partial outputs in one 16-byte load, its weight once
         * (4-8 % less time than a channel an item at 32/8 batch 1, round 45) */
        for (int i = tid; i < nh * D / 4; i += F16S_NT) {
          const int hh = i / (D / 4), c = 4 * (i % (D / 4));
          const float *po = part_o + (rh0 + (size_t)hh) * nf * D + c, *wt = s_wt + hh * F16S_CSLOTS;
          fk_v4f num = {0.0f, 0.0f, 0.0f, 0.0f};
          #pragma unroll 8
          for (int sl = 0; sl < nf; ++sl) {
            const fk_v4f o = *(const fk_v4f *)(po + (size_t)sl * D);
            const float w = wt[sl];
            if (w > 0.0f) num += w * o;
          }
          const float den = s_den[hh];
          #pragma unroll
          for (int j = 0; j < 4; ++j) kivi_store_out(out, out_f16, (int64_t)rh0 * D + hh * D + c + j, num[j] / den);
        }
      } else {
        for (int i = tid; i < nh * D; i += F16S_NT)
          kivi_combine_item((int64_t)rh0 * D + i, D, nf, part_o, part_ml, out, out_f16, NULL);
      }
      if (tid == 0) cnt[rh0] = 0;
    }
  }
#undef F16S_LAST
#undef F16S_ML
#undef F16S_RING
}
#pragma omp end declare target

/* The region of one head_dim, with the clauses of its run mode after the others. */
#define F16_REGION(DD, ...)                                                                                           \
  KIVI_BARE(nblk, F16S_NT, device(dev) is_device_ptr(pool, bt, q, part_o, part_ml, kres, vres, cnt, out)              \
                map(to : dd[0:ndd])                                                                                   \
                firstprivate(layer, rows, HQ, col_seq, col_lc, fs, nf, nqc, gsz, out_f16, qmul, H, NL, MB, Rm, lr,    \
                             sub, bsz, vcode_off) __VA_ARGS__) {                                                      \
    static uint32_t s_ring[F16S_NW][2][2 * F16S_UW(DD)] __attribute__((aligned(16)));                                 \
    static float s_ml[F16S_NW][8][2];                                                                                 \
    static int s_last[1];                                                                                             \
    KIVI_PRAGMA(omp allocate(s_ring, s_ml, s_last) allocator(omp_pteam_mem_alloc))                                    \
    const f16_args a_ = {.nf = nf, .nqc = nqc, .H = H, .gsz = gsz, .dd = dd, .col_seq = col_seq, .rows = rows,        \
                         .col_lc = col_lc, .fs = fs, .Rm = Rm, .HQ = HQ, .part_ml = part_ml, .bt = bt, .NL = NL,      \
                         .layer = layer, .MB = MB, .pool = pool, .sub = sub, .kres = kres, .vres = vres, .q = q,      \
                         .qmul = qmul, .bsz = bsz, .vcode_off = vcode_off, .lr = lr, .out = out,                      \
                         .out_f16 = out_f16, .part_o = part_o, .cnt = cnt};                                           \
    /* (in the order of the fields' first use in the kernel: the order of the kernel's parameters) */                \
    f16_block(&a_, DD, s_ring, s_ml, s_last);                                                                         \
  }                                                                                                                   \
  KIVI_REGION_END

void kivi_gpu_f16_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_lc, int fs, int nf, const float *q, float qmul, float *part_o, float *part_ml,
                         unsigned *cnt, void *out, int out_f16, int async, int lane) {
  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int gsz = HQ / H, nqc = kivi_head_chunks(gsz, KIVI_F16_NH);
  const int Rm = R - 1, lr = kivi_log2up(R);
  const uint32_t bsz = (uint32_t)c->lay.block_bytes; /* kivi_gpu_f16_eligible */
  const size_t sub = c->lay.sub_bytes;
  const unsigned vcode_off = (unsigned)c->lay.vcode_off;
  const int dev = c->ctx->device;
  const int nblk = rows * H * nqc * nf;
  if (nblk <= 0) return;
  if (c->cfg.head_dim == 64) KIVI_LAUNCH_TWICE(F16_REGION, 64, ); else KIVI_LAUNCH_TWICE(F16_REGION, 128, );
}

#else /* no offload: never called (plan.c: never eligible) */
void kivi_gpu_f16_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_lc, int fs, int nf, const float *q, float qmul, float *part_o, float *part_ml,
                         unsigned *cnt, void *out, int out_f16, int async, int lane) {
  (void)c; (void)layer; (void)rows; (void)HQ; (void)dd; (void)ndd; (void)col_seq; (void)col_lc; (void)fs; (void)nf;
  (void)q; (void)qmul; (void)part_o; (void)part_ml; (void)cnt; (void)out; (void)out_f16; (void)async; (void)lane;
}
#endif
