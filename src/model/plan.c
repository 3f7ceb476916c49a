/* The planner and the step simulator as a library (include/rfsdp_plan.h): a
 * model's description planned at world sizes by the planning policy the runtime
 * runs (rf_fsdp_plan_policy), its peers' layouts, FP8 tiles, and with a batch the
 * simulated step, whose model side (FLOPs, activations, the optimizer groups) is
 * src/model/cost.c's and whose mesh is src/sim's. `rfsdp plan` prints through it;
 * python/rfsdp's plan() reads its JSON. */
#include "rfsdp_plan.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "fsdp/fsdp.h"
#include "model/cost.h"
#include "model/desc.h"
#include "plan/plan.h"
#include "rfsdp_optim.h"
#include "sim/sim.h"

/* The run options that change the layout, as the request spells them. */
struct rf_plan_args {
  const char *layout, *shard, *optim, *param_dtype, *reduce_dtype;
};

/* The simulated step's options; replicate: the mesh resolved at the world planned. */
struct rf_plan_sim_args {
  int64_t batch, seq;
  int accum, prefetch, no_reshard, replicate, rank;
  const char *mesh, *compute_dtype, *network;
  double peak_gflops, efficiency, memory_per_rank;
};

/* What the model contributes to a simulated step. */
struct rf_plan_sim_model {
  int have_config;
  struct rf_model_config cfg;
  double flops_per_token;           /* rf_model_step_flops_per_token */
  int *flags;                       /* the description's optimizer groups, one per tensor (owned) */
  const struct rf_model_desc *desc; /* borrowed */
  struct rf_sim_network net;        /* the request's profile */
};

struct rf_plan {
  const char *model_path;
  struct rf_model_desc model;
  struct rf_plan_unit_in *units; /* the planner's tensor list (rf_model_desc_plan_units) */
  struct rf_plan_args args;
  int64_t align_bytes;
  size_t elem_bytes; /* the peers' copies are counted in the parameter dtype */
  int max_buffers;
  double max_padding; /* percent; < 0: off */
  int json, buffers;
  struct rf_plan_policy policy; /* what rfsdp train would run with these options */
  struct rf_plan_sim_args sim;  /* batch > 0: simulate a step */
  struct rf_plan_sim_model sim_model;
  int have_sim_model;
  enum rf_optim_kind optim;
  FILE *out; /* where rf_plan_print writes */
};

int rf_plan_mesh_parse(const char *text, int world, int *replicate) {
  RF_REQUIRE(text && replicate && world >= 1, "rf_plan_mesh_parse: no text or output, or world %d", world);
  if (strcmp(text, "node") == 0) {
    *replicate = RF_PLAN_MESH_NODE;
    return 0;
  }
  if (strcmp(text, "auto") == 0) {
    *replicate = RF_PLAN_MESH_AUTO;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  long r = strtol(text, &end, 10);
  RF_REQUIRE(end != text && *end == 0 && errno == 0,
             "--replicate '%s': expected a replica count R >= 1, node or auto", text);
  RF_REQUIRE(r >= 1, "--replicate %ld: the replica count must be at least 1", r);
  RF_REQUIRE(
      world % r == 0,
      "--replicate %ld does not divide the %d ranks (W = R x S): use a divisor of %d, or run %ld x S ranks",
      r, world, world, r);
  *replicate = (int)r;
  return 0;
}

const char *rf_plan_network_names(void) { return rf_sim_network_names(); }

int rf_plan_request_init(struct rf_plan_request *r, size_t size) {
  RF_REQUIRE(r && size == sizeof *r,
             "rf_plan_request_init: the request is %zu bytes here, %zu in the library (a binding's layout "
             "differs)",
             size, sizeof *r);
  *r = (struct rf_plan_request){.optim = "adamw",
                                .layout = "planned",
                                .shard = "equal",
                                .param_dtype = "f32",
                                .reduce_dtype = "f32",
                                .fp8 = "off",
                                .block_rows = -1,
                                .align_bytes = 64,
                                .max_buffers = 4,
                                .max_padding = -1,
                                .replicate = "1",
                                .seq = 128,
                                .accum = 1,
                                .prefetch = 1,
                                .rank = -1,
                                .compute_dtype = "f32",
                                .network = "here"};
  return 0;
}

/* 1 when `value` is one of the '|'-separated `choices`. */
static int rf_plan_choice(const char *value, const char *choices) {
  size_t n = value ? strlen(value) : 0;
  for (const char *p = choices; value && *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, value, n) == 0) return 1;
    if (!bar) break;
    p = bar + 1;
  }
  return 0;
}

int rf_plan_request_fsdp_options(const struct rf_plan_request *a, struct rf_fsdp_options *o) {
  RF_REQUIRE(a && o, "rf_plan_request_fsdp_options: no request or options");
  static const struct {
    const char *name, *choices;
  } words[] = {{"layout", "planned|fsdp2|flat"}, {"shard", "equal|ragged"}, {"fp8", "off|block"}};
  const char *given[] = {a->layout, a->shard, a->fp8};
  for (int i = 0; i < 3; i++)
    RF_REQUIRE(rf_plan_choice(given[i], words[i].choices), "--%s: '%s' is not one of %s", words[i].name,
               given[i] ? given[i] : "(none)", words[i].choices);
  o->layout = strcmp(a->layout, "fsdp2") == 0  ? RF_LAYOUT_FSDP2
              : strcmp(a->layout, "flat") == 0 ? RF_LAYOUT_FLAT
                                               : RF_LAYOUT_PLANNED;
  o->shard = strcmp(a->shard, "ragged") == 0 ? RF_SHARD_MODE_RAGGED : RF_SHARD_MODE_EQUAL;
  RF_REQUIRE(a->block_rows >= 1 || a->block_rows == -1,
             "--block-rows must be >= 1 (left out: what the optimizer needs), got %lld",
             (long long)a->block_rows);
  /* the optimizer's blocks (8-bit AdamW: 32-row strips, runs of 256) whole on one rank */
  enum rf_optim_kind kind;
  RF_REQUIRE(a->optim, "--optim: none given");
  RF_TRY(rf_optim_kind_parse(a->optim, &kind));
  struct rf_optim_layout_needs needs;
  rf_optim_layout_needs(kind, &needs);
  o->block_rows = a->block_rows > 0 ? a->block_rows : needs.block_rows;
  o->vector_block = needs.vector_block;
  RF_REQUIRE(a->param_dtype && a->reduce_dtype, "--param-dtype and --reduce-dtype: none given");
  RF_TRY(rf_dtype_parse(a->param_dtype, &o->param_dtype));
  RF_TRY(rf_dtype_parse(a->reduce_dtype, &o->reduce_dtype));
  o->fp8 = strcmp(a->fp8, "block") == 0;
  RF_REQUIRE(o->fp8 || !a->fp8_pow2, "--fp8-pow2-scales needs --fp8 block");
  o->fp8_pow2 = a->fp8_pow2;
  return 0;
}

