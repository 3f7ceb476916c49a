/* Causal grouped-query attention on tensor cores (attention_tc.cu, BACKEND=cuda and
 * cuda-emu only): the semantics of rf_model_attention_forward / _backward (ops.h:
 * q [B*T, nh*hd], k and v [B*T, nkv*hd], y like q, lse [B, nh, T], scale 1/sqrt(hd);
 * the backward overwrites dq, dk, dv) with bf16 operands and f32 accumulation:
 * q, k, v and dy are rounded to bf16 (nearest even) as they are loaded, as are the
 * probabilities P before P V and dS before dS K and dS^T Q; every product is summed
 * in f32, the softmax's max, sums, exp and log in f32. So the result is that of the
 * f32 attention on bf16-rounded inputs within a few bf16 units (tests/gpu/
 * test_attention_tc.c states the bounds). head_dim 32, 64 or 128.
 *
 * FlashAttention-2's schedule with nvcuda::wmma 16x16x16 fragments: the forward a
 * block per (batch, head, 64 query rows), 4 warps of 16 rows, key tiles of 64 with
 * an online softmax (the output rescaled in shared memory); the backward D =
 * rowsum(dY Y), then dQ per query tile over its keys and dK, dV per key tile over the
 * queries of every head of its kv group (no atomics: deterministic), P recomputed
 * from lse. Shared memory (dynamic, above 48 KiB: set per launch): the forward 72 KiB
 * at hd 64 and 113 KiB at hd 128; the backward's kernels at most 123 KiB (sm_80
 * allows 163 KiB, sm_90 227 KiB). */
#ifndef RF_MODEL_ATTENTION_TC_H
#define RF_MODEL_ATTENTION_TC_H

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when the tensor-core kernels take this head_dim. */
int rf_attention_tc_supports(int hd);
void rf_attention_tc_forward(float *y, float *lse, const float *q, const float *k, const float *v, int batch,
                             int seq, int nh, int nkv, int hd, cudaStream_t stream);
/* dd: scratch of batch * nh * seq floats (the rows' dY . Y). */
void rf_attention_tc_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                              const float *lse, const float *q, const float *k, const float *v, int batch,
                              int seq, int nh, int nkv, int hd, float *dd, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
