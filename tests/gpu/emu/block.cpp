/* cuda-emu: how a grid runs on a stream's worker thread (see cuda_runtime.h).
 *
 * Blocks one after the other in a random order (a seeded affine permutation of the
 * block indices). A block's threads are fibers on stacks of their own (64 KiB, a
 * guard page below each), switched by rf_emu_switch: the callee-saved registers and
 * the stack pointer, in user space (ucontext's swapcontext makes a sigprocmask system
 * call per switch, which made the kernel test take minutes). A fiber runs until it
 * exits, reaches __syncthreads or a warp collective; then it does the bookkeeping
 * itself (a barrier count, a warp's arrival, resolving the warp when it is the last
 * lane) and switches straight to a runnable fiber picked at random, so a yield costs
 * one switch. When none can run, the block's scheduler decides: every live thread at
 * the same barrier releases them all; anything else is a bug of the kernel (a barrier
 * some threads never reach, a collective missing a lane) and stops the program naming
 * the kernel, the block and what each thread waits for.
 * Shared memory is one buffer per worker, filled with 0xff bytes (NaN as f32 and f64)
 * at each block's start: the dynamic part at once, each static __shared__ object when
 * the block's first thread reaches its declaration. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <vector>

#include "emu.h"

#define RF_EMU_STACK (64u << 10)
#define RF_EMU_GUARD (4u << 10)
#define RF_EMU_MAX_THREADS 1024
#define RF_EMU_STATIC_SMEM (48u << 10) /* CUDA's limit on a kernel's static shared memory */
#define RF_EMU_MAX_SHARED_VARS 64

#if defined(__x86_64__)
/* rf_emu_switch(save, to): saves this context's callee-saved registers on its stack and
 * its stack pointer in *save, then resumes the context whose stack pointer is `to`. A
 * new fiber's stack holds the same frame with rf_emu_fiber_start as its return address
 * and the entry function and its argument in r13 and r12. MXCSR and the x87 control
 * word are not switched: nothing here changes the rounding mode. */
extern "C" void rf_emu_switch(void **save, void *to);
extern "C" void rf_emu_fiber_start(void);
asm(R"(
  .text
  .globl rf_emu_switch
  .type rf_emu_switch, @function
rf_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rf_emu_switch, .-rf_emu_switch
  .globl rf_emu_fiber_start
  .type rf_emu_fiber_start, @function
rf_emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size rf_emu_fiber_start, .-rf_emu_fiber_start
  .section .note.GNU-stack,"",@progbits
  .text
)");
#else
#error "cuda-emu's fibers are written for x86-64 (block.cpp: rf_emu_switch)"
#endif

