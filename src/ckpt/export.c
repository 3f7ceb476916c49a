/* A checkpoint's parameters to a safetensors file (streamed; optionally the linear
 * weights in FP8, DeepSeek-V3's format), and a safetensors file into the runtime's views. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
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

/* Elements [at, at + m) of parameter t as f32 (bf16 widened) into buf (m floats). */
static int rf_ckpt_export_read(struct rf_ckpt *ck, const struct rf_ckpt_tensor *t, int64_t at, int64_t m,
                               float *buf) {
  if (t->dtype == RF_DTYPE_F32)
    return rf_ckpt_read(ck, t->name, t->dtype, t->ndim, t->shape, at, at + m, buf);
  /* bf16: read into the upper half, widen in place from the front */
  uint16_t *h = (uint16_t *)(void *)buf + m;
  RF_TRY(rf_ckpt_read(ck, t->name, t->dtype, t->ndim, t->shape, at, at + m, h));
  for (int64_t i = 0; i < m; i++) buf[i] = rf_f32_from_bf16(h[i]);
  return 0;
}

/* A parameter in the export's dtype, in pieces. */
static int rf_ckpt_export_plain(struct rf_ckpt *ck, struct rf_safetensors_writer *w,
                                const struct rf_ckpt_tensor *t, float *buf) {
  for (int64_t at = 0; at < t->numel; at += RF_CKPT_EXPORT_PIECE) {
    int64_t m = rf_min_i64(RF_CKPT_EXPORT_PIECE, t->numel - at);
    RF_TRY(rf_ckpt_export_read(ck, t, at, m, buf));
    RF_TRY(rf_safetensors_writer_write_f32(w, buf, m));
  }
  return 0;
}

/* The matrices of an FP8 tensor: [rows, cols] or E fused [E, rows, cols]. */
static struct rf_fp8_grid rf_ckpt_export_fp8_grid(const struct rf_ckpt_tensor *t, int64_t *matrices) {
  *matrices = t->ndim == 3 ? t->shape[0] : 1;
  return (struct rf_fp8_grid){.rows = t->shape[t->ndim - 2],
                              .cols = t->shape[t->ndim - 1],
                              .tile_rows = RF_FP8_TILE,
                              .tile_cols = RF_FP8_TILE};
}

/* An FP8 tensor: each matrix read whole and quantized, its codes written; then
 * every matrix's scales (the next declared tensor, NAME_scale_inv). */
static int rf_ckpt_export_quantized(struct rf_ckpt *ck, struct rf_safetensors_writer *w,
                                    const struct rf_ckpt_tensor *t, int pow2) {
  int64_t e_count;
  struct rf_fp8_grid g = rf_ckpt_export_fp8_grid(t, &e_count);
  int64_t elems = g.rows * g.cols, tiles = rf_fp8_grid_tiles(&g);
  float *x = rf_xmalloc((size_t)elems * sizeof(float) + 1);
  uint8_t *codes = rf_xmalloc((size_t)elems + 1);
  float *scales = rf_xmalloc((size_t)(e_count * tiles) * sizeof(float) + 1);
  int rc = 0;
  for (int64_t e = 0; e < e_count && rc == 0; e++) {
    char name[RF_FILE_PATH_MAX];
    if (t->ndim == 3)
      snprintf(name, sizeof name, "%s[%" PRId64 "]", t->name, e);
    else
      snprintf(name, sizeof name, "%s", t->name);
    rc = rf_ckpt_export_read(ck, t, e * elems, elems, x);
    if (rc == 0) rc = rf_fp8_quantize(&g, x, pow2, name, codes, scales + e * tiles);
    if (rc == 0) rc = rf_safetensors_writer_write(w, codes, (size_t)elems);
  }
  if (rc == 0) rc = rf_safetensors_writer_write_f32(w, scales, e_count * tiles);
  free(scales);
  free(codes);
  free(x);
  return rc;
}

/* The index in fp8->names of parameter `name`, or -1. */
static int rf_ckpt_export_fp8_index(const struct rf_ckpt_export_fp8 *fp8, const char *name) {
  for (int i = 0; fp8 && i < fp8->n; i++)
    if (strcmp(fp8->names[i], name) == 0) return i;
  return -1;
}

/* The declarations of the export: every parameter, an FP8 one followed by its scales
 * (scale_names[k] owns that name). Fills params (checkpoint indices) and quant. */
