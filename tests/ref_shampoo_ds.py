#!/usr/bin/env python3
"""Distributed Shampoo's own code (facebookresearch/optimizers; not on PyPI: a checkout of it,
run here at commit f606606) on the closed-form case of tests/test_optim_shampoo.c's
check_closed_forms: one 6x6 matrix of gradients ~1e-3, lr 0.1, one step, epsilon 1e-12, Adam
grafting (beta2 0.95, epsilon 1e-8). Prints how far DS's step is from rfsdp's closed forms
(refreshed at step 1: lr U Vt |A| / |U Vt|; no refresh yet: lr G |A| / |G|) and from Adam's
first step lr A. Nothing is written; `make test` does not need it.
Usage: DS_PATH=/path/to/optimizers .venv/bin/python tests/ref_shampoo_ds.py"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.environ["DS_PATH"])
from distributed_shampoo import DistributedShampoo, AdamPreconditionerConfig

def splitmix_f32(seed, n):
    mask = (1 << 64) - 1
    state, out = seed, np.empty(n, dtype=np.float32)
    for i in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        out[i] = np.float32((z >> 11) * 2.0**-53 * 2.0 - 1.0)
    return out

N = 6
r = splitmix_f32(99, N * N).astype(np.float64)
g = np.array([np.float32(1e-3 * (r[i] + (3.0 if i % (N + 1) == 0 else 0.0))) for i in range(N * N)], dtype=np.float64).reshape(N, N)
a = g / (np.abs(g) + 1e-8)
u, s, vt = np.linalg.svd(g)
for start, every in ((1, 1), (-1, 100)):
    p = torch.nn.Parameter(torch.full((N, N), 0.5, dtype=torch.float64))
    opt = DistributedShampoo([p], lr=0.1, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=0.0,
                             precondition_frequency=every, start_preconditioning_step=start,
                             grafting_config=AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8))
    p.grad = torch.from_numpy(g.copy())
    opt.step()
    dp = 0.5 - p.detach().numpy()
    want = 0.1 * (u @ vt) * np.linalg.norm(a) / np.sqrt(N) if every == 1 else 0.1 * g * np.linalg.norm(a) / np.linalg.norm(g)
    adam = 0.1 * a
    top = np.abs(want).max()
    print(f"start_preconditioning_step {start}, every {every}: DS step vs rfsdp's closed form {np.abs(dp - want).max() / top:.3g} of max; vs Adam's step {np.abs(dp - adam).max() / top:.3g}")
