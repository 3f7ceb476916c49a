/* rf-test: timeout=600
 * `rfsdp train` as a user runs it, under mpirun:
 *  - equivalence: the same run (seed, global batch, 30 steps) at W = 1, 2, 3 gives
 *    the same loss at every step within 1e-4 relative, for the planned layout
 *    (equal and ragged shards), fsdp2 and flat; the reference is the one-rank run;
 *    in f32, and in bf16 (--compute-dtype bf16 --param-dtype bf16) against the
 *    one-rank bf16 run; no step after the first allocates (the log's "allocs":
 *    the GEMM primitives are created in the first step and cached);
 *  - resume: a run stopped at a checkpoint and resumed ends bit-identical to the
 *    uninterrupted run (every rank file of the final checkpoints, and the log's
 *    losses), at W = 2 (AdamW, Muon, Shampoo) and W = 3 (8-bit AdamW); Shampoo
 *    saved at W = 3 (its factors and roots on each matrix's owner) and resumed at
 *    W = 2 follows the W = 3 run's losses within 1e-4 (the runs' equivalence
 *    across W; tests/test_optim_shampoo.c checks the optimizer alone bit-exact);
 *  - a rank killed inside a save: the partial checkpoint is ignored, the run
 *    resumes from the previous one and ends bit-identical;
 *  - preemption: SIGTERM (W = 1, 2, 3) or SIGINT (W = 2) to the launcher stops
 *    every rank after the same step, saves into --ckpt-dir, exits 143 / 130; the
 *    run resumed from it ends bit-identical to an uninterrupted one;
 *  - a used --ckpt-dir (W = 1, 2, 3): refused without --resume (nothing in it
 *    changes), refused when resuming an older step of it, and resumed from it
 *    --keep bounds the folder (the series' earlier checkpoints count as this run's);
 *  - bad input: a missing or truncated token file, inconsistent head counts, a
 *    batch not divisible into the ranks, a checkpoint of another optimizer,
 *    --shampoo-block 0: each
 *    fails with a message naming the problem. */
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "rfsdp_run.h"

#define STEPS 30
static char dir[64] = "/tmp/rf_test_train.XXXXXX";
static const char *run_env = ""; /* extra environment for the next runs */

