/* The products of gemm.h on cuBLASLt (gemm_cuda.h): descriptors and the heuristic's
 * algorithm cached per shape, one workspace per context. */
#include "gemm/gemm_cuda.h"

#include <cublasLt.h>
#include <stdlib.h>
#include <string.h>

#define RF_CUBLAS_CHECK(call)                                                               \
  do {                                                                                      \
    cublasStatus_t rf_cublas_st_ = (call);                                                  \
    if (rf_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                             \
      RF_DIE("cuBLASLt: %s failed: %s (%d)", #call, cublasLtGetStatusString(rf_cublas_st_), \
             (int)rf_cublas_st_);                                                           \
  } while (0)

#define RF_GEMM_CUDA_ALIGN 16 /* bytes: the operands' best alignment, the algorithms' usual */
#define RF_GEMM_CUDA_SHAPES 256

/* What a cached plan is keyed by: the description less alpha and beta, C's dtype, whether a
 * bias epilogue runs, and the operands' alignment the algorithm is chosen for. */
struct rf_gemm_cuda_key {
  int m, n, k, trans_a, trans_b, lda, ldb, ldc;
  enum rf_dtype dtype, c_dtype;
  int bias;
  uint32_t align;
};

/* One shape: its descriptors (owned) and the heuristic's algorithm. */
struct rf_gemm_cuda_plan {
  struct rf_gemm_cuda_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc; /* cuBLASLt's A (our B), B (our A), C = D */
  cublasLtMatmulAlgo_t algo;
};

/* Owns the handle, the workspace and the plans. */
struct rf_gemm_cuda {
  cublasLtHandle_t handle;
  void *workspace;
  size_t workspace_bytes;
  struct rf_gemm_cuda_plan plans[RF_GEMM_CUDA_SHAPES];
  int nplans;
  struct rf_gemm_cuda_stats stats;
};

struct rf_gemm_cuda *rf_gemm_cuda_create(size_t workspace_bytes) {
  struct rf_gemm_cuda *g = rf_xcalloc(1, sizeof *g);
  g->workspace_bytes = workspace_bytes ? workspace_bytes : (size_t)32 << 20;
  RF_CUBLAS_CHECK(cublasLtCreate(&g->handle));
  cudaError_t rc = cudaMalloc(&g->workspace, g->workspace_bytes);
  if (rc != cudaSuccess)
    RF_DIE("gemm: cudaMalloc of the %zu-byte cuBLASLt workspace failed: %s", g->workspace_bytes,
           cudaGetErrorString(rc));
  g->stats.mallocs++;
  return g;
}

void rf_gemm_cuda_free(struct rf_gemm_cuda *g) {
  if (!g) return;
  for (int i = 0; i < g->nplans; i++) {
    struct rf_gemm_cuda_plan *p = &g->plans[i];
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    RF_CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->op));
  }
  if (g->workspace && cudaFree(g->workspace) != cudaSuccess) RF_DIE("gemm: cudaFree of the workspace failed");
  RF_CUBLAS_CHECK(cublasLtDestroy(g->handle));
  free(g);
}

struct rf_gemm_cuda_stats rf_gemm_cuda_stats(const struct rf_gemm_cuda *g) {
  return g->stats;
}

static void rf_gemm_cuda_check(const struct rf_gemm_desc *d, enum rf_dtype c_dtype) {
  if (d->m <= 0 || d->n <= 0 || d->k <= 0)
    RF_DIE("gemm (cuda): sizes m=%d n=%d k=%d must be positive", d->m, d->n, d->k);
  int a_cols = d->trans_a ? d->m : d->k, b_cols = d->trans_b ? d->k : d->n;
  if (d->lda < a_cols || d->ldb < b_cols || d->ldc < d->n)
    RF_DIE("gemm (cuda): leading dimensions lda=%d ldb=%d ldc=%d below the rows' widths %d, %d, %d", d->lda,
           d->ldb, d->ldc, a_cols, b_cols, d->n);
  if (d->dtype != RF_DTYPE_F32 && d->dtype != RF_DTYPE_BF16)
    RF_DIE("gemm (cuda): operand dtype %s (f32 or bf16 only)", rf_dtype_name(d->dtype));
  if (c_dtype != RF_DTYPE_F32 && c_dtype != RF_DTYPE_BF16)
    RF_DIE("gemm (cuda): output dtype %s (f32 or bf16 only)", rf_dtype_name(c_dtype));
}

