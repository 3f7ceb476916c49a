/* src/model: model families and a LLaMA-style decoder.
 *
 * Families (llama, qwen2, gpt_oss, deepseek_v3, mixtral, qwen3_moe) are read from a Hugging Face
 * config.json by one reader (config.c) and described as units of tensors (names
 * and shapes as in their checkpoints, desc.c); a units file describes any other
 * model (units_file.c). The description is the one source of the planner's
 * tensor list (`rfsdp plan`) and of the tensors the trainer declares.
 *
 * The LLaMA decoder (model.c, ops.c) has Hugging Face LlamaForCausalLM's math,
 * tensor names and [out, in] weight layouts, forward and backward on the CPU. It
 * is a user of the library: it knows nothing of MPI or of the runtime. It
 * receives each unit's weights as pointers (f32 or bf16) and ADDS its gradients
 * into f32 buffers it is given (the caller zeroes them).
 *
 * Its units, in the order of rf_model_desc_make:
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
 * Matmuls: src/gemm (oneDNN). The compute dtype (rf_model_ws_set_compute) picks the
 * operands of the linear layers' products: f32, or bf16 (activations and output
 * gradients rounded to bf16, bf16 weights used as gathered, f32 weights rounded)
 * with f32 accumulation and f32 outputs. f32 compute with bf16 weights widens the
 * weight to f32 a block of rows at a time. Everything else (norms, rotary,
 * attention with its softmax, SwiGLU, the residual stream, the loss) is f32 in
 * both; docs/precision.md lists it. */
#ifndef RF_MODEL_H
#define RF_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "device/device.h" /* struct rf_device: where the workspace lives */
#include "model/kernels.h" /* struct rf_model_kernels: the compute on activations */
#include "plan/plan.h"     /* struct rf_plan_unit_in */
#include "rfsdp_types.h"   /* struct rf_init */

/* ---- configuration (config.c) ----------------------------------------------- */

/* The model families a Hugging Face config.json may name (model_type). llama
 * and qwen2 are trainable; every family can be described (and planned). */
enum rf_model_family {
  RF_MODEL_FAMILY_LLAMA = 0,
  RF_MODEL_FAMILY_QWEN2,       /* llama with q, k, v biases (no o bias) */
  RF_MODEL_FAMILY_GPT_OSS,     /* fused experts, attention sinks */
  RF_MODEL_FAMILY_DEEPSEEK_V3, /* multi-head latent attention, routed and shared experts */
  RF_MODEL_FAMILY_MIXTRAL,     /* llama attention, a router and fused SwiGLU experts (trainable) */
  RF_MODEL_FAMILY_QWEN3_MOE,   /* mixtral's experts, q/k norms, dense layers (mlp_only_layers) */
  RF_MODEL_FAMILY_COUNT
};

/* "llama", "qwen2", "gpt_oss", "deepseek_v3", "mixtral", "qwen3_moe" (the model_type). */
const char *rf_model_family_name(enum rf_model_family family);
/* 1 for the families rfsdp trains (llama, qwen2, mixtral, qwen3_moe); the others are planned only.
 * The name lists of messages and --help come from these (rf_train_model_families). */
int rf_model_family_trainable(enum rf_model_family family);

#define RF_MODEL_CONFIG_WORD 32

struct rf_model_config_deepseek_v3 {
  int moe_intermediate_size, n_routed_experts, n_shared_experts, first_k_dense_replace, moe_layer_freq;
  int q_lora_rank; /* 0: no low-rank query projection */
  int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int num_experts_per_tok; /* routed experts per token; 0 when the config leaves it out */
};

