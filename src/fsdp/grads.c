/* After the backward: scaling, the global norm (padding excluded) and clipping. */
#include <math.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "fsdp/fsdp.h"

/* Calls fn on this rank's gradient piece of every tensor: padding is never seen. */
static void rf_fsdp_for_pieces(struct rf_fsdp *f, void (*fn)(float *g, int64_t n, void *ctx), void *ctx) {
  for (int t = 0; t < f->n_tensors; t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    if (v.end > v.begin) fn(v.grad, v.end - v.begin, ctx);
  }
}

/* The pieces' work runs on the context's device (src/device: on the host, the
 * chunked, threaded scaling and the f64 simd sum of squares). */
struct rf_fsdp_piece_ctx {
  struct rf_device *dev;
  struct rf_device_stream *stream; /* compute */
  float scale;
  double *sq; /* device memory */
  int pieces;
};

static void rf_fsdp_scale_piece(float *g, int64_t n, void *ctx) {
  struct rf_fsdp_piece_ctx *c = ctx;
  rf_device_scale(c->dev, g, n, c->scale, c->stream);
}

static void rf_fsdp_square_piece(float *g, int64_t n, void *ctx) {
  struct rf_fsdp_piece_ctx *c = ctx;
  rf_device_sum_squares_add(c->dev, c->sq, g, n, c->stream);
  c->pieces++;
}

void rf_fsdp_scale_grads(struct rf_fsdp *f, float scale) {
  struct rf_fsdp_piece_ctx c = {
      .dev = f->device, .stream = f->stream[RF_FSDP_STREAM_COMPUTE], .scale = scale};
  rf_fsdp_for_pieces(f, rf_fsdp_scale_piece, &c);
}

/* The pieces' sums added in tensor order into one f64 on the device (0 + s0 + s1 ...: the bits of
 * the host's running sum), copied to the host once: one wait for the whole norm, none without a
 * piece. */
double rf_fsdp_grad_norm(struct rf_fsdp *f) {
  struct rf_fsdp_piece_ctx c = {
      .dev = f->device, .stream = f->stream[RF_FSDP_STREAM_COMPUTE], .sq = f->sumsq};
  rf_device_memset(f->device, f->sumsq, 0, sizeof(double), c.stream);
  rf_fsdp_for_pieces(f, rf_fsdp_square_piece, &c);
  double sq = 0.0;
  if (c.pieces) rf_device_copy(f->device, &sq, f->sumsq, sizeof sq, RF_DEVICE_COPY_DEVICE_TO_HOST, c.stream);
  /* a NaN or Inf on any rank makes the sum non-finite on every rank */
  rf_comm_allreduce(&f->mesh.shard, &sq, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  return sqrt(sq);
}

void rf_fsdp_norm_plans_make(struct rf_fsdp *f) {
  const struct rf_backend *b = f->device->backend;
  if (!b || !b->shard_sum_squares_add) return;
  f->norm_plans = rf_xcalloc((size_t)rf_max_i64(f->n_units, 1), sizeof *f->norm_plans);
  struct rf_shard_piece *pieces = rf_xcalloc((size_t)rf_max_i64(f->n_tensors, 1), sizeof *pieces);
  for (int u = 0; u < f->n_units; u++) {
    const struct rf_fsdp_unit *x = &f->units[u];
    for (int i = 0; i < x->n_tensors; i++) {
      const struct rf_tensor_view *v = &f->views[x->first_tensor + i];
      pieces[i] = (struct rf_shard_piece){.offset = v->shard_offset, .len = v->end - v->begin};
    }
    b->shard_plan(f->device, &f->norm_plans[u], pieces, x->n_tensors, f->stream[RF_FSDP_STREAM_COMPUTE]);
  }
  free(pieces);
}

void rf_fsdp_norm_plans_free(struct rf_fsdp *f) {
  if (!f->norm_plans) return;
  for (int u = 0; u < f->n_units; u++) f->device->backend->shard_plan_free(f->device, &f->norm_plans[u]);
  free(f->norm_plans);
  f->norm_plans = NULL;
}

void rf_fsdp_grad_norm_on_device(struct rf_fsdp *f, double max_norm) {
  struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
  struct rf_fsdp_piece_ctx c = {.dev = f->device, .stream = compute, .sq = f->sumsq};
  rf_device_memset(f->device, f->sumsq, 0, sizeof(double), compute);
  if (f->norm_plans) { /* a launch per unit (its pieces' sums in a fixed order, not the pieces') */
    for (int u = 0; u < f->n_units; u++)
      f->device->backend->shard_sum_squares_add(f->sumsq, f->grad, &f->norm_plans[u], compute);
  } else {
    rf_fsdp_for_pieces(f, rf_fsdp_square_piece, &c);
  }
  if (f->mesh.shard.world > 1) { /* a NaN or Inf on any rank makes the sum non-finite on every rank */
    rf_device_event_record(f->device, &f->norm_written, compute);
    rf_comm_stream_wait(&f->dmesh.shard, f->device, &f->norm_written);
    rf_comm_iallreduce(&f->dmesh.shard, f->sumsq, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM, f->norm_req);
    rf_comm_event_record(&f->dmesh.shard, f->norm_req, f->device, f->norm_done);
    rf_device_stream_wait(f->device, compute, f->norm_done);
    rf_comm_retire(f->norm_req); /* MPI: the stream's wait finished it; NCCL: the stream waits for it */
  }
  rf_device_clip_factor(f->device, f->gscale, f->sumsq, max_norm, compute);
}

void rf_fsdp_clip_grads(struct rf_fsdp *f, double norm, double max_norm) {
  if (!(max_norm > 0) || !isfinite(norm) || norm <= max_norm) return;
  rf_fsdp_scale_grads(f, (float)(max_norm / (norm + 1e-6)));
}
