/* The backend-independent half of the communicator: argument checks, byte and
 * time counting (one place for every backend), then the backend's table. */
#include "comm/comm.h"
#include "core/trace.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Adds n to the counter at `field` (offsetof in struct rf_counters) of the
 * communicator's counters; a communicator without counters counts nowhere. */
#define RF_COMM_FIELD(name) offsetof(struct rf_counters, name)
static void rf_comm_add(struct rf_counters *c, size_t field, uint64_t n) {
  if (c) *(uint64_t *)(void *)((char *)c + field) += n;
}

static void rf_comm_check_starts(const int64_t *starts, int world) {
  RF_ASSERT(starts[0] == 0);
  for (int r = 0; r < world; r++) RF_ASSERT(starts[r + 1] >= starts[r]);
}

/* Elements of a ragged buffer outside this rank's range: what it receives in an
 * all-gather and sends in a reduce-scatter. */
static uint64_t rf_comm_others(const struct rf_comm *comm, const int64_t *starts) {
  return (uint64_t)(starts[comm->world] - (starts[comm->rank + 1] - starts[comm->rank]));
}

/* An all-to-all-v's elements to other ranks. The piece a rank sends itself is a
 * local copy inside the backend: counted here as copied bytes. */
static uint64_t rf_comm_sent(const struct rf_comm *comm, const int64_t *send_counts, enum rf_dtype dtype) {
  uint64_t sent = 0;
  for (int r = 0; r < comm->world; r++) {
    RF_ASSERT(send_counts[r] >= 0);
    if (r != comm->rank) sent += (uint64_t)send_counts[r];
  }
  rf_comm_add(comm->counters, RF_COMM_FIELD(bytes_copied),
              (uint64_t)send_counts[comm->rank] * rf_dtype_size(dtype));
  return sent;
}

/* Adds `bytes` moved by a collective on comm to the kind's counter and to the
 * inside-a-group or across-groups total. */
static void rf_comm_count_bytes(const struct rf_comm *comm, size_t kind, uint64_t bytes) {
  rf_comm_add(comm->counters, kind, bytes);
  rf_comm_add(comm->counters, comm->across_groups ? RF_COMM_FIELD(bytes_inter) : RF_COMM_FIELD(bytes_intra),
              bytes);
}

/* A blocking collective begins: the watchdog watches it. Returns the time. */
static uint64_t rf_comm_begin(const char *collective) {
  uint64_t t0 = rf_time_ns();
  rf_comm_watch_enter(collective, NULL, t0);
  return t0;
}

static void rf_comm_count_done(const struct rf_comm *comm, uint64_t t0) {
  rf_comm_watch_leave();
  rf_comm_add(comm->counters, RF_COMM_FIELD(collectives), 1);
  rf_comm_add(comm->counters, RF_COMM_FIELD(comm_wait_ns), rf_time_ns() - t0);
}

void rf_comm_free(struct rf_comm *comm) {
  if (comm->ops) comm->ops->free(comm);
  memset(comm, 0, sizeof *comm);
}

/* ---- blocking ------------------------------------------------------------- */

void rf_comm_barrier(const struct rf_comm *comm) {
  uint64_t t0 = rf_comm_begin("barrier");
  comm->ops->barrier(comm);
  rf_comm_count_done(comm, t0);
}

void rf_comm_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype, int root) {
  RF_ASSERT(comm && (buf || count == 0));
  RF_ASSERT(count >= 0 && root >= 0 && root < comm->world);
  uint64_t t0 = rf_comm_begin("broadcast");
  comm->ops->bcast(comm, buf, count, dtype, root);
  rf_comm_count_done(comm, t0);
}

void rf_comm_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                       enum rf_reduce_op op) {
  RF_ASSERT(comm && (buf || count == 0));
  RF_ASSERT(count >= 0);
  RF_ASSERT(op == RF_REDUCE_OP_SUM || op == RF_REDUCE_OP_MAX || op == RF_REDUCE_OP_MIN);
  uint64_t t0 = rf_comm_begin("all-reduce");
  comm->ops->allreduce(comm, buf, count, dtype, op);
  if (comm->world > 1)
    rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_reduced), (uint64_t)count * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

int rf_comm_agree(const struct rf_comm *comm, int status) {
  RF_REQUIRE_ARG("rf_comm_agree", comm);
  int32_t all = status;
  rf_comm_allreduce(comm, &all, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  return all;
}

void rf_comm_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype) {
  RF_ASSERT(count >= 0);
  uint64_t t0 = rf_comm_begin("all-gather");
  comm->ops->allgather(comm, buf, count, dtype, NULL);
  rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_gathered),
                      (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

void rf_comm_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype) {
  rf_comm_check_starts(starts, comm->world);
  uint64_t t0 = rf_comm_begin("all-gather-v");
  comm->ops->allgatherv(comm, buf, starts, dtype, NULL);
  rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_gathered),
                      rf_comm_others(comm, starts) * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

