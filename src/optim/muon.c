/* src/optim: Muon (torch.optim.Muon's arithmetic: momentum with Nesterov, the
 * update orthogonalized by Newton-Schulz and scaled to AdamW's RMS) on the views
 * flagged MATRIX, each matrix whole on its owner rank through the matrix-owner
 * transport (owners.c); AdamW with f32 state on the other views. A 3-D view
 * [n, rows, cols] (fused MoE experts) is n matrices, each its own owner's. */
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "optim/optim.h"

/* One matrix: a 2-D view, or one of the shape[0] matrices [shape[1], shape[2]] of a
 * 3-D view (fused experts: each expert's matrix is orthogonalized on its own). */
struct rf_optim_muon_matrix {
  int view;
  float lr_adjust; /* adjusted lr = lr * lr_adjust */
  int64_t ns_count;
  int64_t off, rows, cols; /* where it starts in the view's tensor, and its shape */
};

struct rf_optim_muon {
  struct rf_optim_adamw_state s; /* m: the momentum of MATRIX views, AdamW's m elsewhere; v: AdamW's */
  struct rf_optim_muon_matrix *mats;
  int n_mats;
  int *matrix_of;  /* o->n: the (first) matrix index of a view, or -1 */
  int64_t *starts; /* [n_mats, world + 1]: every rank's range of each matrix of a 3-D view */
  struct rf_optim_owners *owners;
  float lr; /* of the step in progress */
  struct rf_optim *o;
  /* where the backend has Muon's kernels (muon_momentum, muon_apply: CUDA): a device buffer of the
   * largest piece, between the kernels and the transport's host staging (a copy each way) */
  float *dstage;
  /* where it has Newton-Schulz (muon_newton_schulz): the largest matrix, its work and the sum of
   * squares in device memory; an owned matrix goes there from the host staging and back (a copy
   * each way, the way back a host wait) */
  float *dns_x, *dns_work;
  double *dns_ss;
};

static int rf_optim_muon_check_view(const struct rf_optim *o, const struct rf_tensor_view *v, int i) {
  const char *nm = v->name ? v->name : "?";
  RF_REQUIRE(v->ndim == 2 || v->ndim == 3,
             "optim: Muon view %d (%s) is %d-D; Muon takes 2-D matrices (or 3-D: a stack of them)", i, nm,
             v->ndim);
  RF_REQUIRE(v->starts, "optim: Muon view %d (%s) has no starts", i, nm);
  RF_REQUIRE(v->starts[0] == 0 && v->starts[o->world] == v->numel,
             "optim: Muon view %d (%s): starts do not cover the tensor", i, nm);
  for (int r = 0; r < o->world; r++)
    RF_REQUIRE(v->starts[r] <= v->starts[r + 1], "optim: Muon view %d (%s): starts decrease at rank %d", i,
               nm, r);
  RF_REQUIRE(v->starts[o->rank] == v->begin && v->starts[o->rank + 1] == v->end,
             "optim: Muon view %d (%s): starts disagree with the local range", i, nm);
  RF_REQUIRE(v->shape[v->ndim - 2] <= INT32_MAX && v->shape[v->ndim - 1] <= INT32_MAX,
             "optim: Muon view %d (%s) too large", i, nm);
  return 0;
}

/* The matrices of a MATRIX view: 1, or shape[0] for a 3-D view. */
static int64_t rf_optim_muon_subs(const struct rf_optim_view *w) {
  return w->v.ndim == 3 ? w->v.shape[0] : 1;
}

/* Matrix x's piece on this rank: [*lo, *hi) of the view's tensor (empty when hi <= lo). */
static void rf_optim_muon_piece(const struct rf_optim_view *w, const struct rf_optim_muon_matrix *x,
                                int64_t *lo, int64_t *hi) {
  *lo = rf_max_i64(w->v.begin, x->off);
  *hi = rf_min_i64(w->v.end, x->off + x->rows * x->cols);
}

