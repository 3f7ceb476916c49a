/* The sparse MoE block of mixtral, qwen3_moe, gpt_oss and deepseek_v3: the router (softmax, top-k, weights
 * renormalized or not; GPT-OSS's biased top-k softmax; DeepSeek-V3's sigmoid group-limited top-k with its
 * shared experts),
 * tokens grouped by expert, every expert's SwiGLU through src/gemm, the
 * load-balancing loss. Under FP8 block training the experts' products run on their
 * e4m3 codes (expert_weight slices the codes and scales); the router stays in the
 * param dtype (its logits pick the experts: docs/fp8.md).
 *
 * The experts are of moe_intermediate_size (mixtral: intermediate_size).
 *
 * Grouping: expert e's rows are its tokens in token order (each token's choices
 * in rank order), so the grouping depends only on the local batch, never on the
 * world size. No token is dropped (there is no capacity factor): an expert takes
 * every token routed to it. Its rows are padded with zero rows to a multiple of
 * ws->expert_rows and its products run expert_rows rows at a time, so every
 * product has one of a few fixed shapes (created in the first step; later steps
 * create and allocate nothing). */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "model/family.h"
#include "model/workspace.h"

void rf_model_router_forward(float *probs, int32_t *top, float *topw, float *logits, int n, int n_experts,
                             int k, int renorm) {
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * n_experts;
    float *p = probs + (size_t)r * n_experts;
    int32_t *tr = top + (size_t)r * k;
    float *wr = topw + (size_t)r * k;
    float mx = z[0];
    for (int e = 1; e < n_experts; e++) mx = z[e] > mx ? z[e] : mx;
    double sum = 0.0;
    for (int e = 0; e < n_experts; e++) sum += exp((double)(z[e] - mx));
    for (int e = 0; e < n_experts; e++) p[e] = (float)(exp((double)(z[e] - mx)) / sum);
    double s = 0.0;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < n_experts; e++) {
        int taken = 0;
        for (int i = 0; i < j; i++) taken |= tr[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      tr[j] = best;
      s += p[best];
    }
    for (int j = 0; j < k; j++) wr[j] = renorm ? (float)(p[tr[j]] / s) : p[tr[j]];
  }
}

/* Renormalized, w_j = p_j / S, S = sum over the chosen of p: dp_m = (g_m - sum_j g_j
 * w_j) / S for a chosen m (else w_j = p_j: dp_m = g_m); then the softmax:
 * dz = p * (dp - sum(p * dp)). */
void rf_model_router_backward(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                              const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                              int renorm) {
  for (int r = 0; r < n; r++) {
    const float *p = probs + (size_t)r * n_experts;
    const int32_t *tr = top + (size_t)r * k;
    const float *g = dtopw + (size_t)r * k, *wr = topw + (size_t)r * k;
    float *d = dlogits + (size_t)r * n_experts;
    double s = 0.0, dot = 0.0;
    for (int j = 0; j < k; j++) {
      s += p[tr[j]];
      dot += (double)g[j] * wr[j];
    }
    for (int e = 0; e < n_experts; e++) d[e] = dprobs_extra ? dprobs_extra[e] : 0.0f;
    for (int j = 0; j < k; j++) d[tr[j]] += renorm ? (float)(((double)g[j] - dot) / s) : g[j];
    double pd = 0.0;
    for (int e = 0; e < n_experts; e++) pd += (double)p[e] * d[e];
    for (int e = 0; e < n_experts; e++) d[e] = (float)((double)p[e] * ((double)d[e] - pd));
  }
}

/* DeepSeek-V3's group score: the sum of the group's two best biased scores. */
static float router_group_score(const float *c, int g, int gs) {
  const float *v = c + (size_t)g * gs;
  float a = -INFINITY, b = -INFINITY;
  for (int i = 0; i < gs; i++) {
    if (v[i] > a) {
      b = a;
      a = v[i];
    } else if (v[i] > b) {
      b = v[i];
    }
  }
  return a + b;
}

/* Group g is kept when fewer than topk_group groups beat it (a higher score, or the same score and a
 * lower index). */
static int router_group_kept(const float *c, int g, int n_group, int gs, int topk_group) {
  float sg = router_group_score(c, g, gs);
  int better = 0;
  for (int h = 0; h < n_group; h++) {
    float sh = router_group_score(c, h, gs);
    better += sh > sg || (sh == sg && h < g);
  }
  return better < topk_group;
}

