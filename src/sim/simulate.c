/* The simulator behind `rfsdp plan --batch`: a step of a run laid out by the
 * planning policy, as the runtime executes it (src/fsdp/fsdp.c carves the arena,
 * src/fsdp/schedule.c gathers with prefetch and reduces, src/dbuffer/layout.c
 * sizes the slabs and slots), counted from the plan alone: memory per rank, bytes
 * per step as src/comm counts them, and a step time from the alpha-beta model of
 * each collective with the prefetch schedule's overlap. docs/scale.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "sim/sim.h"

/* A unit's sizes on one rank, as src/dbuffer/layout.c lays them out (elements). */
struct rf_sim_unit {
  int64_t shard;   /* this rank's pieces of every buffer, each aligned */
  int64_t slot;    /* param slot (fsdp2: the staging buffer, then each tensor's storage) */
  int64_t gview;   /* f32 part of the grad slot the backward writes */
  int64_t staging; /* grad slot: the reduce-dtype staging buffer (when one is needed) */
};

static void rf_sim_unit_sizes(const struct rf_plan_layout *l, const struct rf_plan_unit_in *in, int rank,
                              int64_t align, struct rf_sim_unit *out) {
  const struct rf_plan_unit *p = &l->plan;
  memset(out, 0, sizeof *out);
  if (l->layout == RF_LAYOUT_FSDP2) {
    const struct rf_plan_buffer *b = &p->buffers[0];
    out->shard = rf_round_up(b->shard_elems, align);
    out->slot = rf_round_up(b->total_elems, align);
    for (int t = 0; t < in->n_tensors; t++) {
      out->slot = rf_round_up(out->slot + in->tensors[t].numel, align);
      out->gview = rf_round_up(out->gview + in->tensors[t].numel, align);
    }
    out->staging = b->total_elems;
    return;
  }
  for (int k = 0; k < p->n_buffers; k++) {
    const struct rf_plan_buffer *b = &p->buffers[k];
    out->slot = rf_round_up(out->slot + b->total_elems, align);
    out->shard = rf_round_up(out->shard + b->starts[rank + 1] - b->starts[rank], align);
  }
  out->gview = out->staging = out->slot;
}

/* The first tile scale of FP8 tensor t at element `at` (a band's first element,
 * or the end): a matrix is one grid of 128x128 tiles, fused experts [E, rows,
 * cols] E grids, the scales expert-major (src/dbuffer/layout.c scale_starts). */
static int64_t rf_sim_tile_at(const struct rf_plan_tensor_in *t, int64_t at) {
  int64_t cols = t->shape[t->ndim - 1], rows = t->shape[t->ndim - 2], per = rows * cols;
  int64_t band = (int64_t)RF_FP8_TILE * cols, tc = rf_ceil_div(cols, RF_FP8_TILE);
  return (at / per * rf_ceil_div(rows, RF_FP8_TILE) + at % per / band) * tc;
}

/* A unit's param slot in bytes by the core's slot rule (rf_slot_place, as
 * src/dbuffer/layout.c rf_dbuffer_slot_bytes lays it out):
 * `slot` elements of the param dtype; under FP8 block, planned: every buffer in
 * its dtype (FP8: a byte per element) on the alignment, then each FP8 tensor's
 * f32 tile scales; fsdp2 and flat (quantized after the gather): the slot, then
 * each FP8 tensor's codes (a byte per element) and tile scales, then with bf16
 * parameters an f32 scratch of the widest band of 128 rows. */
static int64_t rf_sim_slot_bytes(const struct rf_plan_policy *p, const struct rf_plan_split *sp, int64_t slot,
                                 int64_t ps, int64_t align) {
  int after = 0;
  for (int g = 0; g < sp->n_groups && p->fp8 && p->layout != RF_LAYOUT_PLANNED; g++)
    for (int k = 0; k < sp->in[g].n_tensors; k++) after |= sp->in[g].tensors[k].fp8;
  if (sp->n_groups < 2 && !sp->fp8[0] && !after) return slot * ps;
  int64_t at = after ? slot * ps : 0, band = 0;
  for (int g = 0; g < sp->n_groups && !after; g++)
    for (int k = 0; k < sp->layout[g].plan.n_buffers; k++)
      rf_slot_place(&at, sp->layout[g].plan.buffers[k].total_elems * (sp->fp8[g] ? 1 : ps), align * ps);
  for (int g = 0; g < sp->n_groups; g++)
    for (int k = 0; k < sp->in[g].n_tensors; k++) {
      const struct rf_plan_tensor_in *t = &sp->in[g].tensors[k];
      if (!(after ? t->fp8 : sp->fp8[g])) continue;
      if (after) /* the codes every rank quantizes after the gather */
        rf_slot_fp8_codes(&at, &band, t->numel, t->shape[t->ndim - 2], t->shape[t->ndim - 1], align * ps);
      rf_slot_fp8_scales(&at, rf_sim_tile_at(t, t->numel), align * ps);
    }
  rf_slot_band(&at, band, ps, align * ps);
  return at;
}

