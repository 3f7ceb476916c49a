/* GPU test (run by scripts/gpu-check): the cuBLASLt product (src/gemm/gemm_cuda.c)
 * against the host's (rf_gemm_run, oneDNN) on the same bf16 operands, for every
 * combination of transposes, leading dimensions wider than the rows, odd sizes, beta 0
 * and 1, alpha != 1, and an f32 and a bf16 output; with cuBLASLt's bias epilogue
 * (rf_gemm_cuda_run_bias) against the host product plus the bias per column (the bias's
 * magnitude counted in S below).
 *
 * Tolerances, in units of bf16's roundoff u = 2^-8 (the relative spacing of bf16):
 * both sides multiply the same bf16 values exactly and sum in f32, in different
 * orders, so an f32 output may differ by at most 2^-8 u = 2^-16 of S(i, j) = sum over k
 * of |alpha a(i,k) b(k,j)| + |beta c(i,j)| (k * 2^-24 S bounds it; k <= 1000 here); a
 * bf16 output adds the one rounding of C to bf16: half a bf16 ulp, which is up to
 * 2^-8 |C| (u: bf16 keeps 8 significant bits; 2^-9 was half of that and failed on the
 * CPU stand-in by 1.9x, where rounding to nearest is exact), so within 2^-16 S + 2^-8
 * |C|. Also: a repeated call after warm-up
 * plans nothing, allocates nothing on the device or the heap. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "device/device_cuda.h"
#include "gemm/gemm_cuda.h"
#include "rf_test.h"

static struct rf_device gpu;
static struct rf_device_stream *gs; /* every call names a stream: the CUDA table refuses NULL */
#define GS gs

