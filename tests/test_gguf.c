/* The GGUF reader of the model examples (examples/llm/gguf.c): a valid file written here is read
 * back field by field; truncated and corrupted files (every truncation, targeted corruptions,
 * and deterministic random byte flips) are rejected with a message, never a crash (the CI
 * sanitizer job runs this suite under AddressSanitizer). */
#include <unistd.h>

#include "../examples/llm/gguf.h"
#include "check_util.h"

typedef struct wbuf {
  uint8_t b[4096];
  size_t n;
} wbuf;

static void w(wbuf *o, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) o->b[o->n++] = (uint8_t)(v >> (8 * i));
}
static void ws(wbuf *o, const char *s) {
  w(o, strlen(s), 8);
  memcpy(o->b + o->n, s, strlen(s));
  o->n += strlen(s);
}

/* Offsets of fields the corruption tests patch. */
static size_t off_ntensors, off_kv_type, off_ndims, off_dim0, off_ttype, off_toff, off_strlen;

/* GGUF v3: 4 metadata entries, tensors "tok" (F32 4x3, offset 0) and "w" (Q4_1 64x2, offset 64). */
static void build(wbuf *o) {
  o->n = 0;
  w(o, 0x46554747u, 4);
  w(o, 3, 4);
  off_ntensors = o->n;
  w(o, 2, 8);
  w(o, 4, 8);
  ws(o, "general.architecture");
  off_kv_type = o->n;
  w(o, GGUF_STRING, 4);
  off_strlen = o->n;
  ws(o, "llama");
  ws(o, "llama.block_count");
  w(o, GGUF_UINT32, 4);
  w(o, 30, 4);
  ws(o, "llama.rope.freq_base");
  w(o, GGUF_FLOAT32, 4);
  const float fb = 10000.0f;
  uint32_t u;
  memcpy(&u, &fb, 4);
  w(o, u, 4);
  ws(o, "tokenizer.ggml.tokens");
  w(o, GGUF_ARRAY, 4);
  w(o, GGUF_STRING, 4);
  w(o, 3, 8);
  ws(o, "a");
  ws(o, "bb");
  ws(o, "ccc");
  ws(o, "tok");
  off_ndims = o->n;
  w(o, 2, 4);
  off_dim0 = o->n;
  w(o, 4, 8);
  w(o, 3, 8);
  off_ttype = o->n;
  w(o, GGML_F32, 4);
  w(o, 0, 8);
  ws(o, "w");
  w(o, 2, 4);
  w(o, 64, 8);
  w(o, 2, 8);
  w(o, GGML_Q4_1, 4);
  off_toff = o->n;
  w(o, 64, 8);
  while (o->n % 32) o->b[o->n++] = 0; /* data section */
  const size_t data = o->n;
  for (int i = 0; i < 12; ++i) {
    const float x = (float)i * 0.5f;
    memcpy(&u, &x, 4);
    w(o, u, 4);
  }
  while (o->n < data + 64) o->b[o->n++] = 0;
  for (int i = 0; i < 80; ++i) o->b[o->n++] = (uint8_t)i; /* 4 Q4_1 blocks */
}

static int parses(const uint8_t *b, size_t n) {
  gguf_file f;
  char err[256] = "";
  const int rc = gguf_parse(b, n, &f, err, sizeof err);
  if (rc == 0) gguf_close(&f);
  else ck_assert_msg(err[0] != '\0', "a rejection without a message");
  return rc == 0;
}

