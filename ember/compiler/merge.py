"""The GPU's last scheduling passes: kernels launched together.

Chains (`chains`, `merge_chains`): consecutive maps over one iteration space, each reading what
an earlier one wrote only at the element it wrote, run in the same threads one after another:
AdamW's update of a tensor (the gradient rounded to bf16, the two moments, the parameter) was
four launches, each reading back what the last wrote from memory; as one, every value is read
back by the thread that wrote it, from cache. optimize gives a chain's members one number of
lanes (`lanes`), so that they split their ranges alike.

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
from typing import Callable

from ..ir import Op, toposort
from .loops import MergedPlan, ThreadPlan
from .lower import Kernel
from .rewrite import substitute
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


def _merged(members: list[Kernel], together: bool = False) -> Kernel:
    first = members[0]
    reads = {b.id: b for m in members for b in [m.out, *m.reads] if b.id != first.out.id}
    return Kernel(f"{'c' if together else 'b'}{first.name}", first.out, [], first.store, list(reads.values()),
                  plan=MergedPlan(tuple(members), together))


def _map(k: Kernel) -> bool:
    """A map that a thread per output runs (before optimize, or planned so), too large for
    merge_small (whatever its lanes, at most 8)."""
    planned = k.plan is None or isinstance(k.plan, ThreadPlan)
    return planned and not (k.atomic or k.stages or k.fused or k.contraction) \
        and math.prod(r.arg[1] for r in k.ranges) > 8 * SMALL_THREADS \
        and not any(n.op is Op.REDUCE for n in toposort([k.store]))


def _follows(a: Kernel, b: Kernel) -> bool:
    """Whether b can run after a in a's threads: the same ranges and lanes, and every read of
    a's output at the element a stores there (b's ranges taken as a's, in order)."""
    if [(r.arg[1], r in a.lanes) for r in a.ranges] != [(r.arg[1], r in b.lanes) for r in b.ranges]:
        return False
    index, rename = a.store.srcs[1], dict(zip(b.ranges, a.ranges))
    reads = [n for n in toposort([b.store]) if n.op is Op.LOAD and n.srcs[0].arg == a.out.id]
    return all(len(n.srcs) == 2 and substitute([n.srcs[1]], rename)[0] is index for n in reads)


def chains(kernels: list[Kernel]) -> list[list[Kernel]]:
    """Runs of consecutive maps over one iteration space, each reading every earlier member's
    output only where it was written (of two members or more). The order changes only across
    threads: what a member writes over (a donated input) is the donation rules' (members read
    before the writer count against it, schedule.donatable)."""
    found: list[list[Kernel]] = []
    run: list[Kernel] = []
    for k in kernels:
        is_map = _map(k)
        if run and is_map and all(_follows(m, k) for m in run):
            run.append(k)
            continue
        if len(run) > 1:
            found.append(run)
        run = [k] if is_map else []
    if len(run) > 1:
        found.append(run)
    return found


def lanes(kernels: list[Kernel], own: Callable[[Kernel], int]) -> dict[int, int]:
    """id(kernel) -> the lanes of its chain: the most any member would take on its own."""
    given: dict[int, int] = {}
    for chain in chains(kernels):
        n = max(own(k) for k in chain)
        given.update({id(k): n for k in chain})
    return given


def merge_chains(sched: Schedule) -> None:
    """Each chain that optimize left alike (the same ranges and lanes) becomes one kernel."""
    done = {id(k): chain for chain in chains(sched.kernels) for k in chain}
    out: list[Kernel] = []
    for k in sched.kernels:
        chain = done.get(id(k))
        if chain is None:
            out.append(k)
        elif k is chain[0]:
            out.append(_merged(chain, together=True))
    sched.kernels = out
