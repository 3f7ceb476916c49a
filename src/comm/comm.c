/* The communicator over MPI: blocking and non-blocking collectives on flat buffers.
 *
 * Counts are int64 here and int in MPI. A count above the limit (INT_MAX) is sent
 * as fewer units of a contiguous datatype of k elements, when k divides every count
 * and displacement involved (MPI matches type signatures, so sender and receiver
 * may pick different k). Reductions on such counts are split into chunks instead,
 * because predefined MPI ops are defined on predefined datatypes only. */
#include "comm/comm.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Checks the return code of an MPI call; an error stops every rank with MPI's
 * description of it, the file and the line. */
#define RF_MPI_CHECK(call)                                                            \
  do {                                                                                \
    int rf_mpi_rc_ = (call);                                                          \
    if (rf_mpi_rc_ != MPI_SUCCESS) {                                                  \
      char rf_mpi_text_[MPI_MAX_ERROR_STRING];                                        \
      int rf_mpi_len_ = 0;                                                            \
      if (MPI_Error_string(rf_mpi_rc_, rf_mpi_text_, &rf_mpi_len_) != MPI_SUCCESS)    \
        snprintf(rf_mpi_text_, sizeof rf_mpi_text_, "MPI error code %d", rf_mpi_rc_); \
      RF_DIE("%s failed: %s", #call, rf_mpi_text_);                                   \
    }                                                                                 \
  } while (0)

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

/* rf_die's abort hook: a fatal error on one rank ends every rank of the job. */
static void rf_comm_abort_job(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
}

void rf_comm_mpi_init(int *argc, char ***argv) {
  int provided = 0;
  rf_die_set_abort_hook(rf_comm_abort_job);
  RF_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
  RF_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

void rf_comm_mpi_finalize(void) { RF_MPI_CHECK(MPI_Finalize()); }

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

void rf_comm_init(struct rf_comm *comm, MPI_Comm parent) {
  memset(comm, 0, sizeof *comm);
  rf_die_set_abort_hook(rf_comm_abort_job);
  rf_comm_tune_mpi();
  RF_MPI_CHECK(MPI_Comm_dup(parent, &comm->comm));
  RF_MPI_CHECK(MPI_Comm_set_errhandler(comm->comm, MPI_ERRORS_RETURN));
  RF_MPI_CHECK(MPI_Comm_rank(comm->comm, &comm->rank));
  RF_MPI_CHECK(MPI_Comm_size(comm->comm, &comm->world));
  RF_MPI_CHECK(MPI_Query_thread(&comm->thread_level));
  RF_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &comm->bf16_type));
  RF_MPI_CHECK(MPI_Type_commit(&comm->bf16_type));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_sum, 1, &comm->bf16_ops[RF_REDUCE_OP_SUM]));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_max, 1, &comm->bf16_ops[RF_REDUCE_OP_MAX]));
  RF_MPI_CHECK(MPI_Op_create(rf_comm_bf16_min, 1, &comm->bf16_ops[RF_REDUCE_OP_MIN]));
  comm->scratch = rf_xmalloc(4 * (size_t)comm->world * sizeof(int));
  rf_log_set_rank(comm->rank);
}

void rf_comm_free(struct rf_comm *comm) {
  for (int i = 0; i < 3; i++) RF_MPI_CHECK(MPI_Op_free(&comm->bf16_ops[i]));
  RF_MPI_CHECK(MPI_Type_free(&comm->bf16_type));
  RF_MPI_CHECK(MPI_Comm_free(&comm->comm));
  free(comm->scratch);
  memset(comm, 0, sizeof *comm);
}

/* ---- types, ops, counts ---------------------------------------------------- */

