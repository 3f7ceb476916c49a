/* The CUDA device (BACKEND=cuda): struct rf_device_ops on one GPU. Memory from
 * cudaMalloc, copies and memsets queued on the table's streams (cudaMemcpyAsync,
 * cudaMemsetAsync), the kernels of device_cuda_kernels.cu for casts, scaling, the
 * sum of squares and FP8 tiles, streams that never wait for the legacy default
 * stream (cudaStreamNonBlocking), events without timing (cudaEventDisableTiming).
 *
 * Where the host waits (each counted in host_syncs, rf_device_cuda_stats): a copy to
 * the host (the caller reads it on return, as on the host device), the sum of squares
 * and the FP8 refusal check (their results go to the host), stream and event
 * synchronization, and alloc (zero-filled before it returns; set-up only). A copy
 * from the host returns once CUDA has taken the source (pageable memory: staged).
 *
 * Every such wait polls (cudaStreamQuery / cudaEventQuery, then a 20 us sleep) instead of
 * blocking inside CUDA, telling the device's waiter (rf_device_waiter: the NCCL backend,
 * which checks its asynchronous errors and puts the collective watchdog on the oldest
 * collective the streams still wait for) at every poll: the runtime's NCCL requests are
 * never waited for on the host (the compute stream waits for their events), so a
 * collective that never completes holds the host here, where it must still be named and
 * end the job. A copy to pageable host memory blocks inside cudaMemcpyAsync until it has
 * landed, so the stream is polled empty first. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "device/device_cuda.h"

#define RF_CUDA_CHECK(call)                                                                                \
  do {                                                                                                     \
    cudaError_t rf_cuda_rc_ = (call);                                                                      \
    if (rf_cuda_rc_ != cudaSuccess)                                                                        \
      RF_DIE("%s failed: %s (%s)", #call, cudaGetErrorString(rf_cuda_rc_), cudaGetErrorName(rf_cuda_rc_)); \
  } while (0)

/* rf_device.impl of a CUDA device. Owns the default stream, the scratch memory and
 * the pinned host words. */
struct rf_device_cuda_pinned {
  double sum;
  long long bad;
  float value;
};
struct rf_device_cuda {
  cudaStream_t stream;                  /* the default stream of the table (stream NULL) */
  void *scratch;                        /* device, owned: partial, sum and bad below */
  double *partial;                      /* RF_CUDA_SUMSQ_BLOCKS partial sums of the sum of squares */
  double *sum;                          /* the sum of squares */
  long long *bad;                       /* the FP8 quantizer's first bad element */
  struct rf_device_cuda_pinned *pinned; /* host, pinned, owned: what the host reads back */
  struct rf_device_cuda_stats stats;
};

static struct rf_device_cuda *rf_device_cuda_of(const struct rf_device *dev) { return dev->impl; }

/* Every operation names one of its caller's streams: NULL is refused, not read as a default (the model's
 * kernels and AdamW read NULL as CUDA's legacy stream, the table as its own: two meanings, so none). */
cudaStream_t rf_device_cuda_stream(const struct rf_device *dev, const struct rf_device_stream *stream) {
  if (!stream)
    RF_DIE("cuda device %d: an operation without a stream (NULL): name the runtime's", dev->ordinal);
  return (cudaStream_t)stream->handle;
}

struct rf_device_cuda_stats rf_device_cuda_stats(const struct rf_device *dev) {
  return rf_device_cuda_of(dev)->stats;
}

#define RF_CUDA_POLL_NS 20000 /* a host wait looks at the device this often */

/* The host waits until event e (or, e NULL, everything queued on s) is reached: polled, the
 * device's waiter told at every poll after the first (see the top of this file). Not counted:
 * the callers count one host wait each. */
static void rf_device_cuda_poll(struct rf_device *dev, cudaStream_t s, cudaEvent_t e) {
  uint64_t since = 0;
  for (;;) {
    cudaError_t rc = e ? cudaEventQuery(e) : cudaStreamQuery(s);
    if (rc == cudaSuccess) break;
    if (rc != cudaErrorNotReady)
      RF_DIE("%s failed: %s (%s)", e ? "cudaEventQuery" : "cudaStreamQuery", cudaGetErrorString(rc),
             cudaGetErrorName(rc));
    if (!since) since = rf_time_ns();
    if (dev->waiter.poll) dev->waiter.poll(dev->waiter.arg, since);
    struct timespec pause = {0, RF_CUDA_POLL_NS};
    nanosleep(&pause, NULL);
  }
  if (since && dev->waiter.done) dev->waiter.done(dev->waiter.arg);
}

