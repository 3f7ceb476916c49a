/* GPU test (scripts/gpu-check on a GPU; make BACKEND=cuda-emu runs it on the CPU stand-in,
 * tests/test_cuda_emu_mla.c): DeepSeek-V3's multi-head latent attention entries of the CUDA kernel
 * table (src/model/mla_cuda.cu through rf_model_kernels_cuda) against the host table (ops.c) on
 * the same random inputs: the attention with v's head dim apart from q's and k's and the scale
 * given, forward and backward; the rotary embedding of each head's rotary part (from an offset,
 * interleaved pairs and rotate_half, forward and inverse); the key and value expansion from
 * kv_b_proj's output and the rotary key every head shares, and its backward.
 *
 * Tolerances, in units of u = 2^-24 (f32's unit roundoff), and why:
 *   - 0 (the same bits): the rotary embedding (the host's operations in its order with
 *     round-to-nearest intrinsics; gcc -std=c11 contracts no FMA on the host), the expansion (a
 *     copy) and its backward (copies, and the heads' sum from 0 in head order, as ops.c's loop);
 *   - the attention: a reduction of n terms in another order differs by at most about n u of the
 *     sum of the terms' magnitudes (Higham, ch. 4); a row's scores sum hd products, its output T
 *     terms of dv columns: max |got - ref| over max |ref| within 8 (T + hd + dv) u + 32 u (the
 *     exp); the backward (two chained reductions) twice that; rows that see one key (T = 1) have
 *     dS = P (1 - P) dP = 0 up to a cancellation of terms of the inputs' size (1): dq and dk are
 *     measured against 1 there (as test_gpt_oss_cuda's).
 * Every device output the op overwrites is prefilled with NaN (an element not written fails).
 * Cases: the tiny model's head dims (nope 8 + rope 6 = 14 for q and k, v 10), DeepSeek-V3's own
 * (128 + 64 = 192, v 128: q and k on 8 lane slices, v on 4) with its YaRN scale, v wider than q
 * and k (20 and 36: other lane slices), GQA (4 heads on 2 and on 1: the host kernel has it, though
 * DeepSeek-V3 gives every head its key), batch 2, T = 1, 33, 45, 70, 100 (not multiples of the
 * 32-row tiles) and 64; the rotary part at offsets 8 and 128 of heads of 14 and 192, the shared
 * key's single head of 6, every pair order and direction, and the plain rope_apply (the same
 * kernel: stride = rd, offset 0); the expansion at the tiny shape, DeepSeek-V3's (16 heads of 128
 * + 64, v 128), one row of one head; zero rows write nothing; the table's scratch for a low rank
 * wider than the rest (below). */
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

/* Every launch names a stream (the CUDA table refuses NULL): one blocking stream, so that the
 * cudaMemcpy reads on the legacy stream wait for its kernels. */
static struct rf_device_stream ks_stream;
#define KS (&ks_stream)

static uint64_t g_rng = 20261204;
static const struct rf_model_kernels *H = &rf_model_kernels_host, *D = &rf_model_kernels_cuda;

/* ---- the attention ---- */

