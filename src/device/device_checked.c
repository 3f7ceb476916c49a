/* The checked device: the host's arithmetic behind a device that is strict where the host
 * is lenient (STYLE.md 20, a debug twin), so that code written for an asynchronous device
 * with memory of its own is checked on the CPU.
 *
 * Memory. Device addresses are handed out from a reservation mapped PROT_NONE: the host
 * code that dereferences one faults (SIGSEGV) at once, at the line that did it. The bytes
 * live in a memfd mapped a second time, readable and writable, which only the backend
 * reaches (rf_device_checked_view). A pointer given as device memory that is not in the
 * reservation (a host pointer) stops the job naming the operation.
 *
 * Streams. Each stream is a worker thread that runs its queue in order, later than asked:
 * before each piece of work it sleeps a random 0..RF_DEVICE_CHECKED_DELAY_US microseconds
 * (a generator seeded per stream), so work queued on two streams without an event between
 * them interleaves differently from run to run, and a host that reads a result before
 * waiting reads stale bytes. NULL is refused (dies): there is no default stream.
 *
 * Events are real: a record queues "reached n" on its stream; a stream that waits on it
 * queues "wait until n" (the n of the last record before the wait, as cudaStreamWaitEvent
 * captures it); query and synchronize look at the same count.
 *
 * Where the host waits (as on CUDA): a copy to the host (the caller reads it on return), the
 * sum of squares and the FP8 quantizer (their answers go to the host: they run on the host
 * thread after the stream has drained, through the second mapping), stream and event
 * synchronization. A copy from the host takes the source at the call (CUDA's pageable copy):
 * the caller may reuse it at once. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "device/device.h"

/* The reservation: address space only (the memfd is sparse; released ranges are punched out). */
#define RF_DEVICE_CHECKED_RESERVE ((size_t)64 << 30)
#define RF_DEVICE_CHECKED_DELAY_US 200

struct rf_checked_work {
  void (*fn)(void *arg);
  void *arg; /* owned: freed after fn */
  struct rf_checked_work *next;
};

struct rf_checked_stream {
  struct rf_device_stream pub; /* first: the table's stream */
  struct rf_checked *dev;
  pthread_t thread;
  struct rf_checked_work *head, *tail;
  uint64_t queued, done;
  int stop;
  uint64_t rng;
};

struct rf_checked_event {
  uint64_t recorded, reached;
};

/* rf_device.impl. One lock and one condition for every stream's queue and every event. */
struct rf_checked {
  uint8_t *base;   /* the reservation, PROT_NONE: the addresses the host sees */
  uint8_t *shadow; /* the same bytes, read-write: what the backend reaches */
  size_t used;     /* bump allocation */
  int fd;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  uint64_t seeds;        /* streams created: each stream's seed */
  struct rf_device host; /* the host table whose arithmetic runs on the shadow */
};

static struct rf_checked *rf_checked_of(const struct rf_device *dev) { return dev->impl; }

void *rf_device_checked_view(const struct rf_device *dev, const void *ptr) {
  struct rf_checked *c = rf_checked_of(dev);
  const uint8_t *p = ptr;
  if (p < c->base || p >= c->base + c->used)
    RF_DIE("checked device: %p is not device memory (the reservation is [%p, +%zu))", ptr, (void *)c->base,
           c->used);
  return c->shadow + (p - c->base);
}

/* ---- streams ---------------------------------------------------------------- */

static uint64_t rf_checked_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

static void *rf_checked_worker(void *arg) {
  struct rf_checked_stream *s = arg;
  struct rf_checked *c = s->dev;
  pthread_mutex_lock(&c->lock);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&c->cond, &c->lock);
    if (!s->head) break;
    struct rf_checked_work *w = s->head;
    pthread_mutex_unlock(&c->lock);
    struct timespec pause = {0, (long)(rf_checked_next(&s->rng) % (RF_DEVICE_CHECKED_DELAY_US + 1)) * 1000};
    nanosleep(&pause, NULL);
    w->fn(w->arg); /* may take the lock itself (an event) */
    pthread_mutex_lock(&c->lock);
    s->head = w->next;
    if (!s->head) s->tail = NULL;
    s->done++;
    pthread_cond_broadcast(&c->cond);
    free(w->arg);
    free(w);
  }
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

