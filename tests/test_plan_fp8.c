/* rf-test: timeout=60
 * FP8 block tiles in the planner (src/plan/fp8.c): the 128x128 tiles a set of rank
 * boundaries cuts, against a brute-force count (every element's rank, every tile's
 * elements compared) on random 2-D and fused 3-D tensors with partial edge tiles and
 * random cuts; the tile count; the planned layout with rf_plan_fp8_block_elems cuts no
 * tile at W = 1..9 in both shard modes while DeepSpeed's k * ceil(numel / W) cuts equal
 * the brute force; FP8 gather bytes. */
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"
#include "rf_test.h"

/* Tiles with elements of two ranks, the ranks given by sorted cuts (rank = cuts <= offset). */
static int64_t brute_cut_tiles(int64_t subs, int64_t rows, int64_t cols, const int64_t *cuts, int n_cuts,
                               int64_t *tiles) {
  int64_t numel = subs * rows * cols, cut = 0;
  int *rank = rf_xmalloc((size_t)numel * sizeof *rank);
  for (int64_t x = 0, k = 0; x < numel; x++) {
    while (k < n_cuts && cuts[k] <= x) k++;
    rank[x] = (int)k;
  }
  *tiles = 0;
  for (int64_t s = 0; s < subs; s++)
    for (int64_t r0 = 0; r0 < rows; r0 += RF_FP8_TILE)
      for (int64_t c0 = 0; c0 < cols; c0 += RF_FP8_TILE) {
        (*tiles)++;
        int first = -1, mixed = 0;
        for (int64_t r = r0; r < rows && r < r0 + RF_FP8_TILE; r++)
          for (int64_t c = c0; c < cols && c < c0 + RF_FP8_TILE; c++) {
            int k = rank[(s * rows + r) * cols + c];
            if (first < 0) first = k;
            mixed |= k != first;
          }
        cut += mixed;
      }
  free(rank);
  return cut;
}

static struct rf_plan_tensor_in tensor(const char *name, int64_t subs, int64_t rows, int64_t cols) {
  struct rf_plan_tensor_in t;
  memset(&t, 0, sizeof t);
  t.name = name;
  t.ndim = subs > 1 ? 3 : 2;
  if (subs > 1) {
    t.shape[0] = subs, t.shape[1] = rows, t.shape[2] = cols;
  } else {
    t.shape[0] = rows, t.shape[1] = cols;
  }
  t.numel = subs * rows * cols;
  t.block_elems = cols;
  t.sub_count = subs;
  t.fp8 = 1;
  return t;
}

static void test_brute(void) {
  uint64_t rng = 16;
  for (int c = 0; c < 60; c++) {
    int64_t subs = c % 3 == 0 ? 1 + (int64_t)(rf_test_rand_u64(&rng) % 3) : 1;
    int64_t rows = 1 + (int64_t)(rf_test_rand_u64(&rng) % 300),
            cols = 1 + (int64_t)(rf_test_rand_u64(&rng) % 300);
    struct rf_plan_tensor_in t = tensor("t", subs, rows, cols);
    int world = 1 + (int)(rf_test_rand_u64(&rng) % 12);
    int64_t cuts[16];
    rf_test_random_cuts(t.numel, world, rf_test_rand_u64(&rng), cuts);
    if (c % 5 == 0) /* cuts on row and band boundaries too */
      for (int k = 1; k < world; k++) cuts[k] = rf_min_i64(t.numel, (cuts[k] / cols) * cols);
    int64_t tiles, want = brute_cut_tiles(subs, rows, cols, cuts + 1, world - 1, &tiles);
    int64_t got = rf_plan_fp8_cut_tiles(&t, cuts + 1, world - 1);
    RF_CHECK(got == want, "case %d: [%lld x %lld x %lld] W=%d: %lld tiles cut, brute force %lld", c,
             (long long)subs, (long long)rows, (long long)cols, world, (long long)got, (long long)want);
    RF_CHECK(rf_plan_fp8_tiles(&t) == tiles, "case %d: %lld tiles, brute force %lld", c,
             (long long)rf_plan_fp8_tiles(&t), (long long)tiles);
  }
}

