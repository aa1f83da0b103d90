"""Flash attention on the GPU: the primitive graph of attention found and replaced by kernels
that never hold the scores (backend/flash.py renders them).

Nothing in the IR names attention. A program writes it as two contractions around a softmax,
each contraction an expand-mul-sum:

    s = f(q . k over d)                          any elementwise function of a SUM over d of q and
                                                 k broadcast against each other (scale, masks, biases)
    e = exp2((s - max_j s) * c2)                 softmax, as Tensor.softmax writes it (c2 = log2 e)
    o = sum over j of (e / sum_j e) * v          the second contraction

with casts anywhere along the way (autocast rounds q, k, p and v to bf16 and the results back to
f32) and reshapes or permutes that only move axes. `fuse` matches that graph from the second
contraction down, labelling the axes it meets (batch, i, j, d), and replaces the contraction by
a FUSED node: one kernel that runs the online softmax over tiles of keys on tensor cores and
returns o beside the base-2 logsumexp of each row (N: the batch axes): [N, T, D + 2] in the
operand dtype, the logsumexp's f32 bits in the last two columns ([N, T, D + 1] for f32).
Where no gradient is taken in the graph, an f16 or bf16 forward returns o alone, [N, T, D] in
the operand dtype: nothing would read the logsumexp, and no kernel has to convert o. Its
gradient (`vjp`, called by autodiff) is two more FUSED kernels, FlashAttention-2 style: the
scores and probabilities are recomputed per tile from the saved logsumexp.

f is the score graph (the FUSED node's arg): [N, T, S] in f32 over placeholders for the raw
score and for what else it reads (the FUSED node's sources after q, k, v), which the kernels
evaluate per element (`score_parts`; docs/architecture.md, "Flash attention").

Rounding: the kernels keep the scores, the running max and the sums in f32 and round p to the
operand dtype once, where the graph rounds after every op (p = e / sum before the cast; the
scores too where a program writes them as a bf16 product: functional.attention_scores does
not). The difference is within bf16 rounding of the result (docs/performance.md measures it).
f32 operands get kernels of their own on CUDA cores (tensor cores would round them), which
differ from the graph by f32 rounding alone. A mask value of -1e9 or below counts as -inf: a
row that keeps a key gives every such weight exactly 0 in f32 either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import debug, ir
from .. import dtype as dt
from ..ir import Node, Op, toposort
from ..target import Target
from . import symbolic as sym
from .autodiff import VJP, derivative
from .lower import Buffer, Kernel, Lowerer, flat_index
from .rewrite import P, RuleSet, rewrite, substitute
from .simplify import fused_canonical

HEAD_DIMS = (32, 64, 80, 96, 128, 256)   # head sizes the kernels have tile sizes for (TILES)
OPERANDS = (dt.bf16, dt.f16, dt.f32)   # f16/bf16 on tensor cores, f32 on CUDA cores
MASKED = -1e9              # a mask constant at or below this is -inf (see above)

Labels = list  # one label per axis of a node ("i", "j", "k", "d", "b0", ...; None for axes of size 1)


def _step(n: Node, labels: Labels) -> tuple[Node, Labels] | None:
    """One step down from n through a float cast, stop_gradient, a permute, a reshape that only
    adds or drops axes of size 1, or an expand, carrying the axis labels; None at any other node."""
    if n.op is Op.CAST and n.dtype.is_float and n.srcs[0].dtype.is_float:
        return n.srcs[0], labels
    if (inner := ir.stopped(n)) is not None:   # softmax's max
        return inner, labels
    if n.op is Op.PERMUTE:
        src = [None] * len(labels)
        for out_axis, src_axis in enumerate(n.arg):
            src[src_axis] = labels[out_axis]
        return n.srcs[0], src
    if n.op is Op.RESHAPE and [d for d in n.srcs[0].shape if d != 1] == [d for d in n.shape if d != 1]:
        kept = iter([lab for lab, d in zip(labels, n.shape) if d != 1])
        return n.srcs[0], [next(kept) if d != 1 else None for d in n.srcs[0].shape]
    if n.op is Op.EXPAND:   # a broadcast axis has no label below it
        return n.srcs[0], [lab if d != 1 else None for lab, d in zip(labels, n.srcs[0].shape)]
    return None


def _through(n: Node, labels: Labels) -> tuple[Node, Labels]:
    """Walk down from n by _step as far as it goes."""
    while (down := _step(n, labels)) is not None:
        n, labels = down
    return n, labels


def _operands(prod: Node, axis: int) -> tuple[Node, Node, int, int] | None:
    """A contraction's MUL of two operands, each broadcast along exactly one axis (the other's
    free axis): (x, y, the axis x is broadcast along, the axis y is)."""
    if prod.op is not Op.MUL or any(s.op is not Op.EXPAND for s in prod.srcs):
        return None
    x, y = prod.srcs
    wide = [[a for a, (d, e) in enumerate(zip(s.srcs[0].shape, prod.shape)) if d == 1 and e > 1] for s in (x, y)]
    if any(len(w) != 1 or w[0] == axis for w in wide) or wide[0] == wide[1]:
        return None
    return x, y, wide[0][0], wide[1][0]


def _gather(n: Node, labels: Labels, order: list[str], shape: tuple[int, ...]) -> Node | None:
    """n with its axes in the order of their labels, reshaped to shape (axes of size 1 dropped)."""
    labs = [lab for lab, d in zip(labels, n.shape) if d != 1]
    if None in labs or sorted(labs) != sorted(order):
        return None
    x = ir.reshape(n, tuple(d for d in n.shape if d != 1))
    perm = tuple(labs.index(lab) for lab in order)
    if perm != tuple(range(len(perm))):
        x = ir.permute(x, perm)
    return ir.reshape(x, shape)


def _shared_heads(x: Node) -> tuple[Node, int] | None:
    """x, an [N, rows, D] operand, as (y, g) where x's batch n reads y's batch n // g, y of
    [N / g, rows, D]: k or v of grouped-query attention, whose heads an expand shares between
    groups of g neighbouring q heads (repeat_interleave's, or a single head's broadcast); y is x
    without the expand (the movements and casts below x only). None where x is no such broadcast."""
    from .lower import _regroup
    chain, y = [], x
    while y.op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND) or \
            (y.op is Op.CAST and y.dtype.is_float and y.srcs[0].dtype.is_float):
        chain.append(y)
        y = y.srcs[0]
    if not any(c.op is Op.EXPAND for c in chain):
        return None
    axes: list | None = []   # each axis of the node reached: its parts (size, stride in y; 0: broadcast)
    stride = 1
    for size in reversed(y.shape):
        axes.insert(0, [(size, stride)])
        stride *= size
    for c in reversed(chain):
        if c.op is Op.PERMUTE:
            axes = [axes[a] for a in c.arg]
        elif c.op is Op.RESHAPE:
            axes = _regroup(axes, c.shape)
        elif c.op is Op.EXPAND:
            axes = [[(e, 0)] if d == 1 and e > 1 else a for a, d, e in zip(axes, c.srcs[0].shape, c.shape)]
        if axes is None:
            return None
    n_parts, rows, cols = ([p for p in a if p[0] != 1] for a in axes)
    kept = n_parts[:-1] + rows + cols
    if not n_parts or n_parts[-1][1] != 0 or any(st == 0 for _, st in kept):
        return None   # the broadcast is not the innermost part of the batch (or not only there)
    fine = sorted(kept, key=lambda p: -p[1])   # y's elements as these parts, outermost first
    if [st for _, st in fine] != [math.prod(sz for sz, _ in fine[i + 1:]) for i in range(len(fine))] or \
            math.prod(sz for sz, _ in fine) != y.numel:
        return None
    out = ir.reshape(y, tuple(sz for sz, _ in fine))
    perm = tuple(fine.index(p) for p in kept)
    if perm != tuple(range(len(perm))):
        out = ir.permute(out, perm)
    g = n_parts[-1][0]
    out = ir.reshape(out, (x.shape[0] // g, *x.shape[1:]))
    for c in reversed(chain):   # casts commute with movements
        if c.op is Op.CAST:
            out = ir.unary(Op.CAST, out, c.dtype)
    return out, g


def _literal(n: Node) -> object:
    while n.op in (Op.EXPAND, Op.RESHAPE):   # a scalar broadcast
        n = n.srcs[0]
    return n.arg if n.op is Op.CONST else None


def _const(n: Node) -> float | None:
    return float(_literal(n)) if n.dtype.is_float and _literal(n) is not None else None  # type: ignore[arg-type]


def _why(msg: str) -> None:
    debug.log(1, f"attention: not on the flash path: {msg}")


def _qk_sums(s: Node, labels: Labels) -> list[tuple[Node, Labels]]:
    """The contractions (a SUM of a product of two broadcasts) that the scores s are an
    elementwise function of, each with its labels: candidates for q . k."""
    found, seen, stack = [], set(), [(s, labels)]
    while stack:
        n, lab = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op is Op.SUM and len(n.arg) == 1 and _operands(n.srcs[0], n.arg[0]) is not None:
            found.append((n, lab))
        elif (down := _step(n, lab)) is not None:
            stack.append(down)
        elif n.op in ir.ELEMENTWISE:
            stack.extend((x, lab) for x in n.srcs)
    return found


def _unwidened(n: Node, labels: Labels) -> tuple[Node, Labels]:
    """n below an exact widening float cast under views (q in f32 from bf16 for f32 scores of exact
    products: functional.attention_scores), with its labels; else n itself."""
    x, lab = n, labels
    while x.op in (Op.RESHAPE, Op.PERMUTE) and (down := _step(x, lab)) is not None:
        x, lab = down
    if ir.widening(x):
        return x.srcs[0], lab
    return n, labels


def _prescaled(n: Node, labels: Labels) -> tuple[Node, Labels, float]:
    """q (or k) with the constant factors it was scaled by before the product taken out (they
    move into the score graph): through casts, reshapes and permutes, products and divisions
    by finite nonzero constants."""
    c, x, lab = 1.0, n, labels
    while True:
        if x.op in (Op.MUL, Op.DIV) and (k := _const(x.srcs[1])) is not None and k != 0 and math.isfinite(k):
            c, x = c * k if x.op is Op.MUL else c / k, x.srcs[0]
        elif x.op is Op.MUL and (k := _const(x.srcs[0])) is not None and k != 0 and math.isfinite(k):
            c, x = c * k, x.srcs[1]
        elif x.op is not Op.EXPAND and (down := _step(x, lab)) is not None:
            x, lab = down
        else:
            break
    return (n, labels, 1.0) if c == 1.0 else (x, lab, c)


def _ungather(x: Node, labels: Labels, order: list[str], size: dict[str, int], shape: tuple[int, ...]) -> Node:
    """_gather's inverse: x, whose axes are the labels of order, as a node of shape whose
    axes carry labels (None: size 1)."""
    x = ir.reshape(x, tuple(size[lab] for lab in order))
    want = [lab for lab, d in zip(labels, shape) if d != 1]
    perm = tuple(order.index(lab) for lab in want)
    if perm != tuple(range(len(perm))):
        x = ir.permute(x, perm)
    return ir.reshape(x, shape)


SCORE = "%score"   # the score graph's placeholder for q . k, [N, T, S] in f32


def placeholders(score: Node) -> tuple[Node, list[Node]]:
    """The score graph's placeholders: the raw score, and its sources in order (the FUSED node's
    sources after q, k, v; after the six the backward kernels read)."""
    params = {n.arg: n for n in toposort([score]) if n.op is Op.PARAM}
    extra = [params[f"%src{i}"] for i in range(len(params)) if f"%src{i}" in params]
    return params.get(SCORE) or ir.param(SCORE, dt.f32, score.shape), extra


def _inside(n: Node) -> bool:
    """Whether the score graph computes n itself (else n is one of its sources)."""
    return n.op in ir.ELEMENTWISE | ir.MOVEMENT | {Op.CONST, Op.IOTA}


def _depends(n: Node, x: Node, limit: int = 4096) -> bool:
    """Whether n's value depends on x (or the graph below n is too large to tell)."""
    seen, stack = set(), [n]
    while stack:
        y = stack.pop()
        if y is x or len(seen) > limit:
            return True
        if y not in seen:
            seen.add(y)
            stack.extend(y.srcs)
    return False


