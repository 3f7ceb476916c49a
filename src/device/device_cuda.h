/* The CUDA device (BACKEND=cuda only): rf_device_ops on one GPU, and the kernels
 * behind it (device_cuda_kernels.cu), called from C through the launchers below.
 *
 * This header is read by gcc (device_cuda.c, tests/gpu/) and by nvcc as C++
 * (device_cuda_kernels.cu): it names only the CUDA runtime's C types and fixed-width
 * integers, never core.h (C11 that C++ does not take).
 *
 * The device (rf_device_cuda_init): `impl` owns a stream for allocations' zero-fill
 * only (every operation names its caller's stream: NULL is refused), a scratch area on
 * the device for the sum of squares' partial sums and the FP8 refusal's first bad
 * element, and a pinned host word that the sum of squares and the refusal are
 * copied back into; memory comes from cudaMalloc (one call per rf_device_alloc: the
 * runtime calls it at set-up, the arena's slab, never inside a step). A failing CUDA
 * call stops every rank (rf_die) naming the file, the line, the call and
 * cudaGetErrorString's text. */
#ifndef RF_DEVICE_CUDA_H
#define RF_DEVICE_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The number of blocks of the sum of squares' first pass: its partial sums are a
 * fixed tree over a fixed grid, so the result does not depend on scheduling. */
#define RF_CUDA_SUMSQ_BLOCKS 256
#define RF_CUDA_THREADS 256

/* Each launcher queues its kernel on `stream` and returns cudaGetLastError(). */
/* dst[i] = bf16(src[i]) (round to nearest even, NaN stays NaN, as rf_bf16_from_f32). */
cudaError_t rf_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream);
/* dst[i] (+)= f32(src[i]). */
cudaError_t rf_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, int accumulate,
                                cudaStream_t stream);
/* dst[i] += src[i]. */
cudaError_t rf_cuda_f32_add(float *dst, const float *src, size_t n, cudaStream_t stream);
/* x[i] *= s. */
cudaError_t rf_cuda_scale(float *x, int64_t n, float s, cudaStream_t stream);
/* *out (device) = the sum of x[i]^2 in f64 (deterministic); partial holds
 * RF_CUDA_SUMSQ_BLOCKS doubles. */
cudaError_t rf_cuda_sum_squares(const float *x, int64_t n, double *partial, double *out, cudaStream_t stream);
/* *acc += the sum of squares (the same sum as rf_cuda_sum_squares'), on the stream. */
cudaError_t rf_cuda_sum_squares_add(const float *x, int64_t n, double *partial, double *acc,
                                    cudaStream_t stream);
/* *acc = *acc + (*x + c) (f64, one thread). */
cudaError_t rf_cuda_add_f64(double *acc, const double *x, double c, cudaStream_t stream);
/* *factor = rf_device_clip_factor_of(*sumsq, max_norm) (one thread, IEEE f64 sqrt, division and
 * rounding to f32: the host's bits). */
cudaError_t rf_cuda_clip_factor(float *factor, const double *sumsq, double max_norm, cudaStream_t stream);
/* rf_fp8_quantize (src/core/fp8.c) of the row-major [rows, cols] x in tiles of
 * tile_rows x tile_cols: codes and one scale per tile, bit for bit the host's.
 * *bad (device, set to INT64_MAX before the call by the launcher) gets the first
 * NaN or infinity as the host reports it: tile_cols > 1: ((tile * tile_rows + row in
 * tile) * tile_cols + column in tile), tiles in row-major order; tile_cols == 1: the
 * element's row-major index (the host scans a band of rows in row order). Codes and
 * scales of other tiles are written either way. */
cudaError_t rf_cuda_fp8_quantize(const float *x, int64_t rows, int64_t cols, int tile_rows, int tile_cols,
                                 int pow2, uint8_t *codes, float *scales, long long *bad,
                                 cudaStream_t stream);

#ifdef __cplusplus
}
#else
#include "device/device.h"

/* A device on GPU `ordinal` (cudaSetDevice in this thread; the process's later CUDA
 * calls go to it), counting into `counters` (may be NULL). Released by rf_device_free
 * (its streams, events and memory must have been released first). Dies naming the
 * ordinal when there is no such GPU. */
/* The GPUs this process sees (cudaGetDeviceCount; 0 when the runtime has none). */
int rf_device_cuda_count(void);
void rf_device_cuda_init(struct rf_device *dev, int ordinal, struct rf_counters *counters);
/* Why this program cannot train on a CUDA device ("no CUDA device"); NULL when it can. Static storage (the
 * backend's `unavailable`, src/backend). */
const char *rf_device_cuda_unavailable(void);
/* What the device did that a step must not do: cudaMalloc and cudaMallocHost calls
 * (its own scratch included) and host waits (see device_cuda.c), since init. */
struct rf_device_cuda_stats {
  uint64_t mallocs;
  uint64_t host_syncs;
};
struct rf_device_cuda_stats rf_device_cuda_stats(const struct rf_device *dev);
/* The stream behind a stream of a CUDA device (NULL: refused, dies). */
cudaStream_t rf_device_cuda_stream(const struct rf_device *dev, const struct rf_device_stream *stream);
#endif

#endif
