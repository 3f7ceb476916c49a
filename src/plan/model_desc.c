/* Model descriptions: a Hugging Face config.json (llama, gpt_oss, deepseek_v3)
 * or a generic units file, expanded into the units and tensors (names and
 * shapes as in the models' checkpoints) that the planner lays out. */
#include <cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

/* Growing arrays while a model is built. */
struct rf_plan_model_builder {
  struct rf_plan_model *m;
  int cap_units;
  int cap_tensors; /* of the current unit */
};

static char *rf_plan_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = rf_xmalloc(n);
  memcpy(d, s, n);
  return d;
}

static void rf_plan_builder_unit(struct rf_plan_model_builder *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void rf_plan_builder_unit(struct rf_plan_model_builder *b, const char *fmt, ...) {
  struct rf_plan_model *m = b->m;
  if (m->n_units == b->cap_units) {
    b->cap_units = b->cap_units ? 2 * b->cap_units : 16;
    struct rf_plan_model_unit *u = rf_xcalloc((size_t)b->cap_units, sizeof *u);
    if (m->n_units) memcpy(u, m->units, (size_t)m->n_units * sizeof *u);
    free(m->units);
    m->units = u;
  }
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  m->units[m->n_units++] = (struct rf_plan_model_unit){rf_plan_strdup(name), 0, NULL, 0};
  b->cap_tensors = 0;
}

/* Adds a tensor to the current unit. shape has ndim entries, all already checked positive. */
static struct rf_plan_model_tensor *rf_plan_builder_add(struct rf_plan_model_builder *b, const char *name,
                                                        int ndim, const int64_t *shape) {
  struct rf_plan_model_unit *u = &b->m->units[b->m->n_units - 1];
  if (u->n_tensors == b->cap_tensors) {
    b->cap_tensors = b->cap_tensors ? 2 * b->cap_tensors : 16;
    struct rf_plan_model_tensor *t = rf_xcalloc((size_t)b->cap_tensors, sizeof *t);
    if (u->n_tensors) memcpy(t, u->tensors, (size_t)u->n_tensors * sizeof *t);
    free(u->tensors);
    u->tensors = t;
  }
  struct rf_plan_model_tensor *t = &u->tensors[u->n_tensors++];
  memset(t, 0, sizeof *t);
  t->name = rf_plan_strdup(name);
  t->ndim = ndim;
  t->numel = 1;
  for (int d = 0; d < ndim; d++) t->shape[d] = shape[d], t->numel *= shape[d];
  t->sub_count = 1;
  u->numel += t->numel;
  b->m->numel += t->numel;
  b->m->n_tensors++;
  if (u->n_tensors > b->m->max_tensors) b->m->max_tensors = u->n_tensors;
  return t;
}

/* Shorthands for the Hugging Face layouts: a 1-, 2- or 3-D tensor named by a format. */
static struct rf_plan_model_tensor *rf_plan_t1(struct rf_plan_model_builder *b, int64_t d0, const char *fmt,
                                               ...) __attribute__((format(printf, 3, 4)));
static struct rf_plan_model_tensor *rf_plan_t1(struct rf_plan_model_builder *b, int64_t d0, const char *fmt,
                                               ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  return rf_plan_builder_add(b, name, 1, (int64_t[]){d0});
}

static struct rf_plan_model_tensor *rf_plan_t2(struct rf_plan_model_builder *b, int64_t d0, int64_t d1,
                                               const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static struct rf_plan_model_tensor *rf_plan_t2(struct rf_plan_model_builder *b, int64_t d0, int64_t d1,
                                               const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  return rf_plan_builder_add(b, name, 2, (int64_t[]){d0, d1});
}

static struct rf_plan_model_tensor *rf_plan_t3(struct rf_plan_model_builder *b, int64_t d0, int64_t d1,
                                               int64_t d2, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static struct rf_plan_model_tensor *rf_plan_t3(struct rf_plan_model_builder *b, int64_t d0, int64_t d1,
                                               int64_t d2, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  return rf_plan_builder_add(b, name, 3, (int64_t[]){d0, d1, d2});
}

/* ---- JSON fields ---- */

/* A positive integer (exact in a double, below 2^40). */
static int rf_plan_json_positive(const cJSON *v, int64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 1 && d < 1099511627776.0) || floor(d) != d) return 0;
  *out = (int64_t)d;
  return 1;
}

/* Reads config field `key` (a positive integer). Missing: *out = dflt when
 * dflt > 0, else an error. */
static int rf_plan_cfg_int(const cJSON *cfg, const char *path, const char *key, int64_t dflt, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  *out = dflt;
  if (!v || cJSON_IsNull(v)) {
    RF_REQUIRE(dflt > 0, "%s: field '%s' is missing", path, key);
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(rf_plan_json_positive(v, out), "%s: field '%s' must be a positive integer", path, key);
  return 0;
}

/* A boolean field (missing: dflt). */
static int rf_plan_cfg_bool(const cJSON *cfg, const char *path, const char *key, int dflt, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
  if (!v || cJSON_IsNull(v)) {
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(cJSON_IsBool(v), "%s: field '%s' must be true or false", path, key);
  *out = cJSON_IsTrue(v);
  return 0;
}

/* ---- Hugging Face layouts ---- */

/* The input norm and grouped-query attention of layer i (LLaMA and GPT-OSS names),
 * biases when `bias`. */
static void rf_plan_gqa_attention(struct rf_plan_model_builder *b, long long i, int64_t h, int64_t heads,
                                  int64_t kv, int64_t hd, int bias) {
  const char *p = "model.layers";
  rf_plan_t1(b, h, "%s.%lld.input_layernorm.weight", p, i);
  rf_plan_t2(b, heads * hd, h, "%s.%lld.self_attn.q_proj.weight", p, i);
  if (bias) rf_plan_t1(b, heads * hd, "%s.%lld.self_attn.q_proj.bias", p, i);
  rf_plan_t2(b, kv * hd, h, "%s.%lld.self_attn.k_proj.weight", p, i);
  if (bias) rf_plan_t1(b, kv * hd, "%s.%lld.self_attn.k_proj.bias", p, i);
  rf_plan_t2(b, kv * hd, h, "%s.%lld.self_attn.v_proj.weight", p, i);
  if (bias) rf_plan_t1(b, kv * hd, "%s.%lld.self_attn.v_proj.bias", p, i);
  rf_plan_t2(b, h, heads * hd, "%s.%lld.self_attn.o_proj.weight", p, i);
  if (bias) rf_plan_t1(b, h, "%s.%lld.self_attn.o_proj.bias", p, i);
}

static int rf_plan_expand_llama(const cJSON *cfg, const char *path, struct rf_plan_model_builder *b) {
  int64_t h = 0, inter = 0, heads = 1, kv = 0, layers = 0, vocab = 0, hd = 0;
  int tie = 0, bias = 0, mlp_bias = 0;
  RF_TRY(rf_plan_cfg_int(cfg, path, "hidden_size", 0, &h));
  RF_TRY(rf_plan_cfg_int(cfg, path, "intermediate_size", 0, &inter));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_attention_heads", 0, &heads));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_key_value_heads", heads, &kv));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_hidden_layers", 0, &layers));
  RF_TRY(rf_plan_cfg_int(cfg, path, "vocab_size", 0, &vocab));
  RF_REQUIRE(heads > 0 && (h % heads == 0 || cJSON_GetObjectItemCaseSensitive(cfg, "head_dim")),
             "%s: field 'hidden_size' %lld is not a multiple of num_attention_heads %lld", path, (long long)h,
             (long long)heads);
  RF_TRY(rf_plan_cfg_int(cfg, path, "head_dim", h / heads, &hd));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "tie_word_embeddings", 0, &tie));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "attention_bias", 0, &bias));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "mlp_bias", 0, &mlp_bias));
  rf_plan_builder_unit(b, "embed");
  rf_plan_t2(b, vocab, h, "model.embed_tokens.weight");
  for (int64_t l = 0; l < layers; l++) {
    rf_plan_builder_unit(b, "layers.%lld", (long long)l);
    const char *p = "model.layers";
    long long i = (long long)l;
    rf_plan_gqa_attention(b, i, h, heads, kv, hd, bias);
    rf_plan_t1(b, h, "%s.%lld.post_attention_layernorm.weight", p, i);
    rf_plan_t2(b, inter, h, "%s.%lld.mlp.gate_proj.weight", p, i);
    if (mlp_bias) rf_plan_t1(b, inter, "%s.%lld.mlp.gate_proj.bias", p, i);
    rf_plan_t2(b, inter, h, "%s.%lld.mlp.up_proj.weight", p, i);
    if (mlp_bias) rf_plan_t1(b, inter, "%s.%lld.mlp.up_proj.bias", p, i);
    rf_plan_t2(b, h, inter, "%s.%lld.mlp.down_proj.weight", p, i);
    if (mlp_bias) rf_plan_t1(b, h, "%s.%lld.mlp.down_proj.bias", p, i);
  }
  rf_plan_builder_unit(b, "head");
  rf_plan_t1(b, h, "model.norm.weight");
  if (!tie) rf_plan_t2(b, vocab, h, "lm_head.weight");
  return 0;
}

