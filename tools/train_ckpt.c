/* rfsdp train's checkpoints through the run layer (include/rfsdp_run.h): --init
 * (weights from safetensors), --resume (everything from a checkpoint or the latest
 * of a series), and the series in --ckpt-dir every --save-every steps, the last
 * --keep kept. The data loader is a function of (seed, step), so the step is the
 * data position. */
#include <cjson/cJSON.h>
#include <stdlib.h>

#include "rfsdp_run.h"
#include "train.h"

static struct rf_run rf_train_run_at(const struct rf_train_state *s, int64_t step) {
  return (struct rf_run){.fsdp = s->model.fsdp,
                         .optim = s->optim,
                         .step = step,
                         .data_pos = step,
                         .seed = (uint64_t)s->args->seed};
}

int rf_train_ckpt_start(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  RF_REQUIRE(!(a->save_every > 0 && !a->ckpt_dir), "--save-every needs --ckpt-dir");
  RF_REQUIRE(!(a->init && a->resume), "--init and --resume exclude each other");
  if (a->init) {
    RF_TRY(rf_train_model_import(&s->model, &s->comm, a->init));
    if (s->rank == 0) printf("initialized from %s\n", a->init);
  }
  if (a->resume) {
    struct rf_run run = rf_train_run_at(s, 0);
    char dir[RF_FILE_PATH_MAX];
    if (rf_run_resume(&run, a->resume, dir, sizeof dir, NULL) != 0) return -1;
    RF_REQUIRE(run.step >= 0 && run.step <= a->steps, "%s: saved at step %lld, beyond --steps %lld", dir,
               (long long)run.step, (long long)a->steps);
    s->start_step = run.step;
    if (s->rank == 0) printf("resumed from %s at step %lld\n", dir, (long long)run.step);
  }
  return 0; /* --ckpt-dir was made with the other outputs (tools/cmd_train.c) */
}

int rf_train_ckpt_step(struct rf_train_state *s, int64_t done) {
  const struct rf_train_args *a = s->args;
  if (a->save_every <= 0 || (done % a->save_every != 0 && done != a->steps)) return 0;
  cJSON *program = cJSON_CreateObject();
  cJSON_AddStringToObject(program, "model", a->model);
  char *json = cJSON_PrintUnformatted(program);
  cJSON_Delete(program);
  RF_ASSERT(json);
  struct rf_run run = rf_train_run_at(s, done);
  uint64_t t0 = rf_time_ns();
  int rc = rf_run_series_save(&run, a->ckpt_dir, a->keep, json);
  free(json);
  if (rc != 0) return -1;
  if (s->rank == 0) {
    char dir[RF_FILE_PATH_MAX];
    rf_run_series_path(dir, sizeof dir, a->ckpt_dir, done);
    printf("checkpoint: %s (step %lld, %.0f ms)\n", dir, (long long)done, (double)(rf_time_ns() - t0) / 1e6);
  }
  return 0;
}