void rf_model_router_group_forward(float *scores, int32_t *top, float *topw, float *choice,
                                   const float *logits, const float *bias, int n, int n_experts, int n_group,
                                   int topk_group, int k, int renorm, float scale) {
  int gs = n_experts / n_group;
  RF_ASSERT(n_group > 0 && n_experts % n_group == 0 && gs >= 2 && topk_group >= 1 && topk_group <= n_group &&
            k >= 1 && k <= topk_group * gs);
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * n_experts;
    float *s = scores + (size_t)r * n_experts;
    int32_t *tr = top + (size_t)r * k;
    float *wr = topw + (size_t)r * k;
    for (int e = 0; e < n_experts; e++) {
      s[e] = (float)(1.0 / (1.0 + exp(-(double)z[e])));
      choice[e] = s[e] + (bias ? bias[e] : 0.0f);
    }
    for (int g = 0; g < n_group; g++)
      if (!router_group_kept(choice, g, n_group, gs, topk_group))
        for (int i = 0; i < gs; i++) choice[g * gs + i] = -INFINITY;
    double sum = 0.0;
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < n_experts; e++) {
        int taken = choice[e] == -INFINITY;
        for (int i = 0; i < j; i++) taken |= tr[i] == e;
        if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
      }
      tr[j] = best;
      sum += s[best];
    }
    for (int j = 0; j < k; j++)
      wr[j] = renorm ? (float)((double)scale * s[tr[j]] / (sum + 1e-20)) : (float)((double)scale * s[tr[j]]);
  }
}

/* w_j = c s_j / D, D = sum over the chosen of s + 1e-20 (renorm), else w_j = c s_j:
 * ds_m = (c g_m - sum_j g_j w_j) / D for a chosen m (else c g_m); then the sigmoid:
 * dz = ds * s (1 - s). The unchosen experts get zero. */
void rf_model_router_group_backward(float *dlogits, const float *dtopw, const float *scores,
                                    const int32_t *top, const float *topw, int n, int n_experts, int k,
                                    int renorm, float scale) {
  for (int r = 0; r < n; r++) {
    const float *s = scores + (size_t)r * n_experts;
    const int32_t *tr = top + (size_t)r * k;
    const float *g = dtopw + (size_t)r * k, *wr = topw + (size_t)r * k;
    float *d = dlogits + (size_t)r * n_experts;
    double sum = 0.0, dot = 0.0;
    for (int j = 0; j < k; j++) {
      sum += s[tr[j]];
      dot += (double)g[j] * wr[j];
    }
    memset(d, 0, sizeof(float) * (size_t)n_experts);
    for (int j = 0; j < k; j++) {
      double se = s[tr[j]];
      double ds = renorm ? ((double)scale * g[j] - dot) / (sum + 1e-20) : (double)scale * g[j];
      d[tr[j]] = (float)(ds * se * (1.0 - se));
    }
  }
}

void rf_model_bias_update(float *bias, int64_t begin, int64_t len, const double *load, int n_experts,
                          float u) {
  double mean = 0;
  for (int e = 0; e < n_experts; e++) mean += load[e];
  mean /= n_experts;
  for (int64_t j = 0; j < len; j++) {
    double under = mean - load[begin + j]; /* > 0: the expert is under-loaded, its bias rises */
    bias[j] += under > 0 ? u : under < 0 ? -u : 0.0f;
  }
}

double rf_model_moe_balance(struct rf_model_ws *ws, const double *counts, const double *probs, double rows,
                            float grad_weight) {
  int ne = ws->cfg.moe.num_local_experts;
  RF_ASSERT(rf_model_config_is_moe(&ws->cfg) && rows > 0);
  double aux = 0.0;
  float *balance = ws->moe_balance_host; /* the host's copy, uploaded in stream order */
  for (int e = 0; e < ne; e++) {
    aux += counts[e] * probs[e];
    balance[e] = (float)((double)grad_weight * ne * counts[e] / (rows * rows));
  }
  rf_device_copy(ws->dev, ws->moe_balance, balance, sizeof(float) * (size_t)ne, RF_DEVICE_COPY_HOST_TO_DEVICE,
                 ws->stream);
  return aux * ne / (rows * rows);
}

