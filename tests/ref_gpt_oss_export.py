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
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gpt_oss_export")
B, T, SEED = 2, 12, 23
CFG = dict(model_type="gpt_oss", hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
           num_key_value_heads=1, head_dim=8, vocab_size=256, max_position_embeddings=64, rms_norm_eps=1e-5,
           rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                            "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16},
           num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
           layer_types=["sliding_attention", "full_attention"], swiglu_limit=1.0, tie_word_embeddings=False,
           output_router_logits=False, attention_bias=True)


def hf_model(path):
    cfg = GptOssConfig(**{k: v for k, v in CFG.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    model = GptOssForCausalLM(cfg)
    model.config._experts_implementation = "eager"
    if path:
        model.load_state_dict(load_file(path), strict=True)  # every name and shape, nothing extra
    return cfg, model.to(torch.float64).eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits.numpy().astype("<f4")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rfsdp", default="build/rfsdp")
    ap.add_argument("--data")
    a = ap.parse_args()
    os.makedirs(HERE, exist_ok=True)
    cfg, _ = hf_model(None)
    with open(os.path.join(HERE, "config.json"), "w") as f:
        json.dump(CFG, f, indent=2, sort_keys=True)
        f.write("\n")
    torch.manual_seed(SEED)
    model = GptOssForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
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
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(HERE, "hf.safetensors"))
    rng = np.random.RandomState(SEED)
    tokens = rng.randint(0, 256, size=(B, T)).astype("<i4")
    tokens.tofile(os.path.join(HERE, "tokens.i32"))
    _, m = hf_model(os.path.join(HERE, "hf.safetensors"))
    logits_of(m, tokens).tofile(os.path.join(HERE, "hf_logits.f32"))
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if not data:
            data = os.path.join(tmp, "data")
            subprocess.run([a.rfsdp, "prepare", "--input", "README.md", "--out", data, "--val-fraction", "0.2"],
                           check=True)
        ck = os.path.join(tmp, "ckpt")
        subprocess.run(["scripts/rfmpirun", "-np", "2", a.rfsdp, "train", "--model", os.path.join(HERE, "config.json"),
                        "--data", data, "--init", os.path.join(HERE, "hf.safetensors"), "--steps", "2", "--batch", "4",
                        "--seq", "16", "--lr", "1e-2", "--ckpt-dir", ck, "--save-every", "2", "--print-every", "0"],
                       check=True)
        dst = os.path.join(HERE, "step-00000002")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(os.path.join(ck, "step-00000002"), dst)
        out = os.path.join(tmp, "export.safetensors")
        subprocess.run([a.rfsdp, "ckpt", "export", dst, "--out", out], check=True)
        _, m = hf_model(out)
        logits_of(m, tokens).tofile(os.path.join(HERE, "export_logits.f32"))
    print(f"wrote {HERE}", file=sys.stderr)


if __name__ == "__main__":
    main()
