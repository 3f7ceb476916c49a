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

/* A run of m identical items of e elements (a whole number of blocks g), placed
 * from p, where p is a whole number of blocks past its shard's start: the run's
 * end, the same as m calls of rf_plan_place_one, in one step (an MoE layer has
 * hundreds of identical experts); -1 where the shape of the run is not one of
 * the regular ones below. With r = S mod g, rf_plan_place_one pads exactly r
 * before an item that crosses a boundary, nothing before the others, and the
 * cursor stays a whole number of blocks past its shard's start:
 *  - r = 0: nothing is ever padded;
 *  - e + r <= S: with x the cursor's offset in its shard, u = x - r moves like a
 *    counter modulo L = S - r in (0, L], one boundary per wrap;
 *  - S < e <= 2S - r: every item crosses; with c = r + e - S, an item either
 *    crosses one boundary (x + c <= S: x grows by c) or starts in the next
 *    shard and crosses the one after (x becomes c): from x = c that is a period
 *    of k = S / c items over k + 1 shards. */
static int64_t rf_plan_place_run(int64_t p, int64_t e, int64_t g, int64_t S, int64_t m) {
  int64_t x = p % S, r = S % g, base = p - x;
  if (r == 0) return p + m * e;
  if (e + r <= S) {
    int64_t L = S - r, t = x - r + m * e - 1;
    return base + t / L * S + t % L + 1 + r;
  }
  if (e + r > 2 * S) return -1; /* here e > S: S - r is the largest multiple of g up to S */
  int64_t c = r + e - S, j = rf_min_i64(m, (S - x) / c), shards = j;
  x += j * c;
  m -= j;
  if (m > 0) {
    int64_t k = S / c;
    m--;
    shards += 2 + m / k * (k + 1) + m % k;
    x = c + m % k * c;
  }
  return base + shards * S + x;
}

int rf_plan_items_fit(const struct rf_plan_item *items, int n, int world, int64_t shard, int64_t *offsets) {
  int64_t total = (int64_t)world * shard, p = 0, slack = total;
  for (int i = 0; i < n; i++) slack -= items[i].numel;
  if (slack < 0) return 0;
  /* p - used: padding so far, which only grows; once it exceeds the slack the
   * rest cannot fit (exact early exit). Without offsets, runs of identical items
   * are placed in one step when their cursor allows (rf_plan_place_run). */
  int64_t used = 0;
  int run_end = 0;
  for (int i = 0; i < n;) {
    int64_t e = items[i].numel, g = items[i].block_elems, end = -1;
    if (i >= run_end)
      for (run_end = i + 1; run_end < n && items[run_end].numel == e && items[run_end].block_elems == g;)
        run_end++;
    if (!offsets && run_end - i > 1 && e % g == 0 && p % shard % g == 0)
      end = rf_plan_place_run(p, e, g, shard, run_end - i);
    if (end >= 0) {
      p = end;
      used += (run_end - i) * e;
      i = run_end;
    } else {
      int64_t l = rf_plan_place_one(p, e, g, shard);
      if (l < 0) return 0;
      if (offsets) offsets[i] = l;
      p = l + e;
      used += e;
      i++;
    }
    if (p > total || p - used > slack) return 0;
  }
  return 1;
}

/* The earliest placement followed for every S of [*lo, *hi] at once (*lo a
 * multiple of align). Within a range of S where every decision of
 * rf_plan_place_one comes out the same, the cursor is k*S + x with k and x fixed
 * (an item is placed either before the next boundary or a whole number of its
 * blocks before it, so its end is a fixed offset past a boundary), and each
 * decision compares S with a fixed number: "fits before the boundary" (x + e <=
 * S), the blocks before the boundary (floor((S - x) / g)), "ends before the
 * boundary after" (e - g*m <= S). The range is narrowed to where they hold as
 * at *lo; the fit condition (padding within the slack, (W - k) * S >= x + the
 * elements still to place) holds from a threshold on, which raises *lo. Returns
 * 1 when the aligned S = *lo fits (and no aligned S of the range below it does);
 * 0 when no aligned S in [*lo, *hi] fits, *hi lowered to where that is known. */
