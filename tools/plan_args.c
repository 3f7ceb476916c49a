/* The run options that change the plan, and the plan's summary in JSON. */
#include "plan_args.h"

#include <stdio.h>
#include <string.h>

#include "plan_sim.h"
#include "porch.h"
#include "rfsdp_optim.h"

const char *rf_plan_args_optim_choices(void) {
  static _Thread_local char names[128];
  if (!names[0] && rf_optim_kind_list(names, sizeof names, "|") != 0) RF_TOOL_DIE("%s", rf_fsdp_error());
  return names;
}

const char *rf_plan_sim_network_help(void) {
  static _Thread_local char help[1200];
  snprintf(help, sizeof help, "machine profile: %s, or FILE.json", rf_plan_network_names());
  return help;
}

void rf_plan_args_request(const struct rf_plan_args *a, struct rf_plan_request *r) {
  r->optim = a->optim;
  r->layout = a->layout;
  r->shard = a->shard;
  r->param_dtype = a->param_dtype;
  r->reduce_dtype = a->reduce_dtype;
  r->fp8 = a->fp8;
  r->fp8_pow2 = a->fp8_pow2;
  r->block_rows = a->block_rows;
}

int rf_plan_args_fsdp_options(const struct rf_plan_args *a, struct rf_fsdp_options *o) {
  struct rf_plan_request r;
  if (rf_plan_request_init(&r, sizeof r) != 0) return -1;
  rf_plan_args_request(a, &r);
  return rf_plan_request_fsdp_options(&r, o);
}

void rf_plan_summary_json(const struct rf_plan_summary *s, cJSON *o) {
  double ratio = s->elems > 0 ? (double)(s->padded_elems - s->elems) / (double)s->elems : 0.0;
  cJSON_AddNumberToObject(o, "padding_ratio", ratio);
  cJSON_AddNumberToObject(o, "buffer_count", s->buffer_count);
  cJSON_AddNumberToObject(o, "max_shard_elems", (double)s->max_shard_elems);
  cJSON_AddNumberToObject(o, "split_blocks", (double)s->split_blocks);
  cJSON_AddNumberToObject(o, "copy_bytes_per_step", (double)s->copy_bytes_per_step);
}
