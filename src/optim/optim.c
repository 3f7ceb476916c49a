/* src/optim: the optimizer kinds and the entry points every kind shares (the
 * views' checks, the step counter, state and stats); each optimizer is its own
 * file behind struct rf_optim_ops. See rfsdp_optim.h and docs/optim.md. */
#include "optim/optim.h"
#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Indexed by enum rf_optim_kind. */
static const struct rf_optim_ops *const rf_optim_kinds[] = {&rf_optim_adamw_ops, &rf_optim_adamw8bit_ops,
                                                            &rf_optim_muon_ops, &rf_optim_shampoo_ops};
#define RF_OPTIM_N_KINDS ((int)(sizeof rf_optim_kinds / sizeof rf_optim_kinds[0]))

void rf_optim_options_default(struct rf_optim_options *opt) {
  memset(opt, 0, sizeof *opt);
  opt->kind = RF_OPTIM_KIND_ADAMW;
  opt->beta1 = 0.9f;
  opt->beta2 = 0.95f;
  opt->eps = 1e-8f;
  opt->weight_decay = 0.1f;
  opt->muon_momentum = 0.95f;
  opt->muon_nesterov = 1;
  opt->muon_ns_steps = 5;
  opt->muon_ns_eps = 1e-7f;
  opt->muon_scale = RF_OPTIM_MUON_SCALE_MATCH_RMS_ADAMW;
  opt->muon_overlap = 1;
  opt->shampoo_block = 1024;
  opt->shampoo_every = 20;
  opt->shampoo_beta2 = 0.999f;
  opt->shampoo_eps = 1e-12f;
}

int rf_optim_kind_parse(const char *name, enum rf_optim_kind *out) {
  RF_REQUIRE_ARG("rf_optim_kind_parse", name);
  RF_REQUIRE_ARG("rf_optim_kind_parse", out);
  for (int i = 0; i < RF_OPTIM_N_KINDS; i++)
    if (strcmp(name, rf_optim_kinds[i]->name) == 0) {
      *out = (enum rf_optim_kind)i;
      return 0;
    }
  char names[128];
  RF_TRY(rf_optim_kind_list(names, sizeof names, ", "));
  RF_FAIL("unknown optimizer '%s' (%s)", name, names);
}

int rf_optim_kind_list(char *out, size_t size, const char *sep) {
  RF_REQUIRE(out && size > 0 && sep, "rf_optim_kind_list: no buffer or separator");
  size_t at = 0;
  out[0] = 0;
  for (int i = 0; i < RF_OPTIM_N_KINDS; i++) {
    int n = snprintf(out + at, size - at, "%s%s", i ? sep : "", rf_optim_kinds[i]->name);
    RF_REQUIRE(n >= 0 && (size_t)n < size - at, "rf_optim_kind_list: a buffer of %zu bytes is too small",
               size);
    at += (size_t)n;
  }
  return 0;
}

const char *rf_optim_kind_name(enum rf_optim_kind kind) {
  return (unsigned)kind < (unsigned)RF_OPTIM_N_KINDS ? rf_optim_kinds[kind]->name : "?";
}

void rf_optim_layout_needs(enum rf_optim_kind kind, struct rf_optim_layout_needs *out) {
  RF_ASSERT((unsigned)kind < (unsigned)RF_OPTIM_N_KINDS);
  out->block_rows = rf_optim_kinds[kind]->block_rows;
  out->vector_block = rf_optim_kinds[kind]->vector_block;
}

/* ---- create / free ---------------------------------------------------------- */

static int rf_optim_check_view(const struct rf_optim *o, const struct rf_tensor_view *v, int i) {
  const char *nm = v->name ? v->name : "?";
  RF_REQUIRE(v->ndim >= 0 && v->ndim <= 8, "optim: view %d (%s): ndim %d", i, nm, v->ndim);
  int64_t numel = 1;
  for (int d = 0; d < v->ndim; d++) {
    RF_REQUIRE(v->shape[d] > 0, "optim: view %d (%s): dimension %d is %lld", i, nm, d,
               (long long)v->shape[d]);
    numel *= v->shape[d];
  }
  RF_REQUIRE(numel == v->numel, "optim: view %d (%s): numel %lld but the shape has %lld", i, nm,
             (long long)v->numel, (long long)numel);
  RF_REQUIRE(v->begin >= 0 && v->begin <= v->end && v->end <= v->numel,
             "optim: view %d (%s): range [%lld, %lld) outside the tensor of %lld", i, nm, (long long)v->begin,
             (long long)v->end, (long long)v->numel);
  int64_t len = v->end - v->begin;
  RF_REQUIRE(len == 0 || (v->shard_offset >= 0 && v->shard_offset + len <= o->shard_elems),
             "optim: view %d (%s): piece [%lld, +%lld) outside the shard of %lld elements", i, nm,
             (long long)v->shard_offset, (long long)len, (long long)o->shard_elems);
  RF_REQUIRE(len == 0 || o->measure || (v->master && v->grad),
             "optim: view %d (%s): no master or grad pointer", i, nm);
  return 0;
}

