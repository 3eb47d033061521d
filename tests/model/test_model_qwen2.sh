#!/bin/sh
# The qwen2 architecture without the model file: tests/model/tiny_qwen2.py writes a tiny synthetic
# qwen2 GGUF (2 layers, head_dim 128, 2 query heads over 1 kv-head, q/k/v biases, NEOX RoPE,
# random Q4_K, Q6_K, Q5_0, Q8_0 and F32 tensors, the qwen2 pre-tokenizer), then
#  1. scripts/check_model_ref.py: its independent float64 NumPy forward pass (NEOX RoPE on the
#     file's own q/k order, the biases, the K-quant blocks decoded from ggml's layouts) against
#     `kivi-run ppl --kv fp16` on 128 tokens (the host model: q/k rows permuted at load);
#  2. the device model (model_dev.c, fused q/k/v product plus biases; here on host threads) in
#     fp32 against the host model on a KIVI-2 cache over 384 tokens (quantized blocks included),
#     within PPL_DEVICE_F32_REL (tests/model/ppl_f32_check.sh).
# Skipped (status 77) without a Python that has NumPy (scripts/setup.sh installs python3-numpy).
set -eu
b=${top_builddir:-.}
s=${top_srcdir:-.}
run="$b/examples/llm/kivi-run${EXEEXT:-}"
text=/usr/share/common-licenses/GPL-3
py=
for p in python3 /usr/bin/python3; do
  if "$p" -c "import numpy" 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "no Python with NumPy: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" "$s/tests/model/tiny_qwen2.py" "$tmp/tiny.gguf"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
"$py" "$s/scripts/check_model_ref.py" "$run" "$tmp/tiny.gguf" "$text" 128
. "$s/tests/model/ppl_f32_check.sh"
ppl_f32_check "$run" "$text" "$tmp/tiny.gguf" "$tmp" qwen2
echo "qwen2 model: PASS"
