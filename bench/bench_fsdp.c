/* rf-bench: np=2,4 */
/* The runtime's ablation table: a ~100M-parameter LLaMA-shaped model (an
 * embedding, 14 blocks, a head: units of uneven sizes) trained with a synthetic
 * compute (one gemm per 2-D tensor forward, two backward, polling MPI between
 * gemms), in the planned layout (equal and ragged shards), fsdp2 and flat, and
 * the planned layout without prefetch. Per step (median of the timed steps):
 * time, exposed communication (time blocked in waits), bytes gathered, reduced,
 * copied outside collectives, cast, padding moved; and the runtime's memory per
 * rank (shard slabs + arena). Nothing is asserted. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "core/core.h"
#include "gemm/gemm.h"
#include "rfsdp_mpi.h"

#define HIDDEN 768
#define INTER 2048
#define KV 256
#define VOCAB 8191
#define BLOCKS 14
#define TOKENS 512
#define STEPS 4

struct config {
  const char *name;
  enum rf_layout layout;
  enum rf_shard_mode shard;
  int prefetch;
};

static const struct config configs[] = {
    {"planned-equal", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 1},
    {"planned-ragged", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 1},
    {"fsdp2", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, 1},
    {"flat", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, 1},
    {"planned-equal-noprefetch", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 0},
};

static void add(struct rf_fsdp *f, int u, const char *name, int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  struct rf_init init = {RF_INIT_NORMAL, 0.02f};
  if (rf_fsdp_add_tensor(f, u, name, d1 ? 2 : 1, shape, 0, init) < 0) RF_DIE("%s", rf_fsdp_error());
}

static struct rf_fsdp *build(const struct config *c) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = c->layout;
  opt.shard = c->shard;
  opt.prefetch = c->prefetch;
  struct rf_fsdp *f;
  if (rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) != 0) RF_DIE("%s", rf_fsdp_error());
  char name[96];
  add(f, rf_fsdp_add_unit(f, "embed"), "embed.weight", VOCAB, HIDDEN);
  for (int l = 0; l < BLOCKS; l++) {
    snprintf(name, sizeof name, "block%d", l);
    int u = rf_fsdp_add_unit(f, name);
    static const char *names[] = {"q", "k", "v", "o", "gate", "up", "down"};
    static const int64_t shapes[7][2] = {{HIDDEN, HIDDEN}, {KV, HIDDEN},    {KV, HIDDEN},   {HIDDEN, HIDDEN},
                                         {INTER, HIDDEN},  {INTER, HIDDEN}, {HIDDEN, INTER}};
    snprintf(name, sizeof name, "block%d.norm1", l);
    add(f, u, name, HIDDEN, 0);
    for (int i = 0; i < 7; i++) {
      snprintf(name, sizeof name, "block%d.%s", l, names[i]);
      add(f, u, name, shapes[i][0], shapes[i][1]);
    }
    snprintf(name, sizeof name, "block%d.norm2", l);
    add(f, u, name, HIDDEN, 0);
  }
  int u = rf_fsdp_add_unit(f, "head");
  add(f, u, "norm", HIDDEN, 0);
  add(f, u, "head.weight", VOCAB, HIDDEN);
  if (rf_fsdp_finalize(f) != 0) RF_DIE("%s", rf_fsdp_error());
  return f;
}

/* The synthetic compute of one unit: per 2-D tensor [out, in], forward
 * Y = X W^T; backward dX = dY W and dW += dY^T X. */
