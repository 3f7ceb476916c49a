/* One validation of a run's shape for `rfsdp train` and `rfsdp plan`. */
#include "plan_check.h"

#include "core/core.h"

int rf_plan_check_batch(int world, int64_t batch, int accum) {
  RF_REQUIRE(world >= 1 && accum >= 1, "world %d, --accum %d", world, accum);
  RF_REQUIRE(batch % ((int64_t)world * accum) == 0 && batch > 0,
             "--batch %lld is not divisible into %d ranks x %d micro-batches: use a multiple of %d",
             (long long)batch, world, accum, world * accum);
  return 0;
}

int rf_plan_check_seq(int64_t seq, const struct rf_model_config *cfg, const char *path) {
  RF_REQUIRE(seq <= cfg->max_position_embeddings, "--seq %lld exceeds max_position_embeddings %d of %s",
             (long long)seq, cfg->max_position_embeddings, path);
  return 0;
}
