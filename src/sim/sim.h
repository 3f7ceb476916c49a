/* src/sim: the step simulator behind `rfsdp plan --batch`, over the planner
 * (src/plan) and the optimizers (rf_optim_measure): a step of a run laid out by
 * the planning policy, as the runtime executes it, counted from the plan alone
 * (memory per rank, bytes per step as src/comm counts them) and priced on a
 * machine profile (a JSON file under configs/network/, network.c) with the
 * alpha-beta model of each collective and the prefetch schedule's overlap.
 * See docs/scale.md. Files: simulate.c (the step), network.c (the profiles). */
#ifndef RF_SIM_H
#define RF_SIM_H

#include <stdint.h>

#include "plan/plan.h"
#include "rfsdp_optim.h" /* struct rf_optim_options */

/* ---- machine profiles (src/sim/network.c) ---- */

/* The collectives a step runs, as the time model prices them. */
enum rf_sim_coll {
  RF_SIM_COLL_ALLGATHER = 0,  /* parameters, inside a shard group */
  RF_SIM_COLL_REDUCE_SCATTER, /* gradients, inside a shard group */
  RF_SIM_COLL_ALLREDUCE,      /* gradient shards across the replicas (HSDP); scalars */
  RF_SIM_COLL_COUNT
};

/* One link's alpha-beta model of a collective over n ranks on a buffer of B
 * bytes (the gathered output, the reduce-scatter input, the all-reduce buffer):
 *   t = alpha * ceil(log2 n) + f(n) * B / busbw,
 * f = (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce (the
 * bytes each rank moves, nccl-tests' bus bandwidth convention). */
struct rf_sim_link {
  double alpha_us;  /* per doubling of the ranks */
  double busbw_gbs; /* GB/s (1e9 bytes) */
};

/* A machine: nodes of `cores_per_node` cores (GPUs) holding `ranks_per_node`
 * ranks each (0: every rank on one node), links inside a node (`intra`), inside
 * a node whose ranks outnumber its cores (the ranks time-share the cores; a
 * collective waits for the peers' time slices): `shared_small` for a group of
 * at most cores_per_node ranks (its members can run at once), `shared` for a
 * larger one (some member always waits for a core), and between nodes
 * (`inter`), the compute peak of one rank alone, the memory bandwidth of the
 * optimizer's update, and how much of a unit's communication the next unit's
 * compute hides. Ranks beyond the cores divide them: compute, optimizer and
 * copies take max(1, ranks on the node / cores_per_node) times as long. Owns
 * its strings. */
struct rf_sim_network {
  char name[256];     /* the profile's name, or the file's path */
  char source[1024];  /* where the numbers come from (stated assumptions or the fit) */
  int cores_per_node; /* cores (GPUs) a node runs ranks on at once */
  int ranks_per_node; /* ranks placed on a node; 0: every rank on one node */
  struct rf_sim_link intra[RF_SIM_COLL_COUNT];        /* the group on one node, a core per rank */
  struct rf_sim_link shared_small[RF_SIM_COLL_COUNT]; /* ranks > cores on the node, group <= cores */
  struct rf_sim_link shared[RF_SIM_COLL_COUNT];       /* ranks > cores on the node, group > cores */
  struct rf_sim_link inter[RF_SIM_COLL_COUNT];        /* the group spans nodes */
  double peak_gflops;     /* per rank alone, dense, in bf16 (the file's "peak_gflops") */
  double peak_gflops_f32; /* the same for f32 operands ("peak_gflops_f32"; default peak_gflops) */
  double efficiency;      /* achieved share of the peak in the model's matmuls, (0, 1] */
  double mem_gbs;         /* per rank alone: the optimizer's update streams its state at this rate */
  double overlap;         /* 1: communication hides behind compute; 0: none; [0, 1] */
};

/* The profile `spec`: a name ("here", "h100-ib", "a100-ib", any NAME.json of
 * the profile folder, rf_sim_network_dir) or a path ending in ".json" (or
 * holding a '/'). A file's "base" names the profile it starts from (a name or a
 * path, relative to the file's folder); a file given by path without "base"
 * starts from "here"; a profile of the folder gives every field. Every field is
 * checked (kind, range); an error names the file and the field, a wrong
 * "base" names the file that gave it. Returns 0, or -1 with rf_error_msg(). */
