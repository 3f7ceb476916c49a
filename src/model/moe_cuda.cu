/* The MoE layer's token movement on CUDA (moe_cuda.h): grouping by expert, gather,
 * combine, and the backward's scatter and sums, in moe.c's order.
 *   - grouping: a block per expert counts its choices (a fixed-order block sum), one
 *     thread then makes the padded offsets in expert order, and a block per expert writes
 *     its rows in the choices' order (warp ballots and a prefix over the block's warps, a
 *     chunk of 256 choices at a time): the host's tok and pos, no atomics;
 *   - the combine and the backward's sums add each choice's term in j order with
 *     round-to-nearest intrinsics (no FMA contraction): moe.c's bits; the routing weights'
 *     gradients are dot products reduced in a fixed tree (within h f32 roundoff of moe.c's
 *     serial sum);
 *   - the probabilities' sums: a thread per expert over the rows in order, in f64: moe.c's
 *     bits. */
#include <cuda_runtime.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "core/core.h"
#include "model/moe_cuda.h"
}
#include "model/cuda_common.cuh"

#define RF_MOE_THREADS 256
#define RF_MOE_MAX_BLOCKS 8192

#define RF_MOE_LAUNCHED(what)                                                                     \
  do {                                                                                            \
    cudaError_t rf_e_ = cudaGetLastError();                                                       \
    if (rf_e_ != cudaSuccess) RF_DIE("CUDA kernel of %s: %s", (what), cudaGetErrorString(rf_e_)); \
  } while (0)

static unsigned moe_blocks(size_t n) {
  size_t b = (n + RF_MOE_THREADS - 1) / RF_MOE_THREADS;
  if (b < 1) b = 1;
  return b > RF_MOE_MAX_BLOCKS ? RF_MOE_MAX_BLOCKS : (unsigned)b;
}

/* ---- grouping ---- */

__global__ void moe_count_kernel(int32_t *cnt, double *counts, const int32_t *top, int nk) {
  __shared__ float sh[32];
  int e = blockIdx.x;
  float c = 0.0f; /* exact: at most 2^24 choices per thread's share */
  for (int i = threadIdx.x; i < nk; i += blockDim.x) c = __fadd_rn(c, top[i] == e ? 1.0f : 0.0f);
  c = block_sum(c, sh);
  if (threadIdx.x == 0) {
    if (cnt) cnt[e] = (int32_t)c;
    if (counts) counts[e] += (double)(int32_t)c;
  }
}

/* cnt may be off + 1 (each count read before its offset replaces it) */
__global__ void moe_offsets_kernel(int32_t *off, int *overflow, const int32_t *cnt, int ne, int rows,
                                   int cap) {
  int32_t at = 0;
  off[0] = 0;
  for (int e = 0; e < ne; e++) {
    at += (cnt[e] + rows - 1) / rows * rows;
    off[e + 1] = at;
  }
  if (overflow) *overflow = at > cap ? at : 0;
}

/* Block e: its rows in the choices' order, then its padding rows (tok -1). */
__global__ void moe_place_kernel(int32_t *tok, int32_t *pos, const int32_t *off, const int32_t *top, int nk,
                                 int k, int cap) {
  __shared__ int32_t warp_base[32];
  __shared__ int32_t chunk_base;
  int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  int32_t row0 = off[e], row1 = off[e + 1];
  if (threadIdx.x == 0) chunk_base = row0;
  __syncthreads();
  for (int i0 = 0; i0 < nk; i0 += blockDim.x) {
    int i = i0 + threadIdx.x;
    int mine = i < nk && top[i] == e;
    unsigned ballot = __ballot_sync(RF_FULL_MASK, mine);
    if (lane == 0) warp_base[warp] = __popc(ballot);
    __syncthreads();
    if (threadIdx.x == 0) { /* the warps' counts into their first rows, in warp order */
      int32_t at = chunk_base;
      for (int w = 0; w < nw; w++) {
        int32_t c = warp_base[w];
        warp_base[w] = at;
        at += c;
      }
      chunk_base = at;
    }
    __syncthreads();
    if (mine) {
      int32_t row = warp_base[warp] + __popc(ballot & ((1u << lane) - 1u));
      pos[i] = row;
      if (row < cap) tok[row] = i / k;
    }
    __syncthreads();
  }
  for (int32_t r = chunk_base + threadIdx.x; r < row1 && r < cap; r += blockDim.x) tok[r] = -1;
}

