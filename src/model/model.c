/* The LLaMA decoder: configuration, units and tensors, workspace, the forward and
 * backward of each unit, sampling. The operations are in ops.c. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- configuration ------------------------------------------------------------------ */

int rf_model_config_check(struct rf_model_config *cfg, const char *what) {
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
    RF_REQUIRE(ints[i].value > 0, "%s: %s must be positive (got %d)", what, ints[i].name, ints[i].value);
  RF_REQUIRE(cfg->hidden_size % cfg->num_attention_heads == 0,
             "%s: num_attention_heads (%d) does not divide hidden_size (%d)", what, cfg->num_attention_heads,
             cfg->hidden_size);
  RF_REQUIRE(cfg->num_attention_heads % cfg->num_key_value_heads == 0,
             "%s: num_key_value_heads (%d) does not divide num_attention_heads (%d)", what,
             cfg->num_key_value_heads, cfg->num_attention_heads);
  cfg->head_dim = cfg->hidden_size / cfg->num_attention_heads;
  RF_REQUIRE(cfg->head_dim % 2 == 0, "%s: head dimension hidden_size / num_attention_heads = %d must be even",
             what, cfg->head_dim);
  RF_REQUIRE(cfg->rms_norm_eps > 0.0f && isfinite(cfg->rms_norm_eps), "%s: rms_norm_eps must be positive",
             what);
  RF_REQUIRE(cfg->rope_theta > 0.0 && isfinite(cfg->rope_theta), "%s: rope_theta must be positive", what);
  return 0;
}

/* A positive-or-not integer field; absent -> dflt (or an error when dflt < 0). */
static int json_int(const cJSON *root, const char *path, const char *name, int dflt, int *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!it || cJSON_IsNull(it)) {
    RF_REQUIRE(dflt >= 0, "%s: field \"%s\" is missing", path, name);
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(cJSON_IsNumber(it), "%s: field \"%s\" is not a number", path, name);
  double v = it->valuedouble;
  RF_REQUIRE(v == floor(v) && fabs(v) < 2e9, "%s: field \"%s\" must be an integer (got %g)", path, name, v);
  RF_REQUIRE(v > 0, "%s: field \"%s\" must be positive (got %g)", path, name, v);
  *out = (int)v;
  return 0;
}

static int json_double(const cJSON *root, const char *path, const char *name, double dflt, double *out) {
  const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, name);
  if (!it || cJSON_IsNull(it)) {
    *out = dflt;
    return 0;
  }
  RF_REQUIRE(cJSON_IsNumber(it), "%s: field \"%s\" is not a number", path, name);
  RF_REQUIRE(it->valuedouble > 0 && isfinite(it->valuedouble), "%s: field \"%s\" must be positive (got %g)",
             path, name, it->valuedouble);
  *out = it->valuedouble;
  return 0;
}

