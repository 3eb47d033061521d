#!/bin/sh
# examples/kivi_multi_device on a small stack: the kv-heads split in 3 parts (one context, cache
# and host thread per part, over every visible device) must give the single-device output
# (the example checks it and exits non-zero otherwise); then its scaling mode runs.
set -eu
b=${top_builddir:-.}
ex="$b/examples/kivi_multi_device${EXEEXT:-}"
"$ex" --parts 3 --layers 2 --heads 12 --kv-heads 6 --head-dim 64 --context 300 --steps 3
"$ex" --parts 2 --layers 2 --heads 8 --kv-heads 4 --head-dim 128 --context 700 --steps 2
"$ex" --scaling --layers 1 --heads 8 --kv-heads 8 --head-dim 64 --context 256 --steps 2
"$ex" --scaling --max-parts 2 --layers 1 --heads 4 --kv-heads 4 --head-dim 64 --context 128 --steps 2 | grep -c "^strong" | grep -qx 2
