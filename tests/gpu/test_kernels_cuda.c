/* GPU test (run by scripts/gpu-check, built by make BACKEND=cuda): the CUDA kernel
 * table (src/model/kernels_cuda.cu, its attention in attention_cuda.cu) and the fused AdamW
 * (src/optim/adamw_cuda.cu) against the host: every entry of rf_model_kernels_cuda on the same random inputs
 * as rf_model_kernels_host (the ops of ops.c), the AdamW kernel against
 * rf_optim_step of a host AdamW over 5 steps. make BACKEND=cuda-emu builds it over the
 * CPU stand-in (tests/gpu/emu), where tests/test_cuda_emu_kernels.c runs it in make
 * test with every shape below; the stand-in skips only the timing table (RF_CUDA_EMU).
 *
 * Tolerances, in units of u = 2^-24 (f32's unit roundoff), and why:
 *   - 0 (the same bits): embedding forward and backward, rotary, SwiGLU, bias
 *     forward, the cross-entropy backward, AdamW: the kernels do the host's
 *     operations in the host's order with round-to-nearest intrinsics (no FMA
 *     contraction, as gcc -std=c11 compiles the host; a clang host build contracts
 *     and may differ by an ulp or two);
 *   - a reduction of n terms in another order differs by at most about n u of the
 *     sum of the terms' magnitudes (Higham, ch. 4); the checks take the largest
 *     difference over the largest |reference| and allow 8 n u: RMSNorm (n = dim),
 *     the column sums of dw and db (n = rows), attention (n = T keys + head_dim
 *     products, plus 32 u for the exp), its backward twice that (two chained
 *     reductions);
 *   - the cross-entropy's lse and the router's probabilities and weights are
 *     computed in f64 on both sides and rounded once: 2 u (the router's backward,
 *     two roundings: 4 u); the loss sum (f64): 1e-12 relative.
 * Every device output is prefilled with NaN where the op overwrites it (an element
 * not written fails) and with the host's prefill where it adds into it.
 * Attention: T = 1, 127, 128, 1000, batch 1 and 2, head_dim 32, 64, 96 (lanes
 * masked), 128, 256, GQA (4 heads on 2 and on 1 kv head) and plain. Then a timing
 * table: median of 20 runs per kernel at the 1.1B LLaMA's shape of issue 26 (8 x
 * 2048 tokens, hidden 2048, 32 heads on 8 kv heads of 64, ff 8192, vocab 32000),
 * in microseconds, naming the GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "device/device_cuda.h"
#include "gpu/gpu_test.h"
#include "gpu/gpu_timing.h"
#include "model/kernels.h"
#include "model/model.h"
#include "optim/optim.h"
#include "rf_test.h"

/* Every launch names a stream (the CUDA tables refuse NULL): one blocking stream, so that
 * the cudaMemcpy reads on the legacy stream wait for its kernels. */
static struct rf_device_stream ks_stream;
static struct rf_device ks_device; /* the stream's device: the linear layers cast through its table */
#define KS (&ks_stream)

#define U RF_GPU_U

static uint64_t g_rng = 20261128;
static const struct rf_model_kernels *H = &rf_model_kernels_host, *D = &rf_model_kernels_cuda;

static void check_rel(const char *what, const float *dgot, const float *ref, size_t n, double tol_u) {
  rf_gpu_check_rel_scaled(what, dgot, ref, n, tol_u, 0.0);
}

static struct rf_model_config config(int hidden, int inter, int nh, int nkv, int hd, int vocab, int seq) {
  struct rf_model_config c;
  memset(&c, 0, sizeof c);
  c.hidden_size = hidden, c.intermediate_size = inter, c.num_attention_heads = nh,
  c.num_key_value_heads = nkv;
  c.head_dim = hd, c.vocab_size = vocab, c.num_hidden_layers = 1, c.max_position_embeddings = seq;
  c.rms_norm_eps = 1e-5f, c.rope_theta = 10000.0;
  return c;
}

/* Host scratch and device scratch for cfg at batch x seq. */
struct scratch {
  void *h, *d;
  size_t hb, db;
};
static struct scratch scratch_make(const struct rf_model_config *c, int batch, int seq) {
  struct scratch s;
  s.hb = H->scratch_bytes(c, batch, seq);
  s.db = D->scratch_bytes(c, batch, seq);
  s.h = rf_xmalloc(s.hb);
  s.d = rf_gpu_dalloc(s.db);
  return s;
}
static void scratch_free(struct scratch *s) {
  free(s->h);
  RF_GPU_CK(cudaFree(s->d));
}

/* ---- linear layers (linear_cuda.c: cuBLASLt) and RMSNorm applied again ---- */

/* host and device stages of one compute dtype for products up to [rows, wide] and weights
 * [out, in] */
struct stages {
  struct rf_model_stage h, d;
};
static struct stages stages_make(enum rf_dtype compute, size_t rows, size_t wide, size_t out, size_t in) {
  struct stages s = {{.compute = compute}, {.compute = compute}};
  size_t act = rows * wide, wt = out * in, band = (size_t)RF_MODEL_STAGE_ROWS * in;
  s.h.act = rf_xmalloc(act * 2), s.h.act2 = rf_xmalloc(act * 2), s.h.wbf16 = rf_xmalloc(wt * 2);
  s.h.wf32 = rf_xmalloc(band * 4);
  s.d.act = rf_gpu_dalloc(act * 2), s.d.act2 = rf_gpu_dalloc(act * 2), s.d.wbf16 = rf_gpu_dalloc(wt * 2);
  s.d.wf32 = rf_gpu_dalloc(band * 4);
  return s;
}
static void stages_free(struct stages *s) {
  free(s->h.act), free(s->h.act2), free(s->h.wbf16), free(s->h.wf32);
  RF_GPU_CK(cudaFree(s->d.act)), RF_GPU_CK(cudaFree(s->d.act2)), RF_GPU_CK(cudaFree(s->d.wbf16)),
      RF_GPU_CK(cudaFree(s->d.wf32));
}

