/* Table-driven command-line options for the rfsdp subcommands: each option is a
 * name, a kind, a destination, a help line and, for numbers, the interval it must
 * lie in. Unknown options, missing values, malformed, non-finite and out-of-range
 * numbers are errors that name the option: the one place the subcommands validate
 * a single option's value. */
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
  /* RF_OPTION_KIND_CHOICE: the choices, "a|b|c". Numeric kinds: the interval the value
   * must lie in, as "[0, 1)", "(0, inf)", "[1, inf)" ("[" and "]" include the bound, "("
   * and ")" exclude it), or NULL: any value (a double must still be finite). */
  const char *values;
  int required;
};

/* Parses argv[1..argc) (argv[0] is the command's name). Returns 0, 1 when --help
 * was printed (the caller exits 0), or -1 with rf_error_msg() naming the option. */
int rf_options_parse(int argc, char **argv, const struct rf_option *options, int n_options,
                     const char *usage);
void rf_options_print_help(const char *usage, const struct rf_option *options, int n_options);

/* Creates the folders of an output path given as --`option`, as `mkdir -p` does:
 * `path` itself when whole, else the folder that holds it. Fails naming the option,
 * the folder and the problem (a file in the way, no permission). */
int rf_option_make_dirs(const char *option, const char *path, int whole);
/* Fails when the output `out` (given as --`out_option`) is the very file (device and
 * inode) `in` is (given as `in_name`): writing it would destroy the input it is made
 * from. A path that does not exist is no file's twin. */
int rf_option_check_distinct(const char *out_option, const char *out, const char *in_name, const char *in);

#endif