static int rf_plan_sim_setup(const struct rf_plan_sim_args *a, const char *model_path,
                             const struct rf_model_desc *desc, struct rf_plan_sim_model *out) {
  memset(out, 0, sizeof *out);
  RF_TRY(rf_sim_network_load(a->network, &out->net));
  if (a->peak_gflops > 0) out->net.peak_gflops = out->net.peak_gflops_f32 = a->peak_gflops;
  if (a->efficiency > 0) out->net.efficiency = a->efficiency;
  out->desc = desc;
  out->flags = rf_xcalloc((size_t)rf_max_i64(desc->n_tensors, 1), sizeof *out->flags);
  rf_model_desc_optim_flags(desc, out->flags); /* the optimizer's groups */
  if (strcmp(desc->model_type, "generic") == 0) {
    out->flops_per_token = 6.0 * (double)desc->numel;
    return 0;
  }
  RF_TRY(rf_model_config_read(&out->cfg, model_path));
  if (out->cfg.head_dim == 0) out->cfg.head_dim = out->cfg.hidden_size / out->cfg.num_attention_heads;
  out->have_config = 1;
  out->flops_per_token = rf_model_step_flops_per_token(desc, &out->cfg, (int)a->seq);
  return 0;
}

static void rf_plan_sim_model_free(struct rf_plan_sim_model *sm) {
  free(sm->flags);
  sm->flags = NULL;
}

/* The activation estimate's context: the model and the run's options. */
struct rf_plan_sim_act {
  const struct rf_model_config *cfg;
  int seq, fp8;
  enum rf_dtype compute;
};

static int64_t rf_plan_sim_activations(const void *ctx, int micro, int ranks_on_node) {
  const struct rf_plan_sim_act *x = ctx;
  return rf_model_activation_bytes(x->cfg, micro, x->seq, x->compute, x->fp8, ranks_on_node);
}

/* The simulator's workload of the run of a and sm (act: its activation context, filled here). */
static void rf_plan_sim_workload(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                                 const struct rf_plan_policy *p, enum rf_optim_kind optim,
                                 struct rf_plan_sim_act *act, struct rf_sim_workload *w) {
  *act = (struct rf_plan_sim_act){&sm->cfg, (int)a->seq, p->fp8,
                                  strcmp(a->compute_dtype, "bf16") == 0 ? RF_DTYPE_BF16 : RF_DTYPE_F32};
  *w = (struct rf_sim_workload){
      .batch = a->batch,
      .seq = a->seq,
      .accum = a->accum,
      .prefetch = a->prefetch,
      .reshard_after_forward = !a->no_reshard,
      .rank = a->rank,
      .f32_compute = strcmp(a->compute_dtype, "f32") == 0,
      .flops_per_token = sm->flops_per_token,
      .flags = sm->flags,
      /* the trainer's loss, agreement and MoE statistics on the world */
      .scalar_reduce_bytes = sm->have_config ? rf_model_scalar_reduce_bytes(&sm->cfg, a->accum) : 8 + 4,
      .optim = optim,
      /* the trainer's workspace of one micro-batch */
      .activation_bytes = sm->have_config ? rf_plan_sim_activations : NULL,
      .ctx = act,
      .net = sm->net,
  };
}

static int rf_plan_sim_check(const struct rf_plan_sim_args *a, const struct rf_sim_network *net,
                             double max_padding, const int *worlds, int n) {
  int auto_mesh = strcmp(a->mesh, "auto") == 0;
  RF_REQUIRE(a->memory_per_rank <= 0 || auto_mesh,
             "--memory-per-rank chooses the shard group of --replicate auto (got --replicate %s)", a->mesh);
  RF_REQUIRE(!auto_mesh || max_padding >= 0 || a->memory_per_rank > 0,
             "--replicate auto picks the shard group size by the planner's padding or the simulated memory: "
             "give --max-padding PERCENT, --memory-per-rank GB, or both");
  RF_REQUIRE(a->memory_per_rank <= 0 || a->batch > 0,
             "--memory-per-rank compares the simulated memory of a step: give --batch");
  RF_REQUIRE(a->rank < 0 || a->batch > 0, "--rank %d chooses the rank a step simulation shows: give --batch",
             a->rank);
  RF_REQUIRE(a->batch <= 0 || a->seq <= (1 << 24), "--seq %lld is too long (at most %d)", (long long)a->seq,
             1 << 24);
  for (int i = 0; i < n; i++) {
    int replicate = 0, world = worlds[i];
    RF_TRY(rf_plan_mesh_parse(a->mesh, world, &replicate));
    int group = replicate >= 1 ? world / replicate : world; /* auto: at most W */
    if (replicate == RF_PLAN_MESH_NODE) {
      RF_ASSERT(net);
      group = rf_sim_node_group(net, world);
      RF_REQUIRE(
          world % group == 0,
          "--replicate node: the %d ranks do not fill nodes of %d ranks (network %s): give --replicate R",
          world, group, net->name);
    }
    RF_REQUIRE(a->rank < group, "--rank %d: the shard group at world %d has %d rank(s) (0..%d)", a->rank,
               world, group, group - 1);
  }
  return 0;
}

static int rf_plan_sim_world(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                             const struct rf_plan_unit_in *units, const struct rf_plan_model_result *m,
                             const struct rf_plan_policy *p, int world, enum rf_optim_kind optim,
                             struct rf_sim_result *out) {
  struct rf_plan_sim_act act;
  struct rf_sim_workload w;
  rf_plan_sim_workload(a, sm, p, optim, &act, &w);
  return rf_sim_run_world(&w, units, m, p, world, a->replicate, out);
}

