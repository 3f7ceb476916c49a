/* The CUDA kernel table (struct rf_model_kernels, kernels.h): the host ops of ops.c
 * on device memory, f32 activations, work queued on the caller's stream, nothing
 * allocated and nothing returned to the host.
 *
 * How each matches the host op (tests/gpu/test_kernels_cuda.c checks every one):
 *   - elementwise ops (embedding forward, rotary, SwiGLU, bias forward, the
 *     cross-entropy backward) do the host's arithmetic in the host's order with
 *     round-to-nearest intrinsics (__fmul_rn, __fadd_rn: nvcc would otherwise
 *     contract a * b + c into an FMA, which gcc -std=c11 does not), and the host's
 *     exp (Cephes' polynomial of ops.c, rf_expf_dev): the same bits;
 *   - the embedding backward sorts (token, row) keys (a bitonic sort in the
 *     scratch) and adds each token's rows in row order into its table row, as the
 *     host's loop does: the same bits, no atomics;
 *   - reductions (RMSNorm's sums, the column sums of dw and db, the log-sum-exp of
 *     a logits row, the loss sum) run in a fixed order (a thread's strided partial
 *     sums, then a fixed tree; column sums in chunks of RF_KC_ROWS rows, then the
 *     chunks in order): deterministic run to run, but not the host's order, so
 *     within f32 (the loss: f64) roundoff of it;
 *   - attention is flash-style, O(T) memory: per query row an online softmax over
 *     key tiles of 32 (the running max and sum rescaled), the row's log-sum-exp
 *     written for the backward; the backward recomputes P = exp(S - lse) tile by
 *     tile in two kernels, dQ (per query tile, over its keys) and dK, dV (per key
 *     tile, over the queries and the heads of its kv group: GQA summed in the
 *     block, no atomics), after D = rowsum(dY * Y). Deterministic; within f32
 *     roundoff of the host. Any head_dim up to 256 (32-lane slices, masked);
 *   - the MoE router: a thread per row, moe.c's loops in f64 in its order (the
 *     GPU's f64 exp against glibc's: within an ulp of f64 before the rounding to f32).
 * The table's stream is the device's struct rf_device_stream, whose handle is a
 * cudaStream_t (NULL: refused, an error, not CUDA's legacy stream). A failed launch stops every rank
 * (rf_die) naming the kernel. scripts/cuda-emu runs these kernels on the CPU
 * (tests/gpu/emu), as far as an emulation can check them. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "core/core.h"
#include "device/device.h"
#include "model/kernels.h"
#include "model/model.h"
}
#include "model/cuda_common.cuh"

#define RF_CUDA_CHECK(call)                                                       \
  do {                                                                            \
    cudaError_t rf_e_ = (call);                                                   \
    if (rf_e_ != cudaSuccess) RF_DIE("%s: %s", #call, cudaGetErrorString(rf_e_)); \
  } while (0)
/* After a launch: a bad configuration shows here (an error inside the kernel at
 * the next sync). */
#define RF_CUDA_LAUNCHED(what)                                                                    \
  do {                                                                                            \
    cudaError_t rf_e_ = cudaGetLastError();                                                       \
    if (rf_e_ != cudaSuccess) RF_DIE("CUDA kernel of %s: %s", (what), cudaGetErrorString(rf_e_)); \
  } while (0)

#define RF_KC_THREADS 256
#define RF_KC_ROWS 256 /* rows per chunk of a column sum */
#define RF_KC_MAX_BLOCKS 4096

static cudaStream_t kc_stream(struct rf_device_stream *s) {
  if (!s) RF_DIE("CUDA model kernels: a launch without a stream (NULL): name the runtime's");
  return (cudaStream_t)s->handle;
}

static unsigned kc_blocks(size_t n) {
  size_t b = (n + RF_KC_THREADS - 1) / RF_KC_THREADS;
  if (b < 1) b = 1;
  return b > RF_KC_MAX_BLOCKS ? RF_KC_MAX_BLOCKS : (unsigned)b;
}

static void kc_need(size_t need, size_t have, const char *what) {
  if (need > have)
    RF_DIE("%s on CUDA needs %zu bytes of scratch, given %zu (size it with scratch_bytes)", what, need, have);
}

/* ---- column sums: out[j] += sum over rows of a[r, j] (* b[r, j] * c[r]) ---- */

/* partial[chunk, j] = the sum over the chunk's rows in row order of a (times b
 * times c[row] when b is given: RMSNorm's dout * x * rstd, multiplied in the
 * host's order). */
__global__ void colsum_chunks_kernel(float *partial, const float *a, const float *b, const float *c, int rows,
                                     int cols) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  int chunk = blockIdx.y;
  if (j >= cols) return;
  int r0 = chunk * RF_KC_ROWS, r1 = min(rows, r0 + RF_KC_ROWS);
  float acc = 0.0f;
  for (int r = r0; r < r1; r++) {
    size_t e = (size_t)r * cols + j;
    float t = b ? __fmul_rn(__fmul_rn(a[e], b[e]), c[r]) : a[e];
    acc = __fadd_rn(acc, t);
  }
  partial[(size_t)chunk * cols + j] = acc;
}

