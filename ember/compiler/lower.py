"""Lowering: a realized tensor node becomes a kernel, a scalar expression over loop ranges.

To compute tensor node t at index vector I (one index expression per dim), push I back
through t's sources: movement ops become index arithmetic and validity conditions (no copies),
elementwise ops apply to their sources at the same index, a reduction opens new ranges for its
axes, and a realized source (a param or another kernel's output) becomes a LOAD from its buffer.

Kernel-level nodes (all scalars, shape ()):
  BUFFER arg=buffer id            the pointer to a buffer
  RANGE  arg=(name, size)         a loop variable (see symbolic.py)
  LOAD   srcs=(buffer, index[, valid])   0 where valid is false (the address is not touched)
  REDUCE srcs=(body,) arg=(Op.SUM | Op.RMAX, ranges)   the body combined over the ranges
  STORE  srcs=(buffer, index, value)
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .. import dtype as dt
from ..dtype import DType
from ..ir import Node, Op, toposort, widening
from . import symbolic as sym
from .loops import MergedPlan, Stage, TilePlan
from .rewrite import substitute


@dataclass(eq=False)
class Buffer:
    id: int
    dtype: DType
    size: int             # elements
    kind: str             # "input", "output" or "temp"
    node: Node            # the tensor node whose value it holds

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def ref(self) -> Node:
        return Node(Op.BUFFER, self.dtype, (), self.id)


@dataclass(eq=False)
class Kernel:
    name: str
    out: Buffer
    ranges: list[Node]            # output loops, outermost first (dims of size 1 have none)
    store: Node                   # STORE(out, index, value)
    reads: list[Buffer] = field(default_factory=list)
    reduces: dict[Node, Node] = field(default_factory=dict)   # REDUCE scalar -> its tensor node
    lanes: frozenset[Node] = frozenset()   # ranges rendered as innermost register tiles (optimize)
    problems: set[Node] = field(default_factory=set)       # reductions lowering found need a buffer
    contraction: object | None = None  # its contraction.Contraction (a GpuPlan or PackedPlan tiles it)
    origin: dict[Node, Node] = field(default_factory=dict)  # kernel node -> tensor node (lowering)
    atomic: bool = False               # GPU: the store adds into a zeroed output (a scatter, optimize.py)
    visited: frozenset = frozenset()   # the tensor nodes its lowering went through (schedule.py's cache)
    fused: "tuple[Node, list[Buffer], list[View | None]] | None" = None   # a FUSED node, its sources' buffers
                                        # and how q, k, v lie in theirs (None: in order) (attention.py)
    # its plan family's value, set by optimize (merge.py: MergedPlan): loops.py's LoopPlan, ThreadPlan,
    # RowPlan, TilePlan, MergedPlan; contraction.GpuPlan, PackedPlan; attention.FlashPlan
    plan: object | None = None

    @property
    def members(self) -> "tuple[Kernel, ...] | None":
        """A merged launch's kernels (MergedPlan), else None."""
        return self.plan.members if isinstance(self.plan, MergedPlan) else None

    @property
    def value(self) -> Node:
        return self.store.srcs[2]

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The loads its tile plan copies through shared memory (TilePlan), else none."""
        return self.plan.stages if isinstance(self.plan, TilePlan) else ()

    @property
    def kind(self) -> str:
        """"contraction", "attention" (a flash kernel), "merged", "reduce" or "map", for reports."""
        if self.contraction or self.fused or self.members:
            return "contraction" if self.contraction else "attention" if self.fused else "merged"
        # the kernel graph's, not `reduces` (optimize drops that bookkeeping when it splits ranges)
        return "reduce" if any(n.op is Op.REDUCE for n in toposort([self.store])) else "map"

    @property
    def args(self) -> list[Buffer]:
        """The buffers the kernel's function takes, in order: its output, then what it reads."""
        return [self.out] + [b for b in self.reads if b.id != self.out.id]


