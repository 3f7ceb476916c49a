/* The deepseek_v3 family (transformers' DeepseekV3ForCausalLM): multi-head latent
 * attention (model.c's mla_ functions: low-rank q with q_a_layernorm or q_proj,
 * kv_a_proj_with_mqa giving the compressed kv and the rotary key every head shares,
 * kv_b_proj giving each head's k_nope and v), then a dense MLP on the first
 * first_k_dense_replace layers and routed experts on the others (moe.c): the sigmoid
 * group-limited router with its balancing bias (e_score_correction_bias, moved after
 * each step by the loads, not by the optimizer), the routed experts fused as mixtral's
 * and the shared experts on the same input. */
#include <cjson/cJSON.h>
#include <math.h>
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
  RF_TRY(rf_model_json_int(j, "n_group", 8, 0, &d->n_group));
  RF_TRY(rf_model_json_int(j, "topk_group", 4, 0, &d->topk_group));
  RF_TRY(rf_model_json_bool(j, "norm_topk_prob", 1, &d->norm_topk_prob));
  RF_TRY(rf_model_json_double(j, j->root, "routed_scaling_factor", 2.5, &d->routed_scaling_factor));
  RF_TRY(rf_model_json_nonneg(j, "bias_update_speed", 1e-3, &d->bias_update_speed));
  cfg->head_dim = d->qk_nope_head_dim + d->qk_rope_head_dim;
  /* the routed experts as moe.c reads them (mixtral's fields); top-k: transformers' default, 8 */
  cfg->moe.num_local_experts = d->n_routed_experts;
  cfg->moe.num_experts_per_tok = d->num_experts_per_tok ? d->num_experts_per_tok : 8;
  cfg->moe.experts_field = "n_routed_experts";
  cfg->moe.topk_given = cJSON_GetObjectItemCaseSensitive(j->root, "num_experts_per_tok") != NULL;
  cfg->moe.moe_intermediate_size = d->moe_intermediate_size;
  cfg->moe.decoder_sparse_step = 1;
  cfg->moe.norm_topk_prob = d->norm_topk_prob;
  return rf_model_json_yarn(j, cfg, 1);
}

static int deepseek_v3_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->moe.num_experts_per_tok;
}

/* Layer l has routed experts: past the first first_k_dense_replace layers, every moe_layer_freq-th. */
static int deepseek_v3_is_moe_layer(const struct rf_model_config *c, int l) {
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  return l >= d->first_k_dense_replace && l % d->moe_layer_freq == 0;
}

/* Layer l of DeepSeek-V3: multi-head latent attention, then a dense MLP (the
 * first first_k_dense_replace layers and those off moe_layer_freq) or the router
 * (mlp.gate.weight), the fused routed experts (mlp.experts.gate_up_proj, down_proj),
 * the balancing bias (mlp.gate.e_score_correction_bias: zeros, no decay; its
 * gradient stays zero, so the optimizers leave it) and the shared experts. */
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
  /* the router and the fused experts as mixtral's (rf_model_desc_experts), but cut at the run's
   * blocks (32-row strips under 8-bit AdamW), not one whole expert per block: DeepSeek-V3's 256
   * experts of 29.4M and 14.7M elements kept whole pad W = 1024 by 161% (docs/moe-planner.md);
   * each expert stays its own matrix for Muon (sub_count) */
  int64_t x = d->n_routed_experts, f = d->moe_intermediate_size;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_OUTPUT, 2, RF_MODEL_DESC_V(x, h), "%s.mlp.gate.weight", p);
  struct rf_model_tensor *gu = rf_model_desc_add(
      b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, 2 * f, h), "%s.mlp.experts.gate_up_proj", p);
  struct rf_model_tensor *dn = rf_model_desc_add(b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, h, f),
                                                 "%s.mlp.experts.down_proj", p);
  gu->sub_count = dn->sub_count = x;
  dn->init.value = b->std_res;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 1, RF_MODEL_DESC_V(d->n_routed_experts),
                    "%s.mlp.gate.e_score_correction_bias", p);
  snprintf(e, sizeof e, "%s.mlp.shared_experts", p);
  rf_model_desc_mlp(b, h, (int64_t)d->moe_intermediate_size * d->n_shared_experts, 0, e);
}

/* What the trainable model does not implement, and routers it cannot build. */
static int deepseek_v3_check(const struct rf_model_config *c, const char *what) {
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  if (rf_model_config_moe_layers(c) > 0) {
    int e = d->n_routed_experts, g = d->n_group;
    RF_REQUIRE(e % g == 0 && e / g >= 2,
               "%s: field 'n_group' (%d) must divide n_routed_experts (%d) into groups of 2 or more", what, g,
               e);
    RF_REQUIRE(d->topk_group <= g, "%s: field 'topk_group' (%d) must be in 1..n_group (%d)", what,
               d->topk_group, g);
    RF_REQUIRE(c->moe.num_experts_per_tok <= d->topk_group * (e / g),
               "%s: field 'num_experts_per_tok' (%d) exceeds the experts of topk_group (%d) groups of %d",
               what, c->moe.num_experts_per_tok, d->topk_group, e / g);
    RF_REQUIRE(d->n_shared_experts > 0, "%s: field 'n_shared_experts' must be positive (got 0)", what);
  }
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
 * then a dense layer's gate, up, down, or a MoE layer's router, gate_up, down, balancing bias and
 * shared gate, up, down. */
static int deepseek_v3_layer_slot(const struct rf_model_config *c, int l, enum rf_model_layer_tensor t) {
  int qo = c->deepseek_v3.q_lora_rank ? 2 : 0, dense = !deepseek_v3_is_moe_layer(c, l);
  if (!dense && t >= RF_MODEL_LAYER_TENSOR_GATE && t <= RF_MODEL_LAYER_TENSOR_DOWN) return -1;
  if (!dense && t >= RF_MODEL_LAYER_TENSOR_ROUTER && t <= RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN)
    return 7 + qo + (int)(t - RF_MODEL_LAYER_TENSOR_ROUTER);
  if (!dense && t == RF_MODEL_LAYER_TENSOR_ROUTER_SCORE_BIAS) return 10 + qo;
  if (!dense && t >= RF_MODEL_LAYER_TENSOR_SHARED_GATE && t <= RF_MODEL_LAYER_TENSOR_SHARED_DOWN)
    return 11 + qo + (int)(t - RF_MODEL_LAYER_TENSOR_SHARED_GATE);
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
    .router = RF_MODEL_ROUTER_SIGMOID_GROUP,
    .mla = 1,
    .read = deepseek_v3_read,
    .check = deepseek_v3_check,
    .layer_is_moe = deepseek_v3_is_moe_layer,
    .describe_layer = deepseek_v3_describe_layer,
    .layer_slot = deepseek_v3_layer_slot,
    .experts_per_token = deepseek_v3_experts_per_token,
};
