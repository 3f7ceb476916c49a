/* cuda-emu's own test (make BACKEND=cuda-emu builds it as build-cuda-emu/tests/gpu/emu_selftest;
 * tests/test_cuda_emu.c runs it): the stand-in must be strict where CUDA is lenient, so each
 * rule of runtime.cpp, block.cpp, cublaslt.cpp and nccl.cpp that a bug can break is broken
 * here on purpose and must be refused or stop the program, and each behaviour CUDA
 * documents (the legacy stream's order, events, shuffles) must hold. A bug that stops a
 * program runs in a child (this program again, with --die NAME) whose message is checked.
 * Run under MPI (scripts/rfmpirun -np 1: the NCCL part), from the repository's root. */
#include <cublasLt.h>
#include <mpi.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int checks, failures;
#define CHECK(cond, ...)                                    \
  do {                                                      \
    checks++;                                               \
    if (!(cond)) {                                          \
      failures++;                                           \
      fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                         \
      fputc('\n', stderr);                                  \
    }                                                       \
  } while (0)

/* ---- kernels ---- */
__global__ void write_kernel(float *p, int n, float v) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = v;
}
/* one thread: waits for the host's flag (pinned memory), then writes p[0] */
__global__ void gate_kernel(const volatile int *flag, float *p) {
  while (*flag == 0) {
  }
  p[0] = 1.0f;
}
__global__ void copy_kernel(float *out, const float *in) { out[0] = in[0]; }
__global__ void shared_read_kernel(float *out) {
  __shared__ float sh[64];
  out[blockIdx.x * 64 + threadIdx.x] = sh[threadIdx.x];
}
__global__ void order_kernel(unsigned *order, unsigned *counter) {
  unsigned k = atomicAdd(counter, 1u);
  order[k] = threadIdx.x;
}
__global__ void warp_kernel(float *sum, float *down, unsigned *ballot) {
  float v = (float)threadIdx.x;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  sum[threadIdx.x] = v;
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, (float)threadIdx.x, 3);
  ballot[threadIdx.x] = __ballot_sync(0xffffffffu, threadIdx.x % 3 == 0);
}
__global__ void diverge_kernel(float *p) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  p[threadIdx.x] = 0.0f;
}
__global__ void exit_then_sync_kernel(float *p) {
  if (threadIdx.x == 0) return;
  __syncthreads();
  p[threadIdx.x] = 1.0f;
}
__global__ void shfl_exited_kernel(float *p) {
  if (threadIdx.x == 5) return;
  p[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}
__global__ void big_smem_kernel(float *p) {
  extern __shared__ float sm[];
  sm[threadIdx.x * 64] = (float)threadIdx.x;
  __syncthreads();
  p[threadIdx.x] = sm[((threadIdx.x + 1) % blockDim.x) * 64];
}

/* ---- deaths: each a bug the stand-in must stop at, run in a child ---- */
static float *dalloc(size_t bytes) {
  void *p = NULL;
  if (cudaMalloc(&p, bytes) != cudaSuccess) abort();
  return (float *)p;
}
static void die_host_reads_device(void) {
  float *d = dalloc(64);
  volatile float x = d[0];
  (void)x;
}
static void die_kernel_past_end(void) {
  float *d = dalloc(4096); /* 1024 floats, ending at a page boundary */
  write_kernel<<<5, 256>>>(d, 1025, 1.0f);
  cudaDeviceSynchronize();
}
static void die_kernel_host_pointer(void) {
  float *h = (float *)calloc(256, sizeof(float));
  write_kernel<<<1, 32>>>(h, 32, 1.0f);
  cudaDeviceSynchronize();
}
static void die_kernel_after_free(void) {
  float *d = dalloc(1024);
  cudaFree(d);
  write_kernel<<<1, 32>>>(d, 32, 1.0f);
  cudaDeviceSynchronize();
}
static void die_diverged_barrier(void) {
  diverge_kernel<<<1, 32>>>(dalloc(128));
  cudaDeviceSynchronize();
}
static void die_exit_then_barrier(void) {
  exit_then_sync_kernel<<<1, 32>>>(dalloc(128));
  cudaDeviceSynchronize();
}
static void die_shuffle_exited_lane(void) {
  shfl_exited_kernel<<<1, 32>>>(dalloc(128));
  cudaDeviceSynchronize();
}

static const struct {
  const char *name;
  void (*run)(void);
  const char *says;
} deaths[] = {
    {"host-reads-device", die_host_reads_device, "the host touched device memory"},
    {"kernel-past-end", die_kernel_past_end, "an access outside device memory"},
    {"kernel-host-pointer", die_kernel_host_pointer, "dereferenced a pageable host pointer"},
    {"kernel-after-free", die_kernel_after_free, "an access outside device memory"},
    {"diverged-barrier", die_diverged_barrier, "two different __syncthreads"},
    {"exit-then-barrier", die_exit_then_barrier, "after some of the block's threads exited"},
    {"shuffle-exited-lane", die_shuffle_exited_lane, "exited while its warp waits for it"},
};

static void check_deaths(const char *self) {
  for (size_t i = 0; i < sizeof deaths / sizeof deaths[0]; i++) {
    char cmd[4200], out[8192] = "";
    snprintf(cmd, sizeof cmd, "%s --die %s 2>&1", self, deaths[i].name);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    int status = p ? pclose(p) : 0;
    CHECK(status != 0 && strstr(out, deaths[i].says), "%s: exit status %d, expected a stop saying '%s': %s",
          deaths[i].name, status, deaths[i].says, out);
  }
}

/* ---- memory and copies ---- */
static void check_memory(void) {
  float *d = dalloc(64), *d2 = dalloc(64), h[16], *pinned = NULL;
  CHECK(cudaMallocHost((void **)&pinned, 64) == cudaSuccess, "cudaMallocHost");
  CHECK(cudaMemcpy(h, d, 64, cudaMemcpyDeviceToHost) == cudaSuccess && h[0] != h[0],
        "cudaMalloc's memory reads as NaN until written");
  CHECK(cudaMemcpy(d, d2, 64, cudaMemcpyHostToDevice) == cudaErrorInvalidMemcpyDirection,
        "a host-to-device copy from device memory is refused");
  CHECK(cudaMemcpy(h, h + 4, 16, cudaMemcpyDeviceToHost) == cudaErrorInvalidMemcpyDirection,
        "a device-to-host copy from host memory is refused");
  CHECK(cudaMemcpy(d, h, 65, cudaMemcpyHostToDevice) == cudaErrorInvalidValue,
        "a copy past the allocation's end is refused");
  CHECK(cudaMemset(h, 0, 16) == cudaErrorInvalidValue, "a memset of host memory is refused");
  (void)cudaGetLastError();
  struct cudaPointerAttributes a;
  CHECK(cudaPointerGetAttributes(&a, d + 3) == cudaSuccess && a.type == cudaMemoryTypeDevice,
        "device memory says so");
  CHECK(cudaPointerGetAttributes(&a, pinned) == cudaSuccess && a.type == cudaMemoryTypeHost,
        "pinned memory says so");
  CHECK(cudaPointerGetAttributes(&a, h) == cudaSuccess && a.type == cudaMemoryTypeUnregistered,
        "pageable memory says so");
  cudaFree(d), cudaFree(d2), cudaFreeHost(pinned);
}

/* ---- streams and events: the legacy stream's rules, made observable by a kernel that
 * waits for the host ---- */
struct flag_later {
  int *flag;
};
static void *set_flag_later(void *arg) {
  usleep(100 * 1000);
  __atomic_store_n(((struct flag_later *)arg)->flag, 1, __ATOMIC_SEQ_CST);
  return NULL;
}
static void check_streams(void) {
  int *flag = NULL;
  cudaMallocHost((void **)&flag, sizeof *flag);
  float *d = dalloc(4), *out = dalloc(4), h = -1.0f;
  cudaStream_t nb, blocking, s2;
  cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
  cudaStreamCreate(&blocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  /* a non-blocking stream's work does not order the legacy stream's */
  *flag = 0;
  cudaMemset(d, 0, 4);
  cudaDeviceSynchronize();
  gate_kernel<<<1, 1, 0, nb>>>(flag, d);
  cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost); /* legacy: does not wait for nb */
  CHECK(h == 0.0f, "the legacy stream waited for a non-blocking stream (read %g)", h);
  *flag = 1;
  cudaStreamSynchronize(nb);
  /* a blocking stream's work orders the legacy stream's: the copy waits for the gate */
  *flag = 0;
  cudaMemset(d, 0, 4);
  cudaDeviceSynchronize();
  gate_kernel<<<1, 1, 0, blocking>>>(flag, d);
  struct flag_later later = {flag};
  pthread_t t;
  pthread_create(&t, NULL, set_flag_later, &later);
  cudaMemcpy(&h, d, 4, cudaMemcpyDeviceToHost);
  pthread_join(t, NULL);
  CHECK(h == 1.0f, "the legacy stream did not wait for a blocking stream (read %g)", h);
  /* an event orders one stream after another without the host */
  *flag = 0;
  cudaMemset(d, 0, 4);
  cudaMemset(out, 0, 4);
  cudaDeviceSynchronize();
  cudaEvent_t e;
  cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  gate_kernel<<<1, 1, 0, nb>>>(flag, d);
  cudaEventRecord(e, nb);
  cudaStreamWaitEvent(s2, e, 0);
  copy_kernel<<<1, 1, 0, s2>>>(out, d);
  usleep(20 * 1000);
  CHECK(cudaStreamQuery(s2) == cudaErrorNotReady && cudaEventQuery(e) == cudaErrorNotReady,
        "a stream waiting for an event ran on");
  struct rf_emu_stats s0, s1;
  rf_emu_get_stats(&s0);
  *flag = 1;
  cudaStreamSynchronize(s2);
  rf_emu_get_stats(&s1);
  cudaMemcpy(&h, out, 4, cudaMemcpyDeviceToHost);
  CHECK(h == 1.0f && cudaEventQuery(e) == cudaSuccess, "the event's order: read %g", h);
  CHECK(s1.host_waits == s0.host_waits + 1, "a stream synchronize counted %llu host waits",
        (unsigned long long)(s1.host_waits - s0.host_waits));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e, e) == cudaErrorInvalidResourceHandle,
        "timing an untimed event is refused");
  cudaEventDestroy(e);
  CHECK(cudaEventQuery(e) == cudaErrorInvalidResourceHandle, "a destroyed event is refused");
  (void)cudaGetLastError();
  cudaStreamDestroy(nb), cudaStreamDestroy(blocking), cudaStreamDestroy(s2);
  cudaFree(d), cudaFree(out), cudaFreeHost(flag);
}