static int rf_plan_items_fit_range(const struct rf_plan_item *items, int n, int world, int64_t elems,
                                   int64_t align, int64_t *lo_io, int64_t *hi_io) {
  int64_t lo = rf_max_i64(*lo_io, rf_round_up(rf_ceil_div(elems, world), align)), hi = *hi_io;
  int64_t k = 0, x = 0, rest = elems; /* cursor k*S + x with 0 <= x < S on the whole range */
  int i = 0;
  for (; i < n && lo <= hi; i++) {
    int64_t e = items[i].numel, g = items[i].block_elems;
    int placed = 0;
    for (int pass = 0; pass < 2 && !placed; pass++) {
      if (x + e <= lo) { /* before the boundary, and so for every larger S */
        x += e;
        placed = 1;
        break;
      }
      hi = rf_min_i64(hi, x + e - 1);
      int64_t m = (lo - x) / g; /* whole blocks before the boundary */
      hi = rf_min_i64(hi, x + (m + 1) * g - 1);
      if (m >= 1) {
        int64_t y = e - g * m; /* its end past the boundary */
        int ok = y <= lo;
        if (!ok) { /* it holds two boundaries: legal where S is a whole number of blocks */
          ok = lo % g == 0;
          hi = ok ? lo : rf_min_i64(hi, rf_min_i64(y, rf_round_up(lo, g)) - 1);
        }
        if (ok) {
          k++;
          x = y;
          placed = 1;
          break;
        }
      }
      if (x == 0) break;
      k++;
      x = 0;
    }
    if (!placed) break;
    if (x >= lo) { /* at a boundary (or past) at S = lo only */
      hi = lo;
      k += x / lo;
      x %= lo;
    }
    rest -= e;
    /* p <= W*S and padding <= slack: (W - k) * S >= x + rest */
    if (world - k <= 0) {
      if (world - k < 0 || x + rest > 0) break;
    } else {
      lo = rf_max_i64(lo, rf_round_up(rf_ceil_div(x + rest, world - k), align));
    }
  }
  if (i == n && lo <= hi) {
    *lo_io = lo;
    return 1;
  }
  *hi_io = hi;
  return 0;
}

/* The smallest S in [from, to] (a multiple of align) at which the items fit in
 * this order, or -1: rf_plan_items_fit_range over consecutive ranges. */
static int64_t rf_plan_items_first_fit(const struct rf_plan_item *items, int n, int world, int64_t align,
                                       int64_t elems, int64_t from, int64_t to) {
  for (int64_t lo = rf_round_up(from, align); lo <= to;) {
    int64_t hi = to;
    if (rf_plan_items_fit_range(items, n, world, elems, align, &lo, &hi)) return lo;
    lo = rf_round_up(hi + 1, align);
  }
  return -1;
}

/* The distinct (numel, block) pairs of a set of items, with lcm(align, block):
 * the candidate conditions depend on nothing else, and a unit of hundreds of
 * experts has only a handful of distinct pairs. */
struct rf_plan_pairs {
  int n;
  int64_t max_block;            /* the largest block rounded up to align */
  int64_t *numel, *block, *lcm; /* lcm: -1 above RF_PLAN_LCM_CAP */
};

static int rf_plan_pair_cmp(const void *pa, const void *pb) {
  const int64_t *a = pa, *b = pb;
  if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
  return (a[1] > b[1]) - (a[1] < b[1]);
}

static void rf_plan_pairs_init(struct rf_plan_pairs *p, const struct rf_plan_item *items, int n,
                               int64_t align) {
  p->numel = rf_xmalloc((size_t)(n > 0 ? n : 1) * 3 * sizeof *p->numel);
  p->block = p->numel + n;
  p->lcm = p->block + n;
  p->n = 0;
  p->max_block = align;
  /* Linear dedup while the pairs are few (the usual case), a sort otherwise. */
  int i = 0;
  for (; i < n && p->n <= 32; i++) {
    int64_t e = items[i].numel, g = items[i].block_elems;
    int k = 0;
    while (k < p->n && (p->numel[k] != e || p->block[k] != g)) k++;
    if (k == p->n) p->numel[p->n] = e, p->block[p->n] = g, p->n++;
  }
  if (i < n) {
    int64_t *eg = rf_xmalloc((size_t)n * 2 * sizeof *eg);
    for (int j = 0; j < n; j++) eg[2 * j] = items[j].numel, eg[2 * j + 1] = items[j].block_elems;
    qsort(eg, (size_t)n, 2 * sizeof *eg, rf_plan_pair_cmp);
    p->n = 0;
    for (int j = 0; j < n; j++) {
      if (p->n && p->numel[p->n - 1] == eg[2 * j] && p->block[p->n - 1] == eg[2 * j + 1]) continue;
      p->numel[p->n] = eg[2 * j], p->block[p->n] = eg[2 * j + 1], p->n++;
    }
    free(eg);
  }
  for (int k = 0; k < p->n; k++) {
    p->max_block = rf_max_i64(p->max_block, rf_round_up(p->block[k], align));
    p->lcm[k] = rf_lcm_i64_capped(align, p->block[k], RF_PLAN_LCM_CAP);
  }
}

