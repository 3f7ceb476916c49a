/* GPT-OSS's kernels on CUDA (gpt_oss_cuda.h): attention with sinks and a sliding window, the
 * clamped SwiGLU on interleaved gate and up, the experts' transposes; and the kernel table's
 * entries over them (rf_model_kernels_cuda, kernels_cuda.cu).
 *   - attention: attention_cuda.cu's f32 schedule (a block of 8 warps takes 32 query rows, 4
 *     per warp, key tiles of 32 in shared memory, one key per lane, an online softmax; the
 *     backward D = rowsum(dY Y), then dQ per query tile over its keys and dK, dV per key tile
 *     over the queries of every head of its kv group: no atomics, deterministic), with two
 *     changes: a row's running max and sum start at the sink (m = sink_h, l = exp(0) = 1),
 *     so that lse = log(sum_j exp(s_j) + exp(sink_h)) as ops.c's; and only the keys of the
 *     row's window are visited (tiles wholly outside it skipped, the rest masked). With
 *     sinks P_j = exp(s_j - lse) still sums with the sink's share to 1, so the backward's
 *     dS = P (dP - D) is the plain one; the sinks' gradient d sink_h = -sum over rows of
 *     exp(sink_h - lse) D, summed in f64 as ops.c does (a block per head: each row's dot
 *     in the host's order, the rows in a fixed tree);
 *   - the clamped SwiGLU and the transposes: ops.c's arithmetic in its order with
 *     round-to-nearest intrinsics (no FMA contraction, as gcc -std=c11), ops.c's exp
 *     polynomial: the same bits. The transposes go through 32 x 32 tiles in shared memory.
 * The table's entries take every pointer apart before the launch (a kernel never reads a
 * struct holding a device pointer: the weight's f32 or bf16 pointer is an argument). */
#include "model/gpt_oss_cuda.h"
#include "model/kernels_cuda.cuh"

#define OSS_WARPS 8
#define OSS_ROWS 32
#define OSS_RPW (OSS_ROWS / OSS_WARPS)
#define OSS_TILE 32
#define OSS_MAX_HD 256

struct oss_shape {
  int T, nh, nkv, hd, window;
  float scale;
};

