/* The planner's advice on the shard group size: the padding (equal) or the
 * imbalance (ragged) of every unit against a limit, and the group sizes that
 * meet it (rfsdp plan's suggestion, rfsdp train --replicate auto). */
#include "plan/plan.h"

double rf_plan_unit_excess(const struct rf_plan_unit *p) {
  if (p->mode == RF_SHARD_MODE_RAGGED) return p->imbalance - 1.0;
  return p->elems > 0 ? (double)(p->padded_elems - p->elems) / (double)p->elems : 0.0;
}

int rf_plan_model_meets(const struct rf_plan_model_result *r, double limit) {
  for (int u = 0; u < r->n_units; u++)
    if (rf_plan_unit_excess(&r->units[u].plan) > limit) return 0;
  return 1;
}

int rf_plan_group_meets(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                        int group, double limit) {
  struct rf_plan_model_result r;
  RF_TRY(rf_plan_model_make(units, n_units, p, group, 0, &r));
  int ok = rf_plan_model_meets(&r, limit);
  rf_plan_model_result_free(&r);
  return ok;
}

int rf_plan_advise_group(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                         int world, int below, double limit) {
  for (int g = below ? world - 1 : world; g >= 1; g--) {
    if (world % g) continue;
    int ok = rf_plan_group_meets(units, n_units, p, g, limit);
    if (ok < 0) return -1;
    if (ok) return g;
  }
  return 0;
}
