/* rfsdp prepare: a text file -> PREFIX.tokenizer.json, PREFIX.train.tok and PREFIX.val.tok. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "porch.h"
#include "rfsdp_model.h"

int rf_cmd_prepare(int argc, char **argv) {
  const char *input = NULL, *out = NULL, *tokenizer = "byte";
  double val_fraction = 0.05;
  int bpe_vocab = 1024;
  const struct rf_option options[] = {
      {"input", RF_OPTION_KIND_STRING, &input, "the text file to tokenize (UTF-8 or any bytes)", NULL, 1},
      {"out", RF_OPTION_KIND_STRING, &out,
       "output prefix: writes PREFIX.train.tok, PREFIX.val.tok and PREFIX.tokenizer.json", NULL, 1},
      {"val-fraction", RF_OPTION_KIND_DOUBLE, &val_fraction,
       "share of the text for validation: every round(1/f)-th 16 KiB chunk (0: none)", "[0, 1)", 0},
      {"tokenizer", RF_OPTION_KIND_CHOICE, &tokenizer, "byte-level, or a BPE trained on the input",
       "byte|bpe", 0},
      {"bpe-vocab", RF_OPTION_KIND_INT, &bpe_vocab, "vocabulary size of the BPE", "(256, 65536]", 0},
  };
  int rc = rf_options_parse(argc, argv, options, (int)(sizeof options / sizeof options[0]),
                            "usage: rfsdp prepare --input FILE.txt --out PREFIX [--val-fraction 0.05] "
                            "[--tokenizer byte|bpe] [--bpe-vocab 1024]");
  if (rc == 1) return 0;
  if (rc != 0) {
    fprintf(stderr, "rfsdp prepare: %s\n", rf_fsdp_error());
    return 2;
  }
  for (int k = 0; k < 3 && rc == 0; k++) { /* an output must not be the input it is made from */
    static const char *const suffix[3] = {"train.tok", "val.tok", "tokenizer.json"};
    char path[RF_FILE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s.%s", out, suffix[k]);
    rc = rf_option_check_distinct("out", path, "--input", input);
  }
  if (rc != 0) {
    fprintf(stderr, "rfsdp prepare: %s\n", rf_fsdp_error());
    return 2;
  }
  struct rf_data_prepare_options opt = {.val_fraction = val_fraction,
                                        .bpe_vocab = strcmp(tokenizer, "bpe") == 0 ? bpe_vocab : 0,
                                        .progress = 1};
  struct rf_data_prepare_stats stats;
  if (rf_data_prepare(input, out, &opt, &stats) != 0) {
    fprintf(stderr, "rfsdp prepare: %s\n", rf_fsdp_error());
    return 1;
  }
  if (stats.val_fraction > val_fraction)
    fprintf(
        stderr,
        "prepare: warning: %s is small (%lld bytes): the validation split is %.1f%% of it (%lld tokens in "
        "%lld-byte chunks spread over the text), not --val-fraction %g\n",
        input, (long long)stats.input_bytes, 100.0 * stats.val_fraction, (long long)stats.val_tokens,
        (long long)stats.chunk_bytes, val_fraction);
  printf(
      "prepare: %s: %lld bytes -> %s.train.tok (%lld tokens), %s.val.tok (%lld tokens), "
      "%s.tokenizer.json (%s, %d ids)\n",
      input, (long long)stats.input_bytes, out, (long long)stats.train_tokens, out,
      (long long)stats.val_tokens, out, tokenizer, stats.vocab_size);
  return 0;
}
