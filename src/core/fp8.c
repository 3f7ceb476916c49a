/* FP8 e4m3 block quantization: one f32 scale per tile (DeepSeek-V3's recipe). The
 * AVX-512 kernels (built when the compiler targets AVX-512 F, BW and VL: -march=native
 * on such a machine, not under ARCH=-march=x86-64-v3) sit beside the portable ones and
 * give the same codes, bf16 bits and scales bit for bit (rf_fp8_simd_set chooses). */
#include <float.h>
#include <math.h>

#include "core/core.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RF_FP8_AVX512 1
#include <immintrin.h>
#else
#define RF_FP8_AVX512 0
#endif

static int fp8_simd_on = RF_FP8_AVX512;

int rf_fp8_simd_set(int on) {
  int was = fp8_simd_on;
  fp8_simd_on = RF_FP8_AVX512 && on;
  return was;
}

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

/* Where quantized elements go: their e4m3 codes, or (bf16 non-NULL) the codes' bf16
 * bits through `table` (fp8_bf16_bits of every code). */
struct fp8_out {
  uint8_t *codes;
  uint16_t *bf16;
  uint16_t table[256];
};

static void fp8_out_init(struct fp8_out *o, uint8_t *codes, uint16_t *bf16) {
  o->codes = codes;
  o->bf16 = bf16;
  for (int b = 0; b < 256; b++) o->table[b] = fp8_bf16_bits((uint8_t)b);
}

#if RF_FP8_AVX512
/* e4m3(y) of 16 floats as the f32 bits of the code's value (exact in f32, and in bf16:
 * its top 16 bits), rf_fp8e4m3_from_f32's rounding in the value domain: normal results
 * rounded to 3 mantissa bits on the bits (to nearest even; a carry moves the exponent),
 * saturated at 448 (infinities too); below 2^-6 rounded to a multiple of 2^-9 by adding
 * and subtracting 2^14 (whose ulp is 2^-9); NaN gives a quiet NaN; the sign kept. */
static inline __m512i fp8_round16(__m512 y) {
  const __m512i abs = _mm512_set1_epi32(0x7fffffff);
  __m512i u = _mm512_castps_si512(y), mag = _mm512_and_si512(u, abs);
  __m512i half = _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                                  _mm512_and_si512(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(1)));
  __m512i r = _mm512_and_si512(_mm512_add_epi32(mag, half), _mm512_set1_epi32((int)0xfff00000u));
  r = _mm512_min_epu32(r, _mm512_set1_epi32(0x43e00000)); /* 448 */
  __m512 t = _mm512_sub_ps(_mm512_add_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p14f)),
                           _mm512_set1_ps(0x1p14f));
  r = _mm512_mask_mov_epi32(r, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x3c800000)),
                            _mm512_castps_si512(t));
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000)),
                            _mm512_set1_epi32(0x7fc00000));
  return _mm512_or_si512(r, _mm512_andnot_si512(abs, u));
}

/* The e4m3 codes (32-bit lanes) of 16 values from fp8_round16: normal values' exponent
 * rebiased (127 -> 7) above their 3 mantissa bits, values below 2^-6 as multiples m of
 * 2^-9 (code m), NaN 0x7f, and the sign. */
static inline __m512i fp8_code16(__m512i v) {
  __m512i mag = _mm512_and_si512(v, _mm512_set1_epi32(0x7fffffff));
  __m512i c = _mm512_sub_epi32(_mm512_srli_epi32(mag, 20), _mm512_set1_epi32(120 << 3));
  __m512i m = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p9f)));
  c = _mm512_mask_mov_epi32(c, _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x3c800000)), m);
  c = _mm512_mask_mov_epi32(c, _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000)),
                            _mm512_set1_epi32(0x7f));
  return _mm512_or_si512(c, _mm512_and_si512(_mm512_srli_epi32(v, 24), _mm512_set1_epi32(0x80)));
}

