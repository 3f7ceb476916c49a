/* rf-test: timeout=120
 * Every committed fuzz input through the same entry points the libFuzzer targets
 * use (fuzz/rf_fuzz.c), without libFuzzer: the findings once fixed
 * (fuzz/regress/TARGET/) and the seed corpus (fuzz/corpus/TARGET/). Each must be
 * read (or refused) without a crash; under `make test-asan` also without a leak or
 * undefined behaviour. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_fuzz.h"
#include "rf_test.h"

/* Feeds every file of folder/target to the target; returns the count. */
static int run_folder(const char *folder, const struct rf_fuzz_target *t) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", folder, t->name);
  DIR *d = opendir(path);
  if (!d) return 0;
  int n = 0;
  const struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char file[1024];
    snprintf(file, sizeof file, "%s/%s", path, e->d_name);
    char *bytes;
    size_t size;
    RF_CHECK(rf_file_read_all(file, &bytes, &size) == 0, "%s: %s", file, rf_error_msg());
    if (!bytes) continue;
    RF_CHECK(t->run((const uint8_t *)bytes, size) == 0, "%s: target %s", file, t->name);
    free(bytes);
    n++;
  }
  closedir(d);
  return n;
}

int main(void) {
  int regress = 0;
  for (int i = 0; i < rf_fuzz_n_targets; i++) {
    const struct rf_fuzz_target *t = &rf_fuzz_targets[i];
    int seeds = run_folder("fuzz/corpus", t);
    RF_CHECK(seeds > 0, "fuzz/corpus/%s: no seed inputs", t->name);
    regress += run_folder("fuzz/regress", t);
  }
  printf("fuzz regression: %d committed findings, %d targets\n", regress, rf_fuzz_n_targets);
  return rf_test_finish("test_fuzz_regress");
}
