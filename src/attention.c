/* Fused dequant-attention over the packed cache (flash-decoding), decode and extend.
 *
 * Both calls become "rows": one query token of one sequence that sees Lc cached tokens plus e
 * new fp32 tokens (decode: e = 0; extend: new token j sees e = j + 1).  A work item is
 * (row, kv-head, chunk of that kv-head's query heads, split of the tokens); it reads each K/V
 * token of its split once for all query heads of the chunk (GQA), keeps the split's logits in
 * team-shared memory, takes one softmax over them, and writes a partial (o, m, l) per query
 * head.  The last item of each (row, kv-head, head chunk) to finish (an atomic counter per
 * group, reset by that item) combines the group's splits in the same launch: one launch per
 * step, two with the GPU fast path (attention_gpu.c), which runs first and fills the first
 * partial slots.
 *
 * Manifest (device memory):
 *   pool, bt, kres, vres   the cache (cache.c)
 *   q      [rows][HQ][D] f32 queries          kn, vn [new tokens][H][D] f32 (extend only)
 *   part_o [rows][HQ][nslots][D] f32          part_ml [rows][HQ][nslots][2] f32 (m, l; base 2)
 *   out    [rows][HQ][D] f32 or f16           lse [rows][HQ] f32 (optional)
 *   dd     [5][rows] int64: seq, Lc, e, first new token of the row's sequence, first token of
 *          the portable kernel (after the fast path's share)
 *   cnt    [rows][H][head chunks] u32 arrival counters, zero between calls */
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

enum { R_SEQ, R_LC, R_E, R_NEW, R_BEG, R_NCOLS }; /* R_BEG: first token of the portable kernel */

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

#pragma omp declare target
/* Element i of the output ([rows][HQ][D]): out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s
 * over the nslots partials of its (row, head); empty splits (l = 0) leave o unwritten. */
static inline void combine_item(int64_t i, int D, int64_t nslots, const float *part_o, const float *part_ml,
                                void *out, int out_f16, float *lse) {
  const int64_t rh = i / D;
  const int d = (int)(i % D);
  const float *ml = part_ml + (size_t)rh * nslots * 2;
  float M = -INFINITY;
  for (int64_t s = 0; s < nslots; ++s) M = fmaxf(M, ml[2 * s]);
  float num = 0.0f, den = 0.0f;
  for (int64_t s = 0; s < nslots; ++s)
    if (ml[2 * s + 1] > 0.0f) {
      const float w = exp2f(ml[2 * s] - M);
      num += w * part_o[((size_t)rh * nslots + s) * D + d];
      den += w * ml[2 * s + 1];
    }
  const float o = num / den;
  if (out_f16) ((uint16_t *)out)[i] = kivi_f32_to_f16(o);
  else ((float *)out)[i] = o;
  if (lse && d == 0) lse[rh] = (M + log2f(den)) * 0.6931471805599453f;
}
#pragma omp end declare target

/* Heads per item and tokens per split: the split's logits of all the item's heads must fit in
 * KIVI_ATT_PCAP, and there must be enough items to fill the device. */
