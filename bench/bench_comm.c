/* rf-bench: np=2,4
 * Collective bandwidth and communication/compute overlap over src/comm (MPI).
 *
 * Part 1: in-place all-gather (block, ragged, ragged non-blocking) and sum
 * reduce-scatter (block, ragged, ragged non-blocking: started, then waited on),
 * f32 and bf16, at 1, 4, 16 and 64 MiB (the size of the full buffer: the
 * gathered output, the reduce-scatter input). Each point is the median over
 * repetitions of the slowest rank's time. algbw = size / time; busbw = size *
 * (W-1)/W / time (the bytes each rank must move, as nccl-tests count them). The
 * ragged layout gives rank r a share proportional to W + r, not 16-byte aligned.
 *
 * Part 2: a non-blocking all-gather overlapped with a GEMM loop (src/gemm) whose length
 * is about 1.5x the blocking all-gather's time. Exposed communication = (time
 * from the start of the all-gather to the end of both) - (the same gemm loop
 * alone), the slowest rank, median over repetitions. Progress modes:
 *   poll     rf_comm_test after every gemm
 *   none     no MPI call until rf_comm_wait after the loop
 *   thread   a second thread calls rf_comm_test in a loop (busy) while the main
 *            thread computes; only when MPI provides MPI_THREAD_MULTIPLE
 *   thread-s the same thread sleeping 50 us between tests
 * Part 3 (RF_BENCH_PART=step, and only then): each collective as a training step
 * meets it, what bench/scale.sh fits the simulator's "here" profile to. Every rank
 * computes a chunk of gemms of about RF_BENCH_CHUNK_MS (default 4) ms of its own
 * CPU time (a unit's forward on configs/demo.json at W = 2..4); all-gather and
 * reduce-scatter (f32, non-blocking, block shards: src/dbuffer's equal mode) are
 * started before the chunk and polled after every gemm, then waited on (the
 * runtime's prefetch); the all-reduce (blocking: the step's scalars, HSDP's slab)
 * follows the chunk. cost = (chunk with the collective) - (the chunk alone), each
 * the median over repetitions of the slowest rank, the two interleaved so that
 * both see the same load. With more ranks than cores the chunk alone is already
 * time-shared, and the cost is what the collective adds to that: the peers'
 * time slices, spinning ranks taking the cores of computing ones.
 * RF_BENCH_GROUP=g (a divisor of W) runs each collective on groups of g ranks
 * instead of the world, every group at once next to the others' chunks: HSDP's
 * collectives on a 2 x 2 mesh (W = 4, g = 2). The groups are g consecutive
 * ranks (the shard groups), or with RF_BENCH_STRIDED=1 ranks W / g apart (the
 * replica groups: {0, 2} and {1, 3}). The chunk and its barrier stay on the world.
 * Environment: RF_BENCH_MAX_MIB (the largest size), RF_BENCH_MIN_KIB (the
 * smallest, 1 MiB unless smaller), RF_BENCH_PART=bandwidth (part 1 only) or
 * step (part 3 only), RF_BENCH_CHUNK_MS, RF_BENCH_GROUP, RF_BENCH_STRIDED.
 * Results and the command are in docs/comm.md. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "core/core.h"
#include "gemm/gemm.h"
#include "support.h"

enum { BENCH_REPS = 9, OVERLAP_REPS = 7, STEP_REPS = 9, GEMM_N = 192 };

/* Median over repetitions of the slowest rank's time (ms). Collective. */
static double median_of_max(const struct rf_comm *comm, double *ms, int reps) {
  MPI_Allreduce(MPI_IN_PLACE, ms, reps, MPI_DOUBLE, MPI_MAX, rf_comm_mpi_handle(comm));
  qsort(ms, (size_t)reps, sizeof(double), bench_cmp_double);
  return ms[reps / 2];
}

enum bench_op {
  BENCH_OP_ALLGATHER = 0,
  BENCH_OP_ALLGATHERV,
  BENCH_OP_IALLGATHERV, /* non-blocking, started then waited on: what the runtime issues */
  BENCH_OP_REDUCE_SCATTER,
  BENCH_OP_REDUCE_SCATTERV,
  BENCH_OP_IREDUCE_SCATTERV,
  BENCH_OP_COUNT
};
static const char *const bench_op_names[] = {"allgather",      "allgatherv",      "iallgatherv",
                                             "reduce_scatter", "reduce_scatterv", "ireduce_scatterv"};

