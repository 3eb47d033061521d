#!/bin/bash
# GPU kernel times from Nsight Compute (caches flushed before every kernel, as in the anchors of
# ../shared/research/anchors-gpu.md), for an already-built offload tree:
#   1. the decode kernels of 2- and 4-bit caches at every default kivi-bench shape (one launch =
#      one decode step), median per kernel and launch geometry;
#   2. every kernel of a 30-layer decode step (kivi_layers, batch 1, context 4096), mean per kernel;
#   3. stall reasons of a decode step's append (the one-kernel append: launch 100 of the append
#      kernels, after the 30 layers' prefill of 3 kernels each).
# Usage (project root, GPU machine): . .devrt/env.sh; bash scripts/gpu-kernel-times.sh BUILD OUT
# (SECTIONS="2" runs only the listed sections; default "1 2 3".)
set -u
b=$1; out=$2
mkdir -p "$out" || exit 1
ncu=${NCU:-/usr/local/cuda/bin/ncu}
export LD_LIBRARY_PATH=$PWD/$b/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
q="--csv --print-units base --print-kernel-base function --metrics gpu__time_duration.sum"
# The program's own output is mixed in: only CSV lines count; columns are found by their header.
summ() { awk -F'","' -v key="$1" '
  /^"ID","/ { for (i = 1; i <= NF; ++i) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
  /^"/ && ("Metric Name" in col) && $col["Metric Name"] == "gpu__time_duration.sum" {
    val = $col["Metric Value"]; gsub(/[",]/, "", val);
    k = $col["Kernel Name"]; sub(/^__omp_offloading_[0-9a-f]+_[0-9a-f]+_/, "", k);
    if (key == "grid") k = k " grid " $col["Grid Size"];
    if (!(k in n)) order[++no] = k; v[k, ++n[k]] = val / 1000 }
  END { for (i = 1; i <= no; ++i) { k = order[i]; m = n[k]; s = 0;
          for (j = 1; j <= m; ++j) { a[j] = v[k, j]; s += a[j] }
          for (x = 1; x <= m; ++x) for (y = x + 1; y <= m; ++y) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
          printf "%-44s launches %4d   median %9.2f us   mean %9.2f us\n", k, m, a[int((m + 1) / 2)], s / m } }'; }
sections=" ${SECTIONS:-1 2 3} "
if [[ $sections == *" 1 "* ]]; then
echo "=== 1. f16x2 decode kernels per kivi-bench shape (grid = rows x heads x slots; l21/l21_1: 2-bit, l21_2/l21_3: 4-bit)"
$ncu $q -k regex:kivi_gpu_gqa_decode "$b/bench/kivi-bench" --skip-append --reps 3 > "$out/ncu_bench.csv" 2> "$out/ncu_bench.err"
summ grid < "$out/ncu_bench.csv"
fi
if [[ $sections == *" 2 "* ]]; then
echo "=== 2. kernels of a decode step: kivi_layers --steps 2 (30 layers, batch 1, context 4096, 2-bit)"
$ncu $q "$b/examples/kivi_layers" --steps 2 > "$out/ncu_layers.csv" 2> "$out/ncu_layers.err"
summ name < "$out/ncu_layers.csv"
fi
if [[ $sections == *" 3 "* ]]; then
echo "=== 3. stall reasons of a decode step's append"
$ncu --section LaunchStats --section WarpStateStats --section SchedulerStats -k regex:append_impl --launch-skip 100 \
  --launch-count 1 "$b/examples/kivi_layers" --steps 2 > "$out/ncu_append.txt" 2>&1
grep -E "Duration|Block Size|Grid Size|Registers|Stall|Warp Cycles|Issued|Eligible|Active Warps" "$out/ncu_append.txt" | head -40
fi