static struct rf_checked_stream *rf_checked_stream_of(const struct rf_device *dev,
                                                      struct rf_device_stream *stream, const char *what) {
  if (!stream) RF_DIE("checked device: %s without a stream (NULL): name the runtime's", what);
  (void)dev;
  return (struct rf_checked_stream *)stream;
}

/* Queues fn(arg) on the stream; arg (malloc'd) is the worker's to free. */
static void rf_checked_queue(struct rf_checked_stream *s, void (*fn)(void *), void *arg) {
  struct rf_checked_work *w = rf_xcalloc(1, sizeof *w);
  w->fn = fn;
  w->arg = arg;
  pthread_mutex_lock(&s->dev->lock);
  if (s->tail)
    s->tail->next = w;
  else
    s->head = w;
  s->tail = w;
  s->queued++;
  pthread_cond_broadcast(&s->dev->cond);
  pthread_mutex_unlock(&s->dev->lock);
}

static void rf_checked_drain(struct rf_checked_stream *s) {
  pthread_mutex_lock(&s->dev->lock);
  uint64_t want = s->queued;
  while (s->done < want) pthread_cond_wait(&s->dev->cond, &s->dev->lock);
  pthread_mutex_unlock(&s->dev->lock);
}

static struct rf_device_stream *rf_checked_stream_create(struct rf_device *dev) {
  struct rf_checked *c = rf_checked_of(dev);
  struct rf_checked_stream *s = rf_xcalloc(1, sizeof *s);
  s->dev = c;
  s->pub.handle = s;
  pthread_mutex_lock(&c->lock);
  s->rng = 0x9e3779b97f4a7c15ull * (++c->seeds) ^ (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);
  pthread_mutex_unlock(&c->lock);
  if (!s->rng) s->rng = 1;
  int rc = pthread_create(&s->thread, NULL, rf_checked_worker, s);
  if (rc != 0) RF_DIE("checked device: pthread_create: %s", strerror(rc));
  return &s->pub;
}

static void rf_checked_stream_free(struct rf_device *dev, struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "stream_free");
  rf_checked_drain(s);
  pthread_mutex_lock(&s->dev->lock);
  s->stop = 1;
  pthread_cond_broadcast(&s->dev->cond);
  pthread_mutex_unlock(&s->dev->lock);
  pthread_join(s->thread, NULL);
  free(s);
}

static void rf_checked_stream_synchronize(struct rf_device *dev, struct rf_device_stream *stream) {
  rf_checked_drain(rf_checked_stream_of(dev, stream, "stream_synchronize"));
}

/* ---- memory -------------------------------------------------------------------- */

static void rf_checked_free(struct rf_device *dev) {
  struct rf_checked *c = dev->impl;
  if (!c) return;
  munmap(c->base, RF_DEVICE_CHECKED_RESERVE);
  munmap(c->shadow, RF_DEVICE_CHECKED_RESERVE);
  close(c->fd);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
  dev->impl = NULL;
}

/* Bump allocation on 64-byte blocks (the reservation is never reused: a released range is
 * punched out of the memfd, so its pages go back and a stale pointer reads zeroes). */
static void *rf_checked_alloc(struct rf_device *dev, size_t bytes, size_t align) {
  struct rf_checked *c = rf_checked_of(dev);
  if (align < 64) align = 64;
  pthread_mutex_lock(&c->lock);
  size_t start = (c->used + align - 1) / align * align;
  size_t end = start + (bytes ? bytes : 1);
  end = (end + 63) / 64 * 64;
  if (end > RF_DEVICE_CHECKED_RESERVE)
    RF_DIE("checked device: out of its %zu-byte reservation allocating %zu bytes", RF_DEVICE_CHECKED_RESERVE,
           bytes);
  c->used = end;
  pthread_mutex_unlock(&c->lock);
  rf_xalloc_note_bytes(bytes);
  return c->base + start; /* zero: fresh memfd pages */
}

static void rf_checked_release(struct rf_device *dev, void *ptr) {
  (void)dev, (void)ptr; /* the pages stay mapped: a stream may still be using them until synchronized */
}

struct rf_checked_copy {
  void *dst;
  const void *src;
  size_t bytes;
  uint8_t staged[]; /* host to device: the source, taken at the call */
};

static void rf_checked_run_copy(void *arg) {
  struct rf_checked_copy *a = arg;
  memcpy(a->dst, a->src, a->bytes);
}

