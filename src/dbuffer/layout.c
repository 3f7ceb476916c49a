/* A unit's DBuffer on one rank from the layout the planning policy gives
 * (src/plan/policy.c): planned (the planner's buffers), flat (FSDP1) or fsdp2
 * (per-tensor dim-0 chunks through a staging buffer). The per-tensor rank ranges
 * are RaggedShards (src/shard); this file adds what is one rank's own: the
 * slots, the shard offsets and the padding moved. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dbuffer/dbuffer.h"

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
    free(db->tensors[t].scale_starts);
  }
  free(db->bufs);
  free(db->tensors);
  free(db->host_nans);
  free(db->host_scales);
  if (db->written) rf_device_event_free(db->dev, db->written);
  free(db->written);
  memset(db, 0, sizeof *db);
}

/* Contiguous layouts (planned, flat): the slots, the shard offsets and the
 * padding moved; the views lie in the buffers. */
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

/* FSDP2: rank r's chunks of the unit are packed in tensor order (S elements); the
 * all-gather fills a staging buffer of W*S at the start of the slot, then each
 * tensor is copied out into its own storage after it. */
static void rf_dbuffer_finish_fsdp2(struct rf_dbuffer *db, int64_t align) {
  int r = db->rank, w = db->world;
  struct rf_dbuffer_buf *buf = &db->bufs[0];
  int64_t shard = buf->equal, real_own = 0, view = rf_round_up(w * shard, align), gview = 0;
  buf->total = w * shard;
  for (int t = 0; t < db->n_tensors; t++) {
    struct rf_dbuffer_tensor *x = &db->tensors[t];
    x->shard_off = x->piece[0];
    x->view_off = view;
    x->gview_off = gview;
    real_own += x->starts[r + 1] - x->starts[r];
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

/* Tensor i of the group `in` (tensor t of the unit): its ranges (a RaggedShard from
 * the layout) and where each rank's piece sits in its buffer (the group's buffers
 * begin at first_buf). */
static int rf_dbuffer_place(struct rf_dbuffer *db, const struct rf_plan_layout *l,
                            const struct rf_plan_unit_in *in, int i, int t, int first_buf) {
  struct rf_dbuffer_tensor *x = &db->tensors[t];
  const struct rf_plan_layout_tensor *lt = &l->tensors[i];
  struct rf_shard sh;
  RF_TRY(rf_plan_layout_tensor_shard(l, in, i, &sh));
  rf_shard_starts(&sh, x->starts);
  x->blocks_whole = sh.block_elems == rf_min_i64(x->block_elems, x->numel);
  rf_shard_free(&sh);
  x->buffer = first_buf + lt->buffer;
  for (int r = 0; r < db->world; r++)
    x->piece[r] = lt->chunk > 0 ? r * l->plan.buffers[0].shard_elems + lt->offset : lt->offset + x->starts[r];
  x->view_off = lt->offset; /* contiguous: relative to the buffer until the slots are laid out */
  return 0;
}

/* FP8 tensor t: its tile grid and, when its codes are gathered (planned layout),
 * every rank's first tile; fails when a rank's range starts inside a band of 128
 * rows (its tiles would be cut). A matrix is one grid; fused experts [E, rows, cols]
 * are E grids, each expert's matrix tiled on its own (its last band partial when
 * rows is not a multiple of 128), the scales expert-major (as `rfsdp ckpt export
 * --fp8` writes them). */
static int rf_dbuffer_fp8_tiles(struct rf_dbuffer *db, const char *unit_name,
                                const struct rf_plan_tensor_in *in, int t) {
  struct rf_dbuffer_tensor *x = &db->tensors[t];
  RF_REQUIRE(in->ndim == 2 || in->ndim == 3, "unit %s: FP8 tensor %s is not a matrix or fused experts",
             unit_name, in->name);
  x->fp8 = 1;
  x->name = in->name;
  x->experts = in->ndim == 3 ? in->shape[0] : 1;
  x->cols = in->shape[in->ndim - 1];
  x->rows = in->shape[in->ndim - 2];
  int64_t band = (int64_t)RF_FP8_TILE * x->cols, per = x->rows * x->cols;
  int64_t tc = rf_ceil_div(x->cols, RF_FP8_TILE), bands = rf_ceil_div(x->rows, RF_FP8_TILE);
  x->tiles = x->experts * bands * tc;
  db->n_fp8++;
  if (db->fp8_after) return 0;
  x->scale_starts = rf_xcalloc((size_t)db->world + 1, sizeof(int64_t));
  for (int r = 0; r <= db->world; r++) {
    int64_t s = x->starts[r], e = s / per, local = s % per;
    RF_REQUIRE(local % band == 0,
               "unit %s: FP8 tensor %s: rank %d's range starts at row %lld of expert %lld, inside a band of "
               "128x128 tiles (the layout must keep 128-row blocks whole)",
               unit_name, in->name, r, (long long)(local / x->cols), (long long)e);
    x->scale_starts[r] = (e * bands + local / band) * tc;
  }
  return 0;
}

/* The param slot in bytes: every buffer in its dtype (FP8 buffers: 1 byte per
 * element; fsdp2: the staging buffer and the tensors' storage) on the alignment of
 * the element offsets, then per FP8 tensor its codes (fp8_after: the gathered view
 * is in the param dtype) and its scales, then (fp8_after, bf16) the f32 band
 * scratch; without FP8 tensors, exactly slot_elems elements of the param dtype. */
static void rf_dbuffer_slot_bytes(struct rf_dbuffer *db, enum rf_dtype param_dtype, int64_t align) {
  int64_t ps = (int64_t)rf_dtype_size(param_dtype), at = 0, band = 0;
  if (db->layout == RF_LAYOUT_FSDP2) {
    for (int t = 0; t < db->n_tensors; t++) db->tensors[t].view_byte = db->tensors[t].view_off * ps;
    at = db->slot_elems * ps;
  } else {
    for (int b = 0; b < db->n_buffers; b++) {
      struct rf_dbuffer_buf *buf = &db->bufs[b];
      buf->slot_byte = rf_slot_place(&at, buf->total * (buf->fp8 ? 1 : ps), align * ps);
    }
    for (int t = 0; t < db->n_tensors; t++) {
      struct rf_dbuffer_tensor *x = &db->tensors[t];
      const struct rf_dbuffer_buf *buf = &db->bufs[x->buffer];
      x->view_byte = buf->slot_byte + (x->view_off - buf->slot_off) * (buf->fp8 ? 1 : ps);
    }
  }
  for (int t = 0; t < db->n_tensors; t++) {
    struct rf_dbuffer_tensor *x = &db->tensors[t];
    if (!x->fp8) continue;
    x->code_byte = x->view_byte;
    if (db->fp8_after) x->code_byte = rf_slot_fp8_codes(&at, &band, x->numel, x->rows, x->cols, align * ps);
    x->scale_byte = rf_slot_fp8_scales(&at, x->tiles, align * ps);
  }
  int64_t band_byte = rf_slot_band(&at, band, ps, align * ps); /* (the core rule) */
  if (band_byte >= 0) db->band_byte = band_byte;
  db->slot_bytes = (size_t)at;
}

int rf_dbuffer_init(struct rf_dbuffer *db, const char *unit_name, const struct rf_plan_tensor_in *tensors,
                    int n_tensors, int world, int rank, const struct rf_plan_policy *policy,
                    struct rf_device *dev) {
  memset(db, 0, sizeof *db);
  RF_REQUIRE(n_tensors >= 1, "unit %s has no tensors", unit_name);
  db->dev = dev;
  db->written = rf_xcalloc(1, sizeof *db->written);
  rf_device_event_create(dev, db->written);
  db->layout = policy->layout;
  db->world = world;
  db->rank = rank;
  int has_fp8 = 0;
  for (int t = 0; t < n_tensors; t++) {
    db->elems += tensors[t].numel;
    has_fp8 |= policy->fp8 && tensors[t].fp8;
  }
  db->fp8_after = has_fp8 && policy->layout != RF_LAYOUT_PLANNED;
  /* planned with FP8 tensors: two groups (the other tensors, then the FP8 ones),
   * each planned into buffers of its own: every collective moves one kind; else
   * one group (rf_plan_split_make) */
  struct rf_plan_split sp;
  const struct rf_plan_unit_in unit = {unit_name, n_tensors, tensors};
  int n_buffers = 0, rc = rf_plan_split_make(policy, world, &unit, &sp);
  for (int i = 0; i < sp.n_groups; i++) {
    RF_ASSERT(!sp.layout[i].plan.used_sub_padding); /* every tensor is one run */
    n_buffers += sp.layout[i].plan.n_buffers;
  }
  if (rc == 0) rf_dbuffer_alloc(db, n_buffers, tensors, n_tensors);
  for (int i = 0, first = 0, mapped = 0; i < sp.n_groups && rc == 0; i++) {
    const struct rf_plan_layout *l = &sp.layout[i];
    for (int b = 0; b < l->plan.n_buffers; b++) {
      const struct rf_plan_buffer *pb = &l->plan.buffers[b];
      struct rf_dbuffer_buf *buf = &db->bufs[first + b];
      memcpy(buf->starts, pb->starts, ((size_t)world + 1) * sizeof(int64_t));
      buf->equal = l->plan.mode == RF_SHARD_MODE_EQUAL ? pb->shard_elems : 0;
      buf->fp8 = sp.fp8[i];
    }
    for (int k = 0; k < sp.in[i].n_tensors && rc == 0; k++)
      rc = rf_dbuffer_place(db, l, &sp.in[i], k, sp.map[mapped + k], first);
    mapped += sp.in[i].n_tensors;
    first += l->plan.n_buffers;
    db->max_shard_elems += l->plan.max_shard_elems;
    db->split_blocks += l->split_blocks;
    db->copy_bytes += l->copy_bytes;
  }
  int64_t align = rf_plan_policy_align_elems(policy);
  if (rc == 0) {
    if (policy->layout == RF_LAYOUT_FSDP2)
      rf_dbuffer_finish_fsdp2(db, align);
    else
      rf_dbuffer_finish_contiguous(db, align);
  }
  for (int t = 0; t < n_tensors && rc == 0; t++)
    if (has_fp8 && tensors[t].fp8) rc = rf_dbuffer_fp8_tiles(db, unit_name, &tensors[t], t);
  if (rc == 0) rf_dbuffer_slot_bytes(db, policy->param_dtype, align);
  if (rc == 0 && db->n_fp8 > 0) { /* the host's side of the scales: sized once */
    int64_t band = 1, tiles = 1;
    for (int t = 0; t < db->n_tensors; t++)
      if (db->tensors[t].fp8) {
        band = rf_max_i64(band, rf_ceil_div(db->tensors[t].cols, RF_FP8_TILE));
        tiles = rf_max_i64(tiles, db->tensors[t].tiles);
      }
    db->host_nans = rf_xmalloc((size_t)band * sizeof(float));
    for (int64_t j = 0; j < band; j++) db->host_nans[j] = NAN;
    db->host_scales = rf_xmalloc((size_t)tiles * sizeof(float));
  }
  db->n_gather_reqs = db->n_buffers + (db->fp8_after ? 0 : db->n_fp8);
  rf_plan_split_free(&sp);
  return rc;
}
