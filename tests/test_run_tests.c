/* rf-test: timeout=60
 * scripts/run-tests reports what did not run, never as passed and never silently:
 * in a scratch tree with four stand-in tests (one passes, one exits 77 after saying
 * why, one passes with a part it could not run: "not run in part: WHY", as
 * rf_test_not_run makes rf_test_finish end, one fails), the runner exits 1, counts
 * "2 passed, 1 failed, 1 not run", and ends with one line per test that did not
 * run, or did not run in part, each with its reason. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static void write_file(const char *path, const char *text, int mode) {
  FILE *f = rf_test_fopen(path, "w");
  fputs(text, f);
  fclose(f);
  RF_ASSERT(chmod(path, (mode_t)mode) == 0);
}

int main(void) {
  char dir[] = "/tmp/rf_test_run_tests.XXXXXX", path[256];
  RF_ASSERT(mkdtemp(dir));
  static const struct {
    const char *name, *body;
  } stand_ins[] = {
      {"test_pass", "echo 'test_pass: 1 checks, 0 failed'\nexit 0\n"},
      {"test_skip", "echo 'test_skip: not run: no such device here'\nexit 77\n"},
      {"test_part", "echo 'test_part: 3 checks, 0 failed'\necho 'not run in part: no gdb here'\nexit 0\n"},
      {"test_fail", "echo 'check failed: on purpose'\nexit 1\n"},
  };
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "mkdir -p %s/scripts %s/tests %s/b/tests && cp scripts/run-tests %s/scripts/",
           dir, dir, dir, dir);
  RF_ASSERT(system(cmd) == 0);
  for (size_t i = 0; i < sizeof stand_ins / sizeof stand_ins[0]; i++) {
    snprintf(path, sizeof path, "%s/tests/%s.c", dir, stand_ins[i].name);
    write_file(path, "/* rf-test: timeout=20 */\n", 0644);
    char script[512];
    snprintf(script, sizeof script, "#!/bin/sh\n%s", stand_ins[i].body);
    snprintf(path, sizeof path, "%s/b/tests/%s", dir, stand_ins[i].name);
    write_file(path, script, 0755);
  }
  static char out[1 << 14];
  int rc = rf_cli_sh(out, sizeof out, "%s/scripts/run-tests b", dir);
  for (const char *l = out; *l;) { /* indented: this test's own log must not read as a report */
    const char *e = strchr(l, '\n');
    int n = e ? (int)(e - l) : (int)strlen(l);
    printf("  | %.*s\n", n, l);
    l += n + (e != NULL);
  }
  RF_CHECK(rc == 1, "run-tests with a failing test: exit %d", rc);
  RF_CHECK(strstr(out, "2 passed, 1 failed, 1 not run"), "the counts");
  RF_CHECK(strstr(out, "SKIP  test_skip"), "the test that exited 77 is not reported as SKIP");
  RF_CHECK(strstr(out, "(not run in part: no gdb here)"), "the partly run test's line does not say so");
  /* the list at the end, after the failures, one line each with its reason */
  const char *failed = strstr(out, "\nfailed: test_fail\n");
  const char *skip =
      failed ? strstr(failed, "\nnot run: test_skip: test_skip: not run: no such device here\n") : NULL;
  const char *part = skip ? strstr(skip, "\nnot run in part: test_part: no gdb here\n") : NULL;
  RF_CHECK(failed && skip && part, "the end of the output does not list what did not run, with reasons");
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_run_tests");
}
