"""Algebraic simplification of the tensor graph, as a rule set: identities, constant folding of
integer ops, casts of casts that are exact, and chains of movement ops collapsed into one.
Canonical forms, so that programs that say the same thing meet the same fast path: x + x is
x * 2, a division by a power of two is a product, and products by powers of two >= 1 merge.

Every rule keeps the spec's exact semantics: `x + 0` is not `x` for floats (-0 + 0 = +0), so
only `x + (-0.0)` folds there; float constants are not folded (that would need rounding code
here that the kernels already have), nor products whose intermediate could overflow where the
merged one does not ((x * 2) * 0.5 is inf for a large x).

FUSED_RULES go further, for graphs that one kernel computes whole in f32 (attention's score
graph, compiler/attention.py): spec 4 leaves a fused kernel's intermediate precision free, so
float constants fold, chains of products and divisions by constants become one product, and
constants move to the right of a product or sum.
"""
from __future__ import annotations

import math

from .. import data, ir
from .. import dtype as dt
from ..dtype import DType
from ..ir import Node, Op
from .rewrite import P, RuleSet, rewrite


def _is_const(n: Node, v: float) -> bool:
    if n.op is not Op.CONST:
        return False
    if n.dtype.is_float:
        return ir._key(float(n.arg)) == ir._key(float(v))  # bitwise: -0.0 is not 0.0
    return n.arg == v


def _additive_zero(c: Node) -> bool:
    """x + c == x for every x: 0 for ints, but -0.0 for floats (+0.0 turns -0 into +0)."""
    return _is_const(c, -0.0 if c.dtype.is_float else 0)


def _wrap(v: int, d: DType) -> int:
    if d is dt.bool_:
        return int(v != 0)
    v &= (1 << d.bits) - 1
    return v - (1 << d.bits) if d.is_signed and v >> (d.bits - 1) else v


def _fold_int(n: Node) -> Node | None:
    """An int or bool op whose operands are all constants."""
    vals = [int(s.arg) for s in n.srcs]
    d = n.srcs[0].dtype
    op = n.op
    if op is Op.WHERE:
        return n.srcs[1] if vals[0] else n.srcs[2]
    if op is Op.NEG:
        v = -vals[0]
    elif op is Op.CAST:  # int or bool to int or bool: keep the low bits, or != 0
        v = vals[0]
    elif op in (Op.IDIV, Op.MOD):
        a, b = vals
        if b == 0:
            return None  # undefined behaviour: leave it to run time
        q = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        v = q if op is Op.IDIV else a - q * b
    elif op in (Op.SHL, Op.SHR):
        a, b = vals
        if not 0 <= b < d.bits:
            return None
        v = a << b if op is Op.SHL else a >> b  # Python's >> is arithmetic; unsigned values are >= 0
    else:
        a, b = vals
        table = {Op.ADD: a + b, Op.SUB: a - b, Op.MUL: a * b, Op.MAX: max(a, b), Op.AND: a & b, Op.OR: a | b,
                 Op.XOR: a ^ b, Op.CMPLT: int(a < b), Op.CMPEQ: int(a == b), Op.CMPNE: int(a != b)}
        v = table[op]
    return Node(Op.CONST, n.dtype, (), _wrap(v, n.dtype), n.shape)


def _all_int_consts(n: Node) -> bool:
    return (n.op is not Op.BITCAST and bool(n.srcs) and not n.dtype.is_float
            and all(s.op is Op.CONST and not s.dtype.is_float for s in n.srcs))


def _holds(inner: DType, outer: DType) -> bool:
    """Every value of inner is exactly a value of outer."""
    if inner is outer or inner is dt.bool_:
        return True
    if inner.is_float:
        return outer.is_float and outer.bits > inner.bits and not (inner is dt.f16 and outer is dt.bf16)
    if outer.is_float:
        mantissa = {dt.f16: 11, dt.bf16: 8, dt.f32: 24, dt.f64: 53}[outer]
        return inner.bits - inner.is_signed <= mantissa
    if outer is dt.bool_:
        return False
    if inner.is_signed:
        return outer.is_signed and outer.bits >= inner.bits
    return outer.bits > inner.bits or (not outer.is_signed and outer.bits >= inner.bits)


