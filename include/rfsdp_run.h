/* rfsdp run layer: what every training program needs around its step loop.
 *
 * A run's whole state is the runtime context's master weights, every optimizer
 * state (AdamW's m and v; 8-bit AdamW's codes and per-block scales; Muon's
 * momentum), the optimizer's step count, and the few numbers below (step, data
 * position, seed, RNG). rf_run_save writes all of it into one checkpoint
 * directory (the format of docs/checkpoint.md); rf_run_resume reads it back at
 * any world size and layout (resharding), bit-exactly: a run saved at step N and
 * resumed continues exactly as the uninterrupted run would.
 *
 * A checkpoint series is a directory of checkpoints SERIES/step-NNNNNNNN (8 digits,
 * the step): rf_run_series_begin checks it before a run writes there (another
 * run's checkpoints are not mixed with), rf_run_series_save saves the next one and
 * keeps this run's last K; resuming from a series takes its latest complete
 * checkpoint. A checkpoint directory without its COMPLETE marker (a save cut
 * short) is never resumed from, and nothing removes a checkpoint that the run
 * did not write.
 *
 * Preemption: rf_run_catch_signals records SIGTERM and SIGINT; the program asks
 * rf_run_stop_signal at each step boundary (all ranks agree), saves, and exits.
 *
 * Every function here is collective over the context's communicator: every rank
 * calls it, and every rank gets the same result (0, or -1 with the message in
 * rf_fsdp_error() on the rank that saw the problem and "another rank failed"
 * elsewhere). Nothing is allocated in a training step: these run between steps.
 *
 * Ownership: struct rf_run borrows the context and the optimizer. */
#ifndef RFSDP_RUN_H
#define RFSDP_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "rfsdp.h"
#include "rfsdp_optim.h"

/* What is saved and resumed. The program keeps its RNG and data reader in these
 * numbers (e.g. data_pos = samples consumed, rng = its generator's state). */
struct rf_run {
  struct rf_fsdp *fsdp;   /* the parameters (master weights) */
  struct rf_optim *optim; /* every optimizer state and its step count; NULL: none */
  int64_t step;           /* optimizer steps finished */
  int64_t data_pos;       /* the data position, in the program's unit */
  uint64_t seed;          /* the run's seed */
  uint64_t rng;           /* the program's RNG state */
};

/* Every rank's status combined over the context's communicator: 0 on every rank
 * when every rank passed 0, else the smallest status on every rank. Call it
 * before any branch that a failure seen by one rank could take. */
int rf_run_agree(const struct rf_fsdp *f, int status);

/* rf_run_agree over the ranks of any communicator (a program's own agreements, made
 * before or beside the context's: outputs opened, a config read): 0 on every rank
 * when every rank passed 0. A rank that passed 0 while another failed is marked,
 * so that rf_run_exit_status lets the rank that saw the problem speak. */
int rf_run_agree_comm(const struct rf_comm *comm, int status);
/* A program's exit status after every rank's result rc (its last collective over
 * `comm`): 0 when every rank passed, else 1, and one rank prints its message
 * (rf_fsdp_error()) once to stderr, prefixed by `command`: the lowest rank that saw
 * a problem itself, else the lowest that stopped because of another. */
int rf_run_exit_status(const struct rf_comm *comm, int rc, const char *command);
/* Every rank fills its pieces of the context's master weights from a safetensors
 * file (read into host staging, copied to the context's device), then the ranks of
 * `comm` agree: 0 on every rank, or -1 on every rank (the message names the file).
 * A start from exported weights (`rfsdp train --init`). */
int rf_run_import(struct rf_fsdp *f, const struct rf_comm *comm, const char *path);

/* A program's own files (local, not collective): a whole file read into a new
 * buffer (NUL-terminated, the caller frees it), and one buffer written atomically
 * (a temporary name, fsync, rename: a failure leaves no partial file). 0, or -1
 * with rf_fsdp_error() naming the file and the problem. */
int rf_run_file_read(const char *path, char **out, size_t *bytes);
int rf_run_file_write(const char *path, const void *buf, size_t bytes);

/* Saves the whole state into `dir` (created with its parents; it must not hold a
 * complete checkpoint). `program_json` (NULL: none) is a JSON object of the
 * program's own that is stored with it and handed back by rf_run_resume. */
int rf_run_save(const struct rf_run *run, const char *dir, const char *program_json);

