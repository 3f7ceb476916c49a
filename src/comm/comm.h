/* src/comm: collectives on flat buffers behind a small table of operations, so
 * that the runtime, the DBuffer and the optimizers never see the library that
 * moves the bytes. Element counts are int64, element types rf_dtype.
 *
 * Backends. struct rf_comm_ops is the table one backend fills: MPI today
 * (comm_mpi.c, constructed by rf_comm_init in comm/comm_mpi.h, the only header
 * that names MPI types); the NCCL backend (comm_nccl.c, comm_nccl.h; make
 * BACKEND=cuda only) fills the same table for device memory. Errors inside a backend stop every rank (rf_die)
 * with the backend's description, the file and the line.
 *
 * This file's functions (comm.c) are the one place that counts: every collective
 * adds to the communicator's counters (rf_comm.counters: the runtime context's,
 * set when the context takes the mesh; NULL counts nowhere): collectives (+1 per call, blocking or started),
 * bytes_gathered (bytes received from other ranks), bytes_reduced (input bytes
 * destined to other ranks; the whole buffer for an all-reduce when world > 1),
 * bytes_alltoall (bytes sent to other ranks), comm_wait_ns (time in blocking
 * collectives and in rf_comm_wait). Each byte counted in the three byte counters
 * is also counted in bytes_inter when the communicator has across_groups set (a
 * mesh's replicate group of more than one rank; a program's world communicator
 * under HSDP), else in bytes_intra.
 *
 * Progress: MPI advances a non-blocking collective only inside MPI calls (no
 * progress thread here), so whoever overlaps compute polls rf_comm_test between
 * kernels (or queries the request's event: rf_comm_event_record binds it to the
 * request on MPI).
 *
 * Ordering against compute (src/device): rf_comm_stream_wait orders the next
 * collectives after an event recorded on a compute stream, rf_comm_event_record
 * gives an event that is reached when a non-blocking collective has finished, and
 * rf_comm_group_begin/end batch the collectives between them into one launch. A
 * device backend (NCCL) fills the table's hooks: its collectives run on its own
 * stream, which waits on the compute event, and record their event there. MPI leaves
 * them empty, and comm.c does the host's equivalent: the host waits for the compute
 * event (on the host device it is reached when recorded: no wait), and the event of a
 * collective is bound to the request's test and wait, so querying it polls MPI.
 *
 * Element types: f32, f64, i32, i64, u8 for every collective; bf16 for
 * all-gather, reduce-scatter and all-reduce (sum, max, min in f32 arithmetic,
 * rounded to nearest even); fp8e4m3 is moved as bytes and never reduced. */
#ifndef RF_COMM_H
#define RF_COMM_H

#include <stdint.h>

#include "core/core.h"
#include "device/device.h"
#include "rfsdp.h" /* enum rf_reduce_op; rf_comm_bcast, rf_comm_allreduce and the watchdog's entry points */

struct rf_comm;
struct rf_comm_ops;

/* A non-blocking collective in flight. Owns the per-peer count arrays a backend
 * needs while it runs (MPI: int counts and displacements); filled by rf_comm_i*,
 * finished by test/wait. Must stay at a fixed address while in flight. */
struct rf_comm_req {
  _Alignas(16) unsigned char handle[16]; /* the backend's request object (MPI_Request), opaque here */
  const struct rf_comm_ops *ops;         /* the backend it was started on (borrowed, static) */
  int active;
  int *counts;      /* owned, world entries */
  int *displs;      /* owned, world entries */
  int *recv_counts; /* owned, world entries: the receive side of an all-to-all-v */
  int *recv_displs; /* owned, world entries */
  int capacity;
  uint64_t bytes;               /* counted into its communicator's counters when started */
  struct rf_counters *counters; /* borrowed: its communicator's, where the wait's time counts */
  const char *collective;       /* what was started (static), for the watchdog */
  const char *label;            /* borrowed, optional: whose request (the runtime: the unit's name) */
  /* the timeline (src/core/trace.h), set by rf_comm_req_trace after the start: the lane, the unit and the
   * issue time of the span its completion records; trace_t0 0: not traced */
  int trace_lane, trace_unit;
  uint64_t trace_t0;
};

