#!/usr/bin/env python3
"""Reference values for tests/test_model_deepseek_v3.c from transformers' own DeepseekV3ForCausalLM.

Builds tiny DeepseekV3ForCausalLM models in float64 with eager attention, every layer dense
(first_k_dense_replace = num_hidden_layers): multi-head latent attention with hidden 32,
4 heads, qk_nope_head_dim 8, qk_rope_head_dim 6, v_head_dim 10 (!= the qk head dim 14),
kv_lora_rank 16, then the dense SwiGLU MLP of intermediate 40; 2 layers, vocab 51, B 2, T 9,
two ignored targets, rope_theta 10000. Two variants:
  deepseek_v3      q_lora_rank 24 (q_a_proj, q_a_layernorm, q_b_proj), rope_interleave true
  deepseek_v3_q    q_proj (q_lora_rank null), rope_interleave false
  deepseek_v3_yarn as deepseek_v3 with YaRN (factor 4, original_max_position_embeddings 16, mscale 1,
                   mscale_all_dim 0.7: the rotary tables times their ratio, the softmax scale times
                   mscale_all_dim's squared)
Weights come from a seeded numpy generator (norm weights 1 + 0.2 N, so that every norm's
weight matters).

  deepseek_v3_moe  3 layers, first_k_dense_replace 1: layers 1 and 2 with routed experts (8 of
                   moe_intermediate_size 12, n_group 4, topk_group 2, top-2, norm_topk_prob,
                   routed_scaling_factor 2.5) and one shared expert, a random e_score_correction_bias
                   (a buffer: its weight is written, its gradient zero). The router runs in float64
                   (transformers' F.linear on float32 operands widened, as tests/ref_deepseek_router.py
                   does), and every row's choice is asserted at least 1e-4 from a tie.
Writes tests/data/NAME_ref.bin in the format of tests/ref_mixtral.py (magic "MREF",
version 1, B, T, loss, aux (0 here), tokens, targets, logits, weights, gradients, the tensors in
rf_model_desc_make's order) and transformers' config.json to tests/data/NAME_ref_config.json.

Usage: /work/venv/bin/python tests/ref_deepseek_v3.py   (needs torch, transformers, numpy)
"""
import os
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.deepseek_v3.modeling_deepseek_v3 as ds
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from ref_common import batch, cross_entropy, float64_model, ids, mref_header, set_weights, write_config, write_ref

HERE = os.path.dirname(os.path.abspath(__file__))

H, I, L, NH, V, MAXPOS, B, T = 32, 40, 2, 4, 51, 256, 2, 9
NOPE, ROPE, DV, KVR, QR = 8, 6, 10, 16, 24
EPS, THETA = 1e-6, 10000.0