/* Restores the whole state from `where`: a checkpoint directory, or a series (its
 * latest complete checkpoint). Refuses a checkpoint of another model (names,
 * shapes) or of another optimizer, leaving memory untouched; run->optim NULL
 * restores the parameters and the numbers only. The directory read is copied to
 * `resumed` (cap bytes; may be NULL); `program_json` (may be NULL) gets the saved
 * program object (caller frees; "{}" when none). */
int rf_run_resume(struct rf_run *run, const char *where, char *resumed, size_t cap, char **program_json);

/* ---- checkpoint series ------------------------------------------------------ */

#define RF_RUN_STEP_PREFIX "step-"

/* SERIES/step-NNNNNNNN of `step`. */
void rf_run_series_path(char *out, size_t cap, const char *series, int64_t step);
/* The steps of the series' complete checkpoints, ascending (*steps: caller frees;
 * NULL when there are none). Returns their count (0 when the directory is absent).
 * Local to the calling rank. */
int rf_run_series_list(const char *series, int64_t **steps);
/* A checkpoint series that one run writes into. */
struct rf_run_series {
  const char *dir;     /* borrowed */
  int keep;            /* this run's checkpoints kept (the oldest removed); 0: all */
  int64_t start_step;  /* the step this run started from: its checkpoints are the later ones */
  int64_t latest_step; /* the latest complete checkpoint found at the start, or -1 */
};

/* Before a run writes into the series `dir` (rank 0 looks, every rank gets the
 * answer). Returns 0 when the run may write there; 1 on every rank when `dir`
 * already holds a complete checkpoint and the run did not resume (`resumed` 0):
 * another run's, which the caller should refuse to mix with (s->latest_step says
 * which); -1 (a message) when the run resumed but `dir` holds a checkpoint of a
 * step after start_step, which the run would overwrite. */
int rf_run_series_begin(struct rf_run_series *s, const struct rf_fsdp *f, const char *dir, int keep,
                        int resumed, int64_t start_step);
/* A checkpoint folder's lock: the job writing into a folder names itself (host, PID,
 * the host's boot id, the process's start time) in DIR/rfsdp.lock, created
 * atomically (written under a temporary name, then link()ed: one job wins), so a
 * second job starting on the folder is told who holds it. Not collective: one
 * process takes it (rfsdp train: rank 0, which tells the others). */
struct rf_run_lock {
  char path[4096]; /* DIR/rfsdp.lock */
  char host[256];  /* the holder named by a lock found (rf_run_lock_take's 1), or this job */
  long pid;
  int held; /* 1 when this process took it */
};
/* Takes the lock of folder `dir` (which exists). Returns 0 when taken; a lock left
 * by a job that is gone is taken over: of this host, its PID no longer runs (or runs
 * another program since) or it was written before the host's last boot; of another
 * host only with `force` (this host cannot see that job). `note` then says whose
 * lock was taken over and why (a warning for the user), else it is "". Returns 1
 * when a live job (or another host's, without `force`) holds it: l->host and l->pid
 * name it, and the message says so; -1 on an error (a message). */
int rf_run_lock_take(struct rf_run_lock *l, const char *dir, int force, char *note, size_t cap);
/* Removes the lock when this process holds it and it is still its own. */
void rf_run_lock_release(struct rf_run_lock *l);
/* Saves the state as SERIES/step-<run->step>, then removes this run's oldest
 * checkpoints (steps after s->start_step, up to run->step) beyond the last
 * s->keep. A checkpoint this run did not write is never removed. */
int rf_run_series_save(const struct rf_run_series *s, const struct rf_run *run, const char *program_json);

/* ---- asynchronous saves ------------------------------------------------------
 *
 * rf_run_series_save_async starts a background thread and returns: the thread
 * first copies the state (the master shard and every optimizer state slab) into a
 * staging buffer allocated once by rf_run_async_create, while the training thread
 * goes on with the next step's forward and backward, which only read them; the
 * next rf_optim_step, the first change to them, waits for that copy (the saver sets
 * itself as the optimizer's before-step function; without an optimizer the save
 * call copies). Then the thread writes, checksums and fsyncs this rank's files
 * (src/ckpt's rf_ckpt_save_views) while training goes on. The thread never
 * communicates: where the save needs every rank's agreement (every rank's files
 * written; rank 0's meta.json and COMPLETE written) the thread stops and waits,
 * and the training thread agrees for it at a step boundary (rf_run_async_poll),
 * so no collective ever runs on two threads at once. The rotation (--keep) runs
 * once the checkpoint is complete, so it counts complete checkpoints only; a
 * process killed while its thread writes leaves the directory without COMPLETE:
 * the previous checkpoint stays the latest complete one. At most one save is in
 * flight: the next save and rf_run_async_wait wait for it; rf_run_async_free
 * abandons it (below).
 *
 * Every function but create, free and staging_bytes is collective over the
 * context's mesh, called by every rank at the same points. Ownership: the async
 * saver owns its staging and thread and borrows the context, the optimizer and
 * the series; it holds the context and the optimizer: rf_fsdp_free and
 * rf_optim_free before rf_run_async_free only mark them, and rf_run_async_free
 * frees them (the series must outlive it). */
