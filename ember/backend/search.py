"""Plan search for contractions on the GPU: opt-in (EMBER_SEARCH=1), timed, cached.

The heuristics of compiler/contraction.py give every contraction a good plan without any
timing. With EMBER_SEARCH=1, each contraction kernel is compiled and timed alone under every
candidate plan (CUDA events, zeroed buffers, the median of a few runs, at most
EMBER_SEARCH_SECONDS per kernel, 60 by default), and the fastest is kept. Winners are stored per
device and kernel structure (dtype, sizes, operand layouts) in the cache's `plans` folder and
used by every later run, searching or not; `plans.json` beside this file holds winners that ship
with Ember (`python -m ember.backend.search --export` prints the cache in its format).
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ..compiler import contraction
from ..compiler.contraction import Contraction, GpuPlan
from ..compiler.lower import Kernel
from ..target import Target
from . import cache_dir

SHIPPED = Path(__file__).with_name("plans.json")


def structure(c: Contraction, arch: str) -> str:
    """What a plan's speed depends on: architecture, dtype, sizes and operand layouts."""
    m, n, k = c.mnk
    layout = "".join("k" if op.k_major else "m" for op in (c.a, c.b)) + ("" if c.a.aligned and c.b.aligned else "u")
    return f"{arch} {c.dtype.name} {c.batch_size}x{m}x{n}x{k} {layout}"


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def known(device: str, key: str) -> GpuPlan | None:
    """A stored winner for this structure on this device: the cache's, else one that shipped."""
    for table in (_load(cache_dir("plans") / "plans.json"), _load(SHIPPED)):
        fields = table.get(device, {}).get(key)
        if fields:
            return GpuPlan(*fields)
    return None


def _store(device: str, key: str, plan: GpuPlan) -> None:
    path = cache_dir("plans") / "plans.json"
    table = _load(path)
    table.setdefault(device, {})[key] = list(dataclasses.astuple(plan))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, path)


def candidates(c: Contraction, gpu: Target) -> list[GpuPlan]:
    """Plans worth timing for c on the GPU (the heuristic's first), within shared memory."""
    if c.dtype.name == "f32":
        plans = [GpuPlan("fma", 128, 128, 8, 1, 1, s) for s in (3, 2, 4)] + [GpuPlan("fma", 64, 64, 8, 1, 1, 3)]
    else:
        plans = [GpuPlan("mma.sync", 128, 128, 32, 2, 2, s) for s in (4, 3)] + \
                [GpuPlan("mma.sync", 64, 64, 32, 2, 2, s) for s in (4, 3)]
        if gpu.wgmma:
            shapes = ((128, 256, 4), (128, 256, 3), (128, 128, 4), (128, 128, 3), (64, 256, 4))
            plans = [contraction.fed(GpuPlan("wgmma", bm, bn, 64, bm // 64, 1, s), c, gpu)
                     for bm, bn, s in shapes] + plans
    first = contraction.plan(c, gpu)
    plans = list(dict.fromkeys(([first] if first else []) + plans))   # (a TMA store makes 4 stages 3)
    return [p for p in plans if contraction.smem_bytes(p) <= gpu.smem_block]


def choose(kernels: list[Kernel], gpu: Target, timer: Any) -> None:
    """Give each contraction kernel its stored or searched plan. timer(kernel) -> seconds."""
    if os.environ.get("EMBER_TC_PLAN"):  # a plan forced for an experiment wins
        return
    searching = os.environ.get("EMBER_SEARCH") == "1"
    budget = float(os.environ.get("EMBER_SEARCH_SECONDS", "60"))
    for k in kernels:
        if k.contraction is None or not isinstance(k.plan, GpuPlan):
            continue
        c, heuristic = k.contraction, k.plan
        key = structure(c, gpu.arch)
        stored = known(gpu.name, key)
        if stored is not None or not searching:
            k.plan = contraction.fed(stored, c, gpu) if stored else heuristic
            continue
        start, times = time.perf_counter(), {}
        for plan in candidates(c, gpu):
            if time.perf_counter() - start > budget:
                break
            k.plan = plan
            times[plan] = timer(k)
        best = min(times, key=times.get)
        k.plan = best
        _store(gpu.name, key, best)
        print(f"ember search: {k.name} ({key}): {best} at {times[best] * 1e3:.3f} ms, "
              f"heuristic {times.get(heuristic, float('nan')) * 1e3:.3f} ms; {len(times)} plans in "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr)


def median_seconds(run: Any, reps: int = 5) -> float:
    """run(): one launch, returning its milliseconds; the median after one warm-up."""
    run()
    return statistics.median(run() for _ in range(reps)) / 1e3


if __name__ == "__main__":
    if sys.argv[1:] == ["--export"]:
        print(json.dumps(_load(cache_dir("plans") / "plans.json"), indent=1, sort_keys=True))
    else:
        print(__doc__)
