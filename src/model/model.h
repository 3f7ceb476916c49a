/* src/model: a LLaMA-style decoder (Hugging Face LlamaForCausalLM's math, tensor
 * names and [out, in] weight layouts), forward and backward on the CPU.
 *
 * The model is a user of the library: it knows nothing of MPI or of the runtime.
 * It receives each unit's weights as pointers (f32 or bf16) and ADDS its
 * gradients into f32 buffers it is given (the caller zeroes them).
 *
 * Units (the trainer declares them, and their tensors, in this order):
 *   unit 0        model.embed_tokens.weight                       [vocab, hidden]
 *   unit 1 + l    model.layers.{l}.input_layernorm.weight          [hidden]
 *                 model.layers.{l}.self_attn.q_proj.weight         [heads*hd, hidden]
 *                 model.layers.{l}.self_attn.k_proj.weight         [kv*hd, hidden]
 *                 model.layers.{l}.self_attn.v_proj.weight         [kv*hd, hidden]
 *                 model.layers.{l}.self_attn.o_proj.weight         [hidden, heads*hd]
 *                 model.layers.{l}.post_attention_layernorm.weight [hidden]
 *                 model.layers.{l}.mlp.gate_proj.weight            [inter, hidden]
 *                 model.layers.{l}.mlp.up_proj.weight              [inter, hidden]
 *                 model.layers.{l}.mlp.down_proj.weight            [hidden, inter]
 *   unit 1 + L    model.norm.weight                                [hidden]
 *                 lm_head.weight                                   [vocab, hidden]
 *
 * One step on a local batch of B sequences of T tokens (N = B*T rows):
 *   rf_model_embed_forward; rf_model_layer_forward(l) for l = 0..L-1;
 *   loss_sum = rf_model_head_forward(targets);
 *   rf_model_head_backward(grad_scale); rf_model_layer_backward(l) for l = L-1..0;
 *   rf_model_embed_backward.
 * The head returns the SUM of the token losses; grad_scale (e.g. 1 / global token
 * count) multiplies d(loss_sum)/d(logits), so every gradient added is that of
 * grad_scale * loss_sum. Only the head backward takes it: the rest is linear.
 *
 * Matmuls: cblas_sgemm with f32 weights. With bf16 weights: cblas_sbgemm with the
 * activation operand rounded to bf16 (forward Y = X W^T and backward dX = dY W)
 * when the linked OpenBLAS has it, else the weight widened to f32 a block of rows
 * at a time and sgemm. The weight-gradient products dW += dY^T X always run in f32
 * from f32 activations. */
#ifndef RF_MODEL_H
#define RF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "rfsdp_types.h" /* struct rf_init */

/* ---- configuration ---------------------------------------------------------- */

/* Hugging Face config.json fields (plus head_dim = hidden_size / num_attention_heads). */
struct rf_model_config {
  int hidden_size;
  int intermediate_size;
  int num_hidden_layers;
  int num_attention_heads;
  int num_key_value_heads;
  int vocab_size;
  int max_position_embeddings;
  int head_dim;
  float rms_norm_eps;
  double rope_theta;
};

/* Reads a Hugging Face config.json. Errors name the file and the field: missing,
 * not a number, non-positive, heads not dividing hidden, kv heads not dividing
 * heads, model_type other than "llama", tie_word_embeddings true (unsupported).
 * num_key_value_heads defaults to num_attention_heads, rms_norm_eps to 1e-6,
 * rope_theta to 10000, max_position_embeddings to 2048 when absent. */
int rf_model_config_load(struct rf_model_config *cfg, const char *path);
/* Checks the fields (and sets head_dim); `what` names the source in messages. */
int rf_model_config_check(struct rf_model_config *cfg, const char *what);

/* All parameters, and those taking part in matmuls (all but the embedding). */
int64_t rf_model_n_params(const struct rf_model_config *cfg);
int64_t rf_model_n_matmul_params(const struct rf_model_config *cfg);
/* Training FLOPs per token at sequence length T (forward + backward):
 * 6 * matmul params + 12 * layers * heads * head_dim * T (attention scores and
 * values, forward 4*T*hd per head, counted over the full T x T matrices). */
double rf_model_flops_per_token(const struct rf_model_config *cfg, int seq);

/* ---- units and tensors -------------------------------------------------------- */

#define RF_MODEL_NAME_MAX 96

struct rf_model_tensor_spec {
  char name[RF_MODEL_NAME_MAX];
  int ndim;         /* 1 or 2 */
  int64_t shape[2]; /* row-major; [out, in] for linear weights */
  struct rf_init init;
};

