/* The collective watchdog: a thread that ends the job when this rank has waited
 * longer than a limit inside one collective (a blocking collective, or
 * rf_comm_wait on a non-blocking one). comm.c marks every wait (enter/leave: two
 * atomic stores); the thread looks a few times per limit. A rank stopped
 * (SIGSTOP), stuck or dead leaves the others waiting; the first to pass the limit
 * prints what it waited in and aborts the job through rf_die's hook.
 *
 * Across hosts (rf_comm_watchdog_hosts): every rank listens on a TCP port it never
 * accepts on (the kernel answers a connect by itself); at the limit the rank tries
 * one connect to each other host's first rank, all at once, for at most 1 s, and
 * the message names the hosts that did not answer (their link or the host is down)
 * or the ranks that refused (their host is up, the rank's process is gone). A rank
 * of world rank r passes the limit min(r, 3) s later than rank 0, so that one
 * message, normally rank 0's, ends the job. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"

/* The other hosts of the job, for the probe at the limit (set once before the
 * thread starts; owned by the watchdog). */
struct rf_comm_watch_peer {
  char host[RF_COMM_HOST_NAME];
  int rank; /* its first rank */
  struct sockaddr_storage addr;
  socklen_t addr_len;
};

struct rf_comm_watchdog {
  _Atomic uint64_t since_ns;        /* start of the current wait; 0: not waiting */
  _Atomic(const char *) collective; /* static strings */
  _Atomic(const char *) label;      /* borrowed from the request's owner, or NULL */
  _Atomic(const char *) phase;      /* borrowed from rf_comm_watchdog_note, or NULL */
  _Atomic int64_t step;             /* -1: not noted */
  uint64_t limit_ns;                /* 0: off */
  uint64_t delay_ns;                /* this rank's extra wait: min(world rank, 3) s */
  char host[RF_COMM_HOST_NAME];     /* this rank's host ("" when not told) */
  int listen_fd;                    /* -1: none */
  struct rf_comm_watch_peer *peers; /* the other hosts (at most RF_COMM_WATCH_PEERS) */
  int n_peers;
  int running;
  int stop;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
};

static struct rf_comm_watchdog rf_comm_watchdog_state = {
    .step = -1, .listen_fd = -1, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

enum { RF_COMM_WATCH_PEERS = 256 };

int rf_comm_watchdog_listen(uint16_t *port) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  *port = 0;
  if (w->listen_fd < 0) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int v6 = fd >= 0;
    if (fd < 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct sockaddr_storage a;
    memset(&a, 0, sizeof a);
    socklen_t len;
    if (v6) {
      int off = 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
      ((struct sockaddr_in6 *)&a)->sin6_family = AF_INET6;
      len = sizeof(struct sockaddr_in6);
    } else {
      ((struct sockaddr_in *)&a)->sin_family = AF_INET;
      len = sizeof(struct sockaddr_in);
    }
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 64) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
      close(fd);
      return -1;
    }
    w->listen_fd = fd;
  }
  struct sockaddr_storage a;
  memset(&a, 0, sizeof a);
  socklen_t len = sizeof a;
  if (getsockname(w->listen_fd, (struct sockaddr *)&a, &len) != 0) return -1;
  *port = ntohs(a.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port
                                        : ((struct sockaddr_in *)&a)->sin_port);
  return 0;
}

void rf_comm_watchdog_set_hosts(const char *self, int world_rank, int n, const char *const *hosts,
                                const int *ranks, const uint16_t *ports) {
  struct rf_comm_watchdog *w = &rf_comm_watchdog_state;
  RF_ASSERT(!w->running);
  snprintf(w->host, sizeof w->host, "%s", self);
  w->delay_ns = (uint64_t)(world_rank < 3 ? world_rank : 3) * 1000000000u;
  free(w->peers);
  w->n_peers = n < RF_COMM_WATCH_PEERS ? n : RF_COMM_WATCH_PEERS;
  w->peers = rf_xcalloc(w->n_peers > 0 ? (size_t)w->n_peers : 1, sizeof *w->peers);
  for (int i = 0; i < w->n_peers; i++) {
    struct rf_comm_watch_peer *p = &w->peers[i];
    snprintf(p->host, sizeof p->host, "%s", hosts[i]);
    p->rank = ranks[i];
    /* resolved now, never at the limit (a name service may hang with the network) */
    struct addrinfo hint, *res = NULL;
    memset(&hint, 0, sizeof hint);
    hint.ai_socktype = SOCK_STREAM;
    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)ports[i]);
    if (ports[i] != 0 && getaddrinfo(hosts[i], port, &hint, &res) == 0 && res &&
        res->ai_addrlen <= sizeof p->addr) {
      memcpy(&p->addr, res->ai_addr, res->ai_addrlen);
      p->addr_len = res->ai_addrlen;
    }
    if (res) freeaddrinfo(res);
  }
}

