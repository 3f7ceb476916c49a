/* rf-test: np=1,2,3,4,5 timeout=120 */
/* The runtime against a single-process reference. A small MLP (4 units of odd
 * sizes, a 3-element tensor smaller than W) trains K steps with SGD under rfsdp,
 * in every layout and schedule variant; a plain full-weight implementation in this
 * file trains the same steps on the whole global batch. Parameters must agree
 * within 1e-5 relative (f32) at every W. Also: W-independent initialization (a
 * context on MPI_COMM_SELF), zero allocations per step, zero copied bytes in the
 * planned layout, the norm ignores padding, and a NaN on one rank makes every rank
 * skip the step. HSDP (a variant on a mesh of R replica groups): the same
 * parameters, and exactly the f32 gradient slab crosses the groups per step; a
 * mesh of W one-rank groups is accepted, a mesh that is not a grid refused. */
#include <math.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rf_test.h"
#include "rfsdp_mpi.h"

#define N_LAYERS 4
static const int64_t dims[N_LAYERS + 1] = {7, 37, 29, 19, 5};
#define GAIN 3 /* the small tensor of layer 1 */
#define BATCH 60
#define STEPS 6
#define LR 0.05f

/* ---- the model, shared by the reference and the rfsdp run ---------------- */

/* Layer l: out = act(in W^T + b) (* (1 + gain[j % 3]) on layer 1); act = tanh
 * except on the last layer. in: rows x din, W: dout x din. */
static void layer_forward(int l, const float *w, const float *b, const float *gain, const float *in,
                          float *pre, float *out, int rows) {
  int64_t din = dims[l], dout = dims[l + 1];
  for (int i = 0; i < rows; i++)
    for (int64_t j = 0; j < dout; j++) {
      float s = b[j];
      for (int64_t k = 0; k < din; k++) s += in[i * din + k] * w[j * din + k];
      if (gain) s *= 1.0f + gain[j % GAIN];
      pre[i * dout + j] = s;
      out[i * dout + j] = l == N_LAYERS - 1 ? s : tanhf(s);
    }
}

/* Given dout (gradient w.r.t. out), accumulates dW, db, dgain and writes din. */
static void layer_backward(int l, const float *w, const float *b, const float *gain, const float *in,
                           const float *pre, const float *out, const float *dout_, float *dw, float *db,
                           float *dgain, float *din_, int rows) {
  int64_t din = dims[l], dout = dims[l + 1];
  memset(din_, 0, (size_t)rows * (size_t)din * sizeof(float));
  for (int i = 0; i < rows; i++)
    for (int64_t j = 0; j < dout; j++) {
      float g = dout_[i * dout + j];
      if (l != N_LAYERS - 1) g *= 1.0f - out[i * dout + j] * out[i * dout + j];
      if (gain) {
        float scale = 1.0f + gain[j % GAIN];
        dgain[j % GAIN] += g * pre[i * dout + j] / scale;
        g *= scale;
      }
      db[j] += g;
      for (int64_t k = 0; k < din; k++) {
        dw[j * din + k] += g * in[i * din + k];
        din_[i * din + k] += g * w[j * din + k];
      }
    }
  (void)b;
}

/* Input row i and target of micro-batch m of step s: a function of (s, m, i). */
static void sample(int s, int m, int i, float *x, float *y) {
  uint64_t st = 1000003ull * (uint64_t)s + 7919ull * (uint64_t)m + (uint64_t)i;
  for (int64_t k = 0; k < dims[0]; k++) x[k] = rf_test_rand_f32(&st);
  for (int64_t k = 0; k < dims[N_LAYERS]; k++) y[k] = rf_test_rand_f32(&st) * 0.5f;
}

/* Activations for `rows` rows. */
struct acts {
  float *h[N_LAYERS + 1], *pre[N_LAYERS], *g[N_LAYERS + 1], *y;
};

