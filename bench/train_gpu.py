"""Training throughput on the GPU: Ember's GPT beside the same model in PyTorch eager, same run.

    PYTHONPATH=. python3 bench/train_gpu.py [--dim 768] [--layers 2] [--block 1024] [--batch 8] [--steps 10]

Both train on random byte tokens (vocab 256) with AdamW; tokens/s is batch x block per step,
the median step after the first (Ember's first step compiles; it is printed separately; with
ember.jit, from the sixth, once graphs replay, given 7 steps or more). Each
step includes everything a training loop pays: forward, backward, the update, and reading
the loss back to the host. "host" is the median time a step's call takes before the loss is
read: on the GPU, whose work is asynchronous, the host's part of the step (with ember.jit, the
replay's Python; the issue's target is 1 ms).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import math
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu import device_memory_used  # noqa: E402

import ember  # noqa: E402
from ember import optim  # noqa: E402
from ember import tensor as T  # noqa: E402
from ember.backend import c as c_backend  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.models.gpt import GPTConfig, build  # noqa: E402
from ember.train import memory_line, step_memory, step_program  # noqa: E402

PROFILE_HOST = os.environ.get("PROFILE_HOST") == "1"   # cProfile the replayed steps' Python, print the top
# steps of an ember.jit loop before its graphs replay, for a step of one program: step 1 checks
# the trace, step 2 is its first replay (Python issues the launches), steps 3 and 4 capture a
# graph for each set of buffers the outputs alternate between (counted with the driver faked:
# docs/performance.md, data parallelism). A step of two programs (2 GPUs) replays one step later.
JIT_WARMUP = 5
PEAK_BF16 = 989e12   # the H200's dense bf16 tensor-core rate


def timed_steps(loss_fn: Callable, opt: optim.Optimizer, batches: Callable, steps: int, low: str | None,
                jit: bool, host: list[float] | None = None,
                launch: list[float] | None = None, profiled: int = 0) -> tuple[list[float], list[float]]:
    """Seconds of each training step (the loss, backward, the optimizer's update, reading the
    loss back), and each step's loss; low: autocast's dtype; jit: the step through ember.jit
    (replayed without its Python from the third call on). batches(s) gives step s's (x, y).
    host: gets each step's seconds before reading the loss back, the host's part of a step
    whose work the GPU runs asynchronously (a replayed step's Python). launch: each step's
    seconds until its CUDA graph was launched (the GPU idles that long between steps, as the
    loss is read back every step), NaN where none was replayed. profiled: that many more steps
    after those, untimed, each kernel timed by the CUDA runtime's profiler (cuda.PROFILE)."""
    def step(x: T.Tensor, y: T.Tensor) -> T.Tensor:
        opt.zero_grad()
        with T.autocast(low or "bfloat16", enabled=low is not None):
            loss = loss_fn(x, y)
        loss.backward()
        opt.step()
        return loss

    run = ember.jit(step) if jit else step
    times, losses = [], []
    profile = cProfile.Profile() if PROFILE_HOST else None
    for s in range(steps):
        x, y = batches(s)
        t0 = time.perf_counter()
        if profile is not None and s >= 4:   # the steady state: replays
            profile.enable()
        loss = run(x, y)
        if profile is not None:
            profile.disable()
        if host is not None:
            host.append(time.perf_counter() - t0)
        if launch is not None:
            at = cuda.LAST_REPLAY[0]
            launch.append(at - t0 if at > t0 else float("nan"))
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    cuda.PROFILE.enabled, cuda.PROFILE.totals = bool(profiled), {}
    for s in range(steps, steps + profiled):
        run(*batches(s)).item()
    cuda.PROFILE.enabled = False
    return times, losses


def ember_steps(c: GPTConfig, steps: int, tokens: np.ndarray, device: str, low: str | None = None,
                jit: bool = False, profiled: int = 0) -> tuple[float, list[float], float, float, float, str]:
    """(first step seconds, the other steps' seconds, last loss, median host seconds of the
    steps timed, median seconds before their graph's launch, the step's peak memory as its
    schedule plans it: train.memory_line). profiled: steps profiled after those (timed_steps)."""
    T.set_default_device(device)
    T.manual_seed(0)  # the same weights with and without jit: the losses agree
    model = build(c)
    opt = optim.AdamW(model.parameters(), lr=3e-4)
    host: list[float] = []
    launch: list[float] = []
    times, losses = timed_steps(model.loss, opt, lambda s: (T.Tensor(tokens[s % len(tokens)][:, :-1]),
                                                           T.Tensor(tokens[s % len(tokens)][:, 1:])),
                                steps, low, jit, host, launch, profiled)
    skip = JIT_WARMUP if jit and len(times) > JIT_WARMUP + 1 else 2 if jit else 1
    replayed = [x for x in launch[skip:] if not math.isnan(x)]
    # the same step's program, built again (nothing runs) and scheduled (the disk store has it)
    outputs, roles, donate = step_program(model, opt, tokens.shape[1], c.block, T.autocast(low or "bfloat16",
                                                                                            enabled=low is not None))
    sched = cuda.prepare(outputs) if device == "cuda" else c_backend.prepare(outputs)
    return (times[0], times[skip:], losses[-1], statistics.median(host[skip:]),
            statistics.median(replayed) if replayed else float("nan"), memory_line(step_memory(sched, roles, donate)))


class TorchGPT(torch.nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.tok, self.pos = torch.nn.Embedding(c.vocab, c.dim), torch.nn.Embedding(c.block, c.dim)
        self.blocks = torch.nn.ModuleList()
        for _ in range(c.n_layer):
            d = c.dim
            self.blocks.append(torch.nn.ModuleDict(dict(
                ln1=torch.nn.LayerNorm(d), qkv=torch.nn.Linear(d, 3 * d), proj=torch.nn.Linear(d, d),
                ln2=torch.nn.LayerNorm(d), fc=torch.nn.Linear(d, 4 * d), out=torch.nn.Linear(4 * d, d))))
        self.ln, self.head = torch.nn.LayerNorm(c.dim), torch.nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, idx: torch.Tensor, sdpa: bool) -> torch.Tensor:
        b, t = idx.shape
        h = self.c.n_head
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).split(self.c.dim, -1)
            q, k, v = (z.view(b, t, h, -1).transpose(1, 2) for z in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
                s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1), float("-inf"))
                y = s.softmax(-1) @ v
            x = x + blk["proj"](y.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x)), approximate="tanh"))
        return self.head(self.ln(x))