/* The views every shard-group rank gives the optimizer (src/fsdp's, from the
 * same layout: each tensor's RaggedShard, its blocks kept whole or cut) and
 * their flags (the caller's, per tensor in the units' order). */
struct rf_sim_views {
  int n, world;
  struct rf_tensor_view *views;
  int *flags;
  int64_t *starts; /* n x (world + 1) */
};

/* The views from the units as the runtime lays them out, in the runtime's tensor
 * order (the model's: a unit's tensors in order, whatever group holds them). */
static int rf_sim_views_make(const struct rf_plan_split *sp, int n_units, const int *flags, int world,
                             struct rf_sim_views *v) {
  memset(v, 0, sizeof *v);
  v->world = world;
  for (int u = 0; u < n_units; u++)
    for (int g = 0; g < sp[u].n_groups; g++) v->n += sp[u].in[g].n_tensors;
  v->views = rf_xcalloc((size_t)rf_max_i64(v->n, 1), sizeof *v->views);
  v->flags = rf_xcalloc((size_t)rf_max_i64(v->n, 1), sizeof *v->flags);
  v->starts = rf_xcalloc((size_t)rf_max_i64(v->n, 1) * (size_t)(world + 1), sizeof *v->starts);
  for (int u = 0, first = 0; u < n_units; u++) {
    int in_unit = 0;
    for (int g = 0, at = 0; g < sp[u].n_groups; g++)
      for (int i = 0; i < sp[u].in[g].n_tensors; i++, at++) {
        int k = first + sp[u].map[at];
        const struct rf_plan_tensor_in *t = &sp[u].in[g].tensors[i];
        struct rf_tensor_view *w = &v->views[k];
        struct rf_shard sh;
        RF_TRY(rf_plan_layout_tensor_shard(&sp[u].layout[g], &sp[u].in[g], i, &sh));
        rf_shard_starts(&sh, v->starts + (size_t)k * (size_t)(world + 1));
        w->block_elems = sh.block_elems == rf_min_i64(t->block_elems, t->numel) ? t->block_elems : 1;
        rf_shard_free(&sh);
        w->name = t->name;
        w->unit = u;
        w->ndim = t->ndim;
        memcpy(w->shape, t->shape, sizeof w->shape);
        w->numel = t->numel;
        w->starts = v->starts + (size_t)k * (size_t)(world + 1);
        if (flags) v->flags[k] = flags[k];
        in_unit++;
      }
    first += in_unit;
  }
  return 0;
}

static void rf_sim_views_free(struct rf_sim_views *v) {
  free(v->views);
  free(v->flags);
  free(v->starts);
}

/* The optimizer of shard-group rank r with a slab of shard_elems, by its own
 * create in measure mode. */
static int rf_sim_optim_rank(const struct rf_sim_options *o, struct rf_sim_views *v, int r,
                             int64_t shard_elems, struct rf_optim_stats *out) {
  for (int k = 0; k < v->n; k++) {
    v->views[k].begin = v->views[k].starts[r];
    v->views[k].end = v->views[k].starts[r + 1];
  }
  return rf_optim_measure(&o->optim, v->views, v->flags, v->n, shard_elems, r, v->world, out);
}

/* The memory of shard-group rank r (out->mem, out->shard_elems) and its
 * optimizer's bytes per step (`owner_bytes`). */
