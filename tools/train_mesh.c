/* rfsdp train's mesh: --replicate R | node | auto into a shard group and a
 * replicate group (tools/train_mesh.h). */
#include "train_mesh.h"

#include <stdlib.h>
#include <string.h>

#include "fsdp/fsdp.h"
#include "plan/plan.h"

int rf_train_mesh_parse(const char *text, int world, double max_padding, int *replicate) {
  if (strcmp(text, "node") == 0) {
    *replicate = RF_TRAIN_MESH_NODE;
    return 0;
  }
  if (strcmp(text, "auto") == 0) {
    RF_REQUIRE(max_padding >= 0,
               "--replicate auto picks the shard group size by the planner's padding: give --max-padding "
               "PERCENT");
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

static int rf_train_mesh_auto(int world, const struct rf_model_config *cfg, const struct rf_fsdp_options *o,
                              double max_padding, int *group) {
  struct rf_model_desc desc;
  struct rf_plan_policy policy;
  rf_model_desc_make(cfg, &desc);
  rf_fsdp_plan_policy(o, &policy);
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&desc, &policy);
  int g = rf_plan_advise_group(units, desc.n_units, &policy, world, 0, max_padding / 100.0);
  free(units);
  rf_model_desc_free(&desc);
  RF_TRY(g < 0 ? -1 : 0);
  RF_REQUIRE(g > 0, "--replicate auto: no shard group size dividing %d meets --max-padding %g%%", world,
             max_padding);
  *group = g;
  return 0;
}

int rf_train_mesh_group(int replicate, MPI_Comm comm, const struct rf_model_config *cfg,
                        const struct rf_fsdp_options *o, double max_padding, int *group) {
  int world = 1;
  MPI_Comm_size(comm, &world);
  if (replicate == RF_TRAIN_MESH_NODE) return rf_train_mesh_node_size(comm, group);
  if (replicate == RF_TRAIN_MESH_AUTO) return rf_train_mesh_auto(world, cfg, o, max_padding, group);
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
