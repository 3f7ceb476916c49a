/* rf-bench: */
/* The planner's sweep (issue 3, "Numbers to reach"): the four shipped models at
 * 12 world sizes, block rows 1, 32 and 128, equal shards with one buffer and with
 * several buffers per unit, and ragged shards; every plan checked. Prints a
 * summary per model, the peers at 32-row blocks, one measured pass/fail line per
 * target, and writes docs/padding.png (padding against world size for rfsdp and
 * the four peers, LLaMA-3-70B, 1-row blocks) with gnuplot. Run from the repo root;
 * `bench_plan --moe` runs only the 1T-MoE plan time (issue 14). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "model/model.h"
#include "plan/plan.h"

#define N_MODELS 4
#define N_WORLDS 12
#define N_ROWS 3

static const char *models[N_MODELS] = {"llama-3-8b", "llama-3-70b", "gpt-oss-120b", "deepseek-v3"};
static const int worlds[N_WORLDS] = {8, 24, 64, 96, 128, 256, 384, 1000, 1024, 4096, 10000, 16384};
static const int64_t rows[N_ROWS] = {1, 32, 128};
#define ALIGN_ELEMS 32 /* 64 bytes of bf16 (the policy below) */
#define CHART_MODEL 1
#define CHART_ROWS 0

/* One sweep point. */
struct point {
  double one, multi, bound, ragged_imb; /* padding ratios (percent), ragged worst-unit imbalance */
  double ms_equal, ms_ragged;
  int64_t one_padded, multi_padded;
  int buffers;
  double peer[RF_PLAN_PEER_COUNT];
  int64_t peer_cut[RF_PLAN_PEER_COUNT];
};

static struct point pts[N_MODELS][N_WORLDS][N_ROWS];

/* Target counters. */
static long n_plans, n_cut, n_unaligned, n_invalid;
static long ragged_checked, ragged_block_fail, ragged_1pct_checked, ragged_1pct_fail, ragged_padding;
static double ragged_worst_excess_blocks, ragged_worst_big;

static double pct(int64_t padded, int64_t elems) { return 100.0 * (double)(padded - elems) / (double)elems; }

/* Alignment of every rank start (a start at the buffer's end is an empty range). */
static void check_aligned(const struct rf_plan_model_result *r) {
  for (int u = 0; u < r->n_units; u++)
    for (int b = 0; b < r->units[u].plan.n_buffers; b++) {
      const struct rf_plan_buffer *buf = &r->units[u].plan.buffers[b];
      for (int k = 0; k <= r->world; k++)
        if (buf->starts[k] % ALIGN_ELEMS != 0 && buf->starts[k] != buf->total_elems) n_unaligned++;
    }
}

/* Ragged targets, per unit: the largest shard exceeds the mean by at most the
 * largest block of the unit, and by at most 1% where the mean holds >= 100 blocks. */
static void check_ragged(const struct rf_plan_unit_in *units, const struct rf_plan_model_result *r) {
  for (int u = 0; u < r->n_units; u++) {
    const struct rf_plan_unit_in in = units[u];
    const struct rf_plan_tensor_in *ts = in.tensors;
    const struct rf_plan_unit *p = &r->units[u].plan;
    int64_t gmax = 1;
    for (int i = 0; i < in.n_tensors; i++)
      gmax = rf_max_i64(gmax, rf_min_i64(ts[i].block_elems, ts[i].numel));
    double mean = (double)p->elems / r->world, excess = (double)p->max_shard_elems - mean;
    ragged_padding += p->padded_elems != p->elems;
    ragged_checked++;
    if (excess > (double)gmax) ragged_block_fail++;
    if (excess / (double)gmax > ragged_worst_excess_blocks)
      ragged_worst_excess_blocks = excess / (double)gmax;
    if (mean >= 100.0 * (double)gmax) {
      ragged_1pct_checked++;
      if (excess > 0.01 * mean) ragged_1pct_fail++;
      if (excess / mean > ragged_worst_big) ragged_worst_big = excess / mean;
    }
  }
}

