/* rf-test: timeout=900
 * The CUDA build's kernels on the CPU (issue 36 item 4): make BACKEND=cuda-emu compiles
 * src/model/kernels_cuda.cu (with attention_cuda.cu), src/optim/adamw_cuda.cu and
 * src/device/device_cuda_kernels.cu as C++ over tests/gpu/emu (a block's threads as fibers in a random order,
 * shared memory full of NaN at each block's start, launch limits enforced, device memory the host cannot
 * read; docs/gpu.md), and this runs the GPU tests of those kernels there: test_kernels_cuda at every shape it
 * has on a GPU (attention at T = 1000, the cross-entropy at vocabularies 32000, 32001, 128256 and 151936,
 * whose last 256-wide chunk is partial) against the host ops, and test_device_cuda (casts, FP8 tiles, the sum
 * of squares) against the host device, and test_attention_tc (the tensor-core attention of
 * src/model/attention_tc.cu on the stand-in's wmma, tests/gpu/emu/include/mma.h) against an f64 attention
 * within bf16 bounds. Each program's time is printed (docs/gpu.md states the measured cost). */
#include <stdio.h>
#include <string.h>

#include "rf_cuda_emu.h"
#include "rf_test.h"

static char out[1 << 20];

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_kernels") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_kernels");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 600, "tests/gpu/test_kernels_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_kernels_cuda: ") && strstr(out, " 0 failed"),
           "test_kernels_cuda on the stand-in: exit %d", rc);
  RF_CHECK(strstr(out, "cross-entropy lse 4 x 151936") && strstr(out, "T=1000"),
           "test_kernels_cuda ran the 151936 vocabulary and T = 1000");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 300, "tests/gpu/test_device_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, " 0 failed"), "test_device_cuda on the stand-in: exit %d", rc);
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 300, "tests/gpu/test_attention_tc");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_attention_tc: ") && strstr(out, " 0 failed") && strstr(out, "T=200"),
           "test_attention_tc on the stand-in: exit %d", rc);
  return rf_test_finish("test_cuda_emu_kernels");
}
