/* rf-bench: np=2,4
 * Optimizers on the ~100M LLaMA of configs/llama-100m.json (hidden 768,
 * intermediate 2048, 16 layers, q/o 768 x 768, k/v 256 x 768, vocabulary 256),
 * laid out like the runtime's ragged plan (one flat buffer per unit, ranks cut
 * on 32-row strips / 256-element runs near the fair share).
 *   1. Whole model, planned (nothing stepped): optimizer-state bytes per rank of
 *      adamw, adamw8bit, muon, shampoo; Muon's and Shampoo's traffic per rank per
 *      step against the naive pattern (every rank all-gathers every full matrix:
 *      (W-1)M/W); Newton-Schulz FLOPs / Shampoo's eigendecomposition cost per rank
 *      and the redundancy factor (work in the world / work of the matrices: 1.0
 *      here, W for the naive pattern); owner balance max/mean.
 *   2. One transformer layer, measured: time of a Muon step (blocking and
 *      overlapped all-to-all-v), bytes counted, NS time.
 *   4. Shampoo on two layers, measured (`bench_optim shampoo`: parts 1 and 4 only) (blocks of 1024 and of
 * 128, roots refreshed every 2 steps): an ordinary step (the third; the first creates the GEMM primitives)
 * and the refresh step (the second), wall and CPU time.
 *   3. Two layers, measured on each rank's own shard: nanoseconds per parameter of
 *      an adamw and an adamw8bit step (median of 7 interleaved repeats of 2 steps, rank 0's
 *      shard; threads as OMP_NUM_THREADS) and their ratio (issue 14: <= 3); `bench_optim elementwise` runs
 * this part only. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_mpi.h"
#include "optim/optim.h"

#define MAXT 200
#define MAXW 64

struct tensor {
  char name[64];
  int unit, ndim;
  int64_t shape[2], numel, block;
  int flags; /* decay, Muon: as the model's description gives them */
};

struct model {
  int n, n_units;
  struct tensor t[MAXT];
};

