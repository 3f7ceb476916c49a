/* src/plan: the structure-aware planner and the peers' layouts.
 *
 * For one unit (a group of tensors gathered and reduced together) the planner
 * chooses one or more flat buffers, the offset of every tensor in its buffer and
 * the element range each rank owns, so that no block of any tensor is cut by a
 * rank boundary. Two shard modes:
 *   equal  - every rank owns S elements (S a multiple of the alignment); padding
 *            between tensors; what NCCL's all-gather and reduce-scatter need.
 *   ragged - rank ranges end on the block boundary nearest the fair share; no
 *            padding; MPI_Allgatherv / MPI_Reduce_scatter move exactly the bytes.
 * See docs/planner.md. The step simulator over these plans is src/sim (sim.h). */
#ifndef RF_PLAN_H
#define RF_PLAN_H

#include <stdint.h>

#include "rfsdp_types.h" /* enum rf_shard_mode, rf_layout, rf_dtype */
#include "shard/shard.h"

/* One tensor of a unit as the model declares it. Borrowed strings. */
struct rf_plan_tensor_in {
  const char *name;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel; /* product of shape */
  int64_t
      block_elems;   /* elements of one block (whole rows times row length); the last block may be shorter */
  int64_t sub_count; /* > 1: a fused tensor of sub_count equal sub-tensors along dim 0 (MoE experts) */
  int fp8;           /* 1: quantized to e4m3 in 128x128 tiles (src/plan/fp8.c) */
};

struct rf_plan_unit_in {
  const char *name;
  int n_tensors;
  const struct rf_plan_tensor_in *tensors; /* borrowed */
};

struct rf_plan_options {
  int world;
  enum rf_shard_mode mode;
  int64_t align_elems;      /* every rank's range starts on a multiple of this (equal: S is a multiple) */
  int max_buffers;          /* split a unit into at most this many buffers (>= 1) */
  double buffer_cost_elems; /* a buffer beyond the first must save at least this much padding */
  int allow_sub_padding;    /* fused tensors placed a sub-tensor at a time: 1 with padding between
                             * them; 2 only where each stays one run (what the runtime runs); 0 never */
};

/* A tensor's place in a buffer. */
struct rf_plan_place {
  int tensor;         /* index into the unit's tensors */
  int64_t offset;     /* first element in the buffer */
  int64_t sub_stride; /* elements between consecutive sub-tensors (numel/sub_count when contiguous) */
  int64_t sub_first;  /* first sub-tensor held here: 0 unless sub-padding split the tensor */
  int64_t sub_n;      /* sub-tensors held here: sub_count (1 when not fused) unless split */
};

/* One flat buffer of a unit: one collective. Owns its arrays. */
struct rf_plan_buffer {
  int64_t *starts;     /* world+1 element offsets: rank r owns [starts[r], starts[r+1]); equal mode: r*S */
  int64_t shard_elems; /* equal mode: S; ragged mode: the largest range */
  int64_t total_elems; /* starts[world] */
  int n_places;
  struct rf_plan_place *places; /* in increasing offset */
};

/* The plan of one unit. Owns its buffers. */
struct rf_plan_unit {
  int world;
  enum rf_shard_mode mode;
  int n_buffers;
  struct rf_plan_buffer *buffers;
  int64_t elems;              /* sum of the tensors' numel */
  int64_t padded_elems;       /* sum of the buffers' total_elems */
  int used_sub_padding;       /* 1 if a fused tensor got padding between sub-tensors */
  int64_t bound_padded_elems; /* equal mode: world * the one-buffer lower bound on S; ragged: elems */
  int64_t max_shard_elems;    /* sum over buffers of the largest rank range (a rank's memory) */
  double imbalance;           /* ragged: largest range over the mean; equal: 1 */
};

/* Plans one unit. Returns 0, or -1 with rf_error_msg() set (bad input). */
int rf_plan_unit_make(const struct rf_plan_unit_in *in, const struct rf_plan_options *opt,
                      struct rf_plan_unit *out);
void rf_plan_unit_free(struct rf_plan_unit *plan);