int rf_sim_network_load(const char *spec, struct rf_sim_network *out);

/* The folder of the named profiles, the first of: $RFSDP_NETWORK_DIR; from the
 * executable's folder, ../share/rfsdp/network (make install's PREFIX) or
 * configs/network in it or up to three folders above (a source checkout's
 * build/rfsdp, build/tests/...); the same from the library's folder (a program
 * elsewhere over librfsdp.so: python/rfsdp); ./configs/network. Writes it to dir (size
 * bytes) and returns 0, or -1 with a message naming the places tried. */
int rf_sim_network_dir(char *dir, size_t size);

/* The names in that folder, comma-separated, sorted (static storage; "(none)"
 * when there is no folder). */
const char *rf_sim_network_names(void);

/* The time of one collective of `bytes` over n ranks on a link (ms; 0 when n <= 1). */
double rf_sim_link_ms(const struct rf_sim_link *link, enum rf_sim_coll kind, int n, double bytes);

/* ---- the step (src/sim/simulate.c) ---- */

/* What a simulated run does besides its layout. */
struct rf_sim_options {
  int replicate; /* R >= 1: the model's layout is for the shard group of world / R ranks */
  int rank;      /* the shard-group rank simulated; -1: the one with the most memory */
  /* the optimizer, sized and priced by its own create in measure mode
   * (rf_optim_measure) on every rank's views of the layout */
  struct rf_optim_options optim;
  const int *flags;            /* RF_OPTIM_FLAG_* per tensor, units' tensors in order; NULL: none */
  int prefetch;                /* units gathered ahead (the runtime's default 1) */
  int reshard_after_forward;   /* 1: the backward gathers again (the runtime's default) */
  int accum;                   /* micro-batches per step */
  double tokens_per_rank;      /* tokens one rank computes per step (all micro-batches) */
  double flops_per_token;      /* training FLOPs (6N + attention: rf_model_flops_per_token) */
  int f32_compute;             /* 1: the matmuls' operands are f32 (net.peak_gflops_f32) */
  int64_t activation_bytes;    /* the caller's estimate per rank (docs/scale.md) */
  int64_t scalar_reduce_bytes; /* all-reduced per step on the world besides the grad norm (loss, flags) */
  struct rf_sim_network net;
};

/* Bytes of one rank. */
struct rf_sim_memory {
  int64_t params; /* f32 master shard (the slab) */
  int64_t grads;  /* f32 gradient shard (the slab) */
  int64_t optim;  /* optimizer state (rf_optim_stats.state_bytes: Shampoo's owned preconditioners too) */
  int64_t optim_workspace; /* the optimizer's scratch and the matrix owners' staging (workspace_bytes) */
  int64_t gathered;    /* the arena: param slots (prefetch + 1) and 2 grad slots, each for the largest unit */
  int64_t activations; /* the caller's estimate */
  int64_t total;
};

struct rf_sim_result {
  int world, replicate, shard_world;
  int rank;                 /* the shard-group rank simulated (its numbers below) */
  int64_t shard_elems;      /* that rank's slab (the runtime's rf_fsdp_stats.shard_elems) */
  struct rf_sim_memory mem; /* memory_per_rank_bytes = mem.total */
  /* per rank per step, counted as the runtime's counters count them (src/comm/comm.c) */
  int64_t gather_bytes;      /* all-gathers: bytes received */
  int64_t reduce_bytes;      /* reduce-scatters: bytes sent; all-reduces: the buffer */
  int64_t alltoall_bytes;    /* Muon's and Shampoo's matrix owners: sent to the other ranks of the group */
  int64_t bytes_intra;       /* inside the shard group: gathers, reduce-scatters and the owners' all-to-all */
  int64_t bytes_inter;       /* across groups: the gradient shard all-reduced over the replicas */
  double optim_stream_bytes; /* the optimizer's memory traffic per step on that rank (rf_optim_stats) */
  double optim_flops;        /* its owners' matrix work per step on that rank (rf_optim_stats) */
  /* time per step, ms */
  double peak_gflops;     /* the profile's peak in the compute dtype */
  double time_share;      /* max(1, ranks on a node / cores): compute, optimizer and copies stretch by it */
  double compute_ms;      /* FLOPs / (peak * efficiency) x time_share */
  double comm_ms;         /* every collective back to back */
  double exposed_comm_ms; /* what the prefetch schedule leaves uncovered */
  double
      replica_exposed_ms; /* HSDP: the replicas' all-reduces left after the backward (in exposed_comm_ms) */
  double optim_ms;        /* the optimizer: its memory traffic at mem_gbs, its matrix work at the peak */
  double copy_ms;         /* the layout's copies around the collectives (fsdp2), at memory bandwidth */
  double step_ms;         /* predicted_step_ms = compute + exposed + optimizer + copies */
};

