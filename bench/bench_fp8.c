/* rf-bench: */
/* The FP8 product on codes (rf_gemm_fp8_run, DeepSeek-V3's recipe: a bf16 product of the
 * e4m3 codes per 128-wide slice of K, each slice scaled by its tiles' scales and added
 * in f32) against one bf16 product (rf_gemm_run) of the same shape, and against one f32
 * product on the dequantized operands (f32(code) * scale, the whole K at once: the
 * issue's alternative), on a model's linear layers: the forward Y = X W^T (X 1x128
 * tiles, W 128x128), the input gradient dX = dY W (dY 1x128, W 128x128) and the weight
 * gradient dW = dY^T X (both 128x1). "prep": what the runtime does before a product on
 * codes (rf_fp8_quantize_bf16 of the activation or output gradient, both operands of
 * the weight gradient; rf_fp8_codes_to_bf16 of the weight). The fastest of REPS
 * (interleaved, after a warm-up: on a shared machine the fastest is the one nobody
 * preempted) and the median, GFLOP/s = 2 m n k / fastest, the ratios, and how far the
 * f32 product on dequantized operands is from the product on codes (max |difference| /
 * max |C|).
 * The weight gradient also per sequence of SEQ tokens, as the model runs it since its
 * 128-token tiles end at each sequence's end (TOKENS / SEQ products of K = SEQ, each with
 * its preparation) against the one product over TOKENS: the sum of both over the layer.
 * Usage: bench_fp8 [CONFIG.json] [TOKENS] [REPS] [SEQ]   (default configs/demo.json 1024 20 64)
 * Threads: OMP_NUM_THREADS (all products on the same threads). RF_FP8_SIMD=0: the portable
 * quantization kernels instead of the AVX-512 ones (rf_fp8_simd_set). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "model/model.h"
#include "support.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static uint64_t rng = 7;
static float rnd(void) {
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (float)((double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0);
}

/* An operand: random values x quantized on `grid`, the codes as bf16, and dequantized
 * (f32(code) * scale). */
struct operand {
  struct rf_fp8_grid grid;
  float *x, *scales, *dq;
  uint8_t *c;
  uint16_t *codes;
};

static void operand_make(struct operand *o, int64_t rows, int64_t cols, int tile_rows, int tile_cols) {
  size_t n = (size_t)(rows * cols);
  o->grid = (struct rf_fp8_grid){rows, cols, tile_rows, tile_cols};
  o->x = malloc(n * sizeof(float));
  o->c = malloc(n);
  for (size_t i = 0; i < n; i++) o->x[i] = rnd();
  o->codes = malloc(n * sizeof(uint16_t));
  o->scales = malloc((size_t)rf_fp8_grid_tiles(&o->grid) * sizeof(float));
  o->dq = malloc(n * sizeof(float));
  if (rf_fp8_quantize(&o->grid, o->x, 0, "bench", o->c, o->scales) != 0) RF_DIE("%s", rf_error_msg());
  rf_fp8_codes_to_bf16(o->codes, o->c, n);
  rf_fp8_dequantize(&o->grid, o->c, o->scales, o->dq);
}

static void operand_free(struct operand *o) {
  free(o->x);
  free(o->c);
  free(o->codes);
  free(o->scales);
  free(o->dq);
}

/* What the runtime does to an operand before the product on codes: quantize an activation
 * or output gradient straight to bf16-held codes, or widen a weight's gathered codes. */
static void operand_prepare(struct operand *o, int weight) {
  if (weight) {
    rf_fp8_codes_to_bf16(o->codes, o->c, (size_t)(o->grid.rows * o->grid.cols));
    return;
  }
  if (rf_fp8_quantize_bf16(&o->grid, o->x, 0, "bench", o->codes, o->scales) != 0)
    RF_DIE("%s", rf_error_msg());
}

/* Sorts t: t[0] the fastest, t[n / 2] the median. */
static void sort_ms(double *t, int n) { qsort(t, (size_t)n, sizeof *t, bench_cmp_double); }

/* Sums over the products of the fastest times: operand preparation, the product on codes,
 * the bf16 product, the f32 product on dequantized operands. */
struct sums {
  double prep, fp8, bf16, f32dq, dq_diff;
};

/* One product: m x n x k with A [m, k] (or [k, m] when ta) and B [k, n] (or [n, k]);
 * b_weight: B is the weight (codes gathered, widened per product), else quantized too. */
