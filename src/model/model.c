/* The LLaMA decoder: workspace, the forward and backward of each unit, sampling.
 * The operations are in ops.c, its configuration in config.c, its tensors in desc.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"
#include "model/family.h"
#include "model/workspace.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ---- workspace --------------------------------------------------------------------------- */

/* One buffer of the workspace on its device, 64-byte aligned, zero-filled, listed for rf_model_ws_free. */
static void *ws_alloc(struct rf_model_ws *ws, size_t bytes) {
  ws->bytes += bytes;
  if (ws->n_bufs == ws->cap_bufs) {
    ws->cap_bufs = ws->cap_bufs ? 2 * ws->cap_bufs : 64;
    void **grown = rf_xcalloc((size_t)ws->cap_bufs, sizeof *grown);
    if (ws->n_bufs) memcpy(grown, ws->bufs, (size_t)ws->n_bufs * sizeof *grown);
    free(ws->bufs);
    ws->bufs = grown;
  }
  void *p = rf_device_alloc(ws->dev, (size_t)rf_round_up((int64_t)bytes, 64), 64);
  ws->bufs[ws->n_bufs++] = p;
  return p;
}

static float *ws_floats(struct rf_model_ws *ws, size_t n) {
  return ws_alloc(ws, sizeof(float) * (n > 0 ? n : 1));
}

/* MoE: the rows of one expert product (a multiple of 16 near the mean tokens per
 * expert, 16..256), and the grouped rows at most (every expert's count rounded up). */
static int moe_rows(const struct rf_model_config *c, size_t n) {
  if (!rf_model_config_is_moe(c) || rf_model_config_moe_layers(c) == 0) return 0;
  size_t mean = rf_ceil_div((int64_t)(n * (size_t)c->moe.num_experts_per_tok), c->moe.num_local_experts);
  size_t r = (size_t)rf_round_up((int64_t)mean, 16);
  return (int)(r < 16 ? 16 : r > 256 ? 256 : r);
}

static size_t moe_cap(const struct rf_model_config *c, size_t n) {
  if (!moe_rows(c, n)) return 0;
  return n * (size_t)c->moe.num_experts_per_tok +
         (size_t)c->moe.num_local_experts * (size_t)(moe_rows(c, n) - 1);
}

/* DeepSeek-V3's shared experts' width (n_shared_experts * moe_intermediate_size) where the model
 * has MoE layers of its router, else 0. */
static size_t shared_inter(const struct rf_model_config *c) {
  if (!rf_model_config_is_moe(c) || rf_model_config_family(c)->router != RF_MODEL_ROUTER_SIGMOID_GROUP ||
      rf_model_config_moe_layers(c) == 0)
    return 0;
  return (size_t)c->deepseek_v3.n_shared_experts * (size_t)c->deepseek_v3.moe_intermediate_size;
}

/* The SwiGLU scratch's width (s_inner, s_inner2): the dense MLP's, or the shared experts' when wider. */
static size_t inner_len(const struct rf_model_config *c) {
  size_t inter = (size_t)c->intermediate_size;
  return shared_inter(c) > inter ? shared_inter(c) : inter;
}

/* Floats (4-byte words) of one MoE layer's activations and of the MoE scratch. */
static size_t moe_layer_words(const struct rf_model_config *c, size_t n) {
  size_t e = (size_t)c->moe.num_local_experts, k = (size_t)c->moe.num_experts_per_tok, p = moe_cap(c, n);
  return n * e + 3 * n * k + p + e + 1 +
         p * (2 * (size_t)c->moe.moe_intermediate_size + (size_t)c->hidden_size) + 2 * n * shared_inter(c);
}

static size_t moe_scratch_bytes(const struct rf_model_config *c, size_t n) {
  size_t e = (size_t)c->moe.num_local_experts, p = moe_cap(c, n), h = (size_t)c->hidden_size;
  size_t inter = (size_t)c->moe.moe_intermediate_size;
  size_t load = shared_inter(c) ? (size_t)rf_model_config_moe_layers(c) * e : 0; /* moe_load */
  return sizeof(float) * (p * (2 * h + 3 * inter) + n * e + e) + (2 * e + load) * sizeof(double);
}

/* DeepSeek-V3's multi-head latent attention (the family's choice). */
static int has_mla(const struct rf_model_config *c) { return rf_model_config_family(c)->mla; }

/* v's and the attention output's head dim: MLA's v_head_dim, else head_dim. */
static size_t v_dim(const struct rf_model_config *c) {
  return has_mla(c) ? (size_t)c->deepseek_v3.v_head_dim : (size_t)c->head_dim;
}

/* The rotary embedding's dim: MLA's qk_rope_head_dim, else head_dim. */
static int rope_dim(const struct rf_model_config *c) {
  return has_mla(c) ? c->deepseek_v3.qk_rope_head_dim : c->head_dim;
}

/* MLA's layer activations beyond q, k, v, atty (floats): the low-rank q and its 1/rms, the
 * compressed kv and its 1/rms. */
static size_t mla_layer_words(const struct rf_model_config *c, size_t n) {
  if (!has_mla(c)) return 0;
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  return n * ((d->q_lora_rank ? (size_t)d->q_lora_rank + 1 : 0) + (size_t)d->kv_lora_rank + 1);
}

/* MLA's scratch (floats): s_kvb, s_kpe, s_cn, s_dcn, s_dckv, s_qan, s_dqan, s_dqa. */
static size_t mla_scratch_words(const struct rf_model_config *c, size_t n) {
  if (!has_mla(c)) return 0;
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  return n * ((size_t)c->num_attention_heads * (size_t)(d->qk_nope_head_dim + d->v_head_dim) +
              (size_t)d->qk_rope_head_dim + 3 * (size_t)d->kv_lora_rank + 3 * (size_t)d->q_lora_rank);
}

/* A norm weight converted from bf16 (s_normw): hidden, or MLA's low ranks when wider. */
static size_t normw_len(const struct rf_model_config *c) {
  size_t len = (size_t)c->hidden_size;
  if (has_mla(c) && (size_t)c->deepseek_v3.q_lora_rank > len) len = (size_t)c->deepseek_v3.q_lora_rank;
  if (has_mla(c) && (size_t)c->deepseek_v3.kv_lora_rank > len) len = (size_t)c->deepseek_v3.kv_lora_rank;
  return len;
}

/* GPT-OSS's experts: [in, out] with biases, the clamped SwiGLU (moe.c). */
static int oss_experts(const struct rf_model_config *c) {
  return rf_model_config_is_moe(c) && rf_model_config_family(c)->router == RF_MODEL_ROUTER_TOPK_SOFTMAX;
}

/* The widest row of a weight or bias: hidden, intermediate, heads * head_dim, the experts'. */
static size_t stage_wide(const struct rf_model_config *c) {
  size_t wide = (size_t)c->hidden_size, qd = (size_t)c->num_attention_heads * c->head_dim;
  wide = wide > (size_t)c->intermediate_size ? wide : (size_t)c->intermediate_size;
  wide = wide > qd ? wide : qd;
  if (rf_model_config_is_moe(c) && (size_t)c->moe.moe_intermediate_size > wide)
    wide = (size_t)c->moe.moe_intermediate_size;
  if (oss_experts(c) && 2 * (size_t)c->intermediate_size > wide) wide = 2 * (size_t)c->intermediate_size;
  if (shared_inter(c)) { /* DeepSeek-V3: the shared experts' down_proj rows, the balancing bias */
    wide = shared_inter(c) > wide ? shared_inter(c) : wide;
    wide = (size_t)c->moe.num_local_experts > wide ? (size_t)c->moe.num_local_experts : wide;
  }
  if (has_mla(c)) { /* the rows of q_b_proj, kv_b_proj (the low ranks) and o_proj (heads * v_head_dim) */
    const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
    size_t ins[] = {(size_t)d->q_lora_rank, (size_t)d->kv_lora_rank,
                    (size_t)c->num_attention_heads * (size_t)d->v_head_dim};
    for (int i = 0; i < 3; i++) wide = ins[i] > wide ? ins[i] : wide;
  }
  return wide;
}

/* A converted bias is staged (s_bias): biases, sinks, GPT-OSS's experts' biases, DeepSeek-V3's
 * balancing bias. */
static int has_s_bias(const struct rf_model_config *c) {
  return c->attention_bias || c->mlp_bias || rf_model_config_family(c)->attention_sinks || oss_experts(c) ||
         shared_inter(c);
}

