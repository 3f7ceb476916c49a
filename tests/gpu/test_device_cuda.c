/* GPU test (run by scripts/gpu-check, built by make BACKEND=cuda): the CUDA device
 * table against the host device on the same inputs. Bit for bit where the arithmetic
 * is the same (casts f32 <-> bf16, accumulation, scaling, FP8 codes and scales at
 * 128x128, 1x128 and 128x1 tiles with partial tiles, pow2 on and off, and the refusal
 * message of a NaN or an infinity, the step's scalars: the loss added in f64 and the gradient
 * norm's clip factor); the f64 sum of squares within 1e-12 relative (the
 * order of the sum differs; the GPU's is a fixed tree, so two calls agree bit for bit);
 * copies in every direction, memset, the arena on the device, an event ordering two
 * streams; and a repeated sequence of the step's device calls after warm-up that
 * makes no cudaMalloc, no heap allocation and no host wait (counted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "device/device.h"
#include "device/device_cuda.h"
#include "rf_test.h"

static struct rf_device_stream *gs; /* every call names a stream: the CUDA table refuses NULL */
#define GS gs

#define N 40961 /* odd: no block size divides it */

/* Values over many binades, bf16 ties, NaN, infinities, signed zero, subnormals. */
static void fill_values(float *x, size_t n, uint64_t seed) {
  uint64_t st = seed;
  for (size_t i = 0; i < n; i++) x[i] = ldexpf(rf_test_rand_f32(&st), (int)(rf_test_rand_u64(&st) % 40) - 20);
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = -INFINITY;
  x[3] = -0.0f;
  x[4] = 1.00390625f;
  x[5] = 1.01171875f;
  x[6] = 1e-40f;
  x[7] = -3.4e38f;
}

static int same_bits(const void *a, const void *b, size_t bytes) { return memcmp(a, b, bytes) == 0; }

