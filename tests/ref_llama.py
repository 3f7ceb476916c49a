#!/usr/bin/env python3
"""Reference values for tests/test_model_ref.c from Hugging Face's own LlamaForCausalLM.

Builds a tiny LlamaForCausalLM (float64, eager attention), loads weights from a
deterministic generator, runs a batch of tokens, and writes the weights, tokens,
targets, logits, the mean cross-entropy loss and every parameter gradient to
tests/data/llama_ref.bin; the model's config.json (as transformers writes it) goes
to tests/data/llama_ref_config.json.

Usage: /work/main/.venv/bin/python tests/ref_llama.py   (needs torch, transformers, numpy)

Format of llama_ref.bin (little-endian):
  u32 magic 0x4645524c ("LREF"), u32 version 1
  i32 hidden, inter, layers, heads, kv_heads, vocab, max_pos, B, T
  f64 rms_norm_eps, rope_theta, loss (mean over targets >= 0)
  i32 tokens[B*T], i32 targets[B*T] (-1: ignored)
  f32 logits[B*T*vocab]
  f32 weights of every tensor, in the model's unit order (see src/model/model.h)
  f32 gradients of the mean loss, same order
"""
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "llama_ref.bin")
OUT_CFG = os.path.join(HERE, "data", "llama_ref_config.json")

H, I, L, NH, NKV, V, MAXPOS, B, T = 64, 96, 2, 4, 2, 67, 32, 2, 9
EPS, THETA = 1e-5, 10000.0


def tensor_names():
    names = ["model.embed_tokens.weight"]
    for l in range(L):
        p = f"model.layers.{l}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
                  p + "post_attention_layernorm.weight", p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


def main():
    cfg = LlamaConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                      num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=MAXPOS, rms_norm_eps=EPS,
                      rope_theta=THETA, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                      hidden_act="silu", attention_dropout=0.0)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.float64)
    model.eval()

    rng = np.random.RandomState(20261123)
    params = dict(model.named_parameters())
    names = tensor_names()
    assert sorted(names) == sorted(params.keys()), sorted(set(params.keys()) ^ set(names))
    weights = {}
    for name in names:
        shape = tuple(params[name].shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            w = 0.5 * rng.standard_normal(shape)
        else:
            w = (1.0 / np.sqrt(shape[1])) * rng.standard_normal(shape)
        weights[name] = w.astype(np.float32)
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(weights[name].astype(np.float64)))

    tokens = rng.randint(0, V, size=(B, T)).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.randint(0, V, size=(B, 1))], axis=1).astype(np.int32)
    targets[0, 3] = -1  # ignored positions
    targets[1, 7] = -1

    out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)))
    logits = out.logits  # [B, T, V]
    tt = torch.from_numpy(targets.astype(np.int64)).clone()
    tt[tt < 0] = -100
    loss = F.cross_entropy(logits.reshape(-1, V), tt.reshape(-1), ignore_index=-100, reduction="mean")
    loss.backward()
    print(f"loss {loss.item():.10f}", file=sys.stderr)

    with open(OUT + ".tmp", "wb") as f:
        f.write(struct.pack("<II", 0x4645524C, 1))
        f.write(struct.pack("<9i", H, I, L, NH, NKV, V, MAXPOS, B, T))
        f.write(struct.pack("<3d", EPS, THETA, loss.item()))
        f.write(tokens.astype("<i4").tobytes())
        f.write(targets.astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        for name in names:
            f.write(weights[name].astype("<f4").tobytes())
        for name in names:
            f.write(params[name].grad.detach().numpy().astype("<f4").tobytes())
    os.replace(OUT + ".tmp", OUT)

    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            text = json.load(f)
    with open(OUT_CFG, "w") as f:
        json.dump(text, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes) and {OUT_CFG}", file=sys.stderr)


if __name__ == "__main__":
    main()
