/* GPU test (scripts/gpu-check on a GPU; make BACKEND=cuda-emu runs it on the CPU stand-in,
 * tests/test_cuda_emu_fused.c): the fused kernels of src/model/fused_cuda.cu against the
 * host ops (ops.c's RMSNorm, RoPE, SwiGLU and cross-entropy on the bf16 inputs widened to
 * f32, each result rounded to bf16 by rf_bf16_from_f32; grads.c's norm and clip; adamw.c's
 * arithmetic, the RF_OPTIM_ADAMW_* macros).
 *
 * Tolerances. ub = 2^-8 is bf16's unit roundoff (a rounding to bf16 errs by at most ub of
 * the value), u = 2^-24 f32's:
 *   - the same bits: RoPE, SwiGLU forward and backward, the cross-entropy backward (given
 *     the host's lse), the residual add, AdamW over the shard (with and without clipping; a
 *     NaN clip factor, a non-finite norm's, changes nothing),
 *     the clip factor: the kernels do the host's f32 operations in its order (no FMA
 *     contraction) and round once as the host's rf_bf16_from_f32 does; FP8 codes and
 *     scales of bf16 activations in 1 x 128 tiles against rf_fp8_quantize (zero,
 *     subnormal, largest-bf16 and 448-boundary tiles, pow2 on and off, partial tiles), and
 *     a NaN and a -inf: the host refuses, the device flags the first one's index;
 *   - reductions in another order (RMSNorm's sum of squares and its backward's dot, the
 *     column sums of dw): f32 results within 8 n u of the largest |reference| (n the terms;
 *     Higham ch. 4), and a bf16 output computed from them within one bf16 ulp (2 ub of the
 *     value) of the host's rounding: the f32 values differ far below a bf16 unit, so the
 *     two roundings differ only where the f32 value lies at a rounding boundary;
 *   - the cross-entropy's lse: within 2^-19 (1 + |lse|) = 2^-11 ub (1 + |lse|): each
 *     thread sums at most 8 exp terms in f32 (8 u plus the exp's 4 u), the rest is f64;
 *     the loss sum within n times that;
 *   - the sum of squares (f64 on both sides): 1e-12 relative (n 2^-53 for n <= 10^4).
 * Vocabularies: 151936 (Qwen3: 74 full 2048-wide chunks and a partial one), 1001 (one
 * partial chunk), 4096 (exact multiple), 4097 (a 1-column last chunk); rows whose target
 * is -1 (ignored). The shard's pieces: a 5000-element piece (a full chunk and a partial
 * one), zero-length pieces before, between and after others (offsets into their
 * neighbours' ranges, as a rank owning nothing of a tensor has), padding between pieces
 * full of sentinels that must stay untouched. Outputs prefilled with NaN (an element not
 * written fails). On a GPU it then times each kernel at the 1.1B LLaMA's shape (8 x 2048
 * tokens, hidden 2048, ff 8192, vocab 32000, one layer's unit for the shard kernels): the
 * median of 20 runs in microseconds and the bandwidth it reaches. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gpu/gpu_timing.h"
#include "model/fused_cuda.h"
#include "model/model.h"
#include "optim/optim.h"
#include "rf_test.h"

#define U (1.0 / 16777216.0) /* 2^-24 */
#define UB (1.0 / 256.0)     /* 2^-8 */

static void ck_(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  exit(1);
}
#define CK(call) ck_((call), #call, __FILE__, __LINE__)

static uint64_t g_rng = 20261202;
static cudaStream_t g_st;

static float *rand_f32(size_t n, float scale) {
  float *p = rf_xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = scale * rf_test_rand_f32(&g_rng);
  return p;
}
/* n random bf16 values in [-scale, scale] and their f32 widening */
static uint16_t *rand_bf16(size_t n, float scale, float **wide) {
  uint16_t *b = rf_xmalloc(n * sizeof(uint16_t) + 4);
  float *w = rf_xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) {
    b[i] = rf_bf16_from_f32(scale * rf_test_rand_f32(&g_rng));
    w[i] = rf_f32_from_bf16(b[i]);
  }
  *wide = w;
  return b;
}
/* Every copy and memset goes on the test's stream (a non-blocking one: CUDA's legacy
 * stream does not order against it), each waited for. */
static void upload(void *d, const void *h, size_t bytes) {
  CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, g_st));
  CK(cudaStreamSynchronize(g_st));
}
static void *dput(const void *h, size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  upload(p, h, bytes);
  return p;
}
static void *dnan(size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  CK(cudaMemsetAsync(p, 0xff, bytes, g_st));
  CK(cudaStreamSynchronize(g_st));
  return p;
}
static void *dget(const void *d, size_t bytes) {
  void *h = rf_xmalloc(bytes + 4);
  CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, g_st));
  CK(cudaStreamSynchronize(g_st));
  return h;
}

