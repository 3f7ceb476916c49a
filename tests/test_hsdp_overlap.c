/* rf-test: np=3,4,6 timeout=60 */
/* HSDP's replica all-reduce overlapped with the backward (issue 27 item 4), on a
 * mesh of R replica groups of S ranks (S = 2 at even W: 2 x 2 at W = 4, 3 x 2 at
 * W = 6; S = 1 at odd W: 3 x 1 at W = 3, plain replicas), against
 * an exact reference: every rank writes into each gradient element a small
 * integer that encodes the rank, the micro-batch, the tensor and the element, so
 * the sum over every rank and micro-batch is exact in f32 and known here.
 *  - with rf_fsdp_set_last_micro_batch (the trainer's path): the all-reduces start
 *    inside the backward (bytes cross the groups before rf_fsdp_grads_finish is
 *    called), every rank's gradient shard is the exact sum, and the bytes across
 *    the groups per step are the shard slab in the reduce dtype (4 or 2 x
 *    rf_fsdp_shard_elems: a bf16 reduce all-reduces across in bf16);
 *  - without it (all-reduces started in rf_fsdp_grads_finish): the shard is bit
 *    for bit the overlapped one, and nothing crosses during the backward;
 *  - gradient accumulation (3 micro-batches, the last one flagged): the exact sum
 *    over the micro-batches, every contribution counted once;
 *  - in every layout and shard mode, with a bf16 reduce-scatter and replica
 *    all-reduce too (values and sums exact in bf16). */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"
#include "rfsdp.h"
#include "rfsdp_mpi.h"

#define N_UNITS 5
static const int64_t shapes[N_UNITS][2] = {{37, 12}, {29, 12}, {31, 7}, {12, 29}, {5, 12}};
#define MICRO 3

struct variant {
  const char *name;
  enum rf_layout layout;
  enum rf_shard_mode shard;
  enum rf_dtype rdtype;
};

static const struct variant variants[] = {
    {"planned-equal", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32},
    {"planned-ragged", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, RF_DTYPE_F32},
    {"fsdp2", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32},
    {"flat", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32},
    {"planned-equal-bf16-reduce", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_BF16},
};

/* The gradient element i of tensor t that rank r writes in micro-batch m: an
 * integer of at most 4 bits (exact in bf16, and so are the sums here). */
static float grad_value(int r, int m, int t, int64_t i) { return (float)((r + 2 * m + 3 * t + i) % 7 - 3); }

static struct rf_fsdp *build(const struct variant *v, MPI_Comm shard, MPI_Comm replicate) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = v->layout;
  opt.shard = v->shard;
  opt.reduce_dtype = v->rdtype;
  struct rf_fsdp *f;
  RF_ASSERT(rf_fsdp_create_mesh(&f, shard, replicate, &opt) == 0);
  rf_test_add_matrix_units(f, N_UNITS, shapes);
  return f;
}

/* One step of `micro` micro-batches (the last flagged when `overlap`); *during:
 * the bytes that crossed the groups before rf_fsdp_grads_finish. */
static void step(struct rf_fsdp *f, int rank, int micro, int overlap, uint64_t *during) {
  uint64_t inter0 = rf_fsdp_counters(f)->bytes_inter;
  rf_fsdp_zero_grad(f);
  for (int m = 0; m < micro; m++) {
    if (overlap && m == micro - 1) rf_fsdp_set_last_micro_batch(f);
    for (int u = 0; u < N_UNITS; u++) {
      rf_fsdp_forward_begin(f, u);
      rf_fsdp_forward_end(f, u);
    }
    for (int u = N_UNITS - 1; u >= 0; u--) {
      rf_fsdp_backward_begin(f, u);
      float *g = rf_fsdp_grad(f, u);
      for (int64_t i = 0; i < shapes[u][0] * shapes[u][1]; i++) g[i] = grad_value(rank, m, u, i);
      rf_fsdp_backward_end(f, u);
    }
  }
  *during = rf_fsdp_counters(f)->bytes_inter - inter0;
  rf_fsdp_grads_finish(f);
}

/* The shard's pieces against the exact sums over `world` ranks and `micro` micro-batches. */
static int64_t wrong_elements(struct rf_fsdp *f, int world, int micro) {
  int64_t wrong = 0;
  for (int u = 0; u < N_UNITS; u++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, u, &v);
    for (int64_t i = v.begin; i < v.end; i++) {
      float want = 0;
      for (int r = 0; r < world; r++)
        for (int m = 0; m < micro; m++) want += grad_value(r, m, u, i);
      wrong += v.grad[i - v.begin] != want;
    }
  }
  return wrong;
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  int S = world % 2 == 0 ? 2 : 1;
  MPI_Comm shard, replicate; /* shard groups of S consecutive ranks; replicas across them */
  MPI_Comm_split(MPI_COMM_WORLD, rank / S, rank, &shard);
  MPI_Comm_split(MPI_COMM_WORLD, rank % S, rank, &replicate);
  for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
    const struct variant *v = &variants[k];
    struct rf_fsdp *a = build(v, shard, replicate), *b = build(v, shard, replicate);
    int64_t n = rf_fsdp_shard_elems(a);
    uint64_t during_a = 0, during_b = 0, across = 0;
    step(a, rank, 1, 1, &during_a); /* the first step allocates nothing after, but measure the second */
    step(b, rank, 1, 0, &during_b);
    uint64_t inter0 = rf_fsdp_counters(a)->bytes_inter;
    step(a, rank, 1, 1, &during_a);
    across = rf_fsdp_counters(a)->bytes_inter - inter0;
    step(b, rank, 1, 0, &during_b);
    RF_CHECK(wrong_elements(a, world, 1) == 0,
             "%s W=%d rank %d: the overlapped all-reduce's sums are not exact", v->name, world, rank);
    RF_CHECK(memcmp(rf_fsdp_shard_grad(a), rf_fsdp_shard_grad(b), (size_t)n * sizeof(float)) == 0,
             "%s W=%d rank %d: overlapped and at-the-end all-reduces differ", v->name, world, rank);
    RF_CHECK(during_a > 0 && during_b == 0,
             "%s W=%d rank %d: %llu bytes crossed during the overlapped backward, %llu without overlap",
             v->name, world, rank, (unsigned long long)during_a, (unsigned long long)during_b);
    /* the slab in the reduce dtype: a bf16 reduce makes the replica all-reduce bf16 too */
    long long slab = (long long)n * (long long)rf_dtype_size(v->rdtype);
    RF_CHECK(across == (uint64_t)slab, "%s W=%d rank %d: %llu bytes across the groups, the %s slab is %lld",
             v->name, world, rank, (unsigned long long)across, rf_dtype_name(v->rdtype), slab);
    uint64_t during = 0;
    step(a, rank, MICRO, 1, &during);
    RF_CHECK(wrong_elements(a, world, MICRO) == 0,
             "%s W=%d rank %d: %d micro-batches: the sums are not exact", v->name, world, rank, MICRO);
    rf_fsdp_free(a);
    rf_fsdp_free(b);
    if (rank == 0 && rf_test_failures == 0)
      printf(
          "%-26s %d x %d: exact sums; overlapped = at the end bit for bit; %llu of %lld B crossed in the "
          "backward\n",
          v->name, world / S, S, (unsigned long long)during_a, (long long)n * 4);
  }
  MPI_Comm_free(&shard);
  MPI_Comm_free(&replicate);
  return rf_test_finish("test_hsdp_overlap");
}
