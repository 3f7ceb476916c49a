/* rf-test: timeout=30
 * src/device: the host device table against the code it wraps (src/core's bf16 and
 * e4m3 conversions and FP8 tile quantizer, a plain loop for the scaling, a serial f64
 * sum for the sum of squares), bit for bit where the arithmetic is the same; copies and
 * memset in every direction; streams and events (a host stream runs at once; an event
 * bound to an outside completion is reached only when that completes, and waiting on
 * it waits for it); the arena on a device (alignment, zero-fill, mark/release, peak);
 * the counted moves and allocations count into the device's own counters, and into
 * no other device's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "device/device.h"
#include "rf_test.h"

#define N 4099 /* odd: no vector width divides it */

/* Values that stress the conversions: random magnitudes over many binades, exact
 * bf16 ties, NaN, infinities, signed zero, subnormals. */
static void fill_values(float *x, size_t n, uint64_t seed) {
  uint64_t st = seed;
  for (size_t i = 0; i < n; i++) x[i] = ldexpf(rf_test_rand_f32(&st), (int)(rf_test_rand_u64(&st) % 40) - 20);
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = -INFINITY;
  x[3] = -0.0f;
  x[4] = 1.00390625f; /* a tie: rounds to 1.0 (even) */
  x[5] = 1.01171875f; /* a tie: rounds up to the even 1.015625 */
  x[6] = 1e-40f;      /* subnormal */
  x[7] = -3.4e38f;
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void check_casts(struct rf_device *dev) {
  float *x = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float)), *ref = malloc(N * sizeof(float));
  uint16_t *b = malloc(N * sizeof(uint16_t)), *bref = malloc(N * sizeof(uint16_t));
  fill_values(x, N, 7);
  rf_device_cast(dev, b, RF_DTYPE_BF16, x, RF_DTYPE_F32, N, 0, NULL);
  for (size_t i = 0; i < N; i++) bref[i] = rf_bf16_from_f32(x[i]);
  RF_CHECK(same_bits(b, bref, N * sizeof(uint16_t)), "f32 -> bf16 equals rf_bf16_from_f32 bit for bit");
  RF_CHECK(b[4] == 0x3f80 && b[5] == 0x3f82 && (b[0] & 0x7fc0) == 0x7fc0 && b[1] == 0x7f80 && b[3] == 0x8000,
           "ties to even, NaN quiet, inf and -0 kept: %04x %04x %04x %04x %04x", b[4], b[5], b[0], b[1],
           b[3]);
  rf_device_cast(dev, back, RF_DTYPE_F32, b, RF_DTYPE_BF16, N, 0, NULL);
  for (size_t i = 0; i < N; i++) ref[i] = rf_f32_from_bf16(bref[i]);
  RF_CHECK(same_bits(back, ref, N * sizeof(float)), "bf16 -> f32 equals rf_f32_from_bf16 bit for bit");
  /* a bf16 value survives the round trip bf16 -> f32 -> bf16 exactly */
  uint16_t *b2 = malloc(N * sizeof(uint16_t));
  rf_device_cast(dev, b2, RF_DTYPE_BF16, back, RF_DTYPE_F32, N, 0, NULL);
  RF_CHECK(same_bits(b2, b, N * sizeof(uint16_t)), "bf16 -> f32 -> bf16 round trip is exact");
  /* f32 -> f32 is a copy; accumulate adds */
  rf_device_cast(dev, back, RF_DTYPE_F32, x, RF_DTYPE_F32, N, 0, NULL);
  RF_CHECK(same_bits(back, x, N * sizeof(float)), "f32 -> f32 copies the bits");
  float *acc = malloc(N * sizeof(float));
  uint64_t st = 11;
  for (size_t i = 0; i < N; i++) acc[i] = ref[i] = rf_test_rand_f32(&st);
  rf_device_cast(dev, acc, RF_DTYPE_F32, b, RF_DTYPE_BF16, N, 1, NULL);
  for (size_t i = 0; i < N; i++) ref[i] += rf_f32_from_bf16(b[i]);
  RF_CHECK(same_bits(acc, ref, N * sizeof(float)), "bf16 accumulated into f32 as the direct loop");
  for (size_t i = 0; i < N; i++) acc[i] = ref[i] = rf_test_rand_f32(&st);
  rf_device_cast(dev, acc, RF_DTYPE_F32, x, RF_DTYPE_F32, N, 1, NULL);
  for (size_t i = 0; i < N; i++) ref[i] += x[i];
  RF_CHECK(same_bits(acc, ref, N * sizeof(float)), "f32 accumulated into f32 as the direct loop");
  free(x), free(back), free(ref), free(b), free(bref), free(b2), free(acc);
}

