/* rf-test: timeout=60
 * The simulator prices HSDP's replica all-reduce as the runtime schedules it
 * (src/fsdp/schedule.c): each unit's gradient shard all-reduced on its own,
 * started non-blocking when that unit's last reduce-scatter is finished, in
 * backward order, one after another on the replicas' link, overlapped with the
 * rest of the backward; only what is left when the backward ends is exposed
 * (src/sim/simulate.c). The reference here is independent of the simulator's
 * closed form: a tick-by-tick replay of the runtime's protocol in the step's last
 * micro-batch (rf_test_replica_start_at, which tests/test_fsdp_schedule.c checks
 * the runtime against: the backward of unit v begins by finishing the reduce of
 * v + 2, which starts its all-reduce; rf_fsdp_grads_finish starts the rest as
 * their reduce-scatters finish, unit 0's after its own; a FIFO link that moves at
 * the profile's `overlap` rate until the backward ends and at full rate after),
 * on 2 replicas of shard groups of S ranks, for 1..6 units of random sizes,
 * random links, compute and overlap 1, 0.5, 0; every case within two ticks per
 * unit. Variants: S = 1 (the 2 hosts x 1 rank layout of bench/hosts.sh: no
 * gathers or reduce-scatters, so a unit's backward is 2/3 of its compute), in f32
 * and in bf16 (the all-reduce carries 2 bytes an element), with 3 micro-batches
 * (the all-reduces start in the last one, whose backward is a third of the
 * step's), and S = 2, 3 (a unit's backward also hides what is left of the
 * gathers and reduce-scatters beside it, the alpha-beta model of docs/scale.md,
 * and the last reduce-scatter follows it). At least a quarter of the base cases
 * hide more than 10% of the all-reduces (where pricing them after the backward,
 * as before, fails). Bytes do not move: the gradient shard all-reduced once per
 * step (bytes_inter = the slab in the reduce dtype). */
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

/* The runtime's last backward of n units (b[u] ms each, from n - 1 down to 0,
 * then red0 ms of unit 0's reduce-scatter) and its replica all-reduces (d[u] ms
 * of link time each), ticked: returns how long the last all-reduce ends after the
 * backward (0: hidden). */
static double ref_exposed(int n, const double *b, double red0, const double *d, double ov) {
  int queue[MAX_UNITS], qn = 0, head = 0, queued[MAX_UNITS] = {0};
  double t = 0, left = 0, end = -1, comp = b[n - 1];
  int v = n - 1, phase = 0; /* 0: unit v's backward, 1: unit 0's reduce-scatter, 2: after */
  while (end < 0 || head < qn) {
    if (phase < 2 && comp <= 0) {
      if (phase == 1) { /* rf_fsdp_grads_finish finished unit 0's reduce-scatter */
        queue[qn++] = 0;
        end = t;
        phase = 2;
      } else if (v == 0) { /* rf_fsdp_grads_finish: the units finished, highest first */
        for (int u = n - 1; u >= 1; u--)
          if (!queued[u]) queue[qn++] = u, queued[u] = 1;
        phase = 1;
        comp = red0;
      } else {
        v--;
        comp = b[v];
        int s = rf_test_replica_start_at(n, v); /* both slots busy: its reduce finished */
        if (s >= 0) queue[qn++] = s, queued[s] = 1;
      }
      if (head < qn && left <= 0) left = d[queue[head]];
      continue;
    }
    if (head < qn) {
      if (left <= 0) left = d[queue[head]];
      left -= DT * (phase < 2 ? ov : 1.0);
      if (left <= 1e-12) {
        head++;
        left = head < qn ? d[queue[head]] : 0;
        /* a zero-length all-reduce never waits a tick */
      }
    }
    if (phase < 2) comp -= DT;
    t += DT;
  }
  return t - end;
}

/* What the prefetch schedule leaves of communication m while computing c (the
 * simulator's overlap: a share `ov` of c hides communication). */
static double hide(double c, double m, double ov) { return c + fmax(m - ov * c, 0.0); }

static uint64_t rng = 12345;
static int hidden_cases; /* cases where the overlap hides more than 10% of the all-reduces */
static double uniform(void) {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng >> 11) / 9007199254740992.0;
}

struct variant {
  const char *name;
  int shard; /* S: ranks of a shard group */
  enum rf_dtype rdtype;
  int accum;
};

