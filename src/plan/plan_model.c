/* A whole model planned at one world size: every unit planned, checked by the
 * independent checker, its cut blocks counted, and the peers computed. */
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

/* Units u and v have the same planner input (a plan depends on nothing else). */
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

static void rf_plan_unit_copy(const struct rf_plan_unit *src, struct rf_plan_unit *dst) {
  *dst = *src;
  dst->buffers = rf_xmalloc((size_t)src->n_buffers * sizeof *dst->buffers);
  for (int b = 0; b < src->n_buffers; b++) {
    const struct rf_plan_buffer *x = &src->buffers[b];
    struct rf_plan_buffer *y = &dst->buffers[b];
    *y = *x;
    y->starts = rf_xmalloc((size_t)(src->world + 1) * sizeof *y->starts);
    memcpy(y->starts, x->starts, (size_t)(src->world + 1) * sizeof *y->starts);
    y->places = rf_xmalloc((size_t)x->n_places * sizeof *y->places);
    memcpy(y->places, x->places, (size_t)x->n_places * sizeof *y->places);
  }
}

int rf_plan_model_make(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_options *opt,
                       double buffer_cost_ratio, int with_peers, struct rf_plan_model_result *out) {
  memset(out, 0, sizeof *out);
  RF_REQUIRE(n_units >= 1, "the model has no units");
  RF_REQUIRE(buffer_cost_ratio >= 0, "buffer_cost_ratio must be >= 0");
  out->world = opt->world;
  out->mode = opt->mode;
  out->imbalance = 1.0;
  out->units = rf_xcalloc((size_t)n_units, sizeof *out->units);
  int *rep = rf_xmalloc((size_t)n_units * sizeof *rep), rc = 0;
  for (int u = 0; u < n_units && rc == 0; u++) {
    const struct rf_plan_unit_in *in = &units[u];
    int64_t numel = 0;
    for (int i = 0; i < in->n_tensors; i++) numel += in->tensors[i].numel;
    double t0 = rf_plan_now_ms();
    /* Identical units (the layers of a model) share one plan. */
    int same = -1;
    for (int v = 0; v < u && same < 0; v++)
      if (rep[v] == v && rf_plan_units_same(in, &units[v])) same = v;
    rep[u] = same < 0 ? u : same;
    if (same >= 0)
      rf_plan_unit_copy(&out->units[same], &out->units[u]);
    else {
      struct rf_plan_options unit_opt = *opt;
      unit_opt.buffer_cost_elems += buffer_cost_ratio * (double)numel;
      rc = rf_plan_unit_make(in, &unit_opt, &out->units[u]);
    }
    out->plan_ms += rf_plan_now_ms() - t0;
    if (rc != 0) break;
    out->n_units = u + 1;
    const struct rf_plan_unit *p = &out->units[u];
    rc = rf_plan_unit_check(in, p, opt->align_elems);
    if (rc != 0) break;
    out->elems += p->elems;
    out->padded_elems += p->padded_elems;
    out->bound_padded_elems += p->bound_padded_elems;
    out->max_shard_elems += p->max_shard_elems;
    out->split_blocks += rf_plan_unit_split_blocks(in, p);
    out->n_buffers += p->n_buffers;
    out->sub_padding_units += p->used_sub_padding;
    if (p->imbalance > out->imbalance) out->imbalance = p->imbalance;
    for (int k = 0; with_peers && k < RF_PLAN_PEER_COUNT && rc == 0; k++)
      rc = rf_plan_peer_add((enum rf_plan_peer)k, in, opt->world, &out->peers[k]);
  }
  free(rep);
  if (rc != 0) {
    rf_plan_model_result_free(out);
    return -1;
  }
  return 0;
}

void rf_plan_model_result_free(struct rf_plan_model_result *res) {
  for (int u = 0; u < res->n_units; u++) rf_plan_unit_free(&res->units[u]);
  free(res->units);
  memset(res, 0, sizeof *res);
}