struct rf_run_async;

/* Staging for `run`'s state: run->fsdp's shard and run->optim's state slabs (their
 * sizes are fixed at creation). Local. */
int rf_run_async_create(struct rf_run_async **out, const struct rf_run *run);
/* Bytes of staging this rank holds (the extra memory of --async-save): the copy
 * of the shard and the state slabs, and the rank file's O_DIRECT bounce buffer
 * (RF_CKPT_BOUNCE_BYTES), all written at creation (resident from the start). */
int64_t rf_run_async_staging_bytes(const struct rf_run_async *a);
/* Waits for a save in flight (rf_run_async_wait), then copies the state into
 * staging and starts writing SERIES/step-<run->step> in the background. */
int rf_run_series_save_async(struct rf_run_async *a, const struct rf_run_series *s, const struct rf_run *run,
                             const char *program_json);
/* At a step boundary: moves a save in flight on without waiting (one small
 * agreement while one is in flight, none otherwise). Returns 1 on every rank when
 * the save became complete here (*step: its step; the rotation done), 0 when
 * none is in flight or it is still being written, -1 on every rank when it failed
 * (its directory stays without COMPLETE). */
int rf_run_async_poll(struct rf_run_async *a, int64_t *step);
/* Waits until the save in flight is complete (returns 1, *step set) or failed
 * (-1); 0 when none was in flight. At the end of a run and before exiting on a
 * signal. */
int rf_run_async_wait(struct rf_run_async *a, int64_t *step);
/* What the saves cost this rank so far (cumulative, local). The training thread
 * loses copy_ns + fence_ns + wait_ns + poll_ns, and at most writer_cpu_ns (the
 * copy included) more when every core is busy. */
struct rf_run_async_stats {
  int64_t saves;           /* saves started */
  int64_t staging_bytes;   /* the staging buffer (rf_run_async_staging_bytes) */
  uint64_t copy_ns;        /* training thread: copying the state into staging (only without an optimizer) */
  uint64_t fence_ns;       /* training thread: waiting at an optimizer step for the writer's copy */
  int64_t fence_waits;     /* optimizer steps that reached that wait before the copy ended */
  int64_t copies_late;     /* copies that ended after the next optimizer step began (0, or no fence) */
  uint64_t wait_ns;        /* training thread: waiting for a save in flight (the next save, the end) */
  uint64_t poll_ns;        /* training thread: the agreements at step boundaries (rf_run_async_poll) */
  uint64_t writer_cpu_ns;  /* the writer thread's CPU time (this rank's files, checksums; rank 0: meta) */
  uint64_t writer_wall_ns; /* from staging to complete, summed */
};
void rf_run_async_get_stats(const struct rf_run_async *a, struct rf_run_async_stats *out);
/* Local: a save in flight is abandoned (its directory stays incomplete: for a
 * program that stops on an error), the thread joined, the staging freed. NULL is
 * allowed. */
void rf_run_async_free(struct rf_run_async *a);

/* ---- preemption ------------------------------------------------------------- */

/* Records SIGTERM and SIGINT (what a scheduler sends before it preempts a job, and
 * Ctrl-C) on a thread of their own: call it first, before MPI_Init and any other
 * thread starts. It blocks both signals in the calling thread, so every thread
 * started after it (OpenMP's, MPI's) has them blocked: a signal handled on a
 * thread inside a oneDNN GEMM would write its frame into the heap (src/run/signal.c).
 * A child made by fork() starts with them unblocked. */
void rf_run_catch_signals(void);
/* While `on`, a SIGTERM or SIGINT ends the process at once (exit 128 + the signal,
 * saying so on stderr) instead of being recorded: around MPI_Init, where MPICH's
 * launcher, told to stop while it starts the job, waits for its processes to end
 * (a rank that only recorded the signal would wait in MPI_Init for a launcher that
 * no longer answers). */
