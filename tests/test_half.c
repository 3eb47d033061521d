/* The library's bit-level fp16/bf16 conversions (src/half.h) against the compiler's _Float16. */
#include "../src/half.h"
#include "check_util.h"
#include "ref/kivi_ref.h"

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

int main(void) {
  Suite *s = suite_create("half");
  TCase *tc = tcase_create("half");
  tcase_add_test(tc, f16_to_f32_exhaustive);
  tcase_add_test(tc, f32_to_f16_edges_and_random);
  tcase_add_test(tc, bf16_widening);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