static void bench_product(const char *what, int m, int n, int k, int ta, int tb, int a_tr, int a_tc, int b_tr,
                          int b_tc, int b_weight, int reps, struct sums *sum) {
  struct operand a, b;
  operand_make(&a, ta ? k : m, ta ? m : k, a_tr, a_tc);
  operand_make(&b, tb ? n : k, tb ? k : n, b_tr, b_tc);
  struct rf_gemm_fp8_desc d = {
      .m = m, .n = n, .k = k, .a = {a.codes, a.scales, a.grid, ta}, .b = {b.codes, b.scales, b.grid, tb}};
  float *c = malloc((size_t)m * (size_t)n * sizeof(float)),
        *c32 = malloc((size_t)m * (size_t)n * sizeof(float));
  float *work = malloc((size_t)rf_gemm_fp8_work_elems(&d) * sizeof(float));
  struct rf_gemm_desc g = {.m = m,
                           .n = n,
                           .k = k,
                           .trans_a = ta,
                           .trans_b = tb,
                           .lda = (int)a.grid.cols,
                           .ldb = (int)b.grid.cols,
                           .ldc = n,
                           .dtype = RF_DTYPE_BF16,
                           .alpha = 1.0f};
  struct rf_gemm_desc g32 = g;
  g32.dtype = RF_DTYPE_F32;
  double *t = malloc((size_t)reps * 4 * sizeof(double));
  double *tp = t, *t8 = t + reps, *t16 = t + 2 * reps, *t32 = t + 3 * reps;
  rf_gemm_fp8_run(&d, c, work); /* warm-up: primitives */
  rf_gemm_run(&g, a.codes, b.codes, c32);
  rf_gemm_run(&g32, a.dq, b.dq, c32);
  double big = 0.0, diff = 0.0; /* the f32 product on dequantized operands against the one on codes */
  for (size_t i = 0; i < (size_t)m * (size_t)n; i++) {
    double v = fabs((double)c[i]), e = fabs((double)c32[i] - (double)c[i]);
    big = v > big ? v : big;
    diff = e > diff ? e : diff;
  }
  for (int r = 0; r < reps; r++) { /* interleaved, so a load on the machine hits all */
    uint64_t t0 = rf_time_ns();
    operand_prepare(&a, 0);
    operand_prepare(&b, b_weight);
    uint64_t t1 = rf_time_ns();
    rf_gemm_fp8_run(&d, c, work);
    uint64_t t2 = rf_time_ns();
    rf_gemm_run(&g, a.codes, b.codes, c);
    uint64_t t3 = rf_time_ns();
    rf_gemm_run(&g32, a.dq, b.dq, c32);
    uint64_t t4 = rf_time_ns();
    tp[r] = (double)(t1 - t0) / 1e6;
    t8[r] = (double)(t2 - t1) / 1e6;
    t16[r] = (double)(t3 - t2) / 1e6;
    t32[r] = (double)(t4 - t3) / 1e6;
  }
  for (int i = 0; i < 4; i++) sort_ms(t + i * reps, reps);
  double flop = 2.0 * m * n * (double)k;
  printf(
      "  %-16s %5d %5d %5d %7.3f %8.3f %8.3f %7.1f %8.3f %8.3f %7.1f %8.3f %7.1f %7.2fx %7.2fx %7.2fx "
      "%8.1e\n",
      what, m, n, k, tp[0], t8[0], t8[reps / 2], flop / t8[0] / 1e6, t16[0], t16[reps / 2],
      flop / t16[0] / 1e6, t32[0], flop / t32[0] / 1e6, t8[0] / t16[0], (tp[0] + t8[0]) / t16[0],
      t32[0] / t8[0], diff / big);
  sum->prep += tp[0];
  sum->fp8 += t8[0];
  sum->bf16 += t16[0];
  sum->f32dq += t32[0];
  sum->dq_diff = diff / big > sum->dq_diff ? diff / big : sum->dq_diff;
  free(t);
  free(work);
  free(c);
  free(c32);
  operand_free(&a);
  operand_free(&b);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "configs/demo.json";
  int tokens = argc > 2 ? atoi(argv[2]) : 1024, reps = argc > 3 ? atoi(argv[3]) : 20;
  int seq = argc > 4 ? atoi(argv[4]) : 64;
  if (tokens < 1 || reps < 1 || seq < 1 || tokens % seq != 0)
    RF_DIE("usage: bench_fp8 [CONFIG.json] [TOKENS >= 1] [REPS >= 1] [SEQ dividing TOKENS]");
  struct rf_model_desc desc;
  if (rf_model_desc_load(path, &desc) != 0) RF_DIE("%s", rf_error_msg());
  const char *simd = getenv("RF_FP8_SIMD");
  int simd_on = rf_fp8_simd_set(1) && !(simd && strcmp(simd, "0") == 0); /* on by default where built */
  rf_fp8_simd_set(simd_on);
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  printf(
      "FP8 product on codes vs bf16 product and f32 product on dequantized operands: %s, %d tokens, "
      "fastest and median of %d, %d threads\n",
      path, tokens, reps, threads);
  printf("  %-16s %5s %5s %5s %7s %8s %8s %7s %8s %8s %7s %8s %7s %8s %8s %8s %8s\n", "product", "m", "n",
         "k", "prep ms", "fp8 ms", "median", "GFLOP/s", "bf16 ms", "median", "GFLOP/s", "f32dq ms", "GFLOP/s",
         "fp8/bf16", "+prep", "f32dq/fp8", "dq diff");
  struct sums sum = {0};
  double wgrad_run = 0.0, wgrad_seq = 0.0; /* preparation + product, fastest, summed over the layer */
  /* one layer's distinct linear shapes (the first unit holding FP8 tensors) */
  int done = 0;
  for (int u = 0; u < desc.n_units && !done; u++) {
    int64_t seen[16][2];
    int n_seen = 0;
    for (int i = 0; i < desc.units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &desc.units[u].tensors[i];
      if (!t->fp8 || t->ndim != 2) continue;
      int out = (int)t->shape[0], in = (int)t->shape[1], dup = 0;
      for (int s = 0; s < n_seen; s++) dup |= seen[s][0] == out && seen[s][1] == in;
      if (dup || n_seen == 16) continue;
      seen[n_seen][0] = out;
      seen[n_seen++][1] = in;
      done = 1;
      char what[64], label[32];
      const char *dot = strrchr(t->name, '.'); /* "...q_proj.weight": the name before ".weight" */
      int len = dot ? (int)(dot - t->name) : (int)strlen(t->name), from = len;
      while (from > 0 && t->name[from - 1] != '.') from--;
      snprintf(label, sizeof label, "%.*s", len - from < 14 ? len - from : 14, t->name + from);
      snprintf(what, sizeof what, "%s fwd", label);
      bench_product(what, tokens, out, in, 0, 1, 1, 128, 128, 128, 1, reps, &sum);
      snprintf(what, sizeof what, "%s dgrad", label);
      bench_product(what, tokens, in, out, 0, 0, 1, 128, 128, 128, 1, reps, &sum);
      snprintf(what, sizeof what, "%s wgrad", label);
      struct sums before = sum, one = {0};
      bench_product(what, out, in, tokens, 1, 0, 128, 1, 128, 1, 0, reps, &sum);
      wgrad_run += sum.prep - before.prep + sum.fp8 - before.fp8;
      snprintf(what, sizeof what, "%s wgrad/%d", label, seq);
      bench_product(what, out, in, seq, 1, 0, 128, 1, 128, 1, 0, reps, &one);
      wgrad_seq += (double)tokens / (double)seq * (one.prep + one.fp8);
    }
  }
  printf(
      "  sum over the products (fastest): preparation %.3f ms, fp8 %.3f ms, bf16 %.3f ms, f32 on dequantized "
      "%.3f ms\n  fp8 / bf16 %.2fx, (preparation + fp8) / bf16 %.2fx, f32 dequantized / fp8 %.2fx; the f32 "
      "product on dequantized operands differs from the one on codes by at most %.1e of max |C|\n",
      sum.prep, sum.fp8, sum.bf16, sum.f32dq, sum.fp8 / sum.bf16, (sum.prep + sum.fp8) / sum.bf16,
      sum.f32dq / sum.fp8, sum.dq_diff);
  printf(
      "  weight gradients per sequence of %d tokens (%d products of K = %d, preparation included): %.3f ms, "
      "over the %d tokens in one product: %.3f ms, %.2fx\n",
      seq, tokens / seq, seq, wgrad_seq, tokens, wgrad_run, wgrad_seq / wgrad_run);
  rf_model_desc_free(&desc);
  return 0;
}
