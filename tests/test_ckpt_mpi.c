/* rf-test: np=1,2,3,4,5 timeout=60
 * The checkpoint file layer under real MPI ranks writing concurrently: every rank
 * saves its random ranges through rf_ckpt_save with an MPI agreement callback,
 * then reads other random ranges (and whole tensors) back bit-identically; a
 * save in which one rank fails returns -1 on every rank and leaves no marker. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt.h"
#include "comm/comm_mpi.h"
#include "rf_test.h"

#define N_TENSORS 3

static int agree_mpi(void *ctx, int status) {
  int32_t s = status;
  rf_comm_allreduce(ctx, &s, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  return s;
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  struct rf_comm comm;
  rf_comm_init(&comm, MPI_COMM_WORLD);

  char root[64] = "/tmp/rf_test_ckpt_mpi.XXXXXX";
  if (rank == 0) RF_ASSERT(mkdtemp(root));
  rf_comm_bcast(&comm, root, sizeof root, RF_DTYPE_U8, 0);

  const char *names[N_TENSORS] = {"w", "codes", "m"};
  const enum rf_dtype dtypes[N_TENSORS] = {RF_DTYPE_F32, RF_DTYPE_U8, RF_DTYPE_BF16};
  const int64_t shapes[N_TENSORS][2] = {{300, 70}, {9000, 1}, {17, 130}};
  uint8_t *data[N_TENSORS];
  uint64_t rng = 11; /* the same values on every rank: the reference */
  for (int i = 0; i < N_TENSORS; i++) {
    size_t bytes = (size_t)(shapes[i][0] * shapes[i][1]) * rf_dtype_size(dtypes[i]);
    data[i] = malloc(bytes);
    for (size_t b = 0; b < bytes; b++) data[i][b] = (uint8_t)rf_test_rand_u64(&rng);
  }

  char dir[128];
  snprintf(dir, sizeof dir, "%s/step-7", root);
  struct rf_ckpt_piece pieces[N_TENSORS];
  for (int i = 0; i < N_TENSORS; i++) {
    int64_t cuts[8];
    rf_test_random_cuts(shapes[i][0] * shapes[i][1], world, 100 + (uint64_t)i, cuts);
    pieces[i] = (struct rf_ckpt_piece){.name = names[i],
                                       .dtype = dtypes[i],
                                       .ndim = 2,
                                       .shape = {shapes[i][0], shapes[i][1]},
                                       .begin = cuts[rank],
                                       .end = cuts[rank + 1],
                                       .data = data[i] + (size_t)cuts[rank] * rf_dtype_size(dtypes[i])};
  }
  struct rf_ckpt_save_args a = {.dir = dir,
                                .rank = rank,
                                .world = world,
                                .step = 7,
                                .extra_json = "{\"data_step\":7}",
                                .chunk_bytes = 512,
                                .n_pieces = N_TENSORS,
                                .pieces = pieces,
                                .agree = agree_mpi,
                                .agree_ctx = &comm};
  RF_CHECK(rf_ckpt_save(&a) == 0, "rank %d: save: %s", rank, rf_error_msg());

  struct rf_ckpt ck;
  RF_CHECK(rf_ckpt_open(&ck, dir) == 0, "rank %d: open: %s", rank, rf_error_msg());
  RF_CHECK(ck.world == world && ck.step == 7 && strcmp(ck.extra_json, "{\"data_step\":7}") == 0, "metadata");
  for (int i = 0; i < N_TENSORS; i++) {
    int64_t numel = shapes[i][0] * shapes[i][1], cuts[8];
    size_t es = rf_dtype_size(dtypes[i]);
    rf_test_random_cuts(numel, world, 900 + (uint64_t)i, cuts);
    uint8_t *buf = malloc((size_t)numel * es);
    int rc = rf_ckpt_read(&ck, names[i], dtypes[i], 2, shapes[i], cuts[rank], cuts[rank + 1], buf);
    RF_CHECK(rc == 0 && memcmp(buf, data[i] + (size_t)cuts[rank] * es,
                               (size_t)(cuts[rank + 1] - cuts[rank]) * es) == 0,
             "rank %d: %s, another split, differs: %s", rank, names[i], rf_error_msg());
    rc = rf_ckpt_read(&ck, names[i], dtypes[i], 2, shapes[i], 0, numel, buf);
    RF_CHECK(rc == 0 && memcmp(buf, data[i], (size_t)numel * es) == 0, "rank %d: whole %s differs", rank,
             names[i]);
    free(buf);
  }
  rf_ckpt_close(&ck);

  /* the last rank gives a bad range: every rank fails, no marker */
  snprintf(dir, sizeof dir, "%s/step-8", root);
  a.step = 8;
  if (rank == world - 1) pieces[0].end = shapes[0][0] * shapes[0][1] + 1;
  int rc = rf_ckpt_save(&a);
  RF_CHECK(rc == -1, "rank %d: a save with a failed rank succeeded", rank);
  rf_comm_barrier(&comm);
  char marker[160];
  snprintf(marker, sizeof marker, "%s/COMPLETE", dir);
  RF_CHECK(access(marker, F_OK) != 0, "a failed save left a marker");
  RF_CHECK(rf_ckpt_open(&ck, dir) == -1 && strstr(rf_error_msg(), dir), "partial refused: %s",
           rf_error_msg());
  rf_comm_barrier(&comm);

  for (int i = 0; i < N_TENSORS; i++) free(data[i]);
  if (rank == 0) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    RF_CHECK(system(cmd) == 0, "cleanup");
  }
  rf_comm_free(&comm);
  return rf_test_finish("test_ckpt_mpi");
}
