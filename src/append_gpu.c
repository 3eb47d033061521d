/* GPU fast path of a larger append's quantization: kernels 2a (keys, ak_block) and 2b (values,
 * av_block) of append.c as CUDA-like `ompx_bare` kernels, for 2- or 4-bit tensors with
 * head_dim 128 and G = 32 read from fp16 rows (a direct fp16 input in device memory, or the
 * stage).  They compute exactly what the portable items of kernels_quant.h compute (the same
 * group statistics, scales, zeros, codes, non-finite marks and V exponent bounds; the GPU suite
 * compares the bytes with a host-made cache), with the work laid out for the GPU:
 *
 *  - keys: a warp per (completed block, kv-head, token group), lane = 4 channels: one 8-byte
 *    load per token (a warp reads the token's 256-byte row), the group's 32 tokens held in
 *    registers between the statistics and the codes;
 *  - values: a thread per (token, kv-head, 32-channel group): four 16-byte loads; a warp is 8
 *    consecutive tokens of one kv-head, the next warps the same tokens of the next kv-heads (so
 *    the warps in flight read a contiguous range of the input);
 *  - the statistics as packed fp16 pairs (`min.NaN` / `max.NaN.f16x2`: one instruction per two
 *    values; a NaN or an infinity in the input reaches the minimum or the maximum, which is the
 *    non-finite check);
 *  - the V exponent bounds raised once per warp (a reduction over its lanes), not per item.
 * The generic kernels keep every other case (bf16 input, G > 32, other widths and head_dims). */
#include "config.h"

#include "internal.h"
#include "kernels_quant.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include <omp.h>
#include <ompx.h>

#define QNT 128 /* threads per block */
#define QD 128  /* head_dim */
/* value kernel: channel groups per thread (1, 2 or 4), tokens per warp */
#define QVG 2
#define QVT (8 * QVG)
#define QVTB (QVG == 1 ? 3 : QVG == 2 ? 4 : 5) /* log2 QVT */

