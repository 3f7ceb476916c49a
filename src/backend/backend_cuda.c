/* The CUDA backend (make BACKEND=cuda, or cuda-emu on the CPU stand-in): the device of
 * device_cuda.c, the model's kernels of kernels_cuda.cu, AdamW fused in adamw_cuda.cu (a unit's
 * shard in one launch with the gradient norm's sum: shard_cuda.c over fused_cuda.cu), 8-bit AdamW
 * in adamw8bit_cuda.cu, Muon's element-wise stages in muon_cuda.cu and its Newton-Schulz in
 * newton_schulz_cuda.c. */
#include "backend/backend.h"
#include "comm/comm_nccl.h"
#include "device/device_cuda.h"
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