def flat_index(idx: tuple[Node, ...], shape: tuple[int, ...]) -> Node:
    """Row-major linear index of idx in shape."""
    terms: dict[Node, int] = {}
    k = 0
    stride = 1
    for i, n in reversed(list(zip(idx, shape))):
        t, c = sym.linear(i)
        for term, coef in t.items():
            terms[term] = terms.get(term, 0) + coef * stride
        k += c * stride
        stride *= n
    return sym.build({t: c for t, c in terms.items() if c}, k, sym.index_type(math.prod(shape)))


def _unflatten(flat: Node, shape: tuple[int, ...]) -> tuple[Node, ...]:
    out = []
    stride = math.prod(shape)
    for d, n in enumerate(shape):
        stride //= n
        e = flat if stride == 1 else sym.idiv(flat, stride)
        out.append(e if d == 0 else sym.mod(e, n))
    return tuple(out)


Request = tuple[Node, tuple[Node, ...], "Node | None"]   # (tensor node, index vector, validity)


class Lowerer:
    """Lowers one kernel. `realized` maps tensor nodes that live in buffers to their buffers."""

    def __init__(self, realized: dict[Node, Buffer], root: Node, prefix: str, nest: int = 0):
        self.realized, self.root, self.prefix = realized, root, prefix
        self.nest = nest  # a reduction of at most this many elements over plain inputs may run inside another
        self.memo: dict[Request, Node] = {}
        self.children_of: dict[Request, list[Request]] = {}
        self.reduce_of: dict[Request, tuple[Node, ...]] = {}
        self.pad_cond: dict[Request, Node | None] = {}
        self.reduces: dict[Node, Node] = {}
        self.reads: list[Buffer] = []
        self.counter = 0
        self.reduce_ranges: set[Node] = set()   # every range a reduction of this kernel opened
        self.problems: set[Node] = set()        # reductions met inside a reduction whose loop they use
        self.origin: dict[Node, Node] = {}       # kernel node -> the tensor node it computes (the first)

    def new_range(self, size: int) -> Node:
        self.counter += 1
        r = sym.rng(f"{self.prefix}r{self.counter}", size)
        self.reduce_ranges.add(r)
        return r

    def _inside_its_reduction(self, idx: tuple[Node, ...]) -> bool:
        """Whether idx uses the loop of an enclosing reduction (a reduction there would be
        recomputed on every step of that loop, and its subgraph lowered again each time)."""
        return any(n in self.reduce_ranges for n in toposort(list(idx)) if n.op is Op.RANGE)

    def _may_nest(self, t: Node) -> bool:
        """A short reduction of values read straight from buffers (attention's q.k over a head's
        64 dims) may be recomputed inside the loop of an enclosing one: that is how scores are
        used once each without being stored (O(S*D) memory attention on the CPU)."""
        if math.prod(t.srcs[0].shape[a] for a in t.arg) > self.nest:
            return False
        stack, seen = [t.srcs[0]], set()
        while stack:
            x = stack.pop()
            if x in seen or self._is_load(x, False) or x.op in (Op.CONST, Op.IOTA):
                continue
            seen.add(x)
            if x.op in (Op.SUM, Op.RMAX) or len(seen) > 64:
                return False
            stack.extend(x.srcs)
        return True

    def value(self, t: Node, idx: tuple[Node, ...], valid: Node | None) -> Node:
        """The scalar expression of t at idx (iterative: deep graphs are fine)."""
        top: Request = (t, idx, valid)
        stack = [top]
        while stack:
            req = stack[-1]
            if req in self.memo:
                stack.pop()
                continue
            kids = self.children(req, req is top)
            missing = [k for k in kids if k not in self.memo]
            if missing:
                stack.extend(missing)
                continue
            self.memo[req] = node = self.combine(req, [self.memo[k] for k in kids], req is top)
            self.origin.setdefault(node, req[0])
            stack.pop()
        return self.memo[top]

    def _is_load(self, t: Node, is_top: bool) -> bool:
        # params are always read from their buffer (a returned param is a copy kernel)
        return t.op is Op.PARAM or (t in self.realized and not (is_top and t is self.root))

    def children(self, req: Request, is_top: bool) -> list[Request]:
        got = self.children_of.get(req)
        if got is not None:
            return got
        t, idx, valid = req
        op = t.op
        kids: list[Request]
        if self._is_load(t, is_top) or op in (Op.CONST, Op.IOTA, Op.PARAM):
            kids = []
        elif op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.FLIP, Op.PAD):
            src_idx, cond = self.move(t, idx)
            self.pad_cond[req] = cond
            kids = [(t.srcs[0], src_idx, sym.and_(valid, cond))]
        elif op in (Op.SUM, Op.RMAX) and self._inside_its_reduction(idx) and not self._may_nest(t):
            self.problems.add(t)  # stop here: the scheduler gives it a buffer and lowers again
            kids = []
        elif op in (Op.SUM, Op.RMAX):
            ranges = tuple(self.new_range(t.srcs[0].shape[a]) for a in t.arg)
            self.reduce_of[req] = ranges
            it = iter(ranges)
            src_idx = tuple(next(it) if d in t.arg else i for d, i in enumerate(idx))
            kids = [(t.srcs[0], src_idx, valid)]
        elif op is Op.GRAD:
            raise NotImplementedError("grad must be rewritten into ordinary ops before lowering")
        else:  # elementwise
            kids = [(s, idx, valid) for s in t.srcs]
        self.children_of[req] = kids
        return kids

    def move(self, t: Node, idx: tuple[Node, ...]) -> tuple[tuple[Node, ...], Node | None]:
        """The source index of a movement op, and the condition under which it is in bounds."""
        src = t.srcs[0]
        op, cond = t.op, None
        if op is Op.RESHAPE:
            out = _unflatten(flat_index(idx, t.shape), src.shape)
        elif op is Op.PERMUTE:
            out = tuple(idx[t.arg.index(d)] for d in range(len(idx)))
        elif op is Op.EXPAND:
            out = tuple(sym.const(0) if s == 1 else i for i, s in zip(idx, src.shape))
        elif op is Op.SHRINK:
            out = tuple(sym.add(i, sym.const(s)) for i, s in zip(idx, t.arg[0]))
        elif op is Op.FLIP:
            out = tuple(sym.add(sym.mul(i, sym.const(-1)), sym.const(n - 1)) if d in t.arg else i
                        for d, (i, n) in enumerate(zip(idx, t.shape)))
        else:  # PAD
            before, _, _ = t.arg
            out = tuple(sym.add(i, sym.const(-b)) for i, b in zip(idx, before))
            for i, b, n in zip(idx, before, src.shape):
                cond = sym.and_(cond, sym.and_(sym.lt(sym.const(b - 1), i), sym.lt(i, sym.const(b + n))))
        exprs = sym.simplify([*out] + ([cond] if cond is not None else []))
        if cond is not None:
            cond = exprs.pop()
            cond = None if cond.op is Op.CONST and cond.arg else cond
        return tuple(exprs), cond

    def combine(self, req: Request, kids: list[Node], is_top: bool) -> Node:
        t, idx, valid = req
        op = t.op
        if self._is_load(t, is_top):
            buf = self.realized[t]
            if buf not in self.reads:
                self.reads.append(buf)
            (index,) = sym.simplify([flat_index(idx, t.shape)])
            index = sym.given(index, valid)
            srcs = (buf.ref(), index) if valid is None else (buf.ref(), index, valid)
            return Node(Op.LOAD, t.dtype, srcs)
        if op is Op.CONST:
            return Node(Op.CONST, t.dtype, (), t.arg)
        if op is Op.IOTA:
            return Node(Op.CAST, t.dtype, (idx[t.arg],)) if t.dtype is not sym.INDEX else idx[t.arg]
        if op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SHRINK, Op.FLIP):
            return kids[0]
        if op is Op.PAD:
            cond = self.pad_cond[req]
            if cond is None:  # every index here is inside the source
                return kids[0]
            return Node(Op.WHERE, t.dtype, (cond, kids[0], Node(Op.CONST, t.dtype, (), t.arg[2])))
        if op in (Op.SUM, Op.RMAX) and t in self.problems and req not in self.reduce_of:
            return Node(Op.CONST, t.dtype, (), 0)  # a placeholder: this kernel is lowered again
        if op in (Op.SUM, Op.RMAX):
            red = Node(Op.REDUCE, t.dtype, (kids[0],), (op, self.reduce_of[req]))
            self.reduces[red] = t
            return red
        return Node(op, t.dtype, tuple(kids))