static void acts_init(struct acts *a, int rows) {
  for (int l = 0; l <= N_LAYERS; l++) {
    a->h[l] = calloc((size_t)rows * (size_t)dims[l], sizeof(float));
    a->g[l] = calloc((size_t)rows * (size_t)dims[l], sizeof(float));
    if (l < N_LAYERS) a->pre[l] = calloc((size_t)rows * (size_t)dims[l + 1], sizeof(float));
  }
  a->y = calloc((size_t)rows * (size_t)dims[N_LAYERS], sizeof(float));
}

static void acts_free(struct acts *a) {
  for (int l = 0; l <= N_LAYERS; l++) {
    free(a->h[l]);
    free(a->g[l]);
    if (l < N_LAYERS) free(a->pre[l]);
  }
  free(a->y);
}

/* Loss = sum of squared errors / (2 * BATCH * accum): the global mean over the step. */
static void loss_grad(struct acts *a, int rows, int accum) {
  int64_t d = dims[N_LAYERS];
  for (int64_t i = 0; i < rows * d; i++)
    a->g[N_LAYERS][i] = (a->h[N_LAYERS][i] - a->y[i]) / (float)(BATCH * accum);
}

/* ---- the configurations ---------------------------------------------------- */

struct variant {
  const char *name;
  enum rf_layout layout;
  enum rf_shard_mode shard;
  int reshard, prefetch, accum;
  enum rf_dtype pdtype, rdtype;
  int64_t block_rows;
  double tol;   /* relative to the largest parameter change */
  int replicas; /* HSDP: R replica groups (2 at even W, else W: groups of one rank); 1: 1-D */
};

static const struct variant variants[] = {
    {"planned-equal", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 1, 1, 1, RF_DTYPE_F32, RF_DTYPE_F32, 1, 1e-5,
     1},
    {"planned-ragged-accum", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 1, 2, 2, RF_DTYPE_F32, RF_DTYPE_F32, 4,
     1e-5, 1},
    {"planned-noreshard-noprefetch", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 0, 0, 1, RF_DTYPE_F32,
     RF_DTYPE_F32, 8, 1e-5, 1},
    {"planned-bf16-gather", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 1, 1, 2, RF_DTYPE_BF16, RF_DTYPE_F32, 1,
     1e-4, 1},
    {"planned-bf16-reduce", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 1, 1, 1, RF_DTYPE_F32, RF_DTYPE_BF16, 1,
     2e-2, 1},
    {"planned-equal-bf16-reduce", RF_LAYOUT_PLANNED, RF_SHARD_MODE_EQUAL, 1, 1, 2, RF_DTYPE_F32,
     RF_DTYPE_BF16, 1, 2e-2, 1},
    {"flat", RF_LAYOUT_FLAT, RF_SHARD_MODE_EQUAL, 1, 1, 1, RF_DTYPE_F32, RF_DTYPE_F32, 1, 1e-5, 1},
    {"fsdp2-accum", RF_LAYOUT_FSDP2, RF_SHARD_MODE_EQUAL, 1, 1, 2, RF_DTYPE_F32, RF_DTYPE_F32, 1, 1e-5, 1},
    {"hsdp-planned-ragged-accum", RF_LAYOUT_PLANNED, RF_SHARD_MODE_RAGGED, 1, 1, 2, RF_DTYPE_F32,
     RF_DTYPE_F32, 1, 1e-5, 2},
};

/* Tensor ids: per layer W, b (and gain on layer 1), each layer its own unit. */
struct model_ids {
  int w[N_LAYERS], b[N_LAYERS], gain;
};

