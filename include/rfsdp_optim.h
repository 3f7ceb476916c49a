/* rfsdp optimizers: optimizers that run on each rank's pieces of the tensors
 * (struct rf_tensor_view, rfsdp_types.h), independent of how the runtime
 * stores them. The public API of src/optim; MPI-free.
 *
 *   adamw      AdamW (bias correction, decoupled weight decay), f32 state m, v.
 *   adamw8bit  AdamW with m and v as 8-bit codes of bitsandbytes' dynamic maps
 *              (signed for m, unsigned for v) and one f32 absmax per block:
 *              32x32 tiles of matrices (32-row strips, 32-column tiles, shorter
 *              last ones), flat runs of 256 elements of vectors. Where the
 *              layout keeps them whole (the view's block_elems, see
 *              rf_optim_layout_needs) a cut block is an error and the state
 *              depends on a rank's strips only, not on W; where it may cut
 *              (block_elems 1: flat, fsdp2) a cut block is quantized per local
 *              fragment (counted in stats.tiles_cut).
 *   muon       Muon (momentum with Nesterov, 5 quintic Newton-Schulz iterations
 *              in f32, update scaled to AdamW's RMS) for the views flagged
 *              RF_OPTIM_FLAG_MATRIX; AdamW for the rest. Each Muon matrix has one
 *              owner rank; the momentum pieces go to the owners in one
 *              all-to-all-v per unit, the orthogonalized updates come back in one.
 *   shampoo    Distributed Shampoo (facebookresearch/optimizers' algorithm) for
 *              the views flagged RF_OPTIM_FLAG_MATRIX: each matrix split into
 *              blocks of at most shampoo_block per side; per block the factors
 *              L = b L + (1 - b) G G^T, R = b R + (1 - b) G^T G (f32), their inverse
 *              4th roots refreshed every shampoo_every steps from an f64 symmetric
 *              eigendecomposition (LAPACKE dsyevd; identity before the first
 *              refresh), the update L^-1/4 Gf R^-1/4 of the filtered gradient Gf
 *              (EMA with beta1, bias-corrected) scaled to the norm of Adam's update
 *              of the block (grafting: beta2, eps), plus decoupled weight decay.
 *              Each matrix has one owner (the Muon transport), which holds all
 *              its state ("precond"); AdamW for the other views.
 *
 * State layout: every state slab whose `shard_layout` is 1 has the rank's shard
 * length and holds a tensor's state at the view's shard_offset, like the master
 * slab, so a checkpoint saves and reshards it with the same offsets. The 8-bit
 * scales are per block: a view's blocks in order (strip by strip, tiles left to
 * right; vectors: runs of 256) start at the view's scale offset
 * (rf_optim_scales).
 *
 * Ownership: struct rf_optim is opaque; it copies the views (their `starts`,
 * `master` and `grad` pointers stay borrowed and must outlive it), borrows the
 * communicator, and owns every state slab and workspace, all allocated in
 * rf_optim_create. rf_optim_step allocates nothing. */
#ifndef RFSDP_OPTIM_H
#define RFSDP_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "rfsdp_types.h"

/* struct rf_comm (rfsdp_types.h): the communicator Muon's and Shampoo's transfers
 * use; rfsdp_mpi.h makes one from an MPI communicator. */
struct rf_fsdp; /* rfsdp.h: the runtime context (rf_optim_create_fsdp) */

enum rf_optim_kind {
  RF_OPTIM_KIND_ADAMW = 0,
  RF_OPTIM_KIND_ADAMW8BIT,
  RF_OPTIM_KIND_MUON,
  RF_OPTIM_KIND_SHAMPOO
};

/* Per-view groups: the caller's decision (the library knows no tensor names; a
 * model states them, e.g. src/model's struct rf_model_tensor decay and matrix). */
enum rf_optim_flag {
  RF_OPTIM_FLAG_DECAY = 1, /* apply decoupled weight decay */
  RF_OPTIM_FLAG_MATRIX = 2 /* a 2-D hidden matrix that the matrix optimizer (muon) updates whole;
                              ignored by the element-wise kinds; the other views take AdamW */
};

/* The learning-rate adjustment of a Muon matrix of A x B (torch.optim.Muon's adjust_lr_fn):
 *   match_rms_adamw: lr * 0.2 * sqrt(max(A, B))  (Moonlight; shares AdamW's lr; the default)
 *   original:        lr * sqrt(max(1, A / B))    (Keller Jordan's Muon) */
enum rf_optim_muon_scale { RF_OPTIM_MUON_SCALE_MATCH_RMS_ADAMW = 0, RF_OPTIM_MUON_SCALE_ORIGINAL };