/* The independent validity checker (separate code from the planner): tensors
 * inside their buffer, no overlap, no block cut by a rank boundary, ranges in
 * order covering the buffer, equal shards in equal mode, alignment. Returns 0,
 * or -1 with rf_error_msg() naming the violated constraint. */
int rf_plan_unit_check(const struct rf_plan_unit_in *in, const struct rf_plan_unit *plan,
                       int64_t align_elems);

/* ---- the one-buffer core (used by rf_plan_unit_make, exposed for tests) ---- */

/* One thing the one-buffer planner places: a tensor, or a run of sub-tensors of a
 * fused tensor when sub-padding splits it. block_elems is at most numel. */
struct rf_plan_item {
  int64_t numel;
  int64_t block_elems;
  int tensor;    /* index into the unit's tensors */
  int64_t sub;   /* first sub-tensor */
  int64_t sub_n; /* sub-tensors in this item */
};

/* Earliest legal placement of items in this order in a buffer of world*S
 * elements: returns 1 and fills offsets[n] (may be NULL) if it fits, else 0.
 * For a fixed order and S it is optimal: if any placement fits, this one does. */
int rf_plan_items_fit(const struct rf_plan_item *items, int n, int world, int64_t shard, int64_t *offsets);

/* The smallest S >= from (a multiple of align) that passes the necessary
 * conditions: S >= every block, and S a multiple of the block of every item
 * longer than 2S (such an item holds two boundaries, so S must be a whole number
 * of its blocks). From ceil(N/W) this is the one-buffer lower bound. */
int64_t rf_plan_next_candidate(const struct rf_plan_item *items, int n, int64_t align, int64_t from);
int64_t rf_plan_lower_bound(const struct rf_plan_item *items, int n, int world, int64_t align);

/* The smallest S (a multiple of align) for which the items fit in this order
 * (exact: every S from the lower bound up is tried, skipping only candidates
 * that fail the necessary conditions). Fills offsets[n] if not NULL. */
int64_t rf_plan_items_min_shard(const struct rf_plan_item *items, int n, int world, int64_t align,
                                int64_t *offsets);

/* The same, scanning only S < limit (limit < 0: no limit); -1 if none fits there. */
int64_t rf_plan_items_min_shard_below(const struct rf_plan_item *items, int n, int world, int64_t align,
                                      int64_t limit, int64_t *offsets);

/* The orders the planner tries (model order, by block size, by size
 * descending, by size ascending; duplicates removed). Writes n_orders*n indices
 * into perm (capacity RF_PLAN_MAX_ORDERS*n); returns n_orders. */
#define RF_PLAN_MAX_ORDERS 4
int rf_plan_orders(const struct rf_plan_item *items, int n, int *perm);

/* Ragged split of contiguous items (offsets given, sum = total): rank ranges cut
 * only at block boundaries that are multiples of align (or at the end),
 * minimising the largest range. Fills starts[world+1]; returns the largest range. */
int64_t rf_plan_ragged_split(const struct rf_plan_item *items, const int64_t *offsets, int n, int world,
                             int64_t align, int64_t *starts);

/* ---- the planning policy (src/plan/policy.c): a run's options -> a unit's layout ---- */

/* What a run asks of the layout: the runtime (src/fsdp) and `rfsdp plan` both
 * turn their options into this and plan every unit with rf_plan_layout_make. */
struct rf_plan_policy {
  enum rf_layout layout;      /* planned (the planner), fsdp2 or flat (the peers' layouts, run as they are) */
  enum rf_shard_mode shard;   /* planned: equal or ragged */
  int max_buffers;            /* planned, equal: buffers per unit at most */
  int64_t align_bytes;        /* every rank's range starts on this many bytes */
  enum rf_dtype param_dtype;  /* dtype of the gathered parameters (all-gather) */
  enum rf_dtype reduce_dtype; /* dtype of the gradient reduce-scatter */
  int64_t block_rows;         /* rows per block of a tensor of 2+ dimensions (the optimizer's need) */
  int64_t vector_block;       /* elements per block of a vector (the optimizer's need) */
  int fp8;        /* 1: FP8 block quantization of the tensors a model marks (128x128 tiles whole) */
  int whole_runs; /* 1: a fused tensor stays one run (its sub-tensors contiguous), as a DBuffer holds it:
                   * the runtime and `rfsdp plan` (rf_fsdp_plan_policy); 0: padding between its
                   * sub-tensors allowed (the planner's studies) */
};

