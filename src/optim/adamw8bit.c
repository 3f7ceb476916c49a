/* src/optim: block-wise 8-bit AdamW. m and v are 8-bit codes of bitsandbytes'
 * dynamic maps (signed for m, unsigned for v), one f32 absmax per block: 32x32
 * tiles of matrices (32-row strips, 32-column tiles, shorter last ones), runs of
 * 256 elements of vectors. The layout keeps blocks whole where its view says so
 * (block_elems); elsewhere a block cut by a rank boundary is quantized per local
 * fragment. See docs/optim.md. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "optim/optim.h"
#include "optim/simd.h"

#define RF_OPTIM_TILE 32       /* 32 x 32 tiles of matrices */
#define RF_OPTIM_VEC_BLOCK 256 /* runs of 256 elements of vectors */

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
  /* workspace of a group of blocks (rf_optim_8bit_group) */
  float *blk_m, *blk_v;      /* RF_OPTIM_VEC_BLOCK each: one run's moments in f32 (portable kernel) */
  int64_t *blk_k;            /* per block of the group: its scale index, -1: empty */
  float *blk_ms, *blk_vs;    /* its old scales */
  uint32_t *blk_am, *blk_av; /* its new absmax, as bits */
  float *blk_im, *blk_iv;    /* 1 / absmax (0 for 0) */
#if RF_OPTIM_AVX512
  __m512i *blk_um, *blk_uv; /* the new absmax per lane (the AVX-512 kernels) */
#endif
  int64_t max_blocks; /* blocks in a group, at most */
  /* where the backend steps it with kernels (its adamw8bit_step): the plan, its device copy (one
   * allocation: views, blocks, tables) and the host bytes it was copied from (kept until free) */
  struct rf_optim_8bit_plan plan;
  void *plan_dev, *plan_host;
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