static void rf_checked_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes,
                            enum rf_device_copy dir, struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "copy");
  struct rf_checked_copy *a = rf_xcalloc(1, sizeof *a + (dir == RF_DEVICE_COPY_HOST_TO_DEVICE ? bytes : 0));
  a->bytes = bytes;
  if (dir == RF_DEVICE_COPY_HOST_TO_DEVICE) {
    memcpy(a->staged, src, bytes);
    a->src = a->staged;
    a->dst = rf_device_checked_view(dev, dst);
  } else if (dir == RF_DEVICE_COPY_DEVICE_TO_HOST) {
    a->src = rf_device_checked_view(dev, src);
    a->dst = dst;
  } else {
    a->src = rf_device_checked_view(dev, src);
    a->dst = rf_device_checked_view(dev, dst);
  }
  rf_checked_queue(s, rf_checked_run_copy, a);
  if (dir == RF_DEVICE_COPY_DEVICE_TO_HOST) rf_checked_drain(s); /* the caller reads it on return */
}

struct rf_checked_fill {
  void *dst;
  int value;
  size_t bytes;
};

static void rf_checked_run_memset(void *arg) {
  struct rf_checked_fill *a = arg;
  memset(a->dst, a->value, a->bytes);
}

static void rf_checked_memset(struct rf_device *dev, void *dst, int value, size_t bytes,
                              struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "memset");
  struct rf_checked_fill *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_fill){rf_device_checked_view(dev, dst), value, bytes};
  rf_checked_queue(s, rf_checked_run_memset, a);
}

/* ---- the host's arithmetic on the second mapping ---------------------------------- */

struct rf_checked_cast {
  struct rf_device *host;
  void *dst;
  const void *src;
  enum rf_dtype dst_dtype, src_dtype;
  size_t n;
  int accumulate;
  float scale; /* scale: x = dst */
};

static void rf_checked_run_cast(void *arg) {
  struct rf_checked_cast *a = arg;
  a->host->ops->cast(a->host, a->dst, a->dst_dtype, a->src, a->src_dtype, a->n, a->accumulate, NULL);
}

static void rf_checked_cast(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
                            enum rf_dtype src_dtype, size_t n, int accumulate,
                            struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "cast");
  struct rf_checked_cast *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_cast){.host = &rf_checked_of(dev)->host,
                                .dst = rf_device_checked_view(dev, dst),
                                .src = rf_device_checked_view(dev, src),
                                .dst_dtype = dst_dtype,
                                .src_dtype = src_dtype,
                                .n = n,
                                .accumulate = accumulate};
  rf_checked_queue(s, rf_checked_run_cast, a);
}

static void rf_checked_run_scale(void *arg) {
  struct rf_checked_cast *a = arg;
  a->host->ops->scale(a->host, a->dst, (int64_t)a->n, a->scale, NULL);
}

static void rf_checked_scale(struct rf_device *dev, float *x, int64_t n, float scale,
                             struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "scale");
  struct rf_checked_cast *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_cast){.host = &rf_checked_of(dev)->host,
                                .dst = rf_device_checked_view(dev, x),
                                .n = (size_t)n,
                                .scale = scale};
  rf_checked_queue(s, rf_checked_run_scale, a);
}

/* Its answer goes to the host: after the stream's work, on the host thread. */
static double rf_checked_sum_squares(struct rf_device *dev, const float *x, int64_t n,
                                     struct rf_device_stream *stream) {
  rf_checked_drain(rf_checked_stream_of(dev, stream, "sum_squares"));
  struct rf_device *host = &rf_checked_of(dev)->host;
  return host->ops->sum_squares(host, rf_device_checked_view(dev, x), n, NULL);
}

struct rf_checked_sumsq {
  struct rf_device *host;
  double *acc;
  const float *x;
  int64_t n;
};

static void rf_checked_run_sum_squares_add(void *arg) {
  struct rf_checked_sumsq *a = arg;
  a->host->ops->sum_squares_add(a->host, a->acc, a->x, a->n, NULL);
}

/* On the stream's worker, on the views: the host's sum added into the device's f64. */
static void rf_checked_sum_squares_add(struct rf_device *dev, double *acc, const float *x, int64_t n,
                                       struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "sum_squares_add");
  struct rf_checked_sumsq *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_sumsq){.host = &rf_checked_of(dev)->host,
                                 .acc = rf_device_checked_view(dev, acc),
                                 .x = rf_device_checked_view(dev, x),
                                 .n = n};
  rf_checked_queue(s, rf_checked_run_sum_squares_add, a);
}