static void *to_gpu(const void *src, size_t bytes) {
  void *d = rf_device_alloc(&gpu, bytes, 256);
  rf_device_copy(&gpu, d, src, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  return d;
}

/* src's bytes `shift` bytes into a new device allocation (256-byte aligned): an operand aligned to
 * `shift` bytes only (0: 256). *base: the allocation, for rf_device_release. */
static void *to_gpu_at(const void *src, size_t bytes, size_t shift, void **base) {
  *base = rf_device_alloc(&gpu, bytes + shift, 256);
  void *d = (char *)*base + shift;
  rf_device_copy(&gpu, d, src, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  return d;
}

/* shift: A, B and C each that many bytes past a 256-byte boundary (their alignment). */
static void check_shape(struct rf_gemm_cuda *g, int m, int n, int k, int ta, int tb, int pad, float alpha,
                        float beta, enum rf_dtype c_dtype, int with_bias, size_t shift) {
  struct rf_gemm_desc d = {
      m, n, k, ta, tb, (ta ? m : k) + pad, (tb ? k : n) + pad, n + pad, RF_DTYPE_BF16, alpha, beta};
  size_t arows = (size_t)(ta ? k : m), brows = (size_t)(tb ? n : k);
  size_t na = arows * (size_t)d.lda, nb = brows * (size_t)d.ldb, nc = (size_t)m * (size_t)d.ldc;
  uint16_t *a = malloc(na * 2), *b = malloc(nb * 2), *c16 = malloc(nc * 2);
  float *c = malloc(nc * 4), *ref = malloc(nc * 4), *got = malloc(nc * 4), *s = malloc(nc * 4);
  uint64_t st = (uint64_t)m * 7919 + (uint64_t)n * 31 + (uint64_t)k + (uint64_t)(ta * 2 + tb);
  for (size_t i = 0; i < na; i++) a[i] = rf_bf16_from_f32(rf_test_rand_f32(&st));
  for (size_t i = 0; i < nb; i++) b[i] = rf_bf16_from_f32(rf_test_rand_f32(&st) * 4.0f);
  for (size_t i = 0; i < nc; i++)
    c[i] = rf_f32_from_bf16(rf_bf16_from_f32(rf_test_rand_f32(&st))); /* bf16-exact */
  for (size_t i = 0; i < nc; i++) c16[i] = rf_bf16_from_f32(c[i]);
  memcpy(ref, c, nc * 4);
  rf_gemm_run(&d, a, b, ref);
  /* the bias (C's dtype: cuBLASLt's default bias type), added to every row of the reference */
  float *bias = malloc((size_t)n * 4 + 4);
  uint16_t *bias16 = malloc((size_t)n * 2 + 4);
  for (int j = 0; j < n; j++) {
    bias16[j] = rf_bf16_from_f32(rf_test_rand_f32(&st) * 8.0f);
    bias[j] = with_bias ? rf_f32_from_bf16(bias16[j]) : 0.0f;
  }
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) ref[(size_t)i * d.ldc + j] += bias[j];
  for (int i = 0; i < m; i++) /* S(i, j) */
    for (int j = 0; j < n; j++) {
      double sum = fabs((double)beta * c[(size_t)i * d.ldc + j]) + fabs((double)bias[j]);
      for (int p = 0; p < k; p++) {
        float av = rf_f32_from_bf16(ta ? a[(size_t)p * d.lda + i] : a[(size_t)i * d.lda + p]);
        float bv = rf_f32_from_bf16(tb ? b[(size_t)j * d.ldb + p] : b[(size_t)p * d.ldb + j]);
        sum += fabs((double)alpha * av * bv);
      }
      s[(size_t)i * d.ldc + j] = (float)sum;
    }
  void *ba, *bb, *bc; /* the allocations */
  void *da = to_gpu_at(a, na * 2, shift, &ba), *db = to_gpu_at(b, nb * 2, shift, &bb);
  void *dc = c_dtype == RF_DTYPE_F32 ? to_gpu_at(c, nc * 4, shift, &bc) : to_gpu_at(c16, nc * 2, shift, &bc);
  void *dbias = c_dtype == RF_DTYPE_F32 ? to_gpu(bias, (size_t)n * 4) : to_gpu(bias16, (size_t)n * 2);
  if (with_bias)
    rf_gemm_cuda_run_bias(g, &d, da, db, dbias, dc, c_dtype, rf_device_cuda_stream(&gpu, GS));
  else
    rf_gemm_cuda_run(g, &d, da, db, dc, c_dtype, rf_device_cuda_stream(&gpu, GS));
  if (c_dtype == RF_DTYPE_F32) {
    rf_device_copy(&gpu, got, dc, nc * 4, RF_DEVICE_COPY_DEVICE_TO_HOST, GS);
  } else {
    rf_device_copy(&gpu, c16, dc, nc * 2, RF_DEVICE_COPY_DEVICE_TO_HOST, GS);
    for (size_t i = 0; i < nc; i++) got[i] = rf_f32_from_bf16(c16[i]);
  }
  double worst = 0; /* the largest error in units of the tolerance */
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      size_t at = (size_t)i * d.ldc + j;
      double tol =
          ldexp(s[at], -16) + (c_dtype == RF_DTYPE_BF16 ? ldexp(fabs((double)ref[at]), -8) : 0.0) + 1e-30;
      worst = rf_test_max(worst, fabs((double)got[at] - ref[at]) / tol);
    }
  int pad_same = 1; /* the padding columns of C untouched */
  for (int i = 0; i < m && pad; i++)
    for (int j = n; j < d.ldc; j++) pad_same &= got[(size_t)i * d.ldc + j] == c[(size_t)i * d.ldc + j];
  RF_CHECK(
      worst <= 1.0 && pad_same,
      "gemm %dx%dx%d trans %d%d pad %d alpha %g beta %g -> %s%s, operands %zu bytes past 256: worst error "
      "%.3g tolerances, padding kept %d",
      m, n, k, ta, tb, pad, alpha, beta, rf_dtype_name(c_dtype), with_bias ? " + bias" : "", shift, worst,
      pad_same);
  if (shift)
    printf(
        "gemm %dx%dx%d -> %s, operands %zu bytes past 256 (%zu-byte aligned): worst error %.3g tolerances\n",
        m, n, k, rf_dtype_name(c_dtype), shift, shift, worst);
  rf_device_release(&gpu, ba), rf_device_release(&gpu, bb), rf_device_release(&gpu, bc);
  rf_device_release(&gpu, dbias);
  free(a), free(b), free(c16), free(c), free(ref), free(got), free(s), free(bias), free(bias16);
}

/* An FP8 operand's scales from src/core/fp8.c's layout (rows x ceil(k/128) tiles of tile_rows
 * rows, row-major over the tiles) into cuBLASLt's (rf_gemm_cuda_fp8_scale_at; padding NaN: a
 * product that read it would show NaN). */
