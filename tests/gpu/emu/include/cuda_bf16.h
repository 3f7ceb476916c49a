/* cuda-emu: the part of CUDA's cuda_bf16.h the kernels use. __nv_bfloat16 is the 16 bits
 * of a bfloat16 (the top half of an IEEE f32); conversions from f32 round to nearest
 * even, a NaN stays a quiet NaN (as __float2bfloat16 on the GPU and rf_bf16_from_f32 on
 * the host); to f32 is exact. */
#ifndef RF_EMU_CUDA_BF16_H
#define RF_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  __nv_bfloat16 b;
  if ((u & 0x7fffffffu) > 0x7f800000u)
    b.bits = (uint16_t)((u >> 16) | 0x40u); /* NaN: quiet, sign kept */
  else
    b.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return b;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = (uint32_t)b.bits << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}

#endif
