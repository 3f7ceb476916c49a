/* rf-test: timeout=240 */
/* The LLaMA config fields beyond the plain model, against transformers'
 * LlamaForCausalLM: tests/ref_llama_fields.py wrote, for a tied-embedding model
 * with head_dim 24 (hidden 64, 4 heads) and for a model with attention and MLP
 * biases and head_dim 8, the config.json transformers writes and, in float64,
 * the weights, tokens, targets, logits, mean loss, every parameter gradient and
 * the logits of a 200-token sequence (tests/data/llama_{tied,bias}*), and the
 * same for transformers' Qwen2ForCausalLM (q, k, v biases, tied, as Qwen2-0.5B:
 * tests/data/qwen2_tied*). Here the
 * config is read by the one reader (rf_model_config_load), the tensors come from
 * the model's description (names and sizes must equal transformers' parameters:
 * what the planner counts is what the model trains), and the C model runs the
 * batch in f32:
 *   logits, loss, long logits  max|a-b| / max|ref| <= 2e-5
 *   each gradient              max|a-b| / max|ref| <= 1e-4 (the tied embedding's
 *                              is the sum of its uses as input and output)
 * Greedy generation picks transformers' argmax. Through the runtime (`rfsdp
 * logits` under mpirun at W = 1, 2, 3, the weights imported from a safetensors
 * file): logits max|a-b| / max|ref| <= 2e-5. A model with all four fields trains
 * at W = 2 and 3 (planned ragged, fsdp2) with the losses of the one-rank run
 * within 1e-4 relative; its export holds the biases and no lm_head (tied) and
 * gives the trained model's logits back. Fields that change the math and are not
 * implemented are refused with the file and the field named. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_cli.h"
#include "rf_test.h"
#include "safetensors/safetensors.h"

struct fref {
  struct rf_model_config cfg;
  struct rf_model_desc desc;
  int B, T, t_long;
  double loss;
  int32_t *tokens, *targets, *tokens_long;
  float *logits, *logits_long;
  float **w, **g; /* [desc.n_tensors], the description's order */
  int *first;     /* [desc.n_units]: global index of each unit's first tensor */
};

struct reader {
  const char *p;
  size_t left;
  int ok;
};

static void rd(struct reader *r, void *dst, size_t n) {
  if (!r->ok || r->left < n) {
    r->ok = 0;
    memset(dst, 0, n);
    return;
  }
  memcpy(dst, r->p, n);
  r->p += n;
  r->left -= n;
}

static float *rd_floats(struct reader *r, size_t n) {
  float *x = rf_xmalloc(n * sizeof(float) + 4);
  rd(r, x, n * sizeof(float));
  return x;
}