/* num_hidden_layers + 2. */
int rf_model_n_units(const struct rf_model_config *cfg);
/* 1 (embedding), 9 (a layer), 2 (final norm + head). */
int rf_model_unit_n_tensors(const struct rf_model_config *cfg, int unit);
/* "embed", "layers.{l}", "head". */
void rf_model_unit_name(const struct rf_model_config *cfg, int unit, char *buf, size_t size);
/* Tensor i of the unit: HF name, shape and init (norm weights: const 1; others
 * normal std 0.02, o_proj and down_proj scaled by 1/sqrt(2 * layers)). */
void rf_model_unit_tensor(const struct rf_model_config *cfg, int unit, int i,
                          struct rf_model_tensor_spec *out);

/* Index of the tensors inside a layer unit. */
enum rf_model_layer_tensor {
  RF_MODEL_LAYER_TENSOR_INPUT_NORM = 0,
  RF_MODEL_LAYER_TENSOR_Q,
  RF_MODEL_LAYER_TENSOR_K,
  RF_MODEL_LAYER_TENSOR_V,
  RF_MODEL_LAYER_TENSOR_O,
  RF_MODEL_LAYER_TENSOR_POST_NORM,
  RF_MODEL_LAYER_TENSOR_GATE,
  RF_MODEL_LAYER_TENSOR_UP,
  RF_MODEL_LAYER_TENSOR_DOWN,
  RF_MODEL_LAYER_TENSOR_COUNT
};
enum rf_model_head_tensor {
  RF_MODEL_HEAD_TENSOR_NORM = 0,
  RF_MODEL_HEAD_TENSOR_LM_HEAD,
  RF_MODEL_HEAD_TENSOR_COUNT
};

/* One tensor's weights as the runtime gives them: exactly one pointer is non-NULL
 * (bf16 when parameters are gathered in bf16). Borrowed. */
struct rf_model_weight {
  const float *f32;
  const uint16_t *bf16;
};

/* Staging for bf16 weights. With cblas_sbgemm (OpenBLAS built with BUILD_BFLOAT16):
 * act holds the activation operand rounded to bf16 ([n, max(in, out)]). Without
 * it: wf32 holds RF_MODEL_STAGE_ROWS rows of the weight widened to f32, and the
 * product runs in sgemm, block by block. Borrowed (the workspace owns them). */
#define RF_MODEL_STAGE_ROWS 256
struct rf_model_stage {
  uint16_t *act;
  float *wf32;
  /* Called after every linear op's matmuls when set (the trainer drives MPI
   * progress of the runtime's prefetches with it). Borrowed; NULL: none. */
  void (*progress)(void *ctx);
  void *progress_ctx;
};

/* ---- workspace (activations) ----------------------------------------------------- */

/* Everything a step needs, allocated once by rf_model_ws_init for a capacity of
 * B sequences of T tokens: per layer the activations the backward reads, the
 * logits, the gradient of the residual stream, scratch for recomputation and bf16
 * staging, the rotary tables. Owns all its buffers (free with rf_model_ws_free).
 * Nothing is allocated inside forward/backward. */
struct rf_model_layer_acts {
  float *x;     /* [N, hidden] the layer's input (residual stream) */
  float *rstd1; /* [N] input_layernorm's 1/rms */
  float *q;     /* [N, heads*hd] after rotary */
  float *k;     /* [N, kv*hd] after rotary */
  float *v;     /* [N, kv*hd] */
  float *lse;   /* [B, heads, T] log-sum-exp of each attention row (P is recomputed) */
  float *atty;  /* [N, heads*hd] attention output before o_proj */
  float *x2;    /* [N, hidden] residual after attention */
  float *rstd2; /* [N] post_attention_layernorm's 1/rms */
  float *gate;  /* [N, inter] gate_proj output */
  float *up;    /* [N, inter] up_proj output */
};

struct rf_model_ws {
  struct rf_model_config cfg;
  int cap_b, cap_t;                   /* capacity */
  int b, t;                           /* current shape (rf_model_ws_set_shape), b*t rows */
  int32_t *tokens;                    /* [cap_b*cap_t] copy of the inputs of the last embed forward */
  int32_t *targets;                   /* [cap_b*cap_t] copy of the targets of the last head forward */
  int has_targets;                    /* the last head forward had targets (the head backward needs them) */
  struct rf_model_layer_acts *layers; /* [num_hidden_layers] */
  float *xf;                          /* [N, hidden] final input to the head (= output of the last layer) */
  float *rstdf;                       /* [N] final norm's 1/rms */
  float *xnf;                         /* [N, hidden] final norm output */
  float *logits;                      /* [N, vocab]; after head backward: the logits' gradient */
  float *lse;                         /* [N] log-sum-exp of each logits row */
  float *dx;                          /* [N, hidden] gradient of the residual stream (backward) */
  float *rope_cos;                    /* [cap_t, hd/2] */
  float *rope_sin;                    /* [cap_t, hd/2] */
  /* scratch, reused by every layer */
  float *s_norm;               /* [N, hidden] normalized activations (recomputed in backward) */
  float *s_dnorm;              /* [N, hidden] their gradient */
  float *s_inner;              /* [N, inter] silu(gate)*up, then dh */
  float *s_inner2;             /* [N, inter] */
  float *s_qkv;                /* [N, (heads + 2*kv)*hd] dq, dk, dv */
  float *s_att;                /* [N, heads*hd] */
  float *s_att_blk;            /* [threads, 2, RF_MODEL_ATT_BLOCK, T] attention blocks (P, dP) */
  float *s_normw;              /* [hidden] a norm weight converted from bf16 */
  struct rf_model_stage stage; /* bf16 weights: act [N, max(hidden, inter, heads*hd, vocab)] (only
                                * with cblas_sbgemm), wf32 [RF_MODEL_STAGE_ROWS, max(hidden, inter)] */
  int n_threads_att;           /* slices of s_att_blk */
  size_t bytes;                /* total allocated */
};

