/* rf-test: timeout=30
 * src/data: the byte tokenizer, token files (round trip and every malformed
 * input), the loader (the union of the ranks' shares is the W=1 batch for
 * W=1..5; determinism) and the prepare split. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "rf_test.h"

static char dir[64];

static void path_in_dir(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", dir, name); }

/* rc must be -1 and the message must name `path` and contain `problem`. */
static void expect_error(int rc, const char *path, const char *problem, const char *what) {
  const char *msg = rf_error_msg();
  RF_CHECK(rc == -1, "%s: expected a failure", what);
  RF_CHECK(strstr(msg, path) != NULL, "%s: message does not name %s: %s", what, path, msg);
  RF_CHECK(strstr(msg, problem) != NULL, "%s: message does not say '%s': %s", what, problem, msg);
}

static void copy_file(const char *from, const char *to) {
  char *buf;
  size_t n;
  RF_ASSERT(rf_file_read_all(from, &buf, &n) == 0);
  FILE *f = rf_test_fopen(to, "wb");
  RF_ASSERT(fwrite(buf, 1, n, f) == n);
  fclose(f);
  free(buf);
}

static void patch_file(const char *path, long offset, const void *bytes, size_t n) {
  FILE *f = rf_test_fopen(path, "r+b");
  RF_ASSERT(fseek(f, offset, SEEK_SET) == 0 && fwrite(bytes, 1, n, f) == n);
  fclose(f);
}

static void test_tokenizer(void) {
  uint8_t text[1024], back[1024];
  int32_t ids[1024];
  uint64_t rng = 1;
  for (int i = 0; i < 1024; i++) text[i] = i < 256 ? (uint8_t)i : (uint8_t)rf_test_rand_u64(&rng);
  rf_data_encode_bytes(text, 1024, ids);
  for (int i = 0; i < 1024; i++) RF_CHECK(ids[i] == text[i], "byte %d encodes to %d", text[i], ids[i]);
  RF_CHECK(rf_data_decode_bytes(ids, 1024, back) == 0 && memcmp(text, back, 1024) == 0, "byte round trip");
  ids[7] = 256;
  RF_CHECK(rf_data_decode_bytes(ids, 1024, back) == -1 && strstr(rf_error_msg(), "position 7"),
           "id 256 refused");
  ids[7] = -1;
  RF_CHECK(rf_data_decode_bytes(ids, 1024, back) == -1, "id -1 refused");
}

static void roundtrip(const char *name, int64_t vocab, size_t n, int width) {
  char path[128];
  path_in_dir(path, sizeof path, name);
  int32_t *tok = malloc((n ? n : 1) * sizeof *tok);
  uint64_t rng = (uint64_t)vocab;
  for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(rf_test_rand_u64(&rng) % (uint64_t)vocab);
  if (n) tok[0] = (int32_t)vocab - 1;
  RF_CHECK(rf_token_file_write(path, tok, n, vocab) == 0, "write %s: %s", name, rf_error_msg());
  struct rf_token_file f;
  RF_CHECK(rf_token_file_open(&f, path) == 0, "open %s: %s", name, rf_error_msg());
  RF_CHECK(f.n_tokens == (int64_t)n && f.vocab_size == vocab && f.token_bytes == width, "%s header fields",
           name);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += rf_token_file_get(&f, (int64_t)i) != tok[i];
  RF_CHECK(bad == 0, "%s: %zu tokens differ after the round trip", name, bad);
  rf_token_file_close(&f);
  int32_t over = (int32_t)vocab;
  RF_CHECK(
      rf_token_file_write(path, &over, 1, vocab) == -1 && strstr(rf_error_msg(), "outside the vocabulary"),
      "writing a token >= vocab is refused");
  RF_CHECK(rf_token_file_open(&f, path) == 0 && f.n_tokens == (int64_t)n, "a refused write left %s unchanged",
           name);
  rf_token_file_close(&f);
  free(tok);
}

