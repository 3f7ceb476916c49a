/* Reading safetensors files: the dtype table, f16 conversion, header validation,
 * and reads of any element range as raw bytes or f32. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors/safetensors.h"

static const struct {
  const char *name;
  size_t size;
} rf_safetensors_dtype_table[RF_SAFETENSORS_DTYPE_COUNT] = {
    [RF_SAFETENSORS_DTYPE_BOOL] = {"BOOL", 1},       [RF_SAFETENSORS_DTYPE_U8] = {"U8", 1},
    [RF_SAFETENSORS_DTYPE_I8] = {"I8", 1},           [RF_SAFETENSORS_DTYPE_I16] = {"I16", 2},
    [RF_SAFETENSORS_DTYPE_U16] = {"U16", 2},         [RF_SAFETENSORS_DTYPE_F16] = {"F16", 2},
    [RF_SAFETENSORS_DTYPE_BF16] = {"BF16", 2},       [RF_SAFETENSORS_DTYPE_I32] = {"I32", 4},
    [RF_SAFETENSORS_DTYPE_U32] = {"U32", 4},         [RF_SAFETENSORS_DTYPE_F32] = {"F32", 4},
    [RF_SAFETENSORS_DTYPE_I64] = {"I64", 8},         [RF_SAFETENSORS_DTYPE_U64] = {"U64", 8},
    [RF_SAFETENSORS_DTYPE_F64] = {"F64", 8},         [RF_SAFETENSORS_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [RF_SAFETENSORS_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
};

const char *rf_safetensors_dtype_name(enum rf_safetensors_dtype dtype) {
  return rf_safetensors_dtype_table[dtype].name;
}

size_t rf_safetensors_dtype_size(enum rf_safetensors_dtype dtype) {
  return rf_safetensors_dtype_table[dtype].size;
}

int rf_safetensors_dtype_parse(const char *name, enum rf_safetensors_dtype *out) {
  for (int i = 0; i < RF_SAFETENSORS_DTYPE_COUNT; i++)
    if (strcmp(name, rf_safetensors_dtype_table[i].name) == 0) {
      *out = (enum rf_safetensors_dtype)i;
      return 0;
    }
  RF_FAIL("unknown safetensors dtype '%s'", name);
}

enum rf_safetensors_dtype rf_safetensors_dtype_from_rf(enum rf_dtype dtype) {
  switch (dtype) {
    case RF_DTYPE_F32:
      return RF_SAFETENSORS_DTYPE_F32;
    case RF_DTYPE_BF16:
      return RF_SAFETENSORS_DTYPE_BF16;
    case RF_DTYPE_FP8E4M3:
      return RF_SAFETENSORS_DTYPE_F8_E4M3;
    case RF_DTYPE_U8:
      return RF_SAFETENSORS_DTYPE_U8;
    case RF_DTYPE_I32:
      return RF_SAFETENSORS_DTYPE_I32;
    case RF_DTYPE_I64:
      return RF_SAFETENSORS_DTYPE_I64;
    case RF_DTYPE_F64:
      return RF_SAFETENSORS_DTYPE_F64;
  }
  RF_DIE("bad rf_dtype %d", (int)dtype);
}

float rf_f32_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
  if (e == 0) {
    float v = (float)m * 0x1p-24f; /* zero or subnormal: exact */
    memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  } else if (e == 31) {
    bits = sign | 0x7f800000u | m << 13;
  } else {
    bits = sign | (e + 112) << 23 | m << 13;
  }
  float x;
  memcpy(&x, &bits, sizeof x);
  return x;
}

uint16_t rf_f16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
  uint32_t f = u & 0x7fffffffu;
  if (f > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((f >> 13) & 0x3ff)); /* NaN stays NaN */
  if (f >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);                      /* >= 65520: inf */
  if (f < 0x38800000u) {                                                       /* below 2^-14 */
    if (f <= 0x33000000u) return sign;                                         /* <= 2^-25: zero */
    uint32_t e = f >> 23, m = (f & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t h = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = (f >> 13) - (112u << 10), rem = f & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static uint64_t rf_safetensors_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* A non-negative integer JSON number below 2^53. */
static int rf_safetensors_json_u53(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d < 9007199254740992.0) || d != (double)(uint64_t)d) return -1;
  *out = (uint64_t)d;
  return 0;
}

