/* rf-test: timeout=60 */
/* GPT-OSS (transformers' GptOssForCausalLM): its ops and the whole model.
 *
 * Ops, each backward against central finite differences (h = 1e-2) of J = sum(out * R):
 * max|fd - analytic| / max|analytic| <= 2e-3 (rf_test_fd_check, tests/rf_test.h), the forwards
 * against direct double-precision formulas:
 *   - attention with sinks and a sliding window (rf_model_attention_sink_forward, _backward):
 *     dq, dk, dv and d(sinks); forward against a naive softmax over the window plus the
 *     sink (<= 1e-5); T = 6 (window 3) and T = 150 (window 70: the window crosses blocks
 *     of 64), full attention with sinks, a window without sinks;
 *   - the clamped SwiGLU on interleaved gate/up pairs (some inputs beyond the limit, none
 *     within 2h of it, where a difference quotient straddles the kink);
 *   - the [in, out] weight transposes (f32 and bf16), exactly.
 *   - the kernel table names the entries a gpt_oss config needs (the CUDA table has none);
 *   - the config's fields as read, bad layer_types and YaRN fields refused naming the field,
 *     --fp8 block refused (the experts are [in, out]);
 *   - one 150-token sequence's logits through `rfsdp logits` at W = 1 and 2 against transformers
 *     (tests/ref_gpt_oss.py: tests/data/gpt_oss_long/), max|a-b| / max|ref| <= 2e-5.
 * The model's loss, logits and gradients against transformers are in tests/test_model_moe.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/family.h"
#include "model/model.h"
#include "rf_cli.h"
#include "rf_test.h"

static uint64_t g_rng = 4242;

static float *rand_buf(size_t n, float scale) { return rf_test_rand_buf(&g_rng, n, scale); }

/* ---- attention with sinks and a sliding window ---------------------------------------- */

struct sink_ctx {
  int b, t, nh, nkv, hd, window;
  float *q, *k, *v, *sinks, *r, *y, *lse, *scratch;
};

static double sink_obj(void *p) {
  struct sink_ctx *c = p;
  rf_model_attention_sink_forward(c->y, c->lse, c->q, c->k, c->v, c->sinks, c->window, c->b, c->t, c->nh,
                                  c->nkv, c->hd, c->scratch, 2);
  return rf_test_dot(c->y, c->r, (size_t)c->b * c->t * c->nh * c->hd);
}

/* y[b,i,h] = sum over j in (i - window, i] of exp(s_j) / (sum exp(s_j) + exp(sink_h)) v_j. */
static double sink_naive_err(const struct sink_ctx *c) {
  int qs = c->nh * c->hd, ks = c->nkv * c->hd, rep = c->nh / c->nkv;
  double err = 0.0;
  for (int b = 0; b < c->b; b++)
    for (int h = 0; h < c->nh; h++)
      for (int i = 0; i < c->t; i++) {
        double s[256], mx = c->sinks ? c->sinks[h] : -1e300, z = 0.0;
        int lo = c->window > 0 && i - c->window + 1 > 0 ? i - c->window + 1 : 0;
        const float *qi = c->q + ((size_t)b * c->t + i) * qs + h * c->hd;
        for (int j = lo; j <= i; j++) {
          const float *kj = c->k + ((size_t)b * c->t + j) * ks + (h / rep) * c->hd;
          double d = 0.0;
          for (int e = 0; e < c->hd; e++) d += (double)qi[e] * kj[e];
          s[j] = d / sqrt((double)c->hd);
          mx = fmax(mx, s[j]);
        }
        for (int j = lo; j <= i; j++) z += (s[j] = exp(s[j] - mx));
        if (c->sinks) z += exp(c->sinks[h] - mx);
        for (int e = 0; e < c->hd; e++) {
          double acc = 0.0;
          for (int j = lo; j <= i; j++)
            acc += s[j] / z * c->v[((size_t)b * c->t + j) * ks + (h / rep) * c->hd + e];
          err = fmax(err, fabs(acc - c->y[((size_t)b * c->t + i) * qs + h * c->hd + e]));
        }
        err = fmax(err, fabs(mx + log(z) - c->lse[((size_t)b * c->nh + h) * c->t + i]));
      }
  return err;
}

