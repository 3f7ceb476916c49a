/* src/optim: Distributed Shampoo (the algorithm of facebookresearch/optimizers'
 * DistributedShampoo with Adam grafting, written anew) on the views flagged
 * MATRIX, each matrix whole on its owner rank through the matrix-owner transport
 * (owners.c); the owner holds all of the matrix's state. AdamW with f32 state on
 * the other views. See rfsdp_optim.h and docs/optim.md.
 *
 * Per matrix, step t, per block G of at most shampoo_block x shampoo_block:
 *   L = b L + (1 - b) G G^T,  R = b R + (1 - b) G^T G   (b = shampoo_beta2; 1: sums)
 *   m = m + (1 - beta1) (G - m);  v = beta2 v + (1 - beta2) G^2     (element-wise)
 *   Gf = m / (1 - beta1^t);  A = Gf / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 *   every shampoo_every steps: Lr = (L / (1 - b^t))^-1/4, Rr likewise, from an
 *     f64 eigendecomposition Q diag(l) Q^T: l - min(min(l), 0) + shampoo_eps
 *     (identity before the first refresh)
 *   P = Lr Gf Rr * |A| / (|P| + 1e-16)   (|.|: the block's Frobenius norm)
 * and every rank updates its piece: p = p - lr (P + wd p) (wd on DECAY views).
 * A 3-D view [n, rows, cols] (fused MoE experts) is n matrices, each blocked and
 * preconditioned on its own; the n travel together to one owner (the view's
 * state stays one contiguous run on one rank, which the checkpoint needs). */
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gemm/gemm.h"
#include "optim/optim.h"

/* One block of a matrix: rows [r0, r0 + a), columns [c0, c0 + b); its factors
 * and roots at these offsets of the matrix's state. */
struct rf_optim_shampoo_block {
  int64_t r0, c0;
  int a, b;
  int64_t l, r, lroot, rroot;
};

struct rf_optim_shampoo_matrix {
  int view;
  int64_t rows, cols;        /* as stacked: n * sub_rows rows for a 3-D view */
  int64_t sub_rows;          /* the rows of one of its matrices (rows for a 2-D view) */
  int first_block, n_blocks; /* in sh->blocks */
  int64_t state_elems;       /* m | v (rows * cols each) | per block L, R, L root, R root */
  int64_t state_off;         /* in the precond slab when this rank owns it, else -1 */
  int64_t phase;             /* roots refreshed at the steps t with (t + phase) % every == 0 */
  double cost;               /* eigendecomposition cost: the blocks' a^3 + b^3 */
  int64_t refreshes;         /* done on this rank */
};

struct rf_optim_shampoo {
  struct rf_optim_adamw_state s; /* AdamW's m, v of the other views */
  struct rf_optim_shampoo_matrix *mats;
  int n_mats;
  int *matrix_of; /* o->n: the matrix index of a view, or -1 */
  struct rf_optim_shampoo_block *blocks;
  float *precond; /* the owned matrices' state */
  int64_t precond_elems;
  struct rf_optim_owners *owners;
  /* the owner's scratch, for the largest block */
  float *gb, *t1, *wq;
  double *ea, *ew, *ework;
  lapack_int *eiwork, lwork, liwork;
  /* the step in progress */
  float lr;
  int refresh_any;
  int64_t fail; /* the smallest failure code of the step: view * 4 + what; INT64_MAX: none */
  struct rf_optim *o;
};

static const char *const rf_optim_shampoo_fail_what[4] = {
    "non-finite left factor L", "non-finite right factor R",
    "eigendecomposition of L failed (or a zero eigenvalue with --shampoo-eps 0)",
    "eigendecomposition of R failed (or a zero eigenvalue with --shampoo-eps 0)"};

/* ---- create / free ------------------------------------------------------------ */

static int rf_optim_shampoo_check_options(const struct rf_optim_options *op) {
  RF_REQUIRE(op->shampoo_block >= 1 && op->shampoo_block <= 65536,
             "optim: --shampoo-block %lld: a block side must be in [1, 65536]", (long long)op->shampoo_block);
  RF_REQUIRE(op->shampoo_every >= 1, "optim: --shampoo-every %lld: the roots' refresh interval must be >= 1",
             (long long)op->shampoo_every);
  RF_REQUIRE(op->shampoo_beta2 > 0.0f && op->shampoo_beta2 <= 1.0f,
             "optim: --shampoo-beta2 %g: must be in (0, 1]", (double)op->shampoo_beta2);
  RF_REQUIRE(op->shampoo_eps >= 0.0f && isfinite(op->shampoo_eps),
             "optim: --shampoo-eps %g: must be finite and >= 0", (double)op->shampoo_eps);
  return 0;
}