/* Runs `scripts/rfmpirun -np W rfsdp ARGS`; returns the exit code, output in out. */
static int run_mpi(char *out, int out_size, int world, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s OMP_NUM_THREADS=1 scripts/rfmpirun -np %d %s %s 2>&1", run_env, world,
           rf_cli_binary(), args);
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  size_t n = fread(out, 1, (size_t)out_size - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static int read_losses(const char *path, double *loss, int cap) {
  return rf_cli_log_field(path, "\"loss\":", loss, cap);
}

/* Steps after the first that allocated (the log's "allocs"). */
static int allocating_steps(const char *path) {
  double a[STEPS];
  int n = rf_cli_log_field(path, "\"allocs\":", a, STEPS), bad = 0;
  for (int s = 1; s < n; s++) bad += a[s] != 0;
  return n > 1 ? bad : -1;
}

static const char *common =
    "--steps 30 --batch 6 --seq 16 --lr 3e-3 --warmup 3 --seed 7 --peak-gflops 50 --print-every 0";

/* dtype: "f32" or "bf16" (compute and gathered parameters). */
static void check_equivalence(const char *model, const char *data, const char *dtype) {
  static const char *layouts[][2] = {
      {"planned", "equal"}, {"planned", "ragged"}, {"fsdp2", "equal"}, {"flat", "equal"}};
  char out[16384], log[256], args[512];
  double ref[STEPS], got[STEPS];
  snprintf(args, sizeof args, "%s --compute-dtype %s --param-dtype %s", common, dtype, dtype);
  snprintf(log, sizeof log, "%s/ref-%s.jsonl", dir, dtype);
  int rc = run_mpi(out, sizeof out, 1, "train --model %s --data %s %s --log %s", model, data, args, log);
  RF_CHECK(rc == 0, "reference run: rc %d\n%s", rc, out);
  int n = read_losses(log, ref, STEPS);
  RF_CHECK(n == STEPS, "reference log has %d steps", n);
  RF_CHECK(n == STEPS && ref[STEPS - 1] < ref[0] - 0.5, "the loss does not fall: %g -> %g", ref[0],
           ref[n - 1]);
  for (int w = 1; w <= 3; w++)
    for (int l = 0; l < 4; l++) {
      if (w == 1 && l == 0) continue;
      snprintf(log, sizeof log, "%s/%s-%s-%s-%d.jsonl", dir, dtype, layouts[l][0], layouts[l][1], w);
      rc = run_mpi(out, sizeof out, w, "train --model %s --data %s %s --layout %s --shard %s --log %s", model,
                   data, args, layouts[l][0], layouts[l][1], log);
      RF_CHECK(rc == 0, "%s/%s at W=%d: rc %d\n%s", layouts[l][0], layouts[l][1], w, rc, out);
      int m = read_losses(log, got, STEPS);
      RF_CHECK(m == STEPS, "%s/%s at W=%d: %d steps logged", layouts[l][0], layouts[l][1], w, m);
      double worst = 0;
      for (int s = 0; s < m && s < n; s++) worst = rf_test_max(worst, fabs(got[s] - ref[s]) / fabs(ref[s]));
      RF_CHECK(worst <= 1e-4, "%s %s/%s at W=%d: loss differs from the one-rank run by %.3g relative", dtype,
               layouts[l][0], layouts[l][1], w, worst);
      int allocs = allocating_steps(log);
      RF_CHECK(allocs == 0, "%s %s/%s at W=%d: %d steps after the first allocated", dtype, layouts[l][0],
               layouts[l][1], w, allocs);
      printf("%-4s %-8s %-7s W=%d  max relative loss difference %.2g over %d steps\n", dtype, layouts[l][0],
             layouts[l][1], w, worst, m);
    }
}

/* 8 uninterrupted steps, and a run resumed from that run's checkpoint of step 4:
 * identical final checkpoints and losses. */
static void check_resume(const char *model, const char *data, int world, const char *optim) {
  char out[16384], a[200], b[200], fa[512], fb[512], loga[256], logb[256];
  snprintf(a, sizeof a, "%s/full-%s-%d", dir, optim, world);
  snprintf(b, sizeof b, "%s/cut-%s-%d", dir, optim, world);
  snprintf(loga, sizeof loga, "%s.jsonl", a);
  snprintf(logb, sizeof logb, "%s.jsonl", b);
  const char *args = "--batch 6 --seq 16 --lr 3e-3 --seed 11 --peak-gflops 50 --print-every 0 --save-every 4";
  int rc = run_mpi(out, sizeof out, world,
                   "train --model %s --data %s %s --optim %s --steps 8 --ckpt-dir %s --log %s", model, data,
                   args, optim, a, loga);
  RF_CHECK(rc == 0, "uninterrupted %s W=%d: rc %d\n%s", optim, world, rc, out);
  char half[256];
  snprintf(half, sizeof half, "%s/step-00000004", a);
  rc = run_mpi(out, sizeof out, world,
               "train --model %s --data %s %s --optim %s --steps 8 --ckpt-dir %s --resume %s --log %s", model,
               data, args, optim, b, half, logb);
  RF_CHECK(rc == 0 && strstr(out, "resumed from"), "resumed %s W=%d: rc %d\n%s", optim, world, rc, out);
  for (int r = 0; r < world; r++) {
    snprintf(fa, sizeof fa, "%s/step-00000008/rank-%05d.bin", a, r);
    snprintf(fb, sizeof fb, "%s/step-00000008/rank-%05d.bin", b, r);
    RF_CHECK(rf_test_files_equal(fa, fb), "%s W=%d: rank %d's final checkpoint differs after resume", optim,
             world, r);
  }
  double la[8], lb[8];
  int na = read_losses(loga, la, 8), nb = read_losses(logb, lb, 8);
  RF_CHECK(na == 8 && nb == 4, "%s W=%d: %d and %d steps logged", optim, world, na, nb);
  for (int s = 0; s < 4 && nb == 4 && na == 8; s++)
    RF_CHECK(la[4 + s] == lb[s], "%s W=%d step %d: loss %.9g resumed, %.9g uninterrupted", optim, world,
             5 + s, lb[s], la[4 + s]);
  if (strcmp(optim, "adamw") == 0) {
    rc = run_mpi(out, sizeof out, world,
                 "train --model %s --data %s %s --optim muon --steps 8 --ckpt-dir %s --resume %s", model,
                 data, args, b, a);
    RF_CHECK(rc != 0 && strstr(out, "optimizer"), "resume with another optimizer: rc %d\n%s", rc, out);
  }
}

static void check_reshard_shampoo(const char *model, const char *data) {
  char out[16384], a[200], b[200], loga[256], logb[256], half[256];
  snprintf(a, sizeof a, "%s/shampoo-3", dir);
  snprintf(b, sizeof b, "%s/shampoo-3-2", dir);
  snprintf(loga, sizeof loga, "%s.jsonl", a);
  snprintf(logb, sizeof logb, "%s.jsonl", b);
  snprintf(half, sizeof half, "%s/step-00000004", a);
  const char *args =
      "--batch 6 --seq 16 --lr 3e-3 --seed 11 --peak-gflops 50 --print-every 0 --save-every 4 "
      "--optim shampoo --shampoo-every 3 --steps 8";
  int rc = run_mpi(out, sizeof out, 3, "train --model %s --data %s %s --ckpt-dir %s --log %s", model, data,
                   args, a, loga);
  RF_CHECK(rc == 0, "shampoo W=3: rc %d\n%s", rc, out);
  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s --ckpt-dir %s --resume %s --log %s", model,
               data, args, b, half, logb);
  RF_CHECK(rc == 0 && strstr(out, "resumed from"), "shampoo resumed at W=2: rc %d\n%s", rc, out);
  double la[8], lb[8];
  int na = read_losses(loga, la, 8), nb = read_losses(logb, lb, 8);
  RF_CHECK(na == 8 && nb == 4, "shampoo 3 -> 2: %d and %d steps logged", na, nb);
  for (int s = 0; s < 4 && nb == 4 && na == 8; s++)
    RF_CHECK(rf_test_close(lb[s], la[4 + s], 1e-4, 0),
             "shampoo 3 -> 2, step %d: loss %.9g resumed, %.9g at W=3", 5 + s, lb[s], la[4 + s]);
}

