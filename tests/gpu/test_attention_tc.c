/* GPU test (scripts/gpu-check on a GPU; make BACKEND=cuda-emu runs it on the CPU stand-in,
 * tests/test_cuda_emu_attention.c): the tensor-core attention (src/model/attention_tc.cu,
 * bf16 operands, f32 accumulation) against
 *   - an f64 attention of the same inputs rounded to bf16 (what the kernels compute before
 *     their own roundings), with bounds from the one rounding each output inherits: the
 *     probabilities rounded to bf16 before P V, and dS before dS K and dS^T Q. With u = 2^-8
 *     (bf16's unit roundoff; a rounding errs by at most u / 2 of its value), every element
 *     must lie within u * M + 2^-16 * (1 + |ref|) of the f64 value, M the sum of the
 *     magnitudes of its terms (y: sum_j P |v|; dV: sum_i P |dy|; dQ, dK: scale sum (|dS| + P e) |k|
 *     or |q|, with e = sum_j P |dP| of the row: D = dY . Y takes the forward's Y, whose own
 *     rounding errs by up to u/2 e): twice the roundings' bound, the rest for f32 accumulation and exp; dQ
 * and dK also 2^-16 of scale sum_j P (|dP| + |D|) |k| (or |q|), where dS = P (dP - D) cancels in f32 (each
 * side a sum of hd f32 products, 2^-24 each); lse within 2^-16 (1 + |lse|);
 *   - the f32 host attention (rf_model_attention_forward/_backward of ops.c) on the
 *     rounded inputs, the same bounds (it is within f32 roundoff of the f64);
 * at T = 1, 63, 64, 65, 130 and 200, head_dim 32, 64 and 128, batch 1 and 2, GQA (4 heads on
 * 2 kv heads and on 1) and plain; outputs prefilled with NaN (an element not written
 * fails); a second run bit-identical (no atomics). On a GPU it then times the forward and the
 * backward at the 1.1B LLaMA's shape (median of 20, CUDA events). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/attention_tc.h"
#include "model/model.h"
#include "rf_test.h"

#define UB (1.0 / 256.0)       /* bf16's unit roundoff 2^-8 */
#define SLACK (1.0 / 65536.0)  /* f32 accumulation, exp and log */
#define CANCEL (1.0 / 65536.0) /* dP - D in f32: hd products each side, 2^-24 each, and the exp */

static void ck_(cudaError_t e, const char *call, const char *file, int line) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  exit(1);
}
#define CK(call) ck_((call), #call, __FILE__, __LINE__)

static uint64_t g_rng = 20261202;

static float bf16_round(float x) { return rf_f32_from_bf16(rf_bf16_from_f32(x)); }

/* n random values in [-scale, scale], and their bf16 roundings */
static float *rand_buf(size_t n, float scale, float **rounded) {
  float *p = rf_xmalloc(n * sizeof(float) + 4), *r = rf_xmalloc(n * sizeof(float) + 4);
  for (size_t i = 0; i < n; i++) {
    p[i] = scale * rf_test_rand_f32(&g_rng);
    r[i] = bf16_round(p[i]);
  }
  *rounded = r;
  return p;
}

static float *to_device(const float *h, size_t n) {
  float *d;
  CK(cudaMalloc((void **)&d, n * sizeof(float) + 4));
  CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
  return d;
}

static float *nan_device(size_t n) {
  float *h = rf_xmalloc(n * sizeof(float) + 4), *d;
  for (size_t i = 0; i < n; i++) h[i] = NAN;
  d = to_device(h, n);
  free(h);
  return d;
}

