/* Causal grouped-query attention on tensor cores: bf16 operands, f32 accumulation
 * (attention_tc.h says what it computes and how exactly). nvcuda::wmma m16n16k16
 * fragments; scripts/cuda-emu runs it on the CPU (tests/gpu/emu/include/mma.h). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <mma.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "core/core.h"
#include "model/attention_tc.h"
}

using namespace nvcuda;

#define TC_TILE 64 /* query rows of a block and keys of a tile (forward, dQ); keys of a block (dK, dV) */
#define TC_WARPS 4 /* 16 rows each */
#define TC_THREADS (TC_WARPS * 32)
#define TC_FULL 0xffffffffu

#define TC_CHECK(call)                                                            \
  do {                                                                            \
    cudaError_t rf_e_ = (call);                                                   \
    if (rf_e_ != cudaSuccess) RF_DIE("%s: %s", #call, cudaGetErrorString(rf_e_)); \
  } while (0)
#define TC_LAUNCHED(what)                                                                         \
  do {                                                                                            \
    cudaError_t rf_e_ = cudaGetLastError();                                                       \
    if (rf_e_ != cudaSuccess) RF_DIE("CUDA kernel of %s: %s", (what), cudaGetErrorString(rf_e_)); \
  } while (0)

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

struct tc_shape {
  int T, nh, nkv;
  float scale;
};

/* Row strides in shared memory, in elements: 16 bytes of padding per bf16 row and per f32
 * row keep a 16-row tile 32-byte aligned (wmma's rule) and spread rows over the banks. */
template <int HD>
struct tc_ld {
  static const int B = HD + 8;      /* a bf16 row of head_dim */
  static const int S = TC_TILE + 4; /* an f32 row of scores */
  static const int P = TC_TILE + 8; /* a bf16 row of probabilities */
  static const int O = HD + 4;      /* an f32 row of output */
};

/* Rows [r0, r0 + TC_TILE) of one head of a [rows, stride] f32 matrix (src at the head's first
 * column) rounded to bf16 into dst [TC_TILE][ld B]; rows past T are zero. */
template <int HD>
__device__ void tc_load_rows(__nv_bfloat16 *dst, const float *src, size_t stride, int r0, int T) {
  for (int e = threadIdx.x; e < TC_TILE * HD; e += TC_THREADS) {
    const int r = e / HD, d = e - r * HD;
    const float x = r0 + r < T ? src[(size_t)(r0 + r) * stride + d] : 0.0f;
    dst[r * tc_ld<HD>::B + d] = __float2bfloat16_rn(x);
  }
}

/* out[16 x TC_TILE] (f32, ld S) = a[16 x HD] b[TC_TILE x HD]^T: a warp's scores. */
template <int HD>
__device__ void tc_scores(float *out, const __nv_bfloat16 *a, const __nv_bfloat16 *b) {
  for (int n = 0; n < TC_TILE / 16; n++) {
    frag_c acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < HD / 16; kk++) {
      frag_a fa;
      frag_b_col fb;
      wmma::load_matrix_sync(fa, a + kk * 16, tc_ld<HD>::B);
      wmma::load_matrix_sync(fb, b + n * 16 * tc_ld<HD>::B + kk * 16, tc_ld<HD>::B);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, tc_ld<HD>::S, wmma::mem_row_major);
  }
}

