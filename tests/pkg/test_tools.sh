#!/bin/sh
# Every program of the tree follows the command-line conventions (examples/kivi_cli.h): --help
# prints the usage on stdout and exits 0, --version prints "PROGRAM (libkivi-omp) VERSION" and
# exits 0, an unknown option exits 2 with a message naming it.  Then kivi-info runs its checks
# on this machine (host threads, and the GPU where there is one) and must pass them all.
set -u
b=${top_builddir:-.}
E=${EXEEXT:-}
version=$(sed -n 's/^#define KIVI_VERSION_STRING "\(.*\)"/\1/p' "$b/include/kivi_version.h")
bad=0
n=0
for p in tools/kivi-info tools/kivi-cubin-fix bench/kivi-bench examples/llm/kivi-run examples/kivi_layers \
         examples/kivi_multi_device examples/llm/kivi_gguf_info examples/llm/kivi_gguf_cut examples/llm/kivi_throughput \
         examples/mpi/kivi_mpi_heads; do
  exe=$b/$p$E
  [ -x "$exe" ] || { echo "($p not built here)"; continue; }
  name=$(basename "$p")
  out=$("$exe" --help 2>/dev/null); rc=$?
  { [ $rc -eq 0 ] && echo "$out" | grep -q '^usage: '; } || { echo "FAIL: $p --help: exit $rc, stdout '$out'"; bad=1; }
  out=$("$exe" --version 2>/dev/null); rc=$?
  [ $rc -eq 0 ] && [ "$out" = "$name (libkivi-omp) $version" ] || { echo "FAIL: $p --version: exit $rc, '$out'"; bad=1; }
  case $name in
    kivi-run) args="generate --no-such-option" ;;
    kivi_mpi_heads) n=$((n + 1)); continue ;; # (it reports usage errors after MPI_Init: tests/examples/test_mpi.sh runs it)
    *) args="--no-such-option" ;;
  esac
  err=$("$exe" $args 2>&1 >/dev/null); rc=$?
  { [ $rc -eq 2 ] && echo "$err" | grep -q -- "--no-such-option"; } || { echo "FAIL: $p $args: exit $rc, stderr '$err'"; bad=1; }
  n=$((n + 1))
done
echo "conventions: $n programs answer --help, --version and an unknown option as documented"
# kivi-bench's decode table for a GQA shape with head_dim 64 (--kv-heads, --head-dim): one line per
# width (2 and 4 bits), each checked against the double-precision reference (last column)
if [ -x "$b/bench/kivi-bench$E" ]; then
  out=$("$b/bench/kivi-bench$E" --shape 1,6,200 --kv-heads 2 --head-dim 64 --skip-append --reps 1 2>/dev/null); rc=$?
  lines=$(echo "$out" | awk '$1 == 1 && $2 == 6 && $3 == 200 && $NF + 0 < 2e-3' | wc -l)
  { [ $rc -eq 0 ] && [ "$lines" -eq 2 ]; } || { echo "FAIL: kivi-bench --kv-heads 2 --head-dim 64: exit $rc, $lines good lines"; echo "$out"; bad=1; }
  echo "kivi-bench: a GQA shape with head_dim 64, both widths within 2e-3 of the reference"
  # the chunk table (--prompt P --context C): new tokens over a KIVI-2 cache, both layouts checked
  out=$("$b/bench/kivi-bench$E" --prompt 40 --context 300 --reps 1 2>/dev/null); rc=$?
  lines=$(echo "$out" | awk 'NF == 7 && $1 ~ /^[0-9]+$/ && $4 == "|" && $6 + 0 < 2e-3' | wc -l)
  { [ $rc -eq 0 ] && [ "$lines" -eq 2 ]; } || { echo "FAIL: kivi-bench --prompt 40 --context 300: exit $rc, $lines good lines"; echo "$out"; bad=1; }
  echo "kivi-bench: a 40-token chunk over 300 cached tokens, both layouts within 2e-3 of the reference"
fi
# kivi_throughput on its tiny shape: every cache at batches 1 and 2 (--no-max: on a GPU not also
# each cache's largest batch), a JSON line per run with tokens/s and the step's parts
if [ -x "$b/examples/llm/kivi_throughput$E" ]; then
  tj=$(mktemp)
  "$b/examples/llm/kivi_throughput$E" --shape tiny --prompt 8 --gen 3 --batches 1,2 --no-max --json "$tj" >/dev/null 2>&1; rc=$?
  runs=$(grep -c '"batch": [12], "tokens_per_s": [1-9]' "$tj")
  { [ $rc -eq 0 ] && [ "$runs" -eq 8 ] && grep -q '"step_ms": {"matmul"' "$tj"; } ||
    { echo "FAIL: kivi_throughput --shape tiny: exit $rc, $runs runs"; cat "$tj"; bad=1; }
  if command -v python3 >/dev/null; then python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$tj" ||
    { echo "FAIL: kivi_throughput wrote invalid JSON"; bad=1; }; fi
  echo "kivi_throughput: 4 caches x 2 batches of the tiny model, JSON complete"
  # SmolLM2-135M's shape (GQA 9 over 3 heads of 64): one step of batch 1 on a KIVI-2 cache
  "$b/examples/llm/kivi_throughput$E" --shape smollm2-135m --kv kivi2 --prompt 4 --gen 2 --batches 1 --no-max \
    --json "$tj" >/dev/null 2>&1; rc=$?
  { [ $rc -eq 0 ] && grep -q '"layers": 30, "dim": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "ffn": 1536, "vocab": 49152' "$tj" &&
    grep -Eq '"batch": 1, "tokens_per_s": ([1-9]|0\.[0-9]*[1-9])' "$tj"; } ||
    { echo "FAIL: kivi_throughput --shape smollm2-135m: exit $rc"; cat "$tj"; bad=1; }
  rm -f "$tj"
  echo "kivi_throughput: SmolLM2-135M's shape, one KIVI-2 step"
  # --max-only fills device memory: on host threads it stops with an error naming the GPU
  if [ "${KIVI_TEST_EXPECT_GPU:-0}" != 1 ]; then
    out=$("$b/examples/llm/kivi_throughput$E" --shape tiny --max-only --device host 2>&1); rc=$?
    { [ $rc -eq 1 ] && echo "$out" | grep -q 'max-only needs a GPU'; } ||
      { echo "FAIL: kivi_throughput --max-only on the host: exit $rc"; echo "$out"; bad=1; }
  fi
fi
out=$("$b/tools/kivi-info$E" 2>&1); rc=$?
echo "$out" | sed 's/^/  /'
{ [ $rc -eq 0 ] && echo "$out" | grep -q '^kivi-info: all checks passed$'; } || { echo "FAIL: kivi-info exit $rc"; bad=1; }
exit $bad
