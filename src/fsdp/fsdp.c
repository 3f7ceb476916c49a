/* The context: declarations, finalize, views, shards and stats. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "fsdp/fsdp.h"

void rf_fsdp_options_default(struct rf_fsdp_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->layout = RF_LAYOUT_PLANNED;
  opt->shard = RF_SHARD_MODE_EQUAL;
  opt->max_buffers = 4;
  opt->align_bytes = 64;
  opt->block_rows = 1;
  opt->vector_block = 1;
  opt->prefetch = 1;
  opt->reshard_after_forward = 1;
  opt->param_dtype = RF_DTYPE_F32;
  opt->reduce_dtype = RF_DTYPE_F32;
  opt->seed = 1234;
}

const char *rf_fsdp_error(void) { return rf_error_msg(); }

void rf_fsdp_log_errors_only(void) { rf_log_set_level(RF_LOG_LEVEL_ERROR); }

int rf_fsdp_error_set(const char *file, int line, const char *fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  return rf_error_set(file, line, "%s", text);
}

const struct rf_comm *rf_fsdp_shard_comm(const struct rf_fsdp *f) { return &f->mesh.shard; }

static int rf_fsdp_check_options(const struct rf_fsdp_options *o) {
  RF_REQUIRE(o->layout >= RF_LAYOUT_PLANNED && o->layout <= RF_LAYOUT_FLAT, "unknown layout %d",
             (int)o->layout);
  RF_REQUIRE(o->shard == RF_SHARD_MODE_EQUAL || o->shard == RF_SHARD_MODE_RAGGED, "unknown shard mode");
  RF_REQUIRE(o->max_buffers >= 1, "max_buffers must be >= 1 (got %d)", o->max_buffers);
  RF_REQUIRE(o->align_bytes >= 4 && (o->align_bytes & (o->align_bytes - 1)) == 0,
             "align_bytes must be a power of two >= 4 (got %lld)", (long long)o->align_bytes);
  RF_REQUIRE(o->block_rows >= 1, "block_rows must be >= 1 (got %lld)", (long long)o->block_rows);
  RF_REQUIRE(o->vector_block >= 1, "vector_block must be >= 1 (got %lld)", (long long)o->vector_block);
  RF_REQUIRE(o->prefetch >= 0, "prefetch must be >= 0 (got %d)", o->prefetch);
  RF_REQUIRE(o->param_dtype == RF_DTYPE_F32 || o->param_dtype == RF_DTYPE_BF16,
             "param dtype must be f32 or bf16 (got %s)", rf_dtype_name(o->param_dtype));
  RF_REQUIRE(o->reduce_dtype == RF_DTYPE_F32 || o->reduce_dtype == RF_DTYPE_BF16,
             "reduce dtype must be f32 or bf16 (got %s)", rf_dtype_name(o->reduce_dtype));
  return 0;
}

void rf_fsdp_plan_policy(const struct rf_fsdp_options *o, struct rf_plan_policy *out) {
  *out = (struct rf_plan_policy){.layout = o->layout,
                                 .shard = o->shard,
                                 .max_buffers = o->max_buffers,
                                 .align_bytes = o->align_bytes,
                                 .param_dtype = o->param_dtype,
                                 .reduce_dtype = o->reduce_dtype,
                                 .block_rows = o->block_rows,
                                 .vector_block = o->vector_block,
                                 .fp8 = o->fp8,
                                 .whole_runs = 1}; /* a DBuffer holds each tensor as one run */
}

