/* The new tokens of an extend call on a GPU (kivi_gpu_extend_new): each new token's causal
 * attention over the call's new tokens of its sequence, from the fp32 inputs q, k_new, v_new, on
 * the tensor cores with f16 operands and fp32 accumulators (fp16-attention accuracy class),
 * head_dim 64 or 128.  Two kernels, in order:
 *
 *  1. Staging (xn_stage), a block per (32-token tile of a sequence's new tokens, kv-head): the
 *     tile's largest |k| gives a power-of-two factor 2^shk that brings it into [2^14, 2^15), its
 *     largest |v| a factor 2^shv (1 where that largest |v| is already within [2^-10, 2^15), as it
 *     almost always is), and the scaled tokens are written as f16, keys and values alike
 *     [H][P][D] (token-major); tokens past the sequence's end are zero.  ex[H][P / 32] =
 *     {shk, shv}.  A sequence's tiles start at its padded offset pofs (a multiple of 32).
 *  2. Attention (xn_attend), a block of XN_NW = 4 warps per (tile of up to KIVI_NEW_TILE = 64 query
 *     rows of one sequence, query head; 2 blocks an SM at head_dim 128, which an H100 ran 14 % faster
 *     than blocks of 8 warps and 128 rows, one an SM, though they read the keys twice as often):
 *     warp w takes rows 16 w .. 16 w + 15 (q * qmul scaled per row by a power of two into
 *     [2^14, 2^15), as f16 A fragments in registers).  The 32-token tiles of
 *     keys and values go through a ring of XN_NS(D) shared-memory stages (cp.async, every thread
 *     of the block copying, XN_NS - 1 tiles ahead; one block barrier a tile), each row of 16-byte
 *     pieces swizzled (piece c of token r at c ^ (r % 8)) so that ldmatrix reads no bank twice.
 *     Per tile and warp:
 *       S = Q K^T (B fragments: ldmatrix of the key rows), the logits S 2^-sq 2^-shk;
 *       the causal mask (the tiles that reach past the warp's first row only);
 *       an online softmax per row (base 2: qmul holds log2(e)) whose reference maximum m moves
 *       only when a logit passes it by more than 8, so that o and l are rarely rescaled and
 *       p = 2^(x - m) < 2^8 fits an f16;
 *       O += 2^-shv P V, P the f16 A fragments of S's accumulators, V's B fragments
 *       ldmatrix.trans of the value rows, accumulated in o by the tensor cores (where shv != 0,
 *       rare, each tile's product from zero, scaled and added in fp32).
 *     The result is a partial (unnormalized o, m, l) in slot `slot` of part_o / part_ml, or,
 *     where the call has no other slots (direct), the output and lse themselves.
 *
 * tab (int32, map(to:)): nseq sequences {first row, new tokens, pofs}, ntiles query tiles
 * {first row, rows, sequence}, P / 32 staging tiles {first row, tokens}.  docs/PERFORMANCE.md has the
 * measurements. */
#include "config.h"

#include "internal.h"
#include "kernels_attn.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include "gpu_ops.h"

#define XN_NW (KIVI_NEW_TILE / 16) /* warps of an attention block (4): 16 query rows each */
#define XN_NT (32 * XN_NW)   /* its threads */
#define XN_BK 32             /* tokens of a key / value tile */
#define XN_ST(D) (4 * XN_BK * (D)) /* bytes of a stage: the tile's keys, then its values, f16 */
#define XN_NS(D) (45056 / XN_ST(D) > 3 ? 3 : 45056 / XN_ST(D)) /* stages: 2 at head_dim 128 (3 took 255 registers, no faster) */
_Static_assert(KIVI_NEW_TILE == 16 * XN_NW, "a query tile is 16 rows a warp");
_Static_assert(XN_NS(128) >= 2 && XN_NS(64) >= 2, "a tile ahead");
_Static_assert((XN_BK * 128 / 8) % XN_NT == 0 && (XN_BK * 64 / 8) % XN_NT == 0, "a tile's pieces: the same count a thread");

