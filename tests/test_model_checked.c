/* rf-test: timeout=60 */
/* The model on the checked device (src/device/device_checked.c: memory the host cannot read,
 * streams that run late on worker threads) through its kernel table (rf_model_kernels_checked)
 * against the same model on the host (rf_model_kernels_host): one forward and backward of a
 * tiny LLaMA with every bias (tests/data/llama_bias_config.json, 2 sequences of 70 tokens:
 * attention's 64-row blocks and a partial one), a tiny Mixtral and a tiny qwen3_moe (q/k norms,
 * a dense layer; tests/data/mixtral_ref_config.json, qwen3_moe_ref_config.json, 2 sequences of 13 tokens)
 * a tiny gpt_oss (tests/data/gpt_oss_ref_config.json: every GPT-OSS entry of the table) and two tiny
 * deepseek_v3 (tests/data/deepseek_v3_ref_config.json, _q_: every latent-attention entry; _moe_: the
 * router_group_ entries, the fused routed experts, the shared experts, the balancing bias),
 * with the weights and the gradients in device memory (uploaded and read back by rf_device_copy). The loss,
 * the load-balancing loss, the logits and every gradient are the host's bit for bit (memcmp) in f32 and bf16
 * compute, with f32 and with bf16 weights, and with FP8 block weights (rf_model_ws_set_fp8); every gradient
 * but the balancing bias's is non-zero (so equality is not vacuous). Sampling (rf_model_generate, reading the
 * logits by a copy) draws the host's tokens. A host read of device memory anywhere in the step would fault
 * (SIGSEGV): the test passes only when there is none. The workspace refuses a kernel table missing an entry
 * (naming the device and the entry; a table without GPT-OSS's or MLA's entries, as the CUDA table was and is,
 * refuses a gpt_oss resp. a deepseek_v3 config only) and a host-memory table on device memory. The stage's
 * progress callback (the trainer's MPI progress) runs on the host thread, once per linear op as on the host,
 * never on a stream's. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"
#include "device/device.h"
#include "model/kernels.h"
#include "model/model.h"
#include "rf_test.h"

enum wmode { W_F32 = 0, W_BF16, W_FP8 };
static const char *wmode_name[] = {"f32 weights", "bf16 weights", "FP8 weights"};

/* A tiny model's description and its f32 weights (host), one array per tensor in
 * rf_model_desc_make's order. */
struct model {
  const char *label;
  struct rf_model_config cfg;
  struct rf_model_desc desc;
  struct rf_model_units map;
  int n_tensors, B, T;
  int first[64]; /* unit u's first tensor */
  const struct rf_model_tensor **t;
  float **w;
  int32_t *tokens, *targets;
};

static void model_make(struct model *m, const char *label, const char *config, int B, int T) {
  memset(m, 0, sizeof *m);
  m->label = label;
  RF_ASSERT(rf_model_config_load(&m->cfg, config) == 0);
  rf_model_desc_make(&m->cfg, &m->desc);
  rf_model_units_find(&m->cfg, &m->map);
  m->B = B, m->T = T;
  m->n_tensors = m->desc.n_tensors;
  m->t = rf_xcalloc((size_t)m->n_tensors, sizeof(const struct rf_model_tensor *));
  m->w = rf_xcalloc((size_t)m->n_tensors, sizeof *m->w);
  uint64_t rng = 20261203;
  RF_ASSERT(m->desc.n_units <= 64);
  int k = 0;
  for (int u = 0; u < m->desc.n_units; u++) {
    m->first[u] = k;
    for (int i = 0; i < m->desc.units[u].n_tensors; i++, k++) {
      const struct rf_model_tensor *t = &m->desc.units[u].tensors[i];
      m->t[k] = t;
      m->w[k] = rf_xmalloc((size_t)t->numel * sizeof(float));
      int norm = t->ndim == 1 && strstr(t->name, "norm") != NULL;
      for (int64_t e = 0; e < t->numel; e++)
        m->w[k][e] = norm ? 1.0f + 0.1f * rf_test_rand_f32(&rng) : 0.15f * rf_test_rand_f32(&rng);
    }
  }
  int n = B * T;
  m->tokens = rf_xmalloc((size_t)n * sizeof(int32_t));
  m->targets = rf_xmalloc((size_t)n * sizeof(int32_t));
  for (int i = 0; i < n; i++) {
    m->tokens[i] =
        (int32_t)(rf_test_rand_f32(&rng) * 0.5f * (float)m->cfg.vocab_size + 0.5f * m->cfg.vocab_size);
    m->targets[i] = i % 11 == 5 ? -1 : (m->tokens[i] * 7 + 3) % m->cfg.vocab_size; /* some ignored */
    if (m->tokens[i] >= m->cfg.vocab_size) m->tokens[i] = m->cfg.vocab_size - 1;
  }
}

