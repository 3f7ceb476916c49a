/* The backend-independent half of the device: argument checks, allocation
 * counting and outside-bound events, then the backend's table. */
#include "device/device.h"

#include <math.h>

void rf_device_free(struct rf_device *dev) {
  if (dev->ops && dev->ops->free) dev->ops->free(dev);
  memset(dev, 0, sizeof *dev);
}

void rf_device_set_waiter(struct rf_device *dev, const struct rf_device_waiter *w) {
  if (w)
    dev->waiter = *w;
  else
    memset(&dev->waiter, 0, sizeof dev->waiter);
}

void *rf_device_alloc(struct rf_device *dev, size_t bytes, size_t align) {
  RF_ASSERT(align > 0 && (align & (align - 1)) == 0);
  void *p = dev->ops->alloc(dev, bytes, align);
  RF_DEVICE_COUNT(dev, allocations, 1);
  return p;
}

void rf_device_release(struct rf_device *dev, void *ptr) {
  if (ptr) dev->ops->release(dev, ptr);
}

void rf_device_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes, enum rf_device_copy dir,
                    struct rf_device_stream *stream) {
  RF_ASSERT(dir == RF_DEVICE_COPY_HOST_TO_DEVICE || dir == RF_DEVICE_COPY_DEVICE_TO_HOST ||
            dir == RF_DEVICE_COPY_DEVICE_TO_DEVICE);
  if (!bytes) return;
  dev->ops->copy(dev, dst, src, bytes, dir, stream);
  if (dir == RF_DEVICE_COPY_DEVICE_TO_HOST) RF_DEVICE_COUNT(dev, host_syncs, 1);
}

void rf_device_memset(struct rf_device *dev, void *dst, int value, size_t bytes,
                      struct rf_device_stream *stream) {
  if (bytes) dev->ops->memset(dev, dst, value, bytes, stream);
}

void rf_device_cast(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
                    enum rf_dtype src_dtype, size_t n, int accumulate, struct rf_device_stream *stream) {
  RF_ASSERT(dst_dtype == RF_DTYPE_F32 || dst_dtype == RF_DTYPE_BF16);
  RF_ASSERT(src_dtype == RF_DTYPE_F32 || src_dtype == RF_DTYPE_BF16);
  RF_ASSERT(src_dtype == RF_DTYPE_F32 || dst_dtype == RF_DTYPE_F32); /* no bf16 -> bf16 */
  RF_ASSERT(!accumulate || dst_dtype == RF_DTYPE_F32);
  if (n) dev->ops->cast(dev, dst, dst_dtype, src, src_dtype, n, accumulate, stream);
}

void rf_device_scale(struct rf_device *dev, float *x, int64_t n, float s, struct rf_device_stream *stream) {
  RF_ASSERT(n >= 0);
  if (n) dev->ops->scale(dev, x, n, s, stream);
}

double rf_device_sum_squares(struct rf_device *dev, const float *x, int64_t n,
                             struct rf_device_stream *stream) {
  RF_ASSERT(n >= 0);
  if (!n) return 0.0;
  RF_DEVICE_COUNT(dev, host_syncs, 1);
  return dev->ops->sum_squares(dev, x, n, stream);
}

void rf_device_sum_squares_add(struct rf_device *dev, double *acc, const float *x, int64_t n,
                               struct rf_device_stream *stream) {
  RF_ASSERT(n >= 0 && acc);
  if (n) dev->ops->sum_squares_add(dev, acc, x, n, stream);
}

void rf_device_add_f64(struct rf_device *dev, double *acc, const double *x, double c,
                       struct rf_device_stream *stream) {
  RF_ASSERT(acc && x);
  dev->ops->add_f64(dev, acc, x, c, stream);
}

void rf_device_clip_factor(struct rf_device *dev, float *factor, const double *sumsq, double max_norm,
                           struct rf_device_stream *stream) {
  RF_ASSERT(factor && sumsq);
  dev->ops->clip_factor(dev, factor, sumsq, max_norm, stream);
}

float rf_device_clip_factor_of(double sumsq, double max_norm) {
  double norm = sqrt(sumsq);
  if (!isfinite(norm)) return NAN;
  if (!(max_norm > 0) || norm <= max_norm) return 1.0f;
  return (float)(max_norm / (norm + 1e-6));
}

