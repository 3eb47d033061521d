#!/bin/sh
# The Qwen2.5-Coder-1.5B study of docs/results/qwen2.5-1.5b: perplexity on a text the model has not
# memorized (dpkg's triggers.txt) for each cache setting, then the passkey test.
#   sh scripts/qwen-study.sh BUILD_DIR OUT_DIR
# Environment: MODEL (default: the path scripts/fetch-model.sh qwen2.5-coder-1.5b prints),
# TEXT (/usr/share/doc/dpkg/spec/triggers.txt), CTX (1024), TOKENS (2048), SKIP_PPL=1 (passkeys
# only), LENGTHS (passkey lengths, 1024,2048,4096,8192; empty: none), TRIALS (1), SETTINGS
# (the names below to run, default all).  One JSON per run in OUT_DIR, one log each.
# On a 2-core host without a GPU a window of 1,024 tokens takes 80-190 s per cache, a passkey
# of 8,192 tokens 28-39 minutes (measured with other work on the host).
set -eu
run=$1/examples/llm/kivi-run
out=$2
MODEL=${MODEL:-$(sh "$(dirname "$0")/fetch-model.sh" qwen2.5-coder-1.5b)}
TEXT=${TEXT:-/usr/share/doc/dpkg/spec/triggers.txt}
CTX=${CTX:-1024}
TOKENS=${TOKENS:-2048}
LENGTHS=${LENGTHS-1024,2048,4096,8192}
TRIALS=${TRIALS:-1}
mkdir -p "$out"
settings='fp16|--kv fp16
kivi4|--kv kivi4
k4v2|--k-bits 4 --v-bits 2
k4v2-opt|--k-bits 4 --v-bits 2 --sink 4 --rotate kv
kivi2|--kv kivi2
kivi2-opt|--kv kivi2 --sink 4 --rotate kv --v-clip'
echo "$settings" | while IFS='|' read -r name args; do
  case " ${SETTINGS:-$name} " in *" $name "*) ;; *) continue ;; esac
  if [ "${SKIP_PPL:-0}" != 1 ]; then
    # shellcheck disable=SC2086
    "$run" ppl "$TEXT" --model "$MODEL" $args --ctx "$CTX" --max-tokens "$TOKENS" --score second-half \
      --json "$out/ppl-$name-$CTX.json" > "$out/ppl-$name-$CTX.log" 2>&1
  fi
  if [ -n "$LENGTHS" ]; then
    # shellcheck disable=SC2086
    "$run" passkey --model "$MODEL" $args --lengths "$LENGTHS" --trials "$TRIALS" \
      --json "$out/passkey-$name.json" > "$out/passkey-$name.log" 2>&1
  fi
done
