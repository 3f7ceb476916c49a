/* DeepSeek-V3's multi-head latent attention on CUDA (mla_cuda.cu; BACKEND=cuda and cuda-emu builds
 * only): the expansion of kv_b_proj's output and the shared rotary key into each head's key and
 * value, its backward (the rotary key's gradient the heads' sum), and the kernel table's five
 * mla_ entries, over attention_cuda.cu's f32 attention (v's head dim apart from q's and k's, the
 * scale given: cuda_attention_sink_forward, _backward in kernels_cuda.cuh) and kernels_cuda.cu's
 * rotary embedding (cuda_rope_launch: the rotary part of each head from an offset, interleaved
 * pairs or rotate_half). Each launch takes the caller's stream, allocates nothing and never waits.
 *
 * Semantics are those of ops.c's rf_model_attention_mla_forward / _backward,
 * rf_model_mla_rope_apply, rf_model_mla_kv_expand / _backward (ops.h); tests/gpu/test_mla_cuda.c
 * checks each against the host kernel table on the same inputs, with the tolerances it states:
 *   - the expansion and its backward, the rotary embedding: the host's operations in its order
 *     (the heads' sum from 0 in head order, __fadd_rn): the same bits;
 *   - the attention: within f32 roundoff of the host (the flash schedule sums in another order).
 * With --compute-dtype bf16 the workspace still calls these f32 entries: the tensor-core attention
 * (attention_tc.cu) takes one head dim for q, k and v (32, 64 or 128) and the scale 1/sqrt(hd), and
 * MLA has neither (DeepSeek-V3: 192 and 128), so MLA's attention stays f32 in any compute dtype, as
 * the host's does; only the GEMMs take bf16 operands. */
#ifndef RF_MODEL_MLA_CUDA_H
#define RF_MODEL_MLA_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* k [n, nh, nope + rope] = (kvb's k_nope of the head, kpe of the row), v [n, nh, dv] = kvb's v of
 * the head; kvb [n, nh, nope + dv], kpe [n, rope]. */
void rf_mla_cuda_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh, int nope,
                           int rope, int dv, cudaStream_t stream);
/* dkvb [n, nh, nope + dv] = (dk's nope part, dv) of each head; dkpe [n, rope] = the sum over the
 * heads (from 0.0f in head order) of dk's rotary part. Both overwritten. */
void rf_mla_cuda_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n, int nh,
                                    int nope, int rope, int vd, cudaStream_t stream);

/* The kernel table's entries (struct rf_model_kernels, kernels.h: mla_attention_forward, _backward,
 * mla_rope_apply, mla_kv_expand, _backward): rf_model_kernels_cuda (kernels_cuda.cu) points at
 * them. */
struct rf_device_stream;
void rf_mla_cuda_entry_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                         int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                         void *scratch, size_t scratch_bytes,
                                         struct rf_device_stream *stream);
void rf_mla_cuda_entry_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                          const float *lse, const float *q, const float *k, const float *v,
                                          int batch, int seq, int nh, int nkv, int hd, int vd, float scale,
                                          void *scratch, size_t scratch_bytes,
                                          struct rf_device_stream *stream);
void rf_mla_cuda_entry_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                                  const float *cos_t, const float *sin_t, int interleave, int inverse,
                                  struct rf_device_stream *stream);
void rf_mla_cuda_entry_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh,
                                 int nope, int rope, int dv, struct rf_device_stream *stream);
void rf_mla_cuda_entry_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n,
                                          int nh, int nope, int rope, int vd,
                                          struct rf_device_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
