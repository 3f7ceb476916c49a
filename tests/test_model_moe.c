/* rf-test: timeout=60 */
/* Mixtral (src/model/moe.c) against transformers' own MixtralForCausalLM:
 * tests/ref_mixtral.py wrote the weights, tokens, targets, logits, the loss (mean
 * cross-entropy + router_aux_loss_coef * the load-balancing loss, as transformers
 * adds it with output_router_logits) and every parameter gradient of a tiny model
 * (hidden 32, 4 experts of 24, top-2, 2 layers, vocab 51, B 2, T 7, two ignored
 * targets) in float64, routing away from ties, to tests/data/mixtral_ref.bin. The
 * C model runs the same batch in f32:
 *   logits, loss, aux      max|a-b| / max|ref| <= 2e-5
 *   each gradient          max|a-b| / max|ref| <= 1e-4 (router and experts included)
 * bf16 compute against the reference (the routing stays the same here): loss <= 1u,
 * logits <= 4u, gradients <= 8u (u = 2^-8, as the llama test argues).
 * Finite differences (central, h = 1e-2, J = sum(out * R)): the router op
 * (softmax, top-k, weights renormalized or not) and the whole MoE block (router, gate_up,
 * down weights and the input) away from ties: max|fd - grad| / max|grad| <= 2e-3
 * (rf_test_fd_check, tests/rf_test.h).
 * The same for qwen3_moe (tests/data/qwen3_moe_ref.bin: q/k norms, experts of
 * moe_intermediate_size 20, norm_topk_prob false, layer 1 dense by mlp_only_layers;
 * the load-balancing loss over the MoE layers' rows only, as transformers counts).
 * And a Mixtral batch where some expert of some layer gets no token at all
 * (tests/data/mixtral_zero_ref.bin): the same tolerances, and that expert's gradient
 * slices exactly zero as in the reference.
 * Bad configs fail naming the field: top-k > E, E = 0, no num_local_experts, router
 * jitter; qwen3_moe's by its own spelling (num_experts), a top-k it never wrote said
 * to be the default. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_test.h"

#define BF16_U 0x1.0p-8

struct ref {
  struct rf_model_config cfg;
  struct rf_model_desc desc;
  int B, T, n_tensors;
  double loss, aux;
  int32_t *tokens, *targets;
  float *logits;
  float **w, **g;
};

/* tests/data/FAMILY_ref.bin and FAMILY_ref_config.json */
static int ref_load(struct ref *r, const char *family) {
  memset(r, 0, sizeof *r);
  char path[256];
  snprintf(path, sizeof path, "tests/data/%s_ref_config.json", family);
  if (rf_model_config_load(&r->cfg, path) != 0) return -1;
  rf_model_desc_make(&r->cfg, &r->desc);
  char *buf = NULL;
  size_t n = 0;
  snprintf(path, sizeof path, "tests/data/%s_ref.bin", family);
  if (rf_file_read_all(path, &buf, &n) != 0) return -1;
  const char *p = buf;
  uint32_t hdr[2];
  memcpy(hdr, p, 8);
  p += 8;
  RF_CHECK(hdr[0] == 0x4645524du && hdr[1] == 1, "bad magic/version");
  int32_t bt[2];
  memcpy(bt, p, 8);
  p += 8;
  r->B = bt[0];
  r->T = bt[1];
  double lx[2];
  memcpy(lx, p, 16);
  p += 16;
  r->loss = lx[0];
  r->aux = lx[1];
  size_t nt = (size_t)r->B * r->T, v = (size_t)r->cfg.vocab_size;
  r->tokens = rf_xmalloc(nt * 4);
  r->targets = rf_xmalloc(nt * 4);
  r->logits = rf_xmalloc(nt * v * 4);
  memcpy(r->tokens, p, nt * 4);
  p += nt * 4;
  memcpy(r->targets, p, nt * 4);
  p += nt * 4;
  memcpy(r->logits, p, nt * v * 4);
  p += nt * v * 4;
  r->n_tensors = r->desc.n_tensors;
  r->w = rf_xcalloc((size_t)r->n_tensors, sizeof(float *));
  r->g = rf_xcalloc((size_t)r->n_tensors, sizeof(float *));
  for (int pass = 0; pass < 2; pass++) {
    int i = 0;
    for (int u = 0; u < r->desc.n_units; u++)
      for (int t = 0; t < r->desc.units[u].n_tensors; t++, i++) {
        size_t bytes = (size_t)r->desc.units[u].tensors[t].numel * 4;
        float *dst = rf_xmalloc(bytes);
        RF_ASSERT((size_t)(p - buf) + bytes <= n);
        memcpy(dst, p, bytes);
        p += bytes;
        (pass ? r->g : r->w)[i] = dst;
      }
  }
  RF_CHECK((size_t)(p - buf) == n, "reference file: %zu bytes left over", n - (size_t)(p - buf));
  free(buf);
  return 0;
}

