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
 * See docs/planner.md. */
#ifndef RF_PLAN_H
#define RF_PLAN_H

#include <stdint.h>

#include "rfsdp.h" /* enum rf_shard_mode */

#define RF_PLAN_MAX_DIMS 8

/* One tensor of a unit as the model declares it. Borrowed strings. */
struct rf_plan_tensor_in {
  const char *name;
  int ndim;
  int64_t shape[RF_PLAN_MAX_DIMS];
  int64_t numel; /* product of shape */
  int64_t
      block_elems;   /* elements of one block (whole rows times row length); the last block may be shorter */
  int64_t sub_count; /* > 1: a fused tensor of sub_count equal sub-tensors along dim 0 (MoE experts) */
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
  int allow_sub_padding;    /* fused tensors may take padding between sub-tensors */
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

#endif