static int rf_plan_sim_auto_group(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                                  const struct rf_plan_unit_in *units, int n_units,
                                  const struct rf_plan_policy *p, int world, enum rf_optim_kind optim,
                                  double max_padding, double memory_gb, int *group) {
  struct rf_plan_sim_act act;
  struct rf_sim_workload w;
  if (memory_gb > 0) rf_plan_sim_workload(a, sm, p, optim, &act, &w);
  struct rf_sim_auto r;
  RF_TRY(rf_sim_auto_group(memory_gb > 0 ? &w : NULL, units, n_units, p, world, max_padding / 100.0,
                           memory_gb > 0 ? memory_gb * 1e9 : 0, &r));
  if (r.group > 0) {
    *group = r.group;
    return 0;
  }
  if (memory_gb <= 0 || r.least_bytes < 0)
    RF_FAIL("--replicate auto: no shard group size dividing %d meets --max-padding %g%%", world, max_padding);
  RF_FAIL(
      "--replicate auto: no shard group size dividing %d fits --memory-per-rank %g GB%s: the least is %.4g "
      "GB per rank, in groups of %d",
      world, memory_gb, max_padding >= 0 ? " under --max-padding" : "", (double)r.least_bytes / 1e9,
      r.least_group);
}

static int rf_plan_sim_mesh(struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                            const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                            int world, enum rf_optim_kind optim, double max_padding) {
  int group = 0;
  int replicate = 0;
  RF_TRY(rf_plan_mesh_parse(a->mesh, world, &replicate)); /* the parser rfsdp train uses */
  if (replicate == RF_PLAN_MESH_NODE) {
    group = rf_sim_node_group(&sm->net, world); /* that it divides W: rf_plan_sim_check */
  } else if (replicate == RF_PLAN_MESH_AUTO) {
    RF_TRY(rf_plan_sim_auto_group(a, sm, units, n_units, p, world, optim, max_padding, a->memory_per_rank,
                                  &group));
  } else {
    group = world / replicate;
  }
  RF_ASSERT(group >= 1 && world % group == 0);
  RF_REQUIRE(a->rank < group,
             "--rank %d: --replicate auto chose shard groups of %d rank(s) at world %d (0..%d)", a->rank,
             group, world, group - 1);
  a->replicate = world / group;
  return 0;
}