static int rf_optim_shampoo_check_view(const struct rf_optim *o, const struct rf_tensor_view *v, int i) {
  const char *nm = v->name ? v->name : "?";
  RF_REQUIRE(v->ndim == 2 || v->ndim == 3,
             "optim: Shampoo view %d (%s) is %d-D; Shampoo takes 2-D matrices (or 3-D: a stack of them)", i,
             nm, v->ndim);
  RF_REQUIRE(v->starts, "optim: Shampoo view %d (%s) has no starts", i, nm);
  RF_REQUIRE(v->starts[0] == 0 && v->starts[o->world] == v->numel,
             "optim: Shampoo view %d (%s): starts do not cover the tensor", i, nm);
  for (int r = 0; r < o->world; r++)
    RF_REQUIRE(v->starts[r] <= v->starts[r + 1], "optim: Shampoo view %d (%s): starts decrease at rank %d", i,
               nm, r);
  RF_REQUIRE(v->starts[o->rank] == v->begin && v->starts[o->rank + 1] == v->end,
             "optim: Shampoo view %d (%s): starts disagree with the local range", i, nm);
  return 0;
}

/* The blocks of matrix x (per stacked matrix, row blocks by column blocks,
 * shorter last ones) and its state size; appends to sh->blocks. */
static void rf_optim_shampoo_blocks(struct rf_optim_shampoo *sh, struct rf_optim_shampoo_matrix *x,
                                    int64_t side) {
  x->first_block = 0;
  for (int k = 0; k < sh->n_mats; k++) x->first_block += sh->mats[k].n_blocks;
  int64_t pos = 2 * x->rows * x->cols;
  x->n_blocks = 0;
  x->cost = 0;
  for (int64_t r0 = 0; r0 < x->rows; r0 += rf_min_i64(side, x->sub_rows - r0 % x->sub_rows))
    for (int64_t c0 = 0; c0 < x->cols; c0 += side) {
      struct rf_optim_shampoo_block *bl = &sh->blocks[x->first_block + x->n_blocks++];
      int64_t a = rf_min_i64(side, x->sub_rows - r0 % x->sub_rows), b = rf_min_i64(side, x->cols - c0);
      *bl = (struct rf_optim_shampoo_block){.r0 = r0, .c0 = c0, .a = (int)a, .b = (int)b};
      bl->l = pos;
      bl->r = bl->l + a * a;
      bl->lroot = bl->r + b * b;
      bl->rroot = bl->lroot + a * a;
      pos = bl->rroot + b * b;
      x->cost += (double)a * (double)a * (double)a + (double)b * (double)b * (double)b;
    }
  x->state_elems = pos;
}

static int64_t rf_optim_shampoo_n_blocks(const struct rf_tensor_view *v, int64_t side) {
  int64_t n = v->ndim == 3 ? v->shape[0] : 1, rows = v->shape[v->ndim - 2], cols = v->shape[v->ndim - 1];
  return n * rf_ceil_div(rows, side) * rf_ceil_div(cols, side);
}

/* --shampoo-stagger: matrices by decreasing cost, each to the phase with the least
 * cost so far (ties: the lower phase); without it every matrix has phase 0. */
static void rf_optim_shampoo_phases(struct rf_optim_shampoo *sh, int64_t every, int stagger) {
  if (!stagger) return;
  int n = sh->n_mats;
  int *order = rf_xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
  double *load = rf_xcalloc((size_t)every, sizeof(double));
  for (int k = 0; k < n; k++) order[k] = k;
  for (int k = 1; k < n; k++) { /* insertion sort: stable */
    int x = order[k], j = k;
    while (j > 0 && sh->mats[order[j - 1]].cost < sh->mats[x].cost) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = x;
  }
  for (int k = 0; k < n; k++) {
    int64_t best = 0;
    for (int64_t p = 1; p < every; p++)
      if (load[p] < load[best]) best = p;
    sh->mats[order[k]].phase = best;
    load[best] += sh->mats[order[k]].cost;
  }
  free(order);
  free(load);
}

/* The owned matrices' state: m and v zero, factors zero (the allocation's zeroes), roots identity;
 * host code launched on the optimizer's stream, on the device's view of the slab. */
