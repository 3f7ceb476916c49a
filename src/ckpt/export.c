/* A checkpoint's parameters to a safetensors file (streamed), and a safetensors
 * file into the runtime's views. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "safetensors/safetensors.h"

enum {
  RF_CKPT_EXPORT_PIECE = 1 << 18
}; /* elements per read and write (1 MiB of f32: larger writes are slower here) */

static void rf_ckpt_shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

static int rf_ckpt_export_stream(struct rf_ckpt *ck, struct rf_safetensors_writer *w, const int *params,
                                 int n) {
  float *buf = rf_xmalloc((size_t)RF_CKPT_EXPORT_PIECE * sizeof(float));
  int rc = 0;
  for (int k = 0; k < n && rc == 0; k++) {
    const struct rf_ckpt_tensor *t = &ck->tensors[params[k]];
    for (int64_t at = 0; at < t->numel && rc == 0; at += RF_CKPT_EXPORT_PIECE) {
      int64_t m = rf_min_i64(RF_CKPT_EXPORT_PIECE, t->numel - at);
      if (t->dtype == RF_DTYPE_F32) {
        rc = rf_ckpt_read(ck, t->name, t->dtype, t->ndim, t->shape, at, at + m, buf);
      } else { /* bf16: read into the upper half, widen in place from the front */
        uint16_t *h = (uint16_t *)(void *)buf + m;
        rc = rf_ckpt_read(ck, t->name, t->dtype, t->ndim, t->shape, at, at + m, h);
        for (int64_t i = 0; i < m && rc == 0; i++) buf[i] = rf_f32_from_bf16(h[i]);
      }
      if (rc == 0) rc = rf_safetensors_writer_write_f32(w, buf, m);
    }
  }
  free(buf);
  return rc;
}

int rf_ckpt_export_safetensors(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype) {
  if (dtype != RF_DTYPE_F32 && dtype != RF_DTYPE_BF16)
    RF_FAIL("%s: export dtype must be f32 or bf16, not %s", out_path, rf_dtype_name(dtype));
  struct rf_ckpt ck;
  RF_TRY(rf_ckpt_open(&ck, ckpt_dir));
  int *params = rf_xcalloc((size_t)ck.n_tensors + 1, sizeof *params);
  struct rf_safetensors_decl *decls = rf_xcalloc((size_t)ck.n_tensors + 1, sizeof *decls);
  int n = 0, rc = 0;
  for (int i = 0; i < ck.n_tensors && rc == 0; i++) {
    const struct rf_ckpt_tensor *t = &ck.tensors[i];
    if (!rf_ckpt_is_param(&ck, t)) continue;
    if (t->dtype != RF_DTYPE_F32 && t->dtype != RF_DTYPE_BF16)
      rc = rf_error_set(__FILE__, __LINE__, "%s: tensor '%s' is %s; only f32 and bf16 parameters export",
                        ckpt_dir, t->name, rf_dtype_name(t->dtype));
    params[n] = i;
    decls[n] = (struct rf_safetensors_decl){
        .name = t->name, .dtype = rf_safetensors_dtype_from_rf(dtype), .ndim = t->ndim};
    memcpy(decls[n].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    n++;
  }
  if (rc == 0 && n == 0)
    rc = rf_error_set(__FILE__, __LINE__, "%s: the checkpoint holds no parameters", ckpt_dir);
  char meta[96];
  snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"rfsdp_step\":\"%" PRId64 "\"}", ck.step);
  struct rf_safetensors_writer w;
  if (rc == 0) rc = rf_safetensors_writer_open(&w, out_path, n, decls, meta);
  if (rc == 0) {
    rc = rf_ckpt_export_stream(&ck, &w, params, n);
    if (rc == 0)
      rc = rf_safetensors_writer_commit(&w);
    else
      rf_safetensors_writer_abort(&w);
  }
  free(decls);
  free(params);
  rf_ckpt_close(&ck);
  return rc;
}

/* The files of an import: one safetensors file, or the shards named by a Hugging
 * Face index (NAME.safetensors.index.json: {"weight_map": {tensor: file}}, files
 * relative to the index's directory). Owns the files and the map. */
struct rf_ckpt_import_src {
  int n_files;
  struct rf_safetensors_file *files;
  cJSON *index; /* NULL for a single file */
  char index_path[RF_FILE_PATH_MAX];
};

static void rf_ckpt_import_close(struct rf_ckpt_import_src *src) {
  for (int i = 0; i < src->n_files; i++) rf_safetensors_close(&src->files[i]);
  free(src->files);
  cJSON_Delete(src->index);
  memset(src, 0, sizeof *src);
}

