/* The GPU emulator of the test library (simt_emu.h): coroutines for the threads of one team at
 * a time, a scheduler that runs each thread until it waits at a barrier or a warp collective,
 * and the collectives' results computed once the warp's last live lane arrives.  A coroutine
 * switch is a few instructions on x86-64 (simt_switch below); elsewhere it is swapcontext,
 * whose signal-mask system calls make the tests several times slower. */
#include "simt_emu.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

/* the block runtime's class symbols for a block literal that is called and never copied
 * (clang -fblocks; libBlocksRuntime is not needed for that) */
void *_NSConcreteStackBlock[32];
void *_NSConcreteGlobalBlock[32];

enum { T_RUN, T_WAITW, T_WAITB, T_DONE };
#define SIMT_STACK (512u << 10)
#define SIMT_NW 12 /* words a lane gives a collective at most */

typedef struct {
#if defined(__x86_64__)
  void *sp; /* the stack pointer it was switched away at */
#else
  ucontext_t uc;
#endif
  int state;
} simt_thread;

typedef struct {
  int arrived, op, n, line;
  unsigned gen;
  const char *file;
  uint32_t in[2][32][SIMT_NW], out[2][32][SIMT_NW];
} simt_warp_state;

static pthread_mutex_t simt_lock = PTHREAD_MUTEX_INITIALIZER;
static simt_thread *th;
static simt_warp_state *wp;
static unsigned char *stacks;
static int cap, nth, cur, bid, nteams_, b_arrived, b_line, live; /* live: the team's threads not exited */
static int *live_w; /* each warp's lanes not exited */
static const char *b_file;
static void (^body_)(void);

#if defined(__x86_64__)
/* saves the callee-saved registers on the current stack, stores its pointer in *from, and
 * continues on the stack `to` (whose registers and return address it pops) */
void kivi_simt_switch(void **from, void *to);
__asm__(".text\n"
        ".globl kivi_simt_switch\n"
        ".hidden kivi_simt_switch\n"
        ".type kivi_simt_switch, @function\n"
        "kivi_simt_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size kivi_simt_switch, .-kivi_simt_switch\n");
static void *sched_sp;
static void tramp(void);
static void to_thread(int i) { kivi_simt_switch(&sched_sp, th[i].sp); }
static void to_scheduler(void) { kivi_simt_switch(&th[cur].sp, sched_sp); }
/* a new thread's stack: 6 registers and tramp as the return address, below an empty slot that
 * keeps the ABI's alignment (rsp + 8 a multiple of 16 at tramp's entry) */
static void start_thread(int i, unsigned char *stack, size_t size) {
  void **top = (void **)(((uintptr_t)stack + size) & ~(uintptr_t)15);
  top[-1] = NULL;
  top[-2] = (void *)tramp;
  for (int r = 3; r <= 8; ++r) top[-r] = NULL;
  th[i].sp = top - 8;
}
#else
static ucontext_t sched_uc;
static void tramp(void);
static void to_thread(int i) {
  if (swapcontext(&sched_uc, &th[i].uc)) abort();
}
static void to_scheduler(void) {
  if (swapcontext(&th[cur].uc, &sched_uc)) abort();
}
static void start_thread(int i, unsigned char *stack, size_t size) {
  getcontext(&th[i].uc);
  th[i].uc.uc_stack.ss_sp = stack;
  th[i].uc.uc_stack.ss_size = size;
  th[i].uc.uc_link = &sched_uc;
  makecontext(&th[i].uc, tramp, 0);
}
#endif
unsigned char kivi_simt_shared_base[16];

static void fault(const char *what, int t) {
  fprintf(stderr, "simt: %s (team %d of %d, thread %d of %d)\n", what, bid, nteams_, t, nth);
  abort();
}

int kivi_simt_tid(void) { return cur; }
int kivi_simt_bid(void) { return bid; }

