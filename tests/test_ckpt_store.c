/* rf-test: timeout=30
 * src/ckpt file layer, W ranks simulated in one process: save at W=4 with one
 * range split, load at W'=1,2,3,5 with other splits (bit-identical, reading only
 * the chunks needed); every broken input refused with a message naming the file and the problem, nothing on
 * disk changed by a failed load; a save that stops before the marker leaves the previous checkpoint loadable
 * and the partial one refused; rank files written with O_DIRECT (bounces of 1, 3 blocks and the default), on
 * disk and in /dev/shm, and with the buffered fallback, each the format's bytes built here. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "rf_test.h"

#define N_TENSORS 6
#define CHUNK 256

static char root[64];

/* The saved tensors: every element random bits, so any misplaced byte shows. */
struct tensor {
  const char *name;
  enum rf_dtype dtype;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel;
  uint8_t *data;
};
static struct tensor tensors[N_TENSORS] = {
    {"layers.0.attn.wq", RF_DTYPE_F32, 2, {37, 29}, 0, NULL},
    {"layers.0.mlp.w1.bf16", RF_DTYPE_BF16, 4, {3, 5, 7, 11}, 0, NULL},
    {"adam8.m.codes", RF_DTYPE_U8, 1, {5000}, 0, NULL},
    {"adam8.m.scales", RF_DTYPE_F32, 1, {20}, 0, NULL},
    {"norm.scalar", RF_DTYPE_F32, 0, {0}, 0, NULL},
    {"embed", RF_DTYPE_F32, 2, {400, 50}, 0, NULL},
};

static void make_tensors(void) {
  uint64_t rng = 42;
  for (int i = 0; i < N_TENSORS; i++) {
    struct tensor *t = &tensors[i];
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) t->numel *= t->shape[d];
    size_t bytes = (size_t)t->numel * rf_dtype_size(t->dtype);
    t->data = malloc(bytes);
    for (size_t b = 0; b < bytes; b++) t->data[b] = (uint8_t)rf_test_rand_u64(&rng);
  }
}

static const char *extra = "{\"rng\":[1,2,3],\"data_step\":17}";

/* The rank files' bounce buffer given to save() (NULL: the process's own). */
static void *save_bounce;
static size_t save_bounce_bytes;

static int agree_local(void *ctx, int status) { return *(int *)ctx ? -1 : status; }

/* Save as `world` ranks (ranks [0, stop) only when stop < world: a crash). */
static int save(const char *dir, int world, int stop, int64_t step, uint64_t seed, int finish) {
  for (int r = 0; r < world && r < stop; r++) {
    struct rf_ckpt_piece pieces[N_TENSORS];
    for (int i = 0; i < N_TENSORS; i++) {
      int64_t cuts[16];
      rf_test_random_cuts(tensors[i].numel, world, seed + (uint64_t)i, cuts);
      struct rf_ckpt_piece *p = &pieces[i];
      memset(p, 0, sizeof *p);
      p->name = tensors[i].name;
      p->dtype = tensors[i].dtype;
      p->ndim = tensors[i].ndim;
      memcpy(p->shape, tensors[i].shape, sizeof p->shape);
      p->begin = cuts[r];
      p->end = cuts[r + 1];
      p->data = tensors[i].data + (size_t)p->begin * rf_dtype_size(p->dtype);
    }
    struct rf_ckpt_save_args a = {.dir = dir,
                                  .rank = r,
                                  .world = world,
                                  .step = step,
                                  .extra_json = extra,
                                  .chunk_bytes = CHUNK,
                                  .n_pieces = N_TENSORS,
                                  .pieces = pieces,
                                  .bounce = save_bounce,
                                  .bounce_bytes = save_bounce_bytes};
    if (rf_ckpt_save_rank(&a) != 0) return -1;
  }
  return finish ? rf_ckpt_save_finish(dir, world, step, extra) : 0;
}