typedef struct xn_args {
  const int32_t *tab;
  const float *q, *kn, *vn;
  uint16_t *kx, *vx;
  int32_t *ex;
  float *part_o, *part_ml, *out, *lse;
  int64_t P, nslots, slot;
  int H, HQ, nseq, ntiles, direct;
  float qmul;
} xn_args;

#pragma omp declare target
/* The staging block (see the top of the file); s_m: 2 x FNW floats of shared memory. */
static inline __attribute__((always_inline)) void xn_stage(const xn_args *a, float *s_m, const int D) {
  const int NP = 16 * D / FNT; /* pairs of keys and of values a thread takes (at most 16) */
  const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5, H = a->H;
  const int blk = ompx_block_id_x(), T = blk / H, kvh = blk % H;
  const int32_t *sd = a->tab + 3 * (a->nseq + a->ntiles) + 2 * T;
  const int r0 = sd[0], cnt = sd[1];
  float xk[16][2], xv[16][2], mk = 0.0f, mv = 0.0f;
  #pragma unroll
  for (int j = 0; j < NP; ++j) { /* pair i: token i / (D / 2), channels 2 (i % (D / 2)) + {0, 1} */
    const int i = tid + FNT * j, k = i / (D / 2), c = 2 * (i % (D / 2));
    fk_v2u x = {0u, 0u}, y = {0u, 0u};
    if (k < cnt) {
      const size_t o = ((size_t)(r0 + k) * H + kvh) * D + c;
      x = ld8((const uint32_t *)(a->kn + o));
      y = ld8((const uint32_t *)(a->vn + o));
    }
    xk[j][0] = fk_f(x.x), xk[j][1] = fk_f(x.y), xv[j][0] = fk_f(y.x), xv[j][1] = fk_f(y.y);
    mk = fmaxf(mk, fmaxf(fabsf(xk[j][0]), fabsf(xk[j][1])));
    mv = fmaxf(mv, fmaxf(fabsf(xv[j][0]), fabsf(xv[j][1])));
  }
  mk = fk_f(wmaxu(fk_u(mk)));
  mv = fk_f(wmaxu(fk_u(mv)));
  if (lane == 0) {
    s_m[wid] = mk;
    s_m[FNW + wid] = mv;
  }
  fk_sync();
  mk = fmaxf(fmaxf(s_m[0], s_m[1]), fmaxf(s_m[2], s_m[3]));
  mv = fmaxf(fmaxf(s_m[FNW], s_m[FNW + 1]), fmaxf(s_m[FNW + 2], s_m[FNW + 3]));
  const int shk = new_shift(mk), shv = mv >= 0x1p-10f && mv < 32768.0f ? 0 : new_shift(mv);
  const size_t et = (size_t)kvh * (a->P / 32) + T;
  if (tid == 0) {
    a->ex[2 * et] = shk;
    a->ex[2 * et + 1] = shv;
  }
  const float fk = fk_p2(shk), fv = fk_p2(shv);
  uint32_t *kw = (uint32_t *)(a->kx + et * 32 * D), *vw = (uint32_t *)(a->vx + et * 32 * D);
  #pragma unroll
  for (int j = 0; j < NP; ++j) {
    const int i = tid + FNT * j;
    kw[i] = f2h2(xk[j][0] * fk, xk[j][1] * fk);
    vw[i] = f2h2(xv[j][0] * fv, xv[j][1] * fv);
  }
}

/* The copies of key / value tile j of the block's sequence into the stage at shared address st:
 * thread tid takes 16-byte pieces tid, tid + XN_NT, ... of the keys' 32 rows and of the values'. */
static inline __attribute__((always_inline)) void xn_copy(uint32_t st, const uint16_t *k0, const uint16_t *v0, int j,
                                                          int tid, const int D) {
  const int CH = D / 8; /* pieces a row */
  const unsigned char *ks = (const unsigned char *)(k0 + (size_t)j * XN_BK * D);
  const unsigned char *vs = (const unsigned char *)(v0 + (size_t)j * XN_BK * D);
  #pragma unroll
  for (int j = 0; j < XN_BK * CH / XN_NT; ++j) {
    const int i = tid + XN_NT * j, r = i / CH, c = i % CH;
    const uint32_t o = (uint32_t)(r * 2 * D + ((c ^ (r & 7)) << 4));
    fk_cp16s(st + o, ks + 16 * i);
    fk_cp16s(st + 2 * XN_BK * D + o, vs + 16 * i);
  }
}

