/* src/shard: RaggedShard, the placement of one tensor over W ranks.
 *
 * A tensor of `numel` elements (row-major) is cut into blocks of `block_elems`
 * elements (the last block may be shorter). Rank r owns the blocks
 * [first_block[r], first_block[r+1]), i.e. one contiguous, block-aligned element
 * range; ranges are in rank order, may differ in size and may be empty. "Whole
 * tensor on one rank" is the case with one non-zero count.
 *
 * Also: the placement of a tensor stored at an offset of a flat buffer split
 * between ranks, and the decomposition of an element range of an N-d tensor into
 * rectangular boxes (checkpoint metadata). */
#ifndef RF_SHARD_H
#define RF_SHARD_H

#include <stdint.h>

#include "core/core.h"

/* Owns `first_block` (world + 1 entries, first_block[0] = 0,
 * first_block[world] = the number of blocks). */
struct rf_shard {
  int64_t numel;
  int64_t block_elems;
  int world;
  int64_t *first_block;
};

/* From per-rank block counts (zeros allowed); they must sum to the number of
 * blocks. Returns -1 with a message on bad input. */
int rf_shard_init(struct rf_shard *shard, int64_t numel, int64_t block_elems, int world,
                  const int64_t *blocks_per_rank);
/* The whole tensor on `rank`. */
int rf_shard_init_on_rank(struct rf_shard *shard, int64_t numel, int64_t block_elems, int world, int rank);
/* The tensor occupies [off, off + numel) of a flat buffer whose rank r owns
 * [starts[r], starts[r+1]) (world + 1 entries, non-decreasing; the buffer may be
 * longer than the tensor). Rank r's piece is the intersection. Fails when a cut
 * falls inside a block. */
int rf_shard_init_from_buffer(struct rf_shard *shard, int64_t numel, int64_t block_elems, int64_t off,
                              const int64_t *starts, int world);
void rf_shard_free(struct rf_shard *shard);
/* The first rank r in 1..world-1 whose buffer boundary starts[r] falls strictly
 * inside a block of the tensor at [off, off + numel); 0 when none does. */
int rf_shard_buffer_cut(int64_t numel, int64_t block_elems, int64_t off, const int64_t *starts, int world);

/* ceil(numel / block_elems). */
int64_t rf_shard_num_blocks(const struct rf_shard *shard);
/* Elements of block b: block_elems, or fewer for the last block. */
int64_t rf_shard_block_numel(const struct rf_shard *shard, int64_t b);
/* Rank r's element range [*begin, *end) of the tensor (empty: begin == end). */
void rf_shard_local_range(const struct rf_shard *shard, int rank, int64_t *begin, int64_t *end);
int64_t rf_shard_local_numel(const struct rf_shard *shard, int rank);
/* Every rank's range as element offsets: rank r holds [starts[r], starts[r+1])
 * (world + 1 entries). */
void rf_shard_starts(const struct rf_shard *shard, int64_t *starts);

/* Where rank r's piece of a tensor stored at `off` begins inside r's part of the
 * flat buffer [starts[r], starts[r+1]) (meaningful when the piece is non-empty). */
static inline int64_t rf_shard_piece_offset(int64_t off, const int64_t *starts, int rank) {
  return (off > starts[rank] ? off : starts[rank]) - starts[rank];
}

/* ---- boxes -------------------------------------------------------------- */

/* A rectangle of an N-d tensor: indices [start[d], start[d] + extent[d]) in each dim. */
struct rf_shard_box {
  int64_t start[RF_MAX_DIMS];
  int64_t extent[RF_MAX_DIMS];
};

/* The most boxes a range of an ndim-d tensor splits into: 2*ndim - 1. */
static inline int rf_shard_max_boxes(int ndim) { return 2 * ndim - 1; }

/* Splits the row-major element range [begin, end) of a tensor of `shape` into at
 * most rf_shard_max_boxes(ndim) boxes, in element order, written to `boxes`
 * (capacity `cap`); *n_boxes gets the count (0 for an empty range). Returns -1
 * with a message on a bad shape or range. */
int rf_shard_boxes(int ndim, const int64_t *shape, int64_t begin, int64_t end, struct rf_shard_box *boxes,
                   int cap, int *n_boxes);

#endif