/* Loads every tensor as `world` ranks with a random split; 1 when bit-identical. */
static int load_and_compare(const char *dir, int world, uint64_t seed) {
  struct rf_ckpt ck;
  if (rf_ckpt_open(&ck, dir) != 0) {
    RF_CHECK(0, "open %s: %s", dir, rf_error_msg());
    return 0;
  }
  int ok = 1;
  for (int i = 0; i < N_TENSORS; i++) {
    struct tensor *t = &tensors[i];
    size_t es = rf_dtype_size(t->dtype);
    int64_t cuts[16];
    rf_test_random_cuts(t->numel, world, seed + (uint64_t)i, cuts);
    for (int r = 0; r < world; r++) {
      int64_t b = cuts[r], e = cuts[r + 1];
      uint8_t *buf = malloc((size_t)(e - b) * es + 1);
      uint64_t before = ck.bytes_read;
      int rc = rf_ckpt_read(&ck, t->name, t->dtype, t->ndim, t->shape, b, e, buf);
      RF_CHECK(rc == 0, "read %s [%lld, %lld): %s", t->name, (long long)b, (long long)e, rf_error_msg());
      int same = rc == 0 && memcmp(buf, t->data + (size_t)b * es, (size_t)(e - b) * es) == 0;
      RF_CHECK(same, "W'=%d rank %d: %s differs from what was saved", world, r, t->name);
      ok &= same;
      /* only the chunks overlapping the range: at most 2 partial chunks per saved range */
      uint64_t read = ck.bytes_read - before, need = (uint64_t)(e - b) * es;
      RF_CHECK(read <= need + 2 * CHUNK * 4, "%s: read %llu bytes for %llu", t->name,
               (unsigned long long)read, (unsigned long long)need);
      free(buf);
    }
  }
  cJSON *want = cJSON_Parse(extra);
  char *want_text = cJSON_PrintUnformatted(want);
  RF_CHECK(strcmp(ck.extra_json, want_text) == 0, "extra fields: %s", ck.extra_json);
  RF_CHECK(ck.step == 100, "step %lld", (long long)ck.step);
  free(want_text);
  cJSON_Delete(want);
  RF_CHECK(rf_ckpt_verify(&ck) == 0, "verify %s: %s", dir, rf_error_msg());
  rf_ckpt_close(&ck);
  return ok;
}

static void sys(const char *fmt, const char *a, const char *b) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  RF_ASSERT(system(cmd) == 0);
}

