/* The three layouts of a unit's DBuffer: planned (the planner's buffers), flat
 * (FSDP1) and fsdp2 (per-tensor dim-0 shards through a staging buffer). */
#include <stdlib.h>
#include <string.h>

#include "dbuffer/dbuffer.h"

/* A buffer (a world of cost in collectives) beyond the first must save at least
 * this many elements of padding. */
#define RF_DBUFFER_BUFFER_COST_ELEMS 65536.0

static void rf_dbuffer_alloc(struct rf_dbuffer *db, int n_buffers, const struct rf_plan_tensor_in *in,
                             int n_tensors) {
  int w = db->world;
  db->n_buffers = n_buffers;
  db->bufs = rf_xcalloc((size_t)n_buffers, sizeof *db->bufs);
  for (int b = 0; b < n_buffers; b++) db->bufs[b].starts = rf_xcalloc((size_t)w + 1, sizeof(int64_t));
  db->n_tensors = n_tensors;
  db->tensors = rf_xcalloc((size_t)n_tensors, sizeof *db->tensors);
  for (int t = 0; t < n_tensors; t++) {
    db->tensors[t].starts = rf_xcalloc((size_t)w + 1, sizeof(int64_t));
    db->tensors[t].piece = rf_xcalloc((size_t)w, sizeof(int64_t));
    db->tensors[t].numel = in[t].numel;
    db->tensors[t].block_elems = in[t].block_elems;
  }
}

void rf_dbuffer_free(struct rf_dbuffer *db) {
  for (int b = 0; b < db->n_buffers; b++) free(db->bufs[b].starts);
  for (int t = 0; t < db->n_tensors; t++) {
    free(db->tensors[t].starts);
    free(db->tensors[t].piece);
  }
  free(db->bufs);
  free(db->tensors);
  memset(db, 0, sizeof *db);
}

/* A tensor stored contiguously at `off` of buffer b: its rank ranges are the
 * intersections with the buffer's rank ranges. */
static void rf_dbuffer_place_contiguous(struct rf_dbuffer *db, int t, int b, int64_t off) {
  struct rf_dbuffer_tensor *x = &db->tensors[t];
  const int64_t *bs = db->bufs[b].starts;
  x->buffer = b;
  for (int r = 0; r <= db->world; r++) x->starts[r] = rf_min_i64(rf_max_i64(bs[r] - off, 0), x->numel);
  for (int r = 0; r < db->world; r++) x->piece[r] = off + x->starts[r];
  x->view_off = off; /* relative to the buffer until the slots are laid out */
}

/* Fills what every layout derives the same way: blocks_whole, the slots and the
 * shard offsets. Contiguous layouts (planned, flat) have views in the buffers. */
static void rf_dbuffer_finish_contiguous(struct rf_dbuffer *db, int64_t align) {
  int r = db->rank, w = db->world;
  int64_t slot = 0, shard = 0;
  for (int b = 0; b < db->n_buffers; b++) {
    struct rf_dbuffer_buf *buf = &db->bufs[b];
    buf->total = buf->starts[w];
    buf->slot_off = slot;
    buf->shard_off = shard;
    slot = rf_round_up(slot + buf->total, align);
    shard = rf_round_up(shard + buf->starts[r + 1] - buf->starts[r], align);
    db->padded_elems += buf->total;
  }
  int64_t *real_own = rf_xcalloc((size_t)db->n_buffers, sizeof(int64_t));
  int64_t *real_all = rf_xcalloc((size_t)db->n_buffers, sizeof(int64_t));
  for (int t = 0; t < db->n_tensors; t++) {
    struct rf_dbuffer_tensor *x = &db->tensors[t];
    const struct rf_dbuffer_buf *buf = &db->bufs[x->buffer];
    x->view_off += buf->slot_off;
    x->gview_off = x->view_off;
    x->shard_off = buf->shard_off + rf_max_i64(x->piece[r] - buf->starts[r], 0);
    real_own[x->buffer] += x->starts[r + 1] - x->starts[r];
    real_all[x->buffer] += x->numel;
  }
  for (int b = 0; b < db->n_buffers; b++) {
    struct rf_dbuffer_buf *buf = &db->bufs[b];
    int64_t own = buf->starts[r + 1] - buf->starts[r];
    buf->pad_other = (buf->total - real_all[b]) - (own - real_own[b]);
  }
  free(real_own);
  free(real_all);
  db->shard_elems = shard;
  db->slot_elems = slot;
  db->gview_elems = slot;
  db->staging_elems = slot; /* used only when the reduce dtype differs from f32 */
}

