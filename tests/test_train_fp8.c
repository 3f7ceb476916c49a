/* rf-test: timeout=300
 * `rfsdp train --fp8 block` under mpirun (docs/fp8.md):
 *  - the same run at W = 1, 2, 3 (a llama of hidden 128, MLP 384, 2 layers; 6
 *    steps of 6 sequences of 128 tokens, so that the weight gradient's 128 x 1
 *    tiles along the tokens are the same sequences at every W): the first step's
 *    loss is bit-identical to the one-rank run's, the later ones within 1e-4
 *    relative; no step after the first allocates; the loss falls;
 *  - at seq 64 and at seq 200 (longer than a tile, no multiple of it: the weight
 *    gradient's tiles end at each sequence's end): the first gradient's norm at W =
 *    2, 3 within 1e-7 of the one-rank run's, the second loss within 1e-6;
 *  - resume: the W = 2 run resumed from its checkpoint of step 3 ends with
 *    bit-identical checkpoints and losses (checkpoints hold the f32 masters);
 *  - gather bytes counted by the runtime (the log's gather_bytes of a step) on a
 *    model whose linear weights are 97% of the parameters (4 layers of hidden 128
 *    and MLP 512, tied 256-token embedding): FP8 (the others in bf16) <= 0.27x the
 *    f32 run's and <= 0.53x the bf16 run's;
 *  - a NaN in a weight (--init from a safetensors file with one NaN in
 *    model.layers.1.mlp.up_proj.weight) stops every rank at W = 2 and 3 with the
 *    tensor named (the fsdp2 and flat layouts with --fp8 block:
 *    tests/test_train_fp8_layouts.c);
 *  - the same on a tiny Mixtral (hidden 128, 4 experts of intermediate 100, top-2, 2
 *    layers): the fused experts are quantized, gate_up [4, 200, 128] (each expert a
 *    128-row band and a 72-row one: planner blocks of whole experts) and down
 *    [4, 128, 100] (one band per expert); the router stays in the param dtype. W = 1,
 *    2, 3 as above (the later steps within 1e-4: an expert's weight gradient quantizes
 *    128x1 tiles of the tokens routed to it in the rank's micro-batch, which group
 *    differently at each W; the load-balancing loss is off: its statistics are summed
 *    across ranks in another order at each W); resume bit-exact; the FP8 run's gather
 *    bytes below 0.6x the bf16 run's; `rfsdp ckpt export --fp8` of the W = 3 run's
 *    last checkpoint holds every expert's codes and scales as rf_fp8_quantize gives
 *    them from the f32 export; a NaN in expert 2 of
 *    model.layers.1.mlp.experts.gate_up_proj stops every rank at W = 2 and 3 with the
 *    tensor, the expert and the rows named. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"

#define STEPS 6
static char dir[64] = "/tmp/rf_test_train_fp8.XXXXXX";
/* The model under test: its own folder below dir (logs, checkpoints, exports) and its name. */
static char run[128];
static const char *label;

static const char *common =
    "--batch 6 --seq 128 --lr 1e-3 --warmup 2 --seed 7 --peak-gflops 50 --print-every 0";

