/* The list of backends: the host in every build, CUDA where linked (backend_cuda.c,
 * make BACKEND=cuda or cuda-emu). */
#include "backend/backend.h"
#include "rfsdp.h"

#include "model/kernels.h"
#include "optim/optim.h"

static const char *rf_backend_cpu_unavailable(void) { return NULL; }

static void rf_backend_cpu_open(struct rf_device *dev, int ordinal, struct rf_counters *counters) {
  (void)ordinal;
  rf_device_host_init(dev, counters);
}

const struct rf_backend rf_backend_cpu = {
    .name = "cpu",
    .unavailable = rf_backend_cpu_unavailable,
    .open = rf_backend_cpu_open,
    .model = &rf_model_kernels_host,
    .adamw_piece = rf_optim_adamw_host_piece,
};

/* The checked device (src/device/device_checked.c): the GPU's strict twin on the CPU. The whole
 * step runs on it (the model's checked kernel table, the runtime's collectives and optimizers on
 * device buffers, checkpoints through host staging): `rfsdp train --device checked` gives the cpu
 * run's losses, norms and checkpoint files bit for bit (tests/test_train_checked.c). */
static const struct rf_backend rf_backend_checked = {
    .name = "checked",
    .unavailable = rf_backend_cpu_unavailable,
    .open = rf_device_checked_init,
    .model = &rf_model_kernels_checked,
    .adamw_piece = rf_optim_adamw_launch_piece,
};

/* backend_cuda.c's table in a CUDA build (the link pulls it in: -Wl,--undefined=rf_backend_cuda);
 * absent from a CPU build, where "cuda" answers why. */
extern const struct rf_backend rf_backend_cuda __attribute__((weak));

static const char *rf_backend_no_cuda(void) {
  return "this rfsdp is built without CUDA (make BACKEND=cuda builds build-cuda/rfsdp; docs/gpu.md)";
}

static const struct rf_backend rf_backend_cuda_missing = {
    .name = "cuda",
    .unavailable = rf_backend_no_cuda,
};

const struct rf_backend *rf_backend_find(const char *name) {
  if (!name) return NULL;
  if (strcmp(name, "cpu") == 0) return &rf_backend_cpu;
  if (strcmp(name, "checked") == 0) return &rf_backend_checked;
  if (strcmp(name, "cuda") == 0) return &rf_backend_cuda ? &rf_backend_cuda : &rf_backend_cuda_missing;
  return NULL;
}

const char *rf_backend_names(void) { return "cpu|checked|cuda"; }

void rf_backend_open(const struct rf_backend *b, struct rf_device *dev, int ordinal,
                     struct rf_counters *counters) {
  const char *why = b->unavailable();
  if (why) RF_DIE("device %s: %s", b->name, why);
  b->open(dev, ordinal, counters);
  dev->backend = b;
}

const char *rf_device_unavailable(const char *device) {
  const struct rf_backend *b = rf_backend_find(device);
  if (!b) return "no such backend (cpu|checked|cuda)";
  const char *why = b->unavailable();
  return why ? why : b->train_refused ? b->train_refused() : NULL;
}

int rf_backend_check(const char *name) {
  const struct rf_backend *b = rf_backend_find(name);
  RF_REQUIRE(b, "device '%s': no such backend (%s)", name ? name : "(null)", rf_backend_names());
  const char *why = b->unavailable();
  RF_REQUIRE(!why, "device %s: %s", b->name, why);
  return 0;
}
