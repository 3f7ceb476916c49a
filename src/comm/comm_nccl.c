/* The NCCL backend of src/comm (comm_nccl.h): device memory through NCCL on three
 * lanes (a communicator and a stream each), host memory through an MPI communicator
 * beside them. Counting and argument checks happen in comm.c; this file moves the
 * bytes. */
#include "comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device/device_cuda.h"

#define RF_NCCL_CHECK(call)                                                                         \
  do {                                                                                              \
    ncclResult_t rf_nccl_rc_ = (call);                                                              \
    if (rf_nccl_rc_ != ncclSuccess)                                                                 \
      RF_DIE("%s failed: %s (%s)", #call, ncclGetErrorString(rf_nccl_rc_), ncclGetLastError(NULL)); \
  } while (0)

#define RF_NCCL_CUDA_CHECK(call)                                                                     \
  do {                                                                                               \
    cudaError_t rf_cuda_rc_ = (call);                                                                \
    if (rf_cuda_rc_ != cudaSuccess) RF_DIE("%s failed: %s", #call, cudaGetErrorString(rf_cuda_rc_)); \
  } while (0)

enum { RF_NCCL_AG = 0, RF_NCCL_RS, RF_NCCL_AR, RF_NCCL_LANES };
static const char *const rf_nccl_lane_names[RF_NCCL_LANES] = {"all-gather", "reduce-scatter", "all-reduce"};
#define RF_NCCL_RING 64       /* events per lane */
#define RF_NCCL_PENDING 64    /* requests started inside one group */
#define RF_NCCL_POLL_NS 20000 /* a host wait checks NCCL's asynchronous error this often */

/* What the collective behind a ring event is, for the watchdog: its name (static), its
 * request's label (borrowed: a unit's name) and its place in the process's issue order. */
struct rf_nccl_record {
  const char *collective;
  const char *label;
  uint64_t seq;
};

/* One lane: a stream, the ring of events its requests complete on, and its NCCL
 * communicator, created when the lane is first used (NULL before; a communicator
 * nobody gathers on, or one split only to count a node's ranks, costs MPI only).
 * The ring's events are taken in order (`taken`: slot taken % RF_NCCL_RING) and recorded in
 * that order (`recorded`, with what each is in `rec`; a group's at its end); those before
 * `seen` are known reached. recorded, seen and rec are guarded by rf_nccl_lock (a device's
 * waiter reads them, on whichever thread waits for the device). */
struct rf_nccl_lane {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ring[RF_NCCL_RING];
  uint64_t taken, recorded, seen;
  struct rf_nccl_record rec[RF_NCCL_RING];
};

/* rf_comm.impl. Owns the lanes, the MPI duplicate; `dev` is borrowed. */
struct rf_comm_nccl {
  struct rf_nccl_lane lane[RF_NCCL_LANES];
  int lanes;          /* RF_NCCL_LANES, or 1 with RF_NCCL_ONE_LANE=1: every collective on lane 0 */
  struct rf_comm mpi; /* host memory, and the unique ids */
  struct rf_device *dev;
  int group_depth;
  int group_open;                               /* ncclGroupStart called for the open group */
  struct rf_comm_req *pending[RF_NCCL_PENDING]; /* requests started in the open group */
  int lanes_of_pending[RF_NCCL_PENDING];
  int npending;
  struct rf_comm_nccl_stats stats;
  struct rf_comm_nccl *next_live; /* the process's live communicators (rf_nccl_live, rf_nccl_lock) */
};

/* Every live NCCL communicator of the process, and the lanes' records: what a device's waiter
 * reads (rf_nccl_device_poll). */
static pthread_mutex_t rf_nccl_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rf_comm_nccl *rf_nccl_live;
static uint64_t rf_nccl_issued; /* collectives recorded so far (rf_nccl_record.seq) */

/* What a request of this backend holds in rf_comm_req.handle: its event (of a lane's
 * ring, which names the lane) and its communicator, whose NCCL errors a wait polls. */
struct rf_nccl_req {
  cudaEvent_t event;
  struct rf_comm_nccl *n;
};
_Static_assert(sizeof(struct rf_nccl_req) <= sizeof(((struct rf_comm_req *)0)->handle),
               "the NCCL request must fit in rf_comm_req.handle");

static struct rf_comm_nccl *rf_comm_nccl_of(const struct rf_comm *comm) { return comm->impl; }

static struct rf_nccl_req rf_nccl_req_load(const struct rf_comm_req *req) {
  struct rf_nccl_req r;
  memcpy(&r, req->handle, sizeof r);
  return r;
}

/* CUDA's current device is per thread: every entry point makes it this communicator's
 * GPU on the calling thread first (a thread other than the one that made the device,
 * e.g. a runtime's helper thread, would otherwise work on GPU 0). */
static _Thread_local int rf_nccl_thread_device = -1;
static void rf_nccl_bind_thread(const struct rf_comm_nccl *n) {
  if (rf_nccl_thread_device == n->dev->ordinal) return;
  RF_NCCL_CUDA_CHECK(cudaSetDevice(n->dev->ordinal));
  rf_nccl_thread_device = n->dev->ordinal;
}

static ncclDataType_t rf_nccl_type(enum rf_dtype dtype) {
  switch (dtype) {
    case RF_DTYPE_F32:
      return ncclFloat32;
    case RF_DTYPE_BF16:
      return ncclBfloat16;
    case RF_DTYPE_FP8E4M3: /* moved as bytes; never reduced */
    case RF_DTYPE_U8:
      return ncclUint8;
    case RF_DTYPE_I32:
      return ncclInt32;
    case RF_DTYPE_I64:
      return ncclInt64;
    case RF_DTYPE_F64:
      return ncclFloat64;
  }
  RF_DIE("unknown dtype %d", (int)dtype);
}

static ncclRedOp_t rf_nccl_op(enum rf_dtype dtype, enum rf_reduce_op op) {
  if (dtype == RF_DTYPE_FP8E4M3 || dtype == RF_DTYPE_U8)
    RF_DIE("no reduction is defined on %s buffers", rf_dtype_name(dtype));
  static const ncclRedOp_t ops[3] = {ncclSum, ncclMax, ncclMin};
  RF_ASSERT(op == RF_REDUCE_OP_SUM || op == RF_REDUCE_OP_MAX || op == RF_REDUCE_OP_MIN);
  return ops[op];
}

/* 1 when p is host memory (pageable or pinned): MPI's; device (or managed) memory and
 * NULL (an empty part on this rank) are NCCL's, so that every rank takes one path. */
static int rf_nccl_on_host(const void *p) {
  struct cudaPointerAttributes a;
  if (!p) return 0;
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* clears the sticky-free error of an unknown pointer */
    return 1;
  }
  return a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged;
}

/* The side of a collective with two buffers: both host (MPI) or both device (NCCL). */
static int rf_nccl_pair_on_host(const char *what, const void *send, const void *recv) {
  int hs = rf_nccl_on_host(send), hr = rf_nccl_on_host(recv);
  if (send && recv && hs != hr)
    RF_DIE("comm (nccl): %s with its send buffer in %s memory and its receive buffer in %s memory", what,
           hs ? "host" : "device", hr ? "host" : "device");
  return hs || hr;
}

/* Every lane aborted and every rank stopped, naming NCCL's error: a lane's communicator
 * reported `err` asynchronously (a broken link, a peer gone). */
_Noreturn static void rf_nccl_fail(struct rf_comm_nccl *n, int l, ncclResult_t err) {
  char last[512];
  snprintf(last, sizeof last, "%s", ncclGetLastError(n->lane[l].comm));
  for (int i = 0; i < n->lanes; i++)
    if (n->lane[i].comm) {
      (void)ncclCommAbort(n->lane[i].comm);
      n->lane[i].comm = NULL;
    }
  RF_DIE("NCCL: the %s lane's communicator (rank %d of %d) failed: %s%s%s; every lane of it aborted",
         rf_nccl_lane_names[l], n->mpi.rank, n->mpi.world, ncclGetErrorString(err), last[0] ? ": " : "",
         last);
}

/* NCCL's asynchronous errors, polled on every lane (a host wait calls it). */
static void rf_nccl_check_async(struct rf_comm_nccl *n) {
  for (int l = 0; l < n->lanes; l++) {
    ncclResult_t err = ncclSuccess;
    if (!n->lane[l].comm) continue;
    RF_NCCL_CHECK(ncclCommGetAsyncError(n->lane[l].comm, &err));
    if (err != ncclSuccess && err != ncclInProgress) rf_nccl_fail(n, l, err);
  }
}

/* The host waits for ev, polling NCCL's errors meanwhile: a failed collective never
 * completes its event, and cudaEventSynchronize would wait for it until the watchdog. */
static void rf_nccl_wait_event(struct rf_comm_nccl *n, cudaEvent_t ev) {
  for (;;) {
    cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) RF_NCCL_CUDA_CHECK(rc);
    rf_nccl_check_async(n); /* a failed collective never reaches ev */
    struct timespec pause = {0, RF_NCCL_POLL_NS};
    nanosleep(&pause, NULL);
  }
}

