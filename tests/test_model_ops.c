/* rf-test: timeout=60 */
/* Every operation's backward against central finite differences (rf_test_fd_check, tests/rf_test.h).
 * For an op out = f(inputs) and a fixed random R, the objective is
 * J = sum(out * R) (accumulated in double); the backward called with dout = R
 * must give dJ/dinput. Each input element is moved by +-h (h = 1e-2; the ops are
 * smooth, so the truncation error is O(h^2)) and the difference quotient compared:
 *   max_i |fd_i - analytic_i| / max_i |analytic_i| <= 2e-3   (f32 ops).
 * Also: the vectorized exp against libm (rel err < 2e-7), the bf16-weight linear in f32 compute (row blocks
 * widened) and the bf16-compute linear against the f32 linear on the same rounded operands, rope's inverse
 * undoing it, and
 * rmsnorm/linear/embedding backward adding into (not overwriting) their outputs, the FP8 linear's
 * too. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_test.h"

static uint64_t g_rng = 12345;

static float *rand_buf(size_t n, float scale) { return rf_test_rand_buf(&g_rng, n, scale); }

/* ---- rmsnorm ---------------------------------------------------------------------- */

struct norm_ctx {
  int n, d;
  float *x, *w, *r, *out, *rstd;
};

static double norm_obj(void *p) {
  struct norm_ctx *c = p;
  rf_model_rmsnorm_forward(c->out, c->rstd, c->x, c->w, c->n, c->d, 1e-5f);
  return rf_test_dot(c->out, c->r, (size_t)c->n * c->d);
}

static void test_rmsnorm(void) {
  struct norm_ctx c = {.n = 5, .d = 24};
  size_t nd = (size_t)c.n * c.d;
  c.x = rand_buf(nd, 1.0f);
  c.w = rand_buf((size_t)c.d, 1.0f);
  for (int i = 0; i < c.d; i++) c.w[i] += 1.0f;
  c.r = rand_buf(nd, 1.0f);
  c.out = rand_buf(nd, 1.0f);
  c.rstd = rand_buf((size_t)c.n, 1.0f);
  float *dx = rf_xcalloc(nd, 4), *dw = rf_xcalloc((size_t)c.d, 4);
  norm_obj(&c);
  rf_model_rmsnorm_backward(dx, dw, c.r, c.x, c.rstd, c.w, c.n, c.d);
  rf_test_fd_check("rmsnorm dx", c.x, nd, dx, norm_obj, &c);
  rf_test_fd_check("rmsnorm dw", c.w, (size_t)c.d, dw, norm_obj, &c);
  /* backward adds */
  float dx0 = dx[3], dw0 = dw[2];
  rf_model_rmsnorm_backward(dx, dw, c.r, c.x, c.rstd, c.w, c.n, c.d);
  RF_CHECK_CLOSE(dx[3], 2.0f * dx0, 1e-6, 0.0, "rmsnorm dx accumulates");
  RF_CHECK_CLOSE(dw[2], 2.0f * dw0, 1e-6, 0.0, "rmsnorm dw accumulates");
  free(c.x), free(c.w), free(c.r), free(c.out), free(c.rstd), free(dx), free(dw);
}

/* ---- rope ---------------------------------------------------------------------------- */

struct rope_ctx {
  int b, t, nh, hd;
  float *x, *r, *out, *cs, *sn;
};

static double rope_obj(void *p) {
  struct rope_ctx *c = p;
  size_t n = (size_t)c->b * c->t * c->nh * c->hd;
  memcpy(c->out, c->x, n * 4);
  rf_model_rope_apply(c->out, c->b, c->t, c->nh, c->hd, c->cs, c->sn, 0);
  return rf_test_dot(c->out, c->r, n);
}

