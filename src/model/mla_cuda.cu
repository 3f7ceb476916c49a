/* DeepSeek-V3's multi-head latent attention on CUDA (mla_cuda.h): the key and value expansion and
 * its backward, and the kernel table's mla_ entries over them, over attention_cuda.cu's f32
 * attention (q and k of head dim nope + rope, v of v_head_dim, the scale given) and kernels_cuda.cu's
 * rotary embedding (the rotary part of each head from an offset) (rf_model_kernels_cuda,
 * kernels_cuda.cu).
 *   - the expansion: a thread per element written, a copy: the same bits;
 *   - its backward: a thread per element of dkvb (a copy) and per element of dkpe, which adds
 *     the heads' rotary gradients from 0.0f in head order with __fadd_rn, as ops.c's loop: the
 *     same bits.
 * The table's entries take no struct holding a device pointer. */
#include "model/kernels_cuda.cuh"
#include "model/mla_cuda.h"

/* ---- the key and value expansion ---- */

/* rows = n * nh (row r, head h: rh = r nh + h); a row's k then its v: kw + dv elements. */
__global__ void mla_kv_expand_kernel(float *k, float *v, const float *kvb, const float *kpe, size_t rows,
                                     int nh, int nope, int rope, int dv) {
  const int kw = nope + rope, bw = nope + dv, w = kw + dv;
  const size_t total = rows * (size_t)w;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    size_t rh = e / (size_t)w, r = rh / (size_t)nh;
    int c = (int)(e - rh * (size_t)w);
    if (c < nope)
      k[rh * kw + c] = kvb[rh * bw + c];
    else if (c < kw)
      k[rh * kw + c] = kpe[r * rope + (c - nope)]; /* every head's key holds the row's rotary key */
    else
      v[rh * dv + (c - kw)] = kvb[rh * bw + nope + (c - kw)];
  }
}

/* dkvb's n nh (nope + vd) elements, then dkpe's n rope: each dkpe element the heads' sum. */
__global__ void mla_kv_expand_backward_kernel(float *dkvb, float *dkpe, const float *dk, const float *dv,
                                              int n, int nh, int nope, int rope, int vd) {
  const int kw = nope + rope, bw = nope + vd;
  const size_t copies = (size_t)n * nh * bw, total = copies + (size_t)n * rope;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (size_t)gridDim.x * blockDim.x) {
    if (e < copies) {
      size_t rh = e / (size_t)bw;
      int c = (int)(e - rh * (size_t)bw);
      dkvb[e] = c < nope ? dk[rh * kw + c] : dv[rh * vd + (c - nope)];
    } else {
      size_t f = e - copies, r = f / (size_t)rope;
      int i = (int)(f - r * (size_t)rope);
      const float *g = dk + r * (size_t)nh * kw + nope + i;
      float acc = 0.0f;
      for (int h = 0; h < nh; h++) acc = __fadd_rn(acc, g[(size_t)h * kw]);
      dkpe[f] = acc;
    }
  }
}

extern "C" void rf_mla_cuda_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh,
                                      int nope, int rope, int dv, cudaStream_t stream) {
  if (n <= 0 || nh <= 0) return;
  size_t rows = (size_t)n * nh;
  mla_kv_expand_kernel<<<kc_blocks(rows * (size_t)(nope + rope + dv)), RF_KC_THREADS, 0, stream>>>(
      k, v, kvb, kpe, rows, nh, nope, rope, dv);
  RF_CUDA_LAUNCHED("mla kv expand");
}

extern "C" void rf_mla_cuda_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv,
                                               int n, int nh, int nope, int rope, int vd,
                                               cudaStream_t stream) {
  if (n <= 0 || nh <= 0) return;
  size_t total = (size_t)n * nh * (size_t)(nope + vd) + (size_t)n * rope;
  mla_kv_expand_backward_kernel<<<kc_blocks(total), RF_KC_THREADS, 0, stream>>>(dkvb, dkpe, dk, dv, n, nh,
                                                                                nope, rope, vd);
  RF_CUDA_LAUNCHED("mla kv expand backward");
}

/* ---- the kernel table's entries ---- */

extern "C" void rf_mla_cuda_entry_attention_forward(float *y, float *lse, const float *q, const float *k,
                                                    const float *v, int batch, int seq, int nh, int nkv,
                                                    int hd, int dv, float scale, void *scratch,
                                                    size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  cudaStream_t st = kc_stream(stream);
  cuda_attention_sink_forward(y, lse, q, k, v, NULL, 0, batch, seq, nh, nkv, hd, dv, scale, st);
}

extern "C" void rf_mla_cuda_entry_attention_backward(float *dq, float *dk, float *dv, const float *dy,
                                                     const float *y, const float *lse, const float *q,
                                                     const float *k, const float *v, int batch, int seq,
                                                     int nh, int nkv, int hd, int vd, float scale,
                                                     void *scratch, size_t scratch_bytes,
                                                     struct rf_device_stream *stream) {
  cudaStream_t st = kc_stream(stream);
  if (batch <= 0 || seq <= 0 || nh <= 0) return;
  kc_need(sizeof(float) * (size_t)batch * nh * seq, scratch_bytes, "latent attention backward");
  cuda_attention_sink_backward(dq, dk, dv, NULL, dy, y, lse, q, k, v, NULL, 0, batch, seq, nh, nkv, hd, vd,
                               scale, (float *)scratch, st);
}

extern "C" void rf_mla_cuda_entry_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off,
                                             int rd, const float *cos_t, const float *sin_t, int interleave,
                                             int inverse, struct rf_device_stream *stream) {
  cuda_rope_launch(x, batch, seq, n_heads, stride, off, rd, cos_t, sin_t, interleave, inverse,
                   kc_stream(stream));
}

extern "C" void rf_mla_cuda_entry_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n,
                                            int nh, int nope, int rope, int dv,
                                            struct rf_device_stream *stream) {
  rf_mla_cuda_kv_expand(k, v, kvb, kpe, n, nh, nope, rope, dv, kc_stream(stream));
}

extern "C" void rf_mla_cuda_entry_kv_expand_backward(float *dkvb, float *dkpe, const float *dk,
                                                     const float *dv, int n, int nh, int nope, int rope,
                                                     int vd, struct rf_device_stream *stream) {
  rf_mla_cuda_kv_expand_backward(dkvb, dkpe, dk, dv, n, nh, nope, rope, vd, kc_stream(stream));
}
