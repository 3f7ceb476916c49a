/* src/data: tokenizers (byte-level and BPE), token files and the data loader.
 *
 * Token file (docs/data.md): a 64-byte little-endian header, then the tokens.
 *   0  magic "RFTOKENS"     8 bytes
 *   8  version             u32 (RF_TOKEN_FILE_VERSION)
 *   12 token_bytes         u32 (2: u16 tokens, 4: u32 tokens)
 *   16 vocab_size          u64
 *   24 n_tokens            u64
 *   32 payload_xxh3        u64 (XXH3_64bits of the n_tokens * token_bytes payload bytes)
 *   40 tokenizer_xxh3      u64 (XXH3_64bits of the tokenizer file's bytes; 0: not recorded)
 *   48 reserved            16 zero bytes
 *   64 payload
 * Opening validates every field, the size and the checksum, and that every token
 * is below vocab_size.
 *
 * Loader: the global batch of step `step` is B sequences of T + 1 tokens at
 * offsets drawn from a generator keyed by (seed, step, sequence index); rank r of
 * W takes sequences [r*B/W, (r+1)*B/W). The batch depends on (seed, step) only,
 * never on W, and the loader keeps no other state: the step number IS the
 * loader's position, so saving it (and the seed) is all a resume needs. */
#ifndef RF_DATA_H
#define RF_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"
#include "rfsdp_model.h" /* struct rf_data_prepare_options, rf_data_prepare */

/* ---- tokenizers ------------------------------------------------------------ */

#define RF_DATA_BYTE_VOCAB 256

/* id = byte value. Writes n ids. */
void rf_data_encode_bytes(const uint8_t *text, size_t n, int32_t *ids);
/* byte = id. Fails (naming the position) on an id outside [0, 256). */
int rf_data_decode_bytes(const int32_t *ids, size_t n, uint8_t *text);

#define RF_TOKENIZER_VERSION 1

enum rf_tokenizer_kind { RF_TOKENIZER_KIND_BYTE = 0, RF_TOKENIZER_KIND_BPE };

/* A tokenizer: byte-level, or byte-pair encoding over bytes (ids 0..255 are the
 * bytes, id 256 + i is merge i of two earlier ids). Text is first cut into words
 * (an optional space then a run of letters, or of digits; any other byte alone)
 * and merges never cross a word. Owns every array. */
struct rf_tokenizer {
  enum rf_tokenizer_kind kind;
  int vocab_size;
  int n_merges;
  int32_t *merges;        /* 2 * n_merges ids: merge i joins (merges[2i], merges[2i+1]) */
  int64_t *expansion_off; /* vocab_size + 1 offsets into expansion */
  uint8_t *expansion;     /* the bytes of every id, concatenated */
  uint64_t *pair_keys;    /* open-addressing table: pair (a << 32 | b) -> merge index */
  int32_t *pair_merge;
  size_t pair_cap;    /* a power of two */
  uint64_t file_xxh3; /* XXH3 of the tokenizer file it was saved to or loaded from (0: none) */
};

void rf_tokenizer_init_bytes(struct rf_tokenizer *tok);
/* Learns merges on `text` until vocab_size ids (fewer when no pair occurs twice). */
int rf_tokenizer_train_bpe(struct rf_tokenizer *tok, const uint8_t *text, size_t n, int vocab_size);
void rf_tokenizer_free(struct rf_tokenizer *tok);
/* JSON: {"type": "byte"|"bpe", "version": 1, "vocab_size": N, "merges": [[a, b], ...]},
 * atomically; sets tok->file_xxh3. */
int rf_tokenizer_save(struct rf_tokenizer *tok, const char *path);
/* Validates (every merge joins earlier ids) with messages naming the file. */
int rf_tokenizer_load(struct rf_tokenizer *tok, const char *path);
/* rf_tokenizer_encode, rf_tokenizer_decode: include/rfsdp_model.h. */
/* Within the module: the pair table and expansions from tok->merges (bpe.c), and
 * the BPE encoding used by rf_tokenizer_encode. */
void rf_bpe_build_tables(struct rf_tokenizer *tok);
size_t rf_bpe_encode(const struct rf_tokenizer *tok, const uint8_t *text, size_t n, int32_t *ids);

/* ---- token files --------------------------------------------------------- */

#define RF_TOKEN_FILE_MAGIC "RFTOKENS"
#define RF_TOKEN_FILE_VERSION 1u
#define RF_TOKEN_FILE_HEADER_BYTES 64

/* An open token file, memory-mapped read-only. Owns the mapping (rf_token_file_close). */
struct rf_token_file {
  char path[RF_FILE_PATH_MAX];
  const uint8_t *map; /* owned: the whole file */
  size_t map_bytes;
  const uint8_t *tokens; /* borrowed view of the payload in `map` */
  int64_t n_tokens;
  int64_t vocab_size;
  int token_bytes;         /* 2 or 4 */
  uint64_t tokenizer_xxh3; /* 0: not recorded */
};

