/* src/model's binding of a model to the runtime (model/train.h, the public
 * include/rfsdp_model.h): declaration, one micro-step, evaluation, sampling, and
 * the token files a program trains on. */
#include "model/train.h"

#include <math.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "core/trace.h"
#include "data/data.h"
#include "fsdp/fsdp.h"
#include "model/family.h"
#include "optim/optim.h"
#include "rfsdp_optim.h"

static void rf_train_model_poll(void *fsdp) { rf_fsdp_poll(fsdp); }

int rf_train_model_init(struct rf_train_model *m, const struct rf_model_config *cfg,
                        const struct rf_fsdp_options *opt, const struct rf_comm *comm,
                        struct rf_comm_mesh *mesh, int batch, int seq) {
  memset(m, 0, sizeof *m);
  m->cfg = *cfg;
  RF_TRY(rf_fsdp_create_on(&m->fsdp, mesh, opt));
  m->comm = rf_xcalloc(1, sizeof *m->comm);
  rf_comm_view(m->comm, comm, rf_fsdp_counters(m->fsdp)); /* the MoE statistics: part of a step */
  rf_model_desc_make(cfg, &m->desc);
  RF_REQUIRE(!m->desc.too_large, "the model is too large: more than 2^50 parameters or 2^18 tensors");
  rf_model_units_find(cfg, &m->map);
  /* tied: the head unit (the embedding) stays gathered through the step while
   * the layers take turns in another parameter slot */
  RF_REQUIRE(!cfg->tie_word_embeddings || opt->prefetch >= 1 || !opt->reshard_after_forward,
             "tie_word_embeddings: the unit holding the embedding stays gathered through the step; "
             "--prefetch 0 leaves no parameter slot for the layers (use --prefetch 1 or more)");
  m->n_units = m->desc.n_units;
  m->first_tensor = rf_xcalloc((size_t)m->n_units, sizeof(int));
  for (int u = 0; u < m->n_units; u++) {
    int unit = rf_fsdp_add_unit(m->fsdp, m->desc.units[u].name);
    RF_REQUIRE(unit >= 0, "%s", rf_fsdp_error());
    for (int i = 0; i < m->desc.units[u].n_tensors; i++) {
      const struct rf_model_tensor *spec = &m->desc.units[u].tensors[i];
      int t = rf_fsdp_add_tensor(m->fsdp, unit, spec->name, spec->ndim, spec->shape, spec->block_rows,
                                 spec->init);
      RF_REQUIRE(t >= 0, "%s", rf_fsdp_error());
      /* the linear weights and the fused experts; embeddings, norms, biases, routers and the
       * output head stay in the param dtype */
      if (spec->fp8) RF_REQUIRE(rf_fsdp_set_fp8(m->fsdp, t) == 0, "%s", rf_fsdp_error());
      if (i == 0) m->first_tensor[u] = t;
    }
  }
  RF_REQUIRE(rf_fsdp_finalize(m->fsdp) == 0, "%s", rf_fsdp_error());
  m->balance =
      rf_model_config_is_moe(cfg) && cfg->moe.output_router_logits && rf_model_config_moe_layers(cfg) > 0;
  if (m->balance) m->balance_stats = rf_xcalloc(2 * (size_t)cfg->moe.num_local_experts + 1, sizeof(double));
  if (rf_model_config_is_moe(cfg) && rf_model_config_family(cfg)->router == RF_MODEL_ROUTER_SIGMOID_GROUP &&
      cfg->deepseek_v3.bias_update_speed > 0)
    m->n_bias = rf_model_config_moe_layers(cfg);
  if (m->n_bias) {
    size_t ne = (size_t)cfg->moe.num_local_experts;
    m->bias_tensor = rf_xcalloc((size_t)m->n_bias, sizeof(int));
    m->bias_load = rf_xcalloc((size_t)m->n_bias * ne, sizeof(double));
    m->bias_pieces = rf_xcalloc((size_t)m->n_bias * ne, sizeof(float));
    for (int l = 0, i = 0; l < cfg->num_hidden_layers; l++)
      if (rf_model_config_layer_is_moe(cfg, l))
        m->bias_tensor[i++] = m->first_tensor[m->map.first_layer + l] +
                              rf_model_layer_slot(cfg, l, RF_MODEL_LAYER_TENSOR_ROUTER_SCORE_BIAS);
  }
  m->logits_host = rf_xcalloc((size_t)cfg->vocab_size, sizeof(float));
  m->step_scalars = rf_device_alloc(m->fsdp->device, 2 * sizeof(double), 64);
  /* the workspaces on the context's device, their allocations counted in its counters */
  RF_TRY(
      rf_model_ws_init_on(&m->ws, m->fsdp->device, m->fsdp->stream[RF_FSDP_STREAM_COMPUTE], cfg, batch, seq));
  RF_TRY(
      rf_model_ws_init_on(&m->gen_ws, m->fsdp->device, m->fsdp->stream[RF_FSDP_STREAM_COMPUTE], cfg, 1, seq));
  if (opt->fp8) {
    RF_TRY(rf_model_ws_set_fp8(&m->ws, opt->fp8_pow2));
    RF_TRY(rf_model_ws_set_fp8(&m->gen_ws, opt->fp8_pow2));
  }
  /* MPI advances the prefetches only inside MPI calls: poll after every matmul */
  m->ws.stage.progress = m->gen_ws.stage.progress = rf_train_model_poll;
  m->ws.stage.progress_ctx = m->gen_ws.stage.progress_ctx = m->fsdp;
  return 0;
}

