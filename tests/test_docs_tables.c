/* rf-test: timeout=10
 * Every table in docs/ says where its numbers come from, by an HTML comment on the line
 * right before it (invisible in the rendered page):
 *     <!--table: KIND [raw=PATH] [ratio=R:A/B,...] [cols=C:A/B,...]-->
 * KIND is `definitions` (names, formats, rules: nothing measured), `computed` (what a
 * deterministic command prints: the planner's padding, counted bytes, the simulator's
 * predictions; the text names the command) or `measured` (times, losses, memory of runs).
 * Checked here:
 *   - every table has a marker, of a known kind;
 *   - a measured table names its raw output (raw=PATH: a file tracked by git, the text
 *     the bench printed), or the 6 lines above the marker say, visibly, that it is "not
 *     traceable" (the raw output was not kept);
 *   - with raw=, every figure in the table's cells is one of that file's, as printed or
 *     rounded (the file's 1.0101 is the table's 1.010), and each ratio=R:A/B is
 *     recomputed: A and B figures of the file, R within the rounding of R, A and B;
 *   - cols=C:A/B: in every row where columns C, A and B (1-based) hold numbers, C is A / B
 *     within their rounding (a ratio column against the columns it divides).
 * Errors name the file and line. Run from the repository's root (as scripts/run-tests does). */
#include <ctype.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"

#define MAX_CELLS 24

/* The next figure of s from *at on (comments <!--...--> skipped): a number that starts a
 * token (not glued to a word, as W2 or x86-64), as printed into fig (thousands commas
 * kept, a trailing point dropped); its value and half a unit of its last digit. 0 at the end. */
static int next_figure(const char **at, char *fig, size_t cap, double *v, double *half) {
  const char *s = *at;
  for (; *s; s++) {
    if (strncmp(s, "<!--", 4) == 0 && strstr(s, "-->")) {
      s = strstr(s, "-->") + 2;
      continue;
    }
    if (isalpha((unsigned char)*s) || *s == '_') { /* a word, digits glued to it included */
      while (isalnum((unsigned char)s[1]) || s[1] == '_' || (s[1] == '-' && isalnum((unsigned char)s[2])))
        s++;
      continue;
    }
    if (isdigit((unsigned char)*s)) break;
  }
  if (!*s) return 0;
  size_t n = 0;
  int decimals = -1;
  char num[64];
  size_t m = 0;
  for (; (isdigit((unsigned char)*s) || ((*s == '.' || *s == ',') && isdigit((unsigned char)s[1]))) &&
         n + 1 < cap && m + 1 < sizeof num;
       s++) {
    fig[n++] = *s;
    if (*s == ',') continue;
    if (*s == '.')
      decimals = 0;
    else if (decimals >= 0)
      decimals++;
    num[m++] = *s;
  }
  fig[n] = num[m] = '\0';
  *v = strtod(num, NULL);
  *half = 0.5 * pow(10.0, -(decimals > 0 ? decimals : 0));
  *at = s;
  return 1;
}

/* The first figure of a cell, 0 when none. */
static int first_number(const char *s, double *v, double *half) {
  char fig[64];
  return next_figure(&s, fig, sizeof fig, v, half);
}

/* Whether text holds a figure that, rounded as `fig` is printed (value v, half a unit h),
 * gives it: a raw output's 1.0101 is a table's 1.010. */
static int text_has_number(const char *text, double v, double h) {
  const char *at = text;
  char fig[64];
  double r, hr;
  while (next_figure(&at, fig, sizeof fig, &r, &hr))
    if (fabs(r - v) <= h * (1 + 1e-9)) return 1;
  return 0;
}

/* R within the rounding of R = A / B (each as printed: value and half a unit). */
static int ratio_fits(double r, double hr, double a, double ha, double b, double hb) {
  double lo = (a - ha) / (b + hb), hi = (a + ha) / (b - hb);
  if (lo > hi) {
    double t = lo;
    lo = hi;
    hi = t;
  }
  return r + hr >= lo && r - hr <= hi;
}

