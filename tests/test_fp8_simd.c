/* rf-test: timeout=60
 * The AVX-512 kernels of src/core/fp8.c against the portable ones, bit for bit (the
 * portable ones are checked against torch in test_fp8.c, the e4m3 encoder against a
 * brute-force definition in test_dtype.c):
 * - the encoder (rf_fp8e4m3_from_f32_n) on every f32 whose low 16 bits are one of 40
 *   patterns (0, 1, 0x8000, 0xffff, ... and random: every exponent, every rounding
 *   position, subnormals, +-0, infinities, NaN), and on every length 0..70 (tails);
 * - codes to bf16 on all 256 codes and every length 0..100;
 * - the quantizer (rf_fp8_quantize, and rf_fp8_quantize_bf16 whose bits must be
 *   rf_fp8_codes_to_bf16 of those codes) in 1x128, 128x128, 128x1 and odd tiles, whole
 *   and partial, amax / 448 and power-of-two scales, on random magnitudes per tile,
 *   f32 subnormals, zero tiles, -0, values on and next to e4m3 code boundaries and
 *   amax exactly 448; NaN and infinities refused by both with the same message.
 * Without AVX-512 (ARCH=-march=x86-64-v3) both sides are the portable kernels: the
 * bf16 output and the lengths are still checked. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"

static float f32_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static int same_floats(const float *a, const float *b, size_t n) { return memcmp(a, b, n * 4) == 0; }

static void test_encoder(void) {
  const size_t n = 65536;
  float *x = rf_xmalloc(n * sizeof(float));
  uint8_t *simd = rf_xmalloc(n), *port = rf_xmalloc(n);
  uint32_t lows[40] = {0, 1, 2, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
  uint64_t rng = 3;
  for (int i = 8; i < 40; i++) lows[i] = (uint32_t)(rf_test_rand_u64(&rng) & 0xffff);
  for (int l = 0; l < 40; l++) {
    for (size_t i = 0; i < n; i++) x[i] = f32_of((uint32_t)i << 16 | lows[l]);
    rf_fp8_simd_set(1);
    rf_fp8e4m3_from_f32_n(simd, x, n);
    rf_fp8_simd_set(0);
    rf_fp8e4m3_from_f32_n(port, x, n);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
      if (simd[i] != port[i] || port[i] != rf_fp8e4m3_from_f32(x[i])) {
        if (!bad) first = i;
        bad++;
      }
    RF_CHECK(bad == 0, "low bits %04x: %zu codes differ (first %08x: simd %02x, portable %02x, scalar %02x)",
             lows[l], bad, (unsigned)(first << 16 | lows[l]), simd[first], port[first],
             rf_fp8e4m3_from_f32(x[first]));
  }
  /* every length up to 70 (masked tails), nothing written past the end */
  for (size_t i = 0; i < 80; i++) x[i] = ldexpf((float)i - 40.5f, (int)(i % 11) - 8);
  for (size_t len = 0; len <= 70; len++) {
    memset(simd, 0xaa, 80);
    rf_fp8_simd_set(1);
    rf_fp8e4m3_from_f32_n(simd, x, len);
    int ok = 1;
    for (size_t i = 0; i < 80; i++) ok &= simd[i] == (i < len ? rf_fp8e4m3_from_f32(x[i]) : 0xaa);
    RF_CHECK(ok, "length %zu: codes or the bytes after them wrong", len);
  }
  free(x);
  free(simd);
  free(port);
}

static void test_widen(void) {
  uint8_t codes[256 + 100];
  uint16_t simd[256 + 100], port[256];
  for (int c = 0; c < 256 + 100; c++) codes[c] = (uint8_t)(c * 37 + 11);
  for (int c = 0; c < 256; c++) codes[c] = (uint8_t)c;
  rf_fp8_simd_set(1);
  rf_fp8_codes_to_bf16(simd, codes, 256);
  rf_fp8_simd_set(0);
  rf_fp8_codes_to_bf16(port, codes, 256);
  RF_CHECK(memcmp(simd, port, sizeof port) == 0, "codes to bf16: the 256 codes differ");
  for (int c = 0; c < 256; c++)
    if (!isnan(rf_f32_from_fp8e4m3((uint8_t)c)))
      RF_CHECK(rf_f32_from_bf16(port[c]) == rf_f32_from_fp8e4m3((uint8_t)c), "code %02x widened wrong", c);
  rf_fp8_simd_set(1);
  for (int len = 0; len <= 100; len++) {
    for (int i = 0; i < 110; i++) simd[i] = 0xbeef;
    rf_fp8_codes_to_bf16(simd, codes + 200, (size_t)len);
    int ok = 1;
    for (int i = 0; i < 110; i++) ok &= simd[i] == (i < len ? port[codes[200 + i]] : 0xbeef);
    RF_CHECK(ok, "codes to bf16, length %d: values or the elements after them wrong", len);
  }
}

/* Test data, kind k: 0 random magnitudes varying per tile, 1 f32 subnormals, 2 zeros and
 * -0 in some tiles, 3 e4m3 code values, their midpoints and neighbours, with 448 in
 * every row (amax 448 per 1x128 tile), 4 everything mixed with 3e38 and 1e-30. */
