/* src/model: the decoder's workspace and its step (model.c; the MoE block in
 * moe.c): the activations of B sequences of T tokens on a device, the forward
 * and backward of each unit through the workspace's kernel table (kernels.h),
 * the load-balancing loss, sampling. The math of each piece is in ops.h; the
 * units and the slots of a layer's tensors in desc.h. */
#ifndef RF_MODEL_WORKSPACE_H
#define RF_MODEL_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h" /* struct rf_device: where the workspace lives */
#include "model/config.h"  /* struct rf_model_config */
#include "model/desc.h"    /* enum rf_model_layer_tensor: the slots of a layer's tensors */
#include "model/kernels.h" /* struct rf_model_kernels: the compute on activations */
#include "model/ops.h"     /* struct rf_model_weight, struct rf_model_stage */

/* ---- workspace (activations) ----------------------------------------------------- */

/* Everything a step needs, allocated once by rf_model_ws_init for a capacity of
 * B sequences of T tokens: per layer the activations the backward reads, the
 * logits, the gradient of the residual stream, scratch for recomputation and bf16
 * staging, the rotary tables. Owns all its buffers (free with rf_model_ws_free).
 * Nothing is allocated inside forward/backward. */
/* A MoE layer's activations (mixtral), for the backward. Tokens are grouped by
 * expert: expert e's rows are [off[e], off[e+1]) of the grouped buffers, in token
 * order, padded with zero rows to a multiple of the workspace's expert_rows. */
struct rf_model_moe_acts {
  float *probs;       /* [N, E] router softmax (deepseek_v3: the sigmoid scores) */
  int32_t *top;       /* [N, k] chosen experts, by decreasing probability */
  float *topw;        /* [N, k] their renormalized weights */
  int32_t *pos;       /* [N, k] the grouped row of each (token, choice) */
  int32_t *tok;       /* [P] the token of each grouped row, -1 for padding */
  int32_t *off;       /* [E + 1] */
  float *gu;          /* [P, 2*inter] gate_up_proj outputs */
  float *ey;          /* [P, hidden] expert outputs (before the routing weights) */
  float *sgate, *sup; /* deepseek_v3: [N, n_shared_experts * moe_inter] the shared experts' gate, up */
  int index;          /* the layer's place among the MoE layers (its row of ws->moe_load) */
};

