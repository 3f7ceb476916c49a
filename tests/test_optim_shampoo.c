/* rf-test: np=1,2,3,5 timeout=60
 * --optim shampoo (src/optim/shampoo.c) under mpirun, on a small model with odd
 * shapes (a 37 x 20 and a 20 x 45 matrix cut into blocks of at most 16 per side, a
 * 7 x 3 matrix, 3 fused experts of 18 x 20 as one 3-D tensor, a vector and a 2-D
 * tensor that is not a matrix), each tensor cut
 * over the W ranks at random points (empty pieces allowed):
 *   - against tests/ref_shampoo.py (a float64 torch implementation of Distributed
 *     Shampoo's algorithm; tests/data/shampoo_ref.bin): after 10 steps with roots
 *     refreshed at steps 4 and 8, every parameter within 1e-5 relative;
 *   - against the same problem on one rank (MPI_COMM_SELF, every rank):
 *     parameters and optimizer state (AdamW's m and v, each matrix's factors,
 *     roots and grafting state on its owner) bit-identical; every matrix refreshed
 *     on exactly one rank (twice), eigendecompositions counted once per factor;
 *     nothing allocated in the steps;
 *   - --shampoo-stagger: bit-identical to its one-rank run, and no two matrices
 *     refresh in the same step (4 matrix views, 4 phases);
 *   - resume: the state saved after 6 steps by min(W, 3) ranks and loaded by
 *     2 ranks (W >= 3: resharded 3 -> 2; else by the same ranks) continues to
 *     step 10 bit-identical to the uninterrupted one-rank run;
 *   - closed forms at the default epsilon 1e-12 (check_closed_forms, rank 0): a full-rank
 *     6 x 6 matrix's first step refreshed at step 1 is U Vt (the polar factor, from LAPACK's
 *     SVD) grafted to Adam's norm, and before any refresh G grafted to Adam's norm, which is
 *     not Adam's own step (Distributed Shampoo's default until start_preconditioning_step);
 *   - Distributed Shampoo's own code (check_ds_record, rank 0; tests/ref_shampoo_ds.py's record):
 *     4 steps of a 6 x 6 and a 6 x 4 matrix refreshed every step within 1e-4 of max |p - p0|;
 *   - bad options refused naming the option (block 0, refresh interval 0, negative
 *     epsilon); an infinite gradient (a non-finite factor) and, with epsilon 0, a
 *     zero factor (no finite root) stop the step at the next refresh on every
 *     rank (-1, the tensor named), with no hang. */
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm_mpi.h"
#include "optim/optim.h"
#include "rf_test.h"
#include "run/run.h"

#define REF_PATH "tests/data/shampoo_ref.bin"
#define NT 6
#define STEPS 10
#define MAXW 8
/* What a create allocates besides its state and workspace (its structs, the views,
 * blocks and owners' tables): 4.9 to 5.3 KB measured here at W <= 3 */
#define BOOKKEEPING_BYTES 8192

struct spec {
  const char *name;
  int unit, ndim;
  int64_t shape[3];
  int flags;
};

static const struct spec specs[NT] = {
    {"a.w", 0, 2, {37, 20}, RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX},
    {"b.w", 1, 2, {20, 45}, RF_OPTIM_FLAG_MATRIX},
    {"c.w", 0, 2, {7, 3}, RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX},
    {"d.v", 0, 1, {50, 0}, 0},
    {"e.h", 1, 2, {12, 10}, RF_OPTIM_FLAG_DECAY},
    {"f.x", 1, 3, {3, 18, 20}, RF_OPTIM_FLAG_DECAY | RF_OPTIM_FLAG_MATRIX}, /* 3 fused experts */
};

static int64_t numel_of(int t) {
  int64_t n = 1;
  for (int d = 0; d < specs[t].ndim; d++) n *= specs[t].shape[d];
  return n;
}

/* ---- the reference file ---------------------------------------------------------- */

static float *ref_p0[NT], *ref_g[NT], *ref_p[NT];
static char *blob;

