/* AdamW's update of one element on CUDA (adamw_cuda.cu, src/model/fused_cuda.cu):
 * adamw.c's arithmetic (RF_OPTIM_ADAMW_M/V/P) operation for operation with
 * round-to-nearest intrinsics (nvcc would contract a * b + c into an FMA; gcc -std=c11
 * does not), IEEE sqrt and division: the host's bits. */
#ifndef RF_OPTIM_ADAMW_CUDA_CUH
#define RF_OPTIM_ADAMW_CUDA_CUH

#include <cuda_runtime.h>

static __device__ __forceinline__ void rf_adamw_element(const struct rf_optim_hyper &h, float dec, float gi,
                                                        float *p, float *m, float *v) {
  float mi = *m, vi = *v;
  /* m + (1 - b1) (g - m) */
  mi = __fadd_rn(mi, __fmul_rn(h.one_m_b1, __fsub_rn(gi, mi)));
  /* b2 v + (1 - b2) g^2 */
  vi = __fadd_rn(__fmul_rn(h.b2, vi), __fmul_rn(h.one_m_b2, __fmul_rn(gi, gi)));
  *m = mi;
  *v = vi;
  /* p dec - step_size (m / (sqrt(v) / sqrt(1 - b2^t) + eps)) */
  float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), h.bc2_sqrt), h.eps);
  *p = __fsub_rn(__fmul_rn(*p, dec), __fmul_rn(h.step_size, __fdiv_rn(mi, den)));
}

#endif