static void path_of(char *out, size_t cap, const char *dir, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

/* XXH3 over the names and contents of the files of a directory (sorted). */
static uint64_t dir_digest(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  RF_ASSERT(n >= 0);
  XXH3_state_t *h = XXH3_createState();
  XXH3_64bits_reset(h);
  for (int i = 0; i < n; i++) {
    char path[512], *buf;
    size_t len;
    path_of(path, sizeof path, dir, names[i]->d_name);
    XXH3_64bits_update(h, names[i]->d_name, strlen(names[i]->d_name));
    if (names[i]->d_type == DT_REG && rf_file_read_all(path, &buf, &len) == 0) {
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

/* A copy of the good checkpoint to break. */
static void fresh_copy(const char *good, const char *bad) {
  sys("rm -rf %s%s", bad, "");
  sys("cp -r %s %s", good, bad);
}

static void patch(const char *path, long offset, uint8_t xor_with) {
  FILE *f = rf_test_fopen(path, "r+b");
  RF_ASSERT(fseek(f, offset, SEEK_SET) == 0);
  int c = fgetc(f);
  RF_ASSERT(c != EOF && fseek(f, offset, SEEK_SET) == 0);
  fputc(c ^ xor_with, f);
  fclose(f);
}

static void replace_in_file(const char *path, const char *from, const char *to) {
  char *buf;
  size_t n;
  RF_ASSERT(rf_file_read_all(path, &buf, &n) == 0);
  char *at = strstr(buf, from);
  if (!at || strlen(from) != strlen(to)) abort();
  memcpy(at, to, strlen(to));
  FILE *f = rf_test_fopen(path, "wb");
  RF_ASSERT(fwrite(buf, 1, n, f) == n);
  fclose(f);
  free(buf);
}

/* Opening `dir` (and, if it opens, reading every tensor) fails with a message
 * naming `file` and `problem`; the directory is unchanged. */
static void expect_refused(const char *dir, const char *file, const char *problem, const char *what) {
  rf_error_clear();
  uint64_t before = dir_digest(dir);
  struct rf_ckpt ck;
  int rc = rf_ckpt_open(&ck, dir);
  if (rc == 0) {
    for (int i = 0; i < N_TENSORS && rc == 0; i++) {
      struct tensor *t = &tensors[i];
      uint8_t *buf = malloc((size_t)t->numel * rf_dtype_size(t->dtype));
      rc = rf_ckpt_read(&ck, t->name, t->dtype, t->ndim, t->shape, 0, t->numel, buf);
      free(buf);
    }
    rf_ckpt_close(&ck);
  }
  const char *msg = rf_error_msg();
  RF_CHECK(rc == -1, "%s: accepted", what);
  RF_CHECK(strstr(msg, file) != NULL, "%s: message does not name %s: %s", what, file, msg);
  RF_CHECK(strstr(msg, problem) != NULL, "%s: message does not say '%s': %s", what, problem, msg);
  RF_CHECK(dir_digest(dir) == before, "%s: a failed load changed the directory", what);
}

/* A byte in the middle of the largest range that rank `rank`'s file holds. */
static uint64_t byte_of_rank(const char *dir, int rank) {
  struct rf_ckpt ck;
  RF_ASSERT(rf_ckpt_open(&ck, dir) == 0);
  uint64_t best = 0, at = 0;
  for (int i = 0; i < ck.n_tensors; i++)
    for (int k = 0; k < ck.tensors[i].n_ranges; k++) {
      const struct rf_ckpt_range *r = &ck.tensors[i].ranges[k];
      uint64_t bytes = (uint64_t)(r->end - r->begin) * rf_dtype_size(ck.tensors[i].dtype);
      if (r->rank == rank && bytes > best) {
        best = bytes;
        at = r->offset + bytes / 2;
      }
    }
  rf_ckpt_close(&ck);
  RF_ASSERT(best > 0);
  return at;
}

static void test_bad_inputs(const char *good) {
  char bad[128], file[256];
  snprintf(bad, sizeof bad, "%s/bad", root);

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "COMPLETE");
  RF_ASSERT(unlink(file) == 0);
  expect_refused(bad, bad, "incomplete checkpoint", "missing marker");

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "rank-00002.bin");
  RF_ASSERT(truncate(file, 1000) == 0);
  expect_refused(bad, file, "truncated", "truncated rank file");

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "rank-00003.bin");
  RF_ASSERT(unlink(file) == 0);
  expect_refused(bad, file, "missing rank file", "missing rank file");

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "rank-00001.bin");
  patch(file, (long)byte_of_rank(good, 1), 0x10);
  expect_refused(bad, file, "checksum mismatch", "corrupted rank file");
  {
    /* the corruption is found by the chunk that holds it; other chunks read fine */
    struct rf_ckpt ck;
    RF_ASSERT(rf_ckpt_open(&ck, bad) == 0);
    RF_CHECK(rf_ckpt_verify(&ck) == -1 && strstr(rf_error_msg(), "checksum mismatch"), "verify finds it");
    rf_ckpt_close(&ck);
  }

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "rank-00000.bin");
  patch(file, 0, 0x01);
  expect_refused(bad, file, "bad magic", "bad rank file magic");

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "meta.json");
  replace_in_file(file, "\"version\":\t1", "\"version\":\t2");
  expect_refused(bad, file, "newer", "newer format version");

  fresh_copy(good, bad);
  path_of(file, sizeof file, bad, "meta.json");
  replace_in_file(file, "\"step\":\t100", "\"step\":\t900");
  expect_refused(bad, file, "metadata is corrupted", "edited metadata");

  /* another model: a missing tensor, another shape, another dtype */
  struct rf_ckpt ck;
  RF_ASSERT(rf_ckpt_open(&ck, good) == 0);
  float x[4];
  int64_t shape[2] = {37, 30};
  RF_CHECK(rf_ckpt_read(&ck, "layers.9.attn.wq", RF_DTYPE_F32, 2, shape, 0, 1, x) == -1 &&
               strstr(rf_error_msg(), "'layers.9.attn.wq' is not in the checkpoint") &&
               strstr(rf_error_msg(), good),
           "missing tensor: %s", rf_error_msg());
  RF_CHECK(rf_ckpt_read(&ck, "layers.0.attn.wq", RF_DTYPE_F32, 2, shape, 0, 1, x) == -1 &&
               strstr(rf_error_msg(), "shape [37, 29] in the checkpoint, [37, 30] was asked for"),
           "shape mismatch: %s", rf_error_msg());
  RF_CHECK(rf_ckpt_read(&ck, "layers.0.attn.wq", RF_DTYPE_BF16, 2, tensors[0].shape, 0, 1, x) == -1 &&
               strstr(rf_error_msg(), "is f32 in the checkpoint, bf16 was asked for"),
           "dtype mismatch: %s", rf_error_msg());
  RF_CHECK(rf_ckpt_read(&ck, "layers.0.attn.wq", RF_DTYPE_F32, 2, tensors[0].shape, 5, 2000, x) == -1 &&
               strstr(rf_error_msg(), "outside"),
           "range outside the tensor: %s", rf_error_msg());
  rf_ckpt_close(&ck);
  sys("rm -rf %s%s", bad, "");
}

