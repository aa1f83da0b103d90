"""The Python of a replayed GPT training step, without a GPU: `ember.jit`'s replay and
`CUDAProgram.run_device` on the step's real schedule, together, with the driver's calls faked
(the two traced calls before it run with their programs' values faked). What a replay costs the
host besides the driver's own work (cuGraphLaunch, the uploads), which only `PROFILE_HOST=1
python3 bench/train_gpu.py` on a GPU shows.

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

LAUNCHED: list[float] = []   # when each faked cuGraphLaunch was called


def median_ms(fn, runs: int = 25, skip: int = 5, profile: cProfile.Profile | None = None) -> tuple[float, float]:
    """Median milliseconds of fn, and of its part before the (faked) graph launch: the Python the
    GPU idles through when the loss is read back every step."""
    times, before = [], []
    for i in range(runs):
        if profile and i == skip:
            profile.enable()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
        before.append(LAUNCHED[-1] - t if LAUNCHED and LAUNCHED[-1] > t else float("nan"))
    if profile:
        profile.disable()
    return statistics.median(times[skip:]) * 1e3, statistics.median(before[skip:]) * 1e3


def fake_driver() -> None:
    """cuda-python's calls that a replayed step makes, as no-ops; blocks are integers."""
    from cuda.bindings import driver as cu
    addresses = itertools.count(1 << 20, 1 << 12)
    ok = cu.CUresult.CUDA_SUCCESS
    cu.cuMemAlloc = lambda n: (ok, next(addresses))
    cu.cuMemcpyHtoD = lambda *a: (ok, None)

    def launch(*a: object) -> tuple:
        LAUNCHED.append(time.perf_counter())
        return ok, None
    cu.cuGraphLaunch = launch
    cu.cuStreamCreate = lambda *a: (ok, 1)

    def program(outputs: list) -> cuda.CUDAProgram:
        prog = object.__new__(cuda.CUDAProgram)
        prog.cu, prog.sched = cu, cuda.prepare(outputs, "sm_90a")
        prog.start_runs()
        prog._temp_ptr = {b.id: next(addresses) for b in prog.sched.temps}
        prog._capture = lambda key, launches, after: prog._graphs.__setitem__(key, None)
        prog._launch_list = lambda ptr: []
        prog._issue = lambda launches, stream, after=None: None
        return prog
    cuda.program = cuda.cached(program)


def step_ms(args: argparse.Namespace, profile: cProfile.Profile | None) -> tuple[float, float, int, int]:
    """Milliseconds of a replayed step's Python (ember.jit's replay and CUDAProgram.run_device,
    the driver faked), and of its part before the launch; the step program's inputs and the
    outputs it made arrays for."""
    def zeros(canonical: list, values: dict, average: tuple = (), donate: tuple = ()) -> list:
        T.context.runs += 1
        return [np.zeros(n.shape, np.dtype(n.dtype.np_name)) for n in canonical]

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

    def on_gpu(canonical: list, values: dict, average: tuple = (), donate: tuple = ()) -> list:
        T.context.runs += 1   # T.execute's "cuda" path (the default device here is the CPU)
        return cuda.run_device(canonical, values, average, donate)

    tokens = np.zeros((args.batch, args.block), np.int32)
    real, T.execute = T.execute, zeros   # the traced calls run eagerly: their programs' values faked
    try:
        for _ in range(2):
            step(T.Tensor(tokens), T.Tensor(tokens))
        T.execute = on_gpu
        ms, before = median_ms(lambda: step(T.Tensor(tokens), T.Tensor(tokens)), profile=profile)
    finally:
        T.execute = real
    prog = max(cuda.program.programs.values(), key=lambda p: len(p.sched.kernels))
    made = len(prog.sched.outputs) - len(next(iter(prog._donatable.values())).pairs)
    return ms, before, len(prog.sched.inputs), made


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--profile", action="store_true", help="cProfile the replayed steps, print the top")
    args = ap.parse_args()
    fake_driver()
    profile = cProfile.Profile() if args.profile else None
    ms, before, inputs, made = step_ms(args, profile)
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    print(f"replayed step: {ms:.3f} ms of Python ({before:.3f} before the graph's launch; ember.jit's replay "
          f"and run_device, the driver faked); "
          f"the step program's {inputs} inputs, {made} outputs given new arrays (the rest updated in place)")


if __name__ == "__main__":
    main()
