/* The CUDA backend (make BACKEND=cuda, or cuda-emu on the CPU stand-in): the device of
 * device_cuda.c, the model's kernels of kernels_cuda.cu, AdamW fused in adamw_cuda.cu. */
#include "backend/backend.h"
#include "device/device_cuda.h"
#include "model/kernels.h"
#include "optim/optim.h"

const struct rf_backend rf_backend_cuda = {
    .name = "cuda",
    .unavailable = rf_device_cuda_unavailable,
    .open = rf_device_cuda_init,
    .devices = rf_device_cuda_count,
    .model = &rf_model_kernels_cuda,
    .adamw_piece = rf_optim_adamw_cuda_piece,
};
