/* src/model: a model's configuration, read from a Hugging Face config.json by
 * the one reader (config.c) for every family (llama, qwen2, gpt_oss, deepseek_v3,
 * mixtral, qwen3_moe): struct rf_model_config, its parsing and the check that
 * the trainable model implements it. The description (desc.h) and the workspace
 * (workspace.h) are built from it. */
#ifndef RF_MODEL_CONFIG_H
#define RF_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

struct cJSON;

/* ---- configuration (config.c) ----------------------------------------------- */

/* The model families a Hugging Face config.json may name (model_type): each is a
 * table of per-family operations in a file of its own (family.h), listed once in
 * families.c. llama, qwen2, mixtral, qwen3_moe, gpt_oss and deepseek_v3 are
 * trainable; every family can be described (and planned). */
struct rf_model_family;

/* The number of families, and the name (model_type) and trainability of each. */
int rf_model_family_count(void);
/* "llama", "qwen2", "gpt_oss", "deepseek_v3", "mixtral", "qwen3_moe" (the model_type). */
const char *rf_model_family_name(const struct rf_model_family *family);
/* 1 for the families rfsdp trains (llama, qwen2, mixtral, qwen3_moe, gpt_oss, deepseek_v3). The name lists of
 * messages and --help come from these (rf_train_model_families). */
int rf_model_family_trainable(const struct rf_model_family *family);
/* The i-th family of the list (0 <= i < rf_model_family_count()). */
const struct rf_model_family *rf_model_family_at(int i);
/* The family of a model_type ("llama", ...), or NULL. */
const struct rf_model_family *rf_model_family_find(const char *model_type);

#define RF_MODEL_CONFIG_WORD 32

struct rf_model_config_deepseek_v3 {
  int moe_intermediate_size, n_routed_experts, n_shared_experts, first_k_dense_replace, moe_layer_freq;
  int q_lora_rank; /* 0: no low-rank query projection */
  int kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  int num_experts_per_tok; /* routed experts per token; 0 when the config leaves it out */
  int rope_interleave;     /* the rotary pairs (2i, 2i+1) (true, transformers' default) or (i, i + rope/2) */
  /* the sigmoid group-limited router (moe.c): n_group groups of experts (8), the topk_group best kept
   * (4), the weights renormalized with norm_topk_prob (true) and times routed_scaling_factor (2.5) */
  int n_group, topk_group, norm_topk_prob;
  double routed_scaling_factor;
  /* rfsdp's own field (transformers has none): the balancing bias's step u after each optimizer step,
   * e_score_correction_bias += u * sign(mean load - load) (1e-3, DeepSeek-V3's paper; 0: off) */
  double bias_update_speed;
};

/* YaRN rotary embeddings (rope_type "yarn"): transformers' _compute_yarn_parameters. */
struct rf_model_yarn {
  double factor, beta_fast, beta_slow, original_max, attention_factor;
  double softmax_mscale; /* mscale_all_dim's yarn_get_mscale (1 without): MLA's softmax scale times its
                          * square (transformers' yarn_apply_mscale) */
  int truncate;
};