/* Expert e's slice of a fused expert tensor [E, rows, cols]: its values, or (FP8 block
 * mode) its codes and its own 128x128 tiles' scales (each expert is tiled on its own,
 * the scales expert-major), so its products take the same linear path as a matrix's. */
struct rf_model_weight rf_model_moe_expert_weight(const struct rf_model_weight *w, int e, int rows,
                                                  int cols) {
  size_t per = (size_t)rows * (size_t)cols;
  struct rf_model_weight x = {.f32 = NULL};
  if (w->fp8) {
    size_t tiles = (size_t)rf_ceil_div(rows, RF_FP8_TILE) * (size_t)rf_ceil_div(cols, RF_FP8_TILE);
    x.fp8 = w->fp8 + (size_t)e * per;
    x.fp8_scales = w->fp8_scales + (size_t)e * tiles;
  } else if (w->f32) {
    x.f32 = w->f32 + (size_t)e * per;
  } else {
    x.bf16 = w->bf16 + (size_t)e * per;
  }
  return x;
}

void rf_model_moe_stats(double *count, double *psum, const int32_t *top, const float *probs, int n,
                        int n_experts, int k) {
  for (int r = 0; r < n; r++) {
    for (int j = 0; j < k; j++) count[top[(size_t)r * k + j]] += 1.0;
    for (int e = 0; e < n_experts; e++) psum[e] += probs[(size_t)r * n_experts + e];
  }
}

void rf_model_moe_group(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top,
                        const float *xn, int n, int n_experts, int k, int hidden, int rows, int cap) {
  off[0] = 0;
  for (int e = 0; e < n_experts; e++) {
    int count = 0;
    for (int i = 0; i < n * k; i++) count += top[i] == e;
    off[e + 1] = off[e] + (int32_t)rf_round_up(count, rows);
    int row = off[e];
    for (int i = 0; i < n * k; i++)
      if (top[i] == e) {
        tok[row] = i / k;
        pos[i] = row++;
      }
    for (; row < off[e + 1]; row++) tok[row] = -1;
  }
  RF_ASSERT(off[n_experts] <= cap);
#pragma omp parallel for schedule(static) if ((long)off[n_experts] * hidden >= 32768)
  for (int r = 0; r < off[n_experts]; r++) {
    float *dst = xg + (size_t)r * hidden;
    if (tok[r] >= 0)
      memcpy(dst, xn + (size_t)tok[r] * hidden, sizeof(float) * (size_t)hidden);
    else
      memset(dst, 0, sizeof(float) * (size_t)hidden);
  }
}

/* every token's choices in rank order: the same sums at any world size */
void rf_model_moe_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                          int hidden) {
#pragma omp parallel for schedule(static) if ((long)n * hidden >= 32768)
  for (int r = 0; r < n; r++) {
    float *o = out + (size_t)r * hidden;
    for (int j = 0; j < k; j++) {
      const float *y = ey + (size_t)pos[(size_t)r * k + j] * hidden;
      float g = topw[(size_t)r * k + j];
      for (int i = 0; i < hidden; i++) o[i] += g * y[i];
    }
  }
}

void rf_model_moe_combine_weights_backward(float *dtopw, const float *dout, const float *ey,
                                           const int32_t *pos, int n, int k, int hidden) {
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      const float *y = ey + (size_t)pos[(size_t)r * k + j] * hidden, *g = dout + (size_t)r * hidden;
      float dot = 0.0f;
      for (int i = 0; i < hidden; i++) dot += g[i] * y[i];
      dtopw[(size_t)r * k + j] = dot;
    }
}

void rf_model_moe_scatter(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                          const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden) {
  int total = off[n_experts];
  for (int r = 0; r < total; r++)
    if (tok[r] < 0) memset(dyg + (size_t)r * hidden, 0, sizeof(float) * (size_t)hidden);
  for (int r = 0; r < n; r++)
    for (int j = 0; j < k; j++) {
      float *d = dyg + (size_t)pos[(size_t)r * k + j] * hidden;
      const float *g = dout + (size_t)r * hidden;
      float wt = topw[(size_t)r * k + j];
      for (int i = 0; i < hidden; i++) d[i] = wt * g[i];
    }
}

