/* rf-test: timeout=60
 * The planner against brute force on thousands of small random units (up to 6
 * tensors, W up to 8, mixed block sizes, alignment 1 to 4):
 *  - for every order the planner tries, its S equals the smallest S for which a
 *    search over every offset of every tensor finds a legal layout in that order;
 *  - the unit's plan is the best of those orders, never below the lower bound,
 *    and the lower bound never exceeds the global optimum (over all orders);
 *  - ragged mode: the largest shard equals the optimal split found by a DP over
 *    every sequence of legal cuts;
 *  - every plan (one buffer, several buffers, sub-padding, ragged) passes the checker;
 *  - the same on units whose tensors repeat (identical neighbours, like experts);
 *  - runs of identical items placed in one step agree with item by item.
 * Prints how often the planner's S is the global optimum over all orders. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"
#include "rf_test.h"

#define MAXT 6
#define INF INT64_MAX

/* Direct legality of offset l at shard size S: every boundary k*S strictly
 * inside the tensor is a whole number of blocks from its start. */
static int legal(int64_t l, int64_t e, int64_t g, int64_t S, int W) {
  if (l + e > (int64_t)W * S) return 0;
  for (int k = 1; k < W; k++) {
    int64_t b = k * S;
    if (b > l && b < l + e && (b - l) % g != 0) return 0;
  }
  return 1;
}

/* The smallest end over every legal offset >= p (INF if none). */
static int64_t brute_end(int64_t p, int64_t e, int64_t g, int64_t S, int W) {
  for (int64_t l = p; l + e <= (int64_t)W * S; l++)
    if (legal(l, e, g, S, W)) return l + e;
  return INF;
}

/* Order given: does some choice of offsets (tensors in that order, no overlap) fit? */
static int brute_fits_order(const struct rf_plan_item *it, const int *order, int n, int64_t S, int W) {
  int64_t p = 0;
  for (int i = 0; i < n && p != INF; i++)
    p = brute_end(p, it[order[i]].numel, it[order[i]].block_elems, S, W);
  return p != INF;
}

/* Any order: DP over subsets of the least cursor after placing the subset. */
static int brute_fits_any(const struct rf_plan_item *it, int n, int64_t S, int W) {
  int64_t best[1 << MAXT];
  best[0] = 0;
  for (int m = 1; m < (1 << n); m++) {
    best[m] = INF;
    for (int t = 0; t < n; t++) {
      if (!(m >> t & 1) || best[m ^ (1 << t)] == INF) continue;
      int64_t e = brute_end(best[m ^ (1 << t)], it[t].numel, it[t].block_elems, S, W);
      if (e < best[m]) best[m] = e;
    }
  }
  return best[(1 << n) - 1] != INF;
}

/* Ragged optimum: cuts at aligned block starts (or the end); DP over ranks. */
static int64_t brute_ragged(const struct rf_plan_item *it, int n, int W, int64_t align) {
  int64_t cuts[512];
  int nc = 0;
  int64_t off = 0;
  for (int i = 0; i < n; i++) {
    for (int64_t x = 0; x < it[i].numel; x += it[i].block_elems)
      if ((off + x) % align == 0 && (nc == 0 || cuts[nc - 1] != off + x)) cuts[nc++] = off + x;
    off += it[i].numel;
  }
  cuts[nc++] = off;
  int64_t f[512], g[512]; /* f[c]: least largest range covering [0, cuts[c]) with r ranks */
  for (int c = 0; c < nc; c++) f[c] = c == 0 ? 0 : INF;
  for (int r = 0; r < W; r++) {
    for (int c = 0; c < nc; c++) {
      g[c] = INF;
      for (int d = 0; d <= c; d++) {
        if (f[d] == INF) continue;
        int64_t v = rf_max_i64(f[d], cuts[c] - cuts[d]);
        if (v < g[c]) g[c] = v;
      }
    }
    memcpy(f, g, sizeof(int64_t) * (size_t)nc);
  }
  return f[nc - 1];
}

static int64_t rnd(uint64_t *st, int64_t lo, int64_t hi) {
  return lo + (int64_t)(rf_test_rand_u64(st) % (uint64_t)(hi - lo + 1));
}