static int rf_plan_expand_gpt_oss(const cJSON *cfg, const char *path, struct rf_plan_model_builder *b) {
  int64_t h = 0, inter = 0, heads = 0, kv = 0, layers = 0, vocab = 0, hd = 0, experts = 0;
  int tie = 0, bias = 0;
  RF_TRY(rf_plan_cfg_int(cfg, path, "hidden_size", 0, &h));
  RF_TRY(rf_plan_cfg_int(cfg, path, "intermediate_size", 0, &inter));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_attention_heads", 0, &heads));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_key_value_heads", heads, &kv));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_hidden_layers", 0, &layers));
  RF_TRY(rf_plan_cfg_int(cfg, path, "vocab_size", 0, &vocab));
  RF_TRY(rf_plan_cfg_int(cfg, path, "head_dim", 0, &hd));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_local_experts", 0, &experts));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "tie_word_embeddings", 0, &tie));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "attention_bias", 1, &bias));
  rf_plan_builder_unit(b, "embed");
  rf_plan_t2(b, vocab, h, "model.embed_tokens.weight");
  for (int64_t l = 0; l < layers; l++) {
    rf_plan_builder_unit(b, "layers.%lld", (long long)l);
    const char *p = "model.layers";
    long long i = (long long)l;
    rf_plan_gqa_attention(b, i, h, heads, kv, hd, bias);
    rf_plan_t1(b, heads, "%s.%lld.self_attn.sinks", p, i);
    rf_plan_t1(b, h, "%s.%lld.post_attention_layernorm.weight", p, i);
    rf_plan_t2(b, experts, h, "%s.%lld.mlp.router.weight", p, i);
    rf_plan_t1(b, experts, "%s.%lld.mlp.router.bias", p, i);
    rf_plan_t3(b, experts, h, 2 * inter, "%s.%lld.mlp.experts.gate_up_proj", p, i)->sub_count = experts;
    rf_plan_t2(b, experts, 2 * inter, "%s.%lld.mlp.experts.gate_up_proj_bias", p, i)->sub_count = experts;
    rf_plan_t3(b, experts, inter, h, "%s.%lld.mlp.experts.down_proj", p, i)->sub_count = experts;
    rf_plan_t2(b, experts, h, "%s.%lld.mlp.experts.down_proj_bias", p, i)->sub_count = experts;
  }
  rf_plan_builder_unit(b, "head");
  rf_plan_t1(b, h, "model.norm.weight");
  if (!tie) rf_plan_t2(b, vocab, h, "lm_head.weight");
  return 0;
}

