"""Flash attention on the GPU: the primitive graph of attention found and replaced by kernels
that never hold the scores (backend/flash.py renders them).

Nothing in the IR names attention. A program writes it as two contractions around a softmax,
each contraction an expand-mul-sum:

    s = (q . k over d) * c1                      a SUM over d of q and k broadcast against each other
    s = where(j <= i, s, -inf)                   optional: a causal mask from two iotas
    e = exp2((s - max_j s) * c2)                 softmax, as Tensor.softmax writes it (c2 = log2 e)
    o = sum over j of (e / sum_j e) * v          the second contraction

with casts anywhere along the way (autocast rounds q, k, p and v to bf16 and the results back to
f32) and reshapes or permutes that only move axes. `fuse` matches that graph from the second
contraction down, labelling the axes it meets (batch, i, j, d), and replaces the contraction by
a FUSED node: one kernel that runs the online softmax over tiles of keys on tensor cores and
returns o beside the base-2 logsumexp of each row, [N, T, D + 1] in f32 (N: the batch axes).
Where no gradient is taken in the graph, an f16 or bf16 forward returns o alone, [N, T, D] in
the operand dtype: nothing would read the logsumexp, and no kernel has to convert o. Its
gradient (`vjp`, called by autodiff) is two more FUSED kernels, FlashAttention-2 style: the
scores and probabilities are recomputed per tile from the saved logsumexp.

Rounding: the kernels keep the scores, the running max and the sums in f32 and round p to the
operand dtype once, where the graph rounds after every op (the scores to bf16, p = e / sum
before the cast). The difference is within bf16 rounding of the result (docs/performance.md
measures it). f32 operands get kernels of their own on CUDA cores (tensor cores would round
them), which differ from the graph by f32 rounding alone. A mask value of -1e9 or below
counts as -inf: a causal row always keeps its diagonal, so every such weight is exactly 0 in
f32 either way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import dtype as dt
from .. import ir
from ..ir import Node, Op, toposort
from ..target import Target
from .lower import Kernel
from .rewrite import P, RuleSet, rewrite

HEAD_DIMS = (64, 128)      # head sizes the kernels are written for
OPERANDS = (dt.bf16, dt.f16, dt.f32)   # f16/bf16 on tensor cores, f32 on CUDA cores
MASKED = -1e9              # a mask constant at or below this is -inf (see above)

Labels = list  # one label per axis of a node ("i", "j", "k", "d", "b0", ...; None for axes of size 1)


def _through(n: Node, labels: Labels) -> tuple[Node, Labels]:
    """Walk down from n through float casts, stop_gradient, permutes and reshapes that only add or drop axes
    of size 1, carrying the axis labels."""
    while True:
        if n.op is Op.CAST and n.dtype.is_float and n.srcs[0].dtype.is_float:
            n = n.srcs[0]
        elif (inner := ir.stopped(n)) is not None:   # softmax's max
            n = inner
        elif n.op is Op.PERMUTE:
            src = [None] * len(labels)
            for out_axis, src_axis in enumerate(n.arg):
                src[src_axis] = labels[out_axis]
            n, labels = n.srcs[0], src
        elif n.op is Op.RESHAPE and [d for d in n.srcs[0].shape if d != 1] == [d for d in n.shape if d != 1]:
            kept = iter([lab for lab, d in zip(labels, n.shape) if d != 1])
            n, labels = n.srcs[0], [next(kept) if d != 1 else None for d in n.srcs[0].shape]
        elif n.op is Op.EXPAND:   # a broadcast axis has no label below it
            labels = [lab if d != 1 else None for lab, d in zip(labels, n.srcs[0].shape)]
            n = n.srcs[0]
        else:
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


def _literal(n: Node) -> object:
    while n.op in (Op.EXPAND, Op.RESHAPE):   # a scalar broadcast
        n = n.srcs[0]
    return n.arg if n.op is Op.CONST else None


def _const(n: Node) -> float | None:
    return float(_literal(n)) if n.dtype.is_float and _literal(n) is not None else None  # type: ignore[arg-type]


def _causal(cond: Node, labels: Labels, keep_when: bool) -> bool:
    """Whether the scores kept (where cond equals keep_when) are exactly those with j <= i."""
    cond, labels = _through(cond, labels)
    false = [x is not None and not x for x in map(_literal, cond.srcs)]
    if cond.op is Op.CMPEQ and cond.srcs[0].dtype is dt.bool_ and any(false):   # a negation
        cond = cond.srcs[1] if false[0] else cond.srcs[0]
        keep_when = not keep_when
    if cond.op is not Op.CMPLT or keep_when:   # kept where not (x < y): x must be i and y j
        return False
    names = []
    for s in cond.srcs:
        while s.op is Op.CAST and not s.dtype.is_float:
            s = s.srcs[0]
        names.append(labels[s.arg] if s.op is Op.IOTA and s.shape == cond.shape else None)
    return names == ["i", "j"]


@dataclass
class _Scores:
    sum: Node          # the SUM over d of q and k
    labels: Labels     # its axes
    scale: float       # c1
    causal: bool


def _scores(s: Node, labels: Labels) -> _Scores | None:
    """The raw scores under an optional causal mask and a positive scale."""
    s, labels = _through(s, labels)
    causal = False
    if s.op is Op.WHERE:
        cond, a, b = s.srcs
        ca, cb = _const(a), _const(b)
        if cb is not None and cb <= MASKED:
            keep_when, s = True, a
        elif ca is not None and ca <= MASKED:
            keep_when, s = False, b
        else:
            return None
        if not _causal(cond, list(labels), keep_when):
            return None
        causal = True
        s, labels = _through(s, labels)
    scale = 1.0
    while s.op in (Op.MUL, Op.DIV):
        x, y = s.srcs
        if s.op is Op.MUL and _const(x) is not None:
            x, y = y, x
        c = _const(y)
        if c is None or c <= 0 or not math.isfinite(c):
            return None
        scale = scale * c if s.op is Op.MUL else scale / c
        s, labels = _through(x, labels)
    if s.op is not Op.SUM or len(s.arg) != 1:
        return None
    return _Scores(s, labels, scale, causal)


def _match(o_sum: Node, o_only: bool = False) -> Node | None:
    """The replacement of attention's second contraction o_sum, or None if it is not one;
    o_only: the graph takes no gradient (16-bit operands then give o alone)."""
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
        out = _match_sides(o_sum, lab, p_op, v_op, o_only)
        if out is not None:
            return out
    return None


def _match_sides(o_sum: Node, lab: Labels, p_op: Node, v_op: Node, o_only: bool) -> Node | None:
    prod = o_sum.srcs[0]
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
    if t.op is not Op.SUB or c2 <= 0 or not math.isfinite(c2):
        return None
    s, mx = t.srcs
    mx, _ = _through(mx, list(labels))
    if mx.op is not Op.RMAX or mx.srcs[0] is not s or mx.arg != den.arg:
        return None
    sc = _scores(s, list(labels))
    if sc is None:
        return None
    (kax,) = sc.sum.arg
    qk_lab = list(sc.labels)
    qk_lab[kax] = "k"
    qk = sc.sum.srcs[0]
    found = _operands(qk, kax)
    if found is None or None in [x for x, d in zip(qk_lab, qk.shape) if d > 1]:
        return None
    x, y, x_wide, y_wide = found
    q_op, k_op = (x, y) if qk_lab[x_wide] == "j" and qk_lab[y_wide] == "i" else \
        (y, x) if qk_lab[y_wide] == "j" and qk_lab[x_wide] == "i" else (None, None)
    if q_op is None or k_op is None or q_op.dtype is not v_op.dtype or k_op.dtype is not v_op.dtype:
        return None
    size = {x: d for x, d in zip(lab, prod.shape) if x is not None}
    size.update({x: d for x, d in zip(qk_lab, qk.shape) if x is not None})
    batch = [x for x in lab if x is not None and x.startswith("b")]
    n = math.prod(size[b] for b in batch)
    t_len, s_len, d, dv = size.get("i"), size.get("j"), size.get("k"), size.get("d")
    if t_len is None or s_len is None or d != dv or d not in HEAD_DIMS:
        return None
    q = _gather(q_op.srcs[0], [x if x != "j" else None for x in qk_lab], batch + ["i", "k"], (n, t_len, d))
    k = _gather(k_op.srcs[0], [x if x != "i" else None for x in qk_lab], batch + ["j", "k"], (n, s_len, d))
    v = _gather(v_op.srcs[0], [x if x != "i" else None for x in lab], batch + ["j", "d"], (n, s_len, d))
    if q is None or k is None or v is None:
        return None
    arg = ("attention", sc.causal, sc.scale * c2)
    order = [x for a, x in enumerate(lab) if x is not None and a not in o_sum.arg]
    axes = tuple((batch + ["i", "d"]).index(x) for x in order)
    o_only = o_only and q.dtype is not dt.f32
    if o_only and axes == tuple(range(len(axes))):   # o in the layout asked for: the kernel's output as is
        o = Node(Op.FUSED, q.dtype, (q, k, v), arg, o_sum.shape)
    else:
        o = Node(Op.FUSED, q.dtype, (q, k, v), arg, (n, t_len, d)) if o_only else \
            ir.shrink(Node(Op.FUSED, dt.f32, (q, k, v), arg, (n, t_len, d + 1)), (0, 0, 0), (n, t_len, d))
        o = ir.permute(ir.reshape(o, tuple(size[b] for b in batch) + (t_len, d)), axes)
        o = ir.reshape(o, o_sum.shape)
    return o if o.dtype is o_sum.dtype else ir.unary(Op.CAST, o, o_sum.dtype)


def fuse(outputs: list[Node]) -> list[Node]:
    """The graph with every attention of f16, bf16 or f32 operands and head size 64 or 128
    replaced by the flash kernels. Left alone when a gradient is taken of a gradient (the
    backward kernels have no gradient of their own)."""
    nodes = toposort(outputs)
    grads = [n for n in nodes if n.op is Op.GRAD]
    if grads and any(n.op is Op.GRAD for n in toposort([g.srcs[0] for g in grads])):
        return outputs
    if not any(n.op is Op.SUM and n.dtype in OPERANDS for n in nodes):
        return outputs
    return rewrite(outputs, RuleSet([(P(Op.SUM, name="o_sum"), lambda o_sum: _match(o_sum, not grads))]))


def vjp(n: Node, g: Node) -> list[tuple[Node, Node]]:
    """The gradients of q, k and v from the gradient g of the packed [N, T, D + 1] output."""
    kind, causal, c = n.arg
    assert kind == "attention", "the backward kernels have no gradient (fuse leaves grads of grads alone)"
    q, k, v = n.srcs
    size, t_len, d = q.shape
    s_len = k.shape[1]
    do = ir.shrink(g, (0, 0, 0), (size, t_len, d))
    o = ir.shrink(n, (0, 0, 0), (size, t_len, d))
    di = ir.reshape(ir.reduce(Op.SUM, ir.binary(Op.MUL, do, o), (2,)), (size, t_len))   # rowsum(dO * O)
    srcs = (q, k, v, n, do if q.dtype is dt.f32 else ir.unary(Op.CAST, do, q.dtype), di)
    # in the operands' dtype, rounded once from the f32 accumulators as a cast would: half the
    # bytes to write, and to read where they are put back together (GPT-2's qkv gradient)
    dq = Node(Op.FUSED, q.dtype, srcs, ("attention_dq", causal, c), (size, t_len, d))
    dkv = Node(Op.FUSED, q.dtype, srcs, ("attention_dkdv", causal, c), (size, s_len, 2 * d))
    dk = ir.shrink(dkv, (0, 0, 0), (size, s_len, d))
    dv = ir.shrink(dkv, (0, 0, d), (size, s_len, 2 * d))
    return [(q, dq), (k, dk), (v, dv)]


# ---------------------------------------------------------------- the flash kernels' plans

@dataclass(frozen=True)
class FlashPlan:
    """A flash kernel's plan, chosen by optimize for the target (backend/flash.py renders it)."""
    rows: int             # rows a block owns: queries (dk|dv: keys)
    tile: int             # rows of each tile streamed past them
    threads: int
    wgmma: bool = False   # sm_90a: every product on wgmma (EmberWg<true>)
    heads: int = 0        # the warp-specialized kernels (TMA): the heads q, k, v are seen in; 0: cp.async

    def __str__(self) -> str:
        how = f"warp-specialized, {self.heads} heads" if self.heads else "wgmma" if self.wgmma else "mma.sync"
        return f"flash: {self.rows} rows, tiles of {self.tile}, {self.threads} threads, {how}"


