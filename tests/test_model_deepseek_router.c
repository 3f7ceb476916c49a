/* rf-test: timeout=60 */
/* DeepSeek-V3's sigmoid group-limited router (rf_model_router_group_forward/_backward,
 * src/model/moe.c) against transformers' own DeepseekV3TopkRouter: tests/ref_deepseek_router.py
 * ran it in float64 on f32 logits and biases and wrote tests/data/deepseek_router_ref.bin (five
 * cases: 4 groups keeping 2 with norm_topk_prob on and off, a bias that changes the choice of 3 of 8
 * rows, tied groups and experts, one group). The C op runs in f32:
 *   - the scores: |s - ref| <= 1u |ref| (u = 2^-24: one rounding of a sigmoid taken in double);
 *   - the chosen experts: the same indices on the rows away from ties (>= 1e-3 from one); on the rows
 *     with ties (torch.topk's choice among equal values is its own) experts of the same logit and
 *     bias, and the op's own rule: of equal groups or experts, the lower index;
 *   - the weights, matched by expert: |w - ref| <= 4u |ref| (the sigmoid, the sum and the division);
 *   - the backward on the rows away from ties against transformers' autograd gradient of
 *     sum(w * R) to the logits: max|d - ref| <= 1e-6 max|ref|, and against central finite
 *     differences of the op itself (rf_test_fd_check, h = 1e-2, <= 2e-3 of max|grad|). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "model/ops.h"
#include "rf_test.h"

#define U32 0x1.0p-24

struct rcase {
  int e, ng, tg, k, norm, n;
  float scale;
  float *logits, *bias, *r;
  int32_t *tie, *idx;
  double *w, *s, *dz;
};

static const char *take(const char **p, const char *end, size_t n) {
  RF_ASSERT(*p + n <= end);
  const char *q = *p;
  *p += n;
  return q;
}

static void *copy(const char **p, const char *end, size_t n) {
  void *v = rf_xmalloc(n ? n : 1);
  memcpy(v, take(p, end, n), n);
  return v;
}

struct router_ctx {
  const struct rcase *c;
  float *logits, *scores, *topw, *choice, *r_by_expert;
  int32_t *top;
};

/* J = sum(topw * R), R [n, E] by expert (the chosen set fixed away from ties; their rank order may
 * change under a step). */
static double router_obj(void *p) {
  struct router_ctx *x = p;
  const struct rcase *c = x->c;
  rf_model_router_group_forward(x->scores, x->top, x->topw, x->choice, x->logits, c->bias, c->n, c->e, c->ng,
                                c->tg, c->k, c->norm, c->scale);
  double j = 0;
  for (int i = 0; i < c->n * c->k; i++)
    j += (double)x->topw[i] * x->r_by_expert[(i / c->k) * c->e + x->top[i]];
  return j;
}

static void check_case(const struct rcase *c, int ci) {
  size_t ne = (size_t)c->n * c->e, nk = (size_t)c->n * c->k;
  float *scores = rf_xmalloc(ne * sizeof(float)), *topw = rf_xmalloc(nk * sizeof(float));
  float *choice = rf_xmalloc((size_t)c->e * sizeof(float));
  int32_t *top = rf_xmalloc(nk * sizeof(int32_t));
  rf_model_router_group_forward(scores, top, topw, choice, c->logits, c->bias, c->n, c->e, c->ng, c->tg, c->k,
                                c->norm, c->scale);
  double ws = 0, wm = 0;
  for (size_t i = 0; i < ne; i++) {
    double d = fabs(scores[i] - c->s[i]) / (fabs(c->s[i]) * U32);
    ws = fmax(ws, d);
  }
  RF_CHECK(ws <= 1.0, "case %d: scores %.2fu from the reference", ci, ws);
  /* R in the op's order (the reference's R is in torch's order) and the expected gradient */
  float *r = rf_xmalloc(nk * sizeof(float));
  int mismatched = 0, tie_rows = 0;
  for (int row = 0; row < c->n; row++) {
    int used[64] = {0};
    RF_ASSERT(c->k <= 64);
    tie_rows += c->tie[row] != 0;
    for (int j = 0; j < c->k; j++) {
      int e = top[row * c->k + j], m = -1;
      for (int i = 0; i < c->k && m < 0; i++) {
        int f = c->idx[row * c->k + i];
        if (!used[i] &&
            (c->tie[row] ? c->logits[row * c->e + f] == c->logits[row * c->e + e] && c->bias[f] == c->bias[e]
                         : f == e))
          m = i;
      }
      if (m < 0) {
        mismatched++;
        continue;
      }
      used[m] = 1;
      double w = c->w[row * c->k + m];
      wm = fmax(wm, fabs(topw[row * c->k + j] - w) / (fabs(w) * U32));
      r[row * c->k + j] = c->r[row * c->k + m];
    }
  }
  RF_CHECK(mismatched == 0, "case %d: %d chosen experts not transformers'", ci, mismatched);
  RF_CHECK(wm <= 4.0, "case %d: weights %.2fu from the reference", ci, wm);
  printf(
      "  case %d (E %d, %d groups keep %d, top-%d, norm %d, scale %g): experts equal (%d tie rows), "
      "scores %.2fu, weights %.2fu\n",
      ci, c->e, c->ng, c->tg, c->k, c->norm, (double)c->scale, tie_rows, ws, wm);
  if (tie_rows == 0) {
    float *dz = rf_xmalloc(ne * sizeof(float));
    rf_model_router_group_backward(dz, r, scores, top, topw, c->n, c->e, c->k, c->norm, c->scale);
    double mx = 0, md = 0;
    for (size_t i = 0; i < ne; i++) {
      mx = fmax(mx, fabs(c->dz[i]));
      md = fmax(md, fabs(dz[i] - c->dz[i]));
    }
    RF_CHECK(mx > 0 && md <= 1e-6 * mx, "case %d: d(logits) %.3g of max %.3g from autograd", ci, md, mx);
    printf("  case %d: d(logits) against autograd %.3g of max|ref| %.3g\n", ci, md / mx, mx);
    struct router_ctx x = {.c = c, .scores = scores, .topw = topw, .choice = choice, .top = top};
    x.r_by_expert = rf_xcalloc(ne, sizeof(float));
    for (size_t i = 0; i < nk; i++) x.r_by_expert[(i / c->k) * c->e + top[i]] = r[i];
    x.logits = rf_xmalloc(ne * sizeof(float));
    memcpy(x.logits, c->logits, ne * sizeof(float));
    char name[64];
    snprintf(name, sizeof name, "router_group case %d", ci);
    rf_test_fd_check(name, x.logits, ne, dz, router_obj, &x);
    free(x.logits);
    free(x.r_by_expert);
    free(dz);
  }
  free(r);
  free(scores);
  free(topw);
  free(choice);
  free(top);
}

