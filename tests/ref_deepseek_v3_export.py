#!/usr/bin/env python3
"""Reference logits for tests/test_ckpt_moe.c: transformers' DeepseekV3ForCausalLM and rfsdp on the
same weights, both ways (as tests/ref_mixtral_export.py for Mixtral).

Writes tests/data/deepseek_v3_export/:
  config.json          a tiny DeepSeek-V3: multi-head latent attention (hidden 16, 2 heads, q_lora_rank 12,
                       kv_lora_rank 8, qk_nope 4 + qk_rope 4 != v_head_dim 6, interleaved rotary pairs),
                       layer 0 dense (MLP of 24), layer 1 with routed experts (4 of 8 in 2 groups, 1 group
                       kept, top-2, one shared expert; the balancing bias moved by the 2 training steps,
                       so the export's mlp.gate.e_score_correction_bias is not zero); vocab 256
  hf.safetensors       the weights of a seeded random DeepseekV3ForCausalLM, as transformers saves them
  tokens.i32           raw int32 [2, 12] seeded random tokens
  hf_logits.f32        transformers' logits (float64 model) of hf.safetensors on the tokens
  hub.safetensors      hf.safetensors in the Hub checkpoint's layout: each routed expert its own
                       mlp.experts.N.gate_proj/up_proj/down_proj (the rows transformers' conversion
                       fuses into gate_up_proj[N] = [gate; up], down_proj[N]); the same logits
  step-00000002/       the checkpoint of `rfsdp train --init hf.safetensors --steps 2` at W = 2
  export_logits.f32    transformers' logits of that checkpoint exported by `rfsdp ckpt export`, loaded
                       strictly into DeepseekV3ForCausalLM (every name and shape must match)
The C test runs `rfsdp logits` on hf.safetensors (the --init/--weights path) and on its own export of
the checkpoint and compares with the two files; `make test` needs no Python.

Usage: /work/venv/bin/python tests/ref_deepseek_v3_export.py [--rfsdp build/rfsdp] [--data PREFIX]
(PREFIX: token files of `rfsdp prepare`, byte tokenizer; made from README.md when not given)
"""
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from ref_common import export_reference

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepseek_v3_export")
CFG = dict(model_type="deepseek_v3", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
           num_attention_heads=2, num_key_value_heads=2, vocab_size=256, max_position_embeddings=64,
           rms_norm_eps=1e-6, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
           v_head_dim=6, first_k_dense_replace=1, moe_intermediate_size=8, n_routed_experts=4,
           n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1, rope_interleave=True,
           rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=False)


def init(name, p):  # each parameter once, under torch.no_grad, after torch.manual_seed(23)
    if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
    else:
        p.copy_(0.5 * torch.randn_like(p) / p.shape[-1] ** 0.5)


def hub_layout():
    """hf.safetensors with the fused experts split per expert, as the Hub keeps them."""
    out = {}
    for k, v in load_file(os.path.join(HERE, "hf.safetensors")).items():
        if k.endswith("mlp.experts.gate_up_proj"):
            f = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[k[:-len("gate_up_proj")] + f"{e}.gate_proj.weight"] = v[e, :f].contiguous()
                out[k[:-len("gate_up_proj")] + f"{e}.up_proj.weight"] = v[e, f:].contiguous()
        elif k.endswith("mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[k[:-len("down_proj")] + f"{e}.down_proj.weight"] = v[e].contiguous()
        else:
            out[k] = v
    save_file(out, os.path.join(HERE, "hub.safetensors"))


def main():
    export_reference(HERE, CFG, DeepseekV3Config, DeepseekV3ForCausalLM, init)
    hub_layout()


if __name__ == "__main__":
    main()
