/* rf-test: timeout=60 */
/* DeepSeek-V3's multi-head latent attention (src/model/model.c's mla_ functions, the ops of
 * ops.c) and its MoE layers (moe.c) against transformers' own DeepseekV3ForCausalLM and against
 * direct formulas:
 *   - the MoE layers: tests/ref_deepseek_v3.py's deepseek_v3_moe (3 layers, the first dense; 8
 *     routed experts of 12 in 4 groups, 2 kept, top-2, routed_scaling_factor 2.5, one shared
 *     expert, a random balancing bias; the router in float64, every choice >= 8.9e-3 from a tie):
 *     loss, logits <= 2e-5, every gradient <= 1e-4 (router, fused experts, shared experts), the
 *     bias's exactly zero; bf16 compute: loss <= 1u, logits <= 8u (two rounded expert chains and
 *     the shared one, weighted by the router; observed 5.0u), gradients <= 16u; bf16 weights equal
 *     their f32 values; the balancing-bias update against its formula, the loads of two forwards
 *     against the chosen experts counted by hand, their reset; a table without the router_group_
 *     entries refused (an all-dense model, which calls no router, not); the router's refusals (n_group,
 * topk_group, top-k, shared experts);
 *   - the whole model: tests/ref_deepseek_v3.py wrote, in float64, two tiny dense models (every
 *     layer dense: first_k_dense_replace = num_hidden_layers; 4 heads, qk_nope 8 + qk_rope 6 = 14
 *     != v_head_dim 10, kv_lora_rank 16): deepseek_v3 (q_lora_rank 24: q_a_proj, q_a_layernorm,
 *     q_b_proj; rope_interleave true), deepseek_v3_q (q_proj; rope_interleave false) and
 *     deepseek_v3_yarn (as deepseek_v3 with YaRN factor 4, mscale 1, mscale_all_dim 0.7: the rotary
 *     tables times their ratio, the softmax scale times mscale_all_dim's squared; f32 only: its
 *     sharper softmax takes bf16 gradients to 20u, and bf16 is checked on the other two). The C model
 *     loads transformers' config.json and runs the same batch: loss, logits <= 2e-5 relative, every
 *     gradient <= 1e-4 (max|a - b| / max|ref|); bf16 compute: loss <= 1u, logits <= 4u, gradients
 *     <= 16u (u = 2^-8; tests/test_model_ref.c argues 8u for llama's layer, and MLA chains two more
 *     rounded products on each of q's and kv's paths: q_a then q_b, kv_a then kv_b; observed 8.1u);
 *   - the attention op with v's head dim != q's (rf_model_attention_mla_forward) against a naive
 *     double-precision causal attention (<= 1e-5), its backward against central finite differences
 *     (h = 1e-2, J = sum(y * R), <= 2e-3 of max|grad|) at T = 70 (a partial second block);
 *   - the rotary part (rf_model_mla_rope_apply) against the formula of transformers'
 *     apply_rotary_pos_emb_interleave (pairs (2i, 2i+1), de-interleaved there: the same scores)
 *     and of rotate_half, and its inverse undoing it; the kv expansion's backward as its adjoint
 *     (<expand(x), y> = <x, expand_backward(y)>, k_pe's gradient the heads' sum);
 *   - bf16 weights in f32 compute give the f32 run on the same values exactly (they are widened; the
 *     two row views of kv_a_proj_with_mqa included);
 *   - the kernel tables: a table without the mla_ entries (as the CUDA table was) refuses deepseek_v3 naming
 *     mla_attention_forward and runs a llama; config fields not implemented are refused by name. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/core.h"
#include "model/model.h"
#include "rf_test.h"

#define BF16_U 0x1.0p-8

struct ref {
  struct rf_model_config cfg;
  struct rf_model_desc desc;
  int B, T, n_tensors;
  double loss;
  int32_t *tokens, *targets;
  float *logits;
  float **w, **g;
};

/* tests/data/NAME_ref.bin (tests/ref_mixtral.py's format) and NAME_ref_config.json */
static void ref_load(struct ref *r, const char *name) {
  memset(r, 0, sizeof *r);
  char path[256];
  snprintf(path, sizeof path, "tests/data/%s_ref_config.json", name);
  RF_ASSERT(rf_model_config_load(&r->cfg, path) == 0);
  rf_model_desc_make(&r->cfg, &r->desc);
  char *buf = NULL;
  size_t n = 0;
  snprintf(path, sizeof path, "tests/data/%s_ref.bin", name);
  RF_ASSERT(rf_file_read_all(path, &buf, &n) == 0 && n > 32);
  const char *p = buf;
  uint32_t hdr[2];
  int32_t bt[2];
  double lx[2];
  memcpy(hdr, p, 8), p += 8;
  RF_ASSERT(hdr[0] == 0x4645524du && hdr[1] == 1);
  memcpy(bt, p, 8), p += 8;
  memcpy(lx, p, 16), p += 16;
  r->B = bt[0], r->T = bt[1], r->loss = lx[0];
  size_t nt = (size_t)r->B * r->T, v = (size_t)r->cfg.vocab_size;
  r->tokens = rf_xmalloc(nt * 4);
  r->targets = rf_xmalloc(nt * 4);
  r->logits = rf_xmalloc(nt * v * 4);
  memcpy(r->tokens, p, nt * 4), p += nt * 4;
  memcpy(r->targets, p, nt * 4), p += nt * 4;
  memcpy(r->logits, p, nt * v * 4), p += nt * v * 4;
  r->n_tensors = r->desc.n_tensors;
  r->w = rf_xcalloc((size_t)r->n_tensors, sizeof(float *));
  r->g = rf_xcalloc((size_t)r->n_tensors, sizeof(float *));
  for (int pass = 0; pass < 2; pass++) {
    int i = 0;
    for (int u = 0; u < r->desc.n_units; u++)
      for (int t = 0; t < r->desc.units[u].n_tensors; t++, i++) {
        size_t bytes = (size_t)r->desc.units[u].tensors[t].numel * 4;
        RF_ASSERT((size_t)(p - buf) + bytes <= n);
        float *dst = rf_xmalloc(bytes);
        memcpy(dst, p, bytes), p += bytes;
        (pass ? r->g : r->w)[i] = dst;
      }
  }
  RF_CHECK((size_t)(p - buf) == n, "%s: %zu bytes left over (the tensors' order or shapes differ)", name,
           n - (size_t)(p - buf));
  free(buf);
}