static size_t colsum_bytes(int rows, int cols) {
  size_t chunks = ((size_t)rows + RF_KC_ROWS - 1) / RF_KC_ROWS;
  return chunks * (size_t)cols * sizeof(float);
}

static void colsum(float *out, const float *a, const float *b, const float *c, int rows, int cols,
                   void *scratch, size_t scratch_bytes, cudaStream_t st, const char *what) {
  if (rows <= 0 || cols <= 0) return;
  kc_need(colsum_bytes(rows, cols), scratch_bytes, what);
  int chunks = (rows + RF_KC_ROWS - 1) / RF_KC_ROWS;
  dim3 grid((unsigned)((cols + RF_KC_THREADS - 1) / RF_KC_THREADS), (unsigned)chunks);
  colsum_chunks_kernel<<<grid, RF_KC_THREADS, 0, st>>>((float *)scratch, a, b, c, rows, cols);
  RF_CUDA_LAUNCHED(what);
  rf_colsum_finish_kernel<><<<(unsigned)((cols + RF_KC_THREADS - 1) / RF_KC_THREADS), RF_KC_THREADS, 0, st>>>(
      out, (const float *)scratch, chunks, cols);
  RF_CUDA_LAUNCHED(what);
}

/* ---- embedding ---- */

__global__ void embedding_forward_kernel(float *out, const float *tf, const uint16_t *tb,
                                         const int32_t *tokens, int n, int dim) {
  size_t total = (size_t)n * dim;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t r = e / (size_t)dim, i = e - r * (size_t)dim;
    size_t off = (size_t)tokens[r] * dim + i;
    out[e] = tf ? tf[off] : __uint_as_float((uint32_t)tb[off] << 16);
  }
}

static void cuda_embedding_forward(float *out, const struct rf_model_weight *table, const int32_t *tokens,
                                   int n, int dim, struct rf_device_stream *stream) {
  if (n <= 0 || dim <= 0) return;
  embedding_forward_kernel<<<kc_blocks((size_t)n * dim), RF_KC_THREADS, 0, kc_stream(stream)>>>(
      out, table->f32, table->bf16, tokens, n, dim);
  RF_CUDA_LAUNCHED("embedding forward");
}

/* keys[r] = token << 32 | r for r < n, the largest key beyond (np a power of
 * two). */
__global__ void embedding_keys_kernel(uint64_t *keys, const int32_t *tokens, int n, int np) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < np) keys[r] = r < n ? ((uint64_t)(uint32_t)tokens[r] << 32) | (uint32_t)r : ~(uint64_t)0;
}

/* One step (k, j) of a bitonic sort into ascending order. */
__global__ void bitonic_step_kernel(uint64_t *keys, int j, int k, int np) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= np) return;
  int l = i ^ j;
  if (l <= i) return;
  uint64_t a = keys[i], b = keys[l];
  int up = (i & k) == 0;
  if (up ? a > b : a < b) {
    keys[i] = b;
    keys[l] = a;
  }
}

/* Block p: when sorted key p starts its token's run, adds the run's rows (in
 * row order, one at a time, as the host loop) into the token's table row. */
__global__ void embedding_backward_kernel(float *dtable, const float *dout, const uint64_t *keys, int n,
                                          int dim) {
  int p = blockIdx.x;
  uint32_t tok = (uint32_t)(keys[p] >> 32);
  if (p > 0 && (uint32_t)(keys[p - 1] >> 32) == tok) return;
  int end = p + 1;
  while (end < n && (uint32_t)(keys[end] >> 32) == tok) end++;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float *d = dtable + (size_t)tok * dim + i;
    float acc = *d;
    for (int q = p; q < end; q++) acc = __fadd_rn(acc, dout[(size_t)(uint32_t)keys[q] * dim + i]);
    *d = acc;
  }
}

static int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

static void cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim,
                                    void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  if (n <= 0 || dim <= 0) return;
  int np = pow2_at_least(n);
  kc_need((size_t)np * sizeof(uint64_t), scratch_bytes, "embedding backward");
  cudaStream_t st = kc_stream(stream);
  uint64_t *keys = (uint64_t *)scratch;
  unsigned blocks = (unsigned)((np + RF_KC_THREADS - 1) / RF_KC_THREADS);
  embedding_keys_kernel<<<blocks, RF_KC_THREADS, 0, st>>>(keys, tokens, n, np);
  RF_CUDA_LAUNCHED("embedding backward");
  for (int k = 2; k <= np; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      bitonic_step_kernel<<<blocks, RF_KC_THREADS, 0, st>>>(keys, j, k, np);
      RF_CUDA_LAUNCHED("embedding backward");
    }
  embedding_backward_kernel<<<(unsigned)n, 128, 0, st>>>(dtable, dout, keys, n, dim);
  RF_CUDA_LAUNCHED("embedding backward");
}

