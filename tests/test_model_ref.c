/* rf-test: timeout=60 */
/* The whole model against Hugging Face's LlamaForCausalLM: tests/ref_llama.py
 * wrote the weights, tokens, targets, logits, mean loss and every parameter
 * gradient of a tiny model (hidden 64, inter 96, 2 layers, 4 heads, 2 kv heads,
 * vocab 67, B 2, T 9, two ignored targets), plus the logits of one 300-token
 * sequence (forward only), computed in float64 by PyTorch, to
 * tests/data/llama_ref.bin. Here the C model runs the same batch in f32 and every
 * tensor is compared:
 *   logits, loss         max|a-b| / max|ref| <= 2e-5 (also the 300-token logits)
 *   each gradient        max|a-b| / max|ref| <= 1e-4
 * The bf16-weight path in f32 compute (weights widened) is compared with the f32
 * path on the same bf16-rounded weights: loss within 1e-2 relative, logits and
 * gradients max|a-b| / max|ref| <= 5e-2.
 * bf16 compute (with the f32 weights, and with the bf16-rounded ones) against the
 * float64 reference, tolerances in units of bf16's unit roundoff u = 2^-8. First
 * order: a product with both operands rounded is off by <= 2u of sum|x||w| (the
 * products are exact in f32, f32 accumulation adds ~k 2^-24, negligible); bf16
 * weights add u. A logit carries the head product's 2u (+u) plus the residual
 * stream's error from the layers above it, which add small updates to the
 * embedding (< u here): logits <= 4u. The loss is a mean of log-softmax values
 * whose errors partly cancel: <= 1u. A gradient carries the rounding of its own
 * product (dW: dY and X, 2u; dX: dY and W, 2u (+u)) and the errors of the
 * forward activations and of the output gradient flowing in from above: <= 8u.
 * Measured: logits 2.2u, loss 0.24u, gradients 5.9u (bf16 weights).
 * Also: gradients are added (a second backward doubles them), greedy generation
 * picks HF's argmax, the config.json written by transformers loads, and bad configs
 * fail with messages naming the file and the field. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_test.h"

#define REF_PATH "tests/data/llama_ref.bin"

/* bf16 compute (every linear layer's operands rounded to bf16, unit roundoff
 * u = 2^-8, f32 accumulation) against the float64 reference: */
#define BF16_U 0x1.0p-8
#define BF16_TOL_LOSS (1.0 * BF16_U)
#define BF16_TOL_LOGITS (4.0 * BF16_U)
#define BF16_TOL_GRAD (8.0 * BF16_U)
#define REF_CFG "tests/data/llama_ref_config.json"

struct ref {
  struct rf_model_config cfg;
  struct rf_model_desc desc;
  int B, T;
  double loss;
  int32_t *tokens, *targets;
  float *logits;
  int n_tensors;
  int64_t *numel;
  float **w, **g; /* [n_tensors] */
  int t_long;     /* a forward-only sequence of t_long tokens (version 2) */
  int32_t *tokens_long;
  float *logits_long;
};

struct reader {
  const char *p;
  size_t left;
  int ok;
};

static void rd(struct reader *r, void *dst, size_t bytes) {
  if (r->left < bytes) {
    r->ok = 0;
    memset(dst, 0, bytes);
    return;
  }
  memcpy(dst, r->p, bytes);
  r->p += bytes;
  r->left -= bytes;
}

