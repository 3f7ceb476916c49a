/* rf_plan_unit_make: validates a unit, groups its tensors into buffers (equal
 * mode) or lays them out contiguously (ragged mode), and builds the plan. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

/* Classes of equal block size beyond this are merged (2^n subsets are planned). */
#define RF_PLAN_MAX_CLASSES 8

static int rf_plan_validate(const struct rf_plan_unit_in *in, const struct rf_plan_options *opt) {
  const char *unit = in->name ? in->name : "?";
  RF_REQUIRE(opt->world >= 1, "unit %s: world must be >= 1 (got %d)", unit, opt->world);
  RF_REQUIRE(opt->align_elems >= 1, "unit %s: align_elems must be >= 1 (got %lld)", unit,
             (long long)opt->align_elems);
  RF_REQUIRE(opt->max_buffers >= 1, "unit %s: max_buffers must be >= 1 (got %d)", unit, opt->max_buffers);
  RF_REQUIRE(opt->mode == RF_SHARD_MODE_EQUAL || opt->mode == RF_SHARD_MODE_RAGGED,
             "unit %s: unknown shard mode", unit);
  RF_REQUIRE(opt->buffer_cost_elems >= 0, "unit %s: buffer_cost_elems must be >= 0", unit);
  RF_REQUIRE(in->n_tensors >= 1 && in->tensors, "unit %s: no tensors", unit);
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    const char *name = t->name ? t->name : "?";
    RF_REQUIRE(t->ndim >= 1 && t->ndim <= RF_MAX_DIMS, "unit %s, tensor %s: ndim %d outside 1..%d", unit,
               name, t->ndim, RF_MAX_DIMS);
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      RF_REQUIRE(t->shape[d] > 0, "unit %s, tensor %s: shape[%d] = %lld is not positive", unit, name, d,
                 (long long)t->shape[d]);
      RF_REQUIRE(numel <= INT64_MAX / 4 / t->shape[d], "unit %s, tensor %s: too many elements", unit, name);
      numel *= t->shape[d];
    }
    RF_REQUIRE(t->numel == numel, "unit %s, tensor %s: numel %lld is not the product of the shape (%lld)",
               unit, name, (long long)t->numel, (long long)numel);
    RF_REQUIRE(t->block_elems > 0, "unit %s, tensor %s: block_elems %lld is not positive", unit, name,
               (long long)t->block_elems);
    RF_REQUIRE(t->sub_count >= 0 && (t->sub_count <= 1 || numel % t->sub_count == 0),
               "unit %s, tensor %s: sub_count %lld does not divide numel %lld", unit, name,
               (long long)t->sub_count, (long long)numel);
  }
  return 0;
}

static int64_t rf_plan_subs(const struct rf_plan_tensor_in *t) { return t->sub_count > 1 ? t->sub_count : 1; }

/* Tensor i may take padding between its sub-tensors when every sub-tensor is a
 * whole number of blocks (no block spans two sub-tensors). */
static int rf_plan_can_split(const struct rf_plan_tensor_in *t) {
  int64_t subs = rf_plan_subs(t);
  return subs > 1 && (t->numel / subs) % t->block_elems == 0;
}

/* Items of the unit in model order: one per tensor, or one per sub-tensor of
 * splittable fused tensors when split is set. Returns the count; items has room
 * for the sum of sub-tensor counts. */
static int rf_plan_make_items(const struct rf_plan_unit_in *in, int split, struct rf_plan_item *items) {
  int n = 0;
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    int64_t subs = rf_plan_subs(t);
    if (split && rf_plan_can_split(t)) {
      for (int64_t s = 0; s < subs; s++)
        items[n++] = (struct rf_plan_item){t->numel / subs, t->block_elems, i, s, 1};
    } else {
      items[n++] = (struct rf_plan_item){t->numel, rf_min_i64(t->block_elems, t->numel), i, 0, subs};
    }
  }
  return n;
}

/* One planned buffer before it becomes output: its items in placement order. */
struct rf_plan_draft {
  int n;
  struct rf_plan_item *items; /* owned */
  int64_t *offsets;           /* owned */
  int64_t shard;
  int64_t elems;
};

static void rf_plan_draft_free(struct rf_plan_draft *d) {
  free(d->items);
  free(d->offsets);
  memset(d, 0, sizeof *d);
}