static void ref_free(struct ref *r) {
  for (int i = 0; i < r->n_tensors; i++) free(r->w[i]), free(r->g[i]);
  free(r->w), free(r->g), free(r->tokens), free(r->targets), free(r->logits);
  rf_model_desc_free(&r->desc);
}

/* One forward and backward on one rank: the mean cross-entropy, its gradients (zeroed first). w: the
weights (f32, or bf16 when bf16 is non-NULL: bf16[i] replaces w[i]). */
static double run_model_w(struct ref *r, float *const *w, uint16_t *const *bf16, enum rf_dtype compute,
                          float *logits, float **grads) {
  struct rf_model_ws ws;
  RF_ASSERT(rf_model_ws_init(&ws, &r->cfg, r->B, r->T) == 0);
  RF_ASSERT(rf_model_ws_set_compute(&ws, compute) == 0);
  size_t predicted =
      rf_model_ws_bytes(&r->cfg, r->B, r->T) + rf_model_ws_compute_bytes(&r->cfg, r->B, r->T, compute);
  RF_CHECK(ws.bytes == predicted, "rf_model_ws_bytes disagrees with the allocation: %zu, predicted %zu",
           ws.bytes, predicted);
  int nu = r->desc.n_units, L = r->cfg.num_hidden_layers, n = r->B * r->T;
  struct rf_model_weight *wt = rf_xcalloc((size_t)r->n_tensors, sizeof *wt);
  for (int i = 0; i < r->n_tensors; i++) {
    if (bf16)
      wt[i].bf16 = bf16[i];
    else
      wt[i].f32 = w[i];
  }
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
  rf_model_head_backward(&ws, &wt[first[nu - 1]], &grads[first[nu - 1]], 1.0f / (float)counted);
  for (int l = L - 1; l >= 0; l--) rf_model_layer_backward(&ws, l, &wt[first[1 + l]], &grads[first[1 + l]]);
  rf_model_embed_backward(&ws, &grads[0]);
  free(wt);
  rf_model_ws_free(&ws);
  return ce / counted;
}

