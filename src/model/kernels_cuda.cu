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
 *     GPU's f64 exp against glibc's: within an ulp of f64 before the rounding to f32);
 *   - the MoE layer's statistics, grouping, combine and backward: moe_cuda.cu's kernels
 *     (tests/gpu/test_moe_cuda.c), moe.c's bits but for the routing weights' gradients.
 *   - DeepSeek-V3's latent attention: mla_cuda.cu's entries over the attention above (v's head
 *     dim apart, the scale given) and the rotary kernel here (from an offset, interleaved pairs);
 *     its kv expansion the host's bits (tests/gpu/test_mla_cuda.c).
 * The table's stream is the device's struct rf_device_stream, whose handle is a
 * cudaStream_t (NULL: refused, an error, not CUDA's legacy stream). A failed launch stops every rank
 * (rf_die) naming the kernel. scripts/cuda-emu runs these kernels on the CPU
 * (tests/gpu/emu), as far as an emulation can check them. */
#include <limits.h>

#include "model/attention_tc.h"
#include "model/fused_cuda.h"   /* the norm with a bf16 output (bf16 compute) */
#include "model/gpt_oss_cuda.h" /* GPT-OSS's entries: attention with sinks, the clamped SwiGLU, transposes */
#include "model/kernels_cuda.cuh"
#include "model/linear_cuda.h"
#include "model/mla_cuda.h" /* DeepSeek-V3's entries: latent attention, its rope and kv expansion */
#include "model/moe_cuda.h"

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

/* The rd elements from off of each of n_heads heads of stride floats in a row (ops.c's
 * rf_model_mla_rope_apply; the plain rope: stride = off + rd = hd): pair i is (i step, i step +
 * other), step 2 and other 1 interleaved, else 1 and rd / 2. */
__global__ void rope_kernel(float *x, long rows, int seq, int n_heads, int stride, int off, int rd, int step,
                            int other, const float *cos_t, const float *sin_t, float sign) {
  int half = rd / 2;
  size_t total = (size_t)rows * n_heads * half;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t i = e % half, hh = (e / half) % n_heads, n = e / ((size_t)half * n_heads);
    int t = (int)(n % seq);
    float c = cos_t[(size_t)t * half + i], si = sign * sin_t[(size_t)t * half + i];
    float *p = x + n * (size_t)n_heads * stride + hh * stride + off + i * step;
    float a = p[0], b = p[other];
    p[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, si));
    p[other] = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, si));
  }
}

void cuda_rope_launch(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                      const float *cos_t, const float *sin_t, int interleave, int inverse,
                      cudaStream_t stream) {
  long rows = (long)batch * seq;
  if (rows <= 0 || rd < 2 || n_heads <= 0) return;
  if (off < 0 || off + rd > stride)
    RF_DIE("rope on CUDA: %d elements from %d of a head of %d", rd, off, stride);
  rope_kernel<<<kc_blocks((size_t)rows * n_heads * (rd / 2)), RF_KC_THREADS, 0, stream>>>(
      x, rows, seq, n_heads, stride, off, rd, interleave ? 2 : 1, interleave ? 1 : rd / 2, cos_t, sin_t,
      inverse ? -1.0f : 1.0f);
  RF_CUDA_LAUNCHED("rope");
}

static void cuda_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                            const float *sin_t, int inverse, struct rf_device_stream *stream) {
  cuda_rope_launch(x, batch, seq, n_heads, hd, 0, hd, cos_t, sin_t, 0, inverse, kc_stream(stream));
}

/* ---- RMSNorm applied again (the backward's recomputed normalized input) ---- */

/* out = x * rstd[row] * w, multiplied in the host's order (rf_model_rmsnorm_apply): the same bits. */
__global__ void rmsnorm_apply_kernel(float *out, const float *x, const float *rstd, const float *w, size_t n,
                                     int dim) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = __fmul_rn(__fmul_rn(x[i], rstd[i / (size_t)dim]), w[i % (size_t)dim]);
}

static void cuda_rmsnorm_apply(float *out, const float *x, const float *rstd, const float *w, int n_rows,
                               int dim, struct rf_device_stream *stream) {
  size_t n = (size_t)n_rows * (size_t)dim;
  if (n == 0) return;
  rmsnorm_apply_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, kc_stream(stream)>>>(out, x, rstd, w, n, dim);
  RF_CUDA_LAUNCHED("rmsnorm apply");
}