/* ---- kernels: limits, shared memory, order, warps ---- */
static void check_kernels(void) {
  float *d = dalloc(4096), h[1024];
  cudaMemset(d, 0, 4096);
  write_kernel<<<1, 1025>>>(d, 1, 5.0f);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration, "a block of 1025 threads is refused");
  cudaMemcpy(h, d, 4, cudaMemcpyDeviceToHost);
  CHECK(h[0] == 0.0f, "a refused launch ran");
  big_smem_kernel<<<1, 32, 64 * 1024>>>(d);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue, "64 KiB of dynamic shared memory without the attribute");
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 240 * 1024) ==
            cudaErrorInvalidValue,
        "an attribute above sm_90's 227 KiB is refused");
  (void)cudaGetLastError();
  CHECK(cudaFuncSetAttribute(big_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) ==
            cudaSuccess,
        "cudaFuncSetAttribute");
  big_smem_kernel<<<1, 32, 64 * 1024>>>(d);
  CHECK(cudaGetLastError() == cudaSuccess, "64 KiB of dynamic shared memory after the attribute");
  cudaMemcpy(h, d, 32 * 4, cudaMemcpyDeviceToHost);
  CHECK(h[0] == 1.0f && h[31] == 0.0f, "the block's shared memory: %g %g", h[0], h[31]);
  shared_read_kernel<<<3, 64>>>(d);
  cudaMemcpy(h, d, 192 * 4, cudaMemcpyDeviceToHost);
  int nan = 0;
  for (int i = 0; i < 192; i++) nan += h[i] != h[i];
  CHECK(nan == 192, "shared memory read before written is NaN in every block: %d of 192", nan);
  unsigned *order = (unsigned *)dalloc(256 * 4 + 4), ho[256];
  cudaMemset(order, 0, 256 * 4 + 4);
  order_kernel<<<1, 256>>>(order, order + 256);
  cudaMemcpy(ho, order, 256 * 4, cudaMemcpyDeviceToHost);
  int in_order = 0, seen[256] = {0}, all = 1;
  for (int i = 0; i < 256; i++) in_order += ho[i] == (unsigned)i, seen[ho[i] & 255]++;
  for (int i = 0; i < 256; i++) all &= seen[i] == 1;
  CHECK(all && in_order < 32, "a block's threads run in a random order: %d of 256 in place", in_order);
  float *sum = dalloc(64 * 4), *down = sum + 32, hs[64];
  unsigned *ballot = (unsigned *)dalloc(32 * 4), hb[32];
  warp_kernel<<<1, 32>>>(sum, down, ballot);
  cudaMemcpy(hs, sum, 64 * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb, ballot, 32 * 4, cudaMemcpyDeviceToHost);
  int ok = 1;
  for (int l = 0; l < 32; l++) {
    ok &= hs[l] == 496.0f && hs[32 + l] == (float)(l + 3 < 32 ? l + 3 : l);
    ok &= hb[l] == 0x49249249u;
  }
  CHECK(ok, "shuffles and ballot: lane 0 sum %g, down %g, ballot %08x", hs[0], hs[32], hb[0]);
  cudaFree(d), cudaFree(order), cudaFree(sum), cudaFree(ballot);
}

