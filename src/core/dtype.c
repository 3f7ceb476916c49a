/* Element types and conversions: f32 <-> bf16 and f32 <-> fp8 e4m3 (OCP). */
#include <math.h>
#include <string.h>

#include "core/core.h"

static const struct {
  const char *name;
  size_t size;
} rf_dtype_table[] = {
    [RF_DTYPE_F32] = {"f32", 4}, [RF_DTYPE_BF16] = {"bf16", 2}, [RF_DTYPE_FP8E4M3] = {"fp8e4m3", 1},
    [RF_DTYPE_U8] = {"u8", 1},   [RF_DTYPE_I32] = {"i32", 4},   [RF_DTYPE_I64] = {"i64", 8},
    [RF_DTYPE_F64] = {"f64", 8},
};

size_t rf_dtype_size(enum rf_dtype dtype) { return rf_dtype_table[dtype].size; }

const char *rf_dtype_name(enum rf_dtype dtype) { return rf_dtype_table[dtype].name; }

int rf_dtype_parse(const char *name, enum rf_dtype *out) {
  for (size_t i = 0; i < sizeof rf_dtype_table / sizeof rf_dtype_table[0]; i++) {
    if (strcmp(name, rf_dtype_table[i].name) == 0) {
      *out = (enum rf_dtype)i;
      return 0;
    }
  }
  RF_FAIL("unknown dtype '%s' (expected f32, bf16, fp8e4m3, u8, i32, i64 or f64)", name);
}

void rf_bf16_from_f32_n(uint16_t *dst, const float *src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) dst[i] = rf_bf16_from_f32(src[i]);
}

void rf_f32_from_bf16_n(float *dst, const uint16_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = rf_f32_from_bf16(src[i]);
}

/* e4m3: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Exponent 0 is
 * subnormal (m * 2^-9); S.1111.111 is NaN; the largest finite value is 448. */
float rf_f32_from_fp8e4m3(uint8_t b) {
  float s = (b & 0x80) ? -1.0f : 1.0f;
  uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  if (e == 15 && m == 7) return s * NAN;
  if (e == 0) return s * ldexpf((float)m, -9);
  return s * ldexpf(1.0f + (float)m / 8.0f, (int)e - 7);
}