static void check_equivalence(const char *model, const char *data) {
  char out[16384], log[256], ckpt[256];
  double loss[4][STEPS], allocs[STEPS];
  for (int w = 1; w <= 3; w++) {
    snprintf(log, sizeof log, "%s/fp8-%d.jsonl", run, w);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%d", run, w);
    int rc = rf_cli_run_mpi(out, sizeof out, w, 120,
                            "train --model %s --data %s %s --steps %d --fp8 block --log %s --ckpt-dir %s "
                            "--save-every 3",
                            model, data, common, STEPS, log, ckpt);
    RF_CHECK(rc == 0, "--fp8 block at W=%d: rc %d\n%s", w, rc, out);
    int n = rf_cli_log_field(log, "\"loss\":", loss[w], STEPS);
    RF_CHECK(n == STEPS, "W=%d: %d steps logged", w, n);
    if (n != STEPS) return;
    int m = rf_cli_log_field(log, "\"allocs\":", allocs, STEPS), bad = 0;
    for (int s = 1; s < m; s++) bad += allocs[s] != 0;
    RF_CHECK(m == STEPS && bad == 0, "W=%d: %d steps after the first allocated", w, bad);
  }
  RF_CHECK(loss[1][STEPS - 1] < loss[1][0] - 0.5, "the loss does not fall: %g -> %g", loss[1][0],
           loss[1][STEPS - 1]);
  for (int w = 2; w <= 3; w++) {
    RF_CHECK(loss[w][0] == loss[1][0], "W=%d: first loss %a, one rank's %a", w, loss[w][0], loss[1][0]);
    double worst = 0;
    for (int s = 1; s < STEPS; s++)
      worst = rf_test_max(worst, fabs(loss[w][s] - loss[1][s]) / fabs(loss[1][s]));
    RF_CHECK(worst <= 1e-4, "W=%d: the loss differs from the one-rank run by %.3g relative", w, worst);
    printf("fp8 %s W=%d: first loss %a (one rank: %a), later steps within %.2g relative\n", label, w,
           loss[w][0], loss[1][0], worst);
  }
}

/* At seq 64 (two sequences per 128-token tile if the tiles ran over a rank's tokens
 * whole) and at seq 200 (longer than a tile and no multiple of it: a 128-token tile
 * and a 72-token one per sequence; 3 sequences on a rank at W = 2, 2 at W = 3): the
 * weight gradient's tiles restart at each sequence, so the first step's gradient is
 * the same at W = 1, 2, 3 up to the reduce-scatter's summation order (its norm within
 * 1e-7 relative, measured 2.1e-9 at W = 2, 0 at W = 3 at seq 64, 4e-9 at seq 200; the
 * second loss within 1e-6, measured 1.9e-9 and 0). Tiles that cross sequences are
 * 2.1e-4 off in the norm at seq 64 (3 sequences on a rank at W = 2), 3.0e-5 at W = 2 and
 * 1.6e-4 at W = 3 at seq 200 (tiles restarting only in sequences under 128 tokens). */
static void check_seq_tiles(const char *model, const char *data, int seq) {
  char out[16384], log[256];
  double loss[4][2], norm[4][2];
  for (int w = 1; w <= 3; w++) {
    snprintf(log, sizeof log, "%s/seq%d-%d.jsonl", run, seq, w);
    int rc = rf_cli_run_mpi(out, sizeof out, w, 120,
                            "train --model %s --data %s --batch 6 --seq %d --lr 1e-3 --warmup 2 --seed 7 "
                            "--peak-gflops 50 --print-every 0 --steps 2 --fp8 block --log %s",
                            model, data, seq, log);
    RF_CHECK(rc == 0, "--fp8 block --seq %d at W=%d: rc %d\n%s", seq, w, rc, out);
    int n = rf_cli_log_field(log, "\"loss\":", loss[w], 2),
        m = rf_cli_log_field(log, "\"grad_norm\":", norm[w], 2);
    RF_CHECK(n == 2 && m == 2, "seq %d, W=%d: %d losses and %d norms logged", seq, w, n, m);
    if (n != 2 || m != 2) return;
  }
  for (int w = 2; w <= 3; w++) {
    double dn = fabs(norm[w][0] - norm[1][0]) / norm[1][0];
    RF_CHECK(loss[w][0] == loss[1][0], "seq %d, W=%d: first loss %a, one rank's %a", seq, w, loss[w][0],
             loss[1][0]);
    double dl = fabs(loss[w][1] - loss[1][1]) / loss[1][1];
    RF_CHECK(dn <= 1e-7, "seq %d, W=%d: the first gradient's norm is %.3g relative from the one-rank run's",
             seq, w, dn);
    RF_CHECK(dl <= 1e-6, "seq %d, W=%d: the second loss is %.3g relative from the one-rank run's", seq, w,
             dl);
    printf("fp8 %s seq %d W=%d: first gradient norm within %.2g relative, second loss within %.2g\n", label,
           seq, w, dn, dl);
  }
}