/* bf16 device output against the host's f32 result rounded: the same bits (max_ulp 0) or
 * within max_ulp bf16 ulps (same sign); slack_abs widens it for f32 values that
 * themselves may differ by that much (a reduction's order). */
static void check_bf16(const char *what, const uint16_t *dgot, const float *ref, size_t n, int max_ulp,
                       double slack_abs) {
  uint16_t *got = dget(dgot, n * sizeof(uint16_t));
  size_t ndiff = 0, bad = 0;
  int64_t worst = 0;
  for (size_t i = 0; i < n; i++) {
    uint16_t want = rf_bf16_from_f32(ref[i]);
    if (got[i] == want) continue;
    ndiff++;
    int64_t d = llabs((int64_t)got[i] - (int64_t)want);
    worst = d > worst ? d : worst;
    int ok = max_ulp > 0 && ((got[i] ^ want) & 0x8000) == 0 && d <= max_ulp;
    if (!ok && slack_abs > 0)
      ok = fabs((double)rf_f32_from_bf16(got[i]) - ref[i]) <= UB * fabs(ref[i]) + slack_abs;
    bad += !ok;
  }
  printf("  %-46s n=%-8zu %zu differ (max %lld ulp, allowed %d)\n", what, n, ndiff, (long long)worst,
         max_ulp);
  RF_CHECK(bad == 0, "%s: %zu of %zu bf16 elements outside %d ulp of the host's", what, bad, n, max_ulp);
  free(got);
}

static void check_f32_bits(const char *what, const float *dgot, const float *ref, size_t n) {
  float *got = dget(dgot, n * sizeof(float));
  size_t ndiff = 0;
  for (size_t i = 0; i < n; i++) ndiff += rf_f32_bits(got[i]) != rf_f32_bits(ref[i]);
  printf("  %-46s n=%-8zu %s (%zu differ)\n", what, n, ndiff ? "DIFFERENT" : "same bits", ndiff);
  RF_CHECK(ndiff == 0, "%s: %zu of %zu elements differ from the host", what, ndiff, n);
  free(got);
}

/* max |got - ref| / max |ref| within tol_u u */
static void check_f32_rel(const char *what, const float *dgot, const float *ref, size_t n, double tol_u) {
  float *got = dget(dgot, n * sizeof(float));
  double amax = rf_test_max_abs(ref, n), diff = rf_test_max_abs_diff(got, ref, n);
  double rel = amax > 0 ? diff / amax : diff;
  printf("  %-46s n=%-8zu err %8.2f u (tol %.0f u)\n", what, n, rel / U, tol_u);
  RF_CHECK(rel <= tol_u * U && amax > 0, "%s: %.3g u from the host (tolerance %.0f u)", what, rel / U, tol_u);
  free(got);
}

/* ---- RMSNorm with the residual add ---- */

static void test_add_rmsnorm(int rows, int dim, int with_branch) {
  size_t n = (size_t)rows * dim;
  float *resid = rand_f32(n, 2.0f), *w = rand_f32((size_t)dim, 1.0f), *bw;
  uint16_t *branch = rand_bf16(n, 1.0f, &bw);
  float *dres = dput(resid, n * 4), *dw_ = dput(w, (size_t)dim * 4), *drstd = dnan((size_t)rows * 4);
  uint16_t *dbr = dput(branch, n * 2), *dout = dnan(n * 2);
  rf_fused_add_rmsnorm_forward(dout, drstd, dres, with_branch ? dbr : NULL, dw_, rows, dim, 1e-5f, g_st);
  if (with_branch)
    for (size_t i = 0; i < n; i++) resid[i] += bw[i];
  float *out = rf_xmalloc(n * 4), *rstd = rf_xmalloc((size_t)rows * 4);
  rf_model_rmsnorm_forward(out, rstd, resid, w, rows, dim, 1e-5f);
  char what[96];
  snprintf(what, sizeof what, "add + rmsnorm %dx%d residual%s", rows, dim, with_branch ? " + branch" : "");
  check_f32_bits(what, dres, resid, n);
  check_f32_rel("  rstd", drstd, rstd, (size_t)rows, 8.0 * dim);
  check_bf16("  out (bf16)", dout, out, n, 1, 0);

  /* the backward with the host's rstd, adding into prefilled dresid and dw */
  float *gw, *dr0 = rand_f32(n, 1.0f), *dw0 = rand_f32((size_t)dim, 1.0f);
  uint16_t *g = rand_bf16(n, 1.0f, &gw);
  uint16_t *dg = dput(g, n * 2), *ddbranch = dnan(n * 2);
  float *ddr = dput(dr0, n * 4), *ddw = dput(dw0, (size_t)dim * 4), *dx = dput(resid, n * 4);
  upload(drstd, rstd, (size_t)rows * 4);
  size_t sb = rf_fused_rmsnorm_scratch_bytes(rows, dim);
  void *scratch = dnan(sb);
  rf_fused_add_rmsnorm_backward(ddr, ddbranch, ddw, dg, dx, drstd, dw_, rows, dim, scratch, sb, g_st);
  rf_model_rmsnorm_backward(dr0, dw0, gw, resid, rstd, w, rows, dim);
  check_f32_rel("  backward dresid (adds)", ddr, dr0, n, 8.0 * dim);
  check_f32_rel("  backward dw (adds)", ddw, dw0, (size_t)dim, 8.0 * rows);
  double amax = rf_test_max_abs(dr0, n);
  check_bf16("  backward dbranch (bf16)", ddbranch, dr0, n, 1, 8.0 * dim * U * amax);
  free(resid), free(w), free(bw), free(branch), free(out), free(rstd), free(gw), free(dr0), free(dw0),
      free(g);
  CK(cudaFree(dres)), CK(cudaFree(dw_)), CK(cudaFree(drstd)), CK(cudaFree(dbr)), CK(cudaFree(dout));
  CK(cudaFree(dg)), CK(cudaFree(ddbranch)), CK(cudaFree(ddr)), CK(cudaFree(ddw)), CK(cudaFree(dx));
  CK(cudaFree(scratch));
}

