/* The model's operations: RMSNorm, rotary embedding, causal GQA attention,
 * SwiGLU, linear layers (src/gemm: oneDNN, f32 or bf16 operands), cross-entropy, embedding. Each has a
 * forward and a backward; tests/test_model_ops.c checks every backward against
 * finite differences. */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "model/config.h"
#include "model/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows of elementwise work per OpenMP chunk are large enough that a parallel
 * region is worth starting only beyond this many elements. */
#define RF_MODEL_PAR_MIN 32768

/* exp(x) for the softmax and SiLU loops: Cephes' expf (range reduction by ln 2,
 * degree-6 polynomial), branch-free so that `omp simd` loops vectorize; relative
 * error below 2e-7 (tests/test_model_ops.c checks it against exp()). Inputs are
 * clamped to [-87, 88]: exp(-87) = 1.6e-38 stands in for smaller results. A NaN
 * (a diverged run) gives NaN: it is replaced by 0 before the float-to-int conversion
 * (undefined behaviour on NaN) and put back at the end, both as selects. */
static inline float fast_expf(float x) {
  float in = x;
  x = x == x ? x : 0.0f;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  float t = x * 1.44269504088896341f + 12582912.0f; /* round(x / ln 2) in the low mantissa bits */
  float k = t - 12582912.0f;
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  union {
    float f;
    int32_t i;
  } u;
  u.i = ((int32_t)k + 127) << 23;
  return in == in ? p * u.f : in;
}

float rf_model_expf(float x) { return fast_expf(x); }

/* A max reduction in `omp simd`: gcc vectorizes it; clang 14 refuses (and warns,
 * which -Werror turns into an error), so there the loop stays scalar. */
#if defined(__clang__)
#define RF_MODEL_SIMD_MAX
#else
#define RF_MODEL_SIMD_MAX _Pragma("omp simd reduction(max : mx)")
#endif

/* ---- RMSNorm -------------------------------------------------------------------- */

void rf_model_rmsnorm_forward(float *out, float *rstd, const float *x, const float *w, int n_rows, int dim,
                              float eps) {
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_MODEL_PAR_MIN)
  for (int n = 0; n < n_rows; n++) {
    const float *xr = x + (size_t)n * dim;
    float *o = out + (size_t)n * dim;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
    float r = 1.0f / sqrtf(ss / (float)dim + eps);
    rstd[n] = r;
#pragma omp simd
    for (int i = 0; i < dim; i++) o[i] = xr[i] * r * w[i];
  }
}

/* out = x * r * w with r = (mean(x^2) + eps)^(-1/2):
 *   dw += dout * x * r
 *   dx += r * (w * dout) - x * r^3 / dim * sum(w * dout * x) */
void rf_model_rmsnorm_backward(float *dx, float *dw, const float *dout, const float *x, const float *rstd,
                               const float *w, int n_rows, int dim) {
  if (dw) {
    /* Column sums: parallel over columns so each thread owns its dw entries. */
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_MODEL_PAR_MIN)
    for (int i0 = 0; i0 < dim; i0 += 64) {
      int i1 = i0 + 64 < dim ? i0 + 64 : dim;
      float acc[64];
      for (int i = i0; i < i1; i++) acc[i - i0] = 0.0f;
      for (int n = 0; n < n_rows; n++) {
        const float *xr = x + (size_t)n * dim;
        const float *g = dout + (size_t)n * dim;
        float r = rstd[n];
#pragma omp simd
        for (int i = i0; i < i1; i++) acc[i - i0] += g[i] * xr[i] * r;
      }
      for (int i = i0; i < i1; i++) dw[i] += acc[i - i0];
    }
  }
  if (dx) {
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= RF_MODEL_PAR_MIN)
    for (int n = 0; n < n_rows; n++) {
      const float *xr = x + (size_t)n * dim;
      const float *g = dout + (size_t)n * dim;
      float *d = dx + (size_t)n * dim;
      float r = rstd[n];
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int i = 0; i < dim; i++) dot += w[i] * g[i] * xr[i];
      float c = dot * r * r * r / (float)dim;
#pragma omp simd
      for (int i = 0; i < dim; i++) d[i] += r * w[i] * g[i] - xr[i] * c;
    }
  }
}

void rf_model_rmsnorm_apply(float *out, const float *x, const float *rstd, const float *w, int n_rows,
                            int dim) {
#pragma omp parallel for schedule(static) if ((long)n_rows * dim >= 32768)
  for (int r = 0; r < n_rows; r++) {
    const float *xr = x + (size_t)r * dim;
    float *o = out + (size_t)r * dim;
    float s = rstd[r];
#pragma omp simd
    for (int i = 0; i < dim; i++) o[i] = xr[i] * s * w[i];
  }
}

/* ---- rotary embedding -------------------------------------------------------------- */

/* As transformers computes them: inv_freq = 1 / theta^(2i/hd) and the angle
 * t * inv_freq in float32, then cos/sin of that float angle (correctly rounded
 * here, within an ulp in PyTorch), so the tables match HF's at long positions too. */
void rf_model_rope_tables(float *cos_t, float *sin_t, int seq, int hd, double theta) {
  int half = hd / 2;
  for (int i = 0; i < half; i++) {
    float e = (float)(2 * i) / (float)hd;
    float inv_freq = 1.0f / (float)pow(theta, (double)e);
    for (int t = 0; t < seq; t++) {
      float a = (float)t * inv_freq;
      cos_t[(size_t)t * half + i] = (float)cos((double)a);
      sin_t[(size_t)t * half + i] = (float)sin((double)a);
    }
  }
}

