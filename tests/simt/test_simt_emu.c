/* The GPU emulator of the test library (simt_emu.h) against what it emulates: f16 rounding
 * against the compiler's _Float16, the byte permutes the kernels use, mma.sync m16n8k16 and
 * ldmatrix against their fragment tables written out here from the PTX ISA, shuffles and
 * votes, and the faults it must stop at (a GPU would hang or compute garbage there). */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simt_emu.h"

static uint32_t f16_bits(double d) {
  const _Float16 h = (_Float16)d;
  uint16_t b;
  memcpy(&b, &h, 2);
  return b;
}

START_TEST(f16_rounding) {
  for (uint32_t h = 0; h < 65536; ++h) { /* every f16 to double and back */
    const double d = kivi_simt_h2d(h);
    _Float16 x;
    const uint16_t hb = (uint16_t)h;
    memcpy(&x, &hb, 2);
    if (isnan(d)) {
      ck_assert(isnan((double)x));
      continue;
    }
    ck_assert_msg(d == (double)x && signbit(d) == signbit((double)x), "h2d(%04x)", h);
    ck_assert_uint_eq(kivi_simt_d2h(d), h);
  }
  uint64_t s = 88172645463325252ull; /* doubles from 2^-30 to 2^20, subnormal f16, ties */
  for (int i = 0; i < 1000000; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    double d = ldexp((double)(s >> 11) / 0x1p53, (int)(s % 51) - 30) * ((s >> 5 & 1) ? -1.0 : 1.0);
    if (i % 4 == 0) d = ldexp(floor(ldexp(d, 12)) + 0.5, -12); /* halfway cases between f16 neighbours */
    ck_assert_msg(kivi_simt_d2h(d) == f16_bits(d), "d2h(%a)", d);
  }
  ck_assert_uint_eq(kivi_simt_d2h(65520.0), 0x7c00u); /* rounds to infinity */
  ck_assert_uint_eq(kivi_simt_d2h(-INFINITY), 0xfc00u);
}
END_TEST

/* the kernels' helpers, as the emulated library's kernel files have them */
typedef unsigned fk_v4u __attribute__((ext_vector_type(4)));
typedef unsigned fk_v2u __attribute__((ext_vector_type(2)));
#include "simt_fk.h"

START_TEST(permutes_and_f16x2) {
  ck_assert_uint_eq(prmt(0x33221100u, 0x77665544u, 0x5410u), 0x55441100u); /* the low halves */
  ck_assert_uint_eq(prmt(0x33221100u, 0x77665544u, 0x7632u), 0x77663322u); /* the high halves */
  ck_assert_uint_eq(prmt(0x33221100u, 0x77665544u, 0x0123u), 0x00112233u); /* bytes reversed */
  ck_assert_uint_eq(prmt(0x000080ffu, 0u, 0x00a9u), 0xffff00ffu); /* signs of bytes 1 and 2, byte 0 twice */
  /* 1.5 * 2 = 3, (-0.5) * 4 = -2; the product's rounding error by the fused subtraction */
  ck_assert_uint_eq(hmul2(0x3e00u | 0xb800u << 16, 0x4000u | 0x4400u << 16), 0x4200u | 0xc000u << 16);
  const uint32_t a = 0x3c01u, b = 0x3c01u, p = hmul2(a, b); /* (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 */
  ck_assert_uint_eq(p, 0x3c02u);
  ck_assert_uint_eq(hfms2(a, b, p), f16_bits(0x1p-20));
  float lo, hi;
  h2f(f2h2(0.1f, -3.0e-6f), &lo, &hi);
  ck_assert(lo == (float)(double)(_Float16)0.1f && hi == (float)(double)(_Float16)-3.0e-6f);
}
END_TEST

/* m16n8k16 with A[r][k] = r - k / 2 + 3 and B[k][n] = (k * 3 + n) % 7 - 3 (small integers, the
 * sums exact), accumulator 0.5 (r + n); fragments as the PTX ISA's tables place them */
