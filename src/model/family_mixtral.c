/* The mixtral family (transformers' MixtralForCausalLM): llama attention without
 * biases, then in every layer a softmax top-k router over fused SwiGLU experts
 * (moe.c; docs/moe.md). */
#include <cjson/cJSON.h>

#include "core/core.h"
#include "model/family.h"

/* mixtral: the llama fields without biases, the experts and the router; a
 * sliding_window shorter than max_position_embeddings is recorded (not implemented). */
static int mixtral_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_llama_read(j, cfg));
  RF_REQUIRE(!cfg->attention_bias && !cfg->mlp_bias, "%s: field '%s': mixtral has no biases", j->path,
             cfg->attention_bias ? "attention_bias" : "mlp_bias");
  RF_TRY(rf_model_json_int(j, "num_local_experts", -1, 0, &cfg->moe.num_local_experts));
  RF_TRY(rf_model_json_int(j, "num_experts_per_tok", 2, 0, &cfg->moe.num_experts_per_tok));
  cfg->moe.experts_field = "num_local_experts";
  cfg->moe.topk_given = cJSON_GetObjectItemCaseSensitive(j->root, "num_experts_per_tok") != NULL;
  RF_TRY(rf_model_json_nonneg(j, "router_aux_loss_coef", 0.001, &cfg->moe.router_aux_loss_coef));
  RF_TRY(rf_model_json_nonneg(j, "router_jitter_noise", 0.0, &cfg->moe.router_jitter_noise));
  RF_TRY(rf_model_json_bool(j, "output_router_logits", 0, &cfg->moe.output_router_logits));
  int window = 0;
  RF_TRY(rf_model_json_int(j, "sliding_window", 0, 0, &window));
  if (window > 0 && window < cfg->max_position_embeddings) cfg->sliding_field = "sliding_window";
  /* what qwen3_moe reads, as mixtral has it: every layer's experts of intermediate_size, renormalized */
  cfg->moe.moe_intermediate_size = cfg->intermediate_size;
  cfg->moe.decoder_sparse_step = 1;
  cfg->moe.norm_topk_prob = 1;
  return 0;
}

static int mixtral_layer_is_moe(const struct rf_model_config *cfg, int l) {
  (void)cfg, (void)l;
  return 1;
}

static int mixtral_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->moe.num_experts_per_tok;
}

/* A mixtral layer: llama attention (no biases), the post-attention norm, the experts. */
static void mixtral_describe_layer(struct rf_model_desc_builder *b, const struct rf_model_config *c, int l,
                                   const char *p) {
  (void)l;
  rf_model_desc_gqa(b, c, p);
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V((int64_t)c->hidden_size),
                    "%s.post_attention_layernorm.weight", p);
  rf_model_desc_experts(b, c, c->intermediate_size, p);
}

const struct rf_model_family rf_model_family_mixtral = {
    .name = "mixtral",
    .trainable = 1,
    .router = RF_MODEL_ROUTER_SOFTMAX_TOPK,
    .qk_norm = 0,
    .o_bias = 0,
    .read = mixtral_read,
    .layer_is_moe = mixtral_layer_is_moe,
    .describe_layer = mixtral_describe_layer,
    .layer_slot = rf_model_moe_layer_slot,
    .experts_per_token = mixtral_experts_per_token,
};