static void model_free(struct model *m) {
  for (int k = 0; k < m->n_tensors; k++) free(m->w[k]);
  free(m->w);
  free(m->t);
  free(m->tokens);
  free(m->targets);
  rf_model_desc_free(&m->desc);
}

/* Where a run keeps its weights and gradients: the host heap (dev NULL) or a device. */
struct place {
  struct rf_device *dev;
  struct rf_device_stream *s;
};

static void *put(const struct place *p, const void *src, size_t bytes) {
  if (!p->dev) {
    void *d = rf_xmalloc(bytes ? bytes : 1);
    memcpy(d, src, bytes);
    return d;
  }
  void *d = rf_device_alloc(p->dev, bytes, 64);
  rf_device_copy(p->dev, d, src, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, p->s);
  return d;
}

static void *zeros(const struct place *p, size_t bytes) {
  return p->dev ? rf_device_alloc(p->dev, bytes, 64) : rf_xcalloc(1, bytes ? bytes : 1);
}

static void get(const struct place *p, void *dst, const void *src, size_t bytes) {
  if (p->dev)
    rf_device_copy(p->dev, dst, src, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, p->s);
  else
    memcpy(dst, src, bytes);
}

static void drop(const struct place *p, const void *ptr) {
  union {
    const void *in;
    void *out;
  } u = {.in = ptr}; /* the weights' pointers are const */
  if (p->dev)
    rf_device_release(p->dev, u.out);
  else
    free(u.out);
}

/* The same bits (a NaN is never the same). */
static int same_bits(double a, double b) {
  uint64_t x, y;
  memcpy(&x, &a, sizeof x);
  memcpy(&y, &b, sizeof y);
  return x == y && a == a;
}

/* What one forward and backward gave (host memory). */
struct result {
  double loss, aux;
  float *logits;
  float **g;
  int32_t gen[24];
  int progress_calls, progress_elsewhere;
};

static void result_free(const struct model *m, struct result *r) {
  for (int k = 0; k < m->n_tensors; k++) free(r->g[k]);
  free(r->g);
  free(r->logits);
}

/* Tensor k as the run's weights: f32, bf16, or (a linear weight under FP8) e4m3 codes with
 * 128 x 128 tile scales, each expert tiled on its own as after a gather. */
static struct rf_model_weight place_weight(const struct model *m, const struct place *p, int k,
                                           enum wmode wm) {
  const struct rf_model_tensor *t = m->t[k];
  size_t numel = (size_t)t->numel;
  if (wm == W_BF16) {
    uint16_t *h = rf_xmalloc(numel * sizeof(uint16_t));
    rf_bf16_from_f32_n(h, m->w[k], numel);
    struct rf_model_weight w = {.bf16 = put(p, h, numel * sizeof(uint16_t))};
    free(h);
    return w;
  }
  if (wm == W_FP8 && t->fp8) {
    int64_t experts = t->ndim == 3 ? t->shape[0] : 1;
    int64_t rows = t->shape[t->ndim - 2], cols = t->shape[t->ndim - 1];
    struct rf_fp8_grid grid = {rows, cols, RF_FP8_TILE, RF_FP8_TILE};
    int64_t tiles = rf_fp8_grid_tiles(&grid);
    uint8_t *codes = rf_xmalloc(numel);
    float *scales = rf_xmalloc((size_t)(experts * tiles) * sizeof(float));
    for (int64_t e = 0; e < experts; e++)
      RF_ASSERT(rf_fp8_quantize(&grid, m->w[k] + e * rows * cols, 0, t->name, codes + e * rows * cols,
                                scales + e * tiles) == 0);
    struct rf_model_weight w = {.fp8 = put(p, codes, numel),
                                .fp8_scales = put(p, scales, (size_t)(experts * tiles) * sizeof(float))};
    free(codes);
    free(scales);
    return w;
  }
  return (struct rf_model_weight){.f32 = put(p, m->w[k], numel * sizeof(float))};
}