static void test_attention_sink(int b, int t, int nh, int nkv, int hd, int window, int sinks) {
  printf("attention with sinks %d, window %d: B %d T %d heads %d/%d hd %d\n", sinks, window, b, t, nh, nkv,
         hd);
  struct sink_ctx c = {.b = b, .t = t, .nh = nh, .nkv = nkv, .hd = hd, .window = window};
  size_t nq = (size_t)b * t * nh * hd, nk = (size_t)b * t * nkv * hd;
  c.q = rand_buf(nq, 1.5f);
  c.k = rand_buf(nk, 1.5f);
  c.v = rand_buf(nk, 1.0f);
  c.r = rand_buf(nq, 1.0f);
  c.y = rand_buf(nq, 1.0f);
  c.lse = rand_buf((size_t)b * nh * t, 1.0f);
  c.sinks = sinks ? rand_buf((size_t)nh, 1.5f) : NULL;
  c.scratch = rf_xmalloc((size_t)2 * 2 * RF_MODEL_ATT_BLOCK * t * 4);
  sink_obj(&c);
  double e = sink_naive_err(&c);
  RF_CHECK(e < 1e-5, "attention (sinks, window) forward vs naive: %.3g", e);
  float *dq = rf_xcalloc(nq, 4), *dk = rf_xcalloc(nk, 4), *dv = rf_xcalloc(nk, 4);
  float *ds = rf_xcalloc((size_t)nh, 4);
  rf_model_attention_sink_backward(dq, dk, dv, ds, c.r, c.y, c.lse, c.q, c.k, c.v, c.sinks, window, b, t, nh,
                                   nkv, hd, c.scratch, 2);
  rf_test_fd_check("attention dq", c.q, nq, dq, sink_obj, &c);
  rf_test_fd_check("attention dk", c.k, nk, dk, sink_obj, &c);
  rf_test_fd_check("attention dv", c.v, nk, dv, sink_obj, &c);
  if (sinks) {
    rf_test_fd_check("attention dsinks", c.sinks, (size_t)nh, ds, sink_obj, &c);
    float before = ds[0]; /* added into */
    sink_obj(&c);
    rf_model_attention_sink_backward(dq, dk, dv, ds, c.r, c.y, c.lse, c.q, c.k, c.v, c.sinks, window, b, t,
                                     nh, nkv, hd, c.scratch, 2);
    RF_CHECK_CLOSE(ds[0], 2.0 * before, 1e-6, 1e-9, "dsinks is added into");
  }
  free(c.q), free(c.k), free(c.v), free(c.r), free(c.y), free(c.lse), free(c.sinks), free(c.scratch);
  free(dq), free(dk), free(dv), free(ds);
}

/* ---- the clamped SwiGLU ------------------------------------------------------------- */

#define ALPHA 1.702f
#define LIMIT 1.5f

struct clamp_ctx {
  size_t n;
  float *gu, *r, *h;
};

static double clamp_obj(void *p) {
  struct clamp_ctx *c = p;
  rf_model_swiglu_clamp_forward(c->h, c->gu, c->n, ALPHA, LIMIT);
  return rf_test_dot(c->h, c->r, c->n);
}

static void test_swiglu_clamp(void) {
  printf("clamped SwiGLU, alpha %g limit %g\n", (double)ALPHA, (double)LIMIT);
  struct clamp_ctx c = {.n = 96};
  c.gu = rand_buf(2 * c.n, 3.0f);
  c.r = rand_buf(c.n, 1.0f);
  c.h = rand_buf(c.n, 1.0f);
  int clamped = 0;
  for (size_t i = 0; i < 2 * c.n; i++) { /* away from the kinks at +-limit */
    if (fabsf(fabsf(c.gu[i]) - LIMIT) < 3 * (float)RF_TEST_FD_H) c.gu[i] += 0.1f;
    clamped += fabsf(c.gu[i]) > LIMIT;
  }
  RF_CHECK(clamped > 20, "the test clamps some inputs (%d)", clamped);
  clamp_obj(&c);
  double e = 0.0;
  for (size_t i = 0; i < c.n; i++) {
    double g = fmin((double)c.gu[2 * i], (double)LIMIT),
           u = fmax(-LIMIT, fmin((double)c.gu[2 * i + 1], (double)LIMIT));
    e = fmax(e, fabs((u + 1.0) * g / (1.0 + exp(-ALPHA * g)) - c.h[i]));
  }
  RF_CHECK(e < 1e-5, "clamped SwiGLU forward vs formula: %.3g", e);
  float *dgu = rf_xmalloc(2 * c.n * 4);
  rf_model_swiglu_clamp_backward(dgu, c.r, c.gu, c.n, ALPHA, LIMIT);
  rf_test_fd_check("swiglu_clamp dgu", c.gu, 2 * c.n, dgu, clamp_obj, &c);
  free(c.gu), free(c.r), free(c.h), free(dgu);
}

