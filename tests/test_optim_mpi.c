/* rf-test: np=1,2,3,5 timeout=60
 * The optimizers under mpirun against a single-process run. A small model (odd
 * shapes, tensors smaller than W, a 67 x 250 matrix, a 250-row matrix, vectors
 * across 256-element blocks) is laid out over W ranks like the runtime does:
 * each unit's tensors packed in a flat buffer, rank ranges cut at legal block
 * boundaries near the fair share ("blocks": 32-row strips, 256-element vector
 * runs) or anywhere ("flat": FSDP1, blocks cut). Every rank also runs the same
 * problem alone (W = 1 layout on MPI_COMM_SELF) as the reference. Gradients are
 * a deterministic function of (tensor, element, step, parameter), so they agree
 * whenever the parameters agree. After 20 steps:
 *   - adamw, adamw8bit, muon: every rank's parameters equal the reference within
 *     1e-5 relative (blocks layout; adamw and muon also in the flat layout);
 *   - adamw8bit (blocks): codes and per-block scales bit-identical to the reference;
 *     flat layout: blocks cut by ranks are counted; the parameters' distance to
 *     W = 1 is at most twice the 8-bit run's own distance to f32 AdamW;
 *   - muon (overlapped all-to-all-v over 4 units; blocking on the blocks layout):
 *     every matrix orthogonalized exactly once in the world per step, all ranks
 *     agree on the owners, NS FLOPs balance max <= mean + 1.5 * largest, bytes
 *     counted by the optimizer equal those counted by src/comm;
 *   - no allocation (rf_xmalloc & co) inside the steps;
 *   - what rf_optim_create allocates (counted by the allocator, rf_xalloc_bytes) is
 *     the reported state_bytes + workspace_bytes plus at most 8 KB of bookkeeping, so
 *     the simulator, which takes those from the same code, is checked against the
 *     real allocations and not only against itself. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "optim/optim.h"
#include "rf_test.h"

#define NT 14
#define MAXW 8
#define STEPS 20
/* What a create allocates besides its state and workspace (its structs, the views and
 * owners' tables): 2.6 to 6.4 KB measured here for the 14 views at W <= 5 */
#define BOOKKEEPING_BYTES 8192

struct spec {
  const char *name;
  int unit;
  int ndim;
  int64_t shape[2];
  int flags; /* the groups a model gives them: decay, Muon */
};

#define DM (RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX)

static const struct spec specs[NT] = {
    {"embed", 0, 2, {40, 24}, 0},
    {"layers.0.attn_norm", 1, 1, {24}, 0},
    {"layers.0.wq", 1, 2, {40, 24}, DM},
    {"layers.0.w_up", 1, 2, {67, 250}, DM},
    {"layers.0.bias", 1, 1, {3}, 0},
    {"layers.0.tiny", 1, 2, {2, 5}, DM},
    {"layers.1.w_down", 2, 2, {250, 40}, DM},
    {"layers.1.wo", 2, 2, {33, 33}, DM},
    {"layers.1.vec", 2, 1, {300}, 0},
    {"layers.1.w1", 2, 2, {64, 24}, DM},
    {"head", 3, 2, {24, 50}, RF_OPTIM_FLAG_DECAY},
    {"final_norm", 3, 1, {24}, 0},
    {"proj_in", 0, 2, {16, 40}, DM},
    {"layers.2.wv", 3, 2, {37, 20}, DM},
};
#define NUNITS 4

static int64_t numel_of(int t) {
  return specs[t].ndim == 1 ? specs[t].shape[0] : specs[t].shape[0] * specs[t].shape[1];
}
static int64_t block_of(int t) { return specs[t].ndim == 1 ? 256 : 32 * specs[t].shape[1]; }

/* Every rank's range and shard offset of every tensor, for one world size. */
struct layout {
  int world;
  int64_t shard_elems[MAXW];
  int64_t starts[NT][MAXW + 1];
  int64_t shard_off[NT][MAXW];
  int64_t cuts_inside_blocks;
};