static int rf_ckpt_export_declare(const struct rf_ckpt *ck, const char *ckpt_dir, enum rf_dtype dtype,
                                  const struct rf_ckpt_export_fp8 *fp8, int *params, int *quant,
                                  struct rf_safetensors_decl *decls, char **scale_names, int *n_params,
                                  int *n_decls) {
  int n = 0, nd = 0;
  int *seen = rf_xcalloc((size_t)(fp8 ? fp8->n : 0) + 1, sizeof *seen);
  int rc = 0;
  for (int i = 0; i < ck->n_tensors && rc == 0; i++) {
    const struct rf_ckpt_tensor *t = &ck->tensors[i];
    if (!rf_ckpt_is_param(ck, t)) continue;
    if (t->dtype != RF_DTYPE_F32 && t->dtype != RF_DTYPE_BF16) {
      rc = rf_error_set(__FILE__, __LINE__, "%s: tensor '%s' is %s; only f32 and bf16 parameters export",
                        ckpt_dir, t->name, rf_dtype_name(t->dtype));
      break;
    }
    int q = rf_ckpt_export_fp8_index(fp8, t->name);
    if (q >= 0 && t->ndim != 2 && t->ndim != 3) {
      rc = rf_error_set(
          __FILE__, __LINE__,
          "%s: tensor '%s' has %d dimensions; FP8 tiles need a matrix or fused matrices (2 or 3)", ckpt_dir,
          t->name, t->ndim);
      break;
    }
    if (q >= 0) seen[q] = 1;
    params[n] = i;
    quant[n] = q >= 0;
    decls[nd] = (struct rf_safetensors_decl){
        .name = t->name,
        .dtype = q >= 0 ? RF_SAFETENSORS_DTYPE_F8_E4M3 : rf_safetensors_dtype_from_rf(dtype),
        .ndim = t->ndim};
    memcpy(decls[nd].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    nd++;
    if (q >= 0) {
      int64_t e_count;
      struct rf_fp8_grid g = rf_ckpt_export_fp8_grid(t, &e_count);
      size_t len = strlen(t->name) + sizeof "_scale_inv";
      scale_names[n] = rf_xmalloc(len);
      snprintf(scale_names[n], len, "%s_scale_inv", t->name);
      decls[nd] = (struct rf_safetensors_decl){
          .name = scale_names[n], .dtype = RF_SAFETENSORS_DTYPE_F32, .ndim = t->ndim};
      if (t->ndim == 3) decls[nd].shape[0] = e_count;
      decls[nd].shape[t->ndim - 2] = rf_fp8_grid_tile_rows(&g);
      decls[nd].shape[t->ndim - 1] = rf_fp8_grid_tile_cols(&g);
      nd++;
    }
    n++;
  }
  for (int q = 0; fp8 && q < fp8->n && rc == 0; q++)
    if (!seen[q])
      rc = rf_error_set(__FILE__, __LINE__,
                        "%s: no parameter '%s' to export in FP8 (a checkpoint of another model?)", ckpt_dir,
                        fp8->names[q]);
  if (rc == 0 && n == 0)
    rc = rf_error_set(__FILE__, __LINE__, "%s: the checkpoint holds no parameters", ckpt_dir);
  free(seen);
  *n_params = n;
  *n_decls = nd;
  return rc;
}

static int rf_ckpt_export(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype,
                          const struct rf_ckpt_export_fp8 *fp8) {
  if (dtype != RF_DTYPE_F32 && dtype != RF_DTYPE_BF16)
    RF_FAIL("%s: export dtype must be f32 or bf16, not %s", out_path, rf_dtype_name(dtype));
  struct rf_ckpt ck;
  RF_TRY(rf_ckpt_open(&ck, ckpt_dir));
  ck.finite_only = 1;
  size_t cap = (size_t)ck.n_tensors + 1;
  int *params = rf_xcalloc(cap, sizeof *params), *quant = rf_xcalloc(cap, sizeof *quant);
  char **scale_names = rf_xcalloc(cap, sizeof *scale_names);
  struct rf_safetensors_decl *decls = rf_xcalloc(2 * cap, sizeof *decls);
  int n = 0, n_decls = 0;
  int rc = rf_ckpt_export_declare(&ck, ckpt_dir, dtype, fp8, params, quant, decls, scale_names, &n, &n_decls);
  char meta[256];
  snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"rfsdp_step\":\"%" PRId64 "\"%s%s}", ck.step,
           fp8 ? ",\"rfsdp_fp8\":\"e4m3 128x128 blocks, value = weight * weight_scale_inv, scales " : "",
           !fp8        ? ""
           : fp8->pow2 ? "powers of two\""
                       : "amax/448\"");
  struct rf_safetensors_writer w;
  if (rc == 0) rc = rf_safetensors_writer_open(&w, out_path, n_decls, decls, meta);
  if (rc == 0) {
    float *buf = rf_xmalloc((size_t)RF_CKPT_EXPORT_PIECE * sizeof(float));
    for (int k = 0; k < n && rc == 0; k++) {
      const struct rf_ckpt_tensor *t = &ck.tensors[params[k]];
      rc = quant[k] && fp8 ? rf_ckpt_export_quantized(&ck, &w, t, fp8->pow2)
                           : rf_ckpt_export_plain(&ck, &w, t, buf);
    }
    free(buf);
    if (rc == 0)
      rc = rf_safetensors_writer_commit(&w);
    else
      rf_safetensors_writer_abort(&w);
  }
  for (size_t k = 0; k < cap; k++) free(scale_names[k]);
  free(scale_names);
  free(decls);
  free(quant);
  free(params);
  rf_ckpt_close(&ck);
  return rc;
}

