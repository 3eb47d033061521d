#!/bin/bash
# sweep.sh BUILD OUT SET: fp16-cache decode GPU time (ncu, GPU's own clocks, median of the 5 timed
# launches) for forced split lengths (KIVI_TUNE_F16_FS of the measurement build, tune.patch) at
# each shape.  SET 1 (call 1, with the DRAM throughput) or 2 (call 2; the runs were those of two scripts, merged here),
# 3 (large batches, rows of 4096 tokens: ../../h100/f16-batch-splits, run on an H100); BUDGET seconds in all.
b=$1; O=$2; set=$3; o=$O/sweep; mkdir -p $o
export LD_LIBRARY_PATH=$PWD/$b/.libs:$LD_LIBRARY_PATH
ncu=/usr/local/cuda/bin/ncu; end=$((SECONDS + ${BUDGET:-300}))
met=gpu__time_duration.sum,launch__grid_size
[ "$set" = 1 ] && met=$met,dram__throughput.avg.pct_of_peak_sustained_elapsed
med() { awk -F'","' '/^"ID","/ { for (i = 1; i <= NF; ++i) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
  /^"/ && ("Metric Name" in col) { m = $col["Metric Name"]; v = $col["Metric Value"]; gsub(/[",]/, "", v)
    if (m == "gpu__time_duration.sum") t[n++] = v / 1000; if (m == "launch__grid_size") g = v;
    if (m == "dram__throughput.avg.pct_of_peak_sustained_elapsed") d[nd++] = v }
  END { if (n < 8) { print "- - -"; exit } for (j = 0; j < 5; ++j) a[j] = t[3 + j]
    for (x = 0; x < 5; ++x) for (y = x + 1; y < 5; ++y) if (a[y] < a[x]) { s = a[x]; a[x] = a[y]; a[y] = s }
    printf "%.1f %s %.0f", a[2], g, d[5] }' "$1"; }
run() { # run "B,HQ,S KV D" FS...
  set -- $1 ${@:2}; sh=$1 kv=$2 d=$3; shift 3
  for fs in def "$@"; do
    [ $SECONDS -gt $end ] && { echo "| $sh q/$kv kv, D $d | $fs | (out of time) |"; continue; }
    f=$o/${sh//,/_}_${kv}_${d}_$fs.csv
    if [ $fs = def ]; then unset KIVI_TUNE_F16_FS; else export KIVI_TUNE_F16_FS=$fs; fi
    timeout 60 $ncu --clock-control none --csv --print-units base --metrics $met -k regex:f16_decode \
      $b/bench/kivi-bench --shape $sh --kv-heads $kv --head-dim $d --skip-append --reps 5 > $f 2>&1
    echo "| $sh q/$kv kv, D $d | $fs | $(med $f | tr " " "|") |"
  done
}
{
echo "| shape | fs | µs (median of 5) | grid | DRAM % (set 1) |"
echo "|---|---|---|---|---|"
if [ "$set" = 1 ]; then
  run "8,28,32768 4 128" 384 512 640 768 1536 2048
  run "8,64,32768 8 128" 512 640 768 896 1536 2048
  run "8,32,32768 8 128" 768 1536 2048
  run "32,32,4096 8 128" 384 448 640 768
  run "1,32,32768 8 128" 1536 2048 4096
  run "1,32,32768 32 128" 512 768 2048 4096
  run "1,32,4096 8 128" 192 320 384
elif [ "$set" = 3 ]; then
  run "32,32,4096 8 128" 4096
  run "8,32,4096 32 128" 4096 2048
  run "16,32,4096 8 128" 4096
  run "8,32,4096 8 128" 1024
  run "32,9,4096 3 64" 4096
else
  run "8,28,32768 4 128" 2048 2560 3072 4096
  run "8,64,32768 8 128" 2048 3072 4096
  run "8,32,32768 8 128" 1536 2048 4096
  run "32,32,4096 8 128" 1024 2048 4096
  run "1,32,32768 8 128" 2048 4096
  run "1,32,32768 32 128" 2048 4096
  run "8,9,32768 3 64" 2048 4096
fi
} | tee $o/sweep.md
