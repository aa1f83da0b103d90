"""Optimization: decide, per kernel, which loop runs in parallel and which ranges become lanes
(register tiles, see backend/render.py). Heuristics first; every choice keeps the kernel's
meaning, because splitting a range r into r_outer * f + r_lane is an exact substitution.

CPU heuristics, from the access pattern of the loads inside a reduction (kernels of at least
TILE_WORK iterations: smaller ones run in microseconds, and their unrolled lanes cost GCC seconds):
- matmul-like (one load ignores the last output range, another ignores the one before it and is
  contiguous in the last): a register tile of accumulators, 6x16 or 8x8 (12 or 8 of AVX2's 16
  vector registers; 8x16 spills, see docs/performance.md for the measurements);
- contiguous in the last output range only (a column sum): up to 64 lanes along it (8 vector
  registers; each row visit then reads 256 contiguous bytes instead of one 64-byte line);
- contiguous in the reduction range itself (a row sum): 8 lanes of partial sums, so the
  reduction vectorizes without reassociating one accumulator.
"""
from __future__ import annotations

import dataclasses
import math

from .. import dtype as dt
from ..ir import Node, Op, toposort
from ..target import Target
from . import attention, contraction, merge, online, plans
from . import symbolic as sym
from .loops import LoopPlan, RowPlan, Stage, ThreadPlan, TilePlan
from .lower import Kernel, enclosing_reduces, free_ranges, index_of, selector
from .rewrite import substitute
from .schedule import Schedule

MATMUL_TILES = ((6, 16), (8, 8), (4, 16), (4, 8), (2, 8))   # best first; the first that divides is used
PARALLEL_WORK = 1 << 15   # below this many loop iterations, starting threads costs more than it saves
# CPU: below this much work a kernel gets no lanes and a contraction no packing: it runs in under
# 0.1 ms either way, while GCC took 4 s to compile an unrolled 8x8 tile of bf16 products and 2.6 s
# a 64-lane column sum of a gelu gradient (a GPT step of dim 32 under autocast: 20 s cold)
TILE_WORK = 1 << 18


def work(k: Kernel) -> int:
    """Loop iterations of the kernel: output elements times the sizes of its reductions."""
    reduce_size = sum(math.prod(r.arg[1] for r in n.arg[1]) for n in toposort([k.store]) if n.op is Op.REDUCE)
    return math.prod(r.arg[1] for r in k.ranges) * max(1, reduce_size)


def stride(load: Node, r: Node) -> int | None:
    """How far the load's (or store's) address moves when r grows by one (None: not affine in r)."""
    terms, _ = sym.linear(load.srcs[1])
    if r in terms:
        return terms[r]
    return 0 if all(r not in free_ranges(t)[t] for t in terms) else None


