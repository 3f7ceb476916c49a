/* The host's kernel table: the ops of ops.c and moe.c behind struct rf_model_kernels
 * (kernels.h), wrapped, not rewritten. The stream is ignored (the host runs at
 * once); the only scratch used is attention's, one slice of
 * [2, RF_MODEL_ATT_BLOCK, seq] floats per OpenMP thread, as the workspace sizes it. */
#include "model/kernels.h"

#include <string.h>

#include "core/core.h"
#include "model/config.h"
#include "model/family.h"
#include "model/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* One attention slice (per thread) in bytes. */
static size_t host_att_slice_bytes(int seq) { return sizeof(float) * 2 * RF_MODEL_ATT_BLOCK * (size_t)seq; }

static size_t host_scratch_bytes(const struct rf_model_config *cfg, int batch, int seq) {
  (void)batch;
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  size_t bytes = (size_t)threads * host_att_slice_bytes(seq);
  /* DeepSeek-V3's router: its choice, one row's experts */
  size_t choice = sizeof(float) * (size_t)cfg->moe.num_local_experts;
  if (rf_model_config_is_moe(cfg) && rf_model_config_family(cfg)->router == RF_MODEL_ROUTER_SIGMOID_GROUP &&
      choice > bytes)
    bytes = choice;
  return bytes;
}

/* The slices a scratch of `bytes` holds (at least one is needed). */
static int host_att_slices(size_t bytes, int seq) {
  size_t slices = bytes / host_att_slice_bytes(seq);
  RF_ASSERT(slices >= 1);
  return slices > 4096 ? 4096 : (int)slices;
}

static void host_embedding_forward(float *out, const struct rf_model_weight *table, const int32_t *tokens,
                                   int n, int dim, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_embedding_forward(out, table, tokens, n, dim);
}

static void host_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim,
                                    void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  (void)stream;
  rf_model_embedding_backward(dtable, dout, tokens, n, dim);
}

static void host_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                                 float eps, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_rmsnorm_forward(out, rstd, x, w, n_rows, dim, eps);
}

static void host_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                                  const float *w, int n_rows, int dim, void *scratch, size_t scratch_bytes,
                                  struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  (void)stream;
  rf_model_rmsnorm_backward(dx, dw, dout, x, rstd, w, n_rows, dim);
}

static void host_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                            const float *sin_t, int inverse, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_rope_apply(x, batch, seq, n_heads, hd, cos_t, sin_t, inverse);
}

static void host_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                   int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                   size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_attention_forward(y, lse, q, k, v, batch, seq, nh, nkv, hd, scratch,
                             host_att_slices(scratch_bytes, seq));
}

static void host_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                    const float *lse, const float *q, const float *k, const float *v,
                                    int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                    size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)y;
  (void)stream;
  rf_model_attention_backward(dq, dk, dv, dy, lse, q, k, v, batch, seq, nh, nkv, hd, scratch,
                              host_att_slices(scratch_bytes, seq));
}

static void host_swiglu_forward(float *h, const float *gate, const float *up, size_t n,
                                struct rf_device_stream *stream) {
  (void)stream;
  rf_model_swiglu_forward(h, gate, up, n);
}

static void host_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                 const float *up, size_t n, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_swiglu_backward(dgate, dup, dh, gate, up, n);
}

static void host_bias_forward(float *y, const float *b, int n, int out, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_bias_forward(y, b, n, out);
}

static void host_bias_backward(float *db, const float *dy, int n, int out, void *scratch,
                               size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  (void)stream;
  rf_model_bias_backward(db, dy, n, out);
}

static void host_cross_entropy_forward(double *loss, float *lse, const float *logits, const int32_t *targets,
                                       int n, int vocab, void *scratch, size_t scratch_bytes,
                                       struct rf_device_stream *stream) {
  (void)scratch;
  (void)scratch_bytes;
  (void)stream;
  *loss = rf_model_cross_entropy_forward(lse, logits, targets, n, vocab);
}

static void host_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                        int vocab, float scale, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_cross_entropy_backward(logits, lse, targets, n, vocab, scale);
}

/* rf_model_router_forward only reads its logits (its pointer is not const). */
static void host_router_forward(float *probs, int32_t *top, float *topw, const float *logits, int n,
                                int n_experts, int k, int renorm, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_router_forward(probs, top, topw, (float *)logits, n, n_experts, k, renorm);
}

