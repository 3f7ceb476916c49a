/* rf-test: np=1,2,3,4,5 timeout=60
 * Every collective of src/comm on random data against an expectation computed
 * serially on every rank: each rank regenerates all ranks' inputs from the seed.
 *
 * Sums: MPI may add the W contributions in any order.
 *  - f32: each of the W-1 additions of MPI and of the reference errs by at most
 *    u*S (u = 2^-24, S = sum of |x_r|), so |got - want| <= 2*W*2^-24*S.
 *  - bf16: the op rounds every partial sum to bf16 (u = 2^-8), the reference
 *    (f32 sum, then one rounding) once: |got - want| <= W*2^-8*S + the f32 bound.
 *    At W <= 2 the op runs once on the same two f32 values as the reference, so
 *    the result must be bit-identical (this catches truncation instead of RNE).
 * Gathers, broadcast and all-to-all move bytes and are compared exactly.
 * Everything runs twice: on a comm whose waits spin (RF_MPI_WAIT=spin: MPI_Wait,
 * the blocking calls) and on one that yields its core (RF_MPI_WAIT=yield: MPI_Test
 * and sleeps, the blocking calls' non-blocking twins); and the automatic choice
 * (unset) must yield exactly when the ranks outnumber this machine's cores. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "rf_test.h"

static struct rf_comm comm;
static struct rf_counters counters; /* comm's */

static const int64_t counts_list[] = {1, 3, 7, 1001};
#define N_COUNTS 4

static uint64_t seed_of(int test, int rank, int64_t salt) {
  return 0x5eedull * 1000003ull + (uint64_t)test * 7919ull + (uint64_t)rank * 104729ull + (uint64_t)salt;
}

/* Rank `rank`'s input for `test`: random values of dtype (f32 and bf16 in [-1, 1),
 * other types random bytes). */
static void gen(void *buf, enum rf_dtype dtype, int64_t n, int test, int rank) {
  uint64_t s = seed_of(test, rank, n);
  for (int64_t i = 0; i < n; i++) {
    if (dtype == RF_DTYPE_F32)
      ((float *)buf)[i] = rf_test_rand_f32(&s);
    else if (dtype == RF_DTYPE_BF16)
      ((uint16_t *)buf)[i] = rf_bf16_from_f32(rf_test_rand_f32(&s));
    else
      for (size_t b = 0; b < rf_dtype_size(dtype); b++)
        ((uint8_t *)buf)[(size_t)i * rf_dtype_size(dtype) + b] = (uint8_t)rf_test_rand_u64(&s);
  }
}

static double value_at(const void *buf, enum rf_dtype dtype, int64_t i) {
  if (dtype == RF_DTYPE_BF16) return rf_f32_from_bf16(((const uint16_t *)buf)[i]);
  return ((const float *)buf)[i];
}

/* Per-rank counts for a ragged test: some ranks get zero. */
static void ragged_starts(int64_t *starts, int world, int test, int64_t scale) {
  uint64_t s = seed_of(test, 99, scale);
  starts[0] = 0;
  for (int r = 0; r < world; r++) {
    uint64_t u = rf_test_rand_u64(&s);
    int64_t c = (u % 3 == 0) ? 0 : counts_list[(u >> 8) % N_COUNTS];
    if (world > 1 && r == test % world) c = 0; /* at least one empty rank */
    starts[r + 1] = starts[r] + c * scale;
  }
}

/* ---- gathers ------------------------------------------------------------- */