int rf_train_model_set_compute(struct rf_train_model *m, enum rf_dtype compute) {
  RF_TRY(rf_model_ws_set_compute(&m->ws, compute));
  return rf_model_ws_set_compute(&m->gen_ws, compute);
}

int rf_train_threads(int ranks_on_node) {
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && *env) return omp_get_max_threads();
  cpu_set_t set;
  int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : omp_get_num_procs();
  int local = ranks_on_node > 1 ? ranks_on_node : 1;
  return cores / local > 1 ? cores / local : 1;
}

int rf_train_set_threads(const struct rf_comm *comm) {
  int threads = rf_train_threads(rf_comm_node_ranks(comm));
  omp_set_num_threads(threads);
  return threads;
}

void rf_train_model_free(struct rf_train_model *m) {
  if (m->step_scalars) rf_device_release(m->fsdp->device, m->step_scalars);
  rf_model_ws_free(&m->ws);
  rf_model_ws_free(&m->gen_ws);
  rf_fsdp_free(m->fsdp);
  rf_model_desc_free(&m->desc);
  free(m->first_tensor);
  free(m->comm);
  free(m->balance_stats);
  free(m->bias_tensor);
  free(m->bias_load);
  free(m->bias_pieces);
  free(m->logits_host);
  memset(m, 0, sizeof *m);
}

/* ---- the public face (include/rfsdp_model.h) ------------------------------------ */

int rf_train_model_create(struct rf_train_model **out, const char *config_path,
                          const struct rf_fsdp_options *opt, struct rf_comm *comm, int replicas, int batch,
                          int seq) {
  *out = NULL;
  struct rf_model_config cfg;
  int rc = rf_model_config_load(&cfg, config_path);
  RF_TRY(rf_comm_agree(comm, rc));
  RF_REQUIRE(replicas >= 0 && (replicas == 0 || comm->world % replicas == 0),
             "%d replicas do not divide the %d ranks", replicas, comm->world);
  RF_REQUIRE(batch >= 1 && seq >= 1 && seq <= cfg.max_position_embeddings,
             "%s: %d sequences of %d tokens (max_position_embeddings %d)", config_path, batch, seq,
             cfg.max_position_embeddings);
  int group = replicas > 0 ? comm->world / replicas : 0; /* 0: the ranks of each node */
  if (replicas == 0) RF_TRY(rf_comm_mesh_node_group(comm, &group));
  struct rf_comm_mesh mesh;
  rf_comm_mesh_split(&mesh, comm, group, replicas == 0);
  struct rf_train_model *m = rf_xcalloc(1, sizeof *m);
  rc = rf_train_model_init(m, &cfg, opt, comm, &mesh, batch, seq);
  if (rc != 0) {
    if (m->fsdp) rf_train_model_free(m);
    free(m);
    return -1;
  }
  *out = m;
  return 0;
}

void rf_train_model_destroy(struct rf_train_model *m) {
  if (!m) return;
  rf_train_model_free(m);
  free(m);
}

struct rf_fsdp *rf_train_model_fsdp(const struct rf_train_model *m) {
  return m ? m->fsdp : NULL;
}

int rf_train_model_vocab(const struct rf_train_model *m) { return m ? m->cfg.vocab_size : -1; }