class TorchLlama(torch.nn.Module):
    """ember.models.gpt.Llama in PyTorch: RMSNorm, RoPE (rotate-half), SwiGLU, no biases."""
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c, d = c, c.dim
        hidden = 64 * -(-(8 * d // 3) // 64)
        self.tok = torch.nn.Embedding(c.vocab, d)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict(dict(
            norm1=torch.nn.RMSNorm(d, eps=1e-6), qkv=torch.nn.Linear(d, 3 * d, bias=False),
            out=torch.nn.Linear(d, d, bias=False), norm2=torch.nn.RMSNorm(d, eps=1e-6),
            gate=torch.nn.Linear(d, hidden, bias=False), up=torch.nn.Linear(d, hidden, bias=False),
            down=torch.nn.Linear(hidden, d, bias=False))) for _ in range(c.n_layer))
        self.norm, self.head = torch.nn.RMSNorm(d, eps=1e-6), torch.nn.Linear(d, c.vocab, bias=False)
        half = d // c.n_head // 2
        angles = torch.outer(torch.arange(c.block).double(), 10000.0 ** (-torch.arange(half).double() / half))
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1).float(), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1).float(), persistent=False)

    def forward(self, idx: torch.Tensor, sdpa: bool) -> torch.Tensor:
        b, t = idx.shape
        h = self.c.n_head
        cos, sin = self.cos[:t], self.sin[:t]

        def rope(x: torch.Tensor) -> torch.Tensor:
            a, z = x.chunk(2, -1)
            return x * cos + torch.cat([-z, a], -1) * sin
        x = self.tok(idx)
        for blk in self.blocks:
            q, k, v = (z.view(b, t, h, -1).transpose(1, 2) for z in blk["qkv"](blk["norm1"](x)).split(self.c.dim, -1))
            y = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
            x = x + blk["out"](y.transpose(1, 2).reshape(b, t, -1))
            z = blk["norm2"](x)
            x = x + blk["down"](F.silu(blk["gate"](z)) * blk["up"](z))
        return self.head(self.norm(x))


def torch_model(c: GPTConfig) -> torch.nn.Module:
    """The PyTorch twin of the model c describes, on the GPU."""
    return (TorchLlama(c) if c.arch == "llama" else TorchGPT(c)).cuda()


