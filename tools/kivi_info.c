/* kivi-info: what a user runs first on a new node.  Prints the library's version and build,
 * the OpenMP devices it sees and where work runs, then checks each device:
 *   1. the self-test kernel (a reduction checked against the host);
 *   2. a cache of one fp16 token attends to itself: the output must be that token's V exactly;
 *   3. 300 tokens appended to a 2-bit cache on the device give the same packed bytes as on host
 *      threads (the library's central promise: the bytes depend only on the tokens).
 * Exit 0: every check passed; 1: one failed (the line says which); 2: usage error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kivi.h"
#include "../examples/kivi_cli.h"

static const char usage[] =
    "usage: kivi-info [--device all|default|host|N] [--help] [--version]\n"
    "Prints the version and build of libkivi-omp, the devices it sees and where work runs, and\n"
    "checks each device (default: all of them and the host): the self-test kernel, an exact\n"
    "one-token attention, and a 2-bit cache whose bytes must equal the host's.\n"
    "Exit 0: all checks passed; 1: a check failed; 2: usage error.\n";

static int failures;

static void report(const char *where, const char *what, kivi_status st, int ok) {
  const int good = st == KIVI_OK && ok;
  printf("  %-10s %-44s %s", where, what, good ? "ok" : "FAILED");
  if (st != KIVI_OK) printf(" (%s)", kivi_status_string(st));
  printf("\n");
  fflush(stdout);
  failures += !good;
}

/* the packed bytes of one sequence after 300 tokens, or NULL */
static unsigned char *export_after(kivi_context *ctx, const float *k, const float *v, size_t *n, kivi_status *st) {
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, 2, 128, 1, 512);
  kivi_cache *c = NULL;
  unsigned char *buf = NULL;
  const int id = 0, len = 300;
  *n = 0;
  if ((*st = kivi_cache_create(ctx, &cfg, &c)) == KIVI_OK &&
      (*st = kivi_cache_append(c, 0, 1, &id, &len, k, v, KIVI_F32, KIVI_MEM_HOST)) == KIVI_OK &&
      (*st = kivi_cache_export_seq(c, id, 0, NULL, n)) == KIVI_OK) {
    buf = malloc(*n);
    if (!buf) *st = KIVI_ERR_NOMEM;
    else if ((*st = kivi_cache_export_seq(c, id, 0, buf, n)) != KIVI_OK) {
      free(buf);
      buf = NULL;
    }
  }
  kivi_cache_destroy(c);
  return buf;
}

static void check_device(int device, const char *where, const unsigned char *host_bytes, size_t host_n,
                         const float *k, const float *v) {
  kivi_context *ctx = NULL;
  kivi_status st = kivi_context_create(&ctx, device);
  if (st != KIVI_OK) {
    report(where, "create a context", st, 0);
    return;
  }
  kivi_context_info info;
  (void)kivi_context_get_info(ctx, &info);
  int on_gpu = 0;
  st = kivi_context_selftest(ctx, &on_gpu);
  char what[96];
  snprintf(what, sizeof what, "self-test kernel (ran on %s)", on_gpu ? "the GPU" : "host threads");
  report(where, what, st, on_gpu == info.on_gpu);

  /* one fp16 token: softmax weight 1, so out = V exactly (values exact in fp16) */
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 1, 1, 64, 1, 64);
  cfg.k_bits = cfg.v_bits = 16;
  cfg.residual = 32;
  kivi_cache *c = NULL;
  float kk[64], vv[64], q[2 * 64], out[2 * 64];
  for (int i = 0; i < 64; ++i) {
    kk[i] = (float)(i % 9) / 8.0f;
    vv[i] = (float)(i % 13 - 6) / 16.0f;
  }
  for (int i = 0; i < 128; ++i) q[i] = 0.5f;
  const int id = 0, one = 1;
  int exact = 0;
  if ((st = kivi_cache_create(ctx, &cfg, &c)) == KIVI_OK &&
      (st = kivi_cache_append(c, 0, 1, &id, &one, kk, vv, KIVI_F32, KIVI_MEM_HOST)) == KIVI_OK &&
      (st = kivi_attention_decode(c, 0, 1, &id, 2, q, 0.125f, out, KIVI_F32, KIVI_MEM_HOST)) == KIVI_OK)
    exact = !memcmp(out, vv, sizeof vv) && !memcmp(out + 64, vv, sizeof vv);
  kivi_cache_destroy(c);
  report(where, "one-token attention equals its V", st, exact);

  size_t n = 0;
  unsigned char *bytes = export_after(ctx, k, v, &n, &st);
  report(where, "2-bit cache bytes equal the host's", st, bytes && n == host_n && !memcmp(bytes, host_bytes, n));
  free(bytes);
  kivi_context_destroy(ctx);
}