def index_of(e: Node, size: int) -> tuple[Node, Node]:
    """(0 <= e < size, e as an index): a selected position read from data, and when it is in range."""
    below = sym.lt(e, sym.const(size, e.dtype))
    valid = sym.and_(sym.lt(sym.const(-1, e.dtype), e), below) if e.dtype.is_signed else below
    return valid, e if e.dtype is sym.INDEX else Node(Op.CAST, sym.INDEX, (e,))


def selector(w: Node, v: Node, deps: dict[Node, frozenset[Node]]) -> Node | None:
    """e when w is where(v == e, x, constant) with e an integer free of v."""
    if w.op is not Op.WHERE or w.srcs[0].op is not Op.CMPEQ or w.srcs[2].op is not Op.CONST:
        return None
    a, b = (s.srcs[0] if s.op is Op.CAST and s.srcs[0] is v else s for s in w.srcs[0].srcs)
    e = b if a is v else a if b is v else None
    return e if e is not None and e.dtype.is_int and v not in deps[e] else None


def selections_to_loads(value: Node) -> Node:
    """A reduction over v whose body uses v only through one where(v == e, x, c), e free of v,
    is how the IR indexes by data (embeddings, gather_rows, a cross-entropy's target logit, the
    tie count in the gradient of such a max). Every step but v = e sees c, so the result is
    f(x at v = e) combined with f(c) for the other |v| - 1 steps (max: once; sum: times |v| - 1),
    x loaded only when 0 <= e < |v|: the loop over v goes, and an embedding costs a read of its
    rows, not of its whole table per token."""
    mapping: dict[Node, Node] = {}
    deps = free_ranges(value)
    for n in toposort([value]):
        if n.op is not Op.REDUCE or len(n.arg[1]) != 1:
            continue
        (v,), body, d = n.arg[1], n.srcs[0], n.dtype
        picks = [w for w in toposort([body]) if selector(w, v, deps) is not None]
        if len(picks) != 1 or d is dt.bool_:
            continue
        (w,) = picks
        e, (_, x, c) = selector(w, v, deps), w.srcs
        (rest,) = substitute([body], {w: c})
        if v in free_ranges(rest)[rest]:  # v is used elsewhere too
            continue
        valid, at = index_of(e, v.arg[1])
        (x_at,) = substitute([x], {v: at})
        loads = [ld for ld in toposort([x_at]) if ld.op is Op.LOAD and at in toposort([ld.srcs[1]])]
        guarded = {ld: Node(Op.LOAD, ld.dtype, (*ld.srcs[:2], sym.and_(ld.srcs[2] if ld.srcs[2:] else None, valid)))
                   for ld in loads}
        (picked,) = substitute([body], {w: substitute([x_at], guarded)[0] if guarded else x_at})
        identity = 0 if n.arg[0] is Op.SUM else -math.inf if d.is_float else d.min
        size = v.arg[1]
        if rest.op is Op.CONST and rest.arg == identity:  # the others add nothing
            combined, alone = picked, rest
        elif n.arg[0] is Op.SUM:
            combined = Node(Op.ADD, d, (picked, Node(Op.MUL, d, (rest, Node(Op.CONST, d, (), size - 1)))))
            alone = Node(Op.MUL, d, (rest, Node(Op.CONST, d, (), size)))
        else:
            combined, alone = (Node(Op.MAX, d, (picked, rest)) if size > 1 else picked), rest
        mapping[n] = Node(Op.WHERE, d, (valid, combined, alone))
    return substitute([value], mapping)[0] if mapping else value


