/* The GQA decode kernel: a decode call on a cache of 2- or 4-bit keys and values (any mix),
 * head_dim 64 or 128, G = 32, with one or more query heads per kv-head, in one launch.
 *
 * One block of 4 warps per (row, kv-head, chunk of up to 8 query heads, split of the row's
 * quantized tokens), plus, in a decode call, ntail tail blocks per (row, kv-head, chunk) for the
 * rest of the row (at most R + 31 tokens, whose values are in the fp16 window); the last block
 * of a (row, chunk) to finish combines the partials.  Inside a block each warp streams its own 32-token groups (the
 * block's groups w, w + 4, ...) through a ring of shared-memory stages (cp.async, NS - 1
 * groups ahead), with an online softmax per warp and no block barrier until the end.  Per
 * group and warp:
 *
 *  - keys, S^T = A B on the tensor cores (m16n8k16, fp32 accumulators): row g of A is query
 *    head g's q * scale * 2^(24 - pos - SK) as its f16 hi part, row g + 8 its lo part (22 bits
 *    in all); B = the codes of 8 tokens as they lie in their words (ldmatrix from the stage: lane
 *    (g, t) holds word t of a 16-byte piece of token g), a field masked out of its word being the
 *    f16 subnormal code * 2^(pos - 24), so no code is converted.  The k order is the words'
 *    own: k-tile kt takes field pairs (p, p + 16 / b) of the lane's word; q's channels follow
 *    it.  The zeros' term q . zero is one more product per k-tile, A = q * 2^-SKb (hi and lo,
 *    a table of the block), B = the zeros' words as they lie.
 *  - softmax: lane (g, t) holds head g's logits of tokens 8 nt + 2t, + 1; the maximum of the
 *    group over the quad, the accumulators rescaled only when it rises (a warp vote).
 *  - values, O^T = A B: A = the codes (row: a channel, k: 16 tokens), one PRMT pairing two
 *    tokens' bytes (2-bit) or half-words (4-bit) and one AND per field, rows g and g + 8 of
 *    m-tile (G, j) the channels 32 G + 4 g + 2 j and + 1, each at its field's power of two;
 *    B = p * scale of the m-tile's value group (column: a head): the K product's accumulators
 *    are already B's fragment, so p never leaves the registers.  The zeros' sums p . zero are
 *    one product per 16 tokens (A: row G the group's zeros).
 *
 * 58 tensor-core products per group and warp at 2-bit, head_dim 128; the codes are read from
 * shared memory once.  A tail block takes GQ_WCH of the row's last tokens in fp32 (by the plan's
 * Lf their values are in the fp16 window but for fewer than 32, their keys quantized or not): every
 * row and scale it reads copied into shared memory at once, then a thread per (token, pair of
 * heads) for the logits, a thread per channel for the values.  Accuracy: the K operands carry 22
 * bits, the V operands p * scale one
 * f16 (fp16-attention class, FAST_REL_TOL).  docs/PERFORMANCE.md, round 42, has its measurements. */
#include "config.h"

#include "internal.h"
#include "kernels_attn.h"
#include "plan.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include "gpu_ops.h"

#define GQ_NH 8    /* query heads per block: MMA rows g (hi parts) and g + 8 (lo parts) */
#define GQ_WCH KIVI_GQA_TAIL /* window tokens a tail block takes: a (row, kv-head, chunk) has ntail of them */
#define GQ_SMEM 49152 /* bytes of shared memory a block may take (48 KB of static shared memory) */
/* One stage: a group's K codes [32][D kb / 8], K scales and zeros [2][D] f16, V codes
 * [32][D vb / 8], V scale/zero pairs [32][D / 32] */
#define GQ_ST(D, KB, VB) (4 * (D) * ((KB) + (VB) + 2))
#define GQ_KT(D) ((D) / 16)             /* k-tiles of the key products */
#define GQ_TAB(D) (GQ_KT(D) * 32 * 16)  /* bytes of one A table ([kt][lane] 16 bytes) */
/* Stages per warp (at most 4), beside the two A tables (the keys' and the zeros') */
#define GQ_NS0(D, KB, VB) ((GQ_SMEM - 2 * GQ_TAB(D)) / (4 * GQ_ST(D, KB, VB)))
#define GQ_NS(D, KB, VB) (GQ_NS0(D, KB, VB) > 4 ? 4 : GQ_NS0(D, KB, VB))
/* After the loop the rings' space holds the merge: O [8][D], {m, l} [8][4], the warps' m and l
 * [4][8][2], then the warps' outputs [4][8][D] */
#define GQ_OFF_ML(D) (32 * (D))
#define GQ_OFF_WML(D) (GQ_OFF_ML(D) + 128)
#define GQ_OFF_X(D) (GQ_OFF_WML(D) + 256)
#define GQ_MERGE(D) (GQ_OFF_X(D) + 128 * (D))
#define GQ_RINGS(D, KB, VB) (4 * GQ_NS(D, KB, VB) * GQ_ST(D, KB, VB))
#define GQ_UNION(D, KB, VB) (GQ_RINGS(D, KB, VB) > GQ_MERGE(D) ? GQ_RINGS(D, KB, VB) : GQ_MERGE(D))
#define GQ_SPLIT_BYTES(D, KB, VB) (GQ_UNION(D, KB, VB) + 2 * GQ_TAB(D))
/* A tail block's shared memory (gq_tail): q * qmul of the chunk's heads [8][D] fp32, its tokens'
 * key rows and value rows [GQ_WCH][2 D] bytes each (fp16, or the codes in the row's first bytes),
 * the K scales and zeros and the V scale/zero pairs of its GQ_WCH / 32 groups [GQ_WCH / 32][4 D]
 * each, the logits [GQ_WCH][8], then m and l [8][2] */
#define GT_K(D) (32 * (D))
#define GT_V(D) (GT_K(D) + 2 * (D) * GQ_WCH)
#define GT_KS(D) (GT_V(D) + 2 * (D) * GQ_WCH)
#define GT_VS(D) (GT_KS(D) + (D) * (GQ_WCH / 8))
#define GT_X(D) (GT_VS(D) + (D) * (GQ_WCH / 8))
#define GT_ML(D) (GT_X(D) + 4 * GQ_NH * GQ_WCH)
#define GT_BYTES(D) (GT_ML(D) + 8 * GQ_NH)
#define GQ_BYTES(D, KB, VB) (GQ_SPLIT_BYTES(D, KB, VB) > GT_BYTES(D) + 32 ? GQ_SPLIT_BYTES(D, KB, VB) : GT_BYTES(D) + 32)
_Static_assert(GQ_NS(128, 4, 4) >= 2 && GQ_NS(128, 4, 2) >= 2 && GQ_NS(128, 2, 2) >= 2 && GQ_NS(64, 4, 4) >= 2,
               "a stage ahead");