/* ---- RoPE, SwiGLU ---- */

static void test_rope(int batch, int seq, int nh, int nkv, int hd, int inverse) {
  size_t nq = (size_t)batch * seq * nh * hd, nk = (size_t)batch * seq * nkv * hd;
  float *qw, *kw, *cs = rf_xmalloc((size_t)seq * hd / 2 * 4), *sn = rf_xmalloc((size_t)seq * hd / 2 * 4);
  uint16_t *q = rand_bf16(nq, 3.0f, &qw), *k = rand_bf16(nk, 3.0f, &kw);
  rf_model_rope_tables(cs, sn, seq, hd, 10000.0);
  uint16_t *dq = dput(q, nq * 2), *dk = dput(k, nk * 2);
  float *dcs = dput(cs, (size_t)seq * hd / 2 * 4), *dsn = dput(sn, (size_t)seq * hd / 2 * 4);
  rf_fused_rope_qk(dq, dk, batch, seq, nh, nkv, hd, dcs, dsn, inverse, g_st);
  rf_model_rope_apply(qw, batch, seq, nh, hd, cs, sn, inverse);
  rf_model_rope_apply(kw, batch, seq, nkv, hd, cs, sn, inverse);
  char what[96];
  snprintf(what, sizeof what, "rope q %dx%dx%dx%d%s", batch, seq, nh, hd, inverse ? " inverse" : "");
  check_bf16(what, dq, qw, nq, 0, 0);
  snprintf(what, sizeof what, "rope k (%d kv heads, same launch)", nkv);
  check_bf16(what, dk, kw, nk, 0, 0);
  free(qw), free(kw), free(cs), free(sn), free(q), free(k);
  CK(cudaFree(dq)), CK(cudaFree(dk)), CK(cudaFree(dcs)), CK(cudaFree(dsn));
}

static void test_swiglu(size_t n) {
  float *gw, *uw, *hw;
  uint16_t *gate = rand_bf16(n, 6.0f, &gw), *up = rand_bf16(n, 2.0f, &uw), *dh = rand_bf16(n, 1.0f, &hw);
  uint16_t *dgate_ = dput(gate, n * 2), *dup_ = dput(up, n * 2), *dh_ = dput(dh, n * 2), *dout = dnan(n * 2);
  float *h = rf_xmalloc(n * 4), *dg = rf_xmalloc(n * 4), *du = rf_xmalloc(n * 4);
  rf_fused_swiglu_forward(dout, dgate_, dup_, n, g_st);
  rf_model_swiglu_forward(h, gw, uw, n);
  check_bf16("swiglu forward", dout, h, n, 0, 0);
  uint16_t *ddg = dnan(n * 2);
  rf_fused_swiglu_backward(ddg, dh_, dh_, dgate_, dup_, n, g_st); /* dup aliases dh */
  rf_model_swiglu_backward(dg, du, hw, gw, uw, n);
  check_bf16("swiglu backward dgate", ddg, dg, n, 0, 0);
  check_bf16("swiglu backward dup (aliasing dh)", dh_, du, n, 0, 0);
  free(gw), free(uw), free(hw), free(gate), free(up), free(dh), free(h), free(dg), free(du);
  CK(cudaFree(dgate_)), CK(cudaFree(dup_)), CK(cudaFree(dh_)), CK(cudaFree(dout)), CK(cudaFree(ddg));
}

