/* Byte-pair encoding: the word split, training (merge the most frequent adjacent
 * pair of ids, counted over the word types, until the vocabulary is full) and
 * the encoding of one word (apply the earliest-learned merge first). */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "data/data.h"

#define RF_BPE_MAX_WORD 64 /* longer runs are cut into words of this length */
#define RF_BPE_EMPTY UINT64_MAX

/* 1 letter (ASCII letters and every byte >= 0x80, so UTF-8 stays inside words), 2 digit, 0 other */
static int rf_bpe_class(uint8_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return 1;
  if (c >= '0' && c <= '9') return 2;
  return 0;
}

/* The length of the word that starts at text[i]. */
static size_t rf_bpe_word_len(const uint8_t *text, size_t i, size_t n) {
  size_t j = i;
  if (text[j] == ' ' && j + 1 < n && rf_bpe_class(text[j + 1]) != 0) j++;
  int c = rf_bpe_class(text[j]);
  if (c == 0) return j + 1 - i;
  while (j < n && j - i < RF_BPE_MAX_WORD && rf_bpe_class(text[j]) == c) j++;
  return j - i;
}

static uint64_t rf_bpe_pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

/* ---- the pair -> merge table of a tokenizer -------------------------------- */

static size_t rf_bpe_slot(const uint64_t *keys, size_t cap, uint64_t key) {
  size_t i = (size_t)XXH3_64bits(&key, sizeof key) & (cap - 1);
  while (keys[i] != RF_BPE_EMPTY && keys[i] != key) i = (i + 1) & (cap - 1);
  return i;
}

void rf_bpe_build_tables(struct rf_tokenizer *tok) {
  free(tok->pair_keys);
  free(tok->pair_merge);
  free(tok->expansion_off);
  free(tok->expansion);
  tok->vocab_size = RF_DATA_BYTE_VOCAB + tok->n_merges;
  tok->pair_cap = 16;
  while (tok->pair_cap < 2 * (size_t)tok->n_merges) tok->pair_cap *= 2;
  tok->pair_keys = rf_xmalloc(tok->pair_cap * sizeof *tok->pair_keys);
  tok->pair_merge = rf_xmalloc(tok->pair_cap * sizeof *tok->pair_merge);
  memset(tok->pair_keys, 0xff, tok->pair_cap * sizeof *tok->pair_keys);
  for (int i = 0; i < tok->n_merges; i++) {
    uint64_t key = rf_bpe_pair_key(tok->merges[2 * i], tok->merges[2 * i + 1]);
    size_t s = rf_bpe_slot(tok->pair_keys, tok->pair_cap, key);
    tok->pair_keys[s] = key;
    tok->pair_merge[s] = i;
  }
  tok->expansion_off = rf_xmalloc(((size_t)tok->vocab_size + 1) * sizeof *tok->expansion_off);
  tok->expansion_off[0] = 0;
  for (int id = 0; id < tok->vocab_size; id++) {
    int64_t len = id < RF_DATA_BYTE_VOCAB ? 1
                                          : (tok->expansion_off[tok->merges[2 * (id - 256)] + 1] -
                                             tok->expansion_off[tok->merges[2 * (id - 256)]]) +
                                                (tok->expansion_off[tok->merges[2 * (id - 256) + 1] + 1] -
                                                 tok->expansion_off[tok->merges[2 * (id - 256) + 1]]);
    tok->expansion_off[id + 1] = tok->expansion_off[id] + len;
  }
  tok->expansion = rf_xmalloc((size_t)tok->expansion_off[tok->vocab_size]);
  for (int id = 0; id < tok->vocab_size; id++) {
    uint8_t *dst = tok->expansion + tok->expansion_off[id];
    if (id < RF_DATA_BYTE_VOCAB) {
      dst[0] = (uint8_t)id;
      continue;
    }
    int32_t a = tok->merges[2 * (id - 256)], b = tok->merges[2 * (id - 256) + 1];
    size_t la = (size_t)(tok->expansion_off[a + 1] - tok->expansion_off[a]);
    memcpy(dst, tok->expansion + tok->expansion_off[a], la);
    memcpy(dst + la, tok->expansion + tok->expansion_off[b],
           (size_t)(tok->expansion_off[b + 1] - tok->expansion_off[b]));
  }
}

