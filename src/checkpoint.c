/* Checkpoint and restore of the compressed cache (format: docs/CHECKPOINT.md).
 *
 *   header   64 bytes: "KIVICKPT", version, header size, geometry, record count, payload size
 *   records  per sequence: u32 seq_id, u32 0, n_layers x {u64 length, u64 blob bytes}, the blobs
 *            (kivi_cache_export_seq of each layer, in layer order)
 *   trailer  u32 CRC-32 (zlib) of header and records
 *
 * Loading checks the whole checkpoint (size, magic, version, CRC, geometry, every record's
 * bounds and sizes, the block budget) before it changes anything. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "internal.h"

#define CKPT_MAGIC "KIVICKPT"
#define CKPT_VERSION 1u     /* caches without rotation: byte 56 on is 0 */
#define CKPT_VERSION_ROT 2u /* rotated caches: u32 kivi_cache_config.rotate at 56 (older loaders refuse it) */
#define CKPT_VERSION_SINK 3u /* caches with sink tokens: rotate at 56, u32 kivi_cache_config.sinks at 60 */
#define CKPT_HEADER 64u

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= (uint32_t)p[i] << (8 * i);
  return v;
}
static uint64_t get64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static uint32_t crc_of(const unsigned char *p, size_t n) {
  return (uint32_t)crc32_z(crc32_z(0L, Z_NULL, 0), p, n);
}

/* The geometry fields of the header, in order. */
static void geometry(const kivi_cache_config *f, uint32_t g[7]) {
  g[0] = (uint32_t)f->n_layers;
  g[1] = (uint32_t)f->n_kv_heads;
  g[2] = (uint32_t)f->head_dim;
  g[3] = (uint32_t)f->k_bits;
  g[4] = (uint32_t)f->v_bits;
  g[5] = (uint32_t)f->group;
  g[6] = (uint32_t)f->residual;
}

static int seq_in_use(const kivi_cache *c, int q) {
  for (int l = 0; l < c->cfg.n_layers; ++l)
    if (kivi_len(c, q, l)) return 1;
  return 0;
}

static size_t record_bytes(const kivi_cache *c, int q) {
  size_t n = 8 + (size_t)c->cfg.n_layers * 16;
  for (int l = 0; l < c->cfg.n_layers; ++l) n += kivi_export_size(c, kivi_len(c, q, l));
  return n;
}

kivi_status kivi_cache_save(const kivi_cache *c, int seq_id, void *buf, size_t *bytes) {
  if (!c || !bytes || seq_id < KIVI_ALL_SEQS || seq_id >= c->cfg.max_seqs) return KIVI_ERR_ARG;
  const kivi_status wst = kivi_async_drain((kivi_cache *)c); /* enqueued work first */
  if (wst) return wst;
  const int q0 = seq_id == KIVI_ALL_SEQS ? 0 : seq_id, q1 = seq_id == KIVI_ALL_SEQS ? c->cfg.max_seqs : seq_id + 1;
  size_t need = CKPT_HEADER + 4;
  uint32_t nrec = 0;
  for (int q = q0; q < q1; ++q)
    if (seq_id != KIVI_ALL_SEQS || seq_in_use(c, q)) {
      need += record_bytes(c, q);
      ++nrec;
    }
  if (!buf) {
    *bytes = need;
    return KIVI_OK;
  }
  if (*bytes < need) {
    *bytes = need; /* the size needed, as for buf == NULL */
    return KIVI_ERR_BUFFER;
  }
  unsigned char *o = buf;
  memset(o, 0, CKPT_HEADER);
  memcpy(o, CKPT_MAGIC, 8);
  put32(o + 8, c->cfg.sinks ? CKPT_VERSION_SINK : c->cfg.rotate ? CKPT_VERSION_ROT : CKPT_VERSION);
  put32(o + 12, CKPT_HEADER);
  uint32_t g[7];
  geometry(&c->cfg, g);
  for (int i = 0; i < 7; ++i) put32(o + 16 + 4 * i, g[i]);
  put32(o + 44, nrec);
  put64(o + 48, need - CKPT_HEADER - 4);
  put32(o + 56, (uint32_t)c->cfg.rotate);
  put32(o + 60, (uint32_t)c->cfg.sinks);
  unsigned char *p = o + CKPT_HEADER;
  const int NL = c->cfg.n_layers;
  for (int q = q0; q < q1; ++q) {
    if (seq_id == KIVI_ALL_SEQS && !seq_in_use(c, q)) continue;
    put32(p, (uint32_t)q);
    put32(p + 4, 0);
    unsigned char *dir = p + 8, *blob = p + 8 + (size_t)NL * 16;
    for (int l = 0; l < NL; ++l) {
      const int64_t L = kivi_len(c, q, l);
      size_t n = kivi_export_size(c, L);
      put64(dir + 16 * l, (uint64_t)L);
      put64(dir + 16 * l + 8, n);
      const kivi_status st = kivi_cache_export_seq(c, q, l, blob, &n);
      if (st) return st;
      blob += n;
    }
    p = blob;
  }
  put32(p, crc_of(o, (size_t)(p - o)));
  *bytes = need;
  return KIVI_OK;
}