int rf_device_fp8_quantize(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x, int pow2,
                           const char *name, uint8_t *codes, float *scales, struct rf_device_stream *stream) {
  RF_ASSERT(g->rows >= 0 && g->cols >= 0 && g->tile_rows > 0 && g->tile_cols > 0);
  RF_DEVICE_COUNT(dev, host_syncs, 1);
  return dev->ops->fp8_quantize(dev, g, x, pow2, name, codes, scales, stream);
}

struct rf_device_stream *rf_device_stream_create(struct rf_device *dev) {
  struct rf_device_stream *s = dev->ops->stream_create(dev);
  s->dev = dev;
  return s;
}

void rf_device_stream_free(struct rf_device *dev, struct rf_device_stream *stream) {
  if (stream) dev->ops->stream_free(dev, stream);
}

void rf_device_stream_synchronize(struct rf_device *dev, struct rf_device_stream *stream) {
  RF_DEVICE_COUNT(dev, host_syncs, 1);
  dev->ops->stream_synchronize(dev, stream);
}

void rf_device_event_create(struct rf_device *dev, struct rf_device_event *ev) {
  memset(ev, 0, sizeof *ev);
  dev->ops->event_create(dev, ev);
}

void rf_device_event_free(struct rf_device *dev, struct rf_device_event *ev) {
  dev->ops->event_free(dev, ev);
  memset(ev, 0, sizeof *ev);
}

void rf_device_event_record(struct rf_device *dev, struct rf_device_event *ev,
                            struct rf_device_stream *stream) {
  ev->test = NULL;
  ev->wait = NULL;
  ev->arg = NULL;
  dev->ops->event_record(dev, ev, stream);
}

void rf_device_event_bind(struct rf_device_event *ev, int (*test)(void *arg), void (*wait)(void *arg),
                          void *arg) {
  RF_ASSERT(test && wait);
  ev->test = test;
  ev->wait = wait;
  ev->arg = arg;
}

void rf_device_stream_wait(struct rf_device *dev, struct rf_device_stream *stream,
                           struct rf_device_event *ev) {
  if (ev->wait)
    ev->wait(ev->arg);
  else
    dev->ops->stream_wait(dev, stream, ev);
}

int rf_device_event_query(struct rf_device *dev, struct rf_device_event *ev) {
  return ev->test ? ev->test(ev->arg) : dev->ops->event_query(dev, ev);
}

void rf_device_event_synchronize(struct rf_device *dev, struct rf_device_event *ev) {
  if (ev->wait) {
    ev->wait(ev->arg); /* an outside completion (MPI): the host waits for the network, not the device */
  } else {
    RF_DEVICE_COUNT(dev, host_syncs, 1);
    dev->ops->event_synchronize(dev, ev);
  }
}

int rf_device_runs_host_code(const struct rf_device *dev) { return dev->ops->launch != NULL; }

void rf_device_launch(struct rf_device *dev, struct rf_device_stream *stream, const char *what,
                      void (*fn)(void *arg), const void *arg, size_t arg_bytes) {
  if (!dev->ops->launch)
    RF_DIE("device %s: %s runs host code on device memory, which this device cannot (it needs a kernel)",
           dev->ops->name, what);
  dev->ops->launch(dev, stream, fn, arg, arg_bytes);
}

void *rf_device_view(const struct rf_device *dev, const void *ptr) {
  if (!ptr) return NULL;
  RF_ASSERT(dev->ops->view);
  return dev->ops->view(dev, ptr);
}

void rf_device_stream_launch(struct rf_device_stream *stream, const char *what, void (*fn)(void *arg),
                             const void *arg, size_t arg_bytes) {
  RF_ASSERT(stream && stream->dev);
  rf_device_launch(stream->dev, stream, what, fn, arg, arg_bytes);
}

void *rf_device_stream_view(const struct rf_device_stream *stream, const void *ptr) {
  RF_ASSERT(stream && stream->dev);
  return rf_device_view(stream->dev, ptr);
}

int rf_device_ordinal(int local_rank, int devices) {
  RF_ASSERT(local_rank >= 0 && devices >= 1);
  return local_rank % devices;
}
