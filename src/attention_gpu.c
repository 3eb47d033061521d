/* GPU fast path of the fused attention: one CUDA-like `ompx_bare` kernel per step for the
 * quantized part of 2-bit, head_dim 128, G = 32 caches (the paper's default configuration).
 * It covers the first Lf = floor(max(0, Lc - R) / KIVI_FAST_GRAIN) * KIVI_FAST_GRAIN tokens of
 * each row (there keys and values are both quantized) in splits of up to KIVI_FAST_SPLIT; the
 * portable kernel (attention.c) does the rest (the fp16 windows, new tokens, < 32 quantized
 * tokens) and the combine.  It is the design measured in
 * ../shared/research/omp-spike.md (variant K), adapted to the library's packed layout:
 *
 *  - f16x2 dequant-dot: a 2-bit code pair masked out of its word *is* an f16x2 of two
 *    subnormals c * 4^pos * 2^-24, so one LOP3 + one HFMA2 handle two elements; the other
 *    operand B = q * scale * 2^(24 - 2 pos - S) is staged per 32-token group in shared memory.
 *  - K scales/zeros are stored in channel order (docs/FORMAT.md); each lane reads the 2 x 8
 *    bytes it needs and pairs channels c and c+8 with PRMT.  S is chosen per group from the
 *    group's max |q * scale| (no cache-wide range metadata needed for K).
 *  - V: p is packed as f16x2 {p * 2^(24 - SV), p * 2^-ZV} and multiplied by the token's
 *    {scale, zero} pair; SV and ZV come from the cache's per-(layer, kv-head) exponent bounds
 *    of V scales and zeros (maintained by append).  f16 runs of 8 tokens flush to fp32.
 *  - 4 warps per block, 4 K groups of loads in flight per warp, 8 V tokens per lane.
 * Accuracy is fp16-attention class (about 1e-3 relative); KIVI_ATTENTION_FP32 selects the
 * portable fp32 kernel instead. */
#include "config.h"

#include "internal.h"

#if KIVI_HAVE_OFFLOAD && defined(__clang__)
#include <math.h>
#include <omp.h>
#include <ompx.h>
#include <string.h>

#define FNT 128 /* threads per block */
#define FNW 4   /* warps per block */
#define FKU 4   /* K groups per warp iteration, loads first */
#define FVU 8   /* V tokens per lane, loads first */
#define FVR 8   /* V tokens per f16 run */
#define FD 128
_Static_assert(KIVI_FAST_GRAIN == 32, "the kernel handles any whole number of 32-token groups");
_Static_assert(KIVI_FAST_SPLIT / 32 % (FNW * FKU) == 0, "whole K rounds per warp in a full split");
_Static_assert(KIVI_FAST_SPLIT / FNW % (8 * FVR) == 0, "whole V runs per lane in a full split");

