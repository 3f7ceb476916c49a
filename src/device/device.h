/* src/device: where memory lives and how work on it is ordered, behind one table
 * of operations (struct rf_device_ops, as src/comm's rf_comm_ops), so that the
 * arena, the DBuffer, the runtime and the optimizers never see which kind of
 * memory they hold.
 *
 * Backends. The host (device_host.c, rf_device_host_init) is the one the runtime
 * uses today: memory from the heap, the casts of src/core/dtype.c, the
 * FP8 tile quantizer of src/core/fp8.c, the runtime's sum of squares; a stream runs
 * its work at once, in the caller's thread, so an event recorded on it is complete
 * when recorded. The CUDA backend (device_cuda.c, rf_device_cuda_init in
 * device_cuda.h; make BACKEND=cuda only) fills the same table: cudaMalloc,
 * cudaMemcpyAsync on its streams, kernels beside it, cudaEvent_t.
 *
 * Pointers. A device pointer is a plain `void *` the caller never dereferences
 * unless the device is the host (ops->host_memory). The copy's direction says where
 * source and destination live.
 *
 * Events from outside. An event may be bound to a completion the device does not
 * know (rf_device_event_bind: a non-blocking MPI collective's request): querying it
 * tests that completion and synchronizing it waits for it. That is how the host
 * schedule's events are MPI requests; a CUDA comm backend records its events on
 * its own streams instead.
 *
 * Counting. The table counts nothing; the counted moves (rf_move_*, move.c) and
 * the allocations (rf_device_alloc, the arena) count into the device's counters,
 * which belong to whoever owns the device (a runtime context). */
#ifndef RF_DEVICE_H
#define RF_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

enum rf_device_copy {
  RF_DEVICE_COPY_HOST_TO_DEVICE = 0,
  RF_DEVICE_COPY_DEVICE_TO_HOST,
  RF_DEVICE_COPY_DEVICE_TO_DEVICE,
};

struct rf_device;
/* A queue of work run in order (host: run at once). Owned by whoever created it
 * (rf_device_stream_create/free); `handle` is the backend's (CUDA: a cudaStream_t). */
struct rf_device_stream {
  void *handle;
  struct rf_device *dev; /* borrowed: the device it belongs to (set by rf_device_stream_create) */
};

/* A point in a stream's work, or an outside completion bound to it. Owned by its
 * creator (rf_device_event_create/free); `handle` is the backend's (CUDA: a
 * cudaEvent_t), unused on the host. */
struct rf_device_event {
  void *handle;
  int (*test)(void *arg);  /* bound: 1 when the outside work has finished (drives its progress) */
  void (*wait)(void *arg); /* bound: blocks until it has finished */
  void *arg;               /* borrowed: what test and wait take (a comm request) */
};

/* What one backend does. `stream`: where the work is queued, named by the caller (the runtime's
 * streams: compute, gather, reduce, replicate); the host runs it at once whatever the stream (NULL
 * allowed: the host's unit tests); a device whose work is asynchronous (cuda, checked) refuses NULL
 * (dies naming the operation): there is no default stream to mean. Failures
 * (out of memory, a driver error) stop every rank (rf_die) naming the file and line. */