/* One parsed record: where its directory and blobs are. */
typedef struct ckpt_rec {
  int seq;
  const unsigned char *dir, *blobs;
} ckpt_rec;

kivi_status kivi_cache_load(kivi_cache *c, int seq_id, const void *buf, size_t bytes) {
  if (!c || !buf || seq_id < KIVI_ALL_SEQS || seq_id >= c->cfg.max_seqs) return KIVI_ERR_ARG;
  const kivi_status wst = kivi_async_drain(c); /* enqueued work first */
  if (wst) return wst;
  const unsigned char *in = buf;
  /* envelope: size, magic, version, payload size, CRC */
  if (bytes < CKPT_HEADER + 4 || memcmp(in, CKPT_MAGIC, 8) != 0) return KIVI_ERR_FORMAT;
  const uint32_t ver = get32(in + 8), rot = get32(in + 56), sinks = get32(in + 60);
  if (ver < CKPT_VERSION || ver > CKPT_VERSION_SINK || get32(in + 12) != CKPT_HEADER) return KIVI_ERR_FORMAT;
  if (ver == CKPT_VERSION ? rot != 0 || sinks != 0
      : ver == CKPT_VERSION_ROT ? rot < KIVI_ROTATE_K || rot > KIVI_ROTATE_KV || sinks != 0
                                : rot > KIVI_ROTATE_KV || sinks < 1 || sinks > KIVI_MAX_SINKS)
    return KIVI_ERR_FORMAT;
  if (get64(in + 48) != (uint64_t)(bytes - CKPT_HEADER - 4)) return KIVI_ERR_FORMAT;
  if (crc_of(in, bytes - 4) != get32(in + bytes - 4)) return KIVI_ERR_FORMAT;
  uint32_t g[7];
  geometry(&c->cfg, g);
  for (int i = 0; i < 7; ++i)
    if (get32(in + 16 + 4 * i) != g[i]) return KIVI_ERR_MISMATCH;
  if (rot != (uint32_t)c->cfg.rotate || sinks != (uint32_t)c->cfg.sinks) return KIVI_ERR_MISMATCH;
  const uint32_t nrec = get32(in + 44);
  const int NL = c->cfg.n_layers, R = c->cfg.residual;
  if (seq_id != KIVI_ALL_SEQS && nrec != 1) return KIVI_ERR_ARG; /* a one-sequence load needs one record */
  if (nrec > (uint32_t)c->cfg.max_seqs) return KIVI_ERR_CAPACITY;
  ckpt_rec *rec = calloc(nrec ? nrec : 1, sizeof *rec);
  if (!rec) return KIVI_ERR_NOMEM;
  /* records: bounds, sizes, ids, lengths, blocks */
  const unsigned char *p = in + CKPT_HEADER, *end = in + bytes - 4;
  int64_t need_blocks = 0;
  kivi_status st = KIVI_OK;
  for (uint32_t r = 0; r < nrec && !st; ++r) {
    if ((size_t)(end - p) < 8 + (size_t)NL * 16) { st = KIVI_ERR_FORMAT; break; }
    const uint32_t q = get32(p);
    rec[r].seq = seq_id == KIVI_ALL_SEQS ? (int)q : seq_id;
    rec[r].dir = p + 8;
    rec[r].blobs = p + 8 + (size_t)NL * 16;
    if (get32(p + 4) != 0) st = KIVI_ERR_FORMAT;
    else if (seq_id == KIVI_ALL_SEQS && q >= (uint32_t)c->cfg.max_seqs) st = KIVI_ERR_CAPACITY;
    for (uint32_t j = 0; j < r && !st; ++j)
      if (rec[j].seq == rec[r].seq) st = KIVI_ERR_FORMAT; /* the same sequence twice */
    const unsigned char *b = rec[r].blobs;
    for (int l = 0; l < NL && !st; ++l) {
      const uint64_t L = get64(rec[r].dir + 16 * l), n = get64(rec[r].dir + 16 * l + 8);
      if (L > (uint64_t)c->cfg.max_seq_len) st = KIVI_ERR_CAPACITY;
      else if (n != kivi_export_size(c, (int64_t)L) || n > (uint64_t)(end - b)) st = KIVI_ERR_FORMAT;
      else {
        b += n;
        need_blocks += kivi_qlen(c, (int64_t)L) / R;
      }
    }
    p = b;
  }
  if (!st && p != end) st = KIVI_ERR_FORMAT; /* bytes left over */
  /* the blocks the load frees: everything (whole cache) or the target sequence's */
  int64_t avail = c->n_free;
  if (!st) {
    if (seq_id == KIVI_ALL_SEQS) avail = c->n_blocks;
    else
      for (int l = 0; l < NL; ++l) avail += kivi_qlen(c, kivi_len(c, seq_id, l)) / R;
    if (need_blocks > avail) st = KIVI_ERR_CAPACITY;
  }
  /* everything checked: replace */
  if (!st) {
    if (seq_id == KIVI_ALL_SEQS)
      for (int q = 0; q < c->cfg.max_seqs; ++q) kivi_cache_reset_seq(c, q);
    else
      kivi_cache_reset_seq(c, seq_id);
    for (uint32_t r = 0; r < nrec && !st; ++r) {
      const unsigned char *b = rec[r].blobs;
      for (int l = 0; l < NL && !st; ++l) {
        const int64_t L = (int64_t)get64(rec[r].dir + 16 * l);
        st = kivi_import_seq(c, rec[r].seq, l, L, b);
        b += get64(rec[r].dir + 16 * l + 8);
      }
    }
  }
  free(rec);
  return st;
}

