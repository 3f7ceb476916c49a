/* A whole model laid out at one world size: every distinct unit laid out once
 * under the policy (identical units share the layout), and the peers computed. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "plan/plan.h"

static double rf_plan_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Units u and v have the same planner input (a layout depends on nothing else). */
static int rf_plan_units_same(const struct rf_plan_unit_in *u, const struct rf_plan_unit_in *v) {
  if (u->n_tensors != v->n_tensors) return 0;
  for (int i = 0; i < u->n_tensors; i++) {
    const struct rf_plan_tensor_in *a = &u->tensors[i], *b = &v->tensors[i];
    if (a->ndim != b->ndim || a->block_elems != b->block_elems || a->sub_count != b->sub_count) return 0;
    for (int d = 0; d < a->ndim; d++)
      if (a->shape[d] != b->shape[d]) return 0;
  }
  return 1;
}

int rf_plan_model_make(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                       int world, int with_peers, struct rf_plan_model_result *out) {
  memset(out, 0, sizeof *out);
  RF_REQUIRE(n_units >= 1, "the model has no units");
  out->world = world;
  out->mode = p->layout == RF_LAYOUT_PLANNED ? p->shard : RF_SHARD_MODE_EQUAL;
  out->imbalance = 1.0;
  out->units = rf_xcalloc((size_t)n_units, sizeof *out->units);
  int *rep = rf_xmalloc((size_t)n_units * sizeof *rep), rc = 0;
  for (int u = 0; u < n_units && rc == 0; u++) {
    const struct rf_plan_unit_in *in = &units[u];
    double t0 = rf_plan_now_ms();
    /* Identical units (the layers of a model) share one layout. */
    int same = -1;
    for (int v = 0; v < u && same < 0; v++)
      if (rep[v] == v && rf_plan_units_same(in, &units[v])) same = v;
    rep[u] = same < 0 ? u : same;
    if (same >= 0)
      rf_plan_layout_copy(&out->units[same], &out->units[u]);
    else
      rc = rf_plan_layout_make(p, world, in, &out->units[u]);
    out->plan_ms += rf_plan_now_ms() - t0;
    if (rc != 0) break;
    out->n_units = u + 1;
    const struct rf_plan_layout *l = &out->units[u];
    out->elems += l->plan.elems;
    out->padded_elems += l->plan.padded_elems;
    out->bound_padded_elems += l->plan.bound_padded_elems;
    out->max_shard_elems += l->plan.max_shard_elems;
    out->split_blocks += l->split_blocks;
    out->copy_bytes += l->copy_bytes;
    out->n_buffers += l->plan.n_buffers;
    out->sub_padding_units += l->plan.used_sub_padding;
    if (l->plan.imbalance > out->imbalance) out->imbalance = l->plan.imbalance;
    for (int k = 0; with_peers && k < RF_PLAN_PEER_COUNT && rc == 0; k++)
      rc = rf_plan_peer_add((enum rf_plan_peer)k, in, world, &out->peers[k]);
  }
  free(rep);
  if (rc != 0) {
    rf_plan_model_result_free(out);
    return -1;
  }
  return 0;
}

void rf_plan_model_result_free(struct rf_plan_model_result *res) {
  for (int u = 0; u < res->n_units; u++) rf_plan_layout_free(&res->units[u]);
  free(res->units);
  memset(res, 0, sizeof *res);
}