def split(k: Kernel, r: Node, sizes: tuple[int, ...]) -> list[Node]:
    """Replace range r by nested ranges: r = r0 * (s1 * s2 ...) + r1 * (s2 ...) + ... + rn, the
    inner ones of the given sizes. An exact substitution, everywhere in the kernel."""
    name, n = r.arg
    inner = math.prod(sizes)
    parts = [sym.rng(f"{name}o", n // inner)] + [sym.rng(f"{name}{c}", s) for c, s in zip("abcdefgh", sizes)]
    terms = {p: math.prod(sizes[i:]) for i, p in enumerate(parts)}
    repl = sym.build(terms, 0)
    done: dict[Node, Node] = {r: repl}
    for node in toposort([k.store]):
        if node in done:
            continue
        srcs = tuple(done.get(s, s) for s in node.srcs)
        arg = node.arg
        if node.op is Op.REDUCE and r in arg[1]:
            arg = (arg[0], tuple(x for y in arg[1] for x in (parts if y is r else (y,))))
        done[node] = Node(node.op, node.dtype, srcs, arg, node.shape)
    (k.store,) = sym.simplify([done[k.store]])
    # guarded loads, again with the new ranges (a concatenation's piece starts at a lane group)
    guarded = {ld: Node(Op.LOAD, ld.dtype, (ld.srcs[0], sym.given(ld.srcs[1], ld.srcs[2]), ld.srcs[2]))
               for ld in toposort([k.store]) if ld.op is Op.LOAD and len(ld.srcs) == 3}
    if guarded:
        (k.store,) = substitute([k.store], guarded)
    k.reduces = {}  # the tensor-level bookkeeping of scheduling is done with
    if r in k.ranges:
        i = k.ranges.index(r)
        k.ranges[i:i + 1] = parts
    return parts


def split_range(k: Kernel, r: Node, f: int) -> Node:
    """Split r by f; the inner range becomes a lane."""
    _, lane = split(k, r, (f,))
    k.lanes = k.lanes | {lane}
    return lane


def matmul_parts(k: Kernel) -> tuple[Node, Node, Node, Node, Node] | None:
    """(reduction, row range i, column range j, load of A, load of B) of a matmul-like kernel:
    one load ignores j and moves with i, the other ignores i and is contiguous in j."""
    reduces = _outer_reduces(k)
    if not reduces:
        return None
    deps = free_ranges(k.store)
    red = max(reduces, key=lambda n: len(deps[n]))
    outs = [r for r in k.ranges if r in deps[red]]
    if len(outs) < 2 or outs[-1] is not k.ranges[-1] or len(red.arg[1]) != 1:
        return None
    i, j = outs[-2], outs[-1]
    loads = [n for n in toposort([red.srcs[0]]) if n.op is Op.LOAD]
    a = [ld for ld in loads if stride(ld, j) == 0 and stride(ld, i) not in (0, None)]
    b = [ld for ld in loads if stride(ld, i) == 0 and stride(ld, j) == 1]
    return (red, i, j, a[0], b[0]) if len(a) == 1 and len(b) == 1 else None


def _find_load(k: Kernel, like: Node) -> Node:
    """The load of the same buffer in the kernel after a rewrite."""
    return next(n for n in toposort([k.store]) if n.op is Op.LOAD and n.srcs[0] is like.srcs[0])


def _divisor(n: int, choices: tuple[int, ...]) -> int | None:
    return next((f for f in choices if n % f == 0 and n > f), None)


def _outer_reduces(k: Kernel) -> list[Node]:
    """The reductions not inside another (the loops that shape the kernel)."""
    inside = enclosing_reduces(k.store)
    return [n for n in toposort([k.store]) if n.op is Op.REDUCE and n not in inside]


def cpu_lanes(k: Kernel) -> None:
    reduces = _outer_reduces(k)
    if not reduces or work(k) < TILE_WORK:
        return
    deps = free_ranges(k.store)
    red = max(reduces, key=lambda n: len(deps[n]))
    loads = [n for n in toposort([red.srcs[0]]) if n.op is Op.LOAD]
    outs = [r for r in k.ranges if r in deps[red]]
    mm = matmul_parts(k)
    if mm is not None:
        _, prev, last, _, b = mm
        tile = next(((ti, tj) for ti, tj in MATMUL_TILES if prev.arg[1] % ti == 0 and last.arg[1] % tj == 0), None)
        if tile:
            split_range(k, prev, tile[0])
            split_range(k, last, tile[1])
            return
    if outs and outs[-1] is k.ranges[-1]:
        last = outs[-1]
        own = red.arg[1]
        contiguous = [ld for ld in loads if stride(ld, last) == 1 and all(stride(ld, r) != 1 for r in own)]
        f = _divisor(last.arg[1], (64, 32, 16, 8))
        if contiguous and f:
            split_range(k, last, f)
            return
    for r in red.arg[1]:
        if any(stride(ld, r) == 1 for ld in loads) and r.arg[1] >= 64:
            f = _divisor(r.arg[1], (8,))
            if f:
                split_range(k, r, f)
            return


def block_rows(k: Kernel, gpu: Target) -> tuple[list[Node], int] | None:
    """GPU: the output ranges a row's threads own when every outermost reduction reads a
    contiguous axis (they then share each reduction), and how many threads: 0 a block; for
    rows enough to fill the GPU and too short to share a block (a block of 256 threads idled on
    64), a group of a warp's threads, each with a vector of the row (a thread per row had each
    of a warp's loads touch 32 rows, and the logsumexp of 128-wide f32 rows ran at 0.49x
    torch.compile); None for a thread per output."""
    reduces = [n for n in toposort([k.store]) if n.op is Op.REDUCE]
    if not reduces:
        return None
    deps = free_ranges(k.store)
    nested = enclosing_reduces(k.store)
    top = [n for n in reduces if n not in nested]
    for n in top:
        last = n.arg[1][-1]
        loads = [ld for ld in toposort([n.srcs[0]]) if ld.op is Op.LOAD]
        if last.arg[1] < 32 or not any(stride(ld, last) == 1 for ld in loads):
            return None
    used = frozenset().union(*(deps[n] for n in top))
    prefix = [r for r in k.ranges if r in used]
    if prefix != k.ranges[:len(prefix)]:
        return None
    # loads that move along a row but not contiguously, contiguous along the outputs instead (a
    # column sum that also reads a per-row mean: a layernorm weight's gradient, [128, 768] partial
    # sums of 64 rows) have a block per output read a 32-byte sector for each element: 8 to 16
    # times the bytes. A thread per output, with lanes of partial sums, reads them coalesced, in
    # rounds of the memory's latency: the better where the outputs times the lanes reach about
    # a quarter of the GPU's resident threads (the bytes in flight that hide the latency, over the
    # 32 a sector costs); 768 outputs alone keep their blocks. (A strided load the outputs share,
    # a small table's column, leaves the rows to their blocks.)
    lasts = {n.arg[1][-1] for n in top}
    strided = [ld for n in top for ld in toposort([n.srcs[0]]) if ld.op is Op.LOAD
               if any(stride(ld, r) not in (0, 1) for r in lasts)]
    outputs = math.prod(r.arg[1] for r in k.ranges)
    if strided and all(stride(ld, k.ranges[-1]) == 1 for ld in strided) and \
            outputs * gpu_lanes(k) >= gpu.sms * gpu.threads_sm // 4:
        return None
    if outputs < gpu.min_threads or max(math.prod(r.arg[1] for r in n.arg[1]) for n in top) > SHORT_ROW:
        return prefix, 0
    # a group only where every load that moves along a row moves contiguously
    if strided:
        return None
    length = min(math.prod(r.arg[1] for r in n.arg[1]) for n in top)
    group = 1 << (min(32, length // gpu_lanes(k)).bit_length() - 1)
    return (prefix, group) if group >= 4 else None


GPU_LANES = 4  # elements per thread: four independent loads or accumulators in flight
SHORT_ROW = 256  # rows this long, when there are enough of them, take a group of a warp's threads each


def gpu_lanes(k: Kernel) -> int:
    """Elements per thread: 4, or as many as make one 16-byte load of the narrowest type loaded
    (8 for f16/bf16: 4 lanes of 2 bytes were 8-byte loads, and bf16 softmax ran at 19% of copy)."""
    sizes = [n.dtype.itemsize for n in toposort([k.store]) if n.op is Op.LOAD]
    return max(GPU_LANES, 16 // min(sizes)) if sizes and min(sizes) == 2 else GPU_LANES
# a thread summing a column of its own with lanes: each lane an independent sum, so half as many
# threads keep as many bytes in flight (GPT-2's bias gradients, [256, 3072] partial column sums
# of bf16, ran at 1.36 TB/s with a 2-byte load per thread and step)
GPU_MIN_REDUCE_THREADS = 1 << 16


GPU_TILES = ((128, 8), (64, 4))  # (block tile, thread tile): 16 x 16 = 256 threads each
GPU_BK = 8                       # the K-step staged in shared memory


def gpu_matmul_tile(k: Kernel) -> bool:
    """A block computes a TxT output tile, each of its 16x16 threads an RxR register tile; for
    every K-step the block stages the A and B tiles it needs in shared memory."""
    mm = matmul_parts(k)
    if mm is None:
        return False
    red, i, j, a, b = mm
    (kr,) = red.arg[1]
    t = next(((t, r) for t, r in GPU_TILES if i.arg[1] % t == 0 and j.arg[1] % t == 0), None)
    if t is None or kr.arg[1] % GPU_BK:
        return False
    (tile, reg), outer = t, [r for r in k.ranges if r is not i and r is not j]
    ib, it, il = split(k, i, (tile // reg, reg))
    jb, jt, jl = split(k, j, (tile // reg, reg))
    ko, ki = split(k, kr, (GPU_BK,))
    k.ranges = [*outer, ib, jb, it, jt, il, jl]
    # each tile laid out so the fill reads global memory along its contiguous axis (k for A, j for B)
    stages = (Stage(_find_load(k, a), ko, (it, il, ki)), Stage(_find_load(k, b), ko, (ki, jt, jl)))
    k.plan, k.lanes = TilePlan((*outer, ib, jb), (it, jt), stages), frozenset([il, jl])
    return True


def gpu_transpose_tile(k: Kernel) -> bool:
    """An elementwise kernel whose one load is contiguous along another output range than the
    store (a transpose): a block moves a 32x32 tile through shared memory, reading along one axis
    and writing along the other; the tile's pitch is 33 so that neither side has bank conflicts."""
    if not k.ranges or any(n.op is Op.REDUCE for n in toposort([k.store])):
        return False
    loads = [n for n in toposort([k.store]) if n.op is Op.LOAD]
    b = k.ranges[-1]
    if len(loads) != 1 or stride(k.store, b) != 1 or stride(loads[0], b) in (0, 1, None):
        return False
    a = next((r for r in k.ranges[:-1] if stride(loads[0], r) == 1), None)
    if a is None or a.arg[1] % 32 or b.arg[1] % 32:
        return False
    outer = [r for r in k.ranges if r is not a and r is not b]
    ab, at, al = split(k, a, (8, 4))
    bb, bt = split(k, b, (32,))
    k.ranges = [*outer, ab, bb, at, bt, al]
    stages = (Stage(_find_load(k, loads[0]), None, (bt, at, al), pad=1),)
    k.plan, k.lanes = TilePlan((*outer, ab, bb), (at, bt), stages), frozenset([al])
    return True


def cpu_packed(k: Kernel) -> bool:
    """Contractions big enough to pay for packing their operands (backend/packed.py)."""
    c = contraction.find(k, (dt.f16, dt.bf16, dt.f32, dt.f64))
    if c is None:
        return False
    m, n, kk = c.mnk
    if math.prod(r.arg[1] for r in k.ranges) * kk < TILE_WORK or m < 4 or n < 8:
        return False
    k.contraction, k.plan = c, contraction.PackedPlan()
    return True


def gpu_contraction(k: Kernel, gpu: Target) -> bool:
    """f16/bf16 contractions on tensor cores, f32 ones on FMA register tiles (sm_80 and later:
    cp.async), the kernel rendered whole by backend/mma.py from the plan."""
    if not gpu.mma_sync:
        return False
    c = contraction.find(k, (dt.f16, dt.bf16, dt.f32))
    p = None if c is None else contraction.plan(c, gpu, k.atomic)
    if p is None:
        return False
    stored = plans.stored(c, gpu)   # an override, else a searched winner, else the heuristic's
    k.contraction, k.plan = c, plans.forced_contraction() or (contraction.fed(stored, c, gpu) if stored else p)
    return True


def gpu_scatter(k: Kernel) -> bool:
    """out[v, ..] = sum over k of where(e(k) == v, h(k, v, ..), 0), e free of the outputs: the
    gradient of a selection by data (an embedding's weights). As written every output visits
    every k; instead each k adds h(k, e(k), ..) into out[e(k), ..] with an atomic add, onto an
    output the runtime zeroes first: |v| times less work. f32/f64 outputs (hardware atomics);
    the order of the sum is unspecified, as the spec allows."""
    buf, idx, value = k.store.srcs
    if k.out.dtype not in (dt.f32, dt.f64) or value.op is not Op.REDUCE or value.arg[0] is not Op.SUM:
        return False
    own, body = value.arg[1], value.srcs[0]
    if body.op is not Op.WHERE or body.srcs[2].op is not Op.CONST or body.srcs[2].arg != 0:
        return False
    deps = free_ranges(k.store)
    v, e = next(((v, e) for v in k.ranges if (e := selector(body, v, deps)) is not None), (None, None))
    if v is None or v.arg[1] < 8 or not deps[e] or not deps[e] <= frozenset(own):
        return False
    valid, at = index_of(e, v.arg[1])
    from .rewrite import substitute
    h, where_at = substitute([body.srcs[1], idx], {v: Node(Op.WHERE, sym.INDEX, (valid, at, sym.const(0)))})
    zero = Node(Op.CONST, value.dtype, (), 0.0)
    k.store = Node(Op.STORE, k.store.dtype, (buf, where_at, Node(Op.WHERE, value.dtype, (valid, h, zero))))
    k.ranges = [*own, *(r for r in k.ranges if r is not v)]
    k.reduces, k.atomic = {}, True
    return True


def gpu_plan(k: Kernel, gpu: Target, lanes: int | None = None) -> None:
    """lanes: a thread per output's lanes if it has them (a chain's, merge.lanes)."""
    if gpu_contraction(k, gpu) or gpu_matmul_tile(k) or gpu_transpose_tile(k):
        return
    gpu_scatter(k)
    planned = block_rows(k, gpu)
    if planned is None:
        k.plan = ThreadPlan()
        # a thread per `lanes` consecutive outputs, unless that leaves too few threads to fill the GPU
        lanes = lanes or gpu_lanes(k)
        has_reduce = any(n.op is Op.REDUCE for n in toposort([k.store]))
        threads = math.prod(r.arg[1] for r in k.ranges) // lanes
        if k.ranges and k.ranges[-1].arg[1] % lanes == 0 and stride(k.store, k.ranges[-1]) == 1 \
                and threads >= (GPU_MIN_REDUCE_THREADS if has_reduce else 0):
            split_range(k, k.ranges[-1], lanes)
        elif not reduction_lanes(k, lanes):   # (a thread's own reduction over a contiguous axis)
            reduction_lanes(k, lanes, 4, contiguous=False)
        return
    row_plan(k, *planned)


def row_plan(k: Kernel, rows: "list[Node] | tuple[Node, ...]", group: int = 0) -> None:
    """A block (or a group of threads) per row: each thread keeps `lanes` partial results of a
    shared reduction over a contiguous axis,"""
    k.plan, lanes = RowPlan(tuple(rows), group), gpu_lanes(k)
    reduction_lanes(k, lanes, group or 32)
    # and writes `lanes` consecutive outputs of its row (a softmax's): vector loads and stores
    last = k.ranges[-1] if k.ranges else None
    if last is not None and last not in rows and last.arg[1] % lanes == 0 and last.arg[1] >= (group or 32) * lanes \
            and stride(k.store, last) == 1:
        split_range(k, last, lanes)


def reduction_lanes(k: Kernel, lanes: int, per_thread: int = 1, contiguous: bool = True) -> bool:
    """Split the innermost range of each reduction (with at least per_thread * lanes steps) into
    lanes: independent partial results. contiguous: only a range some load reads contiguously,
    loaded as one vector; else any (a thread summing down a column, its outputs too few for lanes
    of their own: GPT-2's [256, 768] partial column sums of bf16 kept four 2-byte loads in flight
    a thread, ptxas's unrolling, and ran at about half of the memory's bandwidth). Whether any was."""
    reduces = [n for n in toposort([k.store]) if n.op is Op.REDUCE]
    split = False
    for r in {n.arg[1][-1] for n in reduces}:
        loads = [ld for n in reduces if n.arg[1][-1] is r for ld in toposort([n.srcs[0]]) if ld.op is Op.LOAD]
        if r.arg[1] % lanes == 0 and r.arg[1] >= per_thread * lanes and \
                (not contiguous or any(stride(ld, r) == 1 for ld in loads)):
            split_range(k, r, lanes)
            split = True
    return split


def optimize(sched: Schedule, target: Target) -> list[list[Kernel]]:
    """Every kernel's plan; returns the row chains (CUDA) whose maps it planned a block per row,
    each a list of kernels in sched.kernels, for merge.merge_rows."""
    chains = _optimize(sched, target)
    from .. import debug
    debug.kernels(3, f"after optimization for {target.arch}", sched.kernels)
    return chains


def _optimize(sched: Schedule, target: Target) -> list[list[Kernel]]:
    chained = merge.lanes(sched.kernels, gpu_lanes) if target.kind == "cuda" else {}
    unplanned = {id(k): dataclasses.replace(k, ranges=list(k.ranges)) for k in sched.kernels} \
        if target.kind == "cuda" else {}
    for k in sched.kernels:
        if k.fused is not None:   # rendered whole (backend/flash.py)
            k.plan = attention.flash_plan(k, target, plans.flash_warp_specialized())
            continue
        if target.kind == "cuda":
            gpu_plan(k, target, chained.get(id(k)))
        elif not cpu_packed(k):
            group = online.find(k)
            if group is None:
                cpu_lanes(k)
            parallel = any(r not in k.lanes for r in k.ranges) and work(k) >= PARALLEL_WORK
            k.plan = LoopPlan(int(parallel), group)
    return plan_row_chains(sched, unplanned) if target.kind == "cuda" else []


def plan_row_chains(sched: Schedule, unplanned: dict[int, Kernel]) -> list[list[Kernel]]:
    """The row chains (merge.row_chain; merge_rows makes each one kernel), their maps planned a
    block per row of the chain's rows, from their kernels as they were before planning (a
    thread per output's lanes may split a row range)."""
    # (not the small maps merge_small moves to the end: an optimizer's updates of biases)
    staying = {id(unplanned[id(k)]) for k in sched.kernels if isinstance(k.plan, ThreadPlan)} - \
        {id(unplanned[i]) for i in merge.movable(sched.kernels)}
    view = [unplanned[id(k)] if isinstance(k.plan, ThreadPlan) else k for k in sched.kernels]
    chains, i = [], 0
    while i < len(view):
        members, end = merge.row_chain(view, i, frozenset(staying))
        for m, rows in members:
            if m.plan is None:
                row_plan(m, rows)
                sched.kernels[view.index(m)] = m
        if members:
            chains.append([m for m, _ in members])
        i = end
    return chains
