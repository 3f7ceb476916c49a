/* The step's timeline, recorded in memory (`rfsdp train --trace`, issue 38).
 *
 * A span is a lane, a static name, a start and an end on the monotonic clock
 * (rf_time_ns), the step, and optionally the unit and the bytes it moved. Lanes are
 * the tracks a reader wants side by side: the training thread's compute (each unit's
 * forward and backward, the optimizer step, the agreements, with the waits for a
 * collective nested inside as "wait ..." spans: the exposed communication), each
 * collective kind from issue to observed completion, checkpoint writes, data loading,
 * the async-save writer, the watchdog.
 *
 * Cost. Off (the default), every hook is one load and one predictable branch on
 * rf_trace_active; on, a span is an atomic increment and a 48-byte store into a
 * buffer allocated once by rf_trace_init (full: later spans are counted as dropped).
 * Spans come from any thread. The recorder is outside every step's allocation.
 * Writing the file is src/run's (rf_run_trace_write: every rank's spans merged). */
#ifndef RF_CORE_TRACE_H
#define RF_CORE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "core/core.h"

/* enum rf_trace_lane (the lanes): include/rfsdp_types.h, public for rf_run_trace_span. */

struct rf_trace_span {
  uint64_t t0, t1;  /* rf_time_ns */
  const char *name; /* static storage */
  int64_t step;     /* the optimizer step (1-based) the span belongs to */
  int64_t bytes;    /* moved or written; -1: none */
  int32_t lane;     /* enum rf_trace_lane */
  int32_t unit;     /* the runtime unit; -1: none */
};

/* 1 while spans are recorded (inside the window of steps). */
extern int rf_trace_active;

/* Allocates room for max_spans spans and records the steps first..last (1-based,
 * inclusive) once rf_trace_step says they have begun. Call once, at set-up. */
void rf_trace_init(size_t max_spans, int64_t first_step, int64_t last_step);
void rf_trace_free(void);
/* Step `step` (1-based) begins: recording turns on inside the window, off outside. */
void rf_trace_step(int64_t step);
/* A span [t0, t1] on `lane`. */
void rf_trace_span(enum rf_trace_lane lane, const char *name, uint64_t t0, uint64_t t1, int unit,
                   int64_t bytes);
/* rf_time_ns() when tracing, else 0: a hook's start time costs nothing when off. */
static inline uint64_t rf_trace_now(void) { return rf_trace_active ? rf_time_ns() : 0; }
/* The spans recorded so far (borrowed), and those that did not fit. */
const struct rf_trace_span *rf_trace_spans(size_t *n);
uint64_t rf_trace_dropped(void);
/* The lane's name in the trace ("compute", "gather", ...). */
const char *rf_trace_lane_name(enum rf_trace_lane lane);

#endif
