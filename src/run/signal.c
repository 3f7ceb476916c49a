/* Preemption: SIGTERM and SIGINT only record the signal; the ranks agree on it at
 * a step boundary (rf_run_stop_signal), so every rank stops after the same step.
 *
 * The signals are taken by a thread of their own (sigwait), never by a handler
 * on a training thread: oneDNN 2.6's generated GEMM kernels (jit_avx_gemm_f32,
 * jit_avx512_common_gemm_f32) point the stack pointer at a workspace on the heap
 * while they run, so the kernel writes a signal frame (about 3 KB: the context
 * and the xsave area) into the heap below it when a signal is handled on that
 * thread. That was the "corrupted size vs. prev_size" seen at SIGTERM (1 in
 * 40-200 runs of W = 2: docs/reliability.md; the frame's FP_XSTATE_MAGIC1 and its
 * saved rsp, an address of the heap, were found in a core; oneDNN issue 4845,
 * fixed in oneDNN 3.11). rf_run_catch_signals blocks the signals in the calling
 * thread, so every thread started after it (OpenMP's, MPI's, the watchdog, the
 * async writer) has them blocked too, and starts the thread that waits for them.
 * A handler that only records stays installed for threads started before the
 * call (a program that calls it late); rf_run_signal_stats counts its uses.
 *
 * The launcher gone: a rank started by mpirun notes its parent (MPICH's
 * hydra_pmi_proxy, or Open MPI's launcher) and, under hydra, the proxy's parent
 * (mpiexec, or the remote shell that started the proxy). When one of them is gone
 * (the rank or the proxy has another parent: mpirun was killed with SIGKILL, its
 * host's session closed), nobody supervises the job any more, and a relaunch will
 * resume from the checkpoint folder the ranks are writing into: each rank reads
 * it as SIGHUP at the next step boundary, so the job stops there and saves, as at
 * a preemption (exit 129). */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "run/run.h"

static volatile sig_atomic_t rf_run_caught;
static pid_t rf_run_parent;          /* the rank's parent at the start (0: not under a launcher) */
static pid_t rf_run_launcher;        /* the parent's parent under MPICH's hydra, else 0 */
static atomic_int rf_run_handled;    /* signals taken by the fallback handler (a training thread) */
static atomic_int rf_run_waited;     /* signals taken by the signal thread */
static atomic_int rf_run_started;    /* the signal thread runs */
static atomic_int rf_run_exit_early; /* 1: a signal ends the process at once (rf_run_signals_exit_early) */

static void rf_run_record(int sig) {
  if (rf_run_caught == 0 || sig == SIGTERM) rf_run_caught = sig; /* SIGTERM wins: the launcher's stop */
}

static void rf_run_on_signal(int sig) {
  rf_run_record(sig);
  atomic_fetch_add(&rf_run_handled, 1);
}

static void rf_run_stop_set(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
}

static void *rf_run_signal_main(void *arg) {
  (void)arg;
  sigset_t set;
  rf_run_stop_set(&set);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (atomic_load(&rf_run_exit_early)) {
      static const char text[] = "rfsdp: stopped by a signal while MPI was starting: nothing trained\n";
      (void)!write(STDERR_FILENO, text, sizeof text - 1);
      _exit(128 + sig);
    }
    rf_run_record(sig);
    atomic_fetch_add(&rf_run_waited, 1);
  }
  return NULL;
}

/* A child made by fork (gnuplot) starts with the signals unblocked, as a program does. */
static void rf_run_child_unblock(void) {
  sigset_t set;
  rf_run_stop_set(&set);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

/* The parent of process `pid` (/proc/PID/stat), or 0 when it cannot be read. */
static pid_t rf_run_parent_of(pid_t pid) {
  char path[64], text[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  const char *p = strrchr(text, ')'); /* the name may hold spaces and parentheses */
  int ppid = 0;
  return p && sscanf(p + 1, " %*c %d", &ppid) == 1 ? (pid_t)ppid : 0;
}

/* 1 when process `pid`'s name (/proc/PID/comm) is `name`. */
static int rf_run_named(pid_t pid, const char *name) {
  char path[64], text[64] = "";
  snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int ok = fgets(text, sizeof text, f) != NULL;
  fclose(f);
  text[strcspn(text, "\n")] = '\0';
  return ok && strcmp(text, name) == 0;
}

static void rf_run_watch_launcher(void) {
  if (!getenv("PMI_RANK") && !getenv("PMI_FD") && !getenv("OMPI_COMM_WORLD_RANK")) return;
  rf_run_parent = getppid();
  rf_run_launcher = rf_run_named(rf_run_parent, "hydra_pmi_proxy") ? rf_run_parent_of(rf_run_parent) : 0;
}

int rf_run_launcher_gone(void) {
  if (rf_run_parent == 0) return 0;
  if (getppid() != rf_run_parent) return 1;
  return rf_run_launcher > 1 && rf_run_parent_of(rf_run_parent) != rf_run_launcher;
}

void rf_run_catch_signals(void) {
  rf_run_watch_launcher();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = rf_run_on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  if (atomic_exchange(&rf_run_started, 1)) return;
  sigset_t set;
  rf_run_stop_set(&set);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* this thread and every thread it starts from now on */
  pthread_atfork(NULL, NULL, rf_run_child_unblock);
  pthread_attr_t attr;
  pthread_t thread;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&thread, &attr, rf_run_signal_main, NULL) != 0) {
    pthread_sigmask(SIG_UNBLOCK, &set, NULL); /* no thread: the handler takes them here */
    atomic_store(&rf_run_started, 0);
  }
  pthread_attr_destroy(&attr);
}

void rf_run_signals_exit_early(int on) { atomic_store(&rf_run_exit_early, on != 0); }

int rf_run_signal_caught(void) { return (int)rf_run_caught; }

void rf_run_signal_stats(int *waited, int *handled) {
  *waited = atomic_load(&rf_run_waited);
  *handled = atomic_load(&rf_run_handled);
}

int rf_run_stop_signal(const struct rf_fsdp *f) {
  int mine = rf_run_caught ? (int)rf_run_caught : rf_run_launcher_gone() ? SIGHUP : 0;
  return -rf_run_agree(f, -mine); /* SIGTERM (15) > SIGINT (2) > SIGHUP (1) */
}