/* FP8 block scaling on 16 x 32 x 256 (m x n x k, TN): A in 128 x 128 tiles, B in 1 x 128: a
 * value with the scale layouts (BLK: tile (ib, kb) at ib * 4 + kb; VEC128: (j, kb) at kb * n + j),
 * and each rule broken: NN, k not a multiple of 128, a scale tensor short of its size, host
 * scales, no scale pointer, BLK128x128 on both. */
static void check_cublaslt_fp8(cublasLtHandle_t lt, cublasLtMatmulPreference_t pref) {
  const int m = 16, n = 32, k = 256;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, ld, lka, lkb, lnn;
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t blk = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, vec = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  cublasOperation_t t = CUBLAS_OP_T, nn = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &blk, sizeof blk);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof vec);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
  cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
  cublasLtMatrixLayoutCreate(&lka, CUDA_R_8F_E4M3, 64, m, 64);
  cublasLtMatrixLayoutCreate(&lkb, CUDA_R_8F_E4M3, 64, n, 64);
  cublasLtMatrixLayoutCreate(&lnn, CUDA_R_8F_E4M3, m, k, m); /* A not transposed: m x k */
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &r, &found) == CUBLAS_STATUS_SUCCESS &&
            found == 1,
        "a heuristic for FP8 16x32x256");
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, lka, lkb, ld, ld, pref, 1, &r, &found) == CUBLAS_STATUS_NOT_SUPPORTED,
        "FP8 with k = 64 (not a multiple of 128) is refused");
  cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &r, &found);
  uint8_t ha[16 * 256], hb[32 * 256];
  for (int i = 0; i < m * k; i++) ha[i] = (uint8_t)(i % 5 == 0 ? 0x38 : i % 5 == 1 ? 0xb0 : 0x00); /* 1, -0.5 */
  for (int i = 0; i < n * k; i++) hb[i] = (uint8_t)(i % 3 == 0 ? 0x40 : 0x30); /* 2, 0.5 */
  float hsa[4] = {0.5f, 4.0f, -1.0f, -1.0f}, hsb[2 * 32]; /* A: one tile row, L4 = 4 (2 used) */
  for (int i = 0; i < 2 * n; i++) hsb[i] = 0.25f * (float)(1 + i % 7);
  uint8_t *a = (uint8_t *)dalloc(sizeof ha), *b = (uint8_t *)dalloc(sizeof hb);
  float *sa = dalloc(sizeof hsa), *sb = dalloc(sizeof hsb), *sshort = dalloc(2 * sizeof(float)),
        *d = dalloc(m * n * 4), hd[16 * 32], one = 1.0f, zero = 0.0f;
  cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb, sizeof hb, cudaMemcpyHostToDevice);
  cudaMemcpy(sa, hsa, sizeof hsa, cudaMemcpyHostToDevice);
  cudaMemcpy(sb, hsb, sizeof hsb, cudaMemcpyHostToDevice);
  CHECK(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "FP8 without scale pointers is refused");
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sshort, sizeof sshort);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof sb);
  CHECK(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "A's BLK128x128 scales short of L4 = 4 per tile row are refused");
  float *hs = hsa;
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &hs, sizeof hs);
  CHECK(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "host scales are refused");
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof sa);
  CHECK(cublasLtMatmul(lt, op, &one, a, la, b, lb, &zero, d, ld, d, ld, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_SUCCESS,
        "an FP8 block-scaled cublasLtMatmul");
  cudaMemcpy(hd, d, sizeof hd, cudaMemcpyDeviceToHost);
  int i = 3, j = 5; /* D(i, j) = sum over kb of sa[kb] sb[kb * n + j] sum_p A(p, i) B(p, j) */
  float want = 0;
  for (int q = 0; q < 2; q++) {
    float part = 0;
    for (int p = 128 * q; p < 128 * (q + 1); p++) {
      uint8_t ca = ha[i * k + p], cb = hb[j * k + p];
      part += (ca == 0x38 ? 1.0f : ca == 0xb0 ? -0.5f : 0.0f) * (cb == 0x40 ? 2.0f : 0.5f);
    }
    want += part * (hsa[q] * hsb[q * n + j]);
  }
  CHECK(hd[j * m + i] == want, "FP8 D(%d,%d) = %g, want %g (the scale layouts)", i, j, hd[j * m + i], want);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &nn, sizeof nn);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, lnn, lb, ld, ld, pref, 1, &r, &found) == CUBLAS_STATUS_NOT_SUPPORTED,
        "FP8 NN (not TN) is refused");
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &blk, sizeof blk);
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, 1, &r, &found) == CUBLAS_STATUS_NOT_SUPPORTED,
        "BLK128x128 scales on both A and B are refused");
  cudaDeviceSynchronize();
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatrixLayoutDestroy(lka), cublasLtMatrixLayoutDestroy(lkb), cublasLtMatrixLayoutDestroy(lnn);
  cublasLtMatmulDescDestroy(op);
  cudaFree(a), cudaFree(b), cudaFree(sa), cudaFree(sb), cudaFree(sshort), cudaFree(d);
}

