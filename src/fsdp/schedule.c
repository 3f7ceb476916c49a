/* The step: gather with prefetch, reshard, reduce, in the same order on every
 * rank (non-blocking collectives on one communicator must be started in the same
 * order everywhere, and the schedule depends only on the unit sequence).
 *
 * Events. Each started collective gets an event (rf_comm_event_record) and the
 * schedule waits on those: the compute stream (f->stream[RF_FSDP_STREAM_COMPUTE]) waits on a
 * unit's gather events before the unit is READY, and on its reduce events before the
 * gradient slot is reused; polling queries them. On MPI an event is its request, so
 * waiting is rf_comm_wait and a query is rf_comm_test (what drives MPI's progress);
 * a device backend's events let its streams wait without the host. */
#include <stdio.h>
#include <string.h>

#include "core/trace.h"
#include "fsdp/fsdp.h"

static void rf_fsdp_note_peak(struct rf_fsdp *f) {
  int64_t bytes = rf_fsdp_slots_in_use_bytes(f);
  if (bytes > f->slots_in_use_peak_bytes) f->slots_in_use_peak_bytes = bytes;
}

/* Work about to be queued on stream s runs after everything queued on compute so far (what it
 * reads, the compute stream wrote; what it overwrites, the compute stream may still read). */
static struct rf_device_stream *rf_fsdp_after_compute(struct rf_fsdp *f, enum rf_fsdp_stream s) {
  rf_device_event_record(f->device, &f->mark, f->stream[RF_FSDP_STREAM_COMPUTE]);
  rf_device_stream_wait(f->device, f->stream[s], &f->mark);
  return f->stream[s];
}

static int rf_fsdp_free_slot(const int *owners, int n) {
  for (int s = 0; s < n; s++)
    if (owners[s] < 0) return s;
  return -1;
}

/* Starts the gather of unit u into a free param slot; 0 when none is free. */
static int rf_fsdp_gather_start(struct rf_fsdp *f, int u) {
  struct rf_fsdp_unit *x = &f->units[u];
  RF_ASSERT(x->state == RF_FSDP_UNIT_STATE_SHARDED);
  int s = rf_fsdp_free_slot(f->pslot_unit, f->n_pslots);
  if (s < 0) return 0;
  f->pslot_unit[s] = u;
  x->pslot = s;
  x->state = RF_FSDP_UNIT_STATE_GATHERING;
  struct rf_device_stream *gather = rf_fsdp_after_compute(f, RF_FSDP_STREAM_GATHER);
  rf_dbuffer_gather_start(&x->db, &f->dmesh.shard, f->master + x->shard_base, f->pslots[s],
                          f->opt.param_dtype, f->opt.fp8_pow2, x->gather_reqs, gather);
  for (int b = 0; b < x->db.n_gather_reqs; b++) {
    rf_comm_req_trace(&x->gather_reqs[b], RF_TRACE_LANE_GATHER, u);
    rf_comm_event_record(&f->dmesh.shard, &x->gather_reqs[b], f->device, &x->gathered[b]);
  }
  rf_fsdp_note_peak(f);
  return 1;
}

static void rf_fsdp_gather_wait(struct rf_fsdp *f, int u) {
  struct rf_fsdp_unit *x = &f->units[u];
  if (x->state == RF_FSDP_UNIT_STATE_SHARDED && !rf_fsdp_gather_start(f, u))
    RF_DIE("no free parameter slot for unit %s (%d slots): units must be handed back in order", x->name,
           f->n_pslots);
  if (x->state == RF_FSDP_UNIT_STATE_GATHERING) {
    struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
    for (int b = 0; b < x->db.n_gather_reqs; b++) rf_device_stream_wait(f->device, compute, &x->gathered[b]);
    if (rf_dbuffer_gather_finish(&x->db, f->pslots[x->pslot], f->opt.param_dtype, f->opt.fp8_pow2,
                                 x->gather_reqs, compute) != 0 &&
        !f->failed) {
      f->failed = 1;
      snprintf(f->fail_msg, sizeof f->fail_msg, "%s", rf_error_msg());
    }
    x->state = RF_FSDP_UNIT_STATE_READY;
  }
}

static void rf_fsdp_release(struct rf_fsdp *f, int u) {
  struct rf_fsdp_unit *x = &f->units[u];
  if (x->state == RF_FSDP_UNIT_STATE_SHARDED) return;
  RF_ASSERT(x->state == RF_FSDP_UNIT_STATE_READY);
  f->pslot_unit[x->pslot] = -1;
  x->pslot = -1;
  x->state = RF_FSDP_UNIT_STATE_SHARDED;
}

/* Starts the gathers of the next `prefetch` units in direction dir (+1 forward,
 * -1 backward) that are not gathered yet, while slots are free. */
static void rf_fsdp_prefetch(struct rf_fsdp *f, int u, int dir) {
  for (int k = 1; k <= f->opt.prefetch; k++) {
    int v = u + dir * k;
    if (v < 0 || v >= f->n_units) break;
    if (f->units[v].state != RF_FSDP_UNIT_STATE_SHARDED) continue;
    if (!rf_fsdp_gather_start(f, v)) break;
  }
}

