/* rf-bench: np=4 */
/* HSDP's replica all-reduce, overlapped with the backward against at its end
 * (issue 27 item 4): a LLaMA-shaped model (an embedding, 6 blocks, a head) on a
 * 2 x 2 mesh of this machine (shard groups of 2 consecutive ranks, replicas
 * across them: shared memory, no shaped link), the synthetic compute of
 * bench_fsdp (gemms, polling between them). "end": every unit's all-reduce across
 * the replicas starts in rf_fsdp_grads_finish after the whole backward (the
 * blocking slab all-reduce before this change, cut per unit); "overlap":
 * rf_fsdp_set_last_micro_batch, each unit's all-reduce starts once its
 * reduce-scatter is finished and runs under the backward of the units below.
 * Per step (median of the timed steps, slowest rank): the step time, the exposed
 * communication (time blocked in collectives and waits), and the time in
 * rf_fsdp_grads_finish (where the all-reduces not yet done are waited for). The
 * two modes alternate step by step, so both see the same machine. Nothing is
 * asserted. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "core/core.h"
#include "rfsdp.h"
#include "support.h"

#define HIDDEN 512
#define INTER 1376
#define KV 256
#define VOCAB 4096
#define BLOCKS 6
#define TOKENS 128
#define STEPS 9 /* per mode; the first is not timed */

static struct rf_fsdp *build(MPI_Comm shard, MPI_Comm replicate) {
  static const struct bench_llama model = {HIDDEN, INTER, KV, VOCAB, BLOCKS, 0};
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  /* RF_BENCH_REDUCE_DTYPE=bf16: the reduce-scatters and the replica all-reduce in bf16 */
  const char *rd = getenv("RF_BENCH_REDUCE_DTYPE");
  if (rd && strcmp(rd, "bf16") == 0) opt.reduce_dtype = RF_DTYPE_BF16;
  struct rf_fsdp *f;
  if (rf_fsdp_create_mesh(&f, shard, replicate, &opt) != 0) RF_DIE("%s", rf_fsdp_error());
  bench_llama_declare(f, &model);
  return f;
}

static double max_over_ranks(double v) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return v;
}

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world % 2 != 0) {
    if (rank == 0) printf("bench_hsdp: needs an even world (shard groups of 2), not %d\n", world);
    rf_comm_mpi_finalize();
    return 0;
  }
  MPI_Comm shard, replicate;
  MPI_Comm_split(MPI_COMM_WORLD, rank / 2, rank, &shard);
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &replicate);
  float *x = rf_xaligned(64, (size_t)TOKENS * INTER * sizeof(float));
  float *y = rf_xaligned(64, (size_t)TOKENS * VOCAB * sizeof(float));
  for (int64_t i = 0; i < (int64_t)TOKENS * INTER; i++) x[i] = (float)((i % 17) - 8) * 0.01f;
  memset(y, 0, (size_t)TOKENS * VOCAB * sizeof(float));
  struct rf_fsdp *f = build(shard, replicate);
  double ms[2][STEPS], wait[2][STEPS], fin[2][STEPS];
  uint64_t inter[2] = {0, 0};
  for (int s = 0; s < 2 * STEPS; s++) {
    int overlap = s % 2, k = s / 2;
    MPI_Barrier(MPI_COMM_WORLD);
    struct rf_counters before = *rf_fsdp_counters(f);
    uint64_t t0 = rf_time_ns();
    rf_fsdp_zero_grad(f);
    if (overlap) rf_fsdp_set_last_micro_batch(f);
    bench_forward_backward(f, TOKENS, x, y);
    uint64_t t1 = rf_time_ns();
    rf_fsdp_grads_finish(f);
    uint64_t t2 = rf_time_ns();
    struct rf_counters d = rf_counters_diff(rf_fsdp_counters(f), &before);
    ms[overlap][k] = max_over_ranks((double)(t2 - t0) / 1e6);
    wait[overlap][k] = max_over_ranks((double)d.comm_wait_ns / 1e6);
    fin[overlap][k] = max_over_ranks((double)(t2 - t1) / 1e6);
    inter[overlap] = d.bytes_inter;
  }
  struct rf_fsdp_stats st;
  rf_fsdp_get_stats(f, &st);
  if (rank == 0) {
    static const char *mode[2] = {"end", "overlap"};
    printf(
        "HSDP %d x 2 on this machine (shared memory), %.1fM parameters, %d tokens per rank per step, median "
        "of %d steps per mode (alternating), slowest rank\n",
        world / 2, (double)st.param_elems / 1e6, TOKENS, STEPS - 1);
    printf("%-8s %9s %12s %16s %12s\n", "mode", "step ms", "exposed ms", "grads_finish ms", "inter MiB");
    double med[2][3];
    for (int o = 0; o < 2; o++) {
      med[o][0] = bench_median(ms[o] + 1, STEPS - 1);
      med[o][1] = bench_median(wait[o] + 1, STEPS - 1);
      med[o][2] = bench_median(fin[o] + 1, STEPS - 1);
      printf("%-8s %9.1f %12.1f %16.1f %12.2f\n", mode[o], med[o][0], med[o][1], med[o][2],
             (double)inter[o] / (1024.0 * 1024.0));
    }
    printf("overlap/end (same run): exposed communication %.3f, grads_finish %.3f, step time %.3f\n",
           med[1][1] / med[0][1], med[1][2] / med[0][2], med[1][0] / med[0][0]);
  }
  rf_fsdp_free(f);
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
  free(x);
  free(y);
  rf_comm_mpi_finalize();
  return 0;
}
