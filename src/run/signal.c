/* Preemption: SIGTERM and SIGINT only record the signal; the ranks agree on it at
 * a step boundary (rf_run_stop_signal), so every rank stops after the same step. */
#include <signal.h>
#include <string.h>

#include "run/run.h"

static volatile sig_atomic_t rf_run_caught;

static void rf_run_on_signal(int sig) {
  if (rf_run_caught == 0 || sig == SIGTERM) rf_run_caught = sig; /* SIGTERM wins: the launcher's stop */
}

void rf_run_catch_signals(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = rf_run_on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

int rf_run_stop_signal(const struct rf_fsdp *f) { return -rf_run_agree(f, -(int)rf_run_caught); }
