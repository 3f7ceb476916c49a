/* src/run: the run layer behind include/rfsdp_run.h: the whole training state
 * saved and resumed through src/ckpt (save.c), the optimizer's states as
 * checkpoint states (states.c), and the checkpoint series (series.c). */
#ifndef RF_RUN_H
#define RF_RUN_H

#include "ckpt/ckpt.h"
#include "fsdp/fsdp.h"
#include "optim/optim.h"
#include "rfsdp_run.h"

#define RF_RUN_MAX_STATES 8

/* The optimizer's state slabs as checkpoint states, saved as the tensor name +
 * ".<optimizer>.<slab>" (e.g. "layers.0.wq.adamw8bit.m_code"). Slabs in the shard
 * layout are addressed like the master weights; per-block scales (8-bit AdamW)
 * through rf_optim_scales. Borrows the optimizer. */
struct rf_run_states {
  int n;
  struct rf_ckpt_state_desc desc[RF_RUN_MAX_STATES];
  char suffix[RF_RUN_MAX_STATES][40];
  struct rf_run_scale_ctx {
    const struct rf_optim *optim;
    float *slab;
  } scale[RF_RUN_MAX_STATES];
};

/* Fills st for optimizer o (NULL: no states). */
void rf_run_states_make(const struct rf_optim *o, struct rf_run_states *st);

/* The "extra" object of a save (a new string), or NULL when program_json is not an
 * object (save.c). */
char *rf_run_extra(const struct rf_run *run, const char *program_json);
/* The testing hook of a save of `step`: the last rank exits 137 when `step` is the
 * one given to rf_run_test_die_in_save (save.c). */
void rf_run_die_check(const struct rf_fsdp *f, int64_t step);
/* Removes this run's checkpoints of s beyond its last s->keep, up to `step`, on
 * the mesh's first rank (series.c). Local: no barrier. */
void rf_run_series_rotate(const struct rf_run_series *s, const struct rf_fsdp *f, int64_t step);
/* The signals taken so far by the signal thread and by the fallback handler (on a
 * thread started before rf_run_catch_signals): tests/test_signal_gemm.c (signal.c). */
void rf_run_signal_stats(int *waited, int *handled);

#endif
