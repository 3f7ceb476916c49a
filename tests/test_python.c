/* rf-test: timeout=180
 * The Python module (python/rfsdp: ctypes over BUILD/librfsdp.so) against the C side:
 *  - a tiny model trained 2 steps at W = 3 with 8-bit AdamW (every tensor cut over three
 *    rank files) and saved; tests/python_check.py reads every tensor whole and requires
 *    the parameters bit for bit equal to `rfsdp ckpt export`'s safetensors file, the
 *    optimizer states of the shapes and dtypes `rfsdp ckpt info` lists (compared here,
 *    line by line), the JSONL log's losses equal to this side's reading, errors that
 *    name the missing tensor and checkpoint, and (where torch is installed) a DLPack
 *    hand-over without a copy;
 *  - rfsdp.plan() of the same model with the same options equal to `rfsdp plan
 *    --json`'s line, field for field (but the planner's time), its mistakes named;
 *  - the README's `python3 -c` examples (section "From Python") run as written from a
 *    folder where a short run wrote runs/demo/log.jsonl and
 *    runs/demo/ckpt/step-00001000 (the demo's paths; the checkpoint of 2 steps, renamed)
 *    and configs/demo.json is, each exiting 0 and printing.
 * Needs a python3 with NumPy (scripts/setup installs python3-numpy): without one it
 * exits 77 (not run), saying so. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char python[64];
static char build[PATH_MAX], repo[PATH_MAX];
static char out[1 << 17];

/* The first python3 that imports numpy. */
static int find_python(void) {
  const char *candidates[] = {"python3", "/usr/bin/python3"};
  for (int i = 0; i < 2; i++) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", candidates[i]);
    if (system(cmd) == 0) {
      snprintf(python, sizeof python, "%s", candidates[i]);
      return 0;
    }
  }
  return -1;
}

/* The shell line of every README example of the section "## From Python" starting with "python3 -c". */
static int readme_examples(char lines[][4096], int cap) {
  FILE *f = fopen("README.md", "r");
  RF_ASSERT(f);
  char line[4096];
  int in = 0, n = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "## ", 3) == 0) in = strncmp(line, "## From Python", 14) == 0;
    if (in && strncmp(line, "python3 -c ", 11) == 0 && n < cap) {
      line[strcspn(line, "\n")] = 0;
      memcpy(lines[n++], line, sizeof line);
    }
  }
  fclose(f);
  return n;
}