static cudaDataType_t rf_gemm_cuda_type(enum rf_dtype dtype) {
  return dtype == RF_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* Row-major C [m, n] is column-major C^T [n, m] (ld ldc) = op(B)^T op(A)^T: cuBLASLt's A
 * is our B as stored (column-major [n, k], or [k, n] transposed when trans_b), its B is
 * our A (column-major [k, m], or [m, k] transposed when trans_a). */
static struct rf_gemm_cuda_plan *rf_gemm_cuda_plan(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d,
                                                   enum rf_dtype c_dtype, int bias, uint32_t align) {
  struct rf_gemm_cuda_key key = {d->m,   d->n,   d->k,     d->trans_a, d->trans_b, d->lda,
                                 d->ldb, d->ldc, d->dtype, c_dtype,    bias,       align};
  for (int i = 0; i < g->nplans; i++)
    if (memcmp(&g->plans[i].key, &key, sizeof key) == 0) return &g->plans[i];
  rf_gemm_cuda_check(d, c_dtype);
  if (g->nplans == RF_GEMM_CUDA_SHAPES)
    RF_DIE("gemm (cuda): more than %d distinct product shapes", RF_GEMM_CUDA_SHAPES);
  struct rf_gemm_cuda_plan *p = &g->plans[g->nplans];
  memset(p, 0, sizeof *p);
  p->key = key;
  cudaDataType_t ab = rf_gemm_cuda_type(d->dtype), ct = rf_gemm_cuda_type(c_dtype);
  RF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  RF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  RF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  if (bias) { /* the bias vector runs along cuBLASLt's rows of D: our columns n */
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    RF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  }
  RF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, ab, d->trans_b ? (uint64_t)d->k : (uint64_t)d->n,
                                             d->trans_b ? (uint64_t)d->n : (uint64_t)d->k, d->ldb));
  RF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, ab, d->trans_a ? (uint64_t)d->m : (uint64_t)d->k,
                                             d->trans_a ? (uint64_t)d->k : (uint64_t)d->m, d->lda));
  RF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lc, ct, (uint64_t)d->n, (uint64_t)d->m, d->ldc));
  cublasLtMatmulPreference_t pref;
  RF_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  RF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &g->workspace_bytes, sizeof g->workspace_bytes));
  const cublasLtMatmulPreferenceAttributes_t aligns[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
    RF_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  RF_CUBLAS_CHECK(
      cublasLtMatmulAlgoGetHeuristic(g->handle, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &result, &found));
  RF_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (found < 1)
    RF_DIE("gemm (cuda): cuBLASLt has no algorithm for %s x %s -> %s, m=%d n=%d k=%d trans %d%d ld %d %d %d",
           rf_dtype_name(d->dtype), rf_dtype_name(d->dtype), rf_dtype_name(c_dtype), d->m, d->n, d->k,
           d->trans_a, d->trans_b, d->lda, d->ldb, d->ldc);
  p->algo = result.algo;
  g->nplans++;
  g->stats.plans++;
  return p;
}

/* The operands' alignment: the largest power of two up to RF_GEMM_CUDA_ALIGN dividing every
 * address (a tensor after an odd number of floats in a unit's buffer, GPT-OSS's sinks of 2 heads,
 * is 8-byte aligned); each operand must be aligned to its own elements. */
static uint32_t rf_gemm_cuda_align(const struct rf_gemm_desc *d, const void *a, const void *b, const void *c,
                                   enum rf_dtype c_dtype) {
  size_t ab = rf_dtype_size(d->dtype), cs = rf_dtype_size(c_dtype);
  if ((uintptr_t)a % ab || (uintptr_t)b % ab || (uintptr_t)c % cs)
    RF_DIE("gemm (cuda): operands not aligned to their elements (a %p, b %p: %s; c %p: %s)", a, b,
           rf_dtype_name(d->dtype), c, rf_dtype_name(c_dtype));
  uintptr_t all = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
  uint32_t align = RF_GEMM_CUDA_ALIGN;
  while (all % align) align /= 2;
  return align;
}

