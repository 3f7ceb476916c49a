/* GPU test (built by make BACKEND=cuda, run by scripts/gpu-check; on the CPU stand-in by
 * tests/test_cuda_emu_fused.c): the optimizers' CUDA steps against the host optimizer.
 *
 * 8-bit AdamW (src/optim/adamw8bit_cuda.cu, the CUDA backend's adamw8bit_step): an optimizer
 * made on the CUDA device (rf_optim_create_on) and one on the host over the same views and
 * values, 6 steps with new gradients each, then the parameters, the m and v codes and the
 * scales compared bit for bit (tolerance 0: the kernel runs the host's operations in its order
 * with round-to-nearest intrinsics, and the absmax and codes are exact functions of them).
 * The shard: a 70 x 100 matrix cut by the piece [1234, 5678) (tiles of 32 x 32 cut at both
 * ends, a last strip of 6 rows, a last tile 4 wide), a vector of 1000 cut at [100, 777), a
 * 64 x 96 matrix whole, a 3-D tensor (2 x 40 x 33, cols 33) whole, zero-length pieces first,
 * between and last, 5 elements of padding between pieces (never touched: the whole slabs are
 * compared, padding included), a 32 x 32 tile whose gradient is 0 at every step (absmax 0),
 * gradients spanning 1e-6..1 (codes at both ends of the maps).
 * The clip factor (rf_optim.gscale, as rf_optim_step_fsdp_launch hands it: host memory for the
 * host optimizer, device memory for the kernel): none at steps 1 and 2, 0.37 at step 3 (every
 * gradient multiplied by it), NaN at step 4 (a non-finite norm: the host optimizer changes nothing,
 * checked against a copy taken before, and neither does the kernel), 1 at step 5, 2^-3 at step 6.
 *
 * Muon's element-wise kernels (src/optim/muon_cuda.cu, the backend's muon_momentum and muon_apply)
 * against muon.c's host loops written out here (its pack and unpack: buf.lerp_(g, 1 - mu), the
 * update g.lerp(buf, mu) with Nesterov or buf without; p (1 - lr wd) - alr u), bit for bit, with
 * Nesterov on and off, 3 steps each of 100003 elements and of 2200001 (past 8192 blocks of 256:
 * the grid-stride loop goes round): the momentum buffer and the update after every step, the
 * parameters after every update.
 *
 * Newton-Schulz on the device (src/optim/newton_schulz_cuda.c, the backend's muon_newton_schulz)
 * against the host's rf_optim_newton_schulz (oneDNN) on the same matrices, Muon's 5 steps: wide
 * (64 x 96), tall (96 x 64: the transposes), square (48 x 48), odd (33 x 200, 200 x 33: buffers
 * not multiples of 4 floats), tiny (1 x 7) and a zero matrix (eps: stays 0). Bound: the two run
 * the same f32 operations in other orders of summation (cuBLASLt's and the device's sum of
 * squares against oneDNN's and a serial one), each product's error a few u = 2^-24 of its
 * magnitude; the output's entries are below 1 and 5 steps amplify a perturbation by a small
 * factor: the largest difference of an entry is required within 2^-16 = 256 u (measured on the
 * stand-in: at most 6.7e-7, about 11 u; printed). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/core.h"
#include "optim/optim.h"
#include "rf_test.h"

extern const struct rf_backend rf_backend_cuda;

static uint64_t g_rng = 20261203;

#define NV 7

static void check_same(const char *what, const void *dev_bytes, const void *host, size_t bytes,
                       struct rf_device *dev, struct rf_device_stream *st) {
  unsigned char *got = rf_xmalloc(bytes ? bytes : 1);
  rf_device_copy(dev, got, dev_bytes, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, st);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < bytes; i++)
    if (got[i] != ((const unsigned char *)host)[i] && bad++ == 0) first = i;
  RF_CHECK(bad == 0, "%s: %zu of %zu bytes differ from the host's (first at byte %zu)", what, bad, bytes,
           first);
  if (bad == 0) printf("%s: the host's bits (%zu bytes)\n", what, bytes);
  free(got);
}

static void test_adamw8bit(void) {
  struct rf_device dev;
  rf_backend_open(&rf_backend_cuda, &dev, 0, NULL);
  struct rf_device_stream *st = rf_device_stream_create(&dev);
  /* name, shape, piece [b, e), whole blocks */
  struct {
    const char *name;
    int ndim;
    int64_t shape[3], b, e;
    int whole;
  } spec[NV] = {
      {"z0", 2, {40, 40, 0}, 0, 0, 0},        {"w", 2, {70, 100, 0}, 1234, 5678, 0},
      {"bias", 1, {1000, 0, 0}, 100, 777, 0}, {"z1", 1, {300, 0, 0}, 50, 50, 0},
      {"e", 2, {64, 96, 0}, 0, 64 * 96, 1},   {"t3", 3, {2, 40, 33}, 0, 2 * 40 * 33, 1},
      {"z2", 2, {10, 10, 0}, 100, 100, 0},
  };
  struct rf_tensor_view hv[NV], dv[NV];
  int flags[NV];
  int64_t starts[NV][2], off[NV], shard = 5;
  for (int i = 0; i < NV; i++) {
    off[i] = shard;
    shard += spec[i].e - spec[i].b + 5;
  }
  float *hp = rf_xmalloc((size_t)shard * sizeof(float)), *hg = rf_xcalloc((size_t)shard, sizeof(float));
  for (int64_t i = 0; i < shard; i++) hp[i] = 0.5f * rf_test_rand_f32(&g_rng);
  float *dp = rf_device_alloc(&dev, (size_t)shard * sizeof(float), 64);
  float *dg = rf_device_alloc(&dev, (size_t)shard * sizeof(float), 64);
  rf_device_copy(&dev, dp, hp, (size_t)shard * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, st);
  for (int i = 0; i < NV; i++) {
    int64_t numel = 1;
    for (int d = 0; d < spec[i].ndim; d++) numel *= spec[i].shape[d];
    starts[i][0] = spec[i].b;
    starts[i][1] = spec[i].e;
    hv[i] = (struct rf_tensor_view){.name = spec[i].name,
                                    .ndim = spec[i].ndim,
                                    .numel = numel,
                                    .block_elems = spec[i].whole ? numel : 1,
                                    .starts = starts[i],
                                    .begin = spec[i].b,
                                    .end = spec[i].e,
                                    .shard_offset = off[i],
                                    .master = hp + off[i],
                                    .grad = hg + off[i]};
    for (int d = 0; d < spec[i].ndim; d++) hv[i].shape[d] = spec[i].shape[d];
    dv[i] = hv[i];
    dv[i].master = dp + off[i];
    dv[i].grad = dg + off[i];
    flags[i] = spec[i].ndim >= 2 ? RF_OPTIM_FLAG_DECAY : 0;
  }
  struct rf_optim_options opt;
  rf_optim_options_default(&opt);
  opt.kind = RF_OPTIM_KIND_ADAMW8BIT;
  struct rf_optim *ho = NULL, *go = NULL;
  RF_ASSERT(rf_optim_create(&ho, &opt, hv, flags, NV, shard, NULL) == 0);
  int rc = rf_optim_create_on(&go, &opt, dv, flags, NV, shard, NULL, &dev, st);
  RF_CHECK(rc == 0, "8-bit AdamW on the CUDA device: %s", rf_error_msg());
  if (rc != 0) return;
  static const float factors[6] = {0.0f, 0.0f, 0.37f, NAN, 1.0f, 0x1p-3f}; /* 0: none (NULL) */
  float *dfac = rf_device_alloc(&dev, sizeof(float), 64), hfac = 1.0f;
  float *before = rf_xmalloc((size_t)shard * sizeof(float));
  uint8_t *codes_before = rf_xmalloc((size_t)shard);
  for (int s = 0; s < 6; s++) {
    for (int64_t i = 0; i < shard; i++) {
      float mag = i % 7 == 0 ? 1e-6f : i % 5 == 0 ? 1e-3f : 1.0f;
      hg[i] = rf_test_rand_f32(&g_rng) * mag;
    }
    /* the first full tile of "e" (rows 0..31, columns 0..31): zero gradient, absmax 0 */
    for (int r = 0; r < 32; r++)
      for (int c = 0; c < 32; c++) hg[off[4] + r * 96 + c] = 0.0f;
    rf_device_copy(&dev, dg, hg, (size_t)shard * sizeof(float), RF_DEVICE_COPY_HOST_TO_DEVICE, st);
    float lr = 1e-2f * (float)(s + 1);
    hfac = factors[s];
    rf_device_copy(&dev, dfac, &hfac, sizeof hfac, RF_DEVICE_COPY_HOST_TO_DEVICE, st);
    ho->gscale = factors[s] != 0.0f ? &hfac : NULL;
    go->gscale = factors[s] != 0.0f ? dfac : NULL;
    memcpy(before, hp, (size_t)shard * sizeof(float));
    struct rf_optim_state_slab mq;
    rf_optim_state(ho, 0, &mq);
    memcpy(codes_before, mq.data, (size_t)shard);
    RF_ASSERT(rf_optim_step(ho, lr) == 0);
    RF_ASSERT(rf_optim_step(go, lr) == 0);
    if (isnan(factors[s]))
      RF_CHECK(memcmp(before, hp, (size_t)shard * sizeof(float)) == 0 &&
                   memcmp(codes_before, mq.data, (size_t)shard) == 0,
               "step %d, clip factor NaN: the host optimizer changed the parameters or m's codes", s + 1);
    else if (s == 0)
      RF_CHECK(memcmp(before, hp, (size_t)shard * sizeof(float)) != 0, "step 1 changed no parameter");
  }
  ho->gscale = go->gscale = NULL;
  free(before), free(codes_before);
  rf_device_release(&dev, dfac);
  rf_device_stream_synchronize(&dev, st);
  check_same("adamw8bit p after 6 steps (padding and zero-length pieces included)", dp, hp,
             (size_t)shard * sizeof(float), &dev, st);
  for (int i = 0; i < rf_optim_n_states(ho); i++) {
    struct rf_optim_state_slab a, b;
    rf_optim_state(ho, i, &a);
    rf_optim_state(go, i, &b);
    RF_CHECK(a.count == b.count && a.dtype == b.dtype, "slab %s: %lld elements on the host, %lld on CUDA",
             a.name, (long long)a.count, (long long)b.count);
    char what[96];
    snprintf(what, sizeof what, "adamw8bit %s (%lld)", a.name, (long long)a.count);
    check_same(what, b.data, a.data, (size_t)a.count * (a.dtype == RF_DTYPE_U8 ? 1 : 4), &dev, st);
  }
  rf_optim_free(go);
  rf_optim_free(ho);
  rf_device_release(&dev, dp);
  rf_device_release(&dev, dg);
  rf_device_stream_free(&dev, st);
  rf_device_free(&dev);
  free(hp), free(hg);
}

