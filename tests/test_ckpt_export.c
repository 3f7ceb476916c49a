/* rf-test: timeout=60
 * Safetensors export and import of checkpoints, and the `rfsdp ckpt` command.
 * Ranks are simulated in one process (each rank's views are built from rf_shard
 * splits; rank 0 saves last, so the agreement callback needs no barrier).
 *   - a safetensors file (our writer, random f32 values) imported at W = 3 into
 *     views, saved with optimizer states, exported: the exported file is
 *     byte-identical to the source (header, order, data), and holds no state;
 *   - the Python library's file (tests/data/safetensors_ref.safetensors):
 *     its BF16 and F16 tensors imported at W = 2, saved, exported as bf16: the
 *     BF16 tensor's bytes are identical to the source's; the F16 tensor's values
 *     are PyTorch's (tests/data/safetensors_ref.json);
 *   - an f32 export converted to bf16 equals the rounding of the masters;
 *   - import errors (missing tensor, other shape, integer dtype) name the file;
 *   - a Hugging Face sharded file (two shards + model.safetensors.index.json)
 *     imports like the single file; a wrong or missing shard, a tensor absent
 *     from the map are refused naming the file;
 *   - the weights alone (no optimizer state asked for) load at another world;
 *     the save refuses an extra object that uses the reserved key;
 *   - `rfsdp ckpt info` prints step, world, extra, states and every tensor's
 *     dtype, shape and bytes; `--verify` catches a corrupted byte; `rfsdp ckpt
 *     export` writes the file; bad arguments are refused. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"
#include "shard/shard.h"

#define MAX_T 8
#define MAX_W 4

/* One simulated rank's views of a model and its slabs. */
struct rank_model {
  struct rf_tensor_view views[MAX_T];
  float *master, *m;
};

/* A model of n tensors split over `world` ranks: starts[t] (world + 1 entries). */
struct model {
  int n, world;
  const char *names[MAX_T];
  int ndim[MAX_T];
  int64_t shape[MAX_T][2];
  int64_t starts[MAX_T][MAX_W + 1];
  struct rank_model ranks[MAX_W];
};

static int64_t numel_of(const struct model *md, int t) {
  int64_t n = 1;
  for (int d = 0; d < md->ndim[t]; d++) n *= md->shape[t][d];
  return n;
}

/* Splits each tensor in blocks of one row, random counts; allocates the slabs. */
static void model_split(struct model *md, int world, uint64_t seed) {
  md->world = world;
  int64_t off[MAX_W] = {0};
  for (int t = 0; t < md->n; t++) {
    int64_t numel = numel_of(md, t), block = md->ndim[t] == 2 ? md->shape[t][1] : 1;
    int64_t nb = rf_ceil_div(numel, block), counts[MAX_W] = {0};
    for (int64_t b = 0; b < nb; b++) counts[rf_test_rand_u64(&seed) % (uint64_t)world]++;
    struct rf_shard sh;
    RF_ASSERT(rf_shard_init(&sh, numel, block, world, counts) == 0);
    for (int r = 0; r <= world; r++) md->starts[t][r] = rf_min_i64(sh.first_block[r] * block, numel);
    for (int r = 0; r < world; r++) {
      struct rf_tensor_view *v = &md->ranks[r].views[t];
      *v = (struct rf_tensor_view){.name = md->names[t],
                                   .unit = t,
                                   .ndim = md->ndim[t],
                                   .numel = numel,
                                   .block_elems = block,
                                   .starts = md->starts[t]};
      memcpy(v->shape, md->shape[t], sizeof md->shape[t]);
      rf_shard_local_range(&sh, r, &v->begin, &v->end);
      v->shard_offset = off[r];
      off[r] += v->end - v->begin + 5;
    }
    rf_shard_free(&sh);
  }
  for (int r = 0; r < world; r++) {
    md->ranks[r].master = calloc((size_t)off[r] + 1, 4);
    md->ranks[r].m = calloc((size_t)off[r] + 1, 4);
    for (int t = 0; t < md->n; t++)
      md->ranks[r].views[t].master = md->ranks[r].master + md->ranks[r].views[t].shard_offset;
    for (int64_t i = 0; i < off[r]; i++) md->ranks[r].m[i] = (float)i * 0.5f + (float)r;
  }
}