static int legal_cut(const int64_t *off, int u, int64_t pos) {
  for (int t = 0; t < NT; t++) {
    if (specs[t].unit != u) continue;
    if (pos > off[t] && pos < off[t] + numel_of(t) && (pos - off[t]) % block_of(t) != 0) return 0;
  }
  return 1;
}

static void layout_build(struct layout *l, int world, int blocks) {
  memset(l, 0, sizeof *l);
  l->world = world;
  int64_t off[NT];
  for (int u = 0; u < NUNITS; u++) {
    int64_t total = 0;
    for (int t = 0; t < NT; t++) {
      if (specs[t].unit != u) continue;
      total = rf_round_up(total, 16); /* padding between tensors */
      off[t] = total;
      total += numel_of(t);
    }
    int64_t cut[MAXW + 1];
    cut[0] = 0;
    cut[world] = total;
    for (int k = 1; k < world; k++) {
      int64_t target = blocks ? total * k / world : rf_min_i64(total, rf_ceil_div(total, world) * k);
      int64_t best = -1;
      for (int64_t d = 0; blocks && best < 0; d++) {
        if (target - d >= cut[k - 1] && legal_cut(off, u, target - d))
          best = target - d;
        else if (target + d <= total && legal_cut(off, u, target + d))
          best = target + d;
      }
      cut[k] = blocks ? best : target;
      if (!legal_cut(off, u, cut[k])) l->cuts_inside_blocks++;
    }
    for (int t = 0; t < NT; t++) {
      if (specs[t].unit != u) continue;
      for (int r = 0; r <= world; r++)
        l->starts[t][r] = rf_min_i64(numel_of(t), rf_max_i64(0, cut[r] - off[t]));
      for (int r = 0; r < world; r++)
        l->shard_off[t][r] = l->shard_elems[r] + rf_max_i64(off[t], cut[r]) - cut[r];
    }
    for (int r = 0; r < world; r++) l->shard_elems[r] += cut[r + 1] - cut[r];
  }
}

static float hash_f32(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a * 0x9E3779B97F4A7C15ull ^ b * 0xC2B2AE3D27D4EB4Full ^ c * 0x165667B19E3779F9ull;
  return rf_test_rand_f32(&s);
}

/* One run: this rank's shard slabs and its optimizer. */
struct run {
  struct layout *l;
  int rank;
  float *master, *grad;
  struct rf_tensor_view views[NT];
  struct rf_optim *o;
};

static void run_init(struct run *run, struct layout *l, int rank, const struct rf_optim_options *opt,
                     const struct rf_comm *comm) {
  memset(run, 0, sizeof *run);
  run->l = l;
  run->rank = rank;
  int64_t n = l->shard_elems[rank];
  run->master = rf_xcalloc((size_t)n + 1, sizeof(float));
  run->grad = rf_xcalloc((size_t)n + 1, sizeof(float));
  for (int t = 0; t < NT; t++) {
    struct rf_tensor_view *v = &run->views[t];
    v->name = specs[t].name;
    v->unit = specs[t].unit;
    v->ndim = specs[t].ndim;
    v->shape[0] = specs[t].shape[0];
    v->shape[1] = specs[t].shape[1];
    v->numel = numel_of(t);
    v->block_elems = l->cuts_inside_blocks == 0 ? block_of(t) : 1; /* as rf_fsdp_tensor states it */
    v->starts = l->starts[t];
    v->begin = l->starts[t][rank];
    v->end = l->starts[t][rank + 1];
    v->shard_offset = l->shard_off[t][rank];
    v->master = run->master + v->shard_offset;
    v->grad = run->grad + v->shard_offset;
    for (int64_t i = v->begin; i < v->end; i++)
      v->master[i - v->begin] = 0.5f * hash_f32((uint64_t)t, (uint64_t)i, 1);
  }
  int flags[NT];
  for (int t = 0; t < NT; t++) flags[t] = specs[t].flags;
  uint64_t bytes0 = rf_xalloc_bytes();
  RF_ASSERT(rf_optim_create(&run->o, opt, run->views, flags, NT, n, comm) == 0);
  /* what the create allocated, counted by the allocator, against what the optimizer
   * reports (and the simulator takes from the same code): the state and workspace
   * plus the bookkeeping (its structs, the view and owner tables) */
  uint64_t got = rf_xalloc_bytes() - bytes0;
  struct rf_optim_stats st;
  rf_optim_get_stats(run->o, &st);
  int64_t said = st.state_bytes + st.workspace_bytes, extra = (int64_t)got - said;
  RF_CHECK(extra >= 0 && extra <= BOOKKEEPING_BYTES,
           "%s rank %d: the create allocated %llu bytes, state_bytes %lld + workspace_bytes %lld (the rest, "
           "%lld, is not the bookkeeping of at most %d bytes)",
           rf_optim_kind_name(opt->kind), rank, (unsigned long long)got, (long long)st.state_bytes,
           (long long)st.workspace_bytes, (long long)extra, BOOKKEEPING_BYTES);
}

