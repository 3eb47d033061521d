/* Fused dequant-attention over the packed cache (flash-decoding), decode and extend.
 *
 * Both calls become "rows": one query token of one sequence that sees Lc cached tokens plus e
 * new fp32 tokens (decode: e = 0; extend: new token j sees e = j + 1).  A work item is
 * (row, kv-head, chunk of that kv-head's query heads, split of the tokens); it reads each K/V
 * token of its split once for all query heads of the chunk (GQA), runs an online softmax over
 * tiles, and writes a partial (o, m, l) per query head.  A second launch combines the splits.
 *
 * Manifest (device memory):
 *   pool, bt, kres, vres   the cache (cache.c)
 *   wq     [rows][HQ][D] f32 queries         wkn, wvn [new tokens][H][D] f32 (extend only)
 *   part_o [rows][HQ][nsplit][D] f32         part_ml [rows][HQ][nsplit][2] f32 (m, l; base 2)
 *   wout   [rows][HQ][D] f32 or f16          wlse [rows][HQ] f32 (optional)
 *   dd     [4][rows] int64: seq, Lc, e, first new token of the row's sequence */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "kernels_attn.h"

/* Team-shared capacities (floats): query heads x head_dim of one chunk, and logits of a tile. */
#define KIVI_ATT_QMAX 2048
#define KIVI_ATT_PMAX 4096
#define KIVI_ATT_HMAX (KIVI_ATT_QMAX / KIVI_MIN_HEAD_DIM)
#define KIVI_ATT_NT 128          /* threads per team on the GPU */
#define KIVI_ATT_MIN_SPLIT 256   /* tokens: smaller splits cost more in combining than they give */
#define KIVI_ATT_GPU_ITEMS 2048  /* enough teams to fill an H200 (132 SMs) several times */
_Static_assert(KIVI_ATT_QMAX % KIVI_MAX_HEAD_DIM == 0, "a chunk holds at least one head");

enum { R_SEQ, R_LC, R_E, R_NEW, R_NCOLS };

static size_t pad16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Shared by decode and extend once the rows are described; q/k_new/v_new/out/lse are device
 * pointers or NULL. */
