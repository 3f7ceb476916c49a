/* cuda-emu's stand-in for <cuda_runtime.h>: the runtime API (cuda_runtime_api.h) and,
 * for C++, the device side of CUDA C++ that rfsdp's .cu files use, on the CPU.
 *
 * A .cu file is compiled as C++ after tests/gpu/emu/cu2cpp has rewritten the three
 * things C++ cannot parse: a launch k<<<grid, block, smem, stream>>>(args) becomes
 * rf_emu::launch(k, "k", grid, block, smem, stream)(args); `__shared__ T name[N];`
 * becomes RF_EMU_SHARED(T, name, [N]); `extern __shared__ T name[];` becomes the
 * block's dynamic shared memory. Everything else is this header.
 *
 * How a kernel runs (block.cpp): on its stream's worker thread, block after block in
 * a random (seeded) order; a block's threads are fibers (a hand-written x86-64 context
 * switch: no system call) run in a random order that changes at every barrier.
 * __syncthreads() waits for every thread of the block at the same barrier (a thread
 * that exited, or one at another __syncthreads, is an error: CUDA leaves it
 * undefined). A warp collective (shuffle, vote, __syncwarp) waits for the lanes its
 * mask names, which must all exist, all call the same collective with the same mask
 * and not exit first; a shuffle from a lane outside the mask is an error. Shared memory
 * (static and dynamic) is filled with NaN bytes (0xff) at the start of every block.
 * Kernel arguments are taken at the launch as the kernel's parameter types; a pointer
 * into device memory is translated to the stand-in's view of it (a device pointer
 * inside a struct argument is not, and faults when used); a pointer to pageable host
 * memory faults when the kernel uses it (pinned memory is reachable, as on the GPU).
 * Arithmetic is the host's IEEE f32/f64 with no contraction (-ffp-contract=off); fmaf
 * fuses as the GPU's; the _rn intrinsics are the plain operations; expf, logf and the
 * like are glibc's, not the GPU's (within the GPU's few ulps, not its bits).
 *
 * Adding to it: a warp-wide operation (wmma fragments, mma) is one more header over
 * rf_emu::warp_collective: every lane of the mask publishes a pointer to its data, and
 * the last lane to arrive runs `resolve` over all of them while the others wait (their
 * frames alive), e.g. a fragment store that writes each lane's elements. */
#ifndef RF_EMU_CUDA_RUNTIME_H
#define RF_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"

#ifdef __cplusplus
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  dim3(uint3 u) : x(u.x), y(u.y), z(u.z) {}
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};

namespace rf_emu {
/* the block being run on this thread (block.cpp). Local-exec: the stand-in is linked into
 * executables only, and GCC 12's initial-exec code for these in some kernels (a `lea` of the
 * GOT slot) is one that ld cannot relax ("TLS transition ... failed"). */
#define RF_EMU_TLS __thread __attribute__((tls_model("local-exec")))
extern RF_EMU_TLS uint3 tls_block_idx, tls_block_dim, tls_grid_dim;
extern RF_EMU_TLS const uint3 *tls_thread_idx; /* the fiber running now (~0u outside a kernel) */
extern RF_EMU_TLS unsigned tls_lane;
void syncthreads(const char *file, int line);
void *dynamic_smem(void);
void *static_smem(const void *key, size_t size, size_t align);
/* A warp-wide rendezvous (see the file's comment): every lane of `mask` calls it with
 * the same resolve; the last to arrive runs resolve(lanes, mask) with lanes[l] the
 * data of lane l (NULL outside the mask); then all return. */
typedef void (*warp_resolve_fn)(void *const *lanes, unsigned mask);
void warp_collective(unsigned mask, warp_resolve_fn resolve, void *data, const char *what);
inline unsigned lane_id(void) { return tls_lane; }
[[noreturn]] void kernel_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* the launch (runtime.cpp): checks the configuration, queues body on the stream; a
 * refused launch sets the thread's last error, as CUDA's */
void launch_kernel(const void *func, const char *name, dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, std::function<void()> body);
/* a pointer argument as the kernel sees it (device memory: the stand-in's view) */
void *kernel_pointer(const void *p);
cudaError_t func_set_attribute(const void *func, enum cudaFuncAttribute attr, int value);

template <typename T>
T kernel_argument(T v) {
  if constexpr (std::is_pointer<T>::value)
    return (T)kernel_pointer((const void *)v);
  else
    return v;
}

template <typename... P>
struct launcher {
  void (*kernel)(P...);
  const char *name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  template <typename... A>
  void operator()(A &&...a) const {
    static_assert(sizeof...(A) == sizeof...(P), "a kernel launched with the wrong number of arguments");
    std::tuple<P...> args(kernel_argument<P>(static_cast<P>(std::forward<A>(a)))...);
    void (*k)(P...) = kernel;
    launch_kernel((const void *)k, name, grid, block, smem, stream, [k, args]() { std::apply(k, args); });
  }
};

template <typename... P>
launcher<P...> launch(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, size_t smem = 0,
                      cudaStream_t stream = 0) {
  return launcher<P...>{kernel, name, grid, block, smem, stream};
}

/* ---- warp collectives ---- */
struct shfl_lane {
  uint64_t value;
  unsigned src; /* the lane read */
  uint64_t result;
};
void shfl_resolve(void *const *lanes, unsigned mask);
struct vote_lane {
  int pred;
  unsigned result;
};
void ballot_resolve(void *const *lanes, unsigned mask);
void syncwarp_resolve(void *const *lanes, unsigned mask);

template <typename T>
T shfl(unsigned mask, T v, unsigned src, const char *what) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a shuffle of more than 8 bytes");
  shfl_lane me = {0, src, 0};
  memcpy(&me.value, &v, sizeof v);
  warp_collective(mask, shfl_resolve, &me, what);
  T out;
  memcpy(&out, &me.result, sizeof out);
  return out;
}
inline unsigned segment_start(int width) { return lane_id() & ~(unsigned)(width - 1); }
}  // namespace rf_emu

