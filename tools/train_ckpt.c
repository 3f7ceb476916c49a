/* rfsdp train's checkpoints through the run layer (include/rfsdp_run.h): --init
 * (weights from safetensors), --resume (everything from a checkpoint or the latest
 * of a series), the series in --ckpt-dir every --save-every steps (this run's
 * last --keep kept; a --ckpt-dir holding another run's checkpoints refused), and
 * the checkpoint at a preemption. The data loader is a function of (seed, step),
 * so the step is the data position. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "rfsdp_run.h"
#include "train.h"

static struct rf_run rf_train_run_at(const struct rf_train_state *s, int64_t step) {
  return (struct rf_run){
      .fsdp = s->fsdp, .optim = s->optim, .step = step, .data_pos = step, .seed = (uint64_t)s->args->seed};
}

/* 1 when checkpoint `dir` is a step of the series folder `series` (the same folder
 * by device and inode; every rank sees the same files). */
static int rf_train_same_folder(const char *dir, const char *series) {
  char parent[RF_FILE_PATH_MAX + 4];
  snprintf(parent, sizeof parent, "%s/..", dir);
  struct stat x, y;
  return stat(parent, &x) == 0 && stat(series, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int rf_train_ckpt_start(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  int resumed_here = 0;
  if (a->init) {
    RF_TOOL_TRY(rf_run_import(s->fsdp, s->comm, a->init));
    if (s->rank == 0) printf("initialized from %s\n", a->init);
  }
  if (a->resume) {
    struct rf_run run = rf_train_run_at(s, 0);
    char dir[RF_FILE_PATH_MAX];
    if (rf_run_resume(&run, a->resume, dir, sizeof dir, NULL) != 0) return -1;
    RF_TOOL_REQUIRE(run.step >= 0 && run.step <= a->steps, "%s: saved at step %lld, beyond --steps %lld", dir,
                    (long long)run.step, (long long)a->steps);
    s->start_step = run.step;
    if (s->rank == 0) printf("resumed from %s at step %lld\n", dir, (long long)run.step);
    if (s->rank == 0 && run.step == a->steps)
      printf("nothing to train: the checkpoint is at step %lld, which is --steps (raise --steps to go on)\n",
             (long long)run.step);
    resumed_here = a->ckpt_dir && rf_train_same_folder(dir, a->ckpt_dir);
  }
  if (!a->ckpt_dir) return 0; /* --ckpt-dir was made with the other outputs (tools/cmd_train.c) */
  int rc = rf_run_series_begin(&s->series, s->fsdp, a->ckpt_dir, a->keep, a->resume != NULL, s->start_step);
  RF_TOOL_REQUIRE(
      rc != 1,
      "--ckpt-dir %s already holds checkpoints of another run (the latest: step %lld): to continue that "
      "run, add --resume %s; to start a new one, pick another --ckpt-dir",
      a->ckpt_dir, (long long)s->series.latest_step, a->ckpt_dir);
  /* resumed from this series: its earlier checkpoints are this run's too, so --keep
   * bounds the folder across preempt/resume cycles (the rotation keeps the last K of
   * the steps after series.start_step) */
  if (rc == 0 && resumed_here) s->series.start_step = -1;
  if (rc != 0 || !a->async_save) return rc;
  struct rf_run run = rf_train_run_at(s, s->start_step);
  RF_TOOL_TRY(rf_run_async_create(&s->async, &run));
  if (s->rank == 0)
    printf(
        "async save: a staging buffer of %.1f MB per rank (the shard, the optimizer state and the rank "
        "file's write buffer), resident from the start\n",
        (double)rf_run_async_staging_bytes(s->async) / 1e6);
  return 0;
}

/* 1 when --save-every asks for a checkpoint after `done` steps. */
static int rf_train_ckpt_due(const struct rf_train_args *a, int64_t done) {
  return a->save_every > 0 && (done % a->save_every == 0 || done == a->steps);
}

static int rf_train_ckpt_advance(struct rf_train_state *s, int block);

static int rf_train_ckpt_save(struct rf_train_state *s, int64_t done) {
  /* the time training waits here: with --async-save, the previous save's end and the copy */
  uint64_t t0 = rf_train_now_ns();
  RF_TOOL_TRY(rf_train_ckpt_advance(s, 1)); /* --async-save: at most one in flight */
  const struct rf_train_args *a = s->args;
  cJSON *program = cJSON_CreateObject();
  cJSON_AddStringToObject(program, "model", a->model);
  char *json = cJSON_PrintUnformatted(program);
  cJSON_Delete(program);
  RF_TOOL_ASSERT(json);
  struct rf_run run = rf_train_run_at(s, done);
  int rc = s->async ? rf_run_series_save_async(s->async, &s->series, &run, json)
                    : rf_run_series_save(&s->series, &run, json);
  free(json);
  if (rc != 0) return -1;
  s->async_started_ns = rf_train_now_ns();
  if (s->rank == 0) {
    char dir[RF_FILE_PATH_MAX];
    rf_run_series_path(dir, sizeof dir, a->ckpt_dir, done);
    printf("checkpoint: %s (step %lld, %.0f ms%s)\n", dir, (long long)done,
           (double)(rf_train_now_ns() - t0) / 1e6, s->async ? " to stage; written in the background" : "");
  }
  return 0;
}

/* --async-save: the save in flight moved on (block: until complete); says when it is. */
static int rf_train_ckpt_advance(struct rf_train_state *s, int block) {
  if (!s->async) return 0;
  int64_t step = -1;
  int rc = block ? rf_run_async_wait(s->async, &step) : rf_run_async_poll(s->async, &step);
  if (rc < 0) return -1;
  if (rc == 1 && s->rank == 0) {
    char dir[RF_FILE_PATH_MAX];
    rf_run_series_path(dir, sizeof dir, s->args->ckpt_dir, step);
    printf("checkpoint complete: %s (step %lld, %.0f ms after staging)\n", dir, (long long)step,
           (double)(rf_train_now_ns() - s->async_started_ns) / 1e6);
  }
  return 0;
}

int rf_train_ckpt_step(struct rf_train_state *s, int64_t done) {
  RF_TOOL_TRY(rf_train_ckpt_advance(s, 0));
  if (!rf_train_ckpt_due(s->args, done)) return 0;
  uint64_t t0 = rf_run_trace_now();
  int rc = rf_train_ckpt_save(s, done);
  rf_run_trace_span(RF_TRACE_LANE_CKPT, s->async ? "checkpoint save (staged)" : "checkpoint save", t0);
  return rc;
}

int rf_train_ckpt_end(struct rf_train_state *s) {
  if (!s->async) return 0;
  struct rf_run_async_stats st, end;
  rf_run_async_get_stats(s->async, &st); /* what training lost, before the last save's end is awaited */
  RF_TOOL_TRY(rf_train_ckpt_advance(s, 1));
  rf_run_async_get_stats(s->async, &end);
  if (s->rank == 0)
    printf(
        "async save: %lld saves; rank 0's training thread copied %.1f ms, waited %.1f ms at optimizer steps "
        "for the writer's copy (%lld steps waited; %lld copies ended after the next step began), %.1f ms for "
        "saves in flight and %.1f ms in agreements; its writer thread used %.1f ms CPU; after the last step "
        "the last save took %.1f ms more; staging %.1f MB\n",
        (long long)st.saves, (double)st.copy_ns / 1e6, (double)st.fence_ns / 1e6, (long long)st.fence_waits,
        (long long)end.copies_late, (double)st.wait_ns / 1e6, (double)st.poll_ns / 1e6,
        (double)end.writer_cpu_ns / 1e6, (double)(end.wait_ns - st.wait_ns) / 1e6,
        (double)st.staging_bytes / 1e6);
  return 0;
}

int rf_train_ckpt_stop(struct rf_train_state *s, int64_t done, int sig) {
  const struct rf_train_args *a = s->args;
  s->stop_signal = sig;
  if (a->ckpt_dir && !rf_train_ckpt_due(a, done)) RF_TOOL_TRY(rf_train_ckpt_save(s, done));
  RF_TOOL_TRY(rf_train_ckpt_advance(s, 1)); /* the save in flight completes before the exit */
  if (s->rank == 0) {
    const char *by = sig == SIGINT   ? "SIGINT"
                     : sig == SIGHUP ? "SIGHUP (the launcher, mpirun, is gone)"
                                     : "SIGTERM";
    if (a->ckpt_dir)
      printf("stopped by %s after step %lld: continue with --resume %s\n", by, (long long)done, a->ckpt_dir);
    else
      printf("stopped by %s after step %lld (no --ckpt-dir: nothing saved)\n", by, (long long)done);
    fflush(stdout);
  }
  return 0;
}
