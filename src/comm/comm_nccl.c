/* The NCCL backend of src/comm (comm_nccl.h): device memory through NCCL on three
 * communicators and streams, host memory through an MPI communicator beside them.
 * Counting and argument checks happen in comm.c; this file moves the bytes. */
#include "comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
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
#define RF_NCCL_RING 64    /* events per lane */
#define RF_NCCL_PENDING 64 /* requests started inside one group */

/* One communicator and stream, and the ring of events its requests complete on. */
struct rf_nccl_lane {
  ncclComm_t comm;
  cudaStream_t stream;
  cudaEvent_t ring[RF_NCCL_RING];
  int next;
};

/* rf_comm.impl. Owns the lanes, the MPI duplicate; `dev` is borrowed. */
struct rf_comm_nccl {
  struct rf_nccl_lane lane[RF_NCCL_LANES];
  struct rf_comm mpi; /* host memory, and the unique ids */
  struct rf_device *dev;
  int group_depth;
  struct rf_comm_req *pending[RF_NCCL_PENDING]; /* requests started in the open group */
  int lanes_of_pending[RF_NCCL_PENDING];
  int npending;
  struct rf_comm_nccl_stats stats;
};

/* What a request of this backend holds in rf_comm_req.handle. */
struct rf_nccl_req {
  cudaEvent_t event;
  cudaStream_t stream;
};
_Static_assert(sizeof(struct rf_nccl_req) <= sizeof(((struct rf_comm_req *)0)->handle),
               "the NCCL request must fit in rf_comm_req.handle");

static struct rf_comm_nccl *rf_comm_nccl_of(const struct rf_comm *comm) { return comm->impl; }

static struct rf_nccl_req rf_nccl_req_load(const struct rf_comm_req *req) {
  struct rf_nccl_req r;
  memcpy(&r, req->handle, sizeof r);
  return r;
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

/* 1 when p is device (or managed) memory: NCCL's; else MPI's. */
static int rf_nccl_on_device(const void *p) {
  struct cudaPointerAttributes a;
  if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError(); /* clears the sticky-free error of an unknown pointer */
    return 0;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* After a collective was queued on lane l: a blocking one waits for the lane's stream;
 * a request gets its event now, or at group_end inside a group. */
static void rf_nccl_done(const struct rf_comm *comm, int l, struct rf_comm_req *req) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  struct rf_nccl_lane *lane = &n->lane[l];
  if (!req) {
    RF_ASSERT(n->group_depth == 0); /* a blocking collective inside a group would wait for nothing */
    n->stats.host_syncs++;
    RF_NCCL_CUDA_CHECK(cudaStreamSynchronize(lane->stream));
    return;
  }
  struct rf_nccl_req r = {lane->ring[lane->next], lane->stream};
  lane->next = (lane->next + 1) % RF_NCCL_RING;
  memcpy(req->handle, &r, sizeof r);
  if (n->group_depth > 0) {
    if (n->npending == RF_NCCL_PENDING) RF_DIE("more than %d collectives in one NCCL group", RF_NCCL_PENDING);
    n->lanes_of_pending[n->npending] = l;
    n->pending[n->npending++] = req;
  } else {
    RF_NCCL_CUDA_CHECK(cudaEventRecord(r.event, r.stream));
  }
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
  return local % count;
}

static const struct rf_comm_ops rf_comm_nccl_ops;

void rf_comm_nccl_init(struct rf_comm *comm, const struct rf_comm *mpi, struct rf_device *dev) {
  RF_ASSERT(dev->ops && strcmp(dev->ops->name, "cuda") == 0);
  memset(comm, 0, sizeof *comm);
  struct rf_comm_nccl *n = rf_xcalloc(1, sizeof *n);
  rf_comm_split(mpi, 0, mpi->rank, &n->mpi);
  n->dev = dev;
  RF_NCCL_CUDA_CHECK(cudaSetDevice(dev->ordinal));
  ncclUniqueId ids[RF_NCCL_LANES];
  if (n->mpi.rank == 0)
    for (int l = 0; l < RF_NCCL_LANES; l++) RF_NCCL_CHECK(ncclGetUniqueId(&ids[l]));
  rf_comm_bcast(&n->mpi, ids, (int64_t)sizeof ids, RF_DTYPE_U8, 0);
  int least = 0, greatest = 0;
  RF_NCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int l = 0; l < RF_NCCL_LANES; l++) {
    struct rf_nccl_lane *lane = &n->lane[l];
    RF_NCCL_CHECK(ncclCommInitRank(&lane->comm, n->mpi.world, ids[l], n->mpi.rank));
    RF_NCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&lane->stream, cudaStreamNonBlocking, greatest));
    for (int e = 0; e < RF_NCCL_RING; e++)
      RF_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&lane->ring[e], cudaEventDisableTiming));
  }
  comm->ops = &rf_comm_nccl_ops;
  comm->impl = n;
  comm->rank = n->mpi.rank;
  comm->world = n->mpi.world;
  comm->thread_multiple = 0; /* collectives are issued from one thread */
}

