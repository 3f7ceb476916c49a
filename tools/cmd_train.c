/* rfsdp train: the LLaMA model on token files across MPI ranks, under the
 * runtime, with an optimizer from src/optim; progress line, JSONL log,
 * evaluation, checkpoints, a text sample and the loss curve at the end. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "commands.h"
#include "options.h"
#include "rfsdp_mpi.h"
#include "rfsdp_plan.h"
#include "test_hooks.h"
#include "train.h"

/* 1: the run stopped on an option's mistake found after the start (exit 2, as
 * rf_train_check_args's; every rank finds it alike) */
static int rf_train_usage_error;

/* The learning rate of `step`: linear warm-up, then cosine decay to min_ratio * lr. */
static double rf_train_lr(const struct rf_train_args *a, int64_t step) {
  if (step < a->warmup) return a->lr * (double)(step + 1) / (double)a->warmup;
  double span = (double)(a->steps - a->warmup);
  double progress = span > 0 ? (double)(step - a->warmup) / span : 1.0;
  double cosine = 0.5 * (1.0 + cos(M_PI * (progress > 1.0 ? 1.0 : progress)));
  return a->lr * (a->min_lr_ratio + (1.0 - a->min_lr_ratio) * cosine);
}

static int rf_train_setup_fsdp(const struct rf_train_args *a, struct rf_fsdp_options *o) {
  rf_fsdp_options_default(o);
  RF_TOOL_TRY(rf_plan_args_fsdp_options(&a->plan, o));
  o->prefetch = a->prefetch;
  o->reshard_after_forward = !a->no_reshard;
  o->seed = a->seed;
  o->device = a->device;
  return 0;
}

/* Loss per token over `batches` validation batches of the global batch size. */
static double rf_train_eval(struct rf_train_state *s, const struct rf_token_data *val, int batches) {
  const struct rf_train_args *a = s->args;
  double sum = 0;
  for (int i = 0; i < batches; i++)
    for (int m = 0; m < a->accum; m++) {
      if (rf_token_data_batch(val, a->seed ^ 0x5eedull, i, a->batch, a->seq, m * s->world + s->rank,
                              s->world * a->accum, s->tokens, s->targets) != 0)
        return NAN;
      sum += rf_train_model_loss(s->model, s->tokens, s->targets);
    }
  rf_comm_allreduce(s->comm, &sum, 1, RF_DTYPE_F64, RF_REDUCE_OP_SUM);
  return sum / ((double)batches * (double)a->batch * (double)a->seq);
}

/* The text sample at the end: a prompt continued by the model, printed by rank 0. */
static void rf_train_sample(struct rf_train_state *s, const struct rf_tokenizer *tok) {
  const struct rf_train_args *a = s->args;
  const char *prompt = "And God said";
  int total = (int)strlen(prompt) + a->sample;
  int32_t *ids = rf_tool_calloc((size_t)total, sizeof(int32_t));
  int len = (int)rf_tokenizer_encode(tok, (const uint8_t *)prompt, strlen(prompt), ids);
  uint64_t rng = a->seed * 0x9e3779b97f4a7c15ull + 17;
  total = len + a->sample;
  if (rf_train_model_generate(s->model, ids, len, total, (float)a->temperature, &rng) == 0 && s->rank == 0) {
    size_t cap = (size_t)total * 64 + 1, n = 0;
    uint8_t *text = rf_tool_calloc(cap, 1);
    if (rf_tokenizer_decode(tok, ids, (size_t)total, text, cap - 1, &n) == 0) {
      text[n] = 0;
      printf("\nsample (temperature %.2f):\n%s\n\n", a->temperature, (const char *)text);
    }
    free(text);
  }
  free(ids);
}

/* --trace: the window of steps (--trace-steps A:B, default 1:20 within the run). */
static int rf_train_trace_begin(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  long long first = s->start_step + 1, last = a->steps < s->start_step + 20 ? a->steps : s->start_step + 20;
  if (a->trace_steps) {
    char tail = 0;
    if (sscanf(a->trace_steps, "%lld:%lld%c", &first, &last, &tail) != 2 || first < 1 || last < first)
      RF_TOOL_FAIL("--trace-steps %s: expected A:B with 1 <= A <= B (steps, counted from 1)", a->trace_steps);
  }
  s->trace_first = first;
  s->trace_last = last;
  return rf_run_trace_start(s->fsdp, first, last);
}

/* After the last step: the trace merged and written by rank 0, its summary printed, and with --plot the
 * timeline drawn next to the loss curve. Collective. */
static int rf_train_trace_end(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  if (!a->trace) return 0;
  rf_run_trace_step(0); /* nothing more is recorded */
  struct rf_run_trace_summary sum;
  RF_TOOL_TRY(rf_run_trace_summary(s->fsdp, &sum));
  RF_TOOL_TRY(rf_run_trace_write(s->fsdp, a->trace));
  rf_run_trace_stop();
  if (s->rank != 0) return 0;
  printf(
      "trace: %s (%lld steps, %llu spans%s); per step: communication %.2f ms, of which exposed (the compute "
      "lane waiting) %.2f ms: overlap %.1f%%\n",
      a->trace, (long long)sum.steps, (unsigned long long)sum.spans,
      sum.dropped ? ", some dropped: the window is longer than the reservation" : "", sum.comm_ms_per_step,
      sum.exposed_ms_per_step, 100.0 * sum.overlap);
  if (a->plot) {
    char png[RF_FILE_PATH_MAX];
    const char *slash = strrchr(a->plot, '/');
    snprintf(png, sizeof png, "%.*stimeline.png", slash ? (int)(slash - a->plot + 1) : 0, a->plot);
    char title[1024];
    snprintf(title, sizeof title,
             "%s, W=%d (%d x %d), steps %lld..%lld: exposed %.1f ms of %.1f ms communication per step",
             a->model, s->world, s->replicas, s->group, (long long)(s->trace_first),
             (long long)(s->trace_last), sum.exposed_ms_per_step, sum.comm_ms_per_step);
    RF_TOOL_TRY(rf_train_plot_timeline(a->trace, png, title));
    printf("timeline: %s\n", png);
  }
  return 0;
}

