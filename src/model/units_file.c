/* A description from a file: a units file (the generic format, any model as
 * units of named tensors) or a Hugging Face config.json (rf_model_desc_make). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/desc.h"

/* A positive integer (exact in a double, below 2^40). */
static int rf_model_units_positive(const cJSON *v, int64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;
  if (!(d >= 1 && d < 1099511627776.0) || floor(d) != d) return 0;
  *out = (int64_t)d;
  return 1;
}

/* Tensor ti of unit ui: {"name", "shape", "block_rows"?, "sub_count"?}. */
static int rf_model_units_tensor(const cJSON *t, const char *path, int ui, int ti,
                                 struct rf_model_desc *out) {
  RF_REQUIRE(cJSON_IsObject(t), "%s: units[%d].tensors[%d] must be an object", path, ui, ti);
  const cJSON *tn = cJSON_GetObjectItemCaseSensitive(t, "name");
  RF_REQUIRE(cJSON_IsString(tn) && tn->valuestring[0],
             "%s: units[%d].tensors[%d].name must be a non-empty string", path, ui, ti);
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(t, "shape");
  int ndim = cJSON_IsArray(shape) ? cJSON_GetArraySize(shape) : 0;
  RF_REQUIRE(ndim >= 1 && ndim <= RF_MAX_DIMS,
             "%s: units[%d].tensors[%d].shape must be an array of 1 to %d dimensions", path, ui, ti,
             RF_MAX_DIMS);
  int64_t dims[RF_MAX_DIMS] = {0}, numel = 1;
  int d = 0;
  for (const cJSON *v = shape->child; v; v = v->next, d++) {
    RF_REQUIRE(rf_model_units_positive(v, &dims[d]),
               "%s: units[%d].tensors[%d].shape[%d] must be a positive integer", path, ui, ti, d);
    RF_REQUIRE(numel <= (INT64_C(1) << 50) / dims[d], "%s: units[%d].tensors[%d].shape: too many elements",
               path, ui, ti);
    numel *= dims[d];
  }
  int64_t block_rows = 0, sub = 1;
  const cJSON *br = cJSON_GetObjectItemCaseSensitive(t, "block_rows");
  RF_REQUIRE(!br || rf_model_units_positive(br, &block_rows),
             "%s: units[%d].tensors[%d].block_rows must be a positive integer", path, ui, ti);
  const cJSON *sc = cJSON_GetObjectItemCaseSensitive(t, "sub_count");
  RF_REQUIRE(!sc || (rf_model_units_positive(sc, &sub) && dims[0] % sub == 0),
             "%s: units[%d].tensors[%d].sub_count must be a positive integer dividing shape[0]", path, ui,
             ti);
  struct rf_model_tensor *x = rf_model_desc_add_tensor(out, tn->valuestring, ndim, dims);
  x->block_rows = block_rows;
  x->sub_count = sub;
  x->decay = ndim >= 2;
  return 0;
}

static int rf_model_units_name_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every tensor name once (sorted, neighbours compared). */
static int rf_model_units_check_names(const struct rf_model_desc *d, const char *path) {
  const char **names = rf_xcalloc((size_t)d->n_tensors + 1, sizeof *names);
  int n = 0;
  for (int u = 0; u < d->n_units; u++)
    for (int i = 0; i < d->units[u].n_tensors; i++) names[n++] = d->units[u].tensors[i].name;
  qsort(names, (size_t)n, sizeof *names, rf_model_units_name_cmp);
  int dup = -1;
  for (int i = 1; i < n && dup < 0; i++)
    if (strcmp(names[i - 1], names[i]) == 0) dup = i;
  char name[128] = "";
  if (dup >= 0) snprintf(name, sizeof name, "%s", names[dup]);
  free(names);
  RF_REQUIRE(dup < 0, "%s: tensor '%s' appears twice", path, name);
  return 0;
}

static int rf_model_units_read(const cJSON *units, const char *path, struct rf_model_desc *out) {
  RF_REQUIRE(cJSON_IsArray(units) && cJSON_GetArraySize(units) > 0,
             "%s: field 'units' must be a non-empty array", path);
  out->model_type = rf_xmalloc(sizeof "generic");
  memcpy(out->model_type, "generic", sizeof "generic");
  int ui = 0;
  for (const cJSON *u = units->child; u; u = u->next, ui++) {
    RF_REQUIRE(cJSON_IsObject(u), "%s: units[%d] must be an object", path, ui);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(u, "name");
    RF_REQUIRE(cJSON_IsString(name) && name->valuestring[0], "%s: units[%d].name must be a non-empty string",
               path, ui);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(u, "tensors");
    RF_REQUIRE(cJSON_IsArray(tensors) && cJSON_GetArraySize(tensors) > 0,
               "%s: units[%d].tensors must be a non-empty array", path, ui);
    rf_model_desc_add_unit(out, name->valuestring);
    int ti = 0;
    for (const cJSON *t = tensors->child; t && !out->too_large; t = t->next, ti++)
      RF_TRY(rf_model_units_tensor(t, path, ui, ti, out));
  }
  return rf_model_units_check_names(out, path);
}

static int rf_model_desc_from_json(const cJSON *root, const char *path, struct rf_model_desc *out) {
  RF_REQUIRE(cJSON_IsObject(root), "%s: not a JSON object", path);
  const cJSON *units = cJSON_GetObjectItemCaseSensitive(root, "units");
  if (units) {
    RF_TRY(rf_model_units_read(units, path, out));
  } else {
    struct rf_model_config cfg;
    RF_TRY(rf_model_config_from_json(&cfg, root, path));
    rf_model_desc_make(&cfg, out);
  }
  RF_REQUIRE(!out->too_large, "%s: the model is too large: more than 2^50 parameters or 2^18 tensors", path);
  return 0;
}

int rf_model_desc_parse(const char *text, const char *path, struct rf_model_desc *out) {
  memset(out, 0, sizeof *out);
  cJSON *root = rf_model_json_parse(text, strlen(text), path);
  if (!root) return -1;
  int rc = rf_model_desc_from_json(root, path, out);
  cJSON_Delete(root);
  if (rc != 0) rf_model_desc_free(out);
  return rc;
}

int rf_model_desc_load(const char *path, struct rf_model_desc *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL;
  size_t bytes = 0;
  RF_TRY(rf_file_read_all(path, &text, &bytes));
  int rc = rf_model_desc_parse(text, path, out);
  free(text);
  return rc;
}
