/* src/model: the model's compute primitives on activations, behind one table per
 * backend (struct rf_model_kernels, as src/device's rf_device_ops and src/comm's
 * rf_comm_ops), so that the decoder can run its non-GEMM work on whichever device
 * holds its activations.
 *
 * What is in the table: every operation on activations and weights that model.c and
 * moe.c run in the step: embedding, RMSNorm (and its recomputation), rotary embedding,
 * causal grouped-query attention with its log-sum-exp, SwiGLU, bias, cross-entropy,
 * the MoE router's softmax and top-k, each forward and backward; the linear layers
 * (the GEMMs of src/gemm with their bf16 and FP8 staging); the MoE layer's statistics,
 * grouping of tokens by expert, combine and their backward.
 * model.c and moe.c call these through their workspace's table (struct
 * rf_model_ws: kern, stream, scratch).
 *
 * Semantics. Every entry has the semantics of the host op of the same name in
 * ops.h (shapes, layouts, what is overwritten and what is added into), with
 * these differences of form only:
 *   - every pointer is device memory of the table's backend (host_memory 1: the
 *     heap); a struct rf_model_weight or rf_model_stage is read at the call (a table
 *     whose work runs later copies it), its pointers are device pointers;
 *   - `stream` orders the work (the runtime's compute stream; the CUDA table refuses
 *     NULL, the host ignores the stream and runs at once); nothing returns to the host, so no entry waits for
 * the device;
 *   - cross_entropy_forward writes the loss sum into *loss (device memory, one
 *     double) instead of returning it;
 *   - attention_backward also takes y, the forward's output, for the rows' sum
 *     dY . Y (= sum_j P dP, which the host op recomputes from P and dP; the host
 *     table ignores y);
 *   - scratch: device memory of scratch_bytes(cfg, batch, seq) bytes at least, for
 *     every entry that takes it (one buffer serves them all: work on one stream runs
 *     in order); its contents are not kept between calls.
 *
 * Backends: rf_model_kernels_host (kernels_host.c: the ops of ops.c, wrapped, not
 * rewritten), rf_model_kernels_checked (kernels_checked.c: the host table launched on the
 * checked device's streams, rf_device_stream_launch) and rf_model_kernels_cuda (kernels_cuda.cu, built by
 * BACKEND=cuda only; f32 activations; tests/gpu/test_kernels_cuda.c checks it against the host table). The
 * tables are static and const; nothing in them allocates. */
#ifndef RF_MODEL_KERNELS_H
#define RF_MODEL_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rf_model_config;  /* config.h */
struct rf_model_weight;  /* ops.h */
struct rf_model_stage;   /* ops.h */
struct rf_device_stream; /* device/device.h (a CUDA backend reads its handle: a cudaStream_t) */

