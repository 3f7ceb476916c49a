/* The runtime's MPI entry points (include/rfsdp_mpi.h): a context on MPI
 * communicators, built through src/comm's MPI constructors; this file names no
 * MPI function. The rest of src/fsdp sees the mesh through comm/comm.h only. */
#include "comm/comm_mpi.h"
#include "fsdp/fsdp.h"

int rf_fsdp_create_mesh(struct rf_fsdp **out, MPI_Comm shard, MPI_Comm replicate,
                        const struct rf_fsdp_options *opt) {
  RF_REQUIRE_ARG("rf_fsdp_create", out);
  *out = NULL;
  RF_REQUIRE_ARG("rf_fsdp_create", opt);
  struct rf_comm_mesh mesh;
  rf_comm_mesh_init(&mesh, shard, replicate);
  return rf_fsdp_create_on(out, &mesh, opt);
}

int rf_fsdp_create(struct rf_fsdp **out, MPI_Comm comm, const struct rf_fsdp_options *opt) {
  return rf_fsdp_create_mesh(out, comm, MPI_COMM_SELF, opt);
}

MPI_Comm rf_fsdp_comm(const struct rf_fsdp *f) { return rf_comm_mpi_handle(&f->mesh.shard); }