/* Lane l (lane 0 for every l in one-lane mode), its NCCL communicator created on first
 * use: rank 0 makes the id, MPI carries it. Collective: every rank first uses a lane at
 * the same call. An open NCCL group is closed around the creation (a communicator made
 * inside a group exists only at its end) and opened again. */
static struct rf_nccl_lane *rf_nccl_use(struct rf_comm_nccl *n, int l) {
  rf_nccl_bind_thread(n);
  struct rf_nccl_lane *lane = &n->lane[n->lanes == 1 ? 0 : l];
  if (lane->comm) return lane;
  if (n->group_open) RF_NCCL_CHECK(ncclGroupEnd());
  ncclUniqueId id;
  if (n->mpi.rank == 0) RF_NCCL_CHECK(ncclGetUniqueId(&id));
  n->mpi.ops->bcast(&n->mpi, &id, (int64_t)sizeof id, RF_DTYPE_U8, 0);
  RF_NCCL_CHECK(ncclCommInitRank(&lane->comm, n->mpi.world, id, n->mpi.rank));
  n->stats.communicators++;
  if (n->group_open) RF_NCCL_CHECK(ncclGroupStart());
  return lane;
}

static int rf_nccl_lane_index(const struct rf_comm_nccl *n, const struct rf_nccl_lane *lane) {
  return (int)(lane - n->lane);
}

