/* rfsdp logits: the model's logits for given tokens, from safetensors weights
 * (e.g. an export), as raw f32 [batch, seq, vocab]; what tests/hf_logits_check.py
 * compares with Hugging Face's LlamaForCausalLM. Runs under mpirun at any W (every
 * rank computes the whole batch; rank 0 writes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "options.h"
#include "porch.h"
#include "rfsdp_model.h"
#include "rfsdp_mpi.h"
#include "rfsdp_run.h"

/* The config and the tokens (every rank reads them; the caller agrees). */
static int rf_logits_read(const char *model, const char *tokens_path, int64_t seq,
                          struct rf_train_model_config *cfg, char **bytes, size_t *n) {
  *bytes = NULL;
  RF_TOOL_TRY(rf_train_model_config_read(model, (int)seq, cfg));
  RF_TOOL_TRY(rf_run_file_read(tokens_path, bytes, n));
  int64_t count = (int64_t)(*n / sizeof(int32_t));
  RF_TOOL_REQUIRE(
      *n % sizeof(int32_t) == 0 && count % seq == 0 && count > 0 && seq <= cfg->max_position_embeddings,
      "%s: %zu bytes are not batch x %lld int32 tokens (seq at most %d)", tokens_path, *n, (long long)seq,
      cfg->max_position_embeddings);
  return 0;
}

static int rf_logits_run(const char *model, const char *weights, const char *tokens_path, int64_t seq,
                         const char *out, struct rf_comm *comm) {
  struct rf_train_model_config cfg;
  char *bytes = NULL;
  size_t n = 0;
  if (rf_run_agree_comm(comm, rf_logits_read(model, tokens_path, seq, &cfg, &bytes, &n)) != 0) {
    free(bytes);
    return -1;
  }
  int64_t count = (int64_t)(n / sizeof(int32_t));
  int batch = (int)(count / seq);
  struct rf_fsdp_options fo;
  rf_fsdp_options_default(&fo);
  struct rf_train_model *m = NULL; /* 1-D: every rank shards */
  int rc = rf_train_model_create(&m, model, &fo, comm, 1, batch, (int)seq);
  if (rc == 0) rc = rf_run_import(rf_train_model_fsdp(m), comm, weights);
  if (rc == 0) {
    double bad = rf_train_model_loss(m, (const int32_t *)bytes, NULL);
    if (bad != bad)
      rc = rf_fsdp_error_set(__FILE__, __LINE__, "%s: a token is outside the vocabulary", tokens_path);
  }
  if (rc == 0 && rf_comm_rank(comm) == 0) {
    size_t row = (size_t)cfg.vocab_size * sizeof(float);
    float *logits = rf_tool_calloc((size_t)count, row);
    for (int64_t i = 0; i < count; i++)
      memcpy((char *)logits + (size_t)i * row, rf_train_model_logits(m, (int)i), row);
    rc = rf_run_file_write(out, logits, (size_t)count * row);
    free(logits);
    if (rc == 0) printf("logits: %s [%d, %lld, %d] f32\n", out, batch, (long long)seq, cfg.vocab_size);
  }
  rf_train_model_destroy(m);
  free(bytes);
  return rc;
}

int rf_cmd_logits(int argc, char **argv) {
  const char *model = NULL, *weights = NULL, *tokens = NULL, *out = NULL;
  int64_t seq = 0;
  const struct rf_option options[] = {
      {"model", RF_OPTION_KIND_STRING, &model, "model config (Hugging Face config.json)", NULL, 1},
      {"weights", RF_OPTION_KIND_STRING, &weights, "safetensors file (e.g. from rfsdp ckpt export)", NULL, 1},
      {"tokens", RF_OPTION_KIND_STRING, &tokens, "raw little-endian int32 tokens [batch, seq]", NULL, 1},
      {"seq", RF_OPTION_KIND_I64, &seq, "tokens per sequence", "[1, inf)", 1},
      {"out", RF_OPTION_KIND_STRING, &out, "raw little-endian f32 logits [batch, seq, vocab]", NULL, 1},
  };
  rf_comm_mpi_init(&argc, &argv);
  struct rf_comm *comm = rf_comm_create_mpi(MPI_COMM_WORLD);
  int rank = rf_comm_rank(comm);
  int rc = rf_options_parse(
      argc, argv, options, (int)(sizeof options / sizeof options[0]),
      "usage: rfsdp logits --model CONFIG.json --weights F.safetensors --tokens F.i32 --seq T "
      "--out LOGITS.f32");
  /* the output must not be one of the inputs it is made from */
  if (rc == 0) rc = rf_option_check_distinct("out", out, "--tokens", tokens);
  if (rc == 0) rc = rf_option_check_distinct("out", out, "--weights", weights);
  if (rc == 0) rc = rf_option_check_distinct("out", out, "--model", model);
  int status = rc == 1 ? 0 : 2;
  if (rc == 0)
    status = rf_run_exit_status(comm, rf_logits_run(model, weights, tokens, seq, out, comm), "rfsdp logits");
  else if (rc < 0 && rank == 0)
    fprintf(stderr, "rfsdp logits: %s\n", rf_fsdp_error());
  rf_comm_destroy(comm);
  rf_comm_mpi_finalize();
  return status;
}