/* Ragged starts over `total` elements: rank r's share proportional to W + r. */
static void ragged_starts(int64_t *starts, int world, int64_t total) {
  int64_t weight_sum = 0;
  for (int r = 0; r < world; r++) weight_sum += world + r;
  int64_t acc = 0;
  starts[0] = 0;
  for (int r = 0; r < world; r++) {
    acc += world + r;
    starts[r + 1] = total * acc / weight_sum;
  }
}

static void fill(void *buf, int64_t n, enum rf_dtype dtype, int rank) {
  if (dtype == RF_DTYPE_F32) {
    float *f = buf;
    for (int64_t i = 0; i < n; i++) f[i] = (float)((i * 7 + rank) % 101) * 0.01f;
  } else {
    uint16_t *h = buf;
    for (int64_t i = 0; i < n; i++) h[i] = rf_bf16_from_f32((float)((i * 7 + rank) % 101) * 0.01f);
  }
}

static void run_op(const struct rf_comm *comm, enum bench_op op, enum rf_dtype dtype, void *buf, void *recv,
                   int64_t count, const int64_t *starts) {
  switch (op) {
    case BENCH_OP_ALLGATHER:
      rf_comm_allgather(comm, buf, count, dtype);
      break;
    case BENCH_OP_ALLGATHERV:
      rf_comm_allgatherv(comm, buf, starts, dtype);
      break;
    case BENCH_OP_REDUCE_SCATTER:
      rf_comm_reduce_scatter_block(comm, buf, recv, count, dtype);
      break;
    case BENCH_OP_REDUCE_SCATTERV:
      rf_comm_reduce_scatter(comm, buf, recv, starts, dtype);
      break;
    case BENCH_OP_IALLGATHERV:
    case BENCH_OP_IREDUCE_SCATTERV: {
      struct rf_comm_req req;
      rf_comm_req_init(&req, comm->world);
      if (op == BENCH_OP_IALLGATHERV)
        rf_comm_iallgatherv(comm, buf, starts, dtype, &req);
      else
        rf_comm_ireduce_scatter(comm, buf, recv, starts, dtype, &req);
      rf_comm_wait(&req);
      rf_comm_req_free(&req);
      break;
    }
    case BENCH_OP_COUNT:
      break;
  }
}

static void bench_bandwidth(const struct rf_comm *comm, int64_t min_bytes, int64_t max_bytes) {
  const int world = comm->world;
  char *buf = rf_xaligned(64, (size_t)max_bytes);
  char *recv = rf_xaligned(64, (size_t)max_bytes);
  int64_t *starts = rf_xmalloc((size_t)(world + 1) * sizeof(int64_t));
  if (comm->rank == 0) {
    printf("collective bandwidth, W=%d (median over reps of the slowest rank; size = full buffer)\n", world);
    printf("%10s  %-17s %-5s %10s %12s %12s %5s\n", "size", "op", "dtype", "ms", "algbw GB/s", "busbw GB/s",
           "reps");
  }
  const enum rf_dtype dtypes[2] = {RF_DTYPE_F32, RF_DTYPE_BF16};
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    for (int op = 0; op < BENCH_OP_COUNT; op++) {
      for (int d = 0; d < 2; d++) {
        enum rf_dtype dtype = dtypes[d];
        int64_t esize = (int64_t)rf_dtype_size(dtype);
        int64_t count = bytes / esize / world; /* per rank, block ops */
        int64_t total =
            (op == BENCH_OP_ALLGATHER || op == BENCH_OP_REDUCE_SCATTER) ? count * world : bytes / esize;
        ragged_starts(starts, world, total);
        fill(buf, total, dtype, comm->rank);
        /* Warm-up, which also sets the repetitions: at most BENCH_REPS, about 2 s. */
        rf_comm_barrier(comm);
        uint64_t w0 = rf_time_ns();
        run_op(comm, (enum bench_op)op, dtype, buf, recv, count, starts);
        double warm_ms = (double)(rf_time_ns() - w0) / 1e6;
        MPI_Allreduce(MPI_IN_PLACE, &warm_ms, 1, MPI_DOUBLE, MPI_MAX, rf_comm_mpi_handle(comm));
        int reps = warm_ms > 0 ? (int)(2000.0 / warm_ms) : BENCH_REPS;
        reps = reps < 3 ? 3 : reps > BENCH_REPS ? BENCH_REPS : reps;
        double ms[BENCH_REPS];
        for (int rep = 0; rep < reps; rep++) {
          rf_comm_barrier(comm);
          uint64_t t0 = rf_time_ns();
          run_op(comm, (enum bench_op)op, dtype, buf, recv, count, starts);
          ms[rep] = (double)(rf_time_ns() - t0) / 1e6;
        }
        double med = median_of_max(comm, ms, reps);
        double size = (double)(total * esize);
        double algbw = size / (med * 1e-3) / 1e9;
        double busbw = algbw * (double)(world - 1) / (double)world;
        int mib = size >= (1 << 20);
        if (comm->rank == 0)
          printf("%7.0f %s  %-17s %-5s %10.3f %12.2f %12.2f %5d\n", size / (mib ? 1 << 20 : 1 << 10),
                 mib ? "MiB" : "KiB", bench_op_names[op], rf_dtype_name(dtype), med, algbw, busbw, reps);
      }
    }
  }
  free(starts);
  free(recv);
  free(buf);
}