/* Records the lane's next ring event (the one taken first of those not yet recorded) on its
 * stream: reached when the collective queued before it is; what it is, for the watchdog. */
static void rf_nccl_record(struct rf_nccl_lane *lane, const char *collective, const char *label) {
  pthread_mutex_lock(&rf_nccl_lock);
  uint64_t k = lane->recorded;
  RF_ASSERT(k < lane->taken);
  cudaError_t rc = cudaEventRecord(lane->ring[k % RF_NCCL_RING], lane->stream);
  lane->rec[k % RF_NCCL_RING] = (struct rf_nccl_record){collective, label, ++rf_nccl_issued};
  lane->recorded = k + 1;
  pthread_mutex_unlock(&rf_nccl_lock);
  RF_NCCL_CUDA_CHECK(rc);
}

/* After `collective` was queued on `lane`: a blocking one waits for it (polling NCCL's
 * errors); a request gets its event now, or at group_end inside a group. */
static void rf_nccl_done(struct rf_comm_nccl *n, struct rf_nccl_lane *lane, struct rf_comm_req *req,
                         const char *collective) {
  cudaEvent_t ev = lane->ring[lane->taken++ % RF_NCCL_RING];
  if (!req) {
    RF_ASSERT(n->group_depth == 0); /* a blocking collective inside a group would wait for nothing */
    n->stats.host_syncs++;
    rf_nccl_record(lane, collective, NULL);
    rf_nccl_wait_event(n, ev);
    return;
  }
  struct rf_nccl_req r = {ev, n};
  memcpy(req->handle, &r, sizeof r);
  if (n->group_depth > 0) {
    if (n->npending == RF_NCCL_PENDING) RF_DIE("more than %d collectives in one NCCL group", RF_NCCL_PENDING);
    n->lanes_of_pending[n->npending] = rf_nccl_lane_index(n, lane);
    n->pending[n->npending++] = req;
  } else {
    rf_nccl_record(lane, req->collective, req->label);
  }
}

