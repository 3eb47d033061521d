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
