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
 *          is theirs (sink_partials_portable or the GPU's sink_block, before the other kernels), the
 *          combines take it in
 *   cnt    [rows][H][head chunks] u32 arrival counters, zero between calls ([rows][HQ] for
 *          the fused fast kernel) */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "internal.h"
#include "kernels_attn.h"
#include "plan.h"

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
/* staging: keys | values (each f16, H x new_pad x head_dim) | exponents */
static size_t new_part_bytes(const kivi_cache *c, const att_plan *p) {
  return pad16((size_t)c->cfg.n_kv_heads * p->new_pad * c->cfg.head_dim * 2);
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

#pragma omp declare target
/* The portable attention kernel: a team per work item (row, kv-head, chunk of that kv-head's
 * query heads, split of the tokens), looping over the items where the host fallback runs fewer
 * teams; see the top of this file.  Its inputs: run_rows's plan and descriptor in pt_args, each
 * field read where it is used (read into locals first, they make clang hold them all in
 * registers on a GPU: 168-238 instead of 127).  Its team-shared arrays are the function's own
 * (omp allocate: clang places them in the team's shared memory). */
typedef struct pt_args {
  const unsigned char *pool;
  const int32_t *bt;
  const uint16_t *kres, *vres;
  const float *q, *kn, *vn;
  int64_t *dd;
  float *part_o, *part_ml, *lse;
  unsigned *cnt;
  void *out;
  size_t sub, ksz_off, vcode_off, vsz_off;
  int64_t nitems, nsplit, split_len, slot0, nslots;
  float qmul;
  int rows, HQ, H, D, R, G, TG, NL, MB, layer, gsz, hc, nqc, pe, kb, vb, kw, vw, out_f16;
} pt_args;

static inline __attribute__((always_inline)) void portable_team(const pt_args *a) {
  float s_q[KIVI_ATT_QCAP], s_qs[KIVI_ATT_QSCAP], s_bias[KIVI_ATT_HC * (KIVI_ATT_TILE / KIVI_MIN_GROUP)];
  float s_p[KIVI_ATT_PCAP], s_bp[KIVI_ATT_HC * (KIVI_ATT_TILE / KIVI_MIN_GROUP) * 32], s_red[KIVI_ATT_NT];
  int s_last[1];
  KIVI_TEAM_SHARED(s_q, s_qs, s_bias, s_p, s_bp, s_red, s_last)
  float *const s_o = s_qs; /* the V phase's lane partials reuse the K staging area */
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    /* the host fallback may run fewer teams and threads than asked: loop, never assume */
    for (int64_t item = omp_get_team_num(); item < a->nitems; item += omp_get_num_teams()) {
      const int64_t sp = item % a->nsplit;
      const int qc = (int)(item / a->nsplit % a->nqc);
      const int kvh = (int)(item / (a->nsplit * a->nqc) % a->H);
      const int64_t r = item / (a->nsplit * a->nqc * a->H);
      const int64_t s = a->dd[R_SEQ * (int64_t)a->rows + r], Lc = a->dd[R_LC * (int64_t)a->rows + r];
      const int64_t T = Lc + (a->pe ? a->dd[R_E * (int64_t)a->rows + r] : 0);
      const int64_t Lk = Lc - Lc % a->R, Lv = Lc > a->R ? Lc - a->R : 0;
      const int64_t t0 = a->dd[R_BEG * (int64_t)a->rows + r] + sp * a->split_len;
      const int64_t t1 = t0 + a->split_len < T ? t0 + a->split_len : T;
      const int n = t1 > t0 ? (int)(t1 - t0) : 0, spl = (int)a->split_len;
      const int h0 = kvh * a->gsz + qc * a->hc;
      const int nh = a->gsz - qc * a->hc < a->hc ? a->gsz - qc * a->hc : a->hc;
      const int32_t *btrow = a->bt + ((size_t)s * a->NL + a->layer) * a->MB;
      const size_t ring = (((size_t)s * a->NL + a->layer) * a->H + kvh) * (size_t)a->R * a->D;
      const size_t newrow = (size_t)a->dd[R_NEW * (int64_t)a->rows + r] * a->H + kvh;
      const float *knew = a->kn ? a->kn + newrow * a->D : NULL, *vnew = a->vn ? a->vn + newrow * a->D : NULL;

      for (int i = tid; i < nh * a->D; i += nth) s_q[i] = a->q[((size_t)r * a->HQ + h0) * a->D + i] * a->qmul;
#pragma omp barrier
      /* ---- logits of the split, tile by tile; a tile's quantized key groups are staged
       * as q * scale (per head, group, channel) and bias = q . zero */
      for (int tt = 0; tt < n; tt += KIVI_ATT_TILE) {
        const int nt = n - tt < KIVI_ATT_TILE ? n - tt : KIVI_ATT_TILE;
        const int64_t tq = Lk - (t0 + tt); /* quantized keys left from the tile start */
        const int nq = a->kb < 16 ? (tq <= 0 ? 0 : tq < nt ? (int)tq : nt) : 0;
        const int ngq = nq / a->G;
        for (int i = tid; i < nh * ngq * a->D; i += nth) {
          const int d = i % a->D, gi = i / a->D % ngq, hh = i / (a->D * ngq);
          const int t = (int)(t0 + tt) + gi * a->G; /* positions fit in int: 32-bit division */
          const unsigned char *sb = kivi_sub_of(a->pool, btrow[t / a->R], a->H, kvh, a->sub);
          const uint16_t *sc = (const uint16_t *)(sb + a->ksz_off) + (size_t)(t % a->R / a->G) * 2 * a->D;
          s_qs[(hh * a->TG + gi) * a->D + d] = s_q[hh * a->D + d] * kivi_f16_to_f32(sc[d]);
        }
        /* bias = q . zero: 32 partial sums per (head, group), then their sum */
        for (int i = tid; i < nh * ngq * 32; i += nth) {
          const int part = i % 32, gi = i / 32 % ngq, hh = i / (32 * ngq);
          const int t = (int)(t0 + tt) + gi * a->G;
          const unsigned char *sb = kivi_sub_of(a->pool, btrow[t / a->R], a->H, kvh, a->sub);
          const uint16_t *zr = (const uint16_t *)(sb + a->ksz_off) + (size_t)(t % a->R / a->G) * 2 * a->D + a->D;
          float b = 0.0f;
          for (int d = part; d < a->D; d += 32) b += s_q[hh * a->D + d] * kivi_f16_to_f32(zr[d]);
          s_bp[i] = b;
        }
#pragma omp barrier
        for (int i = tid; i < nh * ngq; i += nth) {
          float b = 0.0f;
          for (int k = 0; k < 32; ++k) b += s_bp[i * 32 + k];
          s_bias[(i / ngq) * a->TG + i % ngq] = b;
        }
#pragma omp barrier
        /* one thread per token: consecutive threads read consecutive code rows */
        for (int j = tid; j < nt; j += nth) {
          const int t = (int)(t0 + tt) + j;
          float *out_p = s_p + tt + j;
          if (t < Lk) {
            const unsigned char *sb = kivi_sub_of(a->pool, btrow[t / a->R], a->H, kvh, a->sub);
            const uint32_t *row = (const uint32_t *)sb + (size_t)(t % a->R) * a->kw;
            const float *qs = s_qs + (j / a->G) * a->D;
            const float *bias = s_bias + j / a->G;
            switch (a->kb) {
            case 2: kivi_kdot_codes(row, a->D, 2, qs, a->TG * a->D, bias, a->TG, nh, out_p, spl); break;
            case 4: kivi_kdot_codes(row, a->D, 4, qs, a->TG * a->D, bias, a->TG, nh, out_p, spl); break;
            case 8: kivi_kdot_codes(row, a->D, 8, qs, a->TG * a->D, bias, a->TG, nh, out_p, spl); break;
            default: kivi_kdot_f16((const uint16_t *)row, a->D, s_q, nh, out_p, spl); break;
            }
          } else if (t < Lc) {
            kivi_kdot_f16(a->kres + ring + (size_t)(t % a->R) * a->D, a->D, s_q, nh, out_p, spl);
          } else {
            kivi_kdot_f32(knew + (size_t)(t - Lc) * a->H * a->D, a->D, s_q, nh, out_p, spl);
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
      const int vcpw = a->vb == 16 ? 2 : 32 / a->vb;
      const int wstep = nth < a->vw ? nth : a->vw, lanes = nth < a->vw ? 1 : nth / a->vw;
      const int tl = nth < a->vw ? 0 : tid / a->vw, w0 = nth < a->vw ? tid : tid % a->vw;
      const int jq = (int)(Lv - t0 <= 0 ? 0 : Lv - t0 < n ? Lv - t0 : n);
      const int jr = (int)(Lc - t0 <= 0 ? 0 : Lc - t0 < n ? Lc - t0 : n);
#if !defined(__NVPTX__)
      if (nth == 1) { /* host threads: one row of values at a time for all heads */
        float o_host[KIVI_ATT_HC * 256];
        kivi_vsum_host(a->pool, btrow, a->H, kvh, a->sub, a->vcode_off, a->vsz_off, a->R, a->D, a->G, a->vw, a->vb, a->vres, ring, vnew, Lc, t0, n,
                       jq, jr, s_p, spl, nh, o_host);
        for (int hh = 0; hh < nh; ++hh)
          for (int d = 0; d < a->D; ++d)
            a->part_o[(((size_t)r * a->HQ + h0 + hh) * a->nslots + a->slot0 + sp) * a->D + d] = o_host[hh * a->D + d];
      } else
#endif
      for (int hh = 0; hh < nh; ++hh) {
        const float *p = s_p + hh * spl;
        if (tl < lanes)
          for (int wi = w0; wi < a->vw; wi += wstep) {
            float acc[16], z = 0.0f;
            for (int k = 0; k < vcpw; ++k) acc[k] = 0.0f;
            switch (a->vb) {
            case 2: kivi_vacc_codes(a->pool, btrow, a->H, kvh, a->sub, a->vcode_off, a->vsz_off, a->R, a->D, a->G, a->vw, 2, wi, t0, tl, jq, lanes, p, acc, &z); break;
            case 4: kivi_vacc_codes(a->pool, btrow, a->H, kvh, a->sub, a->vcode_off, a->vsz_off, a->R, a->D, a->G, a->vw, 4, wi, t0, tl, jq, lanes, p, acc, &z); break;
            case 8: kivi_vacc_codes(a->pool, btrow, a->H, kvh, a->sub, a->vcode_off, a->vsz_off, a->R, a->D, a->G, a->vw, 8, wi, t0, tl, jq, lanes, p, acc, &z); break;
            default: kivi_vacc_codes(a->pool, btrow, a->H, kvh, a->sub, a->vcode_off, a->vsz_off, a->R, a->D, a->G, a->vw, 16, wi, t0, tl, jq, lanes, p, acc, &z); break;
            }
            /* fp16 window and new tokens: the lane's tokens from jq on */
            const int ja = jq + ((tl - jq) % lanes + lanes) % lanes;
            for (int j = ja; j < n; j += lanes) {
              const int t = (int)t0 + j;
              for (int k = 0; k < vcpw; ++k) {
                const int d = wi * vcpw + k;
                const float x = j < jr ? kivi_f16_to_f32(a->vres[ring + (size_t)(t % a->R) * a->D + d])
                                       : vnew[(size_t)(t - Lc) * a->H * a->D + d];
                acc[k] += p[j] * x;
              }
            }
            for (int k = 0; k < vcpw; ++k) s_o[tl * a->D + wi * vcpw + k] = acc[k] + z;
          }
#pragma omp barrier
        for (int d = tid; d < a->D; d += nth) {
          float o = 0.0f;
          for (int l = 0; l < lanes; ++l) o += s_o[l * a->D + d];
          a->part_o[(((size_t)r * a->HQ + h0 + hh) * a->nslots + a->slot0 + sp) * a->D + d] = o;
        }
#pragma omp barrier
      }
      if (tid == 0)
        for (int hh = 0; hh < nh; ++hh) {
          const size_t o = (((size_t)r * a->HQ + h0 + hh) * a->nslots + a->slot0 + sp) * 2;
          a->part_ml[o] = mh[hh];
          a->part_ml[o + 1] = lh[hh];
        }
      /* ---- arrival: the group's last item combines all of its splits */
#pragma omp flush
#pragma omp barrier
      const int64_t grp = (r * a->H + kvh) * a->nqc + qc;
      if (tid == 0) {
        unsigned seen;
#pragma omp atomic capture seq_cst
        seen = a->cnt[grp]++;
        s_last[0] = seen == (unsigned)(a->nsplit - 1);
      }
#pragma omp barrier
      if (s_last[0]) {
#pragma omp flush
        for (int i = tid; i < nh * a->D; i += nth)
          kivi_combine_item(((r * a->HQ + h0) * a->D) + i, a->D, a->nslots, a->part_o, a->part_ml, a->out, a->out_f16, a->lse);
        if (tid == 0) a->cnt[grp] = 0;
      }
#pragma omp barrier
    }
  }
}
#pragma omp end declare target

#define PORTABLE_REGION(...)                                                                                          \
  KIVI_PRAGMA_X(omp target teams device(dev) num_teams(nteams) thread_limit(nthreads)                                \
                    is_device_ptr(pool, bt, kres, vres, q, kn, vn, dd, part_o, part_ml, cnt, out, lse) __VA_ARGS__)     \
  {                                                                                                                   \
    const pt_args a_ = {pool,  bt,  kres, vres, q,  kn, vn, dd, part_o, part_ml, lse, cnt, out, sub, ksz_off,        \
                        vcode_off, vsz_off, nitems, nsplit, split_len, slot0, nslots, qmul, rows, HQ, H, D, R, G, TG,  \
                        NL, MB, layer, gsz, hc, nqc, pe, kb, vb, kw, vw, out_f16};                                     \
    portable_team(&a_);                                                                                               \
  }

/* The sink tokens' partials on host threads or through the portable region (the GPU has its own
 * kernel: kivi_gpu_sink_partials).  Item = (row, query head, channel d): the online softmax over
 * the row's sink tokens (at most ns, fp16 in the sink area), logits q . k in fp32 scaled by qmul
 * (base 2) as every kernel's, and the unnormalized output channel d; the thread of channel 0 also
 * writes (m, l).  Each thread computes the item's logits itself: ns x head_dim multiply-adds,
 * small beside the quantized stream's kernels.  Slot sslot = nslots - 1 of the partials; the
 * other kernels' combines, which run after this region, take it in. */
#define SINK_PORTABLE_REGION(...)                                                                                      \
  KIVI_PRAGMA_X(omp target teams distribute parallel for device(dev) KIVI_LOOP_TEAMS map(to : sd[0:ndd])               \
                    is_device_ptr(q, ksink, vsink, part_o, part_ml) __VA_ARGS__)                                       \
  for (int64_t it = 0; it < nsi; ++it) {                                                                               \
    const int d = (int)(it % D);                                                                                       \
    const int64_t rh = it / D, r = rh / HQ;                                                                            \
    const int kvh = (int)(rh % HQ) / gsz;                                                                              \
    const int64_t s = sd[R_SEQ * (int64_t)rows + r], n = sd[R_NS * (int64_t)rows + r];                                 \
    const size_t at = (((size_t)s * NL + layer) * H + kvh) * (size_t)ns * D;                                           \
    const float *qr = q + (size_t)rh * D;                                                                              \
    float m = -INFINITY, l = 0.0f, o = 0.0f;                                                                           \
    for (int64_t t = 0; t < n; ++t) {                                                                                  \
      const uint16_t *kr = ksink + at + (size_t)t * D;                                                                 \
      float x = 0.0f;                                                                                                  \
      for (int e = 0; e < D; ++e) x += qr[e] * kivi_f16_to_f32(kr[e]);                                                 \
      x *= qmul;                                                                                                       \
      if (x > m) { /* the running maximum moves: rescale what is summed */                                             \
        const float w = exp2f(m - x);                                                                                  \
        l *= w;                                                                                                        \
        o *= w;                                                                                                        \
        m = x;                                                                                                         \
      }                                                                                                                \
      const float p = exp2f(x - m);                                                                                    \
      l += p;                                                                                                          \
      o += p * kivi_f16_to_f32(vsink[at + (size_t)t * D + d]);                                                         \
    }                                                                                                                  \
    part_o[((size_t)rh * nslots + sslot) * D + d] = o;                                                                 \
    if (d == 0) {                                                                                                      \
      part_ml[((size_t)rh * nslots + sslot) * 2] = m;                                                                  \
      part_ml[((size_t)rh * nslots + sslot) * 2 + 1] = l;                                                              \
    }                                                                                                                  \
  }
static void sink_partials_portable(kivi_cache *c, int layer, int rows, int HQ, const int64_t *sd, int64_t ndd,
                                   const float *q, float qmul, float *part_o, float *part_ml, int64_t nslots, int async,
                                   int lane) {
  const uint16_t *ksink = c->ksink, *vsink = c->vsink;
  const int D = c->cfg.head_dim, H = c->cfg.n_kv_heads, NL = c->cfg.n_layers, ns = c->ns, gsz = HQ / H;
  const int dev = c->ctx->device;
  const int64_t nsi = (int64_t)rows * HQ * D, sslot = nslots - 1;
  KIVI_LAUNCH_TWICE(SINK_PORTABLE_REGION);
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
    const int64_t ndd = (int64_t)ddn;
    if (!ctx->on_gpu || kivi_gpu_sink_partials(c, layer, rows, HQ, sd, ndd, R_SEQ, R_NS, q, qmul, part_o, part_ml,
                                               nslots, async, lane))
      sink_partials_portable(c, layer, rows, HQ, sd, ndd, q, qmul, part_o, part_ml, nslots, async, lane);
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

  KIVI_LAUNCH_TWICE(PORTABLE_REGION);
  return KIVI_OK;
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
  const att_plan pl = kivi_plan_call(c, n_seqs, hd, n_q_heads, 1, 0);
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
  const att_plan pl = kivi_plan_call(c, (int)rows, hd, n_q_heads, 0, newk);
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