/* the threads of [i0, i1) that wait in state st run again */
static void release(int i0, int i1, int st) {
  for (int i = i0; i < i1; ++i)
    if (th[i].state == st) th[i].state = T_RUN;
}

static int same_site(const char *f1, int l1, const char *f2, int l2) {
  return l1 == l2 && (f1 == f2 || (f1 && f2 && !strcmp(f1, f2)));
}

void kivi_simt_sync(const char *file, int line) {
  if (b_arrived == 0) {
    b_file = file;
    b_line = line;
  } else if (!same_site(file, line, b_file, b_line)) {
    fprintf(stderr, "simt: a barrier at %s:%d, the team's first arrival at %s:%d\n", file, line, b_file, b_line);
    fault("bar.sync reached at different places by the threads of a team", cur);
  }
  if (++b_arrived == live) {
    b_arrived = 0;
    release(0, nth, T_WAITB);
    return;
  }
  th[cur].state = T_WAITB;
  to_scheduler();
}

static float simt_f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t simt_u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

double kivi_simt_h2d(uint32_t h) {
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  double v;
  if (e == 0) v = m * 0x1p-24;
  else if (e == 31) v = m ? NAN : INFINITY;
  else { /* the same exponent and mantissa bits in a double's fields */
    const uint64_t b = (uint64_t)(e + 1008u) << 52 | (uint64_t)m << 42;
    memcpy(&v, &b, 8);
  }
  return (h & 0x8000u) ? -v : v;
}

uint32_t kivi_simt_d2h(double x) {
  const uint32_t s = signbit(x) ? 0x8000u : 0u;
  const double a = fabs(x);
  if (isnan(x)) return 0x7e00u;
  if (isinf(x)) return s | 0x7c00u;
  if (a < 0x1p-14) return s | (uint32_t)nearbyint(a * 0x1p24); /* 1024 is the least normal's bits */
  int e;
  double m = nearbyint(frexp(a, &e) * 2048.0); /* a = m 2^(e - 11), m in [1024, 2048] */
  if (m == 2048.0) { m = 1024.0; ++e; }
  const int E = e - 1 + 15;
  if (E >= 31) return s | 0x7c00u;
  return s | (uint32_t)E << 10 | (uint32_t)(m - 1024.0);
}

static double hlo(uint32_t w) { return kivi_simt_h2d(w & 0xffffu); }
static double hhi(uint32_t w) { return kivi_simt_h2d(w >> 16); }

/* The fp32 sum of an mma's 16 products and its accumulator as the H100 and H200 tensor cores
 * were measured to make it: each term truncated toward zero at a quarter of the fp32 ulp of the
 * largest term (2 bits below it), the terms' sum truncated toward zero to fp32.  The PTX ISA
 * leaves this open.  Rounded to nearest once, the fp16 cache's kernel gave up to 17x less error
 * here than on the H200 where its o accumulators take the most mma (4096-token splits: 4.6e-7
 * against 7.6e-6); with this model, test_attention's 285 printed errors of GPU kernels are within
 * a factor 1.8 of the H200's, 259 of them within 13 % (7.67e-6 against 7.62e-6 there;
 * docs/TESTING.md). */
static float mma_sum(const double *x) {
  double mx = 0.0;
  for (int k = 0; k < 17; ++k) mx = fmax(mx, fabs(x[k]));
  if (mx == 0.0 || !isfinite(mx)) {
    double s = 0.0;
    for (int k = 0; k < 17; ++k) s += x[k];
    return (float)s;
  }
  int e;
  frexp(mx, &e); /* mx in [2^(e-1), 2^e): its fp32 ulp is 2^(e-24) */
  const double u = ldexp(1.0, e - 26);
  double s = 0.0;
  for (int k = 0; k < 17; ++k) s += trunc(x[k] / u) * u; /* exact: 17 multiples of u below 2^(e+5) */
  float f = (float)s;
  if (fabs((double)f) > fabs(s)) f = nextafterf(f, 0.0f);
  return f;
}

