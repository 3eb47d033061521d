/* The command-line conventions of every libkivi-omp program (tools, examples, benchmark):
 *  - --help (or -h) prints the usage on stdout and exits 0;
 *  - --version prints "PROGRAM (libkivi-omp) VERSION" and exits 0;
 *  - a usage error names the option or value at fault on stderr and exits 2;
 *  - long runs print progress on stderr and flush each table line as it is written. */
#ifndef KIVI_CLI_H
#define KIVI_CLI_H

#include <stdio.h>
#include <string.h>

/* The start of every program: stdout line-buffered (tables appear as they are written, also
 * into a pipe), then --help / --version anywhere on the command line: prints, and returns 0
 * (the exit status); -1 when neither is there.  version: the library's
 * (kivi_version_string()), or the package's for a program that does not link the library. */
static inline int kivi_cli_info(int argc, char **argv, const char *prog, const char *version, const char *usage) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(usage, stdout);
      return 0;
    }
    if (!strcmp(argv[i], "--version")) {
      printf("%s (libkivi-omp) %s\n", prog, version);
      return 0;
    }
  }
  return -1;
}

/* A usage error: "PROG: WHAT 'ARG' (PROG --help lists the options)"; returns 2. */
static inline int kivi_cli_bad(const char *prog, const char *what, const char *arg) {
  fprintf(stderr, "%s: %s '%s' (%s --help lists the options)\n", prog, what, arg ? arg : "", prog);
  return 2;
}

#endif