static void *to_gpu(struct rf_device *gpu, const void *src, size_t bytes) {
  void *d = rf_device_alloc(gpu, bytes, 256);
  rf_device_copy(gpu, d, src, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  return d;
}

static void from_gpu(struct rf_device *gpu, void *dst, const void *src, size_t bytes) {
  rf_device_copy(gpu, dst, src, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, GS);
}

static void check_casts(struct rf_device *host, struct rf_device *gpu) {
  float *x = malloc(N * sizeof(float)), *acc = malloc(N * sizeof(float)), *ref = malloc(N * sizeof(float));
  float *got = malloc(N * sizeof(float));
  uint16_t *b = malloc(N * sizeof(uint16_t)), *bgot = malloc(N * sizeof(uint16_t));
  fill_values(x, N, 7);
  fill_values(acc, N, 8);
  float *dx = to_gpu(gpu, x, N * sizeof(float));
  uint16_t *db = rf_device_alloc(gpu, N * sizeof(uint16_t), 256);
  rf_device_cast(host, b, RF_DTYPE_BF16, x, RF_DTYPE_F32, N, 0, GS);
  rf_device_cast(gpu, db, RF_DTYPE_BF16, dx, RF_DTYPE_F32, N, 0, GS);
  from_gpu(gpu, bgot, db, N * sizeof(uint16_t));
  RF_CHECK(memcmp(b, bgot, N * sizeof(uint16_t)) == 0, "f32 -> bf16: the GPU's bits differ from the host's");
  for (int accumulate = 0; accumulate < 2; accumulate++) {
    memcpy(ref, acc, N * sizeof(float));
    float *dacc = to_gpu(gpu, acc, N * sizeof(float));
    rf_device_cast(host, ref, RF_DTYPE_F32, b, RF_DTYPE_BF16, N, accumulate, GS);
    rf_device_cast(gpu, dacc, RF_DTYPE_F32, db, RF_DTYPE_BF16, N, accumulate, GS);
    from_gpu(gpu, got, dacc, N * sizeof(float));
    RF_CHECK(same_bits(ref, got, N * sizeof(float)), "bf16 -> f32 (accumulate %d): bits differ", accumulate);
    memcpy(ref, acc, N * sizeof(float));
    rf_device_copy(gpu, dacc, acc, N * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
    rf_device_cast(host, ref, RF_DTYPE_F32, x, RF_DTYPE_F32, N, accumulate, GS);
    rf_device_cast(gpu, dacc, RF_DTYPE_F32, dx, RF_DTYPE_F32, N, accumulate, GS);
    from_gpu(gpu, got, dacc, N * sizeof(float));
    RF_CHECK(same_bits(ref, got, N * sizeof(float)), "f32 -> f32 (accumulate %d): bits differ", accumulate);
    rf_device_release(gpu, dacc);
  }
  memcpy(ref, x, N * sizeof(float));
  rf_device_scale(host, ref, N, 0.37f, GS);
  rf_device_scale(gpu, dx, N, 0.37f, GS);
  from_gpu(gpu, got, dx, N * sizeof(float));
  RF_CHECK(same_bits(ref, got, N * sizeof(float)), "scale: bits differ");
  rf_device_release(gpu, dx);
  rf_device_release(gpu, db);
  free(x), free(acc), free(ref), free(got), free(b), free(bgot);
}

static void check_sum_squares(struct rf_device *host, struct rf_device *gpu) {
  float *x = malloc(N * sizeof(float));
  fill_values(x, N, 11);
  for (int i = 0; i < 8; i++) x[i] = 0.5f; /* finite */
  float *dx = to_gpu(gpu, x, N * sizeof(float));
  const int64_t sizes[] = {1, 255, 256, 257, 65537 < N ? 65537 : N - 3, N};
  for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
    double want = rf_device_sum_squares(host, x, sizes[t], GS);
    double a = rf_device_sum_squares(gpu, dx, sizes[t], GS), b = rf_device_sum_squares(gpu, dx, sizes[t], GS);
    RF_CHECK(rf_test_close(a, want, 1e-12, 0), "sum of squares of %lld elements: %.17g, host %.17g",
             (long long)sizes[t], a, want);
    RF_CHECK(same_bits(&a, &b, sizeof a), "sum of squares: two calls differ (%.17g, %.17g)", a, b);
  }
  float nan = NAN;
  rf_device_copy(gpu, dx + 1000, &nan, sizeof nan, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  RF_CHECK(!isfinite(rf_device_sum_squares(gpu, dx, N, GS)), "a NaN makes the sum of squares non-finite");
  rf_device_release(gpu, dx);
  free(x);
}

/* The step's scalars on the device: add_f64 (acc + (x + c)) and clip_factor (sqrt, max / (norm +
 * 1e-6) in f64, rounded to f32; 1 unclipped; NaN for a non-finite norm), bit for bit the host's. */
static void check_scalars(struct rf_device *host, struct rf_device *gpu) {
  const double sums[] = {0.0, 0.25, 1.0, 1.0000001, 3.7, 153.9, 1e30, INFINITY, NAN};
  const double clips[] = {0.0, 1.0, 2.5};
  enum { NS = sizeof sums / sizeof sums[0] };
  double *d = rf_device_alloc(gpu, 2 * sizeof(double), 256);
  float *df = rf_device_alloc(gpu, sizeof(float), 256);
  for (int c = 0; c < 3; c++)
    for (int i = 0; i < NS; i++) {
      float want, got;
      rf_device_clip_factor(host, &want, &sums[i], clips[c], GS);
      rf_device_copy(gpu, d, &sums[i], sizeof(double), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
      rf_device_clip_factor(gpu, df, d, clips[c], GS);
      from_gpu(gpu, &got, df, sizeof got);
      RF_CHECK(same_bits(&got, &want, sizeof got) || (isnan(got) && isnan(want)),
               "clip factor of sum %g at clip %g: %.9g, host %.9g", sums[i], clips[c], got, want);
    }
  double acc = 0.0, add[2] = {0.0, 0.0}, parts[] = {1.0 / 3.0, 7.25e-3, 1e17, 2.0 / 3.0};
  rf_device_memset(gpu, d, 0, 2 * sizeof(double), GS);
  for (int i = 0; i < 4; i++) {
    double c = i % 2 ? 1e-9 : 0.0;
    rf_device_add_f64(host, &acc, &parts[i], c, GS);
    rf_device_copy(gpu, d + 1, &parts[i], sizeof(double), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
    rf_device_add_f64(gpu, d, d + 1, c, GS);
  }
  from_gpu(gpu, add, d, sizeof add);
  RF_CHECK(same_bits(&add[0], &acc, sizeof acc), "add_f64: %.17g, host %.17g", add[0], acc);
  rf_device_release(gpu, d);
  rf_device_release(gpu, df);
}

/* One grid: codes and scales bit for bit, then a NaN and an infinity planted: both
 * devices refuse with the same message. */
static void check_fp8_grid(struct rf_device *host, struct rf_device *gpu, struct rf_fp8_grid g, int pow2) {
  size_t n = (size_t)(g.rows * g.cols), tiles = (size_t)rf_fp8_grid_tiles(&g);
  float *x = malloc(n * sizeof(float)), *s = malloc(tiles * sizeof(float)),
        *sg = malloc(tiles * sizeof(float));
  uint8_t *c = malloc(n), *cg = malloc(n);
  uint64_t st = (uint64_t)(g.rows * 31 + g.cols + pow2);
  for (size_t i = 0; i < n; i++) x[i] = ldexpf(rf_test_rand_f32(&st), (int)(rf_test_rand_u64(&st) % 24) - 12);
  for (size_t i = 0; i < n && i < 3; i++) x[i] = 0.0f; /* a zero corner */
  if (n > 10) x[n - 1] = 1e-44f, x[n - 2] = -3e-42f;   /* tiny values: subnormal codes, tiny scales */
  float *dx = to_gpu(gpu, x, n * sizeof(float)), *ds = rf_device_alloc(gpu, tiles * sizeof(float), 256);
  uint8_t *dc = rf_device_alloc(gpu, n, 256);
  int rh = rf_device_fp8_quantize(host, &g, x, pow2, "w", c, s, GS);
  int rg = rf_device_fp8_quantize(gpu, &g, dx, pow2, "w", dc, ds, GS);
  from_gpu(gpu, cg, dc, n);
  from_gpu(gpu, sg, ds, tiles * sizeof(float));
  RF_CHECK(rh == 0 && rg == 0, "fp8 %lldx%lld tiles %dx%d: host %d, gpu %d", (long long)g.rows,
           (long long)g.cols, g.tile_rows, g.tile_cols, rh, rg);
  RF_CHECK(memcmp(c, cg, n) == 0, "fp8 %lldx%lld tiles %dx%d pow2 %d: codes differ", (long long)g.rows,
           (long long)g.cols, g.tile_rows, g.tile_cols, pow2);
  RF_CHECK(same_bits(s, sg, tiles * sizeof(float)), "fp8 %lldx%lld tiles %dx%d pow2 %d: scales differ",
           (long long)g.rows, (long long)g.cols, g.tile_rows, g.tile_cols, pow2);
  /* an infinity late, a NaN early in a later tile than the infinity's when tiles are
   * wide: the host reports the first in its order, the GPU must name the same */
  if (n > 10)
    x[n - 5] = INFINITY, x[n / 2] = NAN;
  else
    x[0] = NAN;
  rf_device_copy(gpu, dx, x, n * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  rh = rf_device_fp8_quantize(host, &g, x, pow2, "layers.3.w", c, s, GS);
  char want[512];
  snprintf(want, sizeof want, "%s", rf_error_msg());
  rf_error_clear();
  rg = rf_device_fp8_quantize(gpu, &g, dx, pow2, "layers.3.w", dc, ds, GS);
  RF_CHECK(rh == -1 && rg == -1 && strstr(rf_error_msg(), "layers.3.w") &&
               strcmp(strstr(rf_error_msg(), "fp8:"), strstr(want, "fp8:")) == 0,
           "refusal: host '%s', gpu '%s'", want, rf_error_msg());
  rf_error_clear();
  rf_device_release(gpu, dx), rf_device_release(gpu, ds), rf_device_release(gpu, dc);
  free(x), free(s), free(sg), free(c), free(cg);
}

static void check_fp8(struct rf_device *host, struct rf_device *gpu) {
  for (int pow2 = 0; pow2 < 2; pow2++) {
    check_fp8_grid(host, gpu, (struct rf_fp8_grid){300, 260, 128, 128}, pow2);
    check_fp8_grid(host, gpu, (struct rf_fp8_grid){5, 300, 1, 128}, pow2);
    check_fp8_grid(host, gpu, (struct rf_fp8_grid){260, 7, 128, 1}, pow2);
    check_fp8_grid(host, gpu, (struct rf_fp8_grid){1, 1, 128, 128}, pow2);
  }
}

/* Copies in every direction, memset, the arena's zero-fill on the device, and an event
 * that orders stream b after stream a. */
static void check_memory_and_order(struct rf_device *gpu) {
  enum { M = 1 << 20 };
  unsigned char *h = malloc(M), *back = malloc(M);
  for (size_t i = 0; i < M; i++) h[i] = (unsigned char)(i * 7 + 3);
  unsigned char *d1 = rf_device_alloc(gpu, M, 64), *d2 = rf_device_alloc(gpu, M, 256);
  from_gpu(gpu, back, d1, M);
  int zero = 1;
  for (size_t i = 0; i < M; i++) zero &= back[i] == 0;
  RF_CHECK(zero, "alloc: device memory zero-filled");
  rf_device_copy(gpu, d1, h, M, RF_DEVICE_COPY_HOST_TO_DEVICE, GS);
  rf_device_copy(gpu, d2, d1, M, RF_DEVICE_COPY_DEVICE_TO_DEVICE, GS);
  from_gpu(gpu, back, d2, M);
  RF_CHECK(memcmp(h, back, M) == 0, "host -> device -> device -> host copies the bytes");
  struct rf_device_stream *a = rf_device_stream_create(gpu), *b = rf_device_stream_create(gpu);
  struct rf_device_event ev;
  rf_device_event_create(gpu, &ev);
  for (int rep = 0; rep < 20; rep++) rf_device_memset(gpu, d1, 0x5a, M, a); /* a busy a while */
  rf_device_event_record(gpu, &ev, a);
  rf_device_stream_wait(gpu, b, &ev);
  rf_device_copy(gpu, d2, d1, M, RF_DEVICE_COPY_DEVICE_TO_DEVICE, b);
  rf_device_stream_synchronize(gpu, b);
  RF_CHECK(rf_device_event_query(gpu, &ev) == 1, "the event is reached once b, which waited on it, finished");
  from_gpu(gpu, back, d2, M);
  int all = 1;
  for (size_t i = 0; i < M; i++) all &= back[i] == 0x5a;
  RF_CHECK(all, "stream b's copy ran after stream a's memsets (the event ordered them)");
  struct rf_arena arena;
  rf_arena_init(&arena, gpu, 3 * 4096, GS);
  void *p = rf_arena_alloc(&arena, 1000, 64), *q = rf_arena_alloc(&arena, 1000, 256);
  RF_CHECK((uintptr_t)p % 64 == 0 && (uintptr_t)q % 256 == 0 && q > p, "arena views aligned and in order");
  rf_arena_free(&arena);
  rf_device_event_free(gpu, &ev);
  rf_device_stream_free(gpu, a), rf_device_stream_free(gpu, b);
  rf_device_release(gpu, d1), rf_device_release(gpu, d2);
  free(h), free(back);
}

/* A step's device calls, repeated after a warm-up: no cudaMalloc, no heap allocation,
 * no host wait. */
static void check_step_quiet(struct rf_device *gpu) {
  enum { M = 1 << 16 };
  float *f = rf_device_alloc(gpu, M * sizeof(float), 256), *g = rf_device_alloc(gpu, M * sizeof(float), 256);
  uint16_t *h = rf_device_alloc(gpu, M * sizeof(uint16_t), 256);
  struct rf_device_stream *comm = rf_device_stream_create(gpu);
  struct rf_device_event ev;
  rf_device_event_create(gpu, &ev);
  for (int rep = 0; rep < 2; rep++) { /* 0: the warm-up; 1: counted */
    struct rf_device_cuda_stats before = rf_device_cuda_stats(gpu);
    uint64_t heap = rf_heap_allocations();
    for (int k = 0; k < 10; k++) {
      rf_device_cast(gpu, h, RF_DTYPE_BF16, f, RF_DTYPE_F32, M, 0, GS);
      rf_device_event_record(gpu, &ev, GS);
      rf_device_stream_wait(gpu, comm, &ev);
      rf_device_memset(gpu, g, 0, M * sizeof(float), comm);
      rf_device_event_record(gpu, &ev, comm);
      rf_device_stream_wait(gpu, GS, &ev);
      rf_device_cast(gpu, g, RF_DTYPE_F32, h, RF_DTYPE_BF16, M, 1, GS);
      rf_device_scale(gpu, g, M, 0.5f, GS);
      rf_device_copy(gpu, f, g, M * sizeof(float), RF_DEVICE_COPY_DEVICE_TO_DEVICE, GS);
    }
    struct rf_device_cuda_stats after = rf_device_cuda_stats(gpu);
    if (rep == 1)
      RF_CHECK(after.mallocs == before.mallocs && after.host_syncs == before.host_syncs &&
                   rf_heap_allocations() == heap,
               "a repeated step: %llu cudaMalloc, %llu host waits, %llu heap allocations (0 each expected)",
               (unsigned long long)(after.mallocs - before.mallocs),
               (unsigned long long)(after.host_syncs - before.host_syncs),
               (unsigned long long)(rf_heap_allocations() - heap));
  }
  rf_device_stream_synchronize(gpu, GS);
  rf_device_event_free(gpu, &ev);
  rf_device_stream_free(gpu, comm);
  rf_device_release(gpu, f), rf_device_release(gpu, g), rf_device_release(gpu, h);
}

int main(void) {
  struct rf_device host, gpu;
  rf_device_host_init(&host, NULL);
  rf_device_cuda_init(&gpu, 0, NULL);
  gs = rf_device_stream_create(&gpu);
  check_casts(&host, &gpu);
  check_sum_squares(&host, &gpu);
  check_scalars(&host, &gpu);
  check_fp8(&host, &gpu);
  check_memory_and_order(&gpu);
  check_step_quiet(&gpu);
  rf_device_free(&gpu);
  return rf_test_finish("test_device_cuda");
}