static void model_free(struct model *md) {
  for (int r = 0; r < md->world; r++) {
    free(md->ranks[r].master);
    free(md->ranks[r].m);
  }
}

static int agree_local(void *ctx, int status) {
  (void)ctx;
  return status;
}

/* Every rank saves (rank 0 last: it finishes the checkpoint). */
static int model_save(struct model *md, const char *dir, int64_t step) {
  int rc = 0;
  for (int r = md->world - 1; r >= 0 && rc == 0; r--) {
    struct rf_ckpt_state_desc st = {.suffix = ".adam_m", .dtype = RF_DTYPE_F32, .slab = md->ranks[r].m};
    struct rf_ckpt_views_args a = {.dir = dir,
                                   .rank = r,
                                   .world = md->world,
                                   .step = step,
                                   .extra_json = "{\"data_step\":5}",
                                   .n_views = md->n,
                                   .views = md->ranks[r].views,
                                   .n_states = 1,
                                   .states = &st,
                                   .agree = agree_local,
                                   .chunk_bytes = 4096};
    rc = rf_ckpt_save_views(&a);
  }
  return rc;
}

static int model_import(struct model *md, const char *path) {
  for (int r = 0; r < md->world; r++)
    if (rf_ckpt_import_views(path, md->ranks[r].views, md->n) != 0) return -1;
  return 0;
}

static void test_roundtrip_f32(const char *dir) {
  struct model md = {.n = 4,
                     .names = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                               "model.norm.weight", "lm_head.weight"},
                     .ndim = {2, 2, 1, 2},
                     .shape = {{61, 16}, {16, 16}, {16, 0}, {61, 16}}};
  char src[256], ck[256], out[256], out16[256];
  snprintf(src, sizeof src, "%s/src.safetensors", dir);
  snprintf(ck, sizeof ck, "%s/ckpt-a", dir);
  snprintf(out, sizeof out, "%s/export.safetensors", dir);
  snprintf(out16, sizeof out16, "%s/export-bf16.safetensors", dir);
  struct rf_safetensors_decl decls[4];
  uint64_t rng = 42;
  for (int t = 0; t < md.n; t++) {
    decls[t] = (struct rf_safetensors_decl){
        .name = md.names[t], .dtype = RF_SAFETENSORS_DTYPE_F32, .ndim = md.ndim[t]};
    memcpy(decls[t].shape, md.shape[t], sizeof md.shape[t]);
  }
  struct rf_safetensors_writer w;
  RF_ASSERT(rf_safetensors_writer_open(&w, src, md.n, decls, "{\"format\":\"pt\",\"rfsdp_step\":\"12\"}") ==
            0);
  for (int t = 0; t < md.n; t++)
    for (int64_t i = 0; i < numel_of(&md, t); i++) {
      float x = rf_test_rand_f32(&rng);
      RF_ASSERT(rf_safetensors_writer_write_f32(&w, &x, 1) == 0);
    }
  RF_ASSERT(rf_safetensors_writer_commit(&w) == 0);

  model_split(&md, 3, 7);
  RF_CHECK(model_import(&md, src) == 0, "import: %s", rf_error_msg());
  RF_CHECK(model_save(&md, ck, 12) == 0, "save: %s", rf_error_msg());
  RF_CHECK(rf_ckpt_export_safetensors(ck, out, RF_DTYPE_F32) == 0, "export: %s", rf_error_msg());
  RF_CHECK(rf_test_files_equal(src, out), "import at W=3, save, export: not byte-identical to the source");
  struct rf_safetensors_file f;
  RF_CHECK(rf_safetensors_open(&f, out) == 0 && f.n_tensors == md.n &&
               !rf_safetensors_find(&f, "lm_head.weight.adam_m"),
           "the export holds exactly the parameters: %s", rf_error_msg());
  rf_safetensors_close(&f);

  /* bf16: every value the rounding of the master */
  RF_CHECK(rf_ckpt_export_safetensors(ck, out16, RF_DTYPE_BF16) == 0, "export bf16: %s", rf_error_msg());
  struct rf_safetensors_file fs, fb;
  RF_ASSERT(rf_safetensors_open(&fs, src) == 0);
  RF_CHECK(rf_safetensors_open(&fb, out16) == 0, "%s", rf_error_msg());
  int64_t bad = 0;
  for (int t = 0; t < md.n; t++) {
    int64_t n = numel_of(&md, t);
    float *x = malloc((size_t)n * 4);
    uint16_t *h = malloc((size_t)n * 2);
    RF_ASSERT(rf_safetensors_read_f32(&fs, md.names[t], 0, n, x) == 0);
    RF_CHECK(rf_safetensors_find(&fb, md.names[t])->dtype == RF_SAFETENSORS_DTYPE_BF16, "dtype");
    RF_ASSERT(rf_safetensors_read_raw(&fb, md.names[t], 0, n, h) == 0);
    for (int64_t i = 0; i < n; i++) bad += h[i] != rf_bf16_from_f32(x[i]);
    free(x);
    free(h);
  }
  RF_CHECK(bad == 0, "bf16 export: %lld values differ from the rounded masters", (long long)bad);
  rf_safetensors_close(&fs);
  rf_safetensors_close(&fb);

  /* import errors, each naming the file */
  md.ranks[0].views[1].shape[0] = 17;
  RF_CHECK(rf_ckpt_import_views(src, md.ranks[0].views, md.n) != 0 && strstr(rf_error_msg(), src) &&
               strstr(rf_error_msg(), "q_proj.weight' has shape [16, 16], the model has [17, 16]"),
           "other shape: %s", rf_error_msg());
  md.ranks[0].views[1].shape[0] = 16;
  md.ranks[0].views[2].name = "model.final_norm.weight";
  RF_CHECK(rf_ckpt_import_views(src, md.ranks[0].views, md.n) != 0 &&
               strstr(rf_error_msg(), "no tensor 'model.final_norm.weight'") && strstr(rf_error_msg(), src),
           "missing: %s", rf_error_msg());
  model_free(&md);
}

