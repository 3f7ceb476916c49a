/* src/model: the host ops of the decoder (ops.c; the MoE router and token
 * movement in moe.c): RMSNorm, rotary embedding, causal grouped-query attention,
 * SwiGLU, the linear layers (src/gemm) with their compute dtype and staging,
 * cross-entropy, embedding, bias, each forward and backward, on host memory.
 * The host kernel table (kernels_host.c) wraps them; tests check them against
 * references. struct rf_model_weight (a tensor's weights as the runtime gives
 * them) and struct rf_model_stage (how the linear layers multiply) are the
 * arguments they share with the kernel tables (kernels.h). */
#ifndef RF_MODEL_OPS_H
#define RF_MODEL_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "rfsdp_types.h" /* enum rf_dtype */

/* One tensor's weights as the runtime gives them: exactly one of f32, bf16 and fp8
 * is non-NULL (bf16 when parameters are gathered in bf16; fp8: a linear weight's
 * e4m3 codes [out, in] with one scale per 128x128 tile, row-major over the tiles,
 * in FP8 block mode). Borrowed. */
struct rf_model_weight {
  const float *f32;
  const uint16_t *bf16;
  const uint8_t *fp8;
  const float *fp8_scales;
};

/* Expert e's slice of a fused expert tensor [E, rows, cols] (src/model/moe.c): its
 * values, or in FP8 block mode its codes and its own 128x128 tiles' scales, the scales
 * expert-major as src/dbuffer lays them out after a gather (each expert tiled on its
 * own: ceil(rows / 128) x ceil(cols / 128) tiles each). Borrowed views into w. */
struct rf_model_weight rf_model_moe_expert_weight(const struct rf_model_weight *w, int e, int rows, int cols);

/* How the linear layers multiply, and their staging. compute RF_DTYPE_F32: f32
 * products; bf16 weights are widened into wf32 RF_MODEL_STAGE_ROWS rows at a time.
 * compute RF_DTYPE_BF16: act and act2 hold the activation and output-gradient
 * operands rounded to bf16 ([n, max(hidden, inter, heads*hd, vocab)] each), wbf16
 * an f32 weight rounded to bf16 (gathered bf16 weights are used in place). Buffers
 * borrowed (the workspace owns them; NULL when the compute dtype does not use them). */
#define RF_MODEL_STAGE_ROWS 256
/* FP8 block mode (rf_model_ws_set_fp8): a linear whose weight comes as e4m3 codes
 * quantizes its activation and output-gradient operands (1 x 128 tiles; 128 x 1
 * along the tokens for the weight gradient dW = dY^T X, as DeepSeek-V3 does) and
 * multiplies on codes held as bf16 (rf_gemm_fp8_run). a, b: two operands' codes
 * as bf16 (rf_fp8_quantize_bf16); w: the weight's codes as bf16; sa, sb:
 * their scales; work: the product's. Sized at set-up for the largest linear. */
struct rf_model_fp8_stage {
  int pow2; /* power-of-two scales */
  int seq;  /* tokens per sequence: dW's token tiles restart at each (0: one run) */
  uint16_t *a, *b, *w;
  float *sa, *sb, *work;
  /* On a device that runs no host code (CUDA: linear_cuda.c, rf_gemm_cuda_run_fp8): ca, cb the
   * two operands' e4m3 codes (sa, sb their scales in cuBLASLt's layouts; a, b, w, work NULL),
   * y an f32 product staged when its shape is not a multiple of 16, bad the device flag of an
   * operand holding NaN or an infinity. */
  uint8_t *ca, *cb;
  float *y;
  int *bad;
  int64_t cap_a, cap_b, cap_scales, cap_y; /* their sizes (codes, floats) */
};
struct rf_model_stage {
  enum rf_dtype compute;
  uint16_t *act, *act2, *wbf16;
  float *wf32;
  struct rf_model_fp8_stage fp8; /* allocated by rf_model_ws_set_fp8 (work NULL: not) */
  /* bf16 compute on a table with rmsnorm_forward_bf16 (kernels.h): x16 holds the bf16 rounding of
   * the activations x16_of [rows, cols] would hold (the norm's output, written in bf16 only, into
   * act2): a linear layer given x == x16_of takes x16 instead of casting x (the CUDA table's,
   * linear_cuda.c). The workspace sets them after the norm and clears them after the products that
   * read it (NULL: none). */
  const float *x16_of;
  const uint16_t *x16;
  /* Called after every linear op's matmuls when set (the trainer drives MPI
   * progress of the runtime's prefetches with it). Borrowed; NULL: none. */
  void (*progress)(void *ctx);
  void *progress_ctx;
};

