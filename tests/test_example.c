/* rf-test: timeout=180
 * docs/example/mlp.c built the way a library user builds it: `make install` into a
 * temporary PREFIX, then compiled with nothing but `pkg-config --cflags --libs
 * rfsdp` (so every header it needs must be installed, and none of src/). Then, for
 * AdamW and 8-bit AdamW: 4 steps at W=2 and a save, a resume at W=3 for 4 more,
 * against 8 uninterrupted steps at W=1: the losses of steps 5-8 and the digest of
 * the final parameters are bit-identical (the example prints them in hex), and the
 * first 4 steps' losses at W=2 equal those at W=1. */
#include <libgen.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static char dir[64] = "/tmp/rf_test_example.XXXXXX";

/* Runs a shell command; its output in out. Returns the exit code. */
static int run(char *out, int cap, const char *fmt, ...) {
  char cmd[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
  FILE *p = popen(cmd, "r");
  if (!p) return -1;
  size_t n = fread(out, 1, (size_t)cap - 1, p);
  out[n] = 0;
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

/* The line of `out` that starts with `prefix` (up to " (W=" or the end of the
 * line) into line; 0 when there is none. */
static int find_line(const char *out, const char *prefix, char *line, size_t cap) {
  for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
    if (strncmp(p, prefix, strlen(prefix)) != 0) continue;
    size_t n = strcspn(p, "\n");
    const char *w = strstr(p, " (W=");
    if (w && (size_t)(w - p) < n) n = (size_t)(w - p);
    snprintf(line, cap, "%.*s", (int)n, p);
    return 1;
  }
  return 0;
}

static void check_optim(const char *bin, const char *optim) {
  static char full[16384], first[16384], second[16384];
  char ckpt[256], a[256], b[256], key[64];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", dir, optim);
  int rc = run(full, sizeof full, "scripts/rfmpirun -np 1 %s --optim %s --steps 8", bin, optim);
  RF_CHECK(rc == 0, "%s: 8 steps at W=1: rc %d\n%s", optim, rc, full);
  rc = run(first, sizeof first, "scripts/rfmpirun -np 2 %s --optim %s --steps 4 --save %s", bin, optim, ckpt);
  RF_CHECK(rc == 0, "%s: 4 steps at W=2 and a save: rc %d\n%s", optim, rc, first);
  rc = run(second, sizeof second, "scripts/rfmpirun -np 3 %s --optim %s --steps 8 --resume %s", bin, optim,
           ckpt);
  RF_CHECK(rc == 0 && strstr(second, "resumed from"), "%s: resume at W=3: rc %d\n%s", optim, rc, second);
  for (int s = 1; s <= 8; s++) {
    snprintf(key, sizeof key, "step %d loss ", s);
    RF_CHECK(find_line(full, key, a, sizeof a), "%s: no loss of step %d at W=1\n%s", optim, s, full);
    RF_CHECK(find_line(s <= 4 ? first : second, key, b, sizeof b), "%s: no loss of step %d\n%s", optim, s,
             s <= 4 ? first : second);
    RF_CHECK(strcmp(a, b) == 0, "%s step %d: '%s' uninterrupted at W=1, '%s' %s", optim, s, a, b,
             s <= 4 ? "at W=2" : "resumed at W=3");
  }
  RF_CHECK(find_line(full, "params ", a, sizeof a) && find_line(second, "params ", b, sizeof b),
           "%s: no parameter digest", optim);
  RF_CHECK(strcmp(a, b) == 0, "%s: final parameters '%s' uninterrupted, '%s' resumed", optim, a, b);
  printf("%-9s W=2 -> save -> W=3 equals W=1 over 8 steps: %s\n", optim, a);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char build[4096], out[16384], path[4400], bin[4400];
  rf_cli_build_dir(build, sizeof build); /* "build": the .d targets make all writes */
  int rc = run(out, sizeof out,
               "env -u MAKEFLAGS -u MAKELEVEL make -s --no-print-directory install BUILD=%s PREFIX=%s", build,
               dir);
  RF_CHECK(rc == 0, "make install: rc %d\n%s", rc, out);
  static const char *installed[] = {"include/rfsdp.h", "include/rfsdp_optim.h", "include/rfsdp_run.h",
                                    "lib/librfsdp.a", "lib/pkgconfig/rfsdp.pc"};
  for (size_t i = 0; i < sizeof installed / sizeof installed[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, installed[i]);
    RF_CHECK(access(path, F_OK) == 0, "make install did not install %s", installed[i]);
  }
  /* the installed rfsdp finds its machine profiles in PREFIX/share/rfsdp/network, run from
   * outside the checkout (its configs/network not in reach) */
  snprintf(path, sizeof path, "%s/share/rfsdp/network/h100-ib.json", dir);
  RF_CHECK(access(path, F_OK) == 0, "make install did not install the machine profiles (%s)", path);
  rc = run(out, sizeof out,
           "cp configs/demo.json %s/ && cd %s && ./bin/rfsdp plan --model demo.json --world 2 "
           "--batch 2 --seq 8 --network h100-ib --json",
           dir, dir);
  RF_CHECK(rc == 0 && strstr(out, "\"network\":\"h100-ib\""),
           "installed rfsdp plan --network h100-ib: rc %d\n%s", rc, out);
  /* a sanitized build's library needs the sanitizer runtime in the program too */
  const char *san = "";
#if defined(__SANITIZE_ADDRESS__)
  san = "-fsanitize=address,undefined";
#endif
  snprintf(bin, sizeof bin, "%s/mlp", dir);
  rc = run(out, sizeof out,
           "PKG_CONFIG_PATH=%s/lib/pkgconfig cc -std=c11 -O2 -Wall -Wextra -Werror %s docs/example/mlp.c "
           "$(PKG_CONFIG_PATH=%s/lib/pkgconfig pkg-config --cflags --libs rfsdp) -o %s",
           dir, san, dir, bin);
  RF_CHECK(rc == 0, "compiling docs/example/mlp.c against the installed library: rc %d\n%s", rc, out);
  if (rc == 0) {
    check_optim(bin, "adamw");
    check_optim(bin, "adamw8bit");
  }
  snprintf(path, sizeof path, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(path) == 0, "cleanup");
  return rf_test_finish("test_example");
}
