/* rf-test: np=1,2,3,4,5 timeout=90
 * Saving and loading tensor views (master weights) with optimizer states (f32 m
 * and v in the master's slab layout, 8-bit codes, per-block f32 scales through a
 * callback) under mpirun, resharding: in a run of W ranks, the W ranks save with
 * one split (rf_shard, random block counts of one block size) and every k <= W
 * loads with another split (another block size, other counts); saves at 1 and at
 * W - 1 ranks load at W. Every value must equal the reference function of
 * (tensor, state, index) that produced it.
 * Then broken checkpoints (truncated rank file, a corrupted byte, a missing rank
 * file, another model, a newer meta.json) are refused on every rank with a
 * message naming the file, and the directory (names, sizes, mtimes, contents) is
 * unchanged; failures found before reading leave memory untouched.
 * Views on a device the host cannot read (the checked device: a host read faults) save
 * through host staging into files identical to the host save's, and load back through it. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "comm/comm_mpi.h"
#include "device/device.h"
#include "rf_test.h"
#include "shard/shard.h"

#define N_T 4
#define N_S 4
#define PAD 3 /* elements of padding between pieces in a slab */

static const char *t_names[N_T] = {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight",
                                   "model.norm.weight", "lm_head.weight"};
static const int t_ndim[N_T] = {2, 2, 1, 2};
static const int64_t t_shape[N_T][2] = {{50, 24}, {41, 32}, {20, 1}, {7, 24}};
static const int64_t t_qblock[N_T] = {48, 64, 8,
                                      48}; /* 8-bit quantization block: 2 rows, 2 rows, 8, 2 rows */
/* state 0 .adam_m f32, 1 .adam_v f32, 2 .m8 u8 codes (slab layout), 3 .m8_scale f32 (one per qblock) */
static const char *s_suffix[N_S] = {".adam_m", ".adam_v", ".m8", ".m8_scale"};
static const enum rf_dtype s_dtype[N_S] = {RF_DTYPE_F32, RF_DTYPE_F32, RF_DTYPE_U8, RF_DTYPE_F32};

static int64_t numel_of(int t) { return t_shape[t][0] * (t_ndim[t] == 2 ? t_shape[t][1] : 1); }

/* This rank's model at some world and split. */
struct model {
  struct rf_shard shards[N_T];
  int64_t starts[N_T][8];
  struct rf_tensor_view views[N_T];
  float *master, *m, *v, *scales;
  uint8_t *codes;
  int64_t slab_elems, scale_off[N_T], scale_elems;
};

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The reference: the value of element i of state s (-1: master) of tensor t. */
static float ref_f32(int t, int s, int64_t i) {
  return (float)((int64_t)(mix((uint64_t)(t * 100 + s + 1) << 40 ^ (uint64_t)i) >> 40) - (1 << 23)) /
         1048576.0f;
}
static uint8_t ref_u8(int t, int64_t i) { return (uint8_t)mix((uint64_t)t << 50 ^ (uint64_t)i ^ 0xabcdef); }

static void scale_piece(void *ctx, const struct rf_tensor_view *v, int index,
                        struct rf_ckpt_state_piece *out) {
  struct model *md = ctx;
  rf_ckpt_state_blocks(v, t_qblock[index], out);
  out->data = md->scales + md->scale_off[index];
}

/* Splits every tensor over `world` ranks in blocks of mult[t] quantization blocks
 * with random counts (some zero), builds this rank's views and slabs (filled with
 * 0xff bytes when not `fill`, with the reference values when `fill`). */