/* every token's choices in rank order */
void rf_model_moe_gather(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden) {
#pragma omp parallel for schedule(static) if ((long)n * hidden >= 32768)
  for (int r = 0; r < n; r++) {
    float *d = dxn + (size_t)r * hidden;
    for (int j = 0; j < k; j++) {
      const float *x = dyg + (size_t)pos[(size_t)r * k + j] * hidden;
      for (int i = 0; i < hidden; i++) d[i] += x[i];
    }
  }
}

/* Groups the tokens of layer a by expert into ws->s_xg (through the table), and reads the
 * experts' row offsets back into ws->moe_off: the host sizes the experts' products by them,
 * so this is the one wait on the device per MoE layer's forward (and backward). */
static const int32_t *moe_group(struct rf_model_ws *ws, struct rf_model_moe_acts *a, const float *xn, int n) {
  const struct rf_model_config *c = &ws->cfg;
  int ne = c->moe.num_local_experts;
  ws->kern->moe_group(a->off, a->tok, a->pos, ws->s_xg, a->top, xn, n, ne, c->moe.num_experts_per_tok,
                      c->hidden_size, ws->expert_rows, ws->moe_cap, ws->stream);
  rf_device_copy(ws->dev, ws->moe_off, a->off, sizeof(int32_t) * (size_t)(ne + 1),
                 RF_DEVICE_COPY_DEVICE_TO_HOST, ws->stream);
  /* a device table writes nothing past cap but the rows needed into off[ne]: stop, never truncate */
  if (ws->moe_off[ne] > ws->moe_cap)
    RF_DIE("MoE layer: %d grouped rows exceed the workspace's %d (moe_cap)", ws->moe_off[ne], ws->moe_cap);
  return ws->moe_off;
}

/* h = silu(gate) * up over grouped rows [r0, r1) of gu ([rows, 2*inter]: gate, then up). */
static void moe_swiglu(const struct rf_model_ws *ws, float *hg, const float *gu, int r0, int r1, int inter) {
  for (int r = r0; r < r1; r++)
    ws->kern->swiglu_forward(hg + (size_t)r * inter, gu + (size_t)r * 2 * inter,
                             gu + (size_t)r * 2 * inter + inter, (size_t)inter, ws->stream);
}

/* ---- GPT-OSS's experts: [in, out] weights with biases, gate and up interleaved, the clamped
 * SwiGLU. Each expert's two matrices are transposed into ws->s_wt ([out, in], as the linear
 * ops take them; bf16 widened), its gradients gathered [out, in] in ws->s_gwt and added
 * transposed at the end of its rows. */

static int oss(const struct rf_model_ws *ws) {
  return rf_model_config_family(&ws->cfg)->router == RF_MODEL_ROUTER_TOPK_SOFTMAX;
}

/* Expert e's weights, transposed into s_wt: gate_up [2*inter, h] then down [h, inter]. */
static void oss_expert_weights(struct rf_model_ws *ws, const struct rf_model_weight *w, const int8_t *slot,
                               int e, struct rf_model_weight *wgu, struct rf_model_weight *wd) {
  int h = ws->cfg.hidden_size, inter = ws->cfg.moe.moe_intermediate_size;
  struct rf_model_weight gu =
      rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP]], e, h, 2 * inter);
  struct rf_model_weight dn =
      rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN]], e, inter, h);
  float *tgu = ws->s_wt, *td = ws->s_wt + (size_t)2 * inter * h;
  ws->kern->weight_transpose(tgu, &gu, h, 2 * inter, ws->stream);
  ws->kern->weight_transpose(td, &dn, inter, h, ws->stream);
  *wgu = (struct rf_model_weight){.f32 = tgu};
  *wd = (struct rf_model_weight){.f32 = td};
}

/* Adds expert e's bias of tensor t (n per expert) to rows of y. */
static void oss_bias(struct rf_model_ws *ws, const struct rf_model_weight *w, const int8_t *slot,
                     enum rf_model_layer_tensor t, int e, float *y, int rows, int n) {
  const float *b = rf_model_ws_bias_f32(ws, &w[slot[t]], (size_t)e * n, n);
  ws->kern->bias_forward(y, b, rows, n, ws->stream);
}