static int64_t rf_optim_8bit_align(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* The plan of the backend's kernels (struct rf_optim_8bit_plan): a block per scale in scale
 * order, the views, quant.c's tables, copied once to the device on the optimizer's stream. */
static int rf_optim_8bit_plan_make(struct rf_optim *o, struct rf_optim_8bit *q) {
  const int64_t nb = q->n_scales, buckets = RF_OPTIM_QBUCKETS;
  const int64_t at_views = 0,
                at_blocks = rf_optim_8bit_align((int64_t)sizeof(struct rf_optim_8bit_cuda_view) * o->n),
                at_maps =
                    at_blocks + rf_optim_8bit_align((int64_t)sizeof(struct rf_optim_8bit_cuda_block) * nb),
                at_ents = at_maps + rf_optim_8bit_align(2 * 256 * (int64_t)sizeof(float)),
                bytes = at_ents + 4 * buckets * (int64_t)sizeof(uint32_t);
  float *p = NULL;
  const float *g = NULL;
  for (int i = 0; i < o->n; i++) { /* the slabs: one master and one gradient at the shard's offsets */
    const struct rf_optim_view *w = &o->views[i];
    if (w->v.end == w->v.begin) continue;
    if (!p) {
      p = w->v.master - w->v.shard_offset;
      g = w->v.grad - w->v.shard_offset;
    }
    RF_REQUIRE(w->v.master == p + w->v.shard_offset && w->v.grad == g + w->v.shard_offset,
               "--optim adamw8bit on device %s: view %d (%s) is not in the shard's master and gradient slabs "
               "at its shard offset",
               o->dev->backend->name, i, w->v.name ? w->v.name : "?");
  }
  char *host = rf_xcalloc(1, (size_t)bytes);
  struct rf_optim_8bit_cuda_view *hv = (void *)(host + at_views);
  struct rf_optim_8bit_cuda_block *hb = (void *)(host + at_blocks);
  int64_t k = 0;
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    hv[i] = (struct rf_optim_8bit_cuda_view){.begin = w->v.begin,
                                             .end = w->v.end,
                                             .shard_offset = w->v.shard_offset,
                                             .decay = (w->flags & RF_OPTIM_FLAG_DECAY) != 0};
    int64_t first, last;
    rf_optim_block_span(w, &first, &last);
    for (int64_t blk = first; blk < last; blk++) {
      struct rf_optim_runs runs;
      rf_optim_block_runs(w, blk, &runs);
      if (runs.elems == 0) continue;
      struct rf_optim_8bit_cuda_block *b = &hb[k++];
      b->view = i;
      if (w->cols == 0) {
        b->first = blk * RF_OPTIM_VEC_BLOCK;
        b->row = w->v.numel;
        b->rows = 1;
        b->cols = (int32_t)rf_min_i64(RF_OPTIM_VEC_BLOCK, w->v.numel - b->first);
      } else {
        int64_t tps = rf_optim_tiles_per_strip(w), r0 = blk / tps * RF_OPTIM_TILE,
                c0 = blk % tps * RF_OPTIM_TILE;
        b->first = r0 * w->cols + c0;
        b->row = w->cols;
        b->rows = (int32_t)rf_min_i64(RF_OPTIM_TILE, w->rows - r0);
        b->cols = (int32_t)rf_min_i64(RF_OPTIM_TILE, w->cols - c0);
      }
    }
  }
  RF_ASSERT(k == nb);
  memcpy(host + at_maps, rf_optim_qmap(1), 256 * sizeof(float));
  memcpy(host + at_maps + 256 * sizeof(float), rf_optim_qmap(0), 256 * sizeof(float));
  memcpy(host + at_ents, rf_optim_qentries(1), 2 * (size_t)buckets * sizeof(uint32_t));
  memcpy(host + at_ents + 2 * buckets * sizeof(uint32_t), rf_optim_qentries(0),
         2 * (size_t)buckets * sizeof(uint32_t));
  char *dev = rf_device_alloc(o->dev, (size_t)bytes, 64);
  rf_device_copy(o->dev, dev, host, (size_t)bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, o->stream);
  q->plan_dev = dev;
  q->plan_host = host;
  q->plan =
      (struct rf_optim_8bit_plan){.p = p,
                                  .g = g,
                                  .views = (const void *)(dev + at_views),
                                  .blocks = (const void *)(dev + at_blocks),
                                  .n_blocks = nb,
                                  .map_s = (const void *)(dev + at_maps),
                                  .map_u = (const void *)(dev + at_maps + 256 * sizeof(float)),
                                  .ent_s = (const void *)(dev + at_ents),
                                  .ent_u = (const void *)(dev + at_ents + 2 * buckets * sizeof(uint32_t)),
                                  .key_lo = RF_OPTIM_QKEY_LO,
                                  .buckets = (int32_t)buckets,
                                  .mq = q->mq,
                                  .vq = q->vq,
                                  .ms = q->ms,
                                  .vs = q->vs};
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
  if (!o->measure) {
    q->mq = rf_device_alloc(o->dev, slab, 64);
    q->vq = rf_device_alloc(o->dev, slab, 64); /* zero-filled: code 0 is 0 */
    rf_device_memset(o->dev, q->mq, q->zero_code_m, slab, o->stream);
  }
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
  q->max_blocks = 1;
  for (int i = 0; i < o->n; i++)
    q->max_blocks = rf_max_i64(q->max_blocks, rf_optim_tiles_per_strip(&o->views[i]));
  o->stats.state_bytes = 2 * o->shard_elems + 2 * q->n_scales * (int64_t)sizeof(float);
  o->stats.workspace_bytes =
      2 * RF_OPTIM_VEC_BLOCK * (int64_t)sizeof(float) +
      q->max_blocks * (int64_t)(sizeof *q->blk_k + 6 * sizeof(float) + 2 * 64 * RF_OPTIM_AVX512);
  if (o->measure) return 0;
  q->ms = rf_device_alloc(o->dev, (size_t)rf_max_i64(q->n_scales, 1) * sizeof(float), 64);
  q->vs = rf_device_alloc(o->dev, (size_t)rf_max_i64(q->n_scales, 1) * sizeof(float), 64);
  size_t nb = (size_t)q->max_blocks;
  /* the host kernel's per-block scratch (host memory whatever the device); the state is on the device */
  q->blk_m = rf_xaligned(64, RF_OPTIM_VEC_BLOCK * sizeof(float));
  q->blk_v = rf_xaligned(64, RF_OPTIM_VEC_BLOCK * sizeof(float));
  q->blk_k = rf_xcalloc(nb, sizeof *q->blk_k);
  q->blk_ms = rf_xcalloc(nb, sizeof *q->blk_ms);
  q->blk_vs = rf_xcalloc(nb, sizeof *q->blk_vs);
#if RF_OPTIM_AVX512
  q->blk_um = rf_xaligned(64, nb * sizeof *q->blk_um);
  q->blk_uv = rf_xaligned(64, nb * sizeof *q->blk_uv);
#endif
  q->blk_am = rf_xcalloc(nb, sizeof *q->blk_am);
  q->blk_av = rf_xcalloc(nb, sizeof *q->blk_av);
  q->blk_im = rf_xcalloc(nb, sizeof *q->blk_im);
  q->blk_iv = rf_xcalloc(nb, sizeof *q->blk_iv);
  if (o->dev->backend && o->dev->backend->adamw8bit_step) return rf_optim_8bit_plan_make(o, q);
  return 0;
}

