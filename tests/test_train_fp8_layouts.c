/* rf-test: timeout=400
 * `rfsdp train --fp8 block` with the other layouts, the optimizers and HSDP
 * (docs/fp8.md, "The runtime"), on the llama of test_train_fp8 (hidden 128, MLP
 * 384, 2 layers; sequences of 128 tokens, so that the weight gradient's 128 x 1
 * tiles along the tokens group the same tokens at every W; 4 steps):
 *  - fsdp2 (W = 2, 3) and flat (W = 3) cut 128x128 tiles, so they gather the
 *    weights in the param dtype and every rank quantizes each whole tensor after
 *    the gather: the codes are those of the whole tensor, as in the planned
 *    layout, so the losses are the planned one-rank run's (the reference): the
 *    first bit for bit, the later ones within 1e-4 relative (the f32 reductions'
 *    order differs); no step after the first allocates;
 *  - fsdp2 with --param-dtype bf16 --compute-dtype bf16: W = 3 against W = 1 (the
 *    codes are those of the gathered bf16 weights at every W);
 *  - the log's gather_bytes counts what is sent: at W = 2 fsdp2 with FP8 gathers
 *    exactly the bytes of fsdp2 without it (f32, and bf16), and the planned layout's
 *    FP8 gather (its embedding and head in f32: 28% of the parameters) less than
 *    0.35x of fsdp2's;
 *  - --optim adamw8bit, muon and shampoo at W = 2, 3 against W = 1;
 *  - HSDP: --replicate 2 at W = 4 (2 x 2, fsdp2 layout) against W = 1;
 *  - fused experts (a tiny Mixtral): fsdp2 at W = 3 against the planned W = 1;
 *  - a NaN in a weight (--init from a file with one NaN in
 *    model.layers.1.mlp.up_proj.weight) stops every rank of fsdp2 at W = 2 and
 *    flat at W = 3 with the tensor and its rows named. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"

#define STEPS 4
static char dir[64] = "/tmp/rf_test_train_fp8_layouts.XXXXXX";
static char model[256], data[200];

static const char *common = "--seq 128 --lr 1e-3 --warmup 2 --seed 7 --peak-gflops 50 --print-every 0";

/* Runs `steps` steps at W = w with these options; the losses into loss (STEPS), and
 * returns the last step's gather bytes (-1 when the run failed). */
static double run(const char *name, int w, int batch, int steps, const char *opts, double *loss) {
  char out[16384], log[256];
  for (int s = 0; loss && s < STEPS; s++) loss[s] = NAN; /* a failed run compares as nothing */
  snprintf(log, sizeof log, "%s/%s.jsonl", dir, name);
  int rc = rf_cli_run_mpi(out, sizeof out, w, 120,
                          "train --model %s --data %s %s --batch %d --steps %d --log %s %s", model, data,
                          common, batch, steps, log, opts);
  RF_CHECK(rc == 0, "%s at W=%d: rc %d\n%s", name, w, rc, out);
  double l[STEPS], allocs[STEPS], bytes[STEPS];
  int n = rf_cli_log_field(log, "\"loss\":", l, STEPS);
  RF_CHECK(rc != 0 || n == steps, "%s: %d steps logged", name, n);
  if (rc != 0 || n != steps) return -1;
  if (loss) memcpy(loss, l, sizeof l);
  int m = rf_cli_log_field(log, "\"allocs\":", allocs, STEPS), bad = 0;
  for (int s = 1; s < m; s++) bad += allocs[s] != 0;
  RF_CHECK(m == steps && bad == 0, "%s: %d steps after the first allocated", name, bad);
  RF_CHECK(rf_cli_log_field(log, "\"gather_bytes\":", bytes, STEPS) == steps, "%s: no gather bytes", name);
  return bytes[steps - 1];
}

