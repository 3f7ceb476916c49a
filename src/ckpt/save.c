/* Saving a checkpoint: each rank's data and index files, then rank 0's metadata
 * and completion marker. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "shard/shard.h"

static void rf_put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void rf_put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* mkdir -p */
static int rf_ckpt_make_dir(const char *dir) {
  char path[RF_FILE_PATH_MAX];
  if (strlen(dir) >= sizeof path) RF_FAIL("%s: path too long", dir);
  snprintf(path, sizeof path, "%s", dir);
  for (char *p = path + 1;; p++) {
    if (*p != '/' && *p != '\0') continue;
    char c = *p;
    *p = '\0';
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      RF_FAIL("%s: cannot create directory %s: %s", dir, path, strerror(errno));
    *p = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) RF_FAIL("%s: not a directory", dir);
  return 0;
}

static int rf_ckpt_refuse_complete(const char *dir) {
  char marker[RF_FILE_PATH_MAX + 16];
  snprintf(marker, sizeof marker, "%s/%s", dir, RF_CKPT_MARKER);
  if (access(marker, F_OK) == 0)
    RF_FAIL("%s: already holds a complete checkpoint; save into a new directory (or remove this one)", dir);
  return 0;
}

static int rf_ckpt_check_piece(const struct rf_ckpt_save_args *a, int i) {
  const struct rf_ckpt_piece *p = &a->pieces[i];
  if (!p->name || !p->name[0]) RF_FAIL("%s: piece %d has no name", a->dir, i);
  if (p->ndim < 0 || p->ndim > RF_MAX_DIMS) RF_FAIL("%s: tensor '%s': bad ndim %d", a->dir, p->name, p->ndim);
  int64_t numel = 1;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] < 0) RF_FAIL("%s: tensor '%s': negative dimension", a->dir, p->name);
    numel *= p->shape[d];
  }
  if (p->begin < 0 || p->begin > p->end || p->end > numel)
    RF_FAIL("%s: tensor '%s': range [%" PRId64 ", %" PRId64 ") is outside its %" PRId64 " elements", a->dir,
            p->name, p->begin, p->end, numel);
  if (p->end > p->begin && !p->data) RF_FAIL("%s: tensor '%s': no data", a->dir, p->name);
  for (int j = 0; j < i; j++)
    if (strcmp(a->pieces[j].name, p->name) == 0) RF_FAIL("%s: tensor '%s' is given twice", a->dir, p->name);
  return 0;
}

/* The rank file's bounce buffer when the caller gives none: one per process,
 * allocated at the first save and kept; a save in another thread while one holds
 * it allocates its own for that save. */
static pthread_mutex_t rf_ckpt_bounce_mu = PTHREAD_MUTEX_INITIALIZER;
static void *rf_ckpt_bounce;

/* The bounce `a` gives, or the process's (*owned 1: the caller unlocks), or one
 * for this save (*owned 2: the caller frees it). */
static void *rf_ckpt_bounce_take(const struct rf_ckpt_save_args *a, size_t *bytes, int *owned) {
  *owned = 0;
  if (a->bounce) {
    *bytes = a->bounce_bytes;
    return a->bounce;
  }
  *bytes = RF_CKPT_BOUNCE_BYTES;
  if (pthread_mutex_trylock(&rf_ckpt_bounce_mu) != 0) {
    *owned = 2;
    return rf_xaligned(RF_FILE_DIRECT_ALIGN, RF_CKPT_BOUNCE_BYTES);
  }
  if (!rf_ckpt_bounce) rf_ckpt_bounce = rf_xaligned(RF_FILE_DIRECT_ALIGN, RF_CKPT_BOUNCE_BYTES);
  *owned = 1;
  return rf_ckpt_bounce;
}

static void rf_ckpt_bounce_give(void *bounce, int owned) {
  if (owned == 1) pthread_mutex_unlock(&rf_ckpt_bounce_mu);
  if (owned == 2) free(bounce);
}

