#!/usr/bin/env python3
"""Reference for tests/test_ckpt_fp8.c: torch and transformers read `rfsdp ckpt export --fp8`.

Runs build/tests/test_ckpt_fp8 with RF_FP8_EXPORT_KEEP=TMP, which leaves there the FP8 export
(fp8.safetensors), the f32 export (f32.safetensors) of the same W = 3 checkpoint and the model
config (llama.json: hidden 128, intermediate 136: whole and partial 128x128 tiles). Then, for
every linear weight (q, k, v, o, gate, up, down, in the C test's order):
  - torch quantizes the f32 export itself, DeepSeek-V3's recipe: per 128x128 block
    scale = amax / 448 in f32 (a zero block: 1), code = float8_e4m3fn(w / scale); the file's
    codes (F8_E4M3, read as torch.float8_e4m3fn) and weight_scale_inv must equal them;
  - the dequantization w = code * weight_scale_inv (the multiplier convention of DeepSeek-V3's
    weight_dequant and transformers' finegrained FP8) is within e4m3's rounding of the f32 weight;
  - transformers' dequantization with the configured 128x128 blocks (_dequantize_fp8_weight,
    finegrained FP8) equals code * weight_scale_inv bit for bit;
  - transformers loads the file as an FP8 checkpoint (config.json with DeepSeek-V3's
    quantization_config; on a CPU it dequantizes at load): its other tensors equal the f32
    export, and the linear weights whose sizes are multiples of 128 or below 128 (q, k, v, o
    here) equal code * weight_scale_inv bit for bit. The others (gate, up: 136 rows; down: 136
    columns) it gets wrong: its load-time dequantization (Fp8Dequantize, transformers 5.24)
    takes the block as rows / scale_rows = 136 / 2 = 68, not 128 (DeepSeek-V3's own
    weight_dequant and transformers' FP8Linear use 128 with a partial last block); the script
    prints how far off, and asserts that it is that misreading (blocks of 68) and nothing else.
Writes tests/data/fp8_export_ref.bin: per tensor torch's codes (u8), scales (f32, row-major
over the blocks) and transformers' dequantized weight (_dequantize_fp8_weight, f32). `make test` compares the export
with it and needs no Python.

Usage: /work/venv/bin/python tests/ref_fp8_export.py [--test build/tests/test_ckpt_fp8]
(needs torch, safetensors, transformers, accelerate)
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors import safe_open
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "fp8_export_ref.bin")
BLOCK = 128
QUANT = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [BLOCK, BLOCK]}


def expand(s, rows, cols):
    return s.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]


def torch_quantize(w):
    rows, cols = w.shape
    gr, gc = -(-rows // BLOCK), -(-cols // BLOCK)
    pad = torch.zeros(gr * BLOCK, gc * BLOCK, dtype=torch.float32)
    pad[:rows, :cols] = w.abs()
    amax = pad.view(gr, BLOCK, gc, BLOCK).amax(dim=(1, 3))
    s = torch.where(amax == 0, torch.ones_like(amax), amax / torch.tensor(448.0, dtype=torch.float32))
    q = (w / expand(s, rows, cols)).to(torch.float8_e4m3fn)
    return q, s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--test", default="build/tests/test_ckpt_fp8")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    try:
        env = dict(os.environ, RF_FP8_EXPORT_KEEP=tmp)
        subprocess.run([a.test], check=True, env=env)
        with open(os.path.join(tmp, "llama.json")) as fh:
            cfg = json.load(fh)
        f32 = load_file(os.path.join(tmp, "f32.safetensors"))
        fp8 = load_file(os.path.join(tmp, "fp8.safetensors"))
        with safe_open(os.path.join(tmp, "fp8.safetensors"), "pt") as fh:
            meta = fh.metadata()
        names = [f"model.layers.{l}.{p}.weight" for l in range(cfg["num_hidden_layers"])
                 for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
        quantized = sorted(k for k, v in fp8.items() if v.dtype == torch.float8_e4m3fn)
        if sorted(names) != quantized:
            sys.exit(f"FP8 tensors {quantized}, want {sorted(names)}")
        # transformers' loader: config.json with DeepSeek-V3's quantization_config, the export as the weights
        hf = os.path.join(tmp, "hf")
        os.makedirs(hf)
        with open(os.path.join(hf, "config.json"), "w") as fh:
            json.dump(dict(cfg, architectures=["LlamaForCausalLM"], quantization_config=QUANT), fh)
        shutil.copy(os.path.join(tmp, "fp8.safetensors"), os.path.join(hf, "model.safetensors"))
        from transformers import LlamaForCausalLM
        from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight
        model = LlamaForCausalLM.from_pretrained(hf, dtype=torch.float32)
        loaded = model.state_dict()
        for k, v in f32.items():
            if k not in names and not torch.equal(loaded[k], v):
                sys.exit(f"{k}: transformers' value differs from the f32 export")
        worst = 0.0
        with open(OUT, "wb") as out:
            for k in names:
                w = f32[k]
                q, s = torch_quantize(w)
                codes, scale_inv = fp8[k], fp8[k + "_scale_inv"]
                if not torch.equal(codes.view(torch.uint8), q.view(torch.uint8)):
                    sys.exit(f"{k}: codes differ from torch's float8_e4m3fn quantization")
                if not torch.equal(scale_inv, s):
                    sys.exit(f"{k}: weight_scale_inv differs from torch's amax / 448")
                dq = codes.to(torch.float32) * expand(scale_inv, *w.shape)
                full = expand(scale_inv, *w.shape)
                bound = torch.maximum(w.abs() * 2.0**-4, full * 2.0**-10)  # e4m3: half an ulp, subnormals
                err = ((dq - w).abs() / bound).max().item()
                if err > 1.0:
                    sys.exit(f"{k}: code * weight_scale_inv is {err:.3f} rounding bounds from the f32 weight")
                worst = max(worst, (dq - w).abs().max().item() / w.abs().max().item())
                tf = _dequantize_fp8_weight(codes, scale_inv, [BLOCK, BLOCK], torch.float32)
                if not torch.equal(tf, dq):
                    sys.exit(f"{k}: transformers' _dequantize_fp8_weight differs from code * weight_scale_inv")
                whole = all(d % BLOCK == 0 or d < BLOCK for d in w.shape)
                if whole and not torch.equal(loaded[k], dq):
                    sys.exit(f"{k}: transformers' loaded weight differs from code * weight_scale_inv")
                if not whole:  # its loader's blocks: rows / scale_rows x cols / scale_cols
                    bm, bn = w.shape[0] // scale_inv.shape[0], w.shape[1] // scale_inv.shape[1]
                    mis = codes.to(torch.float32) * scale_inv.repeat_interleave(bm, 0).repeat_interleave(bn, 1)
                    if not torch.equal(loaded[k], mis):
                        sys.exit(f"{k}: transformers' loaded weight is neither ours nor its {bm}x{bn} misreading")
                    print(f"{k} {list(w.shape)}: transformers' loader dequantizes in {bm}x{bn} blocks: "
                          f"max |error| {(loaded[k] - dq).abs().max().item():.3g} (max |w| {w.abs().max().item():.3g})")
                out.write(q.view(torch.uint8).numpy().tobytes())
                out.write(s.numpy().astype("<f4").tobytes())
                out.write(tf.numpy().astype("<f4").tobytes())
        print(f"wrote {OUT}: {len(names)} tensors; codes and scales = torch's, transformers' dequantization = "
              f"code * weight_scale_inv; max |dq - w| / max |w| = {worst:.4f}; metadata {meta} "
              f"(torch {torch.__version__})")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