static MPI_Datatype rf_comm_type(const struct rf_comm *comm, enum rf_dtype dtype) {
  switch (dtype) {
    case RF_DTYPE_F32:
      return MPI_FLOAT;
    case RF_DTYPE_BF16:
      return comm->bf16_type;
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

static MPI_Op rf_comm_op(const struct rf_comm *comm, enum rf_dtype dtype, enum rf_reduce_op op) {
  RF_ASSERT(op == RF_REDUCE_OP_SUM || op == RF_REDUCE_OP_MAX || op == RF_REDUCE_OP_MIN);
  if (dtype == RF_DTYPE_FP8E4M3) RF_DIE("no reduction is defined on fp8e4m3 buffers");
  if (dtype == RF_DTYPE_BF16) return comm->bf16_ops[op];
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
static void rf_comm_unit_init(struct rf_comm_unit *unit, const struct rf_comm *comm, enum rf_dtype dtype,
                              const int64_t *a, int na, const int64_t *b, int nb) {
  unit->type = rf_comm_type(comm, dtype);
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
  RF_MPI_CHECK(MPI_Type_contiguous((int)best, rf_comm_type(comm, dtype), &unit->type));
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

static void rf_comm_check_starts(const int64_t *starts, int world) {
  RF_ASSERT(starts[0] == 0);
  for (int r = 0; r < world; r++) RF_ASSERT(starts[r + 1] >= starts[r]);
}

static void rf_comm_count_done(uint64_t t0) {
  rf_counters_global.collectives++;
  rf_counters_global.comm_wait_ns += rf_time_ns() - t0;
}

/* ---- blocking ------------------------------------------------------------- */

void rf_comm_barrier(const struct rf_comm *comm) {
  uint64_t t0 = rf_time_ns();
  RF_MPI_CHECK(MPI_Barrier(comm->comm));
  rf_comm_count_done(t0);
}

/* bcast and allreduce have the same count on every rank: chunks at the limit (none when count is 0). */
void rf_comm_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype, int root) {
  RF_ASSERT(count >= 0 && root >= 0 && root < comm->world);
  uint64_t t0 = rf_time_ns();
  size_t size = rf_dtype_size(dtype);
  for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
    int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
    RF_MPI_CHECK(
        MPI_Bcast((char *)buf + (size_t)done * size, n, rf_comm_type(comm, dtype), root, comm->comm));
  }
  rf_comm_count_done(t0);
}

void rf_comm_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                       enum rf_reduce_op op) {
  RF_ASSERT(count >= 0);
  uint64_t t0 = rf_time_ns();
  size_t size = rf_dtype_size(dtype);
  MPI_Op mop = rf_comm_op(comm, dtype, op);
  for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
    int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
    RF_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)done * size, n, rf_comm_type(comm, dtype),
                               mop, comm->comm));
  }
  if (comm->world > 1) rf_counters_global.bytes_reduced += (uint64_t)count * size;
  rf_comm_count_done(t0);
}

void rf_comm_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype) {
  RF_ASSERT(count >= 0);
  uint64_t t0 = rf_time_ns();
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, comm, dtype, &count, 1, NULL, 0);
  RF_MPI_CHECK(
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(count / unit.k), unit.type, comm->comm));
  rf_comm_unit_free(&unit);
  rf_counters_global.bytes_gathered += (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype);
  rf_comm_count_done(t0);
}

void rf_comm_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype) {
  rf_comm_check_starts(starts, comm->world);
  uint64_t t0 = rf_time_ns();
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, comm, dtype, starts, comm->world + 1, NULL, 0);
  int *counts = comm->scratch, *displs = comm->scratch + comm->world;
  rf_comm_fill_counts(counts, displs, starts, comm->world, unit.k);
  RF_MPI_CHECK(
      MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, counts, displs, unit.type, comm->comm));
  rf_comm_unit_free(&unit);
  int64_t others = starts[comm->world] - (starts[comm->rank + 1] - starts[comm->rank]);
  rf_counters_global.bytes_gathered += (uint64_t)others * rf_dtype_size(dtype);
  rf_comm_count_done(t0);
}

/* Reduce-scatter for per-rank counts above the limit: one chunked reduce per root.
 * Exact and standard, at the cost of W separate reductions. Rank r's part is
 * [starts[r], starts[r+1]), or [r*block, (r+1)*block) when starts is NULL. */
static void rf_comm_reduce_scatter_chunked(const struct rf_comm *comm, const void *send, void *recv,
                                           const int64_t *starts, int64_t block, enum rf_dtype dtype) {
  size_t size = rf_dtype_size(dtype);
  MPI_Datatype type = rf_comm_type(comm, dtype);
  MPI_Op op = rf_comm_op(comm, dtype, RF_REDUCE_OP_SUM);
  for (int root = 0; root < comm->world; root++) {
    int64_t first = starts ? starts[root] : root * block;
    int64_t count = starts ? starts[root + 1] - first : block;
    for (int64_t done = 0; done < count; done += rf_comm_count_limit) {
      int n = (int)rf_min_i64(count - done, rf_comm_count_limit);
      const char *s = (const char *)send + (size_t)(first + done) * size;
      char *d = root == comm->rank ? (char *)recv + (size_t)done * size : NULL;
      RF_MPI_CHECK(MPI_Reduce(s, d, n, type, op, root, comm->comm));
    }
  }
}