struct rf_optim_shampoo_init {
  const struct rf_optim_shampoo *sh;
};

static void rf_optim_shampoo_state_init(void *arg) {
  const struct rf_optim_shampoo *sh = ((const struct rf_optim_shampoo_init *)arg)->sh;
  float *precond = rf_device_view(sh->o->dev, sh->precond);
  for (int k = 0; k < sh->n_mats; k++) {
    const struct rf_optim_shampoo_matrix *x = &sh->mats[k];
    if (x->state_off < 0) continue;
    float *st = precond + x->state_off;
    for (int j = 0; j < x->n_blocks; j++) {
      const struct rf_optim_shampoo_block *bl = &sh->blocks[x->first_block + j];
      for (int i = 0; i < bl->a; i++) st[bl->lroot + (int64_t)i * bl->a + i] = 1.0f;
      for (int i = 0; i < bl->b; i++) st[bl->rroot + (int64_t)i * bl->b + i] = 1.0f;
    }
  }
}

static void rf_optim_shampoo_scratch(struct rf_optim_shampoo *sh, struct rf_optim *o) {
  int64_t max_ab = 1, max_n = 1;
  for (int k = 0; k < sh->n_mats; k++) {
    if (sh->mats[k].state_off < 0) continue;
    for (int j = 0; j < sh->mats[k].n_blocks; j++) {
      const struct rf_optim_shampoo_block *bl = &sh->blocks[sh->mats[k].first_block + j];
      max_ab = rf_max_i64(max_ab, (int64_t)bl->a * bl->b);
      max_n = rf_max_i64(max_n, rf_max_i64(bl->a, bl->b));
    }
  }
  /* dsyevd's workspace for the largest side, as LAPACK states it (a query: reads no matrix) */
  double wq = 0, ea = 0, ew = 0;
  lapack_int iwq = 0, n = (lapack_int)max_n;
  lapack_int info = LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, &ea, n, &ew, &wq, -1, &iwq, -1);
  sh->lwork = info == 0 ? (lapack_int)wq : 1 + 6 * n + 2 * n * n;
  sh->liwork = info == 0 ? iwq : 3 + 5 * n;
  /* the host eigensolver's (LAPACK) and the host block products' scratch: host memory whatever the
   * device (a device backend brings its own solver and scratch); the state (precond) is on the device */
  if (!o->measure) {
    sh->gb = rf_xaligned(64, (size_t)max_ab * sizeof(float));
    sh->t1 = rf_xaligned(64, (size_t)max_ab * sizeof(float));
    sh->wq = rf_xaligned(64, (size_t)(max_n * max_n) * sizeof(float));
    sh->ea = rf_xaligned(64, (size_t)(max_n * max_n) * sizeof(double));
    sh->ew = rf_xmalloc((size_t)max_n * sizeof(double));
    sh->ework = rf_xmalloc((size_t)sh->lwork * sizeof(double));
    sh->eiwork = rf_xmalloc((size_t)sh->liwork * sizeof(lapack_int));
  }
  o->stats.workspace_bytes += (int64_t)(2 * max_ab + max_n * max_n) * (int64_t)sizeof(float) +
                              (max_n * max_n + max_n + sh->lwork) * (int64_t)sizeof(double) +
                              sh->liwork * (int64_t)sizeof(lapack_int);
}

