"""Automatic differentiation: `grad y x` (spec section 4) rewritten into ordinary ops.

Reverse mode over y's graph: the gradient of sum(y) starts as ones, and each node passes its
gradient to its sources by the rules below (vector-Jacobian products). Conventions of the
spec: max (elementwise and reduction) splits the gradient equally among ties; where sends it
to the chosen branch only and none to the condition; trunc, comparisons, integer ops and casts
to non-float dtypes pass none; a cast between floats casts the gradient back. Because the
rewrite runs bottom-up, a grad inside y's graph is already ordinary ops when the outer grad is
taken, so second derivatives work wherever the rules are differentiable again.
"""
from __future__ import annotations

import math
from typing import Callable

from .. import data, ir
from .. import dtype as dt
from ..ir import Node, Op, toposort
from .rewrite import P, RuleSet, rewrite

LN2 = math.log(2.0)


def full(v: float, like: Node) -> Node:
    return ir.const(data.literal_value(v, like.dtype, truncate=True), like.dtype, like.shape)


def _mul(a: Node, b: Node) -> Node:
    return ir.binary(Op.MUL, a, b)


def _tie_share(x: Node, y: Node) -> Node:
    """1 where x > y, 1/2 where x == y, 0 elsewhere: x's share of an elementwise max's gradient."""
    half = ir.where(ir.binary(Op.CMPEQ, x, y), full(0.5, x), full(0.0, x))
    return ir.where(ir.binary(Op.CMPLT, y, x), full(1.0, x), half)


def _sin(n: Node, g: Node) -> list[tuple[Node, Node]]:
    # cos x = sin(x + pi/2), the shift in f32 at least: in bf16, x + pi/2 rounds by up to 1 at |x| ~ 256
    s = n.srcs
    x = s[0] if s[0].dtype.bits >= 32 else ir.unary(Op.CAST, s[0], dt.f32)
    cos = ir.unary(Op.SIN, ir.binary(Op.ADD, x, full(math.pi / 2, x)))
    return [(s[0], _mul(g, cos if cos.dtype is n.dtype else ir.unary(Op.CAST, cos, n.dtype)))]


def _max(n: Node, g: Node) -> list[tuple[Node, Node]]:
    if not n.dtype.is_float:
        return []
    share = _tie_share(*n.srcs)   # the second operand takes the rest: all of it when unordered (NaN)
    return [(n.srcs[0], _mul(g, share)), (n.srcs[1], _mul(g, ir.binary(Op.SUB, full(1.0, share), share)))]


def _where(n: Node, g: Node) -> list[tuple[Node, Node]]:
    c, zero = n.srcs[0], full(0.0, g)
    return [(n.srcs[1], ir.where(c, g, zero)), (n.srcs[2], ir.where(c, zero, g))]


def _rmax(n: Node, g: Node) -> list[tuple[Node, Node]]:
    if not n.dtype.is_float:
        return []
    x = n.srcs[0]   # split equally among the elements equal to the max
    hit = ir.binary(Op.CMPEQ, x, ir.expand(n, x.shape))
    count = ir.reduce(Op.SUM, ir.unary(Op.CAST, hit, x.dtype), n.arg)
    return [(x, ir.where(hit, ir.expand(ir.binary(Op.DIV, g, count), x.shape), full(0.0, x)))]


def _expanded(n: Node) -> tuple[int, ...]:
    return tuple(d for d, (a, b) in enumerate(zip(n.srcs[0].shape, n.shape)) if a != b)