/* An MLP of three projections (gate, up: [f, h]; down: [h, f]) under prefix. */
static void rf_plan_mlp(struct rf_plan_model_builder *b, const char *prefix, int64_t h, int64_t f) {
  rf_plan_t2(b, f, h, "%s.gate_proj.weight", prefix);
  rf_plan_t2(b, f, h, "%s.up_proj.weight", prefix);
  rf_plan_t2(b, h, f, "%s.down_proj.weight", prefix);
}

static int rf_plan_expand_deepseek_v3(const cJSON *cfg, const char *path, struct rf_plan_model_builder *b) {
  int64_t h, inter, moe_inter, routed, shared, layers, dense, freq, heads, q_rank = 0, kv_rank, nope, rope,
                                                                           vdim, vocab;
  int tie;
  RF_TRY(rf_plan_cfg_int(cfg, path, "hidden_size", 0, &h));
  RF_TRY(rf_plan_cfg_int(cfg, path, "intermediate_size", 0, &inter));
  RF_TRY(rf_plan_cfg_int(cfg, path, "moe_intermediate_size", 0, &moe_inter));
  RF_TRY(rf_plan_cfg_int(cfg, path, "n_routed_experts", 0, &routed));
  RF_TRY(rf_plan_cfg_int(cfg, path, "n_shared_experts", 0, &shared));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_hidden_layers", 0, &layers));
  const cJSON *fk = cJSON_GetObjectItemCaseSensitive(cfg, "first_k_dense_replace");
  RF_REQUIRE(fk && cJSON_IsNumber(fk) && fk->valuedouble >= 0 && floor(fk->valuedouble) == fk->valuedouble,
             "%s: field 'first_k_dense_replace' must be a non-negative integer", path);
  dense = (int64_t)fk->valuedouble;
  RF_TRY(rf_plan_cfg_int(cfg, path, "moe_layer_freq", 1, &freq));
  RF_TRY(rf_plan_cfg_int(cfg, path, "num_attention_heads", 0, &heads));
  const cJSON *q = cJSON_GetObjectItemCaseSensitive(cfg, "q_lora_rank");
  if (q && !cJSON_IsNull(q)) RF_TRY(rf_plan_cfg_int(cfg, path, "q_lora_rank", 0, &q_rank));
  RF_TRY(rf_plan_cfg_int(cfg, path, "kv_lora_rank", 0, &kv_rank));
  RF_TRY(rf_plan_cfg_int(cfg, path, "qk_nope_head_dim", 0, &nope));
  RF_TRY(rf_plan_cfg_int(cfg, path, "qk_rope_head_dim", 0, &rope));
  RF_TRY(rf_plan_cfg_int(cfg, path, "v_head_dim", 0, &vdim));
  RF_TRY(rf_plan_cfg_int(cfg, path, "vocab_size", 0, &vocab));
  RF_TRY(rf_plan_cfg_bool(cfg, path, "tie_word_embeddings", 0, &tie));
  rf_plan_builder_unit(b, "embed");
  rf_plan_t2(b, vocab, h, "model.embed_tokens.weight");
  /* The multi-token-prediction layers (num_nextn_predict_layers) are not part of the model proper. */
  for (int64_t l = 0; l < layers; l++) {
    rf_plan_builder_unit(b, "layers.%lld", (long long)l);
    char p[128], e[192];
    snprintf(p, sizeof p, "model.layers.%lld", (long long)l);
    rf_plan_t1(b, h, "%s.input_layernorm.weight", p);
    if (q_rank) {
      rf_plan_t2(b, q_rank, h, "%s.self_attn.q_a_proj.weight", p);
      rf_plan_t1(b, q_rank, "%s.self_attn.q_a_layernorm.weight", p);
      rf_plan_t2(b, heads * (nope + rope), q_rank, "%s.self_attn.q_b_proj.weight", p);
    } else {
      rf_plan_t2(b, heads * (nope + rope), h, "%s.self_attn.q_proj.weight", p);
    }
    rf_plan_t2(b, kv_rank + rope, h, "%s.self_attn.kv_a_proj_with_mqa.weight", p);
    rf_plan_t1(b, kv_rank, "%s.self_attn.kv_a_layernorm.weight", p);
    rf_plan_t2(b, heads * (nope + vdim), kv_rank, "%s.self_attn.kv_b_proj.weight", p);
    rf_plan_t2(b, h, heads * vdim, "%s.self_attn.o_proj.weight", p);
    rf_plan_t1(b, h, "%s.post_attention_layernorm.weight", p);
    if (l < dense || l % freq != 0) {
      snprintf(e, sizeof e, "%s.mlp", p);
      rf_plan_mlp(b, e, h, inter);
      continue;
    }
    rf_plan_t2(b, routed, h, "%s.mlp.gate.weight", p);
    rf_plan_t1(b, routed, "%s.mlp.gate.e_score_correction_bias", p);
    for (int64_t x = 0; x < routed; x++) {
      snprintf(e, sizeof e, "%s.mlp.experts.%lld", p, (long long)x);
      rf_plan_mlp(b, e, h, moe_inter);
    }
    snprintf(e, sizeof e, "%s.mlp.shared_experts", p);
    rf_plan_mlp(b, e, h, moe_inter * shared);
  }
  rf_plan_builder_unit(b, "head");
  rf_plan_t1(b, h, "model.norm.weight");
  if (!tie) rf_plan_t2(b, vocab, h, "lm_head.weight");
  return 0;
}

