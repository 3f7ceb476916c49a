#!/usr/bin/env python3
"""PyTorch side of bench/train.sh and bench/moe.sh: the same training step as
`rfsdp train` (the Hugging Face model of the config's model_type built from the
same config.json -- LlamaForCausalLM, MixtralForCausalLM, ... --, float32,
forward + backward + global-norm clipping at 1.0 + AdamW betas (0.9, 0.95),
eps 1e-8, weight decay 0.1 on matrices) on the same KJV token file, timed
step by step. With output_router_logits in the config (mixtral), the loss adds
router_aux_loss_coef x the model's load-balancing loss, as rfsdp's does; the
experts run with transformers' default experts implementation (reported).

Modes:
  single  one process, --threads threads (torch.set_num_threads)
  fsdp2   --world processes (torch.multiprocessing, gloo, CPU device mesh),
          fully_shard on every decoder layer and on the root, 1 thread each;
          --param-dtype bf16: MixedPrecisionPolicy(param_dtype=bfloat16,
          reduce_dtype=float32) (bf16 compute, f32 master weights and reduction)
  fsdp1   --world processes, FullyShardedDataParallel (FSDP1) with one unit
          per decoder layer (transformer_auto_wrap_policy), 1 thread each

The global batch of --batch sequences is split across the ranks, like rfsdp.
Each --run is one training run in the same processes (so the imports are paid
once; runs go in the order given, the model and optimizer of one are freed
before the next, so order them by size: the peak RSS is a high-water mark).
Prints one JSON object per run on stdout (rank 0): the per-step times (ms, the
slowest rank per step), their median without the first step, rank 0's process CPU
time per step divided by its threads (step_cpu_ms, median_cpu_ms), tokens/s, every
rank's peak RSS after the run (resource.getrusage ru_maxrss, i.e. VmHWM) and
the RSS right after importing torch and transformers (the interpreter's
floor), the losses.

Usage: python bench/torch_train.py --mode single|fsdp2|fsdp1 --data PREFIX
         --run CONFIG.json:BATCH:SEQ:STEPS [--run ...] [--lr LR] [--threads N] [--world W]
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time


def maxrss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load_tokens(path):
    import numpy as np

    with open(path, "rb") as f:
        head = f.read(64)
    if head[:8] != b"RFTOKENS":
        raise SystemExit(f"{path}: not a token file (bad magic)")
    width = int.from_bytes(head[12:16], "little")
    dtype = {2: np.uint16, 4: np.uint32}.get(width)
    if dtype is None:
        raise SystemExit(f"{path}: bad token width {width}")
    return np.memmap(path, dtype=dtype, mode="r", offset=64)


def batch_for(tokens, step, rank, world, batch, seq, seed):
    """Sequences rank..batch step world of a random global batch (the content
    does not matter for timing; the shapes are rfsdp's)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed * 1000003 + step)
    starts = rng.integers(0, len(tokens) - seq - 1, size=batch)[rank::world]
    x = np.stack([np.asarray(tokens[s : s + seq + 1], dtype=np.int64) for s in starts])
    x = torch.from_numpy(x)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def make_optimizer(model, lr):
    import torch

    # rfsdp's default groups: no decay for vectors, norms and the embedding
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n and "norm" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n and "norm" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    for kind in ("fused", "foreach"):
        try:
            opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **{kind: True})
            return opt, kind
        except (RuntimeError, TypeError, ValueError):
            continue
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8), "for-loop"


