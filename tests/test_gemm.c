/* rf-test: timeout=120
 * src/gemm against a naive triple loop in double: every transpose combination,
 * padded leading dimensions (the attention products read heads out of [T, heads*hd]
 * rows), alpha, accumulation, both operand dtypes, the shapes the model uses; the
 * products run from inside an OpenMP parallel region (one per thread, as attention
 * does) and from two host threads at once (each its own product, 300 times); a second
 * run of a shape creates no primitive and allocates nothing.
 *
 * Tolerance: with operands exactly representable (bf16 operands are rounded
 * first, the reference uses the rounded values), each product a*b is exact in f32
 * and the error is the f32 summation's: |c - ref| <= gamma_k * sum_k |a||b| with
 * gamma_k = k u / (1 - k u), u = 2^-24 (f32 unit roundoff), plus one rounding of
 * the result and of the accumulated C (2u relative). The check uses that bound. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "rf_test.h"

#ifdef _OPENMP
#include <omp.h>
#endif

struct case_ {
  struct rf_gemm_desc d;
  void *a, *b;
  float *c, *c0; /* result and its initial value */
  double *ref, *bound;
};

static float round_to(enum rf_dtype dt, float x) {
  return dt == RF_DTYPE_BF16 ? rf_f32_from_bf16(rf_bf16_from_f32(x)) : x;
}

