/* Agreement over a runtime context's communicator (src/comm's checked rf_comm_agree). */
#include "run/run.h"

int rf_run_agree(const struct rf_fsdp *f, int status) {
  RF_REQUIRE_ARG("rf_run_agree", f);
  return rf_comm_mesh_agree(&f->mesh, status);
}