/* The lane whose ring holds ev. */
static struct rf_nccl_lane *rf_nccl_lane_of_event(struct rf_comm_nccl *n, cudaEvent_t ev) {
  for (int l = 0; l < n->lanes; l++)
    for (int e = 0; e < RF_NCCL_RING; e++)
      if (n->lane[l].ring[e] == ev) return &n->lane[l];
  RF_DIE("comm (nccl): a request whose event is no lane's");
}

/* ---- the device's waiter ------------------------------------------------------ */

/* What this thread's wait for the device has put the watchdog on (rf_nccl_device_poll). */
static _Thread_local struct {
  int entered;
  uint64_t seq;
} rf_nccl_watching;

/* The host waits for `arg` (a CUDA device; its waiter, told at every poll of a wait that did not
 * end at once): every live NCCL communicator on it checks its asynchronous errors (a broken link
 * stops every rank naming NCCL's error, as a request's wait does), and the oldest collective of
 * theirs whose event is not reached (issue order: whatever was issued later may wait for it) is
 * what the collective watchdog watches, from the wait's start, or from now when an older one
 * has since completed; none: not watched (the device computes). The runtime retires its
 * requests without a host wait (rf_comm_retire), so this is where a collective that never
 * completes holds the host. */
static void rf_nccl_device_poll(void *arg, uint64_t since) {
  struct rf_nccl_record oldest = {NULL, NULL, 0};
  pthread_mutex_lock(&rf_nccl_lock);
  for (struct rf_comm_nccl *n = rf_nccl_live; n; n = n->next_live) {
    if (n->dev != arg) continue;
    rf_nccl_check_async(n);
    for (int l = 0; l < n->lanes; l++) {
      struct rf_nccl_lane *lane = &n->lane[l];
      if (lane->recorded - lane->seen > RF_NCCL_RING) lane->seen = lane->recorded - RF_NCCL_RING;
      for (; lane->seen < lane->recorded; lane->seen++) {
        const struct rf_nccl_record *r = &lane->rec[lane->seen % RF_NCCL_RING];
        cudaError_t rc = cudaEventQuery(lane->ring[lane->seen % RF_NCCL_RING]);
        if (rc == cudaErrorNotReady) {
          if (!oldest.seq || r->seq < oldest.seq) oldest = *r;
          break;
        }
        if (rc != cudaSuccess) {
          pthread_mutex_unlock(&rf_nccl_lock);
          RF_NCCL_CUDA_CHECK(rc);
        }
      }
    }
  }
  pthread_mutex_unlock(&rf_nccl_lock);
  if (!oldest.seq) {
    if (rf_nccl_watching.entered) rf_comm_watch_leave();
    rf_nccl_watching.entered = 0;
  } else if (!rf_nccl_watching.entered || rf_nccl_watching.seq != oldest.seq) {
    rf_comm_watch_enter(oldest.collective, oldest.label, rf_nccl_watching.entered ? rf_time_ns() : since);
    rf_nccl_watching.entered = 1;
    rf_nccl_watching.seq = oldest.seq;
  }
}

static void rf_nccl_device_done(void *arg) {
  (void)arg;
  if (rf_nccl_watching.entered) rf_comm_watch_leave();
  rf_nccl_watching.entered = 0;
}

/* ---- set-up ------------------------------------------------------------------- */