/* HF: out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[h:], x[:h]):
 *   out[i]   = x[i] c - x[i+h] s,   out[i+h] = x[i+h] c + x[i] s   (i < h = hd/2).
 * The inverse (transpose) uses -s. */
void rf_model_rope_apply(float *x, int batch, int seq, int n_heads, int hd, const float *cos_t,
                         const float *sin_t, int inverse) {
  int half = hd / 2;
  int width = n_heads * hd;
  long rows = (long)batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= RF_MODEL_PAR_MIN)
  for (long n = 0; n < rows; n++) {
    int t = (int)(n % seq);
    const float *c = cos_t + (size_t)t * half;
    const float *s = sin_t + (size_t)t * half;
    float sign = inverse ? -1.0f : 1.0f;
    for (int h = 0; h < n_heads; h++) {
      float *p = x + (size_t)n * width + (size_t)h * hd;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        float a = p[i], b = p[i + half];
        float si = sign * s[i];
        p[i] = a * c[i] - b * si;
        p[i + half] = b * c[i] + a * si;
      }
    }
  }
}

/* DeepSeek-V3: the rotary embedding on rd elements from `off` of each of n_heads heads of `stride`
 * floats in a row. interleave: pairs (2i, 2i+1) (transformers' rope_interleave: it rotates the even
 * and odd elements and writes them de-interleaved, which only reorders q's and k's rotary parts
 * alike, so every score q . k is the same); else pairs (i, i + rd/2). */
void rf_model_mla_rope_apply(float *x, int batch, int seq, int n_heads, int stride, int off, int rd,
                             const float *cos_t, const float *sin_t, int interleave, int inverse) {
  int half = rd / 2, width = n_heads * stride;
  int step = interleave ? 2 : 1, other = interleave ? 1 : half; /* pair i: (i*step, i*step + other) */
  long rows = (long)batch * seq;
#pragma omp parallel for schedule(static) if (rows * width >= RF_MODEL_PAR_MIN)
  for (long n = 0; n < rows; n++) {
    int t = (int)(n % seq);
    const float *c = cos_t + (size_t)t * half;
    const float *s = sin_t + (size_t)t * half;
    float sign = inverse ? -1.0f : 1.0f;
    for (int h = 0; h < n_heads; h++) {
      float *p = x + (size_t)n * width + (size_t)h * stride + off;
      for (int i = 0; i < half; i++) {
        float a = p[i * step], b = p[i * step + other];
        float si = sign * s[i];
        p[i * step] = a * c[i] - b * si;
        p[i * step + other] = b * c[i] + a * si;
      }
    }
  }
}

/* k [n, nh, nope + rope] = (kvb's k_nope of the head, kpe), v [n, nh, dv] = kvb's v of the head;
 * kvb [n, nh, nope + dv]. */
void rf_model_mla_kv_expand(float *k, float *v, const float *kvb, const float *kpe, int n, int nh, int nope,
                            int rope, int dv) {
  size_t kw = (size_t)nope + rope, bw = (size_t)nope + dv;
#pragma omp parallel for schedule(static) if ((long)n * nh * (long)bw >= RF_MODEL_PAR_MIN)
  for (int r = 0; r < n; r++)
    for (int h = 0; h < nh; h++) {
      const float *src = kvb + ((size_t)r * nh + h) * bw;
      float *kk = k + ((size_t)r * nh + h) * kw;
      memcpy(kk, src, sizeof(float) * (size_t)nope);
      memcpy(kk + nope, kpe + (size_t)r * rope, sizeof(float) * (size_t)rope);
      memcpy(v + ((size_t)r * nh + h) * (size_t)dv, src + nope, sizeof(float) * (size_t)dv);
    }
}

/* dkvb [n, nh, nope + dv] = (dk's nope part, dv) of each head; dkpe [n, rope] = the sum over the
 * heads of dk's rotary part (every head's key shares kpe). Both overwritten. */
void rf_model_mla_kv_expand_backward(float *dkvb, float *dkpe, const float *dk, const float *dv, int n,
                                     int nh, int nope, int rope, int vd) {
  size_t kw = (size_t)nope + rope, bw = (size_t)nope + vd;
#pragma omp parallel for schedule(static) if ((long)n * nh * (long)bw >= RF_MODEL_PAR_MIN)
  for (int r = 0; r < n; r++) {
    float *pe = dkpe + (size_t)r * rope;
    memset(pe, 0, sizeof(float) * (size_t)rope);
    for (int h = 0; h < nh; h++) {
      const float *kk = dk + ((size_t)r * nh + h) * kw;
      float *dst = dkvb + ((size_t)r * nh + h) * bw;
      memcpy(dst, kk, sizeof(float) * (size_t)nope);
      memcpy(dst + nope, dv + ((size_t)r * nh + h) * (size_t)vd, sizeof(float) * (size_t)vd);
      for (int i = 0; i < rope; i++) pe[i] += kk[nope + i];
    }
  }
}

/* ---- attention --------------------------------------------------------------------- */

/* OpenMP over (batch, head) jobs; each job's products run on its own thread
 * (src/gemm runs a product called inside a parallel region on the caller). */
static int attention_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

/* C = alpha op(A) op(B) (+ C) in f32: attention's products. */
static void att_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                     const float *b, int ldb, float beta, float *c, int ldc) {
  struct rf_gemm_desc d = {.m = m,
                           .n = n,
                           .k = k,
                           .trans_a = ta,
                           .trans_b = tb,
                           .lda = lda,
                           .ldb = ldb,
                           .ldc = ldc,
                           .dtype = RF_DTYPE_F32,
                           .alpha = alpha,
                           .beta = beta};
  rf_gemm_run(&d, a, b, c);
}

