/* `rfsdp plan --batch`: the options of a simulated step (spelled as in rfsdp
 * train where train has them), handed to the library's plan request
 * (include/rfsdp_plan.h, src/model/plan.c; docs/scale.md). */
#ifndef RF_TOOLS_PLAN_SIM_H
#define RF_TOOLS_PLAN_SIM_H

#include <stdint.h>

#include "options.h"
#include "plan_args.h"

/* Strings borrowed from argv. batch 0: no simulation. */
struct rf_plan_sim_args {
  int64_t batch, seq;
  int accum, prefetch, no_reshard, rank;
  const char *mesh; /* plan's --replicate: R, node or auto */
  const char *compute_dtype, *network;
  double peak_gflops, efficiency;
  double memory_per_rank; /* GB: --replicate auto's limit (0: none) */
};

#define RF_PLAN_SIM_ARGS_DEFAULT                                                                        \
  {                                                                                                     \
    .batch = 0, .seq = 128, .accum = 1, .prefetch = 1, .rank = -1, .mesh = "1", .compute_dtype = "f32", \
    .network = "here"                                                                                   \
  }

/* --network's help: "machine profile: NAME, NAME, ... (the profiles' folder,
 * rf_sim_network_names), or FILE.json" (static storage). */
const char *rf_plan_sim_network_help(void);

/* The option table rows of struct rf_plan_sim_args `a`. */
#define RF_PLAN_SIM_OPTIONS(a)                                                                               \
  {"replicate",                                                                                              \
   RF_OPTION_KIND_STRING,                                                                                    \
   &(a).mesh,                                                                                                \
   "HSDP: R replicas of shard groups of W/R ranks (R divides every W); node: groups of the network's ranks " \
   "per node; auto: the group by --max-padding and/or --memory-per-rank (as rfsdp train)",                   \
   NULL,                                                                                                     \
   0},                                                                                                       \
      {"memory-per-rank",                                                                                    \
       RF_OPTION_KIND_DOUBLE,                                                                                \
       &(a).memory_per_rank,                                                                                 \
       "GB: --replicate auto takes the smallest shard group whose simulated memory per rank fits",           \
       "[0, inf)",                                                                                           \
       0},                                                                                                   \
      {"batch",    RF_OPTION_KIND_I64,                                                                       \
       &(a).batch, "global batch in sequences: simulate a step (memory, bytes, time; 0: only the layout)",   \
       "[0, inf)", 0},                                                                                       \
      {"seq", RF_OPTION_KIND_I64, &(a).seq, "tokens per sequence", "[1, inf)", 0},                           \
      {"rank",      RF_OPTION_KIND_INT,                                                                      \
       &(a).rank,   "the shard-group rank simulated (-1: the one with the most memory)",                     \
       "[-1, inf)", 0},                                                                                      \
      {"accum", RF_OPTION_KIND_INT, &(a).accum, "micro-batches per step", "[1, inf)", 0},                    \
      {"prefetch", RF_OPTION_KIND_INT, &(a).prefetch, "units gathered ahead", "[0, inf)", 0},                \
      {"no-reshard",                                                                                         \
       RF_OPTION_KIND_FLAG,                                                                                  \
       &(a).no_reshard,                                                                                      \
       "keep parameters gathered from forward to backward",                                                  \
       NULL,                                                                                                 \
       0},                                                                                                   \
      {"compute-dtype",    RF_OPTION_KIND_CHOICE,                                                            \
       &(a).compute_dtype, "operands of the matmuls (the network's peak in that dtype)",                     \
       "f32|bf16",         0},                                                                               \
      {"network", RF_OPTION_KIND_STRING, &(a).network, rf_plan_sim_network_help(), NULL, 0},                 \
      {"peak-gflops",    RF_OPTION_KIND_DOUBLE,                                                              \
       &(a).peak_gflops, "matmul peak per rank in the compute dtype (0: the network's)",                     \
       "[0, inf)",       0},                                                                                 \
  {                                                                                                          \
    "efficiency", RF_OPTION_KIND_DOUBLE, &(a).efficiency,                                                    \
        "achieved share of the peak in the matmuls (0: the network's)", "[0, 1]", 0                          \
  }

#endif