static void run_grads(struct run *run, int step) {
  for (int t = 0; t < NT; t++) {
    struct rf_tensor_view *v = &run->views[t];
    for (int64_t i = v->begin; i < v->end; i++) {
      float p = v->master[i - v->begin];
      float target = 0.3f * hash_f32((uint64_t)t, (uint64_t)i, 2);
      v->grad[i - v->begin] = (p - target) + 0.2f * hash_f32((uint64_t)t, (uint64_t)i, 100 + (uint64_t)step);
    }
  }
}

static void run_steps(struct run *run) {
  for (int s = 0; s < STEPS; s++) {
    run_grads(run, s);
    rf_optim_step(run->o, 0.01f);
  }
}

static void run_free(struct run *run) {
  rf_optim_free(run->o);
  free(run->master);
  free(run->grad);
}

/* This rank's pieces against the reference's whole tensors: the largest relative
 * difference (floor 1e-3), and the largest absolute one in *abs_diff. */
static double compare_params(const struct run *d, const struct run *ref, double *abs_diff) {
  double worst = 0;
  *abs_diff = 0;
  for (int t = 0; t < NT; t++) {
    const struct rf_tensor_view *v = &d->views[t], *rv = &ref->views[t];
    int64_t len = v->end - v->begin;
    if (len == 0) continue;
    double diff = rf_test_max_rel_diff(v->master, rv->master + v->begin, (size_t)len, 1e-3);
    worst = rf_test_max(worst, diff);
    *abs_diff = rf_test_max(*abs_diff, rf_test_max_abs_diff(v->master, rv->master + v->begin, (size_t)len));
  }
  return worst;
}

static void check_8bit_state(const struct run *d, const struct run *ref, const char *label) {
  struct rf_optim_state_slab s[4], rs[4];
  for (int i = 0; i < 4; i++) {
    rf_optim_state(d->o, i, &s[i]);
    rf_optim_state(ref->o, i, &rs[i]);
  }
  long bad_codes = 0, bad_scales = 0;
  for (int t = 0; t < NT; t++) {
    const struct rf_tensor_view *v = &d->views[t], *rv = &ref->views[t];
    int64_t len = v->end - v->begin;
    for (int k = 0; k < 2; k++)
      bad_codes += memcmp((const uint8_t *)s[k].data + v->shard_offset,
                          (const uint8_t *)rs[k].data + rv->shard_offset + v->begin, (size_t)len) != 0;
    int64_t off, cnt, first, roff, rcnt, rfirst;
    rf_optim_scales(d->o, t, &off, &cnt, &first);
    rf_optim_scales(ref->o, t, &roff, &rcnt, &rfirst);
    RF_CHECK(rfirst == 0 && first + cnt <= rcnt, "%s: %s: blocks [%lld, +%lld) of %lld", label, v->name,
             (long long)first, (long long)cnt, (long long)rcnt);
    for (int k = 2; k < 4 && first + cnt <= rcnt; k++)
      bad_scales += memcmp((const float *)s[k].data + off, (const float *)rs[k].data + roff + first,
                           (size_t)cnt * sizeof(float)) != 0;
  }
  RF_CHECK(bad_codes == 0 && bad_scales == 0,
           "%s: 8-bit state differs from W=1 (%ld code runs, %ld scale runs)", label, bad_codes, bad_scales);
}