int rf_fsdp_create_on(struct rf_fsdp **out, struct rf_comm_mesh *mesh, const struct rf_fsdp_options *opt) {
  *out = NULL;
  if (rf_fsdp_check_options(opt) != 0) {
    rf_comm_mesh_free(mesh);
    return -1;
  }
  if (rf_backend_check(opt->device ? opt->device : "cpu") != 0 || rf_comm_mesh_check(mesh) != 0) {
    rf_comm_mesh_free(mesh);
    return -1;
  }
  struct rf_fsdp *f = rf_xcalloc(1, sizeof *f);
  f->opt = *opt;
  f->mesh = *mesh;
  memset(mesh, 0, sizeof *mesh);
  rf_fsdp_plan_policy(opt, &f->policy);
  f->device = rf_xcalloc(1, sizeof *f->device);
  const struct rf_backend *backend = rf_backend_find(opt->device ? opt->device : "cpu");
  int ordinal = 0;
  if (backend->devices) { /* a GPU per rank: its local rank's (issue 34) */
    int local = rf_comm_mesh_local_rank(&f->mesh), devices = backend->devices();
    ordinal = rf_device_ordinal(local, devices);
    rf_log_info("device %s %d (local rank %d; %d %s devices)", backend->name, ordinal, local, devices,
                backend->name);
  }
  rf_backend_open(backend, f->device, ordinal, &f->counters);
  f->opt.device = f->device->backend->name; /* static: the caller's string is borrowed */
  for (int s = 0; s < RF_FSDP_STREAM_COUNT; s++) f->stream[s] = rf_device_stream_create(f->device);
  rf_device_event_create(f->device, &f->mark);
  f->mesh.shard.counters = &f->counters;
  f->mesh.replicate.counters = &f->counters;
  if (backend->comm_open) { /* its own communicators (NCCL) */
    backend->comm_open(&f->dmesh.shard, &f->mesh.shard, f->device);
    backend->comm_open(&f->dmesh.replicate, &f->mesh.replicate, f->device);
  } else {
    rf_comm_on_device(&f->dmesh.shard, &f->mesh.shard, f->device);
    rf_comm_on_device(&f->dmesh.replicate, &f->mesh.replicate, f->device);
  }
  f->at_create = rf_fsdp_counters_now(f);
  *out = f;
  return 0;
}

void rf_fsdp_hold(struct rf_fsdp *f) { f->holders++; }

void rf_fsdp_unhold(struct rf_fsdp *f) {
  if (--f->holders == 0 && f->free_pending) rf_fsdp_free(f);
}

const char *rf_fsdp_grads_unfinished(const struct rf_fsdp *f) {
  for (int u = 0; u < f->n_units; u++)
    if (f->units[u].gslot >= 0 || f->units[u].reducing) return f->units[u].name;
  return NULL;
}

void rf_fsdp_free(struct rf_fsdp *f) {
  if (!f) return;
  if (f->holders > 0) {
    f->free_pending = 1;
    return;
  }
  for (int s = 0; s < RF_FSDP_STREAM_COUNT; s++) /* their work done before its memory goes */
    rf_device_stream_synchronize(f->device, f->stream[s]);
  for (int u = 0; u < f->n_units; u++) {
    struct rf_fsdp_unit *x = &f->units[u];
    if (x->gather_reqs) {
      for (int b = 0; b < x->db.n_gather_reqs; b++) {
        rf_comm_wait(&x->gather_reqs[b]);
        rf_comm_req_free(&x->gather_reqs[b]);
      }
      for (int b = 0; b < x->db.n_buffers; b++) {
        rf_comm_wait(&x->reduce_reqs[b]);
        rf_comm_req_free(&x->reduce_reqs[b]);
      }
      for (int b = 0; b < x->db.n_gather_reqs; b++) rf_device_event_free(f->device, &x->gathered[b]);
      for (int b = 0; b < x->db.n_buffers; b++) rf_device_event_free(f->device, &x->reduced[b]);
      rf_comm_wait(x->across_req);
      rf_comm_req_free(x->across_req);
      rf_device_event_free(f->device, x->across_done);
      rf_device_event_free(f->device, &x->across_written);
      free(x->gather_reqs);
      free(x->reduce_reqs);
      free(x->across_req);
      free(x->gathered);
      free(x->reduced);
      free(x->across_done);
    }
    rf_dbuffer_free(&x->db);
  }
  free(f->units);
  free(f->tensors);
  free(f->views);
  rf_device_release(f->device, f->master);
  rf_device_release(f->device, f->grad);
  rf_device_release(f->device, f->sumsq);
  rf_fsdp_norm_plans_free(f);
  if (f->norm_req) {
    rf_comm_wait(f->norm_req);
    rf_comm_req_free(f->norm_req);
    rf_device_event_free(f->device, f->norm_done);
    rf_device_event_free(f->device, &f->norm_written);
    free(f->norm_req);
    free(f->norm_done);
  }
  if (f->grad_across) rf_device_release(f->device, f->grad_across);
  free(f->pslots);
  free(f->gslots);
  free(f->pslot_unit);
  free(f->gslot_unit);
  rf_arena_free(&f->arena);
  if (f->device->backend->comm_open) { /* owned (NCCL): finalized before the device goes */
    rf_comm_free(&f->dmesh.shard);
    rf_comm_free(&f->dmesh.replicate);
  }
  rf_device_event_free(f->device, &f->mark);
  for (int s = 0; s < RF_FSDP_STREAM_COUNT; s++) rf_device_stream_free(f->device, f->stream[s]);
  rf_device_free(f->device);
  free(f->device);
  rf_comm_mesh_free(&f->mesh);
  free(f);
}