static int fref_load(struct fref *f, const char *bin, const char *cfg_path) {
  memset(f, 0, sizeof *f);
  if (rf_model_config_load(&f->cfg, cfg_path) != 0) return -1;
  rf_model_desc_make(&f->cfg, &f->desc);
  char *buf = NULL;
  size_t bytes = 0;
  if (rf_file_read_all(bin, &buf, &bytes) != 0) return -1;
  struct reader r = {buf, bytes, 1};
  uint32_t magic = 0, version = 0;
  rd(&r, &magic, 4);
  rd(&r, &version, 4);
  int32_t bt[2] = {0, 0};
  rd(&r, bt, sizeof bt);
  rd(&r, &f->loss, 8);
  f->B = bt[0], f->T = bt[1];
  size_t nt = (size_t)f->B * f->T, v = (size_t)f->cfg.vocab_size;
  int ok = magic == 0x4645524Cu && version == 3 && nt > 0 && nt < 4096;
  if (ok) {
    f->tokens = rf_xmalloc(nt * 4);
    f->targets = rf_xmalloc(nt * 4);
    rd(&r, f->tokens, nt * 4);
    rd(&r, f->targets, nt * 4);
    f->logits = rd_floats(&r, nt * v);
    int32_t n = 0;
    rd(&r, &n, 4);
    RF_CHECK(n == f->desc.n_tensors, "%s: %d tensors, the description has %d", bin, n, f->desc.n_tensors);
    ok = r.ok && n == f->desc.n_tensors;
  }
  f->first = rf_xcalloc((size_t)f->desc.n_units, sizeof(int));
  f->w = rf_xcalloc((size_t)f->desc.n_tensors, sizeof(float *));
  f->g = rf_xcalloc((size_t)f->desc.n_tensors, sizeof(float *));
  int k = 0;
  for (int u = 0; u < f->desc.n_units && ok; u++) {
    f->first[u] = k;
    for (int i = 0; i < f->desc.units[u].n_tensors && ok; i++, k++) {
      const struct rf_model_tensor *t = &f->desc.units[u].tensors[i];
      int32_t len = 0, numel = 0;
      char name[256] = "";
      rd(&r, &len, 4);
      ok = r.ok && len > 0 && len < (int32_t)sizeof name;
      if (ok) rd(&r, name, (size_t)len);
      rd(&r, &numel, 4);
      RF_CHECK(ok && strcmp(name, t->name) == 0 && numel == t->numel,
               "tensor %d: transformers has %s (%d), the description %s (%lld)", k, name, numel, t->name,
               (long long)t->numel);
      ok = ok && strcmp(name, t->name) == 0 && numel == t->numel;
    }
  }
  for (int pass = 0; pass < 2 && ok; pass++)
    for (k = 0; k < f->desc.n_tensors; k++) {
      int u = 0;
      while (u + 1 < f->desc.n_units && f->first[u + 1] <= k) u++;
      size_t n = (size_t)f->desc.units[u].tensors[k - f->first[u]].numel;
      if (pass == 0)
        f->w[k] = rd_floats(&r, n);
      else
        f->g[k] = rd_floats(&r, n);
    }
  int32_t tl = 0;
  rd(&r, &tl, 4);
  if (ok && tl > 0 && tl <= f->cfg.max_position_embeddings) {
    f->t_long = tl;
    f->tokens_long = rf_xmalloc((size_t)tl * 4);
    rd(&r, f->tokens_long, (size_t)tl * 4);
    f->logits_long = rd_floats(&r, (size_t)tl * v);
  }
  ok = ok && r.ok && r.left == 0 && f->t_long > 0;
  free(buf);
  if (!ok) return rf_error_set(__FILE__, __LINE__, "%s: truncated or not a version-3 reference", bin);
  return 0;
}

static void fref_free(struct fref *f) {
  for (int k = 0; k < f->desc.n_tensors; k++) {
    if (f->w) free(f->w[k]);
    if (f->g) free(f->g[k]);
  }
  free(f->w), free(f->g), free(f->first);
  free(f->tokens), free(f->targets), free(f->tokens_long), free(f->logits), free(f->logits_long);
  rf_model_desc_free(&f->desc);
}

static double max_abs(const float *a, size_t n) {
  double m = 0.0;
  for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i]));
  return m;
}

/* max|a - b| / max|b|; NaN anywhere makes it NaN (and every check on it fail) */
static double rel_err(const float *a, const float *b, size_t n) {
  double m = max_abs(b, n), e = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    if (isnan(d)) return NAN;
    e = fmax(e, d);
  }
  return m > 0 ? e / m : e;
}

static char tmp[64] = "/tmp/rf_model_fields.XXXXXX";

/* The logits of `rfsdp logits` at W = 1, 2, 3 for tokens [batch, seq], against ref. */
static void check_cli_logits(const char *name, const char *cfg, const char *weights, const int32_t *tokens,
                             int batch, int seq, const float *ref, int vocab) {
  char tok[128], out_path[128], out[8192];
  snprintf(tok, sizeof tok, "%s/%s.tok", tmp, name);
  RF_ASSERT(rf_file_write_all(tok, tokens, (size_t)batch * seq * sizeof(int32_t)) == 0);
  for (int w = 1; w <= 3; w++) {
    snprintf(out_path, sizeof out_path, "%s/%s-%d.f32", tmp, name, w);
    int rc =
        rf_cli_run_mpi(out, sizeof out, w, 60, "logits --model %s --weights %s --tokens %s --seq %d --out %s",
                       cfg, weights, tok, seq, out_path);
    RF_CHECK(rc == 0, "%s: rfsdp logits at W=%d: rc %d\n%s", name, w, rc, out);
    char *got = NULL;
    size_t n = 0;
    if (rc != 0 || rf_file_read_all(out_path, &got, &n) != 0) continue;
    size_t nl = (size_t)batch * seq * vocab;
    RF_CHECK(n == nl * sizeof(float), "%s: %zu bytes of logits", name, n);
    if (n == nl * sizeof(float)) {
      double e = rel_err((const float *)(void *)got, ref, nl);
      RF_CHECK(e <= 2e-5, "%s: rfsdp logits at W=%d: rel err %.3g > 2e-5", name, w, e);
    }
    free(got);
  }
}

