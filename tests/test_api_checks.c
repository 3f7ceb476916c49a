/* rf-test: np=1,2,3 timeout=60
 * The public API refuses bad calls (issue 37 item 8): every function that returns
 * int, given a NULL pointer, returns -1 and rf_fsdp_error() names the function and
 * the argument (round 4: SIGSEGV in rf_fsdp_create, rf_fsdp_add_unit,
 * rf_fsdp_finalize, rf_fsdp_add_tensor, rf_optim_create_fsdp, rf_run_save,
 * rf_run_async_create, rf_run_series_save_async); calls in the wrong state return -1
 * naming what is missing (rf_optim_step between rf_fsdp_backward_begin and
 * rf_fsdp_grads_finish, with a NaN or negative learning rate, an optimizer on an
 * unfinalized context); a context and optimizer freed before their async saver
 * stay alive until the saver is freed (round 4: heap-use-after-free in the writer
 * thread under ASan), and the save they were part of completes with their values.
 * The functions added since (issue 39: rfsdp_model.h's binding, token files,
 * tokenizers, rf_data_prepare, rfsdp_run.h's agreements and files, the checkpoint
 * reader's inspection and export) given NULL: -1 with the message, a getter's -1 or
 * NULL, never a crash. Only the public headers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rf_test.h"
#include "rfsdp.h"
#include "rfsdp_ckpt.h"
#include "rfsdp_model.h"
#include "rfsdp_mpi.h"
#include "rfsdp_optim.h"
#include "rfsdp_run.h"

/* A step the test needs: its failure ends the test. */
#define MUST(cond)                                                                           \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, rf_fsdp_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
    }                                                                                        \
  } while (0)

/* rc is -1 and the error names `fn` and `arg`. */
#define REFUSED(call, fn, arg)                                                                           \
  do {                                                                                                   \
    int rc_ = (call);                                                                                    \
    RF_CHECK(rc_ == -1 && strstr(rf_fsdp_error(), fn ": argument '" arg "' is NULL"), "%s: rc %d, '%s'", \
             #call, rc_, rf_fsdp_error());                                                               \
  } while (0)

/* rc is -1 and the error says `want`. */
#define REFUSED_STATE(call, want)                                                                         \
  do {                                                                                                    \
    int rc_ = (call);                                                                                     \
    RF_CHECK(rc_ == -1 && strstr(rf_fsdp_error(), want), "%s: rc %d, '%s'", #call, rc_, rf_fsdp_error()); \
  } while (0)

static const int64_t shape_a[2] = {24, 16}, shape_b[1] = {16};
static const int flags[2] = {0, 0}; /* every tensor decayed, no special group */

static struct rf_fsdp *make_context(int finalize) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  struct rf_fsdp *f = NULL;
  MUST(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) == 0);
  int u = rf_fsdp_add_unit(f, "block");
  MUST(u == 0);
  MUST(rf_fsdp_add_tensor(f, u, "w", 2, shape_a, 0, (struct rf_init){RF_INIT_NORMAL, 0.5f}) >= 0);
  MUST(rf_fsdp_add_tensor(f, u, "b", 1, shape_b, 0, (struct rf_init){RF_INIT_UNIFORM, 0.2f}) >= 0);
  if (finalize) MUST(rf_fsdp_finalize(f) == 0);
  return f;
}

