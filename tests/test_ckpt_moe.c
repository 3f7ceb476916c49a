/* rf-test: timeout=120
 * Mixtral checkpoints in and out against transformers (tests/ref_mixtral_export.py wrote
 * tests/data/mixtral_export/: a tiny Mixtral, 4 experts of 16, top-2):
 *  - in: `rfsdp logits --weights hf.safetensors` (the weights of a MixtralForCausalLM as
 *    transformers saves them; --init reads files the same way) at W = 1 and W = 2 gives the
 *    logits transformers computed (float64) on the committed tokens, every logit within 1e-4;
 *  - out: the committed checkpoint (`rfsdp train --init hf.safetensors`, 2 steps at W = 2)
 *    exported by `rfsdp ckpt export` and run by `rfsdp logits` at W = 1 and W = 2 gives the
 *    logits transformers computed on the same export loaded strictly into MixtralForCausalLM
 *    (every name and shape), within 1e-4;
 *  - both worlds write the same bytes.
 * The same for GPT-OSS (tests/ref_gpt_oss_export.py wrote tests/data/gpt_oss_export/: sinks, a
 * sliding layer, YaRN, the biased router, [in, out] experts with biases, the clamped SwiGLU),
 * its export loaded strictly into GptOssForCausalLM; and for DeepSeek-V3 (tests/ref_deepseek_v3_export.py
 * wrote tests/data/deepseek_v3_export/: multi-head latent attention, low-rank q, v_head_dim != the qk
 * head dim, a dense layer and a MoE layer: the sigmoid group-limited router, fused routed experts,
 * a shared expert, the balancing bias moved by the 2 steps), its export loaded strictly into
 * DeepseekV3ForCausalLM (the bias into the router's e_score_correction_bias buffer); and
 * transformers' file split into the Hub's layout (mlp.experts.N.gate_proj/up_proj/down_proj,
 * hub.safetensors) gives transformers' logits too. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static const char *REF = "tests/data/mixtral_export";
#define B 2
#define T 12
#define VOCAB 256

/* rfsdp logits of `weights` at W = 1 and 2 against the reference file `want_path`. */
static void check_logits(const char *dir, const char *what, const char *weights, const char *want_path) {
  char out[8192], logits[2][160];
  char *want;
  size_t want_bytes;
  RF_ASSERT(rf_file_read_all(want_path, &want, &want_bytes) == 0);
  RF_ASSERT(want_bytes == (size_t)B * T * VOCAB * sizeof(float));
  for (int w = 1; w <= 2; w++) {
    snprintf(logits[w - 1], sizeof logits[0], "%s/%s-w%d.f32", dir, what, w);
    int rc =
        rf_cli_run_mpi(out, sizeof out, w, 60,
                       "logits --model %s/config.json --weights %s --tokens %s/tokens.i32 --seq %d --out %s",
                       REF, weights, REF, T, logits[w - 1]);
    RF_CHECK(rc == 0, "%s: logits at W=%d: %s", what, w, out);
    char *got;
    size_t got_bytes;
    if (rc != 0 || rf_file_read_all(logits[w - 1], &got, &got_bytes) != 0) continue;
    RF_CHECK(got_bytes == want_bytes, "%s W=%d: %zu bytes of logits, expected %zu", what, w, got_bytes,
             want_bytes);
    if (got_bytes == want_bytes) {
      size_t n = want_bytes / sizeof(float);
      double d = rf_test_max_abs_diff((const float *)(void *)got, (const float *)(void *)want, n);
      printf(
          "%s: rfsdp logits at W=%d vs transformers: max |diff| %.3g over %zu logits (largest |logit| "
          "%.3g)\n",
          what, w, d, n, rf_test_max_abs((const float *)(void *)want, n));
      RF_CHECK(d <= 1e-4, "%s W=%d: logits differ from transformers' by %.3g > 1e-4", what, w, d);
    }
    free(got);
  }
  RF_CHECK(rf_test_files_equal(logits[0], logits[1]), "%s: W=1 and W=2 wrote different logits", what);
  unlink(logits[0]);
  unlink(logits[1]);
  free(want);
}

int main(void) {
  char dir[] = "/tmp/rf_test_ckpt_moe.XXXXXX", out[8192], model[128], in[256], want[256];
  RF_ASSERT(mkdtemp(dir));
  static const char *const refs[] = {"tests/data/mixtral_export", "tests/data/gpt_oss_export",
                                     "tests/data/deepseek_v3_export"};
  for (int r = 0; r < 3; r++) {
    REF = refs[r];
    printf("%s:\n", REF);
    snprintf(in, sizeof in, "%s/hf.safetensors", REF);
    snprintf(want, sizeof want, "%s/hf_logits.f32", REF);
    check_logits(dir, "hf.safetensors", in, want);
    if (r == 2) { /* DeepSeek-V3's routed experts in the Hub's layout: one tensor set per expert */
      snprintf(in, sizeof in, "%s/hub.safetensors", REF);
      check_logits(dir, "hub.safetensors", in, want);
    }
    snprintf(model, sizeof model, "%s/export.safetensors", dir);
    int rc = rf_cli_run(out, sizeof out, "ckpt export %s/step-00000002 --out %s", REF, model);
    RF_CHECK(rc == 0, "export: %s", out);
    snprintf(want, sizeof want, "%s/export_logits.f32", REF);
    check_logits(dir, "export", model, want);
    unlink(model);
  }
  rmdir(dir);
  return rf_test_finish("test_ckpt_moe");
}
