#!/usr/bin/env python3
"""Reference values for tests/test_optim_ref.c from the peers' optimizers.

Writes tests/data/optim_ref.bin (the C test reads it; CI needs no Python):
  - torch.optim.AdamW (foreach=False) for 5 steps on a 33 x 40 matrix (weight
    decay 0.1) and a 40-vector (no decay);
  - torch.optim.Muon (adjust_lr_fn="match_rms_adamw", Nesterov, 5 steps of
    Newton-Schulz) for 2 steps on a 64 x 96 and a 96 x 64 matrix, as shipped
    (Newton-Schulz in bf16) and with its Newton-Schulz patched to f32;
  - bitsandbytes' AdamW8bit (CPU path, block-wise, blocks of 256) for 3 steps on
    a 64 x 128 matrix: parameters, the 8-bit codes and the block absmax after
    each step (the C test starts each step from bitsandbytes' state of the step
    before and compares code for code), both quantization maps, and
    torch.optim.AdamW's parameters on the same steps (8-bit's own noise).

Run with the project's venv: /work/main/.venv/bin/python tests/ref_optim.py
Format: magic "RFOPTREF", u32 version 1, u32 record count; per record u32 name
length, the name, u32 dtype (0 f32, 3 u8), u32 ndim, i64 shape[ndim], the data
(little-endian, row-major)."""
import os
import struct
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "optim_ref.bin")
records = []


def add(name, t):
    t = t.detach().contiguous()
    if t.dtype == torch.uint8:
        dtype, data = 3, t.numpy().tobytes()
    else:
        dtype, data = 0, t.to(torch.float32).numpy().tobytes()
    records.append((name, dtype, list(t.shape), data))


def gen(seed, *shape):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def adamw():
    lr, steps = 1e-2, 5
    w = torch.nn.Parameter(gen(1, 33, 40) * 0.5)
    b = torch.nn.Parameter(gen(2, 40) * 0.5)
    add("adamw.w.p0", w)
    add("adamw.b.p0", b)
    opt = torch.optim.AdamW(
        [{"params": [w], "weight_decay": 0.1}, {"params": [b], "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, foreach=False)
    gw, gb = gen(3, steps, 33, 40), gen(4, steps, 40) * 1e-3  # tiny gradients: eps matters
    add("adamw.w.g", gw)
    add("adamw.b.g", gb)
    for s in range(steps):
        w.grad, b.grad = gw[s].clone(), gb[s].clone()
        opt.step()
    add("adamw.w.p", w)
    add("adamw.b.p", b)
    add("adamw.w.m", opt.state[w]["exp_avg"])
    add("adamw.w.v", opt.state[w]["exp_avg_sq"])


def ns_f32(grad, ns_coefficients, ns_steps, eps):
    a, b, c = ns_coefficients
    x = grad.to(torch.float32).clone()
    if grad.size(0) > grad.size(1):
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        upd = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, upd, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


def muon():
    import torch.optim._muon as muon_mod
    lr, steps = 2e-2, 2
    for name, shape in (("wide", (64, 96)), ("tall", (96, 64))):
        p0, g = gen(5, *shape) * 0.1, gen(6, steps, *shape)
        add(f"muon.{name}.p0", p0)
        add(f"muon.{name}.g", g)
        for variant in ("bf16", "f32"):
            saved = muon_mod._zeropower_via_newtonschulz
            if variant == "f32":
                muon_mod._zeropower_via_newtonschulz = ns_f32
            try:
                p = torch.nn.Parameter(p0.clone())
                opt = torch.optim.Muon([p], lr=lr, weight_decay=0.1, momentum=0.95, nesterov=True,
                                       adjust_lr_fn="match_rms_adamw")
                for s in range(steps):
                    p.grad = g[s].clone()
                    opt.step()
            finally:
                muon_mod._zeropower_via_newtonschulz = saved
            add(f"muon.{name}.p_{variant}", p)


def bnb_adamw8bit():
    try:
        import bitsandbytes as bnb
        import bitsandbytes.functional as F
    except Exception as e:  # no CPU path: the C test skips these records
        print(f"bitsandbytes unavailable: {e}", file=sys.stderr)
        return
    lr, steps = 1e-2, 3
    p = torch.nn.Parameter(gen(7, 64, 128) * 0.5)
    add("bnb.p0", p)
    g = gen(8, steps, 64, 128)
    g[:, :, :8] *= 1e-3  # a few small columns: small entries of each block
    add("bnb.g", g)
    opt = bnb.optim.AdamW8bit([p], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    q = torch.nn.Parameter(p.detach().clone())  # the f32 AdamW trajectory, for the 8-bit noise
    o32 = torch.optim.AdamW([q], lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    for s in range(steps):
        p.grad = g[s].clone()
        opt.step()
        add(f"bnb.p{s + 1}", p)
        q.grad = g[s].clone()
        o32.step()
        add(f"bnb.p{s + 1}_f32", q)
        st = opt.state[p]
        for key in ("state1", "state2", "absmax1", "absmax2"):
            add(f"bnb.{key}_{s + 1}", st[key])
    add("bnb.qmap_signed", F.create_dynamic_map(signed=True))
    add("bnb.qmap_unsigned", F.create_dynamic_map(signed=False))
    records.append(("bnb.version:" + bnb.__version__, 3, [0], b""))


def main():
    torch.manual_seed(0)
    adamw()
    muon()
    bnb_adamw8bit()
    records.append(("torch.version:" + torch.__version__, 3, [0], b""))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(b"RFOPTREF" + struct.pack("<II", 1, len(records)))
        for name, dtype, shape, data in records:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", dtype, len(shape)))
            f.write(struct.pack(f"<{len(shape)}q", *shape))
            f.write(data)
    print(f"wrote {OUT}: {len(records)} records, {os.path.getsize(OUT)} bytes")


if __name__ == "__main__":
    main()
