/* The one internal door for test hooks (as SQLite's sqlite3_test_control): setters that
 * plant a fault in the library for a test, declared here and not in include/ (this header
 * is not installed). The library never reads the environment for them: only the command's
 * tools/test_hooks.c does, in a build made with RF_TEST_HOOKS (the Makefile's build/rfsdp;
 * the installed build/rfsdp-release reads no RF_TEST_* variable; docs/architecture.md). */
#ifndef RF_RUN_TEST_CONTROL_H
#define RF_RUN_TEST_CONTROL_H

#include <stdint.h>

/* From now on, the last rank of the shard group exits abruptly (status 137) inside
 * the save of step `step`, after writing its rank files and before anyone writes
 * the COMPLETE marker: a crash in the middle of a checkpoint. -1 (the default):
 * never. The test build's `rfsdp train` sets it from RF_TEST_DIE_IN_SAVE. (save.c) */
void rf_run_test_die_in_save(int64_t step);
/* From now on (1), an asynchronous save's thread copies the state into staging only
 * once the next optimizer step has reached its fence (or the save is awaited): the
 * latest a snapshot can be taken, so that step must wait for the copy (a snapshot
 * taken after it began would hold its changes; rf_run_async_stats counts both). 0
 * (the default): at once. The test build's `rfsdp train` sets it from
 * RF_TEST_ASYNC_COPY_LATE=1. (async.c) */
void rf_run_test_late_async_copy(int late);

#endif
