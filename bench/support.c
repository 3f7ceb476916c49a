/* What the runtime benches share: bench/support.h. */
#include "support.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/core.h"
#include "gemm/gemm.h"

static void bench_add(struct rf_fsdp *f, int u, const char *name, int64_t d0, int64_t d1) {
  int64_t shape[2] = {d0, d1};
  struct rf_init init = {RF_INIT_NORMAL, 0.02f};
  if (rf_fsdp_add_tensor(f, u, name, d1 ? 2 : 1, shape, 0, init) < 0) RF_DIE("%s", rf_fsdp_error());
}

void bench_llama_declare(struct rf_fsdp *f, const struct bench_llama *m) {
  char name[96];
  bench_add(f, rf_fsdp_add_unit(f, "embed"), "embed.weight", m->vocab, m->hidden);
  static const char *names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  const int64_t shapes[7][2] = {{m->hidden, m->hidden}, {m->kv, m->hidden},    {m->kv, m->hidden},
                                {m->hidden, m->hidden}, {m->inter, m->hidden}, {m->inter, m->hidden},
                                {m->hidden, m->inter}};
  for (int l = 0; l < m->blocks; l++) {
    snprintf(name, sizeof name, "block%d", l);
    int u = rf_fsdp_add_unit(f, name);
    if (m->block_norms) {
      snprintf(name, sizeof name, "block%d.norm1", l);
      bench_add(f, u, name, m->hidden, 0);
    }
    for (int i = 0; i < 7; i++) {
      snprintf(name, sizeof name, "block%d.%s", l, names[i]);
      bench_add(f, u, name, shapes[i][0], shapes[i][1]);
    }
    if (m->block_norms) {
      snprintf(name, sizeof name, "block%d.norm2", l);
      bench_add(f, u, name, m->hidden, 0);
    }
  }
  int u = rf_fsdp_add_unit(f, "head");
  bench_add(f, u, "norm", m->hidden, 0);
  bench_add(f, u, "head.weight", m->vocab, m->hidden);
  if (rf_fsdp_finalize(f) != 0) RF_DIE("%s", rf_fsdp_error());
}

int64_t bench_llama_params(const struct bench_llama *m) {
  int64_t block = 2 * m->hidden * m->hidden + 2 * m->kv * m->hidden + 3 * m->hidden * m->inter +
                  (m->block_norms ? 2 * m->hidden : 0);
  return 2 * m->vocab * m->hidden + m->blocks * block + m->hidden;
}

void bench_unit_compute(struct rf_fsdp *f, int u, int backward, int tokens, float *x, float *y) {
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    if (v.unit != u || v.ndim != 2) continue;
    int out = (int)v.shape[0], in = (int)v.shape[1];
    const float *w = rf_fsdp_param(f, t);
    if (!backward) {
      struct rf_gemm_desc d = {tokens, out, in, 0, 1, in, in, out, RF_DTYPE_F32, 1.0f, 0.0f};
      rf_gemm_run(&d, x, w, y);
    } else {
      struct rf_gemm_desc dx = {tokens, in, out, 0, 0, out, in, in, RF_DTYPE_F32, 1.0f, 0.0f};
      rf_gemm_run(&dx, y, w, x);
      rf_fsdp_poll(f);
      struct rf_gemm_desc dw = {out, in, tokens, 1, 0, out, in, in, RF_DTYPE_F32, 1e-3f, 1.0f};
      rf_gemm_run(&dw, y, x, rf_fsdp_grad(f, t));
    }
    rf_fsdp_poll(f);
  }
}

void bench_forward_backward(struct rf_fsdp *f, int tokens, float *x, float *y) {
  int n = rf_fsdp_n_units(f);
  for (int u = 0; u < n; u++) {
    rf_fsdp_forward_begin(f, u);
    bench_unit_compute(f, u, 0, tokens, x, y);
    rf_fsdp_forward_end(f, u);
  }
  for (int u = n - 1; u >= 0; u--) {
    rf_fsdp_backward_begin(f, u);
    bench_unit_compute(f, u, 1, tokens, x, y);
    rf_fsdp_backward_end(f, u);
  }
}

int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
