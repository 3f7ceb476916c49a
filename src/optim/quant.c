/* src/optim: the 8-bit dynamic quantization maps of bitsandbytes and the
 * block quantizer (8-bit AdamW's codes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"
#include "optim/simd.h"

/* ---- dynamic maps ---------------------------------------------------------- */

/* torch.linspace(0.1, 1, n) in f32 (the kernel's two halves). */
static float rf_optim_linspace(int j, int n) {
  float step = (1.0f - 0.1f) / (float)(n - 1);
  return j < n / 2 ? 0.1f + step * (float)j : 1.0f - step * (float)(n - 1 - j);
}

static int rf_optim_cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* bitsandbytes.functional.create_dynamic_map(signed, max_exponent_bits=7,
 * total_bits=8): for exponent i = 0..6, 2^i (signed) or 2^(i+1) (unsigned)
 * fraction steps, the midpoints of linspace(0.1, 1) scaled by 10^(i-6); plus 0
 * and 1; sorted. */
static void rf_optim_map_build(float *map, int is_signed) {
  int k = 0;
  for (int i = 0; i < 7; i++) {
    int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
    float scale = (float)pow(10.0, (double)(i - 6));
    for (int j = 0; j + 1 < items; j++) {
      float mean = (rf_optim_linspace(j, items) + rf_optim_linspace(j + 1, items)) / 2.0f;
      map[k++] = scale * mean;
      if (is_signed) map[k++] = -(scale * mean);
    }
  }
  map[k++] = 0.0f;
  map[k++] = 1.0f;
  RF_ASSERT(k == 256);
  qsort(map, 256, sizeof(float), rf_optim_cmp_float);
  for (int i = 0; i < 255; i++) RF_ASSERT(map[i] < map[i + 1]);
}

/* ---- the nearest code --------------------------------------------------------
 *
 * The reference: a binary search for the largest code c with map[c] <= x, then
 * c + 1 when map[c+1] - x < x - map[c] in f32 (a tie goes to the lower code; x
 * below the map or NaN: 0). The search's code is monotone in x.
 *
 * The fast path is one table load: the float's sign and the top 16 bits of its
 * magnitude (8 exponent bits, 7 mantissa bits) index a bucket (magnitudes below
 * 2^-30 share the first, 2 and above the last). Inside a bucket the order of x is
 * the order of its low 16 bits (reversed for negative x), and the search's code
 * changes at most once (checked when the table is built), so an entry holds the
 * code below that change (bits 16-23), the code from it on (bits 24-31) and the
 * low 16 bits where it happens (bits 0-15). Identical to the search for every
 * float (tests/test_optim_quant.c). */

/* RF_OPTIM_QKEY_LO, RF_OPTIM_QBUCKETS: simd.h */

struct rf_optim_qtable {
  float map[256];
  _Alignas(64) uint8_t planes[4 * 256];  /* byte j of map[c] at [256 j + c] (rf_optim_qmap_planes) */
  uint32_t entry[2 * RF_OPTIM_QBUCKETS]; /* [sign][bucket]: change | below << 16 | from << 24 */
};

static struct rf_optim_qtable rf_optim_qtables[2]; /* [is_signed] */
static int rf_optim_qtables_ready;