/* Seconds since the epoch: TensorBoard's wall time. */
static double rf_train_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The progress line and the log record of a step (rank 0); fails when the log write does. */
static int rf_train_report_step(struct rf_train_state *s, int64_t step, double loss, double norm, double lr,
                                double ms, double cpu_ms, double val, const struct rf_counters *d,
                                int skipped) {
  const struct rf_train_args *a = s->args;
  double tokens = (double)a->batch * (double)a->seq;
  struct rf_train_record rec = {
      .step = (int)step + 1,
      .loss = loss,
      .val_loss = val,
      .lr = lr,
      .grad_norm = norm,
      .ms = ms,
      .cpu_ms = cpu_ms,
      .tok_s = tokens / (ms * 1e-3),
      .mfu = s->flops_per_token * tokens / (ms * 1e-3) / (s->peak_gflops * 1e9 * s->world),
      .mfu_dtype = a->compute_dtype,
      .rss_mb = rf_train_rss_mb(),
      .gather_bytes = d->bytes_gathered,
      .reduce_bytes = d->bytes_reduced,
      .alltoall_bytes = d->bytes_alltoall,
      .intra_bytes = d->bytes_intra,
      .inter_bytes = d->bytes_inter,
      .copy_bytes = d->bytes_copied,
      .cast_bytes = d->bytes_cast,
      .own_shard_bytes = d->bytes_own_shard,
      .padding_bytes = d->bytes_padding,
      .allocs = d->allocations,
      .host_syncs = d->host_syncs,
      .skipped = skipped,
  };
  if (s->rank != 0) return 0;
  if (s->tb) {
    /* the same fields as the log's record; val/loss only on the steps evaluated */
    const char *tags[] = {"train/loss",       "train/grad_norm", "train/lr",          "perf/tokens_per_s",
                          "perf/mfu",         "memory/rss_mib",  "comm/gather_bytes", "comm/reduce_bytes",
                          "comm/inter_bytes", "val/loss"};
    const double values[] = {loss,
                             norm,
                             lr,
                             rec.tok_s,
                             rec.mfu,
                             rec.rss_mb,
                             (double)d->bytes_gathered,
                             (double)d->bytes_reduced,
                             (double)d->bytes_inter,
                             val};
    int n = (int)(sizeof tags / sizeof tags[0]) - (isnan(val) ? 1 : 0);
    RF_TOOL_TRY(rf_run_tensorboard_scalars(s->tb, step + 1, rf_train_wall_s(), n, tags, values));
  }
  if (a->print_every > 0 &&
      ((step + 1) % a->print_every == 0 || step == 0 || step + 1 == a->steps || !isnan(val)))
    rf_train_print(&rec, (int)a->steps);
  return s->log.file ? rf_train_log_write(&s->log, &rec) : 0;
}

/* rf_train_model_step's data: micro-batch m of rank r is part m * W + r of W * accum. */
struct rf_train_batch_ctx {
  struct rf_train_state *s;
  int64_t step;
};

static int rf_train_batch(void *ctx, int micro, int32_t *tokens, int32_t *targets) {
  const struct rf_train_batch_ctx *c = ctx;
  const struct rf_train_args *a = c->s->args;
  return rf_token_data_batch(c->s->train, a->seed, c->step, a->batch, a->seq,
                             micro * c->s->world + c->s->rank, c->s->world * a->accum, tokens, targets);
}

/* One optimizer step (rf_train_model_step): accum micro-batches, reduce, norm, clip, update. */
static int rf_train_step(struct rf_train_state *s, int64_t step, double *loss_out, double *norm_out) {
  const struct rf_train_args *a = s->args;
  struct rf_train_batch_ctx ctx = {s, step};
  struct rf_train_step_args sa = {.step = step,
                                  .accum = a->accum,
                                  .scale = 1.0 / ((double)a->batch * (double)a->seq),
                                  .lr = (float)rf_train_lr(a, step),
                                  .clip = a->clip,
                                  .tokens = s->tokens,
                                  .targets = s->targets,
                                  .batch = rf_train_batch,
                                  .ctx = &ctx};
  struct rf_train_step_result r;
  int rc = rf_train_model_step(s->model, s->optim, &sa, &r);
  *loss_out = r.loss;
  *norm_out = r.norm;
  return rc; /* 1: skipped (a non-finite norm) */
}

/* The token files, then the tokenizer they were written with; the validation file
 * only has to hold a sequence when there is an evaluation. */
