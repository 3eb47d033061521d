#!/bin/bash
# sweep.sh OUT: split lengths forced through the measurement build's KIVI_TUNE_* variables (BUILD)
O=$1; o=$O/sweep; mkdir -p $o
xz -dk BUILD/.libs/libkivi-omp.so.1.xz 2>/dev/null
export LD_LIBRARY_PATH=$PWD/BUILD/.libs:$LD_LIBRARY_PATH
ncu=/usr/local/cuda/bin/ncu; end=$((SECONDS + ${BUDGET:-540}))
med() { awk -F'","' '/^"ID","/ { for (i = 1; i <= NF; ++i) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
  /^"/ && ("Metric Name" in col) { m = $col["Metric Name"]; v = $col["Metric Value"]; gsub(/[",]/, "", v)
    if (m == "gpu__time_duration.sum") t[n++] = v / 1000; if (m == "launch__grid_size") g = v }
  END { if (n < 8) { print "- -"; exit } for (j = 0; j < 5; ++j) a[j] = t[3 + j]
    for (x = 0; x < 5; ++x) for (y = x + 1; y < 5; ++y) if (a[y] < a[x]) { s = a[x]; a[x] = a[y]; a[y] = s }
    printf "%.1f %s", a[2], g }' "$1"; }
run() { # run VAR KERNEL "B,H,S KV D" FS...
  var=$1 k=$2; set -- $3 ${@:4}; sh=$1 kv=$2 d=$3; shift 3
  for fs in def "$@"; do
    [ $SECONDS -gt $end ] && { echo "| $var | $sh/$kv/$d | $fs | (out of time) |"; continue; }
    f=$o/${var}_${sh//,/_}_${kv}_${d}_$fs.csv
    if [ $fs = def ]; then env -u $var timeout 60 $ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,launch__grid_size -k regex:$k BUILD/bench/kivi-bench --shape $sh --kv-heads $kv --head-dim $d --skip-append --reps 5 > $f 2>&1
    else env $var=$fs timeout 60 $ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,launch__grid_size -k regex:$k BUILD/bench/kivi-bench --shape $sh --kv-heads $kv --head-dim $d --skip-append --reps 5 > $f 2>&1; fi
    echo "| $var | $sh q/$kv kv, D $d | $fs | $(med $f | tr " " "|") |"
  done
}
{
echo "| variable | shape | fs | µs (median of 5) | grid |"
run KIVI_TUNE_F16_FS f16_decode "1,32,4096 8 128" 128 256 512 1024
run KIVI_TUNE_F16_FS f16_decode "8,32,4096 8 128" 128 256 512 1024
run KIVI_TUNE_F16_FS f16_decode "1,32,32768 8 128" 256 512 1024
run KIVI_TUNE_F16_FS f16_decode "1,32,4096 32 128" 128 256 512 1024
run KIVI_TUNE_F16_FS f16_decode "1,9,4096 3 64" 128 256 512 1024
run KIVI_TUNE_GQA_FS fast_decode "1,9,4096 3 64" 128 256 1024
run KIVI_TUNE_FAST_FS fast_decode "1,32,4096 32 128" 256 1024 2048
run KIVI_TUNE_FAST_FS fast_decode "1,32,4096 8 128" 256 1024 2048
run KIVI_TUNE_GQA_FS fast_decode "8,32,4096 8 128" 256 1024
run KIVI_TUNE_F16_FS f16_decode "32,32,4096 8 128" 256 512 1024
run KIVI_TUNE_F16_FS f16_decode "8,32,32768 8 128" 512 1024
} | tee $o/sweep.md
tar czf $O/sweep.tgz -C $O sweep && rm -rf $o