typedef struct att_plan {
  int hc, nqc;
  int64_t nsplit, split_len, nitems; /* the portable kernel's splits of [R_BEG, T) */
  int nf, fs;                        /* GPU fast-path splits before them (0: none), their length */
  int64_t nslots;                    /* partials per (row, head): nf + nsplit */
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

/* Shared by decode and extend once the rows are described; q/k_new/v_new/out/lse are device
 * pointers or NULL. */
static kivi_status run_rows(kivi_cache *c, int layer, int rows, const int64_t *hd, const att_plan *pl, int HQ,
                            const float *q, const float *kn, const float *vn, float scale, void *out, int out_f16,
                            float *lse, unsigned char *scratch) {
  const kivi_context *ctx = c->ctx;
  const kivi_layout lay = c->lay;
  const int H = lay.H, D = lay.D, R = lay.R, G = lay.G, NL = c->cfg.n_layers, MB = c->max_blocks;
  const int gsz = HQ / H, hc = pl->hc, nqc = pl->nqc, TG = KIVI_ATT_TILE / G;
  const int64_t nsplit = pl->nsplit, split_len = pl->split_len, nitems = pl->nitems;
  const int64_t nslots = pl->nslots, slot0 = pl->nf;

  /* per-group arrival counters, zero between calls (the last item resets its own) */
  const int64_t ngroups = (int64_t)rows * H * nqc;
  if ((size_t)ngroups * 4 > c->cnt.bytes) {
    if (kivi_scratch_reserve(ctx, &c->cnt, (size_t)ngroups * 4)) return KIVI_ERR_NOMEM;
    unsigned *zeros = calloc((size_t)ngroups, 4);
    const int err = !zeros || kivi_dev_put(ctx, c->cnt.p, zeros, (size_t)ngroups * 4);
    free(zeros);
    if (err) {
      kivi_scratch_free(ctx, &c->cnt);
      return KIVI_ERR_DEVICE;
    }
  }
  unsigned *cnt = c->cnt.p;

  /* scratch: dd | part_o | part_ml */
  int64_t *dd = (int64_t *)scratch;
  float *part_o = (float *)(scratch + pad16((size_t)R_NCOLS * rows * 8));
  float *part_ml = part_o + (size_t)rows * HQ * nslots * D;
  if (kivi_dev_put(ctx, dd, hd, (size_t)R_NCOLS * rows * 8)) return KIVI_ERR_DEVICE;
  const float qmul = scale * 1.4426950408889634f; /* base-2 softmax */
  if (pl->nf > 0)
    kivi_gpu_fast_decode(c, layer, rows, HQ, dd, R_SEQ, R_BEG, pl->fs, pl->nf, (int)nslots, q, qmul, part_o, part_ml);

  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const size_t sub = lay.sub_bytes, ksz_off = lay.ksz_off, vcode_off = lay.vcode_off, vsz_off = lay.vsz_off;
  const int kb = lay.kb, vb = lay.vb, kw = lay.kw, vw = lay.vw;
  const int dev = ctx->device, on_gpu = ctx->on_gpu;
  const int nteams = on_gpu ? (int)(nitems < 65536 ? nitems : 65536) : omp_get_max_threads();
  const int nthreads = on_gpu ? KIVI_ATT_NT : 1;

#pragma omp target teams device(dev) num_teams(nteams) thread_limit(nthreads) \
    is_device_ptr(pool, bt, kres, vres, q, kn, vn, dd, part_o, part_ml, cnt, out, lse)
  {
    float s_q[KIVI_ATT_QCAP], s_qs[KIVI_ATT_QSCAP], s_bias[KIVI_ATT_HC * (KIVI_ATT_TILE / KIVI_MIN_GROUP)];
    float s_p[KIVI_ATT_PCAP], s_bp[KIVI_ATT_HC * (KIVI_ATT_TILE / KIVI_MIN_GROUP) * 32], s_red[KIVI_ATT_NT];
    int s_last[1];
    KIVI_TEAM_SHARED(s_q, s_qs, s_bias, s_p, s_bp, s_red, s_last)
    float *const s_o = s_qs; /* the V phase's lane partials reuse the K staging area */
#pragma omp parallel
    {
      const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
      /* the host fallback may run fewer teams and threads than asked: loop, never assume */
      for (int64_t item = omp_get_team_num(); item < nitems; item += omp_get_num_teams()) {
        const int64_t sp = item % nsplit;
        const int qc = (int)(item / nsplit % nqc);
        const int kvh = (int)(item / (nsplit * nqc) % H);
        const int64_t r = item / (nsplit * nqc * H);
        const int64_t s = dd[R_SEQ * (int64_t)rows + r], Lc = dd[R_LC * (int64_t)rows + r];
        const int64_t T = Lc + dd[R_E * (int64_t)rows + r];
        const int64_t Lk = Lc - Lc % R, Lv = Lc > R ? Lc - R : 0;
        const int64_t t0 = dd[R_BEG * (int64_t)rows + r] + sp * split_len;
        const int64_t t1 = t0 + split_len < T ? t0 + split_len : T;
        const int n = t1 > t0 ? (int)(t1 - t0) : 0, spl = (int)split_len;
        const int h0 = kvh * gsz + qc * hc;
        const int nh = gsz - qc * hc < hc ? gsz - qc * hc : hc;
        const int32_t *btrow = bt + ((size_t)s * NL + layer) * MB;
        const size_t ring = (((size_t)s * NL + layer) * H + kvh) * (size_t)R * D;
        const size_t newrow = (size_t)dd[R_NEW * (int64_t)rows + r] * H + kvh;
        const float *knew = kn ? kn + newrow * D : NULL, *vnew = vn ? vn + newrow * D : NULL;

        for (int i = tid; i < nh * D; i += nth) s_q[i] = q[((size_t)r * HQ + h0) * D + i] * qmul;
#pragma omp barrier
        /* ---- logits of the split, tile by tile; a tile's quantized key groups are staged
         * as q * scale (per head, group, channel) and bias = q . zero */
        for (int tt = 0; tt < n; tt += KIVI_ATT_TILE) {
          const int nt = n - tt < KIVI_ATT_TILE ? n - tt : KIVI_ATT_TILE;
          const int64_t tq = Lk - (t0 + tt); /* quantized keys left from the tile start */
          const int nq = kb < 16 ? (tq <= 0 ? 0 : tq < nt ? (int)tq : nt) : 0;
          const int ngq = nq / G;
          for (int i = tid; i < nh * ngq * D; i += nth) {
            const int d = i % D, gi = i / D % ngq, hh = i / (D * ngq);
            const int t = (int)(t0 + tt) + gi * G; /* positions fit in int: 32-bit division */
            const unsigned char *sb = pool + ((size_t)btrow[t / R] * H + kvh) * sub;
            const uint16_t *sc = (const uint16_t *)(sb + ksz_off) + (size_t)(t % R / G) * 2 * D;
            s_qs[(hh * TG + gi) * D + d] = s_q[hh * D + d] * kivi_f16_to_f32(sc[d]);
          }
          /* bias = q . zero: 32 partial sums per (head, group), then their sum */
          for (int i = tid; i < nh * ngq * 32; i += nth) {
            const int part = i % 32, gi = i / 32 % ngq, hh = i / (32 * ngq);
            const int t = (int)(t0 + tt) + gi * G;
            const unsigned char *sb = pool + ((size_t)btrow[t / R] * H + kvh) * sub;
            const uint16_t *zr = (const uint16_t *)(sb + ksz_off) + (size_t)(t % R / G) * 2 * D + D;
            float b = 0.0f;
            for (int d = part; d < D; d += 32) b += s_q[hh * D + d] * kivi_f16_to_f32(zr[d]);
            s_bp[i] = b;
          }
#pragma omp barrier
          for (int i = tid; i < nh * ngq; i += nth) {
            float b = 0.0f;
            for (int k = 0; k < 32; ++k) b += s_bp[i * 32 + k];
            s_bias[(i / ngq) * TG + i % ngq] = b;
          }
#pragma omp barrier
          /* one thread per token: consecutive threads read consecutive code rows */
          for (int j = tid; j < nt; j += nth) {
            const int t = (int)(t0 + tt) + j;
            float *out_p = s_p + tt + j;
            if (t < Lk) {
              const unsigned char *sb = pool + ((size_t)btrow[t / R] * H + kvh) * sub;
              const uint32_t *row = (const uint32_t *)sb + (size_t)(t % R) * kw;
              const float *qs = s_qs + (j / G) * D;
              const float *bias = s_bias + j / G;
              switch (kb) {
              case 2: kivi_kdot_codes(row, D, 2, qs, TG * D, bias, TG, nh, out_p, spl); break;
              case 4: kivi_kdot_codes(row, D, 4, qs, TG * D, bias, TG, nh, out_p, spl); break;
              case 8: kivi_kdot_codes(row, D, 8, qs, TG * D, bias, TG, nh, out_p, spl); break;
              default: kivi_kdot_f16((const uint16_t *)row, D, s_q, nh, out_p, spl); break;
              }
            } else if (t < Lc) {
              kivi_kdot_f16(kres + ring + (size_t)(t % R) * D, D, s_q, nh, out_p, spl);
            } else {
              kivi_kdot_f32(knew + (size_t)(t - Lc) * H * D, D, s_q, nh, out_p, spl);
            }
          }
#pragma omp barrier
        }
        /* ---- softmax of each head over the split (base 2) */
        float mh[KIVI_ATT_HC], lh[KIVI_ATT_HC];
        for (int hh = 0; hh < nh; ++hh) {
          float *p = s_p + hh * spl;
          float m = -INFINITY;
          for (int j = tid; j < n; j += nth) m = fmaxf(m, p[j]);
          m = kivi_team_reduce(m, 1, s_red, tid, nth);
          float l = 0.0f;
          for (int j = tid; j < n; j += nth) {
            const float e = exp2f(p[j] - m);
            p[j] = e;
            l += e;
          }
          l = kivi_team_reduce(l, 0, s_red, tid, nth); /* its barriers also publish p */
          mh[hh] = n > 0 ? m : -INFINITY;
          lh[hh] = l;
        }
        /* ---- weighted values: thread = (token lane, code word); lanes reduced in s_o */
        const int vcpw = vb == 16 ? 2 : 32 / vb;
        const int wstep = nth < vw ? nth : vw, lanes = nth < vw ? 1 : nth / vw;
        const int tl = nth < vw ? 0 : tid / vw, w0 = nth < vw ? tid : tid % vw;
        const int jq = (int)(Lv - t0 <= 0 ? 0 : Lv - t0 < n ? Lv - t0 : n);
        const int jr = (int)(Lc - t0 <= 0 ? 0 : Lc - t0 < n ? Lc - t0 : n);
#if !defined(__NVPTX__)
        if (nth == 1) { /* host threads: one row of values at a time for all heads */
          float o_host[KIVI_ATT_HC * 256];
          kivi_vsum_host(pool, btrow, H, kvh, sub, vcode_off, vsz_off, R, D, G, vw, vb, vres, ring, vnew, Lc, t0, n,
                         jq, jr, s_p, spl, nh, o_host);
          for (int hh = 0; hh < nh; ++hh)
            for (int d = 0; d < D; ++d)
              part_o[(((size_t)r * HQ + h0 + hh) * nslots + slot0 + sp) * D + d] = o_host[hh * D + d];
        } else
#endif
        for (int hh = 0; hh < nh; ++hh) {
          const float *p = s_p + hh * spl;
          if (tl < lanes)
            for (int wi = w0; wi < vw; wi += wstep) {
              float acc[16], z = 0.0f;
              for (int k = 0; k < vcpw; ++k) acc[k] = 0.0f;
              switch (vb) {
              case 2: kivi_vacc_codes(pool, btrow, H, kvh, sub, vcode_off, vsz_off, R, D, G, vw, 2, wi, t0, tl, jq, lanes, p, acc, &z); break;
              case 4: kivi_vacc_codes(pool, btrow, H, kvh, sub, vcode_off, vsz_off, R, D, G, vw, 4, wi, t0, tl, jq, lanes, p, acc, &z); break;
              case 8: kivi_vacc_codes(pool, btrow, H, kvh, sub, vcode_off, vsz_off, R, D, G, vw, 8, wi, t0, tl, jq, lanes, p, acc, &z); break;
              default: kivi_vacc_codes(pool, btrow, H, kvh, sub, vcode_off, vsz_off, R, D, G, vw, 16, wi, t0, tl, jq, lanes, p, acc, &z); break;
              }
              /* fp16 window and new tokens: the lane's tokens from jq on */
              const int ja = jq + ((tl - jq) % lanes + lanes) % lanes;
              int j = ja;
              if (j < jr) { /* the fp16 window: ring position advanced without dividing */
                int tr = (int)((t0 + j) % R);
                for (; j < jr; j += lanes) {
                  const uint16_t *vr = vres + ring + (size_t)tr * D + wi * vcpw;
                  for (int k = 0; k < vcpw; ++k) acc[k] += p[j] * kivi_f16_to_f32(vr[k]);
                  for (tr += lanes; tr >= R; tr -= R) {}
                }
              }
              for (; j < n; j += lanes) {
                const float *vr = vnew + (size_t)(t0 + j - Lc) * H * D + wi * vcpw;
                for (int k = 0; k < vcpw; ++k) acc[k] += p[j] * vr[k];
              }
              for (int k = 0; k < vcpw; ++k) s_o[tl * D + wi * vcpw + k] = acc[k] + z;
            }
#pragma omp barrier
          for (int d = tid; d < D; d += nth) {
            float o = 0.0f;
            for (int l = 0; l < lanes; ++l) o += s_o[l * D + d];
            part_o[(((size_t)r * HQ + h0 + hh) * nslots + slot0 + sp) * D + d] = o;
          }
#pragma omp barrier
        }
        if (tid == 0)
          for (int hh = 0; hh < nh; ++hh) {
            const size_t o = (((size_t)r * HQ + h0 + hh) * nslots + slot0 + sp) * 2;
            part_ml[o] = mh[hh];
            part_ml[o + 1] = lh[hh];
          }
        /* ---- arrival: the group's last item combines all of its splits */
#pragma omp flush
#pragma omp barrier
        const int64_t grp = (r * H + kvh) * nqc + qc;
        if (tid == 0) {
          unsigned seen;
#pragma omp atomic capture seq_cst
          seen = cnt[grp]++;
          s_last[0] = seen == (unsigned)(nsplit - 1);
        }
#pragma omp barrier
        if (s_last[0]) {
#pragma omp flush
          for (int i = tid; i < nh * D; i += nth)
            combine_item(((r * HQ + h0) * D) + i, D, nslots, part_o, part_ml, out, out_f16, lse);
          if (tid == 0) cnt[grp] = 0;
        }
#pragma omp barrier
      }
    }
  }

  c->last_kernels = (nitems > 0 ? KIVI_KERNEL_PORTABLE : 0u) | (pl->nf > 0 ? KIVI_KERNEL_GPU_F16X2 : 0u);
  return KIVI_OK;
}

/* Fills R_BEG (tokens the GPU fast path takes) and plans the portable kernel for the rest.
 * The fast path covers floor(max(0, Lc - R) / KIVI_FAST_GRAIN) grains of a row, where its keys
 * and values are both quantized. */
static att_plan plan_call(const kivi_cache *c, int rows, int64_t *hd, int HQ) {
  const int fast = kivi_gpu_fast_eligible(c), R = c->cfg.residual;
  int64_t maxbeg = 0, maxT = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t Lc = hd[R_LC * (int64_t)rows + r], T = Lc + hd[R_E * (int64_t)rows + r];
    const int64_t beg = fast && Lc > R ? (Lc - R) / KIVI_FAST_GRAIN * KIVI_FAST_GRAIN : 0;
    hd[R_BEG * (int64_t)rows + r] = beg;
    if (beg > maxbeg) maxbeg = beg;
    if (T - beg > maxT) maxT = T - beg;
  }
  /* shorter fast splits when few (row, head) pairs would leave SMs idle (132 on an H200) */
  int fs = KIVI_FAST_SPLIT;
  while (fs > 512 && (int64_t)rows * HQ * ((maxbeg + fs - 1) / fs) < 2 * 132) fs /= 2;
  att_plan p = plan_rows(c, rows, maxT, HQ, c->ctx->on_gpu);
  p.fs = fs;
  p.nf = (int)((maxbeg + fs - 1) / fs);
  p.nslots = p.nf + p.nsplit;
  return p;
}

