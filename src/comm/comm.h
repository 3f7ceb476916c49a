/* src/comm: the communicator over MPI. Blocking and non-blocking collectives on
 * flat buffers, with element counts as int64 and element types as rf_dtype.
 * Every MPI call is checked (the communicator has MPI_ERRORS_RETURN set); an MPI
 * error stops all ranks with the MPI error string, the file and the line.
 * Every collective adds to rf_counters_global: collectives (+1 per call, blocking
 * or started), bytes_gathered (bytes received from other ranks), bytes_reduced
 * (input bytes destined to other ranks; the whole buffer for an all-reduce when
 * world > 1), bytes_alltoall (bytes sent to other ranks), comm_wait_ns (time in
 * blocking collectives and in rf_comm_wait).
 *
 * Counts above INT_MAX: gathers, bcast and all-to-all send them in units of a
 * contiguous datatype when one divides every count and displacement (else they
 * die with a message); blocking reductions split them into chunks; the
 * non-blocking reduce-scatters die.
 *
 * Progress: MPI advances a non-blocking collective only inside MPI calls (no
 * progress thread here), so whoever overlaps compute polls rf_comm_test between
 * kernels.
 *
 * Element types: f32, f64, i32, i64, u8 for every collective; bf16 for
 * all-gather, reduce-scatter and all-reduce (sum through a user-defined op that
 * adds in f32 and rounds to nearest even). */
#ifndef RF_COMM_H
#define RF_COMM_H

#include <mpi.h>
#include <stdint.h>

#include "core/core.h"

enum rf_reduce_op { RF_REDUCE_OP_SUM = 0, RF_REDUCE_OP_MAX, RF_REDUCE_OP_MIN };

/* Owns `comm` (a duplicate of the parent), the bf16 datatype and ops, and the
 * scratch count arrays of the blocking collectives; borrows nothing. Collectives
 * on one rf_comm are issued from one thread at a time (as MPI requires). */
struct rf_comm {
  MPI_Comm comm;
  int rank;
  int world;
  int thread_level;       /* MPI_Query_thread at init */
  MPI_Datatype bf16_type; /* owned: 2 contiguous bytes */
  MPI_Op bf16_ops[3];     /* owned: indexed by enum rf_reduce_op; f32 arithmetic, RNE */
  int *scratch;           /* owned: 4*world ints for counts/displacements */
};

/* MPI_Init_thread asking for MPI_THREAD_MULTIPLE (falls back to what the library
 * provides); sets MPI_ERRORS_RETURN on MPI_COMM_WORLD. For programs, not libraries. */
void rf_comm_mpi_init(int *argc, char ***argv);
void rf_comm_mpi_finalize(void);

/* Testing hook: the largest count passed to MPI in one argument (default and
 * maximum INT_MAX). Lowering it exercises the large-count paths on small buffers. */
void rf_comm_set_count_limit(int64_t limit);

/* Duplicates `parent`, sets MPI_ERRORS_RETURN, sets the log's rank prefix. */
void rf_comm_init(struct rf_comm *comm, MPI_Comm parent);
void rf_comm_free(struct rf_comm *comm);

void rf_comm_barrier(const struct rf_comm *comm);
void rf_comm_bcast(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype, int root);
void rf_comm_allreduce(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                       enum rf_reduce_op op);

/* In-place all-gather: rank r's data is already at buf + r*count; fills the rest. */
void rf_comm_allgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype);
/* Ragged in-place all-gather: rank r's data is at [starts[r], starts[r+1]) of buf
 * (element offsets, starts[0] = 0, world+1 entries, zero-length ranges allowed). */
void rf_comm_allgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype);
/* Sum reduce-scatter: send holds world*count elements; recv gets this rank's count. */
void rf_comm_reduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                  enum rf_dtype dtype);
/* Ragged sum reduce-scatter: send holds starts[world] elements; recv gets
 * starts[rank+1] - starts[rank]. */
void rf_comm_reduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                            enum rf_dtype dtype);
/* All-to-all with per-peer counts and displacements, in elements (world entries each). */
void rf_comm_alltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                       const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                       const int64_t *recv_displs, enum rf_dtype dtype);

/* A non-blocking collective in flight. Owns the MPI request and the int count
 * arrays MPI needs while it runs; filled by rf_comm_i*, finished by test/wait.
 * Must stay at a fixed address while in flight. */
struct rf_comm_req {
  MPI_Request request;
  int active;
  int *counts;      /* owned, world entries, or NULL */
  int *displs;      /* owned, world entries, or NULL */
  int *recv_counts; /* owned, world entries: the receive side of an all-to-all-v */
  int *recv_displs; /* owned, world entries */
  int capacity;
  uint64_t bytes; /* counted into rf_counters_global when started */
};

void rf_comm_req_init(struct rf_comm_req *req, int world); /* allocates the count arrays once */
void rf_comm_req_free(struct rf_comm_req *req);

void rf_comm_iallgather(const struct rf_comm *comm, void *buf, int64_t count, enum rf_dtype dtype,
                        struct rf_comm_req *req);
void rf_comm_iallgatherv(const struct rf_comm *comm, void *buf, const int64_t *starts, enum rf_dtype dtype,
                         struct rf_comm_req *req);
void rf_comm_ireduce_scatter_block(const struct rf_comm *comm, const void *send, void *recv, int64_t count,
                                   enum rf_dtype dtype, struct rf_comm_req *req);
void rf_comm_ireduce_scatter(const struct rf_comm *comm, const void *send, void *recv, const int64_t *starts,
                             enum rf_dtype dtype, struct rf_comm_req *req);
/* Non-blocking all-to-all-v (arguments as rf_comm_alltoallv); the buffers must
 * stay untouched until the request finishes. */
void rf_comm_ialltoallv(const struct rf_comm *comm, const void *send, const int64_t *send_counts,
                        const int64_t *send_displs, void *recv, const int64_t *recv_counts,
                        const int64_t *recv_displs, enum rf_dtype dtype, struct rf_comm_req *req);
/* 1 when finished (or never started); drives MPI progress. */
int rf_comm_test(struct rf_comm_req *req);
/* Blocks until finished; the time blocked is added to comm_wait_ns. */
void rf_comm_wait(struct rf_comm_req *req);

#endif