/* bytes as "1.23 GB", "4.56 MB", with kb also "7.8 kB", else "9 B" (the layout's table has no kB). */
static void rf_plan_bytes(double bytes, int kb, char *out, size_t size) {
  if (bytes >= 1e9)
    snprintf(out, size, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    snprintf(out, size, "%.2f MB", bytes / 1e6);
  else if (kb && bytes >= 1e3)
    snprintf(out, size, "%.1f kB", bytes / 1e3);
  else
    snprintf(out, size, "%.0f B", bytes);
}

static void rf_plan_sim_bytes(double bytes, char *out, size_t size) { rf_plan_bytes(bytes, 1, out, size); }

/* 1 when the profile puts more ranks on a node than it has cores and the run spans
 * nodes: there the measured costs come in scheduler slices (docs/scale.md, Across hosts). */
static int rf_plan_sim_oversubscribed(const struct rf_plan_sim_model *sm, const struct rf_sim_result *r) {
  return sm->net.ranks_per_node > sm->net.cores_per_node && r->world > sm->net.ranks_per_node;
}

static void rf_plan_sim_print(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                              const struct rf_sim_result *r, FILE *out) {
  char t[7][32];
  const struct rf_sim_memory *m = &r->mem;
  fprintf(
      out, "  simulated step: W = %d = %d x %d, batch %lld x %lld tokens, %d micro-batch(es), network %s\n",
      r->world, r->replicate, r->shard_world, (long long)a->batch, (long long)a->seq, a->accum, sm->net.name);
  rf_plan_sim_bytes((double)m->total, t[0], sizeof t[0]);
  rf_plan_sim_bytes((double)m->params, t[1], sizeof t[1]);
  rf_plan_sim_bytes((double)m->grads, t[2], sizeof t[2]);
  rf_plan_sim_bytes((double)m->optim, t[3], sizeof t[3]);
  rf_plan_sim_bytes((double)m->gathered, t[4], sizeof t[4]);
  rf_plan_sim_bytes((double)m->activations, t[5], sizeof t[5]);
  rf_plan_sim_bytes((double)m->optim_workspace, t[6], sizeof t[6]);
  fprintf(out,
          "    memory per rank  %s = params %s + grads %s + optimizer %s (+ workspace %s) + gathered %s + "
          "activations %s%s\n",
          t[0], t[1], t[2], t[3], t[6], t[4], t[5], sm->have_config ? "" : " (no config: not estimated)");
  rf_plan_sim_bytes((double)r->bytes_intra, t[0], sizeof t[0]);
  rf_plan_sim_bytes((double)r->bytes_inter, t[1], sizeof t[1]);
  rf_plan_sim_bytes((double)r->gather_bytes, t[2], sizeof t[2]);
  rf_plan_sim_bytes((double)r->reduce_bytes, t[3], sizeof t[3]);
  rf_plan_sim_bytes((double)r->alltoall_bytes, t[4], sizeof t[4]);
  fprintf(out,
          "    bytes per step   inside groups %s, across groups %s (all-gathers %s, reductions %s, matrix "
          "owners' "
          "all-to-all %s)\n",
          t[0], t[1], t[2], t[3], t[4]);
  fprintf(out,
          "    step time        %.2f ms = compute %.2f + exposed communication %.2f + optimizer %.2f + "
          "copies %.2f (communication alone %.2f; %.4g GFLOP per token at %.4g GFLOP/s x %.2f, time share "
          "%.2f)\n",
          r->step_ms, r->compute_ms, r->exposed_comm_ms, r->optim_ms, r->copy_ms, r->comm_ms,
          sm->flops_per_token * 1e-9, r->peak_gflops, sm->net.efficiency, r->time_share);
  if (rf_plan_sim_oversubscribed(sm, r))
    fprintf(
        out,
        "    warning          %d ranks per node on %d core(s) across nodes: a rank waiting in a collective "
        "spins on the core its peers need, costs come in scheduler slices, not alpha + bytes / busbw; this "
        "time assumes an even share (docs/scale.md, Across hosts)\n",
        sm->net.ranks_per_node, sm->net.cores_per_node);
}

static void rf_plan_sim_json(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                             const struct rf_sim_result *r, cJSON *o) {
  cJSON_AddNumberToObject(o, "replicate", r->replicate);
  cJSON_AddNumberToObject(o, "shard_world", r->shard_world);
  cJSON_AddNumberToObject(o, "batch", (double)a->batch);
  cJSON_AddNumberToObject(o, "seq", (double)a->seq);
  cJSON_AddNumberToObject(o, "accum", a->accum);
  cJSON_AddStringToObject(o, "network", sm->net.name);
  cJSON_AddNumberToObject(o, "peak_gflops", r->peak_gflops);
  cJSON_AddNumberToObject(o, "efficiency", sm->net.efficiency);
  cJSON_AddNumberToObject(o, "flops_per_token", sm->flops_per_token);
  cJSON_AddNumberToObject(o, "memory_per_rank_bytes", (double)r->mem.total);
  cJSON *m = cJSON_AddObjectToObject(o, "memory_parts");
  cJSON_AddNumberToObject(m, "params", (double)r->mem.params);
  cJSON_AddNumberToObject(m, "grads", (double)r->mem.grads);
  cJSON_AddNumberToObject(m, "optim", (double)r->mem.optim);
  cJSON_AddNumberToObject(m, "optim_workspace", (double)r->mem.optim_workspace);
  cJSON_AddNumberToObject(m, "gathered", (double)r->mem.gathered);
  cJSON_AddNumberToObject(m, "activations", (double)r->mem.activations);
  cJSON_AddNumberToObject(o, "memory_rank", r->rank);
  cJSON_AddNumberToObject(o, "shard_elems", (double)r->shard_elems);
  cJSON_AddNumberToObject(o, "bytes_per_step_intra", (double)r->bytes_intra);
  cJSON_AddNumberToObject(o, "bytes_per_step_inter", (double)r->bytes_inter);
  cJSON_AddNumberToObject(o, "gather_bytes_per_step", (double)r->gather_bytes);
  cJSON_AddNumberToObject(o, "reduce_bytes_per_step", (double)r->reduce_bytes);
  cJSON_AddNumberToObject(o, "alltoall_bytes_per_step", (double)r->alltoall_bytes);
  cJSON_AddNumberToObject(o, "predicted_step_ms", r->step_ms);
  cJSON_AddNumberToObject(o, "compute_ms", r->compute_ms);
  cJSON_AddNumberToObject(o, "time_share", r->time_share);
  cJSON_AddBoolToObject(o, "oversubscribed", rf_plan_sim_oversubscribed(sm, r));
  cJSON_AddNumberToObject(o, "comm_ms", r->comm_ms);
  cJSON_AddNumberToObject(o, "exposed_comm_ms", r->exposed_comm_ms);
  cJSON_AddNumberToObject(o, "replica_exposed_ms", r->replica_exposed_ms);
  cJSON_AddNumberToObject(o, "optim_ms", r->optim_ms);
  cJSON_AddNumberToObject(o, "copy_ms", r->copy_ms);
}

#define RF_PLAN_MAX_WORLD (1 << 24)

static double rf_plan_cmd_ratio(int64_t padded, int64_t elems) {
  return elems > 0 ? (double)(padded - elems) / (double)elems : 0.0;
}

/* Why unit u cannot get under the limit: which constraint of the one-buffer
 * lower bound is to blame. Writes a sentence into why. */
static void rf_plan_cmd_why(const struct rf_plan *c, int world, int u, const struct rf_plan_unit *p,
                            double limit, char *why, size_t size) {
  const struct rf_model_unit *mu = &c->model.units[u];
  const struct rf_plan_tensor_in *ts = c->units[u].tensors;
  int64_t fair = rf_ceil_div(mu->numel, world);
  int big = 0;
  for (int i = 1; i < mu->n_tensors; i++)
    if (rf_min_i64(ts[i].block_elems, ts[i].numel) > rf_min_i64(ts[big].block_elems, ts[big].numel)) big = i;
  int64_t gmax = rf_min_i64(ts[big].block_elems, ts[big].numel);
  if (p->mode == RF_SHARD_MODE_RAGGED) {
    snprintf(
        why, size,
        "a rank's share is %lld elements but blocks are up to %lld (%s); a shard holds whole blocks, so the "
        "largest is %.2f%% over the mean",
        (long long)fair, (long long)gmax, ts[big].name, 100.0 * (p->imbalance - 1.0));
  } else if ((double)gmax > (double)fair * (1.0 + limit)) {
    snprintf(
        why, size,
        "its largest block (%s, %lld elements) exceeds the fair share of %lld elements per rank, and every "
        "rank's shard must hold a whole block",
        ts[big].name, (long long)gmax, (long long)fair);
  } else {
    /* tensors holding two shard boundaries force S to a multiple of their block */
    int64_t lb = p->bound_padded_elems / world, l = rf_plan_policy_align_elems(&c->policy);
    char names[256] = "";
    size_t k = 0;
    for (int i = 0; i < mu->n_tensors; i++) {
      if (ts[i].numel <= 2 * lb || ts[i].block_elems <= 1) continue;
      l = rf_lcm_i64_capped(l, ts[i].block_elems, (int64_t)1 << 60);
      if (k < sizeof names - 64 && !strstr(names, ts[i].name))
        k += (size_t)snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", ts[i].name);
    }
    snprintf(
        why, size,
        "tensors that span whole shards (%s) force the shard size to a multiple of the lcm of their blocks "
        "(%lld elements, fair share %lld); the best layout in %d buffer(s) pads %.2f%%",
        names[0] ? names : "none", (long long)l, (long long)fair, p->n_buffers,
        100.0 * rf_plan_cmd_ratio(p->padded_elems, p->elems));
  }
}

static void rf_plan_cmd_bytes(double bytes, char *out, size_t size) { rf_plan_bytes(bytes, 0, out, size); }

static void rf_plan_cmd_table(const struct rf_plan *c, const struct rf_plan_model_result *r) {
  int ragged = r->mode == RF_SHARD_MODE_RAGGED;
  int planned = c->policy.layout == RF_LAYOUT_PLANNED;
  fprintf(c->out, "\nworld %d, %s shards, %s layout%s\n", r->world, ragged ? "ragged" : "equal",
          c->args.layout,
          ragged || !planned
              ? ""
              : (c->max_buffers > 1 ? ", up to several buffers per unit" : ", one buffer per unit"));
  fprintf(c->out, "  %-10s %10s %12s %12s %16s %8s %9s\n", "layout", "padding", "lower bound", "cut blocks",
          "copy/step/rank", "buffers", "plan ms");
  char lb[32], copy_run[32];
  rf_plan_cmd_bytes((double)r->copy_bytes, copy_run, sizeof copy_run);
  if (ragged || !planned)
    snprintf(lb, sizeof lb, "-");
  else
    snprintf(lb, sizeof lb, "%.3f%%", 100.0 * rf_plan_cmd_ratio(r->bound_padded_elems, r->elems));
  fprintf(c->out, "  %-10s %9.3f%% %12s %12lld %16s %8d %9.2f\n", "rfsdp",
          100.0 * rf_plan_cmd_ratio(r->padded_elems, r->elems), lb, (long long)r->split_blocks, copy_run,
          r->n_buffers, r->plan_ms);
  for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) {
    const struct rf_plan_peer_stats *p = &r->peers[k];
    char copy[32];
    rf_plan_cmd_bytes((double)p->copy_elems * (double)c->elem_bytes, copy, sizeof copy);
    fprintf(c->out, "  %-10s %9.3f%% %12s %12lld %16s %8s %9s\n", rf_plan_peer_name((enum rf_plan_peer)k),
            100.0 * rf_plan_cmd_ratio(p->padded_elems, p->elems), "", (long long)p->split_blocks, copy, "",
            "");
  }
  double mean = (double)r->elems / r->world;
  fprintf(c->out, "  rfsdp: largest shard %lld elements per rank (%.4fx the mean)",
          (long long)r->max_shard_elems, (double)r->max_shard_elems / mean);
  if (ragged) fprintf(c->out, ", worst unit imbalance %.4f", r->imbalance);
  if (r->sub_padding_units)
    fprintf(c->out, ", padding between fused sub-tensors (experts) in %d unit(s)", r->sub_padding_units);
  fprintf(c->out, "\n");
}