static int rf_dbuffer_init_planned(struct rf_dbuffer *db, const char *unit_name,
                                   const struct rf_plan_tensor_in *tensors, int n,
                                   const struct rf_dbuffer_options *opt) {
  struct rf_plan_unit_in in = {unit_name, n, tensors};
  struct rf_plan_options popt = {
      db->world, opt->shard, opt->align_elems, opt->max_buffers, RF_DBUFFER_BUFFER_COST_ELEMS, 0};
  struct rf_plan_unit plan;
  int rc = rf_plan_unit_make(&in, &popt, &plan);
  if (rc == 0) {
    rc = rf_plan_unit_check(&in, &plan, opt->align_elems);
    if (rc == 0) {
      rf_dbuffer_alloc(db, plan.n_buffers, tensors, n);
      for (int b = 0; b < plan.n_buffers; b++) {
        const struct rf_plan_buffer *pb = &plan.buffers[b];
        memcpy(db->bufs[b].starts, pb->starts, ((size_t)db->world + 1) * sizeof(int64_t));
        db->bufs[b].equal = opt->shard == RF_SHARD_MODE_EQUAL ? pb->shard_elems : 0;
        for (int p = 0; p < pb->n_places; p++) {
          const struct rf_plan_place *pl = &pb->places[p];
          RF_ASSERT(pl->sub_first == 0); /* sub-padding is off: every tensor is one run */
          rf_dbuffer_place_contiguous(db, pl->tensor, b, pl->offset);
        }
      }
    }
    rf_plan_unit_free(&plan);
  }
  return rc;
}

static void rf_dbuffer_init_flat(struct rf_dbuffer *db, const struct rf_plan_tensor_in *tensors, int n) {
  rf_dbuffer_alloc(db, 1, tensors, n);
  int64_t shard = rf_max_i64(rf_ceil_div(db->elems, db->world), 1);
  for (int r = 0; r <= db->world; r++) db->bufs[0].starts[r] = r * shard;
  db->bufs[0].equal = shard;
  int64_t off = 0;
  for (int t = 0; t < n; t++) {
    rf_dbuffer_place_contiguous(db, t, 0, off);
    off += db->tensors[t].numel;
  }
}

/* FSDP2: tensor t keeps rows [r*R_t, (r+1)*R_t) on rank r, R_t = ceil(d0/W), each
 * rank's shard padded to R_t rows; a rank's shards of the unit are packed in
 * tensor order (S elements); all-gather into a staging buffer of W*S at the start
 * of the slot, then the copy-out into each tensor's own storage after it. */
static void rf_dbuffer_init_fsdp2(struct rf_dbuffer *db, const struct rf_plan_tensor_in *tensors, int n,
                                  int64_t align) {
  int w = db->world, r = db->rank;
  rf_dbuffer_alloc(db, 1, tensors, n);
  int64_t shard = 0, real_own = 0;
  for (int t = 0; t < n; t++)
    shard += rf_ceil_div(tensors[t].shape[0], w) * (tensors[t].numel / tensors[t].shape[0]);
  struct rf_dbuffer_buf *buf = &db->bufs[0];
  for (int q = 0; q <= w; q++) buf->starts[q] = q * shard;
  buf->equal = shard;
  buf->total = w * shard;
  int64_t pre = 0, view = rf_round_up(w * shard, align), gview = 0;
  for (int t = 0; t < n; t++) {
    struct rf_dbuffer_tensor *x = &db->tensors[t];
    int64_t d0 = tensors[t].shape[0], row = x->numel / d0, rows = rf_ceil_div(d0, w);
    for (int q = 0; q <= w; q++) x->starts[q] = rf_min_i64(q * rows, d0) * row;
    for (int q = 0; q < w; q++) x->piece[q] = q * shard + pre;
    x->shard_off = pre;
    x->view_off = view;
    x->gview_off = gview;
    real_own += x->starts[r + 1] - x->starts[r];
    pre += rows * row;
    view = rf_round_up(view + x->numel, align);
    gview = rf_round_up(gview + x->numel, align);
  }
  buf->pad_other = (buf->total - db->elems) - (shard - real_own);
  db->padded_elems = buf->total;
  db->shard_elems = rf_round_up(shard, align);
  db->slot_elems = view;
  db->gview_elems = gview;
  db->staging_elems = buf->total;
}

int rf_dbuffer_init(struct rf_dbuffer *db, const char *unit_name, const struct rf_plan_tensor_in *tensors,
                    int n_tensors, int world, int rank, const struct rf_dbuffer_options *opt) {
  memset(db, 0, sizeof *db);
  RF_REQUIRE(n_tensors >= 1, "unit %s has no tensors", unit_name);
  db->layout = opt->layout;
  db->world = world;
  db->rank = rank;
  for (int t = 0; t < n_tensors; t++) db->elems += tensors[t].numel;
  switch (opt->layout) {
    case RF_LAYOUT_PLANNED:
      RF_TRY(rf_dbuffer_init_planned(db, unit_name, tensors, n_tensors, opt));
      break;
    case RF_LAYOUT_FLAT:
      rf_dbuffer_init_flat(db, tensors, n_tensors);
      break;
    case RF_LAYOUT_FSDP2:
      rf_dbuffer_init_fsdp2(db, tensors, n_tensors, opt->align_elems);
      break;
  }
  if (opt->layout != RF_LAYOUT_FSDP2) rf_dbuffer_finish_contiguous(db, opt->align_elems);
  for (int t = 0; t < n_tensors; t++) {
    struct rf_dbuffer_tensor *x = &db->tensors[t];
    x->blocks_whole = 1;
    for (int q = 1; q < world; q++)
      if (x->starts[q] % x->block_elems != 0 && x->starts[q] != x->numel) x->blocks_whole = 0;
  }
  return 0;
}
