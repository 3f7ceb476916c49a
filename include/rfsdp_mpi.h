/* rfsdp on MPI: the constructors that take MPI communicators, the one public
 * header that includes <mpi.h> (as ggml-cuda.h is ggml's one CUDA header). The
 * rest of the API (rfsdp.h, rfsdp_optim.h, rfsdp_run.h, rfsdp_model.h) is free of
 * MPI and sees communicators as the opaque struct rf_comm. */
#ifndef RFSDP_MPI_H
#define RFSDP_MPI_H

#include <mpi.h>

#include "rfsdp.h"

/* MPI_Init_thread asking for MPI_THREAD_MULTIPLE (falls back to what the library
 * provides); sets MPI_ERRORS_RETURN on MPI_COMM_WORLD. For programs, not libraries. */
void rf_comm_mpi_init(int *argc, char ***argv);
/* MPI_Finalize; a rank still inside it after 5 s (MPICH over UCX's TCP transport can
 * hang there) leaves with the status given to rf_comm_mpi_exit_status (default 0). */
void rf_comm_mpi_finalize(void);
void rf_comm_mpi_exit_status(int status);

/* A new communicator on a duplicate of `parent` (MPI_ERRORS_RETURN set, every
 * call checked: an MPI error stops every rank with its description). Released by
 * rf_comm_destroy. */
struct rf_comm *rf_comm_create_mpi(MPI_Comm parent);

/* A new context on `comm` (duplicated): parameters are sharded over its ranks.
 * Returns 0, or -1 with rf_fsdp_error(). */
int rf_fsdp_create(struct rf_fsdp **out, MPI_Comm comm, const struct rf_fsdp_options *opt);
/* A new context on a 2-D mesh (both duplicated): parameters sharded over `shard`,
 * replicated over `replicate` (the ranks that hold the same shard): hybrid
 * sharding (HSDP), world = replicas x shard group. Gradients are reduce-scattered
 * inside the shard group, then all-reduced across the replicate group on the
 * shard only (rf_fsdp_grads_finish). rf_fsdp_create is this with MPI_COMM_SELF
 * (1-D FSDP). Every rank of a replicate group must have the same shard rank and
 * shard group size (checked, collectively: -1 on every rank otherwise). */
int rf_fsdp_create_mesh(struct rf_fsdp **out, MPI_Comm shard, MPI_Comm replicate,
                        const struct rf_fsdp_options *opt);
/* The context's shard group as an MPI communicator (borrowed). */
MPI_Comm rf_fsdp_comm(const struct rf_fsdp *f);

#endif
