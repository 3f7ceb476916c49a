/* rfsdp train's checkpoints: save every N steps (master weights, every optimizer
 * state, the step; the data loader is a function of (seed, step), so the step is
 * its position), keep the last K, resume bit-exactly, start from safetensors. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "train.h"

#define RF_TRAIN_MAX_STATES 8
#define RF_TRAIN_CKPT_PREFIX "step-"

/* Testing hook: with RF_TEST_DIE_IN_SAVE=STEP in the environment, the last rank
 * exits abruptly inside the save of that step, after writing its rank files and
 * before anyone writes the marker (tests/test_train.c: a rank killed mid-save). */
static void rf_train_ckpt_maybe_die(const struct rf_train_state *s, int64_t step) {
  const char *die = getenv("RF_TEST_DIE_IN_SAVE");
  if (die && atoll(die) == step && s->rank == s->world - 1) _exit(137);
}

static int rf_train_ckpt_agree(void *ctx, int status) {
  rf_train_ckpt_maybe_die(ctx, ((const struct rf_train_state *)ctx)->saving_step);
  return rf_train_agree(status);
}

/* The optimizer's state slabs as checkpoint states. Per-block scales (8-bit
 * AdamW) are addressed through rf_optim_scales. */
struct rf_train_states {
  int n;
  struct rf_ckpt_state_desc desc[RF_TRAIN_MAX_STATES];
  char suffix[RF_TRAIN_MAX_STATES][40];
  struct rf_train_scale_ctx {
    const struct rf_optim *optim;
    float *slab;
  } scale[RF_TRAIN_MAX_STATES];
};

static void rf_train_scale_piece(void *ctx, const struct rf_tensor_view *view, int index,
                                 struct rf_ckpt_state_piece *out) {
  (void)view; /* the optimizer knows its blocks by index */
  const struct rf_train_scale_ctx *c = ctx;
  int64_t offset, count, first;
  rf_optim_scales(c->optim, index, &offset, &count, &first);
  out->numel = rf_optim_tensor_blocks(c->optim, index);
  out->begin = count > 0 ? first : 0;
  out->end = out->begin + count;
  out->data = c->slab + offset;
}

static void rf_train_states_make(const struct rf_train_state *s, struct rf_train_states *st) {
  memset(st, 0, sizeof *st);
  st->n = rf_optim_n_states(s->optim);
  RF_ASSERT(st->n <= RF_TRAIN_MAX_STATES);
  for (int i = 0; i < st->n; i++) {
    struct rf_optim_state_slab slab;
    rf_optim_state(s->optim, i, &slab);
    snprintf(st->suffix[i], sizeof st->suffix[i], ".%s.%s", s->args->plan.optim, slab.name);
    struct rf_ckpt_state_desc *d = &st->desc[i];
    d->suffix = st->suffix[i];
    d->dtype = slab.dtype;
    if (slab.shard_layout) {
      d->slab = slab.data;
    } else {
      st->scale[i] = (struct rf_train_scale_ctx){s->optim, slab.data};
      d->piece = rf_train_scale_piece;
      d->ctx = &st->scale[i];
    }
  }
}

static struct rf_ckpt_views_args rf_train_views_args(struct rf_train_state *s,
                                                     const struct rf_train_states *st, const char *dir) {
  struct rf_ckpt_views_args a = {0};
  a.dir = dir;
  a.rank = s->rank;
  a.world = s->world;
  a.n_views = rf_fsdp_n_tensors(s->model.fsdp);
  a.views = s->views;
  a.n_states = st->n;
  a.states = st->desc;
  a.agree = rf_train_ckpt_agree;
  a.agree_ctx = s;
  return a;
}

static int rf_train_ckpt_save(struct rf_train_state *s, const char *dir, int64_t step) {
  struct rf_train_states st;
  rf_train_states_make(s, &st);
  char extra[512];
  snprintf(
      extra, sizeof extra,
      "{\"step\": %lld, \"seed\": %lld, \"optim\": \"%s\", \"optim_step\": %lld, \"world\": %d, \"model\": "
      "\"%s\"}",
      (long long)step, (long long)s->args->seed, s->args->plan.optim, (long long)rf_optim_get_step(s->optim),
      s->world, s->args->model);
  struct rf_ckpt_views_args a = rf_train_views_args(s, &st, dir);
  a.step = step;
  a.extra_json = extra;
  s->saving_step = step;
  uint64_t t0 = rf_time_ns();
  RF_TRY(rf_ckpt_save_views(&a));
  if (s->rank == 0)
    printf("checkpoint: %s (step %lld, %.0f ms)\n", dir, (long long)step, (double)(rf_time_ns() - t0) / 1e6);
  return 0;
}

/* 1 when dir holds a complete checkpoint. */
static int rf_train_ckpt_complete(const char *dir) {
  char path[RF_FILE_PATH_MAX + 16];
  snprintf(path, sizeof path, "%s/%s", dir, RF_CKPT_MARKER);
  return access(path, F_OK) == 0;
}