/* ---- the generic format ---- */

static int rf_plan_expand_generic(const cJSON *units, const char *path, struct rf_plan_model_builder *b) {
  RF_REQUIRE(cJSON_IsArray(units) && cJSON_GetArraySize(units) > 0,
             "%s: field 'units' must be a non-empty array", path);
  int ui = 0;
  for (const cJSON *u = units->child; u; u = u->next, ui++) {
    RF_REQUIRE(cJSON_IsObject(u), "%s: units[%d] must be an object", path, ui);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(u, "name");
    RF_REQUIRE(cJSON_IsString(name) && name->valuestring[0], "%s: units[%d].name must be a non-empty string",
               path, ui);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(u, "tensors");
    RF_REQUIRE(cJSON_IsArray(tensors) && cJSON_GetArraySize(tensors) > 0,
               "%s: units[%d].tensors must be a non-empty array", path, ui);
    rf_plan_builder_unit(b, "%s", name->valuestring);
    int ti = 0;
    for (const cJSON *t = tensors->child; t; t = t->next, ti++) {
      RF_REQUIRE(cJSON_IsObject(t), "%s: units[%d].tensors[%d] must be an object", path, ui, ti);
      const cJSON *tn = cJSON_GetObjectItemCaseSensitive(t, "name");
      RF_REQUIRE(cJSON_IsString(tn) && tn->valuestring[0],
                 "%s: units[%d].tensors[%d].name must be a non-empty string", path, ui, ti);
      const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
      int ndim = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : 0;
      RF_REQUIRE(ndim >= 1 && ndim <= RF_PLAN_MAX_DIMS,
                 "%s: units[%d].tensors[%d].shape must be an array of 1 to %d dimensions", path, ui, ti,
                 RF_PLAN_MAX_DIMS);
      int64_t dims[RF_PLAN_MAX_DIMS] = {0}, numel = 1;
      int d = 0;
      for (const cJSON *v = shape->child; v; v = v->next, d++) {
        RF_REQUIRE(rf_plan_json_positive(v, &dims[d]),
                   "%s: units[%d].tensors[%d].shape[%d] must be a positive integer", path, ui, ti, d);
        RF_REQUIRE(numel <= (INT64_C(1) << 50) / dims[d],
                   "%s: units[%d].tensors[%d].shape: too many elements", path, ui, ti);
        numel *= dims[d];
      }
      int64_t block_rows = 0, sub = 1;
      const cJSON *br = cJSON_GetObjectItemCaseSensitive(t, "block_rows");
      if (br) {
        RF_REQUIRE(rf_plan_json_positive(br, &block_rows),
                   "%s: units[%d].tensors[%d].block_rows must be a positive integer", path, ui, ti);
      }
      const cJSON *sc = cJSON_GetObjectItemCaseSensitive(t, "sub_count");
      if (sc) {
        RF_REQUIRE(rf_plan_json_positive(sc, &sub) && dims[0] % sub == 0,
                   "%s: units[%d].tensors[%d].sub_count must be a positive integer dividing shape[0]", path,
                   ui, ti);
      }
      struct rf_plan_model_tensor *x = rf_plan_builder_add(b, tn->valuestring, ndim, dims);
      x->block_rows = block_rows;
      x->sub_count = sub;
    }
  }
  return 0;
}