int rf_ckpt_export_safetensors(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype) {
  return rf_ckpt_export(ckpt_dir, out_path, dtype, NULL);
}

int rf_ckpt_export_safetensors_fp8(const char *ckpt_dir, const char *out_path, enum rf_dtype dtype,
                                   const struct rf_ckpt_export_fp8 *fp8) {
  return rf_ckpt_export(ckpt_dir, out_path, dtype, fp8);
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

/* 1 when the import holds tensor `name` (the index's map, or the one file); quiet. */
static int rf_ckpt_import_has(const struct rf_ckpt_import_src *src, const char *name) {
  if (src->index)
    return cJSON_IsString(
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(src->index, "weight_map"), name));
  return src->n_files == 1 && rf_safetensors_find(&src->files[0], name) != NULL;
}

/* The per-expert layouts published checkpoints ship for the fused experts of the
 * model (tools name them "P.mlp.experts.gate_up_proj" [E, 2f, h], "P.mlp.experts.down_proj"
 * [E, h, f], the router "P.mlp.gate.weight"): the hub's Mixtral files
 * (block_sparse_moe.experts.N.w1/w3/w2, the router block_sparse_moe.gate) and qwen3_moe's
 * (mlp.experts.N.gate_proj/up_proj/down_proj). They load as transformers converts them
 * (conversion_mapping.py: the experts' w1 and w3 each stacked, then concatenated along
 * the rows, w2 stacked): gate_up_proj[e] = [w1[e]; w3[e]], down_proj[e] = w2[e]. */
struct rf_ckpt_hub_layout {
  const char *name, *router, *gate, *up, *down; /* after "P." */
};
static const struct rf_ckpt_hub_layout rf_ckpt_hub_layouts[] = {
    {"mixtral (block_sparse_moe.experts.N.w1/w2/w3)", "block_sparse_moe.gate.weight",
     "block_sparse_moe.experts.%d.w1.weight", "block_sparse_moe.experts.%d.w3.weight",
     "block_sparse_moe.experts.%d.w2.weight"},
    {"per-expert (mlp.experts.N.gate_proj/up_proj/down_proj)", "mlp.gate.weight",
     "mlp.experts.%d.gate_proj.weight", "mlp.experts.%d.up_proj.weight", "mlp.experts.%d.down_proj.weight"},
};
enum {
  RF_CKPT_HUB_N = (int)(sizeof rf_ckpt_hub_layouts / sizeof rf_ckpt_hub_layouts[0]),
  RF_CKPT_HUB_NAME_MAX = 512
};

enum rf_ckpt_hub_part {
  RF_CKPT_HUB_PART_NONE,
  RF_CKPT_HUB_PART_ROUTER,
  RF_CKPT_HUB_PART_GATE_UP,
  RF_CKPT_HUB_PART_DOWN
};

/* How view v loads: from its own name (part NONE), or from layout `layout` of the
 * hub; prefix: the name before ".mlp.". */
struct rf_ckpt_import_map {
  enum rf_ckpt_hub_part part;
  int layout;
  char prefix[RF_CKPT_HUB_NAME_MAX];
};

