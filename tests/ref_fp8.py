#!/usr/bin/env python3
"""Reference values for tests/test_fp8.c: FP8 e4m3 block quantization and one linear
layer's forward and backward in DeepSeek-V3's recipe, in torch (torch.float8_e4m3fn).

Tiles: weights per 128x128 block, activations X and output gradients dY per 1x128 tile
(per row, per 128 columns) for the forward Y = X W^T and the input gradient dX = dY W;
the weight gradient dW = dY^T X takes its operands per 128x1 tile (128 tokens of one
column: the inner dimension is the tokens), as TransformerEngine's blockwise recipe
does. Scale = amax / 448 per tile (f32); with pow2 the smallest power of two s with
448 s >= amax; a zero tile's scale is 1; an amax / 448 that underflows to 0 becomes the
smallest positive f32. Codes = e4m3(x / scale), round to nearest even.
Products: for every 128-wide slice s of the inner dimension, P_s = the product of the
codes (computed in float64, where it is exact, then rounded to f32), added to the f32
accumulator as P_s * (sa * sb) with the two tiles' scales (DeepSeek-V3 promotes its FP8
sums to f32 every 128 elements).

Inputs: "edge" (a hand-made tensor of special tiles) is stored; X, W, dY are made by the
C test's generator (splitmix64 as tests/rf_test.c, rf_test_rand_f32) and not stored.
Writes tests/data/fp8_ref.bin: magic "RFFP8REF", u32 version 1, u32 record count; per
record u32 name length, the name, u32 dtype (0 f32, 1 u8), u32 ndim, i64 shape[ndim], data.
Run: /work/venv/bin/python tests/ref_fp8.py"""
import os
import struct

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "fp8_ref.bin")
M, K, N = 136, 272, 144  # tokens, in features, out features: each one whole tile and a partial one
T = 128
F32 = np.float32


def splitmix_f32(seed, n):
    """rf_test_rand_f32 from state `seed`, n values."""
    mask = (1 << 64) - 1
    state, out = seed, np.empty(n, dtype=F32)
    for i in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        out[i] = F32((z >> 11) * 2.0**-53 * 2.0 - 1.0)
    return out


def make_input(seed, rows, cols, pr, pc, mod, off):
    """As test_fp8.c's make_input: rand * 2^(((r / pr) + (c / pc)) % mod - off)."""
    x = splitmix_f32(seed, rows * cols).reshape(rows, cols)
    r = np.arange(rows)[:, None] // pr
    c = np.arange(cols)[None, :] // pc
    return np.ldexp(x, ((r + c) % mod - off).astype(np.int32)).astype(F32)


def scales_of(amax, pow2):
    s = np.where(amax == 0, F32(1.0), amax / F32(448.0)).astype(F32)
    s = np.where((s == 0) & (amax > 0), F32(2.0**-149), s).astype(F32)
    if pow2:
        f, e = np.frexp(s)
        p = np.where(f == 0.5, s, np.ldexp(F32(1.0), e)).astype(F32)
        while True:
            with np.errstate(over="ignore"):  # 448 p may round to inf: then it is >= amax, as in C
                low = (p * F32(448.0)) < amax
            if not low.any():
                break
            p = np.where(low, p * F32(2.0), p).astype(F32)
        s = p
    return s


def quantize(x, tr, tc, pow2):
    """codes (u8, shape of x) and scales [ceil(rows/tr), ceil(cols/tc)]."""
    rows, cols = x.shape
    gr, gc = -(-rows // tr), -(-cols // tc)
    pad = np.zeros((gr * tr, gc * tc), dtype=F32)
    pad[:rows, :cols] = np.abs(x)
    amax = pad.reshape(gr, tr, gc, tc).max(axis=(1, 3)).astype(F32)
    s = scales_of(amax, pow2)
    full = np.repeat(np.repeat(s, tr, axis=0), tc, axis=1)[:rows, :cols]
    q = torch.from_numpy((x / full).astype(F32)).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).numpy().copy(), s


def code_values(codes):
    return torch.from_numpy(codes).view(torch.float8_e4m3fn).to(torch.float64)


