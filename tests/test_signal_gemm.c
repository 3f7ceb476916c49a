/* rf-test: timeout=120
 * Preemption signals never land on a thread running a GEMM (src/run/signal.c):
 * oneDNN 2.6's generated GEMM kernels point rsp at a workspace on the heap, so a
 * signal handled on that thread writes its frame into the heap (the rare
 * "corrupted size vs. prev_size" at SIGTERM). After rf_run_catch_signals, this
 * process runs the tiny model's products (and their transposes) in a loop on the
 * main thread, with OpenMP threads, while a thread sends it SIGTERM thousands of
 * times (kill: a signal for the process, which the kernel gives any thread that
 * does not block it):
 *  - every signal was taken by the signal thread and none by the handler, so no
 *    frame was written on a training thread's stack (or onto the heap);
 *  - the signal was recorded (rf_run_signal_caught is SIGTERM);
 *  - every product equals, bit for bit, the same product computed before the
 *    signals (a frame written into a workspace would change it), and the heap
 *    stays consistent (glibc checks every chunk it touches in the
 *    allocation churn between the products).
 * A fork()ed child starts with the signals unblocked (gnuplot under --plot).
 * With the signals handled on the training threads (the mutation
 * signals-on-training-thread) the handler takes them: the first check fails, and
 * in about one run in three glibc aborts first. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "rf_test.h"
#include "run/run.h"

#ifdef _OPENMP
#include <omp.h>
#endif

enum { N_SHAPES = 4, ROUNDS = 3000 };

static atomic_int sending = 1;
static atomic_long sent;

static void *sender(void *arg) {
  (void)arg;
  while (atomic_load(&sending)) {
    kill(getpid(), SIGTERM);
    atomic_fetch_add(&sent, 1);
    usleep(20);
  }
  return NULL;
}

int main(void) {
  rf_run_catch_signals();
#ifdef _OPENMP
  omp_set_num_threads(2);
#endif
  /* the tiny model's products: head [48 x 32] x [32 x 256], its backward, the MLP */
  static const int shape[N_SHAPES][5] = {
      {48, 256, 32, 0, 1}, {48, 32, 256, 0, 0}, {32, 256, 48, 1, 0}, {48, 40, 32, 0, 1}};
  float *a[N_SHAPES], *b[N_SHAPES], *ref[N_SHAPES], *c[N_SHAPES];
  struct rf_gemm_desc d[N_SHAPES];
  uint64_t rng = 7;
  for (int s = 0; s < N_SHAPES; s++) {
    int m = shape[s][0], n = shape[s][1], k = shape[s][2], ta = shape[s][3], tb = shape[s][4];
    d[s] = (struct rf_gemm_desc){.m = m,
                                 .n = n,
                                 .k = k,
                                 .trans_a = ta,
                                 .trans_b = tb,
                                 .lda = ta ? m : k,
                                 .ldb = tb ? k : n,
                                 .ldc = n,
                                 .dtype = RF_DTYPE_F32,
                                 .alpha = 1,
                                 .beta = 0};
    a[s] = rf_xmalloc((size_t)m * k * sizeof(float));
    b[s] = rf_xmalloc((size_t)k * n * sizeof(float));
    ref[s] = rf_xmalloc((size_t)m * n * sizeof(float));
    c[s] = rf_xmalloc((size_t)m * n * sizeof(float));
    for (int i = 0; i < m * k; i++) a[s][i] = rf_test_rand_f32(&rng);
    for (int i = 0; i < k * n; i++) b[s][i] = rf_test_rand_f32(&rng);
    rf_gemm_run(&d[s], a[s], b[s], ref[s]);
  }

  pthread_t th;
  RF_ASSERT(pthread_create(&th, NULL, sender, NULL) == 0);
  int differ = 0;
  for (int r = 0; r < ROUNDS; r++) {
    for (int s = 0; s < N_SHAPES; s++) {
      rf_gemm_run(&d[s], a[s], b[s], c[s]);
      differ += memcmp(c[s], ref[s], (size_t)d[s].m * d[s].n * sizeof(float)) != 0;
    }
    void *churn[8]; /* glibc checks the chunks it splits and merges */
    for (int i = 0; i < 8; i++) churn[i] = rf_xmalloc((size_t)(16 << (i + r) % 12));
    for (int i = 0; i < 8; i++) free(churn[i]);
  }
  atomic_store(&sending, 0);
  pthread_join(th, NULL);
  int waited = 0, handled = 0;
  for (int i = 0; i < 200; i++) { /* the last signal may still be on its way to the signal thread */
    rf_run_signal_stats(&waited, &handled);
    if (waited > 0 || handled > 0) break;
    usleep(10000);
  }
  rf_run_signal_stats(&waited, &handled);
  RF_CHECK(handled == 0, "%d of %ld SIGTERMs were handled on a training thread (signal thread: %d)", handled,
           atomic_load(&sent), waited);
  RF_CHECK(waited > 0, "the signal thread took no signal of %ld", atomic_load(&sent));
  RF_CHECK(rf_run_signal_caught() == SIGTERM, "caught %d, expected SIGTERM", rf_run_signal_caught());
  RF_CHECK(differ == 0, "%d products differ from the same products before the signals", differ);

  /* a fork()ed child has the signals unblocked again */
  pid_t pid = fork();
  RF_ASSERT(pid >= 0);
  if (pid == 0) {
    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, NULL, &mask);
    _exit(sigismember(&mask, SIGTERM) || sigismember(&mask, SIGINT) ? 1 : 0);
  }
  int status = 0;
  RF_ASSERT(waitpid(pid, &status, 0) == pid);
  RF_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "a forked child starts with SIGTERM blocked");
  printf(
      "%ld SIGTERMs during %d rounds of %d products: %d taken by the signal thread, %d by a handler; "
      "products equal\n",
      atomic_load(&sent), ROUNDS, N_SHAPES, waited, handled);
  for (int s = 0; s < N_SHAPES; s++) {
    free(a[s]);
    free(b[s]);
    free(ref[s]);
    free(c[s]);
  }
  return rf_test_finish("test_signal_gemm");
}
