/* The model example's building blocks without the model file: dequantization of every ggml block
 * type kivi-run reads, against values worked out by hand from the block layouts; and the BPE
 * tokenizer on a small GGUF vocabulary written here, against encodings worked out by hand from
 * its merge list (pre-tokenization, merge order, control tokens, digits, contractions, bytes). */
#include "../../examples/llm/gguf.h"
#include "../../examples/llm/model.h"
#include "../../examples/llm/tokenizer.h"
#include "../check_util.h"

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

/* The K-quants' super-blocks of 256 elements (ggml-common.h's block_q4_K and block_q6_K), one
 * block each with every field set by hand. */
START_TEST(dequant_k_blocks) {
  float y[256];
  uint8_t b[210];
  /* q4_K: d = 1 (0x3C00), dmin = 0.5 (0x3800); 12 scale bytes give sub-block scales sc and mins mn:
   * j < 4 the low 6 bits of bytes j and j + 4; j >= 4 a nibble of byte j + 4 with the top 2 bits
   * of bytes j - 4 (scale) and j (min) as bits 4-5.  Bytes: 0x41 (sc0 1, sc4 gets 16), 2, 3, 4;
   * 5, 0x80 (mn1 0, mn5 gets 32), 0, 0; 0x23 (sc4 3 + 16 = 19, mn4 2), 0x17 (sc5 7, mn5 1 + 32),
   * 0 (sc6 0, mn6 0), 0xFF (sc7 15, mn7 15). */
  const uint8_t sc4[12] = {0x41, 2, 3, 4, 5, 0x80, 0, 0, 0x23, 0x17, 0, 0xFF};
  const float sc[8] = {1, 2, 3, 4, 19, 7, 0, 15}, mn[8] = {5, 0, 0, 0, 2, 33, 0, 15};
  put16(b, 0x3C00);
  put16(b + 2, 0x3800);
  memcpy(b + 4, sc4, 12);
  /* 128 bytes of nibbles: 32-byte chunk c holds sub-block 2c in its low nibbles and 2c + 1 in its
   * high ones; byte l of a chunk: low l % 16, high 15 - l % 16 */
  for (int i = 0; i < 128; ++i) b[16 + i] = (uint8_t)((i & 15) | (15 - (i & 15)) << 4);
  ck_assert_int_eq(llm_dequantize(GGML_Q4_K, b, 256, y), 0);
  for (int j = 0; j < 8; ++j)
    for (int l = 0; l < 32; ++l) {
      const int q = j & 1 ? 15 - l % 16 : l % 16;
      ck_assert_float_eq(y[32 * j + l], sc[j] * (float)q - 0.5f * mn[j]);
    }
  ck_assert_float_eq(y[3], 0.5f);      /* 1 x 3 - 0.5 x 5 */
  ck_assert_float_eq(y[128 + 5], 94.0f);   /* sub-block 4: 19 x 5 - 0.5 x 2 */
  ck_assert_float_eq(y[160 + 5], 53.5f);   /* sub-block 5: 7 x 10 - 0.5 x 33 */
  ck_assert_float_eq(y[224 + 20], 157.5f); /* sub-block 7: 15 x 11 - 0.5 x 15 */
  /* q6_K: ql[128] low nibbles, qh[64] 2 high bits, 16 int8 scales, fp16 d = 0.25 (0x3400) last.
   * ql[i] = i; qh = 0xE4 everywhere (bits 2k..2k+1 = k); scale i = +(i + 1) for even i, -(i + 1)
   * for odd.  Element 32 k + l of half h: 4 bits from ql[64 h + l + 32 (k & 1)] (low nibble for
   * k < 2, high for k >= 2), high bits k, scale 8 h + 2 k + l / 16; x = d scale (q - 32). */
  for (int i = 0; i < 128; ++i) b[i] = (uint8_t)i;
  for (int i = 0; i < 64; ++i) b[128 + i] = 0xE4;
  for (int i = 0; i < 16; ++i) b[192 + i] = (uint8_t)(int8_t)(i % 2 ? -(i + 1) : i + 1);
  put16(b + 208, 0x3400);
  ck_assert_int_eq(llm_dequantize(GGML_Q6_K, b, 256, y), 0);
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int byte = 64 * h + l + 32 * (k & 1), lo = k < 2 ? byte & 15 : byte >> 4, si = 8 * h + 2 * k + l / 16;
        const float scale = (float)(si % 2 ? -(si + 1) : si + 1);
        ck_assert_float_eq(y[128 * h + 32 * k + l], 0.25f * scale * (float)((lo | k << 4) - 32));
      }
  ck_assert_float_eq(y[5], -6.75f);         /* ql[5] = 5, high bits 0: q = -27, scale 1 */
  ck_assert_float_eq(y[128 + 96 + 20], -92.0f); /* ql[116] >> 4 = 7, high bits 3: q = 23, scale -16 */
  /* a length that is not whole super-blocks */
  ck_assert_int_eq(llm_dequantize(GGML_Q4_K, b, 32, y), -1);
  ck_assert_int_eq(llm_dequantize(GGML_Q6_K, b, 128, y), -1);
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

