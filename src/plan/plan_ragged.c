/* The ragged split: cut a sequence of contiguous items into world rank ranges at
 * aligned block boundaries, minimising the largest range (binary search on the
 * largest range; for a given bound, taking as much as allowed is optimal). */
#include <stdlib.h>

#include "core/core.h"
#include "plan/plan.h"

struct rf_plan_cuts {
  const struct rf_plan_item *items;
  const int64_t *offsets; /* contiguous: offsets[i+1] = offsets[i] + numel */
  int n;
  int64_t align;
  int64_t total;
  const int64_t *period; /* per item: align / gcd(block, align), the period of aligned block starts */
  int hint;              /* the item of the last lookup (greedy lookups move forward) */
};

/* The item holding position x (offsets[i] <= x < offsets[i] + numel), x < total. */
static int rf_plan_cuts_find(struct rf_plan_cuts *c, int64_t x) {
  int h = c->hint;
  if (c->offsets[h] <= x) {
    /* a few steps forward from the last lookup, else a binary search */
    for (int k = 0; k < 8 && h + 1 < c->n && c->offsets[h + 1] <= x; k++) h++;
    if (h + 1 == c->n || c->offsets[h + 1] > x) return c->hint = h;
  }
  int lo = 0, hi = c->n - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (c->offsets[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return c->hint = lo;
}

/* The largest legal cut <= x: a block start (or item end) that is a multiple of
 * align, 0, or the total. */
static int64_t rf_plan_cuts_prev(struct rf_plan_cuts *c, int64_t x) {
  if (x >= c->total) return c->total;
  for (int i = rf_plan_cuts_find(c, x); i >= 0; i--) {
    int64_t off = c->offsets[i], g = c->items[i].block_elems, end = off + c->items[i].numel, j;
    if (x >= end) {
      if (end % c->align == 0) return end;
      j = (end - 1 - off) / g;
    } else {
      j = (x - off) / g;
    }
    /* Aligned block starts repeat with period align / gcd(g, align). */
    int64_t period = c->period[i];
    for (int64_t step = 0; step < period && j >= 0; step++, j--)
      if ((off + j * g) % c->align == 0) return off + j * g;
    x = off; /* continue in the previous item, which ends at off */
  }
  return 0;
}

/* Greedy: every rank takes the longest legal range of at most m elements. Fills
 * starts when not NULL. Returns 1 if the world covers the total. */
static int rf_plan_cuts_fit(struct rf_plan_cuts *c, int world, int64_t m, int64_t *starts) {
  int64_t s = 0;
  c->hint = 0;
  if (starts) starts[0] = 0;
  for (int r = 0; r < world; r++) {
    s = rf_plan_cuts_prev(c, s + m);
    if (starts) starts[r + 1] = s;
  }
  return s == c->total;
}

int64_t rf_plan_ragged_split(const struct rf_plan_item *items, const int64_t *offsets, int n, int world,
                             int64_t align, int64_t *starts) {
  int64_t *period = rf_xmalloc((size_t)n * sizeof *period), step = 0;
  for (int i = 0; i < n; i++) {
    period[i] = align / rf_gcd_i64(items[i].block_elems, align);
    step = rf_max_i64(step, rf_min_i64(period[i] * items[i].block_elems, items[i].numel));
  }
  struct rf_plan_cuts c = {items, offsets, n, align, offsets[n - 1] + items[n - 1].numel, period, 0};
  int64_t lo = rf_ceil_div(c.total, world) - 1, hi = c.total; /* lo fails, hi fits */
  /* Legal cuts are rarely more than `step` (+ align) apart, so the optimum is
   * usually within that of the mean: try that bound first (it is checked). */
  int64_t near = lo + 1 + step + align;
  if (near < hi && rf_plan_cuts_fit(&c, world, near, NULL)) hi = near;
  while (hi - lo > 1) {
    int64_t mid = lo + (hi - lo) / 2;
    if (rf_plan_cuts_fit(&c, world, mid, NULL))
      hi = mid;
    else
      lo = mid;
  }
  RF_ASSERT(rf_plan_cuts_fit(&c, world, hi, starts));
  free(period);
  int64_t largest = 0;
  for (int r = 0; r < world; r++) largest = rf_max_i64(largest, starts[r + 1] - starts[r]);
  return largest;
}
