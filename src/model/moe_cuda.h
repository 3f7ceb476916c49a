/* The MoE layer's token movement on CUDA (moe_cuda.cu; BACKEND=cuda and cuda-emu builds
 * only): moe.c's grouping of tokens by expert, the gather of their inputs, the weighted
 * combine of the experts' outputs and the backward's scatter and sums, each on the caller's
 * stream, nothing allocated, nothing returned to the host. Between them the experts'
 * products run on the grouped rows ([off[e], off[e+1]) for expert e), one GEMM per expert
 * and per chunk of `rows` rows, as moe.c runs them; an idle expert (no token) has an empty
 * range: nothing runs for it and its gradients stay exactly zero.
 *
 * Semantics are moe.c's (tests/gpu/test_moe_cuda.c checks them against a brute-force
 * host reference): `top` [n, k] the router's choices (each in [0, ne)), `topw` [n, k] their
 * weights; `off` [ne + 1] the first grouped row of each expert, each expert's count rounded
 * up to a multiple of `rows`; `tok` [cap] the token of each grouped row (-1: padding);
 * `pos` [n, k] the grouped row of each choice; within an expert, rows in the order of the
 * choices (token-major, then j). Activations are f32 (the model's today). */
#ifndef RF_MODEL_MOE_CUDA_H
#define RF_MODEL_MOE_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Groups the n * k choices by expert into off, tok, pos (one block per expert, then one
 * block for the offsets: no atomics, the host's order); counts [ne] (f64, may be NULL)
 * += the choices per expert, as moe.c's statistics. Rows past off[ne] up to cap are left
 * alone; when the grouped rows would exceed cap, *overflow (device int, may be NULL) is
 * set to the rows needed and nothing past cap is written (the caller sizes cap for the
 * worst case, n * k rounded per expert, or checks it after the step; off[ne] is always
 * the rows needed, so a caller that reads off back checks off[ne] <= cap: the kernel
 * table's moe_group, moe.c). scratch: rf_moe_cuda_group_scratch_bytes(ne), or NULL (the
 * counts are kept in off[1..ne] until the offsets replace them). */
void rf_moe_cuda_group(int32_t *off, int32_t *tok, int32_t *pos, double *counts, int *overflow,
                       const int32_t *top, int n, int k, int ne, int rows, int cap, void *scratch,
                       size_t scratch_bytes, cudaStream_t stream);
size_t rf_moe_cuda_group_scratch_bytes(int ne);
/* moe.c's statistics (rf_model_moe_stats): counts [ne] += the choices of each expert (f64,
 * exact), psum [ne] += the probabilities' sums (rf_moe_cuda_prob_sums); the same bits. */
void rf_moe_cuda_stats(double *counts, double *psum, const int32_t *top, const float *probs, int n, int k,
                       int ne, cudaStream_t stream);
/* psum [ne] += the sum over rows of probs [n, ne], in row order per expert (f64: moe.c's
 * statistics, the same bits). */
void rf_moe_cuda_prob_sums(double *psum, const float *probs, int n, int ne, cudaStream_t stream);
/* xg [cap_rows, h]: row r = x[tok[r]] (zeros where tok[r] < 0), r < off[ne] (read on the
 * device). */
void rf_moe_cuda_gather(float *xg, const float *x, const int32_t *tok, const int32_t *off, int ne, int cap,
                        int h, cudaStream_t stream);
/* out [n, h] += sum over j in order of topw[r, j] * ey[pos[r, j]] (moe.c's combine: the same
 * bits). */
void rf_moe_cuda_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                         int h, cudaStream_t stream);
/* The backward's routing-weight gradients: dtopw [n, k] = dout[r] . ey[pos[r, j]] (a block
 * per choice, a fixed-order reduction). */
void rf_moe_cuda_dtopw(float *dtopw, const float *dout, const float *ey, const int32_t *pos, int n, int k,
                       int h, cudaStream_t stream);
/* dyg [cap_rows, h]: row pos[r, j] = topw[r, j] * dout[r]; padding rows (tok < 0, below
 * off[ne]) zero; rows min(off[ne], cap) (cap INT_MAX: off[ne] alone, checked by the caller). */
void rf_moe_cuda_scatter_grad(float *dyg, const float *dout, const int32_t *pos, const float *topw,
                              const int32_t *tok, const int32_t *off, int ne, int cap, int n, int k, int h,
                              cudaStream_t stream);
/* dxn [n, h] += sum over j in order of dxg[pos[r, j]] (the same bits as moe.c). */
void rf_moe_cuda_sum_back(float *dxn, const float *dxg, const int32_t *pos, int n, int k, int h,
                          cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