struct rf_comm *rf_train_model_comm(const struct rf_train_model *m) {
  return m ? m->comm : NULL;
}

int64_t rf_train_model_workspace_bytes(const struct rf_train_model *m) {
  return m ? (int64_t)m->ws.bytes : -1;
}

int rf_train_model_config_read(const char *config_path, int seq, struct rf_train_model_config *out) {
  RF_REQUIRE_ARG("rf_train_model_config_read", config_path);
  RF_REQUIRE_ARG("rf_train_model_config_read", out);
  struct rf_model_config cfg;
  RF_TRY(rf_model_config_load(&cfg, config_path));
  out->vocab_size = cfg.vocab_size;
  out->max_position_embeddings = cfg.max_position_embeddings;
  out->flops_per_token = rf_model_flops_per_token(&cfg, seq);
  return 0;
}

int rf_train_model_fp8_names(const char *config_path, char ***names, int *n) {
  RF_REQUIRE_ARG("rf_train_model_fp8_names", config_path);
  RF_REQUIRE_ARG("rf_train_model_fp8_names", names);
  RF_REQUIRE_ARG("rf_train_model_fp8_names", n);
  *names = NULL;
  *n = 0;
  struct rf_model_desc desc;
  RF_TRY(rf_model_desc_load(config_path, &desc));
  size_t count = 0, chars = 0;
  for (int u = 0; u < desc.n_units; u++)
    for (int i = 0; i < desc.units[u].n_tensors; i++)
      if (desc.units[u].tensors[i].fp8) {
        count++;
        chars += strlen(desc.units[u].tensors[i].name) + 1;
      }
  if (count > 0) {
    char **list = rf_xmalloc(count * sizeof *list + chars); /* the pointers, then the strings */
    char *text = (char *)(list + count);
    for (int u = 0; u < desc.n_units; u++)
      for (int i = 0; i < desc.units[u].n_tensors; i++)
        if (desc.units[u].tensors[i].fp8) {
          size_t len = strlen(desc.units[u].tensors[i].name) + 1;
          memcpy(text, desc.units[u].tensors[i].name, len);
          list[(*n)++] = text;
          text += len;
        }
    *names = list;
  }
  rf_model_desc_free(&desc);
  return 0;
}

void rf_train_model_optim_flags(const struct rf_train_model *m, int *flags) {
  for (int u = 0; u < m->desc.n_units; u++)
    for (int i = 0; i < m->desc.units[u].n_tensors; i++) {
      const struct rf_model_tensor *mt = &m->desc.units[u].tensors[i];
      flags[m->first_tensor[u] + i] =
          (mt->decay ? RF_OPTIM_FLAG_DECAY : 0) | (mt->matrix ? RF_OPTIM_FLAG_MATRIX : 0);
    }
}

/* Row `row` of ws's logits (device memory) into m->logits_host by one explicit copy: the host never
 * reads the device's logits. */
static const float *rf_train_logits_row(const struct rf_train_model *m, const struct rf_model_ws *ws,
                                        int row) {
  rf_model_ws_read_logits(ws, row, 1, m->logits_host);
  return m->logits_host;
}

const float *rf_train_model_logits(const struct rf_train_model *m, int row) {
  return rf_train_logits_row(m, &m->ws, row);
}

/* ---- one step ------------------------------------------------------------------- */

/* Points w (and g when non-NULL) at unit u's views. */
static void rf_train_weights(struct rf_train_model *m, int u, struct rf_model_weight *w, float **g) {
  int n = m->desc.units[u].n_tensors;
  RF_ASSERT(n <= RF_MODEL_LAYER_MAX_TENSORS);
  for (int i = 0; i < n; i++) {
    int t = m->first_tensor[u] + i;
    w[i].f32 = rf_fsdp_param(m->fsdp, t);
    w[i].bf16 = rf_fsdp_param_bf16(m->fsdp, t);
    w[i].fp8 = rf_fsdp_param_fp8(m->fsdp, t, &w[i].fp8_scales);
    if (g) g[i] = rf_fsdp_grad(m->fsdp, t);
  }
}

/* The embedding table's weights (and gradient): its own unit's, or (tied) the
 * head's output matrix, which stays gathered from the embedding to the head. */
