/* rf-test: timeout=60
 * The 8-bit building blocks and the optimizers in one process:
 *   - both dynamic maps: 256 strictly increasing values, 0 and 1 included,
 *     signed down to -0.993 (bitsandbytes' values are compared in test_optim_ref);
 *   - the block quantizer on blocks of many sizes and distributions (normal,
 *     magnitudes over 9 decades, zeros, constants, one spike): the scale is the
 *     exact absmax, every code is the nearest map value (brute force over 256),
 *     so the round-trip error is at most half the gap around the value times absmax;
 *   - the direct-lookup quantizer equals the binary search over the map, code for
 *     code, on both maps for: every map value and its neighbouring floats, the
 *     f32 midpoints between neighbouring codes (the ties) and 4 floats either
 *     side, the edges of every lookup bucket, zeros, subnormals, FLT_MIN,
 *     values just outside [-1, 1], huge values, infinities, NaNs, 10^6 random
 *     values in [-1.1, 1.1] and 10^6 random bit patterns; the batch quantizer
 *     (AVX-512 where built, and the portable loop) on all of them too;
 *   - tile geometry: 67 x 250 has 3 x 8 tiles, pieces cut at strips, inside a
 *     strip and inside a row give the expected block counts and cut tiles;
 *   - the AVX-512 8-bit AdamW step equals the portable one bit for bit on all those
 *     pieces (random codes and scales, zero scales, gradients with zeros, NaN,
 *     overflowing and tiny values; 4 steps);
 *   - 8-bit AdamW against f32 AdamW on a fixed noisy quadratic (curvatures over
 *     3 decades, 300 steps): at every step the losses differ by at most 1% of
 *     the initial loss, the final loss is within 10% of f32's (near the noise
 *     floor), the final parameters are within 5% of the distance f32 travelled;
 *     state memory at least 3.5x smaller;
 *   - Newton-Schulz of a tall matrix is the transpose of that of its transpose
 *     (bit for bit), and brings every singular value into (0.5, 1.5);
 *   - bad input: a piece outside the shard, Muon without a communicator, an
 *     unknown kind. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/optim.h"
#include "rf_test.h"

static void test_maps(void) {
  for (int sgn = 0; sgn < 2; sgn++) {
    const float *m = rf_optim_qmap(sgn);
    int zero = 0, one = 0, inc = 1;
    for (int i = 0; i < 256; i++) {
      zero += m[i] == 0.0f;
      one += m[i] == 1.0f;
      if (i > 0) inc &= m[i] > m[i - 1];
    }
    RF_CHECK(zero == 1 && one == 1 && inc, "map %d: zeros %d, ones %d, increasing %d", sgn, zero, one, inc);
    RF_CHECK(sgn ? fabsf(m[0] + 0.99297f) < 1e-5f : m[0] == 0.0f, "map %d starts at %g", sgn, m[0]);
    RF_CHECK(m[255] == 1.0f, "map %d ends at %g", sgn, m[255]);
  }
  RF_CHECK(rf_optim_qmap(0)[1] < 4e-7f, "smallest unsigned step %g", rf_optim_qmap(0)[1]);
}

static void test_roundtrip(void) {
  uint64_t rng = 42;
  enum { MAXN = 1024 };
  static float x[MAXN], y[MAXN];
  static uint8_t codes[MAXN];
  const int64_t sizes[] = {1, 2, 5, 31, 256, 300, 1024, 78, 1000};
  long blocks = 0, bad_nearest = 0, bad_bound = 0, bad_scale = 0;
  for (int rep = 0; rep < 60; rep++) {
    int64_t n = sizes[rep % 9];
    int dist = rep % 6;
    for (int sgn = 0; sgn < 2; sgn++) {
      for (int64_t i = 0; i < n; i++) {
        float u = rf_test_rand_f32(&rng), w = rf_test_rand_f32(&rng);
        float v = dist == 0   ? u + w                                       /* roughly normal */
                  : dist == 1 ? copysignf(powf(10.0f, -9.0f * fabsf(w)), u) /* 9 decades */
                  : dist == 2 ? 0.0f
                  : dist == 3 ? 0.37f
                  : dist == 4 ? (i == n / 2 ? 1e4f : 1e-3f * u) /* a spike */
                              : 1e-30f * u;                     /* tiny */
        x[i] = sgn ? v : fabsf(v) * fabsf(v);                   /* unsigned: v-like */
      }
      float absmax;
      rf_optim_quantize_block(sgn, x, n, codes, &absmax);
      rf_optim_dequantize_block(sgn, codes, n, absmax, y);
      float want = 0;
      for (int64_t i = 0; i < n; i++) want = fmaxf(want, fabsf(x[i]));
      bad_scale += absmax != want;
      const float *map = rf_optim_qmap(sgn);
      for (int64_t i = 0; i < n; i++) {
        float xn = absmax > 0 ? x[i] * (1.0f / absmax) : 0.0f;
        float d = fabsf(map[codes[i]] - xn);
        for (int k = 0; k < 256; k++)
          if (fabsf(map[k] - xn) < d) {
            bad_nearest++;
            break;
          }
        int c = codes[i];
        float gap = fmaxf(c > 0 ? map[c] - map[c - 1] : 0.0f, c < 255 ? map[c + 1] - map[c] : 0.0f);
        if (xn < map[0]) gap = fmaxf(gap, 2 * (map[0] - xn)); /* below -0.993: the end of the map */
        if (!(fabsf(y[i] - x[i]) <= 0.5f * gap * absmax * (1 + 1e-5f) + 1e-30f)) bad_bound++;
      }
      blocks++;
    }
  }
  RF_CHECK(bad_scale == 0 && bad_nearest == 0 && bad_bound == 0,
           "%ld blocks: %ld wrong scales, %ld codes not nearest, %ld beyond the bound", blocks, bad_scale,
           bad_nearest, bad_bound);
}

