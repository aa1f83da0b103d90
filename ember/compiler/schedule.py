"""Scheduling: which tensor nodes become buffers, and the kernels that compute them.

Start from the least that must live in memory (params, outputs) and fuse everything else into
the kernels that use it: elementwise and movement ops are inlined at the consumer's index, and
a reduction is computed inside its consumer's loops (softmax's max and sum become loops inside
the row loop). A reduction is given a buffer of its own when fusing it would compute it more
than once per value (an outer loop it does not depend on, an enclosing reduction it depends
on) or when several kernels need it. Iterate until no kernel asks for more buffers.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from .. import debug
from ..ir import ELEMENTWISE, MOVEMENT, Node, Op, toposort
from ..target import Target
from . import autodiff, simplify
from .contraction import gathered_operands
from .loops import MergedPlan
from .lower import Buffer, Kernel, lower_kernel, product_sum, recompute_problems, recomputed_operands

LANES = 64  # with nesting on, values recomputed along an output range this short are left to lanes


@dataclass
class Schedule:
    inputs: dict[Node, Buffer]           # param node -> its buffer
    outputs: list[Buffer]                # one per returned node, in return order
    kernels: list[Kernel]
    temps: list[Buffer] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)   # temp buffer id -> its offset in the arena (plan_memory)
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
    consumers: dict[Node, list[Node]] = {}
    for n in order:
        for src in dict.fromkeys(n.srcs):
            consumers.setdefault(src, []).append(n)
    lowered: dict[Node, Kernel] = {}  # target -> its kernel, kept while no node it fused is realized
    asks: dict[Node, set[Node]] = {}  # target -> what its kernel wants realized (a kernel's own facts)
    while True:
        realized = {**out_bufs, **temps, **inputs}
        # a param returned as is still gets a kernel: it copies the input to the output buffer
        targets = [n for n in order if (n in temps or n in out_bufs) and n not in views]
        kernels = []
        for t in targets:
            if t not in lowered:  # named by graph position: a name that no later realization changes
                k = lowered[t] = lower_kernel(f"k{position[t]}", t, out_bufs.get(t) or temps[t], realized, nest)
                asks[t] = k.problems | recompute_problems(k, nest) | recomputed_operands(k, nest and LANES) \
                    | gathered_operands(k) | epilogue_casts(t, k, realized)
            kernels.append(lowered[t])
        more: set[Node] = set().union(*(asks[t] for t in targets))
        users: dict[Node, int] = {}
        for k in kernels:
            for t in set(k.reduces.values()):
                users[t] = users.get(t, 0) + 1
        more |= {t for t, n in users.items() if n > 1}
        more |= shared_chains(order, kernels, realized)
        more |= {t for k in kernels for t in summed_products(k)}
        more = {epilogue_end(t, consumers, realized) if product_sum(t) else t for t in more} - set(realized)
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


def epilogue_end(t: Node, consumers: dict[Node, list[Node]], realized: dict[Node, Buffer]) -> Node:
    """Where a product (a contraction) that other kernels read is stored: past the elementwise ops
    that only it feeds and whose other operands are small (a bias broadcast, a constant), none
    widening, where several kernels read the result. Its own kernel then computes them once, in
    its epilogue, where each reader computed them again (GPT-2's fc product: both GELU kernels
    added the bias, converting it per element)."""
    n = end = t
    while n not in realized and len(consumers.get(n, ())) == 1:
        c = consumers[n][0]
        if c.op is Op.RESHAPE:   # passed through, but never stored (its kernel would be laid out anew)
            n = c
            continue
        if c.op not in ELEMENTWISE or c.shape != n.shape or c.dtype.itemsize > n.dtype.itemsize or \
                not all(s is n or _small(s, n.numel) for s in c.srcs):
            break
        n = end = c
    # only a value several kernels read (else its one reader adds the bias, as it adds the rest:
    # a residual sum past GPT-2's projections, whose chain then needed a buffer more)
    read = end
    while len(consumers.get(read, ())) == 1 and consumers[read][0].op in (Op.CAST, Op.RESHAPE):
        read = consumers[read][0]   # (autocast's GELU reads the bf16 sum widened to f32)
    return end if len(consumers.get(read, ())) > 1 else t


def epilogue_casts(t: Node, k: Kernel, realized: dict[Node, Buffer]) -> set[Node]:
    """The narrowing casts of small tensors that a contraction's epilogue broadcasts (a bias
    converted to bf16 under autocast): computed once in a buffer of their own, not once an
    element of every tile. GPT-2's fc product converted the f32 bias per element, its NaN test
    included: its epilogue was 820 SASS instructions a thread a tile, 203 reading the bf16 bias
    (sm_90a; the next tile's products wait for it)."""
    products = {p for p in k.reduces.values() if product_sum(p)}
    if not products:
        return set()
    above: set[Node] = set()   # the epilogue: what computes on the product
    for n in toposort([t]):
        if n in products or ((n is t or n not in realized) and any(s in above for s in n.srcs)):
            above.add(n)
    found = set()
    for n in above - products:
        for s in n.srcs:
            while s.op in MOVEMENT and s not in realized:
                s = s.srcs[0]
            if s.op is Op.CAST and s.dtype.is_float and s.dtype.itemsize < s.srcs[0].dtype.itemsize and \
                    s not in realized and s not in above and _small(s, t.numel) and \
                    (s.srcs[0] in realized or s.srcs[0].op is Op.PARAM):
                found.add(s)
    return found


def _small(n: Node, numel: int) -> bool:
    """Whether n, below its movements and casts, holds at most 1/16 of numel elements."""
    while n.op in MOVEMENT or n.op is Op.CAST:
        n = n.srcs[0]
    return n.numel * 16 <= numel


def summed_products(k: Kernel) -> set[Node]:
    """The sums of outer products that a kernel adds together (a weight that several matmuls
    read, as a language model's head over chunks of rows: its gradient adds theirs,
    simplify._sum_of_products): each in a buffer of its own is a contraction for the
    tensor-core paths; together they are one plain reduction."""
    sums = {t for t in k.reduces.values() if product_sum(t, widened=False)}
    added = {s for n in k.visited if n.op is Op.ADD for s in n.srcs if s in sums}
    return added if len(added) > 1 else set()


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
        # a matmul counts as one tensor: its own kernel writes it (before it had a buffer, the
        # cast of a bf16 matmul's result to f32 looked like a chain, and was copied for its readers)
        if n in realized or n.op is Op.PARAM or product_sum(n):
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


EAGER_BYTES = 1 << 26   # temporaries this large are worth running a kernel early to free (the last two rules)


def outputs_early(kernels: list[Kernel]) -> list[Kernel]:
    """The kernels in graph order, except that a kernel runs as soon as what it reads is computed
    when that shrinks the memory in use: an output's kernel (in a training step the weight
    updates then follow the backward pass layer by layer, and a gradient's all-reduce,
    distributed.py, can start while it goes on); a kernel that only such kernels read and that
    writes at most half the elements of what it reads (a weight gradient, its split-K parts,
    bias sums: GPT-2's last layer's activations were held to the end of the step for them); a
    kernel that frees at least what it writes (the last reader of its inputs: a chunk's logits
    under their gradient); and a shrinking kernel that leaves one reader to what it reads (a
    chunk's input gradient, then its weight gradient frees the chunk's logit gradient)."""
    made = {k.out.id for k in kernels}
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(kernels):
        for b in {b.id for b in k.reads}:
            readers.setdefault(b, []).append(i)
    early: set[int] = set()   # kernels run as soon as they can be, whatever they free
    for i in reversed(range(len(kernels))):   # readers come after their writers
        k, users = kernels[i], readers.get(kernels[i].out.id, [])
        if k.out.kind == "output" or (users and all(u in early for u in users)
                                      and 2 * k.out.size <= max((b.size for b in k.reads), default=0)):
            early.add(i)
    pending = {bid: len(users) for bid, users in readers.items()}   # readers not yet placed
    writer = {k.out.id: i for i, k in enumerate(kernels)}
    computed: set[int] = set()
    placed: set[int] = set()
    order: list[Kernel] = []

    def missing(k: Kernel) -> list[int]:
        return [writer[b.id] for b in k.reads if b.id in made and b.id not in computed]

    def eager(i: int) -> list[int] | None:
        """None, or what to run first: for a kernel that frees memory, the small kernels it
        waits for that can run now (the mask of a chunk's targets that its logits' gradient reads)."""
        k = kernels[i]
        wait = missing(k)
        if i in early:
            return None if wait else []
        temps = [b for b in {b.id: b for b in k.reads}.values() if b.kind == "temp" and b.nbytes >= EAGER_BYTES]
        frees = sum(b.nbytes for b in temps if pending[b.id] == 1)
        if not (k.out.kind == "temp" and temps and k.out.nbytes <= frees) and not (
                any(pending[b.id] == 2 for b in temps) and 2 * k.out.size <= max(b.size for b in temps)):
            return None
        if any(missing(kernels[j]) or 16 * kernels[j].out.nbytes > max(frees, EAGER_BYTES) for j in wait):
            return None
        return wait

    def run(j: int) -> set[int]:
        """Run kernel j; the kernels that might become eager then."""
        k = kernels[j]
        order.append(k)
        placed.add(j)
        computed.add(k.out.id)
        near = set(readers.get(k.out.id, []))
        for bid in {b.id for b in k.reads}:
            pending[bid] -= 1
            near.update(readers[bid])
        return near

    def place(i: int) -> None:
        """Run kernel i, then every kernel that has become eager, in graph order."""
        todo = [i]
        while todo:
            j = heapq.heappop(todo)
            first = [] if j == i else eager(j)   # (i is ready: its writers came before it)
            if j in placed or first is None:   # (placed meanwhile, or no longer worth it)
                continue
            near = set()
            for w in first:
                near |= run(w)
            near |= run(j)
            for u in near - placed:
                if eager(u) is not None:
                    heapq.heappush(todo, u)

    for i in [i for i in early if eager(i) is not None]:
        place(i)
    for i in range(len(kernels)):
        if i not in placed and i not in early:
            place(i)
    return order + [k for i, k in enumerate(kernels) if i not in placed]


def reads_in_place(k: Kernel, buf: Buffer) -> bool:
    """Whether k may write its output over buf, which it reads: it reads buf only at the element
    it stores, each element read by the thread that then overwrites it (a map: never a
    reduction, tile or template over it), and its elements are the output's size (element i at
    the same bytes in both)."""
    if k.contraction or k.fused or k.atomic or k.stages or k.members or buf.dtype.itemsize != k.out.dtype.itemsize:
        return False
    index = k.store.srcs[1]
    return all(n.srcs[1] is index for n in toposort([k.store]) if n.op is Op.LOAD and n.srcs[0].arg == buf.id)


def donatable(sched: Schedule, pairs: list[tuple[Buffer, Buffer]]) -> list[bool]:
    """For each (output, input) pair, whether the output may be written over the input's memory
    (an optimizer's update in place, the old value dead after the run): every kernel that reads
    the input runs before the output's writer, or is the writer and reads it in place
    (reads_in_place). The kernels are indexed once for all the pairs."""
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
        return all(b.id != inp.id for b in w.reads) or reads_in_place(w, inp)
    return [allowed(out, inp) for out, inp in pairs]


ALIGN = 256   # every temporary starts at a multiple of this in the arena (cuMemAlloc's alignment, which
# the CUDA renderer assumes for its vector accesses), and a kernel's vector tail never reaches the next


def _aligned(nbytes: int) -> int:
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)