def _cast_cast(n: Node, x: Node) -> Node | None:
    mid = n.srcs[0].dtype
    if _holds(x.dtype, mid):
        return Node(Op.CAST, n.dtype, (x,), None, n.shape) if x.dtype is not n.dtype else x
    return None


# movement chains -----------------------------------------------------------------------------

def _reshape(n: Node, x: Node) -> Node | None:
    if x.shape == n.shape:
        return x
    if x.op is Op.RESHAPE:
        return ir.reshape(x.srcs[0], n.shape) if x.srcs[0].shape != n.shape else x.srcs[0]
    return None


def _permute(n: Node, x: Node) -> Node | None:
    if n.arg == tuple(range(len(n.shape))):
        return x
    if x.op is Op.PERMUTE:
        return ir.permute(x.srcs[0], tuple(x.arg[o] for o in n.arg))
    return None


def _expand(n: Node, x: Node) -> Node | None:
    if x.shape == n.shape:
        return x
    if x.op is Op.EXPAND:
        return ir.expand(x.srcs[0], n.shape)
    return None


def _shrink(n: Node, x: Node) -> Node | None:
    start, end = n.arg
    if all(s == 0 for s in start) and tuple(end) == x.shape:
        return x
    if x.op is Op.SHRINK:
        s0, _ = x.arg
        return ir.shrink(x.srcs[0], tuple(a + b for a, b in zip(s0, start)), tuple(a + b for a, b in zip(s0, end)))
    return None


def _flip(n: Node, x: Node) -> Node | None:
    axes = tuple(a for a in n.arg if x.shape[a] > 1)
    if not axes:
        return x
    if x.op is Op.FLIP:
        both = tuple(sorted(set(axes) ^ set(x.arg)))
        return ir.flip(x.srcs[0], both) if both else x.srcs[0]
    return None


def _pad(n: Node, x: Node) -> Node | None:
    before, after, value = n.arg
    if not any(before) and not any(after):
        return x
    if x.op is Op.CONST and ir._key(x.arg) == ir._key(value):
        return Node(Op.CONST, n.dtype, (), value, n.shape)
    return None


def _movement_of_const(n: Node, c: Node) -> Node | None:
    return Node(Op.CONST, n.dtype, (), c.arg, n.shape) if n.op is not Op.PAD else None


def _where(c: Node, a: Node, b: Node) -> Node:
    return ir.where(c, a, b)


def _reduce_of_ones(n: Node, x: Node) -> Node | None:
    """A reduction over dims of size 1 only is a reshape; no data moves."""
    if all(x.shape[a] == 1 for a in n.arg):
        return x
    return None


def _zero_pad(x: Node) -> bool:
    """x is a pad whose value is 0.0 (compared by its bits, as nodes key floats)."""
    return x.op is Op.PAD and ir._key(float(x.arg[2])) == ir._key(0.0)


def _nonzero_boxes(x: Node) -> list[tuple[tuple[int, int], ...]] | None:
    """Boxes (per axis: [start, end)) outside which x is 0, when x is zero-padded pieces."""
    if _zero_pad(x):
        return [tuple((b, b + s) for b, s in zip(x.arg[0], x.srcs[0].shape))]
    if x.op is Op.CAST:
        return _nonzero_boxes(x.srcs[0])
    if x.op is Op.ADD:
        a, b = _nonzero_boxes(x.srcs[0]), _nonzero_boxes(x.srcs[1])
        return a + b if a is not None and b is not None else None
    return None


def _disjoint(boxes: list[tuple[tuple[int, int], ...]]) -> bool:
    return all(any(ea <= sb or eb <= sa for (sa, ea), (sb, eb) in zip(p, q))
               for i, p in enumerate(boxes) for q in boxes[i + 1:])