static struct rf_fsdp *build(MPI_Comm shard, MPI_Comm replicate, const struct variant *v,
                             struct model_ids *ids) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.layout = v->layout;
  opt.shard = v->shard;
  opt.reshard_after_forward = v->reshard;
  opt.prefetch = v->prefetch;
  opt.param_dtype = v->pdtype;
  opt.reduce_dtype = v->rdtype;
  opt.block_rows = v->block_rows;
  opt.seed = 42;
  struct rf_fsdp *f;
  RF_ASSERT(rf_fsdp_create_mesh(&f, shard, replicate, &opt) == 0);
  char name[64];
  for (int l = 0; l < N_LAYERS; l++) {
    snprintf(name, sizeof name, "layer%d", l);
    int u = rf_fsdp_add_unit(f, name);
    int64_t wshape[2] = {dims[l + 1], dims[l]}, bshape[1] = {dims[l + 1]}, gshape[1] = {GAIN};
    snprintf(name, sizeof name, "layer%d.weight", l);
    ids->w[l] = rf_fsdp_add_tensor(f, u, name, 2, wshape, 0, (struct rf_init){RF_INIT_NORMAL, 0.4f});
    snprintf(name, sizeof name, "layer%d.bias", l);
    ids->b[l] = rf_fsdp_add_tensor(f, u, name, 1, bshape, 0, (struct rf_init){RF_INIT_UNIFORM, 0.1f});
    if (l == 1)
      ids->gain =
          rf_fsdp_add_tensor(f, u, "layer1.gain", 1, gshape, 0, (struct rf_init){RF_INIT_CONST, 0.25f});
  }
  if (rf_fsdp_finalize(f) != 0) RF_DIE("finalize: %s", rf_fsdp_error());
  return f;
}

/* Gathers every tensor's master weights into full copies (MPI_Allgatherv of the pieces). */
static void gather_full(struct rf_fsdp *f, float **full) {
  int w = rf_fsdp_world(f);
  int *counts = malloc((size_t)w * sizeof(int)), *displs = malloc((size_t)w * sizeof(int));
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    struct rf_tensor_view v;
    rf_fsdp_tensor(f, t, &v);
    for (int r = 0; r < w; r++) {
      counts[r] = (int)(v.starts[r + 1] - v.starts[r]);
      displs[r] = (int)v.starts[r];
    }
    MPI_Allgatherv(v.master, (int)(v.end - v.begin), MPI_FLOAT, full[t], counts, displs, MPI_FLOAT,
                   rf_fsdp_comm(f));
  }
  free(counts);
  free(displs);
}

/* Parameter p as the forward sees it: rounded to bf16 when gathered in bf16. */
static const float *param_f32(struct rf_fsdp *f, int t, float *scratch) {
  const float *p = rf_fsdp_param(f, t);
  if (p) return p;
  struct rf_tensor_view v;
  rf_fsdp_tensor(f, t, &v);
  rf_f32_from_bf16_n(scratch, rf_fsdp_param_bf16(f, t), (size_t)v.numel);
  return scratch;
}

static void round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = rf_f32_from_bf16(rf_bf16_from_f32(x[i]));
}

/* One step of the reference on the whole batch: full weights `p` (n tensors), SGD;
 * *norm gets the gradient norm. */
