/* A CPU emulation of the CUDA subset of src/model/kernels_cuda.cu and
 * src/optim/adamw_cuda.cu, so that their kernels can be run and checked without a
 * GPU (scripts/cuda-emu). scripts/cuda-emu rewrites a .cu into C++ (the launch
 * chevrons k<<<grid, block, smem, stream>>>(args) into rf_emu::launch(k, grid, block,
 * smem, stream)(args), `extern __shared__ float sm[]` into the block's dynamic shared
 * memory) and includes this header instead of <cuda_runtime.h>.
 *
 * A block runs its threads as fibers (ucontext) on one OS thread, blocks one after
 * the other: __syncthreads() waits for every live thread of the block; a warp shuffle
 * waits for the 32 lanes of its warp, then every lane gets its source lane's value
 * (a lane that diverged from its warp's shuffle stops the emulation: the GPU would be
 * undefined there). `__shared__` variables are static (one OS thread, one block at a
 * time: the block's). Arithmetic is the host's IEEE f32/f64 without contraction
 * (compiled with -ffp-contract=off); fmaf is a fused multiply-add as on the GPU; the
 * _rn intrinsics are the plain operations. Only 1-D blocks. Slow (a context switch
 * per barrier and per shuffle): small shapes only. */
#ifndef RF_CUDA_EMU_H
#define RF_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <tuple>

#include "cuda_runtime_api.h"

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace rf_emu {
extern dim3 block_idx, block_dim, grid_dim;
unsigned thread_x(void);
void *dynamic_smem(void);
void syncthreads(void);
uint64_t shuffle(uint64_t bits, int lane_or_mask, int is_xor);
/* Runs body() for every thread of every block of grid x block (body reads the indices). */
void run_grid(dim3 grid, dim3 block, size_t smem, const std::function<void()> &body);

template <typename T>
T shfl(T v, int lane_or_mask, int is_xor) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof v);
  bits = shuffle(bits, lane_or_mask, is_xor);
  T out;
  memcpy(&out, &bits, sizeof out);
  return out;
}

template <typename... P>
struct launcher {
  void (*kernel)(P...);
  dim3 grid, block;
  size_t smem;
  template <typename... A>
  void operator()(A... a) const {
    std::tuple<P...> args(a...);
    void (*k)(P...) = kernel;
    run_grid(grid, block, smem, [&]() { std::apply(k, args); });
  }
};

template <typename... P>
launcher<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem = 0, cudaStream_t stream = 0) {
  (void)stream;
  return launcher<P...>{kernel, grid, block, smem};
}
}  // namespace rf_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define threadIdx (dim3(rf_emu::thread_x(), 0, 0))
#define blockIdx (rf_emu::block_idx)
#define blockDim (rf_emu::block_dim)
#define gridDim (rf_emu::grid_dim)

using std::max;
using std::min;

static inline void __syncthreads(void) { rf_emu::syncthreads(); }
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int lane) {
  (void)mask;
  return rf_emu::shfl(v, lane, 0);
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  (void)mask;
  return rf_emu::shfl(v, lane_mask, 1);
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
static inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F f, enum cudaFuncAttribute a, int v) {
  (void)f;
  (void)a;
  return v >= 0 && v <= 227 * 1024 ? cudaSuccess : cudaErrorInvalidValue; /* an H100's limit */
}

#endif