/* The progress thread of mode `thread`: tests the request until it finishes. */
struct progress_arg {
  struct rf_comm_req *req; /* borrowed */
  int sleep_us;            /* 0: busy loop */
  atomic_int done;
  long tests;
};

static void *progress_main(void *p) {
  struct progress_arg *arg = p;
  while (!rf_comm_test(arg->req)) {
    arg->tests++;
    if (arg->sleep_us > 0) {
      struct timespec ts = {0, (long)arg->sleep_us * 1000L};
      nanosleep(&ts, NULL);
    }
  }
  atomic_store(&arg->done, 1);
  return NULL;
}

static void gemm(const float *a, const float *b, float *c) {
  /* c = a b + c (the former 0.5 c + a b keeps its cost; values do not matter) */
  struct rf_gemm_desc d = {GEMM_N, GEMM_N, GEMM_N, 0, 0, GEMM_N, GEMM_N, GEMM_N, RF_DTYPE_F32, 1.0f, 1.0f};
  rf_gemm_run(&d, a, b, c);
}

enum overlap_mode {
  OVERLAP_MODE_POLL = 0,
  OVERLAP_MODE_NONE,
  OVERLAP_MODE_THREAD,
  OVERLAP_MODE_THREAD_SLEEP
};
static const char *const overlap_mode_names[] = {"poll", "none", "thread", "thread-s"};

