/* src/optim: an optimizer over every tensor of a runtime context. Kept in its
 * own file so that programs that build views themselves do not link the runtime. */
#include "fsdp/fsdp.h"
#include "optim/optim.h"

int rf_optim_create_fsdp(struct rf_optim **out, const struct rf_optim_options *opt, const struct rf_fsdp *f,
                         const int *flags, const struct rf_comm *comm) {
  int n = rf_fsdp_n_tensors(f);
  RF_REQUIRE(n >= 0, "optim: the runtime context has %d tensors", n);
  return rf_optim_create_on(out, opt, rf_fsdp_views(f), flags, n, rf_fsdp_shard_elems(f),
                            comm ? comm : &f->mesh.shard, f->device);
}
