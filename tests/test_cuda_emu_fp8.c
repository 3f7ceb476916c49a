/* rf-test: timeout=600
 * `--fp8 block` on the CUDA build (issue 35 item 5). First tests/gpu/test_fp8_linear_cuda (the
 * operands' kernels against fp8.c bit for bit, the NaN flag). Then build-cuda-emu/rfsdp train --device cuda
 * --fp8 block (the linear layers on cuBLASLt's block-scaled FP8 product, linear_cuda.c; the operands
 * quantized on the device, fp8_linear_cuda.cu; the DBuffer's FP8 gathers over NCCL at one byte
 * per code) against build/rfsdp train --device cpu --fp8 block on the CPU stand-in (tests/gpu/emu:
 * its cuBLASLt emulates the FP8 product as CUDA documents it), 4 steps of a tiny LLaMA with every
 * linear dimension 128 (one 128 x 128 weight tile each), batch 6 x 32: W = 1, W = 2 on two
 * emulated GPUs, W = 3 on one shared GPU; and a tiny Mixtral (4 experts top-2, hidden 32: every
 * product's k padded from 32 or 24 to 128, the experts' rows in chunks of 16) at W = 2 on two GPUs
 * (measured: the cpu run's losses exactly, norms within 7.9e-9: sums of 32 exact e4m3 products
 * are exact in f32 in any order here).
 * Tolerance: both sides quantize the same values into the same e4m3 codes and scales (fp8.c's
 * rule, bit for bit on the device) and sum exact products of e4m3 values in f32, the host per 128
 * codes through a bf16 GEMM then scaled and added, cuBLASLt block by block in another order: the
 * products differ by a few f32 units of roundoff (test_gemm_cuda: within 2^-16 of the sum of the
 * terms' magnitudes), not by e4m3 or bf16 units, unless such a difference moves a later value
 * across an e4m3 rounding boundary: one code then moves by one e4m3 unit (2^-4 relative) on one
 * side, one term of a 128-wide sum. Bounds: losses 2^-14 relative (a 1024th of an e4m3 unit,
 * 2^-4 / 1024), gradient norms 2^-10 (a 64th); measured 1.1e-6 and 2.0e-5 at most (W = 1, 2, 3,
 * AMD EPYC Zen 5): the losses 55 times inside, the norms 49 times.
 * Host waits per step (the log's host_syncs), printed for both devices: cuda's at most cpu's in
 * every step (measured 29/23/21 against 37/32/30: the activations' FP8 refusal is a device flag;
 * the weights' tiles are still checked by a host read per band and per gathered tensor). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_cuda_emu.h"
#include "rf_test.h"

#define STEPS 4

static char out[1 << 16];
static char dir[] = "/tmp/rf_test_cuda_emu_fp8.XXXXXX";
static char data[256], model[256], fp8[256], moe[256];

/* --fp8 block on --device cuda against --device cpu at W ranks, and the host waits of each. */
static void same_fp8(const char *env, int world, const char *config) {
  char gpu_log[320], cpu_log[320];
  if (rf_cuda_emu_same_run(dir, data, config, STEPS, env, world, "--batch 6 --seq 32", "--fp8 block", 0x1p-14,
                           0x1p-10, gpu_log, sizeof gpu_log) != 0)
    return;
  double gs[STEPS], cs[STEPS];
  const char *base = strrchr(gpu_log, '/');
  RF_ASSERT(base && strncmp(base, "/cuda-", 6) == 0);
  snprintf(cpu_log, sizeof cpu_log, "%.*s/cpu-%s", (int)(base - gpu_log), gpu_log, base + 6);
  int n = rf_cli_log_field(gpu_log, "\"host_syncs\":", gs, STEPS),
      nc = rf_cli_log_field(cpu_log, "\"host_syncs\":", cs, STEPS);
  printf("--fp8 block W=%d: host waits per step, cuda %g %g %g %g, cpu %g %g %g %g\n", world, gs[0], gs[1],
         gs[2], gs[3], cs[0], cs[1], cs[2], cs[3]);
  int more = 0;
  for (int i = 0; i < n && i < nc; i++) more |= gs[i] > cs[i];
  RF_CHECK(n == STEPS && nc == STEPS && !more, "W=%d: %d and %d steps logged; cuda waits more than cpu: %d",
           world, n, nc, more);
}

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_fp8") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_fp8");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 120, "tests/gpu/test_fp8_linear_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_fp8_linear_cuda: ") && strstr(out, " 0 failed"),
           "test_fp8_linear_cuda on the stand-in: exit %d", rc);
  RF_ASSERT(mkdtemp(dir));
  rc = rf_cli_setup_tiny(dir, 1 << 20, data, sizeof data, model, sizeof model, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: %s", out);
  snprintf(fp8, sizeof fp8, "%s/fp8.json", dir);
  const char *cfg =
      "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 128, "
      "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5}";
  RF_ASSERT(rf_file_write_all(fp8, cfg, strlen(cfg)) == 0);
  same_fp8("", 1, fp8);
  same_fp8("RF_EMU_DEVICES=2", 2, fp8);
  same_fp8("", 3, fp8);
  snprintf(moe, sizeof moe, "%s/moe.json", dir);
  const char *moe_cfg =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"intermediate_size\": 24, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
      "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"output_router_logits\": true, "
      "\"router_aux_loss_coef\": 0.02}";
  RF_ASSERT(rf_file_write_all(moe, moe_cfg, strlen(moe_cfg)) == 0);
  same_fp8("RF_EMU_DEVICES=2", 2, moe);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_cuda_emu_fp8");
}