void rf_comm_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                  enum rf_dtype dtype) {
  RF_ASSERT(count >= 0);
  uint64_t t0 = rf_comm_begin("reduce-scatter");
  comm->ops->reduce_scatter_block(comm, send, recv, count, dtype, NULL);
  rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_reduced),
                      (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

void rf_comm_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                            enum rf_dtype dtype) {
  rf_comm_check_starts(starts, comm->world);
  uint64_t t0 = rf_comm_begin("reduce-scatter-v");
  comm->ops->reduce_scatter(comm, send, recv, starts, dtype, NULL);
  rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_reduced),
                      rf_comm_others(comm, starts) * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

void rf_comm_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                       const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs, enum rf_dtype dtype) {
  uint64_t t0 = rf_comm_begin("all-to-all-v");
  uint64_t sent = rf_comm_sent(comm, send_counts, dtype);
  comm->ops->alltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, NULL);
  rf_comm_count_bytes(comm, RF_COMM_FIELD(bytes_alltoall), sent * rf_dtype_size(dtype));
  rf_comm_count_done(comm, t0);
}

/* ---- non-blocking --------------------------------------------------------- */

void rf_comm_req_init(struct rf_comm_req *req, int world) {
  memset(req, 0, sizeof *req);
  req->counts = rf_xmalloc((size_t)world * sizeof(int));
  req->displs = rf_xmalloc((size_t)world * sizeof(int));
  req->recv_counts = rf_xmalloc((size_t)world * sizeof(int));
  req->recv_displs = rf_xmalloc((size_t)world * sizeof(int));
  req->capacity = world;
}

void rf_comm_req_free(struct rf_comm_req *req) {
  RF_ASSERT(!req->active);
  free(req->counts);
  free(req->displs);
  free(req->recv_counts);
  free(req->recv_displs);
  memset(req, 0, sizeof *req);
}

static void rf_comm_req_start(const struct rf_comm *comm, struct rf_comm_req *req, const char *collective) {
  RF_ASSERT(!req->active);
  RF_ASSERT(req->capacity >= comm->world);
  req->ops = comm->ops;
  req->collective = collective;
  req->trace_t0 = 0;
}

static void rf_comm_req_started(const struct rf_comm *comm, struct rf_comm_req *req, uint64_t bytes,
                                size_t counter) {
  req->active = 1;
  req->bytes = bytes;
  req->counters = comm->counters;
  rf_comm_count_bytes(comm, counter, bytes);
  rf_comm_add(comm->counters, RF_COMM_FIELD(collectives), 1);
}

void rf_comm_iallreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        enum rf_reduce_op op, struct rf_comm_req *req) {
  RF_ASSERT(count >= 0);
  RF_ASSERT(op == RF_REDUCE_OP_SUM || op == RF_REDUCE_OP_MAX || op == RF_REDUCE_OP_MIN);
  rf_comm_req_start(comm, req, "all-reduce");
  comm->ops->iallreduce(comm, buf, count, dtype, op, req);
  rf_comm_req_started(comm, req, comm->world > 1 ? (uint64_t)count * rf_dtype_size(dtype) : 0,
                      RF_COMM_FIELD(bytes_reduced));
}

void rf_comm_iallgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        struct rf_comm_req *req) {
  RF_ASSERT(count >= 0);
  rf_comm_req_start(comm, req, "all-gather");
  comm->ops->allgather(comm, buf, count, dtype, req);
  rf_comm_req_started(comm, req, (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype),
                      RF_COMM_FIELD(bytes_gathered));
}

void rf_comm_iallgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype,
                         struct rf_comm_req *req) {
  rf_comm_check_starts(starts, comm->world);
  rf_comm_req_start(comm, req, "all-gather-v");
  comm->ops->allgatherv(comm, buf, starts, dtype, req);
  rf_comm_req_started(comm, req, rf_comm_others(comm, starts) * rf_dtype_size(dtype),
                      RF_COMM_FIELD(bytes_gathered));
}

void rf_comm_ireduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                   enum rf_dtype dtype, struct rf_comm_req *req) {
  RF_ASSERT(count >= 0);
  rf_comm_req_start(comm, req, "reduce-scatter");
  comm->ops->reduce_scatter_block(comm, send, recv, count, dtype, req);
  rf_comm_req_started(comm, req, (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype),
                      RF_COMM_FIELD(bytes_reduced));
}

