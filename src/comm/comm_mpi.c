/* The MPI backend of src/comm: the table of comm.h over MPI collectives. Counting
 * and argument checks happen in comm.c; this file moves the bytes.
 *
 * Counts are int64 in rfsdp and int in MPI. A count above the limit (INT_MAX) is
 * sent as fewer units of a contiguous datatype of k elements, when k divides every
 * count and displacement involved (MPI matches type signatures, so sender and
 * receiver may pick different k). Reductions on such counts are split into chunks
 * instead, because predefined MPI ops are defined on predefined datatypes only. */
#include "comm/comm_mpi.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The backend's state of one rf_comm (rf_comm.impl). Owns comm (a duplicate of
 * the parent), the bf16 datatype and ops, and the scratch count arrays of the
 * blocking collectives. */
struct rf_comm_mpi {
  MPI_Comm comm;
  MPI_Datatype bf16_type; /* 2 contiguous bytes */
  MPI_Op bf16_ops[3];     /* indexed by enum rf_reduce_op; f32 arithmetic, RNE */
  int *scratch;           /* 4*world ints for counts/displacements */
  int yielding;           /* agreed by every rank of comm: rf_comm_mpi_agree_yielding */
};

/* ---- waiting on a shared core ------------------------------------------------
 * MPICH's and Open MPI's waits spin. With more ranks on a node than cores, a rank
 * spinning in MPI_Wait holds the core the rank it waits for needs: at 12 ranks on
 * 2 cores a tiny Mixtral's step took 1.2 s, nearly all of it spinning. There a
 * rank "yields" instead (as Open MPI's mpi_yield_when_idle): it waits by MPI_Test,
 * sleeping 20 us between tests after the first few, and before each blocking
 * collective it waits for the others at an MPI_Ibarrier the same way, so the
 * collective itself (the same call, the same algorithm: the same bits) finds
 * every rank there. Where each rank has a core, waits stay MPI_Wait and the
 * blocking calls as they are. RF_MPI_WAIT=spin|yield overrides the choice. */
static int rf_comm_mpi_yield_wait; /* 1 once a comm of this process yields */

static void rf_comm_mpi_finish(MPI_Request *request) {
  if (!__atomic_load_n(&rf_comm_mpi_yield_wait, __ATOMIC_RELAXED)) {
    RF_MPI_CHECK(MPI_Wait(request, MPI_STATUS_IGNORE));
    return;
  }
  for (int polls = 0;; polls++) {
    int done = 0;
    RF_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (polls >= 8) nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
  }
}

/* A blocking collective `call`, or on a yielding comm its non-blocking twin
 * `icall` with the same arguments, waited for by rf_comm_mpi_finish. */
#define RF_COMM_MPI_COLLECTIVE(m, call, icall, ...)   \
  do {                                                \
    if ((m)->yielding) {                              \
      MPI_Request rf_request_;                        \
      RF_MPI_CHECK(icall(__VA_ARGS__, &rf_request_)); \
      rf_comm_mpi_finish(&rf_request_);               \
    } else {                                          \
      RF_MPI_CHECK(call(__VA_ARGS__));                \
    }                                                 \
  } while (0)

/* This rank's wish (more ranks of comm on its node than cores it may run on, or
 * RF_MPI_WAIT), then the agreement: every rank of comm yields if one wishes to,
 * so the barriers of rf_comm_mpi_arrive match. Collective on comm. */
static void rf_comm_mpi_agree_yielding(struct rf_comm_mpi *m) {
  const char *env = getenv("RF_MPI_WAIT");
  int wish = 0;
  if (env && strcmp(env, "yield") == 0) {
    wish = 1;
  } else if (!env || strcmp(env, "spin") != 0) {
    MPI_Comm node;
    int on_node = 1;
    RF_MPI_CHECK(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    RF_MPI_CHECK(MPI_Comm_size(node, &on_node));
    RF_MPI_CHECK(MPI_Comm_free(&node));
    cpu_set_t cpus;
    int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    wish = on_node > cores || __atomic_load_n(&rf_comm_mpi_yield_wait, __ATOMIC_RELAXED);
  }
  RF_MPI_CHECK(MPI_Allreduce(&wish, &m->yielding, 1, MPI_INT, MPI_MAX, m->comm));
  if (m->yielding) __atomic_store_n(&rf_comm_mpi_yield_wait, 1, __ATOMIC_RELAXED);
}

static const struct rf_comm_mpi *rf_comm_mpi_of(const struct rf_comm *comm) { return comm->impl; }

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct rf_comm_req *)0)->handle),
               "MPI_Request must fit in rf_comm_req.handle");

