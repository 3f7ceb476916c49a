/* rf-test: np=2,3 timeout=60
 * A non-blocking all-gather of 8 MiB completes while the ranks compute, driven by
 * rf_comm_test between chunks of compute (MPI progresses only inside MPI calls).
 * Asserts that it finished within the compute loop (no final wait needed) and
 * that every slot holds the right rank's data; prints the number of polls. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "rf_test.h"

static float value_of(int rank, int64_t i) { return (float)rank * 1e6f + (float)(i % 999983); }

/* About 20 microseconds of arithmetic that the compiler cannot drop. */
static double compute_chunk(float *x, int n) {
  double acc = 0.0;
  for (int rep = 0; rep < 8; rep++)
    for (int i = 0; i < n; i++) {
      x[i] = x[i] * 0.999f + 0.001f;
      acc += x[i];
    }
  return acc;
}

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  const int64_t total = (8 << 20) / 4; /* 8 MiB of f32 in the full buffer */
  int64_t count = total / world;
  float *buf = rf_xmalloc((size_t)(count * world) * sizeof(float));
  for (int64_t i = 0; i < count * world; i++) buf[i] = -1.0f;
  for (int64_t i = 0; i < count; i++) buf[comm.rank * count + i] = value_of(comm.rank, comm.rank * count + i);
  float work[1024];
  for (int i = 0; i < 1024; i++) work[i] = (float)i;

  struct rf_comm_req req;
  rf_comm_req_init(&req, world);
  rf_comm_barrier(&comm);
  uint64_t t0 = rf_time_ns();
  rf_comm_iallgather(&comm, buf, count, RF_DTYPE_F32, &req);
  const long max_polls = 2000000;
  long polls = 0;
  double sink = 0.0;
  int done = 0;
  while (!done && polls < max_polls) {
    sink += compute_chunk(work, 1024);
    polls++;
    done = rf_comm_test(&req);
  }
  double ms = (double)(rf_time_ns() - t0) / 1e6;
  RF_CHECK(done, "the all-gather did not finish within %ld polls", max_polls);
  rf_comm_wait(&req);
  rf_comm_req_free(&req);

  long bad = 0;
  for (int64_t i = 0; i < count * world; i++) bad += buf[i] != value_of((int)(i / count), i);
  RF_CHECK(bad == 0, "%ld wrong elements after the all-gather", bad);
  RF_CHECK(sink != 0.0, "compute ran");

  long max_polls_seen = polls;
  MPI_Allreduce(MPI_IN_PLACE, &max_polls_seen, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
  if (comm.rank == 0)
    printf("iallgather of %lld bytes at W=%d: finished after %ld polls (max over ranks %ld), %.2f ms\n",
           (long long)(count * world * 4), world, polls, max_polls_seen, ms);
  free(buf);
  rf_comm_free(&comm);
  return rf_test_finish("test_comm_progress");
}