/* acc[n] += p[16 x TC_TILE] (bf16, ld P) m[TC_TILE x HD] (bf16, ld B), n over HD / 16 column tiles. */
template <int HD>
__device__ void tc_accumulate(frag_c *acc, const __nv_bfloat16 *p, const __nv_bfloat16 *m) {
  for (int n = 0; n < HD / 16; n++)
    for (int kk = 0; kk < TC_TILE / 16; kk++) {
      frag_a fa;
      frag_b_row fb;
      wmma::load_matrix_sync(fa, p + kk * 16, tc_ld<HD>::P);
      wmma::load_matrix_sync(fb, m + kk * 16 * tc_ld<HD>::B + n * 16, tc_ld<HD>::B);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
}

/* A warp's 16 x HD accumulators, times s, into rows row0.. of a [rows, stride] f32 matrix (rows < T
 * only), through stage (16 x 16 f32, ld S). */
template <int HD>
__device__ void tc_store_rows(float *dst, size_t stride, int row0, int T, const frag_c *acc, float *stage,
                              float s) {
  const int lane = threadIdx.x & 31, r = lane >> 1, c0 = (lane & 1) * 8;
  for (int n = 0; n < HD / 16; n++) {
    wmma::store_matrix_sync(stage, acc[n], tc_ld<HD>::S, wmma::mem_row_major);
    __syncwarp();
    if (row0 + r < T)
      for (int c = 0; c < 8; c++)
        dst[(size_t)(row0 + r) * stride + n * 16 + c0 + c] = stage[r * tc_ld<HD>::S + c0 + c] * s;
    __syncwarp();
  }
}

/* ---- forward ---- */

template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    tc_forward_kernel(float *y, float *lse, const float *q, const float *k, const float *v,
                      struct tc_shape s) {
  typedef tc_ld<HD> L;
  extern __shared__ __align__(32) unsigned char tc_smem[];
  __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem; /* [TC_TILE][B] */
  __nv_bfloat16 *ks = qs + TC_TILE * L::B;
  __nv_bfloat16 *vs = ks + TC_TILE * L::B;
  float *ss = (float *)(vs + TC_TILE * L::B);                       /* per warp [16][S] */
  __nv_bfloat16 *ps = (__nv_bfloat16 *)(ss + TC_WARPS * 16 * L::S); /* per warp [16][P] */
  float *os = (float *)(ps + TC_WARPS * 16 * L::P);                 /* per warp [16][O] */
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int T = s.T, i0 = blockIdx.x * TC_TILE;
  const size_t qstr = (size_t)s.nh * HD, kstr = (size_t)s.nkv * HD;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * HD,
              *vb = v + (size_t)b * T * kstr + (size_t)g * HD;
  tc_load_rows<HD>(qs, q + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0, T);
  float *sw = ss + warp * 16 * L::S, *ow = os + warp * 16 * L::O;
  __nv_bfloat16 *pw = ps + warp * 16 * L::P;
  for (int e = lane; e < 16 * L::O; e += 32) ow[e] = 0.0f;
  /* lane (r, half): row r of the warp's 16, columns [half * 32, half * 32 + 32) of each tile */
  const int r = lane >> 1, half = lane & 1, i = i0 + warp * 16 + r;
  float m = -INFINITY, l = 0.0f;
  const int kend = min(T, i0 + TC_TILE);
  for (int j0 = 0; j0 < kend; j0 += TC_TILE) {
    __syncthreads(); /* the previous tile is consumed */
    tc_load_rows<HD>(ks, kb, kstr, j0, T);
    tc_load_rows<HD>(vs, vb, kstr, j0, T);
    __syncthreads();
    tc_scores<HD>(sw, qs + warp * 16 * L::B, ks);
    __syncwarp();
    float sc[32], tmax = -INFINITY;
    for (int c = 0; c < 32; c++) {
      const int col = half * 32 + c, j = j0 + col;
      sc[c] = i < T && j <= i ? sw[r * L::S + col] * s.scale : -INFINITY;
      tmax = fmaxf(tmax, sc[c]);
    }
    tmax = fmaxf(tmax, __shfl_xor_sync(TC_FULL, tmax, 1));
    const float mn = fmaxf(m, tmax); /* finite for i < T: key j0 <= i */
    float psum = 0.0f;
    for (int c = 0; c < 32; c++) {
      const float p = sc[c] == -INFINITY ? 0.0f : expf(sc[c] - mn);
      pw[r * L::P + half * 32 + c] = __float2bfloat16_rn(p);
      psum += p;
    }
    psum += __shfl_xor_sync(TC_FULL, psum, 1);
    const float alpha = m == -INFINITY ? 0.0f : expf(m - mn);
    l = l * alpha + psum;
    m = mn;
    for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d++) ow[r * L::O + d] *= alpha;
    __syncwarp();
    for (int n = 0; n < HD / 16; n++) { /* O += P V, the output tile through its accumulator */
      frag_c acc;
      wmma::load_matrix_sync(acc, ow + n * 16, L::O, wmma::mem_row_major);
      for (int kk = 0; kk < TC_TILE / 16; kk++) {
        frag_a fa;
        frag_b_row fb;
        wmma::load_matrix_sync(fa, pw + kk * 16, L::P);
        wmma::load_matrix_sync(fb, vs + kk * 16 * L::B + n * 16, L::B);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(ow + n * 16, acc, L::O, wmma::mem_row_major);
    }
    __syncwarp();
  }
  if (i < T) {
    const float inv = 1.0f / l;
    float *yr = y + (size_t)b * T * qstr + (size_t)i * qstr + (size_t)h * HD;
    for (int d = half * (HD / 2); d < (half + 1) * (HD / 2); d++) yr[d] = ow[r * L::O + d] * inv;
    if (half == 0) lse[(size_t)bh * T + i] = m + logf(l);
  }
}

/* ---- backward ---- */

/* dd[b, h, i] = dY[i] . Y[i] over the head's columns, a warp per row: dY rounded to bf16 as the
 * kernels below round it for dP = dY V^T, so that dP - D cancels as it does in exact arithmetic
 * (D = sum_j P dP) and a row's dS sums to zero but for f32 roundoff. */
__global__ void tc_rowdot_kernel(float *dd, const float *dy, const float *y, int rows, int nh, int T,
                                 int hd) {
  const long w = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= rows) return;
  const int i = (int)(w % T), bh = (int)(w / T), b = bh / nh, h = bh % nh;
  const size_t at = ((size_t)b * T + i) * ((size_t)nh * hd) + (size_t)h * hd;
  float acc = 0.0f;
  for (int d = lane; d < hd; d += 32)
    acc = fmaf(__bfloat162float(__float2bfloat16_rn(dy[at + d])), y[at + d], acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(TC_FULL, acc, o);
  if (lane == 0) dd[w] = acc;
}

/* dQ of 64 query rows of one head: over the key tiles up to the diagonal, dS = P (dP - D) with
 * P = exp(S scale - lse) and dP = dY V^T, dQ = scale dS K. */
template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    tc_backward_dq_kernel(float *dq, const float *dy, const float *lse, const float *dd, const float *q,
                          const float *k, const float *v, struct tc_shape s) {
  typedef tc_ld<HD> L;
  extern __shared__ __align__(32) unsigned char tc_smem[];
  __nv_bfloat16 *qs = (__nv_bfloat16 *)tc_smem, *dys = qs + TC_TILE * L::B, *ks = dys + TC_TILE * L::B,
                *vs = ks + TC_TILE * L::B;
  float *ss = (float *)(vs + TC_TILE * L::B), *dps = ss + TC_WARPS * 16 * L::S;
  __nv_bfloat16 *dss = (__nv_bfloat16 *)(dps + TC_WARPS * 16 * L::S);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int T = s.T, i0 = blockIdx.x * TC_TILE;
  const size_t qstr = (size_t)s.nh * HD, kstr = (size_t)s.nkv * HD;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * HD,
              *vb = v + (size_t)b * T * kstr + (size_t)g * HD;
  tc_load_rows<HD>(qs, q + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0, T);
  tc_load_rows<HD>(dys, dy + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0, T);
  float *sw = ss + warp * 16 * L::S, *dpw = dps + warp * 16 * L::S;
  __nv_bfloat16 *dsw = dss + warp * 16 * L::P;
  const int r = lane >> 1, half = lane & 1, i = i0 + warp * 16 + r;
  const float lse_i = i < T ? lse[(size_t)bh * T + i] : 0.0f, d_i = i < T ? dd[(size_t)bh * T + i] : 0.0f;
  frag_c acc[HD / 16];
  for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(acc[n], 0.0f);
  const int kend = min(T, i0 + TC_TILE);
  for (int j0 = 0; j0 < kend; j0 += TC_TILE) {
    __syncthreads();
    tc_load_rows<HD>(ks, kb, kstr, j0, T);
    tc_load_rows<HD>(vs, vb, kstr, j0, T);
    __syncthreads();
    tc_scores<HD>(sw, qs + warp * 16 * L::B, ks);
    tc_scores<HD>(dpw, dys + warp * 16 * L::B, vs);
    __syncwarp();
    for (int c = 0; c < 32; c++) {
      const int col = half * 32 + c, j = j0 + col;
      const float p = i < T && j <= i ? expf(sw[r * L::S + col] * s.scale - lse_i) : 0.0f;
      dsw[r * L::P + col] = __float2bfloat16_rn(p * (dpw[r * L::S + col] - d_i));
    }
    __syncwarp();
    tc_accumulate<HD>(acc, dsw, ks);
  }
  tc_store_rows<HD>(dq + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0 + warp * 16, T, acc, sw, s.scale);
}

/* dK, dV of 64 keys of one kv head: over every head of its group and the query tiles from the
 * diagonal on, P^T and dS^T of the warp's 16 keys, dV = P^T dY, dK = scale dS^T Q. */
template <int HD>
__global__ void __launch_bounds__(TC_THREADS)
    tc_backward_dkv_kernel(float *dk, float *dv, const float *dy, const float *lse, const float *dd,
                           const float *q, const float *k, const float *v, struct tc_shape s) {
  typedef tc_ld<HD> L;
  extern __shared__ __align__(32) unsigned char tc_smem[];
  __nv_bfloat16 *ks = (__nv_bfloat16 *)tc_smem, *vs = ks + TC_TILE * L::B, *qs = vs + TC_TILE * L::B,
                *dys = qs + TC_TILE * L::B;
  float *sts = (float *)(dys + TC_TILE * L::B), *dpts = sts + TC_WARPS * 16 * L::S;
  __nv_bfloat16 *pts = (__nv_bfloat16 *)(dpts + TC_WARPS * 16 * L::S), *dsts = pts + TC_WARPS * 16 * L::P;
  float *lse_s = (float *)(dsts + TC_WARPS * 16 * L::P), *dd_s = lse_s + TC_TILE;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int bg = blockIdx.y, b = bg / s.nkv, g = bg % s.nkv, group = s.nh / s.nkv;
  const int T = s.T, j0 = blockIdx.x * TC_TILE;
  const size_t qstr = (size_t)s.nh * HD, kstr = (size_t)s.nkv * HD;
  tc_load_rows<HD>(ks, k + (size_t)b * T * kstr + (size_t)g * HD, kstr, j0, T);
  tc_load_rows<HD>(vs, v + (size_t)b * T * kstr + (size_t)g * HD, kstr, j0, T);
  float *stw = sts + warp * 16 * L::S, *dptw = dpts + warp * 16 * L::S;
  __nv_bfloat16 *ptw = pts + warp * 16 * L::P, *dstw = dsts + warp * 16 * L::P;
  const int r = lane >> 1, half = lane & 1, j = j0 + warp * 16 + r;
  frag_c dka[HD / 16], dva[HD / 16];
  for (int n = 0; n < HD / 16; n++) {
    wmma::fill_fragment(dka[n], 0.0f);
    wmma::fill_fragment(dva[n], 0.0f);
  }
  for (int hh = 0; hh < group; hh++) {
    const int h = g * group + hh, bh = b * s.nh + h;
    for (int i0 = j0; i0 < T; i0 += TC_TILE) { /* queries at or after the block's first key */
      __syncthreads();
      tc_load_rows<HD>(qs, q + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0, T);
      tc_load_rows<HD>(dys, dy + (size_t)b * T * qstr + (size_t)h * HD, qstr, i0, T);
      for (int e = threadIdx.x; e < TC_TILE; e += TC_THREADS) {
        lse_s[e] = i0 + e < T ? lse[(size_t)bh * T + i0 + e] : 0.0f;
        dd_s[e] = i0 + e < T ? dd[(size_t)bh * T + i0 + e] : 0.0f;
      }
      __syncthreads();
      tc_scores<HD>(stw, ks + warp * 16 * L::B, qs);   /* S^T: the warp's keys x the tile's queries */
      tc_scores<HD>(dptw, vs + warp * 16 * L::B, dys); /* dP^T */
      __syncwarp();
      for (int c = 0; c < 32; c++) {
        const int col = half * 32 + c, i = i0 + col;
        const float p = i < T && j < T && i >= j ? expf(stw[r * L::S + col] * s.scale - lse_s[col]) : 0.0f;
        ptw[r * L::P + col] = __float2bfloat16_rn(p);
        dstw[r * L::P + col] = __float2bfloat16_rn(p * (dptw[r * L::S + col] - dd_s[col]));
      }
      __syncwarp();
      tc_accumulate<HD>(dva, ptw, dys);
      tc_accumulate<HD>(dka, dstw, qs);
    }
  }
  tc_store_rows<HD>(dk + (size_t)b * T * kstr + (size_t)g * HD, kstr, j0 + warp * 16, T, dka, stw, s.scale);
  tc_store_rows<HD>(dv + (size_t)b * T * kstr + (size_t)g * HD, kstr, j0 + warp * 16, T, dva, stw, 1.0f);
}

/* ---- launchers ---- */

template <int HD>
static size_t tc_smem_forward(void) {
  typedef tc_ld<HD> L;
  return 3 * TC_TILE * L::B * 2 + TC_WARPS * 16 * (L::S * 4 + L::P * 2 + L::O * 4);
}
template <int HD>
static size_t tc_smem_dq(void) {
  typedef tc_ld<HD> L;
  return 4 * TC_TILE * L::B * 2 + TC_WARPS * 16 * (2 * L::S * 4 + L::P * 2);
}
template <int HD>
static size_t tc_smem_dkv(void) {
  typedef tc_ld<HD> L;
  return 4 * TC_TILE * L::B * 2 + TC_WARPS * 16 * (2 * L::S * 4 + 2 * L::P * 2) + 2 * TC_TILE * 4;
}

static struct tc_shape tc_shape_of(int seq, int nh, int nkv, int hd) {
  if (!rf_attention_tc_supports(hd))
    RF_DIE("attention on tensor cores: head_dim %d is not 32, 64 or 128", hd);
  if (nkv <= 0 || nh % nkv != 0) RF_DIE("attention on tensor cores: %d heads on %d kv heads", nh, nkv);
  struct tc_shape s = {seq, nh, nkv, 1.0f / sqrtf((float)hd)};
  return s;
}

int rf_attention_tc_supports(int hd) { return hd == 32 || hd == 64 || hd == 128; }

/* Launches KERNEL<HD> for the head_dim's instance, its shared memory allowed first. */
#define TC_CASE(HD_, KERNEL, SMEM, GRID, ST, ...)                                                         \
  case HD_: {                                                                                             \
    size_t smem_ = SMEM<HD_>();                                                                           \
    TC_CHECK(cudaFuncSetAttribute(KERNEL<HD_>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_)); \
    KERNEL<HD_><<<GRID, TC_THREADS, smem_, ST>>>(__VA_ARGS__);                                            \
    break;                                                                                                \
  }
#define TC_DISPATCH(HD, KERNEL, SMEM, GRID, ST, WHAT, ...)           \
  do {                                                               \
    switch (HD) {                                                    \
      TC_CASE(32, KERNEL, SMEM, GRID, ST, __VA_ARGS__)               \
      TC_CASE(64, KERNEL, SMEM, GRID, ST, __VA_ARGS__)               \
      TC_CASE(128, KERNEL, SMEM, GRID, ST, __VA_ARGS__)              \
      default:                                                       \
        RF_DIE("attention on tensor cores: head_dim %d", (int)(HD)); \
    }                                                                \
    TC_LAUNCHED(WHAT);                                               \
  } while (0)

void rf_attention_tc_forward(float *y, float *lse, const float *q, const float *k, const float *v, int batch,
                             int seq, int nh, int nkv, int hd, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct tc_shape s = tc_shape_of(seq, nh, nkv, hd);
  dim3 grid((unsigned)((seq + TC_TILE - 1) / TC_TILE), (unsigned)(batch * nh));
  TC_DISPATCH(hd, tc_forward_kernel, tc_smem_forward, grid, stream, "attention forward (tensor cores)", y,
              lse, q, k, v, s);
}

void rf_attention_tc_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                              const float *lse, const float *q, const float *k, const float *v, int batch,
                              int seq, int nh, int nkv, int hd, float *dd, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct tc_shape s = tc_shape_of(seq, nh, nkv, hd);
  const long rows = (long)batch * nh * seq;
  tc_rowdot_kernel<<<(unsigned)((rows * 32 + 255) / 256), 256, 0, stream>>>(dd, dy, y, (int)rows, nh, seq,
                                                                            hd);
  TC_LAUNCHED("attention backward D (tensor cores)");
  dim3 grid_q((unsigned)((seq + TC_TILE - 1) / TC_TILE), (unsigned)(batch * nh));
  TC_DISPATCH(hd, tc_backward_dq_kernel, tc_smem_dq, grid_q, stream, "attention backward dq (tensor cores)",
              dq, dy, lse, dd, q, k, v, s);
  dim3 grid_kv((unsigned)((seq + TC_TILE - 1) / TC_TILE), (unsigned)(batch * nkv));
  TC_DISPATCH(hd, tc_backward_dkv_kernel, tc_smem_dkv, grid_kv, stream,
              "attention backward dk dv (tensor cores)", dk, dv, dy, lse, dd, q, k, v, s);
}