static int rf_sim_rank_memory(const struct rf_plan_split *sp, int n, const struct rf_plan_policy *p,
                              const struct rf_sim_options *o, struct rf_sim_views *v, int r,
                              struct rf_sim_memory *mem, int64_t *shard_elems, struct rf_optim_stats *opt) {
  int64_t align = rf_plan_policy_align_elems(p), slab = 0, pslot = 0, gslot = 0;
  size_t ps = rf_dtype_size(p->param_dtype), rs = rf_dtype_size(p->reduce_dtype);
  int staging = p->layout == RF_LAYOUT_FSDP2 || p->reduce_dtype != RF_DTYPE_F32;
  for (int u = 0; u < n; u++) {
    struct rf_sim_unit x = {0};
    for (int g = 0; g < sp[u].n_groups; g++) { /* the groups' buffers follow one another */
      struct rf_sim_unit y;
      rf_sim_unit_sizes(&sp[u].layout[g], &sp[u].in[g], r, align, &y);
      x.shard += y.shard;
      x.slot += y.slot;
      x.gview += y.gview;
      x.staging += y.staging;
    }
    slab += x.shard;
    int64_t pb = rf_sim_slot_bytes(p, &sp[u], x.slot, (int64_t)ps, align);
    int64_t gb = rf_round_up(x.gview * (int64_t)sizeof(float), 64) +
                 (staging ? rf_round_up(x.staging * (int64_t)rs, 64) : 0) + x.shard * (int64_t)sizeof(float);
    pslot = rf_max_i64(pslot, pb);
    gslot = rf_max_i64(gslot, gb);
  }
  slab = rf_max_i64(slab, 1);
  int64_t n_pslots = o->reshard_after_forward ? rf_min_i64(o->prefetch + 1, n) : n,
          n_gslots = rf_min_i64(2, n);
  *shard_elems = slab;
  mem->params = slab * (int64_t)sizeof(float);
  /* HSDP with bf16 reduces: the replica all-reduce's bf16 copy of the gradient shard (src/fsdp) */
  mem->grads =
      slab * (int64_t)(sizeof(float) + (o->replicate > 1 && p->reduce_dtype == RF_DTYPE_BF16 ? rs : 0));
  RF_TRY(rf_sim_optim_rank(o, v, r, slab, opt));
  mem->optim = opt->state_bytes;
  mem->optim_workspace = opt->workspace_bytes;
  mem->gathered = n_pslots * rf_round_up(pslot, 64) + n_gslots * rf_round_up(gslot, 64);
  mem->activations = o->activation_bytes;
  mem->total =
      mem->params + mem->grads + mem->optim + mem->optim_workspace + mem->gathered + mem->activations;
  return 0;
}

/* Elements a rank receives in the all-gather of a buffer (and sends into its
 * reduce-scatter): equal shards (W-1) S, ragged the buffer less its own range. */
static int64_t rf_sim_others(const struct rf_plan_unit *p, const struct rf_plan_buffer *b, int r) {
  if (p->mode == RF_SHARD_MODE_EQUAL) return (int64_t)(p->world - 1) * b->shard_elems;
  return b->total_elems - (b->starts[r + 1] - b->starts[r]);
}

/* FP8 tensor t's tile scales rank r receives in their all-gather (f32 each):
 * the tensor's tiles less those of r's range. */
static int64_t rf_sim_scales_others(const struct rf_plan_layout *l, const struct rf_plan_unit_in *in, int t,
                                    int r, int64_t *starts) {
  struct rf_shard sh;
  RF_TRY(rf_plan_layout_tensor_shard(l, in, t, &sh));
  rf_shard_starts(&sh, starts);
  rf_shard_free(&sh);
  const struct rf_plan_tensor_in *x = &in->tensors[t];
  return rf_sim_tile_at(x, x->numel) - (rf_sim_tile_at(x, starts[r + 1]) - rf_sim_tile_at(x, starts[r]));
}

/* Ranks of a run of `world` ranks on one node. */
static int rf_sim_ranks_on_node(const struct rf_sim_network *net, int world) {
  return net->ranks_per_node > 0 && net->ranks_per_node < world ? net->ranks_per_node : world;
}

/* The links of a collective over a group of n ranks whose members span `span`
 * ranks of the run (the shard group: S of S; the replicas: R of W; the world: W)
 * placed node by node: across nodes `inter`; on a node with a core per rank
 * `intra`; on a node whose ranks outnumber its cores `shared_small` when the
 * group fits its cores (its members can run at once), else `shared`. */
