#!/bin/sh
# examples/mpi/kivi_mpi_heads under `mpirun -np 2`: the kv-heads split across two ranks, the
# outputs gathered with MPI on rank 0 and checked against the whole model in one process.
# Skipped (77) when configure found no MPI.
set -eu
b=${top_builddir:-.}
[ "${KIVI_HAVE_MPI:-0}" = 1 ] || { echo "built without MPI: skipped"; exit 77; }
# root in CI containers, 2 ranks on possibly fewer cores, no ptrace-based single copy
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
# Open MPI keeps allocations until exit: LeakSanitizer (sanitizer builds) would report them
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
mpirun -np 2 --oversubscribe --bind-to none "$b/examples/mpi/kivi_mpi_heads${EXEEXT:-}" \
  --layers 2 --heads 8 --kv-heads 4 --head-dim 64 --context 300 --steps 3
mpirun -np 3 --oversubscribe --bind-to none "$b/examples/mpi/kivi_mpi_heads${EXEEXT:-}" \
  --layers 1 --heads 8 --kv-heads 8 --head-dim 128 --context 600 --steps 2