/* Floats of s_wt and of s_gwt (GPT-OSS's experts, [in, out]: one expert's two matrices). */
static size_t oss_stage_words(const struct rf_model_config *c) {
  return oss_experts(c) ? 3 * (size_t)c->intermediate_size * (size_t)c->hidden_size : 0;
}

/* q and k normalized per head before the rotary embedding (the family's choice: qwen3_moe). */
static int has_qk_norm(const struct rf_model_config *c) { return rf_model_config_family(c)->qk_norm; }

/* Must add up what rf_model_ws_init allocates (test_model_ref checks it). */
size_t rf_model_ws_bytes(const struct rf_model_config *c, int batch, int seq) {
  size_t n = (size_t)batch * seq, h = (size_t)c->hidden_size, hd = (size_t)c->head_dim;
  size_t qd = (size_t)c->num_attention_heads * hd, kd = (size_t)c->num_key_value_heads * hd;
  size_t inter = (size_t)c->intermediate_size, v = (size_t)c->vocab_size, f = sizeof(float);
  size_t vd = (size_t)c->num_key_value_heads * v_dim(c), ad = (size_t)c->num_attention_heads * v_dim(c);
  int qk = has_qk_norm(c);
  size_t per_layer =
      n * (2 * h + qd + kd + vd + ad + 2) + (size_t)batch * c->num_attention_heads * seq +
      (qk ? n * (qd + kd + (size_t)c->num_attention_heads + (size_t)c->num_key_value_heads) : 0) +
      mla_layer_words(c, n);
  size_t wide = stage_wide(c);
  size_t bytes = 2 * n * sizeof(int32_t) + f * per_layer * (size_t)c->num_hidden_layers;
  for (int l = 0; l < c->num_hidden_layers; l++)
    bytes += f * (rf_model_config_layer_is_moe(c, l) ? moe_layer_words(c, n) : 2 * n * inter);
  if (qk) bytes += f * n * (qd + kd);     /* s_qkn */
  bytes += f * (n * (2 * h + v + 2 + h)); /* xf, xnf, logits, rstdf, lse, dx */
  bytes += f * ((size_t)seq * hd);        /* rotary tables (MLA: of the rotary dim, within these) */
  bytes += f * (n * (2 * h + 2 * inner_len(c) + qd + kd + vd + (ad > qd ? ad : qd)));
  bytes += f * mla_scratch_words(c, n);
  bytes += rf_model_kernels_host.scratch_bytes(c, batch, seq) + sizeof(double); /* scratch, loss */
  bytes += f * (normw_len(c) + (size_t)RF_MODEL_STAGE_ROWS * wide);
  if (has_s_bias(c)) bytes += f * wide; /* s_bias */
  bytes += 2 * f * oss_stage_words(c);  /* s_wt, s_gwt */
  if (moe_rows(c, n)) bytes += moe_scratch_bytes(c, n);
  return bytes;
}

static int32_t *ws_ints(struct rf_model_ws *ws, size_t n) { return (int32_t *)(void *)ws_floats(ws, n); }

/* A MoE layer's activations (struct rf_model_moe_acts). */
static void ws_moe_layer(struct rf_model_ws *ws, struct rf_model_moe_acts *a, size_t n) {
  const struct rf_model_config *c = &ws->cfg;
  size_t e = (size_t)c->moe.num_local_experts, k = (size_t)c->moe.num_experts_per_tok,
         p = (size_t)ws->moe_cap;
  a->probs = ws_floats(ws, n * e);
  a->top = ws_ints(ws, n * k);
  a->topw = ws_floats(ws, n * k);
  a->pos = ws_ints(ws, n * k);
  a->tok = ws_ints(ws, p);
  a->off = ws_ints(ws, e + 1);
  a->gu = ws_floats(ws, p * 2 * (size_t)c->moe.moe_intermediate_size);
  a->ey = ws_floats(ws, p * (size_t)c->hidden_size);
  if (shared_inter(c)) {
    a->sgate = ws_floats(ws, n * shared_inter(c));
    a->sup = ws_floats(ws, n * shared_inter(c));
  }
}

static void ws_moe_scratch(struct rf_model_ws *ws, size_t n) {
  const struct rf_model_config *c = &ws->cfg;
  size_t e = (size_t)c->moe.num_local_experts, p = (size_t)ws->moe_cap, h = (size_t)c->hidden_size;
  size_t inter = (size_t)c->moe.moe_intermediate_size;
  ws->s_xg = ws_floats(ws, p * h);
  ws->s_hg = ws_floats(ws, p * inter);
  ws->s_dgu = ws_floats(ws, p * 2 * inter);
  ws->s_dxg = ws_floats(ws, p * h);
  ws->s_dprobs = ws_floats(ws, n * e);
  ws->moe_balance = ws_floats(ws, e);
  ws->moe_count = ws_alloc(ws, e * sizeof(double));
  ws->moe_psum = ws_alloc(ws, e * sizeof(double));
  ws->moe_off = rf_xcalloc(e + 1, sizeof(int32_t));
  ws->moe_balance_host = rf_xcalloc(e, sizeof(float));
  if (shared_inter(c))
    ws->moe_load = ws_alloc(ws, (size_t)rf_model_config_moe_layers(c) * e * sizeof(double));
}

/* The rotary tables, computed on the host and copied to the device (taken at the call). */
static void rope_upload(struct rf_model_ws *ws, int seq, int hd) {
  size_t bytes = sizeof(float) * (size_t)seq * (size_t)hd / 2;
  float *cos_t = rf_xmalloc(bytes ? bytes : 1), *sin_t = rf_xmalloc(bytes ? bytes : 1);
  if (ws->cfg.yarn.factor > 0)
    rf_model_rope_tables_yarn(cos_t, sin_t, seq, hd, ws->cfg.rope_theta, &ws->cfg.yarn);
  else
    rf_model_rope_tables(cos_t, sin_t, seq, hd, ws->cfg.rope_theta);
  rf_device_copy(ws->dev, ws->rope_cos, cos_t, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, ws->stream);
  rf_device_copy(ws->dev, ws->rope_sin, sin_t, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, ws->stream);
  free(cos_t);
  free(sin_t);
}

/* What a kernel table's entry is for, in a message ("linear layers"). */
static const char *rf_model_kernels_what(const char *entry) {
  if (strncmp(entry, "linear", 6) == 0) return "linear layers";
  if (strncmp(entry, "moe", 3) == 0) return "MoE token movement";
  if (strncmp(entry, "mla_", 4) == 0) return "latent-attention kernels (DeepSeek-V3's)";
  if (strncmp(entry, "router_group_", 13) == 0) return "group-limited router kernels (DeepSeek-V3's)";
  return "kernels";
}

/* On the host, as the name says: the workspace opens the cpu backend's device itself. */
int rf_model_ws_init(struct rf_model_ws *ws, const struct rf_model_config *cfg, int batch, int seq) {
  struct rf_device host;
  rf_backend_open(&rf_backend_cpu, &host, 0, NULL);
  struct rf_device_stream *stream = rf_device_stream_create(&host);
  int rc = rf_model_ws_init_on(ws, &host, stream, cfg, batch, seq);
  ws->host_dev = host; /* after the memset of init: ws->dev points at the copy */
  ws->dev = &ws->host_dev;
  stream->dev = ws->dev; /* the stream was made on the local copy */
  ws->own_stream = stream;
  return rc;
}