static const struct rf_sim_link *rf_sim_links(const struct rf_sim_network *net, int n, int span, int world) {
  if (net->ranks_per_node > 0 && span > net->ranks_per_node) return net->inter;
  if (rf_sim_ranks_on_node(net, world) <= net->cores_per_node) return net->intra;
  return n > net->cores_per_node ? net->shared : net->shared_small;
}

/* What the prefetch schedule leaves of communication m while computing c. */
static double rf_sim_hide(double c, double m, double overlap) {
  double left = m - overlap * c;
  return c + (left > 0 ? left : 0);
}

/* When a collective of d ms that may start at `at` ends on a link that the
 * collectives before it hold until `busy`: before `end` (the backward's compute
 * ends) it moves at the rate `overlap` (the share of communication compute hides,
 * as rf_sim_hide), after it at full rate. */
static double rf_sim_link_after(double at, double busy, double d, double end, double overlap) {
  double begin = at > busy ? at : busy;
  if (begin >= end || d <= 0) return begin + d;
  double during = overlap * (end - begin);
  return during >= d ? begin + d / overlap : end + (d - during);
}

/* Bytes per step of out->rank and the step time (the rest of rf_sim_step). */
static int rf_sim_traffic(const struct rf_plan_split *sp, const struct rf_plan_model_result *m,
                          const struct rf_plan_policy *p, const struct rf_sim_options *o,
                          struct rf_sim_result *out) {
  int s = m->world, n = m->n_units;
  /* bytes of that rank per step, and the time of each unit's collectives */
  size_t ps = rf_dtype_size(p->param_dtype), rs = rf_dtype_size(p->reduce_dtype);
  const struct rf_sim_link *sl = rf_sim_links(&o->net, s, s, out->world);
  const struct rf_sim_link *rl = rf_sim_links(&o->net, o->replicate, out->world, out->world);
  const struct rf_sim_link *wl = rf_sim_links(&o->net, out->world, out->world, out->world);
  double *g = rf_xcalloc((size_t)n, sizeof *g), *red = rf_xcalloc((size_t)n, sizeof *red);
  double *c = rf_xcalloc((size_t)n, sizeof *c), *ready = rf_xcalloc((size_t)n, sizeof *ready);
  int64_t gather_unit = 0, reduce_unit = 0, last_gather = 0;
  int64_t *starts = rf_xmalloc((size_t)(s + 1) * sizeof *starts);
  for (int u = 0; u < n; u++) {
    int64_t gu = 0;
    for (int q = 0; q < sp[u].n_groups; q++) {
      const struct rf_plan_unit *pu = &sp[u].layout[q].plan;
      size_t gs = sp[u].fp8[q] ? 1 : ps; /* FP8 buffers travel as codes */
      for (int k = 0; k < pu->n_buffers; k++) {
        const struct rf_plan_buffer *b = &pu->buffers[k];
        int64_t others = rf_sim_others(pu, b, out->rank);
        gu += others * (int64_t)gs;
        reduce_unit += others * (int64_t)rs;
        g[u] += rf_sim_link_ms(&sl[RF_SIM_COLL_ALLGATHER], RF_SIM_COLL_ALLGATHER, s,
                               (double)b->total_elems * (double)gs);
        red[u] += rf_sim_link_ms(&sl[RF_SIM_COLL_REDUCE_SCATTER], RF_SIM_COLL_REDUCE_SCATTER, s,
                                 (double)b->total_elems * (double)rs);
      }
      for (int t = 0; t < sp[u].in[q].n_tensors && sp[u].fp8[q]; t++) { /* and their scales, a gather each */
        int64_t others = rf_sim_scales_others(&sp[u].layout[q], &sp[u].in[q], t, out->rank, starts);
        if (others < 0) {
          free(starts);
          free(g);
          free(red);
          free(c);
          free(ready);
          return -1;
        }
        gu += others * (int64_t)sizeof(float);
        g[u] += rf_sim_link_ms(
            &sl[RF_SIM_COLL_ALLGATHER], RF_SIM_COLL_ALLGATHER, s,
            (double)rf_sim_tile_at(&sp[u].in[q].tensors[t], sp[u].in[q].tensors[t].numel) * sizeof(float));
      }
    }
    gather_unit += gu;
    if (u == n - 1) last_gather = gu;
  }
  free(starts);
  /* per micro-batch: the forward gathers every unit, the backward all but the
   * last (kept from the forward) when the forward resharded; every unit reduces once */
  int64_t gathers = o->reshard_after_forward ? 2 * gather_unit - last_gather : gather_unit;
  out->gather_bytes = o->accum * gathers;
  out->bytes_intra = out->gather_bytes + o->accum * reduce_unit;
  /* the gradient shard all-reduced over the replicas once per step (f32, or bf16 with bf16 reduces) */
  int64_t inter = o->replicate > 1 ? out->shard_elems * (int64_t)rs : 0;
  out->bytes_inter = inter;
  int64_t scalars = (s > 1 ? 8 : 0) + (out->world > 1 ? o->scalar_reduce_bytes : 0); /* grad norm (f64) */
  out->reduce_bytes = o->accum * reduce_unit + inter + scalars;
  /* the norm on the shard group; the caller's scalars on the world (across groups under HSDP) */
  out->bytes_intra += (s > 1 ? 8 : 0) + (o->replicate == 1 ? scalars - (s > 1 ? 8 : 0) : 0);
  /* Muon's and Shampoo's matrix owners inside the shard group, once per step */
  out->bytes_intra += out->alltoall_bytes;
  out->bytes_inter += o->replicate > 1 ? o->scalar_reduce_bytes : 0;

  /* time: compute split over the units by their share of the elements; ranks
   * beyond a node's cores time-share them */
  int on_node = rf_sim_ranks_on_node(&o->net, out->world);
  out->time_share = on_node > o->net.cores_per_node ? (double)on_node / o->net.cores_per_node : 1.0;
  out->peak_gflops = o->f32_compute ? o->net.peak_gflops_f32 : o->net.peak_gflops;
  out->compute_ms = o->flops_per_token * o->tokens_per_rank / (out->peak_gflops * 1e9 * o->net.efficiency) *
                    1e3 * out->time_share;
  double micro = out->compute_ms / o->accum, ov = o->net.overlap, step = 0, comm = 0;
  for (int u = 0; u < n; u++) c[u] = micro * (double)m->units[u].plan.elems / (double)rf_max_i64(m->elems, 1);
  for (int a = 0; a < o->accum; a++) {
    step += g[0];
    comm += g[0];
    for (int u = 0; u < n; u++) { /* forward: unit u computes while u + 1 is gathered */
      double next = u + 1 < n ? g[u + 1] : 0;
      step += rf_sim_hide(c[u] / 3, next, ov);
      comm += next;
    }
    for (int u = n - 1; u >= 0; u--) { /* backward: u computes while u - 1 gathers and u + 1 reduces */
      double x = (o->reshard_after_forward && u > 0 ? g[u - 1] : 0) + (u + 1 < n ? red[u + 1] : 0);
      step += rf_sim_hide(2 * c[u] / 3, x, ov);
      comm += x;
      if (u + 1 < n) ready[u + 1] = step; /* unit u + 1's reduce-scatter has finished */
    }
    step += red[0];
    comm += red[0];
    ready[0] = step;
  }
  /* HSDP (src/fsdp/schedule.c): each unit's gradient shard is all-reduced across
   * the replicas on its own, started non-blocking as the last micro-batch's
   * reduce-scatter of that unit finishes (when the backward of the unit after the
   * next begins: ready[u]), in backward order, one after another on the replicas'
   * link, while the rest of the backward computes; what is left when the backward
   * ends is waited for (rf_fsdp_grads_finish) */
  double end = step, busy = 0;
  for (int u = n - 1; u >= 0 && o->replicate > 1; u--) {
    int64_t elems = 0;
    for (int q = 0; q < sp[u].n_groups; q++) {
      struct rf_sim_unit y;
      rf_sim_unit_sizes(&sp[u].layout[q], &sp[u].in[q], out->rank, rf_plan_policy_align_elems(p), &y);
      elems += y.shard;
    }
    double d = rf_sim_link_ms(&rl[RF_SIM_COLL_ALLREDUCE], RF_SIM_COLL_ALLREDUCE, o->replicate,
                              (double)elems * (double)rs); /* f32, or bf16 with bf16 reduces */
    busy = rf_sim_link_after(ready[u], busy, d, end, ov);
    comm += d;
  }
  out->replica_exposed_ms = busy > end ? busy - end : 0;
  double tail = out->replica_exposed_ms +
                rf_sim_link_ms(&sl[RF_SIM_COLL_ALLREDUCE], RF_SIM_COLL_ALLREDUCE, s, 8.0) +
                rf_sim_link_ms(&wl[RF_SIM_COLL_ALLREDUCE], RF_SIM_COLL_ALLREDUCE, out->world,
                               (double)o->scalar_reduce_bytes);
  step += tail;
  comm += tail - out->replica_exposed_ms;
  /* the optimizer (rf_optim_stats, its own ops' costs): its memory traffic at
   * the memory bandwidth, the matrix owners' work at the matmuls' rate */
  out->optim_ms = (out->optim_stream_bytes / (o->net.mem_gbs * 1e9) +
                   out->optim_flops / (out->peak_gflops * 1e9 * o->net.efficiency)) *
                  1e3 * out->time_share;
  /* the layout's copies (docs/planner.md's counting rule: per step of one micro-batch) */
  out->copy_ms = (double)o->accum * (double)m->copy_bytes / (o->net.mem_gbs * 1e9) * 1e3 * out->time_share;
  out->comm_ms = comm;
  out->exposed_comm_ms = step - out->compute_ms;
  out->step_ms = step + out->optim_ms + out->copy_ms;
  free(g);
  free(red);
  free(c);
  free(ready);
  return 0;
}

