/* Text file -> train and validation token files (byte-level). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data.h"

int rf_data_split_is_val(int64_t index, double val_fraction) {
  return floor((double)(index + 1) * val_fraction) > floor((double)index * val_fraction);
}

int rf_data_prepare(const char *input, const char *prefix, double val_fraction, int progress,
                    struct rf_data_prepare_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    RF_FAIL("validation fraction %g must be in [0, 1)", val_fraction);
  FILE *in = fopen(input, "rb");
  if (!in) RF_FAIL("%s: cannot open input text: %s", input, strerror(errno));
  struct stat st;
  int64_t total = fstat(fileno(in), &st) == 0 ? (int64_t)st.st_size : 0;
  char train_path[RF_FILE_PATH_MAX], val_path[RF_FILE_PATH_MAX];
  snprintf(train_path, sizeof train_path, "%s.train.tok", prefix);
  snprintf(val_path, sizeof val_path, "%s.val.tok", prefix);
  struct rf_token_writer train, val;
  if (rf_token_writer_open(&train, train_path, RF_DATA_BYTE_VOCAB) != 0) {
    fclose(in);
    return -1;
  }
  if (rf_token_writer_open(&val, val_path, RF_DATA_BYTE_VOCAB) != 0) {
    rf_token_writer_abort(&train);
    fclose(in);
    return -1;
  }
  uint8_t *text = rf_xmalloc(RF_DATA_SPLIT_CHUNK_BYTES);
  int32_t *ids = rf_xmalloc(RF_DATA_SPLIT_CHUNK_BYTES * sizeof *ids);
  int rc = 0, next_tenth = 1;
  for (int64_t chunk = 0;; chunk++) {
    size_t n = fread(text, 1, RF_DATA_SPLIT_CHUNK_BYTES, in);
    if (n == 0) break;
    rf_data_encode_bytes(text, n, ids);
    int is_val = rf_data_split_is_val(chunk, val_fraction);
    rc = rf_token_writer_append(is_val ? &val : &train, ids, n);
    if (rc != 0) break;
    stats->input_bytes += (int64_t)n;
    if (progress && total > (16 << 20) && stats->input_bytes * 10 >= total * next_tenth) {
      fprintf(stderr, "prepare: %3d%% (%lld of %lld MB)\n", next_tenth * 10,
              (long long)(stats->input_bytes >> 20), (long long)(total >> 20));
      next_tenth++;
    }
  }
  free(text);
  free(ids);
  if (rc == 0 && ferror(in)) rc = rf_error_set(__FILE__, __LINE__, "%s: read error", input);
  fclose(in);
  if (rc == 0 && stats->input_bytes == 0)
    rc = rf_error_set(__FILE__, __LINE__, "%s: the input is empty", input);
  stats->train_tokens = train.n_tokens;
  stats->val_tokens = val.n_tokens;
  if (rc != 0) {
    rf_token_writer_abort(&train);
    rf_token_writer_abort(&val);
    return -1;
  }
  if (rf_token_writer_commit(&train) != 0) {
    rf_token_writer_abort(&val);
    return -1;
  }
  return rf_token_writer_commit(&val);
}