static int rf_comm_starts_exceed_limit(const int64_t *starts, int world) {
  for (int r = 0; r < world; r++)
    if (starts[r + 1] - starts[r] > rf_comm_count_limit) return 1;
  return 0;
}

void rf_comm_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                  enum rf_dtype dtype) {
  RF_ASSERT(count >= 0);
  uint64_t t0 = rf_time_ns();
  size_t size = rf_dtype_size(dtype);
  if (count > rf_comm_count_limit) {
    rf_comm_reduce_scatter_chunked(comm, send, recv, NULL, count, dtype);
  } else {
    RF_MPI_CHECK(MPI_Reduce_scatter_block(send, recv, (int)count, rf_comm_type(comm, dtype),
                                          rf_comm_op(comm, dtype, RF_REDUCE_OP_SUM), comm->comm));
  }
  rf_counters_global.bytes_reduced += (uint64_t)(comm->world - 1) * (uint64_t)count * size;
  rf_comm_count_done(t0);
}

void rf_comm_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                            enum rf_dtype dtype) {
  rf_comm_check_starts(starts, comm->world);
  uint64_t t0 = rf_time_ns();
  if (rf_comm_starts_exceed_limit(starts, comm->world)) {
    rf_comm_reduce_scatter_chunked(comm, send, recv, starts, 0, dtype);
  } else {
    int *counts = comm->scratch;
    rf_comm_fill_counts(counts, NULL, starts, comm->world, 1);
    RF_MPI_CHECK(MPI_Reduce_scatter(send, recv, counts, rf_comm_type(comm, dtype),
                                    rf_comm_op(comm, dtype, RF_REDUCE_OP_SUM), comm->comm));
  }
  int64_t others = starts[comm->world] - (starts[comm->rank + 1] - starts[comm->rank]);
  rf_counters_global.bytes_reduced += (uint64_t)others * rf_dtype_size(dtype);
  rf_comm_count_done(t0);
}

void rf_comm_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                       const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs, enum rf_dtype dtype) {
  int w = comm->world;
  uint64_t t0 = rf_time_ns();
  struct rf_comm_unit su, ru;
  rf_comm_unit_init(&su, comm, dtype, send_counts, w, send_displs, w);
  rf_comm_unit_init(&ru, comm, dtype, recv_counts, w, recv_displs, w);
  int *sc = comm->scratch, *sd = sc + w, *rc = sd + w, *rd = rc + w;
  uint64_t sent = 0;
  for (int r = 0; r < w; r++) {
    sc[r] = (int)(send_counts[r] / su.k);
    sd[r] = (int)(send_displs[r] / su.k);
    rc[r] = (int)(recv_counts[r] / ru.k);
    rd[r] = (int)(recv_displs[r] / ru.k);
    if (r != comm->rank) sent += (uint64_t)send_counts[r];
  }
  RF_MPI_CHECK(MPI_Alltoallv(send, sc, sd, su.type, recv, rc, rd, ru.type, comm->comm));
  rf_comm_unit_free(&su);
  rf_comm_unit_free(&ru);
  rf_counters_global.bytes_alltoall += sent * rf_dtype_size(dtype);
  rf_comm_count_done(t0);
}

/* ---- non-blocking --------------------------------------------------------- */

void rf_comm_req_init(struct rf_comm_req *req, int world) {
  memset(req, 0, sizeof *req);
  req->request = MPI_REQUEST_NULL;
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
  req->request = MPI_REQUEST_NULL;
}

static void rf_comm_req_start(const struct rf_comm *comm, struct rf_comm_req *req) {
  RF_ASSERT(!req->active);
  RF_ASSERT(req->capacity >= comm->world);
}

static void rf_comm_req_started(struct rf_comm_req *req, uint64_t bytes, uint64_t *counter) {
  req->active = 1;
  req->bytes = bytes;
  *counter += bytes;
  rf_counters_global.collectives++;
}

void rf_comm_iallgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        struct rf_comm_req *req) {
  RF_ASSERT(count >= 0);
  rf_comm_req_start(comm, req);
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, comm, dtype, &count, 1, NULL, 0);
  RF_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)(count / unit.k), unit.type,
                              comm->comm, &req->request));
  rf_comm_unit_free(&unit); /* MPI keeps the type alive until the operation ends */
  rf_comm_req_started(req, (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype),
                      &rf_counters_global.bytes_gathered);
}

