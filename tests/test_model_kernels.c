/* rf-test: timeout=60 */
/* The host kernel table (src/model/kernels.h) is the host ops: every entry of
 * rf_model_kernels_host, called on the same random inputs as the op of ops.c it
 * wraps, gives the same outputs bit for bit (outputs that are added into start
 * from the same random values in both, so "adds" and "overwrites" are both seen;
 * every output is also checked to have changed, so a wrapper that does nothing
 * fails). Shapes: 2 sequences of 70 tokens (attention's 64-row blocks and a
 * partial one), 4 heads on 2 kv heads of 16, hidden 48, vocab 300, ignored
 * targets; the MoE router at 8 experts top 2 (renormalized, with an extra gradient)
 * and 5 experts top 3 (not). Also: every entry is set, and scratch_bytes covers the
 * workspace's attention scratch. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/kernels.h"
#include "model/model.h"
#include "rf_test.h"

#define B 2
#define T 70
#define NH 4
#define NKV 2
#define HD 16
#define DIM 48
#define VOCAB 300
#define N (B * T)

static uint64_t g_rng = 20261128;

static float *rand_buf(size_t n, float scale) {
  float *p = rf_xmalloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) p[i] = scale * rf_test_rand_f32(&g_rng);
  return p;
}

static float *copy_buf(const float *a, size_t n) {
  float *p = rf_xmalloc(n * sizeof(float));
  memcpy(p, a, n * sizeof(float));
  return p;
}

/* a (through the table) equals b (the op) bit for bit, and differs from before (the prefill). */
static void check_same(const char *what, const float *a, const float *b, const float *before, size_t n) {
  RF_CHECK(memcmp(a, b, n * sizeof(float)) == 0, "%s: the table's output differs from the op's", what);
  RF_CHECK(!before || memcmp(a, before, n * sizeof(float)) != 0, "%s: the output was not written", what);
  printf("  %-26s %zu floats, equal bit for bit\n", what, n);
}

static void test_entries_set(const struct rf_model_kernels *k) {
  const void *entries[] = {(const void *)k->scratch_bytes,         (const void *)k->embedding_forward,
                           (const void *)k->embedding_backward,    (const void *)k->rmsnorm_forward,
                           (const void *)k->rmsnorm_backward,      (const void *)k->rope_apply,
                           (const void *)k->attention_forward,     (const void *)k->attention_backward,
                           (const void *)k->swiglu_forward,        (const void *)k->swiglu_backward,
                           (const void *)k->bias_forward,          (const void *)k->bias_backward,
                           (const void *)k->cross_entropy_forward, (const void *)k->cross_entropy_backward,
                           (const void *)k->router_forward,        (const void *)k->router_backward};
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
    RF_CHECK(entries[i] != NULL, "entry %zu of the host table is NULL", i);
  RF_CHECK(strcmp(k->name, "host") == 0 && k->host_memory == 1, "the host table names itself");
}

static void test_embedding(const struct rf_model_kernels *k) {
  int32_t tokens[N];
  for (int i = 0; i < N; i++) tokens[i] = (int32_t)(rf_test_rand_u64(&g_rng) % 17); /* repeats */
  float *table = rand_buf((size_t)VOCAB * DIM, 1.0f);
  uint16_t *table_bf16 = rf_xmalloc(sizeof(uint16_t) * VOCAB * DIM);
  rf_bf16_from_f32_n(table_bf16, table, (size_t)VOCAB * DIM);
  struct rf_model_weight wf = {.f32 = table}, wb = {.bf16 = table_bf16};
  float *before = rand_buf((size_t)N * DIM, 1.0f);
  float *a = copy_buf(before, (size_t)N * DIM), *b = copy_buf(before, (size_t)N * DIM);
  k->embedding_forward(a, &wf, tokens, N, DIM, NULL);
  rf_model_embedding_forward(b, &wf, tokens, N, DIM);
  check_same("embedding forward f32", a, b, before, (size_t)N * DIM);
  k->embedding_forward(a, &wb, tokens, N, DIM, NULL);
  rf_model_embedding_forward(b, &wb, tokens, N, DIM);
  check_same("embedding forward bf16", a, b, NULL, (size_t)N * DIM);
  float *dout = rand_buf((size_t)N * DIM, 1.0f);
  float *da = copy_buf(table, (size_t)VOCAB * DIM), *db = copy_buf(table, (size_t)VOCAB * DIM);
  k->embedding_backward(da, dout, tokens, N, DIM, NULL, 0, NULL);
  rf_model_embedding_backward(db, dout, tokens, N, DIM);
  check_same("embedding backward", da, db, table, (size_t)VOCAB * DIM);
  free(table), free(table_bf16), free(before), free(a), free(b), free(dout), free(da), free(db);
}