int rf_fsdp_add_unit(struct rf_fsdp *f, const char *name) {
  RF_REQUIRE_ARG("rf_fsdp_add_unit", f);
  RF_REQUIRE_ARG("rf_fsdp_add_unit", name);
  RF_REQUIRE(!f->finalized, "unit %s declared after rf_fsdp_finalize", name);
  RF_REQUIRE(name && strlen(name) < RF_FSDP_NAME_MAX, "unit name missing or longer than %d bytes",
             RF_FSDP_NAME_MAX - 1);
  if (f->n_units == f->cap_units) {
    f->cap_units = f->cap_units ? 2 * f->cap_units : 16;
    f->units = realloc(f->units, (size_t)f->cap_units * sizeof *f->units);
    RF_ASSERT(f->units);
  }
  struct rf_fsdp_unit *x = &f->units[f->n_units];
  memset(x, 0, sizeof *x);
  snprintf(x->name, sizeof x->name, "%s", name);
  x->first_tensor = f->n_tensors;
  x->pslot = x->gslot = -1;
  return f->n_units++;
}

int rf_fsdp_add_tensor(struct rf_fsdp *f, int unit, const char *name, int ndim, const int64_t *shape,
                       int64_t block_rows, struct rf_init init) {
  RF_REQUIRE_ARG("rf_fsdp_add_tensor", f);
  RF_REQUIRE_ARG("rf_fsdp_add_tensor", name);
  RF_REQUIRE_ARG("rf_fsdp_add_tensor", shape);
  RF_REQUIRE(!f->finalized, "tensor %s declared after rf_fsdp_finalize", name);
  RF_REQUIRE(name && strlen(name) < RF_FSDP_NAME_MAX, "tensor name missing or longer than %d bytes",
             RF_FSDP_NAME_MAX - 1);
  RF_REQUIRE(unit == f->n_units - 1 && unit >= 0,
             "tensor %s: tensors are declared into the last unit declared (got unit %d of %d)", name, unit,
             f->n_units);
  RF_REQUIRE(ndim >= 1 && ndim <= RF_MAX_DIMS, "tensor %s: ndim %d outside 1..%d", name, ndim, RF_MAX_DIMS);
  RF_REQUIRE(block_rows >= 0, "tensor %s: block_rows %lld is negative", name, (long long)block_rows);
  RF_REQUIRE(rf_fsdp_find_tensor(f, name) < 0, "tensor %s declared twice", name);
  int64_t numel = 1;
  for (int d = 0; d < ndim; d++) {
    RF_REQUIRE(shape[d] > 0, "tensor %s: shape[%d] = %lld is not positive", name, d, (long long)shape[d]);
    RF_REQUIRE(numel <= INT64_MAX / 8 / shape[d], "tensor %s: too many elements", name);
    numel *= shape[d];
  }
  if (f->n_tensors == f->cap_tensors) {
    f->cap_tensors = f->cap_tensors ? 2 * f->cap_tensors : 64;
    f->tensors = realloc(f->tensors, (size_t)f->cap_tensors * sizeof *f->tensors);
    RF_ASSERT(f->tensors);
  }
  struct rf_fsdp_tensor *t = &f->tensors[f->n_tensors];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->unit = unit;
  t->index_in_unit = f->units[unit].n_tensors++;
  t->ndim = ndim;
  memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
  t->numel = numel;
  t->block_elems = rf_plan_block_elems(&f->policy, ndim, shape, block_rows);
  t->init = init;
  return f->n_tensors++;
}

