/* rf-test: timeout=400
 * The CI subset of `make mutate`: the mutations of scripts/mutations marked `ci: yes`
 * (those whose tests are fast) are planted one at a time in a scratch copy of the tree
 * (scripts/mutate --ci, which copies this test's build folder and rebuilds only what a
 * mutation touches); each must be caught by its caught-by test, and the tests must
 * pass on the unmutated copy first. A surviving mutation, one that no longer applies or
 * does not compile, or one caught only by another test fails this test. In a
 * sanitizer build (make test-asan) it exits 77, not run: the scratch build would
 * mix its flags with the default ones; make test runs it. Under
 * RF_TEST_TIME_SCALE alone (a slow machine) it runs. */
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define RF_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define RF_TEST_SANITIZED 1
#endif
#endif

int main(void) {
#ifdef RF_TEST_SANITIZED
  printf("test_mutate_ci: not run: a sanitizer build (make test runs it)\n");
  return 77;
#endif
  /* (under RF_TEST_TIME_SCALE, a slow machine's, it runs: run-tests scales its limit and its tests') */
  /* the build folder: this binary is BUILD/tests/test_mutate_ci; run-tests runs from the root */
  char self[4096], build[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  RF_ASSERT(n > 0);
  self[n] = '\0';
  char *tests_dir = dirname(self);
  snprintf(build, sizeof build, "%s", dirname(tests_dir));
  char cwd[4096];
  RF_ASSERT(getcwd(cwd, sizeof cwd));
  size_t lc = strlen(cwd);
  const char *rel = strncmp(build, cwd, lc) == 0 && build[lc] == '/' ? build + lc + 1 : build;
  static char out[1 << 18];
  int rc = rf_cli_sh(out, sizeof out, "scripts/mutate --ci --build %s", rel);
  printf("%s", out);
  RF_CHECK(rc == 0, "scripts/mutate --ci --build %s: exit %d (see above)", rel, rc);
  RF_CHECK(strstr(out, " 0 survived, 0 known survivors, 0 errors") != NULL, "not every mutation caught");
  printf("(%.0f s)\n", rf_cli_last_seconds());
  return rf_test_finish("test_mutate_ci");
}
