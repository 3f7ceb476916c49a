/* rf-test: timeout=60
 * The simulator prices HSDP's replica all-reduce as the runtime schedules it
 * (src/fsdp/schedule.c): each unit's gradient shard all-reduced on its own,
 * started non-blocking when that unit's reduce-scatter is finished, in backward
 * order, one after another on the replicas' link, overlapped with the rest of
 * the backward; only what is left when the backward ends is exposed
 * (src/sim/simulate.c). The reference here is independent of the simulator's
 * closed form: a tick-by-tick replay of the runtime's protocol (two grad slots:
 * the backward of unit v begins by finishing the reduce of v + 2, which starts
 * its all-reduce; rf_fsdp_grads_finish starts units 1 and 0's; a FIFO link that
 * moves at the profile's `overlap` rate while compute runs and at full rate
 * after), on 2 replicas of shard groups of 1 (the 2 hosts x 1 rank layout of
 * bench/hosts.sh: no gathers or reduce-scatters, so a unit's backward is 2/3 of
 * its compute), for 1..6 units of random sizes, random links, compute and
 * overlap 1, 0.5, 0; every case within two ticks per unit, and at least a
 * quarter of the cases hide more than 10% of the all-reduces (where pricing them
 * after the backward, as before, fails). Bytes do not move: the gradient shard
 * all-reduced once per step (bytes_inter = the slab, f32). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"
#include "rf_test.h"
#include "sim/sim.h"

#define MAX_UNITS 6
#define DT 1e-4 /* ms per tick */

/* The runtime's backward of n units (b[u] ms of compute each, from n - 1 down to
 * 0) and its replica all-reduces (d[u] ms of link time each), ticked: returns how
 * long the last all-reduce ends after the backward's compute (0: hidden). */
static double ref_exposed(int n, const double *b, const double *d, double ov) {
  int queue[MAX_UNITS], qn = 0, head = 0;
  double t = 0, left = 0, end = -1, comp = b[n - 1];
  int v = n - 1;
  /* backward_begin(n - 1), (n - 2): a grad slot free; nothing finishes */
  while (end < 0 || head < qn) {
    if (end < 0 && comp <= 0) { /* unit v's backward ended */
      if (v == 0) {
        end = t; /* rf_fsdp_grads_finish: the units still reducing, highest first */
        for (int u = n < 2 ? 0 : 1; u >= 0; u--) queue[qn++] = u;
      } else {
        v--;
        comp = b[v];
        if (v + 2 <= n - 1) queue[qn++] = v + 2; /* both slots busy: finish v + 2, start its all-reduce */
      }
      if (head < qn && left <= 0) left = d[queue[head]];
      continue;
    }
    if (head < qn) {
      if (left <= 0) left = d[queue[head]];
      left -= DT * (end < 0 ? ov : 1.0);
      if (left <= 1e-12) {
        head++;
        left = head < qn ? d[queue[head]] : 0;
        /* a zero-length all-reduce never waits a tick */
      }
    }
    if (end < 0) comp -= DT;
    t += DT;
  }
  return t - end;
}

static uint64_t rng = 12345;
static int hidden_cases; /* cases where the overlap hides more than 10% of the all-reduces */
static double uniform(void) {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng >> 11) / 9007199254740992.0;
}