/* The router's top-k on logits [n, E]: probs = softmax, the top k by probability
 * (ties: the lower expert), their weights: the probabilities, renormalized to sum 1
 * when renorm (mixtral; qwen3_moe's norm_topk_prob). */
void rf_model_router_forward(float *probs, int32_t *top, float *topw, float *logits, int n, int n_experts,
                             int k, int renorm);
/* dlogits [n, E] from d(topw) [n, k] and dprobs_extra [E] (added to every row's
 * d(prob), e.g. the load-balancing loss's; NULL: none). Overwrites dlogits. */
void rf_model_router_backward(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                              const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                              int renorm);
/* DeepSeek-V3's sigmoid group-limited router (transformers' DeepseekV3TopkRouter) on f32 logits
 * [n, E]: scores = sigmoid(logits) [n, E]; for choosing only, scores + bias (bias [E] the
 * e_score_correction_bias, NULL: zero); E / n_group experts a group, a group's score the sum of its
 * two best; the topk_group best groups kept; top [n, k] the k best experts of the kept groups, in
 * rank order; ties: the lower group, the lower expert (torch.topk's CPU choice among equal values is
 * its own, docs/moe.md); topw [n, k] the unbiased scores of the chosen, divided by their sum
 * (+1e-20) when renorm (norm_topk_prob), times scale (routed_scaling_factor). choice [E] is
 * scratch. */
void rf_model_router_group_forward(float *scores, int32_t *top, float *topw, float *choice,
                                   const float *logits, const float *bias, int n, int n_experts, int n_group,
                                   int topk_group, int k, int renorm, float scale);
/* dlogits [n, E] from d(topw) [n, k] through the normalization and the sigmoid (the choice and the
 * bias are not differentiated; the unchosen experts get zero). Overwrites dlogits. */
void rf_model_router_group_backward(float *dlogits, const float *dtopw, const float *scores,
                                    const int32_t *top, const float *topw, int n, int n_experts, int k,
                                    int renorm, float scale);
/* DeepSeek-V3's balancing bias after a step: bias[j] (element begin + j of a layer's
 * e_score_correction_bias, j < len) += u * sign(mean(load) - load[begin + j]), load [n_experts]
 * the layer's top-k assignments of the step (summed over the ranks): an over-loaded expert's bias
 * falls, an under-loaded one's rises, one at the mean keeps its bias. */
void rf_model_bias_update(float *bias, int64_t begin, int64_t len, const double *load, int n_experts,
                          float u);
/* The MoE layer's token movement (the host ops of the kernel table's moe_ entries; every array in
 * the layout of struct rf_model_moe_acts):
 *   stats: count[top[r, j]] += 1, psum[e] += probs[r, e] over the n rows (f64 sums);
 *   group: the n*k choices grouped by expert (expert e's rows [off[e], off[e+1]), its tokens in
 *     token order, padded with tok -1 to a multiple of `rows`; pos[r, j] the row of each choice;
 *     xg [off[E], hidden] the tokens' xn rows, zero rows for padding); dies past cap rows;
 *   combine: out[r] += sum_j topw[r, j] * ey[pos[r, j]] (choices in rank order);
 *   combine_weights_backward: dtopw[r, j] = dout[r] . ey[pos[r, j]];
 *   scatter: dyg[pos[r, j]] = topw[r, j] * dout[r], padding rows (tok < 0, below off[E]) zero;
 *   gather: dxn[r] += sum_j dyg[pos[r, j]]. */
void rf_model_moe_stats(double *count, double *psum, const int32_t *top, const float *probs, int n,
                        int n_experts, int k);
void rf_model_moe_group(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top,
                        const float *xn, int n, int n_experts, int k, int hidden, int rows, int cap);