/* Opens and validates `path`. On failure nothing is left open and the message
 * names the file and the problem. */
int rf_token_file_open(struct rf_token_file *f, const char *path);
void rf_token_file_close(struct rf_token_file *f);
/* Token i (0 <= i < n_tokens). */
static inline int32_t rf_token_file_get(const struct rf_token_file *f, int64_t i) {
  const uint8_t *p = f->tokens + (size_t)i * (size_t)f->token_bytes;
  if (f->token_bytes == 2) return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8);
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

/* Streaming writer: tokens are appended, the header (count, checksum) is written
 * at commit, and the file appears under its name only then (rf_file_writer).
 * Owns the writer and the hash state until commit/abort. */
struct rf_token_writer {
  struct rf_file_writer file;
  void *hash; /* owned XXH3_state_t */
  int64_t n_tokens;
  int64_t vocab_size;
  int token_bytes;         /* 2 when vocab_size <= 65536, else 4 */
  uint64_t tokenizer_xxh3; /* recorded in the header at commit; set it before (0: none) */
};

int rf_token_writer_open(struct rf_token_writer *w, const char *path, int64_t vocab_size);
/* Fails on a token outside [0, vocab_size). */
int rf_token_writer_append(struct rf_token_writer *w, const int32_t *tokens, size_t n);
int rf_token_writer_commit(struct rf_token_writer *w);
void rf_token_writer_abort(struct rf_token_writer *w);

/* A whole token array in one call. */
int rf_token_file_write(const char *path, const int32_t *tokens, size_t n, int64_t vocab_size);

/* Fails unless the token file was written with this tokenizer (same vocabulary size,
 * and the same tokenizer file when the token file recorded one). */
int rf_token_file_check_tokenizer(const struct rf_token_file *f, const struct rf_tokenizer *tok,
                                  const char *tokenizer_path);

/* ---- loader --------------------------------------------------------------- */

/* Samples training sequences from a token file. Borrows the file. */
struct rf_data_loader {
  const struct rf_token_file *file;
};

int rf_data_loader_init(struct rf_data_loader *loader, const struct rf_token_file *file);

/* Fills this rank's share of the global batch of `step`: (B / world) rows of T
 * tokens and their targets (the same rows shifted by one), row-major. Fails when
 * B is not divisible by world, when T or B is not positive, or when the file
 * holds fewer than T + 1 tokens. */
int rf_data_loader_batch(const struct rf_data_loader *loader, uint64_t seed, int64_t step, int64_t batch,
                         int64_t seq, int rank, int world, int32_t *tokens, int32_t *targets);

/* The start offset of sequence `index` of the global batch of `step`, in
 * [0, n_tokens - seq - 1]: what rf_data_loader_batch reads. */
int64_t rf_data_loader_offset(const struct rf_data_loader *loader, uint64_t seed, int64_t step, int64_t index,
                              int64_t seq);

/* ---- prepare ------------------------------------------------------------- */

/* The text is cut into chunks of this many bytes; chunk i goes to the validation
 * file when floor((i + 1) * f) > floor(i * f) (f the validation fraction), so
 * every round(1/f)-th chunk is validation text, spread evenly over the corpus. */
#define RF_DATA_SPLIT_CHUNK_BYTES 16384
/* A small input, whose 16 KiB chunks would give no whole validation chunk, is cut
 * into smaller chunks (at least RF_DATA_SPLIT_MIN_CHUNK_BYTES) so that the validation
 * text is RF_DATA_VAL_MIN_CHUNKS chunks spread over the text, and at least
 * min(RF_DATA_VAL_MIN_BYTES, half the input) bytes: one window of a typical sequence. */
#define RF_DATA_SPLIT_MIN_CHUNK_BYTES 256
#define RF_DATA_VAL_MIN_CHUNKS 4
#define RF_DATA_VAL_MIN_BYTES 4096

/* 1 when chunk `index` belongs to the validation split of fraction `val_fraction`. */
int rf_data_split_is_val(int64_t index, double val_fraction);
/* The chunk size and fraction of the split of a `total`-byte input (0: unknown size)
 * asked for `val_fraction`: 16 KiB and val_fraction, or smaller chunks and a larger
 * fraction for a small input (see RF_DATA_SPLIT_MIN_CHUNK_BYTES). */
void rf_data_split_plan(int64_t total, double val_fraction, int64_t *chunk_bytes, double *fraction);

/* rf_data_prepare and its options: include/rfsdp_model.h (the rfsdp prepare command's). */

#endif