int main(void) {
  if (find_python() != 0) {
    printf("not run: no python3 with NumPy here (scripts/setup installs python3-numpy)\n");
    return 77;
  }
  RF_ASSERT(getcwd(repo, sizeof repo));
  snprintf(build, sizeof build, "%s", rf_cli_binary());
  *strrchr(build, '/') = 0; /* BUILD/rfsdp -> BUILD */
  char tmp[] = "/tmp/rf_test_python.XXXXXX";
  RF_ASSERT(mkdtemp(tmp));
  char data[256], model[256], ck[600], st[400], log[600], demo[400], step[700];
  int rc = rf_cli_setup_tiny(tmp, 1 << 16, data, sizeof data, model, sizeof model, out, sizeof out);
  RF_CHECK(rc == 0, "prepare: rc %d\n%s", rc, out);
  snprintf(demo, sizeof demo, "%s/runs/demo", tmp);
  snprintf(ck, sizeof ck, "%s/ckpt", demo);
  snprintf(log, sizeof log, "%s/log.jsonl", demo);
  snprintf(st, sizeof st, "%s/x.safetensors", tmp);
  rc = rf_cli_sh(out, sizeof out, "mkdir -p %s", demo);
  rc = rf_cli_run_mpi(out, sizeof out, 3, 120,
                      "train --model %s --data %s --batch 6 --seq 16 --steps 2 --save-every 2 --ckpt-dir %s "
                      "--log %s --optim adamw8bit --peak-gflops 50 --print-every 0",
                      model, data, ck, log);
  RF_CHECK(rc == 0, "train W=3: rc %d\n%s", rc, out);
  snprintf(step, sizeof step, "%s/step-00000002", ck);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s", step, st);
  RF_CHECK(rc == 0, "export: rc %d\n%s", rc, out);
  static char info[1 << 16];
  rc = rf_cli_run(info, sizeof info, "ckpt info %s", step);
  RF_CHECK(rc == 0, "info: rc %d\n%s", rc, info);

  double loss[4];
  int nl = rf_cli_log_field(log, "\"loss\":", loss, 4);
  RF_CHECK(nl == 2, "%d losses logged", nl);
  /* the C side's plan of the same model, for rfsdp.plan() */
  char plan_json[600];
  snprintf(plan_json, sizeof plan_json, "%s/plan.json", tmp);
  rc = rf_cli_sh(out, sizeof out,
                 "%s plan --model %s --world 3 --batch 6 --seq 16 --optim adamw8bit --accum 2 --json > %s",
                 rf_cli_binary(), model, plan_json);
  RF_CHECK(rc == 0, "rfsdp plan --json: rc %d\n%s", rc, out);
  rc = rf_cli_sh(
      out, sizeof out,
      "PYTHONPATH=%s/python RFSDP_LIBRARY=%s/librfsdp.so %s tests/python_check.py %s %s %s %.17g %.17g "
      "--plan %s %s",
      repo, build, python, step, st, log, loss[0], loss[1], model, plan_json);
  RF_CHECK(rc == 0 && strstr(out, "0 failures"), "python_check: rc %d\n%s", rc, out);
  /* each state the module lists, as `ckpt info` lists it (name, dtype, shape) */
  int states = 0;
  for (char *p = strstr(out, "STATE "); p; p = strstr(p + 1, "STATE ")) {
    char name[256], dtype[16], shape[64], want[256], *q;
    if (sscanf(p, "STATE %255s %15s %63s", name, dtype, shape) != 3) break;
    for (q = shape; *q; q++)
      if (*q == 'x') *q = ',';
    snprintf(want, sizeof want, "[%s]", shape);
    const char *row = strstr(info, name);
    char iname[256] = "", idtype[16] = "", compact[128] = "";
    if (row) sscanf(row, "%255s %15s", iname, idtype);
    RF_CHECK(strcmp(iname, name) == 0 && strcmp(idtype, dtype) == 0, "state %s %s: ckpt info says '%s %s'",
             name, dtype, iname, idtype);
    const char *b = row ? strchr(row, '[') : NULL;
    size_t k = 0;
    for (; b && *b && *b != '\n' && k + 1 < sizeof compact; b++) {
      if (*b != ' ') compact[k++] = *b;
      if (*b == ']') break;
    }
    compact[k] = 0;
    RF_CHECK(strcmp(compact, want) == 0, "state %s: shape %s, ckpt info %s", name, want, compact);
    states++;
  }
  RF_CHECK(states >= 20, "only %d optimizer states listed", states);
  printf("%s", strstr(out, "DLPACK") ? strstr(out, "DLPACK") : "");
  RF_CHECK(strstr(out, "PLAN ") != NULL, "python_check did not compare rfsdp.plan()");

  /* the README's examples, as written, where the demo's paths exist */
  rc = rf_cli_sh(out, sizeof out, "mkdir -p %s/configs && cp configs/demo.json %s/configs/", tmp, tmp);
  RF_CHECK(rc == 0, "cannot copy configs/demo.json: %s", out);
  snprintf(out, sizeof out, "%s/step-00001000", ck);
  RF_CHECK(rename(step, out) == 0, "cannot rename %s", step);
  static char examples[8][4096];
  int n = readme_examples(examples, 8);
  RF_CHECK(n >= 3, "README.md: %d python3 -c examples in '## From Python'", n);
  for (int i = 0; i < n; i++) {
    rc = rf_cli_sh(out, sizeof out, "cd %s && PYTHONPATH=%s/python RFSDP_LIBRARY=%s/librfsdp.so %s%s", tmp,
                   repo, build, python, examples[i] + strlen("python3"));
    RF_CHECK(rc == 0 && out[0], "README example %d: rc %d\n%s\n%s", i + 1, rc, examples[i], out);
    printf("README example %d: %s", i + 1, out);
  }
  rc = rf_test_finish("test_python");
  if (rc == 0) rf_cli_sh(out, sizeof out, "rm -rf %s", tmp);
  return rc;
}
