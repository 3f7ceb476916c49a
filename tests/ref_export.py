#!/usr/bin/env python3
"""Reference logits for tests/test_ckpt_hf.c: transformers' LlamaForCausalLM on an exported
rfsdp checkpoint.

tests/data/export_ref/ holds a tiny trained checkpoint (config.json, step-00000020/), made once by
  mpirun -np 2 build/rfsdp train --model tests/data/export_ref/config.json --data D --steps 20 \\
      --batch 4 --seq 32 --lr 3e-2 --ckpt-dir C --save-every 20
(D: `rfsdp prepare --val-fraction 0.2` of docs/*.md and README.md), moved here. This script exports
it with `rfsdp ckpt export` (f32), loads the file strictly into LlamaForCausalLM (float64, eager
attention: every name and shape must match), runs a [2, 24] batch of seeded random tokens and
writes tokens.i32 (raw int32 [2, 24]) and logits.f32 (raw f32 [2, 24, 256]) next to it. The C test
exports the same checkpoint, runs `rfsdp logits` and compares; `make test` needs no Python.

Usage: /work/venv/bin/python tests/ref_export.py [--rfsdp build/rfsdp]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "export_ref")
B, T, SEED = 2, 24, 19


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rfsdp", default="build/rfsdp")
    a = ap.parse_args()
    with open(os.path.join(HERE, "config.json")) as fh:
        cfg = json.load(fh)
    config = LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.safetensors")
        subprocess.run([a.rfsdp, "ckpt", "export", os.path.join(HERE, "step-00000020"), "--out", path],
                       check=True)
        state = {k: v.double() for k, v in load_file(path).items()}
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).double().eval()
    want = model.state_dict()
    if set(want) != set(state) or any(tuple(want[k].shape) != tuple(state[k].shape) for k in want):
        sys.exit(f"export and LlamaForCausalLM disagree: {sorted(set(want) ^ set(state))}")
    model.load_state_dict(state, strict=True)
    g = torch.Generator().manual_seed(SEED)
    tokens = torch.randint(0, config.vocab_size, (B, T), generator=g)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
    tokens.numpy().astype("<i4").tofile(os.path.join(HERE, "tokens.i32"))
    logits.numpy().astype("<f4").tofile(os.path.join(HERE, "logits.f32"))
    print(f"wrote {HERE}/tokens.i32 {list(tokens.shape)} and logits.f32 {list(logits.shape)}: "
          f"max |logit| {logits.abs().max().item():.4f} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
