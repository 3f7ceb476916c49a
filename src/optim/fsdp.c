/* src/optim: an optimizer over every tensor of a runtime context. Kept in its
 * own file so that programs that build views themselves do not link the runtime. */
#include <stdlib.h>

#include "optim/optim.h"

int rf_optim_create_fsdp(struct rf_optim **out, const struct rf_optim_options *opt, const struct rf_fsdp *f,
                         const int *flags, const struct rf_comm *comm) {
  int n = rf_fsdp_n_tensors(f);
  RF_REQUIRE(n >= 0, "optim: the runtime context has %d tensors", n);
  struct rf_tensor_view *views = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof *views);
  for (int i = 0; i < n; i++) rf_fsdp_tensor(f, i, &views[i]);
  int rc = rf_optim_create(out, opt, views, flags, n, rf_fsdp_shard_elems(f), comm);
  free(views); /* copied by rf_optim_create; their pointers stay the runtime's */
  return rc;
}
