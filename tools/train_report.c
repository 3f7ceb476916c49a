/* Progress line, JSONL log, loss curve, GEMM peak and memory for `rfsdp train`. */
#include "train_report.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "porch.h"

int rf_train_log_open(struct rf_train_log *log, const char *path) {
  log->path = path;
  log->file = fopen(path, "a");
  RF_TOOL_REQUIRE(log->file, "--log %s: cannot open for writing: %s", path, strerror(errno));
  return 0;
}

int rf_train_log_truncate(struct rf_train_log *log) {
  struct stat st;
  RF_TOOL_REQUIRE(fflush(log->file) == 0 && fstat(fileno(log->file), &st) == 0, "--log %s: cannot write: %s",
                  log->path, strerror(errno));
  /* a device or a pipe (/dev/stdout, /dev/full) has nothing to empty */
  RF_TOOL_REQUIRE(!S_ISREG(st.st_mode) || ftruncate(fileno(log->file), 0) == 0,
                  "--log %s: cannot empty it: %s", log->path, strerror(errno));
  return 0;
}

static void rf_train_json_number(FILE *f, const char *key, double v) {
  if (isfinite(v))
    fprintf(f, ",\"%s\":%.9g", key, v);
  else
    fprintf(f, ",\"%s\":null", key);
}

int rf_train_log_write(struct rf_train_log *log, const struct rf_train_record *rec) {
  FILE *f = log->file;
  fprintf(f, "{\"step\":%d", rec->step);
  rf_train_json_number(f, "loss", rec->loss);
  rf_train_json_number(f, "lr", rec->lr);
  rf_train_json_number(f, "grad_norm", rec->grad_norm);
  rf_train_json_number(f, "ms", rec->ms);
  rf_train_json_number(f, "cpu_ms", rec->cpu_ms);
  rf_train_json_number(f, "tok_s", rec->tok_s);
  rf_train_json_number(f, "mfu", rec->mfu);
  fprintf(f, ",\"mfu_peak\":\"onednn-%s\"", rec->mfu_dtype);
  rf_train_json_number(f, "rss_mb", rec->rss_mb);
  fprintf(
      f,
      ",\"gather_bytes\":%llu,\"reduce_bytes\":%llu,\"alltoall_bytes\":%llu,\"intra_bytes\":%llu,"
      "\"inter_bytes\":%llu,"
      "\"copy_bytes\":%llu,\"cast_bytes\":%llu,"
      "\"own_shard_bytes\":%llu,\"padding_bytes\":%llu,\"allocs\":%llu,\"host_syncs\":%llu,\"skipped\":%d",
      (unsigned long long)rec->gather_bytes, (unsigned long long)rec->reduce_bytes,
      (unsigned long long)rec->alltoall_bytes, (unsigned long long)rec->intra_bytes,
      (unsigned long long)rec->inter_bytes, (unsigned long long)rec->copy_bytes,
      (unsigned long long)rec->cast_bytes, (unsigned long long)rec->own_shard_bytes,
      (unsigned long long)rec->padding_bytes, (unsigned long long)rec->allocs,
      (unsigned long long)rec->host_syncs, rec->skipped);
  if (!isnan(rec->val_loss)) rf_train_json_number(f, "val_loss", rec->val_loss);
  fputs("}\n", f);
  RF_TOOL_REQUIRE(fflush(f) == 0 && !ferror(f), "--log %s: cannot write step %d: %s", log->path, rec->step,
                  strerror(errno));
  return 0;
}

int rf_train_log_plan(struct rf_train_log *log, const struct rf_plan_summary *plan,
                      const struct rf_train_memory *mem) {
  cJSON *o = cJSON_CreateObject();
  rf_plan_summary_json(plan, cJSON_AddObjectToObject(o, "plan"));
  cJSON *m = cJSON_AddObjectToObject(o, "memory");
  cJSON_AddNumberToObject(m, "shard_elems", (double)mem->shard_elems);
  cJSON_AddNumberToObject(m, "arena_bytes", (double)mem->arena_bytes);
  cJSON_AddNumberToObject(m, "optim_state_bytes", (double)mem->optim_state_bytes);
  cJSON_AddNumberToObject(m, "optim_workspace_bytes", (double)mem->optim_workspace_bytes);
  cJSON_AddNumberToObject(m, "activation_bytes", (double)mem->activation_bytes);
  char *text = cJSON_PrintUnformatted(o);
  RF_TOOL_ASSERT(text);
  fprintf(log->file, "%s\n", text);
  free(text);
  cJSON_Delete(o);
  RF_TOOL_REQUIRE(fflush(log->file) == 0 && !ferror(log->file), "--log %s: cannot write the plan: %s",
                  log->path, strerror(errno));
  return 0;
}

