/* The f32 attention of the CUDA kernel table (kernels_cuda.cu, which holds the rest), with
 * GPT-OSS's sinks and sliding window (NULL and 0: the plain causal attention, the table's
 * attention_forward, _backward; gpt_oss_cuda.cu's attention_sink_* entries pass them on) and
 * DeepSeek-V3's shape (mla_cuda.cu's mla_attention_* entries): v's head dim dv apart from q's
 * and k's hd, and the scores' scale given (the plain attention: dv = hd, 1/sqrt(hd)):
 * flash-style, O(T) memory: per query row an online softmax over key tiles of 32 (the
 * running max and sum rescaled), the row's log-sum-exp written for the backward; the
 * backward recomputes P = exp(S - lse) tile by tile in two kernels, dQ (per query tile,
 * over its keys) and dK, dV (per key tile, over the queries and the heads of its kv
 * group: GQA summed in the block, no atomics), after D = rowsum(dY * Y). Deterministic;
 * within f32 roundoff of the host (tests/gpu/test_kernels_cuda.c, test_gpt_oss_cuda.c,
 * test_mla_cuda.c). Any head dims up to 256 (32-lane slices, masked).
 *   - sinks: a row's running max and sum start at its head's sink (m = sink_h, l = exp(0)
 *     = 1), so that lse = log(sum_j exp(s_j) + exp(sink_h)) as ops.c's. P_j = exp(s_j -
 *     lse) still sums with the sink's share to 1, so the backward's dS = P (dP - D) is the
 *     plain one; the sinks' gradient d sink_h = -sum over rows of exp(sink_h - lse) D,
 *     summed in f64 as ops.c does (a block per head: each row's dot in the host's order,
 *     the rows in a fixed tree);
 *   - a window: only the keys of the row's window are visited (tiles wholly outside it
 *     skipped, the rest masked). */
#include "model/kernels_cuda.cuh"

/* A block of RF_ATT_WARPS warps takes RF_ATT_ROWS query rows (the forward, dQ)
 * or keys (dK, dV), RF_ATT_RPW per warp; the other side goes in tiles of 32,
 * one per lane. A lane keeps the output dimensions lane + 32 i (i < NI, NI =
 * ceil(max(hd, dv) / 32) rounded up to 1, 2, 4 or 8). Shared rows read with the
 * lane as the row index are padded to hd + 1 (dv + 1) floats (no bank conflicts). */
#define RF_ATT_WARPS 8
#define RF_ATT_ROWS 32
#define RF_ATT_RPW (RF_ATT_ROWS / RF_ATT_WARPS)
#define RF_ATT_TILE 32
#define RF_ATT_MAX_HD 256

struct att_shape {
  int T, nh, nkv, hd, dv, window; /* hd: q's and k's head dim; dv: v's, y's and dY's */
  float scale;
};

/* The first key row i sees (ops.c's att_lo): i - window + 1 with a window, else 0. */
static __device__ __forceinline__ int att_lo(int i, int window) {
  return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
}

/* ---- forward ---- */

