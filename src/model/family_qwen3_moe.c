/* The qwen3_moe family (transformers' Qwen3MoeForCausalLM): llama attention
 * without biases, q and k RMS-normalized per head before the rotary embedding,
 * then routed experts as mixtral's (of moe_intermediate_size, the top-k weights
 * renormalized when norm_topk_prob) or a dense MLP (mlp_only_layers,
 * decoder_sparse_step). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>

#include "core/core.h"
#include "model/family.h"

/* qwen3_moe: the llama fields, q/k norms (always), the experts (num_experts, or
 * num_local_experts as transformers 5 names it), the dense layers. */
static int qwen3_moe_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_llama_read(j, cfg));
  RF_REQUIRE(!cfg->attention_bias && !cfg->mlp_bias,
             "%s: field '%s': biases in qwen3_moe are not implemented", j->path,
             cfg->attention_bias ? "attention_bias" : "mlp_bias");
  int sliding = 0;
  RF_TRY(rf_model_json_bool(j, "use_sliding_window", 0, &sliding));
  if (sliding) cfg->sliding_field = "use_sliding_window";
  /* its own spelling, unless only transformers 5's is there */
  const char *experts = !cJSON_GetObjectItemCaseSensitive(j->root, "num_experts") &&
                                cJSON_GetObjectItemCaseSensitive(j->root, "num_local_experts")
                            ? "num_local_experts"
                            : "num_experts";
  RF_TRY(rf_model_json_int(j, experts, -1, 0, &cfg->moe.num_local_experts));
  RF_TRY(rf_model_json_int(j, "num_experts_per_tok", 8, 0, &cfg->moe.num_experts_per_tok));
  cfg->moe.experts_field = experts;
  cfg->moe.topk_given = cJSON_GetObjectItemCaseSensitive(j->root, "num_experts_per_tok") != NULL;
  RF_TRY(rf_model_json_int(j, "moe_intermediate_size", -1, 0, &cfg->moe.moe_intermediate_size));
  RF_TRY(rf_model_json_int(j, "decoder_sparse_step", 1, 0, &cfg->moe.decoder_sparse_step));
  RF_TRY(rf_model_json_bool(j, "norm_topk_prob", 0, &cfg->moe.norm_topk_prob));
  RF_TRY(rf_model_json_nonneg(j, "router_aux_loss_coef", 0.001, &cfg->moe.router_aux_loss_coef));
  RF_TRY(rf_model_json_bool(j, "output_router_logits", 0, &cfg->moe.output_router_logits));
  const cJSON *dense = cJSON_GetObjectItemCaseSensitive(j->root, "mlp_only_layers");
  if (dense && !cJSON_IsNull(dense)) {
    RF_REQUIRE(cJSON_IsArray(dense), "%s: field 'mlp_only_layers' must be an array of layer numbers",
               j->path);
    for (const cJSON *x = dense->child; x; x = x->next) {
      RF_REQUIRE(cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble < cfg->num_hidden_layers &&
                     floor(x->valuedouble) == x->valuedouble,
                 "%s: field 'mlp_only_layers': %g is not a layer number", j->path,
                 cJSON_IsNumber(x) ? x->valuedouble : -1.0);
      RF_REQUIRE(x->valuedouble < 64, "%s: field 'mlp_only_layers': layer %g (only layers below 64 here)",
                 j->path, x->valuedouble);
      cfg->moe.dense_mask |= UINT64_C(1) << (int)x->valuedouble;
    }
  }
  return 0;
}

static int qwen3_moe_layer_is_moe(const struct rf_model_config *cfg, int l) {
  int listed = l < 64 && ((cfg->moe.dense_mask >> l) & 1);
  return !listed && cfg->moe.num_local_experts > 0 && (l + 1) % cfg->moe.decoder_sparse_step == 0;
}

static int qwen3_moe_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->moe.num_experts_per_tok;
}

/* Layer l of a qwen3_moe: llama attention with q/k norms, then routed experts of
 * moe_intermediate_size (as mixtral's) or a dense MLP (mlp_only_layers, decoder_sparse_step). */
static void qwen3_moe_describe_layer(struct rf_model_desc_builder *b, const struct rf_model_config *c, int l,
                                     const char *p) {
  int64_t h = c->hidden_size;
  rf_model_desc_gqa(b, c, p);
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "%s.post_attention_layernorm.weight",
                    p);
  if (!rf_model_config_layer_is_moe(c, l)) {
    char e[192];
    snprintf(e, sizeof e, "%s.mlp", p);
    rf_model_desc_mlp(b, h, c->intermediate_size, 0, e);
  } else {
    rf_model_desc_experts(b, c, c->moe.moe_intermediate_size, p);
  }
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(c->head_dim), "%s.self_attn.q_norm.weight",
                    p);
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(c->head_dim), "%s.self_attn.k_norm.weight",
                    p);
}

const struct rf_model_family rf_model_family_qwen3_moe = {
    .name = "qwen3_moe",
    .trainable = 1,
    .router = RF_MODEL_ROUTER_SOFTMAX_TOPK,
    .qk_norm = 1,
    .o_bias = 0,
    .read = qwen3_moe_read,
    .layer_is_moe = qwen3_moe_layer_is_moe,
    .describe_layer = qwen3_moe_describe_layer,
    .layer_slot = rf_model_moe_layer_slot,
    .experts_per_token = qwen3_moe_experts_per_token,
};
