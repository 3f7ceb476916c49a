/* rf-test: timeout=300
 * DeepSeek-V3's multi-head latent attention on the CUDA build, on the CPU stand-in (make
 * BACKEND=cuda-emu, tests/gpu/emu):
 *   - tests/gpu/test_mla_cuda: the mla_ entries of the CUDA kernel table (src/model/mla_cuda.cu:
 *     the attention with v's head dim apart and the scale given, the rotary part of each head, the
 *     key and value expansion and its backward) against the host table, tolerances in units of
 *     f32's roundoff stated there;
 *   - build-cuda-emu/rfsdp train --device cuda on a tiny dense DeepSeek-V3 (every layer dense:
 *     first_k_dense_replace = num_hidden_layers; 4 heads, q and k of nope 8 + rope 6 = 14, v 10,
 *     kv_lora_rank 16, q_lora_rank 24 with interleaved rotary pairs, or q_proj with rotate_half
 *     and YaRN) gives the losses and gradient norms of build/rfsdp train --device cpu: W = 1 at
 *     batch 4 x 32 (low-rank q); W = 2 on two emulated GPUs at batch 2 x 16 (q_proj, YaRN:
 *     mscale_all_dim's scale); W = 3 on one emulated GPU at batch 3 x 16; W = 2 with
 *     --compute-dtype bf16, where MLA's attention stays f32
 *     (mla_cuda.h: the tensor-core attention takes neither v's own head dim nor a given scale) and
 *     the GEMMs take bf16 operands on both sides;
 *   - the same with MoE layers (first_k_dense_replace = 1: layer 1 has 8 routed experts in 4 groups,
 *     2 groups kept, top 2, norm_topk_prob, routed_scaling_factor 2.5, one shared expert): the
 *     group-limited router on the CUDA table (router_group_*), the balancing bias moved after
 *     every step (bias_update_speed 1e-3), at W = 1 and at W = 2 on two emulated GPUs.
 * Tolerances: as tests/test_cuda_emu_train.c's dense runs: the GPU sums its products, norms,
 * attention and losses in another order than oneDNN and the host loops, a few f32 units of
 * roundoff per value (test_mla_cuda measures each kernel), which over 3 AdamW steps of lr 1e-3
 * stays under 1e-5 relative in the loss and 1e-4 in the gradient norm (measured: printed); bf16
 * compute rounds the GEMM operands to bf16 on both sides, so the same unless a roundoff flips a
 * bf16 rounding: 1e-3 (bf16's unit roundoff is 3.9e-3). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_cuda_emu.h"
#include "rf_test.h"

#define STEPS 3

static char out[1 << 18];
static char dir[] = "/tmp/rf_test_cuda_emu_mla.XXXXXX";
static char data[256], model_lora[256], model_q[256], model_moe[256], gpu_log[320];

int main(void) {
  int rc = rf_cuda_emu_build();
  if (rc == 77) return rf_test_failures ? rf_test_finish("test_cuda_emu_mla") : 77;
  if (rc != 0) return rf_test_finish("test_cuda_emu_mla");
  rc = rf_cuda_emu_run(out, sizeof out, "", 0, 120, "tests/gpu/test_mla_cuda");
  printf("%s", out);
  RF_CHECK(rc == 0 && strstr(out, "test_mla_cuda: ") && strstr(out, " 0 failed") &&
               strstr(out, "hd=192 dv=128") && strstr(out, "h=4/1") && strstr(out, "T=1 ") &&
               strstr(out, "nothing written"),
           "test_mla_cuda on the stand-in: exit %d", rc);
  RF_ASSERT(mkdtemp(dir));
  char tiny[256];
  rc = rf_cli_setup_tiny(dir, 1 << 18, data, sizeof data, tiny, sizeof tiny, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: %s", out);
  /* every layer dense (first_k_dense_replace = num_hidden_layers); the experts' fields are read
   * and unused */
  const char *cfg =
      "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 32, \"intermediate_size\": 48, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, %s, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, "
      "\"qk_rope_head_dim\": 6, \"v_head_dim\": 10, \"first_k_dense_replace\": 2, "
      "\"moe_intermediate_size\": 12, \"n_routed_experts\": 4, \"n_shared_experts\": 1, "
      "\"num_experts_per_tok\": 2}";
  char text[1024];
  snprintf(model_lora, sizeof model_lora, "%s/deepseek_v3.json", dir);
  snprintf(text, sizeof text, cfg, "\"q_lora_rank\": 24, \"rope_interleave\": true");
  RF_ASSERT(rf_file_write_all(model_lora, text, strlen(text)) == 0);
  snprintf(model_q, sizeof model_q, "%s/deepseek_v3_q.json", dir);
  snprintf(text, sizeof text, cfg,
           "\"q_lora_rank\": null, \"rope_interleave\": false, \"rope_parameters\": {\"rope_type\": "
           "\"yarn\", \"rope_theta\": 10000.0, \"factor\": 4.0, \"original_max_position_embeddings\": 16, "
           "\"mscale\": 1.0, \"mscale_all_dim\": 0.7, \"beta_fast\": 32.0, \"beta_slow\": 1.0}");
  RF_ASSERT(rf_file_write_all(model_q, text, strlen(text)) == 0);
  rf_cuda_emu_same_run(dir, data, model_lora, STEPS, "", 1, "--batch 4 --seq 32", "", 1e-5, 1e-4, gpu_log,
                       sizeof gpu_log);
  /* MoE layers: the CUDA group router and the balancing bias's update */
  snprintf(model_moe, sizeof model_moe, "%s/deepseek_v3_moe.json", dir);
  snprintf(text, sizeof text,
           "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 32, \"intermediate_size\": 48, "
           "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 256, "
           "\"max_position_embeddings\": 64, \"q_lora_rank\": 24, \"rope_interleave\": true, "
           "\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 6, \"v_head_dim\": 10, "
           "\"first_k_dense_replace\": 1, \"moe_intermediate_size\": 12, \"n_routed_experts\": 8, "
           "\"n_group\": 4, \"topk_group\": 2, \"n_shared_experts\": 1, \"num_experts_per_tok\": 2, "
           "\"norm_topk_prob\": true, \"routed_scaling_factor\": 2.5}");
  RF_ASSERT(rf_file_write_all(model_moe, text, strlen(text)) == 0);
  rf_cuda_emu_same_run(dir, data, model_moe, STEPS, "", 1, "--batch 4 --seq 32", "", 1e-5, 1e-4, gpu_log,
                       sizeof gpu_log);
  rf_cuda_emu_same_run(dir, data, model_moe, STEPS, "RF_EMU_DEVICES=2", 2, "--batch 2 --seq 16", "", 1e-5,
                       1e-4, gpu_log, sizeof gpu_log);
  rf_cuda_emu_same_run(dir, data, model_q, STEPS, "RF_EMU_DEVICES=2", 2, "--batch 2 --seq 16", "", 1e-5, 1e-4,
                       gpu_log, sizeof gpu_log);
  rf_cuda_emu_same_run(dir, data, model_lora, STEPS, "", 3, "--batch 3 --seq 16", "", 1e-5, 1e-4, gpu_log,
                       sizeof gpu_log); /* three ranks on one GPU */
  rf_cuda_emu_same_run(dir, data, model_lora, STEPS, "", 2, "--batch 4 --seq 32", "--compute-dtype bf16",
                       1e-3, 1e-3, gpu_log, sizeof gpu_log);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_cuda_emu_mla");
}
