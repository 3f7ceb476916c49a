/* rf-test: timeout=60
 * An exported checkpoint against transformers: the committed tiny trained checkpoint
 * tests/data/export_ref/step-00000020 (W = 2, AdamW, 20 steps) exported by `rfsdp ckpt export`
 * and run by `rfsdp logits` at W = 1 and W = 2 gives, on the committed tokens, the logits that
 * transformers' LlamaForCausalLM (float64) computed on the same export (tests/ref_export.py wrote
 * tokens.i32 and logits.f32): every logit within 2e-5; both worlds write the same bytes. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define REF "tests/data/export_ref"
#define B 2
#define T 24
#define VOCAB 256

int main(void) {
  char dir[] = "/tmp/rf_test_ckpt_hf.XXXXXX", out[8192], model[128], logits[2][128];
  RF_ASSERT(mkdtemp(dir));
  snprintf(model, sizeof model, "%s/model.safetensors", dir);
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s/step-00000020 --out %s", REF, model);
  RF_CHECK(rc == 0, "export: %s", out);
  char *want;
  size_t want_bytes;
  RF_ASSERT(rf_file_read_all(REF "/logits.f32", &want, &want_bytes) == 0);
  RF_ASSERT(want_bytes == (size_t)B * T * VOCAB * sizeof(float));
  for (int w = 1; w <= 2; w++) {
    snprintf(logits[w - 1], sizeof logits[0], "%s/logits-w%d.f32", dir, w);
    rc = rf_cli_run_mpi(out, sizeof out, w, 60,
                        "logits --model %s/config.json --weights %s --tokens %s/tokens.i32 "
                        "--seq %d --out %s",
                        REF, model, REF, T, logits[w - 1]);
    RF_CHECK(rc == 0, "logits at W=%d: %s", w, out);
    char *got;
    size_t got_bytes;
    if (rc != 0 || rf_file_read_all(logits[w - 1], &got, &got_bytes) != 0) continue;
    RF_CHECK(got_bytes == want_bytes, "W=%d: %zu bytes of logits, expected %zu", w, got_bytes, want_bytes);
    if (got_bytes == want_bytes) {
      size_t n = want_bytes / sizeof(float);
      double d = rf_test_max_abs_diff((const float *)(void *)got, (const float *)(void *)want, n);
      printf(
          "rfsdp logits at W=%d vs transformers on the export: max |diff| %.3g over %zu logits (largest "
          "|logit| %.3g)\n",
          w, d, n, rf_test_max_abs((const float *)(void *)want, n));
      RF_CHECK(d <= 2e-5, "W=%d: logits differ from transformers' by %.3g > 2e-5", w, d);
    }
    free(got);
  }
  RF_CHECK(rf_test_files_equal(logits[0], logits[1]), "W=1 and W=2 wrote different logits");
  free(want);
  unlink(logits[0]);
  unlink(logits[1]);
  unlink(model);
  rmdir(dir);
  return rf_test_finish("test_ckpt_hf");
}
