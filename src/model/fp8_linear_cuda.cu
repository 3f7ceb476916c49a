/* `--fp8 block`'s operands on CUDA (fp8_linear_cuda.h): a thread per 128-element tile (the amax
 * on the magnitudes' bits, fp8.c's scale, the codes), a thread per weight code moved. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/fp8_cuda.cuh"
#include "model/fp8_linear_cuda.h"

#define RF_FP8L_THREADS 256
#define RF_FP8L_TILE 128
#define RF_FP8L_MAX_BLOCKS 65535

namespace {

unsigned fp8l_blocks(int64_t n) {
  int64_t b = (n + RF_FP8L_THREADS - 1) / RF_FP8L_THREADS;
  return (unsigned)(b < 1 ? 1 : b > RF_FP8L_MAX_BLOCKS ? RF_FP8L_MAX_BLOCKS : b);
}

__global__ void fp8l_set_kernel(int *bad) { *bad = 0; }

/* The scale of a tile from its amax's bits: NaN (and *bad set) when the tile holds NaN or an
 * infinity (bits above FLT_MAX's). */
__device__ float fp8l_scale(uint32_t amax_bits, int pow2, int *bad) {
  if (amax_bits > 0x7f7fffffu) {
    *bad = 1;
    return __uint_as_float(0x7fc00000u);
  }
  return rf_cuda_fp8_scale(amax_bits, pow2);
}

/* Thread per tile (r, kb) of [rows_pad, kpad / 128]. */
__global__ void fp8l_rows_kernel(const float *x, int rows, int k, int rows_pad, int kpad, int pow2,
                                 uint8_t *codes, float *scales, int *bad) {
  int64_t nkb = kpad / RF_FP8L_TILE, tiles = (int64_t)rows_pad * nkb;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < tiles;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = t / nkb, kb = t % nkb, c0 = kb * RF_FP8L_TILE;
    uint8_t *out = codes + r * kpad + c0;
    int w = r < rows ? (k - c0 < RF_FP8L_TILE ? (int)(k - c0) : RF_FP8L_TILE) : 0;
    if (w < 0) w = 0;
    const float *in = x + r * k + c0;
    uint32_t m = 0;
    for (int i = 0; i < w; i++) {
      uint32_t b = __float_as_uint(in[i]) & 0x7fffffffu;
      m = b > m ? b : m;
    }
    float s = w > 0 ? fp8l_scale(m, pow2, bad) : 1.0f;
    for (int i = 0; i < RF_FP8L_TILE; i++) out[i] = i < w ? rf_cuda_e4m3(__fdiv_rn(in[i], s)) : (uint8_t)0;
    scales[kb * rows_pad + r] = s;
  }
}

/* Thread per tile (c, kb) of [cols_pad, kpad / 128]: sequence g = kb / per, its tile q = kb % per
 * (per = seg / 128 tiles a padded sequence of seg tokens). */
__global__ void fp8l_tokens_kernel(const float *x, int n, int cols, int cols_pad, int run, int seg, int pow2,
                                   uint8_t *codes, float *scales, int *bad) {
  int64_t per = seg / RF_FP8L_TILE, nkb = (int64_t)(n / run) * per, kpad = nkb * RF_FP8L_TILE;
  int64_t tiles = (int64_t)cols_pad * nkb;
  for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < tiles;
       t += (int64_t)gridDim.x * blockDim.x) {
    int64_t c = t % cols_pad, kb = t / cols_pad, g = kb / per, q = kb % per;
    int64_t t0 = g * run + q * RF_FP8L_TILE; /* the tile's first token */
    int64_t left = (g + 1) * run - t0;
    int h = c < cols ? (left < RF_FP8L_TILE ? (int)left : RF_FP8L_TILE) : 0;
    uint32_t m = 0;
    for (int i = 0; i < h; i++) {
      uint32_t b = __float_as_uint(x[(t0 + i) * cols + c]) & 0x7fffffffu;
      m = b > m ? b : m;
    }
    float s = h > 0 ? fp8l_scale(m, pow2, bad) : 1.0f;
    uint8_t *out = codes + c * kpad + kb * RF_FP8L_TILE;
    for (int i = 0; i < RF_FP8L_TILE; i++)
      out[i] = i < h ? rf_cuda_e4m3(__fdiv_rn(x[(t0 + i) * cols + c], s)) : (uint8_t)0;
    scales[kb * cols_pad + c] = s;
  }
}

