/* 8-bit AdamW on CUDA: src/optim/adamw8bit.c's step (bitsandbytes' block-wise 8-bit
 * AdamW: m and v as codes of the dynamic maps, one f32 absmax per block) as one launch over
 * the plan adamw8bit.c makes at create (struct rf_optim_8bit_plan, optim.h): a thread block
 * per 8-bit block of this rank's shard (a 32 x 32 tile of a matrix or a run of 256 of a
 * vector, cut by the piece's ends where the layout cuts it), in scale order.
 *
 * Per element, the host's operations in its order with round-to-nearest intrinsics (nvcc
 * would contract a * b + c into an FMA; gcc -std=c11 does not), IEEE sqrt and division:
 * decode (map value x old absmax), the moments in f32 (RF_OPTIM_ADAMW_M, _V), the parameter
 * from the f32 moments (RF_OPTIM_ADAMW_P); the block's new absmax of each moment is the
 * largest non-NaN magnitude by its bits (exact in any order); the codes are quant.c's
 * bucket lookup of moment x (1 / absmax), a positive v never coded 0. So the host's bits:
 * parameters, codes and scales (tests/gpu/test_optim_cuda.c). Each thread keeps its
 * elements' moments in registers between the two passes the host makes (the host
 * recomputes them from the same codes: the same bits).
 *
 * The clip factor (h.gscale: the gradient norm's, on the device, rf_fsdp_grad_norm_on_device)
 * is read by every thread as it starts: each gradient multiplied by it (__fmul_rn: the bits of
 * the host's gradients scaled first); NaN (a non-finite norm): the kernel changes nothing, as
 * the host step and the dense AdamW kernels skip. No host read of the norm. */
#include <cuda_runtime.h>
#include <stdint.h>

/* The C headers' C11 keywords, as C++ spells them. */
#define _Noreturn [[noreturn]]
#define _Alignas(n) alignas(n)
extern "C" {
#include "optim/optim.h"
}

#define RF_8BIT_THREADS 256
#define RF_8BIT_PER_THREAD 4 /* a 32 x 32 tile: 1024 elements */

/* quant.c's rf_optim_quantize_fast: the bucket of the top 16 bits, the change point in the low 16. */
static __device__ __forceinline__ uint8_t rf_8bit_quantize(const uint32_t *ent, int32_t key_lo,
                                                           int32_t buckets, float x) {
  uint32_t b = __float_as_uint(x);
  int32_t k = (int32_t)((b & 0x7fffffffu) >> 16) - key_lo;
  k = k > 0 ? k : 0;
  k = k < buckets - 1 ? k : buckets - 1;
  uint32_t e = ent[(int32_t)(b >> 31) * buckets + k];
  uint32_t c = (b & 0xffffu) >= (e & 0xffffu) ? e >> 24 : (e >> 16) & 0xffu;
  return (uint8_t)(x == x ? c : 0u); /* NaN: 0 */
}

/* adamw8bit.c's rf_optim_absmax_bits: |x|'s bits, NaN ignored. */
static __device__ __forceinline__ uint32_t rf_8bit_absmax_bits(uint32_t acc, float x) {
  uint32_t b = __float_as_uint(x) & 0x7fffffffu;
  b = b <= 0x7f800000u ? b : 0u;
  return b > acc ? b : acc;
}

/* The plan's pointers (device memory) as the kernel's own arguments: the descriptors hold offsets. */
struct rf_8bit_args {
  int64_t n_blocks;
  int32_t key_lo, buckets;
};

/* gscale: h.gscale as an argument of its own (the stand-in translates a kernel's pointer arguments,
 * not pointers inside a struct; NULL: 1). */
