/* A GPU emulated on the host, for tests: the library's CUDA-like kernels (KIVI_BARE regions,
 * internal.h) run on host memory, each thread of a team a coroutine, one team after another,
 * with the warp's collective instructions (shuffles, votes, mma.sync, ldmatrix) and the block's
 * barriers done as a GPU does them.  Only the test library built with KIVI_SIMT_EMU includes
 * this (tests/Makefile.am: libkivi-simt); it is no part of the installed library.  It checks
 * what a GPU leaves undefined: a barrier that not every live thread of the team reaches, a
 * .aligned instruction (mma, ldmatrix, bar.sync) that the lanes reach at different places, a
 * warp collective after one of the warp's lanes has exited.  On such a fault it prints where
 * and aborts (it is a test harness). */
#ifndef KIVI_SIMT_EMU_H
#define KIVI_SIMT_EMU_H

#include <ompx.h> /* first, so that the names below replace its functions in the kernels */
#include <stdint.h>

/* runs body once per thread of each of nteams teams of nthreads threads */
void kivi_simt_run(int nteams, int nthreads, void (^body)(void));
int kivi_simt_tid(void);
int kivi_simt_bid(void);
/* the team's barrier (bar.sync 0), reached at line of file */
void kivi_simt_sync(const char *file, int line);
#define ompx_thread_id_x() kivi_simt_tid()
#define ompx_block_id_x() kivi_simt_bid()
#define ompx_sync_block_acq_rel() kivi_simt_sync(__FILE__, __LINE__)

/* Warp collectives: each lane of the warp gives n <= 12 words; when the last live lane has
 * arrived, op computes every lane's result words from all the lanes' words; each lane gets a
 * pointer to its own result (valid until its next collective).  file, line: where a .aligned
 * instruction is, which every lane must reach at the same place (NULL: not .aligned). */
enum {
  KIVI_SIMT_SHFL,   /* in: value, source lane -> the source lane's value */
  KIVI_SIMT_MAXU,   /* in: value -> the warp's maximum (unsigned) */
  KIVI_SIMT_BALLOT, /* in: predicate -> the warp's ballot */
  KIVI_SIMT_BAR,    /* a warp barrier: nothing */
  KIVI_SIMT_MMA,    /* in: a0..a3, b0, b1, c0..c3 (fp32 bits) -> d[0..3] (m16n8k16, f16 operands) */
  KIVI_SIMT_LDSM,   /* in: a row's pointer (2 words) -> r[0..3] (ldmatrix .x4) */
  KIVI_SIMT_LDSMT   /* the same with .trans */
};
const uint32_t *kivi_simt_warp(int op, const uint32_t *in, int n, const char *file, int line);

/* f16 <-> double, exact one way and rounded to nearest even the other (subnormals kept) */
double kivi_simt_h2d(uint32_t h);
uint32_t kivi_simt_d2h(double x);
/* the base that the emulated 32-bit shared-memory addresses are offsets from */
extern unsigned char kivi_simt_shared_base[16];

#endif