static void drop_weight(const struct place *p, const struct rf_model_weight *w) {
  const void *ptrs[] = {w->f32, w->bf16, w->fp8, w->fp8_scales};
  for (int i = 0; i < 4; i++)
    if (ptrs[i]) drop(p, ptrs[i]);
}

/* The stage's progress callback (the trainer's MPI progress): counted, and where it ran. */
struct progress {
  pthread_t host;
  int calls, elsewhere;
};

static void note_progress(void *ctx) {
  struct progress *pr = ctx;
  pr->calls++;
  pr->elsewhere += !pthread_equal(pthread_self(), pr->host);
}

/* One forward and backward as the trainer runs it on one rank (loss = CE sum, the balance
 * gradient set from the statistics read back), on the host (dev NULL) or on dev. */
static void run(const struct model *m, struct rf_device *dev, enum rf_dtype compute, enum wmode wm,
                struct result *out) {
  struct rf_model_ws ws;
  struct place p = {dev, NULL};
  if (dev) {
    p.s = rf_device_stream_create(dev);
    RF_ASSERT(rf_model_ws_init_on(&ws, dev, p.s, &m->cfg, m->B, m->T) == 0);
  } else {
    RF_ASSERT(rf_model_ws_init(&ws, &m->cfg, m->B, m->T) == 0);
  }
  RF_ASSERT(rf_model_ws_set_compute(&ws, compute) == 0);
  if (wm == W_FP8) rf_model_ws_set_fp8(&ws, 0);
  struct progress pr = {pthread_self(), 0, 0};
  ws.stage.progress = note_progress;
  ws.stage.progress_ctx = &pr;
  int nt = m->n_tensors, n = m->B * m->T, v = m->cfg.vocab_size;
  struct rf_model_weight *wt = rf_xcalloc((size_t)nt, sizeof *wt);
  float **g = rf_xcalloc((size_t)nt, sizeof *g);
  for (int k = 0; k < nt; k++) {
    wt[k] = place_weight(m, &p, k, wm);
    g[k] = zeros(&p, (size_t)m->t[k]->numel * sizeof(float));
  }
  const struct rf_model_units *map = &m->map;
  int L = m->cfg.num_hidden_layers;
  const struct rf_model_weight *embed = &wt[m->first[map->embed_unit] + map->embed_tensor];
  RF_ASSERT(rf_model_embed_forward(&ws, embed, m->tokens) == 0);
  for (int l = 0; l < L; l++) rf_model_layer_forward(&ws, l, &wt[m->first[map->first_layer + l]]);
  out->loss = rf_model_head_forward(&ws, &wt[m->first[map->head_unit]], m->targets);
  out->logits = rf_xmalloc((size_t)n * v * sizeof(float));
  rf_model_ws_read_logits(&ws, 0, n, out->logits);
  out->aux = 0;
  if (rf_model_config_is_moe(&m->cfg) && rf_model_config_moe_layers(&m->cfg) > 0) {
    int e = m->cfg.moe.num_local_experts;
    double *st = rf_xcalloc(2 * (size_t)e, sizeof(double));
    rf_model_ws_moe_stats(&ws, st, st + e);
    out->aux = rf_model_moe_balance(&ws, st, st + e, (double)n * rf_model_config_moe_layers(&m->cfg), 0.05f);
    free(st);
  }
  rf_model_head_backward(&ws, &wt[m->first[map->head_unit]], &g[m->first[map->head_unit]], 1.0f / (float)n);
  for (int l = L - 1; l >= 0; l--)
    rf_model_layer_backward(&ws, l, &wt[m->first[map->first_layer + l]], &g[m->first[map->first_layer + l]]);
  rf_model_embed_backward(&ws, &g[m->first[map->embed_unit] + map->embed_tensor]);
  out->g = rf_xcalloc((size_t)nt, sizeof *out->g);
  for (int k = 0; k < nt; k++) {
    size_t bytes = (size_t)m->t[k]->numel * sizeof(float);
    out->g[k] = rf_xmalloc(bytes);
    get(&p, out->g[k], g[k], bytes);
  }
  rf_model_ws_free(&ws);
  out->progress_calls = pr.calls;
  out->progress_elsewhere = pr.elsewhere;
  /* sampling on a workspace of one sequence: the prefix recomputed, the last row's logits copied out */
  if (wm == W_F32 && compute == RF_DTYPE_F32) {
    struct rf_model_ws gen;
    if (dev)
      RF_ASSERT(rf_model_ws_init_on(&gen, dev, p.s, &m->cfg, 1, 8) == 0);
    else
      RF_ASSERT(rf_model_ws_init(&gen, &m->cfg, 1, 8) == 0);
    const struct rf_model_weight *units[64];
    for (int u = 0; u < m->desc.n_units; u++) units[u] = &wt[m->first[u]];
    memset(out->gen, 0, sizeof out->gen);
    memcpy(out->gen, m->tokens, 3 * sizeof(int32_t));
    uint64_t rng = 99;
    RF_ASSERT(rf_model_generate(&gen, units, out->gen, 3, 12, 0.9f, &rng) == 0);
    rf_model_ws_free(&gen);
  }
  for (int k = 0; k < nt; k++) {
    drop_weight(&p, &wt[k]);
    drop(&p, g[k]);
  }
  free(wt);
  free(g);
  if (dev) rf_device_stream_free(dev, p.s);
}