static enum rf_ckpt_hub_part rf_ckpt_hub_part_of(const struct rf_tensor_view *v, char *prefix, size_t cap) {
  static const struct {
    const char *suffix;
    enum rf_ckpt_hub_part part;
    int ndim;
  } parts[] = {{".mlp.gate.weight", RF_CKPT_HUB_PART_ROUTER, 2},
               {".mlp.experts.gate_up_proj", RF_CKPT_HUB_PART_GATE_UP, 3},
               {".mlp.experts.down_proj", RF_CKPT_HUB_PART_DOWN, 3}};
  size_t len = strlen(v->name);
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    size_t sl = strlen(parts[i].suffix);
    if (len <= sl || strcmp(v->name + len - sl, parts[i].suffix) != 0 || v->ndim != parts[i].ndim) continue;
    if (len - sl >= cap) return RF_CKPT_HUB_PART_NONE;
    memcpy(prefix, v->name, len - sl);
    prefix[len - sl] = '\0';
    return parts[i].part;
  }
  return RF_CKPT_HUB_PART_NONE;
}

/* Where element `at` of a view mapped by m comes from: the source tensor's name, its
 * element `*src_at`, its expected shape (2-D) and how many elements follow there
 * contiguously (the return value). */
static int64_t rf_ckpt_hub_source(const struct rf_tensor_view *v, const struct rf_ckpt_import_map *m,
                                  int64_t at, char *name, size_t cap, int64_t *src_at, int64_t *shape) {
  const struct rf_ckpt_hub_layout *lay = &rf_ckpt_hub_layouts[m->layout];
  char part[RF_CKPT_HUB_NAME_MAX];
  int64_t run;
  if (m->part == RF_CKPT_HUB_PART_ROUTER) {
    snprintf(part, sizeof part, "%s", lay->router);
    *src_at = at;
    shape[0] = v->shape[0], shape[1] = v->shape[1];
    run = v->numel - at;
  } else if (m->part == RF_CKPT_HUB_PART_GATE_UP) {
    int64_t f = v->shape[1] / 2, h = v->shape[2], per = 2 * f * h, w = at % per;
    int e = (int)(at / per), half = (int)(w / (f * h));
    snprintf(part, sizeof part, half ? lay->up : lay->gate, e);
    *src_at = w % (f * h);
    shape[0] = f, shape[1] = h;
    run = f * h - *src_at;
  } else {
    int64_t per = v->shape[1] * v->shape[2];
    snprintf(part, sizeof part, lay->down, (int)(at / per));
    *src_at = at % per;
    shape[0] = v->shape[1], shape[1] = v->shape[2];
    run = per - *src_at;
  }
  snprintf(name, cap, "%s.%s", m->prefix, part);
  return run;
}

/* Chooses how view v loads: its own name when the import has it, else the first hub
 * layout whose first source tensor the import has (a gate_up_proj of an odd row count
 * is no fused gate and up). */
static void rf_ckpt_import_map_view(const struct rf_ckpt_import_src *src, const struct rf_tensor_view *v,
                                    struct rf_ckpt_import_map *m) {
  memset(m, 0, sizeof *m);
  m->part = RF_CKPT_HUB_PART_NONE;
  if (rf_ckpt_import_has(src, v->name)) return;
  enum rf_ckpt_hub_part part = rf_ckpt_hub_part_of(v, m->prefix, sizeof m->prefix);
  if (part == RF_CKPT_HUB_PART_NONE || (part == RF_CKPT_HUB_PART_GATE_UP && v->shape[1] % 2 != 0)) return;
  for (int l = 0; l < RF_CKPT_HUB_N; l++) {
    struct rf_ckpt_import_map try = *m;
    try.part = part;
    try.layout = l;
    char name[RF_CKPT_HUB_NAME_MAX * 2];
    int64_t src_at, shape[2];
    rf_ckpt_hub_source(v, &try, 0, name, sizeof name, &src_at, shape);
    if (rf_ckpt_import_has(src, name)) {
      *m = try;
      return;
    }
  }
}