static int rf_plan_model_expand(const cJSON *root, const char *path, struct rf_plan_model *out) {
  struct rf_plan_model_builder b = {out, 0, 0};
  RF_REQUIRE(cJSON_IsObject(root), "%s: not a JSON object", path);
  const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
  if (units) {
    out->model_type = rf_plan_strdup("generic");
    return rf_plan_expand_generic(units, path, &b);
  }
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  RF_REQUIRE(type, "%s: field 'model_type' is missing (and no 'units' array)", path);
  RF_REQUIRE(cJSON_IsString(type), "%s: field 'model_type' must be a string", path);
  out->model_type = rf_plan_strdup(type->valuestring);
  if (strcmp(type->valuestring, "llama") == 0) return rf_plan_expand_llama(root, path, &b);
  if (strcmp(type->valuestring, "gpt_oss") == 0) return rf_plan_expand_gpt_oss(root, path, &b);
  if (strcmp(type->valuestring, "deepseek_v3") == 0) return rf_plan_expand_deepseek_v3(root, path, &b);
  RF_FAIL("%s: field 'model_type': unknown model type '%s' (known: llama, gpt_oss, deepseek_v3)", path,
          type->valuestring);
}

int rf_plan_model_parse(const char *text, const char *path, struct rf_plan_model *out) {
  memset(out, 0, sizeof *out);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (!root) {
    long at = end ? (long)(end - text) : -1;
    RF_FAIL("%s: malformed JSON near byte %ld", path, at);
  }
  int rc = rf_plan_model_expand(root, path, out);
  cJSON_Delete(root);
  if (rc != 0) {
    rf_plan_model_free(out);
    return -1;
  }
  return 0;
}

