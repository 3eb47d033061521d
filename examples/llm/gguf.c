/* Validating GGUF reader: see gguf.h.  Layout (GGUF v2/v3, little-endian):
 *   u32 magic "GGUF", u32 version, u64 tensor count, u64 metadata count,
 *   metadata: {string key, u32 type, value}..., tensor infos: {string name, u32 n_dims,
 *   u64 dims[n_dims], u32 type, u64 offset}..., padding to `general.alignment` (default 32),
 *   tensor data.  A string is u64 length + bytes; an array is u32 type + u64 count + values. */
#include "gguf.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct cursor {
  const uint8_t *p, *end;
  char *err;
  size_t errlen;
} cursor;

static int fail(cursor *c, const char *fmt, ...) {
  if (c->err && c->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static size_t left(const cursor *c) { return (size_t)(c->end - c->p); }

static int take(cursor *c, size_t n, const uint8_t **out, const char *what) {
  if (left(c) < n) return fail(c, "truncated file: %s needs %zu bytes, %zu left", what, n, left(c));
  *out = c->p;
  c->p += n;
  return 0;
}

static uint64_t rd(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static int u32(cursor *c, uint32_t *v, const char *what) {
  const uint8_t *p = NULL;
  if (take(c, 4, &p, what)) return -1;
  *v = (uint32_t)rd(p, 4);
  return 0;
}

static int u64(cursor *c, uint64_t *v, const char *what) {
  const uint8_t *p = NULL;
  if (take(c, 8, &p, what)) return -1;
  *v = rd(p, 8);
  return 0;
}

static int str(cursor *c, gguf_str *s, const char *what) {
  const uint8_t *p = NULL;
  if (u64(c, &s->n, what)) return -1;
  if (s->n > left(c)) return fail(c, "truncated file: %s of %llu bytes, %zu left", what, (unsigned long long)s->n, left(c));
  if (take(c, (size_t)s->n, &p, what)) return -1;
  s->p = (const char *)p;
  return 0;
}

/* Size in bytes of one scalar value; 0 for strings/arrays/unknown. */
static size_t scalar_size(uint32_t t) {
  switch (t) {
  case GGUF_UINT8: case GGUF_INT8: case GGUF_BOOL: return 1;
  case GGUF_UINT16: case GGUF_INT16: return 2;
  case GGUF_UINT32: case GGUF_INT32: case GGUF_FLOAT32: return 4;
  case GGUF_UINT64: case GGUF_INT64: case GGUF_FLOAT64: return 8;
  default: return 0;
  }
}

/* Skips one value of type t (arrays: elements of type et, count n). */
static int skip_value(cursor *c, uint32_t t, gguf_kv *kv) {
  const uint8_t *p = NULL;
  if (t == GGUF_STRING) {
    gguf_str s;
    return str(c, &s, "string value");
  }
  if (t == GGUF_ARRAY) {
    uint32_t et;
    uint64_t n;
    if (u32(c, &et, "array type") || u64(c, &n, "array count")) return -1;
    if (kv) {
      kv->arr_type = et;
      kv->arr_n = n;
    }
    if (et == GGUF_STRING) {
      for (uint64_t i = 0; i < n; ++i) {
        gguf_str s;
        if (str(c, &s, "string array element")) return -1;
      }
      return 0;
    }
    const size_t es = scalar_size(et);
    if (!es) return fail(c, "array of unsupported element type %u", et);
    if (n > left(c) / es) return fail(c, "truncated file: array of %llu elements", (unsigned long long)n);
    return take(c, (size_t)n * es, &p, "array");
  }
  const size_t sz = scalar_size(t);
  if (!sz) return fail(c, "unknown metadata value type %u", t);
  return take(c, sz, &p, "value");
}

uint64_t ggml_block_elems(uint32_t type) {
  switch (type) {
  case GGML_F32: case GGML_F16: case GGML_BF16: return 1;
  case GGML_Q4_0: case GGML_Q4_1: case GGML_Q5_0: case GGML_Q5_1: case GGML_Q8_0: case GGML_Q8_1: return 32;
  case GGML_Q2_K: case GGML_Q3_K: case GGML_Q4_K: case GGML_Q5_K: case GGML_Q6_K: case GGML_Q8_K: return 256;
  default: return 0;
  }
}

uint64_t ggml_block_bytes(uint32_t type) {
  switch (type) {
  case GGML_F32: return 4;
  case GGML_F16: case GGML_BF16: return 2;
  case GGML_Q4_0: return 18;
  case GGML_Q4_1: return 20;
  case GGML_Q5_0: return 22;
  case GGML_Q5_1: return 24;
  case GGML_Q8_0: return 34;
  case GGML_Q8_1: return 36;
  case GGML_Q2_K: return 84;
  case GGML_Q3_K: return 110;
  case GGML_Q4_K: return 144;
  case GGML_Q5_K: return 176;
  case GGML_Q6_K: return 210;
  case GGML_Q8_K: return 292;
  default: return 0;
  }
}

int gguf_parse(const void *data, size_t size, gguf_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  cursor c = {data, (const uint8_t *)data + size, err, errlen};
  if (!data) return fail(&c, "no data");
  f->base = data;
  f->size = size;
  uint32_t magic;
  if (u32(&c, &magic, "magic")) return -1;
  if (magic != 0x46554747u) return fail(&c, "not a GGUF file (magic %08x)", magic);
  if (u32(&c, &f->version, "version")) return -1;
  if (f->version != 2 && f->version != 3) return fail(&c, "unsupported GGUF version %u (2 and 3 are)", f->version);
  if (u64(&c, &f->n_tensors, "tensor count") || u64(&c, &f->n_kv, "metadata count")) return -1;
  /* each entry takes at least 12 (kv) / 24 (tensor) bytes: bound the counts by the file size */
  if (f->n_kv > left(&c) / 12 || f->n_tensors > left(&c) / 24)
    return fail(&c, "counts (%llu metadata, %llu tensors) do not fit in a %zu-byte file",
                (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, size);
  f->kv = calloc(f->n_kv ? (size_t)f->n_kv : 1, sizeof *f->kv);
  f->tensors = calloc(f->n_tensors ? (size_t)f->n_tensors : 1, sizeof *f->tensors);
  if (!f->kv || !f->tensors) {
    gguf_close(f);
    return fail(&c, "out of memory");
  }
  f->alignment = 32;
  for (uint64_t i = 0; i < f->n_kv; ++i) {
    gguf_kv *kv = &f->kv[i];
    if (str(&c, &kv->key, "metadata key") || u32(&c, &kv->type, "metadata type")) goto bad;
    kv->val = c.p;
    if (skip_value(&c, kv->type, kv)) goto bad;
    if (kv->key.n == 17 && !memcmp(kv->key.p, "general.alignment", 17)) {
      if (kv->type != GGUF_UINT32) { fail(&c, "general.alignment is not a u32"); goto bad; }
      f->alignment = rd(kv->val, 4);
      if (f->alignment == 0 || (f->alignment & (f->alignment - 1)) || f->alignment > 4096) {
        fail(&c, "bad general.alignment %llu", (unsigned long long)f->alignment);
        goto bad;
      }
    }
  }
  for (uint64_t i = 0; i < f->n_tensors; ++i) {
    gguf_tensor *t = &f->tensors[i];
    if (str(&c, &t->name, "tensor name") || u32(&c, &t->n_dims, "tensor n_dims")) goto bad;
    if (t->n_dims < 1 || t->n_dims > 4) { fail(&c, "tensor %llu: %u dimensions", (unsigned long long)i, t->n_dims); goto bad; }
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; ++d) {
      if (u64(&c, &t->dims[d], "tensor dimension")) goto bad;
      if (t->dims[d] == 0 || t->dims[d] > (1ull << 40) || nel > (1ull << 62) / t->dims[d]) {
        fail(&c, "tensor %.*s: bad dimension %llu", (int)(t->name.n > 64 ? 64 : t->name.n), t->name.p,
             (unsigned long long)t->dims[d]);
        goto bad;
      }
      nel *= t->dims[d];
    }
    for (uint32_t d = t->n_dims; d < 4; ++d) t->dims[d] = 1;
    if (u32(&c, &t->type, "tensor type") || u64(&c, &t->offset, "tensor offset")) goto bad;
    const uint64_t be = ggml_block_elems(t->type), bb = ggml_block_bytes(t->type);
    if (!be) { fail(&c, "tensor %.*s: unsupported type %u", (int)(t->name.n > 64 ? 64 : t->name.n), t->name.p, t->type); goto bad; }
    if (t->dims[0] % be) { fail(&c, "tensor %.*s: row of %llu not a multiple of the block size %llu", (int)(t->name.n > 64 ? 64 : t->name.n), t->name.p, (unsigned long long)t->dims[0], (unsigned long long)be); goto bad; }
    t->nbytes = nel / be * bb;
    if (t->offset % f->alignment) { fail(&c, "tensor %.*s: offset %llu not aligned", (int)(t->name.n > 64 ? 64 : t->name.n), t->name.p, (unsigned long long)t->offset); goto bad; }
  }
  {
    const size_t pos = (size_t)(c.p - (const uint8_t *)data);
    const size_t data_start = (size_t)((pos + f->alignment - 1) / f->alignment * f->alignment);
    if (data_start > size) { fail(&c, "truncated file: no tensor data section"); goto bad; }
    const uint64_t data_size = size - data_start;
    for (uint64_t i = 0; i < f->n_tensors; ++i) {
      gguf_tensor *t = &f->tensors[i];
      if (t->offset > data_size || t->nbytes > data_size - t->offset) {
        fail(&c, "tensor %.*s: bytes %llu..%llu beyond the %llu-byte data section", (int)(t->name.n > 64 ? 64 : t->name.n),
             t->name.p, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->nbytes),
             (unsigned long long)data_size);
        goto bad;
      }
      t->data = (const uint8_t *)data + data_start + t->offset;
    }
  }
  return 0;
bad:
  free(f->kv);
  free(f->tensors);
  f->kv = NULL;
  f->tensors = NULL;
  return -1;
}

int gguf_open(const char *path, gguf_file *f, char *err, size_t errlen) {
  memset(f, 0, sizeof *f);
  const int fd = open(path, O_RDONLY);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s", path);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    snprintf(err, errlen, "cannot stat %s or it is empty", path);
    return -1;
  }
  void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (m == MAP_FAILED) {
    snprintf(err, errlen, "cannot map %s", path);
    return -1;
  }
  if (gguf_parse(m, (size_t)st.st_size, f, err, errlen)) {
    munmap(m, (size_t)st.st_size);
    return -1;
  }
  f->mapped = 1;
  return 0;
}

void gguf_close(gguf_file *f) {
  if (!f) return;
  free(f->kv);
  free(f->tensors);
  if (f->mapped) munmap((void *)f->base, f->size);
  memset(f, 0, sizeof *f);
}

static int key_is(const gguf_str *s, const char *key) {
  const size_t n = strlen(key);
  return s->n == n && memcmp(s->p, key, n) == 0;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
  for (uint64_t i = 0; i < f->n_kv; ++i)
    if (key_is(&f->kv[i].key, key)) return &f->kv[i];
  return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
  for (uint64_t i = 0; i < f->n_tensors; ++i)
    if (key_is(&f->tensors[i].name, name)) return &f->tensors[i];
  return NULL;
}

int gguf_get_int(const gguf_file *f, const char *key, int64_t *out) {
  const gguf_kv *kv = gguf_find_kv(f, key);
  if (!kv) return 0;
  switch (kv->type) {
  case GGUF_UINT8: case GGUF_BOOL: *out = kv->val[0]; return 1;
  case GGUF_INT8: *out = (int8_t)kv->val[0]; return 1;
  case GGUF_UINT16: *out = (int64_t)rd(kv->val, 2); return 1;
  case GGUF_INT16: *out = (int16_t)rd(kv->val, 2); return 1;
  case GGUF_UINT32: *out = (int64_t)rd(kv->val, 4); return 1;
  case GGUF_INT32: *out = (int32_t)rd(kv->val, 4); return 1;
  case GGUF_UINT64: case GGUF_INT64: *out = (int64_t)rd(kv->val, 8); return 1;
  default: return 0;
  }
}

int gguf_get_float(const gguf_file *f, const char *key, double *out) {
  const gguf_kv *kv = gguf_find_kv(f, key);
  if (!kv) return 0;
  if (kv->type == GGUF_FLOAT32) {
    const uint32_t u = (uint32_t)rd(kv->val, 4);
    float x;
    memcpy(&x, &u, 4);
    *out = x;
    return 1;
  }
  if (kv->type == GGUF_FLOAT64) {
    const uint64_t u = rd(kv->val, 8);
    memcpy(out, &u, 8);
    return 1;
  }
  return 0;
}

int gguf_get_str_array(const gguf_file *f, const char *key, gguf_str **out, uint64_t *n) {
  const gguf_kv *kv = gguf_find_kv(f, key);
  if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != GGUF_STRING) return 0;
  gguf_str *s = malloc((kv->arr_n ? (size_t)kv->arr_n : 1) * sizeof *s);
  if (!s) return -1;
  const uint8_t *p = kv->val + 12; /* u32 element type, u64 count */
  for (uint64_t i = 0; i < kv->arr_n; ++i) {
    s[i].n = rd(p, 8);
    s[i].p = (const char *)p + 8;
    p += 8 + s[i].n;
  }
  *out = s;
  *n = kv->arr_n;
  return 1;
}