/* Writes rank-RRRRR.bin: the header (the file's size known from the layout), then
 * every piece on RF_CKPT_ALIGN, through the O_DIRECT writer. Fills ranges[i]
 * (xxh3 allocated) and *file_bytes. */
static int rf_ckpt_write_data(const struct rf_ckpt_save_args *a, int64_t chunk, struct rf_ckpt_range *ranges,
                              uint64_t *file_bytes) {
  uint64_t end = RF_CKPT_RANK_HEADER_BYTES;
  for (int i = 0; i < a->n_pieces; i++) {
    const struct rf_ckpt_piece *p = &a->pieces[i];
    struct rf_ckpt_range *r = &ranges[i];
    int64_t bytes = (p->end - p->begin) * (int64_t)rf_dtype_size(p->dtype);
    r->rank = a->rank;
    r->begin = p->begin;
    r->end = p->end;
    r->offset = (uint64_t)rf_round_up((int64_t)end, RF_CKPT_ALIGN);
    r->n_chunks = rf_ckpt_chunks(bytes, chunk);
    r->xxh3 = rf_xmalloc((size_t)(r->n_chunks ? r->n_chunks : 1) * sizeof *r->xxh3);
    end = r->offset + (uint64_t)bytes;
  }
  *file_bytes = end;
  uint8_t h[RF_CKPT_RANK_HEADER_BYTES] = {0};
  for (int k = 0; k < 8; k++) h[k] = (uint8_t)RF_CKPT_RANK_MAGIC[k];
  rf_put_le32(h + 8, RF_CKPT_VERSION);
  rf_put_le32(h + 12, (uint32_t)a->rank);
  rf_put_le32(h + 16, (uint32_t)a->world);
  rf_put_le64(h + 24, (uint64_t)a->step);
  rf_put_le64(h + 32, end);

  char path[RF_FILE_PATH_MAX];
  rf_ckpt_rank_path(path, sizeof path, a->dir, a->rank, "bin");
  size_t bounce_bytes;
  int owned;
  void *bounce = rf_ckpt_bounce_take(a, &bounce_bytes, &owned);
  struct rf_file_writer w;
  if (rf_file_writer_open_direct(&w, path, bounce, bounce_bytes) != 0) {
    rf_ckpt_bounce_give(bounce, owned);
    return -1;
  }
  _Static_assert(RF_CKPT_ALIGN <= RF_CKPT_RANK_HEADER_BYTES, "padding is written from the header's zeros");
  static const uint8_t zeros[RF_CKPT_RANK_HEADER_BYTES];
  /* device memory is never read by the host: staged, whole chunks at a time */
  int64_t staging_bytes = (int64_t)(a->staging_bytes ? a->staging_bytes : RF_CKPT_STAGING_BYTES);
  staging_bytes = rf_max_i64(chunk, staging_bytes / chunk * chunk);
  uint8_t *staging = a->device ? rf_xaligned(64, (size_t)staging_bytes) : NULL;
  int rc = rf_file_writer_write(&w, h, sizeof h);
  for (int i = 0; i < a->n_pieces && rc == 0; i++) {
    const struct rf_ckpt_piece *p = &a->pieces[i];
    struct rf_ckpt_range *r = &ranges[i];
    int64_t bytes = (p->end - p->begin) * (int64_t)rf_dtype_size(p->dtype);
    rc = rf_file_writer_write(&w, zeros, r->offset - w.bytes);
    if (a->device) { /* device memory: through the staging, a whole number of chunks at a time */
      for (int64_t at = 0; at < bytes && rc == 0; at += staging_bytes) {
        int64_t n = rf_min_i64(staging_bytes, bytes - at);
        rf_device_copy(a->device, staging, (const uint8_t *)p->data + at, (size_t)n,
                       RF_DEVICE_COPY_DEVICE_TO_HOST, a->stream);
        for (int64_t c = at / chunk; c * chunk < at + n; c++)
          r->xxh3[c] = XXH3_64bits(staging + (c * chunk - at), (size_t)rf_min_i64(chunk, bytes - c * chunk));
        rc = rf_file_writer_write(&w, staging, (size_t)n);
      }
      continue;
    }
    const uint8_t *data = p->data;
    for (int64_t c = 0; c < r->n_chunks; c++)
      r->xxh3[c] = XXH3_64bits(data + c * chunk, (size_t)rf_min_i64(chunk, bytes - c * chunk));
    if (rc == 0 && bytes > 0) rc = rf_file_writer_write(&w, data, (size_t)bytes);
  }
  free(staging);
  RF_ASSERT(rc != 0 || w.bytes == end);
  if (rc != 0)
    rf_file_writer_abort(&w);
  else
    rc = rf_file_writer_commit(&w);
  rf_ckpt_bounce_give(bounce, owned);
  return rc;
}