static kivi_status run_rows(kivi_cache *c, int layer, int rows, const int64_t *hd, int64_t maxT,
                            int HQ, const float *q, const float *kn, const float *vn, float scale,
                            void *out, int out_f16, float *lse, unsigned char *scratch) {
  const kivi_context *ctx = c->ctx;
  const kivi_layout lay = c->lay;
  const int H = lay.H, D = lay.D, R = lay.R, G = lay.G, NL = c->cfg.n_layers, MB = c->max_blocks;
  const int gsz = HQ / H;
  const int hc = gsz < KIVI_ATT_QMAX / D ? gsz : KIVI_ATT_QMAX / D;
  const int nqc = (gsz + hc - 1) / hc;
  const int tile = KIVI_ATT_PMAX / hc;
  const int64_t base_items = (int64_t)rows * H * nqc;
  int64_t nsplit = 1;
  if (ctx->on_gpu && base_items < KIVI_ATT_GPU_ITEMS) nsplit = (KIVI_ATT_GPU_ITEMS + base_items - 1) / base_items;
  else if (!ctx->on_gpu && base_items < 4 * omp_get_max_threads()) nsplit = 4;
  const int64_t max_split = (maxT + KIVI_ATT_MIN_SPLIT - 1) / KIVI_ATT_MIN_SPLIT;
  if (nsplit > max_split) nsplit = max_split;
  if (nsplit < 1) nsplit = 1;
  const int64_t split_len = (maxT + nsplit - 1) / nsplit;
  const int64_t nitems = base_items * nsplit;

  /* scratch: dd | part_o | part_ml */
  int64_t *dd = (int64_t *)scratch;
  float *part_o = (float *)(scratch + pad16((size_t)R_NCOLS * rows * 8));
  float *part_ml = part_o + (size_t)rows * HQ * nsplit * D;
  if (kivi_dev_put(ctx, dd, hd, (size_t)R_NCOLS * rows * 8)) return KIVI_ERR_DEVICE;

  const unsigned char *pool = c->pool;
  const int32_t *bt = c->bt;
  const uint16_t *kres = c->kres, *vres = c->vres;
  const size_t sub = lay.sub_bytes, ksz_off = lay.ksz_off, vcode_off = lay.vcode_off, vsz_off = lay.vsz_off;
  const int kb = lay.kb, vb = lay.vb, kw = lay.kw, vw = lay.vw;
  const int dev = ctx->device, on_gpu = ctx->on_gpu;
  const float qmul = scale * 1.4426950408889634f; /* base-2 softmax */
  const int nteams = on_gpu ? (int)(nitems < 65536 ? nitems : 65536) : omp_get_max_threads();
  const int nthreads = on_gpu ? KIVI_ATT_NT : 1;

#pragma omp target teams device(dev) num_teams(nteams) thread_limit(nthreads) \
    is_device_ptr(pool, bt, kres, vres, q, kn, vn, dd, part_o, part_ml)
  {
    float s_q[KIVI_ATT_QMAX], s_o[KIVI_ATT_QMAX], s_p[KIVI_ATT_PMAX];
    float s_m[KIVI_ATT_HMAX], s_l[KIVI_ATT_HMAX], s_a[KIVI_ATT_HMAX];
    KIVI_TEAM_SHARED(s_q, s_o, s_p, s_m, s_l, s_a)
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
        const int64_t t0 = sp * split_len, t1 = t0 + split_len < T ? t0 + split_len : T;
        const int h0 = kvh * gsz + qc * hc;
        const int nh = gsz - qc * hc < hc ? gsz - qc * hc : hc;
        const int32_t *btrow = bt + ((size_t)s * NL + layer) * MB;
        const size_t ring = (((size_t)s * NL + layer) * H + kvh) * (size_t)R * D;
        const size_t newrow = (size_t)dd[R_NEW * (int64_t)rows + r] * H + kvh;
        const float *knew = kn ? kn + newrow * D : NULL, *vnew = vn ? vn + newrow * D : NULL;

        for (int i = tid; i < nh * D; i += nth) {
          s_q[i] = q[((size_t)r * HQ + h0) * D + i] * qmul;
          s_o[i] = 0.0f;
        }
        for (int i = tid; i < nh; i += nth) { s_m[i] = -INFINITY; s_l[i] = 0.0f; }
#pragma omp barrier
        for (int64_t tt = t0; tt < t1; tt += tile) {
          const int nt = (int)(t1 - tt < tile ? t1 - tt : tile);
          /* logits: consecutive threads take consecutive tokens (coalesced code rows) */
          for (int i = tid; i < nt * nh; i += nth) {
            const int j = i % nt, hh = i / nt;
            s_p[hh * tile + j] = kivi_attn_k_dot(pool, btrow, kres + ring, knew, tt + j, Lk, Lc, R, G, D, H,
                                                 kvh, sub, ksz_off, kb, kw, s_q + hh * D);
          }
#pragma omp barrier
          /* online softmax: new running max, rescale factor, probabilities */
          for (int hh = tid; hh < nh; hh += nth) {
            float *p = s_p + hh * tile;
            float mt = s_m[hh];
            for (int j = 0; j < nt; ++j) mt = fmaxf(mt, p[j]);
            float sum = 0.0f;
            for (int j = 0; j < nt; ++j) { p[j] = exp2f(p[j] - mt); sum += p[j]; }
            s_a[hh] = exp2f(s_m[hh] - mt);
            s_l[hh] = s_l[hh] * s_a[hh] + sum;
            s_m[hh] = mt;
          }
#pragma omp barrier
          /* weighted values: consecutive threads take consecutive channels of one token */
          for (int i = tid; i < nh * D; i += nth) {
            const int d = i % D, hh = i / D;
            const float *p = s_p + hh * tile;
            float o = s_o[i] * s_a[hh];
            for (int j = 0; j < nt; ++j)
              o += p[j] * kivi_attn_v_val(pool, btrow, vres + ring, vnew, tt + j, Lv, Lc, R, G, D, H, kvh, sub,
                                          vcode_off, vsz_off, vb, vw, d);
            s_o[i] = o;
          }
#pragma omp barrier
        }
        for (int i = tid; i < nh * D; i += nth) {
          const int hh = i / D, d = i % D;
          part_o[(((size_t)r * HQ + h0 + hh) * nsplit + sp) * D + d] = s_o[i];
        }
        for (int hh = tid; hh < nh; hh += nth) {
          const size_t o = (((size_t)r * HQ + h0 + hh) * nsplit + sp) * 2;
          part_ml[o] = s_m[hh];
          part_ml[o + 1] = s_l[hh];
        }
#pragma omp barrier /* s_q, s_o, s_m, s_l are reused by the next item */
      }
    }
  }

  /* combine the splits: out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s */
  const int64_t n_out = (int64_t)rows * HQ * D;
