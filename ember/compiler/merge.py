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

Row chains (`merge_rows`): a layernorm forward was a mean kernel, a variance kernel, an rstd
kernel and the normalizing map, each a pass over the [B, T, C] f32 rows from memory (its mean
and rstd have readers of their own, the backward's, so they are realized). Consecutive kernels
with a block per row of the same rows (row reductions, and maps over those rows), each reading
what an earlier member wrote only in its own row, become one kernel (its name: r and the first
member's): a block runs the members one after another with a barrier between them, so a row is
read from memory once and again from the SM's cache. Up to ROW_WINDOW kernels (not counting
small ones) that cannot join are passed over and run after the chain (none a later member
reads). A member may write over what it reads for the last time (in_place, the memory plan's).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

from ..ir import Node, Op, toposort
from ..target import Target
from . import symbolic as sym
from .loops import MergedPlan, RowPart, RowPlan, ThreadPlan
from .lower import Buffer, Kernel, _unflatten, flat_index
from .rewrite import substitute
from .schedule import Schedule, reads_in_place

SMALL_THREADS = 4096           # a kernel of at most this many threads (16 blocks of 256) is small
SMALL_TEMP_BYTES = 4 << 20     # and it may wait for the end only if the temporaries it reads are small


def simple(k: Kernel) -> bool:
    """A thread per output (times its lanes): the kind a merged kernel can run block by block."""
    return isinstance(k.plan, ThreadPlan) and not k.atomic


def threads(k: Kernel) -> int:
    return math.prod(r.arg[1] for r in k.ranges if r not in k.lanes)


def movable(kernels: list[Kernel]) -> set[int]:
    """id() of the small kernels that may wait for the end: those whose outputs no large kernel
    reads (a small kernel whose output a large one reads stays where it is, and so do the small
    ones it reads)."""
    small = {id(k) for k in kernels if simple(k) and threads(k) <= SMALL_THREADS and
             all(b.kind != "temp" or b.nbytes <= SMALL_TEMP_BYTES for b in k.reads)}
    writer = {k.out.id: k for k in kernels}
    staying = [k for k in kernels if id(k) not in small]
    needed = [writer[b.id] for k in staying for b in k.reads if b.id in writer]
    while needed:
        k = needed.pop()
        if id(k) in small:
            small.discard(id(k))
            needed += [writer[b.id] for b in k.reads if b.id in writer]
    return small


def merge_small(sched: Schedule) -> None:
    kernels = sched.kernels
    # the small kernels that read only the program's inputs and that large ones wait for (a
    # bias converted for the epilogues that read it, schedule.epilogue_casts): all first, one launch
    small = movable(kernels)
    first = [k for k in kernels if id(k) not in small and simple(k) and threads(k) <= SMALL_THREADS
             and all(b.kind == "input" for b in k.reads)]
    if len(first) > 1:
        chosen = {id(k) for k in first}
        kernels = sched.kernels = [_merged(first)] + [k for k in kernels if id(k) not in chosen]
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


def _merged(members: list[Kernel], together: bool = False, rows: bool = False) -> Kernel:
    first = members[0]
    reads = {b.id: b for m in members for b in [m.out, *m.reads] if b.id != first.out.id}
    return Kernel(f"{'r' if rows else 'c' if together else 'b'}{first.name}", first.out, [], first.store,
                  list(reads.values()), plan=MergedPlan(tuple(members), together or rows, rows))


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


ROW_WINDOW = 3   # kernels a row chain may pass over (they then run after it)


def row_ranges(k: Kernel, n: int, maps: frozenset[int]) -> tuple[Node, ...] | None:
    """The ranges of k that a block per row owns, rows numbering n: a row reduction's block, or
    a map's (id() in maps) shortest prefix of ranges that counts n; None where k cannot run so."""
    if k.atomic or k.stages or k.fused or k.contraction or k.members:
        return None
    if isinstance(k.plan, RowPlan):
        return k.plan.block if math.prod(r.arg[1] for r in k.plan.block) == n and not k.plan.group else None
    if id(k) not in maps or any(x.op is Op.REDUCE for x in toposort([k.store])):
        return None
    count = 1
    for i, r in enumerate(k.ranges):
        count *= r.arg[1]
        if r in k.lanes or count > n:
            return None
        if count == n:
            return tuple(k.ranges[:i + 1])
    return None


@functools.lru_cache(maxsize=1 << 12)   # (a writer's store index, checked for each of its readers)
def _row_of(index: Node, width: int) -> Node:
    return sym.simplify([sym.idiv(index, width) if width > 1 else index])[0]


def _extents(rows: tuple[Node, ...]) -> tuple[int, ...]:
    return tuple(r.arg[1] for r in rows)


def _in_own_row(a: Kernel, rows_a: tuple[Node, ...], b: Kernel, rows_b: tuple[Node, ...]) -> bool:
    """Whether a writes its output a whole row a block (its block's), and b reads it only in
    the row its own block owns (b after a, in the same blocks)."""
    n = math.prod(_extents(rows_a))
    width = a.out.size // n
    if width * n != a.out.size or _row_of(a.store.srcs[1], width) is not flat_index(rows_a, _extents(rows_a)):
        return False
    return _reads_own_row(b, rows_b, a.out.id, rows_a, width)


def _reads_own_row(k: Kernel, rows_k: tuple[Node, ...], buf: int, rows: tuple[Node, ...], width: int) -> bool:
    """Whether k, a block per row of rows_k, reads buffer buf (rows of `width` elements) only in
    the row its block owns, as numbered by `rows` (another member's ranges for the same rows)."""
    row = flat_index(rows, _extents(rows))
    same = _extents(rows) == _extents(rows_k)
    named = rows if same else sym.simplify(list(_unflatten(row, _extents(rows_k))))
    rename = dict(zip(rows_k, named))
    loads = [x for x in toposort([k.store]) if x.op is Op.LOAD and x.srcs[0].arg == buf]
    reads = [substitute(list(x.srcs[1:]), rename) for x in loads]
    return all(_in_row(read[0], read[1] if len(read) > 1 else None, row, width) for read in reads)


def _in_row(index: Node, valid: Node | None, row: Node, width: int) -> bool:
    """Whether a read at index (where valid holds) is in row `row` of rows of `width` elements:
    its row is row, or index - row * width lies in [0, width) (a gathered column, such as a
    cross-entropy's target logit, that the load's guard keeps in range)."""
    if _row_of(index, width) is row:
        return True
    (terms, k), (row_terms, row_k) = sym.linear(index), sym.linear(row)
    for t, c in row_terms.items():
        terms[t] = terms.get(t, 0) - c * width
    k -= row_k * width
    spans = [(c * lo, c * hi) for t, c in terms.items() if c for lo, hi in [sym.limits(t, valid)]]
    return 0 <= k + sum(min(a) for a in spans) and k + sum(max(a) for a in spans) < width


def row_chain(kernels: list[Kernel], start: int, maps: frozenset[int]) \
        -> tuple[list[tuple[Kernel, tuple[Node, ...]]], int]:
    """The row chain that starts at kernels[start] ((each member with its rows, the index after
    the last member); fewer than two members, or none a row reduction: no chain). Its rows are
    the first row reduction's (within the window); maps: id() of the maps that may join, with
    rows of their own ranges (optimize plans them so)."""
    ahead = [k for k in kernels[start:start + ROW_WINDOW + 2]
             if isinstance(k.plan, RowPlan) and k.plan.block and not k.plan.group]
    if not ahead:
        return [], start + 1
    n = math.prod(_extents(ahead[0].plan.block))
    first = row_ranges(kernels[start], n, maps)
    if first is None:
        return [], start + 1
    members = [(kernels[start], first)]
    for i in range(start + 1, len(kernels)):
        k, rows = kernels[i], row_ranges(kernels[i], n, maps)
        chosen = {id(m) for m, _ in members}
        passed = [p for p in kernels[start:i] if id(p) not in chosen]
        if sum(threads(p) > SMALL_THREADS for p in passed) > ROW_WINDOW:   # (small ones move to the end)
            break
        passed_ids = {p.out.id for p in passed}
        if rows is not None and not any(b.id in passed_ids for b in k.reads) and \
                all(_in_own_row(m, mrows, k, rows) for m, mrows in members if any(b.id == m.out.id for b in k.reads)):
            members.append((k, rows))
    # a member that reads no other member's output and is read by none gains nothing (the next
    # chunk's input of a chunked loss had joined its rows, and the chunk then could not)
    written = {m.out.id for m, _ in members}
    members = [(m, rows) for m, rows in members
               if any(b.id in written and b.id != m.out.id for b in m.reads) or
               any(any(b.id == m.out.id for b in o.reads) for o, _ in members if o is not m)]
    if len(members) < 2 or not any(x.op is Op.REDUCE for m, _ in members for x in toposort([m.store])):
        return [], start + 1
    return members, kernels.index(members[-1][0]) + 1


def merge_rows(sched: Schedule, chains: list[list[Kernel]], gpu: Target) -> None:
    """Each row chain (optimize found it and planned its maps a block per row) becomes one kernel
    (MergedPlan, rows) where its first member was; the kernels it passed over run after it."""
    at = {id(k): i for i, k in enumerate(sched.kernels)}
    readers: dict[int, set[int]] = {}   # buffer id -> id() of the kernels that read it
    for k in sched.kernels:
        for b in k.reads:
            readers.setdefault(b.id, set()).add(id(k))
    results = {b.id for b in sched.outputs}
    first = {at[id(chain[0])]: chain for chain in chains}
    chosen = {id(m) for chain in chains for m in chain}
    out, i = [], 0
    while i < len(sched.kernels):
        chain = first.get(i)
        if chain is None:
            out.append(sched.kernels[i])
            i += 1
            continue
        end = at[id(chain[-1])] + 1
        members = {id(m) for m in chain}
        merged = _merged(chain, rows=True)
        cache = row_cache(chain, gpu)
        read_after = {m.out.id for m in chain if m.out.id in results or readers.get(m.out.id, set()) - members}
        private = private_rows(chain, read_after, sum(part.nbytes for part, _ in cache), gpu)
        merged.plan = dataclasses.replace(merged.plan, cache=cache, private=private)
        out.append(merged)
        out += [k for k in sched.kernels[i:end] if id(k) not in chosen]
        i = end
    sched.kernels = out


# A row chain's members each read the rows they need from memory, counting on the SM's cache for
# the second reading. A row too long for that (a GPT-2 cross-entropy's 50304 bf16 logits, 100 KB:
# read by the max, the sum of exponentials and the gradient, the second and third time from L2)
# is kept in shared memory by the first member that reads it, and the others read it there.
# Rows under ROW_CACHE_MIN bytes are left to the SM's L1 (a layernorm's; 32 KB f32 rows, two
# blocks an SM on Hopper, were not measured either way).
ROW_CACHE_MIN = 64 * 1024


def row_part(load: Node, k: Kernel) -> RowPart | None:
    """The part of each block's row that a load of member k (a block per row) reads, where its
    address is the row's start plus a dense run of the other ranges read in 16-byte vectors (its
    innermost range one of k's lanes, as the renderer's vectors take them); else None."""
    if load.op is not Op.LOAD or len(load.srcs) != 2:
        return None
    return _row_part(load.srcs[0].arg, load.srcs[1], load.dtype.itemsize, k)


def _row_part(buffer: int, index: Node, size: int, k: Kernel) -> RowPart | None:
    rows = k.plan.block
    terms, const = sym.linear(index)
    if not all(r.op is Op.RANGE for r in terms):
        return None
    at = tuple(terms.get(r, 0) for r in rows)
    run = 1
    for coef, r in sorted(((c, r) for r, c in terms.items() if r not in rows), key=lambda cr: cr[0]):
        if coef != run or (run == 1 and (r not in k.lanes or r.arg[1] * size % 16)):
            return None
        run *= r.arg[1]
    if run < 2 or any(c * size % 16 for c in (*at, const)):
        return None
    return RowPart(buffer, at, const, run, size, tuple(r.arg[1] for r in rows))


def row_cache(members: list[Kernel], gpu: Target) -> tuple[tuple[RowPart, int], ...]:
    """The rows two or more members read (row_part), at least ROW_CACHE_MIN bytes each,
    and where each sits in the block's dynamic shared memory: as many as fit in half of an SM's,
    less the 1 KB the GPU keeps a block and the members' own (reductions: 256 bytes), so that
    two blocks still do (1024-thread blocks: two an SM on Hopper; on the course's sm_86, 100 KB
    an SM, a cross-entropy row does not fit)."""
    if any(not isinstance(m.plan, RowPlan) or m.plan.group for m in members):
        return ()
    written = {m.out.id for m in members}
    readers: dict[RowPart, set[int]] = {}
    for i, m in enumerate(members):
        for n in toposort([m.store]):
            part = row_part(n, m)
            if part is not None and part.buffer not in written:
                readers.setdefault(part, set()).add(i)
    cache, at = [], 0
    for part in sorted((p for p, who in readers.items() if len(who) > 1), key=lambda p: -p.nbytes):
        if part.nbytes >= ROW_CACHE_MIN and at + part.nbytes <= _row_budget(gpu):
            cache.append((part, at))
            at += part.nbytes
    return tuple(cache)


def _row_budget(gpu: Target) -> int:
    return gpu.smem_sm // 2 - 2048


def private_rows(members: list[Kernel], read_after: set[int], at: int, gpu: Target) \
        -> tuple[tuple[RowPart, int], ...]:
    """The rows a member writes that no kernel after the chain reads (read_after: the members'
    outputs that other kernels read, or that the program returns), each member that reads them reading its own
    block's row as the writer wrote it (the same RowPart), and where each sits in the block's
    dynamic shared memory, from byte `at`: they never go to memory. A GPT-2 layernorm
    backward's chain wrote three f32 rows that only its later members read (k721, k722, k724:
    300 MB a layer at B = 32, written to memory and read back from L2)."""
    if any(not isinstance(m.plan, RowPlan) or m.plan.group for m in members):
        return ()
    private = []
    for i, m in enumerate(members):
        buf = m.out.id
        part = _row_part(buf, m.store.srcs[1], m.out.dtype.itemsize, m)
        if part is None or buf in read_after or at + part.nbytes > _row_budget(gpu):
            continue
        reads = [(n, r) for r in members[i + 1:] for n in _loads(r) if n.srcs[0].arg == buf]
        if reads and all(row_part(n, r) == part for n, r in reads):
            private.append((part, at))
            at += part.nbytes
    return tuple(private)


def _loads(k: Kernel) -> list[Node]:
    """Every load of k's, its stages' among them."""
    return [n for n in toposort([k.store, *(st.load for st in k.stages)]) if n.op is Op.LOAD]


def in_place(k: Kernel, out: int, buf: Buffer) -> bool:
    """Whether kernel k may write its output `out` over buf, which it reads for the last time
    (plan_memory): a kernel that reads buf only where it stores (schedule.reads_in_place); in a
    row chain, the member that writes `out` so, when no later member reads buf and earlier ones
    read it only in their own rows (they are done with a row when the block reaches the writer;
    other blocks have other rows): a cross-entropy chunk's gradient over its logits."""
    if not isinstance(k.plan, MergedPlan):
        return out == k.out.id and reads_in_place(k, buf)
    if not k.plan.rows:
        return False
    members = list(k.members)
    at = next(i for i, m in enumerate(members) if m.out.id == out)
    writer = members[at]
    if not reads_in_place(writer, buf) or any(b.id == buf.id for m in members[at + 1:] for b in m.reads):
        return False
    rows = writer.plan.block
    width = writer.out.size // math.prod(_extents(rows))
    return all(_reads_own_row(m, m.plan.block, buf.id, rows, width) for m in members[:at])
