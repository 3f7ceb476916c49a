/* Fused memory-bound kernels of the GPU step (fused_cuda.cu; BACKEND=cuda and cuda-emu
 * builds only), each one launch (or a fixed few) over bf16 activations with f32
 * arithmetic, queued on the caller's stream (explicit: no NULL convention, no host
 * synchronization, nothing allocated). bf16 is the 16 bits of a uint16_t (core.h's
 * rf_bf16_from_f32: round to nearest even, NaN stays NaN). The residual stream, RMSNorm's
 * weights, rstd and the optimizer state stay f32.
 *
 * Semantics are the host ops' of model/ops.h / optim.h / fsdp's grads.c on the bf16 values
 * widened to f32, with each bf16 output the host's f32 result rounded once;
 * tests/gpu/test_fused_cuda.c checks each against them (tolerances there, in units of
 * bf16's roundoff). Element-wise work (RoPE, SwiGLU, the cross-entropy's gradient,
 * AdamW, the clip factor) does the host's operations in its order with round-to-nearest
 * intrinsics: the host's bits. Reductions run in a fixed order (deterministic, not the
 * host's order). */
#ifndef RF_MODEL_FUSED_CUDA_H
#define RF_MODEL_FUSED_CUDA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- RMSNorm with the residual add ---- */

/* resid [n_rows, dim] += branch (bf16; NULL: no add), then out = bf16(rmsnorm(resid) * w)
 * and rstd [n_rows] as rf_model_rmsnorm_forward on the updated resid. */
void rf_fused_add_rmsnorm_forward(uint16_t *out, float *rstd, float *resid, const uint16_t *branch,
                                  const float *w, int n_rows, int dim, float eps, cudaStream_t stream);
/* rf_model_rmsnorm_backward with dout in bf16: dresid += dx (the residual's gradient goes
 * on through the add), dw += the column sums (NULL: skipped); then, when dbranch is given,
 * dbranch = bf16(dresid), the gradient of the branch the forward added (the next
 * backward GEMM's input). scratch: rf_fused_rmsnorm_scratch_bytes(n_rows, dim). */
void rf_fused_add_rmsnorm_backward(float *dresid, uint16_t *dbranch, float *dw, const uint16_t *dout,
                                   const float *x, const float *rstd, const float *w, int n_rows, int dim,
                                   void *scratch, size_t scratch_bytes, cudaStream_t stream);
size_t rf_fused_rmsnorm_scratch_bytes(int n_rows, int dim);

/* ---- rotary embedding of q and k in one launch ---- */

/* rf_model_rope_apply on q [B*T, nh*hd] and k [B*T, nkv*hd] (bf16, in place; k NULL or
 * nkv 0: q only); cos_t, sin_t: rf_model_rope_tables' [T, hd/2] in f32. */
void rf_fused_rope_qk(uint16_t *q, uint16_t *k, int batch, int seq, int nh, int nkv, int hd,
                      const float *cos_t, const float *sin_t, int inverse, cudaStream_t stream);

/* ---- SwiGLU ---- */

/* h = bf16(silu(gate) * up), rf_model_swiglu_forward's arithmetic. */
void rf_fused_swiglu_forward(uint16_t *h, const uint16_t *gate, const uint16_t *up, size_t n,
                             cudaStream_t stream);
/* rf_model_swiglu_backward: dgate, dup in bf16 (dup may alias dh). */
void rf_fused_swiglu_backward(uint16_t *dgate, uint16_t *dup, const uint16_t *dh, const uint16_t *gate,
                              const uint16_t *up, size_t n, cudaStream_t stream);

/* ---- cross-entropy over the vocabulary in chunks ---- */

/* Columns per chunk: a block per (row, chunk); the last chunk of a row is partial when
 * the vocabulary is not a multiple. */
#define RF_FUSED_CE_CHUNK 2048
/* Chunks of a row (the last partial). */
int rf_fused_ce_chunks(int vocab);
/* rf_model_cross_entropy_forward on bf16 logits [n, vocab]: lse [n] (f32) and the loss
 * sum into *loss (device, one double; targets NULL or a negative target: no term).
 * scratch: rf_fused_ce_scratch_bytes(n, vocab). */
