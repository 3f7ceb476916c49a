/* rfsdp prepare: a text file -> PREFIX.train.tok and PREFIX.val.tok (byte-level). */
#include <stdio.h>

#include "commands.h"
#include "data/data.h"
#include "options.h"

int rf_cmd_prepare(int argc, char **argv) {
  const char *input = NULL, *out = NULL;
  double val_fraction = 0.05;
  const struct rf_option options[] = {
      {"input", RF_OPTION_KIND_STRING, &input, "the text file to tokenize (UTF-8 or any bytes)", NULL, 1},
      {"out", RF_OPTION_KIND_STRING, &out, "output prefix: writes PREFIX.train.tok and PREFIX.val.tok", NULL,
       1},
      {"val-fraction", RF_OPTION_KIND_DOUBLE, &val_fraction,
       "share of the text for validation: every round(1/f)-th 16 KiB chunk", NULL, 0},
  };
  int rc = rf_options_parse(argc, argv, options, (int)(sizeof options / sizeof options[0]),
                            "usage: rfsdp prepare --input FILE.txt --out PREFIX [--val-fraction 0.05]");
  if (rc == 1) return 0;
  if (rc != 0) {
    fprintf(stderr, "rfsdp prepare: %s\n", rf_error_msg());
    return 2;
  }
  struct rf_data_prepare_stats stats;
  if (rf_data_prepare(input, out, val_fraction, 1, &stats) != 0) {
    fprintf(stderr, "rfsdp prepare: %s\n", rf_error_msg());
    return 1;
  }
  printf("prepare: %s: %lld bytes -> %s.train.tok (%lld tokens), %s.val.tok (%lld tokens), byte vocabulary\n",
         input, (long long)stats.input_bytes, out, (long long)stats.train_tokens, out,
         (long long)stats.val_tokens);
  return 0;
}
