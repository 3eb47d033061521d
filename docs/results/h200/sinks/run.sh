#!/bin/bash
# sink tokens on the GPU (warp kernel): the suites with MANDATORY, then the decode cost under ncu
: "the LLVM 19 offload runtime on LD_LIBRARY_PATH first"
mkdir -p BUILD/lib/.libs
python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.decompress(open('BUILD/lib.xz','rb').read()))" > BUILD/lib/.libs/libkivi-omp.so.1
cp BUILD/libsubunit.so.0 BUILD/lib/.libs/
base=$LD_LIBRARY_PATH
for d in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
  for l in $(find "$d/nvidia" \( -name 'libcublas.so.*' -o -name 'libcudart.so.*' \) 2>/dev/null); do base=$base:$(dirname "$l"); done
done
export LD_LIBRARY_PATH=$PWD/BUILD/lib/.libs:$base OMP_TARGET_OFFLOAD=MANDATORY CK_FORK=no KIVI_TEST_EXPECT_GPU=1
mkdir -p $OUT/r
for t in test_sinks test_cache test_async test_checkpoint test_rotate test_model_dev; do
  t0=$(date +%s); timeout 150 BUILD/$t > $OUT/r/$t.txt 2>&1; echo "$t rc=$? $(( $(date +%s) - t0 )) s: $(grep -E 'Checks' $OUT/r/$t.txt)"
  grep -E ":F:|:E:" $OUT/r/$t.txt | cut -c1-240 | head -6
done
q="--csv --print-units base --metrics gpu__time_duration.sum -k regex:fast_decode|run_rows|sink"
for s in 8,32,32,128,32768 1,32,32,128,4096 8,32,8,128,32768 8,9,3,64,32768 8,9,3,64,512; do
  IFS=, read -r B HQ HK Dh S <<< "$s"
  for v in s0 s4 m4; do
    a=""; L=$S
    [ $v = s4 ] && a="--sinks 4"
    [ $v = m4 ] && L=$((S - 4))
    timeout 60 /usr/local/cuda/bin/ncu $q BUILD/kivi-bench --shape "$B,$HQ,$L" --kv-heads $HK --head-dim $Dh --skip-append --reps 5 $a > $OUT/r/ncu_${B}_${HQ}_${HK}_${Dh}_${S}_$v.csv 2>&1
    echo "$s $v: $(grep -c '"gpu__time' $OUT/r/ncu_${B}_${HQ}_${HK}_${Dh}_${S}_$v.csv) kernels"
  done
  for v in 0 4; do
    a=""; [ $v = 4 ] && a="--sinks 4"
    timeout 60 BUILD/kivi-bench --shape "$B,$HQ,$S" --kv-heads $HK --head-dim $Dh --skip-append --reps 20 --stream $a > $OUT/r/wall_${B}_${HQ}_${HK}_${Dh}_${S}_s$v.txt 2>&1
  done
done
cd $OUT && tar czf r.tgz r && rm -rf r
