/* cuBLAS for the device model (model_blas.h). */
#include <stdlib.h>

#include "model_blas.h"

#ifdef LLM_HAVE_CUBLAS
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

struct llm_blas {
  cublasHandle_t h;
  cudaStream_t s;
  cudaStream_t ext; /* llm_blas_set_stream: the products go there, not waited for */
};

llm_blas *llm_blas_create(int device, const char **why) {
  llm_blas *b = calloc(1, sizeof *b);
  if (!b) {
    if (why) *why = "out of memory";
    return NULL;
  }
  if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking) != cudaSuccess) {
    if (why) *why = "the CUDA runtime cannot use the device";
    free(b);
    return NULL;
  }
  if (cublasCreate(&b->h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(b->h, b->s) != CUBLAS_STATUS_SUCCESS) {
    if (why) *why = "cuBLAS cannot create a handle";
    cudaStreamDestroy(b->s);
    free(b);
    return NULL;
  }
  return b;
}

void llm_blas_destroy(llm_blas *b) {
  if (!b) return;
  cublasDestroy(b->h);
  cudaStreamDestroy(b->s);
  free(b);
}

int llm_blas_gemm(llm_blas *b, float *y, const void *x, const void *w, int T, int K, int N, int acc, int f32) {
  /* column-major view: y^T (N x T) = w^T (N x K; w is stored K x N) * x^T (K x T); fp32 inputs
   * with CUBLAS_COMPUTE_32F: plain fp32 (the handle's default math mode allows no TF32) */
  const float one = 1.0f, beta = acc ? 1.0f : 0.0f;
  const cudaDataType_t in = f32 ? CUDA_R_32F : CUDA_R_16F;
  if (cublasGemmEx(b->h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, in, K, x, in, K, &beta, y, CUDA_R_32F, N,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    return -1;
  return b->ext || cudaStreamSynchronize(b->s) == cudaSuccess ? 0 : -1;
}

int llm_blas_set_stream(llm_blas *b, void *stream) {
  if (cublasSetStream(b->h, stream ? (cudaStream_t)stream : b->s) != CUBLAS_STATUS_SUCCESS) return -1;
  b->ext = (cudaStream_t)stream;
  return 0;
}

size_t llm_blas_memory(size_t *total) {
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = total_b = 0;
  if (total) *total = total_b;
  return total_b - free_b;
}

#else

llm_blas *llm_blas_create(int device, const char **why) {
  (void)device;
  if (why) *why = "built without cuBLAS";
  return NULL;
}
void llm_blas_destroy(llm_blas *b) { (void)b; }
int llm_blas_gemm(llm_blas *b, float *y, const void *x, const void *w, int T, int K, int N, int acc, int f32) {
  (void)b, (void)y, (void)x, (void)w, (void)T, (void)K, (void)N, (void)acc, (void)f32;
  return -1;
}
int llm_blas_set_stream(llm_blas *b, void *stream) {
  (void)b, (void)stream;
  return -1;
}
size_t llm_blas_memory(size_t *total) {
  if (total) *total = 0;
  return 0;
}

#endif
