#!/bin/bash
# per-sequence V bounds: quantized decode GPU time, before (cur) and after (seq), ncu
: "the LLVM 19 offload runtime on LD_LIBRARY_PATH first"
D=BUILD
for v in cur seq; do mkdir -p $D/$v; python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.decompress(open('$D/$v.so.xz','rb').read()))" > $D/$v/libkivi-omp.so.1; done
export OMP_TARGET_OFFLOAD=MANDATORY
base=$LD_LIBRARY_PATH
q="--csv --print-units base --metrics gpu__time_duration.sum -k regex:kivi_gpu_fast_decode"
for s in 8,32,32,128,32768 32,32,32,128,4096 1,32,32,128,4096 8,32,8,128,32768 8,9,3,64,32768; do
  IFS=, read -r B HQ HK Dh S <<< "$s"
  for v in cur seq; do
    LD_LIBRARY_PATH=$PWD/$D/$v:$base timeout 50 /usr/local/cuda/bin/ncu $q $D/kivi-bench --shape "$B,$HQ,$S" --kv-heads $HK --head-dim $Dh --skip-append --reps 5 > /tmp/ncu_$v.csv 2>/dev/null
    python3 - /tmp/ncu_$v.csv "$s $v" <<'PY'
import csv,sys,statistics
rows=[r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h=rows[0]; i=h.index('Metric Name'); j=h.index('Metric Value')
t=[float(r[j].replace(',',''))/1e3 for r in rows[1:] if r[i]=='gpu__time_duration.sum']
print(sys.argv[2], "kernels", len(t), "2-bit %.1f us, 4-bit %.1f us" % (statistics.median(t[3:8]), statistics.median(t[11:16])) if len(t)>=16 else "", " ".join("%.1f"%x for x in t))
PY
  done
done 2>&1 | tee $OUT/perseq.txt