struct rf_model_layer_acts {
  int8_t
      slot[RF_MODEL_LAYER_TENSOR_COUNT]; /* where each tensor is in this layer's unit (rf_model_layer_slot) */
  float *x;                              /* [N, hidden] the layer's input (residual stream) */
  float *rstd1;                          /* [N] input_layernorm's 1/rms */
  float *q;                              /* [N, heads*hd] after rotary */
  float *k;                              /* [N, kv*hd] after rotary */
  float *v;                              /* [N, kv*hd] */
  float *lse;           /* [B, heads, T] log-sum-exp of each attention row (P is recomputed) */
  float *atty;          /* [N, heads*hd] attention output before o_proj */
  float *x2;            /* [N, hidden] residual after attention */
  float *rstd2;         /* [N] post_attention_layernorm's 1/rms */
  float *q_pre, *k_pre; /* qwen3_moe: [N, heads*hd], [N, kv*hd] q and k before their norms */
  float *rstdq, *rstdk; /* qwen3_moe: [N*heads], [N*kv] the q/k norms' 1/rms */
  float *qa, *rstdqa;   /* MLA with q_lora_rank: [N, q_lora_rank] q_a_proj's output, [N] its norm's 1/rms */
  float *ckv, *rstdkv;  /* MLA: [N, kv_lora_rank] the compressed kv before kv_a_layernorm, [N] its 1/rms
                         * (k [N, heads*hd] holds each head's (k_nope, rotated k_pe); v, atty: v_head_dim) */
  float *gate;          /* [N, inter] gate_proj output (dense layers) */
  float *up;            /* [N, inter] up_proj output (dense layers) */
  struct rf_model_moe_acts moe; /* MoE layers */
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
  float *s_norm;       /* [N, hidden] normalized activations (recomputed in backward) */
  float *s_dnorm;      /* [N, hidden] their gradient */
  float *s_inner;      /* [N, inter] silu(gate)*up, then dh */
  float *s_inner2;     /* [N, inter] */
  float *s_qkv;        /* [N, (heads + 2*kv)*hd] dq, dk, dv */
  float *s_att;        /* [N, heads*hd] */
  float *s_normw;      /* [hidden] a norm weight converted from bf16 */
  float *s_bias;       /* [max(hidden, inter, heads*hd)] a bias converted from bf16 (biased configs) */
  float *s_wt, *s_gwt; /* gpt_oss: one expert's [in, out] weights as [out, in] (gate_up [2*inter,
                        * hidden], then down [hidden, inter]) and their gradients before the transpose */
  struct rf_model_stage stage; /* f32 compute: wf32 [RF_MODEL_STAGE_ROWS, max(hidden, inter, heads*hd)];
                                * bf16 compute: see rf_model_ws_set_compute */
  /* MoE (mixtral): expert products take expert_rows rows at a time (fixed shapes:
   * no product shape is new after the first step); moe_cap grouped rows at most */
  int expert_rows, moe_cap;
  float *s_xg, *s_hg, *s_dgu, *s_dxg; /* [moe_cap, hidden / inter / 2*inter / hidden] */
  float *s_dprobs;                    /* [N, E] */
  float *s_qkn;                       /* qwen3_moe: [N, (heads + kv)*hd] the gradients before the q/k norms */
  /* MLA (deepseek_v3): kv_b_proj's output [N, heads*(nope + v_head_dim)], then its gradient; the rotary
   * key [N, rope], then its gradient; the normed compressed kv [N, kv_lora_rank], its gradient after and
   * before the norm; the same three for the low-rank q [N, q_lora_rank] */
  float *s_kvb, *s_kpe, *s_cn, *s_dcn, *s_dckv, *s_qan, *s_dqan, *s_dqa;
  double *moe_count, *moe_psum; /* [E] the last forward's top-k assignments and probability sums */
  float *moe_balance;           /* [E] d(loss)/d(prob) of the load-balancing loss (backward) */
  double *moe_load;             /* deepseek_v3: [MoE layers, E] each layer's top-k assignments, added up
                                 * over forwards until rf_model_ws_moe_load_reset (the balancing bias) */
  int32_t *moe_off;             /* owned, HOST memory [E + 1]: a layer's expert offsets read back */
  float *moe_balance_host;      /* owned, HOST memory [E]: moe_balance before its upload */
  /* the compute on activations (src/model/kernels.h): its table, the stream it runs on (NULL: the
   * device's default), its scratch (kern->scratch_bytes for the capacity; the host's: attention's
   * blocks, one [2, RF_MODEL_ATT_BLOCK, T] slice per thread) and the loss sum it writes (one double) */
  const struct rf_model_kernels *kern;
  struct rf_device_stream *stream;     /* borrowed (the runtime's compute stream) or own_stream */
  struct rf_device_stream *own_stream; /* owned by rf_model_ws_init's workspace (its host device's) */
  void *scratch;
  size_t scratch_bytes;
  double *loss;
  size_t bytes; /* total allocated */
  /* where every buffer above lives: the device given to rf_model_ws_init_on (borrowed) or the
   * host (rf_model_ws_init: host_dev); each buffer is one rf_device_alloc, listed in bufs so that
   * rf_model_ws_free releases exactly what was allocated */
  struct rf_device host_dev;
  struct rf_device *dev;
  void **bufs; /* owned: [n_bufs] */
  int n_bufs, cap_bufs;
};

/* Allocates for up to B sequences of T tokens (T <= max_position_embeddings), in
 * host memory. Returns 0, or -1 on bad sizes. */
int rf_model_ws_init(struct rf_model_ws *ws, const struct rf_model_config *cfg, int batch, int seq);
/* The same on `dev` (borrowed; it outlives the workspace), whose counters count
 * the allocations; every buffer above is device memory of dev (the host reads none of
 * them but through rf_device_copy: rf_model_ws_read_logits, rf_model_ws_moe_stats), the
 * compute is dev's backend's kernel table on `stream`. Refused (-1, naming the device and
 * the entry) when that table lacks an entry (the CUDA table has no linear layers yet), or
 * when it is a host-memory table and dev's memory is not the host's. */
int rf_model_ws_init_on(struct rf_model_ws *ws, struct rf_device *dev, struct rf_device_stream *stream,
                        const struct rf_model_config *cfg, int batch, int seq);
void rf_model_ws_free(struct rf_model_ws *ws);
/* The bytes rf_model_ws_init would allocate (ws->bytes after it), for memory
 * predictions; depends on omp_get_max_threads() (attention scratch per thread). */
size_t rf_model_ws_bytes(const struct rf_model_config *cfg, int batch, int seq);
/* The linear layers' compute dtype (RF_DTYPE_F32, the default, or RF_DTYPE_BF16).
 * bf16 allocates its staging (rf_model_ws_compute_bytes more bytes, counted in
 * ws->bytes); call at set-up. -1 on another dtype. */
int rf_model_ws_set_compute(struct rf_model_ws *ws, enum rf_dtype compute);
size_t rf_model_ws_compute_bytes(const struct rf_model_config *cfg, int batch, int seq,
                                 enum rf_dtype compute);
