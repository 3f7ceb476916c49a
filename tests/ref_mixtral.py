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
import os
import sys

import numpy as np
import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

from ref_common import (batch, cross_entropy, float64_model, ids, mref_header, set_weights, write_config,
                        write_ref)

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


def scale(name, shape):
    if name.endswith("mlp.gate.weight"):
        return 2.0 / np.sqrt(shape[-1])  # decisive routing
    return None


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
    model = float64_model(cls, cfg, experts=True)
    rng = np.random.RandomState(seed)
    names = tensor_names(family)
    params, weights = set_weights(model, names, rng, scale)
    tokens, targets = batch(rng, B, T, V, [(0, 3), (1, 5)])
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
        out = model(input_ids=ids(tokens))
        if margin(out.router_logits) > MARGIN and (not zero or any(e < E - 1 for _, e in idle_experts(out.router_logits))):
            break
        seed += 1
    if zero:
        print(f"{tag}: idle (layer, expert): {idle_experts(out.router_logits)}", file=sys.stderr)
    out = model(input_ids=ids(tokens))
    # transformers' loss: the shifted causal LM loss; ours takes targets as given, so rebuild it from logits
    ce = cross_entropy(out.logits, targets)
    loss = ce + COEF * out.aux_loss
    loss.backward()
    print(f"{family}: seed {seed} loss {loss.item():.10f} aux {out.aux_loss.item():.10f} margin {margin(out.router_logits):.2e}",
          file=sys.stderr)
    header = mref_header(B, T, loss.item(), out.aux_loss.item())
    write_ref(out_path, header, tokens, targets, out.logits, names, weights, params)
    write_config(cfg, cfg_path)
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes) and {cfg_path}", file=sys.stderr)


def main():
    write("mixtral")
    write("qwen3_moe")
    write("mixtral", zero=True)


if __name__ == "__main__":
    main()
