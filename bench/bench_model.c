/* rf-bench: */
/* Forward + backward of the LLaMA model alone (no runtime, no optimizer) on one
 * process: tokens/s, GFLOP/s (rf_model_flops_per_token) and, for scale, the
 * GFLOP/s of one oneDNN GEMM of the model's largest shape in f32 and bf16. Runs
 * f32 weights in f32 compute, bf16 weights in f32 compute and bf16 weights in bf16
 * compute.
 * Usage: bench_model [CONFIG.json] [B] [T] [steps]   (default configs/llama-100m.json 4 256 3)
 * Threads: OMP_NUM_THREADS (the bench runner sets 1). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "gemm/gemm.h"
#include "model/model.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Process CPU time: on a shared machine, wall time also counts the time other
 * processes held the core; CPU time (all threads) does not. Both are printed. */
static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_state = 1;
static float rnd_normal(void) {
  /* Box-Muller on splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  double u1 = ((double)(z >> 11) + 0.5) * 0x1.0p-53, u2 = (double)((z >> 3) & 0xffff) / 65536.0;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static double gemm_gflops(enum rf_dtype dt, int m, int n, int k, double *cpu_gflops) {
  float *a = rf_xcalloc((size_t)m * k, 4), *b = rf_xcalloc((size_t)n * k, 4),
        *c = rf_xcalloc((size_t)m * n, 4);
  struct rf_gemm_desc d = {
      .m = m, .n = n, .k = k, .trans_b = 1, .lda = k, .ldb = k, .ldc = n, .dtype = dt, .alpha = 1.0f};
  rf_gemm_run(&d, a, b, c); /* zeros: valid in both dtypes */
  int reps = 5;
  uint64_t t0 = rf_time_ns();
  double c0 = cpu_s();
  for (int i = 0; i < reps; i++) rf_gemm_run(&d, a, b, c);
  double s = (double)(rf_time_ns() - t0) * 1e-9, cs = cpu_s() - c0;
  free(a), free(b), free(c);
  *cpu_gflops = 2.0 * m * n * k * reps / cs * 1e-9;
  return 2.0 * m * n * k * reps / s * 1e-9;
}

struct model_bufs {
  int n_units;
  int *n_t;
  float ***w, ***g;
  uint16_t ***wb;
  int64_t **numel;
};