static int ref_load(struct ref *ref, const char *path) {
  char *buf = NULL;
  size_t n = 0;
  if (rf_file_read_all(path, &buf, &n) != 0) return -1;
  struct reader r = {buf, n, 1};
  uint32_t magic = 0, version = 0;
  rd(&r, &magic, 4);
  rd(&r, &version, 4);
  if (magic != 0x4645524Cu || version != 2) {
    free(buf);
    return rf_error_set(__FILE__, __LINE__, "%s: bad magic/version", path);
  }
  int32_t h[9];
  rd(&r, h, sizeof(h));
  double d[3];
  rd(&r, d, sizeof(d));
  struct rf_model_config *c = &ref->cfg;
  c->hidden_size = h[0], c->intermediate_size = h[1], c->num_hidden_layers = h[2];
  c->num_attention_heads = h[3], c->num_key_value_heads = h[4], c->vocab_size = h[5];
  c->max_position_embeddings = h[6];
  c->rms_norm_eps = (float)d[0];
  c->rope_theta = d[1];
  ref->loss = d[2];
  ref->B = h[7], ref->T = h[8];
  if (rf_model_config_check(c, path) != 0) {
    free(buf);
    return -1;
  }
  size_t nt = (size_t)ref->B * ref->T;
  ref->tokens = rf_xmalloc(nt * 4);
  ref->targets = rf_xmalloc(nt * 4);
  ref->logits = rf_xmalloc(nt * (size_t)c->vocab_size * 4);
  rd(&r, ref->tokens, nt * 4);
  rd(&r, ref->targets, nt * 4);
  rd(&r, ref->logits, nt * (size_t)c->vocab_size * 4);
  rf_model_desc_make(c, &ref->desc);
  ref->n_tensors = ref->desc.n_tensors;
  ref->numel = rf_xcalloc((size_t)ref->n_tensors, sizeof(int64_t));
  ref->w = rf_xcalloc((size_t)ref->n_tensors, sizeof(float *));
  ref->g = rf_xcalloc((size_t)ref->n_tensors, sizeof(float *));
  int k = 0;
  for (int u = 0; u < ref->desc.n_units; u++)
    for (int i = 0; i < ref->desc.units[u].n_tensors; i++, k++)
      ref->numel[k] = ref->desc.units[u].tensors[i].numel;
  for (int pass = 0; pass < 2; pass++) {
    for (k = 0; k < ref->n_tensors; k++) {
      float **dst = pass == 0 ? &ref->w[k] : &ref->g[k];
      *dst = rf_xmalloc((size_t)ref->numel[k] * 4);
      rd(&r, *dst, (size_t)ref->numel[k] * 4);
    }
  }
  int32_t tl = 0;
  rd(&r, &tl, 4);
  ref->t_long = tl > 0 && tl <= c->max_position_embeddings ? tl : 0;
  if (ref->t_long > 0) {
    ref->tokens_long = rf_xmalloc((size_t)tl * 4);
    ref->logits_long = rf_xmalloc((size_t)tl * (size_t)c->vocab_size * 4);
    rd(&r, ref->tokens_long, (size_t)tl * 4);
    rd(&r, ref->logits_long, (size_t)tl * (size_t)c->vocab_size * 4);
  }
  int complete = r.ok && r.left == 0 && ref->t_long > 0;
  free(buf);
  if (!complete) return rf_error_set(__FILE__, __LINE__, "%s: size does not match its header", path);
  return 0;
}

static void ref_free(struct ref *ref) {
  for (int k = 0; k < ref->n_tensors; k++) {
    free(ref->w[k]);
    free(ref->g[k]);
  }
  free(ref->w);
  free(ref->g);
  free(ref->numel);
  rf_model_desc_free(&ref->desc);
  free(ref->tokens);
  free(ref->targets);
  free(ref->logits);
  free(ref->tokens_long);
  free(ref->logits_long);
}

/* max|a - b| / max|b|; +infinity when either holds a NaN or an infinity */
static double rel_err(const float *a, const float *b, size_t n) {
  double m = rf_test_max_abs(b, n), e = rf_test_max_abs_diff(a, b, n);
  if (!isfinite(e) || !isfinite(m)) return INFINITY;
  return m > 0 ? e / m : e;
}

/* One forward + backward with the given weights; grads must be zeroed by the
 * caller (they are added to). Returns the loss sum; logits copied out. */
struct run {
  double loss_sum;
  int count;
  float *logits;
};

