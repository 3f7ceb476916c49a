/* rf-test: timeout=400
 * The CLI fault suite, part two (docs/reliability.md): what a run loads and what it
 * meets while it runs, through the real rfsdp binary at the W where each case was
 * found (issue 29). Every refusal is checked as in tests/test_cli_faults.c: the exit
 * code, one message (from the rank that saw the problem, never "another rank"), the
 * time bound, nothing changed on disk.
 *  - weights with a NaN or an infinity (--init, logits): refused at load naming the
 *    tensor, the element and the value, also when the element is on the last rank;
 *    an inf in a Mixtral router under --fp8 block;
 *  - a NaN or inf in a checkpoint with right checksums (a weight, an Adam v, an unused
 *    embedding row) refused at --resume by the rank that reads it and by ckpt export;
 *  - a diverging run (--lr 1e36): NaN activations are no undefined behaviour (this
 *    test runs under make test-asan), the run ends with "training diverged";
 *  - a damaged checkpoint range read by a rank >= 1 (W = 2, 3 with Shampoo, 2x2): that
 *    rank's message, naming the file and the tensor;
 *  - --resume of a missing folder says so; a Shampoo resume with another
 *    --shampoo-block names the block sizes;
 *  - Shampoo options without --optim shampoo, --collective-timeout below 1 s, ranks
 *    started with different options (MPMD), an --init file of a deeper model:
 *    refused naming the option or tensor; a resume with nothing to train says so;
 *  - a Mixtral or qwen3_moe file in the hub's per-expert layout (block_sparse_moe.experts.N.w1/w2/w3,
 *    mlp.experts.N.gate_proj/up_proj/down_proj) loads: the same logits, bit for bit, as the
 *    fused file it was split from; a stray expert or a tensor the model lacks is refused. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "ckpt/ckpt.h"
#include "core/core.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"

#define LIMIT_S 30

static char dir[64] = "/tmp/rf_test_cli_faults_load.XXXXXX";
static char model[128], moe[128], data[128];
/* `common` and the same for 3 steps and 1 (an option given twice is refused) */
static const char *common = "--steps 2 --batch 6 --seq 16 --peak-gflops 50 --print-every 0";
static const char *common3 = "--steps 3 --batch 6 --seq 16 --peak-gflops 50 --print-every 0";
static const char *common1 = "--steps 1 --batch 6 --seq 16 --peak-gflops 50 --print-every 0";

static void refused(int world, int want_rc, const char *prefix, const char *want, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void refused(int world, int want_rc, const char *prefix, const char *want, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rf_cli_vrefused(dir, LIMIT_S, world, want_rc, prefix, want, fmt, ap);
  va_end(ap);
}

/* ---- safetensors files made from an export ---- */

#define ST_MAX 128
struct st_tensors {
  int n;
  struct rf_safetensors_decl decl[ST_MAX];
  char name[ST_MAX][128];
  float *data[ST_MAX];
};

static int64_t st_numel(const struct rf_safetensors_decl *d) {
  int64_t numel = 1;
  for (int i = 0; i < d->ndim; i++) numel *= d->shape[i];
  return numel;
}

static void st_load(struct st_tensors *t, const char *path) {
  struct rf_safetensors_file f;
  RF_ASSERT(rf_safetensors_open(&f, path) == 0);
  RF_ASSERT(f.n_tensors <= ST_MAX);
  t->n = f.n_tensors;
  for (int i = 0; i < f.n_tensors; i++) {
    const struct rf_safetensors_tensor *x = &f.tensors[i];
    snprintf(t->name[i], sizeof t->name[i], "%s", x->name);
    t->decl[i] = (struct rf_safetensors_decl){t->name[i], RF_SAFETENSORS_DTYPE_F32, x->ndim, {0}};
    memcpy(t->decl[i].shape, x->shape, sizeof x->shape);
    t->data[i] = rf_xmalloc((size_t)x->numel * sizeof(float));
    RF_ASSERT(rf_safetensors_read_f32(&f, x->name, 0, x->numel, t->data[i]) == 0);
  }
  rf_safetensors_close(&f);
}

static void st_save(const struct st_tensors *t, const char *path) {
  struct rf_safetensors_writer w;
  RF_ASSERT(rf_safetensors_writer_open(&w, path, t->n, t->decl, NULL) == 0);
  for (int i = 0; i < t->n; i++)
    RF_ASSERT(rf_safetensors_writer_write_f32(&w, t->data[i], st_numel(&t->decl[i])) == 0);
  RF_ASSERT(rf_safetensors_writer_commit(&w) == 0);
}

static void st_free(struct st_tensors *t) {
  for (int i = 0; i < t->n; i++) free(t->data[i]);
  t->n = 0;
}

static int st_find(const struct st_tensors *t, const char *name) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->name[i], name) == 0) return i;
  RF_ASSERT(!"tensor not in the file");
  return -1;
}

