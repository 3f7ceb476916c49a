/* rf-test: timeout=60
 * FP8 e4m3 block quantization (src/core/fp8.c) and the product on codes
 * (src/gemm/gemm_fp8.c) against torch (tests/ref_fp8.py, tests/data/fp8_ref.bin):
 * - the 256 codes' values, and codes as bf16, equal torch's float8_e4m3fn values;
 * - codes and scales bit for bit: X and dY per 1x128 tile, W per 128x128 tile (and with
 *   power-of-two scales), X and dY per 128x1 tile, partial edge tiles everywhere
 *   (136 x 272 x 144), and a hand-made tensor of edge tiles (zero tile, f32 subnormals,
 *   amax 448 and amax 448 / 8 on code boundaries with ties to even, values in e4m3's
 *   subnormal range, -0, magnitudes 1e-30 and 3e38);
 * - quantizing whole-tile row ranges separately gives the whole tensor's codes and scales;
 * - NaN and infinities are refused with the tensor and element named;
 * - the linear's Y = X W^T, dX = dY W, dW = dY^T X in DeepSeek-V3's recipe against torch
 *   and against a naive f64 loop over the dequantized operands. Tolerance: the per-slice
 *   products of codes are exact in f32 term by term and summed by oneDNN in f32
 *   (|error| <= gamma_128 * sum |terms|), then each slice is scaled (2 roundings) and
 *   added (one per slice): |c - ref| <= 160 u * sum_k |a_dq b_dq|, u = 2^-24;
 * - a second product of a shape creates no primitive; accumulation adds to C. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "rf_test.h"

#define REF_PATH "tests/data/fp8_ref.bin"
#define M 136
#define K 272
#define N 144
#define T RF_FP8_TILE

/* ---- the reference file ---------------------------------------------------------- */

struct rec {
  char name[64];
  uint32_t dtype; /* 0 f32, 1 u8 */
  int64_t numel;
  const void *data;
};
static struct rec recs[64];
static uint32_t n_recs;
static char *blob;

static int ref_load(void) {
  size_t bytes;
  RF_TRY(rf_file_read_all(REF_PATH, &blob, &bytes));
  RF_REQUIRE(bytes >= 16 && memcmp(blob, "RFFP8REF", 8) == 0, "%s: not an fp8 reference file", REF_PATH);
  uint32_t version;
  memcpy(&version, blob + 8, 4);
  memcpy(&n_recs, blob + 12, 4);
  RF_REQUIRE(version == 1 && n_recs <= 64, "%s: version %u, %u records", REF_PATH, version, n_recs);
  size_t pos = 16;
  for (uint32_t i = 0; i < n_recs; i++) {
    struct rec *r = &recs[i];
    uint32_t len, ndim;
    RF_REQUIRE(pos + 4 <= bytes, "%s: truncated", REF_PATH);
    memcpy(&len, blob + pos, 4);
    RF_REQUIRE(len < sizeof r->name && pos + 12 + len <= bytes, "%s: record %u", REF_PATH, i);
    memcpy(r->name, blob + pos + 4, len);
    r->name[len] = '\0';
    memcpy(&r->dtype, blob + pos + 4 + len, 4);
    memcpy(&ndim, blob + pos + 8 + len, 4);
    pos += 12 + len;
    RF_REQUIRE(ndim <= 4 && r->dtype <= 1 && pos + 8 * ndim <= bytes, "%s: record %s", REF_PATH, r->name);
    r->numel = 1;
    for (uint32_t d = 0; d < ndim; d++) {
      int64_t s;
      memcpy(&s, blob + pos + 8 * d, 8);
      r->numel *= s;
    }
    pos += 8 * ndim;
    size_t size = (size_t)r->numel * (r->dtype ? 1 : 4);
    RF_REQUIRE(pos + size <= bytes, "%s: record %s truncated", REF_PATH, r->name);
    r->data = blob + pos;
    pos += size;
  }
  return 0;
}