static double run_model(struct ref *r, enum rf_dtype compute, float *logits, float **grads) {
  return run_model_w(r, r->w, NULL, compute, logits, grads);
}

/* bf16 weights (rounded from the reference's) in f32 compute against the same values as f32 weights:
 * equal (they are widened; kv_a_proj_with_mqa's two row views of a bf16 weight included). */
static void test_bf16_weights(const char *name) {
  struct ref r;
  ref_load(&r, name);
  size_t n = (size_t)r.B * r.T * (size_t)r.cfg.vocab_size;
  float **wr = rf_xcalloc((size_t)r.n_tensors, sizeof(float *)),
        **g1 = rf_xcalloc((size_t)r.n_tensors, sizeof(float *));
  float **g2 = rf_xcalloc((size_t)r.n_tensors, sizeof(float *));
  uint16_t **wb = rf_xcalloc((size_t)r.n_tensors, sizeof(uint16_t *));
  int i = 0;
  for (int u = 0; u < r.desc.n_units; u++)
    for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++) {
      size_t ne = (size_t)r.desc.units[u].tensors[t].numel;
      wr[i] = rf_xmalloc(ne * 4), wb[i] = rf_xmalloc(ne * 2), g1[i] = rf_xmalloc(ne * 4),
      g2[i] = rf_xmalloc(ne * 4);
      for (size_t k = 0; k < ne; k++) {
        wb[i][k] = rf_bf16_from_f32(r.w[i][k]);
        wr[i][k] = rf_f32_from_bf16(wb[i][k]);
      }
    }
  float *l1 = rf_xmalloc(n * 4), *l2 = rf_xmalloc(n * 4);
  double a = run_model_w(&r, wr, NULL, RF_DTYPE_F32, l1, g1),
         b = run_model_w(&r, NULL, wb, RF_DTYPE_F32, l2, g2);
  double worst = rf_test_max_abs_diff(l1, l2, n);
  i = 0;
  for (int u = 0; u < r.desc.n_units; u++)
    for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++)
      worst =
          rf_test_max(worst, rf_test_max_abs_diff(g1[i], g2[i], (size_t)r.desc.units[u].tensors[t].numel));
  RF_CHECK(a == b && worst == 0,
           "%s: bf16 weights against their f32 values: loss %.9g vs %.9g, max diff %.3g", name, b, a, worst);
  printf("  %s: bf16 weights in f32 compute = the same values in f32 (loss, logits, %d gradients)\n", name,
         r.n_tensors);
  for (i = 0; i < r.n_tensors; i++) free(wr[i]), free(wb[i]), free(g1[i]), free(g2[i]);
  free(wr), free(wb), free(g1), free(g2), free(l1), free(l2);
  ref_free(&r);
}