static void view_piece(struct rf_tensor_view *v, const char *name, int ndim, int64_t d0, int64_t d1,
                       int64_t b, int64_t e, float *master, float *grad) {
  memset(v, 0, sizeof *v);
  v->name = name;
  v->ndim = ndim;
  v->shape[0] = d0;
  v->shape[1] = d1;
  v->numel = ndim == 1 ? d0 : d0 * d1;
  v->block_elems = 1;
  v->begin = b;
  v->end = e;
  v->master = master;
  v->grad = grad;
}

static float f32_of_bits(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* Every float quantize_diff checked, for the batch quantizer after. */
#define QX_MAX 2200000
static float qx[QX_MAX];
static uint8_t qcodes[QX_MAX];

/* Counts the floats where the lookup and the search disagree (prints the first). */
static int64_t quantize_diff(int sgn, float x, int64_t *checked) {
  uint8_t fast = rf_optim_quantize(sgn, x), ref = rf_optim_quantize_search(sgn, x);
  RF_ASSERT(*checked < QX_MAX);
  qx[(*checked)++] = x;
  if (fast == ref) return 0;
  printf("  map %s, x = %a: lookup %d, search %d\n", sgn ? "signed" : "unsigned", (double)x, fast, ref);
  return 1;
}

static void test_quantize_exact(void) {
  for (int sgn = 0; sgn < 2; sgn++) {
    const float *map = rf_optim_qmap(sgn);
    int64_t bad = 0, checked = 0, ties = 0;
    for (int c = 0; c < 256; c++) {
      bad += quantize_diff(sgn, map[c], &checked);
      bad += quantize_diff(sgn, nextafterf(map[c], -INFINITY), &checked);
      bad += quantize_diff(sgn, nextafterf(map[c], INFINITY), &checked);
      if (c == 255) continue;
      float mid = (map[c] + map[c + 1]) / 2.0f, lo = mid, hi = mid;
      ties += map[c + 1] - mid == mid - map[c];
      bad += quantize_diff(sgn, mid, &checked);
      for (int k = 0; k < 4; k++) {
        lo = nextafterf(lo, -INFINITY);
        hi = nextafterf(hi, INFINITY);
        bad += quantize_diff(sgn, lo, &checked) + quantize_diff(sgn, hi, &checked);
      }
    }
    /* the lookup's buckets: 7 mantissa bits of every exponent, both signs */
    for (uint32_t key = 0; key <= 0x7f80; key++)
      for (uint32_t s = 0; s < 2; s++) {
        uint32_t b = (key << 16) | (s << 31);
        bad += quantize_diff(sgn, f32_of_bits(b), &checked);
        if (key > 0) bad += quantize_diff(sgn, f32_of_bits(b - 1), &checked);
      }
    const float special[] = {0.0f,
                             -0.0f,
                             FLT_TRUE_MIN,
                             -FLT_TRUE_MIN,
                             f32_of_bits(0x007fffff),
                             f32_of_bits(0x807fffff),
                             FLT_MIN,
                             -FLT_MIN,
                             1e-30f,
                             -1e-30f,
                             1.0000001f,
                             -1.0000001f,
                             1.5f,
                             -1.5f,
                             2.0f,
                             -2.0f,
                             1e30f,
                             -1e30f,
                             FLT_MAX,
                             -FLT_MAX,
                             INFINITY,
                             -INFINITY,
                             NAN,
                             -NAN,
                             f32_of_bits(0x7f800001),
                             f32_of_bits(0xffc00001)};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
      bad += quantize_diff(sgn, special[i], &checked);
    uint64_t rng = 11 + (uint64_t)sgn;
    for (int i = 0; i < 1000000; i++) {
      bad += quantize_diff(sgn, 2.2f * rf_test_rand_f32(&rng) - 1.1f, &checked);
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      bad += quantize_diff(sgn, f32_of_bits((uint32_t)(rng >> 32)), &checked);
    }
    /* the batch quantizer (AVX-512 where built, then the portable loop) on the same floats */
    for (int simd = 1; simd >= 0; simd--) {
      int was = rf_optim_simd_set(simd);
      rf_optim_quantize_scaled(sgn, qx, checked, 1.0f, qcodes);
      rf_optim_simd_set(was);
      int64_t bad_batch = 0;
      for (int64_t i = 0; i < checked; i++) bad_batch += qcodes[i] != rf_optim_quantize_search(sgn, qx[i]);
      printf("quantizer, %s map, batch (%s): %lld of %lld differ from the search\n",
             sgn ? "signed" : "unsigned", simd && rf_optim_simd_get() ? "AVX-512" : "portable",
             (long long)bad_batch, (long long)checked);
      bad += bad_batch;
    }
    printf(
        "quantizer, %s map: lookup = search on %lld floats (%lld exact ties among the midpoints), %lld "
        "differ\n",
        sgn ? "signed" : "unsigned", (long long)checked, (long long)ties, (long long)bad);
    RF_CHECK(bad == 0, "%s map: %lld floats where the lookup differs from the search",
             sgn ? "signed" : "unsigned", (long long)bad);
  }
}

/* Pieces of tensors: whole, strips, cut inside a strip and inside a row, vectors,
 * with their expected 8-bit block counts. */
static const struct {
  int ndim;
  int64_t d0, d1, b, e, count, first, cut;
} cases[] = {
    {2, 67, 250, 0, 67 * 250, 24, 0, 0},
    {2, 67, 250, 32 * 250, 64 * 250, 8, 8, 0},
    {2, 67, 250, 64 * 250, 67 * 250, 8, 16, 0},
    {2, 67, 250, 0, 40 * 250, 16, 0, 8},
    {2, 67, 250, 100, 300, 7, 0, 7},
    {1, 300, 0, 0, 300, 2, 0, 0},
    {1, 300, 0, 256, 300, 1, 1, 0},
    {2, 2, 5, 0, 10, 1, 0, 0},
    {2, 40, 1000, 0, 40 * 1000, 64, 0, 0},
    {1, 3, 0, 1, 2, 1, 0, 1},
};

static void test_tiles(void) {
  static float buf[67 * 250], gbuf[67 * 250];
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    struct rf_tensor_view v;
    view_piece(&v, "w", cases[k].ndim, cases[k].d0, cases[k].d1, cases[k].b, cases[k].e, buf, gbuf);
    if (v.numel > 67 * 250) {
      static float big[40 * 1000], gbig[40 * 1000];
      v.master = big;
      v.grad = gbig;
    }
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
    struct rf_optim *o;
    int flags = RF_OPTIM_FLAG_DECAY;
    RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, cases[k].e - cases[k].b, NULL) == 0);
    int64_t off, count, first;
    rf_optim_scales(o, 0, &off, &count, &first);
    struct rf_optim_stats st;
    rf_optim_get_stats(o, &st);
    RF_CHECK(count == cases[k].count && first == cases[k].first && st.tiles_cut == cases[k].cut,
             "case %zu: %lld blocks from %lld, %lld cut; expected %lld from %lld, %lld cut", k,
             (long long)count, (long long)first, (long long)st.tiles_cut, (long long)cases[k].count,
             (long long)cases[k].first, (long long)cases[k].cut);
    /* the whole tensor's blocks, whatever the piece: 32x32 tiles or runs of 256 */
    int64_t total = cases[k].ndim == 1 ? (cases[k].d0 + 255) / 256
                                       : ((cases[k].d0 + 31) / 32) * ((cases[k].d1 + 31) / 32);
    RF_CHECK(rf_optim_tensor_blocks(o, 0) == total, "case %zu: %lld blocks in the tensor, expected %lld", k,
             (long long)rf_optim_tensor_blocks(o, 0), (long long)total);
    rf_optim_free(o);
  }
}

