/* RaggedShard: block-aligned per-rank ranges, buffer intersections, boxes. */
#include "shard/shard.h"

#include <stdlib.h>
#include <string.h>

static int rf_shard_check_args(int64_t numel, int64_t block_elems, int world) {
  RF_REQUIRE(numel >= 0, "shard: numel %lld is negative", (long long)numel);
  RF_REQUIRE(block_elems >= 1, "shard: block_elems %lld must be at least 1", (long long)block_elems);
  RF_REQUIRE(world >= 1, "shard: world %d must be at least 1", world);
  return 0;
}

static void rf_shard_alloc(struct rf_shard *shard, int64_t numel, int64_t block_elems, int world) {
  shard->numel = numel;
  shard->block_elems = block_elems;
  shard->world = world;
  shard->first_block = rf_xmalloc((size_t)(world + 1) * sizeof *shard->first_block);
}

int rf_shard_init(struct rf_shard *shard, int64_t numel, int64_t block_elems, int world,
                  const int64_t *blocks_per_rank) {
  memset(shard, 0, sizeof *shard);
  RF_TRY(rf_shard_check_args(numel, block_elems, world));
  int64_t blocks = rf_ceil_div(numel, block_elems), sum = 0;
  for (int r = 0; r < world; r++) {
    RF_REQUIRE(blocks_per_rank[r] >= 0, "shard: rank %d has a negative block count %lld", r,
               (long long)blocks_per_rank[r]);
    sum += blocks_per_rank[r];
  }
  RF_REQUIRE(sum == blocks, "shard: block counts sum to %lld, the tensor has %lld blocks of %lld elements",
             (long long)sum, (long long)blocks, (long long)block_elems);
  rf_shard_alloc(shard, numel, block_elems, world);
  shard->first_block[0] = 0;
  for (int r = 0; r < world; r++) shard->first_block[r + 1] = shard->first_block[r] + blocks_per_rank[r];
  return 0;
}

int rf_shard_init_on_rank(struct rf_shard *shard, int64_t numel, int64_t block_elems, int world, int rank) {
  memset(shard, 0, sizeof *shard);
  RF_TRY(rf_shard_check_args(numel, block_elems, world));
  RF_REQUIRE(rank >= 0 && rank < world, "shard: rank %d outside the world of %d", rank, world);
  rf_shard_alloc(shard, numel, block_elems, world);
  int64_t blocks = rf_ceil_div(numel, block_elems);
  for (int r = 0; r <= world; r++) shard->first_block[r] = r <= rank ? 0 : blocks;
  return 0;
}

int rf_shard_buffer_cut(int64_t numel, int64_t block_elems, int64_t off, const int64_t *starts, int world) {
  for (int r = 1; r < world; r++) {
    int64_t cut = starts[r] - off;
    if (cut > 0 && cut < numel && cut % block_elems != 0) return r;
  }
  return 0;
}

int rf_shard_init_from_buffer(struct rf_shard *shard, int64_t numel, int64_t block_elems, int64_t off,
                              const int64_t *starts, int world) {
  memset(shard, 0, sizeof *shard);
  RF_TRY(rf_shard_check_args(numel, block_elems, world));
  RF_REQUIRE(off >= 0, "shard: tensor offset %lld is negative", (long long)off);
  RF_REQUIRE(starts[0] == 0, "shard: buffer starts[0] is %lld, not 0", (long long)starts[0]);
  for (int r = 0; r < world; r++)
    RF_REQUIRE(starts[r + 1] >= starts[r], "shard: buffer starts decrease at rank %d", r);
  RF_REQUIRE(off + numel <= starts[world], "shard: tensor [%lld, %lld) runs past the buffer of %lld elements",
             (long long)off, (long long)(off + numel), (long long)starts[world]);
  int64_t blocks = rf_ceil_div(numel, block_elems);
  int r = rf_shard_buffer_cut(numel, block_elems, off, starts, world);
  RF_REQUIRE(r == 0,
             "shard: the boundary of rank %d at buffer element %lld cuts the tensor at [%lld, %lld) inside "
             "block %lld (block of %lld elements)",
             r, (long long)starts[r], (long long)off, (long long)(off + numel),
             (long long)((starts[r] - off) / block_elems), (long long)block_elems);
  rf_shard_alloc(shard, numel, block_elems, world);
  for (int q = 0; q <= world; q++) {
    int64_t cut = q == world ? numel : rf_min_i64(rf_max_i64(starts[q] - off, 0), numel);
    shard->first_block[q] = cut == numel ? blocks : cut / block_elems;
  }
  return 0;
}

void rf_shard_free(struct rf_shard *shard) {
  free(shard->first_block);
  memset(shard, 0, sizeof *shard);
}

int64_t rf_shard_num_blocks(const struct rf_shard *shard) {
  return rf_ceil_div(shard->numel, shard->block_elems);
}