/* Causal blocking: query rows go in blocks of RF_MODEL_ATT_BLOCK; block [i0, i0+r)
 * attends to keys [c0, i0+r) only (c0 = 0 without a window), so about half of the
 * T x T products are skipped. The probabilities are not kept: the forward stores
 * each row's log-sum-exp and the backward recomputes P = exp(S - lse) block by block
 * (FlashAttention's trade: one more Q K^T product for no T x T storage).
 *
 * One kernel serves every attention of the model: the plain one (no sinks, no window,
 * v's head dim = q's and k's, scale 1/sqrt(hd)), GPT-OSS's (sinks, windows) and
 * DeepSeek-V3's multi-head latent attention (v's head dim dv != hd, its own scale). */
struct att_shape {
  int batch, seq, nh, nkv;
  int hd, dv;  /* q and k's head dim; v's (and y's) */
  int window;  /* > 0: row i sees keys (i - window, i]; 0: every earlier key */
  float scale; /* of the scores */
};

/* The keys query row i sees: [lo, i], lo = i - window + 1 (window > 0; 0: every earlier key). */
static int att_lo(int i, int window) { return window > 0 && i - window + 1 > 0 ? i - window + 1 : 0; }

static void attention_forward_core(float *y, float *lse, const float *q, const float *k, const float *v,
                                   const float *sinks, const struct att_shape *s, float *scratch,
                                   int n_scratch) {
  int seq = s->seq, nh = s->nh, hd = s->hd, dv = s->dv, window = s->window;
  int qs = nh * hd, ks = s->nkv * hd, vs = s->nkv * dv, ys = nh * dv, rep = nh / s->nkv;
  float scale = s->scale;
  int n_jobs = s->batch * nh;
  int nt = attention_threads();
  if (nt > n_scratch) nt = n_scratch;
  (void)nt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && n_jobs > 1)
  for (int job = 0; job < n_jobs; job++) {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *p = scratch + (size_t)tid * 2 * RF_MODEL_ATT_BLOCK * seq;
    int b = job / nh, h = job % nh, g = h / rep;
    const float *qb = q + (size_t)b * seq * qs + (size_t)h * hd;
    const float *kb = k + (size_t)b * seq * ks + (size_t)g * hd;
    const float *vb = v + (size_t)b * seq * vs + (size_t)g * dv;
    float *yb = y + (size_t)b * seq * ys + (size_t)h * dv;
    float *lb = lse + (size_t)job * seq;
    for (int i0 = 0; i0 < seq; i0 += RF_MODEL_ATT_BLOCK) {
      int rows = seq - i0 < RF_MODEL_ATT_BLOCK ? seq - i0 : RF_MODEL_ATT_BLOCK;
      int c0 = att_lo(i0, window), cols = i0 + rows - c0; /* keys [c0, i0 + rows) */
      att_gemm(0, 1, rows, cols, hd, scale, qb + (size_t)i0 * qs, qs, kb + (size_t)c0 * ks, ks, 0.0f, p,
               cols);
      for (int r = 0; r < rows; r++) {
        int i = i0 + r, lo = att_lo(i, window) - c0, hi = i - c0;
        float *row = p + (size_t)r * cols;
        float mx = sinks ? sinks[h] : row[lo];
        RF_MODEL_SIMD_MAX
        for (int j = lo; j <= hi; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = sinks ? fast_expf(sinks[h] - mx) : 0.0f;
        for (int j = 0; j < lo; j++) row[j] = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = lo; j <= hi; j++) {
          row[j] = fast_expf(row[j] - mx);
          sum += row[j];
        }
        float inv = 1.0f / sum;
#pragma omp simd
        for (int j = lo; j <= hi; j++) row[j] *= inv;
        for (int j = hi + 1; j < cols; j++) row[j] = 0.0f;
        lb[i] = mx + logf(sum);
      }
      att_gemm(0, 0, rows, dv, cols, 1.0f, p, cols, vb + (size_t)c0 * vs, vs, 0.0f, yb + (size_t)i0 * ys, ys);
    }
  }
}

/* Per head and block: P = exp(S - lse) (recomputed); dP = dY V^T; dV += P^T dY;
 * dS = P * (dP - rowsum(P * dP)) * scale; dQ = dS K; dK += dS^T Q. Jobs are
 * (batch, kv head) so the heads sharing a kv head add into dK, dV in one thread.
 * The sinks' gradient afterwards: d sink_h = -sum over rows of P_sink * (dY . Y),
 * P_sink = exp(sink_h - lse). */