/* One forward and backward as the trainer runs it (one rank): loss = mean CE +
 * coef * aux; grads [n_tensors] zeroed and filled; logits copied out. */
static void run_model(struct ref *r, const float *const *w, enum rf_dtype compute, float *logits,
                      float **grads, double *loss, double *aux) {
  struct rf_model_ws ws;
  RF_ASSERT(rf_model_ws_init(&ws, &r->cfg, r->B, r->T) == 0);
  RF_ASSERT(rf_model_ws_set_compute(&ws, compute) == 0);
  RF_CHECK(ws.bytes == rf_model_ws_bytes(&r->cfg, r->B, r->T) +
                           rf_model_ws_compute_bytes(&r->cfg, r->B, r->T, compute),
           "rf_model_ws_bytes disagrees with the allocation");
  int nu = r->desc.n_units, L = r->cfg.num_hidden_layers, n = r->B * r->T;
  struct rf_model_weight *wt = rf_xcalloc((size_t)r->n_tensors, sizeof *wt);
  for (int i = 0; i < r->n_tensors; i++) wt[i].f32 = w[i];
  int first[64] = {0}, i = 0;
  for (int u = 0; u < nu; u++) {
    first[u] = i;
    for (int t = 0; t < r->desc.units[u].n_tensors; t++, i++)
      memset(grads[i], 0, sizeof(float) * (size_t)r->desc.units[u].tensors[t].numel);
  }
  RF_ASSERT(rf_model_embed_forward(&ws, &wt[0], r->tokens) == 0);
  for (int l = 0; l < L; l++) rf_model_layer_forward(&ws, l, &wt[first[1 + l]]);
  double ce = rf_model_head_forward(&ws, &wt[first[nu - 1]], r->targets);
  memcpy(logits, ws.logits, sizeof(float) * (size_t)n * r->cfg.vocab_size);
  int counted = 0;
  for (int k = 0; k < n; k++) counted += r->targets[k] >= 0;
  float coef = (float)r->cfg.moe.router_aux_loss_coef;
  *aux = rf_model_moe_balance(&ws, ws.moe_count, ws.moe_psum, (double)n * rf_model_config_moe_layers(&r->cfg),
                              coef);
  *loss = ce / counted + coef * *aux;
  rf_model_head_backward(&ws, &wt[first[nu - 1]], &grads[first[nu - 1]], 1.0f / (float)counted);
  for (int l = L - 1; l >= 0; l--) rf_model_layer_backward(&ws, l, &wt[first[1 + l]], &grads[first[1 + l]]);
  rf_model_embed_backward(&ws, &grads[0]);
  free(wt);
  rf_model_ws_free(&ws);
}

