/* rf-test: np=1,2,3 timeout=60
 * src/comm's ordering hooks on MPI with the host device: a collective's event
 * (rf_comm_event_record) is not reached before every rank has contributed (rank 0
 * starts late: the others' queries see 0 meanwhile), queries drive the collective to
 * its end, synchronizing waits for it; the data is then the gathered / reduced values
 * computed here; rf_comm_stream_wait after a compute event lets the collective start
 * (the host has finished the writes it sends); collectives grouped by
 * rf_comm_group_begin/end all complete. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "device/device.h"
#include "rf_test.h"

#define COUNT 1001

static struct rf_comm comm;
static struct rf_device dev;

static float value(int rank, int i) { return (float)(rank * 10000 + i) * 0.5f; }

/* An in-place all-gather whose event is polled: not reached while rank 0 sleeps. */
static void check_event_follows_collective(void) {
  int w = comm.world, r = comm.rank;
  float *buf = calloc((size_t)w * COUNT, sizeof(float));
  struct rf_comm_req req;
  rf_comm_req_init(&req, w);
  struct rf_device_event ev;
  rf_device_event_create(&dev, &ev);
  /* the compute writes this rank's part; the collective is ordered after them */
  struct rf_device_event written;
  rf_device_event_create(&dev, &written);
  for (int i = 0; i < COUNT; i++) buf[(size_t)r * COUNT + i] = value(r, i);
  rf_device_event_record(&dev, &written, NULL);
  rf_comm_stream_wait(&comm, &dev, &written);
  if (r == 0) usleep(300 * 1000);
  rf_comm_iallgather(&comm, buf, COUNT, RF_DTYPE_F32, &req);
  rf_comm_event_record(&comm, &req, &dev, &ev);
  int early = rf_device_event_query(&dev, &ev);
  /* W > 1: rank 0 started 300 ms after the others, so theirs cannot be complete yet */
  if (w > 1 && r != 0) RF_CHECK(early == 0, "rank %d: the gather's event reached before rank 0 started", r);
  if (w == 1) RF_CHECK(early == 1, "one rank: the gather is done at once");
  long polls = 0;
  while (!rf_device_event_query(&dev, &ev)) polls++;
  RF_CHECK(req.active == 0, "a reached event means a finished request (%ld polls)", polls);
  int wrong = 0;
  for (int q = 0; q < w; q++)
    for (int i = 0; i < COUNT; i++) wrong += buf[(size_t)q * COUNT + i] != value(q, i);
  RF_CHECK(wrong == 0, "gathered values after the event: %d wrong", wrong);
  rf_device_event_free(&dev, &written);
  rf_device_event_free(&dev, &ev);
  rf_comm_req_free(&req);
  free(buf);
}

/* Two reduce-scatters grouped, each with its event; synchronize waits for them. */
static void check_grouped_reduce(void) {
  int w = comm.world, r = comm.rank;
  int64_t *starts = calloc((size_t)w + 1, sizeof(int64_t));
  for (int q = 0; q < w; q++) starts[q + 1] = starts[q] + 3 + q; /* ragged */
  int64_t total = starts[w];
  float *a = calloc((size_t)w * COUNT, sizeof(float)), *b = calloc((size_t)total, sizeof(float));
  float *ra = calloc(COUNT, sizeof(float)), *rb = calloc((size_t)total, sizeof(float));
  for (int64_t i = 0; i < (int64_t)w * COUNT; i++) a[i] = (float)((r + 1) * (i % 97));
  for (int64_t i = 0; i < total; i++) b[i] = (float)((r + 1) * i);
  struct rf_comm_req reqs[2];
  struct rf_device_event evs[2];
  for (int k = 0; k < 2; k++) {
    rf_comm_req_init(&reqs[k], w);
    rf_device_event_create(&dev, &evs[k]);
  }
  rf_comm_group_begin(&comm);
  rf_comm_ireduce_scatter_block(&comm, a, ra, COUNT, RF_DTYPE_F32, &reqs[0]);
  rf_comm_ireduce_scatter(&comm, b, rb, starts, RF_DTYPE_F32, &reqs[1]);
  rf_comm_group_end(&comm);
  for (int k = 0; k < 2; k++) rf_comm_event_record(&comm, &reqs[k], &dev, &evs[k]);
  rf_device_stream_wait(&dev, NULL, &evs[1]); /* the compute stream waits: the host, on MPI */
  rf_device_event_synchronize(&dev, &evs[0]);
  RF_CHECK(reqs[0].active == 0 && reqs[1].active == 0, "both requests finished after their events");
  double ranks = (double)w * (w + 1) / 2; /* sum over ranks of (rank + 1) */
  int wrong = 0;
  for (int i = 0; i < COUNT; i++) wrong += ra[i] != (float)(ranks * (double)(((int64_t)r * COUNT + i) % 97));
  for (int64_t i = 0; i < starts[r + 1] - starts[r]; i++)
    wrong += rb[i] != (float)(ranks * (double)(starts[r] + i));
  RF_CHECK(wrong == 0, "reduced values after the events: %d wrong", wrong);
  for (int k = 0; k < 2; k++) {
    rf_device_event_free(&dev, &evs[k]);
    rf_comm_req_free(&reqs[k]);
  }
  free(starts), free(a), free(b), free(ra), free(rb);
}

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  rf_comm_init(&comm, MPI_COMM_WORLD);
  rf_device_host_init(&dev, NULL);
  RF_CHECK(comm.ops->group_begin && comm.ops->group_end && !comm.ops->stream_wait && !comm.ops->event_record,
           "MPI: group hooks present (no-ops), stream and event hooks left to comm.c's host behaviour");
  check_event_follows_collective();
  check_grouped_reduce();
  rf_device_free(&dev);
  rf_comm_free(&comm);
  return rf_test_finish("test_comm_events");
}
