/* rfsdp's built-in models bound to the runtime: a decoder described by a Hugging
 * Face config.json (model_type llama, qwen2, mixtral, qwen3_moe) declared to an
 * rfsdp context, and its forward and backward over the units with the runtime's
 * gather, prefetch, reshard and reduce around each. A program that trains one
 * keeps its data, its loop and its optimizer (rfsdp_optim.h), runs each step
 * through rf_train_model_step, and saves and resumes through rfsdp_run.h; docs/example/llama.c is one, `rfsdp
 * train` another. MPI-free: the communicator comes from rfsdp_mpi.h.
 *
 * Ownership: struct rf_train_model is opaque and owns its runtime context (borrowed
 * by rf_train_model_fsdp) and workspaces; it borrows the communicator it was
 * created on, which must outlive it.
 *
 * Bad calls (as rfsdp.h's): a function that returns int returns -1 on a NULL pointer
 * argument, rf_fsdp_error() naming the function; a getter given a NULL handle returns
 * -1 (NULL for a pointer); tests/test_api_checks.c. */
#ifndef RFSDP_MODEL_H
#define RFSDP_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "rfsdp.h"

struct rf_train_model;

/* The model_type names the config reader knows, in its table's order, joined by
 * `sep` into out (size bytes): every family (trainable 0: llama, qwen2, gpt_oss,
 * deepseek_v3, mixtral, qwen3_moe) or only those rfsdp trains (1: all of them). For messages and --help,
 * never written by hand. Returns 0, or -1
 * with rf_fsdp_error() when out is NULL or too small. */
int rf_train_model_families(char *out, size_t size, int trainable, const char *sep);

/* Reads the config at `config_path` and declares the model on a new runtime
 * context over the ranks of `comm` (borrowed): `replicas` groups of consecutive
 * ranks (world / replicas each) shard the parameters and are replicated across
 * (HSDP); 1: plain FSDP over every rank; 0: the ranks of each node shard together
 * (rf_comm_node_group: every node must run as many). Workspaces for `batch` local sequences of
 * `seq` tokens. Collective; returns 0, or -1 on every rank with rf_fsdp_error(). */
int rf_train_model_create(struct rf_train_model **out, const char *config_path,
                          const struct rf_fsdp_options *opt, struct rf_comm *comm, int replicas, int batch,
                          int seq);
void rf_train_model_destroy(struct rf_train_model *m);
/* The model's runtime context (borrowed): steps, norms, views, stats. */
struct rf_fsdp *rf_train_model_fsdp(const struct rf_train_model *m);
/* The config's vocab_size. */
int rf_train_model_vocab(const struct rf_train_model *m);
/* The model's view of the communicator it was created on (borrowed): its collectives count into
 * the context's counters (rf_fsdp_counters), so a program's agreements in a step are the step's
 * bytes, as the loss all-reduce of rf_train_model_step is. */
struct rf_comm *rf_train_model_comm(const struct rf_train_model *m);
/* The bytes of the training micro-batch's workspace (activations, on the context's device). */
int64_t rf_train_model_workspace_bytes(const struct rf_train_model *m);

/* What a config says that a program checks before it builds the model, read by the
 * one config reader rf_train_model_create uses. */
struct rf_train_model_config {
  int vocab_size;
  int max_position_embeddings;
  double flops_per_token; /* forward and backward of a token in a `seq`-token sequence (only the
                             experts a token meets): MFU's numerator */
};
/* Reads the config at `config_path` for sequences of `seq` tokens. Local; 0, or -1
 * with rf_fsdp_error() naming the file. */
int rf_train_model_config_read(const char *config_path, int seq, struct rf_train_model_config *out);
/* The tensors of the model described by `config_path` (a config.json or a units file) that are
 * linear weights (attention, MLP, experts): those --fp8 block trains in FP8 and `rfsdp ckpt
 * export --fp8` writes so (rf_checkpoint_export's fp8_names), by their checkpoint names in the
 * model's order. *names gets *n strings in one allocation (free(*names) frees them all; NULL
 * when *n is 0). Local; 0, or -1 with rf_fsdp_error() naming the file. */
int rf_train_model_fp8_names(const char *config_path, char ***names, int *n);
/* The linear layers' compute dtype (f32 or bf16) in both workspaces; at set-up. */
int rf_train_model_set_compute(struct rf_train_model *m, enum rf_dtype compute);
/* The optimizer groups of the model's tensors (rf_optim_flag bits: weight decay
 * for matrices, orthogonalization by Muon for the linear weights), one per tensor
 * of rf_train_model_fsdp in declaration order: what rf_optim_create_fsdp takes. */
