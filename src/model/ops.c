/* The model's operations: RMSNorm, rotary embedding, causal GQA attention,
 * SwiGLU, linear layers (sgemm / sbgemm), cross-entropy, embedding. Each has a
 * forward and a backward; tests/test_model_ops.c checks every backward against
 * finite differences. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "model/model.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows of elementwise work per OpenMP chunk are large enough that a parallel
 * region is worth starting only beyond this many elements. */
#define RF_LLAMA_PAR_MIN 32768

/* ---- RMSNorm -------------------------------------------------------------------- */

void rf_llama_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                              float eps) {
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_LLAMA_PAR_MIN)
  for (int n = 0; n < n_rows; n++) {
    const float *xr = x + (size_t)n * dim;
    float *o = out + (size_t)n * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    rstd[n] = r;
    for (int i = 0; i < dim; i++) o[i] = xr[i] * r * w[i];
  }
}

/* out = x * r * w with r = (mean(x^2) + eps)^(-1/2):
 *   dw += dout * x * r
 *   dx += r * (w * dout) - x * r^3 / dim * sum(w * dout * x) */
void rf_llama_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                               const float *w, int n_rows, int dim) {
  if (dw) {
    /* Column sums: parallel over columns so each thread owns its dw entries. */
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_LLAMA_PAR_MIN)
    for (int i0 = 0; i0 < dim; i0 += 64) {
      int i1 = i0 + 64 < dim ? i0 + 64 : dim;
      float acc[64];
      for (int i = i0; i < i1; i++) acc[i - i0] = 0.0f;
      for (int n = 0; n < n_rows; n++) {
        const float *xr = x + (size_t)n * dim;
        const float *g = dout + (size_t)n * dim;
        float r = rstd[n];
        for (int i = i0; i < i1; i++) acc[i - i0] += g[i] * xr[i] * r;
      }
      for (int i = i0; i < i1; i++) dw[i] += acc[i - i0];
    }
  }
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_LLAMA_PAR_MIN)
    for (int n = 0; n < n_rows; n++) {
      const float *xr = x + (size_t)n * dim;
      const float *g = dout + (size_t)n * dim;
      float *d = dx + (size_t)n * dim;
      float r = rstd[n];
      float dot = 0.0f;
      for (int i = 0; i < dim; i++) dot += w[i] * g[i] * xr[i];
      float c = dot * r * r * r / (float)dim;
      for (int i = 0; i < dim; i++) d[i] += r * w[i] * g[i] - xr[i] * c;
    }
  }
}

/* ---- rotary embedding -------------------------------------------------------------- */

void rf_llama_rope_tables(float *cos_t, float *sin_t, int seq, int hd, double theta) {
  int half = hd / 2;
  for (int t = 0; t < seq; t++) {
    for (int i = 0; i < half; i++) {
      double inv_freq = pow(theta, -2.0 * i / (double)hd);
      double a = (double)t * inv_freq;
      cos_t[(size_t)t * half + i] = (float)cos(a);
      sin_t[(size_t)t * half + i] = (float)sin(a);
    }
  }
}

/* HF: out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[h:], x[:h]):
 *   out[i]   = x[i] c - x[i+h] s,   out[i+h] = x[i+h] c + x[i] s   (i < h = hd/2).
 * The inverse (transpose) uses -s. */
void rf_llama_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                         const float *sin_t, int inverse) {
  int half = hd / 2;
  int width = n_heads * hd;
  long rows = (long)batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= RF_LLAMA_PAR_MIN)
  for (long n = 0; n < rows; n++) {
    int t = (int)(n % seq);
    const float *c = cos_t + (size_t)t * half;
    const float *s = sin_t + (size_t)t * half;
    float sign = inverse ? -1.0f : 1.0f;
    for (int h = 0; h < n_heads; h++) {
      float *p = x + (size_t)n * width + (size_t)h * hd;
      for (int i = 0; i < half; i++) {
        float a = p[i], b = p[i + half];
        float si = sign * s[i];
        p[i] = a * c[i] - b * si;
        p[i + half] = b * c[i] + a * si;
      }
    }
  }
}

/* ---- attention --------------------------------------------------------------------- */

/* OpenMP over (batch, kv head) only when BLAS runs single-threaded: a threaded
 * BLAS called from several threads at once would oversubscribe the cores. */
static int attention_threads(void) {
#ifdef _OPENMP
  if (openblas_get_num_threads() == 1) return omp_get_max_threads();
#endif
  return 1;
}

