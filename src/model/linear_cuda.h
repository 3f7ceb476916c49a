/* The model's linear layers on the GPU (BACKEND=cuda, cuda-emu): rf_model_linear_forward and
 * rf_model_linear_backward (model.h) with their semantics, on device memory, through
 * cuBLASLt (src/gemm/gemm_cuda.h) on the caller's stream.
 *
 *   f32 compute, f32 weight   one f32 product (cuBLASLt's f32 path: TF32 is not enabled)
 *   bf16 compute              x (and dy) rounded to bf16 into the stage (a cast kernel), the
 *                             weight bf16 as gathered or rounded into the stage, products
 *                             bf16 x bf16 with f32 accumulation into the f32 output
 *   f32 compute, bf16 weight  the weight widened into the stage's f32 rows
 *                             RF_MODEL_STAGE_ROWS at a time, as the host does
 *   FP8 weights               refused (dies naming the option): the block-scaled FP8 products
 *                             are not in the model's CUDA path yet
 *
 * One cuBLASLt context per GPU, created on the first product on that GPU (from the thread
 * that made the device current) and kept for the process: its workspace is allocated once,
 * so steps after the first allocate nothing. Results equal the host's to the products'
 * rounding (cuBLASLt sums in another order): not bit for bit. */
#ifndef RF_MODEL_LINEAR_CUDA_H
#define RF_MODEL_LINEAR_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

struct rf_model_weight;
struct rf_model_stage;
struct rf_device_stream;

void rf_model_cuda_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                                  int out, float beta, const struct rf_model_stage *st,
                                  struct rf_device_stream *stream);
void rf_model_cuda_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                                   const struct rf_model_weight *w, int n, int in, int out, float beta,
                                   const struct rf_model_stage *st, struct rf_device_stream *stream);

#ifdef __cplusplus
}
#endif

#endif