/* Tensors `names` of `in`, their bytes as they are, written to `out`. */
static void copy_raw(const char *in, const char *out, const char *const *names, int n) {
  struct rf_safetensors_file f;
  RF_ASSERT(rf_safetensors_open(&f, in) == 0 && n <= 8);
  struct rf_safetensors_decl decl[8];
  for (int i = 0; i < n; i++) {
    const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, names[i]);
    RF_ASSERT(t);
    decl[i] = (struct rf_safetensors_decl){names[i], t->dtype, t->ndim, {0}};
    memcpy(decl[i].shape, t->shape, sizeof decl[i].shape);
  }
  struct rf_safetensors_writer w;
  RF_ASSERT(rf_safetensors_writer_open(&w, out, n, decl, NULL) == 0);
  for (int i = 0; i < n; i++) {
    const struct rf_safetensors_tensor *t = rf_safetensors_find(&f, names[i]);
    size_t bytes = (size_t)t->numel * rf_safetensors_dtype_size(t->dtype);
    void *buf = rf_xmalloc(bytes + 1);
    RF_ASSERT(rf_safetensors_read_raw(&f, names[i], 0, t->numel, buf) == 0);
    RF_ASSERT(rf_safetensors_writer_write(&w, buf, bytes) == 0);
    free(buf);
  }
  RF_ASSERT(rf_safetensors_writer_commit(&w) == 0);
  rf_safetensors_close(&f);
}

