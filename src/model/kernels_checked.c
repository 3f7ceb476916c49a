/* The checked device's kernel table (kernels.h): every entry launches the host table's
 * entry of the same name (kernels_host.c) on the stream it is given
 * (rf_device_stream_launch), so it runs on the stream's worker thread in stream order,
 * later than asked. The arguments are taken at the call (a struct rf_model_weight and a
 * struct rf_model_stage by value: the caller may change or drop them at once), and every
 * pointer among them, a weight's and the stage's buffers included, is translated by
 * rf_device_stream_view inside the launched code: nothing here reads device memory on the
 * host thread, and the arithmetic is the host table's, bit for bit.
 *
 * Threads: the launched code runs with the launching thread's OpenMP budget
 * (omp_get_max_threads() at the call), so a worker computes on as many threads as the rank
 * was given and its sums split as the host's do. */
#include "model/kernels.h"

#include "core/core.h"
#include "device/device.h"
#include "model/config.h"
#include "model/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define HOST rf_model_kernels_host

/* What every launch carries: its stream (for the views) and the caller's thread budget. */
struct ck_head {
  struct rf_device_stream *s;
  int threads;
};

static struct ck_head ck_head(struct rf_device_stream *s, const char *what) {
  if (!s) RF_DIE("model kernels (checked): %s without a stream (NULL): name the runtime's", what);
  struct ck_head h = {s, 1};
#ifdef _OPENMP
  h.threads = omp_get_max_threads();
#endif
  return h;
}

/* On the worker: the caller's thread budget. */
static void ck_enter(const struct ck_head *h) {
#ifdef _OPENMP
  if (omp_get_max_threads() != h->threads) omp_set_num_threads(h->threads);
#else
  (void)h;
#endif
}

#define V(p) rf_device_stream_view(a->h.s, (p))
#define LAUNCH(what, fn, a) rf_device_stream_launch((a).h.s, "model kernel " what, fn, &(a), sizeof(a))

static struct rf_model_weight ck_weight(const struct rf_device_stream *s, const struct rf_model_weight *w) {
  struct rf_model_weight v = {rf_device_stream_view(s, w->f32), rf_device_stream_view(s, w->bf16),
                              rf_device_stream_view(s, w->fp8), rf_device_stream_view(s, w->fp8_scales)};
  return v;
}

static struct rf_model_stage ck_stage(const struct rf_device_stream *s, const struct rf_model_stage *st) {
  struct rf_model_stage v = *st;
  v.act = rf_device_stream_view(s, st->act);
  v.act2 = rf_device_stream_view(s, st->act2);
  v.wbf16 = rf_device_stream_view(s, st->wbf16);
  v.wf32 = rf_device_stream_view(s, st->wf32);
  v.fp8.a = rf_device_stream_view(s, st->fp8.a);
  v.fp8.b = rf_device_stream_view(s, st->fp8.b);
  v.fp8.w = rf_device_stream_view(s, st->fp8.w);
  v.fp8.sa = rf_device_stream_view(s, st->fp8.sa);
  v.fp8.sb = rf_device_stream_view(s, st->fp8.sb);
  v.fp8.work = rf_device_stream_view(s, st->fp8.work);
  v.progress = NULL; /* the workspace calls it on the host thread */
  v.progress_ctx = NULL;
  return v;
}

static size_t ck_scratch_bytes(const struct rf_model_config *cfg, int batch, int seq) {
  return HOST.scratch_bytes(cfg, batch, seq);
}

/* ---- embedding ---- */

struct ck_embedding {
  struct ck_head h;
  float *out;
  const float *dout;
  float *dtable;
  struct rf_model_weight table;
  const int32_t *tokens;
  int n, dim;
  void *scratch;
  size_t scratch_bytes;
};

static void run_embedding_forward(void *arg) {
  struct ck_embedding *a = arg;
  ck_enter(&a->h);
  struct rf_model_weight t = ck_weight(a->h.s, &a->table);
  HOST.embedding_forward(V(a->out), &t, V(a->tokens), a->n, a->dim, NULL);
}

static void ck_embedding_forward(float *out, const struct rf_model_weight *table, const int32_t *tokens,
                                 int n, int dim, struct rf_device_stream *stream) {
  struct ck_embedding a = {.h = ck_head(stream, "embedding_forward"),
                           .out = out,
                           .table = *table,
                           .tokens = tokens,
                           .n = n,
                           .dim = dim};
  LAUNCH("embedding_forward", run_embedding_forward, a);
}

static void run_embedding_backward(void *arg) {
  struct ck_embedding *a = arg;
  ck_enter(&a->h);
  HOST.embedding_backward(V(a->dtable), V(a->dout), V(a->tokens), a->n, a->dim, V(a->scratch),
                          a->scratch_bytes, NULL);
}

static void ck_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim,
                                  void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  struct ck_embedding a = {.h = ck_head(stream, "embedding_backward"),
                           .dtable = dtable,
                           .dout = dout,
                           .tokens = tokens,
                           .n = n,
                           .dim = dim,
                           .scratch = scratch,
                           .scratch_bytes = scratch_bytes};
  LAUNCH("embedding_backward", run_embedding_backward, a);
}