def gemm(a_codes, a_scale, a_tile, a_trans, b_codes, b_scale, b_tile, b_trans):
    """C = sum_s f32(A_s B_s) * (sa * sb), A stored [m,k] ([k,m] if a_trans), B [k,n] ([n,k] if b_trans)."""
    a = code_values(a_codes)
    b = code_values(b_codes)
    a = a.T if a_trans else a
    b = b.T if b_trans else b
    m, k = a.shape
    n = b.shape[1]
    acc = torch.zeros(m, n, dtype=torch.float32)
    for k0 in range(0, k, T):
        p = (a[:, k0:k0 + T] @ b[k0:k0 + T, :]).to(torch.float32)
        s = k0 // T
        # scale of A's element (i, k0): stored (i, k0) or (k0, i)
        sa = a_scale[s, np.arange(m) // a_tile[1]] if a_trans else a_scale[np.arange(m) // a_tile[0], s]
        sb = b_scale[np.arange(n) // b_tile[0], s] if b_trans else b_scale[s, np.arange(n) // b_tile[1]]
        sab = torch.from_numpy(sa.astype(F32))[:, None] * torch.from_numpy(sb.astype(F32))[None, :]
        acc += p * sab
    return acc.numpy()


def edge_tensor():
    """4 x 261 in 1x128 tiles (3 per row: 128, 128, 5 columns)."""
    x = np.zeros((4, 261), dtype=F32)
    g = np.random.default_rng(16)
    # row 0: a zero tile; a tile of f32 subnormals; amax exactly 448 with exact codes
    x[0, 128:256] = np.ldexp(g.integers(-1000, 1000, 128).astype(F32), -149)
    x[0, 256:261] = [448.0, -448.0, 1.125, -0.015625, 2.0**-9]
    # row 1: amax 56 = 448 / 8 with values halfway between codes (ties to even); amax 1
    # with values in e4m3's subnormal range after scaling; negative values and -0
    mids = np.array([1.0625, 1.1875, 1.3125, 1.4375, 1.5625, 1.6875, 1.8125, 1.9375], dtype=F32)
    x[1, 0:128] = np.tile(mids, 16) * F32(2.0) ** g.integers(-6, 5, 128).astype(F32) / F32(8.0)
    x[1, 0] = 56.0
    x[1, 128:256] = g.standard_normal(128).astype(F32) * F32(2.0**-9 / 448.0) * F32(8.0)
    x[1, 128] = 1.0
    x[1, 256:261] = [-3.0, -0.0, -1e-3, -2.5, -7.0]
    # rows 2, 3: wide ranges of magnitude
    x[2] = g.standard_normal(261).astype(F32) * F32(1e-30)
    x[3] = g.standard_normal(261).astype(F32) * F32(1e30)
    x[3, 5] = 3.0e38
    return x


def main():
    recs = []

    def add(name, arr):
        recs.append((name, np.ascontiguousarray(arr)))

    allcodes = np.arange(256, dtype=np.uint8)
    add("code_values", torch.from_numpy(allcodes).view(torch.float8_e4m3fn).to(torch.float32).numpy())
    edge = edge_tensor()
    add("edge", edge)
    for pow2 in (0, 1):
        c, s = quantize(edge, 1, T, pow2)
        add(f"edge.codes.p{pow2}", c)
        add(f"edge.scales.p{pow2}", s)

    x = make_input(1, M, K, 8, 64, 9, 4)
    w = make_input(2, N, K, 32, 40, 7, 3)
    dy = make_input(3, M, N, 8, 48, 5, 6)
    xc, xs = quantize(x, 1, T, 0)
    wc, ws = quantize(w, T, T, 0)
    dyc, dys = quantize(dy, 1, T, 0)
    xtc, xts = quantize(x, T, 1, 0)
    dytc, dyts = quantize(dy, T, 1, 0)
    wpc, wps = quantize(w, T, T, 1)
    for name, c, s in (("x.1x128", xc, xs), ("w.128x128", wc, ws), ("dy.1x128", dyc, dys),
                       ("x.128x1", xtc, xts), ("dy.128x1", dytc, dyts), ("w.128x128.pow2", wpc, wps)):
        add(name + ".codes", c)
        add(name + ".scales", s)
    y = gemm(xc, xs, (1, T), False, wc, ws, (T, T), True)
    dx = gemm(dyc, dys, (1, T), False, wc, ws, (T, T), False)
    dw = gemm(dytc, dyts, (T, 1), True, xtc, xts, (T, 1), False)
    add("y", y)
    add("dx", dx)
    add("dw", dw)
    # how far FP8 is from the f64 linear (reported, not compared bit for bit)
    x64, w64, dy64 = (torch.from_numpy(a).double() for a in (x, w, dy))
    for name, got, exact in (("y", y, x64 @ w64.T), ("dx", dx, dy64 @ w64), ("dw", dw, dy64.T @ x64)):
        err = (torch.from_numpy(got).double() - exact).norm() / exact.norm()
        print(f"{name}: relative Frobenius error of FP8 against f64 {err.item():.3e}")

    with open(OUT, "wb") as f:
        f.write(b"RFFP8REF" + struct.pack("<II", 1, len(recs)))
        for name, a in recs:
            nb = name.encode()
            dt = 1 if a.dtype == np.uint8 else 0
            assert a.dtype in (np.uint8, np.float32), name
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", dt, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(a.astype("<u1" if dt else "<f4").tobytes())
    print(f"wrote {OUT}: {len(recs)} records")


if __name__ == "__main__":
    main()