/* Prints `json` and writes it atomically to `path`; *hash: XXH3 of the bytes. */
static int rf_ckpt_write_json(const char *path, cJSON *json, uint64_t *hash) {
  char *text = cJSON_Print(json);
  if (!text) RF_FAIL("%s: out of memory printing the JSON", path);
  size_t n = strlen(text);
  if (hash) *hash = XXH3_64bits(text, n);
  int rc = rf_file_write_all(path, text, n);
  free(text);
  return rc;
}

static cJSON *rf_ckpt_json_header(int version, int64_t step, int world) {
  cJSON *j = cJSON_CreateObject();
  if (!j) RF_DIE("out of memory");
  cJSON_AddStringToObject(j, "format", RF_CKPT_FORMAT);
  cJSON_AddNumberToObject(j, "version", version);
  cJSON_AddNumberToObject(j, "step", (double)step);
  cJSON_AddNumberToObject(j, "world", world);
  return j;
}

int rf_ckpt_save_rank(const struct rf_ckpt_save_args *a) {
  if (a->world < 1 || a->rank < 0 || a->rank >= a->world)
    RF_FAIL("%s: rank %d is outside the world of %d ranks", a->dir, a->rank, a->world);
  if (a->step < 0) RF_FAIL("%s: negative step %" PRId64, a->dir, a->step);
  int64_t chunk = a->chunk_bytes ? a->chunk_bytes : RF_CKPT_DEFAULT_CHUNK_BYTES;
  if (chunk < 64 || chunk > (INT64_C(1) << 30))
    RF_FAIL("%s: chunk_bytes %" PRId64 " not in [64, 2^30]", a->dir, chunk);
  for (int i = 0; i < a->n_pieces; i++) RF_TRY(rf_ckpt_check_piece(a, i));
  RF_TRY(rf_ckpt_make_dir(a->dir));
  RF_TRY(rf_ckpt_refuse_complete(a->dir));
  /* an index left by an earlier attempt must not stand for this one if this rank
   * dies before writing its new index */
  char index_path[RF_FILE_PATH_MAX];
  rf_ckpt_rank_path(index_path, sizeof index_path, a->dir, a->rank, "json");
  if (unlink(index_path) != 0 && errno != ENOENT)
    RF_FAIL("%s: cannot remove the index of an earlier attempt: %s", index_path, strerror(errno));

  struct rf_ckpt_range *ranges = rf_xcalloc((size_t)(a->n_pieces ? a->n_pieces : 1), sizeof *ranges);
  uint64_t file_bytes = 0;
  int rc = rf_ckpt_write_data(a, chunk, ranges, &file_bytes);
  if (rc == 0) {
    cJSON *idx = rf_ckpt_json_header(RF_CKPT_VERSION, a->step, a->world);
    cJSON_AddNumberToObject(idx, "rank", a->rank);
    cJSON_AddNumberToObject(idx, "chunk_bytes", (double)chunk);
    cJSON_AddNumberToObject(idx, "bytes", (double)file_bytes);
    cJSON *pieces = cJSON_AddArrayToObject(idx, "pieces");
    for (int i = 0; i < a->n_pieces; i++) {
      cJSON *o = cJSON_CreateObject();
      const struct rf_ckpt_piece *p = &a->pieces[i];
      rf_ckpt_json_add_tensor_head(o, p->name, p->dtype, p->ndim, p->shape);
      rf_ckpt_json_add_range(o, &ranges[i]);
      cJSON_AddItemToArray(pieces, o);
    }
    rc = rf_ckpt_write_json(index_path, idx, NULL);
    cJSON_Delete(idx);
  }
  for (int i = 0; i < a->n_pieces; i++) free(ranges[i].xxh3);
  free(ranges);
  return rc;
}

