/* The collective watchdog: a thread that ends the job when this rank has waited
 * longer than a limit inside one collective (a blocking collective, or
 * rf_comm_wait on a non-blocking one). comm.c marks every wait (enter/leave: two
 * atomic stores); the thread looks a few times per limit. A rank stopped
 * (SIGSTOP), stuck or dead leaves the others waiting; the first to pass the limit
 * prints what it waited in and aborts the job through rf_die's hook. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"

struct rf_comm_watchdog {
  _Atomic uint64_t since_ns;        /* start of the current wait; 0: not waiting */
  _Atomic(const char *) collective; /* static strings */
  _Atomic(const char *) label;      /* borrowed from the request's owner, or NULL */
  _Atomic(const char *) phase;      /* borrowed from rf_comm_watchdog_note, or NULL */
  _Atomic int64_t step;             /* -1: not noted */
  uint64_t limit_ns;                /* 0: off */
  int running;
  int stop;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
};

static struct rf_comm_watchdog rf_comm_watchdog_state = {
    .step = -1, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

void rf_comm_watch_enter(const char *collective, const char *label, uint64_t now_ns) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  atomic_store_explicit(&w->collective, collective, memory_order_relaxed);
  atomic_store_explicit(&w->label, label, memory_order_relaxed);
  atomic_store_explicit(&w->since_ns, now_ns ? now_ns : 1, memory_order_release);
}

void rf_comm_watch_leave(void) {
  atomic_store_explicit(&rf_comm_watchdog_state.since_ns, 0, memory_order_release);
}

void rf_comm_watchdog_note(int64_t step, const char *phase) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  atomic_store_explicit(&w->step, step, memory_order_relaxed);
  atomic_store_explicit(&w->phase, phase, memory_order_relaxed);
}

/* Dies when the current wait began more than the limit ago. */
static void rf_comm_watchdog_check(const struct rf_comm_watchdog *w) {
  uint64_t since = atomic_load_explicit(&w->since_ns, memory_order_acquire);
  if (since == 0) return;
  const char *collective = atomic_load_explicit(&w->collective, memory_order_relaxed);
  const char *label = atomic_load_explicit(&w->label, memory_order_relaxed);
  const char *phase = atomic_load_explicit(&w->phase, memory_order_relaxed);
  long long step = (long long)atomic_load_explicit(&w->step, memory_order_relaxed);
  /* still the same wait (not one that began while the labels were read) */
  if (atomic_load_explicit(&w->since_ns, memory_order_acquire) != since) return;
  uint64_t now = rf_time_ns();
  if (now < since || now - since <= w->limit_ns) return;
  char step_text[48];
  if (step >= 0)
    snprintf(step_text, sizeof step_text, "step %lld", step);
  else
    snprintf(step_text, sizeof step_text, "before the first step");
  char where[384];
  snprintf(where, sizeof where, "%s%s%s%s%s%s", label ? "unit '" : "", label ? label : "", label ? "', " : "",
           step_text, phase ? ", " : "", phase ? phase : "");
  RF_DIE(
      "collective watchdog: waited %.1f s in %s (%s), longer than the collective timeout of %g s: another "
      "rank "
      "is stopped, stuck or dead; ending the job",
      (double)(now - since) * 1e-9, collective, where, (double)w->limit_ns * 1e-9);
}

static void *rf_comm_watchdog_main(void *arg) {
  struct rf_comm_watchdog *w = arg;
  /* look 10 times per limit, at most every 0.5 s */
  uint64_t period = w->limit_ns / 10 < 500000000u ? w->limit_ns / 10 : 500000000u;
  pthread_mutex_lock(&w->lock);
  while (!w->stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t ns = (uint64_t)until.tv_nsec + period;
    until.tv_sec += (time_t)(ns / 1000000000u);
    until.tv_nsec = (long)(ns % 1000000000u);
    pthread_cond_timedwait(&w->wake, &w->lock, &until);
    if (!w->stop) rf_comm_watchdog_check(w);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

void rf_comm_watchdog_start(double seconds) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  RF_ASSERT(!w->running);
  RF_ASSERT(seconds >= 0 && seconds <= 1e9); /* finite: the options check it */
  if (seconds == 0) return;
  w->limit_ns = (uint64_t)(seconds * 1e9);
  w->stop = 0;
  int rc = pthread_create(&w->thread, NULL, rf_comm_watchdog_main, w);
  if (rc != 0) RF_DIE("cannot start the collective watchdog thread: %s", strerror(rc));
  w->running = 1;
}

void rf_comm_watchdog_stop(void) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  if (!w->running) return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  w->running = 0;
}
