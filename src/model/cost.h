/* What a model costs a step, for the simulator (rfsdp plan --batch, rfsdp train
 * --replicate auto --memory-per-rank): training FLOPs per token with only the
 * experts a token meets, the trainer's activation workspace, the scalars the
 * trainer all-reduces, and the optimizer groups of the description's tensors.
 * Read from the one config reader's struct, never from the JSON itself. */
#ifndef RF_MODEL_COST_H
#define RF_MODEL_COST_H

#include <stdint.h>

#include "model/desc.h"
#include "rfsdp_types.h"

/* Routed experts a token meets: num_experts_per_tok of every MoE family (gpt_oss: 0
 * when the config leaves it out, deepseek_v3: transformers' 8); 0 for a dense model. */
int rf_model_experts_per_token(const struct rf_model_config *cfg);

/* Training FLOPs per token of sequences of `seq` tokens: rf_model_flops_per_token
 * less 6 x the matmul weights of the experts a token does not meet in the
 * planned-only families (a fused tensor of E experts, k of E active; a trainable
 * MoE family's count holds only the active experts already). */
double rf_model_step_flops_per_token(const struct rf_model_desc *d, const struct rf_model_config *cfg,
                                     int seq);

/* The trainer's workspace of one micro-batch of `micro` sequences: every layer's
 * activations (f32), the bf16 compute staging and FP8 block's staging
 * (rf_model_ws_bytes, rf_model_ws_compute_bytes, rf_model_ws_fp8_bytes), with its
 * per-thread scratch for the threads of a rank sharing its node with
 * `ranks_on_node` ranks (rf_train_threads, as rfsdp train sets them). */
int64_t rf_model_activation_bytes(const struct rf_model_config *cfg, int micro, int seq,
                                  enum rf_dtype compute, int fp8, int ranks_on_node);

/* Bytes the trainer all-reduces on the world per step besides the gradient norm:
 * the loss (f64) and the end-of-step agreement (i32); a trainable MoE with its
 * load-balancing loss adds 2E + 1 router statistics (f64) per micro-batch, DeepSeek-V3
 * with its balancing bias moving (MoE layers) x E loads (f64) per step. */
int64_t rf_model_scalar_reduce_bytes(const struct rf_model_config *cfg, int accum);

/* The optimizer groups (RF_OPTIM_FLAG_DECAY, RF_OPTIM_FLAG_MATRIX) of the
 * description's tensors, units in order, into flags[d->n_tensors]. */
void rf_model_desc_optim_flags(const struct rf_model_desc *d, int *flags);

#endif
