/* rf-test: timeout=10
 * One source for every published number: a figure is marked where docs/ reports it, by an HTML
 * comment right before it (invisible in the rendered page):
 *     step time <!--fig:runtime-fsdp2-step-ratio-->**1.10**
 * and README.md quotes it with the same marker. Checked here:
 *   - every marker is followed by a figure (a number, optionally signed, with thousands commas, a
 *     range a-b, a trailing % or x; bold ** around it allowed);
 *   - every marker the README uses is defined in a page of docs/;
 *   - every occurrence of a name (README and docs) carries the same value (numerically, so 0 and
 *     0.0 agree but 58% and 58.2% do not; a trailing x is ignored, % is not);
 *   - every number in the result column of the README's "## Measured" table is a marked figure
 *     (numbers glued to a word, such as 100M or 2-core, and world sizes written `W = N` are not
 *     figures).
 * Errors name the file and line. Run from the repository's root (as scripts/run-tests does). */
#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"

#define MAX_FIGS 512

struct fig {
  char name[96];
  char file[160];
  int line;
  double lo, hi;
  int pct;
  char text[48];
};

static struct fig figs[MAX_FIGS];
static int n_figs;

/* Parses a figure at s: [**][+-]digits[,ddd][.digits][-number][%|x][**]. Returns the characters
 * used (0: no figure); fills lo, hi, pct. */
static int parse_value(const char *s, double *lo, double *hi, int *pct) {
  const char *p = s;
  if (strncmp(p, "**", 2) == 0) p += 2;
  double v[2] = {0, 0};
  int k = 0;
  for (; k < 2; k++) {
    char num[64];
    int n = 0;
    if (k == 0 && (*p == '+' || *p == '-') && isdigit((unsigned char)p[1])) num[n++] = *p++;
    if (!isdigit((unsigned char)*p)) break;
    while (n < 60 && (isdigit((unsigned char)*p) || *p == '.' ||
                      (*p == ',' && isdigit((unsigned char)p[1]) && isdigit((unsigned char)p[2]) &&
                       isdigit((unsigned char)p[3])))) {
      if (*p != ',') num[n++] = *p;
      p++;
    }
    num[n] = '\0';
    v[k] = strtod(num, NULL);
    if (k == 0 && *p == '-' && isdigit((unsigned char)p[1]))
      p++; /* a range */
    else {
      k++;
      break;
    }
  }
  if (k == 0) return 0;
  *lo = v[0];
  *hi = k == 2 ? v[1] : v[0];
  *pct = *p == '%';
  if (*p == '%' || *p == 'x') p++;
  if (isalnum((unsigned char)*p)) return 0; /* glued to a word: 100M, 2-core */
  if (strncmp(p, "**", 2) == 0) p += 2;
  return (int)(p - s);
}

