/* The parsers' fuzz entry points (see rf_fuzz.h). Every reader takes a path, so an
 * input is written to a file in a private temporary folder first. */
#include "rf_fuzz.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "data/data.h"
#include "model/model.h"
#include "plan/plan.h"
#include "safetensors/safetensors.h"

static char rf_fuzz_dir[64];

/* Every file a target writes (removed at exit). */
enum {
  RF_FUZZ_TOK,
  RF_FUZZ_TOKENIZER,
  RF_FUZZ_ST,
  RF_FUZZ_META,
  RF_FUZZ_MARKER,
  RF_FUZZ_BIN0,
  RF_FUZZ_BIN1,
  RF_FUZZ_IDX0
};
static const char *const rf_fuzz_files[] = {"x.tok",          "tok.json",        "x.safetensors",
                                            "meta.json",      "COMPLETE",        "rank-00000.bin",
                                            "rank-00001.bin", "rank-00000.json", "rank-00001.json"};
enum { RF_FUZZ_N_FILES = (int)(sizeof rf_fuzz_files / sizeof rf_fuzz_files[0]) };

static void rf_fuzz_cleanup(void) {
  char path[128];
  for (int i = 0; i < RF_FUZZ_N_FILES; i++) {
    snprintf(path, sizeof path, "%s/%s", rf_fuzz_dir, rf_fuzz_files[i]);
    unlink(path);
  }
  rmdir(rf_fuzz_dir);
}

/* dir/name (the folder made on first use, removed at exit). */
static void rf_fuzz_path(char *out, size_t cap, const char *name) {
  if (!rf_fuzz_dir[0]) {
    snprintf(rf_fuzz_dir, sizeof rf_fuzz_dir, "/tmp/rf_fuzz.XXXXXX");
    if (!mkdtemp(rf_fuzz_dir)) abort();
    atexit(rf_fuzz_cleanup);
  }
  snprintf(out, cap, "%s/%s", rf_fuzz_dir, name);
}

/* Writes bytes to dir/name (plainly: the atomic writer's fsync would dominate). */
static void rf_fuzz_write(const char *name, const void *data, size_t size, char *path, size_t cap) {
  rf_fuzz_path(path, cap, name);
  FILE *f = fopen(path, "wb");
  if (!f) abort();
  if (size && fwrite(data, 1, size, f) != size) abort();
  fclose(f);
}

static void rf_fuzz_remove(const char *name) {
  char path[128];
  rf_fuzz_path(path, sizeof path, name);
  unlink(path);
}

/* Up to max sections of data split at RF_FUZZ_SEPARATOR; returns the count. */
static int rf_fuzz_split(const uint8_t *data, size_t size, const uint8_t **part, size_t *len, int max) {
  const size_t sep = strlen(RF_FUZZ_SEPARATOR);
  int n = 0;
  size_t start = 0;
  for (size_t i = 0; n < max - 1 && i + sep <= size; i++)
    if (memcmp(data + i, RF_FUZZ_SEPARATOR, sep) == 0) {
      part[n] = data + start;
      len[n++] = i - start;
      start = i + sep;
      i = start - 1;
    }
  part[n] = data + start;
  len[n++] = size - start;
  return n;
}

/* The HF config reader, the trainable model's check, and the description of every family. */
static int rf_fuzz_hf_config(const uint8_t *data, size_t size) {
  struct rf_model_config cfg;
  if (rf_model_config_parse(&cfg, (const char *)data, size, "config.json") != 0) return 0;
  struct rf_model_desc d;
  rf_model_desc_make(&cfg, &d);
  rf_model_desc_free(&d);
  if (rf_model_config_check(&cfg, "config.json") == 0) (void)rf_model_n_params(&cfg);
  return 0;
}

/* The description reader (HF configs and units files), then the planner's tensor list. */
static int rf_fuzz_units(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1);
  if (!text) abort();
  memcpy(text, data, size);
  text[size] = '\0';
  struct rf_model_desc d;
  if (rf_model_desc_parse(text, "units.json", &d) == 0) {
    const struct rf_plan_policy policy = {
        .block_rows = 1, .vector_block = 1, .max_buffers = 4, .align_bytes = 64};
    free(rf_model_desc_plan_units(&d, &policy));
    rf_model_desc_free(&d);
  }
  free(text);
  return 0;
}

static int rf_fuzz_token_file(const uint8_t *data, size_t size) {
  char path[128];
  rf_fuzz_write(rf_fuzz_files[RF_FUZZ_TOK], data, size, path, sizeof path);
  struct rf_token_file f;
  if (rf_token_file_open(&f, path) == 0) {
    int64_t sum = 0;
    for (int64_t i = 0; i < f.n_tokens; i++) sum += rf_token_file_get(&f, i);
    (void)sum;
    rf_token_file_close(&f);
  }
  return 0;
}

