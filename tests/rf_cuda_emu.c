/* Building and running the CUDA build's programs on the CPU stand-in (rf_cuda_emu.h). */
#include "rf_cuda_emu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rf_cli.h"
#include "rf_test.h"

int rf_cuda_emu_build(void) {
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  RF_CHECK(len > 0, "readlink /proc/self/exe");
  if (len <= 0) return 1;
  self[len] = 0;
  *strrchr(self, '/') = 0; /* BUILD/tests */
  *strrchr(self, '/') = 0; /* BUILD */
  const char *build = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
  if (strcmp(build, "build") != 0) {
    printf("skip: BACKEND=cuda-emu not run from %s: the default build (build/) runs it\n", build);
    return 77;
  }
  static char out[1 << 16];
  if (rf_cli_sh(out, sizeof out, "command -v g++") != 0) {
    printf("skip: BACKEND=cuda-emu needs g++ (the .cu files compile as C++)\n");
    return 77;
  }
  int rc = rf_cli_sh(out, sizeof out, "make --no-print-directory -j2 BACKEND=cuda-emu all");
  printf("make BACKEND=cuda-emu: exit %d in %.1f s\n%s", rc, rf_cli_last_seconds(), out);
  RF_CHECK(rc == 0, "make BACKEND=cuda-emu failed (exit %d)", rc);
  RF_CHECK(!strstr(out, "warning"), "make BACKEND=cuda-emu printed a warning");
  return rc == 0 ? 0 : 1;
}

int rf_cuda_emu_run(char *out, int out_size, const char *env, int world, int limit_s, const char *command) {
  char mpi[64] = "";
  if (world > 0) snprintf(mpi, sizeof mpi, "scripts/rfmpirun -np %d", world);
  int rc = rf_cli_sh(out, out_size, "env OMP_NUM_THREADS=1 %s timeout -k 5 %d %s build-cuda-emu/%s", env,
                     limit_s, mpi, command);
  printf("%s%s%s (W=%d): exit %d in %.1f s wall\n", env, env[0] ? " " : "", command, world, rc,
         rf_cli_last_seconds());
  return rc;
}
