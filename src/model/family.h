/* src/model: a model family is one table of per-family operations and one file.
 *
 * struct rf_model_family says everything that differs between families: the
 * model_type it answers to, the config.json fields it reads, the tensors of a
 * layer unit with their Hugging Face names, shapes and kinds, where the trainable
 * model finds each tensor in a layer's unit, and the layer's pieces (the router,
 * the q/k norms, which biases). config.c, desc.c, model.c, moe.c and cost.c ask
 * the config's family (cfg->family) instead of testing which family it is.
 *
 * The families are listed once, in families.c (RF_MODEL_FAMILIES: their order is
 * the order of the names in messages and --help). Each lives in its own file:
 * family_llama.c (llama, and qwen2: q, k, v biases), family_mixtral.c,
 * family_qwen3_moe.c, family_gpt_oss.c and family_deepseek_v3.c. docs/model.md walks through adding one.
 *
 * The rest of this header is what a family file builds with: the config.json
 * readers (config.c) and the description builder (desc.c). */
#ifndef RF_MODEL_FAMILY_H
#define RF_MODEL_FAMILY_H

#include <stdint.h>

#include "model/config.h"
#include "model/desc.h"

struct cJSON;
struct rf_model_config_json;
struct rf_model_desc_builder;

/* The router a trainable family's MoE layers run (moe.c). */
enum rf_model_router {
  RF_MODEL_ROUTER_NONE = 0,      /* dense layers only (or a planned-only family) */
  RF_MODEL_ROUTER_SOFTMAX_TOPK,  /* softmax over the experts, the top num_experts_per_tok, their
                                  * probabilities renormalized when moe.norm_topk_prob; fused SwiGLU
                                  * experts (mlp.experts.gate_up_proj, down_proj) */
  RF_MODEL_ROUTER_TOPK_SOFTMAX,  /* GPT-OSS: a router with a bias, softmax over the top
                                  * num_experts_per_tok logits (the same weights and gradients as
                                  * SOFTMAX_TOPK renormalized); fused experts [in, out] with biases,
                                  * gate and up interleaved, the clamped SwiGLU (moe.c) */
  RF_MODEL_ROUTER_SIGMOID_GROUP, /* DeepSeek-V3: sigmoid scores, group-limited top-k chosen with the
                                  * e_score_correction_bias (not trained: moved after each step by the
                                  * loads, rf_train_model_step), fused SwiGLU experts as SOFTMAX_TOPK's
                                  * plus shared experts on the same input (moe.c) */
};

struct rf_model_family {
  const char *name; /* the config.json's model_type */
  int trainable;    /* 1: rfsdp trains it; 0: described and planned only */
  /* the trainable layer's pieces (model.c, moe.c): RMSNorm before attention and
   * MLP, GQA with rotary embeddings and SwiGLU for every family; then */
  enum rf_model_router router; /* MoE layers' router (which layers: layer_is_moe) */
  int qk_norm;                 /* q and k RMS-normalized per head over head_dim before the rotary */
  int o_bias;                  /* attention_bias puts a bias on o_proj too (llama; qwen2: q, k, v only) */
  int attention_sinks;         /* a learned logit per head in the softmax (self_attn.sinks) and the layers'
                                * sliding windows (cfg->sliding_window, sliding_mask): GPT-OSS */
  int mla;                     /* multi-head latent attention (DeepSeek-V3): low-rank q (optional) and kv
                                * with their norms, kv_b_proj giving each head's k_nope and v, a rotary key
                                * every head shares, v's head dim its own (model.c's mla_ functions) */
  /* Reads the family's own config.json fields into cfg, after the shared ones
   * (config.c: sizes, heads, vocab, rope, tie_word_embeddings, ...). Errors name
   * the file and the field. */
  int (*read)(const struct rf_model_config_json *j, struct rf_model_config *cfg);
  /* What the trainable model does not implement of this family's fields, refused naming the field
   * (what: the file), after rf_model_config_check's shared checks. NULL: nothing more. */
  int (*check)(const struct rf_model_config *cfg, const char *what);
  /* Layer l has routed experts (1) or a dense MLP (0). NULL: dense everywhere. */
  int (*layer_is_moe)(const struct rf_model_config *cfg, int l);
  /* Adds layer l's tensors to the current unit: names under prefix p
   * ("model.layers.{l}"), shapes, kinds (init, decay, Muon, FP8). For a trainable
   * family, in the order layer_slot gives. */
  void (*describe_layer)(struct rf_model_desc_builder *b, const struct rf_model_config *cfg, int l,
                         const char *p);
  /* Where tensor t is in layer l's unit, -1 when that layer has none (trainable
   * families; NULL: none). */
  int (*layer_slot)(const struct rf_model_config *cfg, int l, enum rf_model_layer_tensor t);
  /* Routed experts a token meets (rf_model_experts_per_token; NULL: 0, dense). */
  int (*experts_per_token)(const struct rf_model_config *cfg);
};

/* ---- reading config.json (config.c) ---------------------------------------------------- */

/* A config being read: the JSON object and the file it came from. */
struct rf_model_config_json {
  const struct cJSON *root;
  const char *path;
  const char *assumed; /* appended to "missing" messages (a config without model_type) */
};

