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

/* The FP8 block-scaled product of DeepSeek-V3's recipe on Hopper's cuBLASLt (cuBLAS 12.9):
 * y [m, n] (row-major, f32 or bf16) = x w^T + beta y, x [m, k] and w [n, k] e4m3 codes
 * (row-major: k contiguous), each in 1 x 128 tiles (tile_rows 1:
 * CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) or 128 x 128 tiles (tile_rows 128:
 * ..._BLK128x128_32F; not both), f32 accumulation. cuBLASLt's TN form: A = w (k x n,
 * column-major, transposed), B = x (k x m), D = y^T. The scale tensors in cuBLASLt's layouts
 * (rf_gemm_cuda_fp8_scale_at), which are not src/core/fp8.c's: as PyTorch's
 * test_scaled_mm_vs_emulated_block_wise hands them to cuBLASLt, 1 x 128 tiles
 * outer-dimension-major, 128 x 128 tiles the K blocks innermost with the row of tiles padded
 * to a multiple of 4 (this code's reading, NOT YET CHECKED ON A GPU: tests/gpu/test_gemm_cuda.c
 * checks it against rf_gemm_fp8_run there). m, n multiples of 16, k of 128; every pointer
 * 16-byte aligned. Returns 0; -1 when this cuBLASLt offers no algorithm for it (before
 * Hopper), having queued nothing. Planned and cached per shape as the other products. */
struct rf_gemm_cuda_fp8_operand {
  const uint8_t *codes;
  const float *scales; /* rf_gemm_cuda_fp8_scales(rows, k, tile_rows) floats */
  int tile_rows;       /* 1 or 128 (RF_FP8_TILE) */
};
int rf_gemm_cuda_run_fp8(struct rf_gemm_cuda *g, int m, int n, int k, struct rf_gemm_cuda_fp8_operand x,
                         struct rf_gemm_cuda_fp8_operand w, float beta, void *y, enum rf_dtype y_dtype,
                         cudaStream_t stream);

/* The scales of an FP8 operand of `rows` rows and k columns (k along K) in tiles of
 * tile_rows x 128, in cuBLASLt's layout: how many floats, and where tile (row r, K block kb)
 * lies: tile_rows 1, kb * rows + r; tile_rows 128, (r / 128) * L4 + kb, L4 = ceil(k / 128)
 * rounded up to a multiple of 4. */
int64_t rf_gemm_cuda_fp8_scales(int64_t rows, int64_t k, int tile_rows);
int64_t rf_gemm_cuda_fp8_scale_at(int64_t rows, int64_t k, int tile_rows, int64_t r, int64_t kb);

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