static int config_from_json(struct rf_model_config *cfg, const cJSON *root, const char *path) {
  RF_REQUIRE(cJSON_IsObject(root), "%s: not a JSON object", path);
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
  if (mt) {
    RF_REQUIRE(cJSON_IsString(mt) && strcmp(mt->valuestring, "llama") == 0,
               "%s: field \"model_type\" must be \"llama\" (got %s)", path,
               cJSON_IsString(mt) ? mt->valuestring : "a non-string");
  }
  const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
  RF_REQUIRE(!cJSON_IsTrue(tie),
             "%s: field \"tie_word_embeddings\" is true: tied embeddings are not supported", path);
  memset(cfg, 0, sizeof(*cfg));
  RF_TRY(json_int(root, path, "hidden_size", -1, &cfg->hidden_size));
  RF_TRY(json_int(root, path, "intermediate_size", -1, &cfg->intermediate_size));
  RF_TRY(json_int(root, path, "num_hidden_layers", -1, &cfg->num_hidden_layers));
  RF_TRY(json_int(root, path, "num_attention_heads", -1, &cfg->num_attention_heads));
  RF_TRY(json_int(root, path, "num_key_value_heads", cfg->num_attention_heads, &cfg->num_key_value_heads));
  RF_TRY(json_int(root, path, "vocab_size", -1, &cfg->vocab_size));
  RF_TRY(json_int(root, path, "max_position_embeddings", 2048, &cfg->max_position_embeddings));
  double eps = 0.0, theta = 0.0;
  RF_TRY(json_double(root, path, "rms_norm_eps", 1e-6, &eps));
  /* transformers >= 5 writes rope_theta inside "rope_parameters"; older versions
   * write it at the top level and may have "rope_scaling". Only plain RoPE. */
  const cJSON *rp = cJSON_GetObjectItemCaseSensitive(root, "rope_parameters");
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
  const cJSON *scaled[] = {rp, rs};
  for (int i = 0; i < 2; i++) {
    if (!cJSON_IsObject(scaled[i])) continue;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(scaled[i], "rope_type");
    if (!ty) ty = cJSON_GetObjectItemCaseSensitive(scaled[i], "type");
    RF_REQUIRE(!ty || (cJSON_IsString(ty) && strcmp(ty->valuestring, "default") == 0),
               "%s: field \"%s\": only rope_type \"default\" is supported", path,
               i == 0 ? "rope_parameters" : "rope_scaling");
  }
  if (cJSON_IsObject(rp) && cJSON_GetObjectItemCaseSensitive(rp, "rope_theta") &&
      !cJSON_GetObjectItemCaseSensitive(root, "rope_theta"))
    RF_TRY(json_double(rp, path, "rope_theta", 10000.0, &theta));
  else
    RF_TRY(json_double(root, path, "rope_theta", 10000.0, &theta));
  cfg->rms_norm_eps = (float)eps;
  cfg->rope_theta = theta;
  const cJSON *hd = cJSON_GetObjectItemCaseSensitive(root, "head_dim");
  if (hd && cJSON_IsNumber(hd) && cfg->num_attention_heads > 0) {
    RF_REQUIRE(hd->valuedouble * cfg->num_attention_heads == cfg->hidden_size,
               "%s: field \"head_dim\" (%g) other than hidden_size / num_attention_heads is not supported",
               path, hd->valuedouble);
  }
  return rf_model_config_check(cfg, path);
}

int rf_model_config_load(struct rf_model_config *cfg, const char *path) {
  char *text = NULL;
  size_t n = 0;
  RF_TRY(rf_file_read_all(path, &text, &n));
  cJSON *root = cJSON_ParseWithLength(text, n);
  free(text);
  if (!root) RF_FAIL("%s: not valid JSON", path);
  int rc = config_from_json(cfg, root, path);
  cJSON_Delete(root);
  return rc;
}

static int64_t layer_matmul_params(const struct rf_model_config *c) {
  int64_t h = c->hidden_size, hd = c->head_dim;
  int64_t qd = (int64_t)c->num_attention_heads * hd, kd = (int64_t)c->num_key_value_heads * hd;
  return h * qd + 2 * h * kd + qd * h + 3 * h * (int64_t)c->intermediate_size;
}

int64_t rf_model_n_matmul_params(const struct rf_model_config *cfg) {
  return cfg->num_hidden_layers * layer_matmul_params(cfg) + (int64_t)cfg->vocab_size * cfg->hidden_size;
}

int64_t rf_model_n_params(const struct rf_model_config *cfg) {
  int64_t h = cfg->hidden_size;
  return rf_model_n_matmul_params(cfg) + (int64_t)cfg->vocab_size * h + cfg->num_hidden_layers * 2 * h + h;
}

double rf_model_flops_per_token(const struct rf_model_config *cfg, int seq) {
  return 6.0 * (double)rf_model_n_matmul_params(cfg) +
         12.0 * cfg->num_hidden_layers * cfg->num_attention_heads * cfg->head_dim * (double)seq;
}

/* ---- units and tensors ------------------------------------------------------------------- */

int rf_model_n_units(const struct rf_model_config *cfg) { return cfg->num_hidden_layers + 2; }

int rf_model_unit_n_tensors(const struct rf_model_config *cfg, int unit) {
  RF_ASSERT(unit >= 0 && unit < rf_model_n_units(cfg));
  if (unit == 0) return 1;
  if (unit == cfg->num_hidden_layers + 1) return RF_MODEL_HEAD_TENSOR_COUNT;
  return RF_MODEL_LAYER_TENSOR_COUNT;
}

