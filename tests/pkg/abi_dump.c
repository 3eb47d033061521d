/* Prints the binary interface of kivi.h, one fact a line: every constant's value, every public
 * struct's size and every member's offset.  tests/pkg/test_abi.sh compares it (with the exported
 * symbols) to the baseline committed with the release, tests/pkg/abi-baseline.txt; the Fortran
 * module's test prints the same lines from kivi.f90 and tests/pkg/test_fortran.sh compares them
 * with these. */
#include <stddef.h>
#include <stdio.h>

#include "kivi.h"

#define CONST(name) printf("const %s %lld\n", #name, (long long)(name))
#define SIZE(type) printf("size %s %zu\n", #type, sizeof(type))
#define OFF(type, member) printf("offset %s.%s %zu\n", #type, #member, offsetof(type, member))

int main(void) {
  CONST(KIVI_OK); CONST(KIVI_ERR_ARG); CONST(KIVI_ERR_UNSUPPORTED); CONST(KIVI_ERR_NO_DEVICE);
  CONST(KIVI_ERR_NOMEM); CONST(KIVI_ERR_CAPACITY); CONST(KIVI_ERR_NONFINITE); CONST(KIVI_ERR_DEVICE);
  CONST(KIVI_ERR_BUFFER); CONST(KIVI_ERR_FORMAT); CONST(KIVI_ERR_MISMATCH); CONST(KIVI_ERR_IO);
  CONST(KIVI_DEVICE_DEFAULT); CONST(KIVI_DEVICE_HOST); CONST(KIVI_MEM_HOST); CONST(KIVI_MEM_DEVICE);
  CONST(KIVI_F32); CONST(KIVI_F16); CONST(KIVI_BF16);
  CONST(KIVI_ATTENTION_FAST); CONST(KIVI_ATTENTION_FP32); CONST(KIVI_MAX_ASYNC_LANES); CONST(KIVI_ALL_SEQS);
  CONST(KIVI_KERNEL_PORTABLE); CONST(KIVI_KERNEL_GPU_F16X2); CONST(KIVI_KERNEL_GPU_GQA); CONST(KIVI_KERNEL_GPU_F16); CONST(KIVI_KERNEL_GPU_NEW);
  CONST(KIVI_ROTATE_NONE); CONST(KIVI_ROTATE_K); CONST(KIVI_ROTATE_V); CONST(KIVI_ROTATE_KV);
  CONST(KIVI_MAX_SINKS);
  CONST(KIVI_CLIP_NONE); CONST(KIVI_CLIP_MSE);

  SIZE(kivi_context_info);
  OFF(kivi_context_info, device); OFF(kivi_context_info, on_gpu); OFF(kivi_context_info, num_devices);
  OFF(kivi_context_info, reserved);

  SIZE(kivi_cache_config);
  OFF(kivi_cache_config, n_layers); OFF(kivi_cache_config, n_kv_heads); OFF(kivi_cache_config, head_dim);
  OFF(kivi_cache_config, max_seqs); OFF(kivi_cache_config, max_seq_len); OFF(kivi_cache_config, pool_tokens);
  OFF(kivi_cache_config, k_bits); OFF(kivi_cache_config, v_bits); OFF(kivi_cache_config, group);
  OFF(kivi_cache_config, residual); OFF(kivi_cache_config, attention); OFF(kivi_cache_config, async_lanes);
  OFF(kivi_cache_config, rotate);
  OFF(kivi_cache_config, sinks);
  OFF(kivi_cache_config, v_clip);
  OFF(kivi_cache_config, reserved);

  SIZE(kivi_cache_stats);
  OFF(kivi_cache_stats, tokens); OFF(kivi_cache_stats, code_bytes); OFF(kivi_cache_stats, scale_zero_bytes);
  OFF(kivi_cache_stats, residual_bytes); OFF(kivi_cache_stats, bookkeeping_bytes);
  OFF(kivi_cache_stats, total_bytes); OFF(kivi_cache_stats, fp16_bytes); OFF(kivi_cache_stats, bits_per_element);
  OFF(kivi_cache_stats, allocated_bytes); OFF(kivi_cache_stats, free_blocks); OFF(kivi_cache_stats, total_blocks);
  OFF(kivi_cache_stats, stream_kernels); OFF(kivi_cache_stats, stream_waits);
  OFF(kivi_cache_stats, reserved);
  return 0;
}