static void check_resume(const char *model, const char *data) {
  char out[16384], log[256], ckpt[256], half[256], fa[512], fb[512];
  snprintf(log, sizeof log, "%s/resumed.jsonl", run);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-resumed", run);
  snprintf(half, sizeof half, "%s/ckpt-2/step-00000003", run);
  int rc = rf_cli_run_mpi(out, sizeof out, 2, 120,
                          "train --model %s --data %s %s --steps %d --fp8 block --log %s --ckpt-dir %s "
                          "--save-every 3 --resume %s",
                          model, data, common, STEPS, log, ckpt, half);
  RF_CHECK(rc == 0 && strstr(out, "resumed from"), "resumed --fp8 block run: rc %d\n%s", rc, out);
  for (int r = 0; r < 2; r++) {
    snprintf(fa, sizeof fa, "%s/ckpt-2/step-%08d/rank-%05d.bin", run, STEPS, r);
    snprintf(fb, sizeof fb, "%s/step-%08d/rank-%05d.bin", ckpt, STEPS, r);
    RF_CHECK(rf_test_files_equal(fa, fb), "rank %d's final checkpoint differs after resume", r);
  }
  double la[STEPS], lb[STEPS];
  snprintf(fa, sizeof fa, "%s/fp8-2.jsonl", run);
  int na = rf_cli_log_field(fa, "\"loss\":", la, STEPS), nb = rf_cli_log_field(log, "\"loss\":", lb, STEPS);
  RF_CHECK(na == STEPS && nb == STEPS - 3, "%d and %d steps logged", na, nb);
  for (int s = 0; s < STEPS - 3 && na == STEPS && nb == STEPS - 3; s++)
    RF_CHECK(la[3 + s] == lb[s], "step %d: loss %a resumed, %a uninterrupted", 4 + s, lb[s], la[3 + s]);
}

/* The gather bytes of the last of 2 steps at W=2 with these options. */
static double gather_bytes(const char *model, const char *data, const char *opts, const char *name) {
  char out[16384], log[256];
  snprintf(log, sizeof log, "%s/bytes-%s.jsonl", run, name);
  int rc = rf_cli_run_mpi(out, sizeof out, 2, 120,
                          "train --model %s --data %s --batch 2 --seq 16 --steps 2 --peak-gflops 50 "
                          "--print-every 0 --log %s %s",
                          model, data, log, opts);
  RF_CHECK(rc == 0, "%s: rc %d\n%s", name, rc, out);
  double b[2] = {0, 0};
  RF_CHECK(rf_cli_log_field(log, "\"gather_bytes\":", b, 2) == 2 && b[1] > 0, "%s: no gather bytes logged",
           name);
  return b[1];
}

static void check_bytes(const char *data) {
  char model[256];
  snprintf(model, sizeof model, "%s/wide.json", run);
  const char *wide =
      "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 512, "
      "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 128, \"tie_word_embeddings\": true}";
  RF_ASSERT(rf_file_write_all(model, wide, strlen(wide)) == 0);
  double f32 = gather_bytes(model, data, "", "f32");
  double bf16 = gather_bytes(model, data, "--param-dtype bf16", "bf16");
  double fp8 = gather_bytes(model, data, "--fp8 block --param-dtype bf16", "fp8");
  double fp8_f32 = gather_bytes(model, data, "--fp8 block", "fp8-f32");
  RF_CHECK(fp8 <= 0.27 * f32, "FP8 gathers %.0f bytes, %.4fx the f32 run's %.0f", fp8, fp8 / f32, f32);
  RF_CHECK(fp8 <= 0.53 * bf16, "FP8 gathers %.0f bytes, %.4fx the bf16 run's %.0f", fp8, fp8 / bf16, bf16);
  RF_CHECK(fp8 < fp8_f32 && fp8_f32 < 0.5 * f32, "FP8 with f32 others: %.0f bytes", fp8_f32);
  printf(
      "gather bytes per step at W=2: f32 %.0f, bf16 %.0f, fp8 (others bf16) %.0f = %.4fx f32, %.4fx bf16; "
      "fp8 (others f32) %.0f = %.4fx f32\n",
      f32, bf16, fp8, fp8 / f32, fp8 / bf16, fp8_f32, fp8_f32 / f32);
}