static void rf_optim_8bit_free(struct rf_optim *o) {
  struct rf_optim_8bit *q = o->impl;
  if (!q) return;
  rf_device_release(o->dev, q->plan_dev);
  free(q->plan_host);
  free(q->views);
  rf_device_release(o->dev, q->mq);
  rf_device_release(o->dev, q->vq);
  rf_device_release(o->dev, q->ms);
  rf_device_release(o->dev, q->vs);
  free(q->blk_m);
  free(q->blk_v);
  free(q->blk_k);
  free(q->blk_ms);
  free(q->blk_vs);
#if RF_OPTIM_AVX512
  free(q->blk_um);
  free(q->blk_uv);
#endif
  free(q->blk_am);
  free(q->blk_av);
  free(q->blk_im);
  free(q->blk_iv);
  free(q);
}

/* ---- step ---------------------------------------------------------------------- */

/* The largest of the non-NaN values among |x| by their bits: the order of
 * non-negative floats is that of their bits as unsigned integers (an integer max
 * vectorizes with gcc and clang alike; a float one needs -ffast-math in clang). */
static inline uint32_t rf_optim_absmax_bits(uint32_t acc, float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  b &= 0x7fffffffu;
  b = b <= 0x7f800000u ? b : 0u; /* NaN: ignored */
  return b > acc ? b : acc;
}

/* The kernels work on one run of one block (consecutive elements) with its old
 * scales ms, vs. Pass 1 (update): decode, the moments in f32, the parameter (it
 * uses the f32 moments, as bitsandbytes does), and the maxima of the new moments
 * (as bits) into *am, *av. Pass 2 (encode), once the block's new scales are
 * known: the same moments again (the same expressions on the same codes, so the
 * same bits) encoded with the inverse new scales im, iv; a positive v never
 * encodes to 0 (no m / eps blow-up). Portable kernels first, then AVX-512. */

static void rf_optim_8bit_update(const struct rf_optim_hyper *h, float dec, float gs, float ms, float vs,
                                 float *restrict p, const float *restrict g, const uint8_t *restrict mq,
                                 const uint8_t *restrict vq, int64_t n, uint32_t *am, uint32_t *av) {
  const float *restrict qs = rf_optim_qmap(1), *restrict qu = rf_optim_qmap(0);
  uint32_t um = *am, uv = *av;
#pragma omp simd simdlen(16) reduction(max : um, uv)
  for (int64_t i = 0; i < n; i++) {
    float gi = gs == 1.0f ? g[i] : g[i] * gs;       /* clipped: the bits of the gradient scaled first */
    float m0 = qs[mq[i]] * ms, v0 = qu[vq[i]] * vs; /* own statements: not contracted with what follows */
    float mi = RF_OPTIM_ADAMW_M(m0, gi, h->one_m_b1);
    float vi = RF_OPTIM_ADAMW_V(v0, gi, h->b2, h->one_m_b2);
    um = rf_optim_absmax_bits(um, mi);
    uv = rf_optim_absmax_bits(uv, vi);
    p[i] = RF_OPTIM_ADAMW_P(p[i], dec, h->step_size, mi, sqrtf(vi), h->bc2_sqrt, h->eps);
  }
  *am = um;
  *av = uv;
}