/* m16n8k16, row.col: g = lane / 4, t = lane % 4; a0 = A[g][2t, 2t+1], a1 = A[g+8][2t, 2t+1],
 * a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g];
 * d = D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1] (PTX ISA, mma.m16n8k16 fragments) */
static void op_mma(uint32_t (*in)[SIMT_NW], uint32_t (*out)[SIMT_NW]) {
  double A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int r = 0; r < 2; ++r) {
      A[g + 8 * r][2 * t] = hlo(in[l][r]);
      A[g + 8 * r][2 * t + 1] = hhi(in[l][r]);
      A[g + 8 * r][2 * t + 8] = hlo(in[l][2 + r]);
      A[g + 8 * r][2 * t + 9] = hhi(in[l][2 + r]);
    }
    B[2 * t][g] = hlo(in[l][4]);
    B[2 * t + 1][g] = hhi(in[l][4]);
    B[2 * t + 8][g] = hlo(in[l][5]);
    B[2 * t + 9][g] = hhi(in[l][5]);
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int r = g + 8 * (i >> 1), c = 2 * t + (i & 1);
      double x[17];
      for (int k = 0; k < 16; ++k) x[k] = A[r][k] * B[k][c]; /* products of f16 are exact */
      x[16] = (double)simt_f(in[l][6 + i]);
      out[l][i] = simt_u(mma_sum(x));
    }
  }
}

/* ldmatrix .x4 of 16-bit elements: lane 8 i + j gives row j of matrix i; lane (g, t) gets of
 * each matrix i row g, elements 2t, 2t+1 (trans: rows 2t, 2t+1 of column g) */
static void op_ldsm(uint32_t (*in)[SIMT_NW], uint32_t (*out)[SIMT_NW], int trans) {
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const unsigned char *row[2];
      for (int k = 0; k < 2; ++k) {
        const int src = 8 * i + (trans ? 2 * t + k : g);
        uintptr_t p;
        memcpy(&p, in[src], sizeof p);
        row[k] = (const unsigned char *)p;
      }
      uint16_t e[2];
      if (trans) {
        memcpy(&e[0], row[0] + 2 * g, 2);
        memcpy(&e[1], row[1] + 2 * g, 2);
      } else
        memcpy(e, row[0] + 4 * t, 4);
      out[l][i] = e[0] | (uint32_t)e[1] << 16;
    }
  }
}

static void compute(simt_warp_state *W, int par, int nl) {
  uint32_t(*in)[SIMT_NW] = W->in[par], (*out)[SIMT_NW] = W->out[par];
  switch (W->op) {
  case KIVI_SIMT_SHFL:
    for (int l = 0; l < nl; ++l) out[l][0] = in[in[l][1] & 31][0];
    break;
  case KIVI_SIMT_MAXU: {
    uint32_t m = 0;
    for (int l = 0; l < nl; ++l) m = in[l][0] > m ? in[l][0] : m;
    for (int l = 0; l < nl; ++l) out[l][0] = m;
    break;
  }
  case KIVI_SIMT_BALLOT: {
    uint32_t b = 0;
    for (int l = 0; l < nl; ++l) b |= (in[l][0] != 0) << l;
    for (int l = 0; l < nl; ++l) out[l][0] = b;
    break;
  }
  case KIVI_SIMT_BAR:
    break;
  case KIVI_SIMT_MMA:
    op_mma(in, out);
    break;
  default:
    op_ldsm(in, out, W->op == KIVI_SIMT_LDSMT);
  }
}

