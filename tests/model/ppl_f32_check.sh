# Sourced by tests/model/test_model_run.sh and tests/model/test_model_qwen2.sh.
# ppl_f32_check RUN TEXT MODEL TMP LABEL: `kivi-run ppl` on 384 tokens of a KIVI-2 cache (R = 128,
# so quantized blocks take part) with the host model and with the device model in fp32
# (--precision f32: fp32 weights and product inputs, as the host model); exits 1 unless they agree
# within PPL_DEVICE_F32_REL (SmolLM2 cut to 2 layers on host threads: 1.9e-6; its fp16 device
# model: 1.3e-3, which the bound refuses).
PPL_DEVICE_F32_REL=0.0001
ppl_f32_check() {
  "$1" ppl "$2" --model "$3" --kv kivi2 --ctx 384 --max-tokens 384 --forward host --quiet --json "$4/ppl-f32-host.json"
  "$1" ppl "$2" --model "$3" --kv kivi2 --ctx 384 --max-tokens 384 --forward device --precision f32 --quiet \
    --json "$4/ppl-f32-device.json"
  grep -q '"forward": "device", "precision": "f32"' "$4/ppl-f32-device.json" ||
    { echo "FAIL: --precision f32 did not run the device model in fp32"; exit 1; }
  awk -v h="$(sed -n 's/^  "ppl": \([0-9.]*\).*/\1/p' "$4/ppl-f32-host.json")" \
      -v d="$(sed -n 's/^  "ppl": \([0-9.]*\).*/\1/p' "$4/ppl-f32-device.json")" \
      -v t="$PPL_DEVICE_F32_REL" -v m="$5" 'BEGIN {
    r = (d - h) / h;
    printf "%s ppl (384 tokens, kivi2): model on the host %.6f, on the device in fp32 %.6f (%+.2e, bound %.0e)\n",
           m, h, d, r, t;
    if (!(h > 1) || !(r < t && r > -t)) { print "FAIL: the fp32 device model differs from the host model"; exit 1 }
  }'
}