/* dtypes: 1 (f32) or 2 (f32 and bf16 compute); moe_layers: the layers with routed experts */
static void test_reference(const char *name, int dtypes, int moe_layers) {
  struct ref r;
  ref_load(&r, name);
  RF_CHECK(r.cfg.head_dim == 14 && r.cfg.deepseek_v3.v_head_dim == 10 &&
               rf_model_config_moe_layers(&r.cfg) == moe_layers,
           "%s: qk head dim 14, v head dim 10, %d layers with routed experts", name, moe_layers);
  size_t n = (size_t)r.B * r.T, v = (size_t)r.cfg.vocab_size;
  float *logits = rf_xmalloc(n * v * 4);
  float **g = rf_xcalloc((size_t)r.n_tensors, sizeof(float *));
  int i = 0;
  for (int u = 0; u < r.desc.n_units; u++)
    for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++)
      g[i] = rf_xmalloc((size_t)r.desc.units[u].tensors[t].numel * 4);
  const enum rf_dtype dts[2] = {RF_DTYPE_F32, RF_DTYPE_BF16};
  for (int d = 0; d < dtypes; d++) {
    double loss = run_model(&r, dts[d], logits, g);
    /* routed experts: each output also passes two rounded expert chains and the shared one, weighted
     * by the router (times routed_scaling_factor 2.5): logits <= 8u (observed 5.0u) */
    double tl = d ? BF16_U : 2e-5, tg = d ? 16 * BF16_U : 1e-4, tz = d ? (moe_layers ? 8 : 4) * BF16_U : 2e-5;
    double el = fabs(loss - r.loss) / fabs(r.loss);
    double ez = rf_test_max_abs_diff(logits, r.logits, n * v) / rf_test_max_abs(r.logits, n * v);
    RF_CHECK(el <= tl, "%s %s: loss %.8f, reference %.8f (rel %.3g > %g)", name, rf_dtype_name(dts[d]), loss,
             r.loss, el, tl);
    RF_CHECK(ez <= tz, "%s %s: logits rel err %.3g > %g", name, rf_dtype_name(dts[d]), ez, tz);
    double worst = 0;
    i = 0;
    for (int u = 0; u < r.desc.n_units; u++)
      for (int t = 0; t < r.desc.units[u].n_tensors; t++, i++) {
        size_t ne = (size_t)r.desc.units[u].tensors[t].numel;
        double amax = rf_test_max_abs(r.g[i], ne);
        double e = rf_test_max_abs_diff(g[i], r.g[i], ne) / (amax > 0 ? amax : 1.0);
        worst = rf_test_max(worst, e);
        /* the balancing bias (a buffer in transformers) takes no gradient: exactly zero here too */
        int frozen = strstr(r.desc.units[u].tensors[t].name, "e_score_correction_bias") != NULL;
        RF_CHECK(frozen ? rf_test_max_abs(g[i], ne) == 0 : amax > 0, "%s: the %s gradient is %s",
                 r.desc.units[u].tensors[t].name, frozen ? "balancing bias's" : "reference",
                 frozen ? "not zero" : "zero");
        RF_CHECK(e <= tg, "%s %s %s: gradient rel err %.3g > %g", name, rf_dtype_name(dts[d]),
                 r.desc.units[u].tensors[t].name, e, tg);
      }
    printf("  %s %s: loss %.8f (ref %.8f, rel %.2g), logits rel %.2g, worst of %d gradients %.2g\n", name,
           rf_dtype_name(dts[d]), loss, r.loss, el, ez, r.n_tensors, worst);
  }
  for (i = 0; i < r.n_tensors; i++) free(g[i]);
  free(g), free(logits);
  ref_free(&r);
}

/* ---- the ops ------------------------------------------------------------------------------ */

static uint64_t rng_state = 20261203;
static float *rand_floats(size_t n, double scale) { return rf_test_rand_buf(&rng_state, n, (float)scale); }

enum { AB = 2, AT = 70, ANH = 3, AHD = 10, ADV = 6 };

struct att_case {
  float *q, *k, *v, *r, *y, *lse, *scratch;
};

