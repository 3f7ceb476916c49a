/* `rfsdp plan --batch`: the model's side of a simulated step and its output. */
#include "plan_sim.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/core.h"
#include "model/train.h"
#include "plan_check.h"
#include "rfsdp_optim.h"

const char *rf_plan_sim_network_help(void) {
  static _Thread_local char help[1200];
  snprintf(help, sizeof help, "machine profile: %s, or FILE.json", rf_sim_network_names());
  return help;
}

/* Routed experts per token from the config's num_experts_per_tok (0 when absent). */
static int rf_plan_sim_experts_per_token(const char *path) {
  char *text = NULL;
  size_t n = 0;
  if (rf_file_read_all(path, &text, &n) != 0) return 0;
  cJSON *root = rf_model_json_parse(text, n, path);
  const cJSON *k = cJSON_GetObjectItemCaseSensitive(root, "num_experts_per_tok");
  int out = cJSON_IsNumber(k) && k->valuedouble >= 1 ? (int)k->valuedouble : 0;
  cJSON_Delete(root);
  free(text);
  return out;
}

/* Matmul weights of experts a token does not meet: a fused tensor of E experts
 * (sub_count) or DeepSeek's routed experts (one tensor per expert), k of E
 * active. A trainable MoE family's own count (rf_model_n_matmul_params) already
 * holds only the active experts: nothing to take off there. */
static double rf_plan_sim_inactive_elems(const struct rf_model_desc *d, const struct rf_model_config *cfg,
                                         int k) {
  double inactive = 0;
  if (rf_model_config_is_moe(cfg)) return 0;
  int routed = cfg->family == RF_MODEL_FAMILY_DEEPSEEK_V3 ? cfg->deepseek_v3.n_routed_experts : 0;
  for (int u = 0; u < d->n_units; u++)
    for (int i = 0; i < d->units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &d->units[u].tensors[i];
      if (!t->decay) continue;
      int64_t experts =
          t->sub_count > 1 ? t->sub_count : (routed && strstr(t->name, ".mlp.experts.") ? routed : 1);
      if (experts > 1 && k < experts) inactive += (double)t->numel * (1.0 - (double)k / (double)experts);
    }
  return inactive;
}

int rf_plan_sim_setup(const struct rf_plan_sim_args *a, const char *model_path,
                      const struct rf_model_desc *desc, struct rf_plan_sim_model *out) {
  memset(out, 0, sizeof *out);
  RF_TRY(rf_sim_network_load(a->network, &out->net));
  if (a->peak_gflops > 0) out->net.peak_gflops = out->net.peak_gflops_f32 = a->peak_gflops;
  if (a->efficiency > 0) out->net.efficiency = a->efficiency;
  out->desc = desc;
  if (strcmp(desc->model_type, "generic") == 0) {
    out->flops_per_token = 6.0 * (double)desc->numel;
    return 0;
  }
  RF_TRY(rf_model_config_read(&out->cfg, model_path));
  if (out->cfg.head_dim == 0) out->cfg.head_dim = out->cfg.hidden_size / out->cfg.num_attention_heads;
  RF_REQUIRE(a->seq <= (1 << 24), "--seq %lld is too long", (long long)a->seq);
  out->have_config = 1;
  out->experts_per_token = rf_plan_sim_experts_per_token(model_path);
  out->flops_per_token = rf_model_flops_per_token(&out->cfg, (int)a->seq) -
                         6.0 * rf_plan_sim_inactive_elems(desc, &out->cfg, out->experts_per_token);
  return 0;
}

/* The trainer's workspace of one micro-batch of `micro` sequences: every layer's
 * activations kept (f32), the bf16 compute staging and FP8 block's staging
 * (rf_model_ws_bytes, rf_model_ws_compute_bytes, rf_model_ws_fp8_bytes), its
 * per-thread scratch for the threads a rank of `world` runs (rf_train_threads:
 * the ranks on one node of the profile share this machine's cores, as train sets them). */
static int64_t rf_plan_sim_activations(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                                       const struct rf_plan_policy *p, int micro, int world) {
  enum rf_dtype compute = strcmp(a->compute_dtype, "bf16") == 0 ? RF_DTYPE_BF16 : RF_DTYPE_F32;
  int per_node =
      sm->net.ranks_per_node > 0 && sm->net.ranks_per_node < world ? sm->net.ranks_per_node : world;
  int threads = omp_get_max_threads();
  omp_set_num_threads(rf_train_threads(per_node));
  size_t bytes = rf_model_ws_bytes(&sm->cfg, micro, (int)a->seq) +
                 rf_model_ws_compute_bytes(&sm->cfg, micro, (int)a->seq, compute) +
                 (p->fp8 ? rf_model_ws_fp8_bytes(&sm->cfg, micro, (int)a->seq) : 0);
  omp_set_num_threads(threads);
  return (int64_t)bytes;
}

