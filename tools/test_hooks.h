/* The command's test hooks: the one place that reads RF_TEST_* variables (docs/architecture.md). */
#ifndef RF_TOOLS_TEST_HOOKS_H
#define RF_TOOLS_TEST_HOOKS_H

struct rf_comm;

/* In a build made with RF_TEST_HOOKS (the Makefile's build/rfsdp, which the tests run), applies
 * RF_TEST_DIE_IN_SAVE, RF_TEST_ASYNC_COPY_LATE and RF_TEST_START_PAUSE; otherwise (the
 * installed build/rfsdp-release) nothing: no variable is read. Collective over `comm` when
 * RF_TEST_START_PAUSE is set (the same environment on every rank). */
void rf_train_test_hooks(const struct rf_comm *comm);

#endif