static void one_case(int n, double ov, int k) {
  static const char *const names[MAX_UNITS] = {"u0", "u1", "u2", "u3", "u4", "u5"};
  struct rf_plan_tensor_in t[MAX_UNITS];
  struct rf_plan_unit_in units[MAX_UNITS];
  const struct rf_plan_policy p = {.layout = RF_LAYOUT_PLANNED,
                                   .shard = RF_SHARD_MODE_EQUAL,
                                   .max_buffers = 1,
                                   .align_bytes = 64,
                                   .param_dtype = RF_DTYPE_F32,
                                   .reduce_dtype = RF_DTYPE_F32,
                                   .block_rows = 1,
                                   .vector_block = 1};
  int64_t total = 0;
  for (int u = 0; u < n; u++) {
    memset(&t[u], 0, sizeof t[u]);
    t[u].name = names[u];
    t[u].ndim = 1;
    t[u].shape[0] = t[u].numel = 16 * (1 + (int64_t)(uniform() * 20000)); /* whole 64-byte lines */
    t[u].block_elems = rf_plan_block_elems(&p, 1, t[u].shape, 0);
    t[u].sub_count = 1;
    units[u] = (struct rf_plan_unit_in){.name = names[u], .n_tensors = 1, .tensors = &t[u]};
    total += t[u].numel;
  }
  double alpha_us = uniform() * 2000, busbw = 0.01 * pow(10, 3 * uniform()), compute = 1 + uniform() * 200;
  struct rf_plan_model_result m;
  RF_ASSERT(rf_plan_model_make(units, n, &p, 1, 0, &m) == 0);
  struct rf_sim_options o = {.replicate = 2,
                             .rank = 0,
                             .prefetch = 1,
                             .reshard_after_forward = 1,
                             .accum = 1,
                             .tokens_per_rank = 1,
                             .flops_per_token = compute * 1e6, /* compute ms at 1 GFLOP/s */
                             .scalar_reduce_bytes = 12};
  rf_optim_options_default(&o.optim);
  o.net = (struct rf_sim_network){.cores_per_node = 1,
                                  .ranks_per_node = 1,
                                  .peak_gflops = 1,
                                  .peak_gflops_f32 = 1,
                                  .efficiency = 1,
                                  .mem_gbs = 10,
                                  .overlap = ov};
  for (int c = 0; c < RF_SIM_COLL_COUNT; c++)
    o.net.inter[c] = o.net.intra[c] = (struct rf_sim_link){alpha_us, busbw};
  snprintf(o.net.name, sizeof o.net.name, "test");
  struct rf_sim_result r;
  int rc = rf_sim_step(units, &m, &p, &o, &r);
  RF_CHECK(rc == 0, "case %d: rf_sim_step: %s", k, rf_error_msg());
  double b[MAX_UNITS] = {0}, d[MAX_UNITS] = {0};
  for (int u = 0; u < n; u++) {
    b[u] = 2.0 / 3.0 * compute * (double)t[u].numel / (double)total;
    /* the alpha-beta model of docs/scale.md at n = 2: alpha + 2 (1/2) B / busbw */
    d[u] = alpha_us * 1e-3 + 4.0 * (double)t[u].numel / (busbw * 1e9) * 1e3;
  }
  double want = ref_exposed(n, b, d, ov);
  double all = 0;
  for (int u = 0; u < n; u++) all += d[u];
  if (all - want > 0.1 * all) hidden_cases++; /* the blocking all-reduce at the end would fail here */
  if (getenv("RF_TEST_VERBOSE"))
    printf("case %d: %d units, overlap %g: exposed %.6f ms, replayed %.6f, all-reduces %.6f\n", k, n, ov,
           r.replica_exposed_ms, want, all);
  RF_CHECK(fabs(r.replica_exposed_ms - want) <= 2 * DT * (n + 1) + 1e-9 * want,
           "case %d: %d units, overlap %g, alpha %.1f us, busbw %.4f GB/s, compute %.3f ms: the replicas' "
           "all-reduce exposes %.6f ms, the runtime's schedule replayed %.6f ms",
           k, n, ov, alpha_us, busbw, compute, r.replica_exposed_ms, want);
  /* the rest of the exposed time: the world's scalars (12 B) at n = 2; nothing hides them */
  double scal = alpha_us * 1e-3 + 12.0 / (busbw * 1e9) * 1e3;
  RF_CHECK(fabs(r.exposed_comm_ms - r.replica_exposed_ms - scal) < 1e-9 * (1 + r.exposed_comm_ms),
           "case %d: exposed %.9f ms = replicas %.9f + scalars %.9f", k, r.exposed_comm_ms,
           r.replica_exposed_ms, scal);
  RF_CHECK(fabs(r.compute_ms - compute) < 1e-9 * compute, "case %d: compute %.9f, want %.9f", k, r.compute_ms,
           compute);
  RF_CHECK(r.bytes_inter == total * 4 + 12 && r.shard_elems == total,
           "case %d: bytes_inter %lld, want the f32 slab %lld + 12", k, (long long)r.bytes_inter,
           (long long)(total * 4));
  rf_plan_model_result_free(&m);
}

int main(void) {
  static const double ovs[] = {1.0, 0.5, 0.0};
  int k = 0;
  for (int n = 1; n <= MAX_UNITS; n++)
    for (int i = 0; i < 3; i++)
      for (int rep = 0; rep < 3; rep++) one_case(n, ovs[i], k++);
  RF_CHECK(hidden_cases >= k / 4, "only %d of %d cases hide more than 10%% of the all-reduces", hidden_cases,
           k);
  return rf_test_finish("test_sim_overlap");
}