/* The tensors of all ranks' index files, merged. Owns its tensors. */
struct rf_ckpt_merge {
  int n, cap;
  struct rf_ckpt_tensor *tensors;
  uint64_t *file_bytes; /* per rank */
  int64_t chunk_bytes;
};

static void rf_ckpt_merge_free(struct rf_ckpt_merge *m) {
  for (int i = 0; i < m->n; i++) rf_ckpt_tensor_free(&m->tensors[i]);
  free(m->tensors);
  free(m->file_bytes);
}

/* Adds one piece of rank `rank`'s index to the merge. */
static int rf_ckpt_merge_piece(struct rf_ckpt_merge *m, const cJSON *o, const char *path, int rank) {
  struct rf_ckpt_tensor head;
  RF_TRY(rf_ckpt_json_tensor_head(o, path, &head));
  struct rf_ckpt_tensor *t = NULL;
  for (int i = 0; i < m->n && !t; i++)
    if (strcmp(m->tensors[i].name, head.name) == 0) t = &m->tensors[i];
  if (t && (t->dtype != head.dtype || t->ndim != head.ndim ||
            memcmp(t->shape, head.shape, sizeof(int64_t) * (size_t)head.ndim) != 0)) {
    rf_ckpt_tensor_free(&head);
    RF_FAIL("%s: tensor '%s' has another dtype or shape than in a lower rank's index", path, t->name);
  }
  if (!t) {
    if (m->n == m->cap) {
      m->cap = m->cap ? 2 * m->cap : 64;
      struct rf_ckpt_tensor *grown = realloc(m->tensors, (size_t)m->cap * sizeof *grown);
      if (!grown) RF_DIE("out of memory");
      m->tensors = grown;
    }
    t = &m->tensors[m->n++];
    *t = head;
  } else {
    rf_ckpt_tensor_free(&head);
  }
  struct rf_ckpt_range r = {.rank = rank};
  RF_TRY(rf_ckpt_json_range(o, path, t, m->chunk_bytes, &r));
  if (r.end == r.begin) {
    free(r.xxh3);
    return 0;
  }
  if (r.offset + (uint64_t)((r.end - r.begin) * (int64_t)rf_dtype_size(t->dtype)) > m->file_bytes[rank]) {
    free(r.xxh3);
    RF_FAIL("%s: tensor '%s': range past the end of the data file", path, t->name);
  }
  struct rf_ckpt_range *grown = realloc(t->ranges, (size_t)(t->n_ranges + 1) * sizeof *grown);
  if (!grown) RF_DIE("out of memory");
  t->ranges = grown;
  t->ranges[t->n_ranges++] = r;
  return 0;
}

