/* rf-test: timeout=300
 * The lock of a checkpoint folder (issue 37, case 9: two jobs writing one new
 * --ckpt-dir were not told another job is there). Rank 0 of `rfsdp train` names
 * itself (host, PID) in DIR/rfsdp.lock and removes it at its end; every rank learns
 * the outcome:
 *  - a second job on the folder of a live job (W = 2, the first job's rank 0 stopped
 *    with SIGSTOP) exits 2 with one message naming the holder's host and PID, the
 *    folder unchanged; the first job, continued and stopped with SIGTERM, removes
 *    its lock;
 *  - a lock naming a live PID of this host (the test itself, W = 1) is honored, one
 *    of another host (W = 2) too unless --ckpt-dir-force is given;
 *  - a lock left by a dead PID (W = 2), an exited one not reaped yet (W = 1) or written
 *    before this host's boot (W = 1) is taken over with a warning naming its holder,
 *    the run trains to the end and removes it;
 *  - a job SIGKILLed (W = 1, its lock left behind) is resumed from its folder at W = 2
 *    to the end: a crash never blocks the restart. */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_ckpt_lock.XXXXXX";
static char model[256], data[256], host[256];
static const char *common = "--batch 6 --seq 16 --peak-gflops 50 --print-every 0";

/* The holder named by lock file `path`: its PID, -1 when there is no lock. */
static long lock_pid(const char *path) {
  char *text;
  size_t n;
  if (rf_file_read_all(path, &text, &n) != 0) return -1;
  const char *p = strstr(text, "\npid ");
  long pid = p ? atol(p + 5) : 0;
  free(text);
  return pid;
}

/* Writes a lock naming host h, PID pid and boot id boot ("" for none). */
static void fake_lock(const char *folder, const char *h, long pid, const char *boot) {
  char path[512], text[512];
  RF_ASSERT(mkdir(folder, 0755) == 0 || access(folder, F_OK) == 0);
  snprintf(path, sizeof path, "%s/rfsdp.lock", folder);
  int n = snprintf(text, sizeof text, "rfsdp.lock\nhost %s\npid %ld\nboot %s\nsince 2026-12-02T00:00:00Z\n",
                   h, pid, boot);
  RF_ASSERT(rf_file_write_all(path, text, (size_t)n) == 0);
}

/* The latest complete checkpoint's step in series folder `ck`, -1 when none. */
static long latest_step(const char *ck) {
  DIR *d = opendir(ck);
  if (!d) return -1;
  long latest = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    char marker[600];
    snprintf(marker, sizeof marker, "%s/%s/COMPLETE", ck, e->d_name);
    if (strncmp(e->d_name, "step-", 5) == 0 && access(marker, F_OK) == 0 && atol(e->d_name + 5) > latest)
      latest = atol(e->d_name + 5);
  }
  closedir(d);
  return latest;
}

/* Waits (at most 60 s) until series folder `ck` holds a complete checkpoint. */
static int wait_for(const char *ck) {
  for (int i = 0; i < 1200; i++) {
    if (latest_step(ck) > 0) return 1;
    usleep(50000);
  }
  return 0;
}

/* A live job holds the folder: a second job is refused naming it; its lock goes with it. */
static void check_live_job(void) {
  char ck[256], lock[300], outp[256], want[1024], out[16384];
  snprintf(ck, sizeof ck, "%s/live", dir);
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  snprintf(outp, sizeof outp, "%s/live.out", dir);
  /* no --save-every: rank 0 is stopped outside any save (a stopped save's temporary files would be left) */
  int pid =
      rf_cli_spawn(outp,
                   "env OMP_NUM_THREADS=1 scripts/rfmpirun -np 2 %s train --model %s --data %s %s --steps "
                   "100000 --ckpt-dir %s --log %s/live.jsonl",
                   rf_cli_binary(), model, data, common, ck, dir);
  char log[300];
  snprintf(log, sizeof log, "%s/live.jsonl", dir);
  double v[4];
  for (int i = 0; i < 1200 && rf_cli_log_field(log, "\"loss\":", v, 4) < 1; i++) usleep(50000);
  long holder = lock_pid(lock);
  RF_CHECK(holder > 0, "the first job holds no lock of %s", ck);
  if (holder > 0) kill((pid_t)holder, SIGSTOP); /* rank 0 stopped: the other waits in a collective */
  snprintf(want, sizeof want, "the checkpoint folder is in use by another job: host %s, PID %ld|%s", host,
           holder, lock);
  rf_cli_refused(dir, 60, 2, 2, "rfsdp train:", want, "train --model %s --data %s %s --steps 4 --ckpt-dir %s",
                 model, data, common, ck);
  rf_cli_refused(dir, 60, 2, 2, "rfsdp train:", want,
                 "train --model %s --data %s %s --steps 100000 --ckpt-dir %s --resume %s", model, data,
                 common, ck, ck);
  if (holder > 0) kill((pid_t)holder, SIGCONT);
  kill(-pid, SIGTERM);
  int rc = rf_cli_reap(pid, 60);
  char *text = NULL;
  size_t n;
  RF_ASSERT(rf_file_read_all(outp, &text, &n) == 0);
  RF_CHECK(rc == 143 && strstr(text, "stopped by SIGTERM after step"), "the first job: rc %d\n%s", rc, text);
  RF_CHECK(access(lock, F_OK) != 0, "the first job left its lock after SIGTERM");
  free(text);
  /* the folder is free again: a resume from it works */
  rf_cli_works(1, out, sizeof out, "train --model %s --data %s %s --steps %ld --ckpt-dir %s --resume %s",
               model, data, common, latest_step(ck) + 2, ck, ck);
}