def _narrow_dtype(x: Node) -> DType | None:
    """The dtype of the first widening cast below x's movements and sums."""
    while x.op in ir.MOVEMENT or x.op is Op.ADD:
        x = x.srcs[0]
    return x.srcs[0].dtype if x.op is Op.CAST and _holds(x.srcs[0].dtype, x.dtype) else None


def _narrowed(x: Node, d: DType) -> Node | None:
    """x computed exactly in the narrower float dtype d, if its values come from d: casts up from
    d, moved (pads of 0) and added where at most one term is not 0."""
    if x.op is Op.CAST:
        return x.srcs[0] if x.srcs[0].dtype is d else None
    if x.op in ir.MOVEMENT and (x.op is not Op.PAD or _zero_pad(x)):
        src = _narrowed(x.srcs[0], d)
        return None if src is None else Node(x.op, d, (src,), x.arg, x.shape)
    if x.op is Op.ADD and (boxes := _nonzero_boxes(x)) is not None and _disjoint(boxes):
        a, b = (_narrowed(s, d) for s in x.srcs)
        return None if a is None or b is None else Node(Op.ADD, d, (a, b), None, x.shape)
    return None


def _concatenated(n: Node) -> Node | None:
    """A sum of zero-padded pieces that do not overlap, each cast up from one narrower float
    dtype, is those pieces put side by side in that dtype, cast up once: each element is one
    piece's value plus zeros, exact in either dtype. A concatenation's gradient under autocast
    (GPT-2's q, k and v gradients, bf16, into the f32 gradient of their projection): the
    projection's bf16 gradient then needs no rounding, and its bias gradient reads it, 2 bytes
    an element where it read the pieces in f32 through the concatenation's index arithmetic."""
    d = _narrow_dtype(n)   # _narrowed checks that the pieces do not overlap
    low = _narrowed(n, d) if d is not None and d.is_float else None
    return None if low is None else Node(Op.CAST, n.dtype, (low,), None, n.shape)


def _terms(x: Node) -> list[Node]:
    return _terms(x.srcs[0]) + _terms(x.srcs[1]) if x.op is Op.ADD else [x]


def _sum_of_products(n: Node, x: Node) -> Node | None:
    """A sum over axes of added outer products (each a MUL of two broadcasts) is the sum of the
    products' sums: the gradient of a weight that several matmuls of one shape read (a language
    model's head over chunks of rows) adds their products before the broadcast's reduction, one
    reduction that no contraction path takes; apart, each is a matmul's weight gradient."""
    terms = _terms(x)
    if len(terms) < 2 or not all(t.op is Op.MUL and all(s.op is Op.EXPAND for s in t.srcs) for t in terms):
        return None
    out = ir.reduce(Op.SUM, terms[0], n.arg)
    for t in terms[1:]:
        out = ir.binary(Op.ADD, out, ir.reduce(Op.SUM, t, n.arg))
    return out


def _power_of_two(c: Node, low: int = -126, high: int = 127) -> int | None:
    """e when c is the float constant 2^e, low <= e <= high (its reciprocal is exact too)."""
    if c.op is not Op.CONST or not c.dtype.is_float:
        return None
    v = float(c.arg)
    if v <= 0 or not math.isfinite(v):
        return None
    m, e = math.frexp(v)
    return e - 1 if m == 0.5 and low <= e - 1 <= high else None


def _float_const(n: Node, v: float) -> Node:
    return Node(Op.CONST, n.dtype, (), data.literal_value(v, n.dtype, True), n.shape)


def _double(n: Node, x: Node) -> Node:
    """x + x is x * 2, exactly (both round the same real number, overflow included)."""
    return Node(Op.MUL, n.dtype, (x, Node(Op.CONST, n.dtype, (), 2.0 if n.dtype.is_float else 2, n.shape)), None,
                n.shape)


def _halve(n: Node, x: Node, c: Node) -> Node | None:
    """x / 2^e is x * 2^-e, exactly, when 2^-e is a normal number of the dtype."""
    e = _power_of_two(c, -_MAX_EXP[n.dtype] + 2, _MAX_EXP[n.dtype] - 1) if n.dtype in _MAX_EXP else None
    return None if e is None else Node(Op.MUL, n.dtype, (x, _float_const(c, 2.0 ** -e)), None, n.shape)


