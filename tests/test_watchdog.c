/* rf-test: timeout=120
 * The collective watchdog (issue 12): `rfsdp train --collective-timeout 5` on 2
 * ranks, one rank stopped with SIGSTOP while it trains. The other rank waits in a
 * collective; after 5 s it must print what it waited in (the collective, the unit
 * or phase, the step, the seconds) and end the job: mpirun returns non-zero, the
 * watchdog's doing and not the outer `timeout 90`'s (the order of events, not a
 * duration: the seconds are printed), and no rank is left behind. A bad
 * --collective-timeout is refused naming the option. */
#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_watchdog.XXXXXX";

static double now_s(void) { return (double)rf_time_ns() * 1e-9; }

/* Steps written to the JSONL log so far (rank 0 writes one line per step). */
static int log_lines(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  int n = 0, c;
  while ((c = fgetc(f)) != EOF) n += c == '\n';
  fclose(f);
  return n;
}

/* The rank processes of the run: processes running the rfsdp binary whose command
 * line names `marker` (the run's own log path). Returns how many (up to cap). */
static int find_ranks(const char *marker, pid_t *pids, int cap) {
  char binary[PATH_MAX];
  if (!realpath(rf_cli_binary(), binary)) return 0;
  DIR *d = opendir("/proc");
  RF_ASSERT(d);
  int n = 0;
  const struct dirent *e;
  while ((e = readdir(d)) && n < cap) {
    char *end;
    long pid = strtol(e->d_name, &end, 10);
    if (*end || pid <= 0) continue;
    char path[64], exe[PATH_MAX], cmdline[8192];
    snprintf(path, sizeof path, "/proc/%ld/exe", pid);
    ssize_t len = readlink(path, exe, sizeof exe - 1);
    if (len <= 0) continue;
    exe[len] = '\0';
    if (strcmp(exe, binary) != 0) continue;
    snprintf(path, sizeof path, "/proc/%ld/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t got = fread(cmdline, 1, sizeof cmdline - 1, f);
    fclose(f);
    for (size_t i = 0; i < got; i++)
      if (cmdline[i] == '\0') cmdline[i] = ' ';
    cmdline[got] = '\0';
    if (strstr(cmdline, marker)) pids[n++] = (pid_t)pid;
  }
  closedir(d);
  return n;
}

static void check_stopped_rank(const char *model, const char *data) {
  char log[128], cmd[8192];
  snprintf(log, sizeof log, "%s/stop.jsonl", dir);
  snprintf(
      cmd, sizeof cmd,
      "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 5 90 scripts/rfmpirun -np 2 %s train --model %s "
      "--data %s --steps 1000000 --batch 2 --seq 16 --peak-gflops 50 --print-every 0 --log %s "
      "--collective-timeout 5 2>&1",
      rf_cli_binary(), model, data, log);
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  /* training has started when the log holds a few steps */
  double t_start = now_s();
  while (log_lines(log) < 3 && now_s() - t_start < 60) usleep(20000);
  pid_t ranks[4];
  int n = find_ranks(log, ranks, 4);
  RF_CHECK(n == 2, "found %d rank processes of the run (want 2)", n);
  double t_stop = now_s();
  if (n >= 1) RF_CHECK(kill(ranks[n - 1], SIGSTOP) == 0, "SIGSTOP to rank process %d", (int)ranks[n - 1]);

  /* the job's output until it ends: by the watchdog, or else by the outer
   * `timeout 90` (exit 124), the hang this test exists to catch */
  char out[16384];
  size_t len = 0;
  for (size_t got = 1; got > 0 && len < sizeof out - 1; len += got)
    got = fread(out + len, 1, sizeof out - 1 - len, p);
  out[len] = '\0';
  double waited = now_s() - t_stop;
  int status = pclose(p);
  /* mpirun has returned; the ranks go within moments. Nothing of this run
   * outlives the test (the kill is a no-op when they went). */
  pid_t left[4];
  int n_left = find_ranks(log, left, 4);
  for (double t = now_s(); n_left > 0 && now_s() - t < 5; n_left = find_ranks(log, left, 4)) usleep(50000);
  for (int i = 0; i < n_left; i++) kill(left[i], SIGKILL);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  RF_CHECK(n_left == 0, "%d rank processes were left running after the job ended", n_left);
  RF_CHECK(rc != 0 && rc != 124, "exit code %d after a stopped rank (124: the outer timeout ended it)\n%s",
           rc, out);
  RF_CHECK(strstr(out, "collective watchdog: waited") && strstr(out, "step ") &&
               strstr(out, "longer than the collective timeout of 5 s"),
           "no watchdog message naming the collective, step and limit\n%s", out);
  printf("job ended %.1f s after SIGSTOP of one rank; exit code %d\n", waited, rc);
}

static void check_bad_option(const char *model, const char *data) {
  char out[8192];
  int rc = rf_cli_run_mpi(out, sizeof out, 0, 30,
                          "train --model %s --data %s --steps 1 --collective-timeout -1", model, data);
  RF_CHECK(rc == 2 && strstr(out, "--collective-timeout"), "--collective-timeout -1: rc %d\n%s", rc, out);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[128], data[128], model[128], out[8192];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  size_t cap = 1 << 18, n = 0;
  char *buf = malloc(cap);
  for (int i = 0; n + 100 < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "1:%d And God saw the light.\n", i);
  RF_ASSERT(rf_file_write_all(text, buf, n) == 0);
  free(buf);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);

  check_bad_option(model, data);
  check_stopped_rank(model, data);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_watchdog");
}
