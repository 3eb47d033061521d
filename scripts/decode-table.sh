#!/bin/bash
# The decode tables of the README: for each shape (batch B, HQ query heads over HK kv-heads,
# head_dim D, context S), the GPU time of one decode call of ours (fp16 cache, KIVI-2, KIVI-4)
# and of PyTorch's fp16 scaled_dot_product_attention (cuDNN), both from Nsight Compute
# (gpu__time_duration, caches flushed before every kernel, the same clock control: CLOCK, default
# "none", the GPU's own clocks, as a user's program and a CUDA-event timing run; "base" locks them
# to their base values, Nsight Compute's default), median of 5 calls; cuDNN's figure is the sum of
# the kernels one SDPA call launches.  cuDNN is also timed with CUDA events (L2 flushed, median of
# 20), as before.  Usage (project root, GPU machine, offload build in BUILD):
#   . <runtime env>; [CLOCK=none|base] bash scripts/decode-table.sh BUILD OUT [B,HQ,HK,D,S ...]
# Default shapes (the README's 15): MHA 32/32 and GQA 32/8 at (1, 4k) (1, 32k) (8, 4k) (8, 32k)
# (32, 4k), 28/4, 64/8 and 9/3 (D 64) at (8, 32k), and 9/3 (D 64) at (1, 4k) and (32, 4k).
# Writes OUT/decode-table.md (also the mean SM clock of each run: OUT/clocks.md) and OUT/sdpa.json.
set -u
b=$1; out=$2; shift 2
mkdir -p "$out" || exit 1
ncu=${NCU:-/usr/local/cuda/bin/ncu}
py=${PYTHON:-python3}
clock=${CLOCK:-none}
export LD_LIBRARY_PATH=$PWD/$b/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
shapes=("$@")
if [ ${#shapes[@]} -eq 0 ]; then
  for kv in 32 8; do
    for bs in 1,4096 1,32768 8,4096 8,32768 32,4096; do shapes+=("${bs%,*},32,$kv,128,${bs#*,}"); done
  done
  shapes+=(8,28,4,128,32768 8,64,8,128,32768 8,9,3,64,32768 1,9,3,64,4096 32,9,3,64,4096)
fi
$py scripts/sdpa-anchor.py "$out/sdpa.json" "${shapes[@]}" > "$out/sdpa.log" 2>&1 || echo "sdpa anchor failed: $(tail -3 "$out/sdpa.log")"
m="--csv --print-units base --clock-control $clock --metrics gpu__time_duration.sum,gpc__cycles_elapsed.avg.per_second"
# the values of metric $1 in an ncu CSV, one a line, in launch order
vals() {
  awk -F'","' -v m="$1" '
    /^"ID","/ { for (i = 1; i <= NF; ++i) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
    /^"/ && ("Metric Name" in col) && $col["Metric Name"] == m { v = $col["Metric Value"]; gsub(/[",]/, "", v); print v }' "$2"
}
{
  echo "| B | q/kv heads | D | S | cuDNN fp16 µs | ours fp16 µs | fp16 vs cuDNN | KIVI-2 µs | cuDNN / KIVI-2 | KIVI-4 µs | cuDNN / KIVI-4 | cuDNN, CUDA events µs |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$out/decode-table.md"
{
  echo "| B | q/kv heads | D | S | SM clock, ours fp16 / KIVI-2 / KIVI-4 MHz | SM clock, cuDNN MHz |"
  echo "|---|---|---|---|---|---|"
} > "$out/clocks.md"
for s in "${shapes[@]}"; do
  IFS=, read -r B HQ HK D S <<< "$s"
  tag="b${B}_q${HQ}_k${HK}_d${D}_s${S}"
  $ncu $m -k regex:'kivi_gpu_f16_decode|kivi_gpu_fast_decode|kivi_gpu_gqa_decode|run_rows' "$b/bench/kivi-bench" --shape "$B,$HQ,$S" --kv-heads "$HK" \
    --head-dim "$D" --skip-append --reps 5 --json "$out/bench_$tag.json" > "$out/ncu_$tag.csv" 2> "$out/ncu_$tag.err"
  $ncu $m --nvtx --nvtx-include sdpa/ $py scripts/sdpa-anchor.py --nvtx 5 "$out/sdpa_ncu_$tag.json" "$s" \
    > "$out/ncu_sdpa_$tag.csv" 2> "$out/ncu_sdpa_$tag.err"
  # kivi-bench makes 3 warm-up and 5 timed decode calls per cache, in the order fp16, 2-bit,
  # 4-bit, one kernel each: the median of each cache's 5 timed launches, and their mean clock
  t=$(vals gpu__time_duration.sum "$out/ncu_$tag.csv" | awk '{ v[n++] = $1 / 1000 }
    END { for (c = 0; c < 3 && 8 * c + 8 <= n; ++c) {
            for (j = 0; j < 5; ++j) a[j] = v[8 * c + 3 + j]
            for (x = 0; x < 5; ++x) for (y = x + 1; y < 5; ++y) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
            printf "%.1f ", a[2] } }')
  f=$(vals gpc__cycles_elapsed.avg.per_second "$out/ncu_$tag.csv" | awk '{ v[n++] = $1 / 1e6 }
    END { for (c = 0; c < 3 && 8 * c + 8 <= n; ++c) { x = 0; for (j = 0; j < 5; ++j) x += v[8 * c + 3 + j]; printf "%s%.0f", c ? " / " : "", x / 5 } }')
  # cuDNN: 5 calls of k kernels each (n = 5 k): the median of the calls' sums, and the mean clock
  ref=$(vals gpu__time_duration.sum "$out/ncu_sdpa_$tag.csv" | awk '{ v[n++] = $1 / 1000 }
    END { if (n == 0 || n % 5) { print "nan"; exit } k = n / 5
          for (c = 0; c < 5; ++c) { a[c] = 0; for (j = 0; j < k; ++j) a[c] += v[k * c + j] }
          for (x = 0; x < 5; ++x) for (y = x + 1; y < 5; ++y) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
          printf "%.1f", a[2] }')
  fr=$(vals gpc__cycles_elapsed.avg.per_second "$out/ncu_sdpa_$tag.csv" | awk '{ x += $1 / 1e6; n++ } END { if (n) printf "%.0f", x / n; else printf "-" }')
  ev=$($py -c "import json,sys; d=json.load(open('$out/sdpa.json'))['shapes']; print(next(('%.1f' % x['sdpa_us'] for x in d if (x['batch'],x['q_heads'],x['kv_heads'],x['head_dim'],x['seq_len'])==($B,$HQ,$HK,$D,$S)), 'nan'))" 2>/dev/null || echo nan)
  read -r t16 t2 t4 <<< "$t"
  r() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }
  echo "| $B | $HQ/$HK | $D | $S | $ref | ${t16:--} | $(r "${t16:-0}" "$ref") | ${t2:--} | $(r "$ref" "${t2:-0}") | ${t4:--} | $(r "$ref" "${t4:-0}") | $ev |" >> "$out/decode-table.md"
  echo "| $B | $HQ/$HK | $D | $S | ${f:--} | $fr |" >> "$out/clocks.md"
done
cat "$out/decode-table.md" "$out/clocks.md"