int rf_comm_nccl_local_device(const struct rf_comm *mpi) {
  struct rf_comm node;
  rf_comm_split(mpi, RF_COMM_SPLIT_NODE, mpi->rank, &node);
  int local = node.rank, per_node = node.world, count = 0;
  rf_comm_free(&node);
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0)
    RF_DIE("no CUDA device: %s", rc != cudaSuccess ? cudaGetErrorString(rc) : "none visible");
  if (per_node > count && !getenv("NCCL_HOSTID")) {
    char host[128] = "host", id[200];
    (void)gethostname(host, sizeof host - 1);
    snprintf(id, sizeof id, "%s-rfsdp-rank%d", host, local);
    setenv("NCCL_HOSTID", id, 1);
  }
  return rf_device_ordinal(local, count);
}

static const struct rf_comm_ops rf_comm_nccl_ops;

void rf_comm_nccl_init(struct rf_comm *comm, const struct rf_comm *mpi, struct rf_device *dev) {
  RF_ASSERT(dev->ops && strcmp(dev->ops->name, "cuda") == 0);
  memset(comm, 0, sizeof *comm);
  struct rf_comm_nccl *n = rf_xcalloc(1, sizeof *n);
  rf_comm_split(mpi, 0, mpi->rank, &n->mpi);
  n->dev = dev;
  const char *one = getenv("RF_NCCL_ONE_LANE");
  n->lanes = one && strcmp(one, "1") == 0 ? 1 : RF_NCCL_LANES;
  rf_nccl_bind_thread(n);
  int least = 0, greatest = 0;
  RF_NCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int l = 0; l < n->lanes; l++) { /* streams now (a lane made later still follows stream_wait) */
    struct rf_nccl_lane *lane = &n->lane[l];
    RF_NCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&lane->stream, cudaStreamNonBlocking, greatest));
    for (int e = 0; e < RF_NCCL_RING; e++)
      RF_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&lane->ring[e], cudaEventDisableTiming));
  }
  comm->ops = &rf_comm_nccl_ops;
  comm->impl = n;
  comm->rank = n->mpi.rank;
  comm->world = n->mpi.world;
  comm->thread_multiple = 0; /* collectives are issued from one thread */
  pthread_mutex_lock(&rf_nccl_lock);
  n->next_live = rf_nccl_live;
  rf_nccl_live = n;
  pthread_mutex_unlock(&rf_nccl_lock);
  static const struct rf_device_waiter waiter = {rf_nccl_device_poll, rf_nccl_device_done, NULL};
  struct rf_device_waiter w = waiter;
  w.arg = dev;
  rf_device_set_waiter(dev, &w); /* the device's one waiter: every communicator on it */
}

/* Each lane's communicator finalized (its queued collectives complete, their errors
 * reported), then destroyed; then the streams. */
static void rf_comm_nccl_free(struct rf_comm *comm) {
  struct rf_comm_nccl *n = comm->impl;
  rf_nccl_bind_thread(n);
  rf_nccl_check_async(n);
  int others = 0; /* live communicators on the same device */
  pthread_mutex_lock(&rf_nccl_lock);
  for (struct rf_comm_nccl **p = &rf_nccl_live; *p;)
    if (*p == n) {
      *p = n->next_live;
    } else {
      others += (*p)->dev == n->dev;
      p = &(*p)->next_live;
    }
  pthread_mutex_unlock(&rf_nccl_lock);
  if (!others) rf_device_set_waiter(n->dev, NULL);
  for (int l = 0; l < n->lanes; l++) {
    struct rf_nccl_lane *lane = &n->lane[l];
    if (lane->comm) {
      RF_NCCL_CHECK(ncclCommFinalize(lane->comm));
      RF_NCCL_CHECK(ncclCommDestroy(lane->comm));
    }
    RF_NCCL_CUDA_CHECK(cudaStreamSynchronize(lane->stream));
    for (int e = 0; e < RF_NCCL_RING; e++) RF_NCCL_CUDA_CHECK(cudaEventDestroy(lane->ring[e]));
    RF_NCCL_CUDA_CHECK(cudaStreamDestroy(lane->stream));
  }
  rf_comm_free(&n->mpi);
  free(n);
}

