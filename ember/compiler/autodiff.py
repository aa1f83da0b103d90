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

from .. import data, ir
from .. import dtype as dt
from ..ir import Node, Op, toposort
from . import attention
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


def vjp(n: Node, g: Node) -> list[tuple[Node, Node]]:
    """(source, gradient of the source) for each float source of n, given n's gradient g."""
    op, s = n.op, n.srcs
    if op is Op.NEG:
        return [(s[0], ir.unary(Op.NEG, g))]
    if op is Op.RECIP:
        return [(s[0], ir.unary(Op.NEG, _mul(g, _mul(n, n))))]
    if op is Op.SQRT:
        return [(s[0], ir.binary(Op.DIV, _mul(g, full(0.5, n)), n))]
    if op is Op.EXP2:
        return [(s[0], _mul(g, _mul(n, full(LN2, n))))]
    if op is Op.LOG2:
        return [(s[0], ir.binary(Op.DIV, g, _mul(s[0], full(LN2, n))))]
    if op is Op.SIN:  # cos x = sin(x + pi/2), the shift in f32 at least: in bf16, x + pi/2 rounds
        x = s[0] if s[0].dtype.bits >= 32 else ir.unary(Op.CAST, s[0], dt.f32)  # by up to 1 at |x| ~ 256
        cos = ir.unary(Op.SIN, ir.binary(Op.ADD, x, full(math.pi / 2, x)))
        return [(s[0], _mul(g, cos if cos.dtype is n.dtype else ir.unary(Op.CAST, cos, n.dtype)))]
    if op is Op.CAST:
        return [(s[0], ir.unary(Op.CAST, g, s[0].dtype))] if s[0].dtype.is_float else []
    if op is Op.ADD:
        return [(s[0], g), (s[1], g)]
    if op is Op.SUB:
        return [(s[0], g), (s[1], ir.unary(Op.NEG, g))]
    if op is Op.MUL:
        return [(s[0], _mul(g, s[1])), (s[1], _mul(g, s[0]))]
    if op is Op.DIV:
        return [(s[0], ir.binary(Op.DIV, g, s[1])), (s[1], ir.unary(Op.NEG, ir.binary(Op.DIV, _mul(g, n), s[1])))]
    if op is Op.MAX and n.dtype.is_float:  # the second operand takes the rest: all of it when unordered (NaN)
        share = _tie_share(s[0], s[1])
        return [(s[0], _mul(g, share)), (s[1], _mul(g, ir.binary(Op.SUB, full(1.0, share), share)))]
    if op is Op.WHERE:
        zero = full(0.0, g)
        return [(s[1], ir.where(s[0], g, zero)), (s[2], ir.where(s[0], zero, g))]
    if op is Op.RESHAPE:
        return [(s[0], ir.reshape(g, s[0].shape))]
    if op is Op.PERMUTE:
        inverse = tuple(n.arg.index(d) for d in range(len(n.arg)))
        return [(s[0], ir.permute(g, inverse))]
    if op is Op.EXPAND:
        axes = tuple(d for d, (a, b) in enumerate(zip(s[0].shape, n.shape)) if a != b)
        return [(s[0], ir.reduce(Op.SUM, g, axes))]
    if op is Op.PAD:
        before = n.arg[0]
        return [(s[0], ir.shrink(g, before, tuple(b + d for b, d in zip(before, s[0].shape))))]
    if op is Op.SHRINK:
        start, end = n.arg
        return [(s[0], ir.pad(g, start, tuple(d - e for d, e in zip(s[0].shape, end)), 0.0))]
    if op is Op.FLIP:
        return [(s[0], ir.flip(g, n.arg))]
    if op is Op.SUM:
        return [(s[0], ir.expand(g, s[0].shape))]
    if op is Op.FUSED:
        return attention.vjp(n, g)
    if op is Op.RMAX and n.dtype.is_float:  # split equally among the elements equal to the max
        x = s[0]
        hit = ir.binary(Op.CMPEQ, x, ir.expand(n, x.shape))
        count = ir.reduce(Op.SUM, ir.unary(Op.CAST, hit, x.dtype), n.arg)
        return [(x, ir.where(hit, ir.expand(ir.binary(Op.DIV, g, count), x.shape), full(0.0, x)))]
    return []  # trunc, comparisons, integer ops, bitcasts, sources: no gradient


def derivative(y: Node, x: Node) -> Node:
    """d(sum of all elements of y)/dx as ordinary ops (zeros if y does not depend on x)."""
    order = toposort([y])
    depends: set[Node] = set()
    for n in order:
        if n is x or any(s in depends for s in n.srcs):
            depends.add(n)
    if y not in depends or not y.dtype.is_float:
        return full(0.0, x)
    pending: dict[Node, list[Node]] = {y: [full(1.0, y)]}
    for n in reversed(order):
        if n not in pending or n is x:
            continue
        parts = pending.pop(n)
        g = parts[0]
        for p in parts[1:]:
            g = ir.binary(Op.ADD, g, p)
        for src, gs in vjp(n, g):
            if src in depends and src.dtype.is_float:
                pending.setdefault(src, []).append(gs)
    parts = pending.get(x, [full(0.0, x)])
    g = parts[0]
    for p in parts[1:]:
        g = ir.binary(Op.ADD, g, p)
    return g


RULES = RuleSet([(P(Op.GRAD, P(name="y"), P(name="x")), derivative)])


def expand_grads(outputs: list[Node]) -> list[Node]:
    """The graph with every grad node replaced by the ops that compute it."""
    if not any(n.op is Op.GRAD for n in toposort(outputs)):
        return outputs
    return rewrite(outputs, RULES)