int gguf_get_array(const gguf_file *f, const char *key, uint32_t elem_type, const void **data, uint64_t *n) {
  const gguf_kv *kv = gguf_find_kv(f, key);
  if (!kv || kv->type != GGUF_ARRAY || kv->arr_type != elem_type || !scalar_size(elem_type)) return 0;
  *data = kv->val + 12;
  *n = kv->arr_n;
  return 1;
}

/* ---- writing a cut of a file (gguf.h: gguf_write_cut) ---- */

static int put(FILE *out, uint64_t v, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; ++i) b[i] = (uint8_t)(v >> (8 * i));
  return fwrite(b, 1, (size_t)bytes, out) == (size_t)bytes ? 0 : -1;
}
static int put_str(FILE *out, gguf_str s) {
  return put(out, s.n, 8) || (s.n && fwrite(s.p, 1, (size_t)s.n, out) != s.n) ? -1 : 0;
}
static int put_pad(FILE *out, uint64_t *pos, uint64_t align) {
  static const uint8_t zero[256];
  while (*pos % align) {
    const uint64_t k = align - *pos % align < sizeof zero ? align - *pos % align : sizeof zero;
    if (fwrite(zero, 1, (size_t)k, out) != k) return -1;
    *pos += k;
  }
  return 0;
}
/* The transformer block of a tensor name "blk.<i>.<rest>", or -1. */
static int64_t tensor_block(gguf_str name) {
  if (name.n < 6 || memcmp(name.p, "blk.", 4)) return -1;
  int64_t b = 0;
  uint64_t i = 4;
  for (; i < name.n && name.p[i] >= '0' && name.p[i] <= '9' && b < ((int64_t)1 << 40); ++i) b = 10 * b + (name.p[i] - '0');
  return i > 4 && i < name.n && name.p[i] == '.' ? b : -1;
}

