/* rf-test: timeout=240
 * docs/example/llama.c built the way a library user builds it (`make install`
 * into a temporary PREFIX, then nothing but `pkg-config --cflags --libs rfsdp`),
 * against `rfsdp train --min-lr-ratio 1` (the same step at a constant learning
 * rate) on a tiny llama and token files from `rfsdp prepare`:
 *  - W = 1, 8 steps: the same loss at every step (the printed %.9g) and the same
 *    final checkpoint, every rank file bit for bit;
 *  - W = 2, 4 steps and a save, resumed at W = 3 for 4 more (resharding): the
 *    same losses as `rfsdp train` run and resumed the same way, the same rank
 *    files at step 4 (W = 2) and at step 8 (W = 3), and within 1e-5 relative of
 *    the W = 1 run's losses (the runs agree across W within rounding). */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define STEPS 8
static char dir[64] = "/tmp/rf_test_example_llama.XXXXXX";

/* The example's printed losses ("step S loss L ...") into loss[S-1]; returns how many. */
static int example_losses(const char *out, double *loss) {
  int n = 0;
  for (const char *p = out; (p = strstr(p, "step ")) != NULL; p++) {
    int s = 0;
    double l = 0;
    if (sscanf(p, "step %d loss %lf", &s, &l) == 2 && s >= 1 && s <= STEPS) {
      loss[s - 1] = l;
      n++;
    }
  }
  return n;
}

/* The same %.9g text: the log prints %.9g, so does the example. */
static int same_text(double a, double b) {
  char x[64], y[64];
  snprintf(x, sizeof x, "%.9g", a);
  snprintf(y, sizeof y, "%.9g", b);
  return strcmp(x, y) == 0;
}