/* Hugging Face config.json fields. */
struct rf_model_config {
  enum rf_model_family family;
  int hidden_size;
  int intermediate_size;
  int num_hidden_layers;
  int num_attention_heads;
  int num_key_value_heads;
  int vocab_size;
  int max_position_embeddings;
  int head_dim; /* llama: hidden_size / num_attention_heads unless given */
  float rms_norm_eps;
  double rope_theta;
  int tie_word_embeddings, attention_bias, mlp_bias;
  char rope_type[RF_MODEL_CONFIG_WORD];  /* "default" unless rope_scaling/rope_parameters names one */
  const char *rope_field;                /* the field that named it ("" when none did) */
  const char *sliding_field;             /* qwen2: the field asking for sliding-window attention, or "" */
  char hidden_act[RF_MODEL_CONFIG_WORD]; /* "silu" unless given */
  double attention_dropout;              /* 0 unless given */
  double partial_rotary_factor;          /* 1 unless given (0: unset, as 1) */
  struct {
    int num_local_experts;
    int num_experts_per_tok; /* 0 when the config leaves it out */
  } gpt_oss;
  struct rf_model_config_deepseek_v3 deepseek_v3;
  /* mixtral: num_local_experts experts of intermediate_size, num_experts_per_tok of
   * them per token; the load-balancing loss (router_aux_loss_coef) is part of the
   * loss only when output_router_logits is true, as in transformers. */
  struct {
    int num_local_experts, num_experts_per_tok;
    /* the fields as the config spells them (qwen3_moe: "num_experts"), and whether
     * num_experts_per_tok was written (else the family's default), for messages */
    const char *experts_field;
    int topk_given;
    double router_aux_loss_coef, router_jitter_noise;
    int output_router_logits;
    /* qwen3_moe: experts of moe_intermediate_size (the dense layers' MLP is of
     * intermediate_size); a layer is dense when listed in mlp_only_layers (a bit
     * mask of layers < 64 here: dense_mask) or when (l + 1) % decoder_sparse_step != 0;
     * norm_topk_prob renormalizes the top-k weights (mixtral always does) */
    int moe_intermediate_size, decoder_sparse_step, norm_topk_prob;
    uint64_t dense_mask;
  } moe;
};

/* Layer l of a model with routed experts (mixtral, qwen3_moe) has them (1) or a dense MLP (0). */
int rf_model_config_layer_is_moe(const struct rf_model_config *cfg, int l);
/* The layers with routed experts (their router statistics make the load-balancing loss). */
int rf_model_config_moe_layers(const struct rf_model_config *cfg);

/* A family with routed experts that the trainable model implements (mixtral, qwen3_moe). */
int rf_model_config_is_moe(const struct rf_model_config *cfg);

/* The one reader of a Hugging Face config.json (model_type llama, gpt_oss or
 * deepseek_v3; absent: llama). Errors name the file and the field: malformed
 * JSON, an unknown model_type, a missing field, one that is not a positive
 * integer. Defaults: num_key_value_heads = num_attention_heads, rms_norm_eps
 * 1e-6, rope_theta 10000, max_position_embeddings 2048, tie_word_embeddings,
 * attention_bias (gpt_oss: true) and mlp_bias false, hidden_act silu. Reads
 * what the model's math depends on; rf_model_config_check says whether the
 * trainable model implements it. */
int rf_model_config_read(struct rf_model_config *cfg, const char *path);
/* The same from text (path names the source in messages). */
int rf_model_config_parse(struct rf_model_config *cfg, const char *text, size_t n, const char *path);
/* The JSON of a config or units file (NULL with the error set, naming path), and
 * a config from it: the pieces rf_model_desc_parse shares with the above. */
struct cJSON *rf_model_json_parse(const char *text, size_t n, const char *path);
int rf_model_config_from_json(struct rf_model_config *cfg, const struct cJSON *root, const char *path);
/* rf_model_config_read, then rf_model_config_check: a config the model trains. */
int rf_model_config_load(struct rf_model_config *cfg, const char *path);
/* Checks that the trainable model (a llama) implements the config, naming `what`
 * and the field otherwise: sizes positive, kv heads dividing heads, an even
 * head_dim (set to hidden_size / num_attention_heads when 0), plain RoPE over
 * the whole head, SiLU, no attention dropout. Tied embeddings, attention and
 * MLP biases and any head_dim are implemented (as transformers' LlamaForCausalLM). */
int rf_model_config_check(struct rf_model_config *cfg, const char *what);

/* All parameters, and those taking part in a token's matmuls (all but the
 * embedding; of routed experts (mixtral, qwen3_moe), the num_experts_per_tok a token meets). */
