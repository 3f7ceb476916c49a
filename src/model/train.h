/* src/model's binding of a model description to the runtime (train.c): the
 * model's units and tensors declared to rfsdp (include/rfsdp.h), the tied
 * embedding, one forward/backward over the units with the runtime's gather,
 * prefetch, reshard and reduce around each, the MoE router statistics summed
 * over the ranks through src/comm, evaluation and sampling. The layers only see
 * parameter views and gradient views. No MPI: communicators come from src/comm.
 * include/rfsdp_model.h is its public face (create/destroy around init/free). */
#ifndef RF_MODEL_TRAIN_H
#define RF_MODEL_TRAIN_H

#include <stdint.h>

#include "model/desc.h"
#include "model/workspace.h"
#include "rfsdp_model.h"

struct rf_comm_mesh; /* src/comm */

/* Owns the runtime context and the workspaces; borrows `comm`. */
struct rf_train_model {
  struct rf_model_config cfg;
  struct rf_model_desc desc; /* the units and tensors declared (owned) */
  struct rf_fsdp *fsdp;      /* owned */
  int n_units;
  int *first_tensor;                                    /* per unit: the global index of its first tensor */
  struct rf_model_ws ws;                                /* the training micro-batch */
  struct rf_model_ws gen_ws;                            /* one sequence, for sampling */
  struct rf_model_units map;                            /* where the embedding, the layers and the head are */
  struct rf_model_weight w[RF_MODEL_LAYER_MAX_TENSORS]; /* the unit at hand (a layer, the embedding) */
  float *g[RF_MODEL_LAYER_MAX_TENSORS];
  struct rf_model_weight wh[RF_MODEL_HEAD_TENSOR_COUNT]; /* the head unit (tied: through the step) */
  float *gh[RF_MODEL_HEAD_TENSOR_COUNT];
  /* MoE with the load-balancing loss (output_router_logits): the router
   * statistics of a micro-batch are summed over the ranks of `comm` (every rank's
   * micro-step takes part), so the loss is that of the global micro-batch at any
   * world size */
  int balance;
  struct rf_comm *comm;  /* owned: a view of the caller's communicator of every rank (the data's) counting
                          * into the context's counters (rf_comm_view: its backend borrowed) */
  double *balance_stats; /* [2 E + 1]: counts, probability sums, rows */
  /* DeepSeek-V3's balancing bias (bias_update_speed u > 0, MoE layers): after each step that is not
   * skipped, every rank adds u * sign(mean load - load_e) to its piece of each MoE layer's
   * e_score_correction_bias (outside the optimizer; its gradient stays zero), the loads summed over
   * the step's micro-batches and over `comm` (so the same at every world size) */
  int n_bias;           /* MoE layers whose bias moves (0: none) */
  int *bias_tensor;     /* owned [n_bias]: each one's tensor index in the runtime */
  double *bias_load;    /* owned [n_bias, E] */
  float *bias_pieces;   /* owned [n_bias, E]: the pieces, copied from the device, moved, copied back */
  float *logits_host;   /* owned: [vocab], one row of logits copied to the host (sampling,
                           rf_train_model_logits) */
  double *step_scalars; /* owned, device memory of the context: [0] the step's loss sum over its
                           micro-batches, [1] the gradient norm's sum of squares, read together once at
                           the end of rf_train_model_step */
};

/* Declares the model's units and tensors to a new runtime context on `mesh`
 * (taken: freed on failure, owned by the context on success) and finalizes it;
 * `comm` (borrowed, must outlive the model) holds every rank: the router
 * statistics of MoE models are summed over it. Workspaces for `batch` local
 * sequences of `seq` tokens. */
int rf_train_model_init(struct rf_train_model *m, const struct rf_model_config *cfg,
                        const struct rf_fsdp_options *opt, const struct rf_comm *comm,
                        struct rf_comm_mesh *mesh, int batch, int seq);
void rf_train_model_free(struct rf_train_model *m);
/* The OpenMP threads of a rank sharing its node with `ranks_on_node` ranks, the one
 * rule of `rfsdp train` (rf_train_set_threads) and `rfsdp plan` (the model's
 * workspace has per-thread scratch: the plan sizes it with these): OMP_NUM_THREADS
 * when set, else this machine's cores (its affinity mask) over the ranks, at least 1. */
int rf_train_threads(int ranks_on_node);

#endif