static void test_rmsnorm(const struct rf_model_kernels *k) {
  float *x = rand_buf((size_t)N * DIM, 2.0f), *w = rand_buf(DIM, 1.0f),
        *before = rand_buf((size_t)N * DIM, 1.0f);
  float *oa = copy_buf(before, (size_t)N * DIM), *ob = copy_buf(before, (size_t)N * DIM);
  float ra[N], rb[N];
  k->rmsnorm_forward(oa, ra, x, w, N, DIM, 1e-5f, NULL);
  rf_model_rmsnorm_forward(ob, rb, x, w, N, DIM, 1e-5f);
  check_same("rmsnorm forward", oa, ob, before, (size_t)N * DIM);
  check_same("rmsnorm forward rstd", ra, rb, NULL, N);
  float *dout = rand_buf((size_t)N * DIM, 1.0f), *dw0 = rand_buf(DIM, 1.0f);
  float *dxa = copy_buf(before, (size_t)N * DIM), *dxb = copy_buf(before, (size_t)N * DIM);
  float *dwa = copy_buf(dw0, DIM), *dwb = copy_buf(dw0, DIM);
  k->rmsnorm_backward(dxa, dwa, dout, x, ra, w, N, DIM, NULL, 0, NULL);
  rf_model_rmsnorm_backward(dxb, dwb, dout, x, rb, w, N, DIM);
  check_same("rmsnorm backward dx", dxa, dxb, before, (size_t)N * DIM);
  check_same("rmsnorm backward dw", dwa, dwb, dw0, DIM);
  free(x), free(w), free(before), free(oa), free(ob), free(dout), free(dw0), free(dxa), free(dxb), free(dwa),
      free(dwb);
}

static void test_rope(const struct rf_model_kernels *k) {
  float cos_t[T * HD / 2], sin_t[T * HD / 2];
  rf_model_rope_tables(cos_t, sin_t, T, HD, 10000.0);
  size_t n = (size_t)N * NH * HD;
  float *x = rand_buf(n, 1.0f);
  for (int inverse = 0; inverse < 2; inverse++) {
    float *a = copy_buf(x, n), *b = copy_buf(x, n);
    k->rope_apply(a, B, T, NH, HD, cos_t, sin_t, inverse, NULL);
    rf_model_rope_apply(b, B, T, NH, HD, cos_t, sin_t, inverse);
    check_same(inverse ? "rope inverse" : "rope", a, b, x, n);
    free(a), free(b);
  }
  free(x);
}