static int rf_fuzz_tokenizer(const uint8_t *data, size_t size) {
  char path[128];
  rf_fuzz_write(rf_fuzz_files[RF_FUZZ_TOKENIZER], data, size, path, sizeof path);
  struct rf_tokenizer tok;
  if (rf_tokenizer_load(&tok, path) != 0) return 0;
  static const char text[] = "In the beginning God created the heaven and the earth. 1:2 \xc3\xa9t\xc3\xa9!";
  int32_t ids[sizeof text];
  size_t n = rf_tokenizer_encode(&tok, (const uint8_t *)text, sizeof text - 1, ids);
  uint8_t back[sizeof text];
  size_t got = 0;
  if (rf_tokenizer_decode(&tok, ids, n, back, sizeof back, &got) != 0 || got != sizeof text - 1 ||
      memcmp(back, text, got) != 0)
    abort(); /* a tokenizer that loads must round-trip */
  rf_tokenizer_free(&tok);
  return 0;
}

static int rf_fuzz_safetensors(const uint8_t *data, size_t size) {
  char path[128];
  rf_fuzz_write(rf_fuzz_files[RF_FUZZ_ST], data, size, path, sizeof path);
  struct rf_safetensors_file f;
  if (rf_safetensors_open(&f, path) != 0) return 0;
  float buf[256];
  for (int i = 0; i < f.n_tensors; i++) {
    const struct rf_safetensors_tensor *t = &f.tensors[i];
    int64_t n = t->numel < 256 ? t->numel : 256;
    (void)rf_safetensors_read_f32(&f, t->name, 0, n, buf);
  }
  rf_safetensors_close(&f);
  return 0;
}

/* Sections: meta.json, COMPLETE (empty: one holding meta.json's true checksum, so the
 * metadata is parsed past the checksum), rank-00000.bin, rank-00001.bin. */
static int rf_fuzz_ckpt_open(const uint8_t *data, size_t size) {
  const uint8_t *part[4];
  size_t len[4];
  int n = rf_fuzz_split(data, size, part, len, 4);
  char path[128], marker[96];
  for (int i = RF_FUZZ_META; i < RF_FUZZ_IDX0; i++) rf_fuzz_remove(rf_fuzz_files[i]);
  rf_fuzz_write(rf_fuzz_files[RF_FUZZ_META], part[0], len[0], path, sizeof path);
  if (n < 2 || len[1] == 0) {
    int m =
        snprintf(marker, sizeof marker, "{\"meta_xxh3\": \"%016" PRIx64 "\"}", XXH3_64bits(part[0], len[0]));
    rf_fuzz_write(rf_fuzz_files[RF_FUZZ_MARKER], marker, (size_t)m, path, sizeof path);
  } else {
    rf_fuzz_write(rf_fuzz_files[RF_FUZZ_MARKER], part[1], len[1], path, sizeof path);
  }
  for (int r = 0; r < 2 && 2 + r < n; r++)
    rf_fuzz_write(rf_fuzz_files[RF_FUZZ_BIN0 + r], part[2 + r], len[2 + r], path, sizeof path);
  struct rf_ckpt ck;
  if (rf_ckpt_open(&ck, rf_fuzz_dir) == 0) {
    (void)rf_ckpt_verify(&ck);
    rf_ckpt_close(&ck);
  }
  return 0;
}

/* Sections: rank-00000.json, rank-00000.bin, rank-00001.json, rank-00001.bin; the
 * merge of the indexes at the end of a save (step 2, one or two ranks). */
static int rf_fuzz_ckpt_index(const uint8_t *data, size_t size) {
  const uint8_t *part[4];
  size_t len[4];
  int n = rf_fuzz_split(data, size, part, len, 4);
  char path[128];
  for (int i = RF_FUZZ_META; i < RF_FUZZ_N_FILES; i++) rf_fuzz_remove(rf_fuzz_files[i]);
  for (int i = 0; i < n; i++)
    rf_fuzz_write(rf_fuzz_files[(i % 2 ? RF_FUZZ_BIN0 : RF_FUZZ_IDX0) + i / 2], part[i], len[i], path,
                  sizeof path);
  (void)rf_ckpt_save_finish(rf_fuzz_dir, n > 2 ? 2 : 1, 2, NULL);
  return 0;
}

const struct rf_fuzz_target rf_fuzz_targets[] = {
    {"hf_config", rf_fuzz_hf_config},     {"units", rf_fuzz_units},
    {"token_file", rf_fuzz_token_file},   {"tokenizer", rf_fuzz_tokenizer},
    {"safetensors", rf_fuzz_safetensors}, {"ckpt_open", rf_fuzz_ckpt_open},
    {"ckpt_index", rf_fuzz_ckpt_index},
};
const int rf_fuzz_n_targets = (int)(sizeof rf_fuzz_targets / sizeof rf_fuzz_targets[0]);

const struct rf_fuzz_target *rf_fuzz_find(const char *name) {
  for (int i = 0; i < rf_fuzz_n_targets; i++)
    if (strcmp(rf_fuzz_targets[i].name, name) == 0) return &rf_fuzz_targets[i];
  return NULL;
}