void rf_model_moe_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                          int hidden);
void rf_model_moe_combine_weights_backward(float *dtopw, const float *dout, const float *ey,
                                           const int32_t *pos, int n, int k, int hidden);
void rf_model_moe_scatter(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                          const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden);
void rf_model_moe_gather(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden);

/* ---- ops (the pieces above; exposed for tests) -------------------------------------------- */

/* out[n] = x[n] * rstd[n] * w, rstd[n] = 1/sqrt(mean(x[n]^2) + eps); x, out [n_rows, dim]. */
void rf_model_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                              float eps);
/* dx += d/dx, dw += d/dw, given dout. */
void rf_model_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                               const float *w, int n_rows, int dim);
/* In place on x [batch*seq, n_heads*hd]: HF rotate_half with pairs (i, i + hd/2);
 * cos/sin [seq, hd/2]. inverse = 1 applies the transpose (the backward). */
void rf_model_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                         const float *sin_t, int inverse);
/* out [n, dim] = x[n] * rstd[n] * w: rmsnorm_forward's output from its saved 1/rms (the backward
 * recomputes the normalized activations). */
void rf_model_rmsnorm_apply(float *out, const float *x, const float *rstd, const float *w, int n_rows,
                            int dim);
/* Fills cos/sin [seq, hd/2] with inv_freq_i = theta^(-2i/hd). */
void rf_model_rope_tables(float *cos_t, float *sin_t, int seq, int hd, double theta);
/* Causal grouped-query attention. q [B*T, nh*hd], k/v [B*T, nkv*hd] ->
 * y [B*T, nh*hd] and lse [B, nh, T] (each row's log-sum-exp; the probabilities
 * are recomputed in the backward). Scale 1/sqrt(hd). Query rows go in blocks of
 * RF_MODEL_ATT_BLOCK that see keys up to the block's end only. scratch:
 * [n_scratch, 2, RF_MODEL_ATT_BLOCK, T] (one slice per OpenMP thread). */
#define RF_MODEL_ATT_BLOCK 64
void rf_model_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                int batch, int seq, int nh, int nkv, int hd, float *scratch, int n_scratch);
/* dq, dk, dv are overwritten (not accumulated). */
void rf_model_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *lse,
                                 const float *q, const float *k, const float *v, int batch, int seq, int nh,
                                 int nkv, int hd, float *scratch, int n_scratch);
/* Attention with v's head dim dv (q and k: hd) and the scores' scale given (DeepSeek-V3's
 * multi-head latent attention): q, k [B*T, nh*hd / nkv*hd], v [B*T, nkv*dv] -> y [B*T, nh*dv],
 * lse [B, nh, T]. The same kernel as rf_model_attention_forward (which is dv = hd, scale
 * 1/sqrt(hd)) and the sinks' (ops.c). The backward overwrites dq, dk, dv. */
void rf_model_attention_mla_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                    int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                    float *scratch, int n_scratch);
void rf_model_attention_mla_backward(float *dq, float *dk, float *dv, const float *dy, const float *lse,
                                     const float *q, const float *k, const float *v, int batch, int seq,
                                     int nh, int nkv, int hd, int vd, float scale, float *scratch,
                                     int n_scratch);
/* In place on x [batch*seq, n_heads*stride]: the rotary embedding of the rd elements from off of
 * each head (cos/sin [seq, rd/2]), pairs (2i, 2i+1) when interleave (transformers' rope_interleave),
 * else (i, i + rd/2); inverse = 1: the transpose (the backward). */
void rf_model_mla_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                             const float *cos_t, const float *sin_t, int interleave, int inverse);
/* MLA's keys and values from kv_b_proj's output kvb [n, nh, nope + dv] and the rotary key kpe
 * [n, rope] every head shares: k [n, nh, nope + rope] = (k_nope, kpe), v [n, nh, dv]. */
void rf_model_mla_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh, int nope,
                            int rope, int dv);
/* Its backward: dkvb [n, nh, nope + dv] and dkpe [n, rope] (the heads' sum), overwritten. */
void rf_model_mla_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n,
                                     int nh, int nope, int rope, int vd);
