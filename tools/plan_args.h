/* The options of a run that change its plan, spelled once for `rfsdp train` and
 * `rfsdp plan`, turned into runtime options by one function; and the plan's
 * summary as both commands print it (`rfsdp plan --json`, the first line of
 * `rfsdp train --log`). */
#ifndef RF_TOOLS_PLAN_ARGS_H
#define RF_TOOLS_PLAN_ARGS_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "options.h"
#include "rfsdp.h"
#include "rfsdp_plan.h"

/* Strings borrowed from argv. */
struct rf_plan_args {
  const char *layout, *shard, *optim, *param_dtype, *reduce_dtype;
  int64_t block_rows; /* -1: what the optimizer needs */
  const char *fp8;    /* "off" or "block" (docs/fp8.md) */
  int fp8_pow2;       /* --fp8-pow2-scales */
};

#define RF_PLAN_ARGS_DEFAULT                                                                              \
  {                                                                                                       \
    .layout = "planned", .shard = "equal", .optim = "adamw", .param_dtype = "f32", .reduce_dtype = "f32", \
    .block_rows = -1, .fp8 = "off"                                                                        \
  }

/* The option table rows of struct rf_plan_args `a`. */
#define RF_PLAN_ARGS_OPTIONS(a)                                                                                \
  {"optim", RF_OPTION_KIND_CHOICE, &(a).optim, "optimizer", rf_plan_args_optim_choices(), 0},                  \
      {"layout", RF_OPTION_KIND_CHOICE, &(a).layout, "parameter layout", "planned|fsdp2|flat", 0},             \
      {"shard", RF_OPTION_KIND_CHOICE, &(a).shard, "shard mode of the planned layout", "equal|ragged", 0},     \
      {"block-rows",                                                                                           \
       RF_OPTION_KIND_I64,                                                                                     \
       &(a).block_rows,                                                                                        \
       "rows kept whole on one rank (>= 1; -1: what the optimizer needs, e.g. adamw8bit's 32-row strips)",     \
       "[0, inf)",                                                                                             \
       0},                                                                                                     \
      {"param-dtype", RF_OPTION_KIND_CHOICE, &(a).param_dtype, "dtype of gathered parameters", "f32|bf16", 0}, \
      {"reduce-dtype",    RF_OPTION_KIND_CHOICE,                                                               \
       &(a).reduce_dtype, "dtype of the gradient reduce-scatter",                                              \
       "f32|bf16",        0},                                                                                  \
      {"fp8",                                                                                                  \
       RF_OPTION_KIND_CHOICE,                                                                                  \
       &(a).fp8,                                                                                               \
       "block: the linear weights in e4m3 with one scale per 128x128 tile (gathered as codes, 128-row "        \
       "blocks), activations and output gradients per 1x128 tile (docs/fp8.md)",                               \
       "off|block",                                                                                            \
       0},                                                                                                     \
  {                                                                                                            \
    "fp8-pow2-scales", RF_OPTION_KIND_FLAG, &(a).fp8_pow2, "--fp8 block: power-of-two tile scales", NULL, 0    \
  }

/* The optimizers' names, "adamw|adamw8bit|...", from the library's table
 * (rf_optim_kind_list; static storage): --optim's choices and usage. */
const char *rf_plan_args_optim_choices(void);

/* Copies a's fields into the library's plan request r (include/rfsdp_plan.h). */
void rf_plan_args_request(const struct rf_plan_args *a, struct rf_plan_request *r);

/* Sets o's layout, shard mode, blocks (the optimizer's needs unless --block-rows)
 * and dtypes from `a`; the rest of o is left alone. Returns 0, or -1 with
 * rf_error_msg() naming the option. */
int rf_plan_args_fsdp_options(const struct rf_plan_args *a, struct rf_fsdp_options *o);

/* What `rfsdp plan --json` and the train log's "plan" object both hold. */
struct rf_plan_summary {
  int64_t elems, padded_elems, max_shard_elems, split_blocks, copy_bytes_per_step;
  int buffer_count;
};

/* Adds padding_ratio, buffer_count, max_shard_elems, split_blocks and
 * copy_bytes_per_step to the JSON object o. */
void rf_plan_summary_json(const struct rf_plan_summary *s, cJSON *o);

#endif