/* J = sum(y * R) of the MLA attention (scale 0.37, not 1/sqrt(hd)). */
static double att_objective(void *ctx) {
  struct att_case *c = ctx;
  rf_model_attention_mla_forward(c->y, c->lse, c->q, c->k, c->v, AB, AT, ANH, ANH, AHD, ADV, 0.37f,
                                 c->scratch, 2);
  return rf_test_dot(c->y, c->r, (size_t)AB * AT * ANH * ADV);
}

static void test_attention(void) {
  size_t nq = (size_t)AB * AT * ANH * AHD, nv = (size_t)AB * AT * ANH * ADV;
  struct att_case c = {rand_floats(nq, 1.0),
                       rand_floats(nq, 1.0),
                       rand_floats(nv, 1.0),
                       rand_floats(nv, 1.0),
                       rf_xmalloc(nv * 4),
                       rf_xmalloc((size_t)AB * ANH * AT * 4),
                       rf_xmalloc(2 * 2 * RF_MODEL_ATT_BLOCK * AT * sizeof(float))};
  const float *q = c.q, *k = c.k, *v = c.v;
  att_objective(&c);
  /* naive double causal attention */
  double worst = 0;
  for (int b = 0; b < AB; b++)
    for (int h = 0; h < ANH; h++)
      for (int i = 0; i < AT; i++) {
        double s[AT], mx = -1e300, sum = 0;
        for (int j = 0; j <= i; j++) {
          double dot = 0;
          for (int x = 0; x < AHD; x++)
            dot += (double)q[((size_t)(b * AT + i) * ANH + h) * AHD + x] *
                   k[((size_t)(b * AT + j) * ANH + h) * AHD + x];
          s[j] = 0.37 * dot;
          mx = s[j] > mx ? s[j] : mx;
        }
        for (int j = 0; j <= i; j++) sum += exp(s[j] - mx);
        for (int x = 0; x < ADV; x++) {
          double acc = 0;
          for (int j = 0; j <= i; j++)
            acc += exp(s[j] - mx) / sum * v[((size_t)(b * AT + j) * ANH + h) * ADV + x];
          worst = rf_test_max(worst, fabs(acc - c.y[((size_t)(b * AT + i) * ANH + h) * ADV + x]));
        }
      }
  RF_CHECK(worst <= 1e-5, "MLA attention (dv %d != hd %d) against naive: %.3g", ADV, AHD, worst);
  float *dq = rf_xmalloc(nq * 4), *dk = rf_xmalloc(nq * 4), *dv = rf_xmalloc(nv * 4);
  rf_model_attention_mla_backward(dq, dk, dv, c.r, c.lse, c.q, c.k, c.v, AB, AT, ANH, ANH, AHD, ADV, 0.37f,
                                  c.scratch, 2);
  rf_test_fd_check("MLA attention dq (hd 10, dv 6, T 70)", c.q, nq, dq, att_objective, &c);
  rf_test_fd_check("MLA attention dk", c.k, nq, dk, att_objective, &c);
  rf_test_fd_check("MLA attention dv", c.v, nv, dv, att_objective, &c);
  free(c.q), free(c.k), free(c.v), free(c.r), free(c.y), free(c.lse), free(c.scratch);
  free(dq), free(dk), free(dv);
}