/* ---- cross-entropy ---- */

static void test_cross_entropy(int n, int vocab) {
  size_t e = (size_t)n * vocab;
  float *zw;
  uint16_t *z = rand_bf16(e, 8.0f, &zw);
  int32_t *t = rf_xmalloc(sizeof(int32_t) * n);
  for (int r = 0; r < n; r++) {
    t[r] = r % 3 == 2 ? -1 : (int32_t)(rf_test_rand_u64(&g_rng) % (uint64_t)vocab);
    if (r == 0) t[r] = vocab - 1; /* the last column, in the last (partial) chunk */
    if (r == 1)
      z[(size_t)r * vocab + vocab - 1] = rf_bf16_from_f32(30.0f), zw[(size_t)r * vocab + vocab - 1] = 30.0f;
  }
  uint16_t *dz = dput(z, e * 2);
  int32_t *dt = dput(t, sizeof(int32_t) * n);
  float *dlse = dnan((size_t)n * 4);
  double *dloss = dnan(sizeof(double));
  size_t sb = rf_fused_ce_scratch_bytes(n, vocab);
  void *scratch = dnan(sb);
  rf_fused_cross_entropy_forward(dloss, dlse, dz, dt, n, vocab, scratch, sb, g_st);
  float *lse = rf_xmalloc((size_t)n * 4);
  double loss = rf_model_cross_entropy_forward(lse, zw, t, n, vocab);
  float *glse = dget(dlse, (size_t)n * 4);
  double *gloss = dget(dloss, sizeof(double));
  double worst = 0, tol = ldexp(1.0, -19);
  for (int r = 0; r < n; r++)
    worst = rf_test_max(worst, fabs((double)glse[r] - lse[r]) / (1.0 + fabs(lse[r])));
  double lmax = rf_test_max_abs(lse, (size_t)n);
  printf("  cross-entropy lse %d x %d (%d chunks)         err %.3g (1 + |lse|) (tol 2^-19 = %.3g)\n", n,
         vocab, rf_fused_ce_chunks(vocab), worst, tol);
  RF_CHECK(worst <= tol, "cross-entropy lse %d x %d: %.3g (1 + |lse|) from the host", n, vocab, worst);
  double lerr = fabs(*gloss - loss), ltol = n * tol * (1.0 + lmax);
  printf("  cross-entropy loss sum %-14.9g err %.3g (tol %.3g)\n", loss, lerr, ltol);
  RF_CHECK(lerr <= ltol, "cross-entropy loss %d x %d: %.9g, the host's %.9g", n, vocab, *gloss, loss);
  /* the backward on the host's lse: the same bits */
  upload(dlse, lse, (size_t)n * 4);
  float scale = 1.0f / (float)n;
  rf_fused_cross_entropy_backward(dz, dlse, dt, n, vocab, scale, g_st);
  rf_model_cross_entropy_backward(zw, lse, t, n, vocab, scale);
  char what[96];
  snprintf(what, sizeof what, "cross-entropy backward %d x %d", n, vocab);
  check_bf16(what, dz, zw, e, 0, 0);
  free(zw), free(z), free(t), free(lse), free(glse), free(gloss);
  CK(cudaFree(dz)), CK(cudaFree(dt)), CK(cudaFree(dlse)), CK(cudaFree(dloss)), CK(cudaFree(scratch));
}

static void check_same_bytes(const char *what, const void *dgot, const void *ref, size_t bytes) {
  void *got = dget(dgot, bytes);
  int same = memcmp(got, ref, bytes) == 0;
  printf("  %-46s %zu bytes %s\n", what, bytes, same ? "same" : "DIFFERENT");
  RF_CHECK(same, "%s differs from the host", what);
  free(got);
}

/* ---- FP8 of bf16 activations ---- */

/* rows x cols bf16 values, tile by tile of 128 columns: random magnitudes per tile, a zero
 * tile, a tile of subnormals, the largest bf16, e4m3's boundaries (448, its halfway points). */
