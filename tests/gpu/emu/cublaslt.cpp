/* cuda-emu's cuBLASLt (include/cublasLt.h): the matrix product rfsdp's CUDA build uses,
 * D = alpha op(A) op(B) + beta C, column-major, A and B bf16 (or f32), f32 accumulation
 * in k order on the stream's worker, C and D f32 or bf16 (rounded to nearest even
 * once); with beta 0, C is not read (as cuBLAS). The rules cuBLASLt's documentation
 * sets, checked where the library itself would misbehave quietly or fail late:
 *   - descriptors: compute CUBLAS_COMPUTE_32F and scale CUDA_R_32F; the default
 *     epilogue or CUBLASLT_EPILOGUE_BIAS (others: CUBLAS_STATUS_NOT_SUPPORTED): the bias
 *     vector (CUBLASLT_MATMUL_DESC_BIAS_POINTER, required) has D's type (cuBLASLt's
 *     default bias type), one value per row of D, packed, in one live device allocation,
 *     added in f32 to alpha op(A) op(B) + beta C before D's rounding; column-major layouts of one
 *     matrix; ld >= rows; op(A) m x k, op(B) k x n, C and D m x n (each named when not);
 *   - the algorithm: cublasLtMatmul takes only one that cublasLtMatmulAlgoGetHeuristic
 *     returned for the same descriptors (remembered in the algorithm's words), and
 *     every pointer must have the alignment the heuristic was promised through
 *     CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES (256 when not set, cuBLASLt's
 *     default) -- the bug this catches passes on a GPU until an offset changes;
 *   - the workspace: at least what the heuristic said the algorithm needs, at most the
 *     preference's maximum, device memory 256-byte aligned holding that many bytes;
 *   - every matrix lies inside one live device allocation; D is C or does not overlap
 *     it; alpha and beta are host memory (CUBLASLT_POINTER_MODE_HOST).
 * FP8 block scaling (Hopper, cuBLAS 12.9): A and B CUDA_R_8F_E4M3 (e4m3 codes), each with
 * a scale mode, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F (one f32 per 128 elements along K
 * of a row of op(A), a column of op(B)) or _BLK128x128_32F (one per 128 x 128 tile), not
 * both BLK; C and D CUDA_R_16BF or CUDA_R_32F; the TN layout only (A transposed, B not);
 * m, n and k multiples of 16 (16-byte aligned rows of codes), k a multiple of 128 (whole
 * scale blocks); the default epilogue. The scale tensors, device memory, 16-byte aligned,
 * each inside one live allocation of its whole size, laid out as PyTorch's
 * test_scaled_mm_vs_emulated_block_wise hands them to cuBLASLt (this stand-in's reading;
 * not yet checked on a GPU): VEC128 outer-dimension-major, the scale of row i and K block
 * kb at kb * rows + i (rows: m for A, n for B); BLK128x128 the K blocks innermost, tile
 * (ib, kb) at ib * L4 + kb, L4 = the K blocks rounded up to a multiple of 4. Each 128-wide
 * block's products of the codes' values (exact in f32) are summed in f32 in k order,
 * multiplied by the two scales' product and added to the f32 accumulator, block by block,
 * as the DeepSeek-V3 kernels promote their partial sums; then alpha, beta C, D's rounding. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <set>
#include <vector>

#include "cublasLt.h"
#include "emu.h"

#define RF_EMU_ALGO_MAGIC 0x63756d756c61ull /* "cumula" */

struct rf_emu_cublaslt {
  int device;
};
struct rf_emu_matmul_desc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t transa, transb;
  uint32_t epilogue;
  const void *bias;         /* CUBLASLT_MATMUL_DESC_BIAS_POINTER */
  int32_t scale_mode[2];    /* A, B: CUBLASLT_MATMUL_DESC_A/B_SCALE_MODE (SCALAR_32F unset) */
  const void *scale_ptr[2]; /* A, B: CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER */
};
struct rf_emu_matrix_layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t order, batch;
};
struct rf_emu_matmul_pref {
  uint64_t max_workspace;
  uint32_t align[4]; /* A, B, C, D */
};

