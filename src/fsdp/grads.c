/* After the backward: scaling, the global norm (padding excluded) and clipping. */
#include <math.h>

#include "fsdp/fsdp.h"

/* Calls fn on this rank's gradient piece of every tensor: padding is never seen. */
static void rf_fsdp_for_pieces(struct rf_fsdp *f, void (*fn)(float *g, int64_t n, void *ctx), void *ctx) {
  for (int t = 0; t < f->n_tensors; t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    if (v.end > v.begin) fn(v.grad, v.end - v.begin, ctx);
  }
}

static void rf_fsdp_scale_chunk(float *restrict g, int64_t n, float s) {
#pragma omp simd
  for (int64_t i = 0; i < n; i++) g[i] *= s;
}

/* Chunks on the threads, each a simd loop (a combined "parallel for simd" over
 * captured pointers does not vectorize under clang with -fno-strict-aliasing). */
static void rf_fsdp_scale_piece(float *g, int64_t n, void *ctx) {
  const float s = *(const float *)ctx;
  const int64_t chunk = 65536, chunks = rf_ceil_div(n, chunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; c++)
    rf_fsdp_scale_chunk(g + c * chunk, rf_min_i64(chunk, n - c * chunk), s);
}

static void rf_fsdp_square_piece(float *g, int64_t n, void *ctx) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; i++) acc += (double)g[i] * (double)g[i];
  *(double *)ctx += acc;
}

void rf_fsdp_scale_grads(struct rf_fsdp *f, float scale) {
  rf_fsdp_for_pieces(f, rf_fsdp_scale_piece, &scale);
}

double rf_fsdp_grad_norm(struct rf_fsdp *f) {
  double sq = 0;
  rf_fsdp_for_pieces(f, rf_fsdp_square_piece, &sq);
  /* a NaN or Inf on any rank makes the sum non-finite on every rank */
  rf_comm_allreduce(&f->mesh.shard, &sq, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  return sqrt(sq);
}

void rf_fsdp_clip_grads(struct rf_fsdp *f, double norm, double max_norm) {
  if (!(max_norm > 0) || !isfinite(norm) || norm <= max_norm) return;
  rf_fsdp_scale_grads(f, (float)(max_norm / (norm + 1e-6)));
}