static void test_reference(const char *family) {
  struct ref r;
  RF_ASSERT(ref_load(&r, family) == 0);
  RF_CHECK(rf_model_config_is_moe(&r.cfg) && r.cfg.moe.num_local_experts == 4 &&
               r.cfg.moe.num_experts_per_tok == 2 && r.cfg.moe.output_router_logits,
           "the config written by transformers reads as %s, 4 experts, top-2", family);
  size_t n = (size_t)r.B * r.T, v = (size_t)r.cfg.vocab_size;
  float *logits = rf_xmalloc(n * v * 4);
  float **g = rf_xcalloc((size_t)r.n_tensors, sizeof(float *));
  int i = 0;
  for (int u = 0; u < r.desc.n_units; u++)
    for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++)
      g[i] = rf_xmalloc((size_t)r.desc.units[u].tensors[t].numel * 4);
  const enum rf_dtype dts[2] = {RF_DTYPE_F32, RF_DTYPE_BF16};
  int idle = 0;
  for (int d = 0; d < 2; d++) {
    double loss = 0, aux = 0;
    run_model(&r, (const float *const *)r.w, dts[d], logits, g, &loss, &aux);
    double tl = d ? BF16_U : 2e-5, tg = d ? 8 * BF16_U : 1e-4, tz = d ? 4 * BF16_U : 2e-5;
    double el = fabs(loss - r.loss) / fabs(r.loss), ea = fabs(aux - r.aux) / fabs(r.aux);
    double ez = rf_test_max_abs_diff(logits, r.logits, n * v) / rf_test_max_abs(r.logits, n * v);
    printf("  %s %s: loss %.8f (ref %.8f, rel %.2g) aux %.8f (rel %.2g) logits rel %.2g\n", family,
           rf_dtype_name(dts[d]), loss, r.loss, el, aux, ea, ez);
    RF_CHECK(el <= tl, "%s loss rel err %.3g > %g", rf_dtype_name(dts[d]), el, tl);
    RF_CHECK(ea <= tl, "%s aux rel err %.3g > %g", rf_dtype_name(dts[d]), ea, tl);
    RF_CHECK(ez <= tz, "%s logits rel err %.3g > %g", rf_dtype_name(dts[d]), ez, tz);
    double worst = 0;
    i = 0;
    for (int u = 0; u < r.desc.n_units; u++)
      for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++) {
        size_t ne = (size_t)r.desc.units[u].tensors[t].numel;
        double amax = rf_test_max_abs(r.g[i], ne);
        double e = rf_test_max_abs_diff(g[i], r.g[i], ne) / (amax > 0 ? amax : 1.0);
        worst = rf_test_max(worst, e);
        RF_CHECK(amax > 0, "%s: the reference gradient is zero", r.desc.units[u].tensors[t].name);
        /* gpt_oss in bf16: a third of the SwiGLU inputs are clamped, and those within bf16's
         * rounding of the limit take the other branch (a whole term of their gradient on or off);
         * 32u (observed 0.062 and 0.066 = 16-17u on two seeds of the reference) */
        const char *name = r.desc.units[u].tensors[t].name;
        double tt = d && strstr(family, "gpt_oss") ? 32 * BF16_U : tg;
        RF_CHECK(e <= tt, "%s %s: gradient rel err %.3g > %g", rf_dtype_name(dts[d]), name, e, tt);
        /* an expert that no token chose: its gradient is exactly zero, here as in the reference */
        const struct rf_model_tensor *x = &r.desc.units[u].tensors[t];
        for (int64_t k = 0; x->sub_count > 1 && k < x->sub_count; k++) {
          size_t per = ne / (size_t)x->sub_count;
          if (rf_test_max_abs(r.g[i] + k * per, per) != 0) continue;
          idle += d == 0;
          RF_CHECK(rf_test_max_abs(g[i] + k * per, per) == 0,
                   "%s %s: expert %lld chosen by no token has a "
                   "gradient",
                   rf_dtype_name(dts[d]), x->name, (long long)k);
        }
      }
    printf("  %s: worst gradient rel err %.2g (%d tensors)\n", rf_dtype_name(dts[d]), worst, r.n_tensors);
  }
  if (strstr(family, "_zero")) /* the batch made for it: some expert of some layer idle */
    RF_CHECK(idle > 0, "%s: every expert got a token", family);
  printf("  %s: %d expert tensors idle (no token)\n", family, idle);
  for (i = 0; i < r.n_tensors; i++) {
    free(g[i]);
    free(r.w[i]);
    free(r.g[i]);
  }
  free(g);
  free(r.w);
  free(r.g);
  free(logits);
  free(r.tokens);
  free(r.targets);
  free(r.logits);
  rf_model_desc_free(&r.desc);
}

/* ---- finite differences ---------------------------------------------------------------------- */

static uint64_t g_rng = 777;

static float *rand_buf(size_t n, float scale) { return rf_test_rand_buf(&g_rng, n, scale); }

/* The smallest gap between the k-th and (k+1)-th probability of any row. */
static double router_margin(const float *probs, int n, int e, int k) {
  double worst = 1.0;
  for (int r = 0; r < n; r++) {
    float p[64];
    memcpy(p, probs + (size_t)r * e, sizeof(float) * (size_t)e);
    for (int a = 0; a < e; a++)
      for (int b = a + 1; b < e; b++)
        if (p[b] > p[a]) {
          float x = p[a];
          p[a] = p[b];
          p[b] = x;
        }
    if (k < e) worst = fmin(worst, (double)(p[k - 1] - p[k]));
  }
  return worst;
}

struct router_ctx {
  int n, e, k, renorm;
  float *logits, *probs, *topw, *r_topw, *r_probs, *scratch;
  int32_t *top;
};