int rf_plan_sim_world(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                      const struct rf_plan_unit_in *units, const struct rf_plan_model_result *m,
                      const struct rf_plan_policy *p, int world, enum rf_optim_kind optim,
                      struct rf_sim_result *out) {
  int64_t micro = rf_max_i64(rf_ceil_div(a->batch, (int64_t)world * a->accum), 1); /* sequences per rank */
  /* the optimizer's groups: the description's flags, when it describes these units */
  int n_tensors = 0, described = sm->desc && sm->desc->n_units == m->n_units;
  for (int u = 0; u < m->n_units; u++) {
    n_tensors += units[u].n_tensors;
    described = described && sm->desc->units[u].n_tensors == units[u].n_tensors;
  }
  int *flags = rf_xcalloc((size_t)rf_max_i64(n_tensors, 1), sizeof *flags);
  for (int u = 0, k = 0; described && u < m->n_units; u++)
    for (int i = 0; i < units[u].n_tensors; i++, k++) {
      const struct rf_model_tensor *mt = &sm->desc->units[u].tensors[i];
      flags[k] = (mt->decay ? RF_OPTIM_FLAG_DECAY : 0) | (mt->matrix ? RF_OPTIM_FLAG_MATRIX : 0);
    }
  struct rf_sim_options o = {
      .replicate = a->replicate,
      .rank = a->rank,
      .flags = flags,
      .prefetch = a->prefetch,
      .reshard_after_forward = !a->no_reshard,
      .accum = a->accum,
      .tokens_per_rank = (double)a->batch * (double)a->seq / world,
      .flops_per_token = sm->flops_per_token,
      .f32_compute = strcmp(a->compute_dtype, "f32") == 0,
      /* the trainer's workspace of one micro-batch */
      .activation_bytes =
          sm->have_config ? rf_plan_sim_activations(a, sm, p, (int)rf_min_i64(micro, 1 << 20), world) : 0,
      /* the trainer's loss (f64) and its end-of-step agreement (i32) on the world; a
       * trainable MoE with its load-balancing loss sums 2E + 1 router statistics (f64)
       * over the world per micro-batch (tools/train_model.c) */
      .scalar_reduce_bytes =
          8 + 4 +
          (sm->have_config && rf_model_config_is_moe(&sm->cfg) && sm->cfg.moe.output_router_logits
               ? (int64_t)a->accum * (2 * sm->cfg.moe.num_local_experts + 1) * 8
               : 0),
      .net = sm->net,
  };
  rf_optim_options_default(&o.optim);
  o.optim.kind = optim;
  int rc = rf_sim_step(units, m, p, &o, out);
  free(flags);
  return rc;
}

int rf_plan_sim_auto_group(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                           const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                           int world, enum rf_optim_kind optim, double max_padding, double memory_gb,
                           int *group) {
  if (memory_gb <= 0) {
    int g = rf_plan_advise_group(units, n_units, p, world, 0, max_padding / 100.0);
    if (g < 0) return -1;
    RF_REQUIRE(g > 0, "--replicate auto: no shard group size dividing %d meets --max-padding %g%%", world,
               max_padding);
    *group = g;
    return 0;
  }
  struct rf_plan_sim_args sa = *a;
  int64_t least = -1;
  int least_group = 0;
  for (int s = 1; s <= world; s++) {
    if (world % s) continue;
    struct rf_plan_model_result m;
    struct rf_sim_result r;
    RF_TRY(rf_plan_model_make(units, n_units, p, s, 0, &m));
    int padding_ok = max_padding < 0 || rf_plan_model_meets(&m, max_padding / 100.0);
    sa.replicate = world / s;
    int rc = rf_plan_sim_world(&sa, sm, units, &m, p, world, optim, &r);
    rf_plan_model_result_free(&m);
    RF_TRY(rc);
    if (!padding_ok) continue;
    if ((double)r.mem.total <= memory_gb * 1e9) {
      *group = s;
      return 0;
    }
    if (least < 0 || r.mem.total < least) least = r.mem.total, least_group = s;
  }
  if (least < 0)
    RF_FAIL("--replicate auto: no shard group size dividing %d meets --max-padding %g%%", world, max_padding);
  RF_FAIL(
      "--replicate auto: no shard group size dividing %d fits --memory-per-rank %g GB%s: the least is %.4g "
      "GB "
      "per rank, in groups of %d",
      world, memory_gb, max_padding >= 0 ? " under --max-padding" : "", (double)least / 1e9, least_group);
}

int rf_plan_sim_mesh(struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                     const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                     int world, enum rf_optim_kind optim, double max_padding) {
  int group = 0;
  RF_REQUIRE(a->memory_per_rank <= 0 || strcmp(a->mesh, "auto") == 0,
             "--memory-per-rank chooses the shard group of --replicate auto (got --replicate %s)", a->mesh);
  int replicate = 0;
  RF_TRY(rf_comm_mesh_parse(a->mesh, world, &replicate)); /* the parser rfsdp train uses */
  if (replicate == RF_COMM_MESH_NODE) {
    int per_node = sm->net.ranks_per_node;
    group = per_node > 0 && per_node < world ? per_node : world;
    RF_REQUIRE(
        world % group == 0,
        "--replicate node: the %d ranks do not fill nodes of %d ranks (network %s): give --replicate R",
        world, group, sm->net.name);
  } else if (replicate == RF_COMM_MESH_AUTO) {
    RF_REQUIRE(
        max_padding >= 0 || a->memory_per_rank > 0,
        "--replicate auto picks the shard group size by the planner's padding or the simulated memory: "
        "give --max-padding PERCENT, --memory-per-rank GB, or both");
    RF_REQUIRE(a->memory_per_rank <= 0 || a->batch > 0,
               "--memory-per-rank compares the simulated memory of a step: give --batch");
    RF_TRY(rf_plan_sim_auto_group(a, sm, units, n_units, p, world, optim, max_padding, a->memory_per_rank,
                                  &group));
  } else {
    group = world / replicate;
  }
  RF_ASSERT(group >= 1 && world % group == 0);
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