static void bench_overlap(const struct rf_comm *comm, int64_t bytes) {
  const int world = comm->world;
  const int64_t count = bytes / 4 / world;
  float *buf = rf_xaligned(64, (size_t)(count * world) * sizeof(float));
  fill(buf, count * world, RF_DTYPE_F32, comm->rank);
  const size_t mat = (size_t)GEMM_N * GEMM_N;
  float *a = rf_xaligned(64, mat * sizeof(float));
  float *b = rf_xaligned(64, mat * sizeof(float));
  float *c = rf_xaligned(64, mat * sizeof(float));
  for (size_t i = 0; i < mat; i++) {
    a[i] = (float)(i % 17) * 0.01f;
    b[i] = (float)(i % 13) * 0.01f;
    c[i] = 0.0f;
  }

  /* Calibrate: the blocking all-gather alone and one gemm alone. */
  double ms_comm[OVERLAP_REPS], ms_gemm[OVERLAP_REPS];
  gemm(a, b, c);
  rf_comm_allgather(comm, buf, count, RF_DTYPE_F32);
  for (int rep = 0; rep < OVERLAP_REPS; rep++) {
    rf_comm_barrier(comm);
    uint64_t t0 = rf_time_ns();
    rf_comm_allgather(comm, buf, count, RF_DTYPE_F32);
    ms_comm[rep] = (double)(rf_time_ns() - t0) / 1e6;
    t0 = rf_time_ns();
    for (int k = 0; k < 8; k++) gemm(a, b, c);
    ms_gemm[rep] = (double)(rf_time_ns() - t0) / 1e6 / 8.0;
  }
  double t_comm = median_of_max(comm, ms_comm, OVERLAP_REPS);
  double t_gemm = median_of_max(comm, ms_gemm, OVERLAP_REPS);
  int n_gemm = (int)(1.5 * t_comm / t_gemm) + 1;

  /* The gemm loop alone, same length (per rank). */
  double ms_alone[OVERLAP_REPS];
  for (int rep = 0; rep < OVERLAP_REPS; rep++) {
    rf_comm_barrier(comm);
    uint64_t t0 = rf_time_ns();
    for (int k = 0; k < n_gemm; k++) gemm(a, b, c);
    ms_alone[rep] = (double)(rf_time_ns() - t0) / 1e6;
  }
  qsort(ms_alone, OVERLAP_REPS, sizeof(double), bench_cmp_double);
  double t_alone = ms_alone[OVERLAP_REPS / 2]; /* this rank's */
  double t_alone_max = t_alone;
  MPI_Allreduce(MPI_IN_PLACE, &t_alone_max, 1, MPI_DOUBLE, MPI_MAX, rf_comm_mpi_handle(comm));

  if (comm->rank == 0) {
    printf(
        "\noverlap: non-blocking all-gather of %lld MiB f32, W=%d, with %d x sgemm %d^3 "
        "(thread level %s)\n",
        (long long)(bytes >> 20), world, n_gemm, GEMM_N,
        comm->thread_multiple ? "MPI_THREAD_MULTIPLE" : "below MULTIPLE");
    printf("  blocking all-gather alone %.2f ms; gemm loop alone %.2f ms (%.3f ms per gemm)\n", t_comm,
           t_alone_max, t_gemm);
    printf("  %-9s %10s %14s %14s %10s\n", "mode", "total ms", "exposed ms", "exposed/comm", "tests");
  }

  struct rf_comm_req req;
  rf_comm_req_init(&req, world);
  for (int mode = 0; mode < 4; mode++) {
    int threaded = mode == OVERLAP_MODE_THREAD || mode == OVERLAP_MODE_THREAD_SLEEP;
    if (threaded && !comm->thread_multiple) {
      if (comm->rank == 0)
        printf("  %-9s skipped: MPI does not provide MPI_THREAD_MULTIPLE\n", overlap_mode_names[mode]);
      continue;
    }
    double exposed[OVERLAP_REPS], total[OVERLAP_REPS];
    long tests = 0;
    for (int rep = 0; rep < OVERLAP_REPS; rep++) {
      rf_comm_barrier(comm);
      uint64_t t0 = rf_time_ns();
      rf_comm_iallgather(comm, buf, count, RF_DTYPE_F32, &req);
      if (!threaded) {
        for (int k = 0; k < n_gemm; k++) {
          gemm(a, b, c);
          if (mode == OVERLAP_MODE_POLL) {
            rf_comm_test(&req);
            tests++;
          }
        }
        rf_comm_wait(&req);
      } else {
        struct progress_arg arg = {.req = &req, .sleep_us = mode == OVERLAP_MODE_THREAD_SLEEP ? 50 : 0};
        atomic_init(&arg.done, 0);
        pthread_t th;
        if (pthread_create(&th, NULL, progress_main, &arg) != 0) RF_DIE("pthread_create failed");
        for (int k = 0; k < n_gemm; k++) gemm(a, b, c);
        if (pthread_join(th, NULL) != 0) RF_DIE("pthread_join failed");
        tests += arg.tests;
      }
      total[rep] = (double)(rf_time_ns() - t0) / 1e6;
      exposed[rep] = total[rep] - t_alone;
    }
    double med_total = median_of_max(comm, total, OVERLAP_REPS);
    double med_exposed = median_of_max(comm, exposed, OVERLAP_REPS);
    if (comm->rank == 0)
      printf("  %-9s %10.2f %14.2f %14.2f %10ld\n", overlap_mode_names[mode], med_total, med_exposed,
             med_exposed / t_comm, tests / OVERLAP_REPS);
  }
  rf_comm_req_free(&req);
  if (c[0] != c[0]) printf("nan\n"); /* keep the gemm results live */
  free(c);
  free(b);
  free(a);
  free(buf);
}