static void test_bad_files(void) {
  char good[128], bad[128];
  path_in_dir(good, sizeof good, "good.tok");
  path_in_dir(bad, sizeof bad, "bad.tok");
  int32_t tok[1000];
  for (int i = 0; i < 1000; i++) tok[i] = (i * 7) % 256;
  RF_ASSERT(rf_token_file_write(good, tok, 1000, 256) == 0);
  struct rf_token_file f;

  char missing[128];
  path_in_dir(missing, sizeof missing, "missing.tok");
  expect_error(rf_token_file_open(&f, missing), missing, "cannot open", "missing file");

  copy_file(good, bad);
  RF_ASSERT(truncate(bad, 64 + 2000 - 10) == 0);
  expect_error(rf_token_file_open(&f, bad), bad, "truncated", "truncated payload");
  RF_ASSERT(truncate(bad, 20) == 0);
  expect_error(rf_token_file_open(&f, bad), bad, "truncated", "truncated header");

  copy_file(good, bad);
  patch_file(bad, 0, "X", 1);
  expect_error(rf_token_file_open(&f, bad), bad, "bad magic", "bad magic");

  copy_file(good, bad);
  uint8_t v2[4] = {2, 0, 0, 0};
  patch_file(bad, 8, v2, 4);
  expect_error(rf_token_file_open(&f, bad), bad, "newer", "newer version");

  copy_file(good, bad);
  uint8_t count[8] = {0xe9, 0x03, 0, 0, 0, 0, 0, 0}; /* 1001 */
  patch_file(bad, 24, count, 8);
  expect_error(rf_token_file_open(&f, bad), bad, "does not match the file size",
               "count larger than the file");
  copy_file(good, bad);
  FILE *fp = rf_test_fopen(bad, "ab");
  RF_ASSERT(fwrite("zz", 1, 2, fp) == 2);
  fclose(fp);
  expect_error(rf_token_file_open(&f, bad), bad, "does not match the file size", "trailing bytes");

  copy_file(good, bad);
  uint8_t flip = 0xff;
  patch_file(bad, 64 + 1234, &flip, 1);
  expect_error(rf_token_file_open(&f, bad), bad, "checksum mismatch", "corrupted payload");

  copy_file(good, bad);
  uint8_t width[4] = {3, 0, 0, 0};
  patch_file(bad, 12, width, 4);
  expect_error(rf_token_file_open(&f, bad), bad, "token width", "bad width");

  copy_file(good, bad); /* the payload checksum holds, but vocab says 100 */
  uint8_t vocab[8] = {100, 0, 0, 0, 0, 0, 0, 0};
  patch_file(bad, 16, vocab, 8);
  expect_error(rf_token_file_open(&f, bad), bad, "outside the vocabulary", "token beyond vocab");
  RF_CHECK(f.map == NULL, "a failed open leaves nothing mapped");
}

static void test_loader(void) {
  /* token i = i: every token names its own position */
  enum { N = 50000, B = 60, T = 16 };
  char path[128];
  path_in_dir(path, sizeof path, "pos.tok");
  int32_t *tok = malloc(N * sizeof *tok);
  for (int i = 0; i < N; i++) tok[i] = i;
  RF_ASSERT(rf_token_file_write(path, tok, N, 65536) == 0);
  free(tok);
  struct rf_token_file f;
  RF_ASSERT(rf_token_file_open(&f, path) == 0);
  struct rf_data_loader loader;
  RF_ASSERT(rf_data_loader_init(&loader, &f) == 0);

  static int32_t ref_x[B * T], ref_y[B * T], x[B * T], y[B * T];
  double offset_sum = 0;
  int64_t offsets = 0;
  for (int64_t step = 0; step < 40; step++) {
    uint64_t seed = 1234 + (uint64_t)(step % 3);
    RF_ASSERT(rf_data_loader_batch(&loader, seed, step, B, T, 0, 1, ref_x, ref_y) == 0);
    for (int s = 0; s < B; s++) {
      int64_t off = ref_x[s * T];
      RF_CHECK(off == rf_data_loader_offset(&loader, seed, step, s, T), "offset of sequence %d", s);
      RF_CHECK(off >= 0 && off + T < N, "offset %lld out of range", (long long)off);
      offset_sum += (double)off;
      offsets++;
      for (int t = 0; t < T; t++) {
        RF_CHECK(ref_x[s * T + t] == off + t, "sequence %d is not contiguous", s);
        RF_CHECK(ref_y[s * T + t] == off + t + 1, "targets of sequence %d are not the next tokens", s);
      }
    }
    for (int world = 2; world <= 5; world++) {
      int per = B / world;
      for (int rank = 0; rank < world; rank++) {
        RF_CHECK(rf_data_loader_batch(&loader, seed, step, B, T, rank, world, x, y) == 0, "W=%d batch",
                 world);
        RF_CHECK(memcmp(x, ref_x + rank * per * T, (size_t)per * T * sizeof *x) == 0 &&
                     memcmp(y, ref_y + rank * per * T, (size_t)per * T * sizeof *y) == 0,
                 "step %lld: rank %d of %d does not hold its rows of the W=1 batch", (long long)step, rank,
                 world);
      }
    }
    RF_ASSERT(rf_data_loader_batch(&loader, seed, step, B, T, 0, 1, x, y) == 0);
    RF_CHECK(memcmp(x, ref_x, sizeof x) == 0, "the same (seed, step) gives the same batch");
    RF_ASSERT(rf_data_loader_batch(&loader, seed, step + 1, B, T, 0, 1, x, y) == 0);
    RF_CHECK(memcmp(x, ref_x, sizeof x) != 0, "the next step gives another batch");
    RF_ASSERT(rf_data_loader_batch(&loader, seed + 100, step, B, T, 0, 1, x, y) == 0);
    RF_CHECK(memcmp(x, ref_x, sizeof x) != 0, "another seed gives another batch");
  }
  /* 2400 uniform offsets over [0, N-T): the mean is within 3% of the middle */
  RF_CHECK_CLOSE(offset_sum / (double)offsets, (N - T - 1) / 2.0, 0.03, 0.0, "mean offset");

  int rc = rf_data_loader_batch(&loader, 1, 0, 7, T, 0, 2, x, y);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "not divisible by the 2 ranks"), "B=7, W=2 refused: %s",
           rf_error_msg());
  rc = rf_data_loader_batch(&loader, 1, 0, 1, N, 0, 1, x, y);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), path) && strstr(rf_error_msg(), "fewer than one sequence"),
           "a sequence longer than the file refused: %s", rf_error_msg());
  rf_token_file_close(&f);
}

