/* rf-test: np=1,2,3 timeout=30
 * src/backend's choice of a rank's GPU (issue 34): rf_device_ordinal against the rule counted
 * out by hand (local ranks 0..3*devices-1 visit devices 0..devices-1 in turn, each device
 * taken by ceil or floor of ranks/devices ranks: machines of 1, 2, 4 and 8 GPUs and several
 * ranks on one GPU), and rf_comm_mesh_local_rank under mpirun on one machine, where every
 * rank is on the node and its local rank is its world rank: flat, one rank per shard group,
 * and (W=2) a group of 2. */
#include <stdlib.h>

#include "backend/backend.h"
#include "comm/comm_mpi.h"
#include "core/core.h"
#include "rf_test.h"

static void test_rule(void) {
  static const int counts[] = {1, 2, 3, 4, 8};
  for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
    int devices = counts[c], next = 0, taken[8] = {0};
    for (int local = 0; local < 3 * devices; local++) {
      int got = rf_device_ordinal(local, devices);
      RF_CHECK(got == next, "local rank %d of %d devices: device %d, want %d", local, devices, got, next);
      taken[got]++;
      next = next + 1 == devices ? 0 : next + 1;
      if (local < devices) RF_CHECK(taken[got] == 1, "device %d shared before every device is taken", got);
    }
    for (int d = 0; d < devices; d++)
      RF_CHECK(taken[d] == 3, "device %d: %d ranks of %d", d, taken[d], 3 * devices);
  }
  /* a few by hand: one GPU, two GPUs and three ranks, eight and four GPUs */
  RF_CHECK(rf_device_ordinal(0, 1) == 0 && rf_device_ordinal(2, 1) == 0, "one GPU: every rank on 0");
  RF_CHECK(rf_device_ordinal(2, 2) == 0 && rf_device_ordinal(1, 2) == 1, "two GPUs, three ranks: 0 1 0");
  RF_CHECK(rf_device_ordinal(7, 8) == 7 && rf_device_ordinal(5, 4) == 1, "8 and 4 GPUs");
}

static void test_local_rank(MPI_Comm world) {
  int rank = 0, size = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  struct rf_comm comm;
  rf_comm_init(&comm, world);
  for (int group = 1; group <= size; group++) {
    if (size % group != 0) continue;
    struct rf_comm_mesh mesh;
    rf_comm_mesh_split(&mesh, &comm, group, 0);
    int local = rf_comm_mesh_local_rank(&mesh);
    RF_CHECK(local == rank, "W=%d groups of %d: local rank %d on rank %d (one machine)", size, group, local,
             rank);
    for (int devices = 1; devices <= 2; devices++)
      RF_CHECK(rf_device_ordinal(local, devices) == rank % devices, "rank %d of %d devices", rank, devices);
    rf_comm_mesh_free(&mesh);
  }
  rf_comm_free(&comm);
}

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  test_rule();
  test_local_rank(MPI_COMM_WORLD);
  return rf_test_finish("test_backend_ordinal");
}