/* `in` with element `at` of tensor `name` set to `value`, written to `out`. */
static void st_poison(const char *in, const char *out, const char *name, int64_t at, float value) {
  static struct st_tensors t;
  st_load(&t, in);
  t.data[st_find(&t, name)][at] = value;
  st_save(&t, out);
  st_free(&t);
}

/* Trains `cfg` for 2 steps at W=1 into DIR/ck-TAG and exports the last checkpoint to DIR/TAG.safetensors. */
static void make_export(const char *cfg, const char *tag, const char *extra, char *path, size_t cap) {
  char out[16384];
  rf_cli_works(1, out, sizeof out, "train --model %s --data %s %s %s --ckpt-dir %s/ck-%s --save-every 2", cfg,
               data, common, extra, dir, tag);
  snprintf(path, cap, "%s/%s.safetensors", dir, tag);
  rf_cli_works(0, out, sizeof out, "ckpt export %s/ck-%s/step-00000002 --out %s", dir, tag, path);
}

/* ---- checkpoints damaged as a diverging run writes them (checksums right) ---- */

/* Replaces the first `old` in file `path` by `new` (same length). */
static void file_replace(const char *path, const char *old, const char *new) {
  char *text;
  size_t n;
  RF_ASSERT(rf_file_read_all(path, &text, &n) == 0 && strlen(old) == strlen(new));
  char *at = strstr(text, old);
  RF_ASSERT(at);
  memcpy(at, new, strlen(new));
  RF_ASSERT(rf_file_write_all(path, text, n) == 0);
  free(text);
}

/* Sets f32 element `at` of tensor `name` of checkpoint `ck` to `value`, rewriting the
 * chunk's checksum in meta.json and meta.json's in COMPLETE, as a job that saved the
 * value would have written them. */
static void ck_poison(const char *ckdir, const char *name, int64_t at, float value) {
  struct rf_ckpt ck;
  RF_ASSERT(rf_ckpt_open(&ck, ckdir) == 0);
  const struct rf_ckpt_tensor *t = rf_ckpt_find(&ck, name);
  RF_ASSERT(t && t->dtype == RF_DTYPE_F32);
  const struct rf_ckpt_range *r = NULL;
  for (int k = 0; k < t->n_ranges; k++)
    if (at >= t->ranges[k].begin && at < t->ranges[k].end) r = &t->ranges[k];
  RF_ASSERT(r);
  char bin[300], meta[300], marker[300], old_hex[17], new_hex[17];
  rf_ckpt_rank_path(bin, sizeof bin, ckdir, r->rank, "bin");
  char *bytes;
  size_t n;
  RF_ASSERT(rf_file_read_all(bin, &bytes, &n) == 0);
  int64_t rel = (at - r->begin) * 4, c = rel / ck.chunk_bytes;
  memcpy(bytes + r->offset + rel, &value, 4);
  int64_t len = rf_min_i64(ck.chunk_bytes, (r->end - r->begin) * 4 - c * ck.chunk_bytes);
  snprintf(old_hex, sizeof old_hex, "%016" PRIx64, r->xxh3[c]);
  snprintf(new_hex, sizeof new_hex, "%016" PRIx64,
           (uint64_t)XXH3_64bits(bytes + r->offset + c * ck.chunk_bytes, (size_t)len));
  RF_ASSERT(rf_file_write_all(bin, bytes, n) == 0);
  free(bytes);
  rf_ckpt_close(&ck);
  snprintf(meta, sizeof meta, "%s/%s", ckdir, RF_CKPT_META);
  snprintf(marker, sizeof marker, "%s/%s", ckdir, RF_CKPT_MARKER);
  RF_ASSERT(rf_file_read_all(meta, &bytes, &n) == 0);
  char meta_old[17], meta_new[17];
  snprintf(meta_old, sizeof meta_old, "%016" PRIx64, (uint64_t)XXH3_64bits(bytes, n));
  free(bytes);
  file_replace(meta, old_hex, new_hex);
  RF_ASSERT(rf_file_read_all(meta, &bytes, &n) == 0);
  snprintf(meta_new, sizeof meta_new, "%016" PRIx64, (uint64_t)XXH3_64bits(bytes, n));
  free(bytes);
  file_replace(marker, meta_old, meta_new);
}

