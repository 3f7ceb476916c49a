/* rfsdp plan: the planner's layout of a model at one or more world sizes, next
 * to the layouts of FSDP1, FSDP2, DeepSpeed ZeRO-3 and Megatron-FSDP (padding,
 * blocks cut across ranks, bytes copied per step), and with --batch the simulated
 * step. A porch over include/rfsdp_plan.h: it parses the options into a request
 * and prints what the library plans; every plan printed has passed the
 * independent checker. docs/planner.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "plan_args.h"
#include "plan_sim.h"
#include "rfsdp_model.h" /* rf_train_model_families: the --model help */
#include "rfsdp_plan.h"

#define RF_PLAN_CMD_MAX_WORLDS 64

/* --world's list W[,W...] into worlds (at most RF_PLAN_CMD_MAX_WORLDS); the range
 * of each is the library's check. 0, or -1 with the message in why. */
static int rf_plan_cmd_worlds(const char *text, int *worlds, int *n, char *why, size_t size) {
  *n = 0;
  const char *p = text;
  while (*p) {
    char *end;
    long w = strtol(p, &end, 10);
    if (end == p || w < 1 || w > (1L << 24) || (*end != ',' && *end != 0)) {
      snprintf(why, size, "--world: '%s' is not a list of world sizes 1..%d separated by commas", text,
               1 << 24);
      return -1;
    }
    if (*n >= RF_PLAN_CMD_MAX_WORLDS) {
      snprintf(why, size, "--world: at most %d world sizes", RF_PLAN_CMD_MAX_WORLDS);
      return -1;
    }
    worlds[(*n)++] = (int)w;
    p = *end == ',' ? end + 1 : end;
    if (*end == ',' && !*p) {
      snprintf(why, size, "--world: '%s' ends with a comma", text);
      return -1;
    }
  }
  if (*n == 0) {
    snprintf(why, size, "--world: no world size given");
    return -1;
  }
  return 0;
}

int rf_cmd_plan(int argc, char **argv) {
  struct rf_plan_cmd_opts {
    const char *model_path;
    struct rf_plan_args args;
    struct rf_plan_sim_args sim;
    int64_t align_bytes;
    int max_buffers, json, buffers;
    double max_padding;
  } c = {.args = RF_PLAN_ARGS_DEFAULT, .sim = RF_PLAN_SIM_ARGS_DEFAULT};
  const char *worlds_text = NULL;
  c.align_bytes = 64;
  c.max_buffers = 4;
  c.max_padding = -1;
  char families[256], model_help[400], usage[1024];
  if (rf_train_model_families(families, sizeof families, 0, ", ") != 0)
    snprintf(families, sizeof families, "?");
  snprintf(model_help, sizeof model_help, "a Hugging Face config.json (%s) or a generic units file",
           families);
  snprintf(
      usage, sizeof usage,
      "usage: rfsdp plan --model FILE --world W[,W...] [--optim %s] [--layout planned|fsdp2|flat] [--shard "
      "equal|ragged] [--block-rows R] [--param-dtype f32|bf16] [--reduce-dtype f32|bf16] [--align-bytes "
      "64] [--max-buffers 4] [--max-padding P] [--replicate R|node|auto [--memory-per-rank GB]] [--batch B "
      "--seq T [--accum A] [--rank I] [--compute-dtype f32|bf16] [--network NAME|FILE.json] [--peak-gflops "
      "G] [--efficiency E]] [--fp8 off|block [--fp8-pow2-scales]] [--json] [--buffers]",
      rf_plan_args_optim_choices());
  const struct rf_option options[] = {
      {"model", RF_OPTION_KIND_STRING, &c.model_path, model_help, NULL, 1},
      {"world", RF_OPTION_KIND_STRING, &worlds_text, "world size(s), comma-separated: W[,W...]", NULL, 1},
      RF_PLAN_ARGS_OPTIONS(c.args),
      RF_PLAN_SIM_OPTIONS(c.sim),
      {"align-bytes", RF_OPTION_KIND_I64, &c.align_bytes, "every rank's slice starts on a multiple of this",
       NULL, 0},
      {"max-buffers", RF_OPTION_KIND_INT, &c.max_buffers,
       "equal mode: at most this many buffers per unit (1..8)", NULL, 0},
      {"max-padding", RF_OPTION_KIND_DOUBLE, &c.max_padding,
       "percent: name the units above it (ragged: largest shard over mean) and suggest an FSDP group size "
       "(negative: off)",
       NULL, 0},
      {"json", RF_OPTION_KIND_FLAG, &c.json, "one JSON object per world size", NULL, 0},
      {"buffers", RF_OPTION_KIND_FLAG, &c.buffers,
       "also print every buffer's tensors and offsets (planned and flat layouts)", NULL, 0},
  };
  int rc = rf_options_parse(argc, argv, options, (int)(sizeof options / sizeof options[0]), usage);
  if (rc == 1) return 0;
  if (rc != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_fsdp_error());
    return 2;
  }
  int worlds[RF_PLAN_CMD_MAX_WORLDS], n_worlds = 0;
  char why[512];
  if (rf_plan_cmd_worlds(worlds_text, worlds, &n_worlds, why, sizeof why) != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", why);
    return 2;
  }
  struct rf_plan_request req;
  if (rf_plan_request_init(&req, sizeof req) != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_fsdp_error());
    return 1;
  }
  rf_plan_args_request(&c.args, &req);
  req.model = c.model_path;
  req.align_bytes = c.align_bytes;
  req.max_buffers = c.max_buffers;
  req.max_padding = c.max_padding;
  req.buffers = c.buffers;
  req.replicate = c.sim.mesh;
  req.memory_per_rank = c.sim.memory_per_rank;
  req.batch = c.sim.batch;
  req.seq = c.sim.seq;
  req.accum = c.sim.accum;
  req.prefetch = c.sim.prefetch;
  req.no_reshard = c.sim.no_reshard;
  req.rank = c.sim.rank;
  req.compute_dtype = c.sim.compute_dtype;
  req.network = c.sim.network;
  req.peak_gflops = c.sim.peak_gflops;
  req.efficiency = c.sim.efficiency;
  struct rf_plan *plan = NULL;
  rc = rf_plan_create(&plan, &req, worlds, n_worlds); /* 2: the options' mistake, before any output */
  if (rc != 0) {
    fprintf(stderr, "rfsdp plan: %s\n", rf_fsdp_error());
    return rc == 2 ? 2 : 1;
  }
  if (!c.json) rf_plan_print_banner(plan, stdout);
  int status = 0;
  for (int i = 0; i < n_worlds && status == 0; i++) {
    if (rf_plan_print(plan, worlds[i], c.json, stdout) != 0) {
      fprintf(stderr, "rfsdp plan: %s: world %d: %s\n", c.model_path, worlds[i], rf_fsdp_error());
      status = 1;
    }
  }
  rf_plan_free(plan);
  return status;
}
