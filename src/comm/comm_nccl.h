/* src/comm's NCCL backend (BACKEND=cuda only): the table of comm.h over NCCL for
 * device memory, with an MPI communicator beside it for host memory.
 *
 * Lanes. One rf_comm of this backend has three lanes over the same ranks, each an NCCL
 * communicator with its own stream (created at the highest priority,
 * cudaStreamNonBlocking): all-gathers (and broadcasts and all-to-alls of device
 * memory) on the first, reduce-scatters on the second, all-reduces of device memory
 * (HSDP's replica all-reduce) on the third, so a reduce-scatter never queues behind the
 * next all-gather. A lane's NCCL communicator is created when the lane is first used
 * (its stream at init): a communicator split only to count a node's ranks costs MPI
 * only. RF_NCCL_ONE_LANE=1 in the environment puts every collective on one lane (one
 * communicator, one stream): the switch for bisecting a hang.
 *
 * Memory. Where a buffer lives decides the path, for every collective: device memory
 * (and NULL, an empty part) goes to NCCL, host memory (rf_comm_agree's status word, a
 * norm's partial sums, the optimizers' host buffers) to the MPI communicator (a
 * duplicate of the one given, owned); a send and a receive buffer on different sides
 * stop the job naming the collective.
 *
 * Requests: a non-blocking collective's completion is a CUDA event recorded on its
 * lane's stream after it (from a ring of events per lane: a ring slot reused while an
 * old request still refers to it marks a later point of the same stream, so waiting on
 * it waits at least as long). Inside group_begin/group_end the events are recorded at
 * group_end, after NCCL has launched the group. A blocking collective of device memory
 * waits for its lane (a host wait, counted: rf_comm_nccl_stats). The runtime never waits
 * for its requests on the host: a stream waits for the request's event and rf_comm_retire
 * lets the request go (rf_comm_wait of one is a host wait, counted in request_waits and in
 * the device's host_syncs).
 *
 * The device's waiter. A communicator made on a device makes itself (with every other live
 * one on that device) its waiter (rf_device_waiter): while the host waits for the device
 * (the CUDA device polls), each checks its asynchronous errors, and the oldest collective
 * whose event the device has not reached is put under the collective watchdog, named with
 * its request's label; so a collective that never completes still ends the job naming it,
 * from the device wait that it holds.
 *
 * Failures. Every host wait (test, wait, a blocking collective, a wait for the device)
 * polls ncclCommGetAsyncError on every lane instead of blocking in CUDA: a transport failure
 * aborts every lane (ncclCommAbort) and stops every rank naming NCCL's error, instead of
 * hanging until the watchdog. rf_comm_free finalizes each lane's communicator (its
 * queued collectives complete and report) before destroying it.
 *
 * Threads. Each entry point makes the communicator's GPU current on the calling thread
 * (cudaSetDevice, once per thread and GPU), so a thread other than the one that made
 * the device works on the right GPU.
 *
 * Ordering: stream_wait makes the lanes' streams wait for a compute event (no host
 * wait), or waits on the host for an event bound to an outside completion (an MPI
 * request); event_record records the caller's event on the request's lane.
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
 * (a CUDA device, borrowed: it must outlive the communicator); each lane's ncclUniqueId
 * is made by rank 0 and broadcast over MPI when the lane is first used. Collective.
 * Released by rf_comm_free. */
void rf_comm_nccl_init(struct rf_comm *comm, const struct rf_comm *mpi, struct rf_device *dev);

/* Since init: host waits made by blocking collectives of device memory, host waits for
 * requests of device memory (rf_comm_wait; rf_comm_retire makes none; each also counted in the
 * device's host_syncs), and NCCL communicators created (lanes first used). */
struct rf_comm_nccl_stats {
  uint64_t host_syncs;
  uint64_t request_waits;
  uint64_t communicators;
};
struct rf_comm_nccl_stats rf_comm_nccl_stats(const struct rf_comm *comm);

#endif