static void rf_comm_mpi_req_store(struct rf_comm_req *req, MPI_Request request) {
  memcpy(req->handle, &request, sizeof request);
}

static MPI_Request rf_comm_mpi_req_load(const struct rf_comm_req *req) {
  MPI_Request request;
  memcpy(&request, req->handle, sizeof request);
  return request;
}

static int64_t rf_comm_count_limit = INT_MAX;

void rf_comm_set_count_limit(int64_t limit) {
  RF_ASSERT(limit >= 1 && limit <= INT_MAX);
  rf_comm_count_limit = limit;
}

/* ---- bf16 reductions: f32 arithmetic, round to nearest even ------------- */

static void rf_comm_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  const int n = *len;
#pragma omp simd /* 6x faster than the scalar loop gcc -O2 makes */
  for (int i = 0; i < n; i++) b[i] = rf_bf16_from_f32(rf_f32_from_bf16(a[i]) + rf_f32_from_bf16(b[i]));
}

static void rf_comm_bf16_max(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  const int n = *len;
#pragma omp simd
  for (int i = 0; i < n; i++)
    if (rf_f32_from_bf16(a[i]) > rf_f32_from_bf16(b[i])) b[i] = a[i];
}

static void rf_comm_bf16_min(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  const uint16_t *a = in;
  uint16_t *b = inout;
  const int n = *len;
#pragma omp simd
  for (int i = 0; i < n; i++)
    if (rf_f32_from_bf16(a[i]) < rf_f32_from_bf16(b[i])) b[i] = a[i];
}

/* ---- set-up -------------------------------------------------------------- */

/* rf_die's abort hook: a fatal error on one rank ends every rank of the job.
 * MPI_Abort tears the job down at once, and MPICH's launcher can drop what the
 * dying rank printed last (the message saying why) when its pipe is not read
 * yet: a pause of half a second first lets the launcher relay it. */
static void rf_comm_abort_job(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return;
  fflush(NULL);
  struct timespec pause = {.tv_sec = 0, .tv_nsec = 500 * 1000 * 1000};
  nanosleep(&pause, NULL);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void rf_comm_mpi_init(int *argc, char ***argv) {
  int provided = 0;
  rf_die_set_abort_hook(rf_comm_abort_job);
  rf_comm_finalize_guard_init(); /* hydra's PMI socket, read before MPI_Init (finalize_guard.c) */
  RF_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  RF_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

/* MPICH's ring MPI_Allgatherv (the large-message algorithm) sends each step in
 * pieces of MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE bytes (32 KiB), one handshake
 * per piece: 2x slower than MPI_Allgather at W=2, and 30x or worse when ranks
 * share cores (docs/comm.md). Ragged shards all-gather through MPI_Allgatherv, so
 * raise it to 1 GiB through the MPI tool interface, unless the environment sets
 * it. The variable's scope is "equal on all processes": every process that
 * creates an rf_comm sets the same value. Other MPIs lack the variable: no-op. */
static void rf_comm_tune_mpi(void) {
  static const char name[] = "MPIR_CVAR_ALLGATHERV_PIPELINE_MSG_SIZE";
  if (getenv(name)) return;
  int provided = 0, index = 0, count = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return;
  MPI_T_cvar_handle handle;
  if (MPI_T_cvar_get_index(name, &index) == MPI_SUCCESS &&
      MPI_T_cvar_handle_alloc(index, NULL, &handle, &count) == MPI_SUCCESS) {
    char cname[128];
    int cname_len = (int)sizeof cname, verbosity = 0, bind = 0, scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype;
    int ok = MPI_T_cvar_get_info(index, cname, &cname_len, &verbosity, &type, &enumtype, NULL, NULL, &bind,
                                 &scope) == MPI_SUCCESS;
    if (ok && type == MPI_INT && count == 1) {
      int value = 1 << 30;
      if (MPI_T_cvar_write(handle, &value) == MPI_SUCCESS) rf_log_debug("comm: %s = %d", name, value);
    }
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
}

static const struct rf_comm_ops rf_comm_mpi_ops;

void rf_comm_init(struct rf_comm *comm, MPI_Comm parent) {
  memset(comm, 0, sizeof *comm);
  rf_die_set_abort_hook(rf_comm_abort_job);
  rf_comm_tune_mpi();
  struct rf_comm_mpi *m = rf_xcalloc(1, sizeof *m);
  RF_MPI_CHECK(MPI_Comm_dup(parent, &m->comm));
  RF_MPI_CHECK(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
  RF_MPI_CHECK(MPI_Comm_rank(m->comm, &comm->rank));
  RF_MPI_CHECK(MPI_Comm_size(m->comm, &comm->world));
  int thread_level = MPI_THREAD_SINGLE, world_rank = 0;
  RF_MPI_CHECK(MPI_Query_thread(&thread_level));
  comm->thread_multiple = thread_level == MPI_THREAD_MULTIPLE;
  RF_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &m->bf16_type));
  RF_MPI_CHECK(MPI_Type_commit(&m->bf16_type));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_sum, 1, &m->bf16_ops[RF_REDUCE_OP_SUM]));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_max, 1, &m->bf16_ops[RF_REDUCE_OP_MAX]));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_min, 1, &m->bf16_ops[RF_REDUCE_OP_MIN]));
  m->scratch = rf_xmalloc(4 * (size_t)comm->world * sizeof(int));
  rf_comm_mpi_agree_yielding(m);
  comm->ops = &rf_comm_mpi_ops;
  comm->impl = m;
  RF_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  rf_log_set_rank(world_rank);
}