static void oss_experts_forward(struct rf_model_ws *ws, struct rf_model_moe_acts *a, const int8_t *slot,
                                const struct rf_model_weight *w, const int32_t *off) {
  const struct rf_model_config *c = &ws->cfg;
  int h = c->hidden_size, inter = c->moe.moe_intermediate_size, rows = ws->expert_rows;
  float alpha = (float)c->gpt_oss.swiglu_alpha, limit = (float)c->gpt_oss.swiglu_limit;
  for (int e = 0; e < c->moe.num_local_experts; e++) {
    if (off[e] == off[e + 1]) continue;
    struct rf_model_weight wgu, wd;
    oss_expert_weights(ws, w, slot, e, &wgu, &wd);
    for (int r = off[e]; r < off[e + 1]; r += rows) {
      float *gu = a->gu + (size_t)r * 2 * inter, *hg = ws->s_hg + (size_t)r * inter,
            *ey = a->ey + (size_t)r * h;
      rf_model_ws_linear_forward(ws, gu, ws->s_xg + (size_t)r * h, &wgu, rows, h, 2 * inter, 0.0f,
                                 &ws->stage);
      oss_bias(ws, w, slot, RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP_BIAS, e, gu, rows, 2 * inter);
      ws->kern->swiglu_clamp_forward(hg, gu, (size_t)rows * inter, alpha, limit, ws->stream);
      rf_model_ws_linear_forward(ws, ey, hg, &wd, rows, inter, h, 0.0f, &ws->stage);
      oss_bias(ws, w, slot, RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN_BIAS, e, ey, rows, h);
    }
  }
}

/* dyg: the grouped output gradients (padding rows zero), overwritten with d(xg). */
static void oss_experts_backward(struct rf_model_ws *ws, struct rf_model_moe_acts *a, const int8_t *slot,
                                 const struct rf_model_weight *w, float *const *grads, const int32_t *off,
                                 float *dyg) {
  const struct rf_model_config *c = &ws->cfg;
  int h = c->hidden_size, inter = c->moe.moe_intermediate_size, rows = ws->expert_rows;
  float alpha = (float)c->gpt_oss.swiglu_alpha, limit = (float)c->gpt_oss.swiglu_limit;
  size_t per_gu = (size_t)2 * inter * h;
  float *ggu = ws->s_gwt, *gd = ws->s_gwt + per_gu;
  for (int e = 0; e < c->moe.num_local_experts; e++) {
    if (off[e] == off[e + 1]) continue;
    struct rf_model_weight wgu, wd;
    oss_expert_weights(ws, w, slot, e, &wgu, &wd);
    rf_device_memset(ws->dev, ws->s_gwt, 0, sizeof(float) * 3 * per_gu / 2, ws->stream);
    float *gbgu = grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP_BIAS]] + (size_t)e * 2 * inter;
    float *gbd = grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN_BIAS]] + (size_t)e * h;
    for (int r = off[e]; r < off[e + 1]; r += rows) {
      float *hg = ws->s_hg + (size_t)r * inter, *dy = dyg + (size_t)r * h;
      float *gu = a->gu + (size_t)r * 2 * inter, *dgu = ws->s_dgu + (size_t)r * 2 * inter;
      ws->kern->swiglu_clamp_forward(hg, gu, (size_t)rows * inter, alpha, limit, ws->stream);
      ws->kern->bias_backward(gbd, dy, rows, h, ws->scratch, ws->scratch_bytes, ws->stream);
      rf_model_ws_linear_backward(ws, NULL, gd, dy, hg, &wd, rows, inter, h, 0.0f, &ws->stage);
      rf_model_ws_linear_backward(ws, hg, NULL, dy, NULL, &wd, rows, inter, h, 0.0f, &ws->stage); /* dh */
      ws->kern->swiglu_clamp_backward(dgu, hg, gu, (size_t)rows * inter, alpha, limit, ws->stream);
      ws->kern->bias_backward(gbgu, dgu, rows, 2 * inter, ws->scratch, ws->scratch_bytes, ws->stream);
      rf_model_ws_linear_backward(ws, dy, ggu, dgu, ws->s_xg + (size_t)r * h, &wgu, rows, h, 2 * inter, 0.0f,
                                  &ws->stage);
    }
    ws->kern->transpose_add(grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP]] + (size_t)e * per_gu, ggu,
                            2 * inter, h, ws->stream);
    ws->kern->transpose_add(grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN]] + (size_t)e * inter * h, gd, h,
                            inter, ws->stream);
  }
}

