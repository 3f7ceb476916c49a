/* The linear layers on cuBLASLt (linear_cuda.h). */
#include "model/linear_cuda.h"

#include <pthread.h>

#include "device/device_cuda.h"
#include "gemm/gemm_cuda.h"
#include "model/fp8_linear_cuda.h"
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

/* x in bf16: the norm's bf16 output where the workspace staged it (rf_model_stage.x16), else x cast
 * into buf. */
static const uint16_t *staged_x(struct rf_device_stream *stream, const struct rf_model_stage *st,
                                uint16_t *buf, const float *x, size_t n) {
  if (st->x16 && x == st->x16_of) return st->x16;
  to_bf16(stream, buf, x, n);
  return buf;
}

static const uint16_t *weight_bf16(struct rf_device_stream *stream, const struct rf_model_weight *w, size_t n,
                                   const struct rf_model_stage *st) {
  if (w->bf16) return w->bf16;
  to_bf16(stream, st->wbf16, w->f32, n);
  return st->wbf16;
}

/* ---- FP8 block mode (--fp8 block): the host's products (ops.c's linear_*_fp8) on e4m3 codes with
 * cuBLASLt's block scaling (rf_gemm_cuda_run_fp8), the operands quantized on the device in the
 * host's tiles (fp8_linear_cuda.cu), k padded to 128 and rows to 16 with zero codes ---- */

#define RF_LINEAR_FP8_CHECK(call)                                                  \
  do {                                                                             \
    cudaError_t rf_lin_rc_ = (call);                                               \
    if (rf_lin_rc_ != cudaSuccess)                                                 \
      RF_DIE("--fp8 block: %s failed: %s", #call, cudaGetErrorString(rf_lin_rc_)); \
  } while (0)

static int round_to(int x, int m) { return (x + m - 1) / m * m; }

static void fp8_fits(const struct rf_model_fp8_stage *q, int64_t a, int64_t b, int64_t scales, int64_t y,
                     const char *what) {
  if (a > q->cap_a || b > q->cap_b || scales > q->cap_scales || y > q->cap_y)
    RF_DIE(
        "--fp8 block: the %s's operands (%lld and %lld codes, %lld scales, %lld staged) exceed the "
        "workspace's FP8 stage (%lld, %lld, %lld, %lld): shorter sequences than it was sized for?",
        what, (long long)a, (long long)b, (long long)scales, (long long)y, (long long)q->cap_a,
        (long long)q->cap_b, (long long)q->cap_scales, (long long)q->cap_y);
}

/* c [m, n] (leading dimension ldc) (+)= the product of the stage's operands (x: ca, sa in x_tile x
 * 128 tiles; w: cb, sb) over kpad, or NaN everywhere when an operand could not be quantized (the
 * host's fp8_product); into the stage's y first when m or n is not a multiple of 16. */
static void fp8_product(struct rf_device_stream *stream, const struct rf_model_fp8_stage *q, int m, int n,
                        int kpad, int x_tile, int w_tile, int accumulate, float *c, int ldc) {
  cudaStream_t s = rf_device_cuda_stream(stream->dev, stream);
  int mp = round_to(m, 16), np = round_to(n, 16), direct = mp == m && np == n && ldc == n;
  struct rf_gemm_cuda_fp8_operand x = {q->ca, q->sa, x_tile}, w = {q->cb, q->sb, w_tile};
  if (rf_gemm_cuda_run_fp8(linear_ctx(stream), mp, np, kpad, x, w, direct && accumulate ? 1.0f : 0.0f,
                           direct ? c : q->y, RF_DTYPE_F32, s) != 0)
    RF_DIE(
        "--fp8 block: this GPU's cuBLASLt has no block-scaled FP8 product for %d x %d x %d (Hopper and "
        "cuBLAS 12.9 or later)",
        mp, np, kpad);
  RF_LINEAR_FP8_CHECK(
      rf_fp8_linear_cuda_finish(c, ldc, direct ? NULL : q->y, m, n, np, accumulate, q->bad, s));
}

/* y [n, out] (+)= x w^T: x in 1 x 128 tiles, w in its gathered 128 x 128 tiles. */
static void linear_forward_fp8(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                               int out, float beta, const struct rf_model_fp8_stage *q,
                               struct rf_device_stream *stream) {
  cudaStream_t s = rf_device_cuda_stream(stream->dev, stream);
  int kp = round_to(in, RF_FP8_TILE), mp = round_to(n, 16), np = round_to(out, 16);
  fp8_fits(q, (int64_t)mp * kp, (int64_t)np * kp,
           rf_max_i64(rf_gemm_cuda_fp8_scales(mp, kp, 1), rf_gemm_cuda_fp8_scales(np, kp, RF_FP8_TILE)),
           (int64_t)mp * np, "forward");
  RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_reset(q->bad, s));
  RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_rows(x, n, in, mp, kp, q->pow2, q->ca, q->sa, q->bad, s));
  RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_weight(w->fp8, w->fp8_scales, out, in, 0, np, kp, q->cb, q->sb, s));
  fp8_product(stream, q, n, out, kp, 1, RF_FP8_TILE, beta != 0.0f, y, out);
}