static int rf_train_open_data(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  char path[RF_FILE_PATH_MAX];
  snprintf(path, sizeof path, "%s.train.tok", a->data);
  RF_TOOL_TRY(rf_token_data_open(&s->train, path));
  snprintf(path, sizeof path, "%s.val.tok", a->data);
  RF_TOOL_TRY(rf_token_data_open(&s->val, path));
  snprintf(path, sizeof path, "%s.tokenizer.json", a->data);
  RF_TOOL_TRY(rf_tokenizer_open(&s->tok, path));
  RF_TOOL_TRY(rf_token_data_check_tokenizer(s->train, s->tok, path));
  const char *train = rf_token_data_path(s->train), *val = rf_token_data_path(s->val);
  RF_TOOL_REQUIRE(rf_token_data_vocab(s->train) <= rf_train_model_vocab(s->model),
                  "%s: vocabulary of %lld tokens does not fit the model's vocab_size %d (%s)", train,
                  (long long)rf_token_data_vocab(s->train), rf_train_model_vocab(s->model), a->model);
  RF_TOOL_TRY(rf_token_data_check(s->train));
  RF_TOOL_REQUIRE(rf_token_data_count(s->train) > a->seq,
                  "%s: %lld tokens are fewer than one sequence of --seq %lld + 1", train,
                  (long long)rf_token_data_count(s->train), (long long)a->seq);
  if (a->eval_every == 0) return 0;
  RF_TOOL_REQUIRE(
      rf_token_data_count(s->val) > a->seq,
      "%s: %lld tokens are fewer than one sequence of --seq %lld + 1 for --eval-every: prepare with a "
      "larger --val-fraction, or train without --eval-every",
      val, (long long)rf_token_data_count(s->val), (long long)a->seq);
  return rf_token_data_check(s->val);
}

/* What the options' own ranges cannot say (the same on every rank: no agreement). */
static int rf_train_check_args(const struct rf_train_args *a, int world, int *replicate) {
  const char *why = rf_device_unavailable(a->device);
  RF_TOOL_REQUIRE(!why, "--device %s: %s", a->device, why);
  RF_TOOL_TRY(rf_train_mesh_parse(a, world, replicate));
  RF_TOOL_TRY(rf_plan_check_batch(world, a->batch, a->accum)); /* as rfsdp plan --batch checks it */
  RF_TOOL_REQUIRE(a->warmup <= a->steps, "--warmup %lld exceeds --steps %lld", (long long)a->warmup,
                  (long long)a->steps);
  RF_TOOL_REQUIRE(!a->plot || a->log, "--plot needs --log (the curve is drawn from the log)");
  RF_TOOL_REQUIRE(!(a->save_every > 0 && !a->ckpt_dir), "--save-every needs --ckpt-dir");
  RF_TOOL_REQUIRE(!(a->async_save && !a->ckpt_dir), "--async-save needs --ckpt-dir");
  RF_TOOL_REQUIRE(!(a->init && a->resume), "--init and --resume exclude each other");
  struct rf_fsdp_options fo; /* the plan options (--block-rows 0) */
  return rf_train_setup_fsdp(a, &fo);
}

/* Options that only one optimizer reads, given with another: refused rather than
 * silently ignored (argv: the options as given). */
static int rf_train_check_optim_options(const struct rf_train_args *a, int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    RF_TOOL_REQUIRE(strncmp(argv[i], "--shampoo-", 10) != 0 || strcmp(a->plan.optim, "shampoo") == 0,
                    "%s is an option of --optim shampoo; this run's optimizer is %s", argv[i], a->plan.optim);
  /* below a second a healthy collective of a loaded machine can take longer: the job
   * would end blaming a rank that was only slow */
  RF_TOOL_REQUIRE(a->collective_timeout == 0 || a->collective_timeout >= 1,
                  "--collective-timeout %g: at least 1 second (0 turns the watchdog off)",
                  a->collective_timeout);
  return 0;
}

/* One option of a command line: its name (with "--") and value ("" for a flag). */
struct rf_train_opt {
  char name[64];
  const char *value;
};

static int rf_train_opt_cmp(const void *x, const void *y) {
  const struct rf_train_opt *a = x, *b = y;
  int c = strcmp(a->name, b->name);
  return c ? c : strcmp(a->value, b->value);
}

/* The options of args[0..n) ("--name value", "--name=value", "--flag") sorted by
 * name into out (n entries at most); returns their count. */
static int rf_train_opts_of(char *const *args, int n, struct rf_train_opt *out) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    const char *arg = args[i], *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
    snprintf(out[k].name, sizeof out[k].name, "%.*s", (int)len, arg);
    out[k].value = eq ? eq + 1 : "";
    if (!eq && strncmp(arg, "--", 2) == 0 && i + 1 < n && strncmp(args[i + 1], "--", 2) != 0)
      out[k].value = args[++i];
    k++;
  }
  qsort(out, (size_t)k, sizeof *out, rf_train_opt_cmp);
  return k;
}

/* "--name value" or "--flag". */
static void rf_train_opt_str(char *out, size_t cap, const struct rf_train_opt *o) {
  snprintf(out, cap, "%s%s%s", o->name, o->value[0] ? " " : "", o->value);
}

/* Rank `rank`'s options `mine` against rank 0's `first`: the first option by name
 * that one of them has and the other has not, or has with another value. */
static void rf_train_say_other_options(int rank, const struct rf_train_opt *mine, int n,
                                       const struct rf_train_opt *first, int n0) {
  int i = 0, j = 0;
  while (i < n && j < n0 && rf_train_opt_cmp(&mine[i], &first[j]) == 0) i++, j++;
  char have[600], want[600], what[1300];
  if (i < n && j < n0 && strcmp(mine[i].name, first[j].name) == 0) {
    rf_train_opt_str(have, sizeof have, &mine[i]);
    rf_train_opt_str(want, sizeof want, &first[j]);
    snprintf(what, sizeof what, "rank %d has %s, rank 0 has %s", rank, have, want);
  } else if (j < n0 && (i == n || strcmp(first[j].name, mine[i].name) < 0)) {
    rf_train_opt_str(want, sizeof want, &first[j]);
    snprintf(what, sizeof what, "rank 0 has %s, rank %d does not", want, rank);
  } else {
    rf_train_opt_str(have, sizeof have, &mine[i]);
    snprintf(what, sizeof what, "rank %d has %s, rank 0 does not", rank, have);
  }
  fprintf(stderr,
          "rfsdp train: rank %d was started with other options than rank 0: %s; every rank must get the same "
          "command line\n",
          rank, what);
  fflush(stderr);
}