/* Checks that tensor `name` is there with `ndim` x `shape` in a dtype parameters load from. */
static int rf_ckpt_import_check_tensor(struct rf_ckpt_import_src *src, const char *name, int ndim,
                                       const int64_t *shape, const char *hub) {
  struct rf_safetensors_file *f = rf_ckpt_import_find(src, name);
  if (!f) return -1;
  const struct rf_safetensors_tensor *t = rf_safetensors_find(f, name);
  int same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char have[200], want[200];
    rf_ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
    rf_ckpt_shape_str(want, sizeof want, ndim, shape);
    RF_FAIL("%s: tensor '%s' has shape %s, the model has %s (%s)", f->path, name, have, want,
            hub ? hub : "a file of another model?");
  }
  if (t->dtype != RF_SAFETENSORS_DTYPE_F32 && t->dtype != RF_SAFETENSORS_DTYPE_BF16 &&
      t->dtype != RF_SAFETENSORS_DTYPE_F16)
    RF_FAIL("%s: tensor '%s' is %s; parameters load from F32, BF16 or F16", f->path, name,
            rf_safetensors_dtype_name(t->dtype));
  return 0;
}

/* Refuses a non-finite value among the elements read into view v (its range
 * [begin, end)), naming the tensor, the element (its index and coordinates) and the
 * value: a NaN or inf weight would only show up steps later as a skipped step or
 * "training diverged", or never where the data does not reach it. */
static int rf_ckpt_import_check_finite(const char *path, const struct rf_tensor_view *v,
                                       const struct rf_ckpt_import_map *m) {
  if (!v->master) return 0; /* an empty range */
  for (int64_t i = 0; i < v->end - v->begin; i++) {
    if (isfinite(v->master[i])) continue;
    /* named as the file names it: a hub layout's per-expert tensor, not the fused view */
    char name[RF_CKPT_HUB_NAME_MAX * 2];
    int64_t at = v->begin + i, idx[RF_MAX_DIMS], shape[RF_MAX_DIMS];
    int ndim = v->ndim;
    snprintf(name, sizeof name, "%s", v->name);
    memcpy(shape, v->shape, sizeof shape);
    if (m->part != RF_CKPT_HUB_PART_NONE) {
      int64_t src_at;
      rf_ckpt_hub_source(v, m, at, name, sizeof name, &src_at, shape);
      at = src_at;
      ndim = 2;
    }
    int64_t rest = at;
    for (int d = ndim - 1; d >= 0; d--) {
      idx[d] = shape[d] > 0 ? rest % shape[d] : 0;
      rest = shape[d] > 0 ? rest / shape[d] : 0;
    }
    char where[200];
    rf_ckpt_shape_str(where, sizeof where, ndim, idx);
    RF_FAIL("%s: tensor '%s' element %" PRId64 " %s is %s; the weights must be finite", path, name, at, where,
            isnan(v->master[i]) ? "nan"
            : v->master[i] > 0  ? "inf"
                                : "-inf");
  }
  return 0;
}

/* Reads view v's range through map m (the hub's per-expert tensors, piece by piece). */
static int rf_ckpt_import_read(struct rf_ckpt_import_src *src, const struct rf_tensor_view *v,
                               const struct rf_ckpt_import_map *m) {
  if (m->part == RF_CKPT_HUB_PART_NONE) {
    struct rf_safetensors_file *f = rf_ckpt_import_find(src, v->name);
    return f ? rf_safetensors_read_f32(f, v->name, v->begin, v->end, v->master) : -1;
  }
  for (int64_t at = v->begin; at < v->end;) {
    char name[RF_CKPT_HUB_NAME_MAX * 2];
    int64_t src_at, shape[2];
    int64_t run = rf_ckpt_hub_source(v, m, at, name, sizeof name, &src_at, shape);
    if (run > v->end - at) run = v->end - at;
    struct rf_safetensors_file *f = rf_ckpt_import_find(src, name);
    if (!f) return -1;
    RF_TRY(rf_safetensors_read_f32(f, name, src_at, src_at + run, v->master + (at - v->begin)));
    at += run;
  }
  return 0;
}

/* Refuses tensor `name` of a layer at or past `layers` ("model.layers.N."). */
static int rf_ckpt_import_layer_ok(const char *path, const char *name, int layers) {
  int l = 0;
  if (sscanf(name, "model.layers.%d.", &l) == 1 && l >= layers)
    RF_FAIL(
        "%s: tensor '%s' is of layer %d, the model has %d layers (a file of a deeper model? "
        "num_hidden_layers of the config)",
        path, name, l, layers);
  return 0;
}