/* A safetensors file of the W=1 run's step-3 weights with a NaN at element `at` of
 * `tensor` (f32): --init refuses it at W = 2 and 3 before any step, naming the tensor and
 * the element (the load checks every value, issue 29). `rows` is where the FP8 gather
 * would have met it: the run must not get that far. The quantizer's own NaN stop is
 * tested without --init in test_fsdp_fp8 and test_fsdp_fp8_moe. */
static void check_nan(const char *model, const char *data, const char *tensor, int64_t at, const char *rows) {
  char out[16384], path[256], src[256], named[256];
  snprintf(path, sizeof path, "%s/nan.safetensors", run);
  snprintf(src, sizeof src, "%s/ckpt-1/step-00000003", run);
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s", src, path);
  RF_CHECK(rc == 0, "export: %s", out);
  struct rf_safetensors_file f;
  if (rc != 0 || rf_safetensors_open(&f, path) != 0) return;
  const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, tensor);
  RF_ASSERT(t && t->dtype == RF_SAFETENSORS_DTYPE_F32);
  off_t pos = (off_t)(f.data_start + t->begin + 4 * at);
  rf_safetensors_close(&f);
  float nan = NAN;
  int fd = open(path, O_WRONLY);
  RF_ASSERT(fd >= 0 && pwrite(fd, &nan, 4, pos) == 4 && close(fd) == 0);
  snprintf(named, sizeof named, "'%s'", tensor);
  for (int w = 2; w <= 3; w++) {
    rc = rf_cli_run_mpi(out, sizeof out, w, 60,
                        "train --model %s --data %s %s --steps 2 --fp8 block --init %s", model, data, common,
                        path);
    char element[64];
    snprintf(element, sizeof element, "element %lld ", (long long)at);
    RF_CHECK(rc == 1 && strstr(out, named) && strstr(out, element) && strstr(out, "must be finite") &&
                 !strstr(out, rows),
             "a NaN in %s at W=%d: rc %d\n%s", tensor, w, rc, out);
  }
}

/* Expert e of tensor `name` [E, rows, cols] in the FP8 export against rf_fp8_quantize of
 * the same expert in the f32 export. */
