/* The library's bit-level fp16/bf16 conversions (src/half.h) against the compiler's _Float16. */
#include "../../src/half.h"
#include "../../src/kernels_quant.h"
#include "../check_util.h"
#include "../ref/kivi_ref.h"

START_TEST(f16_to_f32_exhaustive) {
  for (uint32_t u = 0; u < 65536; ++u) {
    const float a = kivi_f16_to_f32((uint16_t)u), b = ref_f16_val((uint16_t)u);
    if (isnan(b)) ck_assert(isnan(a));
    else ck_assert_msg(kivi_f32_bits(a) == kivi_f32_bits(b), "h=%#x: %a vs %a", u, a, b);
  }
}
END_TEST

/* Also the host-side input check: x fits iff the compiler's conversion gives a finite fp16. */
static void check_one(float x) {
  const uint16_t a = kivi_f32_to_f16(x), b = ref_f16(x);
  if (isnan(x)) ck_assert((a & 0x7c00) == 0x7c00 && (a & 0x3ff));
  else ck_assert_msg(a == b, "x=%a: %#x vs %#x", x, a, b);
  const int fits = !isnan(x) && (b & 0x7c00) != 0x7c00;
  ck_assert_msg(kivi_f32_bits_fit_f16(kivi_f32_bits(x)) == fits, "x=%a: fit %d", x, fits);
}

START_TEST(f32_to_f16_edges_and_random) {
  const float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e-8f,
                        2.9802322e-8f /* 2^-25 tie */, 2.98023259e-8f, 5.9604645e-8f, 6.097555e-5f,
                        6.1035156e-5f, 1.0009765625f /* tie */, 1.00146484375f, INFINITY, -INFINITY,
                        3.0e38f, -1.5e-6f, 0.1f, 1.0f / 3.0f};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; ++i) check_one(edge[i]);
  check_one(NAN);
  /* every fp16 value and both midpoints to its neighbours */
  for (uint32_t u = 0; u < 0x7c00; ++u) {
    const float lo = ref_f16_val((uint16_t)u), hi = ref_f16_val((uint16_t)(u + 1));
    check_one(lo);
    check_one(-lo);
    const float mid = (float)(((double)lo + (double)hi) / 2);
    check_one(mid);
    check_one(nextafterf(mid, 0.0f));
    check_one(nextafterf(mid, INFINITY));
  }
  uint64_t s = 42;
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits = (uint32_t)tu_next(&s);
    float f;
    memcpy(&f, &bits, 4);
    check_one(f);
  }
}
END_TEST

START_TEST(bf16_widening) {
  for (uint32_t u = 0; u < 65536; ++u) {
    const float a = kivi_bf16_to_f32((uint16_t)u);
    uint32_t b;
    memcpy(&b, &a, 4);
    ck_assert_uint_eq(b, u << 16);
    /* the host-side input check of a bf16 input, against the compiler's fp16 conversion */
    const int fits = !isnan(a) && (ref_f16(a) & 0x7c00) != 0x7c00;
    ck_assert_msg(kivi_f32_bits_fit_f16(u << 16) == fits, "bf16 %#x: fit %d", u, fits);
  }
}
END_TEST

/* The library's quantizer for the larger appends (kivi_quant_code_mul: a multiplication by
 * 1 / scale, the division only near a rounding boundary, as the items do it; and the fma form
 * kivi_quant_code_fma of the GPU append kernels, where kivi_quant_fma_ok allows it) against the
 * reference's division (tests/ref), for groups as the library makes them (zero = the group's
 * min, scale = fp16((max - min) / maxq)): the values at and next to each code boundary of
 * random groups of every magnitude, and every fp16 value of small groups.  Mismatches are
 * counted and asserted once (a Check assertion per value would dominate the run time). */
static long n_fma; /* values checked in the fma form too */
static long quant_mismatches(float mn, float s, int bits, float x) {
  const float maxq = (float)((1 << bits) - 1);
  float dev = 0.0f;
  unsigned got = kivi_quant_code_mul(x, kivi_quant_rs(s), mn, maxq, &dev);
  if (dev > KIVI_QUANT_NEAR) got = kivi_quant_code(x, s, mn, maxq);
  const unsigned want = ref_quant_code(x, s, mn, bits);
  if (got != want) printf("%d-bit min %a scale %a x %a: %u, reference %u\n", bits, mn, s, x, got, want);
  long bad = got != want;
  const float rs = kivi_quant_rs(s);
  if (kivi_quant_fma_ok(mn, s, rs)) { /* the fma form, where the GPU append kernels take it */
    dev = 0.0f;
    unsigned fgot = kivi_quant_code_fma(x, rs, -(mn * rs), &dev);
    if (dev > KIVI_QUANT_NEAR) fgot = kivi_quant_code(x, s, mn, maxq);
    if (fgot != want) printf("%d-bit min %a scale %a x %a: fma %u, reference %u\n", bits, mn, s, x, fgot, want);
    bad += fgot != want;
    ++n_fma;
  }
  return bad;
}

