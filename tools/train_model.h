/* The LLaMA model (src/model) wired to the runtime (include/rfsdp.h): its units
 * and tensors declared to rfsdp, and one forward/backward over the units with the
 * runtime's gather, prefetch, reshard and reduce around each. The model only sees
 * parameter views and gradient views. */
#ifndef RF_TOOLS_TRAIN_MODEL_H
#define RF_TOOLS_TRAIN_MODEL_H

#include <stdint.h>

#include "comm/comm.h"
#include "comm/comm_mpi.h"
#include "model/model.h"
#include "rfsdp.h"

/* Owns the runtime context and the workspaces; borrows nothing. */
struct rf_train_model {
  struct rf_model_config cfg;
  struct rf_model_desc desc; /* the units and tensors declared (owned) */
  struct rf_fsdp *fsdp;      /* owned */
  int n_units;
  int *first_tensor;         /* per unit: the global index of its first tensor */
  struct rf_model_ws ws;     /* the training micro-batch */
  struct rf_model_ws gen_ws; /* one sequence, for sampling */
  struct rf_model_units map; /* where the embedding, the layers and the head are */
  struct rf_model_weight w[RF_MODEL_LAYER_TENSOR_COUNT]; /* the unit at hand (a layer, the embedding) */
  float *g[RF_MODEL_LAYER_TENSOR_COUNT];
  struct rf_model_weight wh[RF_MODEL_HEAD_TENSOR_COUNT]; /* the head unit (tied: through the step) */
  float *gh[RF_MODEL_HEAD_TENSOR_COUNT];
  /* MoE with the load-balancing loss (output_router_logits): the router
   * statistics of a micro-batch are summed over the ranks (every rank's micro-step
   * takes part), so the loss is that of the global micro-batch at any world size */
  int balance;
  struct rf_comm balance_comm; /* when balance */
  double *balance_stats;       /* [2 E + 1]: counts, probability sums, rows */
};

/* Declares the model's units and tensors to a new runtime context on the mesh
 * (shard, replicate: rf_fsdp_create_mesh; MPI_COMM_SELF as replicate for 1-D
 * FSDP) and finalizes it; `comm` holds every rank (the data's: the router
 * statistics of MoE models are summed over it); workspaces for `batch` local
 * sequences of `seq` tokens. */
int rf_train_model_init(struct rf_train_model *m, const struct rf_model_config *cfg,
                        const struct rf_fsdp_options *opt, MPI_Comm comm, MPI_Comm shard, MPI_Comm replicate,
                        int batch, int seq);
void rf_train_model_free(struct rf_train_model *m);
/* The linear layers' compute dtype (f32 or bf16) in both workspaces; at set-up. */
int rf_train_model_set_compute(struct rf_train_model *m, enum rf_dtype compute);

/* The rank's core budget as OpenMP's thread count: the cores this process may run
 * on divided by the ranks on its node (at least 1), unless OMP_NUM_THREADS is set.
 * Returns the count. Collective over comm; call before the model's first product. */
int rf_train_set_threads(MPI_Comm comm);

/* Every rank's status combined (src/comm's checked rf_comm_agree): 0 only when
 * every rank passed 0. Collective: the tools call it before any branch a failure
 * could take. */
int rf_train_agree(const struct rf_comm *comm, int status);
/* The exit status of a command after every rank's result rc (collective, the
 * command's last): 0 when every rank passed, else 1, and one rank prints its
 * message once, prefixed by `command`: the lowest rank that saw a problem itself. */
int rf_train_exit_status(const struct rf_comm *comm, int rc, const char *command);

/* Every rank fills its pieces of the weights from a safetensors file, then the
 * ranks agree: 0 on every rank, or -1 on every rank (the message names the file). */
int rf_train_model_import(struct rf_train_model *m, const struct rf_comm *comm, const char *path);

/* Forward and backward of one micro-batch (tokens, targets: batch*seq each);
 * gradients of grad_scale * loss_sum are reduced into the shards. Returns this
 * rank's loss sum, or NAN when a token is out of range. A MoE config with
 * output_router_logits adds router_aux_loss_coef times the load-balancing loss of
 * the global micro-batch (all ranks' rows; transformers' load_balancing_loss_func),
 * weighted by the micro-batch's share of the step's tokens: each rank's loss sum
 * carries 1/W of it (so grad_scale times the ranks' sum is the step's loss). */
double rf_train_model_micro_step(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets,
                                 float grad_scale);
/* Forward only: this rank's loss sum. */
double rf_train_model_loss(struct rf_train_model *m, const int32_t *tokens, const int32_t *targets);
/* Extends tokens[0..len) to tokens[0..total) by sampling (every rank computes the
 * same tokens: the same weights, the same RNG). */
int rf_train_model_generate(struct rf_train_model *m, int32_t *tokens, int len, int total, float temperature,
                            uint64_t *rng);

#endif
