#!/bin/sh
# The shared library exports exactly the functions kivi.h declares with KIVI_API: nothing else
# (no internal helpers, no OpenMP outlined functions), nothing missing.
set -eu
lib=${top_builddir:-.}/.libs/libkivi-omp.so
hdr=${top_srcdir:-.}/include/kivi.h
[ -f "$lib" ] || { echo "no shared library at $lib (static-only build?)"; exit 77; }
. "${top_srcdir:-.}/tests/api_lists.sh"
exported=$(kivi_exported "$lib")
declared=$(kivi_declared "$hdr")
echo "exported:"; echo "$exported" | sed 's/^/  /'
bad=0
for s in $exported; do
  echo "$declared" | grep -qx "$s" || { echo "FAIL: $s is exported but not declared in kivi.h"; bad=1; }
done
for s in $declared; do
  echo "$exported" | grep -qx "$s" || { echo "FAIL: $s is declared in kivi.h but not exported"; bad=1; }
done
n=$(echo "$declared" | wc -l)
[ "$bad" -eq 0 ] && echo "symbols: $n declared, all exported, nothing else"
exit $bad