/* Reads rank `rank`'s index file into the merge. */
static int rf_ckpt_merge_rank(struct rf_ckpt_merge *m, const char *dir, int rank, int world, int64_t step) {
  char path[RF_FILE_PATH_MAX];
  rf_ckpt_rank_path(path, sizeof path, dir, rank, "json");
  if (access(path, F_OK) != 0)
    RF_FAIL("%s: missing: rank %d did not finish writing its part of the checkpoint", path, rank);
  char *text;
  size_t n;
  RF_TRY(rf_file_read_all(path, &text, &n));
  cJSON *idx = cJSON_Parse(text);
  free(text);
  if (!idx) RF_FAIL("%s: not valid JSON", path);
  int64_t version, r, w, s, chunk, bytes;
  int rc = -1;
  if (rf_ckpt_json_i64(idx, "version", 1, RF_CKPT_VERSION, path, &version) == 0 &&
      rf_ckpt_json_i64(idx, "rank", 0, INT32_MAX, path, &r) == 0 &&
      rf_ckpt_json_i64(idx, "world", 1, INT32_MAX, path, &w) == 0 &&
      rf_ckpt_json_i64(idx, "step", 0, INT64_C(1) << 53, path, &s) == 0 &&
      rf_ckpt_json_i64(idx, "chunk_bytes", 64, INT64_C(1) << 30, path, &chunk) == 0 &&
      rf_ckpt_json_i64(idx, "bytes", RF_CKPT_RANK_HEADER_BYTES, INT64_C(1) << 53, path, &bytes) == 0) {
    if (r != rank || w != world || s != step)
      rf_error_set(__FILE__, __LINE__,
                   "%s: holds rank %" PRId64 " of %" PRId64 " at step %" PRId64
                   ", expected rank %d of %d at step %" PRId64 " (a stale file from another save?)",
                   path, r, w, s, rank, world, step);
    else if (rank > 0 && chunk != m->chunk_bytes)
      rf_error_set(__FILE__, __LINE__, "%s: chunk_bytes %" PRId64 " differs from rank 0's", path, chunk);
    else
      rc = 0;
  }
  if (rc == 0) {
    m->chunk_bytes = chunk;
    m->file_bytes[rank] = (uint64_t)bytes;
    const cJSON *pieces = cJSON_GetObjectItemCaseSensitive(idx, "pieces");
    if (!cJSON_IsArray(pieces)) rc = rf_error_set(__FILE__, __LINE__, "%s: no 'pieces' array", path);
    for (const cJSON *o = pieces ? pieces->child : NULL; o && rc == 0; o = o->next)
      rc = rf_ckpt_merge_piece(m, o, path, rank);
  }
  cJSON_Delete(idx);
  return rc;
}

static cJSON *rf_ckpt_meta_json(const struct rf_ckpt_merge *m, int world, int64_t step, cJSON *extra) {
  cJSON *meta = rf_ckpt_json_header(RF_CKPT_VERSION, step, world);
  cJSON_AddNumberToObject(meta, "chunk_bytes", (double)m->chunk_bytes);
  cJSON_AddItemToObject(meta, "extra", extra);
  cJSON *files = cJSON_AddArrayToObject(meta, "files");
  for (int r = 0; r < world; r++) {
    char name[32];
    rf_ckpt_rank_path(name, sizeof name, ".", r, "bin");
    cJSON *f = cJSON_CreateObject();
    cJSON_AddNumberToObject(f, "rank", r);
    cJSON_AddStringToObject(f, "path", name + 2);
    cJSON_AddNumberToObject(f, "bytes", (double)m->file_bytes[r]);
    cJSON_AddItemToArray(files, f);
  }
  cJSON *tensors = cJSON_AddArrayToObject(meta, "tensors");
  for (int i = 0; i < m->n; i++) {
    const struct rf_ckpt_tensor *t = &m->tensors[i];
    cJSON *o = cJSON_CreateObject();
    rf_ckpt_json_add_tensor_head(o, t->name, t->dtype, t->ndim, t->shape);
    cJSON *ranges = cJSON_AddArrayToObject(o, "ranges");
    for (int k = 0; k < t->n_ranges; k++) {
      const struct rf_ckpt_range *r = &t->ranges[k];
      cJSON *ro = cJSON_CreateObject();
      cJSON_AddNumberToObject(ro, "rank", r->rank);
      rf_ckpt_json_add_range(ro, r);
      /* a scalar (ndim 0) is described as shape [1] */
      static const int64_t scalar_shape[1] = {1};
      int nd = t->ndim ? t->ndim : 1;
      struct rf_shard_box boxes[2 * RF_MAX_DIMS - 1];
      int nb = 0;
      /* ranges were validated when the ranks' indexes were read */
      RF_ASSERT(rf_shard_boxes(nd, t->ndim ? t->shape : scalar_shape, r->begin, r->end, boxes,
                               rf_shard_max_boxes(nd), &nb) == 0);
      cJSON *bo = cJSON_AddArrayToObject(ro, "boxes");
      for (int b = 0; b < nb; b++) {
        cJSON *box = cJSON_CreateObject(), *start = cJSON_AddArrayToObject(box, "start"),
              *size = cJSON_AddArrayToObject(box, "size");
        for (int d = 0; d < nd; d++) {
          cJSON_AddItemToArray(start, cJSON_CreateNumber((double)boxes[b].start[d]));
          cJSON_AddItemToArray(size, cJSON_CreateNumber((double)boxes[b].extent[d]));
        }
        cJSON_AddItemToArray(bo, box);
      }
      cJSON_AddItemToArray(ranges, ro);
    }
    cJSON_AddItemToArray(tensors, o);
  }
  return meta;
}