kivi_status kivi_cache_save_file(const kivi_cache *c, int seq_id, const char *path) {
  if (!c || !path) return KIVI_ERR_ARG;
  size_t n = 0;
  kivi_status st = kivi_cache_save(c, seq_id, NULL, &n);
  if (st) return st;
  unsigned char *buf = malloc(n);
  if (!buf) return KIVI_ERR_NOMEM;
  st = kivi_cache_save(c, seq_id, buf, &n);
  const size_t plen = strlen(path);
  char *tmp = malloc(plen + 5);
  if (!st && !tmp) st = KIVI_ERR_NOMEM;
  if (!st) {
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) st = KIVI_ERR_IO;
    else {
      const int bad = fwrite(buf, 1, n, f) != n;
      if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        remove(tmp);
        st = KIVI_ERR_IO;
      }
    }
  }
  free(tmp);
  free(buf);
  return st;
}

kivi_status kivi_cache_load_file(kivi_cache *c, int seq_id, const char *path) {
  if (!c || !path) return KIVI_ERR_ARG;
  FILE *f = fopen(path, "rb");
  if (!f) return KIVI_ERR_IO;
  kivi_status st = KIVI_OK;
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  unsigned char *buf = NULL;
  if (len < 0 || fseek(f, 0, SEEK_SET) != 0) st = KIVI_ERR_IO;
  else if (!(buf = malloc(len > 0 ? (size_t)len : 1))) st = KIVI_ERR_NOMEM;
  else if (fread(buf, 1, (size_t)len, f) != (size_t)len) st = KIVI_ERR_IO;
  fclose(f);
  if (!st) st = kivi_cache_load(c, seq_id, buf, (size_t)len);
  free(buf);
  return st;
}