static long check_group(uint16_t hmn, uint16_t hmx, int bits, uint64_t *seed) {
  const float mn = ref_f16_val(hmn), mx = ref_f16_val(hmx);
  const float s = ref_f16_val(ref_f16((mx - mn) / (float)((1 << bits) - 1)));
  long bad = 0;
  for (int j = 0; j < (1 << bits) + 2; ++j) {
    /* three points per code j: the boundary (j + 1/2) s above the zero, the fp16 value after
     * it, and a random value of the group; each with its two fp16 neighbours */
    for (int k = 0; k < 3; ++k) {
      uint16_t hx = ref_f16(k == 2 ? mn + (mx - mn) * (float)(tu_next(seed) % 1024) / 1023.0f
                                   : mn + ((float)j + 0.5f) * s);
      if (k == 1) hx = (uint16_t)(hx + ((hx & 0x8000) ? -1 : 1));
      const uint16_t hc = ref_f16(fminf(fmaxf(ref_f16_val(hx), mn), mx));
      for (int d = -1; d <= 1; ++d) {
        const float x = ref_f16_val((uint16_t)(hc + d));
        if (x >= mn && x <= mx) bad += quant_mismatches(mn, s, bits, x); /* (NaN and Inf fail) */
      }
    }
  }
  return bad;
}

START_TEST(quant_code_equals_division) {
  static const int bits[] = {2, 4, 8};
  uint64_t seed = 7;
  long n = 0, bad = 0;
  for (int b = 0; b < 3; ++b) {
    const int ngroups = bits[b] == 8 ? 5000 : 100000; /* 9 (2^b + 2) values each */
    for (int i = 0; i < ngroups; ++i, ++n) {
      /* magnitudes from subnormal to 65504: two random fp16 values, the smaller the min */
      uint16_t a = (uint16_t)(tu_next(&seed) % 0x7c00), c = (uint16_t)(tu_next(&seed) % 0x7c00);
      if (tu_next(&seed) & 1) a |= 0x8000;
      if (tu_next(&seed) & 1) c |= 0x8000;
      bad += ref_f16_val(a) <= ref_f16_val(c) ? check_group(a, c, bits[b], &seed) : check_group(c, a, bits[b], &seed);
    }
    /* near-constant groups (a range of 1 to 4 ulps at any magnitude, both signs): |zero / scale|
     * up to 6144, on both sides of the fma form's 4096 limit; every value of each group */
    for (int i = 0; i < 20000; ++i) {
      const uint16_t a = (uint16_t)(tu_next(&seed) % (0x7bfb - 0x0400) + 0x0400), k = (uint16_t)(1 + tu_next(&seed) % 4);
      const uint16_t lo = (tu_next(&seed) & 1) ? (uint16_t)(a | 0x8000) : a;
      const uint16_t hi = (lo & 0x8000) ? (uint16_t)(lo - k) : (uint16_t)(lo + k); /* k ulps up */
      const float mn = ref_f16_val(lo), mx = ref_f16_val(hi);
      const float s = ref_f16_val(ref_f16((mx - mn) / (float)((1 << bits[b]) - 1)));
      for (uint16_t d = 0; d <= k; ++d)
        bad += quant_mismatches(mn, s, bits[b], ref_f16_val((lo & 0x8000) ? (uint16_t)(lo - d) : (uint16_t)(lo + d)));
    }
    /* every fp16 value of the small groups [x0, 1 + 1/16] */
    const float mx = ref_f16_val(0x3c40);
    for (uint32_t u = 0x3c00; u < 0x3c40; ++u) {
      const float mn = ref_f16_val((uint16_t)u), s = ref_f16_val(ref_f16((mx - mn) / (float)((1 << bits[b]) - 1)));
      for (uint32_t v = u; v <= 0x3c40; ++v) bad += quant_mismatches(mn, s, bits[b], ref_f16_val((uint16_t)v));
    }
  }
  printf("quantizer: %ld random groups (2, 4 and 8 bits) checked at every code boundary (%ld values in the fma form)\n", n,
         n_fma);
  ck_assert(n_fma > 0);
  ck_assert_msg(bad == 0, "%ld codes differ from the division", bad);
}
END_TEST

int main(void) {
  Suite *s = suite_create("half");
  TCase *tc = tcase_create("half");
  tcase_add_test(tc, f16_to_f32_exhaustive);
  tcase_add_test(tc, f32_to_f16_edges_and_random);
  tcase_add_test(tc, bf16_widening);
  tcase_add_test(tc, quant_code_equals_division);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
