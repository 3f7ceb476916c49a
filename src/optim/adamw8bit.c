/* src/optim: block-wise 8-bit AdamW. m and v are 8-bit codes of bitsandbytes'
 * dynamic maps (signed for m, unsigned for v), one f32 absmax per block: 32x32
 * tiles of matrices (32-row strips, 32-column tiles, shorter last ones), runs of
 * 256 elements of vectors. The layout keeps blocks whole where its view says so
 * (block_elems); elsewhere a block cut by a rank boundary is quantized per local
 * fragment. See docs/optim.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

#define RF_OPTIM_TILE 32        /* 32 x 32 tiles of matrices */
#define RF_OPTIM_VEC_BLOCK 256  /* runs of 256 elements of vectors */
#define RF_OPTIM_BLOCK_MAX 1024 /* the largest block, in elements */

/* A view's blocks in the scale slabs. */
struct rf_optim_8bit_view {
  int64_t scale_off, n_blocks, first_block;
};

struct rf_optim_8bit {
  struct rf_optim_8bit_view *views; /* o->n */
  uint8_t *mq, *vq;                 /* codes, shard length */
  float *ms, *vs;                   /* absmax per block, n_scales */
  int64_t n_scales;
  uint8_t zero_code_m;
  float *blk_m, *blk_v; /* RF_OPTIM_BLOCK_MAX each: one block's moments in f32 */
};

/* ---- blocks ------------------------------------------------------------------ */

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

static int rf_optim_8bit_create(struct rf_optim *o) {
  struct rf_optim_8bit *q = rf_xcalloc(1, sizeof *q);
  o->impl = q;
  q->views = rf_xcalloc((size_t)(o->n > 0 ? o->n : 1), sizeof *q->views);
  size_t slab = (size_t)rf_max_i64(o->shard_elems, 1);
  rf_optim_qmap(1);
  q->zero_code_m = rf_optim_quantize(1, 0.0f);
  RF_ASSERT(rf_optim_qmap(1)[q->zero_code_m] == 0.0f && rf_optim_qmap(0)[0] == 0.0f);
  q->mq = rf_xaligned(64, slab);
  q->vq = rf_xaligned(64, slab);
  memset(q->mq, q->zero_code_m, slab);
  memset(q->vq, 0, slab);
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    struct rf_optim_8bit_view *x = &q->views[i];
    int64_t first, last, cut = 0;
    rf_optim_block_span(w, &first, &last);
    x->scale_off = q->n_scales;
    x->first_block = -1;
    for (int64_t blk = first; blk < last; blk++) {
      struct rf_optim_runs runs;
      rf_optim_block_runs(w, blk, &runs);
      if (runs.elems == 0) continue;
      if (x->first_block < 0) x->first_block = blk;
      x->n_blocks++;
      if (runs.elems != rf_optim_block_full_elems(w, blk)) cut++;
    }
    if (x->first_block < 0) x->first_block = 0;
    q->n_scales += x->n_blocks;
    if (rf_optim_check_whole(o, w, cut) != 0) return -1;
    o->stats.state_bytes_used += 2 * (w->v.end - w->v.begin) + 8 * x->n_blocks;
  }
  q->ms = rf_xcalloc((size_t)rf_max_i64(q->n_scales, 1), sizeof(float));
  q->vs = rf_xcalloc((size_t)rf_max_i64(q->n_scales, 1), sizeof(float));
  q->blk_m = rf_xaligned(64, RF_OPTIM_BLOCK_MAX * sizeof(float));
  q->blk_v = rf_xaligned(64, RF_OPTIM_BLOCK_MAX * sizeof(float));
  o->stats.state_bytes = 2 * o->shard_elems + 2 * q->n_scales * (int64_t)sizeof(float);
  o->stats.workspace_bytes = 2 * RF_OPTIM_BLOCK_MAX * (int64_t)sizeof(float);
  return 0;
}

static void rf_optim_8bit_free(struct rf_optim *o) {
  struct rf_optim_8bit *q = o->impl;
  if (!q) return;
  free(q->views);
  free(q->mq);
  free(q->vq);
  free(q->ms);
  free(q->vs);
  free(q->blk_m);
  free(q->blk_v);
  free(q);
}

/* ---- step ---------------------------------------------------------------------- */

/* One block: decode, update in f32 (the parameter uses the f32 moments, as
 * bitsandbytes does), re-encode with the new absmax. */