_Static_assert(GQ_BYTES(128, 2, 2) <= GQ_SMEM && GQ_BYTES(128, 4, 4) <= GQ_SMEM && GQ_BYTES(128, 4, 2) <= GQ_SMEM &&
                   GQ_BYTES(64, 4, 4) <= GQ_SMEM && GQ_BYTES(64, 2, 2) <= GQ_SMEM,
               "the block's shared memory fits");
_Static_assert(FNW == 4 && FNT == 128, "4 warps of 32 lanes");
_Static_assert(KIVI_MAX_RESIDUAL % 32 == 0, "window rounds");
_Static_assert((4 * GQ_NS(128, 2, 2) - 1) * GQ_ST(128, 2, 2) >= GQ_MERGE(128) &&
                   (4 * GQ_NS(128, 4, 4) - 1) * GQ_ST(128, 4, 4) >= GQ_MERGE(128) &&
                   (4 * GQ_NS(64, 2, 2) - 1) * GQ_ST(64, 2, 2) >= GQ_MERGE(64),
               "the flag past the merge");
_Static_assert(GQ_WCH % 32 == 0 && GQ_WCH <= FNT, "a tail block's tokens: whole groups, a thread each at most");
_Static_assert(KIVI_GQA_MAX_SPLIT <= 32 * 32 * FNW && KIVI_MAX_RESIDUAL + 32 <= 32 * 32 * FNW, "a warp has at most 32 groups");

/* What a block needs: the cache, the call, the launch's geometry. */
typedef struct gq_args {
  const unsigned char *pool;
  const int32_t *bt, *vexp;
  const float *q;
  float *part_o, *part_ml;
  const uint16_t *kres, *vres;
  unsigned *cnt;
  void *out;
  const int64_t *dd;
  int layer, rows, HQ, col_seq, col_beg, col_lc, fs, nf, ntail, nsf, nslots, fused, out_f16;
  float qmul;
  int H, NL, MB, gsz, nqc, Rm, lr;
  size_t sub;
  uint32_t bsz, ksz_off, vcode_off, vsz_off;
} gq_args;

#pragma omp declare target
/* Byte offset of 16-byte piece c of row r in a stage's code tile of nc pieces a row: the piece
 * index XOR-ed with bits of r, so that the 8 rows an ldmatrix reads (and the rows 2t the lanes
 * of a value product read) fall in distinct banks. */
static inline unsigned gq_swz(int r, int c, int nc) { return (unsigned)(r * nc + (c ^ (r * nc / 8 % nc))) * 16u; }
/* field p of a key code word w as an f16x2 subnormal pair (its channel and the one 16 / kb on),
 * the fields above bit 9 shifted down first */
static inline uint32_t gq_field(uint32_t w, int p, const int KB) {
  const int PD = KB == 2 ? 5 : 2, SH = KB == 2 ? 10 : 8;
  const uint32_t FM = KB == 2 ? 0x00030003u : 0x000f000fu;
  return (p < PD ? w : w >> SH) & (FM << (KB * (p < PD ? p : p - PD)));
}
/* The channel of the zeros' k-tile kt, less the lane's first (CPW t): that of q's qv[4 kt] (gq_split) */
static inline int gq_zch(int kt, const int KB) { return (32 / KB) * 4 * (4 * kt / (32 / KB)) + 4 * kt % (32 / KB); }
static inline int gq_pos(int p, const int KB) { return KB * (p < (KB == 2 ? 5 : 2) ? p : p - (KB == 2 ? 5 : 2)); }

/* The copies of a group (its first row tr in the pool block at sb) into the stage at shared
 * address st.  Lane piece c = lane + 32 i of a code tile goes to its swizzled place, which is
 * the lane's (kco, vco: gq_swz of piece lane) plus 512 i, as no swizzle depends on i. */
static inline __attribute__((always_inline)) void gq_copy(uint32_t st, const unsigned char *sb, unsigned tr,
                                                          const gq_args *a, int lane, uint32_t kco, uint32_t vco,
                                                          const int D, const int KB, const int VB) {
  const int KRB = D * KB / 8, VRB = D * VB / 8;
  const uint32_t OKS = 32 * KRB, OVC = OKS + 4 * D, OVS = OVC + 32 * VRB;
  const unsigned char *kc = sb + tr * (unsigned)KRB + 16 * lane;
  #pragma unroll
  for (int i = 0; i < 2 * KRB / 32; ++i) fk_cp16s(st + kco + 512 * i, kc + 512 * i);
  const unsigned char *ks = sb + a->ksz_off + (tr >> 5) * (unsigned)(4 * D) + 16 * lane;
  #pragma unroll
  for (int i = 0; i < (D / 4 + 31) / 32; ++i)
    if (D / 4 >= 32 || lane < D / 4) fk_cp16s(st + OKS + 16 * lane + 512 * i, ks + 512 * i);
  const unsigned char *vc = sb + a->vcode_off + tr * (unsigned)VRB + 16 * lane;
  #pragma unroll
  for (int i = 0; i < 2 * VRB / 32; ++i) fk_cp16s(st + OVC + vco + 512 * i, vc + 512 * i);
  const unsigned char *vs = sb + a->vsz_off + tr * (unsigned)(D / 8) + 16 * lane;
  #pragma unroll
  for (int i = 0; i < (D / 4 + 31) / 32; ++i)
    if (D / 4 >= 32 || lane < D / 4) fk_cp16s(st + OVS + 16 * lane + 512 * i, vs + 512 * i);
}

/* A tail block (see the top of the file): tokens [j0, j0 + nw) of the row's last n (those past its
 * splits, t0 = Lf on), nw <= GQ_WCH, in fp32.  Every byte it reads is copied into shared memory at
 * once (one memory latency): each token's key row (the fp16 window's, or its codes) and value row,
 * the K scales and zeros and the V scale/zero pairs of its groups; then a thread per (token, pair
 * of heads) takes the logits, a warp per head the softmax, a thread per channel the outputs. */