static void test_reference(void) {
  char *buf;
  size_t len;
  RF_ASSERT(rf_file_read_all("tests/data/deepseek_router_ref.bin", &buf, &len) == 0);
  const char *p = buf, *end = buf + len;
  uint32_t hdr[3];
  memcpy(hdr, take(&p, end, sizeof hdr), sizeof hdr);
  RF_ASSERT(hdr[0] == 0x52545244u && hdr[1] == 1);
  for (uint32_t ci = 0; ci < hdr[2]; ci++) {
    struct rcase c;
    int32_t h[6];
    memcpy(h, take(&p, end, sizeof h), sizeof h);
    c.e = h[0], c.ng = h[1], c.tg = h[2], c.k = h[3], c.norm = h[4], c.n = h[5];
    memcpy(&c.scale, take(&p, end, 4), 4);
    size_t ne = (size_t)c.n * c.e, nk = (size_t)c.n * c.k;
    c.logits = copy(&p, end, ne * 4);
    c.bias = copy(&p, end, (size_t)c.e * 4);
    c.tie = copy(&p, end, (size_t)c.n * 4);
    c.idx = copy(&p, end, nk * 4);
    c.w = copy(&p, end, nk * 8);
    c.s = copy(&p, end, ne * 8);
    c.r = copy(&p, end, nk * 4);
    c.dz = copy(&p, end, ne * 8);
    check_case(&c, (int)ci);
    void *bufs[] = {c.logits, c.bias, c.tie, c.idx, c.w, c.s, c.r, c.dz};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
  }
  RF_ASSERT(p == end);
  free(buf);
}

/* The op's own tie rule on equal values: of equal groups the lower, of equal experts the lower. */
static void test_tie_rule(void) {
  /* 3 groups of 2 with the same values, keep 2 of them, top-3: groups 0 and 1, then experts 0, 3
   * (the 0.5s) and 1 (the lower 0.2) */
  const float z[6] = {0.5f, 0.2f, 0.2f, 0.5f, 0.5f, 0.2f};
  float s[6], w[3], ch[6];
  int32_t top[3];
  rf_model_router_group_forward(s, top, w, ch, z, NULL, 1, 6, 3, 2, 3, 1, 1.0f);
  RF_CHECK(top[0] == 0 && top[1] == 3 && top[2] == 1, "ties: chose %d %d %d, not 0 3 1", top[0], top[1],
           top[2]);
  /* an expert of a dropped group never chosen even when its biased score is the best but its group's
   * sum loses: group 0 {3.0, -3.0} sums lower than group 1 {0.6, 0.6} */
  const float z2[4] = {0.0f, 0.0f, 0.0f, 0.0f}, b2[4] = {3.0f, -3.0f, 0.6f, 0.6f};
  rf_model_router_group_forward(s, top, w, ch, z2, b2, 1, 4, 2, 1, 1, 0, 2.0f);
  RF_CHECK(top[0] == 2 && w[0] == 1.0f, "dropped group: chose %d (weight %g), not 2 (1)", top[0],
           (double)w[0]);
  printf("  ties to the lower group and expert; a dropped group's best expert not chosen\n");
}

int main(void) {
  printf("deepseek_v3's router against transformers' DeepseekV3TopkRouter:\n");
  test_reference();
  test_tie_rule();
  return rf_test_finish("test_model_deepseek_router");
}