static void add(struct model *m, int unit, const char *name, int ndim, int64_t d0, int64_t d1, int flags) {
  struct tensor *t = &m->t[m->n++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->unit = unit;
  t->ndim = ndim;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->numel = ndim == 1 ? d0 : d0 * d1;
  t->block = ndim == 1 ? 256 : 32 * d1;
  t->flags = flags;
  if (unit + 1 > m->n_units) m->n_units = unit + 1;
}

static void build_model(struct model *m, int layers, int embed) {
  memset(m, 0, sizeof *m);
  int h = 768, f = 2048, kv = 256, vocab = 256, u = 0;
  char nm[64];
  if (embed) add(m, u++, "model.embed_tokens.weight", 2, vocab, h, 0);
  for (int l = 0; l < layers; l++, u++) {
    const char *names[7] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    int64_t shapes[7][2] = {{h, h}, {kv, h}, {kv, h}, {h, h}, {f, h}, {f, h}, {h, f}};
    snprintf(nm, sizeof nm, "model.layers.%d.input_layernorm.weight", l);
    add(m, u, nm, 1, h, 0, 0);
    for (int k = 0; k < 7; k++) {
      snprintf(nm, sizeof nm, "model.layers.%d.%s.%s.weight", l, k < 4 ? "self_attn" : "mlp", names[k]);
      add(m, u, nm, 2, shapes[k][0], shapes[k][1], RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX);
    }
    snprintf(nm, sizeof nm, "model.layers.%d.post_attention_layernorm.weight", l);
    add(m, u, nm, 1, h, 0, 0);
  }
  if (embed) {
    add(m, u, "model.norm.weight", 1, h, 0, 0);
    add(m, u, "lm_head.weight", 2, vocab, h, RF_OPTIM_FLAG_DECAY);
  }
}

/* Ragged block layout: every rank's range of every tensor and its shard offset. */
struct layout {
  int64_t shard_elems;
  int64_t (*starts)[MAXW + 1];
  int64_t *shard_off;
};

static int legal(const struct model *m, const int64_t *off, int u, int64_t pos) {
  for (int t = 0; t < m->n; t++)
    if (m->t[t].unit == u && pos > off[t] && pos < off[t] + m->t[t].numel && (pos - off[t]) % m->t[t].block)
      return 0;
  return 1;
}

static void build_layout(const struct model *m, int world, int rank, struct layout *l) {
  l->starts = calloc((size_t)m->n, sizeof *l->starts);
  l->shard_off = calloc((size_t)m->n, sizeof(int64_t));
  int64_t off[MAXT], base[MAXW] = {0};
  for (int u = 0; u < m->n_units; u++) {
    int64_t total = 0, cut[MAXW + 1];
    for (int t = 0; t < m->n; t++)
      if (m->t[t].unit == u) {
        total = rf_round_up(total, 16);
        off[t] = total;
        total += m->t[t].numel;
      }
    cut[0] = 0;
    cut[world] = total;
    for (int k = 1; k < world; k++) {
      int64_t target = total * k / world, best = -1;
      for (int64_t d = 0; best < 0; d++) {
        if (target - d >= cut[k - 1] && legal(m, off, u, target - d))
          best = target - d;
        else if (target + d <= total && legal(m, off, u, target + d))
          best = target + d;
      }
      cut[k] = best;
    }
    for (int t = 0; t < m->n; t++) {
      if (m->t[t].unit != u) continue;
      for (int r = 0; r <= world; r++)
        l->starts[t][r] = rf_min_i64(m->t[t].numel, rf_max_i64(0, cut[r] - off[t]));
      l->shard_off[t] = base[rank] + rf_max_i64(off[t], cut[rank]) - cut[rank];
    }
    for (int r = 0; r < world; r++) base[r] += cut[r + 1] - cut[r];
  }
  l->shard_elems = base[rank];
}

static void make_views(const struct model *m, const struct layout *l, int rank, float *master, float *grad,
                       struct rf_tensor_view *v, int *flags) {
  for (int t = 0; t < m->n; t++) {
    memset(&v[t], 0, sizeof v[t]);
    v[t].name = m->t[t].name;
    v[t].unit = m->t[t].unit;
    v[t].ndim = m->t[t].ndim;
    v[t].shape[0] = m->t[t].shape[0];
    v[t].shape[1] = m->t[t].shape[1];
    v[t].numel = m->t[t].numel;
    v[t].block_elems = m->t[t].block;
    v[t].starts = l->starts[t];
    v[t].begin = l->starts[t][rank];
    v[t].end = l->starts[t][rank + 1];
    v[t].shard_offset = l->shard_off[t];
    v[t].master = master + l->shard_off[t];
    v[t].grad = grad + l->shard_off[t];
    flags[t] = m->t[t].flags;
  }
}

static double maxmean(const struct rf_comm *comm, double x, double *mean) {
  double mx = x, sum = x;
  rf_comm_allreduce(comm, &mx, 1, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
  rf_comm_allreduce(comm, &sum, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  *mean = sum / comm->world;
  return mx;
}

/* Shampoo's numbers: traffic against all-gathering every matrix, eigendecomposition
 * cost (sum over blocks of a^3 + b^3) per rank and its redundancy, matrix state. */
static void shampoo_report(const struct rf_comm *comm, const struct model *m, const struct rf_optim *o,
                           const struct rf_optim_options *opt, int64_t params) {
  double bytes = 0, cost = 0, mparams = 0;
  int n_mat = 0;
  int64_t eighs = 0, bs = opt->shampoo_block;
  for (int t = 0; t < m->n; t++) {
    if (rf_optim_muon_owner(o, t) < 0) continue;
    int64_t a0 = m->t[t].shape[0], b0 = m->t[t].shape[1];
    bytes += 4.0 * (double)m->t[t].numel;
    mparams += (double)m->t[t].numel;
    for (int64_t r = 0; r < a0; r += bs)
      for (int64_t c = 0; c < b0; c += bs) {
        double a = (double)rf_min_i64(bs, a0 - r), b = (double)rf_min_i64(bs, b0 - c);
        cost += a * a * a + b * b * b;
        eighs += 2;
      }
    n_mat++;
  }
  struct rf_optim_stats st;
  rf_optim_get_stats(o, &st);
  double tmean, tmx = maxmean(comm, (double)st.muon_step_bytes_sent, &tmean);
  double cmean, cmx = maxmean(comm, st.shampoo_owned_cost, &cmean);
  double naive = (comm->world - 1) * bytes / comm->world;
  if (comm->rank != 0) return;
  printf(
      "shampoo: %d matrices (%.1fM of the %.1fM parameters), blocks of at most %lld, M = %.1f MB (f32), %lld "
      "eigendecompositions per refresh in the world\n",
      n_mat, mparams / 1e6, (double)params / 1e6, (long long)bs, bytes / 1e6, (long long)eighs);
  printf(
      "shampoo traffic per rank per step (sent, both trips): max %.1f MB, mean %.1f MB; naive all-gather "
      "(W-1)M/W = %.1f MB (ratio %.2f)\n",
      tmx / 1e6, tmean / 1e6, naive / 1e6, tmean / naive);
  printf(
      "shampoo eigendecomposition cost per rank per refresh (sum of n^3): max %.3g, mean %.3g, max/mean "
      "%.3f; "
      "redundancy %.2f (naive: every rank decomposes every factor, redundancy %d)\n",
      cmx, cmean, cmx / cmean, cmean * comm->world / cost, comm->world);
}

static void whole_model(const struct rf_comm *comm) {
  static struct model m;
  build_model(&m, 16, 1);
  struct layout l;
  build_layout(&m, comm->world, comm->rank, &l);
  /* never touched: create only plans and reserves (calloc'd pages stay unmapped) */
  float *master = calloc((size_t)l.shard_elems + 1, sizeof(float)),
        *grad = calloc((size_t)l.shard_elems + 1, 4);
  static struct rf_tensor_view v[MAXT];
  static int flags[MAXT];
  make_views(&m, &l, comm->rank, master, grad, v, flags);
  int64_t params = 0;
  for (int t = 0; t < m.n; t++) params += m.t[t].numel;
  if (comm->rank == 0)
    printf("model: %d tensors, %.2fM parameters, W=%d, shard of rank 0: %lld elements\n", m.n, params / 1e6,
           comm->world, (long long)l.shard_elems);
  for (int kind = 0; kind < 4; kind++) {
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = (enum rf_optim_kind)kind;
    struct rf_optim *o;
    if (rf_optim_create(&o, &opt, v, flags, m.n, l.shard_elems, comm) != 0) RF_DIE("%s", rf_error_msg());
    struct rf_optim_stats st;
    rf_optim_get_stats(o, &st);
    double mean, mx = maxmean(comm, (double)st.state_bytes, &mean);
    double wmean, wmx = maxmean(comm, (double)st.workspace_bytes, &wmean);
    double umean, umx = maxmean(comm, (double)st.state_bytes_used, &umean);
    if (comm->rank == 0)
      printf(
          "state %-9s per rank: allocated max %6.1f MB (%.2f bytes/param), holding state max %6.1f MB (%.2f "
          "bytes/param); workspace max %.1f MB\n",
          rf_optim_kind_name(opt.kind), mx / 1e6, mean * comm->world / (double)params, umx / 1e6,
          umean * comm->world / (double)params, wmx / 1e6);
    if (opt.kind == RF_OPTIM_KIND_MUON) {
      double muon_bytes = 0, muon_flops = 0;
      int n_muon = 0;
      for (int t = 0; t < m.n; t++)
        if (rf_optim_muon_owner(o, t) >= 0) {
          muon_bytes += 4.0 * (double)m.t[t].numel;
          muon_flops += rf_optim_ns_flops(m.t[t].shape[0], m.t[t].shape[1], 5);
          n_muon++;
        }
      double tmean, tmx = maxmean(comm, (double)st.muon_step_bytes_sent, &tmean);
      double fmean, fmx = maxmean(comm, st.muon_owned_flops, &fmean);
      double naive = (comm->world - 1) * muon_bytes / comm->world;
      if (comm->rank == 0) {
        printf("muon: %d matrices, M = %.1f MB (f32)\n", n_muon, muon_bytes / 1e6);
        printf(
            "muon traffic per rank per step (sent, both trips): max %.1f MB, mean %.1f MB = %.2f M/W; "
            "naive all-gather (W-1)M/W = %.1f MB (ratio %.2f)\n",
            tmx / 1e6, tmean / 1e6, tmean / (muon_bytes / comm->world), naive / 1e6, tmean / naive);
        printf(
            "muon NS per rank per step: max %.1f GFLOP, mean %.1f GFLOP, max/mean %.3f; redundancy %.2f "
            "(naive: every rank orthogonalizes every matrix, %.1f GFLOP per rank, redundancy %d)\n",
            fmx / 1e9, fmean / 1e9, fmx / fmean, fmean * comm->world / muon_flops, muon_flops / 1e9,
            comm->world);
      }
    }
    if (opt.kind == RF_OPTIM_KIND_SHAMPOO) shampoo_report(comm, &m, o, &opt, params);
    rf_optim_free(o);
  }
  free(master);
  free(grad);
  free(l.starts);
  free(l.shard_off);
}

static void one_layer(const struct rf_comm *comm) {
  static struct model m;
  build_model(&m, 2, 0);
  struct layout l;
  build_layout(&m, comm->world, comm->rank, &l);
  float *master = calloc((size_t)l.shard_elems + 1, sizeof(float)),
        *grad = calloc((size_t)l.shard_elems + 1, 4);
  uint64_t s = 1;
  for (int64_t i = 0; i < l.shard_elems; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    grad[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
  }
  static struct rf_tensor_view v[MAXT];
  static int flags[MAXT];
  make_views(&m, &l, comm->rank, master, grad, v, flags);
  for (int overlap = 0; overlap < 2; overlap++) {
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = RF_OPTIM_KIND_MUON;
    opt.muon_overlap = overlap;
    struct rf_optim *o;
    if (rf_optim_create(&o, &opt, v, flags, m.n, l.shard_elems, comm) != 0) RF_DIE("%s", rf_error_msg());
    rf_comm_barrier(comm);
    uint64_t t0 = rf_time_ns();
    rf_optim_step(o, 1e-3f);
    rf_comm_barrier(comm);
    double ms = (double)(rf_time_ns() - t0) / 1e6;
    struct rf_optim_stats st;
    rf_optim_get_stats(o, &st);
    double ns_mean, ns_max = maxmean(comm, (double)st.muon_ns_time_ns / 1e6, &ns_mean);
    double w_mean, w_max = maxmean(comm, (double)st.muon_comm_wait_ns / 1e6, &w_mean);
    double b_mean, b_max = maxmean(comm, (double)st.muon_bytes_sent, &b_mean);
    if (comm->rank == 0)
      printf(
          "muon step, 2 layers (%s all-to-all-v): %.0f ms; NS max %.0f ms (mean %.0f); waiting for "
          "all-to-all-v max %.0f ms; sent max %.1f MB (planned %.1f MB on rank 0)\n",
          overlap ? "overlapped" : "blocking", ms, ns_max, ns_mean, w_max, b_max / 1e6,
          (double)st.muon_step_bytes_sent / 1e6);
    rf_optim_free(o);
  }
  free(master);
  free(grad);
  free(l.starts);
  free(l.shard_off);
}

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void shampoo_layers(const struct rf_comm *comm) {
  static struct model m;
  build_model(&m, 2, 0);
  struct layout l;
  build_layout(&m, comm->world, comm->rank, &l);
  float *master = calloc((size_t)l.shard_elems + 1, sizeof(float)),
        *grad = calloc((size_t)l.shard_elems + 1, 4);
  uint64_t s = 3;
  for (int64_t i = 0; i < l.shard_elems; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    grad[i] = 1e-2f * ((float)((s >> 40) & 0xffff) / 65536.0f - 0.5f);
  }
  static struct rf_tensor_view v[MAXT];
  static int flags[MAXT];
  make_views(&m, &l, comm->rank, master, grad, v, flags);
  const int64_t blocks[2] = {1024, 128};
  for (int k = 0; k < 2; k++) {
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = RF_OPTIM_KIND_SHAMPOO;
    opt.shampoo_block = blocks[k];
    opt.shampoo_every = 2;
    struct rf_optim *o;
    if (rf_optim_create(&o, &opt, v, flags, m.n, l.shard_elems, comm) != 0) RF_DIE("%s", rf_error_msg());
    double wall[3], cpu[3];
    for (int i = 0; i < 3; i++) {
      rf_comm_barrier(comm);
      uint64_t t0 = rf_time_ns();
      double c0 = cpu_s();
      if (rf_optim_step(o, 1e-3f) != 0) RF_DIE("%s", rf_error_msg());
      cpu[i] = cpu_s() - c0;
      rf_comm_barrier(comm);
      wall[i] = (double)(rf_time_ns() - t0) / 1e9;
    }
    double cmean, cmx = maxmean(comm, cpu[2], &cmean), rmean, rmx = maxmean(comm, cpu[1], &rmean);
    if (comm->rank == 0)
      printf(
          "shampoo step, 2 layers, blocks of %lld: ordinary %.2f s wall, CPU max %.2f s (mean %.2f); refresh "
          "step "
          "%.2f s wall, CPU max %.2f s (mean %.2f)\n",
          (long long)blocks[k], wall[2], cmx, cmean, wall[1], rmx, rmean);
    rf_optim_free(o);
  }
  free(master);
  free(grad);
  free(l.starts);
  free(l.shard_off);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void elementwise(const struct rf_comm *comm) {
  static struct model m;
  build_model(&m, 2, 0);
  struct layout l;
  build_layout(&m, comm->world, comm->rank, &l);
  float *master = calloc((size_t)l.shard_elems + 1, sizeof(float)),
        *grad = calloc((size_t)l.shard_elems + 1, 4);
  uint64_t s = 7;
  for (int64_t i = 0; i < l.shard_elems; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    grad[i] = 1e-3f * ((float)((s >> 40) & 0xffff) / 65536.0f - 0.5f);
  }
  static struct rf_tensor_view v[MAXT];
  static int flags[MAXT];
  make_views(&m, &l, comm->rank, master, grad, v, flags);
  enum { REPEATS = 7, STEPS = 2 };
  struct rf_optim *o[2];
  for (int k = 0; k < 2; k++) {
    struct rf_optim_options opt;
    rf_optim_options_default(&opt);
    opt.kind = k ? RF_OPTIM_KIND_ADAMW8BIT : RF_OPTIM_KIND_ADAMW;
    if (rf_optim_create(&o[k], &opt, v, flags, m.n, l.shard_elems, comm) != 0) RF_DIE("%s", rf_error_msg());
    rf_optim_step(o[k], 1e-3f); /* warm-up: pages touched, maps built */
  }
  double per[2][REPEATS], ns[2];
  for (int r = 0; r < REPEATS; r++) /* interleaved: both see the same machine */
    for (int k = 0; k < 2; k++) {
      uint64_t t0 = rf_time_ns();
      for (int i = 0; i < STEPS; i++) rf_optim_step(o[k], 1e-3f);
      per[k][r] = (double)(rf_time_ns() - t0) / ((double)STEPS * (double)rf_max_i64(l.shard_elems, 1));
    }
  for (int k = 0; k < 2; k++) {
    qsort(per[k], REPEATS, sizeof per[k][0], cmp_double);
    ns[k] = per[k][REPEATS / 2];
    rf_optim_free(o[k]);
  }
  if (comm->rank == 0)
    printf(
        "element-wise step, 2 layers, rank 0's %.2fM parameters: adamw %.2f ns/param, adamw8bit %.2f "
        "ns/param, ratio %.2f (target <= 3; median of %d x %d steps)\n",
        (double)l.shard_elems / 1e6, ns[0], ns[1], ns[1] / ns[0], REPEATS, STEPS);
  free(master);
  free(grad);
  free(l.starts);
  free(l.shard_off);
}

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  if (comm.world > MAXW) RF_DIE("at most %d ranks", MAXW);
  const char *only = argc > 1 ? argv[1] : ""; /* "shampoo": parts 1 and 4; "elementwise": part 3 */
  if (strcmp(only, "elementwise") == 0) {
    elementwise(&comm);
  } else {
    whole_model(&comm);
    if (strcmp(only, "shampoo") != 0) {
      one_layer(&comm);
      elementwise(&comm);
    }
    shampoo_layers(&comm);
  }
  rf_comm_free(&comm);
  rf_comm_mpi_finalize();
  return 0;
}
