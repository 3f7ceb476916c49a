/* src/comm's MPI backend: the one header that names MPI types. Programs and the
 * runtime's MPI entry points (rf_fsdp_create) construct communicators here; what
 * they construct is used through comm/comm.h.
 *
 * Counts above INT_MAX: gathers, bcast and all-to-all send them in units of a
 * contiguous datatype when one divides every count and displacement (else they
 * die with a message); blocking reductions split them into chunks; the
 * non-blocking reduce-scatters die. */
#ifndef RF_COMM_MPI_H
#define RF_COMM_MPI_H

#include "comm/comm.h"
#include "rfsdp_mpi.h" /* <mpi.h>, rf_comm_mpi_init, rf_comm_create_mpi */

/* Checks the return code of an MPI call; an error stops every rank with MPI's
 * description of it, the file and the line. */
#define RF_MPI_CHECK(call)                                                            \
  do {                                                                                \
    int rf_mpi_rc_ = (call);                                                          \
    if (rf_mpi_rc_ != MPI_SUCCESS) {                                                  \
      char rf_mpi_text_[MPI_MAX_ERROR_STRING];                                        \
      int rf_mpi_len_ = 0;                                                            \
      if (MPI_Error_string(rf_mpi_rc_, rf_mpi_text_, &rf_mpi_len_) != MPI_SUCCESS)    \
        snprintf(rf_mpi_text_, sizeof rf_mpi_text_, "MPI error code %d", rf_mpi_rc_); \
      RF_DIE("%s failed: %s", #call, rf_mpi_text_);                                   \
    }                                                                                 \
  } while (0)

/* Reads hydra's PMI socket (PMI_FD), which the finalize guard speaks on; called by
 * rf_comm_mpi_init before MPI_Init (finalize_guard.c). */
void rf_comm_finalize_guard_init(void);

/* Testing hook: the largest count passed to MPI in one argument (default and
 * maximum INT_MAX). Lowering it exercises the large-count paths on small buffers. */
void rf_comm_set_count_limit(int64_t limit);
/* Testing hook: rf_comm_mpi_finalize then spins in user space before MPI_Finalize
 * and never returns, as a rank stuck in UCX's endpoint close: the finalize guard
 * must end the process, with the status given to rf_comm_mpi_exit_status. */
void rf_comm_mpi_test_hang_finalize(void);

/* An MPI communicator: duplicates `parent` (owned by the rf_comm, with
 * MPI_ERRORS_RETURN set), makes the bf16 datatype and ops, installs the abort
 * hook (a fatal error on any rank ends the job: MPI_Abort), and sets the log's
 * rank prefix to the rank in MPI_COMM_WORLD. Released by rf_comm_free. */
void rf_comm_init(struct rf_comm *comm, MPI_Comm parent);
/* rf_comm_init of MPI_COMM_WORLD: every rank of the job. */
void rf_comm_init_world(struct rf_comm *comm);
/* The duplicated MPI communicator (borrowed). */
MPI_Comm rf_comm_mpi_handle(const struct rf_comm *comm);
/* 1 when comm's ranks yield their core while they wait (agreed by all of them at
 * rf_comm_init): some node holds more of its ranks than cores, or RF_MPI_WAIT=yield
 * (RF_MPI_WAIT=spin: only if another rank wishes to). Then waits test and sleep
 * instead of spinning in MPI_Wait, and blocking collectives run as their
 * non-blocking twins waited for that way (comm_mpi.c, docs/comm.md). */
int rf_comm_mpi_yielding(const struct rf_comm *comm);

/* A mesh from two MPI communicators: the shard group and the replicate group
 * (MPI_COMM_SELF for 1-D FSDP). Both are duplicated. */
void rf_comm_mesh_init(struct rf_comm_mesh *mesh, MPI_Comm shard, MPI_Comm replicate);

#endif