/* ---- RMSNorm ---- */

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *x, const float *w, int dim,
                                       float eps) {
  __shared__ float sh[32];
  size_t row = blockIdx.x;
  const float *xr = x + row * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
  ss = block_sum(ss, sh);
  float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)dim), eps)));
  if (threadIdx.x == 0) rstd[row] = r;
  float *o = out + row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = __fmul_rn(__fmul_rn(xr[i], r), w[i]);
}

static void cuda_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                                 float eps, struct rf_device_stream *stream) {
  if (n_rows <= 0 || dim <= 0) return;
  rmsnorm_forward_kernel<<<(unsigned)n_rows, RF_KC_THREADS, 0, kc_stream(stream)>>>(out, rstd, x, w, dim,
                                                                                    eps);
  RF_CUDA_LAUNCHED("rmsnorm forward");
}

/* dx += r w dout - x r^3 / dim * sum(w dout x), in the host's order per
 * element. */
__global__ void rmsnorm_backward_dx_kernel(float *dx, const float *dout, const float *x, const float *rstd,
                                           const float *w, int dim) {
  __shared__ float sh[32];
  size_t row = blockIdx.x;
  const float *xr = x + row * dim, *g = dout + row * dim;
  float dot = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(w[i], g[i]), xr[i]));
  dot = block_sum(dot, sh);
  float r = rstd[row];
  float c = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(dot, r), r), r), (float)dim);
  float *d = dx + row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    d[i] = __fadd_rn(d[i], __fsub_rn(__fmul_rn(__fmul_rn(r, w[i]), g[i]), __fmul_rn(xr[i], c)));
}

static void cuda_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                                  const float *w, int n_rows, int dim, void *scratch, size_t scratch_bytes,
                                  struct rf_device_stream *stream) {
  if (n_rows <= 0 || dim <= 0) return;
  cudaStream_t st = kc_stream(stream);
  if (dw) colsum(dw, dout, x, rstd, n_rows, dim, scratch, scratch_bytes, st, "rmsnorm backward dw");
  if (dx) {
    rmsnorm_backward_dx_kernel<<<(unsigned)n_rows, RF_KC_THREADS, 0, st>>>(dx, dout, x, rstd, w, dim);
    RF_CUDA_LAUNCHED("rmsnorm backward dx");
  }
}

/* ---- rotary embedding ---- */

__global__ void rope_kernel(float *x, long rows, int seq, int n_heads, int hd, const float *cos_t,
                            const float *sin_t, float sign) {
  int half = hd / 2;
  size_t total = (size_t)rows * n_heads * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t i = e % half, hh = (e / half) % n_heads, n = e / ((size_t)half * n_heads);
    int t = (int)(n % seq);
    float c = cos_t[(size_t)t * half + i], si = sign * sin_t[(size_t)t * half + i];
    float *p = x + n * (size_t)n_heads * hd + hh * hd;
    float a = p[i], b = p[i + half];
    p[i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, si));
    p[i + half] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, si));
  }
}

static void cuda_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                            const float *sin_t, int inverse, struct rf_device_stream *stream) {
  long rows = (long)batch * seq;
  if (rows <= 0 || hd < 2 || n_heads <= 0) return;
  rope_kernel<<<kc_blocks((size_t)rows * n_heads * (hd / 2)), RF_KC_THREADS, 0, kc_stream(stream)>>>(
      x, rows, seq, n_heads, hd, cos_t, sin_t, inverse ? -1.0f : 1.0f);
  RF_CUDA_LAUNCHED("rope");
}

/* ---- attention ---- */

/* A block of RF_ATT_WARPS warps takes RF_ATT_ROWS query rows (the forward, dQ)
 * or keys (dK, dV), RF_ATT_RPW per warp; the other side goes in tiles of 32,
 * one per lane. A lane keeps the output dimensions lane + 32 i (i < NI, NI =
 * ceil(hd / 32) rounded up to 1, 2, 4 or 8). Shared rows read with the lane as
 * the row index are padded to hd + 1 floats (no bank conflicts). */
#define RF_ATT_WARPS 8
#define RF_ATT_ROWS 32
#define RF_ATT_RPW (RF_ATT_ROWS / RF_ATT_WARPS)
#define RF_ATT_TILE 32
#define RF_ATT_MAX_HD 256

struct att_shape {
  int T, nh, nkv, hd;
  float scale;
};

