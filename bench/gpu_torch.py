"""FSDP2 (fully_shard, NCCL, 1 GPU) + MixedPrecisionPolicy(bf16, f32 reduce) on HF LlamaForCausalLM: the GPU anchor.
torchrun --standalone --nproc-per-node 1 bench/gpu_torch.py CONFIG BATCH SEQ STEPS
(run by scripts/gpu-check on the GPU machine; the median step after 3 warm-up steps. The script that
measured the anchors of issue 26 on an H200, 2026-11-28, with the GPU's name added to its output.)"""
import json, os, statistics, sys, time
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from transformers import LlamaConfig, LlamaForCausalLM
cfg_path, B, T, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("nccl"); torch.cuda.set_device(0)
cfg = LlamaConfig.from_json_file(cfg_path); cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
with torch.device("cuda"): model = LlamaForCausalLM(cfg)
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model.model.layers: fully_shard(layer, mp_policy=mp)
fully_shard(model, mp_policy=mp)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
N = sum(p.numel() for p in model.parameters())
L, H, hd = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
flops_tok = 6 * N + 6 * L * H * hd * (T + 1)
times = []
for s in range(steps):
    x = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    torch.cuda.synchronize(); t0 = time.perf_counter()
    out = model(input_ids=x, labels=x); out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(); times.append((time.perf_counter() - t0) * 1e3)
ms = statistics.median(times[3:])
print(json.dumps({"peer": "fsdp2-bf16-cuda", "gpu": torch.cuda.get_device_name(0), "config": os.path.basename(cfg_path), "params": N, "batch": B, "seq": T, "ms": round(ms, 2),
                  "tokens_per_s": round(B * T / ms * 1e3), "mfu_vs_989": round(flops_tok * B * T / (ms / 1e3) / 989e12, 4),
                  "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2), "loss": out.loss.item()}), flush=True)
dist.destroy_process_group()
