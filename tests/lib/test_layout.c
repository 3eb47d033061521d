/* Golden vectors that freeze the packed format (docs/FORMAT.md).  The expected words below are
 * derived by hand from the format description, not computed by any code: if one of these tests
 * fails, the format changed, and the format version and documentation must change with it. */
#include "../../src/layout.h"
#include "../check_util.h"

/* fp16 bit patterns used below */
#define H0 0x0000u   /* 0.0 */
#define H05 0x3800u  /* 0.5 */
#define H1 0x3c00u   /* 1.0 */
#define H2 0x4000u   /* 2.0 */
#define H3 0x4200u   /* 3.0 */

static unsigned char *export_of(kivi_cache *c, size_t *n) {
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 0, NULL, n), KIVI_OK);
  unsigned char *b = malloc(*n);
  ck_assert_int_eq(kivi_cache_export_seq(c, 0, 0, b, n), KIVI_OK);
  return b;
}
static uint32_t w32(const unsigned char *p) { uint32_t u; memcpy(&u, p, 4); return u; }
static uint16_t w16(const unsigned char *p) { uint16_t u; memcpy(&u, p, 2); return u; }

START_TEST(sub_block_offsets) {
  kivi_layout l;
  /* Llama shape, 2-bit, G=32, R=128: K codes 128 tok x 8 words, 4 groups x 2 x 128 fp16, ... */
  ck_assert_int_eq(kivi_layout_init(&l, 128, 32, 32, 128, 2, 2), 0);
  ck_assert_int_eq(l.kw, 8);
  ck_assert_uint_eq(l.ksz_off, 4096);
  ck_assert_uint_eq(l.vcode_off, 4096 + 2048);
  ck_assert_uint_eq(l.vsz_off, 4096 + 2048 + 4096);
  ck_assert_uint_eq(l.sub_bytes, 12288);
  ck_assert_uint_eq(l.block_bytes, 12288u * 32);
  /* 4-bit K, 16-bit V (no V scales), D=64, G=64, R=64 */
  ck_assert_int_eq(kivi_layout_init(&l, 64, 3, 64, 64, 4, 16), 0);
  ck_assert_int_eq(l.kw, 8);
  ck_assert_int_eq(l.vw, 32);
  ck_assert_uint_eq(l.ksz_off, 64 * 8 * 4);
  ck_assert_uint_eq(l.vcode_off, 2048 + 256);
  ck_assert_uint_eq(l.sub_bytes, 2048 + 256 + 64 * 32 * 4);
}
END_TEST

/* D=32, H=1, G=R=32, 2-bit, 64 tokens: K[t][c] = t mod 4, V[t][c] = c mod 4.
 * K groups: min 0, max 3 -> scale 1, zero 0, code(t) = t mod 4 in every channel, so a word
 * (16 channels x 2 bits) is (t mod 4) * 0x55555555.  V tokens 0..31 leave the window: per token
 * one group of 32 channels with codes 0,1,2,3,... -> byte 0b11100100 = 0xe4 per 4 channels. */
START_TEST(golden_2bit) {
  kivi_context *ctx = tu_context();
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, 1, 32, 1, 64);
  cfg.residual = 32;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  float k[64 * 32], v[64 * 32];
  for (int t = 0; t < 64; ++t)
    for (int ch = 0; ch < 32; ++ch) { k[t * 32 + ch] = (float)(t % 4); v[t * 32 + ch] = (float)(ch % 4); }
  const int id = 0, n = 64;
  ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &n, k, v, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  size_t bytes;
  unsigned char *e = export_of(c, &bytes);
  /* 64x2 K words + 2 groups x 64 fp16 + 32x2 V words + 32 x {s,z} + 0 K residual + 32x32 V residual */
  ck_assert_uint_eq(bytes, 512 + 256 + 256 + 128 + 0 + 2048);
  const unsigned char *p = e;
  for (int t = 0; t < 64; ++t)
    for (int w = 0; w < 2; ++w, p += 4) ck_assert_uint_eq(w32(p), (uint32_t)(t % 4) * 0x55555555u);
  for (int g = 0; g < 2; ++g) {
    for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), H1);
    for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), H0);
  }
  for (int t = 0; t < 32; ++t)
    for (int w = 0; w < 2; ++w, p += 4) ck_assert_uint_eq(w32(p), 0xe4e4e4e4u);
  for (int t = 0; t < 32; ++t, p += 4) { ck_assert_uint_eq(w16(p), H1); ck_assert_uint_eq(w16(p + 2), H0); }
  const uint16_t vh[4] = {H0, H1, H2, H3};
  for (int t = 32; t < 64; ++t)
    for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), vh[ch % 4]);
  ck_assert_ptr_eq(p, e + bytes);
  free(e);
  kivi_cache_destroy(c);
  kivi_context_destroy(ctx);
}
END_TEST