int rf_sim_step(const struct rf_plan_unit_in *units, const struct rf_plan_model_result *m,
                const struct rf_plan_policy *p, const struct rf_sim_options *o, struct rf_sim_result *out) {
  memset(out, 0, sizeof *out);
  int s = m->world, n = m->n_units;
  RF_REQUIRE(o->replicate >= 1 && s >= 1 && n >= 1, "simulate: %d replicas of %d ranks, %d units",
             o->replicate, s, n);
  RF_REQUIRE(o->accum >= 1 && o->prefetch >= 0, "simulate: accum %d, prefetch %d", o->accum, o->prefetch);
  RF_REQUIRE(o->net.peak_gflops > 0 && o->net.peak_gflops_f32 > 0 && o->net.efficiency > 0 &&
                 o->net.efficiency <= 1 && o->net.mem_gbs > 0 && o->net.overlap >= 0 && o->net.overlap <= 1,
             "simulate: network %s: peak, efficiency (0, 1], memory bandwidth positive, overlap in [0, 1]",
             o->net.name);
  RF_REQUIRE(o->net.cores_per_node >= 1 && o->net.ranks_per_node >= 0,
             "simulate: network %s: %d cores and %d ranks per node", o->net.name, o->net.cores_per_node,
             o->net.ranks_per_node);
  out->replicate = o->replicate;
  out->shard_world = s;
  out->world = s * o->replicate;
  RF_REQUIRE(o->rank >= -1 && o->rank < s, "simulate: rank %d of a shard group of %d", o->rank, s);
  /* every unit as the runtime lays it out (FP8 block: its FP8 tensors apart) */
  struct rf_plan_split *sp = rf_xcalloc((size_t)n, sizeof *sp);
  int rc = 0;
  for (int u = 0; u < n && rc == 0; u++) rc = rf_plan_split_make(p, s, &units[u], &sp[u]);
  struct rf_sim_views v = {0};
  if (rc == 0) rc = rf_sim_views_make(sp, n, o->flags, s, &v);
  /* memory: the rank asked for, or the fullest of the group (ranks differ in
   * ragged shards, 8-bit blocks and the matrices they own) */
  for (int r = o->rank < 0 ? 0 : o->rank; r < (o->rank < 0 ? s : o->rank + 1) && rc == 0; r++) {
    struct rf_sim_memory mem;
    int64_t slab;
    struct rf_optim_stats st;
    rc = rf_sim_rank_memory(sp, n, p, o, &v, r, &mem, &slab, &st);
    if (rc == 0 && (r == 0 || mem.total > out->mem.total)) {
      out->mem = mem;
      out->rank = r;
      out->shard_elems = slab;
      out->alltoall_bytes = (int64_t)st.muon_step_bytes_sent;
      out->optim_stream_bytes = st.step_stream_bytes;
      out->optim_flops = st.step_flops;
    }
  }
  if (rc == 0) rc = rf_sim_traffic(sp, m, p, o, out);
  rf_sim_views_free(&v);
  for (int u = 0; u < n; u++) rf_plan_split_free(&sp[u]);
  free(sp);
  return rc;
}