static void check_allgather(int test, enum rf_dtype dtype, int64_t n, int nonblocking) {
  size_t es = rf_dtype_size(dtype);
  int w = comm.world;
  uint8_t *buf = rf_xmalloc((size_t)(w * n) * es + 1), *want = rf_xmalloc((size_t)n * es + 1);
  memset(buf, 0xa5, (size_t)(w * n) * es);
  gen(buf + (size_t)(comm.rank * n) * es, dtype, n, test, comm.rank);
  struct rf_counters before = counters;
  if (nonblocking) {
    struct rf_comm_req req;
    rf_comm_req_init(&req, w);
    rf_comm_iallgather(&comm, buf, n, dtype, &req);
    rf_comm_wait(&req);
    RF_CHECK(rf_comm_test(&req) == 1, "a finished request tests as finished");
    rf_comm_req_free(&req);
  } else {
    rf_comm_allgather(&comm, buf, n, dtype);
  }
  struct rf_counters d = rf_counters_diff(&counters, &before);
  RF_CHECK(d.collectives == 1, "allgather counts one collective, got %llu",
           (unsigned long long)d.collectives);
  RF_CHECK(d.bytes_gathered == (uint64_t)((w - 1) * n) * es, "allgather bytes_gathered %llu",
           (unsigned long long)d.bytes_gathered);
  for (int q = 0; q < w; q++) {
    gen(want, dtype, n, test, q);
    RF_CHECK(memcmp(buf + (size_t)(q * n) * es, want, (size_t)n * es) == 0,
             "allgather%s %s n=%lld: slot of rank %d differs", nonblocking ? " (nb)" : "",
             rf_dtype_name(dtype), (long long)n, q);
  }
  free(buf);
  free(want);
}

static void check_allgatherv(int test, enum rf_dtype dtype, int64_t scale, int nonblocking) {
  size_t es = rf_dtype_size(dtype);
  int w = comm.world;
  int64_t starts[8 + 1];
  ragged_starts(starts, w, test, scale);
  int64_t total = starts[w], mine = starts[comm.rank + 1] - starts[comm.rank];
  uint8_t *buf = rf_xmalloc((size_t)total * es + 1), *want = rf_xmalloc((size_t)total * es + 1);
  memset(buf, 0x5a, (size_t)total * es);
  gen(buf + (size_t)starts[comm.rank] * es, dtype, mine, test, comm.rank);
  struct rf_counters before = counters;
  if (nonblocking) {
    struct rf_comm_req req;
    rf_comm_req_init(&req, w);
    uint64_t allocs = rf_heap_allocations();
    rf_comm_iallgatherv(&comm, buf, starts, dtype, &req);
    RF_CHECK(rf_heap_allocations() == allocs, "iallgatherv start allocates nothing");
    while (!rf_comm_test(&req)) {
    }
    rf_comm_req_free(&req);
  } else {
    rf_comm_allgatherv(&comm, buf, starts, dtype);
  }
  struct rf_counters d = rf_counters_diff(&counters, &before);
  RF_CHECK(d.bytes_gathered == (uint64_t)(total - mine) * es, "allgatherv bytes_gathered %llu",
           (unsigned long long)d.bytes_gathered);
  for (int q = 0; q < w; q++) gen(want + (size_t)starts[q] * es, dtype, starts[q + 1] - starts[q], test, q);
  RF_CHECK(memcmp(buf, want, (size_t)total * es) == 0, "allgatherv%s %s total=%lld differs",
           nonblocking ? " (nb)" : "", rf_dtype_name(dtype), (long long)total);
  free(buf);
  free(want);
}

/* ---- reductions ----------------------------------------------------------- */

/* Compares got[n] (dtype) with the reference sum over ranks of the inputs[q]
 * elements [first, first+n), where inputs come from gen(test, q) over `len`. */