#pragma omp target teams distribute parallel for device(dev) is_device_ptr(part_o, part_ml, out, lse)
  for (int64_t i = 0; i < n_out; ++i) {
    const int64_t rh = i / D;
    const int d = (int)(i % D);
    const float *ml = part_ml + (size_t)rh * nsplit * 2;
    float M = -INFINITY;
    for (int64_t s = 0; s < nsplit; ++s) M = fmaxf(M, ml[2 * s]);
    float num = 0.0f, den = 0.0f;
    for (int64_t s = 0; s < nsplit; ++s) {
      const float a = ml[2 * s + 1] > 0.0f ? exp2f(ml[2 * s] - M) : 0.0f;
      num += a * part_o[((size_t)rh * nsplit + s) * D + d];
      den += a * ml[2 * s + 1];
    }
    const float o = num / den;
    if (out_f16) ((uint16_t *)out)[i] = kivi_f32_to_f16(o);
    else ((float *)out)[i] = o;
    if (lse && d == 0) lse[rh] = (M + log2f(den)) * 0.6931471805599453f;
  }
  return KIVI_OK;
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
static size_t rows_scratch(const kivi_cache *c, int rows, int HQ, int64_t maxT) {
  const int64_t nsplit_max = (maxT + KIVI_ATT_MIN_SPLIT - 1) / KIVI_ATT_MIN_SPLIT + 1;
  return pad16((size_t)R_NCOLS * rows * 8) + (size_t)rows * HQ * nsplit_max * (c->cfg.head_dim + 2) * 4 + 16;
}

kivi_status kivi_attention_decode(kivi_cache *c, int layer, int n_seqs, const int *seq_ids, int n_q_heads,
                                  const float *q, float scale, void *out, kivi_dtype out_dtype, kivi_mem mem) {
  kivi_status st = check_common(c, layer, n_seqs, seq_ids, n_q_heads, q, out, scale, mem);
  if (st) return st;
  if (out_dtype != KIVI_F32 && out_dtype != KIVI_F16) return KIVI_ERR_ARG;
  int64_t *hd = malloc((size_t)R_NCOLS * n_seqs * 8);
  if (!hd) return KIVI_ERR_NOMEM;
  int64_t maxT = 0;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L = kivi_len(c, seq_ids[i], layer);
    if (L < 1) { free(hd); return KIVI_ERR_ARG; }
    hd[R_SEQ * n_seqs + i] = seq_ids[i];
    hd[R_LC * n_seqs + i] = L;
    hd[R_E * n_seqs + i] = 0;
    hd[R_NEW * n_seqs + i] = 0;
    if (L > maxT) maxT = L;
  }
  const kivi_context *ctx = c->ctx;
  const size_t D = (size_t)c->cfg.head_dim, nq = (size_t)n_seqs * n_q_heads * D;
  const size_t osz = out_dtype == KIVI_F16 ? 2 : 4;
  const size_t host_io = mem == KIVI_MEM_HOST ? pad16(nq * 4) + pad16(nq * osz) : 0;
  if (kivi_scratch_reserve(ctx, &c->work, host_io + rows_scratch(c, n_seqs, n_q_heads, maxT))) {
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
  st = run_rows(c, layer, n_seqs, hd, maxT, n_q_heads, dq, NULL, NULL, scale, dout, out_dtype == KIVI_F16,
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
  int64_t maxT = 0, r = 0;
  for (int i = 0; i < n_seqs; ++i) {
    const int64_t L = kivi_len(c, seq_ids[i], layer), first = r;
    for (int j = 0; j < q_lens[i]; ++j, ++r) {
      hd[R_SEQ * rows + r] = seq_ids[i];
      hd[R_LC * rows + r] = L;
      hd[R_E * rows + r] = j + 1;
      hd[R_NEW * rows + r] = first;
    }
    if (L + q_lens[i] > maxT) maxT = L + q_lens[i];
  }
  const kivi_context *ctx = c->ctx;
  const size_t D = (size_t)c->cfg.head_dim, H = (size_t)c->cfg.n_kv_heads;
  const size_t nq = (size_t)rows * n_q_heads * D, nkv = (size_t)rows * H * D, nl = (size_t)rows * n_q_heads;
  const size_t host_io = mem == KIVI_MEM_HOST ? 2 * pad16(nq * 4) + 2 * pad16(nkv * 4) + pad16(nl * 4) : 0;
  if (kivi_scratch_reserve(ctx, &c->work, host_io + rows_scratch(c, (int)rows, n_q_heads, maxT))) {
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
  st = run_rows(c, layer, (int)rows, hd, maxT, n_q_heads, dq, dk, dv, scale, dout, 0, dlse, w + host_io);
  free(hd);
  if (!st && mem == KIVI_MEM_HOST &&
      (kivi_dev_get(ctx, out, dout, nq * 4) || (lse && kivi_dev_get(ctx, lse, dlse, nl * 4))))
    st = KIVI_ERR_DEVICE;
  return st;
}