static int rf_optim_muon_create(struct rf_optim *o) {
  RF_REQUIRE(o->comm, "optim: Muon needs a communicator");
  RF_REQUIRE(o->opt.muon_ns_steps >= 0 && o->opt.muon_ns_steps < 100, "optim: %d Newton-Schulz steps",
             o->opt.muon_ns_steps);
  for (int i = 0; i < o->n; i++)
    if ((o->views[i].flags & RF_OPTIM_FLAG_MATRIX) && rf_optim_muon_check_view(o, &o->views[i].v, i) != 0)
      return -1;
  struct rf_optim_muon *mu = rf_xcalloc(1, sizeof *mu);
  o->impl = mu;
  mu->o = o;
  rf_optim_adamw_state_init(o, &mu->s);
  size_t nn = (size_t)(o->n > 0 ? o->n : 1), n_mats = 1;
  for (int i = 0; i < o->n; i++)
    if (o->views[i].flags & RF_OPTIM_FLAG_MATRIX) n_mats += (size_t)rf_optim_muon_subs(&o->views[i]);
  mu->mats = rf_xcalloc(n_mats, sizeof *mu->mats);
  mu->matrix_of = rf_xmalloc(nn * sizeof(int));
  mu->starts = rf_xcalloc(n_mats * (size_t)(o->world + 1), sizeof(int64_t));
  struct rf_optim_owners_matrix *desc = rf_xcalloc(n_mats, sizeof *desc);
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    int64_t len = w->v.end - w->v.begin;
    mu->matrix_of[i] = -1;
    if (!(w->flags & RF_OPTIM_FLAG_MATRIX)) {
      o->stats.state_bytes_used += 8 * len;
      continue;
    }
    o->stats.state_bytes_used += 4 * len;
    int64_t a = w->v.shape[w->v.ndim - 2], b = w->v.shape[w->v.ndim - 1];
    mu->matrix_of[i] = mu->n_mats;
    for (int64_t e = 0; e < rf_optim_muon_subs(w); e++) {
      struct rf_optim_muon_matrix *x = &mu->mats[mu->n_mats];
      *x = (struct rf_optim_muon_matrix){.view = i, .off = e * a * b, .rows = a, .cols = b};
      x->lr_adjust = o->opt.muon_scale == RF_OPTIM_MUON_SCALE_MATCH_RMS_ADAMW
                         ? (float)(0.2 * sqrt((double)rf_max_i64(a, b)))
                         : (float)sqrt(fmax(1.0, (double)a / (double)b));
      /* every rank's range of this matrix, from the view's */
      int64_t *st = mu->starts + (size_t)mu->n_mats * (size_t)(o->world + 1);
      for (int r = 0; r <= o->world; r++) st[r] = rf_min_i64(rf_max_i64(w->v.starts[r] - x->off, 0), a * b);
      desc[mu->n_mats] =
          (struct rf_optim_owners_matrix){.rows = a,
                                          .cols = b,
                                          .starts = st,
                                          .group = w->v.unit,
                                          .cost = rf_optim_ns_flops(a, b, o->opt.muon_ns_steps),
                                          .work = rf_optim_newton_schulz_work(a, b)};
      mu->n_mats++;
    }
  }
  rf_optim_owners_create(&mu->owners, o->comm, o->dev, o->stream, desc, mu->n_mats, o->opt.muon_overlap,
                         o->measure);
  if (!o->measure && o->dev->backend && o->dev->backend->muon_momentum) {
    int64_t most = 1;
    for (int k = 0; k < mu->n_mats; k++) {
      int64_t lo, hi;
      rf_optim_muon_piece(&o->views[mu->mats[k].view], &mu->mats[k], &lo, &hi);
      most = rf_max_i64(most, hi - lo);
    }
    mu->dstage = rf_device_alloc(o->dev, (size_t)most * sizeof(float), 64);
    o->stats.workspace_bytes += most * (int64_t)sizeof(float);
  }
  if (!o->measure && o->dev->backend && o->dev->backend->muon_newton_schulz && mu->n_mats > 0) {
    int64_t most = 1, work = 1;
    for (int k = 0; k < mu->n_mats; k++) {
      most = rf_max_i64(most, mu->mats[k].rows * mu->mats[k].cols);
      work = rf_max_i64(work, rf_optim_newton_schulz_device_work(mu->mats[k].rows, mu->mats[k].cols));
    }
    mu->dns_x = rf_device_alloc(o->dev, (size_t)most * sizeof(float), 256);
    mu->dns_work = rf_device_alloc(o->dev, (size_t)work * sizeof(float), 256);
    mu->dns_ss = rf_device_alloc(o->dev, sizeof(double), 256);
    o->stats.workspace_bytes += (most + work) * (int64_t)sizeof(float) + (int64_t)sizeof(double);
  }
  free(desc);
  struct rf_optim_owners_stats ts;
  rf_optim_owners_get_stats(mu->owners, &ts);
  o->stats.workspace_bytes += ts.workspace_bytes;
  return 0;
}