template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_forward_kernel(float *y, float *lse, const float *q, const float *k, const float *v,
                       struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T;
  float *qs = sm;                    /* [ROWS][hd] */
  float *ks = qs + RF_ATT_ROWS * hd; /* [TILE][hd + 1] */
  float *vs = ks + RF_ATT_TILE * hp; /* [TILE][hd] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    qs[e] = i0 + r < T ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  float m[RF_ATT_RPW], l[RF_ATT_RPW], acc[RF_ATT_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[rr][ni] = 0.0f;
  }
  const int kend = min(T, i0 + RF_ATT_ROWS); /* keys [0, kend) */
  for (int j0 = 0; j0 < kend; j0 += RF_ATT_TILE) {
    __syncthreads(); /* the previous tile is consumed (and qs written, the first
                        time) */
    for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      int ok = j0 + c < T;
      ks[c * hp + d] = ok ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
      vs[e] = ok ? vb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RF_ATT_RPW; rr++) {
      const int r = warp * RF_ATT_RPW + rr, i = i0 + r;
      if (i >= T || j0 > i) continue; /* the same for the whole warp */
      const int j = j0 + lane;
      float sc = -INFINITY;
      if (j <= i) {
        const float *qr = qs + r * hd, *kr = ks + lane * hp;
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot = fmaf(qr[d], kr[d], dot);
        sc = dot * s.scale;
      }
      const float mn = fmaxf(m[rr], warp_max(sc)); /* finite: key j0 <= i is lane 0's */
      const float p = j <= i ? rf_expf_dev(sc - mn) : 0.0f;
      const float alpha = m[rr] == -INFINITY ? 0.0f : rf_expf_dev(m[rr] - mn);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = mn;
#pragma unroll
      for (int ni = 0; ni < NI; ni++) acc[rr][ni] *= alpha;
      const int cmax = min(RF_ATT_TILE, i - j0 + 1);
      for (int c = 0; c < cmax; c++) {
        const float pc = __shfl_sync(RF_FULL_MASK, p, c);
        const float *vr = vs + c * hd;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          int d = lane + 32 * ni;
          if (d < hd) acc[rr][ni] = fmaf(pc, vr[d], acc[rr][ni]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    const int i = i0 + warp * RF_ATT_RPW + rr;
    if (i >= T) continue;
    const float inv = 1.0f / l[rr];
    float *yr = y + (size_t)b * T * qstr + (size_t)i * qstr + (size_t)h * hd;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < hd) yr[d] = acc[rr][ni] * inv;
    }
    if (lane == 0) lse[(size_t)bh * T + i] = m[rr] + logf(l[rr]);
  }
}

/* D[b, h, i] = dY[i] . Y[i] (= sum_j P dP of the row), a warp per row. */
__global__ void att_rowdot_kernel(float *dd, const float *dy, const float *y, int B, struct att_shape s) {
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)B * s.nh * s.T;
  size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  size_t bh = row / s.T, i = row - bh * s.T, b = bh / s.nh, h = bh - b * s.nh;
  size_t off = (b * s.T + i) * (size_t)s.nh * s.hd + h * s.hd;
  float acc = 0.0f;
  for (int d = lane; d < s.hd; d += 32) acc = fmaf(dy[off + d], y[off + d], acc);
  acc = warp_sum(acc);
  if (lane == 0) dd[row] = acc;
}

/* dQ[i] = sum_{j <= i} dS_ij K_j, dS = P (dP - D) scale, P = exp(S - lse): per
 * query tile. */
