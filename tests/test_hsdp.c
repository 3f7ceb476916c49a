/* rf-test: timeout=300
 * Hybrid sharding (`rfsdp train --replicate R`, W = R x S) as a user runs it:
 *  - equivalence: the same run (seed, global batch of 12 sequences, 6 steps) at
 *    2x2 (W=4), 2x3 and 3x2 (W=6) gives the one-rank run's loss at every step
 *    within 1e-4 relative, for AdamW, 8-bit AdamW and Muon, and the gradient's norm
 *    (before clipping) too: a wrong count in the replica sum scales it, while the loss
 *    of Adam and Muon hardly reacts to a uniform gradient scale;
 *  - bytes: the log's inter_bytes is 0 in 1-D FSDP; under HSDP it is, at every
 *    step, the f32 shard slab all-reduced across the replicas (4 x the plan's
 *    max_shard_elems, equal shards) plus the train loop's two scalar all-reduces
 *    on every rank (the loss, 8 bytes; the end-of-step agreement, 4 bytes);
 *  - checkpoints: a 2x2 run saves once per step-4 (S = 2 rank files: one replica
 *    group writes); resumed at W=3 (1-D) and at 3x2 it continues with the
 *    uninterrupted run's losses within 1e-4;
 *  - --reduce-dtype bf16: the replica all-reduce in bf16 at 2x2 and 3x1, its
 *    inter_bytes equal to the plan's (2 bytes per slab element + 12), losses within
 *    1e-4 and the gradient norm within 2e-3 of the one-rank f32 run;
 *  - bad meshes: R not dividing W, R < 1, a word that is no count, auto without
 *    --max-padding or --memory-per-rank, those without auto: refused on every
 *    rank with exit code 2, naming the option;
 *  - --replicate auto at W=4 on the tiny model (its plan pads 0 at S=1 and about
 *    0.1% at S=2; the simulator's memory per rank is about 0.94, 0.67 and 0.53 MB at
 *    S = 1, 2, 4): --max-padding 0 picks 4x1, 1 picks 2x2 (the largest group
 *    meeting it); --memory-per-rank 0.0008 GB picks 2x2, 0.0006 picks 1x4 (the
 *    smallest group that fits), 0.0004 is refused naming the least. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define STEPS 6
#define LIMIT_S 60
static char dir[64] = "/tmp/rf_test_hsdp.XXXXXX";
static const char *common =
    "--batch 12 --seq 16 --lr 3e-3 --warmup 2 --seed 7 --peak-gflops 50 --print-every 0";

/* The plan's max_shard_elems (the log's first line), or -1. */
static double read_plan_shard(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[4096];
  double v = -1;
  if (fgets(line, sizeof line, f)) {
    const char *p = strstr(line, "\"max_shard_elems\":");
    if (p && strstr(line, "\"plan\"")) v = atof(p + strlen("\"max_shard_elems\":"));
  }
  fclose(f);
  return v;
}

