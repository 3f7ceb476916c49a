/* rf-test: timeout=400
 * `rfsdp plan` plans what `rfsdp train` runs: for a small LLaMA, the first line
 * of the training log ({"plan": {...}}, counted by the runtime over the DBuffers
 * it built) holds the same padding_ratio, buffer_count, max_shard_elems,
 * split_blocks and copy_bytes_per_step as `rfsdp plan --json` with the same
 * options, at W = 1..5, for equal and ragged shards, for adamw (1-row blocks) and
 * adamw8bit (32-row blocks, 256-element vector blocks: the optimizer's needs),
 * and for the peers' layouts (flat, fsdp2) at W = 3. Independently of the
 * planner: the planned layout cuts no block, ragged shards have no padding and
 * one buffer per unit, one rank has no padding, and only fsdp2 copies around its
 * collectives. */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_plan_run.XXXXXX";
static char out[1 << 16];

/* `scripts/rfmpirun -np W rfsdp ARGS`: the exit code, output in out. */
static int run_mpi(int world, const char *fmt, ...) {
  char args[4096], cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(args, sizeof args, fmt, ap);
  va_end(ap);
  snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 scripts/rfmpirun -np %d %s %s 2>&1",
           world, rf_cli_binary(), args);
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  size_t n = fread(out, 1, sizeof out - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

static const char *keys[] = {"padding_ratio", "buffer_count", "max_shard_elems", "split_blocks",
                             "copy_bytes_per_step"};
#define N_KEYS 5

/* The five numbers of object o into v; 0 when one is missing. */
static int read_keys(const cJSON *o, double *v) {
  for (int k = 0; k < N_KEYS; k++) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, keys[k]);
    if (!cJSON_IsNumber(x)) return 0;
    v[k] = x->valuedouble;
  }
  return 1;
}

/* The first line of the log as the five numbers of its "plan" object. */
static int read_log_plan(const char *path, double *v) {
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  int ok = fgets(line, sizeof line, f) != NULL;
  fclose(f);
  cJSON *o = ok ? cJSON_Parse(line) : NULL;
  ok = o && read_keys(cJSON_GetObjectItemCaseSensitive(o, "plan"), v);
  cJSON_Delete(o);
  return ok;
}

static void check_one(const char *model, const char *data, int world, const char *layout, const char *shard,
                      const char *optim) {
  char opts[256], log[256];
  snprintf(opts, sizeof opts, "--layout %s --shard %s --optim %s", layout, shard, optim);
  snprintf(log, sizeof log, "%s/%s-%s-%s-%d.jsonl", dir, layout, shard, optim, world);
  int rc =
      run_mpi(world,
              "train --model %s --data %s %s --steps 1 --batch 60 --seq 8 --peak-gflops 50 --print-every 0 "
              "--log %s",
              model, data, opts, log);
  RF_CHECK(rc == 0, "train %s W=%d: rc %d '%.400s'", opts, world, rc, out);
  double run[N_KEYS], plan[N_KEYS];
  int have_run = rc == 0 && read_log_plan(log, run);
  RF_CHECK(have_run, "train %s W=%d: no plan line first in %s", opts, world, log);
  rc = rf_cli_run(out, sizeof out, "plan --model %s --world %d %s --json", model, world, opts);
  cJSON *o = rc == 0 ? cJSON_Parse(out) : NULL;
  int have_plan = o && read_keys(o, plan);
  RF_CHECK(have_plan, "plan %s W=%d: rc %d '%.400s'", opts, world, rc, out);
  if (have_plan) {
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(o, "block_rows");
    int eight = strcmp(optim, "adamw8bit") == 0;
    RF_CHECK(cJSON_IsNumber(rows) && rows->valuedouble == (eight ? 32 : 1), "plan %s: block_rows %g", opts,
             cJSON_IsNumber(rows) ? rows->valuedouble : -1);
  }
  cJSON_Delete(o);
  if (!have_run || !have_plan) return;
  for (int k = 0; k < N_KEYS; k++)
    RF_CHECK(run[k] == plan[k], "%s W=%d: %s: the run has %.17g, rfsdp plan says %.17g", opts, world, keys[k],
             run[k], plan[k]);
  int planned = strcmp(layout, "planned") == 0;
  if (planned) RF_CHECK(run[3] == 0, "%s W=%d: the planned layout cuts %g blocks", opts, world, run[3]);
  if (planned && strcmp(shard, "ragged") == 0)
    RF_CHECK(run[0] == 0 && run[1] == 4, "%s W=%d: ragged pads %g in %g buffers", opts, world, run[0],
             run[1]);
  RF_CHECK((run[4] > 0) == (strcmp(layout, "fsdp2") == 0), "%s W=%d: copies %g bytes per step", opts, world,
           run[4]);
  if (world == 1) RF_CHECK(run[0] == 0 && run[3] == 0, "%s W=1: padding %g, cut %g", opts, run[0], run[3]);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[256], data[200], model[256];
  snprintf(text, sizeof text, "%s/text.txt", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  size_t cap = 1 << 18, n = 0;
  char *buf = malloc(cap);
  for (int i = 0; n + 100 < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%d: %s\n", i % 97,
                          i % 3 ? "a line of the text" : "and another one");
  RF_ASSERT(rf_file_write_all(text, buf, n) == 0);
  free(buf);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  rf_cli_write_tiny_model(model);

  static const char *shards[] = {"equal", "ragged"}, *optims[] = {"adamw", "adamw8bit"};
  for (int w = 1; w <= 5; w++)
    for (int s = 0; s < 2; s++)
      for (int o = 0; o < 2; o++) check_one(model, data, w, "planned", shards[s], optims[o]);
  check_one(model, data, 3, "flat", "equal", "adamw");
  check_one(model, data, 3, "fsdp2", "equal", "adamw8bit");

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_plan_run");
}