/* ---- DeepSeek-V3: the sigmoid group-limited router and the shared experts ---- */

static int group_router(const struct rf_model_ws *ws) {
  return rf_model_config_family(&ws->cfg)->router == RF_MODEL_ROUTER_SIGMOID_GROUP;
}

/* The router's products in f32 whatever the compute dtype (transformers' DeepseekV3TopkRouter:
 * F.linear on float32 operands). */
static struct rf_model_stage f32_stage(const struct rf_model_ws *ws) {
  struct rf_model_stage st = ws->stage;
  st.compute = RF_DTYPE_F32;
  return st;
}

/* The router of layer a: logits = xn W^T (f32) into s_dprobs; scores, choices and weights (the
 * balancing bias only chooses). */
static void group_route(struct rf_model_ws *ws, struct rf_model_moe_acts *a, const int8_t *slot,
                        const struct rf_model_weight *w, const float *xn, int n) {
  const struct rf_model_config *c = &ws->cfg;
  const struct rf_model_config_deepseek_v3 *d = &c->deepseek_v3;
  int ne = c->moe.num_local_experts;
  struct rf_model_stage st = f32_stage(ws);
  rf_model_ws_linear_forward(ws, ws->s_dprobs, xn, &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], n, c->hidden_size,
                             ne, 0.0f, &st);
  const float *bias = rf_model_ws_bias_f32(ws, &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER_SCORE_BIAS]], 0, ne);
  ws->kern->router_group_forward(a->probs, a->top, a->topw, ws->s_dprobs, bias, n, ne, d->n_group,
                                 d->topk_group, c->moe.num_experts_per_tok, c->moe.norm_topk_prob,
                                 (float)d->routed_scaling_factor, ws->scratch, ws->scratch_bytes, ws->stream);
}

/* The shared experts on the same input: out += down(silu(gate(xn)) * up(xn)), gate and up kept. */
static void shared_forward(struct rf_model_ws *ws, struct rf_model_moe_acts *a, const int8_t *slot,
                           const struct rf_model_weight *w, const float *xn, float *out, int n) {
  const struct rf_model_config *c = &ws->cfg;
  int h = c->hidden_size, s = c->deepseek_v3.n_shared_experts * c->deepseek_v3.moe_intermediate_size;
  const struct rf_model_stage *st = &ws->stage;
  rf_model_ws_linear_forward(ws, a->sgate, xn, &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_GATE]], n, h, s, 0.0f,
                             st);
  rf_model_ws_linear_forward(ws, a->sup, xn, &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_UP]], n, h, s, 0.0f, st);
  ws->kern->swiglu_forward(ws->s_inner, a->sgate, a->sup, (size_t)n * s, ws->stream);
  rf_model_ws_linear_forward(ws, out, ws->s_inner, &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_DOWN]], n, s, h, 1.0f,
                             st);
}

/* shared_forward's backward: dxn += its d(xn), its three gradients added. */
static void shared_backward(struct rf_model_ws *ws, const struct rf_model_moe_acts *a, const int8_t *slot,
                            const struct rf_model_weight *w, float *const *grads, const float *xn,
                            const float *dout, float *dxn, int n) {
  const struct rf_model_config *c = &ws->cfg;
  int h = c->hidden_size, s = c->deepseek_v3.n_shared_experts * c->deepseek_v3.moe_intermediate_size;
  size_t ns = (size_t)n * s;
  const struct rf_model_stage *st = &ws->stage;
  const struct rf_model_weight *wd = &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_DOWN]];
  ws->kern->swiglu_forward(ws->s_inner, a->sgate, a->sup, ns, ws->stream);
  rf_model_ws_linear_backward(ws, NULL, grads[slot[RF_MODEL_LAYER_TENSOR_SHARED_DOWN]], dout, ws->s_inner, wd,
                              n, s, h, 0.0f, st);
  rf_model_ws_linear_backward(ws, ws->s_inner, NULL, dout, NULL, wd, n, s, h, 0.0f, st); /* dh */
  /* dgate -> s_inner2, dup -> s_inner (in place over dh) */
  ws->kern->swiglu_backward(ws->s_inner2, ws->s_inner, ws->s_inner, a->sgate, a->sup, ns, ws->stream);
  rf_model_ws_linear_backward(ws, dxn, grads[slot[RF_MODEL_LAYER_TENSOR_SHARED_GATE]], ws->s_inner2, xn,
                              &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_GATE]], n, h, s, 1.0f, st);
  rf_model_ws_linear_backward(ws, dxn, grads[slot[RF_MODEL_LAYER_TENSOR_SHARED_UP]], ws->s_inner, xn,
                              &w[slot[RF_MODEL_LAYER_TENSOR_SHARED_UP]], n, h, s, 1.0f, st);
}

