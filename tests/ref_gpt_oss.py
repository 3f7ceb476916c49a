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
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import GptOssConfig, GptOssForCausalLM
from transformers.models.gpt_oss import modeling_gpt_oss

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
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = GptOssForCausalLM(cfg).to(torch.float64)
    model.config._experts_implementation = "eager"  # the per-expert loop (grouped_mm takes no float64)
    model.eval()
    rng = np.random.RandomState(seed)
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
        elif name.endswith("router.weight"):
            w = (2.0 / np.sqrt(shape[-1])) * rng.standard_normal(shape)  # decisive routing
        elif name.endswith("sinks"):
            w = rng.standard_normal(shape)
        elif name.endswith("bias"):
            w = 0.2 * rng.standard_normal(shape)
        elif name.endswith("gate_up_proj") or name.endswith("down_proj"):
            w = (1.0 / np.sqrt(shape[-2])) * rng.standard_normal(shape)  # [in, out]
        else:
            w = (1.0 / np.sqrt(shape[-1])) * rng.standard_normal(shape)
        weights[name] = w.astype(np.float32)
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(weights[name].astype(np.float64)))
    tokens = rng.randint(0, V, size=(B, T)).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.randint(0, V, size=(B, 1))], axis=1).astype(np.int32)
    targets[0, 3] = -1  # ignored positions
    targets[1, 5] = -1
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
        out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)))
        batch_clamp = clamp_margin()  # the clamp is continuous: the long forward needs no margin there
        long_tokens = np.random.RandomState(seed + 1).randint(0, V, size=(1, LONG)).astype(np.int32)
        long_out = model(input_ids=torch.from_numpy(long_tokens.astype(np.int64)))
        if margin(out.router_logits) > MARGIN and margin(long_out.router_logits) > MARGIN and batch_clamp > MARGIN:
            break
        seed += 1
    long_dir = os.path.join(HERE, "data", "gpt_oss_long")
    os.makedirs(long_dir, exist_ok=True)
    save_file({n: torch.from_numpy(weights[n]) for n in names}, os.path.join(long_dir, "weights.safetensors"))
    long_tokens.astype("<i4").tofile(os.path.join(long_dir, "tokens.i32"))
    long_out.logits.detach().numpy().astype("<f4").tofile(os.path.join(long_dir, "logits.f32"))
    gate_inputs.clear()
    tt = torch.from_numpy(targets.astype(np.int64)).clone()
    tt[tt < 0] = -100
    out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)), labels=tt)
    ce = F.cross_entropy(out.logits.reshape(-1, V), tt.reshape(-1), ignore_index=-100, reduction="mean")
    loss = ce + COEF * out.aux_loss
    loss.backward()
    print(f"gpt_oss: seed {seed} loss {loss.item():.10f} aux {out.aux_loss.item():.10f} "
          f"router margin {margin(out.router_logits):.2e} clamp margin {clamp_margin():.2e} "
          f"clamped (gate, up) {clamped()}", file=sys.stderr)
    with open(out_path + ".tmp", "wb") as f:
        f.write(struct.pack("<II", 0x4645524D, 1))
        f.write(struct.pack("<2i", B, T))
        f.write(struct.pack("<2d", loss.item(), out.aux_loss.item()))
        f.write(tokens.astype("<i4").tobytes())
        f.write(targets.astype("<i4").tobytes())
        f.write(out.logits.detach().numpy().astype("<f4").tobytes())
        for name in names:
            f.write(weights[name].astype("<f4").tobytes())
        for name in names:
            f.write(params[name].grad.detach().numpy().astype("<f4").tobytes())
    os.replace(out_path + ".tmp", out_path)
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            text = json.load(f)
    with open(cfg_path, "w") as f:
        json.dump(text, f, indent=2, sort_keys=True)
        f.write("\n")
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes) and {cfg_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
