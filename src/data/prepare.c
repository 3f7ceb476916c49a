/* Text file -> tokenizer file, train and validation token files. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/data.h"

int rf_data_split_is_val(int64_t index, double val_fraction) {
  return floor((double)(index + 1) * val_fraction) > floor((double)index * val_fraction);
}

/* The tokenizer: byte-level, or a BPE trained on the whole input. */
static int rf_data_prepare_tokenizer(const char *input, int bpe_vocab, struct rf_tokenizer *tok) {
  if (bpe_vocab == 0) {
    rf_tokenizer_init_bytes(tok);
    return 0;
  }
  char *text;
  size_t n;
  RF_TRY(rf_file_read_all(input, &text, &n));
  int rc = rf_tokenizer_train_bpe(tok, (const uint8_t *)text, n, bpe_vocab);
  free(text);
  return rc;
}

/* Streams `in` chunk by chunk into the two writers. */
static int rf_data_prepare_stream(FILE *in, const char *input, const struct rf_tokenizer *tok,
                                  const struct rf_data_prepare_options *opt, struct rf_token_writer *train,
                                  struct rf_token_writer *val, struct rf_data_prepare_stats *stats) {
  struct stat st;
  int64_t total = fstat(fileno(in), &st) == 0 ? (int64_t)st.st_size : 0;
  uint8_t *text = rf_xmalloc(RF_DATA_SPLIT_CHUNK_BYTES);
  int32_t *ids = rf_xmalloc(RF_DATA_SPLIT_CHUNK_BYTES * sizeof *ids);
  int rc = 0, next_tenth = 1;
  for (int64_t chunk = 0; rc == 0; chunk++) {
    size_t n = fread(text, 1, RF_DATA_SPLIT_CHUNK_BYTES, in);
    if (n == 0) break;
    size_t m = rf_tokenizer_encode(tok, text, n, ids);
    rc = rf_token_writer_append(rf_data_split_is_val(chunk, opt->val_fraction) ? val : train, ids, m);
    stats->input_bytes += (int64_t)n;
    if (opt->progress && total > (16 << 20) && stats->input_bytes * 10 >= total * next_tenth) {
      fprintf(stderr, "prepare: %3d%% (%lld of %lld MB)\n", next_tenth * 10,
              (long long)(stats->input_bytes >> 20), (long long)(total >> 20));
      next_tenth++;
    }
  }
  free(text);
  free(ids);
  if (rc == 0 && ferror(in)) RF_FAIL("%s: read error", input);
  if (rc == 0 && stats->input_bytes == 0) RF_FAIL("%s: the input is empty", input);
  return rc;
}

int rf_data_prepare(const char *input, const char *prefix, const struct rf_data_prepare_options *opt,
                    struct rf_data_prepare_stats *stats) {
  memset(stats, 0, sizeof *stats);
  if (!(opt->val_fraction >= 0.0 && opt->val_fraction < 1.0))
    RF_FAIL("validation fraction %g must be in [0, 1)", opt->val_fraction);
  if (opt->bpe_vocab != 0 && (opt->bpe_vocab <= RF_DATA_BYTE_VOCAB || opt->bpe_vocab > 65536))
    RF_FAIL("BPE vocabulary size %d must be in (256, 65536]", opt->bpe_vocab);
  FILE *in = fopen(input, "rb");
  if (!in) RF_FAIL("%s: cannot open input text: %s", input, strerror(errno));
  char tok_path[RF_FILE_PATH_MAX], train_path[RF_FILE_PATH_MAX], val_path[RF_FILE_PATH_MAX];
  snprintf(tok_path, sizeof tok_path, "%s.tokenizer.json", prefix);
  snprintf(train_path, sizeof train_path, "%s.train.tok", prefix);
  snprintf(val_path, sizeof val_path, "%s.val.tok", prefix);
  struct rf_tokenizer tok;
  if (rf_data_prepare_tokenizer(input, opt->bpe_vocab, &tok) != 0) {
    fclose(in);
    return -1;
  }
  /* the tokenizer first: the token files record its checksum, so a crash between
   * the files is detected by rf_token_file_check_tokenizer */
  struct rf_token_writer train, val;
  int rc = rf_tokenizer_save(&tok, tok_path);
  if (rc == 0) rc = rf_token_writer_open(&train, train_path, tok.vocab_size);
  if (rc == 0 && rf_token_writer_open(&val, val_path, tok.vocab_size) != 0) {
    rf_token_writer_abort(&train);
    rc = -1;
  }
  if (rc == 0) {
    train.tokenizer_xxh3 = val.tokenizer_xxh3 = tok.file_xxh3;
    rc = rf_data_prepare_stream(in, input, &tok, opt, &train, &val, stats);
    stats->train_tokens = train.n_tokens;
    stats->val_tokens = val.n_tokens;
    stats->vocab_size = tok.vocab_size;
    if (rc != 0) {
      rf_token_writer_abort(&train);
      rf_token_writer_abort(&val);
    } else if (rf_token_writer_commit(&train) != 0) {
      rf_token_writer_abort(&val);
      rc = -1;
    } else {
      rc = rf_token_writer_commit(&val);
    }
  }
  fclose(in);
  rf_tokenizer_free(&tok);
  return rc;
}
