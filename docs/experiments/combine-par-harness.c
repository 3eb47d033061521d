/* Host emulation of fk_combine (src/attention_gpu.c), its text extracted verbatim:
 *   awk '/^__attribute__\(\(noinline\)\) static void fk_combine/,/^}/' src/attention_gpu.c > fk_combine.inc
 * 128 pthreads as one block, barriers for fk_sync, warp reductions through shared arrays.
 * Compared with kivi_combine_item (kernels_attn.h) on random partials, empty slots holding NaN
 * garbage.  Not built by the project.  Build, from the directory holding fk_combine.inc:
 *   gcc -O2 -I. -I<host build dir> -Isrc -Iinclude docs/experiments/combine-par-harness.c -lpthread -lm */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "half.h"
#include "kernels_attn.h"
#define FNT 128
#define FD 128
static pthread_barrier_t bar;
static float xs[FNT];
static void fk_sync(void) { pthread_barrier_wait(&bar); }
static __thread int my_tid;
static float wred(float v, int mx) {
  fk_sync();
  xs[my_tid] = v;
  fk_sync();
  float r = mx ? -INFINITY : 0.0f;
  const int w0 = my_tid & ~31;
  for (int i = 0; i < 32; ++i) r = mx ? fmaxf(r, xs[w0 + i]) : r + xs[w0 + i];
  fk_sync();
  return r;
}
static float wmax(float v) { return wred(v, 1); }
static float wsum(float v) { return wred(v, 0); }
static float fk_ex2(float x) { return exp2f(x); }
#include "fk_combine.inc"
static int NS, RH;
static float *PO, *PML, *OUT, S_W[FNT], S_R[4];
static void *run(void *a) {
  my_tid = (int)(intptr_t)a;
  for (int rh = 0; rh < RH; ++rh) fk_combine((size_t)rh, my_tid, NS, PO, PML, OUT, 0, S_W, S_R);
  return NULL;
}
int main(void) {
  const int ns_list[] = {1, 2, 5, 9, 17, 33, 127, 128, 129, 300};
  double worst = 0;
  srand(7);
  for (unsigned k = 0; k < sizeof ns_list / sizeof *ns_list; ++k) {
    NS = ns_list[k]; RH = 3;
    PO = malloc(sizeof(float) * RH * NS * FD); PML = malloc(sizeof(float) * RH * NS * 2); OUT = malloc(sizeof(float) * RH * FD);
    float *ref = malloc(sizeof(float) * RH * FD);
    for (int rh = 0; rh < RH; ++rh)
      for (int s = 0; s < NS; ++s) {
        const int empty = NS > 1 && rand() % 4 == 0 && s != 0;
        PML[((size_t)rh * NS + s) * 2] = empty ? -INFINITY : (float)(rand() % 2000) / 100.0f - 10.0f;
        PML[((size_t)rh * NS + s) * 2 + 1] = empty ? 0.0f : 1.0f + (float)(rand() % 1000) / 10.0f;
        for (int d = 0; d < FD; ++d) PO[((size_t)rh * NS + s) * FD + d] = empty ? NAN : (float)(rand() % 2001 - 1000) / 7.0f;
      }
    for (int64_t i = 0; i < (int64_t)RH * FD; ++i) kivi_combine_item(i, FD, NS, PO, PML, ref, 0, NULL);
    pthread_barrier_init(&bar, NULL, FNT);
    pthread_t th[FNT];
    for (int t = 0; t < FNT; ++t) pthread_create(&th[t], NULL, run, (void *)(intptr_t)t);
    for (int t = 0; t < FNT; ++t) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    double w = 0, mref = 0;
    for (int i = 0; i < RH * FD; ++i) { w = fmax(w, fabs((double)OUT[i] - ref[i])); mref = fmax(mref, fabs(ref[i])); if (isnan(OUT[i])) w = INFINITY; }
    printf("nslots %3d: max |diff| / max |ref| = %.2e\n", NS, w / mref);
    if (w / mref > worst) worst = w / mref;
    free(PO); free(PML); free(OUT); free(ref);
  }
  printf("worst %.2e -> %s\n", worst, worst < 1e-5 ? "OK" : "FAIL");
  return worst < 1e-5 ? 0 : 1;
}
