/* Model descriptions: the units every family shares (the embedding, a unit per
 * layer, the head) around each family's layers (its describe_layer, in its file),
 * names and shapes as in its Hugging Face checkpoints; the one source of both the
 * planner's tensor list and the trainer's declared tensors. Also the builder the
 * family files describe their layers with (family.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/desc.h"
#include "model/family.h"

static char *rf_model_desc_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = rf_xmalloc(n);
  memcpy(d, s, n);
  return d;
}

/* Arrays grow to 16, 32, 64, ... entries: room is made when n is 0 or such a power of two. */
static void *rf_model_desc_grow(void *a, int n, size_t size) {
  if (n != 0 && (n < 16 || (n & (n - 1)) != 0)) return a;
  size_t cap = n == 0 ? 16 : 2 * (size_t)n;
  void *b = rf_xcalloc(cap, size);
  if (n) memcpy(b, a, (size_t)n * size);
  free(a);
  return b;
}

void rf_model_desc_add_unit(struct rf_model_desc *d, const char *name) {
  d->units = rf_model_desc_grow(d->units, d->n_units, sizeof *d->units);
  d->units[d->n_units++] = (struct rf_model_unit){rf_model_desc_strdup(name), 0, 0, NULL};
}

struct rf_model_tensor *rf_model_desc_add_tensor(struct rf_model_desc *d, const char *name, int ndim,
                                                 const int64_t *shape) {
  RF_ASSERT(d->n_units > 0 && ndim >= 1 && ndim <= RF_MAX_DIMS);
  struct rf_model_unit *u = &d->units[d->n_units - 1];
  u->tensors = rf_model_desc_grow(u->tensors, u->n_tensors, sizeof *u->tensors);
  struct rf_model_tensor *t = &u->tensors[u->n_tensors++];
  memset(t, 0, sizeof *t);
  t->name = rf_model_desc_strdup(name);
  t->ndim = ndim;
  t->numel = 1;
  for (int i = 0; i < ndim; i++) {
    t->shape[i] = shape[i];
    if (__builtin_mul_overflow(t->numel, shape[i], &t->numel) || t->numel > RF_MODEL_MAX_ELEMS)
      d->too_large = 1;
  }
  if (d->too_large) t->numel = 0; /* no sum may overflow either */
  t->sub_count = 1;
  u->numel += t->numel;
  d->numel += t->numel;
  d->n_tensors++;
  if (d->numel > RF_MODEL_MAX_ELEMS || d->n_tensors > RF_MODEL_MAX_TENSORS) d->too_large = 1;
  if (u->n_tensors > d->max_tensors) d->max_tensors = u->n_tensors;
  return t;
}

