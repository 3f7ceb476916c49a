/* src/optim: AdamW, block-wise 8-bit AdamW and distributed Muon on the pieces of
 * the shards. See optim.h and docs/optim.md. */
#include "optim/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define RF_OPTIM_TILE 32        /* 8-bit: 32 x 32 tiles of matrices */
#define RF_OPTIM_VEC_BLOCK 256  /* 8-bit: runs of 256 elements of vectors */
#define RF_OPTIM_BLOCK_MAX 1024 /* the largest block, in elements */

/* One view and what the optimizer derived from it. */
struct rf_optim_view {
  struct rf_tensor_view v; /* copy; starts/master/grad borrowed */
  int flags;
  int64_t rows, cols; /* cols 0: a vector (blocks of 256) */
  int64_t scale_off, n_blocks, first_block;
  /* Muon */
  int owner;
  int group;
  double ns_flops;
  int64_t ns_count;
  float lr_adjust;  /* adjusted lr = lr * lr_adjust */
  int64_t send_off; /* this rank's piece in its group's send staging */
};

/* The Muon matrices of one unit: one all-to-all-v out, one back. Owns its arrays. */
struct rf_optim_group {
  int unit;
  int *members; /* view indices, in view order */
  int n_members;
  int64_t *send_counts, *send_displs, *recv_counts, *recv_displs; /* world each, elements, from the slot */
  int64_t send_total, recv_total;
};

struct rf_optim {
  struct rf_optim_options opt;
  const struct rf_comm *comm; /* borrowed */
  int rank, world;
  int n;
  struct rf_optim_view *views; /* owned */
  int64_t shard_elems;
  int64_t step;
  /* adamw, muon: f32 state at shard offsets (muon: m is the momentum of Muon views) */
  float *m, *v;
  /* adamw8bit */
  uint8_t *mq, *vq;
  float *ms, *vs;
  int64_t n_scales;
  uint8_t zero_code_m;
  float *blk_m, *blk_v; /* RF_OPTIM_BLOCK_MAX each */
  /* muon */
  int n_groups;
  struct rf_optim_group *groups;
  /* staging in slots (group g uses slot g % n_slots): send = this rank's pieces
   * by destination; recv = the pieces of the matrices it owns, by source */
  float *send, *recv;
  int n_slots;
  int64_t slot_send, slot_recv;           /* elements per slot */
  struct rf_comm_req *fwd_req, *back_req; /* n_slots each (overlap) */
  float *full;                            /* the largest owned matrix, then its Newton-Schulz workspace */
  int64_t *cursor;                        /* world entries */
  struct rf_optim_stats stats;
};

void rf_optim_options_default(struct rf_optim_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->kind = RF_OPTIM_KIND_ADAMW;
  opt->beta1 = 0.9f;
  opt->beta2 = 0.95f;
  opt->eps = 1e-8f;
  opt->weight_decay = 0.1f;
  opt->muon_momentum = 0.95f;
  opt->muon_nesterov = 1;
  opt->muon_ns_steps = 5;
  opt->muon_ns_eps = 1e-7f;
  opt->muon_scale = RF_OPTIM_MUON_SCALE_MATCH_RMS_ADAMW;
  opt->muon_overlap = 1;
}

static const char *const rf_optim_kind_names[] = {"adamw", "adamw8bit", "muon"};

int rf_optim_kind_parse(const char *name, enum rf_optim_kind *out) {
  for (int i = 0; i < 3; i++)
    if (strcmp(name, rf_optim_kind_names[i]) == 0) {
      *out = (enum rf_optim_kind)i;
      return 0;
    }
  RF_FAIL("unknown optimizer '%s' (adamw, adamw8bit, muon)", name);
}

const char *rf_optim_kind_name(enum rf_optim_kind kind) {
  return (unsigned)kind < 3 ? rf_optim_kind_names[kind] : "?";
}

void rf_optim_layout_needs(enum rf_optim_kind kind, struct rf_optim_layout_needs *out) {
  int eight = kind == RF_OPTIM_KIND_ADAMW8BIT;
  out->block_rows = eight ? RF_OPTIM_TILE : 1;
  out->vector_block = eight ? RF_OPTIM_VEC_BLOCK : 1;
}

/* ---- 8-bit blocks ------------------------------------------------------------ */

/* A block intersected with the piece [b, e): up to 32 runs of local offsets. */
struct rf_optim_runs {
  int n;
  int64_t lo[RF_OPTIM_TILE], hi[RF_OPTIM_TILE];
  int64_t elems;
};

static int64_t rf_optim_tiles_per_strip(const struct rf_optim_view *w) {
  return rf_ceil_div(w->cols, RF_OPTIM_TILE);
}