static float *cublaslt_scales(const float *s, int rows, int k, int tile_rows) {
  int64_t count = rf_gemm_cuda_fp8_scales(rows, k, tile_rows), kb = (k + RF_FP8_TILE - 1) / RF_FP8_TILE;
  float *out = malloc((size_t)count * 4);
  for (int64_t i = 0; i < count; i++) out[i] = NAN;
  for (int64_t r = 0; r < rows; r += tile_rows)
    for (int64_t q = 0; q < kb; q++)
      out[rf_gemm_cuda_fp8_scale_at(rows, k, tile_rows, r, q)] = s[(r / tile_rows) * kb + q];
  return out;
}

/* The FP8 block-scaled product (rf_gemm_cuda_run_fp8) against the host's product on the
 * same codes and scales (rf_gemm_fp8_run: a bf16 product of the codes per 128-wide slice of
 * K, scaled by its two tiles' scales, added in f32): x [m, k] in 1 x 128 tiles, w [n, k] in
 * w_tile x 128 tiles (128: n = 272 leaves a partial tile row; 1: the weight gradient's
 * operands), quantized by rf_fp8_quantize, their scales moved into cuBLASLt's layouts; y
 * f32 or bf16, with beta 1 onto a y already there (the host's accumulate). Both sides sum
 * exact products of e4m3 values in f32 in other orders: within 2^-16 S (S = sum over k of
 * |x w| dequantized, plus |y| before) plus y's bf16 rounding, 2^-8 |y|. Returns 0 when run,
 * 77 when this cuBLASLt has no FP8 block scaling ("not run" printed). */