static void test_rope_and_expand(void) {
  enum { B = 2, T = 5, NH = 3, NOPE = 4, ROPE = 6, DV = 5 };
  int stride = NOPE + ROPE, half = ROPE / 2;
  float cos_t[T * 3], sin_t[T * 3];
  rf_model_rope_tables(cos_t, sin_t, T, ROPE, 10000.0);
  size_t nx = (size_t)B * T * NH * stride;
  for (int il = 0; il < 2; il++) {
    float *x = rand_floats(nx, 1.0), *y = rf_xmalloc(nx * 4);
    memcpy(y, x, nx * 4);
    rf_model_mla_rope_apply(y, B, T, NH, stride, NOPE, ROPE, cos_t, sin_t, il, 0);
    double err = 0;
    for (int row = 0; row < B * T; row++)
      for (int h = 0; h < NH; h++) {
        const float *a = x + ((size_t)row * NH + h) * stride, *o = y + ((size_t)row * NH + h) * stride;
        int t = row % T;
        for (int c = 0; c < NOPE; c++) err = rf_test_max(err, fabs(o[c] - a[c])); /* untouched */
        for (int i = 0; i < half; i++) {                                          /* transformers' formulas */
          int i1 = il ? NOPE + 2 * i : NOPE + i, i2 = il ? NOPE + 2 * i + 1 : NOPE + i + half;
          double c = cos_t[t * half + i], s = sin_t[t * half + i];
          err = rf_test_max(err, fabs(o[i1] - (a[i1] * c - a[i2] * s)));
          err = rf_test_max(err, fabs(o[i2] - (a[i2] * c + a[i1] * s)));
        }
      }
    rf_model_mla_rope_apply(y, B, T, NH, stride, NOPE, ROPE, cos_t, sin_t, il, 1);
    double back = rf_test_max_abs_diff(y, x, nx);
    RF_CHECK(err <= 1e-6 && back <= 1e-6, "rope (interleave %d): formula %.3g, inverse %.3g", il, err, back);
    free(x), free(y);
  }
  /* the expansion's backward is its adjoint */
  size_t n = (size_t)B * T, nb = n * NH * (NOPE + DV), nk = n * NH * stride, nvv = n * NH * DV;
  float *kvb = rand_floats(nb, 1.0), *kpe = rand_floats(n * ROPE, 1.0), *k = rf_xmalloc(nk * 4);
  float *v = rf_xmalloc(nvv * 4), *gk = rand_floats(nk, 1.0), *gv = rand_floats(nvv, 1.0);
  float *gb = rf_xmalloc(nb * 4), *gpe = rf_xmalloc(n * ROPE * 4);
  rf_model_mla_kv_expand(k, v, kvb, kpe, (int)n, NH, NOPE, ROPE, DV);
  rf_model_mla_kv_expand_backward(gb, gpe, gk, gv, (int)n, NH, NOPE, ROPE, DV);
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < nk; i++) lhs += (double)k[i] * gk[i];
  for (size_t i = 0; i < nvv; i++) lhs += (double)v[i] * gv[i];
  for (size_t i = 0; i < nb; i++) rhs += (double)kvb[i] * gb[i];
  for (size_t i = 0; i < n * ROPE; i++) rhs += (double)kpe[i] * gpe[i];
  RF_CHECK(fabs(lhs - rhs) <= 1e-4 * fabs(lhs) && k[NOPE] == kpe[0] && k[stride + NOPE] == kpe[0],
           "kv expansion: <expand(x), y> %.9g, <x, backward(y)> %.9g; every head's key holds k_pe", lhs, rhs);
  free(kvb), free(kpe), free(k), free(v), free(gk), free(gv), free(gb), free(gpe);
}

/* ---- the balancing bias ------------------------------------------------------------------- */

/* rf_model_bias_update against its formula (b += u sign(mean - load)) on a piece of a layer's bias,
 * and the loads a forward leaves in ws->moe_load against the chosen experts counted by hand. */
