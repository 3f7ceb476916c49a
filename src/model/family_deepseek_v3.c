/* The deepseek_v3 family (transformers' DeepseekV3ForCausalLM): multi-head latent
 * attention (model.c's mla_ functions: low-rank q with q_a_layernorm or q_proj,
 * kv_a_proj_with_mqa giving the compressed kv and the rotary key every head shares,
 * kv_b_proj giving each head's k_nope and v), then a dense MLP on the first
 * first_k_dense_replace layers. Trainable where every layer is dense; the layers with
 * routed experts (the sigmoid group-limited router, its balancing bias, the shared
 * experts) are described (one set of tensors per routed expert) and planned only. */
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
  RF_TRY(rf_model_json_bool(j, "rope_interleave", 1, &d->rope_interleave));
  RF_TRY(rf_model_json_bool(j, "attention_bias", 0, &cfg->attention_bias));
  cfg->head_dim = d->qk_nope_head_dim + d->qk_rope_head_dim;
  return rf_model_json_yarn(j, cfg, 1);
}

static int deepseek_v3_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->deepseek_v3.num_experts_per_tok;
}

static int deepseek_v3_separate_experts(const struct rf_model_config *cfg) {
  return cfg->deepseek_v3.n_routed_experts;
}

/* Layer l has routed experts: past the first first_k_dense_replace layers, every moe_layer_freq-th. */
static int deepseek_v3_is_moe_layer(const struct rf_model_config *c, int l) {
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  return l >= d->first_k_dense_replace && l % d->moe_layer_freq == 0;
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
  if (!deepseek_v3_is_moe_layer(c, l)) {
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

/* What the trainable model does not implement yet. */
static int deepseek_v3_check(const struct rf_model_config *c, const char *what) {
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  for (int l = 0; l < c->num_hidden_layers; l++)
    RF_REQUIRE(!deepseek_v3_is_moe_layer(c, l),
               "%s: field 'first_k_dense_replace' (%d): layer %d has routed experts, which are not trainable "
               "yet (only dense layers: first_k_dense_replace = num_hidden_layers)",
               what, d->first_k_dense_replace, l);
  RF_REQUIRE(!c->attention_bias, "%s: field 'attention_bias': true is not implemented for deepseek_v3", what);
  RF_REQUIRE(
      c->num_key_value_heads == c->num_attention_heads,
      "%s: field 'num_key_value_heads' (%d) must equal num_attention_heads (%d) (every head has its key)",
      what, c->num_key_value_heads, c->num_attention_heads);
  RF_REQUIRE(d->kv_lora_rank > 0 && d->qk_nope_head_dim > 0 && d->v_head_dim > 0,
             "%s: fields 'kv_lora_rank', 'qk_nope_head_dim', 'v_head_dim' must be positive", what);
  RF_REQUIRE(d->qk_rope_head_dim > 0 && d->qk_rope_head_dim % 2 == 0,
             "%s: field 'qk_rope_head_dim' (%d) must be positive and even (rotary pairs)", what,
             d->qk_rope_head_dim);
  return 0;
}

/* The order of deepseek_v3_describe_layer: the norm, q (q_a_proj, q_a_layernorm, q_b_proj when
 * q_lora_rank, else q_proj), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj, the post norm,
 * then a dense layer's gate, up, down. */
static int deepseek_v3_layer_slot(const struct rf_model_config *c, int l, enum rf_model_layer_tensor t) {
  int qo = c->deepseek_v3.q_lora_rank ? 2 : 0, dense = !deepseek_v3_is_moe_layer(c, l);
  switch (t) {
    case RF_MODEL_LAYER_TENSOR_INPUT_NORM:
      return 0;
    case RF_MODEL_LAYER_TENSOR_Q_A:
      return qo ? 1 : -1;
    case RF_MODEL_LAYER_TENSOR_Q_A_NORM:
      return qo ? 2 : -1;
    case RF_MODEL_LAYER_TENSOR_Q:
      return 1 + qo;
    case RF_MODEL_LAYER_TENSOR_KV_A:
      return 2 + qo;
    case RF_MODEL_LAYER_TENSOR_KV_A_NORM:
      return 3 + qo;
    case RF_MODEL_LAYER_TENSOR_KV_B:
      return 4 + qo;
    case RF_MODEL_LAYER_TENSOR_O:
      return 5 + qo;
    case RF_MODEL_LAYER_TENSOR_POST_NORM:
      return 6 + qo;
    case RF_MODEL_LAYER_TENSOR_GATE:
      return dense ? 7 + qo : -1;
    case RF_MODEL_LAYER_TENSOR_UP:
      return dense ? 8 + qo : -1;
    case RF_MODEL_LAYER_TENSOR_DOWN:
      return dense ? 9 + qo : -1;
    default:
      return -1;
  }
}

const struct rf_model_family rf_model_family_deepseek_v3 = {
    .name = "deepseek_v3",
    .trainable = 1,
    .mla = 1,
    .read = deepseek_v3_read,
    .check = deepseek_v3_check,
    .describe_layer = deepseek_v3_describe_layer,
    .layer_slot = deepseek_v3_layer_slot,
    .experts_per_token = deepseek_v3_experts_per_token,
    .separate_experts = deepseek_v3_separate_experts,
};