static int check_fp8(struct rf_gemm_cuda *g, int m, int n, int k, int w_tile, enum rf_dtype y_dtype,
                     float beta) {
  uint64_t st = (uint64_t)m * 131 + (uint64_t)n * 17 + (uint64_t)k + (uint64_t)w_tile;
  float *x = malloc((size_t)m * k * 4), *w = malloc((size_t)n * k * 4);
  for (size_t i = 0; i < (size_t)m * k; i++) x[i] = rf_test_rand_f32(&st) * (i % 300 == 7 ? 40.0f : 1.0f);
  for (size_t i = 0; i < (size_t)n * k; i++) w[i] = rf_test_rand_f32(&st) * 0.05f;
  struct rf_fp8_grid gx = {m, k, 1, RF_FP8_TILE}, gw = {n, k, w_tile, RF_FP8_TILE};
  uint8_t *xc = malloc((size_t)m * k), *wc = malloc((size_t)n * k);
  float *xs = malloc((size_t)rf_fp8_grid_tiles(&gx) * 4), *ws = malloc((size_t)rf_fp8_grid_tiles(&gw) * 4);
  RF_ASSERT(rf_fp8_quantize(&gx, x, 0, "x", xc, xs) == 0 && rf_fp8_quantize(&gw, w, 0, "w", wc, ws) == 0);
  uint16_t *xb = malloc((size_t)m * k * 2), *wb = malloc((size_t)n * k * 2);
  rf_fp8_codes_to_bf16(xb, xc, (size_t)m * k);
  rf_fp8_codes_to_bf16(wb, wc, (size_t)n * k);
  struct rf_gemm_fp8_desc d = {m, n, k, {xb, xs, gx, 0}, {wb, ws, gw, 1}, beta != 0.0f};
  float *ref = malloc((size_t)m * n * 4), *work = malloc((size_t)rf_gemm_fp8_work_elems(&d) * 4);
  float *y0 = malloc((size_t)m * n * 4);
  uint16_t *y0b = malloc((size_t)m * n * 2);
  for (size_t i = 0; i < (size_t)m * n; i++) {
    y0b[i] = rf_bf16_from_f32(rf_test_rand_f32(&st));
    y0[i] = y_dtype == RF_DTYPE_BF16 ? rf_f32_from_bf16(y0b[i]) : rf_test_rand_f32(&st);
    ref[i] = y0[i];
  }
  rf_gemm_fp8_run(&d, ref, work);
  float *cxs = cublaslt_scales(xs, m, k, 1), *cws = cublaslt_scales(ws, n, k, w_tile);
  void *dxc = to_gpu(xc, (size_t)m * k), *dwc = to_gpu(wc, (size_t)n * k);
  void *dxs = to_gpu(cxs, (size_t)rf_gemm_cuda_fp8_scales(m, k, 1) * 4),
       *dws = to_gpu(cws, (size_t)rf_gemm_cuda_fp8_scales(n, k, w_tile) * 4);
  size_t ysize = rf_dtype_size(y_dtype);
  void *dy = to_gpu(y_dtype == RF_DTYPE_BF16 ? (void *)y0b : (void *)y0, (size_t)m * n * ysize);
  struct rf_gemm_cuda_fp8_operand ox = {dxc, dxs, 1}, ow = {dwc, dws, w_tile};
  int rc = rf_gemm_cuda_run_fp8(g, m, n, k, ox, ow, beta, dy, y_dtype, rf_device_cuda_stream(&gpu, GS));
  if (rc != 0) {
    printf("not run: FP8 block-scaled product %dx%dx%d: this cuBLASLt has no algorithm for it\n", m, n, k);
  } else {
    void *y = malloc((size_t)m * n * ysize);
    rf_device_copy(&gpu, y, dy, (size_t)m * n * ysize, RF_DEVICE_COPY_DEVICE_TO_HOST, GS);
    double worst = 0;
    int64_t kb = k / RF_FP8_TILE;
    for (int i = 0; i < m; i++)
      for (int j = 0; j < n; j++) {
        double sum = beta != 0.0f ? fabs((double)y0[(size_t)i * n + j]) : 0.0;
        for (int p = 0; p < k; p++)
          sum +=
              fabs((double)rf_f32_from_bf16(xb[(size_t)i * k + p]) * xs[(size_t)i * kb + p / RF_FP8_TILE] *
                   rf_f32_from_bf16(wb[(size_t)j * k + p]) * ws[(size_t)(j / w_tile) * kb + p / RF_FP8_TILE]);
        double r = ref[(size_t)i * n + j],
               tol = ldexp(sum, -16) + (y_dtype == RF_DTYPE_BF16 ? ldexp(fabs(r), -8) : 0.0) + 1e-30;
        double got = y_dtype == RF_DTYPE_BF16 ? rf_f32_from_bf16(((uint16_t *)y)[(size_t)i * n + j])
                                              : ((float *)y)[(size_t)i * n + j];
        worst = rf_test_max(worst, fabs(got - r) / tol);
      }
    printf(
        "FP8 block-scaled product %dx%dx%d (x 1x128, w %dx128 tiles) -> %s, beta %g: worst error %.3g "
        "tolerances\n",
        m, n, k, w_tile, rf_dtype_name(y_dtype), beta, worst);
    RF_CHECK(worst <= 1.0,
             "FP8 product %dx%dx%d (w %dx128) -> %s: worst error %.3g tolerances (scale layouts?)", m, n, k,
             w_tile, rf_dtype_name(y_dtype), worst);
    free(y);
  }
  rf_device_release(&gpu, dxc), rf_device_release(&gpu, dwc), rf_device_release(&gpu, dxs);
  rf_device_release(&gpu, dws), rf_device_release(&gpu, dy);
  free(x), free(w), free(xc), free(wc), free(xs), free(ws), free(xb), free(wb), free(ref), free(work);
  free(y0), free(y0b), free(cxs), free(cws);
  return rc == 0 ? 0 : 77;
}

