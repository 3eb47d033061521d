#!/bin/sh
# Offload builds: the built libkivi-omp.so carries a CUDA device image (libtool did not drop the
# offload flags), and when configure enabled the cubin ABI fix, every image is in the ABI that
# LLVM 19's runtime loads.  Also checks the fixer itself on a copy: it must rewrite a CUDA-13
# header and report a file without device code; and, where python3 is there, that
# scripts/kernel-regs.py reads a register count for every decode kernel of the image and writes
# the image out whole (--cubin).
set -eu
b=${top_builddir:-.}
lib=$b/.libs/libkivi-omp.so
fix=$b/tools/kivi-cubin-fix${EXEEXT:-}
[ "${KIVI_HAVE_OFFLOAD:-0}" = 1 ] || { echo "host-only build: no device image expected"; exit 77; }
set +e
"$fix" --check "$lib"; rc=$?
set -e
case $rc in
  0) echo "device image present, old (LLVM-19-loadable) ELF ABI" ;;
  3) if grep -q 'cubin ABI fix: yes' "$b/config.h" 2>/dev/null; then
       echo "FAIL: the ABI fix is enabled but the image was not patched"; exit 1
     fi
     echo "device image present, CUDA-13 ABI (fix not needed for this runtime)" ;;
  *) echo "FAIL: no device image in $lib"; exit 1 ;;
esac
# the fixer on a synthetic file: a CUDA-13 ELF header (EM_CUDA, ABI 8, sm_90 in bits 8-15)
t=$(mktemp); trap 'rm -f "$t" "$t".*.cubin' EXIT
printf '\177ELF\002\001\001\101\010\000\000\000\000\000\000\000\002\000\276\000' > "$t"
head -c 28 /dev/zero >> "$t"
printf '\004\132\000\006' >> "$t"        # e_flags 0x06005a04 (little endian) at offset 48
head -c 64 /dev/zero >> "$t"
set +e; "$fix" --check "$t"; rc=$?; set -e
[ $rc = 3 ] || { echo "FAIL: fixer did not detect the CUDA-13 ABI (rc $rc)"; exit 1; }
"$fix" "$t" >/dev/null
# expect OS/ABI 51 (0x33), ABI 7, e_flags 0x005a055a
got=$(od -An -tx1 -j7 -N2 "$t" | tr -d ' \n'); flags=$(od -An -tx1 -j48 -N4 "$t" | tr -d ' \n')
[ "$got" = 3307 ] && [ "$flags" = 5a055a00 ] || { echo "FAIL: patched header $got / $flags"; exit 1; }
set +e; "$fix" --check /bin/sh; rc=$?; set -e
[ $rc = 4 ] || { echo "FAIL: a file without device code was not reported (rc $rc)"; exit 1; }
echo "cubin fixer: detects, patches and reports as expected"
if command -v python3 >/dev/null 2>&1; then
  out=$(python3 "${top_srcdir:-.}/scripts/kernel-regs.py" "$lib" kivi_gpu_gqa_decode) ||
    { echo "FAIL: scripts/kernel-regs.py on $lib"; exit 1; }
  n=$(printf '%s\n' "$out" | grep -c ' regs ' || true)
  bad=$(printf '%s\n' "$out" | awk '/ regs / && !($1 ~ /^[0-9]+$/ && $1 >= 16 && $1 <= 255)' | wc -l)
  [ "$n" -ge 8 ] && [ "$bad" -eq 0 ] || { echo "FAIL: kernel-regs.py: $n decode kernels, $bad without a count"; exit 1; }
  echo "kernel-regs.py: $n decode kernels, $(printf '%s\n' "$out" | awk '/ regs /{ if (!m || $1 < m) m = $1; if ($1 > x) x = $1 } END { print m "-" x }') registers"
  # --cubin: the image written whole (its program headers too, for cuobjdump), and read back
  python3 "${top_srcdir:-.}/scripts/kernel-regs.py" "$lib" --cubin "$t" >/dev/null ||
    { echo "FAIL: kernel-regs.py --cubin"; exit 1; }
  n2=$(python3 "${top_srcdir:-.}/scripts/kernel-regs.py" "$t.0.cubin" kivi_gpu_gqa_decode | grep -c ' regs ' || true)
  [ "$n2" = "$n" ] || { echo "FAIL: the written image holds $n2 decode kernels, the library $n"; exit 1; }
  if command -v readelf >/dev/null 2>&1 && readelf -lW "$t.0.cubin" 2>&1 | grep -qi 'error'; then
    echo "FAIL: the written image is cut short: $(readelf -lW "$t.0.cubin" 2>&1 | grep -i error | head -1)"; exit 1
  fi
  echo "kernel-regs.py --cubin: the image written whole, $n2 decode kernels read back"
fi
