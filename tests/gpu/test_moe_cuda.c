/* GPU test (scripts/gpu-check on a GPU; make BACKEND=cuda-emu runs it on the CPU stand-in,
 * tests/test_cuda_emu_fused.c): the MoE token movement of src/model/moe_cuda.cu against a
 * brute-force host reference written from moe.c's loops (moe_group, the combine, the
 * backward's scatter and sums, the statistics):
 *   - the same values exactly: off, tok, pos, the counts, the probabilities' sums (f64 in
 *     row order), the gathered rows (zero padding), the combine, the gradient scatter and
 *     the backward's sums (each term added in j order, no FMA contraction: the same bits);
 *   - the routing weights' gradients (a dot of h terms reduced in another order) within
 *     8 h u of the sum of the terms' magnitudes (u = 2^-24);
 *   - idle experts: an expert no token chose has off[e] = off[e+1], and nothing is written
 *     for it; all tokens on one expert; a cap too small: the overflow flag and off[ne] hold
 *     the rows needed and nothing past cap is written (sentinels);
 *   - the kernel table's calls (kernels_cuda.cu): the grouping without scratch (the counts
 *     kept in off), the statistics (rf_moe_cuda_stats: counts and sums added, the same bits).
 * Shapes: 300 tokens top-2 of 8 experts (expert 5 idle), chunks of 16 rows; 1000 tokens
 * top-8 of 64 (a 128-expert model's shard of experts) with a chunk of 1; 40 tokens all on
 * expert 2 of 4. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/moe_cuda.h"
#include "rf_test.h"

#define U (1.0 / 16777216.0)

static void ck_(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  exit(1);
}
#define CK(call) ck_((call), #call, __FILE__, __LINE__)

static uint64_t g_rng = 20261203;
static cudaStream_t g_st;

static void *dput(const void *h, size_t bytes) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  CK(cudaMemcpyAsync(p, h, bytes, cudaMemcpyHostToDevice, g_st));
  CK(cudaStreamSynchronize(g_st));
  return p;
}
static void *dfill(size_t bytes, int byte) {
  void *p = NULL;
  CK(cudaMalloc(&p, bytes ? bytes : 4));
  CK(cudaMemsetAsync(p, byte, bytes, g_st));
  CK(cudaStreamSynchronize(g_st));
  return p;
}
static void *dget(const void *d, size_t bytes) {
  void *h = rf_xmalloc(bytes + 4);
  CK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, g_st));
  CK(cudaStreamSynchronize(g_st));
  return h;
}
static float *rand_f32(size_t n) {
  float *p = rf_xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = rf_test_rand_f32(&g_rng);
  return p;
}

static void check_same(const char *what, const void *dgot, const void *ref, size_t bytes) {
  void *got = dget(dgot, bytes);
  int same = memcmp(got, ref, bytes) == 0;
  printf("  %-52s %zu bytes %s\n", what, bytes, same ? "same" : "DIFFERENT");
  RF_CHECK(same, "%s differs from the host reference", what);
  free(got);
}

/* top: every choice of a token distinct; `idle` never chosen (-1: none); `only` >= 0: every
 * token's first choice is it (k = 1 then). */