/* A gradient with edge values: zeros (a whole run, then scattered), huge ones
 * (v overflows to inf, its block's v codes to 0), a NaN now and then, tiny ones. */
static void edge_grad(float *g, int64_t n, uint64_t *rng, int step) {
  for (int64_t i = 0; i < n; i++) {
    float u = rf_test_rand_f32(rng);
    g[i] = 1e-3f * u;
    if (i < 40 || (u > 0.9f && u < 0.93f)) g[i] = 0.0f;
    if (u > 0.999f) g[i] = 1e-30f;
    if (u < -0.9995f) g[i] = 3e19f;
  }
  if (n > 50 && step == 2) g[n / 2] = NAN;
}

/* The AVX-512 8-bit AdamW step equals the portable one bit for bit (parameters,
 * codes, scales) on every piece of test_tiles, from random codes and scales
 * (zeros included) over 4 steps of gradients with edge values. */
static void test_8bit_simd_exact(void) {
  if (!rf_optim_simd_get()) {
    rf_test_not_run(
        "no AVX-512 kernels in this build: the AVX-512 8-bit AdamW step against the portable one");
    return;
  }
  static float p[2][40 * 1000], g[40 * 1000];
  int64_t compared = 0, bad = 0;
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int64_t n = cases[c].e - cases[c].b;
    struct rf_tensor_view v[2];
    struct rf_optim *o[2];
    int flags = RF_OPTIM_FLAG_DECAY;
    uint64_t rng = 100 + c;
    for (int k = 0; k < 2; k++) {
      view_piece(&v[k], "w", cases[c].ndim, cases[c].d0, cases[c].d1, cases[c].b, cases[c].e, p[k], g);
      struct rf_optim_options opt;
      rf_optim_options_default(&opt);
      opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
      RF_ASSERT(rf_optim_create(&o[k], &opt, &v[k], &flags, 1, n, NULL) == 0);
    }
    for (int s = 0; s < 4; s++) {
      struct rf_optim_state_slab sl[2][4];
      for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4; i++) rf_optim_state(o[k], i, &sl[k][i]);
      if (s == 0) { /* random state, the same in both */
        for (int64_t i = 0; i < n; i++) {
          p[0][i] = p[1][i] = rf_test_rand_f32(&rng);
          for (int j = 0; j < 2; j++)
            ((uint8_t *)sl[0][j].data)[i] = ((uint8_t *)sl[1][j].data)[i] = (uint8_t)rf_test_rand_u64(&rng);
        }
        for (int j = 2; j < 4; j++)
          for (int64_t i = 0; i < sl[0][j].count; i++) {
            float x = rf_test_rand_f32(&rng);
            ((float *)sl[0][j].data)[i] = ((float *)sl[1][j].data)[i] = x < -0.8f ? 0.0f : 1e-2f * fabsf(x);
          }
      }
      edge_grad(g, n, &rng, s);
      for (int k = 0; k < 2; k++) {
        int was = rf_optim_simd_set(k == 0);
        RF_ASSERT(rf_optim_step(o[k], 1e-2f) == 0);
        rf_optim_simd_set(was);
      }
      int64_t diff = memcmp(p[0], p[1], (size_t)n * sizeof(float)) != 0;
      for (int j = 0; j < 4; j++)
        diff +=
            memcmp(sl[0][j].data, sl[1][j].data, (size_t)sl[0][j].count * (j < 2 ? 1 : sizeof(float))) != 0;
      if (diff && !bad)
        printf("  case %zu, step %d: %lld of p and the 4 state slabs differ\n", c, s, (long long)diff);
      bad += diff;
      compared += n;
    }
    for (int k = 0; k < 2; k++) rf_optim_free(o[k]);
  }
  printf("8-bit AdamW, AVX-512 vs portable kernels: %lld elements-steps over %zu pieces, %lld differ\n",
         (long long)compared, sizeof cases / sizeof cases[0], (long long)bad);
  RF_CHECK(bad == 0, "the AVX-512 8-bit step differs from the portable one (%lld slabs)", (long long)bad);
}