def _in_f32(top: Node, qk: Node, raw: Node) -> tuple[Node, list[Node]] | None:
    """The graph from the scores top down to q . k (replaced by raw), in f32: float casts
    dropped, mask constants at or below MASKED made -inf. What it reads other than iotas and
    constants (params, other reductions) become placeholders %src0, %src1, ...; returns the
    graph and those sources, or None where a source depends on q . k (a score function that is
    not elementwise)."""
    order, seen, stack = [], {qk}, [(top, False)]
    while stack:   # the region between top and qk, sources first
        n, done = stack.pop()
        if done:
            order.append(n)
        elif n not in seen:
            seen.add(n)
            stack.append((n, True))
            if _inside(n):
                stack.extend((s, False) for s in ((ir.stopped(n),) if ir.stopped(n) is not None else n.srcs))
    memo: dict[Node, Node] = {qk: raw}
    extra: list[Node] = []
    for n in order:
        if not _inside(n):
            if _depends(n, qk):
                return None
            ph = ir.param(f"%src{len(extra)}", n.dtype, n.shape)
            extra.append(n)
            memo[n] = ir.unary(Op.CAST, ph, dt.f32) if n.dtype.is_float and n.dtype is not dt.f32 else ph
        elif (inner := ir.stopped(n)) is not None:
            memo[n] = memo[inner]
        elif n.op is Op.CAST and n.dtype.is_float and n.srcs[0].dtype.is_float:
            memo[n] = memo[n.srcs[0]]
        elif n.op is Op.BITCAST:   # of the value in its own dtype (a sign bit: tanh's odd symmetry)
            x, d = memo[n.srcs[0]], n.srcs[0].dtype
            bits = Node(Op.BITCAST, n.dtype, (x if x.dtype is d else ir.unary(Op.CAST, x, d),), None, n.shape)
            memo[n] = ir.unary(Op.CAST, bits, dt.f32) if n.dtype.is_float and n.dtype is not dt.f32 else bits
        elif n.op is Op.CONST and n.dtype.is_float:
            v = float(n.arg)
            memo[n] = Node(Op.CONST, dt.f32, (), -math.inf if v <= MASKED else v, n.shape)
        else:
            memo[n] = Node(n.op, dt.f32 if n.dtype.is_float else n.dtype, tuple(memo[s] for s in n.srcs), n.arg,
                           n.shape)
    return memo[top], extra


