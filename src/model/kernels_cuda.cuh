/* What the CUDA kernel table's files (kernels_cuda.cu, attention_cuda.cu, gpt_oss_cuda.cu,
 * mla_cuda.cu) share: the launch checks, the stream and scratch checks, the attention's entries
 * and launches, the rotary embedding's launch. */
#ifndef RF_MODEL_KERNELS_CUDA_CUH
#define RF_MODEL_KERNELS_CUDA_CUH

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
#include "model/config.h"
#include "model/ops.h"
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

static inline cudaStream_t kc_stream(struct rf_device_stream *s) {
  if (!s) RF_DIE("CUDA model kernels: a launch without a stream (NULL): name the runtime's");
  return (cudaStream_t)s->handle;
}

static inline unsigned kc_blocks(size_t n) {
  size_t b = (n + RF_KC_THREADS - 1) / RF_KC_THREADS;
  if (b < 1) b = 1;
  return b > RF_KC_MAX_BLOCKS ? RF_KC_MAX_BLOCKS : (unsigned)b;
}

static inline void kc_need(size_t need, size_t have, const char *what) {
  if (need > have)
    RF_DIE("%s on CUDA needs %zu bytes of scratch, given %zu (size it with scratch_bytes)", what, need, have);
}

void cuda_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v, int batch, int seq,
                            int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                            struct rf_device_stream *stream);
void cuda_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y, const float *lse,
                             const float *q, const float *k, const float *v, int batch, int seq, int nh, int nkv,
                             int hd, void *scratch, size_t scratch_bytes, struct rf_device_stream *stream);
/* attention_cuda.cu's f32 attention with GPT-OSS's sinks [nh] (NULL: none) and sliding window (0:
 * none), and DeepSeek-V3's shape: q, k of head dim hd, v (and y, dY) of head dim dv (vd), the scores
 * times scale, on the caller's stream (gpt_oss_cuda.cu's attention_sink_* entries, mla_cuda.cu's
 * mla_attention_* entries; the two above pass NULL, 0, dv = hd and 1/sqrt(hd)): y, lse overwritten;
 * dq, dk, dv overwritten, dsinks [nh] += -sum over rows of exp(sink_h - lse) (dY . Y) (in f64 as
 * ops.c; untouched when sinks or dsinks is NULL), dd [B * nh * T] floats of scratch. Head dims in
 * [1, 256]; nh a multiple of nkv. */
void cuda_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                 const float *sinks, int window, int batch, int seq, int nh, int nkv, int hd,
                                 int dv, float scale, cudaStream_t stream);
void cuda_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy, const float *y,
                                  const float *lse, const float *q, const float *k, const float *v,
                                  const float *sinks, int window, int batch, int seq, int nh, int nkv, int hd,
                                  int vd, float scale, float *dd, cudaStream_t stream);
/* kernels_cuda.cu's rotary embedding, in place on x [batch*seq, n_heads*stride]: the rd elements from
 * off of each head, pairs (2i, 2i+1) when interleave, else (i, i + rd/2); cos/sin [seq, rd/2];
 * inverse: the transpose (ops.c's rf_model_mla_rope_apply; the table's rope_apply is stride = rd, off
 * 0, interleave 0). The host's operations in its order: the same bits. */
void cuda_rope_launch(float *x, int batch, int seq, int n_heads, int stride, int off, int rd, const float *cos_t,
                      const float *sin_t, int interleave, int inverse, cudaStream_t stream);

#endif
