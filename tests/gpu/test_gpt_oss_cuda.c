/* GPU test (scripts/gpu-check on a GPU; make BACKEND=cuda-emu runs it on the CPU stand-in,
 * tests/test_cuda_emu_gpt_oss.c): GPT-OSS's entries of the CUDA kernel table
 * (src/model/gpt_oss_cuda.cu through rf_model_kernels_cuda) against the host table (ops.c) on
 * the same random inputs: attention with sinks and a sliding window, forward and backward with
 * the sinks' gradient; the clamped SwiGLU on interleaved gate and up; the experts' weight
 * transpose (f32 and bf16) and the gradient's transpose-add.
 *
 * Tolerances, in units of u = 2^-24 (f32's unit roundoff), and why:
 *   - 0 (the same bits): the clamped SwiGLU forward and backward, both transposes: the kernels do
 *     the host's operations in its order with round-to-nearest intrinsics and ops.c's exp
 *     polynomial (gcc -std=c11 contracts no FMA on the host);
 *   - attention: a reduction of n terms in another order differs by at most about n u of the
 *     sum of the terms' magnitudes (Higham, ch. 4): max |got - ref| over max |ref| within
 *     8 (n + hd) u + 32 u (the exp), n the keys a row sees (min(T, window)), as
 *     test_kernels_cuda's attention; the backward (two chained reductions) twice that;
 *   - the sinks' gradient: both sides sum the same f64 terms (but for the GPU's f64 exp, within
 *     an ulp of f64) in other orders, so the f64 sums agree to about rows x 2^-53 of the
 *     terms' magnitudes; rounding that to f32 and subtracting it from dsinks round twice:
 *     within 4 u of |dsinks| + |sum| (an ulp of each) plus rows 2^-50 of the terms' magnitudes;
 *   - rows that see a single key (T = 1, window 1): their dS = P (1 - P) dP is a cancellation of
 *     dP - D, terms of the inputs' size (1), so dq and dk are measured against 1 there.
 * Every device output the op overwrites is prefilled with NaN (an element not written fails);
 * dsinks and transpose_add's dst, which they add into, with the host's prefill.
 * Cases: window < T (32 of 100: whole tiles skipped; 5 of 129: not tile-aligned), window 0
 * (every earlier key), window 1 (a row sees itself and the sink), window > T, T = 1, batch 2,
 * GQA (4 heads on 2 and on 1 kv head) and plain, head_dim 16, 32, 64 and 96, sinks from -6 to 8
 * (one dominating its rows' softmax) and none (dsinks untouched); the SwiGLU at GPT-OSS's limit 7
 * and at 1.2 with inputs up to 10 (most clamped), inputs exactly at +-limit (the gradient
 * passes), a NaN gate (ops.c's select makes it limit), and 1100001 pairs (past the grid's
 * 4096 x 256 threads: the grid-stride loop goes round); transposes 70 x 100, 33 x 65 (bf16),
 * 1 x 40 and 40000 x 3 (1250 tile rows: the blocks go round); zero sizes write nothing (the
 * calls of an expert without tokens). */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "device/device.h"
#include "gpu/gpu_test.h"
#include "model/config.h"
#include "model/kernels.h"
#include "model/ops.h"
#include "rf_test.h"

#define U RF_GPU_U

/* Every launch names a stream (the CUDA table refuses NULL): one blocking stream, so that the
 * cudaMemcpy reads on the legacy stream wait for its kernels. */
static struct rf_device_stream ks_stream;
#define KS (&ks_stream)

static uint64_t g_rng = 20261203;
static const struct rf_model_kernels *H = &rf_model_kernels_host, *D = &rf_model_kernels_cuda;

/* ---- attention with sinks and a window ---- */

