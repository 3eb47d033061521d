/* A validating GGUF reader (versions 2 and 3) for the model examples: the file is mapped (or
 * given as a buffer), every length, count, type, offset and tensor extent is checked against
 * the file size before use, and a malformed file is a clear error message, never a crash.
 * Values point into the mapping; nothing is copied. */
#ifndef KIVI_EXAMPLES_GGUF_H
#define KIVI_EXAMPLES_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum gguf_type { /* metadata value types */
  GGUF_UINT8 = 0, GGUF_INT8 = 1, GGUF_UINT16 = 2, GGUF_INT16 = 3, GGUF_UINT32 = 4, GGUF_INT32 = 5,
  GGUF_FLOAT32 = 6, GGUF_BOOL = 7, GGUF_STRING = 8, GGUF_ARRAY = 9, GGUF_UINT64 = 10, GGUF_INT64 = 11,
  GGUF_FLOAT64 = 12
};

enum ggml_type { /* tensor element types this reader knows the sizes of */
  GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
  GGML_Q8_1 = 9, GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14,
  GGML_Q8_K = 15, GGML_BF16 = 30
};

typedef struct gguf_str {
  const char *p; /* not NUL-terminated */
  uint64_t n;
} gguf_str;

typedef struct gguf_kv {
  gguf_str key;
  uint32_t type;      /* enum gguf_type */
  const uint8_t *val; /* the raw value (little-endian); for strings: the gguf string */
  uint32_t arr_type;  /* GGUF_ARRAY: element type */
  uint64_t arr_n;     /* GGUF_ARRAY: element count */
} gguf_kv;

typedef struct gguf_tensor {
  gguf_str name;
  uint32_t n_dims;
  uint64_t dims[4];
  uint32_t type; /* enum ggml_type */
  uint64_t offset, nbytes;
  const void *data;
} gguf_tensor;

typedef struct gguf_file {
  uint32_t version;
  uint64_t n_kv, n_tensors;
  gguf_kv *kv;
  gguf_tensor *tensors;
  uint64_t alignment;
  const uint8_t *base;
  size_t size;
  int mapped;
} gguf_file;

/* 0 on success; otherwise -1 and a message in err. */
int gguf_parse(const void *data, size_t size, gguf_file *f, char *err, size_t errlen);
int gguf_open(const char *path, gguf_file *f, char *err, size_t errlen);
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);
/* Scalar metadata as integer / float (any integer / float type); 0 if absent or of another kind. */
int gguf_get_int(const gguf_file *f, const char *key, int64_t *out);
int gguf_get_float(const gguf_file *f, const char *key, double *out);
/* Arrays (already validated by the parser): the elements of a string array, copied into a new
 * array of views (free it with free()), or the raw little-endian elements of a scalar array of
 * type elem_type.  0 if the key is absent or of another type, -1 if out of memory. */
int gguf_get_str_array(const gguf_file *f, const char *key, gguf_str **out, uint64_t *n);
int gguf_get_array(const gguf_file *f, const char *key, uint32_t elem_type, const void **data, uint64_t *n);
/* Writes to out a copy of f cut to its first n_layers transformer blocks: the tensors named
 * "blk.<i>.*" with i >= n_layers are left out and "<arch>.block_count" becomes n_layers; every
 * other metadata entry and tensor is copied byte for byte (tensor data aligned to the file's
 * alignment).  0, or -1 with a message in err (n_layers outside 1..block_count, no integer
 * block_count, a write error). */
int gguf_write_cut(const gguf_file *f, int n_layers, FILE *out, char *err, size_t errlen);
/* Block size (elements) and bytes per block of a tensor type; 0 for an unknown type. */
uint64_t ggml_block_elems(uint32_t type);
uint64_t ggml_block_bytes(uint32_t type);

#endif
