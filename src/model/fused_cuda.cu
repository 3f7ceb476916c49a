/* The fused memory-bound kernels of fused_cuda.h: bf16 activations in and out, f32
 * arithmetic. How each matches the host (tests/gpu/test_fused_cuda.c checks every one):
 *   - RMSNorm with the residual add: a block per row adds the branch into the f32
 *     residual, sums the squares (each thread's strided partial sum, then a fixed
 *     tree), writes rstd and the bf16 output; the backward's dx per row (the dot
 *     w dout x likewise), dw as column sums over chunks of RF_FZ_ROWS rows, then the
 *     chunks in order; the bf16 branch gradient in the same pass as dx;
 *   - RoPE: q's and k's heads in one grid-stride launch, the host's products in its
 *     order (same bits before the bf16 rounding);
 *   - SwiGLU: the host's arithmetic with its exp (cuda_common.cuh): same bits;
 *   - cross-entropy: a block per (row, chunk of RF_FUSED_CE_CHUNK columns) writes the
 *     chunk's maximum and its sum of exp(z - max) (each thread's few terms in f32, the
 *     block's in f64); a block per row combines the chunks in order, in f64
 *     (lse = M + log sum_c s_c exp(m_c - M)), and the row's loss lse - z[target]; one
 *     block sums the rows' losses in a fixed order. The backward is element-wise, in
 *     place, the host's arithmetic;
 *   - a unit's shard: the pieces' chunks are the blocks of one launch (a block finds its
 *     piece by binary search over first_chunk; zero-length pieces own no block): the sum
 *     of squares (f64 per block, then the blocks in order), AdamW per element with the
 *     host's operations in its order (no FMA contraction), the gradient multiplied by
 *     the clip factor first.
 * A failed launch stops the rank (rf_die) naming the kernel. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "core/core.h"
#include "model/fused_cuda.h"
#include "optim/optim.h"
}
#include "core/fp8_cuda.cuh"
#include "model/cuda_common.cuh"
#include "optim/adamw_cuda.cuh"

#define RF_FZ_THREADS 256
#define RF_FZ_ROWS 256 /* rows per chunk of a column sum */
#define RF_FZ_MAX_BLOCKS 8192

#define RF_FZ_LAUNCHED(what)                                                                      \
  do {                                                                                            \
    cudaError_t rf_e_ = cudaGetLastError();                                                       \
    if (rf_e_ != cudaSuccess) RF_DIE("CUDA kernel of %s: %s", (what), cudaGetErrorString(rf_e_)); \
  } while (0)

static unsigned fz_blocks(size_t n) {
  size_t b = (n + RF_FZ_THREADS - 1) / RF_FZ_THREADS;
  if (b < 1) b = 1;
  return b > RF_FZ_MAX_BLOCKS ? RF_FZ_MAX_BLOCKS : (unsigned)b;
}

static void fz_need(size_t need, size_t have, const char *what) {
  if (need > have) RF_DIE("%s on CUDA needs %zu bytes of scratch, given %zu", what, need, have);
}

/* ---- RMSNorm with the residual add ---- */

__global__ void add_rmsnorm_forward_kernel(uint16_t *out, float *rstd, float *resid, const uint16_t *branch,
                                           const float *w, int dim, float eps) {
  __shared__ float sh[32];
  size_t row = blockIdx.x;
  float *xr = resid + row * dim;
  const uint16_t *br = branch ? branch + row * dim : NULL;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float x = xr[i];
    if (br) xr[i] = x = __fadd_rn(x, rf_f32_dev(br[i]));
    ss = __fadd_rn(ss, __fmul_rn(x, x));
  }
  ss = block_sum(ss, sh);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
  if (threadIdx.x == 0) rstd[row] = r;
  uint16_t *o = out + row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    o[i] = rf_bf16_dev(__fmul_rn(__fmul_rn(xr[i], r), w[i]));
}

extern "C" void rf_fused_add_rmsnorm_forward(uint16_t *out, float *rstd, float *resid, const uint16_t *branch,
                                             const float *w, int n_rows, int dim, float eps,
                                             cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  add_rmsnorm_forward_kernel<<<(unsigned)n_rows, RF_FZ_THREADS, 0, stream>>>(out, rstd, resid, branch, w, dim,
                                                                             eps);
  RF_FZ_LAUNCHED("add + rmsnorm forward");
}

