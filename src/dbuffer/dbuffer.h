/* src/dbuffer: DBuffer, the storage of one unit on one rank, and the in-place
 * gather and reduce over it.
 *
 * A unit's tensors live in one or more flat buffers (one collective each). Rank r
 * owns the range [starts[r], starts[r+1]) of each buffer; its ranges of all the
 * unit's buffers are consecutive (64-byte aligned) pieces of the rank's shard slab
 * (master weights f32, gradients f32, optimizer state: the same offsets). The
 * unsharded buffers live in slots that the runtime carves from its arena once:
 *   param slot: the buffers at slot_off (param dtype); fsdp2: the staging buffer,
 *               then each tensor's own storage (the copy-out target)
 *   grad slot:  the buffers at slot_off (f32), the backward writes into views;
 *               then, when the reduce dtype is bf16 or the layout copies, a
 *               staging buffer in the reduce dtype; then the receive scratch
 * Three layouts (enum rf_layout): planned (the planner's buffers, tensors at their
 * offsets: no copy around any collective), flat (FSDP1: tensors back to back,
 * padded at the end to a multiple of W), fsdp2 (per tensor ceil(d0/W) rows per
 * rank; all-gather into staging then copy out; copy in before the reduce).
 *
 * FP8 block mode (policy->fp8), planned layout: the unit's FP8 tensors and its
 * other tensors are planned as two groups, so every buffer holds one kind. An FP8
 * buffer is gathered as e4m3 codes (1 byte per element): each rank quantizes its
 * own range of every FP8 tensor (whole bands of 128 rows of a matrix or of one expert's
 * matrix, whose last band may be shorter: whole 128x128 tiles)
 * straight into its range of the param slot, and each FP8 tensor's tile scales
 * (f32, row-major over the tiles, after the buffers in the param slot) are
 * gathered in place by one all-gather-v (rank r's bands are consecutive tiles).
 * fsdp2 and flat layouts (their rank boundaries cut 128x128 tiles): what the peers
 * do, the FP8 tensors are gathered in the param dtype like the others, then every
 * rank quantizes each whole FP8 tensor from its gathered view into codes and
 * scales of its own after the slot's other contents (and, with a bf16 param
 * dtype, through an f32 scratch of one 128-row band). Either way the codes and
 * scales are those of quantizing the whole tensor. Gradients are f32 in every
 * buffer, as without FP8. */
#ifndef RF_DBUFFER_H
#define RF_DBUFFER_H

#include <stdint.h>

#include "comm/comm.h"
#include "core/core.h"
#include "device/device.h"
#include "plan/plan.h"

/* Where one tensor lives. Owns starts and piece. */
struct rf_dbuffer_tensor {
  int buffer; /* index of its buffer */
  int64_t numel;
  int64_t block_elems;
  int blocks_whole;  /* every rank's range is a whole number of blocks */
  int64_t *starts;   /* world + 1: rank r holds elements [starts[r], starts[r+1]) (from its rf_shard) */
  int64_t *piece;    /* world: where rank r's elements begin in the buffer */
  int64_t view_off;  /* elements: the whole tensor's view in the param slot */
  int64_t gview_off; /* elements: the whole tensor's view in the grad slot (f32) */
  int64_t shard_off; /* elements: this rank's piece in the unit's shard (add the unit's base) */
  int64_t view_byte; /* bytes: the whole tensor's view in the param slot (its buffer's dtype) */
  /* FP8 tensors: `experts` matrices [rows, cols] (1 for a matrix; fused experts [E, rows,
   * cols]: E), each in its own 128x128 tiles (`tiles` in all); the codes' and the tile
   * scales' places in the param slot (bytes; planned: the codes are the view; scales
   * expert-major, row-major over each expert's tiles) and, planned only, world + 1
   * offsets (in scales) of every rank's tiles */
  int fp8;
  const char *name; /* borrowed from the caller's tensors (for messages) */
  int64_t experts, rows, cols, tiles;
  int64_t code_byte;
  int64_t scale_byte;
  int64_t *scale_starts;
};

/* One collective. Owns starts. */
struct rf_dbuffer_buf {
  int64_t *starts;   /* world + 1 element offsets of the rank ranges */
  int64_t total;     /* starts[world] */
  int64_t equal;     /* > 0: every range holds this many (MPI_Allgather); 0: ragged (MPI_Allgatherv) */
  int64_t slot_off;  /* elements: the buffer's place in the param and grad slots */
  int64_t shard_off; /* elements: this rank's range in the unit's shard */
  int64_t pad_other; /* padding elements outside this rank's range (moved by the collectives) */
  int fp8;           /* holds FP8 tensors only: gathered as e4m3 codes */
  int64_t slot_byte; /* bytes: the buffer's place in the param slot */
};