/* ---- RMSNorm ---- */

struct ck_rmsnorm {
  struct ck_head h;
  float *out, *rstd_out, *dx, *dw;
  const float *x, *w, *dout, *rstd;
  int n_rows, dim;
  float eps;
  void *scratch;
  size_t scratch_bytes;
};

static void run_rmsnorm_forward(void *arg) {
  struct ck_rmsnorm *a = arg;
  ck_enter(&a->h);
  HOST.rmsnorm_forward(V(a->out), V(a->rstd_out), V(a->x), V(a->w), a->n_rows, a->dim, a->eps, NULL);
}

static void ck_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                               float eps, struct rf_device_stream *stream) {
  struct ck_rmsnorm a = {.h = ck_head(stream, "rmsnorm_forward"),
                         .out = out,
                         .rstd_out = rstd,
                         .x = x,
                         .w = w,
                         .n_rows = n_rows,
                         .dim = dim,
                         .eps = eps};
  LAUNCH("rmsnorm_forward", run_rmsnorm_forward, a);
}

static void run_rmsnorm_backward(void *arg) {
  struct ck_rmsnorm *a = arg;
  ck_enter(&a->h);
  HOST.rmsnorm_backward(V(a->dx), V(a->dw), V(a->dout), V(a->x), V(a->rstd), V(a->w), a->n_rows, a->dim,
                        V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                                const float *w, int n_rows, int dim, void *scratch, size_t scratch_bytes,
                                struct rf_device_stream *stream) {
  struct ck_rmsnorm a = {.h = ck_head(stream, "rmsnorm_backward"),
                         .dx = dx,
                         .dw = dw,
                         .dout = dout,
                         .x = x,
                         .rstd = rstd,
                         .w = w,
                         .n_rows = n_rows,
                         .dim = dim,
                         .scratch = scratch,
                         .scratch_bytes = scratch_bytes};
  LAUNCH("rmsnorm_backward", run_rmsnorm_backward, a);
}

static void run_rmsnorm_apply(void *arg) {
  struct ck_rmsnorm *a = arg;
  ck_enter(&a->h);
  HOST.rmsnorm_apply(V(a->out), V(a->x), V(a->rstd), V(a->w), a->n_rows, a->dim, NULL);
}

static void ck_rmsnorm_apply(float *out, const float *x, const float *rstd, const float *w, int n_rows,
                             int dim, struct rf_device_stream *stream) {
  struct ck_rmsnorm a = {.h = ck_head(stream, "rmsnorm_apply"),
                         .out = out,
                         .x = x,
                         .rstd = rstd,
                         .w = w,
                         .n_rows = n_rows,
                         .dim = dim};
  LAUNCH("rmsnorm_apply", run_rmsnorm_apply, a);
}

/* ---- rotary embedding ---- */

struct ck_rope {
  struct ck_head h;
  float *x;
  const float *cos_t, *sin_t;
  int batch, seq, n_heads, hd, inverse;
};

static void run_rope_apply(void *arg) {
  struct ck_rope *a = arg;
  ck_enter(&a->h);
  HOST.rope_apply(V(a->x), a->batch, a->seq, a->n_heads, a->hd, V(a->cos_t), V(a->sin_t), a->inverse, NULL);
}

static void ck_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                          const float *sin_t, int inverse, struct rf_device_stream *stream) {
  struct ck_rope a = {ck_head(stream, "rope_apply"), x, cos_t, sin_t, batch, seq, n_heads, hd, inverse};
  LAUNCH("rope_apply", run_rope_apply, a);
}

/* ---- attention ---- */

struct ck_attention {
  struct ck_head h;
  float *y, *lse_out, *dq, *dk, *dv;
  const float *dy, *yf, *lse, *q, *k, *v;
  int batch, seq, nh, nkv, hd;
  void *scratch;
  size_t scratch_bytes;
};

static void run_attention_forward(void *arg) {
  struct ck_attention *a = arg;
  ck_enter(&a->h);
  HOST.attention_forward(V(a->y), V(a->lse_out), V(a->q), V(a->k), V(a->v), a->batch, a->seq, a->nh, a->nkv,
                         a->hd, V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                 int batch, int seq, int nh, int nkv, int hd, void *scratch,
                                 size_t scratch_bytes, struct rf_device_stream *stream) {
  struct ck_attention a = {.h = ck_head(stream, "attention_forward"),
                           .y = y,
                           .lse_out = lse,
                           .q = q,
                           .k = k,
                           .v = v,
                           .batch = batch,
                           .seq = seq,
                           .nh = nh,
                           .nkv = nkv,
                           .hd = hd,
                           .scratch = scratch,
                           .scratch_bytes = scratch_bytes};
  LAUNCH("attention_forward", run_attention_forward, a);
}

static void run_attention_backward(void *arg) {
  struct ck_attention *a = arg;
  ck_enter(&a->h);
  HOST.attention_backward(V(a->dq), V(a->dk), V(a->dv), V(a->dy), V(a->yf), V(a->lse), V(a->q), V(a->k),
                          V(a->v), a->batch, a->seq, a->nh, a->nkv, a->hd, V(a->scratch), a->scratch_bytes,
                          NULL);
}

static void ck_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                  const float *lse, const float *q, const float *k, const float *v, int batch,
                                  int seq, int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                                  struct rf_device_stream *stream) {
  struct ck_attention a = {.h = ck_head(stream, "attention_backward"),
                           .dq = dq,
                           .dk = dk,
                           .dv = dv,
                           .dy = dy,
                           .yf = y,
                           .lse = lse,
                           .q = q,
                           .k = k,
                           .v = v,
                           .batch = batch,
                           .seq = seq,
                           .nh = nh,
                           .nkv = nkv,
                           .hd = hd,
                           .scratch = scratch,
                           .scratch_bytes = scratch_bytes};
  LAUNCH("attention_backward", run_attention_backward, a);
}