/* 0.5 sum h (p - t)^2 over a 96 x 80 matrix and a 300-vector. */
enum { QN = 96 * 80 + 300 };
static float qh[QN], qt[QN];

static double quad_loss(const float *p) {
  double l = 0;
  for (int i = 0; i < QN; i++) l += 0.5 * qh[i] * (double)(p[i] - qt[i]) * (p[i] - qt[i]);
  return l;
}

static void quad_run(enum rf_optim_kind kind, float *p, double *losses, int steps, int64_t *state_bytes) {
  static float g[QN];
  struct rf_tensor_view v[2];
  view_piece(&v[0], "layers.0.w", 2, 96, 80, 0, 96 * 80, p, g);
  view_piece(&v[1], "layers.0.norm", 1, 300, 0, 0, 300, p + 96 * 80, g + 96 * 80);
  v[1].shard_offset = 96 * 80;
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  opt.kind = kind;
  struct rf_optim *o;
  int flags[2] = {RF_OPTIM_FLAG_DECAY, 0}; /* the matrix decays, the norm not */
  RF_ASSERT(rf_optim_create(&o, &opt, v, flags, 2, QN, NULL) == 0);
  uint64_t rng = 7;
  for (int i = 0; i < QN; i++) p[i] = 0;
  for (int s = 0; s < steps; s++) {
    for (int i = 0; i < QN; i++) g[i] = qh[i] * (p[i] - qt[i]) + 0.05f * rf_test_rand_f32(&rng);
    rf_optim_step(o, 3e-3f);
    losses[s] = quad_loss(p);
  }
  struct rf_optim_stats st;
  rf_optim_get_stats(o, &st);
  *state_bytes = st.state_bytes;
  rf_optim_free(o);
}