/* Best of the orders for one buffer of these items (given in model order).
 * perm: n_orders orders of the items (NULL: rf_plan_orders computes them).
 * Only S < limit is scanned (limit < 0: no limit); out->shard is -1 when
 * nothing fits there. */
static void rf_plan_draft_equal(const struct rf_plan_item *items, int n, int world, int64_t align,
                                const int *perm_in, int n_orders, int64_t limit, struct rf_plan_draft *out) {
  int *perm = NULL;
  if (!perm_in) {
    perm = rf_xmalloc((size_t)RF_PLAN_MAX_ORDERS * n * sizeof *perm);
    n_orders = rf_plan_orders(items, n, perm);
    perm_in = perm;
  }
  struct rf_plan_item *ordered = rf_xmalloc((size_t)n * sizeof *ordered);
  out->n = n;
  out->items = rf_xmalloc((size_t)n * sizeof *out->items);
  out->offsets = rf_xmalloc((size_t)n * sizeof *out->offsets);
  out->shard = -1;
  out->elems = 0;
  for (int i = 0; i < n; i++) out->elems += items[i].numel;
  for (int o = 0; o < n_orders; o++) {
    for (int i = 0; i < n; i++) ordered[i] = items[perm_in[(size_t)o * n + i]];
    /* a later order only matters if it beats the best so far */
    int64_t s =
        rf_plan_items_min_shard_below(ordered, n, world, align, out->shard >= 0 ? out->shard : limit, NULL);
    if (s >= 0) {
      out->shard = s;
      memcpy(out->items, ordered, (size_t)n * sizeof *ordered);
    }
  }
  RF_ASSERT(out->shard < 0 || rf_plan_items_fit(out->items, n, world, out->shard, out->offsets));
  free(ordered);
  free(perm);
}

/* The orders of rf_plan_orders for the items of the classes in mask, taken
 * from the orders of all items (gperm, n_g of them): a sorted order restricted
 * to a subset is the subset's sorted order (ties break by model position in
 * both), so one sort per unit serves every subset. Writes the subset's items
 * (model order) to sub and its orders to perm; returns the number of orders
 * (duplicates removed) and the subset size in *n_sub. */
static int rf_plan_subset_orders(const struct rf_plan_item *items, int n, const int *cls, int mask,
                                 const int *gperm, int n_g, struct rf_plan_item *sub, int *pos, int *perm,
                                 int *n_sub) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    pos[i] = -1;
    if (mask >> cls[i] & 1) pos[i] = k, sub[k++] = items[i];
  }
  int n_orders = 0;
  for (int o = 0; o < n_g; o++) {
    int *p = perm + (size_t)n_orders * k, m = 0;
    for (int i = 0; i < n; i++) {
      int x = pos[gperm[(size_t)o * n + i]];
      if (x >= 0) p[m++] = x;
    }
    int dup = 0;
    for (int q = 0; q < n_orders && !dup; q++)
      dup = memcmp(perm + (size_t)q * k, p, (size_t)k * sizeof *p) == 0;
    if (!dup) n_orders++;
  }
  *n_sub = k;
  return n_orders;
}

/* Class of each item: its block size, classes ranked by their elements (largest
 * first), the ones beyond RF_PLAN_MAX_CLASSES merged into the last. Returns the
 * number of classes. */
static int rf_plan_classes(const struct rf_plan_item *items, int n, int *cls) {
  int64_t *keys = rf_xmalloc((size_t)n * sizeof *keys), *sizes = rf_xcalloc((size_t)n, sizeof *sizes);
  int n_keys = 0, n_cls = 0;
  for (int i = 0; i < n; i++) {
    int k = 0;
    while (k < n_keys && keys[k] != items[i].block_elems) k++;
    if (k == n_keys) keys[n_keys++] = items[i].block_elems;
    sizes[k] += items[i].numel;
    cls[i] = k;
  }
  int *rank = rf_xmalloc((size_t)n_keys * sizeof *rank);
  for (int k = 0; k < n_keys; k++) {
    int r = 0;
    for (int j = 0; j < n_keys; j++) r += sizes[j] > sizes[k] || (j < k && sizes[j] == sizes[k]);
    rank[k] = r < RF_PLAN_MAX_CLASSES - 1 ? r : RF_PLAN_MAX_CLASSES - 1;
    if (rank[k] + 1 > n_cls) n_cls = rank[k] + 1;
  }
  for (int i = 0; i < n; i++) cls[i] = rank[cls[i]];
  free(rank);
  free(sizes);
  free(keys);
  return n_cls;
}

