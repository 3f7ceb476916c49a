/* rfsdp train's mesh: --replicate R | node | auto into a shard group and a
 * replicate group (tools/train_mesh.h). */
#include "train_mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "porch.h"
#include "rfsdp_plan.h"
#include "train_args.h"

int rf_train_mesh_parse(const struct rf_train_args *a, int world, int *replicate) {
  const char *text = a->replicate;
  int limits = a->max_padding >= 0 || a->memory_per_rank > 0;
  RF_TOOL_REQUIRE(
      !limits || strcmp(text, "auto") == 0,
      "--max-padding and --memory-per-rank choose the shard group of --replicate auto (got --replicate %s)",
      text);
  int rc = rf_plan_mesh_parse(text, world, replicate);
  RF_TOOL_REQUIRE(
      rc != 0 || *replicate != RF_PLAN_MESH_AUTO || limits,
      "--replicate auto picks the shard group size by the planner's padding or the simulated memory: "
      "give --max-padding PERCENT, --memory-per-rank GB, or both");
  return rc;
}

/* --replicate auto: the shard group by the planner's padding or the simulated
 * memory per rank (rf_plan_group, as rfsdp plan --replicate auto). */
static int rf_train_mesh_auto(const struct rf_train_args *a, int world, int *group) {
  struct rf_plan_request r;
  RF_TOOL_TRY(rf_plan_request_init(&r, sizeof r));
  rf_plan_args_request(&a->plan, &r);
  r.model = a->model;
  r.replicate = "auto";
  r.max_padding = a->max_padding;
  r.memory_per_rank = a->memory_per_rank;
  r.batch = a->memory_per_rank > 0 ? a->batch : 0; /* the step is simulated for the memory limit only */
  r.seq = a->seq;
  r.accum = a->accum;
  r.prefetch = a->prefetch;
  r.no_reshard = a->no_reshard;
  r.compute_dtype = a->compute_dtype;
  struct rf_plan *p = NULL;
  int rc = rf_plan_create(&p, &r, &world, 1);
  if (rc == 0) rc = rf_plan_group(p, world, group);
  rf_plan_free(p);
  return rc == 0 ? 0 : -1;
}

int rf_train_mesh_group(const struct rf_train_args *a, int replicate, const struct rf_comm *comm,
                        int *group) {
  if (replicate == RF_PLAN_MESH_NODE) {
    if (rf_comm_node_group(comm, group) == 0) return 0;
    char why[512];
    snprintf(why, sizeof why, "%s", rf_fsdp_error());
    RF_TOOL_FAIL("--replicate node: %s: give --replicate R", why);
  }
  if (replicate == RF_PLAN_MESH_AUTO) return rf_train_mesh_auto(a, rf_comm_size(comm), group);
  int world = rf_comm_size(comm);
  RF_TOOL_ASSERT(replicate >= 1 && world % replicate == 0);
  *group = world / replicate;
  return 0;
}
