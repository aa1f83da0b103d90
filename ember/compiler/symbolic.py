"""Symbolic index arithmetic: the integer expressions that address memory inside a kernel.

Index expressions are scalar i32 nodes built from RANGE (a loop variable, arg = (name, size)),
CONST, ADD, MUL, IDIV, MOD, CMPLT, AND and WHERE. `simplify` rewrites them with the rules below,
which use value bounds of every subexpression (from the ranges' sizes) to fold divisions and
remainders: `(4*i + j) // 4` becomes `i` when 0 <= j < 4. Division follows C (truncation), so
the div/mod rules only fire where the dividend is known to be >= 0.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from functools import reduce
from typing import Iterator
from weakref import WeakKeyDictionary

from .. import dtype as dt
from ..ir import Node, Op, toposort
from .rewrite import P, RuleSet, rewrite, substitute

INDEX = dt.i32


def const(v: int, dtype: dt.DType = INDEX) -> Node:
    return Node(Op.CONST, dtype, (), int(v))


def index_type(count: int) -> dt.DType:
    """Index arithmetic is i32, and i64 where it counts to 2^31 or more (spec 2: values that
    are not stored may have up to 2^62 - 1 elements)."""
    return dt.i64 if count >= 1 << 31 else INDEX


def rng(name: str, size: int) -> Node:
    """A loop variable running over [0, size)."""
    return Node(Op.RANGE, index_type(size), (), (name, size))


def add(a: Node, b: Node) -> Node:
    return Node(Op.ADD, a.dtype, (a, b))


def mul(a: Node, b: Node) -> Node:
    return Node(Op.MUL, a.dtype, (a, b))


def idiv(a: Node, c: int) -> Node:
    return Node(Op.IDIV, a.dtype, (a, const(c, a.dtype)))


def mod(a: Node, c: int) -> Node:
    return Node(Op.MOD, a.dtype, (a, const(c, a.dtype)))


def lt(a: Node, b: Node) -> Node:
    return Node(Op.CMPLT, dt.bool_, (a, b))


def and_(a: Node | None, b: Node | None) -> Node | None:
    """Conjunction of validity conditions; None means always valid."""
    if a is None:
        return b
    if b is None:
        return a
    return Node(Op.AND, dt.bool_, (a, b))


def true() -> Node:
    return Node(Op.CONST, dt.bool_, (), 1)


# ------------------------------------------------------------------------------------ bounds

_bounds: "WeakKeyDictionary[Node, tuple[int, int]]" = WeakKeyDictionary()


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def bounds(n: Node) -> tuple[int, int]:
    """Smallest and largest value n can take. Falls back to the dtype's range when the arithmetic
    could leave it (then it would have wrapped, and tighter bounds would be wrong)."""
    got = _bounds.get(n)
    if got is not None:
        return got
    lo, hi = n.dtype.min, n.dtype.max
    if n.dtype.is_int or n.dtype is dt.bool_:
        for s in n.srcs:  # sources first, iteratively: expressions may be deep
            if s not in _bounds:
                for m in _postorder(s):
                    bounds(m)
        b = _compute(n)
        if b is not None and lo <= b[0] <= b[1] <= hi:
            lo, hi = b
    _bounds[n] = (lo, hi)
    return lo, hi


def _postorder(root: Node) -> list[Node]:
    return [m for m in toposort([root]) if m not in _bounds]


def _compute(n: Node) -> tuple[int, int] | None:
    op = n.op
    if op is Op.CONST:
        return int(n.arg), int(n.arg)
    if op is Op.RANGE:
        return 0, n.arg[1] - 1
    if op in (Op.CMPLT, Op.CMPEQ, Op.CMPNE) or n.dtype is dt.bool_:
        return 0, 1
    if not n.srcs:
        return None
    a = bounds(n.srcs[0])
    if op is Op.CAST and n.srcs[0].dtype.is_int:   # widened to i64 (the caller checks that it fits)
        return a
    if op is Op.NEG:
        return -a[1], -a[0]
    if op is Op.WHERE:
        x, y = bounds(n.srcs[1]), bounds(n.srcs[2])
        return min(x[0], y[0]), max(x[1], y[1])
    if len(n.srcs) != 2:
        return None
    b = bounds(n.srcs[1])
    if op is Op.ADD:
        return a[0] + b[0], a[1] + b[1]
    if op is Op.SUB:
        return a[0] - b[1], a[1] - b[0]
    if op is Op.MUL:
        products = [x * y for x in a for y in b]
        return min(products), max(products)
    if op in (Op.IDIV, Op.MOD) and b[0] == b[1] and b[0] > 0:
        c = b[0]
        if op is Op.IDIV:
            return _tdiv(a[0], c), _tdiv(a[1], c)
        if a[0] >= 0:
            return (a[0], a[1]) if a[1] < c else (0, c - 1)
        return (-(c - 1), c - 1) if a[1] > 0 else (-(c - 1), 0)
    if op is Op.MAX:
        return max(a[0], b[0]), max(a[1], b[1])
    if op is Op.AND and a[0] >= 0 and b[0] >= 0:  # clearing bits of non-negative values
        return 0, min(a[1], b[1])
    return None


# ------------------------------------------------------------------------------ linear forms

_sort_keys: "WeakKeyDictionary[Node, tuple]" = WeakKeyDictionary()


def sort_key(n: Node) -> tuple:
    """A structural order for terms, the same in every run (generated source must be stable)."""
    key = _sort_keys.get(n)
    if key is None:
        key = (n.op.value, repr(n.arg), tuple(sort_key(s) for s in n.srcs))
        _sort_keys[n] = key
    return key


def linear(n: Node) -> tuple[dict[Node, int], int]:
    """n as sum(coef * term) + constant, looking through ADD, SUB, NEG and MUL by a constant."""
    terms: dict[Node, int] = {}
    k = 0
    work = [(n, 1)]
    while work:
        x, c = work.pop()
        if x.op is Op.CONST:
            k += c * int(x.arg)
        elif x.op is Op.ADD:
            work += [(x.srcs[0], c), (x.srcs[1], c)]
        elif x.op is Op.SUB:
            work += [(x.srcs[0], c), (x.srcs[1], -c)]
        elif x.op is Op.NEG:
            work.append((x.srcs[0], -c))
        elif x.op is Op.MUL and x.srcs[1].op is Op.CONST:
            work.append((x.srcs[0], c * int(x.srcs[1].arg)))
        elif x.op is Op.MUL and x.srcs[0].op is Op.CONST:
            work.append((x.srcs[1], c * int(x.srcs[0].arg)))
        else:
            terms[x] = terms.get(x, 0) + c
    return {t: c for t, c in terms.items() if c != 0}, k


def build(terms: dict[Node, int], k: int, dtype: dt.DType = INDEX) -> Node:
    """The canonical node of a linear form: terms in sort_key order, the constant last. In i64
    when dtype is, or a term is (an i32 term is then widened first)."""
    if any(t.dtype is dt.i64 for t in terms):
        dtype = dt.i64
    if dtype is dt.i64:
        terms = {t if t.dtype is dt.i64 else Node(Op.CAST, dt.i64, (t,)): c for t, c in terms.items()}
    parts = [t if c == 1 else mul(t, const(c, dtype)) for t, c in sorted(terms.items(), key=lambda tc: sort_key(tc[0]))]
    if k != 0 or not parts:
        parts.append(const(k, dtype))
    return reduce(add, parts)


# ------------------------------------------------------------------------------------- rules

def _fits(n: Node, v: int) -> bool:
    return n.dtype.min <= v <= n.dtype.max


def _merge_divmod(terms: dict[Node, int], k: int) -> tuple[dict[Node, int], int]:
    """a*c*(x // c) + a*(x % c) is a*x: C defines % so that this holds for every x."""
    changed = True
    while changed:
        changed = False
        for t, a in list(terms.items()):
            if t.op is Op.MOD and t.srcs[1].op is Op.CONST and t in terms:
                x, c = t.srcs[0], int(t.srcs[1].arg)
                q = Node(Op.IDIV, t.dtype, t.srcs)
                if c != 0 and terms.get(q) == a * c:
                    del terms[t], terms[q]
                    xt, xk = linear(x)
                    for term, coef in xt.items():
                        terms[term] = terms.get(term, 0) + a * coef
                    k += a * xk
                    terms = {u: v for u, v in terms.items() if v != 0}
                    changed = True
                    break
    return terms, k


def _canon_sum(n: Node) -> Node | None:
    terms, k = _merge_divmod(*linear(n))
    if not _fits(n, k) or any(not _fits(n, c) for c in terms.values()):
        return None
    return build(terms, k, n.dtype)


def _split_low(terms: dict[Node, int], k: int, d: int, dtype: dt.DType) -> tuple[int, Node, Node] | None:
    """(g, a, b) with x = g*a + b, g > 1 dividing d and 0 <= b < g, for x = sum(terms) + k
    (a row-major index r*C + c read through a reshape: its rows are r, its column c). The
    largest such g among the coefficients' common factors with d."""
    for g in sorted({math.gcd(v, d) for v in terms.values()} - {1, d}, reverse=True):
        low = build({t: v for t, v in terms.items() if v % g}, k, dtype)
        lo, hi = bounds(low)
        if 0 <= lo and hi < g:
            return g, build({t: v // g for t, v in terms.items() if v % g == 0}, 0, dtype), low
    return None


def _fold_div(n: Node, x: Node, c: Node) -> Node | None:
    d = int(c.arg)
    lo, hi = bounds(x)
    if d <= 0 or lo < 0:
        return None
    if hi < d:
        return const(0, n.dtype)
    if d == 1:
        return x
    if x.op is Op.IDIV and x.srcs[1].op is Op.CONST and int(x.srcs[1].arg) > 0 and bounds(x.srcs[0])[0] >= 0:
        return idiv(x.srcs[0], int(x.srcs[1].arg) * d)  # (y // a) // d == y // (a*d) for y >= 0
    terms, k = linear(x)
    g = reduce(math.gcd, [*terms.values(), k, d])
    if g > 1:  # a common factor divides out exactly
        return idiv(build({t: v // g for t, v in terms.items()}, k // g, n.dtype), d // g)
    split = _split_low(terms, k, d, n.dtype)
    if split is not None:  # (g*a + b) // (g*m) is a // m for 0 <= b < g
        g, high, _ = split
        return idiv(high, d // g)
    whole = {t: v // d for t, v in terms.items() if v % d == 0}
    rest = build({t: v for t, v in terms.items() if v % d != 0}, k % d, n.dtype)
    if bounds(rest)[0] < 0 or (not whole and k // d == 0):
        return None
    return build({**whole, **({idiv(rest, d): 1} if bounds(rest)[1] >= d else {})}, k // d, n.dtype)


def _fold_mod(n: Node, x: Node, c: Node) -> Node | None:
    d = int(c.arg)
    lo, hi = bounds(x)
    if d <= 0 or lo < 0:
        return None
    if hi < d:
        return x
    if d == 1:
        return const(0, n.dtype)
    if x.op is Op.MOD and x.srcs[1].op is Op.CONST and int(x.srcs[1].arg) % d == 0:
        return mod(x.srcs[0], d)  # (y % (a*d)) % d == y % d for y >= 0
    terms, k = linear(x)
    g = reduce(math.gcd, [*terms.values(), k, d])
    if g > 1:
        inner = mod(build({t: v // g for t, v in terms.items()}, k // g, n.dtype), d // g)
        return mul(inner, const(g, n.dtype))
    split = _split_low(terms, k, d, n.dtype)
    if split is not None:  # (g*a + b) % (g*m) is g*(a % m) + b for 0 <= b < g
        g, high, low = split
        return add(mul(mod(high, d // g), const(g, n.dtype)), low)
    if all(bounds(t)[0] >= 0 for t in terms):  # then coefficients and constant may be taken mod d
        reduced = {t: v % d for t, v in terms.items() if v % d}
        if reduced != terms or k % d != k:
            return mod(build(reduced, k % d, n.dtype), d)
    return None


def _fold_const(n: Node) -> Node | None:
    a, b = (int(s.arg) for s in n.srcs)
    if n.op in (Op.IDIV, Op.MOD):
        if b == 0:
            return None
        q = _tdiv(a, b)
        v = q if n.op is Op.IDIV else a - q * b
    elif n.op is Op.CMPLT:
        return const(int(a < b), dt.bool_)
    elif n.op is Op.MAX:
        v = max(a, b)
    else:
        v = {Op.ADD: a + b, Op.SUB: a - b, Op.MUL: a * b, Op.AND: a & b, Op.OR: a | b}[n.op]
    return const(v, n.dtype) if _fits(n, v) else None


def _fold_lt(n: Node, a: Node, b: Node) -> Node | None:
    (alo, ahi), (blo, bhi) = bounds(a), bounds(b)
    if ahi < blo:
        return const(1, dt.bool_)
    if alo >= bhi:
        return const(0, dt.bool_)
    return _coarsen_lt(a, b)


def _minus(a: Node, b: Node) -> tuple[dict[Node, int], int]:
    """a - b as a linear form (terms, constant)."""
    (ta, ka), (tb, kb) = linear(a), linear(b)
    terms = dict(ta)
    for t, c in tb.items():
        terms[t] = terms.get(t, 0) - c
    return {t: c for t, c in terms.items() if c}, ka - kb


def _coarsen_lt(a: Node, b: Node) -> Node | None:
    """a < b as a comparison of coarser terms: with b - a - 1 = g*A + B + g*q, 0 <= B < g,
    it holds exactly when A + q >= 0. 1535 < 8*i + l for a lane l < 8 is 191 < i: a guard one
    lane group shares, so its loads can be one vector."""
    terms, k = _minus(b, a)
    k -= 1
    for g in sorted({abs(c) for c in terms.values()} - {0, 1}, reverse=True):
        low = {t: c for t, c in terms.items() if c % g}
        if not low:
            continue
        lo, hi = bounds(build(low, k % g, a.dtype))
        if lo < 0 or hi >= g:
            continue
        high = {t: c // g for t, c in terms.items() if c % g == 0}
        q = k // g
        if all(c < 0 for c in high.values()):   # -P + q >= 0: P < q + 1
            flipped = build({t: -c for t, c in high.items()}, 0, a.dtype)
            return Node(Op.CMPLT, dt.bool_, (flipped, const(q + 1, a.dtype)))
        return Node(Op.CMPLT, dt.bool_, (const(-q - 1, a.dtype), build(high, 0, a.dtype)))
    return None


def _is_int(n: Node) -> bool:
    return n.dtype.is_int


_const = P(Op.CONST, name="c")
RULES = RuleSet([
    (P({Op.ADD, Op.SUB, Op.MUL, Op.IDIV, Op.MOD, Op.CMPLT, Op.MAX, Op.AND, Op.OR}, P(Op.CONST), P(Op.CONST), name="n",
       pred=lambda n: n.srcs[0].dtype.is_int or n.srcs[0].dtype is dt.bool_), _fold_const),
    (P({Op.ADD, Op.SUB, Op.NEG}, name="n", pred=_is_int), lambda n: _canon_sum(n)),
    (P(Op.MUL, P(name="x"), P(Op.CONST), name="n", pred=_is_int), lambda n, x: _canon_sum(n)),
    (P(Op.IDIV, P(name="x"), _const, name="n", pred=_is_int), _fold_div),
    (P(Op.MOD, P(name="x"), _const, name="n", pred=_is_int), _fold_mod),
    (P(Op.CMPLT, P(name="a"), P(name="b"), name="n", pred=lambda n: n.srcs[0].dtype.is_int), _fold_lt),
    (P(Op.AND, P(Op.CONST, name="c"), P(name="x"), pred=lambda n: n.dtype is dt.bool_), lambda c, x: x if c.arg else c),
    (P(Op.AND, P(name="x"), P(name="x")), lambda x: x),
    (P(Op.WHERE, P(Op.CONST, name="c"), P(name="a"), P(name="b")), lambda c, a, b: a if c.arg else b),
    (P(Op.WHERE, P(name="c"), P(name="a"), P(name="a")), lambda c, a: a),
])


_memo = threading.local()   # this thread's compilation's normal forms (remembered)


def simplify(exprs: list[Node]) -> list[Node]:
    return rewrite(exprs, RULES, done=getattr(_memo, "done", None))


@contextmanager
def remembered() -> Iterator[None]:
    """simplify's normal forms kept for the duration (one compilation: its kernels' index
    expressions share half their terms; GPT-2's step simplified 150k nodes, 2.0 -> 1.1 s)."""
    _memo.done = {}
    try:
        yield
    finally:
        del _memo.done


def _conjuncts(c: Node) -> list[Node]:
    return _conjuncts(c.srcs[0]) + _conjuncts(c.srcs[1]) if c.op is Op.AND else [c]


def range_limits(valid: Node) -> dict[Node, tuple[int, int]]:
    """The values each range can take where valid holds, for the ranges valid's comparisons of
    linear forms narrow (a < b, a range's coefficient nonzero, the other terms at their bounds)."""
    limits: dict[Node, tuple[int, int]] = {}
    for cond in _conjuncts(valid):
        for r in _compared(cond):
            if r.op is Op.RANGE:
                limits[r] = _narrow(cond, r, limits.get(r, (0, r.arg[1] - 1)))
    return limits


def limits(n: Node, valid: Node | None) -> tuple[int, int]:
    """The values the integer term n can take where valid holds: its bounds, narrowed by valid's
    comparisons (a gathered index that a guard keeps in [0, size))."""
    lo_hi = bounds(n)
    for cond in _conjuncts(valid) if valid is not None else []:
        if n in _compared(cond):
            lo_hi = _narrow(cond, n, lo_hi)
    return lo_hi


def _compared(cond: Node) -> dict[Node, int]:
    """The terms of an integer comparison a < b, as a - b's linear form's (else none)."""
    if cond.op is not Op.CMPLT or not cond.srcs[0].dtype.is_int:
        return {}
    return _minus(*cond.srcs)[0]


def _narrow(cond: Node, r: Node, lo_hi: tuple[int, int]) -> tuple[int, int]:
    """r's limits lo_hi narrowed by cond (a < b: sum(terms) + k <= -1, the others at their bounds)."""
    terms, k = _minus(*cond.srcs)
    c, (lo, hi) = terms[r], lo_hi
    rest = k + sum(min(v * bounds(t)[0], v * bounds(t)[1]) for t, v in terms.items() if t is not r)
    if c > 0:
        hi = min(hi, (-1 - rest) // c)
    else:
        lo = max(lo, -((-1 - rest) // -c))
    return lo, hi


def given(index: Node, valid: Node | None) -> Node:
    """index simplified for where valid holds, the only place a guarded load reads it: a range
    that valid bounds below by lo (a concatenation's piece at 1536 <= c) is written as a new
    range plus lo, so that divisions of the piece's own index fold (they need its 0 <= c - 1536),
    then put back. The address is the same wherever valid holds."""
    if valid is None:
        return index
    used = set(toposort([index]))
    shifts = {r: lim for r, lim in range_limits(valid).items()
              if r in used and lim[0] <= lim[1] and (lim[0] > 0 or lim[1] < r.arg[1] - 1)}
    if not shifts:
        return index
    fresh = {r: Node(Op.RANGE, r.dtype, (), (f"{r.arg[0]}_v", hi - lo + 1)) for r, (lo, hi) in shifts.items()}
    inward = {r: add(fresh[r], const(shifts[r][0], r.dtype)) for r in shifts}
    (inner,) = simplify(substitute([index], inward))
    back = {fresh[r]: add(r, const(-shifts[r][0], r.dtype)) for r in shifts}
    return simplify(substitute([inner], back))[0]