static void rf_device_cuda_sync_stream(struct rf_device *dev, cudaStream_t s) {
  rf_device_cuda_of(dev)->stats.host_syncs++;
  rf_device_cuda_poll(dev, s, NULL);
}

static void rf_device_cuda_free(struct rf_device *dev) {
  struct rf_device_cuda *c = dev->impl;
  if (!c) return;
  RF_CUDA_CHECK(cudaStreamSynchronize(c->stream));
  RF_CUDA_CHECK(cudaFree(c->scratch));
  RF_CUDA_CHECK(cudaFreeHost(c->pinned));
  RF_CUDA_CHECK(cudaStreamDestroy(c->stream));
  free(c);
  dev->impl = NULL;
}

/* cudaMalloc aligns to 256 bytes at least: larger alignments are refused. */
static void *rf_device_cuda_alloc(struct rf_device *dev, size_t bytes, size_t align) {
  struct rf_device_cuda *c = rf_device_cuda_of(dev);
  if (align > 256) RF_DIE("cuda device: alignment %zu above cudaMalloc's 256 bytes", align);
  void *p = NULL;
  cudaError_t rc = cudaMalloc(&p, bytes ? bytes : 1);
  if (rc != cudaSuccess)
    RF_DIE("cuda device %d: cudaMalloc of %zu bytes failed: %s", dev->ordinal, bytes, cudaGetErrorString(rc));
  c->stats.mallocs++;
  RF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, c->stream));
  rf_device_cuda_sync_stream(dev, c->stream);
  return p;
}

static void rf_device_cuda_release(struct rf_device *dev, void *ptr) {
  (void)dev;
  RF_CUDA_CHECK(cudaFree(ptr));
}

static void rf_device_cuda_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes,
                                enum rf_device_copy dir, struct rf_device_stream *stream) {
  static const enum cudaMemcpyKind kind[] = {
      [RF_DEVICE_COPY_HOST_TO_DEVICE] = cudaMemcpyHostToDevice,
      [RF_DEVICE_COPY_DEVICE_TO_HOST] = cudaMemcpyDeviceToHost,
      [RF_DEVICE_COPY_DEVICE_TO_DEVICE] = cudaMemcpyDeviceToDevice,
  };
  cudaStream_t s = rf_device_cuda_stream(dev, stream);
  /* to the host: the stream's earlier work polled first (a pageable destination blocks in the copy) */
  if (dir == RF_DEVICE_COPY_DEVICE_TO_HOST) rf_device_cuda_sync_stream(dev, s);
  RF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind[dir], s));
  if (dir == RF_DEVICE_COPY_DEVICE_TO_HOST) rf_device_cuda_poll(dev, s, NULL);
}

static void rf_device_cuda_memset(struct rf_device *dev, void *dst, int value, size_t bytes,
                                  struct rf_device_stream *stream) {
  RF_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, rf_device_cuda_stream(dev, stream)));
}

static void rf_device_cuda_cast(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
                                enum rf_dtype src_dtype, size_t n, int accumulate,
                                struct rf_device_stream *stream) {
  cudaStream_t s = rf_device_cuda_stream(dev, stream);
  if (dst_dtype == RF_DTYPE_BF16)
    RF_CUDA_CHECK(rf_cuda_f32_to_bf16(dst, src, n, s));
  else if (src_dtype == RF_DTYPE_BF16)
    RF_CUDA_CHECK(rf_cuda_bf16_to_f32(dst, src, n, accumulate, s));
  else if (accumulate)
    RF_CUDA_CHECK(rf_cuda_f32_add(dst, src, n, s));
  else
    RF_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, s));
}

static void rf_device_cuda_scale(struct rf_device *dev, float *x, int64_t n, float s,
                                 struct rf_device_stream *stream) {
  RF_CUDA_CHECK(rf_cuda_scale(x, n, s, rf_device_cuda_stream(dev, stream)));
}

