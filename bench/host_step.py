"""The Python of a replayed GPT training step, without a GPU: `ember.jit`'s replay with execution
faked, then `CUDAProgram.run_device` for the step's real schedule with the driver's calls faked.
What a replay costs the host besides the driver's own work (cuGraphLaunch, the uploads), which
only `PROFILE_HOST=1 python3 bench/train_gpu.py` on a GPU shows.

    python3 bench/host_step.py [--layers 12] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import itertools
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

os.environ["EMBER_NO_CUDA"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import ember  # noqa: E402
from ember import optim  # noqa: E402
from ember import tensor as T  # noqa: E402
from ember.backend import cuda  # noqa: E402
from ember.models.gpt import GPT, GPTConfig  # noqa: E402


def median_ms(fn, runs: int = 25, skip: int = 5) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times[skip:]) * 1e3


def replay(args: argparse.Namespace) -> tuple[list, float]:
    """ember.jit's replay of the step with T.execute returning ready arrays; (the step's program
    outputs, milliseconds per replay)."""
    ready: dict = {}
    programs: list = []

    def fake_execute(canonical: list, values: dict, average: tuple = ()) -> list:
        T.context.runs += 1
        programs.append(canonical)
        for n in canonical:
            if (n.shape, n.dtype.np_name) not in ready:
                ready[n.shape, n.dtype.np_name] = np.zeros(n.shape, np.dtype(n.dtype.np_name))
        return [ready[n.shape, n.dtype.np_name] for n in canonical]

    real, T.execute = T.execute, fake_execute
    try:
        T.manual_seed(0)
        model = GPT(GPTConfig(vocab=args.vocab, block=args.block, dim=args.dim, n_layer=args.layers,
                              n_head=args.dim // 64))
        opt = optim.AdamW(model.parameters(), lr=3e-4)

        @ember.jit
        def step(x: T.Tensor, y: T.Tensor) -> T.Tensor:
            opt.zero_grad()
            with T.autocast("bfloat16"):
                loss = model.loss(x, y)
            loss.backward()
            opt.step()
            return loss

        tokens = np.zeros((args.batch, args.block), np.int32)
        ms = median_ms(lambda: step(T.Tensor(tokens), T.Tensor(tokens)))
        return max(programs, key=len), ms
    finally:
        T.execute = real


def run_device(outputs: list, arch: str) -> float:
    """Milliseconds of CUDAProgram.run_device's Python for the step's schedule, the driver faked,
    each step's outputs fed back as the next step's inputs (the graph found every time)."""
    from cuda.bindings import driver as cu
    addresses = itertools.count(1 << 20, 1 << 12)
    cu.cuMemAlloc = lambda n: (cu.CUresult.CUDA_SUCCESS, next(addresses))
    cu.cuMemcpyHtoD = cu.cuGraphLaunch = lambda *a: (cu.CUresult.CUDA_SUCCESS, None)
    cu.cuStreamCreate = lambda *a: (cu.CUresult.CUDA_SUCCESS, 1)
    sched = cuda.prepare(outputs, arch)
    prog = object.__new__(cuda.CUDAProgram)
    prog.cu, prog.sched = cu, sched
    prog.start_runs()
    prog._temp_ptr = {b.id: next(addresses) for b in sched.temps}
    prog._capture = lambda key, launches, after: prog._graphs.__setitem__(key, None)
    prog._launch_list = lambda ptr: []
    values = {n: cuda.DeviceArray(b.node.shape, b.dtype) for n, b in sched.inputs.items()}
    same = {(b.node.shape, b.dtype.name): [n for n, i in sched.inputs.items() if (i.node.shape, i.dtype.name) ==
                                           (b.node.shape, b.dtype.name)] for b in sched.outputs}

    def one() -> None:
        results = prog.run_device(values)
        taken: dict = {}
        for b, arr in zip(sched.outputs, results):
            nodes = same[(b.node.shape, b.dtype.name)]
            i = taken.get(id(nodes), 0)
            if i < len(nodes):
                values[nodes[i]] = arr
                taken[id(nodes)] = i + 1
    print(f"run_device: {len(sched.inputs)} inputs, {len(sched.outputs)} outputs, {len(sched.kernels)} kernels")
    return median_ms(one)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--profile", action="store_true", help="cProfile both parts, print the top")
    args = ap.parse_args()
    profile = cProfile.Profile() if args.profile else None
    if profile:
        profile.enable()
    program, replay_ms = replay(args)
    device_ms = run_device(program, args.arch)
    if profile:
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    print(f"jit replay (execution faked): {replay_ms:.3f} ms; run_device (driver faked): {device_ms:.3f} ms; "
          f"together {replay_ms + device_ms:.3f} ms of Python a step")


if __name__ == "__main__":
    main()