/* A unit named by a format. */
static void rf_model_desc_unit(struct rf_model_desc_builder *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void rf_model_desc_unit(struct rf_model_desc_builder *b, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  rf_model_desc_add_unit(b->d, name);
}

/* Adds a tensor of `kind` with ndim dims, named by a format. */
struct rf_model_tensor *rf_model_desc_add(struct rf_model_desc_builder *b, enum rf_model_desc_kind kind,
                                          int ndim, const int64_t *shape, const char *fmt, ...) {
  char name[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  struct rf_model_tensor *t = rf_model_desc_add_tensor(b->d, name, ndim, shape);
  const float std = 0.02f;
  t->init = (struct rf_init){RF_INIT_NORMAL, std};
  switch (kind) {
    case RF_MODEL_DESC_KIND_NORM:
      t->init = (struct rf_init){RF_INIT_CONST, 1.0f};
      break;
    case RF_MODEL_DESC_KIND_BIAS:
      t->init = (struct rf_init){RF_INIT_ZEROS, 0.0f};
      break;
    case RF_MODEL_DESC_KIND_EMBED:
      break;
    case RF_MODEL_DESC_KIND_OUTPUT:
      t->decay = 1;
      break;
    case RF_MODEL_DESC_KIND_EXPERTS: /* Muon: each expert's matrix (src/optim/muon.c) */
      t->decay = t->matrix = t->fp8 = 1;
      break;
    case RF_MODEL_DESC_KIND_RESIDUAL:
      t->init.value = b->std_res;
      t->decay = t->matrix = t->fp8 = 1;
      break;
    case RF_MODEL_DESC_KIND_LINEAR:
      t->decay = t->matrix = t->fp8 = 1;
      break;
    case RF_MODEL_DESC_KIND_ROUTER:
      t->decay = t->matrix = 1;
      break;
  }
  return t;
}

/* A linear layer [out, in] under prefix, and its bias [out] when `bias`. */
void rf_model_desc_linear(struct rf_model_desc_builder *b, enum rf_model_desc_kind kind, int64_t out,
                          int64_t in, int bias, const char *prefix, const char *name) {
  rf_model_desc_add(b, kind, 2, RF_MODEL_DESC_V(out, in), "%s.%s.weight", prefix, name);
  if (bias)
    rf_model_desc_add(b, RF_MODEL_DESC_KIND_BIAS, 1, RF_MODEL_DESC_V(out), "%s.%s.bias", prefix, name);
}

/* The input norm and grouped-query attention of a layer (llama, gpt_oss). */
void rf_model_desc_gqa(struct rf_model_desc_builder *b, const struct rf_model_config *c, const char *p) {
  int64_t h = c->hidden_size, qd = (int64_t)c->num_attention_heads * c->head_dim;
  int64_t kd = (int64_t)c->num_key_value_heads * c->head_dim;
  int bias = c->attention_bias;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "%s.input_layernorm.weight", p);
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_LINEAR, qd, h, bias, p, "self_attn.q_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_LINEAR, kd, h, bias, p, "self_attn.k_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_LINEAR, kd, h, bias, p, "self_attn.v_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_RESIDUAL, h, qd, bias, p, "self_attn.o_proj");
}

/* A SwiGLU MLP (gate, up: [f, h]; down: [h, f]) under prefix. */
void rf_model_desc_mlp(struct rf_model_desc_builder *b, int64_t h, int64_t f, int bias, const char *prefix) {
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_LINEAR, f, h, bias, prefix, "gate_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_LINEAR, f, h, bias, prefix, "up_proj");
  rf_model_desc_linear(b, RF_MODEL_DESC_KIND_RESIDUAL, h, f, bias, prefix, "down_proj");
}

int rf_model_layer_slot(const struct rf_model_config *cfg, int layer, enum rf_model_layer_tensor t) {
  RF_ASSERT(t >= 0 && t < RF_MODEL_LAYER_TENSOR_COUNT);
  RF_ASSERT(layer >= 0 && layer < cfg->num_hidden_layers);
  return rf_model_config_family(cfg)->layer_slot ? rf_model_config_family(cfg)->layer_slot(cfg, layer, t)
                                                 : -1;
}

int rf_model_moe_layer_slot(const struct rf_model_config *cfg, int layer, enum rf_model_layer_tensor t) {
  if (t <= RF_MODEL_LAYER_TENSOR_POST_NORM) return (int)t; /* every family's first six */
  int moe = rf_model_config_layer_is_moe(cfg, layer), qk = rf_model_config_family(cfg)->qk_norm;
  const int mlp = RF_MODEL_LAYER_TENSOR_POST_NORM + 1; /* where the MLP's three tensors start */
  if (t >= RF_MODEL_LAYER_TENSOR_GATE && t <= RF_MODEL_LAYER_TENSOR_DOWN)
    return moe ? -1 : mlp + (int)(t - RF_MODEL_LAYER_TENSOR_GATE);
  if (t >= RF_MODEL_LAYER_TENSOR_ROUTER && t <= RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN)
    return moe ? mlp + (int)(t - RF_MODEL_LAYER_TENSOR_ROUTER) : -1;
  if (t == RF_MODEL_LAYER_TENSOR_Q_NORM || t == RF_MODEL_LAYER_TENSOR_K_NORM)
    return qk ? mlp + 3 + (int)(t - RF_MODEL_LAYER_TENSOR_Q_NORM) : -1;
  return -1; /* no biases */
}

void rf_model_units_find(const struct rf_model_config *cfg, struct rf_model_units *out) {
  int tied = cfg->tie_word_embeddings;
  out->first_layer = tied ? 0 : 1;
  out->head_unit = out->first_layer + cfg->num_hidden_layers;
  out->embed_unit = tied ? out->head_unit : 0;
  out->embed_tensor = tied ? RF_MODEL_HEAD_TENSOR_LM_HEAD : 0;
}

/* The router and the fused experts of f rows (mixtral, qwen3_moe:
 * RF_MODEL_LAYER_TENSOR_ROUTER, _EXPERTS_GATE_UP, _EXPERTS_DOWN), each expert's rows one block. */
void rf_model_desc_experts(struct rf_model_desc_builder *b, const struct rf_model_config *c, int64_t f,
                           const char *p) {
  int64_t h = c->hidden_size, x = c->moe.num_local_experts;
  rf_model_desc_add(b, RF_MODEL_DESC_KIND_OUTPUT, 2, RF_MODEL_DESC_V(x, h), "%s.mlp.gate.weight", p);
  struct rf_model_tensor *gu = rf_model_desc_add(
      b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, 2 * f, h), "%s.mlp.experts.gate_up_proj", p);
  gu->sub_count = x;
  gu->block_rows = 2 * f;
  struct rf_model_tensor *down = rf_model_desc_add(b, RF_MODEL_DESC_KIND_EXPERTS, 3, RF_MODEL_DESC_V(x, h, f),
                                                   "%s.mlp.experts.down_proj", p);
  down->sub_count = x;
  down->block_rows = h;
  down->init.value = b->std_res;
}

