"""Scheduling: which tensor nodes become buffers, and the kernels that compute them.

Start from the least that must live in memory (params, outputs) and fuse everything else into
the kernels that use it: elementwise and movement ops are inlined at the consumer's index, and
a reduction is computed inside its consumer's loops (softmax's max and sum become loops inside
the row loop). A reduction is given a buffer of its own when fusing it would compute it more
than once per value (an outer loop it does not depend on, an enclosing reduction it depends
on) or when several kernels need it. Iterate until no kernel asks for more buffers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import debug
from ..ir import ELEMENTWISE, Node, Op, toposort
from ..target import Target
from . import autodiff, simplify
from .contraction import gathered_operands
from .lower import Buffer, Kernel, lower_kernel, recompute_problems, recomputed_operands

LANES = 64  # with nesting on, values recomputed along an output range this short are left to lanes


@dataclass
class Schedule:
    inputs: dict[Node, Buffer]           # param node -> its buffer
    outputs: list[Buffer]                # one per returned node, in return order
    kernels: list[Kernel]
    temps: list[Buffer] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)   # temp buffer id -> memory slot
    target: Target | None = None         # what it was compiled for (pipeline.py)

    @property
    def buffers(self) -> list[Buffer]:
        seen: dict[int, Buffer] = {}
        for b in [*self.inputs.values(), *self.outputs, *self.temps]:
            seen.setdefault(b.id, b)
        return list(seen.values())


def schedule(outputs: list[Node], nest: int = 0) -> Schedule:
    """nest: the C backend's allowance for short reductions inside others (lower.Lowerer)."""
    expanded = autodiff.expand_grads(outputs)
    debug.graph(3, "after grad expansion", expanded)
    graph = simplify.simplify(expanded)
    debug.graph(3, "after simplify", graph)
    order = toposort(graph)   # sources first; the graph does not change below, only what is realized
    params = [n for n in order if n.op is Op.PARAM]
    ids = iter(range(1 << 30))
    inputs = {p: Buffer(next(ids), p.dtype, p.numel, "input", p) for p in params}
    out_bufs: dict[Node, Buffer] = {}
    for o in graph:
        if o not in out_bufs:
            out_bufs[o] = Buffer(next(ids), o.dtype, o.numel, "output", o)
    # an output that only reshapes what a FUSED kernel computes is what it computes: the kernel
    # writes the output's buffer, and no kernel copies it (a forward's attention output)
    views: set[Node] = set()
    for o in graph:
        src = o
        while src.op is Op.RESHAPE:
            src = src.srcs[0]
        if src is not o and src.op is Op.FUSED and src not in out_bufs:
            out_bufs[src] = out_bufs[o]
            views.add(o)
    # kernels the backend renders whole (attention.py) always have buffers of their own
    temps: dict[Node, Buffer] = {n: Buffer(next(ids), n.dtype, n.numel, "temp", n)
                                 for n in order if n.op is Op.FUSED and n not in out_bufs}
    position = {n: i for i, n in enumerate(order)}
    lowered: dict[Node, Kernel] = {}  # target -> its kernel, kept while no node it fused is realized
    while True:
        realized = {**out_bufs, **temps, **inputs}
        # a param returned as is still gets a kernel: it copies the input to the output buffer
        targets = [n for n in order if (n in temps or n in out_bufs) and n not in views]
        kernels = []
        for t in targets:
            if t not in lowered:  # named by graph position: a name that no later realization changes
                lowered[t] = lower_kernel(f"k{position[t]}", t, out_bufs.get(t) or temps[t], realized, nest)
            kernels.append(lowered[t])
        more: set[Node] = set()
        users: dict[Node, int] = {}
        for k in kernels:
            more |= k.problems | recompute_problems(k, nest) | recomputed_operands(k, nest and LANES)
            more |= gathered_operands(k)
            for t in set(k.reduces.values()):
                users[t] = users.get(t, 0) + 1
        more |= {t for t, n in users.items() if n > 1}
        more |= shared_chains(order, kernels, realized)
        more -= set(realized)
        if not more:
            break
        # ids in graph order, never set order (which follows memory addresses): the source must
        # be the same in every process, or the disk cache misses
        for t in sorted(more, key=position.__getitem__):
            temps[t] = Buffer(next(ids), t.dtype, t.numel, "temp", t)
        # only kernels that fused a newly realized node change (this keeps scheduling linear in
        # the graph's size: a 12-layer GPT's step took 36 s when every iteration lowered all)
        lowered = {t: k for t, k in lowered.items() if not (k.visited & more)}
    # a FUSED kernel lowered before its sources had buffers would be rendered as nothing
    assert all(lowered[t].fused is not None for t in targets if t.op is Op.FUSED), "FUSED sources unrealized"
    kernels = outputs_early(kernels)
    in_order = [k.out for k in kernels if k.out.kind == "temp"]
    sched = Schedule(inputs, [out_bufs[o] for o in graph], kernels, in_order)
    sched.slots = plan_memory(sched)
    debug.kernels(3, "after scheduling and lowering", kernels)
    return sched


CHAIN_READS = 4   # a value several kernels compute, reading at least this many tensors, gets a buffer