/* The same product ten times after one: no plan, no cudaMalloc, no heap allocation. */
static void check_quiet(struct rf_gemm_cuda *g) {
  struct rf_gemm_desc d = {256, 512, 384, 0, 1, 384, 384, 512, RF_DTYPE_BF16, 1.0f, 0.0f};
  void *a = rf_device_alloc(&gpu, 256 * 384 * 2, 256), *b = rf_device_alloc(&gpu, 512 * 384 * 2, 256);
  void *c = rf_device_alloc(&gpu, 256 * 512 * 4, 256);
  cudaStream_t s = rf_device_cuda_stream(&gpu, GS);
  rf_gemm_cuda_run(g, &d, a, b, c, RF_DTYPE_F32, s);
  struct rf_gemm_cuda_stats before = rf_gemm_cuda_stats(g);
  struct rf_device_cuda_stats dev = rf_device_cuda_stats(&gpu);
  uint64_t heap = rf_heap_allocations();
  for (int i = 0; i < 10; i++) rf_gemm_cuda_run(g, &d, a, b, c, RF_DTYPE_F32, s);
  struct rf_gemm_cuda_stats after = rf_gemm_cuda_stats(g);
  struct rf_device_cuda_stats dev2 = rf_device_cuda_stats(&gpu);
  RF_CHECK(after.plans == before.plans && after.mallocs == before.mallocs &&
               after.products == before.products + 10 && dev2.mallocs == dev.mallocs &&
               dev2.host_syncs == dev.host_syncs && rf_heap_allocations() == heap,
           "repeated products: %lld plans, %lld cudaMalloc, %llu host waits, %llu heap allocations (0 each "
           "expected)",
           (long long)(after.plans - before.plans), (long long)(after.mallocs - before.mallocs),
           (unsigned long long)(dev2.host_syncs - dev.host_syncs),
           (unsigned long long)(rf_heap_allocations() - heap));
  rf_device_stream_synchronize(&gpu, GS);
  rf_device_release(&gpu, a), rf_device_release(&gpu, b), rf_device_release(&gpu, c);
}

int main(void) {
  rf_device_cuda_init(&gpu, 0, NULL);
  gs = rf_device_stream_create(&gpu);
  struct rf_gemm_cuda *g = rf_gemm_cuda_create(0);
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      check_shape(g, 128, 96, 64, ta, tb, 0, 1.0f, 0.0f, RF_DTYPE_F32, 0, 0);
      check_shape(g, 72, 40, 1000, ta, tb, 8, 0.5f, 1.0f, RF_DTYPE_F32, 0, 0);
      check_shape(g, 64, 256, 136, ta, tb, 0, 1.0f, 0.0f, RF_DTYPE_BF16, 0, 0);
      check_shape(g, 8, 24, 200, ta, tb, 8, 1.0f, 1.0f, RF_DTYPE_BF16, 0, 0);
      /* the bias epilogue: a linear layer's bias, f32 and bf16, with and without beta */
      check_shape(g, 40, 72, 96, ta, tb, 0, 1.0f, 0.0f, RF_DTYPE_F32, 1, 0);
      check_shape(g, 24, 64, 200, ta, tb, 8, 0.5f, 1.0f, RF_DTYPE_BF16, 1, 0);
    }
  /* operands 8 and 4 bytes past an alignment (a tensor after 2 or 1 floats of a unit's buffer, as
   * GPT-OSS's sinks of 2 heads leave the next): planned apart, for that alignment */
  check_shape(g, 40, 24, 72, 0, 1, 0, 1.0f, 1.0f, RF_DTYPE_F32, 0, 8);
  check_shape(g, 40, 24, 72, 0, 1, 0, 1.0f, 0.0f, RF_DTYPE_F32, 0, 4);
  check_shape(g, 24, 40, 64, 1, 0, 0, 1.0f, 1.0f, RF_DTYPE_BF16, 0, 2);
  check_quiet(g);
  if (check_fp8(g, 256, 384, 512, RF_FP8_TILE, RF_DTYPE_BF16, 0.0f) == 0) {
    check_fp8(g, 48, 272, 384, RF_FP8_TILE, RF_DTYPE_BF16, 0.0f); /* L4 = 4 for 3 K blocks */
    check_fp8(g, 64, 272, 640, RF_FP8_TILE, RF_DTYPE_F32, 1.0f);  /* the linear layer's, L4 = 8 for 5 */
    check_fp8(g, 96, 80, 256, 1, RF_DTYPE_F32, 1.0f);             /* the weight gradient's, VEC128 both */
  }
  printf(
      "algorithm of 256x512x384 (x W^T): %s\n",
      rf_gemm_cuda_algo_name(
          g, &(struct rf_gemm_desc){256, 512, 384, 0, 1, 384, 384, 512, RF_DTYPE_BF16, 1, 0}, RF_DTYPE_F32));
  rf_gemm_cuda_free(g);
  rf_device_free(&gpu);
  return rf_test_finish("test_gemm_cuda");
}
