/* Every rank's spans (src/core/trace.h) merged into one Chrome trace event file
 * (JSON: {"traceEvents": [...]}, the format Perfetto and chrome://tracing open):
 * one process per rank (pid = the rank, named "rank R (host)"), one thread per lane
 * (named by rf_trace_lane_name), a complete event ("ph": "X") per span with its
 * step, unit and bytes in "args".
 *
 * Clocks. Spans carry each rank's CLOCK_MONOTONIC. Ranks of one machine (one boot of
 * one kernel: /proc/sys/kernel/random/boot_id; network namespaces included) share that
 * clock and are not corrected. Another machine's clock differs by an unknown offset,
 * estimated here: five times, every rank reads its clock right after a barrier over the
 * mesh and the readings are gathered; the machine's offset is the median of its ranks'
 * (reading - rank 0's). Its error is the barrier's exit skew (a network latency and
 * scheduling); the file's metadata states the offsets used. Times are microseconds from
 * the earliest span of any rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/trace.h"
#include "run/run.h"

#define RF_TRACE_SYNC_ROUNDS 5

/* The mesh's ranks in world order: replicate rank major, shard rank minor. */
static int rf_trace_world(const struct rf_comm_mesh *m) { return m->shard.world * m->replicate.world; }
static int rf_trace_rank(const struct rf_comm_mesh *m) {
  return m->replicate.rank * m->shard.world + m->shard.rank;
}

/* Every rank's `count` i64 values, world-ordered, into all[world * count]. */
static void rf_trace_allgather_i64(const struct rf_comm_mesh *m, const int64_t *mine, int count,
                                   int64_t *all) {
  int S = m->shard.world, R = m->replicate.world;
  int64_t *row = all + (size_t)m->replicate.rank * S * count;
  memcpy(row + (size_t)m->shard.rank * count, mine, (size_t)count * sizeof *mine);
  rf_comm_allgather(&m->shard, row, count, RF_DTYPE_I64);
  if (R > 1) rf_comm_allgather(&m->replicate, all, (int64_t)S * count, RF_DTYPE_I64);
}

static void rf_trace_barrier(const struct rf_comm_mesh *m) {
  rf_comm_barrier(&m->shard);
  if (m->replicate.world > 1) {
    rf_comm_barrier(&m->replicate);
    rf_comm_barrier(&m->shard);
  }
}

/* This machine's boot (the kernel's boot_id, hashed): ranks that share it share CLOCK_MONOTONIC. */
static int64_t rf_trace_boot_id(void) {
  char id[64] = "";
  FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (!fgets(id, sizeof id, f)) id[0] = 0;
    fclose(f);
  }
  if (!id[0]) gethostname(id, sizeof id - 1);
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (const char *p = id; *p && *p != '\n'; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
  return (int64_t)(h >> 1);
}

static int rf_trace_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* This rank's events as JSON text (a new string, NUL-terminated, each event followed by ",\n"). */
static char *rf_trace_events(int rank, int64_t offset, int64_t base, const char *host, size_t *len) {
  size_t n = 0;
  const struct rf_trace_span *sp = rf_trace_spans(&n);
  size_t cap = 512 + (size_t)RF_TRACE_LANES * 128 + n * 224, k = 0;
  char *s = rf_xmalloc(cap);
  k += (size_t)snprintf(
      s + k, cap - k,
      "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d (%s)\"}},\n"
      "{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}},\n",
      rank, rank, host, rank, rank);
  for (int l = 0; l < RF_TRACE_LANES; l++)
    k += (size_t)snprintf(
        s + k, cap - k,
        "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}},\n"
        "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":"
        "{\"sort_index\":%d}},\n",
        rank, l, rf_trace_lane_name((enum rf_trace_lane)l), rank, l, l);
  for (size_t i = 0; i < n; i++) {
    const struct rf_trace_span *x = &sp[i];
    double ts = (double)((int64_t)x->t0 - offset - base) / 1e3, dur = (double)(x->t1 - x->t0) / 1e3;
    k += (size_t)snprintf(
        s + k, cap - k,
        "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"%s\",\"cat\":\"%s\","
        "\"args\":{\"step\":%lld",
        rank, x->lane, ts, dur, x->name, rf_trace_lane_name((enum rf_trace_lane)x->lane), (long long)x->step);
    if (x->unit >= 0) k += (size_t)snprintf(s + k, cap - k, ",\"unit\":%d", x->unit);
    if (x->bytes >= 0) k += (size_t)snprintf(s + k, cap - k, ",\"bytes\":%lld", (long long)x->bytes);
    k += (size_t)snprintf(s + k, cap - k, "}},\n");
  }
  *len = k;
  return s;
}