struct rf_device_ops {
  const char *name;
  int host_memory; /* 1: its pointers are host pointers (the caller may read them) */
  void (*free)(struct rf_device *dev);
  /* `bytes` bytes aligned to `align` (a power of two), zero-filled; release with release. */
  void *(*alloc)(struct rf_device *dev, size_t bytes, size_t align);
  void (*release)(struct rf_device *dev, void *ptr);
  void (*copy)(struct rf_device *dev, void *dst, const void *src, size_t bytes, enum rf_device_copy dir,
               struct rf_device_stream *stream);
  void (*memset)(struct rf_device *dev, void *dst, int value, size_t bytes, struct rf_device_stream *stream);
  /* dst (dst_dtype) = src (src_dtype), n elements, both on the device: f32 -> f32 | bf16, bf16 -> f32; with
   * accumulate (an f32 destination only) dst += src. bf16 rounds to nearest even, NaN stays NaN. */
  void (*cast)(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
               enum rf_dtype src_dtype, size_t n, int accumulate, struct rf_device_stream *stream);
  /* x[i] *= s, i < n. */
  void (*scale)(struct rf_device *dev, float *x, int64_t n, float s, struct rf_device_stream *stream);
  /* The sum of x[i]^2 in f64 (a NaN or an infinity makes it non-finite); returns to the host, so it
   * waits for the stream's work. */
  double (*sum_squares)(struct rf_device *dev, const float *x, int64_t n, struct rf_device_stream *stream);
  /* *acc (one f64 of device memory) += that sum, on the stream: nothing returns to the host, so it
   * does not wait (the gradient norm adds every piece, then copies the total once). */
  void (*sum_squares_add)(struct rf_device *dev, double *acc, const float *x, int64_t n,
                          struct rf_device_stream *stream);
  /* *acc = *acc + (*x + c), one f64 each of device memory (the host's order: x + c first), on the
   * stream, no wait: a step's loss summed over its micro-batches on the device. */
  void (*add_f64)(struct rf_device *dev, double *acc, const double *x, double c,
                  struct rf_device_stream *stream);
  /* The clip factor of the gradient norm sqrt(*sumsq) (f64 device memory) into *factor (f32 device
   * memory), on the stream, no wait: NaN when the norm is not finite (the update is skipped), else
   * (float)(max_norm / (norm + 1e-6)) when max_norm > 0 and norm > max_norm, else 1 (f64 arithmetic as
   * rf_fsdp_clip_grads computes it on the host: the same bits). */
  void (*clip_factor)(struct rf_device *dev, float *factor, const double *sumsq, double max_norm,
                      struct rf_device_stream *stream);
  /* rf_fp8_quantize (src/core/fp8.c) on device memory: codes and one scale per tile of g; -1 (naming
   * `name` and the element) when x holds a NaN or an infinity. */
  int (*fp8_quantize)(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x, int pow2,
                      const char *name, uint8_t *codes, float *scales, struct rf_device_stream *stream);
  struct rf_device_stream *(*stream_create)(struct rf_device *dev);
  void (*stream_free)(struct rf_device *dev, struct rf_device_stream *stream);
  void (*stream_synchronize)(struct rf_device *dev, struct rf_device_stream *stream);
  void (*event_create)(struct rf_device *dev, struct rf_device_event *ev);
  void (*event_free)(struct rf_device *dev, struct rf_device_event *ev);
  /* ev marks the point of `stream` reached so far. */
  void (*event_record)(struct rf_device *dev, struct rf_device_event *ev, struct rf_device_stream *stream);
  /* Work queued on `stream` after this runs only after ev (the host thread does not block). */
  void (*stream_wait)(struct rf_device *dev, struct rf_device_stream *stream, struct rf_device_event *ev);
  int (*event_query)(struct rf_device *dev, struct rf_device_event *ev); /* 1 when reached */
  void (*event_synchronize)(struct rf_device *dev, struct rf_device_event *ev);
  /* Host code on device memory, in stream order: fn(a copy of arg, arg_bytes bytes taken at the
   * call) runs after the work queued on `stream` before it and before the work queued after it;
   * fn reaches device memory only through view. host: runs at once; checked: on the stream's
   * worker. NULL where the device cannot run host code on its memory (CUDA): its kernels do. */
  void (*launch)(struct rf_device *dev, struct rf_device_stream *stream, void (*fn)(void *arg),
                 const void *arg, size_t arg_bytes);
  /* Where host code launched on the device reaches device pointer ptr (host: ptr itself;
   * checked: the second mapping); NULL where launch is NULL. */
  void *(*view)(const struct rf_device *dev, const void *ptr);
};

struct rf_backend; /* backend/backend.h */

/* Who is told while the host waits for a device whose work runs elsewhere (CUDA polls its
 * blocking reads and synchronizations: device_cuda.c), so that a wait held by work queued on
 * the device's streams by someone else (an NCCL collective that never completes: a peer gone,
 * a broken link) is seen: poll(arg, since_ns) at every poll of a wait that did not end at its
 * first look (since_ns: when the host began waiting; poll may stop the job), done(arg) when
 * such a wait ends. Set by whoever queues such work (src/comm's NCCL backend: its errors and
 * the collective watchdog), one per device; poll NULL: none. */
struct rf_device_waiter {
  void (*poll)(void *arg, uint64_t since_ns);
  void (*done)(void *arg);
  void *arg; /* borrowed */
};

/* A device. Owns `impl` (released by rf_device_free); `counters` is borrowed. */
struct rf_device {
  const struct rf_device_ops *ops;  /* static table of the backend */
  void *impl;                       /* owned: the backend's state (host: none) */
  int ordinal;                      /* which device of its kind (host: 0) */
  struct rf_counters *counters;     /* borrowed: where moves and allocations count; NULL: nowhere */
  const struct rf_backend *backend; /* static: what opened it (rf_backend_open); NULL: a bare table */
  struct rf_device_waiter waiter;   /* told during the host's waits (rf_device_set_waiter); none: zero */
};

