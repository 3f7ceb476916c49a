/* The launcher's finalize guard of src/comm's MPI backend (rf_comm_mpi_finalize): a rank
 * stuck in MPI_Finalize finishes the launcher's PMI protocol for itself and leaves with its
 * exit status. Moved out of comm_mpi.c unchanged; tests/test_comm_finalize.c. */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_mpi.h"

/* hydra's PMI socket to this rank (PMI_FD), -1 when none; see the finalize guard */
static int rf_comm_pmi_fd = -1;

void rf_comm_finalize_guard_init(void) {
  const char *pmi_fd = getenv("PMI_FD");
  char *end = NULL;
  long fd = pmi_fd ? strtol(pmi_fd, &end, 10) : -1;
  rf_comm_pmi_fd = pmi_fd && end != pmi_fd && *end == '\0' && fd >= 0 && fd < INT_MAX ? (int)fd : -1;
}

/* The finalize guard. MPICH 4.0 over UCX 1.13's TCP transport (ranks on
 * different hosts without RDMA, as under scripts/hosts) can hang in MPI_Finalize:
 * one rank spins in UCX's endpoint close (ucp_disconnect_nb, waiting for its
 * peers) while the others already wait in the launcher's barrier that follows it
 * (MPIR_pmi_barrier: a blocking read of the PMI socket), where nobody drives UCX
 * any more (a plain MPI program that all-reduces and finalizes hung in 3 of 15
 * runs on 2 hosts x 2 ranks; a barrier or an exchange between all pairs first did
 * not help). The rank's work is done by then (files closed, logs written), so a
 * rank still in UCX after RF_COMM_FINALIZE_GUARD_S seconds finishes the launcher's
 * protocol for itself: it stops its main thread, sends the barrier and the
 * finalize that MPICH would have sent on the PMI socket (PMI_FD, hydra's PMI-1
 * wire protocol) and leaves with its exit status (_exit). The others leave the
 * barrier; those on its host then wait for it in MPICH's shared-memory barrier,
 * and their guards send the finalize for them in turn.
 *
 * Leaving without the finalize is what the launcher cannot take: hydra's proxy
 * (MPICH 4.0.2, pmip_cb.c) reads a PMI socket that closes without it as a crash
 * and SIGKILLs the host's other ranks; when its event loop reaps one of those
 * (waitpid WNOHANG, pmip.c) while any of the host's output pipes is still open,
 * it records the raw status 9 and mpiexec ends with 255, "BAD TERMINATION ...
 * EXIT CODE: 9" (docs/multihost.md). So _exit without the finalize is only the
 * fallback: where there is no PMI_FD, or the launcher does not answer. */
enum { RF_COMM_FINALIZE_GUARD_S = 5, RF_COMM_PMI_WAIT_MS = 10000 };
static int rf_comm_exit_status;
static int rf_comm_finalized;
static pid_t rf_comm_main_tid;
static pthread_t rf_comm_main_thread;
static pthread_mutex_t rf_comm_finalize_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rf_comm_finalize_done = PTHREAD_COND_INITIALIZER;

void rf_comm_mpi_exit_status(int status) { rf_comm_exit_status = status; }

static int rf_comm_hang_finalize; /* rf_comm_mpi_test_hang_finalize */
void rf_comm_mpi_test_hang_finalize(void) { rf_comm_hang_finalize = 1; }

/* The system call the main thread is blocked in (SYS_read: MPICH's wait in the
 * launcher's barrier or finalize, a blocking read of the PMI socket), -1 when it
 * runs in user space (UCX's progress, MPICH's shared-memory spin) or this cannot
 * be read (Linux only). */
static long rf_comm_main_syscall(void) {
  char path[64], text[64] = "";
  snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)rf_comm_main_tid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int ok = fgets(text, sizeof text, f) != NULL;
  fclose(f);
  char *end = NULL;
  long nr = ok ? strtol(text, &end, 10) : -1;
  return ok && end != text && *end == ' ' ? nr : -1;
}

/* The main thread, stopped by the guard, stays here until the process ends. */
static void rf_comm_freeze(int sig) {
  (void)sig;
  for (;;) pause();
}

