/* rf-test: timeout=300
 * Elastic relaunch (issue 37, item 3: a lost rank no longer ends the training):
 * `scripts/rfmpirun --restarts N` starts an `rfsdp train` job that ended on a rank
 * failure again from the latest complete checkpoint of its --ckpt-dir, on as many
 * ranks, with the same global batch (scripts/elastic.sh):
 *  - W = 2, one rank (not rank 0) killed with SIGKILL mid-run: the job reaches
 *    --steps with exit 0; each step's loss (its last logged value) equal within 1e-5
 *    to an uninterrupted W = 2 run's; at most --save-every steps logged twice
 *    (recomputed); the restart said what failed, where it resumed and on how many
 *    ranks, and the time from the fault to the next logged step;
 *  - a job that fails otherwise (a usage error) is not restarted. */
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define STEPS 3000
#define SAVE_EVERY 50
static char dir[64] = "/tmp/rf_test_elastic.XXXXXX";
static char model[256], data[256];
static const char *common =
    "--batch 4 --seq 16 --lr 3e-3 --warmup 0 --seed 5 --peak-gflops 50 --print-every 0";

/* A rank of the job writing into `ck` other than rank 0 (the lock's PID): a process
 * started as the rfsdp binary with `ck` on its command line; 0 when none. */
static long other_rank(const char *ck) {
  char lock[512], *text = NULL;
  size_t n;
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  long rank0 = 0;
  if (rf_file_read_all(lock, &text, &n) == 0 && strstr(text, "\npid "))
    rank0 = atol(strstr(text, "\npid ") + 5);
  free(text);
  DIR *d = opendir("/proc");
  RF_ASSERT(d);
  long found = 0;
  struct dirent *e;
  while (!found && (e = readdir(d))) {
    long pid = atol(e->d_name);
    if (pid <= 0 || pid == rank0) continue;
    char path[300], cmd[4096];
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t len = fread(cmd, 1, sizeof cmd - 1, f);
    fclose(f);
    cmd[len] = 0;
    size_t first = strlen(cmd); /* argv[0] ends there */
    for (size_t i = first + 1; i < len; i++)
      if (cmd[i] == 0) cmd[i] = ' ';
    if (first + 1 < len && strstr(cmd, "rfsdp") && strncmp(cmd + first + 1, "train ", 6) == 0 &&
        strstr(cmd + first + 1, ck))
      found = pid;
  }
  closedir(d);
  return found;
}

static void check_rank_killed(void) {
  char ck[256], log[256], ref_log[256], outp[256], out[16384];
  static double ref[STEPS], got[STEPS];
  snprintf(ref_log, sizeof ref_log, "%s/ref.jsonl", dir);
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --steps %d --log %s", model, data, common,
               STEPS, ref_log);
  RF_CHECK(rf_cli_log_last_losses(ref_log, ref, STEPS) == STEPS,
           "the uninterrupted run logged another count of steps");
  snprintf(ck, sizeof ck, "%s/ck", dir);
  snprintf(log, sizeof log, "%s/elastic.jsonl", dir);
  snprintf(outp, sizeof outp, "%s/elastic.out", dir);
  int pid =
      rf_cli_spawn(outp,
                   "env OMP_NUM_THREADS=1 scripts/rfmpirun --restarts 2 -np 2 %s train --model %s --data %s "
                   "%s --steps %d --save-every %d --ckpt-dir %s --log %s",
                   rf_cli_binary(), model, data, common, STEPS, SAVE_EVERY, ck, log);
  /* the fault: after a few checkpoints, well before the end */
  double v[1024];
  for (int i = 0; i < 1200 && rf_cli_log_field(log, "\"loss\":", v, 1024) < 4 * SAVE_EVERY; i++)
    usleep(20000);
  int before = rf_cli_log_field(log, "\"loss\":", v, 1024);
  long victim = other_rank(ck);
  RF_CHECK(victim > 0 && before < STEPS / 2, "no rank to kill (%d steps logged)", before);
  if (victim > 0) kill((pid_t)victim, SIGKILL);
  int rc = rf_cli_reap(pid, 240);
  char *text = NULL;
  size_t n;
  RF_ASSERT(rf_file_read_all(outp, &text, &n) == 0);
  RF_CHECK(rc == 0, "the elastic run: rc %d\n%s", rc, text);
  RF_CHECK(strstr(text, "scripts/rfmpirun: restart 1 of 2: the job failed (exit status") &&
               strstr(text, "resuming from ") && strstr(text, "on 2 ranks") &&
               !strstr(text, "restart 2 of 2"),
           "the restart did not say what failed and where it resumed:\n%s", text);
  const char *after = strstr(text, "s after the fault");
  RF_CHECK(after && strstr(text, "scripts/rfmpirun: restart 1: step "),
           "no time from the fault to the next step");
  if (after) {
    const char *line = after;
    while (line > text && line[-1] != '\n') line--;
    printf("%.*s\n", (int)(after - line) + 17, line);
  }
  int lines = rf_cli_log_last_losses(log, got, STEPS);
  int missing;
  double worst = rf_cli_worst_absolute(got, ref, STEPS, &missing);
  RF_CHECK(missing == 0 && worst <= 1e-5, "losses: %d steps missing, worst difference %g", missing, worst);
  RF_CHECK(lines >= STEPS && lines - STEPS <= SAVE_EVERY, "%d steps recomputed (at most %d)", lines - STEPS,
           SAVE_EVERY);
  printf("rank killed after %d logged steps: %d recomputed, worst loss difference %g\n", before,
         lines - STEPS, worst);
  free(text);
}

/* Not a rank failure: no restart. */
static void check_no_restart(void) {
  char out[16384];
  int rc = rf_cli_sh(out, sizeof out,
                     "OMP_NUM_THREADS=1 scripts/rfmpirun --restarts 2 -np 2 %s train --model %s --data %s %s "
                     "--steps 2 --ckpt-dir %s/ck2 --lr -1",
                     rf_cli_binary(), model, data, common, dir);
  RF_CHECK(rc == 2 && !strstr(out, "restart"), "a usage error: rc %d\n%s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "scripts/rfmpirun --restarts x -np 2 true");
  RF_CHECK(rc == 2 && strstr(out, "--restarts 'x'"), "--restarts x: rc %d\n%s", rc, out);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char out[16384];
  RF_ASSERT(rf_cli_setup_tiny(dir, 100000, data, sizeof data, model, sizeof model, out, sizeof out) == 0);
  check_no_restart();
  check_rank_killed();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_elastic");
}
