/* rfsdp train's mesh: --replicate R | node | auto into a shard group and a
 * replicate group (tools/train_mesh.h). */
#include "train_mesh.h"

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
  if (strcmp(text, "node") == 0) {
    *replicate = RF_TRAIN_MESH_NODE;
    return 0;
  }
  if (strcmp(text, "auto") == 0) {
    RF_REQUIRE(
        limits,
        "--replicate auto picks the shard group size by the planner's padding or the simulated memory: "
        "give --max-padding PERCENT, --memory-per-rank GB, or both");
    *replicate = RF_TRAIN_MESH_AUTO;
    return 0;
  }
  char *end = NULL;
  long r = strtol(text, &end, 10);
  RF_REQUIRE(end != text && *end == 0, "--replicate '%s': expected a replica count R >= 1, node or auto",
             text);
  RF_REQUIRE(r >= 1, "--replicate %ld: the replica count must be at least 1", r);
  RF_REQUIRE(
      world % r == 0,
      "--replicate %ld does not divide the %d ranks (W = R x S): use a divisor of %d, or run %ld x S ranks",
      r, world, world, r);
  *replicate = (int)r;
  return 0;
}

/* The ranks of the calling rank's node, checked equal on every node. */
static int rf_train_mesh_node_size(MPI_Comm comm, int *group) {
  MPI_Comm node;
  int local = 1;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &local);
  MPI_Comm_free(&node);
  int sizes[2] = {local, -local};
  MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, comm);
  RF_REQUIRE(sizes[0] == -sizes[1],
             "--replicate node: the nodes run different numbers of ranks (%d to %d): give --replicate R",
             -sizes[1], sizes[0]);
  *group = local;
  return 0;
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
  struct rf_plan_sim_model sm;
  enum rf_optim_kind kind = RF_OPTIM_KIND_ADAMW;
  int rc = a->memory_per_rank > 0 ? rf_plan_sim_setup(&sa, a->model, &desc, &sm) : 0;
  if (rc == 0 && a->memory_per_rank > 0) rc = rf_optim_kind_parse(a->plan.optim, &kind);
  if (rc == 0)
    rc = rf_plan_sim_auto_group(&sa, &sm, units, desc.n_units, &policy, world, kind, a->max_padding,
                                a->memory_per_rank, group);
  free(units);
  rf_model_desc_free(&desc);
  return rc;
}

int rf_train_mesh_group(const struct rf_train_args *a, int replicate, MPI_Comm comm,
                        const struct rf_model_config *cfg, const struct rf_fsdp_options *o, int *group) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  if (replicate == RF_TRAIN_MESH_NODE) return rf_train_mesh_node_size(comm, group);
  if (replicate == RF_TRAIN_MESH_AUTO) return rf_train_mesh_auto(a, world, cfg, o, group);
  RF_ASSERT(replicate >= 1 && world % replicate == 0);
  *group = world / replicate;
  return 0;
}

void rf_train_mesh_split(int replicate, MPI_Comm comm, int group, MPI_Comm *shard, MPI_Comm *replica) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (replicate == RF_TRAIN_MESH_NODE)
    MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, shard);
  else
    MPI_Comm_split(comm, rank / group, rank, shard);
  int shard_rank = 0;
  MPI_Comm_rank(*shard, &shard_rank);
  MPI_Comm_split(comm, shard_rank, rank, replica);
}
