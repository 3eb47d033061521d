#!/bin/sh
# The shared library exports exactly the functions kivi.h declares with KIVI_API
# and KIVI_HOOK (the linker hooks): nothing else (no internal helpers, no OpenMP outlined
# functions), nothing missing.
set -eu
lib=${top_builddir:-.}/.libs/libkivi-omp.so
hdr=${top_srcdir:-.}/include/kivi.h
[ -f "$lib" ] || { echo "no shared library at $lib (static-only build?)"; exit 77; }
. "${top_srcdir:-.}/tests/pkg/api_lists.sh"
exported=$(kivi_exported "$lib")
declared=$(kivi_declared "$hdr")
hooks=$(kivi_hooks "$hdr")
echo "exported:"; echo "$exported" | sed 's/^/  /'
bad=0
for s in $exported; do
  printf '%s\n%s\n' "$declared" "$hooks" | grep -qx "$s" || { echo "FAIL: $s is exported but not declared in kivi.h"; bad=1; }
done
for s in $hooks; do
  echo "$exported" | grep -qx "$s" || { echo "FAIL: the hook $s is declared in kivi.h but not exported"; bad=1; }
done
for s in $declared; do
  echo "$exported" | grep -qx "$s" || { echo "FAIL: $s is declared in kivi.h but not exported"; bad=1; }
done
n=$(echo "$declared" | wc -l)
[ "$bad" -eq 0 ] && echo "symbols: $n declared and $(echo "$hooks" | wc -l) hooks, all exported, nothing else"
exit $bad