static void test_rope(void) {
  struct rope_ctx c = {.b = 2, .t = 7, .nh = 3, .hd = 8};
  size_t n = (size_t)c.b * c.t * c.nh * c.hd;
  c.x = rand_buf(n, 1.0f);
  c.r = rand_buf(n, 1.0f);
  c.out = rand_buf(n, 1.0f);
  c.cs = rf_xmalloc((size_t)c.t * c.hd / 2 * 4);
  c.sn = rf_xmalloc((size_t)c.t * c.hd / 2 * 4);
  rf_model_rope_tables(c.cs, c.sn, c.t, c.hd, 100.0);
  /* HF's convention at one element: position 3, head 1, pair (1, 1 + hd/2). */
  {
    int t = 3, h = 1, i = 1, half = c.hd / 2;
    double inv = pow(100.0, -2.0 * i / c.hd), a = t * inv;
    rope_obj(&c);
    size_t base = ((size_t)0 * c.t + t) * c.nh * c.hd + (size_t)h * c.hd;
    double x1 = c.x[base + i], x2 = c.x[base + i + half];
    RF_CHECK_CLOSE(c.out[base + i], x1 * cos(a) - x2 * sin(a), 1e-5, 1e-6, "rope first half");
    RF_CHECK_CLOSE(c.out[base + i + half], x2 * cos(a) + x1 * sin(a), 1e-5, 1e-6, "rope second half");
  }
  float *d = rf_xmalloc(n * 4);
  memcpy(d, c.r, n * 4);
  rf_model_rope_apply(d, c.b, c.t, c.nh, c.hd, c.cs, c.sn, 1);
  rf_test_fd_check("rope dx", c.x, n, d, rope_obj, &c);
  /* the inverse undoes the rotation */
  rope_obj(&c);
  rf_model_rope_apply(c.out, c.b, c.t, c.nh, c.hd, c.cs, c.sn, 1);
  RF_CHECK(rf_test_max_rel_diff(c.out, c.x, n, 1e-3) < 1e-5, "rope inverse");
  free(c.x), free(c.r), free(c.out), free(c.cs), free(c.sn), free(d);
}

/* ---- attention -------------------------------------------------------------------------- */

struct att_ctx {
  int b, t, nh, nkv, hd;
  float *q, *k, *v, *r, *y, *p; /* p: the log-sum-exp [b, nh, t] */
  float *scratch;               /* [2 slices, 2, RF_MODEL_ATT_BLOCK, t] */
};

static double att_obj(void *p) {
  struct att_ctx *c = p;
  rf_model_attention_forward(c->y, c->p, c->q, c->k, c->v, c->b, c->t, c->nh, c->nkv, c->hd, c->scratch, 2);
  return rf_test_dot(c->y, c->r, (size_t)c->b * c->t * c->nh * c->hd);
}

/* Naive reference: y[b,i,h] = sum_{j<=i} softmax_j(q.k / sqrt(hd)) v[j]. */
static void att_naive(const struct att_ctx *c, double *y) {
  int qs = c->nh * c->hd, ks = c->nkv * c->hd, rep = c->nh / c->nkv;
  for (int b = 0; b < c->b; b++)
    for (int h = 0; h < c->nh; h++)
      for (int i = 0; i < c->t; i++) {
        double s[256], mx = -1e300, z = 0.0;
        const float *qi = c->q + ((size_t)b * c->t + i) * qs + h * c->hd;
        for (int j = 0; j <= i; j++) {
          const float *kj = c->k + ((size_t)b * c->t + j) * ks + (h / rep) * c->hd;
          double d = 0.0;
          for (int e = 0; e < c->hd; e++) d += (double)qi[e] * kj[e];
          s[j] = d / sqrt((double)c->hd);
          mx = fmax(mx, s[j]);
        }
        for (int j = 0; j <= i; j++) z += (s[j] = exp(s[j] - mx));
        for (int e = 0; e < c->hd; e++) {
          double acc = 0.0;
          for (int j = 0; j <= i; j++)
            acc += s[j] / z * c->v[((size_t)b * c->t + j) * ks + (h / rep) * c->hd + e];
          y[((size_t)b * c->t + i) * qs + h * c->hd + e] = acc;
        }
      }
}

