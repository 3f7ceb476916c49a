/* The planning policy: a run's options turned into the planner's, and a unit
 * laid out under any of the three layouts the runtime runs (planned, flat,
 * fsdp2). The runtime's DBuffer and `rfsdp plan` both lay units out here, so the
 * numbers the command prints are those of the layout a run executes. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

/* An extra buffer is one more collective per gather and per reduce: it must save
 * at least this much padding (a collective's fixed cost is of the order of moving
 * 64 Ki elements) and at least this share of the unit (so a huge unit is not cut
 * into several collectives to save a negligible fraction). */
#define RF_PLAN_BUFFER_COST_MIN_ELEMS 65536.0
#define RF_PLAN_BUFFER_COST_RATIO 1e-3

int64_t rf_plan_block_elems(const struct rf_plan_policy *p, int ndim, const int64_t *shape,
                            int64_t own_rows) {
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) numel *= shape[d];
  if (ndim == 1) return rf_min_i64(p->vector_block, numel);
  int64_t row = shape[ndim - 1], rows = numel / row;
  return rf_min_i64(own_rows > 0 ? own_rows : p->block_rows, rows) * row;
}

int64_t rf_plan_policy_align_elems(const struct rf_plan_policy *p) {
  int64_t size = rf_min_i64((int64_t)rf_dtype_size(p->param_dtype), (int64_t)rf_dtype_size(p->reduce_dtype));
  return rf_max_i64(p->align_bytes / size, 1);
}

void rf_plan_policy_options(const struct rf_plan_policy *p, int world, int64_t unit_elems,
                            struct rf_plan_options *out) {
  double share = RF_PLAN_BUFFER_COST_RATIO * (double)unit_elems;
  *out = (struct rf_plan_options){
      .world = world,
      .mode = p->shard,
      .align_elems = rf_plan_policy_align_elems(p),
      .max_buffers = p->max_buffers,
      .buffer_cost_elems = share > RF_PLAN_BUFFER_COST_MIN_ELEMS ? share : RF_PLAN_BUFFER_COST_MIN_ELEMS,
      .allow_sub_padding = p->whole_runs ? 2 : 1};
}

/* One buffer of `shard` elements per rank. */
static struct rf_plan_buffer *rf_plan_layout_one_buffer(struct rf_plan_layout *l, int world, int64_t shard,
                                                        int n_places) {
  struct rf_plan_unit *u = &l->plan;
  u->n_buffers = 1;
  u->buffers = rf_xcalloc(1, sizeof *u->buffers);
  struct rf_plan_buffer *b = &u->buffers[0];
  b->starts = rf_xmalloc((size_t)(world + 1) * sizeof *b->starts);
  for (int r = 0; r <= world; r++) b->starts[r] = r * shard;
  b->shard_elems = shard;
  b->total_elems = world * shard;
  b->n_places = n_places;
  b->places = n_places ? rf_xcalloc((size_t)n_places, sizeof *b->places) : NULL;
  u->padded_elems = u->bound_padded_elems = b->total_elems;
  u->max_shard_elems = shard;
  return b;
}

/* FSDP1: the tensors back to back, split element-wise into W equal ranges. */
static void rf_plan_layout_flat(struct rf_plan_layout *l, int world, const struct rf_plan_unit_in *in) {
  struct rf_plan_buffer *b =
      rf_plan_layout_one_buffer(l, world, rf_max_i64(rf_ceil_div(l->plan.elems, world), 1), in->n_tensors);
  int64_t off = 0;
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    int64_t subs = t->sub_count > 1 ? t->sub_count : 1; /* fused sub-tensors, back to back */
    b->places[i] = (struct rf_plan_place){i, off, t->numel / subs, 0, subs};
    l->tensors[i].offset = off;
    off += t->numel;
  }
  l->split_blocks = rf_plan_unit_split_blocks(in, &l->plan);
  /* parameters are views of the gathered buffer, the flat gradient is the input: no copy */
}

/* FSDP2: tensor i keeps rows [r*R_i, (r+1)*R_i) on rank r, R_i = ceil(d0/W); a
 * rank's chunks (each padded to R_i rows) are packed in tensor order into its S
 * elements; the all-gather fills a W*S staging buffer, copied out per tensor. */
static void rf_plan_layout_fsdp2(struct rf_plan_layout *l, int world, const struct rf_plan_unit_in *in) {
  int64_t shard = 0;
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    int64_t chunk = rf_ceil_div(t->shape[0], world) * (t->numel / t->shape[0]);
    l->tensors[i].offset = shard;
    l->tensors[i].chunk = chunk;
    l->split_blocks +=
        rf_plan_split_blocks_uniform(t->numel, rf_min_i64(t->block_elems, t->numel), chunk, world);
    shard += chunk;
  }
  rf_plan_layout_one_buffer(l, world, shard, 0);
  /* per all-gather (two per step): copy-out of every element (the copy-in of the
   * rank's shard is the own-shard write every layout makes: not a copy here); per
   * reduce-scatter: chunk_cat of the gradients into the padded input */
  l->copy_gather_elems = 2 * l->plan.elems;
  l->copy_reduce_elems = world * shard;
}