void rf_train_log_close(struct rf_train_log *log) {
  if (log->file) fclose(log->file);
  log->file = NULL;
}

void rf_train_print(const struct rf_train_record *rec, int total_steps) {
  char val[32] = "";
  if (!isnan(rec->val_loss)) snprintf(val, sizeof val, " val %.4f", rec->val_loss);
  printf(
      "step %5d/%d | loss %.4f%s | norm %7.4f | lr %.2e | %7.1f ms | %8.0f tok/s | mfu(%s) %5.1f%% | %6.0f "
      "MiB%s\n",
      rec->step, total_steps, rec->loss, val, rec->grad_norm, rec->lr, rec->ms, rec->tok_s, rec->mfu_dtype,
      100.0 * rec->mfu, rec->rss_mb, rec->skipped ? " | skipped (non-finite gradients)" : "");
  fflush(stdout);
}

/* Runs gnuplot on the table without a shell: the script comes through a pipe on
 * its standard input and the paths and the title reach it as arguments (ARG1..3,
 * string variables), so no character of theirs is ever parsed. Returns gnuplot's
 * exit status (127: it could not be started). */
static int rf_train_gnuplot(const char *script, size_t script_len, const char *png_path, const char *title,
                            const char *table, const char *arg4) {
  int fds[2];
  RF_TOOL_REQUIRE(pipe(fds) == 0, "%s: cannot make a pipe for gnuplot: %s", png_path, strerror(errno));
  /* the whole script is in the pipe before gnuplot starts: no SIGPIPE if it fails to */
  ssize_t put = write(fds[1], script, script_len);
  close(fds[1]);
  if (put != (ssize_t)script_len) {
    close(fds[0]);
    RF_TOOL_FAIL("%s: cannot write gnuplot's script into its pipe", png_path);
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    int quiet = open("/dev/null", O_WRONLY);
    if (dup2(fds[0], STDIN_FILENO) < 0 || quiet < 0 || dup2(quiet, STDERR_FILENO) < 0) _exit(127);
    execlp("gnuplot", "gnuplot", "-c", "/dev/stdin", png_path, title, table, arg4, (char *)NULL);
    _exit(127);
  }
  close(fds[0]);
  RF_TOOL_REQUIRE(pid > 0, "%s: cannot start gnuplot: %s", png_path, strerror(errno));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return 127;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

int rf_train_plot(const char *jsonl_path, const char *png_path, const char *title) {
  /* gnuplot reads a two- or three-column table made from the log. */
  char table[4096];
  snprintf(table, sizeof table, "%s.dat", png_path);
  FILE *in = fopen(jsonl_path, "r");
  RF_TOOL_REQUIRE(in, "%s: cannot read the log: %s", jsonl_path, strerror(errno));
  FILE *out = fopen(table, "w");
  if (!out) {
    fclose(in);
    RF_TOOL_FAIL("%s: cannot write: %s", table, strerror(errno));
  }
  char line[4096];
  int rows = 0;
  while (fgets(line, sizeof line, in)) {
    cJSON *obj = cJSON_Parse(line);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(obj, "step");
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
    const cJSON *val = cJSON_GetObjectItemCaseSensitive(obj, "val_loss");
    if (cJSON_IsNumber(step) && cJSON_IsNumber(loss)) {
      fprintf(out, "%d %.6g ", step->valueint, loss->valuedouble);
      if (cJSON_IsNumber(val))
        fprintf(out, "%.6g\n", val->valuedouble);
      else
        fputs("NaN\n", out);
      rows++;
    }
    cJSON_Delete(obj);
  }
  fclose(in);
  fclose(out);
  RF_TOOL_REQUIRE(rows > 0, "%s: no steps to plot", jsonl_path);
  static const char script[] =
      "set terminal png size 900,540\n"
      "set output ARG1\n"
      "set title ARG2 noenhanced\n"
      "set xlabel 'step'\n"
      "set ylabel 'loss (nats per token)'\n"
      "set grid\n"
      "set key top right\n"
      "plot ARG3 using 1:2 with lines lw 2 title 'train', '' using 1:3 with linespoints pt 7 title "
      "'validation'\n";
  int rc = rf_train_gnuplot(script, sizeof script - 1, png_path, title, table, "");
  unlink(table);
  RF_TOOL_REQUIRE(rc == 0, "%s: gnuplot failed (exit %d); is gnuplot installed (scripts/setup)?", png_path,
                  rc);
  return 0;
}

/* The colour of a span of the timeline (RGB). */
static int rf_train_span_colour(int lane, const char *name) {
  if (lane == RF_TRACE_LANE_GATHER) return 0xff7f0e;
  if (lane == RF_TRACE_LANE_REDUCE) return 0x9467bd;
  if (lane == RF_TRACE_LANE_REPLICATE) return 0x8c564b;
  if (strncmp(name, "wait", 4) == 0) return 0xd62728;
  if (strcmp(name, "forward") == 0) return 0x1f77b4;
  if (strcmp(name, "backward") == 0) return 0x2ca02c;
  return 0x999999;
}

int rf_train_plot_timeline(const char *trace_path, const char *png_path, const char *title) {
  FILE *in = fopen(trace_path, "rb");
  RF_TOOL_REQUIRE(in, "%s: cannot read the trace: %s", trace_path, strerror(errno));
  fseek(in, 0, SEEK_END);
  long size = ftell(in);
  fseek(in, 0, SEEK_SET);
  char *text = rf_tool_calloc(1, (size_t)size + 1);
  size_t got = fread(text, 1, (size_t)size, in);
  fclose(in);
  text[got] = 0;
  cJSON *root = cJSON_Parse(text);
  free(text);
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(events)) {
    cJSON_Delete(root);
    RF_TOOL_FAIL("%s: not a trace (no traceEvents)", trace_path);
  }
  char table[4096];
  snprintf(table, sizeof table, "%s.dat", png_path);
  FILE *out = fopen(table, "w");
  if (!out) {
    cJSON_Delete(root);
    RF_TOOL_FAIL("%s: cannot write: %s", table, strerror(errno));
  }
  /* rows: per rank its compute, gather, reduce and replica lanes, rank 0 on top; the step spans (which hold
   * the others) are left out; a wait is drawn over the compute it interrupts */
  static const char *const lanes[] = {"compute", "gather", "reduce", "replicate"};
  int ranks = 0, rows = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"),
                *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"),
                *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
    if (!cJSON_IsNumber(pid) || !cJSON_IsNumber(tid) || !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur) ||
        !name || tid->valueint < 0 || tid->valueint > 3 || strcmp(name, "step") == 0)
      continue;
    if (pid->valueint + 1 > ranks) ranks = pid->valueint + 1;
    int row = pid->valueint * 4 + tid->valueint;
    double half = dur->valuedouble / 2e3;
    fprintf(out, "%.6f %d %.6f %.2f %d r%d-%s %d\n", ts->valuedouble / 1e3 + half, -row, half,
            strncmp(name, "wait", 4) == 0 ? 0.28 : 0.4, rf_train_span_colour(tid->valueint, name),
            pid->valueint, lanes[tid->valueint], strncmp(name, "wait", 4) == 0);
    rows++;
  }
  cJSON_Delete(root);
  fclose(out);
  if (rows == 0) {
    unlink(table);
    RF_TOOL_FAIL("%s: no spans to draw", trace_path);
  }
  static const char script[] =
      "set terminal png size 1400,@ARG4\n"
      "set output ARG1\n"
      "set title ARG2 noenhanced\n"
      "set xlabel 'time (ms)'\n"
      "set grid xtics\n"
      "set style fill solid 0.9 noborder\n"
      "set key outside bottom horizontal\n"
      "plot ARG3 using ($7 == 0 ? $1 : NaN):2:3:4:5:ytic(6) with boxxyerror lc rgb variable notitle, \\\n"
      "  '' using ($7 == 1 ? $1 : NaN):2:3:4:5 with boxxyerror lc rgb variable notitle, \\\n"
      "  NaN with boxes lc rgb '#1f77b4' title 'forward', NaN with boxes lc rgb '#2ca02c' title 'backward', "
      "\\\n"
      "  NaN with boxes lc rgb '#d62728' title 'waiting for a collective (exposed)', \\\n"
      "  NaN with boxes lc rgb '#999999' title 'other compute', NaN with boxes lc rgb '#ff7f0e' title "
      "'all-gather', \\\n"
      "  NaN with boxes lc rgb '#9467bd' title 'reduce-scatter', NaN with boxes lc rgb '#8c564b' title "
      "'replica "
      "all-reduce'\n";
  char height[32];
  snprintf(height, sizeof height, "%d", 160 + ranks * 4 * 26);
  int rc = rf_train_gnuplot(script, sizeof script - 1, png_path, title, table, height);
  unlink(table);
  RF_TOOL_REQUIRE(rc == 0, "%s: gnuplot failed (exit %d); is gnuplot installed (scripts/setup)?", png_path,
                  rc);
  return 0;
}

uint64_t rf_train_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double rf_train_cpu_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static double rf_train_status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return NAN;
  char line[256];
  double kb = NAN;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) kb = atof(line + n);
  fclose(f);
  return kb;
}

double rf_train_rss_mb(void) { return rf_train_status_kb("VmRSS:") / 1024.0; }

double rf_train_peak_rss_mb(void) { return rf_train_status_kb("VmHWM:") / 1024.0; }
