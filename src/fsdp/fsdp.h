/* src/fsdp: the runtime behind include/rfsdp.h: declarations, finalize (plans,
 * slabs, arena slots), the schedule (gather, prefetch, reshard, reduce),
 * gradient norm and clipping, deterministic initialization.
 *
 * Slots. The arena holds `n_pslots` param slots and `n_gslots` grad slots, each
 * sized for the largest unit, carved once at finalize. A unit holds a param slot
 * from the start of its gather until it is resharded, and a grad slot from
 * backward_begin until its reduce-scatter has finished. Param slots: prefetch + 1
 * when resharding after forward (the unit in use and the ones prefetched), else
 * one per unit. Grad slots: 2 (one being written by the backward, one reducing). */
#ifndef RF_FSDP_H
#define RF_FSDP_H

#include "comm/comm.h"
#include "core/core.h"
#include "dbuffer/dbuffer.h"
#include "device/device.h"
#include "rfsdp.h"

#define RF_FSDP_NAME_MAX 128

struct rf_shard_plan; /* backend/backend.h */

/* A declared tensor. */
struct rf_fsdp_tensor {
  char name[RF_FSDP_NAME_MAX];
  int unit;
  int index_in_unit;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel;
  int64_t block_elems;
  int fp8; /* rf_fsdp_set_fp8 under opt.fp8 */
  struct rf_init init;
};

/* Where a unit is in the step: SHARDED (no slot), GATHERING (its gathers started,
 * their events not yet waited on), READY (the compute stream waited on every gather
 * event: the parameters may be read). */
enum rf_fsdp_unit_state {
  RF_FSDP_UNIT_STATE_SHARDED = 0,
  RF_FSDP_UNIT_STATE_GATHERING,
  RF_FSDP_UNIT_STATE_READY
};

/* A declared unit and its runtime state. Owns db and the request arrays. */
struct rf_fsdp_unit {
  char name[RF_FSDP_NAME_MAX];
  int first_tensor, n_tensors;
  struct rf_dbuffer db;
  int64_t shard_base; /* elements: the unit's shard in the rank's slab */
  enum rf_fsdp_unit_state state;
  int pslot;    /* param slot held, or -1 */
  int gslot;    /* grad slot held, or -1 */
  int reducing; /* a reduce-scatter is in flight from gslot */
  int reduce_accumulate;
  int has_grad;                    /* the shard holds gradients since zero_grad */
  uint64_t trace_t0;               /* the timeline: when its forward or backward compute began (0: off) */
  struct rf_comm_req *gather_reqs; /* db.n_gather_reqs */
  struct rf_comm_req *reduce_reqs; /* db.n_buffers */
  /* One event per request, reached when it has finished (rf_comm_event_record): the
   * schedule waits on these, never on the requests (MPI: each is its request). */
  struct rf_device_event *gathered; /* db.n_gather_reqs, owned */
  struct rf_device_event *reduced;  /* db.n_buffers, owned */
  int reduce_last;                  /* the reduce-scatter in flight is of the step's last micro-batch */
  int across;                       /* HSDP: across_req (the shard's all-reduce across replicas) in flight */
  struct rf_comm_req *across_req;   /* one */
  struct rf_device_event *across_done;   /* one, owned: reached when across_req has finished */
  struct rf_device_event across_written; /* reached when the shard the all-reduce sends is written */
};

/* The context. Owns everything: the mesh, the declarations, the slabs, the arena
 * and its slots. */
enum rf_fsdp_stream {
  RF_FSDP_STREAM_COMPUTE = 0,
  RF_FSDP_STREAM_GATHER,
  RF_FSDP_STREAM_REDUCE,
  RF_FSDP_STREAM_REPLICATE,
  RF_FSDP_STREAM_COUNT,
};