/* Common argument checks of decode and extend. */
static kivi_status check_common(const kivi_cache *c, int layer, int n_seqs, const int *seq_ids,
                                int n_q_heads, const void *q, const void *out, float scale, kivi_mem mem) {
  if (!c || layer < 0 || layer >= c->cfg.n_layers || !q || !out) return KIVI_ERR_ARG;
  if (mem != KIVI_MEM_HOST && mem != KIVI_MEM_DEVICE) return KIVI_ERR_ARG;
  if (n_q_heads < 1 || n_q_heads % c->cfg.n_kv_heads) return KIVI_ERR_ARG;
  if (!isfinite(scale) || scale == 0.0f) return KIVI_ERR_ARG;
  return kivi_check_seq_ids(c, n_seqs, seq_ids);
}

/* Device scratch for one call: descriptors, partials, and (host memory) staged inputs/outputs. */
static size_t rows_scratch(const kivi_cache *c, int rows, int HQ, const att_plan *p) {
  return pad16((size_t)R_NCOLS * rows * 8) + (size_t)rows * HQ * p->nslots * (c->cfg.head_dim + 2) * 4 + 16;
}

kivi_status kivi_attention_decode(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, int n_q_heads,
                                  const float *q, float scale, void *out, kivi_dtype out_dtype, kivi_mem mem) {
  kivi_status st = check_common(c, layer, n_seqs, seq_ids, n_q_heads, q, out, scale, mem);
  if (st) return st;
  if (out_dtype != KIVI_F32 && out_dtype != KIVI_F16) return KIVI_ERR_ARG;
  int64_t *hd = malloc((size_t)R_NCOLS * n_seqs * 8);
  if (!hd) return KIVI_ERR_NOMEM;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L = kivi_len(c, seq_ids[i], layer);
    if (L < 1) { free(hd); return KIVI_ERR_ARG; }
    hd[R_SEQ * n_seqs + i] = seq_ids[i];
    hd[R_LC * n_seqs + i] = L;
    hd[R_E * n_seqs + i] = 0;
    hd[R_NEW * n_seqs + i] = 0;
  }
  const kivi_context *ctx = c->ctx;
  const size_t D = (size_t)c->cfg.head_dim, nq = (size_t)n_seqs * n_q_heads * D;
  const size_t osz = out_dtype == KIVI_F16 ? 2 : 4;
  const size_t host_io = mem == KIVI_MEM_HOST ? pad16(nq * 4) + pad16(nq * osz) : 0;
  const att_plan pl = plan_call(c, n_seqs, hd, n_q_heads);
  if (kivi_scratch_reserve(ctx, &c->work, host_io + rows_scratch(c, n_seqs, n_q_heads, &pl))) {
    free(hd);
    return KIVI_ERR_NOMEM;
  }
  unsigned char *w = c->work.p;
  const float *dq = q;
  void *dout = out;
  if (mem == KIVI_MEM_HOST) {
    if (kivi_dev_put(ctx, w, q, nq * 4)) { free(hd); return KIVI_ERR_DEVICE; }
    dq = (const float *)w;
    dout = w + pad16(nq * 4);
  }
  st = run_rows(c, layer, n_seqs, hd, &pl, n_q_heads, dq, NULL, NULL, scale, dout, out_dtype == KIVI_F16,
                NULL, w + host_io);
  free(hd);
  if (!st && mem == KIVI_MEM_HOST && kivi_dev_get(ctx, out, dout, nq * osz)) st = KIVI_ERR_DEVICE;
  return st;
}