static int rf_ckpt_import_open_index(const char *path, struct rf_ckpt_import_src *src) {
  char *text;
  size_t bytes;
  RF_TRY(rf_file_read_all(path, &text, &bytes));
  src->index = cJSON_Parse(text);
  free(text);
  const cJSON *map = cJSON_GetObjectItemCaseSensitive(src->index, "weight_map");
  if (!cJSON_IsObject(map)) RF_FAIL("%s: not a safetensors index (no \"weight_map\" object)", path);
  int n = cJSON_GetArraySize(map);
  src->files = rf_xcalloc((size_t)n + 1, sizeof *src->files);
  char dir[RF_FILE_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    slash[1] = '\0';
  else
    dir[0] = '\0';
  for (const cJSON *e = map->child; e; e = e->next) {
    if (!cJSON_IsString(e)) RF_FAIL("%s: weight_map['%s'] is not a file name", path, e->string);
    char file[RF_FILE_PATH_MAX * 2];
    snprintf(file, sizeof file, "%s%s", e->valuestring[0] == '/' ? "" : dir, e->valuestring);
    int seen = 0;
    for (int i = 0; i < src->n_files && !seen; i++) seen = strcmp(src->files[i].path, file) == 0;
    if (seen) continue;
    if (rf_safetensors_open(&src->files[src->n_files], file) != 0) {
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", rf_error_msg());
      RF_FAIL("%s (a shard named by %s)", msg, path);
    }
    src->n_files++;
  }
  return 0;
}

static int rf_ckpt_import_open(const char *path, struct rf_ckpt_import_src *src) {
  memset(src, 0, sizeof *src);
  snprintf(src->index_path, sizeof src->index_path, "%s", path);
  size_t len = strlen(path);
  int rc;
  if (len > 5 && strcmp(path + len - 5, ".json") == 0) {
    rc = rf_ckpt_import_open_index(path, src);
  } else {
    src->files = rf_xcalloc(1, sizeof *src->files);
    rc = rf_safetensors_open(&src->files[0], path);
    if (rc == 0) src->n_files = 1;
  }
  if (rc != 0) rf_ckpt_import_close(src);
  return rc;
}

/* The file holding tensor `name` (the one the index names), or NULL with a message. */
static struct rf_safetensors_file *rf_ckpt_import_find(struct rf_ckpt_import_src *src, const char *name) {
  const char *want = NULL;
  if (src->index) {
    const cJSON *e =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(src->index, "weight_map"), name);
    if (!cJSON_IsString(e)) {
      rf_error_set(__FILE__, __LINE__, "%s: no tensor '%s' in the weight map (a file of another model?)",
                   src->index_path, name);
      return NULL;
    }
    want = strrchr(e->valuestring, '/') ? strrchr(e->valuestring, '/') + 1 : e->valuestring;
  }
  for (int i = 0; i < src->n_files; i++) {
    const char *base =
        strrchr(src->files[i].path, '/') ? strrchr(src->files[i].path, '/') + 1 : src->files[i].path;
    if (want && strcmp(base, want) != 0) continue;
    if (rf_safetensors_find(&src->files[i], name)) return &src->files[i];
    rf_error_set(__FILE__, __LINE__, "%s: no tensor '%s'%s", src->files[i].path, name,
                 src->index ? " although the index names this file" : " (a file of another model?)");
    return NULL;
  }
  rf_error_set(__FILE__, __LINE__, "%s: no file holds tensor '%s'", src->index_path, name);
  return NULL;
}

int rf_ckpt_import_views(const char *path, const struct rf_tensor_view *views, int n) {
  struct rf_ckpt_import_src src;
  RF_TRY(rf_ckpt_import_open(path, &src));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const struct rf_tensor_view *v = &views[i];
    struct rf_safetensors_file *f = rf_ckpt_import_find(&src, v->name);
    if (!f) {
      rc = -1;
      break;
    }
    const struct rf_safetensors_tensor *t = rf_safetensors_find(f, v->name);
    if (v->end > v->begin && !v->master) {
      rc =
          rf_error_set(__FILE__, __LINE__, "%s: view '%s' has no master weights to load into", path, v->name);
      break;
    }
    int same = t->ndim == v->ndim;
    for (int d = 0; same && d < v->ndim; d++) same = t->shape[d] == v->shape[d];
    if (!same) {
      char have[200], want[200];
      rf_ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
      rf_ckpt_shape_str(want, sizeof want, v->ndim, v->shape);
      rc = rf_error_set(__FILE__, __LINE__,
                        "%s: tensor '%s' has shape %s, the model has %s (a file of another model?)", f->path,
                        v->name, have, want);
    } else if (t->dtype != RF_SAFETENSORS_DTYPE_F32 && t->dtype != RF_SAFETENSORS_DTYPE_BF16 &&
               t->dtype != RF_SAFETENSORS_DTYPE_F16) {
      rc = rf_error_set(__FILE__, __LINE__, "%s: tensor '%s' is %s; parameters load from F32, BF16 or F16",
                        f->path, v->name, rf_safetensors_dtype_name(t->dtype));
    }
  }
  for (int i = 0; i < n && rc == 0; i++) {
    struct rf_safetensors_file *f = rf_ckpt_import_find(&src, views[i].name);
    rc = f ? rf_safetensors_read_f32(f, views[i].name, views[i].begin, views[i].end, views[i].master) : -1;
  }
  rf_ckpt_import_close(&src);
  return rc;
}
