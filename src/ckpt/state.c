/* Saving and loading the runtime's tensor views (master weights) and optimizer
 * states through the checkpoint file layer, with resharding on load. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt.h"

void rf_ckpt_state_blocks(const struct rf_tensor_view *view, int64_t block, struct rf_ckpt_state_piece *out) {
  if (block < 1) RF_DIE("rf_ckpt_state_blocks: block %" PRId64 " < 1", block);
  const int64_t b = block < 1 ? 1 : block; /* for the analyzers: RF_DIE does not return */
  out->numel = rf_ceil_div(view->numel, b);
  out->begin = view->begin / b;
  out->end = view->end > view->begin ? rf_ceil_div(view->end, b) : out->begin;
}

/* The piece of state s for view v on this rank. */
static void rf_ckpt_state_piece_of(const struct rf_ckpt_state_desc *s, const struct rf_tensor_view *v,
                                   int index, struct rf_ckpt_state_piece *out) {
  memset(out, 0, sizeof *out);
  if (s->piece) {
    s->piece(s->ctx, v, index, out);
    return;
  }
  out->numel = v->numel;
  out->begin = v->begin;
  out->end = v->end;
  out->data = s->slab ? (uint8_t *)s->slab + (size_t)v->shard_offset * rf_dtype_size(s->dtype) : NULL;
}

static void rf_ckpt_state_name(char *out, size_t cap, const struct rf_tensor_view *v,
                               const struct rf_ckpt_state_desc *s) {
  snprintf(out, cap, "%s%s", v->name, s->suffix);
}

enum { RF_CKPT_NAME_MAX = 512 };

/* Checks the views and states; fills the file layer's pieces (names in `names`,
 * RF_CKPT_NAME_MAX bytes each). */
static int rf_ckpt_views_pieces(const struct rf_ckpt_views_args *a, struct rf_ckpt_piece *pieces,
                                char *names) {
  for (int j = 0; j < a->n_states; j++) {
    const struct rf_ckpt_state_desc *s = &a->states[j];
    if (!s->suffix || !s->suffix[0]) RF_FAIL("%s: state %d has no suffix", a->dir, j);
    for (int k = 0; k < j; k++)
      if (strcmp(a->states[k].suffix, s->suffix) == 0)
        RF_FAIL("%s: state '%s' given twice", a->dir, s->suffix);
    if (!s->piece && !s->slab)
      RF_FAIL("%s: state '%s' has neither a slab nor a piece callback", a->dir, s->suffix);
  }
  int np = 0;
  for (int i = 0; i < a->n_views; i++) {
    const struct rf_tensor_view *v = &a->views[i];
    if (!v->name || strlen(v->name) + 64 >= RF_CKPT_NAME_MAX)
      RF_FAIL("%s: view %d: missing or long name", a->dir, i);
    if (v->ndim < 0 || v->ndim > RF_MAX_DIMS) RF_FAIL("%s: view '%s': bad ndim %d", a->dir, v->name, v->ndim);
    struct rf_ckpt_piece *p = &pieces[np++];
    *p = (struct rf_ckpt_piece){.name = v->name,
                                .dtype = RF_DTYPE_F32,
                                .ndim = v->ndim,
                                .begin = v->begin,
                                .end = v->end,
                                .data = v->master};
    memcpy(p->shape, v->shape, sizeof(int64_t) * (size_t)v->ndim);
    for (int j = 0; j < a->n_states; j++) {
      const struct rf_ckpt_state_desc *s = &a->states[j];
      struct rf_ckpt_state_piece sp;
      rf_ckpt_state_piece_of(s, v, i, &sp);
      char *name = names + (size_t)np * RF_CKPT_NAME_MAX;
      rf_ckpt_state_name(name, RF_CKPT_NAME_MAX, v, s);
      p = &pieces[np++];
      *p = (struct rf_ckpt_piece){
          .name = name, .dtype = s->dtype, .begin = sp.begin, .end = sp.end, .data = sp.data};
      if (s->piece) {
        p->ndim = 1;
        p->shape[0] = sp.numel;
      } else {
        p->ndim = v->ndim;
        memcpy(p->shape, v->shape, sizeof(int64_t) * (size_t)v->ndim);
      }
    }
  }
  return 0;
}