/* ---- the cases ---- */

/* NaN and inf weights: refused where they are read, the tensor and element named. */
static void check_nonfinite_init(void) {
  char clean[200], nan_head[200], inf_emb[200], tokens[200];
  make_export(model, "dense", "", clean, sizeof clean);
  snprintf(nan_head, sizeof nan_head, "%s/nan_head.safetensors", dir);
  snprintf(inf_emb, sizeof inf_emb, "%s/inf_emb.safetensors", dir);
  /* the last element of the head: on the last rank at every W */
  st_poison(clean, nan_head, "lm_head.weight", 256 * 32 - 1, NAN);
  st_poison(clean, inf_emb, "model.embed_tokens.weight", 3 * 32 + 5, -INFINITY);
  const char *t = "rfsdp train:";
  for (int w = 1; w <= 3; w += 2)
    refused(w, 1, t, "nan_head.safetensors|'lm_head.weight' element 8191 [255, 31] is nan",
            "train --model %s --data %s %s --init %s", model, data, common, nan_head);
  refused(2, 1, t, "inf_emb.safetensors|'model.embed_tokens.weight' element 101 [3, 5] is -inf",
          "train --model %s --data %s %s --init %s", model, data, common, inf_emb);
  /* logits prints NaN logits no more */
  snprintf(tokens, sizeof tokens, "%s/tokens.i32", dir);
  int32_t ids[16];
  for (int i = 0; i < 16; i++) ids[i] = (i * 37) % 256;
  RF_ASSERT(rf_file_write_all(tokens, ids, sizeof ids) == 0);
  refused(2, 1, "rfsdp logits:", "nan_head.safetensors|'lm_head.weight' element 8191|nan",
          "logits --model %s --weights %s --tokens %s --seq 16 --out %s/l.f32", model, nan_head, tokens, dir);
  /* an inf in a router (no FP8 quantization reaches it) under --fp8 block */
  char moe_clean[200], inf_router[200];
  make_export(moe, "moe", "", moe_clean, sizeof moe_clean);
  snprintf(inf_router, sizeof inf_router, "%s/inf_router.safetensors", dir);
  st_poison(moe_clean, inf_router, "model.layers.1.mlp.gate.weight", 4 * 32 + 7, INFINITY);
  refused(2, 1, t, "inf_router.safetensors|'model.layers.1.mlp.gate.weight' element 135 [4, 7] is inf",
          "train --model %s --data %s %s --fp8 block --init %s", moe, data, common, inf_router);
}

/* NaN and inf in a checkpoint (issue 37 item 4), checksums right: refused at --resume
 * by the rank whose range holds it (the last rank's range, W = 2 and 3), an Adam
 * second moment, an embedding row the data never reaches; `ckpt export` refuses
 * it and leaves no output (rfsdp's own --init refused the file it wrote). */
