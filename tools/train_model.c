/* rfsdp's agreements, exit status and --init import around the model's binding. */
#include "train_model.h"

#include <stdio.h>

#include "ckpt/ckpt.h"
#include "core/core.h"
#include "fsdp/fsdp.h"
#include "rfsdp_plan.h"

/* Set when an agreement failed because of another rank: this rank's message then
 * only echoes that failure, and rf_train_exit_status lets the other rank speak. */
static int rf_train_failed_elsewhere;

int rf_train_agree(const struct rf_comm *comm, int status) {
  int all = rf_comm_agree(comm, status);
  if (status == 0 && all != 0) rf_train_failed_elsewhere = 1;
  return all;
}

int rf_train_exit_status(const struct rf_comm *comm, int rc, const char *command) {
  int rank = comm->rank, world = comm->world;
  /* the lowest rank that saw a problem itself, else the lowest that stopped because of another */
  int elsewhere = rf_train_failed_elsewhere || rf_error_is_elsewhere(); /* a library's agreement */
  int32_t speaker = rc == 0 ? 2 * world : elsewhere ? world + rank : rank;
  rf_comm_allreduce(comm, &speaker, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  if (speaker == 2 * world) return 0;
  if (speaker % world == rank) fprintf(stderr, "%s: %s\n", command, rf_error_msg());
  return 1;
}

int rf_train_model_import(struct rf_train_model *m, const struct rf_comm *comm, const char *path) {
  /* the master shard is device memory: read into host staging, copied on the compute stream */
  struct rf_fsdp *f = m->fsdp;
  int rc = rf_ckpt_import_views_on(path, rf_fsdp_views(f), rf_fsdp_n_tensors(f), f->device,
                                   f->stream[RF_FSDP_STREAM_COMPUTE]);
  int all = rf_train_agree(comm, rc);
  RF_REQUIRE(all == 0 || rc != 0, "%s: another rank could not import it", path);
  return rc;
}
