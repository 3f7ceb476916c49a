/* Muon's Newton-Schulz iteration on the device (BACKEND=cuda only; optim.h,
 * rf_optim_newton_schulz_cuda): newton_schulz.c's steps with its three products on cuBLASLt
 * (src/gemm/gemm_cuda.h, f32) and the element-wise ones as kernels (muon_cuda.cu), all queued on
 * the caller's stream, nothing read back. */
#include <pthread.h>

#include "device/device_cuda.h"
#include "gemm/gemm_cuda.h"
#include "optim/optim.h"

#define RF_NS_CUDA_GPUS 64

static pthread_mutex_t rf_ns_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rf_gemm_cuda *rf_ns_cuda_ctx[RF_NS_CUDA_GPUS];

/* The cuBLASLt context of the stream's GPU (made on first use, kept for the process). */
static struct rf_gemm_cuda *rf_ns_cuda_gemm(const struct rf_device_stream *stream) {
  int gpu = stream->dev->ordinal;
  RF_ASSERT(gpu >= 0 && gpu < RF_NS_CUDA_GPUS);
  pthread_mutex_lock(&rf_ns_cuda_lock);
  if (!rf_ns_cuda_ctx[gpu]) rf_ns_cuda_ctx[gpu] = rf_gemm_cuda_create(0);
  struct rf_gemm_cuda *g = rf_ns_cuda_ctx[gpu];
  pthread_mutex_unlock(&rf_ns_cuda_lock);
  return g;
}

void rf_optim_newton_schulz_cuda(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                                 double *ss, struct rf_device_stream *stream) {
  RF_ASSERT(stream && stream->dev);
  struct rf_device *dev = stream->dev;
  const float a = 3.4445f, b = -4.7750f, c = 2.0315f; /* newton_schulz.c's */
  int tr = rows > cols;
  int64_t n = tr ? cols : rows, m = tr ? rows : cols; /* y is n x m, n <= m */
  int64_t nm = (n * m + 3) / 4 * 4, nn = (n * n + 3) / 4 * 4;
  float *y = work, *z = work + nm, *g = z + nm, *h = g + nn;
  size_t ybytes = (size_t)(n * m) * sizeof(float), gbytes = (size_t)(n * n) * sizeof(float);
  if (tr)
    rf_optim_muon_cuda_transpose(y, x, rows, cols, stream);
  else
    rf_device_copy(dev, y, x, ybytes, RF_DEVICE_COPY_DEVICE_TO_DEVICE, stream);
  rf_device_memset(dev, ss, 0, sizeof *ss, stream);
  rf_device_sum_squares_add(dev, ss, y, n * m, stream);
  rf_optim_muon_cuda_normalize(y, n * m, ss, eps, stream);
  struct rf_gemm_cuda *ctx = rf_ns_cuda_gemm(stream);
  cudaStream_t st = rf_device_cuda_stream(dev, stream);
  int ni = (int)n, mi = (int)m;
  const struct rf_gemm_desc yyt = {ni, ni, mi, 0, 1, mi, mi, ni, RF_DTYPE_F32, 1.0f, 0.0f};
  const struct rf_gemm_desc hgg = {ni, ni, ni, 0, 0, ni, ni, ni, RF_DTYPE_F32, c, b};
  const struct rf_gemm_desc zhy = {ni, mi, ni, 0, 0, ni, mi, mi, RF_DTYPE_F32, 1.0f, a};
  for (int it = 0; it < steps; it++) {
    /* g = y y^T; h = b g + c g g; z = a y + h y */
    rf_gemm_cuda_run(ctx, &yyt, y, y, g, RF_DTYPE_F32, st);
    rf_device_copy(dev, h, g, gbytes, RF_DEVICE_COPY_DEVICE_TO_DEVICE, stream);
    rf_gemm_cuda_run(ctx, &hgg, g, g, h, RF_DTYPE_F32, st);
    rf_device_copy(dev, z, y, ybytes, RF_DEVICE_COPY_DEVICE_TO_DEVICE, stream);
    rf_gemm_cuda_run(ctx, &zhy, h, y, z, RF_DTYPE_F32, st);
    float *t = y;
    y = z;
    z = t;
  }
  if (tr)
    rf_optim_muon_cuda_transpose(x, y, cols, rows, stream);
  else
    rf_device_copy(dev, x, y, ybytes, RF_DEVICE_COPY_DEVICE_TO_DEVICE, stream);
}