static void test_variant(const char *name) {
  char bin[128], cfg[128];
  snprintf(bin, sizeof bin, "tests/data/%s.bin", name);
  snprintf(cfg, sizeof cfg, "tests/data/%s_config.json", name);
  struct fref f;
  int rc = fref_load(&f, bin, cfg);
  RF_CHECK(rc == 0, "%s: %s", name, rf_error_msg());
  if (rc != 0) {
    fref_free(&f);
    return;
  }
  const struct rf_model_config *c = &f.cfg;
  struct rf_model_units map;
  rf_model_units_find(c, &map);
  /* what the planner counts: the same description */
  const struct rf_plan_policy rows1 = {.block_rows = 1, .vector_block = 1};
  struct rf_plan_unit_in *units = rf_model_desc_plan_units(&f.desc, &rows1);
  int64_t planned = 0;
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < units[u].n_tensors; i++) planned += units[u].tensors[i].numel;
  free(units);
  RF_CHECK(planned == f.desc.numel && rf_model_n_params(c) == f.desc.numel,
           "%s: planned %lld, described %lld, counted %lld", name, (long long)planned,
           (long long)f.desc.numel, (long long)rf_model_n_params(c));

  /* optimizer groups: biases, norms and the (tied) embedding take no weight decay and no Muon */
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < f.desc.units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &f.desc.units[u].tensors[i];
      int linear = t->ndim == 2 && !strstr(t->name, "embed_tokens") && strcmp(t->name, "lm_head.weight") != 0;
      int decay = linear || strcmp(t->name, "lm_head.weight") == 0;
      RF_CHECK(t->decay == decay && t->matrix == linear, "%s: %s: decay %d matrix %d, expected %d %d", name,
               t->name, t->decay, t->matrix, decay, linear);
    }

  size_t nt = (size_t)f.B * f.T, nl = nt * c->vocab_size;
  int count = 0;
  for (size_t i = 0; i < nt; i++) count += f.targets[i] >= 0;
  struct rf_model_ws ws;
  RF_ASSERT(rf_model_ws_init(&ws, c, f.B, f.T) == 0);
  RF_CHECK(rf_model_ws_bytes(c, f.B, f.T) == ws.bytes, "%s: predicted workspace %zu bytes, allocated %zu",
           name, rf_model_ws_bytes(c, f.B, f.T), ws.bytes);
  int n = f.desc.n_tensors;
  struct rf_model_weight *wt = rf_xcalloc((size_t)n, sizeof *wt);
  float **grads = rf_xcalloc((size_t)n, sizeof(float *));
  for (int k = 0; k < n; k++) wt[k].f32 = f.w[k];
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < f.desc.units[u].n_tensors; i++)
      grads[f.first[u] + i] = rf_xcalloc((size_t)f.desc.units[u].tensors[i].numel, sizeof(float));
  int e_idx = f.first[map.embed_unit] + map.embed_tensor, h_idx = f.first[map.head_unit];
  int L = c->num_hidden_layers;

  RF_ASSERT(rf_model_embed_forward(&ws, &wt[e_idx], f.tokens) == 0);
  for (int l = 0; l < L; l++) rf_model_layer_forward(&ws, l, &wt[f.first[map.first_layer + l]]);
  double loss = rf_model_head_forward(&ws, &wt[h_idx], f.targets) / count;
  double e_logits = rel_err(rf_model_ws_logits(&ws, 0), f.logits, nl);
  rf_model_head_backward(&ws, &wt[h_idx], &grads[h_idx], 1.0f / (float)count);
  for (int l = L - 1; l >= 0; l--)
    rf_model_layer_backward(&ws, l, &wt[f.first[map.first_layer + l]], &grads[f.first[map.first_layer + l]]);
  rf_model_embed_backward(&ws, &grads[e_idx]);

  RF_CHECK(fabs(loss - f.loss) <= 2e-5 * fabs(f.loss), "%s: mean loss %.9g, transformers %.9g", name, loss,
           f.loss);
  RF_CHECK(e_logits <= 2e-5, "%s: logits rel err %.3g > 2e-5", name, e_logits);
  double worst = 0.0;
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < f.desc.units[u].n_tensors; i++) {
      int k = f.first[u] + i;
      const struct rf_model_tensor *t = &f.desc.units[u].tensors[i];
      double e = rel_err(grads[k], f.g[k], (size_t)t->numel);
      worst = fmax(worst, e);
      RF_CHECK(max_abs(f.g[k], (size_t)t->numel) > 0, "%s: %s: reference gradient is zero", name, t->name);
      RF_CHECK(e <= 1e-4, "%s: gradient of %s: rel err %.3g > 1e-4", name, t->name, e);
    }
  printf("%s vs transformers: loss %.9f (%.9f), logits rel err %.2g, worst gradient rel err %.2g\n", name,
         loss, f.loss, e_logits, worst);

  /* greedy generation from prefixes of sequence 1 picks transformers' argmax */
  const struct rf_model_weight **uw = rf_xcalloc((size_t)f.desc.n_units, sizeof *uw);
  for (int u = 0; u < f.desc.n_units; u++) uw[u] = &wt[f.first[u]];
  for (int len = 1; len <= f.T; len += 3) {
    int32_t seq[64];
    memcpy(seq, f.tokens + f.T, sizeof(int32_t) * (size_t)len);
    uint64_t rng = 7;
    RF_CHECK(rf_model_generate(&ws, uw, seq, len, len + 1, 0.0f, &rng) == 0, "generate: %s", rf_error_msg());
    const float *row = f.logits + ((size_t)f.T + len - 1) * c->vocab_size;
    int best = 0;
    for (int j = 1; j < c->vocab_size; j++)
      if (row[j] > row[best]) best = j;
    RF_CHECK(seq[len] == best, "%s: greedy token after %d tokens: %d, transformers' argmax %d", name, len,
             seq[len], best);
  }
  rf_model_ws_free(&ws);

  /* the long sequence, forward only */
  RF_ASSERT(rf_model_ws_init(&ws, c, 1, f.t_long) == 0);
  RF_ASSERT(rf_model_embed_forward(&ws, &wt[e_idx], f.tokens_long) == 0);
  for (int l = 0; l < L; l++) rf_model_layer_forward(&ws, l, &wt[f.first[map.first_layer + l]]);
  rf_model_head_forward(&ws, &wt[h_idx], NULL);
  double e_long = rel_err(rf_model_ws_logits(&ws, 0), f.logits_long, (size_t)f.t_long * c->vocab_size);
  RF_CHECK(e_long <= 2e-5, "%s: %d-token logits rel err %.3g > 2e-5", name, f.t_long, e_long);
  rf_model_ws_free(&ws);

  /* through the runtime: the reference weights in a safetensors file, imported by rfsdp logits */
  char st[128];
  snprintf(st, sizeof st, "%s/%s.safetensors", tmp, name);
  struct rf_safetensors_decl *decls = rf_xcalloc((size_t)n, sizeof *decls);
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < f.desc.units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &f.desc.units[u].tensors[i];
      struct rf_safetensors_decl *d = &decls[f.first[u] + i];
      *d = (struct rf_safetensors_decl){.name = t->name, .dtype = RF_SAFETENSORS_DTYPE_F32, .ndim = t->ndim};
      memcpy(d->shape, t->shape, sizeof d->shape);
    }
  struct rf_safetensors_writer sw;
  RF_ASSERT(rf_safetensors_writer_open(&sw, st, n, decls, NULL) == 0);
  for (int u = 0; u < f.desc.n_units; u++)
    for (int i = 0; i < f.desc.units[u].n_tensors; i++)
      RF_ASSERT(rf_safetensors_writer_write_f32(&sw, f.w[f.first[u] + i], f.desc.units[u].tensors[i].numel) ==
                0);
  RF_ASSERT(rf_safetensors_writer_commit(&sw) == 0);
  free(decls);
  check_cli_logits(name, cfg, st, f.tokens, f.B, f.T, f.logits, c->vocab_size);

  free(uw);
  for (int k = 0; k < n; k++) free(grads[k]);
  free(grads);
  free(wt);
  fref_free(&f);
}

