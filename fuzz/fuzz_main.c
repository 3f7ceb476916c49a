/* The libFuzzer driver of one target: built once per target by `make fuzz` with
 * -DRF_FUZZ_TARGET='"name"' and -fsanitize=fuzzer,address,undefined. */
#include <stdlib.h>

#include "rf_fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const struct rf_fuzz_target *target;
  if (!target) target = rf_fuzz_find(RF_FUZZ_TARGET);
  if (!target) abort();
  return target->run(data, size);
}