/* y = x W^T + beta y, dx = dy W + beta dx, dw += dy^T x, on [n, in] x [out, in], as the host's
 * linear ops: f32 weights in f32 compute, f32 weights in bf16 compute (rounded into the
 * stage), bf16 weights in f32 compute (widened 256 rows at a time: out > 256 crosses a band).
 * cuBLASLt sums in another order than oneDNN: within k * 4 u of max |ref| (k the summed
 * length; both sides use the same bf16-rounded operands). */
static void test_linear(int n, int in, int out, enum rf_dtype compute, int bf16_weight, float beta) {
  size_t nx = (size_t)n * in, ny = (size_t)n * out, nw = (size_t)out * in;
  float *x = rf_test_rand_buf(&g_rng, nx, 1.0f), *w = rf_test_rand_buf(&g_rng, nw, 0.5f),
        *y = rf_test_rand_buf(&g_rng, ny, 1.0f), *dy = rf_test_rand_buf(&g_rng, ny, 1.0f);
  float *dx = rf_test_rand_buf(&g_rng, nx, 1.0f), *dw = rf_test_rand_buf(&g_rng, nw, 1.0f);
  uint16_t *wb = rf_xmalloc(nw * 2);
  for (size_t i = 0; i < nw; i++) wb[i] = rf_bf16_from_f32(w[i]);
  float *d_x = rf_gpu_dput(x, nx * 4), *d_w = rf_gpu_dput(w, nw * 4), *d_y = rf_gpu_dput(y, ny * 4),
        *d_dy = rf_gpu_dput(dy, ny * 4);
  float *d_dx = rf_gpu_dput(dx, nx * 4), *d_dw = rf_gpu_dput(dw, nw * 4);
  uint16_t *d_wb = rf_gpu_dput(wb, nw * 2);
  struct rf_model_weight hw = {0}, dwt = {0};
  if (bf16_weight)
    hw.bf16 = wb, dwt.bf16 = d_wb;
  else
    hw.f32 = w, dwt.f32 = d_w;
  size_t wide = (size_t)(in > out ? in : out);
  struct stages st = stages_make(compute, (size_t)n, wide, (size_t)out, (size_t)in);
  char what[128];
  const char *form = bf16_weight ? "bf16 weight" : compute == RF_DTYPE_BF16 ? "bf16 compute" : "f32";
  H->linear_forward(y, x, &hw, n, in, out, beta, &st.h, KS);
  D->linear_forward(d_y, d_x, &dwt, n, in, out, beta, &st.d, KS);
  snprintf(what, sizeof what, "linear forward %dx%dx%d %s beta %g", n, in, out, form, (double)beta);
  check_rel(what, d_y, y, ny, 4.0 * in);
  H->linear_backward(dx, dw, dy, x, &hw, n, in, out, beta, &st.h, KS);
  D->linear_backward(d_dx, d_dw, d_dy, d_x, &dwt, n, in, out, beta, &st.d, KS);
  snprintf(what, sizeof what, "linear backward dx %s", form);
  check_rel(what, d_dx, dx, nx, 4.0 * out);
  snprintf(what, sizeof what, "linear backward dw (adds) %s", form);
  check_rel(what, d_dw, dw, nw, 4.0 * n);
  stages_free(&st);
  free(x), free(w), free(y), free(dy), free(dx), free(dw), free(wb);
  RF_GPU_CK(cudaFree(d_x)), RF_GPU_CK(cudaFree(d_w)), RF_GPU_CK(cudaFree(d_y)), RF_GPU_CK(cudaFree(d_dy)),
      RF_GPU_CK(cudaFree(d_dx)), RF_GPU_CK(cudaFree(d_dw)), RF_GPU_CK(cudaFree(d_wb));
}

static void test_rmsnorm_apply(int rows, int dim) {
  size_t n = (size_t)rows * dim;
  float *x = rf_test_rand_buf(&g_rng, n, 2.0f), *w = rf_test_rand_buf(&g_rng, dim, 1.0f),
        *rstd = rf_test_rand_buf(&g_rng, rows, 1.0f);
  float *out = rf_xmalloc(n * 4);
  float *d_x = rf_gpu_dput(x, n * 4), *d_w = rf_gpu_dput(w, (size_t)dim * 4),
        *d_r = rf_gpu_dput(rstd, (size_t)rows * 4);
  float *d_out = rf_gpu_dnan(n);
  H->rmsnorm_apply(out, x, rstd, w, rows, dim, KS);
  D->rmsnorm_apply(d_out, d_x, d_r, d_w, rows, dim, KS);
  rf_gpu_check_bits("rmsnorm apply (the backward's recomputation)", d_out, out, n);
  free(x), free(w), free(rstd), free(out);
  RF_GPU_CK(cudaFree(d_x)), RF_GPU_CK(cudaFree(d_w)), RF_GPU_CK(cudaFree(d_r)), RF_GPU_CK(cudaFree(d_out));
}

/* ---- elementwise and row ops ---- */

static void test_embedding(void) {
  const int n = 600, dim = 768, vocab = 1000;
  int32_t *tok = rf_xmalloc(sizeof(int32_t) * n);
  for (int i = 0; i < n; i++)
    tok[i] = (int32_t)(rf_test_rand_u64(&g_rng) % (i % 3 ? vocab : 5)); /* repeats */
  float *table = rf_test_rand_buf(&g_rng, (size_t)vocab * dim, 1.0f),
        *out = rf_xmalloc(sizeof(float) * n * dim);
  uint16_t *tb = rf_xmalloc(sizeof(uint16_t) * vocab * dim);
  rf_bf16_from_f32_n(tb, table, (size_t)vocab * dim);
  int32_t *dtok = rf_gpu_dput(tok, sizeof(int32_t) * n);
  float *dtable = rf_gpu_dput(table, sizeof(float) * vocab * dim), *dout = rf_gpu_dnan((size_t)n * dim);
  uint16_t *dtb = rf_gpu_dput(tb, sizeof(uint16_t) * vocab * dim);
  struct rf_model_weight hw = {.f32 = table}, dw = {.f32 = dtable}, hwb = {.bf16 = tb}, dwb = {.bf16 = dtb};
  H->embedding_forward(out, &hw, tok, n, dim, KS);
  D->embedding_forward(dout, &dw, dtok, n, dim, KS);
  rf_gpu_check_bits("embedding forward f32", dout, out, (size_t)n * dim);
  H->embedding_forward(out, &hwb, tok, n, dim, KS);
  D->embedding_forward(dout, &dwb, dtok, n, dim, KS);
  rf_gpu_check_bits("embedding forward bf16", dout, out, (size_t)n * dim);
  struct rf_model_config c = config(dim, 2 * dim, 4, 4, dim / 4, vocab, n);
  struct scratch s = scratch_make(&c, 1, n);
  float *g = rf_test_rand_buf(&g_rng, (size_t)n * dim, 1.0f);
  float *dg = rf_gpu_dput(g, sizeof(float) * n * dim);
  H->embedding_backward(table, g, tok, n, dim, s.h, s.hb, KS); /* adds into the table's values */
  D->embedding_backward(dtable, dg, dtok, n, dim, s.d, s.db, KS);
  rf_gpu_check_bits("embedding backward (adds, repeated tokens)", dtable, table, (size_t)vocab * dim);
  scratch_free(&s);
  free(tok), free(table), free(out), free(tb), free(g);
  RF_GPU_CK(cudaFree(dtok)), RF_GPU_CK(cudaFree(dtable)), RF_GPU_CK(cudaFree(dout)), RF_GPU_CK(cudaFree(dtb)),
      RF_GPU_CK(cudaFree(dg));
}

