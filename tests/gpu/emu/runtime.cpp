/* cuda-emu's CUDA runtime on the CPU (cuda_runtime_api.h), strict where CUDA is
 * lenient:
 *
 * Device memory: cudaMalloc hands out addresses in a reservation that is never
 * readable (PROT_NONE), so host code that reads or writes device memory faults at
 * once, and the fault handler names the allocation. The stand-in reaches the bytes
 * through a second reservation at a fixed distance (view()): copies, memsets, kernels
 * (their pointer arguments are translated at the launch), cuBLASLt and NCCL. Each
 * allocation ends at a page boundary (its size rounded to 256 bytes) with an
 * unreadable page after it, and is filled with 0xff bytes (NaN) as it is handed out;
 * freed memory becomes unreadable and its addresses are never handed out again.
 * Pinned host memory (cudaMallocHost, cudaHostAlloc) is host memory that kernels may
 * also reach; cudaPointerGetAttributes tells the three apart truthfully.
 *
 * Copies: the kind must match where the pointers are (a host-to-device copy whose
 * source is device memory is refused, naming both), device ranges must lie in one live
 * allocation, memsets only on device memory. Asynchrony as CUDA documents it: a copy
 * from pageable memory takes its source at the call and returns; a copy into pageable
 * memory waits for the copy; with pinned memory cudaMemcpyAsync returns at once and
 * the host must synchronize before reading; cudaMemcpy from pinned memory waits, from
 * pageable memory returns once the source is staged; device-to-device copies and
 * memsets never wait.
 *
 * Streams: each stream (and each device's legacy default stream, handle 0) is a worker
 * thread that runs its queue in order, sleeping a random while (RF_EMU_DELAY_US) before
 * some operations so work runs later than the host asked. CUDA's legacy rules: work on
 * the legacy stream waits for all work queued before on the device's blocking streams,
 * and work on a blocking stream waits for the legacy stream's; streams created with
 * cudaStreamNonBlocking wait for neither. Events are real: cudaEventRecord marks a
 * point of a stream, cudaStreamWaitEvent makes a stream wait for it without the host,
 * cudaEventQuery and cudaEventSynchronize see it; timing only without
 * cudaEventDisableTiming. Host waits are counted (rf_emu_get_stats). A stream, event
 * or allocation used after its destruction, or a stream used from a thread whose
 * current device (cudaSetDevice) is not the stream's, is refused.
 *
 * Kernels: launch limits checked (block at most 1024 threads and 1024 x 1024 x 64,
 * grid x < 2^31, y and z < 65536, dynamic shared memory above 48 KiB only up to what
 * cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) allowed, at most
 * sm_90's 227 KiB); a refused launch is the thread's last error and does not run; a
 * launched kernel runs on its stream's worker (block.cpp). RF_EMU_LAUNCHES=1 prints the
 * process's launches at exit, in all and per kernel name (a step's launch count). */
#include <errno.h>
#include <execinfo.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "emu.h"

#define RF_EMU_PAGE 4096u
#define RF_EMU_DEVICE_SPAN (64ull << 30) /* address space per device */
#define RF_EMU_MAX_DEVICES 8
#define RF_EMU_TRAP_SPAN (64ull << 30)  /* where kernels see pageable host pointers */
#define RF_EMU_SMEM_DEFAULT (48u << 10) /* shared memory a block gets without opting in */
#define RF_EMU_SMEM_OPTIN (227u << 10)  /* sm_90's sharedMemPerBlockOptin */

struct rf_emu_stream;
struct rf_emu_event;

namespace rf_emu {

struct counters stats;
void count(uint64_t *counter, uint64_t n) { __atomic_fetch_add(counter, n, __ATOMIC_RELAXED); }

namespace {

__thread cudaError_t tls_last_error = cudaSuccess;
__thread int tls_device = 0;

uint64_t now_ns() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

}  // namespace

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  unsigned long long x = strtoull(v, &end, 10);
  if (*end) die("%s=%s is not a number", name, v);
  return x;
}

void die(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-emu: %s\n", msg);
  fflush(NULL);
  _exit(134); /* as abort() would, without a core file */
}

cudaError_t fail(cudaError_t e, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "cuda-emu: %s (%s)\n", msg, cudaGetErrorName(e));
  fflush(stderr);
  tls_last_error = e;
  return e;
}

/* ---- the state: never destroyed (worker threads may outlive main's return) ---- */

struct op {
  std::function<void()> work;
  const char *what;
  std::vector<std::pair<struct stream *, uint64_t>> deps; /* run after these points of other streams */
  uint64_t seq;
};