/* Every rank must run the same command line (mpirun -np 1 rfsdp ... : -np 1 rfsdp
 * ... with other options would plan differently and deadlock or abort inside MPI):
 * the ranks agree on a hash of their options, sorted by name, before anything else,
 * and where they differ the lowest such rank names the first option by name that it
 * and rank 0 do not both have with the same value (round 4 compared argv position by
 * position: --fp8 block on rank 0 only was blamed on --collective-timeout).
 * Collective; the same result on every rank. */
static int rf_train_check_same_options(const struct rf_comm *comm, int argc, char **argv) {
  /* the options sorted by name, as "name\0value\0" pairs: the order given does not matter */
  struct rf_train_opt *opts = rf_tool_calloc((size_t)argc + 1, sizeof *opts);
  int n = rf_train_opts_of(argv + 1, argc - 1, opts);
  size_t len = 0;
  for (int i = 0; i < n; i++) len += strlen(opts[i].name) + strlen(opts[i].value) + 2;
  char *mine = rf_tool_calloc(len + 1, 1);
  for (int i = 0, at = 0; i < n; i++)
    at += snprintf(mine + at, len + 1 - (size_t)at, "%s%c%s%c", opts[i].name, 0, opts[i].value, 0);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)mine[i]) * 1099511628211ull;
  int64_t lo = (int64_t)h, hi = (int64_t)h; /* equal on every rank iff min == max */
  rf_comm_allreduce(comm, &lo, 1, RF_DTYPE_I64, RF_REDUCE_OP_MIN);
  rf_comm_allreduce(comm, &hi, 1, RF_DTYPE_I64, RF_REDUCE_OP_MAX);
  if (lo == hi) {
    free(mine);
    free(opts);
    return 0;
  }
  /* rank 0's options to everyone; each rank finds its first difference by name */
  int rank = rf_comm_rank(comm), world = rf_comm_size(comm);
  int64_t len0 = (int64_t)len;
  rf_comm_bcast(comm, &len0, 1, RF_DTYPE_I64, 0);
  char *first = rf_tool_calloc((size_t)len0 + 1, 1);
  if (rank == 0) memcpy(first, mine, len);
  rf_comm_bcast(comm, first, len0, RF_DTYPE_U8, 0);
  int differs = len != (size_t)len0 || memcmp(mine, first, len) != 0;
  int32_t speaker = differs ? rank : world;
  rf_comm_allreduce(comm, &speaker, 1, RF_DTYPE_I32, RF_REDUCE_OP_MIN);
  if (speaker == rank) {
    int n0 = 0;
    for (const char *p = first; p < first + len0; p += strlen(p) + 1) n0++;
    struct rf_train_opt *opts0 = rf_tool_calloc((size_t)n0 / 2 + 1, sizeof *opts0);
    const char *p = first;
    for (int j = 0; j < n0 / 2; j++) {
      snprintf(opts0[j].name, sizeof opts0[j].name, "%s", p);
      p += strlen(p) + 1;
      opts0[j].value = p;
      p += strlen(p) + 1;
    }
    rf_train_say_other_options(rank, opts, n, opts0, n0 / 2);
    free(opts0);
  }
  free(first);
  free(mine);
  free(opts);
  return -1;
}

/* Rank 0's outputs, before anything is built (the caller agrees on the result): the
 * folders of --ckpt-dir, --log and --plot made as by mkdir -p, the log opened (and
 * emptied only when training starts, unless resumed). */
/* --ckpt-dir's lock (rank 0's; released when the command ends, whatever its end) and
 * whether another live job holds it (rank 0 sets, every rank learns it: exit 2). */
static struct rf_run_lock rf_train_lock;
static int rf_train_lock_busy;

static int rf_train_open_outputs(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  if (s->rank != 0) return 0;
  if (a->ckpt_dir) {
    RF_TOOL_TRY(rf_option_make_dirs("ckpt-dir", a->ckpt_dir, 1));
    char note[1024];
    int taken = rf_run_lock_take(&rf_train_lock, a->ckpt_dir, a->ckpt_dir_force, note, sizeof note);
    rf_train_lock_busy = taken == 1;
    RF_TOOL_TRY(taken ? -1 : 0);
    if (note[0]) fprintf(stderr, "rfsdp train: warning: --ckpt-dir %s: %s\n", a->ckpt_dir, note);
  }
  if (a->plot) {
    struct stat st;
    RF_TOOL_TRY(rf_option_make_dirs("plot", a->plot, 0));
    RF_TOOL_REQUIRE(stat(a->plot, &st) != 0 || !S_ISDIR(st.st_mode),
                    "--plot %s: is a folder, not a file name", a->plot);
  }
  if (a->log) {
    RF_TOOL_TRY(rf_option_make_dirs("log", a->log, 0));
    RF_TOOL_TRY(rf_train_log_open(&s->log, a->log));
  }
  if (a->tensorboard) {
    RF_TOOL_TRY(rf_option_make_dirs("tensorboard", a->tensorboard, 1));
    RF_TOOL_TRY(rf_run_tensorboard_open(&s->tb, a->tensorboard));
  }
  return 0;
}

/* A SIGTERM or SIGINT that came during start-up, on any rank (agreed): the run
 * stops before step `next` (0: before it knows where it resumes), having trained
 * and saved nothing; the exit status is 128 + the signal. 1 when it stops. */