static void test_layouts(void) {
  /* a unit: two matrices with partial tiles, fused experts whose rows are not a multiple of
   * 128 (whole experts per block) and experts whose rows are, and an unquantized vector */
  struct rf_plan_tensor_in ts[5] = {tensor("q", 1, 300, 200), tensor("e", 3, 200, 136),
                                    tensor("o", 1, 256, 130), tensor("x", 2, 256, 100),
                                    tensor("norm", 1, 1, 300)};
  ts[4].ndim = 1, ts[4].shape[0] = 300, ts[4].fp8 = 0, ts[4].block_elems = 1;
  for (int i = 0; i < 4; i++) ts[i].block_elems = rf_plan_fp8_block_elems(&ts[i]);
  RF_CHECK(ts[0].block_elems == 128 * 200 && ts[1].block_elems == 200 * 136 && ts[3].block_elems == 128 * 100,
           "fp8 blocks: %lld, %lld, %lld", (long long)ts[0].block_elems, (long long)ts[1].block_elems,
           (long long)ts[3].block_elems);
  struct rf_plan_unit_in u = {"layer", 5, ts};
  for (int mode = 0; mode < 2; mode++)
    for (int world = 1; world <= 9; world++) {
      struct rf_plan_policy p = {.layout = RF_LAYOUT_PLANNED,
                                 .shard = mode ? RF_SHARD_MODE_RAGGED : RF_SHARD_MODE_EQUAL,
                                 .max_buffers = 2,
                                 .align_bytes = 64,
                                 .param_dtype = RF_DTYPE_F32,
                                 .reduce_dtype = RF_DTYPE_F32,
                                 .block_rows = 1,
                                 .vector_block = 1,
                                 .fp8 = 1};
      struct rf_plan_fp8_stats s = {0}, ds = {0};
      RF_CHECK(rf_plan_fp8_add(&p, -1, &u, world, &s) == 0, "planned W=%d: %s", world, rf_error_msg());
      RF_CHECK(s.cut_tiles == 0, "planned (%s) W=%d: %lld tiles cut", mode ? "ragged" : "equal", world,
               (long long)s.cut_tiles);
      RF_CHECK(
          s.q_elems == 300 * 200 + 3 * 200 * 136 + 256 * 130 + 2 * 256 * 100 && s.tiles == 6 + 12 + 4 + 4,
          "quantized %lld elements in %lld tiles", (long long)s.q_elems, (long long)s.tiles);
      if (mode) RF_CHECK(s.padded_elems == s.elems, "ragged W=%d: padding", world);
      /* FP8 bytes: 1 per quantized or padding element, 4 per scale, f32 for the vector */
      RF_CHECK(rf_plan_fp8_gather_bytes(&s, RF_DTYPE_F32) == s.padded_elems - 300 + 4 * 26 + 300 * 4,
               "fp8 gather bytes");
      RF_CHECK(rf_plan_fp8_add(&p, RF_PLAN_PEER_DEEPSPEED, &u, world, &ds) == 0, "deepspeed: %s",
               rf_error_msg());
      int64_t want = 0;
      for (int i = 0; i < 4; i++) {
        int64_t cuts[16], shard = rf_ceil_div(ts[i].numel, world), tiles;
        for (int k = 1; k < world; k++) cuts[k - 1] = k * shard;
        int64_t subs = ts[i].sub_count > 1 ? ts[i].sub_count : 1;
        want += brute_cut_tiles(subs, ts[i].numel / subs / ts[i].shape[ts[i].ndim - 1],
                                ts[i].shape[ts[i].ndim - 1], cuts, world - 1, &tiles);
      }
      RF_CHECK(ds.cut_tiles == want, "deepspeed W=%d: %lld tiles cut, brute force %lld", world,
               (long long)ds.cut_tiles, (long long)want);
      for (int peer = 0; peer < RF_PLAN_PEER_COUNT; peer++) {
        struct rf_plan_fp8_stats x = {0};
        RF_CHECK(rf_plan_fp8_add(&p, peer, &u, world, &x) == 0, "%s: %s", rf_plan_peer_name(peer),
                 rf_error_msg());
        RF_CHECK(world > 1 || x.cut_tiles == 0, "%s at W=1 cuts tiles", rf_plan_peer_name(peer));
      }
    }
}

int main(void) {
  test_brute();
  test_layouts();
  return rf_test_finish("test_plan_fp8");
}