/* T = 6 (one block) and T = 150 (blocks of 64: two whole, one partial). */
static void test_attention(int b, int t, int nh, int nkv, int hd) {
  struct att_ctx c = {.b = b, .t = t, .nh = nh, .nkv = nkv, .hd = hd};
  size_t nq = (size_t)c.b * c.t * c.nh * c.hd, nk = (size_t)c.b * c.t * c.nkv * c.hd;
  c.q = rand_buf(nq, 1.5f);
  c.k = rand_buf(nk, 1.5f);
  c.v = rand_buf(nk, 1.0f);
  c.r = rand_buf(nq, 1.0f);
  c.y = rand_buf(nq, 1.0f);
  c.p = rand_buf((size_t)c.b * c.nh * c.t, 1.0f);
  c.scratch = rf_xmalloc((size_t)2 * 2 * RF_MODEL_ATT_BLOCK * c.t * 4);
  att_obj(&c);
  double *yn = rf_xmalloc(nq * sizeof(double));
  att_naive(&c, yn);
  double e = 0.0;
  for (size_t i = 0; i < nq; i++) e = rf_test_max(e, fabs(yn[i] - c.y[i]));
  RF_CHECK(e < 1e-5, "attention forward vs naive causal GQA: %.3g", e);
  float *dq = rf_xcalloc(nq, 4), *dk = rf_xcalloc(nk, 4), *dv = rf_xcalloc(nk, 4);
  rf_model_attention_backward(dq, dk, dv, c.r, c.p, c.q, c.k, c.v, c.b, c.t, c.nh, c.nkv, c.hd, c.scratch, 2);
  rf_test_fd_check("attention dq", c.q, nq, dq, att_obj, &c);
  rf_test_fd_check("attention dk", c.k, nk, dk, att_obj, &c);
  rf_test_fd_check("attention dv", c.v, nk, dv, att_obj, &c);
  free(c.q), free(c.k), free(c.v), free(c.r), free(c.y), free(c.p), free(yn), free(dq), free(dk), free(dv);
  free(c.scratch);
}

/* ---- swiglu -------------------------------------------------------------------------------- */

struct swiglu_ctx {
  size_t n;
  float *g, *u, *r, *h;
};

static double swiglu_obj(void *p) {
  struct swiglu_ctx *c = p;
  rf_model_swiglu_forward(c->h, c->g, c->u, c->n);
  return rf_test_dot(c->h, c->r, c->n);
}

static void test_swiglu(void) {
  struct swiglu_ctx c = {.n = 64};
  c.g = rand_buf(c.n, 3.0f);
  c.u = rand_buf(c.n, 1.0f);
  c.r = rand_buf(c.n, 1.0f);
  c.h = rand_buf(c.n, 1.0f);
  swiglu_obj(&c);
  RF_CHECK_CLOSE(c.h[5], c.g[5] / (1.0 + exp(-(double)c.g[5])) * c.u[5], 1e-6, 1e-7, "silu(g) * u");
  float *dg = rf_xmalloc(c.n * 4), *du = rf_xmalloc(c.n * 4);
  rf_model_swiglu_backward(dg, du, c.r, c.g, c.u, c.n);
  rf_test_fd_check("swiglu dgate", c.g, c.n, dg, swiglu_obj, &c);
  rf_test_fd_check("swiglu dup", c.u, c.n, du, swiglu_obj, &c);
  free(c.g), free(c.u), free(c.r), free(c.h), free(dg), free(du);
}

/* ---- linear ---------------------------------------------------------------------------------- */

struct lin_ctx {
  int n, in, out;
  float *x, *w, *r, *y;
};

static double lin_obj(void *p) {
  struct lin_ctx *c = p;
  struct rf_model_weight w = {.f32 = c->w};
  rf_model_linear_forward(c->y, c->x, &w, c->n, c->in, c->out, 0.0f, NULL);
  return rf_test_dot(c->y, c->r, (size_t)c->n * c->out);
}

