#!/bin/sh
# The quality study of README "SmolLM2 on the KIVI cache": perplexity at several contexts for each
# cache setting and the paper's K/V axis study (fake quantization, 2 bits), then the passkey test.
#   sh scripts/model-study.sh BUILD_DIR OUT_DIR [PPL_TOKENS] [PASSKEY_TRIALS]
# (PASSKEY_TRIALS 0: no passkey runs; SKIP_PPL=1: passkey only)
# Writes one JSON per run into OUT_DIR and the tables into OUT_DIR/study.md.
set -eu
run=$1/examples/llm/kivi-run
out=$2
N=${3:-2048}
TRIALS=${4:-5}
text=/usr/share/common-licenses/GPL-3 # base-files: on every Debian/Ubuntu machine
mkdir -p "$out"
settings='fp16|--kv fp16
kivi4|--kv kivi4
kivi2|--kv kivi2
kivi2-R32|--kv kivi2 --residual 32
fake2|--kv kivi2 --fake-quant
axis-Kc-Vc|--kv kivi2 --fake-quant --k-axis channel --v-axis channel
axis-Kt-Vt|--kv kivi2 --fake-quant --k-axis token --v-axis token
axis-Kt-Vc|--kv kivi2 --fake-quant --k-axis token --v-axis channel'
[ "${SKIP_PPL:-0}" = 1 ] || for ctx in 512 1024 2048; do
  echo "$settings" | while IFS='|' read -r name args; do
    # shellcheck disable=SC2086
    "$run" ppl "$text" $args --ctx "$ctx" --max-tokens "$N" --quiet --json "$out/ppl-$name-$ctx.json"
  done
done
[ "$TRIALS" -gt 0 ] && echo "$settings" | head -5 | while IFS='|' read -r name args; do
  # shellcheck disable=SC2086
  "$run" passkey $args --lengths 512,1024,2048,4096 --trials "$TRIALS" --quiet --json "$out/passkey-$name.json"
done
python3 - "$out" "$N" <<'PY'
import json, glob, os, sys
out, n = sys.argv[1], sys.argv[2]
names = ["fp16", "kivi4", "kivi2", "kivi2-R32", "fake2", "axis-Kc-Vc", "axis-Kt-Vt", "axis-Kt-Vc"]
label = {"fp16": "fp16 cache", "kivi4": "KIVI-4 (G32, R128)", "kivi2": "KIVI-2 (G32, R128)",
         "kivi2-R32": "KIVI-2 (G32, R32)", "fake2": "fake 2-bit, K per-channel / V per-token (KIVI axes, no window)",
         "axis-Kc-Vc": "fake 2-bit, K per-channel / V per-channel", "axis-Kt-Vt": "fake 2-bit, K per-token / V per-token",
         "axis-Kt-Vc": "fake 2-bit, K per-token / V per-channel"}
L = ["| cache | ppl ctx 512 | ppl ctx 1024 | ppl ctx 2048 |", "|---|---|---|---|"]
for nm in names:
    row = []
    for ctx in (512, 1024, 2048):
        p = os.path.join(out, "ppl-%s-%d.json" % (nm, ctx))
        row.append("%.3f" % json.load(open(p))["ppl"] if os.path.exists(p) else "–")
    L.append("| %s | %s |" % (label[nm], " | ".join(row)))
L += ["", "| cache | passkey found (trials) at ~512 / 1024 / 2048 / 4096 tokens |", "|---|---|"]
for nm in names[:5]:
    p = os.path.join(out, "passkey-%s.json" % nm)
    if os.path.exists(p):
        r = json.load(open(p))["results"]
        L.append("| %s | %s |" % (label[nm], " / ".join("%d/%d" % (x["found"], x["trials"]) for x in r)))
open(os.path.join(out, "study.md"), "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