static void test_python_file(const char *dir) {
  const char *ref = "tests/data/safetensors_ref.safetensors";
  struct model md = {.n = 2,
                     .names = {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"},
                     .ndim = {2, 2},
                     .shape = {{16, 16}, {24, 16}}};
  model_split(&md, 2, 3);
  /* the file's other tensors are no model's: refused; its two model tensors copied byte for byte load */
  RF_CHECK(model_import(&md, ref) != 0 && strstr(rf_error_msg(),
                                                 "safetensors_ref.safetensors: tensor 'steps' is "
                                                 "not one the model has"),
           "a file with tensors the model lacks: %s", rf_error_msg());
  char mine[256];
  snprintf(mine, sizeof mine, "%s/py-model.safetensors", dir);
  copy_raw(ref, mine, md.names, md.n);
  RF_CHECK(model_import(&md, mine) == 0, "import of the Python file's tensors: %s", rf_error_msg());
  char ck[256], out[256];
  snprintf(ck, sizeof ck, "%s/ckpt-py", dir);
  snprintf(out, sizeof out, "%s/py-bf16.safetensors", dir);
  RF_CHECK(model_save(&md, ck, 3) == 0, "save: %s", rf_error_msg());
  RF_CHECK(rf_ckpt_export_safetensors(ck, out, RF_DTYPE_BF16) == 0, "export: %s", rf_error_msg());
  struct rf_safetensors_file a, b;
  RF_ASSERT(rf_safetensors_open(&a, ref) == 0);
  RF_ASSERT(rf_safetensors_open(&b, out) == 0);
  uint16_t x[256], y[256];
  RF_ASSERT(rf_safetensors_read_raw(&a, md.names[0], 0, 256, x) == 0);
  RF_CHECK(rf_safetensors_read_raw(&b, md.names[0], 0, 256, y) == 0 && memcmp(x, y, sizeof x) == 0,
           "BF16 through import, save, bf16 export: bytes differ");
  /* the F16 tensor: the masters hold PyTorch's values */
  char *text;
  size_t n;
  RF_ASSERT(rf_file_read_all("tests/data/safetensors_ref.json", &text, &n) == 0);
  cJSON *want = cJSON_Parse(text);
  free(text);
  const cJSON *bits = cJSON_GetObjectItem(cJSON_GetObjectItem(want, md.names[1]), "f32_bits");
  int64_t bad = 0;
  for (int r = 0; r < 2; r++) {
    const struct rf_tensor_view *v = &md.ranks[r].views[1];
    for (int64_t i = v->begin; i < v->end; i++) {
      uint32_t u;
      memcpy(&u, &v->master[i - v->begin], 4);
      bad += u != (uint32_t)cJSON_GetArrayItem(bits, (int)i)->valuedouble;
    }
  }
  RF_CHECK(bits && bad == 0, "F16 import: %lld values differ from PyTorch's", (long long)bad);
  cJSON_Delete(want);
  rf_safetensors_close(&a);
  rf_safetensors_close(&b);
  md.names[0] = "codes";
  md.ranks[0].views[0].name = "codes";
  md.ranks[0].views[0].shape[0] = 3;
  md.ranks[0].views[0].shape[1] = 7;
  RF_CHECK(rf_ckpt_import_views(ref, md.ranks[0].views, 1) != 0 && strstr(rf_error_msg(), "is U8"),
           "integer tensor: %s", rf_error_msg());
  model_free(&md);
}

/* Weights only (a fresh optimizer): a load that asks for no state, at another
 * world; the reserved extra key and a non-object extra are refused by the save. */
static void test_weights_only(const char *dir) {
  struct model md = {.n = 4,
                     .names = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                               "model.norm.weight", "lm_head.weight"},
                     .ndim = {2, 2, 1, 2},
                     .shape = {{61, 16}, {16, 16}, {16, 0}, {61, 16}}};
  char ck[256], src[256];
  snprintf(ck, sizeof ck, "%s/ckpt-a", dir); /* from test_roundtrip_f32 */
  snprintf(src, sizeof src, "%s/src.safetensors", dir);
  model_split(&md, 2, 99);
  int64_t step = -1;
  char *extra = NULL;
  for (int r = 0; r < 2; r++) {
    struct rf_ckpt_views_args a = {
        .dir = ck, .rank = r, .world = 2, .n_views = md.n, .views = md.ranks[r].views, .agree = agree_local};
    RF_CHECK(rf_ckpt_load_views(&a, &step, r ? &extra : NULL) == 0, "weights-only load: %s", rf_error_msg());
  }
  RF_CHECK(step == 12 && extra && strstr(extra, "\"data_step\":5"), "step %lld extra %s", (long long)step,
           extra ? extra : "(null)");
  free(extra);
  struct rf_safetensors_file f;
  RF_ASSERT(rf_safetensors_open(&f, src) == 0);
  int64_t bad = 0;
  for (int r = 0; r < 2; r++)
    for (int t = 0; t < md.n; t++) {
      const struct rf_tensor_view *v = &md.ranks[r].views[t];
      float *x = malloc((size_t)(v->end - v->begin + 1) * 4);
      RF_ASSERT(rf_safetensors_read_f32(&f, v->name, v->begin, v->end, x) == 0);
      bad += v->end > v->begin && memcmp(x, v->master, (size_t)(v->end - v->begin) * 4) != 0;
      free(x);
    }
  RF_CHECK(bad == 0, "weights-only load at W=2 of a save at W=3: %lld pieces differ", (long long)bad);
  rf_safetensors_close(&f);

  char ck2[256];
  snprintf(ck2, sizeof ck2, "%s/ckpt-reserved", dir);
  struct rf_ckpt_views_args a = {.dir = ck2,
                                 .rank = 0,
                                 .world = 1,
                                 .n_views = 0,
                                 .agree = agree_local,
                                 .extra_json = "{\"rfsdp_states\":[]}"};
  RF_CHECK(rf_ckpt_save_views(&a) != 0 && strstr(rf_error_msg(), "reserved key 'rfsdp_states'"),
           "reserved: %s", rf_error_msg());
  a.extra_json = "[1]";
  RF_CHECK(rf_ckpt_save_views(&a) != 0 && strstr(rf_error_msg(), "not a JSON object"), "extra: %s",
           rf_error_msg());
  model_free(&md);
}

