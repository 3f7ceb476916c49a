/* GPU test (built by make BACKEND=cuda; run on the CPU stand-in by tests/test_cuda_emu_ordinal.c at
 * W = 2, 3 with 1 and 2 emulated GPUs): each rank opens the CUDA backend's device on the GPU its
 * local rank chooses (rf_comm_mesh_local_rank, rf_device_ordinal: as rf_fsdp_create does), and
 * must hold GPU (world rank mod GPUs) -- every rank of an mpirun on one machine is on the node --
 * as the device's ordinal and as the thread's current device (cudaGetDevice), for a flat mesh and
 * for shard groups of one rank. */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "comm/comm_mpi.h"
#include "core/core.h"
#include "rf_test.h"

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  const struct rf_backend *cuda = rf_backend_find("cuda");
  RF_CHECK(cuda && cuda->devices && cuda->open, "the cuda backend lists its devices");
  int devices = cuda->devices();
  int groups[2] = {1, world};
  for (int g = 0; g < (world > 1 ? 2 : 1); g++) {
    int group = groups[g];
    struct rf_comm_mesh mesh;
    rf_comm_mesh_split(&mesh, &comm, group, 0);
    int local = rf_comm_mesh_local_rank(&mesh), ordinal = rf_device_ordinal(local, devices), current = -1;
    struct rf_device dev;
    cuda->open(&dev, ordinal, NULL);
    RF_CHECK(cudaGetDevice(&current) == cudaSuccess, "cudaGetDevice");
    RF_CHECK(dev.ordinal == comm.rank % devices && current == dev.ordinal,
             "rank %d of %d, shard groups of %d, %d GPUs: local rank %d, device %d, current %d; want %d",
             comm.rank, world, group, devices, local, dev.ordinal, current, comm.rank % devices);
    rf_device_free(&dev);
    rf_comm_mesh_free(&mesh);
  }
  if (comm.rank == 0) printf("test_device_ordinal: W=%d, %d GPU(s)\n", world, devices);
  rf_comm_free(&comm);
  return rf_test_finish("test_device_ordinal");
}
