/* Runs the rfsdp command from a test (see rf_cli.h). */
#include "rf_cli.h"
#include "core/core.h"
#include "rf_test.h"

#include <ftw.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double rf_cli_seconds;

const char *rf_cli_binary(void) {
  static char path[4096];
  if (path[0]) return path;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "build/rfsdp";
  self[n] = '\0';
  char *dir = dirname(self); /* BUILD/tests */
  snprintf(path, sizeof path, "%s/../rfsdp", dir);
  return path;
}

double rf_cli_last_seconds(void) { return rf_cli_seconds; }

/* Runs a shell command, its output into out; returns its exit code. */
static int rf_cli_shell(char *out, int out_size, const char *cmd) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  int len = 0;
  if (out_size > 0) out[0] = '\0';
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) {
    int take = (int)got;
    if (len + take > out_size - 1) take = out_size - 1 - len;
    if (take > 0) {
      memcpy(out + len, buf, (size_t)take);
      len += take;
      out[len] = '\0';
    }
  }
  int status = pclose(p);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  rf_cli_seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int rf_cli_run(char *out, int out_size, const char *args_fmt, ...) {
  char args[8192], cmd[12288];
  va_list ap;
  va_start(ap, args_fmt);
  vsnprintf(args, sizeof args, args_fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "%s %s 2>&1", rf_cli_binary(), args);
  return rf_cli_shell(out, out_size, cmd);
}

int rf_cli_sh(char *out, int out_size, const char *cmd_fmt, ...) {
  char cmd[12288];
  va_list ap;
  va_start(ap, cmd_fmt);
  vsnprintf(cmd, sizeof cmd - 8, cmd_fmt, ap);
  va_end(ap);
  strcat(cmd, " 2>&1");
  return rf_cli_shell(out, out_size, cmd);
}

int rf_cli_run_mpi(char *out, int out_size, int world, int limit_s, const char *args_fmt, ...) {
  char args[8192], cmd[12288];
  va_list ap;
  va_start(ap, args_fmt);
  vsnprintf(args, sizeof args, args_fmt, ap);
  va_end(ap);
  char mpi[64] = "";
  if (world > 0) snprintf(mpi, sizeof mpi, "scripts/rfmpirun -np %d", world);
  snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout -k 5 %d %s %s %s 2>&1", limit_s,
           mpi, rf_cli_binary(), args);
  return rf_cli_shell(out, out_size, cmd);
}

int rf_cli_run_hosts(char *out, int out_size, int hosts, int per_host, const char *hosts_flags, int limit_s,
                     const char *args_fmt, ...) {
  char args[8192], cmd[12288];
  va_list ap;
  va_start(ap, args_fmt);
  vsnprintf(args, sizeof args, args_fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd,
           "timeout -k 5 %d scripts/hosts --hosts %d --ranks-per-host %d %s -- env OMP_NUM_THREADS=1 "
           "OPENBLAS_NUM_THREADS=1 %s %s 2>&1",
           limit_s, hosts, per_host, hosts_flags, rf_cli_binary(), args);
  return rf_cli_shell(out, out_size, cmd);
}

int rf_cli_hosts_available(char *why, int why_size) {
  int rc = rf_cli_shell(why, why_size, "scripts/hosts --check 2>&1");
  if (rc == 0) return 1;
  if (why_size > 0 && why[0] == '\0') snprintf(why, (size_t)why_size, "scripts/hosts --check: exit %d", rc);
  return 0;
}

int rf_cli_hosts_unavailable(void) {
  char why[4096] = "";
  if (rf_cli_hosts_available(why, sizeof why)) return 0;
  printf("%s\nnot run: scripts/hosts cannot make network namespaces here\n", why);
  return 1;
}

void rf_cli_write_tiny_model(const char *path) {
  const char *tiny =
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5}";
  RF_ASSERT(rf_file_write_all(path, tiny, strlen(tiny)) == 0);
}