/* A Hugging Face sharded file (two shards and an index) imports like the single file. */
static void test_sharded(const char *dir) {
  struct model md = {.n = 4,
                     .names = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                               "model.norm.weight", "lm_head.weight"},
                     .ndim = {2, 2, 1, 2},
                     .shape = {{61, 16}, {16, 16}, {16, 0}, {61, 16}}};
  char src[256], shard[2][256], index[256];
  snprintf(src, sizeof src, "%s/src.safetensors", dir); /* from test_roundtrip_f32 */
  struct rf_safetensors_file f;
  RF_ASSERT(rf_safetensors_open(&f, src) == 0);
  for (int k = 0; k < 2; k++) { /* tensors 0, 1 in the first shard; 2, 3 in the second */
    snprintf(shard[k], sizeof shard[k], "%s/model-0000%d-of-00002.safetensors", dir, k + 1);
    struct rf_safetensors_decl decls[2];
    for (int j = 0; j < 2; j++) {
      int t = 2 * k + j;
      decls[j] = (struct rf_safetensors_decl){
          .name = md.names[t], .dtype = RF_SAFETENSORS_DTYPE_F32, .ndim = md.ndim[t]};
      memcpy(decls[j].shape, md.shape[t], sizeof md.shape[t]);
    }
    struct rf_safetensors_writer w;
    RF_ASSERT(rf_safetensors_writer_open(&w, shard[k], 2, decls, NULL) == 0);
    for (int j = 0; j < 2; j++) {
      int64_t n = numel_of(&md, 2 * k + j);
      float *x = malloc((size_t)n * 4);
      RF_ASSERT(rf_safetensors_read_f32(&f, md.names[2 * k + j], 0, n, x) == 0);
      RF_ASSERT(rf_safetensors_writer_write_f32(&w, x, n) == 0);
      free(x);
    }
    RF_ASSERT(rf_safetensors_writer_commit(&w) == 0);
  }
  snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
  char json[2048];
  snprintf(
      json, sizeof json,
      "{\"metadata\": {\"total_size\": 8896}, \"weight_map\": {\"%s\": \"model-00001-of-00002.safetensors\", "
      "\"%s\": \"model-00001-of-00002.safetensors\", \"%s\": \"model-00002-of-00002.safetensors\", "
      "\"%s\": \"model-00002-of-00002.safetensors\"}}",
      md.names[0], md.names[1], md.names[2], md.names[3]);
  RF_ASSERT(rf_file_write_all(index, json, strlen(json)) == 0);
  model_split(&md, 3, 5);
  RF_CHECK(model_import(&md, index) == 0, "import of the index: %s", rf_error_msg());
  int64_t bad = 0;
  for (int r = 0; r < 3; r++)
    for (int t = 0; t < md.n; t++) {
      const struct rf_tensor_view *v = &md.ranks[r].views[t];
      float *x = malloc((size_t)(v->end - v->begin + 1) * 4);
      RF_ASSERT(rf_safetensors_read_f32(&f, v->name, v->begin, v->end, x) == 0);
      bad += v->end > v->begin && memcmp(x, v->master, (size_t)(v->end - v->begin) * 4) != 0;
      free(x);
    }
  RF_CHECK(bad == 0, "sharded import: %lld pieces differ from the single file's", (long long)bad);
  rf_safetensors_close(&f);
  /* the index names a tensor's shard wrongly; a shard is missing; a tensor is not in the map */
  char *bad_json = strdup(json);
  char *at = strstr(bad_json, "model-00002-of-00002.safetensors\"}}");
  if (!at) abort();
  at[10] = '1'; /* lm_head.weight -> the first shard */
  RF_ASSERT(rf_file_write_all(index, bad_json, strlen(bad_json)) == 0);
  RF_CHECK(rf_ckpt_import_views(index, md.ranks[0].views, md.n) != 0 && strstr(rf_error_msg(), shard[0]) &&
               strstr(rf_error_msg(), "no tensor 'lm_head.weight' although the index names this file"),
           "wrong shard: %s", rf_error_msg());
  at[10] = '3';
  RF_ASSERT(rf_file_write_all(index, bad_json, strlen(bad_json)) == 0);
  RF_CHECK(rf_ckpt_import_views(index, md.ranks[0].views, md.n) != 0 &&
               strstr(rf_error_msg(), "model-00003-of-00002.safetensors: cannot open") &&
               strstr(rf_error_msg(), "a shard named by"),
           "missing shard: %s", rf_error_msg());
  free(bad_json);
  /* the map names a tensor the model does not have: refused naming the index and the shard */
  char extra[2300];
  snprintf(extra, sizeof extra, "%.*s, \"model.extra_norm.weight\": \"model-00002-of-00002.safetensors\"}}",
           (int)strlen(json) - 2, json);
  RF_ASSERT(rf_file_write_all(index, extra, strlen(extra)) == 0);
  RF_CHECK(rf_ckpt_import_views(index, md.ranks[0].views, md.n) != 0 && strstr(rf_error_msg(), index) &&
               strstr(rf_error_msg(),
                      "(shard model-00002-of-00002.safetensors): tensor 'model.extra_norm.weight' "
                      "is not one the model has"),
           "a tensor the model lacks in the map: %s", rf_error_msg());
  md.ranks[0].views[2].name = "model.final_norm.weight";
  RF_ASSERT(rf_file_write_all(index, json, strlen(json)) == 0);
  RF_CHECK(rf_ckpt_import_views(index, md.ranks[0].views, md.n) != 0 && strstr(rf_error_msg(), index) &&
               strstr(rf_error_msg(), "no tensor 'model.final_norm.weight' in the weight map"),
           "not in the map: %s", rf_error_msg());
  model_free(&md);
}