void rf_fused_cross_entropy_forward(double *loss, float *lse, const uint16_t *logits, const int32_t *targets,
                                    int n, int vocab, void *scratch, size_t scratch_bytes,
                                    cudaStream_t stream);
size_t rf_fused_ce_scratch_bytes(int n, int vocab);
/* rf_model_cross_entropy_backward in place on the bf16 logits: scale (softmax - onehot),
 * a row with a negative target zeroed. */
void rf_fused_cross_entropy_backward(uint16_t *logits, const float *lse, const int32_t *targets, int n,
                                     int vocab, float scale, cudaStream_t stream);

/* ---- FP8 of bf16 activations ---- */

/* rf_fp8_quantize (src/core/fp8.c) of the bf16 [rows, cols] x widened to f32, in 1 x 128
 * tiles (DeepSeek-V3's tiles of activations and output gradients): codes [rows, cols] and
 * scales [rows, ceil(cols / 128)] (fp8.c's layout), bit for bit the host's, pow2 as there.
 * *bad (device) = the row-major index of the first NaN or infinity, INT64_MAX when none:
 * the host refuses such a tensor naming that element, so the caller reads *bad with the
 * step's other results and discards the codes then (a NaN tile's scale is NaN). */
void rf_fused_fp8_quantize_rows_bf16(uint8_t *codes, float *scales, long long *bad, const uint16_t *x,
                                     int64_t rows, int64_t cols, int pow2, cudaStream_t stream);

/* ---- a unit's shard: gradient norm, clipping, AdamW, one launch each ---- */

/* Elements per block of the shard kernels. */
#define RF_FUSED_CHUNK 4096
/* A tensor's piece of the unit's shard: elements [offset, offset + len) of the shard's
 * parameter, gradient and moment slabs, AdamW's weight decay on it or not; first_chunk is
 * filled by rf_fused_pieces_plan. Padding between pieces is never read or written; a
 * zero-length piece touches nothing. */
struct rf_fused_piece {
  int64_t offset, len;
  int64_t first_chunk; /* the first block of the piece: the sum of the chunks before it */
  int32_t decay, pad;
};
/* Fills first_chunk of pieces[0..n) (host memory, in order) and returns the number of
 * chunks (blocks) of the plan; upload the pieces to the device for the kernels below. */
int64_t rf_fused_pieces_plan(struct rf_fused_piece *pieces, int n);
/* The pieces' sum of g^2 (f64, fixed order) into *sumsq, or added to it when accumulate
 * (the units of a step one after another on one stream: a deterministic total).
 * scratch: n_chunks doubles. */
void rf_fused_sum_squares(double *sumsq, int accumulate, const float *g, const struct rf_fused_piece *pieces,
                          int n_pieces, int64_t n_chunks, void *scratch, size_t scratch_bytes,
                          cudaStream_t stream);
/* grads.c's clipping from the (all-reduced) sum of squares (the step uses the device table's
 * rf_device_clip_factor instead: NaN for a non-finite norm, which skips the update; this one
 * gives 1 there): *norm = sqrt(*sumsq) and
 * *factor = (float)(max_norm / (norm + 1e-6)) when max_norm > 0, the norm finite and above
 * it; 1 otherwise (the host leaves the gradients alone then: multiplying by 1 changes no
 * bit). norm may be NULL. One thread. */
void rf_fused_clip_factor(float *factor, double *norm, const double *sumsq, double max_norm,
                          cudaStream_t stream);
/* AdamW (adamw.c's arithmetic, RF_OPTIM_ADAMW_*) on every piece of the shard in one
 * launch, each gradient first multiplied by *gscale (device; NULL: not scaled), as
 * rf_fsdp_clip_grads then the host step do; a NaN *gscale (rf_device_clip_factor's for a
 * non-finite norm) changes nothing. h: struct rf_optim_hyper (optim.h). The CUDA
 * training step's AdamW (the backend's shard_adamw, src/backend/backend_cuda.c). */
struct rf_optim_hyper;
void rf_fused_adamw(const struct rf_optim_hyper *h, float *p, const float *g, float *m, float *v,
                    const float *gscale, const struct rf_fused_piece *pieces, int n_pieces, int64_t n_chunks,
                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