static void test_fp8_rows(int rows, int cols, int pow2, int nonfinite) {
  size_t n = (size_t)rows * cols;
  uint16_t *x = rf_xmalloc(n * 2 + 4);
  float *w = rf_xmalloc(n * 4 + 4);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      int tile = r * 7 + c / 128;
      float v = rf_test_rand_f32(&g_rng) * ldexpf(1.0f, (tile % 29) - 14);
      if (tile % 11 == 3) v = 0.0f;
      if (tile % 11 == 5) v = rf_test_rand_f32(&g_rng) * 1e-39f;                     /* subnormal */
      if (tile % 11 == 7 && c % 5 == 0) v = (c % 10 ? -1.0f : 1.0f) * 3.3895314e38f; /* the largest bf16 */
      if (tile % 11 == 9) v = (c % 3 == 0 ? 448.0f : c % 3 == 1 ? 464.0f : 13.0f) * (c % 2 ? -1.0f : 1.0f);
      x[(size_t)r * cols + c] = rf_bf16_from_f32(v);
    }
  long long want_bad = INT64_MAX;
  if (nonfinite) {
    x[(size_t)(rows / 2) * cols + cols - 1] = 0x7fc0; /* NaN in the last, partial tile */
    x[(size_t)(rows - 1) * cols + 3] = 0xff80;        /* -inf, later */
    want_bad = (long long)(rows / 2) * cols + cols - 1;
  }
  for (size_t i = 0; i < n; i++) w[i] = rf_f32_from_bf16(x[i]);
  struct rf_fp8_grid grid = {rows, cols, 1, RF_FP8_TILE};
  size_t tiles = (size_t)rf_fp8_grid_tiles(&grid);
  uint8_t *codes = rf_xmalloc(n + 4);
  float *scales = rf_xmalloc(tiles * 4 + 4);
  int rc = rf_fp8_quantize(&grid, w, pow2, "x", codes, scales);
  uint16_t *dx = dput(x, n * 2);
  uint8_t *dcodes = dnan(n);
  float *dscales = dnan(tiles * 4);
  long long *dbad = dnan(sizeof(long long));
  rf_fused_fp8_quantize_rows_bf16(dcodes, dscales, dbad, dx, rows, cols, pow2, g_st);
  long long *bad = dget(dbad, sizeof(long long));
  char what[96];
  snprintf(what, sizeof what, "fp8 1x128 of bf16 %dx%d pow2 %d%s", rows, cols, pow2,
           nonfinite ? " NaN, -inf" : "");
  if (nonfinite) {
    printf("  %-46s host refuses: %s; first bad element %lld (want %lld)\n", what, rc ? "yes" : "NO", *bad,
           want_bad);
    RF_CHECK(rc != 0 && *bad == want_bad, "%s: bad %lld, want %lld (host rc %d)", what, *bad, want_bad, rc);
  } else {
    RF_CHECK(rc == 0 && *bad == INT64_MAX, "%s: host rc %d, device bad %lld", what, rc, *bad);
    check_same_bytes(what, dcodes, codes, n);
    check_same_bytes("  scales", dscales, scales, tiles * 4);
  }
  free(x), free(w), free(codes), free(scales), free(bad);
  CK(cudaFree(dx)), CK(cudaFree(dcodes)), CK(cudaFree(dscales)), CK(cudaFree(dbad));
}

/* ---- a unit's shard ---- */

#define PAD 3
#define SENTINEL 12345.0f

static void host_adamw(const struct rf_optim_hyper *h, float dec, float *p, const float *g, float *m,
                       float *v, int64_t len) {
  for (int64_t i = 0; i < len; i++) {
    float gi = g[i];
    float mi = RF_OPTIM_ADAMW_M(m[i], gi, h->one_m_b1);
    float vi = RF_OPTIM_ADAMW_V(v[i], gi, h->b2, h->one_m_b2);
    m[i] = mi;
    v[i] = vi;
    p[i] = RF_OPTIM_ADAMW_P(p[i], dec, h->step_size, mi, sqrtf(vi), h->bc2_sqrt, h->eps);
  }
}