static void run_model(const struct ref *ref, struct rf_model_ws *ws, const struct rf_model_weight *wt,
                      float **grads, float *logits_out, double *loss_sum, int count) {
  const struct rf_model_config *c = &ref->cfg;
  int L = c->num_hidden_layers;
  RF_ASSERT(rf_model_embed_forward(ws, &wt[0], ref->tokens) == 0);
  for (int l = 0; l < L; l++) rf_model_layer_forward(ws, l, &wt[1 + 9 * l]);
  *loss_sum = rf_model_head_forward(ws, &wt[1 + 9 * L], ref->targets);
  size_t nl = (size_t)ref->B * ref->T * c->vocab_size;
  if (logits_out) memcpy(logits_out, rf_model_ws_logits(ws, 0), nl * 4);
  rf_model_head_backward(ws, &wt[1 + 9 * L], &grads[1 + 9 * L], 1.0f / (float)count);
  for (int l = L - 1; l >= 0; l--) rf_model_layer_backward(ws, l, &wt[1 + 9 * l], &grads[1 + 9 * l]);
  rf_model_embed_backward(ws, &grads[0]);
}

static float **grads_alloc(const struct ref *ref) {
  float **g = rf_xcalloc((size_t)ref->n_tensors, sizeof(float *));
  for (int k = 0; k < ref->n_tensors; k++) g[k] = rf_xcalloc((size_t)ref->numel[k], 4);
  return g;
}

static void grads_free(const struct ref *ref, float **g) {
  for (int k = 0; k < ref->n_tensors; k++) free(g[k]);
  free(g);
}