static void check_sum(const void *got, enum rf_dtype dtype, int64_t first, int64_t n, int test, int64_t len,
                      const char *what) {
  int w = comm.world;
  size_t es = rf_dtype_size(dtype);
  uint8_t *in = rf_xmalloc((size_t)(w * len) * es + 1);
  for (int q = 0; q < w; q++) gen(in + (size_t)(q * len) * es, dtype, len, test, q);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; i++) {
    float acc = 0.0f;
    double abs_sum = 0.0;
    for (int q = 0; q < w; q++) {
      float x = (float)value_at(in + (size_t)(q * len) * es, dtype, first + i);
      acc += x;
      abs_sum += fabs(x);
    }
    double g = value_at(got, dtype, i), want = acc, tol = 2.0 * w * 0x1p-24 * abs_sum;
    if (dtype == RF_DTYPE_BF16) {
      uint16_t wb = rf_bf16_from_f32(acc);
      want = rf_f32_from_bf16(wb);
      tol += w * 0x1p-8 * abs_sum;
      if (w <= 2 && ((const uint16_t *)got)[i] != wb) {
        bad++;
        RF_CHECK(0, "%s bf16 at W<=2 must be bit-exact: element %lld got %a want %a", what, (long long)i, g,
                 want);
      }
    }
    if (!(fabs(g - want) <= tol)) bad++;
    RF_CHECK(fabs(g - want) <= tol, "%s %s element %lld: got %.9g want %.9g (tol %.3g)", what,
             rf_dtype_name(dtype), (long long)(first + i), g, want, tol);
  }
  free(in);
}

static void check_reduce_scatter_block(int test, enum rf_dtype dtype, int64_t n, int nonblocking) {
  int w = comm.world;
  size_t es = rf_dtype_size(dtype);
  uint8_t *send = rf_xmalloc((size_t)(w * n) * es + 1), *recv = rf_xmalloc((size_t)n * es + 1);
  gen(send, dtype, w * n, test, comm.rank);
  struct rf_counters before = counters;
  if (nonblocking) {
    struct rf_comm_req req;
    rf_comm_req_init(&req, w);
    rf_comm_ireduce_scatter_block(&comm, send, recv, n, dtype, &req);
    rf_comm_wait(&req);
    rf_comm_req_free(&req);
  } else {
    rf_comm_reduce_scatter_block(&comm, send, recv, n, dtype);
  }
  struct rf_counters d = rf_counters_diff(&counters, &before);
  RF_CHECK(d.bytes_reduced == (uint64_t)((w - 1) * n) * es, "reduce_scatter_block bytes_reduced %llu",
           (unsigned long long)d.bytes_reduced);
  check_sum(recv, dtype, comm.rank * n, n, test, w * n,
            nonblocking ? "ireduce_scatter_block" : "reduce_scatter_block");
  free(send);
  free(recv);
}

static void check_reduce_scatter(int test, enum rf_dtype dtype, int64_t scale, int nonblocking) {
  int w = comm.world;
  size_t es = rf_dtype_size(dtype);
  int64_t starts[8 + 1];
  ragged_starts(starts, w, test, scale);
  int64_t total = starts[w], mine = starts[comm.rank + 1] - starts[comm.rank];
  uint8_t *send = rf_xmalloc((size_t)total * es + 1), *recv = rf_xmalloc((size_t)mine * es + 1);
  gen(send, dtype, total, test, comm.rank);
  if (nonblocking) {
    struct rf_comm_req req;
    rf_comm_req_init(&req, w);
    uint64_t allocs = rf_heap_allocations();
    rf_comm_ireduce_scatter(&comm, send, recv, starts, dtype, &req);
    RF_CHECK(rf_heap_allocations() == allocs, "ireduce_scatter start allocates nothing");
    rf_comm_wait(&req);
    rf_comm_req_free(&req);
  } else {
    rf_comm_reduce_scatter(&comm, send, recv, starts, dtype);
  }
  check_sum(recv, dtype, starts[comm.rank], mine, test, total,
            nonblocking ? "ireduce_scatter" : "reduce_scatter");
  free(send);
  free(recv);
}

static void check_allreduce_sum(int test, enum rf_dtype dtype, int64_t n) {
  size_t es = rf_dtype_size(dtype);
  uint8_t *buf = rf_xmalloc((size_t)n * es + 1);
  gen(buf, dtype, n, test, comm.rank);
  rf_comm_allreduce(&comm, buf, n, dtype, RF_REDUCE_OP_SUM);
  check_sum(buf, dtype, 0, n, test, n, "allreduce sum");
  free(buf);
}