static void test_attention(const struct rf_model_kernels *k, const struct rf_model_config *cfg) {
  size_t nq = (size_t)N * NH * HD, nk = (size_t)N * NKV * HD;
  float *q = rand_buf(nq, 1.0f), *kk = rand_buf(nk, 1.0f), *v = rand_buf(nk, 1.0f);
  size_t sb = k->scratch_bytes(cfg, B, T);
  float *scratch = rf_xmalloc(sb);
  float *ya = rand_buf(nq, 1.0f), *yb = copy_buf(ya, nq), *y0 = copy_buf(ya, nq);
  float *la = rf_xcalloc((size_t)B * NH * T, sizeof(float)),
        *lb = rf_xcalloc((size_t)B * NH * T, sizeof(float));
  k->attention_forward(ya, la, q, kk, v, B, T, NH, NKV, HD, scratch, sb, NULL);
  rf_model_attention_forward(yb, lb, q, kk, v, B, T, NH, NKV, HD, scratch,
                             (int)(sb / (sizeof(float) * 2 * RF_MODEL_ATT_BLOCK * T)));
  check_same("attention forward y", ya, yb, y0, nq);
  check_same("attention forward lse", la, lb, NULL, (size_t)B * NH * T);
  float *dy = rand_buf(nq, 1.0f);
  float *dqa = rand_buf(nq, 1.0f), *dqb = copy_buf(dqa, nq), *dq0 = copy_buf(dqa, nq);
  float *dka = rand_buf(nk, 1.0f), *dkb = copy_buf(dka, nk), *dk0 = copy_buf(dka, nk);
  float *dva = rand_buf(nk, 1.0f), *dvb = copy_buf(dva, nk), *dv0 = copy_buf(dva, nk);
  k->attention_backward(dqa, dka, dva, dy, ya, la, q, kk, v, B, T, NH, NKV, HD, scratch, sb, NULL);
  rf_model_attention_backward(dqb, dkb, dvb, dy, lb, q, kk, v, B, T, NH, NKV, HD, scratch,
                              (int)(sb / (sizeof(float) * 2 * RF_MODEL_ATT_BLOCK * T)));
  check_same("attention backward dq", dqa, dqb, dq0, nq);
  check_same("attention backward dk", dka, dkb, dk0, nk);
  check_same("attention backward dv", dva, dvb, dv0, nk);
  free(q), free(kk), free(v), free(scratch), free(ya), free(yb), free(y0), free(la), free(lb), free(dy);
  free(dqa), free(dqb), free(dq0), free(dka), free(dkb), free(dk0), free(dva), free(dvb), free(dv0);
}

static void test_swiglu_bias(const struct rf_model_kernels *k) {
  size_t n = (size_t)N * DIM;
  float *g = rand_buf(n, 3.0f), *u = rand_buf(n, 1.0f), *dh = rand_buf(n, 1.0f), *before = rand_buf(n, 1.0f);
  float *ha = copy_buf(before, n), *hb = copy_buf(before, n);
  k->swiglu_forward(ha, g, u, n, NULL);
  rf_model_swiglu_forward(hb, g, u, n);
  check_same("swiglu forward", ha, hb, before, n);
  float *dga = copy_buf(before, n), *dgb = copy_buf(before, n), *dua = copy_buf(before, n),
        *dub = copy_buf(before, n);
  k->swiglu_backward(dga, dua, dh, g, u, n, NULL);
  rf_model_swiglu_backward(dgb, dub, dh, g, u, n);
  check_same("swiglu backward dgate", dga, dgb, before, n);
  check_same("swiglu backward dup", dua, dub, before, n);
  float *bias = rand_buf(DIM, 1.0f);
  float *ya = copy_buf(before, n), *yb = copy_buf(before, n);
  k->bias_forward(ya, bias, N, DIM, NULL);
  rf_model_bias_forward(yb, bias, N, DIM);
  check_same("bias forward", ya, yb, before, n);
  float *dba = copy_buf(bias, DIM), *dbb = copy_buf(bias, DIM);
  k->bias_backward(dba, dh, N, DIM, NULL, 0, NULL);
  rf_model_bias_backward(dbb, dh, N, DIM);
  check_same("bias backward", dba, dbb, bias, DIM);
  free(g), free(u), free(dh), free(before), free(ha), free(hb), free(dga), free(dgb), free(dua), free(dub);
  free(bias), free(ya), free(yb), free(dba), free(dbb);
}

