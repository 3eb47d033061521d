/* order-probe: what ordering N dependent device regions costs with LLVM 19's offload runtime,
 * route by route (the candidates for a model's chained decode step).  Each "layer" is one small
 * kernel that reads what the previous one wrote (x = 3 x + i in 64-bit integers, not commutative: a wrong order
 * gives a wrong result, which the probe checks).  Routes:
 *   sync      a synchronous target region per layer
 *   dep       target nowait depend(inout: x) per layer, one taskwait (the library's lanes today)
 *   nodep     target nowait without depend, one taskwait (ordered only if the runtime keeps
 *             issue order on one queue; checked)
 *   fused     one region whose kernel runs the N layers in a device loop (the lower bound)
 *   interop   whether omp_get_interop_ptr(targetsync) hands out a CUDA stream
 * Kernel work per layer: W iterations of a dependent FMA chain in 132 x 128 threads.
 * Build (offload): clang-19 -O2 -fopenmp -fopenmp-targets=nvptx64-nvidia-cuda --offload-arch=sm_90
 *   --cuda-path=/usr/local/cuda -foffload-lto order-probe.c -o order-probe; kivi-cubin-fix order-probe
 * Run: OMP_TARGET_OFFLOAD=MANDATORY ./order-probe [N] [W]; also with LIBOMP_NUM_HIDDEN_HELPER_THREADS=1. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return omp_get_wtime(); }
static int cmpd(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* one layer's kernel: thread 0 carries the dependence; every thread burns W FMAs */
#define LAYER_BODY(i)                                               \
  for (int t = 0; t < 132 * 128; ++t) {                             \
    float a = w[t];                                                 \
    for (int k = 0; k < W; ++k) a = a * 0.999f + 0.001f;            \
    w[t] = a;                                                       \
    if (t == 0) x[0] = 3u * x[0] + (unsigned long long)(i);                            \
  }

/* x = 3 x + i in 64-bit integers (exact on host and device, wrapping) */
static unsigned long long expect(int N) {
  unsigned long long x = 1;
  for (int i = 0; i < N; ++i) x = 3u * x + (unsigned long long)i;
  return x;
}

int main(int argc, char **argv) {
  const int N = argc > 1 ? atoi(argv[1]) : 60, W = argc > 2 ? atoi(argv[2]) : 0, REP = 7;
  const int dev = omp_get_default_device();
  printf("order-probe: %d devices, N = %d layers, W = %d, helper threads env '%s'\n", omp_get_num_devices(), N, W,
         getenv("LIBOMP_NUM_HIDDEN_HELPER_THREADS") ? getenv("LIBOMP_NUM_HIDDEN_HELPER_THREADS") : "");
  unsigned long long *x = omp_target_alloc(sizeof *x, dev);
  float *w = omp_target_alloc(sizeof(float) * 132 * 128, dev);
  float *w0 = calloc(132 * 128, sizeof(float));
  omp_target_memcpy(w, w0, sizeof(float) * 132 * 128, 0, 0, dev, omp_get_initial_device());
  const char *names[4] = {"sync", "dep", "nodep", "fused"};
  for (int route = 0; route < 4; ++route) {
    double t[REP];
    unsigned long long got = 0;
    int ok = 1;
    for (int r = 0; r < REP; ++r) {
      const unsigned long long one = 1;
      omp_target_memcpy(x, &one, sizeof one, 0, 0, dev, omp_get_initial_device());
      const double t0 = now();
      if (route == 0) {
        for (int i = 0; i < N; ++i) {
#pragma omp target teams distribute parallel for num_teams(132) thread_limit(128) device(dev) is_device_ptr(x, w)
          LAYER_BODY(i)
        }
      } else if (route == 1) {
        for (int i = 0; i < N; ++i) {
#pragma omp target teams distribute parallel for num_teams(132) thread_limit(128) device(dev) is_device_ptr(x, w) nowait depend(inout : x[0])
          LAYER_BODY(i)
        }
#pragma omp taskwait
      } else if (route == 2) {
        for (int i = 0; i < N; ++i) {
#pragma omp target teams distribute parallel for num_teams(132) thread_limit(128) device(dev) is_device_ptr(x, w) nowait
          LAYER_BODY(i)
        }
#pragma omp taskwait
      } else {
        /* the N layers' work in one launch, each thread looping over the layers (thread 0's
         * chain keeps the order): what the device time of the step is without launches */
#pragma omp target teams distribute parallel for num_teams(132) thread_limit(128) device(dev) is_device_ptr(x, w)
        for (int t = 0; t < 132 * 128; ++t) {
          float a = w[t];
          for (int i = 0; i < N; ++i) {
            for (int k = 0; k < W; ++k) a = a * 0.999f + 0.001f;
            if (t == 0) x[0] = 3u * x[0] + (unsigned long long)i;
          }
          w[t] = a;
        }
      }
      t[r] = now() - t0;
      omp_target_memcpy(&got, x, sizeof got, 0, 0, omp_get_initial_device(), dev);
      ok &= got == expect(N);
    }
    qsort(t, REP, sizeof(double), cmpd);
    printf("%-6s median %9.1f us total, %7.2f us per layer, order %s\n", names[route], t[REP / 2] * 1e6,
           t[REP / 2] * 1e6 / N, ok ? "kept" : "BROKEN");
    fflush(stdout);
  }
  /* interop: can a caller get the device's stream? */
  omp_interop_t obj = omp_interop_none;
  if (omp_get_num_devices() > 0) {
#pragma omp interop init(targetsync : obj) device(dev)
  }
  int rc = 0;
  void *stream = obj != omp_interop_none ? omp_get_interop_ptr(obj, omp_ipr_targetsync, &rc) : NULL;
  printf("interop: object %s, targetsync stream %p (rc %d), fr %s\n", obj != omp_interop_none ? "created" : "none",
         stream, rc, obj != omp_interop_none ? omp_get_interop_str(obj, omp_ipr_fr_name, &rc) : "-");
  if (obj != omp_interop_none) {
#pragma omp interop destroy(obj)
  }
  omp_target_free(x, dev);
  omp_target_free(w, dev);
  free(w0);
  return 0;
}