/* dresid += r w dout - x r^3 / dim * sum(w dout x) (the host's order per element), then
 * dbranch = bf16(dresid). */
__global__ void add_rmsnorm_backward_kernel(float *dresid, uint16_t *dbranch, const uint16_t *dout,
                                            const float *x, const float *rstd, const float *w, int dim) {
  __shared__ float sh[32];
  size_t row = blockIdx.x;
  const float *xr = x + row * dim;
  const uint16_t *g = dout + row * dim;
  float dot = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(w[i], rf_f32_dev(g[i])), xr[i]));
  dot = block_sum(dot, sh);
  float r = rstd[row];
  float c = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(dot, r), r), r), (float)dim);
  float *d = dresid + row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v =
        __fadd_rn(d[i], __fsub_rn(__fmul_rn(__fmul_rn(r, w[i]), rf_f32_dev(g[i])), __fmul_rn(xr[i], c)));
    d[i] = v;
    if (dbranch) dbranch[row * dim + i] = rf_bf16_dev(v);
  }
}

/* partial[chunk, j] = sum over the chunk's rows, in row order, of dout * x * rstd[row]
 * (the host's products in its order). */
__global__ void rmsnorm_dw_chunks_kernel(float *partial, const uint16_t *dout, const float *x,
                                         const float *rstd, int rows, int cols) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int chunk = blockIdx.y;
  if (j >= cols) return;
  int r0 = chunk * RF_FZ_ROWS, r1 = min(rows, r0 + RF_FZ_ROWS);
  float acc = 0.0f;
  for (int r = r0; r < r1; r++) {
    size_t e = (size_t)r * cols + j;
    acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(rf_f32_dev(dout[e]), x[e]), rstd[r]));
  }
  partial[(size_t)chunk * cols + j] = acc;
}

extern "C" size_t rf_fused_rmsnorm_scratch_bytes(int n_rows, int dim) {
  if (n_rows <= 0 || dim <= 0) return 0;
  return ((size_t)n_rows + RF_FZ_ROWS - 1) / RF_FZ_ROWS * (size_t)dim * sizeof(float);
}

extern "C" void rf_fused_add_rmsnorm_backward(float *dresid, uint16_t *dbranch, float *dw,
                                              const uint16_t *dout, const float *x, const float *rstd,
                                              const float *w, int n_rows, int dim, void *scratch,
                                              size_t scratch_bytes, cudaStream_t stream) {
  if (n_rows <= 0 || dim <= 0) return;
  if (dw) {
    fz_need(rf_fused_rmsnorm_scratch_bytes(n_rows, dim), scratch_bytes, "add + rmsnorm backward");
    int chunks = (n_rows + RF_FZ_ROWS - 1) / RF_FZ_ROWS;
    unsigned cb = (unsigned)((dim + RF_FZ_THREADS - 1) / RF_FZ_THREADS);
    rmsnorm_dw_chunks_kernel<<<dim3(cb, (unsigned)chunks), RF_FZ_THREADS, 0, stream>>>((float *)scratch, dout,
                                                                                       x, rstd, n_rows, dim);
    RF_FZ_LAUNCHED("add + rmsnorm backward dw");
    rf_colsum_finish_kernel<><<<cb, RF_FZ_THREADS, 0, stream>>>(dw, (const float *)scratch, chunks, dim);
    RF_FZ_LAUNCHED("add + rmsnorm backward dw");
  }
  add_rmsnorm_backward_kernel<<<(unsigned)n_rows, RF_FZ_THREADS, 0, stream>>>(dresid, dbranch, dout, x, rstd,
                                                                              w, dim);
  RF_FZ_LAUNCHED("add + rmsnorm backward dx");
}

/* ---- rotary embedding of q and k ---- */