/* The block of a tensor: 2+ dimensions are viewed as 2-D (rows = all leading
 * dimensions, a row = the last dimension) and a block is min(R, rows) rows, R =
 * own_rows when > 0 (the tensor's own) else the policy's; a vector's block is
 * min(vector_block, numel) elements. The one place this rule lives. */
int64_t rf_plan_block_elems(const struct rf_plan_policy *p, int ndim, const int64_t *shape, int64_t own_rows);

/* Elements every rank range is aligned to: align_bytes over the smaller of the
 * two dtypes moved (both collectives then start on align_bytes), at least 1. */
int64_t rf_plan_policy_align_elems(const struct rf_plan_policy *p);

/* The planner's options for a unit of unit_elems elements at `world`: a buffer
 * beyond the first must save at least max(64 Ki elements, 0.1% of the unit) of
 * padding; fused tensors are placed a sub-tensor at a time, with padding between
 * them unless p->whole_runs. */
void rf_plan_policy_options(const struct rf_plan_policy *p, int world, int64_t unit_elems,
                            struct rf_plan_options *out);

/* One tensor's place in a layout. */
struct rf_plan_layout_tensor {
  int buffer;
  int64_t offset; /* planned, flat: its first element in the buffer; fsdp2: its place in every rank's shard */
  int64_t chunk;  /* fsdp2: elements per rank (ceil(d0/W) rows; later ranks may hold fewer); else 0 */
};

/* A unit laid out for `world` ranks under a policy (the same for every rank).
 * plan holds the buffers (one for flat and fsdp2; fsdp2's has no places: its
 * tensors are per-rank chunks, see tensors[]). Owns everything. */
struct rf_plan_layout {
  enum rf_layout layout;
  struct rf_plan_unit plan;
  int n_tensors;
  struct rf_plan_layout_tensor *tensors;
  int64_t split_blocks;      /* blocks with a rank boundary strictly inside (0 for planned) */
  int64_t copy_gather_elems; /* elements one rank copies around the all-gathers of a step */
  int64_t copy_reduce_elems; /* ... around the reduce-scatter (docs/planner.md: the counting rule) */
  int64_t copy_bytes;        /* the two in the policy's dtypes */
};

/* Lays out one unit: planned runs the planner (rf_plan_policy_options) and the
 * independent checker; flat (FSDP1) and fsdp2 (FSDP2) follow the peers' rules.
 * Returns 0, or -1 with rf_error_msg() (bad input, a plan the checker refuses). */
int rf_plan_layout_make(const struct rf_plan_policy *p, int world, const struct rf_plan_unit_in *in,
                        struct rf_plan_layout *out);
void rf_plan_layout_free(struct rf_plan_layout *layout);
/* A deep copy (identical units share one layout). */
void rf_plan_layout_copy(const struct rf_plan_layout *src, struct rf_plan_layout *dst);

/* Tensor i's rank ranges as a RaggedShard (src/shard): the block kept whole is
 * the tensor's, or 1 where the layout cuts one (flat). Returns 0 or -1. */
int rf_plan_layout_tensor_shard(const struct rf_plan_layout *layout, const struct rf_plan_unit_in *in, int i,
                                struct rf_shard *out);

/* ---- a unit as the runtime lays it out (src/plan/split.c) ---- */

/* Under FP8 block (p->fp8 and some tensor of the unit marked fp8) a unit is two
 * groups, each planned into buffers of its own so that every collective moves one
 * kind: its other tensors, then its FP8 tensors (each in unit order); else one
 * group, the whole unit. src/dbuffer lays units out by it and `rfsdp plan --batch`
 * simulates them by it. Owns its arrays and layouts. */
