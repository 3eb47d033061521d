#!/bin/sh
# The Fortran module (include/kivi.f90) cannot drift from kivi.h:
#  - every function kivi.h declares has an interface bound to its C name;
#  - every constant, struct size and member offset the module has equals the header's
#    (tests/test_fortran prints them from the module, tests/abi_dump from the header), and the
#    module has every one of the header's;
#  - tests/test_fortran's calls through the module pass (it prints "fortran: OK").
set -eu
b=${top_builddir:-.}
s=${top_srcdir:-.}
[ -x "$b/tests/test_fortran" ] || { echo "no Fortran compiler: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bad=0
. "$s/tests/pkg/api_lists.sh"
declared=$(kivi_declared "$s/include/kivi.h")
for f in $declared; do
  grep -q "name=\"$f\"" "$b/include/kivi.f90" || { echo "FAIL: kivi.f90 has no interface for $f"; bad=1; }
done
echo "functions: $(echo "$declared" | wc -l) in kivi.h, each bound in kivi.f90"
"$b/tests/abi_dump" >"$tmp/c.txt"
"$b/tests/test_fortran" >"$tmp/f.txt" || { cat "$tmp/f.txt"; echo "FAIL: tests/test_fortran"; exit 1; }
grep -q '^fortran: OK$' "$tmp/f.txt" || { echo "FAIL: tests/test_fortran did not finish"; exit 1; }
grep -E '^(const|size|offset) ' "$tmp/f.txt" | sed 's/  */ /g' | sort >"$tmp/f.lay"
sort "$tmp/c.txt" >"$tmp/c.lay"
if ! diff "$tmp/c.lay" "$tmp/f.lay" >"$tmp/d.txt"; then
  echo "FAIL: the module's layout differs from kivi.h's (< C header, > Fortran module):"; cat "$tmp/d.txt"; bad=1
fi
echo "layout: $(wc -l <"$tmp/c.lay") constants, sizes and offsets equal in C and Fortran"
exit $bad
