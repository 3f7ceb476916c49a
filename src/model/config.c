/* The one reader of a Hugging Face config.json, for every model family
 * (families.c): the fields every family shares are read here, then the family's
 * own (its `read`, in its file); the planner's descriptions and the trainable
 * model both read their configuration here. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/config.h"
#include "model/family.h"
#include "rfsdp_model.h"

int rf_train_model_families(char *out, size_t size, int trainable, const char *sep) {
  RF_REQUIRE(out && size > 0 && sep, "rf_train_model_families: no buffer or separator");
  size_t at = 0;
  out[0] = 0;
  for (int f = 0; f < rf_model_family_count(); f++) {
    const struct rf_model_family *family = rf_model_family_at(f);
    if (trainable && !family->trainable) continue;
    int n = snprintf(out + at, size - at, "%s%s", at ? sep : "", family->name);
    RF_REQUIRE(n >= 0 && (size_t)n < size - at, "rf_train_model_families: a buffer of %zu bytes is too small",
               size);
    at += (size_t)n;
  }
  return 0;
}

int rf_model_config_is_moe(const struct rf_model_config *cfg) {
  return rf_model_config_family(cfg)->trainable &&
         rf_model_config_family(cfg)->router != RF_MODEL_ROUTER_NONE;
}

int rf_model_config_moe_layers(const struct rf_model_config *cfg) {
  int n = 0;
  for (int l = 0; l < cfg->num_hidden_layers; l++) n += rf_model_config_layer_is_moe(cfg, l);
  return n;
}

/* The routed experts of a trainable MoE config. */
static int rf_model_config_check_moe(const struct rf_model_config *cfg, const char *what) {
  int e = cfg->moe.num_local_experts, k = cfg->moe.num_experts_per_tok;
  const char *field = cfg->moe.experts_field ? cfg->moe.experts_field : "num_local_experts";
  RF_REQUIRE(e > 0, "%s: field '%s' must be positive (got %d)", what, field, e);
  RF_REQUIRE(k > 0 && k <= e, "%s: field 'num_experts_per_tok' (%d%s) must be in 1..%s (%d)", what, k,
             cfg->moe.topk_given ? "" : ": not in the config, the default of the model type", field, e);
  RF_REQUIRE(cfg->moe.router_jitter_noise == 0.0,
             "%s: field 'router_jitter_noise': %g is not implemented (only 0)", what,
             cfg->moe.router_jitter_noise);
  return 0;
}

int rf_model_config_check(struct rf_model_config *cfg, const char *what) {
  if (!rf_model_family_trainable(rf_model_config_family(cfg))) {
    char names[256];
    RF_TRY(rf_train_model_families(names, sizeof names, 1, ", "));
    RF_FAIL("%s: field 'model_type': only %s models can be trained (%s can be planned)", what, names,
            rf_model_family_name(rf_model_config_family(cfg)));
  }
  if (rf_model_config_is_moe(cfg)) RF_TRY(rf_model_config_check_moe(cfg, what));
  const struct {
    const char *name;
    int value;
  } ints[] = {{"hidden_size", cfg->hidden_size},
              {"intermediate_size", cfg->intermediate_size},
              {"num_hidden_layers", cfg->num_hidden_layers},
              {"num_attention_heads", cfg->num_attention_heads},
              {"num_key_value_heads", cfg->num_key_value_heads},
              {"vocab_size", cfg->vocab_size},
              {"max_position_embeddings", cfg->max_position_embeddings}};
  for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++)
    RF_REQUIRE(ints[i].value > 0, "%s: field '%s' must be positive (got %d)", what, ints[i].name,
               ints[i].value);
  RF_REQUIRE(cfg->num_attention_heads % cfg->num_key_value_heads == 0,
             "%s: num_key_value_heads (%d) does not divide num_attention_heads (%d)", what,
             cfg->num_key_value_heads, cfg->num_attention_heads);
  if (cfg->head_dim == 0) {
    RF_REQUIRE(cfg->hidden_size % cfg->num_attention_heads == 0,
               "%s: num_attention_heads (%d) does not divide hidden_size (%d)", what,
               cfg->num_attention_heads, cfg->hidden_size);
    cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  }
  RF_REQUIRE(cfg->head_dim > 0, "%s: field 'head_dim' must be positive (got %d)", what, cfg->head_dim);
  RF_REQUIRE(cfg->head_dim % 2 == 0, "%s: field 'head_dim' (%d) must be even (rotary pairs)", what,
             cfg->head_dim);
  RF_REQUIRE(cfg->rms_norm_eps > 0.0f && isfinite(cfg->rms_norm_eps),
             "%s: field 'rms_norm_eps' must be positive", what);
  RF_REQUIRE(cfg->rope_theta > 0.0 && isfinite(cfg->rope_theta), "%s: field 'rope_theta' must be positive",
             what);
  RF_REQUIRE(!cfg->rope_type[0] || strcmp(cfg->rope_type, "default") == 0 ||
                 (strcmp(cfg->rope_type, "yarn") == 0 && cfg->yarn.factor > 0),
             "%s: field '%s': rope_type '%s' is not implemented (only 'default')", what, cfg->rope_field,
             cfg->rope_type);
  RF_REQUIRE(!cfg->hidden_act[0] || strcmp(cfg->hidden_act, "silu") == 0,
             "%s: field 'hidden_act': '%s' is not implemented (only 'silu')", what, cfg->hidden_act);
  RF_REQUIRE(!cfg->sliding_field || !cfg->sliding_field[0],
             "%s: field '%s': sliding-window attention is not implemented (only full attention)", what,
             cfg->sliding_field);
  RF_REQUIRE(cfg->attention_dropout == 0.0, "%s: field 'attention_dropout': %g is not implemented (only 0)",
             what, cfg->attention_dropout);
  RF_REQUIRE(cfg->partial_rotary_factor == 0.0 || cfg->partial_rotary_factor == 1.0,
             "%s: field 'partial_rotary_factor': %g is not implemented (only 1)", what,
             cfg->partial_rotary_factor);
  if (rf_model_config_family(cfg)->check) RF_TRY(rf_model_config_family(cfg)->check(cfg, what));
  return 0;
}

