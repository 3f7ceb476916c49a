/* Text file -> tokenizer file, train and validation token files. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/data.h"

int rf_data_split_is_val(int64_t index, double val_fraction) {
  return floor((double)(index + 1) * val_fraction) > floor((double)index * val_fraction);
}

void rf_data_split_plan(int64_t total, double val_fraction, int64_t *chunk_bytes, double *fraction) {
  *chunk_bytes = RF_DATA_SPLIT_CHUNK_BYTES;
  *fraction = val_fraction;
  int64_t whole_chunks = total / RF_DATA_SPLIT_CHUNK_BYTES, half = total / 2;
  if (val_fraction <= 0.0 || total <= 0 || (double)whole_chunks * val_fraction >= 1.0)
    return; /* no split, an unknown size, or at least one whole 16 KiB chunk */
  double want = (double)total * val_fraction, floor_bytes = (double)half;
  if (floor_bytes > RF_DATA_VAL_MIN_BYTES) floor_bytes = RF_DATA_VAL_MIN_BYTES;
  if (want < floor_bytes) want = floor_bytes;
  int64_t chunk = (int64_t)(want / RF_DATA_VAL_MIN_CHUNKS);
  *chunk_bytes = chunk < RF_DATA_SPLIT_MIN_CHUNK_BYTES ? RF_DATA_SPLIT_MIN_CHUNK_BYTES : chunk;
  *fraction = want / (double)total;
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
  int64_t total = fstat(fileno(in), &st) == 0 && S_ISREG(st.st_mode) ? (int64_t)st.st_size : 0;
  rf_data_split_plan(total, opt->val_fraction, &stats->chunk_bytes, &stats->val_fraction);
  size_t chunk_bytes = (size_t)stats->chunk_bytes;
  uint8_t *text = rf_xmalloc(chunk_bytes);
  int32_t *ids = rf_xmalloc(chunk_bytes * sizeof *ids);
  int rc = 0, next_tenth = 1;
  for (int64_t chunk = 0; rc == 0; chunk++) {
    size_t n = fread(text, 1, chunk_bytes, in);
    if (n == 0) break;
    size_t m = rf_tokenizer_encode(tok, text, n, ids);
    rc = rf_token_writer_append(rf_data_split_is_val(chunk, stats->val_fraction) ? val : train, ids, m);
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

/* The three outputs of a prepare: written under temporary names, renamed into place
 * only once all three are complete. */
static const char *const rf_data_prepare_suffix[3] = {"tokenizer.json", "train.tok", "val.tok"};

static int rf_data_prepare_publish(char tmp[3][RF_FILE_PATH_MAX], const char *prefix) {
  for (int k = 0; k < 3; k++) {
    char path[RF_FILE_PATH_MAX + 32];
    /* the token files first: they record the tokenizer's checksum, so a crash between
     * two renames leaves files that refuse to be used together */
    int f = (k + 1) % 3;
    snprintf(path, sizeof path, "%s.%s", prefix, rf_data_prepare_suffix[f]);
    if (rename(tmp[f], path) != 0) RF_FAIL("%s: rename from %s failed: %s", path, tmp[f], strerror(errno));
    tmp[f][0] = '\0';
  }
  char dir[RF_FILE_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", prefix);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  return rf_file_fsync_dir(slash ? (dir[0] ? dir : "/") : ".");
}

int rf_data_prepare(const char *input, const char *prefix, const struct rf_data_prepare_options *opt,
                    struct rf_data_prepare_stats *stats) {
  RF_REQUIRE_ARG("rf_data_prepare", input);
  RF_REQUIRE_ARG("rf_data_prepare", prefix);
  RF_REQUIRE_ARG("rf_data_prepare", opt);
  RF_REQUIRE_ARG("rf_data_prepare", stats);
  memset(stats, 0, sizeof *stats);
  if (!(opt->val_fraction >= 0.0 && opt->val_fraction < 1.0))
    RF_FAIL("validation fraction %g must be in [0, 1)", opt->val_fraction);
  if (opt->bpe_vocab != 0 && (opt->bpe_vocab <= RF_DATA_BYTE_VOCAB || opt->bpe_vocab > 65536))
    RF_FAIL("BPE vocabulary size %d must be in (256, 65536]", opt->bpe_vocab);
  RF_REQUIRE(strlen(prefix) + 64 < RF_FILE_PATH_MAX, "%s: the output prefix is too long", prefix);
  FILE *in = fopen(input, "rb");
  if (!in) RF_FAIL("%s: cannot open input text: %s", input, strerror(errno));
  char tmp[3][RF_FILE_PATH_MAX];
  for (int k = 0; k < 3; k++)
    snprintf(tmp[k], sizeof tmp[k], "%s.%s.new-%ld", prefix, rf_data_prepare_suffix[k], (long)getpid());
  struct rf_tokenizer tok;
  if (rf_data_prepare_tokenizer(input, opt->bpe_vocab, &tok) != 0) {
    fclose(in);
    return -1;
  }
  struct rf_token_writer train, val;
  int rc = rf_tokenizer_save(&tok, tmp[0]);
  if (rc == 0) rc = rf_token_writer_open(&train, tmp[1], tok.vocab_size);
  if (rc == 0 && rf_token_writer_open(&val, tmp[2], tok.vocab_size) != 0) {
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
  if (rc == 0) rc = rf_data_prepare_publish(tmp, prefix);
  for (int k = 0; k < 3; k++) /* what a failure left (nothing after a publish) */
    if (tmp[k][0]) unlink(tmp[k]);
  fclose(in);
  rf_tokenizer_free(&tok);
  return rc;
}