static void attention_backward_core(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                    const float *y, const float *lse, const float *q, const float *k,
                                    const float *v, const float *sinks, const struct att_shape *s,
                                    float *scratch, int n_scratch) {
  int batch = s->batch, seq = s->seq, nh = s->nh, nkv = s->nkv, hd = s->hd, vd = s->dv, window = s->window;
  int qs = nh * hd, ks = nkv * hd, vs = nkv * vd, ys = nh * vd, rep = nh / nkv;
  float scale = s->scale;
  int n_jobs = batch * nkv;
  int nt = attention_threads();
  if (nt > n_scratch) nt = n_scratch;
  (void)nt;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1 && n_jobs > 1)
  for (int job = 0; job < n_jobs; job++) {
    int tid = 0;
#ifdef _OPENMP
    tid = omp_get_thread_num();
#endif
    float *p = scratch + (size_t)tid * 2 * RF_MODEL_ATT_BLOCK * seq;
    float *dp = p + (size_t)RF_MODEL_ATT_BLOCK * seq;
    int b = job / nkv, g = job % nkv;
    const float *kb = k + (size_t)b * seq * ks + (size_t)g * hd;
    const float *vb = v + (size_t)b * seq * vs + (size_t)g * vd;
    float *dkb = dk + (size_t)b * seq * ks + (size_t)g * hd;
    float *dvb = dv + (size_t)b * seq * vs + (size_t)g * vd;
    for (int t = 0; t < seq; t++) {
      memset(dkb + (size_t)t * ks, 0, sizeof(float) * (size_t)hd);
      memset(dvb + (size_t)t * vs, 0, sizeof(float) * (size_t)vd);
    }
    for (int r = 0; r < rep; r++) {
      int h = g * rep + r;
      const float *qb = q + (size_t)b * seq * qs + (size_t)h * hd;
      const float *dyb = dy + (size_t)b * seq * ys + (size_t)h * vd;
      float *dqb = dq + (size_t)b * seq * qs + (size_t)h * hd;
      const float *lb = lse + ((size_t)b * nh + h) * seq;
      for (int i0 = 0; i0 < seq; i0 += RF_MODEL_ATT_BLOCK) {
        int rows = seq - i0 < RF_MODEL_ATT_BLOCK ? seq - i0 : RF_MODEL_ATT_BLOCK;
        int c0 = att_lo(i0, window), cols = i0 + rows - c0;
        const float *dyi = dyb + (size_t)i0 * ys, *kc = kb + (size_t)c0 * ks, *vc = vb + (size_t)c0 * vs;
        att_gemm(0, 1, rows, cols, hd, scale, qb + (size_t)i0 * qs, qs, kc, ks, 0.0f, p, cols);
        att_gemm(0, 1, rows, cols, vd, 1.0f, dyi, ys, vc, vs, 0.0f, dp, cols);
        for (int rr = 0; rr < rows; rr++) {
          int i = i0 + rr, lo = att_lo(i, window) - c0, hi = i - c0;
          float *pr = p + (size_t)rr * cols;
          float *d = dp + (size_t)rr * cols;
          float m = lb[i];
          for (int j = 0; j < lo; j++) pr[j] = d[j] = 0.0f;
#pragma omp simd
          for (int j = lo; j <= hi; j++) pr[j] = fast_expf(pr[j] - m);
          for (int j = hi + 1; j < cols; j++) pr[j] = 0.0f;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int j = lo; j <= hi; j++) dot += pr[j] * d[j];
#pragma omp simd
          for (int j = lo; j <= hi; j++) d[j] = pr[j] * (d[j] - dot) * scale;
          for (int j = hi + 1; j < cols; j++) d[j] = 0.0f;
        }
        att_gemm(1, 0, cols, vd, rows, 1.0f, p, cols, dyi, ys, 1.0f, dvb + (size_t)c0 * vs, vs);
        att_gemm(0, 0, rows, hd, cols, 1.0f, dp, cols, kc, ks, 0.0f, dqb + (size_t)i0 * qs, qs);
        att_gemm(1, 0, cols, hd, rows, 1.0f, dp, cols, qb + (size_t)i0 * qs, qs, 1.0f, dkb + (size_t)c0 * ks,
                 ks);
      }
    }
  }
  if (!sinks || !dsinks) return;
  for (int h = 0; h < nh; h++) {
    double acc = 0.0;
    for (int b = 0; b < batch; b++)
      for (int i = 0; i < seq; i++) {
        const float *yr = y + ((size_t)b * seq + i) * ys + (size_t)h * vd;
        const float *gr = dy + ((size_t)b * seq + i) * ys + (size_t)h * vd;
        double dot = 0.0;
        for (int c = 0; c < vd; c++) dot += (double)yr[c] * gr[c];
        acc += exp((double)sinks[h] - lse[((size_t)b * nh + h) * seq + i]) * dot;
      }
    dsinks[h] -= (float)acc;
  }
}

/* The plain attention's shape: v's head dim hd, scale 1/sqrt(hd). */
static struct att_shape att_plain(int batch, int seq, int nh, int nkv, int hd, int window) {
  return (struct att_shape){batch, seq, nh, nkv, hd, hd, window, 1.0f / sqrtf((float)hd)};
}

void rf_model_attention_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                int batch, int seq, int nh, int nkv, int hd, float *scratch, int n_scratch) {
  struct att_shape s = att_plain(batch, seq, nh, nkv, hd, 0);
  attention_forward_core(y, lse, q, k, v, NULL, &s, scratch, n_scratch);
}

void rf_model_attention_backward(float *dq, float *dk, float *dv, const float *dy, const float *lse,
                                 const float *q, const float *k, const float *v, int batch, int seq, int nh,
                                 int nkv, int hd, float *scratch, int n_scratch) {
  struct att_shape s = att_plain(batch, seq, nh, nkv, hd, 0);
  attention_backward_core(dq, dk, dv, NULL, dy, NULL, lse, q, k, v, NULL, &s, scratch, n_scratch);
}

void rf_model_attention_sink_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                     const float *sinks, int window, int batch, int seq, int nh, int nkv,
                                     int hd, float *scratch, int n_scratch) {
  struct att_shape s = att_plain(batch, seq, nh, nkv, hd, window);
  attention_forward_core(y, lse, q, k, v, sinks, &s, scratch, n_scratch);
}

void rf_model_attention_sink_backward(float *dq, float *dk, float *dv, float *dsinks, const float *dy,
                                      const float *y, const float *lse, const float *q, const float *k,
                                      const float *v, const float *sinks, int window, int batch, int seq,
                                      int nh, int nkv, int hd, float *scratch, int n_scratch) {
  struct att_shape s = att_plain(batch, seq, nh, nkv, hd, window);
  attention_backward_core(dq, dk, dv, dsinks, dy, y, lse, q, k, v, sinks, &s, scratch, n_scratch);
}