static inline __attribute__((always_inline)) void gq_tail(const gq_args *a, unsigned char *s_u, int sf, int r, int kvh,
                                                          size_t rh0, int nh, int64_t s, const int D, const int KB,
                                                          const int VB) {
  const int KRB = D * KB / 8, VRB = D * VB / 8, VG = D / 32, CPW = 32 / KB, PT = D / 8; /* PT: 16-byte pieces of a row */
  const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5, Rm = a->Rm;
  const int Lf = (int)a->dd[(int64_t)a->col_beg * a->rows + r];
  int t0, n, ngq, nvq;
  fk_block_tokens(a->nf, a->nf, a->fs, Lf, a->dd + (int64_t)a->col_lc * a->rows + r, Rm, &t0, &n, &ngq, &nvq);
  const int j0 = GQ_WCH * (sf - a->nf), nw = n - j0 < GQ_WCH ? n - j0 : GQ_WCH;
  float *const s_ml = (float *)(s_u + GT_ML(D));
  if (nw > 0) {
    const int nqk = 32 * ngq - j0, nqv = nvq - j0; /* the block's tokens [0, nqk) have quantized keys, [0, nqv) values */
    const int32_t *btrow = a->bt + ((size_t)s * a->NL + a->layer) * a->MB;
    const unsigned char *hb = a->pool + (size_t)kvh * a->sub;
    const int tf = t0 + j0, tl = tf + nw - 1; /* the block's first and last tokens: in at most two pool blocks */
    const unsigned char *pb0 = nqk > 0 || nqv > 0 ? fk_sub_at(hb, btrow, tf, a->lr, a->bsz) : hb;
    const unsigned char *pb1 = (nqk > 0 || nqv > 0) && (tl >> a->lr) != (tf >> a->lr) ? fk_sub_at(hb, btrow, tl, a->lr, a->bsz) : pb0;
    const size_t ring = (((size_t)s * a->NL + a->layer) * a->H + kvh) * (size_t)(Rm + 1) * D;
    const uint32_t su = fk_saddr(s_u);
    /* ---- the copies: rows (a thread per 16-byte piece), then the groups' scales */
    for (int it = tid; it < nw * PT; it += FNT) {
      const int j = it / PT, c = it % PT, tg = tf + j;
      const unsigned char *sb = (tg >> a->lr) == (tf >> a->lr) ? pb0 : pb1;
      if (j >= nqk) fk_cp16s(su + GT_K(D) + 2 * D * j + 16 * c, a->kres + ring + (size_t)(tg & Rm) * D + 8 * c);
      else if (c < KRB / 16) fk_cp16s(su + GT_K(D) + 2 * D * j + 16 * c, sb + (size_t)(tg & Rm) * KRB + 16 * c);
      if (j >= nqv) fk_cp16s(su + GT_V(D) + 2 * D * j + 16 * c, a->vres + ring + (size_t)(tg & Rm) * D + 8 * c);
      else if (c < VRB / 16) fk_cp16s(su + GT_V(D) + 2 * D * j + 16 * c, sb + a->vcode_off + (size_t)(tg & Rm) * VRB + 16 * c);
    }
    for (int it = tid; it < (GQ_WCH / 32) * (D / 4); it += FNT) { /* group gi's 4 D bytes of each: D / 4 pieces */
      const int gi = it / (D / 4), c = it % (D / 4), tg = tf + 32 * gi;
      const unsigned char *sb = (tg >> a->lr) == (tf >> a->lr) ? pb0 : pb1;
      if (32 * gi < nqk) fk_cp16s(su + GT_KS(D) + 4 * D * gi + 16 * c, sb + a->ksz_off + (size_t)((tg & Rm) >> 5) * 4 * D + 16 * c);
      if (32 * gi < nqv) fk_cp16s(su + GT_VS(D) + 4 * D * gi + 16 * c, sb + a->vsz_off + (size_t)(tg & Rm) * (D / 8) + 16 * c);
    }
    fk_cp_commit();
    float *const s_q = (float *)s_u; /* [8][D]: q qmul, 0 past the chunk's heads */
    const float *qg = a->q + rh0 * D;
    for (int it = tid; it < GQ_NH * D; it += FNT) s_q[it] = it < nh * D ? qg[it] * a->qmul : 0.0f;
    fk_cp_wait(0);
    fk_sync();
    /* ---- logits: item (token j, heads h2, h2 + 1) */
    float *const s_x = (float *)(s_u + GT_X(D)); /* [GQ_WCH][8] */
    const int np = (nh + 1) / 2;
    for (int it = tid; it < nw * np; it += FNT) {
      const int j = it / np, h2 = 2 * (it % np);
      const uint32_t *row = (const uint32_t *)(s_u + GT_K(D) + 2 * D * j);
      const uint32_t *sz = (const uint32_t *)(s_u + GT_KS(D) + 4 * D * (j >> 5));
      const float *q0 = s_q + h2 * D, *q1 = q0 + D;
      float acc0 = 0.0f, acc1 = 0.0f;
      if (j < nqk) {
        #pragma unroll 4
        for (int c0 = 0; c0 < D; c0 += 8) {
          const uint32_t wd = row[c0 / CPW] >> (KB * (c0 % CPW));
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            float s0, s1, z0, z1;
            h2f(sz[c0 / 2 + i], &s0, &s1);
            h2f(sz[D / 2 + c0 / 2 + i], &z0, &z1);
            const float k0 = fmaf((float)((wd >> (2 * KB * i)) & ((1u << KB) - 1u)), s0, z0);
            const float k1 = fmaf((float)((wd >> (KB * (2 * i + 1))) & ((1u << KB) - 1u)), s1, z1);
            acc0 = fmaf(q0[c0 + 2 * i + 1], k1, fmaf(q0[c0 + 2 * i], k0, acc0));
            acc1 = fmaf(q1[c0 + 2 * i + 1], k1, fmaf(q1[c0 + 2 * i], k0, acc1));
          }
        }
      } else {
        #pragma unroll 4
        for (int c0 = 0; c0 < D; c0 += 8) {
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            float k0, k1;
            h2f(row[c0 / 2 + i], &k0, &k1);
            acc0 = fmaf(q0[c0 + 2 * i + 1], k1, fmaf(q0[c0 + 2 * i], k0, acc0));
            acc1 = fmaf(q1[c0 + 2 * i + 1], k1, fmaf(q1[c0 + 2 * i], k0, acc1));
          }
        }
      }
      s_x[GQ_NH * j + h2] = acc0;
      s_x[GQ_NH * j + h2 + 1] = acc1;
    }
    fk_sync();
    /* ---- softmax of each head over the block's tokens */
    for (int h = wid; h < nh; h += FNW) { /* warp-uniform */
      float mx = -INFINITY;
      for (int j = lane; j < nw; j += 32) mx = fmaxf(mx, s_x[GQ_NH * j + h]);
      mx = wmax(mx);
      float ls = 0.0f;
      for (int j = lane; j < nw; j += 32) {
        const float p = fk_ex2(s_x[GQ_NH * j + h] - mx);
        s_x[GQ_NH * j + h] = p;
        ls += p;
      }
      ls = wsum(ls);
      if (lane == 0) {
        s_ml[2 * h] = mx;
        s_ml[2 * h + 1] = ls;
      }
    }
    fk_sync();
    /* ---- outputs: a thread per channel, the quantized values first */
    for (int c = tid; c < D; c += FNT) {
      float o[GQ_NH];
      #pragma unroll
      for (int h = 0; h < GQ_NH; ++h) o[h] = 0.0f;
      const int nq = nqv < 0 ? 0 : nqv < nw ? nqv : nw;
      for (int j = 0; j < nq; ++j) {
        const uint32_t wd = ((const uint32_t *)(s_u + GT_V(D) + 2 * D * j))[c / (32 / VB)];
        float vs_, vz_;
        h2f(((const uint32_t *)(s_u + GT_VS(D) + 4 * D * (j >> 5)))[(j & 31) * VG + c / 32], &vs_, &vz_);
        const float v = fmaf((float)((wd >> (VB * (c % (32 / VB)))) & ((1u << VB) - 1u)), vs_, vz_);
        const float *p = s_x + GQ_NH * j;
        #pragma unroll
        for (int h = 0; h < GQ_NH; ++h) o[h] = fmaf(p[h], v, o[h]);
      }
      #pragma unroll 8
      for (int j = nq; j < nw; ++j) {
        const float v = kivi_f16_to_f32(((const uint16_t *)(s_u + GT_V(D) + 2 * D * j))[c]);
        const float *p = s_x + GQ_NH * j;
        #pragma unroll
        for (int h = 0; h < GQ_NH; ++h) o[h] = fmaf(p[h], v, o[h]);
      }
      #pragma unroll
      for (int h = 0; h < GQ_NH; ++h)
        if (h < nh) a->part_o[((rh0 + h) * a->nslots + sf) * D + c] = o[h];
    }
  } else if (tid < nh) {
    s_ml[2 * tid] = -INFINITY;
    s_ml[2 * tid + 1] = 0.0f;
  }
  fk_sync();
  if (tid < nh) {
    float *pml = a->part_ml + ((rh0 + tid) * a->nslots + sf) * 2;
    pml[0] = s_ml[2 * tid];
    pml[1] = s_ml[2 * tid + 1];
  }
}

