/* rf-test: timeout=30
 * `rfsdp prepare` run as a user would: the files it writes, its summary line and
 * its errors. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/data.h"
#include "rf_cli.h"
#include "rf_test.h"

int main(void) {
  char dir[64] = "/tmp/rf_test_data_cli.XXXXXX", input[128], prefix[128], path[160], out[8192];
  RF_ASSERT(mkdtemp(dir));
  snprintf(input, sizeof input, "%s/in.txt", dir);
  snprintf(prefix, sizeof prefix, "%s/in", dir);
  const char *line = "In the beginning God created the heaven and the earth.\n";
  size_t n = 0, len = strlen(line);
  char *text = malloc(3000 * len);
  for (int i = 0; i < 3000; i++, n += len) memcpy(text + n, line, len);
  RF_ASSERT(rf_file_write_all(input, text, n) == 0);

  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", input, prefix);
  RF_CHECK(rc == 0 && strstr(out, "(byte, 256 ids)"), "prepare: rc %d '%s'", rc, out);
  struct rf_token_file tr, va;
  snprintf(path, sizeof path, "%s.train.tok", prefix);
  RF_CHECK(rf_token_file_open(&tr, path) == 0, "%s", rf_error_msg());
  snprintf(path, sizeof path, "%s.val.tok", prefix);
  RF_CHECK(rf_token_file_open(&va, path) == 0, "%s", rf_error_msg());
  RF_CHECK(tr.n_tokens + va.n_tokens == (int64_t)n && va.n_tokens == RF_DATA_SPLIT_CHUNK_BYTES,
           "%lld + %lld tokens for %zu bytes (10 chunks, 1 validation)", (long long)tr.n_tokens,
           (long long)va.n_tokens, n);
  rf_token_file_close(&tr);
  rf_token_file_close(&va);

  /* the words of the line are whole after 34 merges; then no pair repeats and training stops */
  rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --tokenizer bpe --bpe-vocab 300", input,
                  prefix);
  RF_CHECK(rc == 0 && strstr(out, "(bpe, 290 ids)"), "prepare bpe: rc %d '%s'", rc, out);

  rc = rf_cli_run(out, sizeof out, "prepare --input %s/none.txt --out %s", dir, prefix);
  RF_CHECK(rc == 1 && strstr(out, "none.txt: cannot open input text"), "missing input: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --tokenizer words", input, prefix);
  RF_CHECK(rc == 2 && strstr(out, "tokenizer"), "bad tokenizer: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --tokenizer bpe --bpe-vocab 100", input,
                  prefix);
  RF_CHECK(rc == 2 && strstr(out, "--bpe-vocab 100") && strstr(out, "(256, 65536]"),
           "bad BPE size: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "prepare --out %s", prefix);
  RF_CHECK(rc == 2 && strstr(out, "--input is required"), "no input: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "prepare --help");
  RF_CHECK(rc == 0 && strstr(out, "--val-fraction"), "help: rc %d '%s'", rc, out);

  free(text);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_data_cli");
}