static void reference_step(float **p, const struct model_ids *ids, const struct variant *v, int step,
                           int skip, double *norm) {
  int rows = BATCH;
  struct acts a;
  acts_init(&a, rows);
  float *g[16] = {0}, *q[16] = {0};
  int n = 2 * N_LAYERS + 1;
  int64_t numel[16];
  for (int l = 0; l < N_LAYERS; l++) {
    numel[ids->w[l]] = dims[l] * dims[l + 1];
    numel[ids->b[l]] = dims[l + 1];
  }
  numel[ids->gain] = GAIN;
  for (int t = 0; t < n; t++) {
    g[t] = calloc((size_t)numel[t], sizeof(float));
    q[t] = malloc((size_t)numel[t] * sizeof(float));
    memcpy(q[t], p[t], (size_t)numel[t] * sizeof(float));
    if (v->pdtype == RF_DTYPE_BF16) round_bf16(q[t], numel[t]);
  }
  for (int m = 0; m < v->accum; m++) {
    for (int i = 0; i < rows; i++) sample(step, m, i, a.h[0] + i * dims[0], a.y + i * dims[N_LAYERS]);
    for (int l = 0; l < N_LAYERS; l++)
      layer_forward(l, q[ids->w[l]], q[ids->b[l]], l == 1 ? q[ids->gain] : NULL, a.h[l], a.pre[l], a.h[l + 1],
                    rows);
    loss_grad(&a, rows, v->accum);
    for (int l = N_LAYERS - 1; l >= 0; l--)
      layer_backward(l, q[ids->w[l]], q[ids->b[l]], l == 1 ? q[ids->gain] : NULL, a.h[l], a.pre[l],
                     a.h[l + 1], a.g[l + 1], g[ids->w[l]], g[ids->b[l]], l == 1 ? g[ids->gain] : NULL, a.g[l],
                     rows);
  }
  double sq = 0;
  for (int t = 0; t < n; t++)
    for (int64_t i = 0; i < numel[t]; i++) sq += (double)g[t][i] * (double)g[t][i];
  *norm = sqrt(sq);
  if (!skip)
    for (int t = 0; t < n; t++)
      for (int64_t i = 0; i < numel[t]; i++) p[t][i] -= LR * g[t][i];
  for (int t = 0; t < n; t++) {
    free(g[t]);
    free(q[t]);
  }
  acts_free(&a);
}

/* The rfsdp step on this rank's share of the batch. nan_rank: the rank that
 * poisons a gradient (-1: none). Returns 1 when the step was skipped. */
static int fsdp_step(struct rf_fsdp *f, const struct model_ids *ids, const struct variant *v, int step,
                     int nan_rank, double *norm_out, int poison_padding) {
  /* the data's rank among all R x S ranks (consecutive shard groups) */
  int world = rf_fsdp_world(f) * rf_fsdp_replicas(f);
  int rank = rf_fsdp_replicate_rank(f) * rf_fsdp_world(f) + rf_fsdp_rank(f);
  int rows = BATCH / world, row0 = rank * rows;
  struct acts a;
  acts_init(&a, rows);
  static float scratch[3][64 * 64];
  rf_fsdp_zero_grad(f);
  for (int m = 0; m < v->accum; m++) {
    for (int i = 0; i < rows; i++) sample(step, m, row0 + i, a.h[0] + i * dims[0], a.y + i * dims[N_LAYERS]);
    for (int l = 0; l < N_LAYERS; l++) {
      rf_fsdp_forward_begin(f, l);
      layer_forward(l, param_f32(f, ids->w[l], scratch[0]), param_f32(f, ids->b[l], scratch[1]),
                    l == 1 ? param_f32(f, ids->gain, scratch[2]) : NULL, a.h[l], a.pre[l], a.h[l + 1], rows);
      rf_fsdp_forward_end(f, l);
    }
    loss_grad(&a, rows, v->accum);
    for (int l = N_LAYERS - 1; l >= 0; l--) {
      rf_fsdp_backward_begin(f, l);
      layer_backward(l, param_f32(f, ids->w[l], scratch[0]), param_f32(f, ids->b[l], scratch[1]),
                     l == 1 ? param_f32(f, ids->gain, scratch[2]) : NULL, a.h[l], a.pre[l], a.h[l + 1],
                     a.g[l + 1], rf_fsdp_grad(f, ids->w[l]), rf_fsdp_grad(f, ids->b[l]),
                     l == 1 ? rf_fsdp_grad(f, ids->gain) : NULL, a.g[l], rows);
      if (rank == nan_rank && l == 2) rf_fsdp_grad(f, ids->w[l])[3] = NAN;
      rf_fsdp_backward_end(f, l);
    }
  }
  rf_fsdp_grads_finish(f);
  acts_free(&a);
  if (poison_padding) {
    /* every slab element that no tensor piece covers is padding: poison it */
    int64_t n = rf_fsdp_shard_elems(f);
    char *covered = calloc((size_t)n, 1);
    for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
      struct rf_tensor_view tv;
      rf_fsdp_tensor(f, t, &tv);
      memset(covered + tv.shard_offset, 1, (size_t)(tv.end - tv.begin));
    }
    for (int64_t i = 0; i < n; i++)
      if (!covered[i]) rf_fsdp_shard_grad(f)[i] = 1e30f;
    free(covered);
  }
  double norm = rf_fsdp_grad_norm(f);
  if (norm_out) *norm_out = norm;
  if (!isfinite(norm)) return 1;
  for (int t = 0; t < rf_fsdp_n_tensors(f); t++) {
    struct rf_tensor_view tv;
    rf_fsdp_tensor(f, t, &tv);
    for (int64_t i = 0; i < tv.end - tv.begin; i++) tv.master[i] -= LR * tv.grad[i];
  }
  return 0;
}