int64_t rf_model_n_params(const struct rf_model_config *cfg);
int64_t rf_model_n_matmul_params(const struct rf_model_config *cfg);
/* Training FLOPs per token at sequence length T (forward + backward = 3 x forward):
 * 6 * matmul params + 6 * layers * heads * head_dim * (T + 1). The attention term
 * is causal: the query at position t meets t + 1 keys, forward 4 * head_dim * (t + 1)
 * per head (scores and values), which averages to 2 * head_dim * (T + 1) per token.
 * Recomputation (the backward recomputes the scores) and the causal blocks'
 * skipped-but-computed upper triangles are not counted (docs/benchmarks.md). */
double rf_model_flops_per_token(const struct rf_model_config *cfg, int seq);

/* ---- descriptions: units and tensors (desc.c, units_file.c) ------------------------ */

/* One tensor of a model: Hugging Face name, shape, and what the trainer needs.
 * Owns name. */
struct rf_model_tensor {
  char *name;
  int ndim;
  int64_t shape[RF_MAX_DIMS]; /* row-major; [out, in] for linear weights */
  int64_t numel;
  int64_t sub_count;  /* > 1: sub_count equal sub-tensors fused along dim 0 (experts) */
  int64_t block_rows; /* > 0: rows per block of its own (units files); 0: the run's */
  int decay;          /* takes weight decay (linear weights; not norms, biases, embeddings) */
  int matrix;         /* a matrix between hidden states that Muon may orthogonalize */
  int fp8; /* a linear weight quantized under FP8 block training (not embeddings, norms, router, head) */
  struct rf_init init;
};

/* A unit (what the runtime gathers at once). Owns name and tensors. */
struct rf_model_unit {
  char *name;
  int64_t numel;
  int n_tensors;
  struct rf_model_tensor *tensors;
};

/* A model as units of tensors. Owns everything (rf_model_desc_free). */
struct rf_model_desc {
  char *model_type; /* rf_model_family_name, or "generic" (a units file) */
  int n_units;
  struct rf_model_unit *units;
  int64_t numel;   /* parameters */
  int n_tensors;   /* over all units */
  int max_tensors; /* of one unit */
  int too_large;   /* more than RF_MODEL_MAX_ELEMS parameters or RF_MODEL_MAX_TENSORS tensors: the
                    * description stopped there (readers refuse it) */
};

/* What a description may hold: beyond, rf_model_desc_make stops and sets too_large
 * (a config's sizes are only bounded one by one; their products overflow). */
#define RF_MODEL_MAX_ELEMS (INT64_C(1) << 50)
#define RF_MODEL_MAX_TENSORS (1 << 18)

/* The description of a config (every family), names and shapes as in the
 * family's Hugging Face checkpoints. llama: units "embed", "layers.{l}", "head";
 * norms const 1, other tensors normal std 0.02, o_proj and down_proj scaled by
 * 1/sqrt(2 * layers). */
void rf_model_desc_make(const struct rf_model_config *cfg, struct rf_model_desc *out);
/* A Hugging Face config.json (rf_model_config_read) or a units file (an object
 * with "units": [{"name", "tensors": [{"name", "shape", "block_rows"?,
 * "sub_count"?}]}]). Errors name the file and the field. */
int rf_model_desc_load(const char *path, struct rf_model_desc *out);
/* The same from text (path names the source in messages). */
int rf_model_desc_parse(const char *text, const char *path, struct rf_model_desc *out);
void rf_model_desc_free(struct rf_model_desc *desc);
/* Building one by hand: a unit (it becomes the current one), then its tensors
 * (sub_count 1, block_rows 0, no decay, init zeros; the caller may set them). */
void rf_model_desc_add_unit(struct rf_model_desc *desc, const char *name);
struct rf_model_tensor *rf_model_desc_add_tensor(struct rf_model_desc *desc, const char *name, int ndim,
                                                 const int64_t *shape);
/* The planner's tensor list: every unit as the planner takes it, blocks by the
 * policy's rule (rf_plan_block_elems; a tensor's own block_rows wins). One
 * allocation: n_units units followed by their tensors (names borrowed from
 * desc); free() it. */
struct rf_plan_unit_in *rf_model_desc_plan_units(const struct rf_model_desc *desc,
                                                 const struct rf_plan_policy *p);

