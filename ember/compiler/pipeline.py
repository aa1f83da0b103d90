"""The compiler's stages, in order, for one target. Every backend goes through this function:

1. CUDA: attention found and replaced by the flash kernels (attention.py), before the
   gradients, so that its gradient is theirs;
2. gradients become ordinary ops (autodiff.expand_grads);
3. the target's rewrite of the tensor graph (CUDA: long reductions in two stages, split.py;
   after scheduling, a split contraction then adds its parts into their sum itself);
4. simplification, fusion and lowering into kernels (schedule.py, simplify.py, lower.py);
5. optimization, the one pass that chooses every kernel's plan: its heuristics, the overrides and
   the stored search winners (plans.py): the parallel loop, lanes, contraction tilings, flash
   plans, online reductions (optimize.py);
6. CUDA: chains of row kernels over the same rows run in the same blocks, chains of maps over
   one iteration space in the same threads, and small kernels move to the end and launch
   together (merge.py).

What follows is the backend's: placement and linearization into C-like text (backend/render.py),
then its compiler and runtime.
"""
from __future__ import annotations

from .. import debug
from ..ir import Node
from ..target import Target
from . import attention, autodiff, plans, store, symbolic
from .merge import in_place, merge_chains, merge_rows, merge_small
from .optimize import optimize
from .schedule import Schedule, plan_memory, schedule
from .split import accumulate_parts, split_large_reductions


def compile_schedule(outputs: list[Node], target: Target, nest: int = 0) -> Schedule:
    """target: the CPU or GPU compiled for (ember/target.py); nest: the C backend's allowance for
    short reductions inside others (lower.Lowerer). A program compiled before, in this process or
    another, is loaded from the disk cache (store.py)."""
    k = store.key(outputs, target, nest, plans.choice_key(target))   # overrides, stored plans
    sched = store.load(k)
    if sched is None:
        with symbolic.remembered():
            sched = _compile(outputs, target, nest)
        store.save(k, sched)
    debug.plans(2, f"for {target.arch}", sched.kernels)
    return sched


def _compile(outputs: list[Node], target: Target, nest: int) -> Schedule:
    if target.mma_sync:   # flash attention
        outputs = attention.fuse(outputs)
    graph = autodiff.expand_grads(outputs)   # gradients first: their reductions are split too
    if target.kind == "cuda":
        graph = split_large_reductions(graph, target)
    sched = schedule(graph, nest=nest)
    if target.kind == "cuda":
        accumulate_parts(sched)
    chains = optimize(sched, target)
    if target.kind == "cuda":
        merge_rows(sched, chains, target)
        merge_chains(sched)
        merge_small(sched)
        sched.slots = plan_memory(sched, in_place)   # the new order's (outputs over dead inputs: not in C)
    sched.target = target
    return sched