/* The runs of block `blk` (global numbering) inside this rank's piece. */
static void rf_optim_block_runs(const struct rf_optim_view *w, int64_t blk, struct rf_optim_runs *r) {
  int64_t b = w->v.begin, e = w->v.end;
  r->n = 0;
  r->elems = 0;
  if (w->cols == 0) {
    int64_t lo = rf_max_i64(b, blk * RF_OPTIM_VEC_BLOCK), hi = rf_min_i64(e, (blk + 1) * RF_OPTIM_VEC_BLOCK);
    if (hi > lo) {
      r->lo[0] = lo - b;
      r->hi[0] = hi - b;
      r->n = 1;
      r->elems = hi - lo;
    }
    return;
  }
  int64_t tps = rf_optim_tiles_per_strip(w), s = blk / tps, j = blk % tps, c = w->cols;
  int64_t c0 = j * RF_OPTIM_TILE, c1 = rf_min_i64(c, c0 + RF_OPTIM_TILE);
  int64_t r0 = rf_max_i64(s * RF_OPTIM_TILE, b / c),
          r1 = rf_min_i64(rf_min_i64((s + 1) * RF_OPTIM_TILE, w->rows), rf_ceil_div(e, c));
  for (int64_t row = r0; row < r1; row++) {
    int64_t lo = rf_max_i64(b, row * c + c0), hi = rf_min_i64(e, row * c + c1);
    if (hi <= lo) continue;
    r->lo[r->n] = lo - b;
    r->hi[r->n] = hi - b;
    r->n++;
    r->elems += hi - lo;
  }
}

/* The global block range [*first, *last) that the piece may touch. */
static void rf_optim_block_span(const struct rf_optim_view *w, int64_t *first, int64_t *last) {
  int64_t b = w->v.begin, e = w->v.end;
  *first = *last = 0;
  if (e <= b) return;
  if (w->cols == 0) {
    *first = b / RF_OPTIM_VEC_BLOCK;
    *last = rf_ceil_div(e, RF_OPTIM_VEC_BLOCK);
    return;
  }
  int64_t tps = rf_optim_tiles_per_strip(w);
  *first = (b / w->cols) / RF_OPTIM_TILE * tps;
  *last = ((e - 1) / w->cols / RF_OPTIM_TILE + 1) * tps;
}

static int64_t rf_optim_block_full_elems(const struct rf_optim_view *w, int64_t blk) {
  if (w->cols == 0) return rf_min_i64(RF_OPTIM_VEC_BLOCK, w->v.numel - blk * RF_OPTIM_VEC_BLOCK);
  int64_t tps = rf_optim_tiles_per_strip(w), s = blk / tps, j = blk % tps;
  int64_t nr = rf_min_i64(RF_OPTIM_TILE, w->rows - s * RF_OPTIM_TILE);
  int64_t nc = rf_min_i64(RF_OPTIM_TILE, w->cols - j * RF_OPTIM_TILE);
  return nr * nc;
}

/* Where the layout keeps the optimizer's blocks whole (the view's block_elems is
 * a multiple of a 32-row strip or of a run of 256, or covers the tensor), the
 * piece must not cut one; elsewhere (flat, fsdp2 layouts) `cut` blocks are
 * quantized per fragment and counted. */
static int rf_optim_check_whole(struct rf_optim *o, const struct rf_optim_view *w, int64_t cut) {
  int64_t blk = w->cols ? RF_OPTIM_TILE * w->cols : RF_OPTIM_VEC_BLOCK;
  int whole = w->v.block_elems >= w->v.numel || w->v.block_elems % blk == 0;
  RF_REQUIRE(
      !whole || cut == 0,
      "optim: %s: the layout keeps blocks of %lld elements whole, but the piece [%lld, %lld) cuts %lld "
      "8-bit blocks",
      w->v.name ? w->v.name : "?", (long long)w->v.block_elems, (long long)w->v.begin, (long long)w->v.end,
      (long long)cut);
  o->stats.tiles_cut += cut;
  return 0;
}

/* ---- create / free ---------------------------------------------------------- */

static int rf_optim_check_view(const struct rf_optim *o, const struct rf_tensor_view *v, int i) {
  const char *nm = v->name ? v->name : "?";
  RF_REQUIRE(v->ndim >= 0 && v->ndim <= 8, "optim: view %d (%s): ndim %d", i, nm, v->ndim);
  int64_t numel = 1;
  for (int d = 0; d < v->ndim; d++) {
    RF_REQUIRE(v->shape[d] > 0, "optim: view %d (%s): dimension %d is %lld", i, nm, d,
               (long long)v->shape[d]);
    numel *= v->shape[d];
  }
  RF_REQUIRE(numel == v->numel, "optim: view %d (%s): numel %lld but the shape has %lld", i, nm,
             (long long)v->numel, (long long)numel);
  RF_REQUIRE(v->begin >= 0 && v->begin <= v->end && v->end <= v->numel,
             "optim: view %d (%s): range [%lld, %lld) outside the tensor of %lld", i, nm, (long long)v->begin,
             (long long)v->end, (long long)v->numel);
  int64_t len = v->end - v->begin;
  RF_REQUIRE(len == 0 || (v->shard_offset >= 0 && v->shard_offset + len <= o->shard_elems),
             "optim: view %d (%s): piece [%lld, +%lld) outside the shard of %lld elements", i, nm,
             (long long)v->shard_offset, (long long)len, (long long)o->shard_elems);
  RF_REQUIRE(len == 0 || (v->master && v->grad), "optim: view %d (%s): no master or grad pointer", i, nm);
  return 0;
}

