/* rfsdp: RaggedShard fully sharded data parallel training in C.
 * The public API. Internal headers live under src/ and are not installed.
 *
 * A model written in C declares its units (tensors gathered and reduced
 * together, e.g. one transformer block) and their tensors, then finalizes: rfsdp
 * plans every unit, allocates each rank's shards (master weights f32, gradients
 * f32) once, and reserves one arena for the unsharded buffers. In a step the
 * model asks for a unit before it computes with it (the runtime all-gathers it,
 * prefetching the next one), reads parameters through views into the gathered
 * buffer, accumulates gradients into views of the unsharded gradient buffer, and
 * hands the unit back (the runtime reduce-scatters the gradients into the shard).
 * Nothing is allocated inside a step; nothing is copied around a collective in
 * the planned layout. See docs/runtime.md for a minimal model.
 *
 * MPI-free: the constructors on MPI communicators are in rfsdp_mpi.h.
 *
 * Ownership: struct rf_fsdp is opaque and owns everything it allocates; every
 * pointer it returns is borrowed and valid until rf_fsdp_free (views into the
 * unsharded buffers: until the unit is resharded). Strings passed in are copied.
 *
 * Bad calls: every function of rfsdp.h, rfsdp_optim.h and rfsdp_run.h that
 * returns int returns -1 on a NULL pointer argument (rf_fsdp_error() then names
 * the function and the argument) or a call in the wrong state (declarations after
 * rf_fsdp_finalize, an optimizer on an unfinalized context, rf_optim_step before
 * rf_fsdp_grads_finish, a learning rate that is NaN or negative); nothing is
 * changed then (tests/test_api_checks.c). */
#ifndef RFSDP_H
#define RFSDP_H

#include <stdint.h>

#include "rfsdp_types.h"

struct rf_fsdp_options {
  enum rf_layout layout;
  enum rf_shard_mode shard; /* planned layout */
  int max_buffers;          /* planned: buffers per unit at most (default 4) */
  int64_t align_bytes;      /* every rank's slice starts on this many bytes (default 64) */
  int64_t block_rows;       /* default block of 2-D+ tensors, in rows (default 1) */
  int64_t vector_block;     /* default block of 1-D tensors, in elements (default 1) */
  int prefetch;             /* units gathered ahead (0: none; default 1) */
  int reshard_after_forward;
  enum rf_dtype param_dtype;  /* f32 or bf16: the dtype of the gathered parameters */
  enum rf_dtype reduce_dtype; /* f32 or bf16: the dtype of the reduce-scatter */
  uint64_t seed;              /* for rf_init */
  /* FP8 block mode (docs/fp8.md): the tensors marked with rf_fsdp_set_fp8 are read
   * as e4m3 codes, one f32 scale per 128x128 tile (amax / 448, or a power of two with
   * fp8_pow2); the others in param_dtype. Planned layout: they are gathered as codes
   * and scales, each rank quantizing its own tiles from its f32 master before every
   * gather. fsdp2 and flat (whose rank boundaries cut tiles): gathered in param_dtype,
   * then every rank quantizes each whole tensor after the gather, as the peers do. */
  int fp8;
  int fp8_pow2;
  /* Where the runtime computes, chosen once: a backend's name ("cpu", "checked", "cuda"; NULL: "cpu").
   * The context opens that device and everything made over it (the optimizer of
   * rf_optim_create_fsdp, the model's workspace) uses it; creation fails naming the option
   * when this program cannot use it (a CPU build asked for cuda). */
  const char *device;
};

/* The defaults above. */
void rf_fsdp_options_default(struct rf_fsdp_options *opt);
/* NULL when this program can compute on `device` (rf_fsdp_options.device: "cpu", "checked", "cuda"), else
 * why not: no such backend, or "built without CUDA", "no CUDA device" (static storage; the
 * same on every rank of a job built one way). */
const char *rf_device_unavailable(const char *device);

/* ---- communicators ----------------------------------------------------------
 * struct rf_comm (rfsdp_types.h) is opaque: a group of ranks and the backend that
 * connects them. rfsdp_mpi.h makes one from an MPI communicator. Collectives on
 * one communicator are issued from one thread at a time. */
