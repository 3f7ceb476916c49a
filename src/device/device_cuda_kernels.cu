/* The CUDA device's kernels (device_cuda.h): casts, scaling, the sum of squares in
 * f64 and the FP8 tile quantizer, each the host's arithmetic (src/core/core.h,
 * src/core/fp8.c) written again for the GPU, so that tests/gpu/test_device_cuda.c can
 * require the same bits. Every float operation that must round as the host rounds
 * is an explicit __f*_rn intrinsic (no contraction into an FMA, no fast math). */
#include <stdint.h>

#include "core/fp8_cuda.cuh"
#include "device/device_cuda.h"

namespace {

/* Enough blocks to fill the GPU with a grid-stride loop, at most 65535 x 16. */
unsigned rf_cuda_blocks(int64_t n) {
  int64_t b = (n + RF_CUDA_THREADS - 1) / RF_CUDA_THREADS;
  return (unsigned)(b < 1 ? 1 : b > 65535 * 16 ? 65535 * 16 : b);
}

/* rf_bf16_from_f32: round to nearest even, NaN stays NaN (quiet). */
__device__ uint16_t rf_cuda_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

__device__ float rf_cuda_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__global__ void rf_cuda_f32_to_bf16_kernel(uint16_t *dst, const float *src, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = rf_cuda_bf16(src[i]);
}

__global__ void rf_cuda_bf16_to_f32_kernel(float *dst, const uint16_t *src, int64_t n, int accumulate) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = accumulate ? __fadd_rn(dst[i], rf_cuda_f32(src[i])) : rf_cuda_f32(src[i]);
}

__global__ void rf_cuda_f32_add_kernel(float *dst, const float *src, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = __fadd_rn(dst[i], src[i]);
}

__global__ void rf_cuda_scale_kernel(float *x, int64_t n, float s) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    x[i] = __fmul_rn(x[i], s);
}

/* A fixed tree over the block's threads (RF_CUDA_THREADS, a power of two). */
__device__ double rf_cuda_block_sum(double v, double *shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned h = RF_CUDA_THREADS / 2; h > 0; h /= 2) {
    if (threadIdx.x < h) shared[threadIdx.x] = __dadd_rn(shared[threadIdx.x], shared[threadIdx.x + h]);
    __syncthreads();
  }
  return shared[0];
}

/* Pass 1 on exactly RF_CUDA_SUMSQ_BLOCKS blocks: each thread's strided elements in
 * order, then the block's tree; pass 2 on one block: the tree of the partial sums. */
__global__ void rf_cuda_sumsq_kernel(const float *x, int64_t n, double *partial) {
  __shared__ double shared[RF_CUDA_THREADS];
  double acc = 0.0;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    double v = (double)x[i];
    acc = __dadd_rn(acc, __dmul_rn(v, v));
  }
  double s = rf_cuda_block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

/* *out = the sum (add: *out += it) */
__global__ void rf_cuda_sumsq_final_kernel(const double *partial, double *out, int add) {
  __shared__ double shared[RF_CUDA_THREADS];
  double acc = 0.0;
  for (int i = (int)threadIdx.x; i < RF_CUDA_SUMSQ_BLOCKS; i += RF_CUDA_THREADS)
    acc = __dadd_rn(acc, partial[i]);
  double s = rf_cuda_block_sum(acc, shared);
  if (threadIdx.x == 0) *out = add ? __dadd_rn(*out, s) : s;
}

__global__ void rf_cuda_add_f64_kernel(double *acc, const double *x, double c) {
  *acc = __dadd_rn(*acc, __dadd_rn(*x, c));
}

/* rf_device_clip_factor_of: sqrt and the division are IEEE in f64 on the GPU, the cast rounds to
 * nearest. */
__global__ void rf_cuda_clip_factor_kernel(float *factor, const double *sumsq, double max_norm) {
  double norm = sqrt(*sumsq);
  if (!isfinite(norm))
    *factor = __int_as_float(0x7fc00000); /* NaN: skip */
  else if (!(max_norm > 0) || norm <= max_norm)
    *factor = 1.0f;
  else
    *factor = (float)__ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
}

/* One block per tile of tile_cols > 1: the amax on the magnitudes' bits (a NaN or an
 * infinity is above 0x7f7fffff), the scale, then the codes. */