struct rf_model_kernels {
  const char *name; /* "host", "cuda" */
  int host_memory;  /* 1: its pointers are host pointers */
  /* The scratch any entry needs for a model of cfg on batch sequences of seq tokens. */
  size_t (*scratch_bytes)(const struct rf_model_config *cfg, int batch, int seq);
  /* rf_model_embedding_forward, _backward (tokens: device memory too). */
  void (*embedding_forward)(float *out, const struct rf_model_weight *table, const int32_t *tokens, int n,
                            int dim, struct rf_device_stream *stream);
  void (*embedding_backward)(float *dtable, const float *dout, const int32_t *tokens, int n, int dim,
                             void *scratch, size_t scratch_bytes, struct rf_device_stream *stream);
  /* rf_model_rmsnorm_forward, _backward (dx or dw NULL: skipped). */
  void (*rmsnorm_forward)(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                          float eps, struct rf_device_stream *stream);
  void (*rmsnorm_backward)(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                           const float *w, int n_rows, int dim, void *scratch, size_t scratch_bytes,
                           struct rf_device_stream *stream);
  /* rf_model_rope_apply (cos_t, sin_t: device copies of rf_model_rope_tables'). */
  void (*rope_apply)(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                     const float *sin_t, int inverse, struct rf_device_stream *stream);
  /* rf_model_attention_forward, _backward. */
  void (*attention_forward)(float *y, float *lse, const float *q, const float *k, const float *v, int batch,
                            int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                            struct rf_device_stream *stream);
  void (*attention_backward)(float *dq, float *dk, float *dv, const float *dy, const float *y,
                             const float *lse, const float *q, const float *k, const float *v, int batch,
                             int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                             struct rf_device_stream *stream);
  /* rf_model_swiglu_forward, _backward. */
  void (*swiglu_forward)(float *h, const float *gate, const float *up, size_t n,
                         struct rf_device_stream *stream);
  void (*swiglu_backward)(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                          size_t n, struct rf_device_stream *stream);
  /* rf_model_bias_forward, _backward. */
  void (*bias_forward)(float *y, const float *b, int n, int out, struct rf_device_stream *stream);
  void (*bias_backward)(float *db, const float *dy, int n, int out, void *scratch, size_t scratch_bytes,
                        struct rf_device_stream *stream);
  /* rf_model_cross_entropy_forward (its return value into *loss; targets NULL: lse only, *loss = 0),
   * rf_model_cross_entropy_backward. */
  void (*cross_entropy_forward)(double *loss, float *lse, const float *logits, const int32_t *targets, int n,
                                int vocab, void *scratch, size_t scratch_bytes,
                                struct rf_device_stream *stream);
  void (*cross_entropy_backward)(float *logits, const float *lse, const int32_t *targets, int n, int vocab,
                                 float scale, struct rf_device_stream *stream);
  /* rf_model_router_forward (logits only read), rf_model_router_backward (dprobs_extra [n_experts],
   * NULL: none). */
  void (*router_forward)(float *probs, int32_t *top, float *topw, const float *logits, int n, int n_experts,
                         int k, int renorm, struct rf_device_stream *stream);
  void (*router_backward)(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                          const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                          int renorm, struct rf_device_stream *stream);
  /* ---- the rest of the step's host code on activations (issue 34). The CUDA table leaves these
   * NULL (kernels_cuda.cu initializes in order: they come last); a workspace refuses a table
   * missing an entry, naming it (rf_model_kernels_missing). ---- */
  /* rf_model_linear_forward, _backward: st is read at the call (as a weight is); its buffers are
   * device memory of the workspace; its progress callback is NOT called (the workspace calls it on
   * the host after queueing the op: rf_model_ws_linear_forward). */
  void (*linear_forward)(float *y, const float *x, const struct rf_model_weight *w, int n, int in, int out,
                         float beta, const struct rf_model_stage *st, struct rf_device_stream *stream);
  void (*linear_backward)(float *dx, float *dw, const float *dy, const float *x,
                          const struct rf_model_weight *w, int n, int in, int out, float beta,
                          const struct rf_model_stage *st, struct rf_device_stream *stream);
  /* rf_model_rmsnorm_apply (the normalized activations recomputed in the backward). */
  void (*rmsnorm_apply)(float *out, const float *x, const float *rstd, const float *w, int n_rows, int dim,
                        struct rf_device_stream *stream);
  /* rf_model_moe_stats, _group, _combine, _combine_weights_backward, _scatter, _gather (moe.c). */
  void (*moe_stats)(double *count, double *psum, const int32_t *top, const float *probs, int n, int n_experts,
                    int k, struct rf_device_stream *stream);
  void (*moe_group)(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top, const float *xn,
                    int n, int n_experts, int k, int hidden, int rows, int cap,
                    struct rf_device_stream *stream);
  void (*moe_combine)(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                      int hidden, struct rf_device_stream *stream);
  void (*moe_combine_weights_backward)(float *dtopw, const float *dout, const float *ey, const int32_t *pos,
                                       int n, int k, int hidden, struct rf_device_stream *stream);
  void (*moe_scatter)(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                      const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden,
                      struct rf_device_stream *stream);
  void (*moe_gather)(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden,
                     struct rf_device_stream *stream);
  /* ---- optional (never "missing"): attention for bf16 compute (rf_model_ws_set_compute), the
   * semantics of attention_forward/_backward with q, k, v, dy, P and dS rounded to bf16 and every
   * product summed in f32 (the CUDA table: tensor cores, attention_tc.cu, where the head_dim is
   * one it takes, else its f32 kernels). NULL (the host and checked tables): bf16 compute runs the
   * f32 attention, as the host always has. */
  void (*attention_bf16_forward)(float *y, float *lse, const float *q, const float *k, const float *v,
                                 int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                 size_t scratch_bytes, struct rf_device_stream *stream);
  void (*attention_bf16_backward)(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                  const float *lse, const float *q, const float *k, const float *v, int batch,
                                  int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                                  struct rf_device_stream *stream);
  /* ---- GPT-OSS's (rf_model_kernels_missing_for asks for them of a config whose family has
   * attention sinks, resp. GPT-OSS's experts, only; the CUDA table's are gpt_oss_cuda.cu's). ---- */
  /* rf_model_attention_sink_forward, _backward (sinks: f32 device memory; dsinks added into). */
  void (*attention_sink_forward)(float *y, float *lse, const float *q, const float *k, const float *v,
                                 const float *sinks, int window, int batch, int seq, int nh, int nkv, int hd,
                                 void *scratch, size_t scratch_bytes, struct rf_device_stream *stream);
  void (*attention_sink_backward)(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                  const float *y, const float *lse, const float *q, const float *k,
                                  const float *v, const float *sinks, int window, int batch, int seq, int nh,
                                  int nkv, int hd, void *scratch, size_t scratch_bytes,
                                  struct rf_device_stream *stream);
  /* rf_model_swiglu_clamp_forward, _backward; rf_model_weight_transpose, rf_model_transpose_add. */
  void (*swiglu_clamp_forward)(float *h, const float *gu, size_t n, float alpha, float limit,
                               struct rf_device_stream *stream);
  void (*swiglu_clamp_backward)(float *dgu, const float *dh, const float *gu, size_t n, float alpha,
                                float limit, struct rf_device_stream *stream);
  void (*weight_transpose)(float *dst, const struct rf_model_weight *w, int rows, int cols,
                           struct rf_device_stream *stream);
  void (*transpose_add)(float *dst, const float *src, int rows, int cols, struct rf_device_stream *stream);
  /* ---- DeepSeek-V3's multi-head latent attention (rf_model_kernels_missing_for asks for them of a
   * family with MLA only; the CUDA table's are mla_cuda.cu's, f32 in any compute dtype). ---- */
  /* rf_model_attention_mla_forward, _backward (y as attention_backward takes it); rf_model_mla_rope_apply,
   * rf_model_mla_kv_expand, _backward. */
  void (*mla_attention_forward)(float *y, float *lse, const float *q, const float *k, const float *v,
                                int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                void *scratch, size_t scratch_bytes, struct rf_device_stream *stream);
  void (*mla_attention_backward)(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                 const float *lse, const float *q, const float *k, const float *v, int batch,
                                 int seq, int nh, int nkv, int hd, int vd, float scale, void *scratch,
                                 size_t scratch_bytes, struct rf_device_stream *stream);
  void (*mla_rope_apply)(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                         const float *cos_t, const float *sin_t, int interleave, int inverse,
                         struct rf_device_stream *stream);
  void (*mla_kv_expand)(float *k, float *v, const float *kvb, const float *kpe, int n, int nh, int nope,
                        int rope, int dv, struct rf_device_stream *stream);
  void (*mla_kv_expand_backward)(float *dkvb, float *dkpe, const float *dk, const float *dv, int n, int nh,
                                 int nope, int rope, int vd, struct rf_device_stream *stream);
  /* ---- DeepSeek-V3's sigmoid group-limited router (rf_model_kernels_missing_for asks for them of a
   * MoE config of that router only; the CUDA table leaves them NULL). ---- */
  /* rf_model_router_group_forward (bias: f32 device memory [n_experts]; its choice scratch in
   * scratch, n_experts floats), rf_model_router_group_backward. */
  void (*router_group_forward)(float *scores, int32_t *top, float *topw, const float *logits,
                               const float *bias, int n, int n_experts, int n_group, int topk_group, int k,
                               int renorm, float scale, void *scratch, size_t scratch_bytes,
                               struct rf_device_stream *stream);
  void (*router_group_backward)(float *dlogits, const float *dtopw, const float *scores, const int32_t *top,
                                const float *topw, int n, int n_experts, int k, int renorm, float scale,
                                struct rf_device_stream *stream);
  /* ---- optional (never "missing"): bf16 compute's normalized activations straight in bf16, the
   * operand of the products after the norm (rf_model_stage.x16: one rounding instead of a cast per
   * product): rmsnorm_forward and rmsnorm_apply with out rounded to bf16 (to nearest even) and no
   * f32 out. The CUDA table's: fused_cuda.cu's rf_fused_add_rmsnorm_forward without a branch, and
   * rmsnorm_apply's kernel with a bf16 store. NULL (the host and checked tables): the f32 norm, then
   * the linear layer's cast for each product. ---- */
  void (*rmsnorm_forward_bf16)(uint16_t *out, float *rstd, const float *x, const float *w, int n_rows,
                               int dim, float eps, struct rf_device_stream *stream);
  void (*rmsnorm_apply_bf16)(uint16_t *out, const float *x, const float *rstd, const float *w, int n_rows,
                             int dim, struct rf_device_stream *stream);
};