int rf_run_trace_start(const struct rf_fsdp *f, int64_t first_step, int64_t last_step) {
  if (!f) RF_FAIL("rf_run_trace_start: the context is NULL");
  if (first_step < 1 || last_step < first_step)
    RF_FAIL("the traced steps %lld:%lld: expected 1 <= A <= B", (long long)first_step, (long long)last_step);
  /* per step and unit: forward, backward, their gather and reduce spans and waits (two of each for
   * prefetched or re-gathered units, a few buffers each), and a margin for the step's own spans */
  int64_t steps = rf_min_i64(last_step - first_step + 1, 100000);
  int64_t per_step = 16 * (int64_t)(f->n_units + 1) * (f->n_units ? f->units[0].db.n_buffers + 1 : 2) + 256;
  rf_trace_init((size_t)rf_min_i64(steps * per_step, (int64_t)1 << 24), first_step, last_step);
  return 0;
}

void rf_run_trace_step(int64_t step) { rf_trace_step(step); }

void rf_run_trace_stop(void) { rf_trace_free(); }

uint64_t rf_run_trace_now(void) { return rf_trace_now(); }

void rf_run_trace_span(enum rf_trace_lane lane, const char *name, uint64_t t0) {
  if (t0) rf_trace_span(lane, name, t0, rf_time_ns(), -1, -1);
}

/* The length of the union of the spans of `lanes` (a bit mask), on this rank. */
static uint64_t rf_trace_union_ns(const struct rf_trace_span *sp, size_t n, unsigned lanes) {
  uint64_t *iv = rf_xmalloc(2 * (n ? n : 1) * sizeof *iv);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (lanes & (1u << sp[i].lane)) {
      iv[2 * k] = sp[i].t0;
      iv[2 * k + 1] = sp[i].t1;
      k++;
    }
  /* sort by start (insertion sort on few spans would be quadratic for long windows: qsort of pairs) */
  qsort(iv, k, 2 * sizeof *iv, rf_trace_cmp_i64);
  uint64_t total = 0, end = 0;
  for (size_t i = 0; i < k; i++) {
    uint64_t a = iv[2 * i], b = iv[2 * i + 1];
    if (a < end) a = end;
    if (b > a) {
      total += b - a;
      end = b;
    }
  }
  free(iv);
  return total;
}