#pragma omp declare target
#if defined(__NVPTX__)
/* packed fp16 minimum / maximum; a NaN in either operand gives NaN */
static inline uint32_t qa_min2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("min.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static inline uint32_t qa_max2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
typedef unsigned qa_v2u __attribute__((ext_vector_type(2)));
typedef unsigned qa_v4u __attribute__((ext_vector_type(4)));
static inline kivi_u32x2 qa_ld8(const uint16_t *p) {
  const qa_v2u v = __nvvm_ldg_ui2((const qa_v2u *)p);
  kivi_u32x2 r = {{v.x, v.y}};
  return r;
}
static inline kivi_u32x4 qa_ld16(const uint16_t *p) {
  const qa_v4u v = __nvvm_ldg_ui4((const qa_v4u *)p);
  kivi_u32x4 r = {{v.x, v.y, v.z, v.w}};
  return r;
}
static inline int qa_all(int p) { return __nvvm_vote_all_sync(0xffffffffu, p); }
#elif defined(KIVI_SIMT_EMU) /* the test library's emulated GPU (tests/simt) */
static inline uint32_t qa_h1(uint32_t a, uint32_t b, int mx) { /* min/max.NaN of one f16 */
  const double x = kivi_simt_h2d(a), y = kivi_simt_h2d(b);
  return isnan(x) || isnan(y) ? 0x7fffu : (mx ? x >= y : x <= y) ? a : b;
}
static inline uint32_t qa_min2(uint32_t a, uint32_t b) { return qa_h1(a & 0xffffu, b & 0xffffu, 0) | qa_h1(a >> 16, b >> 16, 0) << 16; }
static inline uint32_t qa_max2(uint32_t a, uint32_t b) { return qa_h1(a & 0xffffu, b & 0xffffu, 1) | qa_h1(a >> 16, b >> 16, 1) << 16; }
static inline kivi_u32x2 qa_ld8(const uint16_t *p) { return *(const kivi_u32x2 *)p; }
static inline kivi_u32x4 qa_ld16(const uint16_t *p) { return *(const kivi_u32x4 *)p; }
static inline int qa_all(int p) {
  const uint32_t v = p != 0;
  return kivi_simt_warp(KIVI_SIMT_BALLOT, &v, 1, NULL, 0)[0] == 0xffffffffu;
}
#else
/* Host stubs: the host pass must see the same region body as the device pass; a bare region
 * never runs on the host (the launcher only calls it for a GPU context). */
static inline uint32_t qa_min2(uint32_t a, uint32_t b) { return a < b ? a : b; }
static inline uint32_t qa_max2(uint32_t a, uint32_t b) { return a > b ? a : b; }
static inline kivi_u32x2 qa_ld8(const uint16_t *p) { return *(const kivi_u32x2 *)p; }
static inline kivi_u32x4 qa_ld16(const uint16_t *p) { return *(const kivi_u32x4 *)p; }
static inline int qa_all(int p) { return p; }
#endif
#pragma omp end declare target

/* What kernel 2a's and 2b's blocks need (their host functions' locals; the regions list them in
 * the order of their first use in the block, which is the order of the kernel's parameters) */
typedef struct ak_args {
  unsigned char *pool;
  const int32_t *bt;
  const uint16_t *kres, *src;
  const int64_t *dd;
  int32_t *vsc;
  int64_t *flag;
  int layer, n;
  unsigned nw;
  int H, hb, NL, MB, R, lr, lg;
  size_t sub, ksz_off;
  int64_t call_id;
} ak_args;
typedef struct av_args {
  unsigned char *pool;
  const int32_t *bt;
  const uint16_t *vres, *src;
  const int64_t *dd;
  int32_t *vsc;
  int64_t *flag;
  int layer, n;
  unsigned nt, nq;
  int H, hb, NL, MB, R, lr;
  size_t sub, vcode_off, vsz_off;
  int64_t call_id;
} av_args;

#pragma omp declare target
/* Kernel 2a's block for KB-bit keys (kivi_gpu_append_keys).  Warp w = (completed block kbi, kv-
 * head h, token group g) with 2^lg = R / 32 groups and 2^hb >= H kv-head slots (warps of h >= H
 * idle); lane = channels 4 lane .. 4 lane + 3 (kivi_k4_item with the group held in registers,
 * reading ring rows for the tokens before L; positions fit in int). */
static inline __attribute__((always_inline)) void ak_block(const ak_args *a, const int KB) {
  const int lg = a->lg;
  const int hb = a->hb;
  const unsigned nw = a->nw;
  const int H = a->H;
  int64_t *const flag = a->flag;
  const int64_t *const dd = a->dd;
  const int n = a->n;
  const int lr = a->lr;
  const int R = a->R;
  unsigned char *const pool = a->pool;
  const int32_t *const bt = a->bt;
  const int NL = a->NL;
  const int layer = a->layer;
  const int MB = a->MB;
  const size_t sub = a->sub;
  const uint16_t *const kres = a->kres;
  const uint16_t *const src = a->src;
  const size_t ksz_off = a->ksz_off;
  const int64_t call_id = a->call_id;
  const int tid = ompx_thread_id_x(), lane = tid & 31;
  const unsigned w = (unsigned)ompx_block_id_x() * (QNT / 32) + (unsigned)(tid >> 5);
  const int g = (int)(w & ((1u << lg) - 1u)), h = (int)(w >> lg & ((1u << hb) - 1u));
  if (w < nw && h < H && !flag[0]) { /* warp-uniform */
    const unsigned kbi = w >> (lg + hb);
    const int i = kivi_find_seq(dd + (size_t)D_KBPRE * n, n, kbi);
    const int s = (int)dd[(size_t)D_SEQ * n + i], L = (int)dd[(size_t)D_L * n + i];
    const int blk_no = (L >> lr) + (int)(kbi - dd[(size_t)D_KBPRE * n + i]), p0 = blk_no * R + 32 * g;
    unsigned char *sb = pool + ((size_t)bt[((size_t)s * NL + layer) * MB + blk_no] * H + h) * sub;
    const int c0 = 4 * lane, nring = L <= p0 ? 0 : L - p0 < 32 ? L - p0 : 32;
    /* token t: ring row (p0 mod R) + t for t < nring, else source row nring .. of the stage */
    const uint16_t *rrow = kres + (((size_t)s * NL + layer) * H + h) * (size_t)R * QD + (size_t)(p0 & (R - 1)) * QD + c0;
    const size_t sstep = (size_t)H * QD;
    const uint16_t *srow =
        src + ((size_t)(dd[(size_t)D_STAGE * n + i] + (p0 + (nring < 32 ? nring : 0) - L)) * H + h) * QD + c0;
    uint32_t xa[32], xb[32]; /* channels (c0, c0 + 1) and (c0 + 2, c0 + 3) of each token */
    if (nring == 0) {
      #pragma unroll
      for (int t = 0; t < 32; ++t) {
        const kivi_u32x2 v = qa_ld8(srow + (size_t)t * sstep);
        xa[t] = v.w[0];
        xb[t] = v.w[1];
      }
    } else {
      #pragma unroll
      for (int t = 0; t < 32; ++t) {
        const kivi_u32x2 v = qa_ld8(t < nring ? rrow + (size_t)t * QD : srow + (size_t)(t - nring) * sstep);
        xa[t] = v.w[0];
        xb[t] = v.w[1];
      }
    }
    uint32_t na = xa[0], ma = xa[0], nb = xb[0], mb = xb[0];
    #pragma unroll
    for (int t = 1; t < 32; ++t) {
      na = qa_min2(na, xa[t]);
      ma = qa_max2(ma, xa[t]);
      nb = qa_min2(nb, xb[t]);
      mb = qa_max2(mb, xb[t]);
    }
    const uint32_t bad = kivi_f16x2_nonfinite(na) | kivi_f16x2_nonfinite(ma) | kivi_f16x2_nonfinite(nb) |
                         kivi_f16x2_nonfinite(mb);
    const uint32_t mnw[2] = {na, nb}, mxw[2] = {ma, mb};
    const float maxq = (float)((1u << KB) - 1u);
    float sf[4], z[4], rs[4], nzr[4];
    uint16_t hs[4], hz[4];
    int fma_ok = 1;
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float mn = j & 1 ? kivi_f16x2_hi(mnw[j >> 1]) : kivi_f16x2_lo(mnw[j >> 1]);
      const float mx = j & 1 ? kivi_f16x2_hi(mxw[j >> 1]) : kivi_f16x2_lo(mxw[j >> 1]);
      kivi_group_params(mn, mx, KB, &hs[j], &hz[j]);
      sf[j] = kivi_f16_to_f32(hs[j]);
      z[j] = kivi_f16_to_f32(hz[j]);
      rs[j] = kivi_quant_rs(sf[j]);
      nzr[j] = -(z[j] * rs[j]);
      fma_ok &= kivi_quant_fma_ok(z[j], sf[j], rs[j]);
    }
    uint16_t *sc = (uint16_t *)(sb + ksz_off) + (size_t)g * 2 * QD + c0; /* kivi_kscales_at */
    kivi_u32x2 ps, pz;
    ps.w[0] = (uint32_t)hs[0] | (uint32_t)hs[1] << 16;
    ps.w[1] = (uint32_t)hs[2] | (uint32_t)hs[3] << 16;
    pz.w[0] = (uint32_t)hz[0] | (uint32_t)hz[1] << 16;
    pz.w[1] = (uint32_t)hz[2] | (uint32_t)hz[3] << 16;
    *(kivi_u32x2 *)sc = ps;
    *(kivi_u32x2 *)(sc + QD) = pz;
    int ke[3] = {-14, -14, -14}; /* the K exponent bound of the call's sequence i, kv-head h */
    kivi_kexp_fold(&ke[2], hs, 4);
    kivi_vexp_raise(a->vsc + ((size_t)i * H + h) * KIVI_XB, ke);
    /* kivi_kcodes_at: rows of QD * KB / 8 bytes, the lane's 4 codes at byte c0 * KB / 8 */
    unsigned char *codes = sb + (size_t)g * 32 * (QD * KB / 8) + c0 * KB / 8;
    uint32_t fix = 0; /* tokens with a code the division decides */
    /* the 32 tokens' codes, with (x - zero) rs as one fma where every lane's 4 groups allow it
     * (warp-uniform), else as kivi_quant_code_mul */
#define QK_CODES(CODE_J)                                           \
  _Pragma("unroll") for (int t = 0; t < 32; ++t) {                 \
    uint32_t wq = 0;                                               \
    float dv = 0.0f;                                               \
    _Pragma("unroll") for (int j = 0; j < 4; ++j) {                \
      const uint32_t x = j < 2 ? xa[t] : xb[t];                    \
      const float f = j & 1 ? kivi_f16x2_hi(x) : kivi_f16x2_lo(x); \
      wq |= CODE_J << (KB * j);                                    \
    }                                                              \
    fix |= (uint32_t)(dv > KIVI_QUANT_NEAR) << t;                  \
    kivi_k4_store(codes + (size_t)t * (QD * KB / 8), wq, KB);      \
  }
    if (qa_all(fma_ok)) {
      QK_CODES(kivi_quant_code_fma(f, rs[j], nzr[j], &dv))
    } else {
      QK_CODES(kivi_quant_code_mul(f, rs[j], z[j], maxq, &dv))
    }
#undef QK_CODES
    while (fix) { /* their 4 codes again, by the division */
      const int t = __builtin_ctz(fix);
      fix &= fix - 1u;
      const kivi_u32x2 x = qa_ld8(t < nring ? rrow + (size_t)t * QD : srow + (size_t)(t - nring) * sstep);
      uint32_t wq = 0;
      for (int j = 0; j < 4; ++j) {
        const float f = j & 1 ? kivi_f16x2_hi(x.w[j >> 1]) : kivi_f16x2_lo(x.w[j >> 1]);
        wq |= kivi_quant_code(f, sf[j], z[j], maxq) << (KB * j);
      }
      kivi_k4_store(codes + (size_t)t * (QD * KB / 8), wq, KB);
    }
    if (bad) {
#pragma omp atomic write
      flag[0] = call_id;
    }
  }
}

