/* The model example's building blocks without the model file: dequantization of every ggml block
 * type kivi-run reads, against values worked out by hand from the block layouts; and the BPE
 * tokenizer on a small GGUF vocabulary written here, against encodings worked out by hand from
 * its merge list (pre-tokenization, merge order, control tokens, digits, contractions, bytes). */
#include "../examples/llm/gguf.h"
#include "../examples/llm/model.h"
#include "../examples/llm/tokenizer.h"
#include "check_util.h"

/* ---- dequantization ---- */

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

START_TEST(dequant_blocks) {
  float y[32];
  uint8_t b[40];
  /* q8_0: fp16 d = 0.5 (0x3800), int8 q = j - 16 */
  put16(b, 0x3800);
  for (int j = 0; j < 32; ++j) b[2 + j] = (uint8_t)(int8_t)(j - 16);
  ck_assert_int_eq(llm_dequantize(GGML_Q8_0, b, 32, y), 0);
  for (int j = 0; j < 32; ++j) ck_assert_float_eq(y[j], 0.5f * (float)(j - 16));
  /* q4_0: d = 1.0 (0x3C00); byte j: low nibble j (element j), high nibble 15 - j (element j + 16); (q - 8) d */
  put16(b, 0x3C00);
  for (int j = 0; j < 16; ++j) b[2 + j] = (uint8_t)(j | (15 - j) << 4);
  ck_assert_int_eq(llm_dequantize(GGML_Q4_0, b, 32, y), 0);
  for (int j = 0; j < 16; ++j) {
    ck_assert_float_eq(y[j], (float)(j - 8));
    ck_assert_float_eq(y[j + 16], (float)(15 - j - 8));
  }
  /* q4_1: d = 0.5, m = -1.0 (0xBC00); q d + m */
  put16(b, 0x3800);
  put16(b + 2, 0xBC00);
  for (int j = 0; j < 16; ++j) b[4 + j] = (uint8_t)(j | (15 - j) << 4);
  ck_assert_int_eq(llm_dequantize(GGML_Q4_1, b, 32, y), 0);
  for (int j = 0; j < 16; ++j) {
    ck_assert_float_eq(y[j], 0.5f * (float)j - 1.0f);
    ck_assert_float_eq(y[j + 16], 0.5f * (float)(15 - j) - 1.0f);
  }
  /* q5_0: d = 2.0 (0x4000); high bits qh: bit j -> element j, bit j + 16 -> element j + 16.
   * Set bits 0 and 17: element 0 = (0 | 16) - 16 = 0, element 17 = ((15 - 1) | 16) - 16 = 14. */
  put16(b, 0x4000);
  const uint32_t qh = 1u | 1u << 17;
  for (int i = 0; i < 4; ++i) b[2 + i] = (uint8_t)(qh >> (8 * i));
  for (int j = 0; j < 16; ++j) b[6 + j] = (uint8_t)(j | (15 - j) << 4);
  ck_assert_int_eq(llm_dequantize(GGML_Q5_0, b, 32, y), 0);
  ck_assert_float_eq(y[0], 0.0f);
  ck_assert_float_eq(y[1], 2.0f * (1 - 16));
  ck_assert_float_eq(y[16], 2.0f * (15 - 16));
  ck_assert_float_eq(y[17], 2.0f * 14);
  /* q5_1: d = 1.0, m = 0.5 (0x3800), the same qh: element 0 = 16 + 0.5, element 17 = 30 + 0.5 */
  put16(b, 0x3C00);
  put16(b + 2, 0x3800);
  for (int i = 0; i < 4; ++i) b[4 + i] = (uint8_t)(qh >> (8 * i));
  for (int j = 0; j < 16; ++j) b[8 + j] = (uint8_t)(j | (15 - j) << 4);
  ck_assert_int_eq(llm_dequantize(GGML_Q5_1, b, 32, y), 0);
  ck_assert_float_eq(y[0], 16.5f);
  ck_assert_float_eq(y[1], 1.5f);
  ck_assert_float_eq(y[17], 30.5f);
  /* f16 and bf16 */
  const uint16_t h[4] = {0x3C00, 0xC000, 0x0001, 0x7BFF};
  const float hv[4] = {1.0f, -2.0f, 5.9604644775390625e-8f, 65504.0f};
  for (int i = 0; i < 4; ++i) put16(b + 2 * i, h[i]);
  ck_assert_int_eq(llm_dequantize(GGML_F16, b, 4, y), 0);
  for (int i = 0; i < 4; ++i) ck_assert_float_eq(y[i], hv[i]);
  put16(b, 0x3F80);
  put16(b + 2, 0xC040);
  ck_assert_int_eq(llm_dequantize(GGML_BF16, b, 2, y), 0);
  ck_assert_float_eq(y[0], 1.0f);
  ck_assert_float_eq(y[1], -3.0f);
  /* a type kivi-run does not read */
  ck_assert_int_eq(llm_dequantize(GGML_Q2_K, b, 256, y), -1);
}
END_TEST