static void check_nonfinite_resume(void) {
  char out[16384];
  const char *t = "rfsdp train:";
  for (int w = 2; w <= 3; w++) {
    char ck[200], step[220], want[300];
    snprintf(ck, sizeof ck, "%s/ck-nan%d", dir, w);
    rf_cli_works(w, out, sizeof out, "train --model %s --data %s %s --ckpt-dir %s --save-every 2", model,
                 data, common, ck);
    snprintf(step, sizeof step, "%s/step-00000002", ck);
    ck_poison(step, "lm_head.weight", 256 * 32 - 1, NAN);
    snprintf(want, sizeof want, "rank-%05d.bin|tensor 'lm_head.weight' element 8191 [255, 31] is nan", w - 1);
    refused(w, 1, t, want, "train --model %s --data %s %s --resume %s", model, data, common3, ck);
    refused(0, 1, "rfsdp ckpt export:", want, "ckpt export %s --out %s/nan%d.safetensors", step, dir, w);
    struct stat st;
    snprintf(want, sizeof want, "%s/nan%d.safetensors", dir, w);
    RF_CHECK(stat(want, &st) != 0, "ckpt export of a NaN checkpoint left %s", want);
  }
  /* an Adam second moment; an inf in an embedding row no token of the data reaches (byte 255) */
  char ck[200], step[220];
  snprintf(ck, sizeof ck, "%s/ck-nanv", dir);
  rf_cli_works(3, out, sizeof out, "train --model %s --data %s %s --ckpt-dir %s --save-every 2", model, data,
               common, ck);
  snprintf(step, sizeof step, "%s/step-00000002", ck);
  ck_poison(step, "model.layers.0.mlp.gate_proj.weight.adamw.v", 45, NAN); /* rank 1's range */
  refused(3, 1, t,
          "rank-00001.bin|tensor 'model.layers.0.mlp.gate_proj.weight.adamw.v' element 45 [1, 13] is nan",
          "train --model %s --data %s %s --resume %s", model, data, common3, ck);
  snprintf(ck, sizeof ck, "%s/ck-infe", dir);
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --ckpt-dir %s --save-every 2", model, data,
               common, ck);
  snprintf(step, sizeof step, "%s/step-00000002", ck);
  ck_poison(step, "model.embed_tokens.weight", 255 * 32 + 3, INFINITY);
  refused(2, 1, t, "tensor 'model.embed_tokens.weight' element 8163 [255, 3] is inf",
          "train --model %s --data %s %s --resume %s", model, data, common3, ck);
}

/* A save killed mid-write left its temporary files in the step's folder: the resumed
 * run's save of that step removes them (issue 37 item 9: they doubled the
 * checkpoint's size), and only them (another name, a live process's, kept). W = 2. */
static void check_stale_tmp(void) {
  char out[16384], ck[200], step4[220], path[400];
  snprintf(ck, sizeof ck, "%s/ck-stale", dir);
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --ckpt-dir %s --save-every 2", model, data,
               common, ck);
  pid_t gone = fork(); /* a process that is gone: the killed writer */
  if (gone == 0) _exit(0);
  RF_ASSERT(gone > 0 && waitpid(gone, NULL, 0) == gone);
  snprintf(step4, sizeof step4, "%s/step-00000004", ck);
  RF_ASSERT(mkdir(step4, 0755) == 0);
  const char *stale[] = {"rank-00000.bin.tmp.%d", "rank-00001.bin.tmp.%d", "meta.json.tmp.%d"};
  const char *kept[] = {"rank-00000.bin.tmp.%d", "notes.tmp.%d", "rank-00001.bin.tmp.x%d"};
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/", step4);
    size_t at = strlen(path);
    snprintf(path + at, sizeof path - at, stale[i], (int)gone);
    RF_ASSERT(rf_file_write_all(path, "partial", 7) == 0);
    snprintf(path + at, sizeof path - at, kept[i], i == 0 ? (int)getpid() : (int)gone);
    RF_ASSERT(rf_file_write_all(path, "other", 5) == 0);
  }
  rf_cli_works(2, out, sizeof out,
               "train --model %s --data %s --steps 4 --batch 6 --seq 16 --peak-gflops 50 "
               "--print-every 0 --ckpt-dir %s --save-every 2 --resume %s",
               model, data, ck, ck);
  struct stat st;
  snprintf(path, sizeof path, "%s/COMPLETE", step4);
  RF_CHECK(stat(path, &st) == 0, "the resumed run did not complete step 4\n%s", out);
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof path, "%s/", step4);
    size_t at = strlen(path);
    snprintf(path + at, sizeof path - at, stale[i], (int)gone);
    RF_CHECK(stat(path, &st) != 0, "the killed writer's %s was kept", path);
    snprintf(path + at, sizeof path - at, kept[i], i == 0 ? (int)getpid() : (int)gone);
    RF_CHECK(stat(path, &st) == 0, "%s, not a gone writer's, was removed", path);
    unlink(path); /* the later cases check that no temporary file is left */
  }
}

/* A run that diverges: NaN through every op (no undefined behaviour under make
 * test-asan), skipped steps, then the stop. */