int rf_comm_rank(const struct rf_comm *comm);
int rf_comm_size(const struct rf_comm *comm);
/* The sum of x over the ranks, on every rank (collective; checked). */
double rf_comm_sum(const struct rf_comm *comm, double x);
/* Checked collectives for a program's own decisions (every rank calls them; an error
 * of the backend stops every rank with its description): `count` elements of `dtype`
 * from rank `root` to every rank, and combined in place over every rank. A NULL comm, or a
 * NULL buf with count > 0, stops the process naming the failed assertion. */
void rf_comm_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype, int root);
void rf_comm_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                       enum rf_reduce_op op);
/* Every rank's status combined: 0 on every rank when every rank passed 0, else the
 * smallest status (e.g. -1) on every rank. A barrier: call it before any branch a
 * failure on one rank could take (checked like every collective). -1, without
 * communicating, when comm is NULL. */
int rf_comm_agree(const struct rf_comm *comm, int status);
/* The collective watchdog (src/comm/watchdog.c): a thread that ends the job when this
 * rank waits longer than `seconds` in one collective: it prints what the rank waited
 * in (the collective, the unit, the noted step and phase, the seconds) and stops
 * every rank. 0: off. One per process; start once. */
void rf_comm_watchdog_start(double seconds);
void rf_comm_watchdog_stop(void);
/* What the rank works on, for the watchdog's message: the step (-1: before the
 * first) and a phase ("optimizer", borrowed: a string that outlives the note). */
void rf_comm_watchdog_note(int64_t step, const char *phase);
/* Across hosts: every rank of `comm` tells the others its host name and the port
 * of a listener it opens, so that a rank passing the limit can name the hosts
 * that no longer answer (and ranks of world rank r > 0 wait min(r, 3) s more, so
 * that one message ends the job). Collective over `comm`; before the start. */
void rf_comm_watchdog_hosts(const struct rf_comm *comm);
/* The ranks of `comm` on this rank's node (a shared-memory node: MPI_COMM_TYPE_SHARED) into
 * *group, when every node runs as many: the shard group of HSDP by node (`--replicate node`).
 * Collective; the same on every rank: 0, or -1 on every rank when the nodes differ. */
int rf_comm_node_group(const struct rf_comm *comm, int *group);
/* Releases a communicator made by a constructor (rf_comm_create_mpi). */
void rf_comm_destroy(struct rf_comm *comm);

struct rf_fsdp;

/* The constructors take communicators of a backend: include/rfsdp_mpi.h
 * (rf_fsdp_create, rf_fsdp_create_mesh on MPI communicators). */
void rf_fsdp_free(struct rf_fsdp *f);
/* The last error message of this thread. */
const char *rf_fsdp_error(void);
/* The library's log on this process prints errors only (a program's ranks other than 0). */
void rf_fsdp_log_errors_only(void);
/* Records "file:line: message" (printf's format) as this thread's last error, the one
 * rf_fsdp_error() returns, and returns -1: a program built on the library reports its
 * own failures as the library does (the rfsdp command's RF_FAIL, tools/porch.h). */