/* Reads every marker of a file into figs; checks each is followed by a figure. */
static void scan_file(const char *path) {
  char *buf;
  size_t n;
  if (rf_file_read_all(path, &buf, &n) != 0) {
    RF_CHECK(0, "%s", rf_error_msg());
    return;
  }
  int line = 1;
  for (size_t i = 0; i < n; i++) {
    if (buf[i] == '\n') line++;
    if (strncmp(buf + i, "<!--fig:", 8) != 0) continue;
    const char *name = buf + i + 8, *end = strstr(name, "-->");
    size_t len = end ? (size_t)(end - name) : 0;
    int ok = end && len > 0 && len < sizeof figs[0].name;
    for (size_t j = 0; ok && j < len; j++)
      ok = islower((unsigned char)name[j]) || isdigit((unsigned char)name[j]) || strchr("-_.", name[j]);
    RF_CHECK(ok, "%s:%d: a figure marker must be <!--fig:NAME--> with NAME of a-z 0-9 - _ .", path, line);
    if (!ok || n_figs == MAX_FIGS) continue;
    struct fig *f = &figs[n_figs];
    memcpy(f->name, name, len);
    f->name[len] = '\0';
    int used = parse_value(end + 3, &f->lo, &f->hi, &f->pct);
    RF_CHECK(used > 0, "%s:%d: <!--fig:%s--> is not followed by a figure ('%.20s')", path, line, f->name,
             end + 3);
    if (used == 0) continue;
    snprintf(f->file, sizeof f->file, "%s", path);
    f->line = line;
    snprintf(f->text, sizeof f->text, "%.*s", used < 40 ? used : 40, end + 3);
    n_figs++;
  }
  free(buf);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Checks the numbers of the result column of the README's "## Measured" table. */
static int check_measured_table(const char *path) {
  char *buf;
  size_t n;
  if (rf_file_read_all(path, &buf, &n) != 0) return 0;
  const char *sec = strstr(buf, "\n## Measured\n");
  RF_CHECK(sec, "%s: no \"## Measured\" section", path);
  int rows = 0, line = 1;
  for (const char *q = buf; sec && q < sec; q++) line += *q == '\n';
  for (const char *p = sec ? sec + 1 : buf + n; p < buf + n;) {
    const char *eol = strchr(p, '\n');
    if (!eol) eol = buf + n;
    line++;
    if (strncmp(p, "## ", 3) == 0 && p != sec + 1) break;
    if (*p == '|' && !strstr(p, "---") && rows++ > 0) { /* the first row is the header */
      /* the result cell: between the second and the third '|' */
      const char *c = memchr(p + 1, '|', (size_t)(eol - p - 1));
      const char *ce = c ? memchr(c + 1, '|', (size_t)(eol - c - 1)) : NULL;
      RF_CHECK(c && ce, "%s:%d: a row of the Measured table without a result cell", path, line);
      for (const char *s = c ? c + 1 : eol; ce && s < ce; s++) {
        if (strncmp(s, "<!--fig:", 8) == 0) {
          const char *e = strstr(s, "-->");
          double lo, hi;
          int pct;
          s = e + 3 + parse_value(e + 3, &lo, &hi, &pct) - 1;
          continue;
        }
        int starts =
            isdigit((unsigned char)*s) && (s == c + 1 || !(isalnum((unsigned char)s[-1]) || s[-1] == '.'));
        if (!starts) continue;
        double lo, hi;
        int pct, used = parse_value(s, &lo, &hi, &pct);
        int world = s - c >= 4 && (strncmp(s - 4, "W = ", 4) == 0 || strncmp(s - 2, "W=", 2) == 0);
        RF_CHECK(used == 0 || world,
                 "%s:%d: '%.*s' in the Measured table is not a marked figure (<!--fig:NAME-->)", path, line,
                 used, s);
        if (used > 0) s += used - 1;
        while (s + 1 < ce && (isalnum((unsigned char)s[1]) || s[1] == '.')) s++; /* rest of a word */
      }
    }
    p = eol + 1;
  }
  free(buf);
  return rows - 1;
}

int main(void) {
  DIR *d = opendir("docs");
  RF_ASSERT(d);
  char *paths[128] = {0};
  int n_paths = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n_paths < 128) {
    size_t len = strlen(e->d_name);
    if (len > 3 && strcmp(e->d_name + len - 3, ".md") == 0) {
      paths[n_paths] = rf_xmalloc(len + 6);
      snprintf(paths[n_paths++], len + 6, "docs/%s", e->d_name);
    }
  }
  closedir(d);
  qsort(paths, (size_t)n_paths, sizeof *paths, cmp_str);
  for (int i = 0; i < n_paths; i++) scan_file(paths[i]);
  int doc_figs = n_figs;
  scan_file("README.md");
  int quoted = 0;
  for (int i = 0; i < n_figs; i++) {
    const struct fig *f = &figs[i];
    int defined = 0;
    for (int j = 0; j < doc_figs; j++) {
      const struct fig *g = &figs[j];
      if (j == i || strcmp(g->name, f->name) != 0) continue;
      defined = 1;
      if (j < i)
        RF_CHECK(g->lo == f->lo && g->hi == f->hi && g->pct == f->pct,
                 "fig:%s: %s:%d quotes '%s' but %s:%d has '%s'", f->name, f->file, f->line, f->text, g->file,
                 g->line, g->text);
    }
    if (i >= doc_figs) {
      quoted++;
      RF_CHECK(defined, "%s:%d: fig:%s is quoted but no page of docs/ defines it", f->file, f->line, f->name);
    }
  }
  int rows = check_measured_table("README.md");
  printf("%d figures marked in %d docs/ pages; README quotes %d; %d rows in its Measured table\n", doc_figs,
         n_paths, quoted, rows);
  RF_CHECK(quoted > 0 && rows > 0, "README quotes no marked figure");
  for (int i = 0; i < n_paths; i++) free(paths[i]);
  return rf_test_finish("test_docs_figures");
}