void rf_model_attention_mla_forward(float *y, float *lse, const float *q, const float *k, const float *v,
                                    int batch, int seq, int nh, int nkv, int hd, int dv, float scale,
                                    float *scratch, int n_scratch) {
  struct att_shape s = {batch, seq, nh, nkv, hd, dv, 0, scale};
  attention_forward_core(y, lse, q, k, v, NULL, &s, scratch, n_scratch);
}

void rf_model_attention_mla_backward(float *dq, float *dk, float *dv, const float *dy, const float *lse,
                                     const float *q, const float *k, const float *v, int batch, int seq,
                                     int nh, int nkv, int hd, int vd, float scale, float *scratch,
                                     int n_scratch) {
  struct att_shape s = {batch, seq, nh, nkv, hd, vd, 0, scale};
  attention_backward_core(dq, dk, dv, NULL, dy, NULL, lse, q, k, v, NULL, &s, scratch, n_scratch);
}

/* ---- SwiGLU --------------------------------------------------------------------------- */

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + fast_expf(-x)); }

/* Chunks of RF_MODEL_CHUNK elements: threads over chunks, SIMD inside. */
#define RF_MODEL_CHUNK 4096

static void swiglu_forward_chunk(float *h, const float *gate, const float *up, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) {
    float g = gate[i];
    h[i] = g * sigmoidf_(g) * up[i];
  }
}

void rf_model_swiglu_forward(float *h, const float *gate, const float *up, size_t n) {
  long chunks = (long)rf_ceil_div((int64_t)n, RF_MODEL_CHUNK);
#pragma omp parallel for schedule(static) if (n >= RF_MODEL_PAR_MIN)
  for (long c = 0; c < chunks; c++) {
    long i0 = c * RF_MODEL_CHUNK, len = (long)n - i0 < RF_MODEL_CHUNK ? (long)n - i0 : RF_MODEL_CHUNK;
    swiglu_forward_chunk(h + i0, gate + i0, up + i0, len);
  }
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). dup may alias dh. */
static void swiglu_backward_chunk(float *dgate, float *dup, const float *dh, const float *gate,
                                  const float *up, long n) {
#pragma omp simd
  for (long i = 0; i < n; i++) {
    float g = gate[i], d = dh[i];
    float s = sigmoidf_(g);
    float silu = g * s;
    dgate[i] = d * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = d * silu;
  }
}

void rf_model_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate, const float *up,
                              size_t n) {
  long chunks = (long)rf_ceil_div((int64_t)n, RF_MODEL_CHUNK);
#pragma omp parallel for schedule(static) if (n >= RF_MODEL_PAR_MIN)
  for (long c = 0; c < chunks; c++) {
    long i0 = c * RF_MODEL_CHUNK, len = (long)n - i0 < RF_MODEL_CHUNK ? (long)n - i0 : RF_MODEL_CHUNK;
    swiglu_backward_chunk(dgate + i0, dup + i0, dh + i0, gate + i0, up + i0, len);
  }
}

/* ---- linear ------------------------------------------------------------------------------ */

/* Chunks on the threads, each rounded by the vectorized rf_bf16_from_f32_n. */
static void to_bf16(uint16_t *dst, const float *src, size_t n) {
  long chunks = (long)rf_ceil_div((int64_t)n, RF_MODEL_CHUNK);
#pragma omp parallel for schedule(static) if (n >= RF_MODEL_PAR_MIN)
  for (long c = 0; c < chunks; c++) {
    long i0 = c * RF_MODEL_CHUNK, len = (long)n - i0 < RF_MODEL_CHUNK ? (long)n - i0 : RF_MODEL_CHUNK;
    rf_bf16_from_f32_n(dst + i0, src + i0, (size_t)len);
  }
}

/* bf16 -> f32 is a 16-bit shift; a union keeps the loop vectorizable. */
static void widen_bf16(float *dst, const uint16_t *src, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    union {
      uint32_t u;
      float f;
    } v;
    v.u = (uint32_t)src[i] << 16;
    dst[i] = v.f;
  }
}

/* C [m, n] = op(A) op(B) + beta C, row-major, dense rows. */
static void lin_gemm(enum rf_dtype dt, int ta, int tb, int m, int n, int k, const void *a, const void *b,
                     float beta, float *c, int ldc) {
  struct rf_gemm_desc d = rf_gemm_desc_whole(dt, ta, tb, m, n, k, beta, ldc);
  rf_gemm_run(&d, a, b, c);
}

static int stage_bf16(const struct rf_model_stage *st) { return st && st->compute == RF_DTYPE_BF16; }

/* The weight as bf16 operand: the gathered bf16 weight itself, or the f32 weight
 * rounded into the stage. */
static const uint16_t *weight_bf16(const struct rf_model_weight *w, size_t n,
                                   const struct rf_model_stage *st) {
  if (w->bf16) return w->bf16;
  to_bf16(st->wbf16, w->f32, n);
  return st->wbf16;
}

/* ---- FP8 block mode: products on e4m3 codes (docs/fp8.md) ---- */

/* x [rows, cols] quantized in tile_rows x tile_cols tiles into the operand op
 * (codes as bf16 in dst, in one pass; scales in scales); -1 when x holds NaN or an
 * infinity. */
static int fp8_operand(const struct rf_model_fp8_stage *q, struct rf_gemm_fp8_operand *op, uint16_t *dst,
                       float *scales, const float *x, int rows, int cols, int tile_rows, int trans) {
  struct rf_fp8_grid g = {rows, cols, tile_rows, tile_rows == 1 ? RF_FP8_TILE : 1};
  RF_TRY(rf_fp8_quantize_bf16(&g, x, q->pow2, "activation", dst, scales));
  *op = (struct rf_gemm_fp8_operand){dst, scales, g, trans};
  return 0;
}