static void rf_plan_pairs_free(struct rf_plan_pairs *p) { free(p->numel); }

static int64_t rf_plan_pairs_next(const struct rf_plan_pairs *p, int64_t align, int64_t from) {
  int64_t c = rf_max_i64(rf_round_up(from < 1 ? 1 : from, align), p->max_block);
  for (;;) {
    int64_t next = c;
    for (int i = 0; i < p->n; i++) {
      int64_t e = p->numel[i], g = p->block[i];
      if (e <= 2 * c || c % g == 0) continue;
      /* Either S grows until the item no longer holds two boundaries, or S
       * becomes a multiple of both g and align; the nearer of the two. */
      int64_t half = rf_round_up(rf_ceil_div(e, 2), align);
      int64_t need = p->lcm[i] < 0 ? half : rf_min_i64(half, rf_round_up(c, p->lcm[i]));
      next = rf_max_i64(next, need);
    }
    if (next == c) return c;
    c = next;
  }
}

int64_t rf_plan_next_candidate(const struct rf_plan_item *items, int n, int64_t align, int64_t from) {
  struct rf_plan_pairs p;
  rf_plan_pairs_init(&p, items, n, align);
  int64_t c = rf_plan_pairs_next(&p, align, from);
  rf_plan_pairs_free(&p);
  return c;
}

static int64_t rf_plan_items_elems(const struct rf_plan_item *items, int n) {
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += items[i].numel;
  return sum;
}

int64_t rf_plan_lower_bound(const struct rf_plan_item *items, int n, int world, int64_t align) {
  return rf_plan_next_candidate(items, n, align, rf_ceil_div(rf_plan_items_elems(items, n), world));
}

/* The smallest aligned S in (lo, hi] that fits, given that lo fails, hi fits
 * (hi < 0: unknown), no S at or below `limit` matters (limit < 0: none), and
 * feasibility is monotone from lo on; -1 if none below limit. */
static int64_t rf_plan_monotone_search(const struct rf_plan_item *items, int n, int world, int64_t align,
                                       int64_t lo, int64_t limit) {
  int64_t step = align, hi;
  for (;;) { /* exponential search for a fitting S */
    hi = lo + step;
    if (limit >= 0 && hi >= limit) {
      hi = (limit - 1) / align * align;
      if (hi <= lo || !rf_plan_items_fit(items, n, world, hi, NULL)) return -1;
      break;
    }
    if (rf_plan_items_fit(items, n, world, hi, NULL)) break;
    lo = hi;
    step *= 2;
  }
  while (hi - lo > align) {
    int64_t mid = lo + (hi - lo) / align / 2 * align;
    if (rf_plan_items_fit(items, n, world, mid, NULL))
      hi = mid;
    else
      lo = mid;
  }
  return hi;
}

int64_t rf_plan_items_min_shard_below(const struct rf_plan_item *items, int n, int world, int64_t align,
                                      int64_t limit, int64_t *offsets) {
  struct rf_plan_pairs p;
  rf_plan_pairs_init(&p, items, n, align);
  int64_t max_numel = 0;
  for (int i = 0; i < n; i++) max_numel = rf_max_i64(max_numel, items[i].numel);
  int64_t elems = rf_plan_items_elems(items, n), s = rf_plan_pairs_next(&p, align, rf_ceil_div(elems, world));
  if (s < max_numel) {
    /* Below the largest item: the smallest fitting S, range by range. */
    int64_t end = limit < 0 ? max_numel - 1 : rf_min_i64(max_numel, limit) - 1;
    int64_t f = s <= end ? rf_plan_items_first_fit(items, n, world, align, elems, s, end) : -1;
    s = f >= 0 ? f : rf_plan_pairs_next(&p, align, end + 1);
  }
  if ((limit < 0 || s < limit) && !rf_plan_items_fit(items, n, world, s, NULL)) {
    /* Here s >= every item: no item can hold a whole shard any more, so
     * feasibility is monotone in S (../shared/DESIGN.md), and every aligned S is
     * a candidate: search. Terminates: at S >= sum of numel everything fits in
     * the first shard. */
    s = rf_plan_monotone_search(items, n, world, align, s, limit);
    if (s < 0) s = limit;
  }
  rf_plan_pairs_free(&p);
  if (limit >= 0 && s >= limit) return -1;
  if (offsets) RF_ASSERT(rf_plan_items_fit(items, n, world, s, offsets));
  return s;
}

int64_t rf_plan_items_min_shard(const struct rf_plan_item *items, int n, int world, int64_t align,
                                int64_t *offsets) {
  return rf_plan_items_min_shard_below(items, n, world, align, -1, offsets);
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
