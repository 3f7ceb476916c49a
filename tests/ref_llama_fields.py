#!/usr/bin/env python3
"""Reference values for tests/test_model_fields.c from transformers' LlamaForCausalLM
with the config fields beyond the plain LLaMA (tie_word_embeddings, attention_bias,
mlp_bias and a head_dim other than hidden_size / num_attention_heads), and from
Qwen2ForCausalLM (q, k, v biases, no o bias; tied as Qwen2-0.5B).

For each variant, builds a tiny model (float64, eager attention) with weights from
a deterministic generator, runs a batch, and writes tests/data/<variant>.bin and
the config.json transformers writes (tests/data/<variant>_config.json), which the
C test reads through rf_model_config_load.

Usage: /work/venv/bin/python tests/ref_llama_fields.py   (needs torch, transformers, numpy)

Format of <variant>.bin (little-endian):
  u32 magic 0x4645524c ("LREF"), u32 version 3
  i32 B, T; f64 loss (mean over targets >= 0)
  i32 tokens[B*T], i32 targets[B*T] (-1: ignored)
  f32 logits[B*T*vocab]
  i32 n_tensors; per tensor, in the model's unit order (rf_model_desc_make):
    i32 name length, the name's bytes, i32 numel
  f32 weights of every tensor, same order; f32 gradients of the mean loss, same order
  i32 T_long, i32 tokens_long[T_long], f32 logits_long[T_long*vocab]   (one sequence, forward only)
"""
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
H, I, L, NH, NKV, V, MAXPOS, B, T = 64, 96, 2, 4, 2, 67, 512, 2, 9
T_LONG = 200
EPS, THETA = 1e-5, 10000.0

VARIANTS = {
    # a tied-embedding LLaMA whose heads are wider than hidden_size / heads
    "llama_tied": dict(tie_word_embeddings=True, attention_bias=False, mlp_bias=False, head_dim=24),
    # biases on the attention and the MLP projections, heads narrower than hidden_size / heads
    "llama_bias": dict(tie_word_embeddings=False, attention_bias=True, mlp_bias=True, head_dim=8),
    # Qwen2: q, k, v biases (no o bias, no MLP bias), tied embeddings
    "qwen2_tied": dict(tie_word_embeddings=True),
}

LAYER = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
         "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
ATT_BIAS = ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias"]
MLP_BIAS = ["mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias"]


def tensor_names(name, v):
    """The order of src/model/desc.c: untied, embed / layers / norm + lm_head; tied, layers / norm + embedding."""
    names = [] if v["tie_word_embeddings"] else ["model.embed_tokens.weight"]
    for l in range(L):
        p = f"model.layers.{l}."
        names += [p + n for n in LAYER]
        if name.startswith("qwen2"):
            names += [p + n for n in ATT_BIAS[:3]]
        if v.get("attention_bias"):
            names += [p + n for n in ATT_BIAS]
        if v.get("mlp_bias"):
            names += [p + n for n in MLP_BIAS]
    names += ["model.norm.weight", "model.embed_tokens.weight" if v["tie_word_embeddings"] else "lm_head.weight"]
    return names


def run(name, v):
    out_bin = os.path.join(HERE, "data", f"{name}.bin")
    out_cfg = os.path.join(HERE, "data", f"{name}_config.json")
    qwen2 = name.startswith("qwen2")
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if qwen2 else (LlamaConfig, LlamaForCausalLM)
    cfg = config_cls(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                     num_key_value_heads=NKV, vocab_size=V, max_position_embeddings=MAXPOS, rms_norm_eps=EPS,
                     rope_theta=THETA, hidden_act="silu", attention_dropout=0.0, **v)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.float64)
    model.eval()
    if v["tie_word_embeddings"]:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    rng = np.random.RandomState(20261125)
    params = dict(model.named_parameters())  # a tied weight appears once, as model.embed_tokens.weight
    names = tensor_names(name, v)
    assert sorted(names) == sorted(params.keys()), sorted(set(params.keys()) ^ set(names))
    weights = {}
    for n in names:
        shape = tuple(params[n].shape)
        if n.endswith("norm.weight"):
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in n:
            w = 0.5 * rng.standard_normal(shape)
        elif n.endswith(".bias"):
            w = 0.3 * rng.standard_normal(shape)
        else:
            w = (1.0 / np.sqrt(shape[1])) * rng.standard_normal(shape)
        weights[n] = w.astype(np.float32)
        with torch.no_grad():
            params[n].copy_(torch.from_numpy(weights[n].astype(np.float64)))

    tokens = rng.randint(0, V, size=(B, T)).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.randint(0, V, size=(B, 1))], axis=1).astype(np.int32)
    targets[0, 3] = -1
    targets[1, 7] = -1

    logits = model(input_ids=torch.from_numpy(tokens.astype(np.int64))).logits
    tt = torch.from_numpy(targets.astype(np.int64)).clone()
    tt[tt < 0] = -100
    loss = F.cross_entropy(logits.reshape(-1, V), tt.reshape(-1), ignore_index=-100, reduction="mean")
    loss.backward()
    print(f"{name}: loss {loss.item():.10f}", file=sys.stderr)

    tokens_long = rng.randint(0, V, size=(1, T_LONG)).astype(np.int32)
    with torch.no_grad():
        logits_long = model(input_ids=torch.from_numpy(tokens_long.astype(np.int64))).logits[0]

    with open(out_bin + ".tmp", "wb") as f:
        f.write(struct.pack("<II", 0x4645524C, 3))
        f.write(struct.pack("<2i", B, T))
        f.write(struct.pack("<d", loss.item()))
        f.write(tokens.astype("<i4").tobytes())
        f.write(targets.astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<i", len(names)))
        for n in names:
            f.write(struct.pack("<i", len(n)) + n.encode() + struct.pack("<i", weights[n].size))
        for n in names:
            f.write(weights[n].astype("<f4").tobytes())
        for n in names:
            f.write(params[n].grad.detach().numpy().astype("<f4").tobytes())
        f.write(struct.pack("<i", T_LONG))
        f.write(tokens_long.astype("<i4").tobytes())
        f.write(logits_long.numpy().astype("<f4").tobytes())
    os.replace(out_bin + ".tmp", out_bin)

    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            text = json.load(f)
    with open(out_cfg, "w") as f:
        json.dump(text, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {out_bin} ({os.path.getsize(out_bin)} bytes) and {out_cfg}", file=sys.stderr)


def main():
    for name, v in VARIANTS.items():
        run(name, v)


if __name__ == "__main__":
    main()
