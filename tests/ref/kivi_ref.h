/* Plain scalar reference for the tests and the benchmark: written from the specification in
 * kivi.h and docs/FORMAT.md, sharing no code with the library (fp16 through the compiler's
 * _Float16, attention in double). */
#ifndef KIVI_REF_H
#define KIVI_REF_H

#include <stddef.h>
#include <stdint.h>

uint16_t ref_f16(float x);      /* round to nearest even, via _Float16 */
float ref_f16_val(uint16_t h);  /* exact */
float ref_round_f16(float x);   /* x rounded to the nearest fp16 value, as float */
/* The code of x in a group with stored scale s and zero z (fp16 values, as floats):
 * clamp(floor((x - z) / s + 1/2), 0, 2^bits - 1), 0 when s is 0. */
unsigned ref_quant_code(float x, float s, float z, int bits);

typedef struct ref_geom {
  int D, H, G, R, kb, vb;
  int S;     /* kivi_cache_config.sinks (0 where an initializer leaves it out) */
  int vclip; /* kivi_cache_config.v_clip (0 where an initializer leaves it out) */
} ref_geom;

/* Expected export (kivi_cache_export_seq) of one sequence on one layer whose tokens are
 * k, v: [L][H][D] fp32.  Returns a malloc'd buffer and its size.  With S sink tokens (and not
 * 16-bit keys and values) each kv-head's part starts with the first min(L, S) tokens in fp16,
 * keys then values, and the rest is the export of the other tokens as a sequence of their own. */
unsigned char *ref_export(const ref_geom *g, int L, const float *k, const float *v, size_t *bytes);

/* Dequantize an export back into kd, vd: [L][H][D] double (sink tokens first, as stored). */
void ref_dequant_export(const ref_geom *g, int L, const unsigned char *exp, double *kd, double *vd);

/* Attention of one query row over T tokens (k, v: [T][H][D] double; q: [HQ][D]):
 * out [HQ][D], lse [HQ] (natural log, may be NULL).  Double throughout. */
void ref_attention(int T, int H, int HQ, int D, const double *k, const double *v, const float *q,
                   double scale, double *out, double *lse);

/* The rotation of kivi_cache_config.rotate: W x, W the orthonormal Walsh-Hadamard matrix of
 * order D (a power of two, Sylvester's order), in place.  ref_rotate_f32: in fp32 in the order
 * kivi.h defines (what a rotated cache rounds to fp16); ref_rotate: in double. */
void ref_rotate_f32(float *x, int D);
void ref_rotate(double *x, int D);

#endif