struct rf_comm_nccl_stats rf_comm_nccl_stats(const struct rf_comm *comm) {
  RF_ASSERT(comm->ops == &rf_comm_nccl_ops);
  return rf_comm_nccl_of(comm)->stats;
}

/* ---- the table ------------------------------------------------------------------ */

static void rf_comm_nccl_barrier(const struct rf_comm *comm) {
  const struct rf_comm *mpi = &rf_comm_nccl_of(comm)->mpi;
  mpi->ops->barrier(mpi);
}

static void rf_comm_nccl_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                               int root) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_on_host(buf)) {
    n->mpi.ops->bcast(&n->mpi, buf, count, dtype, root);
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AG);
  RF_NCCL_CHECK(ncclBroadcast(buf, buf, (size_t)count, rf_nccl_type(dtype), root, lane->comm, lane->stream));
  rf_nccl_done(n, lane, NULL, "broadcast");
}

static void rf_comm_nccl_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                   enum rf_reduce_op op) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_on_host(buf)) {
    n->mpi.ops->allreduce(&n->mpi, buf, count, dtype, op);
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AR);
  RF_NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, rf_nccl_type(dtype), rf_nccl_op(dtype, op), lane->comm,
                              lane->stream));
  rf_nccl_done(n, lane, NULL, "all-reduce");
}

/* Non-blocking, in place: device memory on the all-reduce lane (HSDP's replica all-reduce
 * per unit), host memory on MPI (its request then finished by MPI's table). */
static void rf_comm_nccl_iallreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                    enum rf_reduce_op op, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_on_host(buf)) {
    n->mpi.ops->iallreduce(&n->mpi, buf, count, dtype, op, req);
    req->ops = n->mpi.ops;
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AR);
  RF_NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, rf_nccl_type(dtype), rf_nccl_op(dtype, op), lane->comm,
                              lane->stream));
  rf_nccl_done(n, lane, req, NULL);
}

/* In place: rank r's part at buf + r*count (NCCL's rule: sendbuff == recvbuff + rank*count). */
static void rf_comm_nccl_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                   struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_on_host(buf)) {
    n->mpi.ops->allgather(&n->mpi, buf, count, dtype, req);
    if (req) req->ops = n->mpi.ops;
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AG);
  const char *mine = (const char *)buf + (size_t)comm->rank * (size_t)count * rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclAllGather(mine, buf, (size_t)count, rf_nccl_type(dtype), lane->comm, lane->stream));
  rf_nccl_done(n, lane, req, NULL);
}

/* Ragged: rank r broadcasts its range [starts[r], starts[r+1]) in place, all in one group. */
static void rf_comm_nccl_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts,
                                    enum rf_dtype dtype, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_on_host(buf)) {
    n->mpi.ops->allgatherv(&n->mpi, buf, starts, dtype, req);
    if (req) req->ops = n->mpi.ops;
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AG);
  size_t size = rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < comm->world; r++) {
    char *at = (char *)buf + (size_t)starts[r] * size;
    if (starts[r + 1] > starts[r])
      RF_NCCL_CHECK(ncclBroadcast(at, at, (size_t)(starts[r + 1] - starts[r]), rf_nccl_type(dtype), r,
                                  lane->comm, lane->stream));
  }
  RF_NCCL_CHECK(ncclGroupEnd());
  rf_nccl_done(n, lane, req, NULL);
}

static void rf_comm_nccl_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv,
                                              int64_t count, enum rf_dtype dtype, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_pair_on_host("a reduce-scatter", send, recv)) {
    n->mpi.ops->reduce_scatter_block(&n->mpi, send, recv, count, dtype, req);
    if (req) req->ops = n->mpi.ops;
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_RS);
  RF_NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)count, rf_nccl_type(dtype),
                                  rf_nccl_op(dtype, RF_REDUCE_OP_SUM), lane->comm, lane->stream));
  rf_nccl_done(n, lane, req, NULL);
}

