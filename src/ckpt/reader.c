/* The public checkpoint reader (include/rfsdp_ckpt.h) over rf_ckpt_open/rf_ckpt_read. */
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"
#include "rfsdp_ckpt.h"

_Static_assert(RF_CHECKPOINT_MAX_DIMS == RF_MAX_DIMS, "the public and internal dimension limits differ");

struct rf_checkpoint {
  struct rf_ckpt ck;
};

int rf_checkpoint_open(struct rf_checkpoint **out, const char *dir) {
  if (!out) RF_FAIL("rf_checkpoint_open: out is NULL");
  *out = NULL;
  if (!dir || !*dir) RF_FAIL("rf_checkpoint_open: the checkpoint directory is missing");
  struct rf_checkpoint *c = rf_xcalloc(1, sizeof *c);
  if (rf_ckpt_open(&c->ck, dir) != 0) {
    free(c);
    return -1;
  }
  *out = c;
  return 0;
}

void rf_checkpoint_close(struct rf_checkpoint *c) {
  if (!c) return;
  rf_ckpt_close(&c->ck);
  free(c);
}

int64_t rf_checkpoint_step(const struct rf_checkpoint *c) { return c ? c->ck.step : -1; }
int rf_checkpoint_world(const struct rf_checkpoint *c) { return c ? c->ck.world : -1; }
const char *rf_checkpoint_extra_json(const struct rf_checkpoint *c) {
  return c && c->ck.extra_json ? c->ck.extra_json : "{}";
}
int rf_checkpoint_tensor_count(const struct rf_checkpoint *c) { return c ? c->ck.n_tensors : 0; }

const char *rf_checkpoint_tensor_name(const struct rf_checkpoint *c, int i) {
  return c && i >= 0 && i < c->ck.n_tensors ? c->ck.tensors[i].name : NULL;
}

int rf_checkpoint_tensor_info(const struct rf_checkpoint *c, const char *name, enum rf_dtype *dtype,
                              int *ndim, int64_t *shape) {
  if (!c || !name || !dtype || !ndim || !shape) RF_FAIL("rf_checkpoint_tensor_info: a NULL argument");
  const struct rf_ckpt_tensor *t = rf_ckpt_find(&c->ck, name);
  if (!t) RF_FAIL("%s: the checkpoint has no tensor '%s'", c->ck.dir, name);
  *dtype = t->dtype;
  *ndim = t->ndim;
  memcpy(shape, t->shape, (size_t)t->ndim * sizeof *shape);
  return 0;
}

int rf_checkpoint_read(struct rf_checkpoint *c, const char *name, void *out) {
  if (!c || !name || !out) RF_FAIL("rf_checkpoint_read: a NULL argument");
  const struct rf_ckpt_tensor *t = rf_ckpt_find(&c->ck, name);
  if (!t) RF_FAIL("%s: the checkpoint has no tensor '%s'", c->ck.dir, name);
  return rf_ckpt_read(&c->ck, t->name, t->dtype, t->ndim, t->shape, 0, t->numel, out);
}

int rf_checkpoint_format_version(const struct rf_checkpoint *c) { return c ? c->ck.version : -1; }
int64_t rf_checkpoint_chunk_bytes(const struct rf_checkpoint *c) { return c ? c->ck.chunk_bytes : -1; }

/* Tensor `name` of c, or NULL with the message naming fn. */
static const struct rf_ckpt_tensor *rf_checkpoint_find(const struct rf_checkpoint *c, const char *name,
                                                       const char *fn) {
  if (!c || !name) {
    rf_error_set(__FILE__, __LINE__, "%s: a NULL argument", fn);
    return NULL;
  }
  const struct rf_ckpt_tensor *t = rf_ckpt_find(&c->ck, name);
  if (!t) rf_error_set(__FILE__, __LINE__, "%s: the checkpoint has no tensor '%s'", c->ck.dir, name);
  return t;
}

int rf_checkpoint_tensor_ranges(const struct rf_checkpoint *c, const char *name) {
  const struct rf_ckpt_tensor *t = rf_checkpoint_find(c, name, "rf_checkpoint_tensor_ranges");
  return t ? t->n_ranges : -1;
}

int rf_checkpoint_tensor_is_param(const struct rf_checkpoint *c, const char *name) {
  const struct rf_ckpt_tensor *t = rf_checkpoint_find(c, name, "rf_checkpoint_tensor_is_param");
  return t ? rf_ckpt_is_param(&c->ck, t) : -1;
}

int rf_checkpoint_verify(struct rf_checkpoint *c, uint64_t *bytes) {
  if (!c) RF_FAIL("rf_checkpoint_verify: a NULL argument");
  int rc = rf_ckpt_verify(&c->ck);
  if (bytes) *bytes = c->ck.bytes_read;
  return rc;
}

int rf_checkpoint_export(const char *dir, const char *out, enum rf_dtype dtype, const char *const *fp8_names,
                         int n_fp8, int fp8_pow2) {
  if (!dir || !out || (n_fp8 > 0 && !fp8_names)) RF_FAIL("rf_checkpoint_export: a NULL argument");
  RF_REQUIRE(n_fp8 >= 0, "rf_checkpoint_export: n_fp8 %d < 0", n_fp8);
  if (n_fp8 == 0) return rf_ckpt_export_safetensors(dir, out, dtype);
  struct rf_ckpt_export_fp8 fp8 = {.n = n_fp8, .names = fp8_names, .pow2 = fp8_pow2};
  return rf_ckpt_export_safetensors_fp8(dir, out, dtype, &fp8);
}

const char *rf_checkpoint_error(void) { return rf_error_msg(); }