int rf_model_ws_init_on(struct rf_model_ws *ws, struct rf_device *dev, struct rf_device_stream *stream,
                        const struct rf_model_config *cfg, int batch, int seq) {
  memset(ws, 0, sizeof(*ws));
  RF_ASSERT(dev && dev->backend && stream); /* a device opened by rf_backend_open */
  ws->dev = dev;
  ws->stream = stream;
  ws->kern = dev->backend->model; /* the compute on activations comes with the device's backend */
  const char *missing = rf_model_kernels_missing_for(ws->kern, cfg);
  RF_REQUIRE(!missing, "device %s: the model's %s (kernel table %s: no %s) are not on this device yet",
             dev->ops->name, rf_model_kernels_what(missing), ws->kern->name, missing);
  RF_REQUIRE(dev->ops->host_memory || !ws->kern->host_memory,
             "device %s: the kernel table %s reads host memory, and this device's is not", dev->ops->name,
             ws->kern->name);
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
  size_t vd = (size_t)c->num_key_value_heads * v_dim(c), ad = (size_t)c->num_attention_heads * v_dim(c);
  ws->tokens = ws_alloc(ws, n * sizeof(int32_t));
  ws->targets = ws_alloc(ws, n * sizeof(int32_t));
  ws->layers = rf_xcalloc((size_t)c->num_hidden_layers, sizeof(*ws->layers));
  int qk = has_qk_norm(c);
  ws->expert_rows = moe_rows(c, n);
  ws->moe_cap = (int)moe_cap(c, n);
  int moe_index = 0;
  for (int l = 0; l < c->num_hidden_layers; l++) {
    struct rf_model_layer_acts *a = &ws->layers[l];
    for (int t = 0; t < RF_MODEL_LAYER_TENSOR_COUNT; t++)
      a->slot[t] = (int8_t)rf_model_layer_slot(c, l, (enum rf_model_layer_tensor)t);
    a->x = ws_floats(ws, n * h);
    a->rstd1 = ws_floats(ws, n);
    a->q = ws_floats(ws, n * qd);
    a->k = ws_floats(ws, n * kd);
    a->v = ws_floats(ws, n * vd);
    a->lse = ws_floats(ws, (size_t)batch * c->num_attention_heads * seq);
    a->atty = ws_floats(ws, n * ad);
    a->x2 = ws_floats(ws, n * h);
    a->rstd2 = ws_floats(ws, n);
    if (qk) {
      a->q_pre = ws_floats(ws, n * qd);
      a->k_pre = ws_floats(ws, n * kd);
      a->rstdq = ws_floats(ws, n * (size_t)c->num_attention_heads);
      a->rstdk = ws_floats(ws, n * (size_t)c->num_key_value_heads);
    }
    if (has_mla(c)) {
      const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
      if (d->q_lora_rank) {
        a->qa = ws_floats(ws, n * (size_t)d->q_lora_rank);
        a->rstdqa = ws_floats(ws, n);
      }
      a->ckv = ws_floats(ws, n * (size_t)d->kv_lora_rank);
      a->rstdkv = ws_floats(ws, n);
    }
    if (rf_model_config_layer_is_moe(c, l)) {
      ws_moe_layer(ws, &a->moe, n);
      a->moe.index = moe_index++;
    } else {
      a->gate = ws_floats(ws, n * inter);
      a->up = ws_floats(ws, n * inter);
    }
  }
  ws->xf = ws_floats(ws, n * h);
  ws->rstdf = ws_floats(ws, n);
  ws->xnf = ws_floats(ws, n * h);
  ws->logits = ws_floats(ws, n * v);
  ws->lse = ws_floats(ws, n);
  ws->dx = ws_floats(ws, n * h);
  ws->rope_cos = ws_floats(ws, (size_t)seq * hd / 2);
  ws->rope_sin = ws_floats(ws, (size_t)seq * hd / 2);
  rope_upload(ws, seq, rope_dim(c));
  ws->s_norm = ws_floats(ws, n * h);
  ws->s_dnorm = ws_floats(ws, n * h);
  ws->s_inner = ws_floats(ws, n * inner_len(c));
  ws->s_inner2 = ws_floats(ws, n * inner_len(c));
  ws->s_qkv = ws_floats(ws, n * (qd + kd + vd));
  ws->s_att = ws_floats(ws, n * (ad > qd ? ad : qd));
  if (has_mla(c)) {
    const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
    size_t kvr = (size_t)d->kv_lora_rank, qr = (size_t)d->q_lora_rank;
    ws->s_kvb =
        ws_floats(ws, n * (size_t)c->num_attention_heads * (size_t)(d->qk_nope_head_dim + d->v_head_dim));
    ws->s_kpe = ws_floats(ws, n * (size_t)d->qk_rope_head_dim);
    ws->s_cn = ws_floats(ws, n * kvr);
    ws->s_dcn = ws_floats(ws, n * kvr);
    ws->s_dckv = ws_floats(ws, n * kvr);
    if (qr) {
      ws->s_qan = ws_floats(ws, n * qr);
      ws->s_dqan = ws_floats(ws, n * qr);
      ws->s_dqa = ws_floats(ws, n * qr);
    }
  }
  ws->scratch_bytes = ws->kern->scratch_bytes(c, batch, seq);
  ws->scratch = ws_alloc(ws, ws->scratch_bytes);
  ws->loss = ws_alloc(ws, sizeof(double));
  ws->s_normw = ws_floats(ws, normw_len(c));
  size_t wide = stage_wide(c);
  ws->stage.wf32 = ws_floats(ws, (size_t)RF_MODEL_STAGE_ROWS * wide);
  if (has_s_bias(c)) ws->s_bias = ws_floats(ws, wide);
  if (oss_stage_words(c)) {
    ws->s_wt = ws_floats(ws, oss_stage_words(c));
    ws->s_gwt = ws_floats(ws, oss_stage_words(c));
  }
  if (ws->expert_rows) ws_moe_scratch(ws, n);
  if (qk) ws->s_qkn = ws_floats(ws, n * (qd + kd));
  ws->stage.compute = RF_DTYPE_F32;
  return 0;
}

/* bf16 staging: two activation operands [rows, widest] and the largest weight
 * (MoE: an expert product's rows may exceed the tokens; gate_up is 2*inter wide). */
static void compute_sizes(const struct rf_model_config *c, int batch, int seq, size_t *act, size_t *weight) {
  size_t h = (size_t)c->hidden_size, inter = (size_t)c->intermediate_size, v = (size_t)c->vocab_size;
  size_t qd = (size_t)c->num_attention_heads * c->head_dim, n = (size_t)batch * seq;
  if (rf_model_config_is_moe(c) && 2 * (size_t)c->moe.moe_intermediate_size > inter)
    inter = 2 * (size_t)c->moe.moe_intermediate_size;
  inter = shared_inter(c) > inter ? shared_inter(c) : inter; /* DeepSeek-V3's shared experts */
  size_t wide = h > inter ? h : inter;
  wide = wide > qd ? wide : qd;
  wide = wide > v ? wide : v;
  size_t rows = (size_t)moe_rows(c, n) > n ? (size_t)moe_rows(c, n) : n;
  *weight = h * (inter > qd ? (inter > v ? inter : v) : (qd > v ? qd : v));
  if (has_mla(c)) { /* kv_b_proj's output rows and MLA's weights */
    const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
    size_t kvb = (size_t)c->num_attention_heads * (size_t)(d->qk_nope_head_dim + d->v_head_dim);
    size_t kva = (size_t)d->kv_lora_rank + (size_t)d->qk_rope_head_dim, qr = (size_t)d->q_lora_rank;
    size_t ws_[] = {kvb * (size_t)d->kv_lora_rank, qd * qr, h * kva, h * qr,
                    h * (size_t)c->num_attention_heads * (size_t)d->v_head_dim};
    for (int i = 0; i < 5; i++) *weight = ws_[i] > *weight ? ws_[i] : *weight;
    size_t wides[] = {kvb, kva, qr};
    for (int i = 0; i < 3; i++) wide = wides[i] > wide ? wides[i] : wide;
  }
  *act = rows * wide;
}

size_t rf_model_ws_compute_bytes(const struct rf_model_config *cfg, int batch, int seq,
                                 enum rf_dtype compute) {
  if (compute != RF_DTYPE_BF16) return 0;
  size_t act = 0, weight = 0;
  compute_sizes(cfg, batch, seq, &act, &weight);
  return (2 * act + weight) * sizeof(uint16_t);
}

static uint16_t *ws_halves(struct rf_model_ws *ws, size_t n) { return ws_alloc(ws, n * sizeof(uint16_t)); }

int rf_model_ws_set_compute(struct rf_model_ws *ws, enum rf_dtype compute) {
  RF_REQUIRE(compute == RF_DTYPE_F32 || compute == RF_DTYPE_BF16, "model: compute dtype %s (f32 or bf16)",
             rf_dtype_name(compute));
  struct rf_model_stage *st = &ws->stage;
  if (compute == RF_DTYPE_BF16 && !st->act) {
    size_t act = 0, weight = 0;
    compute_sizes(&ws->cfg, ws->cap_b, ws->cap_t, &act, &weight);
    st->act = ws_halves(ws, act);
    st->act2 = ws_halves(ws, act);
    st->wbf16 = ws_halves(ws, weight);
  }
  st->compute = compute;
  return 0;
}

/* FP8 staging in elements: codes (as bf16) of two operands of act and a weight,
 * the operands' tile scales and the product's work (f32). */
