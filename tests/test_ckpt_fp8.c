/* rf-test: timeout=60
 * `rfsdp ckpt export --fp8`: DeepSeek-V3's FP8 format (e4m3 `weight` + f32
 * `weight_scale_inv` per 128x128 block) for the linear weights the model's
 * description marks fp8. Ranks are simulated in one process (rank 0 saves last).
 *   - a llama (hidden 128, intermediate 136: whole and partial tiles) saved at W = 1 and W = 3 with
 *     random row cuts: the two FP8 exports are byte-identical; every FP8 tensor's
 *     codes and scales equal rf_fp8_quantize of the gathered f32 weights (the f32
 *     export) and their dequantization equals quantize-then-dequantize bit for bit;
 *     every other tensor is byte-identical to the f32 export;
 *   - the same against torch (tests/ref_fp8_export.py: float8_e4m3fn codes, scales
 *     and dequantized values of torch's own quantization of the f32 export, and
 *     transformers' FP8 loader; tests/data/fp8_export_ref.bin);
 *   - --fp8-pow2-scales: scales are powers of two, codes as rf_fp8_quantize's;
 *   - a qwen3_moe's fused experts [E, rows, cols]: scales [E, ceil(rows/128),
 *     ceil(cols/128)], each expert's matrix quantized on its own;
 *   - refused with the file untouched: a NaN (the tensor and element named), an
 *     infinity in an expert, a model config of another model, a checkpoint that
 *     records no model, --fp8-pow2-scales or --model without --fp8.
 * With RF_FP8_EXPORT_KEEP=DIR the llama's f32 and FP8 exports and its config are
 * left in DIR and the torch reference is not read (tests/ref_fp8_export.py). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "model/model.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"

#define MAX_T 32
#define MAX_W 3

static const char *const llama_json =
    "{\"model_type\": \"llama\", \"hidden_size\": 128, \"intermediate_size\": 136, \"num_hidden_layers\": 1, "
    "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"vocab_size\": 32, "
    "\"max_position_embeddings\": 16, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, "
    "\"hidden_act\": \"silu\", \"tie_word_embeddings\": false}";

static const char *const moe_json =
    "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 136, \"intermediate_size\": 40, "
    "\"moe_intermediate_size\": 72, \"num_local_experts\": 2, \"num_experts_per_tok\": 1, "
    "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, "
    "\"vocab_size\": 16, \"max_position_embeddings\": 16, \"rms_norm_eps\": 1e-05, "
    "\"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false}";

/* A model description's tensors and their whole values. */
struct tmodel {
  struct rf_model_desc desc;
  int n;
  const struct rf_model_tensor *t[MAX_T];
  float *x[MAX_T];
};

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  RF_ASSERT(f && fputs(text, f) >= 0 && fclose(f) == 0);
}

/* Values of varied magnitude per 128x128 tile (tiles get different scales). */
static void tmodel_load(struct tmodel *m, const char *config, uint64_t seed) {
  memset(m, 0, sizeof *m);
  RF_ASSERT(rf_model_desc_load(config, &m->desc) == 0);
  for (int u = 0; u < m->desc.n_units; u++)
    for (int i = 0; i < m->desc.units[u].n_tensors; i++) {
      RF_ASSERT(m->n < MAX_T);
      const struct rf_model_tensor *t = &m->desc.units[u].tensors[i];
      int64_t cols = t->shape[t->ndim - 1], rows = t->ndim >= 2 ? t->shape[t->ndim - 2] : 1;
      float *x = malloc((size_t)t->numel * sizeof(float));
      for (int64_t j = 0; j < t->numel; j++) {
        int64_t r = (j / cols) % rows, c = j % cols;
        float mag = 0.01f * (float)(1 + (2 * (r / 128) + (c / 128) + j / (rows * cols)) % 5);
        x[j] = rf_test_rand_f32(&seed) * mag;
      }
      m->t[m->n] = t;
      m->x[m->n++] = x;
    }
}

static void tmodel_free(struct tmodel *m) {
  for (int i = 0; i < m->n; i++) free(m->x[i]);
  rf_model_desc_free(&m->desc);
}

static int agree_local(void *ctx, int status) {
  (void)ctx;
  return status;
}