static int rf_optim_make(struct rf_optim **out, const struct rf_optim_options *opt,
                         const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                         const struct rf_comm *comm, struct rf_device *dev, struct rf_device_stream *stream,
                         int measure) {
  RF_REQUIRE_ARG("rf_optim_create", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_optim_create", opt);
  RF_REQUIRE(views || n == 0, "rf_optim_create: argument 'views' is NULL");
  RF_REQUIRE(n >= 0 && shard_elems >= 0, "optim: %d views, shard of %lld elements", n,
             (long long)shard_elems);
  RF_REQUIRE((unsigned)opt->kind < (unsigned)RF_OPTIM_N_KINDS, "optim: unknown kind %d", (int)opt->kind);
  RF_REQUIRE(flags || n == 0, "optim: no groups (flags) given for the %d views", n);
  RF_REQUIRE(!dev || !rf_optim_kinds[opt->kind]->host_code || rf_device_runs_host_code(dev) ||
                 (rf_optim_kinds[opt->kind]->on_device && rf_optim_kinds[opt->kind]->on_device(dev)),
             "--optim %s: not on device %s yet (its step is host code; adamw runs there)",
             rf_optim_kinds[opt->kind]->name, dev->backend ? dev->backend->name : dev->ops->name);
  struct rf_optim *o = rf_xcalloc(1, sizeof *o);
  o->opt = *opt;
  o->ops = rf_optim_kinds[opt->kind];
  o->comm = comm;
  if (!dev) { /* rf_optim_create: on the host, as its documentation says; counted with its collectives */
    rf_backend_open(&rf_backend_cpu, &o->own_device, 0, comm ? comm->counters : NULL);
    dev = &o->own_device;
    stream = o->own_stream = rf_device_stream_create(dev);
  }
  o->stream = stream;
  RF_ASSERT(dev->backend); /* opened by rf_backend_open: its kernels come with it */
  o->dev = dev;
  o->rank = comm ? comm->rank : 0;
  o->world = comm ? comm->world : 1;
  o->n = n;
  o->shard_elems = shard_elems;
  o->measure = measure;
  o->views = rf_xcalloc((size_t)(n > 0 ? n : 1), sizeof(struct rf_optim_view));
  int rc = 0;
  for (int i = 0; i < n && rc == 0; i++) {
    struct rf_optim_view *w = &o->views[i];
    w->v = views[i];
    w->flags = o->ops->takes_matrices ? flags[i] : flags[i] & ~RF_OPTIM_FLAG_MATRIX;
    w->cols = views[i].ndim >= 2 ? views[i].shape[views[i].ndim - 1] : 0;
    w->rows = w->cols ? views[i].numel / w->cols : 0;
    rc = rf_optim_check_view(o, &views[i], i);
  }
  if (rc == 0) rc = o->ops->create(o);
  if (rc != 0) {
    rf_optim_free(o);
    return -1;
  }
  *out = o;
  return 0;
}

int rf_optim_create(struct rf_optim **out, const struct rf_optim_options *opt,
                    const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                    const struct rf_comm *comm) {
  return rf_optim_make(out, opt, views, flags, n, shard_elems, comm, NULL, NULL, 0);
}

int rf_optim_create_on(struct rf_optim **out, const struct rf_optim_options *opt,
                       const struct rf_tensor_view *views, const int *flags, int n, int64_t shard_elems,
                       const struct rf_comm *comm, struct rf_device *dev, struct rf_device_stream *stream) {
  RF_ASSERT(dev && stream);
  return rf_optim_make(out, opt, views, flags, n, shard_elems, comm, dev, stream, 0);
}

int rf_optim_measure(const struct rf_optim_options *opt, const struct rf_tensor_view *views, const int *flags,
                     int n, int64_t shard_elems, int rank, int world, struct rf_optim_stats *out) {
  RF_REQUIRE(world >= 1 && rank >= 0 && rank < world, "optim: rank %d of %d", rank, world);
  struct rf_comm comm = {.rank = rank, .world = world}; /* read for its rank and size only */
  struct rf_optim *o = NULL;
  RF_TRY(rf_optim_make(&o, opt, views, flags, n, shard_elems, &comm, NULL, NULL, 1));
  RF_ASSERT(o);
  rf_optim_get_stats(o, out);
  rf_optim_free(o);
  return 0;
}

/* On every device (the host's is a no-op): the count of host waits (host_syncs) is then the same on
 * the cpu as on a GPU. */
void rf_optim_host_sync(struct rf_optim *o) { rf_device_stream_synchronize(o->dev, o->stream); }

void rf_optim_hold(struct rf_optim *o) { o->holders++; }

void rf_optim_unhold(struct rf_optim *o) {
  if (--o->holders == 0 && o->free_pending) rf_optim_free(o);
}

void rf_optim_free(struct rf_optim *o) {
  if (!o) return;
  if (o->holders > 0) {
    o->free_pending = 1;
    return;
  }
  rf_device_stream_synchronize(o->dev, o->stream); /* its step's work done before its state goes */
  o->ops->free(o);
  rf_device_stream_free(o->dev, o->own_stream);
  free(o->views);
  free(o);
}

/* ---- step, state, stats ------------------------------------------------------ */

int rf_optim_step(struct rf_optim *o, float lr) {
  RF_REQUIRE_ARG("rf_optim_step", o);
  RF_REQUIRE(isfinite(lr) && lr >= 0, "rf_optim_step: the learning rate %g is not a finite number >= 0", lr);
  const char *unit = o->fsdp ? o->grads_unfinished(o->fsdp) : NULL;
  RF_REQUIRE(!unit,
             "rf_optim_step: unit %s's gradients are not finished (rf_fsdp_backward_end, then "
             "rf_fsdp_grads_finish, before the step)",
             unit);
  if (o->before_step) o->before_step(o->before_step_ctx);
  o->step++;
  o->stats.steps++;
  return o->ops->step(o, lr);
}

void rf_optim_set_before_step(struct rf_optim *o, void (*fn)(void *ctx), void *ctx) {
  o->before_step = fn;
  o->before_step_ctx = ctx;
}

enum rf_optim_kind rf_optim_get_kind(const struct rf_optim *o) { return o->opt.kind; }
int64_t rf_optim_get_step(const struct rf_optim *o) { return o->step; }
void rf_optim_set_step(struct rf_optim *o, int64_t step) { o->step = step; }

int rf_optim_n_states(const struct rf_optim *o) { return o->ops->n_states; }

void rf_optim_state(const struct rf_optim *o, int i, struct rf_optim_state_slab *out) {
  RF_ASSERT(i >= 0 && i < o->ops->n_states);
  memset(out, 0, sizeof *out);
  o->ops->state(o, i, out);
}

void rf_optim_scales(const struct rf_optim *o, int view, int64_t *offset, int64_t *count, int64_t *first) {
  RF_ASSERT(view >= 0 && view < o->n);
  *offset = *count = *first = 0;
  if (o->ops->scales) o->ops->scales(o, view, offset, count, first);
}

int64_t rf_optim_tensor_blocks(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  return o->ops->tensor_blocks ? o->ops->tensor_blocks(o, view) : 0;
}

void rf_optim_get_stats(const struct rf_optim *o, struct rf_optim_stats *out) {
  *out = o->stats;
  /* a step's memory traffic, priced by the ops' bytes per element (the slab's
   * elements, padding included, as the element-wise pass runs over them) */
  int64_t matrix = 0;
  for (int i = 0; i < o->n; i++)
    if (o->views[i].flags & RF_OPTIM_FLAG_MATRIX) matrix += o->views[i].v.end - o->views[i].v.begin;
  out->step_stream_bytes =
      (double)(o->shard_elems - matrix) * o->ops->elem_bytes + (double)matrix * o->ops->matrix_elem_bytes;
  if (o->ops->stats) o->ops->stats(o, out);
}

int rf_optim_muon_owner(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  return o->ops->owner ? o->ops->owner(o, view) : -1;
}

int64_t rf_optim_muon_count(const struct rf_optim *o, int view) {
  RF_ASSERT(view >= 0 && view < o->n);
  return o->ops->owner_count ? o->ops->owner_count(o, view) : 0;
}