void rf_run_signals_exit_early(int on);
/* The signal this process caught (SIGTERM when both came), or 0. Local. */
int rf_run_signal_caught(void);
/* 1 when this rank was started by mpirun (MPICH's or Open MPI's) and its launcher
 * is gone since rf_run_catch_signals: its parent, or under MPICH the parent of
 * its hydra_pmi_proxy, has changed (Linux: /proc). Local. */
int rf_run_launcher_gone(void);
/* At a step boundary (collective): the signal that any rank caught since
 * rf_run_catch_signals (SIGTERM when ranks caught different ones), SIGHUP when a
 * rank's launcher is gone (mpirun killed: the job would train on unsupervised,
 * writing into the folder a relaunch resumes from), or 0. Every rank gets the
 * same answer, so every rank stops after the same step. */
int rf_run_stop_signal(const struct rf_fsdp *f);

/* ---- TensorBoard scalars (local: one process writes them, e.g. rank 0) ---------
 *
 * DIR/events.out.tfevents.rfsdp in TensorBoard's event format (records with their
 * masked CRC32C, Event protobufs: the file version, then one Event per step with its
 * scalars as simple values, f32 as TensorBoard stores them). One file per folder, so a
 * resumed run appends to it. rf_run_tensorboard_open makes the folder and checks the
 * file without changing it; rf_run_tensorboard_begin with `resume_step` >= 0 keeps the records up to that
 * step (those of the run that wrote the checkpoint resumed from) and cuts the later ones (written after it by
 * a run that stopped), so every step is in the file once; a torn last record (a crash mid-write) is cut too.
 * `resume_step` < 0: a new run, the file emptied. A file of that name that is not TensorBoard's is refused,
 * unchanged. -1 with the message in rf_fsdp_error(). */
#define RF_RUN_TENSORBOARD_FILE "events.out.tfevents.rfsdp"
struct rf_run_tensorboard;
int rf_run_tensorboard_open(struct rf_run_tensorboard **out, const char *dir);
/* When training starts: the cut (resume_step) and, in an empty file, the file version. */
int rf_run_tensorboard_begin(struct rf_run_tensorboard *tb, int64_t resume_step, double wall_time);
/* One Event: step (>= 1), the wall time (seconds since the epoch), n scalars. Written
 * at once (one write call), not buffered. */
int rf_run_tensorboard_scalars(struct rf_run_tensorboard *tb, int64_t step, double wall_time, int n,
                               const char *const *tags, const double *values);
void rf_run_tensorboard_close(struct rf_run_tensorboard *tb); /* NULL allowed */
/* CRC32C (Castagnoli) of n bytes: the checksum of TensorBoard's records. */
uint32_t rf_run_tensorboard_crc32c(const void *data, size_t n);

/* ---- the step's timeline (Chrome trace / Perfetto) --------------------------
 *
 * rf_run_trace_start (collective) reserves memory for the spans of steps A..B
 * (1-based, inclusive); each step calls rf_run_trace_step(step) before its work;
 * rf_run_trace_write (collective) merges every rank's spans into one JSON file of
 * the Chrome trace event format (rank 0 writes it): a process per rank, a track per
 * lane (compute, gather, reduce, replicate all-reduce, data, checkpoint, the
 * async-save writer, the watchdog), each unit's forward and backward, each
 * collective from issue to observed completion with its bytes and unit, the waits
 * for collectives nested in the compute lane (the exposed communication), the
 * optimizer step, the agreements, checkpoint writes and data loading. On MPI a
 * collective's end is the poll that observed it. Off (never started), the hooks
 * cost one branch each. */
struct rf_run_trace_summary {
  int64_t steps;              /* steps traced */
  double exposed_ms_per_step; /* the compute lane waiting for a collective, per step (worst rank) */
  double comm_ms_per_step;    /* the union of the collectives' spans, per step (worst rank) */
  double overlap;             /* 1 - exposed / communication (the lowest rank's) */
  uint64_t spans, dropped;    /* recorded on every rank; those that did not fit the reservation */
};
int rf_run_trace_start(const struct rf_fsdp *f, int64_t first_step, int64_t last_step);
void rf_run_trace_step(int64_t step);
/* A span of the caller's own on `lane` (name: static storage), from t0 = rf_run_trace_now() to now;
 * nothing when the trace is off or t0 is 0. */
uint64_t rf_run_trace_now(void);
void rf_run_trace_span(enum rf_trace_lane lane, const char *name, uint64_t t0);
int rf_run_trace_summary(const struct rf_fsdp *f, struct rf_run_trace_summary *out);
int rf_run_trace_write(const struct rf_fsdp *f, const char *path);
void rf_run_trace_stop(void); /* frees the spans; local */

#endif