static void check_reductions(struct rf_device *dev) {
  float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float)), *ref = malloc(N * sizeof(float));
  uint64_t st = 3;
  for (size_t i = 0; i < N; i++) x[i] = ldexpf(rf_test_rand_f32(&st), (int)(rf_test_rand_u64(&st) % 16) - 8);
  double serial = 0;
  for (size_t i = 0; i < N; i++) serial += (double)x[i] * (double)x[i];
  double sq = rf_device_sum_squares(dev, x, N, NULL);
  RF_CHECK_CLOSE(sq, serial, 1e-13, 0, "sum of squares against a serial f64 sum");
  RF_CHECK(rf_device_sum_squares(dev, x, 0, NULL) == 0.0, "an empty sum is 0");
  x[N / 2] = NAN;
  RF_CHECK(isnan(rf_device_sum_squares(dev, x, N, NULL)), "a NaN makes the sum NaN");
  x[N / 2] = INFINITY;
  RF_CHECK(isinf(rf_device_sum_squares(dev, x, N, NULL)), "an infinity makes the sum infinite");
  x[N / 2] = 0.5f;
  /* scaling: the same products as a plain loop, over more than one threaded chunk */
  size_t big = 3 * 65536 + 5;
  float *g = malloc(big * sizeof(float)), *gref = malloc(big * sizeof(float));
  for (size_t i = 0; i < big; i++) g[i] = gref[i] = rf_test_rand_f32(&st);
  rf_device_scale(dev, g, (int64_t)big, 0.3f, NULL);
  for (size_t i = 0; i < big; i++) gref[i] *= 0.3f;
  RF_CHECK(same_bits(g, gref, big * sizeof(float)), "scale equals the direct products bit for bit");
  free(x), free(y), free(ref), free(g), free(gref);
}

static void check_fp8(struct rf_device *dev) {
  struct rf_fp8_grid g = {200, 300, RF_FP8_TILE, RF_FP8_TILE};
  size_t n = 200 * 300, tiles = (size_t)rf_fp8_grid_tiles(&g);
  float *x = malloc(n * sizeof(float)), *s1 = malloc(tiles * sizeof(float)),
        *s2 = malloc(tiles * sizeof(float));
  uint8_t *c1 = malloc(n), *c2 = malloc(n);
  uint64_t st = 5;
  for (size_t i = 0; i < n; i++) x[i] = ldexpf(rf_test_rand_f32(&st), (int)(rf_test_rand_u64(&st) % 12) - 6);
  for (int pow2 = 0; pow2 <= 1; pow2++) {
    int rc1 = rf_device_fp8_quantize(dev, &g, x, pow2, "w", c1, s1, NULL);
    int rc2 = rf_fp8_quantize(&g, x, pow2, "w", c2, s2);
    RF_CHECK(rc1 == 0 && rc2 == 0 && same_bits(c1, c2, n) && same_bits(s1, s2, tiles * sizeof(float)),
             "pow2 %d: codes and scales equal rf_fp8_quantize's", pow2);
  }
  x[150 * 300 + 7] = NAN;
  rf_error_clear();
  int rc = rf_device_fp8_quantize(dev, &g, x, 0, "layers.0.w", c1, s1, NULL);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "layers.0.w"), "a NaN fails naming the tensor: %s",
           rf_error_msg());
  free(x), free(s1), free(s2), free(c1), free(c2);
}

static void check_memory(struct rf_device *dev) {
  struct rf_counters *c = dev->counters;
  uint64_t allocs0 = c->allocations;
  uint8_t *a = rf_device_alloc(dev, 1000, 256), *b = rf_device_alloc(dev, 1000, 64);
  RF_CHECK(((uintptr_t)a & 255) == 0 && ((uintptr_t)b & 63) == 0, "aligned allocations");
  int nonzero = 0;
  for (int i = 0; i < 1000; i++) nonzero += a[i] != 0;
  RF_CHECK(nonzero == 0, "allocations are zero-filled (%d non-zero bytes)", nonzero);
  RF_CHECK(c->allocations - allocs0 == 2, "two allocations counted on the device, got %llu",
           (unsigned long long)(c->allocations - allocs0));
  uint8_t host[1000], back[1000];
  for (int i = 0; i < 1000; i++) host[i] = (uint8_t)(i * 7 + 1);
  rf_device_copy(dev, a, host, 1000, RF_DEVICE_COPY_HOST_TO_DEVICE, NULL);
  rf_device_copy(dev, b, a, 1000, RF_DEVICE_COPY_DEVICE_TO_DEVICE, NULL);
  rf_device_copy(dev, back, b, 1000, RF_DEVICE_COPY_DEVICE_TO_HOST, NULL);
  RF_CHECK(memcmp(back, host, 1000) == 0, "host -> device -> device -> host keeps every byte");
  rf_device_memset(dev, b + 100, 0xab, 50, NULL);
  rf_device_copy(dev, back, b, 1000, RF_DEVICE_COPY_DEVICE_TO_HOST, NULL);
  int wrong = 0;
  for (int i = 0; i < 1000; i++) wrong += back[i] != (i >= 100 && i < 150 ? 0xab : host[i]);
  RF_CHECK(wrong == 0, "memset writes its range only (%d bytes wrong)", wrong);
  rf_device_release(dev, a);
  rf_device_release(dev, b);
  rf_device_release(dev, NULL);
}