/* Hugging Face config.json fields. */
struct rf_model_config {
  const struct rf_model_family *family; /* static (families.c's list) */
  int hidden_size;
  int intermediate_size;
  int num_hidden_layers;
  int num_attention_heads;
  int num_key_value_heads;
  int vocab_size;
  int max_position_embeddings;
  int head_dim; /* llama: hidden_size / num_attention_heads unless given */
  float rms_norm_eps;
  double rope_theta;
  int tie_word_embeddings, attention_bias, mlp_bias;
  char rope_type[RF_MODEL_CONFIG_WORD];  /* "default" unless rope_scaling/rope_parameters names one */
  const char *rope_field;                /* the field that named it ("" when none did) */
  const char *sliding_field;             /* qwen2: the field asking for sliding-window attention, or "" */
  char hidden_act[RF_MODEL_CONFIG_WORD]; /* "silu" unless given */
  double attention_dropout;              /* 0 unless given */
  double partial_rotary_factor;          /* 1 unless given (0: unset, as 1) */
  struct {
    int num_local_experts;
    int num_experts_per_tok;           /* 0 when the config leaves it out */
    double swiglu_alpha, swiglu_limit; /* the clamped SwiGLU (1.702, 7) */
  } gpt_oss;
  /* gpt_oss: layer l < 64 attends to the last sliding_window keys when bit l of sliding_mask is
   * set (layer_types' "sliding_attention"), else to every earlier key */
  int sliding_window;
  uint64_t sliding_mask;
  /* rope_type "yarn" (read by a family that implements it: gpt_oss); factor 0: none */
  struct rf_model_yarn yarn;
  struct rf_model_config_deepseek_v3 deepseek_v3;
  /* mixtral: num_local_experts experts of intermediate_size, num_experts_per_tok of
   * them per token; the load-balancing loss (router_aux_loss_coef) is part of the
   * loss only when output_router_logits is true, as in transformers. */
  struct {
    int num_local_experts, num_experts_per_tok;
    /* the fields as the config spells them (qwen3_moe: "num_experts"), and whether
     * num_experts_per_tok was written (else the family's default), for messages */
    const char *experts_field;
    int topk_given;
    double router_aux_loss_coef, router_jitter_noise;
    int output_router_logits;
    /* qwen3_moe: experts of moe_intermediate_size (the dense layers' MLP is of
     * intermediate_size); a layer is dense when listed in mlp_only_layers (a bit
     * mask of layers < 64 here: dense_mask) or when (l + 1) % decoder_sparse_step != 0;
     * norm_topk_prob renormalizes the top-k weights (mixtral always does) */
    int moe_intermediate_size, decoder_sparse_step, norm_topk_prob;
    uint64_t dense_mask;
  } moe;
};

/* The config's family; a config written by hand and zeroed (family NULL) is a
 * llama, as a config.json without model_type is. */
const struct rf_model_family *rf_model_config_family(const struct rf_model_config *cfg);

/* Layer l of a model with routed experts (mixtral, qwen3_moe, gpt_oss, deepseek_v3) has them (1) or a
 * dense MLP (0). */
int rf_model_config_layer_is_moe(const struct rf_model_config *cfg, int l);
/* The layers with routed experts (their router statistics make the load-balancing loss). */
int rf_model_config_moe_layers(const struct rf_model_config *cfg);

/* A family with routed experts that the trainable model implements (mixtral, qwen3_moe, gpt_oss,
 * deepseek_v3: even where every layer is dense). */
int rf_model_config_is_moe(const struct rf_model_config *cfg);

/* The one reader of a Hugging Face config.json (model_type llama, gpt_oss or
 * deepseek_v3; absent: llama). Errors name the file and the field: malformed
 * JSON, an unknown model_type, a missing field, one that is not a positive
 * integer. Defaults: num_key_value_heads = num_attention_heads, rms_norm_eps
 * 1e-6, rope_theta 10000, max_position_embeddings 2048, tie_word_embeddings,
 * attention_bias (gpt_oss: true) and mlp_bias false, hidden_act silu. Reads
 * what the model's math depends on; rf_model_config_check says whether the
 * trainable model implements it. */
int rf_model_config_read(struct rf_model_config *cfg, const char *path);
/* The same from text (path names the source in messages). */
int rf_model_config_parse(struct rf_model_config *cfg, const char *text, size_t n, const char *path);
/* The JSON of a config or units file (NULL with the error set, naming path), and
 * a config from it: the pieces rf_model_desc_parse shares with the above. */
struct cJSON *rf_model_json_parse(const char *text, size_t n, const char *path);
int rf_model_config_from_json(struct rf_model_config *cfg, const struct cJSON *root, const char *path);
/* rf_model_config_read, then rf_model_config_check: a config the model trains. */
int rf_model_config_load(struct rf_model_config *cfg, const char *path);
/* Checks that the trainable model (a llama) implements the config, naming `what`
 * and the field otherwise: sizes positive, kv heads dividing heads, an even
 * head_dim (set to hidden_size / num_attention_heads when 0), plain RoPE over
 * the whole head, SiLU, no attention dropout. Tied embeddings, attention and
 * MLP biases and any head_dim are implemented (as transformers' LlamaForCausalLM). */
int rf_model_config_check(struct rf_model_config *cfg, const char *what);

#endif
