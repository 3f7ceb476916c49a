/* src/optim: the 8-bit dynamic quantization maps of bitsandbytes and the
 * block quantizer (8-bit AdamW's codes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"

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
 * below the map or NaN: 0). Between two neighbouring map values the test is
 * monotone in x, so the code is the number of thresholds T[c] <= x, T[c] the
 * smallest float in (map[c], map[c+1]] that the search sends to c + 1.
 *
 * The fast path looks the code up directly: the float's sign and the top 16 bits
 * of its magnitude (8 exponent bits, 7 mantissa bits) index a bucket (magnitudes
 * below 2^-30 share the first, 2 and above the last); the bucket's interval of x
 * holds at most two thresholds (checked when the table is built), so the code is
 * the code at the interval's lower end plus two comparisons. Identical to the
 * search for every float (tests/test_optim_quant.c). */

#define RF_OPTIM_QKEY_LO (97 << 7)                            /* magnitude key of 2^-30 */
#define RF_OPTIM_QBUCKETS ((128 << 7) - RF_OPTIM_QKEY_LO + 1) /* up to 2, then the rest */

struct rf_optim_qtable {
  float map[256];
  float thr[257];                       /* T[0..254], then NaN, NaN (never <= x) */
  int32_t start[2 * RF_OPTIM_QBUCKETS]; /* [sign][bucket]: the code at the bucket's lower end */
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

/* Floats in increasing order as unsigned keys, and back. */
static uint32_t rf_optim_order_key(float x) {
  uint32_t b = rf_optim_bits_of(x);
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

static float rf_optim_order_f32(uint32_t k) {
  return rf_optim_f32_of((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

static void rf_optim_qtable_build(struct rf_optim_qtable *t, int is_signed) {
  rf_optim_map_build(t->map, is_signed);
  for (int c = 0; c < 255; c++) { /* the smallest x that the search sends above c */
    uint32_t lo = rf_optim_order_key(t->map[c]), hi = rf_optim_order_key(t->map[c + 1]);
    RF_ASSERT(rf_optim_quantize_map(t->map, t->map[c]) == c &&
              rf_optim_quantize_map(t->map, t->map[c + 1]) > c);
    while (hi - lo > 1) {
      uint32_t mid = lo + (hi - lo) / 2;
      if (rf_optim_quantize_map(t->map, rf_optim_order_f32(mid)) > c)
        hi = mid;
      else
        lo = mid;
    }
    t->thr[c] = rf_optim_order_f32(hi);
  }
  t->thr[255] = t->thr[256] = NAN; /* never <= x, not even +inf */
  for (int sign = 0; sign < 2; sign++)
    for (int i = 0; i < RF_OPTIM_QBUCKETS; i++) {
      uint32_t mlo = i == 0 ? 0 : (uint32_t)(RF_OPTIM_QKEY_LO + i) << 16;
      uint32_t mhi =
          i == RF_OPTIM_QBUCKETS - 1 ? 0x7f800000u : ((uint32_t)(RF_OPTIM_QKEY_LO + i + 1) << 16) - 1;
      float a = rf_optim_f32_of(sign ? mhi | 0x80000000u : mlo),
            b = rf_optim_f32_of(sign ? mlo | 0x80000000u : mhi);
      uint8_t ca = rf_optim_quantize_map(t->map, a), cb = rf_optim_quantize_map(t->map, b);
      RF_ASSERT(cb >= ca && cb - ca <= 2);
      t->start[sign * RF_OPTIM_QBUCKETS + i] = ca;
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

static inline uint8_t rf_optim_quantize_fast(const struct rf_optim_qtable *t, float x) {
  uint32_t b = rf_optim_bits_of(x);
  int32_t k = (int32_t)((b & 0x7fffffffu) >> 16) - RF_OPTIM_QKEY_LO;
  k = k > 0 ? k : 0;
  k = k < RF_OPTIM_QBUCKETS - 1 ? k : RF_OPTIM_QBUCKETS - 1;
  int32_t c = t->start[(int32_t)(b >> 31) * RF_OPTIM_QBUCKETS + k];
  c += (t->thr[c] <= x) + (t->thr[c + 1] <= x);
  return (uint8_t)(c * (x == x)); /* NaN: 0, as the search */
}

uint8_t rf_optim_quantize(int is_signed, float x) {
  rf_optim_maps_init();
  return rf_optim_quantize_fast(&rf_optim_qtables[is_signed != 0], x);
}

uint8_t rf_optim_quantize_search(int is_signed, float x) {
  return rf_optim_quantize_map(rf_optim_qmap(is_signed), x);
}

void rf_optim_quantize_scaled(int is_signed, const float *x, int64_t n, float scale, uint8_t *codes) {
  rf_optim_maps_init();
  const struct rf_optim_qtable *t = &rf_optim_qtables[is_signed != 0];
#pragma omp simd
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