/* Refuses a file with layers beyond the model's (the views' last "model.layers.N."):
 * a deeper model's weights would load their first layers silently. Other extra
 * tensors are refused by rf_ckpt_import_check_unused. */
static int rf_ckpt_import_check_layers(const struct rf_ckpt_import_src *src, const char *path,
                                       const struct rf_tensor_view *views, int n) {
  int layers = 0, l = 0;
  for (int i = 0; i < n; i++)
    if (sscanf(views[i].name, "model.layers.%d.", &l) == 1 && l + 1 > layers) layers = l + 1;
  if (layers == 0) return 0;
  if (src->index) {
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(src->index, "weight_map");
    for (const cJSON *e = map->child; e; e = e->next)
      RF_TRY(rf_ckpt_import_layer_ok(path, e->string, layers));
  } else {
    for (int i = 0; i < src->files[0].n_tensors; i++)
      RF_TRY(rf_ckpt_import_layer_ok(path, src->files[0].tensors[i].name, layers));
  }
  return 0;
}

/* The tensor names an import may hold without the model having them: an old
 * rotary buffer, a head tied to the embedding. */
static int rf_ckpt_import_ignorable(const char *name, const struct rf_tensor_view *views, int n) {
  size_t len = strlen(name), sl = strlen(".rotary_emb.inv_freq");
  if (len > sl && strcmp(name + len - sl, ".rotary_emb.inv_freq") == 0) return 1;
  if (strcmp(name, "lm_head.weight") != 0) return 0;
  for (int i = 0; i < n; i++)
    if (strcmp(views[i].name, "lm_head.weight") == 0) return 0;
  return 1; /* tied */
}

static int rf_ckpt_import_cmp_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Refuses `name` of the import when no view loads from it: an expert beyond the
 * config's count (a hub file's "experts.8." with 8 experts) or a tensor of another
 * model would be dropped silently. `used` is sorted. */
static int rf_ckpt_import_name_used(const char *path, const char *name, char **used, int n_used,
                                    const struct rf_tensor_view *views, int n,
                                    const struct rf_ckpt_import_map *maps) {
  if (bsearch(&name, used, (size_t)n_used, sizeof *used, rf_ckpt_import_cmp_name) ||
      rf_ckpt_import_ignorable(name, views, n))
    return 0;
  const char *ex = strstr(name, ".experts.");
  int e = -1, end = 0;
  if (ex && sscanf(ex, ".experts.%d.%n", &e, &end) == 1 && end > 0) {
    for (int i = 0; i < n; i++) {
      size_t pl = strlen(maps[i].prefix);
      if (maps[i].part == RF_CKPT_HUB_PART_NONE || maps[i].part == RF_CKPT_HUB_PART_ROUTER ||
          strncmp(name, maps[i].prefix, pl) != 0 || name[pl] != '.' || e < views[i].shape[0])
        continue;
      RF_FAIL("%s: tensor '%s' is of expert %d, the model has %" PRId64
              " experts (a file of a model with more experts? num_local_experts or num_experts of the "
              "config)",
              path, name, e, views[i].shape[0]);
    }
  }
  RF_FAIL("%s: tensor '%s' is not one the model has (a file of another model?)", path, name);
}

/* The names the views load from, each once per view: counted (used NULL) or copied
 * into `used` and `arena`. Returns the count; *bytes their size with the NULs. */
static int rf_ckpt_import_used_names(const struct rf_tensor_view *views, int n,
                                     const struct rf_ckpt_import_map *maps, char **used, char *arena,
                                     size_t *bytes) {
  int count = 0;
  *bytes = 0;
  for (int i = 0; i < n; i++)
    for (int64_t at = 0, run = 1; run > 0;) {
      char name[RF_CKPT_HUB_NAME_MAX * 2];
      int64_t src_at, shape[2];
      if (maps[i].part == RF_CKPT_HUB_PART_NONE) { /* its own name, once */
        snprintf(name, sizeof name, "%s", views[i].name);
        run = 0;
      } else {
        at += rf_ckpt_hub_source(&views[i], &maps[i], at, name, sizeof name, &src_at, shape);
        run = views[i].numel - at;
      }
      size_t len = strlen(name) + 1;
      if (used) {
        used[count] = arena + *bytes;
        memcpy(used[count], name, len);
      }
      *bytes += len;
      count++;
    }
  return count;
}

/* Refuses an import holding a tensor that no view loads from (after the layer check,
 * which names a deeper model better); every rank has every view, so every rank
 * decides alike. */
