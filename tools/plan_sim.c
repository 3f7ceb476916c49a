/* `rfsdp plan --batch`: the model's side of a simulated step and its output. */
#include "plan_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan_check.h"
#include "rfsdp_optim.h"

const char *rf_plan_sim_network_help(void) {
  static _Thread_local char help[1200];
  snprintf(help, sizeof help, "machine profile: %s, or FILE.json", rf_sim_network_names());
  return help;
}

int rf_plan_sim_setup(const struct rf_plan_sim_args *a, const char *model_path,
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

void rf_plan_sim_model_free(struct rf_plan_sim_model *sm) {
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

int rf_plan_sim_check(const struct rf_plan_sim_args *a, const struct rf_sim_network *net, double max_padding,
                      const int *worlds, int n) {
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
    RF_TRY(rf_plan_args_replicate(a->mesh, world, &replicate));
    int group = replicate >= 1 ? world / replicate : world; /* auto: at most W */
    if (replicate == RF_PLAN_ARGS_MESH_NODE) {
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

int rf_plan_sim_world(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                      const struct rf_plan_unit_in *units, const struct rf_plan_model_result *m,
                      const struct rf_plan_policy *p, int world, enum rf_optim_kind optim,
                      struct rf_sim_result *out) {
  struct rf_plan_sim_act act;
  struct rf_sim_workload w;
  rf_plan_sim_workload(a, sm, p, optim, &act, &w);
  return rf_sim_run_world(&w, units, m, p, world, a->replicate, out);
}

int rf_plan_sim_auto_group(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                           const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                           int world, enum rf_optim_kind optim, double max_padding, double memory_gb,
                           int *group) {
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

int rf_plan_sim_mesh(struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                     const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                     int world, enum rf_optim_kind optim, double max_padding) {
  int group = 0;
  int replicate = 0;
  RF_TRY(rf_plan_args_replicate(a->mesh, world, &replicate)); /* the parser rfsdp train uses */
  if (replicate == RF_PLAN_ARGS_MESH_NODE) {
    group = rf_sim_node_group(&sm->net, world); /* that it divides W: rf_plan_sim_check */
  } else if (replicate == RF_PLAN_ARGS_MESH_AUTO) {
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

static void rf_plan_sim_bytes(double bytes, char *out, size_t size) {
  if (bytes >= 1e9)
    snprintf(out, size, "%.2f GB", bytes / 1e9);
  else if (bytes >= 1e6)
    snprintf(out, size, "%.2f MB", bytes / 1e6);
  else if (bytes >= 1e3)
    snprintf(out, size, "%.1f kB", bytes / 1e3);
  else
    snprintf(out, size, "%.0f B", bytes);
}

/* 1 when the profile puts more ranks on a node than it has cores and the run spans
 * nodes: there the measured costs come in scheduler slices (docs/scale.md, Across hosts). */
static int rf_plan_sim_oversubscribed(const struct rf_plan_sim_model *sm, const struct rf_sim_result *r) {
  return sm->net.ranks_per_node > sm->net.cores_per_node && r->world > sm->net.ranks_per_node;
}

void rf_plan_sim_print(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                       const struct rf_sim_result *r) {
  char t[7][32];
  const struct rf_sim_memory *m = &r->mem;
  printf("  simulated step: W = %d = %d x %d, batch %lld x %lld tokens, %d micro-batch(es), network %s\n",
         r->world, r->replicate, r->shard_world, (long long)a->batch, (long long)a->seq, a->accum,
         sm->net.name);
  rf_plan_sim_bytes((double)m->total, t[0], sizeof t[0]);
  rf_plan_sim_bytes((double)m->params, t[1], sizeof t[1]);
  rf_plan_sim_bytes((double)m->grads, t[2], sizeof t[2]);
  rf_plan_sim_bytes((double)m->optim, t[3], sizeof t[3]);
  rf_plan_sim_bytes((double)m->gathered, t[4], sizeof t[4]);
  rf_plan_sim_bytes((double)m->activations, t[5], sizeof t[5]);
  rf_plan_sim_bytes((double)m->optim_workspace, t[6], sizeof t[6]);
  printf(
      "    memory per rank  %s = params %s + grads %s + optimizer %s (+ workspace %s) + gathered %s + "
      "activations %s%s\n",
      t[0], t[1], t[2], t[3], t[6], t[4], t[5], sm->have_config ? "" : " (no config: not estimated)");
  rf_plan_sim_bytes((double)r->bytes_intra, t[0], sizeof t[0]);
  rf_plan_sim_bytes((double)r->bytes_inter, t[1], sizeof t[1]);
  rf_plan_sim_bytes((double)r->gather_bytes, t[2], sizeof t[2]);
  rf_plan_sim_bytes((double)r->reduce_bytes, t[3], sizeof t[3]);
  rf_plan_sim_bytes((double)r->alltoall_bytes, t[4], sizeof t[4]);
  printf(
      "    bytes per step   inside groups %s, across groups %s (all-gathers %s, reductions %s, matrix "
      "owners' "
      "all-to-all %s)\n",
      t[0], t[1], t[2], t[3], t[4]);
  printf(
      "    step time        %.2f ms = compute %.2f + exposed communication %.2f + optimizer %.2f + "
      "copies %.2f (communication alone %.2f; %.4g GFLOP per token at %.4g GFLOP/s x %.2f, time share "
      "%.2f)\n",
      r->step_ms, r->compute_ms, r->exposed_comm_ms, r->optim_ms, r->copy_ms, r->comm_ms,
      sm->flops_per_token * 1e-9, r->peak_gflops, sm->net.efficiency, r->time_share);
  if (rf_plan_sim_oversubscribed(sm, r))
    printf(
        "    warning          %d ranks per node on %d core(s) across nodes: a rank waiting in a collective "
        "spins on the core its peers need, costs come in scheduler slices, not alpha + bytes / busbw; this "
        "time assumes an even share (docs/scale.md, Across hosts)\n",
        sm->net.ranks_per_node, sm->net.cores_per_node);
}

void rf_plan_sim_json(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
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