static void compare(const struct model *m, struct rf_device *dev, enum rf_dtype compute, enum wmode wm) {
  struct result h, c;
  run(m, NULL, compute, wm, &h);
  run(m, dev, compute, wm, &c);
  char what[128];
  snprintf(what, sizeof what, "%s, %s compute, %s", m->label, rf_dtype_name(compute), wmode_name[wm]);
  RF_CHECK(same_bits(h.loss, c.loss) && h.loss > 0, "%s: loss %.17g on the device, %.17g on the host", what,
           c.loss, h.loss);
  RF_CHECK(same_bits(h.aux, c.aux), "%s: balance loss %.17g on the device, %.17g on the host", what, c.aux,
           h.aux);
  size_t nl = (size_t)m->B * m->T * m->cfg.vocab_size;
  RF_CHECK(memcmp(h.logits, c.logits, nl * sizeof(float)) == 0, "%s: the logits differ", what);
  RF_CHECK(
      h.progress_calls > 0 && c.progress_calls == h.progress_calls && c.progress_elsewhere == 0,
      "%s: the progress callback ran %d times on the device's run (%d off the host thread), %d on the host's",
      what, c.progress_calls, c.progress_elsewhere, h.progress_calls);
  int same = 0, nonzero = 0;
  for (int k = 0; k < m->n_tensors; k++) {
    size_t numel = (size_t)m->t[k]->numel;
    int eq = memcmp(h.g[k], c.g[k], numel * sizeof(float)) == 0;
    same += eq;
    RF_CHECK(eq, "%s: d %s differs (max |diff| %g)", what, m->t[k]->name,
             rf_test_max_abs_diff(c.g[k], h.g[k], numel));
    int nz = rf_test_max_abs(h.g[k], numel) > 0;
    nonzero += nz;
    /* DeepSeek-V3's balancing bias takes no gradient (it chooses; rf_train_model_step moves it) */
    if (!strstr(m->t[k]->name, "e_score_correction_bias"))
      RF_CHECK(nz, "%s: d %s is zero on the host (the comparison would be vacuous)", what, m->t[k]->name);
  }
  if (wm == W_F32 && compute == RF_DTYPE_F32)
    RF_CHECK(memcmp(h.gen, c.gen, sizeof h.gen) == 0 && h.gen[11] >= 0,
             "%s: sampling drew other tokens on the device (%d %d %d vs %d %d %d)", what, c.gen[3], c.gen[4],
             c.gen[5], h.gen[3], h.gen[4], h.gen[5]);
  printf("  %-48s loss %.9g aux %.6g: %d of %d gradients equal bit for bit (%d non-zero)\n", what, h.loss,
         h.aux, same, m->n_tensors, nonzero);
  result_free(m, &h);
  result_free(m, &c);
}