static void model_init(struct model *md, int world, int rank, const int *mult, uint64_t seed, int fill) {
  memset(md, 0, sizeof *md);
  int64_t off = 0, soff = 0;
  for (int t = 0; t < N_T; t++) {
    int64_t numel = numel_of(t), block = t_qblock[t] * mult[t], nb = rf_ceil_div(numel, block),
            counts[8] = {0};
    for (int64_t b = 0; b < nb; b++) counts[mix(seed ^ (uint64_t)(t * 7919 + b)) % (uint64_t)world]++;
    RF_ASSERT(rf_shard_init(&md->shards[t], numel, block, world, counts) == 0);
    for (int r = 0; r <= world; r++)
      md->starts[t][r] = rf_min_i64(md->shards[t].first_block[r] * block, numel);
    struct rf_tensor_view *v = &md->views[t];
    *v = (struct rf_tensor_view){.name = t_names[t],
                                 .unit = t,
                                 .ndim = t_ndim[t],
                                 .numel = numel,
                                 .block_elems = block,
                                 .starts = md->starts[t]};
    v->shape[0] = t_shape[t][0];
    v->shape[1] = t_shape[t][1];
    rf_shard_local_range(&md->shards[t], rank, &v->begin, &v->end);
    v->shard_offset = off;
    off += v->end - v->begin + PAD;
    struct rf_ckpt_state_piece sp;
    rf_ckpt_state_blocks(v, t_qblock[t], &sp);
    md->scale_off[t] = soff;
    soff += sp.end - sp.begin + 1;
  }
  md->slab_elems = off;
  md->scale_elems = soff;
  md->master = malloc((size_t)off * 4);
  md->m = malloc((size_t)off * 4);
  md->v = malloc((size_t)off * 4);
  md->codes = malloc((size_t)off);
  md->scales = malloc((size_t)soff * 4);
  memset(md->master, 0xff, (size_t)off * 4);
  memset(md->m, 0xff, (size_t)off * 4);
  memset(md->v, 0xff, (size_t)off * 4);
  memset(md->codes, 0xff, (size_t)off);
  memset(md->scales, 0xff, (size_t)soff * 4);
  for (int t = 0; t < N_T; t++) {
    struct rf_tensor_view *v = &md->views[t];
    v->master = md->master + v->shard_offset;
    if (!fill) continue;
    for (int64_t i = v->begin; i < v->end; i++) {
      int64_t at = v->shard_offset + i - v->begin;
      md->master[at] = ref_f32(t, -1, i);
      md->m[at] = ref_f32(t, 0, i);
      md->v[at] = ref_f32(t, 1, i);
      md->codes[at] = ref_u8(t, i);
    }
    struct rf_ckpt_state_piece sp;
    rf_ckpt_state_blocks(v, t_qblock[t], &sp);
    for (int64_t b = sp.begin; b < sp.end; b++)
      md->scales[md->scale_off[t] + b - sp.begin] = ref_f32(t, 3, b);
  }
}

static void model_free(struct model *md) {
  for (int t = 0; t < N_T; t++) rf_shard_free(&md->shards[t]);
  free(md->master);
  free(md->m);
  free(md->v);
  free(md->codes);
  free(md->scales);
}

static void model_states(struct model *md, struct rf_ckpt_state_desc *s) {
  s[0] = (struct rf_ckpt_state_desc){.suffix = s_suffix[0], .dtype = s_dtype[0], .slab = md->m};
  s[1] = (struct rf_ckpt_state_desc){.suffix = s_suffix[1], .dtype = s_dtype[1], .slab = md->v};
  s[2] = (struct rf_ckpt_state_desc){.suffix = s_suffix[2], .dtype = s_dtype[2], .slab = md->codes};
  s[3] = (struct rf_ckpt_state_desc){
      .suffix = s_suffix[3], .dtype = s_dtype[3], .piece = scale_piece, .ctx = md};
}

/* Elements of this rank's pieces that differ from the reference. */
static int64_t model_mismatches(const struct model *md) {
  int64_t bad = 0;
  for (int t = 0; t < N_T; t++) {
    const struct rf_tensor_view *v = &md->views[t];
    for (int64_t i = v->begin; i < v->end; i++) {
      int64_t at = v->shard_offset + i - v->begin;
      float want[3] = {ref_f32(t, -1, i), ref_f32(t, 0, i), ref_f32(t, 1, i)};
      bad += memcmp(&md->master[at], &want[0], 4) != 0;
      bad += memcmp(&md->m[at], &want[1], 4) != 0;
      bad += memcmp(&md->v[at], &want[2], 4) != 0;
      bad += md->codes[at] != ref_u8(t, i);
    }
    struct rf_ckpt_state_piece sp;
    rf_ckpt_state_blocks(v, t_qblock[t], &sp);
    for (int64_t b = sp.begin; b < sp.end; b++) {
      float want = ref_f32(t, 3, b);
      bad += memcmp(&md->scales[md->scale_off[t] + b - sp.begin], &want, 4) != 0;
    }
  }
  return bad;
}