/* Sets (w) or clears (NULL) the device's waiter. */
void rf_device_set_waiter(struct rf_device *dev, const struct rf_device_waiter *w);

/* The host device, counting into `counters` (may be NULL). Nothing to free, but
 * rf_device_free is harmless. */
void rf_device_host_init(struct rf_device *dev, struct rf_counters *counters);
void rf_device_free(struct rf_device *dev);
/* The checked device (device_checked.c): the host's arithmetic on memory the host cannot read
 * (a PROT_NONE reservation; the bytes in a second mapping) with streams that run late on
 * worker threads and real events; every operation needs a stream. Released by rf_device_free
 * (its streams freed first). */
void rf_device_checked_init(struct rf_device *dev, int ordinal, struct rf_counters *counters);
/* Where the checked device keeps the bytes of device pointer `ptr` (the backend's mapping, its
 * ops->view); dies when ptr is not device memory of dev. */
void *rf_device_checked_view(const struct rf_device *dev, const void *ptr);

/* The table's operations, with argument checks (the table does none). */
void *rf_device_alloc(struct rf_device *dev, size_t bytes, size_t align); /* counted as an allocation */
void rf_device_release(struct rf_device *dev, void *ptr);                 /* NULL allowed */
void rf_device_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes, enum rf_device_copy dir,
                    struct rf_device_stream *stream);
void rf_device_memset(struct rf_device *dev, void *dst, int value, size_t bytes,
                      struct rf_device_stream *stream);
void rf_device_cast(struct rf_device *dev, void *dst, enum rf_dtype dst_dtype, const void *src,
                    enum rf_dtype src_dtype, size_t n, int accumulate, struct rf_device_stream *stream);
void rf_device_scale(struct rf_device *dev, float *x, int64_t n, float s, struct rf_device_stream *stream);
double rf_device_sum_squares(struct rf_device *dev, const float *x, int64_t n,
                             struct rf_device_stream *stream);
void rf_device_sum_squares_add(struct rf_device *dev, double *acc, const float *x, int64_t n,
                               struct rf_device_stream *stream); /* not a wait */
void rf_device_add_f64(struct rf_device *dev, double *acc, const double *x, double c,
                       struct rf_device_stream *stream); /* not a wait */
void rf_device_clip_factor(struct rf_device *dev, float *factor, const double *sumsq, double max_norm,
                           struct rf_device_stream *stream); /* not a wait */
/* The host's arithmetic of clip_factor (every backend's reference). */
float rf_device_clip_factor_of(double sumsq, double max_norm);
int rf_device_fp8_quantize(struct rf_device *dev, const struct rf_fp8_grid *g, const float *x, int pow2,
                           const char *name, uint8_t *codes, float *scales, struct rf_device_stream *stream);

struct rf_device_stream *rf_device_stream_create(struct rf_device *dev);
void rf_device_stream_free(struct rf_device *dev, struct rf_device_stream *stream); /* NULL allowed */
void rf_device_stream_synchronize(struct rf_device *dev, struct rf_device_stream *stream);
void rf_device_event_create(struct rf_device *dev, struct rf_device_event *ev);
void rf_device_event_free(struct rf_device *dev, struct rf_device_event *ev);
void rf_device_event_record(struct rf_device *dev, struct rf_device_event *ev,
                            struct rf_device_stream *stream);
/* A bound event cannot be waited on by a stream without the host: the host waits for it. */
void rf_device_stream_wait(struct rf_device *dev, struct rf_device_stream *stream,
                           struct rf_device_event *ev);
/* Binds ev to an outside completion (test and wait take arg); rf_device_event_record unbinds. */
void rf_device_event_bind(struct rf_device_event *ev, int (*test)(void *arg), void (*wait)(void *arg),
                          void *arg);
int rf_device_event_query(struct rf_device *dev, struct rf_device_event *ev);
void rf_device_event_synchronize(struct rf_device *dev, struct rf_device_event *ev);

/* Host code on device memory (ops->launch, ops->view): how the cpu and checked backends run the
 * step's host kernels in stream order. rf_device_runs_host_code says whether dev can;
 * rf_device_launch dies naming `what` where it cannot (a CUDA device: a kernel must do it).
 * rf_device_view is for launched code only (or after the stream is synchronized); NULL stays
 * NULL. The stream_ forms take the device from the stream (a kernel table gets a stream only). */
