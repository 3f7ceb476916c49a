/* rf-test: timeout=900
 * The CUDA build's runtime side on the CPU stand-in (make BACKEND=cuda-emu; tests/gpu/emu,
 * docs/gpu.md): the stand-in's own test (each strict rule broken on purpose must be refused
 * or stop the program: a host read of device memory, a copy against its direction, a kernel
 * past its allocation or on a host pointer, a diverged barrier, misaligned cuBLASLt operands,
 * NCCL's in-place rules; and the legacy stream's order, events and shuffles must hold), then
 * the GPU tests of the cuBLASLt GEMM and of the NCCL comm table: test_comm_nccl at W = 1, 2
 * (two GPUs: rank 1's threads must choose GPU 1) and 3, with RF_NCCL_ONE_LANE=1, and with
 * a broken link (RF_EMU_NCCL_FAIL: the 7th NCCL operation never finishes), where every rank
 * must stop naming NCCL's error instead of hanging. Each program's time is printed. */
#include <stdio.h>
#include <string.h>

#include "rf_cuda_emu.h"
#include "rf_test.h"

static char out[1 << 20];

static void passes(const char *env, int world, const char *program, const char *name) {
  char command[128];
  snprintf(command, sizeof command, "tests/gpu/%s", program);
  int rc = rf_cuda_emu_run(out, sizeof out, env, world, 300, command);
  char summary[128];
  snprintf(summary, sizeof summary, "%s: ", name);
  RF_CHECK(rc == 0 && strstr(out, summary) && strstr(out, " 0 failed"),
           "%s %s (W=%d) on the stand-in: exit %d\n%s", env, program, world, rc, out);
  if (rc != 0) printf("%s", out);
}

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu");
  passes("", 1, "emu_selftest", "emu_selftest");
  passes("", 0, "test_gemm_cuda", "test_gemm_cuda");
  passes("", 1, "test_comm_nccl", "test_comm_nccl");
  passes("RF_EMU_DEVICES=2", 2, "test_comm_nccl", "test_comm_nccl");
  passes("", 3, "test_comm_nccl", "test_comm_nccl");
  passes("RF_NCCL_ONE_LANE=1", 2, "test_comm_nccl", "test_comm_nccl");
  /* a broken link: stops every rank naming NCCL's error (124 would be the hang) */
  rc = rf_cuda_emu_run(out, sizeof out, "RF_EMU_NCCL_FAIL=7", 2, 120, "tests/gpu/test_comm_nccl");
  RF_CHECK(rc != 0 && rc != 124 && strstr(out, "lane's communicator (rank") &&
               strstr(out, "failed: unhandled system error") && strstr(out, "every lane of it aborted"),
           "a failed NCCL operation stops the job naming it: exit %d\n%s", rc, out);
  return rf_test_finish("test_cuda_emu");
}
