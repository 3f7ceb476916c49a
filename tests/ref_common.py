"""What the reference scripts share (tests/ref_llama.py, ref_mixtral.py, ref_gpt_oss.py and the
_export scripts): a tiny transformers model in float64 with eager attention, weights from a seeded
numpy generator, a batch with ignored targets, and the dump of weights, logits and gradients that
the C tests read (tests/test_model_ref.c, tests/test_model_moe.c, tests/test_ckpt_moe.c).

Only the scripts import it (they are run by hand with /work/venv/bin/python); `make test` reads the
files they wrote and needs no Python.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file


def float64_model(model_cls, cfg, experts=False):
    """model_cls(cfg) in float64 and eval mode, eager attention; experts: the per-expert loop
    (transformers' grouped_mm takes no float64). The default init is seeded (torch seed 0), so
    parameters a script does not overwrite are the same every run."""
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = model_cls(cfg).to(torch.float64)
    if experts:
        model.config._experts_implementation = "eager"
    model.eval()
    return model


def set_weights(model, names, rng, scale):
    """Draws every tensor of `names` (in that order, one standard_normal draw each from rng) as
    norms 1 + 0.2 n, the embedding 0.5 n and the rest scale(name, shape) * n (scale may return
    None for 1 / sqrt(fan-in), the last dimension), rounded to float32 and copied into the model.
    Checks that `names` are exactly the model's parameters. Returns (params, weights): the model's
    parameters by name and the float32 weights by name."""
    params = dict(model.named_parameters())
    assert sorted(names) == sorted(params.keys()), sorted(set(params.keys()) ^ set(names))
    weights = {}
    for name in names:
        shape = tuple(params[name].shape)
        if name.endswith("norm.weight"):
            w = 1.0 + 0.2 * rng.standard_normal(shape)
        elif "embed_tokens" in name:
            w = 0.5 * rng.standard_normal(shape)
        else:
            s = scale(name, shape)
            w = (1.0 / np.sqrt(shape[-1]) if s is None else s) * rng.standard_normal(shape)
        weights[name] = w.astype(np.float32)
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(weights[name].astype(np.float64)))
    return params, weights


def batch(rng, b, t, vocab, ignored):
    """tokens [b, t] and targets (the next token, the last one drawn) as int32; the (row, column)
    pairs in `ignored` get target -1."""
    tokens = rng.randint(0, vocab, size=(b, t)).astype(np.int32)
    targets = np.concatenate([tokens[:, 1:], rng.randint(0, vocab, size=(b, 1))], axis=1).astype(np.int32)
    for r, c in ignored:
        targets[r, c] = -1
    return tokens, targets


def ids(tokens):
    return torch.from_numpy(tokens.astype(np.int64))


def cross_entropy(logits, targets):
    """The mean cross-entropy over targets >= 0 of logits [.., vocab], targets as given (not
    shifted, as the C model takes them)."""
    tt = torch.from_numpy(targets.astype(np.int64)).clone()
    tt[tt < 0] = -100
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tt.reshape(-1), ignore_index=-100,
                           reduction="mean")


def mref_header(b, t, loss, aux):
    """The header of the MoE references (tests/ref_mixtral.py's format, "MREF" version 1): B, T,
    the loss and the load-balancing loss."""
    return struct.pack("<II", 0x4645524D, 1) + struct.pack("<2i", b, t) + struct.pack("<2d", loss, aux)


def write_ref(path, header, tokens, targets, logits, names, weights, params, tail=b""):
    """Writes path atomically (little-endian): header (bytes), i32 tokens, i32 targets, f32 logits,
    the f32 weights of `names` in order, their f32 gradients in the same order, then tail."""
    with open(path + ".tmp", "wb") as f:
        f.write(header)
        f.write(tokens.astype("<i4").tobytes())
        f.write(targets.astype("<i4").tobytes())
        f.write(logits.detach().numpy().astype("<f4").tobytes())
        for name in names:
            f.write(weights[name].astype("<f4").tobytes())
        for name in names:
            f.write(params[name].grad.detach().numpy().astype("<f4").tobytes())
        f.write(tail)
    os.replace(path + ".tmp", path)


def write_config(cfg, path):
    """The config.json transformers writes for cfg, keys sorted, to path."""
    with tempfile.TemporaryDirectory() as d:
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            text = json.load(f)
    with open(path, "w") as f:
        json.dump(text, f, indent=2, sort_keys=True)
        f.write("\n")


# ---- the export references (tests/test_ckpt_moe.c) ----------------------------------------------


def hf_model(config_cls, model_cls, cfg_dict, path):
    """The model of cfg_dict (model_type dropped), eager attention and experts, loaded strictly from
    the safetensors file `path` when given (every name and shape, nothing extra), in float64."""
    cfg = config_cls(**{k: v for k, v in cfg_dict.items() if k != "model_type"})
    cfg._attn_implementation = "eager"
    model = model_cls(cfg)
    model.config._experts_implementation = "eager"
    if path:
        model.load_state_dict(load_file(path), strict=True)
    return cfg, model.to(torch.float64).eval()


def logits_of(model, tokens):
    with torch.no_grad():
        return model(input_ids=ids(tokens)).logits.numpy().astype("<f4")


def export_reference(here, cfg_dict, config_cls, model_cls, init, seed=23, b=2, t=12, argv=None):
    """Writes here/: config.json (cfg_dict), hf.safetensors (a model_cls seeded with torch seed
    `seed`, then init(name, p) on every parameter under no_grad), tokens.i32 (int32 [b, t] from
    numpy seed `seed`), hf_logits.f32 (transformers' float64 logits of hf.safetensors),
    step-00000002/ (`rfsdp train --init hf.safetensors --steps 2` at W = 2) and export_logits.f32
    (transformers' logits of that checkpoint's `rfsdp ckpt export`, loaded strictly).
    Options: --rfsdp (default build/rfsdp), --data PREFIX (token files of `rfsdp prepare`; made
    from README.md when not given)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rfsdp", default="build/rfsdp")
    ap.add_argument("--data")
    a = ap.parse_args(argv)
    os.makedirs(here, exist_ok=True)
    cfg, _ = hf_model(config_cls, model_cls, cfg_dict, None)
    with open(os.path.join(here, "config.json"), "w") as f:
        json.dump(cfg_dict, f, indent=2, sort_keys=True)
        f.write("\n")
    torch.manual_seed(seed)
    model = model_cls(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            init(name, p)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(here, "hf.safetensors"))
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, 256, size=(b, t)).astype("<i4")
    tokens.tofile(os.path.join(here, "tokens.i32"))
    _, m = hf_model(config_cls, model_cls, cfg_dict, os.path.join(here, "hf.safetensors"))
    logits_of(m, tokens).tofile(os.path.join(here, "hf_logits.f32"))
    with tempfile.TemporaryDirectory() as tmp:
        data = a.data
        if not data:
            data = os.path.join(tmp, "data")
            subprocess.run([a.rfsdp, "prepare", "--input", "README.md", "--out", data, "--val-fraction", "0.2"],
                           check=True)
        ck = os.path.join(tmp, "ckpt")
        subprocess.run(["scripts/rfmpirun", "-np", "2", a.rfsdp, "train", "--model", os.path.join(here, "config.json"),
                        "--data", data, "--init", os.path.join(here, "hf.safetensors"), "--steps", "2", "--batch", "4",
                        "--seq", "16", "--lr", "1e-2", "--ckpt-dir", ck, "--save-every", "2", "--print-every", "0"],
                       check=True)
        dst = os.path.join(here, "step-00000002")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(os.path.join(ck, "step-00000002"), dst)
        out = os.path.join(tmp, "export.safetensors")
        subprocess.run([a.rfsdp, "ckpt", "export", dst, "--out", out], check=True)
        _, m = hf_model(config_cls, model_cls, cfg_dict, out)
        logits_of(m, tokens).tofile(os.path.join(here, "export_logits.f32"))
    print(f"wrote {here}", file=sys.stderr)
