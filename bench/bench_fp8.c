/* rf-bench: */
/* The FP8 product on codes (rf_gemm_fp8_run, DeepSeek-V3's recipe: a bf16 product of the
 * e4m3 codes per 128-wide slice of K, each slice scaled by its tiles' scales and added
 * in f32) against one bf16 product (rf_gemm_run) of the same shape, on a model's
 * linear layers: the forward Y = X W^T (X 1x128 tiles, W 128x128), the input gradient
 * dX = dY W (dY 1x128, W 128x128) and the weight gradient dW = dY^T X (both 128x1).
 * The fastest of REPS products (interleaved, after a warm-up: on a shared machine the
 * fastest is the one nobody preempted) and the median, GFLOP/s = 2 m n k / fastest,
 * and the FP8 product's time over the bf16 one.
 * Usage: bench_fp8 [CONFIG.json] [TOKENS] [REPS]   (default configs/demo.json 1024 20)
 * Threads: OMP_NUM_THREADS (both products on the same threads). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "model/model.h"

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

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* An operand: random values quantized on `grid`, codes as bf16. */
struct operand {
  struct rf_fp8_grid grid;
  uint16_t *codes;
  float *scales;
};

static void operand_make(struct operand *o, int64_t rows, int64_t cols, int tile_rows, int tile_cols) {
  o->grid = (struct rf_fp8_grid){rows, cols, tile_rows, tile_cols};
  float *x = malloc((size_t)(rows * cols) * sizeof(float));
  uint8_t *c = malloc((size_t)(rows * cols));
  for (int64_t i = 0; i < rows * cols; i++) x[i] = rnd();
  o->codes = malloc((size_t)(rows * cols) * sizeof(uint16_t));
  o->scales = malloc((size_t)rf_fp8_grid_tiles(&o->grid) * sizeof(float));
  if (rf_fp8_quantize(&o->grid, x, 0, "bench", c, o->scales) != 0) RF_DIE("%s", rf_error_msg());
  rf_fp8_codes_to_bf16(o->codes, c, (size_t)(rows * cols));
  free(x);
  free(c);
}

static void operand_free(struct operand *o) {
  free(o->codes);
  free(o->scales);
}

/* Sorts t: t[0] the fastest, t[n / 2] the median. */
static void sort_ms(double *t, int n) { qsort(t, (size_t)n, sizeof *t, cmp_double); }

/* One product: m x n x k with A [m, k] (or [k, m] when ta) and B [k, n] (or [n, k]). */
static void bench_product(const char *what, int m, int n, int k, int ta, int tb, int a_tr, int a_tc, int b_tr,
                          int b_tc, int reps, double *sum_fp8, double *sum_bf16) {
  struct operand a, b;
  operand_make(&a, ta ? k : m, ta ? m : k, a_tr, a_tc);
  operand_make(&b, tb ? n : k, tb ? k : n, b_tr, b_tc);
  struct rf_gemm_fp8_desc d = {
      .m = m, .n = n, .k = k, .a = {a.codes, a.scales, a.grid, ta}, .b = {b.codes, b.scales, b.grid, tb}};
  float *c = malloc((size_t)m * (size_t)n * sizeof(float));
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
  double *t8 = malloc((size_t)reps * sizeof(double)), *t16 = malloc((size_t)reps * sizeof(double));
  rf_gemm_fp8_run(&d, c, work); /* warm-up: primitives */
  rf_gemm_run(&g, a.codes, b.codes, c);
  for (int r = 0; r < reps; r++) { /* interleaved, so a load on the machine hits both */
    uint64_t t0 = rf_time_ns();
    rf_gemm_fp8_run(&d, c, work);
    uint64_t t1 = rf_time_ns();
    rf_gemm_run(&g, a.codes, b.codes, c);
    uint64_t t2 = rf_time_ns();
    t8[r] = (double)(t1 - t0) / 1e6;
    t16[r] = (double)(t2 - t1) / 1e6;
  }
  sort_ms(t8, reps);
  sort_ms(t16, reps);
  double ms8 = t8[0], ms16 = t16[0], flop = 2.0 * m * n * (double)k;
  printf("  %-16s %5d %5d %5d %8.3f %8.3f %8.1f %8.3f %8.3f %8.1f %7.2fx\n", what, m, n, k, ms8, t8[reps / 2],
         flop / ms8 / 1e6, ms16, t16[reps / 2], flop / ms16 / 1e6, ms8 / ms16);
  *sum_fp8 += ms8;
  *sum_bf16 += ms16;
  free(t8);
  free(t16);
  free(work);
  free(c);
  operand_free(&a);
  operand_free(&b);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "configs/demo.json";
  int tokens = argc > 2 ? atoi(argv[2]) : 1024, reps = argc > 3 ? atoi(argv[3]) : 20;
  if (tokens < 1 || reps < 1) RF_DIE("usage: bench_fp8 [CONFIG.json] [TOKENS >= 1] [REPS >= 1]");
  struct rf_model_desc desc;
  if (rf_model_desc_load(path, &desc) != 0) RF_DIE("%s", rf_error_msg());
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  printf("FP8 product on codes vs bf16 product: %s, %d tokens, fastest and median of %d, %d threads\n", path,
         tokens, reps, threads);
  printf("  %-16s %5s %5s %5s %8s %8s %8s %8s %8s %8s %8s\n", "product", "m", "n", "k", "fp8 ms", "median",
         "GFLOP/s", "bf16 ms", "median", "GFLOP/s", "fp8/bf16");
  double sum8 = 0, sum16 = 0;
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
      bench_product(what, tokens, out, in, 0, 1, 1, 128, 128, 128, reps, &sum8, &sum16);
      snprintf(what, sizeof what, "%s dgrad", label);
      bench_product(what, tokens, in, out, 0, 0, 1, 128, 128, 128, reps, &sum8, &sum16);
      snprintf(what, sizeof what, "%s wgrad", label);
      bench_product(what, out, in, tokens, 1, 0, 128, 1, 128, 1, reps, &sum8, &sum16);
    }
  }
  printf("  sum over the products (fastest): fp8 %.3f ms, bf16 %.3f ms: %.2fx\n", sum8, sum16, sum8 / sum16);
  rf_model_desc_free(&desc);
  return 0;
}