struct rf_optim_options {
  enum rf_optim_kind kind;
  float beta1, beta2, eps; /* AdamW (default 0.9, 0.95, 1e-8) */
  float weight_decay;      /* decoupled, for views with RF_OPTIM_FLAG_DECAY (default 0.1) */
  float muon_momentum;     /* default 0.95 */
  int muon_nesterov;       /* default 1 */
  int muon_ns_steps;       /* default 5 */
  float muon_ns_eps;       /* Frobenius-norm clamp (default 1e-7) */
  enum rf_optim_muon_scale muon_scale;
  int muon_overlap;      /* 1: a unit's all-to-all-v runs while another unit is orthogonalized (default 1);
                           Shampoo's transfers too */
  int64_t shampoo_block; /* --shampoo-block: largest block side (default 1024; >= 1) */
  int64_t shampoo_every; /* --shampoo-every: steps between root refreshes (default 20; >= 1) */
  float shampoo_beta2;   /* --shampoo-beta2: the factors' EMA (default 0.999; (0, 1], 1: sums) */
  float shampoo_eps;     /* --shampoo-eps: added to the factors' eigenvalues (default 1e-12; >= 0) */
  int shampoo_stagger;   /* --shampoo-stagger: 1: matrices refresh in different steps (default 0) */
};

void rf_optim_options_default(struct rf_optim_options *opt);
/* "adamw", "adamw8bit", "muon", "shampoo". Returns -1 on an unknown name. */
int rf_optim_kind_parse(const char *name, enum rf_optim_kind *out);
const char *rf_optim_kind_name(enum rf_optim_kind kind);
/* Every optimizer's name in the kinds' table order joined by `sep` into out
 * (size bytes): "adamw|adamw8bit|muon|shampoo" for sep "|". For messages and
 * --help, never written by hand. Returns 0, or -1 when out is NULL or too small. */
int rf_optim_kind_list(char *out, size_t size, const char *sep);

/* What an optimizer needs the layout to keep whole on one rank: `block_rows` rows
 * of every matrix (ndim >= 2) and runs of `vector_block` elements of vectors
 * (1: may be cut anywhere). 8-bit AdamW: its 32-row strips and 256-element runs,
 * so that its blocks, and so its state, do not depend on W. The runtime options
 * (rf_fsdp_options block_rows, vector_block) and the planner take them. */
struct rf_optim_layout_needs {
  int64_t block_rows;
  int64_t vector_block;
};
void rf_optim_layout_needs(enum rf_optim_kind kind, struct rf_optim_layout_needs *out);

struct rf_optim;

/* `views[n]` are this rank's pieces (empty pieces allowed), `flags[n]` their
 * groups (rf_optim_flag bits), `shard_elems` the rank's shard length.
 * `comm` is required for muon and shampoo (NULL allowed otherwise); every rank passes the
 * same tensors in the same order. Returns 0, or -1 with a message (a piece
 * outside the shard, a Muon view that is not 2-D or whose starts disagree). */
int rf_optim_create(struct rf_optim **out, const struct rf_optim_options *opt,
                    const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                    const struct rf_comm *comm);
void rf_optim_free(struct rf_optim *o);
/* The same over every tensor of a finalized runtime context (rf_fsdp_views,
 * `flags` one per tensor, rf_fsdp_shard_elems). `comm` (borrowed) may be NULL:
 * the context's own communicator (Muon's transfers then run on it). */
int rf_optim_create_fsdp(struct rf_optim **out, const struct rf_optim_options *opt, const struct rf_fsdp *f,
                         const int *flags, const struct rf_comm *comm);

/* The end of a training step on the runtime context `f` the optimizer was created
 * from (rf_optim_create_fsdp), after its micro-batches' backward: the gathers'
 * status (rf_fsdp_status), the gradients finished (rf_fsdp_grads_finish: HSDP's
 * replica all-reduces), the global norm (rf_fsdp_grad_norm, into *norm), clipped
 * to `clip` (rf_fsdp_clip_grads; 0: off), then rf_optim_step at `lr`; each part a
 * span of the trace. Collective. Returns 0; 1 when the norm is not finite (every
 * rank skips the update together, nothing changed); or -1 with a message, the same
 * on every rank. `rfsdp train` and docs/example/llama.c step by it. */
int rf_optim_step_fsdp(struct rf_optim *o, struct rf_fsdp *f, float lr, double clip, double *norm);

/* One step with learning rate `lr` on every view's master from its grad. Muon,
 * Shampoo: a collective (every rank calls it). Returns 0, or -1 with a message
 * on every rank (Shampoo: a non-finite factor or a failed eigendecomposition,
 * naming the tensor; the ranks agree before returning). */
int rf_optim_step(struct rf_optim *o, float lr);
/* A function rf_optim_step calls first, before it changes the master shard or any
 * state (an asynchronous checkpoint's background copy of them is waited for there:
 * rf_run_async_create sets it, rf_run_async_free clears it); NULL clears it. Local. */
void rf_optim_set_before_step(struct rf_optim *o, void (*fn)(void *ctx), void *ctx);
/* Steps taken (bias correction uses it); set it when resuming from a checkpoint. */
int64_t rf_optim_get_step(const struct rf_optim *o);
enum rf_optim_kind rf_optim_get_kind(const struct rf_optim *o);
void rf_optim_set_step(struct rf_optim *o, int64_t step);

/* ---- state, for checkpoints ------------------------------------------------ */

