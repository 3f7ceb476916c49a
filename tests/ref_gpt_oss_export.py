#!/usr/bin/env python3
"""Reference logits for tests/test_ckpt_moe.c: transformers' GptOssForCausalLM and rfsdp on the
same weights, both ways (as tests/ref_mixtral_export.py for Mixtral).

Writes tests/data/gpt_oss_export/:
  config.json          a tiny GPT-OSS (hidden 16, 2 heads of 8 over 1 kv head, 4 experts of 16,
                       top-2, 2 layers: sliding window 4 < T = 12, then full; swiglu_limit 1,
                       YaRN factor 4; vocab 256)
  hf.safetensors       the weights of a seeded random GptOssForCausalLM, as transformers saves them
  tokens.i32           raw int32 [2, 12] seeded random tokens
  hf_logits.f32        transformers' logits (float64 model) of hf.safetensors on the tokens
  step-00000002/       the checkpoint of `rfsdp train --init hf.safetensors --steps 2` at W = 2
  export_logits.f32    transformers' logits of that checkpoint exported by `rfsdp ckpt export`, loaded
                       strictly into GptOssForCausalLM (every name and shape must match)
The C test runs `rfsdp logits` on hf.safetensors (the --init/--weights path) and on its own export of
the checkpoint and compares with the two files; `make test` needs no Python.

Usage: /work/venv/bin/python tests/ref_gpt_oss_export.py [--rfsdp build/rfsdp] [--data PREFIX]
(PREFIX: token files of `rfsdp prepare`, byte tokenizer; made from README.md when not given)
"""
import os

import torch
from transformers import GptOssConfig, GptOssForCausalLM

from ref_common import export_reference

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt_oss_export")
CFG = dict(model_type="gpt_oss", hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=8, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5,
           rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16},
           num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
           layer_types=["sliding_attention", "full_attention"], swiglu_limit=1.0, tie_word_embeddings=False,
           output_router_logits=False, attention_bias=True)


def init(name, p):  # each parameter once, under torch.no_grad, after torch.manual_seed(23)
    if name.endswith("norm.weight"):
        p.copy_(1.0 + 0.1 * torch.randn_like(p))
    elif name.endswith("router.weight") or name.endswith("sinks"):
        p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
    elif name.endswith("bias"):
        p.copy_(0.1 * torch.randn_like(p))
    elif p.dim() == 3:  # the experts, [in, out]
        p.copy_(0.5 * torch.randn_like(p) / p.shape[-2] ** 0.5)
    else:
        p.copy_(0.5 * torch.randn_like(p) / p.shape[-1] ** 0.5)


def main():
    export_reference(HERE, CFG, GptOssConfig, GptOssForCausalLM, init)


if __name__ == "__main__":
    main()
