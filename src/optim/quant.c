/* src/optim: the 8-bit dynamic quantization maps of bitsandbytes and the
 * block quantizer (8-bit AdamW's codes). */
#include <math.h>
#include <stdlib.h>

#include "optim/optim.h"

/* ---- dynamic maps ---------------------------------------------------------- */

static float rf_optim_map_signed[256], rf_optim_map_unsigned[256];
static int rf_optim_maps_ready;

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

static void rf_optim_maps_init(void) {
  if (rf_optim_maps_ready) return;
  rf_optim_map_build(rf_optim_map_signed, 1);
  rf_optim_map_build(rf_optim_map_unsigned, 0);
  rf_optim_maps_ready = 1;
}

const float *rf_optim_qmap(int is_signed) {
  rf_optim_maps_init();
  return is_signed ? rf_optim_map_signed : rf_optim_map_unsigned;
}

/* The nearest map value (binary search; a tie goes to the lower code). */
static inline uint8_t rf_optim_quantize_with(const float *map, float x) {
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

uint8_t rf_optim_quantize(int is_signed, float x) {
  return rf_optim_quantize_with(rf_optim_qmap(is_signed), x);
}

void rf_optim_quantize_block(int is_signed, const float *x, int64_t n, uint8_t *codes, float *absmax) {
  const float *map = rf_optim_qmap(is_signed);
  float a = 0.0f;
  for (int64_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
  *absmax = a;
  float inv = a > 0.0f ? 1.0f / a : 0.0f;
  for (int64_t i = 0; i < n; i++) codes[i] = rf_optim_quantize_with(map, x[i] * inv);
}

void rf_optim_dequantize_block(int is_signed, const uint8_t *codes, int64_t n, float absmax, float *x) {
  const float *map = rf_optim_qmap(is_signed);
  for (int64_t i = 0; i < n; i++) x[i] = map[codes[i]] * absmax;
}