void rf_model_unit_name(const struct rf_model_config *cfg, int unit, char *buf, size_t size) {
  RF_ASSERT(unit >= 0 && unit < rf_model_n_units(cfg));
  if (unit == 0)
    snprintf(buf, size, "embed");
  else if (unit == cfg->num_hidden_layers + 1)
    snprintf(buf, size, "head");
  else
    snprintf(buf, size, "layers.%d", unit - 1);
}

static void spec_set(struct rf_model_tensor_spec *s, const char *name, int64_t d0, int64_t d1, float std) {
  snprintf(s->name, sizeof(s->name), "%s", name);
  s->ndim = d1 > 0 ? 2 : 1;
  s->shape[0] = d0;
  s->shape[1] = d1 > 0 ? d1 : 0;
  if (std > 0.0f) {
    s->init.kind = RF_INIT_NORMAL;
    s->init.value = std;
  } else {
    s->init.kind = RF_INIT_CONST;
    s->init.value = 1.0f;
  }
}

void rf_model_unit_tensor(const struct rf_model_config *cfg, int unit, int i,
                          struct rf_model_tensor_spec *out) {
  RF_ASSERT(i >= 0 && i < rf_model_unit_n_tensors(cfg, unit));
  memset(out, 0, sizeof(*out));
  int64_t h = cfg->hidden_size, v = cfg->vocab_size, inter = cfg->intermediate_size;
  int64_t qd = (int64_t)cfg->num_attention_heads * cfg->head_dim;
  int64_t kd = (int64_t)cfg->num_key_value_heads * cfg->head_dim;
  const float std = 0.02f;
  const float std_res = std / sqrtf(2.0f * (float)cfg->num_hidden_layers);
  if (unit == 0) {
    spec_set(out, "model.embed_tokens.weight", v, h, std);
    return;
  }
  if (unit == cfg->num_hidden_layers + 1) {
    if (i == RF_MODEL_HEAD_TENSOR_NORM)
      spec_set(out, "model.norm.weight", h, 0, 0.0f);
    else
      spec_set(out, "lm_head.weight", v, h, std);
    return;
  }
  char name[RF_MODEL_NAME_MAX];
  const char *suffix = "";
  int64_t d0 = 0, d1 = 0;
  float s = std;
  switch ((enum rf_model_layer_tensor)i) {
    case RF_MODEL_LAYER_TENSOR_INPUT_NORM:
      suffix = "input_layernorm.weight", d0 = h, s = 0.0f;
      break;
    case RF_MODEL_LAYER_TENSOR_Q:
      suffix = "self_attn.q_proj.weight", d0 = qd, d1 = h;
      break;
    case RF_MODEL_LAYER_TENSOR_K:
      suffix = "self_attn.k_proj.weight", d0 = kd, d1 = h;
      break;
    case RF_MODEL_LAYER_TENSOR_V:
      suffix = "self_attn.v_proj.weight", d0 = kd, d1 = h;
      break;
    case RF_MODEL_LAYER_TENSOR_O:
      suffix = "self_attn.o_proj.weight", d0 = h, d1 = qd, s = std_res;
      break;
    case RF_MODEL_LAYER_TENSOR_POST_NORM:
      suffix = "post_attention_layernorm.weight", d0 = h, s = 0.0f;
      break;
    case RF_MODEL_LAYER_TENSOR_GATE:
      suffix = "mlp.gate_proj.weight", d0 = inter, d1 = h;
      break;
    case RF_MODEL_LAYER_TENSOR_UP:
      suffix = "mlp.up_proj.weight", d0 = inter, d1 = h;
      break;
    case RF_MODEL_LAYER_TENSOR_DOWN:
      suffix = "mlp.down_proj.weight", d0 = h, d1 = inter, s = std_res;
      break;
    case RF_MODEL_LAYER_TENSOR_COUNT:
      RF_DIE("bad tensor index %d", i);
  }
  snprintf(name, sizeof(name), "model.layers.%d.%s", unit - 1, suffix);
  spec_set(out, name, d0, d1, s);
}

