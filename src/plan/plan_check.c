/* The independent validity checker. It shares no code with the planner: it walks
 * the plan as given and tests every constraint directly. */
#include <stdlib.h>

#include "core/core.h"
#include "plan/plan.h"

/* The rank whose range holds position x of a buffer: the last r with starts[r] <= x. */
static int rf_check_rank_of(const int64_t *starts, int world, int64_t x) {
  int lo = 0, hi = world - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= x)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

/* Every rank range boundary in [pos, pos+len) must fall where the tensor's
 * logical position (logical0 at pos) is a multiple of block. A boundary at pos
 * itself counts: the element before it, if the tensor continues there, is on
 * another rank. */
static int rf_check_blocks(const struct rf_plan_buffer *buf, int world, int64_t pos, int64_t len,
                           int64_t logical0, int64_t block, const char *tname) {
  for (int r = rf_check_rank_of(buf->starts, world, pos); r < world && buf->starts[r] < pos + len; r++) {
    int64_t b = buf->starts[r];
    if (b < pos || r == 0) continue;
    int64_t logical = logical0 + (b - pos);
    RF_REQUIRE(
        logical % block == 0,
        "tensor %s: rank %d starts at element %lld of the tensor, inside a block of %lld (a cut block)",
        tname, r, (long long)logical, (long long)block);
  }
  return 0;
}

