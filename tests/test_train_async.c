/* rf-test: timeout=300
 * `rfsdp train --async-save` (issue 27 item 6) under mpirun, against the same run
 * saving synchronously (the reference: the format and the bytes of a checkpoint
 * do not depend on who writes it):
 *  - W = 2 (AdamW), W = 3 (8-bit AdamW: per-block scales, staged through their
 *    pieces), W = 4 as 2 x 2 HSDP (only the first replica group writes): saved every 2 steps in the
 * background with --keep 2, the series holds exactly the last 2 complete checkpoints and the final one is
 * byte for byte the synchronous run's; resumed from the async run's step 4 (with --async-save), the losses
 * and the final checkpoint are bit-identical to the uninterrupted run;
 *  - a rank killed while its background writer is inside the save of step 4 (the
 *    training thread meanwhile in step 5): step 2 stays the latest complete
 *    checkpoint, the resume takes it and ends bit-identical (W = 2);
 *  - SIGTERM with a save in flight (W = 2): exit 143, the stop's checkpoint
 *    complete and the latest;
 *  - a late snapshot (W = 3, 8-bit AdamW: the writer thread copies the state only
 *    once the next optimizer step is at its fence, RF_TEST_ASYNC_COPY_LATE=1): in
 *    the order of events every step after a save waited for the copy and no copy
 *    ended after that step began; the step-6 and step-8 checkpoints are byte for
 *    byte the synchronous run's, not a later state;
 *  - --async-save without --ckpt-dir is refused with a message. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "rfsdp_run.h"

static char dir[64] = "/tmp/rf_test_train_async.XXXXXX";
static char model[256], data[200];
static const char *run_env = ""; /* extra environment for the next run */

/* Runs `scripts/rfmpirun -np W rfsdp train --model M --data D ARGS` (the common
 * options but --batch); the exit code, output in out. */
