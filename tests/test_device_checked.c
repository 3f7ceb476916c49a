/* rf-test: timeout=60
 * The checked device (src/device/device_checked.c) is as strict as docs/gpu.md says, each
 * rule shown failing where it should:
 *   - a host read of device memory faults (SIGSEGV, in a child process), while the backend's
 *     second mapping holds the bytes the device wrote;
 *   - a host pointer given as device memory, and an operation without a stream, stop the
 *     program naming the operation (exit 1, in a child);
 *   - its arithmetic is the host's, bit for bit (casts, accumulation, scaling, the sum of
 *     squares, FP8 tiles), whatever the streams' delays;
 *   - events order two streams: a copy on stream b that waits on an event recorded on
 *     stream a after a memset reads the memset's bytes, every time; without the wait, the
 *     same sequence reads stale bytes in at least one of 40 tries (the streams run late by
 *     random delays), which is what makes a missing wait in the runtime visible;
 *   - the backend list has it and accepts it for training (the whole step runs on it:
 *     tests/test_train_checked.c), while it refuses a name it does not know;
 *   - host code launched on a stream (rf_device_launch, how the cpu and checked backends run
 *     the step's host kernels) runs in stream order, later than asked, on a copy of its
 *     argument taken at the call, reaching device memory through rf_device_view; the host
 *     backend runs it at once; a device without launch (CUDA) stops the program naming it;
 *   - the host's waits for the device are counted (host_syncs), the same calls on the checked
 *     device and on the host: a copy to the host, a sum of squares, a stream or event
 *     synchronized; a copy to the device, a launch, a record or a stream's wait are not;
 *   - a copy from the host takes its source at the call (the caller may reuse it at once);
 *     a copy to the host has landed when it returns; an event recorded behind queued work is
 *     not reached at once, and is after synchronize. */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/device.h"
#include "rf_test.h"
#include "rfsdp.h"

static struct rf_device dev;

/* Runs fn in a child; returns its status as waitpid gives it. */
static int in_child(void (*fn)(void)) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

static float *g_device_floats;
static void read_device_on_host(void) {
  volatile float x = g_device_floats[3]; /* must fault */
  (void)x;
}
static void host_pointer_as_device(void) {
  struct rf_device_stream *s = rf_device_stream_create(&dev);
  float host[4] = {0};
  rf_device_memset(&dev, host, 0, sizeof host, s);
}
static void no_stream(void) { rf_device_memset(&dev, g_device_floats, 0, 16, NULL); }

static void check_memory(void) {
  struct rf_device_stream *s = rf_device_stream_create(&dev);
  float *d = rf_device_alloc(&dev, 64 * sizeof(float), 64);
  float h[64];
  for (int i = 0; i < 64; i++) h[i] = (float)i * 0.5f;
  rf_device_copy(&dev, d, h, sizeof h, RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  memset(h, 0, sizeof h); /* taken at the call: reusing it now changes nothing */
  rf_device_stream_synchronize(&dev, s);
  const float *view = rf_device_checked_view(&dev, d);
  RF_CHECK(view[3] == 1.5f && view[63] == 31.5f, "the second mapping holds the copied bytes (%g, %g)",
           (double)view[3], (double)view[63]);
  g_device_floats = d;
  int st = in_child(read_device_on_host);
  RF_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV, "a host read of device memory faults (status %d)", st);
  st = in_child(host_pointer_as_device);
  RF_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "a host pointer as device memory stops the program (%d)",
           st);
  st = in_child(no_stream);
  RF_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1, "an operation without a stream stops the program (%d)", st);
  float back[64];
  rf_device_copy(&dev, back, d, sizeof back, RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  RF_CHECK(back[10] == 5.0f, "a copy to the host has landed when it returns (%g)", (double)back[10]);
  rf_device_release(&dev, d);
  rf_device_stream_free(&dev, s);
}