static int rf_optim_check_muon_view(const struct rf_optim *o, const struct rf_tensor_view *v, int i) {
  const char *nm = v->name ? v->name : "?";
  RF_REQUIRE(v->ndim == 2, "optim: Muon view %d (%s) is %d-D; Muon takes 2-D matrices", i, nm, v->ndim);
  RF_REQUIRE(v->starts, "optim: Muon view %d (%s) has no starts", i, nm);
  RF_REQUIRE(v->starts[0] == 0 && v->starts[o->world] == v->numel,
             "optim: Muon view %d (%s): starts do not cover the tensor", i, nm);
  for (int r = 0; r < o->world; r++)
    RF_REQUIRE(v->starts[r] <= v->starts[r + 1], "optim: Muon view %d (%s): starts decrease at rank %d", i,
               nm, r);
  RF_REQUIRE(v->starts[o->rank] == v->begin && v->starts[o->rank + 1] == v->end,
             "optim: Muon view %d (%s): starts disagree with the local range", i, nm);
  RF_REQUIRE(v->shape[0] <= INT32_MAX && v->shape[1] <= INT32_MAX, "optim: Muon view %d (%s) too large", i,
             nm);
  return 0;
}

/* Owners: matrices by decreasing Newton-Schulz cost (ties: view order); each goes
 * to the rank holding most of it among those whose load is within half the
 * matrix's cost of the least loaded rank (ties: lower load, lower rank). Max load
 * <= mean load + 1.5 * the largest cost. Identical on every rank. */
static void rf_optim_assign_owners(struct rf_optim *o, const int *muon, int nm) {
  int *order = rf_xmalloc((size_t)(nm > 0 ? nm : 1) * sizeof(int));
  double *load = rf_xcalloc((size_t)o->world, sizeof(double));
  for (int k = 0; k < nm; k++) order[k] = muon[k];
  for (int k = 1; k < nm; k++) { /* insertion sort: stable, deterministic */
    int x = order[k], j = k;
    while (j > 0 && o->views[order[j - 1]].ns_flops < o->views[x].ns_flops) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = x;
  }
  for (int k = 0; k < nm; k++) {
    struct rf_optim_view *w = &o->views[order[k]];
    double lmin = load[0];
    for (int r = 1; r < o->world; r++) lmin = fmin(lmin, load[r]);
    int best = -1;
    int64_t best_held = -1;
    for (int r = 0; r < o->world; r++) {
      if (load[r] > lmin + 0.5 * w->ns_flops) continue;
      int64_t held = w->v.starts[r + 1] - w->v.starts[r];
      if (held > best_held || (held == best_held && load[r] < load[best])) {
        best = r;
        best_held = held;
      }
    }
    w->owner = best;
    load[best] += w->ns_flops;
  }
  o->stats.muon_owned_flops = load[o->rank];
  free(order);
  free(load);
}