/* The "loss" of each step of a JSONL log; returns the count. */
static int read_losses(const char *path, double *loss, int cap) {
  FILE *fp = fopen(path, "r");
  if (!fp) return 0;
  char line[4096];
  int n = 0;
  while (n < cap && fgets(line, sizeof line, fp)) {
    const char *p = strstr(line, "\"loss\":");
    if (p) loss[n++] = atof(p + 7);
  }
  fclose(fp);
  return n;
}

static void write_text(const char *path, const char *text);

/* A model with all four fields trained through the runtime. */
static void test_train(void) {
  enum { STEPS = 12 };
  char text[128], data[128], cfg[128], out[16384], log[160];
  snprintf(text, sizeof text, "%s/text.txt", tmp);
  snprintf(data, sizeof data, "%s/data", tmp);
  snprintf(cfg, sizeof cfg, "%s/all.json", tmp);
  size_t cap = 1 << 18, len = 0;
  char *buf = rf_xmalloc(cap);
  for (int i = 0; len + 100 < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%d: And God saw the light, that it was good.\n", i % 17);
  RF_ASSERT(rf_file_write_all(text, buf, len) == 0);
  free(buf);
  int rc = rf_cli_run(out, sizeof out, "prepare --input %s --out %s --val-fraction 0.1", text, data);
  RF_CHECK(rc == 0, "prepare: %s", out);
  write_text(
      cfg,
      "{\"model_type\": \"llama\", \"hidden_size\": 32, \"intermediate_size\": 40, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 12, \"vocab_size\": 256, "
      "\"max_position_embeddings\": 64, \"tie_word_embeddings\": true, \"attention_bias\": true, "
      "\"mlp_bias\": true}");
  const char *common =
      "--steps 12 --batch 6 --seq 16 --lr 3e-3 --warmup 2 --seed 7 --peak-gflops 50 --print-every 0";
  static const char *runs[][3] = {
      {"1", "planned", "equal"}, {"2", "planned", "ragged"}, {"3", "fsdp2", "equal"}};
  double ref[STEPS] = {0}, got[STEPS] = {0};
  int n_ref = 0;
  for (int r = 0; r < 3; r++) {
    int w = atoi(runs[r][0]);
    snprintf(log, sizeof log, "%s/train-%d.jsonl", tmp, w);
    rc = rf_cli_run_mpi(out, sizeof out, w, 120,
                        "train --model %s --data %s %s --layout %s --shard %s --log %s --ckpt-dir %s/ckpt-%d "
                        "--save-every 12",
                        cfg, data, common, runs[r][1], runs[r][2], log, tmp, w);
    RF_CHECK(rc == 0, "train W=%d %s/%s: rc %d\n%s", w, runs[r][1], runs[r][2], rc, out);
    int m = read_losses(log, r == 0 ? ref : got, STEPS);
    if (r == 0) {
      n_ref = m;
      RF_CHECK(m == STEPS && ref[m - 1] < ref[0] - 0.5, "the loss does not fall: %d steps, %g -> %g", m,
               ref[0], m ? ref[m - 1] : 0.0);
      continue;
    }
    double worst = m == n_ref ? 0.0 : INFINITY;
    for (int k = 0; k < m && k < n_ref; k++) worst = fmax(worst, fabs(got[k] - ref[k]) / fabs(ref[k]));
    RF_CHECK(worst <= 1e-4, "W=%d %s/%s: losses differ from the one-rank run by %.3g", w, runs[r][1],
             runs[r][2], worst);
    printf("tied + biases + head_dim 12: W=%d %s/%s max relative loss difference %.2g over %d steps\n", w,
           runs[r][1], runs[r][2], worst, m);
  }
  /* the export: biases, the tied embedding once, no lm_head; it gives the trained model back */
  char st[160];
  snprintf(st, sizeof st, "%s/all.safetensors", tmp);
  rc = rf_cli_run(out, sizeof out, "ckpt export %s/ckpt-2/step-00000012 --out %s", tmp, st);
  RF_CHECK(rc == 0, "export: rc %d\n%s", rc, out);
  struct rf_safetensors_file sf;
  if (rc == 0 && rf_safetensors_open(&sf, st) == 0) {
    RF_CHECK(!rf_safetensors_find(&sf, "lm_head.weight") &&
                 rf_safetensors_find(&sf, "model.embed_tokens.weight") &&
                 rf_safetensors_find(&sf, "model.layers.1.self_attn.o_proj.bias") &&
                 rf_safetensors_find(&sf, "model.layers.0.mlp.down_proj.bias") && sf.n_tensors == 2 + 2 * 16,
             "export of the tied, biased model: %d tensors", sf.n_tensors);
    rf_safetensors_close(&sf);
  }
  char tok[160];
  snprintf(tok, sizeof tok, "%s/all.tok", tmp);
  int32_t ids[16];
  for (int i = 0; i < 16; i++) ids[i] = (i * 37) % 256;
  RF_ASSERT(rf_file_write_all(tok, ids, sizeof ids) == 0);
  rc = rf_cli_run_mpi(out, sizeof out, 2, 60,
                      "logits --model %s --weights %s --tokens %s --seq 16 --out %s/all.f32", cfg, st, tok,
                      tmp);
  RF_CHECK(rc == 0, "logits of the export: rc %d\n%s", rc, out);
  /* tied needs a second parameter slot */
  rc =
      rf_cli_run_mpi(out, sizeof out, 2, 60, "train --model %s --data %s %s --prefetch 0", cfg, data, common);
  RF_CHECK(rc != 0 && strstr(out, "tie_word_embeddings") && strstr(out, "--prefetch"),
           "--prefetch 0: rc %d\n%s", rc, out);
}

static void write_text(const char *path, const char *text) {
  FILE *fp = fopen(path, "w");
  RF_ASSERT(fp);
  fputs(text, fp);
  fclose(fp);
}

/* A config that changes the math in a way the model does not implement is refused. */
static void expect_refused(const char *dir, const char *type, const char *extra, const char *field) {
  char path[512], text[1024];
  snprintf(path, sizeof path, "%s/config.json", dir);
  snprintf(
      text, sizeof text,
      "{\"model_type\": \"%s\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 4, \"vocab_size\": 67%s}",
      type, extra);
  write_text(path, text);
  struct rf_model_config c;
  int rc = rf_model_config_load(&c, path);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), path) && strstr(rf_error_msg(), field),
           "%s: rc %d, message '%s' should name the file and %s", extra, rc, rf_error_msg(), field);
}

