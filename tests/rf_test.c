/* The test harness behind rf_test.h. */
#include "rf_test.h"
#include "core/core.h"
#include "rfsdp.h"

#include <mpi.h>
#include <stdarg.h>
#include <stdlib.h>

int rf_test_failures;
long rf_test_checks;

void rf_test_fail_at(const char *file, int line, const char *fmt, ...) {
  rf_test_failures++;
  if (rf_test_failures > 20) return;
  int inited = 0, rank = -1;
  MPI_Initialized(&inited);
  if (inited) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank >= 0) fprintf(stderr, "[rank %d] ", rank);
  fprintf(stderr, "%s:%d: check failed: ", file, line);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static char rf_test_not_run_why[512]; /* the first part not run, "" when every part ran */

void rf_test_not_run(const char *fmt, ...) {
  if (rf_test_not_run_why[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rf_test_not_run_why, sizeof rf_test_not_run_why, fmt, ap);
  va_end(ap);
  printf("note: not run here: %s\n", rf_test_not_run_why);
}

int rf_test_close(double a, double b, double rtol, double atol) {
  return isfinite(a) && isfinite(b) && fabs(a - b) <= atol + rtol * fabs(b);
}

double rf_test_max(double worst, double x) {
  if (!isfinite(worst) || !isfinite(x)) return INFINITY;
  return x > worst ? x : worst;
}

double rf_test_max_rel_diff(const float *a, const float *b, size_t n, double floor) {
  double worst = 0.0;
  for (size_t i = 0; i < n; i++) {
    double s = fabs((double)b[i]);
    worst = rf_test_max(worst, fabs((double)a[i] - (double)b[i]) / (s > floor ? s : floor));
    if (!isfinite(worst)) break; /* no later finite value may replace it */
  }
  return worst;
}

double rf_test_max_abs_diff(const float *a, const float *b, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n && isfinite(worst); i++)
    worst = rf_test_max(worst, fabs((double)a[i] - (double)b[i]));
  return worst;
}

double rf_test_max_abs(const float *a, size_t n) {
  double worst = 0.0;
  for (size_t i = 0; i < n && isfinite(worst); i++) worst = rf_test_max(worst, fabs((double)a[i]));
  return worst;
}

int rf_test_mpi_init(int *argc, char ***argv, int *world) {
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, world);
  return rank;
}

int rf_test_finish(const char *name) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  long failures = rf_test_failures, checks = rf_test_checks;
  int rank = 0;
  if (inited && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &checks, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    MPI_Finalize();
  }
  if (rank == 0) printf("%s: %ld checks, %ld failed\n", name, checks, failures);
  if (checks == 0) {
    if (rank == 0) printf("%s: no checks ran\n", name);
    return 1;
  }
  if (rf_test_not_run_why[0]) printf("not run in part: %s\n", rf_test_not_run_why); /* run-tests lists it */
  return failures == 0 ? 0 : 1;
}

uint64_t rf_test_rand_u64(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float rf_test_rand_f32(uint64_t *state) {
  return (float)((double)(rf_test_rand_u64(state) >> 11) * 0x1p-53 * 2.0 - 1.0);
}

float *rf_test_rand_buf(uint64_t *state, size_t n, float scale) {
  float *p = rf_xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) p[i] = scale * rf_test_rand_f32(state);
  return p;
}

double rf_test_dot(const float *a, const float *b, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
  return s;
}

void rf_test_fd_check(const char *name, float *param, size_t n, const float *analytic, rf_test_objective f,
                      void *ctx) {
  double amax = rf_test_max_abs(analytic, n), emax = 0.0;
  for (size_t i = 0; i < n; i++) {
    float save = param[i];
    param[i] = save + (float)RF_TEST_FD_H;
    double fp = f(ctx);
    param[i] = save - (float)RF_TEST_FD_H;
    double fm = f(ctx);
    param[i] = save;
    double h2 = (double)(save + (float)RF_TEST_FD_H) - (double)(save - (float)RF_TEST_FD_H);
    emax = rf_test_max(emax, fabs((fp - fm) / h2 - (double)analytic[i]));
  }
  double rel = !isfinite(amax) ? INFINITY : amax > 0 ? emax / amax : emax;
  printf("  %-28s n=%-5zu max|grad| %.3g  rel err %.2g\n", name, n, amax, rel);
  RF_CHECK(amax > 1e-6, "%s: analytic gradient is zero", name);
  RF_CHECK(rel <= RF_TEST_FD_TOL, "%s: finite-difference rel err %.3g > %g", name, rel, RF_TEST_FD_TOL);
}

void rf_test_random_cuts(int64_t numel, int world, uint64_t seed, int64_t *cuts) {
  cuts[0] = 0;
  cuts[world] = numel;
  for (int r = 1; r < world; r++) cuts[r] = (int64_t)(rf_test_rand_u64(&seed) % (uint64_t)(numel + 1));
  for (int r = 1; r < world; r++)
    for (int s = r + 1; s < world; s++)
      if (cuts[s] < cuts[r]) {
        int64_t x = cuts[r];
        cuts[r] = cuts[s];
        cuts[s] = x;
      }
}

FILE *rf_test_fopen(const char *path, const char *mode) {
  FILE *f = fopen(path, mode);
  if (!f) {
    perror(path);
    abort();
  }
  return f;
}

int rf_test_files_equal(const char *a, const char *b) {
  char *x, *y;
  size_t nx, ny;
  if (rf_file_read_all(a, &x, &nx) != 0) return 0;
  if (rf_file_read_all(b, &y, &ny) != 0) {
    free(x);
    return 0;
  }
  int eq = nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return eq;
}

int rf_test_replica_start_at(int n_units, int v) { return v + 2 <= n_units - 1 ? v + 2 : -1; }

void rf_test_add_matrix_units(struct rf_fsdp *f, int n, const int64_t (*shapes)[2]) {
  for (int u = 0; u < n; u++) {
    char name[32];
    snprintf(name, sizeof name, "unit%d", u);
    RF_ASSERT(rf_fsdp_add_unit(f, name) == u);
    if (rf_fsdp_add_tensor(f, u, name, 2, shapes[u], 0, (struct rf_init){RF_INIT_NORMAL, 0.02f}) != u)
      RF_DIE("%s", rf_fsdp_error());
  }
  RF_ASSERT(rf_fsdp_finalize(f) == 0);
}