/* The weight [out, in] as an operand (its gathered codes and 128 x 128 tile scales). */
static struct rf_gemm_fp8_operand fp8_weight(const struct rf_model_fp8_stage *q,
                                             const struct rf_model_weight *w, int out, int in, int trans) {
  rf_fp8_codes_to_bf16(q->w, w->fp8, (size_t)out * (size_t)in);
  return (struct rf_gemm_fp8_operand){q->w, w->fp8_scales, {out, in, RF_FP8_TILE, RF_FP8_TILE}, trans};
}

/* c [m, n] (+)= the product, or NaN everywhere when an operand could not be quantized. */
static void fp8_product(const struct rf_model_fp8_stage *q, int ok, int m, int n, int k,
                        struct rf_gemm_fp8_operand a, struct rf_gemm_fp8_operand b, int accumulate,
                        float *c) {
  if (!ok) {
    for (size_t i = 0; i < (size_t)m * (size_t)n; i++) c[i] = NAN;
    return;
  }
  struct rf_gemm_fp8_desc d = {m, n, k, a, b, accumulate};
  rf_gemm_fp8_run(&d, c, q->work);
}

static void linear_forward_fp8(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                               int out, float beta, const struct rf_model_fp8_stage *q) {
  struct rf_gemm_fp8_operand a = {0};
  int ok = fp8_operand(q, &a, q->a, q->sa, x, n, in, 1, 0) == 0;
  fp8_product(q, ok, n, out, in, a, fp8_weight(q, w, out, in, 1), beta != 0.0f, y);
}

static void linear_backward_fp8(float *dx, float *dw, const float *dy, const float *x,
                                const struct rf_model_weight *w, int n, int in, int out, float beta,
                                const struct rf_model_fp8_stage *q) {
  struct rf_gemm_fp8_operand a = {0}, b = {0};
  /* dW [out, in] += dY^T X over the n tokens: 128 x 1 tiles along them, restarting at
   * each sequence of q->seq tokens (a partial tile at a sequence's end), so that a tile
   * never holds two sequences' tokens and the tiles are the same at every W. A
   * sequence that is a multiple of 128 tokens tiles as the whole run does. */
  int run = q->seq > 0 && q->seq % RF_FP8_TILE != 0 && n % q->seq == 0 ? q->seq : n;
  for (int r0 = 0; dw && r0 < n; r0 += run) {
    const float *dyr = dy + (size_t)r0 * out, *xr = x + (size_t)r0 * in;
    int ok = fp8_operand(q, &a, q->a, q->sa, dyr, run, out, RF_FP8_TILE, 1) == 0 &&
             fp8_operand(q, &b, q->b, q->sb, xr, run, in, RF_FP8_TILE, 0) == 0;
    fp8_product(q, ok, out, in, run, a, b, 1, dw);
  }
  if (dx) { /* dX [n, in] = dY W over the out features: dY in 1 x 128 tiles */
    int ok = fp8_operand(q, &a, q->a, q->sa, dy, n, out, 1, 0) == 0;
    fp8_product(q, ok, n, in, out, a, fp8_weight(q, w, out, in, 0), beta != 0.0f, dx);
  }
}