/* HSDP: starts the all-reduce of unit u's gradient shard across the replicas
 * (padding included: zero). In f32 in place; with reduce_dtype bf16 the shard is
 * rounded to bf16 (nearest even) into grad_across and summed there the way the
 * bf16 reduce-scatter sums (f32 arithmetic, each partial sum rounded to bf16), and
 * rf_fsdp_grads_finish widens the result back. Every rank of a replicate group
 * starts them in the same order: the schedule's, which depends on the unit
 * sequence only. */
static void rf_fsdp_across_start(struct rf_fsdp *f, int u) {
  struct rf_fsdp_unit *x = &f->units[u];
  RF_ASSERT(!x->across);
  void *buf = f->grad + x->shard_base;
  enum rf_dtype dtype = RF_DTYPE_F32;
  struct rf_device_stream *replicate = rf_fsdp_after_compute(f, RF_FSDP_STREAM_REPLICATE);
  if (f->grad_across) {
    dtype = RF_DTYPE_BF16;
    buf = (uint8_t *)f->grad_across + (size_t)x->shard_base * rf_dtype_size(dtype);
    rf_move_convert(f->device, buf, dtype, f->grad + x->shard_base, (size_t)x->db.shard_elems, replicate);
  }
  /* the all-reduce starts after the writes to what it sends (the reduce-scatter's finish, the rounding) */
  rf_device_event_record(f->device, &x->across_written, replicate);
  rf_comm_stream_wait(&f->dmesh.replicate, f->device, &x->across_written);
  rf_comm_iallreduce(&f->dmesh.replicate, buf, x->db.shard_elems, dtype, RF_REDUCE_OP_SUM, x->across_req);
  rf_comm_req_trace(x->across_req, RF_TRACE_LANE_REPLICATE, u);
  rf_comm_event_record(&f->dmesh.replicate, x->across_req, f->device, x->across_done);
  x->across = 1;
}

static void rf_fsdp_reduce_finish(struct rf_fsdp *f, int u) {
  struct rf_fsdp_unit *x = &f->units[u];
  RF_ASSERT(x->reducing);
  struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
  for (int b = 0; b < x->db.n_buffers; b++) rf_device_stream_wait(f->device, compute, &x->reduced[b]);
  rf_dbuffer_reduce_finish(&x->db, f->gslots[x->gslot], f->grad + x->shard_base, f->opt.reduce_dtype,
                           x->reduce_accumulate, x->reduce_reqs, compute);
  f->gslot_unit[x->gslot] = -1;
  x->gslot = -1;
  x->reducing = 0;
  /* the step's last contribution to this shard: its all-reduce overlaps the rest of the backward */
  if (x->reduce_last && f->mesh.replicate.world > 1) rf_fsdp_across_start(f, u);
}

void rf_fsdp_zero_grad(struct rf_fsdp *f) {
  RF_ASSERT(f->finalized);
  for (int u = 0; u < f->n_units; u++) {
    RF_ASSERT(!f->units[u].reducing && !f->units[u].across);
    f->units[u].has_grad = 0;
  }
  rf_device_memset(f->device, f->grad, 0, (size_t)f->shard_elems * sizeof(float),
                   f->stream[RF_FSDP_STREAM_COMPUTE]);
  f->grads_across = 0;
  f->last_micro = 0;
  struct rf_counters now = rf_fsdp_counters_now(f);
  if (f->steps_begun++ > 0) f->last_step = rf_counters_diff(&now, &f->at_step_begin);
  f->at_step_begin = now;
}

void rf_fsdp_forward_begin(struct rf_fsdp *f, int unit) {
  RF_ASSERT(f->finalized && unit >= 0 && unit < f->n_units);
  rf_fsdp_gather_wait(f, unit);
  rf_fsdp_prefetch(f, unit, +1);
  f->units[unit].trace_t0 = rf_trace_now();
}

void rf_fsdp_forward_end(struct rf_fsdp *f, int unit) {
  rf_trace_span(RF_TRACE_LANE_COMPUTE, "forward", f->units[unit].trace_t0, rf_trace_now(), unit, -1);
  /* the last unit is needed again at once by the backward: keep it */
  if (f->opt.reshard_after_forward && unit != f->n_units - 1) rf_fsdp_release(f, unit);
  rf_fsdp_poll(f);
}