def _scale_up(n: Node, x: Node, a: Node, b: Node) -> Node | None:
    """(x * 2^p) * 2^q is x * 2^(p+q) for p, q >= 0: neither rounds, and the first overflows only
    where the result does."""
    p, q = _power_of_two(a, 0), _power_of_two(b, 0)
    if p is None or q is None or n.dtype not in _MAX_EXP or p + q >= _MAX_EXP[n.dtype]:
        return None
    return Node(Op.MUL, n.dtype, (x, _float_const(b, 2.0 ** (p + q))), None, n.shape)


_MAX_EXP = {dt.f16: 16, dt.bf16: 128, dt.f32: 128, dt.f64: 1024}   # 2^e overflows from this e on
_FOLDS = {Op.ADD: lambda a, b: a + b, Op.SUB: lambda a, b: a - b, Op.MUL: lambda a, b: a * b,
          Op.DIV: lambda a, b: a / b, Op.MAX: max, Op.NEG: lambda a: -a}


def _fold_float(n: Node) -> Node | None:
    """A float op of constants, computed in f64 and rounded once (fused graphs only)."""
    if n.op not in _FOLDS:
        return None
    try:
        v = _FOLDS[n.op](*(float(s.arg) for s in n.srcs))
    except (OverflowError, ZeroDivisionError):
        return None
    return _float_const(n, v)


def _is_float_const(n: Node) -> bool:
    return n.op is Op.CONST and n.dtype.is_float and math.isfinite(float(n.arg))


def _fused_product(n: Node, x: Node, a: Node, b: Node) -> Node:
    return Node(Op.MUL, n.dtype, (x, _float_const(b, float(a.arg) * float(b.arg))), None, n.shape)


def _is_float(n: Node) -> bool:
    return n.dtype.is_float


def _compare_narrow(n: Node, x: Node, y: Node) -> Node | None:
    """A comparison of two values cast up from one dtype is the comparison of the values (every
    value of the narrower dtype is exactly one of the wider, in the same order)."""
    if x.dtype is not y.dtype or not _holds(x.dtype, n.srcs[0].dtype) or x.dtype.is_float != n.srcs[0].dtype.is_float:
        return None
    return Node(n.op, n.dtype, (x, y), None, n.shape)