/* Whether every slab still holds the 0xff fill. */
static int model_untouched(const struct model *md) {
  int ok = 1;
  for (int64_t i = 0; i < md->slab_elems; i++) ok &= md->codes[i] == 0xff;
  const uint8_t *p[4] = {(const uint8_t *)md->master, (const uint8_t *)md->m, (const uint8_t *)md->v,
                         (const uint8_t *)md->scales};
  int64_t n[4] = {md->slab_elems * 4, md->slab_elems * 4, md->slab_elems * 4, md->scale_elems * 4};
  for (int k = 0; k < 4; k++)
    for (int64_t i = 0; i < n[k]; i++) ok &= p[k][i] == 0xff;
  return ok;
}

static int agree_mpi(void *ctx, int status) {
  int32_t s = status;
  rf_comm_allreduce(ctx, &s, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  return s;
}

static struct rf_ckpt_views_args args_of(struct model *md, struct rf_ckpt_state_desc *states, const char *dir,
                                         struct rf_comm *comm) {
  return (struct rf_ckpt_views_args){.dir = dir,
                                     .rank = comm->rank,
                                     .world = comm->world,
                                     .n_views = N_T,
                                     .views = md->views,
                                     .n_states = N_S,
                                     .states = states,
                                     .agree = agree_mpi,
                                     .agree_ctx = comm,
                                     .chunk_bytes = 256};
}

static const int save_mult[N_T] = {1, 1, 1, 1}, load_mult[N_T] = {3, 2, 2, 1};

/* subs[k]: the first k ranks of the world (valid on those ranks only); made once. */
static struct rf_comm subs[9];

/* Saves at k ranks (the first k of the world), seed-dependent split. */
static void save_at(const char *dir, int k, int rank, uint64_t seed) {
  if (rank < k) {
    struct rf_comm comm = subs[k];
    struct model md;
    struct rf_ckpt_state_desc states[N_S];
    model_init(&md, k, rank, save_mult, seed, 1);
    model_states(&md, states);
    struct rf_ckpt_views_args a = args_of(&md, states, dir, &comm);
    a.step = 1000 + k;
    char extra[64];
    snprintf(extra, sizeof extra, "{\"saved_at\":%d}", k);
    a.extra_json = extra;
    RF_CHECK(rf_ckpt_save_views(&a) == 0, "save at %d: %s", k, rf_error_msg());
    model_free(&md);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* Loads at k ranks with another split and checks every value. */
static void load_at(const char *dir, int k, int rank, int saved_at, uint64_t seed) {
  if (rank < k) {
    struct rf_comm comm = subs[k];
    struct model md;
    struct rf_ckpt_state_desc states[N_S];
    model_init(&md, k, rank, load_mult, seed, 0);
    model_states(&md, states);
    struct rf_ckpt_views_args a = args_of(&md, states, dir, &comm);
    int64_t step = -1;
    char *extra = NULL;
    int rc = rf_ckpt_load_views(&a, &step, &extra);
    RF_CHECK(rc == 0, "load at %d of a save at %d: %s", k, saved_at, rf_error_msg());
    int64_t bad = model_mismatches(&md);
    RF_CHECK(bad == 0, "rank %d: load at %d of a save at %d: %lld values differ", rank, k, saved_at,
             (long long)bad);
    char want[128];
    snprintf(want, sizeof want, "{\"saved_at\":%d,\"rfsdp_states\":[", saved_at);
    RF_CHECK(rc == 0 && step == 1000 + saved_at && extra && strncmp(extra, want, strlen(want)) == 0,
             "step %lld extra %s", (long long)step, extra ? extra : "(null)");
    free(extra);
    model_free(&md);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- the views on a device the host cannot read (the checked device) ------------- */

/* The host slabs of a model while its views point at device copies. */
struct host_slabs {
  float *master, *m, *v, *scales;
  uint8_t *codes;
};

static void *to_device(struct rf_device *dev, struct rf_device_stream *s, const void *host, size_t bytes) {
  void *d = rf_device_alloc(dev, bytes, 64);
  rf_device_copy(dev, d, host, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, s);
  return d;
}

/* md's slabs copied to the device; md (its views, its states) then points there. */
static void model_to_device(struct model *md, struct host_slabs *h, struct rf_device *dev,
                            struct rf_device_stream *s) {
  *h = (struct host_slabs){md->master, md->m, md->v, md->scales, md->codes};
  size_t n = (size_t)md->slab_elems;
  md->master = to_device(dev, s, h->master, n * 4);
  md->m = to_device(dev, s, h->m, n * 4);
  md->v = to_device(dev, s, h->v, n * 4);
  md->codes = to_device(dev, s, h->codes, n);
  md->scales = to_device(dev, s, h->scales, (size_t)md->scale_elems * 4);
  for (int t = 0; t < N_T; t++) md->views[t].master = md->master + md->views[t].shard_offset;
}

/* The device's bytes back into the host slabs; md points at them again. */
static void model_to_host(struct model *md, struct host_slabs *h, struct rf_device *dev,
                          struct rf_device_stream *s) {
  size_t n = (size_t)md->slab_elems;
  void *d[5] = {md->master, md->m, md->v, md->codes, md->scales};
  void *to[5] = {h->master, h->m, h->v, h->codes, h->scales};
  size_t bytes[5] = {n * 4, n * 4, n * 4, n, (size_t)md->scale_elems * 4};
  for (int k = 0; k < 5; k++) {
    rf_device_copy(dev, to[k], d[k], bytes[k], RF_DEVICE_COPY_DEVICE_TO_HOST, s);
    rf_device_release(dev, d[k]);
  }
  md->master = h->master, md->m = h->m, md->v = h->v, md->codes = h->codes, md->scales = h->scales;
  for (int t = 0; t < N_T; t++) md->views[t].master = md->master + md->views[t].shard_offset;
}

/* The save at the whole world again from device memory (through staging of two checksum chunks,
 * so a piece goes in several parts) gives files identical to the host save in `good`; a load into
 * device memory (staged in 100-byte parts) holds the reference values. */
static void device_save_load(const char *root, const char *good, struct rf_comm *comm) {
  struct rf_device dev;
  rf_device_checked_init(&dev, 0, NULL);
  struct rf_device_stream *s = rf_device_stream_create(&dev);
  char dir[128];
  snprintf(dir, sizeof dir, "%s/from-device", root);
  struct model md;
  struct host_slabs h;
  struct rf_ckpt_state_desc states[N_S];
  model_init(&md, comm->world, comm->rank, save_mult, 1000 + (uint64_t)comm->world, 1); /* save_at's */
  model_to_device(&md, &h, &dev, s);
  model_states(&md, states);
  struct rf_ckpt_views_args a = args_of(&md, states, dir, comm);
  a.step = 1000 + comm->world;
  char extra[64];
  snprintf(extra, sizeof extra, "{\"saved_at\":%d}", comm->world);
  a.extra_json = extra;
  a.device = &dev;
  a.stream = s;
  a.staging_bytes = 512;
  RF_CHECK(rf_ckpt_save_views(&a) == 0, "a save from device memory: %s", rf_error_msg());
  model_to_host(&md, &h, &dev, s);
  model_free(&md);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm->rank == 0) {
    char cmd[512];
    for (int r = 0; r <= comm->world; r++) {
      char name[32];
      if (r < comm->world)
        snprintf(name, sizeof name, "rank-%05d.bin", r);
      else
        snprintf(name, sizeof name, "meta.json");
      snprintf(cmd, sizeof cmd, "cmp -s %s/%s %s/%s", dir, name, good, name);
      RF_CHECK(system(cmd) == 0, "%s of the save from device memory differs from the host save's", name);
    }
  }
  model_init(&md, comm->world, comm->rank, load_mult, 77, 0);
  model_to_device(&md, &h, &dev, s);
  model_states(&md, states);
  a = args_of(&md, states, good, comm);
  a.device = &dev;
  a.stream = s;
  a.staging_bytes = 100;
  RF_CHECK(rf_ckpt_load_views(&a, NULL, NULL) == 0, "a load into device memory: %s", rf_error_msg());
  model_to_host(&md, &h, &dev, s);
  int64_t bad = model_mismatches(&md);
  RF_CHECK(bad == 0, "rank %d: a load into device memory: %lld values differ", comm->rank, (long long)bad);
  model_free(&md);
  rf_device_stream_free(&dev, s);
  rf_device_free(&dev);
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- broken checkpoints -------------------------------------------------------- */

/* Names, sizes, mtimes and contents of the files of a directory. */
static uint64_t dir_snapshot(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  RF_ASSERT(n >= 0);
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (int i = 0; i < n; i++) {
    char path[512], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
    struct stat st;
    RF_ASSERT(lstat(path, &st) == 0);
    int64_t meta[4] = {st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_mode};
    XXH3_64bits_update(h, names[i]->d_name, strlen(names[i]->d_name));
    XXH3_64bits_update(h, meta, sizeof meta);
    if (S_ISREG(st.st_mode) && rf_file_read_all(path, &buf, &len) == 0) {
      XXH3_64bits_update(h, buf, len);
      free(buf);
    }
    free(names[i]);
  }
  free(names);
  uint64_t d = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  return d;
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  RF_ASSERT(system(cmd) == 0);
}

/* A byte in the middle of the first non-empty range of the first tensor; its rank. */
static int corrupt_target(const char *dir, uint64_t *at) {
  struct rf_ckpt ck;
  RF_ASSERT(rf_ckpt_open(&ck, dir) == 0);
  const struct rf_ckpt_range *r = &ck.tensors[0].ranges[0];
  *at = r->offset + (uint64_t)(r->end - r->begin) * 2;
  int rank = r->rank;
  rf_ckpt_close(&ck);
  return rank;
}

enum breakage {
  BREAK_TRUNCATE,
  BREAK_CORRUPT,
  BREAK_MISSING,
  BREAK_VERSION,
  BREAK_SHAPE,
  BREAK_EXTRA_TENSOR,
  BREAK_NO_STATE,
  BREAK_COUNT
};

/* Loads a broken copy of `good` at the whole world; every rank must fail, some
 * rank's message must name `file` and `problem`, the directory must not change. */
static void test_broken(const char *root, const char *good, struct rf_comm *comm, enum breakage what) {
  char bad[256], file[320];
  snprintf(bad, sizeof bad, "%s/bad-%d", root, (int)what);
  file[0] = '\0';
  const char *problem = "";
  int check_phase = 1;
  if (comm->rank == 0) {
    sh("cp -r %s %s", good, bad);
    if (what == BREAK_TRUNCATE) {
      rf_ckpt_rank_path(file, sizeof file, bad, 0, "bin");
      struct stat st;
      RF_ASSERT(stat(file, &st) == 0 && truncate(file, st.st_size - 10) == 0);
    } else if (what == BREAK_CORRUPT) {
      uint64_t at;
      int r = corrupt_target(bad, &at);
      rf_ckpt_rank_path(file, sizeof file, bad, r, "bin");
      FILE *f = fopen(file, "r+b");
      if (!f || fseek(f, (long)at, SEEK_SET) != 0) abort();
      int c = fgetc(f);
      RF_ASSERT(c != EOF && fseek(f, (long)at, SEEK_SET) == 0);
      fputc(c ^ 0x10, f);
      fclose(f);
    } else if (what == BREAK_MISSING) {
      rf_ckpt_rank_path(file, sizeof file, bad, comm->world - 1, "bin");
      RF_ASSERT(unlink(file) == 0);
    } else if (what == BREAK_VERSION) {
      snprintf(file, sizeof file, "%s/meta.json", bad);
      char *buf;
      size_t n;
      RF_ASSERT(rf_file_read_all(file, &buf, &n) == 0);
      char *v = strstr(buf, "\"version\":\t1");
      if (!v) abort();
      v[strlen("\"version\":\t")] = '2';
      FILE *f = fopen(file, "wb");
      if (!f || fwrite(buf, 1, n, f) != n) abort();
      fclose(f);
      free(buf);
    } else {
      snprintf(file, sizeof file, "%s/meta.json", bad);
    }
  }
  rf_comm_bcast(comm, file, sizeof file, RF_DTYPE_U8, 0);
  switch (what) {
    case BREAK_TRUNCATE:
      problem = "truncated";
      break;
    case BREAK_CORRUPT:
      problem = "checksum mismatch", check_phase = 0;
      break;
    case BREAK_MISSING:
      problem = "missing rank file";
      break;
    case BREAK_VERSION:
      problem = "format version 2 is newer than this build reads (1)";
      break;
    case BREAK_SHAPE:
      problem = "is f32 [50, 24] in the checkpoint, the model has f32 [51, 24]";
      break;
    case BREAK_EXTRA_TENSOR:
      problem = "'lm_head.weight' that the model does not have";
      break;
    case BREAK_NO_STATE:
      problem = "no optimizer state 'model.embed_tokens.weight.adam_w'";
      break;
    default:
      break;
  }
  uint64_t before = comm->rank == 0 ? dir_snapshot(bad) : 0;
  MPI_Barrier(MPI_COMM_WORLD);

  struct model md;
  struct rf_ckpt_state_desc states[N_S];
  model_init(&md, comm->world, comm->rank, load_mult, 99, 0);
  model_states(&md, states);
  if (what == BREAK_NO_STATE) states[1].suffix = ".adam_w";
  struct rf_ckpt_views_args a = args_of(&md, states, bad, comm);
  if (what == BREAK_SHAPE) md.views[0].shape[0] = 51, md.views[0].numel = 51 * 24;
  if (what == BREAK_EXTRA_TENSOR) a.n_views = N_T - 1; /* a model without lm_head */
  int rc = rf_ckpt_load_views(&a, NULL, NULL);
  const char *msg = rf_error_msg();
  int32_t named = rc != 0 && strstr(msg, file) && strstr(msg, problem);
  int32_t all_failed = rc != 0;
  rf_comm_allreduce(comm, &named, 1, RF_DTYPE_I32, RF_REDUCE_OP_MAX);
  rf_comm_allreduce(comm, &all_failed, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  RF_CHECK(all_failed, "breakage %d: a rank loaded the broken checkpoint", (int)what);
  RF_CHECK(named, "breakage %d: no rank said '%s' naming %s; rank %d says: %s", (int)what, problem, file,
           comm->rank, msg);
  if (rc != 0 && !strstr(msg, problem)) /* the others say that another rank failed */
    RF_CHECK(strstr(msg, "another rank failed") && strstr(msg, bad), "rank %d: %s", comm->rank, msg);
  if (check_phase) RF_CHECK(model_untouched(&md), "breakage %d: a refused load wrote into memory", (int)what);
  model_free(&md);
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm->rank == 0) {
    RF_CHECK(dir_snapshot(bad) == before, "breakage %d: the directory changed", (int)what);
    sh("rm -rf %s%s", bad, "");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  char root[64] = "/tmp/rf_test_ckpt_state.XXXXXX";
  if (rank == 0) RF_ASSERT(mkdtemp(root));
  rf_comm_bcast(&comm, root, sizeof root, RF_DTYPE_U8, 0);

  for (int k = 1; k <= world; k++) {
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, rank < k ? 0 : MPI_UNDEFINED, rank, &sub);
    if (rank < k) {
      rf_comm_init(&subs[k], sub);
      MPI_Comm_free(&sub);
    }
  }
  /* a save at the whole world loads at every k <= world; saves at 1 and at
   * world - 1 load at the whole world */
  const int save_worlds[3] = {world, 1, world - 1};
  for (int j = 0; j < 3; j++) {
    int ks = save_worlds[j];
    if (ks < 1 || (j > 0 && ks == world) || (j == 2 && ks == 1)) continue;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/saved-at-%d", root, ks);
    save_at(dir, ks, rank, 1000 + (uint64_t)ks);
    for (int kl = j == 0 ? 1 : world; kl <= world; kl++)
      load_at(dir, kl, rank, ks, 5000 + (uint64_t)(kl * 10 + ks));
  }

  char good[128];
  snprintf(good, sizeof good, "%s/saved-at-%d", root, world);
  device_save_load(root, good, &comm);
  for (int b = 0; b < BREAK_COUNT; b++) test_broken(root, good, &comm, (enum breakage)b);

  /* a state given twice (on one rank) fails the save on every rank; no marker */
  {
    struct model md;
    struct rf_ckpt_state_desc states[N_S];
    model_init(&md, world, rank, save_mult, 3, 1);
    model_states(&md, states);
    if (rank == world - 1) states[1].suffix = ".adam_m";
    char dir[128];
    snprintf(dir, sizeof dir, "%s/dup", root);
    struct rf_ckpt_views_args a = args_of(&md, states, dir, &comm);
    int rc = rf_ckpt_save_views(&a);
    RF_CHECK(rc != 0, "a save with a repeated state succeeded");
    if (rank == world - 1) RF_CHECK(strstr(rf_error_msg(), "given twice"), "%s", rf_error_msg());
    model_free(&md);
    char marker[160];
    snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
    RF_CHECK(access(marker, F_OK) != 0, "marker after a failed save");
  }

  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) sh("rm -rf %s%s", root, "");
  for (int k = 1; k <= world; k++)
    if (rank < k) rf_comm_free(&subs[k]);
  rf_comm_free(&comm);
  return rf_test_finish("test_ckpt_state");
}
