#!/usr/bin/env python3
"""Distributed Shampoo's own code (facebookresearch/optimizers; not on PyPI: a checkout of it,
run at commit f606606) on the cases of tests/test_optim_shampoo.c's check_ds_record, and the
record it checks: tests/data/shampoo_ds_ref.txt (written by this script; `make test` does not
need Python).

Why DS's step once differed from rfsdp's: DS reshapes every parameter before preconditioning
it. `merge_small_dims` merges adjacent dimensions while their product stays <= its
max_preconditioner_dim (default 1024) until the tensor has
distributed_config.target_parameter_dimensionality dimensions (default 1). So at its
defaults a 6 x 6 matrix is preconditioned as ONE vector of 36 (full-matrix AdaGrad: one
36 x 36 factor and its inverse square root), not as a 6 x 6 matrix with two factors; rfsdp
never merges (its matrices are matrices, blocked at --shampoo-block). With
target_parameter_dimensionality=2 DS keeps the matrix and computes what rfsdp computes.

The record: DS with SingleDeviceDistributedConfig(target_parameter_dimensionality=2),
start_preconditioning_step 1, precondition_frequency 1 (roots refreshed every step, so the
identity roots rfsdp has before its first refresh never occur), lr 0.1, betas (0.9, 0.999)
(filtered gradient, factors), epsilon 1e-12, Adam grafting (beta2 0.95, epsilon 1e-8), no
weight decay, float64 parameters from 0.5, f32 factor matrices (DS's default); 4 steps with
gradients made by the C test's generator (splitmix64, rf_test_rand_f32): step t (1-based)
draws from seed 1000 t, g = 1e-3 (r + 3 [i == j]) for a 6 x 6 matrix (full rank) and
g = 1e-3 r for a 6 x 4 one. Each line: `CASE STEP v0 v1 ...`, the parameters after the step
(%.17g). Also printed: how far DS at its defaults (merged to 1-D) is from the record.
Usage: DS_PATH=/path/to/optimizers .venv/bin/python tests/ref_shampoo_ds.py"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.environ["DS_PATH"])
from distributed_shampoo import (  # noqa: E402
    AdamPreconditionerConfig,
    DistributedShampoo,
    SingleDeviceDistributedConfig,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shampoo_ds_ref.txt")
STEPS = 4
CASES = (("square", 6, 6, 3.0), ("tall", 6, 4, 0.0))


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


def grad(step, rows, cols, diag):
    r = splitmix_f32(1000 * step, rows * cols).astype(np.float64)
    g = [np.float32(1e-3 * (r[i] + (diag if i // cols == i % cols else 0.0))) for i in range(rows * cols)]
    return np.array(g, dtype=np.float64).reshape(rows, cols)


def run(rows, cols, diag, target):
    p = torch.nn.Parameter(torch.full((rows, cols), 0.5, dtype=torch.float64))
    kw = {} if target is None else {"distributed_config": SingleDeviceDistributedConfig(target_parameter_dimensionality=target)}
    opt = DistributedShampoo([p], lr=0.1, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=0.0,
                             precondition_frequency=1, start_preconditioning_step=1,
                             grafting_config=AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8), **kw)
    out = []
    for t in range(1, STEPS + 1):
        p.grad = torch.from_numpy(grad(t, rows, cols, diag))
        opt.step()
        out.append(p.detach().numpy().copy())
    return out


lines = []
for name, rows, cols, diag in CASES:
    rec = run(rows, cols, diag, 2)
    merged = run(rows, cols, diag, None)
    for t in range(STEPS):
        lines.append(f"{name} {t + 1} " + " ".join(f"{v:.17g}" for v in rec[t].ravel()))
        top = np.abs(rec[t] - 0.5).max()
        print(f"{name} {rows}x{cols} step {t + 1}: DS at its defaults (merged to one vector of "
              f"{rows * cols}) is {np.abs(merged[t] - rec[t]).max() / top:.3g} of max |p - p0| from the record")
# Before the first refresh: precondition_frequency 100, start_preconditioning_step at its default (the
# frequency), DS at its defaults otherwise: its first step on the square case is Adam's, lr A with
# A = G / (|G| + 1e-8) (bias corrections cancel); rfsdp's is lr G |A| / |G| (identity roots).
g = grad(1, 6, 6, 3.0)
a = g / (np.abs(g) + 1e-8)
p = torch.nn.Parameter(torch.full((6, 6), 0.5, dtype=torch.float64))
opt = DistributedShampoo([p], lr=0.1, betas=(0.9, 0.999), epsilon=1e-12, weight_decay=0.0, precondition_frequency=100,
                         grafting_config=AdamPreconditionerConfig(beta2=0.95, epsilon=1e-8))
p.grad = torch.from_numpy(g.copy())
opt.step()
dp = 0.5 - p.detach().numpy()
ident = 0.1 * g * np.linalg.norm(a) / np.linalg.norm(g)
print(f"square, frequency 100: DS's first step is {np.abs(dp - 0.1 * a).max() / np.abs(ident).max():.3g} of max from "
      f"Adam's; rfsdp's (identity roots) is {np.abs(ident - 0.1 * a).max() / np.abs(ident).max():.3g} away from it")
with open(OUT, "w") as f:
    f.write("# Distributed Shampoo (facebookresearch/optimizers f606606) on tests/ref_shampoo_ds.py's cases:\n")
    f.write("# CASE STEP and the parameters after the step, row-major (%.17g)\n")
    f.write("\n".join(lines) + "\n")
print(f"wrote {OUT}")