static void check_arithmetic(void) {
  struct rf_device host;
  rf_device_host_init(&host, NULL);
  struct rf_device_stream *s = rf_device_stream_create(&dev);
  enum { N = 5000 };
  uint64_t rng = 7;
  float *x = malloc(N * sizeof(float)), *acc = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
  uint16_t *b = malloc(N * sizeof(uint16_t)), *gotb = malloc(N * sizeof(uint16_t));
  for (int i = 0; i < N; i++) {
    x[i] = (float)((double)(rf_test_rand_u64(&rng) % 200001) / 1000.0 - 100.0);
    acc[i] = (float)i * 0.25f;
  }
  float *dx = rf_device_alloc(&dev, N * sizeof(float), 64),
        *dacc = rf_device_alloc(&dev, N * sizeof(float), 64);
  uint16_t *db = rf_device_alloc(&dev, N * sizeof(uint16_t), 64);
  rf_device_copy(&dev, dx, x, N * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  rf_device_copy(&dev, dacc, acc, N * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  rf_device_cast(&dev, db, RF_DTYPE_BF16, dx, RF_DTYPE_F32, N, 0, s);
  rf_device_cast(&dev, dacc, RF_DTYPE_F32, db, RF_DTYPE_BF16, N, 1, s);
  rf_device_scale(&dev, dacc, N, 0.37f, s);
  double sq = rf_device_sum_squares(&dev, dacc, N, s);
  rf_device_copy(&dev, gotb, db, N * sizeof(uint16_t), RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  rf_device_copy(&dev, got, dacc, N * sizeof(float), RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  rf_device_cast(&host, b, RF_DTYPE_BF16, x, RF_DTYPE_F32, N, 0, NULL);
  rf_device_cast(&host, acc, RF_DTYPE_F32, b, RF_DTYPE_BF16, N, 1, NULL);
  rf_device_scale(&host, acc, N, 0.37f, NULL);
  double want = rf_device_sum_squares(&host, acc, N, NULL);
  RF_CHECK(memcmp(b, gotb, N * sizeof(uint16_t)) == 0, "bf16 cast: the host's bits");
  RF_CHECK(memcmp(acc, got, N * sizeof(float)) == 0, "accumulating cast and scale: the host's bits");
  RF_CHECK(sq == want, "sum of squares: the host's (%.17g, %.17g)", sq, want);
  /* FP8 tiles of a 256 x 200 matrix */
  struct rf_fp8_grid g = {25, 200, 128, 128};
  uint8_t codes[5000], dcodes_h[5000];
  float scales[4], dscales_h[4];
  uint8_t *dcodes = rf_device_alloc(&dev, sizeof codes, 64);
  float *dscales = rf_device_alloc(&dev, sizeof scales, 64);
  int rh = rf_device_fp8_quantize(&host, &g, x, 0, "w", codes, scales, NULL);
  int rd = rf_device_fp8_quantize(&dev, &g, dx, 0, "w", dcodes, dscales, s);
  rf_device_copy(&dev, dcodes_h, dcodes, sizeof codes, RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  rf_device_copy(&dev, dscales_h, dscales, sizeof(float) * 2, RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  RF_CHECK(rh == 0 && rd == 0 && memcmp(codes, dcodes_h, sizeof codes) == 0 &&
               memcmp(scales, dscales_h, sizeof(float) * 2) == 0,
           "fp8 tiles: the host's codes and scales");
  rf_device_release(&dev, dx), rf_device_release(&dev, dacc), rf_device_release(&dev, db);
  rf_device_release(&dev, dcodes), rf_device_release(&dev, dscales);
  rf_device_stream_free(&dev, s);
  free(x), free(acc), free(got), free(b), free(gotb);
}

/* Stream a fills x with `value` (after a few slow pieces of work), stream b copies x to y
 * and the host reads y; with `wait` b waits on an event recorded on a after the fill.
 * Returns 1 when y holds the fill. */
static int ordered_once(struct rf_device_stream *a, struct rf_device_stream *b, struct rf_device_event *ev,
                        uint8_t *x, uint8_t *y, int value, int wait) {
  enum { M = 4096 };
  for (int k = 0; k < 4; k++) rf_device_memset(&dev, x, value - 1, M, a); /* work ahead of the fill */
  rf_device_memset(&dev, x, value, M, a);
  rf_device_event_record(&dev, ev, a);
  if (wait) rf_device_stream_wait(&dev, b, ev);
  rf_device_copy(&dev, y, x, M, RF_DEVICE_COPY_DEVICE_TO_DEVICE, b);
  uint8_t h[M];
  rf_device_copy(&dev, h, y, M, RF_DEVICE_COPY_DEVICE_TO_HOST, b);
  rf_device_stream_synchronize(&dev, a);
  for (int i = 0; i < M; i++)
    if (h[i] != (uint8_t)value) return 0;
  return 1;
}

static void check_events(void) {
  struct rf_device_stream *a = rf_device_stream_create(&dev), *b = rf_device_stream_create(&dev);
  struct rf_device_event ev;
  rf_device_event_create(&dev, &ev);
  uint8_t *x = rf_device_alloc(&dev, 4096, 64), *y = rf_device_alloc(&dev, 4096, 64);
  int waited_ok = 0, unwaited_stale = 0;
  for (int t = 0; t < 40; t++) {
    waited_ok += ordered_once(a, b, &ev, x, y, 2 + t % 200, 1);
    unwaited_stale += !ordered_once(a, b, &ev, x, y, 3 + t % 200, 0);
  }
  RF_CHECK(waited_ok == 40, "with the event wait, stream b read stream a's fill every time (%d of 40)",
           waited_ok);
  RF_CHECK(unwaited_stale > 0, "without it, stream b read stale bytes in %d of 40 tries (at least one)",
           unwaited_stale);
  /* an event behind queued work is not reached at once; it is after synchronize */
  for (int k = 0; k < 20; k++) rf_device_memset(&dev, x, k, 4096, a);
  rf_device_event_record(&dev, &ev, a);
  RF_CHECK(!rf_device_event_query(&dev, &ev), "an event behind 20 queued memsets is not reached at once");
  rf_device_event_synchronize(&dev, &ev);
  RF_CHECK(rf_device_event_query(&dev, &ev), "an event is reached after synchronize");
  rf_device_event_free(&dev, &ev);
  rf_device_release(&dev, x), rf_device_release(&dev, y);
  rf_device_stream_free(&dev, a), rf_device_stream_free(&dev, b);
}

/* A launched piece of host code: waits for the gate (when given), then adds `add` to every
 * float of x (device memory, reached through the view) and notes that it ran. */
struct launched {
  float *x;
  int n;
  float add;
  volatile int *gate, *ran;
};

static void run_launched(void *arg) {
  struct launched *a = arg;
  while (a->gate && !*a->gate) usleep(100);
  float *x = rf_device_view(&dev, a->x);
  for (int i = 0; i < a->n; i++) x[i] += a->add;
  *a->ran += 1;
}

static void run_launched_host(void *arg) {
  struct launched *a = arg;
  for (int i = 0; i < a->n; i++) a->x[i] += a->add;
  *a->ran += 1;
}

static void launch_without_launch(void) {
  struct rf_device_ops ops = *dev.ops;
  ops.launch = NULL;
  ops.view = NULL;
  struct rf_device fake = dev;
  fake.ops = &ops;
  volatile int ran = 0;
  struct launched a = {NULL, 0, 0.0f, NULL, &ran};
  rf_device_launch(&fake, NULL, "the test's kernel", run_launched, &a, sizeof a);
}

static void check_launch(void) {
  struct rf_device_stream *s = rf_device_stream_create(&dev);
  RF_CHECK(rf_device_runs_host_code(&dev) && s->dev == &dev,
           "the checked device runs host code on its streams");
  enum { N = 256 };
  float *d = rf_device_alloc(&dev, N * sizeof(float), 64);
  float h[N];
  for (int i = 0; i < N; i++) h[i] = (float)i;
  rf_device_copy(&dev, d, h, sizeof h, RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  volatile int gate = 0, ran = 0;
  struct launched a = {d, N, 1.5f, &gate, &ran};
  rf_device_launch(&dev, s, "the test's kernel", run_launched, &a, sizeof a);
  a.add = 100.0f; /* taken at the call: the queued launch still adds 1.5 */
  a.gate = NULL;
  rf_device_stream_launch(s, "the test's second kernel", run_launched, &a, sizeof a); /* adds 100 after */
  RF_CHECK(ran == 0, "a launch behind a closed gate has not run when launch returns (ran %d)", ran);
  gate = 1;
  rf_device_copy(&dev, h, d, sizeof h, RF_DEVICE_COPY_DEVICE_TO_HOST, s);
  RF_CHECK(
      ran == 2 && h[0] == 101.5f && h[N - 1] == (float)(N - 1) + 101.5f,
      "both launches ran in stream order on their own arguments, before the copy behind them (%d, %g, %g)",
      ran, (double)h[0], (double)h[N - 1]);
  RF_CHECK(
      rf_device_view(&dev, NULL) == NULL && rf_device_stream_view(s, d) == rf_device_checked_view(&dev, d),
      "a view of NULL is NULL; the stream's view is the device's");
  int st = in_child(launch_without_launch);
  RF_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1,
           "launch on a device without host code stops the program (%d)", st);
  rf_device_release(&dev, d);
  rf_device_stream_free(&dev, s);
  /* the host backend: at once, on the caller's memory */
  struct rf_device host;
  rf_device_host_init(&host, NULL);
  struct rf_device_stream *hs = rf_device_stream_create(&host);
  float hx[4] = {1, 2, 3, 4};
  volatile int hran = 0;
  struct launched b = {hx, 4, 0.5f, NULL, &hran};
  rf_device_launch(&host, hs, "the test's kernel", run_launched_host, &b, sizeof b);
  RF_CHECK(hran == 1 && hx[3] == 4.5f && rf_device_view(&host, hx) == hx,
           "the host runs a launch at once, on host memory it views as itself (%d, %g)", hran, (double)hx[3]);
  rf_device_stream_free(&host, hs);
}

/* The same calls on a device counting into c; returns c.host_syncs. */
static uint64_t syncs_of(struct rf_device *d) {
  struct rf_counters c = {0};
  d->counters = &c;
  struct rf_device_stream *s = rf_device_stream_create(d), *t = rf_device_stream_create(d);
  float h[16] = {1, 2, 3};
  float *x = rf_device_alloc(d, sizeof h, 64);
  struct rf_device_event ev;
  rf_device_event_create(d, &ev);
  rf_device_copy(d, x, h, sizeof h, RF_DEVICE_COPY_HOST_TO_DEVICE, s); /* not a wait */
  rf_device_scale(d, x, 16, 2.0f, s);
  rf_device_event_record(d, &ev, s);
  rf_device_stream_wait(d, t, &ev);                                    /* not a wait of the host */
  double sq = rf_device_sum_squares(d, x, 16, t);                      /* 1 */
  rf_device_copy(d, h, x, sizeof h, RF_DEVICE_COPY_DEVICE_TO_HOST, t); /* 2 */
  rf_device_stream_synchronize(d, s);                                  /* 3 */
  rf_device_event_synchronize(d, &ev);                                 /* 4 */
  RF_CHECK(sq == 56.0 && h[2] == 6.0f, "the counted calls computed (%g, %g)", sq, (double)h[2]);
  rf_device_event_free(d, &ev);
  rf_device_release(d, x);
  rf_device_stream_free(d, s), rf_device_stream_free(d, t);
  d->counters = NULL;
  return c.host_syncs;
}

static void check_host_syncs(void) {
  struct rf_device host;
  rf_device_host_init(&host, NULL);
  uint64_t on_host = syncs_of(&host), on_checked = syncs_of(&dev);
  RF_CHECK(on_host == 4 && on_checked == 4, "host waits counted alike: host %llu, checked %llu (4 each)",
           (unsigned long long)on_host, (unsigned long long)on_checked);
}

int main(void) {
  rf_device_checked_init(&dev, 0, NULL);
  RF_CHECK(strcmp(dev.ops->name, "checked") == 0 && !dev.ops->host_memory, "the checked table names itself");
  const char *why = rf_device_unavailable("checked");
  RF_CHECK(why == NULL, "--device checked accepted for training (tests/test_train_checked.c): %s",
           why ? why : "");
  RF_CHECK(rf_device_unavailable("cpu") == NULL, "--device cpu accepted");
  why = rf_device_unavailable("tpu");
  RF_CHECK(why && strstr(why, "cpu|checked|cuda"), "an unknown device refused, listing the names: %s",
           why ? why : "(accepted)");
  check_memory();
  check_arithmetic();
  check_events();
  check_launch();
  check_host_syncs();
  rf_device_free(&dev);
  return rf_test_finish("test_device_checked");
}