static void test_balancing_bias(void) {
  const double load[8] = {5, 1, 2, 4, 3, 0, 3, 6}; /* mean 3 */
  float piece[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}; /* elements 2..6 */
  rf_model_bias_update(piece, 2, 5, load, 8, 0.25f);
  const float want[5] = {0.75f, 0.25f, 0.5f, 0.75f, 0.5f};
  RF_CHECK(memcmp(piece, want, sizeof want) == 0,
           "bias update: %g %g %g %g %g, want 0.75 0.25 0.5 0.75 0.5 (under-loaded up, over-loaded down)",
           piece[0], piece[1], piece[2], piece[3], piece[4]);
  struct ref r;
  ref_load(&r, "deepseek_v3_moe");
  struct rf_model_ws ws;
  RF_ASSERT(rf_model_ws_init(&ws, &r.cfg, r.B, r.T) == 0);
  struct rf_model_weight *wt = rf_xcalloc((size_t)r.n_tensors, sizeof *wt);
  for (int i = 0; i < r.n_tensors; i++) wt[i].f32 = r.w[i];
  int first = 0, n = r.B * r.T, ne = r.cfg.moe.num_local_experts, k = r.cfg.moe.num_experts_per_tok;
  for (int pass = 0; pass < 2; pass++) { /* two forwards: the loads add up until reset */
    RF_ASSERT(rf_model_embed_forward(&ws, &wt[0], r.tokens) == 0);
    first = r.desc.units[0].n_tensors;
    for (int l = 0; l < r.cfg.num_hidden_layers; l++) {
      rf_model_layer_forward(&ws, l, &wt[first]);
      first += r.desc.units[1 + l].n_tensors;
    }
  }
  double got[2 * 8] = {0}, want_load[2 * 8] = {0};
  RF_ASSERT(ne == 8 && rf_model_config_moe_layers(&r.cfg) == 2);
  rf_model_ws_moe_load_read(&ws, got);
  for (int l = 1; l < 3; l++)
    for (int i = 0; i < n * k; i++) want_load[(l - 1) * ne + ws.layers[l].moe.top[i]] += 2;
  RF_CHECK(memcmp(got, want_load, sizeof got) == 0, "the loads of two forwards are twice the chosen experts");
  rf_model_ws_moe_load_reset(&ws);
  rf_model_ws_moe_load_read(&ws, got);
  double left = 0;
  for (int i = 0; i < 16; i++) left += fabs(got[i]);
  RF_CHECK(left == 0, "the loads reset to zero (%g left)", left);
  printf("  balancing bias: the update's signs; the loads of layers 1, 2 (%g of %d rows each) counted\n",
         want_load[0] + want_load[1] + want_load[2] + want_load[3] + want_load[4] + want_load[5] +
             want_load[6] + want_load[7],
         2 * n * k);
  free(wt);
  rf_model_ws_free(&ws);
  ref_free(&r);
}

/* ---- the tables and the config --------------------------------------------------------------- */

