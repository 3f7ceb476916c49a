/* GPU test (run by scripts/gpu-check under mpiexec -np 1 and -np 2 on one GPU, each
 * rank its own NCCL_HOSTID): the NCCL comm table against the MPI one on the same
 * inputs. Every collective runs twice, once on host buffers through the MPI
 * communicator and once on device buffers through the NCCL one, and the results must
 * agree: bit for bit for moves (all-gather, all-gather-v, all-to-all-v, broadcast) and
 * for f32 sums at W <= 2 (one addition, the same in any order); bf16 sums within one
 * bf16 unit of the MPI result at W <= 2, within twice the recursive-summation bound
 * (W - 1) u sum |x| above (NCCL sums in its own order); i64 sums exactly. Ragged
 * ranges come from rf_test_random_cuts (empty ranges included). Non-blocking
 * collectives in a group, ordered after a compute event and observed through
 * rf_comm_event_record, give the same bytes; the byte counters of the two
 * communicators are equal after the same calls (counted once, in comm.c); a repeated
 * round of non-blocking collectives after a warm-up makes no host wait and no
 * allocation. Also what comm_nccl.h promises beyond moving bytes: every collective of
 * host memory through MPI, NCCL communicators made only for lanes in use (none for a
 * split that counts a node's ranks; one with RF_NCCL_ONE_LANE=1), and a collective
 * issued from another thread working on this rank's GPU. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "comm/comm_nccl.h"
#include "core/core.h"
#include "device/device_cuda.h"
#include "rf_test.h"

static struct rf_device gpu;
static struct rf_device_stream *gs; /* the uploads' stream: the CUDA table refuses NULL */
#define GS gs

