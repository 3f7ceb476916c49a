/* The comparisons every test relies on (rf_test.h) against planted NaNs and infinities: a
 * non-finite value at the first, a middle or the last position, on either side, must make each
 * comparison fail, and finite inputs must give the exact maximum. */
/* rf-test: timeout=10 */
#include "rf_test.h"

#include <math.h>
#include <string.h>

#define N 7

static const char *side_name[3] = {"a", "b", "both"};

/* Every comparison with one planted value at position `at` on side `side` (0 a, 1 b, 2 both). */
static void check_planted(float bad, int at, int side) {
  float a[N], b[N];
  for (int i = 0; i < N; i++) a[i] = b[i] = 1.0f + (float)i;
  if (side != 1) a[at] = bad;
  if (side != 0) b[at] = bad;
  const char *s = side_name[side];
  double r = rf_test_max_rel_diff(a, b, N, 1e-3);
  RF_CHECK(!(r <= 1e30), "max_rel_diff with %g at %d in %s: %g", (double)bad, at, s, r);
  RF_CHECK(isinf(r) && r > 0, "max_rel_diff with %g at %d in %s gives %g, not +inf", (double)bad, at, s, r);
  double d = rf_test_max_abs_diff(a, b, N);
  RF_CHECK(isinf(d) && d > 0, "max_abs_diff with %g at %d in %s gives %g", (double)bad, at, s, d);
  if (side != 1) {
    double m = rf_test_max_abs(a, N);
    RF_CHECK(isinf(m) && m > 0, "max_abs with %g at %d gives %g", (double)bad, at, m);
  }
}

static void test_planted(void) {
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  const int at[3] = {0, N / 2, N - 1};
  for (int v = 0; v < 3; v++)
    for (int p = 0; p < 3; p++)
      for (int side = 0; side < 3; side++) check_planted(bad[v], at[p], side);
}

static void test_finite(void) {
  const float a[4] = {1.0f, -2.0f, 3.5f, 0.0f}, b[4] = {1.0f, -1.0f, 3.0f, 0.0f};
  RF_CHECK(rf_test_max_abs_diff(a, b, 4) == 1.0, "max_abs_diff %g", rf_test_max_abs_diff(a, b, 4));
  RF_CHECK(rf_test_max_abs(a, 4) == 3.5, "max_abs %g", rf_test_max_abs(a, 4));
  /* |-2 - -1| / 1 = 1 beats 0.5 / 3; the zero pair uses the floor and differs by nothing. */
  RF_CHECK(rf_test_max_rel_diff(a, b, 4, 0.5) == 1.0, "max_rel_diff %g", rf_test_max_rel_diff(a, b, 4, 0.5));
  const float c[2] = {0.25f, 0.0f}, z[2] = {0.0f, 0.0f};
  RF_CHECK(rf_test_max_rel_diff(c, z, 2, 0.5) == 0.5, "floor: %g", rf_test_max_rel_diff(c, z, 2, 0.5));
  RF_CHECK(rf_test_max_rel_diff(c, z, 0, 0.5) == 0.0, "empty");
  /* The running maximum keeps every non-finite value it is given, in any order. */
  RF_CHECK(rf_test_max(1.0, 2.0) == 2.0 && rf_test_max(2.0, 1.0) == 2.0, "max of finite values");
  RF_CHECK(isinf(rf_test_max(NAN, 1.0)) && isinf(rf_test_max(1.0, NAN)), "max drops a NaN");
  RF_CHECK(isinf(rf_test_max(rf_test_max(0.0, NAN), 5.0)), "a NaN is replaced by a later value");
  RF_CHECK(isinf(rf_test_max(0.0, -INFINITY)), "max drops -inf");
  /* What the comparisons replace: fmax forgets a NaN. */
  RF_CHECK(fmax(fmax(0.0, NAN), 1.0) == 1.0, "fmax keeps NaN here (libm changed?)");
}

/* RF_CHECK_CLOSE's test fails on NaN and infinities on either side. */
static void test_close(void) {
  RF_CHECK(rf_test_close(1.0, 1.0005, 1e-3, 0.0) && !rf_test_close(1.0, 1.002, 1e-3, 0.0), "finite bound");
  RF_CHECK(rf_test_close(0.0, 1e-9, 0.0, 1e-8) && !rf_test_close(0.0, 1e-7, 0.0, 1e-8), "absolute bound");
  const double bad[3] = {NAN, INFINITY, -INFINITY};
  for (int v = 0; v < 3; v++) {
    RF_CHECK(!rf_test_close(bad[v], 1.0, 1e-3, 1.0), "%g close to 1", bad[v]);
    RF_CHECK(!rf_test_close(1.0, bad[v], 1e-3, 1.0), "1 close to %g", bad[v]);
    RF_CHECK(!rf_test_close(bad[v], bad[v], 1e-3, 1.0), "%g close to itself", bad[v]);
  }
}

int main(void) {
  test_planted();
  test_finite();
  test_close();
  return rf_test_finish("test_harness");
}