static void rf_optim_muon_plan(struct rf_optim *o) {
  int world = o->world, me = o->rank;
  int *muon = rf_xmalloc((size_t)(o->n > 0 ? o->n : 1) * sizeof(int));
  int nm = 0;
  for (int i = 0; i < o->n; i++) {
    struct rf_optim_view *w = &o->views[i];
    w->owner = -1;
    w->group = -1;
    if (!(w->flags & RF_OPTIM_FLAG_MATRIX)) continue;
    int64_t a = w->v.shape[0], b = w->v.shape[1];
    w->ns_flops = rf_optim_ns_flops(a, b, o->opt.muon_ns_steps);
    w->lr_adjust = o->opt.muon_scale == RF_OPTIM_MUON_SCALE_MATCH_RMS_ADAMW
                       ? (float)(0.2 * sqrt((double)rf_max_i64(a, b)))
                       : (float)sqrt(fmax(1.0, (double)a / (double)b));
    muon[nm++] = i;
  }
  rf_optim_assign_owners(o, muon, nm);
  /* groups: one per unit, in order of first appearance */
  o->groups = rf_xcalloc((size_t)(nm > 0 ? nm : 1), sizeof(struct rf_optim_group));
  for (int k = 0; k < nm; k++) {
    struct rf_optim_view *w = &o->views[muon[k]];
    int g = 0;
    while (g < o->n_groups && o->groups[g].unit != w->v.unit) g++;
    if (g == o->n_groups) {
      o->groups[g].unit = w->v.unit;
      o->groups[g].members = rf_xmalloc((size_t)nm * sizeof(int));
      o->n_groups++;
    }
    w->group = g;
    o->groups[g].members[o->groups[g].n_members++] = muon[k];
  }
  /* staging layouts: send = per group, per destination rank, pieces in view order;
   * recv = per group, per source rank, the owned matrices' pieces in view order */
  int64_t max_full = 0;
  for (int g = 0; g < o->n_groups; g++) {
    struct rf_optim_group *gr = &o->groups[g];
    int64_t send_pos = 0, recv_pos = 0;
    gr->send_counts = rf_xcalloc((size_t)world * 4, sizeof(int64_t));
    gr->send_displs = gr->send_counts + world;
    gr->recv_counts = gr->send_displs + world;
    gr->recv_displs = gr->recv_counts + world;
    for (int r = 0; r < world; r++) {
      gr->send_displs[r] = send_pos;
      for (int k = 0; k < gr->n_members; k++) {
        struct rf_optim_view *w = &o->views[gr->members[k]];
        if (w->owner != r) continue;
        w->send_off = send_pos;
        send_pos += w->v.end - w->v.begin;
      }
      gr->send_counts[r] = send_pos - gr->send_displs[r];
    }
    for (int s = 0; s < world; s++) {
      gr->recv_displs[s] = recv_pos;
      for (int k = 0; k < gr->n_members; k++) {
        struct rf_optim_view *w = &o->views[gr->members[k]];
        if (w->owner != me) continue;
        recv_pos += w->v.starts[s + 1] - w->v.starts[s];
      }
      gr->recv_counts[s] = recv_pos - gr->recv_displs[s];
    }
    gr->send_total = send_pos;
    gr->recv_total = recv_pos;
    o->slot_send = rf_max_i64(o->slot_send, send_pos);
    o->slot_recv = rf_max_i64(o->slot_recv, recv_pos);
    for (int k = 0; k < gr->n_members; k++) {
      struct rf_optim_view *w = &o->views[gr->members[k]];
      if (w->owner == me)
        max_full = rf_max_i64(max_full, w->v.numel + 2 * w->v.numel +
                                            2 * rf_min_i64(w->v.shape[0], w->v.shape[1]) *
                                                rf_min_i64(w->v.shape[0], w->v.shape[1]));
    }
  }
  for (int g = 0; g < o->n_groups; g++)
    for (int r = 0; r < world; r++) {
      if (r == me) continue;
      o->stats.muon_step_bytes_sent +=
          (uint64_t)(o->groups[g].send_counts[r] + o->groups[g].recv_counts[r]) * 4;
      o->stats.muon_step_bytes_recv +=
          (uint64_t)(o->groups[g].recv_counts[r] + o->groups[g].send_counts[r]) * 4;
    }
  /* three slots let one unit's updates travel back and the next unit's momentum
   * travel out while a third is orthogonalized */
  o->n_slots = o->opt.muon_overlap ? (int)rf_min_i64(3, rf_max_i64(o->n_groups, 1)) : 1;
  int64_t send_elems = o->n_slots * o->slot_send, recv_elems = o->n_slots * o->slot_recv;
  o->send = rf_xaligned(64, (size_t)rf_max_i64(send_elems, 1) * sizeof(float));
  o->recv = rf_xaligned(64, (size_t)rf_max_i64(recv_elems, 1) * sizeof(float));
  o->full = rf_xaligned(64, (size_t)rf_max_i64(max_full, 1) * sizeof(float));
  o->cursor = rf_xcalloc((size_t)world, sizeof(int64_t));
  o->fwd_req = rf_xcalloc((size_t)o->n_slots, sizeof(struct rf_comm_req));
  o->back_req = rf_xcalloc((size_t)o->n_slots, sizeof(struct rf_comm_req));
  for (int k = 0; k < o->n_slots; k++) {
    rf_comm_req_init(&o->fwd_req[k], world);
    rf_comm_req_init(&o->back_req[k], world);
  }
  o->stats.workspace_bytes += (send_elems + recv_elems + max_full) * (int64_t)sizeof(float);
  free(muon);
}