/* Element e < rows * (nh + nkv) * half: row, head (q's nh heads, then k's), pair i. */
__global__ void rope_qk_kernel(uint16_t *q, uint16_t *k, long rows, int seq, int nh, int nkv, int hd,
                               const float *cos_t, const float *sin_t, float sign) {
  int half = hd / 2, heads = nh + nkv;
  size_t total = (size_t)rows * heads * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t i = e % half, hh = (e / half) % heads, n = e / ((size_t)half * heads);
    int t = (int)(n % seq);
    float c = cos_t[(size_t)t * half + i], si = __fmul_rn(sign, sin_t[(size_t)t * half + i]);
    uint16_t *p = hh < (size_t)nh ? q + (n * nh + hh) * hd : k + (n * nkv + (hh - nh)) * hd;
    float a = rf_f32_dev(p[i]), b = rf_f32_dev(p[i + half]);
    p[i] = rf_bf16_dev(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, si)));
    p[i + half] = rf_bf16_dev(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, si)));
  }
}

extern "C" void rf_fused_rope_qk(uint16_t *q, uint16_t *k, int batch, int seq, int nh, int nkv, int hd,
                                 const float *cos_t, const float *sin_t, int inverse, cudaStream_t stream) {
  long rows = (long)batch * seq;
  if (!k) nkv = 0;
  if (rows <= 0 || hd < 2 || nh + nkv <= 0) return;
  rope_qk_kernel<<<fz_blocks((size_t)rows * (nh + nkv) * (hd / 2)), RF_FZ_THREADS, 0, stream>>>(
      q, k, rows, seq, nh, nkv, hd, cos_t, sin_t, inverse ? -1.0f : 1.0f);
  RF_FZ_LAUNCHED("rope q, k");
}

/* ---- SwiGLU ---- */

__global__ void swiglu_forward_bf16_kernel(uint16_t *h, const uint16_t *gate, const uint16_t *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = rf_f32_dev(gate[i]);
    h[i] = rf_bf16_dev(__fmul_rn(__fmul_rn(g, rf_sigmoid_dev(g)), rf_f32_dev(up[i])));
  }
}

/* dup may alias dh: both read before either is written. */
__global__ void swiglu_backward_bf16_kernel(uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                                            const uint16_t *gate, const uint16_t *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = rf_f32_dev(gate[i]), d = rf_f32_dev(dh[i]), u = rf_f32_dev(up[i]);
    float sg = rf_sigmoid_dev(g);
    float silu = __fmul_rn(g, sg);
    float t = __fmul_rn(__fmul_rn(d, u), sg);
    dgate[i] = rf_bf16_dev(__fmul_rn(t, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sg)))));
    dup[i] = rf_bf16_dev(__fmul_rn(d, silu));
  }
}

extern "C" void rf_fused_swiglu_forward(uint16_t *h, const uint16_t *gate, const uint16_t *up, size_t n,
                                        cudaStream_t stream) {
  if (n == 0) return;
  swiglu_forward_bf16_kernel<<<fz_blocks(n), RF_FZ_THREADS, 0, stream>>>(h, gate, up, n);
  RF_FZ_LAUNCHED("swiglu forward");
}

extern "C" void rf_fused_swiglu_backward(uint16_t *dgate, uint16_t *dup, const uint16_t *dh,
                                         const uint16_t *gate, const uint16_t *up, size_t n,
                                         cudaStream_t stream) {
  if (n == 0) return;
  swiglu_backward_bf16_kernel<<<fz_blocks(n), RF_FZ_THREADS, 0, stream>>>(dgate, dup, dh, gate, up, n);
  RF_FZ_LAUNCHED("swiglu backward");
}

/* ---- cross-entropy over the vocabulary in chunks ---- */

extern "C" int rf_fused_ce_chunks(int vocab) { return (vocab + RF_FUSED_CE_CHUNK - 1) / RF_FUSED_CE_CHUNK; }

/* Block b: row b / chunks, chunk b % chunks: its maximum and sum of exp(z - max) into
 * part[b] (a float2 as two floats). RF_FUSED_CE_CHUNK / blockDim.x terms per thread in
 * f32, the block's sum in f64. */