static void rf_gemm_cuda_product(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, const void *a,
                                 const void *b, const void *bias, void *c, enum rf_dtype c_dtype,
                                 cudaStream_t stream) {
  const struct rf_gemm_cuda_plan *p =
      rf_gemm_cuda_plan(g, d, c_dtype, bias != NULL, rf_gemm_cuda_align(d, a, b, c, c_dtype));
  if (bias) /* read by cublasLtMatmul when it is called: the pointer of this product */
    RF_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  RF_CUBLAS_CHECK(cublasLtMatmul(g->handle, p->op, &d->alpha, b, p->la, a, p->lb, &d->beta, c, p->lc, c,
                                 p->lc, &p->algo, g->workspace, g->workspace_bytes, stream));
  g->stats.products++;
}

void rf_gemm_cuda_run(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, const void *a, const void *b,
                      void *c, enum rf_dtype c_dtype, cudaStream_t stream) {
  rf_gemm_cuda_product(g, d, a, b, NULL, c, c_dtype, stream);
}

void rf_gemm_cuda_run_bias(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, const void *a, const void *b,
                           const void *bias, void *c, enum rf_dtype c_dtype, cudaStream_t stream) {
  if (!bias) RF_DIE("gemm (cuda): a bias product without a bias");
  rf_gemm_cuda_product(g, d, a, b, bias, c, c_dtype, stream);
}

int64_t rf_gemm_cuda_fp8_scales(int64_t rows, int64_t k, int tile_rows) {
  int64_t kb = (k + RF_FP8_TILE - 1) / RF_FP8_TILE;
  if (tile_rows == 1) return kb * rows;
  return (rows + RF_FP8_TILE - 1) / RF_FP8_TILE * ((kb + 3) / 4 * 4);
}

int64_t rf_gemm_cuda_fp8_scale_at(int64_t rows, int64_t k, int tile_rows, int64_t r, int64_t kb) {
  if (tile_rows == 1) return kb * rows + r;
  return r / RF_FP8_TILE * (((k + RF_FP8_TILE - 1) / RF_FP8_TILE + 3) / 4 * 4) + kb;
}

static int32_t rf_gemm_cuda_fp8_mode(int tile_rows) {
  return tile_rows == 1 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                        : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
}

/* The FP8 plan of (m, n, k, the tiles, y's dtype), made when new; NULL when cuBLASLt
 * refuses it or has no algorithm (its descriptors destroyed again, nothing cached). */
static struct rf_gemm_cuda_plan *rf_gemm_cuda_fp8_plan(struct rf_gemm_cuda *g, int m, int n, int k,
                                                       int x_tile, int w_tile, enum rf_dtype y_dtype) {
  struct rf_gemm_cuda_key key = {
      m, n, k, x_tile, w_tile, k, k, n, RF_DTYPE_FP8E4M3, y_dtype, 0, RF_GEMM_CUDA_ALIGN};
  for (int i = 0; i < g->nplans; i++)
    if (memcmp(&g->plans[i].key, &key, sizeof key) == 0) return &g->plans[i];
  if (g->nplans == RF_GEMM_CUDA_SHAPES)
    RF_DIE("gemm (cuda): more than %d distinct product shapes", RF_GEMM_CUDA_SHAPES);
  struct rf_gemm_cuda_plan *p = &g->plans[g->nplans];
  memset(p, 0, sizeof *p);
  p->key = key;
  RF_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  RF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)n, k));
  RF_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_8F_E4M3, (uint64_t)k, (uint64_t)m, k));
  RF_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p->lc, rf_gemm_cuda_type(y_dtype), (uint64_t)n, (uint64_t)m, n));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  int32_t amode = rf_gemm_cuda_fp8_mode(w_tile), bmode = rf_gemm_cuda_fp8_mode(x_tile);
  int found = 0;
  cublasLtMatmulPreference_t pref = NULL;
  cublasLtMatmulHeuristicResult_t result;
  uint32_t align = RF_GEMM_CUDA_ALIGN;
  int ok = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &amode, sizeof amode) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bmode, sizeof bmode) ==
               CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
           cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &g->workspace_bytes,
                                                sizeof g->workspace_bytes) == CUBLAS_STATUS_SUCCESS;
  const cublasLtMatmulPreferenceAttributes_t aligns[] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (size_t i = 0; ok && i < sizeof aligns / sizeof aligns[0]; i++)
    ok = cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &align, sizeof align) == CUBLAS_STATUS_SUCCESS;
  ok = ok &&
       cublasLtMatmulAlgoGetHeuristic(g->handle, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &result,
                                      &found) == CUBLAS_STATUS_SUCCESS &&
       found >= 1;
  if (pref) RF_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  if (!ok) {
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->la));
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lb));
    RF_CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->lc));
    RF_CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->op));
    return NULL;
  }
  p->algo = result.algo;
  g->nplans++;
  g->stats.plans++;
  return p;
}