static int count_tmp_files(void) {
  DIR *d = opendir(dir);
  RF_ASSERT(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strstr(e->d_name, ".tmp.") != NULL;
  closedir(d);
  return n;
}

static void test_prepare(void) {
  enum { BYTES = 10 * RF_DATA_SPLIT_CHUNK_BYTES + 1000 };
  char input[128], prefix[128], train_path[160], val_path[160];
  path_in_dir(input, sizeof input, "text.txt");
  path_in_dir(prefix, sizeof prefix, "text");
  snprintf(train_path, sizeof train_path, "%s.train.tok", prefix);
  snprintf(val_path, sizeof val_path, "%s.val.tok", prefix);
  uint8_t *text = malloc(BYTES);
  uint64_t rng = 99;
  for (int i = 0; i < BYTES; i++) text[i] = (uint8_t)rf_test_rand_u64(&rng);
  FILE *fp = rf_test_fopen(input, "wb");
  RF_ASSERT(fwrite(text, 1, BYTES, fp) == BYTES);
  fclose(fp);

  const double fractions[] = {0.0, 0.25, 0.5};
  for (int k = 0; k < 3; k++) {
    struct rf_data_prepare_stats st;
    struct rf_data_prepare_options opt = {.val_fraction = fractions[k]};
    RF_CHECK(rf_data_prepare(input, prefix, &opt, &st) == 0, "prepare: %s", rf_error_msg());
    struct rf_token_file tr, va;
    RF_ASSERT(rf_token_file_open(&tr, train_path) == 0 && rf_token_file_open(&va, val_path) == 0);
    RF_CHECK(tr.n_tokens + va.n_tokens == BYTES && st.input_bytes == BYTES, "every byte is a token");
    /* replay the rule: chunk i goes to val iff rf_data_split_is_val(i) */
    int64_t it = 0, iv = 0, wrong = 0, n_val_chunks = 0;
    for (int64_t c = 0; c * RF_DATA_SPLIT_CHUNK_BYTES < BYTES; c++) {
      int is_val = rf_data_split_is_val(c, fractions[k]);
      n_val_chunks += is_val;
      for (int64_t b = c * RF_DATA_SPLIT_CHUNK_BYTES; b < BYTES && b < (c + 1) * RF_DATA_SPLIT_CHUNK_BYTES;
           b++)
        wrong += (is_val ? rf_token_file_get(&va, iv++) : rf_token_file_get(&tr, it++)) != text[b];
    }
    RF_CHECK(wrong == 0, "fraction %g: %lld tokens are not where the split rule puts them", fractions[k],
             (long long)wrong);
    RF_CHECK(n_val_chunks == (int64_t)(11 * fractions[k]), "fraction %g: %lld of 11 chunks are validation",
             fractions[k], (long long)n_val_chunks);
    struct rf_tokenizer tok;
    char tok_path[160];
    snprintf(tok_path, sizeof tok_path, "%s.tokenizer.json", prefix);
    RF_CHECK(rf_tokenizer_load(&tok, tok_path) == 0 && tok.kind == RF_TOKENIZER_KIND_BYTE &&
                 rf_token_file_check_tokenizer(&tr, &tok, tok_path) == 0 &&
                 tr.tokenizer_xxh3 == tok.file_xxh3,
             "the byte tokenizer file matches the token files: %s", rf_error_msg());
    rf_tokenizer_free(&tok);
    rf_token_file_close(&tr);
    rf_token_file_close(&va);
  }
  struct rf_data_prepare_stats st;
  struct rf_data_prepare_options opt = {.val_fraction = 1.0};
  RF_CHECK(rf_data_prepare(input, prefix, &opt, &st) == -1 && strstr(rf_error_msg(), "[0, 1)"), "fraction 1");
  opt.val_fraction = 0.1;
  char missing[128], out2[128], out2_train[160];
  path_in_dir(missing, sizeof missing, "none.txt");
  path_in_dir(out2, sizeof out2, "none");
  snprintf(out2_train, sizeof out2_train, "%s.train.tok", out2);
  expect_error(rf_data_prepare(missing, out2, &opt, &st), missing, "cannot open",
               "prepare of a missing input");
  RF_CHECK(access(out2_train, F_OK) != 0, "a failed prepare leaves no output");
  RF_CHECK(count_tmp_files() == 0, "no temporary file is left behind");
  free(text);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/rf_test_data.XXXXXX");
  RF_ASSERT(mkdtemp(dir));
  test_tokenizer();
  roundtrip("u16.tok", 256, 100000, 2);
  roundtrip("u16max.tok", 65536, 5000, 2);
  roundtrip("u32.tok", 70000, 5000, 4);
  roundtrip("empty.tok", 256, 0, 2);
  test_bad_files();
  test_loader();
  test_prepare();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_data");
}