static int rf_optim_shampoo_create(struct rf_optim *o) {
  RF_REQUIRE(o->comm, "optim: Shampoo needs a communicator");
  RF_TRY(rf_optim_shampoo_check_options(&o->opt));
  int64_t n_blocks = 0;
  for (int i = 0; i < o->n; i++)
    if (o->views[i].flags & RF_OPTIM_FLAG_MATRIX) {
      RF_TRY(rf_optim_shampoo_check_view(o, &o->views[i].v, i));
      n_blocks += rf_optim_shampoo_n_blocks(&o->views[i].v, o->opt.shampoo_block);
    }
  struct rf_optim_shampoo *sh = rf_xcalloc(1, sizeof *sh);
  o->impl = sh;
  sh->o = o;
  rf_optim_adamw_state_init(o, &sh->s);
  size_t nn = (size_t)(o->n > 0 ? o->n : 1);
  sh->mats = rf_xcalloc(nn, sizeof *sh->mats);
  sh->matrix_of = rf_xmalloc(nn * sizeof(int));
  sh->blocks = rf_xcalloc((size_t)rf_max_i64(n_blocks, 1), sizeof *sh->blocks);
  for (int i = 0; i < o->n; i++) {
    const struct rf_optim_view *w = &o->views[i];
    sh->matrix_of[i] = -1;
    if (!(w->flags & RF_OPTIM_FLAG_MATRIX)) {
      o->stats.state_bytes_used += 8 * (w->v.end - w->v.begin);
      continue;
    }
    struct rf_optim_shampoo_matrix *x = &sh->mats[sh->n_mats];
    x->view = i;
    x->rows = w->rows; /* the stacked matrices' rows for a 3-D view */
    x->cols = w->cols;
    x->sub_rows = w->v.shape[w->v.ndim - 2];
    x->state_off = -1;
    rf_optim_shampoo_blocks(sh, x, o->opt.shampoo_block);
    sh->matrix_of[i] = sh->n_mats++;
  }
  rf_optim_shampoo_phases(sh, o->opt.shampoo_every, o->opt.shampoo_stagger);
  struct rf_optim_owners_matrix *desc = rf_xcalloc(nn, sizeof *desc);
  for (int k = 0; k < sh->n_mats; k++) {
    const struct rf_optim_shampoo_matrix *x = &sh->mats[k];
    const struct rf_optim_view *w = &o->views[x->view];
    desc[k] = (struct rf_optim_owners_matrix){
        .rows = x->rows, .cols = x->cols, .starts = w->v.starts, .group = w->v.unit, .cost = x->cost};
  }
  rf_optim_owners_create(&sh->owners, o->comm, o->dev, o->stream, desc, sh->n_mats, o->opt.muon_overlap,
                         o->measure);
  free(desc);
  for (int k = 0; k < sh->n_mats; k++) {
    struct rf_optim_shampoo_matrix *x = &sh->mats[k];
    if (rf_optim_owners_owner(sh->owners, k) != o->rank) continue;
    x->state_off = sh->precond_elems;
    sh->precond_elems += x->state_elems;
  }
  if (!o->measure) {
    sh->precond = rf_device_alloc(o->dev, (size_t)rf_max_i64(sh->precond_elems, 1) * sizeof(float), 64);
    struct rf_optim_shampoo_init arg = {sh};
    rf_device_launch(o->dev, o->stream, "--optim shampoo (its state)", rf_optim_shampoo_state_init, &arg,
                     sizeof arg);
  }
  rf_optim_shampoo_scratch(sh, o);
  o->stats.state_bytes += sh->precond_elems * (int64_t)sizeof(float);
  o->stats.state_bytes_used += sh->precond_elems * (int64_t)sizeof(float);
  struct rf_optim_owners_stats ts;
  rf_optim_owners_get_stats(sh->owners, &ts);
  o->stats.workspace_bytes += ts.workspace_bytes;
  return 0;
}

static void rf_optim_shampoo_free(struct rf_optim *o) {
  struct rf_optim_shampoo *sh = o->impl;
  if (!sh) return;
  rf_optim_adamw_state_free(o, &sh->s);
  rf_optim_owners_free(sh->owners);
  free(sh->mats);
  free(sh->matrix_of);
  free(sh->blocks);
  rf_device_release(o->dev, sh->precond);
  free(sh->gb);
  free(sh->t1);
  free(sh->wq);
  free(sh->ea);
  free(sh->ew);
  free(sh->ework);
  free(sh->eiwork);
  free(sh);
}

/* ---- the owner's work ------------------------------------------------------------ */

/* root = (f / bc)^-1/4 of the n x n factor f (f64 eigendecomposition; eigenvalues
 * shifted up to >= 0, then eps added); 0, or 1 when f is not finite, 2 when the
 * eigendecomposition failed or gave no finite root. */