static void test_against_hf(const struct ref *ref) {
  const struct rf_model_config *c = &ref->cfg;
  size_t nt = (size_t)ref->B * ref->T, nl = nt * c->vocab_size;
  int count = 0;
  for (size_t i = 0; i < nt; i++) count += ref->targets[i] >= 0;
  struct rf_model_ws ws;
  RF_CHECK(rf_model_ws_init(&ws, c, ref->B, ref->T) == 0, "ws_init: %s", rf_error_msg());
  RF_CHECK(rf_model_ws_bytes(c, ref->B, ref->T) == ws.bytes, "predicted workspace %zu bytes, allocated %zu",
           rf_model_ws_bytes(c, ref->B, ref->T), ws.bytes);
  struct rf_model_weight *wt = rf_xcalloc((size_t)ref->n_tensors, sizeof(*wt));
  for (int k = 0; k < ref->n_tensors; k++) wt[k].f32 = ref->w[k];
  float **grads = grads_alloc(ref);
  float *logits = rf_xmalloc(nl * 4);
  double loss_sum = 0.0;
  run_model(ref, &ws, wt, grads, logits, &loss_sum, count);

  double loss = loss_sum / count;
  RF_CHECK_CLOSE(loss, ref->loss, 2e-5, 0.0, "mean loss against HF");
  double e_logits = rel_err(logits, ref->logits, nl);
  RF_CHECK(e_logits <= 2e-5, "logits: rel err %.3g > 2e-5", e_logits);
  double worst = 0.0;
  int k = 0;
  for (int u = 0; u < ref->desc.n_units; u++) {
    for (int i = 0; i < ref->desc.units[u].n_tensors; i++, k++) {
      const struct rf_model_tensor s = ref->desc.units[u].tensors[i];
      double e = rel_err(grads[k], ref->g[k], (size_t)ref->numel[k]);
      worst = rf_test_max(worst, e);
      RF_CHECK(rf_test_max_abs(ref->g[k], (size_t)ref->numel[k]) > 0, "%s: reference gradient is zero",
               s.name);
      RF_CHECK(e <= 1e-4, "gradient of %s: rel err %.3g > 1e-4", s.name, e);
    }
  }
  printf("f32 vs HF: loss %.9f (HF %.9f), logits rel err %.2g, worst gradient rel err %.2g\n", loss,
         ref->loss, e_logits, worst);

  /* Gradients are added: a second backward on top doubles them. */
  run_model(ref, &ws, wt, grads, NULL, &loss_sum, count);
  double e2 = 0.0;
  for (k = 0; k < ref->n_tensors; k++) {
    float *twice = rf_xmalloc((size_t)ref->numel[k] * 4);
    for (int64_t j = 0; j < ref->numel[k]; j++) twice[j] = 2.0f * ref->g[k][j];
    e2 = rf_test_max(e2, rel_err(grads[k], twice, (size_t)ref->numel[k]));
    free(twice);
  }
  RF_CHECK(e2 <= 1e-4, "second backward does not add (rel err %.3g)", e2);

  /* Greedy generation from a prefix of sequence 1 picks HF's argmax at that row. */
  for (int len = 1; len <= ref->T; len += 4) {
    int32_t seq[64];
    memcpy(seq, ref->tokens + ref->T, sizeof(int32_t) * (size_t)len);
    uint64_t rng = 7;
    RF_CHECK(rf_model_generate(&ws, (const struct rf_model_weight *const[]){&wt[0], &wt[1], &wt[10], &wt[19]},
                               seq, len, len + 1, 0.0f, &rng) == 0,
             "generate: %s", rf_error_msg());
    const float *row = ref->logits + ((size_t)ref->T + len - 1) * c->vocab_size;
    int best = 0;
    for (int j = 1; j < c->vocab_size; j++)
      if (row[j] > row[best]) best = j;
    RF_CHECK(seq[len] == best, "greedy token after %d tokens: %d, HF argmax %d", len, seq[len], best);
  }
  RF_CHECK(ws.b == ref->B && ws.t == ref->T, "generate restores the workspace shape");

  /* A token outside the vocabulary is an error naming it; shapes above capacity too. */
  {
    int32_t *bad = rf_xmalloc(nt * sizeof(int32_t));
    memcpy(bad, ref->tokens, nt * sizeof(int32_t));
    bad[5] = c->vocab_size;
    RF_CHECK(rf_model_embed_forward(&ws, &wt[0], bad) == -1 && strstr(rf_error_msg(), "67"),
             "out-of-range token: %s", rf_error_msg());
    bad[5] = -2;
    RF_CHECK(rf_model_embed_forward(&ws, &wt[0], bad) == -1, "negative token");
    free(bad);
    RF_CHECK(rf_model_ws_set_shape(&ws, ref->B + 1, ref->T) == -1, "batch above capacity");
    RF_CHECK(rf_model_ws_set_shape(&ws, 1, ref->T + 1) == -1, "sequence above capacity");
    struct rf_model_ws ws2;
    RF_CHECK(rf_model_ws_init(&ws2, c, 1, c->max_position_embeddings + 1) == -1 &&
                 strstr(rf_error_msg(), "max_position_embeddings"),
             "workspace longer than max_position_embeddings: %s", rf_error_msg());
  }

  /* Temperature sampling follows the softmax: frequencies over many draws. */
  {
    float lg[4] = {0.0f, 1.0f, 2.0f, -1.0f};
    int counts[4] = {0, 0, 0, 0};
    uint64_t rng = 42;
    int draws = 200000;
    for (int i = 0; i < draws; i++) counts[rf_model_sample_logits(lg, 4, 1.0f, &rng)]++;
    double z = 0.0;
    for (int j = 0; j < 4; j++) z += exp((double)lg[j]);
    for (int j = 0; j < 4; j++)
      RF_CHECK(fabs((double)counts[j] / draws - exp((double)lg[j]) / z) <= 5e-3,
               "sampling frequency of %d: %g vs %g", j, (double)counts[j] / draws, exp((double)lg[j]) / z);
    RF_CHECK(rf_model_sample_logits(lg, 4, 0.0f, &rng) == 2, "temperature 0 is the argmax");
  }

  /* bf16 weights: same weights rounded to bf16, f32 path vs bf16 path. */
  uint16_t **wb = rf_xcalloc((size_t)ref->n_tensors, sizeof(uint16_t *));
  float **wr = rf_xcalloc((size_t)ref->n_tensors, sizeof(float *));
  struct rf_model_weight *wtb = rf_xcalloc((size_t)ref->n_tensors, sizeof(*wtb));
  for (k = 0; k < ref->n_tensors; k++) {
    size_t n = (size_t)ref->numel[k];
    wb[k] = rf_xmalloc(n * 2);
    wr[k] = rf_xmalloc(n * 4);
    rf_bf16_from_f32_n(wb[k], ref->w[k], n);
    rf_f32_from_bf16_n(wr[k], wb[k], n);
    wt[k].f32 = wr[k];
    wtb[k].f32 = NULL;
    wtb[k].bf16 = wb[k];
  }
  float **ga = grads_alloc(ref), **gb = grads_alloc(ref);
  float *logits_b = rf_xmalloc(nl * 4);
  double la = 0.0, lb = 0.0;
  run_model(ref, &ws, wt, ga, logits, &la, count);
  run_model(ref, &ws, wtb, gb, logits_b, &lb, count);
  RF_CHECK_CLOSE(lb, la, 1e-2, 0.0, "bf16-weight loss vs f32 path");
  double eb = rel_err(logits_b, logits, nl);
  RF_CHECK(eb <= 5e-2, "bf16 logits rel err %.3g > 5e-2", eb);
  double worst_b = 0.0;
  for (k = 0; k < ref->n_tensors; k++) {
    double e = rel_err(gb[k], ga[k], (size_t)ref->numel[k]);
    worst_b = rf_test_max(worst_b, e);
    RF_CHECK(e <= 5e-2, "bf16 gradient of tensor %d: rel err %.3g > 5e-2", k, e);
  }
  printf(
      "bf16 vs f32 (same rounded weights): loss %.6f vs %.6f, logits rel err %.2g, worst gradient rel err "
      "%.2g\n",
      lb / count, la / count, eb, worst_b);

  /* bf16 compute against the float64 reference (see the tolerances at the top). */
  for (k = 0; k < ref->n_tensors; k++) wt[k].f32 = ref->w[k];
  size_t bytes_f32 = ws.bytes;
  RF_CHECK(rf_model_ws_set_compute(&ws, RF_DTYPE_BF16) == 0, "set_compute: %s", rf_error_msg());
  RF_CHECK(ws.bytes - bytes_f32 == rf_model_ws_compute_bytes(c, ref->B, ref->T, RF_DTYPE_BF16),
           "bf16 staging: predicted %zu bytes, allocated %zu",
           rf_model_ws_compute_bytes(c, ref->B, ref->T, RF_DTYPE_BF16), ws.bytes - bytes_f32);
  const struct rf_model_weight *sets[] = {wt, wtb};
  for (int set = 0; set < 2; set++) {
    float **gc = grads_alloc(ref);
    double lc = 0.0;
    run_model(ref, &ws, sets[set], gc, logits_b, &lc, count);
    double el = rel_err(logits_b, ref->logits, nl), eloss = fabs(lc / count - ref->loss) / ref->loss;
    double worst_c = 0.0;
    for (k = 0; k < ref->n_tensors; k++)
      worst_c = fmax(worst_c, rel_err(gc[k], ref->g[k], (size_t)ref->numel[k]));
    RF_CHECK(eloss <= BF16_TOL_LOSS, "bf16 compute (%s weights): loss %.6f vs HF %.6f, rel %.3g > %g",
             set ? "bf16" : "f32", lc / count, ref->loss, eloss, BF16_TOL_LOSS);
    RF_CHECK(el <= BF16_TOL_LOGITS, "bf16 compute (%s weights): logits rel err %.3g > %g",
             set ? "bf16" : "f32", el, BF16_TOL_LOGITS);
    RF_CHECK(worst_c <= BF16_TOL_GRAD, "bf16 compute (%s weights): worst gradient rel err %.3g > %g",
             set ? "bf16" : "f32", worst_c, BF16_TOL_GRAD);
    printf("bf16 compute (%s weights) vs HF float64: loss rel err %.2g, logits %.2g, worst gradient %.2g\n",
           set ? "bf16" : "f32", eloss, el, worst_c);
    grads_free(ref, gc);
  }

  for (k = 0; k < ref->n_tensors; k++) {
    free(wb[k]);
    free(wr[k]);
  }
  free(wb);
  free(wr);
  free(wtb);
  grads_free(ref, ga);
  grads_free(ref, gb);
  free(logits_b);
  grads_free(ref, grads);
  free(logits);
  free(wt);
  rf_model_ws_free(&ws);
}