def _score_ranges(shape: tuple[int, ...]) -> tuple[Node, ...]:
    return tuple(sym.rng(f"score_{a}", d) if d > 1 else sym.const(0) for a, d in zip("nij", shape))


def lower_score(g: Node, bufs: dict[Node, Buffer]) -> tuple[Node, tuple[Node, ...]]:
    """The score graph g (or its derivative) as a scalar expression at (n, i, j), reading the
    raw score and the sources from bufs (keyed by placeholder), and those three ranges (a
    constant 0 for an axis of size 1)."""
    ranges = _score_ranges(g.shape)
    return Lowerer(bufs, g, prefix="score_").value(g, ranges, None), ranges


def _pointwise(g: Node) -> str | None:
    """Why the score graph g is not an elementwise function of the raw score at each (n, i, j),
    or None when it is."""
    raw, extra = placeholders(g)
    bufs = {p: Buffer(i, p.dtype, p.numel, "input", p) for i, p in enumerate([raw, *extra])}
    value, ranges = lower_score(g, bufs)
    (here,) = sym.simplify([flat_index(ranges, g.shape)])
    for n in toposort([value]):
        if n.op is Op.REDUCE:
            return "the score graph holds a reduction"
        if n.op is Op.LOAD and n.srcs[0].arg == 0 and (len(n.srcs) > 2 or n.srcs[1] is not here):
            return "the score graph reads the scores of other positions"
    return None