/* This thread's CPU time (ms): the gemm chunk is sized by it, whatever the load. */
static double thread_cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

enum step_op { STEP_OP_ALLGATHER = 0, STEP_OP_REDUCE_SCATTER, STEP_OP_ALLREDUCE, STEP_OP_COUNT };
static const char *const step_op_names[] = {"step_allgather", "step_reduce_scatter", "step_allreduce"};

/* One repetition of part 3: the chunk of n gemms after a barrier on the world,
 * with collective `op` on `count` f32 per rank of the group `comm` (op < 0:
 * alone). Wall ms of this rank. */
static double step_rep(const struct rf_comm *world, const struct rf_comm *comm, int op, float *buf,
                       float *recv, int64_t count, int n, const float *a, const float *b, float *c,
                       struct rf_comm_req *req) {
  rf_comm_barrier(world);
  uint64_t t0 = rf_time_ns();
  if (op == STEP_OP_ALLGATHER) rf_comm_iallgather(comm, buf, count, RF_DTYPE_F32, req);
  if (op == STEP_OP_REDUCE_SCATTER) rf_comm_ireduce_scatter_block(comm, buf, recv, count, RF_DTYPE_F32, req);
  int pending = op == STEP_OP_ALLGATHER || op == STEP_OP_REDUCE_SCATTER;
  for (int k = 0; k < n; k++) {
    gemm(a, b, c);
    if (pending) rf_comm_test(req);
  }
  if (pending) rf_comm_wait(req);
  if (op == STEP_OP_ALLREDUCE)
    rf_comm_allreduce(comm, buf, count * comm->world, RF_DTYPE_F32, RF_REDUCE_OP_SUM);
  return (double)(rf_time_ns() - t0) / 1e6;
}

/* Part 3 on the world `wc`, each collective on the group `comm` (the world, or
 * one of the concurrent groups of RF_BENCH_GROUP; `layout` names them). */
static void bench_step(const struct rf_comm *wc, const struct rf_comm *comm, const char *layout,
                       int64_t min_bytes, int64_t max_bytes, double chunk_ms) {
  const int world = comm->world;
  float *buf = rf_xaligned(64, (size_t)max_bytes);
  float *recv = rf_xaligned(64, (size_t)max_bytes);
  const size_t mat = (size_t)GEMM_N * GEMM_N;
  float *a = rf_xaligned(64, mat * sizeof(float)), *b = rf_xaligned(64, mat * sizeof(float));
  float *c = rf_xaligned(64, mat * sizeof(float));
  for (size_t i = 0; i < mat; i++) {
    a[i] = (float)(i % 17) * 0.01f;
    b[i] = (float)(i % 13) * 0.01f;
    c[i] = 0.0f;
  }
  /* the chunk: gemms of chunk_ms of CPU time, the slowest rank's gemm setting n on every rank */
  gemm(a, b, c);
  double g0 = thread_cpu_ms();
  for (int k = 0; k < 16; k++) gemm(a, b, c);
  double per_gemm = (thread_cpu_ms() - g0) / 16;
  MPI_Allreduce(MPI_IN_PLACE, &per_gemm, 1, MPI_DOUBLE, MPI_MAX, rf_comm_mpi_handle(wc));
  int n = (int)(chunk_ms / per_gemm + 0.5);
  n = n < 1 ? 1 : n;
  if (wc->rank == 0) {
    printf(
        "\ncollectives inside a step, W=%d, groups of %d (%s): a chunk of %d x sgemm %d^3 (%.2f ms of CPU "
        "time) per collective;\n",
        wc->world, world, layout, n, GEMM_N, n * per_gemm);
    printf(
        "cost = chunk with the collective - chunk alone (medians over reps of the slowest rank; size = full "
        "buffer)\n");
    printf("%10s  %-20s %-5s %10s %12s %12s %5s\n", "size", "op", "dtype", "cost ms", "alone ms", "with ms",
           "reps");
  }
  struct rf_comm_req req;
  rf_comm_req_init(&req, world);
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    int64_t count = bytes / (int64_t)sizeof(float) / world;
    fill(buf, count * world, RF_DTYPE_F32, comm->rank);
    for (int op = 0; op < STEP_OP_COUNT; op++) {
      double alone[STEP_REPS], with[STEP_REPS];
      step_rep(wc, comm, op, buf, recv, count, n, a, b, c, &req); /* warm-up */
      for (int rep = 0; rep < STEP_REPS; rep++) {
        alone[rep] = step_rep(wc, comm, -1, buf, recv, count, n, a, b, c, &req);
        with[rep] = step_rep(wc, comm, op, buf, recv, count, n, a, b, c, &req);
      }
      double t_alone = median_of_max(wc, alone, STEP_REPS), t_with = median_of_max(wc, with, STEP_REPS);
      double size = (double)(count * world) * (double)sizeof(float);
      int mib = size >= (1 << 20);
      if (wc->rank == 0)
        printf("%7.0f %s  %-20s %-5s %10.3f %12.3f %12.3f %5d\n", size / (mib ? 1 << 20 : 1 << 10),
               mib ? "MiB" : "KiB", step_op_names[op], "f32", t_with - t_alone, t_alone, t_with, STEP_REPS);
    }
  }
  rf_comm_req_free(&req);
  if (c[0] != c[0]) printf("nan\n"); /* keep the gemm results live */
  free(c);
  free(b);
  free(a);
  free(recv);
  free(buf);
}