/* Partition of the items into at most max_buffers buffers along block-size
 * classes, minimising padding plus buffer_cost_elems per extra buffer (fewer
 * buffers on ties). Every class subset is planned once; a DP over subsets picks
 * the partition. Returns the number of drafts written (capacity RF_PLAN_MAX_CLASSES). */
static int rf_plan_partition(const struct rf_plan_item *items, int n, const struct rf_plan_options *opt,
                             struct rf_plan_draft *drafts) {
  int *cls = rf_xmalloc((size_t)n * sizeof *cls);
  int n_cls = rf_plan_classes(items, n, cls);
  int full = (1 << n_cls) - 1, max_b = opt->max_buffers < n_cls ? opt->max_buffers : n_cls;
  if (max_b == 1) {
    rf_plan_draft_equal(items, n, opt->world, opt->align_elems, NULL, 0, -1, &drafts[0]);
    free(cls);
    return 1;
  }
  struct rf_plan_item *sub = rf_xmalloc((size_t)n * sizeof *sub);
  int *gperm = rf_xmalloc((size_t)RF_PLAN_MAX_ORDERS * n * sizeof *gperm);
  int *perm = rf_xmalloc((size_t)RF_PLAN_MAX_ORDERS * n * sizeof *perm);
  int *pos = rf_xmalloc((size_t)n * sizeof *pos);
  int n_g = rf_plan_orders(items, n, gperm), n_sub, n_orders;
  double *pad = rf_xmalloc((size_t)(full + 1) * sizeof *pad);
  /* The whole unit in one buffer first: a proper subset whose own padding
   * reaches that one's cannot be part of a cheaper partition, so its scan stops
   * there (pad = infinity: never chosen). */
  for (int m = full; m >= 1; m--) {
    struct rf_plan_draft d;
    n_orders = rf_plan_subset_orders(items, n, cls, m, gperm, n_g, sub, pos, perm, &n_sub);
    int64_t limit = -1;
    if (m != full) {
      int64_t n_m = 0;
      for (int i = 0; i < n_sub; i++) n_m += sub[i].numel;
      limit = rf_ceil_div((int64_t)pad[full] + n_m, opt->world) + 1;
    }
    rf_plan_draft_equal(sub, n_sub, opt->world, opt->align_elems, perm, n_orders, limit, &d);
    pad[m] = d.shard < 0 ? 1e300 : (double)(d.shard * opt->world - d.elems);
    rf_plan_draft_free(&d);
  }
  /* f[j-1][m]: least cost of class set m in exactly j buffers; part[j-1][m]: the
   * buffer holding m's lowest class. */
  size_t stride = (size_t)full + 1;
  double *f = rf_xmalloc((size_t)max_b * stride * sizeof *f);
  int *part = rf_xmalloc((size_t)max_b * stride * sizeof *part);
  for (int m = 1; m <= full; m++) f[m] = pad[m], part[m] = m;
  for (int j = 2; j <= max_b; j++) {
    double *fj = f + (j - 1) * stride, *fp = f + (j - 2) * stride;
    int *pj = part + (j - 1) * stride;
    for (int m = 1; m <= full; m++) {
      fj[m] = 1e300, pj[m] = 0;
      int low = m & -m;
      for (int s = (m - 1) & m; s; s = (s - 1) & m) {
        if (!(s & low) || fp[m ^ s] >= 1e300) continue;
        double c = pad[s] + fp[m ^ s] + opt->buffer_cost_elems;
        if (c < fj[m]) fj[m] = c, pj[m] = s;
      }
    }
  }
  int j = 1;
  for (int b = 2; b <= max_b; b++)
    if (f[(b - 1) * stride + full] < f[(j - 1) * stride + full]) j = b;
  int n_drafts = 0;
  for (int m = full; m; j--) {
    int s = j == 1 ? m : part[(j - 1) * stride + m];
    n_orders = rf_plan_subset_orders(items, n, cls, s, gperm, n_g, sub, pos, perm, &n_sub);
    rf_plan_draft_equal(sub, n_sub, opt->world, opt->align_elems, perm, n_orders, -1, &drafts[n_drafts++]);
    m ^= s;
  }
  free(part);
  free(f);
  free(pad);
  free(pos);
  free(perm);
  free(gperm);
  free(sub);
  free(cls);
  return n_drafts;
}