static void test_cli(const char *dir) {
  char ck[256], out[16384], st[256];
  snprintf(ck, sizeof ck, "%s/ckpt-a", dir); /* from test_roundtrip_f32 */
  int rc = rf_cli_run(out, sizeof out, "ckpt info %s", ck);
  RF_CHECK(rc == 0 && strstr(out, "step 12, world 3") && strstr(out, "\"data_step\":5") &&
               strstr(out, "states: .adam_m (f32)"),
           "info: rc %d '%s'", rc, out);
  RF_CHECK(strstr(out, "model.embed_tokens.weight") && strstr(out, "[61, 16]") && strstr(out, "3904") &&
               strstr(out, "lm_head.weight.adam_m") && strstr(out, "state") &&
               strstr(out, "parameters: 4 tensors, 2224 elements, 8896 bytes"),
           "info lists tensors: '%s'", out);
  rc = rf_cli_run(out, sizeof out, "ckpt info %s --verify", ck);
  RF_CHECK(rc == 0 && strstr(out, "verified"), "verify: rc %d '%s'", rc, out);
  snprintf(st, sizeof st, "%s/cli.safetensors", dir);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --dtype f32", ck, st);
  char src[256];
  snprintf(src, sizeof src, "%s/src.safetensors", dir);
  RF_CHECK(rc == 0 && strstr(out, "export:") && rf_test_files_equal(src, st), "export: rc %d '%s'", rc, out);

  /* a corrupted byte: info opens (metadata intact), --verify refuses naming the file */
  char bad[256], cmd[600], file[300];
  snprintf(bad, sizeof bad, "%s/ckpt-bad", dir);
  snprintf(cmd, sizeof cmd, "cp -r %s %s", ck, bad);
  RF_ASSERT(system(cmd) == 0);
  rf_ckpt_rank_path(file, sizeof file, bad, 1, "bin");
  struct rf_ckpt c;
  RF_ASSERT(rf_ckpt_open(&c, bad) == 0);
  uint64_t at = 0;
  for (int i = 0; i < c.n_tensors && !at; i++)
    for (int k = 0; k < c.tensors[i].n_ranges && !at; k++)
      if (c.tensors[i].ranges[k].rank == 1 && c.tensors[i].ranges[k].end > c.tensors[i].ranges[k].begin)
        at = c.tensors[i].ranges[k].offset + 1;
  rf_ckpt_close(&c);
  FILE *f = fopen(file, "r+b");
  if (!f || !at || fseek(f, (long)at, SEEK_SET) != 0) abort();
  int ch = fgetc(f);
  RF_ASSERT(fseek(f, (long)at, SEEK_SET) == 0);
  fputc(ch ^ 1, f);
  fclose(f);
  rc = rf_cli_run(out, sizeof out, "ckpt info %s --verify", bad);
  RF_CHECK(rc == 1 && strstr(out, file) && strstr(out, "checksum mismatch"), "verify corrupted: rc %d '%s'",
           rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s/never.safetensors", bad, dir);
  RF_CHECK(rc == 1 && strstr(out, "checksum mismatch"), "export corrupted: rc %d '%s'", rc, out);
  snprintf(file, sizeof file, "%s/never.safetensors", dir);
  RF_CHECK(access(file, F_OK) != 0, "a failed export left a file");

  rc = rf_cli_run(out, sizeof out, "ckpt info %s", dir); /* a directory of checkpoints */
  RF_CHECK(rc == 1 && strstr(out, "incomplete checkpoint") && strstr(out, "complete checkpoints inside:") &&
               strstr(out, "/ckpt-a") && strstr(out, "/ckpt-py"),
           "parent dir: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt info %s/none", dir);
  RF_CHECK(rc == 1 && strstr(out, "no such checkpoint directory"), "missing dir: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s", ck);
  RF_CHECK(rc == 2 && strstr(out, "--out is required"), "no --out: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out x --dtype f16", ck);
  RF_CHECK(rc == 2 && strstr(out, "--dtype"), "bad dtype: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt frobnicate %s", ck);
  RF_CHECK(rc == 2 && strstr(out, "usage: rfsdp ckpt info DIR"), "bad subcommand: rc %d '%s'", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt info --help");
  RF_CHECK(rc == 0 && strstr(out, "--verify"), "help: rc %d '%s'", rc, out);
}

int main(void) {
  char dir[64] = "/tmp/rf_test_ckpt_export.XXXXXX";
  RF_ASSERT(mkdtemp(dir));
  test_roundtrip_f32(dir);
  test_python_file(dir);
  test_weights_only(dir);
  test_sharded(dir);
  test_cli(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_ckpt_export");
}
