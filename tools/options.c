/* Table-driven command-line options (see options.h). */
#include "options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "porch.h"

static int rf_option_in_choices(const char *value, const char *choices) {
  size_t n = strlen(value);
  for (const char *p = choices; *p;) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (len == n && strncmp(p, value, n) == 0) return 1;
    if (!bar) break;
    p = bar + 1;
  }
  return 0;
}

/* 1 when v lies in `range` ("[lo, hi]", either bracket round for an open end; see options.h). */
static int rf_option_in_range(double v, const char *range) {
  char open = range[0], close = range[strlen(range) - 1];
  char *end = NULL;
  double lo = strtod(range + 1, &end);
  RF_TOOL_ASSERT((open == '[' || open == '(') && (close == ']' || close == ')') && *end == ',');
  double hi = strtod(end + 1, &end);
  RF_TOOL_ASSERT(end == range + strlen(range) - 1);
  return (open == '[' ? v >= lo : v > lo) && (close == ']' ? v <= hi : v < hi);
}

/* Every number: finite and inside the option's range. */
static int rf_option_check_number(const struct rf_option *opt, const char *value, double v) {
  RF_TOOL_REQUIRE(isfinite(v), "--%s %s: not a finite number", opt->name, value);
  RF_TOOL_REQUIRE(!opt->values || rf_option_in_range(v, opt->values), "--%s %s: must be in %s", opt->name,
                  value, opt->values);
  return 0;
}

static int rf_option_set(const struct rf_option *opt, const char *value) {
  char *end = NULL;
  errno = 0;
  switch (opt->kind) {
    case RF_OPTION_KIND_FLAG:
      *(int *)opt->dest = 1;
      return 0;
    case RF_OPTION_KIND_INT: {
      long v = strtol(value, &end, 10);
      RF_TOOL_REQUIRE(errno == 0 && end != value && *end == '\0' && v >= -2147483647L && v <= 2147483647L,
                      "--%s: '%s' is not an integer", opt->name, value);
      RF_TOOL_TRY(rf_option_check_number(opt, value, (double)v));
      *(int *)opt->dest = (int)v;
      return 0;
    }
    case RF_OPTION_KIND_I64: {
      long long v = strtoll(value, &end, 10);
      RF_TOOL_REQUIRE(errno == 0 && end != value && *end == '\0', "--%s: '%s' is not an integer", opt->name,
                      value);
      RF_TOOL_TRY(rf_option_check_number(opt, value, (double)v));
      *(int64_t *)opt->dest = (int64_t)v;
      return 0;
    }
    case RF_OPTION_KIND_DOUBLE: {
      double v = strtod(value, &end);
      RF_TOOL_REQUIRE(errno == 0 && end != value && *end == '\0', "--%s: '%s' is not a number", opt->name,
                      value);
      RF_TOOL_TRY(rf_option_check_number(opt, value, v));
      *(double *)opt->dest = v;
      return 0;
    }
    case RF_OPTION_KIND_CHOICE:
      RF_TOOL_REQUIRE(rf_option_in_choices(value, opt->values), "--%s: '%s' is not one of %s", opt->name,
                      value, opt->values);
      *(const char **)opt->dest = value;
      return 0;
    case RF_OPTION_KIND_STRING:
      *(const char **)opt->dest = value;
      return 0;
  }
  RF_TOOL_FAIL("--%s: unknown option kind", opt->name);
}