static void rf_comm_nccl_free(struct rf_comm *comm) {
  struct rf_comm_nccl *n = comm->impl;
  for (int l = 0; l < RF_NCCL_LANES; l++) {
    struct rf_nccl_lane *lane = &n->lane[l];
    RF_NCCL_CUDA_CHECK(cudaStreamSynchronize(lane->stream));
    RF_NCCL_CHECK(ncclCommDestroy(lane->comm));
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
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (!rf_nccl_on_device(buf)) {
    n->mpi.ops->bcast(&n->mpi, buf, count, dtype, root);
    return;
  }
  const struct rf_nccl_lane *lane = &n->lane[RF_NCCL_AG];
  RF_NCCL_CHECK(ncclBroadcast(buf, buf, (size_t)count, rf_nccl_type(dtype), root, lane->comm, lane->stream));
  rf_nccl_done(comm, RF_NCCL_AG, NULL);
}

static void rf_comm_nccl_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                   enum rf_reduce_op op) {
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (!rf_nccl_on_device(buf)) {
    n->mpi.ops->allreduce(&n->mpi, buf, count, dtype, op);
    return;
  }
  const struct rf_nccl_lane *lane = &n->lane[RF_NCCL_AR];
  RF_NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, rf_nccl_type(dtype), rf_nccl_op(dtype, op), lane->comm,
                              lane->stream));
  rf_nccl_done(comm, RF_NCCL_AR, NULL);
}

/* Non-blocking, in place: device memory on the all-reduce lane (HSDP's replica all-reduce
 * per unit), host memory on MPI (its request then finished by MPI's table). */
static void rf_comm_nccl_iallreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                    enum rf_reduce_op op, struct rf_comm_req *req) {
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (!rf_nccl_on_device(buf)) {
    n->mpi.ops->iallreduce(&n->mpi, buf, count, dtype, op, req);
    req->ops = n->mpi.ops;
    return;
  }
  const struct rf_nccl_lane *lane = &n->lane[RF_NCCL_AR];
  RF_NCCL_CHECK(ncclAllReduce(buf, buf, (size_t)count, rf_nccl_type(dtype), rf_nccl_op(dtype, op), lane->comm,
                              lane->stream));
  rf_nccl_done(comm, RF_NCCL_AR, req);
}

/* In place: rank r's part at buf + r*count (NCCL's rule: sendbuff == recvbuff + rank*count). */
static void rf_comm_nccl_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                   struct rf_comm_req *req) {
  const struct rf_nccl_lane *lane = &rf_comm_nccl_of(comm)->lane[RF_NCCL_AG];
  const char *mine = (const char *)buf + (size_t)comm->rank * (size_t)count * rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclAllGather(mine, buf, (size_t)count, rf_nccl_type(dtype), lane->comm, lane->stream));
  rf_nccl_done(comm, RF_NCCL_AG, req);
}

/* Ragged: rank r broadcasts its range [starts[r], starts[r+1]) in place, all in one group. */
static void rf_comm_nccl_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts,
                                    enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_nccl_lane *lane = &rf_comm_nccl_of(comm)->lane[RF_NCCL_AG];
  size_t size = rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < comm->world; r++) {
    char *at = (char *)buf + (size_t)starts[r] * size;
    if (starts[r + 1] > starts[r])
      RF_NCCL_CHECK(ncclBroadcast(at, at, (size_t)(starts[r + 1] - starts[r]), rf_nccl_type(dtype), r,
                                  lane->comm, lane->stream));
  }
  RF_NCCL_CHECK(ncclGroupEnd());
  rf_nccl_done(comm, RF_NCCL_AG, req);
}

static void rf_comm_nccl_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv,
                                              int64_t count, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_nccl_lane *lane = &rf_comm_nccl_of(comm)->lane[RF_NCCL_RS];
  RF_NCCL_CHECK(ncclReduceScatter(send, recv, (size_t)count, rf_nccl_type(dtype),
                                  rf_nccl_op(dtype, RF_REDUCE_OP_SUM), lane->comm, lane->stream));
  rf_nccl_done(comm, RF_NCCL_RS, req);
}