/* Allocates for up to B sequences of T tokens (T <= max_position_embeddings).
 * Returns 0, or -1 on bad sizes. */
int rf_model_ws_init(struct rf_model_ws *ws, const struct rf_model_config *cfg, int batch, int seq);
void rf_model_ws_free(struct rf_model_ws *ws);
/* The bytes rf_model_ws_init would allocate (ws->bytes after it), for memory
 * predictions; depends on omp_get_max_threads() (attention scratch per thread). */
size_t rf_model_ws_bytes(const struct rf_model_config *cfg, int batch, int seq);
/* Uses the first b sequences of t tokens of the capacity (e.g. a growing prefix
 * when sampling). Returns -1 when above capacity. */
int rf_model_ws_set_shape(struct rf_model_ws *ws, int b, int t);

/* ---- forward and backward ------------------------------------------------------------ */

/* tokens [b*t] (each in [0, vocab)) -> the residual stream. w: unit 0's weights.
 * Returns -1 when a token is out of range. */
int rf_model_embed_forward(struct rf_model_ws *ws, const struct rf_model_weight *w, const int32_t *tokens);
/* Layer l; w: the unit's 9 tensors in order. */
void rf_model_layer_forward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w);
/* Final norm, logits and (when targets is non-NULL) the SUM of the token losses
 * (targets < 0 are ignored). The logits stay readable (rf_model_ws_logits) until
 * the head backward. Returns the loss sum, 0 without targets. */
double rf_model_head_forward(struct rf_model_ws *ws, const struct rf_model_weight *w, const int32_t *targets);
/* Row n = b*t + position of the logits, [vocab]. Borrowed. */
const float *rf_model_ws_logits(const struct rf_model_ws *ws, int row);
/* Adds grad_scale * d(loss_sum)/d(params) of the head into grads[0..1] and sets
 * ws->dx to the gradient of the last layer's output. Needs a head forward with
 * targets just before (asserted). */
void rf_model_head_backward(struct rf_model_ws *ws, const struct rf_model_weight *w, float *const *grads,
                            float grad_scale);
void rf_model_layer_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                             float *const *grads);
void rf_model_embed_backward(struct rf_model_ws *ws, float *const *grads);

/* ---- sampling ------------------------------------------------------------------------- */

/* A token drawn from softmax(logits / temperature) with the caller's RNG state
 * (splitmix64, advanced); temperature <= 0 gives the argmax. */
int rf_model_sample_logits(const float *logits, int vocab, float temperature, uint64_t *rng);
/* Convenience when every unit's weights are at hand (units[u] = unit u's tensors):
 * extends tokens[0..len) to tokens[0..total) one token at a time, recomputing the
 * prefix (the last `ws->cap_t` tokens) each time. ws must have cap_b >= 1.
 * Returns -1 on a bad token or length. */
int rf_model_generate(struct rf_model_ws *ws, const struct rf_model_weight *const *units, int32_t *tokens,
                      int len, int total, float temperature, uint64_t *rng);

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
/* The exp() of the softmax and SiLU loops (vectorizable; relative error < 2e-7). */
float rf_model_expf(float x);
/* h = silu(gate) * up; backward overwrites dgate, dup. */
void rf_model_swiglu_forward(float *h, const float *gate, const float *up, size_t n);
void rf_model_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                              size_t n);
/* 1 when the linked OpenBLAS provides cblas_sbgemm. */
int rf_model_have_sbgemm(void);
/* y [n, out] = x [n, in] W^T + beta * y, W [out, in] f32 or bf16 (st: staging,
 * used only for bf16 weights). */
void rf_model_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                             int out, float beta, const struct rf_model_stage *st);
/* dx [n, in] = dy W + beta * dx (skipped when dx is NULL); dw [out, in] += dy^T x
 * (skipped when dw is NULL). */
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

#endif