def lifetimes(sched: Schedule) -> tuple[dict[int, int], dict[int, int]]:
    """Each temporary's first and last kernel (by place in sched.kernels)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, k in enumerate(sched.kernels):
        for b in [k.out, *k.reads]:
            if b.kind == "temp":
                first.setdefault(b.id, i)
                last[b.id] = i
    return first, last


def plan_memory(sched: Schedule, in_place: Callable[[Kernel, int, Buffer], bool] | None = None) -> dict[int, int]:
    """Each temporary's byte offset in one arena, temporaries whose lifetimes do not overlap
    sharing memory: kernel by kernel, the outputs take the best-fitting free range (the arena
    grows when none fits), and the temporaries read for the last time are freed after it.
    in_place(kernel, output id, buffer): whether the kernel may write that output of its over
    a temporary it reads for the last time (reads_in_place: a map's input, such as the logits
    under their gradient; merge.in_place for merged kernels)."""
    first, last = lifetimes(sched)
    offsets: dict[int, int] = {}
    size = memory_bytes(sched)
    gaps: list[list[int]] = []   # free [offset, bytes] ranges below the top, by offset
    top = 0

    def free(at: int, n: int) -> None:
        gaps.append([at, n])
        gaps.sort()
        merged = [gaps[0]]
        for g in gaps[1:]:
            if merged[-1][0] + merged[-1][1] == g[0]:
                merged[-1][1] += g[1]
            else:
                merged.append(g)
        gaps[:] = merged

    def take(n: int) -> int:
        nonlocal top
        fits = [g for g in gaps if g[1] >= n]
        if fits:
            g = min(fits, key=lambda g: g[1])
            at = g[0]
            g[0], g[1] = g[0] + n, g[1] - n
            if not g[1]:
                gaps.remove(g)
            return at
        if gaps and gaps[-1][0] + gaps[-1][1] == top:   # the free range at the top grows
            at = gaps.pop()[0]
        else:
            at = top
        top = at + n
        return at

    starts: dict[int, list[int]] = {}
    for bid, i in first.items():
        starts.setdefault(i, []).append(bid)
    for i, k in enumerate(sched.kernels):
        dying = [b for b in dict.fromkeys(b.id for b in k.reads) if last.get(b) == i and b in offsets and b != k.out.id]
        # a merged kernel's outputs that die in it last: at the top, their memory is the top's
        # again (taken first, they would leave holes under longer-lived outputs)
        for bid in sorted(starts.get(i, []), key=lambda b: last.get(b) == i):
            # (a row kept in shared memory, size 0, takes no donor: the donor's bytes would be
            # freed while the chain's other blocks still read them)
            donor = next((b for b in dying if in_place and size[bid] and size[b] >= size[bid] and
                          in_place(k, bid, next(r for r in k.reads if r.id == b))), None)
            if donor is None:
                offsets[bid] = take(size[bid])
                continue
            dying.remove(donor)
            offsets[bid] = offsets[donor]
            if size[donor] > size[bid]:
                free(offsets[donor] + size[bid], size[donor] - size[bid])
        if last.get(k.out.id) == i and all(b.id != k.out.id for b in k.reads):
            dying.append(k.out.id)   # written, never read
        # a merged kernel's member outputs that only later members read (its reads, not yet
        # placed when `dying` was listed): they were never freed, a hole of 48 MiB a GPT-2 layer
        dying += [bid for bid in starts.get(i, []) if last.get(bid) == i and bid != k.out.id and bid not in dying]
        for bid in dying:
            free(offsets[bid], size[bid])
    return offsets


def private_buffers(k: Kernel) -> set[int]:
    """The rows a row chain keeps in shared memory alone (merge.private_rows): never in memory."""
    return {part.buffer for part, _ in k.plan.private} if isinstance(k.plan, MergedPlan) else set()


def kernel_bytes(k: Kernel) -> int:
    """The bytes of the buffers k reads or writes in memory: its arguments', less its private rows."""
    private = private_buffers(k)
    return sum(b.nbytes for b in k.args if b.id not in private)


