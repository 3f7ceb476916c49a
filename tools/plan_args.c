/* The run options that change the plan, and the plan's summary in JSON. */
#include "plan_args.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "optim/optim.h"

const char *rf_plan_args_optim_choices(void) {
  static _Thread_local char names[128];
  if (!names[0] && rf_optim_kind_list(names, sizeof names, "|") != 0) RF_DIE("%s", rf_error_msg());
  return names;
}

int rf_plan_args_replicate(const char *text, int world, int *replicate) {
  if (strcmp(text, "node") == 0) {
    *replicate = RF_PLAN_ARGS_MESH_NODE;
    return 0;
  }
  if (strcmp(text, "auto") == 0) {
    *replicate = RF_PLAN_ARGS_MESH_AUTO;
    return 0;
  }
  char *end = NULL;
  errno = 0;
  long r = strtol(text, &end, 10);
  RF_REQUIRE(end != text && *end == 0 && errno == 0,
             "--replicate '%s': expected a replica count R >= 1, node or auto", text);
  RF_REQUIRE(r >= 1, "--replicate %ld: the replica count must be at least 1", r);
  RF_REQUIRE(
      world % r == 0,
      "--replicate %ld does not divide the %d ranks (W = R x S): use a divisor of %d, or run %ld x S ranks",
      r, world, world, r);
  *replicate = (int)r;
  return 0;
}

int rf_plan_args_fsdp_options(const struct rf_plan_args *a, struct rf_fsdp_options *o) {
  o->layout = strcmp(a->layout, "fsdp2") == 0  ? RF_LAYOUT_FSDP2
              : strcmp(a->layout, "flat") == 0 ? RF_LAYOUT_FLAT
                                               : RF_LAYOUT_PLANNED;
  o->shard = strcmp(a->shard, "ragged") == 0 ? RF_SHARD_MODE_RAGGED : RF_SHARD_MODE_EQUAL;
  RF_REQUIRE(a->block_rows >= 1 || a->block_rows == -1,
             "--block-rows must be >= 1 (left out: what the optimizer needs), got %lld",
             (long long)a->block_rows);
  /* the optimizer's blocks (8-bit AdamW: 32-row strips, runs of 256) whole on one rank */
  enum rf_optim_kind kind;
  RF_TRY(rf_optim_kind_parse(a->optim, &kind));
  struct rf_optim_layout_needs needs;
  rf_optim_layout_needs(kind, &needs);
  o->block_rows = a->block_rows > 0 ? a->block_rows : needs.block_rows;
  o->vector_block = needs.vector_block;
  RF_TRY(rf_dtype_parse(a->param_dtype, &o->param_dtype));
  RF_TRY(rf_dtype_parse(a->reduce_dtype, &o->reduce_dtype));
  o->fp8 = strcmp(a->fp8, "block") == 0;
  RF_REQUIRE(o->fp8 || !a->fp8_pow2, "--fp8-pow2-scales needs --fp8 block");
  o->fp8_pow2 = a->fp8_pow2;
  return 0;
}

void rf_plan_summary_json(const struct rf_plan_summary *s, cJSON *o) {
  double ratio = s->elems > 0 ? (double)(s->padded_elems - s->elems) / (double)s->elems : 0.0;
  cJSON_AddNumberToObject(o, "padding_ratio", ratio);
  cJSON_AddNumberToObject(o, "buffer_count", s->buffer_count);
  cJSON_AddNumberToObject(o, "max_shard_elems", (double)s->max_shard_elems);
  cJSON_AddNumberToObject(o, "split_blocks", (double)s->split_blocks);
  cJSON_AddNumberToObject(o, "copy_bytes_per_step", (double)s->copy_bytes_per_step);
}