/* ---- SwiGLU ---- */

struct ck_swiglu {
  struct ck_head h;
  float *out, *dgate, *dup;
  const float *dh, *gate, *up;
  size_t n;
};

static void run_swiglu_forward(void *arg) {
  struct ck_swiglu *a = arg;
  ck_enter(&a->h);
  HOST.swiglu_forward(V(a->out), V(a->gate), V(a->up), a->n, NULL);
}

static void ck_swiglu_forward(float *h, const float *gate, const float *up, size_t n,
                              struct rf_device_stream *stream) {
  struct ck_swiglu a = {.h = ck_head(stream, "swiglu_forward"), .out = h, .gate = gate, .up = up, .n = n};
  LAUNCH("swiglu_forward", run_swiglu_forward, a);
}

static void run_swiglu_backward(void *arg) {
  struct ck_swiglu *a = arg;
  ck_enter(&a->h);
  HOST.swiglu_backward(V(a->dgate), V(a->dup), V(a->dh), V(a->gate), V(a->up), a->n, NULL);
}

static void ck_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                               size_t n, struct rf_device_stream *stream) {
  struct ck_swiglu a = {.h = ck_head(stream, "swiglu_backward"),
                        .dgate = dgate,
                        .dup = dup,
                        .dh = dh,
                        .gate = gate,
                        .up = up,
                        .n = n};
  LAUNCH("swiglu_backward", run_swiglu_backward, a);
}

/* ---- bias ---- */

struct ck_bias {
  struct ck_head h;
  float *y, *db;
  const float *b, *dy;
  int n, out;
  void *scratch;
  size_t scratch_bytes;
};

static void run_bias_forward(void *arg) {
  struct ck_bias *a = arg;
  ck_enter(&a->h);
  HOST.bias_forward(V(a->y), V(a->b), a->n, a->out, NULL);
}

static void ck_bias_forward(float *y, const float *b, int n, int out, struct rf_device_stream *stream) {
  struct ck_bias a = {.h = ck_head(stream, "bias_forward"), .y = y, .b = b, .n = n, .out = out};
  LAUNCH("bias_forward", run_bias_forward, a);
}

