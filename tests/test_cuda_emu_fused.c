/* rf-test: timeout=300
 * The fused kernels of src/model/fused_cuda.cu and the MoE token movement of
 * src/model/moe_cuda.cu on the CPU stand-in (make BACKEND=cuda-emu,
 * tests/gpu/emu): tests/gpu/test_fused_cuda against the host ops (RMSNorm with the
 * residual add, RoPE of q and k, SwiGLU, the chunked bf16 cross-entropy at vocabularies
 * 151936, 1001, 4096 and 4097, FP8 of bf16 activations bit for bit, the gradient norm
 * and clip factor, AdamW over a shard with zero-length pieces and padding), tolerances
 * in units of bf16's roundoff stated there; then
 * tests/gpu/test_moe_cuda against a brute-force reference of moe.c's grouping, gather,
 * combine and backward (idle experts, a cap too small); then tests/gpu/test_optim_cuda:
 * 8-bit AdamW's kernel (src/optim/adamw8bit_cuda.cu) against the host optimizer, bit for bit
 * (cut tiles and runs, zero-length pieces, padding untouched). */
#include <stdio.h>
#include <string.h>

#include "rf_cuda_emu.h"
#include "rf_test.h"

static char out[1 << 18];

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_fused") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_fused");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 240, "tests/gpu/test_fused_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_fused_cuda: ") && strstr(out, " 0 failed"),
           "test_fused_cuda on the stand-in: exit %d", rc);
  RF_CHECK(strstr(out, "cross-entropy lse 4 x 151936") && strstr(out, "cross-entropy lse 5 x 1001") &&
               strstr(out, "adamw over the shard p (max_norm 0.5)"),
           "test_fused_cuda ran the 151936 and 1001 vocabularies and the clipped shard");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 120, "tests/gpu/test_moe_cuda");
  printf("%s", out);
  RF_CHECK(
      rc == 0 && strstr(out, "test_moe_cuda: ") && strstr(out, " 0 failed") && strstr(out, "cap too small"),
      "test_moe_cuda on the stand-in: exit %d", rc);
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 120, "tests/gpu/test_optim_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_optim_cuda: ") && strstr(out, " 0 failed") &&
               strstr(out, "adamw8bit v_scale"),
           "test_optim_cuda on the stand-in: exit %d", rc);
  return rf_test_finish("test_cuda_emu_fused");
}
