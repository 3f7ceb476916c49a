/* src/optim: AdamW with f32 state (torch.optim.AdamW's arithmetic), and the
 * pieces of it that 8-bit AdamW and Muon's other views share. */
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "optim/optim.h"

void rf_optim_hyper_init(const struct rf_optim *o, float lr, struct rf_optim_hyper *h) {
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
  h->gscale = o->gscale;
}

/* torch.optim.AdamW's arithmetic (RF_OPTIM_ADAMW_*). */
static void rf_optim_adamw_chunk(const struct rf_optim_hyper *h, float dec, float gs, float *restrict p,
                                 const float *restrict g, float *restrict m, float *restrict v, int64_t len) {
#pragma omp simd
  for (int64_t i = 0; i < len; i++) {
    float gi = gs == 1.0f ? g[i] : g[i] * gs; /* clipped: the bits of the gradient scaled first */
    float mi = RF_OPTIM_ADAMW_M(m[i], gi, h->one_m_b1);
    float vi = RF_OPTIM_ADAMW_V(v[i], gi, h->b2, h->one_m_b2);
    m[i] = mi;
    v[i] = vi;
    p[i] = RF_OPTIM_ADAMW_P(p[i], dec, h->step_size, mi, sqrtf(vi), h->bc2_sqrt, h->eps);
  }
}

/* Element-wise, so the same bits with any number of threads: chunks on the
 * threads, each a simd loop (a combined "parallel for simd" over captured
 * pointers does not vectorize under clang with -fno-strict-aliasing). */
void rf_optim_adamw_host_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g, float *m,
                               float *v, int64_t len, struct rf_device_stream *stream) {
  (void)stream; /* the host runs it now */
  const float dec = decay ? h->decay : 1.0f;
  const float gs = h->gscale ? *h->gscale : 1.0f; /* host memory here (the launch views it) */
  if (isnan(gs)) return;                          /* a non-finite norm: skipped */
  const int64_t chunk = 65536, chunks = rf_ceil_div(len, chunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; c++) {
    int64_t i = c * chunk;
    rf_optim_adamw_chunk(h, dec, gs, p + i, g + i, m + i, v + i, rf_min_i64(chunk, len - i));
  }
}

struct rf_optim_adamw_launch {
  struct rf_optim_hyper h; /* a copy: the launch runs later */
  int decay;
  struct rf_device *dev;
  float *p, *m, *v;
  const float *g;
  int64_t len;
};

static void rf_optim_adamw_launched(void *arg) {
  const struct rf_optim_adamw_launch *a = arg;
  struct rf_optim_hyper h = a->h;
  h.gscale = rf_device_view(a->dev, h.gscale); /* NULL stays NULL */
  rf_optim_adamw_host_piece(&h, a->decay, rf_device_view(a->dev, a->p), rf_device_view(a->dev, a->g),
                            rf_device_view(a->dev, a->m), rf_device_view(a->dev, a->v), a->len, NULL);
}

void rf_optim_adamw_launch_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g,
                                 float *m, float *v, int64_t len, struct rf_device_stream *stream) {
  RF_ASSERT(stream && stream->dev);
  struct rf_optim_adamw_launch a = {*h, decay, stream->dev, p, m, v, g, len};
  rf_device_stream_launch(stream, "AdamW (the host loop)", rf_optim_adamw_launched, &a, sizeof a);
}

/* 1 when view i's master and grad lie at its shard offset from view b's (one slab each, as the
 * runtime lays them out): the shard kernels reach both from b's pointers. */
static int rf_optim_adamw_in_slab(const struct rf_optim *o, int b, int i) {
  const struct rf_tensor_view *x = &o->views[b].v, *y = &o->views[i].v;
  uintptr_t d = (uintptr_t)((y->shard_offset - x->shard_offset) * (int64_t)sizeof(float));
  return (uintptr_t)y->master - (uintptr_t)x->master == d && (uintptr_t)y->grad - (uintptr_t)x->grad == d;
}

static void rf_optim_adamw_groups_free(struct rf_optim *o, struct rf_optim_adamw_state *a);

/* The views not flagged MATRIX, in runs of one unit, each a plan of the backend's shard_adamw;
 * none when a view is not in the slab of its run's base. */