struct rf_optim_state_slab {
  const char *name; /* "m", "v", "m_code", "v_code", "m_scale", "v_scale" (static string) */
  void *data;       /* borrowed from the optimizer */
  enum rf_dtype dtype;
  int64_t count;    /* elements */
  int shard_layout; /* 1: shard length, the view's shard_offset; 0: per-block or per-owner (rf_optim_scales)
                     */
};

int rf_optim_n_states(const struct rf_optim *o);
void rf_optim_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out);

/* 8-bit: view i's blocks are [*offset, *offset + *count) of the scale slabs; the
 * first of them is block *first of the tensor (global numbering: strip-major,
 * ceil(cols/32) tiles per strip; vectors: runs of 256). 0 blocks for other kinds.
 * The blocks are the consecutive blocks [first, first + count) of the tensor when
 * the piece covers whole rows (any planned, fsdp2 or whole-block layout); a piece
 * that starts or ends inside a row touches non-consecutive tiles (count is the
 * number touched), and its cut tiles are shared with the neighbouring rank. */
void rf_optim_scales(const struct rf_optim *o, int view, int64_t *offset, int64_t *count, int64_t *first);
/* Shampoo uses the same two calls for its "precond" slab: view i's whole state
 * (the tensor's index space: rf_optim_tensor_blocks elements) is [*offset,
 * *offset + *count) on the matrix's owner (*first 0, *count all of it) and
 * nothing elsewhere, so a checkpoint saves it from the owner and loads it into
 * whichever rank owns the matrix at another W. */
/* 8-bit: the number of blocks of view i's whole tensor (every rank's), the
 * index space of its scales. */
int64_t rf_optim_tensor_blocks(const struct rf_optim *o, int view);

/* ---- what it costs ----------------------------------------------------------- */

struct rf_optim_stats {
  int64_t state_bytes;      /* state slabs of this rank (allocated; shard length) */
  int64_t state_bytes_used; /* the part holding state of the views' pieces (Muon matrices: no v) */
  int64_t workspace_bytes;  /* scratch, Muon staging and Newton-Schulz buffers */
  int64_t tiles_cut;        /* 8-bit blocks of this rank quantized per fragment */
  int64_t steps;
  /* Muon, cumulative on this rank */
  uint64_t muon_bytes_sent;      /* to other ranks (both trips) */
  uint64_t muon_bytes_recv;      /* from other ranks (both trips) */
  double muon_ns_flops;          /* Newton-Schulz FLOPs */
  int64_t muon_matrices;         /* matrices orthogonalized */
  double muon_owned_flops;       /* NS FLOPs per step of the matrices this rank owns */
  uint64_t muon_step_bytes_sent; /* planned per step: to other ranks, both trips */
  uint64_t muon_step_bytes_recv; /* planned per step: from other ranks, both trips */
  uint64_t muon_ns_time_ns;      /* time in Newton-Schulz */
  uint64_t muon_comm_wait_ns;    /* time waiting for the all-to-all-v */
  /* (the muon_bytes_*, muon_step_bytes_* and muon_comm_wait_ns fields count the
     matrix-owner transport: Shampoo's too) */
  /* Shampoo, cumulative on this rank */
  int64_t shampoo_eighs;       /* symmetric eigendecompositions (one per factor per refresh) */
  uint64_t shampoo_eigh_ns;    /* time in them (with the roots built from them) */
  uint64_t shampoo_precond_ns; /* time in the owners' per-step work (factors, preconditioning) */
  double shampoo_owned_cost;   /* eigendecomposition cost (sum of n^3) of the matrices this rank owns */
  /* what one step costs this rank, planned (the simulator's price of the optimizer) */
  double step_stream_bytes; /* memory read and written (the optimizer's own bytes per element) */
  double step_flops;        /* Muon, Shampoo: the owners' matrix work on the matrices this rank owns */
};

void rf_optim_get_stats(const struct rf_optim *o, struct rf_optim_stats *out);
/* What rf_optim_create would give rank `rank` of `world` (the views of that rank;
 * their master, grad and shard_offset are not read), through the same code with
 * nothing of the slab's size allocated and nothing moved: state_bytes,
 * workspace_bytes, tiles_cut and for Muon and Shampoo the owners'
 * muon_step_bytes_sent/recv and owned costs (rf_optim_get_stats). What `rfsdp
 * plan --batch` simulates. Returns 0, or -1 with rf_optim_create's message. */
int rf_optim_measure(const struct rf_optim_options *opt, const struct rf_tensor_view *views, const int *flags,
                     int n, int64_t shard_elems, int rank, int world, struct rf_optim_stats *out);
/* Muon, Shampoo: the owner rank of view i (-1 when not a Muon or Shampoo
 * matrix), and how many times this rank orthogonalized it (Muon) or refreshed its
 * roots (Shampoo). */
int rf_optim_muon_owner(const struct rf_optim *o, int view);
int64_t rf_optim_muon_count(const struct rf_optim *o, int view);
/* Newton-Schulz FLOPs of one A x B matrix with `steps` iterations. */
double rf_optim_ns_flops(int64_t rows, int64_t cols, int steps);

#endif