namespace {

std::mutex g_mu;
std::set<const void *> g_live; /* handles and descriptors not destroyed */

cublasStatus_t refuse(cublasStatus_t status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
cublasStatus_t refuse(cublasStatus_t status, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-emu: cuBLASLt: %s (%s)\n", msg, cublasLtGetStatusName(status));
  return status;
}

template <typename T>
cublasStatus_t make(T **out) {
  T *p = (T *)calloc(1, sizeof(T));
  if (!p) return CUBLAS_STATUS_ALLOC_FAILED;
  std::lock_guard<std::mutex> lock(g_mu);
  g_live.insert(p);
  *out = p;
  return CUBLAS_STATUS_SUCCESS;
}

int live(const void *p) {
  std::lock_guard<std::mutex> lock(g_mu);
  return p && g_live.count(p);
}

cublasStatus_t destroy(void *p, const char *what) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!p || !g_live.erase(p)) return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s of %p: not live", what, p);
  }
  free(p);
  return CUBLAS_STATUS_SUCCESS;
}

size_t type_size(cudaDataType t) {
  return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2 ? 1 : t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_64F ? 8 : 4;
}

const char *type_name(cudaDataType t) {
  return t == CUDA_R_16BF     ? "CUDA_R_16BF"
         : t == CUDA_R_32F    ? "CUDA_R_32F"
         : t == CUDA_R_8F_E4M3 ? "CUDA_R_8F_E4M3"
                               : "an unsupported type";
}

const uint64_t RF_EMU_K_BLOCK = 128; /* VEC128_32F and BLK128x128_32F: 128 along K */

/* The f32 count of a scale tensor of an operand with `rows` rows (of op(A), columns of
 * op(B)) and k along K in the mode (block modes only). */
size_t scale_count(int32_t mode, uint64_t rows, uint64_t k) {
  uint64_t kb = (k + RF_EMU_K_BLOCK - 1) / RF_EMU_K_BLOCK;
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return (size_t)(kb * rows);
  return (size_t)((rows + RF_EMU_K_BLOCK - 1) / RF_EMU_K_BLOCK * ((kb + 3) / 4 * 4));
}

/* Where the scale of row i, K block kb lies (scale_count's layout). */
size_t scale_at(int32_t mode, uint64_t rows, uint64_t k, uint64_t i, uint64_t kb) {
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) return (size_t)(kb * rows + i);
  uint64_t l4 = ((k + RF_EMU_K_BLOCK - 1) / RF_EMU_K_BLOCK + 3) / 4 * 4;
  return (size_t)(i / RF_EMU_K_BLOCK * l4 + kb);
}

/* The value of an e4m3 code: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
 * subnormal (m 2^-9); S.1111.111 NaN; no infinities. */
float e4m3_value(uint8_t c) {
  uint32_t e = (c >> 3) & 0xfu, m = c & 0x7u;
  float v = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), (int)e - 10);
  return c & 0x80u ? -v : v;
}

