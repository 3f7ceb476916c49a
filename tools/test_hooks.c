/* The command's test hooks, read from the environment in one place. Compiled twice by the
 * Makefile: with -DRF_TEST_HOOKS into build/rfsdp (the tests' command) and without it into
 * build/rfsdp-release (what `make install` installs), where rf_train_test_hooks is empty and
 * the binary holds no RF_TEST_ name (tests/test_boundary.c checks it with strings(1)). */
#include "test_hooks.h"

#ifdef RF_TEST_HOOKS
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/core.h"
#include "run/test_control.h"

/* RF_TEST_START_PAUSE=FILE:MS (tests/test_train_stop.c): a start-up that takes MS
 * milliseconds longer, FILE created by rank 0 when it begins, so a signal can be sent
 * while the job is surely starting. */
static void rf_train_test_start_pause(const struct rf_comm *comm, const char *hook) {
  const char *colon = hook ? strrchr(hook, ':') : NULL;
  if (!colon) return;
  char path[RF_FILE_PATH_MAX];
  snprintf(path, sizeof path, "%.*s", (int)(colon - hook), hook);
  rf_comm_barrier(comm);
  if (comm->rank == 0) {
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
  }
  uint64_t ms = (uint64_t)atoll(colon + 1);
  struct timespec pause = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000L};
  while (nanosleep(&pause, &pause) != 0) continue;
}

void rf_train_test_hooks(const struct rf_comm *comm) {
  const char *die = getenv("RF_TEST_DIE_IN_SAVE"); /* a rank killed mid-save (tests/test_train.c) */
  if (die && *die) rf_run_test_die_in_save(atoll(die));
  const char *late = getenv("RF_TEST_ASYNC_COPY_LATE"); /* a late snapshot (tests/test_train_async.c) */
  if (late && *late) rf_run_test_late_async_copy(atoi(late));
  rf_train_test_start_pause(comm, getenv("RF_TEST_START_PAUSE")); /* tests/test_train_stop.c */
}
#else
void rf_train_test_hooks(const struct rf_comm *comm) { (void)comm; }
#endif