static void fp8_sizes(const struct rf_model_config *c, int batch, int seq, size_t *act, size_t *weight,
                      size_t *tiles, size_t *work) {
  compute_sizes(c, batch, seq, act, weight);
  /* the widest operand: act = rows * wide; its tiles: 1 x 128 (rows * ceil(wide / 128))
   * or 128 x 1 (ceil(rows / 128) * wide), both at most act / 128 + rows + wide */
  size_t rows = (size_t)batch * seq, wide = *act / rows;
  *tiles = *act / RF_FP8_TILE + rows + wide + 1;
  *work = (*act > *weight ? *act : *weight) + wide;
}

size_t rf_model_ws_fp8_bytes(const struct rf_model_config *cfg, int batch, int seq) {
  size_t act = 0, weight = 0, tiles = 0, work = 0;
  fp8_sizes(cfg, batch, seq, &act, &weight, &tiles, &work);
  return (2 * act + weight) * sizeof(uint16_t) + (2 * tiles + work) * sizeof(float);
}

/* The device stage of FP8 block mode (struct rf_model_fp8_stage's ca, cb, sa, sb, y, bad), sized
 * for the largest operands linear_cuda.c makes: activations [rows, wide] with rows padded to 16
 * and k to 128; the weight gradient's transposed operands [wide, tokens], each sequence padded
 * to 128 tokens; a weight [out, in] (or transposed) padded likewise; the scales of each. */
static int fp8_device_stage(struct rf_model_ws *ws, struct rf_model_fp8_stage *q) {
  size_t act = 0, weight = 0;
  compute_sizes(&ws->cfg, ws->cap_b, ws->cap_t, &act, &weight);
  size_t n = (size_t)ws->cap_b * ws->cap_t,
         rows = (size_t)moe_rows(&ws->cfg, n) > n ? (size_t)moe_rows(&ws->cfg, n) : n;
  RF_ASSERT(rows > 0 && ws->cap_t > 0); /* a workspace holds at least one token */
  size_t wide = act / rows, rows16 = (size_t)rf_round_up((int64_t)rows, 16);
  size_t wide16 = (size_t)rf_round_up((int64_t)wide, 16),
         wide128 = (size_t)rf_round_up((int64_t)wide, RF_FP8_TILE);
  size_t seq = (size_t)ws->cap_t,
         seq_pad = seq % RF_FP8_TILE ? (size_t)rf_round_up((int64_t)seq, RF_FP8_TILE) : seq;
  size_t tokens = rows / seq * seq_pad, whole = (size_t)rf_round_up((int64_t)rows, RF_FP8_TILE);
  tokens = tokens > whole ? tokens : whole;
  size_t ca = rows16 * wide128 > wide16 * tokens ? rows16 * wide128 : wide16 * tokens;
  size_t wpad = weight + (RF_FP8_TILE + 16) * wide128 + 16 * RF_FP8_TILE;
  size_t cb = wpad > wide16 * tokens ? wpad : wide16 * tokens;
  size_t scales = ca / RF_FP8_TILE + (wide16 / RF_FP8_TILE + 1) * (wide128 / RF_FP8_TILE + 4) + 64;
  scales = scales > cb / RF_FP8_TILE + 64 ? scales : cb / RF_FP8_TILE + 64;
  q->ca = ws_alloc(ws, ca);
  q->cb = ws_alloc(ws, cb);
  q->sa = ws_floats(ws, scales);
  q->sb = ws_floats(ws, scales);
  size_t y = (rows16 > wide16 ? rows16 : wide16) * wide16;
  q->y = ws_floats(ws, y);
  q->bad = ws_ints(ws, 1);
  q->cap_a = (int64_t)ca, q->cap_b = (int64_t)cb, q->cap_scales = (int64_t)scales, q->cap_y = (int64_t)y;
  return 0;
}

int rf_model_ws_set_fp8(struct rf_model_ws *ws, int pow2) {
  RF_REQUIRE(!oss_experts(&ws->cfg), "--fp8 block: GPT-OSS's [in, out] experts are not quantized yet");
  RF_REQUIRE(!has_mla(&ws->cfg), "--fp8 block: DeepSeek-V3's latent attention is not quantized yet");
  struct rf_model_fp8_stage *q = &ws->stage.fp8;
  q->pow2 = pow2;
  if (q->work || q->ca) return 0;
  /* the host's FP8 products are host code (ops.c on e4m3 codes); another device's table
   * (CUDA: linear_cuda.c) multiplies e4m3 codes on cuBLASLt from the device stage */
  if (!rf_device_runs_host_code(ws->dev)) return fp8_device_stage(ws, q);
  size_t act = 0, weight = 0, tiles = 0, work = 0;
  fp8_sizes(&ws->cfg, ws->cap_b, ws->cap_t, &act, &weight, &tiles, &work);
  q->a = ws_halves(ws, act);
  q->b = ws_halves(ws, act);
  q->w = ws_halves(ws, weight);
  q->sa = ws_floats(ws, tiles);
  q->sb = ws_floats(ws, tiles);
  q->work = ws_floats(ws, work);
  return 0;
}

