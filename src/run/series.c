/* The checkpoint series: SERIES/step-NNNNNNNN, the latest complete one, and the
 * rotation that keeps the last K. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/run.h"

void rf_run_series_path(char *out, size_t cap, const char *series, int64_t step) {
  snprintf(out, cap, "%s/" RF_RUN_STEP_PREFIX "%08lld", series, (long long)step);
}

/* 1 when dir holds a complete checkpoint. */
static int rf_run_complete(const char *dir) {
  char path[RF_FILE_PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/%s", dir, RF_CKPT_MARKER);
  return access(path, F_OK) == 0;
}

int rf_run_series_list(const char *series, int64_t **steps) {
  *steps = NULL;
  DIR *d = opendir(series);
  if (!d) return 0;
  int n = 0, cap = 0;
  const struct dirent *e;
  const size_t len = strlen(RF_RUN_STEP_PREFIX);
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, RF_RUN_STEP_PREFIX, len) != 0) continue;
    char *end = NULL;
    long long step = strtoll(e->d_name + len, &end, 10);
    char sub[RF_FILE_PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", series, e->d_name);
    if (!end || *end || end == e->d_name + len || !rf_run_complete(sub)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      int64_t *grown = realloc(*steps, (size_t)cap * sizeof(int64_t));
      RF_ASSERT(grown);
      *steps = grown;
    }
    (*steps)[n++] = step;
  }
  closedir(d);
  for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
    for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
      int64_t t = (*steps)[j];
      (*steps)[j] = (*steps)[j - 1];
      (*steps)[j - 1] = t;
    }
  return n;
}

/* Removes a checkpoint directory: its marker first, so it is never seen complete
 * while half deleted. */
static void rf_run_remove(const char *dir) {
  char path[RF_FILE_PATH_MAX + 300];
  snprintf(path, sizeof path, "%s/%s", dir, RF_CKPT_MARKER);
  unlink(path);
  DIR *d = opendir(dir);
  if (!d) return;
  const struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

int rf_run_series_begin(struct rf_run_series *s, const struct rf_fsdp *f, const char *dir, int keep,
                        int resumed, int64_t start_step) {
  RF_REQUIRE_ARG("rf_run_series_begin", s);
  RF_REQUIRE_ARG("rf_run_series_begin", f);
  RF_REQUIRE_ARG("rf_run_series_begin", dir);
  memset(s, 0, sizeof *s);
  s->dir = dir;
  s->keep = keep;
  s->start_step = start_step;
  s->latest_step = -1;
  int rc = keep >= 0 ? 0 : rf_error_set(__FILE__, __LINE__, "%s: keep %d checkpoints?", dir, keep);
  int64_t found[2] = {-1, -1}; /* the latest complete step; the first above start_step */
  if (rc == 0 && rf_comm_mesh_first(&f->mesh)) {
    int64_t *steps;
    int n = rf_run_series_list(dir, &steps);
    if (n > 0) found[0] = steps[n - 1];
    for (int i = 0; i < n && found[1] < 0; i++)
      if (steps[i] > start_step) found[1] = steps[i];
    free(steps);
  }
  if (rf_run_agree(f, rc) != 0) {
    if (rc == 0) RF_FAIL_ELSEWHERE("%s: another rank failed", dir);
    return -1;
  }
  rf_comm_mesh_bcast(&f->mesh, found, 2, RF_DTYPE_I64);
  s->latest_step = found[0];
  if (found[0] >= 0 && !resumed) return 1;
  if (resumed && found[1] >= 0) {
    char later[RF_FILE_PATH_MAX];
    rf_run_series_path(later, sizeof later, dir, found[1]);
    RF_FAIL("%s holds a checkpoint after step %lld, where this run starts (%s): this run would overwrite it",
            dir, (long long)start_step, later);
  }
  return 0;
}

int rf_run_series_save(const struct rf_run_series *s, const struct rf_run *run, const char *program_json) {
  RF_REQUIRE_ARG("rf_run_series_save", s);
  RF_REQUIRE_ARG("rf_run_series_save", run);
  RF_REQUIRE_ARG("rf_run_series_save", run->fsdp);
  char dir[RF_FILE_PATH_MAX];
  rf_run_series_path(dir, sizeof dir, s->dir, run->step);
  RF_TRY(rf_run_save(run, dir, program_json));
  rf_run_series_rotate(s, run->fsdp, run->step);
  rf_run_agree(run->fsdp, 0); /* a barrier: nobody saves the next one before the rotation ended */
  return 0;
}

void rf_run_series_rotate(const struct rf_run_series *s, const struct rf_fsdp *f, int64_t step) {
  char dir[RF_FILE_PATH_MAX];
  if (rf_comm_mesh_first(&f->mesh) && s->keep > 0) {
    int64_t *steps;
    int n = rf_run_series_list(s->dir, &steps);
    int own = 0; /* this run's: steps in (start_step, step], ascending */
    for (int i = 0; i < n; i++) own += steps[i] > s->start_step && steps[i] <= step;
    for (int i = 0, seen = 0; i < n; i++) {
      if (steps[i] <= s->start_step || steps[i] > step || seen++ >= own - s->keep) continue;
      rf_run_series_path(dir, sizeof dir, s->dir, steps[i]);
      rf_run_remove(dir);
    }
    free(steps);
  }
}