/* bf16 compute: the norm's output rounded to bf16 for the products after it (kernels.h's
 * rmsnorm_forward_bf16, _apply_bf16). The forward is fused_cuda.cu's (its sum of squares and
 * products are rmsnorm_forward_kernel's, so rstd and the rounded output are the bits of the f32
 * norm then the linear layer's cast); the apply is rmsnorm_apply_kernel's with a bf16 store. */
static void cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, const float *x, const float *w, int n_rows,
                                      int dim, float eps, struct rf_device_stream *stream) {
  /* no branch: the residual is only read */
  rf_fused_add_rmsnorm_forward(out, rstd, (float *)x, NULL, w, n_rows, dim, eps, kc_stream(stream));
}

__global__ void rmsnorm_apply_bf16_kernel(uint16_t *out, const float *x, const float *rstd, const float *w,
                                          size_t n, int dim) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = rf_bf16_dev(__fmul_rn(__fmul_rn(x[i], rstd[i / (size_t)dim]), w[i % (size_t)dim]));
}

static void cuda_rmsnorm_apply_bf16(uint16_t *out, const float *x, const float *rstd, const float *w,
                                    int n_rows, int dim, struct rf_device_stream *stream) {
  size_t n = (size_t)n_rows * (size_t)dim;
  if (n == 0) return;
  rmsnorm_apply_bf16_kernel<<<kc_blocks(n), RF_KC_THREADS, 0, kc_stream(stream)>>>(out, x, rstd, w, n, dim);
  RF_CUDA_LAUNCHED("rmsnorm apply (bf16)");
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

/* ---- DeepSeek-V3's sigmoid group-limited router ---- */

/* A thread per row, moe.c's loops in its order: the sigmoid in f64 rounded once, the biased
 * choice recomputed from scores (the same f32 add as the host's choice scratch, so no scratch),
 * a group's score its two best, the kept groups a bit mask (at most 64 groups), the top k
 * among the kept experts (ties: the lower group, the lower expert, as the host), their
 * weights in f64. */
__device__ static float router_group_choice(const float *s, const float *bias, int e) {
  return __fadd_rn(s[e], bias ? bias[e] : 0.0f);
}

__device__ static float router_group_score_dev(const float *s, const float *bias, int g, int gs) {
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < gs; i++) {
    float v = router_group_choice(s, bias, g * gs + i);
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return __fadd_rn(a, b);
}

__global__ void router_group_forward_kernel(float *scores, int32_t *top, float *topw, const float *logits,
                                            const float *bias, int n, int ne, int n_group, int topk_group,
                                            int k, int renorm, float scale) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  int gs = ne / n_group;
  const float *z = logits + (size_t)r * ne;
  float *s = scores + (size_t)r * ne;
  int32_t *tr = top + (size_t)r * k;
  float *wr = topw + (size_t)r * k;
  for (int e = 0; e < ne; e++) s[e] = (float)__ddiv_rn(1.0, __dadd_rn(1.0, exp(-(double)z[e])));
  unsigned long long kept = 0;
  for (int g = 0; g < n_group; g++) {
    float mine = router_group_score_dev(s, bias, g, gs);
    int better = 0;
    for (int h = 0; h < n_group; h++) {
      float other = router_group_score_dev(s, bias, h, gs);
      better += other > mine || (other == mine && h < g);
    }
    if (better < topk_group) kept |= 1ull << g;
  }
  double sum = 0.0;
  for (int j = 0; j < k; j++) {
    int best = -1;
    float bestc = 0.0f;
    for (int e = 0; e < ne; e++) {
      int taken = !((kept >> (e / gs)) & 1ull);
      for (int i = 0; i < j; i++) taken |= tr[i] == e;
      float c = router_group_choice(s, bias, e);
      if (!taken && (best < 0 || c > bestc)) {
        best = e;
        bestc = c;
      }
    }
    tr[j] = best;
    sum = __dadd_rn(sum, (double)s[best]);
  }
  for (int j = 0; j < k; j++)
    wr[j] = renorm ? (float)__ddiv_rn(__dmul_rn((double)scale, (double)s[tr[j]]), __dadd_rn(sum, 1e-20))
                   : (float)__dmul_rn((double)scale, (double)s[tr[j]]);
}

