/* Building and running the CUDA build's programs on the CPU stand-in (rf_cuda_emu.h). */
#include "rf_cuda_emu.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
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

/* A run's losses and norms (steps of each, else a failed check). */
static void rf_cuda_emu_read_log(const char *log, double *loss, double *norm, int steps) {
  int n = rf_cli_log_field(log, "\"loss\":", loss, steps);
  int m = rf_cli_log_field(log, "\"grad_norm\":", norm, steps);
  RF_CHECK(n == steps && m == steps, "%s: %d losses and %d norms (want %d)", log, n, m, steps);
}

int rf_cuda_emu_same_run(const char *dir, const char *data, const char *model, int steps, const char *env,
                         int world, const char *shape, const char *args, double loss_tol, double norm_tol,
                         char *gpu_log, int gpu_log_size) {
  static char out[1 << 18];
  static int runs;
  enum { MAX_STEPS = 64 };
  RF_ASSERT(steps > 0 && steps <= MAX_STEPS);
  char ref_log[320], cmd[1024];
  snprintf(ref_log, sizeof ref_log, "%s/cpu-%d-%d.jsonl", dir, world, runs);
  snprintf(gpu_log, (size_t)gpu_log_size, "%s/cuda-%d-%d.jsonl", dir, world, runs++);
  int rc = rf_cli_run_mpi(out, sizeof out, world, 120,
                          "train --device cpu --model %s --data %s --steps %d %s %s --log %s", model, data,
                          steps, shape, args, ref_log);
  RF_CHECK(rc == 0, "cpu %s W=%d %s %s: exit %d\n%s", model, world, shape, args, rc, out);
  if (rc != 0) return -1;
  snprintf(cmd, sizeof cmd, "rfsdp train --device cuda --model %s --data %s --steps %d %s %s --log %s", model,
           data, steps, shape, args, gpu_log);
  rc = rf_cuda_emu_run(out, sizeof out, env, world, 300, cmd);
  RF_CHECK(rc == 0, "cuda %s W=%d %s %s %s: exit %d\n%s", model, world, env, shape, args, rc, out);
  if (rc != 0) return -1;
  double loss[MAX_STEPS], norm[MAX_STEPS], ref_loss[MAX_STEPS], ref_norm[MAX_STEPS];
  rf_cuda_emu_read_log(ref_log, ref_loss, ref_norm, steps);
  rf_cuda_emu_read_log(gpu_log, loss, norm, steps);
  double wl = rf_cli_worst_relative(loss, ref_loss, steps), wn = rf_cli_worst_relative(norm, ref_norm, steps);
  printf(
      "--device cuda %s W=%d %s%s%s %s: losses within %.2g of --device cpu (tolerance %.0e), norms within "
      "%.2g (%.0e)\n",
      model, world, env, env[0] ? " " : "", shape, args, wl, loss_tol, wn, norm_tol);
  RF_CHECK(wl <= loss_tol && wn <= norm_tol, "cuda %s W=%d %s %s: losses %.3g, norms %.3g from the cpu run",
           model, world, shape, args, wl, wn);
  return 0;
}