def torch_steps(c: GPTConfig, steps: int, tokens: np.ndarray, bf16: bool,
                model: torch.nn.Module | None = None, compiled: bool = False) -> list[float]:
    """Seconds of each step (the first, which compiles, included: callers drop it); model: what
    to train (a DistributedDataParallel one, bench/ddp_gpu.py), else a new TorchGPT. compiled:
    nanoGPT's recipe, torch.compile and the fused AdamW."""
    model = torch_model(c) if model is None else model
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=compiled or None)

    def step_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(x, sdpa=bf16).reshape(-1, c.vocab).float(), y.reshape(-1))
    # compiled: the loss inside what is compiled, as nanoGPT's forward returns it (torch.compile
    # then fuses the head's cross-entropy: no f32 copy of the [B*T, vocab] logits)
    loss_of = torch.compile(step_loss) if compiled else step_loss
    times = []
    for s in range(steps):
        batch = torch.from_numpy(tokens[s % len(tokens)]).long().cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = loss_of(batch[:, :-1], batch[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    return times


KINDS = (("contraction", ("gemm", "cutlass", "xmma", "nvjet", "cublas")), ("attention", ("flash", "fmha")),
         ("optimizer", ("multi_tensor", "adam")), ("layernorm", ("layer_norm",)),
         ("reduce", ("reduce", "softmax", "nll", "cross_entropy")), ("map", ("elementwise", "vectorized", "copy")),
         ("fused (triton)", ("triton",)))


def torch_profile(c: GPTConfig, tokens: np.ndarray, compiled: bool) -> tuple[dict[str, list[float]], list]:
    """PyTorch's bf16 step kernel by kernel (torch.profiler, 3 steps after 3 to warm up), summed
    by the kinds EMBER_PROFILE reports: where the peer spends what Ember spends. Returns
    {kind: [ms, launches]} per step and the kernels as (ms, launches, kind, name)."""
    from torch.profiler import ProfilerActivity, profile
    model = torch_model(c)   # (compiled: torch_steps compiles it, and its AdamW is the fused one)
    torch_steps(c, 3, tokens, True, model, compiled)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch_steps(c, 3, tokens, True, model, compiled)
    kinds: dict[str, list[float]] = {}
    top = []
    for e in prof.key_averages():
        us = e.self_device_time_total if hasattr(e, "self_device_time_total") else e.self_cuda_time_total
        if us <= 0:
            continue
        kind = next((k for k, keys in KINDS if any(w in e.key.lower() for w in keys)), "other")
        entry = kinds.setdefault(kind, [0.0, 0])
        entry[0] += us / 3e3
        entry[1] += e.count / 3
        top.append((us / 3e3, e.count / 3, kind, e.key[:90]))
    return kinds, top


def ember_profile(steps: int) -> tuple[dict[str, list[float]], list]:
    """Ember's profiled steps (cuda.PROFILE's totals, `steps` of them) as torch_profile's: per
    step by kind (contraction, attention, optimizer: kernels writing a step's outputs, reduce,
    map, merged: small kernels launched together), and each kernel."""
    step = max(cuda.program.programs.values(), key=lambda p: len(p.sched.kernels), default=None)
    updates = {k.name for k in step.sched.kernels if k.out.kind == "output" or k.members and
               any(m.out.kind == "output" for m in k.members)} if step else set()
    kinds: dict[str, list[float]] = {}
    top = []
    for key, (ms, n, _, _) in cuda.PROFILE.totals.items():
        name, kind = key.split()[0], key.split()[-1]
        kind = "optimizer" if name in updates else kind
        entry = kinds.setdefault(kind, [0.0, 0])
        entry[0] += ms / steps
        entry[1] += n / steps
        top.append((ms / steps, n / steps, kind, key[:90]))
    return kinds, top


def kind_table(columns: list[tuple[str, dict[str, list[float]], list]]) -> None:
    """One table of the step's kernel time by kind, a pair of columns (ms, launches) per run,
    then each run's costliest kernels."""
    kinds = sorted({k for _, by, _ in columns for k in by},
                   key=lambda k: -max(by.get(k, [0.0])[0] for _, by, _ in columns))
    print("kernel time per step by kind" + "".join(f" | {name:>26s}" for name, _, _ in columns))
    for kind in kinds + ["total"]:
        cells = [(sum(v[0] for v in by.values()), sum(v[1] for v in by.values())) if kind == "total"
                 else by.get(kind, (0.0, 0)) for _, by, _ in columns]
        print(f"  {kind:26s}" + "".join(f" | {ms:8.2f} ms {n:6.0f} launches" for ms, n in cells))
    for name, _, top in columns:
        print(f"{name}: the costliest kernels per step")
        for ms, n, kind, key in sorted(top, reverse=True)[:20]:
            print(f"  {ms:7.3f} ms {n:5.0f}x {kind:11s} {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--vocab", type=int, default=256, help="token ids drawn uniformly below this (GPT-2: 50304)")
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt",
                    help="llama: RMSNorm, RoPE, SwiGLU and no biases (ember.models.gpt.Llama and its PyTorch twin)")
    ap.add_argument("--bf16-only", action="store_true", help="only the bf16 rows (Ember with jit, PyTorch + SDPA)")
    ap.add_argument("--device", default="cuda", help="where Ember runs (PyTorch runs only on cuda)")
    ap.add_argument("--torch-profile", action="store_true",
                    help="then Ember's bf16 step (3 steps under its profiler, EMBER_PROFILE's) beside PyTorch's "
                         "(torch.profiler), by kernel kind in one table")
    ap.add_argument("--compile", action="store_true",
                    help="add PyTorch + SDPA + torch.compile + fused AdamW (nanoGPT's recipe) as a peer; profile it")
    ap.add_argument("--profile-json", metavar="FILE",
                    help="with --torch-profile: both profiles, every kernel (ms, launches, kind, name a step), as JSON")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    c = GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers, n_head=max(1, args.dim // 64),
                  arch=args.model)
    tokens = np.random.default_rng(0).integers(0, args.vocab, (4, args.batch, args.block + 1)).astype(np.int32)
    per_step = args.batch * args.block
    # (LLaMA's SwiGLU of 2048 at dim 768 has GPT's 8 dim^2 weights; it has no position table)
    pos = args.block * args.dim if args.model == "gpt" else 0
    params = 12 * args.layers * args.dim ** 2 + args.vocab * args.dim + pos
    # MFU as nanoGPT estimates it: 6 FLOPs per parameter (position embedding left out) and token,
    # plus attention's 12 * layers * dim * context (causal counted whole), against bf16's dense peak
    flops_per_token = 6 * (params - pos) + 12 * args.layers * args.dim * args.block
    mfu = lambda tps: f"MFU {100 * tps * flops_per_token / PEAK_BF16:4.1f}%"  # noqa: E731
    name = "LLaMA" if args.model == "llama" else "GPT"
    print(f"{name} {args.layers} layers, dim {args.dim}, context {args.block}, batch {args.batch}, vocab {args.vocab} "
          f"(about {params / 1e6:.0f}M parameters): {per_step} tokens a step; MFU against {PEAK_BF16 / 1e12:.0f} "
          "TFLOP/s (bf16 dense)")
    ember_tps = {}
    variants = (("Ember f32", None, False), ("Ember f32, jit", None, True),
                ("Ember bf16 autocast", "bfloat16", False), ("Ember bf16, jit", "bfloat16", True))
    profiling = args.torch_profile and args.device == "cuda"
    for name, low, jit in variants[3:] if args.bf16_only else variants:
        profiled = 3 if profiling and low and jit else 0   # the step the profile table shows
        first, rest, loss, host, launch, planned = ember_steps(c, args.steps, tokens, args.device, low, jit, profiled)
        tps = per_step / statistics.median(rest)
        ember_tps[low] = max(ember_tps.get(low, 0.0), tps)
        memory = (f"   GPU memory in use {device_memory_used():5.1f} GiB, Ember's allocations "
                  f"{cuda.ALLOCATED[0] / 2 ** 30:5.2f} GiB" if args.device == "cuda" else "")
        print(f"{name:20s}{tps:10.0f} tok/s   {mfu(tps)}   step {statistics.median(rest) * 1e3:8.1f} ms   "
              f"first step {first:6.1f} s   loss {loss:.3f}   host {host * 1e3:6.2f} ms"
              + ("" if math.isnan(launch) else f" ({launch * 1e3:.2f} before the launch)") + memory, flush=True)
        print(f"{'':20s}{planned}", flush=True)
        if profiled:
            ember_kinds = ember_profile(profiled)
    peers = [("PyTorch eager f32", False, False), ("PyTorch bf16+SDPA", True, False)][args.bf16_only:]
    peers += [("PyTorch bf16 compiled", True, True)] if args.compile else []
    for name, bf16, compiled in peers if torch.cuda.is_available() else ():
        torch.cuda.reset_peak_memory_stats()
        times = torch_steps(c, args.steps + compiled * 2, tokens, bf16, compiled=compiled)
        tps = per_step / statistics.median(times[1 + compiled * 2:])
        first = f"   first step {times[0]:6.1f} s" if compiled else ""
        mine = ember_tps["bfloat16" if bf16 else None]
        ratio = f"Ember ({'bf16' if bf16 else 'f32'})/PyTorch {mine / tps:.3f}"
        print(f"{name:22s}{tps:10.0f} tok/s   {mfu(tps)}   {ratio}   "
              f"peak allocated {torch.cuda.max_memory_allocated() / 2 ** 30:5.1f} GiB{first}", flush=True)
    if profiling and torch.cuda.is_available():
        peer = "PyTorch bf16" + (" + torch.compile" if args.compile else "")
        columns = [("Ember bf16, jit", *ember_kinds), (peer, *torch_profile(c, tokens, args.compile))]
        kind_table(columns)
        if args.profile_json:
            with open(args.profile_json, "w") as f:
                json.dump({name: {"kinds": by, "kernels": sorted(top, reverse=True)} for name, by, top in columns}, f)


if __name__ == "__main__":
    main()