static int run(const struct rf_plan_unit_in *units, int n_units, int world, enum rf_shard_mode mode,
               int max_buffers, int with_peers, struct rf_plan_model_result *r) {
  /* planned layout, bf16 parameters and gradients, 64-byte alignment (the blocks are in units) */
  struct rf_plan_policy p = {.layout = RF_LAYOUT_PLANNED,
                             .shard = mode,
                             .max_buffers = max_buffers,
                             .align_bytes = 64,
                             .param_dtype = RF_DTYPE_BF16,
                             .reduce_dtype = RF_DTYPE_BF16};
  n_plans++;
  if (rf_plan_model_make(units, n_units, &p, world, with_peers, r) != 0) {
    printf("INVALID: %s\n", rf_error_msg());
    n_invalid++;
    return -1;
  }
  n_cut += r->split_blocks != 0;
  check_aligned(r);
  return 0;
}

static void pass(const char *what, int ok) { printf("%s  %s\n", ok ? "PASS" : "FAIL", what); }

/* Issue 14: the planner on a 1T-parameter MoE (configs/kimi-k2.json: 61 layers,
 * 384 routed experts each, 1.03T parameters), equal shards, 32-row blocks, bf16
 * (32-element alignment), up to 4 buffers: the whole-model plan time (identical
 * layers planned once), the median of 5 plans at each W, against the 50 ms target. */
#define MOE_REPEATS 5

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void moe_plan_time(void) {
  struct rf_model_desc m;
  if (rf_model_desc_load("configs/kimi-k2.json", &m) != 0) {
    printf("FAIL  %s\n", rf_error_msg());
    return;
  }
  static const int ws[] = {8, 64, 256, 1000, 1024, 4096, 16384};
  const struct rf_plan_policy blocks = {.block_rows = 32, .vector_block = 1};
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&m, &blocks);
  double worst = 0;
  int worst_w = 0;
  for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
    double ms[MOE_REPEATS];
    struct rf_plan_model_result r;
    int ok = 1;
    for (int k = 0; k < MOE_REPEATS && ok; k++) {
      ok = run(units, m.n_units, ws[i], RF_SHARD_MODE_EQUAL, 4, 0, &r) == 0;
      if (!ok) break;
      ms[k] = r.plan_ms;
      if (k < MOE_REPEATS - 1) rf_plan_model_result_free(&r);
    }
    if (!ok) continue;
    qsort(ms, MOE_REPEATS, sizeof ms[0], cmp_double);
    double med = ms[MOE_REPEATS / 2];
    printf(
        "      1T MoE (kimi-k2, %d units): W=%5d plan %.1f ms (median of %d; %.1f-%.1f), padding %.3f%%, %d "
        "buffers\n",
        m.n_units, ws[i], med, MOE_REPEATS, ms[0], ms[MOE_REPEATS - 1], pct(r.padded_elems, r.elems),
        r.n_buffers);
    if (med > worst) worst = med, worst_w = ws[i];
    rf_plan_model_result_free(&r);
  }
  free(units);
  char line[200];
  snprintf(line, sizeof line,
           "1T MoE (384 experts x 61 layers), equal, 32-row blocks: plan <= 50 ms at any W (worst %.1f ms at "
           "W=%d)",
           worst, worst_w);
  pass(line, worst <= 50.0);
  rf_model_desc_free(&m);
}

