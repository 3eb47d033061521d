/* The packed cache format, defined once.  Everything that computes an address in the cache
 * includes this header; docs/FORMAT.md describes the same layout for users and
 * tests/lib/test_layout.c freezes it with golden vectors.
 *
 * Pool: n_blocks blocks.  A block holds R consecutive token positions of one sequence on one
 * layer, for all kv-heads: H sub-blocks, one per kv-head, each laid out as
 *
 *   offset kcode_off  K codes      [R][kw]          u32, kw = D * kb / 32 (token-major)
 *   offset ksz_off    K scale/zero [R/G][2][D]      fp16: D scales, then D zeros, per token group
 *   offset vcode_off  V codes      [R][vw]          u32, vw = D * vb / 32 (token-major)
 *   offset vsz_off    V scale/zero [R][D/G][2]      fp16: {scale, zero} per token and channel group
 *
 * Bit order: with b-bit codes a u32 word holds 32/b channels; channel c of a token is in word
 * c / (32/b) at bits b*(c % (32/b)) upward (least significant first).  With b = 16 the "codes"
 * are the fp16 values themselves (channel 2i in the low half) and the scale/zero arrays are
 * absent (size 0).
 *
 * Why token-major codes: the attention kernel gives each thread (lane) one token and reads the
 * token's whole code row with 16-byte loads (kw = 8 words = 32 bytes for 2-bit, D = 128);
 * neighbouring threads read neighbouring rows, so a warp's loads are fully coalesced, and the
 * same holds for the V rows in the weighted sum.  K scales/zeros are per group of G tokens and
 * channel, so they are read once per group, contiguous in channel order (16-byte loads,
 * coalesced over channels); V {scale, zero} pairs sit together so one 4-byte load gives both.
 *
 * Residual windows (fp16, outside the pool): K and V each [seq][layer][kv-head][R][D]; token
 * position p lives in slot p mod R.  The block table maps (seq, layer, p / R) to a block id.
 *
 * All four arrays of a sub-block start at multiples of 16 bytes (checked below and at run
 * time), so 16-byte vector loads are always aligned. */
#ifndef KIVI_LAYOUT_H
#define KIVI_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#define KIVI_MIN_HEAD_DIM 32
#define KIVI_MAX_HEAD_DIM 256
#define KIVI_MIN_GROUP 32
#define KIVI_MAX_GROUP 128
#define KIVI_MAX_RESIDUAL 1024
#define KIVI_MAX_KV_HEADS 4096

/* The smallest sub-block arrays (D = 32, G = R = 32, b = 2) are multiples of 16 bytes; every
 * larger legal geometry multiplies these sizes by whole factors. */
_Static_assert(KIVI_MIN_GROUP * KIVI_MIN_HEAD_DIM * 2 / 8 % 16 == 0, "K/V code rows of a block align to 16 B");
_Static_assert(KIVI_MIN_HEAD_DIM * 2 * sizeof(uint16_t) % 16 == 0, "one K scale/zero group aligns to 16 B");
_Static_assert(KIVI_MIN_GROUP * 2 * sizeof(uint16_t) % 16 == 0, "V scale/zero of a block aligns to 16 B");
_Static_assert(sizeof(uint32_t) == 4 && sizeof(uint16_t) == 2, "word sizes");
_Static_assert(KIVI_MAX_HEAD_DIM % 32 == 0 && KIVI_MIN_HEAD_DIM % 32 == 0, "head_dim steps of 32");

typedef struct kivi_layout {
  int D, H, G, R, kb, vb;
  int kw, vw;       /* u32 words per token row of K / V codes */
  size_t kcode_off; /* byte offsets inside a sub-block */
  size_t ksz_off;
  size_t vcode_off;
  size_t vsz_off;
  size_t sub_bytes;   /* one (block, kv-head) */
  size_t block_bytes; /* one block: H sub-blocks */
} kivi_layout;

/* Fills a layout from the geometry; returns 0, or -1 if an array would be misaligned (cannot
 * happen for geometries kivi_cache_config_check accepts). */
static inline int kivi_layout_init(kivi_layout *l, int D, int H, int G, int R, int kb, int vb) {
  l->D = D; l->H = H; l->G = G; l->R = R; l->kb = kb; l->vb = vb;
  l->kw = D * kb / 32;
  l->vw = D * vb / 32;
  const size_t kcode = (size_t)R * l->kw * 4;
  const size_t ksz = kb < 16 ? (size_t)(R / G) * 2 * D * 2 : 0;
  const size_t vcode = (size_t)R * l->vw * 4;
  const size_t vsz = vb < 16 ? (size_t)R * (D / G) * 2 * 2 : 0;
  l->kcode_off = 0;
  l->ksz_off = kcode;
  l->vcode_off = kcode + ksz;
  l->vsz_off = kcode + ksz + vcode;
  l->sub_bytes = kcode + ksz + vcode + vsz;
  l->block_bytes = l->sub_bytes * (size_t)H;
  return (kcode % 16 || ksz % 16 || vcode % 16 || vsz % 16) ? -1 : 0;
}

/* A block-table entry as a block index.  An unset entry (-1) reads as block 0, inside the pool:
 * only a decode enqueued after a failed append reads one (the failure is reported by the wait and
 * that decode's output is undefined), and it must not read outside the pool. */
static inline size_t kivi_block_index(int32_t b) { return b < 0 ? 0 : (size_t)b; }
/* The sub-block of kv-head kvh in the block of table entry b, in a pool of blocks of H
 * sub-blocks of sub bytes each (an unset entry reads as block 0: kivi_block_index). */
static inline const unsigned char *kivi_sub_of(const unsigned char *pool, int32_t b, int H, int kvh, size_t sub) {
  return pool + (kivi_block_index(b) * H + kvh) * sub;
}
/* In a sub-block sb: K token group g's first code row at channel c (a multiple of 32 / kb) and
 * its scales at channel c (the zeros are D further). */
static inline unsigned char *kivi_kcodes_at(unsigned char *sb, const kivi_layout *l, int g, int c) {
  return sb + l->kcode_off + (size_t)g * l->G * l->kw * 4 + (size_t)c * l->kb / 8;
}
static inline uint16_t *kivi_kscales_at(unsigned char *sb, const kivi_layout *l, int g, int c) {
  return (uint16_t *)(sb + l->ksz_off) + (size_t)g * 2 * l->D + c;
}
/* In a sub-block sb: the V code row and the {scale, zero} pairs of the token in slot t. */
static inline uint32_t *kivi_vcodes_at(unsigned char *sb, const kivi_layout *l, int t) {
  return (uint32_t *)(sb + l->vcode_off) + (size_t)t * l->vw;
}
static inline uint16_t *kivi_vscales_at(unsigned char *sb, const kivi_layout *l, int t) {
  return (uint16_t *)(sb + l->vsz_off) + (size_t)t * 2 * (l->D / l->G);
}

#endif
