/* The linear layers on cuBLASLt (linear_cuda.h). */
#include "model/linear_cuda.h"

#include <pthread.h>

#include "device/device_cuda.h"
#include "gemm/gemm_cuda.h"
#include "model/ops.h"

#define RF_LINEAR_CUDA_GPUS 64

static pthread_mutex_t rf_linear_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rf_gemm_cuda *rf_linear_cuda_ctx[RF_LINEAR_CUDA_GPUS];

/* The context of the stream's GPU (made on first use, kept for the process). */
static struct rf_gemm_cuda *linear_ctx(const struct rf_device_stream *stream) {
  int gpu = stream->dev->ordinal;
  RF_ASSERT(gpu >= 0 && gpu < RF_LINEAR_CUDA_GPUS);
  pthread_mutex_lock(&rf_linear_cuda_lock);
  if (!rf_linear_cuda_ctx[gpu]) rf_linear_cuda_ctx[gpu] = rf_gemm_cuda_create(0);
  struct rf_gemm_cuda *g = rf_linear_cuda_ctx[gpu];
  pthread_mutex_unlock(&rf_linear_cuda_lock);
  return g;
}

/* c [m, n] = op(a) op(b) + beta c, row-major, as ops.c's lin_gemm. */
static void lin_gemm(struct rf_device_stream *stream, enum rf_dtype dt, int ta, int tb, int m, int n, int k,
                     const void *a, const void *b, float beta, float *c, int ldc) {
  struct rf_gemm_desc d = rf_gemm_desc_whole(dt, ta, tb, m, n, k, beta, ldc);
  rf_gemm_cuda_run(linear_ctx(stream), &d, a, b, c, RF_DTYPE_F32, rf_device_cuda_stream(stream->dev, stream));
}

static int stage_bf16(const struct rf_model_stage *st) { return st && st->compute == RF_DTYPE_BF16; }

static void to_bf16(struct rf_device_stream *stream, uint16_t *dst, const float *src, size_t n) {
  rf_device_cast(stream->dev, dst, RF_DTYPE_BF16, src, RF_DTYPE_F32, n, 0, stream);
}

static const uint16_t *weight_bf16(struct rf_device_stream *stream, const struct rf_model_weight *w, size_t n,
                                   const struct rf_model_stage *st) {
  if (w->bf16) return w->bf16;
  to_bf16(stream, st->wbf16, w->f32, n);
  return st->wbf16;
}

static void refuse_fp8(const struct rf_model_weight *w) {
  if (w->fp8)
    RF_DIE("--fp8 block: the FP8 linear layers are not on device cuda yet (train with --device cpu)");
}

void rf_model_cuda_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                                  int out, float beta, const struct rf_model_stage *st,
                                  struct rf_device_stream *stream) {
  refuse_fp8(w);
  if (stage_bf16(st)) {
    to_bf16(stream, st->act, x, (size_t)n * in);
    lin_gemm(stream, RF_DTYPE_BF16, 0, 1, n, out, in, st->act, weight_bf16(stream, w, (size_t)out * in, st),
             beta, y, out);
    return;
  }
  if (w->f32) {
    lin_gemm(stream, RF_DTYPE_F32, 0, 1, n, out, in, x, w->f32, beta, y, out);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  for (int r0 = 0; r0 < out; r0 += RF_MODEL_STAGE_ROWS) {
    int rows = out - r0 < RF_MODEL_STAGE_ROWS ? out - r0 : RF_MODEL_STAGE_ROWS;
    rf_device_cast(stream->dev, st->wf32, RF_DTYPE_F32, w->bf16 + (size_t)r0 * in, RF_DTYPE_BF16,
                   (size_t)rows * in, 0, stream);
    lin_gemm(stream, RF_DTYPE_F32, 0, 1, n, rows, in, x, st->wf32, beta, y + r0, out);
  }
}

void rf_model_cuda_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                                   const struct rf_model_weight *w, int n, int in, int out, float beta,
                                   const struct rf_model_stage *st, struct rf_device_stream *stream) {
  refuse_fp8(w);
  if (stage_bf16(st)) {
    to_bf16(stream, st->act, dy, (size_t)n * out);
    if (dw) {
      to_bf16(stream, st->act2, x, (size_t)n * in);
      lin_gemm(stream, RF_DTYPE_BF16, 1, 0, out, in, n, st->act, st->act2, 1.0f, dw, in);
    }
    if (dx)
      lin_gemm(stream, RF_DTYPE_BF16, 0, 0, n, in, out, st->act, weight_bf16(stream, w, (size_t)out * in, st),
               beta, dx, in);
    return;
  }
  if (dw) lin_gemm(stream, RF_DTYPE_F32, 1, 0, out, in, n, dy, x, 1.0f, dw, in);
  if (!dx) return;
  if (w->f32) {
    lin_gemm(stream, RF_DTYPE_F32, 0, 0, n, in, out, dy, w->f32, beta, dx, in);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  /* dx = sum over row blocks of W: dy[:, block] W[block, :] */
  for (int r0 = 0; r0 < out; r0 += RF_MODEL_STAGE_ROWS) {
    int rows = out - r0 < RF_MODEL_STAGE_ROWS ? out - r0 : RF_MODEL_STAGE_ROWS;
    rf_device_cast(stream->dev, st->wf32, RF_DTYPE_F32, w->bf16 + (size_t)r0 * in, RF_DTYPE_BF16,
                   (size_t)rows * in, 0, stream);
    struct rf_gemm_desc d = {.m = n,
                             .n = in,
                             .k = rows,
                             .lda = out,
                             .ldb = in,
                             .ldc = in,
                             .dtype = RF_DTYPE_F32,
                             .alpha = 1.0f,
                             .beta = r0 > 0 ? 1.0f : beta};
    rf_gemm_cuda_run(linear_ctx(stream), &d, dy + r0, st->wf32, dx, RF_DTYPE_F32,
                     rf_device_cuda_stream(stream->dev, stream));
  }
}
