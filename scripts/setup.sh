#!/bin/sh
# Installs what libkivi-omp needs to build and test on Debian/Ubuntu (as root, or through sudo
# when run by another user):
# autotools, Check, gcc, clang-19 + clang-tools-19 (clang-offload-packager, clang-linker-wrapper)
# + libomp-19-dev for the GPU-offloading build, libclang-rt-19-dev (libFuzzer and the sanitizer
# runtimes of clang-19, for `make fuzz`), Open MPI for the
# MPI example, gfortran and cmake for the Fortran module's test and the installed-consumer check
# (make installcheck), python3 + NumPy + pip for the model fetch script and the model's reference
# check.  Doxygen (make doc) is optional: apt-get install doxygen.
# The CUDA toolkit (for offload) is not installed here: configure finds it in /usr/local/cuda.
set -eu
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential autoconf automake libtool pkg-config check zlib1g-dev clang-19 clang-tools-19 libomp-19-dev libclang-rt-19-dev
      libopenmpi-dev openmpi-bin gfortran cmake python3 python3-pip python3-numpy"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  # shellcheck disable=SC2086
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi
echo "setup: build dependencies present ("$pkgs")"