int rf_fsdp_set_fp8(struct rf_fsdp *f, int tensor) {
  RF_REQUIRE_ARG("rf_fsdp_set_fp8", f);
  RF_REQUIRE(tensor >= 0 && tensor < f->n_tensors, "rf_fsdp_set_fp8: no tensor %d", tensor);
  struct rf_fsdp_tensor *t = &f->tensors[tensor];
  RF_REQUIRE(!f->finalized, "tensor %s marked FP8 after rf_fsdp_finalize", t->name);
  if (!f->opt.fp8) return 0;
  RF_REQUIRE(
      t->ndim == 2 || t->ndim == 3,
      "tensor %s: only matrices and fused experts [E, rows, cols] are quantized in 128x128 tiles (ndim %d)",
      t->name, t->ndim);
  t->fp8 = 1;
  /* fsdp2 and flat place rank boundaries by their own rule and quantize after the
   * gather: the tensor keeps its block */
  if (f->opt.layout != RF_LAYOUT_PLANNED) return 0;
  struct rf_plan_tensor_in in = {.name = t->name,
                                 .ndim = t->ndim,
                                 .numel = t->numel,
                                 .block_elems = t->block_elems,
                                 .sub_count = t->ndim == 3 ? t->shape[0] : 1};
  memcpy(in.shape, t->shape, sizeof in.shape);
  t->block_elems = rf_plan_fp8_block_elems(&in);
  return 0;
}

/* `label`: the unit's name (borrowed; the units array is fixed after finalize),
 * which the collective watchdog prints. */
static void rf_fsdp_reqs_init(struct rf_fsdp *f, struct rf_comm_req **reqs, struct rf_device_event **evs,
                              int n, int world, const char *label) {
  *reqs = rf_xcalloc((size_t)n, sizeof **reqs);
  *evs = rf_xcalloc((size_t)n, sizeof **evs);
  for (int b = 0; b < n; b++) {
    rf_comm_req_init(&(*reqs)[b], world);
    (*reqs)[b].label = label;
    rf_device_event_create(f->device, &(*evs)[b]);
  }
}

/* Carves the slots out of one arena. */
static void rf_fsdp_make_slots(struct rf_fsdp *f) {
  size_t pbytes = 0, gbytes = 0;
  for (int u = 0; u < f->n_units; u++) {
    size_t p = rf_dbuffer_param_slot_bytes(&f->units[u].db);
    size_t g = rf_dbuffer_grad_slot_bytes(&f->units[u].db, f->opt.reduce_dtype);
    if (p > pbytes) pbytes = p;
    if (g > gbytes) gbytes = g;
  }
  f->pslot_bytes = (size_t)rf_round_up((int64_t)pbytes, 64);
  f->gslot_bytes = (size_t)rf_round_up((int64_t)gbytes, 64);
  f->n_pslots = f->opt.reshard_after_forward ? (int)rf_min_i64(f->opt.prefetch + 1, f->n_units) : f->n_units;
  f->n_gslots = (int)rf_min_i64(2, f->n_units);
  rf_arena_init(&f->arena, f->device,
                (size_t)f->n_pslots * f->pslot_bytes + (size_t)f->n_gslots * f->gslot_bytes,
                f->stream[RF_FSDP_STREAM_COMPUTE]);
  f->pslots = rf_xcalloc((size_t)f->n_pslots, sizeof *f->pslots);
  f->gslots = rf_xcalloc((size_t)f->n_gslots, sizeof *f->gslots);
  f->pslot_unit = rf_xmalloc((size_t)f->n_pslots * sizeof(int));
  f->gslot_unit = rf_xmalloc((size_t)f->n_gslots * sizeof(int));
  for (int s = 0; s < f->n_pslots; s++) {
    f->pslots[s] = rf_arena_alloc(&f->arena, f->pslot_bytes, 64);
    f->pslot_unit[s] = -1;
  }
  for (int s = 0; s < f->n_gslots; s++) {
    f->gslots[s] = rf_arena_alloc(&f->arena, f->gslot_bytes, 64);
    f->gslot_unit[s] = -1;
  }
}