int rf_ckpt_save_finish(const char *dir, int world, int64_t step, const char *extra_json) {
  if (world < 1) RF_FAIL("%s: bad world %d", dir, world);
  RF_TRY(rf_ckpt_refuse_complete(dir));
  cJSON *extra = extra_json ? cJSON_Parse(extra_json) : cJSON_CreateObject();
  if (!cJSON_IsObject(extra)) {
    cJSON_Delete(extra);
    RF_FAIL("%s: the extra fields are not a JSON object: %.60s", dir, extra_json);
  }
  struct rf_ckpt_merge m = {0};
  m.file_bytes = rf_xcalloc((size_t)world, sizeof *m.file_bytes);
  int rc = 0;
  for (int r = 0; r < world && rc == 0; r++) rc = rf_ckpt_merge_rank(&m, dir, r, world, step);
  char meta_path[RF_FILE_PATH_MAX + 16];
  snprintf(meta_path, sizeof meta_path, "%s/%s", dir, RF_CKPT_META);
  for (int i = 0; i < m.n && rc == 0; i++) rc = rf_ckpt_tensor_check_ranges(&m.tensors[i], dir);
  if (rc != 0) {
    cJSON_Delete(extra);
    rf_ckpt_merge_free(&m);
    return -1;
  }
  cJSON *meta = rf_ckpt_meta_json(&m, world, step, extra); /* takes extra */
  uint64_t meta_hash = 0;
  rc = rf_ckpt_write_json(meta_path, meta, &meta_hash);
  cJSON_Delete(meta);
  rf_ckpt_merge_free(&m);
  RF_TRY(rc);

  cJSON *marker = rf_ckpt_json_header(RF_CKPT_VERSION, step, world);
  char hex[17];
  snprintf(hex, sizeof hex, "%016" PRIx64, meta_hash);
  cJSON_AddStringToObject(marker, "meta_xxh3", hex);
  char marker_path[RF_FILE_PATH_MAX + 16];
  snprintf(marker_path, sizeof marker_path, "%s/%s", dir, RF_CKPT_MARKER);
  rc = rf_ckpt_write_json(marker_path, marker, NULL);
  cJSON_Delete(marker);
  RF_TRY(rc);
  /* the directory's own entry, for a directory created by this save */
  char parent[RF_FILE_PATH_MAX];
  snprintf(parent, sizeof parent, "%s", dir);
  return rf_file_fsync_dir(dirname(parent));
}

int rf_ckpt_save(const struct rf_ckpt_save_args *a) {
  int status = rf_ckpt_save_rank(a);
  if (a->agree(a->agree_ctx, status) != 0) {
    if (status == 0)
      RF_FAIL_ELSEWHERE("%s: another rank failed to write its part; the checkpoint is incomplete", a->dir);
    return -1;
  }
  status = a->rank == 0 ? rf_ckpt_save_finish(a->dir, a->world, a->step, a->extra_json) : 0;
  if (a->agree(a->agree_ctx, status) != 0) {
    if (status == 0) RF_FAIL("%s: rank 0 could not complete the checkpoint", a->dir);
    return -1;
  }
  return 0;
}