/* An outside completion (a comm request, in the runtime): done after `left` tests. */
struct outside {
  int left, tests, waits;
};
static int outside_test(void *arg) {
  struct outside *o = arg;
  o->tests++;
  if (o->left > 0) o->left--;
  return o->left == 0;
}
static void outside_wait(void *arg) {
  struct outside *o = arg;
  o->waits++;
  o->left = 0;
}

static void check_events(struct rf_device *dev) {
  struct rf_device_stream *s = rf_device_stream_create(dev);
  RF_CHECK(s != NULL, "a stream");
  struct rf_device_event ev;
  rf_device_event_create(dev, &ev);
  /* host: work queued on a stream has run when the call returns, so the event
   * recorded after it is reached, and a stream waiting on it need not block */
  float buf[64] = {0}, src[64];
  for (int i = 0; i < 64; i++) src[i] = (float)i;
  rf_device_copy(dev, buf, src, sizeof buf, RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  rf_device_event_record(dev, &ev, s);
  RF_CHECK(rf_device_event_query(dev, &ev) == 1 && buf[63] == 63.0f, "an event after host work is reached");
  rf_device_stream_wait(dev, NULL, &ev);
  rf_device_event_synchronize(dev, &ev);
  rf_device_stream_synchronize(dev, s);
  /* bound to an outside completion: not reached until it completes; queries drive it */
  struct outside o = {.left = 3};
  rf_device_event_bind(&ev, outside_test, outside_wait, &o);
  int q1 = rf_device_event_query(dev, &ev), q2 = rf_device_event_query(dev, &ev);
  int q3 = rf_device_event_query(dev, &ev);
  RF_CHECK(q1 == 0 && q2 == 0 && q3 == 1 && o.tests == 3,
           "a bound event is reached when its work is: %d %d %d", q1, q2, q3);
  o = (struct outside){.left = 5};
  rf_device_event_synchronize(dev, &ev);
  RF_CHECK(o.waits == 1 && o.left == 0 && rf_device_event_query(dev, &ev) == 1,
           "synchronizing a bound event waits for its work");
  o = (struct outside){.left = 5};
  rf_device_stream_wait(dev, s, &ev);
  RF_CHECK(o.waits == 1 && o.left == 0, "a stream waiting on a bound event waits for it (on the host)");
  /* recording again unbinds: the event is a point in the stream again */
  o = (struct outside){.left = 5};
  rf_device_event_record(dev, &ev, s);
  RF_CHECK(rf_device_event_query(dev, &ev) == 1 && o.tests == 0, "record unbinds");
  rf_device_event_free(dev, &ev);
  rf_device_stream_free(dev, s);
  rf_device_stream_free(dev, NULL);
}

static void check_arena(struct rf_device *dev) {
  struct rf_arena a;
  uint64_t allocs0 = dev->counters->allocations;
  rf_arena_init(&a, dev, 4096, NULL);
  RF_CHECK(((uintptr_t)a.base & 63) == 0, "slab is 64-byte aligned");
  size_t aligns[] = {1, 2, 8, 16, 64, 256};
  for (int i = 0; i < 6; i++) {
    uint8_t *p = rf_arena_alloc(&a, 3 + (size_t)i, aligns[i]);
    RF_CHECK(((uintptr_t)p % aligns[i]) == 0, "alignment %zu", aligns[i]);
    RF_CHECK(p >= a.base && p + 3 + i <= a.base + a.used, "inside the used part");
  }
  RF_CHECK(a.allocs == 6, "allocs %zu", a.allocs);
  size_t mark = rf_arena_mark(&a);
  uint8_t *p = rf_arena_alloc(&a, 1000, 16);
  memset(p, 0xff, 1000);
  size_t peak = a.peak;
  RF_CHECK(peak == a.used && peak >= mark + 1000, "peak follows used");
  rf_arena_release(&a, mark);
  RF_CHECK(a.used == mark && a.peak == peak, "release gives back, peak stays");
  uint8_t *q = rf_arena_alloc(&a, 1000, 16);
  int nonzero = 0;
  for (int i = 0; i < 1000; i++) nonzero += q[i] != 0;
  RF_CHECK(q == p && nonzero == 0, "reused memory is zero-filled (%d non-zero bytes)", nonzero);
  rf_arena_alloc(&a, 4096 - a.used, 1); /* exactly full is fine */
  RF_CHECK(a.used == 4096 && a.peak == 4096, "filled to capacity");
  rf_arena_reset(&a);
  RF_CHECK(a.used == 0 && a.allocs == 9, "reset");
  RF_CHECK(dev->counters->allocations - allocs0 == 10, "slab + 9 arena allocations counted, got %llu",
           (unsigned long long)(dev->counters->allocations - allocs0));
  rf_arena_free(&a);
}

/* The counted helpers move the data and count each kind of byte on their device only. */
static void check_moves(struct rf_device *dev, const struct rf_counters *other) {
  const float src[3] = {1.0f, -2.5f, 1.00390625f}; /* the last rounds to 1.0 in bf16 (ties to even) */
  float f[3] = {0}, acc[3] = {10, 20, 30};
  uint16_t b[3] = {0}, own[3] = {0};
  uint8_t z[5] = {1, 2, 3, 4, 5};
  struct rf_counters other0 = *other;
  struct rf_counters before = *dev->counters;
  rf_move_copy(dev, f, src, sizeof f, NULL);
  rf_move_zero(dev, z, sizeof z, NULL);
  struct rf_counters d = rf_counters_diff(dev->counters, &before);
  RF_CHECK(
      memcmp(f, src, sizeof f) == 0 && z[0] == 0 && z[4] == 0 && d.bytes_copied == 17 && d.bytes_cast == 0,
      "copy and zero: %llu copied bytes", (unsigned long long)d.bytes_copied);
  before = *dev->counters;
  rf_move_convert(dev, f, RF_DTYPE_F32, src, 3, NULL);
  rf_move_convert(dev, b, RF_DTYPE_BF16, src, 3, NULL);
  rf_move_convert_back(dev, acc, b, RF_DTYPE_BF16, 3, 1, NULL);
  rf_move_own_shard(dev, own, RF_DTYPE_BF16, src, 2, NULL);
  d = rf_counters_diff(dev->counters, &before);
  RF_CHECK(b[0] == 0x3f80 && b[1] == 0xc020 && b[2] == 0x3f80 && acc[0] == 11 && acc[1] == 17.5f &&
               acc[2] == 31 && own[0] == 0x3f80 && own[1] == 0xc020 && own[2] == 0,
           "conversions: bf16 %04x %04x %04x, accumulated %g %g %g", b[0], b[1], b[2], acc[0], acc[1],
           acc[2]);
  RF_CHECK(d.bytes_copied == 12 && d.bytes_cast == 6 + 12 && d.bytes_own_shard == 4,
           "conversions counted: %llu copied (f32 to f32), %llu cast, %llu own shard",
           (unsigned long long)d.bytes_copied, (unsigned long long)d.bytes_cast,
           (unsigned long long)d.bytes_own_shard);
  RF_CHECK(memcmp(other, &other0, sizeof other0) == 0, "another device's counters did not move");
}

int main(void) {
  struct rf_counters mine = {0}, theirs = {0};
  struct rf_device dev, other;
  rf_device_host_init(&dev, &mine);
  rf_device_host_init(&other, &theirs);
  RF_CHECK(dev.ops->host_memory && strcmp(dev.ops->name, "host") == 0, "the host device");
  check_casts(&dev);
  check_reductions(&dev);
  check_fp8(&dev);
  check_memory(&dev);
  check_events(&dev);
  check_arena(&dev);
  check_moves(&dev, &theirs);
  /* a device without counters counts nowhere and still works */
  struct rf_device quiet;
  rf_device_host_init(&quiet, NULL);
  float a = 1.5f, c = 0;
  rf_move_copy(&quiet, &c, &a, sizeof a, NULL);
  RF_CHECK(c == 1.5f, "a device without counters moves");
  rf_device_free(&quiet);
  rf_device_free(&other);
  rf_device_free(&dev);
  return rf_test_finish("test_device");
}