static float *from_device(const float *d, size_t n) {
  float *h = rf_xmalloc(n * sizeof(float) + 4);
  CK(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

/* The f64 attention of the rounded inputs and the magnitudes behind each output. */
struct ref {
  double *y, *lse, *dq, *dk, *dv;
  double *my, *mdq, *mdk, *mdv; /* the terms behind the bf16 rounding's error */
  double *cdq, *cdk;            /* the terms behind dP - D's f32 error (its cancellation) */
};

static void reference(struct ref *o, const float *q, const float *k, const float *v, const float *dy, int B,
                      int T, int nh, int nkv, int hd) {
  const size_t qn = (size_t)B * T * nh * hd, kn = (size_t)B * T * nkv * hd;
  o->y = rf_xcalloc(qn, sizeof(double));
  o->my = rf_xcalloc(qn, sizeof(double));
  o->dq = rf_xcalloc(qn, sizeof(double));
  o->mdq = rf_xcalloc(qn, sizeof(double));
  o->dk = rf_xcalloc(kn, sizeof(double));
  o->mdk = rf_xcalloc(kn, sizeof(double));
  o->dv = rf_xcalloc(kn, sizeof(double));
  o->mdv = rf_xcalloc(kn, sizeof(double));
  o->cdq = rf_xcalloc(qn, sizeof(double));
  o->cdk = rf_xcalloc(kn, sizeof(double));
  o->lse = rf_xcalloc((size_t)B * nh * T, sizeof(double));
  const double scale = 1.0 / sqrt((double)hd);
  double *p = rf_xmalloc((size_t)T * sizeof(double)), *dp = rf_xmalloc((size_t)T * sizeof(double));
  double *cp = rf_xmalloc((size_t)T * sizeof(double)), *am = rf_xmalloc((size_t)T * sizeof(double));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++) {
      const int g = h / (nh / nkv);
#define Q(i, d) q[(((size_t)b * T + (i)) * nh + h) * hd + (d)]
#define DY(i, d) dy[(((size_t)b * T + (i)) * nh + h) * hd + (d)]
#define KK(j, d) (((size_t)b * T + (j)) * nkv + g) * hd + (d)
#define QQ(i, d) (((size_t)b * T + (i)) * nh + h) * hd + (d)
      for (int i = 0; i < T; i++) {
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= i; j++) {
          double s = 0;
          for (int d = 0; d < hd; d++) s += (double)Q(i, d) * k[KK(j, d)];
          p[j] = s * scale;
          mx = p[j] > mx ? p[j] : mx;
        }
        for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
        o->lse[((size_t)b * nh + h) * T + i] = mx + log(fmax(sum, 1.0)); /* sum >= 1: exp(0) */
        double drow = 0, dmag = 0;
        for (int j = 0; j <= i; j++) p[j] /= sum;
        for (int d = 0; d < hd; d++) {
          double acc = 0, mag = 0;
          for (int j = 0; j <= i; j++) {
            acc += p[j] * v[KK(j, d)];
            mag += p[j] * fabs(v[KK(j, d)]);
          }
          o->y[QQ(i, d)] = acc;
          o->my[QQ(i, d)] = mag;
          drow += acc * DY(i, d);
          dmag += fabs(acc * DY(i, d));
        }
        /* the backward of row i: dP_ij = dy_i . v_j, dS_ij = P_ij (dP_ij - D_i) */
        for (int j = 0; j <= i; j++) {
          double s = 0, m = 0;
          for (int d = 0; d < hd; d++) {
            s += (double)DY(i, d) * v[KK(j, d)];
            m += fabs((double)DY(i, d) * v[KK(j, d)]);
          }
          dp[j] = p[j] * (s - drow);
          cp[j] = p[j] * (m + dmag);
          am[j] = m;
        }
        /* D = dY . Y takes the forward's Y, whose bf16 error (P rounded) is at most u/2 sum_j P |dP|: it
         * enters every dS of the row as P_ij times that */
        double ed = 0;
        for (int j = 0; j <= i; j++) ed += p[j] * am[j];
        for (int d = 0; d < hd; d++)
          for (int j = 0; j <= i; j++) {
            o->dq[QQ(i, d)] += scale * dp[j] * k[KK(j, d)];
            o->mdq[QQ(i, d)] += scale * (fabs(dp[j]) + p[j] * ed) * fabs(k[KK(j, d)]);
            o->dk[KK(j, d)] += scale * dp[j] * Q(i, d);
            o->mdk[KK(j, d)] += scale * (fabs(dp[j]) + p[j] * ed) * fabs(Q(i, d));
            o->cdq[QQ(i, d)] += scale * cp[j] * fabs(k[KK(j, d)]);
            o->cdk[KK(j, d)] += scale * cp[j] * fabs(Q(i, d));
            o->dv[KK(j, d)] += p[j] * DY(i, d);
            o->mdv[KK(j, d)] += p[j] * fabs(DY(i, d));
          }
      }
#undef Q
#undef DY
#undef KK
#undef QQ
    }
  free(p);
  free(dp);
  free(cp);
  free(am);
}

static void ref_free(struct ref *o) {
  free(o->y);
  free(o->lse);
  free(o->dq);
  free(o->dk);
  free(o->dv);
  free(o->my);
  free(o->mdq);
  free(o->mdk);
  free(o->mdv);
  free(o->cdq);
  free(o->cdk);
}

/* The worst ratio |got - ref| / bound over n elements (> 1 fails); a NaN counts as infinite. */
static double worst(const float *got, const double *ref, const double *mag, const double *canc, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double bound = UB * mag[i] + (canc ? CANCEL * canc[i] : 0) + SLACK * (1 + fabs(ref[i]));
    double e = fabs((double)got[i] - ref[i]) / bound;
    if (!(e <= w)) w = isnan(e) ? INFINITY : e;
  }
  return w;
}