void rf_train_model_optim_flags(const struct rf_train_model *m, int *flags);

/* Forward and backward of one micro-batch (tokens, targets: batch*seq each);
 * gradients of grad_scale * loss_sum are reduced into the shards. Returns this
 * rank's loss sum, or NAN when a token is out of range. A MoE config with
 * output_router_logits adds router_aux_loss_coef times the load-balancing loss of
 * the global micro-batch (all ranks' rows; transformers' load_balancing_loss_func),
 * weighted by the micro-batch's share of the step's tokens: each rank's loss sum
 * carries 1/W of it (so grad_scale times the ranks' sum is the step's loss).
 * Collective: every rank calls it for every micro-batch. */
double rf_train_model_micro_step(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets,
                                 float grad_scale);
/* ---- one optimizer step ---------------------------------------------------------- */

struct rf_optim; /* rfsdp_optim.h */

/* What rf_train_model_step does one step with. The caller supplies the data: `batch` fills
 * this rank's micro-batch `micro` (0 .. accum - 1) of the step into tokens and targets
 * (batch * seq local rows each, the sizes given at rf_train_model_create; e.g.
 * rf_token_data_batch with part micro * W + rank of W * accum, as `rfsdp train` does) and
 * returns 0, or -1 with rf_fsdp_error() set. */
struct rf_train_step_args {
  int64_t step; /* counted from 0: the watchdog's notes name step + 1 */
  int accum;    /* micro-batches (>= 1) */
  double scale; /* the loss's scale: 1 / (the step's tokens over every rank); grad_scale = (float)scale */
  float lr;     /* the optimizer's learning rate for this step */
  double clip;  /* clip the global gradient norm to this (0: off) */
  int32_t *tokens, *targets; /* the caller's buffers that `batch` fills */
  int (*batch)(void *ctx, int micro, int32_t *tokens, int32_t *targets);
  void *ctx;
};

struct rf_train_step_result {
  double loss; /* the step's loss per token: every rank's loss sums added, times scale */
  double norm; /* the global gradient norm before clipping (non-finite: the update was skipped) */
};

/* One optimizer step, the sequence `rfsdp train` and docs/example/llama.c share: the
 * gradients zeroed; per micro-batch the data (`batch`, a "batch" span on the trace's data
 * lane) and rf_train_model_micro_step (the last one marked for HSDP's replica all-reduces,
 * rf_fsdp_set_last_micro_batch); then rf_optim_step_fsdp (gradients finished, the norm,
 * clip, update) with `o` (created by rf_optim_create_fsdp on this model's context) and the
 * loss sums all-reduced over every rank (a "loss all-reduce" span). The collective
 * watchdog's phase notes name the step. With AdamW the loss sums (added on the device over the
 * micro-batches), the norm and the clip factor stay on the device until one read at the end of
 * the step, after the optimizer's launches: the step's one wait for the device where the
 * collectives do not wait (docs/gpu.md, "Host waits"). Collective. Returns 0, 1 when the update was
 * skipped (a non-finite norm, the same on every rank), -1 with rf_fsdp_error() (a failed
 * batch: this rank only; a failed optimizer step: every rank). */
int rf_train_model_step(struct rf_train_model *m, struct rf_optim *o, const struct rf_train_step_args *a,
                        struct rf_train_step_result *out);

/* Forward only: this rank's loss sum. */
double rf_train_model_loss(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets);
/* Extends tokens[0..len) to tokens[0..total) by sampling (every rank computes the
 * same tokens: the same weights, the same RNG). */
int rf_train_model_generate(struct rf_train_model *m, int32_t *tokens, int len, int total, float temperature,
                            uint64_t *rng);

/* After rf_train_model_loss: the logits of row `row` (sequence-major over this
 * rank's batch x seq tokens), vocab_size floats copied from the device to a host
 * buffer of the model (borrowed, valid until the next call). */
const float *rf_train_model_logits(const struct rf_train_model *m, int row);

/* The rank's core budget as OpenMP's thread count: the cores this process may run
 * on divided by the ranks of `comm` on its node (at least 1), unless
 * OMP_NUM_THREADS is set. Returns the count. Collective over comm; call before
 * the model's first product. */
int rf_train_set_threads(const struct rf_comm *comm);

/* The oneDNN GEMM rate of this machine in `dtype` (f32 or bf16 operands, f32
 * accumulation) on `threads` threads (OpenMP's count, set before), in GFLOP/s, for
 * MFU: a 2048^3 product, read from the cache
 * ($XDG_CACHE_HOME or ~/.cache)/rfsdp/onednn-<dtype>-peak-<isa>-<threads>, else
 * measured (a few seconds) and cached. Local; at set-up. */