/* The product's shape from the descriptors, checked: 0, or the refusal. */
struct shape {
  uint64_t m, n, k;
};
cublasStatus_t check_problem(const rf_emu_matmul_desc *op, const rf_emu_matrix_layout *a,
                             const rf_emu_matrix_layout *b, const rf_emu_matrix_layout *c,
                             const rf_emu_matrix_layout *d, shape *s, const char *api) {
  if (!live(op) || !live(a) || !live(b) || !live(c) || !live(d))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s: a descriptor that is not live (destroyed or never created)", api);
  if (op->compute != CUBLAS_COMPUTE_32F || op->scale != CUDA_R_32F)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "%s: compute type %d, scale type %d (emulated: CUBLAS_COMPUTE_32F, CUDA_R_32F)", api,
                  (int)op->compute, (int)op->scale);
  if (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT && op->epilogue != CUBLASLT_EPILOGUE_BIAS)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "%s: epilogue %u (emulated: CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS)", api,
                  op->epilogue);
  if ((op->transa != CUBLAS_OP_N && op->transa != CUBLAS_OP_T) ||
      (op->transb != CUBLAS_OP_N && op->transb != CUBLAS_OP_T))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: transposes %d, %d (N or T)", api, op->transa, op->transb);
  const rf_emu_matrix_layout *all[4] = {a, b, c, d};
  const char *names = "ABCD";
  for (int i = 0; i < 4; i++) {
    const rf_emu_matrix_layout *l = all[i];
    if (l->order != CUBLASLT_ORDER_COL || l->batch != 1)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: layout %c is not one column-major matrix", api,
                    names[i]);
    if (l->rows == 0 || l->cols == 0 || l->ld < (int64_t)l->rows)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: layout %c is %llu x %llu with ld %lld (ld >= rows needed)", api, names[i],
                    (unsigned long long)l->rows, (unsigned long long)l->cols, (long long)l->ld);
  }
  const int fp8 = a->type == CUDA_R_8F_E4M3 || b->type == CUDA_R_8F_E4M3;
  if (a->type != b->type || (a->type != CUDA_R_16BF && a->type != CUDA_R_32F && a->type != CUDA_R_8F_E4M3))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "%s: A %s and B %s (both CUDA_R_16BF, both CUDA_R_32F or both CUDA_R_8F_E4M3)", api,
                  type_name(a->type), type_name(b->type));
  if (c->type != d->type || (c->type != CUDA_R_16BF && c->type != CUDA_R_32F) ||
      (a->type == CUDA_R_32F && c->type != CUDA_R_32F))
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: A and B %s with C %s and D %s", api, type_name(a->type),
                  type_name(c->type), type_name(d->type));
  uint64_t m = op->transa == CUBLAS_OP_N ? a->rows : a->cols,
           k = op->transa == CUBLAS_OP_N ? a->cols : a->rows;
  uint64_t kb = op->transb == CUBLAS_OP_N ? b->rows : b->cols,
           n = op->transb == CUBLAS_OP_N ? b->cols : b->rows;
  if (kb != k || c->rows != m || c->cols != n || d->rows != m || d->cols != n)
    return refuse(
        CUBLAS_STATUS_INVALID_VALUE,
        "%s: op(A) is %llux%llu, op(B) %llux%llu, C %llux%llu, D %llux%llu: not m x k, k x n, m x n", api,
        (unsigned long long)m, (unsigned long long)k, (unsigned long long)kb, (unsigned long long)n,
        (unsigned long long)c->rows, (unsigned long long)c->cols, (unsigned long long)d->rows,
        (unsigned long long)d->cols);
  const char *modes = "VEC128_32F or BLK128x128_32F, not both BLK128x128_32F";
  for (int i = 0; i < 2; i++) {
    int32_t mode = op->scale_mode[i];
    int block = mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F || mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    if (!fp8 && mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: a block scale mode (%c: %d) on %s operands (FP8 only)", api,
                    "AB"[i], (int)mode, type_name(a->type));
    if (fp8 && !block)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 %c with scale mode %d (emulated: %s)", api, "AB"[i],
                    (int)mode, modes);
  }
  if (fp8) {
    if (op->scale_mode[0] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F &&
        op->scale_mode[1] == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 scale modes BLK128x128_32F for both A and B (%s)", api,
                    modes);
    if (op->transa != CUBLAS_OP_T || op->transb != CUBLAS_OP_N)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: FP8 with transposes %d, %d: only TN (A CUBLAS_OP_T, B CUBLAS_OP_N)", api, op->transa,
                    op->transb);
    if (op->epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 block scaling with epilogue %u (the default only)", api,
                    op->epilogue);
    if (m % 16 || n % 16 || k % 16 || a->ld % 16 || b->ld % 16)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                    "%s: FP8 m=%llu n=%llu k=%llu lda=%lld ldb=%lld: all multiples of 16 (16-byte rows)", api,
                    (unsigned long long)m, (unsigned long long)n, (unsigned long long)k, (long long)a->ld,
                    (long long)b->ld);
    if (k % RF_EMU_K_BLOCK)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "%s: FP8 block scaling with k=%llu: a multiple of %llu", api,
                    (unsigned long long)k, (unsigned long long)RF_EMU_K_BLOCK);
  }
  *s = shape{m, n, k};
  return CUBLAS_STATUS_SUCCESS;
}