/* Every tensor a layer unit of a trainable family may hold, each under its own
 * name: two tensors never share a value, so a name cannot read another family's
 * tensor (slot 9 is q_proj.bias in a biased llama and q_norm in a qwen3_moe; no
 * enum value is both). Where a tensor sits in a layer's unit depends on the config
 * and, for qwen3_moe, on the layer: rf_model_layer_slot.
 *   llama, qwen2: the nine weights INPUT_NORM..DOWN, then the attention biases
 *     (attention_bias: q, k, v and, for llama, o; qwen2 always has q, k, v and never
 *     o) and the MLP biases (mlp_bias: gate, up, down) when the config has them.
 *   mixtral: the first six (input norm, q, k, v, o, post-attention norm; no
 *     biases), then the router and the fused experts:
 *       mlp.gate.weight              [E, hidden]            ROUTER
 *       mlp.experts.gate_up_proj     [E, 2*inter, hidden]   EXPERTS_GATE_UP (per expert: gate rows, then up)
 *       mlp.experts.down_proj        [E, hidden, inter]     EXPERTS_DOWN
 *     described with sub_count E and block_rows = one expert's rows, so that a
 *     layout keeping blocks whole keeps every expert on one rank.
 *   qwen3_moe: as mixtral with experts of moe_intermediate_size, or (a dense layer:
 *     mlp_only_layers, decoder_sparse_step) GATE, UP, DOWN in their place; then
 *     Q_NORM and K_NORM (RMSNorm over each head's head_dim, before the rotary
 *     embedding). */
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
  RF_MODEL_LAYER_TENSOR_Q_BIAS,
  RF_MODEL_LAYER_TENSOR_K_BIAS,
  RF_MODEL_LAYER_TENSOR_V_BIAS,
  RF_MODEL_LAYER_TENSOR_O_BIAS,
  RF_MODEL_LAYER_TENSOR_GATE_BIAS,
  RF_MODEL_LAYER_TENSOR_UP_BIAS,
  RF_MODEL_LAYER_TENSOR_DOWN_BIAS,
  RF_MODEL_LAYER_TENSOR_ROUTER,
  RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP,
  RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN,
  RF_MODEL_LAYER_TENSOR_Q_NORM,
  RF_MODEL_LAYER_TENSOR_K_NORM,
  RF_MODEL_LAYER_TENSOR_COUNT
};
/* The most tensors one layer unit holds (a llama with every bias): the size of a
 * unit's weight and gradient arrays. */
#define RF_MODEL_LAYER_MAX_TENSORS 16

/* Where tensor t is in layer `layer`'s unit of this config, or -1 when that layer
 * has none (a llama has no router; a qwen3_moe dense layer has no experts). */
int rf_model_layer_slot(const struct rf_model_config *cfg, int layer, enum rf_model_layer_tensor t);

/* The head unit: the final norm, then the output matrix (lm_head.weight, or
 * with tie_word_embeddings model.embed_tokens.weight, the embedding itself). */
enum rf_model_head_tensor {
  RF_MODEL_HEAD_TENSOR_NORM = 0,
  RF_MODEL_HEAD_TENSOR_LM_HEAD,
  RF_MODEL_HEAD_TENSOR_COUNT
};

/* Where a llama's units are (rf_model_desc_make's order): untied, units
 * "embed" (0), "layers.{l}" (1 + l), "head" (L + 1); tied, "layers.{l}" (l) and
 * "head" (L) holding the embedding as its output matrix, so that the one unit
 * gathered through the step serves the embedding and the output. */