def lower_kernel(name: str, root: Node, out: Buffer, realized: dict[Node, Buffer], nest: int = 0) -> Kernel:
    if root.op is Op.FUSED:  # rendered whole by the backend; its sources must be buffers, or q, k, v views of them
        store = Node(Op.STORE, root.dtype, (out.ref(), sym.const(0), Node(Op.CONST, root.dtype, (), 0.0)))
        bufs, views, missing, visited = [], [], set(), {root, *root.srcs}
        for i, s in enumerate(root.srcs):
            whole = _through_reshapes(s, realized)
            found = (whole, None) if whole in realized else strided_view(s, realized) if i < 3 else None
            bufs.append(realized[found[0]] if found else None)
            views.append(found[1] if found else None)
            if found is None:   # realize what q, k or v is a view of, if anything, else the source itself
                base = strided_view(s, realized, assume=True) if i < 3 else None
                below = _under_copies(s, realized)
                if base is None and below is not s and below not in realized and product_sum(below):
                    # a product stored through permutes and casts would lose its tensor cores
                    # (attention's do, the projection's dx by heads): the product first, then a copy
                    base = (below, None)
                missing.add(base[0] if base else s)
                visited |= {*_movements(s), base[0]} if base else set()   # lowered again once it is realized
        reads = list({b.id: b for b in bufs if b is not None}.values())
        return Kernel(name, out, [], store, reads, problems=missing, visited=frozenset(visited),
                      fused=None if missing else (root, bufs, views))  # type: ignore[arg-type]
    lw = Lowerer(realized, root, prefix=f"{name}_", nest=nest)
    ranges = [sym.rng(f"{name}_o{d}", n) for d, n in enumerate(root.shape)]
    idx = tuple(r if r.arg[1] > 1 else sym.const(0) for r in ranges)
    value = selections_to_loads(lw.value(root, idx, None))
    present = set(toposort([value]))
    lw.reduces = {r: t for r, t in lw.reduces.items() if r in present}
    (index,) = sym.simplify([flat_index(idx, root.shape)])
    store = Node(Op.STORE, root.dtype, (out.ref(), index, value))
    return Kernel(name, out, [r for r in ranges if r.arg[1] > 1], store, lw.reads, lw.reduces, problems=lw.problems,
                  origin=lw.origin, visited=frozenset(t for t, _, _ in lw.memo))