void rf_comm_ireduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                             enum rf_dtype dtype, struct rf_comm_req *req) {
  rf_comm_check_starts(starts, comm->world);
  rf_comm_req_start(comm, req, "reduce-scatter-v");
  comm->ops->reduce_scatter(comm, send, recv, starts, dtype, req);
  rf_comm_req_started(comm, req, rf_comm_others(comm, starts) * rf_dtype_size(dtype),
                      RF_COMM_FIELD(bytes_reduced));
}

void rf_comm_ialltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                        const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                        const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req) {
  rf_comm_req_start(comm, req, "all-to-all-v");
  uint64_t sent = rf_comm_sent(comm, send_counts, dtype);
  comm->ops->alltoallv(comm, send, send_counts, send_displs, recv, recv_counts, recv_displs, dtype, req);
  rf_comm_req_started(comm, req, sent * rf_dtype_size(dtype), RF_COMM_FIELD(bytes_alltoall));
}

void rf_comm_req_trace(struct rf_comm_req *req, int lane, int unit) {
  req->trace_t0 = rf_trace_now();
  req->trace_lane = lane;
  req->trace_unit = unit;
}

/* The request's span, at its observed completion. */
static void rf_comm_req_traced(struct rf_comm_req *req, uint64_t now) {
  if (!req->trace_t0) return;
  rf_trace_span((enum rf_trace_lane)req->trace_lane, req->collective, req->trace_t0, now, req->trace_unit,
                (int64_t)req->bytes);
  req->trace_t0 = 0;
}

int rf_comm_test(struct rf_comm_req *req) {
  if (!req->active) return 1;
  if (!req->ops->test(req)) return 0;
  req->active = 0;
  if (req->trace_t0) rf_comm_req_traced(req, rf_time_ns());
  return 1;
}

void rf_comm_wait(struct rf_comm_req *req) {
  if (!req->active) return;
  uint64_t t0 = rf_time_ns();
  rf_comm_watch_enter(req->collective, req->label, t0);
  req->ops->wait(req);
  rf_comm_watch_leave();
  uint64_t t1 = rf_time_ns();
  rf_comm_add(req->counters, RF_COMM_FIELD(comm_wait_ns), t1 - t0);
  req->active = 0;
  if (req->trace_t0) {
    static const char *const waits[RF_TRACE_LANES] = {
        [RF_TRACE_LANE_GATHER] = "wait for all-gather",
        [RF_TRACE_LANE_REDUCE] = "wait for reduce-scatter",
        [RF_TRACE_LANE_REPLICATE] = "wait for replica all-reduce"};
    const char *name =
        req->trace_lane >= 0 && req->trace_lane < RF_TRACE_LANES ? waits[req->trace_lane] : NULL;
    rf_trace_span(RF_TRACE_LANE_COMPUTE, name ? name : "wait for a collective", t0, t1, req->trace_unit, -1);
    rf_comm_req_traced(req, t1);
  }
}

void rf_comm_retire(struct rf_comm_req *req) {
  if (!req->active) return;
  if (!req->ops->event_record) {
    rf_comm_wait(req);
    return;
  }
  req->active = 0;
  if (req->trace_t0) rf_comm_req_traced(req, rf_time_ns());
}

/* ---- ordering against compute ----------------------------------------------- */

void rf_comm_group_begin(const struct rf_comm *comm) { comm->ops->group_begin(comm); }

void rf_comm_group_end(const struct rf_comm *comm) { comm->ops->group_end(comm); }

void rf_comm_stream_wait(const struct rf_comm *comm, struct rf_device *dev, struct rf_device_event *ev) {
  if (comm->ops->stream_wait)
    comm->ops->stream_wait(comm, dev, ev);
  else
    rf_device_event_synchronize(dev, ev);
}

static int rf_comm_event_test(void *req) { return rf_comm_test(req); }

static void rf_comm_event_wait(void *req) { rf_comm_wait(req); }

void rf_comm_event_record(const struct rf_comm *comm, struct rf_comm_req *req, struct rf_device *dev,
                          struct rf_device_event *ev) {
  if (comm->ops->event_record)
    comm->ops->event_record(comm, req, dev, ev);
  else
    rf_device_event_bind(ev, rf_comm_event_test, rf_comm_event_wait, req);
}

void rf_comm_split(const struct rf_comm *comm, int color, int key, struct rf_comm *out) {
  RF_ASSERT(color >= 0 || color == RF_COMM_SPLIT_NODE);
  comm->ops->split(comm, color, key, out);
}

void rf_comm_view(struct rf_comm *out, const struct rf_comm *comm, struct rf_counters *counters) {
  *out = *comm;
  out->counters = counters;
}

void rf_comm_on_device(struct rf_comm *out, const struct rf_comm *comm, struct rf_device *dev) {
  *out = *comm;
  out->dev = dev;
}

