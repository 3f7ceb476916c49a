/* Token files: validated opening (memory-mapped) and the streaming atomic writer. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "data/data.h"

static uint32_t rf_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rf_le64(const uint8_t *p) { return (uint64_t)rf_le32(p) | (uint64_t)rf_le32(p + 4) << 32; }

static void rf_put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void rf_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Checks the header fields and the size; the payload is checked by the caller. */
static int rf_token_file_check_header(const char *path, const uint8_t *h, size_t file_bytes,
                                      struct rf_token_file *f) {
  if (memcmp(h, RF_TOKEN_FILE_MAGIC, 8) != 0) RF_FAIL("%s: not a token file (bad magic)", path);
  uint32_t version = rf_le32(h + 8);
  if (version > RF_TOKEN_FILE_VERSION)
    RF_FAIL("%s: token file version %u is newer than this build reads (%u)", path, version,
            RF_TOKEN_FILE_VERSION);
  if (version == 0) RF_FAIL("%s: bad token file version 0", path);
  uint32_t width = rf_le32(h + 12);
  if (width != 2 && width != 4) RF_FAIL("%s: bad token width %u (expected 2 or 4 bytes)", path, width);
  uint64_t vocab = rf_le64(h + 16), count = rf_le64(h + 24);
  if (vocab == 0 || vocab > (width == 2 ? 65536u : 0x7fffffffu))
    RF_FAIL("%s: vocab size %llu does not fit %u-byte tokens", path, (unsigned long long)vocab, width);
  uint64_t payload = file_bytes - RF_TOKEN_FILE_HEADER_BYTES;
  if (count > payload / width || count * width != payload)
    RF_FAIL(
        "%s: token count %llu does not match the file size (%zu bytes: %llu payload bytes for %u-byte "
        "tokens)%s",
        path, (unsigned long long)count, file_bytes, (unsigned long long)payload, width,
        count > payload / width ? ", the file is truncated" : "");
  f->token_bytes = (int)width;
  f->vocab_size = (int64_t)vocab;
  f->n_tokens = (int64_t)count;
  f->tokenizer_xxh3 = rf_le64(h + 40);
  return 0;
}

/* The payload's checksum and the largest token, in one pass. */
static int rf_token_file_check_payload(const struct rf_token_file *f, uint64_t want_hash) {
  size_t bytes = (size_t)f->n_tokens * (size_t)f->token_bytes;
  uint64_t got = XXH3_64bits(f->tokens, bytes);
  if (got != want_hash)
    RF_FAIL("%s: checksum mismatch (payload XXH3 %016llx, header says %016llx): the file is corrupted",
            f->path, (unsigned long long)got, (unsigned long long)want_hash);
  for (int64_t i = 0; i < f->n_tokens; i++) {
    int32_t t = rf_token_file_get(f, i);
    if (t < 0 || t >= f->vocab_size)
      RF_FAIL("%s: token %d at position %lld is outside the vocabulary (size %lld)", f->path, t, (long long)i,
              (long long)f->vocab_size);
  }
  return 0;
}

int rf_token_file_open(struct rf_token_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  snprintf(f->path, sizeof f->path, "%s", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) RF_FAIL("%s: cannot open token file: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    RF_FAIL("%s: cannot stat token file: %s", path, strerror(err));
  }
  size_t bytes = (size_t)st.st_size;
  if (bytes < RF_TOKEN_FILE_HEADER_BYTES) {
    close(fd);
    RF_FAIL("%s: truncated token file: %zu bytes, shorter than the %d-byte header", path, bytes,
            RF_TOKEN_FILE_HEADER_BYTES);
  }
  void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (map == MAP_FAILED) RF_FAIL("%s: cannot map token file: %s", path, strerror(err));
  f->map = map;
  f->map_bytes = bytes;
  f->tokens = f->map + RF_TOKEN_FILE_HEADER_BYTES;
  if (rf_token_file_check_header(path, f->map, bytes, f) != 0 ||
      rf_token_file_check_payload(f, rf_le64(f->map + 32)) != 0) {
    rf_token_file_close(f);
    return -1;
  }
  return 0;
}

void rf_token_file_close(struct rf_token_file *f) {
  if (f->map) munmap((void *)f->map, f->map_bytes);
  memset(f, 0, sizeof *f);
}