static void rf_comm_mpi_free(struct rf_comm *comm) {
  struct rf_comm_mpi *m = comm->impl;
  for (int i = 0; i < 3; i++) RF_MPI_CHECK(MPI_Op_free(&m->bf16_ops[i]));
  RF_MPI_CHECK(MPI_Type_free(&m->bf16_type));
  RF_MPI_CHECK(MPI_Comm_free(&m->comm));
  free(m->scratch);
  free(m);
}

struct rf_comm *rf_comm_create_mpi(MPI_Comm parent) {
  struct rf_comm *comm = rf_xcalloc(1, sizeof *comm);
  rf_comm_init(comm, parent);
  return comm;
}

void rf_comm_init_world(struct rf_comm *comm) { rf_comm_init(comm, MPI_COMM_WORLD); }

int rf_comm_mpi_yielding(const struct rf_comm *comm) {
  RF_ASSERT(comm->ops == &rf_comm_mpi_ops);
  return rf_comm_mpi_of(comm)->yielding;
}

MPI_Comm rf_comm_mpi_handle(const struct rf_comm *comm) {
  RF_ASSERT(comm->ops == &rf_comm_mpi_ops);
  return rf_comm_mpi_of(comm)->comm;
}

void rf_comm_watchdog_hosts(const struct rf_comm *comm) {
  struct rf_comm_host_entry {
    char name[RF_COMM_HOST_NAME];
    int port;
  };
  struct rf_comm_host_entry me;
  memset(&me, 0, sizeof me);
  char name[MPI_MAX_PROCESSOR_NAME + 1] = "";
  int len = 0, world_rank = 0;
  RF_MPI_CHECK(MPI_Get_processor_name(name, &len));
  name[len < MPI_MAX_PROCESSOR_NAME ? len : MPI_MAX_PROCESSOR_NAME] = '\0';
  memcpy(me.name, name, sizeof me.name - 1); /* a longer name is cut: still one per host */
  uint16_t port = 0;
  if (rf_comm_watchdog_listen(&port) == 0) me.port = port;
  struct rf_comm_host_entry *all = rf_xcalloc((size_t)comm->world, sizeof *all);
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  RF_COMM_MPI_COLLECTIVE(m, MPI_Allgather, MPI_Iallgather, &me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me,
                         MPI_BYTE, m->comm);
  RF_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  /* every other host once, by its first rank */
  const char **hosts = rf_xcalloc((size_t)comm->world, sizeof *hosts);
  int *ranks = rf_xcalloc((size_t)comm->world, sizeof *ranks);
  uint16_t *ports = rf_xcalloc((size_t)comm->world, sizeof *ports);
  int n = 0;
  for (int r = 0; r < comm->world; r++) {
    all[r].name[RF_COMM_HOST_NAME - 1] = '\0';
    int seen = strcmp(all[r].name, me.name) == 0;
    for (int k = 0; k < n && !seen; k++) seen = strcmp(hosts[k], all[r].name) == 0;
    if (seen) continue;
    hosts[n] = all[r].name;
    ranks[n] = r;
    ports[n] = (uint16_t)all[r].port;
    n++;
  }
  rf_comm_watchdog_set_hosts(me.name, world_rank, n, hosts, ranks, ports);
  free(hosts);
  free(ranks);
  free(ports);
  free(all);
}