static void run_bias_backward(void *arg) {
  struct ck_bias *a = arg;
  ck_enter(&a->h);
  HOST.bias_backward(V(a->db), V(a->dy), a->n, a->out, V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_bias_backward(float *db, const float *dy, int n, int out, void *scratch, size_t scratch_bytes,
                             struct rf_device_stream *stream) {
  struct ck_bias a = {.h = ck_head(stream, "bias_backward"),
                      .db = db,
                      .dy = dy,
                      .n = n,
                      .out = out,
                      .scratch = scratch,
                      .scratch_bytes = scratch_bytes};
  LAUNCH("bias_backward", run_bias_backward, a);
}

/* ---- cross-entropy ---- */

struct ck_ce {
  struct ck_head h;
  double *loss;
  float *lse_out, *logits_io;
  const float *logits, *lse;
  const int32_t *targets;
  int n, vocab;
  float scale;
  void *scratch;
  size_t scratch_bytes;
};

static void run_cross_entropy_forward(void *arg) {
  struct ck_ce *a = arg;
  ck_enter(&a->h);
  HOST.cross_entropy_forward(V(a->loss), V(a->lse_out), V(a->logits), V(a->targets), a->n, a->vocab,
                             V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_cross_entropy_forward(double *loss, float *lse, const float *logits, const int32_t *targets,
                                     int n, int vocab, void *scratch, size_t scratch_bytes,
                                     struct rf_device_stream *stream) {
  struct ck_ce a = {.h = ck_head(stream, "cross_entropy_forward"),
                    .loss = loss,
                    .lse_out = lse,
                    .logits = logits,
                    .targets = targets,
                    .n = n,
                    .vocab = vocab,
                    .scratch = scratch,
                    .scratch_bytes = scratch_bytes};
  LAUNCH("cross_entropy_forward", run_cross_entropy_forward, a);
}

static void run_cross_entropy_backward(void *arg) {
  struct ck_ce *a = arg;
  ck_enter(&a->h);
  HOST.cross_entropy_backward(V(a->logits_io), V(a->lse), V(a->targets), a->n, a->vocab, a->scale, NULL);
}

static void ck_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                      int vocab, float scale, struct rf_device_stream *stream) {
  struct ck_ce a = {.h = ck_head(stream, "cross_entropy_backward"),
                    .logits_io = logits,
                    .lse = lse,
                    .targets = targets,
                    .n = n,
                    .vocab = vocab,
                    .scale = scale};
  LAUNCH("cross_entropy_backward", run_cross_entropy_backward, a);
}

/* ---- router ---- */

struct ck_router {
  struct ck_head h;
  float *probs_out, *topw_out, *dlogits;
  int32_t *top_out;
  const float *logits, *dtopw, *probs, *topw, *dprobs_extra;
  const int32_t *top;
  int n, n_experts, k, renorm;
};

static void run_router_forward(void *arg) {
  struct ck_router *a = arg;
  ck_enter(&a->h);
  HOST.router_forward(V(a->probs_out), V(a->top_out), V(a->topw_out), V(a->logits), a->n, a->n_experts, a->k,
                      a->renorm, NULL);
}

static void ck_router_forward(float *probs, int32_t *top, float *topw, const float *logits, int n,
                              int n_experts, int k, int renorm, struct rf_device_stream *stream) {
  struct ck_router a = {.h = ck_head(stream, "router_forward"),
                        .probs_out = probs,
                        .top_out = top,
                        .topw_out = topw,
                        .logits = logits,
                        .n = n,
                        .n_experts = n_experts,
                        .k = k,
                        .renorm = renorm};
  LAUNCH("router_forward", run_router_forward, a);
}

static void run_router_backward(void *arg) {
  struct ck_router *a = arg;
  ck_enter(&a->h);
  HOST.router_backward(V(a->dlogits), V(a->dtopw), V(a->probs), V(a->top), V(a->topw), V(a->dprobs_extra),
                       a->n, a->n_experts, a->k, a->renorm, NULL);
}

static void ck_router_backward(float *dlogits, const float *dtopw, const float *probs, const int32_t *top,
                               const float *topw, const float *dprobs_extra, int n, int n_experts, int k,
                               int renorm, struct rf_device_stream *stream) {
  struct ck_router a = {.h = ck_head(stream, "router_backward"),
                        .dlogits = dlogits,
                        .dtopw = dtopw,
                        .probs = probs,
                        .top = top,
                        .topw = topw,
                        .dprobs_extra = dprobs_extra,
                        .n = n,
                        .n_experts = n_experts,
                        .k = k,
                        .renorm = renorm};
  LAUNCH("router_backward", run_router_backward, a);
}

/* ---- linear layers ---- */

struct ck_linear {
  struct ck_head h;
  float *y, *dx, *dw;
  const float *x, *dy;
  struct rf_model_weight w;
  struct rf_model_stage st;
  int has_stage;
  int n, in, out;
  float beta;
};

static void run_linear_forward(void *arg) {
  struct ck_linear *a = arg;
  ck_enter(&a->h);
  struct rf_model_weight w = ck_weight(a->h.s, &a->w);
  struct rf_model_stage st = {0};
  if (a->has_stage) st = ck_stage(a->h.s, &a->st);
  HOST.linear_forward(V(a->y), V(a->x), &w, a->n, a->in, a->out, a->beta, a->has_stage ? &st : NULL, NULL);
}

static void ck_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                              int out, float beta, const struct rf_model_stage *st,
                              struct rf_device_stream *stream) {
  struct ck_linear a = {.h = ck_head(stream, "linear_forward"),
                        .y = y,
                        .x = x,
                        .w = *w,
                        .has_stage = st != NULL,
                        .n = n,
                        .in = in,
                        .out = out,
                        .beta = beta};
  if (st) a.st = *st;
  LAUNCH("linear_forward", run_linear_forward, a);
}

static void run_linear_backward(void *arg) {
  struct ck_linear *a = arg;
  ck_enter(&a->h);
  struct rf_model_weight w = ck_weight(a->h.s, &a->w);
  struct rf_model_stage st = {0};
  if (a->has_stage) st = ck_stage(a->h.s, &a->st);
  HOST.linear_backward(V(a->dx), V(a->dw), V(a->dy), V(a->x), &w, a->n, a->in, a->out, a->beta,
                       a->has_stage ? &st : NULL, NULL);
}

static void ck_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                               const struct rf_model_weight *w, int n, int in, int out, float beta,
                               const struct rf_model_stage *st, struct rf_device_stream *stream) {
  struct ck_linear a = {.h = ck_head(stream, "linear_backward"),
                        .dx = dx,
                        .dw = dw,
                        .dy = dy,
                        .x = x,
                        .w = *w,
                        .has_stage = st != NULL,
                        .n = n,
                        .in = in,
                        .out = out,
                        .beta = beta};
  if (st) a.st = *st;
  LAUNCH("linear_backward", run_linear_backward, a);
}

/* ---- MoE token movement ---- */

struct ck_moe {
  struct ck_head h;
  double *count, *psum;
  int32_t *off_out, *tok_out, *pos_out;
  float *xg, *out, *dtopw, *dyg_out, *dxn;
  const int32_t *top, *pos, *tok, *off;
  const float *probs, *xn, *ey, *topw, *dout, *dyg;
  int n, n_experts, k, hidden, rows, cap;
};

static void run_moe_stats(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_stats(V(a->count), V(a->psum), V(a->top), V(a->probs), a->n, a->n_experts, a->k, NULL);
}

static void ck_moe_stats(double *count, double *psum, const int32_t *top, const float *probs, int n,
                         int n_experts, int k, struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_stats"),
                     .count = count,
                     .psum = psum,
                     .top = top,
                     .probs = probs,
                     .n = n,
                     .n_experts = n_experts,
                     .k = k};
  LAUNCH("moe_stats", run_moe_stats, a);
}