/* The record `name` with `numel` elements of `dtype`; stops the test when missing. */
static const void *ref_get(const char *name, uint32_t dtype, int64_t numel) {
  for (uint32_t i = 0; i < n_recs; i++)
    if (strcmp(recs[i].name, name) == 0) {
      if (recs[i].dtype != dtype || recs[i].numel != numel)
        RF_DIE("%s: %s has %lld elements of dtype %u, expected %lld of %u", REF_PATH, name,
               (long long)recs[i].numel, recs[i].dtype, (long long)numel, dtype);
      return recs[i].data;
    }
  RF_DIE("%s: no record %s", REF_PATH, name);
}

/* The f32 record `name` (unaligned in the file) copied out. */
static float *ref_f32(const char *name, int64_t numel) {
  float *out = rf_xmalloc((size_t)numel * sizeof(float));
  memcpy(out, ref_get(name, 0, numel), (size_t)numel * sizeof(float));
  return out;
}

static int bits_equal(const float *a, const float *b, int64_t n) { return memcmp(a, b, (size_t)n * 4) == 0; }

static int same_bits(float a, float b) {
  uint32_t ua, ub;
  memcpy(&ua, &a, 4);
  memcpy(&ub, &b, 4);
  return ua == ub;
}

/* ---- inputs: as tests/ref_fp8.py's make_input ---------------------------------------- */

static float *make_input(uint64_t seed, int rows, int cols, int pr, int pc, int mod, int off) {
  float *x = rf_xmalloc((size_t)rows * cols * sizeof(float));
  uint64_t state = seed;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      x[(size_t)r * cols + c] = ldexpf(rf_test_rand_f32(&state), (r / pr + c / pc) % mod - off);
  return x;
}

/* ---- quantization ------------------------------------------------------------------ */

struct quant {
  struct rf_fp8_grid g;
  uint8_t *codes;
  float *scales;
  uint16_t *bf16; /* the codes as bf16 */
  float *dq;      /* dequantized */
};

static struct quant quant_make(const float *x, int rows, int cols, int tr, int tc, int pow2,
                               const char *name) {
  struct quant q = {.g = {rows, cols, tr, tc}};
  int64_t n = (int64_t)rows * cols, nt = rf_fp8_grid_tiles(&q.g);
  q.codes = rf_xmalloc((size_t)n);
  q.scales = rf_xmalloc((size_t)nt * sizeof(float));
  q.bf16 = rf_xmalloc((size_t)n * 2);
  q.dq = rf_xmalloc((size_t)n * sizeof(float));
  RF_CHECK(rf_fp8_quantize(&q.g, x, pow2, name, q.codes, q.scales) == 0, "%s: %s", name, rf_error_msg());
  rf_fp8_codes_to_bf16(q.bf16, q.codes, (size_t)n);
  rf_fp8_dequantize(&q.g, q.codes, q.scales, q.dq);
  return q;
}

static void quant_free(struct quant *q) {
  free(q->codes);
  free(q->scales);
  free(q->bf16);
  free(q->dq);
}

/* Codes and scales bit for bit against the records "<name>.codes", "<name>.scales". */
static void check_against_ref(const struct quant *q, const char *codes_name, const char *scales_name) {
  int64_t n = q->g.rows * q->g.cols, nt = rf_fp8_grid_tiles(&q->g);
  const uint8_t *rc = ref_get(codes_name, 1, n);
  float *rs = ref_f32(scales_name, nt);
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n; i++)
    if (q->codes[i] != rc[i]) {
      if (first < 0) first = i;
      bad++;
    }
  RF_CHECK(bad == 0, "%s: %lld codes differ from torch (first at %lld: %u, torch %u)", codes_name,
           (long long)bad, (long long)first, first >= 0 ? q->codes[first] : 0, first >= 0 ? rc[first] : 0);
  RF_CHECK(bits_equal(q->scales, rs, nt), "%s: scales differ from torch", scales_name);
  free(rs);
}

