/* GPT-OSS's kernels on CUDA (gpt_oss_cuda.cu; BACKEND=cuda and cuda-emu builds only): the
 * clamped SwiGLU on interleaved gate and up, the transposes of the experts' [in, out] weights
 * and their gradients, and the kernel table's entries for attention with sinks and a sliding
 * window (forward and backward, the sinks' gradient), over attention_cuda.cu's f32 attention
 * (cuda_attention_sink_forward, _backward: kernels_cuda.cuh). Each launch takes the caller's
 * stream, allocates nothing and never waits.
 *
 * Semantics are those of ops.c's rf_model_attention_sink_forward / _backward,
 * rf_model_swiglu_clamp_forward / _backward, rf_model_weight_transpose and
 * rf_model_transpose_add (ops.h); tests/gpu/test_gpt_oss_cuda.c checks each against the host
 * kernel table on the same inputs, with the tolerances it states:
 *   - attention: q [B*T, nh*hd], k and v [B*T, nkv*hd], y like q, lse [B, nh, T] (each row's
 *     log-sum-exp, the sink's exp(sink_h) included), scale 1/sqrt(hd); sinks [nh] (NULL: none);
 *     window > 0: row i sees keys (i - window, i], 0: every key up to i. attention_cuda.cu's
 *     f32 kernels, flash-style (O(T) memory, a fixed order: deterministic), within f32
 *     roundoff of the host;
 *   - the clamped SwiGLU and the transposes: the host's operations in its order with
 *     round-to-nearest intrinsics: the same bits. */
#ifndef RF_MODEL_GPT_OSS_CUDA_H
#define RF_MODEL_GPT_OSS_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* h [n] from gu [n, 2] (gate even, up odd): g = min(gate, limit), u = clamp(up, -limit, limit),
 * h = (u + 1) g sigmoid(alpha g); the backward overwrites dgu [n, 2] (a clamped input: 0). */
void rf_gpt_oss_cuda_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit,
                                          cudaStream_t stream);
void rf_gpt_oss_cuda_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n,
                                           float alpha, float limit, cudaStream_t stream);
/* dst [cols, rows] = w [rows, cols] transposed, w in f32 (wf) or bf16 (wb, widened; wf NULL). */
void rf_gpt_oss_cuda_weight_transpose(float *dst, const float *wf, const uint16_t *wb, int rows, int cols,
                                      cudaStream_t stream);
/* dst [cols, rows] += src [rows, cols] transposed. */
void rf_gpt_oss_cuda_transpose_add(float *dst, const float *src, int rows, int cols, cudaStream_t stream);

/* The kernel table's entries (struct rf_model_kernels, kernels.h: attention_sink_forward, _backward,
 * swiglu_clamp_forward, _backward, weight_transpose, transpose_add) over the launches above and
 * attention_cuda.cu's:
 * rf_model_kernels_cuda (kernels_cuda.cu) points at them. */
struct rf_device_stream;
struct rf_model_weight;
void rf_gpt_oss_cuda_entry_attention_sink_forward(float *y, float *lse, const float *q, const float *k,
                                                  const float *v, const float *sinks, int window, int batch,
                                                  int seq, int nh, int nkv, int hd, void *scratch,
                                                  size_t scratch_bytes, struct rf_device_stream *stream);
void rf_gpt_oss_cuda_entry_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks,
                                                   const float *dy, const float *y, const float *lse,
                                                   const float *q, const float *k, const float *v,
                                                   const float *sinks, int window, int batch, int seq, int nh,
                                                   int nkv, int hd, void *scratch, size_t scratch_bytes,
                                                   struct rf_device_stream *stream);
void rf_gpt_oss_cuda_entry_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit,
                                                struct rf_device_stream *stream);
void rf_gpt_oss_cuda_entry_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n,
                                                 float alpha, float limit, struct rf_device_stream *stream);
void rf_gpt_oss_cuda_entry_weight_transpose(float *dst, const struct rf_model_weight *w, int rows, int cols,
                                            struct rf_device_stream *stream);
void rf_gpt_oss_cuda_entry_transpose_add(float *dst, const float *src, int rows, int cols,
                                         struct rf_device_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