void rf_cli_write_verses(const char *path, size_t bytes) {
  static const char *lines[] = {
      "In the beginning God created the heaven and the earth.", "And the earth was without form, and void.",
      "And God said, Let there be light: and there was light.", "And God saw the light, that it was good."};
  char *buf = rf_xmalloc(bytes);
  size_t n = 0;
  for (int i = 0; n + 200 < bytes; i++)
    n += (size_t)snprintf(buf + n, bytes - n, "1:%d %s\n", i % 31 + 1, lines[i % 4]);
  RF_ASSERT(rf_file_write_all(path, buf, n) == 0);
  free(buf);
}

int rf_cli_setup_tiny(const char *dir, size_t text_bytes, char *data, int data_size, char *model,
                      int model_size, char *out, int out_size) {
  char text[512];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, (size_t)data_size, "%s/data", dir);
  snprintf(model, (size_t)model_size, "%s/tiny.json", dir);
  rf_cli_write_verses(text, text_bytes);
  rf_cli_write_tiny_model(model);
  return rf_cli_run(out, out_size, "prepare --input %s --out %s --val-fraction 0.1", text, data);
}

double rf_cli_worst_relative(const double *got, const double *ref, int n) {
  double worst = 0;
  for (int s = 0; s < n; s++) worst = rf_test_max(worst, fabs(got[s] - ref[s]) / fabs(ref[s]));
  return worst;
}

int rf_cli_log_field(const char *path, const char *key, double *v, int cap) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  int n = 0;
  while (n < cap && fgets(line, sizeof line, f)) {
    const char *p = strstr(line, key);
    if (p && strstr(line, "\"step\":")) v[n++] = atof(p + strlen(key));
  }
  fclose(f);
  return n;
}

cJSON *rf_cli_json_line(const char *path, int line) {
  FILE *f = fopen(path, "r");
  if (!f) return NULL;
  char text[8192];
  cJSON *o = NULL;
  for (int i = 0; i <= line && fgets(text, sizeof text, f); i++)
    if (i == line) o = cJSON_Parse(text);
  fclose(f);
  return o;
}

double rf_cli_json_num(const cJSON *o, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(x) ? x->valuedouble : -1.0;
}

/* ---- what is on disk: every regular file under a folder, with a hash of its bytes ---- */

static struct rf_cli_snapshot *rf_cli_snap_target;

static uint64_t rf_cli_hash_file(const char *path, int64_t *size) {
  char *bytes;
  size_t n;
  if (rf_file_read_all(path, &bytes, &n) != 0) return 0;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)bytes[i]) * 1099511628211ull;
  free(bytes);
  *size = (int64_t)n;
  return h;
}

static int rf_cli_snap_visit(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)ftw;
  struct rf_cli_snapshot *s = rf_cli_snap_target;
  if (type != FTW_F || s->n >= RF_CLI_SNAP_FILES) return 0;
  snprintf(s->path[s->n], sizeof s->path[s->n], "%s", path);
  s->hash[s->n] = rf_cli_hash_file(path, &s->size[s->n]);
  s->n++;
  return 0;
}

void rf_cli_snap_take(struct rf_cli_snapshot *s, const char *dir) {
  s->n = 0;
  rf_cli_snap_target = s;
  RF_ASSERT(nftw(dir, rf_cli_snap_visit, 16, FTW_PHYS) == 0);
}

void rf_cli_snap_check(const struct rf_cli_snapshot *before, const struct rf_cli_snapshot *after,
                       const char *what) {
  for (int i = 0; i < before->n; i++) {
    int found = -1;
    for (int j = 0; j < after->n && found < 0; j++)
      if (strcmp(before->path[i], after->path[j]) == 0) found = j;
    RF_CHECK(found >= 0, "%s: %s was removed", what, before->path[i]);
    if (found >= 0)
      RF_CHECK(before->hash[i] == after->hash[found] && before->size[i] == after->size[found],
               "%s: %s changed (%lld -> %lld bytes)", what, before->path[i], (long long)before->size[i],
               (long long)after->size[found]);
  }
  for (int j = 0; j < after->n; j++)
    RF_CHECK(!strstr(after->path[j], ".tmp.") && !strstr(after->path[j], ".new-"), "%s: left %s behind", what,
             after->path[j]);
}

/* ---- one case of a fault suite ---- */

int rf_cli_count_lines(const char *out, const char *prefix) {
  int n = 0;
  size_t len = strlen(prefix);
  for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncmp(p, prefix, len) == 0) n++;
  return n;
}

