"""The GPU's last scheduling pass: small kernels launched together.

A training step's optimizer updates the layernorm weights and the biases one tensor at a time:
GPT-2 124M has about 500 kernels of one to sixteen blocks, each costing a launch and a drain of
the GPU (2-6 us) for microseconds of work. Small kernels whose outputs no large kernel reads
move to the end of the program, in order; there, each group that does not depend on itself
becomes one merged kernel (`MergedPlan`; its name: b and the first member's) whose blocks
run each member's code in turn. The members read and
write what they did; the pipeline makes the memory plan again for the new order.
"""
from __future__ import annotations

import math

from .loops import MergedPlan, ThreadPlan
from .lower import Kernel
from .schedule import Schedule

SMALL_THREADS = 4096           # a kernel of at most this many threads (16 blocks of 256) is small
SMALL_TEMP_BYTES = 4 << 20     # and it may wait for the end only if the temporaries it reads are small


def simple(k: Kernel) -> bool:
    """A thread per output (times its lanes): the kind a merged kernel can run block by block."""
    return isinstance(k.plan, ThreadPlan) and not k.atomic


def threads(k: Kernel) -> int:
    return math.prod(r.arg[1] for r in k.ranges if r not in k.lanes)


def merge_small(sched: Schedule) -> None:
    kernels = sched.kernels
    small = {id(k) for k in kernels if simple(k) and threads(k) <= SMALL_THREADS and
             all(b.kind != "temp" or b.nbytes <= SMALL_TEMP_BYTES for b in k.reads)}
    writer = {k.out.id: k for k in kernels}
    # a small kernel whose output a large one reads stays where it is (and so do the small ones it reads)
    staying = [k for k in kernels if id(k) not in small]
    needed = [writer[b.id] for k in staying for b in k.reads if b.id in writer]
    while needed:
        k = needed.pop()
        if id(k) in small:
            small.discard(id(k))
            needed += [writer[b.id] for b in k.reads if b.id in writer]
    moved = [k for k in kernels if id(k) in small]
    if len(moved) < 2:
        return
    # levels: a kernel runs after the moved ones it reads
    level: dict[int, int] = {}
    for k in moved:
        level[k.out.id] = 1 + max((level[b.id] for b in k.reads if b.id in level), default=-1)
    groups: dict[int, list[Kernel]] = {}
    for k in moved:
        groups.setdefault(level[k.out.id], []).append(k)
    merged = [group[0] if len(group) == 1 else _merged(group) for _, group in sorted(groups.items())]
    sched.kernels = [k for k in kernels if id(k) not in small] + merged


def _merged(members: list[Kernel]) -> Kernel:
    first = members[0]
    reads = {b.id: b for m in members for b in [m.out, *m.reads] if b.id != first.out.id}
    return Kernel(f"b{first.name}", first.out, [], first.store, list(reads.values()), plan=MergedPlan(tuple(members)))
