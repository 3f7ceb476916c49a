/* The llama family (transformers' LlamaForCausalLM) and its variant qwen2
 * (Qwen2ForCausalLM: the same math with biases on q, k and v, none on o; its
 * sliding-window attention refused): the dense decoder every other trainable
 * family extends. Its fields, tensor names and slots; the math is model.c's. */
#include <cjson/cJSON.h>
#include <string.h>

#include "core/core.h"
#include "model/family.h"

/* The llama fields: head_dim defaults to hidden_size / num_attention_heads. */
int rf_model_llama_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  int dflt =
      cfg->hidden_size % cfg->num_attention_heads == 0 ? cfg->hidden_size / cfg->num_attention_heads : -1;
  const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j->root, "head_dim");
  RF_REQUIRE(dflt > 0 || (hd && !cJSON_IsNull(hd)),
             "%s: num_attention_heads (%d) does not divide hidden_size (%d) and there is no field 'head_dim'",
             j->path, cfg->num_attention_heads, cfg->hidden_size);
  RF_TRY(rf_model_json_int(j, "head_dim", dflt, 0, &cfg->head_dim));
  RF_TRY(rf_model_json_bool(j, "attention_bias", 0, &cfg->attention_bias));
  return rf_model_json_bool(j, "mlp_bias", 0, &cfg->mlp_bias);
}

/* qwen2: the llama fields (head_dim, mlp_bias), q, k, v biases always; sliding-window
 * attention recorded (layer_types other than full_attention, or use_sliding_window). */
static int qwen2_read(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  RF_TRY(rf_model_llama_read(j, cfg));
  cfg->attention_bias = 1;
  const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j->root, "layer_types");
  if (lt && !cJSON_IsNull(lt)) {
    RF_REQUIRE(cJSON_IsArray(lt), "%s: field 'layer_types' must be an array", j->path);
    for (const cJSON *x = lt->child; x; x = x->next)
      if (!cJSON_IsString(x) || strcmp(x->valuestring, "full_attention") != 0)
        cfg->sliding_field = "layer_types";
    return 0;
  }
  int sliding = 0;
  RF_TRY(rf_model_json_bool(j, "use_sliding_window", 0, &sliding));
  if (sliding) cfg->sliding_field = "use_sliding_window";
  return 0;
}

/* A llama layer's slots: the nine weights INPUT_NORM..DOWN, then the attention
 * biases (attention_bias: q, k, v and, when the family has o_bias, o) and the MLP
 * biases (mlp_bias: gate, up, down) when the config has them; no router, experts
 * or q/k norms. */
static int llama_layer_slot(const struct rf_model_config *cfg, int layer, enum rf_model_layer_tensor t) {
  (void)layer;
  if (t > RF_MODEL_LAYER_TENSOR_DOWN_BIAS) return -1;
  int slot = 0;
  for (int i = 0; i <= (int)t; i++) {
    int present =
        i <= RF_MODEL_LAYER_TENSOR_DOWN ||
        (i < RF_MODEL_LAYER_TENSOR_O_BIAS    ? cfg->attention_bias
         : i == RF_MODEL_LAYER_TENSOR_O_BIAS ? cfg->attention_bias && rf_model_config_family(cfg)->o_bias
                                             : cfg->mlp_bias);
    if (i == (int)t) return present ? slot : -1;
    slot += present;
  }
  return -1;
}

/* A llama layer: its tensors in the order of enum rf_model_layer_tensor, under
 * the names of transformers' LlamaForCausalLM (and Qwen2ForCausalLM). */
static void llama_describe_layer(struct rf_model_desc_builder *b, const struct rf_model_config *c, int l,
                                 const char *p) {
  int64_t h = c->hidden_size, f = c->intermediate_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
  int64_t kd = (int64_t)c->num_key_value_heads * c->head_dim;
  static const char *const names[RF_MODEL_LAYER_MAX_TENSORS] = {
      "input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",    "mlp.up_proj.weight",      "mlp.down_proj.weight",
      "self_attn.q_proj.bias",   "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
      "self_attn.o_proj.bias",   "mlp.gate_proj.bias",      "mlp.up_proj.bias",
      "mlp.down_proj.bias"};
  const int64_t rows[RF_MODEL_LAYER_MAX_TENSORS] = {h, qd, kd, kd, h, h, f, f, h, qd, kd, kd, h, f, f, h};
  const int64_t cols[RF_MODEL_LAYER_MAX_TENSORS] = {0, h, h, h, qd, 0, h, h, f};
  for (int t = 0; t <= RF_MODEL_LAYER_TENSOR_DOWN_BIAS; t++) {
    if (rf_model_layer_slot(c, l, (enum rf_model_layer_tensor)t) < 0) continue;
    enum rf_model_desc_kind kind = cols[t] == 0 ? RF_MODEL_DESC_KIND_BIAS
                                   : t == RF_MODEL_LAYER_TENSOR_O || t == RF_MODEL_LAYER_TENSOR_DOWN
                                       ? RF_MODEL_DESC_KIND_RESIDUAL
                                       : RF_MODEL_DESC_KIND_LINEAR;
    if (t == RF_MODEL_LAYER_TENSOR_INPUT_NORM || t == RF_MODEL_LAYER_TENSOR_POST_NORM)
      kind = RF_MODEL_DESC_KIND_NORM;
    if (cols[t] == 0)
      rf_model_desc_add(b, kind, 1, RF_MODEL_DESC_V(rows[t]), "%s.%s", p, names[t]);
    else
      rf_model_desc_add(b, kind, 2, RF_MODEL_DESC_V(rows[t], cols[t]), "%s.%s", p, names[t]);
  }
}

const struct rf_model_family rf_model_family_llama = {
    .name = "llama",
    .trainable = 1,
    .router = RF_MODEL_ROUTER_NONE,
    .qk_norm = 0,
    .o_bias = 1,
    .read = rf_model_llama_read,
    .describe_layer = llama_describe_layer,
    .layer_slot = llama_layer_slot,
};

const struct rf_model_family rf_model_family_qwen2 = {
    .name = "qwen2",
    .trainable = 1,
    .router = RF_MODEL_ROUTER_NONE,
    .qk_norm = 0,
    .o_bias = 0, /* q, k, v biases only */
    .read = qwen2_read,
    .describe_layer = llama_describe_layer,
    .layer_slot = llama_layer_slot,
};