/* The long sequence: rotary at positions up to 299 and five attention blocks,
 * forward only, logits max|a-b| / max|ref| <= 2e-5. */
static void test_long(const struct ref *ref) {
  const struct rf_model_config *c = &ref->cfg;
  int L = c->num_hidden_layers, T = ref->t_long;
  struct rf_model_ws ws;
  RF_CHECK(rf_model_ws_init(&ws, c, 1, T) == 0, "ws_init: %s", rf_error_msg());
  struct rf_model_weight *wt = rf_xcalloc((size_t)ref->n_tensors, sizeof(*wt));
  for (int k = 0; k < ref->n_tensors; k++) wt[k].f32 = ref->w[k];
  RF_CHECK(rf_model_embed_forward(&ws, &wt[0], ref->tokens_long) == 0, "embed: %s", rf_error_msg());
  for (int l = 0; l < L; l++) rf_model_layer_forward(&ws, l, &wt[1 + 9 * l]);
  rf_model_head_forward(&ws, &wt[1 + 9 * L], NULL);
  size_t nl = (size_t)T * c->vocab_size;
  double e = rel_err(rf_model_ws_logits(&ws, 0), ref->logits_long, nl);
  /* the last rows alone (the largest positions) */
  size_t tail = (size_t)(T - 44) * c->vocab_size;
  double e_tail = rel_err(rf_model_ws_logits(&ws, T - 44), ref->logits_long + tail, nl - tail);
  printf("long sequence (T = %d) vs HF: logits rel err %.2g (positions >= %d: %.2g)\n", T, e, T - 44, e_tail);
  RF_CHECK(e <= 2e-5, "long-sequence logits rel err %.3g > 2e-5", e);
  RF_CHECK(e_tail <= 2e-5, "long-sequence logits at the end rel err %.3g > 2e-5", e_tail);
  free(wt);
  rf_model_ws_free(&ws);
}