__global__ void adamw8bit_kernel(struct rf_8bit_args P, struct rf_optim_hyper h, const float *gscale,
                                 float *p, const float *g, const struct rf_optim_8bit_cuda_view *views,
                                 const struct rf_optim_8bit_cuda_block *blocks, const float *map_s,
                                 const float *map_u, const uint32_t *ent_s, const uint32_t *ent_u,
                                 uint8_t *mq, uint8_t *vq, float *msc, float *vsc) {
  __shared__ uint32_t red_m[RF_8BIT_THREADS];
  __shared__ uint32_t red_v[RF_8BIT_THREADS];
  const int t = (int)threadIdx.x;
  const float gs = gscale ? *gscale : 1.0f;
  if (gs != gs) return; /* a non-finite norm: every block, every thread, before any barrier */
  for (int64_t k = blockIdx.x; k < P.n_blocks; k += gridDim.x) {
    const struct rf_optim_8bit_cuda_block blk = blocks[k];
    const struct rf_optim_8bit_cuda_view w = views[blk.view];
    const float dec = w.decay ? h.decay : 1.0f;
    const float ms = msc[k], vs = vsc[k];
    const int n = blk.rows * blk.cols;
    float mi[RF_8BIT_PER_THREAD], vi[RF_8BIT_PER_THREAD];
    int64_t at[RF_8BIT_PER_THREAD]; /* the element's offset in the piece, -1: none */
    uint32_t am = 0, av = 0;
    for (int u = 0; u < RF_8BIT_PER_THREAD; u++) {
      int idx = t + u * RF_8BIT_THREADS;
      at[u] = -1;
      mi[u] = vi[u] = 0.0f;
      if (idx >= n) continue;
      int64_t e = blk.first + (int64_t)(idx / blk.cols) * blk.row + idx % blk.cols;
      if (e < w.begin || e >= w.end) continue;
      int64_t l = e - w.begin, s = w.shard_offset + l;
      at[u] = l;
      float gi = gs == 1.0f ? g[s] : __fmul_rn(g[s], gs);
      float m0 = __fmul_rn(map_s[mq[s]], ms), v0 = __fmul_rn(map_u[vq[s]], vs);
      /* m + (1 - b1) (g - m); b2 v + (1 - b2) g^2 */
      float m1 = __fadd_rn(m0, __fmul_rn(h.one_m_b1, __fsub_rn(gi, m0)));
      float v1 = __fadd_rn(__fmul_rn(h.b2, v0), __fmul_rn(h.one_m_b2, __fmul_rn(gi, gi)));
      mi[u] = m1;
      vi[u] = v1;
      am = rf_8bit_absmax_bits(am, m1);
      av = rf_8bit_absmax_bits(av, v1);
      /* p dec - step_size (m / (sqrt(v) / sqrt(1 - b2^t) + eps)) */
      float den = __fadd_rn(__fdiv_rn(__fsqrt_rn(v1), h.bc2_sqrt), h.eps);
      p[s] = __fsub_rn(__fmul_rn(p[s], dec), __fmul_rn(h.step_size, __fdiv_rn(m1, den)));
    }
    red_m[t] = am;
    red_v[t] = av;
    __syncthreads();
    for (int half = RF_8BIT_THREADS / 2; half > 0; half /= 2) {
      if (t < half) {
        red_m[t] = red_m[t] > red_m[t + half] ? red_m[t] : red_m[t + half];
        red_v[t] = red_v[t] > red_v[t + half] ? red_v[t] : red_v[t + half];
      }
      __syncthreads();
    }
    const float amf = __uint_as_float(red_m[0]), avf = __uint_as_float(red_v[0]);
    const float im = amf > 0.0f ? __fdiv_rn(1.0f, amf) : 0.0f, iv = avf > 0.0f ? __fdiv_rn(1.0f, avf) : 0.0f;
    for (int u = 0; u < RF_8BIT_PER_THREAD; u++) {
      if (at[u] < 0) continue;
      int64_t s = w.shard_offset + at[u];
      mq[s] = rf_8bit_quantize(ent_s, P.key_lo, P.buckets, __fmul_rn(mi[u], im));
      uint8_t cv = rf_8bit_quantize(ent_u, P.key_lo, P.buckets, __fmul_rn(vi[u], iv));
      vq[s] = (uint8_t)(cv | ((cv == 0) & (vi[u] > 0.0f)));
    }
    if (t == 0) {
      msc[k] = amf;
      vsc[k] = avf;
    }
    __syncthreads(); /* red_* read by every thread before the next block's writes */
  }
}

extern "C" void rf_optim_adamw8bit_cuda_step(const struct rf_optim_8bit_plan *plan,
                                             const struct rf_optim_hyper *h,
                                             struct rf_device_stream *stream) {
  if (plan->n_blocks <= 0) return;
  if (!stream) RF_DIE("CUDA 8-bit AdamW: a launch without a stream (NULL): name the runtime's");
  int64_t blocks = plan->n_blocks < 8192 ? plan->n_blocks : 8192; /* grid-stride beyond */
  cudaStream_t st = (cudaStream_t)stream->handle;
  const struct rf_8bit_args a = {plan->n_blocks, plan->key_lo, plan->buckets};
  adamw8bit_kernel<<<(unsigned)blocks, RF_8BIT_THREADS, 0, st>>>(
      a, *h, h->gscale, plan->p, plan->g, plan->views, plan->blocks, plan->map_s, plan->map_u, plan->ent_s,
      plan->ent_u, plan->mq, plan->vq, plan->ms, plan->vs);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) RF_DIE("CUDA kernel of 8-bit AdamW: %s", cudaGetErrorString(e));
}