/* Saves the model as `world` ranks would, every tensor cut at random rows. */
static void tmodel_save(const struct tmodel *m, const char *dir, int world, const char *extra,
                        uint64_t seed) {
  static int64_t starts[MAX_T][MAX_W + 1];
  struct rf_tensor_view views[MAX_W][MAX_T];
  float *slab[MAX_W];
  int64_t off[MAX_W] = {0};
  for (int i = 0; i < m->n; i++) {
    const struct rf_model_tensor *t = m->t[i];
    int64_t cols = t->shape[t->ndim - 1];
    rf_test_random_cuts(t->numel / cols, world, seed + (uint64_t)i, starts[i]);
    for (int r = 0; r <= world; r++) starts[i][r] *= cols;
    for (int r = 0; r < world; r++) {
      struct rf_tensor_view *v = &views[r][i];
      *v = (struct rf_tensor_view){.name = t->name,
                                   .unit = i,
                                   .ndim = t->ndim,
                                   .numel = t->numel,
                                   .block_elems = cols,
                                   .starts = starts[i],
                                   .begin = starts[i][r],
                                   .end = starts[i][r + 1],
                                   .shard_offset = off[r]};
      memcpy(v->shape, t->shape, sizeof v->shape);
      off[r] += v->end - v->begin;
    }
  }
  for (int r = 0; r < world; r++) {
    slab[r] = malloc((size_t)off[r] * sizeof(float) + 4);
    for (int i = 0; i < m->n; i++) {
      struct rf_tensor_view *v = &views[r][i];
      v->master = slab[r] + v->shard_offset;
      memcpy(v->master, m->x[i] + v->begin, (size_t)(v->end - v->begin) * sizeof(float));
    }
  }
  int rc = 0;
  for (int r = world - 1; r >= 0 && rc == 0; r--) {
    struct rf_ckpt_views_args a = {.dir = dir,
                                   .rank = r,
                                   .world = world,
                                   .step = 7,
                                   .extra_json = extra,
                                   .n_views = m->n,
                                   .views = views[r],
                                   .agree = agree_local,
                                   .chunk_bytes = 4096};
    rc = rf_ckpt_save_views(&a);
  }
  RF_CHECK(rc == 0, "save at W=%d: %s", world, rf_error_msg());
  for (int r = 0; r < world; r++) free(slab[r]);
}

static int64_t matrices_of(const struct rf_model_tensor *t) { return t->ndim == 3 ? t->shape[0] : 1; }

static struct rf_fp8_grid grid_of(const struct rf_model_tensor *t) {
  return (struct rf_fp8_grid){t->shape[t->ndim - 2], t->shape[t->ndim - 1], 128, 128};
}

/* The FP8 export `fp8` against the f32 export `f32` of the same checkpoint: each FP8
 * tensor's codes and scales are rf_fp8_quantize's of the f32 weights (per matrix),
 * its dequantization is quantize-then-dequantize bit for bit, the others are
 * byte-identical. With `ref` (torch's values, tests/ref_fp8_export.py) also
 * compared with those. Returns the number of FP8 tensors. */