/* ---- configuration files ---------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  if (!f) {
    RF_CHECK(0, "cannot write %s", path);
    return;
  }
  fputs(text, f);
  fclose(f);
}

static void expect_config_error(const char *dir, const char *json, const char *field) {
  char path[512];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  write_text(path, json);
  struct rf_model_config c;
  int rc = rf_model_config_load(&c, path);
  RF_CHECK(rc == -1, "config %s should fail", json);
  RF_CHECK(strstr(rf_error_msg(), path) != NULL, "message names the file: %s", rf_error_msg());
  RF_CHECK(strstr(rf_error_msg(), field) != NULL, "message names %s: %s", field, rf_error_msg());
}

static void test_config(const struct ref *ref) {
  struct rf_model_config c;
  RF_CHECK(rf_model_config_load(&c, REF_CFG) == 0, "HF config.json: %s", rf_error_msg());
  RF_CHECK(c.hidden_size == ref->cfg.hidden_size && c.intermediate_size == ref->cfg.intermediate_size &&
               c.num_hidden_layers == ref->cfg.num_hidden_layers &&
               c.num_attention_heads == ref->cfg.num_attention_heads &&
               c.num_key_value_heads == ref->cfg.num_key_value_heads && c.vocab_size == ref->cfg.vocab_size &&
               c.head_dim == 16,
           "HF config.json fields");
  RF_CHECK_CLOSE(c.rope_theta, 10000.0, 0.0, 0.0, "rope_theta from rope_parameters");
  RF_CHECK_CLOSE(c.rms_norm_eps, 1e-5, 1e-6, 0.0, "rms_norm_eps");
  RF_CHECK(rf_model_config_load(&c, "configs/llama-100m.json") == 0, "llama-100m: %s", rf_error_msg());
  int64_t np = rf_model_n_params(&c);
  RF_CHECK(np > 90000000 && np < 110000000, "llama-100m has %lld parameters", (long long)np);
  RF_CHECK(rf_model_config_load(&c, "configs/demo.json") == 0, "demo: %s", rf_error_msg());

  char dir[] = "/tmp/rf_model_cfg_XXXXXX";
  RF_ASSERT(mkdtemp(dir));
#define BASE "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"vocab_size\": 67"
  expect_config_error(dir, "{" BASE "}", "num_attention_heads");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 5}", "num_attention_heads");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 4, \"num_key_value_heads\": 3}",
                      "num_key_value_heads");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 0}", "num_attention_heads");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 4, \"model_type\": \"gpt2\"}", "model_type");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 4, \"rms_norm_eps\": -1}", "rms_norm_eps");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": \"4\"}", "num_attention_heads");
  expect_config_error(dir, "{\"hidden_size\": 64, ", "not valid JSON");
  expect_config_error(dir,
                      "{" BASE ", \"num_attention_heads\": 4, \"rope_scaling\": {\"rope_type\": \"llama3\"}}",
                      "rope_scaling");
  expect_config_error(dir, "{" BASE ", \"num_attention_heads\": 4, \"head_dim\": 7}", "head_dim");
  expect_config_error(
      dir,
      "{\"hidden_size\": 64, \"intermediate_size\": 9.5, \"num_hidden_layers\": 2, \"vocab_size\": 67, "
      "\"num_attention_heads\": 4}",
      "intermediate_size");
  {
    char p2[600];
    snprintf(p2, sizeof(p2), "%s/config.json", dir);
    write_text(p2, "{" BASE
                   ", \"num_attention_heads\": 4, \"rope_parameters\": {\"rope_theta\": 500000.0, "
                   "\"rope_type\": \"default\"}}");
    struct rf_model_config d;
    RF_CHECK(rf_model_config_load(&d, p2) == 0, "minimal config: %s", rf_error_msg());
    RF_CHECK(!d.tie_word_embeddings && !d.attention_bias && !d.mlp_bias, "defaults: untied, no biases");
    RF_CHECK(d.num_key_value_heads == 4 && d.head_dim == 16 && d.rope_theta == 500000.0 &&
                 d.max_position_embeddings == 2048 && fabsf(d.rms_norm_eps - 1e-6f) < 1e-12f,
             "defaults: kv heads = heads, rope_theta from rope_parameters, max positions 2048, eps 1e-6");
  }
  {
    /* tied embeddings, biases and a head_dim of their own are read (tests/test_model_fields.c runs them) */
    char p3[600];
    snprintf(p3, sizeof(p3), "%s/config.json", dir);
    write_text(p3, "{" BASE
                   ", \"num_attention_heads\": 4, \"tie_word_embeddings\": true, \"head_dim\": 32, "
                   "\"attention_bias\": true, \"mlp_bias\": true}");
    struct rf_model_config d;
    RF_CHECK(rf_model_config_load(&d, p3) == 0 && d.tie_word_embeddings && d.head_dim == 32 &&
                 d.attention_bias && d.mlp_bias,
             "tied, head_dim 32, biases: %s", rf_error_msg());
  }
#undef BASE
  char path[600];
  snprintf(path, sizeof(path), "%s/config.json", dir);
  unlink(path);
  RF_CHECK(rf_model_config_load(&c, path) == -1 && strstr(rf_error_msg(), path), "missing file: %s",
           rf_error_msg());
  rmdir(dir);
}

int main(int argc, char **argv) {
  struct ref ref;
  memset(&ref, 0, sizeof(ref));
  const char *path = argc > 1 ? argv[1] : REF_PATH;
  if (ref_load(&ref, path) != 0) {
    RF_CHECK(0, "loading the reference: %s", rf_error_msg());
    return rf_test_finish("test_model_ref");
  }
  test_config(&ref);
  test_against_hf(&ref);
  test_long(&ref);
  ref_free(&ref);
  return rf_test_finish("test_model_ref");
}