static const struct rf_model_weight *rf_train_embed(struct rf_train_model *m, float **g) {
  const struct rf_model_units *map = &m->map;
  if (map->embed_unit == map->head_unit) {
    if (g) *g = m->gh[map->embed_tensor];
    return &m->wh[map->embed_tensor];
  }
  rf_train_weights(m, map->embed_unit, m->w, g ? m->g : NULL);
  if (g) *g = m->g[map->embed_tensor];
  return &m->w[map->embed_tensor];
}

/* Forward through every unit; returns the loss sum (0 without targets; 0 with `on_device`, the sum
 * left in ws->loss unread), NAN on a bad token. */
static double rf_train_forward(struct rf_train_model *m, struct rf_model_ws *ws, const int32_t *tokens,
                               const int32_t *targets, int on_device) {
  struct rf_fsdp *f = m->fsdp;
  const struct rf_model_units *map = &m->map;
  int tied = map->embed_unit == map->head_unit;
  rf_fsdp_forward_begin(f, map->embed_unit);
  if (tied) rf_train_weights(m, map->head_unit, m->wh, NULL);
  int bad = rf_model_embed_forward(ws, rf_train_embed(m, NULL), tokens);
  if (!tied) rf_fsdp_forward_end(f, map->embed_unit);
  for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
    rf_fsdp_forward_begin(f, map->first_layer + l);
    rf_train_weights(m, map->first_layer + l, m->w, NULL);
    rf_model_layer_forward(ws, l, m->w);
    rf_fsdp_forward_end(f, map->first_layer + l);
  }
  if (!tied) {
    rf_fsdp_forward_begin(f, map->head_unit);
    rf_train_weights(m, map->head_unit, m->wh, NULL);
  }
  double loss = 0;
  if (on_device)
    rf_model_head_forward_on_device(ws, m->wh, targets);
  else
    loss = rf_model_head_forward(ws, m->wh, targets);
  rf_fsdp_forward_end(f, map->head_unit);
  return bad ? NAN : loss;
}

/* The load-balancing loss of the global micro-batch (collective): sets the
 * backward's router gradient and returns this rank's share of the loss sum. */
