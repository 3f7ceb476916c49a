/* rf-test: np=2,3,4,6 timeout=120 */
/* The schedule (src/fsdp/schedule.c) against references from outside it, on a
 * mesh of R replica groups of S ranks (W = 2: 2 x 1, 3: 3 x 1, 4: 2 x 2, 6: 3 x 2)
 * and on the plain world (FSDP), 6 units of different sizes:
 *  - the order of HSDP's replica all-reduces, each started as its unit's last
 *    reduce-scatter is finished, against the simulator's model of it (the shared
 *    rf_test_replica_start_at, which tests/test_sim_overlap.c replays against
 *    src/sim/simulate.c): which unit's all-reduce starts at each backward_begin
 *    (read from the bytes across the groups each call adds: each unit's shard in the
 *    reduce dtype), the rest in rf_fsdp_grads_finish; with 1 and 3 micro-batches
 *    (none starts before the last), f32 and bf16 reduces;
 *  - the bf16 replica sum bit for bit: random gradients over 2 micro-batches
 *    (their f32 sum is no bf16 value), the shard of every replica group computed
 *    apart by the same run on its shard group alone (FSDP, no replicas), gathered,
 *    each rounded to bf16 to nearest even and summed in f32 rounded to bf16 (the
 *    all-reduce's op) here: at R = 2 the sum is that bit for bit; at R = 3 one of
 *    the three orders of the sum, element by element (MPI picks the order);
 *  - a step in which a unit has no backward: after rf_fsdp_zero_grad its gradient
 *    shard is zero, not the previous step's, and every other unit's is the exact
 *    sum (integers exact in f32), under FSDP and HSDP. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "fsdp/fsdp.h" /* each unit's shard (the all-reduce's count) */
#include "rf_test.h"
#include "rfsdp.h"
#include "rfsdp_mpi.h"

#define N_UNITS 6
static const int64_t shapes[N_UNITS][2] = {{40, 12}, {33, 8}, {21, 16}, {50, 5}, {17, 9}, {29, 11}};

static struct rf_fsdp *build(MPI_Comm shard, MPI_Comm replicate, enum rf_dtype rdtype) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.reduce_dtype = rdtype;
  struct rf_fsdp *f;
  int rc = replicate == MPI_COMM_NULL ? rf_fsdp_create(&f, shard, &opt)
                                      : rf_fsdp_create_mesh(&f, shard, replicate, &opt);
  RF_ASSERT(rc == 0);
  rf_test_add_matrix_units(f, N_UNITS, shapes);
  return f;
}

static int64_t numel(int u) { return shapes[u][0] * shapes[u][1]; }

/* Gradient values of (rank, micro-batch, unit): random in [-1, 1), or small
 * integers whose sums are exact. */
static void fill(float *g, int u, int rank, int m, int exact) {
  uint64_t rng = 1000003ull * (uint64_t)rank + 1009ull * (uint64_t)m + (uint64_t)u + 1;
  for (int64_t i = 0; i < numel(u); i++)
    g[i] = exact ? (float)((rank + 2 * m + 3 * u + i) % 7 - 3) : rf_test_rand_f32(&rng);
}

/* ---- the order of the replica all-reduces -------------------------------------- */

/* One step of `micro` micro-batches (the last flagged); checks at every
 * backward_begin which unit's all-reduce started, against the model. */
