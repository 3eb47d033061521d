/* kivi_gguf_cut: writes a GGUF model cut to its first N transformer blocks, a valid GGUF that
 * the model examples load (the later blocks' tensors left out, <arch>.block_count = N, all
 * else copied byte for byte).  A model too large to carry somewhere whole can be tested there
 * on its first layers, against the same cut run elsewhere.
 *   kivi_gguf_cut MODEL.gguf OUT.gguf --layers N
 * Exit status 0: written; 1: the input is not a valid GGUF, has fewer blocks, or OUT cannot be
 * written (then OUT is removed); 2: usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "../kivi_cli.h"
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

int main(int argc, char **argv) {
  static const char usage[] = "usage: kivi_gguf_cut MODEL.gguf OUT.gguf --layers N [--help] [--version]\n"
                              "Writes MODEL cut to its first N transformer blocks, as a valid GGUF.\n";
  const char *prog = "kivi_gguf_cut";
  const int info_rc = kivi_cli_info(argc, argv, prog, PACKAGE_VERSION, usage);
  if (info_rc >= 0) return info_rc;
  const char *in = NULL, *outp = NULL;
  int layers = 0;
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--layers") && i + 1 < argc) {
      char *end;
      const long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 1 << 20) return kivi_cli_bad(prog, "bad value for --layers:", argv[i]);
      layers = (int)v;
    } else if (argv[i][0] == '-') {
      return kivi_cli_bad(prog, "unknown option, or a missing value, at", argv[i]);
    } else if (!in) {
      in = argv[i];
    } else if (!outp) {
      outp = argv[i];
    } else {
      return kivi_cli_bad(prog, "one argument too many:", argv[i]);
    }
  }
  if (!in || !outp || !layers) return kivi_cli_bad(prog, "missing", !in ? "MODEL.gguf" : !outp ? "OUT.gguf" : "--layers N");
  gguf_file f;
  char err[512];
  if (gguf_open(in, &f, err, sizeof err)) {
    fprintf(stderr, "%s: %s: %s\n", prog, in, err);
    return 1;
  }
  FILE *out = fopen(outp, "wb");
  if (!out) {
    fprintf(stderr, "%s: cannot write %s\n", prog, outp);
    gguf_close(&f);
    return 1;
  }
  int rc = gguf_write_cut(&f, layers, out, err, sizeof err);
  if (fclose(out) && !rc) {
    snprintf(err, sizeof err, "write error");
    rc = -1;
  }
  gguf_close(&f);
  if (rc) {
    fprintf(stderr, "%s: %s\n", prog, err);
    remove(outp);
    return 1;
  }
  printf("%s: %s cut to %d layers in %s\n", prog, in, layers, outp);
  return 0;
}