template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_forward_kernel(float *y, float *lse, const float *q, const float *k, const float *v,
                       const float *sinks, struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, dv = s.dv, T = s.T;
  float *qs = sm;                    /* [ROWS][hd] */
  float *ks = qs + RF_ATT_ROWS * hd; /* [TILE][hd + 1] */
  float *vs = ks + RF_ATT_TILE * hp; /* [TILE][dv] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const size_t vstr = (size_t)s.nkv * dv, ystr = (size_t)s.nh * dv;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * vstr + (size_t)g * dv;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    qs[e] = i0 + r < T ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  /* the sink as a key of logit sink_h and no value: the running max starts there, its exp(0) = 1 */
  const float sink = sinks ? sinks[h] : -INFINITY;
  float m[RF_ATT_RPW], l[RF_ATT_RPW], acc[RF_ATT_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    m[rr] = sink;
    l[rr] = sinks ? 1.0f : 0.0f;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) acc[rr][ni] = 0.0f;
  }
  const int kend = min(T, i0 + RF_ATT_ROWS);                         /* keys [kbeg, kend) */
  const int kbeg = att_lo(i0, s.window) / RF_ATT_TILE * RF_ATT_TILE; /* the block's first row's window */
  for (int j0 = kbeg; j0 < kend; j0 += RF_ATT_TILE) {
    __syncthreads(); /* the previous tile is consumed (and qs written, the first time) */
    for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      ks[c * hp + d] = j0 + c < T ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    for (int e = tid; e < RF_ATT_TILE * dv; e += blockDim.x) {
      int c = e / dv, d = e - c * dv;
      vs[e] = j0 + c < T ? vb[(size_t)(j0 + c) * vstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RF_ATT_RPW; rr++) {
      const int r = warp * RF_ATT_RPW + rr, i = i0 + r, lo = att_lo(i, s.window);
      if (i >= T || j0 > i || j0 + RF_ATT_TILE <= lo) continue; /* the same for the whole warp */
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
      const int cmin = max(0, lo - j0), cmax = min(RF_ATT_TILE, i - j0 + 1);
      for (int c = cmin; c < cmax; c++) {
        const float pc = __shfl_sync(RF_FULL_MASK, p, c);
        const float *vr = vs + c * dv;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          int d = lane + 32 * ni;
          if (d < dv) acc[rr][ni] = fmaf(pc, vr[d], acc[rr][ni]);
        }
      }
    }
  }
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++) {
    const int i = i0 + warp * RF_ATT_RPW + rr;
    if (i >= T) continue;
    const float inv = 1.0f / l[rr];
    float *yr = y + (size_t)b * T * ystr + (size_t)i * ystr + (size_t)h * dv;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < dv) yr[d] = acc[rr][ni] * inv;
    }
    if (lane == 0) lse[(size_t)bh * T + i] = m[rr] + logf(l[rr]);
  }
}

/* ---- backward ---- */

/* D[b, h, i] = dY[i] . Y[i] (= sum_j P dP of the row), a warp per row. */
__global__ void att_rowdot_kernel(float *dd, const float *dy, const float *y, int B, struct att_shape s) {
  const int lane = threadIdx.x & 31;
  const size_t rows = (size_t)B * s.nh * s.T;
  size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  size_t bh = row / s.T, i = row - bh * s.T, b = bh / s.nh, h = bh - b * s.nh;
  size_t off = (b * s.T + i) * (size_t)s.nh * s.dv + h * s.dv;
  float acc = 0.0f;
  for (int d = lane; d < s.dv; d += 32) acc = fmaf(dy[off + d], y[off + d], acc);
  acc = warp_sum(acc);
  if (lane == 0) dd[row] = acc;
}

/* dQ[i] = sum over the window of i of dS_ij K_j, dS = P (dP - D) scale, P = exp(S - lse):
 * per query tile. */
