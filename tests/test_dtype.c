/* rf-test: timeout=60
 * dtype conversions against independent definitions, exhaustively over every bf16
 * and every fp8 e4m3 bit pattern (and the rounding boundaries around each). */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"

static float f32_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Reference bf16 rounding: pick the nearer of the two bf16 neighbours in double
 * arithmetic, ties to the even pattern. */
static uint16_t ref_bf16(float x) {
  uint32_t u = bits_of(x);
  if (isnan(x)) return 0xffff; /* only NaN-ness is compared */
  uint16_t lo = (uint16_t)(u >> 16);
  if ((u & 0xffff) == 0) return lo;
  uint16_t hi = (uint16_t)(lo + 1);
  double dx = fabs((double)x);
  double dlo = fabs((double)f32_of((uint32_t)lo << 16)), dhi;
  float fhi = f32_of((uint32_t)hi << 16);
  /* past the largest finite bf16, the upper neighbour is infinity: round as if the
   * exponent continued (IEEE overflow rule) */
  dhi = isinf(fhi) ? ldexp(1.0, 128) : fabs((double)fhi);
  double elo = dx - dlo, ehi = dhi - dx;
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

/* Reference e4m3 value of a code, from the OCP table definition. */
static double ref_fp8_value(int code) {
  int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  double mag = e == 0 ? m / 8.0 * pow(2.0, -6) : (1.0 + m / 8.0) * pow(2.0, e - 7);
  return s ? -mag : mag;
}

/* Reference e4m3 encoding: brute force over all finite codes of the same sign,
 * nearest value, ties to the even code; beyond 448 saturate. */
static int ref_fp8(float x) {
  if (isnan(x)) return -1;
  int sign = signbit(x) ? 0x80 : 0;
  double a = fabs((double)x);
  if (a >= 448.0) return sign | 0x7e;
  int best = 0;
  double best_err = INFINITY;
  for (int c = 0; c <= 0x7e; c++) {
    double err = fabs(ref_fp8_value(c) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return sign | best;
}

static void check_bf16(float x) {
  uint16_t got = rf_bf16_from_f32(x), want = ref_bf16(x);
  if (isnan(x)) {
    RF_CHECK(isnan(rf_f32_from_bf16(got)), "bf16 of NaN %08x is not NaN (%04x)", bits_of(x), got);
    RF_CHECK((got & 0x8000) == (bits_of(x) >> 16 & 0x8000), "bf16 NaN sign lost");
  } else {
    RF_CHECK(got == want, "bf16(%08x) = %04x, expected %04x", bits_of(x), got, want);
  }
}

static void check_fp8(float x) {
  uint8_t got = rf_fp8e4m3_from_f32(x);
  int want = ref_fp8(x);
  if (want < 0)
    RF_CHECK((got & 0x7f) == 0x7f, "fp8 of NaN is %02x", got);
  else
    RF_CHECK(got == want, "fp8(%.9g) = %02x, expected %02x", (double)x, got, want);
}

int main(void) {
  /* bf16 -> f32 is exact and f32 -> bf16 -> f32 round-trips for every pattern */
  for (uint32_t b = 0; b < 65536; b++) {
    float f = rf_f32_from_bf16((uint16_t)b);
    RF_CHECK(bits_of(f) == b << 16, "f32(bf16 %04x) wrong", b);
    static const uint32_t lows[] = {0x0000, 0x0001, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xffff};
    for (size_t i = 0; i < sizeof lows / sizeof lows[0]; i++) check_bf16(f32_of(b << 16 | lows[i]));
  }

  /* fp8: decode every code; encode every code's value, both midpoints and their
   * neighbours, and every bf16 value */
  for (int c = 0; c < 256; c++) {
    float got = rf_f32_from_fp8e4m3((uint8_t)c);
    double want = ref_fp8_value(c);
    if (isnan(want))
      RF_CHECK(isnan(got), "fp8 %02x should decode to NaN", c);
    else
      RF_CHECK((double)got == want, "fp8 %02x decodes to %.9g, expected %.9g", c, (double)got, want);
    if (!isnan(want)) {
      check_fp8(got);
      RF_CHECK(rf_fp8e4m3_from_f32(got) == c || (c == 0x80 && rf_fp8e4m3_from_f32(got) == 0x80),
               "fp8 %02x does not round-trip", c);
    }
    if ((c & 0x7f) < 0x7e) {
      float mid = (float)((ref_fp8_value(c) + ref_fp8_value(c + 1)) / 2.0);
      check_fp8(mid);
      check_fp8(nextafterf(mid, 0.0f));
      check_fp8(nextafterf(mid, INFINITY));
      check_fp8(nextafterf(mid, -INFINITY));
    }
  }
  for (uint32_t b = 0; b < 65536; b++) check_fp8(f32_of(b << 16));
  RF_CHECK(rf_fp8e4m3_from_f32(1e9f) == 0x7e, "saturation");
  RF_CHECK(rf_fp8e4m3_from_f32(-INFINITY) == 0xfe, "-inf saturates");
  RF_CHECK(rf_fp8e4m3_from_f32(464.0f) == 0x7e, "448 < x < 480 saturates");
  return rf_test_finish("test_dtype");
}