namespace rf_emu {

RF_EMU_TLS uint3 tls_block_idx, tls_block_dim, tls_grid_dim;
static const uint3 g_no_thread = {~0u, ~0u, ~0u};
RF_EMU_TLS const uint3 *tls_thread_idx = &g_no_thread;
RF_EMU_TLS unsigned tls_lane;

namespace {

enum fiber_state { FIBER_RUNNABLE, FIBER_BARRIER, FIBER_WARP, FIBER_DONE };

struct fiber {
  void *sp;
  uint3 idx;
  unsigned tid;
  enum fiber_state state;
  const char *bar_file; /* at a barrier: where */
  int bar_line;
  unsigned mask; /* at a warp collective: its mask, resolve, data */
  warp_resolve_fn resolve;
  void *data;
  const char *what;
};

struct warp {
  unsigned arrived;
  unsigned mask;
  warp_resolve_fn resolve;
  const char *what;
};

struct shared_var {
  const void *key;
  size_t offset;
};

/* One per worker thread that runs kernels: the fibers, their stacks, shared memory. */
struct executor {
  char *stacks;         /* RF_EMU_MAX_THREADS slots of guard + stack, PROT_NONE until used */
  unsigned stacks_made; /* slots made readable */
  fiber fibers[RF_EMU_MAX_THREADS];
  warp warps[RF_EMU_MAX_THREADS / 32];
  unsigned nthreads;
  fiber *cur;
  void *sched_sp;
  std::vector<unsigned> runq;
  unsigned live, at_barrier; /* threads not exited; of them, at the barrier */
  const char *bar_file;      /* the barrier they wait at */
  int bar_line;
  uint64_t rng;
  const std::function<void()> *body;
  char *smem; /* smem_cap bytes */
  size_t smem_cap, dynamic, static_used, limit;
  shared_var vars[RF_EMU_MAX_SHARED_VARS];
  int nvars;
  const char *kernel;
};

__thread executor *tls_ex;

executor *this_executor() {
  if (!tls_ex) {
    executor *ex = new executor();
    size_t slot = RF_EMU_GUARD + RF_EMU_STACK;
    void *p =
        mmap(NULL, slot * RF_EMU_MAX_THREADS, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) die("cannot reserve the fibers' stacks");
    ex->stacks = (char *)p;
    ex->smem_cap = 256u << 10;
    /* 128-byte aligned, as the GPU's shared memory window: wmma needs 32 at a fragment's address */
    ex->smem = (char *)aligned_alloc(128, ex->smem_cap);
    if (!ex->smem) die("out of memory for shared memory");
    ex->runq.reserve(RF_EMU_MAX_THREADS);
    tls_ex = ex;
  }
  return tls_ex;
}

/* xorshift64: the per-pick random (mix() seeds it per block) */
uint64_t next_random(executor *ex) {
  uint64_t x = ex->rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return ex->rng = x;
}

void yield(executor *ex, fiber *f);

void fiber_main(void *arg) {
  executor *ex = (executor *)arg;
  (*ex->body)();
  ex->cur->state = FIBER_DONE;
  yield(ex, ex->cur);
  __builtin_trap(); /* a finished fiber is never resumed */
}

void fiber_init(executor *ex, unsigned t) {
  size_t slot = RF_EMU_GUARD + RF_EMU_STACK;
  while (ex->stacks_made <= t) {
    char *s = ex->stacks + (size_t)ex->stacks_made * slot + RF_EMU_GUARD;
    if (mprotect(s, RF_EMU_STACK, PROT_READ | PROT_WRITE) != 0) die("cannot make a fiber's stack");
    ex->stacks_made++;
  }
  char *top = ex->stacks + (size_t)(t + 1) * slot; /* 16-byte aligned: rsp after the ret */
  void **frame = (void **)(top - 56);
  frame[0] = NULL;                       /* r15 */
  frame[1] = NULL;                       /* r14 */
  frame[2] = (void *)fiber_main;         /* r13: the entry */
  frame[3] = ex;                         /* r12: its argument */
  frame[4] = NULL;                       /* rbx */
  frame[5] = NULL;                       /* rbp */
  frame[6] = (void *)rf_emu_fiber_start; /* the return address */
  fiber *f = &ex->fibers[t];
  f->sp = frame;
  f->tid = t;
  f->state = FIBER_RUNNABLE;
  unsigned bx = tls_block_dim.x, by = tls_block_dim.y;
  f->idx = uint3{t % bx, t / bx % by, t / (bx * by)};
}

[[noreturn]] void block_stuck(executor *ex, const char *why) {
  char census[2048];
  size_t at = 0;
  for (unsigned t = 0; t < ex->nthreads && at < sizeof census - 128; t++) {
    const fiber *f = &ex->fibers[t];
    if (f->state == FIBER_BARRIER &&
        (t == 0 || ex->fibers[t - 1].state != FIBER_BARRIER || ex->fibers[t - 1].bar_line != f->bar_line))
      at += (size_t)snprintf(census + at, sizeof census - at, " thread %u+ at __syncthreads (%s:%d);", t,
                             f->bar_file, f->bar_line);
    else if (f->state == FIBER_WARP && (t % 32 == 0 || ex->fibers[t - 1].state != FIBER_WARP))
      at += (size_t)snprintf(census + at, sizeof census - at, " thread %u+ at %s (mask %08x);", t, f->what,
                             f->mask);
    else if (f->state == FIBER_DONE && (t == 0 || ex->fibers[t - 1].state != FIBER_DONE))
      at += (size_t)snprintf(census + at, sizeof census - at, " thread %u+ exited;", t);
  }
  ex->cur = NULL;
  kernel_fail("%s:%s", why, census);
}

/* A lane arrived at a warp collective: the last of its mask resolves it. */
void warp_arrive(executor *ex, fiber *f) {
  unsigned lane = f->tid % 32, base = f->tid - lane;
  warp *w = &ex->warps[f->tid / 32];
  if (!(f->mask >> lane & 1u))
    kernel_fail("%s with mask %08x from lane %u, which the mask leaves out", f->what, f->mask, lane);
  if (w->arrived == 0) {
    unsigned top = 31 - (unsigned)__builtin_clz(f->mask);
    if (base + top >= ex->nthreads)
      kernel_fail("%s with mask %08x names lane %u, which this block of %u threads does not have", f->what,
                  f->mask, top, ex->nthreads);
    for (unsigned l = 0; l < 32; l++)
      if ((f->mask >> l & 1u) && ex->fibers[base + l].state == FIBER_DONE)
        kernel_fail("lane %u exited while its warp waits for it in %s (mask %08x; it exited first)", l,
                    f->what, f->mask);
    w->mask = f->mask;
    w->resolve = f->resolve;
    w->what = f->what;
  } else if (w->mask != f->mask || w->resolve != f->resolve) {
    kernel_fail("lane %u calls %s (mask %08x) while lanes of its warp wait in %s (mask %08x)", lane, f->what,
                f->mask, w->what, w->mask);
  }
  w->arrived |= 1u << lane;
  if (w->arrived != w->mask) return;
  void *lanes[32] = {NULL};
  for (unsigned l = 0; l < 32; l++)
    if (w->mask >> l & 1u) lanes[l] = ex->fibers[base + l].data;
  w->resolve(lanes, w->mask);
  for (unsigned l = 0; l < 32; l++)
    if (w->mask >> l & 1u) {
      ex->runq.push_back(base + l);
    }
  w->arrived = 0;
}

/* The executor of the kernel running on this thread; stops the program outside one. */
executor *running(const char *what) {
  executor *ex = tls_ex;
  if (ex && ex->cur) return ex;
  die("%s outside a kernel", what);
}

void set_current(executor *ex, fiber *f) {
  ex->cur = f;
  tls_thread_idx = f ? &f->idx : &g_no_thread;
  tls_lane = f ? f->tid % 32 : 0;
}

/* The bookkeeping of fiber f, which just stopped in state f->state. */
void stopped(executor *ex, fiber *f) {
  switch (f->state) {
    case FIBER_DONE: {
      ex->live--;
      const warp *w = &ex->warps[f->tid / 32];
      if (w->arrived && (w->mask >> (f->tid % 32) & 1u))
        kernel_fail("lane %u exited while its warp waits for it in %s (mask %08x)", f->tid % 32, w->what,
                    w->mask);
      break;
    }
    case FIBER_BARRIER:
      if (ex->at_barrier == 0) {
        ex->bar_file = f->bar_file;
        ex->bar_line = f->bar_line;
      } else if (f->bar_line != ex->bar_line || strcmp(f->bar_file, ex->bar_file) != 0) {
        block_stuck(ex, "threads wait at two different __syncthreads");
      }
      ex->at_barrier++;
      break;
    case FIBER_WARP:
      warp_arrive(ex, f);
      break;
    case FIBER_RUNNABLE:
      die("a fiber stopped while runnable");
  }
}

/* A runnable fiber picked at random (removed from the queue), NULL when none. */
fiber *pick(executor *ex) {
  size_t n = ex->runq.size();
  if (n == 0) return NULL;
  size_t i = n == 1 ? 0 : (size_t)(((next_random(ex) >> 32) * n) >> 32);
  unsigned t = ex->runq[i];
  ex->runq[i] = ex->runq[n - 1];
  ex->runq.pop_back();
  ex->fibers[t].state = FIBER_RUNNABLE;
  return &ex->fibers[t];
}

/* Fiber f stops (its state says why): it does its bookkeeping, then the next runnable
 * fiber runs -- itself, another one (one switch), or, when none can, the scheduler. */
void yield(executor *ex, fiber *f) {
  stopped(ex, f);
  fiber *next = pick(ex);
  if (next == f) return;
  set_current(ex, next);
  rf_emu_switch(&f->sp, next ? next->sp : ex->sched_sp);
}

void run_block(executor *ex) {
  unsigned n = ex->nthreads;
  ex->runq.clear();
  for (unsigned t = 0; t < n; t++) {
    fiber_init(ex, t);
    ex->runq.push_back(t);
  }
  for (unsigned w = 0; w * 32 < n; w++) ex->warps[w].arrived = 0;
  memset(ex->smem, 0xff, ex->dynamic);
  ex->static_used = 0;
  ex->nvars = 0;
  ex->live = n;
  ex->at_barrier = 0;
  for (;;) {
    fiber *f = pick(ex);
    if (f) { /* runs fibers until none is runnable */
      set_current(ex, f);
      rf_emu_switch(&ex->sched_sp, f->sp);
      set_current(ex, NULL);
      continue;
    }
    if (ex->live == 0) return;
    if (ex->at_barrier != ex->live) block_stuck(ex, "the block cannot go on");
    if (ex->live != n)
      block_stuck(ex, "__syncthreads after some of the block's threads exited (undefined in CUDA)");
    for (unsigned t = 0; t < n; t++)
      if (ex->fibers[t].state == FIBER_BARRIER) ex->runq.push_back(t);
    ex->at_barrier = 0;
  }
}

uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

}  // namespace

void syncthreads(const char *file, int line) {
  executor *ex = running("__syncthreads");
  fiber *f = ex->cur;
  f->state = FIBER_BARRIER;
  f->bar_file = file;
  f->bar_line = line;
  yield(ex, f);
}

void warp_collective(unsigned mask, warp_resolve_fn resolve, void *data, const char *what) {
  executor *ex = running(what);
  fiber *f = ex->cur;
  f->state = FIBER_WARP;
  f->mask = mask;
  f->resolve = resolve;
  f->data = data;
  f->what = what;
  yield(ex, f);
}

void shfl_resolve(void *const *lanes, unsigned mask) {
  for (unsigned l = 0; l < 32; l++) {
    if (!lanes[l]) continue;
    shfl_lane *me = (shfl_lane *)lanes[l];
    if (me->src >= 32 || !(mask >> me->src & 1u))
      kernel_fail("a shuffle (mask %08x) of lane %u reads lane %u, outside the mask (undefined in CUDA)",
                  mask, l, me->src);
    me->result = ((shfl_lane *)lanes[me->src])->value;
  }
}

void ballot_resolve(void *const *lanes, unsigned mask) {
  unsigned bits = 0;
  for (unsigned l = 0; l < 32; l++)
    if (lanes[l] && ((vote_lane *)lanes[l])->pred) bits |= 1u << l;
  for (unsigned l = 0; l < 32; l++)
    if (lanes[l]) ((vote_lane *)lanes[l])->result = bits & mask;
}

void syncwarp_resolve(void *const *lanes, unsigned mask) {
  (void)lanes;
  (void)mask;
}

void *dynamic_smem(void) { return running("extern __shared__")->smem; }

void *static_smem(const void *key, size_t size, size_t align) {
  executor *ex = running("__shared__");
  for (int i = 0; i < ex->nvars; i++)
    if (ex->vars[i].key == key) return ex->smem + ex->vars[i].offset;
  if (ex->nvars == RF_EMU_MAX_SHARED_VARS)
    kernel_fail("more than %d __shared__ objects", RF_EMU_MAX_SHARED_VARS);
  size_t at = (ex->dynamic + ex->static_used + align - 1) / align * align;
  ex->static_used = at + size - ex->dynamic;
  if (ex->static_used > RF_EMU_STATIC_SMEM)
    kernel_fail("%zu bytes of static shared memory, above CUDA's %u", ex->static_used, RF_EMU_STATIC_SMEM);
  if (ex->dynamic + ex->static_used > ex->limit)
    kernel_fail("%zu bytes of dynamic and %zu of static shared memory, above the %zu this launch may use",
                ex->dynamic, ex->static_used, ex->limit);
  memset(ex->smem + at, 0xff, size);
  ex->vars[ex->nvars].key = key;
  ex->vars[ex->nvars].offset = at;
  ex->nvars++;
  return ex->smem + at;
}

void kernel_fail(const char *fmt, ...) {
  char msg[3072];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char where[256];
  die("%s: %s", current_kernel(where, sizeof where), msg);
}

const char *current_kernel(char *buf, size_t size) {
  executor *ex = tls_ex;
  if (!ex || !ex->kernel) return NULL;
  if (ex->cur)
    snprintf(buf, size, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u)", ex->kernel, tls_block_idx.x,
             tls_block_idx.y, tls_block_idx.z, ex->cur->idx.x, ex->cur->idx.y, ex->cur->idx.z);
  else
    snprintf(buf, size, "kernel %s, block (%u,%u,%u)", ex->kernel, tls_block_idx.x, tls_block_idx.y,
             tls_block_idx.z);
  return buf;
}