static void run_variant(const struct variant *v, int rank, int world) {
  struct model_ids ids, ids_self;
  int replicas = world % v->replicas == 0 ? v->replicas : world;
  MPI_Comm shard = MPI_COMM_WORLD, replicate = MPI_COMM_SELF;
  if (replicas > 1) { /* consecutive ranks form a shard group */
    MPI_Comm_split(MPI_COMM_WORLD, rank / (world / replicas), rank, &shard);
    MPI_Comm_split(MPI_COMM_WORLD, rank % (world / replicas), rank, &replicate);
  }
  struct rf_fsdp *f = build(shard, replicate, v, &ids);
  if (replicas > 1) {
    MPI_Comm_free(&shard);
    MPI_Comm_free(&replicate);
  }
  RF_CHECK(rf_fsdp_replicas(f) == replicas && rf_fsdp_world(f) * replicas == world,
           "%s: mesh %d x %d at W=%d", v->name, rf_fsdp_replicas(f), rf_fsdp_world(f), world);
  int n = rf_fsdp_n_tensors(f);
  float *full[16], *ref[16], *self_full[16];
  for (int t = 0; t < n; t++) {
    struct rf_tensor_view tv;
    rf_fsdp_tensor(f, t, &tv);
    full[t] = malloc((size_t)tv.numel * sizeof(float));
    ref[t] = malloc((size_t)tv.numel * sizeof(float));
    self_full[t] = malloc((size_t)tv.numel * sizeof(float));
  }
  gather_full(f, ref);
  /* the initialization does not depend on W: a one-rank context gives the same values */
  struct rf_fsdp *self = build(MPI_COMM_SELF, MPI_COMM_SELF, v, &ids_self);
  gather_full(self, self_full);
  for (int t = 0; t < n; t++) {
    struct rf_tensor_view tv;
    rf_fsdp_tensor(f, t, &tv);
    RF_CHECK(memcmp(self_full[t], ref[t], (size_t)tv.numel * sizeof(float)) == 0,
             "%s: %s initialized differently at W=%d and W=1", v->name, tv.name, world);
  }
  rf_fsdp_free(self);

  float *init[16];
  for (int t = 0; t < n; t++) {
    struct rf_tensor_view tv;
    rf_fsdp_tensor(f, t, &tv);
    init[t] = malloc((size_t)tv.numel * sizeof(float));
    memcpy(init[t], ref[t], (size_t)tv.numel * sizeof(float));
  }
  int nan_step = 3;
  for (int s = 0; s < STEPS; s++) {
    struct rf_counters before, after;
    rf_fsdp_get_counters(f, &before, NULL);
    double norm = 0;
    int poison = s == 2;
    int skipped = fsdp_step(f, &ids, v, s, s == nan_step ? world - 1 : -1, &norm, poison);
    rf_fsdp_get_counters(f, &after, NULL);
    struct rf_counters d = rf_counters_diff(&after, &before);
    int all_skipped = skipped, any_skipped = skipped;
    MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &any_skipped, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    RF_CHECK(all_skipped == any_skipped, "%s step %d: ranks disagree on skipping", v->name, s);
    RF_CHECK(skipped == (s == nan_step), "%s step %d: skipped=%d", v->name, s, skipped);
    double ref_norm = 0;
    reference_step(ref, &ids, v, s, s == nan_step, &ref_norm);
    struct rf_counters last;
    rf_fsdp_get_counters(f, NULL, &last); /* the step before this one, through the API */
    if (s >= 2)
      RF_CHECK(
          last.collectives > 0 && last.allocations == 0 && (rf_fsdp_world(f) == 1 || last.bytes_gathered > 0),
          "%s step %d: API counters %llu collectives, %llu allocations", v->name, s,
          (unsigned long long)last.collectives, (unsigned long long)last.allocations);
    if (s >= 1)
      RF_CHECK(d.allocations == 0, "%s step %d: %llu allocations", v->name, s,
               (unsigned long long)d.allocations);
    /* across the replicas: the gradient slab in the reduce dtype, once per step; nothing else
     * crosses the groups */
    uint64_t inter = replicas > 1 ? rf_dtype_size(v->rdtype) * (uint64_t)rf_fsdp_shard_elems(f) : 0;
    RF_CHECK(d.bytes_inter == inter &&
                 d.bytes_intra + d.bytes_inter == d.bytes_gathered + d.bytes_reduced + d.bytes_alltoall,
             "%s step %d: %llu bytes across groups (expected %llu), %llu inside", v->name, s,
             (unsigned long long)d.bytes_inter, (unsigned long long)inter, (unsigned long long)d.bytes_intra);
    if (v->layout == RF_LAYOUT_PLANNED && v->accum == 1 && v->rdtype == RF_DTYPE_F32)
      RF_CHECK(d.bytes_copied == 0, "%s step %d: %llu bytes copied", v->name, s,
               (unsigned long long)d.bytes_copied);
    if (v->layout == RF_LAYOUT_FSDP2) RF_CHECK(d.bytes_copied > 0, "%s: fsdp2 copies nothing", v->name);
    if (v->layout == RF_LAYOUT_PLANNED && v->shard == RF_SHARD_MODE_RAGGED)
      RF_CHECK(d.bytes_padding == 0, "%s: ragged shards moved %llu padding bytes", v->name,
               (unsigned long long)d.bytes_padding);
    if (s == 2 && v->rdtype == RF_DTYPE_F32)
      RF_CHECK(fabs(norm - ref_norm) <= 1e-4 * ref_norm,
               "%s: grad norm %.9g with poisoned padding, reference %.9g", v->name, norm, ref_norm);
  }
  /* Clipping (the last step's gradients): under the bound nothing changes; above it every
   * gradient is scaled so that the norm becomes the bound. */
  double gn = rf_fsdp_grad_norm(f);
  rf_fsdp_clip_grads(f, gn, 2 * gn);
  double g_under = rf_fsdp_grad_norm(f);
  rf_fsdp_clip_grads(f, gn, gn / 4);
  double g_over = rf_fsdp_grad_norm(f);
  RF_CHECK(gn > 0 && g_under == gn && fabs(g_over - gn / 4) <= 1e-5 * gn,
           "%s: clipping a norm of %.9g gave %.9g under a bound of twice it, %.9g under a quarter", v->name,
           gn, g_under, g_over);
  gather_full(f, full);
  double worst = 0, change = 0;
  for (int t = 0; t < n; t++) {
    struct rf_tensor_view tv;
    rf_fsdp_tensor(f, t, &tv);
    worst = rf_test_max(worst, rf_test_max_abs_diff(full[t], ref[t], (size_t)tv.numel));
    change = rf_test_max(change, rf_test_max_abs_diff(ref[t], init[t], (size_t)tv.numel));
  }
  RF_CHECK(change > 1e-3, "%s: training changed nothing (%g)", v->name, change);
  RF_CHECK(worst <= v->tol * change, "%s at W=%d: parameters differ from the reference by %.3g (change %.3g)",
           v->name, world, worst, change);
  if (rank == 0)
    printf("%-30s W=%d  max |p - p_ref| = %.3g  (largest change %.3g)\n", v->name, world, worst, change);
  for (int t = 0; t < n; t++) {
    free(full[t]);
    free(ref[t]);
    free(self_full[t]);
    free(init[t]);
  }
  rf_fsdp_free(f);
}

