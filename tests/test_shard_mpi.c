/* rf-test: np=1,2,3,4,5 timeout=60
 * RaggedShard under mpirun. (1) Per tensor: every rank fills its local piece of
 * several tensors (random shapes, blocks and distributions, zero counts
 * included, the same on all ranks from the seed) with values that encode the
 * global position; an all-gather-v over the local ranges reassembles each tensor
 * and every rank checks the whole of it. (2) In a flat buffer: several tensors
 * packed at offsets with padding, rank ranges cut at block boundaries; every rank
 * writes its pieces at rf_shard_piece_offset in its part, one all-gather-v of the
 * buffer, and every rank checks every tensor and the zero padding. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "rf_test.h"
#include "shard/shard.h"

static int32_t encode(int tensor, int64_t i) { return tensor * 1000000 + (int32_t)i; }

static void check_per_tensor(const struct rf_comm *comm, uint64_t *rng) {
  int w = comm->world;
  for (int t = 0; t < 40; t++) {
    int64_t rows = 1 + (int64_t)(rf_test_rand_u64(rng) % 50),
            cols = 1 + (int64_t)(rf_test_rand_u64(rng) % 40);
    int64_t numel = rows * cols;
    uint64_t kind = rf_test_rand_u64(rng) % 4;
    int64_t block = kind == 0 ? 1 : kind == 3 ? numel : cols * (1 + (int64_t)(rf_test_rand_u64(rng) % 8));
    int64_t blocks = rf_ceil_div(numel, block);
    struct rf_shard sh;
    int64_t counts[8] = {0};
    if (t % 7 == 3) {
      RF_CHECK(rf_shard_init_on_rank(&sh, numel, block, w, t % w) == 0, "%s", rf_error_msg());
    } else {
      for (int64_t b = 0; b < blocks; b++) {
        int r = (int)(rf_test_rand_u64(rng) % (uint64_t)w);
        if (w > 2 && r == t % w) r = (r + 1) % w; /* keep one rank empty */
        counts[r]++;
      }
      RF_CHECK(rf_shard_init(&sh, numel, block, w, counts) == 0, "%s", rf_error_msg());
    }
    int32_t *full = rf_xmalloc((size_t)numel * sizeof(int32_t));
    for (int64_t i = 0; i < numel; i++) full[i] = -1;
    int64_t starts[9], b, e;
    for (int r = 0; r < w; r++) {
      rf_shard_local_range(&sh, r, &b, &e);
      starts[r] = b;
    }
    starts[w] = numel;
    rf_shard_local_range(&sh, comm->rank, &b, &e);
    for (int64_t i = b; i < e; i++) full[i] = encode(t, i);
    rf_comm_allgatherv(comm, full, starts, RF_DTYPE_I32);
    long bad = 0;
    for (int64_t i = 0; i < numel; i++) bad += full[i] != encode(t, i);
    RF_CHECK(bad == 0, "tensor %d (%lld x %lld, block %lld): %ld wrong elements", t, (long long)rows,
             (long long)cols, (long long)block, bad);
    free(full);
    rf_shard_free(&sh);
  }
}

/* Tensors packed with padding between them; rank cuts are placed at block
 * boundaries of whichever tensor they fall in (or in padding). */
static void check_flat_buffer(const struct rf_comm *comm, uint64_t *rng) {
  enum { N_TENSORS = 6 };
  int w = comm->world;
  for (int rep = 0; rep < 10; rep++) {
    int64_t numel[N_TENSORS], block[N_TENSORS], off[N_TENSORS], len = 0;
    for (int t = 0; t < N_TENSORS; t++) {
      int64_t rows = 1 + (int64_t)(rf_test_rand_u64(rng) % 20),
              cols = 1 + (int64_t)(rf_test_rand_u64(rng) % 17);
      numel[t] = rows * cols;
      block[t] = cols * (1 + (int64_t)(rf_test_rand_u64(rng) % 3));
      len += (int64_t)(rf_test_rand_u64(rng) % 5); /* padding */
      off[t] = len;
      len += numel[t];
    }
    /* legal cut points: 0, len, padding positions and block boundaries */
    int64_t *legal = rf_xmalloc((size_t)(len + 1) * sizeof *legal);
    int n_legal = 0;
    for (int64_t p = 0; p <= len; p++) {
      int ok = 1;
      for (int t = 0; t < N_TENSORS; t++)
        if (p > off[t] && p < off[t] + numel[t] && (p - off[t]) % block[t] != 0) ok = 0;
      if (ok) legal[n_legal++] = p;
    }
    int64_t starts[9];
    starts[0] = 0;
    starts[w] = len;
    for (int r = 1; r < w; r++) starts[r] = legal[rf_test_rand_u64(rng) % (uint64_t)n_legal];
    for (int i = 1; i < w; i++)
      for (int j = i; j > 1 && starts[j - 1] > starts[j]; j--) {
        int64_t x = starts[j];
        starts[j] = starts[j - 1];
        starts[j - 1] = x;
      }
    free(legal);
    int me = comm->rank;
    int64_t mine = starts[me + 1] - starts[me];
    int32_t *shard = rf_xcalloc((size_t)mine + 1, sizeof(int32_t));
    for (int t = 0; t < N_TENSORS; t++) {
      struct rf_shard sh;
      RF_CHECK(rf_shard_init_from_buffer(&sh, numel[t], block[t], off[t], starts, w) == 0, "%s",
               rf_error_msg());
      int64_t b, e;
      rf_shard_local_range(&sh, me, &b, &e);
      int64_t at = rf_shard_piece_offset(off[t], starts, me);
      RF_ASSERT(b == e || at + (e - b) <= mine);
      for (int64_t i = b; i < e; i++) shard[at + i - b] = encode(t + 1, i);
      rf_shard_free(&sh);
    }
    int32_t *full = rf_xmalloc((size_t)len * sizeof(int32_t));
    memcpy(full + starts[me], shard, (size_t)mine * sizeof(int32_t));
    rf_comm_allgatherv(comm, full, starts, RF_DTYPE_I32);
    long bad = 0;
    int64_t p = 0;
    for (int t = 0; t < N_TENSORS; t++) {
      for (; p < off[t]; p++) bad += full[p] != 0;
      for (int64_t i = 0; i < numel[t]; i++) bad += full[off[t] + i] != encode(t + 1, i);
      p = off[t] + numel[t];
    }
    RF_CHECK(bad == 0, "flat buffer rep %d: %ld wrong elements", rep, bad);
    free(shard);
    free(full);
  }
}

int main(int argc, char **argv) {
  int world = 0;
  rf_test_mpi_init(&argc, &argv, &world);
  RF_ASSERT(world <= 8);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  uint64_t rng = 777;
  check_per_tensor(&comm, &rng);
  check_flat_buffer(&comm, &rng);
  rf_comm_free(&comm);
  return rf_test_finish("test_shard_mpi");
}