/* Simulates a step of `units` laid out by `model` (rf_plan_model_make at the
 * shard group's size world/R under policy p): memory per rank (the rank of the
 * group with the most), bytes per step as the runtime counts them, and the step
 * time of the alpha-beta model with the runtime's prefetch schedule
 * (docs/scale.md). Returns 0, or -1 with rf_error_msg() (bad options). */
int rf_sim_step(const struct rf_plan_unit_in *units, const struct rf_plan_model_result *model,
                const struct rf_plan_policy *p, const struct rf_sim_options *o, struct rf_sim_result *out);

/* ---- a run's step at any world, and the automatic mesh (src/sim/mesh.c) ---- */

/* What a run does besides its layout, at any world size: the options of
 * rf_sim_options that do not depend on W, and the model's activation estimate as
 * a function of the sequences one rank runs per micro-batch. */
struct rf_sim_workload {
  int64_t batch, seq; /* global batch in sequences, tokens per sequence */
  int accum, prefetch, reshard_after_forward, rank;
  int f32_compute;             /* 1: the matmuls' operands are f32 */
  double flops_per_token;      /* training FLOPs per token */
  const int *flags;            /* RF_OPTIM_FLAG_* per tensor (borrowed); NULL: none */
  int64_t scalar_reduce_bytes; /* as rf_sim_options */
  enum rf_optim_kind optim;    /* the optimizer, with its default options */
  /* bytes of one rank's workspace for `micro` sequences with `ranks_on_node` ranks on
   * its node; NULL: none estimated */
  int64_t (*activation_bytes)(const void *ctx, int micro, int ranks_on_node);
  const void *ctx; /* activation_bytes's (borrowed) */
  struct rf_sim_network net;
};

/* rf_sim_step of the workload at `world` ranks in `replicate` replica groups
 * (the model laid out at world / replicate in m): the batch split into world x
 * accum micro-batches, the node of the profile holding min(ranks_per_node, W) ranks. */
int rf_sim_run_world(const struct rf_sim_workload *w, const struct rf_plan_unit_in *units,
                     const struct rf_plan_model_result *m, const struct rf_plan_policy *p, int world,
                     int replicate, struct rf_sim_result *out);

/* The automatic mesh's choice at `world`. */
struct rf_sim_auto {
  int group;           /* the shard group size S; 0: none meets the limits */
  int64_t least_bytes; /* memory limit given and none fits: the least memory per rank (-1: none laid out) */
  int least_group;     /* ... and its group size */
};

/* The shard group of an automatic mesh at `world`: with memory_bytes > 0 the
 * smallest S dividing world whose layout meets max_padding (a fraction; < 0: no
 * limit) and whose simulated memory per rank (w) is at most memory_bytes;
 * otherwise the planner's largest S meeting max_padding (rf_plan_advise_group).
 * Returns 0 with out->group 0 when no size meets the limits (out->least_*:
 * the closest), or -1 with rf_error_msg() when a layout or a simulation fails. */
int rf_sim_auto_group(const struct rf_sim_workload *w, const struct rf_plan_unit_in *units, int n_units,
                      const struct rf_plan_policy *p, int world, double max_padding, double memory_bytes,
                      struct rf_sim_auto *out);

/* The shard group of a mesh of one group per node of the profile at `world`:
 * ranks_per_node, or world when the profile puts every rank on one node. */
int rf_sim_node_group(const struct rf_sim_network *net, int world);

#endif