/* bm, bv: n floats of scratch. */
static void rf_optim_8bit_encode(const struct rf_optim_hyper *h, float gs, float ms, float vs, float im,
                                 float iv, const float *restrict g, uint8_t *restrict mq,
                                 uint8_t *restrict vq, float *restrict bm, float *restrict bv, int64_t n) {
  const float *restrict qs = rf_optim_qmap(1), *restrict qu = rf_optim_qmap(0);
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; i++) {
    float gi = gs == 1.0f ? g[i] : g[i] * gs;
    float m0 = qs[mq[i]] * ms, v0 = qu[vq[i]] * vs;
    bm[i] = RF_OPTIM_ADAMW_M(m0, gi, h->one_m_b1);
    bv[i] = RF_OPTIM_ADAMW_V(v0, gi, h->b2, h->one_m_b2);
  }
  rf_optim_quantize_scaled(1, bm, n, im, mq);
  rf_optim_quantize_scaled(0, bv, n, iv, vq);
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; i++) vq[i] = (uint8_t)(vq[i] | ((vq[i] == 0) & (bv[i] > 0.0f)));
}

#if RF_OPTIM_AVX512
/* The hyperparameters broadcast and the tables. */
struct rf_optim_8bit_vec {
  __m512 one_m_b1, b2, one_m_b2, step_size, bc2_sqrt, eps, dec, gs;
  int scaled;              /* the clip factor is not 1: every gradient multiplied by gs */
  const uint8_t *ps, *pu;  /* the maps' byte planes (signed, unsigned) */
  const uint32_t *es, *eu; /* the quantizer's entries */
};

static void rf_optim_8bit_vec_init(const struct rf_optim_hyper *h, float dec, float gs,
                                   struct rf_optim_8bit_vec *c) {
  c->gs = _mm512_set1_ps(gs);
  c->scaled = gs != 1.0f;
  c->one_m_b1 = _mm512_set1_ps(h->one_m_b1);
  c->b2 = _mm512_set1_ps(h->b2);
  c->one_m_b2 = _mm512_set1_ps(h->one_m_b2);
  c->step_size = _mm512_set1_ps(h->step_size);
  c->bc2_sqrt = _mm512_set1_ps(h->bc2_sqrt);
  c->eps = _mm512_set1_ps(h->eps);
  c->dec = _mm512_set1_ps(dec);
  c->ps = rf_optim_qmap_planes(1);
  c->pu = rf_optim_qmap_planes(0);
  c->es = rf_optim_qentries(1);
  c->eu = rf_optim_qentries(0);
}

static inline __mmask64 rf_optim_mask64(int64_t left) {
  return left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
}

/* 16 elements of pass 1 in block j (k: the lanes in the run). */
static inline void rf_optim_8bit_update16(const struct rf_optim_8bit *q, const struct rf_optim_8bit_vec *c,
                                          int64_t j, __mmask16 k, __m512 dm, __m512 dv, float *p,
                                          const float *g) {
  const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  __m512 gi = _mm512_maskz_loadu_ps(k, g), pi = _mm512_maskz_loadu_ps(k, p);
  if (c->scaled) gi = _mm512_mul_ps(gi, c->gs);
  __m512 m0 = dm * _mm512_set1_ps(q->blk_ms[j]), v0 = dv * _mm512_set1_ps(q->blk_vs[j]);
  __m512 mi = RF_OPTIM_ADAMW_M(m0, gi, c->one_m_b1);
  __m512 vi = RF_OPTIM_ADAMW_V(v0, gi, c->b2, c->one_m_b2);
  __m512i bm = _mm512_and_si512(_mm512_castps_si512(mi), abs),
          bv = _mm512_and_si512(_mm512_castps_si512(vi), abs);
  __m512i *um = &q->blk_um[j], *uv = &q->blk_uv[j];
  *um = _mm512_mask_max_epu32(*um, _mm512_mask_cmple_epu32_mask(k, bm, inf), *um, bm); /* NaN: ignored */
  *uv = _mm512_mask_max_epu32(*uv, _mm512_mask_cmple_epu32_mask(k, bv, inf), *uv, bv);
  _mm512_mask_storeu_ps(
      p, k, RF_OPTIM_ADAMW_P(pi, c->dec, c->step_size, mi, _mm512_sqrt_ps(vi), c->bc2_sqrt, c->eps));
}