/* J = sum(topw * R): the chosen experts fixed (away from ties they do not move). */
static double router_obj(void *p) {
  struct router_ctx *c = p;
  memcpy(c->scratch, c->logits, sizeof(float) * (size_t)c->n * c->e);
  rf_model_router_forward(c->probs, c->top, c->topw, c->scratch, c->n, c->e, c->k, c->renorm);
  double s = 0;
  for (int i = 0; i < c->n * c->k; i++) s += (double)c->topw[i] * c->r_topw[i];
  for (int i = 0; i < c->n * c->e; i++) s += (double)c->probs[i] * c->r_probs[i]; /* the extra term's share */
  return s;
}

static void test_router_fd(int renorm) {
  struct router_ctx c = {.n = 6, .e = 5, .k = 2, .renorm = renorm};
  size_t ne = (size_t)c.n * c.e, nk = (size_t)c.n * c.k;
  c.logits = rand_buf(ne, 3.0f);
  c.scratch = rand_buf(ne, 1.0f);
  c.probs = rand_buf(ne, 1.0f);
  c.topw = rand_buf(nk, 1.0f);
  c.top = rf_xcalloc(nk, sizeof(int32_t));
  c.r_topw = rand_buf(nk, 1.0f);
  /* the extra d(prob) is one vector for every row: R_probs rows all equal */
  float *extra = rand_buf((size_t)c.e, 1.0f);
  c.r_probs = rf_xmalloc(ne * sizeof(float));
  for (int r = 0; r < c.n; r++) memcpy(c.r_probs + (size_t)r * c.e, extra, sizeof(float) * (size_t)c.e);
  /* logits away from ties (drawn again until the top-2 gap exceeds 0.05 everywhere) */
  double m = 0;
  for (int tries = 0; tries < 100 && m <= 0.05; tries++) {
    for (size_t i = 0; i < ne; i++) c.logits[i] = 3.0f * rf_test_rand_f32(&g_rng);
    router_obj(&c);
    m = router_margin(c.probs, c.n, c.e, c.k);
  }
  RF_CHECK(m > 0.05, "router test data too close to a tie (%.3g)", m);
  float *dz = rf_xmalloc(ne * sizeof(float));
  rf_model_router_backward(dz, c.r_topw, c.probs, c.top, c.topw, extra, c.n, c.e, c.k, renorm);
  rf_test_fd_check(renorm ? "router (top-2, renormalized)" : "router (top-2, not renormalized)", c.logits, ne,
                   dz, router_obj, &c);
  void *bufs[] = {c.logits, c.scratch, c.probs, c.topw, c.top, c.r_topw, c.r_probs, extra, dz};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

struct block_ctx {
  struct rf_model_ws ws;
  struct rf_model_weight w[RF_MODEL_LAYER_MAX_TENSORS];
  float *wr, *wgu, *wd, *xn, *r, *out;
  int n;
};

static double block_obj(void *p) {
  struct block_ctx *c = p;
  int h = c->ws.cfg.hidden_size;
  memset(c->out, 0, sizeof(float) * (size_t)c->n * h);
  rf_model_moe_forward(&c->ws, 0, c->w, c->xn, c->out);
  double s = 0;
  for (int i = 0; i < c->n * h; i++) s += (double)c->out[i] * c->r[i];
  return s;
}

/* The MoE block alone (one layer, 5 experts, top-2, 12 tokens: several expert
 * products, padding rows, an expert product of one token). */
static void test_block_fd(void) {
  const char *json =
      "{\"model_type\": \"mixtral\", \"hidden_size\": 8, \"intermediate_size\": 6, "
      "\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"vocab_size\": 11, "
      "\"num_local_experts\": 5, \"num_experts_per_tok\": 2}";
  struct block_ctx c;
  memset(&c, 0, sizeof c);
  struct rf_model_config cfg;
  RF_ASSERT(rf_model_config_parse(&cfg, json, strlen(json), "block") == 0 &&
            rf_model_config_check(&cfg, "block") == 0);
  c.n = 12;
  RF_ASSERT(rf_model_ws_init(&c.ws, &cfg, 2, 6) == 0);
  int h = 8, f = 6, e = 5;
  c.wr = rand_buf((size_t)e * h, 1.5f);
  c.wgu = rand_buf((size_t)e * 2 * f * h, 0.5f);
  c.wd = rand_buf((size_t)e * h * f, 0.5f);
  c.xn = rand_buf((size_t)c.n * h, 1.0f);
  c.r = rand_buf((size_t)c.n * h, 1.0f);
  c.out = rand_buf((size_t)c.n * h, 1.0f);
  c.w[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_ROUTER)].f32 = c.wr;
  c.w[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP)].f32 = c.wgu;
  c.w[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN)].f32 = c.wd;
  /* a fresh forward's statistics and no balance term; then a balance term to check */
  memset(c.ws.moe_count, 0, sizeof(double) * e);
  memset(c.ws.moe_psum, 0, sizeof(double) * e);
  double m = 0; /* inputs away from routing ties (drawn again until the top-2 gap exceeds 0.02) */
  for (int tries = 0; tries < 100 && m <= 0.02; tries++) {
    for (int i = 0; i < c.n * h; i++) c.xn[i] = rf_test_rand_f32(&g_rng);
    block_obj(&c);
    m = router_margin(c.ws.layers[0].moe.probs, c.n, e, 2);
  }
  RF_CHECK(m > 0.02, "block test data too close to a routing tie (%.3g)", m);
  memset(c.ws.moe_balance, 0, sizeof(float) * e);
  float *g[RF_MODEL_LAYER_MAX_TENSORS] = {0};
  g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_ROUTER)] = rf_xcalloc((size_t)e * h, 4);
  g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP)] =
      rf_xcalloc((size_t)e * 2 * f * h, 4);
  g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN)] = rf_xcalloc((size_t)e * h * f, 4);
  float *dxn = rf_xmalloc(sizeof(float) * (size_t)c.n * h);
  rf_model_moe_backward(&c.ws, 0, c.w, c.xn, c.r, dxn, g);
  rf_test_fd_check("moe router weight", c.wr, (size_t)e * h,
                   g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_ROUTER)], block_obj, &c);
  rf_test_fd_check("moe experts gate_up", c.wgu, (size_t)e * 2 * f * h,
                   g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP)], block_obj, &c);
  rf_test_fd_check("moe experts down", c.wd, (size_t)e * h * f,
                   g[rf_model_layer_slot(&cfg, 0, RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN)], block_obj, &c);
  rf_test_fd_check("moe input", c.xn, (size_t)c.n * h, dxn, block_obj, &c);
  int32_t *off = c.ws.layers[0].moe.off;
  int one = 0;
  for (int x = 0; x < e; x++) one |= off[x + 1] > off[x] && off[x + 1] - off[x] == c.ws.expert_rows;
  RF_CHECK(one, "some expert's rows are padded");
  RF_CHECK(off[e] <= c.ws.moe_cap, "grouped rows %d within the capacity %d", off[e], c.ws.moe_cap);
  for (int i = 0; i < RF_MODEL_LAYER_MAX_TENSORS; i++) free(g[i]);
  void *bufs[] = {c.wr, c.wgu, c.wd, c.xn, c.r, c.out, dxn};
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  rf_model_ws_free(&c.ws);
}

