/* What `rfsdp train` reports: the progress line on rank 0, the JSONL log (one
 * object per step), the loss curve drawn by gnuplot and the process's memory
 * (the GEMM peak for MFU is the library's: rf_gemm_peak_gflops, rfsdp_model.h). */
#ifndef RF_TOOLS_TRAIN_REPORT_H
#define RF_TOOLS_TRAIN_REPORT_H

#include <stdint.h>
#include <stdio.h>

#include "plan_args.h"
#include "rfsdp.h" /* enum rf_dtype */

/* One training step as reported. val_loss is NAN when not evaluated. */
struct rf_train_record {
  int step;
  double loss, val_loss, lr, grad_norm, ms, tok_s, mfu, rss_mb;
  double cpu_ms; /* the process's CPU time in the step / its threads (rank 0): the step time less the
                  * time other jobs held the cores, on a shared machine */
  uint64_t gather_bytes, reduce_bytes, alltoall_bytes, intra_bytes, inter_bytes, copy_bytes, cast_bytes,
      own_shard_bytes, padding_bytes, allocs;
  uint64_t host_syncs;   /* times the host waited for the device in the step (rf_counters.host_syncs) */
  int skipped;           /* 1 when the step was skipped (non-finite gradients on some rank) */
  const char *mfu_dtype; /* mfu is against the oneDNN GEMM peak of this dtype (borrowed) */
};

/* Owns the FILE. */
struct rf_train_log {
  FILE *file;
  const char *path; /* borrowed */
};

/* Opens the JSONL log for appending, changing nothing in it (a run refused later
 * leaves an old log as it was). -1 with a message on failure. */
int rf_train_log_open(struct rf_train_log *log, const char *path);
/* Empties the log: a new run (not a resumed one) when training starts. */
int rf_train_log_truncate(struct rf_train_log *log);
/* One line per step, flushed; fails naming the log when the write does (a full disk). */
int rf_train_log_write(struct rf_train_log *log, const struct rf_train_record *rec);
/* Rank 0's memory as the run allocated it, next to what `rfsdp plan --batch`
 * simulates (bytes; the slab in elements). */
struct rf_train_memory {
  int64_t shard_elems;           /* rf_fsdp_stats.shard_elems */
  int64_t arena_bytes;           /* the gathered buffers' arena (rf_fsdp_stats.arena_bytes) */
  int64_t optim_state_bytes;     /* rf_optim_stats.state_bytes */
  int64_t optim_workspace_bytes; /* rf_optim_stats.workspace_bytes */
  int64_t activation_bytes;      /* the training micro-batch's model workspace */
};

/* The line {"plan": {...}, "memory": {...}} that starts the log: the run's
 * layout with the fields of `rfsdp plan --json` (rf_plan_summary_json) and its
 * memory; fails naming the log. */
int rf_train_log_plan(struct rf_train_log *log, const struct rf_plan_summary *plan,
                      const struct rf_train_memory *mem);
void rf_train_log_close(struct rf_train_log *log);

/* The progress line (stdout). */
void rf_train_print(const struct rf_train_record *rec, int total_steps);

/* Draws loss (and val_loss) against step from a JSONL log into a PNG with
 * gnuplot. -1 with a message when gnuplot fails. */
int rf_train_plot(const char *jsonl_path, const char *png_path, const char *title);
/* Draws the timeline of a trace (rf_run_trace_write's file) into a PNG with gnuplot: per rank its compute,
 * gather, reduce and replica all-reduce lanes, the waits for collectives in red. */
int rf_train_plot_timeline(const char *trace_path, const char *png_path, const char *title);

/* The monotonic clock in nanoseconds (step and checkpoint times). */
uint64_t rf_train_now_ns(void);
/* Process CPU time (all threads) in milliseconds. */
double rf_train_cpu_ms(void);

/* Resident set size of this process now and its peak, in MiB (from /proc). */
double rf_train_rss_mb(void);
double rf_train_peak_rss_mb(void);

#endif
