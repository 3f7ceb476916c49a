/* rf-test: timeout=30
 * src/core: RF_ASSERT, running out of a device arena (src/device) and a GEMM
 * argument error are fatal (checked in a forked child), error recording and propagation,
 * gcd/lcm against brute force, dtype names, counters. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "device/device.h"
#include "gemm/gemm.h"
#include "rf_test.h"

/* ---- fatal paths run in a child ------------------------------------------ */

/* Runs fn in a forked child with stderr captured; returns the exit status
 * (-1 if it did not exit normally) and the child's stderr in `err`. */
static int run_in_child(void (*fn)(void), char *err, size_t cap) {
  int fds[2];
  RF_ASSERT(pipe(fds) == 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  RF_ASSERT(pid >= 0);
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    fn();
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t got;
  while (n + 1 < cap && (got = read(fds[0], err + n, cap - 1 - n)) > 0) n += (size_t)got;
  err[n] = '\0';
  close(fds[0]);
  int status = 0;
  RF_ASSERT(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void exhaust_arena(void) {
  struct rf_device dev;
  rf_device_host_init(&dev, NULL);
  struct rf_arena a;
  rf_arena_init(&a, &dev, 1024, NULL);
  rf_arena_alloc(&a, 1000, 8);
  rf_arena_alloc(&a, 100, 8); /* dies */
}

static void failing_assert(void) {
  int x = 1;
  RF_ASSERT(x == 2);
}

/* lda = 1 < k = 2 for a row-major A: illegal. */
static void bad_gemm(void) {
  float a[4] = {0}, b[4] = {0}, c[4] = {0};
  struct rf_gemm_desc d = {2, 2, 2, 0, 0, 1, 2, 2, RF_DTYPE_F32, 1.0f, 0.0f};
  rf_gemm_run(&d, a, b, c);
}

static void check_fatal(void) {
  char err[4096];
  int rc = run_in_child(exhaust_arena, err, sizeof err);
  RF_CHECK(rc == 1, "arena exhaustion exits with 1, got %d", rc);
  RF_CHECK(strstr(err, "arena.c:") && strstr(err, "exhausted"), "arena exhaustion message: %s", err);
  rc = run_in_child(failing_assert, err, sizeof err);
  RF_CHECK(rc == 1, "RF_ASSERT exits with 1, got %d", rc);
  RF_CHECK(strstr(err, "test_core.c:") && strstr(err, "x == 2"),
           "assert message names file and condition: %s", err);
  rc = run_in_child(bad_gemm, err, sizeof err);
  RF_CHECK(rc == 1, "a GEMM argument error exits with 1, got %d", rc);
  RF_CHECK(strstr(err, "gemm.c:") && strstr(err, "lda=1"), "GEMM error message: %s", err);
}

/* ---- errors --------------------------------------------------------------- */

enum { FAIL_LINE = __LINE__ + 4 }; /* the line of the RF_FAIL below */

static int fails_with(int value) {
  RF_REQUIRE(value < 10, "value %d is too large", value);
  if (value < 0) RF_FAIL("value %d is negative", value);
  return 0;
}

static int propagates(int value, int *reached) {
  RF_TRY(fails_with(value));
  *reached = 1;
  return 0;
}

static void check_errors(void) {
  rf_error_clear();
  RF_CHECK(strcmp(rf_error_msg(), "") == 0, "cleared");
  int reached = 0;
  RF_CHECK(propagates(3, &reached) == 0 && reached == 1, "success passes through RF_TRY");
  reached = 0;
  RF_CHECK(propagates(-4, &reached) == -1 && reached == 0, "RF_TRY stops at the failure");
  char want[64];
  snprintf(want, sizeof want, "test_core.c:%d: value -4 is negative", (int)FAIL_LINE);
  RF_CHECK(strstr(rf_error_msg(), want) != NULL, "RF_FAIL message '%s', expected '%s'", rf_error_msg(), want);
  RF_CHECK(fails_with(12) == -1 && strstr(rf_error_msg(), "value 12 is too large"), "RF_REQUIRE: %s",
           rf_error_msg());
}

/* ---- gcd, lcm ------------------------------------------------------------ */

static int64_t brute_gcd(int64_t a, int64_t b) {
  a = a < 0 ? -a : a;
  b = b < 0 ? -b : b;
  if (a == 0) return b;
  if (b == 0) return a;
  for (int64_t d = a < b ? a : b; d >= 1; d--)
    if (a % d == 0 && b % d == 0) return d;
  return 1;
}

static void check_gcd_lcm(void) {
  int bad = 0;
  for (int64_t a = -30; a <= 60; a++)
    for (int64_t b = -30; b <= 60; b++) bad += rf_gcd_i64(a, b) != brute_gcd(a, b);
  RF_CHECK(bad == 0, "gcd: %d mismatches", bad);
  bad = 0;
  for (int64_t a = 1; a <= 60; a++)
    for (int64_t b = 1; b <= 60; b++) {
      int64_t l = a; /* smallest multiple of a that b divides */
      while (l % b != 0) l += a;
      for (int64_t cap = 1; cap <= 4000; cap = cap * 3 + 1) {
        int64_t want = l <= cap ? l : -1;
        bad += rf_lcm_i64_capped(a, b, cap) != want;
      }
      bad += rf_lcm_i64_capped(a, b, l) != l || rf_lcm_i64_capped(a, b, l - 1) != -1;
    }
  RF_CHECK(bad == 0, "lcm: %d mismatches", bad);
  /* products that overflow int64 are refused, not wrapped */
  int64_t p = 1099511627791LL; /* a prime near 2^40 */
  RF_CHECK(rf_lcm_i64_capped(p, p - 2, INT64_MAX) == -1, "overflowing lcm is -1");
  RF_CHECK(rf_lcm_i64_capped(p, 2 * p, INT64_MAX) == 2 * p, "lcm of a multiple");
}

/* ---- dtypes, counters ----------------------------------------------------- */

static void check_dtype_parse(void) {
  const char *names[] = {"f32", "bf16", "fp8e4m3", "u8", "i32", "i64", "f64"};
  const size_t sizes[] = {4, 2, 1, 1, 4, 8, 8};
  for (int i = 0; i < 7; i++) {
    enum rf_dtype d = (enum rf_dtype) - 1;
    RF_CHECK(rf_dtype_parse(names[i], &d) == 0 && (int)d == i, "parse %s", names[i]);
    RF_CHECK(strcmp(rf_dtype_name(d), names[i]) == 0, "name of %s", names[i]);
    RF_CHECK(rf_dtype_size(d) == sizes[i], "size of %s", names[i]);
  }
  enum rf_dtype d = RF_DTYPE_F32;
  RF_CHECK(rf_dtype_parse("f16", &d) == -1 && d == RF_DTYPE_F32, "unknown name rejected");
  RF_CHECK(rf_dtype_parse("", &d) == -1 && rf_dtype_parse("F32x", &d) == -1, "empty and near names rejected");
}

static void check_counters(void) {
  struct rf_counters before = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}, now = before;
  now.bytes_gathered += 10;
  now.bytes_reduced += 20;
  now.bytes_alltoall += 30;
  now.bytes_copied += 40;
  now.bytes_cast += 50;
  now.bytes_own_shard += 55;
  now.bytes_padding += 60;
  now.collectives += 7;
  now.comm_wait_ns += 80;
  now.host_syncs += 90;
  uint64_t heap0 = rf_heap_allocations();
  free(rf_xmalloc(16));
  free(rf_xcalloc(2, 8));
  free(rf_xaligned(64, 100));
  now.allocations += rf_heap_allocations() - heap0;
  struct rf_counters d = rf_counters_diff(&now, &before);
  RF_CHECK(d.bytes_gathered == 10 && d.bytes_reduced == 20 && d.bytes_alltoall == 30 &&
               d.bytes_copied == 40 && d.bytes_cast == 50 && d.bytes_own_shard == 55 &&
               d.bytes_padding == 60 && d.collectives == 7 && d.comm_wait_ns == 80 && d.host_syncs == 90,
           "diff of every byte field");
  RF_CHECK(d.allocations == 3, "three checked allocations counted, got %llu",
           (unsigned long long)d.allocations);
  /* rf_time_ns in ns of the monotonic clock: its readings fall between the clock's own
   * (the order of events, whatever the load), and a sleep of 2 ms lasts at least 2e6 */
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  uint64_t t0 = rf_time_ns();
  usleep(2000);
  uint64_t t1 = rf_time_ns();
  clock_gettime(CLOCK_MONOTONIC, &b);
  uint64_t ref0 = (uint64_t)a.tv_sec * 1000000000ull + (uint64_t)a.tv_nsec,
           ref1 = (uint64_t)b.tv_sec * 1000000000ull + (uint64_t)b.tv_nsec;
  RF_CHECK(ref0 <= t0 && t0 + 2000000 <= t1 && t1 <= ref1,
           "monotonic clock: %llu, %llu ns between %llu and %llu", (unsigned long long)t0,
           (unsigned long long)t1, (unsigned long long)ref0, (unsigned long long)ref1);
}

int main(void) {
  check_fatal();
  check_errors();
  check_gcd_lcm();
  check_dtype_parse();
  check_counters();
  return rf_test_finish("test_core");
}