/* The attention block (see the top of the file); s_u: XN_NS(D) stages of shared memory. */
static inline __attribute__((always_inline)) void xn_attend(const xn_args *a, unsigned char *s_u, const int D) {
  const int KS = D / 16, NV = D / 8, NS = XN_NS(D), ST = XN_ST(D), RB = 2 * D; /* RB: bytes of a row */
  const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5, g = lane >> 2, t = lane & 3;
  const int HQ = a->HQ, blk = ompx_block_id_x(), hq = blk % HQ, kvh = hq / (HQ / a->H);
  const int32_t *td = a->tab + 3 * a->nseq + 3 * (blk / HQ);
  const int row0 = td[0], nrows = td[1], si = td[2];
  const int first = a->tab[3 * si], pofs = a->tab[3 * si + 2];
  const int32_t *ext = a->ex + 2 * ((size_t)kvh * (a->P / 32) + pofs / 32); /* the sequence's staging tiles */
  const uint16_t *k0 = a->kx + ((size_t)kvh * a->P + pofs) * D, *v0 = a->vx + ((size_t)kvh * a->P + pofs) * D;
  /* the rows: ra = 16 wid + g and rb = ra + 8 of the tile (local to the sequence: + lr0) */
  const int lr0 = row0 - first, ra = 16 * wid + g, rb = ra + 8, va = ra < nrows, vb = rb < nrows;
  const int nkt = (lr0 + nrows + XN_BK - 1) / XN_BK; /* the block's key tiles */
  const uint32_t su = fk_saddr(s_u);
  #pragma unroll
  for (int j = 0; j < NS - 1; ++j) {
    if (j < nkt) xn_copy(su + j * ST, k0, v0, j, tid, D);
    fk_cp_commit();
  }
  /* ---- q * qmul of rows ra, rb as A fragments: k-step ks takes channels 16 ks + 2 t + {0, 1}
   * (a0: ra, a1: rb) and 16 ks + 2 t + {8, 9} (a2: ra, a3: rb) */
  uint32_t qf[8][4]; /* KS used (constant sizes: no array of the kernel may be a VLA) */
  float fa, fb; /* 2^-sq of rows ra, rb */
  {
    float qv[8][8], mqa = 0.0f, mqb = 0.0f;
    const float *qa = a->q + ((size_t)(row0 + (va ? ra : 0)) * HQ + hq) * D;
    const float *qb = a->q + ((size_t)(row0 + (vb ? rb : 0)) * HQ + hq) * D;
    #pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int c = 16 * ks + 2 * t;
      const fk_v2u a0 = ld8((const uint32_t *)(qa + c)), a2 = ld8((const uint32_t *)(qa + c + 8));
      const fk_v2u b0 = ld8((const uint32_t *)(qb + c)), b2 = ld8((const uint32_t *)(qb + c + 8));
      const float x[8] = {fk_f(a0.x), fk_f(a0.y), fk_f(b0.x), fk_f(b0.y), fk_f(a2.x), fk_f(a2.y), fk_f(b2.x), fk_f(b2.y)};
      #pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int isb = (i >> 1) & 1;
        qv[ks][i] = ((isb ? vb : va) ? x[i] : 0.0f) * a->qmul;
        if (isb) mqb = fmaxf(mqb, fabsf(qv[ks][i]));
        else mqa = fmaxf(mqa, fabsf(qv[ks][i]));
      }
    }
    mqa = fmaxf(mqa, shfx(mqa, 1)); /* the 4 lanes of g hold the row's channels */
    mqa = fmaxf(mqa, shfx(mqa, 2));
    mqb = fmaxf(mqb, shfx(mqb, 1));
    mqb = fmaxf(mqb, shfx(mqb, 2));
    const int sqa = new_shift(mqa), sqb = new_shift(mqb);
    const float ua = fk_p2(sqa), ub = fk_p2(sqb);
    #pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float f = (j & 1) ? ub : ua;
        qf[ks][j] = f2h2(qv[ks][2 * j] * f, qv[ks][2 * j + 1] * f);
      }
    fa = fk_p2(-sqa);
    fb = fk_p2(-sqb);
  }
  /* the lane's ldmatrix rows: matrix mi = lane / 8, row rr = lane % 8.  Keys (B of S, n: tokens,
   * k: channels): matrix mi is tokens 8 (2 np + mi / 2) + rr, piece 2 ks + mi % 2; values (B of
   * P V, k: tokens, n: channels, transposed): tokens 16 kk + 8 (mi % 2) + rr, piece 2 vp + mi / 2.
   * A piece index 2 x + b XOR rr is (2 x) ^ (b ^ rr): its low three bits depend on x % 4 only. */
  const int mi = lane >> 3, rr = lane & 7;
  uint32_t ko[4], vo[4];
  #pragma unroll
  for (int x = 0; x < 4; ++x) {
    ko[x] = (uint32_t)((8 * (mi >> 1) + rr) * RB + (((2 * x) ^ ((mi & 1) ^ rr)) << 4));
    vo[x] = (uint32_t)(2 * XN_BK * D + (8 * (mi & 1) + rr) * RB + (((2 * x) ^ ((mi >> 1) ^ rr)) << 4));
  }
  float o[16][4]; /* NV used */
  #pragma unroll
  for (int i = 0; i < NV; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float ma = -INFINITY, mb = -INFINITY, la = 0.0f, lb = 0.0f;
  const int wfirst = lr0 + 16 * wid, wlast = wfirst + 15, live = 16 * wid < nrows;
  for (int kt = 0; kt < nkt; ++kt) {
    const fk_v2u e2 = ld8((const uint32_t *)(ext + 2 * kt)); /* in flight through the wait */
    if (NS == 2) fk_cp_wait(0);
    else fk_cp_wait(1);
    fk_sync(); /* tile kt is in its stage for every thread; every warp is done with tile kt - 1 */
    if (kt + NS - 1 < nkt) xn_copy(su + (uint32_t)(((kt + NS - 1) % NS) * ST), k0, v0, kt + NS - 1, tid, D);
    fk_cp_commit();
    const int kb0 = XN_BK * kt;
    if (live && kb0 <= wlast) { /* warp-uniform */
      const uint32_t sb = su + (uint32_t)((kt % NS) * ST);
      float s[4][4];
      #pragma unroll
      for (int e = 0; e < 16; ++e) s[e >> 2][e & 3] = 0.0f;
      #pragma unroll
      for (int ks = 0; ks < KS; ++ks)
        #pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          fk_ldsm4s(b, sb + ko[ks & 3] + (uint32_t)(128 * (ks >> 2) + 16 * np * RB));
          mma16816(s[2 * np], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[0], b[1]);
          mma16816(s[2 * np + 1], qf[ks][0], qf[ks][1], qf[ks][2], qf[ks][3], b[2], b[3]);
        }
      /* s[nt] = {row ra: tokens kb0 + 8 nt + 2 t, + 1; row rb: the same}: the mask, the rows' maxima */
      const float fkk = fk_p2(-(int32_t)e2.x), ska = fa * fkk, skb = fb * fkk; /* the logit of s: s ska */
      if (kb0 + XN_BK - 1 > wfirst) { /* warp-uniform: the tile reaches past a row of the warp */
        #pragma unroll
        for (int nt = 0; nt < 4; ++nt)
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int tok = kb0 + 8 * nt + 2 * t + (i & 1), row = lr0 + (i < 2 ? ra : rb);
            if (tok > row) s[nt][i] = -INFINITY;
          }
      }
      float xa = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
      float xb = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
      xa = fmaxf(xa, fmaxf(fmaxf(s[2][0], s[2][1]), fmaxf(s[3][0], s[3][1])));
      xb = fmaxf(xb, fmaxf(fmaxf(s[2][2], s[2][3]), fmaxf(s[3][2], s[3][3])));
      xa = fmaxf(xa, shfx(xa, 1));
      xa = fmaxf(xa, shfx(xa, 2));
      xb = fmaxf(xb, shfx(xb, 1));
      xb = fmaxf(xb, shfx(xb, 2));
      xa *= ska;
      xb *= skb;
      /* A row's reference m moves only when the tile's largest logit passes it by more than 8 (every
       * row does in tile 0, which sees token 0): p = 2^(x - m) < 2^8 in f16, and the rescale of o
       * and l is rare past the first tiles. */
      if (fk_ballot(xa > ma + 8.0f || xb > mb + 8.0f)) { /* warp-uniform */
        const float na = xa > ma + 8.0f ? xa : ma, nb = xb > mb + 8.0f ? xb : mb;
        const float aa = fk_ex2(ma - na), ab = fk_ex2(mb - nb);
        ma = na;
        mb = nb;
        la *= aa;
        lb *= ab;
        #pragma unroll
        for (int nv = 0; nv < NV; ++nv) o[nv][0] *= aa, o[nv][1] *= aa, o[nv][2] *= ab, o[nv][3] *= ab;
      }
      uint32_t pf[2][4]; /* P as A fragments: k-step kk takes tokens 16 kk .. + 15 (n-tiles 2 kk, 2 kk + 1 of S) */
      #pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const float p0 = fk_ex2(fmaf(s[nt][0], ska, -ma)), p1 = fk_ex2(fmaf(s[nt][1], ska, -ma));
        const float p2 = fk_ex2(fmaf(s[nt][2], skb, -mb)), p3 = fk_ex2(fmaf(s[nt][3], skb, -mb));
        la += p0 + p1;
        lb += p2 + p3;
        pf[nt >> 1][2 * (nt & 1)] = f2h2(p0, p1);
        pf[nt >> 1][2 * (nt & 1) + 1] = f2h2(p2, p3);
      }
      /* O += 2^-shv P V: straight into o where shv = 0 (the staging's choice for values of any usual
       * range: block-uniform), else each tile's product from zero, scaled, added in fp32 */
      if (e2.y == 0u) {
        #pragma unroll
        for (int vp = 0; vp < NV / 2; ++vp)
          #pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            uint32_t b[4];
            fk_ldsm4ts(b, sb + vo[vp & 3] + (uint32_t)(128 * (vp >> 2) + 16 * kk * RB));
            mma16816(o[2 * vp], pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3], b[0], b[1]);
            mma16816(o[2 * vp + 1], pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3], b[2], b[3]);
          }
      } else {
        const float fvt = fk_p2(-(int32_t)e2.y);
        #pragma unroll
        for (int vp = 0; vp < NV / 2; ++vp) {
          float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
          #pragma unroll
          for (int kk = 0; kk < 2; ++kk) {
            uint32_t b[4];
            fk_ldsm4ts(b, sb + vo[vp & 3] + (uint32_t)(128 * (vp >> 2) + 16 * kk * RB));
            mma16816(d[0], pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3], b[0], b[1]);
            mma16816(d[1], pf[kk][0], pf[kk][1], pf[kk][2], pf[kk][3], b[2], b[3]);
          }
          #pragma unroll
          for (int e = 0; e < 4; ++e) {
            o[2 * vp][e] = fmaf(d[0][e], fvt, o[2 * vp][e]);
            o[2 * vp + 1][e] = fmaf(d[1][e], fvt, o[2 * vp + 1][e]);
          }
        }
      }
    }
  }
  /* the rows' sums over their 4 lanes */
  la += shfx(la, 1);
  la += shfx(la, 2);
  lb += shfx(lb, 1);
  lb += shfx(lb, 2);
  #pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = h ? rb : ra, ok = h ? vb : va;
    const float m = h ? mb : ma, l = h ? lb : la, rl = 1.0f / l;
    if (ok) {
      const size_t rh = (size_t)(row0 + r) * HQ + hq;
      #pragma unroll
      for (int nv = 0; nv < NV; ++nv) {
        const int c = 8 * nv + 2 * t;
        const float o0 = o[nv][2 * h], o1 = o[nv][2 * h + 1];
        if (a->direct) {
          a->out[rh * D + c] = o0 * rl;
          a->out[rh * D + c + 1] = o1 * rl;
        } else {
          float *po = a->part_o + (rh * a->nslots + a->slot) * D + c;
          po[0] = o0;
          po[1] = o1;
        }
      }
      if (t == 0) {
        if (a->direct) {
          if (a->lse) a->lse[rh] = (m + log2f(l)) * 0.6931471805599453f;
        } else {
          a->part_ml[2 * (rh * a->nslots + a->slot)] = m;
          a->part_ml[2 * (rh * a->nslots + a->slot) + 1] = l;
        }
      }
    }
  }
}
#pragma omp end declare target