/* ---- workspace --------------------------------------------------------------------------- */

static float *ws_floats(struct rf_model_ws *ws, size_t n) {
  size_t bytes = sizeof(float) * (n > 0 ? n : 1);
  ws->bytes += bytes;
  return rf_xaligned(64, rf_round_up((int64_t)bytes, 64));
}

static int ws_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* Must add up what rf_model_ws_init allocates (test_model_ref checks it). */
size_t rf_model_ws_bytes(const struct rf_model_config *c, int batch, int seq) {
  size_t n = (size_t)batch * seq, h = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
  size_t qd = (size_t)c->num_attention_heads * hd, kd = (size_t)c->num_key_value_heads * hd;
  size_t inter = (size_t)c->intermediate_size, v = (size_t)c->vocab_size, f = sizeof(float);
  size_t per_layer =
      n * (2 * h + 2 * qd + 2 * kd + 2 * inter + 2) + (size_t)batch * c->num_attention_heads * seq;
  size_t wide = h > inter ? h : inter;
  wide = wide > qd ? wide : qd;
  size_t bytes = 2 * n * sizeof(int32_t) + f * per_layer * (size_t)c->num_hidden_layers;
  bytes += f * (n * (2 * h + v + 2 + h)); /* xf, xnf, logits, rstdf, lse, dx */
  bytes += f * ((size_t)seq * hd);        /* rotary tables */
  bytes += f * (n * (2 * h + 2 * inter + qd + 2 * kd + qd));
  bytes += f * ((size_t)ws_threads() * 2 * RF_MODEL_ATT_BLOCK * seq + h + (size_t)RF_MODEL_STAGE_ROWS * wide);
  wide = wide > v ? wide : v;
  if (rf_model_have_sbgemm()) bytes += n * wide * sizeof(uint16_t);
  return bytes;
}

int rf_model_ws_init(struct rf_model_ws *ws, const struct rf_model_config *cfg, int batch, int seq) {
  memset(ws, 0, sizeof(*ws));
  RF_REQUIRE(batch > 0 && seq > 0, "model workspace: batch (%d) and sequence length (%d) must be positive",
             batch, seq);
  RF_REQUIRE(seq <= cfg->max_position_embeddings,
             "model workspace: sequence length %d exceeds max_position_embeddings %d", seq,
             cfg->max_position_embeddings);
  ws->cfg = *cfg;
  ws->cap_b = ws->b = batch;
  ws->cap_t = ws->t = seq;
  const struct rf_model_config *c = cfg;
  size_t n = (size_t)batch * seq, h = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
  size_t qd = (size_t)c->num_attention_heads * hd, kd = (size_t)c->num_key_value_heads * hd;
  size_t inter = (size_t)c->intermediate_size, v = (size_t)c->vocab_size;
  ws->tokens = rf_xcalloc(n, sizeof(int32_t));
  ws->targets = rf_xcalloc(n, sizeof(int32_t));
  ws->bytes += 2 * n * sizeof(int32_t);
  ws->layers = rf_xcalloc((size_t)c->num_hidden_layers, sizeof(*ws->layers));
  for (int l = 0; l < c->num_hidden_layers; l++) {
    struct rf_model_layer_acts *a = &ws->layers[l];
    a->x = ws_floats(ws, n * h);
    a->rstd1 = ws_floats(ws, n);
    a->q = ws_floats(ws, n * qd);
    a->k = ws_floats(ws, n * kd);
    a->v = ws_floats(ws, n * kd);
    a->lse = ws_floats(ws, (size_t)batch * c->num_attention_heads * seq);
    a->atty = ws_floats(ws, n * qd);
    a->x2 = ws_floats(ws, n * h);
    a->rstd2 = ws_floats(ws, n);
    a->gate = ws_floats(ws, n * inter);
    a->up = ws_floats(ws, n * inter);
  }
  ws->xf = ws_floats(ws, n * h);
  ws->rstdf = ws_floats(ws, n);
  ws->xnf = ws_floats(ws, n * h);
  ws->logits = ws_floats(ws, n * v);
  ws->lse = ws_floats(ws, n);
  ws->dx = ws_floats(ws, n * h);
  ws->rope_cos = ws_floats(ws, (size_t)seq * hd / 2);
  ws->rope_sin = ws_floats(ws, (size_t)seq * hd / 2);
  rf_model_rope_tables(ws->rope_cos, ws->rope_sin, seq, (int)hd, c->rope_theta);
  ws->s_norm = ws_floats(ws, n * h);
  ws->s_dnorm = ws_floats(ws, n * h);
  ws->s_inner = ws_floats(ws, n * inter);
  ws->s_inner2 = ws_floats(ws, n * inter);
  ws->s_qkv = ws_floats(ws, n * (qd + 2 * kd));
  ws->s_att = ws_floats(ws, n * qd);
  ws->n_threads_att = ws_threads();
  ws->s_att_blk = ws_floats(ws, (size_t)ws->n_threads_att * 2 * RF_MODEL_ATT_BLOCK * seq);
  ws->s_normw = ws_floats(ws, h);
  size_t wide = h > inter ? h : inter;
  wide = wide > qd ? wide : qd;
  ws->stage.wf32 = ws_floats(ws, (size_t)RF_MODEL_STAGE_ROWS * wide);
  wide = wide > v ? wide : v;
  if (rf_model_have_sbgemm()) {
    ws->stage.act = rf_xaligned(64, (size_t)rf_round_up((int64_t)(n * wide * sizeof(uint16_t)), 64));
    ws->bytes += n * wide * sizeof(uint16_t);
  }
  return 0;
}