static void host_router_backward(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                                 const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                                 int renorm, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_router_backward(dlogits, dtopw, probs, top, topw, dprobs_extra, n, n_experts, k, renorm);
}

/* The linear layers without the stage's progress callback (the workspace calls it). */
static void host_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                                int out, float beta, const struct rf_model_stage *st,
                                struct rf_device_stream *stream) {
  (void)stream;
  struct rf_model_stage quiet;
  if (st) {
    quiet = *st;
    quiet.progress = NULL;
  }
  rf_model_linear_forward(y, x, w, n, in, out, beta, st ? &quiet : NULL);
}

static void host_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                                 const struct rf_model_weight *w, int n, int in, int out, float beta,
                                 const struct rf_model_stage *st, struct rf_device_stream *stream) {
  (void)stream;
  struct rf_model_stage quiet;
  if (st) {
    quiet = *st;
    quiet.progress = NULL;
  }
  rf_model_linear_backward(dx, dw, dy, x, w, n, in, out, beta, st ? &quiet : NULL);
}

static void host_rmsnorm_apply(float *out, const float *x, const float *rstd, const float *w, int n_rows,
                               int dim, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_rmsnorm_apply(out, x, rstd, w, n_rows, dim);
}

static void host_moe_stats(double *count, double *psum, const int32_t *top, const float *probs, int n,
                           int n_experts, int k, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_stats(count, psum, top, probs, n, n_experts, k);
}

static void host_moe_group(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top,
                           const float *xn, int n, int n_experts, int k, int hidden, int rows, int cap,
                           struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_group(off, tok, pos, xg, top, xn, n, n_experts, k, hidden, rows, cap);
}

static void host_moe_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                             int hidden, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_combine(out, ey, pos, topw, n, k, hidden);
}

static void host_moe_combine_weights_backward(float *dtopw, const float *dout, const float *ey,
                                              const int32_t *pos, int n, int k, int hidden,
                                              struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_combine_weights_backward(dtopw, dout, ey, pos, n, k, hidden);
}

static void host_moe_scatter(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                             const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden,
                             struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_scatter(dyg, dout, pos, tok, off, topw, n, n_experts, k, hidden);
}

static void host_moe_gather(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden,
                            struct rf_device_stream *stream) {
  (void)stream;
  rf_model_moe_gather(dxn, dyg, pos, n, k, hidden);
}

static void host_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                        const float *sinks, int window, int batch, int seq, int nh, int nkv,
                                        int hd, void *scratch, size_t scratch_bytes,
                                        struct rf_device_stream *stream) {
  (void)stream;
  rf_model_attention_sink_forward(y, lse, q, k, v, sinks, window, batch, seq, nh, nkv, hd, scratch,
                                  host_att_slices(scratch_bytes, seq));
}

static void host_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                         const float *y, const float *lse, const float *q, const float *k,
                                         const float *v, const float *sinks, int window, int batch, int seq,
                                         int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                                         struct rf_device_stream *stream) {
  (void)stream;
  rf_model_attention_sink_backward(dq, dk, dv, dsinks, dy, y, lse, q, k, v, sinks, window, batch, seq, nh,
                                   nkv, hd, scratch, host_att_slices(scratch_bytes, seq));
}

static void host_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit,
                                      struct rf_device_stream *stream) {
  (void)stream;
  rf_model_swiglu_clamp_forward(h, gu, n, alpha, limit);
}

static void host_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n, float alpha,
                                       float limit, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_swiglu_clamp_backward(dgu, dh, gu, n, alpha, limit);
}

static void host_weight_transpose(float *dst, const struct rf_model_weight *w, int rows, int cols,
                                  struct rf_device_stream *stream) {
  (void)stream;
  rf_model_weight_transpose(dst, w, rows, cols);
}

static void host_transpose_add(float *dst, const float *src, int rows, int cols,
                               struct rf_device_stream *stream) {
  (void)stream;
  rf_model_transpose_add(dst, src, rows, cols);
}

static void host_mla_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                       int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                       void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_attention_mla_forward(y, lse, q, k, v, batch, seq, nh, nkv, hd, dv, scale, scratch,
                                 host_att_slices(scratch_bytes, seq));
}

static void host_mla_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                        const float *lse, const float *q, const float *k, const float *v,
                                        int batch, int seq, int nh, int nkv, int hd, int vd, float scale,
                                        void *scratch, size_t scratch_bytes,
                                        struct rf_device_stream *stream) {
  (void)stream, (void)y;
  rf_model_attention_mla_backward(dq, dk, dv, dy, lse, q, k, v, batch, seq, nh, nkv, hd, vd, scale, scratch,
                                  host_att_slices(scratch_bytes, seq));
}