static void test_cross_entropy(const struct rf_model_kernels *k) {
  size_t n = (size_t)N * VOCAB;
  float *logits = rand_buf(n, 4.0f);
  int32_t targets[N];
  for (int i = 0; i < N; i++) targets[i] = i % 7 == 3 ? -1 : (int32_t)(rf_test_rand_u64(&g_rng) % VOCAB);
  float la[N], lb[N];
  double loss = -1.0;
  k->cross_entropy_forward(&loss, la, logits, targets, N, VOCAB, NULL, 0, NULL);
  double ref = rf_model_cross_entropy_forward(lb, logits, targets, N, VOCAB);
  RF_CHECK(loss == ref && ref > 0.0, "cross-entropy loss %.17g, the op's %.17g", loss, ref);
  check_same("cross-entropy forward lse", la, lb, NULL, N);
  k->cross_entropy_forward(&loss, la, logits, NULL, N, VOCAB, NULL, 0, NULL);
  RF_CHECK(loss == 0.0, "cross-entropy without targets: loss %g, not 0", loss);
  float *za = copy_buf(logits, n), *zb = copy_buf(logits, n);
  k->cross_entropy_backward(za, la, targets, N, VOCAB, 0.125f, NULL);
  rf_model_cross_entropy_backward(zb, lb, targets, N, VOCAB, 0.125f);
  check_same("cross-entropy backward", za, zb, logits, n);
  free(logits), free(za), free(zb);
}

static void test_router(const struct rf_model_kernels *k, int ne, int topk, int renorm) {
  float *logits = rand_buf((size_t)N * ne, 3.0f), *extra = renorm ? rand_buf(ne, 0.1f) : NULL;
  float *pa = rf_xmalloc(sizeof(float) * N * ne), *pb = rf_xmalloc(sizeof(float) * N * ne);
  float *wa = rf_xmalloc(sizeof(float) * N * topk), *wb = rf_xmalloc(sizeof(float) * N * topk);
  int32_t *ta = rf_xmalloc(sizeof(int32_t) * N * topk), *tb = rf_xmalloc(sizeof(int32_t) * N * topk);
  k->router_forward(pa, ta, wa, logits, N, ne, topk, renorm, NULL);
  rf_model_router_forward(pb, tb, wb, logits, N, ne, topk, renorm);
  check_same("router forward probs", pa, pb, NULL, (size_t)N * ne);
  check_same("router forward weights", wa, wb, NULL, (size_t)N * topk);
  RF_CHECK(memcmp(ta, tb, sizeof(int32_t) * N * topk) == 0, "router forward: the chosen experts differ");
  float *g = rand_buf((size_t)N * topk, 1.0f), *before = rand_buf((size_t)N * ne, 1.0f);
  float *da = copy_buf(before, (size_t)N * ne), *db = copy_buf(before, (size_t)N * ne);
  k->router_backward(da, g, pa, ta, wa, extra, N, ne, topk, renorm, NULL);
  rf_model_router_backward(db, g, pb, tb, wb, extra, N, ne, topk, renorm);
  check_same("router backward", da, db, before, (size_t)N * ne);
  free(logits), free(extra), free(pa), free(pb), free(wa), free(wb), free(ta), free(tb), free(g),
      free(before), free(da), free(db);
}

int main(void) {
  const struct rf_model_kernels *k = &rf_model_kernels_host;
  struct rf_model_config cfg = {0};
  cfg.hidden_size = DIM, cfg.num_attention_heads = NH, cfg.num_key_value_heads = NKV, cfg.head_dim = HD;
  cfg.intermediate_size = 2 * DIM, cfg.vocab_size = VOCAB, cfg.num_hidden_layers = 1;
  cfg.max_position_embeddings = T, cfg.rms_norm_eps = 1e-5f, cfg.rope_theta = 10000.0;
  test_entries_set(k);
  /* the host attention's blocks: one [2, RF_MODEL_ATT_BLOCK, T] slice per OpenMP thread (ops.c) */
  size_t need = sizeof(float) * (size_t)omp_get_max_threads() * 2 * RF_MODEL_ATT_BLOCK * T;
  RF_CHECK(k->scratch_bytes(&cfg, B, T) >= need, "scratch_bytes %zu < the attention's blocks %zu",
           k->scratch_bytes(&cfg, B, T), need);
  test_embedding(k);
  test_rmsnorm(k);
  test_rope(k);
  test_attention(k, &cfg);
  test_swiglu_bias(k);
  test_cross_entropy(k);
  test_router(k, 8, 2, 1);
  test_router(k, 5, 3, 0);
  return rf_test_finish("test_model_kernels");
}