int main(void) {
  uint64_t st = 12345;
  /* the last 5000 instances repeat tensors (MoE experts: identical neighbours) */
  int instances = 25000, optimal = 0, ordered_checks = 0;
  for (int inst = 0; inst < instances; inst++) {
    int n = (int)rnd(&st, 1, MAXT), W = (int)rnd(&st, 1, 8);
    int64_t align = rnd(&st, 1, 4);
    struct rf_plan_tensor_in tin[MAXT];
    struct rf_plan_item it[MAXT];
    char names[MAXT][16];
    for (int t = 0; t < n; t++) {
      int64_t rows = rnd(&st, 1, 8), cols = rnd(&st, 1, 5);
      int64_t brows = rnd(&st, 1, 3);
      int vec = rnd(&st, 0, 3) == 0;
      snprintf(names[t], sizeof names[t], "t%d", t);
      memset(&tin[t], 0, sizeof tin[t]);
      tin[t].name = names[t];
      if (vec) {
        tin[t].ndim = 1, tin[t].shape[0] = rows * cols, tin[t].block_elems = 1;
      } else {
        tin[t].ndim = 2, tin[t].shape[0] = rows, tin[t].shape[1] = cols, tin[t].block_elems = brows * cols;
      }
      tin[t].numel = rows * cols;
      tin[t].sub_count = 1;
      if (inst >= 20000 && t > 0 && rnd(&st, 0, 2) > 0) { /* a copy of the tensor before */
        tin[t] = tin[t - 1];
        tin[t].name = names[t];
      }
      it[t] = (struct rf_plan_item){tin[t].numel, rf_min_i64(tin[t].block_elems, tin[t].numel), t, 0, 1};
    }
    struct rf_plan_unit_in unit = {"u", n, tin};

    /* Every order the planner tries: exact against brute force for that order. */
    int perm[RF_PLAN_MAX_ORDERS * MAXT];
    int n_orders = rf_plan_orders(it, n, perm);
    int64_t best_claimed = INF;
    for (int o = 0; o < n_orders; o++) {
      struct rf_plan_item ord[MAXT];
      for (int i = 0; i < n; i++) ord[i] = it[perm[o * n + i]];
      int64_t s = rf_plan_items_min_shard(ord, n, W, align, NULL);
      int64_t b = align;
      while (!brute_fits_order(it, perm + o * n, n, b, W)) b += align;
      RF_CHECK(s == b, "instance %d order %d: planner S %lld, brute force %lld", inst, o, (long long)s,
               (long long)b);
      /* The earliest placement itself: fits at S and not at the S below (when aligned). */
      RF_CHECK(rf_plan_items_fit(ord, n, W, b, NULL), "instance %d order %d: greedy misses S %lld", inst, o,
               (long long)b);
      if (b > align)
        RF_CHECK(!rf_plan_items_fit(ord, n, W, b - align, NULL), "instance %d: fits below", inst);
      best_claimed = rf_min_i64(best_claimed, b);
      ordered_checks++;
    }
    int64_t global = align;
    while (!brute_fits_any(it, n, global, W)) global += align;
    int64_t lb = rf_plan_lower_bound(it, n, W, align);
    RF_CHECK(lb <= global, "instance %d: lower bound %lld above the optimum %lld", inst, (long long)lb,
             (long long)global);

    /* The unit plan, one buffer. */
    struct rf_plan_options opt = {W, RF_SHARD_MODE_EQUAL, align, 1, 0.0, 0};
    struct rf_plan_unit plan;
    RF_CHECK(rf_plan_unit_make(&unit, &opt, &plan) == 0, "instance %d: %s", inst, rf_error_msg());
    RF_CHECK(rf_plan_unit_check(&unit, &plan, align) == 0, "instance %d: invalid: %s", inst, rf_error_msg());
    int64_t s1 = plan.buffers[0].shard_elems;
    RF_CHECK(plan.n_buffers == 1 && s1 == best_claimed, "instance %d: S %lld, best of orders %lld", inst,
             (long long)s1, (long long)best_claimed);
    RF_CHECK(s1 >= lb && s1 >= global, "instance %d: S %lld below the bound %lld or optimum %lld", inst,
             (long long)s1, (long long)lb, (long long)global);
    RF_CHECK(plan.bound_padded_elems == W * lb, "instance %d: bound", inst);
    optimal += s1 == global;
    int64_t padded1 = plan.padded_elems;
    rf_plan_unit_free(&plan);

    /* Several buffers: valid and never worse. */
    opt.max_buffers = 4;
    RF_CHECK(rf_plan_unit_make(&unit, &opt, &plan) == 0, "instance %d: %s", inst, rf_error_msg());
    RF_CHECK(rf_plan_unit_check(&unit, &plan, align) == 0, "instance %d (K=4): invalid: %s", inst,
             rf_error_msg());
    RF_CHECK(plan.padded_elems <= padded1, "instance %d: %lld buffers pad more than one", inst,
             (long long)plan.padded_elems);
    rf_plan_unit_free(&plan);

    /* Ragged: the optimal split for model order. */
    opt.mode = RF_SHARD_MODE_RAGGED;
    RF_CHECK(rf_plan_unit_make(&unit, &opt, &plan) == 0, "instance %d: %s", inst, rf_error_msg());
    RF_CHECK(rf_plan_unit_check(&unit, &plan, align) == 0, "instance %d (ragged): invalid: %s", inst,
             rf_error_msg());
    int64_t want = brute_ragged(it, n, W, align);
    RF_CHECK(plan.buffers[0].shard_elems == want && plan.padded_elems == plan.elems,
             "instance %d: ragged largest %lld, optimum %lld", inst, (long long)plan.buffers[0].shard_elems,
             (long long)want);
    rf_plan_unit_free(&plan);

    /* Fused tensors with sub-padding allowed: valid, never worse, and gaps only when they pay. */
    for (int t = 0; t < n; t++) {
      if (tin[t].ndim == 2 && tin[t].shape[0] % 2 == 0) tin[t].sub_count = 2;
      if (tin[t].ndim == 2 && tin[t].shape[0] % 3 == 0 && rnd(&st, 0, 1)) tin[t].sub_count = 3;
    }
    opt.mode = RF_SHARD_MODE_EQUAL;
    opt.max_buffers = 1;
    RF_CHECK(rf_plan_unit_make(&unit, &opt, &plan) == 0, "instance %d: %s", inst, rf_error_msg());
    int64_t fused = plan.padded_elems;
    rf_plan_unit_free(&plan);
    opt.allow_sub_padding = 1;
    RF_CHECK(rf_plan_unit_make(&unit, &opt, &plan) == 0, "instance %d: %s", inst, rf_error_msg());
    RF_CHECK(rf_plan_unit_check(&unit, &plan, align) == 0, "instance %d (sub): invalid: %s", inst,
             rf_error_msg());
    RF_CHECK(plan.padded_elems <= fused && (!plan.used_sub_padding || plan.padded_elems < fused),
             "instance %d: sub-padding %lld vs %lld, flag %d", inst, (long long)plan.padded_elems,
             (long long)fused, plan.used_sub_padding);
    rf_plan_unit_free(&plan);
  }
  printf("test_plan_brute: %d instances, %d order checks; planner S is the global optimum in %d (%.1f%%)\n",
         instances, ordered_checks, optimal, 100.0 * optimal / instances);

  /* Runs of identical items (MoE experts): without offsets rf_plan_items_fit
   * places a run in one step (rf_plan_place_run's closed forms); with offsets it
   * places every item through the earliest placement checked above. The two
   * agree on every S, including S below, near and above the items' sizes. */
  int run_checks = 0;
  for (int inst = 0; inst < 4000; inst++) {
    struct rf_plan_item runs[64];
    int n = 0;
    if (inst % 2) runs[n++] = (struct rf_plan_item){rnd(&st, 1, 100), 1, 0, 0, 1}; /* a start off 0 */
    while (n < 56) {
      int64_t g = rnd(&st, 1, 12), e = g * rnd(&st, 1, 9) + (rnd(&st, 0, 4) == 0 ? rnd(&st, 0, g - 1) : 0);
      for (int k = (int)rnd(&st, 1, 8); k > 0 && n < 64; k--, n++)
        runs[n] = (struct rf_plan_item){e, g, n, 0, 1};
    }
    int W = (int)rnd(&st, 1, 40);
    int64_t offsets[64];
    for (int64_t S = 1; S <= 120; S++) {
      int fast = rf_plan_items_fit(runs, n, W, S, NULL), slow = rf_plan_items_fit(runs, n, W, S, offsets);
      RF_CHECK(fast == slow, "runs %d: S %lld, one step per run %d, item by item %d", inst, (long long)S,
               fast, slow);
      run_checks++;
    }
  }
  printf("test_plan_brute: %d run placements agree item by item\n", run_checks);

  /* The S search follows the earliest placement over whole ranges of S at once
   * (rf_plan_items_fit_range) instead of one S at a time: against the unpruned
   * scan, every S (a multiple of align) from align up, placed item by item, the
   * first that fits. Units like an MoE layer: a few small leading items, then
   * up to 3 kinds of expert matrix repeated (gate, up, down alternate), items
   * longer than S (one or two boundaries inside), last blocks shorter, W up to
   * 64, with and without a limit on S. */
  int range_checks = 0;
  for (int inst = 0; inst < 4000; inst++) {
    struct rf_plan_item its[48];
    int64_t offsets[48], ke[3], kg[3];
    int n = 0, kinds = (int)rnd(&st, 1, 3);
    for (int k = 0; k < kinds; k++) {
      kg[k] = rnd(&st, 1, 16);
      ke[k] = kg[k] * rnd(&st, 1, 12) + (rnd(&st, 0, 3) == 0 ? rnd(&st, 0, kg[k] - 1) : 0);
    }
    for (int k = (int)rnd(&st, 0, 4); k > 0; k--) {
      int64_t g = rnd(&st, 0, 1) ? 1 : rnd(&st, 1, 16);
      its[n] = (struct rf_plan_item){g * rnd(&st, 1, 6), g, n, 0, 1};
      n++;
    }
    for (int r = (int)rnd(&st, 1, 14); r > 0 && n + kinds <= 48; r--)
      for (int k = 0; k < kinds; k++, n++) its[n] = (struct rf_plan_item){ke[k], kg[k], n, 0, 1};
    int W = (int)rnd(&st, 1, 64);
    int64_t align = rnd(&st, 1, 8), want = align;
    while (!rf_plan_items_fit(its, n, W, want, offsets)) want += align;
    int64_t got = rf_plan_items_min_shard(its, n, W, align, NULL);
    RF_CHECK(got == want, "range search %d: S %lld, unpruned scan %lld", inst, (long long)got,
             (long long)want);
    int64_t limit = rnd(&st, 1, 2 * want);
    got = rf_plan_items_min_shard_below(its, n, W, align, limit, NULL);
    RF_CHECK(got == (want < limit ? want : -1), "range search %d below %lld: S %lld, unpruned scan %lld",
             inst, (long long)limit, (long long)got, (long long)want);
    range_checks += 2;
  }
  printf("test_plan_brute: %d range searches agree with the unpruned scan\n", range_checks);

  /* Bad input is refused with a message naming the tensor. */
  struct rf_plan_tensor_in bad = {"w", 2, {4, 0}, 0, 4, 1, 0};
  struct rf_plan_unit_in u = {"layer", 1, &bad};
  struct rf_plan_options o = {4, RF_SHARD_MODE_EQUAL, 1, 1, 0.0, 0};
  struct rf_plan_unit p;
  RF_CHECK(rf_plan_unit_make(&u, &o, &p) == -1 && strstr(rf_error_msg(), "tensor w"), "zero dim: %s",
           rf_error_msg());
  bad.shape[1] = 4, bad.numel = 16, bad.block_elems = 0;
  RF_CHECK(rf_plan_unit_make(&u, &o, &p) == -1 && strstr(rf_error_msg(), "block_elems"), "block: %s",
           rf_error_msg());
  bad.block_elems = 4, o.world = 0;
  RF_CHECK(rf_plan_unit_make(&u, &o, &p) == -1 && strstr(rf_error_msg(), "world"), "world: %s",
           rf_error_msg());
  return rf_test_finish("test_plan_brute");
}