static int ref_load(void) {
  size_t bytes;
  RF_TRY(rf_file_read_all(REF_PATH, &blob, &bytes));
  RF_REQUIRE(bytes >= 16 && memcmp(blob, "RFSHAMPO", 8) == 0, "%s: not a Shampoo reference file", REF_PATH);
  uint32_t version, n;
  memcpy(&version, blob + 8, 4);
  memcpy(&n, blob + 12, 4);
  RF_REQUIRE(version == 1 && n == 3 * NT, "%s: version %u, %u records", REF_PATH, version, n);
  size_t pos = 16;
  for (uint32_t i = 0; i < n; i++) {
    uint32_t len, ndim;
    RF_REQUIRE(pos + 4 <= bytes, "%s: truncated", REF_PATH);
    memcpy(&len, blob + pos, 4);
    char name[64];
    RF_REQUIRE(len < sizeof name && pos + 8 + len <= bytes, "%s: record %u", REF_PATH, i);
    memcpy(name, blob + pos + 4, len);
    name[len] = '\0';
    memcpy(&ndim, blob + pos + 4 + len, 4);
    pos += 8 + len;
    int64_t numel = 1, shape[4];
    RF_REQUIRE(ndim <= 4 && pos + 8 * ndim <= bytes, "%s: record %s", REF_PATH, name);
    memcpy(shape, blob + pos, 8 * ndim);
    pos += 8 * ndim;
    for (uint32_t d = 0; d < ndim; d++) numel *= shape[d];
    RF_REQUIRE(pos + 4 * (size_t)numel <= bytes, "%s: record %s truncated", REF_PATH, name);
    float *data = rf_xmalloc((size_t)numel * sizeof(float));
    memcpy(data, blob + pos, (size_t)numel * sizeof(float));
    pos += 4 * (size_t)numel;
    int t = 0;
    while (t < NT && strncmp(name, specs[t].name, strlen(specs[t].name)) != 0) t++;
    RF_REQUIRE(t < NT, "%s: unknown record %s", REF_PATH, name);
    const char *kind = name + strlen(specs[t].name);
    int64_t want = strcmp(kind, ".g") == 0 ? STEPS * numel_of(t) : numel_of(t);
    RF_REQUIRE(numel == want, "%s: %s has %lld elements, expected %lld", REF_PATH, name, (long long)numel,
               (long long)want);
    float **slot = strcmp(kind, ".p0") == 0 ? &ref_p0[t] : strcmp(kind, ".g") == 0 ? &ref_g[t] : &ref_p[t];
    *slot = data;
  }
  return 0;
}

/* ---- one run: a layout over W ranks, this rank's shard and optimizer -------------- */

struct run {
  int world, rank;
  int64_t starts[NT][MAXW + 1];
  int64_t shard_elems;
  float *master, *grad;
  struct rf_tensor_view views[NT];
  struct rf_optim *o;
};

static void opts(struct rf_optim_options *opt) {
  rf_optim_options_default(opt);
  opt->kind = RF_OPTIM_KIND_SHAMPOO;
  opt->weight_decay = 0.1f;
  opt->shampoo_block = 16;
  opt->shampoo_every = 4;
  opt->shampoo_beta2 = 0.99f;
  opt->shampoo_eps = 1e-2f;
}