#define __global__
#define __device__
#define __host__
#define __constant__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict
static constexpr int warpSize = 32;
#define threadIdx (*rf_emu::tls_thread_idx)
#define blockIdx (rf_emu::tls_block_idx)
#define blockDim (rf_emu::tls_block_dim)
#define gridDim (rf_emu::tls_grid_dim)
/* a static __shared__ declaration (cu2cpp writes these): one object per block, NaN bytes at
 * its start */
#define RF_EMU_SHARED(T, name, dims, align)                              \
  static const char rf_emu_key_##name = 0;                               \
  typedef T rf_emu_type_##name dims;                                     \
  rf_emu_type_##name &name = *(rf_emu_type_##name *)rf_emu::static_smem( \
      &rf_emu_key_##name, sizeof(rf_emu_type_##name),                    \
      alignof(rf_emu_type_##name) > (align) ? alignof(rf_emu_type_##name) : (align))

using std::max;
using std::min;

#define __syncthreads() rf_emu::syncthreads(__FILE__, __LINE__)
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return rf_emu::shfl(mask, v, rf_emu::segment_start(width) + ((unsigned)src & (unsigned)(width - 1)),
                      "__shfl_sync");
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  unsigned lane = rf_emu::lane_id(), src = lane ^ (unsigned)lane_mask;
  if (src >= rf_emu::segment_start(width) + (unsigned)width) src = lane; /* a later segment: its own */
  return rf_emu::shfl(mask, v, src, "__shfl_xor_sync");
}
template <typename T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  unsigned lane = rf_emu::lane_id(), in = lane & (unsigned)(width - 1);
  return rf_emu::shfl(mask, v, in + delta < (unsigned)width ? lane + delta : lane, "__shfl_down_sync");
}
template <typename T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  unsigned lane = rf_emu::lane_id(), in = lane & (unsigned)(width - 1);
  return rf_emu::shfl(mask, v, in >= delta ? lane - delta : lane, "__shfl_up_sync");
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  rf_emu::vote_lane me = {pred != 0, 0};
  rf_emu::warp_collective(mask, rf_emu::ballot_resolve, &me, "__ballot_sync");
  return me.result;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == mask; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  rf_emu::warp_collective(mask, rf_emu::syncwarp_resolve, NULL, "__syncwarp");
}

/* ---- arithmetic ---- */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }
/* __expf and __logf: glibc declares them (its expf and logf) */
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
static inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
static inline double rsqrt(double a) { return 1.0 / sqrt(a); }
static inline int __float2int_rn(float a) { return (int)nearbyintf(a); }
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
static inline int __float_as_int(float f) {
  int i;
  memcpy(&i, &f, 4);
  return i;
}
static inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}
static inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, 8);
  return d;
}
static inline long long __double_as_longlong(double d) {
  long long i;
  memcpy(&i, &d, 8);
  return i;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
template <typename T>
static inline T __ldg(const T *p) {
  return *p;
}

/* ---- atomics (real ones: kernels of two streams may run at once) ---- */
template <typename T>
static inline T rf_emu_atomic_update(T *p, T (*f)(T, T), T v) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics on 4 or 8 bytes");
  T old = __atomic_load_n(p, __ATOMIC_RELAXED), want;
  do want = f(old, v);
  while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
template <typename T>
static inline T atomicAdd(T *p, T v) {
  if constexpr (std::is_integral<T>::value)
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
  else
    return rf_emu_atomic_update<T>(
        p, [](T a, T b) { return a + b; }, v);
}
template <typename T>
static inline T atomicSub(T *p, T v) {
  return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
static inline T atomicMin(T *p, T v) {
  return rf_emu_atomic_update<T>(
      p, [](T a, T b) { return b < a ? b : a; }, v);
}
template <typename T>
static inline T atomicMax(T *p, T v) {
  return rf_emu_atomic_update<T>(
      p, [](T a, T b) { return b > a ? b : a; }, v);
}
template <typename T>
static inline T atomicExch(T *p, T v) {
  T old;
  __atomic_exchange(p, &v, &old, __ATOMIC_SEQ_CST);
  return old;
}
template <typename T>
static inline T atomicCAS(T *p, T compare, T v) {
  __atomic_compare_exchange(p, &compare, &v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return compare;
}
template <typename T>
static inline T atomicAnd(T *p, T v) {
  return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
static inline T atomicOr(T *p, T v) {
  return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}

template <typename F>
static inline cudaError_t cudaFuncSetAttribute(F *func, enum cudaFuncAttribute attr, int value) {
  return rf_emu::func_set_attribute((const void *)func, attr, value);
}
#endif /* __cplusplus */

#endif
