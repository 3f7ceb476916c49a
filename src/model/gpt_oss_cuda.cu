/* GPT-OSS's kernels on CUDA (gpt_oss_cuda.h): the clamped SwiGLU on interleaved gate and up,
 * the experts' transposes; and the kernel table's entries over them and over attention_cuda.cu's
 * f32 attention, whose sinks and sliding window GPT-OSS's attention_sink_* entries pass on
 * (rf_model_kernels_cuda, kernels_cuda.cu).
 *   - the clamped SwiGLU and the transposes: ops.c's arithmetic in its order with
 *     round-to-nearest intrinsics (no FMA contraction, as gcc -std=c11), ops.c's exp
 *     polynomial: the same bits. The transposes go through 32 x 32 tiles in shared memory.
 * The table's entries take every pointer apart before the launch (a kernel never reads a
 * struct holding a device pointer: the weight's f32 or bf16 pointer is an argument). */
#include "model/gpt_oss_cuda.h"
#include "model/kernels_cuda.cuh"

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
  cuda_attention_sink_forward(y, lse, q, k, v, sinks, window, batch, seq, nh, nkv, hd, hd,
                              1.0f / sqrtf((float)hd), kc_stream(stream));
}

extern "C" void rf_gpt_oss_cuda_entry_attention_sink_backward(
    float *dq, float *dk, float *dv, float *dsinks, const float *dy, const float *y, const float *lse,
    const float *q, const float *k, const float *v, const float *sinks, int window, int batch, int seq,
    int nh, int nkv, int hd, void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  cudaStream_t st = kc_stream(stream);
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  kc_need(sizeof(float) * (size_t)batch * nh * seq, scratch_bytes, "attention with sinks backward");
  cuda_attention_sink_backward(dq, dk, dv, dsinks, dy, y, lse, q, k, v, sinks, window, batch, seq, nh, nkv,
                               hd, hd, 1.0f / sqrtf((float)hd), (float *)scratch, st);
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
