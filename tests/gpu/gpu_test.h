/* What the GPU kernel tests share (test_kernels_cuda.c, test_gpt_oss_cuda.c, test_mla_cuda.c): a
 * CUDA call that must succeed, the start (a device, its name, a stream), device buffers put, filled
 * with NaN and read back, and a device result checked against the host's within a tolerance in
 * units of f32's roundoff or bit for bit. */
#ifndef RF_TESTS_GPU_TEST_H
#define RF_TESTS_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "device/device.h"
#include "rf_test.h"

#define RF_GPU_U (1.0 / 16777216.0) /* 2^-24, f32's unit roundoff */

/* A CUDA call that must succeed (an expression: stops the test with the call and the reason). */
static inline void rf_gpu_ck(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  exit(1);
}
#define RF_GPU_CK(call) rf_gpu_ck((call), #call, __FILE__, __LINE__)

/* A kernel test's start: 0 after printing "NAME on GPU (sm_XY, N SMs)" and making *stream's handle a
 * blocking stream (so that cudaMemcpy's reads on the legacy stream wait for its kernels); 1 after
 * saying so where there is no CUDA device. */
static inline int rf_gpu_test_begin(const char *name, struct rf_device_stream *stream) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "%s: no CUDA device (run it on a GPU machine: scripts/gpu-check)\n", name);
    return 1;
  }
  struct cudaDeviceProp prop;
  RF_GPU_CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  RF_GPU_CK(cudaStreamCreate(&st));
  stream->handle = st;
  printf("%s on %s (sm_%d%d, %d SMs)\n", name, prop.name, prop.major, prop.minor, prop.multiProcessorCount);
  return 0;
}

static inline void *rf_gpu_dalloc(size_t bytes) {
  void *p = NULL;
  RF_GPU_CK(cudaMalloc(&p, bytes ? bytes : 4));
  return p;
}
/* A device copy of the host's `bytes` at h. */
static inline void *rf_gpu_dput(const void *h, size_t bytes) {
  void *p = rf_gpu_dalloc(bytes);
  RF_GPU_CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
  return p;
}
/* A device buffer of n floats full of NaN (0xff bytes). */
static inline float *rf_gpu_dnan(size_t n) {
  float *p = rf_gpu_dalloc(n * sizeof(float));
  RF_GPU_CK(cudaMemset(p, 0xff, n * sizeof(float)));
  return p;
}
/* The device buffer's n floats, into a new host buffer (after the device's work). */
static inline float *rf_gpu_dget(const float *d, size_t n) {
  float *h = rf_xmalloc(n * sizeof(float) + 4);
  RF_GPU_CK(cudaDeviceSynchronize());
  RF_GPU_CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

/* got (device, copied back) against ref (host): max |got - ref| / max |ref| within tol_u u.
 * zero_scale > 0: the reference may be all zero (exactly, in exact arithmetic), and the
 * difference is then measured against zero_scale (the inputs' size) instead. */
static inline void rf_gpu_check_rel_scaled(const char *what, const float *dgot, const float *ref, size_t n,
                                           double tol_u, double zero_scale) {
  float *got = rf_gpu_dget(dgot, n);
  double amax = rf_test_max_abs(ref, n), diff = rf_test_max_abs_diff(got, ref, n);
  double scale = amax > zero_scale ? amax : zero_scale;
  double rel = scale > 0 ? diff / scale : diff;
  printf("  %-52s n=%-8zu max|ref| %-9.3g err %8.2f u (tol %.0f u)\n", what, n, amax, rel / RF_GPU_U, tol_u);
  RF_CHECK(rel <= tol_u * RF_GPU_U && (amax > 0 || zero_scale > 0),
           "%s: %.3g u from the host (tolerance %.0f u)", what, rel / RF_GPU_U, tol_u);
  free(got);
}

/* got (device, copied back) against ref (host), the same bits (NaN payloads included); prints how
 * many elements differ and by how many ulps at most (same signs). */
static inline void rf_gpu_check_bits(const char *what, const float *dgot, const float *ref, size_t n) {
  float *got = rf_gpu_dget(dgot, n);
  size_t ndiff = 0;
  int64_t ulps = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t a = rf_f32_bits(got[i]), b = rf_f32_bits(ref[i]);
    if (a == b) continue;
    ndiff++;
    int64_t d = llabs((int64_t)a - (int64_t)b);
    ulps = d > ulps ? d : ulps;
  }
  printf("  %-52s n=%-8zu %s (%zu differ, max %lld ulp)\n", what, n, ndiff ? "DIFFERENT" : "same bits", ndiff,
         (long long)ulps);
  RF_CHECK(ndiff == 0, "%s: %zu of %zu elements differ from the host (max %lld ulp)", what, ndiff, n,
           (long long)ulps);
  free(got);
}

/* The device buffer's n floats are still the NaN bytes of rf_gpu_dnan (a call that must write
 * nothing, e.g. on zero rows): checked, printed. */
static inline void rf_gpu_check_untouched(const char *what, const float *d, size_t n) {
  float *got = rf_gpu_dget(d, n);
  int untouched = 1;
  for (size_t i = 0; i < n; i++) untouched &= rf_f32_bits(got[i]) == 0xffffffffu;
  printf("  %-52s %s\n", what, untouched ? "nothing written" : "WRITTEN");
  RF_CHECK(untouched, "%s: a zero-size call wrote into its output", what);
  free(got);
}
#endif