/* Writes all of text to fd; 0 on success. */
static int rf_comm_pmi_write(int fd, const char *text) {
  size_t n = strlen(text), done = 0;
  while (done < n) {
    ssize_t w = write(fd, text + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    done += (size_t)w;
  }
  return 0;
}

/* Sends one PMI-1 command and reads its one-line answer within
 * RF_COMM_PMI_WAIT_MS; 0 when the answer starts with `want`. */
static int rf_comm_pmi_call(int fd, const char *cmd, const char *want) {
  if (rf_comm_pmi_write(fd, cmd) != 0) return -1;
  char line[256];
  size_t n = 0;
  while (n + 1 < sizeof line) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int ready = poll(&p, 1, RF_COMM_PMI_WAIT_MS);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return -1;
    ssize_t r = read(fd, line + n, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    if (line[n++] == '\n') break;
  }
  line[n] = '\0';
  return strncmp(line, want, strlen(want)) == 0 ? 0 : -1;
}

/* Leaves the process now with its exit status, saying why on stderr (write(2):
 * the stopped main thread may hold stdio's locks). */
static void rf_comm_guard_leave(const char *why, int looks) {
  char text[320];
  int n = snprintf(text, sizeof text,
                   "[rank %d] comm: MPI_Finalize %s, %.1f s after it began; left with status %d\n",
                   rf_log_get_rank(), why, RF_COMM_FINALIZE_GUARD_S + 0.5 * (looks - 1), rf_comm_exit_status);
  if (n > 0) (void)!write(STDERR_FILENO, text, (size_t)n < sizeof text ? (size_t)n : sizeof text - 1);
  _exit(rf_comm_exit_status);
}

/* After the grace time, looks every half second at the main thread:
 *  - in read(2): waiting in the launcher's barrier (or finalize); the stuck rank's
 *    guard releases it. It leaves on its own only after RF_COMM_FINALIZE_GUARD_S
 *    + 15 s (2 s without PMI_FD, where nobody can release it), a fallback the
 *    launcher may report as a crash;
 *  - elsewhere twice in a row, never seen in read(2): stuck in UCX's endpoint
 *    close, before the launcher's barrier: the guard does the barrier and the
 *    finalize and leaves;
 *  - elsewhere twice in a row after having been seen in read(2): released from
 *    the launcher's barrier and now spinning in MPICH's shared-memory barrier of
 *    the host (MPIDU_Init_shm_finalize), which a rank of this host that left
 *    through its guard never joins: the guard does the finalize and leaves.
 * The main thread is stopped first (a signal whose handler never returns), so
 * that it cannot also talk on the PMI socket. */
static void *rf_comm_finalize_guard(void *arg) {
  (void)arg;
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += RF_COMM_FINALIZE_GUARD_S;
  int busy = 0, waited = 0, looks = 0, waiter_looks = rf_comm_pmi_fd >= 0 ? 30 : 6;
  pthread_mutex_lock(&rf_comm_finalize_lock);
  for (;;) {
    int rc = 0;
    while (!rf_comm_finalized && rc != ETIMEDOUT)
      rc = pthread_cond_timedwait(&rf_comm_finalize_done, &rf_comm_finalize_lock, &until);
    if (rf_comm_finalized) break;
    long nr = rf_comm_main_syscall();
    busy = nr == SYS_read ? 0 : busy + 1;
    waited |= nr == SYS_read;
    looks++;
    if (busy >= 2) {
      fflush(NULL);
      if (rf_comm_pmi_fd >= 0 && pthread_kill(rf_comm_main_thread, SIGRTMIN + 2) == 0 &&
          (waited || rf_comm_pmi_call(rf_comm_pmi_fd, "cmd=barrier_in\n", "cmd=barrier_out") == 0) &&
          rf_comm_pmi_call(rf_comm_pmi_fd, "cmd=finalize\n", "cmd=finalize_ack") == 0)
        rf_comm_guard_leave(
            waited ? "stuck after the launcher's barrier (in the host's shared-memory barrier): "
                     "the launcher's finalize done for it"
                   : "stuck in UCX's endpoint close: the launcher's barrier and finalize done for it",
            looks);
      rf_comm_guard_leave(
          waited ? "stuck after the launcher's barrier (no PMI_FD, or the launcher did not answer)"
                 : "stuck in UCX's endpoint close (no PMI_FD, or the launcher did not answer)",
          looks);
    }
    if (looks >= waiter_looks) {
      fflush(NULL);
      rf_comm_guard_leave("still waiting in the launcher's barrier", looks);
    }
    until.tv_nsec += 500000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec += 1;
      until.tv_nsec -= 1000000000L;
    }
  }
  pthread_mutex_unlock(&rf_comm_finalize_lock);
  return NULL;
}

void rf_comm_mpi_finalize(void) {
  fflush(NULL);
  rf_comm_main_thread = pthread_self();
  rf_comm_main_tid = (pid_t)syscall(SYS_gettid);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = rf_comm_freeze;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGRTMIN + 2, &sa, NULL);
  pthread_t guard;
  int guarded = pthread_create(&guard, NULL, rf_comm_finalize_guard, NULL) == 0;
  for (volatile uint64_t spin = 0; rf_comm_hang_finalize; spin++) continue; /* (the hook) */
  RF_MPI_CHECK(MPI_Finalize());
  if (guarded) {
    pthread_mutex_lock(&rf_comm_finalize_lock);
    rf_comm_finalized = 1;
    pthread_cond_signal(&rf_comm_finalize_done);
    pthread_mutex_unlock(&rf_comm_finalize_lock);
    pthread_join(guard, NULL);
  }
}
