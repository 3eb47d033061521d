#!/bin/bash
# ab.sh OUTDIR "SHAPES" BUILD...: KIVI-2 decode GPU time (ncu gpu__time_duration, median of the 5 timed
# launches of the first fast_decode kernel series = the 2-bit cache) for each shape and build, builds
# interleaved per shape. Prints one line per (shape, build).
o=$1; shapes=$2; shift 2; mkdir -p $o
for b in "$@"; do xz -dk gpu/$b/.libs/libkivi-omp.so.1.xz 2>/dev/null; done
for s in $shapes; do
  IFS=, read -r B HQ HK D S <<< "$s"
  for b in "$@"; do
    f=$o/${b}_${B}_${HQ}_${HK}_${S}.csv
    LD_LIBRARY_PATH=$PWD/gpu/$b/.libs:$LD_LIBRARY_PATH /usr/local/cuda/bin/ncu --csv --print-units base --clock-control none \
      --metrics gpu__time_duration.sum -k regex:kivi_gpu_fast_decode gpu/$b/bench/kivi-bench --shape $B,$HQ,$S --kv-heads $HK \
      --head-dim $D --skip-append --reps 5 > $f 2> $f.err
    t=$(grep gpu__time_duration $f | awk -F'","' '{v=$NF; gsub(/[",]/,"",v); print v/1000}' | head -8 | tail -5 | sort -n | sed -n 3p)
    echo "$s $b KIVI-2 ${t:-FAIL} us"
  done
done