/* Kernel 2b's block for KB-bit values (kivi_gpu_append_values).  Thread = (tile of QVT value
 * indices of the call, kv-head h (2^hb >= H slots: warps of h >= H idle), index in the tile, part
 * gi), gi fastest: the thread quantizes the QVG channel groups cg = QVG gi .. QVG gi + QVG - 1 of
 * one token (kivi_v32_item with the groups held in registers).  A warp is the tile's tokens on one
 * kv-head, the next warps the same tokens on the next kv-heads.  Positions fit in int, R = 2^lr. */
static inline __attribute__((always_inline)) void av_block(const av_args *a, const int KB) {
  const int hb = a->hb;
  const unsigned nt = a->nt;
  const int H = a->H;
  const unsigned nq = a->nq;
  int64_t *const flag = a->flag;
  const int64_t *const dd = a->dd;
  const int n = a->n;
  const int R = a->R;
  const uint16_t *const vres = a->vres;
  const int NL = a->NL;
  const int layer = a->layer;
  const uint16_t *const src = a->src;
  unsigned char *const pool = a->pool;
  const int32_t *const bt = a->bt;
  const int MB = a->MB;
  const int lr = a->lr;
  const size_t sub = a->sub;
  const size_t vsz_off = a->vsz_off;
  const size_t vcode_off = a->vcode_off;
  const int64_t call_id = a->call_id;
  int32_t *const vsc = a->vsc;
  const int tid = ompx_thread_id_x();
  const unsigned gt = (unsigned)ompx_block_id_x() * QNT + (unsigned)tid;
  const int gi = (int)(gt % (4u / QVG)), h = (int)(gt >> 5 & ((1u << hb) - 1u));
  const unsigned vq = gt >> (5 + hb) << QVTB | (gt / (4u / QVG) & (QVT - 1u));
  int e0 = -14, e1 = -14, si = 0; /* si: the token's sequence in the call */
  if (gt < nt && h < H && vq < nq && !flag[0]) {
    const int i = kivi_find_seq(dd + (size_t)D_VQPRE * n, n, vq);
    si = i;
    const int s = (int)dd[(size_t)D_SEQ * n + i], L = (int)dd[(size_t)D_L * n + i];
    const int p = (int)(dd[(size_t)D_VQBEG * n + i] + (vq - dd[(size_t)D_VQPRE * n + i])), slot = p & (R - 1);
    const uint16_t *x =
        (p < L ? vres + (((size_t)s * NL + layer) * H + h) * (size_t)R * QD + (size_t)slot * QD /* kivi_src_row */
               : src + ((size_t)(dd[(size_t)D_STAGE * n + i] + (p - L)) * H + h) * QD) + 32 * QVG * gi;
    unsigned char *sb = pool + ((size_t)bt[((size_t)s * NL + layer) * MB + (p >> lr)] * H + h) * sub;
    uint32_t w[QVG][16];
    #pragma unroll
    for (int u = 0; u < QVG; ++u)
      #pragma unroll
      for (int q = 0; q < 4; ++q) {
        const kivi_u32x4 v = qa_ld16(x + 32 * u + 8 * q);
        #pragma unroll
        for (int e = 0; e < 4; ++e) w[u][4 * q + e] = v.w[e];
      }
    const float maxq = (float)((1u << KB) - 1u);
    const int cpw = 32 / KB; /* codes per word */
    uint32_t bad = 0, szw[QVG], cw[QVG][KB];
    #pragma unroll
    for (int u = 0; u < QVG; ++u) {
      uint32_t mn2[8], mx2[8];
      #pragma unroll
      for (int k = 0; k < 8; ++k) {
        mn2[k] = qa_min2(w[u][2 * k], w[u][2 * k + 1]);
        mx2[k] = qa_max2(w[u][2 * k], w[u][2 * k + 1]);
      }
      #pragma unroll
      for (int m = 4; m; m >>= 1)
        #pragma unroll
        for (int k = 0; k < m; ++k) {
          mn2[k] = qa_min2(mn2[k], mn2[k + m]);
          mx2[k] = qa_max2(mx2[k], mx2[k + m]);
        }
      bad |= kivi_f16x2_nonfinite(mn2[0]) | kivi_f16x2_nonfinite(mx2[0]);
      const float mn = fminf(kivi_f16x2_lo(mn2[0]), kivi_f16x2_hi(mn2[0]));
      const float mx = fmaxf(kivi_f16x2_lo(mx2[0]), kivi_f16x2_hi(mx2[0]));
      uint16_t hs, hz;
      kivi_group_params(mn, mx, KB, &hs, &hz);
      szw[u] = (uint32_t)hs | (uint32_t)hz << 16;
      const float sf = kivi_f16_to_f32(hs), z = kivi_f16_to_f32(hz), rs = kivi_quant_rs(sf), nzr = -(z * rs);
      #pragma unroll
      for (int k = 0; k < KB; ++k) cw[u][k] = 0;
      uint32_t fix = 0; /* channel pairs with a code the division decides */
      if (kivi_quant_fma_ok(z, sf, rs)) {
        #pragma unroll
        for (int ch = 0; ch < 32; ch += 2) {
          float dv = 0.0f;
          cw[u][ch / cpw] |= kivi_quant_code_fma(kivi_f16x2_lo(w[u][ch / 2]), rs, nzr, &dv) << (KB * (ch % cpw));
          cw[u][ch / cpw] |= kivi_quant_code_fma(kivi_f16x2_hi(w[u][ch / 2]), rs, nzr, &dv)
                             << (KB * (ch % cpw + 1));
          fix |= (uint32_t)(dv > KIVI_QUANT_NEAR) << ch;
        }
      } else {
        #pragma unroll
        for (int ch = 0; ch < 32; ch += 2) {
          float dv = 0.0f;
          cw[u][ch / cpw] |= kivi_quant_code_mul(kivi_f16x2_lo(w[u][ch / 2]), rs, z, maxq, &dv) << (KB * (ch % cpw));
          cw[u][ch / cpw] |= kivi_quant_code_mul(kivi_f16x2_hi(w[u][ch / 2]), rs, z, maxq, &dv)
                             << (KB * (ch % cpw + 1));
          fix |= (uint32_t)(dv > KIVI_QUANT_NEAR) << ch;
        }
      }
      while (fix) { /* their codes again, by the division */
        const int ch = __builtin_ctz(fix);
        fix &= fix - 1u;
        const int sh = KB * (ch % cpw); /* the pair's two codes are neighbours in one word */
        const uint32_t code = kivi_quant_code(kivi_f16_to_f32(x[32 * u + ch]), sf, z, maxq) |
                              kivi_quant_code(kivi_f16_to_f32(x[32 * u + ch + 1]), sf, z, maxq) << KB;
        #pragma unroll
        for (int k = 0; k < KB; ++k) /* constant indices: cw stays in registers */
          if (k == ch / cpw) cw[u][k] = (cw[u][k] & ~((uint32_t)(maxq * (1 << KB) + maxq) << sh)) | code << sh;
      }
      int e2[2] = {e0, e1};
      kivi_vexp_fold(e2, (const uint16_t[2]){hs, hz});
      e0 = e2[0];
      e1 = e2[1];
    }
    /* the token's {scale, zero} pairs (kivi_vscales_at) and code words (kivi_vcodes_at: rows of
     * QD KB / 32 words, group cg's KB words at cg KB) of groups QVG gi .. */
    uint32_t *sz = (uint32_t *)(sb + vsz_off) + (size_t)slot * (QD / 32) + QVG * gi;
    uint32_t *dst = (uint32_t *)(sb + vcode_off) + (size_t)slot * (QD * KB / 32) + QVG * KB * gi;
#if QVG == 1
    sz[0] = szw[0];
#elif QVG == 2
    *(kivi_u32x2 *)sz = (kivi_u32x2){{szw[0], szw[1]}};
#else
    *(kivi_u32x4 *)sz = (kivi_u32x4){{szw[0], szw[1], szw[2], szw[3]}};
#endif
    #pragma unroll
    for (int k = 0; k < QVG * KB; k += 2) { /* 8-byte stores: 2-bit groups are 8 bytes */
      const kivi_u32x2 o = {{cw[k / KB][k % KB], cw[(k + 1) / KB][(k + 1) % KB]}};
      *(kivi_u32x2 *)(dst + k) = o;
    }
    if (bad) {
#pragma omp atomic write
      flag[0] = call_id;
    }
  }
  kivi_vexp_raise(vsc + KIVI_XB * ((size_t)si * H + h), (const int[3]){e0, e1, -14}); /* none where h >= H */
}
#pragma omp end declare target