static void test_rmsnorm(int rows, int dim) {
  size_t n = (size_t)rows * dim;
  float *x = rf_test_rand_buf(&g_rng, n, 2.0f), *w = rf_test_rand_buf(&g_rng, dim, 1.0f),
        *out = rf_xmalloc(n * sizeof(float));
  float *rstd = rf_xmalloc(sizeof(float) * rows);
  float *dx_ = rf_gpu_dput(x, n * 4), *dw_ = rf_gpu_dput(w, (size_t)dim * 4), *dout = rf_gpu_dnan(n),
        *drstd = rf_gpu_dnan((size_t)rows);
  H->rmsnorm_forward(out, rstd, x, w, rows, dim, 1e-5f, KS);
  D->rmsnorm_forward(dout, drstd, dx_, dw_, rows, dim, 1e-5f, KS);
  char what[96];
  snprintf(what, sizeof what, "rmsnorm forward %dx%d", rows, dim);
  check_rel(what, dout, out, n, 8.0 * dim);
  check_rel("rmsnorm forward rstd", drstd, rstd, (size_t)rows, 8.0 * dim);
  float *g = rf_test_rand_buf(&g_rng, n, 1.0f), *gx = rf_test_rand_buf(&g_rng, n, 1.0f),
        *gw = rf_test_rand_buf(&g_rng, dim, 1.0f);
  float *dg = rf_gpu_dput(g, n * 4), *dgx = rf_gpu_dput(gx, n * 4), *dgw = rf_gpu_dput(gw, (size_t)dim * 4);
  struct rf_model_config c = config(dim, dim, 1, 1, dim, 8, rows);
  struct scratch s = scratch_make(&c, 1, rows);
  /* the device's rstd is the host's (copied) so that the backward is compared
   * alone */
  RF_GPU_CK(cudaMemcpy(drstd, rstd, sizeof(float) * rows, cudaMemcpyHostToDevice));
  H->rmsnorm_backward(gx, gw, g, x, rstd, w, rows, dim, s.h, s.hb, KS);
  D->rmsnorm_backward(dgx, dgw, dg, dx_, drstd, dw_, rows, dim, s.d, s.db, KS);
  check_rel("rmsnorm backward dx (adds)", dgx, gx, n, 8.0 * dim);
  check_rel("rmsnorm backward dw (adds, column sums)", dgw, gw, (size_t)dim, 8.0 * rows);
  scratch_free(&s);
  free(x), free(w), free(out), free(rstd), free(g), free(gx), free(gw);
  RF_GPU_CK(cudaFree(dx_)), RF_GPU_CK(cudaFree(dw_)), RF_GPU_CK(cudaFree(dout)), RF_GPU_CK(cudaFree(drstd)),
      RF_GPU_CK(cudaFree(dg)), RF_GPU_CK(cudaFree(dgx)), RF_GPU_CK(cudaFree(dgw));
}

static void test_rope(void) {
  const int b = 2, t = 300, nh = 4, hd = 64;
  size_t n = (size_t)b * t * nh * hd;
  float *cos_t = rf_xmalloc(sizeof(float) * t * hd / 2), *sin_t = rf_xmalloc(sizeof(float) * t * hd / 2);
  rf_model_rope_tables(cos_t, sin_t, t, hd, 10000.0);
  float *dc = rf_gpu_dput(cos_t, sizeof(float) * t * hd / 2),
        *ds = rf_gpu_dput(sin_t, sizeof(float) * t * hd / 2);
  for (int inverse = 0; inverse < 2; inverse++) {
    float *x = rf_test_rand_buf(&g_rng, n, 1.0f);
    float *dx = rf_gpu_dput(x, n * 4);
    H->rope_apply(x, b, t, nh, hd, cos_t, sin_t, inverse, KS);
    D->rope_apply(dx, b, t, nh, hd, dc, ds, inverse, KS);
    rf_gpu_check_bits(inverse ? "rope inverse" : "rope", dx, x, n);
    free(x);
    RF_GPU_CK(cudaFree(dx));
  }
  free(cos_t), free(sin_t);
  RF_GPU_CK(cudaFree(dc)), RF_GPU_CK(cudaFree(ds));
}