static void check_diverging(void) {
  char out[16384];
  int rc = rf_cli_run_mpi(out, sizeof out, 2, LIMIT_S * 2,
                          "train --model %s --data %s --steps 12 --batch 6 --seq 16 --peak-gflops 50 "
                          "--print-every 1 --warmup 0 --lr 1e36",
                          model, data);
  RF_CHECK(rc == 1 && rf_cli_count_lines(out, "rfsdp train:") == 1 && strstr(out, "training diverged") &&
               !strstr(out, "runtime error") && !strstr(out, "Sanitizer"),
           "--lr 1e36: exit %d\n%s", rc, out);
  /* shorter than the 5 skipped steps that stop it: the run says it ended on skipped steps */
  rc = rf_cli_run_mpi(
      out, sizeof out, 2, LIMIT_S * 2,
      "train --model %s --data %s --steps 3 --batch 6 --seq 16 --peak-gflops 50 --print-every 1 "
      "--warmup 0 --lr 1e36",
      model, data);
  RF_CHECK(rc == 0 && strstr(out, "warning: the run ended on 2 skipped steps") && strstr(out, "of step 1;") &&
               !strstr(out, "runtime error"),
           "--lr 1e36 --steps 3: exit %d\n%s", rc, out);
}

/* A checkpoint whose range of rank R's file is damaged: the rank that reads it (R >= 1)
 * is the one heard, naming the file and the tensor. */
static void check_damaged_range(int world, const char *extra, const char *tag) {
  char out[16384], bin[300];
  int shard = strstr(extra, "--replicate 2") ? world / 2 : world;
  const char *base =
      strstr(extra, "--batch") ? "--steps 2 --seq 16 --peak-gflops 50 --print-every 0" : common;
  const char *base3 =
      strstr(extra, "--batch") ? "--steps 3 --seq 16 --peak-gflops 50 --print-every 0" : common3;
  rf_cli_works(world, out, sizeof out, "train --model %s --data %s %s %s --ckpt-dir %s/ck-%s --save-every 2",
               model, data, base, extra, dir, tag);
  snprintf(bin, sizeof bin, "%s/ck-%s/step-00000002/rank-%05d.bin", dir, tag, shard - 1);
  char *bytes;
  size_t n;
  RF_ASSERT(rf_file_read_all(bin, &bytes, &n) == 0 && n > 80);
  bytes[72] ^= 0x10; /* the first data bytes after the 64-byte header */
  RF_ASSERT(rf_file_write_all(bin, bytes, n) == 0);
  free(bytes);
  char want[300];
  snprintf(want, sizeof want, "rank-%05d.bin|checksum mismatch in tensor '", shard - 1);
  refused(world, 1, "rfsdp train:", want, "train --model %s --data %s %s %s --resume %s/ck-%s", model, data,
          base3, extra, dir, tag);
}

/* Resumes that blame the right thing: a mistyped path, another --shampoo-block (the
 * Shampoo checkpoint of check_damaged_range at W = 3: its block size is read before
 * any data). */
static void check_resume_mistakes(void) {
  const char *t = "rfsdp train:";
  refused(2, 1, t, "ck-nowhere: no such directory", "train --model %s --data %s %s --resume %s/ck-nowhere",
          model, data, common, dir);
  refused(3, 1, t, "saved with Shampoo blocks of side 1024, this run uses 8 (--shampoo-block)",
          "train --model %s --data %s %s --optim shampoo --shampoo-block 8 --resume %s/ck-d3", model, data,
          common3, dir);
}

/* The smaller mistakes (issue 29 item 8): options of an optimizer the run does not
 * use, a watchdog limit no healthy collective meets, ranks started with different
 * options (MPMD: the first differing option named by the rank that has it), an --init
 * file of a deeper model, a resume with nothing left to train. */