static void check_export(const char *ckpt, const char *name, int64_t experts, int64_t rows, int64_t cols) {
  char out[8192], fp8[256], f32[256], sname[256];
  snprintf(fp8, sizeof fp8, "%s/export-fp8.safetensors", run);
  snprintf(f32, sizeof f32, "%s/export-f32.safetensors", run);
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ckpt, fp8);
  RF_CHECK(rc == 0, "export --fp8: %s", out);
  rc |= rf_cli_run(out, sizeof out, "ckpt export %s --out %s", ckpt, f32);
  RF_CHECK(rc == 0, "export: %s", out);
  struct rf_safetensors_file q, w;
  if (rc != 0 || rf_safetensors_open(&q, fp8) != 0) return;
  RF_ASSERT(rf_safetensors_open(&w, f32) == 0);
  struct rf_fp8_grid g = {rows, cols, RF_FP8_TILE, RF_FP8_TILE};
  int64_t per = rows * cols, tiles = rf_fp8_grid_tiles(&g), n = experts * per;
  float *x = malloc((size_t)n * sizeof(float)), *scales = malloc((size_t)(experts * tiles) * sizeof(float));
  float *want_s = malloc((size_t)(experts * tiles) * sizeof(float));
  uint8_t *codes = malloc((size_t)n), *want = malloc((size_t)n);
  RF_ASSERT(x && scales && want_s && codes && want);
  snprintf(sname, sizeof sname, "%s_scale_inv", name);
  RF_ASSERT(rf_safetensors_read_f32(&w, name, 0, n, x) == 0);
  RF_CHECK(rf_safetensors_read_raw(&q, name, 0, n, codes) == 0 &&
               rf_safetensors_read_raw(&q, sname, 0, experts * tiles, scales) == 0,
           "%s and its scales in the FP8 export: %s", name, rf_error_msg());
  for (int64_t e = 0; e < experts; e++)
    RF_ASSERT(rf_fp8_quantize(&g, x + e * per, 0, name, want + e * per, want_s + e * tiles) == 0);
  RF_CHECK(memcmp(codes, want, (size_t)n) == 0, "%s: the exported codes are not each expert's", name);
  RF_CHECK(memcmp(scales, want_s, (size_t)(experts * tiles) * sizeof(float)) == 0,
           "%s: the exported scales are not each expert's", name);
  free(x);
  free(scales);
  free(want_s);
  free(codes);
  free(want);
  rf_safetensors_close(&q);
  rf_safetensors_close(&w);
}

/* Sets the model under test: its folder dir/NAME and its config file there. */
static void use_model(const char *name, const char *config, char *model, size_t cap) {
  label = name;
  snprintf(run, sizeof run, "%s/%s", dir, name);
  RF_ASSERT(mkdir(run, 0700) == 0);
  snprintf(model, cap, "%s/model.json", run);
  RF_ASSERT(rf_file_write_all(model, config, strlen(config)) == 0);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], data[200], model[256], out[8192];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  rf_cli_write_verses(text, 1 << 18);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);

  use_model("dense",
            "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 384, "
            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"vocab_size\": 256, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5}",
            model, sizeof model);
  check_equivalence(model, data);
  check_seq_tiles(model, data, 64);
  check_seq_tiles(model, data, 200);
  check_resume(model, data);
  check_nan(model, data, "model.layers.1.mlp.up_proj.weight", 200 * 128 + 5,
            "rows [128, 256)"); /* row 200 of [384, 128] */
  check_bytes(data);

  const char *gate_up = "model.layers.1.mlp.experts.gate_up_proj";
  use_model("moe",
            "{\"model_type\": \"mixtral\", \"hidden_size\": 128, \"intermediate_size\": 100, "
            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"num_local_experts\": 4, \"num_experts_per_tok\": 2, \"output_router_logits\": false, "
            "\"vocab_size\": 256, \"max_position_embeddings\": 128, \"rms_norm_eps\": 1e-5}",
            model, sizeof model);
  check_equivalence(model, data);
  check_resume(model, data);
  char last[256];
  snprintf(last, sizeof last, "%s/ckpt-3/step-%08d", run, STEPS);
  check_export(last, gate_up, 4, 200, 128);
  check_export(last, "model.layers.0.mlp.experts.down_proj", 4, 128, 100);
  check_nan(model, data, gate_up, (2 * 200 + 150) * 128 + 5,
            "expert 2's rows [128, 200)"); /* expert 2, row 150 */
  double bf16 = gather_bytes(model, data, "--param-dtype bf16", "bf16");
  double fp8 = gather_bytes(model, data, "--fp8 block --param-dtype bf16", "fp8");
  RF_CHECK(fp8 < 0.6 * bf16, "FP8 gathers %.0f bytes, %.4fx the bf16 run's %.0f", fp8, fp8 / bf16, bf16);
  printf("moe gather bytes per step at W=2: bf16 %.0f, fp8 (others bf16) %.0f = %.4fx\n", bf16, fp8,
         fp8 / bf16);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_train_fp8");
}