static void run(const struct rf_model_config *cfg, struct rf_model_ws *ws, struct model_bufs *m, int bf16,
                enum rf_dtype compute, int steps, const int32_t *tok, const int32_t *tgt) {
  RF_ASSERT(rf_model_ws_set_compute(ws, compute) == 0);
  int L = cfg->num_hidden_layers, N = ws->b * ws->t;
  struct rf_model_weight **uw = rf_xcalloc((size_t)m->n_units, sizeof(struct rf_model_weight *));
  for (int u = 0; u < m->n_units; u++) {
    uw[u] = rf_xcalloc((size_t)m->n_t[u], sizeof(**uw));
    for (int i = 0; i < m->n_t[u]; i++) {
      if (bf16)
        uw[u][i].bf16 = m->wb[u][i];
      else
        uw[u][i].f32 = m->w[u][i];
    }
  }
  struct rf_model_units mu;
  rf_model_units_find(cfg, &mu);
  int E = mu.embed_unit, e = mu.embed_tensor, F = mu.first_layer, H = mu.head_unit;
  double fwd = 0, bwd = 0, loss = 0, cpu = 0;
  for (int s = -1; s < steps; s++) {
    uint64_t t0 = rf_time_ns();
    double c0 = cpu_s();
    RF_ASSERT(rf_model_embed_forward(ws, &uw[E][e], tok) == 0);
    for (int l = 0; l < L; l++) rf_model_layer_forward(ws, l, uw[F + l]);
    loss = rf_model_head_forward(ws, uw[H], tgt) / N;
    uint64_t t1 = rf_time_ns();
    rf_model_head_backward(ws, uw[H], m->g[H], 1.0f / (float)N);
    for (int l = L - 1; l >= 0; l--) rf_model_layer_backward(ws, l, uw[F + l], m->g[F + l]);
    rf_model_embed_backward(ws, &m->g[E][e]);
    uint64_t t2 = rf_time_ns();
    if (s >= 0) fwd += (double)(t1 - t0) * 1e-9, bwd += (double)(t2 - t1) * 1e-9, cpu += cpu_s() - c0;
  }
  double per = (fwd + bwd) / steps;
  double flops = rf_model_flops_per_token(cfg, ws->t) * N;
  double cpu_per = cpu / steps;
  printf(
      "weights %-4s compute %-4s  step %8.1f ms (forward %7.1f, backward %7.1f)  %6.0f tokens/s  %6.1f "
      "GFLOP/s"
      "  | CPU time: %8.1f ms/step  %6.1f GFLOP/s  | loss %.4f\n",
      bf16 ? "bf16" : "f32", rf_dtype_name(compute), per * 1e3, fwd / steps * 1e3, bwd / steps * 1e3, N / per,
      flops / per * 1e-9, cpu_per * 1e3, flops / cpu_per * 1e-9, loss);
  for (int u = 0; u < m->n_units; u++) free(uw[u]);
  free(uw);
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : "configs/llama-100m.json";
  int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 256,
      steps = argc > 4 ? atoi(argv[4]) : 3;
  struct rf_model_config cfg;
  if (rf_model_config_load(&cfg, path) != 0) {
    fprintf(stderr, "bench_model: %s\n", rf_error_msg());
    return 1;
  }
  struct rf_model_ws ws;
  if (rf_model_ws_init(&ws, &cfg, B, T) != 0) {
    fprintf(stderr, "bench_model: %s\n", rf_error_msg());
    return 1;
  }
  struct model_bufs m;
  struct rf_model_desc desc;
  rf_model_desc_make(&cfg, &desc);
  m.n_units = desc.n_units;
  m.n_t = rf_xcalloc((size_t)m.n_units, sizeof(int));
  m.w = rf_xcalloc((size_t)m.n_units, sizeof(float **));
  m.g = rf_xcalloc((size_t)m.n_units, sizeof(float **));
  m.wb = rf_xcalloc((size_t)m.n_units, sizeof(uint16_t **));
  m.numel = rf_xcalloc((size_t)m.n_units, sizeof(int64_t *));
  for (int u = 0; u < m.n_units; u++) {
    int nt = m.n_t[u] = desc.units[u].n_tensors;
    m.w[u] = rf_xcalloc((size_t)nt, sizeof(float *));
    m.g[u] = rf_xcalloc((size_t)nt, sizeof(float *));
    m.wb[u] = rf_xcalloc((size_t)nt, sizeof(uint16_t *));
    m.numel[u] = rf_xcalloc((size_t)nt, sizeof(int64_t));
    for (int i = 0; i < nt; i++) {
      const struct rf_model_tensor s = desc.units[u].tensors[i];
      int64_t n = s.numel;
      m.numel[u][i] = n;
      m.w[u][i] = rf_xmalloc((size_t)n * 4);
      m.g[u][i] = rf_xcalloc((size_t)n, 4);
      m.wb[u][i] = rf_xmalloc((size_t)n * 2);
      for (int64_t j = 0; j < n; j++)
        m.w[u][i][j] = s.init.kind == RF_INIT_NORMAL ? s.init.value * rnd_normal() : s.init.value;
      rf_bf16_from_f32_n(m.wb[u][i], m.w[u][i], (size_t)n);
    }
  }
  int N = B * T;
  int32_t *tok = rf_xmalloc((size_t)N * 4 + 4);
  for (int i = 0; i <= N; i++) tok[i] = (int32_t)((uint32_t)(i * 2654435761u) >> 8) % cfg.vocab_size;
  int threads = 1;
#ifdef _OPENMP
  threads = omp_get_max_threads();
#endif
  printf("bench_model: %s  %.1fM parameters  B=%d T=%d  %.3f GFLOP/token  workspace %.0f MB  threads %d\n",
         path, rf_model_n_params(&cfg) * 1e-6, B, T, rf_model_flops_per_token(&cfg, T) * 1e-9,
         ws.bytes / 1048576.0, threads);
  for (int d = 0; d < 2; d++) {
    enum rf_dtype dt = d ? RF_DTYPE_BF16 : RF_DTYPE_F32;
    double peak_cpu = 0.0, peak = gemm_gflops(dt, N, cfg.intermediate_size, cfg.hidden_size, &peak_cpu);
    printf("oneDNN %s GEMM %dx%dx%d: %.1f GFLOP/s (CPU time: %.1f GFLOP/s)\n", rf_dtype_name(dt), N,
           cfg.intermediate_size, cfg.hidden_size, peak, peak_cpu);
  }
  run(&cfg, &ws, &m, 0, RF_DTYPE_F32, steps, tok, tok + 1);
  run(&cfg, &ws, &m, 1, RF_DTYPE_F32, steps, tok, tok + 1);
  run(&cfg, &ws, &m, 1, RF_DTYPE_BF16, steps, tok, tok + 1);
  for (int u = 0; u < m.n_units; u++) {
    for (int i = 0; i < m.n_t[u]; i++) free(m.w[u][i]), free(m.g[u][i]), free(m.wb[u][i]);
    free(m.w[u]), free(m.g[u]), free(m.wb[u]), free(m.numel[u]);
  }
  free(m.w), free(m.g), free(m.wb), free(m.numel), free(m.n_t), free(tok);
  rf_model_ws_free(&ws);
  rf_model_desc_free(&desc);
  return 0;
}