template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_backward_dq_kernel(float *dq, const float *dy, const float *lse, const float *dd, const float *q,
                           const float *k, const float *v, struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T;
  float *qs = sm;                     /* [ROWS][hd] */
  float *dys = qs + RF_ATT_ROWS * hd; /* [ROWS][hd] */
  float *ks = dys + RF_ATT_ROWS * hd; /* [TILE][hd + 1] */
  float *vs = ks + RF_ATT_TILE * hp;  /* [TILE][hd + 1] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *dyb = dy + (size_t)b * T * qstr + (size_t)h * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    int ok = i0 + r < T;
    qs[e] = ok ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
    dys[e] = ok ? dyb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  float acc[RF_ATT_RPW][NI], lr[RF_ATT_RPW], dr[RF_ATT_RPW];
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    const int i = i0 + warp * RF_ATT_RPW + rr;
    lr[rr] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
    dr[rr] = i < T ? dd[(size_t)bh * T + i] : 0.0f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[rr][ni] = 0.0f;
  }
  const int kend = min(T, i0 + RF_ATT_ROWS);
  for (int j0 = 0; j0 < kend; j0 += RF_ATT_TILE) {
    __syncthreads();
    for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      int ok = j0 + c < T;
      ks[c * hp + d] = ok ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
      vs[c * hp + d] = ok ? vb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RF_ATT_RPW; rr++) {
      const int r = warp * RF_ATT_RPW + rr, i = i0 + r;
      if (i >= T || j0 > i) continue;
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j <= i) {
        const float *qr = qs + r * hd, *dyr = dys + r * hd, *kr = ks + lane * hp, *vr = vs + lane * hp;
        float sqk = 0.0f, dp = 0.0f;
        for (int d = 0; d < hd; d++) {
          sqk = fmaf(qr[d], kr[d], sqk);
          dp = fmaf(dyr[d], vr[d], dp);
        }
        float p = rf_expf_dev(sqk * s.scale - lr[rr]);
        ds = p * (dp - dr[rr]) * s.scale;
      }
      const int cmax = min(RF_ATT_TILE, i - j0 + 1);
      for (int c = 0; c < cmax; c++) {
        const float dsc = __shfl_sync(RF_FULL_MASK, ds, c);
        const float *kr = ks + c * hp;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          int d = lane + 32 * ni;
          if (d < hd) acc[rr][ni] = fmaf(dsc, kr[d], acc[rr][ni]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    const int i = i0 + warp * RF_ATT_RPW + rr;
    if (i >= T) continue;
    float *o = dq + (size_t)b * T * qstr + (size_t)i * qstr + (size_t)h * hd;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < hd) o[d] = acc[rr][ni];
    }
  }
}

/* dV[j] = sum_h sum_{i >= j} P_ij dY_i, dK[j] = sum_h sum_{i >= j} dS_ij Q_i:
 * per key tile of one kv head, over the query heads of its group and the query
 * tiles from the key tile on. */
template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_backward_dkv_kernel(float *dk, float *dv, const float *dy, const float *lse, const float *dd,
                            const float *q, const float *k, const float *v, struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T;
  float *kt = sm;                     /* [ROWS][hd] this block's keys */
  float *vt = kt + RF_ATT_ROWS * hd;  /* [ROWS][hd] */
  float *qs = vt + RF_ATT_ROWS * hd;  /* [TILE][hd + 1] a query tile */
  float *dys = qs + RF_ATT_TILE * hp; /* [TILE][hd + 1] */
  float *ls = dys + RF_ATT_TILE * hp; /* [TILE] */
  float *dds = ls + RF_ATT_TILE;      /* [TILE] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rep = s.nh / s.nkv;
  const int bg = blockIdx.y, b = bg / s.nkv, g = bg % s.nkv;
  const int j0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    int ok = j0 + r < T;
    kt[e] = ok ? kb[(size_t)(j0 + r) * kstr + d] : 0.0f;
    vt[e] = ok ? vb[(size_t)(j0 + r) * kstr + d] : 0.0f;
  }
  float adk[RF_ATT_RPW][NI], adv[RF_ATT_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++) adk[rr][ni] = adv[rr][ni] = 0.0f;
  for (int hh = 0; hh < rep; hh++) {
    const int h = g * rep + hh;
    const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
    const float *dyb = dy + (size_t)b * T * qstr + (size_t)h * hd;
    const size_t bh = (size_t)b * s.nh + h;
    for (int i0 = j0; i0 < T; i0 += RF_ATT_TILE) {
      __syncthreads();
      for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
        int c = e / hd, d = e - c * hd;
        int ok = i0 + c < T;
        qs[c * hp + d] = ok ? qb[(size_t)(i0 + c) * qstr + d] : 0.0f;
        dys[c * hp + d] = ok ? dyb[(size_t)(i0 + c) * qstr + d] : 0.0f;
      }
      if (tid < RF_ATT_TILE) {
        int ok = i0 + tid < T;
        ls[tid] = ok ? lse[bh * T + i0 + tid] : 0.0f;
        dds[tid] = ok ? dd[bh * T + i0 + tid] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < RF_ATT_RPW; rr++) {
        const int jr = warp * RF_ATT_RPW + rr, j = j0 + jr;
        if (j >= T || i0 + RF_ATT_TILE - 1 < j) continue; /* no query of the tile sees key j */
        const int i = i0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (i < T && i >= j) {
          const float *qr = qs + lane * hp, *dyr = dys + lane * hp, *kr = kt + jr * hd, *vr = vt + jr * hd;
          float sqk = 0.0f, dp = 0.0f;
          for (int d = 0; d < hd; d++) {
            sqk = fmaf(qr[d], kr[d], sqk);
            dp = fmaf(dyr[d], vr[d], dp);
          }
          p = rf_expf_dev(sqk * s.scale - ls[lane]);
          ds = p * (dp - dds[lane]) * s.scale;
        }
        const int c0 = max(0, j - i0), c1 = min(RF_ATT_TILE, T - i0);
        for (int c = c0; c < c1; c++) {
          const float pc = __shfl_sync(RF_FULL_MASK, p, c), dsc = __shfl_sync(RF_FULL_MASK, ds, c);
          const float *qr = qs + c * hp, *dyr = dys + c * hp;
#pragma unroll
          for (int ni = 0; ni < NI; ni++) {
            int d = lane + 32 * ni;
            if (d < hd) {
              adv[rr][ni] = fmaf(pc, dyr[d], adv[rr][ni]);
              adk[rr][ni] = fmaf(dsc, qr[d], adk[rr][ni]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    const int j = j0 + warp * RF_ATT_RPW + rr;
    if (j >= T) continue;
    float *okk = dk + (size_t)b * T * kstr + (size_t)j * kstr + (size_t)g * hd;
    float *ov = dv + (size_t)b * T * kstr + (size_t)j * kstr + (size_t)g * hd;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < hd) {
        okk[d] = adk[rr][ni];
        ov[d] = adv[rr][ni];
      }
    }
  }
}

static int att_ni(int hd) {
  if (hd < 1 || hd > RF_ATT_MAX_HD)
    RF_DIE("attention on CUDA: head_dim %d is not in [1, %d]", hd, RF_ATT_MAX_HD);
  return hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : 8;
}

static struct att_shape att_shape_of(int seq, int nh, int nkv, int hd) {
  if (nkv <= 0 || nh % nkv != 0) RF_DIE("attention on CUDA: %d heads on %d kv heads", nh, nkv);
  struct att_shape s = {seq, nh, nkv, hd, 1.0f / sqrtf((float)hd)};
  return s;
}

/* Launches KERNEL<NI> (NI from att_ni) with SMEM bytes of dynamic shared
 * memory, allowed above the default 48 KiB first. */
#define RF_ATT_CASE(N, KERNEL, GRID, SMEM, ST, ...)                                                 \
  case N:                                                                                           \
    RF_CUDA_CHECK(                                                                                  \
        cudaFuncSetAttribute(KERNEL<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(SMEM))); \
    KERNEL<N><<<GRID, RF_ATT_WARPS * 32, SMEM, ST>>>(__VA_ARGS__);                                  \
    break
#define RF_ATT_DISPATCH(NI_, KERNEL, GRID, SMEM, ST, WHAT, ...) \
  do {                                                          \
    switch (NI_) {                                              \
      RF_ATT_CASE(1, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      RF_ATT_CASE(2, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      RF_ATT_CASE(4, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      default:                                                  \
        RF_ATT_CASE(8, KERNEL, GRID, SMEM, ST, __VA_ARGS__);    \
    }                                                           \
    RF_CUDA_LAUNCHED(WHAT);                                     \
  } while (0)

static void cuda_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                   int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                   size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct att_shape s = att_shape_of(seq, nh, nkv, hd);
  int ni = att_ni(hd);
  size_t smem =
      sizeof(float) * ((size_t)RF_ATT_ROWS * hd + (size_t)RF_ATT_TILE * (hd + 1) + (size_t)RF_ATT_TILE * hd);
  dim3 grid((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nh));
  RF_ATT_DISPATCH(ni, att_forward_kernel, grid, smem, kc_stream(stream), "attention forward", y, lse, q, k, v,
                  s);
}

static void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                    const float *lse, const float *q, const float *k, const float *v,
                                    int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                    size_t scratch_bytes, struct rf_device_stream *stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct att_shape s = att_shape_of(seq, nh, nkv, hd);
  int ni = att_ni(hd);
  cudaStream_t st = kc_stream(stream);
  size_t rows = (size_t)batch * nh * seq;
  kc_need(rows * sizeof(float), scratch_bytes, "attention backward");
  float *dd = (float *)scratch;
  att_rowdot_kernel<<<(unsigned)((rows * 32 + RF_KC_THREADS - 1) / RF_KC_THREADS), RF_KC_THREADS, 0, st>>>(
      dd, dy, y, batch, s);
  RF_CUDA_LAUNCHED("attention backward");
  size_t smem_q = sizeof(float) * (2 * (size_t)RF_ATT_ROWS * hd + 2 * (size_t)RF_ATT_TILE * (hd + 1));
  dim3 grid_q((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nh));
  RF_ATT_DISPATCH(ni, att_backward_dq_kernel, grid_q, smem_q, st, "attention backward dq", dq, dy, lse, dd, q,
                  k, v, s);
  size_t smem_kv =
      sizeof(float) * (2 * (size_t)RF_ATT_ROWS * hd + 2 * (size_t)RF_ATT_TILE * (hd + 1) + 2 * RF_ATT_TILE);
  dim3 grid_kv((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nkv));
  RF_ATT_DISPATCH(ni, att_backward_dkv_kernel, grid_kv, smem_kv, st, "attention backward dk dv", dk, dv, dy,
                  lse, dd, q, k, v, s);
}

/* ---- SwiGLU ---- */

__global__ void swiglu_forward_kernel(float *h, const float *gate, const float *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = gate[i];
    h[i] = __fmul_rn(__fmul_rn(g, rf_sigmoid_dev(g)), up[i]);
  }
}

/* dup may alias dh: both read before either is written. */
__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dh, const float *gate,
                                       const float *up, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = gate[i], d = dh[i], u = up[i];
    float sg = rf_sigmoid_dev(g);
    float silu = __fmul_rn(g, sg);
    float t = __fmul_rn(__fmul_rn(d, u), sg);
    dgate[i] = __fmul_rn(t, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, sg))));
    dup[i] = __fmul_rn(d, silu);
  }
}