static void test_shard(double max_norm) {
  /* lengths; zero-length pieces first, between and last */
  static const int64_t lens[] = {0, 5000, 0, 4096, 1, 0, 777, 0};
  static const int32_t decays[] = {1, 1, 0, 0, 1, 1, 0, 1};
  enum { NP = sizeof lens / sizeof lens[0] };
  struct rf_fused_piece pc[NP];
  int64_t at = PAD;
  for (int i = 0; i < NP; i++) {
    pc[i] = (struct rf_fused_piece){.offset = at, .len = lens[i], .decay = decays[i]};
    at += lens[i] + (lens[i] ? PAD : 0); /* an empty piece starts where its neighbour does */
  }
  const int64_t total = at;
  int64_t chunks = rf_fused_pieces_plan(pc, NP);
  RF_CHECK(chunks == 2 + 1 + 1 + 1, "the plan: %lld chunks, want 5", (long long)chunks);
  float *p = rf_xmalloc(total * 4), *g = rf_xmalloc(total * 4), *m = rf_xmalloc(total * 4);
  float *v = rf_xmalloc(total * 4);
  for (int64_t i = 0; i < total; i++) p[i] = g[i] = m[i] = v[i] = SENTINEL; /* padding */
  for (int i = 0; i < NP; i++)
    for (int64_t j = pc[i].offset; j < pc[i].offset + pc[i].len; j++) {
      p[j] = rf_test_rand_f32(&g_rng);
      m[j] = 0.1f * rf_test_rand_f32(&g_rng);
      v[j] = 0.01f * fabsf(rf_test_rand_f32(&g_rng));
    }
  float *dp = dput(p, total * 4), *dg = dput(g, total * 4), *dm = dput(m, total * 4),
        *dv = dput(v, total * 4);
  struct rf_fused_piece *dpc = dput(pc, sizeof pc);
  void *scratch = dnan((size_t)chunks * sizeof(double));
  double *dsq = dnan(sizeof(double)), *dnorm = dnan(sizeof(double));
  float *dfac = dnan(sizeof(float));
  struct rf_optim_hyper h = {.lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f};
  for (int step = 1; step <= 3; step++) {
    for (int i = 0; i < NP; i++)
      for (int64_t j = pc[i].offset; j < pc[i].offset + pc[i].len; j++)
        g[j] = rf_test_rand_f32(&g_rng) * (j % 7 == 0 ? 1e-3f : 1.0f);
    upload(dg, g, total * 4);
    /* the norm over two "units" (the same shard twice, the second accumulating) */
    rf_fused_sum_squares(dsq, 0, dg, dpc, NP, chunks, scratch, (size_t)chunks * sizeof(double), g_st);
    rf_fused_sum_squares(dsq, 1, dg, dpc, NP, chunks, scratch, (size_t)chunks * sizeof(double), g_st);
    rf_fused_clip_factor(dfac, dnorm, dsq, max_norm, g_st);
    double sq = 0;
    for (int i = 0; i < NP; i++)
      for (int64_t j = pc[i].offset; j < pc[i].offset + pc[i].len; j++) sq += (double)g[j] * g[j];
    sq *= 2;
    double *gsq = dget(dsq, sizeof(double)), *gnorm = dget(dnorm, sizeof(double));
    float *gfac = dget(dfac, sizeof(float));
    double rel = fabs(*gsq - sq) / sq;
    printf("  shard step %d: sum of squares rel err %.3g (tol 1e-12), norm %.6g, clip %.6g\n", step, rel,
           *gnorm, (double)*gfac);
    RF_CHECK(rel <= 1e-12, "sum of squares: %.17g, brute force %.17g", *gsq, sq);
    RF_CHECK(fabs(*gnorm - sqrt(sq)) <= 1e-12 * sqrt(sq), "norm %.17g, want %.17g", *gnorm, sqrt(sq));
    /* grads.c's rf_fsdp_clip_grads on the device's norm */
    double norm = *gnorm;
    int clip = max_norm > 0 && isfinite(norm) && norm > max_norm;
    float want = clip ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
    RF_CHECK(rf_f32_bits(*gfac) == rf_f32_bits(want), "clip factor %.9g, grads.c's %.9g", (double)*gfac,
             (double)want);
    RF_CHECK(clip == (max_norm < 1.0), "the clip %s as planned", clip ? "ran" : "did not run");
    /* the host: scale (only when clipping), then AdamW per piece */
    h.step_size = (float)((double)h.lr / (1.0 - pow((double)h.b1, step)));
    h.bc2_sqrt = (float)sqrt(1.0 - pow((double)h.b2, step));
    h.decay = 1.0f - h.lr * 0.1f;
    h.one_m_b1 = 1.0f - h.b1, h.one_m_b2 = 1.0f - h.b2;
    rf_fused_adamw(&h, dp, dg, dm, dv, dfac, dpc, NP, chunks, g_st);
    for (int i = 0; i < NP; i++) {
      float *gi = g + pc[i].offset;
      if (clip)
        for (int64_t j = 0; j < pc[i].len; j++) gi[j] *= want;
      host_adamw(&h, pc[i].decay ? h.decay : 1.0f, p + pc[i].offset, gi, m + pc[i].offset, v + pc[i].offset,
                 pc[i].len);
    }
    free(gsq), free(gnorm), free(gfac);
  }
  /* a non-finite norm: the device's factor is NaN (rf_device_clip_factor, the training step's),
   * the update skipped: p, m and v stay the host's */
  float fnan = NAN;
  upload(dfac, &fnan, sizeof fnan);
  rf_fused_adamw(&h, dp, dg, dm, dv, dfac, dpc, NP, chunks, g_st);
  char what[96];
  snprintf(what, sizeof what, "adamw over the shard p (max_norm %g)", max_norm);
  check_f32_bits(what, dp, p, (size_t)total);
  check_f32_bits("  m, padding untouched", dm, m, (size_t)total);
  check_f32_bits("  v, padding untouched", dv, v, (size_t)total);
  free(p), free(g), free(m), free(v);
  CK(cudaFree(dp)), CK(cudaFree(dg)), CK(cudaFree(dm)), CK(cudaFree(dv)), CK(cudaFree(dpc));
  CK(cudaFree(scratch)), CK(cudaFree(dsq)), CK(cudaFree(dnorm)), CK(cudaFree(dfac));
}

