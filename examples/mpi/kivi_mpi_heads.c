/* kivi_mpi_heads: the kv-heads of a layer stack partitioned across MPI ranks — each rank owns one
 * device (rank mod visible GPUs) or host threads and a cache with its heads — and the decode
 * outputs gathered on rank 0 with MPI, where they are checked against the whole model run in one
 * process.
 *
 *   mpirun -np 2 examples/mpi/kivi_mpi_heads [--layers 32] [--heads 32] [--kv-heads 32]
 *          [--head-dim 128] [--context 4096] [--batch 1] [--steps 4] [--bits 2] [--host] [--stream]
 *
 * --stream: each rank's cache on a CUDA stream of its own, the step's calls enqueued there and
 * one wait per step (examples/kivi_split.h); without a stream the synchronous calls.
 *
 * Exit status 0 on every rank when the gathered output matches. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kivi_cli.h"
#include "../kivi_split.h"

#define MPI_REL_TOL_FP32 1e-5  /* portable kernel on both sides: fp32, only the split order differs */
#define MPI_REL_TOL_F16X2 4e-3 /* the GPU f16x2 kernel on either side */

int main(int argc, char **argv) {
  static const char usage[] =
      "usage: mpirun -np N kivi_mpi_heads [--layers N] [--heads N] [--kv-heads N] [--head-dim N] [--context N]\n"
      "                                   [--batch N] [--steps N] [--bits B] [--host] [--stream]\n"
      "                                   [--help] [--version]\n"
      "The kv-heads split across MPI ranks (one GPU per rank when there are GPUs), the outputs\n"
      "gathered with MPI and checked against one process.\n";
  const int info_rc = kivi_cli_info(argc, argv, "kivi_mpi_heads", kivi_version_string(), usage);
  if (info_rc >= 0) return info_rc;
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  split_shape s = {32, 32, 32, 128, 1, 4096, 4, 2, 0};
  int host = 0;
  for (int i = 1; i < argc; ++i) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--host")) { host = 1; continue; }
    if (!strcmp(a, "--stream")) { s.stream = 1; continue; }
    int *iv = !strcmp(a, "--layers") ? &s.layers : !strcmp(a, "--heads") ? &s.HQ : !strcmp(a, "--kv-heads") ? &s.H
            : !strcmp(a, "--head-dim") ? &s.D : !strcmp(a, "--context") ? &s.context : !strcmp(a, "--batch") ? &s.batch
            : !strcmp(a, "--steps") ? &s.steps : !strcmp(a, "--bits") ? &s.bits : NULL;
    if (!iv || !v) {
      if (rank == 0) (void)kivi_cli_bad("kivi_mpi_heads", iv ? "missing value after" : "unknown option", a);
      MPI_Finalize();
      return 2;
    }
    *iv = atoi(argv[++i]);
  }
  if (s.H < size || s.HQ % s.H || s.batch < 1 || s.batch > 256 || s.steps < 1) {
    if (rank == 0) fprintf(stderr, "kivi_mpi_heads: need kv-heads >= ranks and heads a multiple of kv-heads\n");
    MPI_Finalize();
    return 2;
  }
  /* this rank's device: rank mod visible GPUs, or host threads */
  kivi_context *ctx = NULL;
  kivi_context_info info;
  memset(&info, 0, sizeof info);
  int device = KIVI_DEVICE_HOST;
  if (!host && kivi_context_create(&ctx, KIVI_DEVICE_DEFAULT) == KIVI_OK && !kivi_context_get_info(ctx, &info) &&
      info.on_gpu && info.num_devices > 0)
    device = rank % info.num_devices;
  kivi_context_destroy(ctx);
  ctx = NULL;
  kivi_status st = kivi_context_create(&ctx, device);
  const int h0 = (int)((long)s.H * rank / size), h1 = (int)((long)s.H * (rank + 1) / size);
  split_part part;
  if (!st) st = split_part_init(&part, &s, ctx, h0, h1);
  const int gsz = s.HQ / s.H, nhq = (h1 - h0) * gsz;
  const size_t mine = (size_t)s.layers * s.batch * nhq * s.D;
  float *out = malloc(mine * sizeof(float));
  double t_steps = 0;
  for (int step = 0; step < s.steps && !st; ++step) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    st = split_part_step(&part, step, out);
    MPI_Barrier(MPI_COMM_WORLD);
    if (step > 0 || s.steps == 1) t_steps += MPI_Wtime() - t0;
  }
  unsigned kernels = 0;
  if (!st) (void)kivi_cache_last_kernels(part.cache, &kernels);
  kivi_cache_stats cs = {0};
  if (!st) (void)kivi_cache_get_stats(part.cache, &cs);
  /* every rank's status, then the outputs of the last step on rank 0 */
  int ok = st == KIVI_OK, all_ok = 0;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (!all_ok) {
    if (!ok) fprintf(stderr, "kivi_mpi_heads: rank %d: %s\n", rank, kivi_status_string(st));
    MPI_Finalize();
    return 1;
  }
  int *counts = NULL, *displs = NULL;
  float *gathered = NULL;
  const size_t whole_n = (size_t)s.layers * s.batch * s.HQ * s.D;
  if (rank == 0) {
    counts = malloc((size_t)size * sizeof *counts);
    displs = malloc((size_t)size * sizeof *displs);
    gathered = malloc(whole_n * sizeof(float));
    for (int r = 0, off = 0; r < size; ++r) {
      const int a = (int)((long)s.H * r / size), b = (int)((long)s.H * (r + 1) / size);
      counts[r] = s.layers * s.batch * (b - a) * gsz * s.D;
      displs[r] = off;
      off += counts[r];
    }
  }
  MPI_Gatherv(out, (int)mine, MPI_FLOAT, gathered, counts, displs, MPI_FLOAT, 0, MPI_COMM_WORLD);
  unsigned all_kernels = 0;
  MPI_Reduce(&kernels, &all_kernels, 1, MPI_UNSIGNED, MPI_BOR, 0, MPI_COMM_WORLD);
  double max_bytes = (double)cs.allocated_bytes, top = 0;
  MPI_Reduce(&max_bytes, &top, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  int pass = 1;
  if (rank == 0) {
    float *whole = malloc(whole_n * sizeof(float)), *ref = malloc(whole_n * sizeof(float));
    for (int r = 0; r < size; ++r) {
      const int a = (int)((long)s.H * r / size), b = (int)((long)s.H * (r + 1) / size);
      split_place(&s, a * gsz, b * gsz, gathered + displs[r], whole);
    }
    /* the whole model in this one process, the same steps */
    split_part one;
    st = split_part_init(&one, &s, ctx, 0, s.H);
    for (int step = 0; step < s.steps && !st; ++step) st = split_part_step(&one, step, ref);
    unsigned kk = 0;
    if (!st) (void)kivi_cache_last_kernels(one.cache, &kk);
    split_part_free(&one);
    const double err = st ? 1.0 : split_rel_err(whole, ref, whole_n);
    const double tol = ((all_kernels | kk) & KIVI_KERNEL_GPU_F16X2) ? MPI_REL_TOL_F16X2 : MPI_REL_TOL_FP32;
    pass = !st && err <= tol;
    printf("%d ranks x %d-%d kv-heads (%d layers, %d q-heads / %d kv-heads x %d, %d-bit, batch %d, context %d), "
           "devices: %s\n", size, s.H / size, (s.H + size - 1) / size, s.layers, s.HQ, s.H, s.D, s.bits, s.batch,
           s.context, device == KIVI_DEVICE_HOST ? "host threads" : "GPUs");
    printf("decode step %.3f ms (all layers, barrier to barrier), largest rank cache %.1f MB\n",
           1e3 * t_steps / (s.steps > 1 ? s.steps - 1 : 1), top / 1e6);
    printf("gathered output vs one process: rel err %.2e (tolerance %.0e): %s\n", err, tol, pass ? "ok" : "FAILED");
    free(whole);
    free(ref);
    free(gathered);
    free(counts);
    free(displs);
  }
  MPI_Bcast(&pass, 1, MPI_INT, 0, MPI_COMM_WORLD);
  split_part_free(&part);
  kivi_context_destroy(ctx);
  free(out);
  MPI_Finalize();
  return pass ? 0 : 1;
}
