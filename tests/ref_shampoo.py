#!/usr/bin/env python3
"""Reference values for tests/test_optim_shampoo.c: Distributed Shampoo in float64.

Our own implementation of the algorithm of facebookresearch/optimizers'
DistributedShampoo (distributed_shampoo/distributed_shampoo.py and
preconditioner/shampoo_preconditioner_list.py, matrix_functions.py), with the
settings rfsdp's --optim shampoo uses: betas (beta1, beta2) = (0.9, 0.95) for the
filtered gradient and Adam grafting (AdamGraftingConfig(beta2=0.95, epsilon=1e-8)),
factor EMA shampoo_beta2 with bias correction, inverse 4th roots (exponent -1/4 for
2-D blocks) from an eigendecomposition every `every` steps (eigenvalues shifted up to
>= 0 then + epsilon: PerturbationConfig without perturb_before_computation),
identity roots before the first refresh (start_preconditioning_step = 1), blocks of
at most `block` per side (max_preconditioner_dim), decoupled weight decay added to
the search direction, no classic momentum. The other tensors take AdamW
(torch.optim.AdamW's arithmetic).

Writes tests/data/shampoo_ref.bin: magic "RFSHAMPO", u32 version 1, u32 record
count; per record u32 name length, the name, u32 ndim, i64 shape[ndim], f32 data.
Records: for each tensor "<name>.p0" (initial), "<name>.g" (the gradients of every
step, [steps, ...]), "<name>.p" (after the steps).
Run: /work/venv/bin/python tests/ref_shampoo.py"""
import os
import struct

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "shampoo_ref.bin")
F64 = torch.float64

STEPS, EVERY, BLOCK = 10, 4, 16
LR, WD = 1e-2, 0.1
B1, B2, EPS = 0.9, 0.95, 1e-8
SB2, SEPS = 0.99, 1e-2

# name, shape, decay, matrix (as tests/test_optim_shampoo.c states them)
TENSORS = [
    ("a.w", (37, 20), True, True),
    ("b.w", (20, 45), False, True),
    ("c.w", (7, 3), True, True),
    ("d.v", (50,), False, False),
    ("e.h", (12, 10), True, False),
    ("f.x", (3, 18, 20), True, True),  # 3 fused experts: 3 matrices of 18 x 20
]


def gen(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def inv_root(a, bc):
    lam, q = torch.linalg.eigh(a / bc)
    lam = lam - min(lam.min().item(), 0.0)
    lam = lam + SEPS
    return (q * lam.pow(-0.25).unsqueeze(0)) @ q.T


class Matrix:
    def __init__(self, shape):
        r, c = shape
        self.blocks = [(r0, c0, min(BLOCK, r - r0), min(BLOCK, c - c0))
                       for r0 in range(0, r, BLOCK) for c0 in range(0, c, BLOCK)]
        self.m = torch.zeros(shape, dtype=F64)
        self.v = torch.zeros(shape, dtype=F64)
        self.f = [(torch.zeros(a, a, dtype=F64), torch.zeros(b, b, dtype=F64)) for _, _, a, b in self.blocks]
        self.roots = [(torch.eye(a, dtype=F64), torch.eye(b, dtype=F64)) for _, _, a, b in self.blocks]

    def direction(self, g, t):
        self.m += (1 - B1) * (g - self.m)
        self.v = B2 * self.v + (1 - B2) * g * g
        gf = self.m / (1 - B1 ** t)
        adam = gf / ((self.v / (1 - B2 ** t)).sqrt() + EPS)
        out = torch.zeros_like(g)
        for k, (r0, c0, a, b) in enumerate(self.blocks):
            gb = g[r0:r0 + a, c0:c0 + b]
            fl, fr = self.f[k]
            fl.mul_(SB2).add_(gb @ gb.T, alpha=1 - SB2)
            fr.mul_(SB2).add_(gb.T @ gb, alpha=1 - SB2)
            if t % EVERY == 0:
                bc = 1 - SB2 ** t
                self.roots[k] = (inv_root(fl, bc), inv_root(fr, bc))
            lr_, rr_ = self.roots[k]
            p = lr_ @ gf[r0:r0 + a, c0:c0 + b] @ rr_
            an = adam[r0:r0 + a, c0:c0 + b].norm()
            out[r0:r0 + a, c0:c0 + b] = p * (an / (p.norm() + 1e-16))
        return out


def main():
    records = []

    def add(name, t):
        t = t.detach().to(torch.float32).contiguous()
        records.append((name, list(t.shape), t.numpy().tobytes()))

    for i, (name, shape, decay, matrix) in enumerate(TENSORS):
        p0 = gen(10 + i, *shape) * 0.5
        g = gen(100 + i, STEPS, *shape)
        # rows of very different scales: the preconditioner has something to do
        if len(shape) >= 2:
            g = g * torch.linspace(0.2, 2.0, shape[-2]).unsqueeze(1)
        add(f"{name}.p0", p0)
        add(f"{name}.g", g)
        p = p0.to(F64)
        wd = WD if decay else 0.0
        if matrix:  # a 3-D tensor: each of its matrices on its own
            n = shape[0] if len(shape) == 3 else 1
            mats = [Matrix(shape[-2:]) for _ in range(n)]
            for s in range(STEPS):
                gs = g[s].to(F64).reshape(n, *shape[-2:])
                u = torch.stack([mats[e].direction(gs[e], s + 1) for e in range(n)]).reshape(shape)
                p = p - LR * (u + wd * p)
        else:
            m = torch.zeros(shape, dtype=F64)
            v = torch.zeros(shape, dtype=F64)
            for s in range(STEPS):
                t = s + 1
                gs = g[s].to(F64)
                m += (1 - B1) * (gs - m)
                v = B2 * v + (1 - B2) * gs * gs
                p = p * (1 - LR * wd) - LR / (1 - B1 ** t) * m / (v.sqrt() / (1 - B2 ** t) ** 0.5 + EPS)
        add(f"{name}.p", p)

    with open(OUT, "wb") as f:
        f.write(b"RFSHAMPO" + struct.pack("<II", 1, len(records)))
        for name, shape, data in records:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<I", len(shape)))
            f.write(struct.pack(f"<{len(shape)}q", *shape))
            f.write(data)
    print(f"wrote {OUT}: {len(records)} records")


if __name__ == "__main__":
    main()