/* The first loss bit for bit, the later ones within 1e-4 relative. */
static void compare(const char *name, const double *loss, const double *ref) {
  RF_CHECK(loss[0] == ref[0], "%s: first loss %a, the reference's %a", name, loss[0], ref[0]);
  double worst = 0;
  for (int s = 1; s < STEPS; s++) worst = rf_test_max(worst, fabs(loss[s] - ref[s]) / fabs(ref[s]));
  RF_CHECK(worst <= 1e-4, "%s: the loss differs from the reference by %.3g relative", name, worst);
  printf("%-28s first loss %a (reference %a), later steps within %.2g relative\n", name, loss[0], ref[0],
         worst);
}

static void check_layouts(void) {
  double ref[STEPS], loss[STEPS];
  char opts[256];
  snprintf(opts, sizeof opts, "--fp8 block --ckpt-dir %s/ckpt --save-every 2", dir);
  if (run("planned-1", 1, 6, STEPS, opts, ref) < 0) return;
  RF_CHECK(ref[STEPS - 1] < ref[0] - 0.5, "the loss does not fall: %g -> %g", ref[0], ref[STEPS - 1]);
  double fsdp2_fp8 = run("fsdp2-2", 2, 6, STEPS, "--fp8 block --layout fsdp2", loss);
  compare("fsdp2 W=2", loss, ref);
  run("fsdp2-3", 3, 6, STEPS, "--fp8 block --layout fsdp2", loss);
  compare("fsdp2 W=3", loss, ref);
  run("flat-3", 3, 6, STEPS, "--fp8 block --layout flat", loss);
  compare("flat W=3", loss, ref);

  double bf16[STEPS];
  const char *low = "--fp8 block --layout fsdp2 --param-dtype bf16 --compute-dtype bf16";
  run("fsdp2-bf16-1", 1, 6, STEPS, low, bf16);
  run("fsdp2-bf16-3", 3, 6, STEPS, low, loss);
  compare("fsdp2 bf16 W=3 vs W=1", loss, bf16);

  /* the bytes a step gathers (2 short steps at W = 2: the count does not depend on the batch) */
  double fsdp2_f32 = run("bytes-fsdp2", 2, 2, 2, "--layout fsdp2", NULL);
  double fsdp2_bf16 = run("bytes-fsdp2-bf16", 2, 2, 2, "--layout fsdp2 --param-dtype bf16", NULL);
  double fsdp2_fp8_bf16 =
      run("bytes-fsdp2-fp8-bf16", 2, 2, 2, "--layout fsdp2 --param-dtype bf16 --fp8 block", NULL);
  double planned_fp8 = run("bytes-planned-fp8", 2, 2, 2, "--fp8 block", NULL);
  RF_CHECK(fsdp2_fp8 == fsdp2_f32 && fsdp2_f32 > 0, "fsdp2: %.0f bytes gathered with FP8, %.0f without",
           fsdp2_fp8, fsdp2_f32);
  RF_CHECK(fsdp2_fp8_bf16 == fsdp2_bf16 && fsdp2_bf16 > 0 && fsdp2_bf16 < fsdp2_f32,
           "fsdp2 bf16: %.0f bytes gathered with FP8, %.0f without", fsdp2_fp8_bf16, fsdp2_bf16);
  RF_CHECK(planned_fp8 > 0 && planned_fp8 < 0.35 * fsdp2_fp8,
           "the planned layout's FP8 gather: %.0f bytes, fsdp2's %.0f", planned_fp8, fsdp2_f32);
  printf(
      "gather bytes per step at W=2: fsdp2 f32 %.0f (with --fp8 block %.0f), fsdp2 bf16 %.0f (with --fp8 "
      "block "
      "%.0f), planned --fp8 block %.0f\n",
      fsdp2_f32, fsdp2_fp8, fsdp2_bf16, fsdp2_fp8_bf16, planned_fp8);
}

/* Fused experts (a tiny Mixtral, experts of 100 and 128 rows): fsdp2 at W = 3 against
 * the planned one-rank run. */