__global__ void ce_chunk_kernel(float *part, const uint16_t *logits, int vocab, int chunks) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  size_t row = blockIdx.x / chunks;
  int c = blockIdx.x % chunks;
  int j0 = c * RF_FUSED_CE_CHUNK, j1 = min(vocab, j0 + RF_FUSED_CE_CHUNK);
  const uint16_t *z = logits + row * vocab;
  float mx = -INFINITY;
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) mx = fmaxf(mx, rf_f32_dev(z[j]));
  mx = block_max(mx, shf);
  float s = 0.0f;
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x)
    s = __fadd_rn(s, rf_expf_dev(__fsub_rn(rf_f32_dev(z[j]), mx)));
  double sd = block_sum_d((double)s, shd);
  if (threadIdx.x == 0) {
    part[2 * (size_t)blockIdx.x] = mx;
    part[2 * (size_t)blockIdx.x + 1] = (float)sd;
  }
}

/* A block per row: lse from its chunks (in order, f64), the row's loss. */
__global__ void ce_row_kernel(double *rowloss, float *lse, const float *part, const uint16_t *logits,
                              const int32_t *targets, int vocab, int chunks) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  size_t row = blockIdx.x;
  const float *p = part + 2 * row * chunks;
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) mx = fmaxf(mx, p[2 * c]);
  mx = block_max(mx, shf);
  double s = 0.0;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x)
    s += (double)p[2 * c + 1] * exp((double)p[2 * c] - (double)mx);
  s = block_sum_d(s, shd);
  if (threadIdx.x == 0) {
    double l = (double)mx + log(s);
    lse[row] = (float)l;
    int t = targets ? targets[row] : -1;
    rowloss[row] = t >= 0 ? l - (double)rf_f32_dev(logits[row * vocab + t]) : 0.0;
  }
}

__global__ void ce_sum_rows_kernel(double *loss, const double *rowloss, int n) {
  __shared__ double shd[32];
  double acc = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x) acc += rowloss[r];
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) *loss = acc;
}

extern "C" size_t rf_fused_ce_scratch_bytes(int n, int vocab) {
  if (n <= 0) return 0;
  return (size_t)n * sizeof(double) + (size_t)n * rf_fused_ce_chunks(vocab) * 2 * sizeof(float);
}

extern "C" void rf_fused_cross_entropy_forward(double *loss, float *lse, const uint16_t *logits,
                                               const int32_t *targets, int n, int vocab, void *scratch,
                                               size_t scratch_bytes, cudaStream_t stream) {
  if (n <= 0 || vocab <= 0) {
    if (cudaMemsetAsync(loss, 0, sizeof(double), stream) != cudaSuccess) RF_DIE("cross-entropy: memset");
    return;
  }
  fz_need(rf_fused_ce_scratch_bytes(n, vocab), scratch_bytes, "cross-entropy forward");
  int chunks = rf_fused_ce_chunks(vocab);
  double *rowloss = (double *)scratch;
  float *part = (float *)(rowloss + n);
  ce_chunk_kernel<<<(unsigned)((size_t)n * chunks), RF_FZ_THREADS, 0, stream>>>(part, logits, vocab, chunks);
  RF_FZ_LAUNCHED("cross-entropy chunks");
  ce_row_kernel<<<(unsigned)n, 64, 0, stream>>>(rowloss, lse, part, logits, targets, vocab, chunks);
  RF_FZ_LAUNCHED("cross-entropy rows");
  ce_sum_rows_kernel<<<1, 1024, 0, stream>>>(loss, rowloss, n);
  RF_FZ_LAUNCHED("cross-entropy loss");
}

/* logits -> bf16(scale * (softmax - onehot)) in place, the host's arithmetic; a block per
 * (row, chunk). */
__global__ void ce_backward_kernel(uint16_t *logits, const float *lse, const int32_t *targets, int vocab,
                                   int chunks, float scale) {
  size_t row = blockIdx.x / chunks;
  int c = blockIdx.x % chunks;
  int j0 = c * RF_FUSED_CE_CHUNK, j1 = min(vocab, j0 + RF_FUSED_CE_CHUNK);
  uint16_t *z = logits + row * vocab;
  int t = targets[row];
  float m = lse[row];
  for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
    if (t < 0) {
      z[j] = 0;
      continue;
    }
    float e = __fmul_rn(rf_expf_dev(__fsub_rn(rf_f32_dev(z[j]), m)), scale);
    z[j] = rf_bf16_dev(j == t ? __fsub_rn(e, scale) : e);
  }
}