void rf_model_ws_free(struct rf_model_ws *ws) {
  if (!ws->layers) return;
  rf_device_stream_synchronize(ws->dev, ws->stream); /* its work done before its memory goes */
  for (int i = 0; i < ws->n_bufs; i++) rf_device_release(ws->dev, ws->bufs[i]);
  free(ws->bufs);
  free(ws->layers);
  free(ws->moe_off);
  free(ws->moe_balance_host);
  rf_device_stream_free(ws->dev, ws->own_stream);
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

void rf_model_ws_read_logits(const struct rf_model_ws *ws, int row, int rows, float *out) {
  RF_ASSERT(row >= 0 && rows >= 0 && row + rows <= ws->b * ws->t);
  rf_device_copy(ws->dev, out, rf_model_ws_logits(ws, row), sizeof(float) * (size_t)rows * ws->cfg.vocab_size,
                 RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
}

void rf_model_ws_moe_load_reset(struct rf_model_ws *ws) {
  RF_ASSERT(ws->moe_load);
  rf_device_memset(
      ws->dev, ws->moe_load, 0,
      sizeof(double) * (size_t)rf_model_config_moe_layers(&ws->cfg) * ws->cfg.moe.num_local_experts,
      ws->stream);
}

void rf_model_ws_moe_load_read(const struct rf_model_ws *ws, double *load) {
  RF_ASSERT(ws->moe_load);
  rf_device_copy(
      ws->dev, load, ws->moe_load,
      sizeof(double) * (size_t)rf_model_config_moe_layers(&ws->cfg) * ws->cfg.moe.num_local_experts,
      RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
}

void rf_model_ws_moe_stats(const struct rf_model_ws *ws, double *count, double *psum) {
  RF_ASSERT(ws->moe_count);
  size_t bytes = sizeof(double) * (size_t)ws->cfg.moe.num_local_experts;
  rf_device_copy(ws->dev, count, ws->moe_count, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
  rf_device_copy(ws->dev, psum, ws->moe_psum, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
}

/* The progress callback drives MPI on the host thread, after the op is queued (never inside it:
 * on a device whose streams run later it would run on the stream's thread). */
static void linear_progress(const struct rf_model_stage *st) {
  if (st && st->progress) st->progress(st->progress_ctx); /* the host thread's */
}

void rf_model_ws_linear_forward(struct rf_model_ws *ws, float *y, const float *x,
                                const struct rf_model_weight *w, int n, int in, int out, float beta,
                                const struct rf_model_stage *st) {
  ws->kern->linear_forward(y, x, w, n, in, out, beta, st, ws->stream);
  linear_progress(st);
}

void rf_model_ws_linear_backward(struct rf_model_ws *ws, float *dx, float *dw, const float *dy,
                                 const float *x, const struct rf_model_weight *w, int n, int in, int out,
                                 float beta, const struct rf_model_stage *st) {
  ws->kern->linear_backward(dx, dw, dy, x, w, n, in, out, beta, st, ws->stream);
  linear_progress(st);
}

/* A norm weight of n elements as f32: borrowed directly, or converted into ws->s_normw. */
static const float *norm_weight_n(struct rf_model_ws *ws, const struct rf_model_weight *w, int n) {
  if (w->f32) return w->f32;
  RF_ASSERT(w->bf16 && n <= ws->cfg.hidden_size);
  rf_device_cast(ws->dev, ws->s_normw, RF_DTYPE_F32, w->bf16, RF_DTYPE_BF16, (size_t)n, 0, ws->stream);
  return ws->s_normw;
}

static const float *norm_weight(struct rf_model_ws *ws, const struct rf_model_weight *w) {
  return norm_weight_n(ws, w, ws->cfg.hidden_size);
}

/* Layer tensor t in the unit w (grads) of the layer whose activations are a; the
 * layer must hold it. */
static const struct rf_model_weight *lw(const struct rf_model_layer_acts *a, const struct rf_model_weight *w,
                                        enum rf_model_layer_tensor t) {
  RF_ASSERT(a->slot[t] >= 0);
  return &w[a->slot[t]];
}

static float *lg(const struct rf_model_layer_acts *a, float *const *grads, enum rf_model_layer_tensor t) {
  RF_ASSERT(a->slot[t] >= 0);
  return grads[a->slot[t]];
}

/* y [n, out] += the bias of layer tensor t, when the layer has it. */
static void add_bias(struct rf_model_ws *ws, const struct rf_model_layer_acts *a,
                     const struct rf_model_weight *w, enum rf_model_layer_tensor t, float *y, int n,
                     int out) {
  if (a->slot[t] < 0) return;
  const struct rf_model_weight *b = &w[a->slot[t]];
  const float *bf = b->f32;
  if (!bf) {
    rf_device_cast(ws->dev, ws->s_bias, RF_DTYPE_F32, b->bf16, RF_DTYPE_BF16, (size_t)out, 0, ws->stream);
    bf = ws->s_bias;
  }
  ws->kern->bias_forward(y, bf, n, out, ws->stream);
}

/* Adds the column sums of dy into the gradient of the bias of layer tensor t, when the layer has it. */
static void bias_grad(struct rf_model_ws *ws, const struct rf_model_layer_acts *a, float *const *grads,
                      enum rf_model_layer_tensor t, const float *dy, int n, int out) {
  if (a->slot[t] >= 0)
    ws->kern->bias_backward(grads[a->slot[t]], dy, n, out, ws->scratch, ws->scratch_bytes, ws->stream);
}

const float *rf_model_ws_bias_f32(struct rf_model_ws *ws, const struct rf_model_weight *w, size_t off,
                                  int n) {
  if (w->f32) return w->f32 + off;
  rf_device_cast(ws->dev, ws->s_bias, RF_DTYPE_F32, w->bf16 + off, RF_DTYPE_BF16, (size_t)n, 0, ws->stream);
  return ws->s_bias;
}

/* A family with attention sinks: layer l's window (cfg->sliding_window on its sliding layers, else 0). */
static int layer_window(const struct rf_model_config *c, int l) {
  return l < 64 && (c->sliding_mask >> l & 1) ? c->sliding_window : 0;
}

/* The norm before a block's products, xn = rmsnorm(x) w into ws->s_norm, or (recompute: the
 * backward's, rstd given) rmsnorm_apply. In bf16 compute on a table with the bf16 norm entries
 * (kernels.h) and when only the block's products read xn (`products`): xn written in bf16 only,
 * into the stage's act2 (free between a linear layer's calls), and the stage tells the linear
 * layers to take it for x == ws->s_norm (one rounding instead of a cast per product; the f32 norm's
 * bits rounded, so the products' operands are unchanged); norm_staged_end after them. Not with an
 * FP8 stage (an FP8 linear layer quantizes x from f32). */
static int ws_norm_bf16(const struct rf_model_ws *ws, int products) {
  return products && ws->stage.compute == RF_DTYPE_BF16 && ws->kern->rmsnorm_forward_bf16 &&
         ws->kern->rmsnorm_apply_bf16 && !ws->stage.fp8.ca && !ws->stage.fp8.work; /* FP8 reads x in f32 */
}

static void norm_for_products(struct rf_model_ws *ws, float *rstd, const float *x, const float *w,
                              int recompute, int products) {
  int n = ws->b * ws->t, h = ws->cfg.hidden_size;
  if (!ws_norm_bf16(ws, products)) {
    if (recompute)
      ws->kern->rmsnorm_apply(ws->s_norm, x, rstd, w, n, h, ws->stream);
    else
      ws->kern->rmsnorm_forward(ws->s_norm, rstd, x, w, n, h, ws->cfg.rms_norm_eps, ws->stream);
    return;
  }
  if (recompute)
    ws->kern->rmsnorm_apply_bf16(ws->stage.act2, x, rstd, w, n, h, ws->stream);
  else
    ws->kern->rmsnorm_forward_bf16(ws->stage.act2, rstd, x, w, n, h, ws->cfg.rms_norm_eps, ws->stream);
  ws->stage.x16_of = ws->s_norm;
  ws->stage.x16 = ws->stage.act2;
}

static void norm_staged_end(struct rf_model_ws *ws) {
  ws->stage.x16_of = NULL;
  ws->stage.x16 = NULL;
}

/* Attention through the table: its bf16 entries in bf16 compute where it has them (kernels.h). */
static int ws_attention_bf16(const struct rf_model_ws *ws) {
  return ws->stage.compute == RF_DTYPE_BF16 && ws->kern->attention_bf16_forward &&
         ws->kern->attention_bf16_backward;
}

static void ws_attention_forward(struct rf_model_ws *ws, float *y, float *lse, const float *q, const float *k,
                                 const float *v, int nh, int nkv, int hd) {
  (ws_attention_bf16(ws) ? ws->kern->attention_bf16_forward : ws->kern->attention_forward)(
      y, lse, q, k, v, ws->b, ws->t, nh, nkv, hd, ws->scratch, ws->scratch_bytes, ws->stream);
}

static void ws_attention_backward(struct rf_model_ws *ws, float *dq, float *dk, float *dv, const float *dy,
                                  const float *y, const float *lse, const float *q, const float *k,
                                  const float *v, int nh, int nkv, int hd) {
  (ws_attention_bf16(ws) ? ws->kern->attention_bf16_backward : ws->kern->attention_backward)(
      dq, dk, dv, dy, y, lse, q, k, v, ws->b, ws->t, nh, nkv, hd, ws->scratch, ws->scratch_bytes, ws->stream);
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
  rf_device_copy(ws->dev, ws->tokens, tokens, sizeof(int32_t) * (size_t)n, RF_DEVICE_COPY_HOST_TO_DEVICE,
                 ws->stream);
  if (ws->moe_count) { /* a new forward: new router statistics, no balance gradient yet */
    size_t e = (size_t)ws->cfg.moe.num_local_experts;
    rf_device_memset(ws->dev, ws->moe_count, 0, e * sizeof(double), ws->stream);
    rf_device_memset(ws->dev, ws->moe_psum, 0, e * sizeof(double), ws->stream);
    rf_device_memset(ws->dev, ws->moe_balance, 0, e * sizeof(float), ws->stream);
  }
  float *out = ws->cfg.num_hidden_layers > 0 ? ws->layers[0].x : ws->xf;
  ws->kern->embedding_forward(out, w, ws->tokens, n, ws->cfg.hidden_size, ws->stream);
  return 0;
}

/* The grouped-query attention block (every family but DeepSeek-V3): x2 = x + o(attention(rope(q),
 * rope(k), v)), q/k/v = W xn1 (+ biases; q/k normed per head for qwen3_moe), xn1 in ws->s_norm. */
static void gqa_forward(struct rf_model_ws *ws, int layer, struct rf_model_layer_acts *a,
                        const struct rf_model_weight *w) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, hd = c->head_dim;
  int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  int qd = nh * hd, kd = nkv * hd;
  const struct rf_model_stage *st = &ws->stage;
  int qk = has_qk_norm(c);
  rf_model_ws_linear_forward(ws, qk ? a->q_pre : a->q, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, h,
                             qd, 0.0f, st);
  rf_model_ws_linear_forward(ws, qk ? a->k_pre : a->k, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_K), n, h,
                             kd, 0.0f, st);
  if (qk) { /* each head's q and k RMS-normalized over head_dim */
    ws->kern->rmsnorm_forward(a->q, a->rstdq, a->q_pre,
                              norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_NORM), hd), n * nh, hd,
                              c->rms_norm_eps, ws->stream);
    ws->kern->rmsnorm_forward(a->k, a->rstdk, a->k_pre,
                              norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_K_NORM), hd), n * nkv, hd,
                              c->rms_norm_eps, ws->stream);
  }
  rf_model_ws_linear_forward(ws, a->v, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_V), n, h, kd, 0.0f, st);
  norm_staged_end(ws);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_Q_BIAS, a->q, n, qd);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_K_BIAS, a->k, n, kd);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_V_BIAS, a->v, n, kd);
  ws->kern->rope_apply(a->q, ws->b, ws->t, nh, hd, ws->rope_cos, ws->rope_sin, 0, ws->stream);
  ws->kern->rope_apply(a->k, ws->b, ws->t, nkv, hd, ws->rope_cos, ws->rope_sin, 0, ws->stream);
  if (rf_model_config_family(c)->attention_sinks) /* the sinks' entry in any compute dtype */
    ws->kern->attention_sink_forward(a->atty, a->lse, a->q, a->k, a->v,
                                     rf_model_ws_bias_f32(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_SINKS), 0, nh),
                                     layer_window(c, layer), ws->b, ws->t, nh, nkv, hd, ws->scratch,
                                     ws->scratch_bytes, ws->stream);
  else
    ws_attention_forward(ws, a->atty, a->lse, a->q, a->k, a->v, nh, nkv, hd);
  rf_device_copy(ws->dev, a->x2, a->x, sizeof(float) * (size_t)n * h, RF_DEVICE_COPY_DEVICE_TO_DEVICE,
                 ws->stream);
  rf_model_ws_linear_forward(ws, a->x2, a->atty, lw(a, w, RF_MODEL_LAYER_TENSOR_O), n, qd, h, 1.0f, st);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_O_BIAS, a->x2, n, h);
}

