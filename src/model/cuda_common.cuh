/* Device arithmetic shared by the CUDA kernel files of src/model (kernels_cuda.cu,
 * fused_cuda.cu): the host's exp (ops.c's fast_expf, operation for operation, so the
 * same bits as the host), warp and block reductions in a fixed order, and bf16 as the
 * 16 bits of a uint16_t, converted as rf_bf16_from_f32 and rf_f32_from_bf16 of
 * core.h do (round to nearest even; a NaN stays a quiet NaN with its sign). Every
 * function is static (the kernel a template): each .cu gets its own copy, nothing to link. */
#ifndef RF_MODEL_CUDA_COMMON_CUH
#define RF_MODEL_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#ifndef RF_FULL_MASK
#define RF_FULL_MASK 0xffffffffu
#endif

/* ops.c's fast_expf, operation for operation (relative error < 2e-7; NaN stays
 * NaN). */
static __device__ __forceinline__ float rf_expf_dev(float x) {
  float in = x;
  x = x == x ? x : 0.0f;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
  float k = __fsub_rn(t, 12582912.0f);
  float r = __fsub_rn(x, __fmul_rn(k, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(k, -2.12194440e-4f));
  float p = 1.9875691500e-4f;
  p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
  p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
  p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
  p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
  p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
  float s = __int_as_float(((int32_t)k + 127) << 23);
  return in == in ? __fmul_rn(p, s) : in;
}

static __device__ __forceinline__ float rf_sigmoid_dev(float x) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, rf_expf_dev(-x)));
}

static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  return v;
}
static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(RF_FULL_MASK, v, o));
  return v;
}
static __device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(RF_FULL_MASK, v, o);
  return v;
}

/* The block's sum of v (blockDim.x a multiple of 32, at most 1024), the same on
 * every thread, in a fixed order; `sh` holds 32 values. Ends with a barrier. */
static __device__ __forceinline__ float block_sum(float v, float *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
static __device__ __forceinline__ float block_max(float v, float *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}
static __device__ __forceinline__ double block_sum_d(double v, double *sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0.0;
  v = warp_sum_d(v);
  __syncthreads();
  return v;
}

/* bf16 bits <-> f32, as core.h's rf_bf16_from_f32 / rf_f32_from_bf16. */
static __device__ __forceinline__ uint16_t rf_bf16_dev(float x) {
  uint32_t u = __float_as_uint(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
static __device__ __forceinline__ float rf_f32_dev(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

/* out[j] += the sum of partial[k, j] over k < chunks, in order (a column sum's chunks,
 * each summed in row order by the caller's kernel). A template, launched as
 * rf_colsum_finish_kernel<>: a file that does not use it gets no copy. */
template <int unused = 0>
__global__ void rf_colsum_finish_kernel(float *out, const float *partial, int chunks, int cols) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float acc = 0.0f;
  for (int k = 0; k < chunks; k++) acc = __fadd_rn(acc, partial[(size_t)k * cols + j]);
  out[j] = __fadd_rn(out[j], acc);
}

#endif
