/* The deepseek_v3 family (transformers' DeepseekV3ForCausalLM), described and
 * planned only (not trainable yet: multi-head latent attention, the sigmoid
 * group-limited router with its balancing bias and the shared experts are not in
 * model.c): its fields and tensors, one set of tensors per routed expert. */
#include <stdio.h>

#include "core/core.h"
#include "model/family.h"

static int deepseek_v3_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  struct rf_model_config_deepseek_v3 *d = &cfg->deepseek_v3;
  RF_TRY(rf_model_json_int(j, "moe_intermediate_size", -1, 0, &d->moe_intermediate_size));
  RF_TRY(rf_model_json_int(j, "n_routed_experts", -1, 0, &d->n_routed_experts));
  RF_TRY(rf_model_json_int(j, "n_shared_experts", -1, 0, &d->n_shared_experts));
  RF_TRY(rf_model_json_int(j, "first_k_dense_replace", -1, 1, &d->first_k_dense_replace));
  RF_TRY(rf_model_json_int(j, "moe_layer_freq", 1, 0, &d->moe_layer_freq));
  RF_TRY(rf_model_json_int(j, "q_lora_rank", 0, 0, &d->q_lora_rank)); /* null or absent: no low-rank q */
  RF_TRY(rf_model_json_int(j, "kv_lora_rank", -1, 0, &d->kv_lora_rank));
  RF_TRY(rf_model_json_int(j, "qk_nope_head_dim", -1, 0, &d->qk_nope_head_dim));
  RF_TRY(rf_model_json_int(j, "qk_rope_head_dim", -1, 0, &d->qk_rope_head_dim));
  RF_TRY(rf_model_json_int(j, "v_head_dim", -1, 0, &d->v_head_dim));
  RF_TRY(rf_model_json_int(j, "num_experts_per_tok", 0, 1, &d->num_experts_per_tok));
  cfg->head_dim = d->qk_nope_head_dim + d->qk_rope_head_dim;
  return 0;
}

static int deepseek_v3_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->deepseek_v3.num_experts_per_tok;
}

static int deepseek_v3_separate_experts(const struct rf_model_config *cfg) {
  return cfg->deepseek_v3.n_routed_experts;
}

/* Layer l of DeepSeek-V3: multi-head latent attention, then a dense MLP (the
 * first first_k_dense_replace layers and those off moe_layer_freq) or routed
 * experts with shared ones. */
static void deepseek_v3_describe_layer(struct rf_model_desc_builder *b, const struct rf_model_config *c,
                                       int l, const char *p) {
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  int64_t h = c->hidden_size, heads = c->num_attention_heads, rope = d->qk_rope_head_dim;
  int64_t qk = d->qk_nope_head_dim + rope, kv = d->kv_lora_rank;
  const enum rf_model_desc_kind lin = RF_MODEL_DESC_KIND_LINEAR;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "%s.input_layernorm.weight", p);
  if (d->q_lora_rank) {
    rf_model_desc_linear(b, lin, d->q_lora_rank, h, 0, p, "self_attn.q_a_proj");
    rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(d->q_lora_rank),
                      "%s.self_attn.q_a_layernorm.weight", p);
    rf_model_desc_linear(b, lin, heads * qk, d->q_lora_rank, 0, p, "self_attn.q_b_proj");
  } else {
    rf_model_desc_linear(b, lin, heads * qk, h, 0, p, "self_attn.q_proj");
  }
  rf_model_desc_linear(b, lin, kv + rope, h, 0, p, "self_attn.kv_a_proj_with_mqa");
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(kv), "%s.self_attn.kv_a_layernorm.weight",
                    p);
  rf_model_desc_linear(b, lin, heads * (d->qk_nope_head_dim + d->v_head_dim), kv, 0, p,
                       "self_attn.kv_b_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_RESIDUAL, h, heads * d->v_head_dim, 0, p, "self_attn.o_proj");
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "%s.post_attention_layernorm.weight",
                    p);
  char e[192];
  if (l < d->first_k_dense_replace || l % d->moe_layer_freq != 0) {
    snprintf(e, sizeof e, "%s.mlp", p);
    rf_model_desc_mlp(b, h, c->intermediate_size, 0, e);
    return;
  }
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_ROUTER, d->n_routed_experts, h, 0, p, "mlp.gate");
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 1, RF_MODEL_DESC_V(d->n_routed_experts),
                    "%s.mlp.gate.e_score_correction_bias", p);
  for (int x = 0; x < d->n_routed_experts && !b->d->too_large; x++) {
    snprintf(e, sizeof e, "%s.mlp.experts.%d", p, x);
    rf_model_desc_mlp(b, h, d->moe_intermediate_size, 0, e);
  }
  snprintf(e, sizeof e, "%s.mlp.shared_experts", p);
  rf_model_desc_mlp(b, h, (int64_t)d->moe_intermediate_size * d->n_shared_experts, 0, e);
}

const struct rf_model_family rf_model_family_deepseek_v3 = {
    .name = "deepseek_v3",
    .trainable = 0,
    .read = deepseek_v3_read,
    .describe_layer = deepseek_v3_describe_layer,
    .experts_per_token = deepseek_v3_experts_per_token,
    .separate_experts = deepseek_v3_separate_experts,
};
