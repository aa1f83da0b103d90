"""Online reductions: a max and the sums weighted by exp2((s - max) * c), in one loop.

Softmax and attention are written as a max over j, then sums over j whose terms hold
exp2((s_j - max) * c): the sum of those exponentials (softmax's denominator, logsumexp) and
the weighted sum of v_j (attention's output). Lowered as they are, each is a loop of its own,
and each loop computes s_j again. Since exp2((s - m') c) = exp2((s - m) c) * exp2((m - m') c),
the sums can run with the running max m and be rescaled whenever m grows:

    m' = max(m, s_j);  r = exp2((m - m') c);  acc = acc * r + exp2((s_j - m') c) * h_j

which after the last j is the sum with the final max. One loop then computes every s_j once
(attention: O(S*D) memory and S*S scores instead of three times that). A factor of a term that
does not depend on j (attention's 1/denominator) is applied after the loop instead.

The rewrite is exact in real arithmetic; in floating point it rounds differently from the
three loops (an f32 result moves by a few ulp, and a weight that underflows to 0 there may stay
a tiny positive number here: times an inf of v, inf where the reference has 0 * inf = NaN),
so it is made for f32 and f64 values only:
f16/bf16 are rounded after every op by the spec, and no rescaling keeps that. Rows whose
scores are all -inf have the reference's NaN (every term is exp2(nan)); terms seen while the
running max is still -inf add nothing, as they would with the final max.

A causal mask (the scores are where(j <= i, s, -inf), or any comparison of j with an index free
of it) ends the loop at the diagonal: the terms past it are exp2(-inf) * h = 0 * h and leave
the max alone. Their scores are not computed; a short loop adds 0 * h for them, which is 0
unless h (attention's v) holds an inf or a NaN there, as in the reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import dtype as dt
from ..ir import Node, Op, toposort
from . import symbolic as sym
from .lower import Kernel, free_ranges
from .rewrite import substitute

LANES = 256   # a sum may depend on output ranges the max does not (attention's d) up to this many lanes


@dataclass(eq=False)
class Online:
    """The running max, the factor c, and the sums that run in its loop (over the max's range)."""
    max: Node              # REDUCE(RMAX, (s,), (j,))
    scale: Node            # CONST c of exp2((s - max) * c)
    sums: list[Node]       # REDUCE(SUM, (exp2((s - max) * c) * h,), (j,))
    exp: Node              # their exp2((s - max) * c), one node
    others: list[Node | None]   # each sum's h (None: 1)
    stop: Node | None = None    # s_j is -inf for every j >= stop (a causal mask): the loop ends there


def _exp_scale(e: Node, m: Node) -> tuple[Node, Node] | None:
    """(c, s) when e is exp2((s - m) * c), or exp2(s - m) with c = 1."""
    if e.op is not Op.EXP2:
        return None
    x = e.srcs[0]
    if x.op is Op.SUB and x.srcs[1] is m:
        return Node(Op.CONST, x.dtype, (), 1.0), x.srcs[0]
    if x.op is Op.MUL:
        a, b = x.srcs
        diff, c = (a, b) if b.op is Op.CONST else (b, a)
        if c.op is Op.CONST and diff.op is Op.SUB and diff.srcs[1] is m:
            return c, diff.srcs[0]
    return None


def _same(a: Node, b: Node, bound: dict[Node, Node], budget: list[int]) -> bool:
    """a and b compute the same, up to the names of the ranges their reductions bind (each
    lowered copy of a score gets ranges of its own)."""
    if a is b:
        return True
    budget[0] -= 1
    if budget[0] < 0 or a.op is not b.op or a.dtype is not b.dtype or len(a.srcs) != len(b.srcs):
        return False
    if a.op is Op.RANGE:
        return bound.get(a) is b
    if a.op is Op.REDUCE:
        ra, rb = a.arg[1], b.arg[1]
        if a.arg[0] is not b.arg[0] or [r.arg[1] for r in ra] != [r.arg[1] for r in rb]:
            return False
        bound = {**bound, **dict(zip(ra, rb))}
    elif a.arg != b.arg:
        return False
    return all(_same(x, y, bound, budget) for x, y in zip(a.srcs, b.srcs))


def _index(n: Node, j: Node) -> tuple[bool, Node] | None:
    """(whether n is j, else n as an index free of j) through widening casts of indices."""
    while n.op is Op.CAST and n.srcs[0].dtype is sym.INDEX and n.dtype in (dt.i32, dt.i64):
        n = n.srcs[0]
    if n is j:
        return True, n
    return (False, n) if n.dtype is sym.INDEX and j not in free_ranges(n)[n] else None


def _stop(s: Node, j: Node) -> Node | None:
    """An index b (free of j) such that s_j is -inf for every j >= b: s is where(c, x, -inf)
    with c meaning j < b or j <= a, or where(c, -inf, x) with c meaning a < j or j >= b."""
    if s.op is not Op.WHERE:
        return None
    c, x, y = s.srcs
    masked_when_true = x.op is Op.CONST and x.arg == -math.inf
    if not masked_when_true and not (y.op is Op.CONST and y.arg == -math.inf):
        return None
    negated = c.op is Op.CMPEQ and c.srcs[1].op is Op.CONST and c.srcs[1].arg in (0, False)
    if negated:
        c = c.srcs[0]
    if c.op is not Op.CMPLT:
        return None
    left, right = _index(c.srcs[0], j), _index(c.srcs[1], j)
    if left is None or right is None or left[0] == right[0]:
        return None
    keep_when = negated == masked_when_true   # the comparison's value for the kept scores
    if left[0] and keep_when:          # kept while j < b
        return right[1]
    if right[0] and not keep_when:     # kept while not (a < j): j <= a
        return sym.add(left[1], sym.const(1))
    return None


def _factors(body: Node, j: Node) -> tuple[list[Node], list[Node]]:
    """body as a product: (its factors, its divisors that do not depend on j)."""
    deps = free_ranges(body)
    num, den, stack = [], [], [body]
    while stack:
        n = stack.pop()
        if n.op is Op.MUL:
            stack.extend(n.srcs)
        elif n.op is Op.DIV and j not in deps[n.srcs[1]]:
            stack.append(n.srcs[0])
            den.append(n.srcs[1])
        else:
            num.append(n)
    return num, den


def _product(d: dt.DType, factors: list[Node]) -> Node | None:
    out = None
    for f in factors:
        out = f if out is None else Node(Op.MUL, d, (out, f))
    return out


def find(k: Kernel) -> Online | None:
    """Rewrite k so that one max and the sums weighted by its exponentials run in one loop
    (k.store changes; the returned record says which nodes the renderer emits together)."""
    nodes = toposort([k.store])
    for m in nodes:
        if m.op is not Op.REDUCE or m.arg[0] is not Op.RMAX or len(m.arg[1]) != 1 or m.dtype not in (dt.f32, dt.f64):
            continue
        found = _rewrite(k, m, nodes)
        if found is not None:
            return found
    return None


def _rewrite(k: Kernel, m: Node, nodes: list[Node]) -> Online | None:
    (j,), s = m.arg[1], m.srcs[0]
    users = [r for r in nodes if r.op is Op.REDUCE and r is not m and m in toposort([r.srcs[0]])]
    if not users:
        return None
    mapping: dict[Node, Node] = {}
    sums: list[Node] = []
    others: list[Node | None] = []
    exp: Node | None = None
    scale: Node | None = None
    deps = free_ranges(k.store)
    for r in users:   # toposort order: a sum that divides by another comes after it
        if not any(x in deps[n] for x in r.arg[1] for n in toposort([r.srcs[0]]) if m in n.srcs):
            continue   # it reads the finished max (cross-entropy's pick of log-probabilities): after the loop
        if r.arg[0] is not Op.SUM or len(r.arg[1]) != 1 or r.arg[1][0].arg[1] != j.arg[1] or r.dtype is not m.dtype:
            return None
        (body,) = substitute([r.srcs[0]], {r.arg[1][0]: j})
        num, den = _factors(body, j)
        exps = [f for f in num if m in toposort([f])]
        if len(exps) != 1 or len({f.dtype for f in num + den} - {m.dtype}):
            return None
        found = _exp_scale(exps[0], m)
        if found is None or (scale is not None and found[0] is not scale):
            return None
        scale, s2 = found
        if not _same(s, s2, {}, [4096]):
            return None
        (e,) = substitute([exps[0]], {s2: s})   # the max's own score: computed once per j
        rest = [f for f in num if f is not exps[0]]
        extra = deps[r] - deps[m]   # output ranges the sum needs beyond the max's: whole lanes
        if any(x not in k.ranges for x in extra) or math.prod(x.arg[1] for x in extra) > LANES:
            return None
        if sums and e is not exp:
            return None
        exp = e
        new = Node(Op.REDUCE, r.dtype, (_product(r.dtype, [e, *rest]),), (Op.SUM, (j,)))
        sums.append(new)
        others.append(_product(r.dtype, rest))
        divisor = _product(r.dtype, substitute(den, mapping) if den else [])
        mapping[r] = new if divisor is None else Node(Op.DIV, r.dtype, (new, divisor))
    if scale is None:
        return None
    k.store = _replace(k.store, mapping)
    k.lanes = k.lanes | frozenset(x for r in sums for x in free_ranges(r)[r] - deps[m])
    assert exp is not None
    return Online(m, scale, sums, exp, others, _stop(s, j))


def _replace(root: Node, mapping: dict[Node, Node]) -> Node:
    """root with the nodes of mapping replaced, matched before their sources change (a sum that
    divides by a replaced sum is itself replaced)."""
    done: dict[Node, Node] = {}
    for n in toposort([root]):
        if n in mapping:
            done[n] = mapping[n]
            continue
        srcs = tuple(done.get(x, x) for x in n.srcs)
        done[n] = n if srcs == n.srcs else Node(n.op, n.dtype, srcs, n.arg, n.shape)
    return done[root]