/* Random cuts of every tensor (seeded by the world size); the rank's pieces packed. */
static int run_init(struct run *d, const struct rf_comm *comm, const struct rf_optim_options *opt) {
  memset(d, 0, sizeof *d);
  d->world = comm->world;
  d->rank = comm->rank;
  int64_t off[NT];
  for (int t = 0; t < NT; t++) {
    rf_test_random_cuts(numel_of(t), d->world, 1000 + 17 * (uint64_t)d->world + (uint64_t)t, d->starts[t]);
    off[t] = d->shard_elems;
    d->shard_elems += d->starts[t][d->rank + 1] - d->starts[t][d->rank];
  }
  d->master = rf_xcalloc((size_t)d->shard_elems + 1, sizeof(float));
  d->grad = rf_xcalloc((size_t)d->shard_elems + 1, sizeof(float));
  int flags[NT];
  for (int t = 0; t < NT; t++) {
    struct rf_tensor_view *v = &d->views[t];
    v->name = specs[t].name;
    v->unit = specs[t].unit;
    v->ndim = specs[t].ndim;
    v->shape[0] = specs[t].shape[0];
    v->shape[1] = specs[t].shape[1];
    v->shape[2] = specs[t].shape[2];
    v->numel = numel_of(t);
    v->block_elems = 1;
    v->starts = d->starts[t];
    v->begin = d->starts[t][d->rank];
    v->end = d->starts[t][d->rank + 1];
    v->shard_offset = off[t];
    v->master = d->master + off[t];
    v->grad = d->grad + off[t];
    memcpy(v->master, ref_p0[t] + v->begin, (size_t)(v->end - v->begin) * sizeof(float));
    flags[t] = specs[t].flags;
  }
  uint64_t bytes0 = rf_xalloc_bytes();
  int rc = rf_optim_create(&d->o, opt, d->views, flags, NT, d->shard_elems, comm);
  if (rc == 0) { /* what the create allocated (the allocator's count) against what it reports */
    int64_t got = (int64_t)(rf_xalloc_bytes() - bytes0);
    struct rf_optim_stats st;
    rf_optim_get_stats(d->o, &st);
    int64_t extra = got - st.state_bytes - st.workspace_bytes;
    RF_CHECK(extra >= 0 && extra <= BOOKKEEPING_BYTES,
             "shampoo rank %d: the create allocated %lld bytes, state_bytes %lld + workspace_bytes %lld (the "
             "rest, %lld, is not the bookkeeping of at most %d bytes)",
             d->rank, (long long)got, (long long)st.state_bytes, (long long)st.workspace_bytes,
             (long long)extra, BOOKKEEPING_BYTES);
  }
  return rc;
}

/* Steps [from, to) with the reference's gradients (`poison`: this step's first
 * element of tensor `pt` held by the last rank becomes +inf; `zero`: tensor pt's
 * gradients are 0). Returns the first failed step's status. */
static int run_steps(struct run *d, int from, int to, int poison, int zero, int pt) {
  for (int s = from; s < to; s++) {
    for (int t = 0; t < NT; t++) {
      struct rf_tensor_view *v = &d->views[t];
      int64_t len = v->end - v->begin;
      memcpy(v->grad, ref_g[t] + s * numel_of(t) + v->begin, (size_t)len * sizeof(float));
      if (t == pt && zero) memset(v->grad, 0, (size_t)len * sizeof(float));
      if (t == pt && s == poison && len > 0 && d->rank == d->world - 1) v->grad[0] = 1.0f / 0.0f;
    }
    RF_TRY(rf_optim_step(d->o, 1e-2f));
  }
  return 0;
}

static void run_free(struct run *d) {
  rf_optim_free(d->o);
  free(d->master);
  free(d->grad);
}

/* ---- checks ----------------------------------------------------------------------- */

static void check_ref(const struct run *d, const char *label) {
  double worst = 0;
  for (int t = 0; t < NT; t++) {
    const struct rf_tensor_view *v = &d->views[t];
    int64_t len = v->end - v->begin;
    if (len == 0) continue;
    double x = rf_test_max_rel_diff(v->master, ref_p[t] + v->begin, (size_t)len, 1e-2);
    if (getenv("RF_TEST_VERBOSE")) printf("%s %s: %.3g\n", label, v->name, x);
    worst = rf_test_max(worst, x);
  }
  RF_CHECK(worst <= 1e-5, "%s: parameters differ from the float64 reference by %.3g relative", label, worst);
}

/* d's parameters and state bit-identical to ref's (one rank, the whole problem). */
static void check_same(const struct run *d, const struct run *ref, const char *label) {
  long bad_p = 0, bad_s = 0;
  struct rf_optim_state_slab s[3], rs[3];
  for (int i = 0; i < 3; i++) {
    rf_optim_state(d->o, i, &s[i]);
    rf_optim_state(ref->o, i, &rs[i]);
  }
  for (int t = 0; t < NT; t++) {
    const struct rf_tensor_view *v = &d->views[t], *rv = &ref->views[t];
    size_t len = (size_t)(v->end - v->begin);
    bad_p += memcmp(v->master, rv->master + v->begin, len * sizeof(float)) != 0;
    for (int i = 0; i < 2; i++)
      bad_s += memcmp((const float *)s[i].data + v->shard_offset,
                      (const float *)rs[i].data + rv->shard_offset + v->begin, len * sizeof(float)) != 0;
    int64_t off, cnt, first, roff, rcnt, rfirst;
    rf_optim_scales(d->o, t, &off, &cnt, &first);
    rf_optim_scales(ref->o, t, &roff, &rcnt, &rfirst);
    if (cnt > 0)
      bad_s += cnt != rcnt || memcmp((const float *)s[2].data + off, (const float *)rs[2].data + roff,
                                     (size_t)cnt * sizeof(float)) != 0;
  }
  RF_CHECK(bad_p == 0, "%s: %ld tensors' parameters differ from the one-rank run", label, bad_p);
  RF_CHECK(bad_s == 0, "%s: %ld state pieces differ from the one-rank run", label, bad_s);
}