/* ---- bad configs --------------------------------------------------------------------------------- */

static void expect_refused_family(const char *family, const char *extra, const char *field) {
  char json[1024];
  snprintf(json, sizeof json,
           "{\"model_type\": \"%s\", \"hidden_size\": 8, \"intermediate_size\": 6, \"num_hidden_layers\": 1, "
           "\"num_attention_heads\": 2, \"vocab_size\": 11%s}",
           family, extra);
  struct rf_model_config cfg;
  int rc = rf_model_config_parse(&cfg, json, strlen(json), "cfg.json");
  if (rc == 0) rc = rf_model_config_check(&cfg, "cfg.json");
  RF_CHECK(rc != 0, "config with%s was accepted", extra);
  RF_CHECK(strstr(rf_error_msg(), field) != NULL, "message '%s' does not name '%s'", rf_error_msg(), field);
}

static void expect_refused(const char *extra, const char *field) {
  expect_refused_family("mixtral", extra, field);
}

static void test_bad_configs(void) {
  expect_refused(", \"num_local_experts\": 4, \"num_experts_per_tok\": 5", "num_experts_per_tok");
  expect_refused(", \"num_local_experts\": 0", "num_local_experts");
  expect_refused("", "num_local_experts");
  expect_refused(", \"num_local_experts\": 4, \"router_jitter_noise\": 0.1", "router_jitter_noise");
  expect_refused(", \"num_local_experts\": 4, \"sliding_window\": 16, \"max_position_embeddings\": 64",
                 "sliding_window");
  expect_refused(", \"num_local_experts\": 4, \"attention_bias\": true", "attention_bias");
  /* qwen3_moe's fields by their own spelling, and a default the config never wrote said to be one */
  expect_refused_family("qwen3_moe", ", \"moe_intermediate_size\": 4", "field 'num_experts' is missing");
  expect_refused_family(
      "qwen3_moe", ", \"moe_intermediate_size\": 4, \"num_experts\": 4",
      "'num_experts_per_tok' (8: not in the config, the default of the model type) must be in "
      "1..num_experts (4)");
  expect_refused_family("qwen3_moe",
                        ", \"moe_intermediate_size\": 4, \"num_experts\": 4, \"num_experts_per_tok\": 5",
                        "'num_experts_per_tok' (5) must be in 1..num_experts (4)");
}