static int count_markers(const char *dir) {
  char file[256];
  path_of(file, sizeof file, dir, "COMPLETE");
  return access(file, F_OK) == 0;
}

static void test_crash(const char *good) {
  char partial[128], file[256];
  snprintf(partial, sizeof partial, "%s/step-200", root);
  uint64_t good_digest = dir_digest(good);

  /* rank 3 dies: its temporary file is left half-written, it writes no index */
  RF_CHECK(save(partial, 4, 3, 200, 555, 0) == 0, "ranks 0..2 save: %s", rf_error_msg());
  path_of(file, sizeof file, partial, "rank-00003.bin.tmp.99999");
  RF_ASSERT(rf_file_write_all(file, "RFCKRANK half", 13) == 0);
  RF_CHECK(
      rf_ckpt_save_finish(partial, 4, 200, extra) == -1 && strstr(rf_error_msg(), "rank 3 did not finish"),
      "finish without rank 3 refused: %s", rf_error_msg());
  RF_CHECK(!count_markers(partial), "no marker after a failed finish");
  expect_refused(partial, partial, "incomplete checkpoint", "partial checkpoint");
  RF_CHECK(load_and_compare(good, 3, 77), "the previous checkpoint still loads after the crash");

  /* every rank wrote but rank 0 died before the marker */
  RF_CHECK(save(partial, 4, 4, 200, 555, 0) == 0, "all ranks save: %s", rf_error_msg());
  expect_refused(partial, partial, "incomplete checkpoint", "checkpoint without marker");
  /* the rerun completes it (the stale temporary file does not matter) */
  RF_CHECK(rf_ckpt_save_finish(partial, 4, 200, extra) == 0, "finish: %s", rf_error_msg());
  struct rf_ckpt ck;
  RF_CHECK(rf_ckpt_open(&ck, partial) == 0 && ck.step == 200, "completed checkpoint opens: %s",
           rf_error_msg());
  rf_ckpt_close(&ck);

  /* a save into a complete checkpoint is refused and changes nothing */
  RF_CHECK(save(good, 4, 4, 300, 1, 1) == -1 && strstr(rf_error_msg(), "already holds a complete checkpoint"),
           "overwrite refused: %s", rf_error_msg());
  RF_CHECK(dir_digest(good) == good_digest, "the refused save left the previous checkpoint unchanged");

  /* ranges that do not tile a tensor: overlap and gap */
  char odd[128];
  snprintf(odd, sizeof odd, "%s/odd", root);
  struct rf_ckpt_piece p = {.name = "t",
                            .dtype = RF_DTYPE_U8,
                            .ndim = 1,
                            .shape = {10},
                            .begin = 0,
                            .end = 6,
                            .data = tensors[2].data};
  struct rf_ckpt_save_args a = {.dir = odd, .rank = 0, .world = 2, .step = 1, .n_pieces = 1, .pieces = &p};
  RF_ASSERT(rf_ckpt_save_rank(&a) == 0);
  p.begin = 4;
  p.end = 10;
  a.rank = 1;
  RF_ASSERT(rf_ckpt_save_rank(&a) == 0);
  RF_CHECK(rf_ckpt_save_finish(odd, 2, 1, NULL) == -1 && strstr(rf_error_msg(), "overlaps"), "overlap: %s",
           rf_error_msg());
  p.begin = 7;
  RF_ASSERT(rf_ckpt_save_rank(&a) == 0);
  RF_CHECK(rf_ckpt_save_finish(odd, 2, 1, NULL) == -1 && strstr(rf_error_msg(), "[6, 7) are held by no rank"),
           "gap: %s", rf_error_msg());
  p.end = 11;
  RF_CHECK(rf_ckpt_save_rank(&a) == -1 && strstr(rf_error_msg(), "outside its 10 elements"), "bad range: %s",
           rf_error_msg());
  RF_CHECK(rf_ckpt_save_finish(odd, 2, 1, "[1,2]") == -1 && strstr(rf_error_msg(), "not a JSON object"),
           "extra must be an object");

  /* rf_ckpt_save with the agreement callback: a failure elsewhere means no marker */
  char one[128];
  snprintf(one, sizeof one, "%s/one", root);
  int other_failed = 1;
  p = (struct rf_ckpt_piece){.name = "t",
                             .dtype = RF_DTYPE_U8,
                             .ndim = 1,
                             .shape = {10},
                             .begin = 0,
                             .end = 10,
                             .data = tensors[2].data};
  a = (struct rf_ckpt_save_args){.dir = one,
                                 .rank = 0,
                                 .world = 1,
                                 .step = 5,
                                 .n_pieces = 1,
                                 .pieces = &p,
                                 .agree = agree_local,
                                 .agree_ctx = &other_failed};
  RF_CHECK(rf_ckpt_save(&a) == -1 && strstr(rf_error_msg(), "another rank failed"),
           "save with a failed rank");
  RF_CHECK(!count_markers(one), "no marker when a rank failed");
  other_failed = 0;
  RF_CHECK(rf_ckpt_save(&a) == 0, "save: %s", rf_error_msg());
  uint8_t back[10];
  int64_t shape[1] = {10};
  RF_CHECK(rf_ckpt_open(&ck, one) == 0 && rf_ckpt_read(&ck, "t", RF_DTYPE_U8, 1, shape, 0, 10, back) == 0 &&
               memcmp(back, tensors[2].data, 10) == 0 && strcmp(ck.extra_json, "{}") == 0,
           "W=1 save via rf_ckpt_save round-trips");
  rf_ckpt_close(&ck);
}

