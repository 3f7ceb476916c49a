/* The fiber scheduler and the runtime calls of cuda_emu.h (see there). */
#include "cuda_emu.h"

#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#include <vector>

namespace rf_emu {

dim3 block_idx, block_dim, grid_dim;

enum state { RUNNING, AT_BARRIER, AT_SHUFFLE, DONE };

struct fiber {
  ucontext_t ctx;
  enum state st;
  unsigned tid;
  uint64_t value, result;
  int lane_or_mask, is_xor;
  char *stack;
};

#define RF_EMU_STACK (256 * 1024)

static std::vector<fiber> g_fibers;
static fiber *g_cur;
static ucontext_t g_sched;
static const std::function<void()> *g_body;
static std::vector<char> g_smem;

static void die(const char *msg) {
  fprintf(stderr, "cuda-emu: %s (block %u,%u thread %u)\n", msg, block_idx.x, block_idx.y,
          g_cur ? g_cur->tid : 0u);
  abort();
}

unsigned thread_x(void) {
  if (!g_cur) die("threadIdx outside a kernel");
  return g_cur->tid;
}

void *dynamic_smem(void) { return g_smem.data(); }

static void yield(enum state st) {
  fiber *f = g_cur;
  f->st = st;
  swapcontext(&f->ctx, &g_sched);
}

void syncthreads(void) { yield(AT_BARRIER); }

uint64_t shuffle(uint64_t bits, int lane_or_mask, int is_xor) {
  fiber *f = g_cur;
  f->value = bits;
  f->lane_or_mask = lane_or_mask;
  f->is_xor = is_xor;
  yield(AT_SHUFFLE);
  return f->result;
}

static void entry(void) {
  (*g_body)();
  g_cur->st = DONE;
  swapcontext(&g_cur->ctx, &g_sched);
}

static void run_block(unsigned n) {
  for (unsigned t = 0; t < n; t++) {
    fiber &f = g_fibers[t];
    f.tid = t;
    f.st = RUNNING;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = RF_EMU_STACK;
    f.ctx.uc_link = NULL;
    makecontext(&f.ctx, entry, 0);
  }
  for (;;) {
    for (unsigned t = 0; t < n; t++)
      if (g_fibers[t].st == RUNNING) {
        g_cur = &g_fibers[t];
        swapcontext(&g_sched, &g_fibers[t].ctx);
      }
    g_cur = NULL;
    /* every thread now waits at a barrier or a shuffle, or is done */
    int resumed = 0, live = 0, at_barrier = 0;
    for (unsigned w = 0; w * 32 < n; w++) {
      unsigned lo = w * 32, hi = std::min(n, lo + 32);
      unsigned shuffling = 0;
      for (unsigned t = lo; t < hi; t++) shuffling += g_fibers[t].st == AT_SHUFFLE;
      if (shuffling == 0) continue;
      if (shuffling != hi - lo || hi - lo != 32) die("a shuffle that not all 32 lanes of the warp reached");
      for (unsigned t = lo; t < hi; t++) {
        fiber &f = g_fibers[t];
        unsigned lane = t - lo;
        unsigned src = f.is_xor ? (lane ^ (unsigned)f.lane_or_mask) : (unsigned)f.lane_or_mask;
        if (src >= 32) src = lane; /* out of range: the lane's own value, as on the GPU */
        f.result = g_fibers[lo + src].value;
      }
      for (unsigned t = lo; t < hi; t++) g_fibers[t].st = RUNNING;
      resumed = 1;
    }
    if (resumed) continue;
    for (unsigned t = 0; t < n; t++) {
      live += g_fibers[t].st != DONE;
      at_barrier += g_fibers[t].st == AT_BARRIER;
    }
    if (live == 0) return;
    if (at_barrier != live) die("threads stuck (not all at the barrier)");
    for (unsigned t = 0; t < n; t++)
      if (g_fibers[t].st == AT_BARRIER) g_fibers[t].st = RUNNING;
  }
}

void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body) {
  if (block.y != 1 || block.z != 1 || block.x == 0 || block.x > 1024)
    die("only 1-D blocks of 1..1024 threads");
  if (grid.z != 1) die("only 2-D grids");
  if (g_fibers.size() < block.x) {
    size_t old = g_fibers.size();
    g_fibers.resize(block.x);
    for (size_t t = old; t < block.x; t++) g_fibers[t].stack = (char *)malloc(RF_EMU_STACK);
  }
  g_smem.assign(smem + 16, (char)0x7f); /* garbage-ish: a kernel must write before it reads */
  g_body = &body;
  block_dim = block;
  grid_dim = grid;
  for (unsigned y = 0; y < grid.y; y++)
    for (unsigned x = 0; x < grid.x; x++) {
      block_idx = dim3(x, y, 0);
      run_block(block.x);
    }
  g_body = NULL;
}

}  // namespace rf_emu

/* ---- the runtime API: host memory, synchronous ---- */

struct rf_emu_event {
  int recorded;
};

extern "C" {

const char *cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "invalid value (emulated)";
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
  (void)device;
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "CPU emulation (tests/gpu/emu, not a GPU)");
  prop->major = 9;
  prop->multiProcessorCount = 1;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void **p, size_t bytes) {
  *p = malloc(bytes ? bytes : 1);
  if (*p) memset(*p, 0x5a, bytes); /* not zeroed, as cudaMalloc */
  return *p ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaFree(void *p) {
  free(p);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
  (void)kind;
  memcpy(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
  memset(dst, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
  (void)stream;
  return cudaMemset(dst, value, bytes);
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaEventCreate(cudaEvent_t *e) {
  *e = (cudaEvent_t)calloc(1, sizeof(struct rf_emu_event));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  free(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  (void)stream;
  e->recorded = 1;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  (void)a;
  (void)b;
  *ms = 0.0f;
  return cudaSuccess;
}
}