/* A weight's rows [r0, r0 + rows) of `cols` columns, as a weight (a view; not FP8 codes). */
static struct rf_model_weight weight_rows(const struct rf_model_weight *w, size_t r0, size_t cols) {
  RF_ASSERT(!w->fp8);
  struct rf_model_weight v = {0};
  if (w->f32)
    v.f32 = w->f32 + r0 * cols;
  else
    v.bf16 = w->bf16 + r0 * cols;
  return v;
}

/* MLA's softmax scale: 1/sqrt(qk head dim), with YaRN's mscale_all_dim times its mscale squared. */
static float mla_scale(const struct rf_model_config *c) {
  double m = c->yarn.factor > 0 ? c->yarn.softmax_mscale : 1.0;
  return (float)(1.0 / sqrt((double)c->head_dim) * m * m);
}

/* DeepSeek-V3's multi-head latent attention (transformers' DeepseekV3Attention), xn = s_norm:
 *   q = q_b(q_a_layernorm(q_a(xn))) (or q_proj(xn)), each head (q_nope, q_pe), q_pe rotated;
 *   kv_a_proj_with_mqa(xn) = (ckv [kv_lora_rank], k_pe [rope]), k_pe rotated and shared by the heads;
 *   kv_b(kv_a_layernorm(ckv)) = each head's (k_nope, v); k = (k_nope, k_pe);
 *   x2 = x + o_proj(attention(q, k, v)), v of v_head_dim, scale 1/sqrt(nope + rope).
 * kv_a_proj_with_mqa runs as two products on views of its rows (ckv's and k_pe's). */
static void mla_forward(struct rf_model_ws *ws, struct rf_model_layer_acts *a,
                        const struct rf_model_weight *w) {
  const struct rf_model_config *c = &ws->cfg;
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  int n = ws->b * ws->t, h = c->hidden_size, nh = c->num_attention_heads, hd = c->head_dim;
  int qr = d->q_lora_rank, kvr = d->kv_lora_rank, nope = d->qk_nope_head_dim, rope = d->qk_rope_head_dim;
  int dv = d->v_head_dim, il = d->rope_interleave;
  const struct rf_model_stage *st = &ws->stage;
  if (qr) {
    rf_model_ws_linear_forward(ws, a->qa, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_A), n, h, qr, 0.0f,
                               st);
    ws->kern->rmsnorm_forward(ws->s_qan, a->rstdqa, a->qa,
                              norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_A_NORM), qr), n, qr,
                              c->rms_norm_eps, ws->stream);
    rf_model_ws_linear_forward(ws, a->q, ws->s_qan, lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, qr, nh * hd, 0.0f,
                               st);
  } else {
    rf_model_ws_linear_forward(ws, a->q, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, h, nh * hd, 0.0f,
                               st);
  }
  const struct rf_model_weight *kva = lw(a, w, RF_MODEL_LAYER_TENSOR_KV_A);
  struct rf_model_weight kv_c = weight_rows(kva, 0, (size_t)h),
                         kv_pe = weight_rows(kva, (size_t)kvr, (size_t)h);
  rf_model_ws_linear_forward(ws, a->ckv, ws->s_norm, &kv_c, n, h, kvr, 0.0f, st);
  rf_model_ws_linear_forward(ws, ws->s_kpe, ws->s_norm, &kv_pe, n, h, rope, 0.0f, st);
  ws->kern->rmsnorm_forward(ws->s_cn, a->rstdkv, a->ckv,
                            norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_KV_A_NORM), kvr), n, kvr,
                            c->rms_norm_eps, ws->stream);
  rf_model_ws_linear_forward(ws, ws->s_kvb, ws->s_cn, lw(a, w, RF_MODEL_LAYER_TENSOR_KV_B), n, kvr,
                             nh * (nope + dv), 0.0f, st);
  ws->kern->mla_rope_apply(a->q, ws->b, ws->t, nh, hd, nope, rope, ws->rope_cos, ws->rope_sin, il, 0,
                           ws->stream);
  ws->kern->mla_rope_apply(ws->s_kpe, ws->b, ws->t, 1, rope, 0, rope, ws->rope_cos, ws->rope_sin, il, 0,
                           ws->stream);
  ws->kern->mla_kv_expand(a->k, a->v, ws->s_kvb, ws->s_kpe, n, nh, nope, rope, dv, ws->stream);
  ws->kern->mla_attention_forward(a->atty, a->lse, a->q, a->k, a->v, ws->b, ws->t, nh, nh, hd, dv,
                                  mla_scale(c), ws->scratch, ws->scratch_bytes, ws->stream);
  rf_device_copy(ws->dev, a->x2, a->x, sizeof(float) * (size_t)n * h, RF_DEVICE_COPY_DEVICE_TO_DEVICE,
                 ws->stream);
  rf_model_ws_linear_forward(ws, a->x2, a->atty, lw(a, w, RF_MODEL_LAYER_TENSOR_O), n, nh * dv, h, 1.0f, st);
}

void rf_model_layer_forward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w) {
  const struct rf_model_config *c = &ws->cfg;
  RF_ASSERT(layer >= 0 && layer < c->num_hidden_layers);
  struct rf_model_layer_acts *a = &ws->layers[layer];
  int n = ws->b * ws->t, h = c->hidden_size, inter = c->intermediate_size;
  const struct rf_model_stage *st = &ws->stage;

  /* attention block (MLA reads xn1 beyond its products) */
  norm_for_products(ws, a->rstd1, a->x, norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_INPUT_NORM)), 0,
                    !has_mla(c));
  if (has_mla(c))
    mla_forward(ws, a, w);
  else
    gqa_forward(ws, layer, a, w);

  /* MLP block (a MoE layer's router and grouping read xn2 in f32) */
  int moe = rf_model_config_layer_is_moe(c, layer);
  norm_for_products(ws, a->rstd2, a->x2, norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_POST_NORM)), 0, !moe);
  if (moe) {
    float *out = layer_output(ws, layer);
    rf_device_copy(ws->dev, out, a->x2, sizeof(float) * (size_t)n * h, RF_DEVICE_COPY_DEVICE_TO_DEVICE,
                   ws->stream);
    rf_model_moe_forward(ws, layer, w, ws->s_norm, out);
    return;
  }
  rf_model_ws_linear_forward(ws, a->gate, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_GATE), n, h, inter, 0.0f,
                             st);
  rf_model_ws_linear_forward(ws, a->up, ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_UP), n, h, inter, 0.0f,
                             st);
  norm_staged_end(ws);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_GATE_BIAS, a->gate, n, inter);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_UP_BIAS, a->up, n, inter);
  ws->kern->swiglu_forward(ws->s_inner, a->gate, a->up, (size_t)n * inter, ws->stream);
  float *out = layer_output(ws, layer);
  rf_device_copy(ws->dev, out, a->x2, sizeof(float) * (size_t)n * h, RF_DEVICE_COPY_DEVICE_TO_DEVICE,
                 ws->stream);
  rf_model_ws_linear_forward(ws, out, ws->s_inner, lw(a, w, RF_MODEL_LAYER_TENSOR_DOWN), n, inter, h, 1.0f,
                             st);
  add_bias(ws, a, w, RF_MODEL_LAYER_TENSOR_DOWN_BIAS, out, n, h);
}