/* A unit's DBuffer on one rank. Owns its arrays. */
struct rf_dbuffer {
  enum rf_layout layout;
  int world, rank;
  struct rf_device *dev;           /* borrowed: where the slots live, what moves and quantizes and counts */
  struct rf_device_event *written; /* owned: reached when the writes a gather or reduce sends are done */
  int n_buffers;
  struct rf_dbuffer_buf *bufs;
  int n_tensors;
  struct rf_dbuffer_tensor *tensors;
  int64_t elems;           /* sum of numel */
  int64_t padded_elems;    /* sum of the buffers' totals */
  int64_t shard_elems;     /* this rank's shard (aligned pieces of every buffer) */
  int64_t slot_elems;      /* param slot elements (buffers; fsdp2: staging + tensor storage) */
  int64_t gview_elems;     /* f32 elements of the grad slot that the backward writes */
  int64_t staging_elems;   /* grad slot: elements of the reduce-dtype staging buffer (0: none needed) */
  int64_t max_shard_elems; /* the layout's: sum over buffers of the largest rank range */
  int64_t split_blocks;    /* the layout's: blocks cut by a rank boundary */
  int64_t copy_bytes;      /* the layout's: bytes copied around the collectives per step (counting rule) */
  int n_fp8;               /* FP8 tensors (planned: one scales all-gather-v each, after the buffers') */
  int fp8_after;           /* fsdp2, flat: the FP8 tensors are quantized after a param-dtype gather */
  int64_t band_byte;       /* fp8_after with a bf16 param dtype: the f32 band scratch in the param slot */
  int n_gather_reqs;       /* n_buffers, + n_fp8 when the scales are gathered */
  size_t slot_bytes;       /* the param slot in the policy's param dtype (FP8 buffers: 1 byte each) */
  /* FP8 (n_fp8 > 0), host memory, owned: NaN scales for one band (the most tiles of a band of any FP8
   * tensor), copied onto a band that cannot be quantized; the most tiles of any FP8 tensor, where its
   * gathered scales are read back (an explicit copy: the host never reads device memory) */
  float *host_nans;
  float *host_scales;
};

/* Builds a unit's DBuffer on `rank` from the layout the policy gives
 * (rf_plan_layout_make: the same layout `rfsdp plan` counts); the tensors as the
 * planner takes them (sub_count must be 0 or 1: every tensor stays one run).
 * Returns -1 with a message when the planner fails or a plan does not pass the
 * independent checker. */
int rf_dbuffer_init(struct rf_dbuffer *db, const char *unit_name, const struct rf_plan_tensor_in *tensors,
                    int n_tensors, int world, int rank, const struct rf_plan_policy *policy,
                    struct rf_device *dev);
void rf_dbuffer_free(struct rf_dbuffer *db);

/* Bytes of a param slot (the policy's param dtype) / grad slot (this reduce dtype). */
size_t rf_dbuffer_param_slot_bytes(const struct rf_dbuffer *db);
size_t rf_dbuffer_grad_slot_bytes(const struct rf_dbuffer *db, enum rf_dtype reduce_dtype);

/* Gather: casts the master shard (f32, `shard` = the unit's base in the slab) into
 * this rank's ranges of the slot (FP8 buffers: quantizes it, power-of-two scales
 * when pow2), then starts one in-place all-gather per buffer and one per FP8
 * tensor's scales (reqs: n_gather_reqs requests). A tile holding NaN or an
 * infinity gets the scale NaN, which every rank receives. finish retires the
 * requests (rf_comm_retire: `stream` has waited for their events) and, in
 * the fsdp2 layout, copies the staging buffer out into each tensor's storage;
 * with fp8_after it then quantizes every FP8 tensor's gathered view (a band with
 * NaN or an infinity: NaN scales; every rank holds the same gathered values). It
 * returns -1 with a message naming the tensor and its rows when a scale is NaN
 * (the same on every rank: the scales are the same everywhere), else 0. */
void rf_dbuffer_gather_start(const struct rf_dbuffer *db, const struct rf_comm *comm, const float *shard,
                             void *slot, enum rf_dtype param_dtype, int pow2, struct rf_comm_req *reqs,
                             struct rf_device_stream *stream);
int rf_dbuffer_gather_finish(const struct rf_dbuffer *db, void *slot, enum rf_dtype param_dtype, int pow2,
                             struct rf_comm_req *reqs, struct rf_device_stream *stream);

/* `stream`: where each function queues its device work (the runtime's: start on the gather or the
 * reduce stream, which waited for the compute stream's writes; finish on the compute stream, which
 * waited for the collectives' events).
 *
 * Reduce: starts one reduce-scatter per buffer from the grad slot (the backward
 * wrote f32 gradients into its views; padding is zero). With f32 and no
 * accumulation the result lands straight in `grad_shard`; otherwise in the slot's
 * receive scratch, and finish converts and adds (accumulate) or stores it. */
void rf_dbuffer_reduce_start(const struct rf_dbuffer *db, const struct rf_comm *comm, void *gslot,
                             float *grad_shard, enum rf_dtype reduce_dtype, int accumulate,
                             struct rf_comm_req *reqs, struct rf_device_stream *stream);
void rf_dbuffer_reduce_finish(const struct rf_dbuffer *db, void *gslot, float *grad_shard,
                              enum rf_dtype reduce_dtype, int accumulate, struct rf_comm_req *reqs,
                              struct rf_device_stream *stream);

#endif