/* The last rank dies inside the save of step 4 (after writing its files, before
 * the marker): the partial checkpoint is not complete, --resume takes step 2, and
 * the resumed run ends identical to an uninterrupted one. */
static void check_crash(const char *model, const char *data) {
  char out[16384], c[200], ref[200], fa[512], fb[512];
  snprintf(c, sizeof c, "%s/crash", dir);
  snprintf(ref, sizeof ref, "%s/crash-ref", dir);
  const char *args =
      "--batch 6 --seq 16 --lr 3e-3 --seed 5 --peak-gflops 50 --print-every 0 --save-every 2 --keep 5";
  run_env = "RF_TEST_DIE_IN_SAVE=4";
  int rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s --steps 6 --ckpt-dir %s", model, data,
                   args, c);
  run_env = "";
  RF_CHECK(rc != 0, "the run with a dying rank exited %d", rc);
  snprintf(fa, sizeof fa, "%s/step-00000002/COMPLETE", c);
  snprintf(fb, sizeof fb, "%s/step-00000004/COMPLETE", c);
  RF_CHECK(access(fa, F_OK) == 0 && access(fb, F_OK) != 0, "after the crash: step 2 complete, step 4 not");
  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s --steps 6 --ckpt-dir %s --resume %s", model,
               data, args, c, c);
  RF_CHECK(rc == 0 && strstr(out, "step-00000002 at step 2"), "resume after the crash: rc %d\n%s", rc, out);
  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s --steps 6 --ckpt-dir %s", model, data, args,
               ref);
  RF_CHECK(rc == 0, "uninterrupted: rc %d\n%s", rc, out);
  for (int r = 0; r < 2; r++) {
    snprintf(fa, sizeof fa, "%s/step-00000006/rank-%05d.bin", c, r);
    snprintf(fb, sizeof fb, "%s/step-00000006/rank-%05d.bin", ref, r);
    RF_CHECK(rf_test_files_equal(fa, fb), "rank %d's step-6 checkpoint differs from the uninterrupted run",
             r);
  }
}

/* s in single quotes for the shell of popen ('\\'' for each quote). */
static void shell_quote(char *out, size_t cap, const char *s) {
  size_t n = 0;
  out[n++] = '\'';
  for (; *s && n + 6 < cap; s++) {
    if (*s == '\'') {
      memcpy(out + n, "'\\''", 4);
      n += 4;
    } else {
      out[n++] = *s;
    }
  }
  out[n++] = '\'';
  out[n] = 0;
}

