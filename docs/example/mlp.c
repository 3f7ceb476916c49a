/* A 2-layer MLP trained with rfsdp, saved, and resumed at another world size.
 * It uses only the installed library (rfsdp_mpi.h, rfsdp_optim.h, rfsdp_run.h):
 *
 *   make install PREFIX=$HOME/rfsdp
 *   export PKG_CONFIG_PATH=$HOME/rfsdp/lib/pkgconfig
 *   cc -O2 docs/example/mlp.c $(pkg-config --cflags --libs rfsdp) -o mlp
 *   mpirun -np 2 ./mlp --steps 4 --save /tmp/mlp-ckpt      # 4 steps on 2 ranks, then save
 *   mpirun -np 3 ./mlp --steps 8 --resume /tmp/mlp-ckpt    # 4 more on 3 ranks
 *   mpirun -np 1 ./mlp --steps 8                           # the same 8 steps at once
 *
 * The last two print the same losses for steps 5-8 and the same parameter digest,
 * bit for bit (tests/test_example.c checks it): the checkpoint holds the whole
 * state (weights, the optimizer's moments, the step, the data position and the
 * RNG), and it is resharded on load.
 *
 * The task: regress y = tanh(C x) (a fixed teacher C) from x ~ U(-1, 1)^16. Each
 * step draws a batch of 8 samples from one RNG that every rank advances alike.
 * To make the comparison across world sizes bit-exact, the whole batch of step s
 * is computed by rank s % W and the other ranks add nothing to the gradients:
 * the reduce-scatter then sums one non-zero term, and AdamW is element-wise, so no
 * rounding depends on W. (A real program splits the batch across ranks; its
 * results across world sizes then agree within rounding, and a resume at the same
 * world size stays bit-exact.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rfsdp_mpi.h"
#include "rfsdp_optim.h"
#include "rfsdp_run.h"

enum { IN = 16, HIDDEN = 64, OUT = 4, BATCH = 8 };

/* xorshift64*: the data's RNG, saved in the checkpoint. */
static double next_uniform(uint64_t *s) {
  *s ^= *s >> 12;
  *s ^= *s << 25;
  *s ^= *s >> 27;
  return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* One batch: x from the RNG, y = tanh(C x) with C[k][j] = sin(k * IN + j). */
static void make_batch(uint64_t *rng, float *x, float *y) {
  for (int i = 0; i < BATCH * IN; i++) x[i] = (float)next_uniform(rng);
  for (int b = 0; b < BATCH; b++)
    for (int k = 0; k < OUT; k++) {
      double s = 0;
      for (int j = 0; j < IN; j++) s += sin((double)(k * IN + j)) * x[b * IN + j];
      y[b * OUT + k] = (float)tanh(s);
    }
}

struct mlp {
  struct rf_fsdp *f;
  int u1, u2, w1, b1, w2, b2;
  float h[BATCH * HIDDEN], out[BATCH * OUT], dout[BATCH * OUT], dh[BATCH * HIDDEN];
};

static int mlp_init(struct mlp *m, enum rf_optim_kind kind) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  opt.seed = 42;
  struct rf_optim_layout_needs needs; /* 8-bit AdamW: its 32-row strips, runs of 256 whole */
  rf_optim_layout_needs(kind, &needs);
  opt.block_rows = needs.block_rows;
  opt.vector_block = needs.vector_block;
  if (rf_fsdp_create(&m->f, MPI_COMM_WORLD, &opt) != 0) return -1;
  int64_t s1[2] = {HIDDEN, IN}, sb1[1] = {HIDDEN}, s2[2] = {OUT, HIDDEN}, sb2[1] = {OUT};
  struct rf_init w = {RF_INIT_NORMAL, 0.2f}, zero = {RF_INIT_ZEROS, 0};
  m->u1 = rf_fsdp_add_unit(m->f, "fc1");
  m->w1 = rf_fsdp_add_tensor(m->f, m->u1, "fc1.weight", 2, s1, 0, w);
  m->b1 = rf_fsdp_add_tensor(m->f, m->u1, "fc1.bias", 1, sb1, 0, zero);
  m->u2 = rf_fsdp_add_unit(m->f, "fc2");
  m->w2 = rf_fsdp_add_tensor(m->f, m->u2, "fc2.weight", 2, s2, 0, w);
  m->b2 = rf_fsdp_add_tensor(m->f, m->u2, "fc2.bias", 1, sb2, 0, zero);
  return rf_fsdp_finalize(m->f);
}

/* Forward and backward of one batch; `active`: this rank computes it (the others
 * take part in the collectives only). Returns the mean squared error (0 when not active). */
