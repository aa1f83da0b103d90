"""Plan search for contractions on the GPU: opt-in (EMBER_SEARCH=1), timed.

The heuristics of compiler/contraction.py give every contraction a good plan without any
timing. With EMBER_SEARCH=1, each contraction kernel whose structure has no stored plan for this
device is compiled and timed alone under every candidate plan (CUDA events, zeroed buffers, the
median of a few runs, at most EMBER_SEARCH_SECONDS per kernel, 60 by default), and the fastest is
kept in the table of stored plans that the compiler's plan pass reads (compiler/plans.py), so
every later compile uses it, searching or not (`python -m ember.backend.search --export` prints
the searched table in the format of the shipped one, compiler/plans.json).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

from ..compiler import contraction, plans
from ..compiler.contraction import Contraction, GpuPlan
from ..compiler.lower import Kernel
from ..target import Target


def candidates(c: Contraction, gpu: Target) -> list[GpuPlan]:
    """Plans worth timing for c on the GPU (the heuristic's first), within shared memory."""
    if c.dtype.name == "f32":
        found = [GpuPlan("fma", size, size, deep, 1, 1, s) for size in (128, 64) for deep in (16, 8) for s in (4, 3)]
    else:
        found = [GpuPlan("mma.sync", 128, 128, 32, 2, 2, s) for s in (4, 3)] + \
                [GpuPlan("mma.sync", 64, 64, 32, 2, 2, s) for s in (4, 3)]
        if gpu.wgmma:
            shapes = ((128, 256, 4), (128, 256, 3), (128, 128, 4), (128, 128, 3), (64, 256, 4))
            found = [contraction.fed(GpuPlan("wgmma", bm, bn, 64, bm // 64, 1, s), c, gpu)
                     for bm, bn, s in shapes] + found
    first = contraction.plan(c, gpu)
    found = list(dict.fromkeys(([first] if first else []) + found))   # (a TMA store makes 4 stages 3)
    return [p for p in found if contraction.smem_bytes(p) <= gpu.smem_block]


def choose(kernels: list[Kernel], gpu: Target, timer: Any) -> None:
    """Search the contraction kernels' plans that no stored one chose (EMBER_SEARCH=1), keep
    the winners, and give the kernels them. timer(kernel) -> seconds."""
    if os.environ.get("EMBER_SEARCH") != "1" or plans.forced_contraction():  # a forced plan wins
        return
    budget = float(os.environ.get("EMBER_SEARCH_SECONDS", "60"))
    for k in kernels:
        if k.contraction is None or not isinstance(k.plan, GpuPlan):
            continue
        c, heuristic, stored = k.contraction, k.plan, plans.stored(k.contraction, gpu)
        if stored:   # (a kernel of the same structure searched before it)
            k.plan = contraction.fed(stored, c, gpu)
            continue
        start, times = time.perf_counter(), {}
        for plan in candidates(c, gpu):
            if time.perf_counter() - start > budget:
                break
            k.plan = plan
            times[plan] = timer(k)
        best = min(times, key=times.get)
        k.plan = best
        plans.store(c, gpu, best)
        print(f"ember search: {k.name} ({plans.structure(c, gpu.arch)}): {best} at {times[best] * 1e3:.3f} ms, "
              f"heuristic {times.get(heuristic, float('nan')) * 1e3:.3f} ms; {len(times)} plans in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)


def median_seconds(run: Any, reps: int = 5) -> float:
    """run(): one launch, returning its milliseconds; the median after one warm-up."""
    run()
    return statistics.median(run() for _ in range(reps)) / 1e3


if __name__ == "__main__":
    if sys.argv[1:] == ["--export"]:
        print(json.dumps(plans.searched(), indent=1, sort_keys=True))
    else:
        print(__doc__)