struct rf_checked_scalars {
  double *acc;
  const double *x;
  float *factor;
  double c;
};

static void rf_checked_run_add_f64(void *arg) {
  struct rf_checked_scalars *a = arg;
  *a->acc += *a->x + a->c;
}

/* On the stream's worker, on the views: the host's addition. */
static void rf_checked_add_f64(struct rf_device *dev, double *acc, const double *x, double c,
                               struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "add_f64");
  struct rf_checked_scalars *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_scalars){
      .acc = rf_device_checked_view(dev, acc), .x = rf_device_checked_view(dev, x), .c = c};
  rf_checked_queue(s, rf_checked_run_add_f64, a);
}

static void rf_checked_run_clip_factor(void *arg) {
  struct rf_checked_scalars *a = arg;
  *a->factor = rf_device_clip_factor_of(*a->x, a->c);
}

/* On the stream's worker, on the views: the host's clip factor. */
static void rf_checked_clip_factor(struct rf_device *dev, float *factor, const double *sumsq, double max_norm,
                                   struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "clip_factor");
  struct rf_checked_scalars *a = rf_xcalloc(1, sizeof *a);
  *a = (struct rf_checked_scalars){
      .factor = rf_device_checked_view(dev, factor), .x = rf_device_checked_view(dev, sumsq), .c = max_norm};
  rf_checked_queue(s, rf_checked_run_clip_factor, a);
}

static int rf_checked_fp8_quantize(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x,
                                   int pow2, const char *name, uint8_t *codes, float *scales,
                                   struct rf_device_stream *stream) {
  rf_checked_drain(rf_checked_stream_of(dev, stream, "fp8_quantize"));
  struct rf_device *host = &rf_checked_of(dev)->host;
  return host->ops->fp8_quantize(host, g, rf_device_checked_view(dev, x), pow2, name,
                                 rf_device_checked_view(dev, codes), rf_device_checked_view(dev, scales),
                                 NULL);
}

/* ---- events ------------------------------------------------------------------------- */

static void rf_checked_event_create(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  ev->handle = rf_xcalloc(1, sizeof(struct rf_checked_event));
}

static void rf_checked_event_free(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  free(ev->handle);
}

struct rf_checked_mark {
  struct rf_checked *dev;
  struct rf_checked_event *ev;
  uint64_t n;
};

static void rf_checked_run_reach(void *arg) {
  struct rf_checked_mark *a = arg;
  pthread_mutex_lock(&a->dev->lock);
  if (a->ev->reached < a->n) a->ev->reached = a->n;
  pthread_cond_broadcast(&a->dev->cond);
  pthread_mutex_unlock(&a->dev->lock);
}

static void rf_checked_run_wait(void *arg) {
  struct rf_checked_mark *a = arg;
  pthread_mutex_lock(&a->dev->lock);
  while (a->ev->reached < a->n) pthread_cond_wait(&a->dev->cond, &a->dev->lock);
  pthread_mutex_unlock(&a->dev->lock);
}

static void rf_checked_event_record(struct rf_device *dev, struct rf_device_event *ev,
                                    struct rf_device_stream *stream) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "event_record");
  struct rf_checked *c = rf_checked_of(dev);
  struct rf_checked_mark *a = rf_xcalloc(1, sizeof *a);
  pthread_mutex_lock(&c->lock);
  struct rf_checked_event *e = ev->handle;
  *a = (struct rf_checked_mark){c, e, ++e->recorded};
  pthread_mutex_unlock(&c->lock);
  rf_checked_queue(s, rf_checked_run_reach, a);
}

static void rf_checked_stream_wait(struct rf_device *dev, struct rf_device_stream *stream,
                                   struct rf_device_event *ev) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "stream_wait");
  struct rf_checked *c = rf_checked_of(dev);
  struct rf_checked_mark *a = rf_xcalloc(1, sizeof *a);
  pthread_mutex_lock(&c->lock);
  struct rf_checked_event *e = ev->handle;
  *a = (struct rf_checked_mark){c, e, e->recorded}; /* the last record before this call */
  pthread_mutex_unlock(&c->lock);
  rf_checked_queue(s, rf_checked_run_wait, a);
}