START_TEST(valid_file_read_back) {
  wbuf o;
  build(&o);
  gguf_file f;
  char err[256];
  ck_assert_msg(gguf_parse(o.b, o.n, &f, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(f.version, 3);
  ck_assert_uint_eq(f.n_kv, 4);
  ck_assert_uint_eq(f.n_tensors, 2);
  int64_t blocks = 0;
  double base = 0;
  ck_assert(gguf_get_int(&f, "llama.block_count", &blocks));
  ck_assert_int_eq(blocks, 30);
  ck_assert(gguf_get_float(&f, "llama.rope.freq_base", &base));
  ck_assert(base == 10000.0);
  ck_assert(!gguf_get_int(&f, "missing.key", &blocks));
  const gguf_kv *arch = gguf_find_kv(&f, "general.architecture");
  ck_assert_ptr_nonnull(arch);
  ck_assert_uint_eq(arch->type, GGUF_STRING);
  const gguf_kv *toks = gguf_find_kv(&f, "tokenizer.ggml.tokens");
  ck_assert_ptr_nonnull(toks);
  ck_assert_uint_eq(toks->arr_type, GGUF_STRING);
  ck_assert_uint_eq(toks->arr_n, 3);
  const gguf_tensor *tok = gguf_find_tensor(&f, "tok"), *wt = gguf_find_tensor(&f, "w");
  ck_assert_ptr_nonnull(tok);
  ck_assert_ptr_nonnull(wt);
  ck_assert_uint_eq(tok->nbytes, 48);
  ck_assert_uint_eq(wt->nbytes, 80);
  ck_assert_uint_eq(wt->dims[0], 64);
  ck_assert_uint_eq(wt->dims[1], 2);
  float x;
  memcpy(&x, (const uint8_t *)tok->data + 4 * 5, 4);
  ck_assert(x == 2.5f);
  ck_assert_uint_eq(((const uint8_t *)wt->data)[79], 79);
  gguf_close(&f);
}
END_TEST

START_TEST(every_truncation_rejected) {
  wbuf o;
  build(&o);
  for (size_t n = 0; n < o.n; ++n) ck_assert_msg(!parses(o.b, n), "truncated to %zu bytes accepted", n);
  ck_assert(parses(o.b, o.n));
}
END_TEST

START_TEST(targeted_corruptions_rejected) {
  struct { size_t *off; uint64_t val; int bytes; } cases[] = {
      {NULL, 0x46554746u, 4},      /* magic */
      {NULL, 1, 4},                /* version (offset 4) */
      {&off_ntensors, 1ull << 60, 8},
      {&off_kv_type, 99, 4},       /* unknown value type */
      {&off_strlen, 1ull << 50, 8},/* string longer than the file */
      {&off_ndims, 5, 4},
      {&off_dim0, 0, 8},
      {&off_dim0, 1000, 8},        /* F32 4x3 -> 1000x3: past the data */
      {&off_ttype, 77, 4},         /* unknown tensor type */
      {&off_toff, 65, 8},          /* misaligned */
      {&off_toff, 1 << 20, 8},     /* beyond the data */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    wbuf o;
    build(&o);
    const size_t at = cases[i].off ? *cases[i].off : (i == 0 ? 0 : 4);
    for (int b = 0; b < cases[i].bytes; ++b) o.b[at + b] = (uint8_t)(cases[i].val >> (8 * b));
    ck_assert_msg(!parses(o.b, o.n), "corruption %zu accepted", i);
  }
}
END_TEST

START_TEST(random_flips_never_crash) {
  wbuf o, c;
  build(&o);
  uint64_t s = 2026;
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    c = o;
    const int flips = 1 + (int)(tu_next(&s) % 4);
    for (int k = 0; k < flips; ++k) c.b[tu_next(&s) % c.n] ^= (uint8_t)(1u << (tu_next(&s) % 8));
    accepted += parses(c.b, c.n); /* either way: no crash, no out-of-bounds read (ASan in CI) */
  }
  printf("random flips: %d of 20000 variants still parse (flips inside tensor data)\n", accepted);
}
END_TEST

START_TEST(open_files) {
  wbuf o;
  build(&o);
  char path[] = "/tmp/kivi-gguf-XXXXXX";
  const int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, o.b, o.n), (ssize_t)o.n);
  close(fd);
  gguf_file f;
  char err[256];
  ck_assert_msg(gguf_open(path, &f, err, sizeof err) == 0, "%s", err);
  ck_assert_ptr_nonnull(gguf_find_tensor(&f, "w"));
  gguf_close(&f);
  truncate(path, 100);
  ck_assert_int_ne(gguf_open(path, &f, err, sizeof err), 0);
  printf("truncated file rejected: %s\n", err);
  remove(path);
  ck_assert_int_ne(gguf_open(path, &f, err, sizeof err), 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gguf");
  TCase *tc = tcase_create("gguf");
  tcase_add_test(tc, valid_file_read_back);
  tcase_add_test(tc, every_truncation_rejected);
  tcase_add_test(tc, targeted_corruptions_rejected);
  tcase_add_test(tc, random_flips_never_crash);
  tcase_add_test(tc, open_files);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
