/* The GPU tests' timing tables (test_kernels_cuda.c, test_fused_cuda.c; on a GPU only):
 * one kernel's median time over RF_GPU_TIMING_REPS runs after a warm-up, CUDA events
 * around each run on the given stream, printed as "  NAME  US us[  GB/s]" (the line
 * scripts/gpu-check collects for its ten most expensive kernels). */
#ifndef RF_TESTS_GPU_TIMING_H
#define RF_TESTS_GPU_TIMING_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define RF_GPU_TIMING_REPS 20

static inline int rf_gpu_timing_cmp(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

static inline void rf_gpu_timing_check(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "timing %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

/* The median of the runs of fn(ctx) in microseconds, printed with the bandwidth of
 * `bytes` moved per run (0: none printed). */
static inline void rf_gpu_timed(const char *what, void (*fn)(void *), void *ctx, double bytes,
                                cudaStream_t stream) {
  cudaEvent_t e0, e1;
  rf_gpu_timing_check(cudaEventCreate(&e0), what);
  rf_gpu_timing_check(cudaEventCreate(&e1), what);
  float ms[RF_GPU_TIMING_REPS];
  fn(ctx); /* warm-up */
  for (int r = 0; r < RF_GPU_TIMING_REPS; r++) {
    rf_gpu_timing_check(cudaEventRecord(e0, stream), what);
    fn(ctx);
    rf_gpu_timing_check(cudaEventRecord(e1, stream), what);
    rf_gpu_timing_check(cudaEventSynchronize(e1), what);
    rf_gpu_timing_check(cudaEventElapsedTime(&ms[r], e0, e1), what);
  }
  qsort(ms, RF_GPU_TIMING_REPS, sizeof ms[0], rf_gpu_timing_cmp);
  double us = 0.5 * (ms[RF_GPU_TIMING_REPS / 2 - 1] + ms[RF_GPU_TIMING_REPS / 2]) * 1e3;
  printf("  %-34s %10.1f us", what, us);
  if (bytes > 0) printf("   %7.0f GB/s", bytes / (us * 1e-6) / 1e9);
  printf("\n");
  rf_gpu_timing_check(cudaEventDestroy(e0), what);
  rf_gpu_timing_check(cudaEventDestroy(e1), what);
}

#endif