static void run_moe_group(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_group(V(a->off_out), V(a->tok_out), V(a->pos_out), V(a->xg), V(a->top), V(a->xn), a->n,
                 a->n_experts, a->k, a->hidden, a->rows, a->cap, NULL);
}

static void ck_moe_group(int32_t *off, int32_t *tok, int32_t *pos, float *xg, const int32_t *top,
                         const float *xn, int n, int n_experts, int k, int hidden, int rows, int cap,
                         struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_group"),
                     .off_out = off,
                     .tok_out = tok,
                     .pos_out = pos,
                     .xg = xg,
                     .top = top,
                     .xn = xn,
                     .n = n,
                     .n_experts = n_experts,
                     .k = k,
                     .hidden = hidden,
                     .rows = rows,
                     .cap = cap};
  LAUNCH("moe_group", run_moe_group, a);
}

static void run_moe_combine(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_combine(V(a->out), V(a->ey), V(a->pos), V(a->topw), a->n, a->k, a->hidden, NULL);
}

static void ck_moe_combine(float *out, const float *ey, const int32_t *pos, const float *topw, int n, int k,
                           int hidden, struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_combine"),
                     .out = out,
                     .ey = ey,
                     .pos = pos,
                     .topw = topw,
                     .n = n,
                     .k = k,
                     .hidden = hidden};
  LAUNCH("moe_combine", run_moe_combine, a);
}

static void run_moe_combine_weights_backward(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_combine_weights_backward(V(a->dtopw), V(a->dout), V(a->ey), V(a->pos), a->n, a->k, a->hidden,
                                    NULL);
}

static void ck_moe_combine_weights_backward(float *dtopw, const float *dout, const float *ey,
                                            const int32_t *pos, int n, int k, int hidden,
                                            struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_combine_weights_backward"),
                     .dtopw = dtopw,
                     .dout = dout,
                     .ey = ey,
                     .pos = pos,
                     .n = n,
                     .k = k,
                     .hidden = hidden};
  LAUNCH("moe_combine_weights_backward", run_moe_combine_weights_backward, a);
}

static void run_moe_scatter(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_scatter(V(a->dyg_out), V(a->dout), V(a->pos), V(a->tok), V(a->off), V(a->topw), a->n, a->n_experts,
                   a->k, a->hidden, NULL);
}

static void ck_moe_scatter(float *dyg, const float *dout, const int32_t *pos, const int32_t *tok,
                           const int32_t *off, const float *topw, int n, int n_experts, int k, int hidden,
                           struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_scatter"),
                     .dyg_out = dyg,
                     .dout = dout,
                     .pos = pos,
                     .tok = tok,
                     .off = off,
                     .topw = topw,
                     .n = n,
                     .n_experts = n_experts,
                     .k = k,
                     .hidden = hidden};
  LAUNCH("moe_scatter", run_moe_scatter, a);
}

static void run_moe_gather(void *arg) {
  struct ck_moe *a = arg;
  ck_enter(&a->h);
  HOST.moe_gather(V(a->dxn), V(a->dyg), V(a->pos), a->n, a->k, a->hidden, NULL);
}

static void ck_moe_gather(float *dxn, const float *dyg, const int32_t *pos, int n, int k, int hidden,
                          struct rf_device_stream *stream) {
  struct ck_moe a = {.h = ck_head(stream, "moe_gather"),
                     .dxn = dxn,
                     .dyg = dyg,
                     .pos = pos,
                     .n = n,
                     .k = k,
                     .hidden = hidden};
  LAUNCH("moe_gather", run_moe_gather, a);
}

/* ---- GPT-OSS: attention with sinks, the clamped SwiGLU, the transposes ---- */

struct ck_sink {
  struct ck_head h;
  float *y, *lse_out, *dq, *dk, *dv, *dsinks;
  const float *dy, *yf, *lse, *q, *k, *v, *sinks;
  int window, batch, seq, nh, nkv, hd;
  void *scratch;
  size_t scratch_bytes;
};

