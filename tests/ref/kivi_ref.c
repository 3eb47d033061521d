#include "kivi_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

uint16_t ref_f16(float x) {
  _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}

float ref_f16_val(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}

float ref_round_f16(float x) { return ref_f16_val(ref_f16(x)); }

unsigned ref_quant_code(float x, float s, float z, int bits) {
  const float maxq = (float)((1 << bits) - 1);
  float c = 0.0f;
  if (s > 0.0f) {
    c = floorf((x - z) / s + 0.5f);
    if (c < 0.0f) c = 0.0f;
    if (c > maxq) c = maxq;
  }
  return (unsigned)c;
}

/* One quantization group of n fp16-rounded values: stored scale/zero and codes (spec in kivi.h). */
static void ref_quant(const float *x, int n, int stride, int bits, uint16_t *hs, uint16_t *hz, unsigned *codes) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    const float f = x[(size_t)i * stride];
    if (f < mn) mn = f;
    if (f > mx) mx = f;
  }
  *hs = ref_f16((mx - mn) / (float)((1 << bits) - 1));
  *hz = ref_f16(mn);
  const float s = ref_f16_val(*hs), z = ref_f16_val(*hz);
  for (int i = 0; i < n; ++i) codes[i] = ref_quant_code(x[(size_t)i * stride], s, z, bits);
}

/* A value group with a searched range (kivi_cache_config.v_clip = KIVI_CLIP_MSE, rule in
 * kivi.h): the min/max candidate of ref_quant and 8 narrowed ones, the first of the smallest
 * sum of squared errors (errors cut to 12 significant bits).  x: n consecutive values. */
static float ref_clip_err(const float *x, int n, int bits, float s, float z) {
  float e = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float prod = (float)ref_quant_code(x[i], s, z, bits) * s; /* exact */
    const float rec = prod + z;
    const float d = rec - x[i];
    uint32_t u;
    memcpy(&u, &d, 4);
    u &= ~0xfffu;
    float dc;
    memcpy(&dc, &u, 4);
    const float sq = dc * dc; /* exact: 12 x 12 bits */
    e = e + sq;
  }
  return e;
}
static void ref_quant_clip(const float *x, int n, int bits, uint16_t *hs, uint16_t *hz, unsigned *codes) {
  ref_quant(x, n, 1, bits, hs, hz, codes);
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < mn) mn = x[i];
    if (x[i] > mx) mx = x[i];
  }
  const float maxq = (float)((1 << bits) - 1);
  const float h = ref_round_f16(0.5f * (mx - mn));
  if (!(h > 0.0f) || h > 65504.0f) return;
  float best = ref_clip_err(x, n, bits, ref_f16_val(*hs), ref_f16_val(*hz));
  for (int i = 1; i <= 8; ++i) {
    const float ah = ((float)i / 16.0f) * h; /* exact */
    const float lo = mn + ah, hi = mx - ah;
    const uint16_t s16 = ref_f16((hi - lo) / maxq), z16 = ref_f16(lo);
    const float e = ref_clip_err(x, n, bits, ref_f16_val(s16), ref_f16_val(z16));
    if (e < best) {
      best = e;
      *hs = s16;
      *hz = z16;
    }
  }
  for (int i = 0; i < n; ++i) codes[i] = ref_quant_code(x[i], ref_f16_val(*hs), ref_f16_val(*hz), bits);
}

/* Pack the codes of one token row (D channels) into words, LSB first. */
static unsigned char *put_row(unsigned char *o, const unsigned *codes, int D, int bits) {
  const int cpw = 32 / bits;
  for (int w = 0; w < D / cpw; ++w) {
    uint32_t word = 0;
    for (int j = 0; j < cpw; ++j) word |= (uint32_t)codes[w * cpw + j] << (bits * j);
    memcpy(o, &word, 4);
    o += 4;
  }
  return o;
}

static unsigned char *put_h(unsigned char *o, uint16_t h) {
  memcpy(o, &h, 2);
  return o + 2;
}

/* The sink tokens of a sequence of L tokens: min(L, S), none where keys and values are 16-bit */
static int sinks_in(const ref_geom *g, int L) {
  const int S = g->kb == 16 && g->vb == 16 ? 0 : g->S;
  return L < S ? L : S;
}

