/* The built-in LLaMA trained through the installed library alone (rfsdp_mpi.h,
 * rfsdp_model.h, rfsdp_optim.h, rfsdp_run.h): a Hugging Face config.json, token
 * files from `rfsdp prepare`, AdamW, saved at one world size and resumed at another.
 *
 *   make install PREFIX=$HOME/rfsdp && export PKG_CONFIG_PATH=$HOME/rfsdp/lib/pkgconfig
 *   cc -O2 docs/example/llama.c $(pkg-config --cflags --libs rfsdp) -o llama
 *   rfsdp prepare --input text.txt --out /tmp/text
 *   mpirun -np 2 ./llama --model config.json --data /tmp/text --steps 4 --save /tmp/ck4
 *   mpirun -np 3 ./llama --model config.json --data /tmp/text --steps 8 --resume /tmp/ck4
 *
 * Its step is `rfsdp train`'s, the library's rf_train_model_step (global batch split
 * over the ranks, loss scaled by 1/tokens, norm, clip at 1, AdamW with weight decay
 * 0.1), at a constant learning rate: `rfsdp train --min-lr-ratio 1` prints the same losses and writes the
 * same checkpoint files, bit for bit (tests/test_example_llama.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rfsdp_model.h"
#include "rfsdp_mpi.h"
#include "rfsdp_optim.h"
#include "rfsdp_run.h"

/* Every rank's status combined; on failure rank 0 prints what failed. */
static int check(const struct rf_fsdp *f, int rc, const char *what) {
  if (rf_run_agree(f, rc) == 0) return 0;
  fprintf(stderr, "llama: %s: %s\n", what, rc ? rf_fsdp_error() : "another rank failed");
  return -1;
}

/* The step's data: this rank's share of the global batch of (seed, step). */
struct batch_ctx {
  const struct rf_token_data *d;
  uint64_t seed;
  int64_t step, batch, seq;
  int rank, world;
};

static int batch_of(void *ctx, int micro, int32_t *tokens, int32_t *targets) {
  const struct batch_ctx *c = ctx;
  return rf_token_data_batch(c->d, c->seed, c->step, c->batch, c->seq, micro * c->world + c->rank, c->world,
                             tokens, targets);
}

static int train(struct rf_comm *comm, char **argv, int argc) {
  const char *model = NULL, *data = NULL, *save = NULL, *resume = NULL;
  long long steps = 8, batch = 6, seq = 16, seed = 7;
  double lr = 3e-3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const char *k = argv[i], *v = argv[i + 1];
    if (!strcmp(k, "--model"))
      model = v;
    else if (!strcmp(k, "--data"))
      data = v;
    else if (!strcmp(k, "--save"))
      save = v;
    else if (!strcmp(k, "--resume"))
      resume = v;
    else if (!strcmp(k, "--steps"))
      steps = atoll(v);
    else if (!strcmp(k, "--batch"))
      batch = atoll(v);
    else if (!strcmp(k, "--seq"))
      seq = atoll(v);
    else if (!strcmp(k, "--seed"))
      seed = atoll(v);
    else if (!strcmp(k, "--lr"))
      lr = atof(v);
  }
  int rank = rf_comm_rank(comm), world = rf_comm_size(comm);
  if (!model || !data || batch % world != 0) {
    if (rank == 0) fprintf(stderr, "usage: llama --model CONFIG.json --data PREFIX (batch %% W == 0)\n");
    return 2;
  }
  rf_train_set_threads(comm);
  struct rf_fsdp_options fo;
  rf_fsdp_options_default(&fo);
  fo.seed = (uint64_t)seed;
  struct rf_train_model *m;
  if (rf_train_model_create(&m, model, &fo, comm, 1, (int)(batch / world), (int)seq) != 0) {
    if (rank == 0) fprintf(stderr, "llama: %s\n", rf_fsdp_error());
    return 1;
  }
  struct rf_fsdp *f = rf_train_model_fsdp(m);
  int n = rf_fsdp_n_tensors(f), rc = 1;
  int *flags = calloc((size_t)n, sizeof *flags);
  rf_train_model_optim_flags(m, flags); /* decay the matrices, not norms and embeddings */
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  oo.weight_decay = 0.1f;
  struct rf_optim *o = NULL;
  struct rf_token_data *d = NULL;
  size_t rows = (size_t)(batch / world * seq);
  int32_t *tokens = calloc(rows, sizeof *tokens), *targets = calloc(rows, sizeof *targets);
  char path[4096];
  snprintf(path, sizeof path, "%s.train.tok", data);
  if (check(f, rf_optim_create_fsdp(&o, &oo, f, flags, NULL), "optimizer") ||
      check(f, rf_token_data_open(&d, path), path))
    goto out;
  struct rf_run run = {.fsdp = f, .optim = o, .seed = (uint64_t)seed};
  if (resume) {
    if (check(f, rf_run_resume(&run, resume, NULL, 0, NULL), resume)) goto out;
    if (rank == 0) printf("resumed from %s at step %lld\n", resume, (long long)run.step);
  }
  struct batch_ctx bc = {d, (uint64_t)seed, 0, batch, seq, rank, world};
  struct rf_train_step_args sa = {.accum = 1, /* one micro-batch per step */
                                  .scale = 1.0 / ((double)batch * (double)seq),
                                  .lr = (float)lr,
                                  .clip = 1.0,
                                  .tokens = tokens,
                                  .targets = targets,
                                  .batch = batch_of,
                                  .ctx = &bc};
  for (int64_t step = run.step; step < steps; step++) {
    bc.step = sa.step = step;
    /* zero, forward and backward, gradients finished, norm, clip at 1, AdamW (skipped when the norm is
     * not finite), the loss summed over the ranks */
    struct rf_train_step_result r;
    if (check(f, rf_train_model_step(m, o, &sa, &r) < 0 ? -1 : 0, "step")) goto out;
    run.step = run.data_pos = step + 1;
    if (rank == 0)
      printf("step %lld loss %.9g norm %.6g (W=%d)\n", (long long)step + 1, r.loss, r.norm, world);
  }
  if (save && check(f, rf_run_save(&run, save, NULL), save)) goto out;
  if (save && rank == 0) printf("saved %s at step %lld\n", save, (long long)run.step);
  rc = 0;
out:
  free(tokens);
  free(targets);
  free(flags);
  rf_token_data_close(d);
  if (o) rf_optim_free(o);
  rf_train_model_destroy(m);
  return rc;
}

int main(int argc, char **argv) {
  rf_comm_mpi_init(&argc, &argv);
  struct rf_comm *comm = rf_comm_create_mpi(MPI_COMM_WORLD);
  int rc = train(comm, argv, argc);
  rf_comm_destroy(comm);
  rf_comm_mpi_finalize();
  return rc;
}