static void run_attention_sink_forward(void *arg) {
  struct ck_sink *a = arg;
  ck_enter(&a->h);
  HOST.attention_sink_forward(V(a->y), V(a->lse_out), V(a->q), V(a->k), V(a->v), V(a->sinks), a->window,
                              a->batch, a->seq, a->nh, a->nkv, a->hd, V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                      const float *sinks, int window, int batch, int seq, int nh, int nkv,
                                      int hd, void *scratch, size_t scratch_bytes,
                                      struct rf_device_stream *stream) {
  struct ck_sink a = {.h = ck_head(stream, "attention_sink_forward"),
                      .y = y,
                      .lse_out = lse,
                      .q = q,
                      .k = k,
                      .v = v,
                      .sinks = sinks,
                      .window = window,
                      .batch = batch,
                      .seq = seq,
                      .nh = nh,
                      .nkv = nkv,
                      .hd = hd,
                      .scratch = scratch,
                      .scratch_bytes = scratch_bytes};
  LAUNCH("attention_sink_forward", run_attention_sink_forward, a);
}

static void run_attention_sink_backward(void *arg) {
  struct ck_sink *a = arg;
  ck_enter(&a->h);
  HOST.attention_sink_backward(V(a->dq), V(a->dk), V(a->dv), V(a->dsinks), V(a->dy), V(a->yf), V(a->lse),
                               V(a->q), V(a->k), V(a->v), V(a->sinks), a->window, a->batch, a->seq, a->nh,
                               a->nkv, a->hd, V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                       const float *y, const float *lse, const float *q, const float *k,
                                       const float *v, const float *sinks, int window, int batch, int seq,
                                       int nh, int nkv, int hd, void *scratch, size_t scratch_bytes,
                                       struct rf_device_stream *stream) {
  struct ck_sink a = {.h = ck_head(stream, "attention_sink_backward"),
                      .dq = dq,
                      .dk = dk,
                      .dv = dv,
                      .dsinks = dsinks,
                      .dy = dy,
                      .yf = y,
                      .lse = lse,
                      .q = q,
                      .k = k,
                      .v = v,
                      .sinks = sinks,
                      .window = window,
                      .batch = batch,
                      .seq = seq,
                      .nh = nh,
                      .nkv = nkv,
                      .hd = hd,
                      .scratch = scratch,
                      .scratch_bytes = scratch_bytes};
  LAUNCH("attention_sink_backward", run_attention_sink_backward, a);
}

struct ck_clamp {
  struct ck_head h;
  float *out;
  const float *dh, *gu;
  size_t n;
  float alpha, limit;
};

static void run_swiglu_clamp_forward(void *arg) {
  struct ck_clamp *a = arg;
  ck_enter(&a->h);
  HOST.swiglu_clamp_forward(V(a->out), V(a->gu), a->n, a->alpha, a->limit, NULL);
}

static void ck_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit,
                                    struct rf_device_stream *stream) {
  struct ck_clamp a = {.h = ck_head(stream, "swiglu_clamp_forward"),
                       .out = h,
                       .gu = gu,
                       .n = n,
                       .alpha = alpha,
                       .limit = limit};
  LAUNCH("swiglu_clamp_forward", run_swiglu_clamp_forward, a);
}

static void run_swiglu_clamp_backward(void *arg) {
  struct ck_clamp *a = arg;
  ck_enter(&a->h);
  HOST.swiglu_clamp_backward(V(a->out), V(a->dh), V(a->gu), a->n, a->alpha, a->limit, NULL);
}

static void ck_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n, float alpha,
                                     float limit, struct rf_device_stream *stream) {
  struct ck_clamp a = {.h = ck_head(stream, "swiglu_clamp_backward"),
                       .out = dgu,
                       .dh = dh,
                       .gu = gu,
                       .n = n,
                       .alpha = alpha,
                       .limit = limit};
  LAUNCH("swiglu_clamp_backward", run_swiglu_clamp_backward, a);
}

struct ck_transpose {
  struct ck_head h;
  float *dst;
  const float *src;
  struct rf_model_weight w;
  int rows, cols;
};

static void run_weight_transpose(void *arg) {
  struct ck_transpose *a = arg;
  ck_enter(&a->h);
  struct rf_model_weight w = ck_weight(a->h.s, &a->w);
  HOST.weight_transpose(V(a->dst), &w, a->rows, a->cols, NULL);
}

static void ck_weight_transpose(float *dst, const struct rf_model_weight *w, int rows, int cols,
                                struct rf_device_stream *stream) {
  struct ck_transpose a = {
      .h = ck_head(stream, "weight_transpose"), .dst = dst, .w = *w, .rows = rows, .cols = cols};
  LAUNCH("weight_transpose", run_weight_transpose, a);
}

static void run_transpose_add(void *arg) {
  struct ck_transpose *a = arg;
  ck_enter(&a->h);
  HOST.transpose_add(V(a->dst), V(a->src), a->rows, a->cols, NULL);
}

static void ck_transpose_add(float *dst, const float *src, int rows, int cols,
                             struct rf_device_stream *stream) {
  struct ck_transpose a = {
      .h = ck_head(stream, "transpose_add"), .dst = dst, .src = src, .rows = rows, .cols = cols};
  LAUNCH("transpose_add", run_transpose_add, a);
}

/* ---- DeepSeek-V3: multi-head latent attention ---- */