struct rf_fsdp {
  struct rf_fsdp_options opt;
  struct rf_comm_mesh mesh; /* gathers, reduce-scatters and the norm run on mesh.shard; the
                              gradient all-reduce of HSDP on mesh.replicate */
  /* views of mesh.shard and mesh.replicate on the context's device (rf_comm_on_device, borrowed: never
   * freed): the collectives whose buffers are device memory (the DBuffer's gathers and reduce-scatters,
   * HSDP's all-reduce) run on these; host values (the norm, votes) on the mesh itself */
  struct rf_comm_mesh dmesh;
  struct rf_plan_policy policy; /* opt as the planner takes it: every unit's layout comes from it */
  int finalized;
  int n_units, cap_units;
  struct rf_fsdp_unit *units;
  int n_tensors, cap_tensors;
  struct rf_fsdp_tensor *tensors;
  int64_t shard_elems;
  struct rf_tensor_view *views; /* owned: n_tensors, built at finalize (rf_fsdp_views) */
  float *master;                /* owned slab, shard_elems */
  float *grad;                  /* owned slab, shard_elems */
  void
      *grad_across; /* owned, shard_elems bf16: HSDP's replica all-reduce with reduce_dtype bf16, else NULL */
  double *sumsq;    /* owned, two f64 of device memory: the gradient norm's sum of squares (grads.c) */
  float *gscale;    /* in sumsq's allocation (sumsq + 1): the clip factor on the device (grads.c) */
  /* owned, n_units: each unit's gradient pieces (offsets into grad) for the backend's
   * shard_sum_squares_add, one launch per unit (grads.c); NULL where the backend has none (a
   * launch per piece) */
  struct rf_shard_plan *norm_plans;
  /* the norm's all-reduce on the device over dmesh.shard (W > 1): after `norm_written` on compute */
  struct rf_comm_req *norm_req;
  struct rf_device_event *norm_done, norm_written;
  struct rf_device *device; /* owned: where the slabs and slots live; moves, quantizes, norms (host today) */
  /* owned: the runtime's streams, named (FSDP2's comm context): compute (the model, the optimizer,
   * the gradients' scaling and norm, every gather's and reduce's finish), gather (the own-shard
   * writes before an all-gather), reduce (the staging before a reduce-scatter), replicate (HSDP's
   * rounding before the all-reduce across replicas). `mark` is recorded on compute before gather,
   * reduce or replicate work starts, and they wait on it: what they read or overwrite the compute
   * stream wrote or still reads. */
  struct rf_device_stream *stream[RF_FSDP_STREAM_COUNT];
  struct rf_device_event mark;
  struct rf_arena arena;
  int n_pslots, n_gslots;
  void **pslots; /* borrowed views into the arena */
  void **gslots;
  int *pslot_unit; /* unit holding each slot, or -1 */
  int *gslot_unit;
  size_t pslot_bytes, gslot_bytes;
  int64_t slots_in_use_peak_bytes;
  struct rf_counters counters;      /* this context's: its device, moves and mesh's collectives count here */
  struct rf_counters at_create;     /* rf_fsdp_counters_now when created */
  struct rf_counters at_step_begin; /* ... at the last rf_fsdp_zero_grad */
  struct rf_counters last_step;     /* between the last two rf_fsdp_zero_grad */
  int steps_begun;
  int grads_across; /* HSDP: the shard was all-reduced across replicas since rf_fsdp_zero_grad */
  int last_micro;   /* rf_fsdp_set_last_micro_batch since rf_fsdp_zero_grad */
  int failed;       /* a gather failed (rf_fsdp_status): fail_msg says why */
  char fail_msg[512];
  int holders;      /* async savers that borrow the context (rf_fsdp_hold) */
  int free_pending; /* rf_fsdp_free came while held: the last rf_fsdp_unhold frees */
};

/* A context on `mesh`, whatever its backend: the entry points of one backend
 * (fsdp_mpi.c: rf_fsdp_create, include/rfsdp_mpi.h) build the mesh and call this. Takes the mesh (it
 * is freed on failure, and *mesh is cleared on success). */
int rf_fsdp_create_on(struct rf_fsdp **out, struct rf_comm_mesh *mesh, const struct rf_fsdp_options *opt);

/* The planning policy of these options (rfsdp plan lays units out with it too). */
void rf_fsdp_plan_policy(const struct rf_fsdp_options *o, struct rf_plan_policy *out);

/* An async saver holds the context it borrows: rf_fsdp_free while it is held only
 * marks it, and the last rf_fsdp_unhold frees it (its writer thread reads the shard). */
void rf_fsdp_hold(struct rf_fsdp *f);
void rf_fsdp_unhold(struct rf_fsdp *f);
/* The name of a unit whose gradients are not finished (a backward begun and not
 * ended, or a reduce-scatter not waited for by rf_fsdp_grads_finish), or NULL. */
const char *rf_fsdp_grads_unfinished(const struct rf_fsdp *f);

/* Within the module. */
/* The context's counters now, with the process's heap allocations added to its
 * device's (the heap is shared: a step's heap allocations are the process's). */
struct rf_counters rf_fsdp_counters_now(const struct rf_fsdp *f);
void rf_fsdp_init_params(struct rf_fsdp *f);
/* The global gradient norm left on the device (grads.c), on the compute stream: f->sumsq = the shard
 * group's sum of squares (the pieces' sums added on the device as rf_fsdp_grad_norm adds them, then
 * all-reduced over dmesh.shard when the group has more than one rank) and *f->gscale = its clip
 * factor for max_norm (rf_device_clip_factor: NaN when the norm is not finite, 1 when not clipped).
 * Nothing comes back to the host: no wait, but on MPI the all-reduce's wait for the compute stream. */
void rf_fsdp_grad_norm_on_device(struct rf_fsdp *f, double max_norm);
int64_t rf_fsdp_slots_in_use_bytes(const struct rf_fsdp *f);
/* f->norm_plans at finalize where the device's backend has shard kernels (grads.c), and their
 * release. */
void rf_fsdp_norm_plans_make(struct rf_fsdp *f);
void rf_fsdp_norm_plans_free(struct rf_fsdp *f);

#endif