static int rf_optim_shampoo_root(struct rf_optim_shampoo *sh, const float *f, int n, double bc, float *root) {
  int64_t nn = (int64_t)n * n;
  for (int64_t i = 0; i < nn; i++) {
    if (!isfinite(f[i])) return 1;
    sh->ea[i] = (double)f[i] / bc; /* symmetric: row- and column-major alike (dsyevd reads one triangle) */
  }
  lapack_int info = LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, sh->ea, n, sh->ew, sh->ework,
                                        sh->lwork, sh->eiwork, sh->liwork);
  if (info != 0) return 2;
  double shift = -fmin(sh->ew[0], 0.0), eps = (double)sh->o->opt.shampoo_eps;
  for (int j = 0; j < n; j++) {
    double d = pow(sh->ew[j] + shift + eps, -0.125);
    if (!isfinite(d)) return 2;
    sh->ew[j] = d;
  }
  /* w = Q diag(l^-1/8) (Q column-major: column j is eigenvector j); root = w w^T */
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) sh->wq[(int64_t)i * n + j] = (float)(sh->ea[i + (int64_t)j * n] * sh->ew[j]);
  const struct rf_gemm_desc wwt = {n, n, n, 0, 1, n, n, n, RF_DTYPE_F32, 1.0f, 0.0f};
  rf_gemm_run(&wwt, sh->wq, sh->wq, root);
  sh->o->stats.shampoo_eighs++;
  return 0;
}

static void rf_optim_shampoo_fail(struct rf_optim_shampoo *sh, int view, int what) {
  int64_t code = (int64_t)view * 4 + what;
  if (code < sh->fail) sh->fail = code;
}

/* One block: factors, grafting state, (roots,) the grafted direction into x. */
static void rf_optim_shampoo_block_step(struct rf_optim_shampoo *sh, const struct rf_optim_shampoo_matrix *x,
                                        const struct rf_optim_shampoo_block *bl, float *st, float *g,
                                        int refresh, void (*poll)(void *), void *poll_arg) {
  struct rf_optim *o = sh->o;
  const struct rf_optim_options *op = &o->opt;
  int a = bl->a, b = bl->b;
  int64_t cols = x->cols, n = x->rows * x->cols;
  float *m = st, *v = st + n, *gb = sh->gb;
  for (int i = 0; i < a; i++)
    memcpy(gb + (int64_t)i * b, g + (bl->r0 + i) * cols + bl->c0, (size_t)b * sizeof(float));
  float fb = op->shampoo_beta2, fa = fb < 1.0f ? 1.0f - fb : 1.0f;
  const struct rf_gemm_desc ggt = {a, a, b, 0, 1, b, b, a, RF_DTYPE_F32, fa, fb};
  const struct rf_gemm_desc gtg = {b, b, a, 1, 0, b, b, b, RF_DTYPE_F32, fa, fb};
  rf_gemm_run(&ggt, gb, gb, st + bl->l);
  rf_gemm_run(&gtg, gb, gb, st + bl->r);
  if (poll) poll(poll_arg);
  struct rf_optim_hyper h;
  rf_optim_hyper_init(o, sh->lr, &h);
  float bc1 = (float)(1.0 - pow((double)op->beta1, (double)o->step));
  double anorm = 0;
  for (int i = 0; i < a; i++)
    for (int j = 0; j < b; j++) {
      int64_t e = (bl->r0 + i) * cols + bl->c0 + j;
      float gi = gb[(int64_t)i * b + j];
      float mi = m[e] + h.one_m_b1 * (gi - m[e]);
      float vi = h.b2 * v[e] + h.one_m_b2 * (gi * gi);
      m[e] = mi;
      v[e] = vi;
      float gf = mi / bc1;
      float ad = gf / (sqrtf(vi) / h.bc2_sqrt + h.eps);
      anorm += (double)ad * (double)ad;
      gb[(int64_t)i * b + j] = gf;
    }
  if (refresh) {
    double bc = fb < 1.0f ? 1.0 - pow((double)fb, (double)o->step) : 1.0;
    uint64_t t0 = rf_time_ns();
    int rl = rf_optim_shampoo_root(sh, st + bl->l, a, bc, st + bl->lroot);
    if (rl) rf_optim_shampoo_fail(sh, x->view, rl == 1 ? 0 : 2);
    if (poll) poll(poll_arg);
    int rr = rf_optim_shampoo_root(sh, st + bl->r, b, bc, st + bl->rroot);
    if (rr) rf_optim_shampoo_fail(sh, x->view, rr == 1 ? 1 : 3);
    if (poll) poll(poll_arg);
    o->stats.shampoo_eigh_ns += rf_time_ns() - t0;
  }
  const struct rf_gemm_desc lg = {a, b, a, 0, 0, a, b, b, RF_DTYPE_F32, 1.0f, 0.0f};
  const struct rf_gemm_desc gr = {a, b, b, 0, 0, b, b, b, RF_DTYPE_F32, 1.0f, 0.0f};
  rf_gemm_run(&lg, st + bl->lroot, gb, sh->t1);
  rf_gemm_run(&gr, sh->t1, st + bl->rroot, gb);
  if (poll) poll(poll_arg);
  double snorm = 0;
  for (int64_t i = 0; i < (int64_t)a * b; i++) snorm += (double)gb[i] * (double)gb[i];
  float scale = (float)(sqrt(anorm) / (sqrt(snorm) + 1e-16));
  for (int i = 0; i < a; i++)
    for (int j = 0; j < b; j++) g[(bl->r0 + i) * cols + bl->c0 + j] = gb[(int64_t)i * b + j] * scale;
}

