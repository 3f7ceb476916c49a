/* FP8 block tiles in a layout: which 128x128 tiles of the quantized tensors a layout's
 * rank boundaries cut, and the bytes an FP8 all-gather would move (docs/fp8.md). */
#include <stdlib.h>

#include "core/core.h"
#include "plan/plan.h"

/* A tensor's tile geometry: sub-tensors of rows x cols (its 2-D view per sub-tensor). */
struct fp8_geom {
  int64_t subs, rows, cols, sub_numel;
};

static struct fp8_geom fp8_geom_of(const struct rf_plan_tensor_in *t) {
  struct fp8_geom g;
  g.subs = t->sub_count > 1 ? t->sub_count : 1;
  g.cols = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel;
  g.sub_numel = t->numel / g.subs;
  g.rows = g.cols > 0 ? g.sub_numel / g.cols : 0;
  return g;
}

int64_t rf_plan_fp8_tiles(const struct rf_plan_tensor_in *t) {
  struct fp8_geom g = fp8_geom_of(t);
  return g.subs * rf_ceil_div(g.rows, RF_FP8_TILE) * rf_ceil_div(g.cols, RF_FP8_TILE);
}

int64_t rf_plan_fp8_block_elems(const struct rf_plan_tensor_in *t) {
  struct fp8_geom g = fp8_geom_of(t);
  if (g.cols <= 0 || t->numel <= 0) return t->block_elems;
  int64_t rows = rf_ceil_div(rf_min_i64(t->block_elems, t->numel), g.cols);
  /* tiles count from each sub-tensor's first row: 128-row blocks from the tensor's start
   * keep them whole when a sub-tensor is a whole number of 128 rows, else whole sub-tensors */
  int64_t unit = g.subs > 1 && g.rows % RF_FP8_TILE != 0 ? g.rows : RF_FP8_TILE;
  int64_t all_rows = g.subs * g.rows;
  rows = rf_lcm_i64_capped(rows, unit, all_rows);
  /* beyond the tensor (e.g. fewer than 128 rows): the whole tensor is one block */
  return (rows < 0 ? all_rows : rf_min_i64(rows, all_rows)) * g.cols;
}

int64_t rf_plan_fp8_cut_tiles(const struct rf_plan_tensor_in *t, const int64_t *cuts, int n_cuts) {
  struct fp8_geom g = fp8_geom_of(t);
  if (g.cols <= 0 || g.rows <= 0) return 0;
  int64_t tc = rf_ceil_div(g.cols, RF_FP8_TILE), band_elems = (int64_t)RF_FP8_TILE * g.cols;
  int64_t cut = 0, last_band = -1, covered = -1; /* the band (sub * bands + b) and its last tile counted */
  int64_t bands = rf_ceil_div(g.rows, RF_FP8_TILE);
  for (int i = 0; i < n_cuts; i++) {
    int64_t x = cuts[i];
    if (x <= 0 || x >= t->numel) continue;
    int64_t sub = x / g.sub_numel, local = x % g.sub_numel, b = local / band_elems;
    int64_t r = local - b * band_elems;
    if (r == 0) continue; /* on a band's first element: nothing of the band before it */
    int64_t band_rows = rf_min_i64(RF_FP8_TILE, g.rows - b * RF_FP8_TILE);
    /* tile j spans offsets [128 j, (band_rows - 1) cols + end_j - 1] of the band: cut
     * when 128 j < r <= that end */
    int64_t j_hi = rf_min_i64((r - 1) / RF_FP8_TILE, tc - 1);
    int64_t q = r - (band_rows - 1) * g.cols + 1; /* end_j must be >= q */
    int64_t j_lo = q <= 1 ? 0 : rf_ceil_div(q, RF_FP8_TILE) - 1;
    int64_t key = sub * bands + b;
    if (key != last_band) last_band = key, covered = -1;
    if (j_lo <= covered) j_lo = covered + 1;
    if (j_hi >= j_lo) {
      cut += j_hi - j_lo + 1;
      covered = j_hi;
    }
  }
  return cut;
}

/* Adds tensor i's numbers given its rank starts (world + 1 offsets in the tensor). */
static void fp8_add_tensor(const struct rf_plan_tensor_in *t, const int64_t *starts, int world,
                           struct rf_plan_fp8_stats *acc) {
  if (!t->fp8) return;
  acc->q_elems += t->numel;
  acc->tiles += rf_plan_fp8_tiles(t);
  acc->cut_tiles += rf_plan_fp8_cut_tiles(t, starts + 1, world - 1);
}

/* A cut of tensor `tensor` at element `at` of it. */
struct fp8_cut {
  int64_t tensor, at;
};