/* Max and min are exact: the result is one of the inputs. */
static void check_allreduce_minmax(int test, enum rf_dtype dtype, int64_t n) {
  int w = comm.world;
  size_t es = rf_dtype_size(dtype);
  uint8_t *mx = rf_xmalloc((size_t)n * es + 1), *mn = rf_xmalloc((size_t)n * es + 1);
  uint8_t *in = rf_xmalloc((size_t)(w * n) * es + 1);
  gen(mx, dtype, n, test, comm.rank);
  memcpy(mn, mx, (size_t)n * es);
  rf_comm_allreduce(&comm, mx, n, dtype, RF_REDUCE_OP_MAX);
  rf_comm_allreduce(&comm, mn, n, dtype, RF_REDUCE_OP_MIN);
  for (int q = 0; q < w; q++) gen(in + (size_t)(q * n) * es, dtype, n, test, q);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; i++) {
    double hi = -INFINITY, lo = INFINITY;
    for (int q = 0; q < w; q++) {
      double x = value_at(in + (size_t)(q * n) * es, dtype, i);
      hi = fmax(hi, x);
      lo = fmin(lo, x);
    }
    bad += value_at(mx, dtype, i) != hi || value_at(mn, dtype, i) != lo;
    RF_CHECK(value_at(mx, dtype, i) == hi, "allreduce max %s element %lld", rf_dtype_name(dtype),
             (long long)i);
    RF_CHECK(value_at(mn, dtype, i) == lo, "allreduce min %s element %lld", rf_dtype_name(dtype),
             (long long)i);
  }
  free(mx);
  free(mn);
  free(in);
}

