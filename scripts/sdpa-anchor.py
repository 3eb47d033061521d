# fp16 attention decode anchor: PyTorch's scaled_dot_product_attention (cuDNN on an H200) on
# the decode shapes of scripts/decode-table.sh, GPU time per call from CUDA events with the L2
# flushed before each call (median of 20).  PyTorch is the anchor, never a dependency of the
# library.  Usage: python3 scripts/sdpa-anchor.py [--causal] [--nvtx N] OUT.json B,HQ,HK,D,S ...
# --causal: the prompt instead (S query tokens, causal mask: kivi-bench --prompt S's call).
# --chunk P: P query tokens over S keys and values (a prompt chunk over a cache: kivi-bench
# --prompt P --context S-P), without a mask (the causal part, P x P of P x S, is left out).
# --nvtx N: N timed calls instead of 20, each inside an NVTX range "sdpa" (the L2 flush outside
# it), for Nsight Compute: ncu --nvtx --nvtx-include sdpa/ times cuDNN's own kernels as it times
# the library's (scripts/decode-table.sh); the CUDA-event figures of such a run are not used.
import json, sys
import torch
import torch.nn.functional as F

args = sys.argv[1:]
causal = bool(args) and args[0] == '--causal'
args = args[1:] if causal else args
chunk = 0
if len(args) > 1 and args[0] == '--chunk':
    chunk, args = int(args[1]), args[2:]
nvtx = 0
if len(args) > 1 and args[0] == '--nvtx':
    nvtx, args = int(args[1]), args[2:]
out, shapes = args[0], [tuple(int(x) for x in a.split(',')) for a in args[1:]]
flush = torch.empty(512 * 1024 * 1024, dtype=torch.uint8, device='cuda')
res = []
for B, HQ, HK, D, S in shapes:
    q = torch.randn(B, HQ, S if causal else chunk or 1, D, dtype=torch.float16, device='cuda')
    k = torch.randn(B, HK, S, D, dtype=torch.float16, device='cuda')
    v = torch.randn(B, HK, S, D, dtype=torch.float16, device='cuda')
    kw = {} if HK == HQ else {'enable_gqa': True}
    if causal:
        kw['is_causal'] = True
    for _ in range(5):
        F.scaled_dot_product_attention(q, k, v, **kw)
    ts = []
    for _ in range(nvtx or 20):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if nvtx:
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_push('sdpa')
        a.record()
        F.scaled_dot_product_attention(q, k, v, **kw)
        b.record()
        if nvtx:
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    ts.sort()
    med = ts[len(ts) // 2]
    nbytes = 2 * B * HK * S * D * 2
    flop = 4.0 * B * HQ * D * S * (S + 1) / 2 if causal else 4.0 * B * HQ * D * S * (chunk or 1)
    res.append({'batch': B, 'q_heads': HQ, 'kv_heads': HK, 'head_dim': D, 'seq_len': S, 'causal': causal, 'q_len': chunk or (S if causal else 1),
                'sdpa_us': round(med, 2), 'tb_s': round(nbytes / med / 1e6, 3), 'tflop_s': round(flop / med / 1e6, 2)})
    print(f"sdpa fp16{' causal' if causal else ''}{f' chunk {chunk}' if chunk else ''} B={B} HQ={HQ} HK={HK} D={D} S={S}: {med:.1f} us  "
          f"{nbytes / med / 1e6:.2f} TB/s  {flop / med / 1e6:.1f} TFLOP/s", flush=True)
    del q, k, v
json.dump({'torch': torch.__version__, 'device': torch.cuda.get_device_name(), 'backend_default': 'cuDNN (H200)',
           'shapes': res}, open(out, 'w'), indent=1)