static void test_linear(void) {
  struct lin_ctx c = {.n = 5, .in = 7, .out = 6};
  c.x = rand_buf((size_t)c.n * c.in, 1.0f);
  c.w = rand_buf((size_t)c.out * c.in, 1.0f);
  c.r = rand_buf((size_t)c.n * c.out, 1.0f);
  c.y = rand_buf((size_t)c.n * c.out, 1.0f);
  lin_obj(&c);
  double y12 = 0.0;
  for (int i = 0; i < c.in; i++) y12 += (double)c.x[1 * c.in + i] * c.w[2 * c.in + i];
  RF_CHECK_CLOSE(c.y[1 * c.out + 2], y12, 1e-5, 1e-6, "y = x W^T with W [out, in]");
  float *dx = rf_xcalloc((size_t)c.n * c.in, 4), *dw = rf_xcalloc((size_t)c.out * c.in, 4);
  struct rf_model_weight w = {.f32 = c.w};
  rf_model_linear_backward(dx, dw, c.r, c.x, &w, c.n, c.in, c.out, 0.0f, NULL);
  rf_test_fd_check("linear dx", c.x, (size_t)c.n * c.in, dx, lin_obj, &c);
  rf_test_fd_check("linear dw", c.w, (size_t)c.out * c.in, dw, lin_obj, &c);
  float dw0 = dw[4], dx0 = dx[3];
  rf_model_linear_backward(dx, dw, c.r, c.x, &w, c.n, c.in, c.out, 1.0f, NULL);
  RF_CHECK_CLOSE(dw[4], 2.0f * dw0, 1e-6, 1e-7, "linear dw accumulates");
  RF_CHECK_CLOSE(dx[3], 2.0f * dx0, 1e-6, 1e-7, "linear dx with beta 1 accumulates");
  free(c.x), free(c.w), free(c.r), free(c.y), free(dx), free(dw);
}

/* bf16 weights (out > RF_MODEL_STAGE_ROWS, so the f32 compute runs several row
 * blocks) against f32 weights holding the same rounded values: exact up to f32
 * summation order (1e-5). bf16 compute (operands rounded to bf16, products exact
 * in f32, f32 accumulation) against the f32 linear on operands rounded the same
 * way: again f32 summation order only (1e-5), for f32 and bf16 weights and dW. */
/* The stage's progress callback (the trainer's MPI polling) counts its calls. */
static void count_progress(void *ctx) { (*(int *)ctx)++; }

static float *rounded_copy(const float *x, size_t n) {
  float *y = rf_xmalloc(n * 4);
  for (size_t i = 0; i < n; i++) y[i] = rf_f32_from_bf16(rf_bf16_from_f32(x[i]));
  return y;
}

