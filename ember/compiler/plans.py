"""What the plan pass (optimize.py) reads besides its heuristics: the environment's overrides
and the table of stored contraction plans, winners of backend/search.py's timed search.

The table is per device name (`Target.name`) and kernel structure (`structure`): the cache's
`plans/plans.json`, which a search writes, over `plans.json` beside this file, the winners that
ship with Ember. Both are read when a schedule is compiled, and what the choice depends on
(`choice_key`: the overrides and the target's entries) is part of the schedule cache's key, so
a newly stored winner is never hidden by a schedule cached before it.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from ..cache import cache_dir
from ..target import Target
from .contraction import Contraction, GpuPlan

SHIPPED = Path(__file__).with_name("plans.json")
# EMBER_TC_PLAN: every contraction's plan, for experiments ("wgmma,128,128,64,2,1,3": GpuPlan's
# fields in order); EMBER_FLASH_WS=0: no warp-specialized flash kernels (the cp.async ones)
OVERRIDES = ("EMBER_TC_PLAN", "EMBER_FLASH_WS")


def forced_contraction() -> GpuPlan | None:
    """EMBER_TC_PLAN's plan, or None."""
    forced = os.environ.get("EMBER_TC_PLAN")
    if not forced:
        return None
    name, *sizes = forced.split(",")
    plan = GpuPlan(name, *map(int, sizes))
    if name == "wgmma" and plan.stages < 3:   # it keeps a step in flight besides the one filled
        raise ValueError(f"EMBER_TC_PLAN={forced}: wgmma needs 3 stages or more")
    if name == "mma.sync" and plan.block_k % 32:   # its fragments alternate between two buffers a 16-deep step
        raise ValueError(f"EMBER_TC_PLAN={forced}: mma.sync needs a K-step that is a multiple of 32")
    return plan


def flash_warp_specialized() -> bool:
    return os.environ.get("EMBER_FLASH_WS") != "0"


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


def entries(gpu: Target) -> dict[str, list]:
    """The stored plans for this device, by structure: the searched ones over the shipped."""
    return {**_load(SHIPPED).get(gpu.name, {}), **searched().get(gpu.name, {})}


def stored(c: Contraction, gpu: Target) -> GpuPlan | None:
    fields = entries(gpu).get(structure(c, gpu.arch))
    return GpuPlan(*fields) if fields else None


def store(c: Contraction, gpu: Target, plan: GpuPlan) -> None:
    """Keep a searched winner in the cache's table (written whole: a reader sees old or new)."""
    path, table = cache_dir("plans") / "plans.json", searched()
    table.setdefault(gpu.name, {})[structure(c, gpu.arch)] = list(dataclasses.astuple(plan))
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    os.replace(tmp, path)


def choice_key(gpu: Target) -> tuple:
    """What the plans chosen for gpu depend on besides the program, for the schedule cache's key
    (which hashes it): the overrides and the device's stored plans."""
    return tuple(os.environ.get(v) for v in OVERRIDES) + (sorted(entries(gpu).items()) if gpu.kind == "cuda" else None,)


def searched() -> dict[str, Any]:
    """The cache's table of searched plans (plans.json's format: `search --export` prints it)."""
    return _load(cache_dir("plans") / "plans.json")
