#!/usr/bin/env python3
"""Tensor names and shapes of the planned-only families as transformers holds them,
for tests/test_plan_models.c (rf_model_desc_make must describe every parameter of
the checkpoint, no more, no fewer, with its shape: the ground a trainable family and
its safetensors export stand on).

For each family below, a tiny config goes through transformers' AutoConfig (whose
defaults fill the rest), the model is built on the meta device (no weights), and
writes tests/data/NAME_names_config.json (transformers' own config.json) and
tests/data/NAME_names.txt: one line per state_dict entry, "name dim0 dim1 ...".

gpt_oss, and deepseek_v3 (a dense layer, then MoE layers: the router, its
e_score_correction_bias buffer, the fused routed experts as transformers 5 holds them, the
shared experts).

Usage: /work/venv/bin/python tests/ref_family_names.py   (needs torch, transformers)
"""
import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM

FAMILIES = {
    "gpt_oss": dict(model_type="gpt_oss", hidden_size=32, intermediate_size=16, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
                    max_position_embeddings=64, tie_word_embeddings=False),
    "deepseek_v3": dict(model_type="deepseek_v3", hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=4, vocab_size=50, q_lora_rank=24,
                        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=6, v_head_dim=10,
                        first_k_dense_replace=1, moe_intermediate_size=12, n_routed_experts=8,
                        n_shared_experts=1, num_experts_per_tok=2, n_group=4, topk_group=2,
                        max_position_embeddings=64, tie_word_embeddings=False),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
for name, fields in FAMILIES.items():
    cfg = AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    cfg.to_json_file(os.path.join(here, f"{name}_names_config.json"))
    with open(os.path.join(here, f"{name}_names.txt"), "w") as f:
        for key, t in model.state_dict().items():
            f.write(" ".join([key] + [str(d) for d in t.shape]) + "\n")
    print(f"{name}: {len(model.state_dict())} tensors, {sum(t.numel() for t in model.state_dict().values())} parameters")