static void test_refused(void) {
  char dir[] = "/tmp/rf_model_fields_XXXXXX";
  RF_ASSERT(mkdtemp(dir));
  expect_refused(dir, "llama", ", \"hidden_act\": \"gelu\"", "hidden_act");
  expect_refused(dir, "llama", ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
                 "rope_scaling");
  expect_refused(dir, "llama", ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 10000.0}",
                 "rope_parameters");
  expect_refused(dir, "llama", ", \"attention_dropout\": 0.1", "attention_dropout");
  expect_refused(dir, "llama", ", \"partial_rotary_factor\": 0.5", "partial_rotary_factor");
  expect_refused(dir, "llama", ", \"head_dim\": 7", "head_dim");
  expect_refused(dir, "llama", ", \"tie_word_embeddings\": 1", "tie_word_embeddings");
  expect_refused(dir, "llama", ", \"attention_bias\": \"yes\"", "attention_bias");
  expect_refused(dir, "qwen2", ", \"layer_types\": [\"full_attention\", \"sliding_attention\"]",
                 "layer_types");
  expect_refused(dir, "qwen2", ", \"use_sliding_window\": true", "use_sliding_window");
  expect_refused(dir, "qwen2", ", \"hidden_act\": \"gelu\"", "hidden_act");
  {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path,
               "{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, \"intermediate_size\": 96, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 67, \"head_dim\": 16, "
               "\"num_local_experts\": 4}");
    struct rf_model_config c;
    RF_CHECK(rf_model_config_read(&c, path) == 0, "gpt_oss reads: %s", rf_error_msg());
    RF_CHECK(rf_model_config_load(&c, path) == 0 && c.moe.num_experts_per_tok == 4 && c.sliding_mask == 1 &&
                 c.sliding_window == 128,
             "gpt_oss is trained (transformers' defaults: top-4, sliding window 128 on even layers): %s",
             rf_error_msg());
    unlink(path);
  }
  rmdir(dir);
}

int main(void) {
  RF_ASSERT(mkdtemp(tmp));
  test_variant("llama_tied");
  test_variant("llama_bias");
  test_variant("qwen2_tied");
  test_refused();
  test_train();
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
  if (rf_test_failures == 0) RF_CHECK(system(cmd) == 0, "cleanup");
  return rf_test_finish("test_model_fields");
}