/* Rank r's file of save(dir, world, ..., step, seed) as docs/checkpoint.md lays it
 * out, built here byte by byte: the 64-byte header, then each piece on 64 bytes. */
static uint8_t *expected_rank_file(int world, int r, int64_t step, uint64_t seed, size_t *bytes) {
  size_t cap = 64;
  for (int i = 0; i < N_TENSORS; i++) cap += 64 + (size_t)tensors[i].numel * rf_dtype_size(tensors[i].dtype);
  uint8_t *f = calloc(cap, 1);
  size_t at = 64;
  for (int i = 0; i < N_TENSORS; i++) {
    int64_t cuts[16];
    rf_test_random_cuts(tensors[i].numel, world, seed + (uint64_t)i, cuts);
    size_t es = rf_dtype_size(tensors[i].dtype), n = (size_t)(cuts[r + 1] - cuts[r]) * es;
    at = (at + 63) / 64 * 64;
    memcpy(f + at, tensors[i].data + (size_t)cuts[r] * es, n);
    at += n;
  }
  uint64_t fields[5] = {1 | (uint64_t)r << 32, (uint64_t)world, (uint64_t)step, at,
                        0}; /* version|rank, world */
  memcpy(f, "RFCKRANK", 8);
  for (int k = 0; k < 4; k++)
    for (int b = 0; b < 8; b++) f[8 + 8 * k + b] = (uint8_t)(fields[k] >> (8 * b));
  *bytes = at;
  return f;
}

/* 1 when every rank file of `dir` (saved at W=4, step 100, seed 1000) is the
 * expected bytes. */
static int rank_files_expected(const char *dir) {
  int same = 1;
  for (int r = 0; r < 4; r++) {
    size_t want_n, got_n;
    uint8_t *want = expected_rank_file(4, r, 100, 1000, &want_n);
    char path[256], name[32], *got;
    snprintf(name, sizeof name, "rank-%05d.bin", r);
    path_of(path, sizeof path, dir, name);
    RF_ASSERT(rf_file_read_all(path, &got, &got_n) == 0);
    int ok = got_n == want_n && memcmp(got, want, want_n) == 0;
    RF_CHECK(ok, "%s: %zu bytes, not the %zu bytes the format lays out", path, got_n, want_n);
    same &= ok;
    free(got);
    free(want);
  }
  return same;
}

/* The rank files written with O_DIRECT through bounce buffers of 1 and 3 blocks
 * (full blocks flushed mid-piece, a tail under one block) and of the default size
 * (the whole file at commit), into a disk folder and into /dev/shm, and the
 * buffered fallback where the filesystem refuses O_DIRECT (simulated), at open and
 * at the first write (the open taken, the write EINVAL: a bounce of the default
 * size and of one block): every rank file the format's bytes, none counted as
 * direct, and every checkpoint loads at W'=3. */