/* The steps of the complete checkpoints DIR/step-N, ascending (caller frees). */
static int rf_train_ckpt_list(const char *dir, int64_t **steps) {
  *steps = NULL;
  DIR *d = opendir(dir);
  if (!d) return 0;
  int n = 0, cap = 0;
  const struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, RF_TRAIN_CKPT_PREFIX, strlen(RF_TRAIN_CKPT_PREFIX)) != 0) continue;
    char *end = NULL;
    long long step = strtoll(e->d_name + strlen(RF_TRAIN_CKPT_PREFIX), &end, 10);
    char sub[RF_FILE_PATH_MAX];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    if (!end || *end || !rf_train_ckpt_complete(sub)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      *steps = realloc(*steps, (size_t)cap * sizeof(int64_t));
      RF_ASSERT(*steps);
    }
    (*steps)[n++] = step;
  }
  closedir(d);
  for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
    for (int j = i; j > 0 && (*steps)[j - 1] > (*steps)[j]; j--) {
      int64_t t = (*steps)[j];
      (*steps)[j] = (*steps)[j - 1];
      (*steps)[j - 1] = t;
    }
  return n;
}

static void rf_train_ckpt_path(char *out, size_t cap, const char *dir, int64_t step) {
  snprintf(out, cap, "%s/" RF_TRAIN_CKPT_PREFIX "%08lld", dir, (long long)step);
}

/* Removes a checkpoint directory: its marker first, so it is never seen complete
 * while half deleted. */
static void rf_train_ckpt_remove(const char *dir) {
  char path[RF_FILE_PATH_MAX + 300];
  snprintf(path, sizeof path, "%s/%s", dir, RF_CKPT_MARKER);
  unlink(path);
  DIR *d = opendir(dir);
  if (!d) return;
  const struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static const char *rf_train_json_str(const cJSON *obj, const char *key) {
  const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
  return cJSON_IsString(x) ? x->valuestring : NULL;
}

static int rf_train_resume(struct rf_train_state *s, const char *where) {
  char dir[RF_FILE_PATH_MAX];
  if (rf_train_ckpt_complete(where)) {
    snprintf(dir, sizeof dir, "%s", where);
  } else {
    int64_t *steps;
    int n = rf_train_ckpt_list(where, &steps);
    if (n == 0) {
      free(steps);
      RF_FAIL("%s: no complete checkpoint there (no %s marker, and no complete %s* directory)", where,
              RF_CKPT_MARKER, RF_TRAIN_CKPT_PREFIX);
    }
    rf_train_ckpt_path(dir, sizeof dir, where, steps[n - 1]);
    free(steps);
  }
  struct rf_train_states st;
  rf_train_states_make(s, &st);
  struct rf_ckpt_views_args a = rf_train_views_args(s, &st, dir);
  int64_t step = 0;
  char *extra = NULL;
  RF_TRY(rf_ckpt_load_views(&a, &step, &extra));
  cJSON *x = cJSON_Parse(extra ? extra : "{}");
  free(extra);
  const char *optim = rf_train_json_str(x, "optim");
  const cJSON *ostep = cJSON_GetObjectItemCaseSensitive(x, "optim_step");
  int ok = optim && strcmp(optim, s->args->plan.optim) == 0 && cJSON_IsNumber(ostep);
  char saved[32];
  snprintf(saved, sizeof saved, "%s", optim ? optim : "?");
  if (ok) rf_optim_set_step(s->optim, (int64_t)ostep->valuedouble);
  cJSON_Delete(x);
  RF_REQUIRE(ok, "%s: saved with optimizer %s, this run uses --optim %s", dir, saved, s->args->plan.optim);
  RF_REQUIRE(step >= 0 && step <= s->args->steps, "%s: saved at step %lld, beyond --steps %lld", dir,
             (long long)step, (long long)s->args->steps);
  s->start_step = step;
  if (s->rank == 0) printf("resumed from %s at step %lld\n", dir, (long long)step);
  return 0;
}

int rf_train_ckpt_start(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  RF_REQUIRE(!(a->save_every > 0 && !a->ckpt_dir), "--save-every needs --ckpt-dir");
  RF_REQUIRE(!(a->init && a->resume), "--init and --resume exclude each other");
  if (a->init) {
    RF_TRY(rf_train_model_import(&s->model, a->init));
    if (s->rank == 0) printf("initialized from %s\n", a->init);
  }
  if (a->resume) RF_TRY(rf_train_resume(s, a->resume));
  return 0; /* --ckpt-dir was made with the other outputs (tools/cmd_train.c) */
}

int rf_train_ckpt_step(struct rf_train_state *s, int64_t done) {
  const struct rf_train_args *a = s->args;
  if (a->save_every <= 0 || (done % a->save_every != 0 && done != a->steps)) return 0;
  char dir[RF_FILE_PATH_MAX];
  rf_train_ckpt_path(dir, sizeof dir, a->ckpt_dir, done);
  RF_TRY(rf_train_ckpt_save(s, dir, done));
  if (s->rank == 0 && a->keep > 0) {
    int64_t *steps;
    int n = rf_train_ckpt_list(a->ckpt_dir, &steps);
    for (int i = 0; i + a->keep < n; i++) {
      rf_train_ckpt_path(dir, sizeof dir, a->ckpt_dir, steps[i]);
      rf_train_ckpt_remove(dir);
    }
    free(steps);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return 0;
}
