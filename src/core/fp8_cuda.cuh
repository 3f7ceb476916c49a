/* The e4m3 rounding and the tile scale of src/core/fp8.c on CUDA, for the kernels that
 * quantize on the device (src/device/device_cuda_kernels.cu, src/model/fused_cuda.cu):
 * core.h's rf_fp8e4m3_from_f32 and fp8.c's rf_fp8_scale operation for operation, every
 * float operation that must round as the host's an explicit __f*_rn intrinsic, so the
 * same codes and scales bit for bit. Static: each .cu gets its own copy. */
#ifndef RF_CORE_FP8_CUDA_CUH
#define RF_CORE_FP8_CUDA_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* rf_fp8e4m3_from_f32: nearest even, saturating at 448, NaN 0x7f. */
static __device__ __forceinline__ uint8_t rf_cuda_e4m3(float x) {
  uint32_t u = __float_as_uint(x);
  uint32_t sign = (u >> 24) & 0x80u, mag = u & 0x7fffffffu;
  uint32_t mant = mag & 0x7fffffu, rem = mant & 0xfffffu;
  uint32_t v = (((mag >> 23) - 120u) << 3) | (mant >> 20);
  v += (uint32_t)(rem > 0x80000u) | ((uint32_t)(rem == 0x80000u) & v);
  v = v > 0x7eu ? 0x7eu : v;
  float small = mag < 0x3c800000u ? fabsf(x) : 0.0f;
  uint32_t sub = (uint32_t)__fsub_rn(__fadd_rn(__fmul_rn(small, 0x1p9f), 0x1p23f), 0x1p23f);
  uint32_t r = mag < 0x3c800000u ? sub : v;
  r = mag >= 0x7f800000u ? 0x7eu : r;
  r = mag > 0x7f800000u ? 0x7fu : r;
  return (uint8_t)(sign | r);
}

/* rf_fp8_scale from the amax's bits (finite). */
static __device__ __forceinline__ float rf_cuda_fp8_scale(uint32_t amax_bits, int pow2) {
  float amax = __uint_as_float(amax_bits);
  if (amax == 0.0f) return 1.0f;
  float s = __fdiv_rn(amax, 448.0f);
  if (s == 0.0f) s = __uint_as_float(1u); /* FLT_TRUE_MIN */
  if (!pow2) return s;
  int e;
  float f = frexpf(s, &e);
  float p = f == 0.5f ? s : ldexpf(1.0f, e);
  while (__fmul_rn(p, 448.0f) < amax) p = __fmul_rn(p, 2.0f);
  return p;
}

#endif
