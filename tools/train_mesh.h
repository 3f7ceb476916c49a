/* rfsdp train's mesh (--replicate): W = R x S ranks as R replica groups of S
 * ranks each. Parameters are sharded within a shard group and replicated across
 * the groups (HSDP); --replicate 1, the default, is 1-D FSDP over every rank.
 *   --replicate R     consecutive ranks form a shard group (ranks k*S .. k*S+S-1)
 *   --replicate node  the ranks of one node form a shard group (MPI_COMM_TYPE_SHARED;
 *                     every node must run the same number of ranks)
 *   --replicate auto  with --max-padding alone: the largest S dividing W whose plan
 *                     meets it (the planner's advice, as rfsdp plan --max-padding
 *                     suggests it); with --memory-per-rank GB: the smallest S dividing W
 *                     whose simulated memory per rank fits (rf_plan_simulate, as rfsdp
 *                     plan --batch prints it) and whose plan meets --max-padding if given */
#ifndef RF_TOOLS_TRAIN_MESH_H
#define RF_TOOLS_TRAIN_MESH_H

#include "rfsdp.h" /* struct rf_comm: opaque */

struct rf_train_args;

/* --replicate's text into a count R >= 1, RF_PLAN_MESH_NODE or RF_PLAN_MESH_AUTO
 * (rf_plan_mesh_parse, which rfsdp plan uses too); refuses what is
 * none of them, an R that does not divide `world`, auto without --max-padding or
 * --memory-per-rank, and those two without auto. The same on every rank: no
 * agreement needed. */
int rf_train_mesh_parse(const struct rf_train_args *a, int world, int *replicate);

/* The shard group size S for `replicate` at the ranks of `comm`: R gives W / R;
 * node measures the nodes (collective over `comm`, the same answer on every
 * rank); auto plans (and simulates) the model (a's config, layout, batch and optimizer: rf_plan_group)
 * at each divisor of W (the same on every rank). Fails, naming --replicate, when
 * nodes differ in size or no group size meets the limits. */
int rf_train_mesh_group(const struct rf_train_args *a, int replicate, const struct rf_comm *comm, int *group);

#endif