/* A split block (see the top of the file): its groups through the warps' rings, the warps merged
 * into the block's partial. */
static inline __attribute__((always_inline)) void gq_split(const gq_args *a, unsigned char *s_u, int sf, int r, int kvh,
                                                           size_t rh0, int nh, int64_t s, const int D, const int KB,
                                                           const int VB, const int NS) {
  const int KRB = D * KB / 8, VRB = D * VB / 8, NCK = KRB / 16, NCV = VRB / 16;
  const int VG = D / 32, KT = D / 16, NPW = 16 / KB, KPW = NPW / 2, CPW = 32 / KB;
  const int ST = GQ_ST(D, KB, VB), OKS = 32 * KRB, OVC = OKS + 4 * D, OVS = OVC + 32 * VRB;
  const int UNI = GQ_UNION(D, KB, VB);
  fk_v4u *const s_qb = (fk_v4u *)(s_u + UNI);           /* [KT][32]: the zeros' A */
  fk_v4u *const s_qa = (fk_v4u *)(s_u + UNI + GQ_TAB(D)); /* [KT][32]: the keys' A */
  float *const s_O = (float *)s_u;                          /* [8][D] */
  float *const s_ML = (float *)(s_u + GQ_OFF_ML(D));       /* [8][4]: m, l */
  float *const s_wm = (float *)(s_u + GQ_OFF_WML(D));      /* [4][8][2]: each warp's m and l */
  float *const s_x = (float *)(s_u + GQ_OFF_X(D));         /* [4][8][D] */
  const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
  const fk_v4u ve = fk_v_bounds(a->vexp, s, a->layer, a->NL, a->H, kvh); /* no other load before it */
  const int Lf = (int)a->dd[(int64_t)a->col_beg * a->rows + r], Rm = a->Rm;
  int t0, n, ngm, nvq;
  fk_block_tokens(sf, a->nf, a->fs, Lf, a->dd + (int64_t)a->col_lc * a->rows + r, Rm, &t0, &n, &ngm, &nvq);
  if (n <= 0) {
    if (tid < nh) {
      float *pml = a->part_ml + ((rh0 + tid) * a->nslots + sf) * 2;
      pml[0] = -INFINITY;
      pml[1] = 0.0f;
    }
  } else {
    const int32_t *btrow = a->bt + ((size_t)s * a->NL + a->layer) * a->MB;
    const float *qg = a->q + rh0 * D;
    const unsigned char *hb = a->pool + (size_t)kvh * a->sub;
    /* ---- each warp's groups wid, wid + 4, ... through its ring: the first NS - 1 copies go out first,
     * so that they arrive while the block prepares its operands */
    const int nmine = ngm > wid ? (ngm - wid + FNW - 1) / FNW : 0;
    unsigned char *const ring = s_u + wid * NS * ST;
    const uint32_t sring = fk_saddr(ring), kco = gq_swz(lane / NCK, lane % NCK, NCK), vco = gq_swz(lane / NCV, lane % NCV, NCV);
    float m = -INFINITY, l = 0.0f, dv[8][4], dz[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    #pragma unroll
    for (int e = 0; e < KT * 4; ++e) dv[e >> 2][e & 3] = 0.0f;
    /* lane i holds the pool block of the warp's group i (nmine <= 32: splits of at most 4096
     * tokens), handed to the copies by a shuffle: no copy waits for a load */
    const int myblk = lane < nmine ? (int)kivi_block_index(btrow[(t0 + 32 * (wid + FNW * lane)) >> a->lr]) : 0;
    #pragma unroll
    for (int j = 0; j < NS - 1; ++j) {
      const int bj = shfi_i(myblk, j);
      if (j < nmine) {
        const int tg = t0 + 32 * (wid + FNW * j);
        gq_copy(sring + j * ST, hb + (uint64_t)(uint32_t)bj * a->bsz, (unsigned)(tg & Rm), a, lane, kco, vco, D, KB, VB);
      }
      fk_cp_commit();
    }
    /* ---- lane (g, t): head g's q at the channels of its key words 4 c + t (also the zeros' A: qv[4 kt ..]) */
    const int hv = g < nh;
    float qv[32], mq = 0.0f; /* D / 4 used */
    #pragma unroll
    for (int c = 0; c < D / 4; ++c) {
      qv[c] = hv ? qg[g * D + CPW * (4 * (c / CPW) + t) + c % CPW] * a->qmul : 0.0f;
      mq = fmaxf(mq, fabsf(qv[c]));
    }
    mq = fmaxf(mq, shfx(mq, 1));
    mq = fmaxf(mq, shfx(mq, 2)); /* head g's largest |q| */
    /* 2^ve.z bounds every K scale of the sequence (kept by append and import, so no pass over
     * the block's scales): A's 22 bits are relative to it */
    const float mx = mq * fk_p2((int32_t)ve.z);
    int SK = mx > 0.0f ? fk_ceil_exp(mx) + 10 : 0; /* |A| < 2^14 */
    SK = SK < -96 ? -96 : SK > 120 ? 120 : SK;
    int SKb = mq > 0.0f ? fk_ceil_exp(mq) - 14 : 0; /* the zeros' A: |q 2^-SKb| < 2^14 */
    SKb = SKb < -110 ? -110 : SKb > 110 ? 110 : SKb;
    /* the keys' A: k-tile kt, slot i: the pair of fields p = 2 (kt % KPW) + i of word kt / KPW */
    #pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
      uint32_t qh[2], ql[2];
      #pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = kt / KPW, p = 2 * (kt % KPW) + i, lo = CPW * c + p;
        const float f = fk_p2(24 - gq_pos(p, KB) - SK);
        fk_hilo(qv[lo] * f, qv[lo + NPW] * f, &qh[i], &ql[i]);
      }
      s_qa[kt * 32 + lane] = (fk_v4u){qh[0], ql[0], qh[1], ql[1]};
    }
    /* the zeros' A: k-tile kt takes the lane's own q, qv[4 kt .. 4 kt + 3]: channels CPW t + gq_zch(kt) .. + 3,
     * whose zeros the lane reads in the loop (no second load of q: round 48) */
    if (wid == 0) {
      const float fb = fk_p2(-SKb);
      #pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        float z4[4];
        #pragma unroll
        for (int e = 0; e < 4; ++e) z4[e] = qv[4 * kt + e] * fb;
        uint32_t h0, l0, h1, l1;
        fk_hilo(z4[0], z4[1], &h0, &l0);
        fk_hilo(z4[2], z4[3], &h1, &l1);
        s_qb[kt * 32 + lane] = (fk_v4u){h0, l0, h1, l1};
      }
    }
    const float scK = fk_p2(SK), scB = fk_p2(SKb);
    /* values: p is taken as p 2^PA (<= 2^15), so that p * scale < 2^15 (2^ve.x > every V scale) */
    const int PA = nvq > 0 && (int32_t)ve.x > 0 ? 15 - (int32_t)ve.x : 15;
    fk_sync();
    int stj = 0; /* the stage of round j: j % NS */
    for (int j = 0; j < nmine; ++j, stj = stj == NS - 1 ? 0 : stj + 1) {
      if (NS == 2) fk_cp_wait(0);
      else if (NS == 3) fk_cp_wait(1);
      else fk_cp_wait(2);
      fk_wsync(); /* every lane's copies of this stage are done; the stage copied next was read last round */
      {
        const int jj = j + NS - 1, bj = shfi_i(myblk, jj & 31);
        if (jj < nmine) {
          const int tg = t0 + 32 * (wid + FNW * jj);
          gq_copy(sring + (stj == 0 ? NS - 1 : stj - 1) * ST, hb + (uint64_t)(uint32_t)bj * a->bsz, (unsigned)(tg & Rm), a,
                  lane, kco, vco, D, KB, VB);
        }
        fk_cp_commit();
      }
      const uint32_t so = (uint32_t)(wid * NS * ST + stj * ST); /* the stage, bytes from s_u */
      /* the lane's address parts: the compiler keeps what it can in registers (127 at most: 4
       * blocks per SM; an opaque lane recomputed them each round, 45 instructions more: round 51) */
      const int lt = lane & 3, lg = lane >> 2;
      const uint32_t o_sw = OKS + 4 * NPW * lt, o_zw = OKS + 2 * D + 2 * CPW * lt, o_vs = OVS + 8 * VG * lt;
      const uint32_t o_vz = OVS + 4 * (2 * VG * lt + (lg < VG ? lg : 0));
      const int vsw = 2 * lt * NCV / 8 % NCV, vwq = VB == 2 ? lg >> 2 : lg >> 1;
      uint32_t o_vc[4];
      #pragma unroll
      for (int pc = 0; pc < NCV; ++pc) o_vc[pc] = OVC + 32 * NCV * lt + 16 * (pc ^ vsw) + 4 * vwq;
      uint32_t o_vt[2];
      #pragma unroll
      for (int q2 = 0; q2 < 2; ++q2)
        o_vt[q2] = OVC + gq_swz(8 * ((lane >> 3) & 1) + (lane & 7), (2 * q2 + (lane >> 4)) % NCV, NCV);
      const uint32_t vsel = VB == 2 ? (uint32_t)(lg & 3) * 0x1111u + 0x4400u : (uint32_t)(2 * (lg & 1)) * 0x1111u + 0x5410u;
      /* ---- keys: piece c of every token row (ldmatrix: matrix nt is tokens 8 nt .. 8 nt + 7), then
       * its KPW k-tiles; the scales' words of the pairs and the zeros' words read as they are used */
      const unsigned char *const psw = s_u + (so + o_sw), *const pzw = s_u + (so + o_zw);
      const unsigned char *const pqa = s_u + (UNI + GQ_TAB(D) + 16 * lane);
      const unsigned char *const pqb = s_u + (UNI + 16 * lane);
      float d[4][4], db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      #pragma unroll
      for (int e = 0; e < 16; ++e) d[e >> 2][e & 3] = 0.0f;
      #pragma unroll
      for (int c = 0; c < NCK; ++c) {
        uint32_t cw[4]; /* word 4 c + t of token 8 nt + g */
        fk_ldsm4s(cw, sring + stj * ST + gq_swz(lane, c, NCK));
        #pragma unroll
        for (int kk = 0; kk < KPW; ++kk) {
          const int kt = c * KPW + kk, p0 = 2 * kk;
          uint32_t ah[2], al[2];
          const fk_v4u x = *(const fk_v4u *)(pqa + 512 * kt);
          const uint32_t qh[2] = {x.x, x.z}, ql[2] = {x.y, x.w};
          /* the scales of fields p0, p0 + 1 (channels CPW w + p and + NPW) are words NPW w + kk and + NPW / 2 */
          const uint32_t sx = *(const uint32_t *)(psw + 16 * NPW * c + 4 * kk);
          const uint32_t sy = *(const uint32_t *)(psw + 16 * NPW * c + 2 * NPW + 4 * kk);
          #pragma unroll
          for (int i = 0; i < 2; ++i) {
            const uint32_t sp = prmt(sx, sy, i ? 0x7632u : 0x5410u);
            ah[i] = hmul2(qh[i], sp);
            al[i] = hfma2(ql[i], sp, hfms2(qh[i], sp, ah[i]));
          }
          #pragma unroll
          for (int nt = 0; nt < 4; ++nt)
            mma16816(d[nt], ah[0], al[0], ah[1], al[1], gq_field(cw[nt], p0, KB), gq_field(cw[nt], p0 + 1, KB));
        }
      }
      #pragma unroll
      for (int kt = 0; kt < KT; ++kt) { /* the zeros' term */
        const fk_v4u qb = *(const fk_v4u *)(pqb + 512 * kt);
        const fk_v2u z2 = *(const fk_v2u *)(pzw + 2 * gq_zch(kt, KB));
        mma16816(db, qb.x, qb.y, qb.z, qb.w, z2.x, z2.y);
      }
      const float bs = (db[0] + db[2]) * scB;
      float x[8];
      #pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        x[2 * nt] = fmaf(d[nt][0] + d[nt][2], scK, bs);
        x[2 * nt + 1] = fmaf(d[nt][1] + d[nt][3], scK, bs);
      }
      /* ---- online softmax of head g */
      float gm = x[0];
      #pragma unroll
      for (int e = 1; e < 8; ++e) gm = fmaxf(gm, x[e]);
      gm = fmaxf(gm, shfx(gm, 1));
      gm = fmaxf(gm, shfx(gm, 2));
      const float mn = fmaxf(m, gm);
      if (fk_ballot(mn > m)) { /* warp-uniform */
        const float af = mn > m ? fk_ex2(m - mn) : 1.0f;
        l *= af;
        const float a0 = shfi(af, 8 * t), a1 = shfi(af, 8 * t + 4); /* heads 2t, 2t + 1 */
        #pragma unroll
        for (int mt = 0; mt < KT; ++mt) {
          dv[mt][0] *= a0, dv[mt][1] *= a1, dv[mt][2] *= a0, dv[mt][3] *= a1;
        }
        dz[0] *= a0, dz[1] *= a1, dz[2] *= a0, dz[3] *= a1;
        m = mn;
      }
      const float mo = m == -INFINITY ? 0.0f : m - (float)PA;
      uint32_t P[4];
      #pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = fk_ex2(x[2 * nt] - mo), p1 = fk_ex2(x[2 * nt + 1] - mo);
        l += p0 + p1;
        P[nt] = f2h2(p0, p1);
      }
      /* ---- values: k-tile tk takes tokens 16 tk + 2t, + 1 (B's b0) and + 8, + 9 (b1) */
      const unsigned char *const pvs = s_u + (so + o_vs), *const pvz = s_u + (so + o_vz);
      const unsigned char *pvc[4];
      #pragma unroll
      for (int pc = 0; pc < (VB == 2 ? NCV : 0); ++pc) pvc[pc] = s_u + (so + o_vc[pc]);
      #pragma unroll
      for (int tk = 0; tk < 2; ++tk) {
        uint32_t R[4][4];
        #pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int dt = 16 * tk + (i & 1) + 8 * (i >> 1); /* token ta + dt - 2t */
          if (VG == 4) {
            const fk_v4u y = *(const fk_v4u *)(pvs + 16 * dt);
            R[i][0] = y.x, R[i][1] = y.y, R[i][2] = y.z, R[i][3] = y.w;
          } else {
            const fk_v2u y = *(const fk_v2u *)(pvs + 8 * dt);
            R[i][0] = y.x, R[i][1] = y.y, R[i][2] = R[i][3] = 0u;
          }
        }
        const uint32_t z01 = g >= VG ? 0u : prmt(*(const uint32_t *)(pvz + 4 * VG * (16 * tk)), *(const uint32_t *)(pvz + 4 * VG * (16 * tk + 1)), 0x7632u);
        const uint32_t z89 = g >= VG ? 0u : prmt(*(const uint32_t *)(pvz + 4 * VG * (16 * tk + 8)), *(const uint32_t *)(pvz + 4 * VG * (16 * tk + 9)),
                            0x7632u);
        mma16816(dz, z01, 0u, z89, 0u, P[2 * tk], P[2 * tk + 1]);
        uint32_t xt[4][2]; /* 4-bit: group G's A pairs of tokens ta, ta + 1 and ta + 8, ta + 9 */
        if (VB == 4) {
          #pragma unroll
          for (int q2 = 0; q2 < VG / 2; ++q2) {
            uint32_t r4[4];
            fk_ldsm4t(r4, s_u + (so + o_vt[q2] + 16 * NCV * 16 * tk));
            xt[2 * q2][0] = r4[0], xt[2 * q2][1] = r4[1], xt[2 * q2 + 1][0] = r4[2], xt[2 * q2 + 1][1] = r4[3];
          }
        }
        #pragma unroll
        for (int G = 0; G < VG; ++G) {
          const uint32_t b0 = hmul2(P[2 * tk], prmt(R[0][G], R[1][G], 0x5410u));
          const uint32_t b1 = hmul2(P[2 * tk + 1], prmt(R[2][G], R[3][G], 0x5410u));
          /* 2-bit: byte g % 4 of word 2 G + g / 4 of the rows (piece G / 2, its word 2 (G % 2) + g / 4), paired */
          uint32_t xa, xb;
          if (VB == 2) {
            const unsigned char *pw = pvc[G / 2] + 8 * (G % 2) + 16 * NCV * (16 * tk);
            xa = prmt(*(const uint32_t *)pw, *(const uint32_t *)(pw + 16 * NCV), vsel);
            xb = prmt(*(const uint32_t *)(pw + 16 * NCV * 8), *(const uint32_t *)(pw + 16 * NCV * 9), vsel);
          } else {
            xa = xt[G][0], xb = xt[G][1];
          }
          #pragma unroll
          for (int jj = 0; jj < 2; ++jj) {
            uint32_t a0, a1, a2, a3;
            if (VB == 2) {
              const uint32_t m0 = 0x00030003u << 4 * jj, m1 = 0x000c000cu << 4 * jj;
              a0 = xa & m0, a1 = xa & m1, a2 = xb & m0, a3 = xb & m1;
            } else {
              const uint32_t ya = jj ? xa >> 8 : xa, yb = jj ? xb >> 8 : xb;
              a0 = ya & 0x000f000fu, a1 = ya & 0x00f000f0u, a2 = yb & 0x000f000fu, a3 = yb & 0x00f000f0u;
            }
            mma16816(dv[2 * G + jj], a0, a1, a2, a3, b0, b1);
          }
        }
      }
    }
    fk_cp_wait(0);
    l += shfx(l, 1);
    l += shfx(l, 2); /* head g's sum over the warp's tokens */
    const float upa = fk_p2(-PA);
    float zs[4][2]; /* the zeros' sums of value group G for heads 2t, 2t + 1: lane (G, t)'s */
    #pragma unroll
    for (int G = 0; G < VG; ++G) {
      zs[G][0] = shfi(dz[0], 4 * G + t) * upa;
      zs[G][1] = shfi(dz[1], 4 * G + t) * upa;
    }
    fk_sync(); /* every warp is done with its ring */
    if (t == 0) {
      s_wm[(wid * GQ_NH + g) * 2] = m;
      s_wm[(wid * GQ_NH + g) * 2 + 1] = l * upa;
    }
    /* the warp's outputs [8][D]: lane (g, t) holds heads 2t, 2t + 1 of channels 32 G + 4 g + 2 jj (+ 1: rows g + 8) */
    #pragma unroll
    for (int G = 0; G < VG; ++G)
      #pragma unroll
      for (int jj = 0; jj < 2; ++jj)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hi = e >> 1, pos = VB == 2 ? 4 * jj + 2 * hi : 4 * hi;
          s_x[(wid * GQ_NH + 2 * t + (e & 1)) * D + 32 * G + 4 * g + 2 * jj + hi] =
              fmaf(dv[2 * G + jj][e], fk_p2(24 - pos - PA), zs[G][e & 1]);
        }
    fk_sync();
    /* ---- the block's partial: the warps' merged */
    for (int it = tid; it < nh * D; it += FNT) {
      const int h = it / D;
      float M = -INFINITY;
      #pragma unroll
      for (int w = 0; w < FNW; ++w) M = fmaxf(M, s_wm[(w * GQ_NH + h) * 2]);
      float o = 0.0f, L = 0.0f;
      #pragma unroll
      for (int w = 0; w < FNW; ++w) {
        const float mw = s_wm[(w * GQ_NH + h) * 2], f = mw == -INFINITY ? 0.0f : fk_ex2(mw - M);
        o = fmaf(f, s_x[(w * GQ_NH + h) * D + it % D], o);
        L = fmaf(f, s_wm[(w * GQ_NH + h) * 2 + 1], L);
      }
      s_O[it] = o;
      if (it % D == 0) {
        s_ML[4 * h] = M;
        s_ML[4 * h + 1] = L;
      }
    }
    fk_sync();
    for (int it = tid; it < nh * D; it += FNT)
      a->part_o[((rh0 + it / D) * a->nslots + sf) * D + it % D] = s_O[it];
    if (tid < nh) {
      float *pml = a->part_ml + ((rh0 + tid) * a->nslots + sf) * 2;
      pml[0] = s_ML[4 * tid];
      pml[1] = s_ML[4 * tid + 1];
    }
  }
}