void rf_comm_mesh_init(struct rf_comm_mesh *mesh, MPI_Comm shard, MPI_Comm replicate) {
  rf_comm_init(&mesh->replicate, replicate);
  rf_comm_init(&mesh->shard, shard);
  rf_comm_mesh_mark(mesh, NULL);
}

/* MPI_Comm_split (or, for RF_COMM_SPLIT_NODE, MPI_Comm_split_type by shared
 * memory), then a communicator of its own on the result. */
static void rf_comm_mpi_split(const struct rf_comm *comm, int color, int key, struct rf_comm *out) {
  MPI_Comm part;
  MPI_Comm parent = rf_comm_mpi_of(comm)->comm;
  if (color == RF_COMM_SPLIT_NODE)
    RF_MPI_CHECK(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &part));
  else
    RF_MPI_CHECK(MPI_Comm_split(parent, color, key, &part));
  rf_comm_init(out, part);
  RF_MPI_CHECK(MPI_Comm_free(&part));
}

/* ---- types, ops, counts ---------------------------------------------------- */

static MPI_Datatype rf_comm_type(const struct rf_comm_mpi *m, enum rf_dtype dtype) {
  switch (dtype) {
    case RF_DTYPE_F32:
      return MPI_FLOAT;
    case RF_DTYPE_BF16:
      return m->bf16_type;
    case RF_DTYPE_FP8E4M3: /* moved as bytes; never reduced */
    case RF_DTYPE_U8:
      return MPI_UINT8_T;
    case RF_DTYPE_I32:
      return MPI_INT32_T;
    case RF_DTYPE_I64:
      return MPI_INT64_T;
    case RF_DTYPE_F64:
      return MPI_DOUBLE;
  }
  RF_DIE("unknown dtype %d", (int)dtype);
}