/* ---- cuBLASLt's rules ---- */
static void check_cublaslt(void) {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t l8, l4;
  cublasLtMatmulPreference_t pref;
  cublasLtCreate(&lt);
  cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasLtMatrixLayoutCreate(&l8, CUDA_R_32F, 8, 8, 8);
  cublasLtMatrixLayoutCreate(&l4, CUDA_R_32F, 4, 4, 4);
  cublasLtMatmulPreferenceCreate(&pref);
  uint32_t align = 16;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, 4);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, 4);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, 4);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, 4);
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  CHECK(
      cublasLtMatmulAlgoGetHeuristic(lt, op, l8, l8, l8, l8, pref, 1, &r, &found) == CUBLAS_STATUS_SUCCESS &&
          found == 1,
      "a heuristic for 8x8x8");
  float *a = dalloc(8 * 8 * 4 + 64), *c = dalloc(8 * 8 * 4), ha[64], hc[64], one = 1.0f, zero = 0.0f;
  for (int i = 0; i < 64; i++) ha[i] = (float)(i % 7) - 3.0f;
  cudaMemcpy(a, ha, sizeof ha, cudaMemcpyHostToDevice);
  CHECK(cublasLtMatmul(lt, op, &one, a, l8, a, l8, &zero, c, l8, c, l8, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_SUCCESS,
        "cublasLtMatmul");
  cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost);
  float want = 0;
  for (int p = 0; p < 8; p++) want += ha[p * 8 + 1] * ha[2 * 8 + p]; /* column-major C(1, 2) */
  CHECK(hc[2 * 8 + 1] == want, "C(1,2) = %g, want %g", hc[2 * 8 + 1], want);
  CHECK(cublasLtMatmul(lt, op, &one, a + 2, l8, a, l8, &zero, c, l8, c, l8, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "A 8 bytes off the 16 the algorithm was chosen for is refused");
  CHECK(cublasLtMatmul(lt, op, &one, a, l4, a, l4, &zero, c, l4, c, l4, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "an algorithm chosen for other layouts is refused");
  CHECK(cublasLtMatmul(lt, op, &one, ha, l8, a, l8, &zero, c, l8, c, l8, &r.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "host memory as A is refused");
  /* the bias epilogue: its pointer required, inside an allocation, added to each row of D */
  cublasLtMatmulDesc_t opb;
  cublasLtMatmulDescCreate(&opb, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
  cublasLtMatmulDescSetAttribute(opb, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  cublasLtMatmulHeuristicResult_t rb;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, opb, l8, l8, l8, l8, pref, 1, &rb, &found) ==
                CUBLAS_STATUS_SUCCESS &&
            found == 1,
        "a heuristic for 8x8x8 with a bias");
  CHECK(cublasLtMatmul(lt, opb, &one, a, l8, a, l8, &zero, c, l8, c, l8, &rb.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "the bias epilogue without a bias pointer is refused");
  const float *bias = a + 76; /* 8 floats from a + 76: past the allocation (80 floats) */
  cublasLtMatmulDescSetAttribute(opb, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  CHECK(cublasLtMatmul(lt, opb, &one, a, l8, a, l8, &zero, c, l8, c, l8, &rb.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_INVALID_VALUE,
        "a bias running past its allocation is refused");
  bias = a + 8;
  cublasLtMatmulDescSetAttribute(opb, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  CHECK(cublasLtMatmul(lt, opb, &one, a, l8, a, l8, &zero, c, l8, c, l8, &rb.algo, NULL, 0, 0) ==
            CUBLAS_STATUS_SUCCESS,
        "cublasLtMatmul with a bias");
  cudaMemcpy(hc, c, sizeof hc, cudaMemcpyDeviceToHost);
  CHECK(hc[2 * 8 + 1] == want + ha[8 + 1], "C(1,2) + bias(1) = %g, want %g", hc[2 * 8 + 1], want + ha[8 + 1]);
  cudaDeviceSynchronize();
  cublasLtMatmulDescDestroy(opb);
  check_cublaslt_fp8(lt, pref);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(l8), cublasLtMatrixLayoutDestroy(l4);
  cublasLtMatmulDescDestroy(op);
  cublasLtDestroy(lt);
  cudaFree(a), cudaFree(c);
}

/* ---- NCCL's rules (one rank) ---- */
static void check_nccl(void) {
  ncclUniqueId id;
  ncclComm_t comm, comm2;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess, "init");
  float *d = dalloc(1024), h[8] = {0};
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  CHECK(ncclAllReduce(h, h, 8, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument, "host memory refused");
  CHECK(ncclAllGather(d + 1, d, 8, ncclFloat32, comm, s) == ncclInvalidArgument,
        "an in-place all-gather off rank * count is refused");
  CHECK(ncclAllGather(d, d, 8, ncclFloat32, comm, s) == ncclSuccess,
        "an in-place all-gather at rank * count");
  CHECK(ncclReduceScatter(d, d + 4, 8, ncclFloat32, ncclSum, comm, s) == ncclInvalidArgument,
        "a reduce-scatter's recvbuff inside sendbuff off rank * recvcount is refused");
  CHECK(ncclCommDestroy(comm) == ncclInvalidUsage, "destroy before finalize is refused");
  CHECK(ncclCommFinalize(comm) == ncclSuccess && ncclCommDestroy(comm) == ncclSuccess, "finalize, destroy");
  /* a broken link: the operation never finishes; the error shows; abort frees the stream */
  CHECK(ncclGetUniqueId(&id) == ncclSuccess && ncclCommInitRank(&comm2, 1, id, 0) == ncclSuccess, "init");
  setenv("RF_EMU_NCCL_FAIL", "2", 1); /* this process's 2nd NCCL operation (the refused ones not counted) */
  CHECK(ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm2, s) == ncclSuccess, "queued");
  ncclResult_t err = ncclSuccess;
  for (int i = 0; i < 2000 && err == ncclSuccess; i++) {
    ncclCommGetAsyncError(comm2, &err);
    usleep(1000);
  }
  CHECK(err == ncclSystemError && cudaStreamQuery(s) == cudaErrorNotReady,
        "a failed operation: async error %d, the stream still busy", (int)err);
  CHECK(ncclCommAbort(comm2) == ncclSuccess && cudaStreamSynchronize(s) == cudaSuccess,
        "abort frees the stream");
  unsetenv("RF_EMU_NCCL_FAIL");
  cudaStreamDestroy(s);
  cudaFree(d);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--die") == 0) {
    for (size_t i = 0; i < sizeof deaths / sizeof deaths[0]; i++)
      if (strcmp(argv[2], deaths[i].name) == 0) deaths[i].run();
    return 0; /* a bug the stand-in let through */
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  check_deaths(argv[0]);
  check_memory();
  check_streams();
  check_kernels();
  check_cublaslt();
  check_nccl();
  printf("emu_selftest: %d checks, %d failed\n", checks, failures);
  MPI_Finalize();
  return failures ? 1 : 0;
}
