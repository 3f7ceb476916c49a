/* src/optim: the Newton-Schulz orthogonalization of Muon. Its GEMMs (through
 * src/gemm) are here and nowhere else in the optimizers (on CUDA: newton_schulz_cuda.c,
 * the same steps on cuBLASLt). */
#include <math.h>
#include <string.h>

#include "gemm/gemm.h"
#include "optim/optim.h"

double rf_optim_ns_flops(int64_t rows, int64_t cols, int steps) {
  double n = (double)rf_min_i64(rows, cols), m = (double)rf_max_i64(rows, cols);
  return (double)steps * (4.0 * n * n * m + 2.0 * n * n * n);
}

int64_t rf_optim_newton_schulz_work(int64_t rows, int64_t cols) {
  int64_t n = rf_min_i64(rows, cols);
  return 2 * rows * cols + 2 * n * n;
}

int64_t rf_optim_newton_schulz_device_work(int64_t rows, int64_t cols) {
  int64_t n = rf_min_i64(rows, cols), nm = (rows * cols + 3) / 4 * 4, nn = (n * n + 3) / 4 * 4;
  return 2 * nm + 2 * nn;
}

double rf_optim_newton_schulz(float *x, int64_t rows, int64_t cols, int steps, float eps, float *work,
                              void (*poll)(void *), void *poll_arg) {
  const float a = 3.4445f, b = -4.7750f, c = 2.0315f;
  int tr = rows > cols;
  int64_t n = tr ? cols : rows, m = tr ? rows : cols; /* y is n x m, n <= m */
  float *y = work, *z = work + n * m, *g = z + n * m, *h = g + n * n;
  if (tr) {
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) y[j * rows + i] = x[i * cols + j];
  } else {
    memcpy(y, x, (size_t)(n * m) * sizeof(float));
  }
  double ss = 0.0;
  for (int64_t i = 0; i < n * m; i++) ss += (double)y[i] * (double)y[i];
  float norm = fmaxf((float)sqrt(ss), eps);
  for (int64_t i = 0; i < n * m; i++) y[i] /= norm;
  int ni = (int)n, mi = (int)m;
  const struct rf_gemm_desc yyt = {ni, ni, mi, 0, 1, mi, mi, ni, RF_DTYPE_F32, 1.0f, 0.0f};
  const struct rf_gemm_desc hgg = {ni, ni, ni, 0, 0, ni, ni, ni, RF_DTYPE_F32, c, b};
  const struct rf_gemm_desc zhy = {ni, mi, ni, 0, 0, ni, mi, mi, RF_DTYPE_F32, 1.0f, a};
  for (int it = 0; it < steps; it++) {
    /* g = y y^T; h = b g + c g g; z = a y + h y */
    rf_gemm_run(&yyt, y, y, g);
    if (poll) poll(poll_arg);
    memcpy(h, g, (size_t)(n * n) * sizeof(float));
    rf_gemm_run(&hgg, g, g, h);
    if (poll) poll(poll_arg);
    memcpy(z, y, (size_t)(n * m) * sizeof(float));
    rf_gemm_run(&zhy, h, y, z);
    if (poll) poll(poll_arg);
    float *t = y;
    y = z;
    z = t;
  }
  if (tr) {
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++) x[i * cols + j] = y[j * rows + i];
  } else {
    memcpy(x, y, (size_t)(n * m) * sizeof(float));
  }
  return rf_optim_ns_flops(rows, cols, steps);
}
