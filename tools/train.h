/* rfsdp train's options and state, shared by tools/cmd_train.c (the loop) and
 * tools/train_ckpt.c (--init, --resume, the checkpoint series). */
#ifndef RF_TOOLS_TRAIN_H
#define RF_TOOLS_TRAIN_H

#include <stdint.h>

#include "porch.h"
#include "rfsdp_model.h"
#include "rfsdp_optim.h"
#include "rfsdp_run.h"
#include "train_args.h"
#include "train_mesh.h"
#include "train_report.h"

/* One run. Owns everything but args. */
struct rf_train_state {
  const struct rf_train_args *args;
  int rank, world;              /* in comm: the data's ranks */
  int replicate;                /* parsed --replicate: R, RF_PLAN_MESH_NODE or RF_PLAN_MESH_AUTO */
  int replicas, group;          /* the mesh: R replica groups of S ranks (W = R x S) */
  struct rf_comm *job;          /* every rank of the job (owned: rf_comm_create_mpi of MPI_COMM_WORLD) */
  struct rf_comm *comm;         /* the loss, evaluation and the tool's agreements: job, then the model's view
                                   of it, counting into the context's counters (rf_train_model_comm) */
  struct rf_train_model *model; /* owned */
  struct rf_fsdp *fsdp;         /* the model's context (borrowed) */
  struct rf_optim *optim;
  struct rf_tokenizer *tok;          /* owned */
  struct rf_token_data *train, *val; /* owned */
  int32_t *tokens, *targets;         /* one micro-batch of this rank */
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