/* ---- transposes -------------------------------------------------------------------- */

static void test_transposes(void) {
  int rows = 37, cols = 300; /* above the OpenMP threshold? no: 11100; the loop is the same */
  float *w = rand_buf((size_t)rows * cols, 1.0f), *t = rf_xmalloc((size_t)rows * cols * 4);
  uint16_t *wb = rf_xmalloc((size_t)rows * cols * 2);
  rf_bf16_from_f32_n(wb, w, (size_t)rows * cols);
  struct rf_model_weight wf = {.f32 = w}, wh = {.bf16 = wb};
  rf_model_weight_transpose(t, &wf, rows, cols);
  int bad = 0;
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) bad += t[(size_t)c * rows + r] != w[(size_t)r * cols + c];
  rf_model_weight_transpose(t, &wh, rows, cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++)
      bad += t[(size_t)c * rows + r] != rf_f32_from_bf16(wb[(size_t)r * cols + c]);
  float *acc = rf_xcalloc((size_t)rows * cols, 4);
  rf_model_transpose_add(acc, w, rows, cols);
  rf_model_transpose_add(acc, w, rows, cols);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) bad += acc[(size_t)c * rows + r] != 2.0f * w[(size_t)r * cols + c];
  RF_CHECK(bad == 0, "transposes: %d elements differ", bad);
  free(w), free(t), free(wb), free(acc);
}

/* ---- the kernel tables ------------------------------------------------------------- */

static void test_tables(void) {
  struct rf_model_config cfg = {0};
  cfg.family = rf_model_family_find("gpt_oss");
  RF_CHECK(cfg.family && cfg.family->attention_sinks, "gpt_oss has attention sinks");
  RF_CHECK(rf_model_kernels_missing_for(&rf_model_kernels_host, &cfg) == NULL &&
               rf_model_kernels_missing_for(&rf_model_kernels_checked, &cfg) == NULL,
           "the host and checked tables run gpt_oss");
  struct rf_model_kernels partial = rf_model_kernels_host;
  partial.attention_sink_forward = NULL;
  const char *m = rf_model_kernels_missing_for(&partial, &cfg);
  RF_CHECK(m && strcmp(m, "attention_sink_forward") == 0, "sinks needed: %s", m ? m : "-");
  struct rf_model_config llama = {0};
  RF_CHECK(rf_model_kernels_missing_for(&partial, &llama) == NULL, "a llama does not need them");
  partial = rf_model_kernels_host;
  partial.transpose_add = NULL;
  m = rf_model_kernels_missing_for(&partial, &cfg);
  RF_CHECK(m && strcmp(m, "transpose_add") == 0, "GPT-OSS's experts need it: %s", m ? m : "-");
  cfg.moe.num_local_experts = 4; /* a mixtral does not */
  cfg.family = rf_model_family_find("mixtral");
  RF_CHECK(rf_model_kernels_missing_for(&partial, &cfg) == NULL, "a mixtral does not need it");
  partial = rf_model_kernels_host;
  partial.attention_sink_forward = NULL;
  m = rf_model_kernels_missing(&partial);
  RF_CHECK(m && strcmp(m, "attention_sink_forward") == 0, "the whole table's check names it: %s",
           m ? m : "-");
}

/* ---- refusals ------------------------------------------------------------------------ */

