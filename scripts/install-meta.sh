#!/bin/sh
# Installs libkivi-omp.pc and the CMake package (kivi-omp-config.cmake, -version.cmake), called
# by `make install` with the install directories in the environment (Makefile.am: KIVI_META_ENV).
# Every path in them is written relative to the file's own directory when it lies under the
# prefix, so the installed tree can be moved or staged with DESTDIR; otherwise it is absolute.
#   install-meta.sh DESTDIR
set -eu
destdir=${1:-}
: "${srcdir:?}" "${prefix:?}" "${libdir:?}" "${pcdir:?}" "${cmdir:?}" "${includedir:?}" "${bindir:?}" "${version:?}" "${soversion:?}"

# ups DIR: "../.." from DIR up to the prefix, or nothing when DIR is not under the prefix
ups() {
  case "$1/" in
    "$prefix"/*) r=${1#"$prefix"}; r=${r#/}; [ -n "$r" ] && echo "$r" | sed -e 's|[^/][^/]*|..|g' -e 's|/*$||' || echo . ;;
    *) echo "" ;;
  esac
}
# rel BASEVAR DIR: DIR as ${BASEVAR}/rest when under the prefix, else DIR
rel() {
  case "$2/" in
    "$prefix"/*) r=${2#"$prefix"}; r=${r#/}; echo "$1${r:+/$r}" ;;
    *) echo "$2" ;;
  esac
}
major=$(echo "$version" | cut -d. -f1)
minor=$(echo "$version" | cut -d. -f2)
subst() { # template output: the @name@ placeholders
  sed -e "s|@version@|$version|g" -e "s|@soversion@|$soversion|g" -e "s|@major@|$major|g" -e "s|@minor@|$minor|g" \
      -e "s|@compat_minor@|${compat_minor:-$minor}|g" \
      -e "s|@openmp_runtime@|${openmp_runtime:-}|g" -e "s|@openmp_cflags@|${openmp_cflags:-}|g" \
      -e "s|@openmp_libdir@|${openmp_libdir:-}|g" -e "s|@openmp_libs@|${openmp_libs:-}|g" \
      -e "s|@offload@|${offload:-no}|g" -e "s|@offload_arch@|${offload_arch:-none}|g" \
      -e "s|@offload_cflags@|${offload_cflags:-}|g" -e "s|@cubin_fix@|${cubin_fix:-no}|g" \
      -e "s|@pc_prefix@|$pc_prefix|g" -e "s|@pc_libdir@|$pc_libdir|g" -e "s|@pc_includedir@|$pc_includedir|g" \
      -e "s|@pc_bindir@|$pc_bindir|g" -e "s|@cm_prefix@|$cm_prefix|g" -e "s|@cm_libdir@|$cm_libdir|g" \
      -e "s|@cm_includedir@|$cm_includedir|g" -e "s|@cm_bindir@|$cm_bindir|g" "$1" >"$2"
}

# each file's prefix: relative to the file's own directory where that lies under the prefix
pc_up=$(ups "$pcdir"); cm_up=$(ups "$cmdir")
pc_prefix=${pc_up:+'${pcfiledir}/'$pc_up}; pc_prefix=${pc_prefix:-$prefix}
cm_prefix=${cm_up:+'${CMAKE_CURRENT_LIST_DIR}/'$cm_up}; cm_prefix=${cm_prefix:-$prefix}
pc_libdir=$(rel '${prefix}' "$libdir"); pc_includedir=$(rel '${prefix}' "$includedir"); pc_bindir=$(rel '${prefix}' "$bindir")
cm_libdir=$(rel '${_kivi_omp_prefix}' "$libdir"); cm_includedir=$(rel '${_kivi_omp_prefix}' "$includedir")
cm_bindir=$(rel '${_kivi_omp_prefix}' "$bindir")

mkdir -p "$destdir$pcdir" "$destdir$cmdir"
subst "$srcdir/libkivi-omp.pc.in" "$destdir$pcdir/libkivi-omp.pc"
subst "$srcdir/cmake/kivi-omp-config.cmake.in" "$destdir$cmdir/kivi-omp-config.cmake"
subst "$srcdir/cmake/kivi-omp-config-version.cmake.in" "$destdir$cmdir/kivi-omp-config-version.cmake"
chmod 644 "$destdir$pcdir/libkivi-omp.pc" "$destdir$cmdir"/kivi-omp-config*.cmake
echo "installed $pcdir/libkivi-omp.pc and $cmdir/kivi-omp-config.cmake (paths relative to themselves)"