EXACT = [
    (P(Op.ADD, name="n", pred=lambda n: n.dtype.is_float), _concatenated),
    (P(Op.SUM, P(Op.ADD, name="x"), name="n"), _sum_of_products),
    (P(ir.ELEMENTWISE, name="n", pred=_all_int_consts), _fold_int),
    (P(Op.NEG, P(Op.NEG, P(name="x"))), lambda x: x),
    (P(Op.MUL, P(name="x"), P(Op.CONST, pred=lambda c: _is_const(c, 1))), lambda x: x),
    (P(Op.ADD, P(name="x"), P(Op.CONST, pred=_additive_zero)), lambda x: x),
    (P(Op.SUB, P(name="x"), P(Op.CONST, pred=lambda c: _is_const(c, 0))), lambda x: x),
    (P(Op.MUL, P(name="x"), P(Op.CONST, name="z", pred=lambda c: not c.dtype.is_float and _is_const(c, 0))),
     lambda x, z: z),
    (P(Op.CAST, P(name="x"), name="n", pred=lambda n: n.dtype is n.srcs[0].dtype), lambda n, x: x),
    (P(Op.CAST, P(Op.CAST, P(name="x")), name="n"), _cast_cast),
    # ir.stop_gradient, once gradients are expanded
    (P(Op.BITCAST, name="n", pred=lambda n: ir.stopped(n) is not None), ir.stopped),
    (P(Op.WHERE, P(Op.CONST, name="c"), P(name="a"), P(name="b")), lambda c, a, b: a if c.arg else b),
    (P(Op.WHERE, P(name="c"), P(name="a"), P(name="a")), lambda c, a: a),
    # where(c, where(c, a, x), b) is where(c, a, b), and so is where(c, a, where(c, x, b)). The
    # nested form was also the first program GCC 12 was seen to miscompile (issue 14; the fix for
    # that is in the C renderer's loop_header).
    (P(Op.WHERE, P(name="c"), P(Op.WHERE, P(name="c"), P(name="a"), P()), P(name="b")), _where),
    (P(Op.WHERE, P(name="c"), P(name="a"), P(Op.WHERE, P(name="c"), P(), P(name="b"))), _where),
    (P(Op.RESHAPE, P(name="x"), name="n"), _reshape),
    (P(Op.PERMUTE, P(name="x"), name="n"), _permute),
    (P(Op.EXPAND, P(name="x"), name="n"), _expand),
    (P(Op.SHRINK, P(name="x"), name="n"), _shrink),
    (P(Op.FLIP, P(name="x"), name="n"), _flip),
    (P(Op.PAD, P(name="x"), name="n"), _pad),
    (P(ir.MOVEMENT, P(Op.CONST, name="c"), name="n"), _movement_of_const),
    (P(ir.REDUCTION, P(name="x"), name="n"), _reduce_of_ones),
    (P(Op.ADD, P(name="x"), P(name="x"), name="n", pred=lambda n: n.dtype.is_numeric), _double),
    (P(ir.COMPARE, P(Op.CAST, P(name="x")), P(Op.CAST, P(name="y")), name="n"), _compare_narrow),
    (P(Op.DIV, P(name="x"), P(Op.CONST, name="c"), name="n"), _halve),
    (P(Op.MUL, P(Op.MUL, P(name="x"), P(Op.CONST, name="a")), P(Op.CONST, name="b"), name="n"), _scale_up),
]
RULES = RuleSet(EXACT)


FUSED = [
    (P(ir.ELEMENTWISE, name="n", pred=lambda n: n.dtype.is_float and bool(n.srcs)
       and all(s.op is Op.CONST and s.dtype.is_float for s in n.srcs)), _fold_float),
    (P(Op.MUL, P(Op.MUL, P(name="x"), P(Op.CONST, name="a", pred=_is_float_const)),
       P(Op.CONST, name="b", pred=_is_float_const), name="n"), _fused_product),
    (P(Op.DIV, P(name="x"), P(Op.CONST, name="c", pred=lambda c: _is_float_const(c) and float(c.arg) != 0), name="n"),
     lambda n, x, c: Node(Op.MUL, n.dtype, (x, _float_const(c, 1 / float(c.arg))), None, n.shape)),
    (P({Op.MUL, Op.ADD}, P(Op.CONST, name="c"), P(name="x", pred=lambda x: x.op is not Op.CONST), name="n",
       pred=lambda n: n.srcs[0].op is Op.CONST and n.dtype.is_float),
     lambda n, c, x: Node(n.op, n.dtype, (x, c), None, n.shape)),
    # where(c, a, b) * k is where(c, a * k, b * k): a mask's constant folds, and the scale meets the score's
    (P(Op.MUL, P(Op.WHERE, name="w"), P(Op.CONST, name="k", pred=_is_float_const), name="n"),
     lambda n, w, k: ir.where(w.srcs[0], *(Node(Op.MUL, n.dtype, (x, k), None, n.shape) for x in w.srcs[1:]))),
    # x + 0.0 is x but for the sign of a zero, which changes no softmax weight
    (P(Op.ADD, P(name="x"), P(Op.CONST, pred=lambda c: _is_const(c, 0.0)), name="n", pred=_is_float), lambda n, x: x),
]
FUSED_RULES = RuleSet(EXACT + FUSED)


def fused_canonical(outputs: list[Node]) -> list[Node]:
    """simplify's rules and the FUSED ones, for a graph one kernel computes whole in f32."""
    return rewrite(outputs, FUSED_RULES)


def simplify(outputs: list[Node]) -> list[Node]:
    """The tensor graph of outputs after algebraic simplification (same values, fewer nodes)."""
    return rewrite(outputs, RULES)

