/* rf-test: timeout=60
 * The public boundary as docs/architecture.md states it, read from the sources
 * (tests/test_layers.c checks each folder's includes):
 *  - <mpi.h> is included by include/rfsdp_mpi.h and src/comm/comm_mpi.h only;
 *  - tools/ calls no MPI function and no model layer function (the model through
 *    the binding of src/model/train.c);
 *  - no getenv of an RF_TEST_ variable in src/ (test hooks are setters, declared in the internal
 *    src/run/test_control.h, none in include/); the variables are named in tools/test_hooks.c alone,
 *    and the release command (BUILD/rfsdp-release, what `make install` installs) holds none of
 *    their names, while the tests' BUILD/rfsdp holds them (the check can see them);
 *  - the command is a client of include/ (the porch parses and prints): every file
 *    of tools/ and every tools/ header it includes, followed down, include only public
 *    headers (include/) and system headers, never a src/ folder's, except the files of
 *    `rf_porch_allowed` below, each with its reason; a listed file that no longer
 *    includes an internal header fails too (the list only shrinks), and so does a
 *    file outside the list that includes one of the listed headers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

/* Each line of a shell command's output to fn. */
static int each_line(const char *cmd, void (*fn)(const char *line, void *ctx), void *ctx) {
  FILE *p = popen(cmd, "r");
  RF_ASSERT(p);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    if (fn) fn(line, ctx);
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

/* The tools/ files that still include internal headers, and why. */
static const struct {
  const char *file, *why;
} rf_porch_allowed[] = {
    {"tools/test_hooks.c",
     "the test door: src/run/test_control.h's setters, built into BUILD/rfsdp only, never into the installed "
     "rfsdp-release"},
};

static const char *porch_allowed(const char *path) {
  for (size_t i = 0; i < sizeof rf_porch_allowed / sizeof rf_porch_allowed[0]; i++)
    if (strcmp(rf_porch_allowed[i].file, path) == 0) return rf_porch_allowed[i].why;
  return NULL;
}

/* The violations of the porch `path` (a tools/ file): an #include "DIR/..." of a
 * src/ folder, of a header that is neither in include/ nor in tools/, or of a tools/
 * header allowed internal includes (tools/ headers are followed, at most `depth` deep). */
static int porch_includes(const char *path, int depth, int report) {
  FILE *f = fopen(path, "r");
  RF_CHECK(f != NULL, "%s: cannot open", path);
  if (!f) return 1;
  char line[1024], name[256];
  int bad = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, " #include \"%255[^\"]\"", name) != 1) continue;
    char pub[300], own[300];
    snprintf(pub, sizeof pub, "include/%s", name);
    snprintf(own, sizeof own, "tools/%s", name);
    FILE *x = NULL;
    if (strchr(name, '/')) {
      if (report)
        RF_CHECK(0, "%s includes \"%s\": a src/ folder's header (the command must be a client of include/)",
                 path, name);
      bad++;
    } else if ((x = fopen(pub, "r"))) {
      fclose(x);
    } else if ((x = fopen(own, "r"))) {
      fclose(x);
      if (porch_allowed(own)) {
        if (report)
          RF_CHECK(0, "%s includes \"%s\", a header with internal includes (%s)", path, name,
                   porch_allowed(own));
        bad++;
      } else if (depth > 0) {
        bad += porch_includes(own, depth - 1, report);
      }
    } else {
      if (report) RF_CHECK(0, "%s includes \"%s\", found in neither include/ nor tools/", path, name);
      bad++;
    }
  }
  fclose(f);
  return bad;
}

int main(void) {
  int n = each_line("grep -rl '#include <mpi.h>' src include tools", mpi_header, NULL);
  RF_CHECK(n == 1, "%d files include <mpi.h>, expected include/rfsdp_mpi.h alone", n);
  each_line("grep -rnE '\\bMPI_[A-Z][a-z_]+ *\\(' tools", must_be_empty, "tools/ calls MPI");
  each_line("grep -rnE 'rf_model_(layer|embed|head|moe|linear|attention|rmsnorm)_[a-z_]+ *\\(' tools",
            must_be_empty, "tools/ calls a model layer function");
  each_line("grep -rn 'getenv(\"RF_TEST_' src", must_be_empty, "src/ reads a test hook from the environment");
  each_line("grep -rn '\"RF_TEST_' src tools | grep -v '^tools/test_hooks\\.c:'", must_be_empty,
            "an RF_TEST_ variable named outside tools/test_hooks.c");
  each_line("grep -rn 'rf_run_test_' include", must_be_empty, "a test hook in the public API");
  char build[4096], cmd[8800], bin[4400];
  rf_cli_build_dir(build, sizeof build);
  snprintf(bin, sizeof bin, "%s/rfsdp-release", build);
  RF_CHECK(access(bin, X_OK) == 0, "%s: no release command (make all builds it)", bin);
  snprintf(cmd, sizeof cmd, "strings %s | grep RF_TEST_", bin);
  each_line(cmd, must_be_empty, "the release command names a test hook");
  snprintf(cmd, sizeof cmd,
           "strings %s/rfsdp | grep -E '^RF_TEST_(DIE_IN_SAVE|ASYNC_COPY_LATE|START_PAUSE)$'", build);
  int hooks = each_line(cmd, NULL, NULL);
  RF_CHECK(hooks == 3, "the tests' %s/rfsdp names %d of the 3 test hooks", build, hooks);
  /* the check catches a planted internal include */
  char planted[] = "/tmp/rf_test_boundary_porch.XXXXXX";
  int fd = mkstemp(planted);
  RF_ASSERT(fd >= 0);
  const char *text = "#include \"options.h\"\n#include \"rfsdp_plan.h\"\n#include \"model/model.h\"\n";
  RF_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
  RF_CHECK(porch_includes(planted, 4, 0) == 1, "a planted include of model/model.h is found");
  unlink(planted);
  /* every file of tools/ but the allowed; the allowed still need it */
  FILE *ls = popen("ls tools/*.c tools/*.h", "r");
  RF_ASSERT(ls);
  char path[512];
  int files = 0, clients = 0;
  while (fgets(path, sizeof path, ls)) {
    path[strcspn(path, "\n")] = 0;
    files++;
    if (porch_allowed(path)) {
      RF_CHECK(porch_includes(path, 0, 0) > 0,
               "%s is listed as including internal headers (%s) but includes none: take it off the list",
               path, porch_allowed(path));
      continue;
    }
    clients++;
    int porch_bad = porch_includes(path, 4, 1);
    RF_CHECK(porch_bad == 0, "%s: %d internal include(s)", path, porch_bad);
  }
  pclose(ls);
  RF_CHECK(clients >= 10 && porch_allowed("tools/cmd_plan.c") == NULL, "%d of %d tools/ files checked",
           clients, files);
  printf(
      "<mpi.h> in include/rfsdp_mpi.h alone; tools/ free of MPI and model layers; no getenv hooks in src/; "
      "RF_TEST_* read by tools/test_hooks.c alone, none in rfsdp-release; "
      "tools/ a client of include/ but the listed files\n");
  return rf_test_finish("test_boundary");
}