int fiber_stack_fault(const void *addr) {
  executor *ex = tls_ex;
  if (!ex) return 0;
  const char *a = (const char *)addr;
  size_t slot = RF_EMU_GUARD + RF_EMU_STACK;
  if (a < ex->stacks || a >= ex->stacks + slot * RF_EMU_MAX_THREADS) return 0;
  return (size_t)(a - ex->stacks) % slot < RF_EMU_GUARD;
}

void run_grid(const char *name, dim3 grid, dim3 block, size_t dynamic_smem, size_t smem_limit,
              const std::function<void()> &body, uint64_t seed) {
  executor *ex = this_executor();
  if (smem_limit > ex->smem_cap) die("a shared memory limit above %zu bytes", ex->smem_cap);
  ex->kernel = name;
  ex->body = &body;
  ex->nthreads = block.x * block.y * block.z;
  ex->dynamic = dynamic_smem;
  ex->limit = smem_limit;
  tls_block_dim = uint3{block.x, block.y, block.z};
  tls_grid_dim = uint3{grid.x, grid.y, grid.z};
  uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
  /* blocks in the order a * i + c mod blocks, a coprime with blocks */
  uint64_t a = 1, c = 0;
  if (blocks > 1) {
    uint64_t r = mix(seed);
    c = r % blocks;
    a = mix(r) % blocks;
    if (a == 0) a = 1;
    while (gcd(a, blocks) != 1) a = a + 1 == blocks ? 1 : a + 1;
  }
  for (uint64_t i = 0; i < blocks; i++) {
    uint64_t b = (uint64_t)(((unsigned __int128)a * i + c) % blocks);
    tls_block_idx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y),
                          (unsigned)(b / ((uint64_t)grid.x * grid.y))};
    ex->rng = mix(seed ^ (b * 0x9e3779b97f4a7c15ull)) | 1; /* xorshift's state is never 0 */
    run_block(ex);
  }
  ex->kernel = NULL;
  ex->body = NULL;
}

}  // namespace rf_emu