static int rf_safetensors_parse_tensor(const struct rf_safetensors_file *f, const cJSON *o,
                                       struct rf_safetensors_tensor *t) {
  const char *name = o->string;
  if (!cJSON_IsObject(o)) RF_FAIL("%s: tensor '%s' is not a JSON object", f->path, name);
  const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(o, "dtype");
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(o, "shape");
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(o, "data_offsets");
  if (!cJSON_IsString(dtype)) RF_FAIL("%s: tensor '%s' has no dtype", f->path, name);
  if (rf_safetensors_dtype_parse(dtype->valuestring, &t->dtype) != 0)
    RF_FAIL("%s: tensor '%s' has an unknown dtype '%s'", f->path, name, dtype->valuestring);
  if (!cJSON_IsArray(shape)) RF_FAIL("%s: tensor '%s' has no shape", f->path, name);
  t->ndim = cJSON_GetArraySize(shape);
  if (t->ndim > RF_MAX_DIMS)
    RF_FAIL("%s: tensor '%s' has %d dims, at most %d are supported", f->path, name, t->ndim, RF_MAX_DIMS);
  uint64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    uint64_t n;
    if (rf_safetensors_json_u53(cJSON_GetArrayItem(shape, d), &n) != 0)
      RF_FAIL("%s: tensor '%s': dimension %d is not a non-negative integer", f->path, name, d);
    if (n != 0 && numel > (UINT64_C(1) << 53) / n) RF_FAIL("%s: tensor '%s': shape too large", f->path, name);
    t->shape[d] = (int64_t)n;
    numel *= n;
  }
  t->numel = (int64_t)numel;
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
      rf_safetensors_json_u53(cJSON_GetArrayItem(offs, 0), &t->begin) != 0 ||
      rf_safetensors_json_u53(cJSON_GetArrayItem(offs, 1), &t->end) != 0)
    RF_FAIL("%s: tensor '%s': data_offsets is not a pair of non-negative integers", f->path, name);
  if (t->end < t->begin)
    RF_FAIL("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin", f->path, name,
            t->begin, t->end);
  uint64_t need = numel * rf_safetensors_dtype_size(t->dtype);
  if (t->end - t->begin != need)
    RF_FAIL("%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
            " bytes, its dtype %s and shape need %" PRIu64 " (wrong size)",
            f->path, name, t->begin, t->end, t->end - t->begin, rf_safetensors_dtype_name(t->dtype), need);
  t->name = strdup(name);
  if (!t->name) RF_DIE("out of memory");
  return 0;
}

static int rf_safetensors_cmp_offsets(const void *a, const void *b) {
  const struct rf_safetensors_tensor *x = a, *y = b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* The header's tensors: parsed, sorted by offset, tiling the data exactly. */
static int rf_safetensors_parse_header(struct rf_safetensors_file *f, const cJSON *head) {
  if (!head || !cJSON_IsObject(head)) RF_FAIL("%s: the header is not a JSON object", f->path);
  f->tensors = rf_xcalloc((size_t)cJSON_GetArraySize(head) + 1, sizeof *f->tensors);
  for (const cJSON *o = head->child; o; o = o->next) {
    if (strcmp(o->string, "__metadata__") == 0) {
      if (f->metadata_json) RF_FAIL("%s: __metadata__ appears twice", f->path);
      if (!cJSON_IsObject(o)) RF_FAIL("%s: __metadata__ is not an object", f->path);
      for (const cJSON *m = o->child; m; m = m->next)
        if (!cJSON_IsString(m)) RF_FAIL("%s: __metadata__ value '%s' is not a string", f->path, m->string);
      f->metadata_json = cJSON_PrintUnformatted(o);
      if (!f->metadata_json) RF_DIE("out of memory");
      continue;
    }
    RF_TRY(rf_safetensors_parse_tensor(f, o, &f->tensors[f->n_tensors]));
    f->n_tensors++;
  }
  qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, rf_safetensors_cmp_offsets);
  for (int i = 0; i < f->n_tensors; i++)
    for (int j = 0; j < i; j++)
      if (strcmp(f->tensors[i].name, f->tensors[j].name) == 0)
        RF_FAIL("%s: tensor '%s' appears twice in the header", f->path, f->tensors[i].name);
  uint64_t at = 0;
  for (int i = 0; i < f->n_tensors; i++) {
    const struct rf_safetensors_tensor *t = &f->tensors[i];
    if (t->begin < at)
      RF_FAIL("%s: tensor '%s' (bytes [%" PRIu64 ", %" PRIu64 ")) overlaps tensor '%s' (ending at %" PRIu64
              "): offsets overlap",
              f->path, t->name, t->begin, t->end, f->tensors[i - 1].name, at);
    if (t->begin > at)
      RF_FAIL("%s: a gap of %" PRIu64 " bytes before tensor '%s' (at %" PRIu64
              "): offsets are not contiguous",
              f->path, t->begin - at, t->name, t->begin);
    at = t->end;
  }
  uint64_t data_bytes = f->file_bytes - f->data_start;
  if (at < data_bytes)
    RF_FAIL("%s: %" PRIu64 " data bytes, the tensors cover %" PRIu64 " (trailing bytes: wrong size)", f->path,
            data_bytes, at);
  if (at > data_bytes)
    RF_FAIL("%s: truncated: %" PRIu64 " data bytes, the tensors need %" PRIu64, f->path, data_bytes, at);
  return 0;
}

