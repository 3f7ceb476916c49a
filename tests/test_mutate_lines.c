/* rf-test: timeout=120
 * scripts/mutations stays alive: every mutation's line is found exactly once under its
 * folder (scripts/mutate --check), so a change that moves or rewrites a line a mutation
 * names fails here, in make test, instead of silently dropping the planted bug from
 * `make mutate`. The check itself is checked: a list with a line found nowhere, one
 * found twice, one without its caught-by test and one whose tests name no test (a typo
 * that scripts/run-tests refuses with exit 2, where it once ran nothing and passed) is
 * refused, naming each mutation. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

static void write_file(const char *path, const char *text) {
  FILE *f = rf_test_fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

int main(void) {
  static char out[1 << 16];
  int rc = rf_cli_sh(out, sizeof out, "scripts/mutate --check");
  RF_CHECK(rc == 0, "scripts/mutate --check: exit %d (update scripts/mutations):\n%s", rc, out);
  RF_CHECK(strstr(out, "mutations of scripts/mutations apply") != NULL, "no summary:\n%s", out);
  printf("%s", out);

  char dir[] = "/tmp/rf_test_mutate.XXXXXX", list[64];
  RF_ASSERT(mkdtemp(dir));
  snprintf(list, sizeof list, "%s/mutations", dir);
  /* a fragment that occurs nowhere, one that occurs twice in src/core/core.h */
  write_file(list,
             "name: gone\nin: src/core\nfind: this text is in no source file\nreplace: x\n"
             "tests: core\ncaught-by: test_core\n\n"
             "name: twice\nin: src/core\nfind: #define RF_\nreplace: #define RF_\ntests: core\n"
             "caught-by: test_core\n");
  rc = rf_cli_sh(out, sizeof out, "scripts/mutate --check %s", list);
  RF_CHECK(rc != 0, "a list whose lines do not apply passes --check:\n%s", out);
  const char *gone = strstr(out, "ERROR     gone"), *twice = strstr(out, "ERROR     twice");
  RF_CHECK(gone && strstr(gone, "found 0 times under src/core"), "the missing line is not named:\n%s", out);
  const char *found = twice ? strstr(twice, "found ") : NULL; /* "found N times", N >= 2 */
  RF_CHECK(found && strncmp(found, "found 0 ", 8) != 0 && strncmp(found, "found 1 ", 8) != 0,
           "the repeated line is not named:\n%s", out);
  RF_CHECK(strstr(out, "0 of 2 mutations"), "the summary does not count them:\n%s", out);

  write_file(list, "name: nobody\nin: src/core\nfind: rf_xalloc_bytes(void)\nreplace: x\ntests: core\n");
  rc = rf_cli_sh(out, sizeof out, "scripts/mutate --check %s", list);
  RF_CHECK(rc == 2 && strstr(out, "'nobody' needs") && strstr(out, "caught-by"),
           "a mutation without caught-by: exit %d\n%s", rc, out);

  write_file(list,
             "name: typo\nin: src/core\nfind: rf_xalloc_bytes(void)\nreplace: x\ntests: test_cor$\n"
             "caught-by: test_core\n");
  rc = rf_cli_sh(out, sizeof out, "scripts/mutate --check %s", list);
  RF_CHECK(rc != 0 && strstr(out, "ERROR     typo") && strstr(out, "names no test: test_cor$"),
           "a mutation whose tests name no test: exit %d\n%s", rc, out);
  rc = rf_cli_sh(out, sizeof out, "scripts/run-tests build test_cor$");
  RF_CHECK(rc == 2 && strstr(out, "'test_cor$' names no test"),
           "run-tests with a name of no test: exit %d\n%s", rc, out);

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_mutate_lines");
}