static void check_run_mistakes(void) {
  const char *t = "rfsdp train:";
  char out[16384], shallow[200];
  refused(1, 2, t, "--shampoo-block is an option of --optim shampoo; this run's optimizer is adamw",
          "train --model %s --data %s %s --shampoo-block 8", model, data, common);
  refused(2, 2, t, "--collective-timeout 0.001: at least 1 second",
          "train --model %s --data %s %s --collective-timeout 0.001", model, data, common);
  refused(1, 2, t,
          "rank 1 was started with other options than rank 0: rank 1 has --lr 0.01, rank 0 has --lr 0.002",
          "train --model %s --data %s %s --lr 0.002 : -np 1 %s train --model %s --data %s %s --lr 0.01",
          model, data, common, rf_cli_binary(), model, data, common);
  /* round 4 named --collective-timeout for an --fp8 block on rank 0 only; the order given does not matter */
  refused(1, 2, t,
          "rank 1 was started with other options than rank 0: rank 0 has --fp8 block, rank 1 does not",
          "train --model %s --data %s %s --fp8 block --collective-timeout 60 : -np 1 %s train --model %s "
          "--data %s "
          "%s --collective-timeout 60",
          model, data, common, rf_cli_binary(), model, data, common);
  refused(1, 2, t,
          "rank 1 was started with other options than rank 0: rank 1 has --async-save, rank 0 does not",
          "train --model %s --data %s %s : -np 1 %s train --model %s --data %s %s --async-save", model, data,
          common, rf_cli_binary(), model, data, common);
  rf_cli_works(
      1, out, sizeof out,
      "train --model %s --data %s %s --lr 0.002 --seed 3 : -np 1 %s train --model %s --seed 3 --data %s "
      "%s --lr 0.002",
      model, data, common, rf_cli_binary(), model, data, common);
  snprintf(shallow, sizeof shallow, "%s/shallow.json", dir);
  const char *one =
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40, "
      "\"num_hidden_layers\": 1, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5}";
  RF_ASSERT(rf_file_write_all(shallow, one, strlen(one)) == 0);
  refused(2, 1, t, "dense.safetensors|'model.layers.1.|is of layer 1, the model has 1 layers",
          "train --model %s --data %s %s --init %s/dense.safetensors", shallow, data, common, dir);
  rf_cli_works(2, out, sizeof out, "train --model %s --data %s %s --resume %s/ck-dense", model, data, common,
               dir);
  RF_CHECK(strstr(out, "nothing to train: the checkpoint is at step 2, which is --steps"),
           "a resume at --steps says nothing\n%s", out);
  /* the banner says when FP8 is on */
  rf_cli_works(1, out, sizeof out, "train --model %s --data %s %s --fp8 block", model, data, common1);
  RF_CHECK(strstr(out, "compute f32, FP8 block (e4m3 linear weights) on"), "the banner does not say FP8:\n%s",
           out);
}

/* `in` (a fused export) split into a hub layout the way transformers' conversion fuses
 * it (gate_up_proj[e] = [gate[e]; up[e]], down_proj[e] = down[e]): qwen3 = 0 gives
 * Mixtral's block_sparse_moe.experts.N.w1/w3/w2 and block_sparse_moe.gate, qwen3 = 1
 * qwen3_moe's mlp.experts.N.gate_proj/up_proj/down_proj and mlp.gate. */
static void hub_split(const struct st_tensors *in, struct st_tensors *out, int qwen3) {
  const int64_t experts = 8, inter = 32, hidden = 32;
  static const char *const names[2][3] = {{"w1", "w3", "w2"}, {"gate_proj", "up_proj", "down_proj"}};
  const char *moe = qwen3 ? "mlp" : "block_sparse_moe";
  out->n = 0;
  for (int i = 0; i < in->n; i++) {
    const char *name = in->name[i];
    const char *gu = strstr(name, ".mlp.experts.gate_up_proj"), *dn = strstr(name, ".mlp.experts.down_proj");
    const char *router = strstr(name, ".mlp.gate.weight");
    int pre = (int)((gu ? gu : dn ? dn : router ? router : name) - name);
    if (!gu && !dn) { /* the router renamed, the rest as it is */
      RF_ASSERT(out->n < ST_MAX);
      if (router)
        snprintf(out->name[out->n], sizeof out->name[out->n], "%.*s.%s.gate.weight", pre, name, moe);
      else
        snprintf(out->name[out->n], sizeof out->name[out->n], "%s", name);
      out->decl[out->n] = in->decl[i];
      out->decl[out->n].name = out->name[out->n];
      size_t bytes = (size_t)st_numel(&in->decl[i]) * sizeof(float);
      out->data[out->n] = rf_xmalloc(bytes);
      memcpy(out->data[out->n], in->data[i], bytes);
      out->n++;
      continue;
    }
    for (int64_t e = 0; e < experts; e++)
      for (int part = 0; part < (gu ? 2 : 1); part++) {
        RF_ASSERT(out->n < ST_MAX);
        const char *w = names[qwen3][dn ? 2 : part];
        snprintf(out->name[out->n], sizeof out->name[out->n], "%.*s.%s.experts.%d.%s.weight", pre, name, moe,
                 (int)e, w);
        int64_t rows = dn ? hidden : inter, cols = dn ? inter : hidden;
        out->decl[out->n] =
            (struct rf_safetensors_decl){out->name[out->n], RF_SAFETENSORS_DTYPE_F32, 2, {rows, cols}};
        out->data[out->n] = rf_xmalloc((size_t)(rows * cols) * sizeof(float));
        const float *src = in->data[i] + (size_t)(e * (gu ? 2 * inter : hidden) * (gu ? hidden : inter)) +
                           (size_t)(part * inter * hidden);
        memcpy(out->data[out->n], src, (size_t)(rows * cols) * sizeof(float));
        out->n++;
      }
  }
}

