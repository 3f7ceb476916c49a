/* src/comm's NCCL backend (BACKEND=cuda only): the table of comm.h over NCCL for
 * device memory, with an MPI communicator beside it for host memory.
 *
 * One rf_comm of this backend holds three NCCL communicators over the same ranks,
 * each with its own stream (created at the highest priority, cudaStreamNonBlocking):
 * all-gathers (and broadcasts of device memory) on the first, reduce-scatters on
 * the second, all-reduces of device memory (HSDP's replica all-reduce) on the third,
 * so a reduce-scatter never queues behind the next all-gather. Which memory a buffer
 * is in decides the path: device memory goes to NCCL, host memory (rf_comm_agree's
 * status word, a norm's partial sums, the optimizers' host buffers) to the MPI
 * communicator (a duplicate of the one given, owned).
 *
 * Requests: a non-blocking collective's completion is a CUDA event recorded on its
 * stream after it (from a ring of events per stream: a ring slot reused while an old
 * request still refers to it marks a later point of the same stream, so waiting on it
 * waits at least as long). Inside group_begin/group_end the events are recorded at
 * group_end, after NCCL has launched the group. A blocking collective of device memory
 * waits for its stream (a host wait, counted: rf_comm_nccl_stats).
 *
 * Ordering: stream_wait makes all three streams wait for a compute event (no host
 * wait); event_record records the caller's event on the request's stream.
 *
 * Ragged shards (all-gather-v, reduce-scatter-v), NCCL needing equal counts: a group
 * of one broadcast (one reduce) per rank's range, in place. All-to-all-v of device
 * memory: a group of send/receive pairs. Counting is comm.c's, as for MPI. */
#ifndef RF_COMM_NCCL_H
#define RF_COMM_NCCL_H

#include <stdint.h>

#include "comm/comm.h"
#include "device/device.h"

/* The GPU of this rank: its rank among the ranks of `mpi` on its node, modulo the
 * GPUs visible. When the node has more ranks than GPUs (tests: several ranks on one
 * GPU), sets NCCL_HOSTID to a value of its own per rank (unless the environment sets
 * it), which NCCL needs to put two ranks on one device. Collective over mpi; call it
 * before rf_device_cuda_init and rf_comm_nccl_init. Dies with "no CUDA device" when
 * there is none. */
int rf_comm_nccl_local_device(const struct rf_comm *mpi);

/* A communicator of the ranks of `mpi` (an MPI one, duplicated) on the GPU of `dev`
 * (a CUDA device, borrowed: it must outlive the communicator): the ncclUniqueIds
 * made by rank 0 and broadcast over MPI. Collective. Released by rf_comm_free. */
void rf_comm_nccl_init(struct rf_comm *comm, const struct rf_comm *mpi, struct rf_device *dev);

/* Host waits made by blocking collectives of device memory since init. */
struct rf_comm_nccl_stats {
  uint64_t host_syncs;
};
struct rf_comm_nccl_stats rf_comm_nccl_stats(const struct rf_comm *comm);

#endif