static void test_linear_bf16(void) {
  int n = 9, in = 40, out = RF_MODEL_STAGE_ROWS + 37;
  float *x = rand_buf((size_t)n * in, 1.0f), *wf = rand_buf((size_t)out * in, 1.0f);
  float *dy = rand_buf((size_t)n * out, 1.0f);
  uint16_t *wb = rf_xmalloc((size_t)out * in * 2);
  rf_bf16_from_f32_n(wb, wf, (size_t)out * in);
  rf_f32_from_bf16_n(wf, wb, (size_t)out * in);
  int progress_calls = 0;
  struct rf_model_stage st = {.compute = RF_DTYPE_F32,
                              .wf32 = rf_xmalloc((size_t)RF_MODEL_STAGE_ROWS * in * 4),
                              .progress = count_progress,
                              .progress_ctx = &progress_calls};
  struct rf_model_weight w32 = {.f32 = wf}, w16 = {.bf16 = wb};
  float *ya = rf_xmalloc((size_t)n * out * 4), *yb = rf_xmalloc((size_t)n * out * 4);
  rf_model_linear_forward(ya, x, &w32, n, in, out, 0.0f, NULL);
  rf_model_linear_forward(yb, x, &w16, n, in, out, 0.0f, &st);
  double tol = 1e-5;
  double e = rf_test_max_rel_diff(yb, ya, (size_t)n * out, 1.0);
  RF_CHECK(e <= tol, "bf16 linear forward rel err %.3g > %g", e, tol);
  float *dxa = rf_xmalloc((size_t)n * in * 4), *dxb = rf_xmalloc((size_t)n * in * 4);
  rf_model_linear_backward(dxa, NULL, dy, x, &w32, n, in, out, 0.0f, NULL);
  rf_model_linear_backward(dxb, NULL, dy, x, &w16, n, in, out, 0.0f, &st);
  double e2 = rf_test_max_rel_diff(dxb, dxa, (size_t)n * in, 1.0);
  RF_CHECK(e2 <= tol, "bf16 linear backward rel err %.3g > %g", e2, tol);
  RF_CHECK(progress_calls == 2, "the progress callback ran %d times for 2 linear ops", progress_calls);
  printf("  bf16 weights, f32 compute (row blocks widened): forward rel err %.2g, backward %.2g\n", e, e2);

  /* bf16 compute: reference = f32 products of the rounded operands. */
  size_t wide = (size_t)n * (in > out ? in : out);
  struct rf_model_stage sb = {.compute = RF_DTYPE_BF16,
                              .act = rf_xmalloc(wide * 2),
                              .act2 = rf_xmalloc(wide * 2),
                              .wbf16 = rf_xmalloc((size_t)out * in * 2)};
  float *xr = rounded_copy(x, (size_t)n * in), *dyr = rounded_copy(dy, (size_t)n * out);
  float *dwa = rf_xcalloc((size_t)out * in, 4), *dwb = rf_xcalloc((size_t)out * in, 4);
  rf_model_linear_forward(ya, xr, &w32, n, in, out, 0.0f, NULL);
  rf_model_linear_backward(dxa, dwa, dyr, xr, &w32, n, in, out, 0.0f, NULL);
  const struct rf_model_weight *ws[] = {&w32, &w16};
  for (int k = 0; k < 2; k++) {
    memset(dwb, 0, (size_t)out * in * 4);
    rf_model_linear_forward(yb, x, ws[k], n, in, out, 0.0f, &sb);
    rf_model_linear_backward(dxb, dwb, dy, x, ws[k], n, in, out, 0.0f, &sb);
    double ef = rf_test_max_rel_diff(yb, ya, (size_t)n * out, 1.0);
    double eb = rf_test_max_rel_diff(dxb, dxa, (size_t)n * in, 1.0);
    double ew = rf_test_max_rel_diff(dwb, dwa, (size_t)out * in, 1.0);
    RF_CHECK(ef <= tol && eb <= tol && ew <= tol,
             "bf16 compute (%s weights) vs f32 on rounded operands: y %.3g, dx %.3g, dw %.3g > %g",
             k ? "bf16" : "f32", ef, eb, ew, tol);
    printf("  bf16 compute, %s weights: y %.2g, dx %.2g, dw %.2g\n", k ? "bf16" : "f32", ef, eb, ew);
  }
  free(x), free(wf), free(dy), free(wb), free(st.wf32), free(ya), free(yb), free(dxa), free(dxb);
  free(sb.act), free(sb.act2), free(sb.wbf16), free(xr), free(dyr), free(dwa), free(dwb);
}

/* FP8 block weights (docs/fp8.md): the backward with beta 1 adds dX into what dx held and dW
 * into dw, as the f32 path does (a layer's q, k and v projections share one input and add
 * their dX; a missing accumulation is not visible in one product). Reference: the same
 * call with beta 0 on zeroed outputs (that product is tied to torch in test_fp8), plus the
 * prefilled values: equal up to the f32 order of the additions (1e-6 of max|ref|). Shapes
 * with whole and partial 128-tiles on every side. */
