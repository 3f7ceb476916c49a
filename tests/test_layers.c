/* rf-test: timeout=30
 * The folder chain of docs/architecture.md holds in the code: the sentence "Each
 * folder's includes (...): dir: a, b; ..." is read from the page, and every
 * `#include "X/..."` of every file under src/DIR must name DIR itself or a folder the
 * sentence lists for DIR (a folder allowed in one file only, "(and X in `FILE`
 * only ...)", is allowed there only). A folder of src/ the sentence does not name
 * fails, and so does a planted include that breaks the chain (checked on a line
 * written here).
 * The headers under src/ (.h, .cuh) include each other without a circle (a planted
 * circle is caught), and no file under src/ includes the umbrella model/model.h (it is
 * for tests and benches; src/model's files include config.h, desc.h, ops.h,
 * workspace.h, the pieces they use). */
#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"

#define MAX_DIRS 32
#define MAX_DEPS 16

struct rule {
  char dir[256];
  int n;
  char deps[MAX_DEPS][128];
  char only_file[MAX_DEPS][128]; /* "" or the one file the dep is allowed in */
};

static struct rule rules[MAX_DIRS];
static int n_rules;

static struct rule *rule_of(const char *dir) {
  for (int i = 0; i < n_rules; i++)
    if (strcmp(rules[i].dir, dir) == 0) return &rules[i];
  return NULL;
}

/* Parses "dir: a, b (and c in `src/x/y.c` only: ...); dir2: ..." (backquotes and
 * newlines already in place; the text ends at the first '.' outside a parenthesis). */
static void parse_rules(const char *text) {
  const char *p = text;
  while (*p && n_rules < MAX_DIRS) {
    while (*p == ' ' || *p == '\n' || *p == ';') p++;
    const char *colon = strchr(p, ':');
    if (!colon) break;
    struct rule *r = &rules[n_rules++];
    snprintf(r->dir, sizeof r->dir, "%.*s", (int)(colon - p), p);
    p = colon + 1;
    int depth = 0;
    char word[128];
    int wn = 0;
    for (; *p; p++) {
      if (depth == 0 && (*p == ';' || *p == '.')) break;
      if (*p == '(') {
        /* "(and X in `FILE` only" */
        char dep[128], file[128];
        if (sscanf(p, "(and %127s in `%127[^`]` only", dep, file) == 2 && r->n < MAX_DEPS) {
          snprintf(r->deps[r->n], sizeof r->deps[r->n], "%s", dep);
          snprintf(r->only_file[r->n], sizeof r->only_file[r->n], "%s", file);
          r->n++;
        }
        depth++;
      } else if (*p == ')') {
        depth--;
      } else if (depth == 0) {
        if (isalpha((unsigned char)*p) || *p == '_') {
          if (wn < (int)sizeof word - 1) word[wn++] = *p;
        } else if (wn) {
          word[wn] = 0;
          if (r->n < MAX_DEPS)
            snprintf(r->deps[r->n++], sizeof r->deps[0], "%s", word), r->only_file[r->n - 1][0] = 0;
          wn = 0;
        }
      }
    }
    if (wn && r->n < MAX_DEPS) {
      word[wn] = 0;
      snprintf(r->deps[r->n++], sizeof r->deps[0], "%s", word);
      r->only_file[r->n - 1][0] = 0;
    }
    if (*p == '.') break;
  }
}

/* 1 when file (src/DIR/NAME) may include folder `dep`. */
static int allowed(const struct rule *r, const char *file, const char *dep) {
  if (strcmp(r->dir, dep) == 0) return 1;
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->deps[i], dep) == 0 && (!r->only_file[i][0] || strcmp(r->only_file[i], file) == 0)) return 1;
  return 0;
}

/* The violations of one line ("#include \"X/...\""), 0 or 1. */
static int check_line(const struct rule *r, const char *file, const char *line) {
  char dep[64], slash = 0;
  if (sscanf(line, " #include \"%63[a-z_]%c", dep, &slash) != 2 || slash != '/')
    return 0; /* public headers */
  if (allowed(r, file, dep)) return 0;
  return 1;
}

static int check_file(const struct rule *r, const char *path) {
  FILE *f = rf_test_fopen(path, "r");
  char line[1024];
  int bad = 0, n = 0;
  while (fgets(line, sizeof line, f)) {
    n++;
    if (check_line(r, path, line)) {
      RF_CHECK(0, "%s:%d: %s includes a folder docs/architecture.md does not allow for src/%s", path, n,
               strtok(line, "\n"), r->dir);
      bad++;
    }
  }
  fclose(f);
  return bad;
}

/* The header graph of src/: node i is a header "DIR/NAME" (as #include names it), its
 * edges the headers it includes. */
#define MAX_HEADERS 256
static char hname[MAX_HEADERS][128];
static int n_headers;
static unsigned char edge[MAX_HEADERS][MAX_HEADERS];

static int header_id(const char *name) {
  for (int i = 0; i < n_headers; i++)
    if (strcmp(hname[i], name) == 0) return i;
  RF_ASSERT(n_headers < MAX_HEADERS);
  snprintf(hname[n_headers], sizeof hname[0], "%s", name);
  return n_headers++;
}

/* 1 when a circle is reachable from node i (state: 0 unseen, 1 on the path, 2 done);
 * the circle's nodes are printed. */