static void *to_gpu(const void *src, size_t bytes) {
  void *d = rf_device_alloc(&gpu, bytes ? bytes : 1, 256);
  rf_device_copy(&gpu, d, src, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  return d;
}

/* The NCCL lanes' next collectives after everything queued on the device's stream so
 * far (the uploads: rf_device_copy runs on that stream, NCCL on its own lanes; without
 * this the collective may read or overwrite a buffer before its upload lands, which the
 * CPU stand-in's delayed streams showed on the all-gather). */
static struct rf_device_event uploaded;
static void after_uploads(const struct rf_comm *nccl) {
  rf_device_event_record(&gpu, &uploaded, GS);
  rf_comm_stream_wait(nccl, &gpu, &uploaded);
}

static void from_gpu(void *dst, const void *src, size_t bytes) {
  rf_device_copy(&gpu, dst, src, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, GS);
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void fill(void *p, size_t n, enum rf_dtype dtype, uint64_t seed) {
  uint64_t st = seed;
  for (size_t i = 0; i < n; i++) {
    float v = rf_test_rand_f32(&st) * 8.0f;
    if (dtype == RF_DTYPE_F32) ((float *)p)[i] = v;
    if (dtype == RF_DTYPE_BF16) ((uint16_t *)p)[i] = rf_bf16_from_f32(v);
    if (dtype == RF_DTYPE_I64) ((int64_t *)p)[i] = (int64_t)(rf_test_rand_u64(&st) % 1000003);
  }
}

/* bf16 sums: at W <= 2 one rounded addition on both sides, within one bf16 unit of the
 * reference; above, two recursive sums in different orders, each within (W - 1) u of
 * sum |x_r| of the exact sum (u = 2^-8; `mag`: sum over ranks of |x_r|, per element). */
static int bf16_close(const uint16_t *a, const uint16_t *b, size_t n, const float *mag, int world) {
  for (size_t i = 0; i < n; i++) {
    float x = rf_f32_from_bf16(a[i]), y = rf_f32_from_bf16(b[i]);
    float tol = mag ? 2.0f * (float)(world - 1) * ldexpf(mag[i], -8)
                    : ldexpf(1.0f, ilogbf(fabsf(y) > 0 ? fabsf(y) : 1e-30f) - 7);
    if (!(fabsf(x - y) <= tol)) return 0;
  }
  return 1;
}

static int sums_agree(const void *got, const void *want, size_t n, enum rf_dtype dtype, int world,
                      const float *mag) {
  if (dtype == RF_DTYPE_BF16) return bf16_close(got, want, n, world > 2 ? mag : NULL, world);
  if (dtype == RF_DTYPE_F32 && world > 2) {
    double worst = rf_test_max_rel_diff(got, want, n, 1e-3);
    return worst <= 1e-6;
  }
  return same_bits(got, want, n * rf_dtype_size(dtype));
}

/* mag[i] = the sum over ranks of |x[i]| (bf16 x), for bf16_close's bound (not counted:
 * the two communicators' counters are compared). */
static void magnitudes(struct rf_comm *mpi, const uint16_t *x, size_t n, float *mag) {
  struct rf_comm quiet;
  rf_comm_view(&quiet, mpi, NULL);
  for (size_t i = 0; i < n; i++) mag[i] = fabsf(rf_f32_from_bf16(x[i]));
  rf_comm_allreduce(&quiet, mag, (int64_t)n, RF_DTYPE_F32, RF_REDUCE_OP_SUM);
}

static void check_equal(struct rf_comm *mpi, struct rf_comm *nccl, enum rf_dtype dtype) {
  int w = mpi->world, r = mpi->rank;
  size_t size = rf_dtype_size(dtype);
  const int64_t count = 1000 + 3 * (int64_t)(dtype == RF_DTYPE_BF16);
  size_t all = (size_t)(w * count);
  void *h = malloc(all * size), *got = malloc(all * size), *recv = malloc((size_t)count * size);
  float *mag = dtype == RF_DTYPE_BF16 ? malloc(all * sizeof(float)) : NULL;
  /* all-gather in place */
  fill(h, all, dtype, 100 + (uint64_t)r);
  void *d = to_gpu(h, all * size);
  rf_comm_allgather(mpi, h, count, dtype);
  after_uploads(nccl);
  rf_comm_allgather(nccl, d, count, dtype);
  from_gpu(got, d, all * size);
  RF_CHECK(same_bits(got, h, all * size), "rank %d: all-gather (%s) differs from MPI's", r,
           rf_dtype_name(dtype));
  /* reduce-scatter (sum) */
  fill(h, all, dtype, 200 + (uint64_t)r);
  rf_device_copy(&gpu, d, h, all * size, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  void *drecv = to_gpu(h, (size_t)count * size);
  if (mag) magnitudes(mpi, h, all, mag);
  rf_comm_reduce_scatter_block(mpi, h, recv, count, dtype);
  after_uploads(nccl);
  rf_comm_reduce_scatter_block(nccl, d, drecv, count, dtype);
  from_gpu(got, drecv, (size_t)count * size);
  RF_CHECK(sums_agree(got, recv, (size_t)count, dtype, w, mag ? mag + (size_t)r * (size_t)count : NULL),
           "rank %d: reduce-scatter (%s) differs from MPI's", r, rf_dtype_name(dtype));
  /* all-reduce on device memory (the replica lane) */
  fill(h, all, dtype, 300 + (uint64_t)r);
  rf_device_copy(&gpu, d, h, all * size, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  if (mag) magnitudes(mpi, h, all, mag);
  rf_comm_allreduce(mpi, h, (int64_t)all, dtype, RF_REDUCE_OP_SUM);
  after_uploads(nccl);
  rf_comm_allreduce(nccl, d, (int64_t)all, dtype, RF_REDUCE_OP_SUM);
  from_gpu(got, d, all * size);
  RF_CHECK(sums_agree(got, h, all, dtype, w, mag), "rank %d: all-reduce (%s) differs from MPI's", r,
           rf_dtype_name(dtype));
  /* and non-blocking, on device memory and (through the NCCL communicator) on host memory */
  fill(h, all, dtype, 350 + (uint64_t)r);
  rf_device_copy(&gpu, d, h, all * size, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  void *hn = malloc(all * size), *hm = malloc(all * size);
  memcpy(hn, h, all * size);
  memcpy(hm, h, all * size);
  if (mag) magnitudes(mpi, h, all, mag);
  struct rf_comm_req q1, q2;
  rf_comm_req_init(&q1, w), rf_comm_req_init(&q2, w);
  after_uploads(nccl);
  rf_comm_iallreduce(nccl, d, (int64_t)all, dtype, RF_REDUCE_OP_SUM, &q1);
  rf_comm_iallreduce(nccl, hn, (int64_t)all, dtype, RF_REDUCE_OP_SUM, &q2);
  /* the same two calls on MPI, so that the two communicators' counters stay equal */
  rf_comm_allreduce(mpi, h, (int64_t)all, dtype, RF_REDUCE_OP_SUM);
  rf_comm_allreduce(mpi, hm, (int64_t)all, dtype, RF_REDUCE_OP_SUM);
  rf_comm_wait(&q1), rf_comm_wait(&q2);
  from_gpu(got, d, all * size);
  RF_CHECK(sums_agree(got, h, all, dtype, w, mag) && same_bits(hn, hm, all * size),
           "rank %d: non-blocking all-reduce (%s) differs from MPI's", r, rf_dtype_name(dtype));
  rf_comm_req_free(&q1), rf_comm_req_free(&q2);
  free(hn), free(hm);
  rf_device_release(&gpu, d), rf_device_release(&gpu, drecv);
  free(h), free(got), free(recv), free(mag);
}

static void check_ragged(struct rf_comm *mpi, struct rf_comm *nccl, uint64_t seed) {
  int w = mpi->world, r = mpi->rank;
  int64_t starts[64];
  rf_test_random_cuts(5000, w, seed, starts);
  size_t all = (size_t)starts[w], mine = (size_t)(starts[r + 1] - starts[r]);
  float *h = malloc(all * sizeof(float)), *got = malloc(all * sizeof(float));
  float *recv = malloc((mine + 1) * sizeof(float));
  fill(h, all, RF_DTYPE_F32, seed + (uint64_t)r);
  float *d = to_gpu(h, all * sizeof(float));
  rf_comm_allgatherv(mpi, h, starts, RF_DTYPE_F32);
  after_uploads(nccl);
  rf_comm_allgatherv(nccl, d, starts, RF_DTYPE_F32);
  from_gpu(got, d, all * sizeof(float));
  RF_CHECK(same_bits(got, h, all * sizeof(float)), "rank %d: all-gather-v differs from MPI's (seed %llu)", r,
           (unsigned long long)seed);
  fill(h, all, RF_DTYPE_F32, seed + 50 + (uint64_t)r);
  rf_device_copy(&gpu, d, h, all * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  float *drecv = rf_device_alloc(&gpu, (mine + 1) * sizeof(float), 256);
  rf_comm_reduce_scatter(mpi, h, recv, starts, RF_DTYPE_F32);
  after_uploads(nccl);
  rf_comm_reduce_scatter(nccl, d, drecv, starts, RF_DTYPE_F32);
  from_gpu(got, drecv, mine * sizeof(float));
  RF_CHECK(sums_agree(got, recv, mine, RF_DTYPE_F32, w, NULL), "rank %d: reduce-scatter-v differs from MPI's",
           r);
  rf_device_release(&gpu, d), rf_device_release(&gpu, drecv);
  free(h), free(got), free(recv);
}

static void check_alltoallv_bcast(struct rf_comm *mpi, struct rf_comm *nccl) {
  int w = mpi->world, r = mpi->rank;
  int64_t sc[64], sd[64], rc[64], rd[64], stotal = 0, rtotal = 0;
  for (int p = 0; p < w; p++) { /* rank a sends (a + 2b) % 5 * 100 elements to b */
    sc[p] = (r + 2 * p) % 5 * 100;
    rc[p] = (p + 2 * r) % 5 * 100;
    sd[p] = stotal, rd[p] = rtotal;
    stotal += sc[p], rtotal += rc[p];
  }
  /* every buffer also holds the broadcast's 777 elements below: sized by the all-to-all
   * alone (200 elements at most at W <= 2, none at W = 1), the broadcast wrote past them
   * on the host and the device, which the CPU stand-in refused */
  size_t cap = (size_t)(stotal > rtotal ? stotal : rtotal);
  cap = (cap > 777 ? cap : 777) * 8;
  int64_t *h = malloc(cap), *want = malloc(cap), *got = malloc(cap);
  fill(h, (size_t)stotal, RF_DTYPE_I64, 400 + (uint64_t)r);
  int64_t *ds = rf_device_alloc(&gpu, cap, 256);
  rf_device_copy(&gpu, ds, h, (size_t)stotal * 8, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  int64_t *dr = rf_device_alloc(&gpu, (size_t)(rtotal + 1) * 8, 256);
  rf_comm_alltoallv(mpi, h, sc, sd, want, rc, rd, RF_DTYPE_I64);
  after_uploads(nccl);
  rf_comm_alltoallv(nccl, ds, sc, sd, dr, rc, rd, RF_DTYPE_I64);
  from_gpu(got, dr, (size_t)rtotal * 8);
  RF_CHECK(same_bits(got, want, (size_t)rtotal * 8), "rank %d: all-to-all-v differs from MPI's", r);
  fill(h, 777, RF_DTYPE_I64, 500 + (uint64_t)r);
  rf_device_copy(&gpu, ds, h, 777 * 8, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  rf_comm_bcast(mpi, h, 777, RF_DTYPE_I64, w - 1);
  after_uploads(nccl);
  rf_comm_bcast(nccl, ds, 777, RF_DTYPE_I64, w - 1);
  from_gpu(got, ds, 777 * 8);
  RF_CHECK(same_bits(got, h, 777 * 8), "rank %d: broadcast from %d differs from MPI's", r, w - 1);
  /* host memory through the NCCL communicator goes to MPI: agreement works */
  RF_CHECK(rf_comm_agree(nccl, r == w - 1 ? -1 : 0) == -1 && rf_comm_agree(mpi, r == w - 1 ? -1 : 0) == -1,
           "rank %d: agree on host memory through nccl", r);
  rf_device_release(&gpu, ds), rf_device_release(&gpu, dr);
  free(h), free(want), free(got);
}

/* Two all-gathers and a reduce-scatter started in one group after a compute event,
 * waited through events; repeated after a warm-up with no host wait and no allocation. */
static void check_nonblocking(struct rf_comm *mpi, struct rf_comm *nccl) {
  int w = mpi->world, r = mpi->rank;
  const int64_t count = 4096;
  size_t all = (size_t)(w * count);
  float *h = malloc(all * sizeof(float)), *h2 = malloc(all * sizeof(float)),
        *got = malloc(all * sizeof(float));
  float *da = rf_device_alloc(&gpu, all * sizeof(float), 256),
        *db = rf_device_alloc(&gpu, all * sizeof(float), 256);
  float *dg = rf_device_alloc(&gpu, all * sizeof(float), 256),
        *dr = rf_device_alloc(&gpu, count * sizeof(float), 256);
  struct rf_comm_req ra, rb, rs;
  rf_comm_req_init(&ra, w), rf_comm_req_init(&rb, w), rf_comm_req_init(&rs, w);
  struct rf_device_event compute, done;
  rf_device_event_create(&gpu, &compute), rf_device_event_create(&gpu, &done);
  fill(h, all, RF_DTYPE_F32, 600 + (uint64_t)r);
  fill(h2, all, RF_DTYPE_F32, 700 + (uint64_t)r);
  for (int rep = 0; rep < 3; rep++) {
    struct rf_device_cuda_stats d0 = rf_device_cuda_stats(&gpu);
    struct rf_comm_nccl_stats c0 = rf_comm_nccl_stats(nccl);
    uint64_t heap = rf_heap_allocations();
    /* "compute": the inputs written on the device's stream, then the event */
    rf_device_copy(&gpu, da, h, all * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
    rf_device_copy(&gpu, db, h2, all * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
    rf_device_copy(&gpu, dg, h2, all * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
    rf_device_event_record(&gpu, &compute, GS);
    rf_comm_stream_wait(nccl, &gpu, &compute);
    rf_comm_group_begin(nccl);
    rf_comm_iallgather(nccl, da, count, RF_DTYPE_F32, &ra);
    rf_comm_iallgather(nccl, db, count, RF_DTYPE_F32, &rb);
    rf_comm_group_end(nccl);
    rf_comm_ireduce_scatter_block(nccl, dg, dr, count, RF_DTYPE_F32, &rs);
    rf_comm_event_record(nccl, &rs, &gpu, &done);
    rf_device_stream_wait(&gpu, GS, &done); /* the device's stream after the reduce-scatter */
    rf_comm_retire(&rs);                    /* as the runtime does: the stream's wait is the order */
    rf_comm_wait(&ra), rf_comm_wait(&rb);   /* host waits, counted */
    struct rf_device_cuda_stats d1 = rf_device_cuda_stats(&gpu);
    struct rf_comm_nccl_stats c1 = rf_comm_nccl_stats(nccl);
    if (rep == 2)
      RF_CHECK(d1.mallocs == d0.mallocs && c1.host_syncs == c0.host_syncs &&
                   c1.request_waits - c0.request_waits == 2 && rf_heap_allocations() == heap,
               "rank %d: a repeated round made %llu cudaMalloc, %llu blocking collectives, %llu request "
               "waits (want 2: the retired one none), %llu heap allocations",
               r, (unsigned long long)(d1.mallocs - d0.mallocs),
               (unsigned long long)(c1.host_syncs - c0.host_syncs),
               (unsigned long long)(c1.request_waits - c0.request_waits),
               (unsigned long long)(rf_heap_allocations() - heap));
  }
  float *want = malloc(all * sizeof(float)), *wrs = malloc(count * sizeof(float));
  memcpy(want, h, all * sizeof(float));
  rf_comm_allgather(mpi, want, count, RF_DTYPE_F32);
  from_gpu(got, da, all * sizeof(float));
  RF_CHECK(same_bits(got, want, all * sizeof(float)), "rank %d: grouped all-gather 1 differs from MPI's", r);
  memcpy(want, h2, all * sizeof(float));
  rf_comm_allgather(mpi, want, count, RF_DTYPE_F32);
  from_gpu(got, db, all * sizeof(float));
  RF_CHECK(same_bits(got, want, all * sizeof(float)), "rank %d: grouped all-gather 2 differs from MPI's", r);
  rf_comm_reduce_scatter_block(mpi, h2, wrs, count, RF_DTYPE_F32);
  from_gpu(got, dr, count * sizeof(float));
  RF_CHECK(sums_agree(got, wrs, (size_t)count, RF_DTYPE_F32, w, NULL),
           "rank %d: reduce-scatter after an event", r);
  rf_device_event_free(&gpu, &compute), rf_device_event_free(&gpu, &done);
  rf_comm_req_free(&ra), rf_comm_req_free(&rb), rf_comm_req_free(&rs);
  rf_device_release(&gpu, da), rf_device_release(&gpu, db), rf_device_release(&gpu, dg),
      rf_device_release(&gpu, dr);
  free(h), free(h2), free(got), free(want), free(wrs);
}

/* Every collective of host memory through the NCCL communicator goes to MPI (none may
 * reach NCCL, which refuses host pointers): the same results as MPI's, bit for bit. */
static void check_host_memory(struct rf_comm *mpi, struct rf_comm *nccl) {
  int w = mpi->world, r = mpi->rank;
  int64_t starts[65];
  rf_test_random_cuts(3000, w, 77, starts);
  const int64_t count = 500;
  size_t all = (size_t)(w * count), total = (size_t)starts[w], big = all > total ? all : total;
  float *a = malloc(big * 4), *b = malloc(big * 4), *ra = malloc(big * 4), *rb = malloc(big * 4);
  fill(a, big, RF_DTYPE_F32, 900 + (uint64_t)r);
  memcpy(b, a, big * 4);
  rf_comm_allgather(mpi, a, count, RF_DTYPE_F32);
  rf_comm_allgather(nccl, b, count, RF_DTYPE_F32);
  RF_CHECK(same_bits(a, b, all * 4), "rank %d: host all-gather through nccl", r);
  rf_comm_allgatherv(mpi, a, starts, RF_DTYPE_F32);
  rf_comm_allgatherv(nccl, b, starts, RF_DTYPE_F32);
  RF_CHECK(same_bits(a, b, total * 4), "rank %d: host all-gather-v through nccl", r);
  fill(a, big, RF_DTYPE_F32, 950 + (uint64_t)r);
  memcpy(b, a, big * 4);
  rf_comm_reduce_scatter_block(mpi, a, ra, count, RF_DTYPE_F32);
  rf_comm_reduce_scatter_block(nccl, b, rb, count, RF_DTYPE_F32);
  RF_CHECK(same_bits(ra, rb, (size_t)count * 4), "rank %d: host reduce-scatter through nccl", r);
  rf_comm_reduce_scatter(mpi, a, ra, starts, RF_DTYPE_F32);
  rf_comm_reduce_scatter(nccl, b, rb, starts, RF_DTYPE_F32);
  RF_CHECK(same_bits(ra, rb, (size_t)(starts[r + 1] - starts[r]) * 4), "rank %d: host reduce-scatter-v", r);
  free(a), free(b), free(ra), free(rb);
}

/* A collective issued from a thread that never chose a GPU (cudaSetDevice is per
 * thread): the backend makes its GPU current there first. Under the CPU stand-in with
 * RF_EMU_DEVICES=2 at W = 2, rank 1's GPU is 1 and its streams refuse a thread on 0. */
struct thread_job {
  struct rf_comm *nccl;
  float *d;
  int64_t n;
};
static void *allreduce_from_thread(void *arg) {
  struct thread_job *j = arg;
  rf_comm_allreduce(j->nccl, j->d, j->n, RF_DTYPE_F32, RF_REDUCE_OP_SUM);
  return NULL;
}
static void check_other_thread(struct rf_comm *mpi, struct rf_comm *nccl) {
  int w = mpi->world, r = mpi->rank;
  const int64_t n = 300;
  float *h = malloc(n * 4), *got = malloc(n * 4);
  fill(h, (size_t)n, RF_DTYPE_F32, 990 + (uint64_t)r);
  struct thread_job job = {nccl, to_gpu(h, n * 4), n};
  after_uploads(nccl);
  pthread_t t;
  RF_CHECK(pthread_create(&t, NULL, allreduce_from_thread, &job) == 0, "pthread_create");
  pthread_join(t, NULL);
  rf_comm_allreduce(mpi, h, n, RF_DTYPE_F32, RF_REDUCE_OP_SUM);
  from_gpu(got, job.d, n * 4);
  RF_CHECK(sums_agree(got, h, (size_t)n, RF_DTYPE_F32, w, NULL), "rank %d: an all-reduce from another thread",
           r);
  rf_device_release(&gpu, job.d);
  free(h), free(got);
}

int main(int argc, char **argv) {
  /* MPI_THREAD_MULTIPLE, as rfsdp runs: NCCL's CPU stand-in calls MPI from stream threads */
  rf_comm_mpi_init(&argc, &argv);
  struct rf_counters cm = {0}, cn = {0};
  struct rf_comm mpi, nccl;
  rf_comm_init_world(&mpi);
  int rank = mpi.rank;
  int ordinal = rf_comm_nccl_local_device(&mpi);
  rf_device_cuda_init(&gpu, ordinal, NULL);
  gs = rf_device_stream_create(&gpu);
  rf_device_event_create(&gpu, &uploaded);
  rf_comm_nccl_init(&nccl, &mpi, &gpu);
  /* lanes are made when first used: none yet, none for a split that only counts a node's
   * ranks; RF_NCCL_ONE_LANE=1 puts everything on one */
  const char *one = getenv("RF_NCCL_ONE_LANE");
  uint64_t lanes = one && strcmp(one, "1") == 0 ? 1 : 3;
  struct rf_comm node;
  rf_comm_split(&nccl, RF_COMM_SPLIT_NODE, rank, &node);
  RF_CHECK(rf_comm_nccl_stats(&nccl).communicators == 0 && rf_comm_nccl_stats(&node).communicators == 0,
           "rank %d: NCCL communicators made before any collective: %llu, by a node split %llu", rank,
           (unsigned long long)rf_comm_nccl_stats(&nccl).communicators,
           (unsigned long long)rf_comm_nccl_stats(&node).communicators);
  rf_comm_free(&node);
  mpi.counters = &cm;
  nccl.counters = &cn;
  check_host_memory(&mpi, &nccl);
  RF_CHECK(rf_comm_nccl_stats(&nccl).communicators == 0,
           "rank %d: collectives of host memory made %llu NCCL communicators", rank,
           (unsigned long long)rf_comm_nccl_stats(&nccl).communicators);
  check_equal(&mpi, &nccl, RF_DTYPE_F32);
  RF_CHECK(rf_comm_nccl_stats(&nccl).communicators == lanes,
           "rank %d: %llu NCCL communicators after using %llu lanes", rank,
           (unsigned long long)rf_comm_nccl_stats(&nccl).communicators, (unsigned long long)lanes);
  check_equal(&mpi, &nccl, RF_DTYPE_BF16);
  check_equal(&mpi, &nccl, RF_DTYPE_I64);
  for (uint64_t seed = 1; seed <= 3; seed++) check_ragged(&mpi, &nccl, seed);
  check_alltoallv_bcast(&mpi, &nccl);
  RF_CHECK(cm.bytes_gathered == cn.bytes_gathered && cm.bytes_reduced == cn.bytes_reduced &&
               cm.bytes_alltoall == cn.bytes_alltoall && cm.collectives == cn.collectives,
           "rank %d: counted as MPI counts: gathered %llu/%llu reduced %llu/%llu all-to-all %llu/%llu calls "
           "%llu/%llu",
           rank, (unsigned long long)cn.bytes_gathered, (unsigned long long)cm.bytes_gathered,
           (unsigned long long)cn.bytes_reduced, (unsigned long long)cm.bytes_reduced,
           (unsigned long long)cn.bytes_alltoall, (unsigned long long)cm.bytes_alltoall,
           (unsigned long long)cn.collectives, (unsigned long long)cm.collectives);
  check_nonblocking(&mpi, &nccl);
  check_other_thread(&mpi, &nccl);
  rf_comm_free(&nccl);
  rf_device_event_free(&gpu, &uploaded);
  rf_device_free(&gpu);
  rf_comm_free(&mpi);
  return rf_test_finish("test_comm_nccl");
}