static void rf_optim_muon_free(struct rf_optim *o) {
  struct rf_optim_muon *mu = o->impl;
  if (!mu) return;
  rf_optim_adamw_state_free(o, &mu->s);
  rf_device_release(o->dev, mu->dstage);
  rf_device_release(o->dev, mu->dns_x);
  rf_device_release(o->dev, mu->dns_work);
  rf_device_release(o->dev, mu->dns_ss);
  rf_optim_owners_free(mu->owners);
  free(mu->mats);
  free(mu->matrix_of);
  free(mu->starts);
  free(mu);
}

/* ---- the three stages the transport calls ---------------------------------------- */

/* Momentum (torch.optim.Muon: buf.lerp_(g, 1 - mu); update = g.lerp(buf, mu) with
 * Nesterov, else buf) of this rank's piece, into the transport's staging. */
static void rf_optim_muon_pack(void *ctx, int k, float *u) {
  struct rf_optim_muon *mu = ctx;
  const struct rf_optim *o = mu->o;
  const struct rf_optim_view *w = &o->views[mu->mats[k].view];
  int64_t lo, hi;
  rf_optim_muon_piece(w, &mu->mats[k], &lo, &hi);
  int64_t len = hi - lo;
  if (mu->dstage) { /* the backend's kernel into the device buffer, then to the staging: one wait */
    if (len <= 0) return;
    o->dev->backend->muon_momentum(mu->s.m + w->v.shard_offset + (lo - w->v.begin),
                                   w->v.grad + (lo - w->v.begin), mu->dstage, len, o->opt.muon_momentum,
                                   o->opt.muon_nesterov, o->stream);
    rf_device_copy(o->dev, u, mu->dstage, (size_t)len * sizeof(float), RF_DEVICE_COPY_DEVICE_TO_HOST,
                   o->stream);
    return;
  }
  float m = o->opt.muon_momentum, om = 1.0f - m;
  const float *g = (const float *)rf_device_view(o->dev, w->v.grad) + (lo - w->v.begin);
  float *buf = (float *)rf_device_view(o->dev, mu->s.m) + w->v.shard_offset + (lo - w->v.begin);
  for (int64_t i = 0; i < len; i++) {
    float b = buf[i] + om * (g[i] - buf[i]);
    buf[i] = b;
    u[i] = o->opt.muon_nesterov ? b - (b - g[i]) * om : b;
  }
}

static void rf_optim_muon_compute(void *ctx, int k, float *x, float *work, void (*poll)(void *),
                                  void *poll_arg) {
  struct rf_optim_muon *mu = ctx;
  struct rf_optim *o = mu->o;
  uint64_t t0 = rf_time_ns();
  int64_t rows = mu->mats[k].rows, cols = mu->mats[k].cols;
  if (mu->dns_x) { /* on the device: the staging there, the iteration, back (one wait) */
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    rf_device_copy(o->dev, mu->dns_x, x, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, o->stream);
    o->dev->backend->muon_newton_schulz(mu->dns_x, rows, cols, o->opt.muon_ns_steps, o->opt.muon_ns_eps,
                                        mu->dns_work, mu->dns_ss, o->stream);
    rf_device_copy(o->dev, x, mu->dns_x, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, o->stream);
    o->stats.muon_ns_flops += rf_optim_ns_flops(rows, cols, o->opt.muon_ns_steps);
  } else {
    o->stats.muon_ns_flops +=
        rf_optim_newton_schulz(x, rows, cols, o->opt.muon_ns_steps, o->opt.muon_ns_eps, work, poll, poll_arg);
  }
  o->stats.muon_ns_time_ns += rf_time_ns() - t0;
  o->stats.muon_matrices++;
  mu->mats[k].ns_count++;
}

