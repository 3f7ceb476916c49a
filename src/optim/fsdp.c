/* src/optim: an optimizer over every tensor of a runtime context. Kept in its
 * own file so that programs that build views themselves do not link the runtime. */
#include "fsdp/fsdp.h"
#include "optim/optim.h"

int rf_optim_create_fsdp(struct rf_optim **out, const struct rf_optim_options *opt, const struct rf_fsdp *f,
                         const int *flags, const struct rf_comm *comm) {
  RF_REQUIRE_ARG("rf_optim_create_fsdp", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_optim_create_fsdp", opt);
  RF_REQUIRE_ARG("rf_optim_create_fsdp", f);
  RF_REQUIRE(f->finalized, "rf_optim_create_fsdp: the context is not finalized (rf_fsdp_finalize first)");
  int n = rf_fsdp_n_tensors(f);
  RF_REQUIRE(n >= 0, "optim: the runtime context has %d tensors", n);
  RF_TRY(rf_optim_create_on(out, opt, rf_fsdp_views(f), flags, n, rf_fsdp_shard_elems(f),
                            comm ? comm : &f->mesh.shard, f->device, f->stream[RF_FSDP_STREAM_COMPUTE]));
  (*out)->fsdp = f;
  (*out)->grads_unfinished = rf_fsdp_grads_unfinished;
  return 0;
}
