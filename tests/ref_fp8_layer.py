#!/usr/bin/env python3
"""Reference values for tests/test_model_fp8_ref.c: a one-layer LLaMA and a one-layer Mixtral
(Hugging Face's own LlamaForCausalLM and MixtralForCausalLM, float64, eager attention) whose
linear weights are FP8 in DeepSeek-V3's recipe as rfsdp runs it with `--fp8 block`
(docs/fp8.md), forward and every gradient.

Each of q, k, v, o, gate, up, down (Mixtral: q, k, v, o and every expert's gate_up and down
slices of the fused expert tensors) is replaced by an autograd function on the recipe of
tests/ref_fp8.py (its quantizer and product on codes, tied to torch.float8_e4m3fn):
  forward  Y = X W^T: X rounded to f32, quantized per 1x128 tile; W (the f32 weight) per
           128x128; the product on codes per 128-wide slice of K, in f32;
  backward dX = dY W: dY per 1x128 tile, W per 128x128;
           dW = dY^T X: dY and X per 128x1 tile along the tokens, the tiles restarting at
           each sequence (T = 64 here: one partial tile per sequence, as src/model/ops.c
           does since the tiles stopped crossing sequences), the sequences' products added
           in order in f32;
  the gradient of the f32 weight is that dW (straight through the quantizer, as rfsdp).
Everything else (embedding, norms, RoPE, attention, SwiGLU, the router, head, loss) is HF's,
in float64. Mixtral's experts (4, top-2, intermediate 100: gate_up [4, 200, 128] (a 128-row
and a 72-row band per expert), down [4, 128, 100], each expert tiled on its own) run as src/model/moe.c runs them: an expert's
tokens in token order, in chunks of the workspace's expert_rows (64 here: ceil(N k / E)
rounded up to 16) with one product per chunk, so an expert's dW tiles restart at each chunk
(its tokens come from any sequence); the router stays in float64 (not FP8, as in rfsdp); no
load-balancing loss.

Sizes: hidden 128 (one whole tile), intermediate 200 (a 128 and a 72 band: partial tiles in
gate, up and down), 4 heads of 32, 2 kv heads, vocab 40, B 2, T 64. Weights, tokens and
targets come from the C test's generator (splitmix64 as tests/rf_test.c's rf_test_rand_f32,
seeds below); the weights are not stored.
Writes tests/data/fp8_layer_ref.bin in tests/ref_fp8.py's record format ("RFFP8REF", u32
version 1, u32 count; per record u32 name length, name, u32 dtype 0 (f32), u32 ndim, i64
shape, data): "loss" [1], "logits" [B*T, V] and "grad.NAME" for every parameter (HF names);
tests/data/fp8_layer_ref.bin (LLaMA) and tests/data/fp8_moe_ref.bin (Mixtral).
Usage: .venv/bin/python tests/ref_fp8_layer.py   (scripts/pyenv makes .venv)"""
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ref_fp8 import T as TILE, gemm, quantize, splitmix_f32  # noqa: E402

H, I, NH, NKV, V, B, T = 128, 200, 4, 2, 40, 2, 64
E, K, EXPERT_ROWS, I_EXPERT = 4, 2, 64, 100
F32 = np.float32
FP8 = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
       "mlp.up_proj", "mlp.down_proj")
# the model's tensors in rfsdp's unit order, their generator seed and scale (norms: 1 + r / 4)
ATTN = ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight"]
HEAD = ["model.norm.weight", "lm_head.weight"]
NAMES = {"llama": ATTN + ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                          "model.layers.0.mlp.down_proj.weight"] + HEAD,
         "mixtral": ATTN + ["model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.gate_up_proj",
                            "model.layers.0.mlp.experts.down_proj"] + HEAD}


def weight(name, i, shape):
    r = splitmix_f32(100 + i, int(np.prod(shape))).reshape(shape)
    if name.endswith("norm.weight"):
        return (F32(1.0) + F32(0.25) * r).astype(F32)
    if "embed_tokens" in name:
        return (F32(0.5) * r).astype(F32)
    return (r * F32(1.0 / np.sqrt(shape[-1]))).astype(F32)


class Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, seq):
        shape = x.shape
        x32 = x.reshape(-1, shape[-1]).detach().numpy().astype(F32)
        w32 = w.detach().numpy().astype(F32)
        xc, xs = quantize(x32, 1, TILE, 0)
        wc, ws = quantize(w32, TILE, TILE, 0)
        y = gemm(xc, xs, (1, TILE), False, wc, ws, (TILE, TILE), True)
        ctx.save_for_backward(torch.from_numpy(x32), torch.from_numpy(w32))
        ctx.shape = shape
        ctx.seq = seq
        return torch.from_numpy(y.astype(np.float64)).reshape(*shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, dy):
        x32, w32 = (t.numpy() for t in ctx.saved_tensors)
        dy32 = dy.reshape(-1, dy.shape[-1]).numpy().astype(F32)
        wc, ws = quantize(w32, TILE, TILE, 0)
        dyc, dys = quantize(dy32, 1, TILE, 0)
        dx = gemm(dyc, dys, (1, TILE), False, wc, ws, (TILE, TILE), False)
        dw = np.zeros(w32.shape, dtype=F32)
        seq = ctx.seq
        for s0 in range(0, x32.shape[0], seq):  # one product per sequence (chunk), added in order
            dtc, dts = quantize(dy32[s0:s0 + seq], TILE, 1, 0)
            xtc, xts = quantize(x32[s0:s0 + seq], TILE, 1, 0)
            dw = (dw + gemm(dtc, dts, (TILE, 1), True, xtc, xts, (TILE, 1), False)).astype(F32)
        return (torch.from_numpy(dx.astype(np.float64)).reshape(ctx.shape),
                torch.from_numpy(dw.astype(np.float64)), None)


class Fp8Module(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.weight = lin.weight

    def forward(self, x):
        return Fp8Linear.apply(x, self.weight, T)


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Mixtral's experts as src/model/moe.c runs them: each expert's tokens in token order, its
    gate_up and down on FP8 (chunks of EXPERT_ROWS rows for dW), weighted, added."""
    out = torch.zeros_like(hidden_states)
    for e in range(self.num_experts):
        tok, pos = torch.where(top_k_index == e)  # token-major: token order
        if tok.numel() == 0:
            continue
        x = hidden_states[tok]
        gate, up = Fp8Linear.apply(x, self.gate_up_proj[e], EXPERT_ROWS).chunk(2, dim=-1)
        h = Fp8Linear.apply(self.act_fn(gate) * up, self.down_proj[e], EXPERT_ROWS)
        out = out.index_add(0, tok, h * top_k_weights[tok, pos, None])
    return out


def main(family, out):
    common = dict(hidden_size=H, intermediate_size=I if family == "llama" else I_EXPERT, num_hidden_layers=1, num_attention_heads=NH,
                  num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=T, rms_norm_eps=1e-5,
                  rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu", attention_dropout=0.0)
    if family == "llama":
        cfg = LlamaConfig(attention_bias=False, mlp_bias=False, **common)
    else:
        cfg = MixtralConfig(num_local_experts=E, num_experts_per_tok=K, router_aux_loss_coef=0.0,
                            router_jitter_noise=0.0, **common)
    cfg._attn_implementation = "eager"
    model = (LlamaForCausalLM if family == "llama" else MixtralForCausalLM)(cfg).to(torch.float64)
    model.eval()
    params = dict(model.named_parameters())
    names = NAMES[family]
    assert sorted(names) == sorted(params.keys()), sorted(set(names) ^ set(params.keys()))
    for i, name in enumerate(names):
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(weight(name, i, tuple(params[name].shape)).astype(np.float64)))
    layer = model.model.layers[0]
    for path in FP8 if family == "llama" else FP8[:4]:
        parent, attr = path.split(".")
        mod = getattr(layer, parent)
        setattr(mod, attr, Fp8Module(getattr(mod, attr)))
    if family == "mixtral":
        ex = layer.mlp.experts
        ex.forward = experts_forward.__get__(ex)

    r = splitmix_f32(7, 2 * B * T)
    tokens = np.minimum((r[:B * T] * 0.5 + 0.5) * V, V - 1).astype(np.int64).reshape(B, T)
    targets = np.minimum((r[B * T:] * 0.5 + 0.5) * V, V - 1).astype(np.int64).reshape(B, T)
    logits = model(input_ids=torch.from_numpy(tokens)).logits
    loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1), reduction="mean")
    loss.backward()
    print(f"{family}: loss {loss.item():.10f}")

    recs = [("loss", np.array([loss.item()], dtype=F32)), ("logits", logits.detach().reshape(B * T, V).numpy())]
    for name in names:
        recs.append(("grad." + name, params[name].grad.numpy()))
    with open(out, "wb") as f:
        f.write(b"RFFP8REF" + struct.pack("<II", 1, len(recs)))
        for name, a in recs:
            a = np.ascontiguousarray(a, dtype=F32)
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb + struct.pack("<II", 0, a.ndim))
            f.write(struct.pack(f"<{a.ndim}q", *a.shape))
            f.write(a.astype("<f4").tobytes())
    print(f"wrote {out}: {len(recs)} records")


if __name__ == "__main__":
    main("llama", os.path.join(HERE, "data", "fp8_layer_ref.bin"))
    main("mixtral", os.path.join(HERE, "data", "fp8_moe_ref.bin"))