/* The table's first 128 entries in 4 registers (entry c | 0x80 is entry c with the
 * sign bit: fp8_bf16_bits ORs the sign in). */
struct fp8_table128 {
  __m512i t[4];
};

static inline struct fp8_table128 fp8_table128_load(const uint16_t *table) {
  struct fp8_table128 t;
  for (int i = 0; i < 4; i++) t.t[i] = _mm512_loadu_si512((const void *)(table + 32 * i));
  return t;
}

/* The bf16 bits of 32 codes (16-bit lanes): two 64-entry permutes, a blend on bit 6,
 * the sign. */
static inline __m512i fp8_bf16_32(const struct fp8_table128 *t, __m512i c) {
  __m512i lo = _mm512_permutex2var_epi16(t->t[0], c, t->t[1]);
  __m512i hi = _mm512_permutex2var_epi16(t->t[2], c, t->t[3]);
  __m512i m = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), lo, hi);
  return _mm512_or_si512(m, _mm512_slli_epi16(_mm512_and_si512(c, _mm512_set1_epi16(0x80)), 8));
}

static inline __mmask16 fp8_mask16(int64_t left) {
  return left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
}

/* out[at + i] = e4m3(x[i] / s[per_elem ? i : 0]), i < n: 16 at a time. */
static void fp8_encode_avx512(const struct fp8_out *o, int64_t at, const float *x, int64_t n, const float *s,
                              int per_elem) {
  const __m512 s1 = _mm512_set1_ps(s[0]);
  uint8_t *codes = o->codes ? o->codes + at : NULL;
  uint16_t *bf16 = o->bf16 ? o->bf16 + at : NULL;
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = fp8_mask16(n - i);
    __m512 d = per_elem ? _mm512_maskz_loadu_ps(k, s + i) : s1;
    __m512i v = fp8_round16(_mm512_maskz_div_ps(k, _mm512_maskz_loadu_ps(k, x + i), d));
    if (bf16)
      _mm256_mask_storeu_epi16(bf16 + i, k, _mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16)));
    else
      _mm_mask_storeu_epi8(codes + i, k, _mm512_cvtepi32_epi8(fp8_code16(v)));
  }
}

/* The largest magnitude's bits over x[0, n) (NaN and infinities above 0x7f7fffff). */
static uint32_t fp8_amax_bits_avx512(const float *x, int64_t n) {
  const __m512i abs = _mm512_set1_epi32(0x7fffffff);
  __m512i m = _mm512_setzero_si512();
  for (int64_t i = 0; i < n; i += 16)
    m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_maskz_loadu_epi32(fp8_mask16(n - i), x + i), abs));
  return _mm512_reduce_max_epu32(m);
}

/* band[c] = max(band[c], |x[c]|), c < n, on the bits (a NaN or an infinity stays above
 * FLT_MAX). */
static void fp8_amax_cols_avx512(float *band, const float *x, int64_t n) {
  const __m512i abs = _mm512_set1_epi32(0x7fffffff);
  for (int64_t c = 0; c < n; c += 16) {
    __mmask16 k = fp8_mask16(n - c);
    __m512i b = _mm512_maskz_loadu_epi32(k, band + c);
    b = _mm512_max_epu32(b, _mm512_and_si512(_mm512_maskz_loadu_epi32(k, x + c), abs));
    _mm512_mask_storeu_epi32(band + c, k, b);
  }
}
#endif