/* 16 elements of pass 2 in block j: their m and v codes (in 32-bit lanes). */
static inline void rf_optim_8bit_encode16(const struct rf_optim_8bit *q, const struct rf_optim_8bit_vec *c,
                                          int64_t j, __mmask16 k, __m512 dm, __m512 dv, const float *g,
                                          __m512i *cm, __m512i *cv) {
  __m512 gi = _mm512_maskz_loadu_ps(k, g);
  if (c->scaled) gi = _mm512_mul_ps(gi, c->gs);
  __m512 m0 = dm * _mm512_set1_ps(q->blk_ms[j]), v0 = dv * _mm512_set1_ps(q->blk_vs[j]);
  __m512 mi = RF_OPTIM_ADAMW_M(m0, gi, c->one_m_b1);
  __m512 vi = RF_OPTIM_ADAMW_V(v0, gi, c->b2, c->one_m_b2);
  *cm = rf_optim_quantize16(c->es, _mm512_mul_ps(mi, _mm512_set1_ps(q->blk_im[j])));
  __m512i v = rf_optim_quantize16(c->eu, _mm512_mul_ps(vi, _mm512_set1_ps(q->blk_iv[j])));
  __mmask16 lift = _mm512_cmpeq_epi32_mask(v, _mm512_setzero_si512()) &
                   _mm512_cmp_ps_mask(vi, _mm512_setzero_ps(), _CMP_GT_OQ);
  *cv = _mm512_mask_mov_epi32(v, lift, _mm512_set1_epi32(1));
}

/* Pass 1 or 2 over n consecutive elements of a row, 64 at a time (codes decoded
 * with byte permutes, rf_optim_decode64; the arithmetic the same expressions on
 * __m512): all in block j0, or (`tiles`) starting at the left edge of block j0
 * and crossing into the next blocks every RF_OPTIM_TILE elements. */
static void rf_optim_8bit_run_avx512(const struct rf_optim_8bit *q, const struct rf_optim_8bit_vec *c,
                                     int pass, float *p, const float *g, uint8_t *mq, uint8_t *vq, int64_t n,
                                     int64_t j0, int tiles) {
  for (int64_t i = 0; i < n; i += 64) {
    __mmask64 k64 = rf_optim_mask64(n - i);
    __m512 dm[4], dv[4];
    rf_optim_decode64(c->ps, rf_optim_decode64_order(_mm512_maskz_loadu_epi8(k64, mq + i)), &dm[0], &dm[1],
                      &dm[2], &dm[3]);
    rf_optim_decode64(c->pu, rf_optim_decode64_order(_mm512_maskz_loadu_epi8(k64, vq + i)), &dv[0], &dv[1],
                      &dv[2], &dv[3]);
    if (pass == 0) {
      for (int u = 0; u < 4 && n - i > 16 * u; u++)
        rf_optim_8bit_update16(q, c, tiles ? j0 + (i + 16 * u) / RF_OPTIM_TILE : j0,
                               rf_optim_mask16(n - i - 16 * u), dm[u], dv[u], p + i + 16 * u, g + i + 16 * u);
    } else {
      __m512i cm[4], cv[4];
      for (int u = 0; u < 4; u++) {
        cm[u] = cv[u] = _mm512_setzero_si512();
        if (n - i > 16 * u)
          rf_optim_8bit_encode16(q, c, tiles ? j0 + (i + 16 * u) / RF_OPTIM_TILE : j0,
                                 rf_optim_mask16(n - i - 16 * u), dm[u], dv[u], g + i + 16 * u, &cm[u],
                                 &cv[u]);
      }
      _mm512_mask_storeu_epi8(mq + i, k64, rf_optim_codes64(cm[0], cm[1], cm[2], cm[3]));
      _mm512_mask_storeu_epi8(vq + i, k64, rf_optim_codes64(cv[0], cv[1], cv[2], cv[3]));
    }
  }
}
#endif

/* A group of blocks stepped together: the 32-row strip of a matrix (its tiles
 * side by side) or one block of a vector, [glo, ghi) of the tensor's elements,
 * rows of `row` elements cut in blocks `width` wide (a vector: one row, one block).
 * Row by row, so that the reads stream; pass 1 over the whole group, then pass 2.
 * `k` is the scale index of its first nonempty block; returns the next one. */
