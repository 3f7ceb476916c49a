/* The in-memory span recorder behind src/core/trace.h. */
#include "core/trace.h"

#include <stdlib.h>

#include "core/core.h"

int rf_trace_active;

static struct rf_trace_span *rf_trace_buf; /* owned: [rf_trace_cap] */
static size_t rf_trace_cap;
static size_t rf_trace_next; /* atomic: the next free index (may exceed the capacity) */
static int64_t rf_trace_first, rf_trace_last, rf_trace_cur;

void rf_trace_init(size_t max_spans, int64_t first_step, int64_t last_step) {
  rf_trace_free();
  rf_trace_buf = rf_xcalloc(max_spans ? max_spans : 1, sizeof *rf_trace_buf);
  rf_trace_cap = max_spans;
  rf_trace_first = first_step;
  rf_trace_last = last_step;
  __atomic_store_n(&rf_trace_next, 0, __ATOMIC_RELAXED);
}

void rf_trace_free(void) {
  __atomic_store_n(&rf_trace_active, 0, __ATOMIC_RELAXED);
  free(rf_trace_buf);
  rf_trace_buf = NULL;
  rf_trace_cap = 0;
}

void rf_trace_step(int64_t step) {
  __atomic_store_n(&rf_trace_cur, step, __ATOMIC_RELAXED);
  int on = rf_trace_buf && step >= rf_trace_first && step <= rf_trace_last;
  __atomic_store_n(&rf_trace_active, on, __ATOMIC_RELAXED);
}

void rf_trace_span(enum rf_trace_lane lane, const char *name, uint64_t t0, uint64_t t1, int unit,
                   int64_t bytes) {
  if (!__atomic_load_n(&rf_trace_active, __ATOMIC_RELAXED) || t0 == 0) return;
  size_t i = __atomic_fetch_add(&rf_trace_next, 1, __ATOMIC_RELAXED);
  if (i >= rf_trace_cap) return; /* counted as dropped */
  rf_trace_buf[i] = (struct rf_trace_span){.t0 = t0,
                                           .t1 = t1 < t0 ? t0 : t1,
                                           .name = name,
                                           .step = __atomic_load_n(&rf_trace_cur, __ATOMIC_RELAXED),
                                           .bytes = bytes,
                                           .lane = (int32_t)lane,
                                           .unit = (int32_t)unit};
}

const struct rf_trace_span *rf_trace_spans(size_t *n) {
  size_t k = __atomic_load_n(&rf_trace_next, __ATOMIC_ACQUIRE);
  *n = k < rf_trace_cap ? k : rf_trace_cap;
  return rf_trace_buf;
}

uint64_t rf_trace_dropped(void) {
  size_t k = __atomic_load_n(&rf_trace_next, __ATOMIC_ACQUIRE);
  return k > rf_trace_cap ? (uint64_t)(k - rf_trace_cap) : 0;
}

const char *rf_trace_lane_name(enum rf_trace_lane lane) {
  static const char *names[RF_TRACE_LANES] = {
      "compute",           "gather",  "reduce", "replicate all-reduce", "data", "checkpoint",
      "async-save writer", "watchdog"};
  return (int)lane >= 0 && lane < RF_TRACE_LANES ? names[lane] : "?";
}