/* The exp() of the softmax and SiLU loops (vectorizable; relative error < 2e-7). */
float rf_model_expf(float x);
/* h = silu(gate) * up; backward overwrites dgate, dup. */
void rf_model_swiglu_forward(float *h, const float *gate, const float *up, size_t n);
void rf_model_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                              size_t n);
/* y [n, out] = x [n, in] W^T + beta * y (beta 0 or 1), W [out, in] f32, bf16 or
 * FP8 codes (then x is quantized per 1 x 128 tile and the product runs on codes;
 * a non-finite x makes y NaN); st: the compute dtype and staging (NULL: f32
 * compute with f32 weights). */
void rf_model_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                             int out, float beta, const struct rf_model_stage *st);
/* dx [n, in] = dy W + beta * dx (beta 0 or 1; skipped when dx is NULL); dw [out, in] += dy^T x
 * (skipped when dw is NULL). FP8 weights: dy quantized per 1 x 128 tile for dx, dy and
 * x per 128 x 1 tile (along the n rows) for dw, products on codes. */
void rf_model_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                              const struct rf_model_weight *w, int n, int in, int out, float beta,
                              const struct rf_model_stage *st);
/* Sum over rows with target >= 0 of lse - logit[target]; lse [n] filled. */
double rf_model_cross_entropy_forward(float *lse, const float *logits, const int32_t *targets, int n,
                                      int vocab);
/* logits -> scale * (softmax - onehot) in place (rows with target < 0 -> 0). */
void rf_model_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                     int vocab, float scale);
/* out [n, dim] = table rows (f32 or bf16); backward: dtable[tok] += dout row. */
void rf_model_embedding_forward(float *out, const struct rf_model_weight *table, const int32_t *tokens, int n,
                                int dim);
void rf_model_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim);
/* y [n, out] += b (every row); backward: db [out] += the column sums of dy. */
void rf_model_bias_forward(float *y, const float *b, int n, int out);
void rf_model_bias_backward(float *db, const float *dy, int n, int out);

/* ---- GPT-OSS (transformers' GptOssForCausalLM) ---------------------------------------------- */

/* Attention as rf_model_attention_forward with a learned logit per query head in each row's
 * softmax denominator (sinks [nh]; NULL: none): P_j = exp(s_j) / (sum_j exp(s_j) + exp(sink_h)),
 * lse [B, nh, T] including the sink; and a sliding window (window > 0: row i sees keys
 * (i - window, i], transformers' kv_idx > q_idx - sliding_window; 0: every earlier key). */
void rf_model_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                     const float *sinks, int window, int batch, int seq, int nh, int nkv,
                                     int hd, float *scratch, int n_scratch);
/* dq, dk, dv overwritten; dsinks [nh] += d/d(sinks) = -sum over rows of exp(sink - lse) (dY . Y)
 * (y: the forward's output; skipped when sinks or dsinks is NULL). */
void rf_model_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                      const float *y, const float *lse, const float *q, const float *k,
                                      const float *v, const float *sinks, int window, int batch, int seq,
                                      int nh, int nkv, int hd, float *scratch, int n_scratch);
/* GPT-OSS's clamped SwiGLU on interleaved pairs gu [n, 2] (gate even, up odd, as
 * gate_up_proj's columns): g = min(gate, limit), u = clamp(up, -limit, limit),
 * h[i] = (u + 1) g sigmoid(alpha g). The backward overwrites dgu [n, 2] (a clamped input: 0). */
void rf_model_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit);
void rf_model_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n, float alpha,
                                    float limit);
/* dst [cols, rows] = w [rows, cols] transposed (f32, or bf16 widened): an [in, out] weight as
 * the [out, in] the linear ops take. */
void rf_model_weight_transpose(float *dst, const struct rf_model_weight *w, int rows, int cols);
/* dst [cols, rows] += src [rows, cols] transposed (an [out, in] gradient into an [in, out] one). */
void rf_model_transpose_add(float *dst, const float *src, int rows, int cols);
struct rf_model_yarn; /* config.h */
/* rf_model_rope_tables with YaRN's inverse frequencies, cos and sin times attention_factor. */
void rf_model_rope_tables_yarn(float *cos_t, float *sin_t, int seq, int hd, double theta,
                               const struct rf_model_yarn *y);

#endif
