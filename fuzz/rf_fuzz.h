/* The parsers' fuzz entry points (fuzz/rf_fuzz.c). Each takes any bytes, hands them
 * to one reader of rfsdp as the file it reads, and returns 0: a crash, a sanitizer
 * report or a leak is a finding. The libFuzzer drivers (fuzz/fuzz_main.c, `make
 * fuzz`) call them, and tests/test_fuzz_regress.c feeds them every committed finding
 * (fuzz/regress/TARGET/) without libFuzzer. */
#ifndef RF_FUZZ_H
#define RF_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* The sections of a multi-file input (the checkpoint targets) are separated by this line. */
#define RF_FUZZ_SEPARATOR "\n--rf-fuzz-file--\n"

struct rf_fuzz_target {
  const char *name; /* hf_config, units, token_file, tokenizer, safetensors, ckpt_open, ckpt_index */
  int (*run)(const uint8_t *data, size_t size);
};

extern const struct rf_fuzz_target rf_fuzz_targets[];
extern const int rf_fuzz_n_targets;

/* The target called `name`, or NULL. */
const struct rf_fuzz_target *rf_fuzz_find(const char *name);

#endif