/* A table missing an entry, and a host table on device memory, are refused naming why. */
static void check_refusals(struct rf_device *checked) {
  struct rf_model_config cfg;
  RF_ASSERT(rf_model_config_load(&cfg, "tests/data/llama_bias_config.json") == 0);
  struct rf_model_kernels partial = rf_model_kernels_host;
  partial.name = "partial";
  partial.linear_forward = NULL;
  RF_CHECK(
      rf_model_kernels_missing(&partial) && strcmp(rf_model_kernels_missing(&partial), "linear_forward") == 0,
      "the missing entry is named");
  RF_CHECK(rf_model_kernels_missing(&rf_model_kernels_host) == NULL &&
               rf_model_kernels_missing(&rf_model_kernels_checked) == NULL,
           "the host and checked tables are complete");
  struct rf_backend fake = {.name = "partial", .model = &partial};
  struct rf_device host;
  rf_device_host_init(&host, NULL);
  host.backend = &fake;
  struct rf_device_stream *hs = rf_device_stream_create(&host);
  struct rf_model_ws ws;
  int rc = rf_model_ws_init_on(&ws, &host, hs, &cfg, 1, 4);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "device host: the model's linear layers") &&
               strstr(rf_error_msg(), "linear_forward"),
           "a table without linear layers is refused, naming the device and the entry: %s",
           rc ? rf_error_msg() : "(accepted)");
  if (rc == 0) rf_model_ws_free(&ws);
  /* a table without GPT-OSS's and MLA's entries (the CUDA table's gaps until gpt_oss_cuda.cu; MLA's
   * still): a llama runs, a gpt_oss and a deepseek_v3 are refused */
  partial = rf_model_kernels_host;
  partial.attention_sink_forward = NULL, partial.attention_sink_backward = NULL;
  partial.swiglu_clamp_forward = NULL, partial.swiglu_clamp_backward = NULL;
  partial.weight_transpose = NULL, partial.transpose_add = NULL;
  partial.mla_attention_forward = NULL, partial.mla_attention_backward = NULL, partial.mla_rope_apply = NULL;
  partial.mla_kv_expand = NULL, partial.mla_kv_expand_backward = NULL;
  rc = rf_model_ws_init_on(&ws, &host, hs, &cfg, 1, 4);
  RF_CHECK(rc == 0, "a llama needs none of GPT-OSS's entries: %s", rc ? rf_error_msg() : "");
  if (rc == 0) rf_model_ws_free(&ws);
  struct rf_model_config oss;
  RF_ASSERT(rf_model_config_load(&oss, "tests/data/gpt_oss_ref_config.json") == 0);
  rc = rf_model_ws_init_on(&ws, &host, hs, &oss, 1, 4);
  RF_CHECK(
      rc == -1 && strstr(rf_error_msg(), "device host") && strstr(rf_error_msg(), "attention_sink_forward"),
      "a table without GPT-OSS's entries refuses gpt_oss, naming the first: %s",
      rc ? rf_error_msg() : "(accepted)");
  if (rc == 0) rf_model_ws_free(&ws);
  struct rf_model_config ds;
  RF_ASSERT(rf_model_config_load(&ds, "tests/data/deepseek_v3_ref_config.json") == 0);
  rc = rf_model_ws_init_on(&ws, &host, hs, &ds, 1, 4);
  RF_CHECK(
      rc == -1 && strstr(rf_error_msg(), "device host") && strstr(rf_error_msg(), "mla_attention_forward"),
      "a table without the mla_ entries refuses deepseek_v3, naming the first: %s",
      rc ? rf_error_msg() : "(accepted)");
  if (rc == 0) rf_model_ws_free(&ws);
  /* with MLA but without DeepSeek-V3's router (the CUDA table lacks both): its MoE layers refused */
  partial = rf_model_kernels_host;
  partial.router_group_forward = NULL, partial.router_group_backward = NULL;
  RF_ASSERT(rf_model_config_load(&ds, "tests/data/deepseek_v3_moe_ref_config.json") == 0);
  rc = rf_model_ws_init_on(&ws, &host, hs, &ds, 1, 4);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "router_group_forward") &&
               strstr(rf_error_msg(), "group-limited router"),
           "a table without the router_group_ entries refuses deepseek_v3's MoE layers: %s",
           rc ? rf_error_msg() : "(accepted)");
  if (rc == 0) rf_model_ws_free(&ws);
  rf_device_stream_free(&host, hs);
  /* the host table on the checked device's memory */
  struct rf_backend hostly = {.name = "hostly", .model = &rf_model_kernels_host};
  const struct rf_backend *was = checked->backend;
  checked->backend = &hostly;
  struct rf_device_stream *cs = rf_device_stream_create(checked);
  rc = rf_model_ws_init_on(&ws, checked, cs, &cfg, 1, 4);
  RF_CHECK(rc == -1 && strstr(rf_error_msg(), "reads host memory"),
           "the host table on the checked device is refused: %s", rc ? rf_error_msg() : "(accepted)");
  if (rc == 0) rf_model_ws_free(&ws);
  rf_device_stream_free(checked, cs);
  checked->backend = was;
}