static void test_moe(int n, int k, int ne, int rows, int idle, int only) {
  const int h = 48, nk = n * k;
  int32_t *top = rf_xmalloc(sizeof(int32_t) * nk);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      int e, dup;
      do {
        e = only >= 0 ? only : (int)(rf_test_rand_u64(&g_rng) % (uint64_t)ne);
        dup = e == idle;
        for (int q = 0; q < j; q++) dup |= top[r * k + q] == e;
      } while (dup);
      top[r * k + j] = e;
    }
  /* the reference grouping: moe.c's moe_group */
  int32_t *off = rf_xmalloc(sizeof(int32_t) * (ne + 1));
  off[0] = 0;
  for (int e = 0; e < ne; e++) {
    int c = 0;
    for (int i = 0; i < nk; i++) c += top[i] == e;
    off[e + 1] = off[e] + (c + rows - 1) / rows * rows;
  }
  const int total = off[ne], cap = total + 5;
  int32_t *tok = rf_xmalloc(sizeof(int32_t) * cap), *pos = rf_xmalloc(sizeof(int32_t) * nk);
  for (int r = 0; r < cap; r++) tok[r] = -7; /* past off[ne]: left alone (the device's prefill) */
  double *counts = rf_xcalloc((size_t)ne, sizeof(double));
  for (int e = 0; e < ne; e++) {
    int row = off[e];
    for (int i = 0; i < nk; i++)
      if (top[i] == e) {
        tok[row] = i / k;
        pos[i] = row++;
        counts[e] += 1.0;
      }
    for (; row < off[e + 1]; row++) tok[row] = -1;
  }
  for (int e = 0; e < ne; e++) counts[e] += 3.0; /* the device adds to what is there */
  if (idle >= 0) RF_CHECK(off[idle] == off[idle + 1], "expert %d idle in the reference", idle);

  int32_t *dtop = dput(top, sizeof(int32_t) * nk), *doff = dfill(sizeof(int32_t) * (ne + 1), 0xff);
  int32_t *dpos = dfill(sizeof(int32_t) * nk, 0xff), *dtok;
  {
    int32_t *t7 = rf_xmalloc(sizeof(int32_t) * cap);
    for (int r = 0; r < cap; r++) t7[r] = -7;
    dtok = dput(t7, sizeof(int32_t) * cap);
    free(t7);
  }
  double *c3 = rf_xmalloc(sizeof(double) * ne);
  for (int e = 0; e < ne; e++) c3[e] = 3.0;
  double *dcounts = dput(c3, sizeof(double) * ne);
  int *doverflow = dfill(sizeof(int), 0xff);
  size_t sb = rf_moe_cuda_group_scratch_bytes(ne);
  void *scratch = dfill(sb, 0xff);
  rf_moe_cuda_group(doff, dtok, dpos, dcounts, doverflow, dtop, n, k, ne, rows, cap, scratch, sb, g_st);
  char what[128];
  snprintf(what, sizeof what, "group %d tokens top-%d of %d (chunks of %d): off", n, k, ne, rows);
  check_same(what, doff, off, sizeof(int32_t) * (ne + 1));
  check_same("  tok (padding -1, past off[ne] untouched)", dtok, tok, sizeof(int32_t) * cap);
  check_same("  pos", dpos, pos, sizeof(int32_t) * nk);
  check_same("  counts (added)", dcounts, counts, sizeof(double) * ne);
  int zero = 0;
  check_same("  no overflow", doverflow, &zero, sizeof(int));
  { /* the kernel table's call: no scratch (the counts kept in off until replaced), no flag */
    int32_t *doff2 = dfill(sizeof(int32_t) * (ne + 1), 0xff), *dpos2 = dfill(sizeof(int32_t) * nk, 0xff);
    int32_t *t7 = rf_xmalloc(sizeof(int32_t) * cap);
    for (int r = 0; r < cap; r++) t7[r] = -7;
    int32_t *dtok2 = dput(t7, sizeof(int32_t) * cap);
    rf_moe_cuda_group(doff2, dtok2, dpos2, NULL, NULL, dtop, n, k, ne, rows, cap, NULL, 0, g_st);
    check_same("  without scratch: off", doff2, off, sizeof(int32_t) * (ne + 1));
    check_same("  without scratch: tok", dtok2, tok, sizeof(int32_t) * cap);
    check_same("  without scratch: pos", dpos2, pos, sizeof(int32_t) * nk);
    free(t7);
    CK(cudaFree(doff2)), CK(cudaFree(dpos2)), CK(cudaFree(dtok2));
  }

  /* the probabilities' sums, f64 in row order */
  float *probs = rand_f32((size_t)n * ne);
  double *psum = rf_xmalloc(sizeof(double) * ne);
  for (int e = 0; e < ne; e++) psum[e] = 0.25 * e;
  double *dpsum = dput(psum, sizeof(double) * ne);
  float *dprobs = dput(probs, sizeof(float) * n * ne);
  for (int r = 0; r < n; r++)
    for (int e = 0; e < ne; e++) psum[e] += probs[(size_t)r * ne + e];
  rf_moe_cuda_prob_sums(dpsum, dprobs, n, ne, g_st);
  check_same("  probability sums", dpsum, psum, sizeof(double) * ne);
  /* moe.c's statistics (the kernel table's moe_stats): the counts added again, the sums again */
  for (int e = 0; e < ne; e++) counts[e] += counts[e] - 3.0;
  for (int r = 0; r < n; r++)
    for (int e = 0; e < ne; e++) psum[e] += probs[(size_t)r * ne + e];
  rf_moe_cuda_stats(dcounts, dpsum, dtop, dprobs, n, k, ne, g_st);
  check_same("  statistics: counts (added)", dcounts, counts, sizeof(double) * ne);
  check_same("  statistics: probability sums", dpsum, psum, sizeof(double) * ne);

  /* gather */
  float *x = rand_f32((size_t)n * h), *xg = rf_xmalloc(sizeof(float) * cap * h);
  for (int r = 0; r < cap; r++)
    for (int i = 0; i < h; i++)
      xg[(size_t)r * h + i] = r >= total ? NAN : tok[r] >= 0 ? x[(size_t)tok[r] * h + i] : 0.0f;
  float *dx = dput(x, sizeof(float) * n * h), *dxg = dfill(sizeof(float) * cap * h, 0xff);
  rf_moe_cuda_gather(dxg, dx, dtok, doff, ne, cap, h, g_st);
  {
    float *got = dget(dxg, sizeof(float) * cap * h);
    int same = memcmp(got, xg, sizeof(float) * (size_t)total * h) == 0;
    for (size_t e = (size_t)total * h; e < (size_t)cap * h; e++) same &= isnan(got[e]);
    printf("  %-52s %s\n", "gather (zero padding, nothing past off[ne])", same ? "same" : "DIFFERENT");
    RF_CHECK(same, "MoE gather differs from the reference");
    free(got);
  }

  /* combine: out += sum_j topw * ey[pos] */
  float *ey = rand_f32((size_t)cap * h), *topw = rand_f32((size_t)nk), *out = rand_f32((size_t)n * h);
  float *dey = dput(ey, sizeof(float) * cap * h), *dtopw = dput(topw, sizeof(float) * nk);
  float *dout_ = dput(out, sizeof(float) * n * h);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++)
      for (int i = 0; i < h; i++)
        out[(size_t)r * h + i] += topw[r * k + j] * ey[(size_t)pos[r * k + j] * h + i];
  rf_moe_cuda_combine(dout_, dey, dpos, dtopw, n, k, h, g_st);
  check_same("  combine (adds, j in order)", dout_, out, sizeof(float) * n * h);

  /* backward: dtopw, the weighted scatter, the sums back */
  float *g = rand_f32((size_t)n * h), *dg = dput(g, sizeof(float) * n * h);
  float *ddt = dfill(sizeof(float) * nk, 0xff);
  rf_moe_cuda_dtopw(ddt, dg, dey, dpos, n, k, h, g_st);
  {
    float *got = dget(ddt, sizeof(float) * nk);
    double worst = 0;
    int bad = 0;
    for (int c = 0; c < nk; c++) {
      const float *y = ey + (size_t)pos[c] * h, *gr = g + (size_t)(c / k) * h;
      float dot = 0.0f;
      double mag = 0;
      for (int i = 0; i < h; i++) dot += gr[i] * y[i], mag += fabs((double)gr[i] * y[i]);
      double err = fabs((double)got[c] - dot) / (mag > 0 ? mag : 1);
      worst = rf_test_max(worst, err);
      bad += !(err <= 8.0 * h * U);
    }
    printf("  %-52s err %.2f u of sum |g y| (tol %d u)\n", "routing-weight gradients", worst / U, 8 * h);
    RF_CHECK(bad == 0, "MoE dtopw: %d of %d outside 8 h u", bad, nk);
    free(got);
  }
  float *dyg = rf_xmalloc(sizeof(float) * cap * h);
  for (int r = 0; r < cap; r++)
    for (int i = 0; i < h; i++) dyg[(size_t)r * h + i] = r >= total ? NAN : 0.0f;
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++)
      for (int i = 0; i < h; i++)
        dyg[(size_t)pos[r * k + j] * h + i] = topw[r * k + j] * g[(size_t)r * h + i];
  float *ddyg = dfill(sizeof(float) * cap * h, 0xff);
  rf_moe_cuda_scatter_grad(ddyg, dg, dpos, dtopw, dtok, doff, ne, cap, n, k, h, g_st);
  {
    float *got = dget(ddyg, sizeof(float) * cap * h);
    int same = memcmp(got, dyg, sizeof(float) * (size_t)total * h) == 0;
    for (size_t e = (size_t)total * h; e < (size_t)cap * h; e++) same &= isnan(got[e]);
    printf("  %-52s %s\n", "gradient scatter (weighted, zero padding)", same ? "same" : "DIFFERENT");
    RF_CHECK(same, "MoE gradient scatter differs from the reference");
    free(got);
  }
  float *dxn = rand_f32((size_t)n * h), *ddxn = dput(dxn, sizeof(float) * n * h);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++)
      for (int i = 0; i < h; i++) dxn[(size_t)r * h + i] += ey[(size_t)pos[r * k + j] * h + i];
  rf_moe_cuda_sum_back(ddxn, dey, dpos, n, k, h, g_st);
  check_same("  backward sums (adds, j in order)", ddxn, dxn, sizeof(float) * n * h);

  /* a cap too small: the rows needed reported (the flag, and off[ne], which moe.c checks
   * against its cap: without scratch, as the kernel table calls it), nothing past cap written */
  if (total > rows) {
    int small = total - rows;
    for (int pass = 0; pass < 2; pass++) {
      int32_t *dtok2 = dfill(sizeof(int32_t) * cap, 0x7f);
      rf_moe_cuda_group(doff, dtok2, dpos, NULL, doverflow, dtop, n, k, ne, rows, small,
                        pass ? NULL : scratch, pass ? 0 : sb, g_st);
      int *ov = dget(doverflow, sizeof(int));
      int32_t *o2 = dget(doff, sizeof(int32_t) * (ne + 1));
      int32_t *t2 = dget(dtok2, sizeof(int32_t) * cap);
      int untouched = 1;
      for (int r = small; r < cap; r++) untouched &= t2[r] == 0x7f7f7f7f;
      printf("  %-52s overflow %d, off[ne] %d (want %d), past cap untouched: %s\n",
             pass ? "cap too small (no scratch)" : "cap too small", *ov, o2[ne], total,
             untouched ? "yes" : "NO");
      RF_CHECK(*ov == total && o2[ne] == total && untouched,
               "MoE grouping past its cap: overflow %d, off[ne] %d, want %d", *ov, o2[ne], total);
      free(ov), free(o2), free(t2);
      CK(cudaFree(dtok2));
    }
  }
  free(top), free(off), free(tok), free(pos), free(counts), free(c3), free(probs), free(psum), free(x),
      free(xg);
  free(ey), free(topw), free(out), free(g), free(dyg), free(dxn);
  CK(cudaFree(dtop)), CK(cudaFree(doff)), CK(cudaFree(dtok)), CK(cudaFree(dpos)), CK(cudaFree(dcounts));
  CK(cudaFree(doverflow)), CK(cudaFree(scratch)), CK(cudaFree(dpsum)), CK(cudaFree(dprobs)), CK(cudaFree(dx));
  CK(cudaFree(dxg)), CK(cudaFree(dey)), CK(cudaFree(dtopw)), CK(cudaFree(dout_)), CK(cudaFree(dg));
  CK(cudaFree(ddt)), CK(cudaFree(ddyg)), CK(cudaFree(ddxn));
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "test_moe_cuda: no CUDA device (run it on a GPU machine: scripts/gpu-check)\n");
    return 1;
  }
  CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
  test_moe(300, 2, 8, 16, 5, -1); /* Mixtral-like, expert 5 idle */
  test_moe(1000, 8, 64, 1, -1, -1);
  test_moe(40, 1, 4, 8, -1, 2); /* every token on expert 2: three idle experts */
  CK(cudaStreamDestroy(g_st));
  return rf_test_finish("test_moe_cuda");
}