static MPI_Op rf_comm_op(const struct rf_comm_mpi *m, enum rf_dtype dtype, enum rf_reduce_op op) {
  RF_ASSERT(op == RF_REDUCE_OP_SUM || op == RF_REDUCE_OP_MAX || op == RF_REDUCE_OP_MIN);
  if (dtype == RF_DTYPE_FP8E4M3) RF_DIE("no reduction is defined on fp8e4m3 buffers");
  if (dtype == RF_DTYPE_BF16) return m->bf16_ops[op];
  static const MPI_Op ops[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
  return ops[op];
}

/* The MPI type a collective moves: the element type, or (for counts above the
 * limit) a contiguous run of `k` elements. Owns `type` when k > 1. */
struct rf_comm_unit {
  MPI_Datatype type;
  int64_t k;
};

/* Chooses the smallest k that divides every value of a[na] and b[nb] (b may be
 * NULL) and brings them all under the limit. */
static void rf_comm_unit_init(struct rf_comm_unit *unit, const struct rf_comm_mpi *m, enum rf_dtype dtype,
                              const int64_t *a, int na, const int64_t *b, int nb) {
  unit->type = rf_comm_type(m, dtype);
  unit->k = 1;
  int64_t max = 0, g = 0;
  for (int i = 0; i < na + nb; i++) {
    int64_t v = i < na ? a[i] : b ? b[i - na] : 0;
    RF_ASSERT(v >= 0);
    max = rf_max_i64(max, v);
    g = rf_gcd_i64(g, v);
  }
  if (max <= rf_comm_count_limit) return;
  int64_t need = rf_ceil_div(max, rf_comm_count_limit), best = 0;
  for (int64_t d = 1; d * d <= g; d++) {
    if (g % d != 0) continue;
    if (d >= need && (best == 0 || d < best)) best = d;
    if (g / d >= need && (best == 0 || g / d < best)) best = g / d;
  }
  if (best == 0 || best > INT_MAX)
    RF_DIE(
        "count %lld of %s exceeds MPI's int and the counts share no divisor to send it in units "
        "(gcd %lld); split the buffer",
        (long long)max, rf_dtype_name(dtype), (long long)g);
  unit->k = best;
  RF_MPI_CHECK(MPI_Type_contiguous((int)best, rf_comm_type(m, dtype), &unit->type));
  RF_MPI_CHECK(MPI_Type_commit(&unit->type));
}

static void rf_comm_unit_free(struct rf_comm_unit *unit) {
  if (unit->k > 1) RF_MPI_CHECK(MPI_Type_free(&unit->type));
}

/* Fills counts/displs (int, in units of k elements) from the starts array. */
static void rf_comm_fill_counts(int *counts, int *displs, const int64_t *starts, int world, int64_t k) {
  for (int r = 0; r < world; r++) {
    RF_ASSERT(starts[r + 1] >= starts[r]);
    counts[r] = (int)((starts[r + 1] - starts[r]) / k);
    if (displs) displs[r] = (int)(starts[r] / k);
  }
}

static int rf_comm_starts_exceed_limit(const int64_t *starts, int world) {
  for (int r = 0; r < world; r++)
    if (starts[r + 1] - starts[r] > rf_comm_count_limit) return 1;
  return 0;
}

/* Reduce-scatter for per-rank counts above the limit: one chunked reduce per root.
 * Exact and standard, at the cost of W separate reductions. Rank r's part is
 * [starts[r], starts[r+1]), or [r*block, (r+1)*block) when starts is NULL. */
static void rf_comm_reduce_scatter_chunked(const struct rf_comm *comm, const void *send, void *recv,
                                           const int64_t *starts, int64_t block, enum rf_dtype dtype) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  size_t size = rf_dtype_size(dtype);
  MPI_Datatype type = rf_comm_type(m, dtype);
  MPI_Op op = rf_comm_op(m, dtype, RF_REDUCE_OP_SUM);
  for (int root = 0; root < comm->world; root++) {
    int64_t first = starts ? starts[root] : root * block;
    int64_t count = starts ? starts[root + 1] - first : block;
    for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
      int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
      const char *s = (const char *)send + (size_t)(first + done) * size;
      char *d = root == comm->rank ? (char *)recv + (size_t)done * size : NULL;
      RF_COMM_MPI_COLLECTIVE(m, MPI_Reduce, MPI_Ireduce, s, d, n, type, op, root, m->comm);
    }
  }
}

/* ---- the table ------------------------------------------------------------- */

/* Where MPI reaches buffer `ptr` of a collective on comm: memory of the comm's device through
 * the device's view (rf_comm_on_device: the checked device's second mapping; the host's pointer
 * itself), which is what a CUDA-aware MPI does with a device pointer; host memory (comm->dev
 * NULL) and a device the host cannot view (CUDA: a CUDA-aware MPI takes its pointers) as given. */
static void *rf_comm_mpi_buf(const struct rf_comm *comm, const void *ptr) {
  const struct rf_device *dev = comm->dev;
  union {
    const void *in;
    void *out;
  } u = {.in = ptr}; /* MPI's receive buffers are not const */
  if (!ptr || !dev || dev->ops->host_memory || !dev->ops->view) return u.out;
  return rf_device_view(dev, ptr);
}

static void rf_comm_mpi_barrier(const struct rf_comm *comm) {
  MPI_Request request;
  RF_MPI_CHECK(MPI_Ibarrier(rf_comm_mpi_of(comm)->comm, &request));
  rf_comm_mpi_finish(&request);
}

/* bcast and allreduce have the same count on every rank: chunks at the limit (none when count is 0). */
static void rf_comm_mpi_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                              int root) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  size_t size = rf_dtype_size(dtype);
  buf = rf_comm_mpi_buf(comm, buf);
  for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
    int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
    RF_COMM_MPI_COLLECTIVE(m, MPI_Bcast, MPI_Ibcast, (char *)buf + (size_t)done * size, n,
                           rf_comm_type(m, dtype), root, m->comm);
  }
}