/* ---- tokenizer on a small vocabulary ---- */

typedef struct dbuf {
  uint8_t *b;
  size_t n, cap;
} dbuf;

static void dput(dbuf *o, const void *p, size_t n) {
  if (o->n + n > o->cap) {
    o->cap = 2 * (o->n + n);
    o->b = realloc(o->b, o->cap);
  }
  memcpy(o->b + o->n, p, n);
  o->n += n;
}
static void dint(dbuf *o, uint64_t v, int bytes) {
  uint8_t t[8];
  for (int i = 0; i < bytes; ++i) t[i] = (uint8_t)(v >> (8 * i));
  dput(o, t, (size_t)bytes);
}
static void dstr(dbuf *o, const char *s) {
  dint(o, strlen(s), 8);
  dput(o, s, strlen(s));
}

/* GPT-2 byte alphabet: byte b as the UTF-8 of its code point. */
static void byte_token(int b, char *out) {
  int cp = b, next = 256;
  const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
  if (!printable)
    for (int x = 0; x <= b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174)) cp = next++;
  if (cp < 0x80) {
    out[0] = (char)cp;
    out[1] = 0;
  } else {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    out[2] = 0;
  }
}

/* ids 0..255: the bytes; then merged tokens; then two control tokens */
static const char *MERGED[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "ld", "\xC4\xA0world"};
static const char *MERGES[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "l d",
                               "\xC4\xA0wor ld"};
enum { N_MERGED = 9, ID_HELLO = 259, ID_SP_WORLD = 264, ID_IM_START = 265, ID_IM_END = 266, N_TOKENS = 267 };

static dbuf vocab_gguf(void) {
  dbuf o = {NULL, 0, 0};
  dint(&o, 0x46554747u, 4);
  dint(&o, 3, 4);
  dint(&o, 0, 8); /* tensors */
  dint(&o, 5, 8); /* metadata */
  dstr(&o, "tokenizer.ggml.model");
  dint(&o, GGUF_STRING, 4);
  dstr(&o, "gpt2");
  dstr(&o, "tokenizer.ggml.tokens");
  dint(&o, GGUF_ARRAY, 4);
  dint(&o, GGUF_STRING, 4);
  dint(&o, N_TOKENS, 8);
  for (int b = 0; b < 256; ++b) {
    char t[4];
    byte_token(b, t);
    dstr(&o, t);
  }
  for (int i = 0; i < N_MERGED; ++i) dstr(&o, MERGED[i]);
  dstr(&o, "<|im_start|>");
  dstr(&o, "<|im_end|>");
  dstr(&o, "tokenizer.ggml.token_type");
  dint(&o, GGUF_ARRAY, 4);
  dint(&o, GGUF_INT32, 4);
  dint(&o, N_TOKENS, 8);
  for (int i = 0; i < N_TOKENS; ++i) dint(&o, i >= ID_IM_START ? 3 : 1, 4);
  dstr(&o, "tokenizer.ggml.merges");
  dint(&o, GGUF_ARRAY, 4);
  dint(&o, GGUF_STRING, 4);
  dint(&o, N_MERGED, 8);
  for (int i = 0; i < N_MERGED; ++i) dstr(&o, MERGES[i]);
  dstr(&o, "tokenizer.ggml.eos_token_id");
  dint(&o, GGUF_UINT32, 4);
  dint(&o, ID_IM_END, 4);
  while (o.n % 32) dint(&o, 0, 1); /* the (empty) data section starts aligned */
  return o;
}