static float elem(const struct case_ *c, const void *p, size_t i) {
  return c->d.dtype == RF_DTYPE_BF16 ? rf_f32_from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Operand storage rows x ld with random values, padding NaN (must not be read). */
static void *operand(enum rf_dtype dt, int rows, int cols, int ld, uint64_t *rng) {
  size_t n = (size_t)rows * ld;
  void *p = rf_xaligned(64, (size_t)rf_round_up((int64_t)(n * rf_dtype_size(dt)), 64));
  for (int r = 0; r < rows; r++)
    for (int j = 0; j < ld; j++) {
      float x = j < cols ? rf_test_rand_f32(rng) : NAN;
      size_t i = (size_t)r * ld + j;
      if (dt == RF_DTYPE_BF16)
        ((uint16_t *)p)[i] = rf_bf16_from_f32(x);
      else
        ((float *)p)[i] = round_to(dt, x);
    }
  return p;
}

static void case_init(struct case_ *c, const struct rf_gemm_desc *d, uint64_t seed) {
  uint64_t rng = seed;
  c->d = *d;
  int ar = d->trans_a ? d->k : d->m, ac = d->trans_a ? d->m : d->k;
  int br = d->trans_b ? d->n : d->k, bc = d->trans_b ? d->k : d->n;
  c->a = operand(d->dtype, ar, ac, d->lda, &rng);
  c->b = operand(d->dtype, br, bc, d->ldb, &rng);
  size_t nc = (size_t)d->m * d->ldc;
  c->c = rf_xmalloc(nc * sizeof(float));
  c->c0 = rf_xmalloc(nc * sizeof(float));
  for (size_t i = 0; i < nc; i++)
    c->c0[i] = (i % (size_t)d->ldc) < (size_t)d->n ? rf_test_rand_f32(&rng) : -7.0f;
  memcpy(c->c, c->c0, nc * sizeof(float));
  c->ref = rf_xmalloc((size_t)d->m * d->n * sizeof(double));
  c->bound = rf_xmalloc((size_t)d->m * d->n * sizeof(double));
  for (int i = 0; i < d->m; i++)
    for (int j = 0; j < d->n; j++) {
      double s = 0.0, sa = 0.0;
      for (int k = 0; k < d->k; k++) {
        double x = elem(c, c->a, d->trans_a ? (size_t)k * d->lda + i : (size_t)i * d->lda + k);
        double y = elem(c, c->b, d->trans_b ? (size_t)j * d->ldb + k : (size_t)k * d->ldb + j);
        s += x * y;
        sa += fabs(x * y);
      }
      double prev = d->beta != 0.0f ? d->beta * c->c0[(size_t)i * d->ldc + j] : 0.0;
      double u = 0x1.0p-24, g = d->k * u / (1.0 - d->k * u);
      c->ref[(size_t)i * d->n + j] = d->alpha * s + prev;
      c->bound[(size_t)i * d->n + j] =
          (g * fabs((double)d->alpha) * sa + 2 * u * (fabs((double)d->alpha * s) + fabs(prev))) * 1.01;
    }
}

static void case_free(struct case_ *c) {
  free(c->a);
  free(c->b);
  free(c->c);
  free(c->c0);
  free(c->ref);
  free(c->bound);
}

/* Fails on any element outside its bound (NaN included) or a touched pad. */
static int case_check(const struct case_ *c, const char *what) {
  const struct rf_gemm_desc *d = &c->d;
  int bad = 0;
  for (int i = 0; i < d->m; i++)
    for (int j = 0; j < d->ldc; j++) {
      double got = c->c[(size_t)i * d->ldc + j];
      if (j >= d->n) {
        bad += got != -7.0;
        continue;
      }
      double err = fabs(got - c->ref[(size_t)i * d->n + j]);
      if (!(err <= c->bound[(size_t)i * d->n + j])) {
        if (!bad)
          RF_CHECK(
              0,
              "%s %s m=%d n=%d k=%d ta=%d tb=%d ld=%d,%d,%d alpha=%g beta=%g: [%d,%d] = %.9g, expected %.9g",
              what, rf_dtype_name(d->dtype), d->m, d->n, d->k, d->trans_a, d->trans_b, d->lda, d->ldb, d->ldc,
              d->alpha, d->beta, i, j, got, c->ref[(size_t)i * d->n + j]);
        bad++;
      }
    }
  RF_CHECK(bad == 0, "%s: %d elements wrong or padding written", what, bad);
  return bad;
}

static struct rf_gemm_desc desc(int m, int n, int k, int ta, int tb, int pad, enum rf_dtype dt, float alpha,
                                float beta) {
  struct rf_gemm_desc d = {
      .m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb, .dtype = dt, .alpha = alpha, .beta = beta};
  d.lda = (ta ? m : k) + pad;
  d.ldb = (tb ? k : n) + pad;
  d.ldc = n + pad;
  return d;
}

/* Every transpose/padding/alpha/beta combination on odd sizes. */
static void check_combinations(void) {
  enum rf_dtype dts[] = {RF_DTYPE_F32, RF_DTYPE_BF16};
  int shapes[][3] = {{7, 5, 3}, {33, 17, 65}, {64, 128, 64}, {1, 9, 40}};
  int n = 0;
  for (int s = 0; s < 4; s++)
    for (int dt = 0; dt < 2; dt++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int pad = 0; pad < 2; pad++)
            for (int bi = 0; bi < 3; bi++) {
              const float betas[] = {0.0f, 1.0f, -0.75f}; /* Muon's Newton-Schulz scales C */
              float beta = betas[bi], alpha = bi ? 1.0f : (pad ? 0.125f : 1.0f);
              struct rf_gemm_desc d =
                  desc(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, pad * 11, dts[dt], alpha, beta);
              struct case_ c;
              case_init(&c, &d, 1000 + (uint64_t)n++);
              rf_gemm_run(&d, c.a, c.b, c.c);
              case_check(&c, "combination");
              case_free(&c);
            }
}

/* The model's products (LLaMA with hidden 64, 4 heads of 16, 2 kv heads, inter 96,
 * vocab 80, 3 x 20 tokens; attention blocks of 64 query rows over T = 96):
 * linear forward X W^T, backward dX = dY W and dW += dY^T X, and attention's
 * S = scale Q K^T, Y = P V, dP = dY V^T, dV += P^T dY, dQ = dS K, dK += dS^T Q with
 * Q, K, V, dY read as heads of 16 columns out of rows of 64 or 32. */
static void check_model_shapes(void) {
  const int n = 60, h = 64, inter = 96, v = 80, qs = 64, ks = 32, hd = 16, rows = 64, cols = 96;
  struct rf_gemm_desc ds[] = {
      /* linear (forward, dX, dW accumulated) for in/out = h/h, h/inter, inter/h, h/v */
      {n, h, h, 0, 1, h, h, h, RF_DTYPE_F32, 1.0f, 0.0f},
      {n, inter, h, 0, 1, h, h, inter, RF_DTYPE_F32, 1.0f, 0.0f},
      {n, h, inter, 0, 1, inter, inter, h, RF_DTYPE_F32, 1.0f, 1.0f},
      {n, v, h, 0, 1, h, h, v, RF_DTYPE_F32, 1.0f, 0.0f},
      {n, h, inter, 0, 0, inter, h, h, RF_DTYPE_F32, 1.0f, 1.0f},
      {n, h, v, 0, 0, v, h, h, RF_DTYPE_F32, 1.0f, 0.0f},
      {inter, h, n, 1, 0, inter, h, h, RF_DTYPE_F32, 1.0f, 1.0f},
      {v, h, n, 1, 0, v, h, h, RF_DTYPE_F32, 1.0f, 1.0f},
      /* attention */
      {rows, cols, hd, 0, 1, qs, ks, cols, RF_DTYPE_F32, 0.25f, 0.0f},
      {rows, hd, cols, 0, 0, cols, ks, qs, RF_DTYPE_F32, 1.0f, 0.0f},
      {rows, cols, hd, 0, 1, qs, ks, cols, RF_DTYPE_F32, 1.0f, 0.0f},
      {cols, hd, rows, 1, 0, cols, qs, ks, RF_DTYPE_F32, 1.0f, 1.0f},
      {rows, hd, cols, 0, 0, cols, ks, qs, RF_DTYPE_F32, 1.0f, 0.0f},
      {cols, hd, rows, 1, 0, cols, qs, ks, RF_DTYPE_F32, 1.0f, 1.0f},
  };
  int nd = (int)(sizeof ds / sizeof ds[0]);
  for (int dt = 0; dt < 2; dt++)
    for (int i = 0; i < nd; i++) {
      struct rf_gemm_desc d = ds[i];
      d.dtype = dt ? RF_DTYPE_BF16 : RF_DTYPE_F32;
      struct case_ c;
      case_init(&c, &d, 77 + (uint64_t)i);
      rf_gemm_run(&d, c.a, c.b, c.c);
      case_check(&c, "model shape");
      if (i == 0 && dt == 1) printf("bf16 %dx%dx%d: %s\n", d.m, d.n, d.k, rf_gemm_impl_name(&d));
      if (i == 0 && dt == 0) printf("f32 %dx%dx%d: %s\n", d.m, d.n, d.k, rf_gemm_impl_name(&d));
      case_free(&c);
    }
}

/* Attention runs one product per thread inside a parallel region, on the same
 * shapes at once: each thread's result checked. */
static void check_threads(void) {
  enum { JOBS = 8 };
  struct case_ cs[JOBS];
  for (int j = 0; j < JOBS; j++) {
    struct rf_gemm_desc d = desc(64, 96, 16, 0, 1, 48, j % 2 ? RF_DTYPE_BF16 : RF_DTYPE_F32, 0.25f, 0);
    case_init(&cs[j], &d, 500 + (uint64_t)j);
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int j = 0; j < JOBS; j++)
    for (int rep = 0; rep < 20; rep++) rf_gemm_run(&cs[j].d, cs[j].a, cs[j].b, cs[j].c);
  for (int j = 0; j < JOBS; j++) {
    case_check(&cs[j], "inside a parallel region");
    case_free(&cs[j]);
  }
}

/* Two host threads (not one OpenMP team: the main thread and a stream's worker) running the
 * same shape on their own operands at once: each gets its own product, every time. */
struct host_job {
  struct case_ *c;
  int bad;
};

static void *host_thread(void *arg) {
  struct host_job *j = arg;
  size_t bytes = (size_t)j->c->d.m * j->c->d.ldc * sizeof(float);
  float *first = rf_xmalloc(bytes);
  rf_gemm_run(&j->c->d, j->c->a, j->c->b, j->c->c);
  memcpy(first, j->c->c, bytes);
  for (int rep = 0; rep < 300; rep++) {
    rf_gemm_run(&j->c->d, j->c->a, j->c->b, j->c->c);
    j->bad += memcmp(first, j->c->c, bytes) != 0;
  }
  free(first);
  return NULL;
}

static void check_host_threads(void) {
  enum { JOBS = 2 };
  struct case_ cs[JOBS];
  struct host_job jobs[JOBS];
  pthread_t th[JOBS];
  for (int j = 0; j < JOBS; j++) {
    struct rf_gemm_desc d = desc(96, 80, 72, 0, 1, 0, RF_DTYPE_F32, 1.0f, 0.0f);
    case_init(&cs[j], &d, 700 + (uint64_t)j);
    jobs[j] = (struct host_job){&cs[j], 0};
  }
  for (int j = 0; j < JOBS; j++) RF_ASSERT(pthread_create(&th[j], NULL, host_thread, &jobs[j]) == 0);
  for (int j = 0; j < JOBS; j++) pthread_join(th[j], NULL);
  for (int j = 0; j < JOBS; j++) {
    RF_CHECK(jobs[j].bad == 0, "host thread %d: %d of 300 products differ from its first", j, jobs[j].bad);
    case_check(&cs[j], "two host threads at once");
    case_free(&cs[j]);
  }
}

/* The second run of a shape creates no primitive and allocates nothing. */
static void check_cache(void) {
  struct rf_gemm_desc d = desc(40, 24, 56, 1, 0, 3, RF_DTYPE_BF16, 1.0f, 1);
  struct case_ c;
  case_init(&c, &d, 9);
  rf_gemm_run(&d, c.a, c.b, c.c);
  struct rf_gemm_stats s0 = rf_gemm_stats();
  uint64_t allocs = rf_heap_allocations();
  memcpy(c.c, c.c0, (size_t)d.m * d.ldc * sizeof(float));
  rf_gemm_run(&d, c.a, c.b, c.c);
  struct rf_gemm_stats s1 = rf_gemm_stats();
  RF_CHECK(s1.primitives == s0.primitives, "a cached shape created %lld primitives",
           (long long)(s1.primitives - s0.primitives));
  RF_CHECK(s1.products == s0.products + 1, "products counted");
  RF_CHECK(rf_heap_allocations() == allocs, "a cached shape allocated");
  case_check(&c, "cached");
  case_free(&c);
}

int main(void) {
  check_combinations();
  check_model_shapes();
  check_threads();
  check_host_threads();
  check_cache();
  return rf_test_finish("test_gemm");
}