static void unit_compute(struct rf_fsdp *f, int u, int backward, float *x, float *y) {
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    if (v.unit != u || v.ndim != 2) continue;
    int out = (int)v.shape[0], in = (int)v.shape[1];
    const float *w = rf_fsdp_param(f, t);
    if (!backward) {
      struct rf_gemm_desc d = {TOKENS, out, in, 0, 1, in, in, out, RF_DTYPE_F32, 1.0f, 0.0f};
      rf_gemm_run(&d, x, w, y);
    } else {
      struct rf_gemm_desc dx = {TOKENS, in, out, 0, 0, out, in, in, RF_DTYPE_F32, 1.0f, 0.0f};
      rf_gemm_run(&dx, y, w, x);
      rf_fsdp_poll(f);
      struct rf_gemm_desc dw = {out, in, TOKENS, 1, 0, out, in, in, RF_DTYPE_F32, 1e-3f, 1.0f};
      rf_gemm_run(&dw, y, x, rf_fsdp_grad(f, t));
    }
    rf_fsdp_poll(f);
  }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double mib(uint64_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  float *x = rf_xaligned(64, (size_t)TOKENS * INTER * sizeof(float));
  float *y = rf_xaligned(64, (size_t)TOKENS * (VOCAB + 1) * sizeof(float));
  for (int64_t i = 0; i < (int64_t)TOKENS * INTER; i++) x[i] = (float)((i % 17) - 8) * 0.01f;
  memset(y, 0, (size_t)TOKENS * (VOCAB + 1) * sizeof(float));
  if (rank == 0) {
    printf("W=%d, %d tokens per rank per step, median of %d steps (time: slowest rank)\n", world, TOKENS,
           STEPS - 1);
    printf("%-25s %9s %9s %9s %9s %9s %9s %9s %8s %9s %8s\n", "layout", "step ms", "exposed%", "gath MiB",
           "red MiB", "copy MiB", "cast MiB", "pad MiB", "padding%", "mem MiB", "coll");
  }
  double ms_of[8] = {0}, copy_of[8] = {0};
  int n_configs = (int)(sizeof configs / sizeof configs[0]);
  for (int c = 0; c < n_configs; c++) {
    struct rf_fsdp *f = build(&configs[c]);
    int n = rf_fsdp_n_units(f);
    double ms[STEPS], wait[STEPS];
    struct rf_counters d = {0};
    for (int s = 0; s < STEPS; s++) {
      MPI_Barrier(MPI_COMM_WORLD);
      struct rf_counters before, after;
      rf_fsdp_get_counters(f, &before, NULL);
      uint64_t t0 = rf_time_ns();
      rf_fsdp_zero_grad(f);
      for (int u = 0; u < n; u++) {
        rf_fsdp_forward_begin(f, u);
        unit_compute(f, u, 0, x, y);
        rf_fsdp_forward_end(f, u);
      }
      for (int u = n - 1; u >= 0; u--) {
        rf_fsdp_backward_begin(f, u);
        unit_compute(f, u, 1, x, y);
        rf_fsdp_backward_end(f, u);
      }
      rf_fsdp_grads_finish(f);
      (void)rf_fsdp_grad_norm(f);
      ms[s] = (double)(rf_time_ns() - t0) / 1e6;
      rf_fsdp_get_counters(f, &after, NULL);
      d = rf_counters_diff(&after, &before);
      wait[s] = (double)d.comm_wait_ns / 1e6;
      MPI_Allreduce(MPI_IN_PLACE, &ms[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &wait[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    qsort(ms + 1, STEPS - 1, sizeof(double), cmp_double);
    qsort(wait + 1, STEPS - 1, sizeof(double), cmp_double);
    double med = ms[1 + (STEPS - 1) / 2], med_wait = wait[1 + (STEPS - 1) / 2];
    struct rf_fsdp_stats st;
    rf_fsdp_get_stats(f, &st);
    double mem = mib((uint64_t)st.shard_elems * 2 * sizeof(float) + (uint64_t)st.arena_bytes);
    ms_of[c] = med;
    copy_of[c] = mib(d.bytes_copied);
    if (rank == 0)
      printf("%-25s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.2f %8.3f %9.1f %8llu\n", configs[c].name, med,
             100.0 * med_wait / med, mib(d.bytes_gathered), mib(d.bytes_reduced), mib(d.bytes_copied),
             mib(d.bytes_cast), mib(d.bytes_padding),
             100.0 * (double)(st.padded_elems - st.param_elems) / (double)st.param_elems, mem,
             (unsigned long long)d.collectives);
    rf_fsdp_free(f);
  }
  if (rank == 0) {
    printf(
        "ratios (same run): fsdp2/planned-equal step time %.3f, flat/planned-equal %.3f, "
        "planned-ragged/planned-equal %.3f; copied MiB per step: planned %.1f, fsdp2 %.1f (model %.1f MiB "
        "f32)\n",
        ms_of[2] / ms_of[0], ms_of[3] / ms_of[0], ms_of[1] / ms_of[0], copy_of[0], copy_of[2],
        mib((uint64_t)(2 * VOCAB * HIDDEN +
                       BLOCKS * (2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN) +
                       HIDDEN) *
            sizeof(float)));
  }
  free(x);
  free(y);
  rf_comm_mpi_finalize();
  return 0;
}