static void rf_optim_8bit_block(struct rf_optim_8bit *q, const struct rf_optim_hyper *h,
                                const struct rf_optim_view *w, const struct rf_optim_runs *runs, int64_t k) {
  const float *qs = rf_optim_qmap(1), *qu = rf_optim_qmap(0);
  float *p = w->v.master;
  const float *g = w->v.grad;
  uint8_t *mq = q->mq + w->v.shard_offset, *vq = q->vq + w->v.shard_offset;
  float ms = q->ms[k], vs = q->vs[k];
  float am = 0.0f, av = 0.0f;
  float dec = (w->flags & RF_OPTIM_FLAG_DECAY) ? h->decay : 1.0f;
  float *bm = q->blk_m, *bv = q->blk_v;
  int64_t t = 0;
  for (int r = 0; r < runs->n; r++) {
    int64_t lo = runs->lo[r], n = runs->hi[r] - lo;
    float *restrict pr = p + lo, *restrict bmr = bm + t, *restrict bvr = bv + t;
    const float *restrict gr = g + lo;
    const uint8_t *restrict mqr = mq + lo, *restrict vqr = vq + lo;
    for (int64_t i = 0; i < n; i++) {
      float gi = gr[i];
      float mi = qs[mqr[i]] * ms, vi = qu[vqr[i]] * vs;
      mi = mi + h->one_m_b1 * (gi - mi);
      vi = h->b2 * vi + h->one_m_b2 * (gi * gi);
      bmr[i] = mi;
      bvr[i] = vi;
      float ai = fabsf(mi);
      am = ai > am ? ai : am; /* fmaxf here (no NaN in am), without the call */
      av = vi > av ? vi : av;
      pr[i] = pr[i] * dec - h->step_size * (mi / (sqrtf(vi) / h->bc2_sqrt + h->eps));
    }
    t += n;
  }
  float im = am > 0.0f ? 1.0f / am : 0.0f, iv = av > 0.0f ? 1.0f / av : 0.0f;
  t = 0;
  for (int r = 0; r < runs->n; r++) {
    int64_t lo = runs->lo[r], n = runs->hi[r] - lo;
    uint8_t *restrict vqr = vq + lo;
    const float *restrict bvr = bv + t;
    rf_optim_quantize_scaled(1, bm + t, n, im, mq + lo);
    rf_optim_quantize_scaled(0, bvr, n, iv, vqr);
#pragma omp simd
    for (int64_t i = 0; i < n; i++) /* a positive v never decodes to 0 (no m / eps blow-up) */
      vqr[i] = (uint8_t)(vqr[i] | ((vqr[i] == 0) & (bvr[i] > 0.0f)));
    t += n;
  }
  q->ms[k] = am;
  q->vs[k] = av;
}

static int rf_optim_8bit_step(struct rf_optim *o, float lr) {
  struct rf_optim_8bit *q = o->impl;
  struct rf_optim_hyper h;
  rf_optim_hyper_init(o, lr, &h);
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    if (w->v.end == w->v.begin) continue;
    int64_t first, last, k = q->views[i].scale_off;
    rf_optim_block_span(w, &first, &last);
    for (int64_t blk = first; blk < last; blk++) {
      struct rf_optim_runs runs;
      rf_optim_block_runs(w, blk, &runs);
      if (runs.elems == 0) continue;
      RF_ASSERT(runs.elems <= RF_OPTIM_BLOCK_MAX);
      rf_optim_8bit_block(q, &h, w, &runs, k++);
    }
    RF_ASSERT(k == q->views[i].scale_off + q->views[i].n_blocks);
  }
  return 0;
}

/* ---- state -------------------------------------------------------------------- */

static void rf_optim_8bit_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  const struct rf_optim_8bit *q = o->impl;
  static const char *const names[4] = {"m_code", "v_code", "m_scale", "v_scale"};
  out->name = names[i];
  out->data = i == 0 ? (void *)q->mq : i == 1 ? (void *)q->vq : i == 2 ? (void *)q->ms : (void *)q->vs;
  out->dtype = i < 2 ? RF_DTYPE_U8 : RF_DTYPE_F32;
  out->count = i < 2 ? o->shard_elems : q->n_scales;
  out->shard_layout = i < 2;
}

static void rf_optim_8bit_scales(const struct rf_optim *o, int view, int64_t *offset, int64_t *count,
                                 int64_t *first) {
  const struct rf_optim_8bit_view *x = &((const struct rf_optim_8bit *)o->impl)->views[view];
  *offset = x->scale_off;
  *count = x->n_blocks;
  *first = x->first_block;
}

static int64_t rf_optim_8bit_tensor_blocks(const struct rf_optim *o, int view) {
  const struct rf_optim_view *w = &o->views[view];
  if (w->cols == 0) return rf_ceil_div(w->v.numel, RF_OPTIM_VEC_BLOCK);
  return rf_ceil_div(w->rows, RF_OPTIM_TILE) * rf_optim_tiles_per_strip(w);
}

const struct rf_optim_ops rf_optim_adamw8bit_ops = {
    .name = "adamw8bit",
    .block_rows = RF_OPTIM_TILE,
    .vector_block = RF_OPTIM_VEC_BLOCK,
    .n_states = 4,
    .create = rf_optim_8bit_create,
    .step = rf_optim_8bit_step,
    .state = rf_optim_8bit_state,
    .free = rf_optim_8bit_free,
    .scales = rf_optim_8bit_scales,
    .tensor_blocks = rf_optim_8bit_tensor_blocks,
};