static double mlp_step(struct mlp *m, const float *x, const float *y, int active) {
  struct rf_fsdp *f = m->f;
  double loss = 0;
  rf_fsdp_zero_grad(f);
  rf_fsdp_forward_begin(f, m->u1);
  const float *w1 = rf_fsdp_param(f, m->w1), *b1 = rf_fsdp_param(f, m->b1);
  for (int b = 0; active && b < BATCH; b++)
    for (int i = 0; i < HIDDEN; i++) {
      float s = b1[i];
      for (int j = 0; j < IN; j++) s += w1[i * IN + j] * x[b * IN + j];
      m->h[b * HIDDEN + i] = tanhf(s);
    }
  rf_fsdp_forward_end(f, m->u1);
  rf_fsdp_forward_begin(f, m->u2);
  const float *w2 = rf_fsdp_param(f, m->w2), *b2 = rf_fsdp_param(f, m->b2);
  for (int b = 0; active && b < BATCH; b++)
    for (int k = 0; k < OUT; k++) {
      float s = b2[k];
      for (int i = 0; i < HIDDEN; i++) s += w2[k * HIDDEN + i] * m->h[b * HIDDEN + i];
      float d = s - y[b * OUT + k];
      loss += (double)d * d / (BATCH * OUT);
      m->dout[b * OUT + k] = 2.0f * d / (BATCH * OUT);
    }
  rf_fsdp_forward_end(f, m->u2);
  rf_fsdp_backward_begin(f, m->u2);
  float *gw2 = rf_fsdp_grad(f, m->w2), *gb2 = rf_fsdp_grad(f, m->b2);
  for (int b = 0; active && b < BATCH; b++)
    for (int i = 0; i < HIDDEN; i++) {
      float s = 0;
      for (int k = 0; k < OUT; k++) {
        gw2[k * HIDDEN + i] += m->dout[b * OUT + k] * m->h[b * HIDDEN + i];
        s += m->dout[b * OUT + k] * w2[k * HIDDEN + i];
      }
      m->dh[b * HIDDEN + i] = s * (1.0f - m->h[b * HIDDEN + i] * m->h[b * HIDDEN + i]);
    }
  for (int b = 0; active && b < BATCH; b++)
    for (int k = 0; k < OUT; k++) gb2[k] += m->dout[b * OUT + k];
  rf_fsdp_backward_end(f, m->u2);
  rf_fsdp_backward_begin(f, m->u1);
  float *gw1 = rf_fsdp_grad(f, m->w1), *gb1 = rf_fsdp_grad(f, m->b1);
  for (int b = 0; active && b < BATCH; b++)
    for (int i = 0; i < HIDDEN; i++) {
      for (int j = 0; j < IN; j++) gw1[i * IN + j] += m->dh[b * HIDDEN + i] * x[b * IN + j];
      gb1[i] += m->dh[b * HIDDEN + i];
    }
  rf_fsdp_backward_end(f, m->u1);
  rf_fsdp_grads_finish(f);
  return loss;
}

/* FNV-1a over every parameter, gathered (the same on every rank, for any W). */
static uint64_t mlp_digest(struct mlp *m) {
  uint64_t h = 1469598103934665603ull;
  const struct rf_tensor_view *v = rf_fsdp_views(m->f);
  for (int t = 0; t < rf_fsdp_n_tensors(m->f); t++) {
    rf_fsdp_forward_begin(m->f, v[t].unit);
    const unsigned char *p = (const unsigned char *)rf_fsdp_param(m->f, t);
    for (size_t i = 0; i < (size_t)v[t].numel * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    rf_fsdp_forward_end(m->f, v[t].unit);
  }
  rf_fsdp_reshard_all(m->f);
  return h;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const char *save = NULL, *resume = NULL, *optim = "adamw";
  long steps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--steps") == 0) steps = atol(argv[i + 1]);
    if (strcmp(argv[i], "--save") == 0) save = argv[i + 1];
    if (strcmp(argv[i], "--resume") == 0) resume = argv[i + 1];
    if (strcmp(argv[i], "--optim") == 0) optim = argv[i + 1];
  }
  struct mlp m;
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  struct rf_optim *o = NULL;
  /* the groups, per tensor in declaration order: weight decay on the weights, not on the biases */
  const int flags[4] = {RF_OPTIM_FLAG_DECAY, 0, RF_OPTIM_FLAG_DECAY, 0};
  if (rf_optim_kind_parse(optim, &oo.kind) != 0 || mlp_init(&m, oo.kind) != 0 ||
      rf_optim_create_fsdp(&o, &oo, m.f, flags, NULL) != 0) {
    fprintf(stderr, "mlp: %s\n", rf_fsdp_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  struct rf_run run = {
      .fsdp = m.f, .optim = o, .step = 0, .data_pos = 0, .seed = 42, .rng = 0x9e3779b97f4a7c15ull};
  if (resume) {
    char dir[4096];
    if (rf_run_resume(&run, resume, dir, sizeof dir, NULL) != 0) {
      fprintf(stderr, "mlp: %s\n", rf_fsdp_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) printf("resumed from %s at step %lld (W=%d)\n", dir, (long long)run.step, world);
  }
  float x[BATCH * IN], y[BATCH * OUT];
  for (; run.step < steps; run.step++) {
    make_batch(&run.rng, x, y);
    run.data_pos += BATCH;
    double loss = mlp_step(&m, x, y, run.step % world == rank);
    MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); /* one term is non-zero */
    rf_optim_step(o, 1e-2f);
    if (rank == 0) printf("step %lld loss %a (%.6f)\n", (long long)run.step + 1, loss, loss);
  }
  if (save && rf_run_save(&run, save, "{\"example\": \"mlp\"}") != 0) {
    fprintf(stderr, "mlp: %s\n", rf_fsdp_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  uint64_t digest = mlp_digest(&m);
  if (rank == 0)
    printf("params %016llx after %lld steps (W=%d)\n", (unsigned long long)digest, (long long)run.step,
           world);
  rf_optim_free(o);
  rf_fsdp_free(m.f);
  MPI_Finalize();
  return 0;
}