/* YaRN's mscale: 0.1 m ln(factor) + 1 (1 when factor <= 1), transformers' yarn_get_mscale. */
static double yarn_mscale(double factor, double m) { return factor <= 1 ? 1.0 : 0.1 * m * log(factor) + 1.0; }

int rf_model_json_yarn(const struct rf_model_config_json *j, struct rf_model_config *cfg, int mscale_ok) {
  if (strcmp(cfg->rope_type, "yarn") != 0) return 0;
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(j->root, cfg->rope_field);
  struct rf_model_yarn *y = &cfg->yarn;
  RF_TRY(rf_model_json_double(j, o, "factor", 0.0, &y->factor));
  RF_REQUIRE(y->factor > 0, "%s: field '%s': yarn without 'factor'", j->path, cfg->rope_field);
  RF_TRY(rf_model_json_double(j, o, "beta_fast", 32.0, &y->beta_fast));
  RF_TRY(rf_model_json_double(j, o, "beta_slow", 1.0, &y->beta_slow));
  RF_TRY(rf_model_json_double(j, o, "original_max_position_embeddings", 0.0, &y->original_max));
  RF_REQUIRE(y->original_max > 0, "%s: field '%s': yarn without 'original_max_position_embeddings'", j->path,
             cfg->rope_field);
  RF_REQUIRE(mscale_ok || (!cJSON_GetObjectItemCaseSensitive(o, "mscale") &&
                           !cJSON_GetObjectItemCaseSensitive(o, "mscale_all_dim")),
             "%s: field '%s': yarn's mscale is not implemented", j->path, cfg->rope_field);
  double mscale = 0, mscale_all_dim = 0;
  if (mscale_ok) {
    RF_TRY(rf_model_json_double(j, o, "mscale", 0.0, &mscale));
    RF_TRY(rf_model_json_double(j, o, "mscale_all_dim", 0.0, &mscale_all_dim));
  }
  double att = mscale > 0 && mscale_all_dim > 0
                   ? yarn_mscale(y->factor, mscale) / yarn_mscale(y->factor, mscale_all_dim)
                   : yarn_mscale(y->factor, 1.0);
  RF_TRY(rf_model_json_double(j, o, "attention_factor", att, &y->attention_factor));
  y->softmax_mscale = mscale_all_dim > 0 ? yarn_mscale(y->factor, mscale_all_dim) : 1.0;
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "truncate");
  RF_REQUIRE(!t || cJSON_IsBool(t), "%s: field 'truncate' must be true or false", j->path);
  y->truncate = !t || cJSON_IsTrue(t);
  return 0;
}