static int rf_optim_shampoo_due(const struct rf_optim *o, const struct rf_optim_shampoo_matrix *x) {
  return (o->step + x->phase) % o->opt.shampoo_every == 0;
}

/* ---- the three stages the transport calls ---------------------------------------- */

static void rf_optim_shampoo_pack(void *ctx, int k, float *u) {
  struct rf_optim_shampoo *sh = ctx;
  const struct rf_optim_view *w = &sh->o->views[sh->mats[k].view];
  memcpy(u, rf_device_view(sh->o->dev, w->v.grad), (size_t)(w->v.end - w->v.begin) * sizeof(float));
}

static void rf_optim_shampoo_compute(void *ctx, int k, float *x, float *work, void (*poll)(void *),
                                     void *poll_arg) {
  (void)work;
  struct rf_optim_shampoo *sh = ctx;
  struct rf_optim_shampoo_matrix *mat = &sh->mats[k];
  RF_ASSERT(mat->state_off >= 0);
  uint64_t t0 = rf_time_ns();
  int refresh = rf_optim_shampoo_due(sh->o, mat);
  float *precond = rf_device_view(sh->o->dev, sh->precond);
  for (int j = 0; j < mat->n_blocks; j++)
    rf_optim_shampoo_block_step(sh, mat, &sh->blocks[mat->first_block + j], precond + mat->state_off, x,
                                refresh, poll, poll_arg);
  mat->refreshes += refresh;
  sh->o->stats.shampoo_precond_ns += rf_time_ns() - t0;
}

/* p = p - lr (P + wd p). */
static void rf_optim_shampoo_unpack(void *ctx, int k, const float *u) {
  struct rf_optim_shampoo *sh = ctx;
  const struct rf_optim *o = sh->o;
  const struct rf_optim_view *w = &o->views[sh->mats[k].view];
  int64_t len = w->v.end - w->v.begin;
  float *p = rf_device_view(o->dev, w->v.master);
  float wd = (w->flags & RF_OPTIM_FLAG_DECAY) ? o->opt.weight_decay : 0.0f, lr = sh->lr;
  for (int64_t i = 0; i < len; i++) p[i] = p[i] - lr * (u[i] + wd * p[i]);
}

static int rf_optim_shampoo_step(struct rf_optim *o, float lr) {
  struct rf_optim_shampoo *sh = o->impl;
  rf_optim_host_sync(o); /* its stages are host code on the host thread, MPI between them */
  rf_optim_adamw_state_step(o, &sh->s, lr);
  sh->lr = lr;
  sh->fail = INT64_MAX;
  sh->refresh_any = 0;
  for (int k = 0; k < sh->n_mats; k++) sh->refresh_any |= rf_optim_shampoo_due(o, &sh->mats[k]);
  static const struct rf_optim_owners_fns fns = {
      .pack = rf_optim_shampoo_pack, .compute = rf_optim_shampoo_compute, .unpack = rf_optim_shampoo_unpack};
  rf_optim_owners_run(sh->owners, &fns, sh);
  if (!sh->refresh_any) return 0; /* factors are checked when their roots are refreshed */
  int64_t fail = sh->fail;        /* every rank knows the refresh steps: agree on the first failure */
  rf_comm_allreduce(o->comm, &fail, 1, RF_DTYPE_I64, RF_REDUCE_OP_MIN);
  if (fail == INT64_MAX) return 0;
  const struct rf_optim_view *w = &o->views[fail / 4];
  RF_FAIL("optim: Shampoo, tensor '%s' (%lld x %lld), step %lld: %s (owner rank %d)",
          w->v.name ? w->v.name : "?", (long long)w->rows, (long long)w->cols, (long long)o->step,
          rf_optim_shampoo_fail_what[fail % 4], rf_optim_owners_owner(sh->owners, sh->matrix_of[fail / 4]));
}