/* What an algorithm was chosen for (its words 3..): the descriptors' contents. */
uint64_t fingerprint(const rf_emu_matmul_desc *op, const rf_emu_matrix_layout *const *l) {
  uint64_t h = rf_emu::mix((uint64_t)op->compute ^ ((uint64_t)op->transa << 8) ^
                           ((uint64_t)op->transb << 16) ^ ((uint64_t)op->epilogue << 24) ^
                           ((uint64_t)op->scale_mode[0] << 40) ^ ((uint64_t)op->scale_mode[1] << 48));
  for (int i = 0; i < 4; i++)
    h = rf_emu::mix(h ^ rf_emu::mix((uint64_t)l[i]->type ^ (l[i]->rows << 8) ^ (l[i]->cols << 32) ^
                                    ((uint64_t)l[i]->ld << 20)));
  return h;
}

/* The bytes a column-major matrix spans. */
size_t extent(const rf_emu_matrix_layout *l) {
  return ((size_t)(l->cols - 1) * (size_t)l->ld + (size_t)l->rows) * type_size(l->type);
}

float load(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_32F) return ((const float *)p)[i];
  uint32_t bits = (uint32_t)((const uint16_t *)p)[i] << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

void store(void *p, cudaDataType t, size_t i, float v) {
  if (t == CUDA_R_32F) {
    ((float *)p)[i] = v;
    return;
  }
  uint32_t u;
  memcpy(&u, &v, 4);
  uint16_t b = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                               : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  ((uint16_t *)p)[i] = b;
}

}  // namespace

extern "C" {

const char *cublasLtGetStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an unsupported value or parameter was passed to the function";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "resource allocation failed";
    default:
      return cublasLtGetStatusName(s);
  }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
  cublasStatus_t st = make(h);
  if (st == CUBLAS_STATUS_SUCCESS) (*h)->device = rf_emu::current_device();
  return st;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { return destroy(h, "cublasLtDestroy"); }

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  cublasStatus_t st = make(desc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  (*desc)->compute = compute;
  (*desc)->scale = scale;
  (*desc)->transa = (*desc)->transb = CUBLAS_OP_N;
  (*desc)->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  (*desc)->scale_mode[0] = (*desc)->scale_mode[1] = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  return st;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  return destroy(desc, "cublasLtMatmulDescDestroy");
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
  if (!live(desc))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: descriptor not live");
  int32_t *field = attr == CUBLASLT_MATMUL_DESC_TRANSA   ? &desc->transa
                   : attr == CUBLASLT_MATMUL_DESC_TRANSB ? &desc->transb
                                                         : NULL;
  if (field) {
    if (size != sizeof(int32_t))
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmulDescSetAttribute: %zu bytes for a transpose (4)", size);
    memcpy(field, buf, 4);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE && size == sizeof(uint32_t)) {
    memcpy(&desc->epilogue, buf, 4);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_BIAS_POINTER) {
    if (size != sizeof(void *))
      return refuse(
          CUBLAS_STATUS_INVALID_VALUE,
          "cublasLtMatmulDescSetAttribute: %zu bytes for the bias pointer (%zu: the pointer's value)", size,
          sizeof(void *));
    memcpy(&desc->bias, buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_POINTER || attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER) {
    if (size != sizeof(void *))
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "cublasLtMatmulDescSetAttribute: %zu bytes for a scale pointer (%zu: the pointer's value)", size,
                    sizeof(void *));
    memcpy(&desc->scale_ptr[attr == CUBLASLT_MATMUL_DESC_B_SCALE_POINTER], buf, sizeof(void *));
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_A_SCALE_MODE || attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE) {
    int32_t mode;
    if (size != sizeof mode)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulDescSetAttribute: %zu bytes for a scale mode (4)",
                    size);
    memcpy(&mode, buf, sizeof mode);
    if (mode != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && mode != CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F &&
        mode != CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F)
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute: scale mode %d not emulated",
                    (int)mode);
    desc->scale_mode[attr == CUBLASLT_MATMUL_DESC_B_SCALE_MODE] = mode;
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute: attribute %d not emulated",
                (int)attr);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  cublasStatus_t st = make(layout);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  **layout = rf_emu_matrix_layout{type, rows, cols, ld, CUBLASLT_ORDER_COL, 1};
  return st;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  return destroy(layout, "cublasLtMatrixLayoutDestroy");
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                size_t size) {
  if (!live(layout))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatrixLayoutSetAttribute: layout not live");
  if ((attr == CUBLASLT_MATRIX_LAYOUT_ORDER || attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) && size == 4) {
    memcpy(attr == CUBLASLT_MATRIX_LAYOUT_ORDER ? &layout->order : &layout->batch, buf, 4);
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutSetAttribute: attribute %d not emulated",
                (int)attr);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  cublasStatus_t st = make(pref);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  for (int i = 0; i < 4; i++) (*pref)->align[i] = 256; /* cuBLASLt's default: pointers 256-byte aligned */
  return st;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  return destroy(pref, "cublasLtMatmulPreferenceDestroy");
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t size) {
  if (!live(pref))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulPreferenceSetAttribute: not live");
  if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
    if (size != 8) return refuse(CUBLAS_STATUS_INVALID_VALUE, "MAX_WORKSPACE_BYTES takes a uint64_t");
    memcpy(&pref->max_workspace, buf, 8);
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES &&
      attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
    uint32_t a;
    if (size != 4) return refuse(CUBLAS_STATUS_INVALID_VALUE, "MIN_ALIGNMENT_*_BYTES takes a uint32_t");
    memcpy(&a, buf, 4);
    if (a == 0 || (a & (a - 1)))
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "MIN_ALIGNMENT_*_BYTES %u: a power of two", a);
    pref->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES] = a;
    return CUBLAS_STATUS_SUCCESS;
  }
  return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                "cublasLtMatmulPreferenceSetAttribute: attribute %d not emulated", (int)attr);
}