static uint8_t rf_optim_quantize_map(const float *map, float x) {
  int lo = 0, hi = 255; /* largest c with map[c] <= x, or 0 */
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (map[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo < 255 && map[lo] <= x && map[lo + 1] - x < x - map[lo]) lo++;
  return (uint8_t)lo;
}

static float rf_optim_f32_of(uint32_t bits) {
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

static uint32_t rf_optim_bits_of(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

/* The entry of bucket `top` (the top 16 bits, sign included): the code changes
 * at most once over its 2^16 floats. */
static uint32_t rf_optim_qentry(const float *map, uint32_t top) {
  uint8_t below = rf_optim_quantize_map(map, rf_optim_f32_of(top << 16));
  uint8_t from = rf_optim_quantize_map(map, rf_optim_f32_of(top << 16 | 0xffffu));
  uint32_t lo = 0, hi = 0xffffu; /* the first low half with the upper code */
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (rf_optim_quantize_map(map, rf_optim_f32_of(top << 16 | mid)) == below)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (below == from) lo = 0;
  RF_ASSERT(rf_optim_quantize_map(map, rf_optim_f32_of(top << 16 | lo)) == from);
  return lo | (uint32_t)below << 16 | (uint32_t)from << 24;
}

/* A clamped bucket: the floats from `first` to `last` (bits, one sign) share one code. */
static uint32_t rf_optim_qentry_clamped(const float *map, uint32_t first, uint32_t last) {
  uint8_t c = rf_optim_quantize_map(map, rf_optim_f32_of(first));
  RF_ASSERT(rf_optim_quantize_map(map, rf_optim_f32_of(last)) == c); /* monotone: all between too */
  return (uint32_t)c << 16 | (uint32_t)c << 24;
}

static void rf_optim_qtable_build(struct rf_optim_qtable *t, int is_signed) {
  rf_optim_map_build(t->map, is_signed);
  for (int c = 0; c < 256; c++) {
    uint32_t b = rf_optim_bits_of(t->map[c]);
    for (int j = 0; j < 4; j++) t->planes[256 * j + c] = (uint8_t)(b >> (8 * j));
  }
  for (uint32_t sign = 0; sign < 2; sign++) {
    uint32_t *e = t->entry + sign * RF_OPTIM_QBUCKETS, s = sign << 31;
    e[0] = rf_optim_qentry_clamped(t->map, s, s | ((((uint32_t)RF_OPTIM_QKEY_LO + 1) << 16) - 1));
    for (uint32_t i = 1; i + 1 < RF_OPTIM_QBUCKETS; i++)
      e[i] = rf_optim_qentry(t->map, sign << 15 | (RF_OPTIM_QKEY_LO + i));
    e[RF_OPTIM_QBUCKETS - 1] = rf_optim_qentry_clamped(t->map, s | (128u << 23), s | 0x7f800000u);
  }
}

static void rf_optim_maps_init(void) {
  if (rf_optim_qtables_ready) return;
  rf_optim_qtable_build(&rf_optim_qtables[0], 0);
  rf_optim_qtable_build(&rf_optim_qtables[1], 1);
  rf_optim_qtables_ready = 1;
}

const float *rf_optim_qmap(int is_signed) {
  rf_optim_maps_init();
  return rf_optim_qtables[is_signed != 0].map;
}

const uint32_t *rf_optim_qentries(int is_signed) {
  rf_optim_maps_init();
  return rf_optim_qtables[is_signed != 0].entry;
}

const uint8_t *rf_optim_qmap_planes(int is_signed) {
  rf_optim_maps_init();
  return rf_optim_qtables[is_signed != 0].planes;
}

static inline uint8_t rf_optim_quantize_fast(const struct rf_optim_qtable *t, float x) {
  uint32_t b = rf_optim_bits_of(x);
  int32_t k = (int32_t)((b & 0x7fffffffu) >> 16) - RF_OPTIM_QKEY_LO;
  k = k > 0 ? k : 0;
  k = k < RF_OPTIM_QBUCKETS - 1 ? k : RF_OPTIM_QBUCKETS - 1;
  uint32_t e = t->entry[(int32_t)(b >> 31) * RF_OPTIM_QBUCKETS + k];
  uint32_t c = (b & 0xffffu) >= (e & 0xffffu) ? e >> 24 : (e >> 16) & 0xffu;
  return (uint8_t)(c * (x == x)); /* NaN: 0, as the search */
}

uint8_t rf_optim_quantize(int is_signed, float x) {
  rf_optim_maps_init();
  return rf_optim_quantize_fast(&rf_optim_qtables[is_signed != 0], x);
}

uint8_t rf_optim_quantize_search(int is_signed, float x) {
  return rf_optim_quantize_map(rf_optim_qmap(is_signed), x);
}

#if RF_OPTIM_AVX512
static void rf_optim_quantize_scaled_avx512(const struct rf_optim_qtable *t, const float *x, int64_t n,
                                            float scale, uint8_t *codes) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = rf_optim_mask16(n - i);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), s);
    _mm_mask_storeu_epi8(codes + i, k, _mm512_cvtepi32_epi8(rf_optim_quantize16(t->entry, v)));
  }
}
#endif

static int rf_optim_simd_on = RF_OPTIM_AVX512;

int rf_optim_simd_set(int on) {
  int was = rf_optim_simd_on;
  rf_optim_simd_on = RF_OPTIM_AVX512 && on;
  return was;
}

int rf_optim_simd_get(void) { return rf_optim_simd_on; }

void rf_optim_quantize_scaled(int is_signed, const float *x, int64_t n, float scale, uint8_t *codes) {
  rf_optim_maps_init();
  const struct rf_optim_qtable *t = &rf_optim_qtables[is_signed != 0];
#if RF_OPTIM_AVX512
  if (rf_optim_simd_on) {
    rf_optim_quantize_scaled_avx512(t, x, n, scale, codes);
    return;
  }
#endif
#pragma omp simd simdlen(16)
  for (int64_t i = 0; i < n; i++) codes[i] = rf_optim_quantize_fast(t, x[i] * scale);
}

void rf_optim_quantize_block(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
  *absmax = a;
  rf_optim_quantize_scaled(is_signed, x, n, a > 0.0f ? 1.0f / a : 0.0f, codes);
}

void rf_optim_dequantize_block(int is_signed, const uint8_t *codes, int64_t n, float absmax, float *x) {
  const float *map = rf_optim_qmap(is_signed);
  for (int64_t i = 0; i < n; i++) x[i] = map[codes[i]] * absmax;
}