/* Ragged: one reduce per root r of its range [starts[r], starts[r+1]) into r's recv (NULL
 * elsewhere, as NCCL allows). */
static void rf_comm_nccl_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv,
                                        const int64_t *starts, enum rf_dtype dtype, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_pair_on_host("a reduce-scatter-v", send, recv)) {
    n->mpi.ops->reduce_scatter(&n->mpi, send, recv, starts, dtype, req);
    if (req) req->ops = n->mpi.ops;
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_RS);
  size_t size = rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < comm->world; r++)
    if (starts[r + 1] > starts[r])
      RF_NCCL_CHECK(ncclReduce((const char *)send + (size_t)starts[r] * size, r == comm->rank ? recv : NULL,
                               (size_t)(starts[r + 1] - starts[r]), rf_nccl_type(dtype),
                               rf_nccl_op(dtype, RF_REDUCE_OP_SUM), r, lane->comm, lane->stream));
  RF_NCCL_CHECK(ncclGroupEnd());
  rf_nccl_done(n, lane, req, NULL);
}

/* Device memory: a group of send/receive pairs on the all-gather lane, this rank's own
 * piece copied on the stream; host memory: MPI. */
static void rf_comm_nccl_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                                   const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                   const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (rf_nccl_pair_on_host("an all-to-all-v", send, recv)) {
    n->mpi.ops->alltoallv(&n->mpi, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype,
                          req);
    if (req) req->ops = n->mpi.ops; /* an MPI request: MPI's test and wait finish it */
    return;
  }
  struct rf_nccl_lane *lane = rf_nccl_use(n, RF_NCCL_AG);
  size_t size = rf_dtype_size(dtype);
  ncclDataType_t type = rf_nccl_type(dtype);
  int me = comm->rank;
  if (send_counts[me] > 0)
    RF_NCCL_CUDA_CHECK(cudaMemcpyAsync(
        (char *)recv + (size_t)recv_displs[me] * size, (const char *)send + (size_t)send_displs[me] * size,
        (size_t)send_counts[me] * size, cudaMemcpyDeviceToDevice, lane->stream));
  RF_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < comm->world; r++) {
    if (r == me) continue;
    if (send_counts[r] > 0)
      RF_NCCL_CHECK(ncclSend((const char *)send + (size_t)send_displs[r] * size, (size_t)send_counts[r], type,
                             r, lane->comm, lane->stream));
    if (recv_counts[r] > 0)
      RF_NCCL_CHECK(ncclRecv((char *)recv + (size_t)recv_displs[r] * size, (size_t)recv_counts[r], type, r,
                             lane->comm, lane->stream));
  }
  RF_NCCL_CHECK(ncclGroupEnd());
  rf_nccl_done(n, lane, req, NULL);
}

/* Requests of device memory (a request of host memory has MPI's table in req->ops):
 * the event, and NCCL's asynchronous errors while it is not reached. */
static int rf_comm_nccl_test(struct rf_comm_req *req) {
  struct rf_nccl_req r = rf_nccl_req_load(req);
  rf_nccl_bind_thread(r.n);
  cudaError_t rc = cudaEventQuery(r.event);
  if (rc == cudaErrorNotReady) {
    rf_nccl_check_async(r.n);
    return 0;
  }
  RF_NCCL_CUDA_CHECK(rc);
  return 1;
}

/* A host wait for a collective of device memory: counted as a wait for the device (the
 * context's host_syncs) and in request_waits. The runtime retires its requests instead
 * (rf_comm_retire). */
static void rf_comm_nccl_wait(struct rf_comm_req *req) {
  struct rf_nccl_req r = rf_nccl_req_load(req);
  rf_nccl_bind_thread(r.n);
  r.n->stats.request_waits++;
  RF_DEVICE_COUNT(r.n->dev, host_syncs, 1);
  rf_nccl_wait_event(r.n, r.event);
}