int rf_optim_create(struct rf_optim **out, const struct rf_optim_options *opt,
                    const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                    const struct rf_comm *comm) {
  *out = NULL;
  RF_REQUIRE(n >= 0 && shard_elems >= 0, "optim: %d views, shard of %lld elements", n,
             (long long)shard_elems);
  RF_REQUIRE((unsigned)opt->kind < 3, "optim: unknown kind %d", (int)opt->kind);
  RF_REQUIRE(flags || n == 0, "optim: no groups (flags) given for the %d views", n);
  RF_REQUIRE(opt->kind != RF_OPTIM_KIND_MUON || comm, "optim: Muon needs a communicator");
  RF_REQUIRE(opt->muon_ns_steps >= 0 && opt->muon_ns_steps < 100, "optim: %d Newton-Schulz steps",
             opt->muon_ns_steps);
  struct rf_optim *o = rf_xcalloc(1, sizeof *o);
  o->opt = *opt;
  o->comm = comm;
  o->rank = comm ? comm->rank : 0;
  o->world = comm ? comm->world : 1;
  o->n = n;
  o->shard_elems = shard_elems;
  o->views = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof(struct rf_optim_view));
  for (int i = 0; i < n; i++) {
    struct rf_optim_view *w = &o->views[i];
    w->v = views[i];
    w->flags = flags[i];
    if (opt->kind != RF_OPTIM_KIND_MUON) w->flags &= ~RF_OPTIM_FLAG_MATRIX;
    if (rf_optim_check_view(o, &views[i], i) != 0 ||
        ((w->flags & RF_OPTIM_FLAG_MATRIX) && rf_optim_check_muon_view(o, &views[i], i) != 0)) {
      rf_optim_free(o);
      return -1;
    }
    w->cols = views[i].ndim >= 2 ? views[i].shape[views[i].ndim - 1] : 0;
    w->rows = w->cols ? views[i].numel / w->cols : 0;
  }
  size_t slab = (size_t)rf_max_i64(shard_elems, 1);
  if (opt->kind == RF_OPTIM_KIND_ADAMW8BIT) {
    rf_optim_qmap(1);
    o->zero_code_m = rf_optim_quantize(1, 0.0f);
    RF_ASSERT(rf_optim_qmap(1)[o->zero_code_m] == 0.0f && rf_optim_qmap(0)[0] == 0.0f);
    o->mq = rf_xaligned(64, slab);
    o->vq = rf_xaligned(64, slab);
    memset(o->mq, o->zero_code_m, slab);
    memset(o->vq, 0, slab);
    for (int i = 0; i < n; i++) {
      struct rf_optim_view *w = &o->views[i];
      int64_t first, last, cut = 0;
      rf_optim_block_span(w, &first, &last);
      w->scale_off = o->n_scales;
      w->first_block = -1;
      for (int64_t blk = first; blk < last; blk++) {
        struct rf_optim_runs runs;
        rf_optim_block_runs(w, blk, &runs);
        if (runs.elems == 0) continue;
        if (w->first_block < 0) w->first_block = blk;
        w->n_blocks++;
        if (runs.elems != rf_optim_block_full_elems(w, blk)) cut++;
      }
      if (w->first_block < 0) w->first_block = 0;
      o->n_scales += w->n_blocks;
      if (rf_optim_check_whole(o, w, cut) != 0) {
        rf_optim_free(o);
        return -1;
      }
    }
    o->ms = rf_xcalloc((size_t)rf_max_i64(o->n_scales, 1), sizeof(float));
    o->vs = rf_xcalloc((size_t)rf_max_i64(o->n_scales, 1), sizeof(float));
    o->blk_m = rf_xaligned(64, RF_OPTIM_BLOCK_MAX * sizeof(float));
    o->blk_v = rf_xaligned(64, RF_OPTIM_BLOCK_MAX * sizeof(float));
    o->stats.state_bytes = 2 * shard_elems + 2 * o->n_scales * (int64_t)sizeof(float);
    o->stats.workspace_bytes = 2 * RF_OPTIM_BLOCK_MAX * (int64_t)sizeof(float);
  } else {
    o->m = rf_xcalloc(slab, sizeof(float));
    o->v = rf_xcalloc(slab, sizeof(float));
    o->stats.state_bytes = 2 * shard_elems * (int64_t)sizeof(float);
  }
  for (int i = 0; i < n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    int64_t len = w->v.end - w->v.begin;
    o->stats.state_bytes_used += opt->kind == RF_OPTIM_KIND_ADAMW8BIT ? 2 * len + 8 * w->n_blocks
                                 : (w->flags & RF_OPTIM_FLAG_MATRIX)  ? 4 * len
                                                                      : 8 * len;
  }
  if (opt->kind == RF_OPTIM_KIND_MUON) rf_optim_muon_plan(o);
  *out = o;
  return 0;
}

void rf_optim_free(struct rf_optim *o) {
  if (!o) return;
  for (int g = 0; g < o->n_groups; g++) {
    free(o->groups[g].members);
    free(o->groups[g].send_counts);
  }
  free(o->groups);
  free(o->views);
  free(o->m);
  free(o->v);
  free(o->mq);
  free(o->vq);
  free(o->ms);
  free(o->vs);
  free(o->blk_m);
  free(o->blk_v);
  free(o->send);
  free(o->recv);
  for (int k = 0; k < o->n_slots; k++) {
    rf_comm_req_free(&o->fwd_req[k]);
    rf_comm_req_free(&o->back_req[k]);
  }
  free(o->fwd_req);
  free(o->back_req);
  free(o->full);
  free(o->cursor);
  free(o);
}

/* ---- AdamW ------------------------------------------------------------------ */

struct rf_optim_hyper {
  float lr, b1, b2, eps;
  float step_size; /* lr / (1 - b1^t) */
  float bc2_sqrt;  /* sqrt(1 - b2^t) */
  float decay;     /* 1 - lr * wd */
  float one_m_b1, one_m_b2;
};

static void rf_optim_hyper_init(const struct rf_optim *o, float lr, struct rf_optim_hyper *h) {
  double t = (double)o->step;
  h->lr = lr;
  h->b1 = o->opt.beta1;
  h->b2 = o->opt.beta2;
  h->eps = o->opt.eps;
  h->one_m_b1 = 1.0f - o->opt.beta1;
  h->one_m_b2 = 1.0f - o->opt.beta2;
  h->step_size = (float)((double)lr / (1.0 - pow((double)o->opt.beta1, t)));
  h->bc2_sqrt = (float)sqrt(1.0 - pow((double)o->opt.beta2, t));
  h->decay = 1.0f - lr * o->opt.weight_decay;
}