struct rf_model_units {
  int embed_unit, embed_tensor; /* the embedding table */
  int first_layer;              /* layer l is unit first_layer + l */
  int head_unit;
};
void rf_model_units_find(const struct rf_model_config *cfg, struct rf_model_units *out);

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
};
struct rf_model_stage {
  enum rf_dtype compute;
  uint16_t *act, *act2, *wbf16;
  float *wf32;
  struct rf_model_fp8_stage fp8; /* allocated by rf_model_ws_set_fp8 (work NULL: not) */
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
/* A MoE layer's activations (mixtral), for the backward. Tokens are grouped by
 * expert: expert e's rows are [off[e], off[e+1]) of the grouped buffers, in token
 * order, padded with zero rows to a multiple of the workspace's expert_rows. */
struct rf_model_moe_acts {
  float *probs; /* [N, E] router softmax */
  int32_t *top; /* [N, k] chosen experts, by decreasing probability */
  float *topw;  /* [N, k] their renormalized weights */
  int32_t *pos; /* [N, k] the grouped row of each (token, choice) */
  int32_t *tok; /* [P] the token of each grouped row, -1 for padding */
  int32_t *off; /* [E + 1] */
  float *gu;    /* [P, 2*inter] gate_up_proj outputs */
  float *ey;    /* [P, hidden] expert outputs (before the routing weights) */
};

struct rf_model_layer_acts {
  int8_t
      slot[RF_MODEL_LAYER_TENSOR_COUNT]; /* where each tensor is in this layer's unit (rf_model_layer_slot) */
  float *x;                              /* [N, hidden] the layer's input (residual stream) */
  float *rstd1;                          /* [N] input_layernorm's 1/rms */
  float *q;                              /* [N, heads*hd] after rotary */
  float *k;                              /* [N, kv*hd] after rotary */
  float *v;                              /* [N, kv*hd] */
  float *lse;                   /* [B, heads, T] log-sum-exp of each attention row (P is recomputed) */
  float *atty;                  /* [N, heads*hd] attention output before o_proj */
  float *x2;                    /* [N, hidden] residual after attention */
  float *rstd2;                 /* [N] post_attention_layernorm's 1/rms */
  float *q_pre, *k_pre;         /* qwen3_moe: [N, heads*hd], [N, kv*hd] q and k before their norms */
  float *rstdq, *rstdk;         /* qwen3_moe: [N*heads], [N*kv] the q/k norms' 1/rms */
  float *gate;                  /* [N, inter] gate_proj output (dense layers) */
  float *up;                    /* [N, inter] up_proj output (dense layers) */
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
  float *s_norm;   /* [N, hidden] normalized activations (recomputed in backward) */
  float *s_dnorm;  /* [N, hidden] their gradient */
  float *s_inner;  /* [N, inter] silu(gate)*up, then dh */
  float *s_inner2; /* [N, inter] */
  float *s_qkv;    /* [N, (heads + 2*kv)*hd] dq, dk, dv */
  float *s_att;    /* [N, heads*hd] */
  float *s_normw;  /* [hidden] a norm weight converted from bf16 */
  float *s_bias;   /* [max(hidden, inter, heads*hd)] a bias converted from bf16 (biased configs) */
  struct rf_model_stage stage; /* f32 compute: wf32 [RF_MODEL_STAGE_ROWS, max(hidden, inter, heads*hd)];
                                * bf16 compute: see rf_model_ws_set_compute */
  /* MoE (mixtral): expert products take expert_rows rows at a time (fixed shapes:
   * no product shape is new after the first step); moe_cap grouped rows at most */
  int expert_rows, moe_cap;
  float *s_xg, *s_hg, *s_dgu, *s_dxg; /* [moe_cap, hidden / inter / 2*inter / hidden] */
  float *s_dprobs;                    /* [N, E] */
  float *s_qkn;                       /* qwen3_moe: [N, (heads + kv)*hd] the gradients before the q/k norms */
  double *moe_count, *moe_psum;       /* [E] the last forward's top-k assignments and probability sums */
  float *moe_balance;                 /* [E] d(loss)/d(prob) of the load-balancing loss (backward) */
  int32_t *moe_off;                   /* owned, HOST memory [E + 1]: a layer's expert offsets read back */
  float *moe_balance_host;            /* owned, HOST memory [E]: moe_balance before its upload */
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
/* Row n = b*t + position of the logits, [vocab]. Borrowed; device memory of the workspace
 * (the host reads it only where the workspace is in host memory). */
const float *rf_model_ws_logits(const struct rf_model_ws *ws, int row);
/* Copies `rows` rows of the logits from row `row` into out [rows, vocab] (host memory); waits for
 * the workspace's stream. */
void rf_model_ws_read_logits(const struct rf_model_ws *ws, int row, int rows, float *out);
/* Copies the last forward's router statistics (ws->moe_count, moe_psum, [E] each) into the host
 * arrays count and psum; waits for the workspace's stream. A MoE config only. */
void rf_model_ws_moe_stats(const struct rf_model_ws *ws, double *count, double *psum);
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
/* The MoE block of layer l: out [n, hidden] += sum_j topw[j] * expert_top[j](xn),
 * expert(x) = down(silu(gate(x)) * up(x)); w: the router, gate_up, down tensors.
 * Adds the router statistics into ws->moe_count, moe_psum. */
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

#endif