static void test_8bit_vs_f32(void) {
  enum { STEPS = 300 };
  uint64_t rng = 3;
  for (int i = 0; i < QN; i++) {
    qh[i] = powf(10.0f, -3.0f * fabsf(rf_test_rand_f32(&rng)));
    qt[i] = rf_test_rand_f32(&rng);
  }
  static float p32[QN], p8[QN], zero[QN];
  static double l32[STEPS], l8[STEPS];
  int64_t b32, b8;
  quad_run(RF_OPTIM_KIND_ADAMW, p32, l32, STEPS, &b32);
  quad_run(RF_OPTIM_KIND_ADAMW8BIT, p8, l8, STEPS, &b8);
  double worst = 0, l0 = quad_loss(zero);
  for (int s = 0; s < STEPS; s++) worst = rf_test_max(worst, fabs(l8[s] - l32[s]) / l0);
  double dist = 0, travel = 0;
  for (int i = 0; i < QN; i++) {
    dist += (double)(p8[i] - p32[i]) * (p8[i] - p32[i]);
    travel += (double)p32[i] * p32[i];
  }
  dist = sqrt(dist / travel);
  printf(
      "8-bit vs f32 AdamW, %d steps: loss %.6g vs %.6g (from %.6g), max |loss diff| / initial loss %.3g, "
      "final ||p8 - p32|| / ||p32 - p0|| %.3g; state bytes %lld vs %lld (%.2fx)\n",
      STEPS, l8[STEPS - 1], l32[STEPS - 1], l0, worst, dist, (long long)b8, (long long)b32,
      (double)b32 / (double)b8);
  RF_CHECK(worst <= 0.01, "8-bit loss departs from f32 by %.3g of the initial loss", worst);
  RF_CHECK(l8[STEPS - 1] <= 1.1 * l32[STEPS - 1], "8-bit final loss %.6g vs %.6g", l8[STEPS - 1],
           l32[STEPS - 1]);
  RF_CHECK(dist <= 0.05, "8-bit parameters %.3g away from f32", dist);
  RF_CHECK((double)b32 / (double)b8 >= 3.5, "8-bit state %lld bytes vs %lld", (long long)b8, (long long)b32);
}