/* dW [out, in] += dY^T X over the tokens in 128 x 1 tiles restarting at each sequence (ops.c's
 * rule), each sequence padded to 128 tokens; dX [n, in] (+)= dY W, dY in 1 x 128 tiles, W^T. */
static void linear_backward_fp8(float *dx, float *dw, const float *dy, const float *x,
                                const struct rf_model_weight *w, int n, int in, int out, float beta,
                                const struct rf_model_fp8_stage *q, struct rf_device_stream *stream) {
  cudaStream_t s = rf_device_cuda_stream(stream->dev, stream);
  if (dw) {
    int run = q->seq > 0 && n % q->seq == 0 && q->seq % RF_FP8_TILE != 0 ? q->seq : n; /* ops.c's rule */
    int kp = n / run * round_to(run, RF_FP8_TILE), op = round_to(out, 16), ip = round_to(in, 16);
    fp8_fits(q, (int64_t)op * kp, (int64_t)ip * kp, rf_gemm_cuda_fp8_scales(rf_max_i64(op, ip), kp, 1),
             (int64_t)op * ip, "weight gradient");
    RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_reset(q->bad, s));
    RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_tokens(dy, n, out, op, run, q->pow2, q->ca, q->sa, q->bad, s));
    RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_tokens(x, n, in, ip, run, q->pow2, q->cb, q->sb, q->bad, s));
    fp8_product(stream, q, out, in, kp, 1, 1, 1, dw, in);
  }
  if (dx) {
    int kp = round_to(out, RF_FP8_TILE), mp = round_to(n, 16), np = round_to(in, 16);
    fp8_fits(q, (int64_t)mp * kp, (int64_t)np * kp,
             rf_max_i64(rf_gemm_cuda_fp8_scales(mp, kp, 1), rf_gemm_cuda_fp8_scales(np, kp, RF_FP8_TILE)),
             (int64_t)mp * np, "input gradient");
    RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_reset(q->bad, s));
    RF_LINEAR_FP8_CHECK(rf_fp8_linear_cuda_rows(dy, n, out, mp, kp, q->pow2, q->ca, q->sa, q->bad, s));
    RF_LINEAR_FP8_CHECK(
        rf_fp8_linear_cuda_weight(w->fp8, w->fp8_scales, out, in, 1, np, kp, q->cb, q->sb, s));
    fp8_product(stream, q, n, in, kp, 1, RF_FP8_TILE, beta != 0.0f, dx, in);
  }
}

void rf_model_cuda_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                                  int out, float beta, const struct rf_model_stage *st,
                                  struct rf_device_stream *stream) {
  if (w->fp8) {
    RF_ASSERT(st && st->fp8.ca);
    linear_forward_fp8(y, x, w, n, in, out, beta, &st->fp8, stream);
    return;
  }
  if (stage_bf16(st)) {
    const uint16_t *xb = staged_x(stream, st, st->act, x, (size_t)n * in);
    lin_gemm(stream, RF_DTYPE_BF16, 0, 1, n, out, in, xb, weight_bf16(stream, w, (size_t)out * in, st), beta,
             y, out);
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
  if (w->fp8) {
    RF_ASSERT(st && st->fp8.ca);
    linear_backward_fp8(dx, dw, dy, x, w, n, in, out, beta, &st->fp8, stream);
    return;
  }
  if (stage_bf16(st)) {
    to_bf16(stream, st->act, dy, (size_t)n * out);
    if (dw)
      lin_gemm(stream, RF_DTYPE_BF16, 1, 0, out, in, n, st->act,
               staged_x(stream, st, st->act2, x, (size_t)n * in), 1.0f, dw, in);
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
