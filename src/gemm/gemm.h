/* src/gemm: every matrix product of the library, through oneDNN's matmul primitive.
 *
 *   C [m, n] = alpha * op(A) op(B) + beta * C, row-major with leading
 *   dimensions; op(A) = A [m, k] (lda >= k) or A^T with A [k, m] (lda >= m), same
 *   for B [k, n] / [n, k]. A and B are both f32 or both bf16; C, the accumulation
 *   and alpha are f32 (bf16 products accumulate in f32: oneDNN's brgemm kernels on
 *   AVX512-BF16 / AMX, or its reference kernels elsewhere).
 *
 * Primitives are created on the first product of a shape (the warm-up step of a
 * training loop) and cached for the life of the process: a primitive, its memory
 * objects and a scratchpad per OpenMP thread. Later products of that shape create
 * nothing and allocate nothing in rfsdp (oneDNN builds its small argument map per
 * call). rf_gemm_stats() counts both.
 *
 * Threads: a product called outside an OpenMP parallel region runs on
 * omp_get_max_threads() threads (the caller sets the rank's core budget with
 * omp_set_num_threads before the first product); called from inside a parallel
 * region (attention's per-head jobs), it runs on the calling thread alone. Products
 * from several threads at once must come from one OpenMP team (each thread has its
 * own slot by omp_get_thread_num()). */
#ifndef RF_GEMM_H
#define RF_GEMM_H

#include <stdint.h>

#include "rfsdp_types.h" /* enum rf_dtype */

struct rf_gemm_desc {
  int m, n, k;
  int trans_a, trans_b; /* 1: the operand is stored transposed */
  int lda, ldb, ldc;
  enum rf_dtype dtype; /* of A and B: RF_DTYPE_F32 or RF_DTYPE_BF16 */
  float alpha;
  float beta; /* 0: C is only written (its old contents may be anything, NaN included) */
};

/* The product described by d (a, b: f32 or uint16_t bf16 as d->dtype says). Dies
 * on a bad description (sizes, leading dimensions, dtype) or a oneDNN failure. */
void rf_gemm_run(const struct rf_gemm_desc *d, const void *a, const void *b, float *c);

struct rf_gemm_stats {
  int64_t primitives; /* primitives created since the process started */
  int64_t products;   /* rf_gemm_run calls */
};
struct rf_gemm_stats rf_gemm_stats(void);

/* The name of the implementation oneDNN chose for a shape (e.g. "brg:avx512_core_bf16"). */
const char *rf_gemm_impl_name(const struct rf_gemm_desc *d);

/* The instruction set oneDNN uses on this CPU ("avx512_core_bf16", "avx2", ...):
 * names the machine in the peak's cache. Static storage. */
const char *rf_gemm_cpu_name(void);

/* The rate of an n x n x n product in `dtype` on omp_get_max_threads() threads, in
 * GFLOP/s: the best of `reps` timed runs after one untimed, each timed by the wall
 * clock and by CPU time / threads, keeping the shorter (on a machine shared with
 * other jobs the wall clock counts time the threads were not running, which would
 * underestimate the peak and inflate every MFU against it). Creates and caches the
 * primitive (call it at set-up, not in a step). */
double rf_gemm_measure_gflops(enum rf_dtype dtype, int n, int reps);

#endif