int rf_fsdp_error_set(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Declares a unit; returns its index (units are used in declaration order as the
 * forward order), or -1. */
int rf_fsdp_add_unit(struct rf_fsdp *f, const char *name);
/* Declares a tensor of `unit`; returns its global index (declaration order), or -1.
 * block_rows: rows per block for ndim >= 2 (0: the default), ignored for vectors.
 * For ndim >= 2, a row is the last dimension and leading dimensions are flattened. */
int rf_fsdp_add_tensor(struct rf_fsdp *f, int unit, const char *name, int ndim, const int64_t *shape,
                       int64_t block_rows, struct rf_init init);
/* Marks a declared matrix (ndim 2) or fused experts (ndim 3: [E, rows, cols], each
 * expert's matrix tiled on its own) for FP8 block mode; in the planned layout its
 * blocks become whole bands of 128 rows (every 128x128 tile on one rank; experts
 * whose rows are not a multiple of 128: whole experts). Nothing when opt.fp8 is 0.
 * Returns 0, or -1 (another ndim, after finalize). */
int rf_fsdp_set_fp8(struct rf_fsdp *f, int tensor);
/* Plans every unit, allocates the shards and the arena, initializes parameters.
 * Returns 0, or -1 (bad declarations, a plan that fails its check). */
int rf_fsdp_finalize(struct rf_fsdp *f);

/* Rank and size of the shard group (what views, plans and shards are about). */
int rf_fsdp_rank(const struct rf_fsdp *f);
int rf_fsdp_world(const struct rf_fsdp *f);
/* Rank in the replicate group, and its size R (1 in 1-D FSDP). */
int rf_fsdp_replicate_rank(const struct rf_fsdp *f);
int rf_fsdp_replicas(const struct rf_fsdp *f);
int rf_fsdp_n_units(const struct rf_fsdp *f);
int rf_fsdp_n_tensors(const struct rf_fsdp *f);
/* The context's shard group (borrowed; rfsdp_mpi.h's rf_fsdp_comm: its MPI handle). */
const struct rf_comm *rf_fsdp_shard_comm(const struct rf_fsdp *f);

/* ---- one step -------------------------------------------------------------
 * Forward:  for u in order: rf_fsdp_forward_begin(u); compute; rf_fsdp_forward_end(u)
 * Backward: for u in reverse: rf_fsdp_backward_begin(u); compute (accumulate into
 *           rf_fsdp_grad views); rf_fsdp_backward_end(u)
 * Then rf_fsdp_grads_finish() waits for the reductions; the gradient shards hold
 * the sum over ranks (and over micro-batches since rf_fsdp_zero_grad). Call it
 * once per step, after the last micro-batch: under HSDP it all-reduces the shard
 * across the replicas (bytes_inter: rf_fsdp_shard_elems * 4 bytes per rank).
 * Gradient accumulation: repeat forward + backward per micro-batch; each
 * backward_end reduce-scatters and adds into the shard (memory stays at one
 * unsharded gradient buffer in flight). */
void rf_fsdp_zero_grad(struct rf_fsdp *f);
/* Waits for the unit's parameters (gathering them if not prefetched) and starts
 * the prefetch of the next units. */
void rf_fsdp_forward_begin(struct rf_fsdp *f, int unit);
/* Releases the gathered parameters when reshard_after_forward is set. */
void rf_fsdp_forward_end(struct rf_fsdp *f, int unit);
/* Waits for (or gathers) the parameters, zeroes the unit's gradient buffer, and
 * prefetches the previous units. */
void rf_fsdp_backward_begin(struct rf_fsdp *f, int unit);
/* Starts the reduce-scatter of the unit's gradients and releases its parameters. */
void rf_fsdp_backward_end(struct rf_fsdp *f, int unit);
void rf_fsdp_grads_finish(struct rf_fsdp *f);
/* Under HSDP: the micro-batch whose backward follows is the step's last (with one
 * micro-batch per step: every step's). Each unit's all-reduce of its gradient
 * shard across the replicas then starts, non-blocking, as soon as the schedule has
 * finished the unit's reduce-scatter, and overlaps the backward of the units
 * before it; rf_fsdp_grads_finish waits for them (without this call they all start
 * there). The sums are those of one all-reduce of the whole slab. Cleared by
 * rf_fsdp_zero_grad; nothing without replicas. */
void rf_fsdp_set_last_micro_batch(struct rf_fsdp *f);
/* After a forward without backward (evaluation, sampling): releases every unit
 * still gathered. */
void rf_fsdp_reshard_all(struct rf_fsdp *f);
/* Drives MPI progress of the collectives in flight; call between kernels. */
void rf_fsdp_poll(struct rf_fsdp *f);

/* Views, valid between begin and end of the tensor's unit. A parameter view is
 * f32 when param_dtype is f32 (rf_fsdp_param) or bf16 (rf_fsdp_param_bf16); the
 * other returns NULL. Gradients are always f32; the model adds into them. */
const float *rf_fsdp_param(struct rf_fsdp *f, int tensor);
const uint16_t *rf_fsdp_param_bf16(struct rf_fsdp *f, int tensor);
/* An FP8 tensor's gathered e4m3 codes (row-major [rows, cols]), and its tile scales
 * ([ceil(rows/128), ceil(cols/128)] row-major; fused experts: [E, ceil(rows/128),
 * ceil(cols/128)], each expert's own tiles) in *scales; NULL for other tensors
 * (whose rf_fsdp_param / rf_fsdp_param_bf16 is then NULL). */
const uint8_t *rf_fsdp_param_fp8(struct rf_fsdp *f, int tensor, const float **scales);
/* 0, or -1 with rf_fsdp_error() once a gather has failed (FP8: a tile of a master
 * holding NaN or an infinity, the tensor named). Every rank of the shard group
 * fails at the same gather with the same message (the scales, or under fsdp2 and
 * flat the weights they are computed from, are gathered), so every rank takes the
 * same branch; the views of a failed gather hold NaN scales. */
int rf_fsdp_status(const struct rf_fsdp *f);
float *rf_fsdp_grad(struct rf_fsdp *f, int tensor);

/* ---- after backward -------------------------------------------------------- */

/* Multiplies every gradient shard by `scale` (e.g. 1/micro-batches). */
void rf_fsdp_scale_grads(struct rf_fsdp *f, float scale);
/* The global L2 norm of the gradients (padding excluded; one all-reduce). NaN or
 * Inf on any rank makes it non-finite on every rank, so every rank takes the same
 * branch: skip the step when !isfinite(norm). */
double rf_fsdp_grad_norm(struct rf_fsdp *f);
/* Scales the gradients so their norm is at most max_norm (given the norm above). */
void rf_fsdp_clip_grads(struct rf_fsdp *f, double norm, double max_norm);

/* ---- shards, for optimizers and checkpoints --------------------------------- */

/* This rank's piece of one tensor (struct rf_tensor_view: rfsdp_types.h). */
void rf_fsdp_tensor(const struct rf_fsdp *f, int tensor, struct rf_tensor_view *out);
/* Every tensor's view on this rank, rf_fsdp_n_tensors entries in declaration
 * order: built once by rf_fsdp_finalize, owned by the context. */
const struct rf_tensor_view *rf_fsdp_views(const struct rf_fsdp *f);
/* Index of the tensor called `name`, or -1. */
int rf_fsdp_find_tensor(const struct rf_fsdp *f, const char *name);
/* This rank's whole shard slab: every tensor piece at its shard_offset, padding
 * (zero) between. Optimizer state of the same length uses the same offsets. */
int64_t rf_fsdp_shard_elems(const struct rf_fsdp *f);
float *rf_fsdp_shard_master(struct rf_fsdp *f);
float *rf_fsdp_shard_grad(struct rf_fsdp *f);

/* ---- what it costs ------------------------------------------------------------ */

/* Counters (struct rf_counters: rfsdp_types.h) of this context since it was created (`total`) and of the last
 * whole step (from one rf_fsdp_zero_grad to the next; zero before the second). Either may be NULL. The
 * context's device, moves and collectives count into its own counters (two contexts never mix); allocations
 * add the process's heap allocations (rf_xmalloc & co) to the context's device allocations. */
void rf_fsdp_get_counters(const struct rf_fsdp *f, struct rf_counters *total, struct rf_counters *last_step);
/* The context's counters themselves (owned by the context): a caller's own communicator may count into them
 * (the rfsdp command's loss all-reduce and agreements are part of its step). */
struct rf_counters *rf_fsdp_counters(struct rf_fsdp *f);
/* rf_counters_diff (now - before): rfsdp_types.h. */

struct rf_fsdp_stats {
  int64_t param_elems;      /* sum of the tensors' numel */
  int64_t padded_elems;     /* sum over units of the buffers' total elements (layout padding included) */
  int64_t shard_elems;      /* this rank's shard slab */
  int64_t arena_bytes;      /* the unsharded buffers' arena (capacity) */
  int64_t arena_peak_bytes; /* largest part of the arena in use at once */
  int64_t largest_unit_elems;
  int n_buffers; /* collectives per gather of the whole model */
  /* the layout's, as `rfsdp plan` prints them for the same options: */
  int64_t max_shard_elems;     /* sum over buffers of the largest rank range */
  int64_t split_blocks;        /* blocks cut by a rank boundary (0 in the planned layout) */
  int64_t copy_bytes_per_step; /* bytes copied around the collectives per step (docs/planner.md) */
};
void rf_fsdp_get_stats(const struct rf_fsdp *f, struct rf_fsdp_stats *out);

#endif