static void test_attention_sink(int b, int t, int nh, int nkv, int hd, int window, int with_sinks) {
  size_t nq = (size_t)b * t * nh * hd, nk = (size_t)b * t * nkv * hd, nl = (size_t)b * nh * t;
  float *q = rf_test_rand_buf(&g_rng, nq, 2.0f), *k = rf_test_rand_buf(&g_rng, nk, 2.0f),
        *v = rf_test_rand_buf(&g_rng, nk, 1.0f), *dy = rf_test_rand_buf(&g_rng, nq, 1.0f);
  float *sinks = rf_test_rand_buf(&g_rng, (size_t)nh, 3.0f),
        *dsinks = rf_test_rand_buf(&g_rng, (size_t)nh, 1.0f);
  sinks[0] = 8.0f; /* dominates its rows (their scores are a few units) */
  if (nh > 1) sinks[nh - 1] = -6.0f;
  float *y = rf_xmalloc(nq * 4), *lse = rf_xmalloc(nl * 4);
  float *dq = rf_xmalloc(nq * 4), *dk = rf_xmalloc(nk * 4), *dv = rf_xmalloc(nk * 4);
  float *d_q = rf_gpu_dput(q, nq * 4), *d_k = rf_gpu_dput(k, nk * 4), *d_v = rf_gpu_dput(v, nk * 4),
        *d_dy = rf_gpu_dput(dy, nq * 4);
  float *d_sinks = rf_gpu_dput(sinks, (size_t)nh * 4), *d_dsinks = rf_gpu_dput(dsinks, (size_t)nh * 4);
  float *d_y = rf_gpu_dnan(nq), *d_lse = rf_gpu_dnan(nl), *d_dq = rf_gpu_dnan(nq), *d_dk = rf_gpu_dnan(nk),
        *d_dv = rf_gpu_dnan(nk);
  struct rf_model_config c;
  memset(&c, 0, sizeof c);
  c.hidden_size = nh * hd, c.intermediate_size = nh * hd, c.num_attention_heads = nh,
  c.num_key_value_heads = nkv;
  c.head_dim = hd, c.vocab_size = 8, c.num_hidden_layers = 1, c.max_position_embeddings = t;
  size_t hb = H->scratch_bytes(&c, b, t), db = D->scratch_bytes(&c, b, t);
  void *hs = rf_xmalloc(hb), *ds = rf_gpu_dalloc(db);
  const float *hsk = with_sinks ? sinks : NULL, *dsk = with_sinks ? d_sinks : NULL;
  H->attention_sink_forward(y, lse, q, k, v, hsk, window, b, t, nh, nkv, hd, hs, hb, KS);
  D->attention_sink_forward(d_y, d_lse, d_q, d_k, d_v, dsk, window, b, t, nh, nkv, hd, ds, db, KS);
  int seen = window > 0 && window < t ? window : t;
  double tol = 8.0 * (seen + hd) + 32.0;
  char what[128];
  snprintf(what, sizeof what, "sink attention y B=%d T=%d h=%d/%d hd=%d w=%d%s", b, t, nh, nkv, hd, window,
           with_sinks ? " sinks" : "");
  rf_gpu_check_rel_scaled(what, d_y, y, nq, tol, 0.0);
  rf_gpu_check_rel_scaled("sink attention lse", d_lse, lse, nl, tol, 0.0);
  /* the backward from the host's forward (y, lse), compared alone */
  RF_GPU_CK(cudaMemcpy(d_y, y, nq * 4, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  float *dsinks_ref = rf_xmalloc((size_t)nh * 4);
  memcpy(dsinks_ref, dsinks, (size_t)nh * 4);
  H->attention_sink_backward(dq, dk, dv, dsinks_ref, dy, y, lse, q, k, v, hsk, window, b, t, nh, nkv, hd, hs,
                             hb, KS);
  D->attention_sink_backward(d_dq, d_dk, d_dv, d_dsinks, d_dy, d_y, d_lse, d_q, d_k, d_v, dsk, window, b, t,
                             nh, nkv, hd, ds, db, KS);
  /* rows that see one key: dS = P (dP - D) with D = P dP, so dS = P (1 - P) dP (0 without a sink):
   * a cancellation of terms of the inputs' size (1), which both sides round; measured against 1 */
  double zs = t == 1 || window == 1 ? 1.0 : 0.0;
  rf_gpu_check_rel_scaled("sink attention backward dq", d_dq, dq, nq, 2 * tol, zs);
  rf_gpu_check_rel_scaled("sink attention backward dk", d_dk, dk, nk, 2 * tol, zs);
  rf_gpu_check_rel_scaled("sink attention backward dv", d_dv, dv, nk, 2 * tol, 0.0);
  /* dsinks: the bound of the header, from the terms' magnitudes (brute force) */
  float *got = rf_gpu_dget(d_dsinks, (size_t)nh);
  int ok = 1;
  double worst = 0.0;
  for (int h = 0; h < nh; h++) {
    if (!with_sinks) { /* untouched */
      ok &= rf_f32_bits(got[h]) == rf_f32_bits(dsinks[h]);
      continue;
    }
    double sum = 0.0, mag = 0.0;
    for (int bb = 0; bb < b; bb++)
      for (int i = 0; i < t; i++) {
        size_t off = ((size_t)bb * t + i) * nh * hd + (size_t)h * hd;
        double dot = 0.0;
        for (int cc = 0; cc < hd; cc++) dot += (double)y[off + cc] * dy[off + cc];
        double term = exp((double)sinks[h] - lse[((size_t)bb * nh + h) * t + i]) * dot;
        sum += term;
        mag += fabs(term);
      }
    double bound = 4 * U * (fabs(dsinks_ref[h]) + fabs(sum)) + (double)b * t * 0x1p-50 * mag;
    double err = fabs((double)got[h] - dsinks_ref[h]);
    worst = err / bound > worst ? err / bound : worst;
    ok &= err <= bound;
  }
  printf("  %-52s n=%-8d %s (worst %.2f of its bound)\n", "sink attention backward dsinks", nh,
         with_sinks ? "within" : "untouched", worst);
  RF_CHECK(ok, "dsinks: %s", with_sinks ? "outside the bound" : "written without sinks");
  free(got);
  free(hs), RF_GPU_CK(cudaFree(ds));
  free(q), free(k), free(v), free(dy), free(y), free(lse), free(dq), free(dk), free(dv), free(sinks),
      free(dsinks), free(dsinks_ref);
  RF_GPU_CK(cudaFree(d_q)), RF_GPU_CK(cudaFree(d_k)), RF_GPU_CK(cudaFree(d_v)), RF_GPU_CK(cudaFree(d_dy)),
      RF_GPU_CK(cudaFree(d_y)), RF_GPU_CK(cudaFree(d_lse)), RF_GPU_CK(cudaFree(d_dq)),
      RF_GPU_CK(cudaFree(d_dk)), RF_GPU_CK(cudaFree(d_dv)), RF_GPU_CK(cudaFree(d_sinks)),
      RF_GPU_CK(cudaFree(d_dsinks));
}

/* ---- the clamped SwiGLU ---- */

static void test_swiglu_clamp(size_t n, float alpha, float limit, float scale) {
  float *gu = rf_test_rand_buf(&g_rng, 2 * n, scale), *dh = rf_test_rand_buf(&g_rng, n, 1.0f);
  size_t hits = 0;
  if (n >= 8) { /* the bounds themselves (the gradient passes), and a NaN gate (ops.c: limit) */
    gu[0] = limit, gu[1] = -limit, gu[2] = -limit, gu[3] = limit, gu[4] = NAN, gu[6] = -100.0f;
  }
  for (size_t i = 0; i < n; i++)
    hits += !(gu[2 * i] <= limit) + (gu[2 * i + 1] < -limit || gu[2 * i + 1] > limit);
  float *h = rf_xmalloc(n * 4 + 4), *dgu = rf_xmalloc(2 * n * 4 + 4);
  float *d_gu = rf_gpu_dput(gu, 2 * n * 4), *d_dh = rf_gpu_dput(dh, n * 4), *d_h = rf_gpu_dnan(n),
        *d_dgu = rf_gpu_dnan(2 * n);
  H->swiglu_clamp_forward(h, gu, n, alpha, limit, KS);
  D->swiglu_clamp_forward(d_h, d_gu, n, alpha, limit, KS);
  char what[128];
  snprintf(what, sizeof what, "clamped swiglu n=%zu alpha %.3g limit %.3g (%zu clamped)", n, alpha, limit,
           hits);
  rf_gpu_check_bits(what, d_h, h, n);
  H->swiglu_clamp_backward(dgu, dh, gu, n, alpha, limit, KS);
  D->swiglu_clamp_backward(d_dgu, d_dh, d_gu, n, alpha, limit, KS);
  rf_gpu_check_bits("clamped swiglu backward dgu", d_dgu, dgu, 2 * n);
  RF_CHECK(n < 1000 || hits > n / 10, "the inputs hit the clamp (%zu of %zu)", hits, n);
  free(gu), free(dh), free(h), free(dgu);
  RF_GPU_CK(cudaFree(d_gu)), RF_GPU_CK(cudaFree(d_dh)), RF_GPU_CK(cudaFree(d_h)), RF_GPU_CK(cudaFree(d_dgu));
}

/* ---- transposes ---- */

static void test_transpose(int rows, int cols, int bf16) {
  size_t n = (size_t)rows * cols;
  float *w = rf_test_rand_buf(&g_rng, n, 1.0f), *acc = rf_test_rand_buf(&g_rng, n, 1.0f),
        *src = rf_test_rand_buf(&g_rng, n, 1.0f);
  uint16_t *wb = rf_xmalloc(n * 2 + 2);
  for (size_t i = 0; i < n; i++) wb[i] = rf_bf16_from_f32(w[i]);
  float *dst = rf_xmalloc(n * 4 + 4);
  float *d_w = rf_gpu_dput(w, n * 4), *d_dst = rf_gpu_dnan(n), *d_acc = rf_gpu_dput(acc, n * 4),
        *d_src = rf_gpu_dput(src, n * 4);
  uint16_t *d_wb = rf_gpu_dput(wb, n * 2);
  struct rf_model_weight hw = {0}, dw = {0};
  if (bf16)
    hw.bf16 = wb, dw.bf16 = d_wb;
  else
    hw.f32 = w, dw.f32 = d_w;
  H->weight_transpose(dst, &hw, rows, cols, KS);
  D->weight_transpose(d_dst, &dw, rows, cols, KS);
  char what[128];
  snprintf(what, sizeof what, "weight transpose %d x %d %s", rows, cols, bf16 ? "bf16" : "f32");
  rf_gpu_check_bits(what, d_dst, dst, n);
  H->transpose_add(acc, src, rows, cols, KS);
  D->transpose_add(d_acc, d_src, rows, cols, KS);
  snprintf(what, sizeof what, "transpose add %d x %d", rows, cols);
  rf_gpu_check_bits(what, d_acc, acc, n);
  free(w), free(acc), free(src), free(wb), free(dst);
  RF_GPU_CK(cudaFree(d_w)), RF_GPU_CK(cudaFree(d_dst)), RF_GPU_CK(cudaFree(d_acc)),
      RF_GPU_CK(cudaFree(d_src)), RF_GPU_CK(cudaFree(d_wb));
}

/* An expert without tokens: its zero-size calls write nothing (NaN sentinels stay NaN). */
static void test_empty(void) {
  float *d_a = rf_gpu_dnan(64), *d_b = rf_gpu_dnan(64);
  struct rf_model_weight dw = {.f32 = d_b};
  D->swiglu_clamp_forward(d_a, d_b, 0, 1.702f, 7.0f, KS);
  D->swiglu_clamp_backward(d_a, d_b, d_b, 0, 1.702f, 7.0f, KS);
  D->weight_transpose(d_a, &dw, 0, 8, KS);
  D->weight_transpose(d_a, &dw, 8, 0, KS);
  D->transpose_add(d_a, d_b, 0, 8, KS);
  rf_gpu_check_untouched("zero rows (an expert without tokens)", d_a, 64);
  RF_GPU_CK(cudaFree(d_a)), RF_GPU_CK(cudaFree(d_b));
}

int main(void) {
  if (rf_gpu_test_begin("test_gpt_oss_cuda", &ks_stream) != 0) return 1;
  RF_CHECK(D->attention_sink_forward && D->attention_sink_backward && D->swiglu_clamp_forward &&
               D->swiglu_clamp_backward && D->weight_transpose && D->transpose_add,
           "the CUDA table has GPT-OSS's entries");
  test_attention_sink(1, 100, 4, 2, 64, 32, 1); /* window < T: whole tiles outside it */
  test_attention_sink(2, 70, 4, 1, 64, 0, 1);   /* window 0, GQA 4 on 1, batch 2 */
  test_attention_sink(1, 129, 2, 2, 32, 5, 1);  /* a window not aligned to the tiles */
  test_attention_sink(1, 50, 4, 2, 16, 128, 1); /* window > T; the tiny model's head_dim */
  test_attention_sink(1, 40, 4, 2, 96, 0, 0);   /* no sinks: dsinks untouched; lanes masked */
  test_attention_sink(1, 40, 2, 1, 64, 7, 0);   /* a window without sinks */
  test_attention_sink(1, 1, 2, 1, 64, 4, 1);    /* T = 1 */
  test_attention_sink(1, 64, 2, 1, 64, 1, 1);   /* window 1: each row its own key and the sink */
  test_swiglu_clamp(1000, 1.702f, 7.0f, 10.0f);
  test_swiglu_clamp(1100001, 1.702f, 1.2f, 3.0f);
  test_transpose(70, 100, 0);
  test_transpose(33, 65, 1);
  test_transpose(1, 40, 0);
  test_transpose(40000, 3, 0);
  test_empty();
  return rf_test_finish("test_gpt_oss_cuda");
}