static void test_linear_fp8(void) {
  int n = 136, in = 144, out = 200;
  size_t wide = (size_t)(in > out ? in : out), act = (size_t)n * wide, weight = (size_t)out * in;
  size_t tiles = act / RF_FP8_TILE + (size_t)n + wide + 1;
  struct rf_model_stage st = {.compute = RF_DTYPE_F32};
  st.fp8 = (struct rf_model_fp8_stage){.a = rf_xmalloc(act * 2),
                                       .b = rf_xmalloc(act * 2),
                                       .w = rf_xmalloc(weight * 2),
                                       .sa = rf_xmalloc(tiles * 4),
                                       .sb = rf_xmalloc(tiles * 4),
                                       .work = rf_xmalloc((act > weight ? act : weight) * 4 + wide * 4)};
  float *x = rand_buf((size_t)n * in, 1.0f), *wf = rand_buf(weight, 0.5f),
        *dy = rand_buf((size_t)n * out, 1.0f);
  struct rf_fp8_grid g = {out, in, RF_FP8_TILE, RF_FP8_TILE};
  uint8_t *codes = rf_xmalloc(weight);
  float *scales = rf_xmalloc((size_t)rf_fp8_grid_tiles(&g) * 4);
  RF_ASSERT(rf_fp8_quantize(&g, wf, 0, "w", codes, scales) == 0);
  struct rf_model_weight w = {.fp8 = codes, .fp8_scales = scales};
  float *dx0 = rf_xcalloc((size_t)n * in, 4), *dw0 = rf_xcalloc(weight, 4);
  rf_model_linear_backward(dx0, dw0, dy, x, &w, n, in, out, 0.0f, &st);
  float *pre_x = rand_buf((size_t)n * in, 2.0f), *pre_w = rand_buf(weight, 2.0f);
  float *dx1 = rf_xmalloc((size_t)n * in * 4), *dw1 = rf_xmalloc(weight * 4);
  memcpy(dx1, pre_x, (size_t)n * in * 4);
  memcpy(dw1, pre_w, weight * 4);
  rf_model_linear_backward(dx1, dw1, dy, x, &w, n, in, out, 1.0f, &st);
  for (size_t i = 0; i < (size_t)n * in; i++) dx0[i] += pre_x[i];
  for (size_t i = 0; i < weight; i++) dw0[i] += pre_w[i];
  double ex = rf_test_max_abs_diff(dx1, dx0, (size_t)n * in) / rf_test_max_abs(dx0, (size_t)n * in);
  double ew = rf_test_max_abs_diff(dw1, dw0, weight) / rf_test_max_abs(dw0, weight);
  RF_CHECK(ex <= 1e-6, "fp8 linear dx with beta 1: %.3g of max from dx + the prefilled values", ex);
  RF_CHECK(ew <= 1e-6, "fp8 linear dw: %.3g of max from dw + the prefilled values", ew);
  printf("  fp8 weights: backward with beta 1 adds (dx %.2g, dw %.2g)\n", ex, ew);
  free(st.fp8.a), free(st.fp8.b), free(st.fp8.w), free(st.fp8.sa), free(st.fp8.sb), free(st.fp8.work);
  free(x), free(wf), free(dy), free(codes), free(scales), free(dx0), free(dw0), free(pre_x), free(pre_w);
  free(dx1), free(dw1);
}

/* ---- cross-entropy ------------------------------------------------------------------------------ */

struct ce_ctx {
  int n, v;
  float *z, *lse;
  int32_t *t;
};

static double ce_obj(void *p) {
  struct ce_ctx *c = p;
  return rf_model_cross_entropy_forward(c->lse, c->z, c->t, c->n, c->v);
}

static void test_cross_entropy(void) {
  struct ce_ctx c = {.n = 6, .v = 11};
  c.z = rand_buf((size_t)c.n * c.v, 3.0f);
  c.lse = rf_xmalloc((size_t)c.n * 4);
  int32_t t[6] = {3, 0, 10, -1, 7, 3};
  c.t = t;
  double loss = ce_obj(&c);
  double ref = 0.0;
  for (int r = 0; r < c.n; r++) {
    if (t[r] < 0) continue;
    double z = exp((double)c.z[r * c.v]);
    for (int j = 1; j < c.v; j++) z += exp((double)c.z[r * c.v + j]);
    ref += log(z) - c.z[r * c.v + t[r]];
  }
  RF_CHECK_CLOSE(loss, ref, 1e-6, 0.0, "cross-entropy sum");
  float *g = rf_xmalloc((size_t)c.n * c.v * 4);
  memcpy(g, c.z, (size_t)c.n * c.v * 4);
  rf_model_cross_entropy_backward(g, c.lse, t, c.n, c.v, 1.0f);
  rf_test_fd_check("cross-entropy dlogits", c.z, (size_t)c.n * c.v, g, ce_obj, &c);
  memcpy(g, c.z, (size_t)c.n * c.v * 4);
  rf_model_cross_entropy_backward(g, c.lse, t, c.n, c.v, 0.25f);
  float *g1 = rf_xmalloc((size_t)c.n * c.v * 4);
  memcpy(g1, c.z, (size_t)c.n * c.v * 4);
  rf_model_cross_entropy_backward(g1, c.lse, t, c.n, c.v, 1.0f);
  RF_CHECK_CLOSE(g[2], 0.25f * g1[2], 1e-6, 1e-8, "grad_scale multiplies");
  free(c.z), free(c.lse), free(g), free(g1);
}

