#!/bin/sh
# The binary interface of this build against the baseline committed with the release
# (tests/pkg/abi-baseline.txt, docs/ABI.md): the exported symbols, and every constant, struct size
# and member offset of kivi.h (tests/abi_dump).  A change that fails here breaks binaries built
# against the release: either undo it, or make it a new release by the rules of docs/ABI.md and
# regenerate the baseline (`make abi-baseline`).  Additions to the symbol list are allowed in a
# minor release; they are reported, not failed.
set -eu
b=${top_builddir:-.}
s=${top_srcdir:-.}
lib=$b/.libs/libkivi-omp.so
[ -f "$lib" ] || { echo "no shared library (static-only build?)"; exit 77; }
[ "$("$b/tests/abi_dump" | grep -c '^size kivi_cache_stats 128$')" = 1 ] || { echo "not an LP64 build: the baseline is LP64"; exit 77; }
. "$s/tests/pkg/api_lists.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ "$b/tests/abi_dump"
  kivi_exported "$lib" | sed 's/^/symbol /'
} | grep -v "\.reserved " >"$tmp/now.txt"
grep -v "^#" "$s/tests/pkg/abi-baseline.txt" | grep -v "\.reserved " >"$tmp/base.txt"
missing=$(grep -vxF -f "$tmp/now.txt" "$tmp/base.txt" || true)
added=$(grep -vxF -f "$tmp/base.txt" "$tmp/now.txt" || true)
if [ -n "$missing" ]; then
  echo "FAIL: in the baseline but not in this build (an ABI break):"; echo "$missing" | sed 's/^/  /'
  [ -z "$added" ] || { echo "  (this build has instead:)"; echo "$added" | sed 's/^/    /'; }
  exit 1
fi
[ -z "$added" ] || { echo "added since the baseline (compatible):"; echo "$added" | sed 's/^/  /'; }
echo "ABI: $(wc -l <"$tmp/base.txt") baseline facts (symbols, constants, sizes, offsets) unchanged"