/* The machine's load average (1 minute), or -1: numbers on a shared machine
 * mean little when it is above the core count. */
static double load_average(void) {
  double load = -1.0;
  FILE *f = fopen("/proc/loadavg", "r");
  if (f) {
    if (fscanf(f, "%lf", &load) != 1) load = -1.0;
    fclose(f);
  }
  return load;
}

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  if (comm.rank == 0)
    printf("load average %.2f, %ld cores online\n", load_average(), sysconf(_SC_NPROCESSORS_ONLN));
  int64_t max_bytes = (int64_t)64 << 20;
  const char *env = getenv("RF_BENCH_MAX_MIB"); /* for quick runs: the largest size */
  if (env && atoll(env) > 0 && ((int64_t)atoll(env) << 20) < max_bytes) max_bytes = (int64_t)atoll(env) << 20;
  /* the smallest size (bench/scale.sh fits the collectives' latency from 16 KiB up) */
  int64_t min_bytes = (int64_t)1 << 20;
  env = getenv("RF_BENCH_MIN_KIB");
  if (env && atoll(env) > 0 && ((int64_t)atoll(env) << 10) < min_bytes) min_bytes = (int64_t)atoll(env) << 10;
  const char *part = getenv("RF_BENCH_PART"); /* "bandwidth": only part 1; "step": only part 3 */
  if (part && strcmp(part, "step") == 0) {
    env = getenv("RF_BENCH_CHUNK_MS");
    double chunk_ms = env && atof(env) > 0 ? atof(env) : 4.0;
    env = getenv("RF_BENCH_GROUP");
    int g = env && atoi(env) > 0 ? atoi(env) : comm.world;
    if (comm.world % g != 0) RF_DIE("RF_BENCH_GROUP=%d does not divide the %d ranks", g, comm.world);
    env = getenv("RF_BENCH_STRIDED");
    int strided = env && atoi(env) != 0;
    MPI_Comm split;
    MPI_Comm_split(rf_comm_mpi_handle(&comm), strided ? comm.rank % (comm.world / g) : comm.rank / g,
                   comm.rank, &split);
    struct rf_comm group;
    rf_comm_init(&group, split);
    MPI_Comm_free(&split);
    bench_step(&comm, &group,
               g == comm.world ? "the world"
               : strided       ? "strided"
                               : "consecutive",
               min_bytes, max_bytes, chunk_ms);
    rf_comm_free(&group);
  } else {
    bench_bandwidth(&comm, min_bytes, max_bytes);
    if (!part || strcmp(part, "bandwidth") != 0) {
      bench_overlap(&comm, max_bytes / 4);
      bench_overlap(&comm, max_bytes);
    }
  }
  if (comm.rank == 0) printf("load average %.2f at the end\n", load_average());
  rf_comm_free(&comm);
  rf_comm_mpi_finalize();
  return 0;
}