void rf_fsdp_backward_begin(struct rf_fsdp *f, int unit) {
  RF_ASSERT(f->finalized && unit >= 0 && unit < f->n_units);
  struct rf_fsdp_unit *x = &f->units[unit];
  if (x->reducing) rf_fsdp_reduce_finish(f, unit); /* the previous micro-batch's reduce */
  rf_fsdp_gather_wait(f, unit);
  int s = rf_fsdp_free_slot(f->gslot_unit, f->n_gslots);
  if (s < 0) {
    /* every grad slot is reducing: finish the one that started first. Units
     * reduce in backward order: those below `unit` still reduce from the previous
     * micro-batch (the highest of them started first), else the highest above it */
    int oldest = -1;
    for (int v = unit - 1; v >= 0 && oldest < 0; v--)
      if (f->units[v].reducing) oldest = v;
    for (int v = f->n_units - 1; v > unit && oldest < 0; v--)
      if (f->units[v].reducing) oldest = v;
    RF_ASSERT(oldest >= 0);
    rf_fsdp_reduce_finish(f, oldest);
    s = rf_fsdp_free_slot(f->gslot_unit, f->n_gslots);
  }
  f->gslot_unit[s] = unit;
  x->gslot = s;
  rf_device_memset(f->device, f->gslots[s], 0, (size_t)x->db.gview_elems * sizeof(float),
                   f->stream[RF_FSDP_STREAM_COMPUTE]);
  rf_fsdp_note_peak(f);
  rf_fsdp_prefetch(f, unit, -1);
  x->trace_t0 = rf_trace_now();
}

void rf_fsdp_backward_end(struct rf_fsdp *f, int unit) {
  struct rf_fsdp_unit *x = &f->units[unit];
  rf_trace_span(RF_TRACE_LANE_COMPUTE, "backward", x->trace_t0, rf_trace_now(), unit, -1);
  RF_ASSERT(x->gslot >= 0 && !x->reducing);
  if (f->grads_across)
    RF_DIE(
        "unit %s: a backward after rf_fsdp_grads_finish without rf_fsdp_zero_grad (under HSDP the "
        "gradients are all-reduced across replicas once per step, after the last micro-batch)",
        x->name);
  x->reduce_accumulate = x->has_grad;
  x->reduce_last = f->last_micro;
  struct rf_device_stream *reduce = rf_fsdp_after_compute(f, RF_FSDP_STREAM_REDUCE);
  rf_dbuffer_reduce_start(&x->db, &f->dmesh.shard, f->gslots[x->gslot], f->grad + x->shard_base,
                          f->opt.reduce_dtype, x->reduce_accumulate, x->reduce_reqs, reduce);
  for (int b = 0; b < x->db.n_buffers; b++) {
    rf_comm_req_trace(&x->reduce_reqs[b], RF_TRACE_LANE_REDUCE, unit);
    rf_comm_event_record(&f->dmesh.shard, &x->reduce_reqs[b], f->device, &x->reduced[b]);
  }
  x->reducing = 1;
  x->has_grad = 1;
  rf_fsdp_release(f, unit);
  rf_fsdp_poll(f);
}

void rf_fsdp_set_last_micro_batch(struct rf_fsdp *f) { f->last_micro = 1; }

void rf_fsdp_grads_finish(struct rf_fsdp *f) {
  for (int u = f->n_units - 1; u >= 0; u--)
    if (f->units[u].reducing) rf_fsdp_reduce_finish(f, u);
  /* HSDP: every shard group holds its own sum; the all-reduce of each unit's shard
   * (f32, or bf16 with reduce_dtype bf16; padding zero) across the groups makes it the sum over every rank.
   * Those of the last micro-batch started as their reduce-scatters finished; the rest (every unit without
   * rf_fsdp_set_last_micro_batch) start here. */
  if (f->mesh.replicate.world > 1 && !f->grads_across) {
    for (int u = f->n_units - 1; u >= 0; u--)
      if (!f->units[u].across) rf_fsdp_across_start(f, u);
    for (int u = f->n_units - 1; u >= 0; u--) {
      struct rf_fsdp_unit *x = &f->units[u];
      struct rf_device_stream *compute = f->stream[RF_FSDP_STREAM_COMPUTE];
      rf_device_stream_wait(f->device, compute, x->across_done);
      rf_comm_retire(x->across_req); /* NCCL: still active without it, and the next start refuses it */
      if (f->grad_across)            /* the bf16 sum widened back into the f32 shard */
        rf_move_convert_back(f->device, f->grad + x->shard_base,
                             (uint8_t *)f->grad_across + (size_t)x->shard_base * rf_dtype_size(RF_DTYPE_BF16),
                             RF_DTYPE_BF16, (size_t)x->db.shard_elems, 0, compute);
      x->across = 0;
    }
    f->grads_across = 1;
  }
}

void rf_fsdp_reshard_all(struct rf_fsdp *f) {
  for (int u = 0; u < f->n_units; u++) {
    struct rf_fsdp_unit *x = &f->units[u];
    RF_ASSERT(x->gslot < 0);
    /* a prefetch in flight must land before its slot is reused */
    if (x->state == RF_FSDP_UNIT_STATE_GATHERING) rf_fsdp_gather_wait(f, u);
    rf_fsdp_release(f, u);
  }
}

void rf_fsdp_poll(struct rf_fsdp *f) {
  for (int u = 0; u < f->n_units; u++) {
    struct rf_fsdp_unit *x = &f->units[u];
    if (x->state == RF_FSDP_UNIT_STATE_GATHERING)
      for (int b = 0; b < x->db.n_gather_reqs; b++) rf_device_event_query(f->device, &x->gathered[b]);
    if (x->reducing)
      for (int b = 0; b < x->db.n_buffers; b++) rf_device_event_query(f->device, &x->reduced[b]);
    if (x->across) rf_device_event_query(f->device, x->across_done);
  }
}