static void test_attention(int b, int t, int nh, int nkv, int hd, int dv, float scale) {
  size_t nq = (size_t)b * t * nh * hd, nk = (size_t)b * t * nkv * hd, nv = (size_t)b * t * nkv * dv;
  size_t ny = (size_t)b * t * nh * dv, nl = (size_t)b * nh * t;
  float *q = rf_test_rand_buf(&g_rng, nq, 2.0f), *k = rf_test_rand_buf(&g_rng, nk, 2.0f),
        *v = rf_test_rand_buf(&g_rng, nv, 1.0f), *dy = rf_test_rand_buf(&g_rng, ny, 1.0f);
  float *y = rf_xmalloc(ny * 4), *lse = rf_xmalloc(nl * 4);
  float *dq = rf_xmalloc(nq * 4), *dk = rf_xmalloc(nk * 4), *dvv = rf_xmalloc(nv * 4);
  float *d_q = rf_gpu_dput(q, nq * 4), *d_k = rf_gpu_dput(k, nk * 4), *d_v = rf_gpu_dput(v, nv * 4),
        *d_dy = rf_gpu_dput(dy, ny * 4);
  float *d_y = rf_gpu_dnan(ny), *d_lse = rf_gpu_dnan(nl), *d_dq = rf_gpu_dnan(nq), *d_dk = rf_gpu_dnan(nk),
        *d_dv = rf_gpu_dnan(nv);
  struct rf_model_config c;
  memset(&c, 0, sizeof c);
  c.hidden_size = nh * hd, c.intermediate_size = nh * hd, c.num_attention_heads = nh,
  c.num_key_value_heads = nkv;
  c.head_dim = hd, c.vocab_size = 8, c.num_hidden_layers = 1, c.max_position_embeddings = t;
  size_t hb = H->scratch_bytes(&c, b, t), db = D->scratch_bytes(&c, b, t);
  void *hs = rf_xmalloc(hb), *ds = rf_gpu_dalloc(db);
  H->mla_attention_forward(y, lse, q, k, v, b, t, nh, nkv, hd, dv, scale, hs, hb, KS);
  D->mla_attention_forward(d_y, d_lse, d_q, d_k, d_v, b, t, nh, nkv, hd, dv, scale, ds, db, KS);
  double tol = 8.0 * (t + hd + dv) + 32.0;
  char what[128];
  snprintf(what, sizeof what, "mla attention y B=%d T=%d h=%d/%d hd=%d dv=%d", b, t, nh, nkv, hd, dv);
  rf_gpu_check_rel_scaled(what, d_y, y, ny, tol, 0.0);
  rf_gpu_check_rel_scaled("mla attention lse", d_lse, lse, nl, tol, 0.0);
  /* the backward from the host's forward (y, lse), compared alone */
  RF_GPU_CK(cudaMemcpy(d_y, y, ny * 4, cudaMemcpyHostToDevice));
  RF_GPU_CK(cudaMemcpy(d_lse, lse, nl * 4, cudaMemcpyHostToDevice));
  H->mla_attention_backward(dq, dk, dvv, dy, y, lse, q, k, v, b, t, nh, nkv, hd, dv, scale, hs, hb, KS);
  D->mla_attention_backward(d_dq, d_dk, d_dv, d_dy, d_y, d_lse, d_q, d_k, d_v, b, t, nh, nkv, hd, dv, scale,
                            ds, db, KS);
  double zs = t == 1 ? 1.0 : 0.0;
  rf_gpu_check_rel_scaled("mla attention backward dq", d_dq, dq, nq, 2 * tol, zs);
  rf_gpu_check_rel_scaled("mla attention backward dk", d_dk, dk, nk, 2 * tol, zs);
  rf_gpu_check_rel_scaled("mla attention backward dv", d_dv, dvv, nv, 2 * tol, 0.0);
  free(hs), RF_GPU_CK(cudaFree(ds));
  free(q), free(k), free(v), free(dy), free(y), free(lse), free(dq), free(dk), free(dvv);
  RF_GPU_CK(cudaFree(d_q)), RF_GPU_CK(cudaFree(d_k)), RF_GPU_CK(cudaFree(d_v)), RF_GPU_CK(cudaFree(d_dy)),
      RF_GPU_CK(cudaFree(d_y)), RF_GPU_CK(cudaFree(d_lse)), RF_GPU_CK(cudaFree(d_dq)),
      RF_GPU_CK(cudaFree(d_dk)), RF_GPU_CK(cudaFree(d_dv));
}

/* ---- the rotary part of each head ---- */

/* plain: the table's rope_apply (stride = rd, offset 0, rotate_half), else mla_rope_apply. */
static void test_rope(int b, int t, int nh, int stride, int off, int rd, int interleave, int plain) {
  size_t n = (size_t)b * t * nh * stride, nt = (size_t)t * (rd / 2);
  float *x = rf_test_rand_buf(&g_rng, n, 3.0f), *cos_t = rf_xmalloc(nt * 4 + 4),
        *sin_t = rf_xmalloc(nt * 4 + 4);
  rf_model_rope_tables(cos_t, sin_t, t, rd, 10000.0);
  float *d_x = rf_gpu_dput(x, n * 4), *d_cos = rf_gpu_dput(cos_t, nt * 4),
        *d_sin = rf_gpu_dput(sin_t, nt * 4);
  char what[128];
  for (int inverse = 0; inverse <= 1; inverse++) {
    if (plain) {
      H->rope_apply(x, b, t, nh, rd, cos_t, sin_t, inverse, KS);
      D->rope_apply(d_x, b, t, nh, rd, d_cos, d_sin, inverse, KS);
      snprintf(what, sizeof what, "rope_apply B=%d T=%d h=%d hd=%d%s", b, t, nh, rd,
               inverse ? " inverse" : "");
    } else {
      H->mla_rope_apply(x, b, t, nh, stride, off, rd, cos_t, sin_t, interleave, inverse, KS);
      D->mla_rope_apply(d_x, b, t, nh, stride, off, rd, d_cos, d_sin, interleave, inverse, KS);
      snprintf(what, sizeof what, "mla rope B=%d T=%d h=%d %d of %d from %d %s%s", b, t, nh, rd, stride, off,
               interleave ? "interleaved" : "rotate_half", inverse ? " inverse" : "");
    }
    rf_gpu_check_bits(what, d_x, x, n); /* the inverse runs on the forward's output */
  }
  free(x), free(cos_t), free(sin_t);
  RF_GPU_CK(cudaFree(d_x)), RF_GPU_CK(cudaFree(d_cos)), RF_GPU_CK(cudaFree(d_sin));
}

