#!/usr/bin/env python3
"""Reference values for tests/test_model_ref.c from Hugging Face's own LlamaForCausalLM.

Builds a tiny LlamaForCausalLM (float64, eager attention), loads weights from a
deterministic generator, runs a batch of tokens, and writes the weights, tokens,
targets, logits, the mean cross-entropy loss and every parameter gradient to
tests/data/llama_ref.bin; the model's config.json (as transformers writes it) goes
to tests/data/llama_ref_config.json.

Usage: /work/venv/bin/python tests/ref_llama.py   (needs torch, transformers, numpy)

Format of llama_ref.bin (little-endian):
  u32 magic 0x4645524c ("LREF"), u32 version 2
  i32 hidden, inter, layers, heads, kv_heads, vocab, max_pos, B, T
  f64 rms_norm_eps, rope_theta, loss (mean over targets >= 0)
  i32 tokens[B*T], i32 targets[B*T] (-1: ignored)
  f32 logits[B*T*vocab]
  f32 weights of every tensor, in the model's unit order (see src/model/model.h)
  f32 gradients of the mean loss, same order
  i32 T_long, i32 tokens_long[T_long], f32 logits_long[T_long*vocab]   (one sequence, forward only)
"""
import os
import struct
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ref_common import batch, cross_entropy, float64_model, ids, set_weights, write_config, write_ref

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "llama_ref.bin")
OUT_CFG = os.path.join(HERE, "data", "llama_ref_config.json")

H, I, L, NH, NKV, V, MAXPOS, B, T = 64, 96, 2, 4, 2, 67, 512, 2, 9
T_LONG = 300  # a second, forward-only sequence: rotary at long positions, several attention blocks
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
    model = float64_model(LlamaForCausalLM, cfg)

    rng = np.random.RandomState(20261123)
    names = tensor_names()
    params, weights = set_weights(model, names, rng, lambda name, shape: None)
    tokens, targets = batch(rng, B, T, V, [(0, 3), (1, 7)])

    logits = model(input_ids=ids(tokens)).logits  # [B, T, V]
    loss = cross_entropy(logits, targets)
    loss.backward()
    print(f"loss {loss.item():.10f}", file=sys.stderr)

    tokens_long = rng.randint(0, V, size=(1, T_LONG)).astype(np.int32)
    with torch.no_grad():
        logits_long = model(input_ids=ids(tokens_long)).logits[0]

    header = struct.pack("<II", 0x4645524C, 2) + struct.pack("<9i", H, I, L, NH, NKV, V, MAXPOS, B, T)
    header += struct.pack("<3d", EPS, THETA, loss.item())
    tail = struct.pack("<i", T_LONG) + tokens_long.astype("<i4").tobytes()
    tail += logits_long.numpy().astype("<f4").tobytes()
    write_ref(OUT, header, tokens, targets, logits, names, weights, params, tail)
    write_config(cfg, OUT_CFG)
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes) and {OUT_CFG}", file=sys.stderr)


if __name__ == "__main__":
    main()