static int rf_checked_event_query(struct rf_device *dev, struct rf_device_event *ev) {
  struct rf_checked *c = rf_checked_of(dev);
  pthread_mutex_lock(&c->lock);
  struct rf_checked_event *e = ev->handle;
  int reached = e->reached >= e->recorded;
  pthread_mutex_unlock(&c->lock);
  return reached;
}

static void rf_checked_event_synchronize(struct rf_device *dev, struct rf_device_event *ev) {
  struct rf_checked *c = rf_checked_of(dev);
  pthread_mutex_lock(&c->lock);
  struct rf_checked_event *e = ev->handle;
  uint64_t want = e->recorded;
  while (e->reached < want) pthread_cond_wait(&c->cond, &c->lock);
  pthread_mutex_unlock(&c->lock);
}

/* ---- host code on device memory ------------------------------------------------------ */

struct rf_checked_launch {
  void (*fn)(void *arg);
  uint8_t arg[]; /* the caller's arg, taken at the call */
};

static void rf_checked_run_launch(void *arg) {
  struct rf_checked_launch *a = arg;
  a->fn(a->arg);
}

static void rf_checked_launch(struct rf_device *dev, struct rf_device_stream *stream, void (*fn)(void *arg),
                              const void *arg, size_t arg_bytes) {
  struct rf_checked_stream *s = rf_checked_stream_of(dev, stream, "launch");
  struct rf_checked_launch *a = rf_xcalloc(1, sizeof *a + arg_bytes);
  a->fn = fn;
  if (arg_bytes) memcpy(a->arg, arg, arg_bytes);
  rf_checked_queue(s, rf_checked_run_launch, a);
}

static const struct rf_device_ops rf_device_checked_ops = {
    .name = "checked",
    .host_memory = 0,
    .free = rf_checked_free,
    .alloc = rf_checked_alloc,
    .release = rf_checked_release,
    .copy = rf_checked_copy,
    .memset = rf_checked_memset,
    .cast = rf_checked_cast,
    .scale = rf_checked_scale,
    .sum_squares = rf_checked_sum_squares,
    .sum_squares_add = rf_checked_sum_squares_add,
    .add_f64 = rf_checked_add_f64,
    .clip_factor = rf_checked_clip_factor,
    .fp8_quantize = rf_checked_fp8_quantize,
    .stream_create = rf_checked_stream_create,
    .stream_free = rf_checked_stream_free,
    .stream_synchronize = rf_checked_stream_synchronize,
    .event_create = rf_checked_event_create,
    .event_free = rf_checked_event_free,
    .event_record = rf_checked_event_record,
    .stream_wait = rf_checked_stream_wait,
    .event_query = rf_checked_event_query,
    .event_synchronize = rf_checked_event_synchronize,
    .launch = rf_checked_launch,
    .view = rf_device_checked_view,
};

void rf_device_checked_init(struct rf_device *dev, int ordinal, struct rf_counters *counters) {
  struct rf_checked *c = rf_xcalloc(1, sizeof *c);
  c->fd = memfd_create("rf-checked-device", MFD_CLOEXEC);
  if (c->fd < 0) RF_DIE("checked device: memfd_create: %s", strerror(errno));
  if (ftruncate(c->fd, (off_t)RF_DEVICE_CHECKED_RESERVE) != 0)
    RF_DIE("checked device: ftruncate of its %zu-byte reservation: %s", RF_DEVICE_CHECKED_RESERVE,
           strerror(errno));
  void *base = mmap(NULL, RF_DEVICE_CHECKED_RESERVE, PROT_NONE, MAP_SHARED | MAP_NORESERVE, c->fd, 0);
  void *shadow =
      mmap(NULL, RF_DEVICE_CHECKED_RESERVE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, c->fd, 0);
  if (base == MAP_FAILED || shadow == MAP_FAILED)
    RF_DIE("checked device: mmap of its %zu-byte reservation: %s", RF_DEVICE_CHECKED_RESERVE,
           strerror(errno));
  c->base = base;
  c->shadow = shadow;
  c->used = 64; /* no device pointer is the reservation's first byte */
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  rf_device_host_init(&c->host, NULL);
  memset(dev, 0, sizeof *dev);
  dev->ops = &rf_device_checked_ops;
  dev->impl = c;
  dev->ordinal = ordinal;
  dev->counters = counters;
}
