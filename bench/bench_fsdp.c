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
#include "rfsdp_mpi.h"
#include "support.h"

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

static const struct bench_llama model = {HIDDEN, INTER, KV, VOCAB, BLOCKS, 1};

static struct rf_fsdp *build(const struct config *c) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = c->layout;
  opt.shard = c->shard;
  opt.prefetch = c->prefetch;
  struct rf_fsdp *f;
  if (rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) != 0) RF_DIE("%s", rf_fsdp_error());
  bench_llama_declare(f, &model);
  return f;
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
    double ms[STEPS], wait[STEPS];
    struct rf_counters d = {0};
    for (int s = 0; s < STEPS; s++) {
      MPI_Barrier(MPI_COMM_WORLD);
      struct rf_counters before, after;
      rf_fsdp_get_counters(f, &before, NULL);
      uint64_t t0 = rf_time_ns();
      rf_fsdp_zero_grad(f);
      bench_forward_backward(f, TOKENS, x, y);
      rf_fsdp_grads_finish(f);
      (void)rf_fsdp_grad_norm(f);
      ms[s] = (double)(rf_time_ns() - t0) / 1e6;
      rf_fsdp_get_counters(f, &after, NULL);
      d = rf_counters_diff(&after, &before);
      wait[s] = (double)d.comm_wait_ns / 1e6;
      MPI_Allreduce(MPI_IN_PLACE, &ms[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &wait[s], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    double med = bench_median(ms + 1, STEPS - 1), med_wait = bench_median(wait + 1, STEPS - 1);
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
        mib((uint64_t)bench_llama_params(&model) * sizeof(float)));
  }
  free(x);
  free(y);
  rf_comm_mpi_finalize();
  return 0;
}