/* muon.c's pack and unpack (rf_optim_muon_pack, _unpack), the host's arithmetic. */
static void muon_host_momentum(float *buf, const float *g, float *u, int64_t len, float momentum,
                               int nesterov) {
  float om = 1.0f - momentum;
  for (int64_t i = 0; i < len; i++) {
    float b = buf[i] + om * (g[i] - buf[i]);
    buf[i] = b;
    u[i] = nesterov ? b - (b - g[i]) * om : b;
  }
}

static void muon_host_apply(float *p, const float *u, int64_t len, float dec, float alr) {
  for (int64_t i = 0; i < len; i++) p[i] = p[i] * dec - alr * u[i];
}

static void test_muon_kernels(void) {
  struct rf_device dev;
  rf_backend_open(&rf_backend_cuda, &dev, 0, NULL);
  struct rf_device_stream *st = rf_device_stream_create(&dev);
  static const int64_t lens[2] = {100003, 2200001};
  for (int li = 0; li < 2; li++)
    for (int nesterov = 0; nesterov < 2; nesterov++) {
      int64_t n = lens[li];
      size_t bytes = (size_t)n * sizeof(float);
      float *hb = rf_xcalloc((size_t)n, sizeof(float)), *hg = rf_xmalloc(bytes), *hu = rf_xmalloc(bytes),
            *hp = rf_xmalloc(bytes);
      for (int64_t i = 0; i < n; i++) hp[i] = rf_test_rand_f32(&g_rng);
      float *db = rf_device_alloc(&dev, bytes, 64), *dg = rf_device_alloc(&dev, bytes, 64),
            *du = rf_device_alloc(&dev, bytes, 64), *dp = rf_device_alloc(&dev, bytes, 64);
      rf_device_copy(&dev, dp, hp, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, st);
      for (int s = 0; s < 3; s++) {
        for (int64_t i = 0; i < n; i++) hg[i] = rf_test_rand_f32(&g_rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
        rf_device_copy(&dev, dg, hg, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, st);
        rf_optim_muon_cuda_momentum(db, dg, du, n, 0.95f, nesterov, st);
        muon_host_momentum(hb, hg, hu, n, 0.95f, nesterov);
        float dec = 1.0f - 0.02f * 0.1f * (float)(s + 1), alr = 0.02f * 0.2f * (float)(s + 1);
        rf_optim_muon_cuda_apply(dp, du, n, dec, alr, st);
        muon_host_apply(hp, hu, n, dec, alr);
        char what[128];
        snprintf(what, sizeof what, "muon n=%lld nesterov=%d step %d: momentum buffer", (long long)n,
                 nesterov, s + 1);
        check_same(what, db, hb, bytes, &dev, st);
        snprintf(what, sizeof what, "muon n=%lld nesterov=%d step %d: update", (long long)n, nesterov, s + 1);
        check_same(what, du, hu, bytes, &dev, st);
        snprintf(what, sizeof what, "muon n=%lld nesterov=%d step %d: parameters", (long long)n, nesterov,
                 s + 1);
        check_same(what, dp, hp, bytes, &dev, st);
      }
      rf_device_release(&dev, db), rf_device_release(&dev, dg), rf_device_release(&dev, du);
      rf_device_release(&dev, dp);
      free(hb), free(hg), free(hu), free(hp);
    }
  rf_device_stream_free(&dev, st);
  rf_device_free(&dev);
}

static void test_newton_schulz(void) {
  struct rf_device dev;
  rf_backend_open(&rf_backend_cuda, &dev, 0, NULL);
  struct rf_device_stream *st = rf_device_stream_create(&dev);
  static const int64_t shapes[][2] = {{64, 96}, {96, 64}, {48, 48}, {33, 200}, {200, 33}, {1, 7}, {5, 9}};
  double *dss = rf_device_alloc(&dev, sizeof(double), 256);
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    int64_t r = shapes[i][0], c = shapes[i][1], n = r * c;
    size_t bytes = (size_t)n * sizeof(float);
    float *hx = rf_xmalloc(bytes), *got = rf_xmalloc(bytes);
    float *hw = rf_xmalloc((size_t)rf_optim_newton_schulz_work(r, c) * sizeof(float));
    int zero = r == 5; /* the zero matrix: divided by eps, stays 0 */
    for (int64_t k = 0; k < n; k++) hx[k] = zero ? 0.0f : rf_test_rand_f32(&g_rng);
    float *dx = rf_device_alloc(&dev, bytes, 256);
    float *dw = rf_device_alloc(&dev, (size_t)rf_optim_newton_schulz_device_work(r, c) * sizeof(float), 256);
    rf_device_copy(&dev, dx, hx, bytes, RF_DEVICE_COPY_HOST_TO_DEVICE, st);
    rf_optim_newton_schulz_cuda(dx, r, c, 5, 1e-7f, dw, dss, st);
    rf_optim_newton_schulz(hx, r, c, 5, 1e-7f, hw, NULL, NULL);
    rf_device_copy(&dev, got, dx, bytes, RF_DEVICE_COPY_DEVICE_TO_HOST, st);
    double worst = 0, largest = 0;
    for (int64_t k = 0; k < n; k++) {
      worst = fmax(worst, fabs((double)got[k] - (double)hx[k]));
      largest = fmax(largest, fabs((double)hx[k]));
      if (isnan(got[k])) worst = INFINITY;
    }
    printf(
        "newton-schulz %lld x %lld on the device: largest difference from the host %.3g (bound 2^-16), "
        "largest entry %.3g\n",
        (long long)r, (long long)c, worst, largest);
    RF_CHECK(worst <= 0x1p-16 && (zero ? largest == 0 : largest > 0.01),
             "newton-schulz %lld x %lld: the device's differs from the host's by %.3g (bound 2^-16)",
             (long long)r, (long long)c, worst);
    rf_device_release(&dev, dx), rf_device_release(&dev, dw);
    free(hx), free(got), free(hw);
  }
  rf_device_release(&dev, dss);
  rf_device_stream_free(&dev, st);
  rf_device_free(&dev);
}

int main(void) {
  test_adamw8bit();
  test_muon_kernels();
  test_newton_schulz();
  return rf_test_finish("test_optim_cuda");
}