/* The FP8 numbers of rfsdp's layout (k = 0) and the peers' (k = 1 + enum rf_plan_peer). */
static int rf_plan_cmd_fp8(const struct rf_plan *c, int world, struct rf_plan_fp8_stats *s) {
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    s[k] = (struct rf_plan_fp8_stats){0};
    for (int u = 0; u < c->model.n_units; u++)
      RF_TRY(rf_plan_fp8_add(&c->policy, k - 1, &c->units[u], world, &s[k]));
  }
  return 0;
}

/* Bytes a gather of the model moves in the run's own layout: codes and scales
 * (planned), else everything in the param dtype (fsdp2 and flat quantize after the
 * gather). */
static double rf_plan_cmd_fp8_run_bytes(const struct rf_plan *c, const struct rf_plan_fp8_stats *s) {
  if (c->policy.layout == RF_LAYOUT_PLANNED)
    return (double)rf_plan_fp8_gather_bytes(s, c->policy.param_dtype);
  return (double)s->padded_elems * (double)rf_dtype_size(c->policy.param_dtype);
}

static void rf_plan_cmd_fp8_table(const struct rf_plan *c, const struct rf_plan_fp8_stats *s) {
  fprintf(
      c->out,
      "  fp8 (e4m3, 128x128 tiles): %lld of %lld elements quantized in %lld tiles; others gathered in %s\n",
      (long long)s[0].q_elems, (long long)s[0].elems, (long long)s[0].tiles,
      rf_dtype_name(c->policy.param_dtype));
  fprintf(c->out, "  %-10s %12s %14s %14s %14s %8s %9s\n", "layout", "tiles cut", "gather fp8", "gather bf16",
          "gather f32", "fp8/f32", "fp8/bf16");
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    double f8 = (double)rf_plan_fp8_gather_bytes(&s[k], c->policy.param_dtype);
    double b16 = 2.0 * (double)s[k].padded_elems, f32 = 4.0 * (double)s[k].padded_elems;
    char a[32], b[32], d[32];
    rf_plan_cmd_bytes(f8, a, sizeof a);
    rf_plan_cmd_bytes(b16, b, sizeof b);
    rf_plan_cmd_bytes(f32, d, sizeof d);
    fprintf(c->out, "  %-10s %12lld %14s %14s %14s %8.4f %9.4f\n",
            k == 0 ? "rfsdp" : rf_plan_peer_name((enum rf_plan_peer)(k - 1)), (long long)s[k].cut_tiles, a, b,
            d, f8 / f32, f8 / b16);
  }
  if (c->policy.layout != RF_LAYOUT_PLANNED) {
    char a[32];
    rf_plan_cmd_bytes(rf_plan_cmd_fp8_run_bytes(c, &s[0]), a, sizeof a);
    fprintf(
        c->out,
        "  the %s layout cuts tiles: rfsdp train gathers its FP8 weights in %s (%s per gather of the model) "
        "and every rank quantizes each whole tensor after the gather\n",
        c->args.layout, rf_dtype_name(c->policy.param_dtype), a);
  }
}

static void rf_plan_cmd_fp8_json(const struct rf_plan *c, const struct rf_plan_fp8_stats *s, cJSON *o) {
  cJSON *f = cJSON_AddObjectToObject(o, "fp8");
  cJSON_AddNumberToObject(f, "quantized_elems", (double)s[0].q_elems);
  cJSON_AddNumberToObject(f, "tiles", (double)s[0].tiles);
  /* what the run sends: codes (planned), or the param dtype, quantized after the gather */
  cJSON_AddBoolToObject(f, "run_quantizes_after_gather", c->policy.layout != RF_LAYOUT_PLANNED);
  cJSON_AddNumberToObject(f, "run_gather_bytes", rf_plan_cmd_fp8_run_bytes(c, &s[0]));
  for (int k = 0; k <= RF_PLAN_PEER_COUNT; k++) {
    cJSON *x = cJSON_AddObjectToObject(f, k == 0 ? "rfsdp" : rf_plan_peer_name((enum rf_plan_peer)(k - 1)));
    cJSON_AddNumberToObject(x, "tiles_cut", (double)s[k].cut_tiles);
    cJSON_AddNumberToObject(x, "gather_bytes_fp8",
                            (double)rf_plan_fp8_gather_bytes(&s[k], c->policy.param_dtype));
    cJSON_AddNumberToObject(x, "gather_bytes_bf16", 2.0 * (double)s[k].padded_elems);
    cJSON_AddNumberToObject(x, "gather_bytes_f32", 4.0 * (double)s[k].padded_elems);
  }
}

static cJSON *rf_plan_cmd_shape(const int64_t *shape, int ndim) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