static void test_code_values(void) {
  const float *tv = ref_get("code_values", 0, 256);
  for (int c = 0; c < 256; c++) {
    float want;
    memcpy(&want, (const char *)tv + 4 * c, 4);
    uint8_t code = (uint8_t)c;
    uint16_t b;
    rf_fp8_codes_to_bf16(&b, &code, 1);
    float got = rf_f32_from_bf16(b), direct = rf_f32_from_fp8e4m3(code);
    if (isnan(want)) {
      RF_CHECK(isnan(got) && isnan(direct), "code 0x%02x: NaN in torch, %g / %g here", c, got, direct);
      continue;
    }
    RF_CHECK(same_bits(got, want) && same_bits(direct, want), "code 0x%02x: %g / %g, torch %g", c, got,
             direct, want);
    /* every finite value quantizes back to its own code (scale 1) */
    RF_CHECK(rf_fp8e4m3_from_f32(want) == code, "code 0x%02x: value %g quantizes to 0x%02x", c, want,
             rf_fp8e4m3_from_f32(want));
  }
}

static void test_edge(void) {
  float *edge = ref_f32("edge", 4 * 261);
  for (int pow2 = 0; pow2 < 2; pow2++) {
    struct quant q = quant_make(edge, 4, 261, 1, T, pow2, "edge");
    char cn[64], sn[64];
    snprintf(cn, sizeof cn, "edge.codes.p%d", pow2);
    snprintf(sn, sizeof sn, "edge.scales.p%d", pow2);
    check_against_ref(&q, cn, sn);
    /* the zero tile: scale 1, codes 0, dequantized 0 */
    RF_CHECK(q.scales[0] == 1.0f, "zero tile: scale %g", q.scales[0]);
    int zeros = 1;
    for (int c = 0; c < 128; c++) zeros &= q.codes[c] == 0 && q.dq[c] == 0.0f;
    RF_CHECK(zeros, "zero tile: codes or values not zero");
    /* amax 448 exactly: scale 1 (both modes), every value exact */
    RF_CHECK(q.scales[2] == 1.0f, "amax 448: scale %g", q.scales[2]);
    RF_CHECK(bits_equal(q.dq + 256, edge + 256, 5), "amax 448: values not exact");
    /* amax 56 = 448 / 8: scale 1/8 (exact; a power of two too) */
    RF_CHECK(q.scales[3] == 0.125f, "amax 56: scale %g (pow2 %d)", q.scales[3], pow2);
    /* the f32-subnormal tile: a positive scale, values within half a code of the input */
    RF_CHECK(q.scales[1] > 0.0f, "subnormal tile: scale %g", q.scales[1]);
    quant_free(&q);
  }
  free(edge);
}

static void test_scale_rule(void) {
  RF_CHECK(rf_fp8_scale(0.0f, 0) == 1.0f && rf_fp8_scale(0.0f, 1) == 1.0f, "zero amax: scale not 1");
  RF_CHECK(rf_fp8_scale(FLT_TRUE_MIN, 0) == FLT_TRUE_MIN, "tiny amax: scale %g",
           rf_fp8_scale(FLT_TRUE_MIN, 0));
  RF_CHECK(rf_fp8_scale(FLT_TRUE_MIN, 1) == FLT_TRUE_MIN, "tiny amax, pow2: scale %g",
           rf_fp8_scale(FLT_TRUE_MIN, 1));
  for (int e = -100; e <= 100; e += 7) {
    float amax = ldexpf(448.0f, e);
    RF_CHECK(rf_fp8_scale(amax, 1) == ldexpf(1.0f, e), "pow2: amax 448 * 2^%d gives %g", e,
             rf_fp8_scale(amax, 1));
    RF_CHECK(rf_fp8_scale(nextafterf(amax, INFINITY), 1) == ldexpf(1.0f, e + 1),
             "pow2: just above 448 * 2^%d", e);
    RF_CHECK(rf_fp8_scale(amax, 0) == ldexpf(1.0f, e), "amax 448 * 2^%d gives %g", e, rf_fp8_scale(amax, 0));
  }
  RF_CHECK(isfinite(rf_fp8_scale(FLT_MAX, 1)) && rf_fp8_scale(FLT_MAX, 1) * 448.0f >= FLT_MAX,
           "pow2: FLT_MAX gives %g", rf_fp8_scale(FLT_MAX, 1));
}

