"""Reference files for tests/test_safetensors.c, written by the `safetensors`
library from PyPI (the format's own implementation).

Writes tests/data/safetensors_ref.safetensors (F32, BF16 and F16 tensors of
several shapes, a 0-d scalar, an empty tensor, a U8 and an I64 tensor, and a
__metadata__ object) and tests/data/safetensors_ref.json: for every tensor its
dtype, shape and its values as float32 bit patterns (what a reader converting to
f32 must produce; bf16 and f16 convert to f32 exactly).

Usage: /work/main/.venv/bin/python tests/ref_safetensors.py
       /work/main/.venv/bin/python tests/ref_safetensors.py --check FILE
         (reads FILE, written by rfsdp's writer, with the library and prints
          each tensor's name, dtype, shape and a checksum of its f32 values)
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def make():
    g = torch.Generator().manual_seed(1234)
    t = {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": (torch.randn(24, 16, generator=g) * 100).to(torch.float16),
        "model.norm.weight": torch.rand(16, generator=g) + 0.5,
        "scalar": torch.tensor(3.25, dtype=torch.float32),
        "empty": torch.zeros(0, 5, dtype=torch.float32),
        "codes": torch.randint(0, 256, (3, 7), generator=g, dtype=torch.uint8),
        "steps": torch.tensor([1, -2, 1 << 40], dtype=torch.int64),
        "odd": torch.randn(2, 3, 5, generator=g).to(torch.bfloat16),
    }
    # special values must survive: +-0, inf, a subnormal, the largest finite
    t["specials.f16"] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 6e-8, 65504.0, 1.0 / 3],
                                     dtype=torch.float16)
    t["specials.bf16"] = torch.tensor([0.0, -0.0, float("inf"), 1e-40, 3.0e38, 1.0 / 3], dtype=torch.bfloat16)
    path = os.path.join(DATA, "safetensors_ref.safetensors")
    save_file(t, path, metadata={"format": "pt", "source": "tests/ref_safetensors.py"})
    expected = {}
    for name, x in t.items():
        entry = {"dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape)}
        if x.dtype in (torch.float32, torch.bfloat16, torch.float16):
            f = x.to(torch.float32).contiguous().numpy().reshape(-1)
            entry["f32_bits"] = [int(b) for b in f.view(np.uint32)]
        else:
            entry["values"] = [int(v) for v in x.reshape(-1).tolist()]
        expected[name] = entry
    with open(os.path.join(DATA, "safetensors_ref.json"), "w") as fh:
        json.dump(expected, fh, indent=0)
    print("wrote", path, os.path.getsize(path), "bytes")


def check(path):
    with safe_open(path, framework="pt") as f:
        print("metadata", f.metadata())
        for name in f.keys():
            x = f.get_tensor(name)
            v = x.to(torch.float64).reshape(-1)
            print(f"{name} {str(x.dtype).replace('torch.', '')} {list(x.shape)} "
                  f"sum={v.sum().item():.17g} sumsq={(v * v).sum().item():.17g}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        make()