static void check_context_calls(void) {
  struct rf_fsdp_options opt;
  rf_fsdp_options_default(&opt);
  struct rf_fsdp *f = NULL;
  REFUSED(rf_fsdp_create(NULL, MPI_COMM_WORLD, &opt), "rf_fsdp_create", "out");
  REFUSED(rf_fsdp_create(&f, MPI_COMM_WORLD, NULL), "rf_fsdp_create", "opt");
  RF_CHECK(f == NULL, "a refused create left a context");
  REFUSED(rf_fsdp_create_mesh(NULL, MPI_COMM_WORLD, MPI_COMM_SELF, &opt), "rf_fsdp_create", "out");
  REFUSED(rf_fsdp_add_unit(NULL, "u"), "rf_fsdp_add_unit", "f");
  REFUSED(rf_fsdp_add_tensor(NULL, 0, "t", 1, shape_b, 0, (struct rf_init){RF_INIT_CONST, 1.0f}),
          "rf_fsdp_add_tensor", "f");
  REFUSED(rf_fsdp_finalize(NULL), "rf_fsdp_finalize", "f");
  REFUSED(rf_fsdp_set_fp8(NULL, 0), "rf_fsdp_set_fp8", "f");
  REFUSED(rf_fsdp_find_tensor(NULL, "w"), "rf_fsdp_find_tensor", "f");
  MUST(rf_fsdp_create(&f, MPI_COMM_WORLD, &opt) == 0);
  REFUSED(rf_fsdp_add_unit(f, NULL), "rf_fsdp_add_unit", "name");
  int u = rf_fsdp_add_unit(f, "block");
  REFUSED(rf_fsdp_add_tensor(f, u, "t", 2, NULL, 0, (struct rf_init){RF_INIT_CONST, 1.0f}),
          "rf_fsdp_add_tensor", "shape");
  REFUSED(rf_fsdp_add_tensor(f, u, NULL, 1, shape_b, 0, (struct rf_init){RF_INIT_CONST, 1.0f}),
          "rf_fsdp_add_tensor", "name");
  MUST(rf_fsdp_add_tensor(f, u, "w", 2, shape_a, 0, (struct rf_init){RF_INIT_NORMAL, 0.5f}) >= 0);
  REFUSED(rf_fsdp_find_tensor(f, NULL), "rf_fsdp_find_tensor", "name");
  /* an optimizer before finalize */
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  struct rf_optim *o = NULL;
  REFUSED_STATE(rf_optim_create_fsdp(&o, &oo, f, flags, NULL), "the context is not finalized");
  MUST(rf_fsdp_finalize(f) == 0);
  REFUSED_STATE(rf_fsdp_add_unit(f, "late"), "after rf_fsdp_finalize");
  REFUSED_STATE(rf_fsdp_finalize(f), "called twice");
  rf_fsdp_free(f);
}

static void check_optim_calls(void) {
  struct rf_fsdp *f = make_context(1);
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  struct rf_optim *o = NULL;
  enum rf_optim_kind kind;
  REFUSED(rf_optim_create_fsdp(NULL, &oo, f, flags, NULL), "rf_optim_create_fsdp", "out");
  REFUSED(rf_optim_create_fsdp(&o, NULL, f, flags, NULL), "rf_optim_create_fsdp", "opt");
  REFUSED(rf_optim_create_fsdp(&o, &oo, NULL, NULL, NULL), "rf_optim_create_fsdp", "f");
  REFUSED(rf_optim_create(NULL, &oo, rf_fsdp_views(f), flags, 2, rf_fsdp_shard_elems(f), NULL),
          "rf_optim_create", "out");
  REFUSED(rf_optim_create(&o, NULL, rf_fsdp_views(f), flags, 2, rf_fsdp_shard_elems(f), NULL),
          "rf_optim_create", "opt");
  REFUSED(rf_optim_kind_parse(NULL, &kind), "rf_optim_kind_parse", "name");
  REFUSED(rf_optim_kind_parse("adamw", NULL), "rf_optim_kind_parse", "out");
  REFUSED(rf_optim_step(NULL, 0.01f), "rf_optim_step", "o");
  MUST(rf_optim_create_fsdp(&o, &oo, f, flags, NULL) == 0);
  REFUSED_STATE(rf_optim_step(o, NAN), "the learning rate nan is not a finite number >= 0");
  REFUSED_STATE(rf_optim_step(o, -0.5f), "the learning rate -0.5 is not a finite number >= 0");
  REFUSED_STATE(rf_optim_step(o, INFINITY), "the learning rate inf is not a finite number >= 0");
  /* a step inside the backward, then before the gradients are finished */
  rf_fsdp_zero_grad(f);
  rf_fsdp_set_last_micro_batch(f);
  rf_fsdp_forward_begin(f, 0);
  rf_fsdp_forward_end(f, 0);
  rf_fsdp_backward_begin(f, 0);
  float *g = rf_fsdp_grad(f, 0);
  for (int i = 0; i < 24 * 16; i++) g[i] = 0.01f * (float)(i % 7);
  REFUSED_STATE(rf_optim_step(o, 0.01f), "unit block's gradients are not finished");
  rf_fsdp_backward_end(f, 0);
  REFUSED_STATE(rf_optim_step(o, 0.01f), "unit block's gradients are not finished");
  RF_CHECK(rf_optim_get_step(o) == 0, "a refused step counted: %lld", (long long)rf_optim_get_step(o));
  rf_fsdp_grads_finish(f);
  RF_CHECK(rf_optim_step(o, 0.01f) == 0 && rf_optim_get_step(o) == 1, "the step after grads_finish: %s",
           rf_fsdp_error());
  RF_CHECK(rf_optim_step(o, 0.0f) == 0, "a learning rate of 0 is refused: %s", rf_fsdp_error());
  rf_optim_free(o);
  rf_fsdp_free(f);
}

