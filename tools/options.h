/* Table-driven command-line options for the rfsdp subcommands: each option is a
 * name, a kind, a destination and a help line. Unknown options, missing values
 * and malformed numbers are errors that name the option. */
#ifndef RF_TOOLS_OPTIONS_H
#define RF_TOOLS_OPTIONS_H

#include <stdint.h>

enum rf_option_kind {
  RF_OPTION_KIND_FLAG = 0, /* int, set to 1 when present */
  RF_OPTION_KIND_INT,      /* int */
  RF_OPTION_KIND_I64,      /* int64_t */
  RF_OPTION_KIND_DOUBLE,   /* double */
  RF_OPTION_KIND_STRING,   /* const char *, borrowed from argv */
  RF_OPTION_KIND_CHOICE,   /* const char *, one of `choices` ("a|b|c") */
};

/* One option. `dest` is borrowed and points at a variable of the kind's type;
 * the variable's value before parsing is the default shown in --help. */
struct rf_option {
  const char *name; /* without the leading "--" */
  enum rf_option_kind kind;
  void *dest;
  const char *help;
  const char *choices; /* RF_OPTION_KIND_CHOICE only */
  int required;
};

/* Parses argv[1..argc) (argv[0] is the command's name). Returns 0, 1 when --help
 * was printed (the caller exits 0), or -1 with rf_error_msg() naming the option. */
int rf_options_parse(int argc, char **argv, const struct rf_option *options, int n_options,
                     const char *usage);
void rf_options_print_help(const char *usage, const struct rf_option *options, int n_options);

#endif