__global__ void router_group_backward_kernel(float *dlogits, const float *dtopw, const float *scores,
                                             const int32_t *top, const float *topw, int n, int ne, int k,
                                             int renorm, float scale) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= n) return;
  const float *s = scores + (size_t)r * ne;
  const int32_t *tr = top + (size_t)r * k;
  const float *g = dtopw + (size_t)r * k, *wr = topw + (size_t)r * k;
  float *d = dlogits + (size_t)r * ne;
  double sum = 0.0, dot = 0.0;
  for (int j = 0; j < k; j++) {
    sum = __dadd_rn(sum, (double)s[tr[j]]);
    dot = __dadd_rn(dot, __dmul_rn((double)g[j], (double)wr[j]));
  }
  for (int e = 0; e < ne; e++) d[e] = 0.0f;
  for (int j = 0; j < k; j++) {
    double se = s[tr[j]];
    double sg = __dmul_rn((double)scale, (double)g[j]);
    double ds = renorm ? __ddiv_rn(__dsub_rn(sg, dot), __dadd_rn(sum, 1e-20)) : sg;
    d[tr[j]] = (float)__dmul_rn(__dmul_rn(ds, se), __dsub_rn(1.0, se));
  }
}

static void cuda_router_group_forward(float *scores, int32_t *top, float *topw, const float *logits,
                                      const float *bias, int n, int n_experts, int n_group, int topk_group,
                                      int k, int renorm, float scale, void *scratch, size_t scratch_bytes,
                                      struct rf_device_stream *stream) {
  (void)scratch, (void)scratch_bytes; /* the choice is recomputed from scores */
  if (n_group <= 0 || n_group > 64 || n_experts % n_group != 0 || n_experts / n_group < 2 || topk_group < 1 ||
      topk_group > n_group || k < 1 || k > topk_group * (n_experts / n_group))
    RF_DIE("group router on cuda: %d experts in %d groups, %d groups kept, top %d (at most 64 groups)",
           n_experts, n_group, topk_group, k);
  if (n <= 0) return;
  router_group_forward_kernel<<<(unsigned)((n + 127) / 128), 128, 0, kc_stream(stream)>>>(
      scores, top, topw, logits, bias, n, n_experts, n_group, topk_group, k, renorm, scale);
  RF_CUDA_LAUNCHED("group router forward");
}

static void cuda_router_group_backward(float *dlogits, const float *dtopw, const float *scores,
                                       const int32_t *top, const float *topw, int n, int n_experts, int k,
                                       int renorm, float scale, struct rf_device_stream *stream) {
  if (n <= 0 || n_experts <= 0 || k <= 0) return;
  router_group_backward_kernel<<<(unsigned)((n + 127) / 128), 128, 0, kc_stream(stream)>>>(
      dlogits, dtopw, scores, top, topw, n, n_experts, k, renorm, scale);
  RF_CUDA_LAUNCHED("group router backward");
}

/* ---- MoE token movement (moe_cuda.cu) ---- */

/* moe.c's host statistics, grouping, combine and their backward on the device, the same
 * bits (the routing weights' gradients: a fixed-order dot, within h f32 units). The
 * grouping keeps its per-expert counts in off[1..ne] (the entry takes no scratch) and
 * writes off[ne] = the rows needed even past cap: moe.c reads the offsets back and stops
 * on off[ne] > cap (nothing past cap is written), so an overflow is an error, never a
 * truncation; the scatter then runs over off[ne] rows. */
static void cuda_moe_stats(double *count, double *psum, const int32_t *top, const float *probs, int n,
                           int n_experts, int k, struct rf_device_stream *stream) {
  rf_moe_cuda_stats(count, psum, top, probs, n, k, n_experts, kc_stream(stream));
}

static void cuda_moe_group(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top,
                           const float *xn, int n, int n_experts, int k, int hidden, int rows, int cap,
                           struct rf_device_stream *stream) {
  cudaStream_t st = kc_stream(stream);
  rf_moe_cuda_group(off, tok, pos, NULL, NULL, top, n, k, n_experts, rows, cap, NULL, 0, st);
  rf_moe_cuda_gather(xg, xn, tok, off, n_experts, cap, hidden, st);
}

static void cuda_moe_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                             int hidden, struct rf_device_stream *stream) {
  rf_moe_cuda_combine(out, ey, pos, topw, n, k, hidden, kc_stream(stream));
}

static void cuda_moe_combine_weights_backward(float *dtopw, const float *dout, const float *ey,
                                              const int32_t *pos, int n, int k, int hidden,
                                              struct rf_device_stream *stream) {
  rf_moe_cuda_dtopw(dtopw, dout, ey, pos, n, k, hidden, kc_stream(stream));
}