static int64_t rf_optim_8bit_group(struct rf_optim_8bit *q, const struct rf_optim_hyper *h, float gs,
                                   const struct rf_optim_view *w, float *p, const float *g, int64_t glo,
                                   int64_t ghi, int64_t row, int64_t width, int64_t k) {
  const int64_t b = w->v.begin, nb = rf_ceil_div(row, width);
  uint8_t *mq = q->mq + w->v.shard_offset, *vq = q->vq + w->v.shard_offset;
  const float dec = (w->flags & RF_OPTIM_FLAG_DECAY) ? h->decay : 1.0f;
#if RF_OPTIM_AVX512
  const int simd = rf_optim_simd_get();
  struct rf_optim_8bit_vec c;
  rf_optim_8bit_vec_init(h, dec, gs, &c);
#endif
  /* the nonempty blocks, their scale indices (in block order) and old scales */
  for (int64_t j = 0; j < nb; j++) q->blk_k[j] = -1;
  for (int64_t r = glo / row; r * row < ghi; r++) {
    int64_t lo = rf_max_i64(glo, r * row), hi = rf_min_i64(ghi, (r + 1) * row);
    for (int64_t j = (lo - r * row) / width; j * width < hi - r * row; j++) q->blk_k[j] = 0;
  }
  for (int64_t j = 0; j < nb; j++)
    if (q->blk_k[j] == 0) {
      q->blk_k[j] = k++;
      q->blk_ms[j] = q->ms[q->blk_k[j]];
      q->blk_vs[j] = q->vs[q->blk_k[j]];
      q->blk_am[j] = q->blk_av[j] = 0;
#if RF_OPTIM_AVX512
      q->blk_um[j] = q->blk_uv[j] = _mm512_setzero_si512();
#endif
    }
  for (int pass = 0; pass < 2; pass++) {
    for (int64_t r = glo / row; r * row < ghi; r++) {
      int64_t lo = rf_max_i64(glo, r * row), hi = rf_min_i64(ghi, (r + 1) * row);
#if RF_OPTIM_AVX512
      if (simd) { /* the piece of a block the row starts in, then whole blocks */
        int64_t j0 = (lo - r * row) / width, edge = rf_min_i64(hi, r * row + (j0 + 1) * width);
        if (lo - r * row != j0 * width || width != RF_OPTIM_TILE) {
          rf_optim_8bit_run_avx512(q, &c, pass, p + lo - b, g + lo - b, mq + lo - b, vq + lo - b, edge - lo,
                                   j0, 0);
          lo = edge;
          j0++;
        }
        if (hi > lo)
          rf_optim_8bit_run_avx512(q, &c, pass, p + lo - b, g + lo - b, mq + lo - b, vq + lo - b, hi - lo, j0,
                                   1);
        continue;
      }
#endif
      for (int64_t j = (lo - r * row) / width; j * width < hi - r * row; j++) {
        int64_t a = rf_max_i64(lo, r * row + j * width) - b,
                n = rf_min_i64(hi, r * row + (j + 1) * width) - b - a;
        if (pass == 0)
          rf_optim_8bit_update(h, dec, gs, q->blk_ms[j], q->blk_vs[j], p + a, g + a, mq + a, vq + a, n,
                               &q->blk_am[j], &q->blk_av[j]);
        else
          rf_optim_8bit_encode(h, gs, q->blk_ms[j], q->blk_vs[j], q->blk_im[j], q->blk_iv[j], g + a, mq + a,
                               vq + a, q->blk_m, q->blk_v, n);
      }
    }
    for (int64_t j = 0; j < nb; j++) {
      if (q->blk_k[j] < 0) continue;
#if RF_OPTIM_AVX512
      if (simd && pass == 0) {
        q->blk_am[j] = _mm512_reduce_max_epu32(q->blk_um[j]);
        q->blk_av[j] = _mm512_reduce_max_epu32(q->blk_uv[j]);
      }
#endif
      float am, av;
      memcpy(&am, &q->blk_am[j], sizeof am);
      memcpy(&av, &q->blk_av[j], sizeof av);
      if (pass == 0) {
        q->blk_im[j] = am > 0.0f ? 1.0f / am : 0.0f;
        q->blk_iv[j] = av > 0.0f ? 1.0f / av : 0.0f;
      } else {
        q->ms[q->blk_k[j]] = am;
        q->vs[q->blk_k[j]] = av;
      }
    }
  }
  return k;
}