static void check_order(MPI_Comm shard, MPI_Comm replicate, int rank, enum rf_dtype rdtype, int micro) {
  struct rf_fsdp *f = build(shard, replicate, rdtype);
  int64_t bytes[N_UNITS];
  for (int u = 0; u < N_UNITS; u++) bytes[u] = f->units[u].db.shard_elems * (int64_t)rf_dtype_size(rdtype);
  char seen[128] = "", want[128] = "";
  for (int step = 0; step < 2; step++) {
    seen[0] = want[0] = '\0';
    rf_fsdp_zero_grad(f);
    int started[N_UNITS] = {0};
    for (int m = 0; m < micro; m++) {
      int last = m == micro - 1;
      if (last) rf_fsdp_set_last_micro_batch(f);
      for (int u = 0; u < N_UNITS; u++) {
        rf_fsdp_forward_begin(f, u);
        rf_fsdp_forward_end(f, u);
      }
      for (int v = N_UNITS - 1; v >= 0; v--) {
        uint64_t at = rf_fsdp_counters(f)->bytes_inter;
        rf_fsdp_backward_begin(f, v);
        int64_t got = (int64_t)(rf_fsdp_counters(f)->bytes_inter - at);
        int s = last ? rf_test_replica_start_at(N_UNITS, v) : -1;
        int who = -1;
        for (int u = 0; u < N_UNITS; u++)
          if (!started[u] && got == bytes[u]) who = u;
        if (got > 0) snprintf(seen + strlen(seen), sizeof seen - strlen(seen), "%d@%d ", who, v);
        if (s >= 0) snprintf(want + strlen(want), sizeof want - strlen(want), "%d@%d ", s, v);
        RF_CHECK(got == (s >= 0 ? bytes[s] : 0),
                 "%s, %d micro-batches, micro-batch %d: backward_begin(%d) started %lld bytes of all-reduce "
                 "(unit %d's?), the model starts %s%d",
                 rf_dtype_name(rdtype), micro, m, v, (long long)got, who, s >= 0 ? "unit " : "none: ", s);
        if (s >= 0) started[s] = 1;
        fill(rf_fsdp_grad(f, v), v, rank, m, 1);
        at = rf_fsdp_counters(f)->bytes_inter;
        rf_fsdp_backward_end(f, v);
        RF_CHECK(rf_fsdp_counters(f)->bytes_inter == at, "backward_end(%d) started an all-reduce", v);
      }
    }
    /* the rest, in rf_fsdp_grads_finish */
    int64_t rest = 0;
    for (int u = 0; u < N_UNITS; u++) rest += started[u] ? 0 : bytes[u];
    uint64_t at = rf_fsdp_counters(f)->bytes_inter;
    rf_fsdp_grads_finish(f);
    RF_CHECK((int64_t)(rf_fsdp_counters(f)->bytes_inter - at) == rest,
             "%s, %d micro-batches: rf_fsdp_grads_finish all-reduced %lld bytes, the units left %lld",
             rf_dtype_name(rdtype), micro, (long long)(rf_fsdp_counters(f)->bytes_inter - at),
             (long long)rest);
  }
  if (rank == 0)
    printf("replica all-reduces, %s, %d micro-batches: started (unit@backward_begin) %s; the model: %s\n",
           rf_dtype_name(rdtype), micro, seen, want);
  rf_fsdp_free(f);
}

/* ---- the bf16 replica sum -------------------------------------------------------- */

/* f32 to bf16, rounded to nearest even (finite values) or truncated, and back. */
static float bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
  memcpy(&x, &b, sizeof x);
  return x;
}

static float bf16_truncated(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  b &= 0xffff0000u;
  memcpy(&x, &b, sizeof x);
  return x;
}

static void step_random(struct rf_fsdp *f, int rank, int micro) {
  rf_fsdp_zero_grad(f);
  for (int m = 0; m < micro; m++) {
    if (m == micro - 1) rf_fsdp_set_last_micro_batch(f);
    for (int u = 0; u < N_UNITS; u++) {
      rf_fsdp_forward_begin(f, u);
      rf_fsdp_forward_end(f, u);
    }
    for (int v = N_UNITS - 1; v >= 0; v--) {
      rf_fsdp_backward_begin(f, v);
      fill(rf_fsdp_grad(f, v), v, rank, m, 0);
      rf_fsdp_backward_end(f, v);
    }
  }
  rf_fsdp_grads_finish(f);
}