static void check_fake_locks(void) {
  char ck[256], lock[300], want[1024], out[16384];
  /* a live PID of this host: this test's own */
  snprintf(ck, sizeof ck, "%s/mine", dir);
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  fake_lock(ck, host, (long)getpid(), "");
  snprintf(want, sizeof want, "host %s, PID %ld", host, (long)getpid());
  rf_cli_refused(dir, 60, 1, 2, "rfsdp train:", want, "train --model %s --data %s %s --steps 2 --ckpt-dir %s",
                 model, data, common, ck);
  RF_CHECK(lock_pid(lock) == (long)getpid(), "a refused job changed the live job's lock");
  /* another host's: honored, taken with --ckpt-dir-force */
  snprintf(ck, sizeof ck, "%s/other", dir);
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  fake_lock(ck, "elsewhere.example", 1, "");
  rf_cli_refused(dir, 60, 2, 2, "rfsdp train:", "host elsewhere.example, PID 1|--ckpt-dir-force",
                 "train --model %s --data %s %s --steps 2 --ckpt-dir %s", model, data, common, ck);
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --steps 2 --ckpt-dir %s --ckpt-dir-force",
               model, data, common, ck);
  RF_CHECK(strstr(out, "took over the lock of host elsewhere.example, PID 1"), "--ckpt-dir-force:\n%s", out);
  RF_CHECK(access(lock, F_OK) != 0, "the forced job left its lock");
  /* a dead PID of this host: a child that has exited */
  pid_t child = fork();
  RF_ASSERT(child >= 0);
  if (child == 0) _exit(0);
  waitpid(child, NULL, 0);
  snprintf(ck, sizeof ck, "%s/dead", dir);
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  fake_lock(ck, host, (long)child, "");
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --steps 2 --ckpt-dir %s", model, data,
               common, ck);
  snprintf(want, sizeof want, "took over the lock of host %s, PID %ld", host, (long)child);
  RF_CHECK(
      strstr(out, want) && strstr(out, "is gone") && rf_cli_count_lines(out, "rfsdp train: warning") == 1,
      "a dead PID's lock:\n%s", out);
  RF_CHECK(access(lock, F_OK) != 0, "the job left its lock");
  /* a PID that has exited but is not reaped yet (a zombie: kill() still reaches it), as a
   * rank killed under scripts/hosts leaves it for a moment */
  child = fork();
  RF_ASSERT(child >= 0);
  if (child == 0) _exit(0);
  usleep(200000);
  snprintf(ck, sizeof ck, "%s/zombie", dir);
  fake_lock(ck, host, (long)child, "");
  rf_cli_works(1, out, sizeof out, "train --model %s --data %s %s --steps 2 --ckpt-dir %s", model, data,
               common, ck);
  snprintf(want, sizeof want, "PID %ld has exited", (long)child);
  RF_CHECK(strstr(out, want), "a zombie's lock:\n%s", out);
  waitpid(child, NULL, 0);
  /* written before this host's boot (another boot id), its PID alive */
  snprintf(ck, sizeof ck, "%s/boot", dir);
  fake_lock(ck, host, (long)getpid(), "00000000-0000-0000-0000-000000000000");
  rf_cli_works(1, out, sizeof out, "train --model %s --data %s %s --steps 2 --ckpt-dir %s", model, data,
               common, ck);
  RF_CHECK(strstr(out, "before this host's last boot"), "a lock of an earlier boot:\n%s", out);
}

/* A SIGKILLed job leaves its lock; the restart takes it over and finishes. */
static void check_killed(void) {
  char ck[256], lock[300], outp[256], out[16384];
  snprintf(ck, sizeof ck, "%s/killed", dir);
  snprintf(lock, sizeof lock, "%s/rfsdp.lock", ck);
  snprintf(outp, sizeof outp, "%s/killed.out", dir);
  int pid = rf_cli_spawn(outp,
                         "env OMP_NUM_THREADS=1 %s train --model %s --data %s %s --steps 100000 "
                         "--save-every 4 --ckpt-dir %s",
                         rf_cli_binary(), model, data, common, ck);
  RF_CHECK(wait_for(ck), "the job wrote no checkpoint");
  kill(pid, SIGKILL);
  int rc = rf_cli_reap(pid, 30);
  RF_CHECK(rc == 128 + SIGKILL && lock_pid(lock) == pid, "the killed job: rc %d, its lock's PID %ld", rc,
           lock_pid(lock));
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --steps %ld --ckpt-dir %s --resume %s",
               model, data, common, latest_step(ck) + 2, ck, ck);
  RF_CHECK(strstr(out, "is gone") && strstr(out, "resumed from"), "the restart after SIGKILL:\n%s", out);
  RF_CHECK(access(lock, F_OK) != 0, "the restart left its lock");
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  RF_ASSERT(gethostname(host, sizeof host - 1) == 0);
  char out[16384];
  RF_ASSERT(rf_cli_setup_tiny(dir, 100000, data, sizeof data, model, sizeof model, out, sizeof out) == 0);
  check_fake_locks();
  check_live_job();
  check_killed(); /* last: the killed save's temporary files are no refused job's */
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_ckpt_lock");
}