void rf_model_desc_make(const struct rf_model_config *cfg, struct rf_model_desc *out) {
  memset(out, 0, sizeof *out);
  out->model_type = rf_model_desc_strdup(rf_model_config_family(cfg)->name);
  struct rf_model_desc_builder b = {out, 0.02f / sqrtf(2.0f * (float)cfg->num_hidden_layers)};
  int64_t h = cfg->hidden_size, v = cfg->vocab_size;
  /* tied: the embedding is the head's output matrix (rf_model_units_find) */
  int tied = cfg->tie_word_embeddings;
  if (!tied) {
    rf_model_desc_unit(&b, "embed");
    rf_model_desc_add(&b, RF_MODEL_DESC_KIND_EMBED, 2, RF_MODEL_DESC_V(v, h), "model.embed_tokens.weight");
  }
  /* DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers) are not part of the model proper.
   */
  for (int l = 0; l < cfg->num_hidden_layers && !out->too_large; l++) {
    rf_model_desc_unit(&b, "layers.%d", l);
    char p[64];
    snprintf(p, sizeof p, "model.layers.%d", l);
    rf_model_config_family(cfg)->describe_layer(&b, cfg, l, p);
  }
  rf_model_desc_unit(&b, "head");
  rf_model_desc_add(&b, RF_MODEL_DESC_KIND_NORM, 1, RF_MODEL_DESC_V(h), "model.norm.weight");
  /* tied: the embedding (no weight decay, not orthogonalized, as untied) */
  rf_model_desc_add(&b, tied ? RF_MODEL_DESC_KIND_EMBED : RF_MODEL_DESC_KIND_OUTPUT, 2, RF_MODEL_DESC_V(v, h),
                    tied ? "model.embed_tokens.weight" : "lm_head.weight");
}

void rf_model_desc_free(struct rf_model_desc *desc) {
  for (int u = 0; u < desc->n_units; u++) {
    for (int t = 0; t < desc->units[u].n_tensors; t++) free(desc->units[u].tensors[t].name);
    free(desc->units[u].tensors);
    free(desc->units[u].name);
  }
  free(desc->units);
  free(desc->model_type);
  memset(desc, 0, sizeof *desc);
}

struct rf_plan_unit_in *rf_model_desc_plan_units(const struct rf_model_desc *desc,
                                                 const struct rf_plan_policy *p) {
  size_t head = (size_t)desc->n_units * sizeof(struct rf_plan_unit_in);
  struct rf_plan_unit_in *units =
      rf_xmalloc(head + (size_t)desc->n_tensors * sizeof(struct rf_plan_tensor_in));
  struct rf_plan_tensor_in *ts = (struct rf_plan_tensor_in *)((char *)units + head);
  for (int u = 0; u < desc->n_units; u++) {
    const struct rf_model_unit *mu = &desc->units[u];
    units[u] = (struct rf_plan_unit_in){mu->name, mu->n_tensors, ts};
    for (int i = 0; i < mu->n_tensors; i++, ts++) {
      const struct rf_model_tensor *t = &mu->tensors[i];
      memset(ts, 0, sizeof *ts);
      ts->name = t->name;
      ts->ndim = t->ndim;
      memcpy(ts->shape, t->shape, sizeof ts->shape);
      ts->numel = t->numel;
      ts->sub_count = t->sub_count;
      ts->block_elems = rf_plan_block_elems(p, t->ndim, t->shape, t->block_rows);
      ts->fp8 = p->fp8 && t->fp8;
      /* the planned layout keeps tiles whole; fsdp2 and flat quantize after the gather
       * (rf_fsdp_set_fp8 does the same) */
      if (ts->fp8 && p->layout == RF_LAYOUT_PLANNED) ts->block_elems = rf_plan_fp8_block_elems(ts);
    }
  }
  return units;
}

int64_t rf_model_n_params(const struct rf_model_config *cfg) {
  struct rf_model_desc d;
  rf_model_desc_make(cfg, &d);
  int64_t n = d.numel;
  rf_model_desc_free(&d);
  return n;
}

int64_t rf_model_n_matmul_params(const struct rf_model_config *cfg) {
  struct rf_model_desc d;
  rf_model_desc_make(cfg, &d);
  /* the linear weights (those taking weight decay), and the embedding when it is also the output */
  int64_t n = cfg->tie_word_embeddings ? (int64_t)cfg->vocab_size * cfg->hidden_size : 0;
  for (int u = 0; u < d.n_units; u++)
    for (int i = 0; i < d.units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &d.units[u].tensors[i];
      /* routed experts (a trainable MoE): a token meets num_experts_per_tok of them */
      if (t->decay && t->sub_count > 1 && cfg->moe.num_experts_per_tok > 0)
        n += t->numel / t->sub_count * cfg->moe.num_experts_per_tok;
      else if (t->decay)
        n += t->numel;
    }
  rf_model_desc_free(&d);
  return n;
}

double rf_model_flops_per_token(const struct rf_model_config *cfg, int seq) {
  return 6.0 * (double)rf_model_n_matmul_params(cfg) +
         6.0 * cfg->num_hidden_layers * cfg->num_attention_heads * cfg->head_dim * (double)(seq + 1);
}