void rf_model_moe_forward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w, const float *xn,
                          float *out) {
  const struct rf_model_config *c = &ws->cfg;
  struct rf_model_moe_acts *a = &ws->layers[layer].moe;
  const int8_t *slot = ws->layers[layer].slot; /* where the router and the experts are in w */
  const struct rf_model_stage *st = &ws->stage;
  int n = ws->b * ws->t, ne = c->moe.num_local_experts, k = c->moe.num_experts_per_tok;
  int h = c->hidden_size, inter = c->moe.moe_intermediate_size, rows = ws->expert_rows;
  if (group_router(ws)) {
    group_route(ws, a, slot, w, xn, n);
  } else {
    rf_model_ws_linear_forward(ws, ws->s_dprobs, xn, &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], n, h, ne, 0.0f,
                               st);
    if (slot[RF_MODEL_LAYER_TENSOR_ROUTER_BIAS] >= 0)
      ws->kern->bias_forward(ws->s_dprobs,
                             rf_model_ws_bias_f32(ws, &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER_BIAS]], 0, ne), n,
                             ne, ws->stream);
    ws->kern->router_forward(a->probs, a->top, a->topw, ws->s_dprobs, n, ne, k, c->moe.norm_topk_prob,
                             ws->stream);
  }
  /* the counts: of the load-balancing loss (summed over the layers), or DeepSeek-V3's per layer (its
   * balancing bias; the score sums land in moe_psum, unused) */
  ws->kern->moe_stats(group_router(ws) ? ws->moe_load + (size_t)a->index * ne : ws->moe_count, ws->moe_psum,
                      a->top, a->probs, n, ne, k, ws->stream);
  const int32_t *off = moe_group(ws, a, xn, n);
  if (oss(ws)) {
    oss_experts_forward(ws, a, slot, w, off);
    ws->kern->moe_combine(out, a->ey, a->pos, a->topw, n, k, h, ws->stream);
    return;
  }
  for (int e = 0; e < ne; e++) {
    struct rf_model_weight wgu =
        rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP]], e, 2 * inter, h);
    struct rf_model_weight wd =
        rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN]], e, h, inter);
    for (int r = off[e]; r < off[e + 1]; r += rows) {
      rf_model_ws_linear_forward(ws, a->gu + (size_t)r * 2 * inter, ws->s_xg + (size_t)r * h, &wgu, rows, h,
                                 2 * inter, 0.0f, st);
      moe_swiglu(ws, ws->s_hg, a->gu, r, r + rows, inter);
      rf_model_ws_linear_forward(ws, a->ey + (size_t)r * h, ws->s_hg + (size_t)r * inter, &wd, rows, inter, h,
                                 0.0f, st);
    }
  }
  ws->kern->moe_combine(out, a->ey, a->pos, a->topw, n, k, h, ws->stream);
  if (group_router(ws)) shared_forward(ws, a, slot, w, xn, out, n);
}