/* The regions of one bit width, with the clauses of their run mode after the others. */
#define AK_REGION(KBB, ...)                                                                                           \
  KIVI_BARE(nblk, QNT, device(dev) is_device_ptr(pool, bt, kres, src, dd, vsc, flag)                                 \
                firstprivate(layer, n, nw, H, hb, NL, MB, R, lr, lg, sub, ksz_off, call_id) __VA_ARGS__) {            \
    const ak_args a_ = {.lg = lg, .hb = hb, .nw = nw, .H = H, .flag = flag, .dd = dd, .n = n, .lr = lr, .R = R,       \
                        .vsc = vsc,                                                                                   \
                        .pool = pool, .bt = bt, .NL = NL, .layer = layer, .MB = MB, .sub = sub, .kres = kres,         \
                        .src = src, .ksz_off = ksz_off, .call_id = call_id};                                          \
    ak_block(&a_, KBB);                                                                                               \
  }                                                                                                                   \
  KIVI_REGION_END
#define AV_REGION(KBB, ...)                                                                                           \
  KIVI_BARE(nblk, QNT, device(dev) is_device_ptr(pool, bt, vres, src, dd, vsc, flag)                                 \
                firstprivate(layer, n, nt, nq, H, hb, NL, MB, R, lr, sub, vcode_off, vsz_off, call_id) __VA_ARGS__) { \
    const av_args a_ = {.hb = hb, .nt = nt, .H = H, .nq = nq, .flag = flag, .dd = dd, .n = n, .R = R,                 \
                        .vres = vres, .NL = NL, .layer = layer, .src = src, .pool = pool, .bt = bt, .MB = MB,         \
                        .lr = lr, .sub = sub, .vsz_off = vsz_off, .vcode_off = vcode_off, .call_id = call_id,         \
                        .vsc = vsc};                                                                                  \
    av_block(&a_, KBB);                                                                                               \
  }                                                                                                                   \
  KIVI_REGION_END

