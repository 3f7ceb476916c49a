/* The optimizer's state slabs as checkpoint state descriptors (src/ckpt's
 * rf_ckpt_state_desc): what rf_run_save writes and rf_run_resume reads. */
#include <string.h>

#include "run/run.h"

static void rf_run_scale_piece(void *ctx, const struct rf_tensor_view *view, int index,
                               struct rf_ckpt_state_piece *out) {
  (void)view; /* the optimizer knows its blocks by index */
  const struct rf_run_scale_ctx *c = ctx;
  int64_t offset, count, first;
  rf_optim_scales(c->optim, index, &offset, &count, &first);
  out->numel = rf_optim_tensor_blocks(c->optim, index);
  out->begin = count > 0 ? first : 0;
  out->end = out->begin + count;
  out->data = c->slab + offset;
}

void rf_run_states_make(const struct rf_optim *o, struct rf_run_states *st) {
  memset(st, 0, sizeof *st);
  if (!o) return;
  st->n = rf_optim_n_states(o);
  RF_ASSERT(st->n <= RF_RUN_MAX_STATES);
  const char *kind = rf_optim_kind_name(rf_optim_get_kind(o));
  for (int i = 0; i < st->n; i++) {
    struct rf_optim_state_slab slab;
    rf_optim_state(o, i, &slab);
    snprintf(st->suffix[i], sizeof st->suffix[i], ".%s.%s", kind, slab.name);
    struct rf_ckpt_state_desc *d = &st->desc[i];
    d->suffix = st->suffix[i];
    d->dtype = slab.dtype;
    if (slab.shard_layout) {
      d->slab = slab.data;
    } else {
      st->scale[i] = (struct rf_run_scale_ctx){o, slab.data};
      d->piece = rf_run_scale_piece;
      d->ctx = &st->scale[i];
    }
  }
}
