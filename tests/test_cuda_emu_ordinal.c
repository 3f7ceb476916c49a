/* rf-test: timeout=300
 * Which GPU each rank opens (issue 34: ordinal = local rank mod GPUs), on the CPU stand-in
 * (make BACKEND=cuda-emu, tests/gpu/emu, RF_EMU_DEVICES GPUs): tests/gpu/test_device_ordinal
 * at W = 2 and 3 with 1 and 2 emulated GPUs, where rank r must hold GPU r mod GPUs. */
#include <stdio.h>
#include <string.h>

#include "rf_cuda_emu.h"
#include "rf_test.h"

static char out[1 << 16];

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_ordinal") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_ordinal");
  static const char *envs[] = {"RF_EMU_DEVICES=1", "RF_EMU_DEVICES=2"};
  for (int w = 2; w <= 3; w++)
    for (int d = 0; d < 2; d++) {
      rc = rf_cuda_emu_run(out, sizeof out, envs[d], w, 60, "tests/gpu/test_device_ordinal");
      char want[64];
      snprintf(want, sizeof want, "W=%d, %d GPU(s)", w, d + 1);
      RF_CHECK(rc == 0 && strstr(out, want) && strstr(out, " 0 failed"), "%s W=%d: exit %d\n%s", envs[d], w,
               rc, out);
    }
  return rf_test_finish("test_cuda_emu_ordinal");
}