static int circle_from(int i, unsigned char *state) {
  state[i] = 1;
  for (int j = 0; j < n_headers; j++) {
    if (!edge[i][j]) continue;
    if (state[j] == 1 || (state[j] == 0 && circle_from(j, state))) {
      printf("  in a circle: %s includes %s\n", hname[i], hname[j]);
      return 1;
    }
  }
  state[i] = 2;
  return 0;
}

static int header_circles(void) {
  unsigned char state[MAX_HEADERS] = {0};
  for (int i = 0; i < n_headers; i++)
    if (state[i] == 0 && circle_from(i, state)) return 1;
  return 0;
}

/* Adds the includes of src/DIR/NAME (a header) to the graph; counts includes of the
 * umbrella model/model.h by any file of src/ but the umbrella itself. */
static int read_includes(const char *dir, const char *name, int is_header) {
  char path[700], line[1024], inc[128];
  snprintf(path, sizeof path, "src/%s/%s", dir, name);
  FILE *f = rf_test_fopen(path, "r");
  char self[300];
  snprintf(self, sizeof self, "%s/%s", dir, name);
  int from = is_header ? header_id(self) : -1, umbrella = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, " #include \"%127[^\"]\"", inc) != 1 || !strchr(inc, '/')) continue;
    if (strcmp(inc, "model/model.h") == 0 && strcmp(self, "model/model.h") != 0) {
      RF_CHECK(0, "%s includes the umbrella model/model.h (include the pieces it uses)", path);
      umbrella++;
    }
    if (from >= 0) edge[from][header_id(inc)] = 1;
  }
  fclose(f);
  return umbrella;
}

int main(void) {
  char *doc = NULL;
  size_t bytes = 0;
  RF_ASSERT(rf_file_read_all("docs/architecture.md", &doc, &bytes) == 0);
  const char *key = "Each folder's includes";
  char *at = strstr(doc, key);
  RF_CHECK(at != NULL, "docs/architecture.md has the sentence \"%s\"", key);
  if (!at) return rf_test_finish("test_layers");
  at = strstr(at, "): ");
  RF_ASSERT(at);
  parse_rules(at + 3);
  RF_CHECK(n_rules >= 10, "%d folders parsed from the sentence", n_rules);
  const struct rule *dev = rule_of("device");
  RF_CHECK(dev && dev->n == 1 && strcmp(dev->deps[0], "core") == 0, "device sits on core alone");
  const struct rule *optim = rule_of("optim");
  RF_CHECK(
      optim && allowed(optim, "src/optim/fsdp.c", "fsdp") && !allowed(optim, "src/optim/adamw.c", "fsdp"),
      "a folder allowed in one file only");
  /* the check itself catches a broken chain */
  const struct rule *core = rule_of("core");
  RF_CHECK(core && check_line(core, "src/core/x.c", "#include \"device/device.h\"") == 1 &&
               check_line(core, "src/core/x.c", "#include \"core/core.h\"") == 0,
           "core including device is caught");
  DIR *src = opendir("src");
  RF_ASSERT(src);
  struct dirent *e;
  int files = 0, bad = 0, umbrella = 0;
  while ((e = readdir(src))) {
    if (e->d_name[0] == '.') continue;
    char dir[300];
    snprintf(dir, sizeof dir, "src/%s", e->d_name);
    DIR *d = opendir(dir);
    if (!d) continue;
    const struct rule *r = rule_of(e->d_name);
    RF_CHECK(r != NULL, "src/%s is not in docs/architecture.md's folder includes", e->d_name);
    struct rule none = {0};
    if (!r) {
      snprintf(none.dir, sizeof none.dir, "%s", e->d_name);
      r = &none;
    }
    struct dirent *g;
    while ((g = readdir(d))) {
      size_t len = strlen(g->d_name);
      int header = (len > 2 && strcmp(g->d_name + len - 2, ".h") == 0) ||
                   (len > 4 && strcmp(g->d_name + len - 4, ".cuh") == 0);
      if (header || (len > 3 && strcmp(g->d_name + len - 3, ".cu") == 0) ||
          (len > 2 && strcmp(g->d_name + len - 2, ".c") == 0))
        umbrella += read_includes(e->d_name, g->d_name, header);
      if (len < 3 || (strcmp(g->d_name + len - 2, ".c") != 0 && strcmp(g->d_name + len - 2, ".h") != 0))
        continue;
      char path[700];
      snprintf(path, sizeof path, "%s/%s", dir, g->d_name);
      bad += check_file(r, path);
      files++;
    }
    closedir(d);
  }
  closedir(src);
  int headers = n_headers, circle = header_circles();
  RF_CHECK(!circle, "the headers under src/ include each other in a circle (printed above)");
  RF_CHECK(umbrella == 0, "%d file(s) under src/ include model/model.h", umbrella);
  RF_CHECK(headers > 30, "%d headers in the include graph", headers);
  /* the check itself catches a planted circle: a.h -> b.h -> c.h -> a.h */
  int a = header_id("planted/a.h"), b = header_id("planted/b.h"), c = header_id("planted/c.h");
  edge[a][b] = edge[b][c] = 1;
  RF_CHECK(!header_circles(), "a chain is not a circle");
  edge[c][a] = 1;
  RF_CHECK(header_circles(), "a planted circle of three headers is caught");
  printf("%d folders, %d files under src/ checked, %d includes against the chain; %d headers, %s\n", n_rules,
         files, bad, headers, circle ? "a circle" : "no circle");
  RF_CHECK(files > 50, "%d files checked", files);
  free(doc);
  return rf_test_finish("test_layers");
}