@dataclass(frozen=True)
class View:
    """A FUSED kernel's [N, rows, D] operand read in place from a buffer (attention's q, k and v,
    heads of a [B, T, H * D] projection): element (n, r, d) sits at offset + (n // heads) * sb +
    (n % heads) * sh + r * ld + d."""
    heads: int
    sb: int
    sh: int
    ld: int
    offset: int = 0


def _movements(t: Node, realized: dict[Node, Buffer] | None = None) -> list[Node]:
    """t and the reshapes, permutes and windows below it, down to (not including) the first
    node of another kind or a realized one."""
    chain, x = [], t
    while (realized is None or x not in realized) and x.op in (Op.RESHAPE, Op.PERMUTE, Op.SHRINK):
        chain.append(x)
        x = x.srcs[0]
    return chain


def strided_view(t: Node, realized: dict[Node, Buffer], assume: bool = False) -> tuple[Node, View] | None:
    """(the realized node, the View) if t, of shape [N, rows, D], is reshapes, permutes and
    windows of a realized node whose buffer holds it as a View describes, else None. assume:
    the node below the movements as if it were realized (what to realize for a view)."""
    chain = _movements(t, realized)
    x = chain[-1].srcs[0] if chain else t
    if (x not in realized and not assume) or len(t.shape) != 3:
        return None
    axes: list[list[tuple[int, int]]] | None = []   # each axis: its parts (size, stride), outermost first
    stride = 1
    for size in reversed(x.shape):
        axes.insert(0, [(size, stride)])
        stride *= size
    offset = 0
    for node in reversed(chain):   # from the buffer up to t
        if node.op is Op.SHRINK:   # a window of axes that are one part each: the start moves
            starts, ends = node.arg
            full = node.srcs[0].shape
            if any(len(a) != 1 for i, (a, s0, e) in enumerate(zip(axes, starts, ends)) if (s0, e) != (0, full[i])):
                return None
            offset += sum(s0 * a[0][1] for a, s0 in zip(axes, starts) if s0)
            axes = [[(e - s0, a[0][1])] if (s0, e) != (0, full[i]) else a
                    for i, (a, s0, e) in enumerate(zip(axes, starts, ends))]
        else:
            axes = [axes[p] for p in node.arg] if node.op is Op.PERMUTE else _regroup(axes, node.shape)
        if axes is None:
            return None
    n, rows, d = ([p for p in a if p[0] != 1] for a in axes)
    if d != [(t.shape[2], 1)] or len(rows) > 1 or len(n) > 2:
        return None
    ld = rows[0][1] if rows else t.shape[2]
    (_, sb), (heads, sh) = n if len(n) == 2 else [(1, n[0][1] if n else 0), (1, 0)]
    # the kernels copy rows 16 bytes at a time (8 elements of 2 bytes): every row starts aligned
    return (x, View(heads, sb, sh, ld, offset)) if all(v % 8 == 0 for v in (sb, sh, ld, offset)) else None


