/* A unit's shard in one launch on CUDA (BACKEND=cuda only; the backend's shard_* entries,
 * backend.h): the plan of its pieces uploaded once at set-up, then the gradient norm's sum of
 * squares and AdamW over every piece as the fused kernels of src/model/fused_cuda.cu, one launch
 * each (the sum of squares and its finish: two) instead of one per piece. */
#include <stdlib.h>

#include "backend/backend.h"
#include "model/fused_cuda.h"
#include "optim/optim.h"

static cudaStream_t rf_shard_cuda_stream(struct rf_device_stream *stream) {
  if (!stream) RF_DIE("CUDA shard kernels: a launch without a stream (NULL): name the runtime's");
  return (cudaStream_t)stream->handle;
}

void rf_shard_cuda_plan(struct rf_device *dev, struct rf_shard_plan *out, const struct rf_shard_piece *pieces,
                        int n, struct rf_device_stream *stream) {
  RF_ASSERT(out && n >= 0 && (n == 0 || pieces));
  memset(out, 0, sizeof *out);
  struct rf_fused_piece *fp = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof *fp);
  for (int i = 0; i < n; i++) {
    RF_ASSERT(pieces[i].offset >= 0 && pieces[i].len >= 0);
    fp[i] =
        (struct rf_fused_piece){.offset = pieces[i].offset, .len = pieces[i].len, .decay = !!pieces[i].decay};
  }
  out->n_pieces = n;
  out->n_chunks = rf_fused_pieces_plan(fp, n);
  if (out->n_chunks > 0) {
    out->pieces = rf_device_alloc(dev, (size_t)n * sizeof *fp, 64);
    /* pageable: staged at the call, so fp may go at once */
    rf_device_copy(dev, out->pieces, fp, (size_t)n * sizeof *fp, RF_DEVICE_COPY_HOST_TO_DEVICE, stream);
    out->scratch_bytes = (size_t)out->n_chunks * sizeof(double);
    out->scratch = rf_device_alloc(dev, out->scratch_bytes, 64);
  }
  free(fp);
}

void rf_shard_cuda_plan_free(struct rf_device *dev, struct rf_shard_plan *plan) {
  if (!plan) return;
  rf_device_release(dev, plan->pieces);
  rf_device_release(dev, plan->scratch);
  memset(plan, 0, sizeof *plan);
}

void rf_shard_cuda_sum_squares_add(double *acc, const float *g, const struct rf_shard_plan *plan,
                                   struct rf_device_stream *stream) {
  if (plan->n_chunks <= 0) return; /* adding 0 to the sum changes no bit */
  rf_fused_sum_squares(acc, 1, g, plan->pieces, plan->n_pieces, plan->n_chunks, plan->scratch,
                       plan->scratch_bytes, rf_shard_cuda_stream(stream));
}

void rf_shard_cuda_adamw(const struct rf_optim_hyper *h, float *p, const float *g, float *m, float *v,
                         const struct rf_shard_plan *plan, struct rf_device_stream *stream) {
  if (plan->n_chunks <= 0) return;
  rf_fused_adamw(h, p, g, m, v, h->gscale, plan->pieces, plan->n_pieces, plan->n_chunks,
                 rf_shard_cuda_stream(stream));
}