void rf_model_ws_free(struct rf_model_ws *ws) {
  if (!ws->layers) return;
  for (int l = 0; l < ws->cfg.num_hidden_layers; l++) {
    struct rf_model_layer_acts *a = &ws->layers[l];
    float *bufs[] = {a->x, a->rstd1, a->q, a->k, a->v, a->lse, a->atty, a->x2, a->rstd2, a->gate, a->up};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
  }
  free(ws->layers);
  float *bufs[] = {ws->xf,       ws->rstdf,    ws->xnf,       ws->logits,  ws->lse,     ws->dx,
                   ws->rope_cos, ws->rope_sin, ws->s_norm,    ws->s_dnorm, ws->s_inner, ws->s_inner2,
                   ws->s_qkv,    ws->s_att,    ws->s_att_blk, ws->s_normw};
  for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) free(bufs[i]);
  free(ws->stage.act);
  free(ws->stage.wf32);
  free(ws->tokens);
  free(ws->targets);
  memset(ws, 0, sizeof(*ws));
}

int rf_model_ws_set_shape(struct rf_model_ws *ws, int b, int t) {
  RF_REQUIRE(b > 0 && t > 0 && b <= ws->cap_b && t <= ws->cap_t,
             "model workspace: shape %d x %d exceeds the capacity %d x %d", b, t, ws->cap_b, ws->cap_t);
  ws->b = b;
  ws->t = t;
  return 0;
}

const float *rf_model_ws_logits(const struct rf_model_ws *ws, int row) {
  RF_ASSERT(row >= 0 && row < ws->b * ws->t);
  return ws->logits + (size_t)row * ws->cfg.vocab_size;
}

/* A norm weight as f32: borrowed directly, or converted into ws->s_normw. */
static const float *norm_weight(struct rf_model_ws *ws, const struct rf_model_weight *w) {
  if (w->f32) return w->f32;
  RF_ASSERT(w->bf16);
  rf_f32_from_bf16_n(ws->s_normw, w->bf16, (size_t)ws->cfg.hidden_size);
  return ws->s_normw;
}

static float *layer_output(struct rf_model_ws *ws, int layer) {
  return layer + 1 < ws->cfg.num_hidden_layers ? ws->layers[layer + 1].x : ws->xf;
}

/* ---- forward ----------------------------------------------------------------------------------- */

