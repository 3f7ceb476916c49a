/* src/gemm: every matrix product of the library, through oneDNN's matmul primitive.
 *
 *   C [m, n] = alpha * op(A) op(B) + beta * C, row-major with leading
 *   dimensions; op(A) = A [m, k] (lda >= k) or A^T with A [k, m] (lda >= m), same
 *   for B [k, n] / [n, k]. A and B are both f32 or both bf16; C, the accumulation
 *   and alpha are f32 (bf16 products accumulate in f32: oneDNN's brgemm kernels on
 *   AVX512-BF16 / AMX, its reference kernels on other AVX-512 CPUs; where oneDNN has
 *   no bf16 matmul at all (AVX2 CPUs), A and B are widened to f32, exactly, and an f32
 *   primitive sums the exact products in f32: the same arithmetic, another order).
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
 * region (attention's per-head jobs), it runs on the calling thread alone. Each thread
 * of a team has its own slot of state (omp_get_thread_num()); products from several host
 * threads outside a parallel region (the main thread and a checked device's stream
 * worker) share slot 0 and run one at a time (a lock per slot, uncontended in a team). */
#ifndef RF_GEMM_H
#define RF_GEMM_H

#include <stdint.h>

#include "core/core.h"   /* struct rf_fp8_grid */
#include "rfsdp_types.h" /* enum rf_dtype */

struct rf_gemm_desc {
  int m, n, k;
  int trans_a, trans_b; /* 1: the operand is stored transposed */
  int lda, ldb, ldc;
  enum rf_dtype dtype; /* of A and B: RF_DTYPE_F32 or RF_DTYPE_BF16 */
  float alpha;
  float beta; /* 0: C is only written (its old contents may be anything, NaN included) */
};

/* C [m, n] = op(A) op(B) + beta C with A and B stored whole (lda = ta ? m : k, ldb = tb ? k : n),
 * C's rows ldc apart, alpha 1: the linear layers' products (src/model, host and CUDA). */
static inline struct rf_gemm_desc rf_gemm_desc_whole(enum rf_dtype dtype, int ta, int tb, int m, int n, int k,
                                                     float beta, int ldc) {
  struct rf_gemm_desc d = {.m = m,
                           .n = n,
                           .k = k,
                           .trans_a = ta,
                           .trans_b = tb,
                           .lda = ta ? m : k,
                           .ldb = tb ? k : n,
                           .ldc = ldc,
                           .dtype = dtype,
                           .alpha = 1.0f,
                           .beta = beta};
  return d;
}

/* The product described by d (a, b: f32 or uint16_t bf16 as d->dtype says). Dies
 * on a bad description (sizes, leading dimensions, dtype) or a oneDNN failure. */
void rf_gemm_run(const struct rf_gemm_desc *d, const void *a, const void *b, float *c);

/* A product on FP8 block-quantized operands (DeepSeek-V3's FP8 GEMM on this CPU):
 *
 *   C [m, n] (+)= sum over 128-wide slices s of K:  P_s [i, j] * (sa(i, s) * sb(s, j))
 *
 * where P_s = op(A)[:, s] op(B)[s, :] is a bf16 product of the e4m3 codes held as bf16
 * (exact values, products exact in f32, summed in f32 by oneDNN), and sa, sb are the
 * scales of the tiles holding A's and B's elements of slice s. Each scaled slice is
 * added to C in f32, slice after slice (DeepSeek-V3 promotes its FP8 tensor-core sums to
 * f32 every 128 elements of K in the same way). An operand is stored row-major as
 * `grid` says ([m, k], or [k, m] when trans, for A; [k, n], or [n, k] when trans, for
 * B) and its tiles must be 128 long along K (1 x 128 or 128 x 128 tiles along a stored
 * row, 128 x 1 or 128 x 128 along a stored column) so that a slice meets one tile. */
struct rf_gemm_fp8_operand {
  const uint16_t *codes; /* bf16 (rf_fp8_codes_to_bf16), leading dimension grid.cols */
  const float *scales;   /* one per tile of grid, row-major over the tiles */
  struct rf_fp8_grid grid;
  int trans;
};
struct rf_gemm_fp8_desc {
  int m, n, k;
  struct rf_gemm_fp8_operand a, b;
  int accumulate; /* 1: add to C; 0: C is only written */
};
/* Floats of work the product needs: m * n + n. */
int64_t rf_gemm_fp8_work_elems(const struct rf_gemm_fp8_desc *d);
/* The product into c [m, n] (leading dimension n), using `work`. Creates (and caches)
 * at most two primitives per shape (the whole slices and the last, shorter one);
 * allocates nothing. Dies on operands that do not match m, n, k or whose tiles are not
 * 128 long along K. */
void rf_gemm_fp8_run(const struct rf_gemm_fp8_desc *d, float *c, float *work);

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