/* torch.optim.AdamW's arithmetic: m.lerp_(g, 1 - b1); v = b2 v + (1 - b2) g^2;
 * p = p (1 - lr wd) - step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps). */
static void rf_optim_adamw_piece(const struct rf_optim_hyper *h, int decay, float *restrict p,
                                 const float *restrict g, float *restrict m, float *restrict v, int64_t len) {
  float dec = decay ? h->decay : 1.0f;
  /* element-wise: the same bits with any number of threads */
#pragma omp parallel for schedule(static) if (len > 65536)
  for (int64_t i = 0; i < len; i++) {
    float gi = g[i];
    float mi = m[i] + h->one_m_b1 * (gi - m[i]);
    float vi = h->b2 * v[i] + h->one_m_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * dec - h->step_size * (mi / (sqrtf(vi) / h->bc2_sqrt + h->eps));
  }
}

/* One 8-bit block: decode, update in f32 (the parameter uses the f32 moments, as
 * bitsandbytes does), re-encode with the new absmax. */
static void rf_optim_adamw8_block(struct rf_optim *o, const struct rf_optim_hyper *h, struct rf_optim_view *w,
                                  const struct rf_optim_runs *runs, int64_t k) {
  const float *qs = rf_optim_qmap(1), *qu = rf_optim_qmap(0);
  float *p = w->v.master;
  const float *g = w->v.grad;
  uint8_t *mq = o->mq + w->v.shard_offset, *vq = o->vq + w->v.shard_offset;
  float ms = o->ms[k], vs = o->vs[k], am = 0.0f, av = 0.0f;
  float dec = (w->flags & RF_OPTIM_FLAG_DECAY) ? h->decay : 1.0f;
  float *bm = o->blk_m, *bv = o->blk_v;
  int64_t t = 0;
  for (int r = 0; r < runs->n; r++)
    for (int64_t i = runs->lo[r]; i < runs->hi[r]; i++, t++) {
      float gi = g[i];
      float mi = qs[mq[i]] * ms, vi = qu[vq[i]] * vs;
      mi = mi + h->one_m_b1 * (gi - mi);
      vi = h->b2 * vi + h->one_m_b2 * (gi * gi);
      bm[t] = mi;
      bv[t] = vi;
      am = fmaxf(am, fabsf(mi));
      av = fmaxf(av, vi);
      p[i] = p[i] * dec - h->step_size * (mi / (sqrtf(vi) / h->bc2_sqrt + h->eps));
    }
  float im = am > 0.0f ? 1.0f / am : 0.0f, iv = av > 0.0f ? 1.0f / av : 0.0f;
  t = 0;
  for (int r = 0; r < runs->n; r++)
    for (int64_t i = runs->lo[r]; i < runs->hi[r]; i++, t++) {
      mq[i] = rf_optim_quantize(1, bm[t] * im);
      uint8_t cv = rf_optim_quantize(0, bv[t] * iv);
      vq[i] = cv == 0 && bv[t] > 0.0f ? 1 : cv; /* a positive v never decodes to 0 (no m / eps blow-up) */
    }
  o->ms[k] = am;
  o->vs[k] = av;
}

static void rf_optim_adamw8_view(struct rf_optim *o, const struct rf_optim_hyper *h,
                                 struct rf_optim_view *w) {
  int64_t first, last, k = w->scale_off;
  rf_optim_block_span(w, &first, &last);
  for (int64_t blk = first; blk < last; blk++) {
    struct rf_optim_runs runs;
    rf_optim_block_runs(w, blk, &runs);
    if (runs.elems == 0) continue;
    RF_ASSERT(runs.elems <= RF_OPTIM_BLOCK_MAX);
    rf_optim_adamw8_block(o, h, w, &runs, k++);
  }
  RF_ASSERT(k == w->scale_off + w->n_blocks);
}

/* ---- Muon ---------------------------------------------------------------------- */

static float *rf_optim_slot_send(const struct rf_optim *o, int g) {
  return o->send + (g % o->n_slots) * o->slot_send;
}
static float *rf_optim_slot_recv(const struct rf_optim *o, int g) {
  return o->recv + (g % o->n_slots) * o->slot_recv;
}

/* Momentum (torch.optim.Muon: buf.lerp_(g, 1 - mu); update = g.lerp(buf, mu) with
 * Nesterov, else buf) of the group's pieces into its send slot. */
static void rf_optim_muon_momentum(struct rf_optim *o, int g) {
  const struct rf_optim_group *gr = &o->groups[g];
  float mu = o->opt.muon_momentum, omu = 1.0f - mu;
  for (int k = 0; k < gr->n_members; k++) {
    struct rf_optim_view *w = &o->views[gr->members[k]];
    int64_t len = w->v.end - w->v.begin;
    const float *gr_ = w->v.grad;
    float *buf = o->m + w->v.shard_offset, *u = rf_optim_slot_send(o, g) + w->send_off;
    for (int64_t i = 0; i < len; i++) {
      float b = buf[i] + omu * (gr_[i] - buf[i]);
      buf[i] = b;
      u[i] = o->opt.muon_nesterov ? b - (b - gr_[i]) * omu : b;
    }
  }
}

