/* The planner and the step simulator as a library: the layout `rfsdp train`
 * runs for a model at a world size (next to FSDP1, FSDP2, DeepSpeed ZeRO-3 and
 * Megatron-FSDP), and with a batch the simulated step (memory per rank, bytes
 * per step, predicted time on a machine profile). `rfsdp plan` is this API's
 * porch (it parses the options into a request and prints), python/rfsdp's
 * plan() another client (ctypes). No MPI. docs/planner.md, docs/scale.md.
 *
 * Ownership: a struct rf_plan_request borrows its strings; struct rf_plan is
 * opaque, owns the model's description read once, and is freed by rf_plan_free. */
#ifndef RFSDP_PLAN_H
#define RFSDP_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rfsdp.h"

/* What a plan is asked for, spelled as `rfsdp plan`'s options (strings
 * borrowed). rf_plan_request_init sets the defaults of every field. */
struct rf_plan_request {
  const char *model; /* a Hugging Face config.json or a units file (required) */
  /* the run options that change the layout, as rfsdp train takes them */
  const char *optim;        /* adamw | adamw8bit | muon | shampoo (rf_optim_kind_list) */
  const char *layout;       /* planned | fsdp2 | flat */
  const char *shard;        /* equal | ragged */
  const char *param_dtype;  /* f32 | bf16 */
  const char *reduce_dtype; /* f32 | bf16 */
  const char *fp8;          /* off | block */
  int fp8_pow2;             /* power-of-two FP8 tile scales (with fp8 block) */
  int64_t block_rows;       /* rows kept whole on one rank; -1: what the optimizer needs */
  int64_t align_bytes;      /* a power of two, 4 .. 1 MiB (default 64) */
  int max_buffers;          /* 1..8 (default 4) */
  double max_padding;       /* percent; < 0: no limit (default -1) */
  int buffers;              /* 1: every buffer's tensors and offsets too */
  /* the mesh and the simulated step (batch 0: the layout alone) */
  const char *replicate;  /* "R", "node" or "auto" (default "1") */
  double memory_per_rank; /* GB: replicate "auto"'s limit (0: none) */
  int64_t batch, seq;     /* global batch in sequences, tokens per sequence */
  int accum, prefetch, no_reshard;
  int rank;                       /* the shard-group rank simulated; -1: the one with the most memory */
  const char *compute_dtype;      /* f32 | bf16 */
  const char *network;            /* a machine profile's name or FILE.json (default "here") */
  double peak_gflops, efficiency; /* 0: the profile's */
};

/* The defaults (`rfsdp plan`'s). `size` is sizeof(struct rf_plan_request) as the
 * caller sees it (a check that a binding, e.g. ctypes, lays it out alike);
 * returns 0, or -1 when it differs. */
int rf_plan_request_init(struct rf_plan_request *r, size_t size);

/* The runtime options of the request's layout fields (layout, shard, the
 * optimizer's blocks unless block_rows, dtypes, FP8); the rest of o is left
 * alone. 0, or -1 with rf_fsdp_error() naming the option. */
int rf_plan_request_fsdp_options(const struct rf_plan_request *r, struct rf_fsdp_options *o);

/* A mesh as the request names it: "R" (a replica count that divides `world`),
 * "node" or "auto", into *replicate: R >= 1, RF_PLAN_MESH_NODE (the ranks of one
 * node form a shard group) or RF_PLAN_MESH_AUTO (rf_plan_group chooses). The one
 * parser of `rfsdp train --replicate` and `rfsdp plan --replicate`. 0, or -1 with
 * rf_fsdp_error() naming --replicate. */
#define RF_PLAN_MESH_NODE 0
#define RF_PLAN_MESH_AUTO (-1)
int rf_plan_mesh_parse(const char *text, int world, int *replicate);

/* The named machine profiles (configs/network, installed in
 * PREFIX/share/rfsdp/network), comma-separated and sorted (static storage,
 * "(none)" without the folder): what `network` may name besides FILE.json. */
const char *rf_plan_network_names(void);

/* The checks of a run's shape that `rfsdp train` and rf_plan_create share: the
 * global batch of `batch` sequences split into `world` ranks x `accum`
 * micro-batches of whole sequences; --seq within the config's (`path`)
 * max_position_embeddings. 0, or -1 with rf_fsdp_error() naming the options. */
int rf_plan_check_batch(int world, int64_t batch, int accum);
int rf_plan_check_seq(int64_t seq, int max_position_embeddings, const char *path);

struct rf_plan;

/* Checks the request at every world of worlds[n] (1 .. 2^24 ranks; the mesh, the
 * batch, --rank, --seq), then reads the model and the machine profile. Returns
 * 0; 2 when the request itself is wrong (a usage error: nothing was read); or
 * -1 when the model or the profile cannot be read; with rf_fsdp_error() naming the
 * option or the file. */
int rf_plan_create(struct rf_plan **out, const struct rf_plan_request *r, const int *worlds, int n);
void rf_plan_free(struct rf_plan *p);

/* The one line `rfsdp plan` prints first: the model, its size, the options. */
void rf_plan_print_banner(const struct rf_plan *p, FILE *out);
/* The plan at `world` (one of rf_plan_create's): `rfsdp plan`'s tables (json 0)
 * or its JSON object on one line (json 1). 0, or -1 with rf_fsdp_error(). */
int rf_plan_print(struct rf_plan *p, int world, int json, FILE *out);
/* The JSON object of the plan at `world` (what rf_plan_print writes with json 1,
 * without the newline), allocated: free it with rf_plan_free_json. NULL with
 * rf_fsdp_error() on failure. */
char *rf_plan_json(struct rf_plan *p, int world);
void rf_plan_free_json(char *json);

/* The shard group size S of the request's mesh at `world` ranks: world / R, the
 * profile's ranks per node ("node"), or the automatic choice ("auto": by the
 * padding limit and the simulated memory per rank; rfsdp train --replicate auto
 * chooses by it). 0, or -1 with rf_fsdp_error() naming the limits. */
int rf_plan_group(struct rf_plan *p, int world, int *group);

#endif