/* The combine of the nslots partials of the chunk's nh heads (rows rh0 .. rh0 + nh - 1) by the block
 * that arrived last, nslots <= GQ_CMAX, as many heads at once as their weights fit in GQ_CMAX floats
 * of shared memory: a warp per head takes its slots' weights 2^(m - M) (0 where l = 0), then a
 * thread per (head, 4 channels) reads its slots' partials, none behind a branch, so that they are
 * in flight together (fk_combine takes one head after the other, each a chain of loads). */
#define GQ_CMAX 2048
_Static_assert(4 * (GQ_CMAX + GQ_NH) <= GQ_BYTES(64, 4, 4) && 4 * (GQ_CMAX + GQ_NH) <= GQ_BYTES(64, 2, 2), "the combine's weights");
static inline void gq_combine(const gq_args *a, size_t rh0, int nh, unsigned char *s_u, int tid, const int D) {
  const int ns = a->nslots, lane = tid & 31, wid = tid >> 5, hr = GQ_CMAX / ns < GQ_NH ? GQ_CMAX / ns : GQ_NH;
  float *const s_w = (float *)s_u, *const s_den = s_w + GQ_CMAX; /* [hr][ns], [hr] */
  for (int h0 = 0; h0 < nh; h0 += hr) {
    const int nr = nh - h0 < hr ? nh - h0 : hr; /* this round's heads */
    if (h0 > 0) fk_sync(); /* the round before has read s_w */
    for (int h = wid; h < nr; h += FNW) { /* warp-uniform */
      const float *ml = a->part_ml + (rh0 + h0 + h) * ns * 2;
      float M = -INFINITY;
      for (int s = lane; s < ns; s += 32) M = fmaxf(M, ml[2 * s]);
      M = wmax(M);
      float den = 0.0f;
      for (int s = lane; s < ns; s += 32) {
        const float l = ml[2 * s + 1], w = l > 0.0f ? fk_ex2(ml[2 * s] - M) : 0.0f;
        s_w[h * ns + s] = w;
        den = fmaf(w, l, den);
      }
      den = wsum(den);
      if (lane == 0) s_den[h] = den;
    }
    fk_sync();
    for (int it = tid; it < nr * (D / 4); it += FNT) {
      const int h = it / (D / 4), c = 4 * (it % (D / 4));
      const float *po = a->part_o + (rh0 + h0 + h) * ns * D + c, *w = s_w + h * ns;
      fk_v4f num = {0.0f, 0.0f, 0.0f, 0.0f};
      #pragma unroll 8
      for (int s = 0; s < ns; ++s) {
        const fk_v4f o = *(const fk_v4f *)(po + (size_t)s * D);
        const float ws = w[s];
        num.x += ws > 0.0f ? ws * o.x : 0.0f;
        num.y += ws > 0.0f ? ws * o.y : 0.0f;
        num.z += ws > 0.0f ? ws * o.z : 0.0f;
        num.w += ws > 0.0f ? ws * o.w : 0.0f;
      }
      const float rd = 1.0f / s_den[h];
      const int64_t i = (int64_t)(rh0 + h0 + h) * D + c;
      kivi_store_out(a->out, a->out_f16, i, num.x * rd);
      kivi_store_out(a->out, a->out_f16, i + 1, num.y * rd);
      kivi_store_out(a->out, a->out_f16, i + 2, num.z * rd);
      kivi_store_out(a->out, a->out_f16, i + 3, num.w * rd);
    }
  }
}