static int rf_plan_layout_planned(const struct rf_plan_policy *p, struct rf_plan_layout *l, int world,
                                  const struct rf_plan_unit_in *in) {
  struct rf_plan_options opt;
  rf_plan_policy_options(p, world, l->plan.elems, &opt);
  RF_TRY(rf_plan_unit_make(in, &opt, &l->plan));
  RF_TRY(rf_plan_unit_check(in, &l->plan, opt.align_elems));
  l->split_blocks = rf_plan_unit_split_blocks(in, &l->plan); /* counted from the rank starts: 0 */
  for (int b = 0; b < l->plan.n_buffers; b++)
    for (int q = l->plan.buffers[b].n_places - 1; q >= 0; q--) {
      const struct rf_plan_place *pl = &l->plan.buffers[b].places[q];
      l->tensors[pl->tensor] = (struct rf_plan_layout_tensor){b, pl->offset, 0};
    }
  return 0;
}

int rf_plan_layout_make(const struct rf_plan_policy *p, int world, const struct rf_plan_unit_in *in,
                        struct rf_plan_layout *out) {
  memset(out, 0, sizeof *out);
  RF_REQUIRE(world >= 1, "unit %s: world must be >= 1 (got %d)", in->name, world);
  RF_REQUIRE(in->n_tensors >= 1, "unit %s has no tensors", in->name);
  out->layout = p->layout;
  out->n_tensors = in->n_tensors;
  out->tensors = rf_xcalloc((size_t)in->n_tensors, sizeof *out->tensors);
  int64_t elems = 0;
  for (int i = 0; i < in->n_tensors; i++) elems += in->tensors[i].numel;
  int rc = 0;
  if (p->layout == RF_LAYOUT_PLANNED) {
    out->plan.elems = elems;
    rc = rf_plan_layout_planned(p, out, world, in);
  } else {
    out->plan =
        (struct rf_plan_unit){.world = world, .mode = RF_SHARD_MODE_EQUAL, .elems = elems, .imbalance = 1.0};
    if (p->layout == RF_LAYOUT_FLAT)
      rf_plan_layout_flat(out, world, in);
    else
      rf_plan_layout_fsdp2(out, world, in);
  }
  if (rc != 0) {
    rf_plan_layout_free(out);
    return -1;
  }
  out->copy_bytes = out->copy_gather_elems * (int64_t)rf_dtype_size(p->param_dtype) +
                    out->copy_reduce_elems * (int64_t)rf_dtype_size(p->reduce_dtype);
  return 0;
}

void rf_plan_layout_free(struct rf_plan_layout *layout) {
  rf_plan_unit_free(&layout->plan);
  free(layout->tensors);
  memset(layout, 0, sizeof *layout);
}

void rf_plan_layout_copy(const struct rf_plan_layout *src, struct rf_plan_layout *dst) {
  *dst = *src;
  const struct rf_plan_unit *s = &src->plan;
  struct rf_plan_unit *d = &dst->plan;
  d->buffers = rf_xmalloc((size_t)s->n_buffers * sizeof *d->buffers);
  for (int b = 0; b < s->n_buffers; b++) {
    const struct rf_plan_buffer *x = &s->buffers[b];
    struct rf_plan_buffer *y = &d->buffers[b];
    *y = *x;
    y->starts = rf_xmalloc((size_t)(s->world + 1) * sizeof *y->starts);
    memcpy(y->starts, x->starts, (size_t)(s->world + 1) * sizeof *y->starts);
    y->places = x->n_places ? rf_xmalloc((size_t)x->n_places * sizeof *y->places) : NULL;
    if (x->n_places) memcpy(y->places, x->places, (size_t)x->n_places * sizeof *y->places);
  }
  dst->tensors = rf_xmalloc((size_t)src->n_tensors * sizeof *dst->tensors);
  memcpy(dst->tensors, src->tensors, (size_t)src->n_tensors * sizeof *dst->tensors);
}

int rf_plan_layout_tensor_shard(const struct rf_plan_layout *layout, const struct rf_plan_unit_in *in, int i,
                                struct rf_shard *out) {
  const struct rf_plan_tensor_in *t = &in->tensors[i];
  const struct rf_plan_layout_tensor *x = &layout->tensors[i];
  int world = layout->plan.world;
  int64_t off = x->offset;
  const int64_t *starts = layout->plan.buffers[x->buffer].starts;
  int64_t *grid = NULL;
  if (x->chunk > 0) {
    /* fsdp2: the tensor's own rank grid r * chunk */
    grid = rf_xmalloc((size_t)(world + 1) * sizeof *grid);
    for (int r = 0; r <= world; r++) grid[r] = r * x->chunk;
    starts = grid;
    off = 0;
  }
  int64_t block = rf_min_i64(t->block_elems, t->numel);
  if (rf_shard_buffer_cut(t->numel, block, off, starts, world)) block = 1;
  int rc = rf_shard_init_from_buffer(out, t->numel, block, off, starts, world);
  free(grid);
  return rc;
}
