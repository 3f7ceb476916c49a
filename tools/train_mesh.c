/* rfsdp train's mesh: --replicate R | node | auto into a shard group and a
 * replicate group (tools/train_mesh.h). */
#include "train_mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"
#include "plan/plan.h"
#include "plan_sim.h"
#include "train.h"

int rf_train_mesh_parse(const struct rf_train_args *a, int world, int *replicate) {
  const char *text = a->replicate;
  int limits = a->max_padding >= 0 || a->memory_per_rank > 0;
  RF_REQUIRE(
      !limits || strcmp(text, "auto") == 0,
      "--max-padding and --memory-per-rank choose the shard group of --replicate auto (got --replicate %s)",
      text);
  int rc = rf_plan_args_replicate(text, world, replicate);
  RF_REQUIRE(rc != 0 || *replicate != RF_PLAN_ARGS_MESH_AUTO || limits,
             "--replicate auto picks the shard group size by the planner's padding or the simulated memory: "
             "give --max-padding PERCENT, --memory-per-rank GB, or both");
  return rc;
}

/* --replicate auto: the shard group by the planner's padding or the simulated
 * memory per rank (rf_plan_sim_auto_group, as rfsdp plan --replicate auto). */
static int rf_train_mesh_auto(const struct rf_train_args *a, int world, const struct rf_model_config *cfg,
                              const struct rf_fsdp_options *o, int *group) {
  struct rf_model_desc desc;
  struct rf_plan_policy policy;
  rf_model_desc_make(cfg, &desc);
  rf_fsdp_plan_policy(o, &policy);
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&desc, &policy);
  struct rf_plan_sim_args sa = RF_PLAN_SIM_ARGS_DEFAULT;
  sa.batch = a->batch;
  sa.seq = a->seq;
  sa.accum = a->accum;
  sa.prefetch = a->prefetch;
  sa.no_reshard = a->no_reshard;
  sa.compute_dtype = a->compute_dtype;
  struct rf_plan_sim_model sm = {0};
  enum rf_optim_kind kind = RF_OPTIM_KIND_ADAMW;
  int rc = a->memory_per_rank > 0 ? rf_plan_sim_setup(&sa, a->model, &desc, &sm) : 0;
  if (rc == 0 && a->memory_per_rank > 0) rc = rf_optim_kind_parse(a->plan.optim, &kind);
  if (rc == 0)
    rc = rf_plan_sim_auto_group(&sa, &sm, units, desc.n_units, &policy, world, kind, a->max_padding,
                                a->memory_per_rank, group);
  rf_plan_sim_model_free(&sm);
  free(units);
  rf_model_desc_free(&desc);
  return rc;
}

int rf_train_mesh_group(const struct rf_train_args *a, int replicate, const struct rf_comm *comm,
                        const struct rf_model_config *cfg, const struct rf_fsdp_options *o, int *group) {
  if (replicate == RF_PLAN_ARGS_MESH_NODE) {
    if (rf_comm_mesh_node_group(comm, group) == 0) return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", rf_error_msg());
    RF_FAIL("--replicate node: %s: give --replicate R", why);
  }
  if (replicate == RF_PLAN_ARGS_MESH_AUTO) return rf_train_mesh_auto(a, comm->world, cfg, o, group);
  RF_ASSERT(replicate >= 1 && comm->world % replicate == 0);
  *group = comm->world / replicate;
  return 0;
}