static void rf_plan_cmd_layout_json(const struct rf_plan *c, const struct rf_plan_model_result *r,
                                    cJSON *obj) {
  cJSON *bufs = cJSON_AddArrayToObject(obj, "buffers");
  for (int u = 0; u < r->n_units; u++) {
    const struct rf_model_unit *mu = &c->model.units[u];
    const struct rf_plan_tensor_in *ts = c->units[u].tensors;
    const struct rf_plan_unit *p = &r->units[u].plan;
    for (int b = 0; b < p->n_buffers; b++) {
      const struct rf_plan_buffer *buf = &p->buffers[b];
      cJSON *jb = cJSON_CreateObject();
      char name[300];
      snprintf(name, sizeof name, "%s/%d", mu->name, b);
      cJSON_AddStringToObject(jb, "unit", mu->name);
      cJSON_AddStringToObject(jb, "name", name);
      cJSON_AddNumberToObject(jb, "total_elems", (double)buf->total_elems);
      if (p->mode == RF_SHARD_MODE_EQUAL) {
        cJSON_AddNumberToObject(jb, "shard_elems", (double)buf->shard_elems);
      } else {
        cJSON *st = cJSON_AddArrayToObject(jb, "shard_starts");
        for (int k = 0; k <= p->world; k++)
          cJSON_AddItemToArray(st, cJSON_CreateNumber((double)buf->starts[k]));
      }
      cJSON *jt = cJSON_AddArrayToObject(jb, "tensors");
      for (int q = 0; q < buf->n_places; q++) {
        const struct rf_plan_place *pl = &buf->places[q];
        const struct rf_plan_tensor_in *t = &ts[pl->tensor];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", t->name);
        cJSON_AddItemToObject(x, "shape", rf_plan_cmd_shape(t->shape, t->ndim));
        cJSON_AddNumberToObject(x, "block_elems", (double)rf_min_i64(t->block_elems, t->numel));
        cJSON_AddNumberToObject(x, "offset", (double)pl->offset);
        if (t->sub_count > 1) {
          cJSON_AddNumberToObject(x, "sub_first", (double)pl->sub_first);
          cJSON_AddNumberToObject(x, "sub_count", (double)pl->sub_n);
          cJSON_AddNumberToObject(x, "sub_stride", (double)pl->sub_stride);
        }
        cJSON_AddItemToArray(jt, x);
      }
      cJSON_AddItemToArray(bufs, jb);
    }
  }
}

static char *rf_plan_cmd_json(const struct rf_plan *c, const struct rf_plan_model_result *r, double limit,
                              int meets, int suggest, const struct rf_sim_result *sim,
                              const struct rf_plan_fp8_stats *fp8) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "model", c->model_path);
  cJSON_AddNumberToObject(o, "world", r->world * c->sim.replicate);
  cJSON_AddStringToObject(o, "layout", c->args.layout);
  cJSON_AddStringToObject(o, "shard", r->mode == RF_SHARD_MODE_RAGGED ? "ragged" : "equal");
  cJSON_AddStringToObject(o, "optim", c->args.optim);
  cJSON_AddNumberToObject(o, "block_rows", (double)c->policy.block_rows);
  cJSON_AddNumberToObject(o, "vector_block", (double)c->policy.vector_block);
  cJSON_AddStringToObject(o, "param_dtype", rf_dtype_name(c->policy.param_dtype));
  cJSON_AddStringToObject(o, "reduce_dtype", rf_dtype_name(c->policy.reduce_dtype));
  cJSON_AddNumberToObject(o, "align_bytes", (double)c->align_bytes);
  cJSON_AddNumberToObject(o, "elems", (double)r->elems);
  cJSON_AddNumberToObject(o, "padded_elems", (double)r->padded_elems);
  cJSON_AddNumberToObject(o, "lower_bound_ratio", rf_plan_cmd_ratio(r->bound_padded_elems, r->elems));
  cJSON_AddNumberToObject(o, "imbalance", r->imbalance);
  cJSON_AddNumberToObject(o, "plan_ms", r->plan_ms);
  cJSON_AddNumberToObject(o, "sub_padding_units", r->sub_padding_units);
  /* what the train log's "plan" object holds too (tools/train_report.c) */
  cJSON_AddNumberToObject(o, "padding_ratio", rf_plan_cmd_ratio(r->padded_elems, r->elems));
  cJSON_AddNumberToObject(o, "buffer_count", r->n_buffers);
  cJSON_AddNumberToObject(o, "max_shard_elems", (double)r->max_shard_elems);
  cJSON_AddNumberToObject(o, "split_blocks", (double)r->split_blocks);
  cJSON_AddNumberToObject(o, "copy_bytes_per_step", (double)r->copy_bytes);
  if (limit >= 0) {
    cJSON_AddBoolToObject(o, "max_padding_met", meets);
    if (!meets) cJSON_AddNumberToObject(o, "suggested_group", suggest);
  }
  cJSON *peers = cJSON_AddObjectToObject(o, "peers");
  for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) {
    const struct rf_plan_peer_stats *p = &r->peers[k];
    cJSON *x = cJSON_AddObjectToObject(peers, rf_plan_peer_name((enum rf_plan_peer)k));
    cJSON_AddNumberToObject(x, "padding_ratio", rf_plan_cmd_ratio(p->padded_elems, p->elems));
    cJSON_AddNumberToObject(x, "padded_elems", (double)p->padded_elems);
    cJSON_AddNumberToObject(x, "split_blocks", (double)p->split_blocks);
    cJSON_AddNumberToObject(x, "copy_bytes_per_step", (double)p->copy_elems * (double)c->elem_bytes);
  }
  if (sim) rf_plan_sim_json(&c->sim, &c->sim_model, sim, o);
  if (fp8) rf_plan_cmd_fp8_json(c, fp8, o);
  if (c->buffers) rf_plan_cmd_layout_json(c, r, o);
  char *text = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  if (!text) RF_DIE("out of memory");
  return text;
}