/* The caller's extra object with the list of states added (a new string). */
static int rf_ckpt_views_extra(const struct rf_ckpt_views_args *a, char **out) {
  cJSON *extra = a->extra_json ? cJSON_Parse(a->extra_json) : cJSON_CreateObject();
  if (!cJSON_IsObject(extra)) {
    cJSON_Delete(extra);
    RF_FAIL("%s: the extra fields are not a JSON object: %.60s", a->dir, a->extra_json);
  }
  if (cJSON_GetObjectItemCaseSensitive(extra, RF_CKPT_STATES_KEY)) {
    cJSON_Delete(extra);
    RF_FAIL("%s: the extra fields may not use the reserved key '%s'", a->dir, RF_CKPT_STATES_KEY);
  }
  cJSON *list = cJSON_AddArrayToObject(extra, RF_CKPT_STATES_KEY);
  for (int j = 0; j < a->n_states; j++) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "suffix", a->states[j].suffix);
    cJSON_AddStringToObject(o, "dtype", rf_dtype_name(a->states[j].dtype));
    cJSON_AddItemToArray(list, o);
  }
  *out = cJSON_PrintUnformatted(extra);
  cJSON_Delete(extra);
  if (!*out) RF_DIE("out of memory");
  return 0;
}

int rf_ckpt_save_views(const struct rf_ckpt_views_args *a) {
  int n = a->n_views * (1 + a->n_states);
  struct rf_ckpt_piece *pieces = rf_xcalloc((size_t)n + 1, sizeof *pieces);
  char *names = rf_xcalloc((size_t)n + 1, RF_CKPT_NAME_MAX);
  char *extra = NULL;
  int status = rf_ckpt_views_pieces(a, pieces, names);
  if (status == 0) status = rf_ckpt_views_extra(a, &extra);
  int rc;
  if (status != 0) { /* the other ranks must not wait at the agreement */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rf_error_msg());
    a->agree(a->agree_ctx, -1);
    rc = rf_error_set(__FILE__, __LINE__, "%s", msg);
  } else {
    struct rf_ckpt_save_args s = {.dir = a->dir,
                                  .rank = a->rank,
                                  .world = a->world,
                                  .step = a->step,
                                  .extra_json = extra,
                                  .chunk_bytes = a->chunk_bytes ? a->chunk_bytes : RF_CKPT_VIEWS_CHUNK_BYTES,
                                  .n_pieces = n,
                                  .pieces = pieces,
                                  .agree = a->agree,
                                  .agree_ctx = a->agree_ctx,
                                  .bounce = a->bounce,
                                  .bounce_bytes = a->bounce_bytes,
                                  .device = a->device,
                                  .stream = a->stream,
                                  .staging_bytes = a->staging_bytes};
    rc = rf_ckpt_save(&s);
  }
  free(extra);
  free(names);
  free(pieces);
  return rc;
}

int rf_ckpt_is_param(const struct rf_ckpt *ck, const struct rf_ckpt_tensor *t) {
  cJSON *extra = ck->extra_json ? cJSON_Parse(ck->extra_json) : NULL;
  const cJSON *list = cJSON_GetObjectItemCaseSensitive(extra, RF_CKPT_STATES_KEY);
  int is_param = 1;
  size_t len = strlen(t->name);
  for (const cJSON *o = cJSON_IsArray(list) ? list->child : NULL; o && is_param; o = o->next) {
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(o, "suffix");
    if (!cJSON_IsString(suffix)) continue;
    size_t ls = strlen(suffix->valuestring);
    if (ls == 0 || ls >= len || strcmp(t->name + len - ls, suffix->valuestring) != 0) continue;
    char base[RF_CKPT_NAME_MAX];
    if (len - ls >= sizeof base) continue;
    memcpy(base, t->name, len - ls);
    base[len - ls] = '\0';
    if (rf_ckpt_find(ck, base)) is_param = 0;
  }
  cJSON_Delete(extra);
  return is_param;
}

/* Checks that the checkpoint holds tensor `name` of `dtype` and shape, and that
 * [begin, end) lies inside it; `what` says what it is for the message. */