/* The group's all-to-all-v: out (pieces to owners) or back (updates to holders);
 * blocking, or started on the slot's request. */
static void rf_optim_muon_transfer(struct rf_optim *o, int g, int back, int start) {
  const struct rf_optim_group *gr = &o->groups[g];
  uint64_t out = 0, in = 0;
  for (int r = 0; r < o->world; r++) {
    if (r == o->rank) continue;
    out += (uint64_t)(back ? gr->recv_counts[r] : gr->send_counts[r]);
    in += (uint64_t)(back ? gr->send_counts[r] : gr->recv_counts[r]);
  }
  o->stats.muon_bytes_sent += out * sizeof(float);
  o->stats.muon_bytes_recv += in * sizeof(float);
  float *snd = rf_optim_slot_send(o, g), *rcv = rf_optim_slot_recv(o, g);
  const int64_t *sc = back ? gr->recv_counts : gr->send_counts,
                *sd = back ? gr->recv_displs : gr->send_displs;
  const int64_t *rc = back ? gr->send_counts : gr->recv_counts,
                *rd = back ? gr->send_displs : gr->recv_displs;
  const float *from = back ? rcv : snd;
  float *to = back ? snd : rcv;
  if (start) {
    struct rf_comm_req *req = back ? &o->back_req[g % o->n_slots] : &o->fwd_req[g % o->n_slots];
    rf_comm_ialltoallv(o->comm, from, sc, sd, to, rc, rd, RF_DTYPE_F32, req);
  } else {
    uint64_t t0 = rf_time_ns();
    rf_comm_alltoallv(o->comm, from, sc, sd, to, rc, rd, RF_DTYPE_F32);
    o->stats.muon_comm_wait_ns += rf_time_ns() - t0;
  }
}

static void rf_optim_muon_wait(struct rf_optim *o, struct rf_comm_req *req) {
  uint64_t t0 = rf_time_ns();
  rf_comm_wait(req);
  o->stats.muon_comm_wait_ns += rf_time_ns() - t0;
}

/* Between gemms: lets MPI progress the transfers in flight. */
static void rf_optim_muon_poll(void *arg) {
  struct rf_optim *o = arg;
  for (int k = 0; k < o->n_slots; k++) {
    rf_comm_test(&o->fwd_req[k]);
    rf_comm_test(&o->back_req[k]);
  }
}

/* The owner assembles each of its matrices of the group from the receive slot,
 * orthogonalizes it, and writes the pieces back in place. */
static void rf_optim_muon_orthogonalize(struct rf_optim *o, int g) {
  const struct rf_optim_group *gr = &o->groups[g];
  float *rcv = rf_optim_slot_recv(o, g);
  int world = o->world;
  for (int s = 0; s < world; s++) o->cursor[s] = gr->recv_displs[s];
  for (int k = 0; k < gr->n_members; k++) {
    struct rf_optim_view *w = &o->views[gr->members[k]];
    if (w->owner != o->rank) continue;
    const int64_t *st = w->v.starts;
    for (int s = 0; s < world; s++)
      memcpy(o->full + st[s], rcv + o->cursor[s], (size_t)(st[s + 1] - st[s]) * sizeof(float));
    uint64_t t0 = rf_time_ns();
    o->stats.muon_ns_flops += rf_optim_newton_schulz(
        o->full, w->v.shape[0], w->v.shape[1], o->opt.muon_ns_steps, o->opt.muon_ns_eps, o->full + w->v.numel,
        o->n_slots > 1 ? rf_optim_muon_poll : NULL, o);
    o->stats.muon_ns_time_ns += rf_time_ns() - t0;
    o->stats.muon_matrices++;
    w->ns_count++;
    for (int s = 0; s < world; s++) {
      memcpy(rcv + o->cursor[s], o->full + st[s], (size_t)(st[s + 1] - st[s]) * sizeof(float));
      o->cursor[s] += st[s + 1] - st[s];
    }
  }
}

static void rf_optim_muon_apply(struct rf_optim *o, int g, float lr) {
  const struct rf_optim_group *gr = &o->groups[g];
  for (int k = 0; k < gr->n_members; k++) {
    struct rf_optim_view *w = &o->views[gr->members[k]];
    int64_t len = w->v.end - w->v.begin;
    float *p = w->v.master;
    const float *u = rf_optim_slot_send(o, g) + w->send_off;
    float dec = (w->flags & RF_OPTIM_FLAG_DECAY) ? 1.0f - lr * o->opt.weight_decay : 1.0f;
    float alr = lr * w->lr_adjust;
    for (int64_t i = 0; i < len; i++) p[i] = p[i] * dec - alr * u[i];
  }
}

