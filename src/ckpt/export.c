/* A checkpoint's parameters to a safetensors file (streamed), and a safetensors
 * file into the runtime's views. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "safetensors/safetensors.h"

enum { RF_CKPT_EXPORT_PIECE = 1 << 20 }; /* elements per read */

static void rf_ckpt_shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
  size_t n = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < ndim && n < cap; d++)
    n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
  if (n < cap) snprintf(out + n, cap - n, "]");
}

static int rf_ckpt_export_stream(struct rf_ckpt *ck, struct rf_st_writer *w, const int *params, int n) {
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
      if (rc == 0) rc = rf_st_writer_write_f32(w, buf, m);
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
  struct rf_st_decl *decls = rf_xcalloc((size_t)ck.n_tensors + 1, sizeof *decls);
  int n = 0, rc = 0;
  for (int i = 0; i < ck.n_tensors && rc == 0; i++) {
    const struct rf_ckpt_tensor *t = &ck.tensors[i];
    if (!rf_ckpt_is_param(&ck, t)) continue;
    if (t->dtype != RF_DTYPE_F32 && t->dtype != RF_DTYPE_BF16)
      rc = rf_error_set(__FILE__, __LINE__, "%s: tensor '%s' is %s; only f32 and bf16 parameters export",
                        ckpt_dir, t->name, rf_dtype_name(t->dtype));
    params[n] = i;
    decls[n] = (struct rf_st_decl){.name = t->name, .dtype = rf_st_dtype_from_rf(dtype), .ndim = t->ndim};
    memcpy(decls[n].shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    n++;
  }
  if (rc == 0 && n == 0)
    rc = rf_error_set(__FILE__, __LINE__, "%s: the checkpoint holds no parameters", ckpt_dir);
  char meta[96];
  snprintf(meta, sizeof meta, "{\"format\":\"pt\",\"rfsdp_step\":\"%" PRId64 "\"}", ck.step);
  struct rf_st_writer w;
  if (rc == 0) rc = rf_st_writer_open(&w, out_path, n, decls, meta);
  if (rc == 0) {
    rc = rf_ckpt_export_stream(&ck, &w, params, n);
    if (rc == 0)
      rc = rf_st_writer_commit(&w);
    else
      rf_st_writer_abort(&w);
  }
  free(decls);
  free(params);
  rf_ckpt_close(&ck);
  return rc;
}

int rf_ckpt_import_views(const char *path, const struct rf_tensor_view *views, int n) {
  struct rf_st_file f;
  RF_TRY(rf_st_open(&f, path));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    const struct rf_tensor_view *v = &views[i];
    const struct rf_st_tensor *t = rf_st_find(&f, v->name);
    if (!t) {
      rc = rf_error_set(__FILE__, __LINE__, "%s: no tensor '%s' (a file of another model?)", path, v->name);
      break;
    }
    int same = t->ndim == v->ndim;
    for (int d = 0; same && d < v->ndim; d++) same = t->shape[d] == v->shape[d];
    if (!same) {
      char have[200], want[200];
      rf_ckpt_shape_str(have, sizeof have, t->ndim, t->shape);
      rf_ckpt_shape_str(want, sizeof want, v->ndim, v->shape);
      rc = rf_error_set(__FILE__, __LINE__,
                        "%s: tensor '%s' has shape %s, the model has %s (a file of another model?)", path,
                        v->name, have, want);
    } else if (t->dtype != RF_ST_DTYPE_F32 && t->dtype != RF_ST_DTYPE_BF16 && t->dtype != RF_ST_DTYPE_F16)
      rc = rf_error_set(__FILE__, __LINE__, "%s: tensor '%s' is %s; parameters load from F32, BF16 or F16",
                        path, v->name, rf_st_dtype_name(t->dtype));
  }
  for (int i = 0; i < n && rc == 0; i++)
    rc = rf_st_read_f32(&f, views[i].name, views[i].begin, views[i].end, views[i].master);
  rf_st_close(&f);
  return rc;
}