/* What one backend does. `starts` arrays have world + 1 element offsets (rank r's
 * range is [starts[r], starts[r+1]), starts[0] = 0). `req` NULL: the blocking
 * collective; else the non-blocking one, started into req (finished by test/wait).
 * The table does no counting and no argument checks beyond its own limits: comm.c
 * does both, once, for every backend. */
struct rf_comm_ops {
  const char *name;
  void (*free)(struct rf_comm *comm);
  void (*barrier)(const struct rf_comm *comm);
  void (*bcast)(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype, int root);
  void (*allreduce)(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                    enum rf_reduce_op op);
  /* In place: this rank's part is already in buf. */
  void (*allgather)(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                    struct rf_comm_req *req);
  void (*allgatherv)(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype,
                     struct rf_comm_req *req);
  void (*reduce_scatter_block)(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                               enum rf_dtype dtype, struct rf_comm_req *req);
  void (*reduce_scatter)(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                         enum rf_dtype dtype, struct rf_comm_req *req);
  void (*alltoallv)(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                    const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                    const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req);
  /* In place, non-blocking (req never NULL); count within the backend's limit. */
  void (*iallreduce)(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                     enum rf_reduce_op op, struct rf_comm_req *req);
  /* 1 when finished (drives progress); wait blocks until finished. */
  int (*test)(struct rf_comm_req *req);
  void (*wait)(struct rf_comm_req *req);
  /* The collectives issued between group_begin and group_end form one launch (NCCL's
   * ncclGroupStart/End); MPI: nothing to do. */
  void (*group_begin)(const struct rf_comm *comm);
  void (*group_end)(const struct rf_comm *comm);
  /* Optional (NULL: comm.c's host behaviour, see the top of this file). stream_wait: the
   * collectives issued next start after ev (recorded on a stream of dev); event_record:
   * ev is reached when req's collective has finished. */
  void (*stream_wait)(const struct rf_comm *comm, struct rf_device *dev, struct rf_device_event *ev);
  void (*event_record)(const struct rf_comm *comm, struct rf_comm_req *req, struct rf_device *dev,
                       struct rf_device_event *ev);
  /* A new communicator in *out of the ranks that pass the same color (>= 0),
   * ordered by key; RF_COMM_SPLIT_NODE: the ranks on this rank's node. Collective. */
  void (*split)(const struct rf_comm *comm, int color, int key, struct rf_comm *out);
};

#define RF_COMM_SPLIT_NODE (-1) /* rf_comm_split's color: the ranks sharing this rank's node */

/* A communicator: a group of ranks and the backend that connects them. Owns
 * `impl` (the backend's state, released by rf_comm_free). Collectives on one
 * rf_comm are issued from one thread at a time. */
struct rf_comm {
  const struct rf_comm_ops *ops; /* static table of the backend */
  void *impl;                    /* owned: the backend's state */
  int rank;
  int world;
  int thread_multiple; /* 1: several threads may call into the backend at once (MPI_THREAD_MULTIPLE) */
  int across_groups;   /* 1: its ranks are in more than one shard group (bytes counted in bytes_inter) */
  struct rf_counters
      *counters; /* borrowed: where its collectives count (a runtime context's); NULL: nowhere */
  /* borrowed: the device whose memory the buffers handed to its collectives are in (a view made by
   * rf_comm_on_device: the runtime's gathers, reduce-scatters and HSDP all-reduces); NULL: host
   * memory (every communicator a constructor makes: norms, votes, agreements, staging) */
  struct rf_device *dev;
};

void rf_comm_free(struct rf_comm *comm);
/* A new communicator (owned by the caller: rf_comm_free) of the ranks of `comm`
 * passing the same `color`, ordered by `key`; color RF_COMM_SPLIT_NODE: the ranks
 * of this rank's node. Collective over comm; checked like every call. */
void rf_comm_split(const struct rf_comm *comm, int color, int key, struct rf_comm *out);
/* A view of `comm` (its ranks, backend and state, borrowed: never rf_comm_free'd,
 * valid while comm is) whose collectives count into `counters` instead. */