static float mma_out[32][4];
static double mA(int r, int k) { return r - k / 2 + 3; }
static double mB(int k, int n) { return (k * 3 + n) % 7 - 3; }
START_TEST(mma_fragments) {
  kivi_simt_run(1, 32, ^{
    const int l = kivi_simt_tid(), g = l >> 2, t = l & 3;
    const uint32_t a0 = simt_pack(mA(g, 2 * t), mA(g, 2 * t + 1)), a1 = simt_pack(mA(g + 8, 2 * t), mA(g + 8, 2 * t + 1));
    const uint32_t a2 = simt_pack(mA(g, 2 * t + 8), mA(g, 2 * t + 9)), a3 = simt_pack(mA(g + 8, 2 * t + 8), mA(g + 8, 2 * t + 9));
    const uint32_t b0 = simt_pack(mB(2 * t, g), mB(2 * t + 1, g)), b1 = simt_pack(mB(2 * t + 8, g), mB(2 * t + 9, g));
    float d[4] = {0.5f * (g + 2 * t), 0.5f * (g + 2 * t + 1), 0.5f * (g + 8 + 2 * t), 0.5f * (g + 8 + 2 * t + 1)};
    mma16816(d, a0, a1, a2, a3, b0, b1);
    memcpy(mma_out[l], d, sizeof d);
  });
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int r = (l >> 2) + 8 * (i >> 1), n = 2 * (l & 3) + (i & 1);
      double s = 0.5 * (r + n);
      for (int k = 0; k < 16; ++k) s += mA(r, k) * mB(k, n);
      ck_assert_msg(mma_out[l][i] == (float)s, "lane %d d[%d]: %g, want %g", l, i, mma_out[l][i], s);
    }
}
END_TEST

/* The accumulation the emulator takes from the H100/H200 (simt_emu.c, mma_sum): c + the 16
 * products of A = a everywhere and B[k][n] = b for k < nk (0 past it), c = +-1: each product
 * truncated toward zero at 2^-25 (a quarter of the fp32 ulp of 1), the sum truncated to fp32 */
static float acc_out[3][32][4];
START_TEST(mma_accumulation) {
  static const double a[3] = {0x1p-13, 0x1p-13, 0x1p-12}, b[3] = {0x1p-13, 0x1p-12, 0x1p-12};
  static const int nk[3] = {16, 7, 16};
  for (int c = 0; c < 3; ++c)
    kivi_simt_run(1, 32, ^{
      const int l = kivi_simt_tid(), t = l & 3;
      const uint32_t aw = simt_pack(a[c], a[c]);
      const uint32_t b0 = simt_pack(2 * t < nk[c] ? b[c] : 0.0, 2 * t + 1 < nk[c] ? b[c] : 0.0),
                     b1 = simt_pack(2 * t + 8 < nk[c] ? b[c] : 0.0, 2 * t + 9 < nk[c] ? b[c] : 0.0);
      float d[4] = {1.0f, -1.0f, 1.0f, -1.0f};
      mma16816(d, aw, aw, aw, aw, b0, b1);
      memcpy(acc_out[c][l], d, sizeof d);
    });
  /* c = 1: 16 products of 2^-26, each truncated to 0 (rounded to nearest once: 1 + 2^-22); 7
   * of 2^-25 kept, 1 + 7 2^-25 truncated to 1 + 2^-23 (to nearest: 1 + 2^-22); 16 of 2^-24:
   * 1 + 2^-20 exactly.  c = -1: -1; -1 + 7 2^-25 to -1 + 2^-22 (its magnitude truncated to a
   * multiple of 2^-24); -1 + 2^-20 */
  static const float want[3][2] = {{1.0f, -1.0f}, {1.0f + 0x1p-23f, -1.0f + 0x1p-22f}, {1.0f + 0x1p-20f, -1.0f + 0x1p-20f}};
  for (int c = 0; c < 3; ++c)
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i)
        ck_assert_msg(acc_out[c][l][i] == want[c][i & 1], "case %d lane %d d[%d]: %a, want %a", c, l, i,
                      (double)acc_out[c][l][i], (double)want[c][i & 1]);
}
END_TEST

/* ldmatrix .x4: four 8 x 8 matrices of u16, element (i, row, col) = 256 i + 16 row + col */
static uint16_t lm[4][8][8];
static uint32_t lm_out[2][32][4];
START_TEST(ldmatrix_fragments) {
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 8; ++r)
      for (int c = 0; c < 8; ++c) lm[i][r][c] = (uint16_t)(256 * i + 16 * r + c);
  kivi_simt_run(1, 32, ^{
    const int l = kivi_simt_tid();
    fk_ldsm4(lm_out[0][l], lm[l / 8][l % 8]);
    fk_ldsm4t(lm_out[1][l], lm[l / 8][l % 8]);
  });
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const int g = l >> 2, t = l & 3;
      ck_assert_uint_eq(lm_out[0][l][i], lm[i][g][2 * t] | (uint32_t)lm[i][g][2 * t + 1] << 16);
      ck_assert_uint_eq(lm_out[1][l][i], lm[i][2 * t][g] | (uint32_t)lm[i][2 * t + 1][g] << 16);
    }
}
END_TEST