/* One block (see the top of the file).  D, KB, VB, NS: constants of the launch. */
static inline __attribute__((always_inline)) void gq_block(const gq_args *a, unsigned char *s_u, const int D,
                                                           const int KB, const int VB, const int NS) {
  const int tid = ompx_thread_id_x();
  int sf, pr;
  { /* the split blocks of every (row, kv-head, chunk) first, then the tail blocks */
    const int blk = ompx_block_id_x(), nbig = a->rows * a->H * a->nqc * a->nf;
    sf = blk < nbig ? blk % a->nf : a->nf + (blk - nbig) % a->ntail;
    pr = blk < nbig ? blk / a->nf : (blk - nbig) / a->ntail;
  }
  const int ch = pr % a->nqc, kvh = pr / a->nqc % a->H, r = pr / a->nqc / a->H, hq0 = kvh * a->gsz + GQ_NH * ch;
  const int nh = a->gsz - GQ_NH * ch < GQ_NH ? a->gsz - GQ_NH * ch : GQ_NH;
  const size_t rh0 = (size_t)r * a->HQ + hq0; /* the chunk's first (row, head) */
  const int64_t s = a->dd[(int64_t)a->col_seq * a->rows + r];
  if (sf >= a->nf)
    gq_tail(a, s_u, sf, r, kvh, rh0, nh, s, D, KB, VB);
  else
    gq_split(a, s_u, sf, r, kvh, rh0, nh, s, D, KB, VB, NS);
  if (a->fused) { /* ---- arrival: the last block of the (row, kv-head, chunk) combines its heads' partials */
    if (fk_block_arrive(a->cnt + rh0, (unsigned)(a->nsf - 1), tid, (int *)(s_u + (FNW * NS - 1) * GQ_ST(D, KB, VB)) + 4)) {
      if (a->nslots <= GQ_CMAX)
        gq_combine(a, rh0, nh, s_u, tid, D);
      else
        for (int j = 0; j < nh; ++j)
          fk_combine(rh0 + j, tid, D, a->nslots, a->part_o, a->part_ml, a->out, a->out_f16, (float *)s_u, (float *)s_u + FNT);
      if (tid == 0) a->cnt[rh0] = 0;
    }
  }
}
#pragma omp end declare target