/* out[at + i] = e4m3(x[i] / s[per_elem ? i : 0]), i < n. */
static void fp8_encode(const struct fp8_out *o, int64_t at, const float *x, int64_t n, const float *s,
                       int per_elem) {
#if RF_FP8_AVX512
  if (fp8_simd_on) {
    fp8_encode_avx512(o, at, x, n, s, per_elem);
    return;
  }
#endif
  uint8_t *codes = o->codes ? o->codes + at : NULL;
  uint16_t *bf16 = o->bf16 ? o->bf16 + at : NULL;
  const float s1 = s[0];
  if (bf16 && per_elem)
    for (int64_t i = 0; i < n; i++) bf16[i] = o->table[rf_fp8e4m3_from_f32(x[i] / s[i])];
  else if (bf16)
    for (int64_t i = 0; i < n; i++) bf16[i] = o->table[rf_fp8e4m3_from_f32(x[i] / s1)];
  else if (per_elem)
    for (int64_t i = 0; i < n; i++) codes[i] = rf_fp8e4m3_from_f32(x[i] / s[i]);
  else
    for (int64_t i = 0; i < n; i++) codes[i] = rf_fp8e4m3_from_f32(x[i] / s1);
}

void rf_fp8e4m3_from_f32_n(uint8_t *dst, const float *src, size_t n) {
  struct fp8_out o;
  fp8_out_init(&o, dst, NULL);
  const float one = 1.0f; /* x / 1 is x (a NaN stays a NaN of its sign) */
  fp8_encode(&o, 0, src, (int64_t)n, &one, 0);
}

void rf_fp8_codes_to_bf16(uint16_t *dst, const uint8_t *codes, size_t n) {
  struct fp8_out o;
  fp8_out_init(&o, NULL, dst);
#if RF_FP8_AVX512
  if (fp8_simd_on) {
    struct fp8_table128 t = fp8_table128_load(o.table);
    for (size_t i = 0; i < n; i += 32) {
      __mmask32 k = n - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (n - i)) - 1u);
      __m512i c = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(k, codes + i));
      _mm512_mask_storeu_epi16(dst + i, k, fp8_bf16_32(&t, c));
    }
    return;
  }
#endif
  for (size_t i = 0; i < n; i++) dst[i] = o.table[codes[i]];
}

static int fp8_check_grid(const struct rf_fp8_grid *g) {
  RF_REQUIRE(g->rows >= 0 && g->cols >= 0 && g->tile_rows >= 1 && g->tile_cols >= 1,
             "fp8: bad grid (%lld x %lld in tiles of %d x %d)", (long long)g->rows, (long long)g->cols,
             g->tile_rows, g->tile_cols);
  return 0;
}

/* The largest |x[i]|, i < n; *finite cleared when x holds NaN or an infinity. */
static float fp8_amax(const float *x, int64_t n, int *finite) {
#if RF_FP8_AVX512
  if (fp8_simd_on) {
    uint32_t b = fp8_amax_bits_avx512(x, n);
    float a;
    memcpy(&a, &b, sizeof a);
    *finite &= b <= 0x7f7fffffu;
    return a;
  }
#endif
  float a = 0.0f;
  int ok = 1;
  for (int64_t i = 0; i < n; i++) {
    float m = fabsf(x[i]);
    ok &= m <= FLT_MAX;
    a = m > a ? m : a;
  }
  *finite &= ok;
  return a;
}

/* band[c] = the largest of band[c] and |x[c]|, c < n; *finite cleared when x holds NaN or
 * an infinity (or band[c] is then above FLT_MAX, or NaN). */
static void fp8_amax_cols(float *band, const float *x, int64_t n, int *finite) {
#if RF_FP8_AVX512
  if (fp8_simd_on) {
    fp8_amax_cols_avx512(band, x, n);
    return;
  }
#endif
  int ok = 1;
  for (int64_t c = 0; c < n; c++) {
    float m = fabsf(x[c]);
    ok &= m <= FLT_MAX;
    band[c] = m > band[c] ? m : band[c];
  }
  *finite &= ok;
}

/* Fails naming the first NaN or infinity of rows [r0, r1) x columns [c0, c1). */
static int fp8_refuse(const float *x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                      const char *name) {
  for (int64_t r = r0; r < r1; r++)
    for (int64_t c = c0; c < c1; c++) {
      float v = x[r * cols + c];
      if (!isfinite(v))
        RF_FAIL("fp8: tensor '%s' holds %s at [%lld, %lld]: it cannot be quantized", name,
                isnan(v) ? "NaN" : "an infinity", (long long)r, (long long)c);
    }
  return 0;
}