static void rf_comm_mpi_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                  enum rf_reduce_op op) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  size_t size = rf_dtype_size(dtype);
  MPI_Op mop = rf_comm_op(m, dtype, op);
  buf = rf_comm_mpi_buf(comm, buf);
  for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
    int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
    RF_COMM_MPI_COLLECTIVE(m, MPI_Allreduce, MPI_Iallreduce, MPI_IN_PLACE, (char *)buf + (size_t)done * size,
                           n, rf_comm_type(m, dtype), mop, m->comm);
  }
}

/* MPI_Iallreduce takes an int count: above it, the blocking chunks (a finished request). */
static void rf_comm_mpi_iallreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                   enum rf_reduce_op op, struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  MPI_Request request = MPI_REQUEST_NULL;
  if (count > rf_comm_count_limit) { /* above one call's count: the chunked blocking one, already finished */
    rf_comm_mpi_allreduce(comm, buf, count, dtype, op);
    rf_comm_mpi_req_store(req, request);
    return;
  }
  RF_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, rf_comm_mpi_buf(comm, buf), (int)count, rf_comm_type(m, dtype),
                              rf_comm_op(m, dtype, op), m->comm, &request));
  rf_comm_mpi_req_store(req, request);
}

static void rf_comm_mpi_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                                  struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, m, dtype, &count, 1, NULL, 0);
  buf = rf_comm_mpi_buf(comm, buf);
  if (req) {
    MPI_Request request;
    RF_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(count / unit.k), unit.type,
                                m->comm, &request));
    rf_comm_mpi_req_store(req, request);
  } else {
    RF_COMM_MPI_COLLECTIVE(m, MPI_Allgather, MPI_Iallgather, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf,
                           (int)(count / unit.k), unit.type, m->comm);
  }
  rf_comm_unit_free(&unit); /* MPI keeps the type alive until the operation ends */
}

static void rf_comm_mpi_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts,
                                   enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, m, dtype, starts, comm->world + 1, NULL, 0);
  buf = rf_comm_mpi_buf(comm, buf);
  int *counts = req ? req->counts : m->scratch, *displs = req ? req->displs : m->scratch + comm->world;
  rf_comm_fill_counts(counts, displs, starts, comm->world, unit.k);
  if (req) {
    MPI_Request request;
    RF_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, unit.type, m->comm,
                                 &request));
    rf_comm_mpi_req_store(req, request);
  } else {
    RF_COMM_MPI_COLLECTIVE(m, MPI_Allgatherv, MPI_Iallgatherv, MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf,
                           counts, displs, unit.type, m->comm);
  }
  rf_comm_unit_free(&unit);
}

static void rf_comm_mpi_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv,
                                             int64_t count, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  send = rf_comm_mpi_buf(comm, send);
  recv = rf_comm_mpi_buf(comm, recv);
  if (req) {
    if (count > rf_comm_count_limit)
      RF_DIE("non-blocking reduce-scatter of %lld elements per rank exceeds MPI's int; use the blocking one",
             (long long)count);
    MPI_Request request;
    RF_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, (int)count, rf_comm_type(m, dtype),
                                           rf_comm_op(m, dtype, RF_REDUCE_OP_SUM), m->comm, &request));
    rf_comm_mpi_req_store(req, request);
  } else if (count > rf_comm_count_limit) {
    rf_comm_reduce_scatter_chunked(comm, send, recv, NULL, count, dtype);
  } else {
    RF_COMM_MPI_COLLECTIVE(m, MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, send, recv, (int)count,
                           rf_comm_type(m, dtype), rf_comm_op(m, dtype, RF_REDUCE_OP_SUM), m->comm);
  }
}