/* ---- embedding ------------------------------------------------------------------------------------- */

struct emb_ctx {
  int n, d;
  float *table, *r, *out;
  const int32_t *tok;
};

static double emb_obj(void *p) {
  struct emb_ctx *c = p;
  struct rf_model_weight w = {.f32 = c->table};
  rf_model_embedding_forward(c->out, &w, c->tok, c->n, c->d);
  return rf_test_dot(c->out, c->r, (size_t)c->n * c->d);
}

static void test_embedding(void) {
  int32_t tok[7] = {2, 4, 2, 0, 4, 4, 1};
  struct emb_ctx c = {.n = 7, .d = 5, .tok = tok};
  int vocab = 6;
  c.table = rand_buf((size_t)vocab * c.d, 1.0f);
  c.r = rand_buf((size_t)c.n * c.d, 1.0f);
  c.out = rand_buf((size_t)c.n * c.d, 1.0f);
  float *dt = rf_xcalloc((size_t)vocab * c.d, 4);
  rf_model_embedding_backward(dt, c.r, tok, c.n, c.d);
  rf_test_fd_check("embedding dtable", c.table, (size_t)vocab * c.d, dt, emb_obj, &c);
  RF_CHECK(dt[3 * c.d] == 0.0f && dt[5 * c.d + 1] == 0.0f, "unused rows get no gradient");
  free(c.table), free(c.r), free(c.out), free(dt);
}

/* ---- one layer end to end through the workspace -----------------------------------------------------------
 */

/* J = sum(layer_output * R) for a 1-layer model; the layer backward with dx = R
 * must give dJ/dW for every tensor of the unit (spot-checked elements). */
struct layer_ctx {
  struct rf_model_config cfg;
  struct rf_model_ws ws;
  float *emb;
  int n_w;
  float *w[RF_MODEL_LAYER_MAX_TENSORS];
  float *r;
  int32_t *tok;
};

static double layer_obj(void *p) {
  struct layer_ctx *c = p;
  struct rf_model_weight e = {.f32 = c->emb}, lw[RF_MODEL_LAYER_MAX_TENSORS];
  for (int i = 0; i < c->n_w; i++) lw[i] = (struct rf_model_weight){.f32 = c->w[i]};
  RF_ASSERT(rf_model_embed_forward(&c->ws, &e, c->tok) == 0);
  rf_model_layer_forward(&c->ws, 0, lw);
  return rf_test_dot(c->ws.xf, c->r, (size_t)c->ws.b * c->ws.t * c->cfg.hidden_size);
}

/* A whole layer by finite differences; biased: attention and MLP biases, and a
 * head_dim (6) other than hidden / heads. */