/* The first key row i sees (ops.c's att_lo): i - window + 1 with a window, else 0. */
static __device__ __forceinline__ int oss_lo(int i, int window) {
  return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

/* ---- forward ---- */

template <int NI>
__global__ void __launch_bounds__(OSS_WARPS * 32)
    oss_att_forward_kernel(float *y, float *lse, const float *q, const float *k, const float *v,
                           const float *sinks, struct oss_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T;
  float *qs = sm;                 /* [ROWS][hd] */
  float *ks = qs + OSS_ROWS * hd; /* [TILE][hd + 1] */
  float *vs = ks + OSS_TILE * hp; /* [TILE][hd] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * OSS_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < OSS_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    qs[e] = i0 + r < T ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  /* the sink as a key of logit sink_h and no value: the running max starts there, its exp(0) = 1 */
  const float sink = sinks ? sinks[h] : -INFINITY;
  float m[OSS_RPW], l[OSS_RPW], acc[OSS_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < OSS_RPW; rr++) {
    m[rr] = sink;
    l[rr] = sinks ? 1.0f : 0.0f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[rr][ni] = 0.0f;
  }
  const int kend = min(T, i0 + OSS_ROWS);                      /* keys [kbeg, kend) */
  const int kbeg = oss_lo(i0, s.window) / OSS_TILE * OSS_TILE; /* the block's first row's window */
  for (int j0 = kbeg; j0 < kend; j0 += OSS_TILE) {
    __syncthreads(); /* the previous tile is consumed (and qs written, the first time) */
    for (int e = tid; e < OSS_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      int ok = j0 + c < T;
      ks[c * hp + d] = ok ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
      vs[e] = ok ? vb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < OSS_RPW; rr++) {
      const int r = warp * OSS_RPW + rr, i = i0 + r, lo = oss_lo(i, s.window);
      if (i >= T || j0 > i || j0 + OSS_TILE <= lo) continue; /* the same for the whole warp */
      const int j = j0 + lane;
      const bool in = j >= lo && j <= i;
      float sc = -INFINITY;
      if (in) {
        const float *qr = qs + r * hd, *kr = ks + lane * hp;
        float dot = 0.0f;
        for (int d = 0; d < hd; d++) dot = fmaf(qr[d], kr[d], dot);
        sc = dot * s.scale;
      }
      const float mn = fmaxf(m[rr], warp_max(sc)); /* finite: the tile holds a key of the window */
      const float p = in ? rf_expf_dev(sc - mn) : 0.0f;
      const float alpha = m[rr] == -INFINITY ? 0.0f : rf_expf_dev(m[rr] - mn);
      l[rr] = l[rr] * alpha + warp_sum(p);
      m[rr] = mn;
#pragma unroll
      for (int ni = 0; ni < NI; ni++) acc[rr][ni] *= alpha;
      const int cmin = max(0, lo - j0), cmax = min(OSS_TILE, i - j0 + 1);
      for (int c = cmin; c < cmax; c++) {
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
  for (int rr = 0; rr < OSS_RPW; rr++) {
    const int i = i0 + warp * OSS_RPW + rr;
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

/* ---- backward ---- */

/* D[b, h, i] = dY[i] . Y[i] (= sum_j P dP of the row), a warp per row. */
__global__ void oss_att_rowdot_kernel(float *dd, const float *dy, const float *y, int B, struct oss_shape s) {
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

/* dQ[i] = sum over the window of i of dS_ij K_j, dS = P (dP - D) scale, P = exp(S - lse):
 * per query tile. */
template <int NI>
__global__ void __launch_bounds__(OSS_WARPS * 32)
    oss_att_backward_dq_kernel(float *dq, const float *dy, const float *lse, const float *dd, const float *q,
                               const float *k, const float *v, struct oss_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T;
  float *qs = sm;                  /* [ROWS][hd] */
  float *dys = qs + OSS_ROWS * hd; /* [ROWS][hd] */
  float *ks = dys + OSS_ROWS * hd; /* [TILE][hd + 1] */
  float *vs = ks + OSS_TILE * hp;  /* [TILE][hd + 1] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * OSS_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *dyb = dy + (size_t)b * T * qstr + (size_t)h * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < OSS_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    int ok = i0 + r < T;
    qs[e] = ok ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
    dys[e] = ok ? dyb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  float acc[OSS_RPW][NI], lr[OSS_RPW], dr[OSS_RPW];
#pragma unroll
  for (int rr = 0; rr < OSS_RPW; rr++) {
    const int i = i0 + warp * OSS_RPW + rr;
    lr[rr] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
    dr[rr] = i < T ? dd[(size_t)bh * T + i] : 0.0f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[rr][ni] = 0.0f;
  }
  const int kend = min(T, i0 + OSS_ROWS);
  const int kbeg = oss_lo(i0, s.window) / OSS_TILE * OSS_TILE;
  for (int j0 = kbeg; j0 < kend; j0 += OSS_TILE) {
    __syncthreads();
    for (int e = tid; e < OSS_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      int ok = j0 + c < T;
      ks[c * hp + d] = ok ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
      vs[c * hp + d] = ok ? vb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < OSS_RPW; rr++) {
      const int r = warp * OSS_RPW + rr, i = i0 + r, lo = oss_lo(i, s.window);
      if (i >= T || j0 > i || j0 + OSS_TILE <= lo) continue;
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j >= lo && j <= i) {
        const float *qr = qs + r * hd, *dyr = dys + r * hd, *kr = ks + lane * hp, *vr = vs + lane * hp;
        float sqk = 0.0f, dp = 0.0f;
        for (int d = 0; d < hd; d++) {
          sqk = fmaf(qr[d], kr[d], sqk);
          dp = fmaf(dyr[d], vr[d], dp);
        }
        float p = rf_expf_dev(sqk * s.scale - lr[rr]);
        ds = p * (dp - dr[rr]) * s.scale;
      }
      const int cmin = max(0, lo - j0), cmax = min(OSS_TILE, i - j0 + 1);
      for (int c = cmin; c < cmax; c++) {
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
  for (int rr = 0; rr < OSS_RPW; rr++) {
    const int i = i0 + warp * OSS_RPW + rr;
    if (i >= T) continue;
    float *o = dq + (size_t)b * T * qstr + (size_t)i * qstr + (size_t)h * hd;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < hd) o[d] = acc[rr][ni];
    }
  }
}

/* dV[j] = sum_h sum over the queries i that see j of P_ij dY_i, dK[j] = the same of dS_ij Q_i:
 * per key tile of one kv head, over the query heads of its group and the query tiles that see
 * the key tile (from it on, up to its last key + window - 1). */
template <int NI>
__global__ void __launch_bounds__(OSS_WARPS * 32)
    oss_att_backward_dkv_kernel(float *dk, float *dv, const float *dy, const float *lse, const float *dd,
                                const float *q, const float *k, const float *v, struct oss_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, T = s.T, W = s.window;
  float *kt = sm;                  /* [ROWS][hd] this block's keys */
  float *vt = kt + OSS_ROWS * hd;  /* [ROWS][hd] */
  float *qs = vt + OSS_ROWS * hd;  /* [TILE][hd + 1] a query tile */
  float *dys = qs + OSS_TILE * hp; /* [TILE][hd + 1] */
  float *ls = dys + OSS_TILE * hp; /* [TILE] */
  float *dds = ls + OSS_TILE;      /* [TILE] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rep = s.nh / s.nkv;
  const int bg = blockIdx.y, b = bg / s.nkv, g = bg % s.nkv;
  const int j0 = blockIdx.x * OSS_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * kstr + (size_t)g * hd;
  for (int e = tid; e < OSS_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    int ok = j0 + r < T;
    kt[e] = ok ? kb[(size_t)(j0 + r) * kstr + d] : 0.0f;
    vt[e] = ok ? vb[(size_t)(j0 + r) * kstr + d] : 0.0f;
  }
  float adk[OSS_RPW][NI], adv[OSS_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < OSS_RPW; rr++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++) adk[rr][ni] = adv[rr][ni] = 0.0f;
  /* the queries that see a key of [j0, j0 + ROWS): [j0, j0 + ROWS - 1 + window) with a window */
  const long long ilast = (long long)j0 + OSS_ROWS - 1 + W;
  const int iend = W > 0 && ilast < T ? (int)ilast : T;
  for (int hh = 0; hh < rep; hh++) {
    const int h = g * rep + hh;
    const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
    const float *dyb = dy + (size_t)b * T * qstr + (size_t)h * hd;
    const size_t bh = (size_t)b * s.nh + h;
    for (int i0 = j0; i0 < iend; i0 += OSS_TILE) {
      __syncthreads();
      for (int e = tid; e < OSS_TILE * hd; e += blockDim.x) {
        int c = e / hd, d = e - c * hd;
        int ok = i0 + c < T;
        qs[c * hp + d] = ok ? qb[(size_t)(i0 + c) * qstr + d] : 0.0f;
        dys[c * hp + d] = ok ? dyb[(size_t)(i0 + c) * qstr + d] : 0.0f;
      }
      if (tid < OSS_TILE) {
        int ok = i0 + tid < T;
        ls[tid] = ok ? lse[bh * T + i0 + tid] : 0.0f;
        dds[tid] = ok ? dd[bh * T + i0 + tid] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int rr = 0; rr < OSS_RPW; rr++) {
        const int jr = warp * OSS_RPW + rr, j = j0 + jr;
        /* no query of the tile sees key j: the same for the whole warp */
        if (j >= T || i0 + OSS_TILE - 1 < j || (W > 0 && i0 > j + W - 1)) continue;
        const int i = i0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (i < T && i >= j && (W <= 0 || i - j < W)) {
          const float *qr = qs + lane * hp, *dyr = dys + lane * hp, *kr = kt + jr * hd, *vr = vt + jr * hd;
          float sqk = 0.0f, dp = 0.0f;
          for (int d = 0; d < hd; d++) {
            sqk = fmaf(qr[d], kr[d], sqk);
            dp = fmaf(dyr[d], vr[d], dp);
          }
          p = rf_expf_dev(sqk * s.scale - ls[lane]);
          ds = p * (dp - dds[lane]) * s.scale;
        }
        const int c0 = max(0, j - i0);
        int c1 = min(OSS_TILE, T - i0);
        if (W > 0) c1 = min(c1, j + W - i0);
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
  for (int rr = 0; rr < OSS_RPW; rr++) {
    const int j = j0 + warp * OSS_RPW + rr;
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

/* dsinks[h] -= sum over the rows (b, i) of exp(sink_h - lse) (dY . Y): a block per head, each
 * row's dot in f64 in the host's order (c = 0..hd-1), the rows' terms summed in f64 (a thread's
 * strided rows, then a fixed tree), rounded to f32 once as ops.c does. */
__global__ void oss_dsinks_kernel(float *dsinks, const float *dy, const float *y, const float *lse,
                                  const float *sinks, int B, struct oss_shape s) {
  __shared__ double shd[32];
  const int h = blockIdx.x;
  const size_t rows = (size_t)B * s.T, qstr = (size_t)s.nh * s.hd;
  const double sink = (double)sinks[h];
  double acc = 0.0;
  for (size_t r = threadIdx.x; r < rows; r += blockDim.x) {
    size_t b = r / (size_t)s.T, i = r - b * (size_t)s.T;
    const float *yr = y + r * qstr + (size_t)h * s.hd, *gr = dy + r * qstr + (size_t)h * s.hd;
    double dot = 0.0;
    for (int c = 0; c < s.hd; c++) dot = __dadd_rn(dot, __dmul_rn((double)yr[c], (double)gr[c]));
    double l = (double)lse[(b * s.nh + h) * (size_t)s.T + i];
    acc = __dadd_rn(acc, __dmul_rn(exp(__dsub_rn(sink, l)), dot));
  }
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) dsinks[h] = __fsub_rn(dsinks[h], (float)acc);
}

/* ---- launches ---- */

static int oss_ni(int hd) {
  if (hd < 1 || hd > OSS_MAX_HD)
    RF_DIE("attention with sinks on CUDA: head_dim %d is not in [1, %d]", hd, OSS_MAX_HD);
  return hd <= 32 ? 1 : hd <= 64 ? 2 : hd <= 128 ? 4 : 8;
}

static struct oss_shape oss_shape_of(int seq, int nh, int nkv, int hd, int window) {
  if (nkv <= 0 || nh % nkv != 0) RF_DIE("attention with sinks on CUDA: %d heads on %d kv heads", nh, nkv);
  if (window < 0) RF_DIE("attention with sinks on CUDA: sliding window %d (0: none)", window);
  struct oss_shape s = {seq, nh, nkv, hd, window, 1.0f / sqrtf((float)hd)};
  return s;
}

/* Launches KERNEL<NI> with SMEM bytes of dynamic shared memory, allowed above the default 48 KiB
 * first. */
#define OSS_CASE(N, KERNEL, GRID, SMEM, ST, ...)                                                    \
  case N:                                                                                           \
    RF_CUDA_CHECK(                                                                                  \
        cudaFuncSetAttribute(KERNEL<N>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(SMEM))); \
    KERNEL<N><<<GRID, OSS_WARPS * 32, SMEM, ST>>>(__VA_ARGS__);                                     \
    break
#define OSS_DISPATCH(NI_, KERNEL, GRID, SMEM, ST, WHAT, ...) \
  do {                                                       \
    switch (NI_) {                                           \
      OSS_CASE(1, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      OSS_CASE(2, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      OSS_CASE(4, KERNEL, GRID, SMEM, ST, __VA_ARGS__);      \
      default:                                               \
        OSS_CASE(8, KERNEL, GRID, SMEM, ST, __VA_ARGS__);    \
    }                                                        \
    RF_CUDA_LAUNCHED(WHAT);                                  \
  } while (0)

extern "C" void rf_gpt_oss_cuda_attention_forward(float *y, float *lse, const float *q, const float *k,
                                                  const float *v, const float *sinks, int window, int batch,
                                                  int seq, int nh, int nkv, int hd, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct oss_shape s = oss_shape_of(seq, nh, nkv, hd, window);
  int ni = oss_ni(hd);
  size_t smem = sizeof(float) * ((size_t)OSS_ROWS * hd + (size_t)OSS_TILE * (hd + 1) + (size_t)OSS_TILE * hd);
  dim3 grid((unsigned)((seq + OSS_ROWS - 1) / OSS_ROWS), (unsigned)(batch * nh));
  OSS_DISPATCH(ni, oss_att_forward_kernel, grid, smem, stream, "attention with sinks forward", y, lse, q, k,
               v, sinks, s);
}

extern "C" void rf_gpt_oss_cuda_attention_backward(float *dq, float *dk, float *dv, float *dsinks,
                                                   const float *dy, const float *y, const float *lse,
                                                   const float *q, const float *k, const float *v,
                                                   const float *sinks, int window, int batch, int seq, int nh,
                                                   int nkv, int hd, float *dd, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct oss_shape s = oss_shape_of(seq, nh, nkv, hd, window);
  int ni = oss_ni(hd);
  size_t rows = (size_t)batch * nh * seq;
  oss_att_rowdot_kernel<<<(unsigned)((rows * 32 + RF_KC_THREADS - 1) / RF_KC_THREADS), RF_KC_THREADS, 0,
                          stream>>>(dd, dy, y, batch, s);
  RF_CUDA_LAUNCHED("attention with sinks backward");
  size_t smem_q = sizeof(float) * (2 * (size_t)OSS_ROWS * hd + 2 * (size_t)OSS_TILE * (hd + 1));
  dim3 grid_q((unsigned)((seq + OSS_ROWS - 1) / OSS_ROWS), (unsigned)(batch * nh));
  OSS_DISPATCH(ni, oss_att_backward_dq_kernel, grid_q, smem_q, stream, "attention with sinks backward dq", dq,
               dy, lse, dd, q, k, v, s);
  size_t smem_kv =
      sizeof(float) * (2 * (size_t)OSS_ROWS * hd + 2 * (size_t)OSS_TILE * (hd + 1) + 2 * OSS_TILE);
  dim3 grid_kv((unsigned)((seq + OSS_ROWS - 1) / OSS_ROWS), (unsigned)(batch * nkv));
  OSS_DISPATCH(ni, oss_att_backward_dkv_kernel, grid_kv, smem_kv, stream,
               "attention with sinks backward dk dv", dk, dv, dy, lse, dd, q, k, v, s);
  if (!sinks || !dsinks) return;
  oss_dsinks_kernel<<<(unsigned)nh, RF_KC_THREADS, 0, stream>>>(dsinks, dy, y, lse, sinks, batch, s);
  RF_CUDA_LAUNCHED("attention with sinks backward dsinks");
}

/* ---- the clamped SwiGLU ---- */

/* g = min(gate, limit), u = clamp(up, -limit, limit) as ops.c's selects (a NaN gate becomes
 * limit there too). */
static __device__ __forceinline__ float oss_gate(float graw, float limit) {
  return graw < limit ? graw : limit;
}
static __device__ __forceinline__ float oss_up(float uraw, float limit) {
  return uraw < -limit ? -limit : uraw > limit ? limit : uraw;
}

__global__ void oss_swiglu_clamp_forward_kernel(float *h, const float *gu, size_t n, float alpha,
                                                float limit) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float g = oss_gate(gu[2 * i], limit), u = oss_up(gu[2 * i + 1], limit);
    h[i] = __fmul_rn(__fmul_rn(__fadd_rn(u, 1.0f), g), rf_sigmoid_dev(__fmul_rn(alpha, g)));
  }
}

/* d/dg [g s(alpha g)] = s + alpha g s (1 - s); a clamped input passes no gradient (the bound
 * itself does, as torch's clamp). */
__global__ void oss_swiglu_clamp_backward_kernel(float *dgu, const float *dh, const float *gu, size_t n,
                                                 float alpha, float limit) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float graw = gu[2 * i], uraw = gu[2 * i + 1];
    float g = oss_gate(graw, limit), u = oss_up(uraw, limit);
    float sg = rf_sigmoid_dev(__fmul_rn(alpha, g)), d = dh[i];
    float dsilu = __fadd_rn(sg, __fmul_rn(__fmul_rn(__fmul_rn(alpha, g), sg), __fsub_rn(1.0f, sg)));
    dgu[2 * i] = graw <= limit ? __fmul_rn(__fmul_rn(d, __fadd_rn(u, 1.0f)), dsilu) : 0.0f;
    dgu[2 * i + 1] = uraw >= -limit && uraw <= limit ? __fmul_rn(__fmul_rn(d, g), sg) : 0.0f;
  }
}

extern "C" void rf_gpt_oss_cuda_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha,
                                                     float limit, cudaStream_t stream) {
  if (n == 0) return;
  oss_swiglu_clamp_forward_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, stream>>>(h, gu, n, alpha, limit);
  RF_CUDA_LAUNCHED("clamped swiglu forward");
}

extern "C" void rf_gpt_oss_cuda_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n,
                                                      float alpha, float limit, cudaStream_t stream) {
  if (n == 0) return;
  oss_swiglu_clamp_backward_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, stream>>>(dgu, dh, gu, n, alpha, limit);
  RF_CUDA_LAUNCHED("clamped swiglu backward");
}

/* ---- transposes ---- */

#define OSS_TT 32                /* tile side */
#define OSS_TT_ROWS 8            /* a block is 32 x 8 threads: 4 rows of the tile each */
#define OSS_TILE_ROW_BLOCKS 1024 /* blocks on y at most: each goes round the tile rows past */

/* dst [cols, rows] (+)= src [rows, cols] transposed (src f32 sf, or bf16 sb widened): a block per
 * 32 x 32 tile (tile rows on y, going round past OSS_TILE_ROW_BLOCKS), read along src's rows and written
 * along dst's through shared memory (padded: no bank conflicts). */
__global__ void oss_transpose_kernel(float *dst, const float *sf, const uint16_t *sb, int rows, int cols,
                                     int add) {
  __shared__ float tile[OSS_TT][OSS_TT + 1];
  const int tx = threadIdx.x % OSS_TT, ty = threadIdx.x / OSS_TT;
  const int c0 = blockIdx.x * OSS_TT, tiles_r = (rows + OSS_TT - 1) / OSS_TT;
  for (int tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {
    const int r0 = tr * OSS_TT;
    __syncthreads(); /* the previous tile is written out */
    for (int dr = ty; dr < OSS_TT; dr += OSS_TT_ROWS) {
      int r = r0 + dr, c = c0 + tx;
      if (r < rows && c < cols) {
        size_t e = (size_t)r * cols + c;
        tile[dr][tx] = sf ? sf[e] : rf_f32_dev(sb[e]);
      }
    }
    __syncthreads();
    for (int dc = ty; dc < OSS_TT; dc += OSS_TT_ROWS) {
      int c = c0 + dc, r = r0 + tx;
      if (r < rows && c < cols) {
        float *d = dst + (size_t)c * rows + r;
        float t = tile[tx][dc];
        *d = add ? __fadd_rn(*d, t) : t;
      }
    }
  }
}

static void oss_transpose(float *dst, const float *sf, const uint16_t *sb, int rows, int cols, int add,
                          cudaStream_t stream, const char *what) {
  if (rows <= 0 || cols <= 0) return;
  int tiles_r = (rows + OSS_TT - 1) / OSS_TT;
  dim3 grid((unsigned)((cols + OSS_TT - 1) / OSS_TT),
            (unsigned)(tiles_r < OSS_TILE_ROW_BLOCKS ? tiles_r : OSS_TILE_ROW_BLOCKS));
  oss_transpose_kernel<<<grid, OSS_TT * OSS_TT_ROWS, 0, stream>>>(dst, sf, sb, rows, cols, add);
  RF_CUDA_LAUNCHED(what);
}

extern "C" void rf_gpt_oss_cuda_weight_transpose(float *dst, const float *wf, const uint16_t *wb, int rows,
                                                 int cols, cudaStream_t stream) {
  if (!wf && !wb) RF_DIE("weight transpose on CUDA: the weight is neither f32 nor bf16");
  oss_transpose(dst, wf, wf ? NULL : wb, rows, cols, 0, stream, "weight transpose");
}

extern "C" void rf_gpt_oss_cuda_transpose_add(float *dst, const float *src, int rows, int cols,
                                              cudaStream_t stream) {
  oss_transpose(dst, src, NULL, rows, cols, 1, stream, "transpose add");
}

/* ---- the kernel table's entries ---- */

extern "C" void rf_gpt_oss_cuda_entry_attention_sink_forward(float *y, float *lse, const float *q,
                                                             const float *k, const float *v,
                                                             const float *sinks, int window, int batch,
                                                             int seq, int nh, int nkv, int hd, void *scratch,
                                                             size_t scratch_bytes,
                                                             struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  rf_gpt_oss_cuda_attention_forward(y, lse, q, k, v, sinks, window, batch, seq, nh, nkv, hd,
                                    kc_stream(stream));
}

extern "C" void rf_gpt_oss_cuda_entry_attention_sink_backward(
    float *dq, float *dk, float *dv, float *dsinks, const float *dy, const float *y, const float *lse,
    const float *q, const float *k, const float *v, const float *sinks, int window, int batch, int seq,
    int nh, int nkv, int hd, void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  cudaStream_t st = kc_stream(stream);
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  kc_need(sizeof(float) * (size_t)batch * nh * seq, scratch_bytes, "attention with sinks backward");
  rf_gpt_oss_cuda_attention_backward(dq, dk, dv, dsinks, dy, y, lse, q, k, v, sinks, window, batch, seq, nh,
                                     nkv, hd, (float *)scratch, st);
}

extern "C" void rf_gpt_oss_cuda_entry_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha,
                                                           float limit, struct rf_device_stream *stream) {
  rf_gpt_oss_cuda_swiglu_clamp_forward(h, gu, n, alpha, limit, kc_stream(stream));
}

extern "C" void rf_gpt_oss_cuda_entry_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu,
                                                            size_t n, float alpha, float limit,
                                                            struct rf_device_stream *stream) {
  rf_gpt_oss_cuda_swiglu_clamp_backward(dgu, dh, gu, n, alpha, limit, kc_stream(stream));
}

extern "C" void rf_gpt_oss_cuda_entry_weight_transpose(float *dst, const struct rf_model_weight *w, int rows,
                                                       int cols, struct rf_device_stream *stream) {
  rf_gpt_oss_cuda_weight_transpose(dst, w->f32, w->bf16, rows, cols, kc_stream(stream));
}

extern "C" void rf_gpt_oss_cuda_entry_transpose_add(float *dst, const float *src, int rows, int cols,
                                                    struct rf_device_stream *stream) {
  rf_gpt_oss_cuda_transpose_add(dst, src, rows, cols, kc_stream(stream));
}