static void check_bf16_sum(MPI_Comm shard, MPI_Comm replicate, int rank) {
  int R;
  MPI_Comm_size(replicate, &R);
  struct rf_fsdp *f = build(shard, replicate, RF_DTYPE_BF16), *g = build(shard, MPI_COMM_NULL, RF_DTYPE_BF16);
  int64_t n = rf_fsdp_shard_elems(f);
  RF_ASSERT(rf_fsdp_shard_elems(g) == n);
  step_random(f, rank, 2);
  step_random(g, rank, 2);
  float *all = rf_xmalloc((size_t)(R * n) * sizeof(float));
  MPI_Allgather(rf_fsdp_shard_grad(g), (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, replicate);
  const float *got = rf_fsdp_shard_grad(f);
  int64_t wrong = 0, telling = 0, first = -1;
  for (int64_t i = 0; i < n; i++) {
    float x[3] = {0}, t = 0;
    for (int r = 0; r < R; r++) {
      x[r] = bf16(all[r * n + i]);
      t = r == 0 ? bf16_truncated(all[i]) : bf16(t + bf16_truncated(all[r * n + i]));
    }
    int ok;
    if (R == 2) {
      ok = got[i] == bf16(x[0] + x[1]);
    } else { /* R == 3: any order of the sum */
      ok = got[i] == bf16(bf16(x[0] + x[1]) + x[2]) || got[i] == bf16(bf16(x[0] + x[2]) + x[1]) ||
           got[i] == bf16(bf16(x[1] + x[2]) + x[0]);
    }
    telling += t != (R == 2 ? bf16(x[0] + x[1]) : bf16(bf16(x[0] + x[1]) + x[2]));
    if (!ok && first < 0) first = i;
    wrong += !ok;
  }
  RF_CHECK(
      wrong == 0,
      "R=%d rank %d: %lld of %lld elements of the bf16 replica sum differ from the replay (first %lld: %a)",
      R, rank, (long long)wrong, (long long)n, (long long)first, first >= 0 ? (double)got[first] : 0.0);
  /* the replay sees a truncating rounding: the sums of truncated inputs differ */
  RF_CHECK(telling > n / 10, "R=%d rank %d: truncated inputs would change only %lld of %lld sums", R, rank,
           (long long)telling, (long long)n);
  if (rank == 0 && rf_test_failures == 0)
    printf("bf16 replica sum, R=%d: %lld elements bit for bit the replay (truncated inputs: %lld differ)\n",
           R, (long long)n, (long long)telling);
  free(all);
  rf_fsdp_free(f);
  rf_fsdp_free(g);
}

/* ---- a unit without backward ------------------------------------------------------ */

static void check_no_backward(MPI_Comm shard, MPI_Comm replicate, int rank, int world, const char *what) {
  struct rf_fsdp *f = build(shard, replicate, RF_DTYPE_F32);
  const int skip = N_UNITS - 2; /* its shard lies past the slab's first half */
  for (int step = 0; step < 2; step++) {
    rf_fsdp_zero_grad(f);
    rf_fsdp_set_last_micro_batch(f);
    for (int u = 0; u < N_UNITS; u++) {
      rf_fsdp_forward_begin(f, u);
      rf_fsdp_forward_end(f, u);
    }
    for (int v = N_UNITS - 1; v >= 0; v--) {
      if (step == 1 && v == skip) continue; /* a frozen unit in this step */
      rf_fsdp_backward_begin(f, v);
      fill(rf_fsdp_grad(f, v), v, rank, step, 1);
      rf_fsdp_backward_end(f, v);
    }
    rf_fsdp_grads_finish(f);
    rf_fsdp_reshard_all(f);
  }
  int64_t wrong = 0, nonzero = 0;
  for (int u = 0; u < N_UNITS; u++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, u, &v);
    for (int64_t i = v.begin; i < v.end; i++) {
      float want = 0;
      for (int r = 0; r < world && u != skip; r++) want += (float)((r + 2 + 3 * u + i) % 7 - 3);
      wrong += v.grad[i - v.begin] != want;
      nonzero += u == skip && v.grad[i - v.begin] != 0;
    }
  }
  RF_CHECK(nonzero == 0,
           "%s rank %d: unit %d had no backward in the step, %lld of its gradient elements not 0", what, rank,
           skip, (long long)nonzero);
  RF_CHECK(wrong == 0, "%s rank %d: %lld gradient elements are not the exact sums", what, rank,
           (long long)wrong);
  if (rank == 0 && rf_test_failures == 0)
    printf("%s: a step without unit %d's backward: its gradient 0, the others exact\n", what, skip);
  rf_fsdp_free(f);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  int S = world % 2 == 0 && world > 2 ? 2 : 1;
  MPI_Comm shard, replicate; /* shard groups of S consecutive ranks; replicas across them */
  MPI_Comm_split(MPI_COMM_WORLD, rank / S, rank, &shard);
  MPI_Comm_split(MPI_COMM_WORLD, rank % S, rank, &replicate);
  if (rank == 0) printf("W=%d: %d replica groups of %d ranks\n", world, world / S, S);
  for (int micro = 1; micro <= 3; micro += 2) {
    check_order(shard, replicate, rank, RF_DTYPE_F32, micro);
    check_order(shard, replicate, rank, RF_DTYPE_BF16, micro);
  }
  check_bf16_sum(shard, replicate, rank);
  check_no_backward(MPI_COMM_WORLD, MPI_COMM_NULL, rank, world, "FSDP");
  check_no_backward(shard, replicate, rank, world, "HSDP");
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
  return rf_test_finish("test_fsdp_schedule");
}
