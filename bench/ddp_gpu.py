"""Data-parallel scaling over the GPUs of one host: Ember (NCCL through ember.distributed) beside
PyTorch DDP, in the same run.

    PYTHONPATH=. python3 bench/ddp_gpu.py [--gpus 2] [--layers 12] [--batch 16] [--vocab 50304] [--steps 12]

GPT-2 124M's shape by default, bf16 autocast on both sides (PyTorch with SDPA), AdamW. --batch is
per GPU: one GPU runs a batch of B, N GPUs a global batch of N x B (weak scaling, as data
parallelism is measured). Scaling efficiency = tokens/s on N GPUs / (N x tokens/s on one GPU).
Ember's time is the median of its steps from the seventh on (--steps at least 8): it compiles in
the first, ember.jit replays from the third, and each set of buffers a program's outputs take is
captured as a CUDA graph on its second run, which on 2 GPUs is steps 5 and 6 (the median of
steps 4-8 was a capture's, and made 2 GPUs look like 63% scaling). PyTorch's is the median
after its second. A step includes reading the loss back. That N GPUs compute the same steps as
one on the same global batch is tests/frontend/test_distributed.py's check.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ember import distributed, optim  # noqa: E402
from ember import tensor as T  # noqa: E402
from ember.models.gpt import GPT, GPTConfig  # noqa: E402


def batches(c: GPTConfig, global_batch: int, rank: int, world: int) -> np.ndarray:
    """Four global batches of random tokens, this rank's rows."""
    tokens = np.random.default_rng(0).integers(0, c.vocab, (4, global_batch, c.block + 1)).astype(np.int32)
    return tokens[:, distributed.shard(global_batch, rank, world)]


def ember_rank(config: dict, steps: int, per_gpu: int) -> dict:
    """One rank of Ember's run (distributed.spawn has joined the group)."""
    from gpu import device_memory_used
    from train_gpu import JIT_WARMUP, timed_steps
    world = distributed.world_size()
    c = GPTConfig(**config)
    T.set_default_device("cuda")
    T.manual_seed(0)
    model = GPT(c)
    if world > 1:
        distributed.DataParallel(model)
    opt = optim.AdamW(model.parameters(), lr=3e-4)
    mine = batches(c, per_gpu * world, distributed.rank(), world)
    times, losses = timed_steps(model.loss, opt,
                                lambda s: (T.Tensor(mine[s % 4][:, :-1]), T.Tensor(mine[s % 4][:, 1:])),
                                steps, "bfloat16", jit=True)
    # two programs a step: graphs replay one step later than one program's (train_gpu.JIT_WARMUP)
    return {"step": statistics.median(times[JIT_WARMUP + 1:]), "first": times[0], "loss": losses[-1],
            "memory": device_memory_used()}


def torch_rank(rank: int, world: int, config: dict, steps: int, per_gpu: int, port: int, out) -> None:
    import torch
    import torch.distributed as dist
    from train_gpu import TorchGPT, torch_steps
    torch.cuda.set_device(rank)
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("nccl", rank=rank, world_size=world)
    c = GPTConfig(**config)
    torch.manual_seed(0)
    model = TorchGPT(c).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank]) if world > 1 else model
    times = torch_steps(c, steps, batches(c, per_gpu * world, rank, world), True, ddp)[1:]   # after the first
    if rank == 0:
        out.put({"step": statistics.median(times[2:]), "memory": torch.cuda.max_memory_allocated() / 2 ** 30})
    if world > 1:
        dist.destroy_process_group()


def torch_run(world: int, config: dict, steps: int, per_gpu: int) -> dict:
    import torch.multiprocessing as mp
    out = mp.get_context("spawn").SimpleQueue()
    mp.spawn(torch_rank, args=(world, config, steps, per_gpu, distributed._free_port(), out), nprocs=world)
    return out.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16, help="sequences per GPU")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50304)
    args = ap.parse_args()
    if args.steps < 8:
        ap.error("--steps must be at least 8: Ember's time is the median of its steps from the seventh on")
    c = GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers, n_head=max(1, args.dim // 64))
    config = asdict(c)
    tokens = args.batch * args.block
    print(f"GPT {args.layers} layers, dim {args.dim}, context {args.block}, vocab {args.vocab}, bf16 autocast, "
          f"AdamW; batch {args.batch} per GPU ({tokens} tokens per GPU per step)")
    print(f"{'':12s}{'1 GPU tok/s':>14s}{f'{args.gpus} GPUs tok/s':>16s}{'scaling':>10s}{'first step':>12s}"
          f"{'memory/GPU':>12s}")
    rows = {}
    for name in ("Ember", "PyTorch DDP"):
        runs = []
        for world in (1, args.gpus):
            if name == "Ember":
                runs.append(distributed.spawn(ember_rank, world, config, args.steps, args.batch)[0])
            else:
                runs.append(torch_run(world, config, args.steps, args.batch))
        one, many = tokens / runs[0]["step"], tokens * args.gpus / runs[1]["step"]
        rows[name] = many
        first = f"{runs[1]['first']:10.1f} s" if "first" in runs[1] else f"{'-':>12s}"
        print(f"{name:12s}{one:14.0f}{many:16.0f}{many / (args.gpus * one):10.1%}{first}"
              f"{runs[1]['memory']:9.1f} GiB", flush=True)
    print(f"Ember/PyTorch on {args.gpus} GPUs: {rows['Ember'] / rows['PyTorch DDP']:.3f}  (memory: Ember's is the "
          "GPU's memory in use, PyTorch's its peak allocated)")


if __name__ == "__main__":
    main()
