/* The CUDA side of the device model (model_dev.c): cuBLAS and the CUDA runtime, kept in a file
 * of its own that is compiled for the host only (no OpenMP offload flags reach the CUDA headers).
 * Built without cuBLAS (LLM_HAVE_CUBLAS undefined), every call reports "not available". */
#ifndef KIVI_EXAMPLES_MODEL_BLAS_H
#define KIVI_EXAMPLES_MODEL_BLAS_H

#include <stddef.h>

typedef struct llm_blas llm_blas;

/* A cuBLAS handle on its own stream of CUDA device `device`; NULL when there is no cuBLAS in
 * the build or the device refuses (then *why, if not NULL, says which). */
llm_blas *llm_blas_create(int device, const char **why);
void llm_blas_destroy(llm_blas *b);
/* y[T][N] = x[T][K] w[N][K]^T (+ y when acc), x and w fp16 (fp32 when f32), y fp32, fp32 sums
 * (fp16 inputs on the tensor cores; fp32 ones in plain fp32, no TF32); waits for the product (not
 * on a caller's stream).  0, or -1 when cuBLAS or CUDA reports an error. */
int llm_blas_gemm(llm_blas *b, float *y, const void *x, const void *w, int T, int K, int N, int acc, int f32);
/* The products on a CUDA stream of the caller's (a cudaStream_t of the device), enqueued and not
 * waited for, or back on the handle's own stream, waited for (NULL).  0, or -1. */
int llm_blas_set_stream(llm_blas *b, void *stream);
/* Device memory in use (total - free) and the device's size; 0 and 0 where not known. */
size_t llm_blas_memory(size_t *total);

#endif
