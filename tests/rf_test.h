/* A small test harness. Each test binary counts failed checks and exits non-zero
 * if any failed; the runner (scripts/run-tests) gives each binary a time limit.
 * Multi-rank tests call rf_test_mpi_init() and every rank checks its own part. */
#ifndef RF_TEST_H
#define RF_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

extern int rf_test_failures;
extern long rf_test_checks;

/* Records a failure with file and line; prints at most the first 20. */
void rf_test_fail_at(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define RF_CHECK(cond, ...)                                        \
  do {                                                             \
    rf_test_checks++;                                              \
    if (!(cond)) rf_test_fail_at(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

/* 1 when |a - b| <= atol + rtol * |b| and both are finite (a NaN or an infinity is never close). */
int rf_test_close(double a, double b, double rtol, double atol);

#define RF_CHECK_CLOSE(a, b, rtol, atol, ...)                                                             \
  do {                                                                                                    \
    double rf_a_ = (double)(a), rf_b_ = (double)(b);                                                      \
    rf_test_checks++;                                                                                     \
    if (!rf_test_close(rf_a_, rf_b_, (rtol), (atol)))                                                     \
      rf_test_fail_at(__FILE__, __LINE__, "%s = %.9g, expected %.9g: " __VA_ARGS__ "", #a, rf_a_, rf_b_); \
  } while (0)

/* Comparisons that cannot miss a NaN or an infinity: each returns +infinity as soon as any
 * value it reads (in a or in b) is NaN or infinite, so `result <= tol` fails and so does any
 * running maximum kept with rf_test_max (fmax drops a NaN; these never do). */

/* The largest relative difference |a[i]-b[i]| / max(|b[i]|, floor) over n floats. */
double rf_test_max_rel_diff(const float *a, const float *b, size_t n, double floor);
/* The largest absolute difference |a[i]-b[i]| over n floats. */
double rf_test_max_abs_diff(const float *a, const float *b, size_t n);
/* The largest |a[i]| over n floats. */
double rf_test_max_abs(const float *a, size_t n);
/* max(worst, x) for a running maximum; +infinity when either is NaN or infinite. */
double rf_test_max(double worst, double x);

/* 1 when both files can be read and hold the same bytes. */
int rf_test_files_equal(const char *a, const char *b);

/* MPI: init with the runtime's threading level, set MPI_ERRORS_RETURN; returns rank. */
int rf_test_mpi_init(int *argc, char ***argv, int *world);

/* Records that a part of the test cannot run here, and why (no /dev/shm, no gdb):
 * the rest runs and counts; rf_test_finish ends with "not run in part: WHY" and
 * scripts/run-tests lists the test among those not run. A test that cannot run at
 * all exits 77 instead. */
void rf_test_not_run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints a summary line and returns the exit code: 0 when nothing failed. In a
 * multi-rank test, the failures of all ranks are summed and MPI is finalized. */
int rf_test_finish(const char *name);

/* Deterministic pseudo-random numbers for test data (splitmix64). */
uint64_t rf_test_rand_u64(uint64_t *state);
/* Uniform in [-1, 1). */
float rf_test_rand_f32(uint64_t *state);
/* Floats drawn from `state`, uniform in [-scale, scale); rf_xmalloc'd (the caller frees). */
float *rf_test_rand_buf(uint64_t *state, size_t n, float scale);
/* sum a[i] * b[i], accumulated in double. */
double rf_test_dot(const float *a, const float *b, size_t n);

/* Finite differences (tests/test_model_ops.c, test_model_gpt_oss.c, test_model_moe.c): for an op
 * out = f(inputs) and a fixed random R, the objective is J = sum(out * R) (rf_test_dot); the
 * backward called with dout = R must give dJ/dinput. rf_test_fd_check moves each param[i] by
 * +-RF_TEST_FD_H (the ops are smooth, so the truncation error is O(h^2)), recomputes f and checks
 *   max_i |fd_i - analytic_i| / max_i |analytic_i| <= RF_TEST_FD_TOL   (f32 ops)
 * and that the analytic gradient is not zero; it prints one line per call. */
#define RF_TEST_FD_H 1e-2
#define RF_TEST_FD_TOL 2e-3
typedef double (*rf_test_objective)(void *ctx);
void rf_test_fd_check(const char *name, float *param, size_t n, const float *analytic, rf_test_objective f,
                      void *ctx);

/* world + 1 cut points of [0, numel) from `seed`: random, sorted, empty ranges allowed
 * (identical on every rank given the same seed). */
void rf_test_random_cuts(int64_t numel, int world, uint64_t seed, int64_t *cuts);

/* HSDP's replica all-reduces as src/sim/simulate.c models the runtime's schedule
 * (src/fsdp/schedule.c, two gradient slots): in the step's last micro-batch, the
 * unit whose all-reduce starts as the backward of unit v begins (its last
 * reduce-scatter finished then), or -1; the units left start in
 * rf_fsdp_grads_finish, highest first. tests/test_sim_overlap.c replays the
 * simulator against it, tests/test_fsdp_schedule.c the runtime. */
int rf_test_replica_start_at(int n_units, int v);

/* Declares n units "unit0".."unitN-1" of one matrix each (shapes[u], named as its
 * unit, normal init) on an rf_fsdp context and finalizes it; stops the test on an error. */
struct rf_fsdp;
void rf_test_add_matrix_units(struct rf_fsdp *f, int n, const int64_t (*shapes)[2]);

/* fopen or stop the test (abort: a broken test environment, not a failed check). */
FILE *rf_test_fopen(const char *path, const char *mode);

#endif