/* Kernel 2a: the nkb blocks the append completes (descriptor dd of n sequences, device copy),
 * keys from src ([token][H][128] fp16 from each sequence's stage row); raises the K bounds of vsc
 * [sequence of the call][H][KIVI_XB] to the stored scales' exponent bound; a non-finite key sets
 * *flag to call_id.  Skipped if *flag is set.  async: enqueued on the lane's dependences.
 * Returns 0, or -1 (nothing launched) for a call too large for its 32-bit indices. */
int kivi_gpu_append_keys(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nkb, const uint16_t *src,
                          int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int lr = kivi_log2up(R), lg = lr - 5, hb = kivi_log2up(H);
  const size_t sub = c->lay.sub_bytes, ksz_off = c->lay.ksz_off;
  const int64_t nw64 = nkb << (lg + hb); /* warps */
  if (nw64 <= 0) return 0;
  if (nw64 >= (int64_t)1 << 29) return -1; /* 32-bit thread indices */
  const unsigned nw = (unsigned)nw64;
  const int nblk = (int)((nw64 + QNT / 32 - 1) / (QNT / 32)), dev = c->ctx->device;
  if (c->cfg.k_bits == 2) KIVI_LAUNCH_TWICE(AK_REGION, 2, ); else KIVI_LAUNCH_TWICE(AK_REGION, 4, );
  return 0;
}

