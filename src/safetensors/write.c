/* Writing safetensors files as a stream: header first, then each tensor's bytes
 * in declaration order, atomically renamed into place at commit. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors/safetensors.h"

enum { RF_SAFETENSORS_CONV_ELEMS = 1 << 16 };

static void rf_safetensors_writer_release(struct rf_safetensors_writer *w) {
  for (int i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
  free(w->tensors);
  free(w->conv);
  w->tensors = NULL;
  w->conv = NULL;
  w->n_tensors = 0;
}

/* The header text (padded with spaces to a multiple of 8 bytes, as the reference
 * implementation does) for the declared tensors; fills w->tensors. */
static int rf_safetensors_writer_header(struct rf_safetensors_writer *w, const char *path, int n,
                                        const struct rf_safetensors_decl *decls, const char *metadata_json,
                                        char **text_out, size_t *len_out) {
  cJSON *head = cJSON_CreateObject();
  if (!head) RF_DIE("out of memory");
  if (metadata_json) {
    cJSON *meta = cJSON_Parse(metadata_json);
    int ok = cJSON_IsObject(meta);
    for (const cJSON *m = ok ? meta->child : NULL; m; m = m->next) ok = ok && cJSON_IsString(m);
    if (!ok) {
      cJSON_Delete(meta);
      cJSON_Delete(head);
      RF_FAIL("%s: the metadata must be a JSON object of strings: %.60s", path, metadata_json);
    }
    cJSON_AddItemToObject(head, "__metadata__", meta);
  }
  uint64_t at = 0;
  for (int i = 0; i < n; i++) {
    const struct rf_safetensors_decl *d = &decls[i];
    struct rf_safetensors_tensor *t = &w->tensors[i];
    int bad = !d->name || !d->name[0] || strcmp(d->name, "__metadata__") == 0 || d->ndim < 0 ||
              d->ndim > RF_MAX_DIMS || d->dtype < 0 || d->dtype >= RF_SAFETENSORS_DTYPE_COUNT;
    for (int j = 0; j < i && !bad; j++) bad = strcmp(decls[j].name, d->name) == 0;
    t->numel = 1;
    for (int k = 0; k < d->ndim && !bad; k++) {
      bad = d->shape[k] < 0;
      t->numel *= d->shape[k];
    }
    if (bad) {
      cJSON_Delete(head);
      RF_FAIL("%s: tensor %d ('%s'): empty, reserved or repeated name, bad dtype or bad shape", path, i,
              d->name ? d->name : "(null)");
    }
    t->name = strdup(d->name);
    if (!t->name) RF_DIE("out of memory");
    t->dtype = d->dtype;
    t->ndim = d->ndim;
    memcpy(t->shape, d->shape, sizeof t->shape);
    t->begin = at;
    t->end = at + (uint64_t)t->numel * rf_safetensors_dtype_size(t->dtype);
    at = t->end;
    w->n_tensors = i + 1;
    cJSON *o = cJSON_CreateObject(), *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
    if (!o || !shape || !offs) RF_DIE("out of memory");
    cJSON_AddStringToObject(o, "dtype", rf_safetensors_dtype_name(t->dtype));
    for (int k = 0; k < t->ndim; k++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[k]));
    cJSON_AddItemToObject(o, "shape", shape);
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->begin));
    cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->end));
    cJSON_AddItemToObject(o, "data_offsets", offs);
    cJSON_AddItemToObject(head, t->name, o);
  }
  char *json = cJSON_PrintUnformatted(head);
  cJSON_Delete(head);
  if (!json) RF_FAIL("%s: out of memory printing the header", path);
  size_t len = strlen(json), padded = (size_t)rf_round_up((int64_t)len, 8);
  char *text = rf_xmalloc(padded + 1);
  memcpy(text, json, len + 1);
  memset(text + len, ' ', padded - len);
  free(json);
  *text_out = text;
  *len_out = padded;
  return 0;
}