static void test_refusals(void) {
  struct rf_model_config cfg;
  RF_ASSERT(rf_model_config_load(&cfg, "tests/data/gpt_oss_ref_config.json") == 0);
  RF_CHECK(cfg.sliding_mask == 1 && cfg.sliding_window == 4 && cfg.yarn.factor == 32 && !cfg.yarn.truncate &&
               fabs(cfg.yarn.attention_factor - (0.1 * log(32.0) + 1.0)) < 1e-12 &&
               cfg.gpt_oss.swiglu_limit == 1.2,
           "the reference config reads: window 4 on layer 0, YaRN factor 32, limit 1.2");
  struct rf_model_ws ws;
  RF_ASSERT(rf_model_ws_init(&ws, &cfg, 1, 8) == 0);
  RF_CHECK(rf_model_ws_set_fp8(&ws, 0) == -1 && strstr(rf_error_msg(), "GPT-OSS"),
           "--fp8 block is refused for GPT-OSS's [in, out] experts: %s", rf_error_msg());
  rf_model_ws_free(&ws);
  static const char *const bad[][2] = {
      {"{\"layer_types\": [\"sliding_attention\", \"chunked_attention\"]", "layer_types"},
      {"{\"layer_types\": [\"full_attention\"]", "layer_types"},
      {"{\"rope_parameters\": {\"rope_type\": \"yarn\", \"original_max_position_embeddings\": 16}", "factor"},
      {"{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0}",
       "original_max_position_embeddings"},
      {"{\"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0, "
       "\"original_max_position_embeddings\": 16}",
       "mscale"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text,
             "%s, \"model_type\": \"gpt_oss\", \"hidden_size\": 32, \"intermediate_size\": 16, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"head_dim\": 8, \"vocab_size\": 50, "
             "\"num_local_experts\": 4}",
             bad[i][0]);
    int rc = rf_model_config_parse(&cfg, text, strlen(text), "bad.json");
    RF_CHECK(rc == -1 && strstr(rf_error_msg(), bad[i][1]) && strstr(rf_error_msg(), "bad.json"),
             "refused naming %s: %s", bad[i][1], rc ? rf_error_msg() : "(accepted)");
  }
}

/* ---- one long sequence against transformers ------------------------------------------- */

/* tests/ref_gpt_oss.py's model on 150 tokens (blocks of 64, the last partial; the sliding layer's
 * window of 4 crossing them; YaRN at positions up to 149) through `rfsdp logits` at W = 1 and 2,
 * the weights read from transformers' names in a safetensors file: max|a-b| / max|ref| <= 2e-5. */
static void test_long(void) {
  enum { LONG = 150, VOCAB = 51 };
  char dir[] = "/tmp/rf_test_gpt_oss.XXXXXX", out[8192], path[128];
  RF_ASSERT(mkdtemp(dir));
  char *want = NULL;
  size_t want_bytes = 0;
  RF_ASSERT(rf_file_read_all("tests/data/gpt_oss_long/logits.f32", &want, &want_bytes) == 0);
  RF_ASSERT(want_bytes == sizeof(float) * LONG * VOCAB);
  const float *ref = (const float *)(void *)want;
  for (int w = 1; w <= 2; w++) {
    snprintf(path, sizeof path, "%s/logits-w%d.f32", dir, w);
    int rc = rf_cli_run_mpi(
        out, sizeof out, w, 60,
        "logits --model tests/data/gpt_oss_ref_config.json --weights "
        "tests/data/gpt_oss_long/weights.safetensors --tokens tests/data/gpt_oss_long/tokens.i32 "
        "--seq %d --out %s",
        LONG, path);
    RF_CHECK(rc == 0, "rfsdp logits at W=%d: %s", w, out);
    char *got = NULL;
    size_t got_bytes = 0;
    if (rc != 0 || rf_file_read_all(path, &got, &got_bytes) != 0) continue;
    RF_CHECK(got_bytes == want_bytes, "W=%d: %zu bytes of logits", w, got_bytes);
    if (got_bytes == want_bytes) {
      double e = rf_test_max_abs_diff((const float *)(void *)got, ref, (size_t)LONG * VOCAB) /
                 rf_test_max_abs(ref, (size_t)LONG * VOCAB);
      printf("long sequence (%d tokens) at W=%d: logits rel err %.2g\n", LONG, w, e);
      RF_CHECK(e <= 2e-5, "W=%d: long-sequence logits rel err %.3g > 2e-5", w, e);
    }
    free(got);
    unlink(path);
  }
  free(want);
  rmdir(dir);
}

int main(void) {
  test_attention_sink(2, 6, 4, 2, 4, 3, 1);
  test_attention_sink(1, 150, 2, 1, 4, 70, 1);
  test_attention_sink(1, 20, 2, 2, 4, 0, 1);
  test_attention_sink(1, 20, 2, 1, 4, 5, 0);
  test_swiglu_clamp();
  test_transposes();
  test_tables();
  test_refusals();
  test_long();
  return rf_test_finish("test_model_gpt_oss");
}
