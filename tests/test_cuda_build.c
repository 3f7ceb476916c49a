/* rf-test: timeout=600
 * make BACKEND=cuda (docs/gpu.md) builds with no warning wherever nvcc is installed, so
 * that a compile error in the CUDA backend never lands: the library with the CUDA
 * objects in it, rfsdp and the GPU test programs in build-cuda/; the CPU build of this
 * test holds no CUDA object; without a GPU, a GPU program refuses naming the missing
 * device instead of running, and so does build-cuda/rfsdp train --device cuda (the CPU
 * build's refuses it as built without CUDA, checked with or without nvcc). Without nvcc the test exits 77,
 * which scripts/run-tests reports as SKIP (not run: the reason), never as passed. Incremental: ccache and
 * make rebuild only what changed (a cold build measured in docs/gpu.md). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rf_cli.h"
#include "rf_test.h"

static char out[1 << 16];

static int exists(const char *path) { return access(path, F_OK) == 0; }

int main(void) {
  /* the CPU build refuses --device cuda naming the option (no nvcc needed) */
  int rc = rf_cli_run(out, sizeof out, "train --device cuda --model m.json --data d");
  RF_CHECK(rc == 2 && strstr(out, "--device cuda: this rfsdp is built without CUDA"),
           "rfsdp train --device cuda on the CPU build: exit %d, %s", rc, out);
  const char *home = getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "/usr/local/cuda";
  char nvcc[512];
  snprintf(nvcc, sizeof nvcc, "%s/bin/nvcc", home);
  if (access(nvcc, X_OK) != 0) {
    printf("skip: BACKEND=cuda build not run: no nvcc at %s (set CUDA_HOME)\n", nvcc);
    return rf_test_failures ? rf_test_finish("test_cuda_build") : 77;
  }
  /* this test's own build (BUILD/tests/test_cuda_build) is the CPU one the CUDA build links */
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    printf("FAIL: readlink /proc/self/exe\n");
    return 1;
  }
  self[len] = 0;
  *strrchr(self, '/') = 0; /* BUILD/tests */
  *strrchr(self, '/') = 0; /* BUILD */
  const char *build = strrchr(self, '/') ? strrchr(self, '/') + 1 : self;
  if (strcmp(build, "build") != 0) {
    printf("skip: BACKEND=cuda build not run from %s: the default build (build/) checks it\n", build);
    return rf_test_failures ? rf_test_finish("test_cuda_build") : 77;
  }
  rc = rf_cli_sh(out, sizeof out, "make --no-print-directory -j2 BACKEND=cuda CUDA_HOME=%s all 2>&1", home);
  double seconds = rf_cli_last_seconds();
  printf("make BACKEND=cuda: exit %d in %.1f s\n%s\n", rc, seconds, out);
  RF_CHECK(rc == 0, "make BACKEND=cuda failed (exit %d)", rc);
  RF_CHECK(!strstr(out, "warning"), "make BACKEND=cuda printed a warning");
  RF_CHECK(exists("build-cuda/rfsdp"), "build-cuda/rfsdp built");
  RF_CHECK(exists("build-cuda/tests/gpu/test_device_cuda"), "the GPU test program built");
  rc = rf_cli_sh(out, sizeof out, "ar t build-cuda/librfsdp.a");
  RF_CHECK(rc == 0 && strstr(out, "device_cuda_kernels.cu.o") && strstr(out, "device_cuda.o"),
           "the CUDA library holds the CUDA device and its kernels: %s", out);
  rc = rf_cli_sh(out, sizeof out, "ar t build/librfsdp.a | grep -c cuda");
  RF_CHECK(rc == 1 && strtol(out, NULL, 10) == 0, "the CPU build holds no CUDA object: %s", out);
  if (!exists("/dev/nvidia0")) {
    rc = rf_cli_sh(out, sizeof out, "build-cuda/tests/gpu/test_device_cuda");
    RF_CHECK(rc != 0 && strstr(out, "no CUDA device"),
             "without a GPU the GPU test refuses clearly: exit %d, %s", rc, out);
    rc = rf_cli_sh(out, sizeof out, "build-cuda/rfsdp train --device cuda --model m.json --data d 2>&1");
    RF_CHECK(rc == 2 && strstr(out, "--device cuda: no CUDA device"),
             "build-cuda/rfsdp train --device cuda without a GPU: exit %d, %s", rc, out);
  }
  return rf_test_finish("test_cuda_build");
}