void rf_cli_vrefused(const char *dir, int limit_s, int world, int want_rc, const char *prefix,
                     const char *want, const char *fmt, va_list ap) {
  char args[2048], out[16384], what[2200];
  vsnprintf(args, sizeof args, fmt, ap);
  snprintf(what, sizeof what, "W=%d rfsdp %s", world, args);
  static struct rf_cli_snapshot before, after;
  rf_cli_snap_take(&before, dir);
  int rc = rf_cli_run_mpi(out, sizeof out, world, limit_s, "%s", args);
  double seconds = rf_cli_last_seconds();
  rf_cli_snap_take(&after, dir);
  RF_CHECK(rc == want_rc, "%s: exit %d, expected %d\n%s", what, rc, want_rc, out);
  RF_CHECK(rc != 124 && seconds < limit_s, "%s: took %.1f s (a hang)", what, seconds);
  int lines = rf_cli_count_lines(out, prefix);
  RF_CHECK(lines == 1, "%s: %d message lines starting '%s', expected one\n%s", what, lines, prefix, out);
  RF_CHECK(!strstr(out, "another rank"), "%s: the message is not the one of the rank that saw it\n%s", what,
           out);
  char parts[256];
  snprintf(parts, sizeof parts, "%s", want);
  for (char *save = NULL, *part = strtok_r(parts, "|", &save); part; part = strtok_r(NULL, "|", &save))
    RF_CHECK(strstr(out, part), "%s: the message does not say '%s'\n%s", what, part, out);
  rf_cli_snap_check(&before, &after, what);
}

void rf_cli_refused(const char *dir, int limit_s, int world, int want_rc, const char *prefix,
                    const char *want, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rf_cli_vrefused(dir, limit_s, world, want_rc, prefix, want, fmt, ap);
  va_end(ap);
}

void rf_cli_works(int world, char *out, int out_size, const char *fmt, ...) {
  char args[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  int rc = rf_cli_run_mpi(out, out_size, world, RF_CLI_WORKS_LIMIT_S, "%s", args);
  RF_CHECK(rc == 0, "W=%d rfsdp %s: exit %d\n%s", world, args, rc, out);
}

int rf_cli_spawn(const char *out_path, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "exec %s >%s 2>&1", args, out_path);
  pid_t pid = fork();
  RF_ASSERT(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  return (int)pid;
}

int rf_cli_reap(int pid, int limit_s) {
  int status = 0;
  for (int i = 0; i < limit_s * 20; i++) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    usleep(50000);
  }
  kill(-pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 124;
}

int rf_cli_log_last_losses(const char *path, double *loss, int steps) {
  double *step = rf_xcalloc(2 * (size_t)steps + 1, sizeof *step);
  double *value = rf_xcalloc(2 * (size_t)steps + 1, sizeof *value);
  int n = rf_cli_log_field(path, "{\"step\":", step, 2 * steps);
  RF_ASSERT(rf_cli_log_field(path, "\"loss\":", value, 2 * steps) == n);
  for (int i = 0; i < steps; i++) loss[i] = NAN;
  for (int i = 0; i < n; i++)
    if (step[i] >= 1 && step[i] <= steps) loss[(int)step[i] - 1] = value[i];
  free(step);
  free(value);
  return n;
}

double rf_cli_worst_absolute(const double *got, const double *ref, int n, int *missing) {
  double worst = 0;
  *missing = 0;
  for (int i = 0; i < n; i++) {
    if (isnan(got[i]))
      (*missing)++;
    else if (fabs(got[i] - ref[i]) > worst)
      worst = fabs(got[i] - ref[i]);
  }
  return worst;
}

void rf_cli_build_dir(char *out, size_t size) {
  char self[4096], real[PATH_MAX], cwd[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  RF_ASSERT(n > 0);
  self[n] = 0;
  *strrchr(self, '/') = 0; /* BUILD/tests */
  *strrchr(self, '/') = 0; /* BUILD */
  RF_ASSERT(realpath(self, real) && getcwd(cwd, sizeof cwd));
  size_t c = strlen(cwd);
  const char *rel = strncmp(real, cwd, c) == 0 && real[c] == '/' ? real + c + 1 : real;
  snprintf(out, size, "%s", rel);
}