unsigned char *ref_export(const ref_geom *g, int L0, const float *k0, const float *v0, size_t *bytes) {
  const int D = g->D, H = g->H, G = g->G, R = g->R;
  /* tokens 0 .. Ls-1 are the sinks (fp16); the rest, L of them, the quantized stream */
  const int Ls = sinks_in(g, L0), L = L0 - Ls;
  const float *k = k0 + (size_t)Ls * H * D, *v = v0 + (size_t)Ls * H * D;
  const int Lk = L - L % R, Lv = L > R ? L - R : 0;
  const size_t cap = (size_t)H * ((size_t)2 * L0 * D * 2 + (size_t)2 * L0 * D * 4 + 64);
  unsigned char *buf = calloc(1, cap), *o = buf;
  float *x = malloc(sizeof(float) * (size_t)(L > 0 ? L : 1) * D * 2);
  unsigned *codes = malloc(sizeof(unsigned) * (size_t)(L > 0 ? L : 1) * D);
  uint16_t *ks = malloc(2 * (size_t)(Lk / G + 1) * D), *kz = malloc(2 * (size_t)(Lk / G + 1) * D);
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < Ls; ++t)
      for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(k0[((size_t)t * H + h) * D + c]));
    for (int t = 0; t < Ls; ++t)
      for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(v0[((size_t)t * H + h) * D + c]));
    /* K: fp16-rounded keys of this head, [t][c] */
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < D; ++c) x[(size_t)t * D + c] = ref_round_f16(k[((size_t)t * H + h) * D + c]);
    if (g->kb == 16) {
      for (int t = 0; t < Lk; ++t)
        for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(x[(size_t)t * D + c]));
    } else {
      for (int grp = 0; grp < Lk / G; ++grp)
        for (int c = 0; c < D; ++c) {
          unsigned cc[128];
          ref_quant(x + (size_t)grp * G * D + c, G, D, g->kb, &ks[grp * D + c], &kz[grp * D + c], cc);
          for (int i = 0; i < G; ++i) codes[(size_t)(grp * G + i) * D + c] = cc[i];
        }
      for (int t = 0; t < Lk; ++t) o = put_row(o, codes + (size_t)t * D, D, g->kb);
      for (int grp = 0; grp < Lk / G; ++grp) {
        for (int c = 0; c < D; ++c) o = put_h(o, ks[grp * D + c]);
        for (int c = 0; c < D; ++c) o = put_h(o, kz[grp * D + c]);
      }
    }
    /* V: per token, groups of G channels */
    float *y = x + (size_t)L * D;
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < D; ++c) y[(size_t)t * D + c] = ref_round_f16(v[((size_t)t * H + h) * D + c]);
    if (g->vb == 16) {
      for (int t = 0; t < Lv; ++t)
        for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(y[(size_t)t * D + c]));
    } else {
      uint16_t *vsz = malloc(2 * 2 * (size_t)(Lv + 1) * (D / G));
      for (int t = 0; t < Lv; ++t) {
        for (int cg = 0; cg < D / G; ++cg) {
          const float *xg = y + (size_t)t * D + cg * G;
          uint16_t *sz = &vsz[((size_t)t * (D / G) + cg) * 2];
          if (g->vclip) ref_quant_clip(xg, G, g->vb, sz, sz + 1, codes + (size_t)t * D + cg * G);
          else ref_quant(xg, G, 1, g->vb, sz, sz + 1, codes + (size_t)t * D + cg * G);
        }
        o = put_row(o, codes + (size_t)t * D, D, g->vb);
      }
      for (size_t i = 0; i < (size_t)Lv * (D / G) * 2; ++i) o = put_h(o, vsz[i]);
      free(vsz);
    }
    for (int t = Lk; t < L; ++t)
      for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(x[(size_t)t * D + c]));
    for (int t = Lv; t < L; ++t)
      for (int c = 0; c < D; ++c) o = put_h(o, ref_f16(y[(size_t)t * D + c]));
  }
  free(x);
  free(codes);
  free(ks);
  free(kz);
  *bytes = (size_t)(o - buf);
  return buf;
}

static uint32_t get32(const unsigned char *p) { uint32_t u; memcpy(&u, p, 4); return u; }
static double get_h(const unsigned char *p) { uint16_t u; memcpy(&u, p, 2); return ref_f16_val(u); }

static unsigned code_at(const unsigned char *row, int c, int bits) {
  const int cpw = 32 / bits;
  return (get32(row + 4 * (c / cpw)) >> (bits * (c % cpw))) & ((1u << bits) - 1u);
}