int rf_gemm_cuda_run_fp8(struct rf_gemm_cuda *g, int m, int n, int k, struct rf_gemm_cuda_fp8_operand x,
                         struct rf_gemm_cuda_fp8_operand w, float beta, void *y, enum rf_dtype y_dtype,
                         cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0 || m % 16 || n % 16 || k % RF_FP8_TILE)
    RF_DIE("gemm (cuda): FP8 product %d x %d x %d: m and n must be positive multiples of 16, k of %d", m, n,
           k, RF_FP8_TILE);
  if ((x.tile_rows != 1 && x.tile_rows != RF_FP8_TILE) || (w.tile_rows != 1 && w.tile_rows != RF_FP8_TILE) ||
      (x.tile_rows == RF_FP8_TILE && w.tile_rows == RF_FP8_TILE))
    RF_DIE("gemm (cuda): FP8 tiles %d x %d and %d x %d (1 or %d rows, not both %d)", x.tile_rows, RF_FP8_TILE,
           w.tile_rows, RF_FP8_TILE, RF_FP8_TILE, RF_FP8_TILE);
  if (y_dtype != RF_DTYPE_F32 && y_dtype != RF_DTYPE_BF16)
    RF_DIE("gemm (cuda): FP8 product into %s (f32 or bf16)", rf_dtype_name(y_dtype));
  if (((uintptr_t)x.codes | (uintptr_t)w.codes | (uintptr_t)y | (uintptr_t)x.scales | (uintptr_t)w.scales) %
          RF_GEMM_CUDA_ALIGN !=
      0)
    RF_DIE("gemm (cuda): FP8 operands and scales must be %d-byte aligned", RF_GEMM_CUDA_ALIGN);
  const struct rf_gemm_cuda_plan *p = rf_gemm_cuda_fp8_plan(g, m, n, k, x.tile_rows, w.tile_rows, y_dtype);
  if (!p) return -1;
  RF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w.scales,
                                                 sizeof w.scales));
  RF_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x.scales,
                                                 sizeof x.scales));
  const float one = 1.0f;
  RF_CUBLAS_CHECK(cublasLtMatmul(g->handle, p->op, &one, w.codes, p->la, x.codes, p->lb, &beta, y, p->lc, y,
                                 p->lc, &p->algo, g->workspace, g->workspace_bytes, stream));
  g->stats.products++;
  return 0;
}

const char *rf_gemm_cuda_algo_name(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d,
                                   enum rf_dtype c_dtype) {
  static char name[64];
  const struct rf_gemm_cuda_plan *p = rf_gemm_cuda_plan(g, d, c_dtype, 0, RF_GEMM_CUDA_ALIGN);
  int id = 0, tile = 0;
  size_t written = 0;
  RF_CUBLAS_CHECK(
      cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written));
  RF_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                                       sizeof tile, &written));
  snprintf(name, sizeof name, "cublasLt algo %d tile %d", id, tile);
  return name;
}