static void cuda_swiglu_forward(float *h, const float *gate, const float *up, size_t n,
                                struct rf_device_stream *stream) {
  if (n == 0) return;
  swiglu_forward_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, kc_stream(stream)>>>(h, gate, up, n);
  RF_CUDA_LAUNCHED("swiglu forward");
}

static void cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                 const float *up, size_t n, struct rf_device_stream *stream) {
  if (n == 0) return;
  swiglu_backward_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, kc_stream(stream)>>>(dgate, dup, dh, gate, up, n);
  RF_CUDA_LAUNCHED("swiglu backward");
}

/* ---- bias ---- */

__global__ void bias_forward_kernel(float *y, const float *b, int n, int out) {
  size_t total = (size_t)n * out;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x)
    y[e] = __fadd_rn(y[e], b[e % (size_t)out]);
}

static void cuda_bias_forward(float *y, const float *b, int n, int out, struct rf_device_stream *stream) {
  if (n <= 0 || out <= 0) return;
  bias_forward_kernel<<<kc_blocks((size_t)n * out), RF_KC_THREADS, 0, kc_stream(stream)>>>(y, b, n, out);
  RF_CUDA_LAUNCHED("bias forward");
}

static void cuda_bias_backward(float *db, const float *dy, int n, int out, void *scratch,
                               size_t scratch_bytes, struct rf_device_stream *stream) {
  colsum(db, dy, NULL, NULL, n, out, scratch, scratch_bytes, kc_stream(stream), "bias backward");
}

