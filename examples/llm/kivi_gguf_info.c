/* kivi-gguf-info: validates a GGUF model file and prints what the model examples read from it:
 * the architecture and its geometry from the metadata (layers, heads, kv-heads, head_dim, RoPE
 * base, context, vocabulary), read under the architecture's name (llama.*, qwen2.*), and the
 * tensor table (name, shape, type, bytes).
 *   kivi_gguf_info MODEL.gguf [--tensors]
 * Exit status 0: the file is valid and has the geometry keys; 1: it is not; 2: usage. */
#include <stdio.h>
#include <string.h>

#include "gguf.h"
#include "../kivi_cli.h"
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

static const char *type_name(uint32_t t) {
  switch (t) {
  case GGML_F32: return "f32";
  case GGML_F16: return "f16";
  case GGML_BF16: return "bf16";
  case GGML_Q4_0: return "q4_0";
  case GGML_Q4_1: return "q4_1";
  case GGML_Q5_0: return "q5_0";
  case GGML_Q5_1: return "q5_1";
  case GGML_Q8_0: return "q8_0";
  case GGML_Q8_1: return "q8_1";
  case GGML_Q2_K: return "q2_k";
  case GGML_Q3_K: return "q3_k";
  case GGML_Q4_K: return "q4_k";
  case GGML_Q5_K: return "q5_k";
  case GGML_Q6_K: return "q6_k";
  case GGML_Q8_K: return "q8_k";
  default: return "?";
  }
}

int main(int argc, char **argv) {
  static const char usage[] = "usage: kivi_gguf_info MODEL.gguf [--tensors] [--help] [--version]\n"
                              "Validates a GGUF file and prints its architecture, geometry (and its tensors).\n";
  const int info_rc = kivi_cli_info(argc, argv, "kivi_gguf_info", PACKAGE_VERSION, usage);
  if (info_rc >= 0) return info_rc;
  if (argc < 2) return kivi_cli_bad("kivi_gguf_info", "missing", "MODEL.gguf");
  if (argv[1][0] == '-') return kivi_cli_bad("kivi_gguf_info", "unknown option", argv[1]);
  if (argc > 3 || (argc == 3 && strcmp(argv[2], "--tensors"))) return kivi_cli_bad("kivi_gguf_info", "unknown option", argv[argc - 1]);
  gguf_file f;
  char err[512];
  if (gguf_open(argv[1], &f, err, sizeof err)) {
    fprintf(stderr, "kivi_gguf_info: %s: %s\n", argv[1], err);
    return 1;
  }
  char arch[32] = "llama"; /* general.architecture, if the file names one */
  const gguf_kv *ak = gguf_find_kv(&f, "general.architecture");
  if (ak && ak->type == GGUF_STRING) {
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | ak->val[i];
    if (n < sizeof arch) {
      memcpy(arch, ak->val + 8, n);
      arch[n] = 0;
    }
  }
  const char *names[] = {"block_count", "attention.head_count", "attention.head_count_kv", "embedding_length",
                         "feed_forward_length", "context_length"};
  int64_t v[6];
  int ok = 1;
  char key[96];
  for (int i = 0; i < 6; ++i) {
    snprintf(key, sizeof key, "%s.%s", arch, names[i]);
    if (!gguf_get_int(&f, key, &v[i])) {
      fprintf(stderr, "kivi_gguf_info: missing %s\n", key);
      ok = 0;
      v[i] = 0;
    }
  }
  double theta = 0, eps = 0;
  snprintf(key, sizeof key, "%s.rope.freq_base", arch);
  if (!gguf_get_float(&f, key, &theta)) theta = 10000.0; /* the GGUF default */
  snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
  gguf_get_float(&f, key, &eps);
  const gguf_kv *vocab = gguf_find_kv(&f, "tokenizer.ggml.tokens");
  printf("GGUF v%u, %llu metadata entries, %llu tensors, architecture %s\n", f.version, (unsigned long long)f.n_kv,
         (unsigned long long)f.n_tensors, arch);
  printf("layers %lld, heads %lld, kv-heads %lld, embedding %lld, head_dim %lld, ffn %lld, context %lld\n",
         (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3], v[1] ? (long long)(v[3] / v[1]) : 0LL,
         (long long)v[4], (long long)v[5]);
  printf("rope base %.1f, rms eps %g, vocabulary %llu tokens\n", theta, eps,
         vocab ? (unsigned long long)vocab->arr_n : 0ULL);
  uint64_t total = 0;
  for (uint64_t i = 0; i < f.n_tensors; ++i) total += f.tensors[i].nbytes;
  printf("tensor data: %.1f MB\n", (double)total / 1e6);
  if (argc == 3)
    for (uint64_t i = 0; i < f.n_tensors; ++i) {
      const gguf_tensor *t = &f.tensors[i];
      printf("  %-32.*s %-6s [%llu", (int)t->name.n, t->name.p, type_name(t->type), (unsigned long long)t->dims[0]);
      for (uint32_t d = 1; d < t->n_dims; ++d) printf(", %llu", (unsigned long long)t->dims[d]);
      printf("] %llu bytes\n", (unsigned long long)t->nbytes);
    }
  gguf_close(&f);
  return ok ? 0 : 1;
}