static int check_export(const struct tmodel *m, const char *fp8, const char *f32, int pow2, FILE *ref) {
  struct rf_safetensors_file q, w;
  RF_CHECK(rf_safetensors_open(&q, fp8) == 0, "%s", rf_error_msg());
  RF_ASSERT(rf_safetensors_open(&w, f32) == 0);
  int n_fp8 = 0, n_plain = 0;
  for (int i = 0; i < m->n; i++) {
    const struct rf_model_tensor *t = m->t[i];
    const struct rf_safetensors_tensor *tq = rf_safetensors_find(&q, t->name);
    RF_CHECK(tq && tq->ndim == t->ndim && memcmp(tq->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim) == 0,
             "'%s' in the FP8 export, its shape", t->name);
    if (!tq) continue;
    float *x = malloc((size_t)t->numel * sizeof(float));
    RF_ASSERT(rf_safetensors_read_f32(&w, t->name, 0, t->numel, x) == 0);
    RF_CHECK(memcmp(x, m->x[i], (size_t)t->numel * sizeof(float)) == 0, "'%s': the f32 export is the masters",
             t->name);
    char sname[300];
    snprintf(sname, sizeof sname, "%s_scale_inv", t->name);
    const struct rf_safetensors_tensor *ts = rf_safetensors_find(&q, sname);
    if (!t->fp8) {
      n_plain++;
      RF_CHECK(tq->dtype == RF_SAFETENSORS_DTYPE_F32 && !ts, "'%s' is not FP8: F32 and no scales", t->name);
      float *y = malloc((size_t)t->numel * sizeof(float));
      RF_ASSERT(rf_safetensors_read_raw(&q, t->name, 0, t->numel, y) == 0);
      RF_CHECK(memcmp(x, y, (size_t)t->numel * sizeof(float)) == 0, "'%s' as in the f32 export", t->name);
      free(y);
      free(x);
      continue;
    }
    n_fp8++;
    struct rf_fp8_grid g = grid_of(t);
    int64_t e_count = matrices_of(t), elems = g.rows * g.cols, tiles = rf_fp8_grid_tiles(&g);
    RF_CHECK(tq->dtype == RF_SAFETENSORS_DTYPE_F8_E4M3, "'%s' is F8_E4M3", t->name);
    RF_CHECK(ts && ts->dtype == RF_SAFETENSORS_DTYPE_F32 && ts->ndim == t->ndim &&
                 ts->shape[t->ndim - 2] == rf_fp8_grid_tile_rows(&g) &&
                 ts->shape[t->ndim - 1] == rf_fp8_grid_tile_cols(&g) &&
                 (t->ndim == 2 || ts->shape[0] == e_count),
             "'%s': F32 scales of [%sceil(rows/128), ceil(cols/128)]", sname, t->ndim == 3 ? "E, " : "");
    if (!ts) {
      free(x);
      continue;
    }
    uint8_t *codes = malloc((size_t)t->numel), *want = malloc((size_t)t->numel);
    float *scales = malloc((size_t)(e_count * tiles) * sizeof(float));
    float *want_s = malloc((size_t)(e_count * tiles) * sizeof(float));
    float *dq = malloc((size_t)t->numel * sizeof(float)), *want_dq = malloc((size_t)t->numel * sizeof(float));
    RF_ASSERT(rf_safetensors_read_raw(&q, t->name, 0, t->numel, codes) == 0);
    RF_ASSERT(rf_safetensors_read_raw(&q, sname, 0, e_count * tiles, scales) == 0);
    int64_t not_pow2 = 0;
    for (int64_t e = 0; e < e_count; e++) {
      RF_ASSERT(rf_fp8_quantize(&g, x + e * elems, pow2, t->name, want + e * elems, want_s + e * tiles) == 0);
      rf_fp8_dequantize(&g, codes + e * elems, scales + e * tiles, dq + e * elems);
      rf_fp8_dequantize(&g, want + e * elems, want_s + e * tiles, want_dq + e * elems);
    }
    for (int64_t k = 0; k < e_count * tiles; k++) {
      int ex;
      not_pow2 += frexpf(scales[k], &ex) != 0.5f;
    }
    RF_CHECK(memcmp(codes, want, (size_t)t->numel) == 0, "'%s': codes are rf_fp8_quantize's", t->name);
    RF_CHECK(memcmp(scales, want_s, (size_t)(e_count * tiles) * sizeof(float)) == 0,
             "'%s': scales are rf_fp8_quantize's", t->name);
    RF_CHECK(memcmp(dq, want_dq, (size_t)t->numel * sizeof(float)) == 0,
             "'%s': dequantized = quantize-then-dequantize of the gathered weights", t->name);
    RF_CHECK(pow2 ? not_pow2 == 0 : not_pow2 > 0, "'%s': %lld scales not powers of two (pow2 %d)", t->name,
             (long long)not_pow2, pow2);
    if (ref) { /* torch: its codes, its scales, its dequantization (code * scale_inv) */
      uint8_t *rc = malloc((size_t)t->numel);
      float *rs = malloc((size_t)(e_count * tiles) * sizeof(float)), *rd = malloc((size_t)t->numel * 4);
      RF_ASSERT(fread(rc, 1, (size_t)t->numel, ref) == (size_t)t->numel);
      RF_ASSERT(fread(rs, 4, (size_t)(e_count * tiles), ref) == (size_t)(e_count * tiles));
      RF_ASSERT(fread(rd, 4, (size_t)t->numel, ref) == (size_t)t->numel);
      RF_CHECK(memcmp(rc, codes, (size_t)t->numel) == 0, "'%s': codes are torch's float8_e4m3fn", t->name);
      RF_CHECK(memcmp(rs, scales, (size_t)(e_count * tiles) * 4) == 0, "'%s': scales are torch's", t->name);
      RF_CHECK(memcmp(rd, dq, (size_t)t->numel * 4) == 0, "'%s': dequantized as torch/transformers", t->name);
      free(rc);
      free(rs);
      free(rd);
    }
    free(codes);
    free(want);
    free(scales);
    free(want_s);
    free(dq);
    free(want_dq);
    free(x);
  }
  RF_CHECK(q.n_tensors == n_plain + 2 * n_fp8, "the FP8 export holds %d tensors, want %d", q.n_tensors,
           n_plain + 2 * n_fp8);
  RF_CHECK(
      q.metadata_json && strstr(q.metadata_json, "rfsdp_fp8") && strstr(q.metadata_json, "weight_scale_inv"),
      "the metadata names the format: %s", q.metadata_json ? q.metadata_json : "(none)");
  rf_safetensors_close(&q);
  rf_safetensors_close(&w);
  return n_fp8;
}