/* ---- state and stats ------------------------------------------------------------ */

static void rf_optim_shampoo_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  const struct rf_optim_shampoo *sh = o->impl;
  if (i < 2) {
    rf_optim_adamw_state_slab(o, &sh->s, i, out);
    return;
  }
  out->name = "precond";
  out->data = sh->precond;
  out->dtype = RF_DTYPE_F32;
  out->count = sh->precond_elems;
  out->shard_layout = 0;
}

/* The precond slab per view: the whole matrix state on its owner. */
static void rf_optim_shampoo_scales(const struct rf_optim *o, int view, int64_t *offset, int64_t *count,
                                    int64_t *first) {
  const struct rf_optim_shampoo *sh = o->impl;
  int k = sh->matrix_of[view];
  *first = 0;
  *offset = k >= 0 && sh->mats[k].state_off >= 0 ? sh->mats[k].state_off : 0;
  *count = k >= 0 && sh->mats[k].state_off >= 0 ? sh->mats[k].state_elems : 0;
}

static int64_t rf_optim_shampoo_tensor_blocks(const struct rf_optim *o, int view) {
  const struct rf_optim_shampoo *sh = o->impl;
  int k = sh->matrix_of[view];
  return k >= 0 ? sh->mats[k].state_elems : 0;
}

static int rf_optim_shampoo_view_owner(const struct rf_optim *o, int view) {
  const struct rf_optim_shampoo *sh = o->impl;
  int k = sh->matrix_of[view];
  return k < 0 ? -1 : rf_optim_owners_owner(sh->owners, k);
}

static int64_t rf_optim_shampoo_view_count(const struct rf_optim *o, int view) {
  const struct rf_optim_shampoo *sh = o->impl;
  int k = sh->matrix_of[view];
  return k < 0 ? 0 : sh->mats[k].refreshes;
}

static void rf_optim_shampoo_stats(const struct rf_optim *o, struct rf_optim_stats *out) {
  const struct rf_optim_shampoo *sh = o->impl;
  struct rf_optim_owners_stats ts;
  rf_optim_owners_get_stats(sh->owners, &ts);
  out->muon_bytes_sent = ts.bytes_sent;
  out->muon_bytes_recv = ts.bytes_recv;
  out->muon_step_bytes_sent = ts.step_bytes_sent;
  out->muon_step_bytes_recv = ts.step_bytes_recv;
  out->muon_comm_wait_ns = ts.wait_ns;
  out->shampoo_owned_cost = ts.owned_cost;
  /* the owned matrices' step: per block of a x b the two factor products and
   * the two preconditioning products, 4ab(a + b); every shampoo_every steps the
   * roots of both factors, an eigendecomposition with vectors (about 9 n^3,
   * Golub and Van Loan's symmetric QR) and w w^T (2 n^3); the grafting's m and v
   * and the block copies streamed (24 bytes per element) */
  for (int k = 0; k < sh->n_mats; k++) {
    const struct rf_optim_shampoo_matrix *x = &sh->mats[k];
    if (x->state_off < 0) continue;
    for (int j = 0; j < x->n_blocks; j++) {
      const struct rf_optim_shampoo_block *bl = &sh->blocks[x->first_block + j];
      out->step_flops += 4.0 * bl->a * bl->b * (double)(bl->a + bl->b);
    }
    out->step_flops += 11.0 * x->cost / (double)o->opt.shampoo_every;
    out->step_stream_bytes += 24.0 * (double)(x->rows * x->cols);
  }
}

const struct rf_optim_ops rf_optim_shampoo_ops = {
    .name = "shampoo",
    .block_rows = 1,
    .vector_block = 1,
    .n_states = 3,
    .takes_matrices = 1,
    .host_code = 1,
    /* AdamW on the others; a matrix piece: g to the staging, the update into p (the owner's m, v: stats) */
    .elem_bytes = 28,
    .matrix_elem_bytes = 20,
    .create = rf_optim_shampoo_create,
    .step = rf_optim_shampoo_step,
    .state = rf_optim_shampoo_state,
    .free = rf_optim_shampoo_free,
    .scales = rf_optim_shampoo_scales,
    .tensor_blocks = rf_optim_shampoo_tensor_blocks,
    .owner = rf_optim_shampoo_view_owner,
    .owner_count = rf_optim_shampoo_view_count,
    .stats = rf_optim_shampoo_stats,
};
