/* Counted data movement: every local copy, conversion and own-shard write of the
 * library goes through these functions, which run on the device and count each
 * kind of byte into the device's counters, in one place (collective payloads are
 * counted in src/comm/comm.c). */
#include "device/device.h"

void rf_move_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes,
                  struct rf_device_stream *stream) {
  rf_device_copy(dev, dst, src, bytes, RF_DEVICE_COPY_DEVICE_TO_DEVICE, stream);
  RF_DEVICE_COUNT(dev, bytes_copied, bytes);
}

void rf_move_zero(struct rf_device *dev, void *dst, size_t bytes, struct rf_device_stream *stream) {
  rf_device_memset(dev, dst, 0, bytes, stream);
  RF_DEVICE_COUNT(dev, bytes_copied, bytes);
}

/* dst (dtype) = src (f32), n elements; the bytes written. */
static uint64_t rf_move_store(struct rf_device *dev, void *dst, enum rf_dtype dtype, const float *src,
                              size_t n, struct rf_device_stream *stream) {
  RF_ASSERT(dtype == RF_DTYPE_F32 || dtype == RF_DTYPE_BF16);
  rf_device_cast(dev, dst, dtype, src, RF_DTYPE_F32, n, 0, stream);
  return (uint64_t)n * rf_dtype_size(dtype);
}

void rf_move_convert(struct rf_device *dev, void *dst, enum rf_dtype dtype, const float *src, size_t n,
                     struct rf_device_stream *stream) {
  uint64_t bytes = rf_move_store(dev, dst, dtype, src, n, stream);
  if (dtype == RF_DTYPE_F32)
    RF_DEVICE_COUNT(dev, bytes_copied, bytes);
  else
    RF_DEVICE_COUNT(dev, bytes_cast, bytes);
}

void rf_move_convert_back(struct rf_device *dev, float *dst, const void *src, enum rf_dtype dtype, size_t n,
                          int accumulate, struct rf_device_stream *stream) {
  RF_ASSERT(dtype == RF_DTYPE_F32 || dtype == RF_DTYPE_BF16);
  rf_device_cast(dev, dst, RF_DTYPE_F32, src, dtype, n, accumulate, stream);
  if (dtype == RF_DTYPE_F32)
    RF_DEVICE_COUNT(dev, bytes_copied, (uint64_t)n * sizeof(float));
  else
    RF_DEVICE_COUNT(dev, bytes_cast, (uint64_t)n * sizeof(float));
}

void rf_move_own_shard(struct rf_device *dev, void *dst, enum rf_dtype dtype, const float *src, size_t n,
                       struct rf_device_stream *stream) {
  uint64_t bytes = rf_move_store(dev, dst, dtype, src, n, stream);
  RF_DEVICE_COUNT(dev, bytes_own_shard, bytes);
}