void rf_model_moe_backward(struct rf_model_ws *ws, int layer, const struct rf_model_weight *w,
                           const float *xn, const float *dout, float *dxn, float *const *grads) {
  const struct rf_model_config *c = &ws->cfg;
  struct rf_model_moe_acts *a = &ws->layers[layer].moe;
  const int8_t *slot = ws->layers[layer].slot; /* where the router and the experts are in w */
  const struct rf_model_stage *st = &ws->stage;
  int n = ws->b * ws->t, ne = c->moe.num_local_experts, k = c->moe.num_experts_per_tok;
  int h = c->hidden_size, inter = c->moe.moe_intermediate_size, rows = ws->expert_rows;
  /* the routing weights: d(topw[r, j]) = dout[r] . ey[pos[r, j]] (into s_dxg, free until the experts) */
  float *dtopw = ws->s_dxg;
  ws->kern->moe_combine_weights_backward(dtopw, dout, a->ey, a->pos, n, k, h, ws->stream);
  if (group_router(ws)) { /* the balancing bias takes no gradient; the router's products in f32 */
    ws->kern->router_group_backward(ws->s_dprobs, dtopw, a->probs, a->top, a->topw, n, ne, k,
                                    c->moe.norm_topk_prob, (float)c->deepseek_v3.routed_scaling_factor,
                                    ws->stream);
    struct rf_model_stage rst = f32_stage(ws);
    rf_model_ws_linear_backward(ws, dxn, grads[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], ws->s_dprobs, xn,
                                &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], n, h, ne, 0.0f, &rst);
    shared_backward(ws, a, slot, w, grads, xn, dout, dxn, n);
  } else {
    ws->kern->router_backward(ws->s_dprobs, dtopw, a->probs, a->top, a->topw, ws->moe_balance, n, ne, k,
                              c->moe.norm_topk_prob, ws->stream);
    if (slot[RF_MODEL_LAYER_TENSOR_ROUTER_BIAS] >= 0)
      ws->kern->bias_backward(grads[slot[RF_MODEL_LAYER_TENSOR_ROUTER_BIAS]], ws->s_dprobs, n, ne,
                              ws->scratch, ws->scratch_bytes, ws->stream);
    rf_model_ws_linear_backward(ws, dxn, grads[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], ws->s_dprobs, xn,
                                &w[slot[RF_MODEL_LAYER_TENSOR_ROUTER]], n, h, ne, 0.0f, st);
  }
  /* the experts' output gradients, weighted, grouped (into s_dxg; zero padding rows) */
  const int32_t *off = moe_group(ws, a, xn, n);
  float *dyg = ws->s_dxg;
  ws->kern->moe_scatter(dyg, dout, a->pos, a->tok, a->off, a->topw, n, ne, k, h, ws->stream);
  if (oss(ws)) {
    oss_experts_backward(ws, a, slot, w, grads, off, dyg);
    ws->kern->moe_gather(dxn, dyg, a->pos, n, k, h, ws->stream);
    return;
  }
  size_t per_gu = (size_t)2 * inter * h, per_down = (size_t)h * inter;
  /* an expert's rows are the tokens routed to it, from any sequence: its FP8 dW tiles run
   * over them whole (128 of them at a time, as the rank's micro-batch groups them) */
  struct rf_model_stage est = *st;
  est.fp8.seq = 0;
  st = &est;
  for (int e = 0; e < ne; e++) {
    struct rf_model_weight wgu =
        rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP]], e, 2 * inter, h);
    struct rf_model_weight wd =
        rf_model_moe_expert_weight(&w[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN]], e, h, inter);
    float *ggu = grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_GATE_UP]] + (size_t)e * per_gu;
    float *gd = grads[slot[RF_MODEL_LAYER_TENSOR_EXPERTS_DOWN]] + (size_t)e * per_down;
    for (int r = off[e]; r < off[e + 1]; r += rows) {
      float *hg = ws->s_hg + (size_t)r * inter, *dy = dyg + (size_t)r * h;
      float *gu = a->gu + (size_t)r * 2 * inter, *dgu = ws->s_dgu + (size_t)r * 2 * inter;
      moe_swiglu(ws, ws->s_hg, a->gu, r, r + rows, inter);
      rf_model_ws_linear_backward(ws, NULL, gd, dy, hg, &wd, rows, inter, h, 0.0f, st);
      rf_model_ws_linear_backward(ws, hg, NULL, dy, NULL, &wd, rows, inter, h, 0.0f, st); /* dh over h */
      for (int i = 0; i < rows; i++) {
        const float *gi = gu + (size_t)i * 2 * inter;
        float *di = dgu + (size_t)i * 2 * inter;
        ws->kern->swiglu_backward(di, di + inter, hg + (size_t)i * inter, gi, gi + inter, (size_t)inter,
                                  ws->stream);
      }
      /* dx over this chunk's output gradients (no longer needed) */
      rf_model_ws_linear_backward(ws, dy, ggu, dgu, ws->s_xg + (size_t)r * h, &wgu, rows, h, 2 * inter, 0.0f,
                                  st);
    }
  }
  ws->kern->moe_gather(dxn, dyg, a->pos, n, k, h, ws->stream);
}
