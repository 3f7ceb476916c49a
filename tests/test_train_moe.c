/* rf-test: timeout=600
 * `rfsdp train` on a tiny Mixtral (8 experts of 32, top-2, hidden 32, 2 layers,
 * the load-balancing loss on: output_router_logits, router_aux_loss_coef 0.02)
 * under mpirun:
 *  - W-invariance: the same run (seed, global batch, 4 steps, seq 8) at W ranks
 *    gives the same loss at every step as the one-rank run within 1e-4 relative
 *    (the loss includes the load-balancing loss of the global micro-batch), at
 *    W = 2..7 and 12 (W > E: ranks holding no expert take part in every
 *    collective) in each of planned/ragged, planned/equal, fsdp2 and flat.
 *    Global batch 12 (W = 5: 10, W = 7: 14, each against a one-rank run of that
 *    batch). No step after the first allocates (the expert products have fixed
 *    shapes); planned/ragged pads 0 and copies 0 bytes per step (the log's
 *    padding_bytes, copy_bytes; with AdamW: Muon's owner transport moves whole
 *    matrices);
 *  - bf16 compute and parameters at W = 3 against the one-rank bf16 run; Muon
 *    (every expert's [2*inter, hidden] and [hidden, inter] its own matrix) at W = 3
 *    planned/ragged and W = 5 fsdp2 (experts cut across ranks), 8-bit AdamW at
 *    W = 3, each against its one-rank run;
 *  - qwen3_moe (q/k norms, experts of 16 not renormalized, layer 1 dense, 3 layers):
 *    W = 3 planned/ragged with AdamW and W = 5 fsdp2 with Muon against the one-rank runs;
 *  - gpt_oss (sinks, a sliding layer with window 4 < seq 8, YaRN, biased router, [in, out]
 *    experts with biases, swiglu_limit 0.02 so that the clamp acts at init): AdamW at W = 2
 *    planned/ragged, W = 3 planned/equal, W = 3 fsdp2, W = 2 flat, and Muon (each expert's
 *    [hidden, 2*inter] its own matrix) at W = 3 fsdp2, against the one-rank runs;
 *  - deepseek_v3 with dense layers (multi-head latent attention: low-rank q, v_head_dim 10 != 14):
 *    the same five runs as gpt_oss and 8-bit AdamW at W = 3 planned/ragged, against the one-rank runs;
 *  - deepseek_v3 with MoE layers (3 layers, the first dense; 8 experts in 4 groups, 2 groups kept,
 *    top-2, one shared expert, bias_update_speed 0.01 so that the balancing bias moves the choice
 *    within the run): W = 2 planned/ragged, W = 3 planned/equal and fsdp2 with AdamW, W = 2 fsdp2
 *    with Muon, against the one-rank runs; its balancing bias after 4 steps the same bits at
 *    W = 1, 2, 3 (and W = 2 with two micro-batches a step, W = 1 evaluating after every step, W = 4
 *    as HSDP of 2 replicas) and moved; a resume at W = 2 and 3 bit-identical
 * (the bias in the checkpoint);
 *  - resume: a run stopped at a checkpoint and resumed ends bit-identical to the
 *    uninterrupted run (every rank file of the final checkpoints, and the log's
 *    losses): AdamW at W = 2, 8-bit AdamW at W = 3, Muon at W = 2; and a
 *    checkpoint of W = 2 resumed at W = 3 (resharding) gives the losses of the
 *    uninterrupted W = 2 run within 1e-4;
 *  - bad input: top-k > E, E = 0, a config without num_local_experts, refused
 *    naming the field; --init from a safetensors file without a router (a dense
 *    llama's of the same sizes) or with experts of another shape (intermediate
 *    16, not 32), refused naming the tensor. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define STEPS 4
static char dir[64] = "/tmp/rf_test_train_moe.XXXXXX";
static char model[256], qwen[256], oss[256], dsv3[256], dsm[256], data[200];
static const char *cur = model; /* the model check_world runs */