static int train(char *out, int out_size, int world, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd,
           "%s OMP_NUM_THREADS=1 timeout 60 scripts/rfmpirun -np %d %s train --model %s --data %s "
           "--seq 16 --lr 3e-3 --seed 11 --peak-gflops 50 --print-every 0 %s 2>&1",
           run_env, world, rf_cli_binary(), model, data, args);
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  size_t n = fread(out, 1, (size_t)out_size - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* Every rank file of SERIES_A/step-S equal to SERIES_B/step-S's. */
static int same_checkpoint(const char *a, const char *b, int64_t step, int world) {
  int same = 1;
  for (int r = 0; r < world && same; r++) {
    char fa[512], fb[512];
    snprintf(fa, sizeof fa, "%s/step-%08lld/rank-%05d.bin", a, (long long)step, r);
    snprintf(fb, sizeof fb, "%s/step-%08lld/rank-%05d.bin", b, (long long)step, r);
    same = rf_test_files_equal(fa, fb);
  }
  return same;
}

/* The complete checkpoints of a series as "2,4,": what --keep left. */
static void series_steps(const char *series, char *out, size_t cap) {
  int64_t *steps = NULL;
  int n = rf_run_series_list(series, &steps);
  size_t k = 0;
  out[0] = 0;
  for (int i = 0; i < n && k + 24 < cap; i++)
    k += (size_t)snprintf(out + k, cap - k, "%lld,", (long long)steps[i]);
  free(steps);
}

/* world ranks; replicate: --replicate R or ""; files: rank files of a checkpoint
 * (the shard group's size: the first replica group writes) */
static void check_async(int world, const char *optim, const char *replicate, int files) {
  char out[16384], sync[200], async[200], cut[200], logs[256], logc[256], have[128];
  const char *name = replicate[0] ? "hsdp" : optim;
  const int failures = rf_test_failures;
  snprintf(sync, sizeof sync, "%s/sync-%s-%d", dir, name, world);
  snprintf(async, sizeof async, "%s/async-%s-%d", dir, name, world);
  snprintf(cut, sizeof cut, "%s/cut-%s-%d", dir, name, world);
  snprintf(logs, sizeof logs, "%s.jsonl", sync);
  snprintf(logc, sizeof logc, "%s.jsonl", cut);
  int rc = train(out, sizeof out, world,
                 "--batch 12 --optim %s %s --steps 8 --save-every 2 --keep 2 --ckpt-dir %s --log %s", optim,
                 replicate, sync, logs);
  RF_CHECK(rc == 0, "%s W=%d synchronous: rc %d\n%s", name, world, rc, out);
  rc = train(out, sizeof out, world,
             "--batch 12 --optim %s %s --steps 8 --save-every 2 --keep 2 --ckpt-dir %s --async-save", optim,
             replicate, async);
  RF_CHECK(rc == 0 && strstr(out, "checkpoint complete: ") && strstr(out, "async save: a staging buffer"),
           "%s W=%d async: rc %d\n%s", name, world, rc, out);
  series_steps(async, have, sizeof have);
  RF_CHECK(strcmp(have, "6,8,") == 0, "%s W=%d: --keep 2 left complete checkpoints %s, expected 6,8,", name,
           world, have);
  RF_CHECK(same_checkpoint(sync, async, 8, files),
           "%s W=%d: the async step-8 checkpoint differs from the sync one", name, world);
  /* resumed from the async run's step 6, saving asynchronously again */
  char from[256];
  snprintf(from, sizeof from, "%s/step-00000006", async);
  rc = train(out, sizeof out, world,
             "--batch 12 --optim %s %s --steps 8 --save-every 2 --keep 2 --ckpt-dir %s --async-save --resume "
             "%s --log %s",
             optim, replicate, cut, from, logc);
  RF_CHECK(rc == 0 && strstr(out, "resumed from"), "%s W=%d resume: rc %d\n%s", name, world, rc, out);
  RF_CHECK(same_checkpoint(sync, cut, 8, files), "%s W=%d: the resumed run's final checkpoint differs", name,
           world);
  double ls[8], lc[8];
  int ns = rf_cli_log_field(logs, "\"loss\":", ls, 8), nc = rf_cli_log_field(logc, "\"loss\":", lc, 8);
  RF_CHECK(ns == 8 && nc == 2, "%s W=%d: %d and %d steps logged", name, world, ns, nc);
  for (int s = 0; s < 2 && ns == 8 && nc == 2; s++)
    RF_CHECK(ls[6 + s] == lc[s], "%s W=%d step %d: loss %.9g resumed, %.9g uninterrupted", name, world, 7 + s,
             lc[s], ls[6 + s]);
  if (rf_test_failures == failures)
    printf("async %-9s W=%d%s: final checkpoint and resumed losses bit-identical to the synchronous run\n",
           optim, world, replicate[0] ? " (2 x 2 HSDP)" : "");
}

/* The writer's copy as late as it can be: only once the next optimizer step is at
 * its fence (RF_TEST_ASYNC_COPY_LATE=1; W = 3, 8-bit AdamW, saves at steps 2, 4,
 * 6, 8). The order of events, as rank 0 counts them: each of the 3 saves followed
 * by a step had that step wait at the fence, and no copy ended after the step
 * that followed its save began; the step-6 and step-8 checkpoints equal the
 * synchronous run's (check_async's). */
static void check_late_copy(void) {
  char out[16384], late[200], sync[200];
  const int failures = rf_test_failures;
  snprintf(late, sizeof late, "%s/late", dir);
  snprintf(sync, sizeof sync, "%s/sync-adamw8bit-3", dir);
  run_env = "RF_TEST_ASYNC_COPY_LATE=1";
  int rc = train(out, sizeof out, 3,
                 "--batch 12 --optim adamw8bit --steps 8 --save-every 2 --keep 2 --ckpt-dir %s --async-save",
                 late);
  run_env = "";
  long long waits = -1, after = -1;
  const char *at = strstr(out, "for the writer's copy (");
  if (at) sscanf(at, "for the writer's copy (%lld steps waited; %lld copies ended after", &waits, &after);
  RF_CHECK(rc == 0, "late copy W=3: rc %d\n%s", rc, out);
  RF_CHECK(waits == 3 && after == 0,
           "late copy W=3: %lld optimizer steps waited for the writer's copy (expected 3: after the saves of "
           "steps 2, 4, 6) and %lld copies ended after the next step began (expected 0)\n%s",
           waits, after, out);
  RF_CHECK(same_checkpoint(sync, late, 6, 3) && same_checkpoint(sync, late, 8, 3),
           "late copy W=3: a checkpoint differs from the synchronous run's\n%s", out);
  if (rf_test_failures == failures)
    printf(
        "async late copy W=3: the steps after 3 saves waited at the fence, no copy ended after the next step "
        "began; checkpoints 6 and 8 equal the synchronous run's\n");
}

/* The last rank dies inside its writer thread's save of step 4 (after writing its
 * files, at the agreement point: RF_TEST_DIE_IN_SAVE), while the training thread
 * runs step 5. */
static void check_kill(int world) {
  char out[16384], c[200], ref[200], have[128];
  snprintf(c, sizeof c, "%s/kill-%d", dir, world);
  snprintf(ref, sizeof ref, "%s/kill-ref-%d", dir, world);
  run_env = "RF_TEST_DIE_IN_SAVE=4";
  int rc = train(out, sizeof out, world,
                 "--batch 6 --steps 6 --save-every 2 --keep 2 --ckpt-dir %s --async-save", c);
  run_env = "";
  RF_CHECK(rc != 0, "W=%d: the run with a dying rank exited %d\n%s", world, rc, out);
  series_steps(c, have, sizeof have);
  RF_CHECK(strcmp(have, "2,") == 0, "W=%d: after the kill the complete checkpoints are %s, expected 2,",
           world, have);
  rc = train(out, sizeof out, world,
             "--batch 6 --steps 6 --save-every 2 --keep 2 --ckpt-dir %s --async-save --resume %s", c, c);
  RF_CHECK(rc == 0 && strstr(out, "step-00000002 at step 2"), "W=%d: resume after the kill: rc %d\n%s", world,
           rc, out);
  rc = train(out, sizeof out, world, "--batch 6 --steps 6 --save-every 2 --ckpt-dir %s", ref);
  RF_CHECK(rc == 0, "W=%d: uninterrupted: rc %d\n%s", world, rc, out);
  RF_CHECK(same_checkpoint(c, ref, 6, world), "W=%d: the step-6 checkpoint after the kill and resume differs",
           world);
  printf("async kill W=%d: step 2 stayed the latest complete; resumed bit-identical\n", world);
}

/* SIGTERM while a save is in flight: the save completes, the stop's checkpoint too. */
static void check_sigterm(void) {
  char c[200], outp[256], log[256], cmd[8192];
  snprintf(c, sizeof c, "%s/term", dir);
  snprintf(outp, sizeof outp, "%s.out", c);
  snprintf(log, sizeof log, "%s.jsonl", c);
  snprintf(
      cmd, sizeof cmd,
      "exec env OMP_NUM_THREADS=1 scripts/rfmpirun -np 2 %s train --model %s --data %s --batch 6 --seq 16 "
      "--lr 3e-3 --warmup 0 --seed 11 --peak-gflops 50 --print-every 0 --steps 1000000 --save-every 1 "
      "--keep 3 --ckpt-dir %s --async-save --log %s >%s 2>&1",
      rf_cli_binary(), model, data, c, log, outp);
  pid_t pid = fork();
  RF_ASSERT(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  double loss[8];
  uint64_t t0 = rf_time_ns();
  while (rf_cli_log_field(log, "\"loss\":", loss, 8) < 3 && rf_time_ns() - t0 < 60000000000ull) usleep(20000);
  kill(pid, SIGTERM);
  int status = 0;
  RF_ASSERT(waitpid(pid, &status, 0) == pid);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  char *text = NULL;
  size_t n = 0;
  if (rf_file_read_all(outp, &text, &n) != 0) text = NULL;
  long long step = -1;
  const char *stop = text ? strstr(text, "stopped by SIGTERM after step ") : NULL;
  if (stop) sscanf(stop, "stopped by SIGTERM after step %lld", &step);
  int64_t *steps = NULL;
  int k = rf_run_series_list(c, &steps);
  RF_CHECK(rc == 143 && step >= 3 && k > 0 && steps[k - 1] == step,
           "SIGTERM with a save in flight: exit %d, stopped after step %lld, latest complete %lld\n%s", rc,
           step, k > 0 ? (long long)steps[k - 1] : -1LL, text ? text : "");
  free(steps);
  free(text);
  printf("async SIGTERM W=2: exit %d after step %lld, its checkpoint complete\n", rc, step);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], out[16384];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  rf_cli_write_verses(text, 1 << 19);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);

  rc = train(out, sizeof out, 1, "--batch 6 --steps 2 --async-save");
  RF_CHECK(rc != 0 && strstr(out, "--async-save needs --ckpt-dir"), "--async-save alone: rc %d\n%s", rc, out);
  check_async(2, "adamw", "", 2);
  check_async(3, "adamw8bit", "", 3);
  check_async(4, "adamw", "--replicate 2", 2);
  check_late_copy();
  check_kill(2);
  check_sigterm();

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_train_async");
}