template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_backward_dq_kernel(float *dq, const float *dy, const float *lse, const float *dd, const float *q,
                           const float *k, const float *v, struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, dv = s.dv, vp = dv + 1, T = s.T;
  float *qs = sm;                     /* [ROWS][hd] */
  float *dys = qs + RF_ATT_ROWS * hd; /* [ROWS][dv] */
  float *ks = dys + RF_ATT_ROWS * dv; /* [TILE][hd + 1] */
  float *vs = ks + RF_ATT_TILE * hp;  /* [TILE][dv + 1] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int bh = blockIdx.y, b = bh / s.nh, h = bh % s.nh, g = h / (s.nh / s.nkv);
  const int i0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const size_t vstr = (size_t)s.nkv * dv, ystr = (size_t)s.nh * dv;
  const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
  const float *dyb = dy + (size_t)b * T * ystr + (size_t)h * dv;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * vstr + (size_t)g * dv;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    qs[e] = i0 + r < T ? qb[(size_t)(i0 + r) * qstr + d] : 0.0f;
  }
  for (int e = tid; e < RF_ATT_ROWS * dv; e += blockDim.x) {
    int r = e / dv, d = e - r * dv;
    dys[e] = i0 + r < T ? dyb[(size_t)(i0 + r) * ystr + d] : 0.0f;
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
  const int kbeg = att_lo(i0, s.window) / RF_ATT_TILE * RF_ATT_TILE;
  for (int j0 = kbeg; j0 < kend; j0 += RF_ATT_TILE) {
    __syncthreads();
    for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
      int c = e / hd, d = e - c * hd;
      ks[c * hp + d] = j0 + c < T ? kb[(size_t)(j0 + c) * kstr + d] : 0.0f;
    }
    for (int e = tid; e < RF_ATT_TILE * dv; e += blockDim.x) {
      int c = e / dv, d = e - c * dv;
      vs[c * vp + d] = j0 + c < T ? vb[(size_t)(j0 + c) * vstr + d] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < RF_ATT_RPW; rr++) {
      const int r = warp * RF_ATT_RPW + rr, i = i0 + r, lo = att_lo(i, s.window);
      if (i >= T || j0 > i || j0 + RF_ATT_TILE <= lo) continue;
      const int j = j0 + lane;
      float ds = 0.0f;
      if (j >= lo && j <= i) {
        const float *qr = qs + r * hd, *dyr = dys + r * dv, *kr = ks + lane * hp, *vr = vs + lane * vp;
        float sqk = 0.0f, dp = 0.0f;
        for (int d = 0; d < hd; d++) sqk = fmaf(qr[d], kr[d], sqk);
        for (int d = 0; d < dv; d++) dp = fmaf(dyr[d], vr[d], dp);
        float p = rf_expf_dev(sqk * s.scale - lr[rr]);
        ds = p * (dp - dr[rr]) * s.scale;
      }
      const int cmin = max(0, lo - j0), cmax = min(RF_ATT_TILE, i - j0 + 1);
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

/* dV[j] = sum_h sum over the queries i that see j of P_ij dY_i, dK[j] = the same of dS_ij Q_i:
 * per key tile of one kv head, over the query heads of its group and the query tiles that see
 * the key tile (from it on, up to its last key + window - 1). */
template <int NI>
__global__ void __launch_bounds__(RF_ATT_WARPS * 32)
    att_backward_dkv_kernel(float *dk, float *dvo, const float *dy, const float *lse, const float *dd,
                            const float *q, const float *k, const float *v, struct att_shape s) {
  extern __shared__ float sm[];
  const int hd = s.hd, hp = hd + 1, dv = s.dv, vp = dv + 1, T = s.T, W = s.window;
  float *kt = sm;                     /* [ROWS][hd] this block's keys */
  float *vt = kt + RF_ATT_ROWS * hd;  /* [ROWS][dv] */
  float *qs = vt + RF_ATT_ROWS * dv;  /* [TILE][hd + 1] a query tile */
  float *dys = qs + RF_ATT_TILE * hp; /* [TILE][dv + 1] */
  float *ls = dys + RF_ATT_TILE * vp; /* [TILE] */
  float *dds = ls + RF_ATT_TILE;      /* [TILE] */
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rep = s.nh / s.nkv;
  const int bg = blockIdx.y, b = bg / s.nkv, g = bg % s.nkv;
  const int j0 = blockIdx.x * RF_ATT_ROWS;
  const size_t qstr = (size_t)s.nh * hd, kstr = (size_t)s.nkv * hd;
  const size_t vstr = (size_t)s.nkv * dv, ystr = (size_t)s.nh * dv;
  const float *kb = k + (size_t)b * T * kstr + (size_t)g * hd;
  const float *vb = v + (size_t)b * T * vstr + (size_t)g * dv;
  for (int e = tid; e < RF_ATT_ROWS * hd; e += blockDim.x) {
    int r = e / hd, d = e - r * hd;
    kt[e] = j0 + r < T ? kb[(size_t)(j0 + r) * kstr + d] : 0.0f;
  }
  for (int e = tid; e < RF_ATT_ROWS * dv; e += blockDim.x) {
    int r = e / dv, d = e - r * dv;
    vt[e] = j0 + r < T ? vb[(size_t)(j0 + r) * vstr + d] : 0.0f;
  }
  float adk[RF_ATT_RPW][NI], adv[RF_ATT_RPW][NI];
#pragma unroll
  for (int rr = 0; rr < RF_ATT_RPW; rr++)
#pragma unroll
    for (int ni = 0; ni < NI; ni++) adk[rr][ni] = adv[rr][ni] = 0.0f;
  /* the queries that see a key of [j0, j0 + ROWS): [j0, j0 + ROWS - 1 + window) with a window */
  const long long ilast = (long long)j0 + RF_ATT_ROWS - 1 + W;
  const int iend = W > 0 && ilast < T ? (int)ilast : T;
  for (int hh = 0; hh < rep; hh++) {
    const int h = g * rep + hh;
    const float *qb = q + (size_t)b * T * qstr + (size_t)h * hd;
    const float *dyb = dy + (size_t)b * T * ystr + (size_t)h * dv;
    const size_t bh = (size_t)b * s.nh + h;
    for (int i0 = j0; i0 < iend; i0 += RF_ATT_TILE) {
      __syncthreads();
      for (int e = tid; e < RF_ATT_TILE * hd; e += blockDim.x) {
        int c = e / hd, d = e - c * hd;
        qs[c * hp + d] = i0 + c < T ? qb[(size_t)(i0 + c) * qstr + d] : 0.0f;
      }
      for (int e = tid; e < RF_ATT_TILE * dv; e += blockDim.x) {
        int c = e / dv, d = e - c * dv;
        dys[c * vp + d] = i0 + c < T ? dyb[(size_t)(i0 + c) * ystr + d] : 0.0f;
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
        /* no query of the tile sees key j: the same for the whole warp */
        if (j >= T || i0 + RF_ATT_TILE - 1 < j || (W > 0 && i0 > j + W - 1)) continue;
        const int i = i0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (i < T && i >= j && (W <= 0 || i - j < W)) {
          const float *qr = qs + lane * hp, *dyr = dys + lane * vp, *kr = kt + jr * hd, *vr = vt + jr * dv;
          float sqk = 0.0f, dp = 0.0f;
          for (int d = 0; d < hd; d++) sqk = fmaf(qr[d], kr[d], sqk);
          for (int d = 0; d < dv; d++) dp = fmaf(dyr[d], vr[d], dp);
          p = rf_expf_dev(sqk * s.scale - ls[lane]);
          ds = p * (dp - dds[lane]) * s.scale;
        }
        const int c0 = max(0, j - i0);
        int c1 = min(RF_ATT_TILE, T - i0);
        if (W > 0) c1 = min(c1, j + W - i0);
        for (int c = c0; c < c1; c++) {
          const float pc = __shfl_sync(RF_FULL_MASK, p, c), dsc = __shfl_sync(RF_FULL_MASK, ds, c);
          const float *qr = qs + c * hp, *dyr = dys + c * vp;
#pragma unroll
          for (int ni = 0; ni < NI; ni++) {
            int d = lane + 32 * ni;
            if (d < dv) adv[rr][ni] = fmaf(pc, dyr[d], adv[rr][ni]);
            if (d < hd) adk[rr][ni] = fmaf(dsc, qr[d], adk[rr][ni]);
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
    float *ov = dvo + (size_t)b * T * vstr + (size_t)j * vstr + (size_t)g * dv;
#pragma unroll
    for (int ni = 0; ni < NI; ni++) {
      int d = lane + 32 * ni;
      if (d < hd) okk[d] = adk[rr][ni];
      if (d < dv) ov[d] = adv[rr][ni];
    }
  }
}

/* dsinks[h] -= sum over the rows (b, i) of exp(sink_h - lse) (dY . Y): a block per head, each
 * row's dot in f64 in the host's order (c = 0..dv-1), the rows' terms summed in f64 (a thread's
 * strided rows, then a fixed tree), rounded to f32 once as ops.c does. */
__global__ void att_dsinks_kernel(float *dsinks, const float *dy, const float *y, const float *lse,
                                  const float *sinks, int B, struct att_shape s) {
  __shared__ double shd[32];
  const int h = blockIdx.x;
  const size_t rows = (size_t)B * s.T, ystr = (size_t)s.nh * s.dv;
  const double sink = (double)sinks[h];
  double acc = 0.0;
  for (size_t r = threadIdx.x; r < rows; r += blockDim.x) {
    size_t b = r / (size_t)s.T, i = r - b * (size_t)s.T;
    const float *yr = y + r * ystr + (size_t)h * s.dv, *gr = dy + r * ystr + (size_t)h * s.dv;
    double dot = 0.0;
    for (int c = 0; c < s.dv; c++) dot = __dadd_rn(dot, __dmul_rn((double)yr[c], (double)gr[c]));
    double l = (double)lse[(b * s.nh + h) * (size_t)s.T + i];
    acc = __dadd_rn(acc, __dmul_rn(exp(__dsub_rn(sink, l)), dot));
  }
  acc = block_sum_d(acc, shd);
  if (threadIdx.x == 0) dsinks[h] = __fsub_rn(dsinks[h], (float)acc);
}

/* ---- launches ---- */

/* NI for head dims hd (q, k) and dv (v, y): the wider one's 32-lane slices. */
static int att_ni(int hd, int dv) {
  if (hd < 1 || hd > RF_ATT_MAX_HD || dv < 1 || dv > RF_ATT_MAX_HD)
    RF_DIE("attention on CUDA: head dims %d (q, k) and %d (v) are not in [1, %d]", hd, dv, RF_ATT_MAX_HD);
  int w = hd > dv ? hd : dv;
  return w <= 32 ? 1 : w <= 64 ? 2 : w <= 128 ? 4 : 8;
}

static struct att_shape att_shape_of(int seq, int nh, int nkv, int hd, int dv, int window, float scale) {
  if (nkv <= 0 || nh % nkv != 0) RF_DIE("attention on CUDA: %d heads on %d kv heads", nh, nkv);
  if (window < 0) RF_DIE("attention on CUDA: sliding window %d (0: none)", window);
  struct att_shape s = {seq, nh, nkv, hd, dv, window, scale};
  return s;
}

/* Launches KERNEL<NI> with SMEM bytes of dynamic shared memory, allowed above the default 48 KiB
 * first. */
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

void cuda_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                 const float *sinks, int window, int batch, int seq, int nh, int nkv, int hd,
                                 int dv, float scale, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct att_shape s = att_shape_of(seq, nh, nkv, hd, dv, window, scale);
  int ni = att_ni(hd, dv);
  size_t smem =
      sizeof(float) * ((size_t)RF_ATT_ROWS * hd + (size_t)RF_ATT_TILE * (hd + 1) + (size_t)RF_ATT_TILE * dv);
  dim3 grid((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nh));
  RF_ATT_DISPATCH(ni, att_forward_kernel, grid, smem, stream, "attention forward", y, lse, q, k, v, sinks, s);
}

void cuda_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                  const float *y, const float *lse, const float *q, const float *k,
                                  const float *v, const float *sinks, int window, int batch, int seq, int nh,
                                  int nkv, int hd, int vd, float scale, float *dd, cudaStream_t stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  struct att_shape s = att_shape_of(seq, nh, nkv, hd, vd, window, scale);
  int ni = att_ni(hd, vd);
  size_t rows = (size_t)batch * nh * seq;
  att_rowdot_kernel<<<(unsigned)((rows * 32 + RF_KC_THREADS - 1) / RF_KC_THREADS), RF_KC_THREADS, 0,
                      stream>>>(dd, dy, y, batch, s);
  RF_CUDA_LAUNCHED("attention backward");
  /* q and dY rows, then key and value tiles padded by one float */
  size_t two = (size_t)RF_ATT_ROWS * (hd + vd) + (size_t)RF_ATT_TILE * (hd + 1 + vd + 1);
  size_t smem_q = sizeof(float) * two;
  dim3 grid_q((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nh));
  RF_ATT_DISPATCH(ni, att_backward_dq_kernel, grid_q, smem_q, stream, "attention backward dq", dq, dy, lse,
                  dd, q, k, v, s);
  size_t smem_kv = sizeof(float) * (two + 2 * RF_ATT_TILE);
  dim3 grid_kv((unsigned)((seq + RF_ATT_ROWS - 1) / RF_ATT_ROWS), (unsigned)(batch * nkv));
  RF_ATT_DISPATCH(ni, att_backward_dkv_kernel, grid_kv, smem_kv, stream, "attention backward dk dv", dk, dv,
                  dy, lse, dd, q, k, v, s);
  if (!sinks || !dsinks) return;
  att_dsinks_kernel<<<(unsigned)nh, RF_KC_THREADS, 0, stream>>>(dsinks, dy, y, lse, sinks, batch, s);
  RF_CUDA_LAUNCHED("attention backward dsinks");
}

void cuda_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v, int batch,
                            int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                            struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  cuda_attention_sink_forward(y, lse, q, k, v, NULL, 0, batch, seq, nh, nkv, hd, hd, 1.0f / sqrtf((float)hd),
                              kc_stream(stream));
}

void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                             const float *lse, const float *q, const float *k, const float *v, int batch,
                             int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                             struct rf_device_stream *stream) {
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  cudaStream_t st = kc_stream(stream);
  kc_need(sizeof(float) * (size_t)batch * nh * seq, scratch_bytes, "attention backward");
  cuda_attention_sink_backward(dq, dk, dv, NULL, dy, y, lse, q, k, v, NULL, 0, batch, seq, nh, nkv, hd, hd,
                               1.0f / sqrtf((float)hd), (float *)scratch, st);
}