/* Tries one connect to every other host's listener at once, for at most 1 s;
 * appends to `text` what did not answer ("" when every host answered). */
static void rf_comm_watchdog_probe(const struct rf_comm_watchdog *w, char *text, size_t size) {
  text[0] = '\0';
  int n = w->n_peers;
  if (n == 0) return;
  struct pollfd *fds = rf_xcalloc((size_t)n, sizeof *fds);
  int *state = rf_xcalloc((size_t)n, sizeof *state); /* 0 pending, 1 answered, 2 refused, 3 unreachable */
  for (int i = 0; i < n; i++) {
    fds[i].fd = -1;
    const struct rf_comm_watch_peer *p = &w->peers[i];
    if (p->addr_len == 0) {
      state[i] = 1; /* no address: cannot probe, say nothing of it */
      continue;
    }
    int fd = socket(p->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      state[i] = 1; /* cannot probe: say nothing of it */
      continue;
    }
    if (connect(fd, (const struct sockaddr *)&p->addr, p->addr_len) == 0) {
      state[i] = 1;
      close(fd);
    } else if (errno == EINPROGRESS) {
      fds[i].fd = fd;
      fds[i].events = POLLOUT;
    } else {
      state[i] = errno == ECONNREFUSED ? 2 : 3;
      close(fd);
    }
  }
  uint64_t until = rf_time_ns() + 1000000000u;
  for (;;) {
    int pending = 0;
    for (int i = 0; i < n; i++) pending += fds[i].fd >= 0;
    uint64_t now = rf_time_ns();
    if (pending == 0 || now >= until) break;
    if (poll(fds, (nfds_t)n, (int)((until - now) / 1000000u) + 1) < 0 && errno != EINTR) break;
    for (int i = 0; i < n; i++) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      state[i] = err == 0 ? 1 : err == ECONNREFUSED ? 2 : 3;
      close(fds[i].fd);
      fds[i].fd = -1;
    }
  }
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    if (fds[i].fd >= 0) {
      close(fds[i].fd);
      state[i] = 3;
    }
    if (state[i] < 2 || used + 1 >= size) continue;
    int k = state[i] == 3 ? snprintf(text + used, size - used,
                                     "; host %s did not answer within 1 s (its link or the host is down)",
                                     w->peers[i].host)
                          : snprintf(text + used, size - used, "; host %s answers but its rank %d is gone",
                                     w->peers[i].host, w->peers[i].rank);
    used = k > 0 && (size_t)k < size - used ? used + (size_t)k : size - 1;
  }
  free(fds);
  free(state);
}

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
  if (now < since || now - since <= w->limit_ns + w->delay_ns) return;
  char step_text[48];
  if (step >= 0)
    snprintf(step_text, sizeof step_text, "step %lld", step);
  else
    snprintf(step_text, sizeof step_text, "before the first step");
  char where[384];
  snprintf(where, sizeof where, "%s%s%s%s%s%s", label ? "unit '" : "", label ? label : "", label ? "', " : "",
           step_text, phase ? ", " : "", phase ? phase : "");
  char lost[1024], on[RF_COMM_HOST_NAME + 16] = "";
  rf_comm_watchdog_probe(w, lost, sizeof lost);
  if (w->host[0]) snprintf(on, sizeof on, " on host %s", w->host);
  RF_DIE(
      "collective watchdog: waited %.1f s in %s (%s)%s, longer than the collective timeout of %g s%s; ending "
      "the job",
      (double)(now - since) * 1e-9, collective, where, on, (double)w->limit_ns * 1e-9,
      lost[0] ? lost : ": another rank is stopped, stuck or dead");
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
  if (w->listen_fd >= 0) close(w->listen_fd);
  w->listen_fd = -1;
  free(w->peers);
  w->peers = NULL;
  w->n_peers = 0;
}