extern "C" void rf_fused_cross_entropy_backward(uint16_t *logits, const float *lse, const int32_t *targets,
                                                int n, int vocab, float scale, cudaStream_t stream) {
  if (n <= 0 || vocab <= 0) return;
  int chunks = rf_fused_ce_chunks(vocab);
  ce_backward_kernel<<<(unsigned)((size_t)n * chunks), RF_FZ_THREADS, 0, stream>>>(logits, lse, targets,
                                                                                   vocab, chunks, scale);
  RF_FZ_LAUNCHED("cross-entropy backward");
}

/* ---- FP8 of bf16 activations ---- */

__global__ void fp8_set_bad_kernel(long long *bad) { *bad = INT64_MAX; }

/* A warp per 1 x 128 tile (grid-stride over the tiles, warp-uniform): the amax on the
 * magnitudes' bits (a NaN or an infinity above 0x7f7fffff, its index into *bad), the scale
 * (fp8_cuda.cuh: rf_fp8_scale's arithmetic), the codes of x / scale. */
__global__ void fp8_rows_bf16_kernel(uint8_t *codes, float *scales, long long *bad, const uint16_t *x,
                                     int64_t rows, int64_t cols, int64_t tc, int pow2) {
  int lane = threadIdx.x & 31;
  int64_t wpb = blockDim.x >> 5, tiles = rows * tc, step = (int64_t)gridDim.x * wpb;
  for (int64_t t = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); t < tiles; t += step) {
    int64_t r = t / tc, c0 = (t - r * tc) * RF_FP8_TILE;
    int w = cols - c0 < RF_FP8_TILE ? (int)(cols - c0) : RF_FP8_TILE;
    const uint16_t *xr = x + r * cols + c0;
    uint32_t m = 0;
    for (int i = lane; i < w; i += 32) {
      uint32_t b = ((uint32_t)xr[i] << 16) & 0x7fffffffu;
      if (b > 0x7f7fffffu) atomicMin(bad, (long long)(r * cols + c0 + i));
      m = b > m ? b : m;
    }
    for (int o = 16; o > 0; o >>= 1) {
      uint32_t y = __shfl_xor_sync(RF_FULL_MASK, m, o);
      m = y > m ? y : m;
    }
    float s = m > 0x7f7fffffu ? __uint_as_float(0x7fc00000u) : rf_cuda_fp8_scale(m, pow2);
    if (lane == 0) scales[t] = s;
    uint8_t *cr = codes + r * cols + c0;
    for (int i = lane; i < w; i += 32) cr[i] = rf_cuda_e4m3(__fdiv_rn(rf_f32_dev(xr[i]), s));
  }
}

extern "C" void rf_fused_fp8_quantize_rows_bf16(uint8_t *codes, float *scales, long long *bad,
                                                const uint16_t *x, int64_t rows, int64_t cols, int pow2,
                                                cudaStream_t stream) {
  fp8_set_bad_kernel<<<1, 1, 0, stream>>>(bad);
  RF_FZ_LAUNCHED("fp8 quantize");
  if (rows <= 0 || cols <= 0) return;
  int64_t tc = (cols + RF_FP8_TILE - 1) / RF_FP8_TILE, tiles = rows * tc;
  int64_t blocks = (tiles + RF_FZ_THREADS / 32 - 1) / (RF_FZ_THREADS / 32);
  if (blocks > RF_FZ_MAX_BLOCKS) blocks = RF_FZ_MAX_BLOCKS;
  fp8_rows_bf16_kernel<<<(unsigned)blocks, RF_FZ_THREADS, 0, stream>>>(codes, scales, bad, x, rows, cols, tc,
                                                                       pow2);
  RF_FZ_LAUNCHED("fp8 quantize");
}

/* ---- a unit's shard ---- */

extern "C" int64_t rf_fused_pieces_plan(struct rf_fused_piece *pieces, int n) {
  int64_t chunks = 0;
  for (int i = 0; i < n; i++) {
    pieces[i].first_chunk = chunks;
    chunks += (pieces[i].len + RF_FUSED_CHUNK - 1) / RF_FUSED_CHUNK;
  }
  return chunks;
}

/* The piece of chunk c: the last piece whose first chunk is at most c (zero-length pieces
 * share their first chunk with the piece after them, which is the one taken), and the
 * chunk's element range in it. */