int rf_comm_node_ranks(const struct rf_comm *comm) {
  struct rf_comm node;
  rf_comm_split(comm, RF_COMM_SPLIT_NODE, comm->rank, &node);
  int local = node.world;
  rf_comm_free(&node);
  return local;
}

int rf_comm_mesh_local_rank(const struct rf_comm_mesh *mesh) {
  struct rf_comm shard, replicate;
  rf_comm_split(&mesh->shard, RF_COMM_SPLIT_NODE, mesh->shard.rank, &shard);
  rf_comm_split(&mesh->replicate, RF_COMM_SPLIT_NODE, mesh->replicate.rank, &replicate);
  int local = replicate.rank * shard.world + shard.rank;
  rf_comm_free(&shard);
  rf_comm_free(&replicate);
  return local;
}

/* ---- the public face (include/rfsdp.h) ----------------------------------------- */

int rf_comm_rank(const struct rf_comm *comm) { return comm->rank; }
int rf_comm_size(const struct rf_comm *comm) { return comm->world; }

double rf_comm_sum(const struct rf_comm *comm, double x) {
  rf_comm_allreduce(comm, &x, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  return x;
}

int rf_comm_node_group(const struct rf_comm *comm, int *group) {
  RF_REQUIRE_ARG("rf_comm_node_group", comm);
  RF_REQUIRE_ARG("rf_comm_node_group", group);
  return rf_comm_mesh_node_group(comm, group);
}

void rf_comm_destroy(struct rf_comm *comm) {
  if (!comm) return;
  rf_comm_free(comm);
  free(comm);
}

/* ---- meshes ------------------------------------------------------------------ */

int rf_comm_mesh_node_group(const struct rf_comm *comm, int *group) {
  int local = rf_comm_node_ranks(comm);
  int32_t sizes[2] = {local, -local};
  rf_comm_allreduce(comm, sizes, 2, RF_DTYPE_I32, RF_REDUCE_OP_MAX);
  RF_REQUIRE(sizes[0] == -sizes[1],
             "a shard group per node: the nodes run different numbers of ranks (%d to %d)", -sizes[1],
             sizes[0]);
  *group = local;
  return 0;
}

void rf_comm_mesh_split(struct rf_comm_mesh *mesh, struct rf_comm *comm, int group, int by_node) {
  RF_ASSERT(by_node || (group >= 1 && comm->world % group == 0));
  rf_comm_split(comm, by_node ? RF_COMM_SPLIT_NODE : comm->rank / group, comm->rank, &mesh->shard);
  rf_comm_split(comm, mesh->shard.rank, comm->rank, &mesh->replicate);
  rf_comm_mesh_mark(mesh, comm);
}

void rf_comm_mesh_mark(struct rf_comm_mesh *mesh, struct rf_comm *every) {
  mesh->replicate.across_groups = mesh->replicate.world > 1;
  if (every) every->across_groups = mesh->replicate.world > 1;
}

void rf_comm_mesh_free(struct rf_comm_mesh *mesh) {
  rf_comm_free(&mesh->shard);
  rf_comm_free(&mesh->replicate);
}

int rf_comm_mesh_agree(const struct rf_comm_mesh *mesh, int status) {
  /* the minimum of each shard group, then of those minima across the groups */
  return rf_comm_agree(&mesh->replicate, rf_comm_agree(&mesh->shard, status));
}

int rf_comm_mesh_first(const struct rf_comm_mesh *mesh) {
  return mesh->shard.rank == 0 && mesh->replicate.rank == 0;
}

void rf_comm_mesh_bcast(const struct rf_comm_mesh *mesh, void *buf, int64_t count, enum rf_dtype dtype) {
  /* across the groups among the shard groups' first ranks, then inside every group */
  if (mesh->shard.rank == 0) rf_comm_bcast(&mesh->replicate, buf, count, dtype, 0);
  rf_comm_bcast(&mesh->shard, buf, count, dtype, 0);
}

int rf_comm_mesh_check(const struct rf_comm_mesh *mesh) {
  int32_t v[4] = {mesh->shard.rank, mesh->shard.world, -mesh->shard.rank, -mesh->shard.world};
  rf_comm_allreduce(&mesh->replicate, v, 4, RF_DTYPE_I32, RF_REDUCE_OP_MAX);
  int bad = v[0] != -v[2] || v[1] != -v[3];
  if (rf_comm_mesh_agree(mesh, bad ? -1 : 0) == 0) return 0;
  RF_FAIL("%s",
          bad ? "the mesh is not a grid: ranks of one replicate group hold different shards (shard rank "
                "or shard group size differ)"
              : "the mesh is not a grid (seen on another rank)");
}