static void expect(const llm_tokenizer *t, const char *text, int special, const int *want, size_t n_want) {
  int *ids = NULL;
  size_t n = 0, cap = 0;
  ck_assert_int_eq(llm_tokenize(t, text, strlen(text), special, &ids, &n, &cap), 0);
  ck_assert_msg(n == n_want, "'%s': %zu tokens, expected %zu", text, n, n_want);
  for (size_t i = 0; i < n; ++i) ck_assert_msg(ids[i] == want[i], "'%s': token %zu is %d, expected %d", text, i, ids[i], want[i]);
  free(ids);
}

START_TEST(tokenizer_small_vocabulary) {
  dbuf g = vocab_gguf();
  gguf_file f;
  char err[256];
  ck_assert_msg(gguf_parse(g.b, g.n, &f, err, sizeof err) == 0, "%s", err);
  llm_tokenizer *t = NULL;
  ck_assert_msg(llm_tokenizer_load(&f, &t, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(llm_tokenizer_vocab_size(t), N_TOKENS);
  ck_assert_int_eq(llm_tokenizer_eos(t), ID_IM_END);
  /* merges in rank order: hello = ((h e)(l l)) o; " world" = ((Ġ w)(o r))(l d) */
  expect(t, "hello world", 0, (const int[]){ID_HELLO, ID_SP_WORLD}, 2);
  /* two spaces: the first stands alone, the second joins the word */
  expect(t, "hello  world", 0, (const int[]){ID_HELLO, ' ', ID_SP_WORLD}, 3);
  /* control tokens only when asked */
  expect(t, "<|im_start|>hello<|im_end|>", 1, (const int[]){ID_IM_START, ID_HELLO, ID_IM_END}, 3);
  expect(t, "<|im_end|>", 0, (const int[]){'<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>'}, 10);
  /* every digit alone; contractions; a newline before a word is a piece of its own */
  expect(t, "a12", 0, (const int[]){'a', '1', '2'}, 3);
  expect(t, "it's", 0, (const int[]){'i', 't', '\'', 's'}, 4);
  expect(t, "\nhello", 0, (const int[]){'\n', ID_HELLO}, 2);
  /* non-ASCII letters: UTF-8 bytes through the byte alphabet */
  expect(t, "h\xC3\xA9", 0, (const int[]){'h', 0xC3, 0xA9}, 3);
  /* decode(encode(x)) == x for arbitrary bytes, invalid UTF-8 and NULs included */
  uint64_t seed = 7;
  for (int trial = 0; trial < 200; ++trial) {
    char in[64], out[256];
    const size_t n = 1 + tu_next(&seed) % 63;
    for (size_t i = 0; i < n; ++i) in[i] = (char)(tu_next(&seed) % 7 == 0 ? ' ' : tu_next(&seed));
    int *ids = NULL;
    size_t m = 0, cap = 0, len = 0;
    ck_assert_int_eq(llm_tokenize(t, in, n, 1, &ids, &m, &cap), 0);
    for (size_t i = 0; i < m; ++i) len += llm_token_bytes(t, ids[i], out + len, sizeof out - len);
    ck_assert_uint_eq(len, n);
    ck_assert_int_eq(memcmp(in, out, n), 0);
    free(ids);
  }
  /* a file without a gpt2 tokenizer is a clear error */
  gguf_file empty;
  uint8_t hdr[32] = {0x47, 0x47, 0x55, 0x46, 3};
  ck_assert_int_eq(gguf_parse(hdr, sizeof hdr, &empty, err, sizeof err), 0);
  llm_tokenizer *none = NULL;
  ck_assert_int_eq(llm_tokenizer_load(&empty, &none, err, sizeof err), -1);
  ck_assert_ptr_null(none);
  gguf_close(&empty);
  llm_tokenizer_free(t);
  gguf_close(&f);
  free(g.b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("llm");
  TCase *tc = tcase_create("llm");
  tcase_add_test(tc, dequant_blocks);
  tcase_add_test(tc, tokenizer_small_vocabulary);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
