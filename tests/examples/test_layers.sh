#!/bin/sh
# examples/kivi_layers on a small stack: the synchronous and asynchronous runs of the same decode
# steps must give bit-identical outputs (the example's exit status says so).
set -eu
b=${top_builddir:-.}
"$b/examples/kivi_layers${EXEEXT:-}" --layers 3 --heads 8 --kv-heads 2 --head-dim 64 --context 300 --steps 3
"$b/examples/kivi_layers${EXEEXT:-}" --layers 2 --heads 8 --kv-heads 8 --head-dim 128 --context 700 --steps 2 --bits 2
# 10 layers, more than the caches' 8 async lanes, and the same with one lane (strict call order)
"$b/examples/kivi_layers${EXEEXT:-}" --layers 10 --heads 8 --kv-heads 8 --head-dim 128 --context 700 --steps 2 --lanes 8
"$b/examples/kivi_layers${EXEEXT:-}" --layers 10 --heads 8 --kv-heads 8 --head-dim 128 --context 700 --steps 2 --lanes 1
# the layers chained through a target region of the example's own (ordered by the cache's
# dependence object), 8 lanes
"$b/examples/kivi_layers${EXEEXT:-}" --layers 10 --heads 8 --kv-heads 8 --head-dim 128 --context 700 --steps 2 --chain 1