def _match(o_sum: Node, o_only: bool = False, wrt: frozenset[Node] = frozenset()) -> Node | None:
    """The replacement of attention's second contraction o_sum, or None if it is not one;
    o_only: the graph takes no gradient (16-bit operands then give o alone); wrt: the nodes
    gradients are taken with respect to (the score graph's sources get none)."""
    if len(o_sum.arg) != 1 or o_sum.dtype not in OPERANDS:
        return None
    (jax,) = o_sum.arg
    prod = o_sum.srcs[0]
    found = _operands(prod, jax)
    if found is None:
        return None
    for p_op, v_op, p_wide, v_wide in (found, (found[1], found[0], found[3], found[2])):
        batch = iter(range(len(prod.shape)))
        lab: Labels = [None if d == 1 else "j" if a == jax else "d" if a == p_wide else "i" if a == v_wide
                       else f"b{next(batch)}" for a, d in enumerate(prod.shape)]
        out = _match_sides(o_sum, lab, p_op, v_op, o_only, wrt)
        if out is not None:
            return out
    return None


def _match_sides(o_sum: Node, lab: Labels, p_op: Node, v_op: Node, o_only: bool, wrt: frozenset[Node]) -> Node | None:
    if p_op.dtype is not v_op.dtype or v_op.dtype is not o_sum.dtype:
        return None
    # p = e / sum_j e, e = exp2((s - max_j s) * c2)
    div, labels = _through(p_op.srcs[0], [x if x != "d" else None for x in lab])
    if div.op is not Op.DIV:
        return None
    e, den = div.srcs
    den, _ = _through(den, list(labels))
    if den.op is not Op.SUM or den.srcs[0] is not e or len(den.arg) != 1 or labels[den.arg[0]] != "j":
        return None
    if e.op is not Op.EXP2:
        return None
    t, c2 = e.srcs[0], 1.0
    if t.op is Op.MUL:
        x, y = t.srcs if _const(t.srcs[1]) is not None else t.srcs[::-1]
        c2 = _const(y) or 0.0
        t = x
    if t.op is not Op.SUB or c2 == 0 or not math.isfinite(c2):
        return None
    s, mx = t.srcs
    mx, _ = _through(mx, list(labels))
    if mx.op is not Op.RMAX or mx.srcs[0] is not s or mx.arg != den.arg:
        return None
    candidates = _qk_sums(s, list(labels))
    for qk_sum, qk_labels in candidates:
        out = _match_scores(o_sum, lab, v_op, o_only, wrt, s, list(labels), c2, qk_sum, qk_labels)
        if out is not None:
            return out
    if not candidates:
        _why("the softmax's input is no elementwise function of a contraction q . k")
    return None