static int rf_ckpt_check_tensor(const struct rf_ckpt *ck, const char *name, const char *what,
                                enum rf_dtype dtype, int ndim, const int64_t *shape, int64_t begin,
                                int64_t end) {
  const struct rf_ckpt_tensor *t = rf_ckpt_find(ck, name);
  if (!t)
    RF_FAIL("%s/%s: no %s '%s' (a checkpoint of another model or optimizer?)", ck->dir, RF_CKPT_META, what,
            name);
  int same = t->dtype == dtype && t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (!same) {
    char have[200], want[200];
    int n = snprintf(have, sizeof have, "%s [", rf_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim; d++)
      n += snprintf(have + n, sizeof have - (size_t)n, d ? ", %" PRId64 : "%" PRId64, t->shape[d]);
    snprintf(have + n, sizeof have - (size_t)n, "]");
    n = snprintf(want, sizeof want, "%s [", rf_dtype_name(dtype));
    for (int d = 0; d < ndim; d++)
      n += snprintf(want + n, sizeof want - (size_t)n, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    snprintf(want + n, sizeof want - (size_t)n, "]");
    RF_FAIL("%s/%s: %s '%s' is %s in the checkpoint, the model has %s (a checkpoint of another model?)",
            ck->dir, RF_CKPT_META, what, name, have, want);
  }
  if (begin < 0 || begin > end || end > t->numel)
    RF_FAIL("%s: %s '%s': this rank's range [%" PRId64 ", %" PRId64 ") is outside its %" PRId64 " elements",
            ck->dir, what, name, begin, end, t->numel);
  return 0;
}

/* Everything the load will read is there, with the right dtypes and shapes. */
static int rf_ckpt_load_check(const struct rf_ckpt *ck, const struct rf_ckpt_views_args *a) {
  for (int i = 0; i < a->n_views; i++) {
    const struct rf_tensor_view *v = &a->views[i];
    RF_TRY(rf_ckpt_check_tensor(ck, v->name, "tensor", RF_DTYPE_F32, v->ndim, v->shape, v->begin, v->end));
    if (v->end > v->begin && !v->master)
      RF_FAIL("%s: view '%s' has no master weights to load into", ck->dir, v->name);
    for (int j = 0; j < a->n_states; j++) {
      const struct rf_ckpt_state_desc *s = &a->states[j];
      struct rf_ckpt_state_piece sp;
      rf_ckpt_state_piece_of(s, v, i, &sp);
      char name[RF_CKPT_NAME_MAX];
      rf_ckpt_state_name(name, sizeof name, v, s);
      if (s->piece)
        RF_TRY(rf_ckpt_check_tensor(ck, name, "optimizer state", s->dtype, 1, &sp.numel, sp.begin, sp.end));
      else
        RF_TRY(
            rf_ckpt_check_tensor(ck, name, "optimizer state", s->dtype, v->ndim, v->shape, sp.begin, sp.end));
      if (sp.end > sp.begin && !sp.data)
        RF_FAIL("%s: state '%s' of '%s': no memory to load into", ck->dir, s->suffix, v->name);
    }
  }
  /* a checkpoint saved from views holds the model's parameters and no other */
  if (ck->extra_json && strstr(ck->extra_json, "\"" RF_CKPT_STATES_KEY "\"")) {
    int n_params = 0;
    const char *extra_name = NULL;
    for (int t = 0; t < ck->n_tensors; t++) {
      if (!rf_ckpt_is_param(ck, &ck->tensors[t])) continue;
      n_params++;
      int known = 0;
      for (int i = 0; i < a->n_views && !known; i++)
        known = strcmp(a->views[i].name, ck->tensors[t].name) == 0;
      if (!known && !extra_name) extra_name = ck->tensors[t].name;
    }
    if (extra_name)
      RF_FAIL(
          "%s/%s: holds %d parameter tensors, among them '%s' that the model does not have (a checkpoint of "
          "another model?)",
          ck->dir, RF_CKPT_META, n_params, extra_name);
  }
  return 0;
}

static size_t rf_ckpt_staging_bytes(const struct rf_ckpt_views_args *a) {
  return a->staging_bytes ? a->staging_bytes : RF_CKPT_STAGING_BYTES;
}

/* Reads elements [begin, end) of tensor `name` into `out`: in place (host memory), or (a->device)
 * through host staging, rf_ckpt_staging_bytes(a) at a time, each part one host-to-device copy on
 * a->stream (which takes its source at the call: the staging is reused at once). */
static int rf_ckpt_load_piece(struct rf_ckpt *ck, const struct rf_ckpt_views_args *a, uint8_t *staging,
                              const char *name, enum rf_dtype dtype, int ndim, const int64_t *shape,
                              int64_t begin, int64_t end, void *out) {
  if (!a->device) return rf_ckpt_read(ck, name, dtype, ndim, shape, begin, end, out);
  int64_t es = (int64_t)rf_dtype_size(dtype), per = rf_max_i64(1, (int64_t)rf_ckpt_staging_bytes(a) / es);
  for (int64_t at = begin; at < end; at += per) {
    int64_t to = rf_min_i64(end, at + per);
    RF_TRY(rf_ckpt_read(ck, name, dtype, ndim, shape, at, to, staging));
    rf_device_copy(a->device, (uint8_t *)out + (at - begin) * es, staging, (size_t)((to - at) * es),
                   RF_DEVICE_COPY_HOST_TO_DEVICE, a->stream);
  }
  return 0;
}

static int rf_ckpt_load_read(struct rf_ckpt *ck, const struct rf_ckpt_views_args *a, uint8_t *staging) {
  for (int i = 0; i < a->n_views; i++) {
    const struct rf_tensor_view *v = &a->views[i];
    RF_TRY(rf_ckpt_load_piece(ck, a, staging, v->name, RF_DTYPE_F32, v->ndim, v->shape, v->begin, v->end,
                              v->master));
    for (int j = 0; j < a->n_states; j++) {
      const struct rf_ckpt_state_desc *s = &a->states[j];
      struct rf_ckpt_state_piece sp;
      rf_ckpt_state_piece_of(s, v, i, &sp);
      char name[RF_CKPT_NAME_MAX];
      rf_ckpt_state_name(name, sizeof name, v, s);
      if (s->piece)
        RF_TRY(rf_ckpt_load_piece(ck, a, staging, name, s->dtype, 1, &sp.numel, sp.begin, sp.end, sp.data));
      else
        RF_TRY(
            rf_ckpt_load_piece(ck, a, staging, name, s->dtype, v->ndim, v->shape, sp.begin, sp.end, sp.data));
    }
  }
  return 0;
}

/* Agrees on `status`; when another rank failed, records a message saying so. */
static int rf_ckpt_load_agree(const struct rf_ckpt_views_args *a, int status, const char *what) {
  if (a->agree(a->agree_ctx, status) == 0) return 0;
  if (status == 0)
    RF_FAIL_ELSEWHERE("%s: another rank failed %s (see its message); nothing was loaded", a->dir, what);
  return -1;
}

int rf_ckpt_load_views(const struct rf_ckpt_views_args *a, int64_t *step, char **extra_json) {
  if (extra_json) *extra_json = NULL;
  struct rf_ckpt ck;
  int status = rf_ckpt_open(&ck, a->dir);
  ck.finite_only = 1;
  int opened = status == 0;
  if (status == 0) status = rf_ckpt_load_check(&ck, a);
  if (rf_ckpt_load_agree(a, status, "to open or check the checkpoint") != 0) {
    if (opened) rf_ckpt_close(&ck);
    return -1;
  }
  uint8_t *staging = a->device ? rf_xaligned(64, rf_ckpt_staging_bytes(a) + 8) : NULL; /* >= 1 element */
  status = rf_ckpt_load_read(&ck, a, staging);
  if (a->device) rf_device_stream_synchronize(a->device, a->stream); /* the copies landed: staging goes */
  free(staging);
  if (rf_ckpt_load_agree(a, status, "to read its part of the checkpoint") != 0) {
    rf_ckpt_close(&ck);
    return -1;
  }
  if (step) *step = ck.step;
  if (extra_json) {
    *extra_json = strdup(ck.extra_json ? ck.extra_json : "{}");
    if (!*extra_json) RF_DIE("out of memory");
  }
  rf_ckpt_close(&ck);
  return 0;
}