static double worst_f(const float *got, const float *ref, const double *mag, const double *canc, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double bound = UB * mag[i] + (canc ? CANCEL * canc[i] : 0) + SLACK * (1 + fabs((double)ref[i]));
    double e = fabs((double)got[i] - (double)ref[i]) / bound;
    if (!(e <= w)) w = isnan(e) ? INFINITY : e;
  }
  return w;
}

static void check(int B, int T, int nh, int nkv, int hd) {
  const size_t qn = (size_t)B * T * nh * hd, kn = (size_t)B * T * nkv * hd, ln = (size_t)B * nh * T;
  float *qr, *kr, *vr, *dyr;
  float *q = rand_buf(qn, 2.0f, &qr), *k = rand_buf(kn, 2.0f, &kr), *v = rand_buf(kn, 1.0f, &vr),
        *dy = rand_buf(qn, 1.0f, &dyr);
  struct ref o;
  reference(&o, qr, kr, vr, dyr, B, T, nh, nkv, hd);
  float *dq_ = to_device(q, qn), *dk_ = to_device(k, kn), *dv_ = to_device(v, kn), *ddy = to_device(dy, qn);
  float *dys[2], *dls[2], *ddq[2], *ddk[2], *ddv[2], *dd = nan_device(ln);
  for (int run = 0; run < 2; run++) {
    dys[run] = nan_device(qn);
    dls[run] = nan_device(ln);
    ddq[run] = nan_device(qn);
    ddk[run] = nan_device(kn);
    ddv[run] = nan_device(kn);
    rf_attention_tc_forward(dys[run], dls[run], dq_, dk_, dv_, B, T, nh, nkv, hd, 0);
    rf_attention_tc_backward(ddq[run], ddk[run], ddv[run], ddy, dys[run], dls[run], dq_, dk_, dv_, B, T, nh,
                             nkv, hd, dd, 0);
  }
  CK(cudaDeviceSynchronize());
  float *y = from_device(dys[0], qn), *lse = from_device(dls[0], ln), *gq = from_device(ddq[0], qn),
        *gk = from_device(ddk[0], kn), *gv = from_device(ddv[0], kn);
  char what[128];
  snprintf(what, sizeof what, "B=%d T=%d heads %d on %d, hd %d", B, T, nh, nkv, hd);
  double wy = worst(y, o.y, o.my, NULL, qn), wq = worst(gq, o.dq, o.mdq, o.cdq, qn),
         wk = worst(gk, o.dk, o.mdk, o.cdk, kn), wv = worst(gv, o.dv, o.mdv, NULL, kn), wl = 0;
  for (size_t i = 0; i < ln; i++) {
    double e = fabs((double)lse[i] - o.lse[i]) / (SLACK * (1 + fabs(o.lse[i])));
    if (!(e <= wl)) wl = isnan(e) ? INFINITY : e;
  }
  RF_CHECK(wy <= 1 && wl <= 1 && wq <= 1 && wk <= 1 && wv <= 1,
           "%s against f64: worst error / bound: y %.3f lse %.3f dq %.3f dk %.3f dv %.3f", what, wy, wl, wq,
           wk, wv);
  /* the f32 host ops on the rounded inputs */
  float *hy = rf_xmalloc(qn * sizeof(float)), *hl = rf_xmalloc(ln * sizeof(float));
  float *hq = rf_xmalloc(qn * sizeof(float)), *hk = rf_xmalloc(kn * sizeof(float)),
        *hv = rf_xmalloc(kn * sizeof(float));
  int ns = 1;
  float *scratch = rf_xmalloc((size_t)ns * 2 * RF_MODEL_ATT_BLOCK * (size_t)T * sizeof(float) + 64);
  rf_model_attention_forward(hy, hl, qr, kr, vr, B, T, nh, nkv, hd, scratch, ns);
  rf_model_attention_backward(hq, hk, hv, dyr, hl, qr, kr, vr, B, T, nh, nkv, hd, scratch, ns);
  double hy_w = worst_f(y, hy, o.my, NULL, qn), hq_w = worst_f(gq, hq, o.mdq, o.cdq, qn),
         hk_w = worst_f(gk, hk, o.mdk, o.cdk, kn), hv_w = worst_f(gv, hv, o.mdv, NULL, kn);
  RF_CHECK(hy_w <= 1 && hq_w <= 1 && hk_w <= 1 && hv_w <= 1,
           "%s against the host's f32 attention: y %.3f dq %.3f dk %.3f dv %.3f", what, hy_w, hq_w, hk_w,
           hv_w);
  /* deterministic */
  float *y2 = from_device(dys[1], qn), *q2 = from_device(ddq[1], qn), *k2 = from_device(ddk[1], kn),
        *v2 = from_device(ddv[1], kn);
  RF_CHECK(memcmp(y, y2, qn * 4) == 0 && memcmp(gq, q2, qn * 4) == 0 && memcmp(gk, k2, kn * 4) == 0 &&
               memcmp(gv, v2, kn * 4) == 0,
           "%s: a second run differs", what);
  printf("attention tc %s: worst error / bound y %.3f lse %.3f dq %.3f dk %.3f dv %.3f\n", what, wy, wl, wq,
         wk, wv);
  free(y2);
  free(q2);
  free(k2);
  free(v2);
  free(hy);
  free(hl);
  free(hq);
  free(hk);
  free(hv);
  free(scratch);
  free(y);
  free(lse);
  free(gq);
  free(gk);
  free(gv);
  for (int run = 0; run < 2; run++) {
    CK(cudaFree(dys[run]));
    CK(cudaFree(dls[run]));
    CK(cudaFree(ddq[run]));
    CK(cudaFree(ddk[run]));
    CK(cudaFree(ddv[run]));
  }
  CK(cudaFree(dd));
  CK(cudaFree(dq_));
  CK(cudaFree(dk_));
  CK(cudaFree(dv_));
  CK(cudaFree(ddy));
  ref_free(&o);
  free(q);
  free(k);
  free(v);
  free(dy);
  free(qr);
  free(kr);
  free(vr);
  free(dyr);
}