struct stream {
  int device;
  int legacy;       /* the device's legacy default stream */
  int non_blocking; /* cudaStreamNonBlocking */
  int destroyed;
  uint64_t id;
  uint64_t queued, done; /* operations queued and finished (their seq numbers) */
  uint64_t launches;
  std::deque<op> q;
  std::condition_variable work;
};

}  // namespace rf_emu

struct rf_emu_stream : rf_emu::stream {};
struct rf_emu_event {
  int device;
  unsigned flags;
  int destroyed;
  int recorded;
  rf_emu::stream *s;
  uint64_t seq;
  uint64_t when_ns; /* timing events: when the marker ran */
};

namespace rf_emu {

namespace {

struct allocation {
  size_t size;
  int device;
};

struct state {
  std::mutex mu;
  std::condition_variable progress; /* an operation finished somewhere */
  char *device_base;                /* RF_EMU_MAX_DEVICES spans, never readable */
  char *view_base;                  /* the same layout, readable where allocated */
  char *trap_base;                  /* never readable: pageable host pointers as kernels see them */
  uint64_t next[RF_EMU_MAX_DEVICES];
  std::map<uintptr_t, allocation> allocs; /* device allocations by address */
  std::map<uintptr_t, size_t> pinned;     /* pinned host allocations */
  std::set<stream *> streams;             /* live ones */
  std::set<rf_emu_event *> events;        /* live ones */
  stream *legacy[RF_EMU_MAX_DEVICES];
  std::map<const void *, int> max_dynamic_smem; /* cudaFuncSetAttribute */
  std::map<std::string, uint64_t> launches;     /* by kernel name, with RF_EMU_LAUNCHES=1 */
  int log_launches;
  int devices;
  uint64_t seed, delay_us, streams_made;
};

state *g;
std::once_flag g_once;

void on_fault(int sig, siginfo_t *info, void *ctx);

void install_fault_handler() {
  stack_t ss;
  ss.ss_size = 64u << 10;
  ss.ss_sp = malloc(ss.ss_size);
  ss.ss_flags = 0;
  if (ss.ss_sp) sigaltstack(&ss, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
  sigaction(SIGBUS, &sa, NULL);
}

/* RF_EMU_LAUNCHES=1: at exit, the process's kernel launches, in all and by kernel name
 * ("cuda-emu launches: N" then "cuda-emu launches: N name" per kernel). */
void print_launches() {
  std::lock_guard<std::mutex> lock(g->mu);
  uint64_t all = 0;
  for (const auto &k : g->launches) all += k.second;
  fprintf(stderr, "cuda-emu launches: %llu\n", (unsigned long long)all);
  for (const auto &k : g->launches)
    fprintf(stderr, "cuda-emu launches: %llu %s\n", (unsigned long long)k.second, k.first.c_str());
  fflush(stderr);
}

void init_once() {
  g = new state();
  g->devices = (int)env_u64("RF_EMU_DEVICES", 1);
  if (g->devices < 1 || g->devices > RF_EMU_MAX_DEVICES)
    die("RF_EMU_DEVICES=%d: 1 to %d", g->devices, RF_EMU_MAX_DEVICES);
  g->seed = env_u64("RF_EMU_SEED", 1);
  g->delay_us = env_u64("RF_EMU_DELAY_US", 200);
  g->log_launches = (int)env_u64("RF_EMU_LAUNCHES", 0);
  if (g->log_launches) atexit(print_launches);
  size_t span = RF_EMU_DEVICE_SPAN * RF_EMU_MAX_DEVICES;
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  void *d = mmap(NULL, span, PROT_NONE, flags, -1, 0), *v = mmap(NULL, span, PROT_NONE, flags, -1, 0);
  void *t = mmap(NULL, RF_EMU_TRAP_SPAN, PROT_NONE, flags, -1, 0);
  if (d == MAP_FAILED || v == MAP_FAILED || t == MAP_FAILED) die("cannot reserve the device address space");
  g->device_base = (char *)d;
  g->view_base = (char *)v;
  g->trap_base = (char *)t;
  for (int i = 0; i < RF_EMU_MAX_DEVICES; i++) g->next[i] = RF_EMU_PAGE; /* no allocation at a span's start */
  install_fault_handler();
}

state *st() {
  std::call_once(g_once, init_once);
  return g;
}

const char *place_name(enum place p) {
  switch (p) {
    case PLACE_PAGEABLE:
      return "pageable host memory";
    case PLACE_PINNED:
      return "pinned host memory";
    case PLACE_DEVICE:
      return "device memory";
    case PLACE_DEVICE_FREED:
      return "a device address no live allocation holds (freed, or never allocated)";
  }
  return "?";
}

/* ---- the fault handler ---- */

void say(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

void on_fault(int sig, siginfo_t *info, void *ctx) {
  (void)ctx;
  char msg[1024], where[256];
  const char *a = (const char *)info->si_addr;
  const char *kernel = current_kernel(where, sizeof where);
  size_t span = RF_EMU_DEVICE_SPAN * RF_EMU_MAX_DEVICES;
  if (g && a >= g->device_base && a < g->device_base + span) {
    snprintf(
        msg, sizeof msg,
        "cuda-emu: %s touched device memory at %p (device %d): device memory is not host memory; copy it "
        "(cudaMemcpy) or use it in a kernel\n",
        kernel ? kernel : "the host", (const void *)a,
        (int)((size_t)(a - g->device_base) / RF_EMU_DEVICE_SPAN));
  } else if (g && a >= g->view_base && a < g->view_base + span) {
    snprintf(msg, sizeof msg,
             "cuda-emu: %s: an access outside device memory at device address %p (past an allocation's end, "
             "or freed memory)\n",
             kernel ? kernel : "the stand-in", (const void *)(a - g->view_base + g->device_base));
  } else if (g && a >= g->trap_base && a < g->trap_base + RF_EMU_TRAP_SPAN) {
    snprintf(
        msg, sizeof msg,
        "cuda-emu: %s dereferenced a pageable host pointer passed as a kernel argument (a GPU cannot read "
        "it: copy it to the device, or use pinned memory)\n",
        kernel ? kernel : "a kernel");
  } else if (fiber_stack_fault(a)) {
    snprintf(msg, sizeof msg, "cuda-emu: %s overflowed its 64 KiB stack\n", kernel ? kernel : "a thread");
  } else {
    snprintf(msg, sizeof msg, "cuda-emu: signal %d at %p%s%s\n", sig, (const void *)a, kernel ? " in " : "",
             kernel ? kernel : "");
  }
  say(msg);
  void *frames[48];
  int n = backtrace(frames, 48);
  backtrace_symbols_fd(frames, n, 2);
  _exit(128 + sig); /* as the signal would, without a core file */
}

/* ---- streams ---- */

void worker_main(stream *s) {
  tls_device = s->device;
  stack_t ss;
  ss.ss_size = 64u << 10;
  ss.ss_sp = malloc(ss.ss_size);
  ss.ss_flags = 0;
  if (ss.ss_sp) sigaltstack(&ss, NULL);
  uint64_t rng = mix(g->seed ^ (s->id * 0x632be59bd9b4e019ull));
  std::unique_lock<std::mutex> lock(g->mu);
  for (;;) {
    s->work.wait(lock, [s] { return !s->q.empty() || s->destroyed; });
    if (s->q.empty()) return; /* destroyed and drained */
    op &o = s->q.front();
    g->progress.wait(lock, [&o] {
      for (auto &d : o.deps)
        if (d.first->done < d.second) return false;
      return true;
    });
    std::function<void()> work = std::move(o.work);
    lock.unlock();
    rng = mix(rng);
    if (g->delay_us && rng % 2 == 0) {
      struct timespec pause = {0, (long)((rng >> 8) % (g->delay_us + 1) * 1000)};
      nanosleep(&pause, NULL);
    }
    if (work) work();
    lock.lock();
    s->done = s->q.front().seq;
    s->q.pop_front();
    g->progress.notify_all();
  }
}

stream *make_stream(int device, int legacy, int non_blocking) {
  stream *s = new rf_emu_stream();
  s->device = device;
  s->legacy = legacy;
  s->non_blocking = non_blocking;
  std::lock_guard<std::mutex> lock(g->mu);
  s->id = ++g->streams_made;
  g->streams.insert(s);
  std::thread(worker_main, s).detach();
  return s;
}

stream *legacy_stream(int device) {
  state *S = st();
  {
    std::lock_guard<std::mutex> lock(S->mu);
    if (S->legacy[device]) return S->legacy[device];
  }
  stream *s = make_stream(device, 1, 0);
  std::lock_guard<std::mutex> lock(S->mu);
  if (!S->legacy[device]) S->legacy[device] = s;
  return S->legacy[device];
}

/* Waits (the host) until stream s has finished what was queued on it so far. */
void wait_stream(stream *s) {
  std::unique_lock<std::mutex> lock(g->mu);
  uint64_t upto = s->queued;
  g->progress.wait(lock, [s, upto] { return s->done >= upto; });
}

}  // namespace

int current_device(void) { return tls_device; }
void count_host_wait(void) { count(&stats.host_waits, 1); }
int stream_device(const struct stream *s) { return s->device; }

stream *stream_of(cudaStream_t handle, const char *api) {
  state *S = st();
  if (handle == cudaStreamPerThread) {
    fail(cudaErrorNotSupported, "%s: cudaStreamPerThread is not emulated", api);
    return NULL;
  }
  if (handle == NULL || handle == cudaStreamLegacy) return legacy_stream(tls_device);
  stream *s = handle;
  std::lock_guard<std::mutex> lock(S->mu);
  if (!S->streams.count(s) || s->destroyed) {
    fail(cudaErrorInvalidResourceHandle, "%s: stream %p is not a live stream (destroyed, or never created)",
         api, (void *)handle);
    return NULL;
  }
  if (s->device != tls_device) {
    fail(cudaErrorInvalidResourceHandle,
         "%s: stream %p belongs to device %d but this thread's current device is %d (call cudaSetDevice in "
         "each thread that makes CUDA calls)",
         api, (void *)handle, s->device, tls_device);
    return NULL;
  }
  return s;
}

uint64_t enqueue(stream *s, const char *what, std::function<void()> work, stream *after, uint64_t after_seq) {
  std::lock_guard<std::mutex> lock(g->mu);
  op o;
  o.work = std::move(work);
  o.what = what;
  if (s->legacy) { /* after every blocking stream's earlier work */
    for (stream *b : g->streams)
      if (b != s && b->device == s->device && !b->non_blocking && !b->legacy && b->queued > b->done)
        o.deps.push_back({b, b->queued});
  } else if (!s->non_blocking) { /* after the legacy stream's earlier work */
    stream *l = g->legacy[s->device];
    if (l && l->queued > l->done) o.deps.push_back({l, l->queued});
  }
  if (after) o.deps.push_back({after, after_seq});
  uint64_t seq = o.seq = ++s->queued;
  s->q.push_back(std::move(o));
  s->work.notify_one();
  return seq;
}

void sync_device(int device) {
  std::vector<stream *> all;
  {
    std::lock_guard<std::mutex> lock(st()->mu);
    for (stream *s : g->streams)
      if (s->device == device) all.push_back(s);
  }
  for (stream *s : all) wait_stream(s);
}

/* ---- memory ---- */

int in_device_range(const void *p) {
  state *S = st();
  const char *a = (const char *)p;
  return a >= S->device_base && a < S->device_base + RF_EMU_DEVICE_SPAN * RF_EMU_MAX_DEVICES;
}

void *view(const void *p) {
  if (!in_device_range(p)) return (void *)p;
  return (char *)p - g->device_base + g->view_base;
}

struct where locate(const void *p) {
  state *S = st();
  struct where w = {PLACE_PAGEABLE, -1, NULL, 0};
  uintptr_t a = (uintptr_t)p;
  std::lock_guard<std::mutex> lock(S->mu);
  if (in_device_range(p)) {
    w.place = PLACE_DEVICE_FREED;
    w.device = (int)((size_t)((const char *)p - S->device_base) / RF_EMU_DEVICE_SPAN);
    auto it = S->allocs.upper_bound(a);
    if (it != S->allocs.begin()) {
      --it;
      if (a < it->first + it->second.size || (a == it->first && it->second.size == 0)) {
        w.place = PLACE_DEVICE;
        w.base = (const char *)it->first;
        w.size = it->second.size;
      }
    }
    return w;
  }
  auto it = S->pinned.upper_bound(a);
  if (it != S->pinned.begin()) {
    --it;
    if (a < it->first + it->second) {
      w.place = PLACE_PINNED;
      w.base = (const char *)it->first;
      w.size = it->second;
    }
  }
  return w;
}

cudaError_t check_device_range(const void *p, size_t bytes, const char *what) {
  struct where w = locate(p);
  if (w.place != PLACE_DEVICE)
    return fail(cudaErrorInvalidValue, "%s: %p is %s, not device memory", what, p, place_name(w.place));
  if ((const char *)p + bytes > w.base + w.size)
    return fail(cudaErrorInvalidValue,
                "%s: %zu bytes at %p run past the end of their allocation (%zu bytes at %p) by %zu bytes",
                what, bytes, p, w.size, (const void *)w.base,
                (size_t)((const char *)p + bytes - (w.base + w.size)));
  return cudaSuccess;
}

void *kernel_pointer(const void *p) {
  if (!p) return NULL;
  struct where w = locate(p);
  if (w.place == PLACE_DEVICE || w.place == PLACE_DEVICE_FREED) {
    if (w.device != tls_device)
      die("a kernel launched on device %d is given memory of device %d (%p): no peer access here", tls_device,
          w.device, p);
    return view(p);
  }
  if (w.place == PLACE_PINNED) return (void *)p;
  return g->trap_base + (uintptr_t)p % RF_EMU_TRAP_SPAN;
}

namespace {

const char *kind_name(enum cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

int on_device(enum place p) { return p == PLACE_DEVICE || p == PLACE_DEVICE_FREED; }

/* cudaMemcpy and cudaMemcpyAsync: `sync` for cudaMemcpy (the legacy stream, and its
 * waits). */
cudaError_t memcpy_on(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t handle,
                      int sync, const char *api) {
  count(&stats.copies, 1);
  struct where wd = locate(dst), ws = locate(src);
  int dd = on_device(wd.place), sd = on_device(ws.place);
  int ok = kind == cudaMemcpyDefault || (kind == cudaMemcpyHostToDevice && !sd && dd) ||
           (kind == cudaMemcpyDeviceToHost && sd && !dd) || (kind == cudaMemcpyDeviceToDevice && sd && dd) ||
           (kind == cudaMemcpyHostToHost && !sd && !dd);
  if (!ok)
    return fail(cudaErrorInvalidMemcpyDirection, "%s(%p, %p, %zu, %s): the destination is %s, the source %s",
                api, dst, src, n, kind_name(kind), place_name(wd.place), place_name(ws.place));
  if (n == 0) return cudaSuccess;
  if (dd && check_device_range(dst, n, api) != cudaSuccess) return cudaErrorInvalidValue;
  if (sd && check_device_range(src, n, api) != cudaSuccess) return cudaErrorInvalidValue;
  if (!dd && !sd) { /* host to host: the host's copy, in order with the stream */
    stream *s = stream_of(handle, api);
    if (!s) return tls_last_error;
    wait_stream(s);
    memmove(dst, src, n);
    return cudaSuccess;
  }
  stream *s = stream_of(handle, api);
  if (!s) return tls_last_error;
  char *to = (char *)view(dst);
  const char *from = (const char *)view(src);
  if (!sd && ws.place == PLACE_PAGEABLE) { /* staged now: the caller may reuse its buffer */
    char *staged = (char *)malloc(n);
    if (!staged) return fail(cudaErrorMemoryAllocation, "%s: no memory to stage %zu bytes", api, n);
    memcpy(staged, src, n);
    enqueue(s, "a copy from pageable host memory", [to, staged, n] {
      memcpy(to, staged, n);
      free(staged);
    });
  } else {
    enqueue(s, "a copy", [to, from, n] { memmove(to, from, n); });
  }
  int wait = (!dd && wd.place == PLACE_PAGEABLE) || (sync && !dd) || (sync && ws.place == PLACE_PINNED);
  if (wait) {
    count_host_wait();
    wait_stream(s);
  }
  return cudaSuccess;
}

cudaError_t memset_on(void *dst, int value, size_t n, cudaStream_t handle, const char *api) {
  if (n == 0) return cudaSuccess;
  if (check_device_range(dst, n, api) != cudaSuccess) return cudaErrorInvalidValue;
  stream *s = stream_of(handle, api);
  if (!s) return tls_last_error;
  char *to = (char *)view(dst);
  enqueue(s, "a memset", [to, value, n] { memset(to, value, n); });
  return cudaSuccess;
}

}  // namespace

/* ---- kernels ---- */

cudaError_t func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value) {
  state *S = st();
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorNotSupported, "cudaFuncSetAttribute: attribute %d is not emulated", (int)attr);
  if (value < 0 || (unsigned)value > RF_EMU_SMEM_OPTIN)
    return fail(
        cudaErrorInvalidValue,
        "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, %d): above sm_90's %u bytes",
        value, RF_EMU_SMEM_OPTIN);
  std::lock_guard<std::mutex> lock(S->mu);
  S->max_dynamic_smem[func] = value;
  return cudaSuccess;
}

void launch_kernel(const void *func, const char *name, dim3 grid, dim3 block, size_t smem,
                   cudaStream_t handle, std::function<void()> body) {
  state *S = st();
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024) {
    fail(cudaErrorInvalidConfiguration, "launch of %s: a block of %u x %u x %u threads (at most 1024 in all)",
         name, block.x, block.y, block.z);
    return;
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535) {
    fail(cudaErrorInvalidConfiguration, "launch of %s: a grid of %u x %u x %u blocks", name, grid.x, grid.y,
         grid.z);
    return;
  }
  size_t allowed = RF_EMU_SMEM_DEFAULT, limit = RF_EMU_SMEM_DEFAULT;
  {
    std::lock_guard<std::mutex> lock(S->mu);
    auto it = S->max_dynamic_smem.find(func);
    if (it != S->max_dynamic_smem.end() && (size_t)it->second > allowed) {
      allowed = (size_t)it->second;
      limit = std::min<size_t>(RF_EMU_SMEM_OPTIN, allowed + RF_EMU_SMEM_DEFAULT);
    }
  }
  if (smem > allowed) {
    fail(cudaErrorInvalidValue,
         "launch of %s with %zu bytes of dynamic shared memory: above 48 KiB needs "
         "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) first (allowed now: %zu)",
         name, smem, allowed);
    return;
  }
  stream *s = stream_of(handle, name);
  if (!s) return;
  uint64_t seed;
  {
    std::lock_guard<std::mutex> lock(S->mu);
    seed = mix(S->seed ^ mix(s->id) ^ (++s->launches * 0xd6e8feb86659fd93ull));
    if (S->log_launches) S->launches[name]++;
  }
  enqueue(s, name, [name, grid, block, smem, limit, body, seed] {
    run_grid(name, grid, block, smem, limit, body, seed);
    count(&stats.kernels, 1);
  });
}

}  // namespace rf_emu