/* Integer field `name`, a positive integer below 2^31 (zero too when zero_ok);
 * absent or null: *out = dflt, or an error when dflt < 0. */
int rf_model_json_int(const struct rf_model_config_json *j, const char *name, int dflt, int zero_ok,
                      int *out);
/* A positive finite number of obj; absent or null: dflt. */
int rf_model_json_double(const struct rf_model_config_json *j, const struct cJSON *obj, const char *name,
                         double dflt, double *out);
/* A finite number >= 0; absent or null: dflt. */
int rf_model_json_nonneg(const struct rf_model_config_json *j, const char *name, double dflt, double *out);
/* true or false; absent or null: dflt. */
int rf_model_json_bool(const struct rf_model_config_json *j, const char *name, int dflt, int *out);
/* A string of obj into buf (size RF_MODEL_CONFIG_WORD); absent or null: dflt. */
int rf_model_json_word(const struct rf_model_config_json *j, const struct cJSON *obj, const char *name,
                       const char *dflt, char *buf);

/* rope_parameters (or rope_scaling) naming "yarn" into cfg->yarn (transformers'
 * _compute_yarn_parameters): factor, beta_fast (32), beta_slow (1),
 * original_max_position_embeddings, truncate (true), attention_factor (default: 0.1 ln(factor) + 1,
 * or with mscale and mscale_all_dim the ratio of their yarn_get_mscale); mscale and mscale_all_dim
 * refused unless mscale_ok (DeepSeek-V3's MLA also scales its softmax by mscale_all_dim's, squared).
 * Nothing when the rope_type is not yarn. */
int rf_model_json_yarn(const struct rf_model_config_json *j, struct rf_model_config *cfg, int mscale_ok);

/* The llama fields (family_llama.c), which the llama-shaped families read too:
 * head_dim (default hidden_size / num_attention_heads), attention_bias, mlp_bias. */
int rf_model_llama_read(const struct rf_model_config_json *j, struct rf_model_config *cfg);

/* ---- describing a layer (desc.c) ------------------------------------------------------- */

/* What a tensor is, which sets its initialization, weight decay, Muon and FP8. */
enum rf_model_desc_kind {
  RF_MODEL_DESC_KIND_NORM = 0, /* a norm's scale: const 1 */
  RF_MODEL_DESC_KIND_BIAS,     /* a bias, sinks: zeros */
  RF_MODEL_DESC_KIND_EMBED,    /* the token embedding: normal, no decay */
  RF_MODEL_DESC_KIND_OUTPUT,   /* lm_head: normal, decay, not orthogonalized */
  RF_MODEL_DESC_KIND_LINEAR,   /* a linear weight between hidden states: normal, decay, Muon, FP8 */
  RF_MODEL_DESC_KIND_ROUTER,   /* an MoE router: as a linear weight, but kept in high precision under FP8 */
  RF_MODEL_DESC_KIND_RESIDUAL, /* one writing into the residual stream: normal / sqrt(2 layers) */
  RF_MODEL_DESC_KIND_EXPERTS   /* fused experts (3-D): normal, decay, Muon per expert matrix */
};

struct rf_model_desc_builder {
  struct rf_model_desc *d;
  float std_res; /* the residual projections' std */
};

/* A shape written in place: RF_MODEL_DESC_V(out, in). */
#define RF_MODEL_DESC_V(...) ((const int64_t[]){__VA_ARGS__})

/* Adds a tensor of `kind` with ndim dims, named by a format. */
struct rf_model_tensor *rf_model_desc_add(struct rf_model_desc_builder *b, enum rf_model_desc_kind kind,
                                          int ndim, const int64_t *shape, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A linear layer [out, in] under prefix, and its bias [out] when `bias`. */
void rf_model_desc_linear(struct rf_model_desc_builder *b, enum rf_model_desc_kind kind, int64_t out,
                          int64_t in, int bias, const char *prefix, const char *name);
/* The input norm and grouped-query attention of a layer (q, k, v, o; biases when
 * attention_bias). */
void rf_model_desc_gqa(struct rf_model_desc_builder *b, const struct rf_model_config *c, const char *p);
/* A SwiGLU MLP (gate, up: [f, h]; down: [h, f]) under prefix. */
void rf_model_desc_mlp(struct rf_model_desc_builder *b, int64_t h, int64_t f, int bias, const char *prefix);
/* The router and the fused experts of f rows (RF_MODEL_LAYER_TENSOR_ROUTER,
 * _EXPERTS_GATE_UP, _EXPERTS_DOWN), each expert's rows one block. */
void rf_model_desc_experts(struct rf_model_desc_builder *b, const struct rf_model_config *c, int64_t f,
                           const char *p);
/* The slots of a llama-shaped MoE layer (mixtral, qwen3_moe): the first six
 * (norm, q, k, v, o, post norm), then the router and the experts (a MoE layer) or
 * gate, up, down (a dense one), then q_norm and k_norm when the family has them. */
int rf_model_moe_layer_slot(const struct rf_model_config *cfg, int l, enum rf_model_layer_tensor t);

#endif
