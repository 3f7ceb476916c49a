/* Products on FP8 block-quantized operands: a bf16 product of the codes per 128-wide
 * slice of K, each scaled by its two tiles' scales and added in f32. */
#include <omp.h>

#include "gemm/gemm.h"

/* Elements of C below which the scaling pass stays on the calling thread. */
#define RF_GEMM_FP8_PAR_MIN 16384

static void fp8_check_operand(const struct rf_gemm_fp8_operand *op, const char *which, int outer, int k,
                              int k_along_rows) {
  const struct rf_fp8_grid *g = &op->grid;
  int64_t want_rows = k_along_rows ? k : outer, want_cols = k_along_rows ? outer : k;
  int k_tile = k_along_rows ? g->tile_rows : g->tile_cols;
  int other_tile = k_along_rows ? g->tile_cols : g->tile_rows;
  if (g->rows != want_rows || g->cols != want_cols)
    RF_DIE("gemm fp8: operand %s is stored %lld x %lld, expected %lld x %lld", which, (long long)g->rows,
           (long long)g->cols, (long long)want_rows, (long long)want_cols);
  if (k_tile != RF_FP8_TILE || (other_tile != 1 && other_tile != RF_FP8_TILE))
    RF_DIE("gemm fp8: operand %s has %d x %d tiles: they must be %d long along K (and 1 or %d across)", which,
           g->tile_rows, g->tile_cols, RF_FP8_TILE, RF_FP8_TILE);
}

/* The scale of the tile holding stored element (row, col). */
static float fp8_scale_at(const struct rf_gemm_fp8_operand *op, int64_t row, int64_t col) {
  return op->scales[(row / op->grid.tile_rows) * rf_fp8_grid_tile_cols(&op->grid) + col / op->grid.tile_cols];
}

/* One row of C: c = p * (sa * sb), or c += that (vectorized: c, p and sb do not alias). */
static void fp8_row_set(float *c, const float *p, float sa, const float *sb, int n) {
#pragma omp simd
  for (int j = 0; j < n; j++) c[j] = p[j] * (sa * sb[j]);
}

static void fp8_row_add(float *c, const float *p, float sa, const float *sb, int n) {
#pragma omp simd
  for (int j = 0; j < n; j++) c[j] += p[j] * (sa * sb[j]);
}

/* C (+)= P * (sa(i) * sb(j)) for the slice at k0: rows on the OpenMP threads (the calling
 * thread alone inside a parallel region, as rf_gemm_run). */
static void fp8_scale_add(const struct rf_gemm_fp8_desc *d, int k0, const float *p, const float *sb, float *c,
                          int write) {
  int m = d->m, n = d->n;
#pragma omp parallel for schedule(static) if ((int64_t)m * n >= RF_GEMM_FP8_PAR_MIN && !omp_in_parallel())
  for (int i = 0; i < m; i++) {
    float sa = d->a.trans ? fp8_scale_at(&d->a, k0, i) : fp8_scale_at(&d->a, i, k0);
    if (write)
      fp8_row_set(c + (int64_t)i * n, p + (int64_t)i * n, sa, sb, n);
    else
      fp8_row_add(c + (int64_t)i * n, p + (int64_t)i * n, sa, sb, n);
  }
}

int64_t rf_gemm_fp8_work_elems(const struct rf_gemm_fp8_desc *d) { return (int64_t)d->m * d->n + d->n; }

void rf_gemm_fp8_run(const struct rf_gemm_fp8_desc *d, float *c, float *work) {
  if (d->m <= 0 || d->n <= 0 || d->k <= 0)
    RF_DIE("gemm fp8: sizes m=%d n=%d k=%d must be positive", d->m, d->n, d->k);
  fp8_check_operand(&d->a, "A", d->m, d->k, d->a.trans);
  fp8_check_operand(&d->b, "B", d->n, d->k, !d->b.trans);
  int m = d->m, n = d->n, lda = (int)d->a.grid.cols, ldb = (int)d->b.grid.cols;
  float *p = work, *sb = work + (int64_t)m * n;
  for (int k0 = 0; k0 < d->k; k0 += RF_FP8_TILE) {
    int ks = d->k - k0 < RF_FP8_TILE ? d->k - k0 : RF_FP8_TILE;
    struct rf_gemm_desc g = {.m = m,
                             .n = n,
                             .k = ks,
                             .trans_a = d->a.trans,
                             .trans_b = d->b.trans,
                             .lda = lda,
                             .ldb = ldb,
                             .ldc = n,
                             .dtype = RF_DTYPE_BF16,
                             .alpha = 1.0f};
    const uint16_t *a = d->a.codes + (d->a.trans ? (int64_t)k0 * lda : k0);
    const uint16_t *b = d->b.codes + (d->b.trans ? k0 : (int64_t)k0 * ldb);
    rf_gemm_run(&g, a, b, p);
    for (int j = 0; j < n; j++) sb[j] = d->b.trans ? fp8_scale_at(&d->b, j, k0) : fp8_scale_at(&d->b, k0, j);
    fp8_scale_add(d, k0, p, sb, c, k0 == 0 && !d->accumulate);
  }
}