/* The name of the first entry of k that is NULL ("linear_forward"), or NULL when every entry is set. */
const char *rf_model_kernels_missing(const struct rf_model_kernels *k);
/* The same for a model of cfg: the router's and the MoE layer's entries only for a MoE model, the
 * attention_sink_ ones for a family with sinks, swiglu_clamp_ and the transposes for GPT-OSS's experts,
 * the mla_ ones for a family with multi-head latent attention (DeepSeek-V3), the router_group_ ones for
 * a config of DeepSeek-V3's router with a MoE layer (an all-dense one calls no router). */
const char *rf_model_kernels_missing_for(const struct rf_model_kernels *k, const struct rf_model_config *cfg);

/* The host ops of ops.c and moe.c (kernels_host.c). */
extern const struct rf_model_kernels rf_model_kernels_host;
/* The host ops launched on the checked device's streams (kernels_checked.c): every pointer
 * argument (a weight's and the stage's too) is viewed inside the launched code, so the
 * arithmetic is the host table's, bit for bit, on memory the host thread cannot read. */
extern const struct rf_model_kernels rf_model_kernels_checked;
/* The CUDA kernels (kernels_cuda.cu; defined in BACKEND=cuda builds only). */
extern const struct rf_model_kernels rf_model_kernels_cuda;

#ifdef __cplusplus
}
#endif

#endif