def _regroup(axes: list[list[tuple[int, int]]], shape: tuple[int, ...]) -> list[list[tuple[int, int]]] | None:
    """The axes' parts (size, stride) cut and grouped as a reshape to shape sees them (row-major),
    neighbours that are one stride apart merged; None where a part would have to straddle axes."""
    parts = [p for a in axes for p in a if p[0] != 1]
    out = []
    for size in shape:
        group: list[tuple[int, int]] = []
        while size > 1:
            if not parts:
                return None
            s, st = parts[0]
            if size % s == 0:       # the part whole
                group.append(parts.pop(0))
                size //= s
            elif s % size == 0:     # its outer part: size of them, each s // size elements apart
                group.append((size, st * (s // size)))
                parts[0] = (s // size, st)
                size = 1
            else:
                return None
        merged: list[tuple[int, int]] = []
        for s, st in group:
            if merged and merged[-1][1] == s * st:
                merged[-1] = (merged[-1][0] * s, st)
            else:
                merged.append((s, st))
        out.append(merged)
    return None if parts else out


def _under_copies(t: Node, realized: dict[Node, Buffer]) -> Node:
    """The node below t's movements, pads and casts (what a copy kernel would read), down to a realized one."""
    while t not in realized and t.op in (Op.RESHAPE, Op.PERMUTE, Op.SHRINK, Op.PAD, Op.CAST):
        t = t.srcs[0]
    return t


def product_sum(t: Node, widened: bool = True) -> bool:
    """Whether t sums a product of broadcasts, a matmul (widened: of operands under widening casts,
    autocast's bf16 products): a contraction, which the GPU computes in a kernel of its own."""
    if t.op is not Op.SUM or t.srcs[0].op is not Op.MUL:
        return False
    return all((s.srcs[0] if widened and widening(s) else s).op is Op.EXPAND for s in t.srcs[0].srcs)


def _through_reshapes(t: Node, realized: dict[Node, Buffer]) -> Node:
    """The realized node t is a reshape of (its buffer holds t's elements in order), else t."""
    x = t
    while x.op is Op.RESHAPE and x not in realized:
        x = x.srcs[0]
    return x if x in realized else t


# ------------------------------------------------------------------------------- loop facts

@functools.lru_cache(maxsize=256)
def free_ranges(kernel_value: Node) -> dict[Node, frozenset[Node]]:
    """For every node of a kernel expression, the ranges it depends on (REDUCE binds its own).
    Remembered (a kernel's facts ask it again and again): the caller must not change the dict."""
    deps: dict[Node, frozenset[Node]] = {}
    for n in toposort([kernel_value]):
        if n.op is Op.RANGE:
            deps[n] = frozenset([n])
        else:
            d = frozenset().union(*(deps[s] for s in n.srcs)) if n.srcs else frozenset()
            if n.op is Op.REDUCE:
                d = d - frozenset(n.arg[1])
            deps[n] = d
    return deps


def enclosing_reduces(kernel_value: Node) -> dict[Node, list[Node]]:
    """For every REDUCE, the REDUCEs whose bodies contain it (it may be hoisted out of them)."""
    inside: dict[Node, list[Node]] = {}
    for red in [n for n in toposort([kernel_value]) if n.op is Op.REDUCE]:
        for m in toposort([red.srcs[0]]):
            if m.op is Op.REDUCE:
                inside.setdefault(m, []).append(red)
    return inside


def _cost(n: Node) -> int:
    """Value ops in n's expression (index arithmetic and loads' addresses not counted)."""
    seen: set[Node] = set()
    stack, count = [n], 0
    while stack:
        x = stack.pop()
        if x in seen or x.op in (Op.RANGE, Op.CONST):
            continue
        seen.add(x)
        count += x.dtype is not sym.INDEX
        if x.op is not Op.LOAD and x.op is not Op.REDUCE:
            stack.extend(x.srcs)
    return count


def recomputed_operands(k: Kernel, lanes: int = 0) -> set[Node]:
    """Tensor values this kernel would compute again for every value of an output range they do
    not depend on: inside a reduction's loop, an expression free of output range o is evaluated
    once per o. A contraction's computed operand (a layernorm feeding a linear layer, once per
    output feature), an embedding's incoming gradient (once per vocabulary row). Those of more
    than two ops get buffers: one write and one read instead, and a contraction keeps plain
    loads for the tensor-core and packed paths. lanes: inside a reduction that holds others
    (attention's P @ V on the CPU), values repeated over output ranges of at most this many
    values are left alone: the CPU makes those ranges register lanes, computing the value once
    for all, and P is never stored."""
    deps = free_ranges(k.store)
    outputs = frozenset(k.ranges)
    found: set[Node] = set()
    for red in [n for n in toposort([k.store]) if n.op is Op.REDUCE]:
        own, outer = frozenset(red.arg[1]), deps[red] & outputs
        body = toposort([red.srcs[0]])
        nest = lanes and any(n.op is Op.REDUCE for n in body)  # attention's P @ V on the CPU
        for n in body:
            d = deps[n]
            narrowed = n.op is Op.CAST and n.dtype in (dt.f16, dt.bf16) and n.srcs[0].dtype.bits > 16  # autocast
            if n.op in (Op.LOAD, Op.REDUCE) or not (d & own) or not (outer - d) or (_cost(n) < 3 and not narrowed):
                continue
            if nest and math.prod(r.arg[1] for r in outer - d) <= lanes:
                continue
            t = k.origin.get(n)
            if t is not None and t.op not in (Op.PARAM, Op.CONST, Op.IOTA) and t.shape:
                # a widening cast's narrow value in the buffer: a contraction reads it through the cast
                # as a tensor-core operand, in half the bytes (attention_scores' f32 products)
                found.add(t.srcs[0] if widening(t) else t)
    # the outermost ones (their buffers hold the inner ones' work); the walk stays inside what
    # this kernel fused, or it would cover the whole model's graph for every kernel
    inner: set[Node] = set()
    stack = [s for t in found for s in t.srcs]
    while stack:
        x = stack.pop()
        if x in inner or x not in k.visited:
            continue
        inner.add(x)
        stack.extend(x.srcs)
    return found - inner


def recompute_problems(k: Kernel, nest: int = 0) -> set[Node]:
    """Tensor reductions that this kernel would compute more than once per value it needs:
    those must be realized in a buffer of their own instead of fused here. nest: reductions
    of up to this many elements that lowering let run inside others are meant to be recomputed
    (attention's scores on the CPU, one per pass over a row)."""
    deps = free_ranges(k.value)
    inside = enclosing_reduces(k.value)
    bad: set[Node] = set()
    count: dict[Node, int] = {}
    for red, t in k.reduces.items():
        if inside.get(red) and math.prod(r.arg[1] for r in red.arg[1]) <= nest:
            continue
        count[t] = count.get(t, 0) + 1
        d = deps[red]
        if any(d & frozenset(outer.arg[1]) for outer in inside.get(red, [])):
            bad.add(t)  # it would be recomputed for every step of an enclosing reduction
            continue
        used = [r in d for r in k.ranges]
        last = max((i for i, u in enumerate(used) if u), default=-1)
        if not all(used[:last + 1]):  # an outer loop it does not depend on would repeat it
            bad.add(t)
    return bad | {t for t, c in count.items() if c > 2}