static void test_llama(const char *dir, const char *keep) {
  char cfg[256], extra[400], out[16384];
  snprintf(cfg, sizeof cfg, "%s/llama.json", dir);
  write_text(cfg, llama_json);
  snprintf(extra, sizeof extra, "{\"program\":{\"model\":\"%s\"}}", cfg);
  struct tmodel m;
  tmodel_load(&m, cfg, 11);
  char fp8[2][300], f32[300], pow2[300];
  for (int k = 0; k < 2; k++) {
    int world = k ? 3 : 1;
    char ck[300];
    snprintf(ck, sizeof ck, "%s/llama-w%d", dir, world);
    tmodel_save(&m, ck, world, extra, 100 + (uint64_t)world);
    snprintf(fp8[k], sizeof fp8[k], "%s/llama-w%d-fp8.safetensors", dir, world);
    int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ck, fp8[k]);
    RF_CHECK(rc == 0 && strstr(out, "fp8: 7 tensors as F8_E4M3") &&
                 strstr(out, "\"weight_block_size\": [128, 128]"),
             "export --fp8 at W=%d: rc %d: %s", world, rc, out);
    if (world == 1) continue;
    snprintf(f32, sizeof f32, "%s/llama-w3-f32.safetensors", dir);
    RF_CHECK(rf_cli_run(out, sizeof out, "ckpt export %s --out %s", ck, f32) == 0, "export f32: %s", out);
    snprintf(pow2, sizeof pow2, "%s/llama-w3-pow2.safetensors", dir);
    RF_CHECK(rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8 --fp8-pow2-scales --model %s", ck,
                        pow2, cfg) == 0,
             "export --fp8-pow2-scales: %s", out);
  }
  RF_CHECK(rf_test_files_equal(fp8[0], fp8[1]), "the FP8 exports of W=1 and W=3 are byte-identical");
  FILE *ref = NULL;
  if (!keep) {
    ref = fopen("tests/data/fp8_export_ref.bin", "rb");
    RF_CHECK(ref, "tests/data/fp8_export_ref.bin (tests/ref_fp8_export.py) is missing");
  }
  RF_CHECK(check_export(&m, fp8[1], f32, 0, ref) == 7, "7 FP8 tensors (q, k, v, o, gate, up, down)");
  if (ref) {
    RF_CHECK(fgetc(ref) == EOF, "the torch reference holds more than the export");
    fclose(ref);
  }
  check_export(&m, pow2, f32, 1, NULL);
  if (keep) { /* for tests/ref_fp8_export.py */
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp %s %s/llama.json && cp %s %s/fp8.safetensors && cp %s %s/f32.safetensors",
             cfg, keep, fp8[1], keep, f32, keep);
    RF_CHECK(system(cmd) == 0, "%s", cmd);
  }

  /* refused, the output untouched: a NaN, another model, no model recorded */
  char ck[300], other[300];
  snprintf(ck, sizeof ck, "%s/llama-nan", dir);
  int q = 0;
  while (q < m.n && strcmp(m.t[q]->name, "model.layers.0.self_attn.q_proj.weight") != 0) q++;
  RF_ASSERT(q < m.n);
  m.x[q][2 * 128 + 5] = NAN; /* element [2, 5] */
  tmodel_save(&m, ck, 3, extra, 5);
  write_text(pow2, "kept");
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ck, pow2);
  RF_CHECK(
      rc == 1 &&
          strstr(out,
                 "rank-00000.bin: tensor 'model.layers.0.self_attn.q_proj.weight' element 261 [2, 5] is nan"),
      "a NaN is refused naming the tensor and element: rc %d: %s", rc, out);
  snprintf(other, sizeof other, "%s/moe.json", dir);
  write_text(other, moe_json);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s/llama-w1 --out %s --fp8 --model %s", dir, pow2, other);
  RF_CHECK(rc == 1 && strstr(out, "no parameter 'model.layers.0.mlp.experts.gate_up_proj' to export in FP8"),
           "another model's config is refused: rc %d: %s", rc, out);
  snprintf(ck, sizeof ck, "%s/llama-nomodel", dir);
  m.x[q][2 * 128 + 5] = 0.0f;
  tmodel_save(&m, ck, 1, "{}", 5);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ck, pow2);
  RF_CHECK(rc == 1 && strstr(out, "records no model config: name it with --model CONFIG"),
           "no model recorded: rc %d: %s", rc, out);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8-pow2-scales", ck, pow2);
  RF_CHECK(rc == 2 && strstr(out, "--fp8-pow2-scales applies only with --fp8"), "pow2 alone: rc %d: %s", rc,
           out);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --model %s", ck, pow2, cfg);
  RF_CHECK(rc == 2 && strstr(out, "--model applies only with --fp8"), "--model alone: rc %d: %s", rc, out);
  FILE *f = fopen(pow2, "r");
  char kept[8] = {0};
  RF_CHECK(f && fread(kept, 1, sizeof kept - 1, f) == 4 && strcmp(kept, "kept") == 0,
           "a refused export leaves the output file as it was");
  if (f) fclose(f);
  tmodel_free(&m);
}

