/* A unit as the runtime lays it out: under FP8 block its other tensors and its
 * FP8 tensors planned apart, each group into buffers of its own (every
 * collective then moves one kind); else the whole unit. See plan.h. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

int rf_plan_split_make(const struct rf_plan_policy *p, int world, const struct rf_plan_unit_in *in,
                       struct rf_plan_split *out) {
  memset(out, 0, sizeof *out);
  int n = in->n_tensors, fp8 = 0, n_sub[2] = {0, 0};
  /* fsdp2 and flat gather FP8 tensors in the param dtype (quantized after the gather) */
  for (int t = 0; t < n; t++) fp8 |= p->fp8 && p->layout == RF_LAYOUT_PLANNED && in->tensors[t].fp8;
  out->tensors = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof *out->tensors);
  out->map = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof *out->map);
  for (int t = 0; t < n; t++) n_sub[fp8 && in->tensors[t].fp8]++;
  for (int t = 0, at[2] = {0, n_sub[0]}; t < n; t++) {
    int g = fp8 && in->tensors[t].fp8;
    out->map[at[g]] = t;
    out->tensors[at[g]++] = in->tensors[t];
  }
  for (int g = 0; g < 2; g++) {
    if (n_sub[g] == 0) continue;
    int k = out->n_groups;
    out->in[k] = (struct rf_plan_unit_in){in->name, n_sub[g], out->tensors + (g ? n_sub[0] : 0)};
    out->fp8[k] = g;
    if (rf_plan_layout_make(p, world, &out->in[k], &out->layout[k]) != 0) {
      rf_plan_split_free(out);
      return -1;
    }
    out->n_groups++;
  }
  return 0;
}

void rf_plan_split_free(struct rf_plan_split *s) {
  for (int g = 0; g < s->n_groups; g++) rf_plan_layout_free(&s->layout[g]);
  free(s->tensors);
  free(s->map);
  memset(s, 0, sizeof *s);
}