/* --plot and --log with quotes, a $(...) and spaces in their paths: gnuplot gets
 * them as arguments, never through a shell or its own parser, and the PNG appears
 * under exactly that name. */
static void check_plot(const char *model, const char *data) {
  char out[16384], sub[256], log[512], png[512], canary[512];
  snprintf(sub, sizeof sub, "%s/it's \"odd\" $(touch canary)", dir);
  RF_ASSERT(mkdir(sub, 0755) == 0);
  snprintf(log, sizeof log, "%s/log.jsonl", sub);
  snprintf(png, sizeof png, "%s/loss' ; x.png", sub);
  snprintf(canary, sizeof canary, "%s/canary", dir);
  char quoted_log[1024], quoted_png[1024];
  shell_quote(quoted_log, sizeof quoted_log, log);
  shell_quote(quoted_png, sizeof quoted_png, png);
  int rc =
      run_mpi(out, sizeof out, 1,
              "train --model %s --data %s --steps 3 --batch 6 --seq 16 --peak-gflops 50 --log %s --plot %s",
              model, data, quoted_log, quoted_png);
  RF_CHECK(rc == 0 && strstr(out, "loss curve:"), "--plot with odd characters: rc %d\n%s", rc, out);
  RF_CHECK(access(png, F_OK) == 0, "no loss curve at %s\n%s", png, out);
  RF_CHECK(access(canary, F_OK) != 0 && access("canary", F_OK) != 0, "a $(...) in the --plot path was run");
}

/* Starts `scripts/rfmpirun -np W rfsdp ARGS` in the background, its output into
 * `out_path`; returns the pid (the launcher's: sh execs it). */