kivi_status kivi_attention_extend(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, const int *q_lens,
                                  int n_q_heads, const float *q, const float *k_new, const float *v_new,
                                  float scale, float *out, float *lse, kivi_mem mem) {
  kivi_status st = check_common(c, layer, n_seqs, seq_ids, n_q_heads, q, out, scale, mem);
  if (st) return st;
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
      hd[R_LC * rows + r] = L;
      hd[R_E * rows + r] = j + 1;
      hd[R_NEW * rows + r] = first;
    }
  }
  const kivi_context *ctx = c->ctx;
  const size_t D = (size_t)c->cfg.head_dim, H = (size_t)c->cfg.n_kv_heads;
  const size_t nq = (size_t)rows * n_q_heads * D, nkv = (size_t)rows * H * D, nl = (size_t)rows * n_q_heads;
  const size_t host_io = mem == KIVI_MEM_HOST ? 2 * pad16(nq * 4) + 2 * pad16(nkv * 4) + pad16(nl * 4) : 0;
  const att_plan pl = plan_call(c, (int)rows, hd, n_q_heads);
  if (kivi_scratch_reserve(ctx, &c->work, host_io + rows_scratch(c, (int)rows, n_q_heads, &pl))) {
    free(hd);
    return KIVI_ERR_NOMEM;
  }
  unsigned char *w = c->work.p;
  const float *dq = q, *dk = k_new, *dv = v_new;
  float *dout = out, *dlse = lse;
  if (mem == KIVI_MEM_HOST) {
    unsigned char *p = w;
    dq = (const float *)p;  p += pad16(nq * 4);
    dk = (const float *)p;  p += pad16(nkv * 4);
    dv = (const float *)p;  p += pad16(nkv * 4);
    dout = (float *)p;      p += pad16(nq * 4);
    dlse = lse ? (float *)p : NULL;
    if (kivi_dev_put(ctx, (void *)dq, q, nq * 4) || kivi_dev_put(ctx, (void *)dk, k_new, nkv * 4) ||
        kivi_dev_put(ctx, (void *)dv, v_new, nkv * 4)) {
      free(hd);
      return KIVI_ERR_DEVICE;
    }
  }
  st = run_rows(c, layer, (int)rows, hd, &pl, n_q_heads, dq, dk, dv, scale, dout, 0, dlse, w + host_io);
  free(hd);
  if (!st && mem == KIVI_MEM_HOST &&
      (kivi_dev_get(ctx, out, dout, nq * 4) || (lse && kivi_dev_get(ctx, lse, dlse, nl * 4))))
    st = KIVI_ERR_DEVICE;
  return st;
}