int main(int argc, char **argv) {
  const int info_rc = kivi_cli_info(argc, argv, "kivi-info", kivi_version_string(), usage);
  if (info_rc >= 0) return info_rc;
  const char *which = "all";
  for (int i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) which = argv[++i];
    else return kivi_cli_bad("kivi-info", i + 1 < argc || strcmp(argv[i], "--device") ? "unknown option" : "missing value after",
                             argv[i]);
  }
  int one_device = KIVI_DEVICE_DEFAULT, all = 0;
  if (!strcmp(which, "all")) all = 1;
  else if (!strcmp(which, "host")) one_device = KIVI_DEVICE_HOST;
  else if (strcmp(which, "default")) {
    char *end;
    const long d = strtol(which, &end, 10);
    if (*end || end == which || d < 0 || d > 1 << 20) return kivi_cli_bad("kivi-info", "bad device", which);
    one_device = (int)d;
  }
  printf("libkivi-omp %s (header %s)\n", kivi_version_string(), KIVI_VERSION_STRING);
  printf("build: %s\n", kivi_build_config());
  printf("offload: %s\n", kivi_built_with_offload() ? "built for NVIDIA GPUs" : "none (host threads only)");
  kivi_context *ctx = NULL;
  kivi_status st = kivi_context_create(&ctx, KIVI_DEVICE_DEFAULT);
  kivi_context_info info = {0, 0, 0, {0}};
  if (st == KIVI_OK) (void)kivi_context_get_info(ctx, &info);
  kivi_context_destroy(ctx);
  printf("devices: %d visible; default work runs on %s\n", info.num_devices,
         st != KIVI_OK ? "nothing (context creation failed)" : info.on_gpu ? "a GPU" : "host threads");
  if (st != KIVI_OK) printf("  default context: %s\n", kivi_status_string(st));
  const char *offload = getenv("OMP_TARGET_OFFLOAD");
  if (offload) printf("OMP_TARGET_OFFLOAD=%s\n", offload);
  fflush(stdout);

  /* the host's packed bytes, the reference of check 3 */
  enum { N = 300 * 2 * 128 };
  float *k = malloc(sizeof(float) * N), *v = malloc(sizeof(float) * N);
  if (!k || !v) return 1;
  for (int i = 0; i < N; ++i) {
    k[i] = (float)((i * 37) % 101 - 50) / 17.0f;
    v[i] = (float)((i * 53) % 89 - 44) / 23.0f;
  }
  kivi_context *host = NULL;
  size_t host_n = 0;
  unsigned char *host_bytes = NULL;
  if ((st = kivi_context_create(&host, KIVI_DEVICE_HOST)) == KIVI_OK) host_bytes = export_after(host, k, v, &host_n, &st);
  kivi_context_destroy(host);
  printf("checks:\n");
  report("host", "2-bit cache on host threads", st, host_bytes != NULL);
  if (host_bytes) {
    if (!all) {
      char where[32];
      snprintf(where, sizeof where, "%s%s", one_device >= 0 ? "device " : "", which);
      check_device(one_device, where, host_bytes, host_n, k, v);
    } else {
      check_device(KIVI_DEVICE_HOST, "host", host_bytes, host_n, k, v);
      for (int d = 0; d < info.num_devices; ++d) {
        char where[32];
        snprintf(where, sizeof where, "device %d", d);
        check_device(d, where, host_bytes, host_n, k, v);
      }
    }
  }
  free(host_bytes);
  free(k);
  free(v);
  printf("kivi-info: %s\n", failures ? "a check FAILED" : "all checks passed");
  return failures ? 1 : 0;
}
