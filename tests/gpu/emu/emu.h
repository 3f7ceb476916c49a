/* What the parts of cuda-emu share (runtime.cpp, block.cpp, cublaslt.cpp, nccl.cpp):
 * device memory and its view, stream work queues, error reporting. Internal: the
 * programs see only the CUDA, cuBLASLt and NCCL headers of include/. */
#ifndef RF_EMU_EMU_H
#define RF_EMU_EMU_H

#include <stddef.h>
#include <stdint.h>

#include <functional>

#include "cuda_runtime.h"

namespace rf_emu {

/* ---- reporting ---- */
/* Prints "cuda-emu: <message>" on stderr (every refusal of the stand-in says why
 * there, since CUDA's error codes cannot) and returns e after setting it as the
 * thread's last error. */
cudaError_t fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A bug found where CUDA would fault or hang: prints and aborts. */
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t env_u64(const char *name, uint64_t fallback);
/* splitmix64 */
uint64_t mix(uint64_t x);

/* ---- memory ---- */
enum place { PLACE_PAGEABLE, PLACE_PINNED, PLACE_DEVICE, PLACE_DEVICE_FREED };
struct where {
  enum place place;
  int device;       /* PLACE_DEVICE */
  const char *base; /* the allocation holding it (device or pinned) */
  size_t size;
};
/* Where p lies (device: a live allocation, or PLACE_DEVICE_FREED for any other address
 * of the device reservation). */
struct where locate(const void *p);
/* The bytes behind a device address, for the stand-in itself (kernels, copies, NCCL,
 * cuBLASLt); other pointers unchanged. */
void *view(const void *p);
int in_device_range(const void *p);
/* Checks that [p, p + bytes) lies in one live device allocation; else fail()s naming
 * `what` (an API and an argument) and returns the error. */
cudaError_t check_device_range(const void *p, size_t bytes, const char *what);
void sync_device(int device); /* every stream of the device idle (cudaDeviceSynchronize) */

/* ---- streams ---- */
struct stream;
/* The stream a handle names (0 and cudaStreamLegacy: the current device's legacy default
 * stream); NULL after fail()ing on a handle that is not a live stream, or of another device. */
struct stream *stream_of(cudaStream_t s, const char *api);
/* Queues work: it runs on the stream's worker after everything queued on it before,
 * (CUDA's legacy rules) after the other streams' work it must follow, and after point
 * after_seq of stream `after` when given. Returns its point on s. */
uint64_t enqueue(struct stream *s, const char *what, std::function<void()> work, struct stream *after = NULL,
                 uint64_t after_seq = 0);
int stream_device(const struct stream *s);
void count_host_wait(void);
int current_device(void);

/* ---- counters (rf_emu_get_stats) ---- */
struct counters {
  uint64_t host_waits, kernels, copies, mallocs, matmuls, nccl_ops, bytes_device;
};
extern struct counters stats;
void count(uint64_t *counter, uint64_t n);

/* ---- kernels (block.cpp) ---- */
/* Runs a grid on this thread: blocks in a random order, each block's threads as fibers. */
void run_grid(const char *name, dim3 grid, dim3 block, size_t dynamic_smem, size_t smem_limit,
              const std::function<void()> &body, uint64_t seed);
/* The kernel this thread runs now (for the fault handler), NULL when none. */
const char *current_kernel(char *buf, size_t size);
int fiber_stack_fault(const void *addr);

}  // namespace rf_emu

#endif