static void check_muon(const struct run *d, const struct rf_comm *comm, const char *label,
                       uint64_t a2a_bytes) {
  int64_t counts[NT], owners_min[NT], owners_max[NT];
  double cost_max = 0;
  for (int t = 0; t < NT; t++) {
    counts[t] = rf_optim_muon_count(d->o, t);
    owners_min[t] = owners_max[t] = rf_optim_muon_owner(d->o, t);
    if (owners_min[t] >= 0) {
      double c = rf_optim_ns_flops(specs[t].shape[0], specs[t].shape[1], 5);
      if (c > cost_max) cost_max = c;
    }
  }
  rf_comm_allreduce(comm, counts, NT, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  rf_comm_allreduce(comm, owners_min, NT, RF_DTYPE_I64, RF_REDUCE_OP_MIN);
  rf_comm_allreduce(comm, owners_max, NT, RF_DTYPE_I64, RF_REDUCE_OP_MAX);
  int n_muon = 0;
  for (int t = 0; t < NT; t++) {
    int is_muon = owners_max[t] >= 0;
    n_muon += is_muon;
    RF_CHECK(owners_min[t] == owners_max[t], "%s: ranks disagree on the owner of %s", label, specs[t].name);
    RF_CHECK(counts[t] == (is_muon ? STEPS : 0), "%s: %s orthogonalized %lld times in %d steps", label,
             specs[t].name, (long long)counts[t], STEPS);
  }
  RF_CHECK(n_muon == 8, "%s: %d Muon matrices, expected 8", label, n_muon);
  struct rf_optim_stats st;
  rf_optim_get_stats(d->o, &st);
  double load[2] = {st.muon_owned_flops, st.muon_owned_flops};
  double total = load[0];
  rf_comm_allreduce(comm, &load[1], 1, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
  rf_comm_allreduce(comm, &total, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  double mean = total / comm->world;
  RF_CHECK(load[1] <= mean + 1.5 * cost_max + 1, "%s: NS load max %.3g, mean %.3g, largest matrix %.3g",
           label, load[1], mean, cost_max);
  RF_CHECK(st.muon_ns_flops == STEPS * st.muon_owned_flops, "%s: NS FLOPs %.6g, expected %d x %.6g", label,
           st.muon_ns_flops, STEPS, st.muon_owned_flops);
  RF_CHECK(st.muon_bytes_sent == a2a_bytes, "%s: optimizer counted %llu bytes sent, src/comm %llu", label,
           (unsigned long long)st.muon_bytes_sent, (unsigned long long)a2a_bytes);
  uint64_t sr[2] = {st.muon_bytes_sent, st.muon_bytes_recv};
  rf_comm_allreduce(comm, sr, 2, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  RF_CHECK(sr[0] == sr[1], "%s: bytes sent %llu != received %llu in the world", label,
           (unsigned long long)sr[0], (unsigned long long)sr[1]);
  if (comm->rank == 0)
    printf("%s: W=%d NS load max/mean %.3f (bound %.3f), bytes sent per rank per step (rank 0) %.0f\n", label,
           comm->world, load[1] / mean, (mean + 1.5 * cost_max) / mean, (double)st.muon_bytes_sent / STEPS);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  RF_ASSERT(world <= MAXW);
  struct rf_comm comm, self;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  rf_comm_init(&self, MPI_COMM_SELF);
  struct rf_counters counters = {0}; /* the world communicator's: what the optimizers move */
  comm.counters = &counters;
  struct layout l1, lb, lf;
  layout_build(&l1, 1, 1);
  layout_build(&lb, world, 1);
  layout_build(&lf, world, 0);
  RF_CHECK(lb.cuts_inside_blocks == 0, "blocks layout cuts a block");

  /* The f32 AdamW reference: the 8-bit runs' quantization noise is measured against it. */
  struct rf_optim_options opt32;
  rf_optim_options_default(&opt32);
  struct run ref32;
  run_init(&ref32, &l1, 0, &opt32, &self);
  run_steps(&ref32);

  for (int kind = 0; kind < 4; kind++) {
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = (enum rf_optim_kind)(kind < 3 ? kind : RF_OPTIM_KIND_MUON);
    opt.muon_overlap = kind == 2; /* muon: overlapped all-to-all-v (4 units, 3 slots), then blocking */
    struct run ref;
    run_init(&ref, &l1, 0, &opt, &self);
    run_steps(&ref);
    double noise8 = 0;
    if (opt.kind == RF_OPTIM_KIND_ADAMW8BIT) compare_params(&ref, &ref32, &noise8);
    for (int flat = 0; flat < (kind == 3 ? 1 : 2); flat++) { /* blocking Muon: the blocks layout only */
      char label[64];
      snprintf(label, sizeof label, "%s%s/%s", rf_optim_kind_name(opt.kind), kind == 3 ? "-blocking" : "",
               flat ? "flat" : "blocks");
      struct run d;
      run_init(&d, flat ? &lf : &lb, rank, &opt, &comm);
      uint64_t a2a0 = counters.bytes_alltoall, t0 = rf_time_ns();
      uint64_t allocs0 = rf_heap_allocations() + counters.allocations;
      run_steps(&d);
      RF_CHECK(rf_heap_allocations() + counters.allocations == allocs0, "%s: %llu allocations in %d steps",
               label, (unsigned long long)(rf_heap_allocations() + counters.allocations - allocs0), STEPS);
      double ms = (double)(rf_time_ns() - t0) / 1e6;
      uint64_t a2a = counters.bytes_alltoall - a2a0;
      double adiff, diff = compare_params(&d, &ref, &adiff);
      double all[2] = {diff, adiff};
      rf_comm_allreduce(&comm, all, 2, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
      struct rf_optim_stats st;
      rf_optim_get_stats(d.o, &st);
      int64_t cut = st.tiles_cut;
      rf_comm_allreduce(&comm, &cut, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
      if (rank == 0)
        printf(
            "%s: W=%d to W=1 after %d steps: max rel diff %.3g, max abs diff %.3g (blocks quantized per "
            "fragment: %lld); %.0f ms\n",
            label, world, STEPS, all[0], all[1], (long long)cut, ms);
      if (opt.kind == RF_OPTIM_KIND_ADAMW8BIT && flat) {
        /* cut blocks change the state: bounded by twice 8-bit's own distance to f32 AdamW */
        if (rank == 0) printf("%s: 8-bit vs f32 AdamW at W=1: max abs diff %.3g\n", label, noise8);
        RF_CHECK(adiff <= 2 * noise8, "%s: max abs diff %.3g > 2 x %.3g", label, adiff, noise8);
        RF_CHECK(world == 1 || lf.cuts_inside_blocks == 0 || cut > 0, "%s: cut blocks not counted", label);
      } else {
        RF_CHECK(diff <= 1e-5, "%s: max rel diff %.3g", label, diff);
      }
      if (opt.kind == RF_OPTIM_KIND_ADAMW8BIT && !flat) {
        RF_CHECK(st.tiles_cut == 0, "%s: %lld blocks cut", label, (long long)st.tiles_cut);
        check_8bit_state(&d, &ref, label);
      }
      if (opt.kind == RF_OPTIM_KIND_MUON) check_muon(&d, &comm, label, a2a);
      run_free(&d);
    }
    run_free(&ref);
  }
  run_free(&ref32);
  rf_comm_free(&self);
  rf_comm_free(&comm);
  return rf_test_finish("test_optim_mpi");
}