/* Integer field `name`, a positive integer below 2^31 (zero too when zero_ok);
 * absent or null: *out = dflt, or an error when dflt < 0. */
int rf_model_json_int(const struct rf_model_config_json *j, const char *name, int dflt, int zero_ok,
                      int *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(j->root, name);
  if (!it || cJSON_IsNull(it)) {
    RF_REQUIRE(dflt >= 0, "%s: field '%s' is missing%s", j->path, name, j->assumed);
    *out = dflt;
    return 0;
  }
  double v = cJSON_IsNumber(it) ? it->valuedouble : -1.0;
  RF_REQUIRE((v > 0 || (zero_ok && v == 0)) && v < 2147483648.0 && floor(v) == v,
             "%s: field '%s' must be a %s integer", j->path, name, zero_ok ? "non-negative" : "positive");
  *out = (int)v;
  return 0;
}

/* A positive finite number; absent or null: dflt. */
int rf_model_json_double(const struct rf_model_config_json *j, const cJSON *obj, const char *name,
                         double dflt, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
  if (!it || cJSON_IsNull(it)) {
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(cJSON_IsNumber(it), "%s: field '%s' is not a number", j->path, name);
  RF_REQUIRE(it->valuedouble > 0 && isfinite(it->valuedouble), "%s: field '%s' must be positive (got %g)",
             j->path, name, it->valuedouble);
  *out = it->valuedouble;
  return 0;
}

/* A finite number >= 0; absent or null: dflt. */
int rf_model_json_nonneg(const struct rf_model_config_json *j, const char *name, double dflt, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(j->root, name);
  *out = dflt;
  if (!it || cJSON_IsNull(it)) return 0;
  RF_REQUIRE(cJSON_IsNumber(it) && it->valuedouble >= 0 && isfinite(it->valuedouble),
             "%s: field '%s' must be a number >= 0", j->path, name);
  *out = it->valuedouble;
  return 0;
}

/* true or false; absent or null: dflt. */
int rf_model_json_bool(const struct rf_model_config_json *j, const char *name, int dflt, int *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(j->root, name);
  if (!it || cJSON_IsNull(it)) {
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(cJSON_IsBool(it), "%s: field '%s' must be true or false", j->path, name);
  *out = cJSON_IsTrue(it);
  return 0;
}

/* A string into buf (size RF_MODEL_CONFIG_WORD); absent or null: dflt. */
int rf_model_json_word(const struct rf_model_config_json *j, const cJSON *obj, const char *name,
                       const char *dflt, char *buf) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
  const char *s = dflt;
  if (it && !cJSON_IsNull(it)) {
    RF_REQUIRE(cJSON_IsString(it), "%s: field '%s' must be a string", j->path, name);
    s = it->valuestring;
  }
  RF_REQUIRE(strlen(s) < RF_MODEL_CONFIG_WORD, "%s: field '%s' is too long ('%.40s...')", j->path, name, s);
  snprintf(buf, RF_MODEL_CONFIG_WORD, "%s", s);
  return 0;
}

/* RoPE: rope_theta at the top level or (transformers >= 5) inside
 * "rope_parameters"; the type from "rope_scaling" or "rope_parameters"
 * ("rope_type", older "type"); "default" when neither names one. */
static int rf_model_config_rope(const struct rf_model_config_json *j, struct rf_model_config *cfg) {
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j->root, "rope_parameters");
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j->root, "rope_scaling");
  const cJSON *objs[] = {rp, rs};
  const char *names[] = {"rope_parameters", "rope_scaling"};
  snprintf(cfg->rope_type, sizeof cfg->rope_type, "default");
  cfg->rope_field = "";
  for (int i = 0; i < 2; i++) {
    if (!objs[i] || cJSON_IsNull(objs[i])) continue;
    RF_REQUIRE(cJSON_IsObject(objs[i]), "%s: field '%s' must be an object", j->path, names[i]);
    const char *key = cJSON_GetObjectItemCaseSensitive(objs[i], "rope_type") ? "rope_type" : "type";
    char type[RF_MODEL_CONFIG_WORD];
    RF_TRY(rf_model_json_word(j, objs[i], key, "default", type));
    if (strcmp(type, "default") != 0 || !cfg->rope_field[0]) {
      snprintf(cfg->rope_type, sizeof cfg->rope_type, "%s", type);
      cfg->rope_field = i == 0 ? "rope_parameters" : "rope_scaling";
    }
  }
  if (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") &&
      !cJSON_GetObjectItemCaseSensitive(j->root, "rope_theta"))
    return rf_model_json_double(j, rp, "rope_theta", 10000.0, &cfg->rope_theta);
  return rf_model_json_double(j, j->root, "rope_theta", 10000.0, &cfg->rope_theta);
}