/* The cells of a table row, split on | (the outer ones dropped). */
static int split_cells(const char *line, char cells[][512]) {
  const char *p = strchr(line, '|');
  int n = 0;
  while (p && n < MAX_CELLS) {
    const char *q = strchr(p + 1, '|');
    if (!q) break;
    size_t len = (size_t)(q - p - 1) < 511 ? (size_t)(q - p - 1) : 511;
    memcpy(cells[n], p + 1, len);
    cells[n][len] = '\0';
    n++;
    p = q;
  }
  return n;
}

/* The value of key=... in the marker ("" when absent). */
static void marker_field(const char *marker, const char *key, char *out, size_t cap) {
  out[0] = '\0';
  const char *p = strstr(marker, key);
  if (!p) return;
  p += strlen(key);
  size_t n = 0;
  while (*p && !isspace((unsigned char)*p) && strncmp(p, "-->", 3) != 0 && n + 1 < cap) out[n++] = *p++;
  out[n] = '\0';
}

static int n_tables, n_measured, n_raw, n_ratios, n_cols;

/* One table (lines[first..last]) of file, its marker on lines[first - 1]. */
static void check_table(const char *file, char **lines, int first, int last) {
  n_tables++;
  const char *marker = first > 0 ? strstr(lines[first - 1], "<!--table:") : NULL;
  if (!marker) {
    RF_CHECK(0, "%s:%d: a table without a <!--table: KIND ...--> marker on the line before it", file,
             first + 1);
    return;
  }
  char kind[32] = "";
  sscanf(marker + strlen("<!--table:"), " %31[a-z]", kind);
  RF_CHECK(strcmp(kind, "definitions") == 0 || strcmp(kind, "computed") == 0 || strcmp(kind, "measured") == 0,
           "%s:%d: table marker of unknown kind '%s'", file, first, kind);
  char raw[256], ratios[1024], cols[256];
  marker_field(marker, "raw=", raw, sizeof raw);
  marker_field(marker, "ratio=", ratios, sizeof ratios);
  marker_field(marker, "cols=", cols, sizeof cols);
  char *text = NULL;
  if (strcmp(kind, "measured") == 0) {
    n_measured++;
    if (raw[0]) {
      size_t n;
      char out[64];
      int tracked = rf_cli_sh(out, sizeof out, "git ls-files --error-unmatch '%s' >/dev/null 2>&1", raw) == 0;
      RF_CHECK(tracked, "%s:%d: raw=%s is not a file tracked by git", file, first, raw);
      if (rf_file_read_all(raw, &text, &n) != 0) text = NULL;
      RF_CHECK(text != NULL, "%s:%d: raw=%s cannot be read", file, first, raw);
      n_raw++;
    } else {
      int said = 0;
      for (int k = first - 1; k >= 0 && k >= first - 7; k--)
        said |= strcasestr(lines[k], "not traceable") != NULL;
      RF_CHECK(said,
               "%s:%d: a measured table names no raw output and the text above it does not say it is "
               "not traceable",
               file, first);
    }
  }
  char cells[MAX_CELLS][512];
  for (int i = first + 2; i <= last && text; i++) { /* every figure of the cells in the raw output */
    int nc = split_cells(lines[i], cells);
    for (int c = 0; c < nc; c++) {
      const char *at = cells[c];
      char fig[64];
      double v, h;
      while (next_figure(&at, fig, sizeof fig, &v, &h))
        RF_CHECK(text_has_number(text, v, h), "%s:%d: %s is not in the raw output %s", file, i + 1, fig, raw);
    }
  }
  for (char *r = ratios; *r;) { /* ratio=R:A/B,... */
    double rv, av, bv;
    char rs[32], as[32], bs[32];
    if (sscanf(r, "%31[0-9.]:%31[0-9.]/%31[0-9.]", rs, as, bs) != 3) {
      RF_CHECK(0, "%s:%d: cannot read ratio '%s'", file, first, r);
      break;
    }
    double hr, ha, hb;
    RF_ASSERT(first_number(rs, &rv, &hr) && first_number(as, &av, &ha) && first_number(bs, &bv, &hb));
    RF_CHECK(text && text_has_number(text, av, ha) && text_has_number(text, bv, hb),
             "%s:%d: ratio %s: %s or %s is not in the raw output %s", file, first, r, as, bs, raw);
    RF_CHECK(ratio_fits(rv, hr, av, ha, bv, hb), "%s:%d: %s is not %s / %s = %.5g", file, first, rs, as, bs,
             av / bv);
    n_ratios++;
    char *comma = strchr(r, ',');
    r = comma ? comma + 1 : r + strlen(r);
  }
  for (char *c = cols; *c;) { /* cols=C:A/B,... */
    int ci, ai, bi;
    if (sscanf(c, "%d:%d/%d", &ci, &ai, &bi) != 3 || ci < 1 || ai < 1 || bi < 1 || ci > MAX_CELLS ||
        ai > MAX_CELLS || bi > MAX_CELLS) {
      RF_CHECK(0, "%s:%d: cannot read cols '%s'", file, first, c);
      break;
    }
    int rows = 0;
    for (int i = first + 2; i <= last; i++) {
      int nc = split_cells(lines[i], cells);
      double r, hr, a, ha, b, hb;
      if (nc < ci || nc < ai || nc < bi || !first_number(cells[ci - 1], &r, &hr) ||
          !first_number(cells[ai - 1], &a, &ha) || !first_number(cells[bi - 1], &b, &hb))
        continue;
      rows++;
      RF_CHECK(ratio_fits(r, hr, a, ha, b, hb), "%s:%d: column %d (%g) is not column %d / column %d = %.5g",
               file, i + 1, ci, r, ai, bi, a / b);
    }
    RF_CHECK(rows > 0, "%s:%d: cols %s: no row holds the three numbers", file, first, c);
    n_cols += rows;
    char *comma = strchr(c, ',');
    c = comma ? comma + 1 : c + strlen(c);
  }
  free(text);
}