/* The one-rank run and the meshes 2x2, 2x3, 3x2 of one optimizer. */
static void check_equivalence(const char *model, const char *data, const char *optim) {
  static const int meshes[][2] = {{2, 2}, {2, 3}, {3, 2}}; /* R x S */
  char out[16384], log[256];
  double ref[STEPS], got[STEPS], inter[STEPS], ref_norm[STEPS], norm[STEPS];
  snprintf(log, sizeof log, "%s/ref-%s.jsonl", dir, optim);
  int rc = rf_cli_run_mpi(out, sizeof out, 1, LIMIT_S,
                          "train --model %s --data %s %s --steps %d --optim %s --log %s", model, data, common,
                          STEPS, optim, log);
  RF_CHECK(rc == 0, "%s one-rank run: rc %d\n%s", optim, rc, out);
  int n = rf_cli_log_field(log, "\"loss\":", ref, STEPS);
  RF_CHECK(n == STEPS && ref[STEPS - 1] < ref[0], "%s one-rank run: %d steps, loss %g -> %g", optim, n,
           ref[0], ref[n > 0 ? n - 1 : 0]);
  RF_CHECK(rf_cli_log_field(log, "\"grad_norm\":", ref_norm, STEPS) == STEPS, "%s one-rank run: grad_norm",
           optim);
  int m = rf_cli_log_field(log, "\"inter_bytes\":", inter, STEPS);
  for (int s = 0; s < m; s++)
    RF_CHECK(inter[s] == 0, "%s W=1 step %d: inter_bytes %g", optim, s + 1, inter[s]);
  for (int k = 0; k < 3; k++) {
    int r = meshes[k][0], w = meshes[k][0] * meshes[k][1];
    snprintf(log, sizeof log, "%s/%s-%dx%d.jsonl", dir, optim, r, meshes[k][1]);
    const char *save = "";
    char ckpt[300] = "";
    if (k == 0 && strcmp(optim, "adamw8bit") == 0) { /* the checkpoint the resume checks start from */
      snprintf(ckpt, sizeof ckpt, "--save-every 4 --ckpt-dir %s/ck-2x2", dir);
      save = ckpt;
    }
    rc = rf_cli_run_mpi(out, sizeof out, w, LIMIT_S,
                        "train --model %s --data %s %s --steps %d --optim %s --replicate %d --log %s %s",
                        model, data, common, STEPS, optim, r, log, save);
    RF_CHECK(rc == 0, "%s %dx%d: rc %d\n%s", optim, r, meshes[k][1], rc, out);
    char banner[64];
    snprintf(banner, sizeof banner, "W=%d (%d x %d)", w, r, meshes[k][1]);
    RF_CHECK(strstr(out, banner) != NULL, "%s: the banner does not say %s\n%s", optim, banner, out);
    m = rf_cli_log_field(log, "\"loss\":", got, STEPS);
    RF_CHECK(m == STEPS, "%s %dx%d: %d steps logged", optim, r, meshes[k][1], m);
    double worst = rf_cli_worst_relative(got, ref, m < n ? m : n);
    RF_CHECK(worst <= 1e-4, "%s %dx%d: loss differs from the one-rank run by %.3g relative", optim, r,
             meshes[k][1], worst);
    /* the gradient itself: its norm (before clipping) scales with any wrong count in the
     * replica sum, which Adam and Muon hardly see in the loss */
    m = rf_cli_log_field(log, "\"grad_norm\":", norm, STEPS);
    RF_CHECK(m == STEPS, "%s %dx%d: %d grad norms logged", optim, r, meshes[k][1], m);
    double worst_norm = rf_cli_worst_relative(norm, ref_norm, m < n ? m : n);
    RF_CHECK(worst_norm <= 1e-6, /* measured at most 2.8e-8 (the reduction order) */
             "%s %dx%d: grad_norm differs from the one-rank run by %.3g relative", optim, r, meshes[k][1],
             worst_norm);
    double slab = read_plan_shard(log);
    m = rf_cli_log_field(log, "\"inter_bytes\":", inter, STEPS);
    RF_CHECK(slab > 0 && m == STEPS, "%s %dx%d: plan shard %g, %d inter_bytes", optim, r, meshes[k][1], slab,
             m);
    for (int s = 0; s < m; s++)
      RF_CHECK(inter[s] == 4 * slab + 12, "%s %dx%d step %d: inter_bytes %.0f, expected 4 x %.0f + 12", optim,
               r, meshes[k][1], s + 1, inter[s], slab);
    printf(
        "%-9s %dx%d  max relative loss difference %.2g, grad_norm %.2g over %d steps; inter_bytes %.0f per "
        "step\n",
        optim, r, meshes[k][1], worst, worst_norm, STEPS, m > 0 ? inter[0] : -1);
  }
}