int64_t rf_shard_block_numel(const struct rf_shard *shard, int64_t b) {
  RF_ASSERT(b >= 0 && b < rf_shard_num_blocks(shard));
  return rf_min_i64(shard->block_elems, shard->numel - b * shard->block_elems);
}

void rf_shard_local_range(const struct rf_shard *shard, int rank, int64_t *begin, int64_t *end) {
  RF_ASSERT(rank >= 0 && rank < shard->world);
  *begin = rf_min_i64(shard->first_block[rank] * shard->block_elems, shard->numel);
  *end = rf_min_i64(shard->first_block[rank + 1] * shard->block_elems, shard->numel);
}

void rf_shard_starts(const struct rf_shard *shard, int64_t *starts) {
  for (int r = 0; r <= shard->world; r++)
    starts[r] = rf_min_i64(shard->first_block[r] * shard->block_elems, shard->numel);
}

int64_t rf_shard_local_numel(const struct rf_shard *shard, int rank) {
  int64_t b, e;
  rf_shard_local_range(shard, rank, &b, &e);
  return e - b;
}

/* ---- boxes -------------------------------------------------------------- */

/* The decomposition under construction: dims before `dim` are fixed to prefix[]. */
struct rf_shard_boxer {
  int ndim;
  const int64_t *shape;
  int64_t stride[RF_MAX_DIMS]; /* elements per index step of each dim */
  int64_t prefix[RF_MAX_DIMS];
  struct rf_shard_box *boxes;
  int cap;
  int n;
};

/* Emits the box with dims < dim fixed to the prefix, dim `dim` over [i0, i1), the rest whole. */
static int rf_shard_emit(struct rf_shard_boxer *bx, int dim, int64_t i0, int64_t i1) {
  RF_REQUIRE(bx->n < bx->cap, "shard: box capacity %d is too small", bx->cap);
  struct rf_shard_box *box = &bx->boxes[bx->n++];
  memset(box, 0, sizeof *box);
  for (int d = 0; d < bx->ndim; d++) {
    if (d < dim) {
      box->start[d] = bx->prefix[d];
      box->extent[d] = 1;
    } else if (d == dim) {
      box->start[d] = i0;
      box->extent[d] = i1 - i0;
    } else {
      box->extent[d] = bx->shape[d];
    }
  }
  return 0;
}

/* [b, e) is a non-empty range inside one index of dim-1 (the sub-tensor shape[dim:]).
 * A range that starts mid-index of `dim` takes a head (suffix of that index), full
 * indices, then a tail (prefix of the last index): suffixes and prefixes add at
 * most one box per deeper dim, hence 2*ndim - 1 in all. */
static int rf_shard_split(struct rf_shard_boxer *bx, int dim, int64_t b, int64_t e) {
  int64_t s = bx->stride[dim];
  if (dim == bx->ndim - 1 || (b % s == 0 && e % s == 0)) return rf_shard_emit(bx, dim, b / s, e / s);
  int64_t i0 = b / s, ilast = (e - 1) / s;
  if (i0 == ilast) {
    bx->prefix[dim] = i0;
    return rf_shard_split(bx, dim + 1, b - i0 * s, e - i0 * s);
  }
  int64_t full0 = i0, full1 = e / s;
  if (b % s != 0) {
    bx->prefix[dim] = i0;
    RF_TRY(rf_shard_split(bx, dim + 1, b - i0 * s, s));
    full0 = i0 + 1;
  }
  if (full1 > full0) RF_TRY(rf_shard_emit(bx, dim, full0, full1));
  if (e % s != 0) {
    bx->prefix[dim] = full1;
    RF_TRY(rf_shard_split(bx, dim + 1, 0, e - full1 * s));
  }
  return 0;
}

int rf_shard_boxes(int ndim, const int64_t *shape, int64_t begin, int64_t end, struct rf_shard_box *boxes,
                   int cap, int *n_boxes) {
  *n_boxes = 0;
  RF_REQUIRE(ndim >= 1 && ndim <= RF_MAX_DIMS, "shard: ndim %d outside 1..%d", ndim, RF_MAX_DIMS);
  struct rf_shard_boxer bx = {.ndim = ndim, .shape = shape, .boxes = boxes, .cap = cap};
  int64_t numel = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    RF_REQUIRE(shape[d] >= 0, "shard: dim %d of the shape is negative (%lld)", d, (long long)shape[d]);
    bx.stride[d] = numel;
    numel *= shape[d];
  }
  RF_REQUIRE(begin >= 0 && begin <= end && end <= numel,
             "shard: range [%lld, %lld) outside a tensor of %lld elements", (long long)begin, (long long)end,
             (long long)numel);
  if (begin == end) return 0;
  RF_TRY(rf_shard_split(&bx, 0, begin, end));
  *n_boxes = bx.n;
  return 0;
}
