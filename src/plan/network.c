/* The machines the simulator prices a step on: this one (fitted from
 * bench_comm's measurements by bench/scale.sh) and GPU clusters from published
 * figures, every number a stated assumption (docs/scale.md). */
#include <math.h>
#include <string.h>

#include "core/core.h"
#include "plan/plan.h"

/* {alpha_us, busbw_gbs} for all-gather, reduce-scatter, all-reduce. */
static const struct rf_plan_network rf_plan_networks[] = {
    {.name = "here",
     .source = "this machine (2 cores, MPICH shared memory, every rank on it): bench/scale.sh's fit of "
               "bench_comm's collectives inside a step (started before 4 ms of gemms, polled, waited on: "
               "the cost they add) at W=2 (intra: a core per rank), W=4 in groups of 2 (shared_small: 4 "
               "ranks time-sharing the 2 cores, groups that fit them) and W=4 (shared: the world of 4), "
               "fit of 2026-11-26 01:11 UTC, load 1.34; "
               "(RF_BENCH_HERE=1 bench/scale.sh rewrites the line above and the links; a run's "
               "runs/.../here.json goes to --network); compute and optimizer of a rank alone, stretched by "
               "ranks / cores; AdamW 0.56 ns per parameter (bench_optim, docs/benchmarks.md); give "
               "--peak-gflops (bench_model's CPU-time GFLOP/s)",
     .cores_per_node = 2,
     .ranks_per_node = 0,
     .intra = {{41.6, 7.858}, {48.5, 3.518}, {45.4, 2.783}},
     .shared_small = {{189.6, 5.302}, {91.3, 1.056}, {7669.8, 1.367}},
     .shared = {{2123.8, 0.6207}, {44.6, 0.5427}, {2989.4, 1.134}},
     .inter = {{3725.0, 0.81}, {2933.0, 1.04}, {8509.4, 18.65}}, /* unused: every rank on one node */
     .peak_gflops = 88.0,
     .efficiency = 1.0,
     .mem_gbs = 50.0,
     .overlap = 0.0},
    {.name = "h100-ib",
     .source = "8 H100 SXM per node on NVLink4/NVSwitch (nccl-tests bus bandwidth about 360 GB/s for "
               "all-gather, reduce-scatter and all-reduce), one 400 Gb/s InfiniBand NDR port per GPU (about "
               "45 GB/s bus bandwidth across nodes), 10 / 20 us per doubling of the ranks; 989 TFLOP/s dense "
               "bf16 at 50% in the matmuls; 2.5 TB/s for the optimizer; communication fully overlappable",
     .cores_per_node = 8,
     .ranks_per_node = 8,
     .intra = {{10.0, 360.0}, {10.0, 360.0}, {10.0, 360.0}},
     .shared_small = {{10.0, 360.0}, {10.0, 360.0}, {10.0, 360.0}},
     .shared = {{10.0, 360.0}, {10.0, 360.0}, {10.0, 360.0}},
     .inter = {{20.0, 45.0}, {20.0, 45.0}, {20.0, 45.0}},
     .peak_gflops = 989e3,
     .efficiency = 0.5,
     .mem_gbs = 2500.0,
     .overlap = 1.0},
    {.name = "a100-ib",
     .source = "8 A100 SXM per node on NVLink3/NVSwitch (bus bandwidth about 230 GB/s), one 200 Gb/s "
               "InfiniBand HDR port per GPU (about 23 GB/s), 10 / 20 us per doubling; 312 TFLOP/s dense bf16 "
               "at 50%; 1.6 TB/s for the optimizer; communication fully overlappable",
     .cores_per_node = 8,
     .ranks_per_node = 8,
     .intra = {{10.0, 230.0}, {10.0, 230.0}, {10.0, 230.0}},
     .shared_small = {{10.0, 230.0}, {10.0, 230.0}, {10.0, 230.0}},
     .shared = {{10.0, 230.0}, {10.0, 230.0}, {10.0, 230.0}},
     .inter = {{20.0, 23.0}, {20.0, 23.0}, {20.0, 23.0}},
     .peak_gflops = 312e3,
     .efficiency = 0.5,
     .mem_gbs = 1600.0,
     .overlap = 1.0},
};
#define RF_PLAN_N_NETWORKS ((int)(sizeof rf_plan_networks / sizeof rf_plan_networks[0]))

const char *rf_plan_network_names(void) { return "here, h100-ib, a100-ib"; }

int rf_plan_network_find(const char *name, struct rf_plan_network *out) {
  for (int i = 0; i < RF_PLAN_N_NETWORKS; i++)
    if (strcmp(rf_plan_networks[i].name, name) == 0) {
      *out = rf_plan_networks[i];
      return 0;
    }
  RF_FAIL("--network %s: unknown (known: %s)", name, rf_plan_network_names());
}

double rf_plan_link_ms(const struct rf_plan_link *link, enum rf_plan_coll kind, int n, double bytes) {
  if (n <= 1) return 0.0;
  double share = (double)(n - 1) / n * (kind == RF_PLAN_COLL_ALLREDUCE ? 2.0 : 1.0);
  return link->alpha_us * 1e-3 * ceil(log2((double)n)) + share * bytes / (link->busbw_gbs * 1e9) * 1e3;
}