/* One algorithm: id 1 (tile 20) when k <= 4096, else a split-k one (id 2, tile 21)
 * that wants 1 MiB of workspace; none when the workspace allowed is smaller. */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned) {
  if (!live(h) || !live(pref) || requested < 1 || !results || !returned)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "cublasLtMatmulAlgoGetHeuristic: bad handle, preference or counts");
  shape s;
  cublasStatus_t st = check_problem(op, a, b, c, d, &s, "cublasLtMatmulAlgoGetHeuristic");
  *returned = 0;
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  int split = s.k > 4096;
  uint64_t need = split ? (1u << 20) : 0;
  if (need > pref->max_workspace) return CUBLAS_STATUS_NOT_SUPPORTED; /* no algorithm fits */
  const rf_emu_matrix_layout *l[4] = {a, b, c, d};
  memset(&results[0], 0, sizeof results[0]);
  uint64_t *w = results[0].algo.data;
  w[0] = RF_EMU_ALGO_MAGIC;
  w[1] = split ? 2 : 1;
  w[2] = split ? 21 : 20;
  w[3] = fingerprint(op, l);
  w[4] = (uint64_t)pref->align[0] | (uint64_t)pref->align[1] << 16 | (uint64_t)pref->align[2] << 32 |
         (uint64_t)pref->align[3] << 48;
  w[5] = need;
  w[6] = pref->max_workspace;
  results[0].workspaceSize = need;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr, void *buf,
                                                    size_t size, size_t *written) {
  if (!algo || algo->data[0] != RF_EMU_ALGO_MAGIC)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmulAlgoConfigGetAttribute: not an algorithm");
  if ((attr != CUBLASLT_ALGO_CONFIG_ID && attr != CUBLASLT_ALGO_CONFIG_TILE_ID) || size < 4)
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoConfigGetAttribute: attribute %d",
                  (int)attr);
  int v = (int)algo->data[attr == CUBLASLT_ALGO_CONFIG_ID ? 1 : 2];
  memcpy(buf, &v, 4);
  if (written) *written = 4;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                              const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D,
                              cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  const char *api = "cublasLtMatmul";
  if (!live(h)) return refuse(CUBLAS_STATUS_NOT_INITIALIZED, "%s: the handle is not live", api);
  shape s;
  cublasStatus_t st = check_problem(op, la, lb, lc, ld, &s, api);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  const rf_emu_matrix_layout *l[4] = {la, lb, lc, ld};
  if (!algo || algo->data[0] != RF_EMU_ALGO_MAGIC)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s: the algorithm is not one cublasLtMatmulAlgoGetHeuristic returned", api);
  if (algo->data[3] != fingerprint(op, l))
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s: the algorithm was chosen for other descriptors (transposes, types, sizes or leading "
                  "dimensions differ)",
                  api);
  const void *ptr[4] = {A, B, C, D};
  for (int i = 0; i < 4; i++) {
    uint32_t promised = (uint32_t)(algo->data[4] >> (16 * i)) & 0xffffu;
    if ((uintptr_t)ptr[i] % promised != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: %c at %p is not %u-byte aligned, the alignment the algorithm was chosen for "
                    "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                    api, "ABCD"[i], ptr[i], promised, "ABCD"[i]);
    char what[64];
    snprintf(what, sizeof what, "%s, matrix %c", api, "ABCD"[i]);
    if (rf_emu::check_device_range(ptr[i], extent(l[i]), what) != cudaSuccess)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int bias = op->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (bias) {
    if (!op->bias)
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "%s: CUBLASLT_EPILOGUE_BIAS without CUBLASLT_MATMUL_DESC_BIAS_POINTER", api);
    if ((uintptr_t)op->bias % type_size(ld->type) != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: the bias %p is not aligned to its %s elements", api,
                    op->bias, type_name(ld->type));
    if (rf_emu::check_device_range(op->bias, (size_t)ld->rows * type_size(ld->type),
                                   "cublasLtMatmul, bias") != cudaSuccess)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const char *c0 = (const char *)C, *d0 = (const char *)D;
  if (C != D && c0 < d0 + extent(ld) && d0 < c0 + extent(lc))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: C and D overlap without being the same matrix", api);
  if (C == D && (lc->ld != ld->ld))
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: in place (C == D) with leading dimensions %lld and %lld",
                  api, (long long)lc->ld, (long long)ld->ld);
  uint64_t need = algo->data[5], max = algo->data[6];
  if (workspace_bytes < need || workspace_bytes > max)
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "%s: a workspace of %zu bytes; the algorithm needs %llu and was chosen for at most %llu",
                  api, workspace_bytes, (unsigned long long)need, (unsigned long long)max);
  if (workspace_bytes > 0) {
    if ((uintptr_t)workspace % 256 != 0)
      return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: the workspace %p is not 256-byte aligned", api,
                    workspace);
    if (rf_emu::check_device_range(workspace, workspace_bytes, "cublasLtMatmul, workspace") != cudaSuccess)
      return CUBLAS_STATUS_INVALID_VALUE;
  }
  const int fp8 = la->type == CUDA_R_8F_E4M3;
  if (fp8)
    for (int i = 0; i < 2; i++) {
      const void *sp = op->scale_ptr[i];
      uint64_t rows = i == 0 ? s.m : s.n;
      size_t bytes = scale_count(op->scale_mode[i], rows, s.k) * sizeof(float);
      if (!sp)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: FP8 block scaling without CUBLASLT_MATMUL_DESC_%c_SCALE_POINTER",
                      api, "AB"[i]);
      if ((uintptr_t)sp % 16 != 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: the %c scales at %p are not 16-byte aligned", api, "AB"[i],
                      sp);
      char what[96];
      snprintf(what, sizeof what, "%s, %c's scales (%zu floats for %s)", api, "AB"[i], bytes / sizeof(float),
               op->scale_mode[i] == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F ? "VEC128_32F" : "BLK128x128_32F");
      if (rf_emu::check_device_range(sp, bytes, what) != cudaSuccess) return CUBLAS_STATUS_INVALID_VALUE;
    }
  struct rf_emu::where wa = rf_emu::locate(alpha), wb = rf_emu::locate(beta);
  if (wa.place == rf_emu::PLACE_DEVICE || wb.place == rf_emu::PLACE_DEVICE ||
      wa.place == rf_emu::PLACE_DEVICE_FREED || wb.place == rf_emu::PLACE_DEVICE_FREED)
    return refuse(CUBLAS_STATUS_INVALID_VALUE, "%s: alpha and beta must be host memory (pointer mode host)",
                  api);
  rf_emu::stream *s_ = rf_emu::stream_of(stream, api);
  if (!s_) return CUBLAS_STATUS_INVALID_VALUE;
  float al, be;
  memcpy(&al, alpha, 4);
  memcpy(&be, beta, 4);
  rf_emu::count(&rf_emu::stats.matmuls, 1);
  rf_emu_matrix_layout a = *la, b = *lb, c = *lc, d = *ld;
  int ta = op->transa == CUBLAS_OP_T, tb = op->transb == CUBLAS_OP_T;
  const void *va = rf_emu::view(A), *vb = rf_emu::view(B), *vc = rf_emu::view(C);
  void *vd = rf_emu::view(D);
  const void *vbias =
      bias ? rf_emu::view(op->bias) : NULL; /* the pointer of this call, as cuBLASLt reads it */
  if (fp8) {
    const float *vsa = (const float *)rf_emu::view(op->scale_ptr[0]),
                *vsb = (const float *)rf_emu::view(op->scale_ptr[1]);
    const int32_t mode_a = op->scale_mode[0], mode_b = op->scale_mode[1];
    rf_emu::enqueue(s_, "cublasLtMatmul (FP8 block scaled)", [=] {
      size_t m = s.m, n = s.n, k = s.k, nk = k / RF_EMU_K_BLOCK;
      const uint8_t *ca = (const uint8_t *)va, *cb = (const uint8_t *)vb;
      for (size_t j = 0; j < n; j++)
        for (size_t i = 0; i < m; i++) { /* TN: row i of op(A) is column i of A, k contiguous */
          const uint8_t *x = ca + i * (size_t)a.ld, *y = cb + j * (size_t)b.ld;
          float acc = 0.0f;
          for (size_t q = 0; q < nk; q++) {
            float part = 0.0f;
            for (size_t p = q * RF_EMU_K_BLOCK; p < (q + 1) * RF_EMU_K_BLOCK; p++)
              part += e4m3_value(x[p]) * e4m3_value(y[p]);
            acc += part * (vsa[scale_at(mode_a, m, k, i, q)] * vsb[scale_at(mode_b, n, k, j, q)]);
          }
          float v = al * acc;
          if (be != 0.0f) v += be * load(vc, c.type, j * (size_t)c.ld + i);
          store(vd, d.type, j * (size_t)d.ld + i, v);
        }
    });
    return CUBLAS_STATUS_SUCCESS;
  }
  rf_emu::enqueue(s_, "cublasLtMatmul", [=] {
    size_t m = s.m, n = s.n, k = s.k;
    std::vector<float> pa(m * k), pb(n * k); /* op(A) by rows, op(B) by columns: k contiguous */
    for (size_t i = 0; i < m; i++)
      for (size_t p = 0; p < k; p++)
        pa[i * k + p] = load(va, a.type, ta ? i * (size_t)a.ld + p : p * (size_t)a.ld + i);
    for (size_t j = 0; j < n; j++)
      for (size_t p = 0; p < k; p++)
        pb[j * k + p] = load(vb, b.type, tb ? p * (size_t)b.ld + j : j * (size_t)b.ld + p);
    for (size_t j = 0; j < n; j++)
      for (size_t i = 0; i < m; i++) {
        const float *x = &pa[i * k], *y = &pb[j * k];
        float acc = 0.0f;
        for (size_t p = 0; p < k; p++) acc += x[p] * y[p];
        float v = al * acc;
        if (be != 0.0f) v += be * load(vc, c.type, j * (size_t)c.ld + i);
        if (vbias) v += load(vbias, d.type, i);
        store(vd, d.type, j * (size_t)d.ld + i, v);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