static void test_newton_schulz(void) {
  enum { A = 70, B = 40 };
  static float x[A * B], xt[B * A], work[2 * A * B + 2 * B * B];
  uint64_t rng = 11;
  for (int i = 0; i < A; i++)
    for (int j = 0; j < B; j++)
      xt[j * A + i] = x[i * B + j] = rf_test_rand_f32(&rng) + (i == j ? 3.0f : 0.0f);
  double f1 = rf_optim_newton_schulz(x, A, B, 5, 1e-7f, work, NULL, NULL);
  double f2 = rf_optim_newton_schulz(xt, B, A, 5, 1e-7f, work, NULL, NULL);
  long differ = 0;
  for (int i = 0; i < A; i++)
    for (int j = 0; j < B; j++) differ += x[i * B + j] != xt[j * A + i];
  RF_CHECK(differ == 0 && f1 == f2 && f1 == rf_optim_ns_flops(B, A, 5), "transpose: %ld differ", differ);
  /* singular values of x: eigenvalues of x^T x (B x B) by Jacobi-free bounds:
   * power iteration for the largest, and for the smallest on 2.25 I - x^T x. */
  static double g[B * B];
  for (int i = 0; i < B; i++)
    for (int j = 0; j < B; j++) {
      double s = 0;
      for (int k = 0; k < A; k++) s += (double)x[k * B + i] * x[k * B + j];
      g[i * B + j] = s;
    }
  double ext[2];
  for (int which = 0; which < 2; which++) {
    double v[B], w[B], lam = 0;
    for (int i = 0; i < B; i++) v[i] = 1.0 + 0.01 * i;
    for (int it = 0; it < 500; it++) {
      double nrm = 0;
      for (int i = 0; i < B; i++) {
        double s = 0;
        for (int j = 0; j < B; j++) s += (which ? -g[i * B + j] + (i == j ? 2.25 : 0) : g[i * B + j]) * v[j];
        w[i] = s;
        nrm += s * s;
      }
      nrm = sqrt(nrm);
      lam = nrm;
      for (int i = 0; i < B; i++) v[i] = w[i] / nrm;
    }
    ext[which] = which ? 2.25 - lam : lam;
  }
  double smax = sqrt(ext[0]), smin = sqrt(fmax(ext[1], 0));
  printf("Newton-Schulz 70x40: singular values in [%.3f, %.3f]\n", smin, smax);
  RF_CHECK(smin > 0.5 && smax < 1.5, "singular values [%.3f, %.3f]", smin, smax);
}

static void test_errors(void) {
  float p[8] = {0}, g[8] = {0};
  struct rf_tensor_view v;
  view_piece(&v, "w", 2, 2, 4, 0, 8, p, g);
  v.shard_offset = 4;
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  struct rf_optim *o;
  int flags = RF_OPTIM_FLAG_DECAY;
  RF_CHECK(
      rf_optim_create(&o, &opt, &v, &flags, 1, 8, NULL) == -1 && strstr(rf_error_msg(), "outside the shard"),
      "piece outside the shard: %s", rf_error_msg());
  RF_CHECK(rf_optim_create(&o, &opt, &v, NULL, 1, 8, NULL) == -1 && strstr(rf_error_msg(), "flags"),
           "no groups given: %s", rf_error_msg());
  view_piece(&v, "bias", 1, 8, 0, 0, 8, p, g);
  flags = RF_OPTIM_FLAG_MATRIX;
  opt.kind = RF_OPTIM_KIND_MUON;
  RF_CHECK(rf_optim_create(&o, &opt, &v, &flags, 1, 8, NULL) == -1 && strstr(rf_error_msg(), "communicator"),
           "muon without comm: %s", rf_error_msg());
  /* a layout that promises 32-row strips whole but hands out a piece cutting one */
  static float bp[67 * 250], bg[67 * 250];
  view_piece(&v, "w", 2, 67, 250, 0, 40 * 250, bp, bg);
  v.block_elems = 32 * 250;
  opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
  flags = RF_OPTIM_FLAG_DECAY;
  RF_CHECK(rf_optim_create(&o, &opt, &v, &flags, 1, 67 * 250, NULL) == -1 && strstr(rf_error_msg(), "cuts 8"),
           "a cut block where the layout keeps blocks whole: %s", rf_error_msg());
  enum rf_optim_kind k;
  RF_CHECK(rf_optim_kind_parse("adam", &k) == -1 && strstr(rf_error_msg(), "adam"), "kind parse");
  RF_CHECK(rf_optim_kind_parse("adamw8bit", &k) == 0 && k == RF_OPTIM_KIND_ADAMW8BIT, "kind parse");
}

int main(void) {
  test_maps();
  test_roundtrip();
  test_quantize_exact();
  test_tiles();
  test_8bit_simd_exact();
  test_8bit_vs_f32();
  test_newton_schulz();
  test_errors();
  return rf_test_finish("test_optim_quant");
}