/* ids 0..255: the bytes; then merged tokens; then two control tokens; then tokens that only
 * Qwen2's pre-tokenizer can make, its pieces crossing the SmolLM2 pieces' borders: "(hello",
 * ".\n" (\n is U+010A in the byte alphabet), "'S", "\thello" (\t is U+0109) */
static const char *MERGED[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor", "ld", "\xC4\xA0world"};
static const char *MERGES[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r", "\xC4\xA0w or", "l d",
                               "\xC4\xA0wor ld", "( hello", ". \xC4\x8A", "' S", "\xC4\x89 hello"};
static const char *CROSSING[] = {"(hello", ".\xC4\x8A", "'S", "\xC4\x89hello"};
enum {
  N_MERGED = 9, ID_HELLO = 259, ID_SP_WORLD = 264, ID_IM_START = 265, ID_IM_END = 266, ID_PAREN_HELLO = 267,
  ID_DOT_NL = 268, ID_APOS_S = 269, ID_TAB_HELLO = 270, N_TOKENS = 271, N_MERGES = 13
};

/* pre: tokenizer.ggml.pre (NULL: none); tmpl: tokenizer.chat_template (NULL: none) */
static dbuf vocab_gguf(const char *pre, const char *tmpl) {
  dbuf o = {NULL, 0, 0};
  dint(&o, 0x46554747u, 4);
  dint(&o, 3, 4);
  dint(&o, 0, 8); /* tensors */
  dint(&o, 5 + (pre != NULL) + (tmpl != NULL), 8); /* metadata */
  if (pre) {
    dstr(&o, "tokenizer.ggml.pre");
    dint(&o, GGUF_STRING, 4);
    dstr(&o, pre);
  }
  if (tmpl) {
    dstr(&o, "tokenizer.chat_template");
    dint(&o, GGUF_STRING, 4);
    dstr(&o, tmpl);
  }
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
  for (int i = 0; i < 4; ++i) dstr(&o, CROSSING[i]);
  dstr(&o, "tokenizer.ggml.token_type");
  dint(&o, GGUF_ARRAY, 4);
  dint(&o, GGUF_INT32, 4);
  dint(&o, N_TOKENS, 8);
  for (int i = 0; i < N_TOKENS; ++i) dint(&o, i == ID_IM_START || i == ID_IM_END ? 3 : 1, 4);
  dstr(&o, "tokenizer.ggml.merges");
  dint(&o, GGUF_ARRAY, 4);
  dint(&o, GGUF_STRING, 4);
  dint(&o, N_MERGES, 8);
  for (int i = 0; i < N_MERGES; ++i) dstr(&o, MERGES[i]);
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
  dbuf g = vocab_gguf(NULL, NULL);
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
  /* SmolLM2's pieces never cross where Qwen2's do (tokenizer_qwen2) */
  expect(t, "(hello", 0, (const int[]){'(', ID_HELLO}, 2);
  expect(t, "end.\nhello", 0, (const int[]){'e', 'n', 'd', '.', '\n', ID_HELLO}, 6);
  expect(t, "it'S", 0, (const int[]){'i', 't', '\'', 'S'}, 4);
  expect(t, "\thello", 0, (const int[]){'\t', ID_HELLO}, 2);
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

/* Qwen2's pre-tokenizer (tokenizer.ggml.pre = "qwen2") on the same vocabulary: one character that
 * is not a letter, digit or line break joins the letters after it, punctuation takes the line
 * breaks after it, contractions in any case; and the chat template's default system message. */
START_TEST(tokenizer_qwen2) {
  static const char sys[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
  /* as Qwen2.5's template has it: a system header followed by an expression first (not a
   * default), then the default in a Jinja string literal (its newlines as backslash-n) */
  static const char tmpl[] = "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- else %}{{- '<|im_start|>system\\n"
                             "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
                             "{%- endif %}";
  dbuf g = vocab_gguf("qwen2", tmpl);
  gguf_file f;
  char err[256];
  ck_assert_msg(gguf_parse(g.b, g.n, &f, err, sizeof err) == 0, "%s", err);
  llm_tokenizer *t = NULL;
  ck_assert_msg(llm_tokenizer_load(&f, &t, err, sizeof err) == 0, "%s", err);
  expect(t, "hello world", 0, (const int[]){ID_HELLO, ID_SP_WORLD}, 2);
  expect(t, "hello  world", 0, (const int[]){ID_HELLO, ' ', ID_SP_WORLD}, 3);
  expect(t, "(hello", 0, (const int[]){ID_PAREN_HELLO}, 1);
  expect(t, "((hello", 0, (const int[]){'(', '(', ID_HELLO}, 3); /* "((" is one piece, then "hello" */
  expect(t, "end.\nhello", 0, (const int[]){'e', 'n', 'd', ID_DOT_NL, ID_HELLO}, 5);
  expect(t, "it'S", 0, (const int[]){'i', 't', ID_APOS_S}, 3);
  expect(t, "\thello", 0, (const int[]){ID_TAB_HELLO}, 1);
  expect(t, "a12", 0, (const int[]){'a', '1', '2'}, 3);
  expect(t, " \n\nhello", 0, (const int[]){' ', '\n', '\n', ID_HELLO}, 4);
  /* the chat prompt's default system message is the template's */
  int *a = NULL, *b = NULL;
  size_t na = 0, nb = 0, ca = 0, cb = 0;
  ck_assert_int_eq(llm_chat_prompt(t, NULL, "hello", &a, &na, &ca), 0);
  ck_assert_int_eq(llm_chat_prompt(t, sys, "hello", &b, &nb, &cb), 0);
  ck_assert_uint_eq(na, nb);
  ck_assert_int_eq(memcmp(a, b, na * sizeof *a), 0);
  free(a);
  free(b);
  llm_tokenizer_free(t);
  gguf_close(&f);
  free(g.b);
  /* a pre-tokenizer it does not have is a clear error */
  g = vocab_gguf("llama-bpe", NULL);
  ck_assert_msg(gguf_parse(g.b, g.n, &f, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(llm_tokenizer_load(&f, &t, err, sizeof err), -1);
  ck_assert_ptr_nonnull(strstr(err, "llama-bpe"));
  gguf_close(&f);
  free(g.b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("llm");
  TCase *tc = tcase_create("llm");
  tcase_add_test(tc, dequant_blocks);
  tcase_add_test(tc, dequant_k_blocks);
  tcase_add_test(tc, tokenizer_small_vocabulary);
  tcase_add_test(tc, tokenizer_qwen2);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