/* The two regions of one head_dim, with the clauses of the run mode after the others. */
#define XN_REGIONS(DD, ...)                                                                                           \
  KIVI_BARE(nprep, FNT, device(dev) is_device_ptr(q, kn, vn, kx, vx, ex, part_o, part_ml, out, lse)          \
                map(to : tab[0:ntab])                           \
                firstprivate(H, HQ, P, nseq, ntiles, nslots, slot, direct, qmul) __VA_ARGS__) {                      \
    static float s_m[2 * FNW];                                                                                        \
    KIVI_PRAGMA(omp allocate(s_m) allocator(omp_pteam_mem_alloc))                                                    \
    const xn_args a_ = {tab, q, kn, vn, kx, vx, ex, part_o, part_ml, out, lse, P, nslots, slot, H, HQ, nseq, ntiles,  \
                        direct, qmul};                                                                                \
    xn_stage(&a_, s_m, DD);                                                                                           \
  }                                                                                                                   \
  KIVI_REGION_END                                                                                                     \
  KIVI_BARE(nmain, XN_NT, device(dev) is_device_ptr(q, kn, vn, kx, vx, ex, part_o, part_ml, out, lse)      \
                map(to : tab[0:ntab])   \
                firstprivate(H, HQ, P, nseq, ntiles, nslots, slot, direct, qmul) __VA_ARGS__) {                      \
    static fk_v4u s_u[XN_NS(DD) * XN_ST(DD) / 16];                                                                    \
    KIVI_PRAGMA(omp allocate(s_u) allocator(omp_pteam_mem_alloc))                                                    \
    const xn_args a_ = {tab, q, kn, vn, kx, vx, ex, part_o, part_ml, out, lse, P, nslots, slot, H, HQ, nseq, ntiles,  \
                        direct, qmul};                                                                                \
    xn_attend(&a_, (unsigned char *)s_u, DD);                                                                         \
  }                                                                                                                   \
  KIVI_REGION_END

