#!/bin/sh
# The KV-cache quality study of docs/BENCHMARKS.md: perplexity of SmolLM2-135M with each cache
# option, scored as llama.cpp's llama-perplexity scores (--score second-half: the second half of
# each window), next to the option's bits per element at 4096 tokens, one JSON per run.
#   sh scripts/kv-study.sh BUILD_DIR OUT_DIR [TEXT] [TOKENS] [CTX...]
# (defaults: /usr/share/common-licenses/GPL-3, 4096 tokens, contexts 1024 and 2048).  Prints a
# markdown table; each run takes one to two minutes on 2 cores.
set -eu
b=$1; out=$2; text=${3:-/usr/share/common-licenses/GPL-3}; tokens=${4:-4096}
shift 2; [ $# -gt 0 ] && shift; [ $# -gt 0 ] && shift
ctxs=${*:-1024 2048}
mkdir -p "$out"
model=${KIVI_MODEL:-$(sh "$(dirname "$0")/fetch-model.sh")}
# name | kivi-run options | K bits, V bits, G, R, edge layers (first and last n at K4), sink tokens
configs="fp16|--kv fp16|16 16 32 128 0 0
kivi4|--kv kivi4|4 4 32 128 0 0
kivi2|--kv kivi2|2 2 32 128 0 0
k4v2|--k-bits 4 --v-bits 2|4 2 32 128 0 0
k4v2-r64|--k-bits 4 --v-bits 2 --residual 64|4 2 32 64 0 0
k4v2-g64|--k-bits 4 --v-bits 2 --group 64|4 2 64 128 0 0
k2v4|--k-bits 2 --v-bits 4|2 4 32 128 0 0
kivi2-g64|--kv kivi2 --group 64|2 2 64 128 0 0
kivi2-edge1|--kv kivi2 --edge-layers 1 --edge-k-bits 4|2 2 32 128 1 0
kivi2-rotkv|--kv kivi2 --rotate kv|2 2 32 128 0 0
k4v2-rotkv|--k-bits 4 --v-bits 2 --rotate kv|4 2 32 128 0 0
kivi2-sink4|--kv kivi2 --sink 4|2 2 32 128 0 4
kivi2-sink4-rotkv|--kv kivi2 --sink 4 --rotate kv|2 2 32 128 0 4
kivi2-sink16-rotkv|--kv kivi2 --sink 16 --rotate kv|2 2 32 128 0 16
k4v2-sink4|--k-bits 4 --v-bits 2 --sink 4|4 2 32 128 0 4
k4v2-sink4-rotkv|--k-bits 4 --v-bits 2 --sink 4 --rotate kv|4 2 32 128 0 4
kivi2-sink4-rotkv-vclip|--kv kivi2 --sink 4 --rotate kv --v-clip|2 2 32 128 0 4
k4v2-sink4-rotkv-vclip|--k-bits 4 --v-bits 2 --sink 4 --rotate kv --v-clip|4 2 32 128 0 4
kivi2-r64-sink4-rotkv-vclip|--kv kivi2 --residual 64 --sink 4 --rotate kv --v-clip|2 2 32 64 0 4
k4v2-r64-sink4-rotkv|--k-bits 4 --v-bits 2 --residual 64 --sink 4 --rotate kv|4 2 32 64 0 4"
# bits per element at L tokens (docs/FORMAT.md): the first S tokens (sinks) fp16; of the Q = L - S
# others, K: the first Q - Q mod R quantized with an fp16 scale and zero per G tokens of a
# channel; V: all but the last R with an fp16 scale and zero per G channels of a token; the rest
# fp16 (block tables and lengths are below 0.01 bit)
bits() { # kb vb G R edge layers L sinks
  awk -v kb="$1" -v vb="$2" -v G="$3" -v R="$4" -v e="$5" -v NL="$6" -v L="$7" -v S="$8" 'function side(b, q,   x) {
      if (b == 16) return 16; return (q * (b + 32 / G) + (L - q) * 16) / L }
    function layer(k, v,   Q) { Q = L - S; return (side(k, Q - Q % R) + side(v, Q > R ? Q - R : 0)) / 2 }
    BEGIN { printf "%.2f", ((NL - 2 * e) * layer(kb, vb) + 2 * e * layer(4, vb)) / NL }'
}
echo "| cache | bits / element at 4096 tokens |$(for c in $ctxs; do printf ' ppl ctx %s |' "$c"; done)"
echo "|---|---|$(for c in $ctxs; do printf -- '---|'; done)"
echo "$configs" | while IFS='|' read -r name opts geo; do
  set -- $geo
  row="| $name | $(bits "$1" "$2" "$3" "$4" "$5" 30 4096 "$6") |"
  for ctx in $ctxs; do
    # shellcheck disable=SC2086
    "$b/examples/llm/kivi-run" ppl "$text" --model "$model" $opts --ctx "$ctx" --max-tokens "$tokens" \
      --score second-half --quiet --json "$out/ppl-$name-$ctx.json" >"$out/ppl-$name-$ctx.txt" 2>&1 ||
      { cat "$out/ppl-$name-$ctx.txt" >&2; exit 1; }
    row="$row $(sed -n 's/.*: ppl \([0-9.]*\) at ctx.*/\1/p' "$out/ppl-$name-$ctx.txt") |"
  done
  echo "$row"
done