/* Total cost of drafts as the partition compares them. */
static double rf_plan_drafts_cost(const struct rf_plan_draft *d, int n, const struct rf_plan_options *opt) {
  double c = opt->buffer_cost_elems * (n - 1);
  for (int b = 0; b < n; b++) c += (double)(d[b].shard * opt->world - d[b].elems);
  return c;
}

/* 1 when every tensor of the drafts is one run (its sub-items, if split,
 * consecutive and contiguous in one draft): the places rf_plan_buffer_build
 * would merge into one per tensor. */
static int rf_plan_drafts_whole(const struct rf_plan_unit_in *in, const struct rf_plan_draft *d, int n) {
  int *runs = rf_xcalloc((size_t)in->n_tensors, sizeof *runs), whole = 1;
  for (int b = 0; b < n; b++)
    for (int i = 0; i < d[b].n; i++) {
      const struct rf_plan_item *it = &d[b].items[i], *prev = i ? &d[b].items[i - 1] : NULL;
      int64_t sub_numel = in->tensors[it->tensor].numel / rf_plan_subs(&in->tensors[it->tensor]);
      int joins = prev && prev->tensor == it->tensor && prev->sub + prev->sub_n == it->sub &&
                  d[b].offsets[i - 1] + prev->sub_n * sub_numel == d[b].offsets[i];
      if (!joins && ++runs[it->tensor] > 1) whole = 0;
    }
  free(runs);
  return whole;
}

/* Turns a draft into an output buffer: equal starts (or the given ragged ones),
 * places with contiguous runs of one tensor's sub-tensors merged. */
static void rf_plan_buffer_build(const struct rf_plan_unit_in *in, const struct rf_plan_draft *d, int world,
                                 const int64_t *ragged_starts, struct rf_plan_buffer *out) {
  out->starts = rf_xmalloc((size_t)(world + 1) * sizeof *out->starts);
  if (ragged_starts) {
    memcpy(out->starts, ragged_starts, (size_t)(world + 1) * sizeof *out->starts);
    out->shard_elems = d->shard;
  } else {
    for (int r = 0; r <= world; r++) out->starts[r] = (int64_t)r * d->shard;
    out->shard_elems = d->shard;
  }
  out->total_elems = out->starts[world];
  out->places = rf_xmalloc((size_t)d->n * sizeof *out->places);
  out->n_places = 0;
  for (int i = 0; i < d->n; i++) {
    const struct rf_plan_item *it = &d->items[i];
    const struct rf_plan_tensor_in *t = &in->tensors[it->tensor];
    int64_t sub_numel = t->numel / rf_plan_subs(t);
    struct rf_plan_place *prev = out->n_places ? &out->places[out->n_places - 1] : NULL;
    if (prev && prev->tensor == it->tensor && prev->sub_first + prev->sub_n == it->sub &&
        prev->offset + prev->sub_n * sub_numel == d->offsets[i]) {
      prev->sub_n += it->sub_n;
      continue;
    }
    out->places[out->n_places++] =
        (struct rf_plan_place){it->tensor, d->offsets[i], sub_numel, it->sub, it->sub_n};
  }
}

/* Buffers are listed in the model order of their first tensor. */
static int rf_plan_buffer_cmp(const void *a, const void *b) {
  const struct rf_plan_buffer *x = a, *y = b;
  int tx = x->places[0].tensor, ty = y->places[0].tensor;
  for (int i = 1; i < x->n_places; i++) tx = x->places[i].tensor < tx ? x->places[i].tensor : tx;
  for (int i = 1; i < y->n_places; i++) ty = y->places[i].tensor < ty ? y->places[i].tensor : ty;
  return (tx > ty) - (tx < ty);
}

