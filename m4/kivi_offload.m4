# KIVI_OFFLOAD_PROBE
# Decide whether the library's target regions are offloaded to NVIDIA GPUs.
# Sets kivi_offload (nvptx|no), KIVI_OFFLOAD_CFLAGS (compile), KIVI_OFFLOAD_LDFLAGS (libtool link:
# every flag wrapped in -Xcompiler, since libtool drops unknown flags), kivi_cubin_fix (yes|no)
# and kivi_cc_id / kivi_cuda_summary / kivi_cubin_reason for the summary.
#
# The probe compiles AND links a target teams region with exactly the flags the library uses
# (-foffload-lto included): the device image is only produced, and most errors only show, at link.
AC_DEFUN([KIVI_OFFLOAD_PROBE], [
kivi_offload=no
kivi_cubin_fix=no
kivi_cubin_reason="no offload"
kivi_cuda_summary="not used"
KIVI_OFFLOAD_CFLAGS=
KIVI_OFFLOAD_LDFLAGS=

AC_COMPUTE_INT([kivi_clang_major], [__clang_major__], [], [kivi_clang_major=0])
AS_IF([test "$kivi_clang_major" -gt 0],
  [kivi_cc_id="clang $kivi_clang_major"],
  [AS_IF([test "x$GCC" = xyes], [kivi_cc_id=gcc], [kivi_cc_id=other])])

# A bad --with-cuda is an error whatever the offload mode, so a typo never goes unnoticed.
AS_IF([test "x$kivi_cuda_given" = xyes && test ! -x "$with_cuda/bin/ptxas"],
  [AC_MSG_ERROR([--with-cuda=$with_cuda: no executable $with_cuda/bin/ptxas there (give the CUDA toolkit root)])])

kivi_skip=
AS_IF([test "x$enable_offload" = xno], [kivi_skip="disabled (--enable-offload=no)"],
      [test "$kivi_clang_major" -lt 15], [kivi_skip="compiler '$CC' is not clang >= 15 (install clang-19 and libomp-19-dev, or set CC=clang-19)"],
      [test ! -x "$with_cuda/bin/ptxas"], [kivi_skip="no CUDA toolkit at $with_cuda (use --with-cuda=DIR)"])

AS_IF([test -z "$kivi_skip"], [
  kivi_off_flags="$OPENMP_CFLAGS -fopenmp-targets=nvptx64-nvidia-cuda --offload-arch=$with_offload_arch --cuda-path=$with_cuda -foffload-lto"
  kivi_omptarget=`$CC -print-file-name=libomptarget.so 2>/dev/null`
  AS_IF([test -f "$kivi_omptarget"], [kivi_omptarget_dir=`dirname "$kivi_omptarget"`], [kivi_omptarget_dir=])
  kivi_rpath=${kivi_omptarget_dir:+-Wl,-rpath,$kivi_omptarget_dir}
  AC_MSG_CHECKING([whether $CC links an OpenMP target region for nvptx64 ($with_offload_arch)])
  kivi_save_CFLAGS=$CFLAGS; kivi_save_LDFLAGS=$LDFLAGS
  CFLAGS="$CFLAGS $kivi_off_flags -Wno-unused-command-line-argument"
  LDFLAGS="$LDFLAGS $kivi_off_flags $kivi_rpath"
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <omp.h>]], [[
      int on_host = -1, n = 1 << 10; float s = 0;
      #pragma omp target teams distribute parallel for reduction(+:s) map(tofrom: s)
      for (int i = 0; i < n; ++i) s += (float)i;
      #pragma omp target map(from: on_host)
      on_host = omp_is_initial_device();
      return (s > 0 && on_host >= 0) ? 0 : 1;]])],
    [kivi_probe=yes; cp conftest$EXEEXT conftest.offload$EXEEXT], [kivi_probe=no])
  CFLAGS=$kivi_save_CFLAGS; LDFLAGS=$kivi_save_LDFLAGS
  AC_MSG_RESULT([$kivi_probe])
  AS_IF([test "x$kivi_probe" = xyes], [
    kivi_offload=nvptx
    kivi_cuda_summary=$with_cuda
    KIVI_OFFLOAD_CFLAGS="$kivi_off_flags -Wno-unused-command-line-argument"
    KIVI_OFFLOAD_LDFLAGS=
    for kivi_f in $kivi_off_flags; do KIVI_OFFLOAD_LDFLAGS="$KIVI_OFFLOAD_LDFLAGS -Xcompiler $kivi_f"; done
    KIVI_OFFLOAD_LDFLAGS="$KIVI_OFFLOAD_LDFLAGS $kivi_rpath"
  ], [kivi_skip="the offload probe did not link (see config.log)"])
])

AS_IF([test -n "$kivi_skip"], [
  AS_IF([test "x$enable_offload" = xnvptx],
    [AC_MSG_ERROR([--enable-offload=nvptx was requested but $kivi_skip])])
  AC_MSG_NOTICE([offload: no -- $kivi_skip])
  kivi_cubin_reason=$kivi_skip
])

# CUDA >= 13 writes cubins in a new ELF ABI (EI_ABIVERSION 8) that LLVM < 21.1's plugin rejects
# ("No images found compatible with the installed hardware").  tools/kivi-cubin-fix detects it
# in the probe executable; the build then rewrites the header of the image in the linked library.
AS_IF([test "x$kivi_offload" = xnvptx], [
  AC_MSG_CHECKING([the cubin ELF ABI of the device image])
  rm -f conftest-cubinfix$EXEEXT
  kivi_abi=unknown
  AS_IF([$CC $CFLAGS -o conftest-cubinfix$EXEEXT "$srcdir/tools/kivi-cubin-fix.c" >&AS_MESSAGE_LOG_FD 2>&1], [
    ./conftest-cubinfix$EXEEXT --check conftest.offload$EXEEXT >&AS_MESSAGE_LOG_FD 2>&1
    AS_CASE([$?], [0], [kivi_abi=old], [3], [kivi_abi=new], [kivi_abi=unknown])])
  AC_MSG_RESULT([$kivi_abi])
  rm -f conftest-cubinfix$EXEEXT conftest.offload$EXEEXT
  AS_CASE([$enable_cubin_abi_fix],
    [yes], [kivi_cubin_fix=yes; kivi_cubin_reason="forced by --enable-cubin-abi-fix=yes"],
    [no],  [kivi_cubin_fix=no;  kivi_cubin_reason="disabled by --enable-cubin-abi-fix=no"],
    [AS_IF([test "x$kivi_abi" = xnew && test "$kivi_clang_major" -lt 21],
       [kivi_cubin_fix=yes; kivi_cubin_reason="CUDA>=13 cubin ABI with LLVM $kivi_clang_major runtime"],
     [test "x$kivi_abi" = xunknown],
       [AC_MSG_ERROR([could not find the device image in the offload probe executable (see config.log)])],
       [kivi_cubin_fix=no; kivi_cubin_reason="cubin ABI $kivi_abi, LLVM $kivi_clang_major: not needed"])])
])
])