int rf_plan_unit_check(const struct rf_plan_unit_in *in, const struct rf_plan_unit *plan,
                       int64_t align_elems) {
  int world = plan->world;
  RF_REQUIRE(world >= 1, "plan: world %d", world);
  RF_REQUIRE(align_elems >= 1, "plan: alignment %lld", (long long)align_elems);
  RF_REQUIRE(plan->n_buffers >= 1 && plan->buffers, "plan: no buffers");
  int nt = in->n_tensors;
  /* seen[t]: sub-tensors of t covered so far; each must be covered exactly once. */
  int64_t *seen = rf_xcalloc((size_t)nt, sizeof *seen);
  uint8_t **sub_seen = rf_xcalloc((size_t)nt, sizeof *sub_seen);
  int rc = -1;
  int64_t padded = 0, elems = 0;
  for (int t = 0; t < nt; t++) {
    int64_t subs = in->tensors[t].sub_count > 1 ? in->tensors[t].sub_count : 1;
    sub_seen[t] = rf_xcalloc((size_t)subs, 1);
    elems += in->tensors[t].numel;
  }
  for (int bi = 0; bi < plan->n_buffers; bi++) {
    const struct rf_plan_buffer *buf = &plan->buffers[bi];
    if (!buf->starts || buf->n_places < 1 || !buf->places) {
      rf_error_set(__FILE__, __LINE__, "buffer %d: no starts or no tensors", bi);
      goto out;
    }
    if (buf->starts[0] != 0 || buf->starts[world] != buf->total_elems) {
      rf_error_set(__FILE__, __LINE__, "buffer %d: ranges do not cover [0, %lld)", bi,
                   (long long)buf->total_elems);
      goto out;
    }
    int64_t largest = 0;
    for (int r = 0; r < world; r++) {
      int64_t len = buf->starts[r + 1] - buf->starts[r];
      if (len < 0) {
        rf_error_set(__FILE__, __LINE__, "buffer %d: rank %d range ends before it starts", bi, r);
        goto out;
      }
      if (len > 0 && buf->starts[r] % align_elems != 0) {
        rf_error_set(__FILE__, __LINE__,
                     "buffer %d: rank %d starts at %lld, not a multiple of %lld (misaligned)", bi, r,
                     (long long)buf->starts[r], (long long)align_elems);
        goto out;
      }
      if (plan->mode == RF_SHARD_MODE_EQUAL && len != buf->shard_elems) {
        rf_error_set(__FILE__, __LINE__,
                     "buffer %d: rank %d holds %lld elements, not S = %lld (uneven shards)", bi, r,
                     (long long)len, (long long)buf->shard_elems);
        goto out;
      }
      largest = rf_max_i64(largest, len);
    }
    if (largest != buf->shard_elems) {
      rf_error_set(__FILE__, __LINE__, "buffer %d: shard_elems %lld is not the largest range %lld", bi,
                   (long long)buf->shard_elems, (long long)largest);
      goto out;
    }
    if (plan->mode == RF_SHARD_MODE_EQUAL && buf->shard_elems % align_elems != 0) {
      rf_error_set(__FILE__, __LINE__, "buffer %d: S = %lld is not a multiple of %lld (misaligned)", bi,
                   (long long)buf->shard_elems, (long long)align_elems);
      goto out;
    }
    padded += buf->total_elems;
    int64_t end_prev = 0;
    for (int p = 0; p < buf->n_places; p++) {
      const struct rf_plan_place *pl = &buf->places[p];
      if (pl->tensor < 0 || pl->tensor >= nt) {
        rf_error_set(__FILE__, __LINE__, "buffer %d: place %d names tensor %d of %d", bi, p, pl->tensor, nt);
        goto out;
      }
      const struct rf_plan_tensor_in *t = &in->tensors[pl->tensor];
      const char *tname = t->name ? t->name : "?";
      int64_t subs = t->sub_count > 1 ? t->sub_count : 1, sub_numel = t->numel / subs;
      if (pl->sub_n < 1 || pl->sub_first < 0 || pl->sub_first + pl->sub_n > subs ||
          pl->sub_stride < sub_numel) {
        rf_error_set(__FILE__, __LINE__, "tensor %s: bad sub-tensor range [%lld, +%lld) stride %lld", tname,
                     (long long)pl->sub_first, (long long)pl->sub_n, (long long)pl->sub_stride);
        goto out;
      }
      if (pl->offset < end_prev) {
        rf_error_set(__FILE__, __LINE__,
                     "tensor %s at %lld overlaps the previous tensor ending at %lld (overlap)", tname,
                     (long long)pl->offset, (long long)end_prev);
        goto out;
      }
      int64_t end = pl->offset + (pl->sub_n - 1) * pl->sub_stride + sub_numel;
      if (end > buf->total_elems) {
        rf_error_set(__FILE__, __LINE__, "tensor %s ends at %lld, past the buffer end %lld", tname,
                     (long long)end, (long long)buf->total_elems);
        goto out;
      }
      end_prev = end;
      for (int64_t j = 0; j < pl->sub_n; j++) {
        int64_t s = pl->sub_first + j;
        if (sub_seen[pl->tensor][s]) {
          rf_error_set(__FILE__, __LINE__, "tensor %s: sub-tensor %lld placed twice (overlap)", tname,
                       (long long)s);
          goto out;
        }
        sub_seen[pl->tensor][s] = 1;
        seen[pl->tensor]++;
        int64_t pos = pl->offset + j * pl->sub_stride;
        if (rf_check_blocks(buf, world, pos, sub_numel, s * sub_numel, t->block_elems, tname) != 0) goto out;
        /* A gap after this sub-tensor (stride, or the next place) must fall on a block boundary. */
        int gap_after =
            (j + 1 < pl->sub_n && pl->sub_stride != sub_numel) || (j + 1 == pl->sub_n && s + 1 < subs);
        if (gap_after && ((s + 1) * sub_numel) % t->block_elems != 0) {
          int contiguous = j + 1 == pl->sub_n && p + 1 < buf->n_places &&
                           buf->places[p + 1].tensor == pl->tensor && buf->places[p + 1].sub_first == s + 1 &&
                           buf->places[p + 1].offset == pos + sub_numel;
          if (!contiguous) {
            rf_error_set(__FILE__, __LINE__,
                         "tensor %s: a block spans the gap after sub-tensor %lld (a cut block)", tname,
                         (long long)s);
            goto out;
          }
        }
      }
    }
  }
  for (int t = 0; t < nt; t++) {
    int64_t subs = in->tensors[t].sub_count > 1 ? in->tensors[t].sub_count : 1;
    if (seen[t] != subs) {
      rf_error_set(__FILE__, __LINE__, "tensor %s: %lld of %lld sub-tensors placed (missing)",
                   in->tensors[t].name ? in->tensors[t].name : "?", (long long)seen[t], (long long)subs);
      goto out;
    }
  }
  if (plan->elems != elems || plan->padded_elems != padded) {
    rf_error_set(__FILE__, __LINE__,
                 "plan: elems %lld / padded %lld disagree with the tensors (%lld) / buffers (%lld)",
                 (long long)plan->elems, (long long)plan->padded_elems, (long long)elems, (long long)padded);
    goto out;
  }
  rc = 0;
out:
  for (int t = 0; t < nt; t++) free(sub_seen[t]);
  free(sub_seen);
  free(seen);
  return rc;
}
