/* Opening a checkpoint and reading any flat range of any tensor from the rank
 * files that hold it, verifying the checksum of every chunk read. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt.h"

static uint64_t rf_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

static uint32_t rf_le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads and parses dir/name; *hash (if given): XXH3 of the file's bytes. */
static int rf_ckpt_read_json(const char *dir, const char *name, cJSON **out, uint64_t *hash) {
  char path[RF_FILE_PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  char *text;
  size_t n;
  RF_TRY(rf_file_read_all(path, &text, &n));
  if (hash) *hash = XXH3_64bits(text, n);
  *out = cJSON_Parse(text);
  free(text);
  if (!*out) RF_FAIL("%s: not valid JSON (corrupted?)", path);
  return 0;
}

/* The marker and the metadata's format, version and checksum. */
static int rf_ckpt_open_meta(struct rf_ckpt *ck, cJSON **meta) {
  char marker_path[RF_FILE_PATH_MAX + 16];
  snprintf(marker_path, sizeof marker_path, "%s/%s", ck->dir, RF_CKPT_MARKER);
  struct stat st;
  if (stat(ck->dir, &st) != 0 || !S_ISDIR(st.st_mode)) RF_FAIL("%s: no such checkpoint directory", ck->dir);
  if (access(marker_path, F_OK) != 0)
    RF_FAIL("%s: incomplete checkpoint: no %s marker (the save did not finish, or this is not a checkpoint)",
            ck->dir, RF_CKPT_MARKER);
  char meta_path[RF_FILE_PATH_MAX + 16];
  snprintf(meta_path, sizeof meta_path, "%s/%s", ck->dir, RF_CKPT_META);
  uint64_t meta_hash;
  RF_TRY(rf_ckpt_read_json(ck->dir, RF_CKPT_META, meta, &meta_hash));
  const cJSON *format = cJSON_GetObjectItemCaseSensitive(*meta, "format");
  if (!cJSON_IsString(format) || strcmp(format->valuestring, RF_CKPT_FORMAT) != 0)
    RF_FAIL("%s: not an rfsdp checkpoint (format is not \"%s\")", meta_path, RF_CKPT_FORMAT);
  int64_t version;
  RF_TRY(rf_ckpt_json_i64(*meta, "version", 1, INT32_MAX, meta_path, &version));
  if (version > RF_CKPT_VERSION)
    RF_FAIL("%s: format version %" PRId64 " is newer than this build reads (%d)", meta_path, version,
            RF_CKPT_VERSION);
  ck->version = (int)version;

  cJSON *marker;
  RF_TRY(rf_ckpt_read_json(ck->dir, RF_CKPT_MARKER, &marker, NULL));
  const cJSON *want = cJSON_GetObjectItemCaseSensitive(marker, "meta_xxh3");
  char hex[17];
  snprintf(hex, sizeof hex, "%016" PRIx64, meta_hash);
  int ok = cJSON_IsString(want) && strcmp(want->valuestring, hex) == 0;
  cJSON_Delete(marker);
  if (!ok)
    RF_FAIL("%s: checksum %s does not match the one in %s: the metadata is corrupted", meta_path, hex,
            RF_CKPT_MARKER);
  return 0;
}

static int rf_ckpt_open_tensors(struct rf_ckpt *ck, const cJSON *meta, const char *meta_path,
                                const uint64_t *file_bytes) {
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(meta, "tensors");
  if (!cJSON_IsArray(tensors)) RF_FAIL("%s: no 'tensors' array", meta_path);
  ck->tensors = rf_xcalloc((size_t)cJSON_GetArraySize(tensors) + 1, sizeof *ck->tensors);
  for (const cJSON *o = tensors->child; o; o = o->next) {
    struct rf_ckpt_tensor *t = &ck->tensors[ck->n_tensors];
    RF_TRY(rf_ckpt_json_tensor_head(o, meta_path, t));
    ck->n_tensors++;
    if (rf_ckpt_find(ck, t->name) != t) RF_FAIL("%s: tensor '%s' appears twice", meta_path, t->name);
    const cJSON *ranges = cJSON_GetObjectItemCaseSensitive(o, "ranges");
    if (!cJSON_IsArray(ranges)) RF_FAIL("%s: tensor '%s' has no 'ranges'", meta_path, t->name);
    t->ranges = rf_xcalloc((size_t)cJSON_GetArraySize(ranges) + 1, sizeof *t->ranges);
    for (const cJSON *ro = ranges->child; ro; ro = ro->next) {
      struct rf_ckpt_range *r = &t->ranges[t->n_ranges];
      int64_t rank;
      RF_TRY(rf_ckpt_json_i64(ro, "rank", 0, ck->world - 1, meta_path, &rank));
      r->rank = (int)rank;
      RF_TRY(rf_ckpt_json_range(ro, meta_path, t, ck->chunk_bytes, r));
      t->n_ranges++;
      uint64_t bytes = (uint64_t)(r->end - r->begin) * rf_dtype_size(t->dtype);
      if (r->offset < RF_CKPT_RANK_HEADER_BYTES || r->offset + bytes > file_bytes[r->rank])
        RF_FAIL("%s: tensor '%s': range of rank %d lies outside its data file", meta_path, t->name, r->rank);
    }
    RF_TRY(rf_ckpt_tensor_check_ranges(t, meta_path));
  }
  return 0;
}

/* Opens every rank file and checks its size and header. */
static int rf_ckpt_open_files(struct rf_ckpt *ck, const uint64_t *file_bytes) {
  for (int r = 0; r < ck->world; r++) {
    char path[RF_FILE_PATH_MAX];
    rf_ckpt_rank_path(path, sizeof path, ck->dir, r, "bin");
    ck->fds[r] = open(path, O_RDONLY | O_CLOEXEC);
    if (ck->fds[r] < 0)
      RF_FAIL("%s: missing rank file (%s): the checkpoint of %d ranks is damaged", path, strerror(errno),
              ck->world);
    struct stat st;
    if (fstat(ck->fds[r], &st) != 0) RF_FAIL("%s: cannot stat: %s", path, strerror(errno));
    if ((uint64_t)st.st_size < file_bytes[r])
      RF_FAIL("%s: truncated: %lld bytes, the metadata says %" PRIu64, path, (long long)st.st_size,
              file_bytes[r]);
    if ((uint64_t)st.st_size > file_bytes[r])
      RF_FAIL("%s: %lld bytes, the metadata says %" PRIu64 " (replaced or appended to?)", path,
              (long long)st.st_size, file_bytes[r]);
    uint8_t h[RF_CKPT_RANK_HEADER_BYTES];
    RF_TRY(rf_file_pread_all(ck->fds[r], h, sizeof h, 0, path));
    if (memcmp(h, RF_CKPT_RANK_MAGIC, 8) != 0) RF_FAIL("%s: not a checkpoint rank file (bad magic)", path);
    if (rf_le32(h + 8) != (uint32_t)ck->version || rf_le32(h + 12) != (uint32_t)r ||
        rf_le32(h + 16) != (uint32_t)ck->world || rf_le64(h + 24) != (uint64_t)ck->step ||
        rf_le64(h + 32) != file_bytes[r])
      RF_FAIL("%s: header (version, rank, world, step, size) does not match the metadata", path);
  }
  return 0;
}

static int rf_ckpt_open_inner(struct rf_ckpt *ck, const char *dir) {
  snprintf(ck->dir, sizeof ck->dir, "%s", dir);
  cJSON *meta = NULL;
  if (rf_ckpt_open_meta(ck, &meta) != 0) {
    cJSON_Delete(meta);
    return -1;
  }
  char meta_path[RF_FILE_PATH_MAX + 16];
  snprintf(meta_path, sizeof meta_path, "%s/%s", dir, RF_CKPT_META);
  int64_t world = 0, chunk;
  uint64_t *file_bytes = NULL;
  int rc = -1;
  if (rf_ckpt_json_i64(meta, "step", 0, INT64_C(1) << 53, meta_path, &ck->step) == 0 &&
      rf_ckpt_json_i64(meta, "world", 1, 1 << 20, meta_path, &world) == 0 &&
      rf_ckpt_json_i64(meta, "chunk_bytes", 64, INT64_C(1) << 30, meta_path, &chunk) == 0) {
    ck->world = (int)world;
    ck->chunk_bytes = chunk;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(meta, "files");
    file_bytes = rf_xcalloc((size_t)world, sizeof *file_bytes);
    rc = 0;
    if (!cJSON_IsArray(files) || cJSON_GetArraySize(files) != world)
      rc = rf_error_set(__FILE__, __LINE__, "%s: 'files' does not list %d rank files", meta_path, ck->world);
    int r = 0;
    for (const cJSON *f = files ? files->child : NULL; f && rc == 0; f = f->next, r++) {
      int64_t rank, bytes;
      rc = rf_ckpt_json_i64(f, "rank", r, r, meta_path, &rank);
      if (rc == 0)
        rc = rf_ckpt_json_i64(f, "bytes", RF_CKPT_RANK_HEADER_BYTES, INT64_C(1) << 53, meta_path, &bytes);
      if (rc == 0) file_bytes[r] = (uint64_t)bytes;
    }
  }
  if (rc == 0) {
    const cJSON *extra = cJSON_GetObjectItemCaseSensitive(meta, "extra");
    ck->extra_json = cJSON_IsObject(extra) ? cJSON_PrintUnformatted(extra) : NULL;
    if (!ck->extra_json) rc = rf_error_set(__FILE__, __LINE__, "%s: 'extra' is not an object", meta_path);
  }
  if (rc == 0) rc = rf_ckpt_open_tensors(ck, meta, meta_path, file_bytes);
  cJSON_Delete(meta);
  if (rc == 0) {
    ck->fds = rf_xmalloc((size_t)ck->world * sizeof *ck->fds);
    for (int r = 0; r < ck->world; r++) ck->fds[r] = -1;
    rc = rf_ckpt_open_files(ck, file_bytes);
  }
  free(file_bytes);
  if (rc == 0) ck->chunk_buf = rf_xmalloc((size_t)ck->chunk_bytes);
  return rc;
}

int rf_ckpt_open(struct rf_ckpt *ck, const char *dir) {
  memset(ck, 0, sizeof *ck);
  if (rf_ckpt_open_inner(ck, dir) != 0) {
    rf_ckpt_close(ck);
    return -1;
  }
  return 0;
}

void rf_ckpt_close(struct rf_ckpt *ck) {
  for (int i = 0; i < ck->n_tensors; i++) rf_ckpt_tensor_free(&ck->tensors[i]);
  free(ck->tensors);
  if (ck->fds)
    for (int r = 0; r < ck->world; r++)
      if (ck->fds[r] >= 0) close(ck->fds[r]);
  free(ck->fds);
  free(ck->extra_json);
  free(ck->chunk_buf);
  memset(ck, 0, sizeof *ck);
}

const struct rf_ckpt_tensor *rf_ckpt_find(const struct rf_ckpt *ck, const char *name) {
  for (int i = 0; i < ck->n_tensors; i++)
    if (strcmp(ck->tensors[i].name, name) == 0) return &ck->tensors[i];
  return NULL;
}

/* The length of chunk c of range r. */
static int64_t rf_ckpt_chunk_len(const struct rf_ckpt *ck, const struct rf_ckpt_tensor *t,
                                 const struct rf_ckpt_range *r, int64_t c) {
  int64_t range_bytes = (r->end - r->begin) * (int64_t)rf_dtype_size(t->dtype);
  return rf_min_i64(ck->chunk_bytes, range_bytes - c * ck->chunk_bytes);
}

/* Reads chunk c of range r into `buf` (its length: rf_ckpt_chunk_len) and verifies it. */
static int rf_ckpt_read_chunk(struct rf_ckpt *ck, const struct rf_ckpt_tensor *t,
                              const struct rf_ckpt_range *r, int64_t c, uint8_t *buf) {
  int64_t len = rf_ckpt_chunk_len(ck, t, r, c);
  char path[RF_FILE_PATH_MAX];
  rf_ckpt_rank_path(path, sizeof path, ck->dir, r->rank, "bin");
  uint64_t at = r->offset + (uint64_t)(c * ck->chunk_bytes);
  RF_TRY(rf_file_pread_all(ck->fds[r->rank], buf, (size_t)len, at, path));
  ck->bytes_read += (uint64_t)len;
  if (XXH3_64bits(buf, (size_t)len) != r->xxh3[c])
    RF_FAIL("%s: checksum mismatch in tensor '%s' (file bytes [%" PRIu64 ", %" PRIu64
            ")): the file is corrupted",
            path, t->name, at, at + (uint64_t)len);
  return 0;
}

static void rf_ckpt_format_shape(char *out, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Element i of a float tensor's data as a double (0 for the other dtypes). */
static double rf_ckpt_value(enum rf_dtype dtype, const uint8_t *data, int64_t i) {
  if (dtype == RF_DTYPE_F32) {
    float x;
    memcpy(&x, data + i * 4, 4);
    return x;
  }
  if (dtype == RF_DTYPE_F64) {
    double x;
    memcpy(&x, data + i * 8, 8);
    return x;
  }
  if (dtype == RF_DTYPE_BF16) {
    uint16_t b;
    memcpy(&b, data + i * 2, 2);
    return rf_f32_from_bf16(b);
  }
  return 0;
}

/* Refuses a NaN or infinity among elements [ob, oe) of tensor t, held by rank file
 * r->rank and read to `data`, naming the file, the tensor, the element (index and
 * coordinates) and the value: a diverging run's checkpoint (its checksums right)
 * would resume into skipped steps, or train on and be saved again where the data
 * never reaches the value. */
static int rf_ckpt_check_finite(const struct rf_ckpt *ck, const struct rf_ckpt_tensor *t,
                                const struct rf_ckpt_range *r, int64_t ob, int64_t oe, const uint8_t *data) {
  if (t->dtype != RF_DTYPE_F32 && t->dtype != RF_DTYPE_F64 && t->dtype != RF_DTYPE_BF16) return 0;
  for (int64_t i = 0; i < oe - ob; i++) {
    double x = rf_ckpt_value(t->dtype, data, i);
    if (isfinite(x)) continue;
    int64_t at = ob + i, rest = at, idx[RF_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
      idx[d] = t->shape[d] > 0 ? rest % t->shape[d] : 0;
      rest = t->shape[d] > 0 ? rest / t->shape[d] : 0;
    }
    char path[RF_FILE_PATH_MAX], where[160];
    rf_ckpt_rank_path(path, sizeof path, ck->dir, r->rank, "bin");
    rf_ckpt_format_shape(where, sizeof where, t->ndim, idx);
    RF_FAIL("%s: tensor '%s' element %" PRId64
            " %s is %s; a checkpoint's values must be finite (saved by a "
            "diverging run?)",
            path, t->name, at, where,
            isnan(x) ? "nan"
            : x > 0  ? "inf"
                     : "-inf");
  }
  return 0;
}

int rf_ckpt_read(struct rf_ckpt *ck, const char *name, enum rf_dtype dtype, int ndim, const int64_t *shape,
                 int64_t begin, int64_t end, void *out) {
  const struct rf_ckpt_tensor *t = rf_ckpt_find(ck, name);
  if (!t) RF_FAIL("%s: tensor '%s' is not in the checkpoint (a checkpoint of another model?)", ck->dir, name);
  if (t->dtype != dtype)
    RF_FAIL("%s: tensor '%s' is %s in the checkpoint, %s was asked for", ck->dir, name,
            rf_dtype_name(t->dtype), rf_dtype_name(dtype));
  if (t->ndim != ndim || memcmp(t->shape, shape, sizeof(int64_t) * (size_t)ndim) != 0) {
    char have[160], want[160];
    rf_ckpt_format_shape(have, sizeof have, t->ndim, t->shape);
    rf_ckpt_format_shape(want, sizeof want, ndim, shape);
    RF_FAIL(
        "%s: tensor '%s' has shape %s in the checkpoint, %s was asked for (a checkpoint of another model?)",
        ck->dir, name, have, want);
  }
  if (begin < 0 || begin > end || end > t->numel)
    RF_FAIL("%s: tensor '%s': range [%" PRId64 ", %" PRId64 ") is outside its %" PRId64 " elements", ck->dir,
            name, begin, end, t->numel);
  int64_t es = (int64_t)rf_dtype_size(dtype);
  uint8_t *dst = out;
  for (int k = 0; k < t->n_ranges; k++) {
    const struct rf_ckpt_range *r = &t->ranges[k];
    int64_t ob = rf_max_i64(begin, r->begin), oe = rf_min_i64(end, r->end);
    if (ob >= oe) continue;
    int64_t rel0 = (ob - r->begin) * es, rel1 = (oe - r->begin) * es; /* bytes within the range */
    for (int64_t c = rel0 / ck->chunk_bytes; c * ck->chunk_bytes < rel1; c++) {
      int64_t c0 = c * ck->chunk_bytes, len = rf_ckpt_chunk_len(ck, t, r, c);
      int64_t from = rf_max_i64(c0, rel0), to = rf_min_i64(c0 + len, rel1);
      uint8_t *at = dst + (ob - begin) * es + (from - rel0);
      if (from == c0 && to == c0 + len) { /* a whole chunk: straight into the output */
        RF_TRY(rf_ckpt_read_chunk(ck, t, r, c, at));
      } else {
        RF_TRY(rf_ckpt_read_chunk(ck, t, r, c, ck->chunk_buf));
        memcpy(at, ck->chunk_buf + (from - c0), (size_t)(to - from));
      }
    }
    if (ck->finite_only) RF_TRY(rf_ckpt_check_finite(ck, t, r, ob, oe, dst + (ob - begin) * es));
  }
  return 0;
}

int rf_ckpt_verify(struct rf_ckpt *ck) {
  for (int i = 0; i < ck->n_tensors; i++)
    for (int k = 0; k < ck->tensors[i].n_ranges; k++)
      for (int64_t c = 0; c < ck->tensors[i].ranges[k].n_chunks; c++)
        RF_TRY(rf_ckpt_read_chunk(ck, &ck->tensors[i], &ck->tensors[i].ranges[k], c, ck->chunk_buf));
  return 0;
}