/* fp8_quantize for tiles one column wide (128x1: the weight gradient's operands): a
 * band of rows at a time, every column's amax accumulated row by row in the band's
 * scales, so the loops run along rows (contiguous) instead of down columns. */
static int fp8_quantize_columns(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name,
                                const struct fp8_out *o, float *scales) {
  int64_t cols = g->cols;
  for (int64_t r0 = 0; r0 < g->rows; r0 += g->tile_rows) {
    int64_t r1 = r0 + g->tile_rows < g->rows ? r0 + g->tile_rows : g->rows;
    float *band = scales + (r0 / g->tile_rows) * cols;
    int finite = 1;
    for (int64_t c = 0; c < cols; c++) band[c] = 0.0f;
    for (int64_t r = r0; r < r1; r++) fp8_amax_cols(band, x + r * cols, cols, &finite);
    for (int64_t c = 0; c < cols; c++) finite &= band[c] <= FLT_MAX;
    if (!finite) RF_TRY(fp8_refuse(x, cols, r0, r1, 0, cols, name));
    for (int64_t c = 0; c < cols; c++) band[c] = rf_fp8_scale(band[c], pow2);
    for (int64_t r = r0; r < r1; r++) fp8_encode(o, r * cols, x + r * cols, cols, band, 1);
  }
  return 0;
}

static int fp8_quantize(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name,
                        const struct fp8_out *o, float *scales) {
  RF_TRY(fp8_check_grid(g));
  if (g->tile_cols == 1) return fp8_quantize_columns(g, x, pow2, name, o, scales);
  int64_t tc = rf_fp8_grid_tile_cols(g), cols = g->cols;
  for (int64_t r0 = 0; r0 < g->rows; r0 += g->tile_rows) {
    int64_t r1 = r0 + g->tile_rows < g->rows ? r0 + g->tile_rows : g->rows;
    float *band = scales + (r0 / g->tile_rows) * tc;
    for (int64_t j = 0; j < tc; j++) {
      int64_t c0 = j * g->tile_cols, c1 = c0 + g->tile_cols < cols ? c0 + g->tile_cols : cols;
      float amax = 0.0f;
      int finite = 1;
      for (int64_t r = r0; r < r1; r++) {
        float a = fp8_amax(x + r * cols + c0, c1 - c0, &finite);
        amax = a > amax ? a : amax;
      }
      if (!finite) RF_TRY(fp8_refuse(x, cols, r0, r1, c0, c1, name));
      float s = rf_fp8_scale(amax, pow2);
      band[j] = s;
      for (int64_t r = r0; r < r1; r++) fp8_encode(o, r * cols + c0, x + r * cols + c0, c1 - c0, &s, 0);
    }
  }
  return 0;
}

int rf_fp8_quantize(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name, uint8_t *codes,
                    float *scales) {
  struct fp8_out o;
  fp8_out_init(&o, codes, NULL);
  return fp8_quantize(g, x, pow2, name, &o, scales);
}

int rf_fp8_quantize_bf16(const struct rf_fp8_grid *g, const float *x, int pow2, const char *name,
                         uint16_t *codes_bf16, float *scales) {
  struct fp8_out o;
  fp8_out_init(&o, NULL, codes_bf16);
  return fp8_quantize(g, x, pow2, name, &o, scales);
}

void rf_fp8_dequantize(const struct rf_fp8_grid *g, const uint8_t *codes, const float *scales, float *x) {
  int64_t tc = rf_fp8_grid_tile_cols(g);
  for (int64_t r = 0; r < g->rows; r++) {
    const float *band = scales + (r / g->tile_rows) * tc;
    for (int64_t c = 0; c < g->cols; c++)
      x[r * g->cols + c] = rf_f32_from_bf16(fp8_bf16_bits(codes[r * g->cols + c])) * band[c / g->tile_cols];
  }
}