extern "C" size_t rf_moe_cuda_group_scratch_bytes(int ne) {
  return (size_t)(ne > 0 ? ne : 1) * sizeof(int32_t);
}

extern "C" void rf_moe_cuda_group(int32_t *off, int32_t *tok, int32_t *pos, double *counts, int *overflow,
                                  const int32_t *top, int n, int k, int ne, int rows, int cap, void *scratch,
                                  size_t scratch_bytes, cudaStream_t stream) {
  if (ne <= 0 || rows <= 0) RF_DIE("MoE grouping: %d experts, %d rows per chunk", ne, rows);
  if (scratch && scratch_bytes < rf_moe_cuda_group_scratch_bytes(ne))
    RF_DIE("MoE grouping needs %zu bytes of scratch, given %zu", rf_moe_cuda_group_scratch_bytes(ne),
           scratch_bytes);
  int nk = n > 0 && k > 0 ? n * k : 0;
  int32_t *cnt = scratch ? (int32_t *)scratch : off + 1; /* no scratch: the counts in off until replaced */
  moe_count_kernel<<<(unsigned)ne, RF_MOE_THREADS, 0, stream>>>(cnt, counts, top, nk);
  RF_MOE_LAUNCHED("MoE count");
  moe_offsets_kernel<<<1, 1, 0, stream>>>(off, overflow, cnt, ne, rows, cap);
  RF_MOE_LAUNCHED("MoE offsets");
  moe_place_kernel<<<(unsigned)ne, RF_MOE_THREADS, 0, stream>>>(tok, pos, off, top, nk, k, cap);
  RF_MOE_LAUNCHED("MoE grouping");
}

__global__ void moe_prob_sums_kernel(double *psum, const float *probs, int n, int ne) {
  int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= ne) return;
  double acc = psum[e];
  for (int r = 0; r < n; r++) acc += (double)probs[(size_t)r * ne + e];
  psum[e] = acc;
}

extern "C" void rf_moe_cuda_stats(double *counts, double *psum, const int32_t *top, const float *probs, int n,
                                  int k, int ne, cudaStream_t stream) {
  if (ne <= 0 || n <= 0 || k <= 0) return;
  moe_count_kernel<<<(unsigned)ne, RF_MOE_THREADS, 0, stream>>>((int32_t *)NULL, counts, top, n * k);
  RF_MOE_LAUNCHED("MoE counts");
  rf_moe_cuda_prob_sums(psum, probs, n, ne, stream);
}

extern "C" void rf_moe_cuda_prob_sums(double *psum, const float *probs, int n, int ne, cudaStream_t stream) {
  if (ne <= 0 || n <= 0) return;
  moe_prob_sums_kernel<<<(unsigned)((ne + 63) / 64), 64, 0, stream>>>(psum, probs, n, ne);
  RF_MOE_LAUNCHED("MoE probability sums");
}

/* ---- gather, combine ---- */

__global__ void moe_gather_kernel(float *xg, const float *x, const int32_t *tok, const int32_t *off, int ne,
                                  int cap, int h) {
  int32_t total = off[ne] < cap ? off[ne] : cap;
  size_t all = (size_t)total * h;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < all;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t r = e / h, i = e - r * h;
    int32_t t = tok[r];
    xg[e] = t >= 0 ? x[(size_t)t * h + i] : 0.0f;
  }
}

extern "C" void rf_moe_cuda_gather(float *xg, const float *x, const int32_t *tok, const int32_t *off, int ne,
                                   int cap, int h, cudaStream_t stream) {
  if (cap <= 0 || h <= 0) return;
  moe_gather_kernel<<<moe_blocks((size_t)cap * h), RF_MOE_THREADS, 0, stream>>>(xg, x, tok, off, ne, cap, h);
  RF_MOE_LAUNCHED("MoE gather");
}

__global__ void moe_combine_kernel(float *out, const float *ey, const int32_t *pos, const float *topw, int n,
                                   int k, int h) {
  size_t all = (size_t)n * h;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < all;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t r = e / h, i = e - r * h;
    float o = out[e];
    for (int j = 0; j < k; j++)
      o = __fadd_rn(o, __fmul_rn(topw[r * k + j], ey[(size_t)pos[r * k + j] * h + i]));
    out[e] = o;
  }
}