static void test_layer(int biased) {
  struct layer_ctx c;
  memset(&c, 0, sizeof(c));
  c.cfg = (struct rf_model_config){.hidden_size = 16,
                                   .intermediate_size = 20,
                                   .num_hidden_layers = 1,
                                   .num_attention_heads = 4,
                                   .num_key_value_heads = 2,
                                   .vocab_size = 9,
                                   .max_position_embeddings = 16,
                                   .head_dim = biased ? 6 : 0,
                                   .rms_norm_eps = 1e-5f,
                                   .rope_theta = 10000.0,
                                   .attention_bias = biased,
                                   .mlp_bias = biased};
  RF_ASSERT(rf_model_config_check(&c.cfg, "test") == 0);
  int B = 2, T = 5, N = B * T, H = 16;
  RF_ASSERT(rf_model_ws_init(&c.ws, &c.cfg, B, T) == 0);
  c.emb = rand_buf((size_t)9 * H, 1.0f);
  int64_t numel[RF_MODEL_LAYER_MAX_TENSORS];
  struct rf_model_desc desc;
  rf_model_desc_make(&c.cfg, &desc);
  c.n_w = desc.units[1].n_tensors;
  RF_ASSERT(c.n_w == (biased ? 16 : 9)); /* nine weights, seven biases */
  for (int i = 0; i < c.n_w; i++) {
    const struct rf_model_tensor s = desc.units[1].tensors[i];
    numel[i] = s.numel;
    c.w[i] = rand_buf((size_t)numel[i], s.ndim == 2 ? 0.5f : 0.3f);
    if (strstr(s.name, "norm"))
      for (int64_t j = 0; j < numel[i]; j++) c.w[i][j] += 1.0f;
  }
  c.r = rand_buf((size_t)N * H, 1.0f);
  int32_t tok[10] = {1, 5, 8, 0, 2, 2, 7, 3, 3, 6};
  c.tok = tok;
  layer_obj(&c);
  float *g[RF_MODEL_LAYER_MAX_TENSORS];
  for (int i = 0; i < c.n_w; i++) g[i] = rf_xcalloc((size_t)numel[i], 4);
  memcpy(c.ws.dx, c.r, (size_t)N * H * 4);
  struct rf_model_weight lw[RF_MODEL_LAYER_MAX_TENSORS];
  for (int i = 0; i < c.n_w; i++) lw[i] = (struct rf_model_weight){.f32 = c.w[i]};
  rf_model_layer_backward(&c.ws, 0, lw, g);
  float *demb = rf_xcalloc((size_t)9 * H, 4);
  rf_model_embed_backward(&c.ws, &demb);
  for (int i = 0; i < c.n_w; i++)
    rf_test_fd_check(desc.units[1].tensors[i].name, c.w[i], (size_t)numel[i], g[i], layer_obj, &c);
  rf_test_fd_check("layer -> embedding", c.emb, (size_t)9 * H, demb, layer_obj, &c);
  for (int i = 0; i < c.n_w; i++) free(c.w[i]), free(g[i]);
  free(c.emb), free(c.r), free(demb);
  rf_model_ws_free(&c.ws);
  rf_model_desc_free(&desc);
}

/* The vectorizable exp against libm's, over the range the softmax and SiLU use. */
static void test_expf(void) {
  double worst = 0.0;
  for (int i = 0; i <= 200000; i++) {
    float x = -80.0f + 168.0f * (float)i / 200000.0f;
    double e = fabs((double)rf_model_expf(x) - exp((double)x)) / exp((double)x);
    worst = rf_test_max(worst, e);
  }
  printf("  fast exp: max rel err %.2g over [-80, 88]\n", worst);
  RF_CHECK(worst < 2e-7, "rf_model_expf rel err %.3g", worst);
  RF_CHECK(rf_model_expf(-1000.0f) >= 0.0f && rf_model_expf(-1000.0f) < 1e-37f, "exp of very negative");
  /* a NaN (a diverged run) gives NaN, without the undefined float-to-int conversion
   * that make test-asan stopped on; infinities stay clamped */
  RF_CHECK(isnan(rf_model_expf(NAN)) && isnan(rf_model_expf(-NAN)), "exp of NaN is not NaN");
  RF_CHECK(rf_model_expf(-INFINITY) >= 0.0f && rf_model_expf(INFINITY) > 1e38f, "exp of an infinity");
  /* the same inside a vectorized loop: SiLU of a NaN is NaN there, exact elsewhere */
  enum { N = 67 };
  float gate[N], up[N], h[N];
  for (int i = 0; i < N; i++) gate[i] = -3.0f + 0.1f * (float)i, up[i] = 1.0f;
  gate[13] = NAN;
  rf_model_swiglu_forward(h, gate, up, N);
  for (int i = 0; i < N; i++) {
    double want = gate[i] / (1.0 + exp(-(double)gate[i]));
    RF_CHECK(i == 13 ? isnan(h[i]) : fabs(h[i] - want) < 1e-6, "silu[%d] = %g, want %g", i, h[i], want);
  }
}

int main(void) {
  test_expf();
  test_rmsnorm();
  test_rope();
  test_attention(2, 6, 4, 2, 4);
  test_attention(1, 150, 2, 1, 4);
  test_swiglu();
  test_linear();
  test_linear_fp8();
  test_linear_bf16();
  test_cross_entropy();
  test_embedding();
  test_layer(0);
  test_layer(1);
  return rf_test_finish("test_model_ops");
}
