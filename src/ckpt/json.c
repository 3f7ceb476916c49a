/* The JSON pieces shared by the rank index files and meta.json. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

void rf_ckpt_rank_path(char *out, size_t cap, const char *dir, int rank, const char *ext) {
  snprintf(out, cap, "%s/rank-%05d.%s", dir, rank, ext);
}

int rf_ckpt_json_i64(const cJSON *obj, const char *key, int64_t lo, int64_t hi, const char *file,
                     int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsNumber(v)) RF_FAIL("%s: field '%s' is missing or not a number", file, key);
  double d = v->valuedouble;
  if (!(d >= (double)lo && d <= (double)hi) || d != (double)(int64_t)d)
    RF_FAIL("%s: field '%s' = %.17g is not an integer in [%" PRId64 ", %" PRId64 "]", file, key, d, lo, hi);
  *out = (int64_t)d;
  return 0;
}

int rf_ckpt_json_tensor_head(const cJSON *obj, const char *file, struct rf_ckpt_tensor *t) {
  memset(t, 0, sizeof *t);
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(obj, "name");
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(obj, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(obj, "shape");
  if (!cJSON_IsString(name)) RF_FAIL("%s: a tensor has no name", file);
  if (!cJSON_IsString(dtype) || rf_dtype_parse(dtype->valuestring, &t->dtype) != 0)
    RF_FAIL("%s: tensor '%s' has a missing or unknown dtype", file, name->valuestring);
  int ndim = cJSON_GetArraySize(shape);
  if (!cJSON_IsArray(shape) || ndim > RF_MAX_DIMS)
    RF_FAIL("%s: tensor '%s' has a missing shape or more than %d dims", file, name->valuestring, RF_MAX_DIMS);
  t->ndim = ndim;
  t->numel = 1;
  for (int d = 0; d < ndim; d++) {
    const cJSON *v = cJSON_GetArrayItem(shape, d);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9e15 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
      RF_FAIL("%s: tensor '%s' has a bad dimension %d", file, name->valuestring, d);
    t->shape[d] = (int64_t)v->valuedouble;
    t->numel *= t->shape[d];
  }
  t->name = strdup(name->valuestring);
  if (!t->name) RF_DIE("out of memory");
  return 0;
}

void rf_ckpt_json_add_tensor_head(cJSON *obj, const char *name, enum rf_dtype dtype, int ndim,
                                  const int64_t *shape) {
  cJSON_AddStringToObject(obj, "name", name);
  cJSON_AddStringToObject(obj, "dtype", rf_dtype_name(dtype));
  cJSON *s = cJSON_AddArrayToObject(obj, "shape");
  for (int d = 0; d < ndim; d++) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)shape[d]));
}

int rf_ckpt_json_range(const cJSON *obj, const char *file, const struct rf_ckpt_tensor *t,
                       int64_t chunk_bytes, struct rf_ckpt_range *r) {
  int64_t offset = 0;
  RF_TRY(rf_ckpt_json_i64(obj, "begin", 0, t->numel, file, &r->begin));
  RF_TRY(rf_ckpt_json_i64(obj, "end", r->begin, t->numel, file, &r->end));
  RF_TRY(rf_ckpt_json_i64(obj, "offset", 0, INT64_C(1) << 53, file, &offset));
  r->offset = (uint64_t)offset;
  int64_t bytes = (r->end - r->begin) * (int64_t)rf_dtype_size(t->dtype);
  r->n_chunks = rf_ckpt_chunks(bytes, chunk_bytes);
  const cJSON *sums = cJSON_GetObjectItemCaseSensitive(obj, "xxh3");
  if (!cJSON_IsArray(sums) || cJSON_GetArraySize(sums) != r->n_chunks)
    RF_FAIL("%s: tensor '%s' range [%" PRId64 ", %" PRId64 "): expected %" PRId64 " checksums", file, t->name,
            r->begin, r->end, r->n_chunks);
  r->xxh3 = rf_xmalloc((size_t)(r->n_chunks ? r->n_chunks : 1) * sizeof *r->xxh3);
  int64_t c = 0;
  for (const cJSON *v = sums->child; v; v = v->next, c++) {
    const char *hex = cJSON_IsString(v) ? v->valuestring : "";
    char *endp = NULL;
    r->xxh3[c] = strtoull(hex, &endp, 16);
    if (strlen(hex) != 16 || endp != hex + 16) {
      free(r->xxh3);
      r->xxh3 = NULL;
      RF_FAIL("%s: tensor '%s': checksum %" PRId64 " is not 16 hex digits", file, t->name, c);
    }
  }
  return 0;
}

void rf_ckpt_json_add_range(cJSON *obj, const struct rf_ckpt_range *r) {
  cJSON_AddNumberToObject(obj, "begin", (double)r->begin);
  cJSON_AddNumberToObject(obj, "end", (double)r->end);
  cJSON_AddNumberToObject(obj, "offset", (double)r->offset);
  cJSON *sums = cJSON_AddArrayToObject(obj, "xxh3");
  for (int64_t c = 0; c < r->n_chunks; c++) {
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, r->xxh3[c]);
    cJSON_AddItemToArray(sums, cJSON_CreateString(hex));
  }
}

void rf_ckpt_tensor_free(struct rf_ckpt_tensor *t) {
  free(t->name);
  for (int i = 0; i < t->n_ranges; i++) free(t->ranges[i].xxh3);
  free(t->ranges);
  memset(t, 0, sizeof *t);
}

static int rf_ckpt_range_cmp(const void *a, const void *b) {
  const struct rf_ckpt_range *x = a, *y = b;
  return (x->begin > y->begin) - (x->begin < y->begin);
}

int rf_ckpt_tensor_check_ranges(struct rf_ckpt_tensor *t, const char *file) {
  if (t->n_ranges > 1) /* no ranges: NULL, which qsort must not be given */
    qsort(t->ranges, (size_t)t->n_ranges, sizeof *t->ranges, rf_ckpt_range_cmp);
  int64_t covered = 0;
  for (int i = 0; i < t->n_ranges; i++) {
    const struct rf_ckpt_range *r = &t->ranges[i];
    if (r->begin > covered)
      RF_FAIL("%s: tensor '%s': elements [%" PRId64 ", %" PRId64 ") are held by no rank", file, t->name,
              covered, r->begin);
    if (r->begin < covered)
      RF_FAIL("%s: tensor '%s': rank %d's range [%" PRId64 ", %" PRId64 ") overlaps another rank's", file,
              t->name, r->rank, r->begin, r->end);
    covered = r->end;
  }
  if (covered != t->numel)
    RF_FAIL("%s: tensor '%s': elements [%" PRId64 ", %" PRId64 ") are held by no rank", file, t->name,
            covered, t->numel);
  return 0;
}