void rf_llama_attention_forward(float *y, float *probs, const float *q, const float *k, const float *v,
                                int batch, int seq, int nh, int nkv, int hd) {
  int qs = nh * hd, ks = nkv * hd, rep = nh / nkv;
  float scale = 1.0f / sqrtf((float)hd);
  int n_jobs = batch * nh;
  int nt = attention_threads();
  (void)nt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && n_jobs > 1)
  for (int job = 0; job < n_jobs; job++) {
    int b = job / nh, h = job % nh, g = h / rep;
    const float *qb = q + (size_t)b * seq * qs + (size_t)h * hd;
    const float *kb = k + (size_t)b * seq * ks + (size_t)g * hd;
    const float *vb = v + (size_t)b * seq * ks + (size_t)g * hd;
    float *p = probs + ((size_t)b * nh + h) * seq * seq;
    float *yb = y + (size_t)b * seq * qs + (size_t)h * hd;
    /* S = scale * Q K^T over the whole square; the causal mask drops the upper part. */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, hd, scale, qb, qs, kb, ks, 0.0f, p, seq);
    for (int i = 0; i < seq; i++) {
      float *row = p + (size_t)i * seq;
      float mx = row[0];
      for (int j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
      float sum = 0.0f;
      for (int j = 0; j <= i; j++) {
        row[j] = expf(row[j] - mx);
        sum += row[j];
      }
      float inv = 1.0f / sum;
      for (int j = 0; j <= i; j++) row[j] *= inv;
      for (int j = i + 1; j < seq; j++) row[j] = 0.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, hd, seq, 1.0f, p, seq, vb, ks, 0.0f, yb, qs);
  }
}

/* Per head: dP = dY V^T; dV += P^T dY; dS = P * (dP - rowsum(P * dP)) * scale;
 * dQ = dS K; dK += dS^T Q. Jobs are (batch, kv head) so the heads sharing a kv
 * head accumulate into dK, dV in one thread. */
void rf_llama_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *probs,
                                 const float *q, const float *k, const float *v, int batch, int seq, int nh,
                                 int nkv, int hd, float *scratch, int n_scratch) {
  int qs = nh * hd, ks = nkv * hd, rep = nh / nkv;
  float scale = 1.0f / sqrtf((float)hd);
  int n_jobs = batch * nkv;
  int nt = attention_threads();
  if (nt > n_scratch) nt = n_scratch;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && n_jobs > 1)
  for (int job = 0; job < n_jobs; job++) {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *dp = scratch + (size_t)tid * seq * seq;
    int b = job / nkv, g = job % nkv;
    const float *kb = k + (size_t)b * seq * ks + (size_t)g * hd;
    const float *vb = v + (size_t)b * seq * ks + (size_t)g * hd;
    float *dkb = dk + (size_t)b * seq * ks + (size_t)g * hd;
    float *dvb = dv + (size_t)b * seq * ks + (size_t)g * hd;
    for (int r = 0; r < rep; r++) {
      int h = g * rep + r;
      float beta = r == 0 ? 0.0f : 1.0f;
      const float *qb = q + (size_t)b * seq * qs + (size_t)h * hd;
      const float *dyb = dy + (size_t)b * seq * qs + (size_t)h * hd;
      float *dqb = dq + (size_t)b * seq * qs + (size_t)h * hd;
      const float *p = probs + ((size_t)b * nh + h) * seq * seq;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, seq, seq, hd, 1.0f, dyb, qs, vb, ks, 0.0f, dp,
                  seq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, hd, seq, 1.0f, p, seq, dyb, qs, beta, dvb,
                  ks);
      for (int i = 0; i < seq; i++) {
        const float *pr = p + (size_t)i * seq;
        float *d = dp + (size_t)i * seq;
        float dot = 0.0f;
        for (int j = 0; j <= i; j++) dot += pr[j] * d[j];
        for (int j = 0; j <= i; j++) d[j] = pr[j] * (d[j] - dot) * scale;
        for (int j = i + 1; j < seq; j++) d[j] = 0.0f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, seq, hd, seq, 1.0f, dp, seq, kb, ks, 0.0f, dqb,
                  qs);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, seq, hd, seq, 1.0f, dp, seq, qb, qs, beta, dkb,
                  ks);
    }
  }
}

/* ---- SwiGLU --------------------------------------------------------------------------- */

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }

void rf_llama_swiglu_forward(float *h, const float *gate, const float *up, size_t n) {
#pragma omp parallel for schedule(static) if (n >= RF_LLAMA_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i];
    h[i] = g * sigmoidf_(g) * up[i];
  }
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). dup may alias dh. */
void rf_llama_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                              size_t n) {
#pragma omp parallel for schedule(static) if (n >= RF_LLAMA_PAR_MIN)
  for (size_t i = 0; i < n; i++) {
    float g = gate[i], d = dh[i];
    float s = sigmoidf_(g);
    float silu = g * s;
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = d * silu;
  }
}

