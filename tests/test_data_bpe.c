/* rf-test: timeout=30
 * The BPE tokenizer: decode(encode(x)) == x for text and for arbitrary bytes; the
 * first merge is the most frequent in-word pair by brute-force count; merges
 * shorten the text; save/load round trip and malformed tokenizer files; prepare
 * with BPE writes token files that decode back to the split text and that are
 * tied to their tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "data/data.h"
#include "rf_test.h"

static char dir[64];

static const char *words[] = {"the",  "lord",   "said",     "unto",  "moses", "and",
                              "of",   "israel", "children", "land",  "house", "god",
                              "king", "people", "thou",     "shalt", "not",   "in"};

/* Lowercase words separated by single spaces, with ".\n" every 12 words. */
static size_t make_text(uint8_t *text, size_t cap, uint64_t seed) {
  size_t n = 0;
  for (int w = 0;; w++) {
    const char *word = words[rf_test_rand_u64(&seed) % (sizeof words / sizeof words[0])];
    size_t len = strlen(word);
    if (n + len + 3 > cap) break;
    if (w > 0) text[n++] = ' ';
    memcpy(text + n, word, len);
    n += len;
    if (w % 12 == 11) {
      text[n++] = '.';
      text[n++] = '\n';
      w = -1;
    }
  }
  return n;
}

static int is_lower(uint8_t c) { return c >= 'a' && c <= 'z'; }