extern "C" void rf_moe_cuda_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n,
                                    int k, int h, cudaStream_t stream) {
  if (n <= 0 || h <= 0 || k <= 0) return;
  moe_combine_kernel<<<moe_blocks((size_t)n * h), RF_MOE_THREADS, 0, stream>>>(out, ey, pos, topw, n, k, h);
  RF_MOE_LAUNCHED("MoE combine");
}

/* ---- backward ---- */

__global__ void moe_dtopw_kernel(float *dtopw, const float *dout, const float *ey, const int32_t *pos, int k,
                                 int h) {
  __shared__ float sh[32];
  size_t c = blockIdx.x, r = c / k;
  const float *g = dout + r * h, *y = ey + (size_t)pos[c] * h;
  float dot = 0.0f;
  for (int i = threadIdx.x; i < h; i += blockDim.x) dot = __fadd_rn(dot, __fmul_rn(g[i], y[i]));
  dot = block_sum(dot, sh);
  if (threadIdx.x == 0) dtopw[c] = dot;
}

extern "C" void rf_moe_cuda_dtopw(float *dtopw, const float *dout, const float *ey, const int32_t *pos, int n,
                                  int k, int h, cudaStream_t stream) {
  if (n <= 0 || k <= 0) return;
  moe_dtopw_kernel<<<(unsigned)((size_t)n * k), RF_MOE_THREADS, 0, stream>>>(dtopw, dout, ey, pos, k, h);
  RF_MOE_LAUNCHED("MoE routing-weight gradients");
}

/* Grouped row r: its token's weighted gradient (the choice j whose pos is r), or zero. */
__global__ void moe_scatter_grad_kernel(float *dyg, const float *dout, const int32_t *pos, const float *topw,
                                        const int32_t *tok, const int32_t *off, int ne, int cap, int k,
                                        int h) {
  int32_t total = off[ne] < cap ? off[ne] : cap;
  size_t all = (size_t)total * h;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < all;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t r = e / h, i = e - r * h;
    int32_t t = tok[r];
    float v = 0.0f;
    if (t >= 0)
      for (int j = 0; j < k; j++)
        if (pos[(size_t)t * k + j] == (int32_t)r)
          v = __fmul_rn(topw[(size_t)t * k + j], dout[(size_t)t * h + i]);
    dyg[e] = v;
  }
}

extern "C" void rf_moe_cuda_scatter_grad(float *dyg, const float *dout, const int32_t *pos, const float *topw,
                                         const int32_t *tok, const int32_t *off, int ne, int cap, int n,
                                         int k, int h, cudaStream_t stream) {
  if (cap <= 0 || h <= 0) return;
  /* the grid strides over off[ne] rows (read on the device): sized by the choices when fewer than cap */
  size_t launch = (size_t)cap;
  if (n > 0 && k > 0 && (size_t)n * (size_t)k < launch) launch = (size_t)n * (size_t)k;
  moe_scatter_grad_kernel<<<moe_blocks(launch * h), RF_MOE_THREADS, 0, stream>>>(dyg, dout, pos, topw, tok,
                                                                                 off, ne, cap, k, h);
  RF_MOE_LAUNCHED("MoE gradient scatter");
}

__global__ void moe_sum_back_kernel(float *dxn, const float *dxg, const int32_t *pos, int n, int k, int h) {
  size_t all = (size_t)n * h;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < all;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t r = e / h, i = e - r * h;
    float d = dxn[e];
    for (int j = 0; j < k; j++) d = __fadd_rn(d, dxg[(size_t)pos[r * k + j] * h + i]);
    dxn[e] = d;
  }
}

extern "C" void rf_moe_cuda_sum_back(float *dxn, const float *dxg, const int32_t *pos, int n, int k, int h,
                                     cudaStream_t stream) {
  if (n <= 0 || h <= 0 || k <= 0) return;
  moe_sum_back_kernel<<<moe_blocks((size_t)n * h), RF_MOE_THREADS, 0, stream>>>(dxn, dxg, pos, n, k, h);
  RF_MOE_LAUNCHED("MoE backward sums");
}