void rf_model_head_forward_on_device(struct rf_model_ws *ws, const struct rf_model_weight *w,
                                     const int32_t *targets) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, v = c->vocab_size;
  ws->kern->rmsnorm_forward(ws->xnf, ws->rstdf, ws->xf, norm_weight(ws, &w[RF_MODEL_HEAD_TENSOR_NORM]), n, h,
                            c->rms_norm_eps, ws->stream);
  rf_model_ws_linear_forward(ws, ws->logits, ws->xnf, &w[RF_MODEL_HEAD_TENSOR_LM_HEAD], n, h, v, 0.0f,
                             &ws->stage);
  if (targets)
    rf_device_copy(ws->dev, ws->targets, targets, sizeof(int32_t) * (size_t)n, RF_DEVICE_COPY_HOST_TO_DEVICE,
                   ws->stream);
  ws->has_targets = targets != NULL;
  ws->kern->cross_entropy_forward(ws->loss, ws->lse, ws->logits, targets ? ws->targets : NULL, n, v,
                                  ws->scratch, ws->scratch_bytes, ws->stream);
}

double rf_model_head_forward(struct rf_model_ws *ws, const struct rf_model_weight *w,
                             const int32_t *targets) {
  rf_model_head_forward_on_device(ws, w, targets);
  double loss = 0;
  rf_device_copy(ws->dev, &loss, ws->loss, sizeof loss, RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
  return loss;
}

/* ---- backward ----------------------------------------------------------------------------------- */

void rf_model_head_backward(struct rf_model_ws *ws, const struct rf_model_weight *w, float *const *grads,
                            float grad_scale) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, v = c->vocab_size;
  RF_ASSERT(ws->has_targets);
  ws->has_targets = 0;       /* the logits become their gradient */
  ws->stage.fp8.seq = ws->t; /* FP8 dW tiles within each sequence */
  ws->kern->cross_entropy_backward(ws->logits, ws->lse, ws->targets, n, v, grad_scale, ws->stream);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, grads[RF_MODEL_HEAD_TENSOR_LM_HEAD], ws->logits, ws->xnf,
                              &w[RF_MODEL_HEAD_TENSOR_LM_HEAD], n, h, v, 0.0f, &ws->stage);
  rf_device_memset(ws->dev, ws->dx, 0, sizeof(float) * (size_t)n * h, ws->stream);
  ws->kern->rmsnorm_backward(ws->dx, grads[RF_MODEL_HEAD_TENSOR_NORM], ws->s_dnorm, ws->xf, ws->rstdf,
                             norm_weight(ws, &w[RF_MODEL_HEAD_TENSOR_NORM]), n, h, ws->scratch,
                             ws->scratch_bytes, ws->stream);
}

/* The dense MLP block: out = x2 + down(silu(gate) * up), gate/up = W xn2,
 * xn2 = norm(x2). Leaves d(xn2) in ws->s_dnorm (and xn2 in ws->s_norm). */
static void layer_mlp_backward(struct rf_model_ws *ws, const struct rf_model_layer_acts *a,
                               const struct rf_model_weight *w, float *const *grads, const float *wpost) {
  int n = ws->b * ws->t, h = ws->cfg.hidden_size, inter = ws->cfg.intermediate_size;
  size_t ni = (size_t)n * inter;
  const struct rf_model_stage *sb = &ws->stage;
  const float *dout = ws->dx;
  ws->kern->swiglu_forward(ws->s_inner, a->gate, a->up, ni, ws->stream);
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_DOWN_BIAS, dout, n, h);
  rf_model_ws_linear_backward(ws, NULL, lg(a, grads, RF_MODEL_LAYER_TENSOR_DOWN), dout, ws->s_inner,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_DOWN), n, inter, h, 0.0f, sb);
  rf_model_ws_linear_backward(ws, ws->s_inner, NULL, dout, NULL, lw(a, w, RF_MODEL_LAYER_TENSOR_DOWN), n,
                              inter, h, 0.0f, sb);
  /* dgate -> s_inner2, dup -> s_inner (in place over dh) */
  ws->kern->swiglu_backward(ws->s_inner2, ws->s_inner, ws->s_inner, a->gate, a->up, ni, ws->stream);
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_GATE_BIAS, ws->s_inner2, n, inter);
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_UP_BIAS, ws->s_inner, n, inter);
  norm_for_products(ws, a->rstd2, a->x2, wpost, 1, 1);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_GATE), ws->s_inner2,
                              ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_GATE), n, h, inter, 0.0f, sb);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_UP), ws->s_inner,
                              ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_UP), n, h, inter, 1.0f, sb);
  norm_staged_end(ws);
}

/* The GQA block's backward: dout = d(x2) in, d(x) added into it (gqa_forward's math). */
static void gqa_backward(struct rf_model_ws *ws, int layer, const struct rf_model_layer_acts *a,
                         const struct rf_model_weight *w, float *const *grads) {
  const struct rf_model_config *c = &ws->cfg;
  int n = ws->b * ws->t, h = c->hidden_size, hd = c->head_dim;
  int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
  int qd = nh * hd, kd = nkv * hd;
  const struct rf_model_stage *sb = &ws->stage;
  float *dout = ws->dx;

  /* Attention block: x2 = x + o(attention(rope(q), rope(k), v)), q/k/v = W xn1. */
  rf_model_ws_linear_backward(ws, ws->s_att, lg(a, grads, RF_MODEL_LAYER_TENSOR_O), dout, a->atty,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_O), n, qd, h, 0.0f, sb);
  float *dq = ws->s_qkv, *dk = dq + (size_t)n * qd, *dv = dk + (size_t)n * kd;
  if (rf_model_config_family(c)->attention_sinks)
    ws->kern->attention_sink_backward(
        dq, dk, dv, lg(a, grads, RF_MODEL_LAYER_TENSOR_SINKS), ws->s_att, a->atty, a->lse, a->q, a->k, a->v,
        rf_model_ws_bias_f32(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_SINKS), 0, nh), layer_window(c, layer), ws->b,
        ws->t, nh, nkv, hd, ws->scratch, ws->scratch_bytes, ws->stream);
  else
    ws_attention_backward(ws, dq, dk, dv, ws->s_att, a->atty, a->lse, a->q, a->k, a->v, nh, nkv, hd);
  ws->kern->rope_apply(dq, ws->b, ws->t, nh, hd, ws->rope_cos, ws->rope_sin, 1, ws->stream);
  ws->kern->rope_apply(dk, ws->b, ws->t, nkv, hd, ws->rope_cos, ws->rope_sin, 1, ws->stream);
  if (has_qk_norm(c)) { /* through the q/k norms: dq, dk before them */
    float *dqp = ws->s_qkn, *dkp = dqp + (size_t)n * qd;
    rf_device_memset(ws->dev, dqp, 0, sizeof(float) * (size_t)n * (qd + kd), ws->stream);
    ws->kern->rmsnorm_backward(dqp, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q_NORM), dq, a->q_pre, a->rstdq,
                               norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_NORM), hd), n * nh, hd,
                               ws->scratch, ws->scratch_bytes, ws->stream);
    ws->kern->rmsnorm_backward(dkp, lg(a, grads, RF_MODEL_LAYER_TENSOR_K_NORM), dk, a->k_pre, a->rstdk,
                               norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_K_NORM), hd), n * nkv, hd,
                               ws->scratch, ws->scratch_bytes, ws->stream);
    dq = dqp;
    dk = dkp;
  }
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_Q_BIAS, dq, n, qd);
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_K_BIAS, dk, n, kd);
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_V_BIAS, dv, n, kd);
  const float *win = norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_INPUT_NORM));
  norm_for_products(ws, a->rstd1, a->x, win, 1, 1);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q), dq, ws->s_norm,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, h, qd, 0.0f, sb);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_K), dk, ws->s_norm,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_K), n, h, kd, 1.0f, sb);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_V), dv, ws->s_norm,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_V), n, h, kd, 1.0f, sb);
  norm_staged_end(ws);
  ws->kern->rmsnorm_backward(dout, lg(a, grads, RF_MODEL_LAYER_TENSOR_INPUT_NORM), ws->s_dnorm, a->x,
                             a->rstd1, win, n, h, ws->scratch, ws->scratch_bytes, ws->stream);
}

