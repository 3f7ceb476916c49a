/* AdamW fused over a piece of the shard on CUDA: src/optim/adamw.c's update
 * (torch.optim.AdamW's arithmetic, RF_OPTIM_ADAMW_M/V/P) in one kernel that
 * reads p, g, m, v once and writes p, m, v, with the hyperparameters of
 * rf_optim_hyper_init (bias corrections computed on the host in f64, as there).
 * Every operation is the macros' in their order with round-to-nearest
 * intrinsics (nvcc would contract a * b + c into an FMA; gcc -std=c11 does
 * not), and sqrt and division are IEEE, so a piece gets the host's bits
 * (tests/gpu/test_kernels_cuda.c checks it against rf_optim_adamw's host step).
 */
#include <cuda_runtime.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "optim/optim.h"
}
#include "optim/adamw_cuda.cuh"

/* gscale: h.gscale, a kernel argument of its own (a pointer inside the struct would reach the
 * kernel untranslated on the stand-in) */
__global__ void adamw_piece_kernel(struct rf_optim_hyper h, float dec, float *p, const float *g, float *m,
                                   float *v, int64_t len, const float *gscale) {
  const float gs = gscale ? *gscale : 1.0f; /* the clip factor (rf_fsdp_grad_norm_on_device) */
  if (gs != gs) return;                     /* NaN: a non-finite norm, the update skipped */
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < len;
       i += (int64_t)gridDim.x * blockDim.x) {
    rf_adamw_element(h, dec, gs == 1.0f ? g[i] : __fmul_rn(g[i], gs), p + i, m + i, v + i);
  }
}

extern "C" void rf_optim_adamw_cuda_piece(const struct rf_optim_hyper *h, int decay, float *p, const float *g,
                                          float *m, float *v, int64_t len, struct rf_device_stream *stream) {
  if (len <= 0) return;
  const int threads = 256;
  int64_t blocks = (len + threads - 1) / threads;
  if (blocks > 8192) blocks = 8192; /* grid-stride beyond: a few waves of every SM */
  if (!stream) RF_DIE("CUDA AdamW: a launch without a stream (NULL): name the runtime's");
  cudaStream_t st = (cudaStream_t)stream->handle;
  adamw_piece_kernel<<<(unsigned)blocks, threads, 0, st>>>(*h, decay ? h->decay : 1.0f, p, g, m, v, len,
                                                           h->gscale);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) RF_DIE("CUDA kernel of AdamW: %s", cudaGetErrorString(e));
}
