/* rf-test: timeout=60
 * RaggedShard serially, with W simulated ranks, over every small shape (ndim 1..3,
 * dims 1..5), block sizes of one element, R rows (R = 1..d0) and the whole
 * tensor, W = 1..6 and every distribution of the blocks over the ranks (or 200
 * seeded random ones when there are more). Each simulated rank fills its local
 * piece with the global index of every element; reassembling the pieces must
 * give every index exactly once (exact cover, no overlap), every piece must be
 * block-aligned, and the boxes of every range of every shape must mark each
 * element of the range exactly once, within 2*ndim - 1 boxes. */
#include <stdlib.h>
#include <string.h>

#include "rf_test.h"
#include "shard/shard.h"

#define MAX_W 6
#define MAX_NUMEL 125

/* Reassembles the simulated ranks' pieces and checks cover, order and alignment. */
static void check_shard(const struct rf_shard *sh, const char *what) {
  int32_t global[MAX_NUMEL], local[MAX_NUMEL];
  for (int64_t i = 0; i < sh->numel; i++) global[i] = -1;
  int64_t prev_end = 0, total = 0;
  int bad = 0;
  for (int r = 0; r < sh->world; r++) {
    int64_t b, e;
    rf_shard_local_range(sh, r, &b, &e);
    bad += b != prev_end; /* rank order, no gap */
    bad += b != sh->numel && b % sh->block_elems != 0;
    bad += e != sh->numel && e % sh->block_elems != 0;
    bad += rf_shard_local_numel(sh, r) != e - b;
    prev_end = e;
    total += e - b;
    /* the rank's local buffer: values encode the global position */
    for (int64_t i = 0; i < e - b; i++) local[i] = (int32_t)(b + i);
    for (int64_t i = 0; i < e - b; i++) {
      bad += global[b + i] != -1; /* overlap */
      global[b + i] = local[i];
    }
  }
  bad += total != sh->numel || prev_end != sh->numel;
  for (int64_t i = 0; i < sh->numel; i++) bad += global[i] != i;
  int64_t sum_blocks = 0;
  for (int64_t k = 0; k < rf_shard_num_blocks(sh); k++) sum_blocks += rf_shard_block_numel(sh, k);
  bad += sum_blocks != sh->numel;
  RF_CHECK(bad == 0, "%s: numel %lld block %lld W %d: %d problems", what, (long long)sh->numel,
           (long long)sh->block_elems, sh->world, bad);
}

/* Every distribution of `blocks` over `w` ranks (compositions), or random ones. */
static void check_distributions(int64_t numel, int64_t block, int w, uint64_t *rng) {
  int64_t blocks = rf_ceil_div(numel, block);
  /* number of compositions C(blocks + w - 1, w - 1), capped */
  double ways = 1.0;
  for (int i = 1; i < w; i++) ways = ways * (double)(blocks + i) / i;
  int64_t counts[MAX_W];
  struct rf_shard sh;
  if (ways <= 200.0) {
    /* odometer over counts[0..w-2]; the last rank takes the rest */
    memset(counts, 0, sizeof counts);
    for (;;) {
      int64_t used = 0;
      for (int r = 0; r < w - 1; r++) used += counts[r];
      if (used <= blocks) {
        counts[w - 1] = blocks - used;
        RF_CHECK(rf_shard_init(&sh, numel, block, w, counts) == 0, "init: %s", rf_error_msg());
        check_shard(&sh, "exhaustive");
        rf_shard_free(&sh);
      }
      int r = 0;
      while (r < w - 1 && ++counts[r] > blocks) counts[r++] = 0;
      if (r == w - 1) break;
    }
  } else {
    for (int rep = 0; rep < 200; rep++) {
      /* cut points: w-1 sorted random positions in [0, blocks] */
      int64_t cuts[MAX_W + 1];
      cuts[0] = 0;
      cuts[w] = blocks;
      for (int r = 1; r < w; r++) cuts[r] = (int64_t)(rf_test_rand_u64(rng) % (uint64_t)(blocks + 1));
      for (int i = 1; i < w; i++)
        for (int j = i; j > 1 && cuts[j - 1] > cuts[j]; j--) {
          int64_t t = cuts[j];
          cuts[j] = cuts[j - 1];
          cuts[j - 1] = t;
        }
      for (int r = 0; r < w; r++) counts[r] = cuts[r + 1] - cuts[r];
      RF_CHECK(rf_shard_init(&sh, numel, block, w, counts) == 0, "init: %s", rf_error_msg());
      check_shard(&sh, "random");
      rf_shard_free(&sh);
    }
  }
  for (int r = 0; r < w; r++) {
    RF_CHECK(rf_shard_init_on_rank(&sh, numel, block, w, r) == 0, "init_on_rank: %s", rf_error_msg());
    check_shard(&sh, "on one rank");
    RF_CHECK(rf_shard_local_numel(&sh, r) == numel, "the whole tensor is on rank %d", r);
    rf_shard_free(&sh);
  }
}

