/* libFuzzer harness for the checkpoint loader (`make fuzz`; see README "Robustness").
 * Every input is loaded into a host cache twice: as given (the envelope checks: size, magic,
 * version, CRC) and with its CRC recomputed, so the fuzzer also reaches the record parser
 * behind the CRC.  Whatever the input, the load must return a status without crashing, and a
 * rejected load must leave the cache as it was (compared through kivi_cache_save).
 * KIVI_FUZZ_SEED=DIR writes a valid checkpoint into DIR at start-up, as a seed corpus. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "kivi.h"

static kivi_context *ctx;
static kivi_cache *cache;
static unsigned char *base;
static size_t base_n;

static void fail(const char *what) {
  fprintf(stderr, "fuzz_checkpoint: %s\n", what);
  abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  kivi_cache_config cfg;
  kivi_cache_config_init(&cfg, 2, 2, 32, 3, 256);
  cfg.group = 32;
  cfg.residual = 32;
  cfg.pool_tokens = 256;
  if (kivi_context_create(&ctx, KIVI_DEVICE_HOST) || kivi_cache_create(ctx, &cfg, &cache)) fail("setup");
  float k[100 * 2 * 32], v[100 * 2 * 32];
  for (int i = 0; i < 100 * 2 * 32; ++i) {
    k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    v[i] = (float)((i * 53) % 97) / 40.0f - 1.2f;
  }
  const int ids[2] = {0, 2}, n[2] = {70, 30};
  if (kivi_cache_append(cache, 0, 2, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST)) fail("append");
  if (kivi_cache_append(cache, 1, 1, ids, n, k, v, KIVI_F32, KIVI_MEM_HOST)) fail("append");
  if (kivi_cache_save(cache, KIVI_ALL_SEQS, NULL, &base_n) || !(base = malloc(base_n)) ||
      kivi_cache_save(cache, KIVI_ALL_SEQS, base, &base_n))
    fail("save");
  const char *dir = getenv("KIVI_FUZZ_SEED");
  if (dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/seed.kivi", dir);
    if (kivi_cache_save_file(cache, KIVI_ALL_SEQS, path)) fail("seed");
  }
  return 0;
}

/* Load; on success restore the base state; on failure check nothing changed. */
static void try_load(const uint8_t *data, size_t size) {
  const kivi_status st = kivi_cache_load(cache, KIVI_ALL_SEQS, data, size);
  size_t n = 0;
  if (kivi_cache_save(cache, KIVI_ALL_SEQS, NULL, &n)) fail("size");
  unsigned char *now = malloc(n ? n : 1);
  if (!now || kivi_cache_save(cache, KIVI_ALL_SEQS, now, &n)) fail("save after load");
  if (st != KIVI_OK) {
    if (n != base_n || memcmp(now, base, n) != 0) fail("a rejected load changed the cache");
  } else if (kivi_cache_load(cache, KIVI_ALL_SEQS, base, base_n) != KIVI_OK) {
    fail("restoring the base checkpoint");
  }
  free(now);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  try_load(data, size);
  if (size >= 68) {
    uint8_t *copy = malloc(size);
    if (!copy) return 0;
    memcpy(copy, data, size);
    const uint32_t crc = (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), copy, size - 4);
    for (int i = 0; i < 4; ++i) copy[size - 4 + i] = (uint8_t)(crc >> (8 * i));
    try_load(copy, size);
    free(copy);
  }
  return 0;
}
