/* The checks of a run's shape that `rfsdp train` and `rfsdp plan --batch` share
 * (include/rfsdp_plan.h): one validation, so plan simulates only what train runs
 * and refuses the rest with train's message (tests/test_plan_strict.c). */
#include "core/core.h"
#include "rfsdp_plan.h"

int rf_plan_check_batch(int world, int64_t batch, int accum) {
  RF_REQUIRE(world >= 1 && accum >= 1, "world %d, --accum %d", world, accum);
  RF_REQUIRE(batch % ((int64_t)world * accum) == 0 && batch > 0,
             "--batch %lld is not divisible into %d ranks x %d micro-batches: use a multiple of %d",
             (long long)batch, world, accum, world * accum);
  return 0;
}

int rf_plan_check_seq(int64_t seq, int max_position_embeddings, const char *path) {
  RF_REQUIRE(seq <= max_position_embeddings, "--seq %lld exceeds max_position_embeddings %d of %s",
             (long long)seq, max_position_embeddings, path ? path : "the model's config");
  return 0;
}