static const char *cur_name(void) {
  return cur == model  ? "mixtral"
         : cur == qwen ? "qwen3"
         : cur == oss  ? "gpt_oss"
         : cur == dsm  ? "deepseek_v3_moe"
                       : "deepseek_v3";
}

static int run(char *out, int out_size, int world, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int run(char *out, int out_size, int world, const char *fmt, ...) {
  char args[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  return rf_cli_run_mpi(out, out_size, world, 120, "%s", args);
}

static const char *common = "--steps 4 --seq 8 --lr 3e-3 --seed 7 --peak-gflops 50 --print-every 0";

/* The one-rank run of global batch `batch` in `dtype`; its losses in ref. Each
 * runs once: the W = 2, 3, 4, 6 and 12 runs of every layout share batch 12's. */
static void reference(int batch, const char *dtype, const char *optim, double *ref) {
  char out[16384], log[256];
  snprintf(log, sizeof log, "%s/ref-%d-%s-%s-%s.jsonl", dir, batch, dtype, optim, cur_name());
  if (rf_cli_log_field(log, "\"loss\":", ref, STEPS) == STEPS) return; /* run once, by an earlier W */
  int rc =
      run(out, sizeof out, 1,
          "train --model %s --data %s %s --batch %d --compute-dtype %s --param-dtype %s --optim %s --log %s",
          cur, data, common, batch, dtype, dtype, optim, log);
  RF_CHECK(rc == 0, "reference run (batch %d, %s): rc %d\n%s", batch, dtype, rc, out);
  RF_CHECK(rf_cli_log_field(log, "\"loss\":", ref, STEPS) == STEPS, "reference log of batch %d", batch);
}

static void check_world(const char *layout, const char *shard, int w, const char *dtype, const char *optim) {
  int batch = w == 5 ? 10 : w == 7 ? 14 : 12;
  double ref[STEPS] = {0}, got[STEPS] = {0}, pad[STEPS] = {0}, copy[STEPS] = {0}, allocs[STEPS] = {0};
  reference(batch, dtype, optim, ref);
  char out[16384], log[256];
  snprintf(log, sizeof log, "%s/%s-%s-%d-%s-%s-%s.jsonl", dir, layout, shard, w, dtype, optim, cur_name());
  int rc = run(out, sizeof out, w,
               "train --model %s --data %s %s --batch %d --compute-dtype %s --param-dtype %s --optim %s "
               "--layout %s --shard %s --log %s",
               cur, data, common, batch, dtype, dtype, optim, layout, shard, log);
  RF_CHECK(rc == 0, "%s/%s at W=%d: rc %d\n%s", layout, shard, w, rc, out);
  int m = rf_cli_log_field(log, "\"loss\":", got, STEPS);
  RF_CHECK(m == STEPS, "%s/%s at W=%d: %d steps logged", layout, shard, w, m);
  double worst = 0;
  for (int s = 0; s < m; s++) worst = rf_test_max(worst, fabs(got[s] - ref[s]) / fabs(ref[s]));
  RF_CHECK(worst <= 1e-4, "%s %s/%s at W=%d: loss differs from the one-rank run by %.3g relative", dtype,
           layout, shard, w, worst);
  rf_cli_log_field(log, "\"allocs\":", allocs, STEPS);
  rf_cli_log_field(log, "\"padding_bytes\":", pad, STEPS);
  rf_cli_log_field(log, "\"copy_bytes\":", copy, STEPS);
  int bad = 0;
  for (int s = 1; s < m; s++) bad += allocs[s] != 0;
  RF_CHECK(bad == 0, "%s/%s at W=%d: %d steps after the first allocated", layout, shard, w, bad);
  if (strcmp(shard, "ragged") == 0 && strcmp(optim, "muon") != 0) /* Muon's owner transport moves matrices */
    RF_CHECK(pad[m - 1] == 0 && copy[m - 1] == 0, "planned/ragged at W=%d pads %.0f and copies %.0f bytes", w,
             pad[m - 1], copy[m - 1]);
  printf(
      "%-4s %-9s %-8s %-7s W=%-2d batch %d: max relative loss difference %.2g, padding %.0f B, copies %.0f "
      "B\n",
      dtype, optim, layout, shard, w, batch, worst, pad[m - 1], copy[m - 1]);
}

static void check_invariance(void) {
  static const char *layouts[][2] = {
      {"planned", "ragged"}, {"planned", "equal"}, {"fsdp2", "equal"}, {"flat", "equal"}};
  static const int worlds[] = {2, 3, 4, 5, 6, 7, 12};
  for (int l = 0; l < 4; l++)
    for (int i = 0; i < 7; i++) check_world(layouts[l][0], layouts[l][1], worlds[i], "f32", "adamw");
  check_world("planned", "ragged", 3, "bf16", "adamw");
  check_world("planned", "ragged", 3, "f32", "muon");
  check_world("fsdp2", "equal", 5, "f32", "muon");
  check_world("planned", "ragged", 3, "f32", "adamw8bit");
  cur = qwen;
  check_world("planned", "ragged", 3, "f32", "adamw");
  check_world("fsdp2", "equal", 5, "f32", "muon");
  cur = oss;
  check_world("planned", "ragged", 2, "f32", "adamw");
  check_world("planned", "equal", 3, "f32", "adamw");
  check_world("fsdp2", "equal", 3, "f32", "adamw");
  check_world("flat", "equal", 2, "f32", "adamw");
  check_world("fsdp2", "equal", 3, "f32", "muon");
  cur = dsv3;
  check_world("planned", "ragged", 2, "f32", "adamw");
  check_world("planned", "equal", 3, "f32", "adamw");
  check_world("fsdp2", "equal", 3, "f32", "adamw");
  check_world("flat", "equal", 2, "f32", "adamw");
  check_world("fsdp2", "equal", 3, "f32", "muon");
  check_world("planned", "ragged", 3, "f32", "adamw8bit");
  cur = dsm;
  check_world("planned", "ragged", 2, "f32", "adamw");
  check_world("planned", "equal", 3, "f32", "adamw");
  check_world("fsdp2", "equal", 3, "f32", "adamw");
  check_world("fsdp2", "equal", 2, "f32", "muon");
  cur = model;
}

/* DeepSeek-V3's balancing bias after 4 steps (bias_update_speed 0.01): the same bits in the
 * checkpoints of W = 1 (planned), 2 (planned/ragged), 3 (fsdp2: the bias [8] cut across the
 * ranks), 2 with two micro-batches a step (the loads summed over both), 1 with an evaluation
 * after every step (its forwards' loads must not count: each step's loads start from zero) and
 * 4 as HSDP of 2 replicas (each replica moves its copy of the pieces alike),
 * moved (not zero), each element within 4 steps of 0.01 of its initial zero. */
static void check_bias(void) {
  float bias[6][2][8];
  const char *names[2] = {"model.layers.1.mlp.gate.e_score_correction_bias",
                          "model.layers.2.mlp.gate.e_score_correction_bias"};
  const char *layouts[6] = {
      "--layout planned",           "--layout planned --shard ragged", "--layout fsdp2",
      "--layout planned --accum 2", "--layout planned --eval-every 1", "--layout planned --replicate 2"};
  for (int r = 0; r < 6; r++) {
    int w = r < 3 ? r + 1 : r == 3 ? 2 : r == 4 ? 1 : 4;
    char out[16384], ck[256];
    snprintf(ck, sizeof ck, "%s/bias-%d", dir, r);
    int rc =
        run(out, sizeof out, w, "train --model %s --data %s %s --batch 12 %s --ckpt-dir %s --save-every 4",
            dsm, data, common, layouts[r], ck);
    RF_CHECK(rc == 0, "bias run W=%d: rc %d\n%s", w, rc, out);
    char step[300];
    snprintf(step, sizeof step, "%s/step-00000004", ck);
    struct rf_ckpt c;
    RF_CHECK(rf_ckpt_open(&c, step) == 0, "W=%d: %s", w, rf_error_msg());
    const int64_t shape[1] = {8};
    for (int l = 0; l < 2; l++)
      RF_CHECK(rf_ckpt_read(&c, names[l], RF_DTYPE_F32, 1, shape, 0, 8, bias[r][l]) == 0, "W=%d: %s", w,
               rf_error_msg());
    rf_ckpt_close(&c);
  }
  double moved = 0, worst = 0;
  for (int l = 0; l < 2; l++)
    for (int e = 0; e < 8; e++) {
      moved = rf_test_max(moved, fabs(bias[0][l][e]));
      worst = rf_test_max(worst, fabs(bias[0][l][e]) - 4 * 0.01);
    }
  RF_CHECK(memcmp(bias[0], bias[1], sizeof bias[0]) == 0 && memcmp(bias[0], bias[2], sizeof bias[0]) == 0 &&
               memcmp(bias[0], bias[3], sizeof bias[0]) == 0,
           "the balancing bias differs between W = 1, 2, 3 and W = 2 with two micro-batches");
  RF_CHECK(memcmp(bias[0], bias[4], sizeof bias[0]) == 0,
           "the balancing bias differs with an evaluation after every step (its loads counted)");
  RF_CHECK(memcmp(bias[0], bias[5], sizeof bias[0]) == 0,
           "the balancing bias differs under HSDP (W = 4, 2 replicas)");
  RF_CHECK(moved > 0 && worst <= 1e-6, "the balancing bias moved %g at most, %g past 4 steps of 0.01", moved,
           worst);
  printf(
      "balancing bias after 4 steps: the same bits at W = 1, 2, 3, 2 x 2 micro-batches, with evaluations and "
      "HSDP 2 x 2; "
      "largest |b| %.3g "
      "(layer 1: %+.2f %+.2f "
      "%+.2f %+.2f %+.2f %+.2f %+.2f %+.2f)\n",
      moved, bias[0][0][0], bias[0][0][1], bias[0][0][2], bias[0][0][3], bias[0][0][4], bias[0][0][5],
      bias[0][0][6], bias[0][0][7]);
}

/* 6 uninterrupted steps, and a run resumed at `world2` from that run's checkpoint of step 3 (of the
 * model `cur`). */
static void check_resume(int world, int world2, const char *optim) {
  char out[16384], a[200], b[200], loga[256], logb[256];
  snprintf(a, sizeof a, "%s/full-%s-%s-%d-%d", dir, cur_name(), optim, world, world2);
  snprintf(b, sizeof b, "%s/cut-%s-%s-%d-%d", dir, cur_name(), optim, world, world2);
  snprintf(loga, sizeof loga, "%s.jsonl", a);
  snprintf(logb, sizeof logb, "%s.jsonl", b);
  const char *args = "--batch 6 --seq 8 --lr 3e-3 --seed 11 --peak-gflops 50 --print-every 0 --save-every 3";
  int rc =
      run(out, sizeof out, world, "train --model %s --data %s %s --optim %s --steps 6 --ckpt-dir %s --log %s",
          cur, data, args, optim, a, loga);
  RF_CHECK(rc == 0, "uninterrupted %s W=%d: rc %d\n%s", optim, world, rc, out);
  rc = run(
      out, sizeof out, world2,
      "train --model %s --data %s %s --optim %s --steps 6 --ckpt-dir %s --resume %s/step-00000003 --log %s",
      cur, data, args, optim, b, a, logb);
  RF_CHECK(rc == 0, "resumed %s W=%d->%d: rc %d\n%s", optim, world, world2, rc, out);
  double la[6] = {0}, lb[6] = {0};
  int na = rf_cli_log_field(loga, "\"loss\":", la, 6), nb = rf_cli_log_field(logb, "\"loss\":", lb, 6);
  RF_CHECK(na == 6 && nb == 3, "%s: %d and %d steps logged", optim, na, nb);
  double worst = 0;
  for (int s = 0; s < 3 && nb == 3 && na == 6; s++) worst = rf_test_max(worst, fabs(lb[s] - la[3 + s]));
  if (world == world2) {
    RF_CHECK(worst == 0, "%s W=%d: resumed losses differ by %.3g", optim, world, worst);
    for (int r = 0; r < world; r++) {
      char fa[512], fb[512];
      snprintf(fa, sizeof fa, "%s/step-00000006/rank-%05d.bin", a, r);
      snprintf(fb, sizeof fb, "%s/step-00000006/rank-%05d.bin", b, r);
      RF_CHECK(rf_test_files_equal(fa, fb), "%s W=%d: rank %d's final checkpoint differs", optim, world, r);
    }
  } else {
    RF_CHECK(worst <= 1e-4 * fabs(la[5]), "%s W=%d->%d: resumed losses differ by %.3g", optim, world, world2,
             worst);
  }
  printf("resume %s %-9s W=%d -> W=%d: losses differ by %.2g\n", cur_name(), optim, world, world2, worst);
}

static void write_config(const char *path, int inter, const char *extra) {
  char text[1024];
  int n =
      snprintf(text, sizeof text,
               "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"intermediate_size\": %d, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
               "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
               "\"rope_theta\": 10000.0, \"output_router_logits\": true, \"router_aux_loss_coef\": 0.02%s}\n",
               inter, extra);
  RF_ASSERT(rf_file_write_all(path, text, (size_t)n) == 0);
}

static void expect_refused(int world, const char *what, const char *needle, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void expect_refused(int world, const char *what, const char *needle, const char *fmt, ...) {
  char args[2048], out[16384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  int rc = run(out, sizeof out, world, "%s", args);
  RF_CHECK(rc != 0 && rc != 124 && strstr(out, needle), "%s: rc %d, no '%s' in:\n%s", what, rc, needle, out);
}

static void check_bad_input(void) {
  char bad[256];
  const char *small = "--steps 1 --batch 2 --seq 8 --print-every 0";
  struct {
    const char *extra, *field;
  } cases[] = {{", \"num_local_experts\": 4, \"num_experts_per_tok\": 5", "num_experts_per_tok"},
               {", \"num_local_experts\": 0", "num_local_experts"},
               {"", "num_local_experts"}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(bad, sizeof bad, "%s/bad%zu.json", dir, i);
    write_config(bad, 32, cases[i].extra);
    expect_refused(2, cases[i].field, cases[i].field, "train --model %s --data %s %s", bad, data, small);
  }
  /* --init: experts of 16 (not 32) and a router-less file; both refused by the model */
  char out[16384], narrow[256], ck[256], st[256];
  snprintf(narrow, sizeof narrow, "%s/narrow.json", dir);
  write_config(narrow, 16, ", \"num_local_experts\": 8");
  snprintf(ck, sizeof ck, "%s/narrow-ckpt", dir);
  int rc = run(out, sizeof out, 2, "train --model %s --data %s %s --ckpt-dir %s --save-every 1", narrow, data,
               small, ck);
  RF_CHECK(rc == 0, "narrow run: rc %d\n%s", rc, out);
  snprintf(st, sizeof st, "%s/narrow.safetensors", dir);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s/step-00000001 --out %s", ck, st);
  RF_CHECK(rc == 0, "export: rc %d\n%s", rc, out);
  expect_refused(2, "experts of another shape", "mlp.experts.gate_up_proj",
                 "train --model %s --data %s %s --init %s", model, data, small, st);
  char dense[256];
  snprintf(dense, sizeof dense, "%s/dense.json", dir);
  const char *llama =
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 32, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64}";
  RF_ASSERT(rf_file_write_all(dense, llama, strlen(llama)) == 0);
  snprintf(ck, sizeof ck, "%s/dense-ckpt", dir);
  rc = run(out, sizeof out, 1, "train --model %s --data %s %s --ckpt-dir %s --save-every 1", dense, data,
           small, ck);
  RF_CHECK(rc == 0, "dense run: rc %d\n%s", rc, out);
  snprintf(st, sizeof st, "%s/dense.safetensors", dir);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s/step-00000001 --out %s", ck, st);
  RF_CHECK(rc == 0, "export: rc %d\n%s", rc, out);
  expect_refused(2, "no router", "model.layers.0.mlp.gate.weight", "train --model %s --data %s %s --init %s",
                 model, data, small, st);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], out[8192];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/moe.json", dir);
  rf_cli_write_verses(text, 1 << 18);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  write_config(model, 32, ", \"num_local_experts\": 8, \"num_experts_per_tok\": 2");
  snprintf(qwen, sizeof qwen, "%s/qwen3.json", dir);
  const char *q =
      "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 32, \"intermediate_size\": 48, "
      "\"moe_intermediate_size\": 16, \"num_hidden_layers\": 3, \"num_attention_heads\": 4, "
      "\"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"num_experts\": 8, \"num_experts_per_tok\": 2, "
      "\"norm_topk_prob\": false, \"mlp_only_layers\": [1], \"output_router_logits\": true, "
      "\"router_aux_loss_coef\": 0.02}";
  RF_ASSERT(rf_file_write_all(qwen, q, strlen(q)) == 0);
  snprintf(oss, sizeof oss, "%s/gpt_oss.json", dir);
  const char *o =
      "{\"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"intermediate_size\": 16, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"num_local_experts\": 8, "
      "\"num_experts_per_tok\": 2, \"sliding_window\": 4, \"swiglu_limit\": 0.02, "
      "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, \"factor\": 4.0, "
      "\"truncate\": false, \"original_max_position_embeddings\": 16}, \"output_router_logits\": true, "
      "\"router_aux_loss_coef\": 0.02}";
  RF_ASSERT(rf_file_write_all(oss, o, strlen(o)) == 0);
  snprintf(dsv3, sizeof dsv3, "%s/deepseek_v3.json", dir);
  const char *dk =
      "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 32, \"intermediate_size\": 48, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"q_lora_rank\": 24, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, "
      "\"qk_rope_head_dim\": 6, \"v_head_dim\": 10, \"first_k_dense_replace\": 2, "
      "\"moe_intermediate_size\": 12, \"n_routed_experts\": 4, \"n_shared_experts\": 1, "
      "\"num_experts_per_tok\": 2}";
  RF_ASSERT(rf_file_write_all(dsv3, dk, strlen(dk)) == 0);
  snprintf(dsm, sizeof dsm, "%s/deepseek_v3_moe.json", dir);
  const char *dm =
      "{\"model_type\": \"deepseek_v3\", \"hidden_size\": 32, \"intermediate_size\": 48, "
      "\"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"q_lora_rank\": 24, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, "
      "\"qk_rope_head_dim\": 6, \"v_head_dim\": 10, \"first_k_dense_replace\": 1, "
      "\"moe_intermediate_size\": 12, \"n_routed_experts\": 8, \"n_shared_experts\": 1, "
      "\"num_experts_per_tok\": 2, \"n_group\": 4, \"topk_group\": 2, \"bias_update_speed\": 0.01}";
  RF_ASSERT(rf_file_write_all(dsm, dm, strlen(dm)) == 0);

  check_invariance();
  check_resume(2, 2, "adamw");
  check_resume(3, 3, "adamw8bit");
  check_resume(2, 2, "muon");
  check_resume(2, 3, "adamw");
  cur = dsm; /* DeepSeek-V3's MoE layers: the balancing bias is resumed too */
  check_resume(2, 2, "adamw");
  check_resume(3, 3, "adamw");
  cur = model;
  check_bias();
  check_bad_input();

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_train_moe");
}