static int rf_train_stopped_early(struct rf_train_state *s, int64_t next) {
  int sig = -rf_comm_agree(s->comm, -rf_run_signal_caught());
  if (sig == 0) return 0;
  s->stop_signal = sig;
  if (s->rank == 0) {
    char before[48] = "its first step";
    if (next > 0) snprintf(before, sizeof before, "step %lld", (long long)next);
    printf("stopped by %s before %s, during start-up: nothing trained, nothing saved\n",
           sig == SIGINT ? "SIGINT" : "SIGTERM", before);
    fflush(stdout);
  }
  return 1;
}

/* Everything from the options to the last step. */
static int rf_train_run(struct rf_train_state *s) {
  const struct rf_train_args *a = s->args;
  if (rf_train_stopped_early(s, 0)) return 0;
  int opened = rf_train_open_outputs(s);
  int32_t busy = rf_train_lock_busy; /* rank 0's: --ckpt-dir held by another job is a usage error */
  rf_comm_allreduce(s->comm, &busy, 1, RF_DTYPE_I32, RF_REDUCE_OP_MAX);
  rf_train_usage_error = busy != 0;
  RF_TOOL_TRY(rf_run_agree_comm(s->comm, opened));
  int threads = rf_train_set_threads(s->comm);
  /* --compute-dtype's choices are f32 and bf16 (options.c refused any other) */
  enum rf_dtype compute = strcmp(a->compute_dtype, "bf16") == 0 ? RF_DTYPE_BF16 : RF_DTYPE_F32;
  struct rf_train_model_config cfg;
  RF_TOOL_TRY(rf_run_agree_comm(s->comm, rf_train_model_config_read(a->model, (int)a->seq, &cfg)));
  /* an option's mistake, as rfsdp plan finds it: exit 2 (the config is the same on every rank) */
  rf_train_usage_error = rf_plan_check_seq(a->seq, cfg.max_position_embeddings, a->model) != 0;
  RF_TOOL_TRY(-rf_train_usage_error);
  struct rf_fsdp_options fo;
  RF_TOOL_TRY(rf_train_setup_fsdp(a, &fo));
  int local = (int)(a->batch / (s->world * a->accum));
  RF_TOOL_TRY(rf_run_agree_comm(s->comm, rf_train_mesh_group(a, s->replicate, s->comm, &s->group)));
  s->replicas = s->world / s->group;
  /* the mesh (node: the ranks of each node shard together) also marks the job's communicator as
   * crossing the shard groups when replicas > 1 */
  RF_TOOL_TRY(rf_train_model_create(&s->model, a->model, &fo, s->job,
                                    s->replicate == RF_PLAN_MESH_NODE ? 0 : s->replicas, local, (int)a->seq));
  s->fsdp = rf_train_model_fsdp(s->model);
  s->comm = rf_train_model_comm(s->model); /* its loss all-reduce and agreements: part of a step */
  RF_TOOL_TRY(rf_train_model_set_compute(s->model, compute));
  s->tokens = rf_tool_calloc((size_t)local * (size_t)a->seq, sizeof(int32_t));
  s->targets = rf_tool_calloc((size_t)local * (size_t)a->seq, sizeof(int32_t));
  RF_TOOL_TRY(rf_run_agree_comm(s->comm, rf_train_open_data(s)));

  struct rf_optim_options oo;
  rf_optim_options_default(&oo);
  RF_TOOL_TRY(rf_optim_kind_parse(a->plan.optim, &oo.kind));
  oo.weight_decay = (float)a->weight_decay;
  oo.shampoo_block = a->shampoo_block;
  oo.shampoo_every = a->shampoo_every;
  oo.shampoo_beta2 = (float)a->shampoo_beta2;
  oo.shampoo_eps = (float)a->shampoo_eps;
  oo.shampoo_stagger = a->shampoo_stagger;
  int n = rf_fsdp_n_tensors(s->fsdp);
  int *flags = rf_tool_calloc((size_t)n, sizeof *flags); /* the model's description says which */
  rf_train_model_optim_flags(s->model, flags);
  int rc = rf_optim_create_fsdp(&s->optim, &oo, s->fsdp, flags,
                                NULL); /* owners (Muon, Shampoo): the shard group */
  free(flags);
  RF_TOOL_TRY(rc);
  RF_TOOL_TRY(rf_train_ckpt_start(s));
  struct rf_fsdp_stats st;
  rf_fsdp_get_stats(s->fsdp, &st);

  s->flops_per_token = cfg.flops_per_token;
  s->peak_gflops = a->peak_gflops > 0 ? a->peak_gflops : 0;
  if (s->rank == 0 && s->peak_gflops <= 0) s->peak_gflops = rf_gemm_peak_gflops(compute, threads);
  rf_comm_bcast(s->comm, &s->peak_gflops, 1, RF_DTYPE_F64, 0);
  if (s->rank == 0) {
    printf(
        "train: %s, %.2fM parameters, %d units (%d collectives per gather), W=%d (%d x %d), layout %s/%s, "
        "optim %s, batch %lld x %lld tokens, %lld steps from step %lld; padding %.3f%%; compute %s%s on %d "
        "threads per "
        "rank, MFU against the oneDNN %s GEMM peak %.0f GFLOP/s per rank and %.4g GFLOP per token\n",
        a->model, (double)st.param_elems / 1e6, rf_fsdp_n_units(s->fsdp), st.n_buffers, s->world, s->replicas,
        s->group, a->plan.layout, a->plan.shard, a->plan.optim, (long long)a->batch, (long long)a->seq,
        (long long)a->steps, (long long)s->start_step,
        100.0 * (double)(st.padded_elems - st.param_elems) / (double)st.param_elems, a->compute_dtype,
        strcmp(a->plan.fp8, "block") == 0
            ? (a->plan.fp8_pow2 ? ", FP8 block (e4m3 linear weights, power-of-2 scales)"
                                : ", FP8 block (e4m3 linear weights)")
            : "",
        threads, a->compute_dtype, s->peak_gflops, s->flops_per_token * 1e-9);
    fflush(stdout);
  }

  if (rf_train_stopped_early(s, s->start_step + 1)) return 0; /* the log and the folder as they were */
  /* logged: rank 0's log write of a step, agreed at the next; the log starts with the run's plan */
  int bad_in_a_row = 0, logged = s->log.file && !a->resume ? rf_train_log_truncate(&s->log) : 0;
  struct rf_plan_summary plan = {st.param_elems,  st.padded_elems,        st.max_shard_elems,
                                 st.split_blocks, st.copy_bytes_per_step, st.n_buffers};
  struct rf_optim_stats os;
  rf_optim_get_stats(s->optim, &os);
  struct rf_train_memory mem = {st.shard_elems, st.arena_bytes, os.state_bytes, os.workspace_bytes,
                                rf_train_model_workspace_bytes(s->model)};
  if (s->log.file && logged == 0) logged = rf_train_log_plan(&s->log, &plan, &mem);
  if (a->trace) RF_TOOL_TRY(rf_run_agree_comm(s->comm, rf_train_trace_begin(s)));
  if (s->tb && logged == 0)
    logged = rf_run_tensorboard_begin(s->tb, a->resume ? s->start_step : -1, rf_train_wall_s());
  for (int64_t step = s->start_step; step < a->steps; step++) {
    struct rf_counters before, after;
    rf_fsdp_get_counters(s->fsdp, &before, NULL);
    uint64_t t0 = rf_train_now_ns();
    double cpu0 = rf_train_cpu_ms();
    double loss = 0, norm = 0;
    rf_run_trace_step(step + 1);
    uint64_t t_step = rf_run_trace_now();
    int skipped = rf_train_step(s, step, &loss, &norm);
    rf_comm_watchdog_note(step + 1, "end of step: agreement, evaluation, checkpoint");
    uint64_t t_agree = rf_run_trace_now();
    if (rf_run_agree_comm(s->comm, skipped < 0 || logged != 0 ? -1 : 0) != 0) return -1;
    rf_run_trace_span(RF_TRACE_LANE_COMPUTE, "step agreement", t_agree);
    rf_run_trace_span(RF_TRACE_LANE_COMPUTE, "step", t_step);
    double ms = (double)(rf_train_now_ns() - t0) / 1e6, cpu_ms = (rf_train_cpu_ms() - cpu0) / threads;
    rf_fsdp_get_counters(s->fsdp, &after, NULL);
    struct rf_counters d = rf_counters_diff(&after, &before);
    double val = NAN;
    if (a->eval_every > 0 && ((step + 1) % a->eval_every == 0 || step + 1 == a->steps))
      val = rf_train_eval(s, s->val, a->eval_batches);
    logged = rf_train_report_step(s, step, loss, norm, rf_train_lr(a, step), ms, cpu_ms, val, &d, skipped);
    s->last_loss = loss;
    s->last_val = isnan(val) ? s->last_val : val;
    bad_in_a_row = skipped ? bad_in_a_row + 1 : 0;
    RF_TOOL_REQUIRE(bad_in_a_row < 5,
                    "training diverged: non-finite gradients 5 steps in a row (last at step %lld)",
                    (long long)step + 1);
    RF_TOOL_TRY(rf_train_ckpt_step(s, step + 1));
    /* SIGTERM / SIGINT on any rank, or a launcher gone (SIGHUP): everyone stops here */
    int sig = rf_run_stop_signal(s->fsdp);
    if (sig) return rf_train_ckpt_stop(s, step + 1, sig);
  }
  RF_TOOL_TRY(rf_run_agree_comm(s->comm, logged));
  RF_TOOL_TRY(rf_train_trace_end(s));
  if (bad_in_a_row > 0 && s->rank == 0) /* fewer than the 5 that stop a run: said, not silent */
    printf(
        "warning: the run ended on %d skipped step%s (non-finite gradients): the weights are those of step "
        "%lld; lower --lr or check the data\n",
        bad_in_a_row, bad_in_a_row > 1 ? "s" : "", (long long)(a->steps - bad_in_a_row));
  RF_TOOL_TRY(rf_train_ckpt_end(s));
  if (a->sample > 0) rf_train_sample(s, s->tok);
  if (s->rank == 0 && a->plot) { /* the last step: nothing collective follows */
    rf_train_log_close(&s->log);
    RF_TOOL_TRY(rf_train_plot(a->log, a->plot, a->model));
    printf("loss curve: %s\n", a->plot);
  }
  return 0;
}

