#!/usr/bin/env python3
"""Reference values for tests/test_model_moe.c from transformers' own GptOssForCausalLM.

Builds a tiny GptOssForCausalLM in float64 with eager attention and the eager experts
loop: hidden 32, 2 layers (layer_types sliding_attention, full_attention; sliding_window 4
< T = 9), 4 heads of head_dim 16 over 2 kv heads, 4 experts of intermediate 24, top-2,
swiglu_limit 1.2 (so that some gate and up values are clamped), YaRN rotary (factor 32,
beta_fast 32, beta_slow 1, original_max_position_embeddings 4096, truncate false, as the
published GPT-OSS config; rope_theta 150000), attention sinks, biases everywhere,
output_router_logits so that the loss is the mean cross-entropy plus
router_aux_loss_coef times the load-balancing loss. Weights come from a seeded numpy
generator. The routing is checked to be away from ties (the k-th and (k+1)-th router
logits differ by more than MARGIN at every token and layer) and every clamped SwiGLU input
away from the limit (by more than MARGIN), so the f32 model takes the same branches.

Also the logits of one sequence of LONG = 150 tokens (forward only: YaRN at longer positions,
query blocks of 64 whose windows cross block boundaries), with the weights as transformers
saves them, to tests/data/gpt_oss_long/ (weights.safetensors, tokens.i32, logits.f32), the
routing margin held there too (the clamp, continuous, needs none for a forward); the C test
runs them through `rfsdp logits`.

Writes tests/data/gpt_oss_ref.bin in the format of tests/ref_mixtral.py (magic "MREF",
version 1, B, T, loss, aux, tokens, targets, logits, weights, gradients, the tensors in
rf_model_desc_make's order) and transformers' config.json to tests/data/gpt_oss_ref_config.json.

Usage: /work/venv/bin/python tests/ref_gpt_oss.py   (needs torch, transformers, numpy)
"""
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.models.gpt_oss import modeling_gpt_oss

from ref_common import (batch, cross_entropy, float64_model, ids, mref_header, set_weights, write_config,
                        write_ref)

HERE = os.path.dirname(os.path.abspath(__file__))

H, I, L, NH, NKV, HD, V, MAXPOS, E, K, B, T = 32, 24, 2, 4, 2, 16, 51, 256, 4, 2, 2, 9
LONG = 150  # the long sequence: 3 blocks of 64 (the last partial), the window crossing them
EPS, THETA, COEF, LIMIT, WINDOW = 1e-5, 150000.0, 0.05, 1.2, 4
MARGIN = 1e-3

gate_inputs = []  # every gate_up value the experts clamp (recorded by the hook below)
_apply_gate = modeling_gpt_oss.GptOssExperts._apply_gate


def recording_gate(self, gate_up):
    gate_inputs.append(gate_up.detach().clone())
    return _apply_gate(self, gate_up)


modeling_gpt_oss.GptOssExperts._apply_gate = recording_gate


def tensor_names():
    names = ["model.embed_tokens.weight"]
    for l in range(L):
        p = f"model.layers.{l}."
        names.append(p + "input_layernorm.weight")
        for x in "qkvo":
            names += [p + f"self_attn.{x}_proj.weight", p + f"self_attn.{x}_proj.bias"]
        names += [p + "self_attn.sinks", p + "post_attention_layernorm.weight", p + "mlp.router.weight",
                  p + "mlp.router.bias", p + "mlp.experts.gate_up_proj", p + "mlp.experts.gate_up_proj_bias",
                  p + "mlp.experts.down_proj", p + "mlp.experts.down_proj_bias"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


def scale(name, shape):
    if name.endswith("router.weight"):
        return 2.0 / np.sqrt(shape[-1])  # decisive routing
    if name.endswith("sinks"):
        return 1.0
    if name.endswith("bias"):
        return 0.2
    if name.endswith("gate_up_proj") or name.endswith("down_proj"):
        return 1.0 / np.sqrt(shape[-2])  # [in, out]
    return None


def build(seed):
    cfg = GptOssConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=NH,
                       num_key_value_heads=NKV, head_dim=HD, vocab_size=V, max_position_embeddings=MAXPOS,
                       rms_norm_eps=EPS, num_local_experts=E, num_experts_per_tok=K, sliding_window=WINDOW,
                       layer_types=["sliding_attention", "full_attention"], swiglu_limit=LIMIT,
                       rope_parameters={"rope_type": "yarn", "rope_theta": THETA, "factor": 32.0, "beta_fast": 32.0,
                                        "beta_slow": 1.0, "truncate": False,
                                        "original_max_position_embeddings": 4096},
                       tie_word_embeddings=False, output_router_logits=True, router_aux_loss_coef=COEF,
                       attention_dropout=0.0)
    model = float64_model(GptOssForCausalLM, cfg, experts=True)
    rng = np.random.RandomState(seed)
    names = tensor_names()
    params, weights = set_weights(model, names, rng, scale)
    tokens, targets = batch(rng, B, T, V, [(0, 3), (1, 5)])
    return cfg, model, params, names, weights, tokens, targets


def margin(router_logits):
    worst = 1.0
    for z in router_logits:
        top = torch.topk(z.double(), K + 1, dim=-1).values
        worst = min(worst, (top[:, K - 1] - top[:, K]).min().item())
    return worst


def clamp_margin():
    return min((g.abs() - LIMIT).abs().min().item() for g in gate_inputs)


def clamped():
    gate = sum((g[..., ::2] > LIMIT).sum().item() for g in gate_inputs)
    up = sum((g[..., 1::2].abs() > LIMIT).sum().item() for g in gate_inputs)
    return gate, up


def main():
    out_path = os.path.join(HERE, "data", "gpt_oss_ref.bin")
    cfg_path = os.path.join(HERE, "data", "gpt_oss_ref_config.json")
    seed = 20261203
    while True:
        cfg, model, params, names, weights, tokens, targets = build(seed)
        gate_inputs.clear()
        out = model(input_ids=ids(tokens))
        batch_clamp = clamp_margin()  # the clamp is continuous: the long forward needs no margin there
        long_tokens = np.random.RandomState(seed + 1).randint(0, V, size=(1, LONG)).astype(np.int32)
        long_out = model(input_ids=ids(long_tokens))
        if margin(out.router_logits) > MARGIN and margin(long_out.router_logits) > MARGIN and batch_clamp > MARGIN:
            break
        seed += 1
    long_dir = os.path.join(HERE, "data", "gpt_oss_long")
    os.makedirs(long_dir, exist_ok=True)
    save_file({n: torch.from_numpy(weights[n]) for n in names}, os.path.join(long_dir, "weights.safetensors"))
    long_tokens.astype("<i4").tofile(os.path.join(long_dir, "tokens.i32"))
    long_out.logits.detach().numpy().astype("<f4").tofile(os.path.join(long_dir, "logits.f32"))
    gate_inputs.clear()
    out = model(input_ids=ids(tokens))
    ce = cross_entropy(out.logits, targets)
    loss = ce + COEF * out.aux_loss
    loss.backward()
    print(f"gpt_oss: seed {seed} loss {loss.item():.10f} aux {out.aux_loss.item():.10f} "
          f"router margin {margin(out.router_logits):.2e} clamp margin {clamp_margin():.2e} "
          f"clamped (gate, up) {clamped()}", file=sys.stderr)
    header = mref_header(B, T, loss.item(), out.aux_loss.item())
    write_ref(out_path, header, tokens, targets, out.logits, names, weights, params)
    write_config(cfg, cfg_path)
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes) and {cfg_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