static void check_run_calls(const char *dir) {
  struct rf_fsdp *f = make_context(1);
  struct rf_run run = {.fsdp = f}, none = {0};
  struct rf_run_series s;
  struct rf_run_async *a = NULL;
  int64_t step;
  REFUSED(rf_run_agree(NULL, 0), "rf_run_agree", "f");
  REFUSED(rf_run_save(NULL, dir, NULL), "rf_run_save", "run");
  REFUSED(rf_run_save(&none, dir, NULL), "rf_run_save", "run->fsdp");
  REFUSED(rf_run_save(&run, NULL, NULL), "rf_run_save", "dir");
  REFUSED(rf_run_resume(NULL, dir, NULL, 0, NULL), "rf_run_resume", "run");
  REFUSED(rf_run_resume(&run, NULL, NULL, 0, NULL), "rf_run_resume", "where");
  REFUSED(rf_run_series_begin(NULL, f, dir, 0, 0, 0), "rf_run_series_begin", "s");
  REFUSED(rf_run_series_begin(&s, NULL, dir, 0, 0, 0), "rf_run_series_begin", "f");
  REFUSED(rf_run_series_begin(&s, f, NULL, 0, 0, 0), "rf_run_series_begin", "dir");
  REFUSED(rf_run_series_save(NULL, &run, NULL), "rf_run_series_save", "s");
  struct rf_run_lock lock;
  REFUSED(rf_run_lock_take(NULL, dir, 0, NULL, 0), "rf_run_lock_take", "l");
  REFUSED(rf_run_lock_take(&lock, NULL, 0, NULL, 0), "rf_run_lock_take", "dir");
  rf_run_lock_release(NULL);
  REFUSED(rf_run_async_create(NULL, &run), "rf_run_async_create", "out");
  REFUSED(rf_run_async_create(&a, NULL), "rf_run_async_create", "run");
  REFUSED(rf_run_async_create(&a, &none), "rf_run_async_create", "run->fsdp");
  REFUSED(rf_run_async_poll(NULL, &step), "rf_run_async_poll", "a");
  REFUSED(rf_run_async_wait(NULL, &step), "rf_run_async_wait", "a");
  MUST(rf_run_async_create(&a, &run) == 0);
  REFUSED(rf_run_series_save_async(NULL, &s, &run, NULL), "rf_run_series_save_async", "a");
  REFUSED(rf_run_series_save_async(a, NULL, &run, NULL), "rf_run_series_save_async", "s");
  REFUSED(rf_run_series_save_async(a, &s, NULL, NULL), "rf_run_series_save_async", "run");
  rf_run_async_free(a);
  rf_fsdp_free(f);
}

/* The context and the optimizer freed while their saver writes: the save completes
 * with their values, and freeing the saver frees them. */
static void check_saver_holds(const char *dir) {
  struct rf_fsdp *f = make_context(1);
  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  struct rf_optim *o = NULL;
  MUST(rf_optim_create_fsdp(&o, &oo, f, flags, NULL) == 0);
  struct rf_run run = {.fsdp = f, .optim = o, .step = 3};
  struct rf_run_series s;
  char series[300];
  snprintf(series, sizeof series, "%s/series", dir);
  MUST(rf_run_series_begin(&s, f, series, 0, 0, 0) == 0);
  struct rf_run_async *a = NULL;
  MUST(rf_run_async_create(&a, &run) == 0);
  /* the whole tensor w, gathered, before the save */
  float w[24 * 16];
  rf_fsdp_forward_begin(f, 0);
  memcpy(w, rf_fsdp_param(f, 0), sizeof w);
  rf_fsdp_forward_end(f, 0);
  rf_fsdp_reshard_all(f);
  MUST(rf_run_series_save_async(a, &s, &run, NULL) == 0);
  rf_optim_free(o); /* only marked: the saver holds them */
  rf_fsdp_free(f);
  int64_t step = -1;
  int rc = rf_run_async_wait(a, &step);
  RF_CHECK(rc == 1 && step == 3, "the save of a freed context: rc %d step %lld: %s", rc, (long long)step,
           rf_fsdp_error());
  rf_run_async_free(a); /* frees the context and the optimizer (ASan: no leak, no use after free) */
  char path[400];
  rf_run_series_path(path, sizeof path, series, 3);
  struct rf_checkpoint *c = NULL;
  float back[24 * 16];
  RF_CHECK(rf_checkpoint_open(&c, path) == 0 && rf_checkpoint_read(c, "w", back) == 0 &&
               memcmp(back, w, sizeof w) == 0,
           "the checkpoint of the freed context differs from its weights: %s", rf_checkpoint_error());
  rf_checkpoint_close(c);
}

