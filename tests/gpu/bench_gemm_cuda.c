/* GPU bench (run by scripts/gpu-check; prints, asserts nothing): rf_gemm_cuda_run's
 * TFLOP/s, each the median of 20 timed products after 3 untimed, timed by CUDA events
 * on the stream. Shapes: 8192^3 (bf16 -> bf16, the probe's cublasGemmEx shape, and
 * bf16 -> f32), and every linear product of one training step of
 * configs/llama-100m.json at 32 x 1024 tokens and of the 1.1B LLaMA of
 * configs/llama-1b.json at 8 x 2048 (forward Y = X W^T, backward dX = dY W and
 * dW = dY^T X; bf16 operands, f32 output, as the model's products), with the
 * FLOP-weighted rate of each model's step. One JSON object per line, each naming the
 * GPU. Usage: bench_gemm_cuda [reps] */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm_cuda.h"

#define CK(call)                                                                     \
  do {                                                                               \
    cudaError_t rc_ = (call);                                                        \
    if (rc_ != cudaSuccess) RF_DIE("%s failed: %s", #call, cudaGetErrorString(rc_)); \
  } while (0)

static char gpu_name[256];
static void *buf_a, *buf_b, *buf_c;
static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* The median milliseconds of one product. */
static double time_product(struct rf_gemm_cuda *g, const struct rf_gemm_desc *d, enum rf_dtype c_dtype,
                           int reps) {
  float ms[64] = {0};
  for (int i = 0; i < 3; i++) rf_gemm_cuda_run(g, d, buf_a, buf_b, buf_c, c_dtype, stream);
  for (int i = 0; i < reps; i++) {
    CK(cudaEventRecord(ev0, stream));
    rf_gemm_cuda_run(g, d, buf_a, buf_b, buf_c, c_dtype, stream);
    CK(cudaEventRecord(ev1, stream));
    CK(cudaEventSynchronize(ev1));
    CK(cudaEventElapsedTime(&ms[i], ev0, ev1));
  }
  qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
  return ms[reps / 2];
}

static double report(struct rf_gemm_cuda *g, const char *what, int m, int n, int k, int ta, int tb,
                     enum rf_dtype c_dtype, int reps, double *flops_sum) {
  struct rf_gemm_desc d = {m, n, k, ta, tb, ta ? m : k, tb ? k : n, n, RF_DTYPE_BF16, 1.0f, 0.0f};
  double ms = time_product(g, &d, c_dtype, reps), flops = 2.0 * m * n * (double)k;
  printf(
      "{\"gpu\": \"%s\", \"bench\": \"gemm\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, \"trans\": "
      "\"%d%d\", "
      "\"out\": \"%s\", \"ms\": %.4f, \"tflops\": %.1f, \"algo\": \"%s\"}\n",
      gpu_name, what, m, n, k, ta, tb, rf_dtype_name(c_dtype), ms, flops / (ms * 1e-3) / 1e12,
      rf_gemm_cuda_algo_name(g, &d, c_dtype));
  fflush(stdout);
  if (flops_sum) *flops_sum += flops;
  return ms;
}

/* One layer's linears (x layers) and the head, forward and both backward products. */
static void model(struct rf_gemm_cuda *g, const char *name, int tokens, int hidden, int kv, int ff,
                  int layers, int vocab, int reps) {
  struct {
    const char *what;
    int in, out, count;
  } lin[] = {{"q", hidden, hidden, layers}, {"k", hidden, kv, layers},    {"v", hidden, kv, layers},
             {"o", hidden, hidden, layers}, {"gate", hidden, ff, layers}, {"up", hidden, ff, layers},
             {"down", ff, hidden, layers},  {"head", hidden, vocab, 1}};
  double flops = 0, ms = 0;
  for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++) {
    char what[96];
    double f = 0, t = 0;
    snprintf(what, sizeof what, "%s %s fwd Y=XW^T", name, lin[i].what);
    t += report(g, what, tokens, lin[i].out, lin[i].in, 0, 1, RF_DTYPE_F32, reps, &f);
    snprintf(what, sizeof what, "%s %s bwd dX=dYW", name, lin[i].what);
    t += report(g, what, tokens, lin[i].in, lin[i].out, 0, 0, RF_DTYPE_F32, reps, &f);
    snprintf(what, sizeof what, "%s %s bwd dW=dY^TX", name, lin[i].what);
    t += report(g, what, lin[i].out, lin[i].in, tokens, 1, 0, RF_DTYPE_F32, reps, &f);
    flops += f * lin[i].count;
    ms += t * lin[i].count;
  }
  printf(
      "{\"gpu\": \"%s\", \"bench\": \"gemm-step\", \"model\": \"%s\", \"tokens\": %d, \"linear_ms\": %.2f, "
      "\"tflops\": %.1f}\n",
      gpu_name, name, tokens, ms, flops / (ms * 1e-3) / 1e12);
}

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 20;
  if (reps < 1 || reps > 64) RF_DIE("bench_gemm_cuda: reps %d (1..64)", reps);
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0)
    RF_DIE("no CUDA device: %s", rc != cudaSuccess ? cudaGetErrorString(rc) : "none");
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  snprintf(gpu_name, sizeof gpu_name, "%s", prop.name);
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CK(cudaEventCreate(&ev0));
  CK(cudaEventCreate(&ev1));
  /* the largest operands: the 1.1B head's dY [16384, 32000] in bf16 (1 GiB), its output in f32 (2 GiB) */
  size_t bytes = (size_t)1 << 31;
  CK(cudaMalloc(&buf_a, bytes));
  CK(cudaMalloc(&buf_b, bytes));
  CK(cudaMalloc(&buf_c, bytes * 2));
  CK(cudaMemset(buf_a, 0x3c, bytes)); /* bf16 1.0-ish: finite products */
  CK(cudaMemset(buf_b, 0x3c, bytes));
  struct rf_gemm_cuda *g = rf_gemm_cuda_create(0);
  report(g, "8192^3", 8192, 8192, 8192, 0, 0, RF_DTYPE_BF16, reps, NULL);
  report(g, "8192^3", 8192, 8192, 8192, 0, 0, RF_DTYPE_F32, reps, NULL);
  model(g, "llama-100m", 32 * 1024, 768, 256, 2048, 16, 256, reps);
  model(g, "llama-1b", 8 * 2048, 2048, 512, 8192, 16, 32000, reps);
  rf_gemm_cuda_free(g);
  CK(cudaFree(buf_a));
  CK(cudaFree(buf_b));
  CK(cudaFree(buf_c));
  return 0;
}
