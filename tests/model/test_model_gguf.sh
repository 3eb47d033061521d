#!/bin/sh
# The GGUF reader on the real model (fetched by scripts/fetch-model.sh; skipped, status 77, when
# it is not in the cache): the file validates and its metadata is SmolLM2-135M's Llama geometry.
set -eu
b=${top_builddir:-.}
dir=${KIVI_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/libkivi-omp}
model=${KIVI_MODEL:-$dir/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -s "$model" ] || { echo "no model at $model (run scripts/fetch-model.sh): skipped"; exit 77; }
out=$("$b/examples/llm/kivi_gguf_info${EXEEXT:-}" "$model")
echo "$out"
echo "$out" | grep -q "layers 30, heads 9, kv-heads 3, embedding 576, head_dim 64" || { echo "FAIL: geometry"; exit 1; }
echo "$out" | grep -q "vocabulary 49152 tokens" || { echo "FAIL: vocabulary"; exit 1; }
echo "model GGUF: valid, SmolLM2-135M geometry"
# kivi_gguf_cut: the model cut to its first 2 blocks is a valid GGUF of the same geometry with 2
# layers, without the later blocks' tensors (the 98 MB model becomes about 36 MB), and kivi-run
# generates from it
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$b/examples/llm/kivi_gguf_cut${EXEEXT:-}" "$model" "$tmp/cut.gguf" --layers 2
out=$("$b/examples/llm/kivi_gguf_info${EXEEXT:-}" "$tmp/cut.gguf" --tensors)
echo "$out" | grep -q "layers 2, heads 9, kv-heads 3, embedding 576, head_dim 64" || { echo "FAIL: cut geometry"; exit 1; }
echo "$out" | grep -q "vocabulary 49152 tokens" || { echo "FAIL: cut vocabulary"; exit 1; }
echo "$out" | grep -q "blk\.2\." && { echo "FAIL: the cut has a tensor of block 2"; exit 1; }
echo "$out" | grep -q "blk\.1\.ffn_down" || { echo "FAIL: the cut lacks block 1"; exit 1; }
size=$(wc -c <"$tmp/cut.gguf")
[ "$size" -lt 40000000 ] || { echo "FAIL: the cut is $size bytes"; exit 1; }
gen=$(OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} "$b/examples/llm/kivi-run${EXEEXT:-}" generate --model "$tmp/cut.gguf" \
      --prompt "The capital of France is" --max-tokens 4 2>&1) || { echo "$gen"; echo "FAIL: kivi-run on the cut"; exit 1; }
echo "$gen" | grep -q "generated 4 tokens" || { echo "$gen"; echo "FAIL: kivi-run on the cut generated nothing"; exit 1; }
echo "model cut to 2 layers: valid, $size bytes, kivi-run generates from it"
