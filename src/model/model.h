/* src/model: model families and a LLaMA-style decoder.
 *
 * Families (llama, qwen2, gpt_oss, deepseek_v3, mixtral, qwen3_moe) are read from a Hugging Face
 * config.json by one reader (config.c) and described as units of tensors (names
 * and shapes as in their checkpoints, desc.c); a units file describes any other
 * model (units_file.c). The description is the one source of the planner's
 * tensor list (`rfsdp plan`) and of the tensors the trainer declares.
 *
 * The LLaMA decoder (model.c, ops.c) has Hugging Face LlamaForCausalLM's math,
 * tensor names and [out, in] weight layouts, forward and backward on the CPU. It
 * is a user of the library: it knows nothing of MPI or of the runtime. It
 * receives each unit's weights as pointers (f32 or bf16) and ADDS its gradients
 * into f32 buffers it is given (the caller zeroes them).
 *
 * Its units, in the order of rf_model_desc_make:
 *   unit 0        model.embed_tokens.weight                       [vocab, hidden]
 *   unit 1 + l    model.layers.{l}.input_layernorm.weight          [hidden]
 *                 model.layers.{l}.self_attn.q_proj.weight         [heads*hd, hidden]
 *                 model.layers.{l}.self_attn.k_proj.weight         [kv*hd, hidden]
 *                 model.layers.{l}.self_attn.v_proj.weight         [kv*hd, hidden]
 *                 model.layers.{l}.self_attn.o_proj.weight         [hidden, heads*hd]
 *                 model.layers.{l}.post_attention_layernorm.weight [hidden]
 *                 model.layers.{l}.mlp.gate_proj.weight            [inter, hidden]
 *                 model.layers.{l}.mlp.up_proj.weight              [inter, hidden]
 *                 model.layers.{l}.mlp.down_proj.weight            [hidden, inter]
 *   unit 1 + L    model.norm.weight                                [hidden]
 *                 lm_head.weight                                   [vocab, hidden]
 *
 * One step on a local batch of B sequences of T tokens (N = B*T rows):
 *   rf_model_embed_forward; rf_model_layer_forward(l) for l = 0..L-1;
 *   loss_sum = rf_model_head_forward(targets);
 *   rf_model_head_backward(grad_scale); rf_model_layer_backward(l) for l = L-1..0;
 *   rf_model_embed_backward.
 * The head returns the SUM of the token losses; grad_scale (e.g. 1 / global token
 * count) multiplies d(loss_sum)/d(logits), so every gradient added is that of
 * grad_scale * loss_sum. Only the head backward takes it: the rest is linear.
 *
 * Matmuls: src/gemm (oneDNN). The compute dtype (rf_model_ws_set_compute) picks the
 * operands of the linear layers' products: f32, or bf16 (activations and output
 * gradients rounded to bf16, bf16 weights used as gathered, f32 weights rounded)
 * with f32 accumulation and f32 outputs. f32 compute with bf16 weights widens the
 * weight to f32 a block of rows at a time. Everything else (norms, rotary,
 * attention with its softmax, SwiGLU, the residual stream, the loss) is f32 in
 * both; docs/precision.md lists it.
 *
 * This header is the umbrella for programs outside src/model (tests, benches, the
 * checkpoint tool): it includes the four headers a reader takes one at a time,
 * config.h (the configuration), desc.h (units and tensors), ops.h (the host ops)
 * and workspace.h (the workspace, forward and backward, sampling). Nothing under
 * src/ includes it (tests/test_layers.c). */
#ifndef RF_MODEL_H
#define RF_MODEL_H

#include "model/config.h"
#include "model/desc.h"
#include "model/ops.h"
#include "model/workspace.h"

#endif