static float sh_out[64][3];
static uint32_t vote_out[64][2];
START_TEST(shuffles_votes_barriers) {
  static int order[64], n_in;
  n_in = 0;
  kivi_simt_run(2, 64, ^{
    const int tid = kivi_simt_tid(), lane = tid & 31;
    const float v = (float)(tid * 10 + kivi_simt_bid());
    sh_out[tid][0] = shfx(v, 5);
    sh_out[tid][1] = shfi(v, 31 - lane);
    sh_out[tid][2] = (float)wmaxu((uint32_t)(lane * 7 % 32));
    vote_out[tid][0] = fk_ballot(lane % 3 == 0);
    if (kivi_simt_bid() == 1 && tid < 32) order[n_in++] = tid; /* before the barrier: all of warp 0 */
    fk_sync();
    if (kivi_simt_bid() == 1 && tid == 40) order[n_in++] = 99;
  });
  for (int tid = 0; tid < 64; ++tid) {
    const int lane = tid & 31, w = tid & ~31;
    ck_assert(sh_out[tid][0] == (float)((w + (lane ^ 5)) * 10 + 1));
    ck_assert(sh_out[tid][1] == (float)((w + 31 - lane) * 10 + 1));
    ck_assert(sh_out[tid][2] == 31.0f); /* 7 l mod 32 takes every value */
    ck_assert_uint_eq(vote_out[tid][0], 0x49249249u);
  }
  ck_assert_int_eq(n_in, 33); /* the entry after the barrier came after warp 0's 32 */
  ck_assert_int_eq(order[32], 99);
}
END_TEST

/* the faults: body must make the emulator abort with a message that names what (run in a
 * forked child, its stderr read back) */
static void expect_fault(void (^body)(void), const char *what) {
  int fd[2];
  ck_assert_int_eq(pipe(fd), 0);
  const pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(fd[1], STDERR_FILENO);
    close(fd[0]);
    body();
    _exit(0);
  }
  close(fd[1]);
  char msg[4096];
  size_t n = 0;
  ssize_t r;
  while (n < sizeof msg - 1 && (r = read(fd[0], msg + n, sizeof msg - 1 - n)) > 0) n += (size_t)r;
  msg[n] = '\0';
  close(fd[0]);
  int st;
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "no abort; stderr: %s", msg);
  ck_assert_msg(strstr(msg, what) != NULL, "expected \"%s\", stderr: %s", what, msg);
}

START_TEST(faults) {
  expect_fault(^{
    kivi_simt_run(1, 64, ^{
      if (kivi_simt_tid() & 32)
        fk_sync();
      else
        fk_sync();
    });
  }, "bar.sync reached at different places");
  for (int gone = 0; gone < 32; gone += 5) /* a lane exits before, between or after the others arrive */
    expect_fault(^{
      kivi_simt_run(1, 32, ^{
        if (kivi_simt_tid() == gone) return;
        (void)shfx(1.0f, 1);
      });
    }, "a warp collective after a lane of the warp exited");
  expect_fault(^{
    kivi_simt_run(1, 32, ^{ /* lane 0 waits at the team's barrier, the others at a warp barrier without it */
      if (kivi_simt_tid() == 0)
        fk_sync();
      else {
        fk_wsync();
        fk_sync();
      }
    });
  }, "deadlock");
}
END_TEST

int main(void) {
  Suite *s = suite_create("simt_emu");
  TCase *tc = tcase_create("emulator");
  tcase_add_test(tc, f16_rounding);
  tcase_add_test(tc, permutes_and_f16x2);
  tcase_add_test(tc, mma_fragments);
  tcase_add_test(tc, mma_accumulation);
  tcase_add_test(tc, ldmatrix_fragments);
  tcase_add_test(tc, shuffles_votes_barriers);
  tcase_add_test(tc, faults);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
