/* rfsdp train's command line (tools/cmd_train.c parses it; tools/train_mesh.c
 * and tools/train_ckpt.c read it). Public headers only (tests/test_boundary.c). */
#ifndef RF_TOOLS_TRAIN_ARGS_H
#define RF_TOOLS_TRAIN_ARGS_H

#include <stdint.h>

#include "plan_args.h"

/* The command line. Strings are borrowed from argv. */
struct rf_train_args {
  const char *model, *data, *compute_dtype;
  const char *device;       /* --device cpu | cuda (refused: rf_device_cuda_check) */
  struct rf_plan_args plan; /* --optim, --layout, --shard, --block-rows, --param-dtype, --reduce-dtype */
  const char *log, *plot, *ckpt_dir, *resume, *init;
  const char *tensorboard;         /* --tensorboard DIR (rank 0 writes the event file) */
  const char *trace, *trace_steps; /* --trace FILE, --trace-steps A:B */
  const char *replicate;           /* --replicate R | node | auto (tools/train_mesh.h) */
  double max_padding;              /* --max-padding percent for --replicate auto; < 0: not given */
  double memory_per_rank;          /* --memory-per-rank GB (1e9 bytes) for --replicate auto; 0: not given */
  int64_t steps, batch, seq, warmup, seed, eval_every, print_every, save_every;
  double lr, min_lr_ratio, weight_decay, clip, temperature, peak_gflops, collective_timeout;
  int accum, prefetch, no_reshard, eval_batches, sample, keep;
  int async_save;                       /* --async-save: checkpoints written by a background thread */
  int ckpt_dir_force;                   /* --ckpt-dir-force: take another host's lock of --ckpt-dir */
  int64_t shampoo_block, shampoo_every; /* --optim shampoo */
  double shampoo_beta2, shampoo_eps;
  int shampoo_stagger;
};

#endif
