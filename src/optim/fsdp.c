/* src/optim: an optimizer over every tensor of a runtime context. Kept in its
 * own file so that programs that build views themselves do not link the runtime. */
#include <math.h>

#include "core/trace.h"
#include "fsdp/fsdp.h"
#include "optim/optim.h"

int rf_optim_create_fsdp(struct rf_optim **out, const struct rf_optim_options *opt, const struct rf_fsdp *f,
                         const int *flags, const struct rf_comm *comm) {
  RF_REQUIRE_ARG("rf_optim_create_fsdp", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_optim_create_fsdp", opt);
  RF_REQUIRE_ARG("rf_optim_create_fsdp", f);
  RF_REQUIRE(f->finalized, "rf_optim_create_fsdp: the context is not finalized (rf_fsdp_finalize first)");
  int n = rf_fsdp_n_tensors(f);
  RF_REQUIRE(n >= 0, "optim: the runtime context has %d tensors", n);
  RF_TRY(rf_optim_create_on(out, opt, rf_fsdp_views(f), flags, n, rf_fsdp_shard_elems(f),
                            comm ? comm : &f->mesh.shard, f->device, f->stream[RF_FSDP_STREAM_COMPUTE]));
  (*out)->fsdp = f;
  (*out)->grads_unfinished = rf_fsdp_grads_unfinished;
  return 0;
}

int rf_optim_step_fsdp(struct rf_optim *o, struct rf_fsdp *f, float lr, double clip, double *norm) {
  RF_REQUIRE(o && f && norm, "rf_optim_step_fsdp: no optimizer, runtime context or norm");
  RF_REQUIRE(isfinite(lr) && lr >= 0 && isfinite(clip) && clip >= 0,
             "rf_optim_step_fsdp: learning rate %g and clip %g must be finite and >= 0", lr, clip);
  *norm = NAN;
  RF_TRY(rf_fsdp_status(f)); /* FP8: a weight's tile with NaN or Inf, the same on every rank */
  uint64_t t = rf_trace_now();
  rf_fsdp_grads_finish(f);
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "gradients finished", t, rf_time_ns(), -1, -1);
  t = rf_trace_now();
  *norm = rf_fsdp_grad_norm(f); /* non-finite on every rank when on any */
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "grad norm", t, rf_time_ns(), -1, -1);
  if (!isfinite(*norm)) return 1;
  rf_fsdp_clip_grads(f, *norm, clip);
  t = rf_trace_now();
  int rc = rf_optim_step(o, lr);
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "optimizer step", t, rf_time_ns(), -1, -1);
  return rc;
}

int rf_optim_step_fsdp_launch(struct rf_optim *o, struct rf_fsdp *f, float lr, double clip, double *norm,
                              const double **sumsq) {
  RF_REQUIRE(o && f && norm && sumsq, "rf_optim_step_fsdp: no optimizer, runtime context or norm");
  *sumsq = NULL;
  if (!o->ops->device_clip) return rf_optim_step_fsdp(o, f, lr, clip, norm);
  RF_REQUIRE(isfinite(lr) && lr >= 0 && isfinite(clip) && clip >= 0,
             "rf_optim_step_fsdp: learning rate %g and clip %g must be finite and >= 0", lr, clip);
  *norm = NAN;
  RF_TRY(rf_fsdp_status(f)); /* FP8: a weight's tile with NaN or Inf, the same on every rank */
  uint64_t t = rf_trace_now();
  rf_fsdp_grads_finish(f);
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "gradients finished", t, rf_time_ns(), -1, -1);
  t = rf_trace_now();
  rf_fsdp_grad_norm_on_device(f, clip); /* the sum and the clip factor, on the device */
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "grad norm", t, rf_time_ns(), -1, -1);
  t = rf_trace_now();
  o->gscale = f->gscale; /* NaN: the kernels skip the update */
  int rc = rf_optim_step(o, lr);
  o->gscale = NULL;
  if (t) rf_trace_span(RF_TRACE_LANE_COMPUTE, "optimizer step", t, rf_time_ns(), -1, -1);
  if (rc == 0) *sumsq = f->sumsq;
  return rc;
}

int rf_optim_step_fsdp_settle(struct rf_optim *o, double sumsq, double *norm) {
  *norm = sqrt(sumsq);
  if (isfinite(*norm)) return 0;
  o->step--; /* rf_optim_step counted the step its kernels skipped */
  o->stats.steps--;
  return 1;
}