struct rf_plan_split {
  int n_groups;
  struct rf_plan_unit_in in[2];      /* the groups (their tensors point into `tensors`) */
  struct rf_plan_layout layout[2];   /* rf_plan_layout_make of each group */
  int fp8[2];                        /* 1: the group's buffers hold FP8 codes */
  struct rf_plan_tensor_in *tensors; /* the groups' tensors, group after group */
  int *map;                          /* the unit's index of tensors[k] */
};
/* Returns 0, or -1 with rf_error_msg() (a layout that cannot be made). */
int rf_plan_split_make(const struct rf_plan_policy *p, int world, const struct rf_plan_unit_in *in,
                       struct rf_plan_split *out);
void rf_plan_split_free(struct rf_plan_split *s);

/* ---- the peers' layouts on the same unit (src/plan/peers.c) ---- */

enum rf_plan_peer {
  RF_PLAN_PEER_FSDP1 = 0, /* flat per unit, element-wise, padded to a multiple of W */
  RF_PLAN_PEER_FSDP2,     /* per tensor, dim 0 split into ceil(d0/W) rows per rank, padded */
  RF_PLAN_PEER_DEEPSPEED, /* ZeRO-3: per tensor, flat, padded to a multiple of W */
  RF_PLAN_PEER_MEGATRON,  /* Megatron-FSDP: bucket per unit padded to W * lcm(row sizes) */
  RF_PLAN_PEER_COUNT
};

/* "fsdp1", "fsdp2", "deepspeed", "megatron". */
const char *rf_plan_peer_name(enum rf_plan_peer peer);

/* A layout's numbers, summed over the units added. Elements, not bytes. */
struct rf_plan_peer_stats {
  int64_t elems;        /* real elements */
  int64_t padded_elems; /* elements stored over all ranks (and sent by an all-gather) */
  int64_t split_blocks; /* blocks with a rank boundary strictly inside */
  int64_t copy_elems;   /* elements one rank copies around the collectives in one training step
                         * (docs/planner.md: the counting rule) */
};

/* Adds one unit's numbers for `peer` at world size `world` to *acc. The unit's
 * block_elems are the blocks counted. Returns 0, or -1 when world < 1. */
int rf_plan_peer_add(enum rf_plan_peer peer, const struct rf_plan_unit_in *in, int world,
                     struct rf_plan_peer_stats *acc);

/* Blocks of the unit's tensors cut by a rank boundary of the plan, counted from
 * the plan's buffers and rank starts (independent of the planner; 0 for a valid plan). */
int64_t rf_plan_unit_split_blocks(const struct rf_plan_unit_in *in, const struct rf_plan_unit *plan);

/* Blocks of g elements in [0, e) cut by the boundaries k*S, k = 1..world-1. */
int64_t rf_plan_split_blocks_uniform(int64_t e, int64_t g, int64_t shard, int world);

/* Megatron-FSDP's bucket of a unit: each tensor's offset (a multiple of its dim-0
 * row) into offsets[n_tensors]; returns the bucket's padded size (W * lcm(rows) multiple). */
int64_t rf_plan_megatron_offsets(const struct rf_plan_unit_in *in, int world, int64_t *offsets);

/* ---- FP8 block tiles in a layout (src/plan/fp8.c) ---- */

/* A tensor with fp8 set is quantized per 128x128 tile of each sub-tensor's 2-D view
 * (rows = its leading dimensions, a row = the last dimension); partial edge tiles
 * when a size is not a multiple of 128. */
int64_t rf_plan_fp8_tiles(const struct rf_plan_tensor_in *t);
/* The block that keeps every tile of t whole on one rank: t's own block rows
 * (t->block_elems) made a multiple of 128 rows (of whole sub-tensors when a
 * sub-tensor's rows are not a multiple of 128), at most the tensor. */
int64_t rf_plan_fp8_block_elems(const struct rf_plan_tensor_in *t);
/* Tiles of t with elements on both sides of a cut: cuts are element offsets in t
 * in increasing order (those <= 0 or >= numel cut nothing). */
