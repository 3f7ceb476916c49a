/* rf-test: timeout=240
 * `rfsdp train --trace` (src/core/trace.c, src/run/trace.c): the merged Chrome trace of
 * every rank, at W = 3 (FSDP) and W = 4 as 2 x 2 HSDP, 2 micro-batches, steps 2..4 of 5:
 *  - the file is the trace event format (checked here as its schema says: a
 *    "traceEvents" array; metadata events "M" naming each process and lane; complete
 *    events "X" with name, cat, pid in [0, W), tid a lane, ts >= 0 and dur >= 0 in
 *    microseconds, args.step);
 *  - only the window's steps, every rank present, no span dropped;
 *  - per rank and step: each unit's forward and backward exactly once per micro-batch;
 *    the bytes of its all-gather spans sum to the step's bytes_gathered of the JSONL log
 *    (rank 0's counters, an outside reference: src/comm counts them), those of its
 *    reduce-scatter and replica all-reduce spans to bytes_reduced less the step's three
 *    scalar all-reduces (20 bytes); HSDP: one replica all-reduce per unit and step;
 *  - the order of events: every forward of a unit begins after a gather of that unit
 *    was observed complete, every reduce-scatter of a unit is issued after that unit's
 *    backward ended, the optimizer step after every reduce-scatter of the step;
 *  - the printed exposed communication per step is the largest rank's sum of "wait"
 *    spans per step (recomputed from the file), and the overlap lies in [0, 1];
 *  - with --plot, timeline.png is a PNG; a bad --trace-steps is refused before training. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define MAX_RANKS 8
#define MAX_UNITS 16
#define FIRST 2
#define LAST 4
#define ACCUM 2

static char tmp[] = "/tmp/rf_test_trace.XXXXXX";
static char data[256], model[256];
static char out[1 << 16];

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = rf_xmalloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = 0;
  fclose(f);
  return s;
}

struct span {
  int pid, tid, step, unit;
  double ts, dur;
  double bytes;
  const char *name;
};

static void check_run(int world, const char *extra, int replicate) {
  char trace[400], log[400], plot[400], png[400];
  snprintf(trace, sizeof trace, "%s/w%d.json", tmp, world);
  snprintf(log, sizeof log, "%s/w%d.jsonl", tmp, world);
  snprintf(plot, sizeof plot, "%s/w%d/loss.png", tmp, world);
  snprintf(png, sizeof png, "%s/w%d/timeline.png", tmp, world);
  int rc =
      rf_cli_run_mpi(out, sizeof out, world, 150,
                     "train --model %s --data %s --batch 24 --seq 16 --steps 5 --accum %d --lr 3e-3 "
                     "--peak-gflops 50 --print-every 0 --log %s --plot %s --trace %s --trace-steps %d:%d %s",
                     model, data, ACCUM, log, plot, trace, FIRST, LAST, extra);
  RF_CHECK(rc == 0, "W=%d %s: rc %d\n%s", world, extra, rc, out);
  if (rc) return;
  double exposed_printed = -1, overlap_printed = -1;
  const char *line = strstr(out, "trace: ");
  RF_CHECK(line && sscanf(strstr(line, "exposed (the compute lane waiting) "),
                          "exposed (the compute lane waiting) %lf ms: overlap %lf%%", &exposed_printed,
                          &overlap_printed) == 2,
           "W=%d: no trace summary line\n%s", world, out);
  overlap_printed /= 100;
  char *text = read_file(png);
  RF_CHECK(text && memcmp(text, "\x89PNG", 4) == 0, "W=%d: %s is not a PNG", world, png);
  free(text);
  text = read_file(trace);
  RF_CHECK(text != NULL, "W=%d: no trace file", world);
  if (!text) return;
  cJSON *root = cJSON_Parse(text);
  free(text);
  RF_CHECK(root != NULL, "W=%d: the trace is not JSON", world);
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  RF_CHECK(cJSON_IsArray(events), "W=%d: no traceEvents array", world);
  const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
  RF_CHECK(cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(other, "dropped_spans")) == 0 &&
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(other, "ranks")) == world,
           "W=%d: otherData", world);
  int n = cJSON_GetArraySize(events), ns = 0, named[MAX_RANKS] = {0};
  struct span *sp = rf_xcalloc((size_t)n, sizeof *sp);
  const cJSON *e;
  cJSON_ArrayForEach(e, events) {
    const char *ph = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "ph"));
    const cJSON *pid = cJSON_GetObjectItemCaseSensitive(e, "pid"),
                *tid = cJSON_GetObjectItemCaseSensitive(e, "tid");
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name"));
    int ok = ph && name && cJSON_IsNumber(pid) && pid->valueint >= 0 && pid->valueint < world;
    if (ok && strcmp(ph, "M") == 0) {
      const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
      ok = cJSON_IsObject(args) && (cJSON_GetObjectItemCaseSensitive(args, "name") ||
                                    cJSON_GetObjectItemCaseSensitive(args, "sort_index"));
      if (ok && strcmp(name, "process_name") == 0) named[pid->valueint]++;
      RF_CHECK(ok, "W=%d: a metadata event without its args", world);
      continue;
    }
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(e, "ts"),
                *dur = cJSON_GetObjectItemCaseSensitive(e, "dur");
    const cJSON *cat = cJSON_GetObjectItemCaseSensitive(e, "cat"),
                *args = cJSON_GetObjectItemCaseSensitive(e, "args");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(args, "step");
    ok = ok && strcmp(ph, "X") == 0 && cJSON_IsString(cat) && cJSON_IsNumber(tid) && tid->valueint >= 0 &&
         tid->valueint < 8 && cJSON_IsNumber(ts) && ts->valuedouble >= 0 && cJSON_IsNumber(dur) &&
         dur->valuedouble >= 0 && cJSON_IsNumber(step);
    RF_CHECK(ok, "W=%d: event %d is not a complete event of the format", world, ns);
    if (!ok) continue;
    const cJSON *unit = cJSON_GetObjectItemCaseSensitive(args, "unit"),
                *bytes = cJSON_GetObjectItemCaseSensitive(args, "bytes");
    sp[ns++] = (struct span){.pid = pid->valueint,
                             .tid = tid->valueint,
                             .step = step->valueint,
                             .unit = cJSON_IsNumber(unit) ? unit->valueint : -1,
                             .ts = ts->valuedouble,
                             .dur = dur->valuedouble,
                             .bytes = cJSON_IsNumber(bytes) ? bytes->valuedouble : -1,
                             .name = name};
  }
  for (int r = 0; r < world; r++) RF_CHECK(named[r] == 1, "W=%d: rank %d named %d times", world, r, named[r]);
  double gathered[LAST + 1] = {0}, reduced[LAST + 1] = {0}, worst_wait = 0;
  int units = 0;
  for (int i = 0; i < ns; i++) units = sp[i].unit + 1 > units ? sp[i].unit + 1 : units;
  RF_CHECK(units > 1 && units <= MAX_UNITS, "W=%d: %d units traced", world, units);
  for (int r = 0; r < world; r++) {
    double wait = 0;
    for (int s = FIRST; s <= LAST; s++) {
      int fwd[MAX_UNITS] = {0}, bwd[MAX_UNITS] = {0}, across[MAX_UNITS] = {0}, steps = 0;
      double opt_ts = -1, last_reduce = -1;
      for (int i = 0; i < ns; i++) {
        const struct span *x = &sp[i];
        if (x->pid != r || x->step != s) continue;
        int u = x->unit >= 0 && x->unit < MAX_UNITS ? x->unit : 0;
        if (x->tid == 0 && strcmp(x->name, "step") == 0) steps++;
        if (x->tid == 0 && strcmp(x->name, "optimizer step") == 0) opt_ts = x->ts;
        if (x->tid == 0 && strncmp(x->name, "wait", 4) == 0) wait += x->dur;
        if (x->tid == 1 && r == 0) gathered[s] += x->bytes;
        if ((x->tid == 2 || x->tid == 3) && r == 0)
          reduced[s] += x->bytes; /* reduce-scatters, replica sums */
        if (x->tid == 2 && x->ts + x->dur > last_reduce) last_reduce = x->ts;
        if (x->tid == 3) across[u]++;
        if (x->tid == 0 && strcmp(x->name, "forward") == 0) {
          fwd[u]++;
          /* the unit's latest gather issued before its forward began was observed complete before it */
          int last = -1;
          for (int j = 0; j < ns; j++)
            if (sp[j].pid == r && sp[j].tid == 1 && sp[j].unit == x->unit && sp[j].ts <= x->ts &&
                (last < 0 || sp[j].ts > sp[last].ts))
              last = j;
          RF_CHECK(last >= 0 && sp[last].ts + sp[last].dur <= x->ts + 1e-3,
                   "W=%d rank %d step %d: unit %d's forward at %.3f us before its gather completed (%.3f)",
                   world, r, s, x->unit, x->ts, last >= 0 ? sp[last].ts + sp[last].dur : -1.0);
        }
        if (x->tid == 0 && strcmp(x->name, "backward") == 0) {
          bwd[u]++;
          int issued_after = 0;
          for (int j = 0; j < ns && !issued_after; j++)
            issued_after = sp[j].pid == r && sp[j].tid == 2 && sp[j].unit == x->unit && sp[j].step == s &&
                           sp[j].ts >= x->ts + x->dur - 1e-3;
          RF_CHECK(issued_after,
                   "W=%d rank %d step %d: no reduce-scatter of unit %d issued after its backward", world, r,
                   s, x->unit);
        }
      }
      RF_CHECK(steps == 1, "W=%d rank %d step %d: %d step spans", world, r, s, steps);
      RF_CHECK(opt_ts >= last_reduce,
               "W=%d rank %d step %d: the optimizer step (%.3f) before a reduce-scatter (%.3f)", world, r, s,
               opt_ts, last_reduce);
      for (int u = 0; u < units; u++) {
        RF_CHECK(fwd[u] == ACCUM && bwd[u] == ACCUM,
                 "W=%d rank %d step %d unit %d: %d forwards, %d backwards", world, r, s, u, fwd[u], bwd[u]);
        RF_CHECK(across[u] == (replicate ? 1 : 0), "W=%d rank %d step %d unit %d: %d replica all-reduces",
                 world, r, s, u, across[u]);
      }
    }
    for (int i = 0; i < ns; i++)
      RF_CHECK(sp[i].step >= FIRST && sp[i].step <= LAST, "W=%d: a span of step %d, outside %d:%d", world,
               sp[i].step, FIRST, LAST);
    if (wait > worst_wait) worst_wait = wait;
  }
  /* the printed exposed time: the worst rank's waits per step, in ms */
  double exposed = worst_wait / 1e3 / (LAST - FIRST + 1);
  RF_CHECK(fabs(exposed - exposed_printed) <= 0.01 + 1e-3 * exposed,
           "W=%d: printed exposed %.3f ms, the file's %.3f", world, exposed_printed, exposed);
  RF_CHECK(overlap_printed >= 0 && overlap_printed <= 1, "W=%d: overlap %.3f", world, overlap_printed);
  /* the byte counts against the log's (rank 0's counters) */
  for (int s = FIRST; s <= LAST; s++) {
    cJSON *rec = rf_cli_json_line(log, s);
    double g = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rec, "gather_bytes"));
    double rd = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(rec, "reduce_bytes"));
    /* bytes_reduced counts the reduce-scatters, the replica all-reduces and the step's scalar all-reduces:
     * the grad norm's and the loss's f64 and the step agreement's i32 (20 bytes) */
    RF_CHECK(g == gathered[s] && rd == reduced[s] + 20,
             "W=%d step %d: trace gathered %.0f reduced %.0f, log %.0f %.0f", world, s, gathered[s],
             reduced[s], g, rd);
    cJSON_Delete(rec);
  }
  free(sp);
  cJSON_Delete(root);
}

int main(void) {
  RF_ASSERT(mkdtemp(tmp));
  int rc = rf_cli_setup_tiny(tmp, 1 << 16, data, sizeof data, model, sizeof model, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: rc %d\n%s", rc, out);
  if (rc == 0) {
    check_run(3, "", 0);
    check_run(4, "--replicate 2", 1);
    rc = rf_cli_run_mpi(
        out, sizeof out, 2, 60,
        "train --model %s --data %s --batch 4 --seq 16 --steps 2 --trace %s/x.json --trace-steps 3:1", model,
        data, tmp);
    RF_CHECK(rc != 0 && strstr(out, "--trace-steps 3:1"), "a bad window: rc %d\n%s", rc, out);
  }
  rc = rf_test_finish("test_trace");
  if (rc == 0) rf_cli_sh(out, sizeof out, "rm -rf %s", tmp);
  return rc;
}