void kivi_gpu_extend_new(kivi_cache *c, const int32_t *tab, int nseq, int ntiles, int64_t P, int HQ, const float *q,
                         const float *kn, const float *vn, float qmul, uint16_t *kx, uint16_t *vx, int32_t *ex,
                         float *part_o, float *part_ml, int64_t nslots, int64_t slot, float *out, float *lse, int async,
                         int lane) {
  const int H = c->cfg.n_kv_heads, dev = c->ctx->device, direct = nslots == 1, nmain = ntiles * HQ;
  const int nprep = (int)(P / 32) * H;
  const int64_t ntab = 3 * (int64_t)(nseq + ntiles) + 2 * (P / 32);
  if (c->cfg.head_dim == 64)
    KIVI_LAUNCH_TWICE(XN_REGIONS, 64, );
  else
    KIVI_LAUNCH_TWICE(XN_REGIONS, 128, );
}

#else /* no offload: never called (plan.c: never eligible) */
void kivi_gpu_extend_new(kivi_cache *c, const int32_t *tab, int nseq, int ntiles, int64_t P, int HQ, const float *q,
                         const float *kn, const float *vn, float qmul, uint16_t *kx, uint16_t *vx, int32_t *ex,
                         float *part_o, float *part_ml, int64_t nslots, int64_t slot, float *out, float *lse, int async,
                         int lane) {
  (void)c; (void)tab; (void)nseq; (void)ntiles; (void)P; (void)HQ; (void)q; (void)kn; (void)vn; (void)qmul; (void)kx;
  (void)vx; (void)ex; (void)part_o; (void)part_ml; (void)nslots; (void)slot; (void)out; (void)lse; (void)async;
  (void)lane;
}
#endif
