/* The byte-level tokenizer: one token per byte, id = byte value. */
#include "data/data.h"

void rf_data_encode_bytes(const uint8_t *text, size_t n, int32_t *ids) {
  for (size_t i = 0; i < n; i++) ids[i] = text[i];
}

int rf_data_decode_bytes(const int32_t *ids, size_t n, uint8_t *text) {
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= RF_DATA_BYTE_VOCAB)
      RF_FAIL("token %d at position %zu is not a byte (the byte tokenizer has %d ids)", ids[i], i,
              RF_DATA_BYTE_VOCAB);
    text[i] = (uint8_t)ids[i];
  }
  return 0;
}