static __device__ int piece_of(const struct rf_fused_piece *pieces, int n, int64_t c, int64_t *i0,
                               int64_t *i1) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (pieces[mid].first_chunk <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  const struct rf_fused_piece *p = &pieces[lo];
  int64_t k = c - p->first_chunk;
  *i0 = p->offset + k * RF_FUSED_CHUNK;
  int64_t end = (k + 1) * RF_FUSED_CHUNK;
  *i1 = p->offset + (end < p->len ? end : p->len);
  return lo;
}

__global__ void sumsq_pieces_kernel(double *partial, const float *g, const struct rf_fused_piece *pieces,
                                    int n_pieces) {
  __shared__ double shd[32];
  int64_t i0, i1;
  piece_of(pieces, n_pieces, blockIdx.x, &i0, &i1);
  double acc = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) acc += (double)g[i] * (double)g[i];
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

__global__ void sumsq_finish_kernel(double *sumsq, int accumulate, const double *partial, int64_t n) {
  __shared__ double shd[32];
  double acc = 0.0;
  for (int64_t b = threadIdx.x; b < n; b += blockDim.x) acc += partial[b];
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) *sumsq = accumulate ? *sumsq + acc : acc;
}

extern "C" void rf_fused_sum_squares(double *sumsq, int accumulate, const float *g,
                                     const struct rf_fused_piece *pieces, int n_pieces, int64_t n_chunks,
                                     void *scratch, size_t scratch_bytes, cudaStream_t stream) {
  if (n_chunks > 0) {
    fz_need((size_t)n_chunks * sizeof(double), scratch_bytes, "sum of squares");
    if (n_chunks > 0x7fffffff) RF_DIE("sum of squares: %lld chunks", (long long)n_chunks);
    sumsq_pieces_kernel<<<(unsigned)n_chunks, RF_FZ_THREADS, 0, stream>>>((double *)scratch, g, pieces,
                                                                          n_pieces);
    RF_FZ_LAUNCHED("sum of squares");
  }
  sumsq_finish_kernel<<<1, 1024, 0, stream>>>(sumsq, accumulate, (const double *)scratch, n_chunks);
  RF_FZ_LAUNCHED("sum of squares");
}

__global__ void clip_factor_kernel(float *factor, double *norm_out, const double *sumsq, double max_norm) {
  double norm = sqrt(*sumsq);
  if (norm_out) *norm_out = norm;
  *factor = max_norm > 0 && isfinite(norm) && norm > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

extern "C" void rf_fused_clip_factor(float *factor, double *norm, const double *sumsq, double max_norm,
                                     cudaStream_t stream) {
  clip_factor_kernel<<<1, 1, 0, stream>>>(factor, norm, sumsq, max_norm);
  RF_FZ_LAUNCHED("clip factor");
}

__global__ void adamw_pieces_kernel(struct rf_optim_hyper h, float *p, const float *g, float *m, float *v,
                                    const float *gscale, const struct rf_fused_piece *pieces, int n_pieces) {
  int64_t i0, i1;
  int k = piece_of(pieces, n_pieces, blockIdx.x, &i0, &i1);
  float dec = pieces[k].decay ? h.decay : 1.0f;
  float s = gscale ? *gscale : 1.0f;
  if (s != s) return; /* NaN: a non-finite norm, the update skipped (as adamw_cuda.cu's) */
  for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
    rf_adamw_element(h, dec, gscale ? __fmul_rn(g[i], s) : g[i], p + i, m + i, v + i);
  }
}

extern "C" void rf_fused_adamw(const struct rf_optim_hyper *h, float *p, const float *g, float *m, float *v,
                               const float *gscale, const struct rf_fused_piece *pieces, int n_pieces,
                               int64_t n_chunks, cudaStream_t stream) {
  if (n_chunks <= 0) return;
  if (n_chunks > 0x7fffffff) RF_DIE("AdamW: %lld chunks", (long long)n_chunks);
  adamw_pieces_kernel<<<(unsigned)n_chunks, RF_FZ_THREADS, 0, stream>>>(*h, p, g, m, v, gscale, pieces,
                                                                        n_pieces);
  RF_FZ_LAUNCHED("AdamW over the shard");
}