/* ---- linear ------------------------------------------------------------------------------ */

static void to_bf16(uint16_t *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n >= RF_LLAMA_PAR_MIN)
  for (size_t i = 0; i < n; i++) dst[i] = rf_bf16_from_f32(src[i]);
}

/* OpenBLAS has cblas_sbgemm only when built with BUILD_BFLOAT16 (Debian's is
 * not): a weak reference, NULL when the library lacks it. Without it, bf16 weights
 * are widened to f32 RF_LLAMA_STAGE_ROWS rows at a time and multiplied by sgemm
 * (f32 activations, so the result is at least as accurate). */
#pragma weak cblas_sbgemm

int rf_llama_have_sbgemm(void) { return cblas_sbgemm != NULL; }

void rf_llama_linear_forward(float *y, const float *x, const struct rf_llama_weight *w, int n, int in,
                             int out, float beta, const struct rf_llama_stage *st) {
  if (w->f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w->f32, in, beta, y, out);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  if (rf_llama_have_sbgemm()) {
    to_bf16(st->act, x, (size_t)n * in);
    cblas_sbgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, st->act, in, w->bf16, in, beta, y,
                 out);
    return;
  }
  for (int r0 = 0; r0 < out; r0 += RF_LLAMA_STAGE_ROWS) {
    int rows = out - r0 < RF_LLAMA_STAGE_ROWS ? out - r0 : RF_LLAMA_STAGE_ROWS;
    rf_f32_from_bf16_n(st->wf32, w->bf16 + (size_t)r0 * in, (size_t)rows * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, in, 1.0f, x, in, st->wf32, in, beta, y + r0,
                out);
  }
}

void rf_llama_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                              const struct rf_llama_weight *w, int n, int in, int out, float beta,
                              const struct rf_llama_stage *st) {
  if (dw)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (!dx) return;
  if (w->f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w->f32, in, beta, dx,
                in);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  if (rf_llama_have_sbgemm()) {
    to_bf16(st->act, dy, (size_t)n * out);
    cblas_sbgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, st->act, out, w->bf16, in, beta,
                 dx, in);
    return;
  }
  /* dx = sum over row blocks of W: dy[:, block] W[block, :] */
  for (int r0 = 0; r0 < out; r0 += RF_LLAMA_STAGE_ROWS) {
    int rows = out - r0 < RF_LLAMA_STAGE_ROWS ? out - r0 : RF_LLAMA_STAGE_ROWS;
    rf_f32_from_bf16_n(st->wf32, w->bf16 + (size_t)r0 * in, (size_t)rows * in);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, rows, 1.0f, dy + r0, out, st->wf32, in,
                r0 == 0 ? beta : 1.0f, dx, in);
  }
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

double rf_llama_cross_entropy_forward(float *lse, const float *logits, const int32_t *targets, int n,
                                      int vocab) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if ((long)n * vocab >= RF_LLAMA_PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * vocab;
    float mx = z[0];
    for (int j = 1; j < vocab; j++) mx = z[j] > mx ? z[j] : mx;
    double sum = 0.0;
    for (int j = 0; j < vocab; j++) sum += exp((double)(z[j] - mx));
    double l = (double)mx + log(sum);
    lse[r] = (float)l;
    if (targets && targets[r] >= 0) total += l - (double)z[targets[r]];
  }
  return total;
}

void rf_llama_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                     int vocab, float scale) {
#pragma omp parallel for schedule(static) if ((long)n * vocab >= RF_LLAMA_PAR_MIN)
  for (int r = 0; r < n; r++) {
    float *z = logits + (size_t)r * vocab;
    int t = targets[r];
    if (t < 0) {
      memset(z, 0, sizeof(float) * (size_t)vocab);
      continue;
    }
    float m = lse[r];
    for (int j = 0; j < vocab; j++) z[j] = expf(z[j] - m) * scale;
    z[t] -= scale;
  }
}

/* ---- embedding ------------------------------------------------------------------------------ */

void rf_llama_embedding_forward(float *out, const struct rf_llama_weight *table, const int32_t *tokens, int n,
                                int dim) {
  for (int r = 0; r < n; r++) {
    float *o = out + (size_t)r * dim;
    size_t off = (size_t)tokens[r] * dim;
    if (table->f32)
      memcpy(o, table->f32 + off, sizeof(float) * (size_t)dim);
    else
      rf_f32_from_bf16_n(o, table->bf16 + off, (size_t)dim);
  }
}

void rf_llama_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
  for (int r = 0; r < n; r++) {
    float *d = dtable + (size_t)tokens[r] * dim;
    const float *g = dout + (size_t)r * dim;
    for (int i = 0; i < dim; i++) d[i] += g[i];
  }
}