struct ck_mla {
  struct ck_head h;
  float *y, *lse_out, *dq, *dk, *dv;
  const float *dy, *yf, *lse, *q, *k, *v;
  int batch, seq, nh, nkv, hd, vd;
  float scale;
  void *scratch;
  size_t scratch_bytes;
};

static void run_mla_attention_forward(void *arg) {
  struct ck_mla *a = arg;
  ck_enter(&a->h);
  HOST.mla_attention_forward(V(a->y), V(a->lse_out), V(a->q), V(a->k), V(a->v), a->batch, a->seq, a->nh,
                             a->nkv, a->hd, a->vd, a->scale, V(a->scratch), a->scratch_bytes, NULL);
}

static void ck_mla_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                     int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                     void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  struct ck_mla a = {.h = ck_head(stream, "mla_attention_forward"),
                     .y = y,
                     .lse_out = lse,
                     .q = q,
                     .k = k,
                     .v = v,
                     .batch = batch,
                     .seq = seq,
                     .nh = nh,
                     .nkv = nkv,
                     .hd = hd,
                     .vd = dv,
                     .scale = scale,
                     .scratch = scratch,
                     .scratch_bytes = scratch_bytes};
  LAUNCH("mla_attention_forward", run_mla_attention_forward, a);
}

static void run_mla_attention_backward(void *arg) {
  struct ck_mla *a = arg;
  ck_enter(&a->h);
  HOST.mla_attention_backward(V(a->dq), V(a->dk), V(a->dv), V(a->dy), V(a->yf), V(a->lse), V(a->q), V(a->k),
                              V(a->v), a->batch, a->seq, a->nh, a->nkv, a->hd, a->vd, a->scale, V(a->scratch),
                              a->scratch_bytes, NULL);
}

static void ck_mla_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *y,
                                      const float *lse, const float *q, const float *k, const float *v,
                                      int batch, int seq, int nh, int nkv, int hd, int vd, float scale,
                                      void *scratch, size_t scratch_bytes, struct rf_device_stream *stream) {
  struct ck_mla a = {.h = ck_head(stream, "mla_attention_backward"),
                     .dq = dq,
                     .dk = dk,
                     .dv = dv,
                     .dy = dy,
                     .yf = y,
                     .lse = lse,
                     .q = q,
                     .k = k,
                     .v = v,
                     .batch = batch,
                     .seq = seq,
                     .nh = nh,
                     .nkv = nkv,
                     .hd = hd,
                     .vd = vd,
                     .scale = scale,
                     .scratch = scratch,
                     .scratch_bytes = scratch_bytes};
  LAUNCH("mla_attention_backward", run_mla_attention_backward, a);
}

struct ck_mla_rope {
  struct ck_head h;
  float *x;
  const float *cos_t, *sin_t;
  int batch, seq, n_heads, stride, off, rd, interleave, inverse;
};

static void run_mla_rope_apply(void *arg) {
  struct ck_mla_rope *a = arg;
  ck_enter(&a->h);
  HOST.mla_rope_apply(V(a->x), a->batch, a->seq, a->n_heads, a->stride, a->off, a->rd, V(a->cos_t),
                      V(a->sin_t), a->interleave, a->inverse, NULL);
}

static void ck_mla_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                              const float *cos_t, const float *sin_t, int interleave, int inverse,
                              struct rf_device_stream *stream) {
  struct ck_mla_rope a = {ck_head(stream, "mla_rope_apply"),
                          x,
                          cos_t,
                          sin_t,
                          batch,
                          seq,
                          n_heads,
                          stride,
                          off,
                          rd,
                          interleave,
                          inverse};
  LAUNCH("mla_rope_apply", run_mla_rope_apply, a);
}

struct ck_mla_kv {
  struct ck_head h;
  float *a0, *a1;       /* k, v (forward); dkvb, dkpe (backward) */
  const float *b0, *b1; /* kvb, kpe (forward); dk, dv (backward) */
  int n, nh, nope, rope, dv;
};

static void run_mla_kv_expand(void *arg) {
  struct ck_mla_kv *a = arg;
  ck_enter(&a->h);
  HOST.mla_kv_expand(V(a->a0), V(a->a1), V(a->b0), V(a->b1), a->n, a->nh, a->nope, a->rope, a->dv, NULL);
}

static void ck_mla_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh, int nope,
                             int rope, int dv, struct rf_device_stream *stream) {
  struct ck_mla_kv a = {ck_head(stream, "mla_kv_expand"), k, v, kvb, kpe, n, nh, nope, rope, dv};
  LAUNCH("mla_kv_expand", run_mla_kv_expand, a);
}

static void run_mla_kv_expand_backward(void *arg) {
  struct ck_mla_kv *a = arg;
  ck_enter(&a->h);
  HOST.mla_kv_expand_backward(V(a->a0), V(a->a1), V(a->b0), V(a->b1), a->n, a->nh, a->nope, a->rope, a->dv,
                              NULL);
}