/* Kernel 2b: the nvq values that leave the windows, from src as kivi_gpu_append_keys; raises
 * the V bounds of vsc [sequence of the call][H][KIVI_XB] to the exponent bounds of the stored
 * {scale, zero} pairs. */
int kivi_gpu_append_values(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nvq, const uint16_t *src,
                            int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *vres = c->vres;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int lr = kivi_log2up(R), hb = kivi_log2up(H);
  const size_t sub = c->lay.sub_bytes, vcode_off = c->lay.vcode_off, vsz_off = c->lay.vsz_off;
  const int64_t nt64 = (nvq + QVT - 1) / QVT << (5 + hb); /* threads: tiles x 2^hb kv-heads x a warp */
  if (nt64 <= 0) return 0;
  if (nt64 >= (int64_t)1 << 31) return -1; /* 32-bit thread indices */
  const unsigned nt = (unsigned)nt64, nq = (unsigned)nvq;
  const int nblk = (int)((nt64 + QNT - 1) / QNT), dev = c->ctx->device;
  if (c->cfg.v_bits == 2) KIVI_LAUNCH_TWICE(AV_REGION, 2, ); else KIVI_LAUNCH_TWICE(AV_REGION, 4, );
  return 0;
}

#else /* no offload: never called (plan.c: never eligible) */
int kivi_gpu_append_keys(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nkb, const uint16_t *src,
                          int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  (void)c; (void)layer; (void)dd; (void)n; (void)nkb; (void)src; (void)vsc; (void)flag; (void)call_id; (void)async;
  (void)lane;
  return -1;
}
int kivi_gpu_append_values(kivi_cache *c, int layer, const int64_t *dd, int n, int64_t nvq, const uint16_t *src,
                            int32_t *vsc, int64_t *flag, int64_t call_id, int async, int lane) {
  (void)c; (void)layer; (void)dd; (void)n; (void)nvq; (void)src; (void)vsc; (void)flag; (void)call_id; (void)async;
  (void)lane;
  return -1;
}
#endif