int rf_safetensors_writer_open(struct rf_safetensors_writer *w, const char *path, int n,
                               const struct rf_safetensors_decl *decls, const char *metadata_json) {
  memset(w, 0, sizeof *w);
  w->file.fd = -1;
  if (n < 0) RF_FAIL("%s: negative tensor count", path);
  w->tensors = rf_xcalloc((size_t)n + 1, sizeof *w->tensors);
  char *text = NULL;
  size_t len = 0;
  if (rf_safetensors_writer_header(w, path, n, decls, metadata_json, &text, &len) != 0) {
    rf_safetensors_writer_release(w);
    return -1;
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)len >> (8 * i));
  int rc = rf_file_writer_open(&w->file, path);
  if (rc == 0) rc = rf_file_writer_write(&w->file, len8, 8);
  if (rc == 0) rc = rf_file_writer_write(&w->file, text, len);
  free(text);
  if (rc != 0) {
    rf_file_writer_abort(&w->file);
    rf_safetensors_writer_release(w);
    return -1;
  }
  w->data_start = 8 + len;
  /* zero-byte tensors at the front are complete already */
  while (w->cur < w->n_tensors && w->tensors[w->cur].end == w->tensors[w->cur].begin) w->cur++;
  return 0;
}

int rf_safetensors_writer_write(struct rf_safetensors_writer *w, const void *buf, size_t bytes) {
  const uint8_t *p = buf;
  while (bytes > 0) {
    if (w->cur >= w->n_tensors)
      RF_FAIL("%s: %zu bytes more than the declared tensors hold", w->file.path, bytes);
    const struct rf_safetensors_tensor *t = &w->tensors[w->cur];
    uint64_t room = t->end - t->begin - w->cur_bytes;
    size_t take = bytes < room ? bytes : (size_t)room;
    RF_TRY(rf_file_writer_write(&w->file, p, take));
    p += take;
    bytes -= take;
    w->cur_bytes += take;
    if (w->cur_bytes == t->end - t->begin) {
      w->cur_bytes = 0;
      w->cur++;
      while (w->cur < w->n_tensors && w->tensors[w->cur].end == w->tensors[w->cur].begin) w->cur++;
    }
  }
  return 0;
}

int rf_safetensors_writer_write_f32(struct rf_safetensors_writer *w, const float *x, int64_t n) {
  if (n == 0) return 0;
  if (w->cur >= w->n_tensors) RF_FAIL("%s: %" PRId64 " elements more than declared", w->file.path, n);
  const struct rf_safetensors_tensor *t = &w->tensors[w->cur];
  size_t es = rf_safetensors_dtype_size(t->dtype);
  if (w->cur_bytes + (uint64_t)n * es > t->end - t->begin)
    RF_FAIL("%s: tensor '%s': %" PRId64 " elements cross its end", w->file.path, t->name, n);
  if (t->dtype == RF_SAFETENSORS_DTYPE_F32) return rf_safetensors_writer_write(w, x, (size_t)n * 4);
  if (t->dtype != RF_SAFETENSORS_DTYPE_BF16 && t->dtype != RF_SAFETENSORS_DTYPE_F16)
    RF_FAIL("%s: tensor '%s' is %s; f32 converts only to F32, BF16 and F16", w->file.path, t->name,
            rf_safetensors_dtype_name(t->dtype));
  if (!w->conv) w->conv = rf_xmalloc(RF_SAFETENSORS_CONV_ELEMS * 2);
  uint16_t *h = (uint16_t *)w->conv;
  enum rf_safetensors_dtype dtype = t->dtype; /* t moves on when the tensor completes */
  for (int64_t at = 0; at < n; at += RF_SAFETENSORS_CONV_ELEMS) {
    int64_t k = rf_min_i64(RF_SAFETENSORS_CONV_ELEMS, n - at);
    if (dtype == RF_SAFETENSORS_DTYPE_BF16)
      rf_bf16_from_f32_n(h, x + at, (size_t)k);
    else
      for (int64_t i = 0; i < k; i++) h[i] = rf_f16_from_f32(x[at + i]);
    RF_TRY(rf_safetensors_writer_write(w, h, (size_t)k * 2));
  }
  return 0;
}

int rf_safetensors_writer_commit(struct rf_safetensors_writer *w) {
  if (w->cur < w->n_tensors) {
    const struct rf_safetensors_tensor *t = &w->tensors[w->cur];
    rf_error_set(__FILE__, __LINE__,
                 "%s: incomplete: tensor '%s' has %" PRIu64 " of its %" PRIu64
                 " bytes (and %d tensors follow)",
                 w->file.path, t->name, w->cur_bytes, t->end - t->begin, w->n_tensors - w->cur - 1);
    rf_safetensors_writer_abort(w);
    return -1;
  }
  int rc = rf_file_writer_commit(&w->file);
  rf_safetensors_writer_release(w);
  return rc;
}

void rf_safetensors_writer_abort(struct rf_safetensors_writer *w) {
  rf_file_writer_abort(&w->file);
  rf_safetensors_writer_release(w);
}