#pragma omp declare target
static inline float fk_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t fk_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float fk_p2(int n) { return fk_f((uint32_t)(n + 127) << 23); }
static inline int fk_ceil_exp(float x) { return (int)((fk_u(x) >> 23) & 255) - 126; } /* 2^e > x > 0 */
typedef unsigned fk_v4u __attribute__((ext_vector_type(4)));
typedef unsigned fk_v2u __attribute__((ext_vector_type(2)));
#if defined(__NVPTX__)
static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  __asm__("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
static inline uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static inline uint32_t hadd2(uint32_t a, uint32_t b) {
  uint32_t d;
  __asm__("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
  uint32_t d;
  __asm__("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
}
static inline void h2f(uint32_t a, float *lo, float *hi) {
  float x, y;
  __asm__("{.reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h;}" : "=f"(x), "=f"(y) : "r"(a));
  *lo = x;
  *hi = y;
}
static inline uint32_t f2h2(float lo, float hi) {
  uint32_t d;
  __asm__("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}
static inline fk_v4u ld16(const uint32_t *p) { return __nvvm_ldg_ui4((const fk_v4u *)p); }
static inline fk_v2u ld8(const uint32_t *p) { return __nvvm_ldg_ui2((const fk_v2u *)p); }
static inline uint32_t ld4(const uint32_t *p) { return __nvvm_ldg_ui(p); }
static inline float shfx(float v, int o) { return __nvvm_shfl_sync_bfly_f32(0xffffffffu, v, o, 0x1f); }
static inline float fk_ex2(float x) { return __nvvm_ex2_approx_f(x); }
static inline void fk_sync(void) { __syncthreads(); }
static inline void fk_wsync(void) { __nvvm_bar_warp_sync(0xffffffffu); }
#else
/* Host stubs: the host pass must see the same region body (same captures) as the device pass;
 * a bare region never runs on the host (the launcher only calls it for a GPU context). */
static inline uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) { return a ^ b ^ c; }
static inline uint32_t hmul2(uint32_t a, uint32_t b) { return a ^ b; }
static inline uint32_t hadd2(uint32_t a, uint32_t b) { return a ^ b; }
static inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) { return a ^ b ^ s; }
static inline void h2f(uint32_t a, float *lo, float *hi) { *lo = (float)(a & 0xffff); *hi = (float)(a >> 16); }
static inline uint32_t f2h2(float lo, float hi) { return (uint32_t)lo ^ (uint32_t)hi; }
static inline fk_v4u ld16(const uint32_t *p) { fk_v4u r = {p[0], p[1], p[2], p[3]}; return r; }
static inline fk_v2u ld8(const uint32_t *p) { fk_v2u r = {p[0], p[1]}; return r; }
static inline uint32_t ld4(const uint32_t *p) { return *p; }
static inline float shfx(float v, int o) { (void)o; return v; }
static inline float fk_ex2(float x) { return exp2f(x); }
static inline void fk_sync(void) {}
static inline void fk_wsync(void) {}
#endif
static inline float wsum(float v) { for (int o = 16; o; o >>= 1) v += shfx(v, o); return v; }
static inline float wmax(float v) { for (int o = 16; o; o >>= 1) v = fmaxf(v, shfx(v, o)); return v; }
#pragma omp end declare target

int kivi_gpu_fast_eligible(const kivi_cache *c) {
  const kivi_cache_config *f = &c->cfg;
  const int R = f->residual;
  return c->ctx->on_gpu && f->attention == KIVI_ATTENTION_FAST && f->k_bits == 2 && f->v_bits == 2 &&
         f->head_dim == FD && f->group == 32 && R >= 32 && (R & (R - 1)) == 0;
}

/* Partials of the fast splits (fs tokens each, the last one of a row shorter): slots 0 .. nf-1 of part_o [rows][HQ][nslots][128] and part_ml
 * [rows][HQ][nslots][2] (unnormalized o, max m and sum l in base 2).  dd: the row descriptor
 * (R_SEQ and R_BEG columns).  Slots at or beyond a row's own Lf / KIVI_FAST_SPLIT get l = 0. */
void kivi_gpu_fast_decode(const kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int col_seq,
                          int col_beg, int fs, int nf, int nslots, const float *q, float qmul, float *part_o,
                          float *part_ml) {
  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt, *vexp = c->vexp;
  const int H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, MB = c->max_blocks, R = c->cfg.residual;
  const int gsz = HQ / H, Rm = R - 1;
  int lr = 0;
  while ((1 << lr) < R) ++lr;
  const size_t sub = c->lay.sub_bytes, ksz_off = c->lay.ksz_off, vcode_off = c->lay.vcode_off,
               vsz_off = c->lay.vsz_off;
  const int nblk = rows * HQ * nf, dev = c->ctx->device;
  if (nblk <= 0) return;
#pragma omp target teams ompx_bare num_teams(nblk) thread_limit(FNT) device(dev) \
    is_device_ptr(pool, bt, vexp, q, dd, part_o, part_ml) \
    firstprivate(layer, rows, HQ, col_seq, col_beg, fs, nf, nslots, qmul, H, NL, MB, gsz, Rm, lr, sub, ksz_off, \
                 vcode_off, vsz_off)
  {
    static float s_p[KIVI_FAST_SPLIT];
    static fk_v4u s_B[FNW][FKU][16];
    static float s_red[2][FNW];
    static float s_o[FNW][FD];
    static float s_z[FNW][4];
#pragma omp allocate(s_p, s_B, s_red, s_o, s_z) allocator(omp_pteam_mem_alloc)
    const int tid = ompx_thread_id_x(), lane = tid & 31, wid = tid >> 5;
    const int blk = ompx_block_id_x();
    const int sf = blk % nf, hq = blk / nf % HQ, r = blk / (nf * HQ), kvh = hq / gsz;
    const int64_t s = dd[(int64_t)col_seq * rows + r];
    const int Lf = (int)dd[(int64_t)col_beg * rows + r];
    float *po = part_o + (((size_t)r * HQ + hq) * nslots + sf) * FD;
    float *pml = part_ml + (((size_t)r * HQ + hq) * nslots + sf) * 2;
    if (sf * fs >= Lf) { /* block-uniform: this row has fewer fast splits */
      if (tid == 0) {
        pml[0] = -INFINITY;
        pml[1] = 0.0f;
      }
    } else {
      const int t0 = sf * fs;
      const int n = Lf - t0 < fs ? Lf - t0 : fs; /* a multiple of 32, at most KIVI_FAST_SPLIT */
      const int32_t *btrow = bt + ((size_t)s * NL + layer) * MB;
      const float *qb = q + ((size_t)r * HQ + hq) * FD;
      /* lane l16 stages the pairs j = jb..jb+3 of word kw: channels 16kw+j (lo) and 16kw+j+8 (hi) */
      const int l16 = lane & 15, kw = l16 >> 1, jb = 4 * (l16 & 1);
      float qa[8], pf[4];
      #pragma unroll
      for (int i = 0; i < 4; ++i) {
        qa[2 * i] = qb[16 * kw + jb + i] * qmul;
        qa[2 * i + 1] = qb[16 * kw + jb + i + 8] * qmul;
        const int j = jb + i, pos = j < 5 ? j : j - 5;
        pf[i] = fk_p2(24 - 2 * pos);
      }
      /* ---- K phase: warp wid owns groups wid*FKU + 16 i; lane = token of the group */
      float mloc = -INFINITY;
      const int ng = n / 32;
      for (int g0 = wid * FKU; g0 < ng; g0 += FNW * FKU) {
        fk_v4u ca[FKU], cb[FKU];
        fk_v2u zl[FKU], zh[FKU];
        #pragma unroll
        for (int u = 0; u < FKU; ++u) { /* groups past the split's end load group 0 and are dropped */
          const int tg = t0 + (g0 + u < ng ? g0 + u : 0) * 32, tr = tg & Rm;
          const unsigned char *base = pool + ((size_t)btrow[tg >> lr] * H + kvh) * sub;
          const uint32_t *row = (const uint32_t *)base + (size_t)(tr + lane) * 8;
          ca[u] = ld16(row);
          cb[u] = ld16(row + 4);
          const uint32_t *sz = (const uint32_t *)(base + ksz_off) + (size_t)(tr >> 5) * 128 + (lane >= 16 ? 64 : 0) +
                               8 * kw + jb / 2;
          zl[u] = ld8(sz);
          zh[u] = ld8(sz + 4);
        }
        float bias[FKU], skf[FKU];
        #pragma unroll
        for (int u = 0; u < FKU; ++u) {
          const uint32_t pr[4] = {prmt(zl[u].x, zh[u].x, 0x5410u), prmt(zl[u].x, zh[u].x, 0x7632u),
                                  prmt(zl[u].y, zh[u].y, 0x5410u), prmt(zl[u].y, zh[u].y, 0x7632u)};
          float lo[4], hi[4], mx = 0.0f;
          #pragma unroll
          for (int i = 0; i < 4; ++i) {
            h2f(pr[i], &lo[i], &hi[i]);
            lo[i] *= qa[2 * i];
            hi[i] *= qa[2 * i + 1];
            mx = fmaxf(mx, fmaxf(fabsf(lo[i]), fabsf(hi[i])));
          }
          mx = wmax(lane < 16 ? mx : 0.0f);
          const int SK = 9 + fk_ceil_exp(mx > 0.0f ? mx : 1.0f); /* |B| <= 2^15 */
          skf[u] = fk_p2(SK);
          if (lane < 16) {
            const float f = fk_p2(-SK);
            fk_v4u b = {f2h2(lo[0] * pf[0] * f, hi[0] * pf[0] * f), f2h2(lo[1] * pf[1] * f, hi[1] * pf[1] * f),
                        f2h2(lo[2] * pf[2] * f, hi[2] * pf[2] * f), f2h2(lo[3] * pf[3] * f, hi[3] * pf[3] * f)};
            s_B[wid][u][lane] = b;
          }
          const float bp = ((lo[0] + hi[0]) + (lo[1] + hi[1])) + ((lo[2] + hi[2]) + (lo[3] + hi[3]));
          bias[u] = wsum(lane < 16 ? 0.0f : bp); /* q . zero of the group */
        }
        fk_wsync();
        #pragma unroll
        for (int u = 0; u < FKU; ++u) {
          const fk_v4u *Bv = s_B[wid][u];
          const uint32_t wd[8] = {ca[u].x, ca[u].y, ca[u].z, ca[u].w, cb[u].x, cb[u].y, cb[u].z, cb[u].w};
          uint32_t part16[16];
          #pragma unroll
          for (int w = 0; w < 8; ++w) {
            const uint32_t x = wd[w], h = x >> 10;
            const fk_v4u b0 = Bv[2 * w], b1 = Bv[2 * w + 1];
            uint32_t a = hmul2(x & 0x00030003u, b0.x);
            a = hfma2(x & 0x000c000cu, b0.y, a);
            a = hfma2(x & 0x00300030u, b0.z, a);
            a = hfma2(x & 0x00c000c0u, b0.w, a);
            uint32_t a2 = hmul2(x & 0x03000300u, b1.x);
            a2 = hfma2(h & 0x00030003u, b1.y, a2);
            a2 = hfma2(h & 0x000c000cu, b1.z, a2);
            a2 = hfma2(h & 0x00300030u, b1.w, a2);
            part16[w] = a;
            part16[8 + w] = a2;
          }
          float f[32];
          #pragma unroll
          for (int w = 0; w < 16; ++w) h2f(part16[w], &f[2 * w], &f[2 * w + 1]);
          #pragma unroll
          for (int k = 16; k > 1; k >>= 1)
            #pragma unroll
            for (int i = 0; i < k; ++i) f[i] = f[2 * i] + f[2 * i + 1];
          const float lg = fmaf(f[0] + f[1], skf[u], bias[u]);
          if (g0 + u < ng) {
            s_p[(g0 + u) * 32 + lane] = lg;
            mloc = fmaxf(mloc, lg);
          }
        }
        fk_wsync();
      }
      mloc = wmax(mloc);
      if (lane == 0) s_red[0][wid] = mloc;
      fk_sync();
      const float m = fmaxf(fmaxf(s_red[0][0], s_red[0][1]), fmaxf(s_red[0][2], s_red[0][3]));
      /* ---- softmax (base 2); p packed as f16x2 {lo: p * 2^(24 - SV), hi: p * 2^-ZV} */
      const int SV = 9 + vexp[((size_t)layer * H + kvh) * 2], ZV = vexp[((size_t)layer * H + kvh) * 2 + 1];
      const float fv = fk_p2(24 - SV), fz = fk_p2(-ZV);
      float lsum = 0.0f;
      for (int t = tid; t < n; t += FNT) {
        const float p = fk_ex2(s_p[t] - m);
        lsum += p;
        s_p[t] = fk_f(f2h2(p * fv, p * fz));
      }
      lsum = wsum(lsum);
      if (lane == 0) s_red[1][wid] = lsum;
      fk_sync();
      const float lt = (s_red[1][0] + s_red[1][1]) + (s_red[1][2] + s_red[1][3]);
      /* ---- V phase: warp wid owns tokens [wid*nv, (wid+1)*nv); lane = (channel group vg =
       * lane & 3: words 2vg, 2vg+1; token offset ts = lane >> 2: 8 tokens per step) */
      /* nv: a whole number of 8-token x FVR runs per warp; tokens past n get p = 0 */
      const int vg = lane & 3, ts = lane >> 2, nv = (n + FNW * 8 * FVR - 1) / (FNW * 8 * FVR) * 8 * FVR, tb = wid * nv;
      float of[32], zf = 0.0f;
      #pragma unroll
      for (int i = 0; i < 32; ++i) of[i] = 0.0f;
      for (int i0 = 0; i0 < nv; i0 += 8 * FVR) {
        uint32_t acc[16], zacc = 0;
        #pragma unroll
        for (int i = 0; i < 16; ++i) acc[i] = 0;
        #pragma unroll
        for (int i1 = 0; i1 < FVR; i1 += FVU) {
          fk_v2u cw[FVU];
          uint32_t sz[FVU], pp[FVU];
          #pragma unroll
          for (int u = 0; u < FVU; ++u) {
            const int tl = tb + i0 + (i1 + u) * 8 + ts, tt = t0 + (tl < n ? tl : 0), tr = tt & Rm;
            const unsigned char *base = pool + ((size_t)btrow[tt >> lr] * H + kvh) * sub;
            cw[u] = ld8((const uint32_t *)(base + vcode_off) + (size_t)tr * 8 + 2 * vg);
            sz[u] = ld4((const uint32_t *)(base + vsz_off) + (size_t)tr * 4 + vg);
          }
          #pragma unroll
          for (int u = 0; u < FVU; ++u) {
            const int tl = tb + i0 + (i1 + u) * 8 + ts;
            pp[u] = tl < n ? fk_u(s_p[tl]) : 0u;
          }
          #pragma unroll
          for (int u = 0; u < FVU; ++u) {
            const uint32_t bp = hmul2(pp[u], sz[u]);
            const uint32_t B = prmt(bp, bp, 0x1010u);
            zacc = hadd2(zacc, bp);
            #pragma unroll
            for (int hw = 0; hw < 2; ++hw) {
              const uint32_t x = hw ? cw[u].y : cw[u].x, h = x >> 10;
              uint32_t *a = acc + 8 * hw;
              a[0] = hfma2(x & 0x00030003u, B, a[0]);
              a[1] = hfma2(x & 0x000c000cu, B, a[1]);
              a[2] = hfma2(x & 0x00300030u, B, a[2]);
              a[3] = hfma2(x & 0x00c000c0u, B, a[3]);
              a[4] = hfma2(x & 0x03000300u, B, a[4]);
              a[5] = hfma2(h & 0x00030003u, B, a[5]);
              a[6] = hfma2(h & 0x000c000cu, B, a[6]);
              a[7] = hfma2(h & 0x00300030u, B, a[7]);
            }
          }
        }
        #pragma unroll
        for (int hw = 0; hw < 2; ++hw)
          #pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float sc = fk_p2(-2 * (j < 5 ? j : j - 5));
            float lo, hi;
            h2f(acc[8 * hw + j], &lo, &hi);
            of[16 * hw + j] = fmaf(lo, sc, of[16 * hw + j]);
            of[16 * hw + j + 8] = fmaf(hi, sc, of[16 * hw + j + 8]);
          }
        {
          float lo, hi;
          h2f(zacc, &lo, &hi);
          zf += hi;
        }
      }
      #pragma unroll
      for (int i = 0; i < 32; ++i)
        #pragma unroll
        for (int o = 4; o < 32; o <<= 1) of[i] += shfx(of[i], o);
      #pragma unroll
      for (int o = 4; o < 32; o <<= 1) zf += shfx(zf, o);
      if (ts == 0) {
        #pragma unroll
        for (int i = 0; i < 32; ++i) s_o[wid][32 * vg + i] = of[i];
        s_z[wid][vg] = zf;
      }
      fk_sync();
      {
        const int d = tid, g = d >> 5;
        po[d] = ((s_o[0][d] + s_o[1][d]) + (s_o[2][d] + s_o[3][d])) * fk_p2(SV) +
                ((s_z[0][g] + s_z[1][g]) + (s_z[2][g] + s_z[3][g])) * fk_p2(ZV);
        if (d == 0) {
          pml[0] = m;
          pml[1] = lt;
        }
      }
    }
  }
}

#else /* no offload: never eligible */
int kivi_gpu_fast_eligible(const kivi_cache *c) {
  (void)c;
  return 0;
}
void kivi_gpu_fast_decode(const kivi_cache *c, int layer, int rows, int HQ, const int64_t *dd, int col_seq,
                          int col_beg, int fs, int nf, int nslots, const float *q, float qmul, float *part_o,
                          float *part_ml) {
  (void)c; (void)layer; (void)rows; (void)HQ; (void)dd; (void)col_seq; (void)col_beg; (void)fs; (void)nf; (void)nslots;
  (void)q; (void)qmul; (void)part_o; (void)part_ml;
}
#endif
