/* Tokenizers: byte-level (id = byte value) and the common interface over it and
 * BPE (bpe.c); saving and loading the tokenizer file. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

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

void rf_tokenizer_init_bytes(struct rf_tokenizer *tok) {
  memset(tok, 0, sizeof *tok);
  tok->kind = RF_TOKENIZER_KIND_BYTE;
  tok->vocab_size = RF_DATA_BYTE_VOCAB;
}

void rf_tokenizer_free(struct rf_tokenizer *tok) {
  free(tok->merges);
  free(tok->expansion_off);
  free(tok->expansion);
  free(tok->pair_keys);
  free(tok->pair_merge);
  memset(tok, 0, sizeof *tok);
}

size_t rf_tokenizer_encode(const struct rf_tokenizer *tok, const uint8_t *text, size_t n, int32_t *ids) {
  if (!tok || ((!text || !ids) && n > 0)) return 0;
  if (tok->kind == RF_TOKENIZER_KIND_BYTE) {
    rf_data_encode_bytes(text, n, ids);
    return n;
  }
  return rf_bpe_encode(tok, text, n, ids);
}

int rf_tokenizer_decode(const struct rf_tokenizer *tok, const int32_t *ids, size_t n, uint8_t *out,
                        size_t cap, size_t *out_n) {
  RF_REQUIRE_ARG("rf_tokenizer_decode", out_n);
  *out_n = 0;
  RF_REQUIRE_ARG("rf_tokenizer_decode", tok);
  RF_REQUIRE(ids || n == 0, "rf_tokenizer_decode: argument 'ids' is NULL");
  RF_REQUIRE(out || cap == 0, "rf_tokenizer_decode: argument 'out' is NULL");
  if (tok->kind == RF_TOKENIZER_KIND_BYTE) {
    if (n > cap) RF_FAIL("decoding %zu tokens needs %zu bytes, the buffer has %zu", n, n, cap);
    RF_TRY(rf_data_decode_bytes(ids, n, out));
    *out_n = n;
    return 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 0 || ids[i] >= tok->vocab_size)
      RF_FAIL("token %d at position %zu is outside the vocabulary (size %d)", ids[i], i, tok->vocab_size);
    size_t len = (size_t)(tok->expansion_off[ids[i] + 1] - tok->expansion_off[ids[i]]);
    if (*out_n + len > cap) RF_FAIL("decoding needs more than the buffer's %zu bytes", cap);
    memcpy(out + *out_n, tok->expansion + tok->expansion_off[ids[i]], len);
    *out_n += len;
  }
  return 0;
}

int rf_tokenizer_save(struct rf_tokenizer *tok, const char *path) {
  cJSON *j = cJSON_CreateObject();
  if (!j) RF_FAIL("%s: out of memory", path);
  cJSON_AddStringToObject(j, "type", tok->kind == RF_TOKENIZER_KIND_BYTE ? "byte" : "bpe");
  cJSON_AddNumberToObject(j, "version", RF_TOKENIZER_VERSION);
  cJSON_AddNumberToObject(j, "vocab_size", tok->vocab_size);
  cJSON *merges = cJSON_AddArrayToObject(j, "merges");
  for (int i = 0; i < tok->n_merges; i++) {
    int pair[2] = {tok->merges[2 * i], tok->merges[2 * i + 1]};
    cJSON_AddItemToArray(merges, cJSON_CreateIntArray(pair, 2));
  }
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) RF_FAIL("%s: out of memory", path);
  tok->file_xxh3 = XXH3_64bits(text, strlen(text));
  int rc = rf_file_write_all(path, text, strlen(text));
  free(text);
  return rc;
}

/* Fills tok from the parsed JSON; the caller frees tok on failure. */
static int rf_tokenizer_parse(struct rf_tokenizer *tok, const cJSON *j, const char *path) {
  const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
  const cJSON *version = cJSON_GetObjectItemCaseSensitive(j, "version");
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(j, "vocab_size");
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(j, "merges");
  if (!cJSON_IsNumber(version) || version->valueint < 1) RF_FAIL("%s: missing or bad 'version'", path);
  if (version->valueint > RF_TOKENIZER_VERSION)
    RF_FAIL("%s: tokenizer version %d is newer than this build reads (%d)", path, version->valueint,
            RF_TOKENIZER_VERSION);
  if (!cJSON_IsString(type) ||
      (strcmp(type->valuestring, "byte") != 0 && strcmp(type->valuestring, "bpe") != 0))
    RF_FAIL("%s: 'type' must be \"byte\" or \"bpe\"", path);
  if (!cJSON_IsArray(merges)) RF_FAIL("%s: missing 'merges' array", path);
  int n = cJSON_GetArraySize(merges);
  if (strcmp(type->valuestring, "byte") == 0 && n != 0) RF_FAIL("%s: a byte tokenizer has no merges", path);
  if (n > 65536 - RF_DATA_BYTE_VOCAB) RF_FAIL("%s: %d merges are too many", path, n);
  tok->kind = strcmp(type->valuestring, "byte") == 0 ? RF_TOKENIZER_KIND_BYTE : RF_TOKENIZER_KIND_BPE;
  tok->merges = rf_xmalloc(2 * (size_t)(n ? n : 1) * sizeof *tok->merges);
  int i = 0;
  for (const cJSON *m = merges->child; m; m = m->next, i++) {
    const cJSON *a = cJSON_GetArrayItem(m, 0), *b = cJSON_GetArrayItem(m, 1);
    if (!cJSON_IsArray(m) || cJSON_GetArraySize(m) != 2 || !cJSON_IsNumber(a) || !cJSON_IsNumber(b) ||
        a->valueint < 0 || b->valueint < 0 || a->valueint >= RF_DATA_BYTE_VOCAB + i ||
        b->valueint >= RF_DATA_BYTE_VOCAB + i)
      RF_FAIL("%s: merge %d is not a pair of earlier ids", path, i);
    tok->merges[2 * i] = a->valueint;
    tok->merges[2 * i + 1] = b->valueint;
    tok->n_merges = i + 1;
  }
  if (!cJSON_IsNumber(vocab) || vocab->valueint != RF_DATA_BYTE_VOCAB + n)
    RF_FAIL("%s: 'vocab_size' must be 256 + the number of merges (%d)", path, RF_DATA_BYTE_VOCAB + n);
  if (tok->kind == RF_TOKENIZER_KIND_BPE)
    rf_bpe_build_tables(tok);
  else
    tok->vocab_size = RF_DATA_BYTE_VOCAB;
  return 0;
}

int rf_tokenizer_load(struct rf_tokenizer *tok, const char *path) {
  memset(tok, 0, sizeof *tok);
  char *text;
  size_t n;
  RF_TRY(rf_file_read_all(path, &text, &n));
  uint64_t hash = XXH3_64bits(text, n);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) RF_FAIL("%s: not valid JSON", path);
  int rc = rf_tokenizer_parse(tok, j, path);
  tok->file_xxh3 = hash;
  cJSON_Delete(j);
  if (rc != 0) rf_tokenizer_free(tok);
  return rc;
}