int rf_fsdp_finalize(struct rf_fsdp *f) {
  RF_REQUIRE_ARG("rf_fsdp_finalize", f);
  RF_REQUIRE(!f->finalized, "rf_fsdp_finalize called twice");
  RF_REQUIRE(f->n_units >= 1, "no units declared");
  int w = f->mesh.shard.world, r = f->mesh.shard.rank;
  int64_t slab = 0;
  for (int u = 0; u < f->n_units; u++) {
    struct rf_fsdp_unit *x = &f->units[u];
    RF_REQUIRE(x->n_tensors >= 1, "unit %s has no tensors", x->name);
    struct rf_plan_tensor_in *in = rf_xcalloc((size_t)x->n_tensors, sizeof *in);
    for (int i = 0; i < x->n_tensors; i++) {
      const struct rf_fsdp_tensor *t = &f->tensors[x->first_tensor + i];
      /* a 3-D tensor is fused [E, rows, cols] sub-tensors (as rf_fsdp_set_fp8 tiles it):
       * the planner may place them one at a time, each tensor staying one run
       * (whole_runs), as `rfsdp plan` lays out a model's fused experts */
      in[i] = (struct rf_plan_tensor_in){.name = t->name,
                                         .ndim = t->ndim,
                                         .numel = t->numel,
                                         .block_elems = t->block_elems,
                                         .sub_count = t->ndim == 3 ? t->shape[0] : 1,
                                         .fp8 = t->fp8};
      memcpy(in[i].shape, t->shape, sizeof in[i].shape);
    }
    int rc = rf_dbuffer_init(&x->db, x->name, in, x->n_tensors, w, r, &f->policy, f->device);
    free(in);
    if (rc != 0) return -1; /* rf_fsdp_free releases what the units before u hold */
    x->shard_base = slab;
    slab += x->db.shard_elems;
    rf_fsdp_reqs_init(f, &x->gather_reqs, &x->gathered, x->db.n_gather_reqs, w, x->name);
    rf_fsdp_reqs_init(f, &x->reduce_reqs, &x->reduced, x->db.n_buffers, w, x->name);
    rf_fsdp_reqs_init(f, &x->across_req, &x->across_done, 1, f->mesh.replicate.world, x->name);
    rf_device_event_create(f->device, &x->across_written);
  }
  f->shard_elems = rf_max_i64(slab, 1);
  /* zero-filled by the device */
  f->master = rf_device_alloc(f->device, (size_t)f->shard_elems * sizeof(float), 64);
  f->grad = rf_device_alloc(f->device, (size_t)f->shard_elems * sizeof(float), 64);
  f->sumsq = rf_device_alloc(f->device, 2 * sizeof(double), 64);
  f->gscale = (float *)(void *)((char *)f->sumsq + sizeof(double)); /* one allocation for both */
  rf_fsdp_reqs_init(f, &f->norm_req, &f->norm_done, 1, f->mesh.shard.world, "gradient norm");
  rf_device_event_create(f->device, &f->norm_written);
  /* HSDP in bf16: the replica all-reduce carries the shard in bf16 (half the bytes across groups) */
  if (f->mesh.replicate.world > 1 && f->opt.reduce_dtype == RF_DTYPE_BF16)
    f->grad_across = rf_device_alloc(f->device, (size_t)f->shard_elems * rf_dtype_size(RF_DTYPE_BF16), 64);
  rf_fsdp_make_slots(f);
  f->finalized = 1;
  f->views = rf_xcalloc((size_t)f->n_tensors, sizeof *f->views);
  for (int t = 0; t < f->n_tensors; t++) rf_fsdp_tensor(f, t, &f->views[t]);
  rf_fsdp_norm_plans_make(f);
  rf_fsdp_init_params(f);
  return 0;
}

