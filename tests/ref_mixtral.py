#!/usr/bin/env python3
"""Reference values for tests/test_model_moe.c from transformers' own MixtralForCausalLM
and Qwen3MoeForCausalLM.

Builds a tiny MixtralForCausalLM (float64, eager attention, 4 experts, top-2,
output_router_logits so that the loss is the mean cross-entropy plus
router_aux_loss_coef times the load-balancing loss), loads weights from a
deterministic generator, runs a batch of tokens, and writes the weights, tokens,
targets, logits, the loss, the load-balancing loss and every parameter gradient
to tests/data/mixtral_ref.bin; the config.json transformers writes goes to
tests/data/mixtral_ref_config.json. The same for a tiny Qwen3MoeForCausalLM
(q/k norms, experts of moe_intermediate_size 20, norm_topk_prob false, layer 1
dense by mlp_only_layers, intermediate_size 40) into tests/data/qwen3_moe_ref.bin
and qwen3_moe_ref_config.json. And the Mixtral once more on the first batch (seed) where
some expert other than the last of some layer gets no token at all
(tests/data/mixtral_zero_ref.bin and its config): that expert's gradients are zero, the
experts after it are computed as usual. The routing is checked to be away from ties:
at every token and layer the k-th and (k+1)-th router probabilities differ by
more than MARGIN (the C model in f32 then picks the same experts).

Usage: /work/venv/bin/python tests/ref_mixtral.py   (needs torch, transformers, numpy)

Format of mixtral_ref.bin (little-endian):
  u32 magic 0x4645524d ("MREF"), u32 version 1
  i32 B, T
  f64 loss (mean over targets >= 0, plus coef * aux), aux (the load-balancing loss)
  i32 tokens[B*T], i32 targets[B*T] (-1: ignored)
  f32 logits[B*T*vocab]
  f32 weights of every tensor, in the model's unit order (src/model/model.h)
  f32 gradients of the loss, same order
"""
import json
import os
import struct
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))

H, I, L, NH, NKV, V, MAXPOS, E, K, B, T = 32, 24, 2, 4, 2, 51, 64, 4, 2, 2, 7
EPS, THETA, COEF = 1e-5, 10000.0, 0.05
MARGIN = 1e-3


QWEN_DENSE = [1]  # qwen3_moe: layer 1 is dense (mlp_only_layers)


def tensor_names(family):
    names = ["model.embed_tokens.weight"]
    for l in range(L):
        p = f"model.layers.{l}."
        names += [p + "input_layernorm.weight", p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight", p + "post_attention_layernorm.weight"]
        if family == "qwen3_moe" and l in QWEN_DENSE:
            names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", p + "mlp.down_proj.weight"]
        else:
            names += [p + "mlp.gate.weight", p + "mlp.experts.gate_up_proj", p + "mlp.experts.down_proj"]
        if family == "qwen3_moe":
            names += [p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"]
    names += ["model.norm.weight", "lm_head.weight"]
    return names


def build(family, seed):
    common = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV, vocab_size=V,
                  max_position_embeddings=MAXPOS, rms_norm_eps=EPS,
                  rope_parameters={"rope_type": "default", "rope_theta": THETA}, tie_word_embeddings=False,
                  num_experts_per_tok=K, output_router_logits=True, router_aux_loss_coef=COEF, hidden_act="silu",
                  attention_dropout=0.0)
    if family == "mixtral":
        cfg = MixtralConfig(intermediate_size=I, num_local_experts=E, **common)
        cls = MixtralForCausalLM
    else:
        cfg = Qwen3MoeConfig(intermediate_size=40, moe_intermediate_size=20, num_experts=E, norm_topk_prob=False,
                             mlp_only_layers=QWEN_DENSE, decoder_sparse_step=1, head_dim=H // NH, **common)
        cls = Qwen3MoeForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(cfg).to(torch.float64)
    model.config._experts_implementation = "eager"  # the per-expert loop (grouped_mm takes no float64)
    model.eval()
    rng = np.random.RandomState(seed)
    params = dict(model.named_parameters())
    names = tensor_names(family)
    assert sorted(names) == sorted(params.keys()), sorted(set(params.keys()) ^ set(names))
    weights = {}
    for name in names:
        shape = tuple(params[name].shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            w = 0.5 * rng.standard_normal(shape)
        elif name.endswith("mlp.gate.weight"):
            w = (2.0 / np.sqrt(shape[-1])) * rng.standard_normal(shape)  # decisive routing
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
        p = torch.softmax(z.double(), dim=-1)
        top = torch.topk(p, K + 1, dim=-1).values
        worst = min(worst, (top[:, K - 1] - top[:, K]).min().item())
    return worst


def idle_experts(router_logits):
    """The (layer, expert) pairs that no token chose."""
    idle = []
    for l, z in enumerate(router_logits):
        chosen = set(torch.topk(z.double(), K, dim=-1).indices.flatten().tolist())
        idle += [(l, e) for e in range(E) if e not in chosen]
    return idle


def write(family, zero=False):
    """zero: a batch where some expert of some layer gets no token (the first seed from
    20261125 where that happens, away from ties), written as mixtral_zero_ref.bin."""
    tag = f"{family}_zero" if zero else family
    out_path = os.path.join(HERE, "data", f"{tag}_ref.bin")
    cfg_path = os.path.join(HERE, "data", f"{tag}_ref_config.json")
    seed = 20261125
    while True:
        cfg, model, params, names, weights, tokens, targets = build(family, seed)
        out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)))
        if margin(out.router_logits) > MARGIN and (not zero or any(e < E - 1 for _, e in idle_experts(out.router_logits))):
            break
        seed += 1
    if zero:
        print(f"{tag}: idle (layer, expert): {idle_experts(out.router_logits)}", file=sys.stderr)
    tt = torch.from_numpy(targets.astype(np.int64)).clone()
    tt[tt < 0] = -100
    out = model(input_ids=torch.from_numpy(tokens.astype(np.int64)), labels=tt)
    # transformers' loss: the shifted causal LM loss; ours takes targets as given, so rebuild it from logits
    ce = F.cross_entropy(out.logits.reshape(-1, V), tt.reshape(-1), ignore_index=-100, reduction="mean")
    loss = ce + COEF * out.aux_loss
    loss.backward()
    print(f"{family}: seed {seed} loss {loss.item():.10f} aux {out.aux_loss.item():.10f} margin {margin(out.router_logits):.2e}",
          file=sys.stderr)
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


def main():
    write("mixtral")
    write("qwen3_moe")
    write("mixtral", zero=True)


if __name__ == "__main__":
    main()