static void make_data(float *x, int rows, int cols, int kind, uint64_t *rng) {
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      float u = rf_test_rand_f32(rng), v;
      uint64_t pick = rf_test_rand_u64(rng);
      switch (kind) {
        case 0:
          v = ldexpf(u, (r / 3 + c / 40) % 30 - 15);
          break;
        case 1:
          v = u * FLT_MIN * 0.5f;
          break;
        case 2:
          v = (c / 50 + r / 50) % 2 ? (pick & 1 ? -0.0f : 0.0f) : u;
          break;
        case 3: {
          float a = rf_f32_from_fp8e4m3((uint8_t)(pick % 126)),
                b = rf_f32_from_fp8e4m3((uint8_t)(pick % 126 + 1));
          float mid = (a + b) / 2.0f;
          float vals[5] = {a, mid, nextafterf(mid, 0.0f), nextafterf(mid, INFINITY), 448.0f};
          v = vals[(pick >> 8) % 5] * ((pick >> 16) & 1 ? -1.0f : 1.0f);
          if (c == 0) v = 448.0f;
          break;
        }
        default: {
          float vals[6] = {u, 3e38f * u, 1e-30f * u, u * FLT_MIN, 0.0f, -0.0f};
          v = vals[pick % 6];
        }
      }
      x[(size_t)r * cols + c] = v;
    }
}

struct result {
  uint8_t *codes;
  uint16_t *bf16;
  float *scales, *scales2;
  int rc, rc2;
  char msg[256];
};

static void quantize(const struct rf_fp8_grid *g, const float *x, int pow2, int simd, struct result *r) {
  rf_fp8_simd_set(simd);
  r->rc = rf_fp8_quantize(g, x, pow2, "t.w", r->codes, r->scales);
  snprintf(r->msg, sizeof r->msg, "%s", r->rc ? rf_error_msg() : "");
  r->rc2 = rf_fp8_quantize_bf16(g, x, pow2, "t.w", r->bf16, r->scales2);
  rf_error_clear();
}

static void test_quantizer(void) {
  const int shapes[][2] = {{1, 1},    {3, 5},     {7, 130}, {130, 7},  {136, 272},
                           {200, 33}, {129, 257}, {5, 128}, {128, 256}};
  const int tiles[][2] = {{1, 128}, {128, 128}, {128, 1}, {1, 64}, {2, 3}, {1, 1}};
  const size_t most = 200 * 272;
  float *x = rf_xmalloc(most * sizeof(float));
  struct result res[2];
  for (int s = 0; s < 2; s++) {
    res[s].codes = rf_xmalloc(most);
    res[s].bf16 = rf_xmalloc(most * 2);
    res[s].scales = rf_xmalloc(most * sizeof(float));
    res[s].scales2 = rf_xmalloc(most * sizeof(float));
  }
  uint16_t *widened = rf_xmalloc(most * 2);
  uint64_t rng = 5;
  int cases = 0;
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++)
      for (int kind = 0; kind < 6; kind++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
          int rows = shapes[si][0], cols = shapes[si][1];
          struct rf_fp8_grid g = {rows, cols, tiles[ti][0], tiles[ti][1]};
          size_t n = (size_t)rows * cols, nt = (size_t)rf_fp8_grid_tiles(&g);
          make_data(x, rows, cols, kind < 5 ? kind : 0, &rng);
          if (kind == 5) { /* a NaN or an infinity, sometimes two */
            size_t at = (size_t)(rf_test_rand_u64(&rng) % n);
            x[at] = pow2 ? -INFINITY : NAN;
            if (n > 1 && (rf_test_rand_u64(&rng) & 1)) x[(size_t)(rf_test_rand_u64(&rng) % n)] = INFINITY;
          }
          for (int side = 0; side < 2; side++) quantize(&g, x, pow2, side == 0, &res[side]);
          const struct result *a = &res[0], *b = &res[1];
          const char *what = kind == 5 ? "refusal" : "quantization";
          RF_CHECK(a->rc == b->rc && a->rc2 == b->rc2 && a->rc == a->rc2 && (a->rc != 0) == (kind == 5),
                   "%dx%d in %dx%d tiles, data %d, pow2 %d: %s rc simd %d/%d portable %d/%d", rows, cols,
                   g.tile_rows, g.tile_cols, kind, pow2, what, a->rc, a->rc2, b->rc, b->rc2);
          cases++;
          if (kind == 5) {
            RF_CHECK(strcmp(a->msg, b->msg) == 0 && strstr(a->msg, "'t.w'"), "messages differ: '%s' / '%s'",
                     a->msg, b->msg);
            continue;
          }
          rf_fp8_simd_set(0);
          rf_fp8_codes_to_bf16(widened, b->codes, n);
          RF_CHECK(memcmp(a->codes, b->codes, n) == 0 && same_floats(a->scales, b->scales, nt),
                   "%dx%d in %dx%d tiles, data %d, pow2 %d: simd codes or scales differ", rows, cols,
                   g.tile_rows, g.tile_cols, kind, pow2);
          RF_CHECK(memcmp(a->bf16, widened, n * 2) == 0 && memcmp(b->bf16, widened, n * 2) == 0 &&
                       same_floats(a->scales2, b->scales, nt) && same_floats(b->scales2, b->scales, nt),
                   "%dx%d in %dx%d tiles, data %d, pow2 %d: quantize_bf16 differs from the widened codes",
                   rows, cols, g.tile_rows, g.tile_cols, kind, pow2);
        }
  RF_CHECK(cases == 9 * 6 * 6 * 2, "cases %d", cases);
  rf_fp8_simd_set(1);
  for (int s = 0; s < 2; s++) {
    free(res[s].codes);
    free(res[s].bf16);
    free(res[s].scales);
    free(res[s].scales2);
  }
  free(widened);
  free(x);
}

int main(void) {
  int simd = rf_fp8_simd_set(1);
  printf("test_fp8_simd: AVX-512 kernels %s\n",
         simd ? "built: compared with the portable ones" : "not built");
  if (!simd) rf_test_not_run("no AVX-512 kernels in this build: the portable ones compared with themselves");
  test_encoder();
  test_widen();
  test_quantizer();
  return rf_test_finish("test_fp8_simd");
}