/* Marks every element of every box; each element of [b, e) exactly once, nothing else. */
static void check_boxes(int ndim, const int64_t *shape, int64_t numel, int64_t b, int64_t e) {
  struct rf_shard_box boxes[2 * RF_MAX_DIMS];
  int n = -1;
  RF_CHECK(rf_shard_boxes(ndim, shape, b, e, boxes, rf_shard_max_boxes(ndim), &n) == 0, "boxes: %s",
           rf_error_msg());
  uint8_t mark[MAX_NUMEL] = {0};
  int bad = 0;
  int64_t prev_last = b - 1;
  for (int k = 0; k < n; k++) {
    const struct rf_shard_box *box = &boxes[k];
    int64_t cells = 1;
    for (int d = 0; d < ndim; d++) {
      bad += box->start[d] < 0 || box->extent[d] < 1 || box->start[d] + box->extent[d] > shape[d];
      cells *= box->extent[d];
    }
    if (bad) break;
    int64_t first = -1, last = -1;
    for (int64_t c = 0; c < cells; c++) {
      int64_t rem = c, flat = 0;
      int64_t idx[RF_MAX_DIMS] = {0};
      for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = box->start[d] + rem % box->extent[d];
        rem /= box->extent[d];
      }
      for (int d = 0; d < ndim; d++) flat = flat * shape[d] + idx[d];
      mark[flat]++;
      if (first < 0 || flat < first) first = flat;
      if (flat > last) last = flat;
    }
    bad += first != prev_last + 1; /* boxes in element order, each a contiguous run */
    bad += last - first + 1 != cells;
    prev_last = last;
  }
  for (int64_t i = 0; i < numel; i++) bad += mark[i] != (i >= b && i < e);
  RF_CHECK(bad == 0 && n <= rf_shard_max_boxes(ndim) && (n == 0) == (b == e),
           "boxes of [%lld, %lld) in a %d-d tensor: %d boxes, %d problems", (long long)b, (long long)e, ndim,
           n, bad);
}

/* Buffer placement: a tensor at `off` in a flat buffer with random ragged rank
 * ranges; aligned cuts give the intersections, a cut inside a block fails. */
static void check_from_buffer(uint64_t *rng) {
  int fails = 0, oks = 0;
  for (int rep = 0; rep < 20000; rep++) {
    int w = 1 + (int)(rf_test_rand_u64(rng) % MAX_W);
    int64_t block = 1 + (int64_t)(rf_test_rand_u64(rng) % 6);
    int64_t numel = (int64_t)(rf_test_rand_u64(rng) % 30);
    int64_t off = (int64_t)(rf_test_rand_u64(rng) % 8);
    int64_t len = off + numel + (int64_t)(rf_test_rand_u64(rng) % 8);
    int64_t starts[MAX_W + 1];
    starts[0] = 0;
    starts[w] = len;
    for (int r = 1; r < w; r++) {
      /* mostly block-aligned cuts relative to the tensor, sometimes anywhere */
      uint64_t u = rf_test_rand_u64(rng);
      starts[r] = (u & 3)
                      ? rf_min_i64(len, off + block * (int64_t)((u >> 8) % 8) - (int64_t)((u >> 16) % 2) * 8)
                      : (int64_t)((u >> 8) % (uint64_t)(len + 1));
      if (starts[r] < starts[r - 1]) starts[r] = starts[r - 1];
    }
    int aligned = 1;
    for (int r = 1; r < w; r++) {
      int64_t cut = starts[r] - off;
      if (cut > 0 && cut < numel && cut % block != 0) aligned = 0;
    }
    struct rf_shard sh;
    int rc = rf_shard_init_from_buffer(&sh, numel, block, off, starts, w);
    RF_CHECK((rc == 0) == aligned, "from_buffer rc %d, aligned %d", rc, aligned);
    if (rc != 0) {
      fails++;
      RF_CHECK(strstr(rf_error_msg(), "shard.c:") && strstr(rf_error_msg(), "inside block"), "message: %s",
               rf_error_msg());
      continue;
    }
    oks++;
    check_shard(&sh, "from buffer");
    for (int r = 0; r < w; r++) {
      int64_t b, e;
      rf_shard_local_range(&sh, r, &b, &e);
      int64_t lo = rf_max_i64(off, starts[r]), hi = rf_min_i64(off + numel, starts[r + 1]);
      if (hi < lo) hi = lo;
      RF_CHECK(e - b == hi - lo && (b == e || b + off == lo),
               "rank %d piece [%lld, %lld) vs buffer [%lld, %lld)", r, (long long)b, (long long)e,
               (long long)lo, (long long)hi);
      if (b < e)
        RF_CHECK(rf_shard_piece_offset(off, starts, r) == lo - starts[r], "piece offset of rank %d", r);
    }
    rf_shard_free(&sh);
  }
  RF_CHECK(fails > 100 && oks > 100, "both outcomes exercised (%d failed, %d ok)", fails, oks);
}

