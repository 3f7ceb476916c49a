/* What a model costs a step, for the simulator (cost.h). */
#include "model/cost.h"

#include <omp.h>

#include "core/core.h"
#include "model/family.h"
#include "model/train.h"
#include "rfsdp_optim.h"

int rf_model_experts_per_token(const struct rf_model_config *cfg) {
  return rf_model_config_family(cfg)->experts_per_token ? rf_model_config_family(cfg)->experts_per_token(cfg)
                                                        : 0;
}

/* Matmul weights of experts a token does not meet (planned-only families). */
static double rf_model_inactive_elems(const struct rf_model_desc *d, const struct rf_model_config *cfg) {
  double inactive = 0;
  if (rf_model_config_is_moe(cfg)) return 0;
  int k = rf_model_experts_per_token(cfg);
  for (int u = 0; u < d->n_units; u++)
    for (int i = 0; i < d->units[u].n_tensors; i++) {
      const struct rf_model_tensor *t = &d->units[u].tensors[i];
      if (!t->decay) continue;
      int64_t experts = t->sub_count; /* a fused tensor of E experts */
      if (experts > 1 && k < experts) inactive += (double)t->numel * (1.0 - (double)k / (double)experts);
    }
  return inactive;
}

double rf_model_step_flops_per_token(const struct rf_model_desc *d, const struct rf_model_config *cfg,
                                     int seq) {
  return rf_model_flops_per_token(cfg, seq) - 6.0 * rf_model_inactive_elems(d, cfg);
}

int64_t rf_model_activation_bytes(const struct rf_model_config *cfg, int micro, int seq,
                                  enum rf_dtype compute, int fp8, int ranks_on_node) {
  int threads = omp_get_max_threads();
  omp_set_num_threads(rf_train_threads(ranks_on_node));
  size_t bytes = rf_model_ws_bytes(cfg, micro, seq) + rf_model_ws_compute_bytes(cfg, micro, seq, compute) +
                 (fp8 ? rf_model_ws_fp8_bytes(cfg, micro, seq) : 0);
  omp_set_num_threads(threads);
  return (int64_t)bytes;
}

int64_t rf_model_scalar_reduce_bytes(const struct rf_model_config *cfg, int accum) {
  int moe = rf_model_config_is_moe(cfg);
  /* DeepSeek-V3's balancing bias: every MoE layer's loads once a step (rf_train_model_step) */
  int bias = moe && rf_model_config_family(cfg)->router == RF_MODEL_ROUTER_SIGMOID_GROUP &&
             cfg->deepseek_v3.bias_update_speed > 0;
  return 8 + 4 +
         (moe && cfg->moe.output_router_logits ? (int64_t)accum * (2 * cfg->moe.num_local_experts + 1) * 8
                                               : 0) +
         (bias ? (int64_t)rf_model_config_moe_layers(cfg) * cfg->moe.num_local_experts * 8 : 0);
}

void rf_model_desc_optim_flags(const struct rf_model_desc *d, int *flags) {
  for (int u = 0, k = 0; u < d->n_units; u++)
    for (int i = 0; i < d->units[u].n_tensors; i++, k++) {
      const struct rf_model_tensor *t = &d->units[u].tensors[i];
      flags[k] = (t->decay ? RF_OPTIM_FLAG_DECAY : 0) | (t->matrix ? RF_OPTIM_FLAG_MATRIX : 0);
    }
}