static void check_file(const char *path) {
  char *text;
  size_t n;
  RF_ASSERT(rf_file_read_all(path, &text, &n) == 0);
  int nl = 0;
  for (size_t i = 0; i < n; i++) nl += text[i] == '\n';
  char **lines = rf_xmalloc((size_t)(nl + 1) * sizeof *lines);
  nl = 0;
  for (char *p = text, *e; p && *p; p = e ? e + 1 : NULL) {
    e = strchr(p, '\n');
    if (e) *e = '\0';
    lines[nl++] = p;
  }
  int in_code = 0;
  for (int i = 0; i < nl; i++) {
    const char *s = lines[i];
    while (*s == ' ') s++;
    if (strncmp(s, "```", 3) == 0) in_code = !in_code;
    if (in_code || *s != '|') continue;
    int last = i;
    while (last + 1 < nl && strchr(lines[last + 1], '|') &&
           lines[last + 1][strspn(lines[last + 1], " ")] == '|')
      last++;
    if (last > i) check_table(path, lines, i, last); /* a header and a separator at least */
    i = last;
  }
  free(lines);
  free(text);
}

int main(void) {
  DIR *d = opendir("docs");
  RF_ASSERT(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 3, ".md") != 0) continue;
    char path[512];
    snprintf(path, sizeof path, "docs/%s", e->d_name);
    check_file(path);
  }
  closedir(d);
  printf(
      "%d tables in docs/: %d measured, %d of them with their raw output (%d ratios recomputed from it), "
      "%d ratio cells recomputed from their columns\n",
      n_tables, n_measured, n_raw, n_ratios, n_cols);
  return rf_test_finish("test_docs_tables");
}