/* Ragged: one reduce per root r of its range [starts[r], starts[r+1]) into r's recv (NULL
 * elsewhere, as NCCL allows). */
static void rf_comm_nccl_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv,
                                        const int64_t *starts, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_nccl_lane *lane = &rf_comm_nccl_of(comm)->lane[RF_NCCL_RS];
  size_t size = rf_dtype_size(dtype);
  RF_NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < comm->world; r++)
    if (starts[r + 1] > starts[r])
      RF_NCCL_CHECK(ncclReduce((const char *)send + (size_t)starts[r] * size, r == comm->rank ? recv : NULL,
                               (size_t)(starts[r + 1] - starts[r]), rf_nccl_type(dtype),
                               rf_nccl_op(dtype, RF_REDUCE_OP_SUM), r, lane->comm, lane->stream));
  RF_NCCL_CHECK(ncclGroupEnd());
  rf_nccl_done(comm, RF_NCCL_RS, req);
}

/* Device memory: a group of send/receive pairs on the all-gather lane, this rank's own
 * piece copied on the stream; host memory: MPI. */
static void rf_comm_nccl_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                                   const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                   const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  if (!rf_nccl_on_device(send) && !rf_nccl_on_device(recv)) {
    n->mpi.ops->alltoallv(&n->mpi, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype,
                          req);
    if (req) req->ops = n->mpi.ops; /* an MPI request: MPI's test and wait finish it */
    return;
  }
  const struct rf_nccl_lane *lane = &n->lane[RF_NCCL_AG];
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
  rf_nccl_done(comm, RF_NCCL_AG, req);
}

/* Requests of device memory (a request of host memory has MPI's table in req->ops). */
static int rf_comm_nccl_test(struct rf_comm_req *req) {
  struct rf_nccl_req r = rf_nccl_req_load(req);
  cudaError_t rc = cudaEventQuery(r.event);
  if (rc == cudaErrorNotReady) return 0;
  RF_NCCL_CUDA_CHECK(rc);
  return 1;
}

static void rf_comm_nccl_wait(struct rf_comm_req *req) {
  struct rf_nccl_req r = rf_nccl_req_load(req);
  RF_NCCL_CUDA_CHECK(cudaEventSynchronize(r.event));
}

static void rf_comm_nccl_group_begin(const struct rf_comm *comm) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  RF_NCCL_CHECK(ncclGroupStart());
  n->group_depth++;
}

/* NCCL launches the group here: only now can the requests' events follow it. */
static void rf_comm_nccl_group_end(const struct rf_comm *comm) {
  struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  RF_ASSERT(n->group_depth > 0);
  RF_NCCL_CHECK(ncclGroupEnd());
  if (--n->group_depth > 0) return;
  for (int i = 0; i < n->npending; i++) {
    struct rf_nccl_req r = rf_nccl_req_load(n->pending[i]);
    RF_NCCL_CUDA_CHECK(cudaEventRecord(r.event, r.stream));
  }
  n->npending = 0;
}

/* Every lane's next collective starts after ev (recorded on a stream of dev). */
static void rf_comm_nccl_stream_wait(const struct rf_comm *comm, struct rf_device *dev,
                                     struct rf_device_event *ev) {
  (void)dev;
  const struct rf_comm_nccl *n = rf_comm_nccl_of(comm);
  for (int l = 0; l < RF_NCCL_LANES; l++)
    RF_NCCL_CUDA_CHECK(cudaStreamWaitEvent(n->lane[l].stream, (cudaEvent_t)ev->handle, 0));
}

/* ev (a CUDA event of dev) is reached when req's collective has finished. */
static int rf_comm_nccl_event_test(void *req) { return rf_comm_test(req); }
static void rf_comm_nccl_event_wait(void *req) { rf_comm_wait(req); }

static void rf_comm_nccl_event_record(const struct rf_comm *comm, struct rf_comm_req *req,
                                      struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  RF_ASSERT(rf_comm_nccl_of(comm)->group_depth == 0);
  if (req->ops != &rf_comm_nccl_ops) { /* host memory, on MPI: as comm.c binds an MPI request */
    rf_device_event_bind(ev, rf_comm_nccl_event_test, rf_comm_nccl_event_wait, req);
    return;
  }
  struct rf_nccl_req r = rf_nccl_req_load(req);
  RF_NCCL_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev->handle, r.stream));
}

/* The MPI split, then NCCL communicators of its own on the same GPU. */
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