/* The 2x2 run's step-4 checkpoint (8-bit AdamW) resumed at W=3 and at 3x2. */
static void check_resume(const char *model, const char *data) {
  char out[16384], path[400], log[256];
  double full[STEPS], got[STEPS];
  snprintf(log, sizeof log, "%s/adamw8bit-2x2.jsonl", dir);
  RF_CHECK(rf_cli_log_field(log, "\"loss\":", full, STEPS) == STEPS, "the 2x2 run's log");
  for (int r = 0; r < 4; r++) {
    snprintf(path, sizeof path, "%s/ck-2x2/step-00000004/rank-%05d.bin", dir, r);
    RF_CHECK((access(path, F_OK) == 0) == (r < 2), "2x2 checkpoint: rank file %d %s", r,
             r < 2 ? "missing" : "written (only one replica group of S = 2 writes)");
  }
  static const int meshes[][2] = {{1, 3}, {3, 2}};
  for (int k = 0; k < 2; k++) {
    int r = meshes[k][0], w = r * meshes[k][1];
    snprintf(log, sizeof log, "%s/resumed-%dx%d.jsonl", dir, r, meshes[k][1]);
    int rc = rf_cli_run_mpi(out, sizeof out, w, LIMIT_S,
                            "train --model %s --data %s %s --steps %d --optim adamw8bit --replicate %d "
                            "--resume %s/ck-2x2/step-00000004 --log %s",
                            model, data, common, STEPS, r, dir, log);
    RF_CHECK(rc == 0 && strstr(out, "resumed from"), "resume at %dx%d: rc %d\n%s", r, meshes[k][1], rc, out);
    int m = rf_cli_log_field(log, "\"loss\":", got, STEPS);
    RF_CHECK(m == STEPS - 4, "resume at %dx%d: %d steps logged", r, meshes[k][1], m);
    double worst = rf_cli_worst_relative(got, full + 4, m < STEPS - 4 ? m : STEPS - 4);
    RF_CHECK(worst <= 1e-4, "resume at %dx%d: loss differs from the uninterrupted 2x2 run by %.3g relative",
             r, meshes[k][1], worst);
    printf("resumed 2x2 -> %dx%d  max relative loss difference %.2g\n", r, meshes[k][1], worst);
  }
}

static void check_bad_meshes(const char *model, const char *data) {
  static const struct {
    int world;
    const char *arg, *says;
  } cases[] = {
      {4, "3", "--replicate 3 does not divide the 4 ranks"},
      {3, "0", "--replicate 0: the replica count must be at least 1"},
      {2, "-2", "--replicate -2: the replica count must be at least 1"},
      {2, "two", "--replicate 'two'"},
      {2, "auto", "give --max-padding"},
      {2, "2 --max-padding 1", "choose the shard group of --replicate auto"},
  };
  char out[16384];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = rf_cli_run_mpi(out, sizeof out, cases[i].world, LIMIT_S,
                            "train --model %s --data %s %s --steps 2 --replicate %s", model, data, common,
                            cases[i].arg);
    RF_CHECK(rc == 2 && strstr(out, cases[i].says), "--replicate %s at W=%d: rc %d (want 2)\n%s",
             cases[i].arg, cases[i].world, rc, out);
  }
}

static void check_auto(const char *model, const char *data) {
  static const struct {
    const char *limits, *says;
  } cases[] = {
      {"--max-padding 0", "W=4 (4 x 1)"},
      {"--max-padding 1", "W=4 (2 x 2)"},
      {"--memory-per-rank 0.0008", "W=4 (2 x 2)"},
      {"--memory-per-rank 0.0006", "W=4 (1 x 4)"},
      {"--memory-per-rank 0.0004", "fits --memory-per-rank 0.0004 GB: the least is"},
  };
  char out[16384];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = rf_cli_run_mpi(out, sizeof out, 4, LIMIT_S,
                            "train --model %s --data %s %s --steps 2 --replicate auto %s", model, data,
                            common, cases[i].limits);
    int refused = strstr(cases[i].says, "fits") != NULL;
    RF_CHECK((refused ? rc == 1 : rc == 0) && strstr(out, cases[i].says), "--replicate auto %s: rc %d\n%s",
             cases[i].limits, rc, out);
  }
}

/* --reduce-dtype bf16 under HSDP: the replica all-reduce carries the gradient shard
 * in bf16 (2 bytes per element of the slab, + the 12 scalar bytes), which is what
 * `rfsdp plan --reduce-dtype bf16` predicts, exactly; at 2x2 (W=4) and 3x1 (W=3,
 * --replicate 3) the losses stay within 1e-4 relative of the one-rank f32 run and
 * the gradient norm within 2e-3: each element is rounded to bf16 (relative error at
 * most 2^-9) in the reduce-scatter and again in every partial sum of the
 * all-reduce; measured at most 1.2e-5 (loss) and 5e-4 (norm). A replica sum that
 * counted a group twice or not at all would move the norm by 41% or more. */