static void check_files(const char *a, const char *b, int world, const char *what) {
  char fa[512], fb[512];
  for (int r = 0; r < world; r++) {
    snprintf(fa, sizeof fa, "%s/rank-%05d.bin", a, r);
    snprintf(fb, sizeof fb, "%s/rank-%05d.bin", b, r);
    RF_CHECK(rf_test_files_equal(fa, fb), "%s: rank %d's checkpoint differs from rfsdp train's", what, r);
  }
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  static char out[32768];
  char build[4096], bin[4400], model[256], data[256], text[256];
  rf_cli_build_dir(build, sizeof build); /* "build": the .d targets make all writes */
  int rc = rf_cli_sh(out, sizeof out,
                     "env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory install BUILD=%s PREFIX=%s",
                     build, dir);
  RF_CHECK(rc == 0, "make install: rc %d\n%s", rc, out);
  const char *san = "";
#if defined(__SANITIZE_ADDRESS__)
  san = "-fsanitize=address,undefined";
#endif
  snprintf(bin, sizeof bin, "%s/llama", dir);
  rc = rf_cli_sh(
      out, sizeof out,
      "PKG_CONFIG_PATH=%s/lib/pkgconfig cc -std=c11 -O2 -Wall -Wextra -Werror %s docs/example/llama.c "
      "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs rfsdp) -o %s",
      dir, san, dir, bin);
  RF_CHECK(rc == 0, "compiling docs/example/llama.c against the installed library: rc %d\n%s", rc, out);
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  snprintf(text, sizeof text, "%s/verses.txt", dir);
  snprintf(data, sizeof data, "%s/verses", dir);
  rf_cli_write_tiny_model(model);
  rf_cli_write_verses(text, 60000);
  rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s", text, data);
  RF_CHECK(rc == 0, "prepare: rc %d\n%s", rc, out);
  if (rf_test_failures) return rf_test_finish("test_example_llama");

  const char *train =
      "--batch 6 --seq 16 --lr 3e-3 --seed 7 --min-lr-ratio 1 --peak-gflops 50 --print-every 0";
  const char *mpi = "OMP_NUM_THREADS=1 scripts/rfmpirun -np";
  double ex1[STEPS], ex23[STEPS], ref[STEPS], got[STEPS];
  char a[512], b[512], log[512];
  /* W = 1: 8 steps each */
  rc = rf_cli_sh(out, sizeof out, "%s 1 %s --model %s --data %s --steps 8 --save %s/ex1", mpi, bin, model,
                 data, dir);
  RF_CHECK(rc == 0 && example_losses(out, ex1) == STEPS, "example W=1: rc %d\n%s", rc, out);
  snprintf(log, sizeof log, "%s/t1.jsonl", dir);
  rc = rf_cli_run_mpi(out, sizeof out, 1, 120,
                      "train --model %s --data %s %s --steps 8 --save-every 8 --ckpt-dir %s/t1 --log %s",
                      model, data, train, dir, log);
  RF_CHECK(rc == 0 && rf_cli_log_field(log, "\"loss\":", ref, STEPS) == STEPS, "train W=1: rc %d\n%s", rc,
           out);
  for (int s = 0; s < STEPS; s++)
    RF_CHECK(same_text(ex1[s], ref[s]), "W=1 step %d: loss %.9g in the example, %.9g by rfsdp train", s + 1,
             ex1[s], ref[s]);
  snprintf(a, sizeof a, "%s/ex1", dir);
  snprintf(b, sizeof b, "%s/t1/step-00000008", dir);
  check_files(a, b, 1, "W=1 step 8");

  /* W = 2 for 4 steps, saved, resumed at W = 3 */
  rc = rf_cli_sh(out, sizeof out, "%s 2 %s --model %s --data %s --steps 4 --save %s/ex2", mpi, bin, model,
                 data, dir);
  RF_CHECK(rc == 0 && example_losses(out, ex23) == 4, "example W=2: rc %d\n%s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "%s 3 %s --model %s --data %s --steps 8 --resume %s/ex2 --save %s/ex3", mpi,
                 bin, model, data, dir, dir);
  RF_CHECK(rc == 0 && strstr(out, "resumed from") && example_losses(out, ex23) == 4,
           "example resumed at W=3: rc %d\n%s", rc, out);
  snprintf(log, sizeof log, "%s/t2.jsonl", dir);
  rc = rf_cli_run_mpi(out, sizeof out, 2, 120,
                      "train --model %s --data %s %s --steps 4 --save-every 4 --ckpt-dir %s/t2 --log %s",
                      model, data, train, dir, log);
  RF_CHECK(rc == 0 && rf_cli_log_field(log, "\"loss\":", got, 4) == 4, "train W=2: rc %d\n%s", rc, out);
  snprintf(log, sizeof log, "%s/t3.jsonl", dir);
  rc = rf_cli_run_mpi(out, sizeof out, 3, 120,
                      "train --model %s --data %s %s --steps 8 --save-every 8 --resume %s/t2/step-00000004 "
                      "--ckpt-dir %s/t3 --log %s",
                      model, data, train, dir, dir, log);
  RF_CHECK(rc == 0 && rf_cli_log_field(log, "\"loss\":", got + 4, 4) == 4, "train resumed at W=3: rc %d\n%s",
           rc, out);
  for (int s = 0; s < STEPS; s++) {
    RF_CHECK(same_text(ex23[s], got[s]), "W=%d step %d: loss %.9g in the example, %.9g by rfsdp train",
             s < 4 ? 2 : 3, s + 1, ex23[s], got[s]);
    RF_CHECK(fabs(ex23[s] - ex1[s]) <= 1e-5 * fabs(ex1[s]), "step %d: loss %.9g at W=%d, %.9g at W=1", s + 1,
             ex23[s], s < 4 ? 2 : 3, ex1[s]);
  }
  snprintf(a, sizeof a, "%s/ex2", dir);
  snprintf(b, sizeof b, "%s/t2/step-00000004", dir);
  check_files(a, b, 2, "W=2 step 4");
  snprintf(a, sizeof a, "%s/ex3", dir);
  snprintf(b, sizeof b, "%s/t3/step-00000008", dir);
  check_files(a, b, 3, "W=3 step 8 (resumed from W=2)");
  printf(
      "docs/example/llama.c = rfsdp train: W=1 8 steps, W=2 -> save -> W=3: losses and rank files equal\n");
  snprintf(a, sizeof a, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(a) == 0, "cleanup");
  return rf_test_finish("test_example_llama");
}