static void check_bad_input(void) {
  struct rf_shard sh;
  int64_t counts[2] = {1, 1};
  RF_CHECK(rf_shard_init(&sh, 10, 4, 2, counts) == -1 && strstr(rf_error_msg(), "sum to 2"),
           "wrong block sum: %s", rf_error_msg());
  RF_CHECK(rf_shard_init(&sh, 10, 0, 2, counts) == -1, "block 0 rejected");
  RF_CHECK(rf_shard_init_on_rank(&sh, 10, 5, 2, 2) == -1, "rank outside the world rejected");
  int64_t starts[3] = {0, 5, 9};
  RF_CHECK(
      rf_shard_init_from_buffer(&sh, 10, 5, 0, starts, 2) == -1 && strstr(rf_error_msg(), "past the buffer"),
      "tensor past the buffer: %s", rf_error_msg());
  struct rf_shard_box box[3];
  int n;
  int64_t shape[2] = {3, 4};
  RF_CHECK(rf_shard_boxes(2, shape, 5, 13, box, 3, &n) == -1, "range past the tensor rejected");
  RF_CHECK(rf_shard_boxes(2, shape, 1, 11, box, 2, &n) == -1 && strstr(rf_error_msg(), "capacity"),
           "too few boxes reported: %s", rf_error_msg());
}

int main(void) {
  uint64_t rng = 12345;
  int64_t shape[3];
  long shapes = 0;
  for (int ndim = 1; ndim <= 3; ndim++) {
    int combos = ndim == 1 ? 5 : ndim == 2 ? 25 : 125;
    for (int c = 0; c < combos; c++) {
      int rest = c;
      int64_t numel = 1;
      for (int d = 0; d < ndim; d++) {
        shape[d] = 1 + rest % 5;
        rest /= 5;
        numel *= shape[d];
      }
      shapes++;
      for (int64_t b = 0; b <= numel; b++)
        for (int64_t e = b; e <= numel; e++) check_boxes(ndim, shape, numel, b, e);
      /* blocks: one element, R rows for every R, the whole tensor */
      int64_t row = numel / shape[0];
      int64_t blocks[8];
      int nb = 0;
      blocks[nb++] = 1;
      for (int64_t r = 1; r <= shape[0]; r++)
        if (r * row != 1) blocks[nb++] = r * row;
      for (int i = 0; i < nb; i++)
        for (int w = 1; w <= MAX_W; w++) check_distributions(numel, blocks[i], w, &rng);
    }
  }
  /* a numel that is not a multiple of the block: the last block is shorter */
  for (int64_t numel = 0; numel <= 23; numel++)
    for (int64_t block = 1; block <= 7; block++)
      for (int w = 1; w <= 4; w++) check_distributions(numel, block, w, &rng);
  struct rf_shard sh;
  int64_t counts[2] = {2, 1};
  RF_CHECK(rf_shard_init(&sh, 10, 4, 2, counts) == 0, "init");
  RF_CHECK(rf_shard_block_numel(&sh, 2) == 2 && rf_shard_local_numel(&sh, 1) == 2, "short last block");
  rf_shard_free(&sh);
  check_from_buffer(&rng);
  check_bad_input();
  printf("%ld shapes\n", shapes);
  return rf_test_finish("test_shard");
}