static void host_mla_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                                const float *cos_t, const float *sin_t, int interleave, int inverse,
                                struct rf_device_stream *stream) {
  (void)stream;
  rf_model_mla_rope_apply(x, batch, seq, n_heads, stride, off, rd, cos_t, sin_t, interleave, inverse);
}

static void host_mla_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh,
                               int nope, int rope, int dv, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_mla_kv_expand(k, v, kvb, kpe, n, nh, nope, rope, dv);
}

static void host_mla_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n,
                                        int nh, int nope, int rope, int vd, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_mla_kv_expand_backward(dkvb, dkpe, dk, dv, n, nh, nope, rope, vd);
}

static void host_router_group_forward(float *scores, int32_t *top, float *topw, const float *logits,
                                      const float *bias, int n, int n_experts, int n_group, int topk_group,
                                      int k, int renorm, float scale, void *scratch, size_t scratch_bytes,
                                      struct rf_device_stream *stream) {
  (void)stream;
  RF_ASSERT(scratch_bytes >= sizeof(float) * (size_t)n_experts);
  rf_model_router_group_forward(scores, top, topw, scratch, logits, bias, n, n_experts, n_group, topk_group,
                                k, renorm, scale);
}

static void host_router_group_backward(float *dlogits, const float *dtopw, const float *scores,
                                       const int32_t *top, const float *topw, int n, int n_experts, int k,
                                       int renorm, float scale, struct rf_device_stream *stream) {
  (void)stream;
  rf_model_router_group_backward(dlogits, dtopw, scores, top, topw, n, n_experts, k, renorm, scale);
}

/* What a model needs of a table (bits of missing_entry's `needs`). */
enum { NEED_MOE = 1, NEED_SINKS = 2, NEED_OSS_EXPERTS = 4, NEED_MLA = 8, NEED_GROUP_ROUTER = 16 };

/* The first entry k lacks; the router's and the MoE layer's only when needs has NEED_MOE, the
 * sinks' and GPT-OSS experts' only when it has theirs. */
static const char *missing_entry(const struct rf_model_kernels *k, int needs) {
#define RF_KERNEL_ENTRY(e) \
  { #e, (const void *)k->e }
  const struct {
    const char *name;
    const void *fn;
  } entries[] = {RF_KERNEL_ENTRY(scratch_bytes),
                 RF_KERNEL_ENTRY(embedding_forward),
                 RF_KERNEL_ENTRY(embedding_backward),
                 RF_KERNEL_ENTRY(rmsnorm_forward),
                 RF_KERNEL_ENTRY(rmsnorm_backward),
                 RF_KERNEL_ENTRY(rope_apply),
                 RF_KERNEL_ENTRY(attention_forward),
                 RF_KERNEL_ENTRY(attention_backward),
                 RF_KERNEL_ENTRY(swiglu_forward),
                 RF_KERNEL_ENTRY(swiglu_backward),
                 RF_KERNEL_ENTRY(bias_forward),
                 RF_KERNEL_ENTRY(bias_backward),
                 RF_KERNEL_ENTRY(cross_entropy_forward),
                 RF_KERNEL_ENTRY(cross_entropy_backward),
                 RF_KERNEL_ENTRY(router_forward),
                 RF_KERNEL_ENTRY(router_backward),
                 RF_KERNEL_ENTRY(linear_forward),
                 RF_KERNEL_ENTRY(linear_backward),
                 RF_KERNEL_ENTRY(rmsnorm_apply),
                 RF_KERNEL_ENTRY(moe_stats),
                 RF_KERNEL_ENTRY(moe_group),
                 RF_KERNEL_ENTRY(moe_combine),
                 RF_KERNEL_ENTRY(moe_combine_weights_backward),
                 RF_KERNEL_ENTRY(moe_scatter),
                 RF_KERNEL_ENTRY(moe_gather),
                 RF_KERNEL_ENTRY(attention_sink_forward),
                 RF_KERNEL_ENTRY(attention_sink_backward),
                 RF_KERNEL_ENTRY(swiglu_clamp_forward),
                 RF_KERNEL_ENTRY(swiglu_clamp_backward),
                 RF_KERNEL_ENTRY(weight_transpose),
                 RF_KERNEL_ENTRY(transpose_add),
                 RF_KERNEL_ENTRY(mla_attention_forward),
                 RF_KERNEL_ENTRY(mla_attention_backward),
                 RF_KERNEL_ENTRY(mla_rope_apply),
                 RF_KERNEL_ENTRY(mla_kv_expand),
                 RF_KERNEL_ENTRY(mla_kv_expand_backward),
                 RF_KERNEL_ENTRY(router_group_forward),
                 RF_KERNEL_ENTRY(router_group_backward)};
#undef RF_KERNEL_ENTRY
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    const char *e = entries[i].name;
    int need = strncmp(e, "router_group_", 13) == 0                             ? NEED_GROUP_ROUTER
               : strncmp(e, "moe_", 4) == 0 || strncmp(e, "router_", 7) == 0    ? NEED_MOE
               : strncmp(e, "attention_sink_", 15) == 0                         ? NEED_SINKS
               : strncmp(e, "swiglu_clamp_", 13) == 0 || strstr(e, "transpose") ? NEED_OSS_EXPERTS
               : strncmp(e, "mla_", 4) == 0                                     ? NEED_MLA
                                                                                : 0;
    if (!entries[i].fn && (!need || (needs & need))) return e;
  }
  return NULL;
}