/* The functions added to the public API since 7bddbb7 (issue 39 item 4) and rfsdp ckpt's (issue 39
 * item 3), given NULL: -1 naming the function (and the argument where the header's convention names
 * it), a getter's -1 or NULL, never a crash. `dir` holds a complete checkpoint (check_saver_holds). */
static void check_newer_calls(const char *dir) {
  int group = 0;
  REFUSED(rf_comm_node_group(NULL, &group), "rf_comm_node_group", "comm");
  REFUSED_STATE(rf_comm_agree(NULL, 0), "rf_comm_agree: argument 'comm' is NULL");
  struct rf_counters a = {.bytes_gathered = 7, .bytes_reduced = 5}, d = rf_counters_diff(&a, NULL);
  RF_CHECK(d.bytes_gathered == 7 && d.bytes_reduced == 5, "rf_counters_diff(now, NULL) is now");
  d = rf_counters_diff(&a, &a);
  RF_CHECK(d.bytes_gathered == 0 && d.bytes_reduced == 0, "rf_counters_diff(a, a) is 0");
  d = rf_counters_diff(NULL, NULL);
  RF_CHECK(d.bytes_gathered == 0 && d.bytes_reduced == 0, "rf_counters_diff(NULL, NULL) is 0");
  /* rfsdp_run.h */
  char *text = NULL;
  size_t bytes = 0;
  REFUSED(rf_run_agree_comm(NULL, 0), "rf_run_agree_comm", "comm");
  REFUSED(rf_run_exit_status(NULL, 0, "x"), "rf_run_exit_status", "comm");
  REFUSED(rf_run_import(NULL, NULL, "x"), "rf_run_import", "f");
  REFUSED(rf_run_file_read(NULL, &text, &bytes), "rf_run_file_read", "path");
  REFUSED(rf_run_file_read("x", NULL, &bytes), "rf_run_file_read", "out");
  REFUSED(rf_run_file_read("x", &text, NULL), "rf_run_file_read", "bytes");
  REFUSED(rf_run_file_write(NULL, "x", 1), "rf_run_file_write", "path");
  REFUSED(rf_run_file_write("x", NULL, 1), "rf_run_file_write", "buf");
  /* rfsdp_model.h: the model binding */
  struct rf_train_model_config cfg;
  struct rf_train_step_args sa = {0};
  struct rf_train_step_result sr;
  char families[256];
  REFUSED_STATE(rf_train_model_families(NULL, 10, 0, ","), "rf_train_model_families: no buffer");
  REFUSED_STATE(rf_train_model_families(families, sizeof families, 0, NULL),
                "rf_train_model_families: no buffer");
  REFUSED(rf_train_model_config_read(NULL, 8, &cfg), "rf_train_model_config_read", "config_path");
  REFUSED(rf_train_model_config_read("configs/demo.json", 8, NULL), "rf_train_model_config_read", "out");
  REFUSED_STATE(rf_train_model_step(NULL, NULL, &sa, &sr), "rf_train_model_step: no model");
  RF_CHECK(rf_train_model_fsdp(NULL) == NULL && rf_train_model_comm(NULL) == NULL &&
               rf_train_model_vocab(NULL) == -1 && rf_train_model_workspace_bytes(NULL) == -1,
           "the model's getters on NULL");
  char **names = NULL;
  int n = 0;
  REFUSED(rf_train_model_fp8_names(NULL, &names, &n), "rf_train_model_fp8_names", "config_path");
  REFUSED(rf_train_model_fp8_names("configs/demo.json", NULL, &n), "rf_train_model_fp8_names", "names");
  REFUSED(rf_train_model_fp8_names("configs/demo.json", &names, NULL), "rf_train_model_fp8_names", "n");
  /* token files, tokenizers, prepare */
  struct rf_token_data *td = NULL;
  struct rf_tokenizer *tok = NULL;
  REFUSED(rf_token_data_open(NULL, "x"), "rf_token_data_open", "out");
  REFUSED(rf_token_data_open(&td, NULL), "rf_token_data_open", "path");
  RF_CHECK(td == NULL, "a refused open left token data");
  rf_token_data_close(NULL);
  RF_CHECK(
      rf_token_data_count(NULL) == -1 && rf_token_data_vocab(NULL) == -1 && rf_token_data_path(NULL) == NULL,
      "the token file's getters on NULL");
  REFUSED(rf_token_data_check(NULL), "rf_token_data_check", "d");
  REFUSED(rf_token_data_check_tokenizer(NULL, NULL, "x"), "rf_token_data_check_tokenizer", "d");
  REFUSED(rf_tokenizer_open(NULL, "x"), "rf_tokenizer_open", "out");
  REFUSED(rf_tokenizer_open(&tok, NULL), "rf_tokenizer_open", "path");
  RF_CHECK(tok == NULL, "a refused open left a tokenizer");
  rf_tokenizer_close(NULL);
  int32_t ids[4];
  uint8_t out[4];
  size_t out_n = 9;
  RF_CHECK(rf_tokenizer_encode(NULL, (const uint8_t *)"ab", 2, ids) == 0,
           "rf_tokenizer_encode(NULL tok) is 0");
  REFUSED(rf_tokenizer_decode(NULL, ids, 1, out, sizeof out, &out_n), "rf_tokenizer_decode", "tok");
  RF_CHECK(out_n == 0, "a refused decode leaves *out_n 0");
  REFUSED(rf_tokenizer_decode(NULL, ids, 1, out, sizeof out, NULL), "rf_tokenizer_decode", "out_n");
  struct rf_data_prepare_options po = {.val_fraction = 0.1};
  struct rf_data_prepare_stats ps;
  REFUSED(rf_data_prepare(NULL, "p", &po, &ps), "rf_data_prepare", "input");
  REFUSED(rf_data_prepare("README.md", NULL, &po, &ps), "rf_data_prepare", "prefix");
  REFUSED(rf_data_prepare("README.md", "p", NULL, &ps), "rf_data_prepare", "opt");
  REFUSED(rf_data_prepare("README.md", "p", &po, NULL), "rf_data_prepare", "stats");
  /* rfsdp_ckpt.h: what rfsdp ckpt uses (the header's own wording: "a NULL argument") */
  char path[400];
  snprintf(path, sizeof path, "%s/series", dir);
  uint64_t read = 0;
  RF_CHECK(rf_checkpoint_format_version(NULL) == -1 && rf_checkpoint_chunk_bytes(NULL) == -1,
           "the checkpoint's getters on NULL");
  REFUSED_STATE(rf_checkpoint_tensor_ranges(NULL, "w"), "rf_checkpoint_tensor_ranges: a NULL argument");
  REFUSED_STATE(rf_checkpoint_tensor_is_param(NULL, "w"), "rf_checkpoint_tensor_is_param: a NULL argument");
  REFUSED_STATE(rf_checkpoint_verify(NULL, &read), "rf_checkpoint_verify: a NULL argument");
  REFUSED_STATE(rf_checkpoint_export(NULL, "x", RF_DTYPE_F32, NULL, 0, 0),
                "rf_checkpoint_export: a NULL argument");
  REFUSED_STATE(rf_checkpoint_export(path, NULL, RF_DTYPE_F32, NULL, 0, 0),
                "rf_checkpoint_export: a NULL argument");
  REFUSED_STATE(rf_checkpoint_export(path, "x", RF_DTYPE_F32, NULL, 2, 0),
                "rf_checkpoint_export: a NULL argument");
  /* and on a real checkpoint: a NULL name, a missing tensor, NULL bytes */
  char ck[400];
  rf_run_series_path(ck, sizeof ck, path, 3);
  struct rf_checkpoint *c = NULL;
  MUST(rf_checkpoint_open(&c, ck) == 0);
  REFUSED_STATE(rf_checkpoint_tensor_ranges(c, NULL), "rf_checkpoint_tensor_ranges: a NULL argument");
  REFUSED_STATE(rf_checkpoint_tensor_is_param(c, "nope"), "the checkpoint has no tensor 'nope'");
  RF_CHECK(rf_checkpoint_tensor_is_param(c, "w") == 1 && rf_checkpoint_tensor_ranges(c, "w") >= 1 &&
               rf_checkpoint_format_version(c) == 1 && rf_checkpoint_chunk_bytes(c) > 0,
           "the getters on a checkpoint: %s", rf_checkpoint_error());
  RF_CHECK(rf_checkpoint_verify(c, NULL) == 0, "verify with NULL bytes: %s", rf_checkpoint_error());
  rf_checkpoint_close(c);
}

int main(int argc, char **argv) {
  int world;
  int rank = rf_test_mpi_init(&argc, &argv, &world);
  char dir[64] = "/tmp/rf_test_api_checks.XXXXXX";
  if (rank == 0) MUST(mkdtemp(dir));
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  check_context_calls();
  check_optim_calls();
  check_run_calls(dir);
  check_saver_holds(dir);
  check_newer_calls(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0 && rf_test_failures == 0) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    RF_CHECK(system(cmd) == 0, "cleanup");
  }
  return rf_test_finish("test_api_checks");
}
