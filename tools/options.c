/* Table-driven command-line options (see options.h). */
#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"

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

static int rf_option_set(const struct rf_option *opt, const char *value) {
  char *end = NULL;
  errno = 0;
  switch (opt->kind) {
    case RF_OPTION_KIND_FLAG:
      *(int *)opt->dest = 1;
      return 0;
    case RF_OPTION_KIND_INT: {
      long v = strtol(value, &end, 10);
      RF_REQUIRE(errno == 0 && end != value && *end == '\0' && v >= -2147483647L && v <= 2147483647L,
                 "--%s: '%s' is not an integer", opt->name, value);
      *(int *)opt->dest = (int)v;
      return 0;
    }
    case RF_OPTION_KIND_I64: {
      long long v = strtoll(value, &end, 10);
      RF_REQUIRE(errno == 0 && end != value && *end == '\0', "--%s: '%s' is not an integer", opt->name,
                 value);
      *(int64_t *)opt->dest = (int64_t)v;
      return 0;
    }
    case RF_OPTION_KIND_DOUBLE: {
      double v = strtod(value, &end);
      RF_REQUIRE(errno == 0 && end != value && *end == '\0', "--%s: '%s' is not a number", opt->name, value);
      *(double *)opt->dest = v;
      return 0;
    }
    case RF_OPTION_KIND_CHOICE:
      RF_REQUIRE(rf_option_in_choices(value, opt->choices), "--%s: '%s' is not one of %s", opt->name, value,
                 opt->choices);
      *(const char **)opt->dest = value;
      return 0;
    case RF_OPTION_KIND_STRING:
      *(const char **)opt->dest = value;
      return 0;
  }
  RF_FAIL("--%s: unknown option kind", opt->name);
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
                      : o->kind == RF_OPTION_KIND_CHOICE ? o->choices
                                                         : "X";
    printf("  --%s %s\n      %s%s%s\n", o->name, arg, o->help, def, o->required ? " (required)" : "");
  }
}

int rf_options_parse(int argc, char **argv, const struct rf_option *options, int n_options,
                     const char *usage) {
  int seen[64] = {0};
  RF_ASSERT(n_options <= 64);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      rf_options_print_help(usage, options, n_options);
      return 1;
    }
    RF_REQUIRE(strncmp(arg, "--", 2) == 0, "%s: unexpected argument '%s' (try --help)", argv[0], arg);
    const char *name = arg + 2;
    const char *eq = strchr(name, '=');
    size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
    int found = -1;
    for (int k = 0; k < n_options; k++)
      if (strlen(options[k].name) == name_len && strncmp(options[k].name, name, name_len) == 0) found = k;
    RF_REQUIRE(found >= 0, "%s: unknown option '--%.*s' (try --help)", argv[0], (int)name_len, name);
    const struct rf_option *opt = &options[found];
    const char *value = NULL;
    if (opt->kind != RF_OPTION_KIND_FLAG) {
      if (eq) {
        value = eq + 1;
      } else {
        RF_REQUIRE(i + 1 < argc, "%s: option --%s needs a value", argv[0], opt->name);
        value = argv[++i];
      }
    } else {
      RF_REQUIRE(!eq, "%s: option --%s takes no value", argv[0], opt->name);
    }
    RF_TRY(rf_option_set(opt, value));
    seen[found] = 1;
  }
  for (int k = 0; k < n_options; k++)
    RF_REQUIRE(!options[k].required || seen[k], "%s: option --%s is required (try --help)", argv[0],
               options[k].name);
  return 0;
}
