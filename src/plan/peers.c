/* The peers' layouts of one unit, computed from their published rules (see
 * docs/planner.md and ../shared/references/peers.md): padding, blocks cut by
 * rank boundaries, and elements copied around the collectives per step. Also
 * the cut-block count of an rfsdp plan, from its rank starts alone. */
#include <stdlib.h>

#include "core/core.h"
#include "plan/plan.h"

#define RF_PLAN_PEER_LCM_CAP ((int64_t)1 << 50)

const char *rf_plan_peer_name(enum rf_plan_peer peer) {
  switch (peer) {
    case RF_PLAN_PEER_FSDP1:
      return "fsdp1";
    case RF_PLAN_PEER_FSDP2:
      return "fsdp2";
    case RF_PLAN_PEER_DEEPSPEED:
      return "deepspeed";
    case RF_PLAN_PEER_MEGATRON:
      return "megatron";
    default:
      return "?";
  }
}

int64_t rf_plan_split_blocks_uniform(int64_t e, int64_t g, int64_t shard, int world) {
  if (g <= 1 || world <= 1 || e <= 1) return 0;
  RF_ASSERT(e <= (int64_t)world * shard);
  /* boundaries k*S strictly inside [0, e): k = 1..K */
  int64_t k_max = rf_min_i64(world - 1, rf_ceil_div(e, shard) - 1);
  if (k_max <= 0) return 0;
  if (shard >= g) {
    /* each boundary lies in a different block; it cuts one unless k*S is a multiple of g */
    int64_t period = g / rf_gcd_i64(shard, g);
    return k_max - k_max / period;
  }
  /* S < g: the last boundary K*S is >= e - S (e <= W*S). A block starting before
   * it holds a boundary: a full block has g-1 >= S inner positions, and the last
   * (short) block ends at e > K*S. Blocks starting at or after it hold none. */
  return rf_ceil_div(k_max * shard, g);
}

/* A run of a tensor at `off` in a flat buffer: `numel` elements whose first one
 * is element `phase` of the tensor (blocks of g count from the tensor's start). */
struct rf_plan_seg {
  int64_t off, numel, phase, g;
  int tensor;
};

/* Blocks cut by the boundaries starts[k] (or k*S when starts is NULL), k = 1..world-1,
 * over segments sorted by offset. A block cut by several boundaries counts once. */
static int64_t rf_plan_split_walk(const struct rf_plan_seg *segs, int n, const int64_t *starts, int64_t shard,
                                  int world) {
  int i = 0, last_t = -1;
  int64_t last_j = -1, cut = 0;
  for (int k = 1; k < world && i < n; k++) {
    int64_t x = starts ? starts[k] : (int64_t)k * shard;
    while (i < n && segs[i].off + segs[i].numel <= x) i++;
    if (i == n || x <= segs[i].off) continue;
    int64_t r = segs[i].phase + (x - segs[i].off);
    if (r % segs[i].g == 0) continue;
    int64_t j = r / segs[i].g;
    if (segs[i].tensor == last_t && j == last_j) continue;
    last_t = segs[i].tensor, last_j = j;
    cut++;
  }
  return cut;
}

int64_t rf_plan_unit_split_blocks(const struct rf_plan_unit_in *in, const struct rf_plan_unit *plan) {
  int64_t cut = 0;
  for (int b = 0; b < plan->n_buffers; b++) {
    const struct rf_plan_buffer *buf = &plan->buffers[b];
    int n = 0, cap = 0;
    for (int p = 0; p < buf->n_places; p++) cap += (int)buf->places[p].sub_n;
    struct rf_plan_seg *segs = rf_xmalloc((size_t)(cap > 0 ? cap : 1) * sizeof *segs);
    for (int p = 0; p < buf->n_places; p++) {
      const struct rf_plan_place *pl = &buf->places[p];
      const struct rf_plan_tensor_in *t = &in->tensors[pl->tensor];
      int64_t subs = t->sub_count > 1 ? t->sub_count : 1, sub_numel = t->numel / subs;
      if (pl->sub_stride == sub_numel) {
        segs[n++] = (struct rf_plan_seg){pl->offset, pl->sub_n * sub_numel, pl->sub_first * sub_numel,
                                         rf_min_i64(t->block_elems, t->numel), pl->tensor};
      } else {
        for (int64_t s = 0; s < pl->sub_n; s++)
          segs[n++] = (struct rf_plan_seg){pl->offset + s * pl->sub_stride, sub_numel,
                                           (pl->sub_first + s) * sub_numel,
                                           rf_min_i64(t->block_elems, t->numel), pl->tensor};
      }
    }
    cut += rf_plan_split_walk(segs, n, buf->starts, 0, plan->world);
    free(segs);
  }
  return cut;
}