int rf_fsdp_rank(const struct rf_fsdp *f) { return f->mesh.shard.rank; }
int rf_fsdp_world(const struct rf_fsdp *f) { return f->mesh.shard.world; }
int rf_fsdp_replicate_rank(const struct rf_fsdp *f) { return f->mesh.replicate.rank; }
int rf_fsdp_replicas(const struct rf_fsdp *f) { return f->mesh.replicate.world; }
int rf_fsdp_n_units(const struct rf_fsdp *f) { return f->n_units; }
int rf_fsdp_n_tensors(const struct rf_fsdp *f) { return f->n_tensors; }

int rf_fsdp_find_tensor(const struct rf_fsdp *f, const char *name) {
  RF_REQUIRE_ARG("rf_fsdp_find_tensor", f);
  RF_REQUIRE_ARG("rf_fsdp_find_tensor", name);
  for (int t = 0; t < f->n_tensors; t++)
    if (strcmp(f->tensors[t].name, name) == 0) return t;
  return -1;
}

void rf_fsdp_tensor(const struct rf_fsdp *f, int tensor, struct rf_tensor_view *out) {
  RF_ASSERT(f->finalized && tensor >= 0 && tensor < f->n_tensors);
  const struct rf_fsdp_tensor *t = &f->tensors[tensor];
  const struct rf_fsdp_unit *x = &f->units[t->unit];
  const struct rf_dbuffer_tensor *d = &x->db.tensors[t->index_in_unit];
  int r = f->mesh.shard.rank;
  memset(out, 0, sizeof *out);
  out->name = t->name;
  out->unit = t->unit;
  out->ndim = t->ndim;
  memcpy(out->shape, t->shape, (size_t)t->ndim * sizeof(int64_t));
  out->numel = t->numel;
  out->block_elems = d->blocks_whole ? t->block_elems : 1;
  out->starts = d->starts;
  out->begin = d->starts[r];
  out->end = d->starts[r + 1];
  out->shard_offset = x->shard_base + d->shard_off;
  out->master = f->master + out->shard_offset;
  out->grad = f->grad + out->shard_offset;
}

const struct rf_tensor_view *rf_fsdp_views(const struct rf_fsdp *f) {
  RF_ASSERT(f->finalized);
  return f->views;
}

int64_t rf_fsdp_shard_elems(const struct rf_fsdp *f) { return f->shard_elems; }
float *rf_fsdp_shard_master(struct rf_fsdp *f) { return f->master; }
float *rf_fsdp_shard_grad(struct rf_fsdp *f) { return f->grad; }

static const struct rf_dbuffer_tensor *rf_fsdp_placed(const struct rf_fsdp *f, int tensor,
                                                      const struct rf_fsdp_unit **unit) {
  RF_ASSERT(f->finalized && tensor >= 0 && tensor < f->n_tensors);
  const struct rf_fsdp_tensor *t = &f->tensors[tensor];
  *unit = &f->units[t->unit];
  return &(*unit)->db.tensors[t->index_in_unit];
}

/* Tensor t's place in its unit's param slot (the slot is returned, its place in
 * *placed); dies when the unit is not gathered. */
static const void *rf_fsdp_param_slot(struct rf_fsdp *f, int tensor,
                                      const struct rf_dbuffer_tensor **placed) {
  const struct rf_fsdp_unit *x;
  const struct rf_dbuffer_tensor *d = rf_fsdp_placed(f, tensor, &x);
  if (x->state != RF_FSDP_UNIT_STATE_READY)
    RF_DIE("parameter %s read while its unit %s is not gathered", f->tensors[tensor].name, x->name);
  *placed = d;
  return f->pslots[x->pslot];
}

static const void *rf_fsdp_at(const void *slot, int64_t bytes) { return (const char *)slot + bytes; }

