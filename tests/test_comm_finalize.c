/* rf-test: timeout=90
 * The finalize guard (src/comm/finalize_guard.c) keeps a failing run's status: a job
 * whose ranks set exit status 3 (rf_comm_mpi_exit_status, as `rfsdp train` does
 * after a failure) and then hang in rf_comm_mpi_finalize (the testing hook: a spin
 * in user space before MPI_Finalize, as a rank stuck in UCX's endpoint close)
 * must end by the guard's hand (its message on stderr) with status 3, not 0, at
 * W = 1 and 2. This binary is both: run by scripts/run-tests it launches itself
 * under scripts/rfmpirun with --hang. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "rf_cli.h"
#include "rf_test.h"

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--hang") == 0) { /* a rank of the job */
    rf_comm_mpi_init(&argc, &argv);
    rf_comm_mpi_exit_status(3);
    rf_comm_mpi_test_hang_finalize();
    rf_comm_mpi_finalize();
    return 0; /* not reached: the guard leaves with status 3 */
  }
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  RF_ASSERT(n > 0);
  self[n] = '\0';
  static char out[1 << 16];
  for (int world = 1; world <= 2; world++) {
    int rc =
        rf_cli_sh(out, sizeof out, "timeout -k 5 60 scripts/rfmpirun -np %d %s --hang 2>&1", world, self);
    int guarded = 0;
    for (const char *p = strstr(out, "left with status 3"); p; p = strstr(p + 1, "left with status 3"))
      guarded++;
    RF_CHECK(
        rc == 3 && guarded == world,
        "W=%d: a run with status 3 whose finalize hangs exited %d (124: never ended), %d of %d ranks left "
        "through the guard with status 3:\n%s",
        world, rc, guarded, world, out);
    if (rc == 3)
      printf("W=%d: exit 3; the guard's word: %s", world,
             strstr(out, "comm: ") ? strstr(out, "comm: ") : "\n");
  }
  return rf_test_finish("test_comm_finalize");
}