const uint32_t *kivi_simt_warp(int op, const uint32_t *in, int n, const char *file, int line) {
  const int w = cur >> 5, l = cur & 31;
  simt_warp_state *W = &wp[w];
  const int par = W->gen & 1;
  memcpy(W->in[par][l], in, (size_t)n * 4);
  if (W->arrived == 0) {
    W->op = op;
    W->n = n;
    W->file = file;
    W->line = line;
  } else if (W->op != op || W->n != n || ((file || W->file) && !same_site(file, line, W->file, W->line))) {
    fprintf(stderr, "simt: a warp collective at %s:%d, the warp's first arrival at %s:%d\n", file ? file : "-", line,
            W->file ? W->file : "-", W->line);
    fault("a warp's lanes reached different collectives", cur);
  }
  if (++W->arrived == live_w[w]) {
    const int nl = nth - 32 * w < 32 ? nth - 32 * w : 32;
    if (W->arrived != nl) fault("a warp collective after a lane of the warp exited", cur);
    if ((op == KIVI_SIMT_MMA || op == KIVI_SIMT_LDSM || op == KIVI_SIMT_LDSMT) && nl != 32)
      fault("mma/ldmatrix in a warp of fewer than 32 threads", cur);
    compute(W, par, nl);
    W->arrived = 0;
    ++W->gen;
    release(32 * w, 32 * w + nl, T_WAITW);
  } else {
    th[cur].state = T_WAITW;
    to_scheduler();
  }
  return W->out[par][l];
}

static void tramp(void) {
  body_();
  th[cur].state = T_DONE;
#if defined(__x86_64__)
  to_scheduler(); /* never resumed */
  abort();
#endif
}

/* a thread has exited: a barrier that the others all wait at is complete (an exited thread
 * counts as arrived); a warp collective that its live lanes wait at is a fault */
static void exited(int t) {
  const int w = t >> 5;
  --live;
  --live_w[w];
  if (wp[w].arrived > 0 && wp[w].arrived == live_w[w]) fault("a warp collective waits for a lane that exited", t);
  if (b_arrived > 0 && b_arrived == live) {
    b_arrived = 0;
    release(0, nth, T_WAITB);
  }
}

void kivi_simt_run(int nteams, int nthreads, void (^body)(void)) {
  if (nteams <= 0) return;
  if (nthreads <= 0 || nthreads > 1024) {
    fprintf(stderr, "simt: %d threads a team\n", nthreads);
    abort();
  }
  pthread_mutex_lock(&simt_lock);
  if (nthreads > cap) {
    free(th);
    free(wp);
    free(live_w);
    free(stacks);
    th = calloc((size_t)nthreads, sizeof *th);
    wp = calloc((size_t)(nthreads + 31) / 32, sizeof *wp);
    live_w = calloc((size_t)(nthreads + 31) / 32, sizeof *live_w);
    stacks = malloc((size_t)nthreads * SIMT_STACK);
    if (!th || !wp || !live_w || !stacks) {
      fprintf(stderr, "simt: out of memory\n");
      abort();
    }
    cap = nthreads;
  }
  nth = nthreads;
  nteams_ = nteams;
  body_ = body;
  for (bid = 0; bid < nteams; ++bid) {
    memset(wp, 0, (size_t)(nth + 31) / 32 * sizeof *wp);
    b_arrived = 0;
    live = nth;
    for (int w = 0; w < (nth + 31) / 32; ++w) live_w[w] = nth - 32 * w < 32 ? nth - 32 * w : 32;
    for (int i = 0; i < nth; ++i) {
      start_thread(i, stacks + (size_t)i * SIMT_STACK, SIMT_STACK);
      th[i].state = T_RUN;
    }
    for (int done = 0; done < nth;) {
      int ran = 0;
      for (int i = 0; i < nth; ++i)
        if (th[i].state == T_RUN) {
          cur = i;
          ran = 1;
          to_thread(i);
          if (th[i].state == T_DONE) {
            ++done;
            exited(i);
          }
        }
      if (!ran) fault("deadlock: every live thread waits at a barrier that cannot complete", -1);
    }
  }
  body_ = NULL;
  pthread_mutex_unlock(&simt_lock);
}
