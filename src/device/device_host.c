/* The host device: memory from the heap, work run at once in the calling thread.
 * Its operations are the code the library ran before the device table: the casts
 * of src/core/dtype.c, the FP8 tile quantizer of src/core/fp8.c, the runtime's
 * gradient scaling and sum of squares (src/fsdp/grads.c). A stream is a name for
 * "now": an event recorded on one is reached when recorded. */
#include <stdlib.h>

#include "device/device.h"

static void rf_device_host_free(struct rf_device *dev) { (void)dev; }

/* Not rf_xaligned: rf_device_alloc counts the allocation on the device, once. */
static void *rf_device_host_alloc(struct rf_device *dev, size_t bytes, size_t align) {
  (void)dev;
  void *p = NULL;
  size_t rounded = (bytes + align - 1) / align * align;
  int rc = posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, rounded ? rounded : align);
  if (rc != 0)
    RF_DIE("host device: out of memory allocating %zu bytes (align %zu): %s", bytes, align, strerror(rc));
  memset(p, 0, bytes);
  rf_xalloc_note_bytes(bytes);
  return p;
}

static void rf_device_host_release(struct rf_device *dev, void *ptr) {
  (void)dev;
  free(ptr);
}

static void rf_device_host_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes,
                                enum rf_device_copy dir, struct rf_device_stream *stream) {
  (void)dev, (void)dir, (void)stream;
  memcpy(dst, src, bytes);
}

static void rf_device_host_memset(struct rf_device *dev, void *dst, int value, size_t bytes,
                                  struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  memset(dst, value, bytes);
}

static void rf_device_host_cast(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
                                enum rf_dtype src_dtype, size_t n, int accumulate,
                                struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  if (dst_dtype == RF_DTYPE_BF16) {
    rf_bf16_from_f32_n(dst, src, n);
  } else if (src_dtype == RF_DTYPE_F32) {
    float *d = dst;
    const float *s = src;
    if (accumulate)
      for (size_t i = 0; i < n; i++) d[i] += s[i];
    else
      memcpy(d, s, n * sizeof(float));
  } else {
    float *d = dst;
    const uint16_t *s = src;
    if (accumulate)
      for (size_t i = 0; i < n; i++) d[i] += rf_f32_from_bf16(s[i]);
    else
      rf_f32_from_bf16_n(d, s, n);
  }
}

static void rf_device_host_scale_chunk(float *restrict g, int64_t n, float s) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) g[i] *= s;
}

/* Chunks on the threads, each a simd loop (a combined "parallel for simd" over
 * captured pointers does not vectorize under clang with -fno-strict-aliasing). */
static void rf_device_host_scale(struct rf_device *dev, float *x, int64_t n, float s,
                                 struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  const int64_t chunk = 65536, chunks = rf_ceil_div(n, chunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; c++)
    rf_device_host_scale_chunk(x + c * chunk, rf_min_i64(chunk, n - c * chunk), s);
}

static double rf_device_host_sum_squares(struct rf_device *dev, const float *x, int64_t n,
                                         struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; i++) acc += (double)x[i] * (double)x[i];
  return acc;
}

static void rf_device_host_sum_squares_add(struct rf_device *dev, double *acc, const float *x, int64_t n,
                                           struct rf_device_stream *stream) {
  *acc += rf_device_host_sum_squares(dev, x, n, stream);
}

static void rf_device_host_add_f64(struct rf_device *dev, double *acc, const double *x, double c,
                                   struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  *acc += *x + c;
}

static void rf_device_host_clip_factor(struct rf_device *dev, float *factor, const double *sumsq,
                                       double max_norm, struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  *factor = rf_device_clip_factor_of(*sumsq, max_norm);
}

static int rf_device_host_fp8_quantize(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x,
                                       int pow2, const char *name, uint8_t *codes, float *scales,
                                       struct rf_device_stream *stream) {
  (void)dev, (void)stream;
  return rf_fp8_quantize(g, x, pow2, name, codes, scales);
}

static struct rf_device_stream *rf_device_host_stream_create(struct rf_device *dev) {
  (void)dev;
  return rf_xcalloc(1, sizeof(struct rf_device_stream));
}

static void rf_device_host_stream_free(struct rf_device *dev, struct rf_device_stream *stream) {
  (void)dev;
  free(stream);
}

/* Work on a host stream has finished when it returns: nothing to wait for. */
static void rf_device_host_stream_synchronize(struct rf_device *dev, struct rf_device_stream *stream) {
  (void)dev, (void)stream;
}

static void rf_device_host_event_nop(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev, (void)ev;
}

static void rf_device_host_event_record(struct rf_device *dev, struct rf_device_event *ev,
                                        struct rf_device_stream *stream) {
  (void)dev, (void)ev, (void)stream;
}

static void rf_device_host_stream_wait(struct rf_device *dev, struct rf_device_stream *stream,
                                       struct rf_device_event *ev) {
  (void)dev, (void)stream, (void)ev;
}

static int rf_device_host_event_query(struct rf_device *dev, struct rf_device_event *ev) {
  (void)dev, (void)ev;
  return 1;
}

/* At once, on a copy of arg (as a queued launch would get): on the stack up to 512 bytes (a step's
 * launches allocate nothing), else on the heap. */
static void rf_device_host_launch(struct rf_device *dev, struct rf_device_stream *stream,
                                  void (*fn)(void *arg), const void *arg, size_t arg_bytes) {
  (void)dev, (void)stream;
  _Alignas(64) unsigned char small[512];
  void *copy = arg_bytes <= sizeof small ? (void *)small : rf_xmalloc(arg_bytes);
  if (arg_bytes) memcpy(copy, arg, arg_bytes);
  fn(copy);
  if (copy != (void *)small) free(copy);
}

static void *rf_device_host_view(const struct rf_device *dev, const void *ptr) {
  (void)dev;
  union {
    const void *in;
    void *out;
  } u = {.in = ptr}; /* the const goes: a view is written through */
  return u.out;
}

static const struct rf_device_ops rf_device_host_ops = {
    .name = "host",
    .host_memory = 1,
    .free = rf_device_host_free,
    .alloc = rf_device_host_alloc,
    .release = rf_device_host_release,
    .copy = rf_device_host_copy,
    .memset = rf_device_host_memset,
    .cast = rf_device_host_cast,
    .scale = rf_device_host_scale,
    .sum_squares = rf_device_host_sum_squares,
    .sum_squares_add = rf_device_host_sum_squares_add,
    .add_f64 = rf_device_host_add_f64,
    .clip_factor = rf_device_host_clip_factor,
    .fp8_quantize = rf_device_host_fp8_quantize,
    .stream_create = rf_device_host_stream_create,
    .stream_free = rf_device_host_stream_free,
    .stream_synchronize = rf_device_host_stream_synchronize,
    .event_create = rf_device_host_event_nop,
    .event_free = rf_device_host_event_nop,
    .event_record = rf_device_host_event_record,
    .stream_wait = rf_device_host_stream_wait,
    .event_query = rf_device_host_event_query,
    .event_synchronize = rf_device_host_event_nop,
    .launch = rf_device_host_launch,
    .view = rf_device_host_view,
};

void rf_device_host_init(struct rf_device *dev, struct rf_counters *counters) {
  memset(dev, 0, sizeof *dev);
  dev->ops = &rf_device_host_ops;
  dev->counters = counters;
}
