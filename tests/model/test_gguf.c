/* The GGUF reader of the model examples (examples/llm/gguf.c): a valid file written here is read
 * back field by field; truncated and corrupted files (every truncation, targeted corruptions,
 * and deterministic random byte flips) are rejected with a message, never a crash (the CI
 * sanitizer job runs this suite under AddressSanitizer). */
#include <unistd.h>

#include "../../examples/llm/gguf.h"
#include "../check_util.h"

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

/* GGUF v3, alignment 64 (general.alignment), block_count 3: tensors "token_embd.weight" (F32 5),
 * "blk.0.a" (F32 3), "blk.2.a" (F16 4), "blk.1.a" (F32 2), "blk.10x" (not a block tensor: no dot
 * after the number), "output.weight" (F32 1); element i of tensor k holds 10 k + i. */
static void build_layers(wbuf *o) {
  static const char *names[] = {"token_embd.weight", "blk.0.a", "blk.2.a", "blk.1.a", "blk.10x", "output.weight"};
  static const int len[] = {5, 3, 4, 2, 1, 1};
  o->n = 0;
  w(o, 0x46554747u, 4);
  w(o, 3, 4);
  w(o, 6, 8);
  w(o, 3, 8);
  ws(o, "general.architecture");
  w(o, GGUF_STRING, 4);
  ws(o, "llama");
  ws(o, "general.alignment");
  w(o, GGUF_UINT32, 4);
  w(o, 64, 4);
  ws(o, "llama.block_count");
  w(o, GGUF_UINT32, 4);
  w(o, 3, 4);
  uint64_t off = 0;
  for (int k = 0; k < 6; ++k) {
    ws(o, names[k]);
    w(o, 1, 4);
    w(o, (uint64_t)len[k], 8);
    w(o, k == 2 ? GGML_F16 : GGML_F32, 4);
    w(o, off, 8);
    off = (off + (uint64_t)len[k] * (k == 2 ? 2 : 4) + 63) / 64 * 64;
  }
  while (o->n % 64) o->b[o->n++] = 0;
  const size_t data = o->n;
  off = 0;
  for (int k = 0; k < 6; ++k) {
    while (o->n < data + off) o->b[o->n++] = 0;
    for (int i = 0; i < len[k]; ++i) w(o, (uint64_t)(10 * k + i), k == 2 ? 2 : 4);
    off = (off + (uint64_t)len[k] * (k == 2 ? 2 : 4) + 63) / 64 * 64;
  }
}

/* gguf_write_cut: the cut parses, has the first N blocks' tensors and the others with their
 * bytes, block_count N and every other entry unchanged; bad layer counts are refused. */
START_TEST(cut_to_first_layers) {
  wbuf o;
  build_layers(&o);
  gguf_file f, g;
  char err[256];
  ck_assert_msg(gguf_parse(o.b, o.n, &f, err, sizeof err) == 0, "%s", err);
  for (int n = 1; n <= 3; ++n) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(m);
    ck_assert_msg(gguf_write_cut(&f, n, m, err, sizeof err) == 0, "%s", err);
    fclose(m);
    ck_assert_msg(gguf_parse(buf, len, &g, err, sizeof err) == 0, "cut to %d: %s", n, err);
    int64_t v = 0;
    ck_assert(gguf_get_int(&g, "llama.block_count", &v));
    ck_assert_int_eq(v, n);
    ck_assert(gguf_get_int(&g, "general.alignment", &v));
    ck_assert_int_eq(v, 64);
    ck_assert_uint_eq(g.n_kv, 3);
    ck_assert_uint_eq(g.n_tensors, 3 + (uint64_t)n);
    const char *blk[3] = {"blk.0.a", "blk.1.a", "blk.2.a"};
    for (int b = 0; b < 3; ++b) ck_assert((gguf_find_tensor(&g, blk[b]) != NULL) == (b < n));
    for (uint64_t k = 0; k < f.n_tensors; ++k) { /* every kept tensor: same shape, type and bytes */
      const gguf_tensor *a = &f.tensors[k], *c = NULL;
      for (uint64_t j = 0; j < g.n_tensors; ++j)
        if (g.tensors[j].name.n == a->name.n && !memcmp(g.tensors[j].name.p, a->name.p, a->name.n)) c = &g.tensors[j];
      if (!c) continue;
      ck_assert_uint_eq(c->type, a->type);
      ck_assert_uint_eq(c->dims[0], a->dims[0]);
      ck_assert_uint_eq(c->nbytes, a->nbytes);
      ck_assert_uint_eq(c->offset % 64, 0);
      ck_assert(!memcmp(c->data, a->data, a->nbytes));
    }
    ck_assert_ptr_nonnull(gguf_find_tensor(&g, "blk.10x"));
    gguf_close(&g);
    free(buf);
  }
  FILE *m = fopen("/dev/null", "wb");
  ck_assert_ptr_nonnull(m);
  ck_assert_int_ne(gguf_write_cut(&f, 0, m, err, sizeof err), 0);
  ck_assert_int_ne(gguf_write_cut(&f, 4, m, err, sizeof err), 0);
  printf("cut to 4 of 3 layers refused: %s\n", err);
  fclose(m);
  gguf_close(&f);
  build(&o); /* block_count 30 but no block tensors: a cut keeps every tensor */
  ck_assert_msg(gguf_parse(o.b, o.n, &f, err, sizeof err) == 0, "%s", err);
  char *buf = NULL;
  size_t len = 0;
  m = open_memstream(&buf, &len);
  ck_assert_int_eq(gguf_write_cut(&f, 2, m, err, sizeof err), 0);
  fclose(m);
  ck_assert_msg(gguf_parse(buf, len, &g, err, sizeof err) == 0, "%s", err);
  ck_assert_uint_eq(g.n_tensors, 2);
  const gguf_kv *ta = gguf_find_kv(&f, "tokenizer.ggml.tokens"), *tb = gguf_find_kv(&g, "tokenizer.ggml.tokens");
  ck_assert_ptr_nonnull(tb);
  ck_assert_uint_eq(tb->arr_n, 3);
  ck_assert(!memcmp(ta->val, tb->val, 4 + 8 + 3 * 8 + 1 + 2 + 3)); /* the array as written */
  double base = 0;
  ck_assert(gguf_get_float(&g, "llama.rope.freq_base", &base) && base == 10000.0);
  gguf_close(&g);
  gguf_close(&f);
  free(buf);
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
  tcase_add_test(tc, cut_to_first_layers);
  suite_add_tcase(s, tc);
  return tu_run(s);
}