#ifndef RF_CUDA_EMU /* the stand-in skips the timing table: it would time the CPU */
/* ---- timing (on a GPU only) ---- */

#define REPS RF_GPU_TIMING_REPS

static void timed(const char *what, void (*fn)(void *), void *ctx, double bytes) {
  rf_gpu_timed(what, fn, ctx, bytes, g_st);
}

/* The 1.1B LLaMA's shape (configs/llama-1b.json at 8 x 2048 tokens). */
struct tctx {
  int n, b, t, hidden, nh, nkv, hd, inter, vocab;
  uint16_t *out, *br, *q, *k, *gate, *up, *h, *logits;
  float *resid, *w, *rstd, *dw, *cs, *sn, *lse, *p, *g, *m, *v, *fac;
  int32_t *tgt;
  double *loss, *sq;
  struct rf_fused_piece *pieces;
  int npieces;
  int64_t chunks;
  void *scratch;
  size_t scratch_bytes;
  struct rf_optim_hyper hyper;
};

static void t_norm_f(void *c_) {
  struct tctx *c = c_;
  rf_fused_add_rmsnorm_forward(c->out, c->rstd, c->resid, c->br, c->w, c->n, c->hidden, 1e-5f, g_st);
}
static void t_norm_b(void *c_) {
  struct tctx *c = c_;
  rf_fused_add_rmsnorm_backward(c->resid, c->br, c->dw, c->out, c->resid, c->rstd, c->w, c->n, c->hidden,
                                c->scratch, c->scratch_bytes, g_st);
}
static void t_rope(void *c_) {
  struct tctx *c = c_;
  rf_fused_rope_qk(c->q, c->k, c->b, c->t, c->nh, c->nkv, c->hd, c->cs, c->sn, 0, g_st);
}
static void t_swiglu_f(void *c_) {
  struct tctx *c = c_;
  rf_fused_swiglu_forward(c->h, c->gate, c->up, (size_t)c->n * c->inter, g_st);
}
static void t_swiglu_b(void *c_) {
  struct tctx *c = c_;
  rf_fused_swiglu_backward(c->gate, c->up, c->h, c->gate, c->up, (size_t)c->n * c->inter, g_st);
}
static void t_ce_f(void *c_) {
  struct tctx *c = c_;
  rf_fused_cross_entropy_forward(c->loss, c->lse, c->logits, c->tgt, c->n, c->vocab, c->scratch,
                                 c->scratch_bytes, g_st);
}
static void t_ce_b(void *c_) {
  struct tctx *c = c_;
  rf_fused_cross_entropy_backward(c->logits, c->lse, c->tgt, c->n, c->vocab, 1.0f / (float)c->n, g_st);
}
static void t_norm_clip(void *c_) {
  struct tctx *c = c_;
  rf_fused_sum_squares(c->sq, 0, c->g, c->pieces, c->npieces, c->chunks, c->scratch, c->scratch_bytes, g_st);
  rf_fused_clip_factor(c->fac, NULL, c->sq, 1.0, g_st);
}
static void t_adamw(void *c_) {
  struct tctx *c = c_;
  rf_fused_adamw(&c->hyper, c->p, c->g, c->m, c->v, c->fac, c->pieces, c->npieces, c->chunks, g_st);
}

static void *dzero(size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  CK(cudaMemsetAsync(p, 0, bytes, g_st));
  return p;
}

