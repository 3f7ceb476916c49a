/* FP8 e4m3 block quantization: one f32 scale per tile (DeepSeek-V3's recipe). */
#include <float.h>
#include <math.h>

#include "core/core.h"

int64_t rf_fp8_grid_tile_rows(const struct rf_fp8_grid *g) {
  return (g->rows + g->tile_rows - 1) / g->tile_rows;
}

int64_t rf_fp8_grid_tile_cols(const struct rf_fp8_grid *g) {
  return (g->cols + g->tile_cols - 1) / g->tile_cols;
}

int64_t rf_fp8_grid_tiles(const struct rf_fp8_grid *g) {
  return rf_fp8_grid_tile_rows(g) * rf_fp8_grid_tile_cols(g);
}

float rf_fp8_scale(float amax, int pow2) {
  if (amax == 0.0f) return 1.0f;
  float s = amax / RF_FP8_E4M3_MAX;
  if (s == 0.0f) s = FLT_TRUE_MIN;
  if (!pow2) return s;
  /* the smallest power of two >= s, then doubled while 448 p < amax (s may have been
   * rounded down onto a power of two; rounded up, s = 2^k and 2^(k-1) < amax / 448) */
  int e;
  float f = frexpf(s, &e);
  float p = f == 0.5f ? s : ldexpf(1.0f, e);
  while (p * RF_FP8_E4M3_MAX < amax) p *= 2.0f;
  return p;
}

/* The bf16 bits of an e4m3 code: normal codes move their exponent (bias 7 -> 127) and
 * mantissa (3 -> 7 bits); subnormal codes m * 2^-9 are normalized; NaN stays NaN. */
static uint16_t fp8_bf16_bits(uint8_t b) {
  uint16_t sign = (uint16_t)((b & 0x80u) << 8);
  uint32_t e = (b >> 3) & 0xfu, m = b & 0x7u;
  if (e == 15 && m == 7) return (uint16_t)(sign | 0x7fc0u);
  if (e != 0) return (uint16_t)(sign | ((e + 120u) << 7) | (m << 4));
  if (m == 0) return sign;
  uint32_t p = m >= 4 ? 2u : m >= 2 ? 1u : 0u; /* m = 2^p + rest */
  return (uint16_t)(sign | ((p + 118u) << 7) | ((m - (1u << p)) << (7u - p)));
}

void rf_fp8_codes_to_bf16(uint16_t *dst, const uint8_t *codes, size_t n) {
  uint16_t table[256];
  for (int b = 0; b < 256; b++) table[b] = fp8_bf16_bits((uint8_t)b);
  for (size_t i = 0; i < n; i++) dst[i] = table[codes[i]];
}

static int fp8_check_grid(const struct rf_fp8_grid *g) {
  RF_REQUIRE(g->rows >= 0 && g->cols >= 0 && g->tile_rows >= 1 && g->tile_cols >= 1,
             "fp8: bad grid (%lld x %lld in tiles of %d x %d)", (long long)g->rows, (long long)g->cols,
             g->tile_rows, g->tile_cols);
  return 0;
}

/* rf_fp8_quantize for tiles one column wide (128x1: the weight gradient's operands):
 * a band of rows at a time, every column's amax accumulated row by row in the band's
 * scales, so the loops run along rows (contiguous) instead of down columns. */
static int fp8_quantize_columns(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name,
                                uint8_t *codes, float *scales) {
  int64_t cols = g->cols;
  for (int64_t r0 = 0; r0 < g->rows; r0 += g->tile_rows) {
    int64_t r1 = r0 + g->tile_rows < g->rows ? r0 + g->tile_rows : g->rows;
    float *band = scales + (r0 / g->tile_rows) * cols;
    int finite = 1;
    for (int64_t c = 0; c < cols; c++) band[c] = 0.0f;
    for (int64_t r = r0; r < r1; r++)
      for (int64_t c = 0; c < cols; c++) {
        float m = fabsf(x[r * cols + c]);
        finite &= m <= FLT_MAX;
        band[c] = m > band[c] ? m : band[c];
      }
    for (int64_t c = 0; c < cols && !finite; c++)
      for (int64_t r = r0; r < r1; r++) {
        float v = x[r * cols + c];
        if (!isfinite(v))
          RF_FAIL("fp8: tensor '%s' holds %s at [%lld, %lld]: it cannot be quantized", name,
                  isnan(v) ? "NaN" : "an infinity", (long long)r, (long long)c);
      }
    for (int64_t c = 0; c < cols; c++) band[c] = rf_fp8_scale(band[c], pow2);
    for (int64_t r = r0; r < r1; r++) {
      const float *xr = x + r * cols;
      uint8_t *cr = codes + r * cols;
      for (int64_t c = 0; c < cols; c++) cr[c] = rf_fp8e4m3_from_f32(xr[c] / band[c]);
    }
  }
  return 0;
}

int rf_fp8_quantize(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name, uint8_t *codes,
                    float *scales) {
  RF_TRY(fp8_check_grid(g));
  if (g->tile_cols == 1) return fp8_quantize_columns(g, x, pow2, name, codes, scales);
  int64_t tc = rf_fp8_grid_tile_cols(g), cols = g->cols;
  for (int64_t r0 = 0; r0 < g->rows; r0 += g->tile_rows) {
    int64_t r1 = r0 + g->tile_rows < g->rows ? r0 + g->tile_rows : g->rows;
    float *band = scales + (r0 / g->tile_rows) * tc;
    for (int64_t j = 0; j < tc; j++) {
      int64_t c0 = j * g->tile_cols, c1 = c0 + g->tile_cols < cols ? c0 + g->tile_cols : cols;
      float amax = 0.0f;
      int finite = 1;
      for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) {
          float m = fabsf(x[r * cols + c]);
          finite &= m <= FLT_MAX;
          amax = m > amax ? m : amax;
        }
      for (int64_t r = r0; r < r1 && !finite; r++)
        for (int64_t c = c0; c < c1; c++) {
          float v = x[r * cols + c];
          if (!isfinite(v))
            RF_FAIL("fp8: tensor '%s' holds %s at [%lld, %lld]: it cannot be quantized", name,
                    isnan(v) ? "NaN" : "an infinity", (long long)r, (long long)c);
        }
      float s = rf_fp8_scale(amax, pow2);
      band[j] = s;
      for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * cols;
        uint8_t *cr = codes + r * cols;
        for (int64_t c = c0; c < c1; c++) cr[c] = rf_fp8e4m3_from_f32(xr[c] / s);
      }
    }
  }
  return 0;
}

void rf_fp8_dequantize(const struct rf_fp8_grid *g, const uint8_t *codes, const float *scales, float *x) {
  int64_t tc = rf_fp8_grid_tile_cols(g);
  for (int64_t r = 0; r < g->rows; r++) {
    const float *band = scales + (r / g->tile_rows) * tc;
    for (int64_t c = 0; c < g->cols; c++)
      x[r * g->cols + c] = rf_f32_from_bf16(fp8_bf16_bits(codes[r * g->cols + c])) * band[c / g->tile_cols];
  }
}