int rf_run_trace_summary(const struct rf_fsdp *f, struct rf_run_trace_summary *out) {
  if (!f || !out) RF_FAIL("rf_run_trace_summary: a NULL argument");
  size_t n = 0;
  const struct rf_trace_span *sp = rf_trace_spans(&n);
  uint64_t exposed = 0;
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (size_t i = 0; i < n; i++) {
    if (sp[i].lane == RF_TRACE_LANE_COMPUTE && strncmp(sp[i].name, "wait", 4) == 0)
      exposed += sp[i].t1 - sp[i].t0;
    lo = rf_min_i64(lo, sp[i].step);
    hi = rf_max_i64(hi, sp[i].step);
  }
  uint64_t comm = rf_trace_union_ns(
      sp, n, 1u << RF_TRACE_LANE_GATHER | 1u << RF_TRACE_LANE_REDUCE | 1u << RF_TRACE_LANE_REPLICATE);
  double steps = n ? (double)(hi - lo + 1) : 1.0;
  /* the worst rank's exposed time and communication (the step waits for it), the lowest overlap */
  double v[4] = {(double)exposed / 1e6 / steps, (double)comm / 1e6 / steps,
                 -(comm ? 1.0 - (double)exposed / (double)comm : 1.0), (double)rf_trace_dropped()};
  rf_comm_allreduce(&f->mesh.shard, v, 4, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
  if (f->mesh.replicate.world > 1)
    rf_comm_allreduce(&f->mesh.replicate, v, 4, RF_DTYPE_F64, RF_REDUCE_OP_MAX);
  int64_t k = (int64_t)n;
  rf_comm_allreduce(&f->mesh.shard, &k, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  if (f->mesh.replicate.world > 1)
    rf_comm_allreduce(&f->mesh.replicate, &k, 1, RF_DTYPE_I64, RF_REDUCE_OP_SUM);
  *out = (struct rf_run_trace_summary){.steps = n ? hi - lo + 1 : 0,
                                       .exposed_ms_per_step = v[0],
                                       .comm_ms_per_step = v[1],
                                       .overlap = v[2] > 0 ? 0 : -v[2],
                                       .spans = (uint64_t)k,
                                       .dropped = (uint64_t)v[3]};
  return 0;
}

int rf_run_trace_write(const struct rf_fsdp *f, const char *path) {
  if (!f || !path) RF_FAIL("rf_run_trace_write: a NULL argument");
  const struct rf_comm_mesh *m = &f->mesh;
  int world = rf_trace_world(m), rank = rf_trace_rank(m);
  /* clock offsets against rank 0: none between ranks of one machine (one kernel, one boot: one
   * CLOCK_MONOTONIC); a machine's offset is the median of its ranks' barrier-aligned differences */
  int64_t *all = rf_xmalloc((size_t)world * (RF_TRACE_SYNC_ROUNDS + 1) * sizeof *all);
  int64_t *mine = rf_xmalloc((size_t)world * sizeof *mine);
  int64_t reading[RF_TRACE_SYNC_ROUNDS + 1];
  reading[RF_TRACE_SYNC_ROUNDS] = rf_trace_boot_id();
  for (int k = 0; k < RF_TRACE_SYNC_ROUNDS; k++) {
    rf_trace_barrier(m);
    reading[k] = (int64_t)rf_time_ns();
  }
  const int w = RF_TRACE_SYNC_ROUNDS + 1;
  rf_trace_allgather_i64(m, reading, w, all);
  int64_t *diffs = rf_xmalloc((size_t)world * RF_TRACE_SYNC_ROUNDS * sizeof *diffs);
  for (int r = 0; r < world; r++) {
    int64_t boot = all[(size_t)r * w + RF_TRACE_SYNC_ROUNDS];
    if (boot == all[RF_TRACE_SYNC_ROUNDS]) {
      mine[r] = 0;
      continue;
    }
    int nd = 0;
    for (int q = 0; q < world; q++)
      if (all[(size_t)q * w + RF_TRACE_SYNC_ROUNDS] == boot)
        for (int k = 0; k < RF_TRACE_SYNC_ROUNDS; k++) diffs[nd++] = all[(size_t)q * w + k] - all[k];
    qsort(diffs, (size_t)nd, sizeof diffs[0], rf_trace_cmp_i64);
    mine[r] = diffs[nd / 2];
  }
  free(diffs);
  int64_t offset = mine[rank];
  /* the earliest span of any rank, on rank 0's clock */
  size_t n = 0;
  const struct rf_trace_span *sp = rf_trace_spans(&n);
  int64_t first[2] = {INT64_MAX, (int64_t)rf_trace_dropped()};
  for (size_t i = 0; i < n; i++)
    if ((int64_t)sp[i].t0 - offset < first[0]) first[0] = (int64_t)sp[i].t0 - offset;
  int64_t *firsts = rf_xmalloc((size_t)world * 2 * sizeof *firsts);
  rf_trace_allgather_i64(m, first, 2, firsts);
  int64_t base = INT64_MAX, dropped = 0;
  for (int r = 0; r < world; r++) {
    if (firsts[2 * r] < base) base = firsts[2 * r];
    dropped += firsts[2 * r + 1];
  }
  if (base == INT64_MAX) base = 0;
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  size_t len = 0;
  char *text = rf_trace_events(rank, offset, base, host, &len);
  /* the events' byte counts, then the bytes, to every rank (rank 0 writes) */
  int64_t mylen = (int64_t)len;
  int64_t *lens = rf_xmalloc((size_t)world * sizeof *lens);
  rf_trace_allgather_i64(m, &mylen, 1, lens);
  int64_t total = 0;
  int64_t *starts = rf_xmalloc((size_t)(world + 1) * sizeof *starts);
  for (int r = 0; r < world; r++) {
    starts[r] = total;
    total += lens[r];
  }
  starts[world] = total;
  char *merged = rf_xmalloc((size_t)total + 1);
  memcpy(merged + starts[rank], text, len);
  /* shard groups first (their ranks are contiguous in world order), then across the groups */
  int S = m->shard.world;
  int64_t *sstarts = rf_xmalloc((size_t)(S + 1) * sizeof *sstarts);
  int64_t g0 = starts[m->replicate.rank * S];
  for (int s = 0; s <= S; s++) sstarts[s] = starts[m->replicate.rank * S + s] - g0;
  rf_comm_allgatherv(&m->shard, merged + g0, sstarts, RF_DTYPE_U8);
  if (m->replicate.world > 1) {
    int R = m->replicate.world;
    int64_t *rstarts = rf_xmalloc((size_t)(R + 1) * sizeof *rstarts);
    for (int g = 0; g <= R; g++) rstarts[g] = starts[g * S];
    rf_comm_allgatherv(&m->replicate, merged, rstarts, RF_DTYPE_U8);
    free(rstarts);
  }
  int status = 0;
  if (rank == 0) {
    FILE *out = fopen(path, "w");
    if (!out) {
      status = rf_error_set(__FILE__, __LINE__, "--trace %s: cannot write the trace", path);
    } else {
      fprintf(out,
              "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"rfsdp\",\"ranks\":%d,"
              "\"dropped_spans\":%lld,\"clock_offsets_ns\":[",
              world, (long long)dropped);
      for (int r = 0; r < world; r++) fprintf(out, "%s%lld", r ? "," : "", (long long)mine[r]);
      fputs(
          "],\"clock\":\"CLOCK_MONOTONIC; ranks of rank 0's machine (boot id) uncorrected, another machine's "
          "offset the median of its ranks' differences over 5 barrier-aligned "
          "readings\"},\n\"traceEvents\":[\n",
          out);
      /* the last event's ",\n" becomes "\n" */
      if (total >= 2) fwrite(merged, 1, (size_t)total - 2, out);
      fputs("\n]}\n", out);
      if (fclose(out) != 0)
        status = rf_error_set(__FILE__, __LINE__, "--trace %s: cannot write the trace", path);
    }
  }
  free(sstarts);
  free(merged);
  free(starts);
  free(lens);
  free(text);
  free(firsts);
  free(mine);
  free(all);
  return rf_comm_mesh_agree(m, status) == 0 ? 0 : -1;
}