/* Elements per dim-0 row: the product of shape[1:] (1 for a vector). */
static int64_t rf_plan_dim0_row(const struct rf_plan_tensor_in *t) { return t->numel / t->shape[0]; }

int64_t rf_plan_megatron_offsets(const struct rf_plan_unit_in *in, int world, int64_t *offsets) {
  /* One flat buffer: each tensor starts at a multiple of its dim-0 row and the
   * bucket is padded to W * lcm(rows). */
  int64_t p = 0, chunk = 1;
  for (int i = 0; i < in->n_tensors; i++) {
    const struct rf_plan_tensor_in *t = &in->tensors[i];
    int64_t row = rf_plan_dim0_row(t);
    p = rf_round_up(p, row);
    chunk = rf_lcm_i64_capped(chunk, row, RF_PLAN_PEER_LCM_CAP / world);
    RF_ASSERT(chunk > 0);
    offsets[i] = p;
    p += t->numel;
  }
  return rf_round_up(p, (int64_t)world * chunk);
}

int rf_plan_peer_add(enum rf_plan_peer peer, const struct rf_plan_unit_in *in, int world,
                     struct rf_plan_peer_stats *acc) {
  RF_REQUIRE(world >= 1, "peer layout: world must be >= 1 (got %d)", world);
  int64_t n_elems = 0, padded = 0, cut = 0, copy = 0;
  for (int i = 0; i < in->n_tensors; i++) n_elems += in->tensors[i].numel;
  switch (peer) {
    case RF_PLAN_PEER_FSDP1:
    case RF_PLAN_PEER_FSDP2: {
      /* The layouts the runtime runs as --layout flat and fsdp2, counted from the
       * same rf_plan_layout_make (only the layout matters here, not the dtypes). */
      struct rf_plan_policy p = {.layout = peer == RF_PLAN_PEER_FSDP1 ? RF_LAYOUT_FLAT : RF_LAYOUT_FSDP2,
                                 .param_dtype = RF_DTYPE_F32,
                                 .reduce_dtype = RF_DTYPE_F32};
      struct rf_plan_layout l;
      RF_TRY(rf_plan_layout_make(&p, world, in, &l));
      padded = l.plan.padded_elems;
      cut = l.split_blocks;
      copy = l.copy_gather_elems + l.copy_reduce_elems;
      rf_plan_layout_free(&l);
      break;
    }
    case RF_PLAN_PEER_MEGATRON: {
      struct rf_plan_seg *segs = rf_xmalloc((size_t)in->n_tensors * sizeof *segs);
      int64_t *offsets = rf_xmalloc((size_t)(in->n_tensors > 0 ? in->n_tensors : 1) * sizeof *offsets);
      padded = rf_plan_megatron_offsets(in, world, offsets);
      for (int i = 0; i < in->n_tensors; i++) {
        const struct rf_plan_tensor_in *t = &in->tensors[i];
        segs[i] = (struct rf_plan_seg){offsets[i], t->numel, 0, rf_min_i64(t->block_elems, t->numel), i};
      }
      free(offsets);
      cut = rf_plan_split_walk(segs, in->n_tensors, NULL, padded / world, world);
      /* parameters are views of the gathered bucket (no copy); the gradient is
       * copied into the main_grad bucket (no TransformerEngine fusion) */
      copy = n_elems;
      free(segs);
      break;
    }
    case RF_PLAN_PEER_DEEPSPEED:
      for (int i = 0; i < in->n_tensors; i++) {
        const struct rf_plan_tensor_in *t = &in->tensors[i];
        int64_t shard = rf_ceil_div(t->numel, world);
        padded += shard * world;
        cut += rf_plan_split_blocks_uniform(t->numel, rf_min_i64(t->block_elems, t->numel), shard, world);
      }
      /* Per all-gather (two per step): copy-out of every element into the unsharded
       * tensors (N); the `cat` copy-in of the rank's shard is the own-shard write
       * every layout makes (not a copy here). Reduce-scatter: gradients into the
       * IPG bucket (N), the interleaved padded input (padded), the reduced
       * partition into the gradient partition buffer and into the fp32 partition
       * (2 * padded/W). */
      copy = 2 * n_elems + n_elems + padded + 2 * (padded / world);
      break;
    default:
      RF_FAIL("peer layout: unknown peer %d", (int)peer);
  }
  acc->elems += n_elems;
  acc->padded_elems += padded;
  acc->split_blocks += cut;
  acc->copy_elems += copy;
  return 0;
}
