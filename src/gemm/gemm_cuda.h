/* src/gemm on the GPU (BACKEND=cuda only): the products of gemm.h through cuBLASLt.
 *
 *   C [m, n] = alpha * op(A) op(B) + beta * C
 *
 * with rf_gemm_desc's meaning exactly (row-major, leading dimensions, trans_a/trans_b
 * for operands stored transposed); A and B bf16 (or both f32), accumulation and alpha
 * and beta in f32, C f32 or bf16 (rounded once, at the end). All three on the device.
 * cuBLASLt is column-major: a row-major C is a column-major C^T = op(B)^T op(A)^T, so
 * the product is run with the operands swapped and no copy.
 *
 * A context holds one cuBLASLt handle and one workspace (cudaMalloc'd once, at
 * create). The first product of a shape (m, n, k, transposes, leading dimensions,
 * dtypes) makes its descriptors and asks the heuristic for an algorithm, and caches
 * them; later products of that shape create nothing, allocate nothing and never wait
 * for the GPU (counted: rf_gemm_cuda_stats). Operands aligned to their elements; a shape is
 * planned per alignment of its operands (the largest power of two up to 16 bytes dividing
 * every address: cuBLASLt's fastest algorithms want 16), so an 8-byte-aligned operand gets
 * an algorithm that takes it. Errors stop the job naming the file, the line, the call and
 * cuBLAS's status string. */
#ifndef RF_GEMM_CUDA_H
#define RF_GEMM_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "gemm/gemm.h"

struct rf_gemm_cuda;

/* A context on the current CUDA device with `workspace_bytes` of workspace (0: 32 MiB,
 * what cuBLAS advises for Hopper). Owned by the caller: rf_gemm_cuda_free. */
struct rf_gemm_cuda *rf_gemm_cuda_create(size_t workspace_bytes);
void rf_gemm_cuda_free(struct rf_gemm_cuda *g);

/* The product described by d on `stream`: a, b (d->dtype), c (c_dtype: f32 or bf16). */
void rf_gemm_cuda_run(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, const void *a, const void *b,
                      void *c, enum rf_dtype c_dtype, cudaStream_t stream);

/* rf_gemm_cuda_run with the linear layer's bias added in cuBLASLt's epilogue
 * (CUBLASLT_EPILOGUE_BIAS): C [m, n] = alpha op(A) op(B) + beta C + bias, bias[j] added to
 * column j of every row, in f32 before C's one rounding. bias: n values of c_dtype in device
 * memory (cuBLASLt's default bias type is D's). A shape with a bias is planned apart from
 * the same shape without. */
void rf_gemm_cuda_run_bias(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, const void *a, const void *b,
                           const void *bias, void *c, enum rf_dtype c_dtype, cudaStream_t stream);

/* The FP8 block-scaled product of DeepSeek-V3's recipe on Hopper's cuBLASLt
 * (../shared/gpu/fp8_probe.c's calls): y [m, n] (bf16, row-major) = x w^T, with x [m, k]
 * e4m3 codes in 1 x 128 tiles (x_scales [m, ceil(k/128)]) and w [n, k] e4m3 codes in
 * 128 x 128 tiles (w_scales [ceil(n/128), ceil(k/128)]), both scale tensors row-major over
 * the tiles as src/core/fp8.c lays them out (rf_fp8_quantize; x from
 * rf_fused_fp8_quantize_rows_bf16), f32 accumulation. cuBLASLt's TN form: A = w (k x n,
 * column-major, transposed; CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F), B = x (k x m;
 * ..._VEC128_32F), D = y^T. That fp8.c's layouts are the ones cuBLASLt reads (the K blocks
 * innermost, as the data's own) is this code's reading of cuBLASLt's header, NOT YET
 * CHECKED ON A GPU: tests/gpu/test_gemm_cuda.c checks it against rf_gemm_fp8_run there.
 * m, n, k multiples of 16; every pointer 16-byte aligned. Returns 0; -1 when this cuBLASLt
 * offers no algorithm for it (before Hopper; the CPU stand-in, which has no FP8), having
 * queued nothing. Planned and cached per (m, n, k) as the other products. */
int rf_gemm_cuda_run_fp8(struct rf_gemm_cuda *g, int m, int n, int k, const uint8_t *x, const float *x_scales,
                         const uint8_t *w, const float *w_scales, uint16_t *y, cudaStream_t stream);

struct rf_gemm_cuda_stats {
  int64_t plans;    /* shapes planned (descriptors + heuristic) */
  int64_t products; /* rf_gemm_cuda_run calls */
  int64_t mallocs;  /* cudaMalloc calls (the workspace) */
};
struct rf_gemm_cuda_stats rf_gemm_cuda_stats(const struct rf_gemm_cuda *g);

/* The name of the algorithm cuBLASLt chose for a shape (its id and tile), planning it
 * when new; static storage until the next call. */
const char *rf_gemm_cuda_algo_name(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d,
                                   enum rf_dtype c_dtype);

#endif
