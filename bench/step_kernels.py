"""The kernels of a GPT training step (bf16 autocast, AdamW) for a GPU, each with the bytes its
buffers hold, its FLOPs and the time those take at the H200's limits (4.0 TB/s, 800 TFLOP/s of
dense bf16 tensor cores): the least the schedule could run in, and where its bytes go. No GPU
needed; compare with EMBER_PROFILE=1 on one.

    python3 bench/step_kernels.py [--layers 1] [--batch 16] [--top 40] [--show k123,k456] [--units 16] [--lint]

--units N: the step's compile units as N cores would split them (cuda_render.render_units),
compiled by NVRTC one after another (a fresh EMBER_CACHE, or the cubins come from disk): each
unit's seconds, their sum and the slowest, the critical path of a parallel compile on N cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember import optim  # noqa: E402
from ember import tensor as T  # noqa: E402
from ember.backend import cuda, cuda_render  # noqa: E402
from ember.compiler import schedule  # noqa: E402
from ember.compiler.schedule import Schedule  # noqa: E402
from ember.models.gpt import GPTConfig, build  # noqa: E402

BANDWIDTH, TENSOR_FLOPS = 4.0e12, 800e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--model", choices=("gpt", "llama"), default="gpt", help="the GPT-2 shape or the LLaMA preset's")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--show", default="", help="comma-separated kernel names whose CUDA source to print")
    ap.add_argument("--units", type=int, default=0, help="time NVRTC on the units N cores would compile")
    ap.add_argument("--lint", action="store_true",
                    help="list the kernels that read a buffer of 1 MB or more scattered across a warp's threads")
    args = ap.parse_args()
    T.manual_seed(0)
    model = build(GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers,
                            n_head=args.dim // 64, arch=args.model))
    opt = optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    x = T.Tensor(np.zeros((args.batch, args.block), np.int32))
    with T.autocast("bfloat16"):
        loss = model.loss(x, x)
    loss.backward()
    opt.steps += 1
    outputs, _ = T.canonical_program([loss.node] + [new.node for _, new in opt.updates()])
    t = time.perf_counter()
    sched = cuda.prepare(outputs, args.arch)
    print(f"{len(sched.kernels)} kernels, scheduled in {time.perf_counter() - t:.1f} s")
    rows = []
    for k in sched.kernels:
        nbytes = schedule.kernel_bytes(k)
        flops = 0
        if k.contraction:
            c = k.contraction
            m, n, kk = c.mnk
            flops = 2 * m * n * kk * c.batch_size
        ms = max(nbytes / BANDWIDTH, flops / TENSOR_FLOPS) * 1e3
        rows.append((ms, k.name, f"{k.out.node.dtype}{list(k.out.node.shape)}", k.kind, nbytes, flops, len(k.reads)))
    rows.sort(key=lambda r: -r[0])
    print(f"the least time: {sum(r[0] for r in rows):.2f} ms (bytes at 4.0 TB/s, FLOPs at 800 TFLOP/s)")
    print(f"{'ms':>7s}  {'kernel':8s} {'output':30s} {'kind':11s} {'MB':>8s} {'GFLOP':>8s} reads")
    for ms, name, out, what, nbytes, flops, reads in rows[:args.top]:
        print(f"{ms:7.3f}  {name:8s} {out:30s} {what:11s} {nbytes / 1e6:8.1f} {flops / 1e9:8.1f} {reads:5d}")
    if args.lint:   # (cuda_render.scattered_loads: a 32-byte sector for each thread's element)
        size = {b.id: b.nbytes for k in sched.kernels for b in k.args}
        for k in sched.kernels:
            for b in {ld.srcs[0].arg for ld in cuda_render.scattered_loads(k)}:
                if size[b] >= 1 << 20:
                    print(f"scattered: {k.name} ({k.plan}) reads b{b} ({size[b] / 1e6:.1f} MB)")
    for k in sched.kernels:
        if k.name in args.show.split(","):
            print(cuda.render(dataclasses.replace(sched, kernels=[k])))
    if args.units:
        nvrtc_units(sched, args.units)


def nvrtc_units(sched: Schedule, cores: int) -> None:
    """NVRTC's seconds on each compile unit that `cores` cores would get, one unit after another."""
    units = cuda.render_units(sched.kernels, sched.target, cores)
    seconds = []
    for src, runs in units:
        t = time.perf_counter()
        cuda.compile_cubin(src, sched.target.arch)
        seconds.append(time.perf_counter() - t)
        print(f"unit of {len(set(runs.values()))} kinds, {len(src) / 1e3:.0f} kB: {seconds[-1]:.2f} s", flush=True)
    kinds = len({f for _, runs in units for f in runs.values()})
    print(f"{kinds} kinds in {len(units)} units: NVRTC {sum(seconds):.1f} s one after another, the slowest unit "
          f"{max(seconds):.1f} s")


if __name__ == "__main__":
    main()