static int rf_safetensors_open_inner(struct rf_safetensors_file *f, const char *path) {
  if (strlen(path) >= sizeof f->path) RF_FAIL("%s: path too long", path);
  snprintf(f->path, sizeof f->path, "%s", path);
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) RF_FAIL("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  if (fstat(f->fd, &st) != 0) RF_FAIL("%s: cannot stat: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode)) RF_FAIL("%s: not a regular file", path);
  f->file_bytes = (uint64_t)st.st_size;
  if (f->file_bytes < 8)
    RF_FAIL("%s: truncated: %" PRIu64 " bytes, too short for the 8-byte header length of a safetensors file",
            path, f->file_bytes);
  uint8_t len8[8];
  RF_TRY(rf_file_pread_all(f->fd, len8, 8, 0, path));
  uint64_t n = rf_safetensors_le64(len8);
  if (n > RF_SAFETENSORS_MAX_HEADER_BYTES)
    RF_FAIL("%s: header length %" PRIu64 " is larger than %u bytes (not a safetensors file?)", path, n,
            RF_SAFETENSORS_MAX_HEADER_BYTES);
  if (n > f->file_bytes - 8)
    RF_FAIL("%s: truncated: the header length says %" PRIu64 " bytes, the file has %" PRIu64 " after it",
            path, n, f->file_bytes - 8);
  if (n < 2) RF_FAIL("%s: header of %" PRIu64 " bytes is too short for a JSON object", path, n);
  f->data_start = 8 + n;
  char *text = rf_xmalloc((size_t)n + 1);
  if (rf_file_pread_all(f->fd, text, (size_t)n, 8, path) != 0) {
    free(text);
    return -1;
  }
  text[n] = '\0';
  const char *end = NULL;
  cJSON *head = text[0] == '{' ? cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0) : NULL;
  int rc = 0;
  if (!head) {
    rc = rf_error_set(__FILE__, __LINE__, "%s: the header is not valid JSON (it must be one object)", path);
  } else {
    for (const char *p = end; p < text + n && rc == 0; p++)
      if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        rc = rf_error_set(__FILE__, __LINE__, "%s: bytes after the header's JSON object", path);
  }
  if (rc == 0) rc = rf_safetensors_parse_header(f, head);
  cJSON_Delete(head);
  free(text);
  return rc;
}

int rf_safetensors_open(struct rf_safetensors_file *f, const char *path) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  if (rf_safetensors_open_inner(f, path) != 0) {
    rf_safetensors_close(f);
    return -1;
  }
  return 0;
}

void rf_safetensors_close(struct rf_safetensors_file *f) {
  if (f->fd >= 0) close(f->fd);
  for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
  free(f->tensors);
  free(f->metadata_json);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

const struct rf_safetensors_tensor *rf_safetensors_find(const struct rf_safetensors_file *f,
                                                        const char *name) {
  for (int i = 0; i < f->n_tensors; i++)
    if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
  return NULL;
}

/* Tensor `name` when [begin, end) lies inside it; NULL (message recorded) otherwise. */
static const struct rf_safetensors_tensor *rf_safetensors_range(const struct rf_safetensors_file *f,
                                                                const char *name, int64_t begin,
                                                                int64_t end) {
  const struct rf_safetensors_tensor *t = rf_safetensors_find(f, name);
  if (!t) {
    rf_error_set(__FILE__, __LINE__, "%s: no tensor '%s'", f->path, name);
    return NULL;
  }
  if (begin < 0 || begin > end || end > t->numel) {
    rf_error_set(__FILE__, __LINE__,
                 "%s: tensor '%s': range [%" PRId64 ", %" PRId64 ") is outside its %" PRId64 " elements",
                 f->path, name, begin, end, t->numel);
    return NULL;
  }
  return t;
}

int rf_safetensors_read_raw(struct rf_safetensors_file *f, const char *name, int64_t begin, int64_t end,
                            void *out) {
  const struct rf_safetensors_tensor *t = rf_safetensors_range(f, name, begin, end);
  if (!t) return -1;
  size_t es = rf_safetensors_dtype_size(t->dtype);
  return rf_file_pread_all(f->fd, out, (size_t)(end - begin) * es,
                           f->data_start + t->begin + (uint64_t)begin * es, f->path);
}

int rf_safetensors_read_f32(struct rf_safetensors_file *f, const char *name, int64_t begin, int64_t end,
                            float *out) {
  const struct rf_safetensors_tensor *t = rf_safetensors_range(f, name, begin, end);
  if (!t) return -1;
  if (t->dtype == RF_SAFETENSORS_DTYPE_F32) return rf_safetensors_read_raw(f, name, begin, end, out);
  if (t->dtype != RF_SAFETENSORS_DTYPE_BF16 && t->dtype != RF_SAFETENSORS_DTYPE_F16)
    RF_FAIL("%s: tensor '%s' is %s; only F32, BF16 and F16 convert to f32", f->path, name,
            rf_safetensors_dtype_name(t->dtype));
  enum { PIECE = 32768 };
  uint16_t buf[PIECE];
  for (int64_t at = begin; at < end; at += PIECE) {
    int64_t n = rf_min_i64(PIECE, end - at);
    RF_TRY(
        rf_file_pread_all(f->fd, buf, (size_t)n * 2, f->data_start + t->begin + (uint64_t)at * 2, f->path));
    float *o = out + (at - begin);
    if (t->dtype == RF_SAFETENSORS_DTYPE_BF16)
      rf_f32_from_bf16_n(o, buf, (size_t)n);
    else
      for (int64_t i = 0; i < n; i++) o[i] = rf_f32_from_f16(buf[i]);
  }
  return 0;
}