def memory_bytes(sched: Schedule) -> dict[int, int]:
    """Each temporary's bytes in the arena: none for the rows a row chain keeps in shared memory
    alone (merge.private_rows), which its kernel never reads or writes in memory."""
    private = set().union(*(private_buffers(k) for k in sched.kernels))
    return {b.id: 0 if b.id in private else _aligned(b.nbytes) for b in sched.temps}


def arena_bytes(sched: Schedule) -> int:
    """The bytes of the one block that holds all the temporaries (plan_memory's offsets)."""
    size = memory_bytes(sched)
    return max((sched.slots[b.id] + size[b.id] for b in sched.temps), default=0)


def footprint(sched: Schedule, roles: dict[Node, str] | None = None, donated: set[int] = frozenset()) -> dict[str, int]:
    """The bytes a run of sched holds at once, by what holds them, as the runtimes allocate: every
    input (named by roles, param node -> what it is; else "inputs"), every output not written
    over an input (donated: those outputs' buffer ids), and the temporaries' arena, which is
    allocated whole. The arena is told by the temporaries alive at the kernel where the most
    are: the gradients (what outputs of their size are computed from), the activations (what a
    scalar output, the loss, is computed from), the other temporaries, and the arena's bytes
    that hold none of them then ("arena gaps"). The parts add up to the peak."""
    parts: dict[str, int] = {}

    def add(what: str, n: int) -> None:
        if n:
            parts[what] = parts.get(what, 0) + n
    for node, b in sched.inputs.items():
        add((roles or {}).get(node, "inputs"), b.nbytes)
    for b in {b.id: b for b in sched.outputs if b.id not in donated}.values():
        add("outputs", b.nbytes)
    writer = {k.out.id: k for k in sched.kernels for k in k.members or [k]}
    kind: dict[int, str] = {}
    for k in writer.values():
        if k.out.kind == "output":
            for b in k.reads:
                if b.kind == "temp" and b.size == k.out.size:
                    kind[b.id] = "gradients"
    forward, todo = set(), [b.id for b in sched.outputs if b.size == 1]
    while todo:
        bid = todo.pop()
        if bid in writer and bid not in forward:
            forward.add(bid)
            todo += [b.id for b in writer[bid].reads]
    first, last = lifetimes(sched)
    alive: list[list[int]] = [[] for _ in sched.kernels]
    for bid in first:
        for i in range(first[bid], last[bid] + 1):
            alive[i].append(bid)

    size = memory_bytes(sched)

    def held(ids: list[int]) -> dict[int, int]:   # buffer id -> its bytes (one written over another: once)
        out, seen = {}, set()
        for bid in sorted(ids, key=lambda b: -size[b]):
            if sched.slots[bid] not in seen and size[bid]:
                seen.add(sched.slots[bid])
                out[bid] = size[bid]
        return out
    peak = max(alive, key=lambda ids: sum(held(ids).values()), default=[])
    live = held(peak)
    for bid, n in live.items():
        add(kind.get(bid) or ("activations" if bid in forward else "temporaries"), n)
    add("arena gaps", arena_bytes(sched) - sum(live.values()))
    return parts
