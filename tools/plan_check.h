/* The checks of a run's shape that `rfsdp train` and `rfsdp plan --batch` share
 * (one validation: plan simulates only what train runs, and refuses the rest
 * with train's message and exit code 2, before it prints anything). */
#ifndef RF_TOOLS_PLAN_CHECK_H
#define RF_TOOLS_PLAN_CHECK_H

#include <stdint.h>

#include "model/model.h"

/* The global batch of `batch` sequences split into `world` ranks x `accum`
 * micro-batches of whole sequences (so a batch below W, or --accum beyond what
 * the batch holds, is refused). Returns 0, or -1 with rf_error_msg() naming the
 * options. */
int rf_plan_check_batch(int world, int64_t batch, int accum);

/* --seq within the model's max_position_embeddings (cfg read from `path`).
 * Returns 0, or -1 with rf_error_msg(). */
int rf_plan_check_seq(int64_t seq, const struct rf_model_config *cfg, const char *path);

#endif