def train_one(rank, world, dist, args, spec):
    """One run: spec = (config path, batch, seq, steps). Returns the result dict
    (rank 0) or None."""
    import gc

    import torch
    import transformers
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config, batch, seq, steps = spec
    with open(config) as f:
        model_type = json.load(f)["model_type"]
    cfg = CONFIG_MAPPING[model_type].from_json_file(config)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float()
    aux_coef = cfg.router_aux_loss_coef if getattr(cfg, "output_router_logits", False) else 0.0
    experts_impl = getattr(model.config, "_experts_implementation", None)
    n_params = sum(p.numel() for p in model.parameters())
    layer_cls = type(model.model.layers[0])
    if args.mode == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:
            from torch.distributed._composable.fsdp import fully_shard
        kw = {}
        if args.param_dtype == "bf16":
            try:
                from torch.distributed.fsdp import MixedPrecisionPolicy
            except ImportError:
                from torch.distributed._composable.fsdp import MixedPrecisionPolicy
            kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, **kw)
        fully_shard(model, mesh=mesh, **kw)
    elif args.mode == "fsdp1":
        import functools

        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls})
        # device_id=cpu: without it FSDP1 refuses to run when no accelerator is present
        model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True, device_id=torch.device("cpu"))
    opt, opt_kind = make_optimizer(model, args.lr)
    tokens = load_tokens(args.data + ".train.tok")
    if batch % world:
        raise SystemExit(f"batch {batch} is not divisible into {world} ranks")

    times, losses, cpu_times = [], [], []
    for step in range(steps):
        x, y = batch_for(tokens, step, rank, world, batch, seq, args.seed)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=x, use_cache=False)
        logits = out.logits  # y is already shifted
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        if aux_coef:
            loss = loss + aux_coef * out.aux_loss
        loss.backward()
        if args.mode == "fsdp1":
            model.clip_grad_norm_(1.0)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.detach()
        if dist is not None:
            dist.all_reduce(lv)
            lv /= world
        ms = (time.perf_counter() - t0) * 1e3
        cpu_times.append((time.process_time() - c0) * 1e3 / args.threads)
        if dist is not None:
            t = torch.tensor([ms], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            ms = float(t.item())
        times.append(ms)
        losses.append(float(lv.item()))
        if rank == 0 and args.verbose:
            print(f"torch {args.mode} {config} step {step + 1}: loss {losses[-1]:.4f} {ms:.1f} ms", file=sys.stderr)
    del model, opt, out, logits, loss
    gc.collect()
    mem = maxrss_mb()
    if dist is not None:
        gathered = [None] * world
        dist.all_gather_object(gathered, mem)
    else:
        gathered = [mem]
    if rank != 0:
        return None
    timed = times[1:] if len(times) > 1 else times
    med = statistics.median(timed)
    return {
        "mode": args.mode,
        "param_dtype": args.param_dtype,
        "config": config,
        "world": world,
        "threads": args.threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "params": n_params,
        "optimizer": f"AdamW ({opt_kind})",
        "model_type": model_type,
        "experts_implementation": experts_impl if model_type != "llama" else None,
        "batch": batch,
        "seq": seq,
        "step_ms": times,
        "median_ms": med,
        "step_cpu_ms": cpu_times,
        "median_cpu_ms": statistics.median(cpu_times[1:] if len(cpu_times) > 1 else cpu_times),
        "tok_s": batch * seq / (med * 1e-3),
        "maxrss_mb": gathered,
        "losses": losses,
    }


def run(rank, args):
    import torch

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    import transformers  # noqa: F401  (counted in the floor below)

    floor = maxrss_mb()
    world = 1 if args.mode == "single" else args.world
    dist = None
    if args.mode != "single":
        import torch.distributed as dist

        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(args.port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    floors = [floor]
    if dist is not None:
        floors = [None] * world
        dist.all_gather_object(floors, floor)
    for spec in args.run:
        res = train_one(rank, world, dist, args, spec)
        if res is not None:
            res["import_rss_mb"] = floors
            print(json.dumps(res), flush=True)
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


def parse_run(text):
    parts = text.split(":")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"--run {text}: expected CONFIG:BATCH:SEQ:STEPS")
    try:
        return parts[0], int(parts[1]), int(parts[2]), int(parts[3])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--run {text}: BATCH, SEQ and STEPS must be integers") from None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["single", "fsdp2", "fsdp1"], required=True)
    p.add_argument("--param-dtype", choices=["f32", "bf16"], default="f32",
                   help="fsdp2 only: bf16 = MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)")
    p.add_argument("--run", type=parse_run, action="append", required=True,
                   help="CONFIG.json:BATCH:SEQ:STEPS, one training run (repeatable; one process for all)")
    p.add_argument("--data", required=True)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--port", type=int, default=29517)
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    if args.threads is None:
        args.threads = 2 if args.mode == "single" else 1
    if args.mode == "single":
        run(0, args)
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch.multiprocessing as mp

    mp.spawn(run, args=(args,), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