static double rf_train_balance(struct rf_train_model *m, float grad_scale) {
  struct rf_model_ws *ws = &m->ws;
  int ne = m->cfg.moe.num_local_experts;
  double *st = m->balance_stats;
  rf_model_ws_moe_stats(ws, st, st + ne); /* device memory: two explicit copies, then summed over the ranks */
  int layers =
      rf_model_config_moe_layers(&m->cfg); /* transformers counts the rows of the layers with a router */
  st[2 * ne] = (double)ws->b * ws->t * layers;
  rf_comm_allreduce(m->comm, st, 2 * ne + 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  /* d(step loss)/d(aux) = coef * (the micro-batch's tokens) * grad_scale */
  double tokens = st[2 * ne] / layers, coef = m->cfg.moe.router_aux_loss_coef;
  double aux = rf_model_moe_balance(ws, st, st + ne, st[2 * ne], (float)(coef * tokens * grad_scale));
  return coef * aux * tokens / m->comm->world;
}

/* One micro-batch's forward and backward. acc NULL: returns this rank's loss sum (read by one copy);
 * else the loss sum is added into *acc (one f64 of device memory) on the device, unread, and the
 * return is 0 (NAN either way on a bad token). */
static double rf_train_micro(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets,
                             float grad_scale, double *acc) {
  struct rf_fsdp *f = m->fsdp;
  const struct rf_model_units *map = &m->map;
  int tied = map->embed_unit == map->head_unit;
  double loss = rf_train_forward(m, &m->ws, tokens, targets, acc != NULL);
  double balance = m->balance ? rf_train_balance(m, grad_scale) : 0.0;
  if (acc) /* acc + (head + balance): the host's order */
    rf_device_add_f64(m->fsdp->device, acc, m->ws.loss, balance, m->ws.stream);
  else if (m->balance)
    loss += balance;
  rf_fsdp_backward_begin(f, map->head_unit);
  rf_train_weights(m, map->head_unit, m->wh, m->gh);
  rf_model_head_backward(&m->ws, m->wh, m->gh, grad_scale);
  if (!tied) rf_fsdp_backward_end(f, map->head_unit);
  for (int l = m->cfg.num_hidden_layers - 1; l >= 0; l--) {
    rf_fsdp_backward_begin(f, map->first_layer + l);
    rf_train_weights(m, map->first_layer + l, m->w, m->g);
    rf_model_layer_backward(&m->ws, l, m->w, m->g);
    rf_fsdp_backward_end(f, map->first_layer + l);
  }
  if (!tied) rf_fsdp_backward_begin(f, map->embed_unit);
  float *gemb = NULL;
  rf_train_embed(m, &gemb);
  rf_model_embed_backward(&m->ws, &gemb);
  rf_fsdp_backward_end(f, map->embed_unit);
  return loss;
}

/* DeepSeek-V3's balancing bias after a step (collective): each MoE layer's loads summed over the
 * ranks, then b_e += u * sign(mean load - load_e) on this rank's piece of each bias (its master,
 * device memory: copied to the host and back on the compute stream). */
static void rf_train_bias_update(struct rf_train_model *m) {
  struct rf_fsdp *f = m->fsdp;
  struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
  int ne = m->cfg.moe.num_local_experts;
  float u = (float)m->cfg.deepseek_v3.bias_update_speed;
  rf_model_ws_moe_load_read(&m->ws, m->bias_load);
  rf_comm_allreduce(m->comm, m->bias_load, m->n_bias * ne, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  for (int i = 0; i < m->n_bias; i++) {
    const double *load = m->bias_load + (size_t)i * ne;
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, m->bias_tensor[i], &v);
    int64_t len = v.end - v.begin;
    if (len <= 0) continue; /* no piece on this rank */
    float *piece = m->bias_pieces + (size_t)i * ne;
    rf_device_copy(f->device, piece, v.master, sizeof(float) * (size_t)len, RF_DEVICE_COPY_DEVICE_TO_HOST,
                   compute);
    rf_model_bias_update(piece, v.begin, len, load, ne, u);
    rf_device_copy(f->device, v.master, piece, sizeof(float) * (size_t)len, RF_DEVICE_COPY_HOST_TO_DEVICE,
                   compute);
  }
}

double rf_train_model_micro_step(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets,
                                 float grad_scale) {
  return rf_train_micro(m, tokens, targets, grad_scale, NULL);
}

int rf_train_model_step(struct rf_train_model *m, struct rf_optim *o, const struct rf_train_step_args *a,
                        struct rf_train_step_result *out) {
  RF_REQUIRE(m && o && a && out && a->batch && a->tokens && a->targets && a->accum >= 1,
             "rf_train_model_step: no model, optimizer, arguments, result, batch function or buffers, or "
             "accum %d < 1",
             a ? a->accum : 0);
  struct rf_fsdp *f = m->fsdp;
  struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
  out->loss = out->norm = NAN;
  int bad = 0; /* a token out of range: the loss is NaN */
  rf_comm_watchdog_note(a->step + 1, "forward and backward");
  rf_fsdp_zero_grad(f);
  rf_device_memset(f->device, m->step_scalars, 0, 2 * sizeof(double), compute);
  if (m->n_bias) rf_model_ws_moe_load_reset(&m->ws); /* this step's loads only */
  for (int micro = 0; micro < a->accum; micro++) {
    uint64_t t = rf_trace_now();
    RF_TRY(a->batch(a->ctx, micro, a->tokens, a->targets));
    if (t) rf_trace_span(RF_TRACE_LANE_DATA, "batch", t, rf_time_ns(), -1, -1);
    /* HSDP: the replica all-reduces start during the last micro-batch's backward */
    if (micro == a->accum - 1) rf_fsdp_set_last_micro_batch(f);
    /* the loss summed on the device in micro-batch order (0 + l0 + l1 ...: the host's bits) */
    bad |= isnan(rf_train_micro(m, a->tokens, a->targets, (float)a->scale, &m->step_scalars[0]));
  }
  rf_comm_watchdog_note(a->step + 1, "gradients, norm and optimizer");
  double norm = NAN;
  const double *sumsq = NULL; /* AdamW: the norm left on the device, read below with the loss */
  int rc = rf_optim_step_fsdp_launch(o, f, a->lr, a->clip, &norm, &sumsq);
  if (rc < 0) return -1; /* the same on every rank */
  /* the step's one wait (AdamW): the loss and the norm's sum, after the optimizer's launches */
  double scalars[2] = {0, 0};
  if (sumsq)
    rf_device_copy(f->device, &m->step_scalars[1], sumsq, sizeof(double), RF_DEVICE_COPY_DEVICE_TO_DEVICE,
                   compute);
  rf_device_copy(f->device, scalars, m->step_scalars, (sumsq ? 2 : 1) * sizeof(double),
                 RF_DEVICE_COPY_DEVICE_TO_HOST, compute);
  if (sumsq) rc = rf_optim_step_fsdp_settle(o, scalars[1], &norm);
  double loss = bad ? NAN : scalars[0];
  uint64_t t = rf_trace_now();
  rf_comm_allreduce(m->comm, &loss, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "loss all-reduce", t, rf_time_ns(), -1, -1);
  out->loss = loss * a->scale;
  out->norm = norm;
  if (m->n_bias && rc == 0) rf_train_bias_update(m);
  return rc; /* 1: skipped (a non-finite norm) */
}

double rf_train_model_loss(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets) {
  double loss = rf_train_forward(m, &m->ws, tokens, targets, 0);
  rf_fsdp_reshard_all(m->fsdp);
  return loss;
}

int rf_train_model_generate(struct rf_train_model *m, int32_t *tokens, int len, int total, float temperature,
                            uint64_t *rng) {
  struct rf_model_ws *ws = &m->gen_ws;
  RF_REQUIRE(len >= 1 && total >= len, "generate: bad lengths %d, %d", len, total);
  for (int n = len; n < total; n++) {
    int window = n < ws->cap_t ? n : ws->cap_t;
    RF_TRY(rf_model_ws_set_shape(ws, 1, window));
    double rc = rf_train_forward(m, ws, tokens + n - window, NULL, 0);
    rf_fsdp_reshard_all(m->fsdp);
    RF_REQUIRE(!isnan(rc), "generate: a token is outside the vocabulary");
    tokens[n] =
        rf_model_sample_logits(rf_train_logits_row(m, ws, window - 1), m->cfg.vocab_size, temperature, rng);
  }
  return 0;
}

/* ---- token files -------------------------------------------------------------- */

struct rf_token_data {
  struct rf_token_file file;
  struct rf_data_loader loader;
};

int rf_token_data_open(struct rf_token_data **out, const char *path) {
  RF_REQUIRE_ARG("rf_token_data_open", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_token_data_open", path);
  struct rf_token_data *d = rf_xcalloc(1, sizeof *d);
  if (rf_token_file_open(&d->file, path) != 0) {
    free(d);
    return -1;
  }
  d->loader.file = &d->file; /* rf_token_data_check: whether batches can be drawn */
  *out = d;
  return 0;
}

int64_t rf_token_data_count(const struct rf_token_data *d) { return d ? d->file.n_tokens : -1; }
int64_t rf_token_data_vocab(const struct rf_token_data *d) { return d ? d->file.vocab_size : -1; }
const char *rf_token_data_path(const struct rf_token_data *d) { return d ? d->file.path : NULL; }

int rf_token_data_check(const struct rf_token_data *d) {
  RF_REQUIRE_ARG("rf_token_data_check", d);
  struct rf_data_loader probe;
  return rf_data_loader_init(&probe, &d->file);
}

int rf_token_data_check_tokenizer(const struct rf_token_data *d, const struct rf_tokenizer *tok,
                                  const char *tokenizer_path) {
  RF_REQUIRE_ARG("rf_token_data_check_tokenizer", d);
  RF_REQUIRE_ARG("rf_token_data_check_tokenizer", tok);
  RF_REQUIRE_ARG("rf_token_data_check_tokenizer", tokenizer_path);
  return rf_token_file_check_tokenizer(&d->file, tok, tokenizer_path);
}

int rf_tokenizer_open(struct rf_tokenizer **out, const char *path) {
  RF_REQUIRE_ARG("rf_tokenizer_open", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_tokenizer_open", path);
  struct rf_tokenizer *tok = rf_xcalloc(1, sizeof *tok);
  if (rf_tokenizer_load(tok, path) != 0) {
    free(tok);
    return -1;
  }
  *out = tok;
  return 0;
}

void rf_tokenizer_close(struct rf_tokenizer *tok) {
  if (!tok) return;
  rf_tokenizer_free(tok);
  free(tok);
}

void rf_token_data_close(struct rf_token_data *d) {
  if (!d) return;
  rf_token_file_close(&d->file);
  free(d);
}

int rf_token_data_batch(const struct rf_token_data *d, uint64_t seed, int64_t step, int64_t batch,
                        int64_t seq, int part, int parts, int32_t *tokens, int32_t *targets) {
  RF_TRY(rf_token_data_check(d));
  return rf_data_loader_batch(&d->loader, seed, step, batch, seq, part, parts, tokens, targets);
}