void rf_options_print_help(const char *usage, const struct rf_option *options, int n_options) {
  printf("%s\n\noptions:\n", usage);
  for (int i = 0; i < n_options; i++) {
    const struct rf_option *o = &options[i];
    char def[64] = "";
    switch (o->kind) {
      case RF_OPTION_KIND_INT:
        snprintf(def, sizeof def, " (default %d)", *(int *)o->dest);
        break;
      case RF_OPTION_KIND_I64:
        snprintf(def, sizeof def, " (default %lld)", (long long)*(int64_t *)o->dest);
        break;
      case RF_OPTION_KIND_DOUBLE:
        snprintf(def, sizeof def, " (default %g)", *(double *)o->dest);
        break;
      case RF_OPTION_KIND_STRING:
      case RF_OPTION_KIND_CHOICE:
        if (*(const char **)o->dest) snprintf(def, sizeof def, " (default %s)", *(const char **)o->dest);
        break;
      case RF_OPTION_KIND_FLAG:
        break;
    }
    const char *arg = o->kind == RF_OPTION_KIND_FLAG     ? ""
                      : o->kind == RF_OPTION_KIND_CHOICE ? o->values
                                                         : "X";
    char range[64] = "";
    if (o->values) snprintf(range, sizeof range, " (in %s)", o->values);
    printf("  --%s %s\n      %s%s%s%s\n", o->name, arg, o->help, range, def,
           o->required ? " (required)" : "");
  }
}

int rf_options_parse(int argc, char **argv, const struct rf_option *options, int n_options,
                     const char *usage) {
  int seen[64] = {0};
  RF_TOOL_ASSERT(n_options <= 64);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      rf_options_print_help(usage, options, n_options);
      return 1;
    }
    RF_TOOL_REQUIRE(strncmp(arg, "--", 2) == 0, "%s: unexpected argument '%s' (try --help)", argv[0], arg);
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    int found = -1;
    for (int k = 0; k < n_options; k++)
      if (strlen(options[k].name) == name_len && strncmp(options[k].name, name, name_len) == 0) found = k;
    RF_TOOL_REQUIRE(found >= 0, "%s: unknown option '--%.*s' (try --help)", argv[0], (int)name_len, name);
    const struct rf_option *opt = &options[found];
    const char *value = NULL;
    if (opt->kind != RF_OPTION_KIND_FLAG) {
      if (eq) {
        value = eq + 1;
      } else {
        RF_TOOL_REQUIRE(i + 1 < argc, "%s: option --%s needs a value", argv[0], opt->name);
        value = argv[++i];
      }
    } else {
      RF_TOOL_REQUIRE(!eq, "%s: option --%s takes no value", argv[0], opt->name);
    }
    RF_TOOL_REQUIRE(!seen[found], "%s: option --%s is given twice (which value is meant?)", argv[0],
                    opt->name);
    RF_TOOL_TRY(rf_option_set(opt, value));
    seen[found] = 1;
  }
  for (int k = 0; k < n_options; k++)
    RF_TOOL_REQUIRE(!options[k].required || seen[k], "%s: option --%s is required (try --help)", argv[0],
                    options[k].name);
  return 0;
}

int rf_option_make_dirs(const char *option, const char *path, int whole) {
  char dir[RF_FILE_PATH_MAX];
  RF_TOOL_REQUIRE(path[0] && strlen(path) < sizeof dir, "--%s '%s': an empty or too long path", option, path);
  snprintf(dir, sizeof dir, "%s", path);
  if (!whole) {
    char *slash = strrchr(dir, '/');
    if (!slash) return 0; /* the current folder */
    *slash = '\0';
    if (dir[0] == '\0') return 0; /* the root */
  }
  /* each prefix ending before a '/', then the whole */
  for (char *p = dir + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char keep = *p;
    *p = '\0';
    struct stat st;
    if (mkdir(dir, 0755) != 0 && !(errno == EEXIST && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
      RF_TOOL_FAIL("--%s %s: cannot create the folder %s: %s", option, path, dir,
                   errno == EEXIST ? "a file of that name is in the way" : strerror(errno));
    *p = keep;
    if (keep == '\0') return 0;
  }
}

int rf_option_check_distinct(const char *out_option, const char *out, const char *in_name, const char *in) {
  struct stat a, b;
  if (stat(out, &a) != 0 || stat(in, &b) != 0) return 0;
  RF_TOOL_REQUIRE(a.st_dev != b.st_dev || a.st_ino != b.st_ino,
                  "--%s %s: is the same file as %s %s; writing it would destroy the input", out_option, out,
                  in_name, in);
  return 0;
}