/* Encodes one word (len <= RF_BPE_MAX_WORD) into ids; returns the count. */
static size_t rf_bpe_encode_word(const struct rf_tokenizer *tok, const uint8_t *word, size_t len,
                                 int32_t *ids) {
  for (size_t i = 0; i < len; i++) ids[i] = word[i];
  while (len > 1) {
    int32_t best = INT32_MAX;
    size_t at = 0;
    for (size_t i = 0; i + 1 < len; i++) {
      size_t s = rf_bpe_slot(tok->pair_keys, tok->pair_cap, rf_bpe_pair_key(ids[i], ids[i + 1]));
      if (tok->pair_keys[s] != RF_BPE_EMPTY && tok->pair_merge[s] < best) {
        best = tok->pair_merge[s];
        at = i;
      }
    }
    if (best == INT32_MAX) break;
    ids[at] = RF_DATA_BYTE_VOCAB + best;
    memmove(ids + at + 1, ids + at + 2, (len - at - 2) * sizeof *ids);
    len--;
  }
  return len;
}

size_t rf_bpe_encode(const struct rf_tokenizer *tok, const uint8_t *text, size_t n, int32_t *ids) {
  size_t out = 0;
  for (size_t i = 0; i < n;) {
    size_t len = rf_bpe_word_len(text, i, n);
    out += rf_bpe_encode_word(tok, text + i, len, ids + out);
    i += len;
  }
  return out;
}

/* ---- training ---------------------------------------------------------------- */

/* The distinct words of the training text with their counts; each word's current
 * ids live in syms[start[t] .. start[t] + len[t]). Owns every array. */
struct rf_bpe_words {
  int32_t *syms;
  size_t n_syms, cap_syms;
  size_t *start;
  uint32_t *len;
  int64_t *count;
  size_t n, cap;
  int64_t *slots; /* hash of the original bytes -> type index, or -1 */
  size_t n_slots;
};

static int rf_bpe_word_equal(const struct rf_bpe_words *w, size_t t, const uint8_t *word, size_t len) {
  if (w->len[t] != len) return 0;
  for (size_t i = 0; i < len; i++)
    if (w->syms[w->start[t] + i] != word[i]) return 0;
  return 1;
}

static void rf_bpe_words_grow_slots(struct rf_bpe_words *w) {
  free(w->slots);
  w->n_slots = w->n_slots ? 2 * w->n_slots : 4096;
  w->slots = rf_xmalloc(w->n_slots * sizeof *w->slots);
  memset(w->slots, 0xff, w->n_slots * sizeof *w->slots);
  for (size_t t = 0; t < w->n; t++) {
    uint8_t word[RF_BPE_MAX_WORD];
    for (uint32_t i = 0; i < w->len[t]; i++) word[i] = (uint8_t)w->syms[w->start[t] + i];
    size_t s = (size_t)XXH3_64bits(word, w->len[t]) & (w->n_slots - 1);
    while (w->slots[s] >= 0) s = (s + 1) & (w->n_slots - 1);
    w->slots[s] = (int64_t)t;
  }
}

static void rf_bpe_words_init(struct rf_bpe_words *w) {
  memset(w, 0, sizeof *w);
  w->cap = 1024;
  w->start = rf_xmalloc(w->cap * sizeof *w->start);
  w->len = rf_xmalloc(w->cap * sizeof *w->len);
  w->count = rf_xmalloc(w->cap * sizeof *w->count);
  w->cap_syms = 4096;
  w->syms = rf_xmalloc(w->cap_syms * sizeof *w->syms);
  rf_bpe_words_grow_slots(w);
}

static void rf_bpe_words_add(struct rf_bpe_words *w, const uint8_t *word, size_t len) {
  if (2 * (w->n + 1) > w->n_slots) rf_bpe_words_grow_slots(w);
  size_t s = (size_t)XXH3_64bits(word, len) & (w->n_slots - 1);
  for (; w->slots[s] >= 0; s = (s + 1) & (w->n_slots - 1))
    if (rf_bpe_word_equal(w, (size_t)w->slots[s], word, len)) {
      w->count[w->slots[s]]++;
      return;
    }
  if (w->n == w->cap) {
    w->cap *= 2;
    w->start = realloc(w->start, w->cap * sizeof *w->start);
    w->len = realloc(w->len, w->cap * sizeof *w->len);
    w->count = realloc(w->count, w->cap * sizeof *w->count);
    if (!w->start || !w->len || !w->count) RF_DIE("out of memory");
  }
  if (w->n_syms + len > w->cap_syms) {
    w->cap_syms = 2 * (w->n_syms + len) + 4096;
    w->syms = realloc(w->syms, w->cap_syms * sizeof *w->syms);
    if (!w->syms) RF_DIE("out of memory");
  }
  w->start[w->n] = w->n_syms;
  w->len[w->n] = (uint32_t)len;
  w->count[w->n] = 1;
  for (size_t i = 0; i < len; i++) w->syms[w->n_syms + i] = word[i];
  w->n_syms += len;
  w->slots[s] = (int64_t)w->n;
  w->n++;
}