static void check_moe(void) {
  char planned_model[256];
  snprintf(planned_model, sizeof planned_model, "%s", model);
  snprintf(model, sizeof model, "%s/moe.json", dir);
  const char *moe =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 128, \"intermediate_size\": 100, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"output_router_logits\": false, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5}";
  RF_ASSERT(rf_file_write_all(model, moe, strlen(moe)) == 0);
  double ref[STEPS], loss[STEPS];
  if (run("moe-planned-1", 1, 6, STEPS, "--fp8 block", ref) >= 0 &&
      run("moe-fsdp2-3", 3, 6, STEPS, "--fp8 block --layout fsdp2", loss) >= 0)
    compare("mixtral fsdp2 W=3", loss, ref);
  snprintf(model, sizeof model, "%s", planned_model);
}

static void check_optimizers(void) {
  static const char *optims[] = {"adamw8bit", "muon", "shampoo"};
  for (int o = 0; o < 3; o++) {
    double ref[STEPS], loss[STEPS];
    char opts[128], name[64];
    snprintf(opts, sizeof opts, "--fp8 block --optim %s", optims[o]);
    snprintf(name, sizeof name, "%s-1", optims[o]);
    if (run(name, 1, 6, STEPS, opts, ref) < 0) continue;
    for (int w = 2; w <= 3; w++) {
      snprintf(name, sizeof name, "%s-%d", optims[o], w);
      if (run(name, w, 6, STEPS, opts, loss) >= 0) compare(name, loss, ref);
    }
  }
  double ref[STEPS], loss[STEPS];
  if (run("hsdp-ref", 1, 8, STEPS, "--fp8 block", ref) < 0) return;
  if (run("hsdp-2x2", 4, 8, STEPS, "--fp8 block --layout fsdp2 --replicate 2", loss) >= 0)
    compare("--replicate 2 fsdp2 W=4", loss, ref);
}

/* A safetensors file of the reference run's step-2 weights with one NaN in up_proj:
 * --init refuses it before any step under fsdp2 (W = 2) and flat (W = 3), naming the
 * tensor and the element, as in the planned layout (test_train_fp8). */
static void check_nan(void) {
  char out[16384], path[256], src[256];
  snprintf(path, sizeof path, "%s/nan.safetensors", dir);
  snprintf(src, sizeof src, "%s/ckpt/step-00000002", dir);
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s", src, path);
  RF_CHECK(rc == 0, "export: %s", out);
  struct rf_safetensors_file f;
  if (rc != 0 || rf_safetensors_open(&f, path) != 0) return;
  const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, "model.layers.1.mlp.up_proj.weight");
  RF_ASSERT(t && t->dtype == RF_SAFETENSORS_DTYPE_F32);
  off_t at = (off_t)(f.data_start + t->begin + 4 * (200 * 128 + 5)); /* row 200 of [384, 128] */
  rf_safetensors_close(&f);
  float nan = NAN;
  int fd = open(path, O_WRONLY);
  RF_ASSERT(fd >= 0 && pwrite(fd, &nan, 4, at) == 4 && close(fd) == 0);
  static const struct {
    int world;
    const char *layout;
  } runs[] = {{2, "fsdp2"}, {3, "flat"}};
  for (int i = 0; i < 2; i++) {
    rc = rf_cli_run_mpi(out, sizeof out, runs[i].world, 60,
                        "train --model %s --data %s %s --batch 6 --steps 2 --fp8 block --layout %s --init %s",
                        model, data, common, runs[i].layout, path);
    RF_CHECK(rc == 1 && strstr(out, "'model.layers.1.mlp.up_proj.weight' element 25605 ") &&
                 strstr(out, "must be finite"),
             "a NaN in a weight, %s at W=%d: rc %d\n%s", runs[i].layout, runs[i].world, rc, out);
  }
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], out[8192];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/small.json", dir);
  rf_cli_write_verses(text, 1 << 18);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  const char *small =
      "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 384, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5}";
  RF_ASSERT(rf_file_write_all(model, small, strlen(small)) == 0);

  check_layouts();
  check_nan();
  check_optimizers();
  check_moe();

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_train_fp8_layouts");
}