int rf_model_embed_forward(struct rf_model_ws *ws, const struct rf_model_weight *w, const int32_t *tokens) {
  int n = ws->b * ws->t;
  for (int i = 0; i < n; i++)
    RF_REQUIRE(tokens[i] >= 0 && tokens[i] < ws->cfg.vocab_size,
               "model: token %d at position %d is not in [0, %d)", tokens[i], i, ws->cfg.vocab_size);
  memcpy(ws->tokens, tokens, sizeof(int32_t) * (size_t)n);
  float *out = ws->cfg.num_hidden_layers > 0 ? ws->layers[0].x : ws->xf;
  rf_model_embedding_forward(out, w, tokens, n, ws->cfg.hidden_size);
  return 0;
}

void rf_model_layer_forward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w) {
  const struct rf_model_config *c = &ws->cfg;
  RF_ASSERT(layer >= 0 && layer < c->num_hidden_layers);
  struct rf_model_layer_acts *a = &ws->layers[layer];
  int n = ws->b * ws->t, h = c->hidden_size, hd = c->head_dim, inter = c->intermediate_size;
  int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  int qd = nh * hd, kd = nkv * hd;
  const struct rf_model_stage *st = &ws->stage;

  /* attention block */
  rf_model_rmsnorm_forward(ws->s_norm, a->rstd1, a->x, norm_weight(ws, &w[RF_MODEL_LAYER_TENSOR_INPUT_NORM]),
                           n, h, c->rms_norm_eps);
  rf_model_linear_forward(a->q, ws->s_norm, &w[RF_MODEL_LAYER_TENSOR_Q], n, h, qd, 0.0f, st);
  rf_model_linear_forward(a->k, ws->s_norm, &w[RF_MODEL_LAYER_TENSOR_K], n, h, kd, 0.0f, st);
  rf_model_linear_forward(a->v, ws->s_norm, &w[RF_MODEL_LAYER_TENSOR_V], n, h, kd, 0.0f, st);
  rf_model_rope_apply(a->q, ws->b, ws->t, nh, hd, ws->rope_cos, ws->rope_sin, 0);
  rf_model_rope_apply(a->k, ws->b, ws->t, nkv, hd, ws->rope_cos, ws->rope_sin, 0);
  rf_model_attention_forward(a->atty, a->lse, a->q, a->k, a->v, ws->b, ws->t, nh, nkv, hd, ws->s_att_blk,
                             ws->n_threads_att);
  memcpy(a->x2, a->x, sizeof(float) * (size_t)n * h);
  rf_model_linear_forward(a->x2, a->atty, &w[RF_MODEL_LAYER_TENSOR_O], n, qd, h, 1.0f, st);

  /* MLP block */
  rf_model_rmsnorm_forward(ws->s_norm, a->rstd2, a->x2, norm_weight(ws, &w[RF_MODEL_LAYER_TENSOR_POST_NORM]),
                           n, h, c->rms_norm_eps);
  rf_model_linear_forward(a->gate, ws->s_norm, &w[RF_MODEL_LAYER_TENSOR_GATE], n, h, inter, 0.0f, st);
  rf_model_linear_forward(a->up, ws->s_norm, &w[RF_MODEL_LAYER_TENSOR_UP], n, h, inter, 0.0f, st);
  rf_model_swiglu_forward(ws->s_inner, a->gate, a->up, (size_t)n * inter);
  float *out = layer_output(ws, layer);
  memcpy(out, a->x2, sizeof(float) * (size_t)n * h);
  rf_model_linear_forward(out, ws->s_inner, &w[RF_MODEL_LAYER_TENSOR_DOWN], n, inter, h, 1.0f, st);
}

double rf_model_head_forward(struct rf_model_ws *ws, const struct rf_model_weight *w,
                             const int32_t *targets) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, v = c->vocab_size;
  rf_model_rmsnorm_forward(ws->xnf, ws->rstdf, ws->xf, norm_weight(ws, &w[RF_MODEL_HEAD_TENSOR_NORM]), n, h,
                           c->rms_norm_eps);
  rf_model_linear_forward(ws->logits, ws->xnf, &w[RF_MODEL_HEAD_TENSOR_LM_HEAD], n, h, v, 0.0f, &ws->stage);
  if (targets) memcpy(ws->targets, targets, sizeof(int32_t) * (size_t)n);
  ws->has_targets = targets != NULL;
  return rf_model_cross_entropy_forward(ws->lse, ws->logits, targets, n, v);
}