/* ---- the key and value expansion ---- */

static void test_kv_expand(int n, int nh, int nope, int rope, int dv) {
  size_t nb = (size_t)n * nh * (nope + dv), npe = (size_t)n * rope, nk = (size_t)n * nh * (nope + rope),
         nv = (size_t)n * nh * dv;
  float *kvb = rf_test_rand_buf(&g_rng, nb, 1.0f), *kpe = rf_test_rand_buf(&g_rng, npe, 1.0f),
        *gk = rf_test_rand_buf(&g_rng, nk, 1.0f), *gv = rf_test_rand_buf(&g_rng, nv, 1.0f);
  float *k = rf_xmalloc(nk * 4 + 4), *v = rf_xmalloc(nv * 4 + 4), *gb = rf_xmalloc(nb * 4 + 4),
        *gpe = rf_xmalloc(npe * 4 + 4);
  float *d_kvb = rf_gpu_dput(kvb, nb * 4), *d_kpe = rf_gpu_dput(kpe, npe * 4),
        *d_gk = rf_gpu_dput(gk, nk * 4), *d_gv = rf_gpu_dput(gv, nv * 4);
  float *d_k = rf_gpu_dnan(nk), *d_v = rf_gpu_dnan(nv), *d_gb = rf_gpu_dnan(nb), *d_gpe = rf_gpu_dnan(npe);
  H->mla_kv_expand(k, v, kvb, kpe, n, nh, nope, rope, dv, KS);
  D->mla_kv_expand(d_k, d_v, d_kvb, d_kpe, n, nh, nope, rope, dv, KS);
  char what[128];
  snprintf(what, sizeof what, "mla kv expand k n=%d h=%d nope %d rope %d v %d", n, nh, nope, rope, dv);
  rf_gpu_check_bits(what, d_k, k, nk);
  rf_gpu_check_bits("mla kv expand v", d_v, v, nv);
  H->mla_kv_expand_backward(gb, gpe, gk, gv, n, nh, nope, rope, dv, KS);
  D->mla_kv_expand_backward(d_gb, d_gpe, d_gk, d_gv, n, nh, nope, rope, dv, KS);
  rf_gpu_check_bits("mla kv expand backward dkvb", d_gb, gb, nb);
  rf_gpu_check_bits("mla kv expand backward dkpe (the heads' sum)", d_gpe, gpe, npe);
  free(kvb), free(kpe), free(gk), free(gv), free(k), free(v), free(gb), free(gpe);
  RF_GPU_CK(cudaFree(d_kvb)), RF_GPU_CK(cudaFree(d_kpe)), RF_GPU_CK(cudaFree(d_gk)),
      RF_GPU_CK(cudaFree(d_gv)), RF_GPU_CK(cudaFree(d_k)), RF_GPU_CK(cudaFree(d_v)),
      RF_GPU_CK(cudaFree(d_gb)), RF_GPU_CK(cudaFree(d_gpe));
}

/* The CUDA table's scratch for a model whose low rank is wider than the rest (q_lora_rank 4096 over
 * hidden 64): q_a_layernorm's weight gradient (rmsnorm_backward's dw) sums its columns over chunks
 * of 256 rows in the scratch, 2 chunks x 4096 floats at 512 tokens, more than the attention's and
 * the other terms' need there. Against the host within 8 rows u + 32 u (the column sums' order). */
