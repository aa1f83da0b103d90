"""Algebraic simplification of the tensor graph, as a rule set: identities, constant folding of
integer ops, casts of casts that are exact, and chains of movement ops collapsed into one.

Every rule keeps the spec's exact semantics: `x + 0` is not `x` for floats (-0 + 0 = +0), so
only `x + (-0.0)` folds there; float constants are not folded (that would need rounding code
here that the kernels already have).
"""
from __future__ import annotations

from .. import dtype as dt
from .. import ir
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


RULES = RuleSet([
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
])


def simplify(outputs: list[Node]) -> list[Node]:
    """The tensor graph of outputs after algebraic simplification (same values, fewer nodes)."""
    return rewrite(outputs, RULES)