int rf_plan_unit_make(const struct rf_plan_unit_in *in, const struct rf_plan_options *opt,
                      struct rf_plan_unit *out) {
  memset(out, 0, sizeof *out);
  RF_TRY(rf_plan_validate(in, opt));
  int world = opt->world;
  int64_t n_max = 0;
  for (int i = 0; i < in->n_tensors; i++) n_max += rf_plan_subs(&in->tensors[i]);
  struct rf_plan_item *items = rf_xmalloc((size_t)n_max * sizeof *items);
  struct rf_plan_draft drafts[RF_PLAN_MAX_CLASSES];
  int n_drafts;
  out->world = world;
  out->mode = opt->mode;
  out->imbalance = 1.0;
  int n = rf_plan_make_items(in, 0, items);
  if (opt->mode == RF_SHARD_MODE_RAGGED) {
    struct rf_plan_draft *d = &drafts[0];
    d->n = n;
    d->items = items;
    d->offsets = rf_xmalloc((size_t)n * sizeof *d->offsets);
    d->elems = 0;
    for (int i = 0; i < n; i++) d->offsets[i] = d->elems, d->elems += items[i].numel;
    int64_t *starts = rf_xmalloc((size_t)(world + 1) * sizeof *starts);
    d->shard = rf_plan_ragged_split(items, d->offsets, n, world, opt->align_elems, starts);
    out->n_buffers = 1;
    out->buffers = rf_xcalloc(1, sizeof *out->buffers);
    rf_plan_buffer_build(in, d, world, starts, &out->buffers[0]);
    out->bound_padded_elems = d->elems;
    out->imbalance = (double)d->shard * world / (double)d->elems;
    free(starts);
    rf_plan_draft_free(d);
  } else {
    n_drafts = rf_plan_partition(items, n, opt, drafts);
    out->bound_padded_elems = (int64_t)world * rf_plan_lower_bound(items, n, world, opt->align_elems);
    int can_split = 0;
    for (int i = 0; i < in->n_tensors; i++) can_split |= rf_plan_can_split(&in->tensors[i]);
    if (opt->allow_sub_padding && can_split) {
      /* Sub-tensors as separate items; kept only when strictly cheaper. */
      int n_split = rf_plan_make_items(in, 1, items);
      struct rf_plan_draft alt[RF_PLAN_MAX_CLASSES];
      int n_alt = rf_plan_partition(items, n_split, opt, alt);
      out->bound_padded_elems = (int64_t)world * rf_plan_lower_bound(items, n_split, world, opt->align_elems);
      int better = rf_plan_drafts_cost(alt, n_alt, opt) < rf_plan_drafts_cost(drafts, n_drafts, opt) &&
                   (opt->allow_sub_padding == 1 || rf_plan_drafts_whole(in, alt, n_alt));
      struct rf_plan_draft *drop = better ? drafts : alt;
      for (int b = 0; b < (better ? n_drafts : n_alt); b++) rf_plan_draft_free(&drop[b]);
      if (better) {
        memcpy(drafts, alt, (size_t)n_alt * sizeof *alt);
        n_drafts = n_alt;
      }
    }
    out->n_buffers = n_drafts;
    out->buffers = rf_xcalloc((size_t)n_drafts, sizeof *out->buffers);
    for (int b = 0; b < n_drafts; b++) {
      rf_plan_buffer_build(in, &drafts[b], world, NULL, &out->buffers[b]);
      rf_plan_draft_free(&drafts[b]);
    }
    qsort(out->buffers, (size_t)n_drafts, sizeof *out->buffers, rf_plan_buffer_cmp);
    free(items);
  }
  for (int i = 0; i < in->n_tensors; i++) out->elems += in->tensors[i].numel;
  int *places_of = rf_xcalloc((size_t)in->n_tensors, sizeof *places_of);
  for (int b = 0; b < out->n_buffers; b++) {
    out->padded_elems += out->buffers[b].total_elems;
    out->max_shard_elems += out->buffers[b].shard_elems;
    for (int p = 0; p < out->buffers[b].n_places; p++)
      if (++places_of[out->buffers[b].places[p].tensor] > 1) out->used_sub_padding = 1;
  }
  free(places_of);
  return 0;
}

void rf_plan_unit_free(struct rf_plan_unit *plan) {
  for (int b = 0; b < plan->n_buffers; b++) {
    free(plan->buffers[b].starts);
    free(plan->buffers[b].places);
  }
  free(plan->buffers);
  memset(plan, 0, sizeof *plan);
}