void rf_comm_iallgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype,
                         struct rf_comm_req *req) {
  rf_comm_check_starts(starts, comm->world);
  rf_comm_req_start(comm, req);
  struct rf_comm_unit unit;
  rf_comm_unit_init(&unit, comm, dtype, starts, comm->world + 1, NULL, 0);
  rf_comm_fill_counts(req->counts, req->displs, starts, comm->world, unit.k);
  RF_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, req->counts, req->displs, unit.type,
                               comm->comm, &req->request));
  rf_comm_unit_free(&unit);
  int64_t others = starts[comm->world] - (starts[comm->rank + 1] - starts[comm->rank]);
  rf_comm_req_started(req, (uint64_t)others * rf_dtype_size(dtype), &rf_counters_global.bytes_gathered);
}

void rf_comm_ireduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                   enum rf_dtype dtype, struct rf_comm_req *req) {
  RF_ASSERT(count >= 0);
  rf_comm_req_start(comm, req);
  if (count > rf_comm_count_limit)
    RF_DIE("non-blocking reduce-scatter of %lld elements per rank exceeds MPI's int; use the blocking one",
           (long long)count);
  RF_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, (int)count, rf_comm_type(comm, dtype),
                                         rf_comm_op(comm, dtype, RF_REDUCE_OP_SUM), comm->comm,
                                         &req->request));
  rf_comm_req_started(req, (uint64_t)(comm->world - 1) * (uint64_t)count * rf_dtype_size(dtype),
                      &rf_counters_global.bytes_reduced);
}

void rf_comm_ireduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                             enum rf_dtype dtype, struct rf_comm_req *req) {
  rf_comm_check_starts(starts, comm->world);
  rf_comm_req_start(comm, req);
  if (rf_comm_starts_exceed_limit(starts, comm->world))
    RF_DIE("non-blocking reduce-scatter with a per-rank count above MPI's int; use the blocking one");
  rf_comm_fill_counts(req->counts, NULL, starts, comm->world, 1);
  RF_MPI_CHECK(MPI_Ireduce_scatter(send, recv, req->counts, rf_comm_type(comm, dtype),
                                   rf_comm_op(comm, dtype, RF_REDUCE_OP_SUM), comm->comm, &req->request));
  int64_t others = starts[comm->world] - (starts[comm->rank + 1] - starts[comm->rank]);
  rf_comm_req_started(req, (uint64_t)others * rf_dtype_size(dtype), &rf_counters_global.bytes_reduced);
}

void rf_comm_ialltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                        const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                        const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req) {
  int w = comm->world;
  rf_comm_req_start(comm, req);
  struct rf_comm_unit su, ru;
  rf_comm_unit_init(&su, comm, dtype, send_counts, w, send_displs, w);
  rf_comm_unit_init(&ru, comm, dtype, recv_counts, w, recv_displs, w);
  uint64_t sent = 0;
  for (int r = 0; r < w; r++) {
    req->counts[r] = (int)(send_counts[r] / su.k);
    req->displs[r] = (int)(send_displs[r] / su.k);
    req->recv_counts[r] = (int)(recv_counts[r] / ru.k);
    req->recv_displs[r] = (int)(recv_displs[r] / ru.k);
    if (r != comm->rank) sent += (uint64_t)send_counts[r];
  }
  RF_MPI_CHECK(MPI_Ialltoallv(send, req->counts, req->displs, su.type, recv, req->recv_counts,
                              req->recv_displs, ru.type, comm->comm, &req->request));
  rf_comm_unit_free(&su); /* MPI keeps the types alive until the operation ends */
  rf_comm_unit_free(&ru);
  rf_comm_req_started(req, sent * rf_dtype_size(dtype), &rf_counters_global.bytes_alltoall);
}

int rf_comm_test(struct rf_comm_req *req) {
  if (!req->active) return 1;
  int done = 0;
  RF_MPI_CHECK(MPI_Test(&req->request, &done, MPI_STATUS_IGNORE));
  if (done) req->active = 0;
  return done;
}

void rf_comm_wait(struct rf_comm_req *req) {
  if (!req->active) return;
  uint64_t t0 = rf_time_ns();
  RF_MPI_CHECK(MPI_Wait(&req->request, MPI_STATUS_IGNORE));
  rf_counters_global.comm_wait_ns += rf_time_ns() - t0;
  req->active = 0;
}