/* ---- cross-entropy ---- */

/* A block per row, the vocabulary in chunks of the block's threads: the
 * maximum, then the sum of exp(z - max) in f64 (as the host), lse = max +
 * log(sum); the row's loss lse - z[target] (f64) into rowloss (0 for an ignored
 * row). */
__global__ void cross_entropy_forward_kernel(double *rowloss, float *lse, const float *logits,
                                             const int32_t *targets, int vocab) {
  __shared__ float shf[32];
  __shared__ double shd[32];
  size_t row = blockIdx.x;
  const float *z = logits + row * vocab;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, z[j]);
  mx = block_max(mx, shf);
  double sum = 0.0;
  for (int j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp((double)__fsub_rn(z[j], mx));
  sum = block_sum_d(sum, shd);
  if (threadIdx.x == 0) {
    double l = (double)mx + log(sum);
    lse[row] = (float)l;
    int t = targets ? targets[row] : -1;
    rowloss[row] = t >= 0 ? l - (double)z[t] : 0.0;
  }
}

/* *loss = the sum of rowloss[0..n), in a fixed order (one block). */
__global__ void sum_rows_kernel(double *loss, const double *rowloss, int n) {
  __shared__ double shd[32];
  double acc = 0.0;
  for (int r = threadIdx.x; r < n; r += blockDim.x) acc += rowloss[r];
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) *loss = acc;
}

static void cuda_cross_entropy_forward(double *loss, float *lse, const float *logits, const int32_t *targets,
                                       int n, int vocab, void *scratch, size_t scratch_bytes,
                                       struct rf_device_stream *stream) {
  cudaStream_t st = kc_stream(stream);
  if (n <= 0) {
    RF_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(double), st));
    return;
  }
  kc_need((size_t)n * sizeof(double), scratch_bytes, "cross-entropy forward");
  double *rowloss = (double *)scratch;
  cross_entropy_forward_kernel<<<(unsigned)n, 512, 0, st>>>(rowloss, lse, logits, targets, vocab);
  RF_CUDA_LAUNCHED("cross-entropy forward");
  sum_rows_kernel<<<1, 1024, 0, st>>>(loss, rowloss, n);
  RF_CUDA_LAUNCHED("cross-entropy forward");
}

/* logits -> scale * (softmax - onehot) in place, the host's arithmetic. */
__global__ void cross_entropy_backward_kernel(float *logits, const float *lse, const int32_t *targets,
                                              int vocab, float scale) {
  size_t row = blockIdx.x; /* rows on x (up to 2^31 - 1), the vocabulary's chunks on y */
  int j = blockIdx.y * blockDim.x + threadIdx.x;
  if (j >= vocab) return;
  float *z = logits + row * vocab;
  int t = targets[row];
  if (t < 0) {
    z[j] = 0.0f;
    return;
  }
  float e = __fmul_rn(rf_expf_dev(__fsub_rn(z[j], lse[row])), scale);
  z[j] = j == t ? __fsub_rn(e, scale) : e;
}

static void cuda_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                        int vocab, float scale, struct rf_device_stream *stream) {
  if (n <= 0 || vocab <= 0) return;
  dim3 grid((unsigned)n, (unsigned)((vocab + RF_KC_THREADS - 1) / RF_KC_THREADS));
  cross_entropy_backward_kernel<<<grid, RF_KC_THREADS, 0, kc_stream(stream)>>>(logits, lse, targets, vocab,
                                                                               scale);
  RF_CUDA_LAUNCHED("cross-entropy backward");
}

/* ---- MoE router ---- */

/* A thread per row, moe.c's loops in its order (f64 sums without FMA contraction):
 * the softmax, the top k by probability (ties: the lower expert), their weights. */