void rf_comm_view(struct rf_comm *out, const struct rf_comm *comm, struct rf_counters *counters);
/* A view of `comm` (as rf_comm_view, the same counters) whose collectives take buffers in the
 * memory of `dev` (out->dev): the MPI backend hands MPI the bytes through the device's view
 * (rf_device_view: the host's pointer itself, the checked device's second mapping), as a
 * CUDA-aware MPI takes device pointers; a device the host cannot view (CUDA) passes its
 * pointers as they are. Whoever hands such a buffer to a collective has ordered it first: the
 * work that wrote it (or still reads what the collective overwrites) is behind an event the
 * comm waited for (rf_comm_stream_wait), and whoever reads what it wrote waits for the
 * collective's event (rf_comm_event_record). The host thread calls the comm, never a stream. */
void rf_comm_on_device(struct rf_comm *out, const struct rf_comm *comm, struct rf_device *dev);
/* The ranks of `comm` on the calling rank's node (collective). */
int rf_comm_node_ranks(const struct rf_comm *comm);

void rf_comm_barrier(const struct rf_comm *comm);
/* rf_comm_bcast, rf_comm_allreduce: include/rfsdp.h. */
/* rf_comm_agree: include/rfsdp.h. */

/* In-place all-gather: rank r's data is already at buf + r*count; fills the rest. */
void rf_comm_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype);
/* Ragged in-place all-gather: rank r's data is at [starts[r], starts[r+1]) of buf
 * (element offsets, starts[0] = 0, world+1 entries, zero-length ranges allowed). */
void rf_comm_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype);
/* Sum reduce-scatter: send holds world*count elements; recv gets this rank's count. */
void rf_comm_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                  enum rf_dtype dtype);
/* Ragged sum reduce-scatter: send holds starts[world] elements; recv gets
 * starts[rank+1] - starts[rank]. */
void rf_comm_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                            enum rf_dtype dtype);
/* All-to-all with per-peer counts and displacements, in elements (world entries each). */
void rf_comm_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                       const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs, enum rf_dtype dtype);

void rf_comm_req_init(struct rf_comm_req *req, int world); /* allocates the count arrays once */
void rf_comm_req_free(struct rf_comm_req *req);

void rf_comm_iallgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        struct rf_comm_req *req);
void rf_comm_iallgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype,
                         struct rf_comm_req *req);
void rf_comm_ireduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                   enum rf_dtype dtype, struct rf_comm_req *req);
void rf_comm_ireduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                             enum rf_dtype dtype, struct rf_comm_req *req);
/* Non-blocking all-to-all-v (arguments as rf_comm_alltoallv); the buffers must
 * stay untouched until the request finishes. */
void rf_comm_ialltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                        const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                        const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req);
/* Non-blocking in-place all-reduce (arguments as rf_comm_allreduce); buf must stay
 * untouched until the request finishes. */
void rf_comm_iallreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        enum rf_reduce_op op, struct rf_comm_req *req);
/* Batches the collectives issued until rf_comm_group_end into one launch (MPI: nothing). */
void rf_comm_group_begin(const struct rf_comm *comm);
void rf_comm_group_end(const struct rf_comm *comm);
/* The collectives issued next on comm start after ev (an event recorded on a stream of
 * dev, e.g. after the writes they send); on MPI the host waits for ev. */
void rf_comm_stream_wait(const struct rf_comm *comm, struct rf_device *dev, struct rf_device_event *ev);
/* ev (created on dev) is reached when req's collective (started on comm) has finished; on
 * MPI ev is bound to req: rf_device_event_query tests it (driving progress) and
 * rf_device_event_synchronize is rf_comm_wait. req must stay in place while ev is used. */
void rf_comm_event_record(const struct rf_comm *comm, struct rf_comm_req *req, struct rf_device *dev,
                          struct rf_device_event *ev);
/* 1 when finished (or never started); drives progress. */
int rf_comm_test(struct rf_comm_req *req);
/* A started request on the timeline: its span on `lane` (enum rf_trace_lane) from now to the completion
 * that rf_comm_test or rf_comm_wait observes, and a blocking wait on it as a "wait" span on the compute
 * lane (the exposed communication). Nothing when the trace is off. */