static void linear_forward_products(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                                    int out, float beta, const struct rf_model_stage *st) {
  if (w->fp8) {
    RF_ASSERT(st && st->fp8.work);
    linear_forward_fp8(y, x, w, n, in, out, beta, &st->fp8);
    return;
  }
  if (stage_bf16(st)) {
    to_bf16(st->act, x, (size_t)n * in);
    lin_gemm(RF_DTYPE_BF16, 0, 1, n, out, in, st->act, weight_bf16(w, (size_t)out * in, st), beta, y, out);
    return;
  }
  if (w->f32) {
    lin_gemm(RF_DTYPE_F32, 0, 1, n, out, in, x, w->f32, beta, y, out);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  for (int r0 = 0; r0 < out; r0 += RF_MODEL_STAGE_ROWS) {
    int rows = out - r0 < RF_MODEL_STAGE_ROWS ? out - r0 : RF_MODEL_STAGE_ROWS;
    widen_bf16(st->wf32, w->bf16 + (size_t)r0 * in, (size_t)rows * in);
    lin_gemm(RF_DTYPE_F32, 0, 1, n, rows, in, x, st->wf32, beta, y + r0, out);
  }
}

static void linear_backward_products(float *dx, float *dw, const float *dy, const float *x,
                                     const struct rf_model_weight *w, int n, int in, int out, float beta,
                                     const struct rf_model_stage *st) {
  if (w->fp8) {
    RF_ASSERT(st && st->fp8.work);
    linear_backward_fp8(dx, dw, dy, x, w, n, in, out, beta, &st->fp8);
    return;
  }
  if (stage_bf16(st)) {
    to_bf16(st->act, dy, (size_t)n * out);
    if (dw) {
      to_bf16(st->act2, x, (size_t)n * in);
      lin_gemm(RF_DTYPE_BF16, 1, 0, out, in, n, st->act, st->act2, 1.0f, dw, in);
    }
    if (dx)
      lin_gemm(RF_DTYPE_BF16, 0, 0, n, in, out, st->act, weight_bf16(w, (size_t)out * in, st), beta, dx, in);
    return;
  }
  if (dw) lin_gemm(RF_DTYPE_F32, 1, 0, out, in, n, dy, x, 1.0f, dw, in);
  if (!dx) return;
  if (w->f32) {
    lin_gemm(RF_DTYPE_F32, 0, 0, n, in, out, dy, w->f32, beta, dx, in);
    return;
  }
  RF_ASSERT(w->bf16 && st);
  /* dx = sum over row blocks of W: dy[:, block] W[block, :] */
  for (int r0 = 0; r0 < out; r0 += RF_MODEL_STAGE_ROWS) {
    int rows = out - r0 < RF_MODEL_STAGE_ROWS ? out - r0 : RF_MODEL_STAGE_ROWS;
    widen_bf16(st->wf32, w->bf16 + (size_t)r0 * in, (size_t)rows * in);
    struct rf_gemm_desc d = {.m = n,
                             .n = in,
                             .k = rows,
                             .lda = out,
                             .ldb = in,
                             .ldc = in,
                             .dtype = RF_DTYPE_F32,
                             .alpha = 1.0f,
                             .beta = r0 > 0 ? 1.0f : beta};
    rf_gemm_run(&d, dy + r0, st->wf32, dx);
  }
}

static void linear_progress(const struct rf_model_stage *st) {
  if (st && st->progress) st->progress(st->progress_ctx);
}

void rf_model_linear_forward(float *y, const float *x, const struct rf_model_weight *w, int n, int in,
                             int out, float beta, const struct rf_model_stage *st) {
  linear_forward_products(y, x, w, n, in, out, beta, st);
  linear_progress(st);
}

void rf_model_linear_backward(float *dx, float *dw, const float *dy, const float *x,
                              const struct rf_model_weight *w, int n, int in, int out, float beta,
                              const struct rf_model_stage *st) {
  linear_backward_products(dx, dw, dy, x, w, n, in, out, beta, st);
  linear_progress(st);
}

/* ---- cross-entropy ------------------------------------------------------------------------ */

double rf_model_cross_entropy_forward(float *lse, const float *logits, const int32_t *targets, int n,
                                      int vocab) {
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if ((long)n * vocab >= RF_MODEL_PAR_MIN)
  for (int r = 0; r < n; r++) {
    const float *z = logits + (size_t)r * vocab;
    int jm = 0;
    for (int j = 1; j < vocab; j++) jm = z[j] > z[jm] ? j : jm;
    float mx = z[jm];
    double sum = 1.0; /* the maximum's own term */
    for (int j = 0; j < vocab; j++)
      if (j != jm) sum += exp((double)(z[j] - mx));
    double l = (double)mx + log(sum);
    lse[r] = (float)l;
    if (targets && targets[r] >= 0) total += l - (double)z[targets[r]];
  }
  return total;
}

void rf_model_cross_entropy_backward(float *logits, const float *lse, const int32_t *targets, int n,
                                     int vocab, float scale) {
#pragma omp parallel for schedule(static) if ((long)n * vocab >= RF_MODEL_PAR_MIN)
  for (int r = 0; r < n; r++) {
    float *z = logits + (size_t)r * vocab;
    int t = targets[r];
    if (t < 0) {
      memset(z, 0, sizeof(float) * (size_t)vocab);
      continue;
    }
    float m = lse[r];
#pragma omp simd
    for (int j = 0; j < vocab; j++) z[j] = fast_expf(z[j] - m) * scale;
    z[t] -= scale;
  }
}

/* ---- embedding ------------------------------------------------------------------------------ */

void rf_model_embedding_forward(float *out, const struct rf_model_weight *table, const int32_t *tokens, int n,
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

void rf_model_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int n, int dim) {
  for (int r = 0; r < n; r++) {
    float *d = dtable + (size_t)tokens[r] * dim;
    const float *g = dout + (size_t)r * dim;
    for (int i = 0; i < dim; i++) d[i] += g[i];
  }
}

/* ---- bias ------------------------------------------------------------------------------------ */

void rf_model_bias_forward(float *y, const float *b, int n, int out) {
#pragma omp parallel for schedule(static) if ((long)n * out >= 32768)
  for (int r = 0; r < n; r++) {
    float *yr = y + (size_t)r * out;
#pragma omp simd
    for (int j = 0; j < out; j++) yr[j] += b[j];
  }
}

void rf_model_bias_backward(float *db, const float *dy, int n, int out) {
  /* column blocks: each thread sums its columns over every row, in row order */
#pragma omp parallel for schedule(static) if ((long)n * out >= 32768)
  for (int j0 = 0; j0 < out; j0 += 64) {
    int j1 = j0 + 64 < out ? j0 + 64 : out;
    for (int r = 0; r < n; r++) {
      const float *g = dy + (size_t)r * out;
#pragma omp simd
      for (int j = j0; j < j1; j++) db[j] += g[j];
    }
  }
}

/* ---- GPT-OSS: the clamped SwiGLU, [in, out] weights (its attention is the one above) ---- */

/* g = min(gate, limit), u = clamp(up, -limit, limit): h = (u + 1) * g * sigmoid(alpha g).
 * Threads over chunks of RF_MODEL_CHUNK outputs, SIMD inside (selects, no branches). */
static void swiglu_clamp_forward_chunk(float *h, const float *gu, long n, float alpha, float limit) {
#pragma omp simd
  for (long i = 0; i < n; i++) {
    float graw = gu[2 * i], uraw = gu[2 * i + 1];
    float g = graw < limit ? graw : limit;
    float u = uraw < -limit ? -limit : uraw > limit ? limit : uraw;
    h[i] = (u + 1.0f) * g * sigmoidf_(alpha * g);
  }
}

void rf_model_swiglu_clamp_forward(float *h, const float *gu, size_t n, float alpha, float limit) {
  long chunks = (long)rf_ceil_div((int64_t)n, RF_MODEL_CHUNK);
#pragma omp parallel for schedule(static) if (n >= RF_MODEL_PAR_MIN)
  for (long c = 0; c < chunks; c++) {
    long i0 = c * RF_MODEL_CHUNK, len = (long)n - i0 < RF_MODEL_CHUNK ? (long)n - i0 : RF_MODEL_CHUNK;
    swiglu_clamp_forward_chunk(h + i0, gu + 2 * i0, len, alpha, limit);
  }
}

/* d/dg [g s(alpha g)] = s + alpha g s (1 - s); a clamped input passes no gradient (torch's
 * clamp: the bound itself passes it). */
static void swiglu_clamp_backward_chunk(float *dgu, const float *dh, const float *gu, long n, float alpha,
                                        float limit) {
#pragma omp simd
  for (long i = 0; i < n; i++) {
    float graw = gu[2 * i], uraw = gu[2 * i + 1];
    float g = graw < limit ? graw : limit;
    float u = uraw < -limit ? -limit : uraw > limit ? limit : uraw;
    float s = sigmoidf_(alpha * g), d = dh[i];
    dgu[2 * i] = graw <= limit ? d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
    dgu[2 * i + 1] = uraw >= -limit && uraw <= limit ? d * g * s : 0.0f;
  }
}

void rf_model_swiglu_clamp_backward(float *dgu, const float *dh, const float *gu, size_t n, float alpha,
                                    float limit) {
  long chunks = (long)rf_ceil_div((int64_t)n, RF_MODEL_CHUNK);
#pragma omp parallel for schedule(static) if (n >= RF_MODEL_PAR_MIN)
  for (long c = 0; c < chunks; c++) {
    long i0 = c * RF_MODEL_CHUNK, len = (long)n - i0 < RF_MODEL_CHUNK ? (long)n - i0 : RF_MODEL_CHUNK;
    swiglu_clamp_backward_chunk(dgu + 2 * i0, dh + i0, gu + 2 * i0, len, alpha, limit);
  }
}

/* The transposes go in tiles of RF_MODEL_TT x RF_MODEL_TT (both sides stay in cache). */
#define RF_MODEL_TT 32

void rf_model_weight_transpose(float *dst, const struct rf_model_weight *w, int rows, int cols) {
  RF_ASSERT(w->f32 || w->bf16);
  int tr = (rows + RF_MODEL_TT - 1) / RF_MODEL_TT, tc = (cols + RF_MODEL_TT - 1) / RF_MODEL_TT;
#pragma omp parallel for schedule(static) if ((long)rows * cols >= RF_MODEL_PAR_MIN)
  for (int t = 0; t < tr * tc; t++) {
    int r0 = (t / tc) * RF_MODEL_TT, c0 = (t % tc) * RF_MODEL_TT;
    int r1 = r0 + RF_MODEL_TT < rows ? r0 + RF_MODEL_TT : rows,
        c1 = c0 + RF_MODEL_TT < cols ? c0 + RF_MODEL_TT : cols;
    for (int c = c0; c < c1; c++) {
      float *d = dst + (size_t)c * rows;
      if (w->f32)
        for (int r = r0; r < r1; r++) d[r] = w->f32[(size_t)r * cols + c];
      else
        for (int r = r0; r < r1; r++) d[r] = rf_f32_from_bf16(w->bf16[(size_t)r * cols + c]);
    }
  }
}

void rf_model_transpose_add(float *dst, const float *src, int rows, int cols) {
  int tr = (rows + RF_MODEL_TT - 1) / RF_MODEL_TT, tc = (cols + RF_MODEL_TT - 1) / RF_MODEL_TT;
#pragma omp parallel for schedule(static) if ((long)rows * cols >= RF_MODEL_PAR_MIN)
  for (int t = 0; t < tr * tc; t++) {
    int r0 = (t / tc) * RF_MODEL_TT, c0 = (t % tc) * RF_MODEL_TT;
    int r1 = r0 + RF_MODEL_TT < rows ? r0 + RF_MODEL_TT : rows,
        c1 = c0 + RF_MODEL_TT < cols ? c0 + RF_MODEL_TT : cols;
    for (int c = c0; c < c1; c++) {
      float *d = dst + (size_t)c * rows;
      for (int r = r0; r < r1; r++) d[r] += src[(size_t)r * cols + c];
    }
  }
}

/* transformers' _compute_yarn_parameters (float32 as there), then the angle t * inv_freq in
 * float32 and cos/sin of it times the attention factor. */
void rf_model_rope_tables_yarn(float *cos_t, float *sin_t, int seq, int hd, double theta,
                               const struct rf_model_yarn *y) {
  int half = hd / 2;
  double lo = hd * log(y->original_max / (y->beta_fast * 2 * 3.14159265358979323846)) / (2 * log(theta));
  double hi = hd * log(y->original_max / (y->beta_slow * 2 * 3.14159265358979323846)) / (2 * log(theta));
  if (y->truncate) {
    lo = floor(lo);
    hi = ceil(hi);
  }
  lo = lo > 0 ? lo : 0;
  hi = hi < hd - 1 ? hi : hd - 1;
  if (lo == hi) hi += 0.001;
  float att = (float)y->attention_factor;
  for (int i = 0; i < half; i++) {
    float e = (float)(2 * i) / (float)hd;
    float pos = (float)pow(theta, (double)e);
    float extra = 1.0f / pos, inter = 1.0f / ((float)y->factor * pos);
    float ramp = (float)(((double)(float)i - lo) / (hi - lo));
    ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
    float ef = 1.0f - ramp;
    float inv_freq = inter * (1.0f - ef) + extra * ef;
    for (int t = 0; t < seq; t++) {
      float a = (float)t * inv_freq;
      cos_t[(size_t)t * half + i] = (float)cos((double)a) * att;
      sin_t[(size_t)t * half + i] = (float)sin((double)a) * att;
    }
  }
}