int gguf_write_cut(const gguf_file *f, int n_layers, FILE *out, char *err, size_t errlen) {
  cursor c = {NULL, NULL, err, errlen};
  const gguf_kv *arch = gguf_find_kv(f, "general.architecture");
  if (!arch || arch->type != GGUF_STRING) return fail(&c, "no general.architecture");
  const uint64_t an = rd(arch->val, 8);
  char key[128];
  if (an > sizeof key - 16) return fail(&c, "architecture name too long");
  memcpy(key, arch->val + 8, (size_t)an);
  memcpy(key + an, ".block_count", 13);
  const gguf_kv *bc = gguf_find_kv(f, key);
  int64_t blocks = 0;
  if (!bc || !gguf_get_int(f, key, &blocks) || scalar_size(bc->type) < 4)
    return fail(&c, "no integer %s (of 4 or 8 bytes)", key);
  if (n_layers < 1 || n_layers > blocks) return fail(&c, "%d layers asked, the file has %lld", n_layers, (long long)blocks);
  uint64_t kept = 0;
  for (uint64_t i = 0; i < f->n_tensors; ++i) kept += tensor_block(f->tensors[i].name) < n_layers;
  uint64_t pos = 24;
  if (put(out, 0x46554747u, 4) || put(out, f->version, 4) || put(out, kept, 8) || put(out, f->n_kv, 8)) goto io;
  for (uint64_t i = 0; i < f->n_kv; ++i) { /* each entry as it is, block_count set */
    const gguf_kv *kv = &f->kv[i];
    cursor v = {kv->val, f->base + f->size, err, errlen};
    if (skip_value(&v, kv->type, NULL)) return -1; /* (validated by the parser: cannot fail) */
    const size_t vn = (size_t)(v.p - kv->val);
    if (put_str(out, kv->key) || put(out, kv->type, 4)) goto io;
    if (kv == bc) {
      if (put(out, (uint64_t)n_layers, (int)scalar_size(kv->type))) goto io;
    } else if (fwrite(kv->val, 1, vn, out) != vn) {
      goto io;
    }
    pos += 8 + kv->key.n + 4 + vn;
  }
  uint64_t off = 0; /* the kept tensors' data offsets, each aligned */
  for (uint64_t i = 0; i < f->n_tensors; ++i) {
    const gguf_tensor *t = &f->tensors[i];
    if (tensor_block(t->name) >= n_layers) continue;
    off = (off + f->alignment - 1) / f->alignment * f->alignment;
    if (put_str(out, t->name) || put(out, t->n_dims, 4)) goto io;
    for (uint32_t d = 0; d < t->n_dims; ++d)
      if (put(out, t->dims[d], 8)) goto io;
    if (put(out, t->type, 4) || put(out, off, 8)) goto io;
    pos += 8 + t->name.n + 4 + 8ull * t->n_dims + 12;
    off += t->nbytes;
  }
  if (put_pad(out, &pos, f->alignment)) goto io;
  uint64_t dpos = 0;
  for (uint64_t i = 0; i < f->n_tensors; ++i) {
    const gguf_tensor *t = &f->tensors[i];
    if (tensor_block(t->name) >= n_layers) continue;
    if (put_pad(out, &dpos, f->alignment) || fwrite(t->data, 1, (size_t)t->nbytes, out) != t->nbytes) goto io;
    dpos += t->nbytes;
  }
  return 0;
io:
  return fail(&c, "write error");
}