static void rf_comm_mpi_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv,
                                       const int64_t *starts, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  int exceeds = rf_comm_starts_exceed_limit(starts, comm->world);
  send = rf_comm_mpi_buf(comm, send);
  recv = rf_comm_mpi_buf(comm, recv);
  if (req) {
    if (exceeds)
      RF_DIE("non-blocking reduce-scatter with a per-rank count above MPI's int; use the blocking one");
    rf_comm_fill_counts(req->counts, NULL, starts, comm->world, 1);
    MPI_Request request;
    RF_MPI_CHECK(MPI_Ireduce_scatter(send, recv, req->counts, rf_comm_type(m, dtype),
                                     rf_comm_op(m, dtype, RF_REDUCE_OP_SUM), m->comm, &request));
    rf_comm_mpi_req_store(req, request);
  } else if (exceeds) {
    rf_comm_reduce_scatter_chunked(comm, send, recv, starts, 0, dtype);
  } else {
    int *counts = m->scratch;
    rf_comm_fill_counts(counts, NULL, starts, comm->world, 1);
    RF_COMM_MPI_COLLECTIVE(m, MPI_Reduce_scatter, MPI_Ireduce_scatter, send, recv, counts,
                           rf_comm_type(m, dtype), rf_comm_op(m, dtype, RF_REDUCE_OP_SUM), m->comm);
  }
}

static void rf_comm_mpi_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                                  const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                                  const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req) {
  const struct rf_comm_mpi *m = rf_comm_mpi_of(comm);
  int w = comm->world;
  struct rf_comm_unit su, ru;
  send = rf_comm_mpi_buf(comm, send);
  recv = rf_comm_mpi_buf(comm, recv);
  rf_comm_unit_init(&su, m, dtype, send_counts, w, send_displs, w);
  rf_comm_unit_init(&ru, m, dtype, recv_counts, w, recv_displs, w);
  int *sc = req ? req->counts : m->scratch, *sd = req ? req->displs : m->scratch + w;
  int *rc = req ? req->recv_counts : m->scratch + 2 * w, *rd = req ? req->recv_displs : m->scratch + 3 * w;
  for (int r = 0; r < w; r++) {
    sc[r] = (int)(send_counts[r] / su.k);
    sd[r] = (int)(send_displs[r] / su.k);
    rc[r] = (int)(recv_counts[r] / ru.k);
    rd[r] = (int)(recv_displs[r] / ru.k);
  }
  if (req) {
    MPI_Request request;
    RF_MPI_CHECK(MPI_Ialltoallv(send, sc, sd, su.type, recv, rc, rd, ru.type, m->comm, &request));
    rf_comm_mpi_req_store(req, request);
  } else {
    RF_COMM_MPI_COLLECTIVE(m, MPI_Alltoallv, MPI_Ialltoallv, send, sc, sd, su.type, recv, rc, rd, ru.type,
                           m->comm);
  }
  rf_comm_unit_free(&su); /* MPI keeps the types alive until the operation ends */
  rf_comm_unit_free(&ru);
}

static int rf_comm_mpi_test(struct rf_comm_req *req) {
  MPI_Request request = rf_comm_mpi_req_load(req);
  int done = 0;
  RF_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  rf_comm_mpi_req_store(req, request);
  return done;
}

static void rf_comm_mpi_wait(struct rf_comm_req *req) {
  MPI_Request request = rf_comm_mpi_req_load(req);
  rf_comm_mpi_finish(&request);
  rf_comm_mpi_req_store(req, request);
}

/* MPI has no launches to batch. */
static void rf_comm_mpi_group(const struct rf_comm *comm) { (void)comm; }

/* stream_wait and event_record stay NULL: comm.c's host behaviour (the host waits for
 * a compute event; a collective's event is its request). */
static const struct rf_comm_ops rf_comm_mpi_ops = {
    .name = "mpi",
    .free = rf_comm_mpi_free,
    .barrier = rf_comm_mpi_barrier,
    .bcast = rf_comm_mpi_bcast,
    .allreduce = rf_comm_mpi_allreduce,
    .iallreduce = rf_comm_mpi_iallreduce,
    .allgather = rf_comm_mpi_allgather,
    .allgatherv = rf_comm_mpi_allgatherv,
    .reduce_scatter_block = rf_comm_mpi_reduce_scatter_block,
    .reduce_scatter = rf_comm_mpi_reduce_scatter,
    .alltoallv = rf_comm_mpi_alltoallv,
    .test = rf_comm_mpi_test,
    .wait = rf_comm_mpi_wait,
    .group_begin = rf_comm_mpi_group,
    .group_end = rf_comm_mpi_group,
    .split = rf_comm_mpi_split,
};
