/* rf-test: np=1,2,3,4,5 timeout=120
 * Byte accounting, exactly (and per context: a step of one context counts nothing into another's): one
 * training step's counters (per rank) against the bytes the layout predicts, for planned (equal and ragged),
 * fsdp2 and flat, in f32 and bf16, at W = 1..5. The layout's numbers (P: elements of a unit's buffers over
 * all ranks, N: its real elements, own: this rank's range, with the padding inside it) come from the plan the
 * DBuffer runs; fsdp2's and flat's P and fsdp2's copies are also checked against the planner's peer layouts
 * (rf_plan_peer_add), the numbers `rfsdp plan` prints, and the copies against the
 * run's own plan (the DBuffer's copy_bytes, summed in the log's first line).
 *
 * The step, resharding after forward: every unit is gathered twice (forward and
 * backward) except the last, which the backward uses at once (1 gather), and
 * reduce-scattered once. Per unit u with g gathers, param dtype size ps, reduce
 * dtype size rs:
 *   own shard   g * own * ps                 (every layout: the all-gather's input)
 *   gathered    g * (P - own) * ps
 *   reduced     (P - own) * rs
 *   padding     (g * ps + rs) * (padding outside this rank's range)
 *   copied      fsdp2: copy-out g * N * ps, then the copy-in of the padded input
 *               P * rs (f32; with bf16 only its zero padding is a copy)
 *   cast        bf16 reduce: the gradient buffer to bf16 (planned and flat: P * 2,
 *               fsdp2: N * 2), the reduced range back to f32 (own * 4) */
#include <mpi.h>
#include <string.h>

#include "fsdp/fsdp.h"
#include "plan/plan.h"
#include "rf_test.h"
#include "rfsdp_mpi.h"

#define N_UNITS 4

struct tensor_def {
  int unit;
  const char *name;
  int ndim;
  int64_t shape[2];
};

static const struct tensor_def model[] = {
    {0, "embed", 2, {37, 12}}, {1, "b0.w1", 2, {29, 12}}, {1, "b0.bias", 1, {29}},
    {1, "b0.w2", 2, {12, 29}}, {2, "b1.w1", 2, {29, 12}}, {2, "b1.bias", 1, {29}},
    {2, "b1.w2", 2, {12, 29}}, {3, "head", 2, {5, 12}},   {3, "head.bias", 1, {5}},
};
#define N_TENSORS ((int)(sizeof model / sizeof model[0]))

struct variant {
  const char *name;
  enum rf_layout layout;
  enum rf_shard_mode shard;
  enum rf_dtype pdtype, rdtype;
};

static const struct variant variants[] = {
    {"planned-equal", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32},
    {"planned-ragged", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, RF_DTYPE_F32, RF_DTYPE_F32},
    {"fsdp2", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32},
    {"flat", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_F32},
    {"planned-equal-bf16", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, RF_DTYPE_BF16, RF_DTYPE_BF16},
    {"fsdp2-bf16", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, RF_DTYPE_BF16, RF_DTYPE_BF16},
    {"flat-bf16-reduce", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, RF_DTYPE_F32, RF_DTYPE_BF16},
};

static struct rf_fsdp *build(const struct variant *v) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = v->layout;
  opt.shard = v->shard;
  opt.param_dtype = v->pdtype;
  opt.reduce_dtype = v->rdtype;
  struct rf_fsdp *f;
  RF_ASSERT(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) == 0);
  static const char *units[N_UNITS] = {"embed", "block0", "block1", "head"};
  for (int t = 0; t < N_TENSORS; t++) { /* units in order, each unit's tensors after it */
    if (t == 0 || model[t].unit != model[t - 1].unit)
      RF_ASSERT(rf_fsdp_add_unit(f, units[model[t].unit]) == model[t].unit);
    int id = rf_fsdp_add_tensor(f, model[t].unit, model[t].name, model[t].ndim, model[t].shape, 0,
                                (struct rf_init){RF_INIT_NORMAL, 0.02f});
    if (id != t) RF_DIE("%s: %s", model[t].name, rf_fsdp_error());
  }
  RF_ASSERT(rf_fsdp_finalize(f) == 0);
  return f;
}