/* D=32, H=1, G=R=32, 4-bit K and V, 40 tokens: K[t][c] = 1 + 0.5 (t mod 16) -> scale 0.5, zero 1,
 * code t mod 16, word (8 channels x 4 bits) = (t mod 16) * 0x11111111.  8 keys stay fp16.
 * V[t][c] = c mod 16: codes 0..7 -> 0x76543210, 8..15 -> 0xfedcba98; 8 values are quantized. */
START_TEST(golden_4bit) {
  kivi_context *ctx = tu_context();
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, 1, 32, 1, 64);
  cfg.residual = 32;
  cfg.k_bits = cfg.v_bits = 4;
  kivi_cache *c = NULL;
  ck_assert_int_eq(kivi_cache_create(ctx, &cfg, &c), KIVI_OK);
  float k[40 * 32], v[40 * 32];
  for (int t = 0; t < 40; ++t)
    for (int ch = 0; ch < 32; ++ch) { k[t * 32 + ch] = 1.0f + 0.5f * (float)(t % 16); v[t * 32 + ch] = (float)(ch % 16); }
  const int id = 0;
  for (int t = 0; t < 40; ++t) { /* one token at a time: the decode path */
    const int one = 1;
    ck_assert_int_eq(kivi_cache_append(c, 0, 1, &id, &one, k + t * 32, v + t * 32, KIVI_F32, KIVI_MEM_HOST), KIVI_OK);
  }
  size_t bytes;
  unsigned char *e = export_of(c, &bytes);
  ck_assert_uint_eq(bytes, 32 * 16 + 128 + 8 * 16 + 8 * 4 + 8 * 64 + 32 * 64);
  const unsigned char *p = e;
  for (int t = 0; t < 32; ++t)
    for (int w = 0; w < 4; ++w, p += 4) ck_assert_uint_eq(w32(p), (uint32_t)(t % 16) * 0x11111111u);
  for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), H05);
  for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), H1);
  for (int t = 0; t < 8; ++t)
    for (int w = 0; w < 4; ++w, p += 4) ck_assert_uint_eq(w32(p), (w % 2) ? 0xfedcba98u : 0x76543210u);
  for (int t = 0; t < 8; ++t, p += 4) { ck_assert_uint_eq(w16(p), H1); ck_assert_uint_eq(w16(p + 2), H0); }
  /* K residual: tokens 32..39 = 1 + 0.5 * (0..7): 1.0 = 0x3c00, 1.5 = 0x3e00, 2.0, 2.5 = 0x4100, ... */
  const uint16_t kr[8] = {0x3c00, 0x3e00, 0x4000, 0x4100, 0x4200, 0x4300, 0x4400, 0x4480};
  for (int t = 0; t < 8; ++t)
    for (int ch = 0; ch < 32; ++ch, p += 2) ck_assert_uint_eq(w16(p), kr[t]);
  p += 32 * 64; /* V residual: plain fp16, checked by the 2-bit golden */
  ck_assert_ptr_eq(p, e + bytes);
  free(e);
  kivi_cache_destroy(c);
  kivi_context_destroy(ctx);
}
END_TEST

int main(void) {
  Suite *s = suite_create("layout");
  TCase *tc = tcase_create("golden");
  tcase_add_test(tc, sub_block_offsets);
  tcase_add_test(tc, golden_2bit);
  tcase_add_test(tc, golden_4bit);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