void ref_dequant_export(const ref_geom *g, int L0, const unsigned char *e, double *kd0, double *vd0) {
  const int D = g->D, H = g->H, G = g->G, R = g->R;
  const int Ls = sinks_in(g, L0), L = L0 - Ls;
  double *kd = kd0 + (size_t)Ls * H * D, *vd = vd0 + (size_t)Ls * H * D;
  const int Lk = L - L % R, Lv = L > R ? L - R : 0;
  const size_t krow = (size_t)D * g->kb / 8, vrow = (size_t)D * g->vb / 8;
  for (int h = 0; h < H; ++h) {
    for (int t = 0; t < Ls; ++t)
      for (int c = 0; c < D; ++c) {
        kd0[((size_t)t * H + h) * D + c] = get_h(e + ((size_t)t * D + c) * 2);
        vd0[((size_t)t * H + h) * D + c] = get_h(e + ((size_t)(Ls + t) * D + c) * 2);
      }
    e += (size_t)2 * Ls * D * 2;
    const unsigned char *kc = e, *ksz = kc + (size_t)Lk * krow;
    const unsigned char *vc = ksz + (g->kb < 16 ? (size_t)(Lk / G) * 2 * D * 2 : 0);
    const unsigned char *vsz = vc + (size_t)Lv * vrow;
    const unsigned char *kr = vsz + (g->vb < 16 ? (size_t)Lv * (D / G) * 4 : 0);
    const unsigned char *vr = kr + (size_t)(L - Lk) * D * 2;
    e = vr + (size_t)(L - Lv) * D * 2;
    for (int t = 0; t < L; ++t)
      for (int c = 0; c < D; ++c) {
        double kv, vv;
        if (t >= Lk) kv = get_h(kr + ((size_t)(t - Lk) * D + c) * 2);
        else if (g->kb == 16) kv = get_h(kc + (size_t)t * krow + 2 * c);
        else {
          const unsigned char *sz = ksz + (size_t)(t / G) * 2 * D * 2;
          kv = code_at(kc + (size_t)t * krow, c, g->kb) * get_h(sz + 2 * c) + get_h(sz + 2 * (D + c));
        }
        if (t >= Lv) vv = get_h(vr + ((size_t)(t - Lv) * D + c) * 2);
        else if (g->vb == 16) vv = get_h(vc + (size_t)t * vrow + 2 * c);
        else {
          const unsigned char *sz = vsz + ((size_t)t * (D / G) + c / G) * 4;
          vv = code_at(vc + (size_t)t * vrow, c, g->vb) * get_h(sz) + get_h(sz + 2);
        }
        kd[((size_t)t * H + h) * D + c] = kv;
        vd[((size_t)t * H + h) * D + c] = vv;
      }
  }
}

void ref_attention(int T, int H, int HQ, int D, const double *k, const double *v, const float *q,
                   double scale, double *out, double *lse) {
  double *s = malloc(sizeof(double) * (size_t)(T > 0 ? T : 1));
  for (int hq = 0; hq < HQ; ++hq) {
    const int h = hq / (HQ / H);
    double m = -INFINITY;
    for (int t = 0; t < T; ++t) {
      double a = 0;
      for (int c = 0; c < D; ++c) a += (double)q[(size_t)hq * D + c] * k[((size_t)t * H + h) * D + c];
      s[t] = a * scale;
      if (s[t] > m) m = s[t];
    }
    double l = 0;
    for (int t = 0; t < T; ++t) l += exp(s[t] - m);
    for (int c = 0; c < D; ++c) {
      double o = 0;
      for (int t = 0; t < T; ++t) o += exp(s[t] - m) * v[((size_t)t * H + h) * D + c];
      out[(size_t)hq * D + c] = o / l;
    }
    if (lse) lse[hq] = m + log(l);
  }
  free(s);
}

void ref_rotate_f32(float *x, int D) {
  for (int h = 1; h < D; h *= 2)
    for (int i = 0; i < D; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
  const float norm = 1.0f / sqrtf((float)D);
  for (int i = 0; i < D; ++i) x[i] *= norm;
}

void ref_rotate(double *x, int D) {
  /* W x = (1 / sqrt(D)) sum_j (-1)^popcount(i & j) x_j, straight from the definition */
  double *y = malloc(sizeof(double) * (size_t)D);
  for (int i = 0; i < D; ++i) {
    double s = 0.0;
    for (int j = 0; j < D; ++j) s += __builtin_popcount((unsigned)(i & j)) & 1 ? -x[j] : x[j];
    y[i] = s / sqrt((double)D);
  }
  memcpy(x, y, sizeof(double) * (size_t)D);
  free(y);
}
