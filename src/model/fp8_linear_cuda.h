/* The operands of `--fp8 block`'s linear layers on CUDA (fp8_linear_cuda.cu; BACKEND=cuda and
 * cuda-emu builds only), for rf_gemm_cuda_run_fp8 (src/gemm/gemm_cuda.h): e4m3 codes with k
 * contiguous and k padded with zero codes to a multiple of 128, rows padded with zero codes to
 * a multiple of 16, and their scales in cuBLASLt's layouts (rf_gemm_cuda_fp8_scale_at). The
 * codes and scales of every tile are src/core/fp8.c's bit for bit (core/fp8_cuda.cuh: the amax,
 * rf_fp8_scale, the rounding of x / s); a tile holding NaN or an infinity gets a NaN scale
 * and sets *bad (device int), which rf_fp8_linear_cuda_finish reads on the device: the host
 * never waits. Activations are f32 (the model's). Each launcher queues its kernels on `stream`
 * and returns cudaGetLastError(). */
#ifndef RF_MODEL_FP8_LINEAR_CUDA_H
#define RF_MODEL_FP8_LINEAR_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *bad = 0: before a linear op's quantizations. */
cudaError_t rf_fp8_linear_cuda_reset(int *bad, cudaStream_t stream);

/* x [rows, k] (row-major) in 1 x 128 tiles along k (a partial last tile as fp8.c's): codes
 * [rows_pad, kpad], scales outer-dimension-major (tile (r, kb) at kb * rows_pad + r; the
 * padding rows' scales 1). */
cudaError_t rf_fp8_linear_cuda_rows(const float *x, int rows, int k, int rows_pad, int kpad, int pow2,
                                    uint8_t *codes, float *scales, int *bad, cudaStream_t stream);

/* The weight gradient's operands: x [n, cols] (row-major, n tokens) transposed, in 128 x 1
 * tiles along the tokens that restart at each sequence of `run` tokens (n a multiple of run;
 * fp8.c's 128 x 1 tiles of each sequence, a partial one at its end), each sequence padded
 * with zero codes to a multiple of 128: codes [cols_pad, (n / run) * round_up(run, 128)],
 * scales outer-dimension-major (tile (c, kb) at kb * cols_pad + c). */
cudaError_t rf_fp8_linear_cuda_tokens(const float *x, int n, int cols, int cols_pad, int run, int pow2,
                                      uint8_t *codes, float *scales, int *bad, cudaStream_t stream);

/* A gathered weight w [out, in] (codes; scales [ceil(out/128), ceil(in/128)] row-major over
 * its 128 x 128 tiles, as the DBuffer holds them) as the w operand: trans 0, w itself
 * ([out, in], k = in); trans 1, w^T ([in, out], k = out); codes [rows_pad, kpad], scales in
 * cuBLASLt's 128 x 128 layout (tile (rb, kb) at rb * L4 + kb, L4 = kpad / 128 rounded up to a
 * multiple of 4; the padding NaN: a product that read it would show it). */
cudaError_t rf_fp8_linear_cuda_weight(const uint8_t *w, const float *w_scales, int out, int in, int trans,
                                      int rows_pad, int kpad, uint8_t *codes, float *scales,
                                      cudaStream_t stream);

/* After the product: y [m, n] (leading dimension ldy) = staged [m, n_pad] (or y += staged when
 * accumulate; staged NULL: the product went into y), then every element NaN when *bad (an
 * operand could not be quantized: the host's product gives NaN everywhere). */
cudaError_t rf_fp8_linear_cuda_finish(float *y, int ldy, const float *staged, int m, int n, int n_pad,
                                      int accumulate, const int *bad, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