static void check_roundtrip(const struct rf_tokenizer *tok, const uint8_t *text, size_t n, const char *what) {
  int32_t *ids = malloc((n + 1) * sizeof *ids);
  uint8_t *back = malloc(n + 1);
  size_t m = rf_tokenizer_encode(tok, text, n, ids), got = 0;
  RF_CHECK(m <= n, "%s: more tokens than bytes", what);
  int rc = rf_tokenizer_decode(tok, ids, m, back, n, &got);
  RF_CHECK(rc == 0 && got == n && memcmp(back, text, n) == 0, "%s: decode(encode(x)) != x: %s", what,
           rf_error_msg());
  free(ids);
  free(back);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/rf_test_bpe.XXXXXX");
  RF_ASSERT(mkdtemp(dir));
  enum { CAP = 200000 };
  uint8_t *text = malloc(CAP);
  size_t n = make_text(text, CAP, 5);

  struct rf_tokenizer tok;
  RF_CHECK(rf_tokenizer_train_bpe(&tok, text, n, 300) == 0, "train: %s", rf_error_msg());
  RF_CHECK(tok.vocab_size == 300 && tok.n_merges == 44, "vocab %d, %d merges", tok.vocab_size, tok.n_merges);

  /* brute force: in-word pairs are (space or letter, letter) in this text */
  static int64_t count[256][256];
  for (size_t i = 0; i + 1 < n; i++)
    if (is_lower(text[i + 1]) && (is_lower(text[i]) || text[i] == ' ')) count[text[i]][text[i + 1]]++;
  int ba = 0, bb = 0;
  for (int a = 0; a < 256; a++)
    for (int b = 0; b < 256; b++)
      if (count[a][b] > count[ba][bb]) {
        ba = a;
        bb = b;
      }
  RF_CHECK(tok.merges[0] == ba && tok.merges[1] == bb, "first merge (%d, %d), brute force says (%d, %d)",
           tok.merges[0], tok.merges[1], ba, bb);

  check_roundtrip(&tok, text, n, "training text");
  uint8_t noise[5000];
  uint64_t rng = 3;
  for (size_t i = 0; i < sizeof noise; i++) noise[i] = (uint8_t)rf_test_rand_u64(&rng);
  check_roundtrip(&tok, noise, sizeof noise, "random bytes");
  check_roundtrip(&tok, (const uint8_t *)" ", 1, "one space");

  /* 18 words: a vocabulary of 512 learns every word whole */
  struct rf_tokenizer big;
  RF_ASSERT(rf_tokenizer_train_bpe(&big, text, n, 512) == 0);
  int32_t *ids = malloc(n * sizeof *ids);
  size_t m = rf_tokenizer_encode(&big, text, n, ids);
  RF_CHECK(big.n_merges < 512 - 256, "training stops when no pair repeats (%d merges)", big.n_merges);
  RF_CHECK(m * 3 < n, "%zu tokens for %zu bytes: words are not merged whole", m, n);
  check_roundtrip(&big, text, n, "text, large vocabulary");

  /* save and load */
  char path[128];
  snprintf(path, sizeof path, "%s/tok.json", dir);
  RF_CHECK(rf_tokenizer_save(&big, path) == 0, "save: %s", rf_error_msg());
  struct rf_tokenizer loaded;
  RF_CHECK(rf_tokenizer_load(&loaded, path) == 0, "load: %s", rf_error_msg());
  RF_CHECK(loaded.n_merges == big.n_merges &&
               memcmp(loaded.merges, big.merges, 2 * (size_t)big.n_merges * sizeof *big.merges) == 0 &&
               loaded.file_xxh3 == big.file_xxh3,
           "loaded merges differ");
  int32_t *ids2 = malloc(n * sizeof *ids2);
  RF_CHECK(rf_tokenizer_encode(&loaded, text, n, ids2) == m && memcmp(ids, ids2, m * sizeof *ids) == 0,
           "the loaded tokenizer encodes the same");
  int32_t bad_id = loaded.vocab_size;
  uint8_t out[64];
  size_t got;
  RF_CHECK(rf_tokenizer_decode(&loaded, &bad_id, 1, out, sizeof out, &got) == -1 &&
               strstr(rf_error_msg(), "outside the vocabulary"),
           "decoding an id past the vocabulary fails");
  rf_tokenizer_free(&loaded);

  static const struct {
    const char *json, *problem;
  } bad[] = {
      {"{\"type\":\"bpe\",\"version\":1,\"vocab_size\":257,\"merges\":[[256,1]]}",
       "not a pair of earlier ids"},
      {"{\"type\":\"bpe\",\"version\":2,\"vocab_size\":256,\"merges\":[]}", "newer"},
      {"{\"type\":\"bpe\",\"version\":1,\"vocab_size\":300,\"merges\":[[1,2]]}", "vocab_size"},
      {"{\"type\":\"wordpiece\",\"version\":1,\"vocab_size\":256,\"merges\":[]}", "'type'"},
      {"{\"type\":\"bpe\",", "not valid JSON"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    RF_ASSERT(rf_file_write_all(path, bad[i].json, strlen(bad[i].json)) == 0);
    int rc = rf_tokenizer_load(&loaded, path);
    RF_CHECK(rc == -1 && strstr(rf_error_msg(), path) && strstr(rf_error_msg(), bad[i].problem),
             "bad tokenizer %zu: %s", i, rf_error_msg());
    RF_CHECK(loaded.merges == NULL, "a failed load leaves nothing allocated");
  }

  /* prepare with BPE: the token files decode back to the split text */
  char input[128], prefix[128], tok_path[160], train_path[160], val_path[160];
  snprintf(input, sizeof input, "%s/text.txt", dir);
  snprintf(prefix, sizeof prefix, "%s/text", dir);
  snprintf(tok_path, sizeof tok_path, "%s.tokenizer.json", prefix);
  snprintf(train_path, sizeof train_path, "%s.train.tok", prefix);
  snprintf(val_path, sizeof val_path, "%s.val.tok", prefix);
  RF_ASSERT(rf_file_write_all(input, text, n) == 0);
  struct rf_data_prepare_options opt = {.val_fraction = 0.25, .bpe_vocab = 300};
  struct rf_data_prepare_stats st;
  RF_CHECK(rf_data_prepare(input, prefix, &opt, &st) == 0, "prepare: %s", rf_error_msg());
  struct rf_token_file tr, va;
  RF_ASSERT(rf_token_file_open(&tr, train_path) == 0 && rf_token_file_open(&va, val_path) == 0);
  RF_ASSERT(rf_tokenizer_load(&loaded, tok_path) == 0);
  RF_CHECK(rf_token_file_check_tokenizer(&tr, &loaded, tok_path) == 0 &&
               rf_token_file_check_tokenizer(&va, &loaded, tok_path) == 0,
           "token files match their tokenizer: %s", rf_error_msg());
  uint8_t *want = malloc(n), *dec = malloc(n);
  int32_t *all = malloc(n * sizeof *all);
  for (int split = 0; split < 2; split++) {
    size_t wn = 0;
    for (int64_t c = 0; c * RF_DATA_SPLIT_CHUNK_BYTES < (int64_t)n; c++) {
      if (rf_data_split_is_val(c, 0.25) != split) continue;
      size_t b = (size_t)c * RF_DATA_SPLIT_CHUNK_BYTES,
             e = b + RF_DATA_SPLIT_CHUNK_BYTES < n ? b + RF_DATA_SPLIT_CHUNK_BYTES : n;
      memcpy(want + wn, text + b, e - b);
      wn += e - b;
    }
    const struct rf_token_file *f = split ? &va : &tr;
    for (int64_t i = 0; i < f->n_tokens; i++) all[i] = rf_token_file_get(f, i);
    RF_CHECK(rf_tokenizer_decode(&loaded, all, (size_t)f->n_tokens, dec, n, &got) == 0 && got == wn &&
                 memcmp(dec, want, wn) == 0,
             "%s tokens do not decode to the %s text", split ? "val" : "train", split ? "val" : "train");
  }
  /* another tokenizer of the same size (trained on the upper-cased text) does not match */
  struct rf_tokenizer other;
  uint8_t *text2 = malloc(n);
  for (size_t i = 0; i < n; i++) text2[i] = is_lower(text[i]) ? (uint8_t)(text[i] - 32) : text[i];
  RF_ASSERT(rf_tokenizer_train_bpe(&other, text2, n, 300) == 0);
  char other_path[128];
  snprintf(other_path, sizeof other_path, "%s/other.json", dir);
  RF_ASSERT(rf_tokenizer_save(&other, other_path) == 0);
  RF_CHECK(other.vocab_size == loaded.vocab_size &&
               rf_token_file_check_tokenizer(&tr, &other, other_path) == -1 &&
               strstr(rf_error_msg(), "another tokenizer"),
           "a token file refuses another tokenizer of its size: %s", rf_error_msg());
  struct rf_tokenizer bytes;
  rf_tokenizer_init_bytes(&bytes);
  RF_CHECK(rf_token_file_check_tokenizer(&tr, &bytes, "byte") == -1 && strstr(rf_error_msg(), train_path),
           "a BPE token file refuses the byte tokenizer");

  rf_token_file_close(&tr);
  rf_token_file_close(&va);
  rf_tokenizer_free(&loaded);
  rf_tokenizer_free(&other);
  rf_tokenizer_free(&bytes);
  rf_tokenizer_free(&big);
  rf_tokenizer_free(&tok);
  free(text);
  free(text2);
  free(ids);
  free(ids2);
  free(want);
  free(dec);
  free(all);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_data_bpe");
}