#ifndef RF_CUDA_EMU
static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x > y) - (x < y);
}

/* The median of 20 runs of the forward and the backward at the 1.1B LLaMA's attention (8 x 2048
 * tokens, 32 heads on 8 kv heads of 64) on the GPU (test_kernels_cuda times the f32 kernels there). */
static void timing(void) {
  const int B = 8, T = 2048, nh = 32, nkv = 8, hd = 64, runs = 20;
  const size_t qn = (size_t)B * T * nh * hd, kn = (size_t)B * T * nkv * hd, ln = (size_t)B * nh * T;
  float *dummy;
  float *h = rand_buf(qn, 1.0f, &dummy);
  float *q = to_device(h, qn), *k = to_device(h, kn), *v = to_device(h, kn), *dy = to_device(h, qn);
  float *y = nan_device(qn), *lse = nan_device(ln), *dq = nan_device(qn), *dk = nan_device(kn),
        *dv = nan_device(kn), *dd = nan_device(ln);
  free(h);
  free(dummy);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  float fwd[20] = {0}, bwd[20] = {0};
  for (int r = 0; r < runs + 1; r++) {
    CK(cudaEventRecord(e0, 0));
    rf_attention_tc_forward(y, lse, q, k, v, B, T, nh, nkv, hd, 0);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    if (r) CK(cudaEventElapsedTime(&fwd[r - 1], e0, e1));
    CK(cudaEventRecord(e0, 0));
    rf_attention_tc_backward(dq, dk, dv, dy, y, lse, q, k, v, B, T, nh, nkv, hd, dd, 0);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    if (r) CK(cudaEventElapsedTime(&bwd[r - 1], e0, e1));
  }
  qsort(fwd, runs, sizeof fwd[0], cmp_float);
  qsort(bwd, runs, sizeof bwd[0], cmp_float);
  double flops = 2.0 * B * nh * (double)T * T * hd; /* causal: half of 4 B nh T^2 hd */
  struct cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf(
      "timing on %s: attention tc 8x2048, 32 heads on 8 of 64: forward %.3f ms (%.1f TFLOP/s), backward %.3f "
      "ms "
      "(%.1f TFLOP/s at 2.5x the forward's FLOPs), median of %d\n",
      prop.name, fwd[runs / 2], flops / (fwd[runs / 2] * 1e-3) / 1e12, bwd[runs / 2],
      2.5 * flops / (bwd[runs / 2] * 1e-3) / 1e12, runs);
  CK(cudaFree(q));
  CK(cudaFree(k));
  CK(cudaFree(v));
  CK(cudaFree(dy));
  CK(cudaFree(y));
  CK(cudaFree(lse));
  CK(cudaFree(dq));
  CK(cudaFree(dk));
  CK(cudaFree(dv));
  CK(cudaFree(dd));
}
#endif

int main(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("no CUDA device\n");
    return 2;
  }
  RF_CHECK(rf_attention_tc_supports(64) && rf_attention_tc_supports(128) && !rf_attention_tc_supports(48),
           "head dims taken");
  static const int shapes[][5] = {
      {1, 1, 2, 2, 64},  {2, 63, 4, 2, 64},   {1, 64, 4, 1, 128},
      {2, 65, 4, 2, 32}, {1, 130, 2, 2, 128}, {1, 200, 4, 2, 64},
  };
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    check(shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3], shapes[s][4]);
#ifndef RF_CUDA_EMU
  timing(); /* on a GPU only: the stand-in's times say nothing */
#endif
  return rf_test_finish("test_attention_tc");
}