/* Where each tensor is in a layer's unit (rf_model_layer_slot) against the
 * parameter names transformers gives them (the configs its reference scripts
 * wrote, tests/data/): every slot of every layer claimed by exactly one tensor
 * name, and that name's parameter there. Slot 9 is q_proj.bias in llama_bias and
 * q_norm in qwen3_moe: the two are different names, never one value read two ways. */
static void test_slots(void) {
  static const char *const suffix[RF_MODEL_LAYER_TENSOR_COUNT] = {
      "input_layernorm.weight",    "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight",   "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",      "mlp.up_proj.weight",      "mlp.down_proj.weight",
      "self_attn.q_proj.bias",     "self_attn.k_proj.bias",   "self_attn.v_proj.bias",
      "self_attn.o_proj.bias",     "mlp.gate_proj.bias",      "mlp.up_proj.bias",
      "mlp.down_proj.bias",        "mlp.gate.weight",         "mlp.experts.gate_up_proj",
      "mlp.experts.down_proj",     "self_attn.q_norm.weight", "self_attn.k_norm.weight",
      "self_attn.sinks",           "mlp.router.bias",         "mlp.experts.gate_up_proj_bias",
      "mlp.experts.down_proj_bias"};
  static const char *const configs[] = {"llama_ref",   "llama_bias",    "qwen2_tied",
                                        "mixtral_ref", "qwen3_moe_ref", "gpt_oss_ref"};
  for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
    char path[256];
    snprintf(path, sizeof path, "tests/data/%s_config.json", configs[k]);
    struct rf_model_config cfg;
    RF_ASSERT(rf_model_config_load(&cfg, path) == 0);
    struct rf_model_desc desc;
    rf_model_desc_make(&cfg, &desc);
    struct rf_model_units map;
    rf_model_units_find(&cfg, &map);
    int checked = 0;
    for (int l = 0; l < cfg.num_hidden_layers; l++) {
      const struct rf_model_unit *u = &desc.units[map.first_layer + l];
      int claimed[RF_MODEL_LAYER_MAX_TENSORS] = {0};
      RF_CHECK(u->n_tensors <= RF_MODEL_LAYER_MAX_TENSORS, "%s layer %d: %d tensors fit the unit arrays",
               configs[k], l, u->n_tensors);
      for (int t = 0; t < RF_MODEL_LAYER_TENSOR_COUNT; t++) {
        int s = rf_model_layer_slot(&cfg, l, (enum rf_model_layer_tensor)t);
        if (s < 0) continue;
        RF_ASSERT(s < u->n_tensors);
        claimed[s]++;
        char want[128];
        snprintf(want, sizeof want, "model.layers.%d.%s", l,
                 t == RF_MODEL_LAYER_TENSOR_ROUTER && strstr(configs[k], "gpt_oss") ? "mlp.router.weight"
                                                                                    : suffix[t]);
        RF_CHECK(strcmp(u->tensors[s].name, want) == 0, "%s layer %d slot %d: %s, expected %s", configs[k], l,
                 s, u->tensors[s].name, want);
        checked++;
      }
      for (int s = 0; s < u->n_tensors; s++)
        RF_CHECK(claimed[s] == 1, "%s layer %d: slot %d (%s) claimed by %d tensor names", configs[k], l, s,
                 u->tensors[s].name, claimed[s]);
    }
    printf("  %s: %d tensors in their slots\n", configs[k], checked);
    rf_model_desc_free(&desc);
  }
}

int main(void) {
  printf("layer tensor slots against transformers' names:\n");
  test_slots();
  printf("mixtral and qwen3_moe against transformers:\n");
  test_reference("mixtral");
  test_reference("qwen3_moe");
  test_reference("mixtral_zero");
  printf("gpt_oss against transformers:\n");
  test_reference("gpt_oss");
  printf("finite differences:\n");
  test_router_fd(1);
  test_router_fd(0);
  test_block_fd();
  test_bad_configs();
  return rf_test_finish("test_model_moe");
}