def tensor_names(qr, layers=L, dense=L):
    names = ["model.embed_tokens.weight"]
    for l in range(layers):
        p = f"model.layers.{l}."
        names.append(p + "input_layernorm.weight")
        if qr:
            names += [p + "self_attn.q_a_proj.weight", p + "self_attn.q_a_layernorm.weight",
                      p + "self_attn.q_b_proj.weight"]
        else:
            names.append(p + "self_attn.q_proj.weight")
        names += [p + "self_attn.kv_a_proj_with_mqa.weight", p + "self_attn.kv_a_layernorm.weight",
                  p + "self_attn.kv_b_proj.weight", p + "self_attn.o_proj.weight",
                  p + "post_attention_layernorm.weight"]
        if l < dense:
            names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
        else:  # rf_model_desc_make's order: router, fused experts, the balancing bias, shared experts
            names += [p + "mlp.gate.weight", p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj",
                      p + "mlp.gate.e_score_correction_bias", p + "mlp.shared_experts.gate_proj.weight",
                      p + "mlp.shared_experts.up_proj.weight", p + "mlp.shared_experts.down_proj.weight"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


class _F64:
    """torch.nn.functional with linear widened to float64 (the router's F.linear on float32)."""

    def __getattr__(self, name):
        if name == "linear":
            return lambda a, w, b=None: F.linear(a.double(), w.double(), None if b is None else b.double())
        return getattr(F, name)


def write_moe(name, seed):
    """3 layers, the first dense, two with routed and shared experts (the module docstring)."""
    layers, dense, e, ng, tg, k = 3, 1, 8, 4, 2, 2
    cfg = DeepseekV3Config(hidden_size=H, intermediate_size=I, num_hidden_layers=layers, num_attention_heads=NH,
                           num_key_value_heads=NH, vocab_size=V, max_position_embeddings=MAXPOS,
                           rms_norm_eps=EPS, q_lora_rank=QR, kv_lora_rank=KVR, qk_nope_head_dim=NOPE,
                           qk_rope_head_dim=ROPE, v_head_dim=DV, first_k_dense_replace=dense,
                           moe_intermediate_size=12, n_routed_experts=e, n_shared_experts=1,
                           num_experts_per_tok=k, n_group=ng, topk_group=tg, norm_topk_prob=True,
                           routed_scaling_factor=2.5, rope_interleave=True,
                           rope_parameters={"rope_type": "default", "rope_theta": THETA},
                           tie_word_embeddings=False, attention_dropout=0.0)
    model = float64_model(DeepseekV3ForCausalLM, cfg, experts=True)
    rng = np.random.RandomState(seed)
    names = tensor_names(QR, layers, dense)
    buffers = dict(model.named_buffers())
    biases = [n for n in names if n.endswith("e_score_correction_bias")]
    params, weights = set_weights(model, [n for n in names if n not in biases], rng,
                                  lambda name, shape: 2.0 / np.sqrt(shape[-1]) if "mlp.gate." in name else None)
    for b in biases:  # the buffers: small values that still move the choice
        weights[b] = (0.05 * rng.standard_normal(e)).astype(np.float32)
        with torch.no_grad():
            buffers[b].copy_(torch.from_numpy(weights[b].astype(np.float64)))
        params[b] = types.SimpleNamespace(grad=torch.zeros(e, dtype=torch.float64))
    tokens, targets = batch(rng, B, T, V, [(0, 3), (1, 5)])
    # the choice of every row away from ties (f32 against float64 must choose the same experts)
    margins = []

    def hook(mod, args, out):
        x = args[0].reshape(-1, H).double()
        s = torch.sigmoid(x @ mod.weight.double().T) + mod.e_score_correction_bias.double()
        g = s.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(-1).sort(dim=-1, descending=True)[0]
        margins.append((g[:, tg - 1] - g[:, tg]).min().item())
        keep = torch.zeros_like(s, dtype=torch.bool)
        for r in range(s.shape[0]):
            for grp in s[r].view(ng, e // ng).topk(2, dim=-1)[0].sum(-1).topk(tg)[1].tolist():
                keep[r, grp * (e // ng):(grp + 1) * (e // ng)] = True
        kept = s.masked_fill(~keep, float("-inf")).sort(dim=-1, descending=True)[0]
        margins.append((kept[:, k - 1] - kept[:, k]).min().item())

    hooks = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, ds.DeepseekV3TopkRouter)]
    saved = ds.F
    ds.F = _F64()
    try:
        out = model(input_ids=ids(tokens))
    finally:
        ds.F = saved
    for h in hooks:
        h.remove()
    assert min(margins) > 1e-4, margins
    loss = cross_entropy(out.logits, targets)
    loss.backward()
    print(f"{name}: loss {loss.item():.10f}, closest tie {min(margins):.3g}", file=sys.stderr)
    out_path = os.path.join(HERE, "data", f"{name}_ref.bin")
    write_ref(out_path, mref_header(B, T, loss.item(), 0.0), tokens, targets, out.logits, names, weights, params)
    write_config(cfg, os.path.join(HERE, "data", f"{name}_ref_config.json"))
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)", file=sys.stderr)


def write(name, qr, interleave, seed, rope=None):
    cfg = DeepseekV3Config(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                           num_key_value_heads=NH, vocab_size=V, max_position_embeddings=MAXPOS,
                           rms_norm_eps=EPS, q_lora_rank=qr, kv_lora_rank=KVR, qk_nope_head_dim=NOPE,
                           qk_rope_head_dim=ROPE, v_head_dim=DV, first_k_dense_replace=L,
                           moe_intermediate_size=12, n_routed_experts=4, n_shared_experts=1,
                           num_experts_per_tok=2, n_group=1, topk_group=1, rope_interleave=interleave,
                           rope_parameters=rope or {"rope_type": "default", "rope_theta": THETA},
                           tie_word_embeddings=False, attention_dropout=0.0)
    model = float64_model(DeepseekV3ForCausalLM, cfg)
    rng = np.random.RandomState(seed)
    names = tensor_names(qr)
    params, weights = set_weights(model, names, rng, lambda name, shape: None)
    tokens, targets = batch(rng, B, T, V, [(0, 3), (1, 5)])
    out = model(input_ids=ids(tokens))
    loss = cross_entropy(out.logits, targets)
    loss.backward()
    print(f"{name}: loss {loss.item():.10f}", file=sys.stderr)
    out_path = os.path.join(HERE, "data", f"{name}_ref.bin")
    write_ref(out_path, mref_header(B, T, loss.item(), 0.0), tokens, targets, out.logits, names, weights, params)
    write_config(cfg, os.path.join(HERE, "data", f"{name}_ref_config.json"))
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)", file=sys.stderr)


def main():
    write("deepseek_v3", QR, True, 20261203)
    write("deepseek_v3_q", None, False, 20261204)
    write("deepseek_v3_yarn", QR, True, 20261205,
          {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.7,
           "beta_fast": 32.0, "beta_slow": 1.0, "original_max_position_embeddings": 16})
    write_moe("deepseek_v3_moe", 20261209)


if __name__ == "__main__":
    main()
