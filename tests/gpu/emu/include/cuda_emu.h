/* cuda-emu's own door (not CUDA): what the stand-in counted, for tests that run the
 * CUDA build on the CPU (make BACKEND=cuda-emu). Defined by tests/gpu/emu/runtime.cpp.
 *
 * Environment read by the stand-in (it is a test tool; nothing of rfsdp reads these):
 *   RF_EMU_SEED=N        the seed of the threads' and blocks' order and of the stream
 *                        workers' delays (default 1: runs repeat)
 *   RF_EMU_DELAY_US=N    a stream's worker sleeps up to N microseconds (random) before
 *                        half of its operations, so work runs later than it was asked
 *                        for and a missing wait shows (default 200; 0: none)
 *   RF_EMU_DEVICES=N     how many GPUs cudaGetDeviceCount reports (default 1)
 *   RF_EMU_NCCL_FAIL=K   the K-th NCCL operation of this process (1-based) fails
 *                        asynchronously, as a broken transport does: it never finishes
 *                        and ncclCommGetAsyncError reports ncclSystemError until the
 *                        communicator is aborted (nccl.cpp)
 *   RF_EMU_NCCL_HANG=K   the K-th NCCL operation of this process never finishes and
 *                        reports no error, as one whose peer stopped (nccl.cpp) */
#ifndef RF_EMU_CUDA_EMU_H
#define RF_EMU_CUDA_EMU_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct rf_emu_stats {
  uint64_t host_waits;   /* the host waited for the GPU: stream, event, device synchronize, cudaFree,
                            a copy to pageable host memory */
  uint64_t kernels;      /* kernels run */
  uint64_t copies;       /* cudaMemcpy(Async) calls */
  uint64_t mallocs;      /* cudaMalloc, cudaMallocHost, cudaHostAlloc calls */
  uint64_t matmuls;      /* cublasLtMatmul calls */
  uint64_t nccl_ops;     /* NCCL operations queued */
  uint64_t bytes_device; /* device bytes allocated now */
};
void rf_emu_get_stats(struct rf_emu_stats *stats);

#ifdef __cplusplus
}
#endif

#endif