static void rf_train_state_free(struct rf_train_state *s) {
  rf_run_async_free(s->async); /* before the optimizer and the context it borrows */
  if (s->optim) rf_optim_free(s->optim);
  rf_train_model_destroy(s->model);
  rf_token_data_close(s->train);
  rf_token_data_close(s->val);
  rf_tokenizer_close(s->tok);
  rf_train_log_close(&s->log);
  rf_run_tensorboard_close(s->tb);
  free(s->tokens);
  free(s->targets);
}

int rf_cmd_train(int argc, char **argv) {
  struct rf_train_args a = {
      .steps = 100,
      .batch = 8,
      .seq = 128,
      .lr = 1e-3,
      .min_lr_ratio = 0.1,
      .seed = 1,
      .plan = RF_PLAN_ARGS_DEFAULT,
      .weight_decay = 0.1,
      .clip = 1.0,
      .accum = 1,
      .prefetch = 1,
      .compute_dtype = "f32",
      .device = "cpu",
      .eval_batches = 8,
      .sample = 0,
      .temperature = 0.8,
      .print_every = 1,
      .keep = 2,
      .collective_timeout = 600,
      .shampoo_block = 1024,
      .shampoo_every = 20,
      .shampoo_beta2 = 0.999,
      .shampoo_eps = 1e-12,
      .replicate = "1",
      .max_padding = -1,
  };
  char families[256], model_help[320], usage[512];
  if (rf_train_model_families(families, sizeof families, 1, ", ") != 0) RF_TOOL_DIE("%s", rf_fsdp_error());
  snprintf(model_help, sizeof model_help, "model config (Hugging Face config.json, model_type %s)", families);
  snprintf(
      usage, sizeof usage,
      "usage: mpirun -np W rfsdp train --model CONFIG.json --data PREFIX [--steps N] [--batch B] [--seq T] "
      "[--lr LR] [--optim %s] ...",
      rf_plan_args_optim_choices());
  const struct rf_option options[] = {
      {"model", RF_OPTION_KIND_STRING, &a.model, model_help, NULL, 1},
      {"data", RF_OPTION_KIND_STRING, &a.data, "token files prefix (from rfsdp prepare)", NULL, 1},
      {"steps", RF_OPTION_KIND_I64, &a.steps, "optimizer steps", "[1, inf)", 0},
      {"batch", RF_OPTION_KIND_I64, &a.batch, "global batch in sequences (split across ranks)", "[1, inf)",
       0},
      {"seq", RF_OPTION_KIND_I64, &a.seq, "tokens per sequence", "[1, inf)", 0},
      {"lr", RF_OPTION_KIND_DOUBLE, &a.lr, "peak learning rate", "(0, inf)", 0},
      {"min-lr-ratio", RF_OPTION_KIND_DOUBLE, &a.min_lr_ratio, "cosine decay ends at this fraction of --lr",
       "[0, 1]", 0},
      {"warmup", RF_OPTION_KIND_I64, &a.warmup, "linear warm-up steps", "[0, inf)", 0},
      {"seed", RF_OPTION_KIND_I64, &a.seed, "seed of the initialization and of the data order", NULL, 0},
      RF_PLAN_ARGS_OPTIONS(a.plan),
      {"replicate", RF_OPTION_KIND_STRING, &a.replicate,
       "HSDP: R replica groups of W/R ranks each (consecutive ranks shard together), node (a node's ranks "
       "shard together) or auto (by --max-padding and --memory-per-rank); 1: FSDP over all ranks",
       NULL, 0},
      {"max-padding", RF_OPTION_KIND_DOUBLE, &a.max_padding,
       "percent of padding (ragged: imbalance) every unit may have, for --replicate auto", "[0, inf)", 0},
      {"memory-per-rank", RF_OPTION_KIND_DOUBLE, &a.memory_per_rank,
       "GB (1e9 bytes) a rank may use as rfsdp plan --batch simulates it, for --replicate auto: the smallest "
       "shard group that fits",
       "(0, inf)", 0},
      {"weight-decay", RF_OPTION_KIND_DOUBLE, &a.weight_decay, "decoupled weight decay (matrices)",
       "[0, inf)", 0},
      {"shampoo-block", RF_OPTION_KIND_I64, &a.shampoo_block, "Shampoo: largest preconditioner block side",
       "[1, 65536]", 0},
      {"shampoo-every", RF_OPTION_KIND_I64, &a.shampoo_every, "Shampoo: steps between inverse-root refreshes",
       "[1, inf)", 0},
      {"shampoo-beta2", RF_OPTION_KIND_DOUBLE, &a.shampoo_beta2, "Shampoo: EMA of the factors (1: sums)",
       "(0, 1]", 0},
      {"shampoo-eps", RF_OPTION_KIND_DOUBLE, &a.shampoo_eps, "Shampoo: added to the factors' eigenvalues",
       "[0, inf)", 0},
      {"shampoo-stagger", RF_OPTION_KIND_FLAG, &a.shampoo_stagger,
       "Shampoo: spread the matrices' refreshes over the steps", NULL, 0},
      {"clip", RF_OPTION_KIND_DOUBLE, &a.clip, "clip the global gradient norm (0: off)", "[0, inf)", 0},
      {"accum", RF_OPTION_KIND_INT, &a.accum, "micro-batches per step (gradient accumulation)", "[1, inf)",
       0},
      {"prefetch", RF_OPTION_KIND_INT, &a.prefetch, "units gathered ahead", "[0, inf)", 0},
      {"no-reshard", RF_OPTION_KIND_FLAG, &a.no_reshard, "keep parameters gathered from forward to backward",
       NULL, 0},
      {"device", RF_OPTION_KIND_CHOICE, &a.device,
       "where the step runs: cpu; checked (the CPU twin of a GPU: device memory the host cannot read, late "
       "streams; the cpu run's bits); cuda is refused, naming what is not wired yet (docs/gpu.md)",
       "cpu|checked|cuda", 0},
      {"compute-dtype", RF_OPTION_KIND_CHOICE, &a.compute_dtype,
       "operands of the linear layers' GEMMs (f32 accumulation and outputs either way)", "f32|bf16", 0},
      {"eval-every", RF_OPTION_KIND_I64, &a.eval_every, "validation loss every N steps (0: never)",
       "[0, inf)", 0},
      {"eval-batches", RF_OPTION_KIND_INT, &a.eval_batches, "validation batches per evaluation", "[1, inf)",
       0},
      {"log", RF_OPTION_KIND_STRING, &a.log, "JSONL log, one object per step", NULL, 0},
      {"plot", RF_OPTION_KIND_STRING, &a.plot, "loss curve PNG at the end (needs --log)", NULL, 0},
      {"trace", RF_OPTION_KIND_STRING, &a.trace,
       "Chrome trace (Perfetto, chrome://tracing) of every rank's step: units, collectives, waits, "
       "optimizer, "
       "checkpoints; with --plot also timeline.png beside the loss curve",
       NULL, 0},
      {"trace-steps", RF_OPTION_KIND_STRING, &a.trace_steps,
       "the traced steps A:B (default: the run's first 20)", NULL, 0},
      {"tensorboard", RF_OPTION_KIND_STRING, &a.tensorboard,
       "folder of TensorBoard scalars (loss, val loss, grad norm, lr, tokens/s, MFU, memory, bytes per "
       "step); a "
       "resumed run appends to it",
       NULL, 0},
      {"sample", RF_OPTION_KIND_INT, &a.sample, "tokens of text to generate at the end", "[0, inf)", 0},
      {"temperature", RF_OPTION_KIND_DOUBLE, &a.temperature, "sampling temperature", "[0, inf)", 0},
      {"print-every", RF_OPTION_KIND_I64, &a.print_every, "progress line every N steps", "[0, inf)", 0},
      {"peak-gflops", RF_OPTION_KIND_DOUBLE, &a.peak_gflops,
       "GEMM peak per rank in the compute dtype, for MFU (0: oneDNN's, measured once, cached)", "[0, inf)",
       0},
      {"save-every", RF_OPTION_KIND_I64, &a.save_every, "checkpoint every N steps (needs --ckpt-dir)",
       "[0, inf)", 0},
      {"ckpt-dir", RF_OPTION_KIND_STRING, &a.ckpt_dir, "where checkpoints go: DIR/step-NNNNNNNN", NULL, 0},
      {"async-save", RF_OPTION_KIND_FLAG, &a.async_save,
       "write checkpoints in the background: the step copies the state into a staging buffer and "
       "training goes on (needs --ckpt-dir)",
       NULL, 0},
      {"ckpt-dir-force", RF_OPTION_KIND_FLAG, &a.ckpt_dir_force,
       "take --ckpt-dir's lock even when it names a job of another host (one this host cannot see is "
       "gone)",
       NULL, 0},
      {"keep", RF_OPTION_KIND_INT, &a.keep, "checkpoints kept (the oldest are removed)", "[1, inf)", 0},
      {"resume", RF_OPTION_KIND_STRING, &a.resume,
       "continue from a checkpoint directory (or a --ckpt-dir: its latest complete one)", NULL, 0},
      {"init", RF_OPTION_KIND_STRING, &a.init, "start from the weights of a safetensors file", NULL, 0},
      {"collective-timeout", RF_OPTION_KIND_DOUBLE, &a.collective_timeout,
       "seconds a rank may wait in one collective before it ends the job with a message (0: off)", "[0, inf)",
       0},
  };
  /* first: before MPI and OpenMP start threads, which then inherit the signals blocked;
   * a signal while MPI starts ends the rank at once (what MPICH's launcher waits for) */
  rf_run_catch_signals();
  rf_run_signals_exit_early(1);
  rf_comm_mpi_init(&argc, &argv);
  rf_run_signals_exit_early(0);
  struct rf_train_state s;
  memset(&s, 0, sizeof s);
  s.args = &a;
  s.job = s.comm = rf_comm_create_mpi(MPI_COMM_WORLD);
  s.rank = rf_comm_rank(s.job);
  s.world = rf_comm_size(s.job);
  if (s.rank != 0) rf_fsdp_log_errors_only();
  if (rf_train_check_same_options(s.job, argc, argv) != 0) {
    rf_comm_destroy(s.job); /* (LeakSanitizer's exit 1 replaced the 2) */
    rf_comm_mpi_finalize();
    return 2;
  }
  int rc = rf_options_parse(argc, argv, options, (int)(sizeof options / sizeof options[0]), usage);
  if (rc == 1) {
    rf_comm_destroy(s.job);
    rf_comm_mpi_finalize();
    return 0;
  }
  rf_train_test_hooks(s.job); /* the test build's RF_TEST_* (tools/test_hooks.c); none in a release */
  int status = 2;
  if (rc == 0) rc = rf_train_check_args(&a, s.world, &s.replicate);
  if (rc == 0) rc = rf_train_check_optim_options(&a, argc, argv);
  if (rc != 0) {
    if (s.rank == 0) fprintf(stderr, "rfsdp train: %s\n", rf_fsdp_error());
  } else {
    if (a.collective_timeout > 0) rf_comm_watchdog_hosts(s.job);
    rf_comm_watchdog_start(a.collective_timeout);
    status = rf_run_exit_status(s.comm, rf_train_run(&s), "rfsdp train");
    if (status == 1 && rf_train_usage_error) status = 2;
    rf_comm_watchdog_stop();
    if (status == 0 && s.stop_signal) status = 128 + s.stop_signal; /* 143 SIGTERM, 130 SIGINT, 129 SIGHUP */
    rf_train_state_free(&s);                                        /* the async writer done */
    rf_run_lock_release(&rf_train_lock);
  }
  rf_comm_destroy(s.job);
  rf_comm_mpi_exit_status(status);
  rf_comm_mpi_finalize();
  return status;
}