static void timing_table(const char *gpu) {
  struct tctx c = {
      .b = 8, .t = 2048, .hidden = 2048, .nh = 32, .nkv = 8, .hd = 64, .inter = 8192, .vocab = 32000};
  c.n = c.b * c.t;
  size_t nh = (size_t)c.n * c.hidden, ni = (size_t)c.n * c.inter, nv = (size_t)c.n * c.vocab;
  c.out = dzero(nh * 2), c.br = dzero(nh * 2), c.resid = dzero(nh * 4), c.w = dzero((size_t)c.hidden * 4);
  c.rstd = dzero((size_t)c.n * 4), c.dw = dzero((size_t)c.hidden * 4);
  c.q = dzero((size_t)c.n * c.nh * c.hd * 2), c.k = dzero((size_t)c.n * c.nkv * c.hd * 2);
  c.cs = dzero((size_t)c.t * c.hd / 2 * 4), c.sn = dzero((size_t)c.t * c.hd / 2 * 4);
  c.gate = dzero(ni * 2), c.up = dzero(ni * 2), c.h = dzero(ni * 2), c.logits = dzero(nv * 2);
  c.lse = dzero((size_t)c.n * 4), c.tgt = dzero((size_t)c.n * 4), c.loss = dzero(8), c.sq = dzero(8);
  c.fac = dzero(4);
  /* one layer's unit of the 1.1B model (wq, wk, wv, wo, gate, up, down, two norms): 61M elements */
  const int64_t lens[] = {(int64_t)c.hidden * c.hidden,
                          (int64_t)c.hidden * 512,
                          (int64_t)c.hidden * 512,
                          (int64_t)c.hidden * c.hidden,
                          (int64_t)c.hidden * c.inter,
                          (int64_t)c.hidden * c.inter,
                          (int64_t)c.hidden * c.inter,
                          c.hidden,
                          c.hidden};
  struct rf_fused_piece pc[9];
  int64_t at = 0;
  for (int i = 0; i < 9; i++) {
    pc[i] = (struct rf_fused_piece){.offset = at, .len = lens[i], .decay = i < 7};
    at += lens[i];
  }
  c.npieces = 9;
  c.chunks = rf_fused_pieces_plan(pc, 9);
  c.pieces = dput(pc, sizeof pc);
  c.p = dzero((size_t)at * 4), c.g = dzero((size_t)at * 4), c.m = dzero((size_t)at * 4),
  c.v = dzero((size_t)at * 4);
  c.hyper = (struct rf_optim_hyper){.lr = 1e-4f,
                                    .b1 = 0.9f,
                                    .b2 = 0.95f,
                                    .eps = 1e-8f,
                                    .step_size = 1e-3f,
                                    .bc2_sqrt = 0.3f,
                                    .decay = 0.99f,
                                    .one_m_b1 = 0.1f,
                                    .one_m_b2 = 0.05f};
  c.scratch_bytes = rf_fused_ce_scratch_bytes(c.n, c.vocab);
  if (rf_fused_rmsnorm_scratch_bytes(c.n, c.hidden) > c.scratch_bytes)
    c.scratch_bytes = rf_fused_rmsnorm_scratch_bytes(c.n, c.hidden);
  if ((size_t)c.chunks * 8 > c.scratch_bytes) c.scratch_bytes = (size_t)c.chunks * 8;
  c.scratch = dzero(c.scratch_bytes);
  CK(cudaStreamSynchronize(g_st));
  printf("timing on %s: the 1.1B LLaMA's shape, %d x %d tokens, median of %d (fused kernels)\n", gpu, c.b,
         c.t, REPS);
  timed("fused add + rmsnorm forward", t_norm_f, &c, (double)nh * (2 + 4 + 4 + 2));
  timed("fused add + rmsnorm backward", t_norm_b, &c, (double)nh * (2 + 4 + 4 + 4 + 2 + 2));
  timed("fused rope q, k", t_rope, &c, (double)c.n * (c.nh + c.nkv) * c.hd * 4);
  timed("fused swiglu forward", t_swiglu_f, &c, (double)ni * 6);
  timed("fused swiglu backward", t_swiglu_b, &c, (double)ni * 10);
  timed("fused cross-entropy forward", t_ce_f, &c, (double)nv * 2);
  timed("fused cross-entropy backward", t_ce_b, &c, (double)nv * 4);
  timed("fused grad norm + clip (1 unit)", t_norm_clip, &c, (double)at * 4);
  timed("fused adamw (1 unit, 61M)", t_adamw, &c, (double)at * 28);
}
#endif

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "test_fused_cuda: no CUDA device (run it on a GPU machine: scripts/gpu-check)\n");
    return 1;
  }
  CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
  test_add_rmsnorm(300, 768, 1);
  test_add_rmsnorm(37, 64, 0); /* the q/k norms' shape, no add */
  test_rope(2, 50, 4, 2, 64, 0);
  test_rope(1, 33, 2, 1, 128, 1);
  test_swiglu(100003);
  test_swiglu(2200001); /* past 8192 blocks of 256: the grid-stride loops go round */
  test_cross_entropy(4, 151936);
  test_cross_entropy(5, 1001);
  test_cross_entropy(3, 4096);
  test_cross_entropy(3, 4097);
  test_fp8_rows(37, 300, 0, 0); /* a partial last tile */
  test_fp8_rows(37, 300, 1, 0);
  test_fp8_rows(5, 1024, 0, 0);
  test_fp8_rows(9, 260, 0, 1);     /* NaN and -inf: the host refuses, the device names the first */
  test_fp8_rows(520, 16384, 1, 0); /* 66560 tiles: past the 65536 warps of 8192 blocks */
  test_shard(1e9);                 /* no clipping */
  test_shard(0.5);                 /* clipping */
#ifndef RF_CUDA_EMU
  if (rf_test_failures == 0) {
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    timing_table(prop.name);
  }
#endif
  CK(cudaStreamDestroy(g_st));
  return rf_test_finish("test_fused_cuda");
}
