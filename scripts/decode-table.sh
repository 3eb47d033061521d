#!/bin/bash
# The decode tables of the README: for each shape (batch B, HQ query heads over HK kv-heads,
# head_dim D, context S), the GPU time of one decode call of ours (fp16 cache, KIVI-2, KIVI-4;
# Nsight Compute gpu__time_duration with the caches flushed, median of the timed calls) and of
# PyTorch's fp16 scaled_dot_product_attention (cuDNN; CUDA events, L2 flushed), measured in the
# same run.  Usage (project root, GPU machine, offload build in BUILD):
#   . <runtime env>; bash scripts/decode-table.sh BUILD OUT [B,HQ,HK,D,S ...]
# Default shapes (the README's 15): MHA 32/32 and GQA 32/8 at (1, 4k) (1, 32k) (8, 4k) (8, 32k)
# (32, 4k), 28/4, 64/8 and 9/3 (D 64) at (8, 32k), and 9/3 (D 64) at (1, 4k) and (32, 4k).
# Writes OUT/decode-table.md and OUT/sdpa.json.
set -u
b=$1; out=$2; shift 2
mkdir -p "$out" || exit 1
ncu=${NCU:-/usr/local/cuda/bin/ncu}
py=${PYTHON:-python3}
export LD_LIBRARY_PATH=$PWD/$b/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
shapes=("$@")
if [ ${#shapes[@]} -eq 0 ]; then
  for kv in 32 8; do
    for bs in 1,4096 1,32768 8,4096 8,32768 32,4096; do shapes+=("${bs%,*},32,$kv,128,${bs#*,}"); done
  done
  shapes+=(8,28,4,128,32768 8,64,8,128,32768 8,9,3,64,32768 1,9,3,64,4096 32,9,3,64,4096)
fi
$py scripts/sdpa-anchor.py "$out/sdpa.json" "${shapes[@]}" > "$out/sdpa.log" 2>&1 || echo "sdpa anchor failed: $(tail -3 "$out/sdpa.log")"
q="--csv --print-units base --metrics gpu__time_duration.sum -k regex:kivi_gpu_f16_decode|kivi_gpu_fast_decode|run_rows"
{
  echo "| B | q/kv heads | D | S | cuDNN fp16 µs | ours fp16 µs | fp16 vs cuDNN | KIVI-2 µs | cuDNN / KIVI-2 | KIVI-4 µs | cuDNN / KIVI-4 |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} > "$out/decode-table.md"
for s in "${shapes[@]}"; do
  IFS=, read -r B HQ HK D S <<< "$s"
  tag="b${B}_q${HQ}_k${HK}_d${D}_s${S}"
  $ncu $q "$b/bench/kivi-bench" --shape "$B,$HQ,$S" --kv-heads "$HK" --head-dim "$D" --skip-append --reps 5 \
    --json "$out/bench_$tag.json" > "$out/ncu_$tag.csv" 2> "$out/ncu_$tag.err"
  # kivi-bench makes 3 warm-up and 5 timed decode calls per cache, in the order fp16, 2-bit,
  # 4-bit, one kernel each: the median of each cache's 5 timed launches
  t=$(awk -F'","' '
    /^"ID","/ { for (i = 1; i <= NF; ++i) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
    /^"/ && ("Metric Name" in col) && $col["Metric Name"] == "gpu__time_duration.sum" {
      val = $col["Metric Value"]; gsub(/[",]/, "", val); v[n++] = val / 1000 }
    END { for (c = 0; c < 3 && 8 * c + 8 <= n; ++c) {
            for (j = 0; j < 5; ++j) a[j] = v[8 * c + 3 + j]
            for (x = 0; x < 5; ++x) for (y = x + 1; y < 5; ++y) if (a[y] < a[x]) { t = a[x]; a[x] = a[y]; a[y] = t }
            printf "%.1f ", a[2] } }' "$out/ncu_$tag.csv")
  read -r t16 t2 t4 <<< "$t"
  ref=$($py -c "import json,sys; d=json.load(open('$out/sdpa.json'))['shapes']; print(next(('%.1f' % x['sdpa_us'] for x in d if (x['batch'],x['q_heads'],x['kv_heads'],x['head_dim'],x['seq_len'])==($B,$HQ,$HK,$D,$S)), 'nan'))" 2>/dev/null || echo nan)
  r() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }
  echo "| $B | $HQ/$HK | $D | $S | $ref | ${t16:--} | $(r "${t16:-0}" "$ref") | ${t2:--} | $(r "$ref" "${t2:-0}") | ${t4:--} | $(r "$ref" "${t4:-0}") |" >> "$out/decode-table.md"
done
cat "$out/decode-table.md"