static void test_refused(void) {
  float x[3 * 5] = {0};
  uint8_t codes[15];
  float scales[3];
  struct rf_fp8_grid g = {3, 5, 1, T};
  x[7] = NAN;
  RF_CHECK(rf_fp8_quantize(&g, x, 0, "layers.0.mlp.up", codes, scales) != 0, "NaN accepted");
  RF_CHECK(strstr(rf_error_msg(), "layers.0.mlp.up") && strstr(rf_error_msg(), "NaN") &&
               strstr(rf_error_msg(), "[1, 2]"),
           "NaN: message '%s'", rf_error_msg());
  x[7] = 0.0f;
  x[14] = -INFINITY;
  RF_CHECK(rf_fp8_quantize(&g, x, 1, "w.q", codes, scales) != 0, "-inf accepted");
  RF_CHECK(strstr(rf_error_msg(), "'w.q'") && strstr(rf_error_msg(), "infinity"), "inf: message '%s'",
           rf_error_msg());
  rf_error_clear();
}

/* Quantizing rows [r0, r1) for cuts at whole tile rows equals the whole tensor's result. */
static void test_ranges(const float *x, int rows, int cols, int tr, const struct quant *whole) {
  uint8_t *codes = rf_xmalloc((size_t)rows * cols);
  float *scales = rf_xmalloc((size_t)rf_fp8_grid_tiles(&whole->g) * sizeof(float));
  int64_t tcn = rf_fp8_grid_tile_cols(&whole->g);
  uint64_t rng = 99;
  for (int r0 = 0; r0 < rows;) {
    int tiles = 1 + (int)(rf_test_rand_u64(&rng) % 2), r1 = r0 + tiles * tr < rows ? r0 + tiles * tr : rows;
    struct rf_fp8_grid g = {r1 - r0, cols, tr, T};
    RF_CHECK(rf_fp8_quantize(&g, x + (size_t)r0 * cols, 0, "range", codes + (size_t)r0 * cols,
                             scales + (r0 / tr) * tcn) == 0,
             "range: %s", rf_error_msg());
    r0 = r1;
  }
  RF_CHECK(memcmp(codes, whole->codes, (size_t)rows * cols) == 0, "row ranges (tiles %dx128): codes differ",
           tr);
  RF_CHECK(bits_equal(scales, whole->scales, rf_fp8_grid_tiles(&whole->g)), "row ranges: scales differ");
  free(codes);
  free(scales);
}

/* ---- the product ------------------------------------------------------------------- */

static struct rf_gemm_fp8_operand operand(const struct quant *q, int trans) {
  struct rf_gemm_fp8_operand op = {q->bf16, q->scales, q->g, trans};
  return op;
}

/* Element (i, j) of op(A) or op(B) dequantized. */
static double dq_at(const struct quant *q, int trans, int i, int j) {
  return trans ? q->dq[(size_t)j * q->g.cols + i] : q->dq[(size_t)i * q->g.cols + j];
}

