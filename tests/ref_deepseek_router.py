#!/usr/bin/env python3
"""Reference values for tests/test_model_deepseek_router.c from transformers' own
DeepseekV3TopkRouter (the sigmoid group-limited router of DeepSeek-V3's MoE layers).

The router computes its logits as F.linear(x.float32, W.float32). Here its weight is the identity
(hidden = E) and its input the test's f32 logits, and the module's F.linear is replaced, for the
call only, by one that widens both operands to float64: the logits are then exactly the f32 values,
and the sigmoid, the choice and the weights run in float64 (the router and its correction bias
made float64 with .double()). The gradient of sum(topk_weights * R) to the logits comes from
autograd (the choice is not differentiated; the bias is a buffer).

torch.topk does not break ties by the lowest index on the CPU (top-2 of [.5 .7 .7 .7 .1 .7 .2 .7]
is {1, 7}), and transformers calls it with sorted=False: the rows built with ties (identical logits
and biases, or groups holding the same values) are flagged, and the C test checks there that it
chose experts of the same (logit, bias) values, not the same indices. Every other row is checked
to be at least 1e-3 away from a tie in the group scores and in the kept experts' scores.

Cases (name: E, n_group, topk_group, top-k, norm_topk_prob, routed_scaling_factor, rows):
  grouped     16, 4, 2, 4, true,  2.5, 8   random logits, small random bias
  grouped_raw 16, 4, 2, 4, false, 1.0, 8   the same config unnormalized
  biased      8,  2, 1, 2, true,  1.0, 8   a bias that changes the choice (asserted below)
  ties        8,  4, 2, 3, true,  1.5, 4   tied groups and tied experts (flagged)
  plain       6,  1, 1, 2, true,  1.0, 6   one group: the plain top-k

Writes tests/data/deepseek_router_ref.bin (little-endian): "DRTR" (u32 0x52545244), version 1, the
case count; per case i32 E, n_group, topk_group, k, norm, n, f32 scale, f32 logits [n, E], f32 bias
[E], i32 tie flag [n], i32 experts [n, k] (torch's order), f64 weights [n, k], f64 scores [n, E],
f32 R [n, k], f64 d(logits) [n, E].

Usage: /work/venv/bin/python tests/ref_deepseek_router.py   (needs torch, transformers, numpy)
"""
import os
import struct
import sys
import types

import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.deepseek_v3.modeling_deepseek_v3 as ds
from transformers import DeepseekV3Config


def route(logits, bias, ng, tg, k, norm, scale, r):
    n, e = logits.shape
    cfg = DeepseekV3Config(hidden_size=e, n_routed_experts=e, n_group=ng, topk_group=tg, num_experts_per_tok=k,
                           norm_topk_prob=norm, routed_scaling_factor=scale)
    router = ds.DeepseekV3TopkRouter(cfg).double()
    with torch.no_grad():
        router.weight.copy_(torch.eye(e, dtype=torch.float64))
        router.e_score_correction_bias.copy_(torch.from_numpy(bias.astype(np.float64)))
    x = torch.from_numpy(logits.astype(np.float64)).requires_grad_(True)
    saved = ds.F
    ds.F = types.SimpleNamespace(linear=lambda a, w: F.linear(a.double(), w.double()))
    try:
        z, w, idx = router(x)
    finally:
        ds.F = saved
    assert z.dtype == torch.float64 and w.dtype == torch.float64
    (w * torch.from_numpy(r.astype(np.float64))).sum().backward()
    return idx.numpy(), w.detach().numpy(), torch.sigmoid(z).detach().numpy(), x.grad.numpy()