static void rf_optim_adamw_groups(struct rf_optim *o, struct rf_optim_adamw_state *a) {
  const struct rf_backend *b = o->dev->backend;
  if (o->measure || !b || !b->shard_adamw || o->n == 0) return;
  struct rf_shard_piece *pieces = rf_xcalloc((size_t)o->n, sizeof *pieces);
  a->groups = rf_xcalloc((size_t)o->n, sizeof *a->groups);
  int apart = 0; /* a view of its own memory: a launch per piece */
  for (int i0 = 0, i1; i0 < o->n && !apart; i0 = i1) {
    int base = -1;
    for (i1 = i0; i1 < o->n && o->views[i1].v.unit == o->views[i0].v.unit; i1++) {
      const struct rf_optim_view *w = &o->views[i1];
      if ((w->flags & RF_OPTIM_FLAG_MATRIX) || w->v.end == w->v.begin) continue;
      if (base < 0 || w->v.shard_offset < o->views[base].v.shard_offset) base = i1;
    }
    if (base < 0) continue; /* nothing of this unit to update here */
    int n = 0;
    for (int i = i0; i < i1 && !apart; i++) {
      const struct rf_optim_view *w = &o->views[i];
      if ((w->flags & RF_OPTIM_FLAG_MATRIX) || w->v.end == w->v.begin) continue;
      apart = !rf_optim_adamw_in_slab(o, base, i);
      pieces[n++] = (struct rf_shard_piece){.offset = w->v.shard_offset - o->views[base].v.shard_offset,
                                            .len = w->v.end - w->v.begin,
                                            .decay = !!(w->flags & RF_OPTIM_FLAG_DECAY)};
    }
    if (apart) break;
    struct rf_optim_adamw_group *g = &a->groups[a->n_groups++];
    g->base = base;
    g->plan = rf_xcalloc(1, sizeof *g->plan);
    b->shard_plan(o->dev, g->plan, pieces, n, o->stream);
  }
  free(pieces);
  if (apart) rf_optim_adamw_groups_free(o, a);
}

static void rf_optim_adamw_groups_free(struct rf_optim *o, struct rf_optim_adamw_state *a) {
  for (int k = 0; k < a->n_groups; k++) {
    o->dev->backend->shard_plan_free(o->dev, a->groups[k].plan);
    free(a->groups[k].plan);
  }
  free(a->groups);
  a->groups = NULL;
  a->n_groups = 0;
}

void rf_optim_adamw_state_init(struct rf_optim *o, struct rf_optim_adamw_state *a) {
  size_t slab = (size_t)rf_max_i64(o->shard_elems, 1);
  if (!o->measure) {
    a->m = rf_device_alloc(o->dev, slab * sizeof(float), 64); /* zero-filled */
    a->v = rf_device_alloc(o->dev, slab * sizeof(float), 64);
  }
  o->stats.state_bytes = 2 * o->shard_elems * (int64_t)sizeof(float);
  rf_optim_adamw_groups(o, a);
}

void rf_optim_adamw_state_free(struct rf_optim *o, struct rf_optim_adamw_state *a) {
  rf_optim_adamw_groups_free(o, a);
  rf_device_release(o->dev, a->m);
  rf_device_release(o->dev, a->v);
}

void rf_optim_adamw_state_step(struct rf_optim *o, struct rf_optim_adamw_state *a, float lr) {
  struct rf_optim_hyper h;
  rf_optim_hyper_init(o, lr, &h);
  for (int k = 0; k < a->n_groups; k++) { /* a launch per unit: its pieces together */
    const struct rf_tensor_view *b = &o->views[a->groups[k].base].v;
    o->dev->backend->shard_adamw(&h, b->master, b->grad, a->m + b->shard_offset, a->v + b->shard_offset,
                                 a->groups[k].plan, o->stream);
  }
  for (int i = 0; i < o->n && a->n_groups == 0; i++) {
    const struct rf_optim_view *w = &o->views[i];
    int64_t len = w->v.end - w->v.begin;
    if ((w->flags & RF_OPTIM_FLAG_MATRIX) || len == 0) continue;
    o->dev->backend->adamw_piece(&h, w->flags & RF_OPTIM_FLAG_DECAY, w->v.master, w->v.grad,
                                 a->m + w->v.shard_offset, a->v + w->v.shard_offset, len, o->stream);
  }
}

void rf_optim_adamw_state_slab(const struct rf_optim *o, const struct rf_optim_adamw_state *a, int i,
                               struct rf_optim_state_slab *out) {
  out->name = i == 0 ? "m" : "v";
  out->data = i == 0 ? a->m : a->v;
  out->dtype = RF_DTYPE_F32;
  out->count = o->shard_elems;
  out->shard_layout = 1;
}

/* ---- the optimizer ------------------------------------------------------------ */

static int rf_optim_adamw_create(struct rf_optim *o) {
  struct rf_optim_adamw_state *a = rf_xcalloc(1, sizeof *a);
  o->impl = a;
  rf_optim_adamw_state_init(o, a);
  for (int i = 0; i < o->n; i++) o->stats.state_bytes_used += 8 * (o->views[i].v.end - o->views[i].v.begin);
  return 0;
}

static int rf_optim_adamw_step(struct rf_optim *o, float lr) {
  rf_optim_adamw_state_step(o, o->impl, lr);
  return 0;
}

static void rf_optim_adamw_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  rf_optim_adamw_state_slab(o, o->impl, i, out);
}

static void rf_optim_adamw_free(struct rf_optim *o) {
  if (!o->impl) return;
  rf_optim_adamw_state_free(o, o->impl);
  free(o->impl);
}

const struct rf_optim_ops rf_optim_adamw_ops = {
    .name = "adamw",
    .block_rows = 1,
    .vector_block = 1,
    .n_states = 2,
    .device_clip = 1,
    /* read p, g, m, v; write p, m, v (f32) */
    .elem_bytes = 28,
    .matrix_elem_bytes = 0,
    .create = rf_optim_adamw_create,
    .step = rf_optim_adamw_step,
    .state = rf_optim_adamw_state,
    .free = rf_optim_adamw_free,
};