int rf_model_config_layer_is_moe(const struct rf_model_config *cfg, int l) {
  return rf_model_config_family(cfg)->layer_is_moe ? rf_model_config_family(cfg)->layer_is_moe(cfg, l) : 0;
}

int rf_model_config_from_json(struct rf_model_config *cfg, const cJSON *root, const char *path) {
  memset(cfg, 0, sizeof *cfg);
  cfg->sliding_field = "";
  RF_REQUIRE(cJSON_IsObject(root), "%s: not a JSON object", path);
  struct rf_model_config_json j = {root, path, ""};
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (!mt || cJSON_IsNull(mt)) {
    j.assumed = " (there is no field 'model_type': read as a llama config)";
    cfg->family = rf_model_family_find("llama");
  } else {
    RF_REQUIRE(cJSON_IsString(mt), "%s: field 'model_type' must be a string", path);
    cfg->family = rf_model_family_find(mt->valuestring);
    if (!cfg->family) {
      char names[256];
      RF_TRY(rf_train_model_families(names, sizeof names, 0, ", "));
      RF_FAIL("%s: field 'model_type': unknown model type '%s' (known: %s)", path, mt->valuestring, names);
    }
  }
  RF_TRY(rf_model_json_int(&j, "hidden_size", -1, 0, &cfg->hidden_size));
  RF_TRY(rf_model_json_int(&j, "intermediate_size", -1, 0, &cfg->intermediate_size));
  RF_TRY(rf_model_json_int(&j, "num_hidden_layers", -1, 0, &cfg->num_hidden_layers));
  RF_TRY(rf_model_json_int(&j, "num_attention_heads", -1, 0, &cfg->num_attention_heads));
  RF_TRY(
      rf_model_json_int(&j, "num_key_value_heads", cfg->num_attention_heads, 0, &cfg->num_key_value_heads));
  RF_TRY(rf_model_json_int(&j, "vocab_size", -1, 0, &cfg->vocab_size));
  RF_TRY(rf_model_json_int(&j, "max_position_embeddings", 2048, 0, &cfg->max_position_embeddings));
  RF_TRY(rf_model_json_bool(&j, "tie_word_embeddings", 0, &cfg->tie_word_embeddings));
  double eps = 0.0;
  RF_TRY(rf_model_json_double(&j, root, "rms_norm_eps", 1e-6, &eps));
  cfg->rms_norm_eps = (float)eps;
  RF_TRY(rf_model_config_rope(&j, cfg));
  RF_TRY(rf_model_json_word(&j, root, "hidden_act", "silu", cfg->hidden_act));
  RF_TRY(rf_model_json_nonneg(&j, "attention_dropout", 0.0, &cfg->attention_dropout));
  RF_TRY(rf_model_json_nonneg(&j, "partial_rotary_factor", 1.0, &cfg->partial_rotary_factor));
  return rf_model_config_family(cfg)->read(&j, cfg);
}

cJSON *rf_model_json_parse(const char *text, size_t n, const char *path) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, n, &end, 0);
  if (!root)
    rf_error_set(__FILE__, __LINE__, "%s: not valid JSON (malformed near byte %ld)", path,
                 end ? (long)(end - text) : -1L);
  return root;
}

int rf_model_config_parse(struct rf_model_config *cfg, const char *text, size_t n, const char *path) {
  cJSON *root = rf_model_json_parse(text, n, path);
  if (!root) return -1;
  int rc = rf_model_config_from_json(cfg, root, path);
  cJSON_Delete(root);
  return rc;
}

int rf_model_config_read(struct rf_model_config *cfg, const char *path) {
  char *text = NULL;
  size_t n = 0;
  RF_TRY(rf_file_read_all(path, &text, &n));
  int rc = rf_model_config_parse(cfg, text, n, path);
  free(text);
  return rc;
}

int rf_model_config_load(struct rf_model_config *cfg, const char *path) {
  RF_TRY(rf_model_config_read(cfg, path));
  return rf_model_config_check(cfg, path);
}
