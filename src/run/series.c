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

int rf_run_series_save(const struct rf_run *run, const char *series, int keep, const char *program_json) {
  RF_REQUIRE(keep >= 0, "%s: keep %d checkpoints?", series, keep);
  char dir[RF_FILE_PATH_MAX];
  rf_run_series_path(dir, sizeof dir, series, run->step);
  RF_TRY(rf_run_save(run, dir, program_json));
  if (rf_fsdp_rank(run->fsdp) == 0 && keep > 0) {
    int64_t *steps;
    int n = rf_run_series_list(series, &steps);
    int older = 0; /* the saved step and those below it: never a higher one */
    while (older < n && steps[older] <= run->step) older++;
    for (int i = 0; i + keep < older; i++) {
      rf_run_series_path(dir, sizeof dir, series, steps[i]);
      rf_run_remove(dir);
    }
    free(steps);
  }
  rf_run_agree(run->fsdp, 0); /* a barrier: nobody saves the next one before the rotation ended */
  return 0;
}