static double rf_device_cuda_sum_squares(struct rf_device *dev, const float *x, int64_t n,
                                         struct rf_device_stream *stream) {
  struct rf_device_cuda *c = rf_device_cuda_of(dev);
  cudaStream_t s = rf_device_cuda_stream(dev, stream);
  RF_CUDA_CHECK(rf_cuda_sum_squares(x, n, c->partial, c->sum, s));
  RF_CUDA_CHECK(cudaMemcpyAsync(&c->pinned->sum, c->sum, sizeof(double), cudaMemcpyDeviceToHost, s));
  rf_device_cuda_sync_stream(dev, s);
  return c->pinned->sum;
}

static void rf_device_cuda_sum_squares_add(struct rf_device *dev, double *acc, const float *x, int64_t n,
                                           struct rf_device_stream *stream) {
  struct rf_device_cuda *c = rf_device_cuda_of(dev);
  RF_CUDA_CHECK(rf_cuda_sum_squares_add(x, n, c->partial, acc, rf_device_cuda_stream(dev, stream)));
}

/* The kernel, then the first bad element's index read back: -1 with fp8.c's message
 * (the same element, "NaN" or "an infinity") when there is one. */
static void rf_device_cuda_add_f64(struct rf_device *dev, double *acc, const double *x, double c,
                                   struct rf_device_stream *stream) {
  RF_CUDA_CHECK(rf_cuda_add_f64(acc, x, c, rf_device_cuda_stream(dev, stream)));
}

static void rf_device_cuda_clip_factor(struct rf_device *dev, float *factor, const double *sumsq,
                                       double max_norm, struct rf_device_stream *stream) {
  RF_CUDA_CHECK(rf_cuda_clip_factor(factor, sumsq, max_norm, rf_device_cuda_stream(dev, stream)));
}

static int rf_device_cuda_fp8_quantize(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x,
                                       int pow2, const char *name, uint8_t *codes, float *scales,
                                       struct rf_device_stream *stream) {
  struct rf_device_cuda *c = rf_device_cuda_of(dev);
  cudaStream_t s = rf_device_cuda_stream(dev, stream);
  RF_CUDA_CHECK(
      rf_cuda_fp8_quantize(x, g->rows, g->cols, g->tile_rows, g->tile_cols, pow2, codes, scales, c->bad, s));
  const long long *first = &c->pinned->bad;
  RF_CUDA_CHECK(cudaMemcpyAsync(&c->pinned->bad, c->bad, sizeof(long long), cudaMemcpyDeviceToHost, s));
  rf_device_cuda_sync_stream(dev, s);
  if (*first == INT64_MAX) return 0;
  int64_t r, col;
  if (g->tile_cols == 1) {
    r = *first / g->cols;
    col = *first % g->cols;
  } else {
    int64_t per_tile = (int64_t)g->tile_rows * g->tile_cols, tile = *first / per_tile, in = *first % per_tile;
    int64_t tc = rf_fp8_grid_tile_cols(g);
    r = tile / tc * g->tile_rows + in / g->tile_cols;
    col = tile % tc * g->tile_cols + in % g->tile_cols;
  }
  RF_CUDA_CHECK(
      cudaMemcpyAsync(&c->pinned->value, x + r * g->cols + col, sizeof(float), cudaMemcpyDeviceToHost, s));
  rf_device_cuda_sync_stream(dev, s);
  float v = c->pinned->value;
  RF_FAIL("fp8: tensor '%s' holds %s at [%lld, %lld]: it cannot be quantized", name,
          isnan(v) ? "NaN" : "an infinity", (long long)r, (long long)col);
}

static struct rf_device_stream *rf_device_cuda_stream_create(struct rf_device *dev) {
  (void)dev;
  struct rf_device_stream *stream = rf_xcalloc(1, sizeof *stream);
  cudaStream_t s;
  RF_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream->handle = s;
  return stream;
}

static void rf_device_cuda_stream_free(struct rf_device *dev, struct rf_device_stream *stream) {
  (void)dev;
  RF_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)stream->handle));
  free(stream);
}

static void rf_device_cuda_stream_synchronize(struct rf_device *dev, struct rf_device_stream *stream) {
  rf_device_cuda_sync_stream(dev, rf_device_cuda_stream(dev, stream));
}