/* MLA's backward (mla_forward's math): dout = d(x2) in, d(x) added into it. */
static void mla_backward(struct rf_model_ws *ws, const struct rf_model_layer_acts *a,
                         const struct rf_model_weight *w, float *const *grads) {
  const struct rf_model_config *c = &ws->cfg;
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  int n = ws->b * ws->t, h = c->hidden_size, nh = c->num_attention_heads, hd = c->head_dim;
  int qr = d->q_lora_rank, kvr = d->kv_lora_rank, nope = d->qk_nope_head_dim, rope = d->qk_rope_head_dim;
  int dv = d->v_head_dim, il = d->rope_interleave, qd = nh * hd;
  const struct rf_model_stage *sb = &ws->stage;
  float *dout = ws->dx;
  rf_model_ws_linear_backward(ws, ws->s_att, lg(a, grads, RF_MODEL_LAYER_TENSOR_O), dout, a->atty,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_O), n, nh * dv, h, 0.0f, sb);
  float *dq = ws->s_qkv, *dk = dq + (size_t)n * qd, *dvv = dk + (size_t)n * qd;
  ws->kern->mla_attention_backward(dq, dk, dvv, ws->s_att, a->atty, a->lse, a->q, a->k, a->v, ws->b, ws->t,
                                   nh, nh, hd, dv, mla_scale(c), ws->scratch, ws->scratch_bytes, ws->stream);
  ws->kern->mla_rope_apply(dq, ws->b, ws->t, nh, hd, nope, rope, ws->rope_cos, ws->rope_sin, il, 1,
                           ws->stream);
  ws->kern->mla_kv_expand_backward(ws->s_kvb, ws->s_kpe, dk, dvv, n, nh, nope, rope, dv, ws->stream);
  ws->kern->mla_rope_apply(ws->s_kpe, ws->b, ws->t, 1, rope, 0, rope, ws->rope_cos, ws->rope_sin, il, 1,
                           ws->stream);
  /* kv_b_proj and kv_a_layernorm */
  const float *wkv = norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_KV_A_NORM), kvr);
  ws->kern->rmsnorm_apply(ws->s_cn, a->ckv, a->rstdkv, wkv, n, kvr, ws->stream);
  rf_model_ws_linear_backward(ws, ws->s_dcn, lg(a, grads, RF_MODEL_LAYER_TENSOR_KV_B), ws->s_kvb, ws->s_cn,
                              lw(a, w, RF_MODEL_LAYER_TENSOR_KV_B), n, kvr, nh * (nope + dv), 0.0f, sb);
  rf_device_memset(ws->dev, ws->s_dckv, 0, sizeof(float) * (size_t)n * kvr, ws->stream);
  ws->kern->rmsnorm_backward(ws->s_dckv, lg(a, grads, RF_MODEL_LAYER_TENSOR_KV_A_NORM), ws->s_dcn, a->ckv,
                             a->rstdkv, wkv, n, kvr, ws->scratch, ws->scratch_bytes, ws->stream);
  /* kv_a_proj_with_mqa: its ckv rows, then its k_pe rows (gradients into the same rows) */
  const float *win = norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_INPUT_NORM));
  ws->kern->rmsnorm_apply(ws->s_norm, a->x, a->rstd1, win, n, h, ws->stream);
  const struct rf_model_weight *kva = lw(a, w, RF_MODEL_LAYER_TENSOR_KV_A);
  struct rf_model_weight kv_c = weight_rows(kva, 0, (size_t)h),
                         kv_pe = weight_rows(kva, (size_t)kvr, (size_t)h);
  float *gkva = lg(a, grads, RF_MODEL_LAYER_TENSOR_KV_A);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, gkva, ws->s_dckv, ws->s_norm, &kv_c, n, h, kvr, 0.0f, sb);
  rf_model_ws_linear_backward(ws, ws->s_dnorm, gkva + (size_t)kvr * h, ws->s_kpe, ws->s_norm, &kv_pe, n, h,
                              rope, 1.0f, sb);
  /* q */
  if (qr) {
    const float *wq = norm_weight_n(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_A_NORM), qr);
    ws->kern->rmsnorm_apply(ws->s_qan, a->qa, a->rstdqa, wq, n, qr, ws->stream);
    rf_model_ws_linear_backward(ws, ws->s_dqan, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q), dq, ws->s_qan,
                                lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, qr, qd, 0.0f, sb);
    rf_device_memset(ws->dev, ws->s_dqa, 0, sizeof(float) * (size_t)n * qr, ws->stream);
    ws->kern->rmsnorm_backward(ws->s_dqa, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q_A_NORM), ws->s_dqan, a->qa,
                               a->rstdqa, wq, n, qr, ws->scratch, ws->scratch_bytes, ws->stream);
    rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q_A), ws->s_dqa,
                                ws->s_norm, lw(a, w, RF_MODEL_LAYER_TENSOR_Q_A), n, h, qr, 1.0f, sb);
  } else {
    rf_model_ws_linear_backward(ws, ws->s_dnorm, lg(a, grads, RF_MODEL_LAYER_TENSOR_Q), dq, ws->s_norm,
                                lw(a, w, RF_MODEL_LAYER_TENSOR_Q), n, h, qd, 1.0f, sb);
  }
  win = norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_INPUT_NORM)); /* s_normw may hold another norm's */
  ws->kern->rmsnorm_backward(dout, lg(a, grads, RF_MODEL_LAYER_TENSOR_INPUT_NORM), ws->s_dnorm, a->x,
                             a->rstd1, win, n, h, ws->scratch, ws->scratch_bytes, ws->stream);
}

void rf_model_layer_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                             float *const *grads) {
  const struct rf_model_config *c = &ws->cfg;
  RF_ASSERT(layer >= 0 && layer < c->num_hidden_layers);
  struct rf_model_layer_acts *a = &ws->layers[layer];
  int n = ws->b * ws->t, h = c->hidden_size;
  ws->stage.fp8.seq = ws->t; /* FP8 dW tiles within each sequence */
  float *dout = ws->dx;      /* d(layer output); becomes d(layer input) in place */

  const float *wpost = norm_weight(ws, lw(a, w, RF_MODEL_LAYER_TENSOR_POST_NORM));
  if (rf_model_config_layer_is_moe(c, layer)) {
    /* MoE block: out = x2 + moe(xn2), xn2 = norm(x2) */
    ws->kern->rmsnorm_apply(ws->s_norm, a->x2, a->rstd2, wpost, n, h, ws->stream);
    rf_model_moe_backward(ws, layer, w, ws->s_norm, dout, ws->s_dnorm, grads);
  } else {
    layer_mlp_backward(ws, a, w, grads, wpost);
  }
  ws->kern->rmsnorm_backward(dout, lg(a, grads, RF_MODEL_LAYER_TENSOR_POST_NORM), ws->s_dnorm, a->x2,
                             a->rstd2, wpost, n, h, ws->scratch, ws->scratch_bytes, ws->stream);
  /* dout now holds d(x2). */
  bias_grad(ws, a, grads, RF_MODEL_LAYER_TENSOR_O_BIAS, dout, n, h);

  if (has_mla(c))
    mla_backward(ws, a, w, grads);
  else
    gqa_backward(ws, layer, a, w, grads);
}

void rf_model_embed_backward(struct rf_model_ws *ws, float *const *grads) {
  ws->kern->embedding_backward(grads[0], ws->dx, ws->tokens, ws->b * ws->t, ws->cfg.hidden_size, ws->scratch,
                               ws->scratch_bytes, ws->stream);
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
  struct rf_model_units map;
  rf_model_units_find(&ws->cfg, &map);
  float *last = rf_xmalloc(sizeof(float) * (size_t)ws->cfg.vocab_size); /* the last row's logits */
  for (int cur = len; cur < total; cur++) {
    int ctx = cur < ws->cap_t ? cur : ws->cap_t;
    const int32_t *window = tokens + (cur - ctx);
    RF_TRY(rf_model_ws_set_shape(ws, 1, ctx));
    if (rf_model_embed_forward(ws, &units[map.embed_unit][map.embed_tensor], window) != 0) {
      free(last);
      ws->b = b0, ws->t = t0;
      return -1;
    }
    for (int l = 0; l < L; l++) rf_model_layer_forward(ws, l, units[map.first_layer + l]);
    rf_model_head_forward(ws, units[map.head_unit], NULL);
    rf_model_ws_read_logits(ws, ctx - 1, 1, last);
    tokens[cur] = rf_model_sample_logits(last, ws->cfg.vocab_size, temperature, rng);
  }
  free(last);
  ws->b = b0;
  ws->t = t0;
  return 0;
}