/* One step: forward over the units, backward in reverse (gradients left zero), reduce. */
static void step(struct rf_fsdp *f) {
  rf_fsdp_zero_grad(f);
  for (int u = 0; u < N_UNITS; u++) {
    rf_fsdp_forward_begin(f, u);
    rf_fsdp_forward_end(f, u);
  }
  for (int u = N_UNITS - 1; u >= 0; u--) {
    rf_fsdp_backward_begin(f, u);
    rf_fsdp_backward_end(f, u);
  }
  rf_fsdp_grads_finish(f);
}

/* The planner's peer numbers of unit u's tensors. */
static struct rf_plan_peer_stats peer_of(enum rf_plan_peer peer, int u, int world) {
  struct rf_plan_tensor_in in[N_TENSORS];
  int n = 0;
  for (int t = 0; t < N_TENSORS; t++) {
    if (model[t].unit != u) continue;
    int64_t numel = model[t].ndim == 2 ? model[t].shape[0] * model[t].shape[1] : model[t].shape[0];
    in[n] = (struct rf_plan_tensor_in){.name = model[t].name,
                                       .ndim = model[t].ndim,
                                       .numel = numel,
                                       .block_elems = model[t].ndim == 2 ? model[t].shape[1] : 1};
    memcpy(in[n].shape, model[t].shape, sizeof model[t].shape);
    n++;
  }
  struct rf_plan_unit_in unit = {"u", n, in};
  struct rf_plan_peer_stats st = {0};
  RF_ASSERT(rf_plan_peer_add(peer, &unit, world, &st) == 0);
  return st;
}

