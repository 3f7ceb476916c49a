/* rf-test: timeout=60
 * The public boundary as docs/architecture.md states it, read from the sources
 * (tests/test_layers.c checks each folder's includes):
 *  - <mpi.h> is included by include/rfsdp_mpi.h and src/comm/comm_mpi.h only;
 *  - tools/ calls no MPI function and no model layer function (the model through
 *    the binding of src/model/train.c);
 *  - no getenv of an RF_TEST_ variable in src/ (test hooks are setters). */
#include <stdio.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"

/* Each line of a shell command's output to fn. */
static int each_line(const char *cmd, void (*fn)(const char *line, void *ctx), void *ctx) {
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    fn(line, ctx);
    n++;
  }
  pclose(p);
  return n;
}

static void must_be_empty(const char *line, void *ctx) { RF_CHECK(0, "%s: %s", (const char *)ctx, line); }

static void mpi_header(const char *line, void *ctx) {
  (void)ctx;
  RF_CHECK(strcmp(line, "include/rfsdp_mpi.h") == 0 || strcmp(line, "src/comm/comm_mpi.h") == 0,
           "%s includes <mpi.h> (only include/rfsdp_mpi.h and src/comm/comm_mpi.h may)", line);
}

int main(void) {
  int n = each_line("grep -rl '#include <mpi.h>' src include tools", mpi_header, NULL);
  RF_CHECK(n == 1, "%d files include <mpi.h>, expected include/rfsdp_mpi.h alone", n);
  each_line("grep -rnE '\\bMPI_[A-Z][a-z_]+ *\\(' tools", must_be_empty, "tools/ calls MPI");
  each_line("grep -rnE 'rf_model_(layer|embed|head|moe|linear|attention|rmsnorm)_[a-z_]+ *\\(' tools",
            must_be_empty, "tools/ calls a model layer function");
  each_line("grep -rn 'getenv(\"RF_TEST_' src", must_be_empty, "src/ reads a test hook from the environment");
  printf(
      "<mpi.h> in include/rfsdp_mpi.h alone; tools/ free of MPI and model layers; no getenv hooks in src/\n");
  return rf_test_finish("test_boundary");
}
