/* rf-test: timeout=600
 * scripts/gpu-check and scripts/gpu-bundle on a machine without a GPU (docs/gpu.md):
 * gpu-check refuses with "no CUDA device" and exit 2, creating nothing (its output folder
 * stays absent); its parts before the 1.1B rows have limits adding up to under 9 minutes and its budget is
 * under 9.5 (a device command gets 10), and a part the budget leaves no time for stops the run there; the
 * script runs end to end on the CPU stand-in (gpu-check --dry over make BACKEND=cuda-emu: the GPU tests, the
 * CPU reference, the training parts on the stand-in's GPU (--device cuda at W = 1 and 2, against the CPU run,
 * and the GPU's checkpoint resumed on CPUs: each must pass) and one summary whose benchmark table names the
 * one shape rfsdp and PyTorch both run, exit 0), and a part that hangs stops it there (exit 3, the later
 * parts not run, the summary printed); the bundle of build-cuda's programs is complete (every library any of
 * its files needs is in it or is one the GPU machine provides: glibc, CUDA, NCCL), and the check that says so
 * fails, naming the library, when one is taken out. The bundle part needs the CUDA build: without nvcc the
 * test exits 77 (not run) after the refusal checks. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rf_cli.h"
#include "rf_cuda_emu.h"
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
  int rc = rf_cli_sh(out, sizeof out, "scripts/gpu-check --limits");
  long total = 0, main_parts = 0, budget = 0;
  RF_CHECK(rc == 0 && sscanf(out, "%ld %ld %ld", &total, &main_parts, &budget) == 3 && main_parts > 0 &&
               main_parts < 540 && budget >= main_parts && budget < 570 && total >= budget,
           "gpu-check's limits: %s (the parts before the 1.1B rows under 540 s, the budget under 570 s)",
           out);
  if (rf_cuda_emu_build() == 0) { /* the dry run, on the stand-in */
    char dir[] = "/tmp/rf_gpu_dry_XXXXXX";
    RF_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    rc = rf_cli_sh(out, sizeof out, "scripts/gpu-check --dry --tar '%s/a.tar.gz' '%s/a'", dir, dir);
    printf("gpu-check --dry: exit %d in %.1f s\n%s", rc, rf_cli_last_seconds(), out);
    const char *sum = strstr(out, "== gpu-check summary: cuda-emu");
    RF_CHECK(rc == 0 && sum && strstr(sum, "ok    test_device_cuda") && strstr(sum, "ok    test_gemm_cuda") &&
                 strstr(sum, "ok    test_comm_nccl np=2") && strstr(sum, "ok    train_cpu_3_steps"),
             "gpu-check --dry: exit %d, the parts that run on the stand-in pass", rc);
    RF_CHECK(sum && strstr(sum, "benchmark, both at ") && strstr(sum, "tiny.json 4x32 tokens per step") &&
                 strstr(sum, "rfsdp --device cuda ") && strstr(sum, "PyTorch FSDP2 "),
             "gpu-check --dry: the benchmark table names its one shape, for rfsdp and for PyTorch");
    const char *parts[] = {
        "train_gpu_w1",     "train_gpu_w2_equal",    "train_gpu_w2_ragged",     "resume_gpu_ckpt_on_cpu_w2",
        "bench_rfsdp 4x32", "bench_rfsdp_bf16 4x32", "bench_rfsdp_1b_bf16 2x64"};
    for (int i = 0; sum && i < (int)(sizeof parts / sizeof *parts); i++) {
      char ok[64];
      snprintf(ok, sizeof ok, "ok    %s", parts[i]);
      RF_CHECK(strstr(sum, ok), "gpu-check --dry: %s passed on the stand-in\n%s", parts[i], sum);
    }
    /* the 1.1B rows: their table, and FP8 run or refused by name (until --fp8 block runs on cuda) */
    RF_CHECK(sum && strstr(sum, "the 1.1B rows, at ") && strstr(sum, "2x64 bf16 compute: ") &&
                 (strstr(sum, "ok    bench_rfsdp_1b_fp8 2x64") ||
                  (strstr(sum, "not run  bench_rfsdp_1b_fp8") && strstr(sum, "not on device cuda yet"))),
             "gpu-check --dry: the 1.1B rows\n%s", sum ? sum : out);
    /* --tar: what it printed and its logs in one archive, without the checkpoints and token files */
    int tar_rc = rf_cli_sh(out, sizeof out, "tar -tzf '%s/a.tar.gz'", dir);
    RF_CHECK(tar_rc == 0 && strstr(out, "a/gpu-check.txt") && strstr(out, "a/train_gpu_w1.log") &&
                 strstr(out, "a/gpu1.jsonl") && !strstr(out, "a/ckpt/") && !strstr(out, "data.train.tok"),
             "gpu-check --tar: the archive holds the summary and the logs, no checkpoint: exit %d\n%s",
             tar_rc, out);
    tar_rc = rf_cli_sh(out, sizeof out, "tar -xzOf '%s/a.tar.gz' a/gpu-check.txt", dir);
    RF_CHECK(
        tar_rc == 0 && strstr(out, "== gpu-check summary: cuda-emu") && strstr(out, "the 1.1B rows, at "),
        "gpu-check --tar: gpu-check.txt is what it printed: exit %d\n%.2000s", tar_rc, out);
    /* the budget: a part whose limit (120 s, and 5 s to kill it) would end past it does not start, and the
     * run stops there, with the summary */
    rc = rf_cli_sh(out, sizeof out, "RF_GPU_CHECK_BUDGET_S=124 scripts/gpu-check --dry '%s/c'", dir);
    sum = strstr(out, "== gpu-check summary:");
    RF_CHECK(rc == 0 && sum && strstr(sum, "not run  test_device_cuda") &&
                 strstr(sum, "s of the 124 s budget left, its limit is 120 s") &&
                 strstr(out, "stopped at test_device_cuda: the budget of 124 s") &&
                 !strstr(out, "test_gemm_cuda") && !strstr(out, "train_cpu_3_steps"),
             "the budget stops gpu-check before a part it has no time for: exit %d\n%s", rc, out);
    rc = rf_cli_sh(out, sizeof out,
                   "RF_GPU_CHECK_HANG=test_gemm_cuda RF_GPU_CHECK_HANG_S=2 scripts/gpu-check --dry '%s/b'",
                   dir);
    sum = strstr(out, "== gpu-check summary:");
    RF_CHECK(rc == 3 && sum && strstr(sum, "HANG  test_gemm_cuda") &&
                 strstr(out, "stopped at the first hang") && strstr(sum, "ok    test_device_cuda") &&
                 !strstr(out, "test_comm_nccl"),
             "a hanging part stops gpu-check there, with the summary: exit %d\n%s", rc, out);
    rf_cli_sh(out, sizeof out, "rm -rf '%s'", dir);
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
  rc = rf_cli_sh(out, sizeof out, "make --no-print-directory -j2 BACKEND=cuda CUDA_HOME=%s all 2>&1", home);
  RF_CHECK(rc == 0, "make BACKEND=cuda: exit %d, %s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "scripts/gpu-bundle --check");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "complete"), "the bundle is complete: exit %d, %s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "RF_GPU_BUNDLE_DROP=libmpich.so.12 scripts/gpu-bundle --check");
  RF_CHECK(rc == 1 && strstr(out, "missing libmpich.so.12 (needed by test_comm_nccl)"),
           "a bundle without MPICH's library is refused naming it: exit %d, %s", rc, out);
  return rf_test_finish("test_gpu_check");
}