__global__ void router_forward_kernel(float *probs, int32_t *top, float *topw, const float *logits, int n,
                                      int ne, int k, int renorm) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float *z = logits + (size_t)r * ne;
  float *p = probs + (size_t)r * ne;
  int32_t *tr = top + (size_t)r * k;
  float *wr = topw + (size_t)r * k;
  float mx = z[0];
  for (int e = 1; e < ne; e++) mx = z[e] > mx ? z[e] : mx;
  double sum = 0.0;
  for (int e = 0; e < ne; e++) sum = __dadd_rn(sum, exp((double)__fsub_rn(z[e], mx)));
  for (int e = 0; e < ne; e++) p[e] = (float)__ddiv_rn(exp((double)__fsub_rn(z[e], mx)), sum);
  double s = 0.0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < ne; e++) {
      int taken = 0;
      for (int i = 0; i < j; i++) taken |= tr[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    tr[j] = best;
    s = __dadd_rn(s, (double)p[best]);
  }
  for (int j = 0; j < k; j++) wr[j] = renorm ? (float)__ddiv_rn((double)p[tr[j]], s) : p[tr[j]];
}

__global__ void router_backward_kernel(float *dlogits, const float *dtopw, const float *probs,
                                       const int32_t *top, const float *topw, const float *extra, int n,
                                       int ne, int k, int renorm) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float *p = probs + (size_t)r * ne;
  const int32_t *tr = top + (size_t)r * k;
  const float *g = dtopw + (size_t)r * k, *wr = topw + (size_t)r * k;
  float *d = dlogits + (size_t)r * ne;
  double s = 0.0, dot = 0.0;
  for (int j = 0; j < k; j++) {
    s = __dadd_rn(s, (double)p[tr[j]]);
    dot = __dadd_rn(dot, __dmul_rn((double)g[j], (double)wr[j]));
  }
  for (int e = 0; e < ne; e++) d[e] = extra ? extra[e] : 0.0f;
  for (int j = 0; j < k; j++)
    d[tr[j]] = __fadd_rn(d[tr[j]], renorm ? (float)__ddiv_rn(__dsub_rn((double)g[j], dot), s) : g[j]);
  double pd = 0.0;
  for (int e = 0; e < ne; e++) pd = __dadd_rn(pd, __dmul_rn((double)p[e], (double)d[e]));
  for (int e = 0; e < ne; e++) d[e] = (float)__dmul_rn((double)p[e], __dsub_rn((double)d[e], pd));
}

static void cuda_router_forward(float *probs, int32_t *top, float *topw, const float *logits, int n,
                                int n_experts, int k, int renorm, struct rf_device_stream *stream) {
  if (n <= 0 || n_experts <= 0 || k <= 0) return;
  router_forward_kernel<<<(unsigned)((n + 127) / 128), 128, 0, kc_stream(stream)>>>(probs, top, topw, logits,
                                                                                    n, n_experts, k, renorm);
  RF_CUDA_LAUNCHED("router forward");
}

static void cuda_router_backward(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                                 const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                                 int renorm, struct rf_device_stream *stream) {
  if (n <= 0 || n_experts <= 0 || k <= 0) return;
  router_backward_kernel<<<(unsigned)((n + 127) / 128), 128, 0, kc_stream(stream)>>>(
      dlogits, dtopw, probs, top, topw, dprobs_extra, n, n_experts, k, renorm);
  RF_CUDA_LAUNCHED("router backward");
}

/* ---- scratch ---- */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The largest of: the column sums' chunks (RMSNorm over hidden, the q/k norms
 * over head_dim with a row per head, biases up to the widest linear output),
 * the attention backward's D [B, heads, T], the embedding backward's sort keys,
 * the cross-entropy's row losses. */
static size_t cuda_scratch_bytes(const struct rf_model_config *cfg, int batch, int seq) {
  int n = batch * seq;
  int hd = cfg->head_dim > 0
               ? cfg->head_dim
               : cfg->hidden_size / (cfg->num_attention_heads > 0 ? cfg->num_attention_heads : 1);
  int heads = cfg->num_attention_heads > 0 ? cfg->num_attention_heads : 1;
  int wide = cfg->hidden_size;
  if (cfg->intermediate_size > wide) wide = cfg->intermediate_size;
  if (cfg->moe.moe_intermediate_size > wide) wide = cfg->moe.moe_intermediate_size;
  if (heads * hd > wide) wide = heads * hd;
  size_t bytes = colsum_bytes(n, wide);
  bytes = max_sz(bytes, colsum_bytes(n * heads, hd));
  bytes = max_sz(bytes, sizeof(float) * (size_t)n * heads);
  bytes = max_sz(bytes, sizeof(uint64_t) * (size_t)pow2_at_least(n));
  bytes = max_sz(bytes, sizeof(double) * (size_t)n);
  return (bytes + 255) / 256 * 256;
}

extern "C" const struct rf_model_kernels rf_model_kernels_cuda = {
    "cuda",
    0,
    cuda_scratch_bytes,
    cuda_embedding_forward,
    cuda_embedding_backward,
    cuda_rmsnorm_forward,
    cuda_rmsnorm_backward,
    cuda_rope_apply,
    cuda_attention_forward,
    cuda_attention_backward,
    cuda_swiglu_forward,
    cuda_swiglu_backward,
    cuda_bias_forward,
    cuda_bias_backward,
    cuda_cross_entropy_forward,
    cuda_cross_entropy_backward,
    cuda_router_forward,
    cuda_router_backward,
};