/* The step is host code on device memory: launched on the optimizer's stream (the host: at once;
 * the checked device: on its worker, later), reaching the parameters, the gradients and the state
 * through the device's views. The hyperparameters are taken at the call; the clip factor
 * (h.gscale, device memory: rf_optim_step_fsdp_launch) is read when the step runs: every gradient
 * multiplied by it (the bits of the gradients clipped in place first), NaN (a non-finite norm):
 * nothing changes. Where the backend has the step as kernels (adamw8bit_step: CUDA), the plan
 * made at create goes to them instead, with the same factor. */
struct rf_optim_8bit_launch {
  const struct rf_optim *o;
  struct rf_optim_hyper h;
};

static void rf_optim_8bit_launched(void *arg) {
  const struct rf_optim_8bit_launch *a = arg;
  const struct rf_optim *o = a->o;
  const float clip = a->h.gscale ? *(const float *)rf_device_view(o->dev, a->h.gscale) : 1.0f;
  if (isnan(clip)) return;                                   /* a non-finite norm: the step skipped */
  struct rf_optim_8bit q = *(struct rf_optim_8bit *)o->impl; /* its state as the host code reaches it */
  q.mq = rf_device_view(o->dev, q.mq);
  q.vq = rf_device_view(o->dev, q.vq);
  q.ms = rf_device_view(o->dev, q.ms);
  q.vs = rf_device_view(o->dev, q.vs);
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    int64_t b = w->v.begin, e = w->v.end, k = q.views[i].scale_off;
    if (e == b) continue;
    float *p = rf_device_view(o->dev, w->v.master);
    const float *g = rf_device_view(o->dev, w->v.grad);
    if (w->cols == 0) {
      for (int64_t blk = b / RF_OPTIM_VEC_BLOCK; blk * RF_OPTIM_VEC_BLOCK < e; blk++)
        k = rf_optim_8bit_group(&q, &a->h, clip, w, p, g, rf_max_i64(b, blk * RF_OPTIM_VEC_BLOCK),
                                rf_min_i64(e, (blk + 1) * RF_OPTIM_VEC_BLOCK), RF_OPTIM_VEC_BLOCK,
                                RF_OPTIM_VEC_BLOCK, k);
    } else {
      int64_t strip = RF_OPTIM_TILE * w->cols;
      for (int64_t s = b / strip; s * strip < e; s++)
        k = rf_optim_8bit_group(&q, &a->h, clip, w, p, g, rf_max_i64(b, s * strip),
                                rf_min_i64(e, (s + 1) * strip), w->cols, RF_OPTIM_TILE, k);
    }
    RF_ASSERT(k == q.views[i].scale_off + q.views[i].n_blocks);
  }
}

static int rf_optim_8bit_step(struct rf_optim *o, float lr) {
  struct rf_optim_8bit_launch a = {.o = o};
  rf_optim_hyper_init(o, lr, &a.h);
  const struct rf_optim_8bit *q = o->impl;
  if (q->plan_dev) { /* the backend's kernels (CUDA): the same bits */
    o->dev->backend->adamw8bit_step(&q->plan, &a.h, o->stream);
    return 0;
  }
  rf_device_launch(o->dev, o->stream, "--optim adamw8bit", rf_optim_8bit_launched, &a, sizeof a);
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

static int rf_optim_8bit_on_device(const struct rf_device *dev) {
  return dev->backend && dev->backend->adamw8bit_step;
}

const struct rf_optim_ops rf_optim_adamw8bit_ops = {
    .name = "adamw8bit",
    .block_rows = RF_OPTIM_TILE,
    .vector_block = RF_OPTIM_VEC_BLOCK,
    .n_states = 4,
    .host_code = 1,
    .device_clip = 1, /* rf_optim_8bit_launched and the CUDA kernel read the clip factor */
    .on_device = rf_optim_8bit_on_device,
    /* read p, g (f32), m, v (a byte each); write p, m, v */
    .elem_bytes = 16,
    .matrix_elem_bytes = 0,
    .create = rf_optim_8bit_create,
    .step = rf_optim_8bit_step,
    .state = rf_optim_8bit_state,
    .free = rf_optim_8bit_free,
    .scales = rf_optim_8bit_scales,
    .tensor_blocks = rf_optim_8bit_tensor_blocks,
};
