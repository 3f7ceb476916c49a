/* rfsdp train's options and state, shared by tools/cmd_train.c (the loop) and
 * tools/train_ckpt.c (--init, --resume, the checkpoint series). */
#ifndef RF_TOOLS_TRAIN_H
#define RF_TOOLS_TRAIN_H

#include <stdint.h>

#include "comm/comm.h"
#include "data/data.h"
#include "optim/optim.h"
#include "plan_args.h"
#include "rfsdp_run.h"
#include "train_mesh.h"
#include "train_model.h"
#include "train_report.h"

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

/* One run. Owns everything but args. */
struct rf_train_state {
  const struct rf_train_args *args;
  int rank, world;     /* in comm: the data's ranks */
  int replicate;       /* parsed --replicate: R, RF_PLAN_MESH_NODE or RF_PLAN_MESH_AUTO */
  int replicas, group; /* the mesh: R replica groups of S ranks (W = R x S) */
  struct rf_comm comm; /* every rank of the job: the loss, evaluation and the tool's agreements */
  struct rf_train_model model;
  struct rf_optim *optim;
  struct rf_tokenizer tok;
  int tok_loaded;
  struct rf_token_file train_file, val_file;
  int train_open, val_open;
  struct rf_data_loader train, val;
  int32_t *tokens, *targets; /* one micro-batch of this rank */
  struct rf_train_log log;
  struct rf_run_tensorboard *tb;   /* --tensorboard (rank 0; owned) */
  int64_t trace_first, trace_last; /* --trace: the window */
  int64_t start_step;
  struct rf_run_series series; /* --ckpt-dir */
  struct rf_run_async *async;  /* --async-save: the staging and the writer (owned) */
  uint64_t async_started_ns;   /* when the save in flight was staged */
  int stop_signal;             /* the signal that stopped the run (preemption), or 0 */
  double flops_per_token, peak_gflops, last_loss, last_val;
};

/* After the model and optimizer exist: --init (weights from safetensors) and
 * --resume (everything from a checkpoint; sets start_step). Collective. */
int rf_train_ckpt_start(struct rf_train_state *s);
/* After step `done` (1-based count of finished steps): a checkpoint when
 * --save-every says so, then the oldest beyond --keep removed. Collective. */
int rf_train_ckpt_step(struct rf_train_state *s, int64_t done);
/* The run stops after step `done` because of signal `sig` (every rank agreed):
 * a checkpoint into --ckpt-dir unless one was just saved, and the message; with
 * --async-save, after the checkpoint in flight is complete. Collective. */
int rf_train_ckpt_stop(struct rf_train_state *s, int64_t done, int sig);
/* After the last step: the checkpoint in flight (--async-save) completed. Collective. */
int rf_train_ckpt_end(struct rf_train_state *s);

#endif