/* Bad declarations are refused with a message. */
static void check_errors(void) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.prefetch = -1;
  struct rf_fsdp *f;
  RF_CHECK(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) != 0 && strstr(rf_fsdp_error(), "prefetch"),
           "bad prefetch");
  rf_fsdp_options_default(&opt);
  /* A 2-D mesh: the shard group and the replicate group. W replicas of one-rank groups: */
  int world = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = rf_fsdp_create_mesh(&f, MPI_COMM_SELF, MPI_COMM_WORLD, &opt);
  RF_CHECK(
      rc == 0 && rf_fsdp_world(f) == 1 && rf_fsdp_replicas(f) == world && rf_fsdp_replicate_rank(f) == rank,
      "replicate group of %d ranks: %s", world, rc ? rf_fsdp_error() : "wrong sizes");
  if (rc == 0) rf_fsdp_free(f);
  if (world > 2) { /* not a grid: shard groups {0} and {1..W-1}, every rank in one replicate group */
    MPI_Comm shard;
    MPI_Comm_split(MPI_COMM_WORLD, rank > 0, rank, &shard);
    rc = rf_fsdp_create_mesh(&f, shard, MPI_COMM_WORLD, &opt);
    RF_CHECK(rc != 0 && strstr(rf_fsdp_error(), "not a grid"), "a mesh that is not a grid: %s",
             rc ? rf_fsdp_error() : "accepted");
    if (rc == 0) rf_fsdp_free(f);
    MPI_Comm_free(&shard);
  }
  RF_ASSERT(rf_fsdp_create_mesh(&f, MPI_COMM_WORLD, MPI_COMM_SELF, &opt) == 0);
  RF_CHECK(rf_fsdp_world(f) == world, "mesh: shard group of %d ranks", rf_fsdp_world(f));
  rf_fsdp_free(f);
  RF_ASSERT(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) == 0);
  int u = rf_fsdp_add_unit(f, "u");
  int64_t bad[2] = {3, 0};
  RF_CHECK(rf_fsdp_add_tensor(f, u, "t", 2, bad, 0, (struct rf_init){RF_INIT_ZEROS, 0}) < 0 &&
               strstr(rf_fsdp_error(), "not positive"),
           "zero dimension accepted: %s", rf_fsdp_error());
  int64_t ok[1] = {4};
  RF_CHECK(rf_fsdp_add_tensor(f, u, "t", 1, ok, 0, (struct rf_init){RF_INIT_ZEROS, 0}) == 0, "good tensor");
  RF_CHECK(rf_fsdp_add_tensor(f, u, "t", 1, ok, 0, (struct rf_init){RF_INIT_ZEROS, 0}) < 0 &&
               strstr(rf_fsdp_error(), "twice"),
           "duplicate accepted");
  rf_fsdp_add_unit(f, "empty");
  RF_CHECK(rf_fsdp_finalize(f) != 0 && strstr(rf_fsdp_error(), "no tensors"), "empty unit: %s",
           rf_fsdp_error());
  rf_fsdp_free(f);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  check_errors();
  for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) run_variant(&variants[i], rank, world);
  return rf_test_finish("test_fsdp");
}