static void rf_plan_cmd_layout_text(const struct rf_plan *c, const struct rf_plan_model_result *r) {
  for (int u = 0; u < r->n_units; u++) {
    const struct rf_model_unit *mu = &c->model.units[u];
    const struct rf_plan_tensor_in *ts = c->units[u].tensors;
    const struct rf_plan_unit *p = &r->units[u].plan;
    for (int b = 0; b < p->n_buffers; b++) {
      const struct rf_plan_buffer *buf = &p->buffers[b];
      fprintf(c->out, "  buffer %s/%d: %lld elements, %s %lld\n", mu->name, b, (long long)buf->total_elems,
              p->mode == RF_SHARD_MODE_EQUAL ? "shard" : "largest shard", (long long)buf->shard_elems);
      for (int q = 0; q < buf->n_places; q++) {
        const struct rf_plan_place *pl = &buf->places[q];
        const struct rf_plan_tensor_in *t = &ts[pl->tensor];
        fprintf(c->out, "    %12lld  %s [", (long long)pl->offset, t->name);
        for (int d = 0; d < t->ndim; d++) fprintf(c->out, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        fprintf(c->out, "] block %lld", (long long)rf_min_i64(t->block_elems, t->numel));
        if (t->sub_count > 1 && pl->sub_n != t->sub_count)
          fprintf(c->out, " sub-tensors %lld..%lld stride %lld", (long long)pl->sub_first,
                  (long long)(pl->sub_first + pl->sub_n - 1), (long long)pl->sub_stride);
        fprintf(c->out, "\n");
      }
    }
  }
}

/* The plan at `world`: its JSON into *json when json is not NULL, else the tables to c->out. */
static int rf_plan_cmd_world(struct rf_plan *c, int world, char **json) {
  struct rf_plan_model_result r;
  struct rf_sim_result sim;
  RF_TRY(rf_plan_sim_mesh(&c->sim, &c->sim_model, c->units, c->model.n_units, &c->policy, world, c->optim,
                          c->max_padding));
  /* the layout the runtime runs: the shard group's (every replica the same) */
  RF_TRY(rf_plan_model_make(c->units, c->model.n_units, &c->policy, world / c->sim.replicate, 1, &r));
  if (c->sim.batch > 0 &&
      rf_plan_sim_world(&c->sim, &c->sim_model, c->units, &r, &c->policy, world, c->optim, &sim) != 0) {
    rf_plan_model_result_free(&r);
    return -1;
  }
  RF_ASSERT(c->policy.layout != RF_LAYOUT_PLANNED || r.split_blocks == 0); /* the checker passed every unit */
  struct rf_plan_fp8_stats fp8[RF_PLAN_PEER_COUNT + 1];
  if (c->policy.fp8 && rf_plan_cmd_fp8(c, world / c->sim.replicate, fp8) != 0) {
    rf_plan_model_result_free(&r);
    return -1;
  }
  double limit = c->max_padding / 100.0;
  int meets = 1, suggest = 0;
  if (c->max_padding >= 0) {
    meets = rf_plan_model_meets(&r, limit);
    if (!meets) suggest = rf_plan_advise_group(c->units, c->model.n_units, &c->policy, world, 1, limit);
    if (suggest < 0) suggest = 0; /* a smaller group that cannot be laid out ends the search */
  }
  if (json) {
    *json = rf_plan_cmd_json(c, &r, c->max_padding >= 0 ? limit : -1, meets, suggest,
                             c->sim.batch > 0 ? &sim : NULL, c->policy.fp8 ? fp8 : NULL);
  } else {
    rf_plan_cmd_table(c, &r);
    if (c->policy.fp8) rf_plan_cmd_fp8_table(c, fp8);
    if (c->sim.batch > 0) rf_plan_sim_print(&c->sim, &c->sim_model, &sim, c->out);
    if (c->buffers) rf_plan_cmd_layout_text(c, &r);
    if (c->max_padding >= 0) {
      const char *what = r.mode == RF_SHARD_MODE_RAGGED ? "imbalance" : "padding";
      if (meets) fprintf(c->out, "  every unit's %s is at most %.3g%%\n", what, c->max_padding);
      /* one line per kind of unit (same tensor count and padding), then a count of the rest */
      int shown = 0, over = 0, kinds_n[8];
      double kinds_x[8];
      for (int u = 0; u < r.n_units && !meets; u++) {
        double x = rf_plan_unit_excess(&r.units[u].plan);
        if (x <= limit) continue;
        over++;
        int k = 0;
        while (k < shown && !(kinds_n[k] == c->model.units[u].n_tensors && kinds_x[k] == x)) k++;
        if (k < shown || shown == 8) continue;
        kinds_n[shown] = c->model.units[u].n_tensors, kinds_x[shown] = x, shown++;
        char why[640];
        rf_plan_cmd_why(c, world, u, &r.units[u].plan, limit, why, sizeof why);
        fprintf(c->out, "  unit %s: %s %.3f%% > %.3g%%: %s\n", c->model.units[u].name, what, 100.0 * x,
                c->max_padding, why);
      }
      if (over > shown) fprintf(c->out, "  ... and %d more unit(s) of the same kinds\n", over - shown);
      if (!meets && suggest)
        fprintf(c->out,
                "  suggestion: FSDP groups of %d ranks meet %.3g%%; run HSDP with %d replicas (--world %d)\n",
                suggest, c->max_padding, world / suggest, suggest);
      else if (!meets)
        fprintf(c->out, "  no FSDP group size dividing %d meets %.3g%%\n", world, c->max_padding);
    }
  }
  rf_plan_model_result_free(&r);
  return 0;
}

/* The request's own mistakes (rf_plan_create's 2), before anything is read but the profile. */
static int rf_plan_check_request(struct rf_plan *c, const struct rf_plan_request *r, const int *worlds, int n,
                                 struct rf_fsdp_options *fo, int setup) {
  for (int i = 0; i < n; i++)
    RF_REQUIRE(worlds[i] >= 1 && worlds[i] <= RF_PLAN_MAX_WORLD, "--world %d: world sizes are 1..%d",
               worlds[i], RF_PLAN_MAX_WORLD);
  rf_fsdp_options_default(fo);
  RF_TRY(rf_plan_request_fsdp_options(r, fo));
  RF_TRY(rf_optim_kind_parse(r->optim, &c->optim));
  RF_REQUIRE(rf_plan_choice(r->compute_dtype, "f32|bf16"), "--compute-dtype: '%s' is not one of f32|bf16",
             r->compute_dtype ? r->compute_dtype : "(none)");
  RF_REQUIRE(r->replicate && r->network, "--replicate and --network: none given");
  RF_REQUIRE(
      r->batch >= 0 && r->seq >= 1 && r->accum >= 1 && r->prefetch >= 0 && r->rank >= -1 &&
          r->memory_per_rank >= 0 && r->peak_gflops >= 0 && r->efficiency >= 0 && r->efficiency <= 1,
      "the step's options out of range: --batch %lld >= 0, --seq %lld >= 1, --accum %d >= 1, --prefetch "
      "%d >= 0, --rank %d >= -1, --memory-per-rank %g >= 0, --peak-gflops %g >= 0, --efficiency %g in "
      "[0, 1]",
      (long long)r->batch, (long long)r->seq, r->accum, r->prefetch, r->rank, r->memory_per_rank,
      r->peak_gflops, r->efficiency);
  /* what rfsdp train refuses, refused alike: the batch at every W */
  for (int i = 0; i < n && r->batch > 0; i++) RF_TRY(rf_plan_check_batch(worlds[i], r->batch, r->accum));
  /* the profile, read before the model: a bad file is an option's mistake */
  struct rf_sim_network net;
  int have_net = 0;
  if (setup || strcmp(r->network, "here") != 0) {
    RF_TRY(rf_sim_network_load(r->network, &net));
    have_net = 1;
  }
  /* --replicate at every W, its limits, --rank, --seq: before the model is read */
  RF_TRY(rf_plan_sim_check(&c->sim, have_net ? &net : NULL, c->max_padding, worlds, n));
  RF_REQUIRE(
      c->align_bytes >= 4 && (c->align_bytes & (c->align_bytes - 1)) == 0 && c->align_bytes <= (1 << 20),
      "--align-bytes must be a power of two from 4 to 1 MiB (got %lld)", (long long)c->align_bytes);
  RF_REQUIRE(c->max_buffers >= 1 && c->max_buffers <= 8, "--max-buffers must be 1..8 (got %d)",
             c->max_buffers);
  RF_REQUIRE(
      !c->buffers || fo->layout != RF_LAYOUT_FSDP2,
      "--buffers lists the buffers of the planned and flat layouts; --layout fsdp2 keeps each tensor's own "
      "rows per rank");
  return 0;
}

int rf_plan_create(struct rf_plan **out, const struct rf_plan_request *r, const int *worlds, int n) {
  RF_REQUIRE(out && r && worlds && n >= 1, "rf_plan_create: no output, request or world size");
  *out = NULL;
  if (!r->model) {
    rf_error_set(__FILE__, __LINE__, "--model: no model given");
    return 2;
  }
  struct rf_plan *c = rf_xcalloc(1, sizeof *c);
  c->model_path = r->model;
  c->args = (struct rf_plan_args){r->layout, r->shard, r->optim, r->param_dtype, r->reduce_dtype};
  c->align_bytes = r->align_bytes;
  c->max_buffers = r->max_buffers;
  c->max_padding = r->max_padding;
  c->buffers = r->buffers;
  c->sim = (struct rf_plan_sim_args){.batch = r->batch,
                                     .seq = r->seq,
                                     .accum = r->accum,
                                     .prefetch = r->prefetch,
                                     .no_reshard = r->no_reshard,
                                     .replicate = 1,
                                     .rank = r->rank,
                                     .mesh = r->replicate,
                                     .compute_dtype = r->compute_dtype,
                                     .network = r->network,
                                     .peak_gflops = r->peak_gflops,
                                     .efficiency = r->efficiency,
                                     .memory_per_rank = r->memory_per_rank};
  struct rf_fsdp_options fo;
  int setup = r->batch > 0 || (r->replicate && strcmp(r->replicate, "node") == 0);
  if (rf_plan_check_request(c, r, worlds, n, &fo, setup) != 0) {
    free(c);
    return 2;
  }
  fo.align_bytes = c->align_bytes;
  fo.max_buffers = c->max_buffers;
  rf_fsdp_plan_policy(&fo, &c->policy);
  c->elem_bytes = rf_dtype_size(c->policy.param_dtype);
  if (rf_model_desc_load(c->model_path, &c->model) != 0) {
    free(c);
    return -1;
  }
  c->units = rf_model_desc_plan_units(&c->model, &c->policy);
  /* the step's numbers, and the network's nodes for --replicate node */
  c->have_sim_model = setup;
  if (setup && rf_plan_sim_setup(&c->sim, c->model_path, &c->model, &c->sim_model) != 0) {
    rf_plan_free(c);
    return -1;
  }
  if (r->batch > 0 && c->sim_model.have_config &&
      rf_plan_check_seq(c->sim.seq, c->sim_model.cfg.max_position_embeddings, c->model_path) != 0) {
    rf_plan_free(c);
    return 2;
  }
  *out = c;
  return 0;
}

void rf_plan_free(struct rf_plan *p) {
  if (!p) return;
  rf_plan_sim_model_free(&p->sim_model);
  free(p->units);
  rf_model_desc_free(&p->model);
  free(p);
}

void rf_plan_print_banner(const struct rf_plan *c, FILE *out) {
  if (!c || !out) return;
  fprintf(
      out,
      "rfsdp plan: %s (%s, %lld parameters, %d units, %d tensors), %s layout, optim %s, params %s, reduce "
      "%s, %lld-row blocks, %lld-byte alignment\n",
      c->model_path, c->model.model_type, (long long)c->model.numel, c->model.n_units, c->model.n_tensors,
      c->args.layout, c->args.optim, c->args.param_dtype, c->args.reduce_dtype,
      (long long)c->policy.block_rows, (long long)c->align_bytes);
}

int rf_plan_print(struct rf_plan *p, int world, int json, FILE *out) {
  RF_REQUIRE(p && out && world >= 1 && world <= RF_PLAN_MAX_WORLD,
             "rf_plan_print: no plan or file, or world %d", world);
  if (!json) {
    p->out = out;
    return rf_plan_cmd_world(p, world, NULL);
  }
  char *text = rf_plan_json(p, world);
  if (!text) return -1;
  fprintf(out, "%s\n", text);
  rf_plan_free_json(text);
  return 0;
}

char *rf_plan_json(struct rf_plan *p, int world) {
  if (!p || world < 1 || world > RF_PLAN_MAX_WORLD) {
    rf_error_set(__FILE__, __LINE__, "rf_plan_json: no plan, or world %d", world);
    return NULL;
  }
  char *text = NULL;
  return rf_plan_cmd_world(p, world, &text) == 0 ? text : NULL;
}

void rf_plan_free_json(char *json) { free(json); }

int rf_plan_group(struct rf_plan *p, int world, int *group) {
  RF_REQUIRE(p && group && world >= 1 && world <= RF_PLAN_MAX_WORLD,
             "rf_plan_group: no plan or output, or world %d", world);
  struct rf_plan_sim_args a = p->sim;
  RF_TRY(rf_plan_sim_mesh(&a, &p->sim_model, p->units, p->model.n_units, &p->policy, world, p->optim,
                          p->max_padding));
  *group = world / a.replicate;
  return 0;
}