def _match_scores(o_sum: Node, lab: Labels, v_op: Node, o_only: bool, wrt: frozenset[Node], s: Node,
                  labels: Labels, c2: float, qk_sum: Node, qk_labels: Labels) -> Node | None:
    """The FUSED replacement once the softmax is found: q . k is qk_sum, and everything
    between it and the softmax's input s is the score graph."""
    (kax,) = qk_sum.arg
    qk_lab = list(qk_labels)
    qk_lab[kax] = "k"
    qk = qk_sum.srcs[0]
    found = _operands(qk, kax)
    if found is None or None in [x for x, d in zip(qk_lab, qk.shape) if d > 1]:
        return None
    x, y, x_wide, y_wide = found
    q_op, k_op = (x, y) if qk_lab[x_wide] == "j" and qk_lab[y_wide] == "i" else \
        (y, x) if qk_lab[y_wide] == "j" and qk_lab[x_wide] == "i" else (None, None)
    if q_op is None or k_op is None:
        return None
    q_src, q_lab, cq = _prescaled(*_unwidened(q_op.srcs[0], [x if x != "j" else None for x in qk_lab]))
    k_src, k_lab, ck = _prescaled(*_unwidened(k_op.srcs[0], [x if x != "i" else None for x in qk_lab]))
    if q_src.dtype is not v_op.dtype or k_src.dtype is not v_op.dtype:
        _why(f"q, k and v differ in dtype ({q_src.dtype}, {k_src.dtype}, {v_op.dtype})")
        return None
    size = {x: d for x, d in zip(lab, o_sum.srcs[0].shape) if x is not None}
    size.update({x: d for x, d in zip(qk_lab, qk.shape) if x is not None})
    batch = [x for x in lab if x is not None and x.startswith("b")]
    n = math.prod(size[b] for b in batch)
    t_len, s_len, d, dv = size.get("i"), size.get("j"), size.get("k"), size.get("d")
    if t_len is None or s_len is None:
        return None
    if d != dv or d not in HEAD_DIMS:
        _why(f"head sizes {d} (q, k) and {dv} (v): the kernels are written for {HEAD_DIMS} alike")
        return None
    q = _gather(q_src, q_lab, batch + ["i", "k"], (n, t_len, d))
    k = _gather(k_src, k_lab, batch + ["j", "k"], (n, s_len, d))
    v = _gather(v_op.srcs[0], [x if x != "i" else None for x in lab], batch + ["j", "d"], (n, s_len, d))
    if q is None or k is None or v is None:
        return None
    shared = [_shared_heads(x) for x in (k, v)]   # grouped-query: the kernels read k and v at n // g
    if shared[0] is not None and shared[1] is not None and shared[0][1] == shared[1][1]:
        (k, _), (v, _) = shared
    q, k = (x if x.dtype is v.dtype else ir.unary(Op.CAST, x, v.dtype) for x in (q, k))
    raw = ir.param(SCORE, dt.f32, (n, t_len, s_len))
    raw = _ungather(raw, [x if x != "k" else None for x in qk_lab], batch + ["i", "j"], size, qk_sum.shape)
    if cq * ck != 1.0:
        raw = ir.binary(Op.MUL, raw, ir.const(cq * ck, dt.f32, raw.shape))
    built = _in_f32(s, qk_sum, raw)
    if built is None:
        _why("the scores are not an elementwise function of q . k (a source of the score graph reads it)")
        return None
    top, extra = built
    g = _gather(ir.binary(Op.MUL, top, ir.const(c2, dt.f32, top.shape)), labels, batch + ["i", "j"], (n, t_len, s_len))
    if g is None:
        return None
    (g,) = fused_canonical([g])
    why = _pointwise(g)
    if why is None and any(x in wrt for x in toposort([e for e in extra if e.dtype.is_float])):
        why = "a gradient is taken through the score graph's sources (its bias)"
    if why is not None:
        _why(why)
        return None
    arg = ("attention", g)
    order = [x for a, x in enumerate(lab) if x is not None and a not in o_sum.arg]
    axes = tuple((batch + ["i", "d"]).index(x) for x in order)
    o_only = o_only and q.dtype is not dt.f32
    srcs = (q, k, v, *extra)
    if o_only and axes == tuple(range(len(axes))):   # o in the layout asked for: the kernel's output as is
        o = Node(Op.FUSED, q.dtype, srcs, arg, o_sum.shape)
    else:
        # with a gradient: o beside the logsumexp's f32, its bits in two more columns of 16-bit
        # operands (flash.cuh's ember_flash_out)
        o = Node(Op.FUSED, q.dtype, srcs, arg, (n, t_len, d)) if o_only else \
            ir.shrink(Node(Op.FUSED, q.dtype, srcs, arg, (n, t_len, d + (1 if q.dtype is dt.f32 else 2))),
                      (0, 0, 0), (n, t_len, d))
        o = ir.permute(ir.reshape(o, tuple(size[b] for b in batch) + (t_len, d)), axes)
        o = ir.reshape(o, o_sum.shape)
    return o if o.dtype is o_sum.dtype else ir.unary(Op.CAST, o, o_sum.dtype)


def fuse(outputs: list[Node]) -> list[Node]:
    """The graph with every attention of f16, bf16 or f32 operands and a head size of HEAD_DIMS
    replaced by the flash kernels. Left alone when a gradient is taken of a gradient (the
    backward kernels have no gradient of their own)."""
    nodes = toposort(outputs)
    grads = [n for n in nodes if n.op is Op.GRAD]
    if grads and any(n.op is Op.GRAD for n in toposort([g.srcs[0] for g in grads])):
        return outputs
    if not any(n.op is Op.SUM and n.dtype in OPERANDS for n in nodes):
        return outputs
    wrt = frozenset(g.srcs[1] for g in grads)
    return rewrite(outputs, RuleSet([(P(Op.SUM, name="o_sum"), lambda o_sum: _match(o_sum, not grads, wrt))]))