static int rf_ckpt_import_check_unused(const struct rf_ckpt_import_src *src, const char *path,
                                       const struct rf_tensor_view *views, int n,
                                       const struct rf_ckpt_import_map *maps) {
  size_t bytes;
  int n_used = rf_ckpt_import_used_names(views, n, maps, NULL, NULL, &bytes);
  char **used = rf_xcalloc((size_t)n_used + 1, sizeof *used);
  char *arena = rf_xmalloc(bytes + 1);
  rf_ckpt_import_used_names(views, n, maps, used, arena, &bytes);
  qsort(used, (size_t)n_used, sizeof *used, rf_ckpt_import_cmp_name);
  int rc = 0;
  if (src->index) {
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(src->index, "weight_map");
    for (const cJSON *e = map->child; e && rc == 0; e = e->next) {
      char where[RF_FILE_PATH_MAX * 2];
      snprintf(where, sizeof where, "%s (shard %s)", path, cJSON_IsString(e) ? e->valuestring : "?");
      rc = rf_ckpt_import_name_used(where, e->string, used, n_used, views, n, maps);
    }
  } else {
    for (int i = 0; i < src->files[0].n_tensors && rc == 0; i++)
      rc = rf_ckpt_import_name_used(src->files[0].path, src->files[0].tensors[i].name, used, n_used, views, n,
                                    maps);
  }
  free(arena);
  free(used);
  return rc;
}

int rf_ckpt_import_views(const char *path, const struct rf_tensor_view *views, int n) {
  return rf_ckpt_import_views_on(path, views, n, NULL, NULL);
}

int rf_ckpt_import_views_on(const char *path, const struct rf_tensor_view *views, int n,
                            struct rf_device *device, struct rf_device_stream *stream) {
  struct rf_ckpt_import_src src;
  RF_TRY(rf_ckpt_import_open(path, &src));
  struct rf_ckpt_import_map *maps = rf_xcalloc((size_t)n + 1, sizeof *maps);
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const struct rf_tensor_view *v = &views[i];
    if (v->end > v->begin && !v->master) {
      rc =
          rf_error_set(__FILE__, __LINE__, "%s: view '%s' has no master weights to load into", path, v->name);
      break;
    }
    rf_ckpt_import_map_view(&src, v, &maps[i]);
    if (maps[i].part == RF_CKPT_HUB_PART_NONE) {
      rc = rf_ckpt_import_check_tensor(&src, v->name, v->ndim, v->shape, NULL);
      continue;
    }
    /* every source tensor of the layout, each once */
    char hub[160];
    snprintf(hub, sizeof hub, "the %s layout of '%s'", rf_ckpt_hub_layouts[maps[i].layout].name, v->name);
    for (int64_t at = 0; at < v->numel && rc == 0;) {
      char name[RF_CKPT_HUB_NAME_MAX * 2];
      int64_t src_at, shape[2];
      at += rf_ckpt_hub_source(v, &maps[i], at, name, sizeof name, &src_at, shape);
      rc = rf_ckpt_import_check_tensor(&src, name, 2, shape, hub);
    }
  }
  if (rc == 0) rc = rf_ckpt_import_check_layers(&src, path, views, n);
  if (rc == 0) rc = rf_ckpt_import_check_unused(&src, path, views, n, maps);
  /* device memory: each view's range read and checked in host staging, then copied over */
  int64_t most = 0;
  for (int i = 0; i < n && device; i++) most = rf_max_i64(most, views[i].end - views[i].begin);
  float *staging = device ? rf_xaligned(64, (size_t)(most ? most : 1) * sizeof(float)) : NULL;
  for (int i = 0; i < n && rc == 0; i++) {
    struct rf_tensor_view v = views[i];
    if (device && v.end > v.begin) v.master = staging;
    rc = rf_ckpt_import_read(&src, &v, &maps[i]);
    if (rc == 0) rc = rf_ckpt_import_check_finite(path, &v, &maps[i]);
    if (rc == 0 && device && v.end > v.begin)
      rf_device_copy(device, views[i].master, staging, (size_t)(v.end - v.begin) * sizeof(float),
                     RF_DEVICE_COPY_HOST_TO_DEVICE, stream);
  }
  if (device) rf_device_stream_synchronize(device, stream);
  free(staging);
  free(maps);
  rf_ckpt_import_close(&src);
  return rc;
}