int rf_device_runs_host_code(const struct rf_device *dev);
void rf_device_launch(struct rf_device *dev, struct rf_device_stream *stream, const char *what,
                      void (*fn)(void *arg), const void *arg, size_t arg_bytes);
void *rf_device_view(const struct rf_device *dev, const void *ptr);
void rf_device_stream_launch(struct rf_device_stream *stream, const char *what, void (*fn)(void *arg),
                             const void *arg, size_t arg_bytes);
void *rf_device_stream_view(const struct rf_device_stream *stream, const void *ptr);

/* ---- arena (arena.c) ------------------------------------------------------
 * A bump allocator over one slab of device memory reserved at init. Owns the
 * slab; views returned by rf_arena_alloc are borrowed and valid until
 * rf_arena_reset/rf_arena_free. Allocation beyond the capacity is a programming
 * error (dies). Each rf_arena_alloc counts one allocation on the device. */
struct rf_arena {
  struct rf_device *dev;           /* borrowed */
  struct rf_device_stream *stream; /* borrowed: where an allocation's zero-fill is queued */
  uint8_t *base;                   /* owned, 64-byte aligned, device memory */
  size_t capacity;                 /* bytes */
  size_t used;                     /* bytes */
  size_t peak;                     /* largest `used` seen */
  size_t allocs;                   /* rf_arena_alloc calls since init */
};

void rf_arena_init(struct rf_arena *arena, struct rf_device *dev, size_t capacity,
                   struct rf_device_stream *stream);
void rf_arena_free(struct rf_arena *arena);
/* Returns `bytes` bytes aligned to `align` (a power of two), zero-filled. */
void *rf_arena_alloc(struct rf_arena *arena, size_t bytes, size_t align);
/* Mark and release: everything allocated after `mark` is given back. */
size_t rf_arena_mark(const struct rf_arena *arena);
void rf_arena_release(struct rf_arena *arena, size_t mark);
void rf_arena_reset(struct rf_arena *arena);

/* ---- counted data movement (move.c) ---------------------------------------
 * Every local copy, conversion and own-shard write of the library goes through
 * these functions, which run on the device (on the stream the caller names) and count each
 * kind of byte into its counters in one place (the collectives' payloads are
 * counted in src/comm/comm.c):
 *   bytes_copied     rf_move_copy; rf_move_zero (zeroes written into a buffer a
 *                    collective sends); a conversion between equal dtypes (f32)
 *   bytes_cast       a conversion between f32 and bf16 (the bytes written); also the
 *                    e4m3 codes and scales of FP8 tensors quantized after a gather
 *                    (the fsdp2 and flat layouts, src/dbuffer/dbuffer.c)
 *   bytes_own_shard  rf_move_own_shard: this rank's master shard written into its
 *                    range of the buffer an in-place all-gather fills; every layout
 *                    does it once per gather (a copy in f32, a cast in bf16) */
void rf_move_copy(struct rf_device *dev, void *dst, const void *src, size_t bytes,
                  struct rf_device_stream *stream);
void rf_move_zero(struct rf_device *dev, void *dst, size_t bytes, struct rf_device_stream *stream);
/* dst (dtype: f32 or bf16) = src (f32), n elements. */
void rf_move_convert(struct rf_device *dev, void *dst, enum rf_dtype dtype, const float *src, size_t n,
                     struct rf_device_stream *stream);
/* dst (f32) = src (dtype: f32 or bf16), or += with accumulate; counts the f32 bytes written. */
void rf_move_convert_back(struct rf_device *dev, float *dst, const void *src, enum rf_dtype dtype, size_t n,
                          int accumulate, struct rf_device_stream *stream);
/* As rf_move_convert, counted as bytes_own_shard. */
void rf_move_own_shard(struct rf_device *dev, void *dst, enum rf_dtype dtype, const float *src, size_t n,
                       struct rf_device_stream *stream);
/* Adds to one of the device's counters (NULL counters: nothing). */
#define RF_DEVICE_COUNT(dev, field, n)                            \
  do {                                                            \
    if ((dev)->counters) (dev)->counters->field += (uint64_t)(n); \
  } while (0)

/* The device of the rank `local_rank` of its node (counted from 0) among `devices` devices:
 * local_rank modulo devices, so a node of as many ranks as GPUs gives each rank its own and a
 * node of more ranks than GPUs (tests) puts ranks k, k+devices, ... on device k. A rule of
 * devices, below src/comm (whose NCCL lanes use it) and src/backend (the runtime's choice). */
int rf_device_ordinal(int local_rank, int devices);

#endif