/* ---- backward ----------------------------------------------------------------------------------- */

void rf_model_head_backward(struct rf_model_ws *ws, const struct rf_model_weight *w, float *const *grads,
                            float grad_scale) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, v = c->vocab_size;
  RF_ASSERT(ws->has_targets);
  ws->has_targets = 0; /* the logits become their gradient */
  rf_model_cross_entropy_backward(ws->logits, ws->lse, ws->targets, n, v, grad_scale);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_HEAD_TENSOR_LM_HEAD], ws->logits, ws->xnf,
                           &w[RF_MODEL_HEAD_TENSOR_LM_HEAD], n, h, v, 0.0f, &ws->stage);
  memset(ws->dx, 0, sizeof(float) * (size_t)n * h);
  rf_model_rmsnorm_backward(ws->dx, grads[RF_MODEL_HEAD_TENSOR_NORM], ws->s_dnorm, ws->xf, ws->rstdf,
                            norm_weight(ws, &w[RF_MODEL_HEAD_TENSOR_NORM]), n, h);
}

/* Recomputes normalized activations (x * rstd * w) into out. */
static void renorm(float *out, const float *x, const float *rstd, const float *w, int n, int h) {
#pragma omp parallel for schedule(static) if ((long)n * h >= 32768)
  for (int r = 0; r < n; r++) {
    const float *xr = x + (size_t)r * h;
    float *o = out + (size_t)r * h;
    float s = rstd[r];
#pragma omp simd
    for (int i = 0; i < h; i++) o[i] = xr[i] * s * w[i];
  }
}

void rf_model_layer_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                             float *const *grads) {
  const struct rf_model_config *c = &ws->cfg;
  RF_ASSERT(layer >= 0 && layer < c->num_hidden_layers);
  struct rf_model_layer_acts *a = &ws->layers[layer];
  int n = ws->b * ws->t, h = c->hidden_size, hd = c->head_dim, inter = c->intermediate_size;
  int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  int qd = nh * hd, kd = nkv * hd;
  size_t ni = (size_t)n * inter;
  const struct rf_model_stage *sb = &ws->stage;
  float *dout = ws->dx; /* d(layer output); becomes d(layer input) in place */

  /* MLP block: out = x2 + down(silu(gate) * up), gate/up = W xn2, xn2 = norm(x2). */
  rf_model_swiglu_forward(ws->s_inner, a->gate, a->up, ni);
  rf_model_linear_backward(NULL, grads[RF_MODEL_LAYER_TENSOR_DOWN], dout, ws->s_inner,
                           &w[RF_MODEL_LAYER_TENSOR_DOWN], n, inter, h, 0.0f, sb);
  rf_model_linear_backward(ws->s_inner, NULL, dout, NULL, &w[RF_MODEL_LAYER_TENSOR_DOWN], n, inter, h, 0.0f,
                           sb);
  /* dgate -> s_inner2, dup -> s_inner (in place over dh) */
  rf_model_swiglu_backward(ws->s_inner2, ws->s_inner, ws->s_inner, a->gate, a->up, ni);
  const float *wpost = norm_weight(ws, &w[RF_MODEL_LAYER_TENSOR_POST_NORM]);
  renorm(ws->s_norm, a->x2, a->rstd2, wpost, n, h);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_LAYER_TENSOR_GATE], ws->s_inner2, ws->s_norm,
                           &w[RF_MODEL_LAYER_TENSOR_GATE], n, h, inter, 0.0f, sb);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_LAYER_TENSOR_UP], ws->s_inner, ws->s_norm,
                           &w[RF_MODEL_LAYER_TENSOR_UP], n, h, inter, 1.0f, sb);
  rf_model_rmsnorm_backward(dout, grads[RF_MODEL_LAYER_TENSOR_POST_NORM], ws->s_dnorm, a->x2, a->rstd2, wpost,
                            n, h);
  /* dout now holds d(x2). */

  /* Attention block: x2 = x + o(attention(rope(q), rope(k), v)), q/k/v = W xn1. */
  rf_model_linear_backward(ws->s_att, grads[RF_MODEL_LAYER_TENSOR_O], dout, a->atty,
                           &w[RF_MODEL_LAYER_TENSOR_O], n, qd, h, 0.0f, sb);
  float *dq = ws->s_qkv, *dk = dq + (size_t)n * qd, *dv = dk + (size_t)n * kd;
  rf_model_attention_backward(dq, dk, dv, ws->s_att, a->lse, a->q, a->k, a->v, ws->b, ws->t, nh, nkv, hd,
                              ws->s_att_blk, ws->n_threads_att);
  rf_model_rope_apply(dq, ws->b, ws->t, nh, hd, ws->rope_cos, ws->rope_sin, 1);
  rf_model_rope_apply(dk, ws->b, ws->t, nkv, hd, ws->rope_cos, ws->rope_sin, 1);
  const float *win = norm_weight(ws, &w[RF_MODEL_LAYER_TENSOR_INPUT_NORM]);
  renorm(ws->s_norm, a->x, a->rstd1, win, n, h);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_LAYER_TENSOR_Q], dq, ws->s_norm,
                           &w[RF_MODEL_LAYER_TENSOR_Q], n, h, qd, 0.0f, sb);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_LAYER_TENSOR_K], dk, ws->s_norm,
                           &w[RF_MODEL_LAYER_TENSOR_K], n, h, kd, 1.0f, sb);
  rf_model_linear_backward(ws->s_dnorm, grads[RF_MODEL_LAYER_TENSOR_V], dv, ws->s_norm,
                           &w[RF_MODEL_LAYER_TENSOR_V], n, h, kd, 1.0f, sb);
  rf_model_rmsnorm_backward(dout, grads[RF_MODEL_LAYER_TENSOR_INPUT_NORM], ws->s_dnorm, a->x, a->rstd1, win,
                            n, h);
}