static void test_tables_and_config(void) {
  struct rf_model_config ds, llama;
  RF_ASSERT(rf_model_config_load(&ds, "tests/data/deepseek_v3_ref_config.json") == 0);
  RF_ASSERT(rf_model_config_load(&llama, "tests/data/llama_bias_config.json") == 0);
  struct rf_model_kernels cuda_like = rf_model_kernels_host; /* a table without MLA (the CUDA one had none) */
  cuda_like.mla_attention_forward = NULL, cuda_like.mla_attention_backward = NULL;
  cuda_like.mla_rope_apply = NULL, cuda_like.mla_kv_expand = NULL, cuda_like.mla_kv_expand_backward = NULL;
  const char *m = rf_model_kernels_missing_for(&cuda_like, &ds);
  RF_CHECK(m && strcmp(m, "mla_attention_forward") == 0, "deepseek_v3 without the mla_ entries: %s",
           m ? m : "(none missing)");
  RF_CHECK(rf_model_kernels_missing_for(&cuda_like, &llama) == NULL, "a llama needs no mla_ entry");
  RF_CHECK(rf_model_kernels_missing_for(&rf_model_kernels_host, &ds) == NULL &&
               rf_model_kernels_missing_for(&rf_model_kernels_checked, &ds) == NULL,
           "the host and checked tables have every MLA entry");
  /* the router: a table with MLA but without the router_group_ entries (the CUDA table) refuses the
   * MoE layers naming the first, and runs a mixtral and an all-dense deepseek_v3 (no router called) */
  struct rf_model_config dsm, mixtral;
  RF_ASSERT(rf_model_config_load(&dsm, "tests/data/deepseek_v3_moe_ref_config.json") == 0);
  RF_ASSERT(rf_model_config_load(&mixtral, "tests/data/mixtral_ref_config.json") == 0);
  struct rf_model_kernels no_router = rf_model_kernels_host;
  no_router.router_group_forward = NULL, no_router.router_group_backward = NULL;
  m = rf_model_kernels_missing_for(&no_router, &dsm);
  RF_CHECK(m && strcmp(m, "router_group_forward") == 0,
           "deepseek_v3's MoE without the router_group_ entries: %s", m ? m : "(none missing)");
  RF_CHECK(rf_model_kernels_missing_for(&no_router, &mixtral) == NULL,
           "a mixtral needs no router_group_ entry");
  RF_CHECK(rf_model_config_moe_layers(&ds) == 0 && rf_model_kernels_missing_for(&no_router, &ds) == NULL,
           "an all-dense deepseek_v3 needs no router_group_ entry");
  RF_CHECK(rf_model_kernels_missing_for(&rf_model_kernels_host, &dsm) == NULL &&
               rf_model_kernels_missing_for(&rf_model_kernels_checked, &dsm) == NULL,
           "the host and checked tables have the router's entries");
  /* fields the trainable model does not implement, or a router it cannot build, refused by name */
  const struct {
    const char *file, *from, *to, *expect;
  } bad[] = {
      {"deepseek_v3", "\"attention_bias\": false", "\"attention_bias\": true", "'attention_bias'"},
      {"deepseek_v3", "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 2", "'num_key_value_heads'"},
      {"deepseek_v3_moe", "\"n_group\": 4", "\"n_group\": 3", "'n_group'"},
      {"deepseek_v3_moe", "\"topk_group\": 2", "\"topk_group\": 5", "'topk_group'"},
      {"deepseek_v3_moe", "\"num_experts_per_tok\": 2", "\"num_experts_per_tok\": 5",
       "'num_experts_per_tok'"},
      {"deepseek_v3_moe", "\"n_shared_experts\": 1", "\"n_shared_experts\": 0", "'n_shared_experts'"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char *text = NULL, src[128];
    size_t len = 0;
    snprintf(src, sizeof src, "tests/data/%s_ref_config.json", bad[i].file);
    RF_ASSERT(rf_file_read_all(src, &text, &len) == 0);
    char *at = strstr(text, bad[i].from);
    RF_ASSERT(at);
    size_t pre = (size_t)(at - text);
    char *edited = rf_xmalloc(len + 64);
    snprintf(edited, len + 64, "%.*s%s%s", (int)pre, text, bad[i].to, at + strlen(bad[i].from));
    char path[64];
    snprintf(path, sizeof path, "/tmp/rf_test_deepseek_v3_bad.%d.json", (int)getpid());
    FILE *f = fopen(path, "w");
    RF_ASSERT(f && fputs(edited, f) >= 0 && fclose(f) == 0);
    struct rf_model_config c;
    int rc = rf_model_config_load(&c, path);
    RF_CHECK(rc == -1 && strstr(rf_error_msg(), bad[i].expect) && strstr(rf_error_msg(), path),
             "%s refused naming %s and the file: %s", bad[i].to, bad[i].expect,
             rc ? rf_error_msg() : "(accepted)");
    remove(path);
    free(edited);
    free(text);
  }
}

int main(void) {
  printf("deepseek_v3 (dense layers) against transformers:\n");
  test_reference("deepseek_v3", 2, 0);
  test_reference("deepseek_v3_q", 2, 0);
  test_reference("deepseek_v3_yarn", 1, 0);
  printf("deepseek_v3 with routed and shared experts against transformers:\n");
  test_reference("deepseek_v3_moe", 2, 2);
  test_bf16_weights("deepseek_v3_moe");
  test_balancing_bias();
  test_bf16_weights("deepseek_v3");
  test_attention();
  test_rope_and_expand();
  test_tables_and_config();
  return rf_test_finish("test_model_deepseek_v3");
}