const float *rf_fsdp_param(struct rf_fsdp *f, int tensor) {
  const struct rf_dbuffer_tensor *d;
  const void *slot = rf_fsdp_param_slot(f, tensor, &d);
  return f->opt.param_dtype == RF_DTYPE_F32 && !d->fp8 ? rf_fsdp_at(slot, d->view_byte) : NULL;
}

const uint16_t *rf_fsdp_param_bf16(struct rf_fsdp *f, int tensor) {
  const struct rf_dbuffer_tensor *d;
  const void *slot = rf_fsdp_param_slot(f, tensor, &d);
  return f->opt.param_dtype == RF_DTYPE_BF16 && !d->fp8 ? rf_fsdp_at(slot, d->view_byte) : NULL;
}

const uint8_t *rf_fsdp_param_fp8(struct rf_fsdp *f, int tensor, const float **scales) {
  const struct rf_dbuffer_tensor *d;
  const void *slot = rf_fsdp_param_slot(f, tensor, &d);
  *scales = d->fp8 ? rf_fsdp_at(slot, d->scale_byte) : NULL;
  return d->fp8 ? rf_fsdp_at(slot, d->code_byte) : NULL;
}

int rf_fsdp_status(const struct rf_fsdp *f) {
  if (f->failed) RF_FAIL("%s", f->fail_msg);
  return 0;
}

float *rf_fsdp_grad(struct rf_fsdp *f, int tensor) {
  const struct rf_fsdp_unit *x;
  const struct rf_dbuffer_tensor *d = rf_fsdp_placed(f, tensor, &x);
  if (x->gslot < 0 || x->reducing)
    RF_DIE("gradient %s written outside the backward of its unit %s", f->tensors[tensor].name, x->name);
  return (float *)f->gslots[x->gslot] + d->gview_off;
}

int64_t rf_fsdp_slots_in_use_bytes(const struct rf_fsdp *f) {
  int64_t bytes = 0;
  for (int s = 0; s < f->n_pslots; s++)
    if (f->pslot_unit[s] >= 0) bytes += (int64_t)rf_dbuffer_param_slot_bytes(&f->units[f->pslot_unit[s]].db);
  for (int s = 0; s < f->n_gslots; s++)
    if (f->gslot_unit[s] >= 0)
      bytes += (int64_t)rf_dbuffer_grad_slot_bytes(&f->units[f->gslot_unit[s]].db, f->opt.reduce_dtype);
  return bytes;
}

void rf_fsdp_get_stats(const struct rf_fsdp *f, struct rf_fsdp_stats *out) {
  memset(out, 0, sizeof *out);
  for (int t = 0; t < f->n_tensors; t++) out->param_elems += f->tensors[t].numel;
  for (int u = 0; u < f->n_units; u++) {
    const struct rf_dbuffer *db = &f->units[u].db;
    out->padded_elems += db->padded_elems;
    out->n_buffers += db->n_buffers;
    out->max_shard_elems += db->max_shard_elems;
    out->split_blocks += db->split_blocks;
    out->copy_bytes_per_step += db->copy_bytes;
    if (db->padded_elems > out->largest_unit_elems) out->largest_unit_elems = db->padded_elems;
  }
  out->shard_elems = f->shard_elems;
  out->arena_bytes = (int64_t)f->arena.capacity;
  out->arena_peak_bytes = f->slots_in_use_peak_bytes;
}

struct rf_counters rf_fsdp_counters_now(const struct rf_fsdp *f) {
  struct rf_counters c = f->counters;
  c.allocations += rf_heap_allocations();
  return c;
}

struct rf_counters *rf_fsdp_counters(struct rf_fsdp *f) {
  return &f->counters;
}

void rf_fsdp_get_counters(const struct rf_fsdp *f, struct rf_counters *total, struct rf_counters *last_step) {
  if (total) {
    struct rf_counters now = rf_fsdp_counters_now(f);
    *total = rf_counters_diff(&now, &f->at_create);
  }
  if (last_step) *last_step = f->last_step;
}