def margins(logits, bias, ng, tg, k):
    """The smallest gap at the group boundary and at the expert boundary (kept groups) of each row."""
    s = 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) + bias
    n, e = s.shape
    out = []
    for row in s:
        g = np.sort(row.reshape(ng, e // ng), axis=1)[:, -2:].sum(axis=1)
        gs = np.sort(g)[::-1]
        gm = gs[tg - 1] - gs[tg] if tg < ng else np.inf
        kept = np.argsort(-g, kind="stable")[:tg]
        c = np.sort(np.concatenate([row.reshape(ng, e // ng)[i] for i in kept]))[::-1]
        em = c[k - 1] - c[k] if k < len(c) else np.inf
        out.append(min(gm, em))
    return np.array(out)


def case(f, rng, name, e, ng, tg, k, norm, scale, logits, bias, tie):
    n = logits.shape[0]
    logits = logits.astype(np.float32)
    bias = bias.astype(np.float32)
    r = rng.standard_normal((n, k)).astype(np.float32)
    idx, w, s, dz = route(logits, bias, ng, tg, k, norm, scale, r)
    m = margins(logits, bias, ng, tg, k)
    for i in range(n):
        assert tie[i] or m[i] > 1e-3, (name, i, m[i])
        assert not tie[i] or m[i] == 0, (name, i, m[i])
    f.write(struct.pack("<6i", e, ng, tg, k, int(norm), n) + struct.pack("<f", scale))
    f.write(logits.astype("<f4").tobytes() + bias.astype("<f4").tobytes())
    f.write(np.array(tie, dtype="<i4").tobytes() + idx.astype("<i4").tobytes())
    f.write(w.astype("<f8").tobytes() + s.astype("<f8").tobytes())
    f.write(r.astype("<f4").tobytes() + dz.astype("<f8").tobytes())
    print(f"{name}: {n} rows, E {e}, groups {ng} keep {tg}, top-{k}, norm {norm}, scale {scale}, "
          f"{sum(tie)} tie rows, smallest margin of the others {min(m[i] for i in range(n) if not tie[i]):.3g}"
          if sum(tie) < n else f"{name}: {n} tie rows")
    return idx


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "data", "deepseek_router_ref.bin")
    rng = np.random.default_rng(39)

    def drawn(n, e, bscale, tries=1000):
        for _ in range(tries):
            z = (2.0 * rng.standard_normal((n, e))).astype(np.float32)
            b = (bscale * rng.standard_normal(e)).astype(np.float32)
            yield z, b

    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<3I", 0x52545244, 1, 5))
        for name, norm, scale in (("grouped", True, 2.5), ("grouped_raw", False, 1.0)):
            for z, b in drawn(8, 16, 0.1):
                if margins(z, b, 4, 2, 4).min() > 1e-3:
                    break
            case(f, rng, name, 16, 4, 2, 4, norm, scale, z, b, [0] * 8)
        # biased: the bias lifts group 1 (experts 4..7) by 0.3; without it the choice differs
        for z, _ in drawn(8, 8, 0.0):
            b = np.array([0, 0, 0, 0, 0.3, 0.3, 0.3, 0.3], dtype=np.float32)
            if margins(z, b, 2, 1, 2).min() > 1e-3:
                break
        idx = case(f, rng, "biased", 8, 2, 1, 2, True, 1.0, z, b, [0] * 8)
        idx0, _, _, _ = route(z, np.zeros(8, np.float32), 2, 1, 2, True, 1.0, np.zeros((8, 2), np.float32))
        changed = sum(set(a) != set(c) for a, c in zip(idx, idx0))
        assert changed >= 2, changed
        print(f"biased: the bias changes the choice of {changed} of 8 rows")
        # ties: groups of 2; rows: all equal; groups 1 and 3 the same values (swapped) best, group 2
        # worse; kept groups' experts tied at the top-3 boundary
        t = np.array([[0.4] * 8,
                      [-1.0, 0.2, 0.9, 0.3, -0.5, 0.1, 0.3, 0.9],
                      [0.5, 0.2, 0.2, 0.5, 0.2, 0.5, -2.0, 0.0],
                      [1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 0.0]], dtype=np.float32)
        case(f, rng, "ties", 8, 4, 2, 3, True, 1.5, t, np.zeros(8, np.float32), [1, 1, 1, 1])
        for z, b in drawn(6, 6, 0.2):
            if margins(z, b, 1, 1, 2).min() > 1e-3:
                break
        case(f, rng, "plain", 6, 1, 1, 2, True, 1.0, z, b, [0] * 6)
    os.replace(path + ".tmp", path)
    print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    sys.exit(main())