/* The region of one (D, KB, VB), with the clauses of its run mode after the others. */
#define GQ_REGION(DD, KBB, VBB, ...)                                                                                  \
  KIVI_BARE(nblk, FNT, device(dev) is_device_ptr(pool, bt, vexp, q, part_o, part_ml, kres, vres, cnt, out)            \
                map(to : dd[0:ndd]) firstprivate(layer, rows, HQ, col_seq, col_beg, col_lc, fs, nf, ntail, nsf, nslots, fused, \
                                                 out_f16, qmul, H, NL, MB, gsz, nqc, Rm, lr, sub, bsz, ksz_off,         \
                                                 vcode_off, vsz_off) __VA_ARGS__) {                                     \
    static fk_v4u s_u[GQ_BYTES(DD, KBB, VBB) / 16];                                                                   \
    KIVI_PRAGMA(omp allocate(s_u) allocator(omp_pteam_mem_alloc))                                                    \
    const gq_args a_ = {pool,  bt,   vexp, q,  part_o, part_ml, kres, vres,     cnt,     out, dd,  layer,  rows,       \
                        HQ,    col_seq, col_beg, col_lc, fs, nf, ntail, nsf, nslots, fused, out_f16, qmul, H, NL, MB, \
                        gsz,   nqc,  Rm,   lr, sub,    bsz,     ksz_off, vcode_off, vsz_off};                          \
    gq_block(&a_, (unsigned char *)s_u, DD, KBB, VBB, GQ_NS(DD, KBB, VBB));                                      \
  }                                                                                                                    \
  KIVI_REGION_END

