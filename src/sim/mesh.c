/* A run's step at any world size and the automatic mesh (sim.h): the one choice
 * of the shard group that `rfsdp train --replicate auto` and `rfsdp plan
 * --replicate auto` make. */
#include <string.h>

#include "core/core.h"
#include "sim/sim.h"

int rf_sim_run_world(const struct rf_sim_workload *w, const struct rf_plan_unit_in *units,
                     const struct rf_plan_model_result *m, const struct rf_plan_policy *p, int world,
                     int replicate, struct rf_sim_result *out) {
  RF_REQUIRE(world >= 1 && replicate >= 1 && world % replicate == 0 && w->accum >= 1,
             "the simulator: %d ranks in %d replica groups, %d micro-batches", world, replicate, w->accum);
  int64_t micro = rf_max_i64(rf_ceil_div(w->batch, (int64_t)world * w->accum), 1); /* sequences per rank */
  int per_node = w->net.ranks_per_node > 0 && w->net.ranks_per_node < world ? w->net.ranks_per_node : world;
  struct rf_sim_options o = {
      .replicate = replicate,
      .rank = w->rank,
      .flags = w->flags,
      .prefetch = w->prefetch,
      .reshard_after_forward = w->reshard_after_forward,
      .accum = w->accum,
      .tokens_per_rank = (double)w->batch * (double)w->seq / world,
      .flops_per_token = w->flops_per_token,
      .f32_compute = w->f32_compute,
      .activation_bytes =
          w->activation_bytes ? w->activation_bytes(w->ctx, (int)rf_min_i64(micro, 1 << 20), per_node) : 0,
      .scalar_reduce_bytes = w->scalar_reduce_bytes,
      .net = w->net,
  };
  rf_optim_options_default(&o.optim);
  o.optim.kind = w->optim;
  return rf_sim_step(units, m, p, &o, out);
}

int rf_sim_auto_group(const struct rf_sim_workload *w, const struct rf_plan_unit_in *units, int n_units,
                      const struct rf_plan_policy *p, int world, double max_padding, double memory_bytes,
                      struct rf_sim_auto *out) {
  memset(out, 0, sizeof *out);
  out->least_bytes = -1;
  if (memory_bytes <= 0) {
    int g = rf_plan_advise_group(units, n_units, p, world, 0, max_padding);
    if (g < 0) return -1;
    out->group = g;
    return 0;
  }
  for (int s = 1; s <= world; s++) {
    if (world % s) continue;
    struct rf_plan_model_result m;
    struct rf_sim_result r = {0};
    RF_TRY(rf_plan_model_make(units, n_units, p, s, 0, &m));
    int padding_ok = max_padding < 0 || rf_plan_model_meets(&m, max_padding);
    int rc = rf_sim_run_world(w, units, &m, p, world, world / s, &r);
    rf_plan_model_result_free(&m);
    RF_TRY(rc);
    if (!padding_ok) continue;
    if ((double)r.mem.total <= memory_bytes) {
      out->group = s;
      return 0;
    }
    if (out->least_bytes < 0 || r.mem.total < out->least_bytes)
      out->least_bytes = r.mem.total, out->least_group = s;
  }
  return 0;
}

int rf_sim_node_group(const struct rf_sim_network *net, int world) {
  int per_node = net->ranks_per_node;
  return per_node > 0 && per_node < world ? per_node : world;
}
