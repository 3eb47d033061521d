#!/bin/sh
# make installcheck (and so make distcheck): use the installed library the way a user's project
# does, from the installed prefix only (nothing from the build tree but the example sources):
#   1. C through pkg-config, 2. C++ through pkg-config, 3. CMake through find_package,
#   4. Fortran: the installed module source compiled with the user's compiler, through pkg-config.
# Each program runs; a missing tool (C++, cmake, Fortran) is reported and skipped.
#   installcheck.sh PREFIX SRCDIR CC CXX FC CMAKE PKG_CONFIG
set -eu
prefix=$1 src=$2 cc=$3 cxx=$4 fc=$5 cmake=$6 pkgconfig=${7:-pkg-config}
pcdir=$(dirname "$(find "$prefix" -name libkivi-omp.pc | head -1)")
[ -f "$pcdir/libkivi-omp.pc" ] || { echo "FAIL: no libkivi-omp.pc under $prefix"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PKG_CONFIG_PATH="$pcdir"
pc() { "$pkgconfig" "$@" libkivi-omp; }
libdir=$(pc --variable=libdir)
echo "installcheck: pkg-config finds libkivi-omp $(pc --modversion): cflags '$(pc --cflags)', libs '$(pc --libs)'"
case "$libdir" in "$prefix"*) ;; *) echo "FAIL: libdir $libdir is not under the installed prefix $prefix"; exit 1 ;; esac
rpath="-Wl,-rpath,$libdir"
ran=""
# 1. C
$cc $(pc --cflags) "$src/examples/kivi_hello.c" -o "$tmp/hello_c" $(pc --libs) -lm $rpath
"$tmp/hello_c" | tail -1
# the link flags for a program's own regions on a cache's stream (kivi_cache_stream_begin)
sl=$(pc --variable=stream_regions_ldflags)
[ -n "$sl" ] || { echo "FAIL: libkivi-omp.pc has no stream_regions_ldflags"; exit 1; }
$cc $(pc --cflags) "$src/examples/kivi_hello.c" -o "$tmp/hello_c_wrap" $(pc --libs) -lm $rpath $sl
"$tmp/hello_c_wrap" >/dev/null
echo "installcheck: linked and ran with stream_regions_ldflags '$sl'"
ran="$ran C"
# 2. C++
if [ -n "$cxx" ] && command -v "$cxx" >/dev/null 2>&1; then
  $cxx $(pc --cflags) "$src/examples/kivi_hello_cxx.cc" -I"$src/examples" -o "$tmp/hello_cxx" $(pc --libs) $rpath
  "$tmp/hello_cxx" | tail -1
  ran="$ran C++"
else echo "installcheck: no C++ compiler, C++ consumer skipped"; fi
# 3. CMake
if [ -n "$cmake" ] && command -v "$cmake" >/dev/null 2>&1; then
  # the version this release promises to satisfy: its own MAJOR.MINOR (docs/ABI.md)
  want=$(pc --modversion | cut -d. -f1-2)
  "$cmake" -S "$src/tests/pkg/consumer" -B "$tmp/cmake" -DCMAKE_PREFIX_PATH="$prefix" -DKIVI_WANT_VERSION="$want" \
    -DKIVI_HELLO_SOURCE="$src/examples/kivi_hello.c" -DCMAKE_C_COMPILER="$cc" >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log"; echo "FAIL: cmake configure"; exit 1; }
  grep "libkivi-omp" "$tmp/cmake.log" | sed 's/^-- /installcheck: cmake: /'
  "$cmake" --build "$tmp/cmake" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; echo "FAIL: cmake build"; exit 1; }
  "$tmp/cmake/kivi_hello_cmake" | tail -1
  # the version file on its own: the release's MAJOR.MINOR accepted, a newer minor or major refused
  vf=$(find "$prefix" -name kivi-omp-config-version.cmake | head -1)
  printf 'include("%s")\nmessage("${PACKAGE_VERSION_COMPATIBLE}")\n' "$vf" >"$tmp/ver.cmake"
  major=${want%%.*} minor=${want#*.}
  for req in "$major.$minor:TRUE" "$major.$((minor + 1)):FALSE" "$((major + 1)).0:FALSE"; do
    v=${req%%:*} expect=${req#*:}
    got=$("$cmake" -DPACKAGE_FIND_VERSION="$v" -DPACKAGE_FIND_VERSION_MAJOR="${v%%.*}" \
      -DPACKAGE_FIND_VERSION_MINOR="${v#*.}" -DCMAKE_SIZEOF_VOID_P=8 -P "$tmp/ver.cmake" 2>&1)
    [ "$got" = "$expect" ] || { echo "FAIL: find_package(kivi-omp $v) compatible: '$got', expected $expect"; exit 1; }
  done
  echo "installcheck: cmake version file: $want accepted, newer minor and major refused"
  ran="$ran CMake"
else echo "installcheck: no cmake, CMake consumer skipped"; fi
# 4. Fortran
if [ -n "$fc" ] && command -v "$fc" >/dev/null 2>&1; then
  mod=$(pc --variable=fortran_module)
  [ -f "$mod" ] || { echo "FAIL: the Fortran module $mod is not installed"; exit 1; }
  (cd "$tmp" && $fc -c "$mod" && $fc "$src/examples/fortran/kivi_hello.f90" kivi.o -o hello_f $(pc --libs) $rpath)
  "$tmp/hello_f" | tail -1
  ran="$ran Fortran"
else echo "installcheck: no Fortran compiler, Fortran consumer skipped"; fi
echo "installcheck: the installed library built and ran consumers in:$ran"