#define GQ_LAUNCH_KV(DD)                                                                                              \
  do {                                                                                                                \
    if (kb == 2 && vb == 2) KIVI_LAUNCH_TWICE(GQ_REGION, DD, 2, 2, );                                                 \
    else if (kb == 2) KIVI_LAUNCH_TWICE(GQ_REGION, DD, 2, 4, );                                                       \
    else if (vb == 2) KIVI_LAUNCH_TWICE(GQ_REGION, DD, 4, 2, );                                                       \
    else KIVI_LAUNCH_TWICE(GQ_REGION, DD, 4, 4, );                                                                    \
  } while (0)

void kivi_gpu_gqa_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_beg, int col_lc, int fs, int nf, int ntail, int nslots, const float *q, float qmul,
                         float *part_o, float *part_ml, unsigned *cnt, void *out, int out_f16, int async, int lane) {
  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt, *vexp = c->vexp;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int gsz = HQ / H, nqc = kivi_head_chunks(gsz, GQ_NH), Rm = R - 1, fused = out != NULL;
  const int nsf = nf + (fused ? ntail : 0);
  const int lr = kivi_log2up(R), kb = c->cfg.k_bits, vb = c->cfg.v_bits, dev = c->ctx->device;
  const uint32_t bsz = (uint32_t)c->lay.block_bytes; /* kivi_gpu_fast_eligible */
  const size_t sub = c->lay.sub_bytes;
  const uint32_t ksz_off = (uint32_t)c->lay.ksz_off, vcode_off = (uint32_t)c->lay.vcode_off,
                 vsz_off = (uint32_t)c->lay.vsz_off;
  const int nblk = rows * H * nqc * nsf;
  if (nblk <= 0) return;
  if (c->cfg.head_dim == 64)
    GQ_LAUNCH_KV(64);
  else
    GQ_LAUNCH_KV(128);
}

#else /* no offload: never called (plan.c: never eligible) */
void kivi_gpu_gqa_decode(kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int64_t ndd, int col_seq,
                         int col_beg, int col_lc, int fs, int nf, int ntail, int nslots, const float *q, float qmul,
                         float *part_o, float *part_ml, unsigned *cnt, void *out, int out_f16, int async, int lane) {
  (void)c; (void)layer; (void)rows; (void)HQ; (void)dd; (void)ndd; (void)col_seq; (void)col_beg; (void)col_lc; (void)fs;
  (void)nf; (void)ntail; (void)nslots; (void)q; (void)qmul; (void)part_o; (void)part_ml; (void)cnt; (void)out; (void)out_f16;
  (void)async; (void)lane;
}
#endif