static pid_t spawn_mpi(const char *out_path, int world, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd,
           "exec env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 scripts/rfmpirun -np %d %s %s >%s 2>&1", world,
           rf_cli_binary(), args, out_path);
  pid_t pid = fork();
  RF_ASSERT(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* Steps logged so far (the log's lines with a loss; its first line is the plan). */
static int count_steps(const char *path) {
  double loss[16];
  return read_losses(path, loss, 16);
}

/* Preemption (issue 12 item 3): a run of "endless" steps gets `sig` once its log
 * shows 3 steps; every rank stops after the same step, saves a checkpoint into
 * --ckpt-dir and the job exits 128 + sig. Resumed to 3 more steps, it ends
 * bit-identical to an uninterrupted run of that many steps (constant learning
 * rate: --warmup 0 --min-lr-ratio 1, so --steps does not change the schedule; --save-every
 * 1000 saves at the last step only). */
static void check_preempt(const char *model, const char *data, int world, int sig) {
  char out[16384], cut[200], ref[200], log[256], outp[256], fa[512], fb[512];
  const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  snprintf(cut, sizeof cut, "%s/preempt-%s-%d", dir, name, world);
  snprintf(ref, sizeof ref, "%s/preempt-ref-%s-%d", dir, name, world);
  snprintf(log, sizeof log, "%s.jsonl", cut);
  snprintf(outp, sizeof outp, "%s.out", cut);
  const char *args =
      "--batch 6 --seq 16 --lr 3e-3 --warmup 0 --min-lr-ratio 1 --seed 13 --peak-gflops 50 --print-every 0 "
      "--save-every 1000";
  pid_t pid = spawn_mpi(outp, world, "train --model %s --data %s %s --steps 1000000 --ckpt-dir %s --log %s",
                        model, data, args, cut, log);
  uint64_t t0 = rf_time_ns();
  while (count_steps(log) < 3 && rf_time_ns() - t0 < 60000000000ull) usleep(20000);
  RF_CHECK(count_steps(log) >= 3, "%s W=%d: the run did not log 3 steps in 60 s", name, world);
  kill(pid, sig);
  int status = 0;
  RF_ASSERT(waitpid(pid, &status, 0) == pid);
  double seconds = (double)(rf_time_ns() - t0) / 1e9;
  char *text = NULL;
  size_t n = 0;
  if (rf_file_read_all(outp, &text, &n) != 0) text = NULL;
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  RF_CHECK(rc == 128 + sig, "%s W=%d: exit %d, expected %d\n%s", name, world, rc, 128 + sig,
           text ? text : "");
  /* the step it stopped after: from rank 0's message, or (MPICH's launcher may stop
   * relaying output after a Ctrl-C) from the checkpoint it saved */
  const char *stop = text ? strstr(text, "stopped by ") : NULL;
  long long step = 0;
  if (!stop || sscanf(stop, "stopped by %*s after step %lld", &step) != 1) {
    int64_t *steps = NULL;
    int n = rf_run_series_list(cut, &steps);
    step = n > 0 ? (long long)steps[n - 1] : 0;
    free(steps);
  }
  RF_CHECK(sig == SIGINT || stop, "%s W=%d: no 'stopped by' message\n%s", name, world, text ? text : "");
  RF_CHECK(step >= 3, "%s W=%d: no 'stopped by ... after step N' and no checkpoint\n%s", name, world,
           text ? text : "");
  free(text);
  if (step < 3) return;
  printf("%-7s W=%d: stopped after step %lld, exit %d, %.1f s from start\n", name, world, step, rc, seconds);
  rc = run_mpi(out, sizeof out, world, "train --model %s --data %s %s --steps %lld --ckpt-dir %s --resume %s",
               model, data, args, step + 3, cut, cut);
  RF_CHECK(rc == 0 && strstr(out, "resumed from"), "%s W=%d: resume: rc %d\n%s", name, world, rc, out);
  rc = run_mpi(out, sizeof out, world, "train --model %s --data %s %s --steps %lld --ckpt-dir %s", model,
               data, args, step + 3, ref);
  RF_CHECK(rc == 0, "%s W=%d: uninterrupted: rc %d\n%s", name, world, rc, out);
  for (int r = 0; r < world; r++) {
    snprintf(fa, sizeof fa, "%s/step-%08lld/rank-%05d.bin", cut, step + 3, r);
    snprintf(fb, sizeof fb, "%s/step-%08lld/rank-%05d.bin", ref, step + 3, r);
    RF_CHECK(rf_test_files_equal(fa, fb), "%s W=%d: rank %d's checkpoint after the resume differs", name,
             world, r);
  }
}

/* A used --ckpt-dir (issue 12 item 5): without --resume the run is refused at
 * once, naming the folder and both ways out, and nothing in it changes; with
 * --resume it continues, and --keep removes only checkpoints of this run (the
 * resumed series' included: --keep bounds the folder across resumes);
 * resuming an older step of the folder (whose later steps would be overwritten)
 * is refused. */
static void check_used_dir(const char *model, const char *data, int world) {
  char out[16384], used[200], path[512], copy[512];
  snprintf(used, sizeof used, "%s/used-%d", dir, world);
  const char *args = "--batch 6 --seq 16 --lr 3e-3 --seed 3 --peak-gflops 50 --print-every 0 --save-every 1";
  int rc = run_mpi(out, sizeof out, world, "train --model %s --data %s %s --steps 2 --keep 5 --ckpt-dir %s",
                   model, data, args, used);
  RF_CHECK(rc == 0, "W=%d: first run: rc %d\n%s", world, rc, out);
  snprintf(path, sizeof path, "%s/step-00000002/rank-00000.bin", used);
  char *before = NULL;
  size_t nb = 0;
  RF_ASSERT(rf_file_read_all(path, &before, &nb) == 0);
  char refused_log[256];
  snprintf(refused_log, sizeof refused_log, "%s/refused-%d.jsonl", dir, world);
  rc = run_mpi(out, sizeof out, world, "train --model %s --data %s %s --steps 4 --ckpt-dir %s --log %s",
               model, data, args, used, refused_log);
  RF_CHECK(rc != 0 && strstr(out, used) && strstr(out, "--resume") && strstr(out, "another --ckpt-dir"),
           "W=%d: a used --ckpt-dir without --resume: rc %d\n%s", world, rc, out);
  /* at once: before the first step (the order of events, not a duration) */
  RF_CHECK(count_steps(refused_log) == 0, "W=%d: the refused run trained %d steps first", world,
           count_steps(refused_log));
  char *after = NULL;
  size_t na = 0;
  RF_CHECK(rf_file_read_all(path, &after, &na) == 0 && na == nb && memcmp(before, after, nb) == 0,
           "W=%d: the refused run changed %s", world, path);
  free(after);
  free(before);
  for (int s = 1; s <= 2; s++) {
    snprintf(path, sizeof path, "%s/step-%08d/COMPLETE", used, s);
    RF_CHECK(access(path, F_OK) == 0, "W=%d: the refused run removed step %d", world, s);
  }
  snprintf(copy, sizeof copy, "%s/step-00000001", used);
  rc = run_mpi(out, sizeof out, world, "train --model %s --data %s %s --steps 4 --ckpt-dir %s --resume %s",
               model, data, args, used, copy);
  RF_CHECK(rc != 0 && strstr(out, "step-00000002"), "W=%d: resuming step 1 under a later step 2: rc %d\n%s",
           world, rc, out);
  rc = run_mpi(out, sizeof out, world,
               "train --model %s --data %s %s --steps 4 --keep 1 --ckpt-dir %s --resume %s", model, data,
               args, used, used);
  RF_CHECK(rc == 0 && strstr(out, "step-00000002 at step 2"), "W=%d: resume: rc %d\n%s", world, rc, out);
  /* resumed from this folder: its checkpoints are the same run's, so --keep 1 bounds the folder across the
   * resume (issue 29 item 8: each preempt/resume cycle added up to --keep more) */
  static const int expect[5] = {0, 0, 0, 0, 1};
  for (int s = 1; s <= 4; s++) {
    snprintf(path, sizeof path, "%s/step-%08d/COMPLETE", used, s);
    RF_CHECK((access(path, F_OK) == 0) == expect[s], "W=%d: step %d %s after the resumed run with --keep 1",
             world, s, expect[s] ? "missing" : "still there");
  }
}

static void check_bad_input(const char *model, const char *data) {
  char out[16384], path[300], bad_model[256];
  int rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s/none %s", model, dir, common);
  RF_CHECK(rc != 0 && strstr(out, "none.train.tok"), "missing token file: rc %d\n%s", rc, out);

  /* a truncated token file */
  snprintf(path, sizeof path, "%s.train.tok", data);
  char *bytes;
  size_t n;
  RF_ASSERT(rf_file_read_all(path, &bytes, &n) == 0);
  char trunc[200];
  snprintf(trunc, sizeof trunc, "%s/trunc", dir);
  snprintf(path, sizeof path, "%s.train.tok", trunc);
  RF_ASSERT(rf_file_write_all(path, bytes, n - 1000) == 0);
  free(bytes);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp %s.val.tok %s.val.tok && cp %s.tokenizer.json %s.tokenizer.json", data, trunc,
           data, trunc);
  RF_ASSERT(system(cmd) == 0);
  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s", model, trunc, common);
  RF_CHECK(rc != 0 && strstr(out, "trunc.train.tok") && strstr(out, "truncated"),
           "truncated token file: rc %d\n%s", rc, out);

  snprintf(bad_model, sizeof bad_model, "%s/bad.json", dir);
  const char *bad =
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 5, \"num_key_value_heads\": 1, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64}";
  RF_ASSERT(rf_file_write_all(bad_model, bad, strlen(bad)) == 0);
  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s %s", bad_model, data, common);
  RF_CHECK(rc != 0 && strstr(out, "bad.json") && strstr(out, "num_attention_heads"),
           "inconsistent heads: rc %d\n%s", rc, out);

  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s --optim shampoo --shampoo-block 0 %s", model,
               data, common);
  RF_CHECK(rc != 0 && strstr(out, "--shampoo-block 0"), "--shampoo-block 0: rc %d\n%s", rc, out);

  rc = run_mpi(out, sizeof out, 2, "train --model %s --data %s --steps 2 --batch 5 --seq 16", model, data);
  RF_CHECK(rc != 0 && strstr(out, "--batch 5 is not divisible"), "batch 5 on 2 ranks: rc %d\n%s", rc, out);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], data[200], model[256], out[8192];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  rf_cli_write_verses(text, 1 << 20);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);

  check_equivalence(model, data, "f32");
  check_equivalence(model, data, "bf16");
  check_resume(model, data, 2, "adamw");
  check_resume(model, data, 3, "adamw8bit");
  check_resume(model, data, 2, "muon");
  check_resume(model, data, 2, "shampoo");
  check_reshard_shampoo(model, data);
  check_crash(model, data);
  check_plot(model, data);
  for (int w = 1; w <= 3; w++) {
    check_preempt(model, data, w, SIGTERM);
    check_used_dir(model, data, w);
  }
  check_preempt(model, data, 2, SIGINT);
  check_bad_input(model, data);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_train");
}
