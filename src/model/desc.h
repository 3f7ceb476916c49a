/* src/model: a model as units of tensors (desc.c for every family of config.h,
 * units_file.c for any other model): names and shapes as in the family's Hugging
 * Face checkpoints, what the trainer needs of each tensor (init, decay, Muon,
 * FP8), where each tensor of a layer sits in its unit (rf_model_layer_slot) and
 * where the units are (rf_model_units_find). The one source of the planner's
 * tensor list (`rfsdp plan`) and of the tensors the trainer declares. */
#ifndef RF_MODEL_DESC_H
#define RF_MODEL_DESC_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h" /* struct rf_model_config */
#include "plan/plan.h"    /* struct rf_plan_unit_in */
#include "rfsdp_types.h"  /* struct rf_init */

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
 *   gpt_oss: input norm, q, q bias, k, k bias, v, v bias, o, o bias (no biases without
 *     attention_bias), SINKS [heads], post-attention norm, then
 *       mlp.router.weight, .bias           [E, hidden], [E]      ROUTER, ROUTER_BIAS
 *       mlp.experts.gate_up_proj, _bias    [E, hidden, 2*inter], [E, 2*inter]  (gate even
 *                                          columns, up odd: [in, out])
 *       mlp.experts.down_proj, _bias       [E, inter, hidden], [E, hidden]
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
  RF_MODEL_LAYER_TENSOR_SINKS,
  RF_MODEL_LAYER_TENSOR_ROUTER_BIAS,
  RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP_BIAS,
  RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN_BIAS,
  RF_MODEL_LAYER_TENSOR_Q_A,               /* deepseek_v3: q_a_proj (Q is then q_b_proj, else q_proj) */
  RF_MODEL_LAYER_TENSOR_Q_A_NORM,          /* q_a_layernorm */
  RF_MODEL_LAYER_TENSOR_KV_A,              /* kv_a_proj_with_mqa: [kv_lora_rank + rope, hidden] */
  RF_MODEL_LAYER_TENSOR_KV_A_NORM,         /* kv_a_layernorm */
  RF_MODEL_LAYER_TENSOR_KV_B,              /* kv_b_proj: [heads * (nope + v_head_dim), kv_lora_rank] */
  RF_MODEL_LAYER_TENSOR_ROUTER_SCORE_BIAS, /* deepseek_v3: mlp.gate.e_score_correction_bias [E] (choice only)
                                            */
  RF_MODEL_LAYER_TENSOR_SHARED_GATE,       /* deepseek_v3: mlp.shared_experts.gate_proj */
  RF_MODEL_LAYER_TENSOR_SHARED_UP,         /* mlp.shared_experts.up_proj */
  RF_MODEL_LAYER_TENSOR_SHARED_DOWN,       /* mlp.shared_experts.down_proj */
  RF_MODEL_LAYER_TENSOR_COUNT
};
/* The most tensors one layer unit holds (gpt_oss: 17; a llama with every bias: 16): the size
 * of a unit's weight and gradient arrays. */
#define RF_MODEL_LAYER_MAX_TENSORS 17

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

#endif