static void test_moe(const char *dir) {
  char cfg[256], extra[400], out[16384], ck[300], fp8[300], f32[300];
  snprintf(cfg, sizeof cfg, "%s/moe.json", dir);
  write_text(cfg, moe_json);
  snprintf(extra, sizeof extra, "{\"program\":{\"model\":\"%s\"}}", cfg);
  struct tmodel m;
  tmodel_load(&m, cfg, 23);
  snprintf(ck, sizeof ck, "%s/moe-w2", dir);
  tmodel_save(&m, ck, 2, extra, 9);
  snprintf(fp8, sizeof fp8, "%s/moe-fp8.safetensors", dir);
  snprintf(f32, sizeof f32, "%s/moe-f32.safetensors", dir);
  RF_CHECK(rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ck, fp8) == 0, "moe --fp8: %s", out);
  RF_CHECK(rf_cli_run(out, sizeof out, "ckpt export %s --out %s", ck, f32) == 0, "moe f32: %s", out);
  int experts = 0;
  for (int i = 0; i < m.n; i++) experts += m.t[i]->ndim == 3 && m.t[i]->fp8;
  RF_CHECK(experts == 2, "the moe has fused experts gate_up and down (%d)", experts);
  RF_CHECK(check_export(&m, fp8, f32, 0, NULL) == 6, "q, k, v, o and the two expert tensors in FP8");
  for (int i = 0; i < m.n; i++) /* an infinity in expert 1 of the down projection */
    if (strstr(m.t[i]->name, "experts.down_proj")) m.x[i][72 * 136 + 3 * 72 + 4] = -INFINITY;
  snprintf(ck, sizeof ck, "%s/moe-inf", dir);
  tmodel_save(&m, ck, 2, extra, 9);
  int rc = rf_cli_run(out, sizeof out, "ckpt export %s --out %s --fp8", ck, fp8);
  RF_CHECK(
      rc == 1 && strstr(out, "tensor 'model.layers.0.mlp.experts.down_proj' element 10012 [1, 3, 4] is -inf"),
      "an infinity in expert 1 is refused naming it: rc %d: %s", rc, out);
  tmodel_free(&m);
}

int main(void) {
  char dir[64] = "/tmp/rf_test_ckpt_fp8.XXXXXX";
  RF_ASSERT(mkdtemp(dir));
  const char *keep = getenv("RF_FP8_EXPORT_KEEP");
  test_llama(dir, keep && keep[0] ? keep : NULL);
  test_moe(dir);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_ckpt_fp8");
}