/* p = p (1 - lr wd) - adjusted lr * orthogonalized update. */
static void rf_optim_muon_unpack(void *ctx, int k, const float *u) {
  struct rf_optim_muon *mu = ctx;
  const struct rf_optim *o = mu->o;
  const struct rf_optim_view *w = &o->views[mu->mats[k].view];
  int64_t lo, hi;
  rf_optim_muon_piece(w, &mu->mats[k], &lo, &hi);
  int64_t len = hi - lo;
  float dec = (w->flags & RF_OPTIM_FLAG_DECAY) ? 1.0f - mu->lr * o->opt.weight_decay : 1.0f;
  float alr = mu->lr * mu->mats[k].lr_adjust;
  if (mu->dstage) { /* the staging to the device buffer (the host's bytes taken at the call), the kernel */
    if (len <= 0) return;
    rf_device_copy(o->dev, mu->dstage, u, (size_t)len * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE,
                   o->stream);
    o->dev->backend->muon_apply(w->v.master + (lo - w->v.begin), mu->dstage, len, dec, alr, o->stream);
    return;
  }
  float *p = (float *)rf_device_view(o->dev, w->v.master) + (lo - w->v.begin);
  for (int64_t i = 0; i < len; i++) p[i] = p[i] * dec - alr * u[i];
}

static int rf_optim_muon_step(struct rf_optim *o, float lr) {
  struct rf_optim_muon *mu = o->impl;
  rf_optim_host_sync(o); /* its stages are host code on the host thread (MPI between them) */
  rf_optim_adamw_state_step(o, &mu->s, lr);
  mu->lr = lr;
  static const struct rf_optim_owners_fns fns = {
      .pack = rf_optim_muon_pack, .compute = rf_optim_muon_compute, .unpack = rf_optim_muon_unpack};
  rf_optim_owners_run(mu->owners, &fns, mu);
  return 0;
}

/* ---- state and stats ------------------------------------------------------------ */

static void rf_optim_muon_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  const struct rf_optim_muon *mu = o->impl;
  rf_optim_adamw_state_slab(o, &mu->s, i, out);
}

static int rf_optim_muon_view_owner(const struct rf_optim *o, int view) {
  const struct rf_optim_muon *mu = o->impl;
  int k = mu->matrix_of[view];
  return k < 0 ? -1 : rf_optim_owners_owner(mu->owners, k);
}

static int64_t rf_optim_muon_view_count(const struct rf_optim *o, int view) {
  const struct rf_optim_muon *mu = o->impl;
  int k = mu->matrix_of[view];
  return k < 0 ? 0 : mu->mats[k].ns_count;
}

static void rf_optim_muon_stats(const struct rf_optim *o, struct rf_optim_stats *out) {
  const struct rf_optim_muon *mu = o->impl;
  struct rf_optim_owners_stats ts;
  rf_optim_owners_get_stats(mu->owners, &ts);
  out->muon_bytes_sent = ts.bytes_sent;
  out->muon_bytes_recv = ts.bytes_recv;
  out->muon_owned_flops = ts.owned_cost;
  out->step_flops = ts.owned_cost; /* Newton-Schulz on the matrices this rank owns */
  out->muon_step_bytes_sent = ts.step_bytes_sent;
  out->muon_step_bytes_recv = ts.step_bytes_recv;
  out->muon_comm_wait_ns = ts.wait_ns;
}

static int rf_optim_muon_on_device(const struct rf_device *dev) {
  return dev->backend && dev->backend->muon_momentum && dev->backend->muon_apply;
}

const struct rf_optim_ops rf_optim_muon_ops = {
    .name = "muon",
    .block_rows = 1,
    .vector_block = 1,
    .n_states = 2,
    .takes_matrices = 1,
    .host_code = 1,
    .on_device = rf_optim_muon_on_device,
    /* AdamW on the others; a matrix piece: momentum in (g, m; m, staging), update out (staging, p; p) */
    .elem_bytes = 28,
    .matrix_elem_bytes = 28,
    .create = rf_optim_muon_create,
    .step = rf_optim_muon_step,
    .state = rf_optim_muon_state,
    .free = rf_optim_muon_free,
    .owner = rf_optim_muon_view_owner,
    .owner_count = rf_optim_muon_view_count,
    .stats = rf_optim_muon_stats,
};