static void ck_mla_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n,
                                      int nh, int nope, int rope, int vd, struct rf_device_stream *stream) {
  struct ck_mla_kv a = {ck_head(stream, "mla_kv_expand_backward"), dkvb, dkpe, dk, dv, n, nh, nope, rope, vd};
  LAUNCH("mla_kv_expand_backward", run_mla_kv_expand_backward, a);
}

/* ---- DeepSeek-V3's router ---- */

struct ck_router_group {
  struct ck_head h;
  float *scores_out, *topw_out, *dlogits;
  int32_t *top_out;
  const float *logits, *bias, *dtopw, *scores, *topw;
  const int32_t *top;
  void *scratch;
  size_t scratch_bytes;
  int n, n_experts, n_group, topk_group, k, renorm;
  float scale;
};

static void run_router_group_forward(void *arg) {
  struct ck_router_group *a = arg;
  ck_enter(&a->h);
  HOST.router_group_forward(V(a->scores_out), V(a->top_out), V(a->topw_out), V(a->logits), V(a->bias), a->n,
                            a->n_experts, a->n_group, a->topk_group, a->k, a->renorm, a->scale, V(a->scratch),
                            a->scratch_bytes, NULL);
}

static void ck_router_group_forward(float *scores, int32_t *top, float *topw, const float *logits,
                                    const float *bias, int n, int n_experts, int n_group, int topk_group,
                                    int k, int renorm, float scale, void *scratch, size_t scratch_bytes,
                                    struct rf_device_stream *stream) {
  struct ck_router_group a = {.h = ck_head(stream, "router_group_forward"),
                              .scores_out = scores,
                              .top_out = top,
                              .topw_out = topw,
                              .logits = logits,
                              .bias = bias,
                              .scratch = scratch,
                              .scratch_bytes = scratch_bytes,
                              .n = n,
                              .n_experts = n_experts,
                              .n_group = n_group,
                              .topk_group = topk_group,
                              .k = k,
                              .renorm = renorm,
                              .scale = scale};
  LAUNCH("router_group_forward", run_router_group_forward, a);
}

static void run_router_group_backward(void *arg) {
  struct ck_router_group *a = arg;
  ck_enter(&a->h);
  HOST.router_group_backward(V(a->dlogits), V(a->dtopw), V(a->scores), V(a->top), V(a->topw), a->n,
                             a->n_experts, a->k, a->renorm, a->scale, NULL);
}

static void ck_router_group_backward(float *dlogits, const float *dtopw, const float *scores,
                                     const int32_t *top, const float *topw, int n, int n_experts, int k,
                                     int renorm, float scale, struct rf_device_stream *stream) {
  struct ck_router_group a = {.h = ck_head(stream, "router_group_backward"),
                              .dlogits = dlogits,
                              .dtopw = dtopw,
                              .scores = scores,
                              .top = top,
                              .topw = topw,
                              .n = n,
                              .n_experts = n_experts,
                              .k = k,
                              .renorm = renorm,
                              .scale = scale};
  LAUNCH("router_group_backward", run_router_group_backward, a);
}

const struct rf_model_kernels rf_model_kernels_checked = {
    .name = "checked",
    .host_memory = 0,
    .scratch_bytes = ck_scratch_bytes,
    .embedding_forward = ck_embedding_forward,
    .embedding_backward = ck_embedding_backward,
    .rmsnorm_forward = ck_rmsnorm_forward,
    .rmsnorm_backward = ck_rmsnorm_backward,
    .rope_apply = ck_rope_apply,
    .attention_forward = ck_attention_forward,
    .attention_backward = ck_attention_backward,
    .swiglu_forward = ck_swiglu_forward,
    .swiglu_backward = ck_swiglu_backward,
    .bias_forward = ck_bias_forward,
    .bias_backward = ck_bias_backward,
    .cross_entropy_forward = ck_cross_entropy_forward,
    .cross_entropy_backward = ck_cross_entropy_backward,
    .router_forward = ck_router_forward,
    .router_backward = ck_router_backward,
    .linear_forward = ck_linear_forward,
    .linear_backward = ck_linear_backward,
    .rmsnorm_apply = ck_rmsnorm_apply,
    .moe_stats = ck_moe_stats,
    .moe_group = ck_moe_group,
    .moe_combine = ck_moe_combine,
    .moe_combine_weights_backward = ck_moe_combine_weights_backward,
    .moe_scatter = ck_moe_scatter,
    .moe_gather = ck_moe_gather,
    .attention_sink_forward = ck_attention_sink_forward,
    .attention_sink_backward = ck_attention_sink_backward,
    .swiglu_clamp_forward = ck_swiglu_clamp_forward,
    .swiglu_clamp_backward = ck_swiglu_clamp_backward,
    .weight_transpose = ck_weight_transpose,
    .transpose_add = ck_transpose_add,
    .mla_attention_forward = ck_mla_attention_forward,
    .mla_attention_backward = ck_mla_attention_backward,
    .mla_rope_apply = ck_mla_rope_apply,
    .mla_kv_expand = ck_mla_kv_expand,
    .mla_kv_expand_backward = ck_mla_kv_expand_backward,
    .router_group_forward = ck_router_group_forward,
    .router_group_backward = ck_router_group_backward,
};