/* Blocking: per unit, out, orthogonalize, back, apply. Overlapped (3 slots):
 * unit g+1's pieces travel out and unit g-1's updates travel back while unit g
 * is orthogonalized; every rank starts the collectives in the same order. */
static void rf_optim_muon_step(struct rf_optim *o, float lr) {
  int G = o->n_groups, S = o->n_slots;
  if (S == 1) {
    for (int g = 0; g < G; g++) {
      rf_optim_muon_momentum(o, g);
      rf_optim_muon_transfer(o, g, 0, 0);
      rf_optim_muon_orthogonalize(o, g);
      rf_optim_muon_transfer(o, g, 1, 0);
      rf_optim_muon_apply(o, g, lr);
    }
    return;
  }
  int applied = 0;
  rf_optim_muon_momentum(o, 0);
  rf_optim_muon_transfer(o, 0, 0, 1);
  for (int g = 0; g < G; g++) {
    if (g + 1 < G) {
      if (g + 1 - S >= 0) { /* the slot of unit g+1 is unit g+1-S's */
        rf_optim_muon_wait(o, &o->back_req[(g + 1) % S]);
        rf_optim_muon_apply(o, applied++, lr);
      }
      rf_optim_muon_momentum(o, g + 1);
      rf_optim_muon_transfer(o, g + 1, 0, 1);
    }
    rf_optim_muon_wait(o, &o->fwd_req[g % S]);
    rf_optim_muon_orthogonalize(o, g);
    rf_optim_muon_transfer(o, g, 1, 1);
  }
  for (; applied < G; applied++) {
    rf_optim_muon_wait(o, &o->back_req[applied % S]);
    rf_optim_muon_apply(o, applied, lr);
  }
}

/* ---- step -------------------------------------------------------------------- */

void rf_optim_step(struct rf_optim *o, float lr) {
  o->step++;
  o->stats.steps++;
  struct rf_optim_hyper h;
  rf_optim_hyper_init(o, lr, &h);
  for (int i = 0; i < o->n; i++) {
    struct rf_optim_view *w = &o->views[i];
    if (w->flags & RF_OPTIM_FLAG_MATRIX) continue;
    int64_t len = w->v.end - w->v.begin;
    if (len == 0) continue;
    if (o->opt.kind == RF_OPTIM_KIND_ADAMW8BIT)
      rf_optim_adamw8_view(o, &h, w);
    else
      rf_optim_adamw_piece(&h, w->flags & RF_OPTIM_FLAG_DECAY, w->v.master, w->v.grad,
                           o->m + w->v.shard_offset, o->v + w->v.shard_offset, len);
  }
  if (o->opt.kind == RF_OPTIM_KIND_MUON) rf_optim_muon_step(o, lr);
}

int64_t rf_optim_get_step(const struct rf_optim *o) { return o->step; }
void rf_optim_set_step(struct rf_optim *o, int64_t step) { o->step = step; }

/* ---- state and stats ---------------------------------------------------------- */

int rf_optim_n_states(const struct rf_optim *o) { return o->opt.kind == RF_OPTIM_KIND_ADAMW8BIT ? 4 : 2; }

void rf_optim_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  RF_ASSERT(i >= 0 && i < rf_optim_n_states(o));
  memset(out, 0, sizeof *out);
  if (o->opt.kind != RF_OPTIM_KIND_ADAMW8BIT) {
    out->name = i == 0 ? "m" : "v";
    out->data = i == 0 ? o->m : o->v;
    out->dtype = RF_DTYPE_F32;
    out->count = o->shard_elems;
    out->shard_layout = 1;
    return;
  }
  static const char *const names[4] = {"m_code", "v_code", "m_scale", "v_scale"};
  out->name = names[i];
  out->data = i == 0 ? (void *)o->mq : i == 1 ? (void *)o->vq : i == 2 ? (void *)o->ms : (void *)o->vs;
  out->dtype = i < 2 ? RF_DTYPE_U8 : RF_DTYPE_F32;
  out->count = i < 2 ? o->shard_elems : o->n_scales;
  out->shard_layout = i < 2;
}

void rf_optim_scales(const struct rf_optim *o, int view, int64_t *offset, int64_t *count, int64_t *first) {
  RF_ASSERT(view >= 0 && view < o->n);
  const struct rf_optim_view *w = &o->views[view];
  *offset = w->scale_off;
  *count = w->n_blocks;
  *first = w->first_block;
}

int64_t rf_optim_tensor_blocks(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  const struct rf_optim_view *w = &o->views[view];
  if (w->cols == 0) return rf_ceil_div(w->v.numel, RF_OPTIM_VEC_BLOCK);
  return rf_ceil_div(w->rows, RF_OPTIM_TILE) * rf_optim_tiles_per_strip(w);
}

void rf_optim_get_stats(const struct rf_optim *o, struct rf_optim_stats *out) { *out = o->stats; }

int rf_optim_muon_owner(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  return (o->views[view].flags & RF_OPTIM_FLAG_MATRIX) ? o->views[view].owner : -1;
}

int64_t rf_optim_muon_count(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  return o->views[view].ns_count;
}
