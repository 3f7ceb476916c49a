/* The one-buffer equal-shard core: earliest legal placement for a fixed order
 * and shard size S, the exact scan over S, the lower bound and the orders tried.
 * docs/planner.md explains why each step is exact. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

/* lcm values above this are treated as "no such multiple" (S would exceed any model). */
#define RF_PLAN_LCM_CAP ((int64_t)1 << 52)

/* The earliest offset >= p where an item of e elements and blocks of g has no
 * block cut by a multiple of S, or -1 if there is none. Either it fits before the
 * next boundary b, or it starts a whole number of blocks before b (the latest such
 * start is the earliest one that can work: an earlier start crosses b+S too, which
 * then needs S to be a multiple of g), or it starts in the next shard, where the
 * situation repeats, so two passes decide. */
static int64_t rf_plan_place_one(int64_t p, int64_t e, int64_t g, int64_t S) {
  for (int pass = 0; pass < 2; pass++) {
    int64_t b = (p / S + 1) * S;
    if (p + e <= b) return p;
    int64_t k = (b - p) / g;
    if (k >= 1) {
      int64_t l = b - g * k;
      if (l + e <= b + S || S % g == 0) return l;
    }
    if (p % S == 0) return -1;
    p = b;
  }
  return -1;
}

int rf_plan_items_fit(const struct rf_plan_item *items, int n, int world, int64_t shard, int64_t *offsets) {
  int64_t total = (int64_t)world * shard, p = 0;
  for (int i = 0; i < n; i++) {
    int64_t l = rf_plan_place_one(p, items[i].numel, items[i].block_elems, shard);
    if (l < 0 || l + items[i].numel > total) return 0;
    if (offsets) offsets[i] = l;
    p = l + items[i].numel;
  }
  return 1;
}

int64_t rf_plan_next_candidate(const struct rf_plan_item *items, int n, int64_t align, int64_t from) {
  int64_t c = rf_round_up(from < 1 ? 1 : from, align);
  for (int i = 0; i < n; i++) c = rf_max_i64(c, rf_round_up(items[i].block_elems, align));
  for (;;) {
    int64_t next = c;
    for (int i = 0; i < n; i++) {
      int64_t e = items[i].numel, g = items[i].block_elems;
      if (e <= 2 * c || c % g == 0) continue;
      /* Either S grows until the item no longer holds two boundaries, or S
       * becomes a multiple of both g and align; the nearer of the two. */
      int64_t half = rf_round_up(rf_ceil_div(e, 2), align);
      int64_t l = rf_lcm_i64_capped(align, g, RF_PLAN_LCM_CAP);
      int64_t need = l < 0 ? half : rf_min_i64(half, rf_round_up(c, l));
      next = rf_max_i64(next, need);
    }
    if (next == c) return c;
    c = next;
  }
}

static int64_t rf_plan_items_elems(const struct rf_plan_item *items, int n) {
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += items[i].numel;
  return sum;
}

int64_t rf_plan_lower_bound(const struct rf_plan_item *items, int n, int world, int64_t align) {
  return rf_plan_next_candidate(items, n, align, rf_ceil_div(rf_plan_items_elems(items, n), world));
}

int64_t rf_plan_items_min_shard(const struct rf_plan_item *items, int n, int world, int64_t align,
                                int64_t *offsets) {
  int64_t s = rf_plan_lower_bound(items, n, world, align);
  /* Terminates: at S >= sum of numel everything fits in the first shard. */
  while (!rf_plan_items_fit(items, n, world, s, offsets))
    s = rf_plan_next_candidate(items, n, align, s + align);
  return s;
}

/* Sort context: which key. The index is the tie-break, so the sort is stable. */
struct rf_plan_sort {
  const struct rf_plan_item *items;
  int key;
};

static int rf_plan_cmp(const void *pa, const void *pb, void *ctx) {
  const struct rf_plan_sort *sort = ctx;
  int a = *(const int *)pa, b = *(const int *)pb;
  const struct rf_plan_item *x = &sort->items[a], *y = &sort->items[b];
  int64_t kx, ky;
  switch (sort->key) {
    case 0:
      kx = -x->block_elems, ky = -y->block_elems;
      break;
    case 1:
      kx = -x->numel, ky = -y->numel;
      break;
    default:
      kx = x->numel, ky = y->numel;
      break;
  }
  if (kx != ky) return kx < ky ? -1 : 1;
  return a - b;
}

int rf_plan_orders(const struct rf_plan_item *items, int n, int *perm) {
  int n_orders = 1;
  for (int i = 0; i < n; i++) perm[i] = i;
  for (int key = 0; key < RF_PLAN_MAX_ORDERS - 1; key++) {
    int *p = perm + (size_t)n_orders * n;
    for (int i = 0; i < n; i++) p[i] = i;
    struct rf_plan_sort sort = {items, key};
    qsort_r(p, (size_t)n, sizeof *p, rf_plan_cmp, &sort);
    int dup = 0;
    for (int o = 0; o < n_orders && !dup; o++)
      dup = memcmp(perm + (size_t)o * n, p, (size_t)n * sizeof *p) == 0;
    if (!dup) n_orders++;
  }
  return n_orders;
}