FIXED = {"attention": 3, "attention_dq": 6, "attention_dkdv": 6}   # sources before the score graph's


def group(n: Node) -> int:
    """The q heads that share each head of k and v in a flash kernel's node (grouped-query
    attention: k and v have N / group batches, read at n // group; 1: none shared)."""
    return n.srcs[0].shape[0] // n.srcs[1].shape[0]


def vjp(n: Node, g: Node) -> list[tuple[Node, Node]]:
    """The gradients of q, k and v from the gradient g of the packed [N, T, D + 2] output (the
    score graph's sources get none: fuse leaves a graph that asks for one alone). Where k and v
    are shared by groups of q heads, the dk|dv kernel writes each q head's share in f32 and a sum
    over the group follows, rounded once (simpler than a kernel looping over the group's heads,
    and each block's tiles stay those of one head's masks)."""
    kind, score = n.arg
    assert kind == "attention", "the backward kernels have no gradient (fuse leaves grads of grads alone)"
    q, k, v, *extra = n.srcs
    size, t_len, d = q.shape
    s_len, grp = k.shape[1], group(n)
    do = ir.shrink(g, (0, 0, 0), (size, t_len, d))
    o = ir.shrink(n, (0, 0, 0), (size, t_len, d))
    wide = [x if x.dtype is dt.f32 else ir.unary(Op.CAST, x, dt.f32) for x in (do, o)]
    di = ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, *wide), (2,)), (size, t_len))   # rowsum(dO * O), f32
    srcs = (q, k, v, n, do if do.dtype is q.dtype else ir.unary(Op.CAST, do, q.dtype), di, *extra)
    # in the operands' dtype, rounded once from the f32 accumulators as a cast would: half the
    # bytes to write, and to read where they are put back together (GPT-2's qkv gradient)
    dq = Node(Op.FUSED, q.dtype, srcs, ("attention_dq", score), (size, t_len, d))
    dkv = Node(Op.FUSED, q.dtype if grp == 1 else dt.f32, srcs, ("attention_dkdv", score), (size, s_len, 2 * d))
    if grp > 1:
        dkv = ir.reduce(Op.SUM, ir.reshape(dkv, (size // grp, grp, s_len, 2 * d)), (1,))
        dkv = ir.unary(Op.CAST, ir.reshape(dkv, (size // grp, s_len, 2 * d)), q.dtype)
    dk = ir.shrink(dkv, (0, 0, 0), (size // grp, s_len, d))
    dv = ir.shrink(dkv, (0, 0, d), (size // grp, s_len, 2 * d))
    return [(q, dq), (k, dk), (v, dv)]


VJP[Op.FUSED] = vjp   # autodiff's rule for the nodes this module makes


# ---------------------------------------------------------------- the score graph's parts

@dataclass(frozen=True)
class Scores:
    """What the flash kernels need of a score graph, lowered at ranges (n, i, j): its value
    (base 2, masks in), the value with the iota masks known to hold (tiles inside them), its
    derivative with respect to the raw score (ln 2 included: the gradient of a natural-log
    score) in both forms, the derivative's value where it is one constant, and the iota masks
    as formulas of linear atoms (tile bounds)."""
    ranges: tuple[Node, ...]
    value: Node
    inner: Node
    grad: Node | None
    grad_inner: Node | None
    dconst: float | None
    masks: tuple


def _linear(e: Node) -> tuple[dict[Node, int], int] | None:
    """e, an integer-valued expression of ranges, as {range: coefficient} and a constant."""
    terms: dict[Node, int] = {}
    k, work = 0, [(e, 1)]
    while work:
        x, c = work.pop()
        if x.op is Op.CAST and (x.srcs[0].dtype.is_int or x.srcs[0].dtype is dt.bool_):
            work.append((x.srcs[0], c))
        elif x.op is Op.CONST and float(x.arg) == int(float(x.arg)):
            k += c * int(float(x.arg))
        elif x.op is Op.RANGE:
            terms[x] = terms.get(x, 0) + c
        elif x.op in (Op.ADD, Op.SUB):
            work += [(x.srcs[0], c), (x.srcs[1], c if x.op is Op.ADD else -c)]
        elif x.op is Op.NEG:
            work.append((x.srcs[0], -c))
        elif x.op is Op.MUL and any(s.op is Op.CONST for s in x.srcs):
            a, b = x.srcs if x.srcs[1].op is Op.CONST else x.srcs[::-1]
            if float(b.arg) != int(float(b.arg)):
                return None
            work.append((a, c * int(float(b.arg))))
        else:
            return None
    return terms, k


def _formula(c: Node) -> tuple | None:
    """A bool expression of ranges as and/or/not of atoms ("lt", terms, k): sum(terms) + k < 0."""
    if c.op is Op.CMPLT:
        a, b = _linear(c.srcs[0]), _linear(c.srcs[1])
        if a is None or b is None:
            return None
        terms = dict(a[0])
        for r, x in b[0].items():
            terms[r] = terms.get(r, 0) - x
        return ("lt", terms, a[1] - b[1])
    if c.op in (Op.CMPEQ, Op.CMPNE, Op.XOR) and c.srcs[0].dtype is dt.bool_:
        lits = [s.arg for s in c.srcs if s.op is Op.CONST]
        other = [s for s in c.srcs if s.op is not Op.CONST]
        if len(lits) != 1 or len(other) != 1 or (f := _formula(other[0])) is None:
            return None
        negate = bool(lits[0]) if c.op is not Op.CMPEQ else not lits[0]
        return ("not", f) if negate else f
    if c.op in (Op.AND, Op.OR) and c.dtype is dt.bool_:
        parts = [_formula(s) for s in c.srcs]
        return None if None in parts else (c.op.name.lower(), *parts)
    return None


def _mask_wheres(v: Node) -> list[tuple[Node, bool]]:
    """The WHERE nodes of v that set a score to -inf, each with the condition's value that keeps
    it: through sums, differences, positive products and float casts from the top."""
    out: list[tuple[Node, bool]] = []
    stack = [v]
    while stack:
        x = stack.pop()
        if x.op is Op.WHERE:
            a, b = _const(x.srcs[1]), _const(x.srcs[2])
            if b == -math.inf:
                out.append((x, True))
                stack.append(x.srcs[1])
            elif a == -math.inf:
                out.append((x, False))
                stack.append(x.srcs[2])
        elif x.op is Op.ADD:
            stack.extend(x.srcs)
        elif x.op is Op.SUB:
            stack.append(x.srcs[0])
        elif x.op is Op.MUL and any((_const(s) or 0) > 0 for s in x.srcs):
            stack.extend(s for s in x.srcs if s.op is not Op.CONST)
        elif x.op is Op.CAST and x.dtype.is_float and x.srcs[0].dtype.is_float:
            stack.append(x.srcs[0])
    return out


def score_derivative(score: Node) -> Node:
    """d score / d (raw score) times ln 2: the factor from a gradient of the natural-log scores
    (the kernels' p (dp - rowsum(do o))) to the gradient of q . k."""
    raw, _ = placeholders(score)
    return fused_canonical([ir.binary(Op.MUL, derivative(score, raw), ir.const(math.log(2.0), dt.f32, raw.shape))])[0]


def score_parts(node: Node, bufs: dict[Node, Buffer], grad: bool) -> Scores:
    """The FUSED node's score graph taken apart for the kernels (bufs: its placeholders' buffers);
    grad: the derivative too (the backward kernels)."""
    score = node.arg[1]
    value, ranges = lower_score(score, bufs)
    (value,) = fused_canonical([value])   # what the movements kept apart meets (a scale, log2 e)
    masks, kept = [], {}
    for w, keep in _mask_wheres(value):
        cond = w.srcs[0]
        if any(x.op is Op.LOAD for x in toposort([cond])) or (f := _formula(cond)) is None:
            continue   # a param's mask (key padding): applied per element, every tile read
        masks.append(f if keep else ("not", f))
        kept[cond] = keep

    def inner(x: Node) -> Node:   # inside the iota masks: every WHERE on their conditions takes its kept side
        wheres = {w: w.srcs[1] if kept[w.srcs[0]] else w.srcs[2] for w in toposort([x])
                  if w.op is Op.WHERE and w.srcs[0] in kept}
        return fused_canonical(substitute([x], wheres))[0] if wheres else x

    d = d_inner = dconst = None
    if grad:
        (d,) = fused_canonical([lower_score(score_derivative(score), bufs)[0]])
        d_inner = inner(d)
        dconst = float(d_inner.arg) if d_inner.op is Op.CONST else None
    return Scores(ranges, value, inner(value), d, d_inner, dconst, tuple(masks))


# ---------------------------------------------------------------- the flash kernels' plans

@dataclass(frozen=True)
class FlashPlan:
    """A flash kernel's plan, chosen by optimize for the target (backend/flash.py renders it)."""
    rows: int             # rows a block owns: queries (dk|dv: keys)
    tile: int             # rows of each tile streamed past them
    threads: int
    wgmma: bool = False   # sm_90a: every product on wgmma (EmberWg<true>)
    heads: int = 0        # the warp-specialized kernels (TMA): the heads q, k, v are seen in; 0: cp.async
    split: int = 1        # dk|dv: blocks a key block's columns are split over (blockIdx.z; SPLIT)

    def __str__(self) -> str:
        how = f"warp-specialized, {self.heads} heads" if self.heads else "wgmma" if self.wgmma else "mma.sync"
        cols = f", columns in {self.split}" if self.split > 1 else ""
        return f"flash: {self.rows} rows, tiles of {self.tile}, {self.threads} threads, {how}{cols}"


THREADS = 128   # 4 warps
# kind -> head size -> (rows a block owns, rows of each tile streamed past them), the templates'
# ROWS and TILE: the forward's block is 2 tiles of 16 query rows per warp, so each K fragment
# loaded serves both; larger D streams shorter tiles where the accumulators would not fit in
# registers otherwise (D = 256: 128 of o a thread, one row tile a warp), and sm_86's 99 KB of
# shared memory bounds D = 256's (96 KB: its own rows and two double-buffered tiles)
TILES = {"attention": {32: (128, 64), 64: (128, 64), 80: (128, 64), 96: (128, 32), 128: (128, 32), 256: (64, 32)},
         "attention_dq": {32: (64, 64), 64: (64, 64), 80: (64, 64), 96: (64, 64), 128: (64, 64), 256: (64, 16)},
         "attention_dkdv": {32: (64, 64), 64: (64, 64), 80: (64, 32), 96: (64, 32), 128: (64, 32), 256: (64, 16)}}
# dk|dv at D = 256: a thread's dk and dv accumulators would be 256 registers, so two blocks take
# a key block, 128 columns each, and both compute its scores (the templates' DC)
SPLIT = {256: 2}


HOPPER_ROWS, HOPPER_THREADS = 128, 256   # sm_90a's forward: two warpgroups of 64 rows
# its keys per tile, by head size (D = 128: 160 KB of tiles at 128, one block an SM; the tiles of
# D = 32, 80 and 96 are those of the panels of 64 columns they are padded to: 64 and 128)
HOPPER_TILE = {32: 128, 64: 128, 80: 64, 96: 64, 128: 64, 256: 64}


# f32 operands (CUDA cores): kind -> head size -> (rows a block owns, rows of each tile streamed
# past them); the forward's threads hold two rows each, the backward's one, G threads a row
# (ember_g32: 4, 4, 4, 4, 8, 16 for the head sizes below), so ROWS is 256 / G and 128 / G;
# 8-64 KB of tiles (D = 32's forward: tiles of 32 spilled a loop counter on sm_90a)
TILES32 = {"attention": {32: (64, 16), 64: (64, 32), 80: (64, 32), 96: (64, 32), 128: (32, 16), 256: (16, 16)},
           "attention_dq": {32: (32, 32), 64: (32, 32), 80: (32, 32), 96: (32, 16), 128: (16, 16), 256: (8, 16)},
           "attention_dkdv": {32: (32, 32), 64: (32, 32), 80: (32, 32), 96: (32, 16), 128: (16, 16), 256: (8, 16)}}


# the warp-specialized kernels (ember_flash_*_ws, sm_90a): 128 rows a block, tiles of this many
# rows streamed past them (the forward's keys; the backward's keys for dq, queries for dk|dv);
# D = 256 halves them (192 KB of shared memory, and the consumers' 240 registers)
WS_TILE = {"attention": 128, "attention_dq": 64, "attention_dkdv": 64}
WS_TILE_256 = {"attention": 64, "attention_dq": 32, "attention_dkdv": 32}
WS_THREADS = 384


def flash_plan(k: Kernel, gpu: Target, warp_specialized: bool = True) -> FlashPlan:
    """The sizes of a flash kernel (a FUSED node rendered whole) for the GPU. On sm_90a the
    f16/bf16 kernels are warp-specialized when every operand's batch axis splits by one head
    count H (a View's own heads, or 1) and warp_specialized (EMBER_FLASH_WS=0: not), else on wgmma."""
    assert k.fused is not None
    node, _, views = k.fused
    kind, d = node.arg[0], node.srcs[0].shape[2]
    if node.srcs[0].dtype is dt.f32:   # CUDA cores: tensor cores would round the operands
        return FlashPlan(*TILES32[kind][d], THREADS)
    split = SPLIT.get(d, 1) if kind == "attention_dkdv" else 1
    if not gpu.wgmma:
        return FlashPlan(*TILES[kind][d], THREADS, split=split)
    grp = group(node)   # k's and v's heads count grp of q's each
    heads = {v.heads * (grp if i else 1) for i, v in enumerate(views[:3]) if v is not None and v.heads > 1}
    if len(heads) <= 1 and warp_specialized and (not heads or min(heads) % grp == 0):
        tile = (WS_TILE_256 if d > 128 else WS_TILE)[kind]
        return FlashPlan(HOPPER_ROWS, tile, WS_THREADS, True, heads.pop() if heads else 1, split)
    if kind == "attention":
        return FlashPlan(HOPPER_ROWS, HOPPER_TILE[d], HOPPER_THREADS, True)
    return FlashPlan(*TILES[kind][d], THREADS, True, split=split)