static void check_variant(const struct variant *v, int rank, int world) {
  struct rf_fsdp *f = build(v);
  step(f); /* the first step's counters include nothing else, but measure a later one */
  struct rf_counters before, after;
  rf_fsdp_get_counters(f, &before, NULL);
  step(f);
  rf_fsdp_get_counters(f, &after, NULL);
  struct rf_counters d = rf_counters_diff(&after, &before);

  uint64_t ps = rf_dtype_size(v->pdtype), rs = rf_dtype_size(v->rdtype);
  uint64_t own_shard = 0, gathered = 0, reduced = 0, padding = 0, copied = 0, cast = 0, collectives = 0;
  int64_t plan_copy = 0; /* the planner's peer rule (fsdp2, flat), elements */
  uint64_t layout_copy =
      0; /* the run's plan: rf_fsdp_stats.copy_bytes_per_step, less the last unit's 2nd gather */
  for (int u = 0; u < N_UNITS; u++) {
    const struct rf_dbuffer *db = &f->units[u].db;
    uint64_t g = u == N_UNITS - 1 ? 1 : 2;
    int64_t P = 0, own = 0, own_real = 0, N = 0;
    for (int b = 0; b < db->n_buffers; b++) {
      P += db->bufs[b].total;
      own += db->bufs[b].starts[rank + 1] - db->bufs[b].starts[rank];
    }
    for (int t = 0; t < N_TENSORS; t++) {
      if (model[t].unit != u) continue;
      struct rf_tensor_view tv;
      rf_fsdp_tensor(f, t, &tv);
      own_real += tv.end - tv.begin;
      N += tv.numel;
    }
    int64_t pad_other = (P - N) - (own - own_real);
    own_shard += g * (uint64_t)own * ps;
    gathered += g * (uint64_t)(P - own) * ps;
    reduced += (uint64_t)(P - own) * rs;
    padding += (g * ps + rs) * (uint64_t)pad_other;
    collectives += (g + 1) * (uint64_t)db->n_buffers;
    layout_copy += (uint64_t)db->copy_bytes - (g == 1 && v->layout == RF_LAYOUT_FSDP2 ? (uint64_t)N * ps : 0);
    if (v->layout == RF_LAYOUT_FSDP2) {
      copied += g * (uint64_t)N * ps + (rs == 4 ? (uint64_t)P * 4 : (uint64_t)(P - N) * rs);
      if (rs == 2) cast += (uint64_t)N * 2 + (uint64_t)own * 4;
    } else if (rs == 2) {
      cast += (uint64_t)P * 2 + (uint64_t)own * 4;
    }
    if (v->layout == RF_LAYOUT_FSDP2 || v->layout == RF_LAYOUT_FLAT) {
      struct rf_plan_peer_stats pe =
          peer_of(v->layout == RF_LAYOUT_FSDP2 ? RF_PLAN_PEER_FSDP2 : RF_PLAN_PEER_FSDP1, u, world);
      RF_CHECK(pe.padded_elems == P && pe.elems == N,
               "%s W=%d unit %d: the planner counts %lld of %lld elements, "
               "the DBuffer holds %lld of %lld",
               v->name, world, u, (long long)pe.padded_elems, (long long)pe.elems, (long long)P,
               (long long)N);
      /* the planner charges 2 gathers per unit; the last unit is gathered once */
      plan_copy += pe.copy_elems - (g == 1 && v->layout == RF_LAYOUT_FSDP2 ? N : 0);
    }
  }
  RF_CHECK(d.bytes_own_shard == own_shard, "%s W=%d rank %d: own-shard bytes %llu, predicted %llu", v->name,
           world, rank, (unsigned long long)d.bytes_own_shard, (unsigned long long)own_shard);
  RF_CHECK(d.bytes_gathered == gathered, "%s W=%d rank %d: gathered bytes %llu, predicted %llu", v->name,
           world, rank, (unsigned long long)d.bytes_gathered, (unsigned long long)gathered);
  RF_CHECK(d.bytes_reduced == reduced, "%s W=%d rank %d: reduced bytes %llu, predicted %llu", v->name, world,
           rank, (unsigned long long)d.bytes_reduced, (unsigned long long)reduced);
  RF_CHECK(d.bytes_padding == padding, "%s W=%d rank %d: padding bytes %llu, predicted %llu", v->name, world,
           rank, (unsigned long long)d.bytes_padding, (unsigned long long)padding);
  RF_CHECK(d.bytes_copied == copied, "%s W=%d rank %d: copied bytes %llu, predicted %llu", v->name, world,
           rank, (unsigned long long)d.bytes_copied, (unsigned long long)copied);
  RF_CHECK(d.bytes_cast == cast, "%s W=%d rank %d: cast bytes %llu, predicted %llu", v->name, world, rank,
           (unsigned long long)d.bytes_cast, (unsigned long long)cast);
  RF_CHECK(d.collectives == collectives && d.bytes_alltoall == 0, "%s W=%d: %llu collectives, predicted %llu",
           v->name, world, (unsigned long long)d.collectives, (unsigned long long)collectives);
  if ((v->layout == RF_LAYOUT_FSDP2 || v->layout == RF_LAYOUT_FLAT) && v->pdtype == RF_DTYPE_F32 &&
      v->rdtype == RF_DTYPE_F32)
    RF_CHECK(
        d.bytes_copied == (uint64_t)plan_copy * 4,
        "%s W=%d: %llu bytes copied, the planner's peer rule %llu (own-shard writes not counted as copies)",
        v->name, world, (unsigned long long)d.bytes_copied, (unsigned long long)plan_copy * 4);
  if (v->pdtype == RF_DTYPE_F32 && v->rdtype == RF_DTYPE_F32)
    RF_CHECK(d.bytes_copied == layout_copy,
             "%s W=%d: %llu bytes copied, the run's plan (copy_bytes_per_step) %llu", v->name, world,
             (unsigned long long)d.bytes_copied, (unsigned long long)layout_copy);
  rf_fsdp_free(f);
}

/* Counters are per context: a step of one context moves none of another's counters
 * (allocations aside: they include the process's heap). */
static void check_contexts_apart(void) {
  struct rf_fsdp *a = build(&variants[0]), *b = build(&variants[0]);
  struct rf_counters b0, b1, a0, a1;
  rf_fsdp_get_counters(b, &b0, NULL);
  rf_fsdp_get_counters(a, &a0, NULL);
  step(a);
  rf_fsdp_get_counters(b, &b1, NULL);
  rf_fsdp_get_counters(a, &a1, NULL);
  struct rf_counters db = rf_counters_diff(&b1, &b0), da = rf_counters_diff(&a1, &a0);
  db.allocations = 0;
  struct rf_counters zero = {0};
  RF_CHECK(memcmp(&db, &zero, sizeof zero) == 0, "a step of one context counted into another's");
  RF_CHECK(da.collectives > 0 && da.bytes_own_shard > 0, "the stepping context counted its step");
  rf_fsdp_free(a);
  rf_fsdp_free(b);
}

int main(int argc, char **argv) {
  int world = 0;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) check_variant(&variants[i], rank, world);
  check_contexts_apart();
  return rf_test_finish("test_fsdp_bytes");
}
