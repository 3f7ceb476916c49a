/* rf-test: timeout=30
 * The validity checker on hand-made plans: a valid one passes, and each broken
 * constraint (a cut block, an overlap, uneven shards, misalignment, a missing
 * tensor, a range out of order, a block across a sub-tensor gap) is refused
 * with a message naming it. */
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"
#include "rf_test.h"

/* Unit: a [4, 4] matrix with 2-row blocks (8 elements), a vector of 6 (element
 * blocks), a fused [2, 2, 4] tensor with 2 sub-tensors of 8 and 1-row blocks. */
static struct rf_plan_tensor_in tensors[3] = {
    {"w", 2, {4, 4}, 16, 8, 1, 0},
    {"v", 1, {6}, 6, 1, 1, 0},
    {"e", 3, {2, 2, 4}, 16, 4, 2, 0},
};
static struct rf_plan_unit_in unit = {"u", 3, tensors};

static int64_t starts[6];
static struct rf_plan_place places[3];
static struct rf_plan_buffer buffer;
static struct rf_plan_unit plan;

/* A valid equal plan: W = 5, S = 8: w [0,16), e [16,32), v [32,38), padding [38,40). */
static void make_valid(void) {
  for (int r = 0; r <= 5; r++) starts[r] = 8 * r;
  places[0] = (struct rf_plan_place){0, 0, 16, 0, 1};
  places[1] = (struct rf_plan_place){2, 16, 8, 0, 2};
  places[2] = (struct rf_plan_place){1, 32, 6, 0, 1};
  buffer = (struct rf_plan_buffer){starts, 8, 40, 3, places};
  plan = (struct rf_plan_unit){5, RF_SHARD_MODE_EQUAL, 1, &buffer, 38, 40, 0, 40, 8, 1.0};
}

static void expect_fail(const char *what, const char *needle, int64_t align) {
  int rc = rf_plan_unit_check(&unit, &plan, align);
  RF_CHECK(rc == -1, "%s: accepted", what);
  RF_CHECK(strstr(rf_error_msg(), needle) != NULL, "%s: message '%s' lacks '%s'", what, rf_error_msg(),
           needle);
}

int main(void) {
  make_valid();
  RF_CHECK(rf_plan_unit_check(&unit, &plan, 8) == 0, "valid plan refused: %s", rf_error_msg());

  /* A cut block: w moved to 4 -> boundary 8 is 4 elements into w (block of 8). */
  make_valid();
  places[0].offset = 4;
  places[1].offset = 20, places[2].offset = 32;
  expect_fail("cut block", "cut block", 1);

  /* A cut block inside a fused tensor: e at 20 with blocks of 8 -> boundary 24 is 4 elements into e. */
  make_valid();
  tensors[2].block_elems = 8;
  places[1].offset = 20, places[2].offset = 36;
  buffer.total_elems = 40;
  expect_fail("cut block in fused", "cut block", 1);
  tensors[2].block_elems = 4;

  /* An overlap: v placed inside e. */
  make_valid();
  places[2].offset = 30;
  expect_fail("overlap", "overlap", 1);

  /* Uneven shards in equal mode. */
  make_valid();
  starts[3] = 26;
  expect_fail("uneven", "uneven", 1);

  /* Misalignment: S = 8 is not a multiple of 16. */
  make_valid();
  expect_fail("misaligned S", "misaligned", 16);

  /* Misaligned ragged start. */
  make_valid();
  plan.mode = RF_SHARD_MODE_RAGGED;
  starts[1] = 4; /* rank 1 starts 4 elements into w's first block */
  buffer.shard_elems = 12;
  expect_fail("ragged cut", "cut block", 1);
  starts[1] = 8, starts[2] = 20, starts[3] = 24, buffer.shard_elems = 12;
  expect_fail("ragged misaligned", "misaligned", 8);
  /* The same ragged plan is valid at alignment 4 (20 is a block start of e: 4 elements in). */
  RF_CHECK(rf_plan_unit_check(&unit, &plan, 4) == 0, "valid ragged refused: %s", rf_error_msg());

  /* Ranges out of order. */
  make_valid();
  plan.mode = RF_SHARD_MODE_RAGGED;
  starts[2] = 30, starts[3] = 24;
  expect_fail("order", "ends before", 1);

  /* A tensor missing. */
  make_valid();
  buffer.n_places = 2;
  plan.elems = 38;
  expect_fail("missing", "missing", 1);

  /* A tensor past the end of its buffer. */
  make_valid();
  places[2].offset = 36;
  expect_fail("past end", "past the buffer end", 1);

  /* Sub-padding: e (blocks of 2) split with a gap after sub-tensor 0 is valid ... */
  make_valid();
  tensors[2].block_elems = 2;
  struct rf_plan_place split[4] = {{0, 0, 16, 0, 1}, {2, 16, 8, 0, 1}, {2, 26, 8, 1, 1}, {1, 34, 6, 0, 1}};
  buffer.places = split, buffer.n_places = 4;
  RF_CHECK(rf_plan_unit_check(&unit, &plan, 1) == 0, "valid split refused: %s", rf_error_msg());
  /* ... but not when a block spans the two sub-tensors (blocks of 16). */
  tensors[2].block_elems = 16;
  expect_fail("gap in block", "gap", 1);
  tensors[2].block_elems = 2;
  /* Sub-tensor placed twice. */
  split[2].sub_first = 0;
  expect_fail("twice", "placed twice", 1);
  tensors[2].block_elems = 4;

  /* Totals that disagree. */
  make_valid();
  plan.padded_elems = 38;
  expect_fail("totals", "disagree", 1);
  return rf_test_finish("test_plan_check");
}