int rf_plan_model_load(const char *path, struct rf_plan_model *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t bytes = 0;
  RF_TRY(rf_file_read_all(path, &text, &bytes));
  int rc = rf_plan_model_parse(text, path, out);
  free(text);
  return rc;
}

void rf_plan_model_free(struct rf_plan_model *model) {
  for (int u = 0; u < model->n_units; u++) {
    for (int t = 0; t < model->units[u].n_tensors; t++) free(model->units[u].tensors[t].name);
    free(model->units[u].tensors);
    free(model->units[u].name);
  }
  free(model->units);
  free(model->model_type);
  memset(model, 0, sizeof *model);
}

void rf_plan_model_unit_input(const struct rf_plan_model_unit *u, int64_t block_rows,
                              struct rf_plan_tensor_in *tensors, struct rf_plan_unit_in *in) {
  for (int i = 0; i < u->n_tensors; i++) {
    const struct rf_plan_model_tensor *t = &u->tensors[i];
    struct rf_plan_tensor_in *x = &tensors[i];
    memset(x, 0, sizeof *x);
    x->name = t->name;
    x->ndim = t->ndim;
    memcpy(x->shape, t->shape, sizeof x->shape);
    x->numel = t->numel;
    x->sub_count = t->sub_count;
    if (t->ndim == 1) {
      x->block_elems = 1;
    } else {
      int64_t row = t->shape[t->ndim - 1], rows = t->numel / row;
      int64_t r = t->block_rows > 0 ? t->block_rows : block_rows;
      x->block_elems = rf_min_i64(r, rows) * row;
    }
  }
  *in = (struct rf_plan_unit_in){u->name, u->n_tensors, tensors};
}