/* Integer sums are exact in any order. */
static void check_allreduce_i64(int test) {
  int w = comm.world;
  int64_t v[3] = {comm.rank + 1, -(int64_t)comm.rank * 1000000007LL, (int64_t)test << 40};
  rf_comm_allreduce(&comm, v, 3, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  RF_CHECK(v[0] == (int64_t)w * (w + 1) / 2, "i64 sum %lld", (long long)v[0]);
  RF_CHECK(v[1] == -(int64_t)w * (w - 1) / 2 * 1000000007LL, "i64 sum %lld", (long long)v[1]);
  RF_CHECK(v[2] == ((int64_t)test << 40) * w, "i64 sum %lld", (long long)v[2]);
  int32_t m[2] = {comm.rank, -comm.rank};
  rf_comm_allreduce(&comm, m, 2, RF_DTYPE_I32, RF_REDUCE_OP_MAX);
  RF_CHECK(m[0] == w - 1 && m[1] == 0, "i32 max %d %d", m[0], m[1]);
}

/* ---- bcast, alltoallv ------------------------------------------------------ */

static void check_bcast(int test, enum rf_dtype dtype, int64_t n) {
  size_t es = rf_dtype_size(dtype);
  uint8_t *buf = rf_xmalloc((size_t)n * es + 1), *want = rf_xmalloc((size_t)n * es + 1);
  for (int root = 0; root < comm.world; root++) {
    memset(buf, 0, (size_t)n * es);
    if (comm.rank == root) gen(buf, dtype, n, test, root);
    rf_comm_bcast(&comm, buf, n, dtype, root);
    gen(want, dtype, n, test, root);
    RF_CHECK(memcmp(buf, want, (size_t)n * es) == 0, "bcast %s n=%lld from %d", rf_dtype_name(dtype),
             (long long)n, root);
  }
  free(buf);
  free(want);
}

/* Elements rank r sends to rank q: zero for some pairs. */
static int64_t a2a_count(int test, int r, int q, int64_t scale) {
  uint64_t s = seed_of(test, r * 16 + q, 7);
  uint64_t u = rf_test_rand_u64(&s);
  return (u % 4 == 0) ? 0 : (int64_t)(1 + (u >> 8) % 40) * scale;
}

static int64_t a2a_value(int r, int q, int64_t i) { return ((int64_t)r << 40) | ((int64_t)q << 20) | i; }

/* Send and receive layouts with gaps (1 and 2 elements) between peers, which
 * must stay untouched. */
static void check_alltoallv(int test, int64_t scale) {
  int w = comm.world, me = comm.rank;
  int64_t sc[8], sd[8], rc[8], rd[8], stotal = 0, rtotal = 0;
  for (int q = 0; q < w; q++) {
    sc[q] = a2a_count(test, me, q, scale);
    sd[q] = stotal;
    stotal += sc[q] + scale;
    rc[q] = a2a_count(test, q, me, scale);
    rd[q] = rtotal;
    rtotal += rc[q] + 2 * scale;
  }
  int64_t *send = rf_xmalloc((size_t)stotal * 8 + 8), *recv = rf_xmalloc((size_t)rtotal * 8 + 8);
  for (int64_t i = 0; i < stotal; i++) send[i] = -1;
  for (int64_t i = 0; i < rtotal; i++) recv[i] = -2;
  for (int q = 0; q < w; q++)
    for (int64_t i = 0; i < sc[q]; i++) send[sd[q] + i] = a2a_value(me, q, i);
  struct rf_counters before = counters;
  rf_comm_alltoallv(&comm, send, sc, sd, recv, rc, rd, RF_DTYPE_I64);
  struct rf_counters d = rf_counters_diff(&counters, &before);
  RF_CHECK(d.bytes_alltoall == (uint64_t)(stotal - (int64_t)w * scale - sc[me]) * 8, "alltoallv bytes %llu",
           (unsigned long long)d.bytes_alltoall);
  RF_CHECK(d.bytes_copied == (uint64_t)sc[me] * 8,
           "alltoallv: the piece to itself counted as %llu copied bytes", (unsigned long long)d.bytes_copied);
  int bad = 0;
  for (int q = 0; q < w; q++) {
    for (int64_t i = 0; i < rc[q]; i++) bad += recv[rd[q] + i] != a2a_value(q, me, i);
    for (int64_t i = 0; i < 2 * scale; i++) bad += recv[rd[q] + rc[q] + i] != -2;
  }
  RF_CHECK(bad == 0, "alltoallv scale %lld: %d wrong elements", (long long)scale, bad);
  free(send);
  free(recv);
}

/* Every collective once on `comm` (test numbers from *next). */
static void check_all(int *next, int world) {
  int test = *next;
  static const enum rf_dtype move_types[] = {RF_DTYPE_F32, RF_DTYPE_BF16, RF_DTYPE_U8, RF_DTYPE_I64};
  static const enum rf_dtype sum_types[] = {RF_DTYPE_F32, RF_DTYPE_BF16};
  for (int nb = 0; nb < 2; nb++) {
    for (int t = 0; t < 4; t++)
      for (int c = 0; c < N_COUNTS; c++) check_allgather(++test, move_types[t], counts_list[c], nb);
    for (int t = 0; t < 4; t++)
      for (int rep = 0; rep < 3; rep++) check_allgatherv(++test, move_types[t], 1, nb);
    for (int t = 0; t < 2; t++) {
      for (int c = 0; c < N_COUNTS; c++) check_reduce_scatter_block(++test, sum_types[t], counts_list[c], nb);
      for (int rep = 0; rep < 3; rep++) check_reduce_scatter(++test, sum_types[t], 1, nb);
    }
  }
  for (int t = 0; t < 2; t++)
    for (int c = 0; c < N_COUNTS; c++) {
      check_allreduce_sum(++test, sum_types[t], counts_list[c]);
      check_allreduce_minmax(++test, sum_types[t], counts_list[c]);
    }
  check_allreduce_i64(++test);
  for (int c = 0; c < N_COUNTS; c++) check_bcast(++test, RF_DTYPE_BF16, counts_list[c]);
  for (int rep = 0; rep < 3; rep++) check_alltoallv(++test, 1);
  /* zero-length collectives are legal everywhere */
  check_allgather(++test, RF_DTYPE_F32, 0, 0);
  check_reduce_scatter_block(++test, RF_DTYPE_F32, 0, 0);

  /* Large-count paths on small buffers: counts above the limit go in units of
   * a contiguous datatype (gathers, all-to-all) or in chunks (reductions, bcast). */
  rf_comm_set_count_limit(5);
  check_allgather(++test, RF_DTYPE_BF16, 12, 0);
  check_allgather(++test, RF_DTYPE_F32, 12, 1);
  for (int rep = 0; rep < 3; rep++) {
    int64_t starts[8 + 1];
    ragged_starts(starts, world, test + 1, 6);
    rf_comm_set_count_limit(rf_max_i64(1, rf_ceil_div(starts[world], 3)));
    check_allgatherv(++test, RF_DTYPE_F32, 6, rep % 2);
  }
  rf_comm_set_count_limit(5);
  check_reduce_scatter_block(++test, RF_DTYPE_F32, 23, 0);
  rf_comm_set_count_limit(700);
  check_reduce_scatter(++test, RF_DTYPE_BF16, 6, 0);
  rf_comm_set_count_limit(5);
  check_allreduce_sum(++test, RF_DTYPE_F32, 23);
  check_allreduce_minmax(++test, RF_DTYPE_BF16, 23);
  check_bcast(++test, RF_DTYPE_F32, 23);
  rf_comm_set_count_limit(400); /* counts up to 960, displacements up to ~5000: units of 24 */
  check_alltoallv(++test, 24);
  rf_comm_set_count_limit(INT32_MAX);

  *next = test;
}

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  RF_ASSERT(world <= 8);
  /* RF_MPI_WAIT unset: the ranks (all on this machine) yield when they outnumber its cores. */
  rf_comm_init(&comm, MPI_COMM_WORLD);
  cpu_set_t cpus;
  RF_ASSERT(sched_getaffinity(0, sizeof cpus, &cpus) == 0);
  RF_CHECK(rf_comm_mpi_yielding(&comm) == (world > CPU_COUNT(&cpus)), "%d ranks on %d cores: yielding %d",
           world, CPU_COUNT(&cpus), rf_comm_mpi_yielding(&comm));
  rf_comm_free(&comm); /* (a comm made later in the process yields too, unless told to spin) */

  setenv("RF_MPI_WAIT", "spin", 1); /* every rank: MPI_Wait and the blocking calls */
  rf_comm_init(&comm, MPI_COMM_WORLD);
  RF_CHECK(!rf_comm_mpi_yielding(&comm), "RF_MPI_WAIT=spin on every rank: the comm yields");
  RF_CHECK(comm.counters == NULL, "a new communicator counts nowhere");
  comm.counters = &counters;
  int provided = MPI_THREAD_SINGLE, rank = 0;
  MPI_Query_thread(&provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  RF_CHECK(
      comm.world == world && comm.rank == rank && comm.thread_multiple == (provided == MPI_THREAD_MULTIPLE),
      "rf_comm_init fields");

  int test = 0;
  check_all(&test, world);
  rf_comm_barrier(&comm);
  rf_comm_free(&comm);

  /* The same on a comm whose ranks yield their cores while waiting (what more ranks
   * than cores choose): the non-blocking twins of the blocking calls, tested and slept on. */
  setenv("RF_MPI_WAIT", "yield", 1);
  rf_comm_init(&comm, MPI_COMM_WORLD);
  RF_CHECK(rf_comm_mpi_yielding(&comm), "RF_MPI_WAIT=yield on every rank: the comm does not yield");
  comm.counters = &counters;
  check_all(&test, world);
  rf_comm_barrier(&comm);
  rf_comm_free(&comm);

  return rf_test_finish("test_comm");
}
