/* rf-test: timeout=300
 * scripts/gpu-check and scripts/gpu-bundle on a machine without a GPU (docs/gpu.md):
 * gpu-check refuses with "no CUDA device" and exit 2, creating nothing (its output folder
 * stays absent); the bundle of build-cuda's programs is complete (every library any of its
 * files needs is in it or is one the GPU machine provides: glibc, CUDA, NCCL), and the
 * check that says so fails, naming the library, when one is taken out. The bundle part
 * needs the CUDA build: without nvcc the test exits 77 (not run) after the refusal checks. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rf_cli.h"
#include "rf_test.h"

static char out[1 << 16];

int main(void) {
  if (access("/dev/nvidia0", F_OK) != 0) {
    char dir[] = "/tmp/rf_gpu_check_XXXXXX";
    RF_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char target[300];
    snprintf(target, sizeof target, "%s/check", dir);
    int rc = rf_cli_sh(out, sizeof out, "scripts/gpu-check '%s'", target);
    RF_CHECK(rc == 2 && strstr(out, "no CUDA device"), "gpu-check without a GPU: exit %d, %s", rc, out);
    RF_CHECK(access(target, F_OK) != 0, "a refused gpu-check created %s", target);
    rmdir(dir);
  }
  const char *home = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
  char nvcc[512];
  snprintf(nvcc, sizeof nvcc, "%s/bin/nvcc", home);
  if (access(nvcc, X_OK) != 0) {
    int failed = rf_test_finish("test_gpu_check");
    if (failed) return failed;
    printf("skip: the GPU bundle not checked: no nvcc at %s to build build-cuda/\n", nvcc);
    return 77;
  }
  int rc =
      rf_cli_sh(out, sizeof out, "make --no-print-directory -j2 BACKEND=cuda CUDA_HOME=%s all 2>&1", home);
  RF_CHECK(rc == 0, "make BACKEND=cuda: exit %d, %s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "scripts/gpu-bundle --check");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "complete"), "the bundle is complete: exit %d, %s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "RF_GPU_BUNDLE_DROP=libmpich.so.12 scripts/gpu-bundle --check");
  RF_CHECK(rc == 1 && strstr(out, "missing libmpich.so.12 (needed by test_comm_nccl)"),
           "a bundle without MPICH's library is refused naming it: exit %d, %s", rc, out);
  return rf_test_finish("test_gpu_check");
}
