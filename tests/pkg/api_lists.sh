# Sourced by the interface tests (test_symbols.sh, test_abi.sh, test_fortran.sh) and by
# `make abi-baseline`: the two lists they compare, one name a line, sorted.
# kivi_declared HEADER: the functions kivi.h declares with KIVI_API.
kivi_declared() {
  grep -v '^ *#' "$1" | tr '\n' ' ' | sed 's/;/;\n/g' | grep 'KIVI_API' | sed -E 's/.*[ *]([a-z_0-9]+)\(.*/\1/' | sort -u
}
# kivi_hooks HEADER: the linker hooks kivi.h declares with KIVI_HOOK (exported, not API).
kivi_hooks() {
  grep -v '^ *#' "$1" | tr '\n' ' ' | sed 's/;/;\n/g' | grep 'KIVI_HOOK' | sed -E 's/.*[ *]([a-z_0-9]+)\(.*/\1/' | sort -u
}
# kivi_exported LIBRARY: the symbols a shared library exports ($NM, else nm), without _init/_fini.
kivi_exported() {
  ${NM:-nm} -D --defined-only "$1" | awk '$2 ~ /^[TDRBVWiu]$/ {print $3}' | sed 's/@.*//' |
    grep -v '^_init$' | grep -v '^_fini$' | sort -u
}
