#!/bin/bash
# Runs an already-built offload tree on a GPU machine that has no compiler: every test program,
# kivi_hello with LIBOMPTARGET_INFO, and optionally kivi-bench.  Usage (from the project root):
#   . .devrt/env.sh; bash scripts/gpu-check.sh BUILD_DIR OUT_DIR [bench args...]
# OMP_TARGET_OFFLOAD=MANDATORY (set by env.sh) makes a silent host fallback a failure, and
# KIVI_TEST_EXPECT_GPU=1 makes the tests fail if their context is not on the GPU.
# The test programs link Check's libsubunit.so.0, which the GPU machine lacks: copy it into
# BUILD_DIR/.libs before sending the tree (cp -L /lib/x86_64-linux-gnu/libsubunit.so.0 BUILD/.libs/);
# this script stops with that advice when it is missing.  The Fortran test needs gfortran's
# runtime (libgfortran.so.5, libquadmath.so.0) there too; without them it fails, so copy them
# into BUILD_DIR/.libs as well.
set -u
b=$1; out=$2; shift 2
if ! ldconfig -p | grep -q libsubunit.so.0 && [ ! -e "$b/.libs/libsubunit.so.0" ]; then
  echo "gpu-check: libsubunit.so.0 is neither installed here nor in $b/.libs (copy it there from the build machine)"
  exit 1
fi
mkdir -p "$out" || exit 1
export LD_LIBRARY_PATH=$PWD/$b/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# cuBLAS and the CUDA runtime of the device model (a build with cuBLAS links them): the CUDA
# toolkit's when it is installed, else a Python installation's (PyTorch's nvidia wheels)
if ! ldconfig -p | grep -q libcublas.so && [ ! -d /usr/local/cuda/lib64 ]; then
  for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    for l in $(find "$d/nvidia" \( -name 'libcublas.so.*' -o -name 'libcudart.so.*' \) 2>/dev/null); do
      LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$l")
    done
  done
fi
export CK_FORK=no CK_DEFAULT_TIMEOUT=1200 KIVI_TEST_EXPECT_GPU=1 top_builddir=$b top_srcdir=. KIVI_HAVE_OFFLOAD=1
echo "OMP_TARGET_OFFLOAD=${OMP_TARGET_OFFLOAD:-unset}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.total --format=csv,noheader
pass=0; fail=0
for t in examples/kivi_hello tests/test_version tests/test_context tests/test_half tests/test_layout \
         tests/test_cache tests/test_conformance tests/test_attention tests/test_checkpoint tests/test_threads tests/test_gguf \
         tests/test_async tests/test_contract tests/test_rotate tests/test_model_dev tests/examples/test_layers.sh tests/examples/test_multi_device.sh tests/model/test_model_run.sh \
         tests/pkg/test_tools.sh tests/pkg/test_fortran.sh; do
  echo "=== $t"
  case $t in *.sh) cmd="sh $t" ;; *) cmd="$b/$t" ;; esac
  timeout 900 $cmd > "$out/$(basename $t).log" 2>&1; rc=$?
  if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "PASS: $t"
  elif [ $rc -eq 77 ]; then echo "SKIP: $t"
  else fail=$((fail+1)); echo "FAIL: $t"; fi
  tail -n 12 "$out/$(basename $t).log"
done
echo "=== kivi_hello with LIBOMPTARGET_INFO=1 (kernel launches)"
LIBOMPTARGET_INFO=1 "$b/examples/kivi_hello" > "$out/hello_info.log" 2>&1
grep -m 6 -E "Launching kernel|Entering OpenMP kernel|libomptarget" "$out/hello_info.log"
grep -c -E "Launching kernel|Entering OpenMP kernel" "$out/hello_info.log" | sed "s/^/kernel launches seen: /"
echo "$pass passed, $fail failed"
if [ $# -gt 0 ]; then
  echo "=== kivi-bench $*"
  timeout "${KIVI_BENCH_TIMEOUT:-400}" "$b/bench/kivi-bench" "$@" 2>&1 | tee "$out/bench.log"
fi