/* FP8 block mode: allocates the linear layers' FP8 staging (counted in ws->bytes),
 * used by the linears whose weight comes as codes; pow2: power-of-two scales for
 * the activations and output gradients too. Call at set-up. */
int rf_model_ws_set_fp8(struct rf_model_ws *ws, int pow2); /* -1: a device without the FP8 products (CUDA) */
/* The bytes rf_model_ws_set_fp8 adds for a workspace of batch x seq. */
size_t rf_model_ws_fp8_bytes(const struct rf_model_config *cfg, int batch, int seq);
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
/* As rf_model_head_forward, the loss sum left in ws->loss (device memory, one f64) unread: no wait. */
void rf_model_head_forward_on_device(struct rf_model_ws *ws, const struct rf_model_weight *w,
                                     const int32_t *targets);
/* Row n = b*t + position of the logits, [vocab]. Borrowed; device memory of the workspace
 * (the host reads it only where the workspace is in host memory). */
const float *rf_model_ws_logits(const struct rf_model_ws *ws, int row);
/* Copies `rows` rows of the logits from row `row` into out [rows, vocab] (host memory); waits for
 * the workspace's stream. */
void rf_model_ws_read_logits(const struct rf_model_ws *ws, int row, int rows, float *out);
/* Copies the last forward's router statistics (ws->moe_count, moe_psum, [E] each) into the host
 * arrays count and psum; waits for the workspace's stream. A MoE config only. */
void rf_model_ws_moe_stats(const struct rf_model_ws *ws, double *count, double *psum);
/* DeepSeek-V3's loads (ws->moe_load, a config of its router with MoE layers only): zeroed on the
 * workspace's stream; copied into load [MoE layers, E] (host memory), waiting for the stream. */
void rf_model_ws_moe_load_reset(struct rf_model_ws *ws);
void rf_model_ws_moe_load_read(const struct rf_model_ws *ws, double *load);
/* The workspace's linear layers: ws->kern's linear_forward / _backward on ws->stream with the stage
 * st (ws->stage, or a copy of it), then st's progress callback, on the host thread. */
void rf_model_ws_linear_forward(struct rf_model_ws *ws, float *y, const float *x,
                                const struct rf_model_weight *w, int n, int in, int out, float beta,
                                const struct rf_model_stage *st);
void rf_model_ws_linear_backward(struct rf_model_ws *ws, float *dx, float *dw, const float *dy,
                                 const float *x, const struct rf_model_weight *w, int n, int in, int out,
                                 float beta, const struct rf_model_stage *st);
/* Adds grad_scale * d(loss_sum)/d(params) of the head into grads[0..1] and sets
 * ws->dx to the gradient of the last layer's output. Needs a head forward with
 * targets just before (asserted). */
void rf_model_head_backward(struct rf_model_ws *ws, const struct rf_model_weight *w, float *const *grads,
                            float grad_scale);
void rf_model_layer_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                             float *const *grads);
void rf_model_embed_backward(struct rf_model_ws *ws, float *const *grads);

/* ---- mixture of experts (moe.c) ------------------------------------------------------- */

/* The load-balancing loss of transformers' load_balancing_loss_func over the
 * router statistics of a forward summed over layers (and ranks): counts[e] top-k
 * assignments, probs[e] router probability sums, rows = tokens * layers:
 *   aux = E * sum_e (counts[e] / rows) * (probs[e] / rows).
 * Sets the backward's d(loss)/d(prob[row, e]) = grad_weight * E * counts[e] / rows^2
 * (grad_weight: the loss's derivative in aux, e.g. router_aux_loss_coef; counts
 * take no gradient). Until it is called after a forward, the backward adds none.
 * counts and probs are host memory (rf_model_ws_moe_stats, summed over ranks); the
 * gradient is uploaded on the workspace's stream. Returns aux. */
double rf_model_moe_balance(struct rf_model_ws *ws, const double *counts, const double *probs, double rows,
                            float grad_weight);

/* The MoE block of layer l: out [n, hidden] += sum_j topw[j] * expert_top[j](xn),
 * expert(x) = down(silu(gate(x)) * up(x)); w: the router, gate_up, down tensors.
 * Adds the router statistics into ws->moe_count, moe_psum. */
/* A bias (or sinks) of n floats at element off of w as f32: borrowed, or converted into ws->s_bias. */
const float *rf_model_ws_bias_f32(struct rf_model_ws *ws, const struct rf_model_weight *w, size_t off, int n);
void rf_model_moe_forward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w, const float *xn,
                          float *out);
/* dxn [n, hidden] = d/dxn given dout (overwritten); grads (router, gate_up, down) added. */
void rf_model_moe_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                           const float *xn, const float *dout, float *dxn, float *const *grads);

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

#endif
