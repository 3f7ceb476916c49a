/* The gpt_oss family (transformers' GptOssForCausalLM): attention with biases, a learned
 * sink logit per head and sliding-window attention on the layers layer_types names, YaRN
 * rotary embeddings, then in every layer a router with a bias (softmax over the top-k
 * logits) and all experts in one [in, out] tensor each with biases, gate and up
 * interleaved, through the clamped SwiGLU (model.c, moe.c; docs/model.md). */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "model/family.h"

/* layer_types (default: sliding on even layers, transformers' GptOssConfig) and sliding_window. */
static int gpt_oss_read_layers(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_json_int(j, "sliding_window", 128, 0, &cfg->sliding_window));
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j->root, "layer_types");
  int L = cfg->num_hidden_layers;
  if (lt && !cJSON_IsNull(lt))
    RF_REQUIRE(cJSON_IsArray(lt) && cJSON_GetArraySize(lt) == L,
               "%s: field 'layer_types' must be an array of num_hidden_layers (%d) strings", j->path, L);
  for (int l = 0; l < L; l++) {
    int sliding = (l + 1) % 2;
    if (lt && !cJSON_IsNull(lt)) {
      const cJSON *it = cJSON_GetArrayItem(lt, l);
      RF_REQUIRE(cJSON_IsString(it) && (strcmp(it->valuestring, "sliding_attention") == 0 ||
                                        strcmp(it->valuestring, "full_attention") == 0),
                 "%s: field 'layer_types': entry %d is not \"sliding_attention\" or \"full_attention\"",
                 j->path, l);
      sliding = strcmp(it->valuestring, "sliding_attention") == 0;
    }
    if (!sliding || cfg->sliding_window == 0) continue;
    RF_REQUIRE(l < 64, "%s: field 'layer_types': sliding attention on layer %d (only layers < 64)", j->path,
               l);
    cfg->sliding_mask |= UINT64_C(1) << l;
  }
  return 0;
}

static int gpt_oss_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_json_int(j, "head_dim", -1, 0, &cfg->head_dim));
  RF_TRY(rf_model_json_int(j, "num_local_experts", -1, 0, &cfg->gpt_oss.num_local_experts));
  RF_TRY(rf_model_json_int(j, "num_experts_per_tok", 0, 1, &cfg->gpt_oss.num_experts_per_tok));
  RF_TRY(rf_model_json_bool(j, "attention_bias", 1, &cfg->attention_bias));
  RF_TRY(rf_model_json_double(j, j->root, "swiglu_alpha", 1.702, &cfg->gpt_oss.swiglu_alpha));
  RF_TRY(rf_model_json_double(j, j->root, "swiglu_limit", 7.0, &cfg->gpt_oss.swiglu_limit));
  /* the experts as moe.c runs them (transformers' defaults: 4 per token, coefficient 0.001) */
  cfg->moe.num_local_experts = cfg->gpt_oss.num_local_experts;
  cfg->moe.num_experts_per_tok = cfg->gpt_oss.num_experts_per_tok ? cfg->gpt_oss.num_experts_per_tok : 4;
  cfg->moe.experts_field = "num_local_experts";
  cfg->moe.topk_given = cfg->gpt_oss.num_experts_per_tok != 0;
  RF_TRY(rf_model_json_nonneg(j, "router_aux_loss_coef", 0.001, &cfg->moe.router_aux_loss_coef));
  RF_TRY(rf_model_json_bool(j, "output_router_logits", 0, &cfg->moe.output_router_logits));
  cfg->moe.moe_intermediate_size = cfg->intermediate_size;
  cfg->moe.decoder_sparse_step = 1;
  cfg->moe.norm_topk_prob = 1; /* softmax over the top-k logits = the top-k probabilities renormalized */
  RF_TRY(gpt_oss_read_layers(j, cfg));
  return rf_model_json_yarn(j, cfg, 0);
}

static int gpt_oss_layer_is_moe(const struct rf_model_config *cfg, int l) {
  (void)cfg, (void)l;
  return 1;
}

static int gpt_oss_experts_per_token(const struct rf_model_config *cfg) {
  return cfg->gpt_oss.num_experts_per_tok;
}