static void test_low_rank_scratch(void) {
  int rows = 512, dim = 4096;
  struct rf_model_config c;
  memset(&c, 0, sizeof c);
  c.hidden_size = 64, c.intermediate_size = 64, c.num_attention_heads = 2, c.num_key_value_heads = 2;
  c.head_dim = 16, c.vocab_size = 8, c.num_hidden_layers = 1, c.max_position_embeddings = rows;
  c.deepseek_v3.q_lora_rank = dim, c.deepseek_v3.kv_lora_rank = 16;
  size_t n = (size_t)rows * dim, db = D->scratch_bytes(&c, 1, rows);
  float *x = rf_test_rand_buf(&g_rng, n, 1.0f), *dout = rf_test_rand_buf(&g_rng, n, 1.0f);
  float *rstd = rf_test_rand_buf(&g_rng, (size_t)rows, 1.0f),
        *w = rf_test_rand_buf(&g_rng, (size_t)dim, 1.0f);
  float *dw = rf_test_rand_buf(&g_rng, (size_t)dim, 1.0f);
  float *d_x = rf_gpu_dput(x, n * 4), *d_dout = rf_gpu_dput(dout, n * 4),
        *d_rstd = rf_gpu_dput(rstd, rows * 4u), *d_w = rf_gpu_dput(w, dim * 4u),
        *d_dw = rf_gpu_dput(dw, dim * 4u);
  void *ds = rf_gpu_dalloc(db);
  H->rmsnorm_backward(NULL, dw, dout, x, rstd, w, rows, dim, NULL, 0, KS);
  D->rmsnorm_backward(NULL, d_dw, d_dout, d_x, d_rstd, d_w, rows, dim, ds, db, KS);
  char what[128];
  snprintf(what, sizeof what, "q_a norm dw %d x %d in scratch_bytes %zu", rows, dim, db);
  rf_gpu_check_rel_scaled(what, d_dw, dw, (size_t)dim, 8.0 * rows + 32.0, 0.0);
  free(x), free(dout), free(rstd), free(w), free(dw);
  RF_GPU_CK(cudaFree(d_x)), RF_GPU_CK(cudaFree(d_dout)), RF_GPU_CK(cudaFree(d_rstd)),
      RF_GPU_CK(cudaFree(d_w)), RF_GPU_CK(cudaFree(d_dw)), RF_GPU_CK(cudaFree(ds));
}

/* Zero rows: nothing written (NaN sentinels stay NaN). */
static void test_empty(void) {
  float *d_a = rf_gpu_dnan(64), *d_b = rf_gpu_dnan(64);
  D->mla_kv_expand(d_a, d_a, d_b, d_b, 0, 4, 8, 6, 10, KS);
  D->mla_kv_expand_backward(d_a, d_a, d_b, d_b, 0, 4, 8, 6, 10, KS);
  D->mla_rope_apply(d_a, 0, 4, 4, 14, 8, 6, d_b, d_b, 1, 0, KS);
  rf_gpu_check_untouched("zero rows", d_a, 64);
  RF_GPU_CK(cudaFree(d_a)), RF_GPU_CK(cudaFree(d_b));
}

int main(void) {
  if (rf_gpu_test_begin("test_mla_cuda", &ks_stream) != 0) return 1;
  RF_CHECK(D->mla_attention_forward && D->mla_attention_backward && D->mla_rope_apply && D->mla_kv_expand &&
               D->mla_kv_expand_backward,
           "the CUDA table has DeepSeek-V3's entries");
  /* DeepSeek-V3's scale with YaRN (factor 40: mscale 0.1 ln 40 + 1, squared) over sqrt(192) */
  float ds_scale = (float)(pow(0.1 * log(40.0) + 1.0, 2) / sqrt(192.0));
  test_attention(1, 70, 4, 4, 14, 10, 1.0f / sqrtf(14.0f)); /* the tiny model's */
  test_attention(2, 100, 2, 2, 192, 128, ds_scale);         /* DeepSeek-V3's head dims, batch 2 */
  test_attention(1, 45, 4, 2, 20, 36, 0.3f);                /* v wider than q, k; GQA 4 on 2 */
  test_attention(1, 33, 4, 1, 40, 24, 0.2f);                /* GQA 4 on 1 */
  test_attention(1, 1, 4, 4, 14, 10, 0.25f);                /* T = 1 */
  test_attention(1, 64, 2, 2, 64, 64, 0.125f);              /* dv = hd: the plain attention's shape */
  test_rope(2, 37, 4, 14, 8, 6, 1, 0);                      /* q's rotary parts, interleaved */
  test_rope(2, 37, 4, 14, 8, 6, 0, 0);                      /* rotate_half */
  test_rope(2, 37, 1, 6, 0, 6, 1, 0);                       /* the shared key: one head, all rotary */
  test_rope(1, 50, 3, 192, 128, 64, 1, 0);                  /* DeepSeek-V3's */
  test_rope(2, 33, 4, 64, 0, 64, 0, 1);                     /* the plain rope_apply */
  test_kv_expand(70, 4, 8, 6, 10);
  test_kv_expand(33, 16, 128, 64, 128);
  test_kv_expand(1, 1, 2, 4, 3);
  test_low_rank_scratch();
  test_empty();
  return rf_test_finish("test_mla_cuda");
}
