"""Loads a safetensors file exported by `rfsdp ckpt export` into Hugging Face
transformers' LlamaForCausalLM and prints its logits for a batch of tokens;
optionally compares them with logits computed by rfsdp. Not run by `make test`.

Usage:
  /work/main/.venv/bin/python tests/hf_logits_check.py --model model.safetensors \
      --config configs/demo.json [--tokens "1,2,3;4,5,6" | --batch 2 --seq 16 --seed 0] \
      [--out hf_logits.f32] [--compare rfsdp_logits.f32 --rtol 1e-4 --atol 1e-4]

  --model    the exported file (tensor names as in Hugging Face's LLaMA:
             model.embed_tokens.weight, model.layers.N.self_attn.q_proj.weight, ...,
             model.norm.weight, lm_head.weight); F32 or BF16
  --config   a config.json (configs/*.json are in that format)
  --tokens   explicit token ids: rows separated by ';', ids by ','
  --batch/--seq/--seed  otherwise: random ids in [0, vocab_size)
  --out      writes the logits as raw little-endian f32, shape [batch, seq, vocab],
             and the tokens next to it (FILE.tokens, raw i32 [batch, seq])
  --compare  reads rfsdp's logits (raw f32, same shape) and reports the largest
             absolute and relative differences; exit code 1 when any element has
             |hf - rfsdp| > atol + rtol * |hf|

Every tensor of the model must be in the file and every tensor of the file must
be used (strict load): a missing or extra name, or a shape that differs, is
reported with the names and the script exits with code 2.
"""
import argparse
import json
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM


def parse_tokens(text):
    rows = [[int(x) for x in row.split(",") if x.strip()] for row in text.split(";") if row.strip()]
    if not rows or len({len(r) for r in rows}) != 1:
        sys.exit("--tokens: rows must be non-empty and of equal length")
    return torch.tensor(rows, dtype=torch.long)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokens")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--compare")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-4)
    a = ap.parse_args()

    with open(a.config) as fh:
        cfg = json.load(fh)
    cfg.pop("torch_dtype", None)
    config = LlamaConfig(**cfg)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()

    state = load_file(a.model)
    state = {k: v.float() for k, v in state.items()}
    want = model.state_dict()
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    wrong = sorted(k for k in set(want) & set(state) if tuple(want[k].shape) != tuple(state[k].shape))
    if config.tie_word_embeddings and "lm_head.weight" in missing:
        missing.remove("lm_head.weight")
    if missing or extra or wrong:
        for k in missing:
            print(f"missing from {a.model}: {k} {tuple(want[k].shape)}")
        for k in extra:
            print(f"not in the model: {k} {tuple(state[k].shape)}")
        for k in wrong:
            print(f"shape of {k}: file {tuple(state[k].shape)}, model {tuple(want[k].shape)}")
        sys.exit(2)
    model.load_state_dict(state, strict=not config.tie_word_embeddings)

    if a.tokens:
        tokens = parse_tokens(a.tokens)
    else:
        g = torch.Generator().manual_seed(a.seed)
        tokens = torch.randint(0, config.vocab_size, (a.batch, a.seq), generator=g)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
    print(f"model {a.model}: {sum(v.numel() for v in state.values())} parameters in {len(state)} tensors")
    print(f"tokens {list(tokens.shape)}: {tokens[0, :8].tolist()}...")
    print(f"logits {list(logits.shape)}: mean {logits.mean().item():.6f} std {logits.std().item():.6f}")
    print(f"logits[0, 0, :5] = {[round(x, 6) for x in logits[0, 0, :5].tolist()]}")
    print(f"logits[-1, -1, :5] = {[round(x, 6) for x in logits[-1, -1, :5].tolist()]}")
    if a.out:
        logits.numpy().astype("<f4").tofile(a.out)
        tokens.numpy().astype("<i4").tofile(a.out + ".tokens")
        print(f"wrote {a.out} and {a.out}.tokens")
    if a.compare:
        other = np.fromfile(a.compare, dtype="<f4")
        if other.size != logits.numel():
            sys.exit(f"{a.compare}: {other.size} values, expected {logits.numel()} {list(logits.shape)}")
        hf = logits.numpy().reshape(-1).astype(np.float64)
        rf = other.astype(np.float64)
        diff = np.abs(hf - rf)
        rel = diff / np.maximum(np.abs(hf), 1e-6)
        bad = int(np.sum(diff > a.atol + a.rtol * np.abs(hf)))
        print(f"compare {a.compare}: max abs diff {diff.max():.3e}, max rel diff {rel.max():.3e}, "
              f"{bad} of {hf.size} beyond atol {a.atol} + rtol {a.rtol}")
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