/* Attention with biases and sinks, the router (with its bias) and all experts of
 * the layer in one fused tensor each, with their biases; each expert's rows one block. */
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
  struct rf_model_tensor *t = rf_model_desc_add(
      b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, h, 2 * inter), "%s.mlp.experts.gate_up_proj", p);
  t->sub_count = x;
  t = rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 2, RF_MODEL_DESC_V(x, 2 * inter),
                        "%s.mlp.experts.gate_up_proj_bias", p);
  t->sub_count = x;
  t = rf_model_desc_add(b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, inter, h),
                        "%s.mlp.experts.down_proj", p);
  t->sub_count = x;
  t->init.value = b->std_res;
  t = rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 2, RF_MODEL_DESC_V(x, h), "%s.mlp.experts.down_proj_bias",
                        p);
  t->sub_count = x;
}

/* The name (after "model.layers.{l}.") of each tensor a GPT-OSS layer has. */
static const char *const gpt_oss_tensor_names[RF_MODEL_LAYER_TENSOR_COUNT] = {
    [RF_MODEL_LAYER_TENSOR_INPUT_NORM] = "input_layernorm.weight",
    [RF_MODEL_LAYER_TENSOR_Q] = "self_attn.q_proj.weight",
    [RF_MODEL_LAYER_TENSOR_Q_BIAS] = "self_attn.q_proj.bias",
    [RF_MODEL_LAYER_TENSOR_K] = "self_attn.k_proj.weight",
    [RF_MODEL_LAYER_TENSOR_K_BIAS] = "self_attn.k_proj.bias",
    [RF_MODEL_LAYER_TENSOR_V] = "self_attn.v_proj.weight",
    [RF_MODEL_LAYER_TENSOR_V_BIAS] = "self_attn.v_proj.bias",
    [RF_MODEL_LAYER_TENSOR_O] = "self_attn.o_proj.weight",
    [RF_MODEL_LAYER_TENSOR_O_BIAS] = "self_attn.o_proj.bias",
    [RF_MODEL_LAYER_TENSOR_SINKS] = "self_attn.sinks",
    [RF_MODEL_LAYER_TENSOR_POST_NORM] = "post_attention_layernorm.weight",
    [RF_MODEL_LAYER_TENSOR_ROUTER] = "mlp.router.weight",
    [RF_MODEL_LAYER_TENSOR_ROUTER_BIAS] = "mlp.router.bias",
    [RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP] = "mlp.experts.gate_up_proj",
    [RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP_BIAS] = "mlp.experts.gate_up_proj_bias",
    [RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN] = "mlp.experts.down_proj",
    [RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN_BIAS] = "mlp.experts.down_proj_bias",
};

/* Where tensor t is in gpt_oss_describe_layer's order: layer l described into a scratch
 * description and its tensor named "p." + gpt_oss_tensor_names[t] looked up (-1: none, e.g. a bias
 * without attention_bias), so that the slots cannot drift from the description. At set-up only
 * (the workspace reads every slot once). */
static int gpt_oss_layer_slot(const struct rf_model_config *cfg, int l, enum rf_model_layer_tensor t) {
  const char *name = (int)t >= 0 && t < RF_MODEL_LAYER_TENSOR_COUNT ? gpt_oss_tensor_names[t] : NULL;
  if (!name) return -1;
  struct rf_model_desc d;
  memset(&d, 0, sizeof d);
  struct rf_model_desc_builder b = {&d, 1.0f};
  rf_model_desc_add_unit(&d, "layer");
  gpt_oss_describe_layer(&b, cfg, l, "p");
  int slot = -1;
  for (int i = 0; i < d.units[0].n_tensors && slot < 0; i++)
    if (strncmp(d.units[0].tensors[i].name, "p.", 2) == 0 &&
        strcmp(d.units[0].tensors[i].name + 2, name) == 0)
      slot = i;
  rf_model_desc_free(&d);
  return slot;
}

const struct rf_model_family rf_model_family_gpt_oss = {
    .name = "gpt_oss",
    .trainable = 1,
    .router = RF_MODEL_ROUTER_TOPK_SOFTMAX,
    .qk_norm = 0,
    .o_bias = 1,
    .attention_sinks = 1,
    .read = gpt_oss_read,
    .layer_is_moe = gpt_oss_layer_is_moe,
    .describe_layer = gpt_oss_describe_layer,
    .layer_slot = gpt_oss_layer_slot,
    .experts_per_token = gpt_oss_experts_per_token,
};