int rf_token_writer_open(struct rf_token_writer *w, const char *path, int64_t vocab_size) {
  memset(w, 0, sizeof *w);
  if (vocab_size <= 0 || vocab_size > 0x7fffffff)
    RF_FAIL("%s: bad vocab size %lld", path, (long long)vocab_size);
  w->vocab_size = vocab_size;
  w->token_bytes = vocab_size <= 65536 ? 2 : 4;
  RF_TRY(rf_file_writer_open(&w->file, path));
  uint8_t zero[RF_TOKEN_FILE_HEADER_BYTES] = {0};
  if (rf_file_writer_write(&w->file, zero, sizeof zero) != 0) {
    rf_file_writer_abort(&w->file);
    return -1;
  }
  XXH3_state_t *state = XXH3_createState();
  if (!state) RF_DIE("out of memory for a hash state");
  XXH3_64bits_reset(state);
  w->hash = state;
  return 0;
}

int rf_token_writer_append(struct rf_token_writer *w, const int32_t *tokens, size_t n) {
  uint8_t buf[8192];
  size_t per = w->token_bytes == 2 ? sizeof buf / 2 : sizeof buf / 4;
  for (size_t i = 0; i < n; i += per) {
    size_t m = n - i < per ? n - i : per;
    for (size_t j = 0; j < m; j++) {
      int32_t t = tokens[i + j];
      if (t < 0 || t >= w->vocab_size)
        RF_FAIL("%s: token %d is outside the vocabulary (size %lld)", w->file.path, t,
                (long long)w->vocab_size);
      uint8_t *p = buf + j * (size_t)w->token_bytes;
      if (w->token_bytes == 2) {
        p[0] = (uint8_t)t;
        p[1] = (uint8_t)(t >> 8);
      } else {
        rf_put_le32(p, (uint32_t)t);
      }
    }
    size_t bytes = m * (size_t)w->token_bytes;
    XXH3_64bits_update(w->hash, buf, bytes);
    RF_TRY(rf_file_writer_write(&w->file, buf, bytes));
  }
  w->n_tokens += (int64_t)n;
  return 0;
}

int rf_token_writer_commit(struct rf_token_writer *w) {
  uint8_t h[RF_TOKEN_FILE_HEADER_BYTES] = {0};
  memcpy(h, RF_TOKEN_FILE_MAGIC, 8);
  rf_put_le32(h + 8, RF_TOKEN_FILE_VERSION);
  rf_put_le32(h + 12, (uint32_t)w->token_bytes);
  rf_put_le64(h + 16, (uint64_t)w->vocab_size);
  rf_put_le64(h + 24, (uint64_t)w->n_tokens);
  rf_put_le64(h + 32, XXH3_64bits_digest(w->hash));
  rf_put_le64(h + 40, w->tokenizer_xxh3);
  XXH3_freeState(w->hash);
  w->hash = NULL;
  if (rf_file_writer_pwrite(&w->file, h, sizeof h, 0) != 0) {
    rf_file_writer_abort(&w->file);
    return -1;
  }
  return rf_file_writer_commit(&w->file);
}

void rf_token_writer_abort(struct rf_token_writer *w) {
  if (w->hash) XXH3_freeState(w->hash);
  w->hash = NULL;
  rf_file_writer_abort(&w->file);
}

int rf_token_file_write(const char *path, const int32_t *tokens, size_t n, int64_t vocab_size) {
  struct rf_token_writer w;
  RF_TRY(rf_token_writer_open(&w, path, vocab_size));
  if (rf_token_writer_append(&w, tokens, n) != 0) {
    rf_token_writer_abort(&w);
    return -1;
  }
  return rf_token_writer_commit(&w);
}

int rf_token_file_check_tokenizer(const struct rf_token_file *f, const struct rf_tokenizer *tok,
                                  const char *tokenizer_path) {
  if (f->vocab_size != tok->vocab_size)
    RF_FAIL("%s: vocabulary of %lld ids, but the tokenizer %s has %d", f->path, (long long)f->vocab_size,
            tokenizer_path, tok->vocab_size);
  if (f->tokenizer_xxh3 != 0 && f->tokenizer_xxh3 != tok->file_xxh3)
    RF_FAIL("%s: was made with another tokenizer than %s (XXH3 %016llx, the file has %016llx)", f->path,
            tokenizer_path, (unsigned long long)f->tokenizer_xxh3, (unsigned long long)tok->file_xxh3);
  return 0;
}