int64_t rf_plan_fp8_cut_tiles(const struct rf_plan_tensor_in *t, const int64_t *cuts, int n_cuts);

/* A layout's FP8 numbers, summed over the units added. */
struct rf_plan_fp8_stats {
  int64_t elems;        /* real elements */
  int64_t padded_elems; /* elements an all-gather moves (padding included) */
  int64_t q_elems;      /* elements of the quantized tensors */
  int64_t tiles;        /* their 128x128 tiles */
  int64_t cut_tiles;    /* tiles with a rank boundary inside */
};
/* Adds one unit's numbers at `world`: peer < 0 is the layout policy p runs (rfsdp),
 * else the peer's layout (enum rf_plan_peer; fsdp1 and fsdp2 are laid out by
 * rf_plan_layout_make like the runtime runs them). Rank boundaries come from each
 * tensor's RaggedShard (rf_plan_layout_tensor_shard), k * ceil(numel / W) for
 * DeepSpeed, and the bucket offsets for Megatron. Returns 0, or -1 with a message. */
int rf_plan_fp8_add(const struct rf_plan_policy *p, int peer, const struct rf_plan_unit_in *in, int world,
                    struct rf_plan_fp8_stats *acc);
/* Bytes an FP8 all-gather of that layout moves: one per quantized element and per
 * padding element, 4 per tile scale, the other tensors in `high` (--param-dtype). */
int64_t rf_plan_fp8_gather_bytes(const struct rf_plan_fp8_stats *s, enum rf_dtype high);

/* ---- a whole model (src/plan/plan_model.c) ---- */

/* Every unit of a model laid out at one world size under one policy, and
 * compared with the peers. Owns units. */
struct rf_plan_model_result {
  int world;
  enum rf_shard_mode mode;
  int n_units;
  struct rf_plan_layout
      *units; /* one per model unit (rf_plan_layout_make: planned ones passed the checker) */
  int64_t elems, padded_elems, bound_padded_elems;
  int64_t max_shard_elems; /* sum over units of the largest rank range */
  int64_t split_blocks; /* blocks cut by a rank boundary (planned: counted from the plans' rank starts, 0) */
  int64_t copy_bytes;   /* bytes one rank copies around the collectives per step */
  int n_buffers;
  int sub_padding_units; /* units where a fused tensor took padding between sub-tensors */
  double imbalance;      /* the largest unit imbalance (ragged: largest range over mean) */
  double plan_ms;        /* CPU time of planning all units (the thread's clock: the machine may be shared) */
  struct rf_plan_peer_stats peers[RF_PLAN_PEER_COUNT];
};

/* ---- advice on the shard group size (src/plan/advise.c) ---- */

/* A unit's measure against a padding limit: its padding over its elements
 * (equal), or its largest shard over the mean minus 1 (ragged). */
double rf_plan_unit_excess(const struct rf_plan_unit *p);
/* 1 when every unit's excess is at most limit (a fraction, 0.01 = 1%). */
int rf_plan_model_meets(const struct rf_plan_model_result *r, double limit);
/* 1 when the model laid out at `group` ranks meets limit, 0 when not, -1 (a
 * message) when it cannot be laid out. */
int rf_plan_group_meets(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                        int group, double limit);
/* The largest divisor of `world` (below world when `below`) whose layout meets
 * limit; 0 when none does, -1 with a message when a layout fails. */
int rf_plan_advise_group(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                         int world, int below, double limit);

/* Lays out every unit of a model (its tensor list: n_units units; src/model's
 * rf_model_desc_plan_units makes one from a description) at `world` under
 * policy p (rf_plan_layout_make) and computes the peers' layouts (skipped when
 * with_peers is 0). Returns 0, or -1 with rf_error_msg() (bad input, or a plan
 * the checker refuses). */
int rf_plan_model_make(const struct rf_plan_unit_in *units, int n_units, const struct rf_plan_policy *p,
                       int world, int with_peers, struct rf_plan_model_result *out);
void rf_plan_model_result_free(struct rf_plan_model_result *res);

#endif
