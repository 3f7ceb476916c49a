/* The gpt_oss family (transformers' GptOssForCausalLM), described and planned
 * only (not trainable yet: attention sinks, sliding-window layers, the clamped
 * SwiGLU and YaRN rotary are not in model.c): its fields and tensors. */
#include "core/core.h"
#include "model/family.h"

static int gpt_oss_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_json_int(j, "head_dim", -1, 0, &cfg->head_dim));
  RF_TRY(rf_model_json_int(j, "num_local_experts", -1, 0, &cfg->gpt_oss.num_local_experts));
  RF_TRY(rf_model_json_int(j, "num_experts_per_tok", 0, 1, &cfg->gpt_oss.num_experts_per_tok));
  return rf_model_json_bool(j, "attention_bias", 1, &cfg->attention_bias);
}

static int gpt_oss_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->gpt_oss.num_experts_per_tok;
}

/* Attention with biases and sinks, the router (with its bias) and all experts of
 * the layer in one fused tensor each, with their biases. */
static void gpt_oss_describe_layer(struct rf_model_desc_builder *b, const struct rf_model_config *c, int l,
                                   const char *p) {
  (void)l;
  int64_t h = c->hidden_size, inter = c->intermediate_size, x = c->gpt_oss.num_local_experts;
  rf_model_desc_gqa(b, c, p);
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 1, RF_MODEL_DESC_V(c->num_attention_heads),
                    "%s.self_attn.sinks", p);
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "%s.post_attention_layernorm.weight",
                    p);
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_ROUTER, x, h, 1, p, "mlp.router");
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, h, 2 * inter),
                    "%s.mlp.experts.gate_up_proj", p)
      ->sub_count = x;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 2, RF_MODEL_DESC_V(x, 2 * inter),
                    "%s.mlp.experts.gate_up_proj_bias", p)
      ->sub_count = x;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, inter, h),
                    "%s.mlp.experts.down_proj", p)
      ->sub_count = x;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 2, RF_MODEL_DESC_V(x, h), "%s.mlp.experts.down_proj_bias", p)
      ->sub_count = x;
}

const struct rf_model_family rf_model_family_gpt_oss = {
    .name = "gpt_oss",
    .trainable = 0,
    .read = gpt_oss_read,
    .describe_layer = gpt_oss_describe_layer,
    .experts_per_token = gpt_oss_experts_per_token,
};
