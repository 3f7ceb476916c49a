/* src/backend: the one choice of where a run computes (ggml's backend, STYLE.md 16).
 *
 * A backend is a static const table that carries everything device-specific: how its
 * device is opened (the src/device table, struct rf_device_ops), the model's kernel
 * table (src/model/kernels.h) and the optimizer's fused kernels. It is chosen once,
 * by name, from a fixed list (rf_backend_find: "cpu", "checked", "cuda"); the device it opens
 * points back at it (rf_device.backend), so whoever holds the device (the runtime
 * context, the optimizer made over it, the model's workspace) reaches the rest
 * without being told again, and no caller tests which backend it has.
 *
 * "cpu" is in every build. "cuda" is listed in every build; a CPU build, or a CUDA
 * build on a machine without a GPU, says why it cannot be used (unavailable). "checked" (the
 * strict twin of a GPU on the CPU, src/device/device_checked.c) is listed and trains (a backend
 * whose step still has host code on device memory says where in train_refused; none does now).
 *
 * This header names the tables' types only (forward declarations): src/device,
 * src/model and src/optim include it without including each other. */
#ifndef RF_BACKEND_H
#define RF_BACKEND_H

#include <stdint.h>

#include "device/device.h"

struct rf_model_kernels;   /* model/kernels.h */
struct rf_optim_hyper;     /* optim/optim.h */
struct rf_optim_8bit_plan; /* optim/optim.h */
struct rf_comm;            /* comm/comm.h */

/* A piece of the rank's shard slabs (elements [offset, offset + len) of its parameter, gradient and
 * moment slabs; AdamW's weight decay on it or not) for a backend's shard kernels. */
struct rf_shard_piece {
  int64_t offset, len;
  int decay;
};
/* The pieces one launch of a backend's shard kernels covers (a unit's shard: the norm's sum of
 * squares, AdamW), made once at set-up by the backend's shard_plan, freed by its shard_plan_free. */
struct rf_shard_plan {
  void *pieces;  /* owned, device memory: the backend's records of the pieces */
  void *scratch; /* owned, device memory: the sum of squares' partials */
  size_t scratch_bytes;
  int n_pieces;
  int64_t n_chunks; /* blocks of one launch; 0: the pieces are empty, nothing is launched */
};

struct rf_backend {
  const char *name; /* as --device spells it */
  /* Why this program cannot use the backend (static storage; the same on every rank of a
   * job built one way), NULL when it can. */
  const char *(*unavailable)(void);
  /* Why training (rf_device_unavailable: rfsdp train, the model over the runtime) refuses it although
   * the runtime opens it (rf_fsdp_create: its collectives, DBuffers and optimizers run there); NULL
   * (or absent): nothing. */
  const char *(*train_refused)(void);
  /* Opens the backend's device `ordinal` (GPU: the local rank's), counting into `counters`
   * (may be NULL); released by rf_device_free. */
  void (*open)(struct rf_device *dev, int ordinal, struct rf_counters *counters);
  /* How many devices of this kind the process sees (GPU: cudaGetDeviceCount); NULL: one (the host). */
  int (*devices)(void);
  const struct rf_model_kernels *model; /* the model's compute on activations */
  /* The communicator the runtime's collectives on this device's memory go through, over `comm` (an
   * MPI communicator, borrowed: it must outlive out), collective over comm; released by
   * rf_comm_free. NULL: a view of comm (rf_comm_on_device: MPI reaches the bytes; nothing to free).
   * CUDA: NCCL (src/comm/comm_nccl.c), host memory still on MPI. */
  void (*comm_open)(struct rf_comm *out, const struct rf_comm *comm, struct rf_device *dev);
  /* AdamW over one piece in device memory on `stream`, bit for bit the host loop (src/optim/adamw.c,
   * the cpu backend's). */
  void (*adamw_piece)(const struct rf_optim_hyper *h, int decay, float *p, const float *g, float *m, float *v,
                      int64_t len, struct rf_device_stream *stream);
  /* 8-bit AdamW's whole step as kernels (src/optim/adamw8bit.c's plan), bit for bit the host step;
   * NULL: the host code (launched, or at once on the host). */
  void (*adamw8bit_step)(const struct rf_optim_8bit_plan *plan, const struct rf_optim_hyper *h,
                         struct rf_device_stream *stream);
  /* A unit's shard in one launch each (src/model/fused_cuda.cu); all NULL: a launch per piece
   * (sum_squares_add of the device table, adamw_piece). shard_plan uploads pieces[0..n) (offsets
   * into the slabs the kernels get) on `stream`; shard_sum_squares_add adds the pieces' sum of g^2
   * (f64, a fixed order: not the pieces' order) into *acc; shard_adamw is adamw_piece over every
   * piece (h->gscale: the clip factor, NaN skips the update). */
  void (*shard_plan)(struct rf_device *dev, struct rf_shard_plan *out, const struct rf_shard_piece *pieces,
                     int n, struct rf_device_stream *stream);
  void (*shard_plan_free)(struct rf_device *dev, struct rf_shard_plan *plan);
  void (*shard_sum_squares_add)(double *acc, const float *g, const struct rf_shard_plan *plan,
                                struct rf_device_stream *stream);
  void (*shard_adamw)(const struct rf_optim_hyper *h, float *p, const float *g, float *m, float *v,
                      const struct rf_shard_plan *plan, struct rf_device_stream *stream);
  /* Muon's element-wise stages as kernels (src/optim/muon.c's pack and unpack; their results staged
   * through a device buffer and copies), bit for bit the host's; NULL: the host code on the views. */
  void (*muon_momentum)(float *buf, const float *g, float *u, int64_t len, float momentum, int nesterov,
                        struct rf_device_stream *stream);
  void (*muon_apply)(float *p, const float *u, int64_t len, float dec, float alr,
                     struct rf_device_stream *stream);
  /* Muon's Newton-Schulz iteration on device memory (rf_optim_newton_schulz_cuda's contract: the
   * host's result within f32 roundoff); NULL: on the owner's host staging. */
  void (*muon_newton_schulz)(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                             double *ss, struct rf_device_stream *stream);
};

/* The host: every build, memory from the heap. */
extern const struct rf_backend rf_backend_cpu;

/* The backend called `name` ("cpu", "checked", "cuda"), or NULL (no such name). */
const struct rf_backend *rf_backend_find(const char *name);
/* The names of the list, "cpu|checked|cuda" (static storage). */
const char *rf_backend_names(void);
/* Opens b's device (rf_device.backend = b). Dies when b is unavailable: check with
 * rf_backend_check first. */
void rf_backend_open(const struct rf_backend *b, struct rf_device *dev, int ordinal,
                     struct rf_counters *counters);
/* 0 when `name` names a backend this program can open (the runtime's check; training also asks
 * rf_device_unavailable, which adds train_refused); else -1 with a message naming it and why
 * (rf_error_msg). */
int rf_backend_check(const char *name);

#endif