THREADS = 128   # 4 warps
# kind -> head size -> (rows a block owns, rows of each tile streamed past them), the templates'
# ROWS and TILE: the forward's block is 2 tiles of 16 query rows per warp, so each K fragment
# loaded serves both; D = 128 streams shorter tiles where the accumulators would not fit in
# registers otherwise
TILES = {"attention": {64: (128, 64), 128: (128, 32)},
         "attention_dq": {64: (64, 64), 128: (64, 64)},
         "attention_dkdv": {64: (64, 64), 128: (64, 32)}}


HOPPER_ROWS, HOPPER_THREADS = 128, 256   # sm_90a's forward: two warpgroups of 64 rows
HOPPER_TILE = {64: 128, 128: 64}   # its keys per tile, by head size (D = 128: 160 KB of tiles at 128, one block an SM)


# f32 operands (CUDA cores): kind -> head size -> (rows a block owns, rows of each tile streamed
# past them); the forward's threads hold two rows each, the backward's one; 32 KB of tiles
TILES32 = {"attention": {64: (64, 32), 128: (32, 16)},
           "attention_dq": {64: (32, 32), 128: (16, 16)},
           "attention_dkdv": {64: (32, 32), 128: (16, 16)}}


# the warp-specialized kernels (ember_flash_*_ws, sm_90a): 128 rows a block, tiles of this many
# rows streamed past them (the forward's keys; the backward's keys for dq, queries for dk|dv)
WS_TILE = {"attention": 128, "attention_dq": 64, "attention_dkdv": 64}
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
    if not gpu.wgmma:
        return FlashPlan(*TILES[kind][d], THREADS)
    heads = {v.heads for v in views[:3] if v is not None and v.heads > 1}
    if len(heads) <= 1 and warp_specialized:
        return FlashPlan(HOPPER_ROWS, WS_TILE[kind], WS_THREADS, True, heads.pop() if heads else 1)
    if kind == "attention":
        return FlashPlan(HOPPER_ROWS, HOPPER_TILE[d], HOPPER_THREADS, True)
    return FlashPlan(*TILES[kind][d], THREADS, True)
