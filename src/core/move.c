/* Counted data movement: every local copy, conversion and own-shard write of the
 * library goes through these functions, and each kind of byte is counted here,
 * in one place (collective payloads are counted in src/comm/comm.c). */
#include <string.h>

#include "core/core.h"

void rf_move_copy(void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
  rf_counters_global.bytes_copied += bytes;
}

void rf_move_zero(void *dst, size_t bytes) {
  memset(dst, 0, bytes);
  rf_counters_global.bytes_copied += bytes;
}

/* dst (dtype) = src (f32), n elements; the bytes written. */
static uint64_t rf_move_store(void *dst, enum rf_dtype dtype, const float *src, size_t n) {
  RF_ASSERT(dtype == RF_DTYPE_F32 || dtype == RF_DTYPE_BF16);
  if (dtype == RF_DTYPE_F32)
    memcpy(dst, src, n * sizeof(float));
  else
    rf_bf16_from_f32_n(dst, src, n);
  return (uint64_t)n * rf_dtype_size(dtype);
}

void rf_move_convert(void *dst, enum rf_dtype dtype, const float *src, size_t n) {
  uint64_t bytes = rf_move_store(dst, dtype, src, n);
  if (dtype == RF_DTYPE_F32)
    rf_counters_global.bytes_copied += bytes;
  else
    rf_counters_global.bytes_cast += bytes;
}

void rf_move_convert_back(float *dst, const void *src, enum rf_dtype dtype, size_t n, int accumulate) {
  RF_ASSERT(dtype == RF_DTYPE_F32 || dtype == RF_DTYPE_BF16);
  if (dtype == RF_DTYPE_F32) {
    const float *s = src;
    if (accumulate)
      for (size_t i = 0; i < n; i++) dst[i] += s[i];
    else
      memcpy(dst, s, n * sizeof(float));
    rf_counters_global.bytes_copied += (uint64_t)n * sizeof(float);
  } else {
    const uint16_t *s = src;
    if (accumulate)
      for (size_t i = 0; i < n; i++) dst[i] += rf_f32_from_bf16(s[i]);
    else
      rf_f32_from_bf16_n(dst, s, n);
    rf_counters_global.bytes_cast += (uint64_t)n * sizeof(float);
  }
}

void rf_move_own_shard(void *dst, enum rf_dtype dtype, const float *src, size_t n) {
  rf_counters_global.bytes_own_shard += rf_move_store(dst, dtype, src, n);
}
