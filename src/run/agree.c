/* Agreement over a runtime context's communicator or any other (src/comm's checked
 * rf_comm_agree), a program's exit status after it, and --init's import. */
#include <stdio.h>

#include "comm/comm.h"
#include "run/run.h"

int rf_run_agree(const struct rf_fsdp *f, int status) {
  RF_REQUIRE_ARG("rf_run_agree", f);
  return rf_comm_mesh_agree(&f->mesh, status);
}

/* Set when an agreement of rf_run_agree_comm failed because of another rank: this
 * rank's message then only echoes that failure, and rf_run_exit_status lets the
 * other rank speak. */
static int rf_run_failed_elsewhere;

int rf_run_agree_comm(const struct rf_comm *comm, int status) {
  RF_REQUIRE_ARG("rf_run_agree_comm", comm);
  int all = rf_comm_agree(comm, status);
  if (status == 0 && all != 0) rf_run_failed_elsewhere = 1;
  return all;
}

int rf_run_exit_status(const struct rf_comm *comm, int rc, const char *command) {
  RF_REQUIRE_ARG("rf_run_exit_status", comm);
  RF_REQUIRE_ARG("rf_run_exit_status", command);
  int rank = comm->rank, world = comm->world;
  /* the lowest rank that saw a problem itself, else the lowest that stopped because of another */
  int elsewhere = rf_run_failed_elsewhere || rf_error_is_elsewhere(); /* a library's agreement */
  int32_t speaker = rc == 0 ? 2 * world : elsewhere ? world + rank : rank;
  rf_comm_allreduce(comm, &speaker, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  if (speaker == 2 * world) return 0;
  if (speaker % world == rank) fprintf(stderr, "%s: %s\n", command, rf_error_msg());
  return 1;
}

int rf_run_import(struct rf_fsdp *f, const struct rf_comm *comm, const char *path) {
  RF_REQUIRE_ARG("rf_run_import", f);
  RF_REQUIRE_ARG("rf_run_import", comm);
  RF_REQUIRE_ARG("rf_run_import", path);
  /* the master shard is device memory: read into host staging, copied on the compute stream */
  int rc = rf_ckpt_import_views_on(path, rf_fsdp_views(f), rf_fsdp_n_tensors(f), f->device,
                                   f->stream[RF_FSDP_STREAM_COMPUTE]);
  int all = rf_run_agree_comm(comm, rc);
  RF_REQUIRE(all == 0 || rc != 0, "%s: another rank could not import it", path);
  return rc;
}
