/* `--fp8 block`'s operands on the GPU (src/model/fp8_linear_cuda.cu) against src/core/fp8.c, bit for
 * bit: activations [37, 300] in 1 x 128 tiles (a partial tile, rows padded to 48, k to 384; an
 * outlier), the weight gradient's tokens [96, 40] in 128 x 1 tiles restarting at each sequence of 32
 * (padded to 128) and of 96 (one run), a gathered weight [200, 300] as itself and transposed with
 * its tiles' scales in cuBLASLt's layout (rf_gemm_cuda_fp8_scale_at), zero codes and NaN scales in
 * the padding; a NaN activation sets the device flag that turns the output NaN. Run by
 * tests/test_cuda_emu_fp8.c on the CPU stand-in. */
#include <math.h>
#include <string.h>

#include "gemm/gemm_cuda.h"
#include "gpu_test.h"
#include "model/fp8_linear_cuda.h"

static void *get(const void *d, size_t bytes) {
  void *h = rf_xmalloc(bytes + 4);
  RF_GPU_CK(cudaDeviceSynchronize());
  RF_GPU_CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

static int same_f32(float a, float b) { return rf_f32_bits(a) == rf_f32_bits(b); }

static void check_rows(int *bad) {
  const int rows = 37, k = 300, rp = 48, kp = 384, kb = 3;
  uint64_t st = 7;
  float *x = rf_xmalloc((size_t)rows * k * 4), *hs = rf_xmalloc((size_t)rows * kb * 4);
  for (int i = 0; i < rows * k; i++) x[i] = rf_test_rand_f32(&st) * (i % 97 == 5 ? 300.0f : 1.0f);
  uint8_t *hc = rf_xmalloc((size_t)rows * k);
  struct rf_fp8_grid g = {rows, k, 1, RF_FP8_TILE};
  RF_ASSERT(rf_fp8_quantize(&g, x, 0, "x", hc, hs) == 0);
  float *dx = rf_gpu_dput(x, (size_t)rows * k * 4), *ds = rf_gpu_dnan((size_t)rp * kb);
  uint8_t *dc = rf_gpu_dalloc((size_t)rp * kp);
  RF_GPU_CK(rf_fp8_linear_cuda_reset(bad, 0));
  RF_GPU_CK(rf_fp8_linear_cuda_rows(dx, rows, k, rp, kp, 0, dc, ds, bad, 0));
  uint8_t *c = get(dc, (size_t)rp * kp);
  float *s = get(ds, (size_t)rp * kb * 4);
  int *b = get(bad, sizeof(int)), wrong = 0;
  for (int r = 0; r < rp; r++)
    for (int p = 0; p < kp; p++) wrong += c[r * kp + p] != (r < rows && p < k ? hc[r * k + p] : 0);
  for (int r = 0; r < rp; r++)
    for (int q = 0; q < kb; q++)
      wrong += !same_f32(s[rf_gemm_cuda_fp8_scale_at(rp, kp, 1, r, q)], r < rows ? hs[r * kb + q] : 1.0f);
  printf("  rows 37 x 300 (1 x 128 tiles, padded 48 x 384): %d codes or scales differ, flag %d\n", wrong, *b);
  RF_CHECK(wrong == 0 && *b == 0, "rows: %d differ from fp8.c, flag %d", wrong, *b);
  x[5 * k + 200] = NAN; /* a NaN: the flag set, its tile's scale NaN */
  RF_GPU_CK(cudaMemcpy(dx, x, (size_t)rows * k * 4, cudaMemcpyHostToDevice));
  RF_GPU_CK(rf_fp8_linear_cuda_reset(bad, 0));
  RF_GPU_CK(rf_fp8_linear_cuda_rows(dx, rows, k, rp, kp, 0, dc, ds, bad, 0));
  free(b), free(s);
  b = get(bad, sizeof(int));
  s = get(ds, (size_t)rp * kb * 4);
  RF_CHECK(*b == 1 && isnan(s[rf_gemm_cuda_fp8_scale_at(rp, kp, 1, 5, 1)]), "a NaN: flag %d, its scale %g",
           *b, s[rf_gemm_cuda_fp8_scale_at(rp, kp, 1, 5, 1)]);
  float y[8] = {1, 2, 3, 4, 5, 6, 7, 8}, *dy = rf_gpu_dput(y, sizeof y);
  RF_GPU_CK(rf_fp8_linear_cuda_finish(dy, 4, NULL, 2, 4, 4, 1, bad, 0));
  float *gy = get(dy, sizeof y);
  int nans = 0;
  for (int i = 0; i < 8; i++) nans += isnan(gy[i]);
  RF_CHECK(nans == 8, "the flag set: %d of 8 outputs NaN", nans);
  cudaFree(dx), cudaFree(ds), cudaFree(dc), cudaFree(dy);
  free(x), free(hs), free(hc), free(c), free(s), free(b), free(gy);
}

static void check_tokens(int *bad, int run) {
  const int n = 96, cols = 40, cp = 48, seg = (run + 127) / 128 * 128, nseg = n / run, kp = nseg * seg;
  uint64_t st = 11 + (uint64_t)run;
  float *x = rf_xmalloc((size_t)n * cols * 4);
  for (int i = 0; i < n * cols; i++) x[i] = rf_test_rand_f32(&st) * (i % 53 == 3 ? 50.0f : 1.0f);
  float *dx = rf_gpu_dput(x, (size_t)n * cols * 4), *ds = rf_gpu_dnan((size_t)cp * (kp / 128));
  uint8_t *dc = rf_gpu_dalloc((size_t)cp * kp);
  RF_GPU_CK(rf_fp8_linear_cuda_reset(bad, 0));
  RF_GPU_CK(rf_fp8_linear_cuda_tokens(dx, n, cols, cp, run, 0, dc, ds, bad, 0));
  uint8_t *c = get(dc, (size_t)cp * kp);
  float *s = get(ds, (size_t)cp * (kp / 128) * 4);
  int wrong = 0;
  for (int g = 0; g < nseg; g++) { /* fp8.c's 128 x 1 tiles of sequence g */
    struct rf_fp8_grid gr = {run, cols, RF_FP8_TILE, 1};
    int tr = (run + 127) / 128;
    uint8_t *hc = rf_xmalloc((size_t)run * cols);
    float *hs = rf_xmalloc((size_t)tr * cols * 4);
    RF_ASSERT(rf_fp8_quantize(&gr, x + (size_t)g * run * cols, 0, "x", hc, hs) == 0);
    for (int col = 0; col < cp; col++)
      for (int t = 0; t < seg; t++)
        wrong += c[(size_t)col * kp + g * seg + t] != (col < cols && t < run ? hc[t * cols + col] : 0);
    for (int col = 0; col < cols; col++)
      for (int q = 0; q < tr; q++)
        wrong +=
            !same_f32(s[rf_gemm_cuda_fp8_scale_at(cp, kp, 1, col, g * (seg / 128) + q)], hs[q * cols + col]);
    free(hc), free(hs);
  }
  printf("  tokens 96 x 40 in sequences of %d (128 x 1 tiles, padded 48 x %d): %d codes or scales differ\n",
         run, kp, wrong);
  RF_CHECK(wrong == 0, "tokens (run %d): %d differ from fp8.c", run, wrong);
  cudaFree(dx), cudaFree(ds), cudaFree(dc);
  free(x), free(c), free(s);
}

static void check_weight(int trans) {
  const int out = 200, in = 300, tr = 2, tc = 3;
  int rows = trans ? in : out, k = trans ? out : in, rp = (rows + 15) / 16 * 16, kp = (k + 127) / 128 * 128;
  uint64_t st = 5 + (uint64_t)trans;
  uint8_t *w = rf_xmalloc((size_t)out * in);
  float ws[6];
  for (int i = 0; i < out * in; i++) w[i] = (uint8_t)(rf_test_rand_u64(&st) & 0x7e);
  for (int i = 0; i < tr * tc; i++) ws[i] = 0.5f + (float)i;
  uint8_t *dw = rf_gpu_dput(w, (size_t)out * in), *dc = rf_gpu_dalloc((size_t)rp * kp);
  float *dws = rf_gpu_dput(ws, sizeof ws);
  int64_t ns = rf_gemm_cuda_fp8_scales(rp, kp, RF_FP8_TILE);
  float *ds = rf_gpu_dalloc((size_t)ns * 4);
  RF_GPU_CK(rf_fp8_linear_cuda_weight(dw, dws, out, in, trans, rp, kp, dc, ds, 0));
  uint8_t *c = get(dc, (size_t)rp * kp);
  float *s = get(ds, (size_t)ns * 4);
  int wrong = 0;
  for (int r = 0; r < rp; r++)
    for (int p = 0; p < kp; p++)
      wrong += c[(size_t)r * kp + p] != (r < rows && p < k ? (trans ? w[p * in + r] : w[r * in + p]) : 0);
  int64_t l4 = (kp / 128 + 3) / 4 * 4;
  for (int64_t rb = 0; rb < (rp + 127) / 128; rb++)
    for (int64_t q = 0; q < l4; q++) {
      float v = s[rf_gemm_cuda_fp8_scale_at(rp, kp, RF_FP8_TILE, rb * 128, q)];
      int real = rb < (rows + 127) / 128 && q < (k + 127) / 128;
      wrong += real ? !same_f32(v, trans ? ws[q * tc + rb] : ws[rb * tc + q]) : !isnan(v);
    }
  printf("  weight 200 x 300%s (padded %d x %d, 128 x 128 scales in cuBLASLt's layout): %d differ\n",
         trans ? " transposed" : "", rp, kp, wrong);
  RF_CHECK(wrong == 0, "weight (trans %d): %d codes or scales differ", trans, wrong);
  cudaFree(dw), cudaFree(dc), cudaFree(dws), cudaFree(ds);
  free(w), free(c), free(s);
}

int main(void) {
  int *bad = rf_gpu_dalloc(sizeof(int));
  check_rows(bad);
  check_tokens(bad, 32);
  check_tokens(bad, 96);
  check_weight(0);
  check_weight(1);
  cudaFree(bad);
  return rf_test_finish("test_fp8_linear_cuda");
}