const char *rf_model_kernels_missing(const struct rf_model_kernels *k) {
  return missing_entry(k, NEED_MOE | NEED_SINKS | NEED_OSS_EXPERTS | NEED_MLA | NEED_GROUP_ROUTER);
}

const char *rf_model_kernels_missing_for(const struct rf_model_kernels *k,
                                         const struct rf_model_config *cfg) {
  const struct rf_model_family *f = rf_model_config_family(cfg);
  int moe = rf_model_config_is_moe(cfg);
  /* DeepSeek-V3's router only where a layer is MoE (all dense: first_k_dense_replace = layers) */
  int group = rf_model_config_moe_layers(cfg) > 0 && f->router == RF_MODEL_ROUTER_SIGMOID_GROUP;
  return missing_entry(k, (moe ? NEED_MOE : 0) | (f->attention_sinks ? NEED_SINKS : 0) |
                              (moe && f->router == RF_MODEL_ROUTER_TOPK_SOFTMAX ? NEED_OSS_EXPERTS : 0) |
                              (f->mla ? NEED_MLA : 0) | (group ? NEED_GROUP_ROUTER : 0));
}

const struct rf_model_kernels rf_model_kernels_host = {
    .name = "host",
    .host_memory = 1,
    .scratch_bytes = host_scratch_bytes,
    .embedding_forward = host_embedding_forward,
    .embedding_backward = host_embedding_backward,
    .rmsnorm_forward = host_rmsnorm_forward,
    .rmsnorm_backward = host_rmsnorm_backward,
    .rope_apply = host_rope_apply,
    .attention_forward = host_attention_forward,
    .attention_backward = host_attention_backward,
    .swiglu_forward = host_swiglu_forward,
    .swiglu_backward = host_swiglu_backward,
    .bias_forward = host_bias_forward,
    .bias_backward = host_bias_backward,
    .cross_entropy_forward = host_cross_entropy_forward,
    .cross_entropy_backward = host_cross_entropy_backward,
    .router_forward = host_router_forward,
    .router_backward = host_router_backward,
    .linear_forward = host_linear_forward,
    .linear_backward = host_linear_backward,
    .rmsnorm_apply = host_rmsnorm_apply,
    .moe_stats = host_moe_stats,
    .moe_group = host_moe_group,
    .moe_combine = host_moe_combine,
    .moe_combine_weights_backward = host_moe_combine_weights_backward,
    .moe_scatter = host_moe_scatter,
    .moe_gather = host_moe_gather,
    .attention_sink_forward = host_attention_sink_forward,
    .attention_sink_backward = host_attention_sink_backward,
    .swiglu_clamp_forward = host_swiglu_clamp_forward,
    .swiglu_clamp_backward = host_swiglu_clamp_backward,
    .weight_transpose = host_weight_transpose,
    .transpose_add = host_transpose_add,
    .mla_attention_forward = host_mla_attention_forward,
    .mla_attention_backward = host_mla_attention_backward,
    .mla_rope_apply = host_mla_rope_apply,
    .mla_kv_expand = host_mla_kv_expand,
    .mla_kv_expand_backward = host_mla_kv_expand_backward,
    .router_group_forward = host_router_group_forward,
    .router_group_backward = host_router_group_backward,
};