static void rf_bpe_words_free(struct rf_bpe_words *w) {
  free(w->syms);
  free(w->start);
  free(w->len);
  free(w->count);
  free(w->slots);
}

/* Replaces every (a, b) by z in every word, left to right. */
static void rf_bpe_words_merge(struct rf_bpe_words *w, int32_t a, int32_t b, int32_t z) {
  for (size_t t = 0; t < w->n; t++) {
    int32_t *s = w->syms + w->start[t];
    uint32_t out = 0;
    for (uint32_t i = 0; i < w->len[t]; i++) {
      if (i + 1 < w->len[t] && s[i] == a && s[i + 1] == b) {
        s[out++] = z;
        i++;
      } else {
        s[out++] = s[i];
      }
    }
    w->len[t] = out;
  }
}

int rf_tokenizer_train_bpe(struct rf_tokenizer *tok, const uint8_t *text, size_t n, int vocab_size) {
  if (vocab_size <= RF_DATA_BYTE_VOCAB || vocab_size > 65536)
    RF_FAIL("BPE vocabulary size %d must be in (256, 65536]", vocab_size);
  struct rf_bpe_words w;
  rf_bpe_words_init(&w);
  for (size_t i = 0; i < n;) {
    size_t len = rf_bpe_word_len(text, i, n);
    rf_bpe_words_add(&w, text + i, len);
    i += len;
  }
  memset(tok, 0, sizeof *tok);
  tok->kind = RF_TOKENIZER_KIND_BPE;
  tok->merges = rf_xmalloc(2 * (size_t)(vocab_size - RF_DATA_BYTE_VOCAB) * sizeof *tok->merges);
  /* pair counts: open addressing, cleared every round */
  size_t cap = 1024;
  while (cap < 2 * w.n_syms) cap *= 2;
  uint64_t *keys = rf_xmalloc(cap * sizeof *keys);
  int64_t *counts = rf_xmalloc(cap * sizeof *counts);
  while (RF_DATA_BYTE_VOCAB + tok->n_merges < vocab_size) {
    memset(keys, 0xff, cap * sizeof *keys);
    for (size_t t = 0; t < w.n; t++) {
      const int32_t *s = w.syms + w.start[t];
      for (uint32_t i = 0; i + 1 < w.len[t]; i++) {
        uint64_t key = rf_bpe_pair_key(s[i], s[i + 1]);
        size_t slot = rf_bpe_slot(keys, cap, key);
        if (keys[slot] == RF_BPE_EMPTY) {
          keys[slot] = key;
          counts[slot] = 0;
        }
        counts[slot] += w.count[t];
      }
    }
    uint64_t best_key = RF_BPE_EMPTY;
    int64_t best = 0;
    for (size_t i = 0; i < cap; i++) /* a pair seen once is not worth an id */
      if (keys[i] != RF_BPE_EMPTY && counts[i] >= 2 &&
          (counts[i] > best || (counts[i] == best && keys[i] < best_key))) {
        best = counts[i];
        best_key = keys[i];
      }
    if (best_key == RF_BPE_EMPTY) break;
    int32_t a = (int32_t)(best_key >> 32), b = (int32_t)(best_key & 0xffffffffu);
    tok->merges[2 * tok->n_merges] = a;
    tok->merges[2 * tok->n_merges + 1] = b;
    rf_bpe_words_merge(&w, a, b, RF_DATA_BYTE_VOCAB + tok->n_merges);
    tok->n_merges++;
  }
  free(keys);
  free(counts);
  rf_bpe_words_free(&w);
  rf_bpe_build_tables(tok);
  return 0;
}