static void test_direct_writer(const char *good) {
  int direct_here = rf_file_direct_files() >= 4; /* `good`'s four rank files */
  if (!direct_here) rf_test_not_run("%s's filesystem refuses O_DIRECT: only the fallback ran there", root);
  RF_CHECK(rank_files_expected(good), "the default bounce, %s", root);
  char shm[64] = "/dev/shm/rf_test_ckpt.XXXXXX";
  int have_shm = mkdtemp(shm) != NULL;
  if (!have_shm) rf_test_not_run("no /dev/shm here: the tmpfs saves");
  uint8_t *bounce = rf_xaligned(RF_FILE_DIRECT_ALIGN, 3 * RF_FILE_DIRECT_ALIGN);
  const struct {
    const char *where, *name;
    size_t bounce;
    int refuse;
  } cases[] = {{root, "direct-1", RF_FILE_DIRECT_ALIGN, 0},
               {root, "direct-3", 3 * RF_FILE_DIRECT_ALIGN, 0},
               {root, "refused", 0, 1},
               {root, "refused-at-write", 0, 2},
               {root, "refused-at-write-1", RF_FILE_DIRECT_ALIGN, 2},
               {shm, "shm", 0, 0},
               {shm, "shm-1", RF_FILE_DIRECT_ALIGN, 0},
               {shm, "shm-refused", 0, 1}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    if (cases[k].where == shm && !have_shm) continue;
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", cases[k].where, cases[k].name);
    save_bounce = cases[k].bounce ? bounce : NULL;
    save_bounce_bytes = cases[k].bounce;
    rf_file_test_refuse_direct(cases[k].refuse);
    uint64_t before = rf_file_direct_files();
    RF_CHECK(save(dir, 4, 4, 100, 1000, 1) == 0, "%s: save: %s", dir, rf_error_msg());
    rf_file_test_refuse_direct(0);
    uint64_t direct = rf_file_direct_files() - before;
    if (cases[k].refuse)
      RF_CHECK(direct == 0, "%s: %llu files written with O_DIRECT", dir, (unsigned long long)direct);
    if (!cases[k].refuse && cases[k].where == root && direct_here)
      RF_CHECK(direct == 4, "%s: %llu of 4 rank files written with O_DIRECT", dir,
               (unsigned long long)direct);
    RF_CHECK(rank_files_expected(dir), "%s", dir);
    RF_CHECK(load_and_compare(dir, 3, 3000), "%s: load at W'=3", dir);
  }
  save_bounce = NULL;
  save_bounce_bytes = 0;

  /* the writer itself: whole blocks out, a rewrite only of bytes still in the bounce */
  char path[128], *back;
  size_t n;
  path_of(path, sizeof path, root, "direct.bin");
  struct rf_file_writer w;
  RF_ASSERT(rf_file_writer_open_direct(&w, path, bounce, RF_FILE_DIRECT_ALIGN) == 0);
  const uint8_t *src = tensors[5].data; /* 80000 random bytes */
  RF_ASSERT(rf_file_writer_write(&w, src, 10000) == 0);
  RF_CHECK(w.flushed == 2 * RF_FILE_DIRECT_ALIGN, "flushed %llu after 10000 bytes",
           (unsigned long long)w.flushed);
  RF_CHECK(rf_file_writer_pwrite(&w, "x", 1, 0) != 0 && strstr(rf_error_msg(), "cannot rewrite bytes [0, 1)"),
           "a rewrite of flushed bytes refused: %s", rf_error_msg());
  RF_CHECK(rf_file_writer_pwrite(&w, src + 20000, 16, 9000) == 0, "a rewrite in the bounce: %s",
           rf_error_msg());
  RF_ASSERT(rf_file_writer_commit(&w) == 0);
  RF_ASSERT(rf_file_read_all(path, &back, &n) == 0);
  RF_CHECK(n == 10000 && memcmp(back, src, 9000) == 0 && memcmp(back + 9000, src + 20000, 16) == 0 &&
               memcmp(back + 9016, src + 9016, 10000 - 9016) == 0,
           "the direct writer's file: %zu bytes", n);
  free(back);
  free(bounce);
  if (have_shm) sys("rm -rf %s%s", shm, "");
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/rf_test_ckpt.XXXXXX");
  RF_ASSERT(mkdtemp(root));
  make_tensors();

  char good[128];
  snprintf(good, sizeof good, "%s/step-100", root);
  RF_CHECK(save(good, 4, 4, 100, 1000, 1) == 0, "save at W=4: %s", rf_error_msg());
  for (int w = 1; w <= 5; w++) RF_CHECK(load_and_compare(good, w, 2000 + (uint64_t)w), "load at W'=%d", w);
  test_direct_writer(good);
  test_bad_inputs(good);
  test_crash(good);

  for (int i = 0; i < N_TENSORS; i++) free(tensors[i].data);
  sys("rm -rf %s%s", root, "");
  return rf_test_finish("test_ckpt_store");
}