void rf_comm_req_trace(struct rf_comm_req *req, int lane, int unit);
/* Blocks until finished; the time blocked is added to comm_wait_ns. */
void rf_comm_wait(struct rf_comm_req *req);
/* Done with a request whose readers are already ordered after it: a stream waited for its event
 * (rf_comm_event_record, then rf_device_stream_wait). A backend whose collectives complete on a
 * device stream (event_record set: NCCL) lets it go without a host wait: the stream's wait is the
 * order, and the host learns of a collective that never completes in its next wait for the device
 * (the NCCL backend is the device's waiter: its errors, the watchdog). Otherwise (MPI: the event
 * was the request, which the stream's wait finished) it is rf_comm_wait. Its span on the timeline
 * ends here. */
void rf_comm_retire(struct rf_comm_req *req);

/* ---- the collective watchdog -------------------------------------------------
 * rf_comm_watchdog_start, _stop, _note and _hosts: include/rfsdp.h. */
enum { RF_COMM_HOST_NAME = 64 };
/* Within src/comm: the listener (opened once; its port into *port; 0 on
 * success) and the other hosts (n, each with its first rank and that rank's
 * port), resolved here; world_rank sets the extra wait. */
int rf_comm_watchdog_listen(uint16_t *port);
void rf_comm_watchdog_set_hosts(const char *self, int world_rank, int n, const char *const *hosts,
                                const int *ranks, const uint16_t *ports);
/* Within src/comm: a wait begins (at now_ns) and ends. */
void rf_comm_watch_enter(const char *collective, const char *label, uint64_t now_ns);
void rf_comm_watch_leave(void);

/* ---- meshes ------------------------------------------------------------------
 * The ranks of a job as a 2-D grid (world = replicate x shard): parameters are
 * sharded within a shard group and replicated across the replicate group (the
 * ranks holding the same shard). 1-D FSDP: replicate has one rank. Owns both. */
struct rf_comm_mesh {
  struct rf_comm shard;
  struct rf_comm replicate; /* across_groups set when it has more than one rank */
};
void rf_comm_mesh_free(struct rf_comm_mesh *mesh);
/* This rank's rank among the mesh's ranks on its node (counted from 0), from the node's share of
 * each communicator: the replicate rank on the node times the shard ranks on the node, plus the
 * shard rank on the node. Exact when a node's ranks are whole shard groups or one piece of one
 * (every mesh rf_comm_mesh_split makes). Collective over both communicators. */
int rf_comm_mesh_local_rank(const struct rf_comm_mesh *mesh);

/* The shard group size of a mesh of one group per node: the ranks of this rank's node, the
 * same on every node. Collective over comm: 0 on every rank, or -1 on every rank
 * with a message when the nodes run different numbers of ranks. */
int rf_comm_mesh_node_group(const struct rf_comm *comm, int *group);
/* Splits `comm` into a mesh of shard groups of `group` ranks (consecutive ranks
 * k*group .. k*group+group-1; with by_node, the ranks of one node) and replicate
 * groups (the ranks of the same shard rank). Marks which communicators cross the
 * shard groups (rf_comm_mesh_mark, `comm` included). Collective over comm; the
 * caller frees the mesh (or hands it to the runtime). */
void rf_comm_mesh_split(struct rf_comm_mesh *mesh, struct rf_comm *comm, int group, int by_node);
/* The one place that sets across_groups: on the replicate group, and on `every`
 * (a communicator of all the mesh's ranks; NULL: none), when there is more than
 * one replica. */
void rf_comm_mesh_mark(struct rf_comm_mesh *mesh, struct rf_comm *every);
/* rf_comm_agree over every rank of the mesh: the shard group, then the replicate group. */
int rf_comm_mesh_agree(const struct rf_comm_mesh *mesh, int status);
/* 1 on the mesh's first rank (rank 0 of its shard group and of its replicate group). */
int rf_comm_mesh_first(const struct rf_comm_mesh *mesh);
/* Broadcast from the mesh's first rank to every rank of the mesh. */
void rf_comm_mesh_bcast(const struct rf_comm_mesh *mesh, void *buf, int64_t count, enum rf_dtype dtype);
/* Checks that the mesh is a grid: every rank of a replicate group has the same
 * shard rank and shard group size. Collective over the mesh; 0 on every rank, or
 * -1 on every rank with a message. */
int rf_comm_mesh_check(const struct rf_comm_mesh *mesh);

#endif