def shared_chains(order: list[Node], kernels: list[Kernel], realized: dict[Node, Buffer]) -> set[Node]:
    """Values that several kernels compute again, each time reading many tensors: a transformer's
    residual stream x_l = x_0 + a_1 + m_1 + ... + m_l (and its gradient going back) is an
    elementwise chain, fused whole into every kernel that reads it, so layer l's kernels read
    2 l + 1 tensors and the model reads O(L^2) of them. In graph order, a value used by two
    kernels or more whose expression reads CHAIN_READS tensors or more gets a buffer, and the
    values after it count it as one tensor. order: the graph's nodes, sources first."""
    uses: dict[Node, int] = {}
    for k in kernels:
        for t in k.visited:
            uses[t] = uses.get(t, 0) + 1
    reads: dict[Node, frozenset[Node]] = {}   # the tensors n's expression reads, up to CHAIN_READS of them
    largest: dict[Node, int] = {}             # the most elements of one of them
    chosen: set[Node] = set()
    for n in order:
        if n in realized or n.op is Op.PARAM:
            reads[n] = frozenset([n]) if n.numel > 1 else frozenset()
            largest[n] = n.numel
            continue
        got = frozenset().union(*(reads[s] for s in n.srcs)) if n.srcs else frozenset()
        reads[n] = got if len(got) <= CHAIN_READS else frozenset(list(got)[:CHAIN_READS])  # enough to know
        largest[n] = max((largest[s] for s in n.srcs), default=0)
        # never a broadcast bigger than what it reads (a contraction's product)
        if uses.get(n, 0) >= 2 and len(reads[n]) >= CHAIN_READS and 1 << 16 <= n.numel <= largest[n] \
                and n.op in ELEMENTWISE:
            chosen.add(n)
            reads[n], largest[n] = frozenset([n]), n.numel
    return chosen


def outputs_early(kernels: list[Kernel]) -> list[Kernel]:
    """The kernels in graph order, but each output's as soon as what it reads is computed. In a
    training step the weight gradients (and updates) then follow the backward pass layer by
    layer instead of all coming at the end: the temporaries they read die sooner, and a
    gradient's all-reduce (distributed.py) can start while the backward pass goes on."""
    made = {k.out.id for k in kernels}
    placed: set[int] = set()
    waiting = [k for k in kernels if k.out.kind == "output"]
    order: list[Kernel] = []

    def place_ready() -> None:
        nonlocal waiting
        while True:
            ready = [k for k in waiting if all(b.id in placed or b.id not in made for b in k.reads)]
            if not ready:
                return
            order.extend(ready)
            placed.update(k.out.id for k in ready)
            waiting = [k for k in waiting if k not in ready]

    place_ready()
    for k in kernels:
        if k.out.kind != "output":
            order.append(k)
            placed.add(k.out.id)
            if waiting:
                place_ready()
    return order + waiting


def donatable(sched: Schedule, pairs: list[tuple[Buffer, Buffer]]) -> list[bool]:
    """For each (output, input) pair, whether the output may be written over the input's memory
    (an optimizer's update in place, the old value dead after the run): every kernel that reads
    the input runs before the output's writer, or is the writer and reads the input only at the
    element it stores, each element read by the thread that then overwrites it (a map: never a
    reduction, tile or template over it). The kernels are indexed once for all the pairs."""
    members = [(i, m) for i, k in enumerate(sched.kernels) for m in k.members or [k]]   # a merged kernel's run at once
    writer: dict[int, tuple[int, Kernel]] = {}
    readers: dict[int, list[tuple[int, Kernel]]] = {}
    for i, m in members:
        writer.setdefault(m.out.id, (i, m))
        for bid in {b.id for b in m.reads}:
            readers.setdefault(bid, []).append((i, m))
    returned = {b.id for b in sched.outputs}   # (an input returned as it is keeps its value)

    def allowed(out: Buffer, inp: Buffer) -> bool:
        if out.id not in writer or inp.kind != "input" or out.nbytes != inp.nbytes or inp.id in returned:
            return False
        at, w = writer[out.id]
        if any(m is not w and i >= at for i, m in readers.get(inp.id, [])):
            return False
        if all(b.id != inp.id for b in w.reads):
            return True
        if w.contraction or w.fused or w.atomic or w.stages or w.members:
            return False
        index = w.store.srcs[1]
        return all(n.srcs[1] is index for n in toposort([w.store]) if n.op is Op.LOAD and n.srcs[0].arg == inp.id)
    return [allowed(out, inp) for out, inp in pairs]


def plan_memory(sched: Schedule) -> dict[int, int]:
    """Share memory between temporaries whose lifetimes do not overlap (best fit by size)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, k in enumerate(sched.kernels):
        for b in [k.out, *k.reads]:
            if b.kind == "temp":
                first.setdefault(b.id, i)
                last[b.id] = i
    slots: dict[int, int] = {}
    slot_size: dict[int, int] = {}
    free: list[int] = []
    by_id = {b.id: b for b in sched.temps}
    for i in range(len(sched.kernels)):
        for bid in [b for b in first if first[b] == i]:
            need = by_id[bid].nbytes
            fits = sorted((slot_size[s], s) for s in free if slot_size[s] >= need)
            if fits:
                slot = fits[0][1]
                free.remove(slot)
            else:
                slot = len(slot_size)
                slot_size[slot] = need
            slots[bid] = slot
        for bid in [b for b in last if last[b] == i]:
            free.append(slots[bid])
    return slots