Rule = Callable[[Node, Node], "list[tuple[Node, Node]]"]
# op -> (n, its gradient g) -> (source, the source's gradient) for each float source (FUSED:
# compiler/attention.py adds the flash kernels' own, the only maker of those nodes); an op
# without a rule (trunc, comparisons, integer ops, bitcasts, sources) passes no gradient
VJP: dict[Op, Rule] = {
    Op.NEG: lambda n, g: [(n.srcs[0], ir.unary(Op.NEG, g))],
    Op.RECIP: lambda n, g: [(n.srcs[0], ir.unary(Op.NEG, _mul(g, _mul(n, n))))],
    Op.SQRT: lambda n, g: [(n.srcs[0], ir.binary(Op.DIV, _mul(g, full(0.5, n)), n))],
    Op.EXP2: lambda n, g: [(n.srcs[0], _mul(g, _mul(n, full(LN2, n))))],
    Op.LOG2: lambda n, g: [(n.srcs[0], ir.binary(Op.DIV, g, _mul(n.srcs[0], full(LN2, n))))],
    Op.SIN: _sin,
    Op.CAST: lambda n, g: [(n.srcs[0], ir.unary(Op.CAST, g, n.srcs[0].dtype))] if n.srcs[0].dtype.is_float else [],
    Op.ADD: lambda n, g: [(n.srcs[0], g), (n.srcs[1], g)],
    Op.SUB: lambda n, g: [(n.srcs[0], g), (n.srcs[1], ir.unary(Op.NEG, g))],
    Op.MUL: lambda n, g: [(n.srcs[0], _mul(g, n.srcs[1])), (n.srcs[1], _mul(g, n.srcs[0]))],
    Op.DIV: lambda n, g: [(n.srcs[0], ir.binary(Op.DIV, g, n.srcs[1])),
                          (n.srcs[1], ir.unary(Op.NEG, ir.binary(Op.DIV, _mul(g, n), n.srcs[1])))],
    Op.MAX: _max,
    Op.WHERE: _where,
    Op.RESHAPE: lambda n, g: [(n.srcs[0], ir.reshape(g, n.srcs[0].shape))],
    Op.PERMUTE: lambda n, g: [(n.srcs[0], ir.permute(g, tuple(n.arg.index(d) for d in range(len(n.arg)))))],
    Op.EXPAND: lambda n, g: [(n.srcs[0], ir.reduce(Op.SUM, g, _expanded(n)))],
    Op.PAD: lambda n, g: [(n.srcs[0], ir.shrink(g, n.arg[0], tuple(b + d for b, d in zip(n.arg[0], n.srcs[0].shape))))],
    Op.SHRINK: lambda n, g: [(n.srcs[0], ir.pad(g, n.arg[0], tuple(d - e for d, e in zip(n.srcs[0].shape, n.arg[1])),
                                                0.0))],
    Op.FLIP: lambda n, g: [(n.srcs[0], ir.flip(g, n.arg))],
    Op.SUM: lambda n, g: [(n.srcs[0], ir.expand(g, n.srcs[0].shape))],
    Op.RMAX: _rmax,
}


def vjp(n: Node, g: Node) -> list[tuple[Node, Node]]:
    """(source, gradient of the source) for each float source of n, given n's gradient g."""
    rule = VJP.get(n.op)
    return rule(n, g) if rule else []


def derivative(y: Node, x: Node) -> Node:
    """d(sum of all elements of y)/dx as ordinary ops (zeros if y does not depend on x)."""
    return gradients(y, {x})[x]


def gradients(y: Node, xs: set[Node]) -> dict[Node, Node]:
    """derivative(y, x) for each x in xs, from one reverse sweep over y's graph: the gradient
    reaching a node is the sum of its users' contributions whichever x it depends on, so the
    sweep for many (a model's parameters) builds the same nodes as one for each, once."""
    order = toposort([y])
    depends: set[Node] = set()
    for n in order:
        if n in xs or any(s in depends for s in n.srcs):
            depends.add(n)
    out = {x: full(0.0, x) for x in xs}
    if y not in depends or not y.dtype.is_float:
        return out
    pending: dict[Node, list[Node]] = {y: [full(1.0, y)]}
    for n in reversed(order):
        if n not in pending:
            continue
        parts = pending.pop(n)
        g = parts[0]
        for p in parts[1:]:
            g = ir.binary(Op.ADD, g, p)
        if n in xs:
            out[n] = g
        if not any(s in depends for s in n.srcs):
            continue
        for src, gs in vjp(n, g):
            if src in depends and src.dtype.is_float:
                pending.setdefault(src, []).append(gs)
    return out


def expand_grads(outputs: list[Node]) -> list[Node]:
    """The graph with every grad node replaced by the ops that compute it; the grads of one y
    (a loss and its parameters) share one sweep."""
    wanted: dict[Node, set[Node]] = {}
    for n in toposort(outputs):
        if n.op is Op.GRAD:
            wanted.setdefault(n.srcs[0], set()).add(n.srcs[1])
    if not wanted:
        return outputs
    swept: dict[Node, dict[Node, Node]] = {}

    def expand(y: Node, x: Node) -> Node:
        if x not in swept.get(y, {}):   # y or x changed by an inner grad's rewrite: sweep again
            swept[y] = gradients(y, wanted.get(y, set()) | set(swept.get(y, {})) | {x})
        return swept[y][x]
    return rewrite(outputs, RuleSet([(P(Op.GRAD, P(name="y"), P(name="x")), expand)]))
