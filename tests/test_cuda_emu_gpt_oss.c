/* rf-test: timeout=300
 * GPT-OSS on the CUDA build, on the CPU stand-in (make BACKEND=cuda-emu, tests/gpu/emu):
 *   - tests/gpu/test_gpt_oss_cuda: GPT-OSS's entries of the CUDA kernel table
 *     (src/model/gpt_oss_cuda.cu: attention with sinks and a sliding window, the clamped
 *     SwiGLU, the experts' transposes) against the host table, tolerances in units of f32's
 *     roundoff stated there;
 *   - build-cuda-emu/rfsdp train --device cuda on a tiny GPT-OSS (sinks, layer 0 sliding with
 *     window 4, layer 1 full, YaRN, biased attention and router, 32 [in, out] experts top-2 with
 *     biases, swiglu_limit 0.05 so that the clamp acts at init; head_dim 32, 2 heads on 1 kv
 *     head) gives the losses and gradient norms of build/rfsdp train --device cpu: W = 1 at
 *     batch 4 x 32; W = 2 on two emulated GPUs at batch 2 x 8, one sequence of 8 tokens per
 *     rank: 16 choices of 32 experts, so at least half of each layer's experts get no token
 *     on every rank (nothing runs for them, their gradients stay exactly zero), there with 2
 *     heads on 1 (the sinks' 2 floats leave the unit's next tensors 8-byte aligned: cuBLASLt's
 *     products planned for that alignment, src/gemm/gemm_cuda.c); W = 2 with
 *     --compute-dtype bf16, where head_dim 32 is one the tensor-core attention takes
 *     (attention_tc.cu, which has no sinks and no window): GPT-OSS must keep the sink
 *     kernels there (model.c calls attention_sink_* in any compute dtype), which the cpu run's
 *     losses prove (its bf16 compute keeps f32 attention with sinks).
 * Tolerances: as tests/test_cuda_emu_train.c's dense and MoE runs: the GPU sums its products,
 * norms, attention and losses in another order than oneDNN and the host loops, a few f32
 * units of roundoff per value (test_gpt_oss_cuda measures each kernel), which over 3 AdamW
 * steps of lr 1e-3 stays under 1e-5 relative in the loss and 1e-4 in the gradient norm
 * (measured: printed); bf16 compute rounds the GEMM operands to bf16 on both sides, so the
 * same unless a roundoff flips a bf16 rounding: 1e-3 (bf16's unit roundoff is 3.9e-3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_cuda_emu.h"
#include "rf_test.h"

#define STEPS 3

static char out[1 << 18];
static char dir[] = "/tmp/rf_test_cuda_emu_gpt_oss.XXXXXX";
static char data[256], model[256], model_h2[256];

/* The tiny GPT-OSS of model_path on --device cuda (env, world, shape, args) against --device cpu. */
static void same_run(const char *model_path, const char *env, int world, const char *shape, const char *args,
                     double loss_tol, double norm_tol) {
  char gpu_log[320];
  rf_cuda_emu_same_run(dir, data, model_path, STEPS, env, world, shape, args, loss_tol, norm_tol, gpu_log,
                       sizeof gpu_log);
}

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_gpt_oss") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_gpt_oss");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 120, "tests/gpu/test_gpt_oss_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_gpt_oss_cuda: ") && strstr(out, " 0 failed") &&
               strstr(out, "w=5 sinks") && strstr(out, "w=0 sinks") && strstr(out, "limit 1.2") &&
               strstr(out, "nothing written"),
           "test_gpt_oss_cuda on the stand-in: exit %d", rc);
  RF_ASSERT(mkdtemp(dir));
  char tiny[256];
  rc = rf_cli_setup_tiny(dir, 1 << 18, data, sizeof data, tiny, sizeof tiny, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: %s", out);
  /* HEADS: 4 heads on 2, or 2 on 1 (the sinks' 2 floats then leave the tensors after them 8-byte
   * aligned in the unit's buffer, where cuBLASLt's usual algorithms want 16: gemm_cuda.c plans
   * those products for 8) */
  const char *cfg =
      "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"intermediate_size\": 16, "
      "\"num_hidden_layers\": 2, %s, \"head_dim\": 32, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"num_local_experts\": 32, "
      "\"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 0.05, "
      "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0, "
      "\"truncate\": false, \"original_max_position_embeddings\": 16}, \"output_router_logits\": true, "
      "\"router_aux_loss_coef\": 0.02}";
  char text[1024];
  snprintf(model, sizeof model, "%s/gpt_oss.json", dir);
  snprintf(text, sizeof text, cfg, "\"num_attention_heads\": 4, \"num_key_value_heads\": 2");
  RF_ASSERT(rf_file_write_all(model, text, strlen(text)) == 0);
  snprintf(model_h2, sizeof model_h2, "%s/gpt_oss_h2.json", dir);
  snprintf(text, sizeof text, cfg, "\"num_attention_heads\": 2, \"num_key_value_heads\": 1");
  RF_ASSERT(rf_file_write_all(model_h2, text, strlen(text)) == 0);
  same_run(model, "", 1, "--batch 4 --seq 32", "", 1e-5, 1e-4);
  same_run(model_h2, "RF_EMU_DEVICES=2", 2, "--batch 2 --seq 8", "", 1e-5, 1e-4); /* 8 tokens per rank */
  same_run(model, "", 2, "--batch 4 --seq 32", "--compute-dtype bf16", 1e-3, 1e-3);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_cuda_emu_gpt_oss");
}
