/* `rfsdp plan --batch`: the options of a simulated step (spelled as in rfsdp
 * train where train has them), the model's FLOPs and activation estimate, and
 * the simulator's numbers in plan's table and JSON (src/sim/simulate.c,
 * docs/scale.md). */
#ifndef RF_TOOLS_PLAN_SIM_H
#define RF_TOOLS_PLAN_SIM_H

#include <cjson/cJSON.h>
#include <stdint.h>

#include "model/cost.h"
#include "model/model.h"
#include "options.h"
#include "plan/plan.h"
#include "plan_args.h"
#include "sim/sim.h"

/* Strings borrowed from argv. batch 0: no simulation. */
struct rf_plan_sim_args {
  int64_t batch, seq;
  int accum, prefetch, no_reshard, replicate, rank;
  const char *mesh; /* plan's --replicate: R, node or auto (resolved into `replicate` per world) */
  const char *compute_dtype, *network;
  double peak_gflops, efficiency;
  double memory_per_rank; /* GB: --replicate auto's limit (0: none) */
};

#define RF_PLAN_SIM_ARGS_DEFAULT                                                                \
  {                                                                                             \
    .batch = 0, .seq = 128, .accum = 1, .prefetch = 1, .replicate = 1, .rank = -1, .mesh = "1", \
    .compute_dtype = "f32", .network = "here"                                                   \
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

/* What the model contributes: FLOPs per token and the activation estimate. */
struct rf_plan_sim_model {
  int have_config;
  struct rf_model_config cfg;
  double flops_per_token; /* 6 x active matmul parameters + attention (rf_model_step_flops_per_token) */
  int *flags;             /* the description's optimizer groups, one per tensor (owned) */
  const struct rf_model_desc *desc; /* borrowed: the tensors' optimizer groups (decay, matrix) */
  struct rf_sim_network net;        /* --network's profile (rf_sim_network_load) */
};

/* Reads what the simulation needs from the model's config (a units file has no
 * config: 6 x parameters per token, no activation estimate) and the network.
 * Returns 0, or -1 with rf_error_msg() naming the option or the file. */
int rf_plan_sim_setup(const struct rf_plan_sim_args *a, const char *model_path,
                      const struct rf_model_desc *desc, struct rf_plan_sim_model *out);

void rf_plan_sim_model_free(struct rf_plan_sim_model *sm);

/* The simulation's options at every world of worlds[n] before anything is read
 * or printed: --memory-per-rank only with --replicate auto and --batch, auto with
 * a limit (max_padding percent, < 0: none, or --memory-per-rank), --replicate at
 * each world, --rank only with --batch and inside the shard group (net: the
 * profile, for --replicate node), --seq. 0, or -1 with a message naming the
 * option: a usage error. */
int rf_plan_sim_check(const struct rf_plan_sim_args *a, const struct rf_sim_network *net, double max_padding,
                      const int *worlds, int n);

/* Simulates `world` ranks (the model laid out at world / R in m). */
int rf_plan_sim_world(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                      const struct rf_plan_unit_in *units, const struct rf_plan_model_result *m,
                      const struct rf_plan_policy *p, int world, enum rf_optim_kind optim,
                      struct rf_sim_result *out);

/* --replicate auto's shard group at `world`: with memory_gb > 0 the smallest S
 * dividing world whose layout meets max_padding (percent; < 0: off) and whose
 * simulated memory per rank (a, sm: the step) fits; otherwise the planner's
 * largest S meeting max_padding (rf_plan_advise_group). Fails naming the limits
 * when no group size meets them. rfsdp train and rfsdp plan both choose by it. */
int rf_plan_sim_auto_group(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                           const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                           int world, enum rf_optim_kind optim, double max_padding, double memory_gb,
                           int *group);

/* plan's --replicate (a->mesh: R, node, auto) at `world` into a->replicate:
 * node takes the network's ranks per node as the group (all W when the profile
 * puts every rank on one node). Fails naming --replicate. */
int rf_plan_sim_mesh(struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                     const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                     int world, enum rf_optim_kind optim, double max_padding);

void rf_plan_sim_print(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                       const struct rf_sim_result *r);
void rf_plan_sim_json(const struct rf_plan_sim_args *a, const struct rf_plan_sim_model *sm,
                      const struct rf_sim_result *r, cJSON *o);

#endif