static void test_swiglu_bias(void) {
  const int rows = 300, cols = 2048;
  size_t n = (size_t)rows * cols;
  float *g = rf_test_rand_buf(&g_rng, n, 6.0f), *u = rf_test_rand_buf(&g_rng, n, 1.0f),
        *dh = rf_test_rand_buf(&g_rng, n, 1.0f), *h = rf_xmalloc(n * 4);
  g[0] = 100.0f, g[1] = -100.0f; /* exp's clamps */
  float *dgp = rf_gpu_dput(g, n * 4), *dup_ = rf_gpu_dput(u, n * 4), *ddh = rf_gpu_dput(dh, n * 4),
        *dh_out = rf_gpu_dnan(n);
  H->swiglu_forward(h, g, u, n, KS);
  D->swiglu_forward(dh_out, dgp, dup_, n, KS);
  rf_gpu_check_bits("swiglu forward", dh_out, h, n);
  float *dgate = rf_xmalloc(n * 4), *dupo = rf_xmalloc(n * 4);
  float *d_dgate = rf_gpu_dnan(n), *d_dup = rf_gpu_dnan(n);
  H->swiglu_backward(dgate, dupo, dh, g, u, n, KS);
  D->swiglu_backward(d_dgate, d_dup, ddh, dgp, dup_, n, KS);
  rf_gpu_check_bits("swiglu backward dgate", d_dgate, dgate, n);
  rf_gpu_check_bits("swiglu backward dup", d_dup, dupo, n);
  float *bias = rf_test_rand_buf(&g_rng, cols, 1.0f);
  float *dbias = rf_gpu_dput(bias, (size_t)cols * 4), *dy = rf_gpu_dput(h, n * 4);
  H->bias_forward(h, bias, rows, cols, KS);
  D->bias_forward(dy, dbias, rows, cols, KS);
  rf_gpu_check_bits("bias forward (adds)", dy, h, n);
  struct rf_model_config c = config(cols, cols, 1, 1, cols, 8, rows);
  struct scratch s = scratch_make(&c, 1, rows);
  H->bias_backward(bias, dh, rows, cols, s.h, s.hb, KS);
  D->bias_backward(dbias, ddh, rows, cols, s.d, s.db, KS);
  check_rel("bias backward (adds, column sums)", dbias, bias, (size_t)cols, 8.0 * rows);
  scratch_free(&s);
  free(g), free(u), free(dh), free(h), free(dgate), free(dupo), free(bias);
  RF_GPU_CK(cudaFree(dgp)), RF_GPU_CK(cudaFree(dup_)), RF_GPU_CK(cudaFree(ddh)), RF_GPU_CK(cudaFree(dh_out)),
      RF_GPU_CK(cudaFree(d_dgate)), RF_GPU_CK(cudaFree(d_dup)), RF_GPU_CK(cudaFree(dbias)),
      RF_GPU_CK(cudaFree(dy));
}

static void test_cross_entropy(int rows, int vocab) {
  size_t n = (size_t)rows * vocab;
  float *z = rf_test_rand_buf(&g_rng, n, 8.0f), *lse = rf_xmalloc(sizeof(float) * rows);
  int32_t *t = rf_xmalloc(sizeof(int32_t) * rows);
  for (int i = 0; i < rows; i++) t[i] = i % 5 == 2 ? -1 : (int32_t)(rf_test_rand_u64(&g_rng) % vocab);
  float *dz = rf_gpu_dput(z, n * 4), *dlse = rf_gpu_dnan((size_t)rows);
  int32_t *dt = rf_gpu_dput(t, sizeof(int32_t) * rows);
  double *dloss = rf_gpu_dalloc(sizeof(double));
  struct rf_model_config c = config(64, 64, 1, 1, 64, vocab, rows);
  struct scratch s = scratch_make(&c, 1, rows);
  double loss = 0.0, dev_loss = 0.0;
  H->cross_entropy_forward(&loss, lse, z, t, rows, vocab, s.h, s.hb, KS);
  D->cross_entropy_forward(dloss, dlse, dz, dt, rows, vocab, s.d, s.db, KS);
  RF_GPU_CK(cudaDeviceSynchronize());
  RF_GPU_CK(cudaMemcpy(&dev_loss, dloss, sizeof(double), cudaMemcpyDeviceToHost));
  char what[96];
  snprintf(what, sizeof what, "cross-entropy lse %d x %d", rows, vocab);
  check_rel(what, dlse, lse, (size_t)rows, 2.0);
  printf("  cross-entropy loss sum: device %.17g, host %.17g\n", dev_loss, loss);
  RF_CHECK(fabs(dev_loss - loss) <= 1e-12 * fabs(loss) && loss > 0, "cross-entropy loss %.17g, host %.17g",
           dev_loss, loss);
  /* the backward on the host's lse, so that it is compared alone */
  RF_GPU_CK(cudaMemcpy(dlse, lse, sizeof(float) * rows, cudaMemcpyHostToDevice));
  H->cross_entropy_backward(z, lse, t, rows, vocab, 1.0f / 3.0f, KS);
  D->cross_entropy_backward(dz, dlse, dt, rows, vocab, 1.0f / 3.0f, KS);
  rf_gpu_check_bits("cross-entropy backward", dz, z, n);
  scratch_free(&s);
  free(z), free(lse), free(t);
  RF_GPU_CK(cudaFree(dz)), RF_GPU_CK(cudaFree(dlse)), RF_GPU_CK(cudaFree(dt)), RF_GPU_CK(cudaFree(dloss));
}