static void rf_comm_nccl_group_begin(const struct rf_comm *comm) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  rf_nccl_bind_thread(n);
  if (n->group_depth++ == 0) {
    RF_NCCL_CHECK(ncclGroupStart());
    n->group_open = 1;
  }
}

/* NCCL launches the group here: only now can the requests' events follow it. */
static void rf_comm_nccl_group_end(const struct rf_comm *comm) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  RF_ASSERT(n->group_depth > 0);
  if (--n->group_depth > 0) return;
  RF_NCCL_CHECK(ncclGroupEnd());
  n->group_open = 0;
  for (int i = 0; i < n->npending; i++) /* in the order their events were taken */
    rf_nccl_record(&n->lane[n->lanes_of_pending[i]], n->pending[i]->collective, n->pending[i]->label);
  n->npending = 0;
}

/* Every lane's next collective starts after ev: a CUDA event of dev (recorded on one of
 * its streams), waited for by the lanes' streams without the host; or an event bound to
 * an outside completion (rf_device_event_bind: an MPI request), which no stream can
 * wait for: the host waits for it here, before anything later is queued. */
static void rf_comm_nccl_stream_wait(const struct rf_comm *comm, struct rf_device *dev,
                                     struct rf_device_event *ev) {
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  rf_nccl_bind_thread(n);
  if (ev->wait) {
    rf_device_event_synchronize(dev, ev);
    return;
  }
  for (int l = 0; l < n->lanes; l++)
    RF_NCCL_CUDA_CHECK(cudaStreamWaitEvent(n->lane[l].stream, (cudaEvent_t)ev->handle, 0));
}

/* ev (a CUDA event of dev) is reached when req's collective has finished. */
static int rf_comm_nccl_event_test(void *req) { return rf_comm_test(req); }
static void rf_comm_nccl_event_wait(void *req) { rf_comm_wait(req); }

static void rf_comm_nccl_event_record(const struct rf_comm *comm, struct rf_comm_req *req,
                                      struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  RF_ASSERT(n->group_depth == 0);
  if (req->ops != &rf_comm_nccl_ops) { /* host memory, on MPI: as comm.c binds an MPI request */
    rf_device_event_bind(ev, rf_comm_nccl_event_test, rf_comm_nccl_event_wait, req);
    return;
  }
  rf_nccl_bind_thread(n);
  struct rf_nccl_req r = rf_nccl_req_load(req);
  RF_NCCL_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev->handle, rf_nccl_lane_of_event(n, r.event)->stream));
}

/* The MPI split, then a communicator of this backend on it (its NCCL communicators made
 * when first used: a split made to count a node's ranks makes none). */
static void rf_comm_nccl_split(const struct rf_comm *comm, int color, int key, struct rf_comm *out) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  struct rf_comm part;
  rf_comm_split(&n->mpi, color, key, &part);
  rf_comm_nccl_init(out, &part, n->dev);
  rf_comm_free(&part);
}

static const struct rf_comm_ops rf_comm_nccl_ops = {
    .name = "nccl",
    .free = rf_comm_nccl_free,
    .barrier = rf_comm_nccl_barrier,
    .bcast = rf_comm_nccl_bcast,
    .allreduce = rf_comm_nccl_allreduce,
    .iallreduce = rf_comm_nccl_iallreduce,
    .allgather = rf_comm_nccl_allgather,
    .allgatherv = rf_comm_nccl_allgatherv,
    .reduce_scatter_block = rf_comm_nccl_reduce_scatter_block,
    .reduce_scatter = rf_comm_nccl_reduce_scatter,
    .alltoallv = rf_comm_nccl_alltoallv,
    .test = rf_comm_nccl_test,
    .wait = rf_comm_nccl_wait,
    .group_begin = rf_comm_nccl_group_begin,
    .group_end = rf_comm_nccl_group_end,
    .stream_wait = rf_comm_nccl_stream_wait,
    .event_record = rf_comm_nccl_event_record,
    .split = rf_comm_nccl_split,
};
