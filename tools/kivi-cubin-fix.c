/* kivi-cubin-fix: rewrite the ELF header of CUDA >= 13 cubins embedded in a binary so that the
 * OpenMP offload runtime of LLVM < 21.1 loads them.
 *
 * Why: CUDA 13's ptxas/nvlink write cubins with e_ident[EI_OSABI] = 0x41, EI_ABIVERSION = 8 and
 * the SM number in e_flags bits 8-15.  libomptarget 19/20 only knows the older form
 * (EI_OSABI = 51, EI_ABIVERSION = 7, e_flags = sm << 16 | 0x500 | sm), reports zero devices and
 * fails with "No images found compatible with the installed hardware" (llvm-project #159088,
 * fixed in LLVM 21.1).  The driver accepts the old header on the new cubin: rewriting these
 * 10 bytes is the whole fix.  The image sits uncompressed in the .llvm.offloading section, so
 * it is patched in place; nothing else in the file moves.
 *
 *   kivi-cubin-fix --check FILE   exit 0: CUDA images found, all in the old ABI
 *                                 exit 3: at least one image in the new ABI (needs the fix)
 *                                 exit 4: no CUDA image in FILE
 *   kivi-cubin-fix FILE...        patch every new-ABI image in place; exit 4 if a FILE holds
 *                                 no CUDA image at all (the device code was lost at link time)
 * Exit 2 on I/O errors.  Build tool only: never linked into the library. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown" /* configure compiles this file alone for its probe */
#endif
#include "../examples/kivi_cli.h"

static const char usage[] =
    "usage: kivi-cubin-fix [--check] FILE...\n"
    "Rewrites the ELF header of CUDA >= 13 device images (cubins) embedded in FILE so that the\n"
    "OpenMP offload runtime of LLVM < 21.1 loads them (llvm-project #159088); run it on every\n"
    "executable or library with OpenMP target regions of its own built with CUDA 13 and LLVM 19/20.\n"
    "  --check   change nothing: exit 0 if every image is in the old ABI, 3 if one needs the fix\n"
    "Exit 4: FILE holds no CUDA image; 2: usage or I/O error.\n";

enum { EM_CUDA = 190, EI_OSABI = 7, EI_ABIVERSION = 8, E_MACHINE = 18, E_FLAGS = 48,
       OSABI_CUDA_OLD = 51, ABI_OLD = 7, ABI_NEW = 8 };

static uint32_t rd32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  unsigned char *buf = NULL;
  if (fseek(f, 0, SEEK_END) == 0) {
    long len = ftell(f);
    if (len >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) != NULL) {
      if (fread(buf, 1, (size_t)len, f) != (size_t)len) { free(buf); buf = NULL; }
      else *n = (size_t)len;
    }
  }
  fclose(f);
  return buf;
}

/* Scan for 64-bit little-endian ELF headers with e_machine == EM_CUDA. */
static int process(const char *path, int patch, int *n_old, int *n_new) {
  static const unsigned char magic[7] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
  size_t n = 0;
  unsigned char *d = slurp(path, &n);
  if (!d) { fprintf(stderr, "kivi-cubin-fix: cannot read %s\n", path); return 2; }
  FILE *out = NULL;
  int rc = 0;
  for (size_t i = 0; i + 64 <= n; ++i) {
    if (d[i] != 0x7f || memcmp(d + i, magic, sizeof magic) != 0) continue;
    if ((d[i + E_MACHINE] | d[i + E_MACHINE + 1] << 8) != EM_CUDA) continue;
    if (d[i + EI_ABIVERSION] != ABI_NEW) { ++*n_old; continue; }
    ++*n_new;
    if (!patch) continue;
    const uint32_t sm = (rd32(d + i + E_FLAGS) >> 8) & 0xff;
    const uint32_t flags = sm << 16 | 0x500 | sm;
    unsigned char hdr_abi[2] = {OSABI_CUDA_OLD, ABI_OLD};
    unsigned char hdr_flags[4] = {flags & 0xff, flags >> 8 & 0xff, flags >> 16 & 0xff, flags >> 24};
    if (!out && !(out = fopen(path, "r+b"))) { fprintf(stderr, "kivi-cubin-fix: cannot write %s\n", path); rc = 2; break; }
    if (fseek(out, (long)(i + EI_OSABI), SEEK_SET) || fwrite(hdr_abi, 1, 2, out) != 2 ||
        fseek(out, (long)(i + E_FLAGS), SEEK_SET) || fwrite(hdr_flags, 1, 4, out) != 4) {
      fprintf(stderr, "kivi-cubin-fix: write error in %s\n", path); rc = 2; break;
    }
    printf("kivi-cubin-fix: %s: image at %#zx sm_%u: CUDA-13 ELF ABI -> LLVM-19 ABI\n", path, i, sm);
  }
  if (out && fclose(out) != 0) rc = 2;
  free(d);
  return rc;
}

int main(int argc, char **argv) {
  const int info_rc = kivi_cli_info(argc, argv, "kivi-cubin-fix", PACKAGE_VERSION, usage);
  if (info_rc >= 0) return info_rc;
  int check = argc > 1 && strcmp(argv[1], "--check") == 0;
  if (argc < 2 + check) return kivi_cli_bad("kivi-cubin-fix", "missing", "FILE");
  for (int a = 1 + check; a < argc; ++a)
    if (argv[a][0] == '-') return kivi_cli_bad("kivi-cubin-fix", "unknown option", argv[a]);
  int worst = 0;
  for (int a = 1 + check; a < argc; ++a) {
    int n_old = 0, n_new = 0, rc = process(argv[a], !check, &n_old, &n_new);
    if (rc) return rc;
    if (n_old + n_new == 0) {
      fprintf(stderr, "kivi-cubin-fix: %s: no CUDA device image found\n", argv[a]);
      worst = 4;
    } else if (check && n_new > 0 && worst == 0) {
      worst = 3;
    } else if (!check) {
      printf("kivi-cubin-fix: %s: %d image(s) patched, %d already in the old ABI\n", argv[a], n_new, n_old);
    }
  }
  return worst;
}
