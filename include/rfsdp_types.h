/* rfsdp: the public value types, free of MPI (and of any other backend).
 * Element types, shard modes, layouts, initializers, the byte counters and tensor
 * views, the opaque communicator: what the runtime (include/rfsdp.h), the library's lower floors (src/core,
 * src/plan, src/model), the optimizers and the checkpoints share. It includes
 * nothing but <stddef.h> and <stdint.h>. */
#ifndef RFSDP_TYPES_H
#define RFSDP_TYPES_H

#include <stddef.h>
#include <stdint.h>

#define RFSDP_VERSION "0.1.0"

/* Element types. bf16 is stored as uint16_t. */
enum rf_dtype {
  RF_DTYPE_F32 = 0,
  RF_DTYPE_BF16,
  RF_DTYPE_FP8E4M3,
  RF_DTYPE_U8,
  RF_DTYPE_I32,
  RF_DTYPE_I64,
  RF_DTYPE_F64
};
/* The bytes of one element of `dtype`, and its name ("f32", "bf16", "fp8e4m3", "u8", "i32", "i64",
 * "f64"); dtype must be one of the enum's values. */
size_t rf_dtype_size(enum rf_dtype dtype);
const char *rf_dtype_name(enum rf_dtype dtype);

/* equal: every rank owns S elements of a buffer (padding between tensors), as
 * NCCL needs; ragged: ranges end on the block boundary nearest the fair share,
 * no padding (MPI_Allgatherv / MPI_Reduce_scatter). */
enum rf_shard_mode { RF_SHARD_MODE_EQUAL = 0, RF_SHARD_MODE_RAGGED };

/* How a unit's tensors are laid out and communicated.
 *   planned: the structure-aware planner's buffers; collectives in place, no copies
 *   fsdp2:   PyTorch FSDP2: each tensor's dim 0 split into ceil(d0/W) rows per
 *            rank (padded); all-gather into a staging buffer, copy-out into
 *            per-tensor storage; gradients copied into a staging buffer before
 *            the reduce-scatter
 *   flat:    PyTorch FSDP1: the unit's tensors concatenated, padded at the end to
 *            a multiple of W, split element-wise (blocks may be cut) */
enum rf_layout { RF_LAYOUT_PLANNED = 0, RF_LAYOUT_FSDP2, RF_LAYOUT_FLAT };

/* Deterministic initialization: element i of a tensor depends only on (seed,
 * the tensor's name, i), never on W or on the layout. */
enum rf_init_kind { RF_INIT_ZEROS = 0, RF_INIT_CONST, RF_INIT_NORMAL, RF_INIT_UNIFORM };

struct rf_init {
  enum rf_init_kind kind;
  float value; /* CONST: the value; NORMAL: the standard deviation; UNIFORM: the bound (-b, b) */
};

/* Bytes and events of communication and copying, per rank. */
struct rf_counters {
  uint64_t bytes_gathered; /* bytes received by all-gathers (per rank) */
  uint64_t bytes_reduced;  /* bytes sent into reduce-scatters / all-reduces */
  uint64_t bytes_alltoall; /* bytes sent by all-to-all-v */
  /* the three above split by where the bytes go (bytes_intra + bytes_inter is their sum): */
  uint64_t bytes_intra;     /* ... on communicators inside one shard group (all of them in 1-D FSDP) */
  uint64_t bytes_inter;     /* ... on communicators across shard groups (the replicate group of HSDP) */
  uint64_t bytes_copied;    /* bytes copied outside collectives (staging, copy-in/out, packing) */
  uint64_t bytes_cast;      /* bytes written converting between f32 and bf16 (or to e4m3 after a
                               gather, FP8 with the fsdp2 and flat layouts) outside collectives */
  uint64_t bytes_own_shard; /* bytes of this rank's master shard written into the buffer an
                               all-gather fills (once per gather, every layout; f32 copy or bf16 cast) */
  uint64_t bytes_padding;   /* padding bytes moved by collectives */
  uint64_t collectives;     /* number of collective calls */
  uint64_t allocations;     /* heap allocations via rf_xmalloc & co, plus arena allocs */
  uint64_t comm_wait_ns;    /* time blocked waiting on communication */
  uint64_t host_syncs;      /* times the host waited for the device: a copy to the host, a sum of squares or
                               FP8 refusal read back, a stream or event synchronized (every backend counts
                               the same calls, so the host's count is the GPU's) */
};
/* now - before, field by field (a step's counters from two reads of rf_fsdp_get_counters); a NULL
 * pointer reads as all zeros. */
struct rf_counters rf_counters_diff(const struct rf_counters *now, const struct rf_counters *before);

/* A communicator: a group of ranks and the backend that connects them. Opaque in
 * the public API (rfsdp.h: rank, size, destroy; rfsdp_mpi.h: made from an MPI
 * communicator); the library's own definition is src/comm/comm.h. */
struct rf_comm;

/* The reductions of rf_comm_allreduce (rfsdp.h). */
enum rf_reduce_op { RF_REDUCE_OP_SUM = 0, RF_REDUCE_OP_MAX, RF_REDUCE_OP_MIN };

/* The most dimensions a tensor has (plans, checkpoints, safetensors files, views). */
#define RF_MAX_DIMS 8

/* The tracks of the step's timeline (rfsdp_run.h, rf_run_trace_*). */
enum rf_trace_lane {
  RF_TRACE_LANE_COMPUTE = 0, /* the training thread */
  RF_TRACE_LANE_GATHER,      /* all-gathers of parameters, issue to completion */
  RF_TRACE_LANE_REDUCE,      /* reduce-scatters of gradients */
  RF_TRACE_LANE_REPLICATE,   /* HSDP's replica all-reduce */
  RF_TRACE_LANE_DATA,        /* batches read */
  RF_TRACE_LANE_CKPT,        /* checkpoint saves (the training thread's part) */
  RF_TRACE_LANE_WRITER,      /* the async-save writer thread */
  RF_TRACE_LANE_WATCHDOG,    /* the collective watchdog */
  RF_TRACE_LANES
};

/* This rank's piece of one tensor: the element range [begin, end) of the
 * row-major tensor, and where it lives. `starts` (world + 1 entries) gives every
 * rank's range of the tensor: rank r holds [starts[r], starts[r+1]). */
struct rf_tensor_view {
  const char *name;
  int unit;
  int ndim;
  int64_t shape[RF_MAX_DIMS];
  int64_t numel;
  int64_t block_elems; /* every rank's range is a whole number of these (1: cut anywhere) */
  const int64_t *starts;
  int64_t begin, end;
  int64_t shard_offset; /* offset of the piece in this rank's shard slab (rf_fsdp_shard) */
  float *master;        /* end - begin elements: master weights (f32) */
  float *grad;          /* end - begin elements: the reduced gradient */
};

#endif