using namespace rf_emu;

/* ---- the API ---- */

extern "C" {

void rf_emu_get_stats(struct rf_emu_stats *out) {
  out->host_waits = __atomic_load_n(&stats.host_waits, __ATOMIC_RELAXED);
  out->kernels = __atomic_load_n(&stats.kernels, __ATOMIC_RELAXED);
  out->copies = __atomic_load_n(&stats.copies, __ATOMIC_RELAXED);
  out->mallocs = __atomic_load_n(&stats.mallocs, __ATOMIC_RELAXED);
  out->matmuls = __atomic_load_n(&stats.matmuls, __ATOMIC_RELAXED);
  out->nccl_ops = __atomic_load_n(&stats.nccl_ops, __ATOMIC_RELAXED);
  out->bytes_device = __atomic_load_n(&stats.bytes_device, __ATOMIC_RELAXED);
}

static const struct {
  cudaError_t e;
  const char *name, *text;
} rf_emu_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources",
     "too many resources requested for launch"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorName(cudaError_t e) {
  for (const auto &x : rf_emu_errors)
    if (x.e == e) return x.name;
  return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
  for (const auto &x : rf_emu_errors)
    if (x.e == e) return x.text;
  return "unknown error";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tls_last_error;
  tls_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

cudaError_t cudaGetDeviceCount(int *count) {
  *count = st()->devices;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  *device = tls_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= st()->devices)
    return fail(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d device(s)", device, g->devices);
  tls_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  if (device < 0 || device >= st()->devices)
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties(%d): %d device(s)", device, g->devices);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "cuda-emu %d (the CPU stand-in of tests/gpu/emu, not a GPU)",
           device);
  prop->totalGlobalMem = 80ull << 30;
  prop->sharedMemPerBlock = RF_EMU_SMEM_DEFAULT;
  prop->sharedMemPerBlockOptin = RF_EMU_SMEM_OPTIN;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->unifiedAddressing = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  count_host_wait();
  sync_device(tls_device);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t size) {
  state *S = st();
  count(&stats.mallocs, 1);
  size_t rounded = (size + 255) / 256 * 256;
  if (rounded == 0) rounded = 256;
  size_t pages = (rounded + RF_EMU_PAGE - 1) / RF_EMU_PAGE * RF_EMU_PAGE;
  int dev = tls_device;
  char *at;
  {
    std::lock_guard<std::mutex> lock(S->mu);
    if (S->next[dev] + pages + RF_EMU_PAGE > RF_EMU_DEVICE_SPAN)
      return fail(cudaErrorMemoryAllocation, "cudaMalloc of %zu bytes: the stand-in's %llu GiB are used up",
                  size, RF_EMU_DEVICE_SPAN >> 30);
    char *start = S->device_base + (size_t)dev * RF_EMU_DEVICE_SPAN + S->next[dev];
    S->next[dev] += pages + RF_EMU_PAGE; /* an unreadable page after each */
    at = start + pages - rounded;        /* the end at the page boundary */
    S->allocs[(uintptr_t)at] = allocation{size, dev};
  }
  char *v = (char *)view(at);
  char *page = (char *)((uintptr_t)v & ~(uintptr_t)(RF_EMU_PAGE - 1));
  if (mprotect(page, pages, PROT_READ | PROT_WRITE) != 0) die("mprotect: %s", strerror(errno));
  memset(v, 0xff, size); /* cudaMalloc's memory is not zeroed: NaN until written */
  count(&stats.bytes_device, size);
  *ptr = at;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  if (!ptr) return cudaSuccess;
  state *S = st();
  allocation a;
  {
    std::lock_guard<std::mutex> lock(S->mu);
    auto it = S->allocs.find((uintptr_t)ptr);
    if (it == S->allocs.end())
      return fail(cudaErrorInvalidValue, "cudaFree(%p): not the start of a live device allocation", ptr);
    a = it->second;
  }
  count_host_wait(); /* cudaFree synchronizes the device */
  sync_device(a.device);
  {
    std::lock_guard<std::mutex> lock(S->mu);
    S->allocs.erase((uintptr_t)ptr);
  }
  size_t rounded = (a.size + 255) / 256 * 256;
  if (rounded == 0) rounded = 256;
  size_t pages = (rounded + RF_EMU_PAGE - 1) / RF_EMU_PAGE * RF_EMU_PAGE;
  char *page = (char *)((uintptr_t)view(ptr) & ~(uintptr_t)(RF_EMU_PAGE - 1));
  madvise(page, pages, MADV_DONTNEED);
  mprotect(page, pages, PROT_NONE);
  count(&stats.bytes_device, (uint64_t)0 - a.size);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t size, unsigned int flags) {
  (void)flags;
  state *S = st();
  count(&stats.mallocs, 1);
  size_t pages = (size + RF_EMU_PAGE - 1) / RF_EMU_PAGE * RF_EMU_PAGE;
  if (pages == 0) pages = RF_EMU_PAGE;
  void *p = mmap(NULL, pages, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc of %zu bytes", size);
  memset(p, 0xff, size);
  std::lock_guard<std::mutex> lock(S->mu);
  S->pinned[(uintptr_t)p] = pages;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void **ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void *ptr) {
  if (!ptr) return cudaSuccess;
  state *S = st();
  size_t pages;
  {
    std::lock_guard<std::mutex> lock(S->mu);
    auto it = S->pinned.find((uintptr_t)ptr);
    if (it == S->pinned.end())
      return fail(cudaErrorInvalidValue, "cudaFreeHost(%p): not pinned memory from cudaMallocHost", ptr);
    pages = it->second;
  }
  count_host_wait(); /* cudaFreeHost synchronizes the device */
  sync_device(tls_device);
  std::lock_guard<std::mutex> lock(S->mu);
  S->pinned.erase((uintptr_t)ptr);
  munmap(ptr, pages);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr) {
  struct where w = locate(ptr);
  memset(attr, 0, sizeof *attr);
  attr->device = tls_device;
  switch (w.place) {
    case PLACE_DEVICE:
      attr->type = cudaMemoryTypeDevice;
      attr->device = w.device;
      attr->devicePointer = (void *)ptr;
      return cudaSuccess;
    case PLACE_PINNED:
      attr->type = cudaMemoryTypeHost;
      attr->devicePointer = attr->hostPointer = (void *)ptr;
      return cudaSuccess;
    case PLACE_PAGEABLE:
      attr->type = cudaMemoryTypeUnregistered;
      return cudaSuccess;
    case PLACE_DEVICE_FREED:
      break;
  }
  return fail(cudaErrorInvalidValue,
              "cudaPointerGetAttributes(%p): a device address no live allocation holds", ptr);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  *total = 80ull << 30;
  *free_bytes = *total - __atomic_load_n(&stats.bytes_device, __ATOMIC_RELAXED);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  return memcpy_on(dst, src, count, kind, NULL, 1, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return memcpy_on(dst, src, count, kind, stream, 0, "cudaMemcpyAsync");
}

cudaError_t cudaMemset(void *ptr, int value, size_t count) {
  return memset_on(ptr, value, count, NULL, "cudaMemset");
}

cudaError_t cudaMemsetAsync(void *ptr, int value, size_t count, cudaStream_t stream) {
  return memset_on(ptr, value, count, stream, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t *out, unsigned int flags, int priority) {
  (void)priority;
  st();
  if (flags & ~(unsigned)cudaStreamNonBlocking)
    return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: flags %#x", flags);
  *out = (cudaStream_t)make_stream(tls_device, 0, (flags & cudaStreamNonBlocking) != 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags) {
  return cudaStreamCreateWithPriority(out, flags, 0);
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithPriority(out, 0, 0); }

cudaError_t cudaStreamDestroy(cudaStream_t handle) {
  if (handle == NULL || handle == cudaStreamLegacy)
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy of the default stream");
  stream *s = stream_of(handle, "cudaStreamDestroy");
  if (!s) return tls_last_error;
  std::lock_guard<std::mutex> lock(g->mu);
  s->destroyed = 1; /* its worker finishes the queue, then ends */
  g->streams.erase(s);
  s->work.notify_one();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t handle) {
  stream *s = stream_of(handle, "cudaStreamSynchronize");
  if (!s) return tls_last_error;
  count_host_wait();
  wait_stream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t handle) {
  stream *s = stream_of(handle, "cudaStreamQuery");
  if (!s) return tls_last_error;
  std::lock_guard<std::mutex> lock(g->mu);
  return s->done >= s->queued ? cudaSuccess : cudaErrorNotReady;
}

static rf_emu_event *rf_emu_event_of(cudaEvent_t e, const char *api) {
  state *S = st();
  std::lock_guard<std::mutex> lock(S->mu);
  if (!S->events.count(e)) {
    fail(cudaErrorInvalidResourceHandle, "%s: event %p is not a live event (destroyed, or never created)",
         api, (void *)e);
    return NULL;
  }
  return e;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t handle, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  stream *s = stream_of(handle, "cudaStreamWaitEvent");
  rf_emu_event *e = rf_emu_event_of(event, "cudaStreamWaitEvent");
  if (!s || !e) return tls_last_error;
  stream *on;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(g->mu);
    if (!e->recorded) return cudaSuccess; /* CUDA: waiting for an event never recorded waits for nothing */
    on = e->s;
    seq = e->seq;
  }
  /* a no-op that cannot start before the event's point */
  enqueue(s, "cudaStreamWaitEvent", nullptr, on, seq);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  state *S = st();
  if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming))
    return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: flags %#x", flags);
  rf_emu_event *e = new rf_emu_event();
  e->device = tls_device;
  e->flags = flags;
  std::lock_guard<std::mutex> lock(S->mu);
  S->events.insert(e);
  *out = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!rf_emu_event_of(event, "cudaEventDestroy")) return tls_last_error;
  std::lock_guard<std::mutex> lock(g->mu);
  g->events.erase(event);
  event->destroyed = 1; /* kept: a marker still queued may write its time */
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t handle) {
  rf_emu_event *e = rf_emu_event_of(event, "cudaEventRecord");
  stream *s = stream_of(handle, "cudaEventRecord");
  if (!s || !e) return tls_last_error;
  if (e->device != s->device)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventRecord: an event of device %d on a stream of device %d", e->device, s->device);
  std::function<void()> mark;
  if (!(e->flags & cudaEventDisableTiming)) mark = [e] { e->when_ns = now_ns(); };
  uint64_t seq = enqueue(s, "cudaEventRecord", mark);
  std::lock_guard<std::mutex> lock(g->mu);
  e->recorded = 1;
  e->s = s;
  e->seq = seq;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  rf_emu_event *e = rf_emu_event_of(event, "cudaEventQuery");
  if (!e) return tls_last_error;
  std::lock_guard<std::mutex> lock(g->mu);
  return !e->recorded || e->s->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  rf_emu_event *e = rf_emu_event_of(event, "cudaEventSynchronize");
  if (!e) return tls_last_error;
  count_host_wait();
  std::unique_lock<std::mutex> lock(g->mu);
  if (!e->recorded) return cudaSuccess;
  stream *s = e->s;
  uint64_t seq = e->seq;
  g->progress.wait(lock, [s, seq] { return s->done >= seq; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  rf_emu_event *a = rf_emu_event_of(start, "cudaEventElapsedTime"),
               *b = rf_emu_event_of(end, "cudaEventElapsedTime");
  if (!a || !b) return tls_last_error;
  if ((a->flags | b->flags) & cudaEventDisableTiming)
    return fail(cudaErrorInvalidResourceHandle,
                "cudaEventElapsedTime of an event made with cudaEventDisableTiming");
  std::lock_guard<std::mutex> lock(g->mu);
  if (!a->recorded || !b->recorded)
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime of an event never recorded");
  if (a->s->done < a->seq || b->s->done < b->seq) return cudaErrorNotReady;
  *ms = (float)((double)((int64_t)b->when_ns - (int64_t)a->when_ns) / 1e6);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value) {
  return func_set_attribute(func, attr, value);
}

} /* extern "C" */