/* Every matrix refreshed STEPS / every times on exactly one rank, all ranks agree
 * on the owners; eigendecompositions: two per block per refresh in the world. */
static void check_owners(const struct run *d, const struct rf_comm *comm) {
  int64_t counts[NT], own_min[NT], own_max[NT];
  for (int t = 0; t < NT; t++) {
    counts[t] = rf_optim_muon_count(d->o, t);
    own_min[t] = own_max[t] = rf_optim_muon_owner(d->o, t);
  }
  rf_comm_allreduce(comm, counts, NT, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  rf_comm_allreduce(comm, own_min, NT, RF_DTYPE_I64, RF_REDUCE_OP_MIN);
  rf_comm_allreduce(comm, own_max, NT, RF_DTYPE_I64, RF_REDUCE_OP_MAX);
  int64_t blocks = 0;
  for (int t = 0; t < NT; t++) {
    int matrix = (specs[t].flags & RF_OPTIM_FLAG_MATRIX) != 0;
    RF_CHECK(own_min[t] == own_max[t] && (own_min[t] >= 0) == matrix, "%s: owners %lld..%lld", specs[t].name,
             (long long)own_min[t], (long long)own_max[t]);
    RF_CHECK(counts[t] == (matrix ? STEPS / 4 : 0), "%s: refreshed %lld times in the world", specs[t].name,
             (long long)counts[t]);
    int nd = specs[t].ndim;
    if (matrix)
      blocks += (nd == 3 ? specs[t].shape[0] : 1) * rf_ceil_div(specs[t].shape[nd - 2], 16) *
                rf_ceil_div(specs[t].shape[nd - 1], 16);
  }
  struct rf_optim_stats st;
  rf_optim_get_stats(d->o, &st);
  int64_t eighs = st.shampoo_eighs;
  rf_comm_allreduce(comm, &eighs, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  const int64_t expected = 2 * blocks * (STEPS / 4); /* every matrix's two factors, every 4th step */
  RF_CHECK(eighs == expected, "%lld eigendecompositions in the world, expected %lld", (long long)eighs,
           (long long)expected);
  if (comm->rank == 0)
    printf(
        "W=%d: %lld blocks, %lld eigendecompositions in %d steps (redundancy %.2f); rank 0: %lld state "
        "bytes, "
        "%llu bytes sent per step\n",
        comm->world, (long long)blocks, (long long)eighs, STEPS, (double)eighs / (double)expected,
        (long long)st.state_bytes, (unsigned long long)st.muon_step_bytes_sent);
}

/* Staggered refreshes: matrices in different steps, the result still independent of W. */
static void check_stagger(const struct rf_comm *comm, const struct rf_comm *self) {
  struct rf_optim_options opt;
  opts(&opt);
  opt.shampoo_stagger = 1;
  struct run ref = {0}, d = {0};
  RF_CHECK(run_init(&ref, self, &opt) == 0 && run_init(&d, comm, &opt) == 0, "stagger: %s", rf_error_msg());
  int64_t before[NT] = {0}, total = 0;
  for (int s = 0; s < STEPS; s++) {
    RF_CHECK(run_steps(&ref, s, s + 1, -1, 0, -1) == 0 && run_steps(&d, s, s + 1, -1, 0, -1) == 0,
             "stagger step %d: %s", s + 1, rf_error_msg());
    int64_t now[NT];
    for (int t = 0; t < NT; t++) now[t] = rf_optim_muon_count(d.o, t);
    rf_comm_allreduce(comm, now, NT, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
    int refreshed = 0;
    for (int t = 0; t < NT; t++) {
      refreshed += now[t] > before[t];
      total += now[t] - before[t];
      before[t] = now[t];
    }
    RF_CHECK(refreshed <= 1, "stagger: %d matrices refreshed in step %d", refreshed, s + 1);
  }
  RF_CHECK(total >= 6, "stagger: %lld refreshes in %d steps", (long long)total, STEPS);
  char label[48];
  snprintf(label, sizeof label, "stagger W=%d", comm->world);
  check_same(&d, &ref, label);
  run_free(&d);
  run_free(&ref);
}

/* ---- resume across world sizes ----------------------------------------------------- */

struct agree_ctx {
  const struct rf_comm *comm;
};

static int agree(void *ctx, int status) {
  const struct agree_ctx *a = ctx;
  int s = status;
  rf_comm_allreduce(a->comm, &s, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  return s;
}

static int save_or_load(struct run *d, const struct rf_comm *comm, const char *dir, int save) {
  struct rf_run_states st;
  rf_run_states_make(d->o, &st);
  struct agree_ctx ac = {comm};
  struct rf_ckpt_views_args a = {.dir = dir,
                                 .rank = comm->rank,
                                 .world = comm->world,
                                 .step = 6,
                                 .n_views = NT,
                                 .views = d->views,
                                 .n_states = st.n,
                                 .states = st.desc,
                                 .agree = agree,
                                 .agree_ctx = &ac};
  return save ? rf_ckpt_save_views(&a) : rf_ckpt_load_views(&a, NULL, NULL);
}

static void check_resume(const struct rf_comm *world, const struct run *ref, const char *dir) {
  int ws = world->world < 3 ? world->world : 3, wl = ws == 3 ? 2 : ws;
  struct rf_optim_options opt;
  opts(&opt);
  MPI_Comm cs, cl;
  MPI_Comm_split(MPI_COMM_WORLD, world->rank < ws ? 0 : MPI_UNDEFINED, world->rank, &cs);
  if (world->rank < ws) {
    struct rf_comm c;
    rf_comm_init(&c, cs);
    struct run d;
    RF_CHECK(run_init(&d, &c, &opt) == 0, "resume: create at W=%d: %s", ws, rf_error_msg());
    RF_CHECK(run_steps(&d, 0, 6, -1, 0, -1) == 0, "resume: steps at W=%d: %s", ws, rf_error_msg());
    RF_CHECK(save_or_load(&d, &c, dir, 1) == 0, "save at W=%d: %s", ws, rf_error_msg());
    run_free(&d);
    rf_comm_free(&c);
    MPI_Comm_free(&cs);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm_split(MPI_COMM_WORLD, world->rank < wl ? 0 : MPI_UNDEFINED, world->rank, &cl);
  if (world->rank < wl) {
    struct rf_comm c;
    rf_comm_init(&c, cl);
    struct run d;
    RF_CHECK(run_init(&d, &c, &opt) == 0, "resume: create at W=%d: %s", wl, rf_error_msg());
    for (int t = 0; t < NT; t++) /* the load must bring the parameters back */
      memset(d.views[t].master, 0, (size_t)(d.views[t].end - d.views[t].begin) * sizeof(float));
    RF_CHECK(save_or_load(&d, &c, dir, 0) == 0, "load at W=%d: %s", wl, rf_error_msg());
    rf_optim_set_step(d.o, 6);
    RF_CHECK(run_steps(&d, 6, STEPS, -1, 0, -1) == 0, "resumed steps at W=%d: %s", wl, rf_error_msg());
    char label[64];
    snprintf(label, sizeof label, "saved at W=%d, resumed at W=%d", ws, wl);
    check_same(&d, ref, label);
    if (c.rank == 0) printf("%s: bit-identical to the uninterrupted run\n", label);
    run_free(&d);
    rf_comm_free(&c);
    MPI_Comm_free(&cl);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

/* ---- bad input ------------------------------------------------------------------------ */

static void check_bad_options(const struct rf_comm *self) {
  struct {
    const char *option;
    int64_t block, every;
    float eps;
  } cases[] = {
      {"--shampoo-block", 0, 4, 1e-4f}, {"--shampoo-every", 16, 0, 1e-4f}, {"--shampoo-eps", 16, 4, -1e-6f}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct rf_optim_options opt;
    opts(&opt);
    opt.shampoo_block = cases[i].block;
    opt.shampoo_every = cases[i].every;
    opt.shampoo_eps = cases[i].eps;
    struct run d;
    int rc = run_init(&d, self, &opt);
    RF_CHECK(rc != 0 && strstr(rf_error_msg(), cases[i].option), "%s refused: rc %d, '%s'", cases[i].option,
             rc, rf_error_msg());
    d.o = NULL;
    run_free(&d);
  }
}

/* One 6 x 6 matrix, one step, against closed forms computed here (f64, LAPACK's SVD, not the
 * optimizer's eigendecomposition). G = 1e-3 (M + 3 I) (M uniform in [-1, 1)): full rank, so
 * at step 1 the factors L = G Gᵀ and R = Gᵀ G (bias-corrected) have eigenvalues near 1e-5, and
 * with the default epsilon 1e-12 the direction Lr G Rr = (G Gᵀ)^-1/4 G (Gᵀ G)^-1/4 is U Vᵀ, the
 * orthogonal polar factor of G = U S Vᵀ. Grafted to Adam's norm per block (its first step:
 * A = G / (|G| + eps), the bias corrections cancel): p1 = p0 - lr U Vᵀ ‖A‖ / ‖U Vᵀ‖.
 *   --shampoo-every 1 (a refresh at step 1, default epsilon 1e-12): max|dp - ref| / max|ref|
 *   <= 1e-5 (f32 factors and roots; measured 2.2e-7; an epsilon floored at 1e-6 moves it by 4.8%);
 *   --shampoo-every 100 (no refresh yet: identity roots): p1 = p0 - lr G ‖A‖ / ‖G‖, which is
 *   NOT Adam's first step p0 - lr A (Distributed Shampoo's default until its
 *   start_preconditioning_step; docs/optim.md): checked to differ by more than 10%. */
static void check_closed_forms(const struct rf_comm *self) {
  enum { N = 6 };
  const float lr = 0.1f;
  double g[N * N], a[N * N], an = 0, gn = 0;
  uint64_t rng = 99;
  for (int i = 0; i < N * N; i++) {
    g[i] = (double)(float)(1e-3 * ((double)rf_test_rand_f32(&rng) + (i % (N + 1) == 0 ? 3.0 : 0.0)));
    a[i] = g[i] / (fabs(g[i]) + 1e-8);
    an += a[i] * a[i];
    gn += g[i] * g[i];
  }
  an = sqrt(an), gn = sqrt(gn);
  /* U Vᵀ from the SVD of G (row-major) */
  double s[N], u[N * N], vt[N * N], sup[N], gc[N * N], polar[N * N];
  memcpy(gc, g, sizeof gc);
  RF_ASSERT(LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'A', 'A', N, N, gc, N, s, u, N, vt, N, sup) == 0);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < N; j++) {
      double acc = 0;
      for (int k = 0; k < N; k++) acc += u[i * N + k] * vt[k * N + j];
      polar[i * N + j] = acc;
    }
  for (int every = 1; every <= 100; every += 99) {
    float p[N * N], gf[N * N];
    for (int i = 0; i < N * N; i++) p[i] = 0.5f, gf[i] = (float)g[i];
    int64_t starts[2] = {0, N * N};
    struct rf_tensor_view v = {.name = "m",
                               .ndim = 2,
                               .shape = {N, N},
                               .numel = N * N,
                               .block_elems = 1,
                               .starts = starts,
                               .begin = 0,
                               .end = N * N,
                               .master = p,
                               .grad = gf};
    int flags = RF_OPTIM_FLAG_MATRIX;
    struct rf_optim_options opt;
    rf_optim_options_default(&opt); /* shampoo_eps 1e-12 */
    opt.kind = RF_OPTIM_KIND_SHAMPOO;
    opt.shampoo_every = every;
    struct rf_optim *o = NULL;
    RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, N * N, self) == 0);
    RF_CHECK(rf_optim_step(o, lr) == 0, "closed forms, every %d: %s", every, rf_error_msg());
    double err = 0, top = 0, adam = 0;
    for (int i = 0; i < N * N; i++) {
      double want = every == 1 ? lr * polar[i] * an / sqrt((double)N) : lr * g[i] * an / gn;
      err = rf_test_max(err, fabs((0.5 - (double)p[i]) - want));
      top = rf_test_max(top, fabs(want));
      adam = rf_test_max(adam, fabs(want - lr * a[i]));
    }
    RF_CHECK(err <= 1e-5 * top, "every %d (%s): the step is %.3g of max from its closed form", every,
             every == 1 ? "refreshed at step 1, eps 1e-12" : "identity roots", err / top);
    if (every == 100)
      RF_CHECK(adam > 0.1 * top, "identity roots: the step is Adam's (%.3g of max apart)", adam / top);
    printf("closed forms, every %d: %.3g of max from %s (Adam's step: %.3g of max apart)\n", every, err / top,
           every == 1 ? "U Vt, eps 1e-12" : "G |A| / |G|", adam / top);
    rf_optim_free(o);
  }
}

/* Distributed Shampoo's own code (tests/ref_shampoo_ds.py, facebookresearch/optimizers at
 * f606606; its record tests/data/shampoo_ds_ref.txt): a 6 x 6 matrix (G = 1e-3 (M + 3 I)) and a
 * 6 x 4 one (G = 1e-3 M, so L = G Gᵀ is singular at step 1), 4 steps with new gradients, roots
 * refreshed every step (DS's start_preconditioning_step 1, precondition_frequency 1;
 * --shampoo-every 1), epsilon 1e-12, Adam grafting, lr 0.1, DS keeping the matrix a matrix
 * (target_parameter_dimensionality 2: at DS's default 1 it merges a small matrix into one
 * vector, full-matrix AdaGrad, 0.18-0.32 of max from these steps; rfsdp never merges). After
 * every step max|p - p_DS| / max|p_DS - p0| <= 1e-4 (f32 factors in both, f64 roots here and
 * f32 in DS: measured 8.6e-7 and 4.3e-6). */
static void check_ds_record(const struct rf_comm *self) {
  enum { STEPS_DS = 4, MAXN = 36 };
  static const struct {
    const char *name;
    int rows, cols;
    double diag;
  } cases[] = {{"square", 6, 6, 3.0}, {"tall", 6, 4, 0.0}};
  char *text = NULL;
  size_t bytes = 0;
  RF_ASSERT(rf_file_read_all("tests/data/shampoo_ds_ref.txt", &text, &bytes) == 0);
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int rows = cases[c].rows, cols = cases[c].cols, n = rows * cols;
    float p[MAXN], g[MAXN];
    for (int i = 0; i < n; i++) p[i] = 0.5f;
    int64_t starts[2] = {0, n};
    struct rf_tensor_view v = {.name = cases[c].name,
                               .ndim = 2,
                               .shape = {rows, cols},
                               .numel = n,
                               .block_elems = 1,
                               .starts = starts,
                               .begin = 0,
                               .end = n,
                               .master = p,
                               .grad = g};
    int flags = RF_OPTIM_FLAG_MATRIX;
    struct rf_optim_options opt;
    rf_optim_options_default(&opt); /* betas 0.9 / 0.95, eps 1e-8; shampoo_beta2 0.999, eps 1e-12 */
    opt.kind = RF_OPTIM_KIND_SHAMPOO;
    opt.shampoo_every = 1;
    struct rf_optim *o = NULL;
    RF_ASSERT(rf_optim_create(&o, &opt, &v, &flags, 1, n, self) == 0);
    double worst = 0;
    for (int t = 1; t <= STEPS_DS; t++) {
      uint64_t rng = 1000 * (uint64_t)t;
      for (int i = 0; i < n; i++)
        g[i] =
            (float)(1e-3 * ((double)rf_test_rand_f32(&rng) + (i / cols == i % cols ? cases[c].diag : 0.0)));
      RF_CHECK(rf_optim_step(o, 0.1f) == 0, "DS record, %s step %d: %s", cases[c].name, t, rf_error_msg());
      char key[32];
      snprintf(key, sizeof key, "\n%s %d ", cases[c].name, t);
      const char *at = strstr(text, key);
      RF_CHECK(at != NULL, "tests/data/shampoo_ds_ref.txt: no line '%s %d'", cases[c].name, t);
      if (!at) break;
      char *end = (char *)at + strlen(key);
      double err = 0, top = 0;
      for (int i = 0; i < n; i++) {
        double want = strtod(end, &end);
        err = rf_test_max(err, fabs((double)p[i] - want));
        top = rf_test_max(top, fabs(want - 0.5));
      }
      RF_CHECK(err <= 1e-4 * top, "DS record, %s step %d: %.3g of max |p - p0| from Distributed Shampoo's",
               cases[c].name, t, err / top);
      worst = rf_test_max(worst, err / top);
    }
    printf("Distributed Shampoo's record, %s %dx%d, %d steps: within %.3g of max |p - p0|\n", cases[c].name,
           rows, cols, STEPS_DS, worst);
    rf_optim_free(o);
  }
  free(text);
}

/* A failure at the refresh of step 4 on the owner: every rank returns -1 naming b.w. */
static void check_failure(const struct rf_comm *comm, int zero) {
  struct rf_optim_options opt;
  opts(&opt);
  if (zero) opt.shampoo_eps = 0.0f;
  struct run d;
  RF_CHECK(run_init(&d, comm, &opt) == 0, "create: %s", rf_error_msg());
  int rc = run_steps(&d, 0, STEPS, zero ? -1 : 2, zero, 1);
  const char *want = zero ? "eigendecomposition of L" : "non-finite left factor";
  int ok = rc != 0 && strstr(rf_error_msg(), "'b.w'") && strstr(rf_error_msg(), want) &&
           strstr(rf_error_msg(), "step 4");
  RF_CHECK(ok, "%s: rc %d, '%s'", zero ? "zero factor, eps 0" : "infinite gradient", rc, rf_error_msg());
  if (comm->rank == 0) printf("failure agreed at W=%d: %s\n", comm->world, rf_error_msg());
  run_free(&d);
}

int main(int argc, char **argv) {
  int world_size;
  int rank = rf_test_mpi_init(&argc, &argv, &world_size);
  RF_ASSERT(world_size <= MAXW);
  if (ref_load() != 0) {
    fprintf(stderr, "%s\n", rf_error_msg());
    return 1;
  }
  struct rf_comm comm, self;
  rf_comm_init(&comm, MPI_COMM_WORLD);
  rf_comm_init(&self, MPI_COMM_SELF);
  struct rf_optim_options opt;
  opts(&opt);

  struct run ref, d;
  RF_CHECK(run_init(&ref, &self, &opt) == 0, "create at W=1: %s", rf_error_msg());
  RF_CHECK(run_steps(&ref, 0, STEPS, -1, 0, -1) == 0, "steps at W=1: %s", rf_error_msg());
  check_ref(&ref, "W=1");

  RF_CHECK(run_init(&d, &comm, &opt) == 0, "create at W=%d: %s", world_size, rf_error_msg());
  RF_CHECK(run_steps(&d, 0, 1, -1, 0, -1) == 0, "first step: %s", rf_error_msg()); /* GEMM primitives */
  uint64_t allocs0 = rf_heap_allocations();
  RF_CHECK(run_steps(&d, 1, STEPS, -1, 0, -1) == 0, "steps at W=%d: %s", world_size, rf_error_msg());
  RF_CHECK(rf_heap_allocations() == allocs0, "%llu allocations in the steps",
           (unsigned long long)(rf_heap_allocations() - allocs0));
  char label[32];
  snprintf(label, sizeof label, "W=%d", world_size);
  check_ref(&d, label);
  check_same(&d, &ref, label);
  check_owners(&d, &comm);
  run_free(&d);

  check_stagger(&comm, &self);

  char dir[64] = "/tmp/rf_test_shampoo.XXXXXX";
  if (rank == 0) RF_ASSERT(mkdtemp(dir) != NULL);
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  char ck[96];
  snprintf(ck, sizeof ck, "%s/ck", dir);
  check_resume(&comm, &ref, ck);

  if (rank == 0) {
    check_bad_options(&self);
    check_closed_forms(&self);
    check_ds_record(&self);
  }
  check_failure(&comm, 0);
  check_failure(&comm, 1);

  run_free(&ref);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    RF_CHECK(system(cmd) == 0, "cleanup");
  }
  for (int t = 0; t < NT; t++) {
    free(ref_p0[t]);
    free(ref_g[t]);
    free(ref_p[t]);
  }
  free(blob);
  rf_comm_free(&self);
  rf_comm_free(&comm);
  return rf_test_finish("test_optim_shampoo");
}