/* Thread per code of [rows_pad, kpad]: w or w^T, zero past the matrix. */
__global__ void fp8l_weight_codes_kernel(const uint8_t *w, int out, int in, int trans, int rows_pad, int kpad,
                                         uint8_t *codes) {
  int64_t total = (int64_t)rows_pad * kpad;
  int rows = trans ? in : out, k = trans ? out : in;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = e / kpad, p = e % kpad;
    uint8_t v = 0;
    if (r < rows && p < k) v = trans ? w[p * in + r] : w[r * in + p];
    codes[e] = v;
  }
}

/* Thread per scale of [ceil(rows_pad / 128), L4]. */
__global__ void fp8l_weight_scales_kernel(const float *ws, int out, int in, int trans, int rows_pad, int kpad,
                                          float *scales) {
  int64_t tr = (rows_pad + RF_FP8L_TILE - 1) / RF_FP8L_TILE, l4 = (kpad / RF_FP8L_TILE + 3) / 4 * 4;
  int64_t tc = (in + RF_FP8L_TILE - 1) / RF_FP8L_TILE; /* the gathered tiles' row */
  int64_t rows_t = ((trans ? in : out) + RF_FP8L_TILE - 1) / RF_FP8L_TILE,
          k_t = ((trans ? out : in) + RF_FP8L_TILE - 1) / RF_FP8L_TILE;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < tr * l4;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t rb = e / l4, kb = e % l4;
    float v = __uint_as_float(0x7fc00000u);
    if (rb < rows_t && kb < k_t) v = trans ? ws[kb * tc + rb] : ws[rb * tc + kb];
    scales[e] = v;
  }
}

__global__ void fp8l_finish_kernel(float *y, int ldy, const float *staged, int m, int n, int n_pad,
                                   int accumulate, const int *bad) {
  int nan = *bad;
  if (!staged && !nan) return;
  int64_t total = (int64_t)m * n;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (int64_t)gridDim.x * blockDim.x) {
    int64_t i = e / n, j = e % n;
    float *at = y + i * ldy + j;
    if (nan)
      *at = __uint_as_float(0x7fc00000u);
    else
      *at = accumulate ? __fadd_rn(*at, staged[i * n_pad + j]) : staged[i * n_pad + j];
  }
}

}  // namespace

extern "C" cudaError_t rf_fp8_linear_cuda_reset(int *bad, cudaStream_t stream) {
  fp8l_set_kernel<<<1, 1, 0, stream>>>(bad);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_fp8_linear_cuda_rows(const float *x, int rows, int k, int rows_pad, int kpad,
                                               int pow2, uint8_t *codes, float *scales, int *bad,
                                               cudaStream_t stream) {
  fp8l_rows_kernel<<<fp8l_blocks((int64_t)rows_pad * (kpad / RF_FP8L_TILE)), RF_FP8L_THREADS, 0, stream>>>(
      x, rows, k, rows_pad, kpad, pow2, codes, scales, bad);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_fp8_linear_cuda_tokens(const float *x, int n, int cols, int cols_pad, int run,
                                                 int pow2, uint8_t *codes, float *scales, int *bad,
                                                 cudaStream_t stream) {
  int seg = (run + RF_FP8L_TILE - 1) / RF_FP8L_TILE * RF_FP8L_TILE;
  int64_t tiles = (int64_t)cols_pad * (n / run) * (seg / RF_FP8L_TILE);
  fp8l_tokens_kernel<<<fp8l_blocks(tiles), RF_FP8L_THREADS, 0, stream>>>(x, n, cols, cols_pad, run, seg, pow2,
                                                                         codes, scales, bad);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_fp8_linear_cuda_weight(const uint8_t *w, const float *w_scales, int out, int in,
                                                 int trans, int rows_pad, int kpad, uint8_t *codes,
                                                 float *scales, cudaStream_t stream) {
  fp8l_weight_codes_kernel<<<fp8l_blocks((int64_t)rows_pad * kpad), RF_FP8L_THREADS, 0, stream>>>(
      w, out, in, trans, rows_pad, kpad, codes);
  int64_t nscales = (rows_pad + RF_FP8L_TILE - 1) / RF_FP8L_TILE * ((kpad / RF_FP8L_TILE + 3) / 4 * 4);
  fp8l_weight_scales_kernel<<<fp8l_blocks(nscales), RF_FP8L_THREADS, 0, stream>>>(w_scales, out, in, trans,
                                                                                  rows_pad, kpad, scales);
  return cudaGetLastError();
}

extern "C" cudaError_t rf_fp8_linear_cuda_finish(float *y, int ldy, const float *staged, int m, int n,
                                                 int n_pad, int accumulate, const int *bad,
                                                 cudaStream_t stream) {
  fp8l_finish_kernel<<<fp8l_blocks((int64_t)m * n), RF_FP8L_THREADS, 0, stream>>>(y, ldy, staged, m, n, n_pad,
                                                                                  accumulate, bad);
  return cudaGetLastError();
}