static int fp8_cut_cmp(const void *a, const void *b) {
  const struct fp8_cut *x = a, *y = b;
  if (x->tensor != y->tensor) return x->tensor < y->tensor ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

/* A layout made by rf_plan_layout_make (as the runtime runs it): the rank boundaries
 * of each buffer mapped into the tensors placed there (fused tensors split by
 * sub-padding run by run), or fsdp2's per-tensor grid r * chunk. */
static int fp8_add_layout(const struct rf_plan_policy *p, const struct rf_plan_unit_in *in, int world,
                          struct rf_plan_fp8_stats *acc) {
  struct rf_plan_layout l;
  RF_TRY(rf_plan_layout_make(p, world, in, &l));
  size_t cap = (size_t)l.plan.n_buffers * (size_t)world + 1, n = 0;
  struct fp8_cut *cuts = rf_xmalloc(cap * sizeof *cuts);
  for (int b = 0; b < l.plan.n_buffers; b++) {
    const struct rf_plan_buffer *buf = &l.plan.buffers[b];
    for (int q = 0; q < buf->n_places; q++) {
      const struct rf_plan_place *pl = &buf->places[q];
      const struct rf_plan_tensor_in *t = &in->tensors[pl->tensor];
      if (!t->fp8) continue;
      int64_t subs = t->sub_count > 1 ? t->sub_count : 1, sub_numel = t->numel / subs;
      int runs = pl->sub_stride == sub_numel ? 1 : (int)pl->sub_n;
      int64_t len = runs == 1 ? pl->sub_n * sub_numel : sub_numel;
      for (int s = 0; s < runs; s++) {
        int64_t off = pl->offset + s * pl->sub_stride, phase = (pl->sub_first + s) * sub_numel;
        for (int k = 1; k < world; k++)
          if (buf->starts[k] > off && buf->starts[k] < off + len) {
            RF_ASSERT(n < cap);
            cuts[n++] = (struct fp8_cut){pl->tensor, phase + buf->starts[k] - off};
          }
      }
    }
  }
  qsort(cuts, n, sizeof *cuts, fp8_cut_cmp);
  int64_t *at = rf_xmalloc(cap * sizeof *at);
  size_t j = 0;
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    int n_cuts = 0;
    for (; j < n && cuts[j].tensor == i; j++) at[n_cuts++] = cuts[j].at;
    if (!t->fp8) continue;
    if (l.tensors[i].chunk > 0)
      for (int k = 1; k < world; k++) at[n_cuts++] = k * l.tensors[i].chunk;
    acc->q_elems += t->numel;
    acc->tiles += rf_plan_fp8_tiles(t);
    acc->cut_tiles += rf_plan_fp8_cut_tiles(t, at, n_cuts);
  }
  acc->padded_elems += l.plan.padded_elems;
  free(at);
  free(cuts);
  rf_plan_layout_free(&l);
  return 0;
}

int rf_plan_fp8_add(const struct rf_plan_policy *p, int peer, const struct rf_plan_unit_in *in, int world,
                    struct rf_plan_fp8_stats *acc) {
  RF_REQUIRE(world >= 1, "fp8 tiles: world must be >= 1 (got %d)", world);
  int64_t *starts = rf_xmalloc((size_t)(world + 1) * sizeof *starts);
  int rc = 0;
  for (int i = 0; i < in->n_tensors; i++) acc->elems += in->tensors[i].numel;
  if (peer < 0 || peer == RF_PLAN_PEER_FSDP1 || peer == RF_PLAN_PEER_FSDP2) {
    struct rf_plan_policy q = *p;
    if (peer >= 0) q.layout = peer == RF_PLAN_PEER_FSDP1 ? RF_LAYOUT_FLAT : RF_LAYOUT_FSDP2;
    rc = fp8_add_layout(&q, in, world, acc);
  } else if (peer == RF_PLAN_PEER_DEEPSPEED) {
    for (int i = 0; i < in->n_tensors; i++) {
      const struct rf_plan_tensor_in *t = &in->tensors[i];
      int64_t shard = rf_ceil_div(t->numel, world);
      for (int r = 0; r <= world; r++) starts[r] = r * shard;
      acc->padded_elems += shard * world;
      fp8_add_tensor(t, starts, world, acc);
    }
  } else if (peer == RF_PLAN_PEER_MEGATRON) {
    int64_t *offsets = rf_xmalloc((size_t)(in->n_tensors > 0 ? in->n_tensors : 1) * sizeof *offsets);
    int64_t padded = rf_plan_megatron_offsets(in, world, offsets);
    for (int i = 0; i < in->n_tensors; i++) {
      for (int r = 0; r <= world; r++) starts[r] = r * (padded / world) - offsets[i];
      fp8_add_tensor(&in->tensors[i], starts, world, acc);
    }
    acc->padded_elems += padded;
    free(offsets);
  } else {
    rc = rf_error_set(__FILE__, __LINE__, "fp8 tiles: unknown peer %d", peer);
  }
  free(starts);
  return rc;
}

int64_t rf_plan_fp8_gather_bytes(const struct rf_plan_fp8_stats *s, enum rf_dtype high) {
  int64_t padding = s->padded_elems - s->elems;
  return padding + s->q_elems + 4 * s->tiles + (s->elems - s->q_elems) * (int64_t)rf_dtype_size(high);
}