int main(void) {
  struct rf_device dev;
  rf_device_checked_init(&dev, 0, NULL);
  dev.backend = rf_backend_find(
      "checked"); /* as rf_backend_open sets it (training refuses it until the step is ready) */
  RF_CHECK(dev.backend && dev.backend->model == &rf_model_kernels_checked,
           "the checked backend carries the checked table");
  check_refusals(&dev);
  struct model m;
  model_make(&m, "llama (biases)", "tests/data/llama_bias_config.json", 2, 70);
  compare(&m, &dev, RF_DTYPE_F32, W_F32);
  compare(&m, &dev, RF_DTYPE_BF16, W_F32);
  compare(&m, &dev, RF_DTYPE_F32, W_BF16);
  compare(&m, &dev, RF_DTYPE_BF16, W_BF16);
  compare(&m, &dev, RF_DTYPE_F32, W_FP8);
  model_free(&m);
  const char *moe[][2] = {{"mixtral", "tests/data/mixtral_ref_config.json"},
                          {"qwen3_moe (q/k norms, a dense layer)", "tests/data/qwen3_moe_ref_config.json"}};
  for (int i = 0; i < 2; i++) {
    model_make(&m, moe[i][0], moe[i][1], 2, 13);
    compare(&m, &dev, RF_DTYPE_F32, W_F32);
    compare(&m, &dev, RF_DTYPE_BF16, W_F32);
    compare(&m, &dev, RF_DTYPE_F32, W_BF16);
    compare(&m, &dev, RF_DTYPE_F32, W_FP8);
    model_free(&m);
  }
  /* gpt_oss: the sinks' attention with a window of 4 < 13, YaRN, the clamped SwiGLU, the transposes
   * (no FP8: refused for its [in, out] experts) */
  model_make(&m, "gpt_oss (sinks, windows, [in, out] experts)", "tests/data/gpt_oss_ref_config.json", 2, 13);
  compare(&m, &dev, RF_DTYPE_F32, W_F32);
  compare(&m, &dev, RF_DTYPE_BF16, W_F32);
  compare(&m, &dev, RF_DTYPE_F32, W_BF16);
  model_free(&m);
  /* deepseek_v3: multi-head latent attention (every mla_ entry), q_lora_rank and q_proj, v's head dim
   * != q's, interleaved and rotate_half rotary parts (no FP8: refused for the latent attention) */
  const char *ds[][2] = {
      {"deepseek_v3 (latent attention, low-rank q)", "tests/data/deepseek_v3_ref_config.json"},
      {"deepseek_v3 (latent attention, q_proj)", "tests/data/deepseek_v3_q_ref_config.json"},
      {"deepseek_v3 (group-limited router, shared experts)", "tests/data/deepseek_v3_moe_ref_config.json"}};
  for (int i = 0; i < 3; i++) {
    model_make(&m, ds[i][0], ds[i][1], 2, 13);
    compare(&m, &dev, RF_DTYPE_F32, W_F32);
    compare(&m, &dev, RF_DTYPE_BF16, W_F32);
    compare(&m, &dev, RF_DTYPE_F32, W_BF16);
    model_free(&m);
  }
  rf_device_free(&dev);
  return rf_test_finish("test_model_checked");
}