static void check_product(const char *name, const struct quant *a, int ta, const struct quant *b, int tb,
                          int m, int n, int k) {
  struct rf_gemm_fp8_desc d = {m, n, k, operand(a, ta), operand(b, tb), 0};
  float *c = rf_xmalloc((size_t)m * n * sizeof(float)), *c2 = rf_xmalloc((size_t)m * n * sizeof(float));
  float *work = rf_xmalloc((size_t)rf_gemm_fp8_work_elems(&d) * sizeof(float));
  rf_gemm_fp8_run(&d, c, work);
  int64_t prims = rf_gemm_stats().primitives;
  for (int64_t i = 0; i < (int64_t)m * n; i++) c2[i] = 1.0f;
  d.accumulate = 1;
  rf_gemm_fp8_run(&d, c2, work);
  RF_CHECK(rf_gemm_stats().primitives == prims, "%s: the second product created primitives", name);
  float *ref = ref_f32(name, (int64_t)m * n);
  double worst_ref = 0, worst_f64 = 0, worst_acc = 0;
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double exact = 0, abs = 0;
      for (int kk = 0; kk < k; kk++) {
        double t = dq_at(a, ta, i, kk) * dq_at(b, tb, kk, j);
        exact += t;
        abs += fabs(t);
      }
      double tol = 160.0 * 0x1p-24 * abs + 1e-37, got = c[(size_t)i * n + j];
      worst_ref = rf_test_max(worst_ref, fabs(got - ref[(size_t)i * n + j]) / tol);
      worst_f64 = rf_test_max(worst_f64, fabs(got - exact) / tol);
      worst_acc = rf_test_max(worst_acc, fabs(c2[(size_t)i * n + j] - (1.0 + got)) / (tol + 0x1p-23));
    }
  RF_CHECK(worst_ref <= 1.0, "%s: against torch, %.3g of the tolerance", name, worst_ref);
  RF_CHECK(worst_f64 <= 1.0, "%s: against f64 over dequantized operands, %.3g of the tolerance", name,
           worst_f64);
  RF_CHECK(worst_acc <= 1.0, "%s: accumulated into C, %.3g of the tolerance", name, worst_acc);
  free(c);
  free(c2);
  free(work);
  free(ref);
}

static void test_linear(void) {
  float *x = make_input(1, M, K, 8, 64, 9, 4), *w = make_input(2, N, K, 32, 40, 7, 3);
  float *dy = make_input(3, M, N, 8, 48, 5, 6);
  struct quant xq = quant_make(x, M, K, 1, T, 0, "x"), wq = quant_make(w, N, K, T, T, 0, "w");
  struct quant dyq = quant_make(dy, M, N, 1, T, 0, "dy"), xt = quant_make(x, M, K, T, 1, 0, "x");
  struct quant dyt = quant_make(dy, M, N, T, 1, 0, "dy"), wp = quant_make(w, N, K, T, T, 1, "w");
  check_against_ref(&xq, "x.1x128.codes", "x.1x128.scales");
  check_against_ref(&wq, "w.128x128.codes", "w.128x128.scales");
  check_against_ref(&dyq, "dy.1x128.codes", "dy.1x128.scales");
  check_against_ref(&xt, "x.128x1.codes", "x.128x1.scales");
  check_against_ref(&dyt, "dy.128x1.codes", "dy.128x1.scales");
  check_against_ref(&wp, "w.128x128.pow2.codes", "w.128x128.pow2.scales");
  /* dequantized = torch's value of the code times its tile's scale, bit for bit */
  const char *tv = ref_get("code_values", 0, 256);
  int64_t bad = 0;
  for (int r = 0; r < N; r++)
    for (int c = 0; c < K; c++) {
      float v;
      memcpy(&v, tv + 4 * wq.codes[(size_t)r * K + c], 4);
      float want = v * wq.scales[(r / T) * rf_fp8_grid_tile_cols(&wq.g) + c / T];
      bad += !same_bits(want, wq.dq[(size_t)r * K + c]);
    }
  RF_CHECK(bad == 0, "w: %lld dequantized values differ", (long long)bad);
  test_ranges(w, N, K, T, &wq);
  test_ranges(x, M, K, 1, &xq);
  check_product("y", &xq, 0, &wq, 1, M, N, K);   /* Y = X W^T */
  check_product("dx", &dyq, 0, &wq, 0, M, K, N); /* dX = dY W */
  check_product("dw", &dyt, 1, &xt, 0, N, K, M); /* dW = dY^T X */
  struct quant *all[] = {&xq, &wq, &dyq, &xt, &dyt, &wp};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) quant_free(all[i]);
  free(x);
  free(w);
  free(dy);
}

int main(void) {
  if (ref_load() != 0) RF_DIE("%s", rf_error_msg());
  test_code_values();
  test_scale_rule();
  test_edge();
  test_refused();
  test_linear();
  free(blob);
  return rf_test_finish("test_fp8");
}
