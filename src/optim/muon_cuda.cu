/* Muon's element-wise stages on CUDA (src/optim/muon.c's pack and unpack, the backend's
 * muon_momentum and muon_apply): the momentum of a matrix piece into a device buffer, and
 * the orthogonalized update applied to the parameters; and the element-wise steps of
 * Newton-Schulz on the device (newton_schulz_cuda.c): the transpose and the normalization. muon.c's
 * operations in its order with round-to-nearest intrinsics (no FMA contraction, as gcc -std=c11 compiles the
 * host): the host's bits (tests/gpu/test_optim_cuda.c). */
#include <cuda_runtime.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "optim/optim.h"
}

/* buf.lerp_(g, 1 - mu); u = g.lerp(buf, mu) (Nesterov) or buf: b = buf + om (g - buf);
 * u = b - (b - g) om. */
__global__ void muon_momentum_kernel(float *buf, const float *g, float *u, int64_t len, float om,
                                     int nesterov) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
       i += (int64_t)gridDim.x * blockDim.x) {
    float gi = g[i], b = __fadd_rn(buf[i], __fmul_rn(om, __fsub_rn(gi, buf[i])));
    buf[i] = b;
    u[i] = nesterov ? __fsub_rn(b, __fmul_rn(__fsub_rn(b, gi), om)) : b;
  }
}

/* p = p dec - alr u */
__global__ void muon_apply_kernel(float *p, const float *u, int64_t len, float dec, float alr) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = __fsub_rn(__fmul_rn(p[i], dec), __fmul_rn(alr, u[i]));
}

/* dst[c rows + r] = src[r cols + c]: a thread per element of src. */
__global__ void muon_transpose_kernel(float *dst, const float *src, int64_t rows, int64_t cols) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows * cols;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[(i % cols) * rows + i / cols] = src[i];
}

/* y /= max((float)sqrt(*ss), eps): newton_schulz.c's f64 square root rounded to f32, then the f32
 * division. */
__global__ void muon_normalize_kernel(float *y, int64_t len, const double *ss, float eps) {
  const float norm = fmaxf((float)sqrt(*ss), eps); /* IEEE sqrt, rounded to nearest */
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
       i += (int64_t)gridDim.x * blockDim.x)
    y[i] = __fdiv_rn(y[i], norm);
}

static unsigned rf_muon_blocks(int64_t len) {
  int64_t blocks = (len + 255) / 256;
  return (unsigned)(blocks > 8192 ? 8192 : blocks); /* grid-stride beyond */
}

static cudaStream_t rf_muon_stream(struct rf_device_stream *stream, const char *what) {
  if (!stream) RF_DIE("CUDA %s: a launch without a stream (NULL): name the runtime's", what);
  return (cudaStream_t)stream->handle;
}

static void rf_muon_check(const char *what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) RF_DIE("CUDA kernel of %s: %s", what, cudaGetErrorString(e));
}

extern "C" void rf_optim_muon_cuda_momentum(float *buf, const float *g, float *u, int64_t len, float momentum,
                                            int nesterov, struct rf_device_stream *stream) {
  if (len <= 0) return;
  cudaStream_t st = rf_muon_stream(stream, "Muon's momentum");
  muon_momentum_kernel<<<rf_muon_blocks(len), 256, 0, st>>>(buf, g, u, len, 1.0f - momentum, nesterov);
  rf_muon_check("Muon's momentum");
}

extern "C" void rf_optim_muon_cuda_apply(float *p, const float *u, int64_t len, float dec, float alr,
                                         struct rf_device_stream *stream) {
  if (len <= 0) return;
  cudaStream_t st = rf_muon_stream(stream, "Muon's update");
  muon_apply_kernel<<<rf_muon_blocks(len), 256, 0, st>>>(p, u, len, dec, alr);
  rf_muon_check("Muon's update");
}

extern "C" void rf_optim_muon_cuda_transpose(float *dst, const float *src, int64_t rows, int64_t cols,
                                             struct rf_device_stream *stream) {
  if (rows * cols <= 0) return;
  cudaStream_t st = rf_muon_stream(stream, "Muon's transpose");
  muon_transpose_kernel<<<rf_muon_blocks(rows * cols), 256, 0, st>>>(dst, src, rows, cols);
  rf_muon_check("Muon's transpose");
}

extern "C" void rf_optim_muon_cuda_normalize(float *y, int64_t len, const double *ss, float eps,
                                             struct rf_device_stream *stream) {
  if (len <= 0) return;
  cudaStream_t st = rf_muon_stream(stream, "Muon's normalization");
  muon_normalize_kernel<<<rf_muon_blocks(len), 256, 0, st>>>(y, len, ss, eps);
  rf_muon_check("Muon's normalization");
}
