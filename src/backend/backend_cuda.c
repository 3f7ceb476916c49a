/* The CUDA backend (make BACKEND=cuda, or cuda-emu on the CPU stand-in): the device of
 * device_cuda.c, the model's kernels of kernels_cuda.cu, AdamW fused in adamw_cuda.cu (a unit's
 * shard in one launch with the gradient norm's sum: the shard_* entries below, over fused_cuda.cu), 8-bit
 * AdamW in adamw8bit_cuda.cu, Muon's element-wise stages in muon_cuda.cu and its Newton-Schulz in
 * newton_schulz_cuda.c. */
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "comm/comm_nccl.h"
#include "device/device_cuda.h"
#include "model/fused_cuda.h"
#include "model/kernels.h"
#include "optim/optim.h"

/* NCCL over comm's ranks on dev's GPU; first NCCL_HOSTID per rank where a node has more ranks
 * than GPUs (rf_comm_nccl_local_device), before any NCCL communicator exists (lanes are made
 * when first used). Counts where comm counts. */
static void rf_backend_cuda_comm_open(struct rf_comm *out, const struct rf_comm *comm,
                                      struct rf_device *dev) {
  (void)rf_comm_nccl_local_device(comm);
  rf_comm_nccl_init(out, comm, dev);
  out->counters = comm->counters;
  out->across_groups = comm->across_groups;
}

/* ---- a unit's shard in one launch (the shard_* entries, backend.h): the plan of its pieces
 * uploaded once at set-up, then the gradient norm's sum of squares and AdamW over every piece as
 * fused_cuda.cu's kernels, one launch each (the sum of squares and its finish: two) instead of one
 * per piece ---- */

static cudaStream_t rf_shard_cuda_stream(struct rf_device_stream *stream) {
  if (!stream) RF_DIE("CUDA shard kernels: a launch without a stream (NULL): name the runtime's");
  return (cudaStream_t)stream->handle;
}

static void rf_shard_cuda_plan(struct rf_device *dev, struct rf_shard_plan *out,
                               const struct rf_shard_piece *pieces, int n, struct rf_device_stream *stream) {
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

static void rf_shard_cuda_plan_free(struct rf_device *dev, struct rf_shard_plan *plan) {
  if (!plan) return;
  rf_device_release(dev, plan->pieces);
  rf_device_release(dev, plan->scratch);
  memset(plan, 0, sizeof *plan);
}

static void rf_shard_cuda_sum_squares_add(double *acc, const float *g, const struct rf_shard_plan *plan,
                                          struct rf_device_stream *stream) {
  if (plan->n_chunks <= 0) return; /* adding 0 to the sum changes no bit */
  rf_fused_sum_squares(acc, 1, g, plan->pieces, plan->n_pieces, plan->n_chunks, plan->scratch,
                       plan->scratch_bytes, rf_shard_cuda_stream(stream));
}

static void rf_shard_cuda_adamw(const struct rf_optim_hyper *h, float *p, const float *g, float *m, float *v,
                                const struct rf_shard_plan *plan, struct rf_device_stream *stream) {
  if (plan->n_chunks <= 0) return;
  rf_fused_adamw(h, p, g, m, v, h->gscale, plan->pieces, plan->n_pieces, plan->n_chunks,
                 rf_shard_cuda_stream(stream));
}

const struct rf_backend rf_backend_cuda = {
    .name = "cuda",
    .unavailable = rf_device_cuda_unavailable,
    .open = rf_device_cuda_init,
    .devices = rf_device_cuda_count,
    .model = &rf_model_kernels_cuda,
    .adamw_piece = rf_optim_adamw_cuda_piece,
    .adamw8bit_step = rf_optim_adamw8bit_cuda_step,
    .shard_plan = rf_shard_cuda_plan,
    .shard_plan_free = rf_shard_cuda_plan_free,
    .shard_sum_squares_add = rf_shard_cuda_sum_squares_add,
    .shard_adamw = rf_shard_cuda_adamw,
    .muon_momentum = rf_optim_muon_cuda_momentum,
    .muon_apply = rf_optim_muon_cuda_apply,
    .muon_newton_schulz = rf_optim_newton_schulz_cuda,
    .comm_open = rf_backend_cuda_comm_open,
};