static void one_case(const struct variant *va, int n, double ov, int k) {
  static const char *const names[MAX_UNITS] = {"u0", "u1", "u2", "u3", "u4", "u5"};
  struct rf_plan_tensor_in t[MAX_UNITS];
  struct rf_plan_unit_in units[MAX_UNITS];
  const int S = va->shard;
  const struct rf_plan_policy p = {.layout = RF_LAYOUT_PLANNED,
                                   .shard = RF_SHARD_MODE_EQUAL,
                                   .max_buffers = 1,
                                   .align_bytes = 64,
                                   .param_dtype = RF_DTYPE_F32,
                                   .reduce_dtype = va->rdtype,
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
  RF_ASSERT(rf_plan_model_make(units, n, &p, S, 0, &m) == 0);
  struct rf_sim_options o = {.replicate = 2,
                             .rank = 0,
                             .prefetch = 1,
                             .reshard_after_forward = 1,
                             .accum = va->accum,
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
  RF_CHECK(rc == 0, "%s case %d: rf_sim_step: %s", va->name, k, rf_error_msg());
  /* the alpha-beta model of docs/scale.md over n ranks: alpha ceil(log2 n) + share B / busbw,
   * share (n - 1) / n for a gather or a reduce-scatter, twice that for an all-reduce */
  const double rs = (double)rf_dtype_size(va->rdtype), lg = S > 1 ? ceil(log2((double)S)) : 0;
  double b[MAX_UNITS] = {0}, d[MAX_UNITS] = {0}, g[MAX_UNITS] = {0}, red[MAX_UNITS] = {0};
  int64_t slab = 0;
  for (int u = 0; u < n; u++) {
    int64_t shard = m.units[u].plan.buffers[0].shard_elems, whole = (int64_t)S * shard;
    slab += shard;
    if (S > 1) {
      g[u] = alpha_us * 1e-3 * lg + (S - 1.0) / S * 4.0 * (double)whole / (busbw * 1e9) * 1e3;
      red[u] = alpha_us * 1e-3 * lg + (S - 1.0) / S * rs * (double)whole / (busbw * 1e9) * 1e3;
    }
    d[u] = alpha_us * 1e-3 + rs * (double)shard / (busbw * 1e9) * 1e3; /* 2 replicas */
  }
  for (int u = 0; u < n; u++) { /* the last micro-batch's backward of unit u */
    double c = 2.0 / 3.0 * compute / va->accum * (double)t[u].numel / (double)total;
    b[u] = hide(c, (u > 0 ? g[u - 1] : 0) + (u + 1 < n ? red[u + 1] : 0), ov);
  }
  double want = ref_exposed(n, b, red[0], d, ov);
  double all = 0;
  for (int u = 0; u < n; u++) all += d[u];
  if (va->shard == 1 && va->rdtype == RF_DTYPE_F32 && va->accum == 1 && all - want > 0.1 * all)
    hidden_cases++; /* the blocking all-reduce at the end would fail here */
  if (getenv("RF_TEST_VERBOSE"))
    printf("%s case %d: %d units, overlap %g: exposed %.6f ms, replayed %.6f, all-reduces %.6f\n", va->name,
           k, n, ov, r.replica_exposed_ms, want, all);
  RF_CHECK(fabs(r.replica_exposed_ms - want) <= 2 * DT * (n + 2) + 1e-9 * want,
           "%s case %d: %d units, overlap %g, alpha %.1f us, busbw %.4f GB/s, compute %.3f ms: the replicas' "
           "all-reduce exposes %.6f ms, the runtime's schedule replayed %.6f ms",
           va->name, k, n, ov, alpha_us, busbw, compute, r.replica_exposed_ms, want);
  if (S == 1) { /* the rest of the exposed time: the world's scalars (12 B) at n = 2; nothing hides them */
    double scal = alpha_us * 1e-3 + 12.0 / (busbw * 1e9) * 1e3;
    RF_CHECK(fabs(r.exposed_comm_ms - r.replica_exposed_ms - scal) < 1e-9 * (1 + r.exposed_comm_ms),
             "%s case %d: exposed %.9f ms = replicas %.9f + scalars %.9f", va->name, k, r.exposed_comm_ms,
             r.replica_exposed_ms, scal);
  }
  RF_CHECK(fabs(r.compute_ms - compute) < 1e-9 * compute, "%s case %d: compute %.9f, want %.9f", va->name, k,
           r.compute_ms, compute);
  RF_CHECK(r.bytes_inter == slab * (int64_t)rs + 12 && r.shard_elems == slab,
           "%s case %d: bytes_inter %lld, want the %s slab %lld + 12", va->name, k, (long long)r.bytes_inter,
           rf_dtype_name(va->rdtype), (long long)(slab * (int64_t)rs));
  rf_plan_model_result_free(&m);
}

int main(void) {
  static const double ovs[] = {1.0, 0.5, 0.0};
  static const struct variant variants[] = {{"f32", 1, RF_DTYPE_F32, 1},
                                            {"bf16", 1, RF_DTYPE_BF16, 1},
                                            {"accum-3", 1, RF_DTYPE_F32, 3},
                                            {"shard-2", 2, RF_DTYPE_F32, 1},
                                            {"shard-3-bf16-accum-3", 3, RF_DTYPE_BF16, 3}};
  int k = 0, base = 0;
  for (size_t a = 0; a < sizeof variants / sizeof variants[0]; a++) {
    int before = rf_test_failures;
    for (int n = 1; n <= MAX_UNITS; n++)
      for (int i = 0; i < 3; i++)
        for (int rep = 0; rep < (a == 0 ? 3 : 2); rep++, k++) {
          one_case(&variants[a], n, ovs[i], k);
          base += a == 0;
        }
    if (rf_test_failures == before)
      printf("%s: every case within two ticks per unit of the replay\n", variants[a].name);
  }
  RF_CHECK(hidden_cases >= base / 4, "only %d of %d cases hide more than 10%% of the all-reduces",
           hidden_cases, base);
  return rf_test_finish("test_sim_overlap");
}