static void check_bf16_across(const char *model, const char *data) {
  static const int meshes[][2] = {{2, 2}, {3, 1}}; /* R x S */
  char out[16384], log[256];
  double ref[STEPS], ref_norm[STEPS], got[STEPS], norm[STEPS], inter[STEPS];
  snprintf(log, sizeof log, "%s/bf16-ref.jsonl", dir);
  int rc = rf_cli_run_mpi(out, sizeof out, 1, LIMIT_S, "train --model %s --data %s %s --steps %d --log %s",
                          model, data, common, STEPS, log);
  RF_CHECK(rc == 0, "bf16: the one-rank f32 run: rc %d\n%s", rc, out);
  RF_CHECK(rf_cli_log_field(log, "\"loss\":", ref, STEPS) == STEPS &&
               rf_cli_log_field(log, "\"grad_norm\":", ref_norm, STEPS) == STEPS,
           "bf16: the one-rank run's log");
  for (int k = 0; k < 2; k++) {
    int r = meshes[k][0], w = meshes[k][0] * meshes[k][1];
    snprintf(log, sizeof log, "%s/bf16-%dx%d.jsonl", dir, r, meshes[k][1]);
    rc =
        rf_cli_run_mpi(out, sizeof out, w, LIMIT_S,
                       "train --model %s --data %s %s --steps %d --replicate %d --reduce-dtype bf16 --log %s",
                       model, data, common, STEPS, r, log);
    RF_CHECK(rc == 0, "bf16 %dx%d: rc %d\n%s", r, meshes[k][1], rc, out);
    int m = rf_cli_log_field(log, "\"loss\":", got, STEPS);
    int mn = rf_cli_log_field(log, "\"grad_norm\":", norm, STEPS);
    int mi = rf_cli_log_field(log, "\"inter_bytes\":", inter, STEPS);
    RF_CHECK(m == STEPS && mn == STEPS && mi == STEPS, "bf16 %dx%d: %d losses, %d norms, %d inter_bytes", r,
             meshes[k][1], m, mn, mi);
    if (m != STEPS || mn != STEPS || mi != STEPS) continue;
    double worst = rf_cli_worst_relative(got, ref, STEPS),
           worst_norm = rf_cli_worst_relative(norm, ref_norm, STEPS);
    RF_CHECK(worst <= 1e-4, "bf16 %dx%d: loss differs from the one-rank f32 run by %.3g relative", r,
             meshes[k][1], worst);
    RF_CHECK(worst_norm <= 2e-3, "bf16 %dx%d: grad_norm differs from the one-rank f32 run by %.3g relative",
             r, meshes[k][1], worst_norm);
    double slab = read_plan_shard(log), plan = -1;
    rc =
        rf_cli_run(out, sizeof out,
                   "plan --model %s --world %d --replicate %d --batch 12 --seq 16 --reduce-dtype bf16 --json",
                   model, w, r);
    cJSON *o = rc == 0 ? cJSON_Parse(out) : NULL;
    if (o) plan = rf_cli_json_num(o, "bytes_per_step_inter");
    cJSON_Delete(o);
    for (int s = 0; s < STEPS; s++)
      RF_CHECK(inter[s] == 2 * slab + 12 && inter[s] == plan,
               "bf16 %dx%d step %d: inter_bytes %.0f, expected 2 x %.0f + 12 and the plan's %.0f", r,
               meshes[k][1], s + 1, inter[s], slab, plan);
    printf(
        "bf16 replica all-reduce %dx%d: loss within %.2g, grad_norm within %.2g of the one-rank f32 run; "
        "inter_bytes %.0f per step (= plan)\n",
        r, meshes[k][1], worst, worst_norm, inter[0]);
  }
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char data[200], model[256], out[8192];
  int rc = rf_cli_setup_tiny(dir, 1 << 17, data, sizeof data, model, sizeof model, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: %s", out);

  check_bad_meshes(model, data);
  check_auto(model, data);
  check_equivalence(model, data, "adamw");
  check_equivalence(model, data, "adamw8bit");
  check_equivalence(model, data, "muon");
  check_resume(model, data);
  check_bf16_across(model, data);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_hsdp");
}