static void rf_device_cuda_event_create(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  cudaEvent_t e;
  RF_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  ev->handle = e;
}

static void rf_device_cuda_event_free(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  if (ev->handle) RF_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)ev->handle));
}

static void rf_device_cuda_event_record(struct rf_device *dev, struct rf_device_event *ev,
                                        struct rf_device_stream *stream) {
  RF_CUDA_CHECK(cudaEventRecord((cudaEvent_t)ev->handle, rf_device_cuda_stream(dev, stream)));
}

static void rf_device_cuda_stream_wait(struct rf_device *dev, struct rf_device_stream *stream,
                                       struct rf_device_event *ev) {
  RF_CUDA_CHECK(cudaStreamWaitEvent(rf_device_cuda_stream(dev, stream), (cudaEvent_t)ev->handle, 0));
}

static int rf_device_cuda_event_query(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev;
  cudaError_t rc = cudaEventQuery((cudaEvent_t)ev->handle);
  if (rc == cudaErrorNotReady) return 0;
  RF_CUDA_CHECK(rc);
  return 1;
}

static void rf_device_cuda_event_synchronize(struct rf_device *dev, struct rf_device_event *ev) {
  rf_device_cuda_of(dev)->stats.host_syncs++;
  rf_device_cuda_poll(dev, NULL, (cudaEvent_t)ev->handle);
}

static const struct rf_device_ops rf_device_cuda_ops = {
    .name = "cuda",
    .host_memory = 0,
    .free = rf_device_cuda_free,
    .alloc = rf_device_cuda_alloc,
    .release = rf_device_cuda_release,
    .copy = rf_device_cuda_copy,
    .memset = rf_device_cuda_memset,
    .cast = rf_device_cuda_cast,
    .scale = rf_device_cuda_scale,
    .sum_squares = rf_device_cuda_sum_squares,
    .sum_squares_add = rf_device_cuda_sum_squares_add,
    .add_f64 = rf_device_cuda_add_f64,
    .clip_factor = rf_device_cuda_clip_factor,
    .fp8_quantize = rf_device_cuda_fp8_quantize,
    .stream_create = rf_device_cuda_stream_create,
    .stream_free = rf_device_cuda_stream_free,
    .stream_synchronize = rf_device_cuda_stream_synchronize,
    .event_create = rf_device_cuda_event_create,
    .event_free = rf_device_cuda_event_free,
    .event_record = rf_device_cuda_event_record,
    .stream_wait = rf_device_cuda_stream_wait,
    .event_query = rf_device_cuda_event_query,
    .event_synchronize = rf_device_cuda_event_synchronize,
};

const char *rf_device_cuda_unavailable(void) {
  static char why[256];
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    snprintf(why, sizeof why, "no CUDA device (%s)",
             rc != cudaSuccess ? cudaGetErrorString(rc) : "none visible");
    return why;
  }
  return NULL;
}

int rf_device_cuda_count(void) {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

void rf_device_cuda_init(struct rf_device *dev, int ordinal, struct rf_counters *counters) {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) RF_DIE("no CUDA device: %s", cudaGetErrorString(rc));
  if (ordinal < 0 || ordinal >= count) RF_DIE("no CUDA device %d (%d visible)", ordinal, count);
  RF_CUDA_CHECK(cudaSetDevice(ordinal));
  struct rf_device_cuda *c = rf_xcalloc(1, sizeof *c);
  RF_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  RF_CUDA_CHECK(cudaMalloc(&c->scratch, (RF_CUDA_SUMSQ_BLOCKS + 2) * sizeof(double)));
  c->partial = c->scratch;
  c->sum = c->partial + RF_CUDA_SUMSQ_BLOCKS;
  c->bad = (void *)(c->sum + 1);
  void *pinned = NULL;
  RF_CUDA_CHECK(cudaMallocHost(&pinned, sizeof *c->pinned));
  c->pinned = pinned;
  c->stats.mallocs += 2;
  memset(dev, 0, sizeof *dev);
  dev->ops = &rf_device_cuda_ops;
  dev->impl = c;
  dev->ordinal = ordinal;
  dev->counters = counters;
}