static void test_router(int n, int ne, int topk, int renorm) {
  float *z = rf_test_rand_buf(&g_rng, (size_t)n * ne, 3.0f), *extra = rf_test_rand_buf(&g_rng, ne, 0.1f);
  float *p = rf_xmalloc(sizeof(float) * n * ne), *w = rf_xmalloc(sizeof(float) * n * topk);
  int32_t *t = rf_xmalloc(sizeof(int32_t) * n * topk), *dt_h = rf_xmalloc(sizeof(int32_t) * n * topk);
  float *dz = rf_gpu_dput(z, sizeof(float) * n * ne), *dextra = rf_gpu_dput(extra, sizeof(float) * ne);
  float *dp = rf_gpu_dnan((size_t)n * ne), *dw = rf_gpu_dnan((size_t)n * topk);
  int32_t *dt = rf_gpu_dalloc(sizeof(int32_t) * n * topk);
  H->router_forward(p, t, w, z, n, ne, topk, renorm, KS);
  D->router_forward(dp, dt, dw, dz, n, ne, topk, renorm, KS);
  char what[96];
  /* f64 on both sides, rounded once; the GPU's exp within an ulp of f64 of glibc's */
  snprintf(what, sizeof what, "router probs %d x %d top %d%s", n, ne, topk, renorm ? " renorm" : "");
  check_rel(what, dp, p, (size_t)n * ne, 2.0);
  check_rel("router weights", dw, w, (size_t)n * topk, 2.0);
  RF_GPU_CK(cudaDeviceSynchronize());
  RF_GPU_CK(cudaMemcpy(dt_h, dt, sizeof(int32_t) * n * topk, cudaMemcpyDeviceToHost));
  RF_CHECK(memcmp(dt_h, t, sizeof(int32_t) * n * topk) == 0,
           "router: the chosen experts differ from the host's");
  /* the backward on the host's forward, compared alone; prefilled with NaN (overwritten) */
  float *g = rf_test_rand_buf(&g_rng, (size_t)n * topk, 1.0f), *d = rf_xmalloc(sizeof(float) * n * ne);
  float *dg = rf_gpu_dput(g, sizeof(float) * n * topk), *dd = rf_gpu_dnan((size_t)n * ne);
  RF_GPU_CK(cudaMemcpy(dp, p, sizeof(float) * n * ne, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(dw, w, sizeof(float) * n * topk, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(dt, t, sizeof(int32_t) * n * topk, cudaMemcpyHostToDevice));
  H->router_backward(d, g, p, t, w, extra, n, ne, topk, renorm, KS);
  D->router_backward(dd, dg, dp, dt, dw, dextra, n, ne, topk, renorm, KS);
  check_rel("router backward", dd, d, (size_t)n * ne, 4.0);
  free(z), free(extra), free(p), free(w), free(t), free(dt_h), free(g), free(d);
  RF_GPU_CK(cudaFree(dz)), RF_GPU_CK(cudaFree(dextra)), RF_GPU_CK(cudaFree(dp)), RF_GPU_CK(cudaFree(dw)),
      RF_GPU_CK(cudaFree(dt)), RF_GPU_CK(cudaFree(dg)), RF_GPU_CK(cudaFree(dd));
}

/* DeepSeek-V3's group router: the chosen experts exactly the host's (ties: tie != 0 rounds the logits
 * to a few values, so groups' scores and experts tie), the scores and weights 2 u (f64, rounded once;
 * the GPU's exp within an ulp of f64 of glibc's), the backward 4 u. bias != 0: a bias that changes
 * the choice (checked: the host's choice without it differs). */
static void test_router_group(int n, int ne, int ng, int tg, int k, int renorm, int tie, int with_bias) {
  size_t nz = (size_t)n * ne, nk = (size_t)n * k;
  float *z = rf_test_rand_buf(&g_rng, nz, 3.0f), *bias = rf_test_rand_buf(&g_rng, ne, 0.5f);
  if (tie)
    for (size_t i = 0; i < nz; i++) z[i] = (float)((int)(z[i] * 2.0f)) * 0.5f;
  float *s = rf_xmalloc(sizeof(float) * nz), *w = rf_xmalloc(sizeof(float) * nk),
        *ch = rf_xmalloc(sizeof(float) * ne);
  int32_t *t = rf_xmalloc(sizeof(int32_t) * nk), *t0 = rf_xmalloc(sizeof(int32_t) * nk),
          *dt_h = rf_xmalloc(sizeof(int32_t) * nk);
  const float *hb = with_bias ? bias : NULL;
  float *dz = rf_gpu_dput(z, sizeof(float) * nz),
        *dbias = with_bias ? rf_gpu_dput(bias, sizeof(float) * ne) : NULL;
  float *ds = rf_gpu_dnan(nz), *dw = rf_gpu_dnan(nk), *dch = rf_gpu_dnan((size_t)ne);
  int32_t *dt = rf_gpu_dalloc(sizeof(int32_t) * nk);
  float scale = renorm ? 2.5f : 1.0f;
  H->router_group_forward(s, t, w, z, hb, n, ne, ng, tg, k, renorm, scale, ch, sizeof(float) * ne, KS);
  D->router_group_forward(ds, dt, dw, dz, dbias, n, ne, ng, tg, k, renorm, scale, dch, sizeof(float) * ne,
                          KS);
  if (with_bias) {
    H->router_group_forward(s, t0, w, z, NULL, n, ne, ng, tg, k, renorm, scale, ch, sizeof(float) * ne, KS);
    RF_CHECK(memcmp(t0, t, sizeof(int32_t) * nk) != 0, "group router: the bias does not change the choice");
    H->router_group_forward(s, t, w, z, hb, n, ne, ng, tg, k, renorm, scale, ch, sizeof(float) * ne, KS);
  }
  char what[128];
  snprintf(what, sizeof what, "group router scores %d x %d, %d groups keep %d, top %d%s%s%s", n, ne, ng, tg,
           k, renorm ? " renorm" : "", tie ? " ties" : "", with_bias ? " bias" : "");
  check_rel(what, ds, s, nz, 2.0);
  check_rel("group router weights", dw, w, nk, 2.0);
  RF_GPU_CK(cudaDeviceSynchronize());
  RF_GPU_CK(cudaMemcpy(dt_h, dt, sizeof(int32_t) * nk, cudaMemcpyDeviceToHost));
  RF_CHECK(memcmp(dt_h, t, sizeof(int32_t) * nk) == 0, "%s: the chosen experts differ from the host's", what);
  /* the backward on the host's forward, compared alone; prefilled with NaN (overwritten) */
  float *g = rf_test_rand_buf(&g_rng, nk, 1.0f), *d = rf_xmalloc(sizeof(float) * nz);
  float *dg = rf_gpu_dput(g, sizeof(float) * nk), *dd = rf_gpu_dnan(nz);
  RF_GPU_CK(cudaMemcpy(ds, s, sizeof(float) * nz, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(dw, w, sizeof(float) * nk, cudaMemcpyHostToDevice));
  H->router_group_backward(d, g, s, t, w, n, ne, k, renorm, scale, KS);
  D->router_group_backward(dd, dg, ds, dt, dw, n, ne, k, renorm, scale, KS);
  check_rel("group router backward", dd, d, nz, 4.0);
  free(z), free(bias), free(s), free(w), free(ch), free(t), free(t0), free(dt_h), free(g), free(d);
  RF_GPU_CK(cudaFree(dz)), RF_GPU_CK(cudaFree(ds)), RF_GPU_CK(cudaFree(dw)), RF_GPU_CK(cudaFree(dch)),
      RF_GPU_CK(cudaFree(dt)), RF_GPU_CK(cudaFree(dg)), RF_GPU_CK(cudaFree(dd));
  if (dbias) RF_GPU_CK(cudaFree(dbias));
}

/* ---- attention ---- */

static void test_attention(int b, int t, int nh, int nkv, int hd) {
  size_t nq = (size_t)b * t * nh * hd, nk = (size_t)b * t * nkv * hd, nl = (size_t)b * nh * t;
  float *q = rf_test_rand_buf(&g_rng, nq, 2.0f), *k = rf_test_rand_buf(&g_rng, nk, 2.0f),
        *v = rf_test_rand_buf(&g_rng, nk, 1.0f), *dy = rf_test_rand_buf(&g_rng, nq, 1.0f);
  float *y = rf_xmalloc(nq * 4), *lse = rf_xmalloc(nl * 4);
  float *dq = rf_xmalloc(nq * 4), *dk = rf_xmalloc(nk * 4), *dv = rf_xmalloc(nk * 4);
  float *d_q = rf_gpu_dput(q, nq * 4), *d_k = rf_gpu_dput(k, nk * 4), *d_v = rf_gpu_dput(v, nk * 4),
        *d_dy = rf_gpu_dput(dy, nq * 4);
  float *d_y = rf_gpu_dnan(nq), *d_lse = rf_gpu_dnan(nl), *d_dq = rf_gpu_dnan(nq), *d_dk = rf_gpu_dnan(nk),
        *d_dv = rf_gpu_dnan(nk);
  struct rf_model_config c = config(nh * hd, nh * hd, nh, nkv, hd, 8, t);
  struct scratch s = scratch_make(&c, b, t);
  H->attention_forward(y, lse, q, k, v, b, t, nh, nkv, hd, s.h, s.hb, KS);
  D->attention_forward(d_y, d_lse, d_q, d_k, d_v, b, t, nh, nkv, hd, s.d, s.db, KS);
  char what[96];
  double tol = 8.0 * (t + hd) + 32.0;
  snprintf(what, sizeof what, "attention y B=%d T=%d h=%d/%d hd=%d", b, t, nh, nkv, hd);
  check_rel(what, d_y, y, nq, tol);
  check_rel("attention lse", d_lse, lse, nl, tol);
  /* the backward from the host's forward (y, lse), compared alone */
  RF_GPU_CK(cudaMemcpy(d_y, y, nq * 4, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  H->attention_backward(dq, dk, dv, dy, y, lse, q, k, v, b, t, nh, nkv, hd, s.h, s.hb, KS);
  D->attention_backward(d_dq, d_dk, d_dv, d_dy, d_y, d_lse, d_q, d_k, d_v, b, t, nh, nkv, hd, s.d, s.db, KS);
  /* T = 1: dq = dk = 0 exactly (P = 1, dP = D), both sides a roundoff of dP - D
   */
  rf_gpu_check_rel_scaled("attention backward dq", d_dq, dq, nq, 2 * tol, t == 1 ? 1.0 : 0.0);
  rf_gpu_check_rel_scaled("attention backward dk", d_dk, dk, nk, 2 * tol, t == 1 ? 1.0 : 0.0);
  check_rel("attention backward dv", d_dv, dv, nk, 2 * tol);
  scratch_free(&s);
  free(q), free(k), free(v), free(dy), free(y), free(lse), free(dq), free(dk), free(dv);
  RF_GPU_CK(cudaFree(d_q)), RF_GPU_CK(cudaFree(d_k)), RF_GPU_CK(cudaFree(d_v)), RF_GPU_CK(cudaFree(d_dy)),
      RF_GPU_CK(cudaFree(d_y)), RF_GPU_CK(cudaFree(d_lse)), RF_GPU_CK(cudaFree(d_dq)),
      RF_GPU_CK(cudaFree(d_dk)), RF_GPU_CK(cudaFree(d_dv));
}

/* ---- AdamW ---- */

static void test_adamw(void) {
  const int64_t nw = 3000 * 7, nb = 777, n = nw + nb;
  float *master = rf_test_rand_buf(&g_rng, (size_t)n, 0.5f), *grad = rf_xcalloc((size_t)n, sizeof(float));
  float *dp = rf_gpu_dput(master, (size_t)n * 4), *dg = rf_gpu_dalloc((size_t)n * 4);
  float *dm = rf_gpu_dalloc((size_t)n * 4), *dv = rf_gpu_dalloc((size_t)n * 4);
  RF_GPU_CK(cudaMemset(dm, 0, (size_t)n * 4)), RF_GPU_CK(cudaMemset(dv, 0, (size_t)n * 4));
  int64_t st[2][2] = {{0, nw}, {0, nb}};
  struct rf_tensor_view views[2];
  memset(views, 0, sizeof views);
  views[0] = (struct rf_tensor_view){.name = "w",
                                     .ndim = 2,
                                     .shape = {3000, 7},
                                     .numel = nw,
                                     .block_elems = 1,
                                     .starts = st[0],
                                     .begin = 0,
                                     .end = nw,
                                     .shard_offset = 0,
                                     .master = master,
                                     .grad = grad};
  views[1] = (struct rf_tensor_view){.name = "b",
                                     .ndim = 1,
                                     .shape = {nb},
                                     .numel = nb,
                                     .block_elems = 1,
                                     .starts = st[1],
                                     .begin = 0,
                                     .end = nb,
                                     .shard_offset = nw,
                                     .master = master + nw,
                                     .grad = grad + nw};
  int flags[2] = {RF_OPTIM_FLAG_DECAY, 0};
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  struct rf_optim *o;
  RF_ASSERT(rf_optim_create(&o, &opt, views, flags, 2, n, NULL) == 0);
  for (int s = 0; s < 5; s++) {
    for (int64_t i = 0; i < n; i++) grad[i] = rf_test_rand_f32(&g_rng) * (i % 11 == 0 ? 1e-3f : 1.0f);
    RF_GPU_CK(cudaMemcpy(dg, grad, (size_t)n * 4, cudaMemcpyHostToDevice));
    float lr = 1e-2f * (float)(s + 1);
    RF_ASSERT(rf_optim_step(o, lr) == 0);
    struct rf_optim_hyper h;
    rf_optim_hyper_init(o, lr, &h); /* o->step is the step just taken */
    rf_optim_adamw_cuda_piece(&h, 1, dp, dg, dm, dv, nw, KS);
    rf_optim_adamw_cuda_piece(&h, 0, dp + nw, dg + nw, dm + nw, dv + nw, nb, KS);
  }
  struct rf_optim_state_slab m, v;
  rf_optim_state(o, 0, &m);
  rf_optim_state(o, 1, &v);
  rf_gpu_check_bits("adamw p after 5 steps (decay and not)", dp, master, (size_t)n);
  rf_gpu_check_bits("adamw m", dm, m.data, (size_t)n);
  rf_gpu_check_bits("adamw v", dv, v.data, (size_t)n);
  rf_optim_free(o);
  free(master), free(grad);
  RF_GPU_CK(cudaFree(dp)), RF_GPU_CK(cudaFree(dg)), RF_GPU_CK(cudaFree(dm)), RF_GPU_CK(cudaFree(dv));
}

/* ---- timing ---- */

#define REPS RF_GPU_TIMING_REPS

/* The median of REPS runs of what (one call of fn(ctx)), in microseconds (gpu_timing.h). */
static void timed(const char *what, void (*fn)(void *), void *ctx, double bytes) {
  rf_gpu_timed(what, fn, ctx, bytes, 0);
}

struct tctx {
  int b, t, nh, nkv, hd, hidden, inter, vocab;
  float *x, *y, *w, *dw, *rstd, *q, *k, *v, *att, *lse, *dq, *dk, *dv, *gate, *up, *h, *logits, *cs, *sn;
  float *p, *g, *m, *vv;
  int32_t *tok;
  double *loss;
  void *scratch;
  size_t scratch_bytes;
  struct rf_model_weight table;
};

static void t_embed_f(void *c_) {
  struct tctx *c = c_;
  D->embedding_forward(c->x, &c->table, c->tok, c->b * c->t, c->hidden, KS);
}
static void t_embed_b(void *c_) {
  struct tctx *c = c_;
  D->embedding_backward((float *)c->table.f32, c->y, c->tok, c->b * c->t, c->hidden, c->scratch,
                        c->scratch_bytes, KS);
}
static void t_norm_f(void *c_) {
  struct tctx *c = c_;
  D->rmsnorm_forward(c->y, c->rstd, c->x, c->w, c->b * c->t, c->hidden, 1e-5f, KS);
}
static void t_norm_b(void *c_) {
  struct tctx *c = c_;
  D->rmsnorm_backward(c->att, c->dw, c->y, c->x, c->rstd, c->w, c->b * c->t, c->hidden, c->scratch,
                      c->scratch_bytes, KS);
}
static void t_rope(void *c_) {
  struct tctx *c = c_;
  D->rope_apply(c->q, c->b, c->t, c->nh, c->hd, c->cs, c->sn, 0, KS);
}
static void t_att_f(void *c_) {
  struct tctx *c = c_;
  D->attention_forward(c->att, c->lse, c->q, c->k, c->v, c->b, c->t, c->nh, c->nkv, c->hd, c->scratch,
                       c->scratch_bytes, KS);
}
static void t_att_b(void *c_) {
  struct tctx *c = c_;
  D->attention_backward(c->dq, c->dk, c->dv, c->att, c->att, c->lse, c->q, c->k, c->v, c->b, c->t, c->nh,
                        c->nkv, c->hd, c->scratch, c->scratch_bytes, KS);
}
static void t_swiglu_f(void *c_) {
  struct tctx *c = c_;
  D->swiglu_forward(c->h, c->gate, c->up, (size_t)c->b * c->t * c->inter, KS);
}
static void t_swiglu_b(void *c_) {
  struct tctx *c = c_;
  D->swiglu_backward(c->gate, c->up, c->h, c->gate, c->up, (size_t)c->b * c->t * c->inter, KS);
}
static void t_ce_f(void *c_) {
  struct tctx *c = c_;
  D->cross_entropy_forward(c->loss, c->rstd, c->logits, c->tok, c->b * c->t, c->vocab, c->scratch,
                           c->scratch_bytes, KS);
}
static void t_ce_b(void *c_) {
  struct tctx *c = c_;
  D->cross_entropy_backward(c->logits, c->rstd, c->tok, c->b * c->t, c->vocab, 1e-4f, KS);
}
static void t_adamw(void *c_) {
  struct tctx *c = c_;
  struct rf_optim_hyper h = {.lr = 1e-4f,
                             .b1 = 0.9f,
                             .b2 = 0.95f,
                             .eps = 1e-8f,
                             .step_size = 1e-3f,
                             .bc2_sqrt = 0.5f,
                             .decay = 0.99999f,
                             .one_m_b1 = 0.1f,
                             .one_m_b2 = 0.05f};
  rf_optim_adamw_cuda_piece(&h, 1, c->p, c->g, c->m, c->vv, (int64_t)c->inter * c->hidden * 4, KS);
}

static float *dfill(size_t n, float scale) {
  float *h = rf_test_rand_buf(&g_rng, n, scale);
  float *d = rf_gpu_dput(h, n * 4);
  free(h);
  return d;
}

static void timing_table(const char *gpu) {
  struct tctx c = {
      .b = 8, .t = 2048, .nh = 32, .nkv = 8, .hd = 64, .hidden = 2048, .inter = 8192, .vocab = 32000};
  size_t n = (size_t)c.b * c.t;
  struct rf_model_config cfg = config(c.hidden, c.inter, c.nh, c.nkv, c.hd, c.vocab, c.t);
  c.scratch_bytes = D->scratch_bytes(&cfg, c.b, c.t);
  c.scratch = rf_gpu_dalloc(c.scratch_bytes);
  c.x = dfill(n * c.hidden, 1), c.y = dfill(n * c.hidden, 1), c.w = dfill((size_t)c.hidden, 1);
  c.dw = dfill((size_t)c.hidden, 1);
  c.rstd = dfill(n, 1);
  c.q = dfill(n * c.nh * c.hd, 1), c.k = dfill(n * c.nkv * c.hd, 1), c.v = dfill(n * c.nkv * c.hd, 1);
  c.att = dfill(n * c.nh * c.hd, 1), c.lse = dfill(n * c.nh, 1), c.dq = dfill(n * c.nh * c.hd, 1);
  c.dk = dfill(n * c.nkv * c.hd, 1), c.dv = dfill(n * c.nkv * c.hd, 1);
  c.gate = dfill(n * c.inter, 1), c.up = dfill(n * c.inter, 1), c.h = dfill(n * c.inter, 1);
  c.logits = dfill(n * c.vocab, 4);
  c.cs = dfill((size_t)c.t * c.hd / 2, 1), c.sn = dfill((size_t)c.t * c.hd / 2, 1);
  size_t np = (size_t)c.inter * c.hidden * 4;
  c.p = dfill(np, 1), c.g = dfill(np, 1), c.m = dfill(np, 0), c.vv = dfill(np, 0);
  RF_GPU_CK(cudaMemset(c.vv, 0, np * 4));
  c.loss = rf_gpu_dalloc(sizeof(double));
  int32_t *tok = rf_xmalloc(sizeof(int32_t) * n);
  for (size_t i = 0; i < n; i++) tok[i] = (int32_t)(rf_test_rand_u64(&g_rng) % c.vocab);
  c.tok = rf_gpu_dput(tok, sizeof(int32_t) * n);
  c.table.f32 = dfill((size_t)c.vocab * c.hidden, 1);
  printf(
      "timing on %s: median of %d runs, 8 x 2048 tokens, hidden 2048, 32/8 "
      "heads of 64, ff 8192, vocab 32000\n",
      gpu, REPS);
  double f = 4.0;
  timed("embedding forward", t_embed_f, &c, f * 2 * n * c.hidden);
  timed("embedding backward", t_embed_b, &c, f * 3 * n * c.hidden);
  timed("rmsnorm forward", t_norm_f, &c, f * 2 * n * c.hidden);
  timed("rmsnorm backward", t_norm_b, &c, f * 6 * n * c.hidden);
  timed("rope (q)", t_rope, &c, f * 2 * n * c.nh * c.hd);
  timed("attention forward", t_att_f, &c, 0);
  timed("attention backward", t_att_b, &c, 0);
  timed("swiglu forward", t_swiglu_f, &c, f * 3 * n * c.inter);
  timed("swiglu backward", t_swiglu_b, &c, f * 5 * n * c.inter);
  timed("cross-entropy forward", t_ce_f, &c, f * 2 * n * c.vocab);
  timed("cross-entropy backward", t_ce_b, &c, f * 2 * n * c.vocab);
  timed("adamw (67M elements)", t_adamw, &c, f * 7 * np);
  double att_flops = 4.0 * c.b * c.nh * c.hd * (double)c.t * (c.t + 1) / 2;
  printf("  (attention forward: %.1f GFLOP causal, the backward 2.5x that)\n", att_flops / 1e9);
  free(tok);
}

int main(void) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr,
            "test_kernels_cuda: no CUDA device (run it on a GPU "
            "machine: scripts/gpu-check)\n");
    return 1;
  }
  struct cudaDeviceProp prop;
  RF_GPU_CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t ks;
  RF_GPU_CK(cudaStreamCreate(&ks));
  ks_stream.handle = ks;
  rf_device_cuda_init(&ks_device, 0, NULL);
  ks_stream.dev = &ks_device;
  printf("test_kernels_cuda on %s (sm_%d%d, %d SMs)\n", prop.name, prop.major, prop.minor,
         prop.multiProcessorCount);
  RF_CHECK(strcmp(D->name, "cuda") == 0 && D->host_memory == 0, "the CUDA table names itself");
#ifdef RF_CUDA_EMU
  const int emu = 1; /* the CPU stand-in: a timing table would time the CPU */
#else
  const int emu = 0;
#endif
  test_embedding();
  test_rmsnorm(600, 768);
  test_rmsnorm(4 * 300, 64); /* the q/k norms' shape: a row per head */
  test_rope();
  test_swiglu_bias();
  /* vocabularies of LLaMA 2, 3 and Qwen3, and one past a multiple of the backward's
   * 256-wide chunks: the last, partial chunk (151936 = 593.5 x 256) is covered */
  test_cross_entropy(64, 32000);
  test_cross_entropy(8, 32001);
  test_cross_entropy(6, 128256);
  test_cross_entropy(4, 151936);
  test_router(1000, 8, 2, 1);                   /* Mixtral */
  test_router(300, 128, 8, 0);                  /* Qwen3-MoE without norm_topk_prob */
  test_router_group(500, 8, 4, 2, 2, 1, 0, 1);  /* DeepSeek-V3's router, small */
  test_router_group(300, 64, 8, 3, 6, 1, 0, 1); /* 8 groups of 8, keep 3, top 6 */
  test_router_group(200, 64, 8, 3, 6, 0, 0, 0); /* without norm_topk_prob, no bias */
  test_router_group(200, 16, 1, 1, 4, 1, 0, 1); /* one group */
  test_router_group(400, 64, 8, 3, 6, 1, 1, 0); /* ties among groups and experts */
  test_router_group(400, 8, 4, 2, 2, 0, 1, 1);  /* ties, bias */
  test_attention(1, 1, 4, 2, 64);
  test_attention(1, 127, 4, 2, 64);
  test_attention(2, 128, 4, 4, 128);
  test_attention(1, 1000, 4, 2, 64);
  test_attention(2, 1000, 4, 1, 128);
  test_attention(1, 200, 2, 1, 96);
  test_attention(1, 65, 2, 2, 32);
  test_attention(1, 70, 2, 1, 256);
  test_adamw();
  test_rmsnorm_apply(37, 300);
  test_linear(37, 64, 300, RF_DTYPE_F32, 0, 0.0f);
  test_linear(37, 64, 300, RF_DTYPE_F32, 0, 1.0f);
  test_linear(40, 96, 272, RF_DTYPE_BF16, 0, 1.0f);
  test_linear(24, 48, 300, RF_DTYPE_F32, 1, 0.0f);
  if (rf_test_failures == 0 && !emu) timing_table(prop.name);
  return rf_test_finish("test_kernels_cuda");
}