__global__ void rf_cuda_fp8_tiles_kernel(const float *x, int64_t rows, int64_t cols, int tile_rows,
                                         int tile_cols, int pow2, uint8_t *codes, float *scales,
                                         long long *bad) {
  __shared__ uint32_t shared[RF_CUDA_THREADS];
  __shared__ float scale;
  int64_t tc = (cols + tile_cols - 1) / tile_cols;
  int64_t tile = blockIdx.x, band = tile / tc, j = tile % tc;
  int64_t r0 = band * tile_rows, c0 = j * tile_cols;
  int64_t h = rows - r0 < tile_rows ? rows - r0 : tile_rows,
          w = cols - c0 < tile_cols ? cols - c0 : tile_cols;
  uint32_t m = 0;
  for (int64_t e = threadIdx.x; e < h * w; e += blockDim.x) {
    uint32_t b = __float_as_uint(x[(r0 + e / w) * cols + c0 + e % w]) & 0x7fffffffu;
    if (b > 0x7f7fffffu) atomicMin(bad, (long long)((tile * tile_rows + e / w) * tile_cols + e % w));
    m = b > m ? b : m;
  }
  shared[threadIdx.x] = m;
  __syncthreads();
  for (unsigned k = RF_CUDA_THREADS / 2; k > 0; k /= 2) {
    if (threadIdx.x < k && shared[threadIdx.x + k] > shared[threadIdx.x])
      shared[threadIdx.x] = shared[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    scale = shared[0] > 0x7f7fffffu ? __uint_as_float(0x7fc00000u) : rf_cuda_fp8_scale(shared[0], pow2);
    scales[tile] = scale;
  }
  __syncthreads();
  float s = scale;
  for (int64_t e = threadIdx.x; e < h * w; e += blockDim.x) {
    int64_t at = (r0 + e / w) * cols + c0 + e % w;
    codes[at] = rf_cuda_e4m3(__fdiv_rn(x[at], s));
  }
}

/* Tiles one column wide (tile_cols == 1): a thread per column of a band of tile_rows
 * rows (blockIdx.y), reading along rows, as fp8_quantize_columns does. */
__global__ void rf_cuda_fp8_columns_kernel(const float *x, int64_t rows, int64_t cols, int tile_rows,
                                           int pow2, uint8_t *codes, float *scales, long long *bad) {
  int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, band = blockIdx.y;
  if (c >= cols) return;
  int64_t r0 = band * tile_rows, r1 = r0 + tile_rows < rows ? r0 + tile_rows : rows;
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; r++) {
    uint32_t b = __float_as_uint(x[r * cols + c]) & 0x7fffffffu;
    if (b > 0x7f7fffffu) atomicMin(bad, (long long)(r * cols + c));
    m = b > m ? b : m;
  }
  float s = m > 0x7f7fffffu ? __uint_as_float(0x7fc00000u) : rf_cuda_fp8_scale(m, pow2);
  scales[band * cols + c] = s;
  for (int64_t r = r0; r < r1; r++) codes[r * cols + c] = rf_cuda_e4m3(__fdiv_rn(x[r * cols + c], s));
}

__global__ void rf_cuda_set_i64_kernel(long long *p, long long v) { *p = v; }

}  // namespace

extern "C" cudaError_t rf_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, cudaStream_t stream) {
  rf_cuda_f32_to_bf16_kernel<<<rf_cuda_blocks((int64_t)n), RF_CUDA_THREADS, 0, stream>>>(dst, src,
                                                                                         (int64_t)n);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, int accumulate,
                                           cudaStream_t stream) {
  rf_cuda_bf16_to_f32_kernel<<<rf_cuda_blocks((int64_t)n), RF_CUDA_THREADS, 0, stream>>>(dst, src, (int64_t)n,
                                                                                         accumulate);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_f32_add(float *dst, const float *src, size_t n, cudaStream_t stream) {
  rf_cuda_f32_add_kernel<<<rf_cuda_blocks((int64_t)n), RF_CUDA_THREADS, 0, stream>>>(dst, src, (int64_t)n);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_scale(float *x, int64_t n, float s, cudaStream_t stream) {
  rf_cuda_scale_kernel<<<rf_cuda_blocks(n), RF_CUDA_THREADS, 0, stream>>>(x, n, s);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_sum_squares(const float *x, int64_t n, double *partial, double *out,
                                           cudaStream_t stream) {
  rf_cuda_sumsq_kernel<<<RF_CUDA_SUMSQ_BLOCKS, RF_CUDA_THREADS, 0, stream>>>(x, n, partial);
  rf_cuda_sumsq_final_kernel<<<1, RF_CUDA_THREADS, 0, stream>>>(partial, out, 0);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_sum_squares_add(const float *x, int64_t n, double *partial, double *acc,
                                               cudaStream_t stream) {
  rf_cuda_sumsq_kernel<<<RF_CUDA_SUMSQ_BLOCKS, RF_CUDA_THREADS, 0, stream>>>(x, n, partial);
  rf_cuda_sumsq_final_kernel<<<1, RF_CUDA_THREADS, 0, stream>>>(partial, acc, 1);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_add_f64(double *acc, const double *x, double c, cudaStream_t stream) {
  rf_cuda_add_f64_kernel<<<1, 1, 0, stream>>>(acc, x, c);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_clip_factor(float *factor, const double *sumsq, double max_norm,
                                           cudaStream_t stream) {
  rf_cuda_clip_factor_kernel<<<1, 1, 0, stream>>>(factor, sumsq, max_norm);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_cuda_fp8_quantize(const float *x, int64_t rows, int64_t cols, int tile_rows,
                                            int tile_cols, int pow2, uint8_t *codes, float *scales,
                                            long long *bad, cudaStream_t stream) {
  rf_cuda_set_i64_kernel<<<1, 1, 0, stream>>>(bad, INT64_MAX);
  if (rows == 0 || cols == 0) return cudaGetLastError();
  int64_t bands = (rows + tile_rows - 1) / tile_rows;
  if (tile_cols == 1) {
    if (bands > 65535) return cudaErrorInvalidConfiguration; /* the grid's y limit: 8.4M rows at 128 */
    dim3 grid((unsigned)((cols + RF_CUDA_THREADS - 1) / RF_CUDA_THREADS), (unsigned)bands);
    rf_cuda_fp8_columns_kernel<<<grid, RF_CUDA_THREADS, 0, stream>>>(x, rows, cols, tile_rows, pow2, codes,
                                                                     scales, bad);
  } else {
    int64_t tiles = bands * ((cols + tile_cols - 1) / tile_cols);
    rf_cuda_fp8_tiles_kernel<<<(unsigned)tiles, RF_CUDA_THREADS, 0, stream>>>(
        x, rows, cols, tile_rows, tile_cols, pow2, codes, scales, bad);
  }
  return cudaGetLastError();
}