/* `in` with tensor `copy`'s data added under `name`, written to `path`. */
static void st_save_with(const char *in, const char *path, const char *copy, const char *name) {
  static struct st_tensors t;
  st_load(&t, in);
  RF_ASSERT(t.n < ST_MAX);
  int from = st_find(&t, copy);
  snprintf(t.name[t.n], sizeof t.name[t.n], "%s", name);
  t.decl[t.n] = t.decl[from];
  t.decl[t.n].name = t.name[t.n];
  size_t bytes = (size_t)st_numel(&t.decl[from]) * sizeof(float);
  t.data[t.n] = rf_xmalloc(bytes);
  memcpy(t.data[t.n], t.data[from], bytes);
  t.n++;
  st_save(&t, path);
  st_free(&t);
}

/* The hub's Mixtral layout (block_sparse_moe.experts.N.w1/w2/w3) and qwen3_moe's
 * (mlp.experts.N.gate_proj/up_proj/down_proj), split from the fused export, give the
 * same logits bit for bit (W = 2 and 3); a hub file missing one expert is refused
 * naming it; a stray expert beyond the config's 8 (round 4: loaded with rc 0) or a
 * tensor the model does not have is refused naming the file and the tensor, at W = 2
 * and 3 (the same decision on every rank). */
static void check_hub_layout(void) {
  char fused[200], hub[200], qwen[200], partial[200], tokens[200];
  snprintf(fused, sizeof fused, "%s/moe.safetensors", dir);
  snprintf(hub, sizeof hub, "%s/moe_hub.safetensors", dir);
  snprintf(qwen, sizeof qwen, "%s/moe_qwen.safetensors", dir);
  snprintf(partial, sizeof partial, "%s/moe_hub_partial.safetensors", dir);
  snprintf(tokens, sizeof tokens, "%s/tokens.i32", dir);
  static struct st_tensors in, out;
  st_load(&in, fused);
  hub_split(&in, &out, 1);
  st_save(&out, qwen);
  st_free(&out);
  hub_split(&in, &out, 0);
  st_save(&out, hub);
  /* the same without expert 5's w3 of layer 0 */
  int drop = st_find(&out, "model.layers.0.block_sparse_moe.experts.5.w3.weight");
  free(out.data[drop]);
  for (int i = drop; i + 1 < out.n; i++) {
    out.decl[i] = out.decl[i + 1];
    memcpy(out.name[i], out.name[i + 1], sizeof out.name[i]);
    out.decl[i].name = out.name[i];
    out.data[i] = out.data[i + 1];
  }
  out.n--;
  st_save(&out, partial);
  st_free(&out);
  st_free(&in);

  char msg[16384];
  float *l[3];
  size_t bytes[3];
  const char *files[3] = {fused, hub, qwen};
  for (int k = 0; k < 3; k++) {
    rf_cli_works(k == 2 ? 3 : 2, msg, sizeof msg,
                 "logits --model %s --weights %s --tokens %s --seq 16 --out %s/l%d.f32", moe, files[k],
                 tokens, dir, k);
    char path[200];
    snprintf(path, sizeof path, "%s/l%d.f32", dir, k);
    RF_ASSERT(rf_file_read_all(path, (char **)&l[k], &bytes[k]) == 0);
  }
  for (int k = 1; k < 3; k++)
    RF_CHECK(
        bytes[0] == bytes[k] && bytes[0] == 16 * 256 * sizeof(float) && memcmp(l[0], l[k], bytes[0]) == 0,
        "the %s layout's logits differ from the fused file's", k == 1 ? "mixtral" : "qwen3_moe");
  free(l[0]), free(l[1]), free(l[2]);
  /* a stray expert 8 of 8 (round 4: loaded with rc 0), in either layout, at W = 2 and 3 */
  char stray[200];
  snprintf(stray, sizeof stray, "%s/moe_hub_stray.safetensors", dir);
  st_save_with(hub, stray, "model.layers.1.block_sparse_moe.experts.0.w1.weight",
               "model.layers.1.block_sparse_moe.experts.8.w1.weight");
  refused(2, 1, "rfsdp train:",
          "moe_hub_stray.safetensors: tensor 'model.layers.1.block_sparse_moe.experts.8.w1.weight' is of "
          "expert 8, the model has 8 experts",
          "train --model %s --data %s %s --init %s", moe, data, common, stray);
  snprintf(stray, sizeof stray, "%s/moe_qwen_stray.safetensors", dir);
  st_save_with(qwen, stray, "model.layers.0.mlp.experts.7.down_proj.weight",
               "model.layers.0.mlp.experts.8.down_proj.weight");
  refused(
      3, 1, "rfsdp logits:",
      "moe_qwen_stray.safetensors: tensor 'model.layers.0.mlp.experts.8.down_proj.weight' is of expert 8, "
      "the model has 8 experts",
      "logits --model %s --weights %s --tokens %s --seq 16 --out %s/l9.f32", moe, stray, tokens, dir);
  refused(3, 1, "rfsdp train:", "moe_qwen_stray.safetensors|experts.8.down_proj.weight' is of expert 8",
          "train --model %s --data %s %s --init %s", moe, data, common, stray);
  /* a tensor the model does not have, in the fused file, and the per-expert name in a fused file */
  snprintf(stray, sizeof stray, "%s/moe_extra.safetensors", dir);
  st_save_with(fused, stray, "model.norm.weight", "model.layers.0.self_attn.extra_norm.weight");
  refused(3, 1, "rfsdp train:",
          "moe_extra.safetensors: tensor 'model.layers.0.self_attn.extra_norm.weight' is not one the model "
          "has",
          "train --model %s --data %s %s --init %s", moe, data, common, stray);
  snprintf(stray, sizeof stray, "%s/moe_both.safetensors", dir);
  st_save_with(fused, stray, "model.norm.weight", "model.layers.1.mlp.experts.3.up_proj.weight");
  refused(
      2, 1, "rfsdp train:",
      "moe_both.safetensors: tensor 'model.layers.1.mlp.experts.3.up_proj.weight' is not one the model has",
      "train --model %s --data %s %s --init %s", moe, data, common, stray);
  refused(2, 1,
          "rfsdp train:", "moe_hub_partial.safetensors|model.layers.0.block_sparse_moe.experts.5.w3.weight",
          "train --model %s --data %s %s --init %s", moe, data, common, partial);
  /* a NaN in a hub file named as the file names it (round 4: the fused name, a tensor the file does not have)
   */
  char nan_hub[200];
  snprintf(nan_hub, sizeof nan_hub, "%s/moe_hub_nan.safetensors", dir);
  st_poison(hub, nan_hub, "model.layers.1.block_sparse_moe.experts.2.w2.weight", 10, NAN);
  refused(2, 1, "rfsdp train:",
          "moe_hub_nan.safetensors: tensor 'model.layers.1.block_sparse_moe.experts.2.w2.weight' element 10 "
          "[0, 10] "
          "is nan",
          "train --model %s --data %s %s --init %s", moe, data, common, nan_hub);
}

int main(void) {
  RF_ASSERT(mkdtemp(dir));
  char text[128], out[16384];
  snprintf(model, sizeof model, "%s/tiny.json", dir);
  snprintf(moe, sizeof moe, "%s/moe.json", dir);
  snprintf(data, sizeof data, "%s/data", dir);
  snprintf(text, sizeof text, "%s/text.txt", dir);
  rf_cli_write_verses(text, 100000);
  rf_cli_write_tiny_model(model);
  const char *mixtral =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 32, \"intermediate_size\": 32, "
      "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
      "\"vocab_size\": 256, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5, "
      "\"num_local_experts\": 8, \"num_experts_per_tok\": 2}";
  RF_ASSERT(rf_file_write_all(moe, mixtral, strlen(mixtral)) == 0);
  rf_cli_works(0, out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);

  check_nonfinite_init();
  check_nonfinite_resume();
  check_stale_tmp();
  check_diverging();
  check_damaged_range(2, "", "d2");
  check_damaged_range(3, "--optim shampoo", "d3");
  check_damaged_range(4, "--replicate 2 --batch 8", "d22");
  check_resume_mistakes();
  check_run_mistakes();
  check_hub_layout();

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_cli_faults_load");
}
