/* libFuzzer harness for the GGUF reader of the model examples (`make fuzz`): any input must
 * parse or be rejected with a message; a parsed file's metadata and every tensor byte range
 * are touched, so AddressSanitizer sees any extent the validation let through. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../examples/llm/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gguf_file f;
  char err[256] = "";
  if (gguf_parse(data, size, &f, err, sizeof err) != 0) {
    if (!err[0]) abort(); /* a rejection must say why */
    return 0;
  }
  volatile uint8_t sink = 0;
  for (uint64_t i = 0; i < f.n_kv; ++i)
    if (f.kv[i].key.n) sink ^= (uint8_t)f.kv[i].key.p[f.kv[i].key.n - 1];
  for (uint64_t i = 0; i < f.n_tensors; ++i)
    if (f.tensors[i].nbytes) {
      const uint8_t *p = f.tensors[i].data;
      sink ^= p[0];
      sink ^= p[f.tensors[i].nbytes - 1];
    }
  int64_t v;
  double d;
  gguf_get_int(&f, "llama.block_count", &v);
  gguf_get_float(&f, "llama.rope.freq_base", &d);
  gguf_close(&f);
  (void)sink;
  return 0;
}