static void cuda_moe_scatter(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                             const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden,
                             struct rf_device_stream *stream) {
  rf_moe_cuda_scatter_grad(dyg, dout, pos, topw, tok, off, n_experts, INT_MAX, n, k, hidden,
                           kc_stream(stream));
}

static void cuda_moe_gather(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden,
                            struct rf_device_stream *stream) {
  rf_moe_cuda_sum_back(dxn, dyg, pos, n, k, hidden, kc_stream(stream));
}

/* ---- scratch ---- */

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* The largest of: the column sums' chunks (RMSNorm over hidden, the q/k norms
 * over head_dim with a row per head, MLA's norms over its low ranks, biases up to
 * the widest linear output),
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
  if (cfg->deepseek_v3.q_lora_rank > wide) wide = cfg->deepseek_v3.q_lora_rank; /* MLA's low-rank norms */
  if (cfg->deepseek_v3.kv_lora_rank > wide) wide = cfg->deepseek_v3.kv_lora_rank;
  size_t bytes = colsum_bytes(n, wide);
  bytes = max_sz(bytes, colsum_bytes(n * heads, hd));
  bytes = max_sz(bytes, sizeof(float) * (size_t)n * heads);
  bytes = max_sz(bytes, sizeof(uint64_t) * (size_t)pow2_at_least(n));
  bytes = max_sz(bytes, sizeof(double) * (size_t)n);
  return (bytes + 255) / 256 * 256;
}

/* bf16 compute's attention: the tensor-core kernels (attention_tc.cu) where they take the
 * head_dim, else the f32 kernels. The backward's rows' dY . Y in the scratch (batch * nh * seq
 * floats, as the f32 backward's). */
static void cuda_attention_bf16_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                        int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                        size_t scratch_bytes, struct rf_device_stream *stream) {
  if (!rf_attention_tc_supports(hd)) {
    cuda_attention_forward(y, lse, q, k, v, batch, seq, nh, nkv, hd, scratch, scratch_bytes, stream);
    return;
  }
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  rf_attention_tc_forward(y, lse, q, k, v, batch, seq, nh, nkv, hd, kc_stream(stream));
}

static void cuda_attention_bf16_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                         const float *lse, const float *q, const float *k, const float *v,
                                         int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                         size_t scratch_bytes, struct rf_device_stream *stream) {
  if (!rf_attention_tc_supports(hd)) {
    cuda_attention_backward(dq, dk, dv, dy, y, lse, q, k, v, batch, seq, nh, nkv, hd, scratch, scratch_bytes,
                            stream);
    return;
  }
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  kc_need(sizeof(float) * (size_t)batch * nh * seq, scratch_bytes, "attention backward (tensor cores)");
  rf_attention_tc_backward(dq, dk, dv, dy, y, lse, q, k, v, batch, seq, nh, nkv, hd, (float *)scratch,
                           kc_stream(stream));
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
    rf_model_cuda_linear_forward, /* linear_cuda.c: cuBLASLt */
    rf_model_cuda_linear_backward,
    cuda_rmsnorm_apply,
    cuda_moe_stats, /* moe_cuda.cu */
    cuda_moe_group,
    cuda_moe_combine,
    cuda_moe_combine_weights_backward,
    cuda_moe_scatter,
    cuda_moe_gather,
    cuda_attention_bf16_forward, /* attention_tc.cu: tensor cores */
    cuda_attention_bf16_backward,
    rf_gpt_oss_cuda_entry_attention_sink_forward, /* gpt_oss_cuda.cu: GPT-OSS's */
    rf_gpt_oss_cuda_entry_attention_sink_backward,
    rf_gpt_oss_cuda_entry_swiglu_clamp_forward,
    rf_gpt_oss_cuda_entry_swiglu_clamp_backward,
    rf_gpt_oss_cuda_entry_weight_transpose,
    rf_gpt_oss_cuda_entry_transpose_add,
    rf_mla_cuda_entry_attention_forward, /* mla_cuda.cu: DeepSeek-V3's latent attention */
    rf_mla_cuda_entry_attention_backward,
    rf_mla_cuda_entry_rope_apply,
    rf_mla_cuda_entry_kv_expand,
    rf_mla_cuda_entry_kv_expand_backward,
    cuda_router_group_forward, /* DeepSeek-V3's router */
    cuda_router_group_backward,
    cuda_rmsnorm_forward_bf16, /* fused_cuda.cu: the norm's output in bf16 (bf16 compute) */
    cuda_rmsnorm_apply_bf16,
};