static void chart(void) {
  const char *dat = "build/bench/padding.dat";
  FILE *f = fopen(dat, "w");
  if (!f) {
    printf("chart: cannot write %s\n", dat);
    return;
  }
  fprintf(f, "# W rfsdp-equal rfsdp-ragged fsdp1 fsdp2 deepspeed megatron (padding %%; 0 drawn at 1e-4)\n");
  for (int w = 0; w < N_WORLDS; w++) {
    const struct point *p = &pts[CHART_MODEL][w][CHART_ROWS];
    fprintf(f, "%d %.6g %.6g", worlds[w], p->multi, 0.0);
    for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) fprintf(f, " %.6g", p->peer[k]);
    fprintf(f, "\n");
  }
  fclose(f);
  FILE *g = popen("gnuplot 2>&1", "w");
  if (!g) {
    printf("chart: gnuplot not available\n");
    return;
  }
  fprintf(g,
          "set terminal pngcairo size 900,560 font 'sans,10'\n"
          "set output 'docs/padding.png'\n"
          "set title 'Padding vs world size: %s, %lld-row blocks, bf16, 64-byte alignment'\n"
          "set logscale x\nset logscale y\nset yrange [1e-4:1000]\n"
          "set xlabel 'world size W (ranks)'\nset ylabel 'padding, %% of parameters (0 drawn at 1e-4)'\n"
          "set key outside right\nset grid\nset xrange [5:30000]\n"
          "f(x) = x > 1e-4 ? x : 1e-4\n"
          "plot '%s' u 1:(f($2)) w lp lw 2 t 'rfsdp equal (<= 4 buffers)', "
          "'' u 1:(f($3)) w lp lw 2 t 'rfsdp ragged', "
          "'' u 1:(f($4)) w lp t 'FSDP1', '' u 1:(f($5)) w lp t 'FSDP2', "
          "'' u 1:(f($6)) w lp t 'DeepSpeed ZeRO-3', '' u 1:(f($7)) w lp t 'Megatron-FSDP'\n",
          models[CHART_MODEL], (long long)rows[CHART_ROWS], dat);
  int rc = pclose(g);
  printf("chart: docs/padding.png (%s, %lld-row blocks; data %s)%s\n", models[CHART_MODEL],
         (long long)rows[CHART_ROWS], dat, rc == 0 ? "" : " FAILED");
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--moe") == 0) { /* the 1T-MoE plan time alone */
    moe_plan_time();
    return 0;
  }
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  double ms16k[N_MODELS][2] = {{0}}, worst_ms_any = 0;
  int worst_any_at = 0;
  long lb_cases = 0, lb_hit = 0, never_worse = 0, cases = 0;
  long t1pct_n = 0, t1pct_ok = 0, t2pct_n = 0, t2pct_ok = 0, t4pct_n = 0, t4pct_ok = 0;
  for (int mi = 0; mi < N_MODELS; mi++) {
    char path[64];
    snprintf(path, sizeof path, "configs/%s.json", models[mi]);
    struct rf_model_desc m;
    if (rf_model_desc_load(path, &m) != 0) {
      printf("%s\n", rf_error_msg());
      return 1;
    }
    for (int wi = 0; wi < N_WORLDS; wi++) {
      for (int ri = 0; ri < N_ROWS; ri++) {
        struct point *p = &pts[mi][wi][ri];
        struct rf_plan_model_result r1, rm, rr;
        const struct rf_plan_policy blocks = {.block_rows = rows[ri], .vector_block = 1};
        struct rf_plan_unit_in *units = rf_model_desc_plan_units(&m, &blocks);
        int ok = run(units, m.n_units, worlds[wi], RF_SHARD_MODE_EQUAL, 1, 0, &r1) == 0 &&
                 run(units, m.n_units, worlds[wi], RF_SHARD_MODE_EQUAL, 4, 1, &rm) == 0 &&
                 run(units, m.n_units, worlds[wi], RF_SHARD_MODE_RAGGED, 1, 0, &rr) == 0;
        if (!ok) {
          free(units);
          continue;
        }
        p->one = pct(r1.padded_elems, r1.elems);
        p->bound = pct(r1.bound_padded_elems, r1.elems);
        p->multi = pct(rm.padded_elems, rm.elems);
        p->one_padded = r1.padded_elems;
        p->multi_padded = rm.padded_elems;
        p->buffers = rm.n_buffers;
        p->ragged_imb = rr.imbalance;
        p->ms_equal = rm.plan_ms;
        p->ms_ragged = rr.plan_ms;
        for (int k = 0; k < RF_PLAN_PEER_COUNT; k++) {
          p->peer[k] = pct(rm.peers[k].padded_elems, rm.peers[k].elems);
          p->peer_cut[k] = rm.peers[k].split_blocks;
        }
        check_ragged(units, &rr);
        free(units);
        cases++;
        lb_cases++;
        lb_hit += p->one - p->bound <= 0.1;
        never_worse += p->multi_padded <= p->one_padded;
        int w = worlds[wi];
        if (rows[ri] == 1 && w <= 256) t1pct_n++, t1pct_ok += p->multi <= 1.0;
        if (rows[ri] == 1 && w <= 1024) t2pct_n++, t2pct_ok += p->multi <= 2.0;
        if (rows[ri] == 32 && w <= 128) t4pct_n++, t4pct_ok += p->multi <= 4.0;
        if (p->ms_equal > worst_ms_any) worst_ms_any = p->ms_equal, worst_any_at = mi * 10000 + wi * 10 + ri;
        if (r1.plan_ms > worst_ms_any) worst_ms_any = r1.plan_ms, worst_any_at = mi * 10000 + wi * 10 + ri;
        if (p->ms_ragged > worst_ms_any)
          worst_ms_any = p->ms_ragged, worst_any_at = mi * 10000 + wi * 10 + ri;
        if (w == 16384) {
          ms16k[mi][0] = p->ms_equal > ms16k[mi][0] ? p->ms_equal : ms16k[mi][0];
          ms16k[mi][1] = p->ms_ragged > ms16k[mi][1] ? p->ms_ragged : ms16k[mi][1];
          /* the one-buffer plan's time too */
          if (r1.plan_ms > ms16k[mi][0]) ms16k[mi][0] = r1.plan_ms;
        }
        rf_plan_model_result_free(&r1);
        rf_plan_model_result_free(&rm);
        rf_plan_model_result_free(&rr);
      }
    }
    /* summary for the model */
    printf(
        "\n%s (%lld parameters, %d units): equal-mode padding %% (one buffer / <=4 buffers / one-buffer "
        "bound), ragged worst-unit imbalance\n",
        models[mi], (long long)m.numel, m.n_units);
    printf("%6s", "W");
    for (int ri = 0; ri < N_ROWS; ri++)
      printf(" | %-36s", ri == 0 ? "1-row blocks" : ri == 1 ? "32-row blocks" : "128-row blocks");
    printf("\n");
    for (int wi = 0; wi < N_WORLDS; wi++) {
      printf("%6d", worlds[wi]);
      for (int ri = 0; ri < N_ROWS; ri++) {
        const struct point *p = &pts[mi][wi][ri];
        printf(" | %8.3f %8.3f %8.3f %8.4f", p->one, p->multi, p->bound, p->ragged_imb);
      }
      printf("\n");
    }
    printf("%s peers at 32-row blocks: padding %% (cut blocks)\n", models[mi]);
    printf("%6s %22s %22s %22s %22s %22s\n", "W", "rfsdp (<=4 buffers)", "fsdp1", "fsdp2", "deepspeed",
           "megatron");
    for (int wi = 0; wi < N_WORLDS; wi++) {
      const struct point *p = &pts[mi][wi][1];
      printf("%6d %13.3f (%6d)", worlds[wi], p->multi, 0);
      for (int k = 0; k < RF_PLAN_PEER_COUNT; k++)
        printf(" %11.3f (%8lld)", p->peer[k], (long long)p->peer_cut[k]);
      printf("\n");
    }
    rf_model_desc_free(&m);
  }

  printf("\ntargets (issue 3, \"Numbers to reach\"), measured over %ld sweep points, %ld plans:\n", cases,
         n_plans);
  char line[256];
  snprintf(line, sizeof line,
           "every plan valid, 0 cut blocks, starts aligned to 64 B (%ld invalid, %ld with cuts, %ld "
           "unaligned starts)",
           n_invalid, n_cut, n_unaligned);
  pass(line, n_invalid == 0 && n_cut == 0 && n_unaligned == 0);
  snprintf(line, sizeof line,
           "equal, one buffer: within 0.1 pp of the lower bound in >= 95%% of cases (%ld/%ld = %.1f%%)",
           lb_hit, lb_cases, 100.0 * (double)lb_hit / (double)lb_cases);
  pass(line, lb_hit * 100 >= 95 * lb_cases);
  snprintf(line, sizeof line, "equal, several buffers never worse than one (%ld/%ld)", never_worse, cases);
  pass(line, never_worse == cases);
  snprintf(line, sizeof line, "equal, several buffers: <= 1%% at 1-row blocks for W <= 256 (%ld/%ld)",
           t1pct_ok, t1pct_n);
  pass(line, t1pct_ok == t1pct_n);
  snprintf(line, sizeof line, "equal, several buffers: <= 2%% at 1-row blocks for W <= 1024 (%ld/%ld)",
           t2pct_ok, t2pct_n);
  pass(line, t2pct_ok == t2pct_n);
  snprintf(line, sizeof line, "equal, several buffers: <= 4%% at 32-row blocks for W <= 128 (%ld/%ld)",
           t4pct_ok, t4pct_n);
  pass(line, t4pct_ok == t4pct_n);
  snprintf(line, sizeof line, "ragged: no padding (%ld units padded of %ld)", ragged_padding, ragged_checked);
  pass(line, ragged_padding == 0);
  snprintf(line, sizeof line,
           "ragged: largest shard - mean <= the unit's largest block (%ld/%ld units fail; worst %.3f blocks)",
           ragged_block_fail, ragged_checked, ragged_worst_excess_blocks);
  pass(line, ragged_block_fail == 0);
  snprintf(line, sizeof line,
           "ragged: <= 1%% over the mean where the mean holds >= 100 blocks (%ld/%ld fail; worst %.4f%%)",
           ragged_1pct_fail, ragged_1pct_checked, 100.0 * ragged_worst_big);
  pass(line, ragged_1pct_fail == 0);
  double worst = 0;
  for (int mi = 0; mi < N_MODELS; mi++) {
    printf("      plan time at W=16384, %s: equal %.1f ms, ragged %.1f ms (CPU, worst over block rows)\n",
           models[mi], ms16k[mi][0], ms16k[mi][1]);
    for (int k = 0; k < 2; k++) worst = ms16k[mi][k] > worst ? ms16k[mi][k] : worst;
  }
  snprintf(line, sizeof line,
           "whole-model plan time at W = 16384 under 100 ms in either mode (worst %.1f ms)", worst);
  pass(line, worst < 100.0);
  printf("      slowest whole-model plan anywhere in the sweep: %.1f ms (%s, W=%d, %lld-row blocks)\n",
         worst_ms_any, models[worst_any_at / 10000], worlds[worst_any_at / 10 % 1000],
         (long long)rows[worst_any_at % 10]);
  moe_plan_time();
  /* the peers' published rules (../shared/references/peers.md, section 8) */
  double f2_8b = pts[0][7][0].peer[RF_PLAN_PEER_FSDP2], f2_oss = pts[2][5][0].peer[RF_PLAN_PEER_FSDP2];
  snprintf(line, sizeof line, "FSDP2 pads LLaMA-3-8B by about 13.5%% at W = 1000 (%.3f%%)", f2_8b);
  pass(line, f2_8b > 13.4 && f2_8b < 13.6);
  snprintf(line, sizeof line,
           "FSDP2 pads GPT-OSS-120B (128-expert tensors) by about 98%% at W = 256 (%.3f%%)", f2_oss);
  pass(line, f2_oss > 97.5 && f2_oss < 98.5);
  printf(
      "\nnot under a target (reported next to the one-buffer bound above): 32-row blocks at W > 128 and "
      "128-row blocks; equal shards then pad whenever a block outweighs a rank's fair share.\n");

  chart();
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("bench_plan: %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return 0;
}