void rf_model_embed_backward(struct rf_model_ws *ws, float *const *grads) {
  rf_model_embedding_backward(grads[0], ws->dx, ws->tokens, ws->b * ws->t, ws->cfg.hidden_size);
}

/* ---- sampling ------------------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int rf_model_sample_logits(const float *logits, int vocab, float temperature, uint64_t *rng) {
  int best = 0;
  for (int j = 1; j < vocab; j++)
    if (logits[j] > logits[best]) best = j;
  if (!(temperature > 0.0f)) return best;
  double mx = logits[best], sum = 0.0;
  for (int j = 0; j < vocab; j++) sum += exp(((double)logits[j] - mx) / temperature);
  double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53 * sum;
  double acc = 0.0;
  for (int j = 0; j < vocab; j++) {
    acc += exp(((double)logits[j] - mx) / temperature);
    if (u < acc) return j;
  }
  return best;
}

int rf_model_generate(struct rf_model_ws *ws, const struct rf_model_weight *const *units, int32_t *tokens,
                      int len, int total, float temperature, uint64_t *rng) {
  RF_REQUIRE(len >= 1 && total >= len, "generate: prompt length %d and total %d", len, total);
  int L = ws->cfg.num_hidden_layers;
  int b0 = ws->b, t0 = ws->t;
  for (int cur = len; cur < total; cur++) {
    int ctx = cur < ws->cap_t ? cur : ws->cap_t;
    const int32_t *window = tokens + (cur - ctx);
    RF_TRY(rf_model_ws_set_shape(ws, 1, ctx));
    if (rf_model_embed_forward(ws, units[0], window) != 0) {
      ws->b = b0, ws->t = t0;
      return -1;
    }
    for (int l = 0; l < L; l++) rf_model_layer_forward(ws, l, units[1 + l]);
    rf_model_head_forward(ws, units[L + 1], NULL);
    tokens[cur] =
        rf_model_sample_logits(rf_model_ws_logits(ws, ctx - 1), ws->cfg.vocab_size, temperature, rng);
  }
  ws->b = b0;
  ws->t = t0;
  return 0;
}