double rf_gemm_peak_gflops(enum rf_dtype dtype, int threads);

/* ---- token files (written by `rfsdp prepare`) --------------------------------- */

struct rf_token_data;
/* Opens a token file (PREFIX.train.tok, PREFIX.val.tok): its header and checksum
 * checked; 0, or -1 with rf_fsdp_error() naming the file and the problem. */
int rf_token_data_open(struct rf_token_data **out, const char *path);
void rf_token_data_close(struct rf_token_data *d); /* NULL allowed */
/* The file's tokens, its vocabulary size (its header's) and its path (borrowed); -1, -1 and NULL
 * when d is NULL. */
int64_t rf_token_data_count(const struct rf_token_data *d);
int64_t rf_token_data_vocab(const struct rf_token_data *d);
const char *rf_token_data_path(const struct rf_token_data *d);
/* 0 when batches can be drawn from the file (two tokens at least), else -1 naming
 * it; rf_token_data_batch checks it too. */
int rf_token_data_check(const struct rf_token_data *d);
/* Part `part` of `parts` of the global batch of `step` (batch sequences of seq
 * tokens drawn by (seed, step): the same batch at any W), and the targets (the
 * same tokens shifted by one): batch / parts rows each. `rfsdp train` gives
 * micro-batch m of rank r part m * W + r of W * accum. 0, or -1 with a message. */
int rf_token_data_batch(const struct rf_token_data *d, uint64_t seed, int64_t step, int64_t batch,
                        int64_t seq, int part, int parts, int32_t *tokens, int32_t *targets);

/* ---- tokenizers (PREFIX.tokenizer.json, written by `rfsdp prepare`) ------------ */

struct rf_tokenizer;
/* Loads and validates a tokenizer file (byte-level or BPE); 0, or -1 with
 * rf_fsdp_error() naming the file. Released by rf_tokenizer_close (NULL allowed). */
int rf_tokenizer_open(struct rf_tokenizer **out, const char *path);
void rf_tokenizer_close(struct rf_tokenizer *tok);
/* Writes at most n ids (a token covers at least one byte); returns the count (0 when tok is NULL,
 * or text or ids with n > 0). */
size_t rf_tokenizer_encode(const struct rf_tokenizer *tok, const uint8_t *text, size_t n, int32_t *ids);
/* The bytes of n ids into out (cap bytes); *out_n: bytes written. Fails on an id
 * outside the vocabulary or when out is too small. */
int rf_tokenizer_decode(const struct rf_tokenizer *tok, const int32_t *ids, size_t n, uint8_t *out,
                        size_t cap, size_t *out_n);
/* Fails unless the token file was written with this tokenizer (read from
 * `tokenizer_path`, named in the message): the same vocabulary size, and the same
 * tokenizer file when the token file recorded one. */
int rf_token_data_check_tokenizer(const struct rf_token_data *d, const struct rf_tokenizer *tok,
                                  const char *tokenizer_path);

/* ---- preparing token files (`rfsdp prepare`) ---------------------------------- */

struct rf_data_prepare_options {
  double val_fraction; /* in [0, 1) */
  int bpe_vocab;       /* 0: byte-level; else train a BPE of this many ids (> 256) on the input */
  int progress;        /* print a line to stderr every 10% of inputs larger than 16 MiB */
};

/* What rf_data_prepare wrote. */
struct rf_data_prepare_stats {
  int64_t input_bytes;
  int64_t train_tokens;
  int64_t val_tokens;
  int vocab_size;
  int64_t chunk_bytes; /* the split's chunk size: 16 KiB, smaller for a small input */
  double val_fraction; /* the split's fraction: larger than asked for a small input */
};

/* Tokenizes the text file `input` into "<prefix>.train.tok" and "<prefix>.val.tok"
 * and writes the tokenizer to "<prefix>.tokenizer.json": all three under temporary
 * names, renamed into place only when all three are complete (a failure changes
 * no existing file). Byte-level
 * streams the input; BPE holds it in memory (training needs all of it). Each chunk
 * is tokenized on its own (BPE words are cut at chunk boundaries). Local (one
 * process); 0, or -1 with rf_fsdp_error() naming the file and the problem. */
int rf_data_prepare(const char *input, const char *prefix, const struct rf_data_prepare_options *opt,
                    struct rf_data_prepare_stats *stats);

#endif
